/* gen/spec_yaml.h: reading a spec file and turning its YAML into the Lua
 * "spec tree" of doc/HACKING.md (nodes with kind/line/col), with every
 * YAML-level check done here so the Lua side only sees well-formed input.
 * Errors come back as malloc'd strings, already formatted as
 * `PATH:LINE:COL: message` (1-based) or `PATH: message` for file-level
 * problems; the caller prints them and exits 1. */
#ifndef MG_SPEC_YAML_H
#define MG_SPEC_YAML_H

#include <stddef.h>

#include <lua.h>

#include "sha256.h"

#define SY_MAX_FILE_SIZE (1024L * 1024L) /* 1 MiB: no real spec comes close */
#define SY_MAX_DEPTH 16                  /* nested mappings/sequences */
#define SY_QUOTE_MAX_CHARS 64            /* user text quoted in a message, then "..." */

/* The bytes of a spec file. */
typedef struct {
    char *data;                  /* malloc'd, NUL-terminated (NUL not counted) */
    size_t size;
    char hash[SHA256_HEX_SIZE];  /* SHA-256 of the bytes, lowercase hex */
} sy_file;

/* Reads PATH into F: rejects a missing or unreadable file, a directory or
 * other non-regular file (never blocks on a FIFO), a file over 1 MiB.
 * Returns 0, or -1 with *ERR set (free it). */
int sy_read_file(const char *path, sy_file *f, char **err);

/* Frees F's buffer (F itself is the caller's). */
void sy_file_free(sy_file *f);

/* Parses DATA[0..SIZE) (the contents of PATH, used in messages) and pushes
 * the spec tree on L. Returns 0 (one value pushed), or -1 with nothing
 * pushed and *ERR set (free it). */
int sy_parse(lua_State *L, const char *path, const char *data, size_t size, char **err);

/* TEXT[0..LEN) made safe to quote in a message (malloc'd, NULL when out of
 * memory): NUL, newline, CR, tab and backslash as \0 \n \r \t \\, other
 * control bytes and bytes that are not UTF-8 as \xHH, C1 controls, line
 * separators, bidi and zero-width marks as \uXXXX; at most
 * SY_QUOTE_MAX_CHARS characters, then "...". mg/validate.lua quotes the
 * same way. */
char *sy_escape(const char *text, size_t len);

/* sy_read_file then sy_parse; HASH receives the spec hash. */
int sy_load(lua_State *L, const char *path, char hash[SHA256_HEX_SIZE], char **err);

#endif
