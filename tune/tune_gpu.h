/* tune/tune_gpu.h: the GPU half of mamba-tune: the device, the scan's random
 * inputs, loading a candidate's cubin with the runtime API
 * (cudaLibraryLoadData / cudaLibraryGetKernel / cudaLaunchKernel: cudart
 * only, never libcuda), running it, checking it against the f64 reference
 * (Mamba-1: the scan mg_ref_m1_scan; Mamba-3 SISO: the SSM step recurrence
 * mg_ref_mamba3_ssm_step) and timing it (mg_bench_time: CUDA events after
 * warm-up, L2 flushed before every run). */
#ifndef MG_TUNE_GPU_H
#define MG_TUNE_GPU_H

#include <stddef.h>

typedef struct {
    char name[256];
    char cc[16];      /* "9.0" */
    char arch[16];    /* "sm_90" */
    char driver[16];  /* "13.0" */
    char runtime[16];
} tg_device;

/* Selects DEVICE and fills INFO. 0, or -1 with *ERR set (free it): no
 * driver, no device, or DEVICE out of range. */
int tg_open(int device, tg_device *info, char **err);

/* The model dimensions a scan needs (from the manifest). */
typedef struct {
    int E, N, R, XP;
    int act_size;        /* 4 (f32) or 2 (bf16 / f16) */
    int bf16;            /* 1: act is bf16, 0 with act_size 2: f16 */
    int combine_threads;
    double tol;          /* rel-L2 bound vs the f64 reference */
    /* Mamba-3 SISO (m3 = 1; R, XP, combine_threads unused): heads, headdim,
     * in_proj outputs per token and the column of x (v) in them */
    int m3, H, P, NP, off_x;
} tg_dims;

/* A candidate as the kernels need it. */
typedef struct {
    int chunked;   /* 0: tune_scan_seq; 1: tune_chunk_state/combine/output */
    int chunk;     /* timesteps per chunk (chunked) */
    int threads;   /* block size of the scan kernels */
    int blocks;    /* scan blocks per sequence (grid.y); Mamba-3: H (grid.x) */
    int smem;      /* dynamic shared memory per block (bytes): Mamba-3, and the
                    * Mamba-1 generic's B/C stage (its scan kernels); else 0 */
    int m3;        /* 1: the Mamba-3 chunked SSM kernel (tune_m3_chunked) */
    /* The generic variant (args != NULL): its kernels take one more, last,
     * argument, struct tune_dims of NARGS ints (the model dims), passed
     * from ARGS as they are (a struct of ints has the layout of int[]). */
    const int *args;
    int nargs;
} tg_cand;

typedef struct tg_data tg_data;

/* Device buffers for up to MAX_BATCH x MAX_SEQLEN tokens (cstate for chunks
 * of MIN_CHUNK), random inputs from SEED rounded to the storage dtype, and
 * the f64 reference output of the verification shape VBATCH x VSEQLEN
 * (<= the maxima). NULL with *ERR set on failure.
 * Mamba-3 (d->m3): q', k' [B][T][H][N], v (the x columns of an act_t
 * [B][T][NP] in_proj output), A*dt, dt, lambda [B][T][H] (f32), D [H], a
 * nonzero initial state (ssm, k_prev, v_prev); MIN_CHUNK is unused. */
tg_data *tg_data_new(const tg_dims *d, int max_batch, int max_seqlen, int min_chunk, int vbatch, int vseqlen,
                     unsigned long long seed, char **err);
void tg_data_free(tg_data *t);

typedef struct tg_kernels tg_kernels;

/* Loads a cubin and finds the candidate's kernels. NULL with *ERR set. */
tg_kernels *tg_load(const void *cubin, const tg_cand *c, char **err);
void tg_unload(tg_kernels *k);

/* Runs the candidate on the verification shape and compares the gated
 * output g (Mamba-3: the SSM output y) and the final state (Mamba-3: ssm,
 * k_prev and v_prev) with the reference; the outputs are NaN-poisoned
 * first, so one not written fails. 0 and the errors
 * (relative L2) when both are finite and within the tolerance; 1 when the
 * results are wrong (message in *ERR); -1 when a CUDA call failed. */
int tg_verify(tg_data *t, tg_kernels *k, const tg_cand *c, double *err_g, double *err_s, char **err);

/* Times the candidate at BATCH x SEQLEN: WARMUP untimed runs, then ITERS
 * runs between CUDA events, each after an L2 flush. 0 with the median and
 * minimum in ms, or -1 with *ERR set. */
int tg_time(tg_data *t, tg_kernels *k, const tg_cand *c, int batch, int seqlen, int warmup, int iters,
            double *median_ms, double *min_ms, char **err);

/* 1 if the CUDA context still works after a failure (a launch that was
 * refused), 0 if it is lost (an illegal access poisons the context: no
 * later candidate can run in this process). */
int tg_context_ok(void);

#endif
