/* mg_bench.c: event timing with L2 flushes, and the device ceilings (see
 * mg_bench.h). Plain C over cudart and cuBLAS. */
#include "mg_bench.h"
#include "mg_cuda.h"
#include "mg_rng.h"

#include <stdlib.h>
#include <string.h>
#include <cublas_v2.h>
#include <cuda_profiler_api.h>

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A flush buffer twice the L2 size, allocated once per process (it is
 * freed at exit by the driver; benches are short-lived programs). */
static mg_status bench_flush(cudaStream_t stream)
{
    static void *buf;
    static size_t bytes;
    if (!buf) {
        int dev = 0, l2 = 0;
        MG_CUDA(cudaGetDevice(&dev));
        MG_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
        mg_status s = mg_dev_alloc(&buf, bytes, "L2 flush buffer");
        if (s != MG_OK)
            return s;
    }
    MG_CUDA(cudaMemsetAsync(buf, 0x5a, bytes, stream));
    return MG_OK;
}

static void bench_summarize(double *ms, int n, mg_bench_stats *out)
{
    qsort(ms, (size_t)n, sizeof *ms, bench_cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += ms[i];
    out->iters = n;
    out->min_ms = ms[0];
    out->max_ms = ms[n - 1];
    out->mean_ms = sum / n;
    out->median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    /* nearest rank: the smallest time that at least 99% of the runs met */
    int r = (99 * n + 99) / 100;
    out->p99_ms = ms[(r < 1 ? 1 : r) - 1];
}

typedef struct { cudaGraphExec_t g; } bench_graph_ctx;

static mg_status bench_graph_fn(void *ctx, cudaStream_t stream)
{
    MG_CUDA(cudaGraphLaunch(((bench_graph_ctx *)ctx)->g, stream));
    return MG_OK;
}

mg_status mg_bench_time(cudaStream_t stream, mg_bench_fn fn, void *ctx,
                        const mg_bench_opts *opts, mg_bench_stats *out)
{
    if (!fn || !out)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_bench_time: fn and out are required");
    int warmup = opts && opts->warmup > 0 ? opts->warmup : 3;
    int iters = opts && opts->iters > 0 ? opts->iters : 20;
    int flush = opts ? opts->flush_l2 : 1;
    const int profile = opts && opts->profile;
    if (profile)   /* one run, nothing else in the capture range */
        iters = 1, flush = 0;
    mg_status s = MG_OK;
    for (int i = 0; i < warmup && s == MG_OK; i++)
        s = fn(ctx, stream);
    if (s != MG_OK)
        return s;
    MG_CUDA(cudaStreamSynchronize(stream));
    double *ms = malloc(sizeof *ms * (size_t)iters);
    if (!ms)
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mg_bench_time: out of host memory");
    cudaEvent_t a = NULL, b = NULL;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b);
    if (profile && e == cudaSuccess)
        e = cudaProfilerStart();
    for (int i = 0; i < iters && e == cudaSuccess && s == MG_OK; i++) {
        if (flush && (s = bench_flush(stream)) != MG_OK)
            break;
        e = cudaEventRecord(a, stream);
        if (e == cudaSuccess && (s = fn(ctx, stream)) == MG_OK)
            e = cudaEventRecord(b, stream);
        if (e == cudaSuccess && s == MG_OK)
            e = cudaEventSynchronize(b);
        float t = 0;
        if (e == cudaSuccess && s == MG_OK)
            e = cudaEventElapsedTime(&t, a, b);
        ms[i] = t;
    }
    if (profile) {
        const cudaError_t e2 = cudaProfilerStop();
        if (e == cudaSuccess)
            e = e2;
    }
    if (a)
        cudaEventDestroy(a);
    if (b)
        cudaEventDestroy(b);
    if (s == MG_OK && e != cudaSuccess)
        s = mg_cuda_check(e, "mg_bench_time");
    if (s == MG_OK)
        bench_summarize(ms, iters, out);
    free(ms);
    return s;
}

mg_status mg_bench_time_graph(cudaStream_t stream, cudaGraphExec_t g,
                              const mg_bench_opts *opts, mg_bench_stats *out)
{
    bench_graph_ctx c = {g};
    return mg_bench_time(stream, bench_graph_fn, &c, opts, out);
}

/* ---- ceilings ---- */

typedef struct { void *dst; const void *src; size_t bytes; } bench_copy_ctx;

static mg_status bench_copy_fn(void *ctx, cudaStream_t stream)
{
    bench_copy_ctx *c = ctx;
    MG_CUDA(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream));
    return MG_OK;
}

typedef struct { mg_blas *blas; int n; mg_dtype t; void *a, *b, *c; } bench_gemm_ctx;

static mg_status bench_gemm_fn(void *ctx, cudaStream_t stream)
{
    bench_gemm_ctx *g = ctx;
    (void)stream;
    return mg_linear(g->blas, g->n, g->n, g->n, g->t, g->a, g->n, g->b, g->n,
                     MG_F32, g->c, g->n, 1.0f, 0.0f);
}

/* Random f32 values converted on the host to the storage type (never
 * zeros: GEMMs on zeros run faster than on real data). */
