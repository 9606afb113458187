/* gen/outdir.h: writing the emitted file set into the output directory
 * atomically, so a failed run never leaves a half-written model behind
 * (a new directory appears complete or not at all; in an existing one, every
 * new file is written and synced before any is renamed into place). */
#ifndef MG_OUTDIR_H
#define MG_OUTDIR_H

#include <stddef.h>

typedef struct {
    const char *path; /* relative to the output directory, '/'-separated */
    const char *data;
    size_t size;
    int written;      /* set by od_write: 1 written, 0 unchanged (kept as is) */
} od_file;

/* 1 if PATH may name a file under the output directory: not empty, not
 * absolute, no empty, "." or ".." component. */
int od_path_ok(const char *path);

/* Checks every path with od_path_ok and that no path is given twice or is
 * both a file and a directory. 0, or -1 with *ERR set (free it). */
int od_check_files(const od_file *files, size_t n, char **err);

/* Writes FILES under DIR (created, with missing parents, if it does not
 * exist). Files whose current content is identical are not rewritten, which
 * keeps their mtimes for make. 0, or -1 with *ERR set (free it); on failure
 * nothing in DIR has changed, except in the unlikely event that a rename
 * fails after others succeeded (the message says so). */
int od_write(const char *dir, od_file *files, size_t n, char **err);

#endif
