/* gen/outdir.c: atomic writing of the emitted file set (see outdir.h).
 * Everything to write is already in memory when od_write starts, so the only
 * failures left are I/O ones, and they are handled so that the previous
 * contents of the output directory survive them:
 *  - new DIR: all files go into a fresh sibling DIR.tmp-XXXXXX, which is
 *    renamed to DIR at the end (one atomic step);
 *  - existing DIR: each changed file is written to a temporary file next to
 *    its target and synced; only when all are written are they renamed into
 *    place. Unchanged files are left alone (their mtimes matter to make). */
#include "xstr.h"
#include "outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *od_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xstr_vprintf(fmt, ap);
    va_end(ap);
    return s ? s : strdup("out of memory");
}

static int od_fail(char **err, const char *what, const char *path, int e)
{
    *err = od_printf("%s %s: %s", what, path, strerror(e));
    return -1;
}

/* ------------------------------------------------------------------ paths */

int od_path_ok(const char *path)
{
    if (!path || !*path || path[0] == '/')
        return 0;
    for (const char *p = path;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!slash)
            return 1;
        p = slash + 1;
    }
}

int od_check_files(const od_file *files, size_t n, char **err)
{
    *err = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!od_path_ok(files[i].path)) {
            *err = od_printf("invalid output path '%s' (must be relative, without empty, '.' or '..' "
                             "components)", files[i].path ? files[i].path : "(null)");
            return -1;
        }
        for (size_t j = 0; j < i; j++) {
            const char *a = files[i].path, *b = files[j].path;
            size_t la = strlen(a), lb = strlen(b);
            if (strcmp(a, b) == 0) {
                *err = od_printf("output path '%s' is emitted twice", a);
                return -1;
            }
            if ((la < lb && strncmp(a, b, la) == 0 && b[la] == '/') ||
                (lb < la && strncmp(a, b, lb) == 0 && a[lb] == '/')) {
                *err = od_printf("output paths '%s' and '%s' conflict (one is a directory of the other)", b, a);
                return -1;
            }
        }
    }
    return 0;
}

static char *od_join(const char *a, const char *b)
{
    return od_printf("%s/%s", a, b);
}

/* Creates directory PATH and its missing parents (like mkdir -p). */
static int od_mkdir_p(const char *path, mode_t mode, char **err)
{
    char *p = strdup(path);
    if (!p) {
        *err = od_printf("out of memory");
        return -1;
    }
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, mode) != 0 && errno != EEXIST) {
            int e = errno;
            od_fail(err, "cannot create directory", p, e);
            free(p);
            return -1;
        }
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            *err = od_printf("cannot create directory %s: a file of that name exists", p);
            free(p);
            return -1;
        }
        *s = saved;
        if (saved == '\0')
            break;
    }
    free(p);
    return 0;
}

/* mkdir -p of the directory part of BASE/REL (REL is a checked path). */
static int od_mkdir_parent(const char *base, const char *rel, mode_t mode, char **err)
{
    const char *slash = strrchr(rel, '/');
    if (!slash)
        return 0;
    char *dir = od_printf("%s/%.*s", base, (int)(slash - rel), rel);
    int rc = od_mkdir_p(dir, mode, err);
    free(dir);
    return rc;
}

static int od_write_all(int fd, const char *data, size_t size)
{
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += n;
        size -= (size_t)n;
    }
    return 0;
}

/* Writes, syncs and closes FD (always closed). 0 or -1 with errno. */
static int od_fill(int fd, const od_file *f)
{
    if (od_write_all(fd, f->data, f->size) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

/* Syncs a directory so renames in it survive a crash; best effort (some
 * file systems refuse fsync on directories). */
static void od_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* 1 if the regular file PATH holds exactly F's bytes. */
static int od_same_content(const char *path, const od_file *f)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != f->size) {
        close(fd);
        return 0;
    }
    char buf[65536];
    size_t off = 0;
    int same = 1;
    while (same) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            same = n == 0 && off == f->size;
            break;
        }
        if (off + (size_t)n > f->size || memcmp(buf, f->data + off, (size_t)n) != 0)
            same = 0;
        off += (size_t)n;
    }
    close(fd);
    return same;
}

