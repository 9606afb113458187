/* gen/tune_cache.c: the autotune cache on disk (see tune_cache.h). */
#include "xstr.h"
#include "tune_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *tc_dir(const char *explicit_dir, char **err)
{
    *err = NULL;
    const char *v;
    char *d = NULL;
    if (explicit_dir && *explicit_dir)
        d = strdup(explicit_dir);
    else if ((v = getenv("MG_TUNE_CACHE")) && *v)
        d = strdup(v);
    else if ((v = getenv("XDG_CACHE_HOME")) && v[0] == '/')
        d = xstr_printf("%s/mamba-gen", v);
    else if ((v = getenv("HOME")) && *v)
        d = xstr_printf("%s/.cache/mamba-gen", v);
    else {
        *err = strdup("no autotune cache directory: set MG_TUNE_CACHE, XDG_CACHE_HOME or HOME");
        return NULL;
    }
    if (!d)
        *err = strdup("out of memory");
    return d;
}

void tc_key(const tc_key_parts *k, char hex[SHA256_HEX_SIZE])
{
    const char *names[] = {"spec", "generator", "templates", "gpu", "cc", "driver", "nvrtc"};
    const char *vals[] = {k->spec, k->generator, k->templates, k->gpu, k->cc, k->driver, k->nvrtc};
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, TC_FORMAT "\n", strlen(TC_FORMAT) + 1);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = vals[i] ? vals[i] : "";
        sha256_update(&c, names[i], strlen(names[i]));
        sha256_update(&c, "=", 1);
        sha256_update(&c, v, strlen(v));
        sha256_update(&c, "\n", 1);
    }
    unsigned char dig[SHA256_DIGEST_SIZE];
    sha256_final(&c, dig);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(hex + 2 * i, 3, "%02x", dig[i]);
}

char *tc_file_name(const tc_key_parts *k)
{
    char hex[SHA256_HEX_SIZE];
    tc_key(k, hex);
    char *prefix = tc_file_prefix(k->spec_name);
    char *s = prefix ? xstr_printf("%s%.16s.json", prefix, hex) : NULL;
    free(prefix);
    return s;
}

/* ------------------------------------------------------------------ reading */

static int tc_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tc_file *)a)->path, ((const tc_file *)b)->path);
}

static int tc_str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* 0 and the bytes; 1: larger than TC_MAX_FILE_SIZE (*SIZE set); -1:
 * skipped (not regular, unreadable). */
static int tc_read_one(const char *path, char **data, size_t *size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    if (st.st_size > TC_MAX_FILE_SIZE) {
        close(fd);
        *size = (size_t)st.st_size;
        return 1;
    }
    size_t cap = (size_t)st.st_size, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return -1;
    }
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    *data = buf;
    *size = len;
    return 0;
}

char *tc_file_prefix(const char *spec_name)
{
    const char *n = spec_name && *spec_name ? spec_name : "spec";
    char *s = xstr_printf("%.64s-", n);
    if (!s)
        return NULL;
    for (char *p = s; p[1]; p++) {
        char ch = *p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-'))
            *p = '_';
    }
    return s;
}

