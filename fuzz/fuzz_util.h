/* fuzz/fuzz_util.h: what the libFuzzer targets share: one scratch directory
 * per process (made on the first call, removed at exit), writing an input
 * to a file, removing a tree, and the resource checks that make a leak of
 * file descriptors or directories between iterations a crash. Header only
 * (each target is one translation unit). */
#ifndef MG_FUZZ_UTIL_H
#define MG_FUZZ_UTIL_H

#define _GNU_SOURCE /* nftw's FTW_DEPTH | FTW_PHYS, mkdtemp */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fz_root[512]; /* the scratch directory, "" before fz_setup */

static int fz_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if ((flag == FTW_DP || flag == FTW_D) ? rmdir(path) : unlink(path))
        return errno == ENOENT ? 0 : -1;
    return 0;
}

/* Removes PATH and everything under it (a missing PATH is fine). */
static void fz_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (nftw(path, fz_rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "fuzz: cannot remove %s: %s\n", path, strerror(errno));
        abort();
    }
}

static void fz_cleanup(void)
{
    if (fz_root[0])
        fz_rm_tree(fz_root);
}

/* The lowest free descriptor: constant from one iteration to the next
 * unless an iteration leaked one. */
static int fz_lowest_fd(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        abort();
    close(fd);
    return fd;
}

/* Makes the scratch directory ($TMPDIR or /tmp) on the first call. */
static const char *fz_setup(void)
{
    if (!fz_root[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fz_root, sizeof fz_root, "%s/mg-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fz_root)) {
            fprintf(stderr, "fuzz: mkdtemp %s: %s\n", fz_root, strerror(errno));
            abort();
        }
        atexit(fz_cleanup);
    }
    return fz_root;
}

/* Writes DATA[0..SIZE) as PATH (replaced). */
static void fz_write(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n <= 0)
            abort();
        p += n;
        size -= (size_t)n;
    }
    close(fd);
}

/* Before an iteration: the lowest free descriptor (fz_check_clean compares). */
static int fz_begin(void)
{
    return fz_lowest_fd();
}

/* After an iteration: its work directory WORK is removed (nothing else is
 * left in the scratch directory: the next iteration's mkdir of WORK would
 * fail otherwise) and no descriptor leaked (FD0: fz_begin()'s value). */
static void fz_check_clean(const char *work, int fd0)
{
    fz_rm_tree(work);
    int fd = fz_lowest_fd();
    if (fd != fd0) {
        fprintf(stderr, "fuzz: file descriptor leak: lowest free fd %d, was %d\n", fd, fd0);
        abort();
    }
}

#endif
