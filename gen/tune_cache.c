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
    const char *n = k->spec_name && *k->spec_name ? k->spec_name : "spec";
    char *s = xstr_printf("%.64s-%.16s.json", n, hex);
    if (!s)
        return NULL;
    for (char *p = s; *p && p < s + strlen(s) - 22; p++) {
        char ch = *p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-'))
            *p = '_';
    }
    return s;
}

/* ------------------------------------------------------------------ reading */

static int tc_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tc_file *)a)->path, ((const tc_file *)b)->path);
}

/* 0 and the bytes, or -1 (skipped: not regular, too big, unreadable). */
static int tc_read_one(const char *path, char **data, size_t *size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > TC_MAX_FILE_SIZE) {
        close(fd);
        return -1;
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

int tc_read_all(const char *dir, tc_files *out, char **err)
{
    *err = NULL;
    out->files = NULL;
    out->n = 0;
    DIR *dp = opendir(dir);
    if (!dp) {
        if (errno == ENOENT)
            return 0;
        *err = xstr_printf("autotune cache %s: %s", dir, strerror(errno));
        return -1;
    }
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL && out->n < TC_MAX_FILES) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        char *path = xstr_printf("%s/%s", dir, de->d_name);
        char *data = NULL;
        size_t size = 0;
        if (!path || tc_read_one(path, &data, &size) != 0) {
            free(path);
            continue;
        }
        if (out->n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            tc_file *nf = realloc(out->files, ncap * sizeof *nf);
            if (!nf) {
                free(path);
                free(data);
                closedir(dp);
                tc_files_free(out);
                *err = strdup("out of memory");
                return -1;
            }
            out->files = nf;
            cap = ncap;
        }
        out->files[out->n].path = path;
        out->files[out->n].data = data;
        out->files[out->n].size = size;
        out->n++;
    }
    closedir(dp);
    if (out->n > 1)
        qsort(out->files, out->n, sizeof *out->files, tc_name_cmp);
    return 0;
}

void tc_files_free(tc_files *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->files[i].path);
        free(f->files[i].data);
    }
    free(f->files);
    f->files = NULL;
    f->n = 0;
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