/* Removes the tree at PATH (only ever our own temporary directory). */
static void od_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *ent;
            while ((ent = readdir(d)) != NULL) {
                if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
                    continue;
                char *child = od_join(path, ent->d_name);
                od_remove_tree(child);
                free(child);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static mode_t od_umask(void)
{
    mode_t m = umask(0);
    umask(m);
    return m;
}

/* ------------------------------------------------------------------ new dir */

static int od_write_fresh(const char *dir, od_file *files, size_t n, char **err)
{
    mode_t mask = od_umask();
    /* the parent must exist for the sibling temp dir */
    const char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        char *parent = od_printf("%.*s", (int)(slash - dir), dir);
        int rc = od_mkdir_p(parent, 0777 & ~mask, err);
        free(parent);
        if (rc != 0)
            return -1;
    }
    char *tmp = od_printf("%s.tmp-XXXXXX", dir);
    if (!mkdtemp(tmp)) {
        od_fail(err, "cannot create directory", tmp, errno);
        free(tmp);
        return -1;
    }
    /* mkdtemp makes it 0700; the result should look like any mkdir. */
    if (chmod(tmp, 0777 & ~mask) != 0) {
        od_fail(err, "cannot chmod", tmp, errno);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if (od_mkdir_parent(tmp, files[i].path, 0777 & ~mask, err) != 0)
            goto fail;
        char *p = od_join(tmp, files[i].path);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 || od_fill(fd, &files[i]) != 0) {
            od_fail(err, "cannot write", p, errno);
            free(p);
            goto fail;
        }
        free(p);
        files[i].written = 1;
    }
    if (rename(tmp, dir) != 0) {
        od_fail(err, "cannot rename the new output directory to", dir, errno);
        goto fail;
    }
    {
        char *parent = slash ? od_printf("%.*s", slash == dir ? 1 : (int)(slash - dir), dir) : od_printf(".");
        od_sync_dir(parent);
        free(parent);
    }
    free(tmp);
    return 0;
fail:
    od_remove_tree(tmp);
    free(tmp);
    for (size_t i = 0; i < n; i++)
        files[i].written = 0;
    return -1;
}

/* ------------------------------------------------------------------ existing dir */

static int od_write_existing(const char *dir, od_file *files, size_t n, char **err)
{
    mode_t mask = od_umask();
    char **tmps = calloc(n ? n : 1, sizeof *tmps);
    char **targets = calloc(n ? n : 1, sizeof *targets);
    int rc = -1;
    size_t renamed = 0;
    if (!tmps || !targets) {
        *err = od_printf("out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        files[i].written = 0;
        targets[i] = od_join(dir, files[i].path);
        struct stat st;
        mode_t mode = 0666 & ~mask;
        if (lstat(targets[i], &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                *err = od_printf("cannot write %s: it is a directory", targets[i]);
                goto out;
            }
            if (S_ISREG(st.st_mode)) {
                if (od_same_content(targets[i], &files[i]))
                    continue; /* unchanged: keep the file and its mtime */
                mode = st.st_mode & 0777; /* keep the permissions the user gave it */
            }
        }
        if (od_mkdir_parent(dir, files[i].path, 0777 & ~mask, err) != 0)
            goto out;
        /* the temp file sits next to its target: rename stays in one file system */
        const char *base = strrchr(targets[i], '/') + 1;
        tmps[i] = od_printf("%.*s.%s.tmp-XXXXXX", (int)(base - targets[i]), targets[i], base);
        int fd = mkstemp(tmps[i]);
        if (fd < 0) {
            od_fail(err, "cannot create", tmps[i], errno);
            free(tmps[i]);
            tmps[i] = NULL;
            goto out;
        }
        if (fchmod(fd, mode) != 0 || od_fill(fd, &files[i]) != 0) {
            od_fail(err, "cannot write", tmps[i], errno);
            goto out;
        }
    }
    /* Everything is on disk: now swap the files in. */
    for (size_t i = 0; i < n; i++) {
        if (!tmps[i])
            continue;
        if (rename(tmps[i], targets[i]) != 0) {
            int e = errno;
            *err = od_printf("cannot rename %s to %s: %s (%zu file(s) were already replaced)", tmps[i],
                             targets[i], strerror(e), renamed);
            goto out;
        }
        free(tmps[i]);
        tmps[i] = NULL;
        files[i].written = 1;
        renamed++;
    }
    od_sync_dir(dir);
    rc = 0;
out:
    for (size_t i = 0; i < n; i++) {
        if (tmps && tmps[i]) {
            unlink(tmps[i]);
            free(tmps[i]);
        }
        if (targets)
            free(targets[i]);
    }
    free(tmps);
    free(targets);
    return rc;
}

int od_write(const char *dir_in, od_file *files, size_t n, char **err)
{
    *err = NULL;
    for (size_t i = 0; i < n; i++)
        files[i].written = 0;
    if (od_check_files(files, n, err) != 0)
        return -1;
    if (!dir_in || !*dir_in) {
        *err = od_printf("the output directory name is empty");
        return -1;
    }
    /* "out/" and "out" are the same directory; the temp sibling needs the latter */
    char *dir = strdup(dir_in);
    if (!dir) {
        *err = od_printf("out of memory");
        return -1;
    }
    for (size_t len = strlen(dir); len > 1 && dir[len - 1] == '/'; len--)
        dir[len - 1] = '\0';
    int rc;
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            rc = od_write_existing(dir, files, n, err);
        } else {
            *err = od_printf("cannot write to %s: it exists and is not a directory", dir);
            rc = -1;
        }
    } else if (errno == ENOENT) {
        rc = od_write_fresh(dir, files, n, err);
    } else {
        rc = od_fail(err, "cannot access", dir, errno);
    }
    free(dir);
    return rc;
}