static mg_status bench_fill_random(void *d, size_t n, mg_dtype t, uint64_t seed)
{
    size_t es = mg_dtype_size(t);
    unsigned char *h = malloc(n * es);
    float *f = malloc(n * sizeof *f);
    if (!h || !f) {
        free(h);
        free(f);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    }
    mg_rng r;
    mg_rng_seed(&r, seed);
    mg_rng_fill_uniform(&r, f, n, -1.0f, 1.0f);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        if (t == MG_F32) {
            memcpy(h + 4 * i, &u, 4);
        } else if (t == MG_BF16) {
            uint16_t v = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            memcpy(h + 2 * i, &v, 2);
        } else { /* f16: values in [-1, 1] are normal or zero; round to nearest */
            uint32_t sign = (u >> 16) & 0x8000u;
            int ex = (int)((u >> 23) & 0xff) - 127 + 15;
            uint32_t mant = u & 0x7fffffu;
            uint16_t v;
            if (ex <= 0) {
                v = (uint16_t)sign;
            } else {
                uint32_t m = mant + 0xfffu + ((mant >> 13) & 1u);
                if (m & 0x800000u) { m = 0; ex++; }
                v = (uint16_t)(sign | ((uint32_t)ex << 10) | (m >> 13));
            }
            memcpy(h + 2 * i, &v, 2);
        }
    }
    cudaError_t e = cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice);
    free(h);
    free(f);
    return mg_cuda_check(e, "bench: upload random data");
}

static mg_status bench_gemm_rate(mg_blas *blas, int n, mg_dtype t, double *tflops)
{
    size_t es = mg_dtype_size(t), nn = (size_t)n * n;
    bench_gemm_ctx g = {blas, n, t, NULL, NULL, NULL};
    mg_status s = mg_dev_alloc(&g.a, nn * es, "bench GEMM A");
    if (s == MG_OK)
        s = mg_dev_alloc(&g.b, nn * es, "bench GEMM B");
    if (s == MG_OK)
        s = mg_dev_alloc(&g.c, nn * 4, "bench GEMM C");
    if (s == MG_OK)
        s = bench_fill_random(g.a, nn, t, 1);
    if (s == MG_OK)
        s = bench_fill_random(g.b, nn, t, 2);
    mg_bench_stats st;
    mg_bench_opts o = {3, 10, 0, 0};
    if (s == MG_OK)
        s = mg_bench_time(0, bench_gemm_fn, &g, &o, &st);
    if (s == MG_OK)
        *tflops = 2.0 * n * (double)n * n / (st.median_ms * 1e-3) / 1e12;
    mg_dev_free(g.a);
    mg_dev_free(g.b);
    mg_dev_free(g.c);
    return s;
}

mg_status mg_bench_ceilings(mg_ceilings *c)
{
    if (!c)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_bench_ceilings: c is NULL");
    memset(c, 0, sizeof *c);
    if (mg_device_count() == 0)
        return mg_fail(MG_ERR_NO_DEVICE, "mg_bench_ceilings: no CUDA device");
    struct cudaDeviceProp p;
    int dev = 0;
    MG_CUDA(cudaGetDevice(&dev));
    MG_CUDA(cudaGetDeviceProperties(&p, dev));
    snprintf(c->device, sizeof c->device, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor,
             p.multiProcessorCount);
    snprintf(c->gpu, sizeof c->gpu, "%s", p.name);
    MG_CUDA(cudaDriverGetVersion(&c->driver_version));
    MG_CUDA(cudaRuntimeGetVersion(&c->runtime_version));

    /* Copy: 2 GiB each way, far beyond L2; count bytes read plus written. */
    bench_copy_ctx cp = {NULL, NULL, (size_t)1 << 31};
    void *src = NULL;
    mg_status s = mg_dev_alloc(&src, cp.bytes, "bench copy source");
    if (s == MG_OK)
        s = mg_dev_alloc(&cp.dst, cp.bytes, "bench copy destination");
    if (s == MG_OK)
        s = mg_cuda_check(cudaMemset(src, 0x3c, cp.bytes), "bench copy fill");
    cp.src = src;
    mg_bench_stats st;
    mg_bench_opts o = {2, 10, 0, 0};
    if (s == MG_OK)
        s = mg_bench_time(0, bench_copy_fn, &cp, &o, &st);
    if (s == MG_OK)
        c->copy_gbps = 2.0 * (double)cp.bytes / (st.median_ms * 1e-3) / 1e9;
    mg_dev_free(src);
    mg_dev_free(cp.dst);
    if (s != MG_OK)
        return s;

    mg_blas *blas = NULL;
    s = mg_blas_create(&blas, 0);
    if (s == MG_OK)
        s = bench_gemm_rate(blas, 8192, MG_BF16, &c->bf16_tflops);
    if (s == MG_OK)
        s = bench_gemm_rate(blas, 4096, MG_F32, &c->f32_tflops);
    if (s == MG_OK)
        s = mg_blas_set_tf32(blas, 1);
    if (s == MG_OK)
        s = bench_gemm_rate(blas, 8192, MG_F32, &c->tf32_tflops);
    mg_blas_destroy(blas);
    return s;
}

void mg_bench_print_ceilings(FILE *f, const mg_ceilings *c)
{
    fprintf(f, "device: %s, driver CUDA %d.%d, runtime %d.%d\n", c->device, c->driver_version / 1000,
            c->driver_version % 1000 / 10, c->runtime_version / 1000, c->runtime_version % 1000 / 10);
    fprintf(f, "ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s, f32 GEMM %.1f TFLOP/s, "
               "f32 GEMM on TF32 %.0f TFLOP/s\n",
            c->copy_gbps, c->bf16_tflops, c->f32_tflops, c->tf32_tflops);
}
