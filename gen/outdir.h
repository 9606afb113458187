/* gen/outdir.h: writing the emitted file set into the output directory
 * atomically, so a failed or killed run never leaves a half-written model
 * behind: the whole new directory is built next to DIR and swapped in at
 * once, concurrent writers take turns (a lock on DIR's parent), and the
 * leftovers of interrupted runs are removed by the next one. */
#ifndef MG_OUTDIR_H
#define MG_OUTDIR_H

#include <stddef.h>

typedef struct {
    const char *path; /* relative to the output directory, '/'-separated */
    const char *data;
    size_t size;
    int written;      /* set by od_write: 1 written, 0 unchanged (the old file kept) */
} od_file;

/* 1 if PATH may name a file under the output directory: not empty, not
 * absolute, no empty, "." or ".." component. */
int od_path_ok(const char *path);

/* Checks every path with od_path_ok and that no path is given twice or is
 * both a file and a directory. 0, or -1 with *ERR set (free it). */
int od_check_files(const od_file *files, size_t n, char **err);

/* Writes FILES as DIR (created, with missing parents, if it does not
 * exist; a symbolic link to a directory: its target):
 *  - DIR's parent is locked (flock) while writing; a second writer waits;
 *  - leftovers of interrupted runs into DIR (hidden siblings
 *    .BASE.mamba-gen.tmp-PID-XXXXXX / .old-PID-XXXXXX) are removed first
 *    (without flock support: only those whose process PID is gone), and an
 *    old DIR left aside by a run killed mid-swap is put back;
 *  - the new set is built in .BASE.mamba-gen.tmp-PID-XXXXXX: changed and new
 *    files written and synced (a changed file keeps its permissions), files
 *    whose content is identical hard-linked (else copied with their times)
 *    from DIR, so they keep their mtimes for make; every other entry of DIR
 *    (files of the user's own, directories, symbolic links) is kept the same
 *    way, except .X.tmp-XXXXXX leftovers of older versions next to an
 *    emitted X;
 *  - the new directory replaces DIR in one step (renameat2 RENAME_EXCHANGE;
 *    where the file system lacks it, DIR is renamed aside and the new one
 *    renamed in), then the old tree is removed. DIR is a new directory
 *    afterwards: a shell whose working directory it was must cd again.
 * 0, or -1 with *ERR set (free it); on failure DIR has not changed.
 * WRITTEN is set per file (1 written, 0 unchanged).
 *
 * Test hooks (environment): MG_OUTDIR_FAIL_AFTER=N kills the process
 * (SIGKILL, no clean-up) after N steps: one per file put into the new
 * directory, then one after DIR was renamed aside (the fallback swap only);
 * MG_OUTDIR_NO_EXCHANGE=1 takes the fallback swap. tests/outdir_atomic.test
 * uses them. */
int od_write(const char *dir, od_file *files, size_t n, char **err);

#endif
