/* gen/outdir.c: atomic writing of the emitted file set (see outdir.h).
 * Everything to write is already in memory when od_write starts, so the only
 * failures left are I/O ones, and they are handled so that the previous
 * contents of the output directory survive them, including a kill -9:
 *  - the parent directory of DIR is locked (flock) for the whole write, so
 *    concurrent writers into DIR (or its siblings) take turns;
 *  - leftovers of interrupted earlier runs next to DIR are removed first
 *    (.BASE.mamba-gen.tmp-PID-XXXXXX, .BASE.mamba-gen.old-PID-XXXXXX: only
 *    under the lock, or when process PID is gone), an old DIR that a run
 *    killed mid-swap left aside is put back first;
 *  - the whole new set is built in a sibling .BASE.mamba-gen.tmp-PID-XXXXXX:
 *    changed and new files written and synced, unchanged files hard-linked
 *    (else copied with their times) from DIR, so they keep their mtimes for
 *    make, and every other entry of DIR (the user's own files) carried over
 *    the same way;
 *  - then the new directory is swapped in at once: renameat2(RENAME_EXCHANGE)
 *    where the file system has it, else DIR is renamed aside and the new
 *    one renamed to DIR; the old tree is removed afterwards. */
#define _GNU_SOURCE /* flock, renameat2 */
#include "xstr.h"
#include "outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define OD_TAG ".mamba-gen." /* .BASE.mamba-gen.{tmp,old}-PID-XXXXXX */

static char *od_printf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
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

/* Syncs and closes FD (always closed). 0 or -1 with errno. */
static int od_sync_close(int fd)
{
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

/* 1 if the regular file PATH (relative to DFD) holds exactly F's bytes. */
static int od_same_content(int dfd, const char *path, const od_file *f)
{
    int fd = openat(dfd, path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
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

/* Copies the regular file SRC to the new file DST (both relative to DFD)
 * with SRC's mode and times. 0 or -1 with errno (DST removed). */
static int od_copy(int dfd, const char *src, const char *dst, const struct stat *st)
{
    int in = openat(dfd, src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = openat(dfd, dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        int e = errno;
        close(in);
        errno = e;
        return -1;
    }
    char buf[65536];
    int rc = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (n > 0 && od_write_all(out, buf, (size_t)n) != 0)) {
            rc = -1;
            break;
        }
        if (n == 0)
            break;
    }
    int e = errno;
    close(in);
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (rc == 0 && (fchmod(out, st->st_mode & 07777) != 0 || futimens(out, times) != 0))
        rc = -1, e = errno;
    if (rc == 0 && od_sync_close(out) != 0)
        rc = -1, e = errno;
    else if (rc != 0)
        close(out);
    if (rc != 0) {
        unlinkat(dfd, dst, 0);
        errno = e;
    }
    return rc;
}

/* Removes the tree NAME in directory DFD (only ever our own directories);
 * symbolic links are removed, never followed. Best effort. */
static void od_remove_tree(int dfd, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlinkat(dfd, name, 0);
        return;
    }
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d) {
        struct dirent *ent;
        while ((ent = readdir(d)) != NULL)
            if (strcmp(ent->d_name, ".") != 0 && strcmp(ent->d_name, "..") != 0)
                od_remove_tree(dirfd(d), ent->d_name);
        closedir(d);
    } else if (fd >= 0) {
        close(fd);
    }
    unlinkat(dfd, name, AT_REMOVEDIR);
}

/* fsync of directory NAME in DFD and of every directory under it, so the
 * entries made there survive a crash; best effort (some file systems
 * refuse fsync on directories). */
static void od_sync_tree(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    (void)fsync(fd);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(ent->d_name, ".") != 0 && strcmp(ent->d_name, "..") != 0 &&
            fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
            od_sync_tree(dirfd(d), ent->d_name);
    }
    closedir(d);
}

static mode_t od_umask(void)
{
    mode_t m = umask(0);
    umask(m);
    return m;
}

/* ------------------------------------------------------------------ one write */

typedef struct {
    const char *display; /* DIR as the caller named it, for messages */
    int pfd;             /* DIR's parent directory (locked) */
    char *base;          /* DIR's name in it */
    char *tmp;           /* the new set's directory in it, or NULL */
    int exists;          /* base is a directory (the old set) */
    mode_t mask;
    od_file *files;
    size_t n;
    long fail_after, steps; /* test hook MG_OUTDIR_FAIL_AFTER */
    char **err;
} od_ctx;

