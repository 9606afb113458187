/* mg_bench.h: measuring generated kernels the same way everywhere: CUDA
 * events around each run after warm-up, L2 flushed between runs, the median
 * of many runs; and the device's own ceilings (copy bandwidth, bf16 GEMM
 * rate) measured in-process, so every figure can be quoted as a fraction
 * of what this GPU actually does. */
#ifndef MG_BENCH_H
#define MG_BENCH_H
#include <stdio.h>
#include <cuda_runtime_api.h>
#include "mg_status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue one run of the measured work on `stream`. */
typedef mg_status (*mg_bench_fn)(void *ctx, cudaStream_t stream);

typedef struct mg_bench_opts {
    int warmup;      /* untimed runs first (default 3 when 0) */
    int iters;       /* timed runs (default 20 when 0) */
    int flush_l2;    /* 1: overwrite a buffer twice the L2 size before each run */
    int profile;     /* 1: after the warm-up, ONE run (no flush) between cudaProfilerStart and
                      * cudaProfilerStop: a profiler started with its capture off
                      * (`ncu --profile-from-start off`) sees that run's kernels only */
} mg_bench_opts;

typedef struct mg_bench_stats {
    double median_ms, min_ms, mean_ms, max_ms;
    double p99_ms;   /* 99th percentile (nearest rank): the tail a latency budget must cover */
    int iters;
} mg_bench_stats;

/* Time fn on stream: each run between its own pair of events (the flush is
 * outside them), median over opts->iters runs (opts->profile: one run,
 * inside the profiler's capture range). */
mg_status mg_bench_time(cudaStream_t stream, mg_bench_fn fn, void *ctx,
                        const mg_bench_opts *opts, mg_bench_stats *out);

/* Time a whole CUDA graph's replay the same way. */
mg_status mg_bench_time_graph(cudaStream_t stream, cudaGraphExec_t g,
                              const mg_bench_opts *opts, mg_bench_stats *out);

typedef struct mg_ceilings {
    double copy_gbps;     /* device-to-device copy, bytes read + written per second / 1e9 */
    double bf16_tflops;   /* cuBLAS bf16 GEMM (f32 accumulate), 8192^3, random data */
    double f32_tflops;    /* cuBLAS f32 GEMM (no TF32), 4096^3 */
    double tf32_tflops;   /* cuBLAS f32 GEMM on TF32 tensor cores (mg_blas_set_tf32), 8192^3 */
    char device[320];     /* "NAME (sm_XY, N SMs)" */
    char gpu[256];        /* the device's name alone */
    int driver_version;   /* cudaDriverGetVersion: 1000*major + 10*minor */
    int runtime_version;  /* cudaRuntimeGetVersion, the same encoding */
} mg_ceilings;

/* Measure the ceilings once (about a second of GPU time). */
mg_status mg_bench_ceilings(mg_ceilings *c);

/* "1.23 ms" style helpers for tables. */
void mg_bench_print_ceilings(FILE *f, const mg_ceilings *c);

#ifdef __cplusplus
}
#endif
#endif
