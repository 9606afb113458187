/* tune/tune.h: what the files of mamba-tune share: its options, the
 * candidates and the manifest the Lua side writes for them (mg/tune.lua
 * sources), and the steps of a sweep, one file each: tune_manifest.c (read
 * the manifest), tune_sweep.c (compile, verify and time the candidates,
 * choose the best), tune_report.c (the table, the CSV, the cache entry);
 * tune_main.c runs them in order. */
#ifndef MG_TUNE_H
#define MG_TUNE_H

#include <stddef.h>

#include "gen/lua_host.h"
#include "tune_gpu.h"
#include "tune_nvrtc.h"

enum { TM_OK = 0, TM_FAIL = 1, TM_USAGE = 2 };
#define TM_MAX_LIST 32
#define TM_MAX_GARGS 32   /* ints in the generic candidate's struct tune_dims */

typedef struct {
    const char *spec, *templates, *cache_dir, *csv, *emit_dir, *arch, *cuda_include;
    const char *chunks, *threads, *lanes; /* lists as given (checked), passed to Lua */
    int seqlens[TM_MAX_LIST], nseqlens, batches[TM_MAX_LIST], nbatches;
    int iters, warmup, device, jobs, quiet, compile_only, no_cache, print_key, no_sequential, no_generic;
} tm_opts;

typedef struct {
    char id[48], file[96];
    int chunked, chunk, threads, channels, blocks;
    int generic;       /* the generic baseline (mode "generic"; chunked too): never chosen */
    int smem;          /* dynamic shared memory per block: Mamba-3, and the
                        * Mamba-1 generic's B/C stage; else 0 */
    const char *src;   /* the source text (owned by the Lua result) */
    tn_result cub;
    char *status;      /* NULL: fine so far; else why it was skipped */
    int compiled, verified;
    double err_g, err_s;
    double ms[TM_MAX_LIST * TM_MAX_LIST], min_ms[TM_MAX_LIST * TM_MAX_LIST];
    int timed[TM_MAX_LIST * TM_MAX_LIST];
} tm_cand;

typedef struct {
    char spec_name[128], arch[32], precision[16], target[16], key_spec[80], key_templates[80], generator[64];
    int E, N, R, XP, act_size, combine_threads, max_batch, max_seq_len;
    char model_arch[32];   /* "mamba1" | "mamba3_siso" */
    int m3, H, P, NP, off_x;   /* Mamba-3 SISO dims (m3 = 1) */
    double tol;
    char default_seqlens[256], default_batches[256];
    int gargs[TM_MAX_GARGS], ngargs;   /* the generic candidate's struct tune_dims */
    char generic_same_as[48];          /* the specialized candidate of its launch shape */
    tm_cand *cands;
    size_t ncands;
} tm_manifest;

/* ---- tune_manifest.c */

/* Reads the manifest of the Lua side's result R (files[0], `key value`
 * lines, mg/tune.lua) into M; the candidates' sources stay owned by R.
 * `skipped` lines are printed unless QUIET. 0, or -1 with *ERR set. */
int tm_read_manifest(const lh_result *r, tm_manifest *m, int quiet, char **err);
void tm_manifest_free(tm_manifest *m);

/* ---- tune_sweep.c */

/* Progress lines on stderr (none when QUIET): rewritten in place on a
 * terminal, one line each otherwise. */
void tm_progress_setup(int quiet);
void tm_progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
void tm_progress_end(void);

/* Replaces C's status with MSG (owned; NULL: "failed"). */
void tm_set_status(tm_cand *c, char *msg);

/* NVRTC compiles of every candidate for ARCH, JOBS in parallel. */
void tm_compile_all(tm_manifest *m, const char *arch, const char *include, int jobs);

/* On the GPU: every compiled candidate is loaded, verified against the f64
 * reference and timed at every shape of O. TM_OK, or TM_FAIL when the
 * inputs cannot be prepared. */
int tm_sweep(const tm_opts *o, tm_manifest *m);

/* The best verified chunked candidate (NULL: none timed at every shape) and
 * its *score; *best_seq: the best sequential one (Mamba-1), or NULL. */
const tm_cand *tm_choose_best(const tm_manifest *m, int nshapes, double *score, const tm_cand **best_seq);

/* ---- tune_report.c */

const char *tm_mode(const tm_cand *c);
/* The median-ms table per candidate and shape (stdout). */
void tm_print_table(const tm_opts *o, const tm_manifest *m, const tg_device *dev, const char *nvrtc,
                    const tm_cand *best);
/* Per shape, the fastest specialized chunked candidate against the generic. */
void tm_print_generic(const tm_opts *o, const tm_manifest *m);
int tm_write_csv(const char *path, const tm_manifest *m, const tg_device *dev, const tm_opts *o);
/* The best candidate as a cache entry, written atomically (doc/tuning.md). */
int tm_write_cache(const tm_opts *o, const tm_manifest *m, const tg_device *dev, const char *nvrtc,
                   const tm_cand *best, double score, const tm_cand *best_seq);

#endif