/* 1 if NAME is PREFIX, 16 lowercase hex digits, ".json". */
static int tc_named_for(const char *name, const char *prefix)
{
    size_t lp = strlen(prefix);
    if (!prefix[0] || strncmp(name, prefix, lp) != 0 || strlen(name) != lp + 16 + 5)
        return 0;
    for (size_t i = lp; i < lp + 16; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return 0;
    return strcmp(name + lp + 16, ".json") == 0;
}

/* Appends a warning line (or marks the failure in *OOM). */
static void tc_warn(tc_files *out, int *oom, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void tc_warn(tc_files *out, int *oom, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xstr_vprintf(fmt, ap);
    va_end(ap);
    char **nw = s ? realloc(out->warnings, (out->nwarnings + 1) * sizeof *nw) : NULL;
    if (!nw) {
        free(s);
        *oom = 1;
        return;
    }
    out->warnings = nw;
    out->warnings[out->nwarnings++] = s;
}

/* A file read to choose from: its name, its bytes, whether it is wanted first. */
typedef struct {
    char *path;
    char *data;
    size_t size;
    int first;
} tc_cand;

int tc_read(const char *dir, const tc_select *sel, tc_files *out, char **err)
{
    *err = NULL;
    memset(out, 0, sizeof *out);
    DIR *dp = opendir(dir);
    if (!dp) {
        if (errno == ENOENT)
            return 0;
        *err = xstr_printf("autotune cache %s: %s", dir, strerror(errno));
        return -1;
    }
    int oom = 0;
    /* the *.json names, at most TC_MAX_NAMES */
    char **names = NULL;
    size_t nn = 0, ncap = 0, over_names = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL && !oom) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        if (nn == TC_MAX_NAMES) {
            over_names++;
            continue;
        }
        if (nn == ncap) {
            size_t c2 = ncap ? 2 * ncap : 64;
            char **nw = realloc(names, c2 * sizeof *nw);
            if (!nw) {
                oom = 1;
                break;
            }
            names = nw;
            ncap = c2;
        }
        if (!(names[nn] = strdup(de->d_name)))
            oom = 1;
        else
            nn++;
    }
    closedir(dp);
    /* those named for the spec first, then the others, each by name */
    char *prefix = sel && sel->spec_name ? tc_file_prefix(sel->spec_name) : strdup("");
    char *needle = NULL;
    if (sel && sel->gpu) {
        tc_buf b = {NULL, 0, 0, 0};
        tc_buf_json_str(&b, sel->gpu);
        needle = tc_buf_take(&b, NULL);
        oom |= !needle;
    }
    oom |= !prefix;
    size_t nfirst = 0;
    if (!oom && nn > 0) { /* names is NULL when the directory has no *.json: no qsort(NULL, 0) (UB) */
        for (size_t i = 0; i < nn; i++)
            if (tc_named_for(names[i], prefix)) {
                char *t = names[i];
                names[i] = names[nfirst];
                names[nfirst++] = t;
            }
        qsort(names, nfirst, sizeof *names, tc_str_cmp);
        qsort(names + nfirst, nn - nfirst, sizeof *names, tc_str_cmp);
    }
    /* read them until TC_MAX_READ_BYTES */
    tc_cand *cand = oom ? NULL : calloc(nn ? nn : 1, sizeof *cand);
    oom |= !cand;
    size_t nc = 0, read_bytes = 0, not_read = over_names, large = 0;
    for (size_t i = 0; i < nn && !oom; i++) {
        if (read_bytes >= (size_t)TC_MAX_READ_BYTES) {
            not_read++;
            continue;
        }
        char *path = xstr_printf("%s/%s", dir, names[i]);
        char *data = NULL;
        size_t size = 0;
        int r = path ? tc_read_one(path, &data, &size) : -1;
        oom |= !path;
        if (r == 1) {
            if (++large <= 3)
                tc_warn(out, &oom, "autotune cache %s: skipped (%zu bytes, over the limit of %ld for an entry)",
                        path, size, TC_MAX_FILE_SIZE);
        }
        if (r != 0) {
            free(path);
            continue;
        }
        read_bytes += size;
        int first = !needle || strstr(data, needle) != NULL;
        cand[nc++] = (tc_cand){path, data, size, first || i < nfirst ? 1 + (first && i < nfirst) : 0};
    }
    if (large > 3)
        tc_warn(out, &oom, "autotune cache %s: %zu more files over the limit of %ld bytes skipped", dir, large - 3,
                TC_MAX_FILE_SIZE);
    /* hand over: named for the spec and for this GPU, then for this GPU (or
     * named for the spec), then the rest, until TC_MAX_FILES / TC_MAX_BYTES */
    size_t given = 0, not_given = 0;
    out->files = oom ? NULL : calloc(nc ? nc : 1, sizeof *out->files);
    oom |= !out->files;
    for (int tier = 2; tier >= 0 && !oom; tier--) {
        for (size_t i = 0; i < nc; i++) {
            if (cand[i].first != tier)
                continue;
            if (out->n < TC_MAX_FILES && given + cand[i].size <= (size_t)TC_MAX_BYTES) {
                out->files[out->n++] = (tc_file){cand[i].path, cand[i].data, cand[i].size};
                given += cand[i].size;
            } else {
                not_given++;
                free(cand[i].path);
                free(cand[i].data);
            }
            cand[i].path = cand[i].data = NULL;
        }
    }
    if (!oom && not_read + not_given > 0)
        tc_warn(out, &oom,
                "autotune cache %s: %zu of %zu entry files not read (a lookup reads at most %d files, %ld bytes; "
                "files named for this spec and holding this GPU's name come first); remove stale entries",
                dir, not_read + not_given, nn + over_names - large, TC_MAX_FILES, TC_MAX_BYTES);
    for (size_t i = 0; i < nc; i++) {
        free(cand[i].path);
        free(cand[i].data);
    }
    free(cand);
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    free(prefix);
    free(needle);
    if (oom) {
        tc_files_free(out);
        *err = strdup("out of memory");
        return -1;
    }
    if (out->n > 1)
        qsort(out->files, out->n, sizeof *out->files, tc_name_cmp);
    return 0;
}