/* The test hook: a kill -9 after MG_OUTDIR_FAIL_AFTER steps. */
static void od_step(od_ctx *c)
{
    if (c->fail_after > 0 && ++c->steps >= c->fail_after) {
        kill(getpid(), SIGKILL);
        _exit(137);
    }
}

/* A new empty directory .BASE.mamba-gen.KIND-PID-XXXXXX in the parent, mode
 * 0700; its name, or NULL with errno. */
static char *od_mkdir_unique(od_ctx *c, const char *kind)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 20) ^
                           ((unsigned long long)getpid() << 40);
    for (int attempt = 0; attempt < 100; attempt++) {
        char rnd[7];
        for (int i = 0; i < 6; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            rnd[i] = abc[(x >> 33) % (sizeof abc - 1)];
        }
        rnd[6] = '\0';
        char *name = od_printf(".%s" OD_TAG "%s-%ld-%s", c->base, kind, (long)getpid(), rnd);
        if (mkdirat(c->pfd, name, 0700) == 0)
            return name;
        int e = errno;
        free(name);
        if (e != EEXIST) {
            errno = e;
            return NULL;
        }
    }
    errno = EEXIST;
    return NULL;
}

/* 1 if NAME is .BASE.mamba-gen.KIND-PID-XXXXXX; *PID set. */
static int od_is_ours(const char *name, const char *base, const char *kind, long *pid)
{
    size_t lb = strlen(base), lt = strlen(OD_TAG), lk = strlen(kind);
    if (name[0] != '.' || strncmp(name + 1, base, lb) != 0)
        return 0;
    const char *p = name + 1 + lb;
    if (strncmp(p, OD_TAG, lt) != 0 || strncmp(p + lt, kind, lk) != 0 || p[lt + lk] != '-')
        return 0;
    p += lt + lk + 1;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || *end != '-' || errno != 0 || v <= 0)
        return 0;
    p = end + 1;
    for (int i = 0; i < 6; i++)
        if (!((p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9')))
            return 0;
    if (p[6] != '\0')
        return 0;
    *pid = v;
    return 1;
}

/* Leftovers of interrupted runs into DIR: with the lock held every one of
 * them is stale; without (a file system without flock) only those whose
 * process is gone. A DIR a run left aside while swapping (killed between
 * its two renames) is put back when DIR is missing; the rest is removed. */
static void od_cleanup(od_ctx *c, int locked)
{
    int fd = openat(c->pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    char **stale = NULL;
    size_t ns = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long pid;
        int old = od_is_ours(ent->d_name, c->base, "old", &pid);
        if (!old && !od_is_ours(ent->d_name, c->base, "tmp", &pid))
            continue;
        if (!locked && (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        if (ns == cap) {
            size_t ncap = cap ? 2 * cap : 8;
            char **nn = realloc(stale, ncap * sizeof *nn);
            if (!nn)
                break;
            stale = nn;
            cap = ncap;
        }
        char *s = od_printf("%c%s", old ? 'o' : 't', ent->d_name);
        stale[ns++] = s;
    }
    closedir(d);
    for (size_t i = 0; i < ns; i++) {
        const char *name = stale[i] + 1;
        if (stale[i][0] == 'o' && !c->exists && renameat(c->pfd, name, c->pfd, c->base) == 0) {
            c->exists = 1; /* the previous set is back */
            continue;
        }
        od_remove_tree(c->pfd, name);
    }
    for (size_t i = 0; i < ns; i++)
        free(stale[i]);
    free(stale);
}

/* 1 if REL is one of the emitted paths. */
static int od_emitted(const od_ctx *c, const char *rel)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->files[i].path, rel) == 0)
            return 1;
    return 0;
}

/* 1 if NAME in directory REL ("" for DIR) is .X.tmp-XXXXXX with REL/X
 * emitted: a temporary file of the per-file writing of mamba-gen <= 0.1,
 * dropped when the old set is carried over. */
static int od_legacy_tmp(const od_ctx *c, const char *rel, const char *name)
{
    size_t len = strlen(name);
    if (name[0] != '.' || len < 2 + 11 || strncmp(name + len - 11, ".tmp-", 5) != 0)
        return 0;
    char *target = od_printf("%s%s%.*s", rel, *rel ? "/" : "", (int)(len - 12), name + 1);
    int r = od_emitted(c, target);
    free(target);
    return r;
}

/* The directories of REL (a checked emitted path) in the new set: each made
 * with the mode of the old set's directory of that name, if any; a file
 * there in the old set is an error. */
static int od_mkdirs(od_ctx *c, const char *rel)
{
    for (const char *s = strchr(rel, '/'); s; s = strchr(s + 1, '/')) {
        int len = (int)(s - rel);
        char *np = od_printf("%s/%.*s", c->tmp, len, rel);
        struct stat st;
        if (fstatat(c->pfd, np, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            free(np);
            continue;
        }
        mode_t mode = 0777 & ~c->mask;
        char *op = od_printf("%s/%.*s", c->base, len, rel);
        if (c->exists && fstatat(c->pfd, op, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                *c->err = od_printf("cannot create directory %s/%.*s: a file of that name exists", c->display,
                                    len, rel);
                free(op);
                free(np);
                return -1;
            }
            mode = st.st_mode & 07777;
        }
        free(op);
        if (mkdirat(c->pfd, np, 0700) != 0 || fchmodat(c->pfd, np, mode, 0) != 0) {
            int e = errno;
            *c->err = od_printf("cannot create directory %s/%.*s: %s", c->display, len, rel, strerror(e));
            free(np);
            return -1;
        }
        free(np);
    }
    return 0;
}

/* Puts emitted file F into the new set: a link to (or a copy of) the old
 * file when its bytes are the same, else the new bytes, synced. */
static int od_put(od_ctx *c, od_file *f)
{
    if (od_mkdirs(c, f->path) != 0)
        return -1;
    char *op = od_printf("%s/%s", c->base, f->path);
    char *np = od_printf("%s/%s", c->tmp, f->path);
    int rc = -1;
    struct stat st;
    int have = c->exists && fstatat(c->pfd, op, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (have && S_ISDIR(st.st_mode)) {
        *c->err = od_printf("cannot write %s/%s: it is a directory", c->display, f->path);
        goto out;
    }
    if (have && S_ISREG(st.st_mode) && od_same_content(c->pfd, op, f)) {
        /* unchanged: the same file, so its mtime stays what make saw */
        if (linkat(c->pfd, op, c->pfd, np, 0) != 0 && od_copy(c->pfd, op, np, &st) != 0) {
            int e = errno;
            *c->err = od_printf("cannot write %s/%s: %s", c->display, f->path, strerror(e));
            goto out;
        }
        f->written = 0;
    } else {
        /* keep the permissions the user gave the file */
        mode_t mode = have && S_ISREG(st.st_mode) ? st.st_mode & 0777 : 0666 & ~c->mask;
        int fd = openat(c->pfd, np, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        int bad = fd < 0;
        if (!bad && (fchmod(fd, mode) != 0 || od_write_all(fd, f->data, f->size) != 0)) {
            int e = errno;
            close(fd);
            errno = e;
            bad = 1;
        }
        if (bad || od_sync_close(fd) != 0) {
            int e = errno;
            *c->err = od_printf("cannot write %s/%s: %s", c->display, f->path, strerror(e));
            goto out;
        }
        f->written = 1;
    }
    rc = 0;
out:
    free(op);
    free(np);
    return rc;
}

/* Carries every entry of the old set's directory REL ("" for DIR) that was
 * not emitted into the new set: hard links (else copies with their mode and
 * times, or new symbolic links), directories made with their mode. */
static int od_carry(od_ctx *c, const char *rel)
{
    char *od = *rel ? od_printf("%s/%s", c->base, rel) : strdup(c->base);
    int fd = od ? openat(c->pfd, od, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        *c->err = od_printf("cannot read %s%s%s: %s", c->display, *rel ? "/" : "", rel, strerror(e));
        free(od);
        return -1;
    }
    free(od);
    int rc = 0;
    struct dirent *ent;
    while (rc == 0 && (ent = readdir(d)) != NULL) {
        const char *name = ent->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || od_legacy_tmp(c, rel, name))
            continue;
        char *r = od_printf("%s%s%s", rel, *rel ? "/" : "", name);
        struct stat st;
        if (od_emitted(c, r) || fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            free(r);
            continue;
        }
        char *op = od_printf("%s/%s", c->base, r);
        char *np = od_printf("%s/%s", c->tmp, r);
        struct stat nst;
        int e = 0;
        if (S_ISDIR(st.st_mode)) {
            if (fstatat(c->pfd, np, &nst, AT_SYMLINK_NOFOLLOW) != 0 &&
                (mkdirat(c->pfd, np, 0700) != 0 || fchmodat(c->pfd, np, st.st_mode & 07777, 0) != 0))
                e = errno;
            else
                rc = od_carry(c, r);
        } else if (fstatat(c->pfd, np, &nst, AT_SYMLINK_NOFOLLOW) == 0) {
            /* cannot happen: emitted paths were checked against the old set */
        } else if (linkat(c->pfd, op, c->pfd, np, 0) != 0) {
            if (S_ISREG(st.st_mode)) {
                if (od_copy(c->pfd, op, np, &st) != 0)
                    e = errno;
            } else if (S_ISLNK(st.st_mode)) {
                char target[PATH_MAX];
                ssize_t len = readlinkat(c->pfd, op, target, sizeof target - 1);
                if (len < 0)
                    e = errno;
                else {
                    target[len] = '\0';
                    if (symlinkat(target, c->pfd, np) != 0)
                        e = errno;
                }
            } else {
                e = errno;
            }
        }
        if (e) {
            *c->err = od_printf("cannot keep %s/%s in the new output directory: %s", c->display, r, strerror(e));
            rc = -1;
        }
        free(op);
        free(np);
        free(r);
    }
    closedir(d);
    return rc;
}

/* DIR's new set, in place of its old one at once. */
static int od_swap(od_ctx *c)
{
    if (!c->exists) {
        if (renameat(c->pfd, c->tmp, c->pfd, c->base) != 0)
            return od_fail(c->err, "cannot rename the new output directory to", c->display, errno);
        return 0;
    }
    const char *no = getenv("MG_OUTDIR_NO_EXCHANGE"); /* test hook: the fallback below */
    if (!no || !*no || strcmp(no, "0") == 0) {
#ifdef SYS_renameat2
        if (syscall(SYS_renameat2, c->pfd, c->tmp, c->pfd, c->base, RENAME_EXCHANGE) == 0) {
            (void)fsync(c->pfd);
            od_remove_tree(c->pfd, c->tmp); /* now the old set */
            return 0;
        }
        if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
            return od_fail(c->err, "cannot swap the new output directory in for", c->display, errno);
#endif
    }
    /* no exchange: the old set aside, the new one in, a moment without DIR
     * (a run killed there leaves the old set aside: the next one restores it) */
    char *aside = od_mkdir_unique(c, "old");
    if (!aside)
        return od_fail(c->err, "cannot make room for the old output directory next to", c->display, errno);
    if (renameat(c->pfd, c->base, c->pfd, aside) != 0) {
        int e = errno;
        unlinkat(c->pfd, aside, AT_REMOVEDIR);
        free(aside);
        return od_fail(c->err, "cannot move aside the old output directory", c->display, e);
    }
    od_step(c);
    if (renameat(c->pfd, c->tmp, c->pfd, c->base) != 0) {
        int e = errno;
        if (renameat(c->pfd, aside, c->pfd, c->base) != 0)
            *c->err = od_printf("cannot rename the new output directory to %s: %s (the old one is left as %s)",
                                c->display, strerror(e), aside);
        else
            od_fail(c->err, "cannot rename the new output directory to", c->display, e);
        free(aside);
        return -1;
    }
    (void)fsync(c->pfd);
    od_remove_tree(c->pfd, aside);
    free(aside);
    return 0;
}

/* Locks the parent (waits for a concurrent writer); 1 locked, 0 where the
 * file system has no flock. */
static int od_lock(int pfd)
{
    if (flock(pfd, LOCK_EX | LOCK_NB) == 0)
        return 1;
    if (errno != EWOULDBLOCK)
        return 0;
    while (flock(pfd, LOCK_EX) != 0)
        if (errno != EINTR)
            return 0;
    return 1;
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
    od_ctx c;
    memset(&c, 0, sizeof c);
    c.pfd = -1;
    c.files = files;
    c.n = n;
    c.err = err;
    c.mask = od_umask();
    const char *hook = getenv("MG_OUTDIR_FAIL_AFTER");
    c.fail_after = hook ? strtol(hook, NULL, 10) : 0;
    int rc = -1;
    char *parent = NULL;
    /* "out/" and "out" are the same directory */
    char *dir = strdup(dir_in);
    if (!dir) {
        *err = od_printf("out of memory");
        return -1;
    }
    for (size_t len = strlen(dir); len > 1 && dir[len - 1] == '/'; len--)
        dir[len - 1] = '\0';
    c.display = dir;
    /* The directory DIR names (a symbolic link: its target) and its parent. */
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            *err = od_printf("cannot write to %s: it exists and is not a directory", dir);
            goto out;
        }
        char *real = realpath(dir, NULL);
        if (!real) {
            od_fail(err, "cannot access", dir, errno);
            goto out;
        }
        char *slash = strrchr(real, '/');
        if (!slash || !slash[1]) {
            *err = od_printf("cannot write to %s: the root directory cannot be replaced", dir);
            free(real);
            goto out;
        }
        parent = slash == real ? strdup("/") : od_printf("%.*s", (int)(slash - real), real);
        c.base = strdup(slash + 1);
        free(real);
    } else if (errno == ENOENT) {
        char *slash = strrchr(dir, '/');
        parent = !slash ? strdup(".") : slash == dir ? strdup("/") : od_printf("%.*s", (int)(slash - dir), dir);
        c.base = strdup(slash ? slash + 1 : dir);
        if (!parent || !c.base) {
            *err = od_printf("out of memory");
            goto out;
        }
        if (strcmp(c.base, ".") == 0 || strcmp(c.base, "..") == 0) {
            od_fail(err, "cannot access", dir, ENOENT);
            goto out;
        }
        /* the parent must exist for the sibling temporary directory */
        if (od_mkdir_p(parent, 0777 & ~c.mask, err) != 0)
            goto out;
    } else {
        od_fail(err, "cannot access", dir, errno);
        goto out;
    }
    if (!parent || !c.base) {
        *err = od_printf("out of memory");
        goto out;
    }
    c.pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c.pfd < 0) {
        od_fail(err, "cannot open directory", parent, errno);
        goto out;
    }
    int locked = od_lock(c.pfd);
    /* under the lock: what DIR is now (another writer may have made it) */
    if (fstatat(c.pfd, c.base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            *err = od_printf("cannot write to %s: it exists and is not a directory", dir);
            goto out;
        }
        c.exists = 1;
    } else if (errno != ENOENT) {
        od_fail(err, "cannot access", dir, errno);
        goto out;
    }
    od_cleanup(&c, locked);
    mode_t top = 0777 & ~c.mask;
    if (c.exists && fstatat(c.pfd, c.base, &st, AT_SYMLINK_NOFOLLOW) == 0)
        top = st.st_mode & 07777;
    c.tmp = od_mkdir_unique(&c, "tmp");
    if (!c.tmp) {
        *err = od_printf("cannot create a temporary directory next to %s: %s", dir, strerror(errno));
        goto out;
    }
    if (fchmodat(c.pfd, c.tmp, top, 0) != 0) {
        od_fail(err, "cannot chmod a temporary directory next to", dir, errno);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (od_put(&c, &files[i]) != 0)
            goto out;
        od_step(&c);
    }
    if (c.exists && od_carry(&c, "") != 0)
        goto out;
    od_sync_tree(c.pfd, c.tmp);
    if (od_swap(&c) != 0)
        goto out;
    free(c.tmp);
    c.tmp = NULL;
    rc = 0;
out:
    if (c.tmp) {
        od_remove_tree(c.pfd, c.tmp);
        free(c.tmp);
    }
    if (rc != 0)
        for (size_t i = 0; i < n; i++)
            files[i].written = 0;
    if (c.pfd >= 0)
        close(c.pfd); /* and the lock with it */
    free(c.base);
    free(parent);
    free(dir);
    return rc;
}
