/* gen/tune_cache.h: the autotune cache on disk (doc/tuning.md): where it
 * is, its key, reading every entry of it, writing one entry atomically, and
 * a small text buffer with JSON string escaping for writing entries. Plain
 * C, no CUDA: mamba-gen reads the cache with it, mamba-tune writes it. */
#ifndef MG_TUNE_CACHE_H
#define MG_TUNE_CACHE_H

#include <stddef.h>

#include "sha256.h"

#define TC_FORMAT "mamba-gen-tune 1"          /* first key part, "format" field */
#define TC_MAX_FILE_SIZE (1024L * 1024L)      /* a bigger file is not an entry */
#define TC_MAX_FILES 1024                     /* entries read per lookup */

/* The cache directory: EXPLICIT if not NULL, else $MG_TUNE_CACHE, else
 * $XDG_CACHE_HOME/mamba-gen (an absolute XDG_CACHE_HOME only, as the XDG
 * spec says), else $HOME/.cache/mamba-gen. malloc'd; NULL with *ERR set
 * (free it) when none can be formed. */
char *tc_dir(const char *explicit_dir, char **err);

/* The parts of the key, stored in clear in each entry. */
typedef struct {
    const char *spec;      /* sha256 of the canonical spec text (mg/tune.lua key_text) */
    const char *spec_name; /* not hashed: for file names and people */
    const char *generator; /* mamba-gen version */
    const char *templates; /* sha256 of the template set */
    const char *gpu;       /* device name */
    const char *cc;        /* compute capability "9.0" */
    const char *driver;    /* CUDA driver version "13.0" */
    const char *nvrtc;     /* NVRTC version "13.0" */
} tc_key_parts;

/* HEX = sha256 of the canonical key string: TC_FORMAT, then one
 * "name=value\n" line per hashed part in the order above (spec_name left
 * out); a NULL part is an empty value. */
void tc_key(const tc_key_parts *k, char hex[SHA256_HEX_SIZE]);

/* File name of an entry: "SPECNAME-KEY16.json" (KEY16: the key's first 16
 * hex digits; characters of SPECNAME outside [A-Za-z0-9_-] become '_'). */
char *tc_file_name(const tc_key_parts *k);

typedef struct {
    char *path; /* DIR/NAME */
    char *data; /* NUL-terminated */
    size_t size;
} tc_file;

typedef struct {
    tc_file *files;
    size_t n;
} tc_files;

/* Reads every regular file DIR/ *.json (names not starting with '.') of at
 * most TC_MAX_FILE_SIZE bytes, at most TC_MAX_FILES of them, sorted by name.
 * A missing directory is an empty cache (0). Other failures: -1 with *ERR
 * set (free it). Unreadable or oversized files are skipped. */
int tc_read_all(const char *dir, tc_files *out, char **err);
void tc_files_free(tc_files *f);

/* Writes DATA as DIR/NAME atomically: DIR (and missing parents) created
 * with mode 0755, the bytes written to a temporary file in DIR, synced,
 * then renamed over NAME, so readers see the old entry or the new one,
 * never a part. 0, or -1 with *ERR set (free it) and no temporary left. */
int tc_write_atomic(const char *dir, const char *name, const char *data, size_t size, char **err);

/* A growing text buffer (for JSON). Allocation failure is sticky: the
 * buffer reports it at tc_buf_take. */
typedef struct {
    char *data;
    size_t len, cap;
    int failed;
} tc_buf;

void tc_buf_printf(tc_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends S as a JSON string literal (quotes, escapes, control characters
 * as \u00XX; bytes >= 0x80 are copied: the input is UTF-8). NULL -> null. */
void tc_buf_json_str(tc_buf *b, const char *s);
/* The text (malloc'd, NUL-terminated; the caller frees it), or NULL if an
 * allocation failed. The buffer is empty afterwards. */
char *tc_buf_take(tc_buf *b, size_t *len);

#endif