int tc_read_all(const char *dir, tc_files *out, char **err)
{
    return tc_read(dir, NULL, out, err);
}

void tc_files_free(tc_files *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->files[i].path);
        free(f->files[i].data);
    }
    free(f->files);
    for (size_t i = 0; i < f->nwarnings; i++)
        free(f->warnings[i]);
    free(f->warnings);
    memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------------ writing */

/* mkdir -p PATH (mode 0755). 0, or -1 with errno set. */
static int tc_mkdirs(const char *path)
{
    char *p = strdup(path);
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            errno = e;
            return -1;
        }
        *s = '/';
    }
    int rc = mkdir(p, 0755);
    int e = errno;
    free(p);
    if (rc != 0 && e != EEXIST) {
        errno = e;
        return -1;
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int tc_write_atomic(const char *dir, const char *name, const char *data, size_t size, char **err)
{
    *err = NULL;
    if (!name || !*name || strchr(name, '/') || name[0] == '.') {
        *err = xstr_printf("autotune cache: invalid entry name '%s'", name ? name : "");
        return -1;
    }
    if (tc_mkdirs(dir) != 0) {
        *err = xstr_printf("autotune cache %s: cannot create the directory: %s", dir, strerror(errno));
        return -1;
    }
    char *tmp = xstr_printf("%s/.%s.tmp-XXXXXX", dir, name);
    char *dst = xstr_printf("%s/%s", dir, name);
    if (!tmp || !dst) {
        free(tmp);
        free(dst);
        *err = strdup("out of memory");
        return -1;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        *err = xstr_printf("autotune cache %s: cannot create a file: %s", dir, strerror(errno));
        free(tmp);
        free(dst);
        return -1;
    }
    const char *what = NULL;
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            what = "write";
            break;
        }
        off += (size_t)n;
    }
    if (!what && fchmod(fd, 0644) != 0)
        what = "chmod";
    if (!what && fsync(fd) != 0)
        what = "fsync";
    int e = errno;
    if (close(fd) != 0 && !what) {
        what = "close";
        e = errno;
    }
    if (!what && rename(tmp, dst) != 0) {
        what = "rename";
        e = errno;
    }
    if (what) {
        unlink(tmp);
        *err = xstr_printf("autotune cache %s: %s failed: %s", dst, what, strerror(e));
        free(tmp);
        free(dst);
        return -1;
    }
    free(tmp);
    free(dst);
    return 0;
}

/* ------------------------------------------------------------------ buffer */

static void tc_buf_reserve(tc_buf *b, size_t extra)
{
    if (b->failed || b->len + extra + 1 <= b->cap)
        return;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra + 1)
        ncap *= 2;
    char *nd = realloc(b->data, ncap);
    if (!nd) {
        b->failed = 1;
        return;
    }
    b->data = nd;
    b->cap = ncap;
}

void tc_buf_printf(tc_buf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->failed = 1;
    } else {
        tc_buf_reserve(b, (size_t)n);
        if (!b->failed) {
            vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
            b->len += (size_t)n;
        }
    }
    va_end(ap);
}

void tc_buf_json_str(tc_buf *b, const char *s)
{
    if (!s) {
        tc_buf_printf(b, "null");
        return;
    }
    tc_buf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': tc_buf_printf(b, "\\\""); break;
        case '\\': tc_buf_printf(b, "\\\\"); break;
        case '\n': tc_buf_printf(b, "\\n"); break;
        case '\t': tc_buf_printf(b, "\\t"); break;
        case '\r': tc_buf_printf(b, "\\r"); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                tc_buf_printf(b, "\\u%04x", *p);
            else
                tc_buf_printf(b, "%c", *p);
        }
    }
    tc_buf_printf(b, "\"");
}

char *tc_buf_take(tc_buf *b, size_t *len)
{
    char *d = NULL;
    if (!b->failed) {
        tc_buf_reserve(b, 0);
        if (!b->failed) {
            b->data[b->len] = '\0';
            d = b->data;
            if (len)
                *len = b->len;
            b->data = NULL;
        }
    }
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
    return d;
}
