/* gen/tune_cache.h: the autotune cache on disk (doc/tuning.md): where it
 * is, its key, reading every entry of it, writing one entry atomically, and
 * a small text buffer with JSON string escaping for writing entries. Plain
 * C, no CUDA: mamba-gen reads the cache with it, mamba-tune writes it. */
#ifndef MG_TUNE_CACHE_H
#define MG_TUNE_CACHE_H

#include <stddef.h>

#include "sha256.h"

#define TC_FORMAT "mamba-gen-tune 1"          /* first key part, "format" field */
/* Bounds of one lookup (tc_read), so that a cache full of entries or junk
 * costs at most a few seconds of parsing; when one is hit, tc_read says so
 * in its warnings instead of dropping files silently. */
#define TC_MAX_FILE_SIZE (256L * 1024L)       /* a bigger file is skipped (warning); entries are a few KiB */
#define TC_MAX_FILES 256                      /* files handed over (each parsed by the caller) */
#define TC_MAX_BYTES (2L * 1024L * 1024L)     /* bytes handed over */
#define TC_MAX_READ_BYTES (32L * 1024L * 1024L) /* bytes read to choose them */
#define TC_MAX_NAMES 65536                    /* *.json names looked at in the directory */

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

/* "SPECNAME-": what the file names of SPEC_NAME's entries start with
 * (SPECNAME as tc_file_name writes it; NULL or "": "spec-"). malloc'd. */
char *tc_file_prefix(const char *spec_name);

typedef struct {
    char *path; /* DIR/NAME */
    char *data; /* NUL-terminated */
    size_t size;
} tc_file;

typedef struct {
    tc_file *files;
    size_t n;
    char **warnings; /* what a bound left out or what was skipped, one line each */
    size_t nwarnings;
} tc_files;

/* Which entries a lookup wants first (tc_read). */
typedef struct {
    const char *spec_name; /* files named SPECNAME-<16 hex>.json (tc_file_prefix) are read first */
    const char *gpu;       /* files holding this GPU name as a JSON string ("NVIDIA H200", with the
                              quotes, escaped as tc_buf_json_str does) are handed over first */
} tc_select;

/* Reads the regular files DIR/ *.json (names not starting with '.') within
 * the bounds above: first those named for SEL->spec_name, then the others,
 * each group by name, until TC_MAX_READ_BYTES are read; of those, the ones
 * holding SEL->gpu's name first, then the others, until TC_MAX_FILES or
 * TC_MAX_BYTES are handed over. OUT->files are sorted by name. A file over
 * TC_MAX_FILE_SIZE is skipped, and every file a bound left out is counted,
 * each with a line in OUT->warnings naming the directory (empty when
 * nothing was left out). SEL may be NULL (no preference). A missing
 * directory is an empty cache (0). Other failures: -1 with *ERR set (free
 * it). Unreadable files are skipped. */
int tc_read(const char *dir, const tc_select *sel, tc_files *out, char **err);
/* tc_read with no preference. */
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
