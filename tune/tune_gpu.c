/* tune/tune_gpu.c: the GPU half of mamba-tune (see tune_gpu.h). The kernels
 * come from a cubin loaded through the runtime API's library functions, so
 * the program links cudart and NVRTC only. Inputs are drawn in f32, rounded
 * to the storage dtype on the host, and the reference runs on the rounded
 * values: the only error left is the kernel's own arithmetic and the
 * rounding of the stored output. Mamba-1 (the scan's kernels) first, then
 * the Mamba-3 SISO section (the chunked SSM kernel, tg_m3_*); the public
 * functions dispatch on tg_dims.m3. */
#include "gen/xstr.h"
#include "templates/kernels/mamba1/tune_args.h"
#include "templates/kernels/mamba3/tune_args.h"
#include "tune_gpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "mg_bench.h"
#include "mg_compare.h"
#include "mg_cuda.h"
#include "mg_ref_mamba1.h"
#include "mg_ref_mamba3.h"
#include "mg_rng.h"

/* Frees the host buffers of one step, NULL ones included (the step's
 * allocations are checked together, so any of them may have failed):
 * TG_FREE(a, b, c). */
static void tg_free_all(void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(p[i]);
}
#define TG_FREE(...)                                                                                                   \
    tg_free_all((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

static int tg_cuda_fail(cudaError_t e, const char *what, char **err)
{
    *err = xstr_printf("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int tg_open(int device, tg_device *info, char **err)
{
    memset(info, 0, sizeof *info);
    *err = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return tg_cuda_fail(e, "no CUDA device: cudaGetDeviceCount", err);
    if (device < 0 || device >= n) {
        *err = xstr_printf("device %d does not exist (%d device%s)", device, n, n == 1 ? "" : "s");
        return -1;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaFree(0)) != cudaSuccess)
        return tg_cuda_fail(e, "cannot use the CUDA device", err);
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess)
        return tg_cuda_fail(e, "cudaGetDeviceProperties", err);
    snprintf(info->name, sizeof info->name, "%s", p.name);
    snprintf(info->cc, sizeof info->cc, "%d.%d", p.major, p.minor);
    snprintf(info->arch, sizeof info->arch, "sm_%d%d", p.major, p.minor);
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0)
        snprintf(info->driver, sizeof info->driver, "%d.%d", v / 1000, (v % 1000) / 10);
    if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0)
        snprintf(info->runtime, sizeof info->runtime, "%d.%d", v / 1000, (v % 1000) / 10);
    return 0;
}

/* ------------------------------------------------------------------ dtype */

static uint16_t tg_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float tg_from_bf16(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> f16, round to nearest even; inputs here are small normal values
 * or tiny ones (flushed to signed zero below the f16 normal range). */
static uint16_t tg_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int ex = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (ex <= 0)
        return (uint16_t)sign;
    if (ex >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t m = mant + 0xfffu + ((mant >> 13) & 1u);
    if (m & 0x800000u) {
        m = 0;
        ex++;
    }
    return (uint16_t)(sign | ((uint32_t)ex << 10) | (m >> 13));
}

static float tg_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (ex == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (ex == 31)
        u = sign | 0x7f800000u | (m << 13);
    else
        u = sign | ((ex - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rounds X[0..n) to the storage dtype in place and writes the stored bytes
 * into OUT (n * act_size bytes). */
static void tg_round(const tg_dims *d, float *x, size_t n, void *out)
{
    if (d->act_size == 4) {
        memcpy(out, x, n * 4);
        return;
    }
    uint16_t *o = out;
    for (size_t i = 0; i < n; i++) {
        o[i] = d->bf16 ? tg_to_bf16(x[i]) : tg_to_f16(x[i]);
        x[i] = d->bf16 ? tg_from_bf16(o[i]) : tg_from_f16(o[i]);
    }
}

static void tg_unround(const tg_dims *d, const void *in, float *x, size_t n)
{
    if (d->act_size == 4) {
        memcpy(x, in, n * 4);
        return;
    }
    const uint16_t *h = in;
    for (size_t i = 0; i < n; i++)
        x[i] = d->bf16 ? tg_from_bf16(h[i]) : tg_from_f16(h[i]);
}

/* ------------------------------------------------------------------ data */

struct tg_data {
    tg_dims d;
    int max_batch, max_seqlen, vbatch, vseqlen;
    size_t cstate_floats, dsum_floats;
    /* device */
    void *xc, *dt, *dbl, *xz, *g;        /* act_t */
    float *dt_bias, *A_log, *Dskip, *state_in, *state_out, *cstate, *dsum;
    /* the reference of the verification shape */
    double *g_ref, *s_ref;
    /* Mamba-3 (d.m3): inputs, state in/out, output y (g, g_ref: unused) */
    void *proj;                                       /* act_t [rows][NP] */
    float *k, *q, *mdt, *adt, *lam, *mD, *kp_in, *vp_in, *kp_out, *vp_out, *y;
    size_t ny_ref, ns_ref;                            /* y_ref: g_ref; state: s_ref */
};

void tg_data_free(tg_data *t)
{
    if (!t)
        return;
    void *bufs[] = {t->xc, t->dt, t->dbl, t->xz, t->g, t->dt_bias, t->A_log, t->Dskip, t->state_in, t->state_out,
                    t->cstate, t->dsum, t->proj, t->k, t->q, t->mdt, t->adt, t->lam, t->mD, t->kp_in, t->vp_in,
                    t->kp_out, t->vp_out, t->y};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i])
            cudaFree(bufs[i]);
    free(t->g_ref);
    free(t->s_ref);
    free(t);
}

static int tg_upload(void **dst, const void *src, size_t bytes, const char *what, char **err)
{
    cudaError_t e = cudaMalloc(dst, bytes ? bytes : 4);
    if (e != cudaSuccess) {
        *dst = NULL;
        *err = xstr_printf("cannot allocate %zu bytes on the GPU for %s: %s", bytes, what, cudaGetErrorString(e));
        return -1;
    }
    if (src && (e = cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
        return tg_cuda_fail(e, what, err);
    return 0;
}

static double tg_silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* The f64 reference of the verification shape from the rounded host inputs. */
static int tg_reference(tg_data *t, const float *xc, const float *dt, const float *dbl, const float *xz,
                        const float *dt_bias, const float *A_log, const float *Dskip, const float *state_in,
                        char **err)
{
    const tg_dims *d = &t->d;
    const int E = d->E, N = d->N, XP = d->XP, T = t->vseqlen;
    size_t te = (size_t)T * E;
    double *x64 = malloc(sizeof(double) * te), *delta = malloc(sizeof(double) * te),
           *bc = malloc(sizeof(double) * (size_t)T * XP), *A = malloc(sizeof(double) * (size_t)E * N),
           *Dp = malloc(sizeof(double) * (size_t)E), *y = malloc(sizeof(double) * te);
    t->g_ref = malloc(sizeof(double) * te * (size_t)t->vbatch);
    t->s_ref = malloc(sizeof(double) * (size_t)t->vbatch * E * N);
    int rc = 0;
    if (!x64 || !delta || !bc || !A || !Dp || !y || !t->g_ref || !t->s_ref) {
        *err = xstr_printf("out of host memory for the reference");
        rc = -1;
        goto out;
    }
    for (size_t i = 0; i < (size_t)E * N; i++)
        A[i] = -exp((double)A_log[i]);
    for (int e = 0; e < E; e++)
        Dp[e] = Dskip[e];
    for (int b = 0; b < t->vbatch; b++) {
        size_t r0 = (size_t)b * T;
        for (size_t i = 0; i < (size_t)T; i++) {
            for (int e = 0; e < E; e++) {
                x64[i * E + e] = xc[(r0 + i) * E + e];
                delta[i * E + e] = mg_ref_softplus((double)dt[(r0 + i) * E + e] + (double)dt_bias[e]);
            }
            for (int k = 0; k < XP; k++)
                bc[i * XP + k] = dbl[(r0 + i) * XP + k];
        }
        double *s = t->s_ref + (size_t)b * E * N;
        for (size_t i = 0; i < (size_t)E * N; i++)
            s[i] = state_in[(size_t)b * E * N + i];
        mg_ref_m1_scan(T, E, N, x64, delta, A, bc + d->R, bc + d->R + N, XP, Dp, s, y, NULL);
        for (size_t i = 0; i < (size_t)T; i++)
            for (int e = 0; e < E; e++)
                t->g_ref[(r0 + i) * E + e] = y[i * E + e] * tg_silu((double)xz[(r0 + i) * 2 * E + E + e]);
    }
out:
    TG_FREE(x64, delta, bc, A, Dp, y);
    return rc;
}

/* A tg_data with its sizes set and nothing allocated yet; NULL (and *err)
 * when out of host memory. Both archs' constructors start from it. */
static tg_data *tg_data_alloc(const tg_dims *d, int max_batch, int max_seqlen, int vbatch, int vseqlen,
                              char **err)
{
    tg_data *t = calloc(1, sizeof *t);
    if (!t) {
        *err = xstr_printf("out of host memory");
        return NULL;
    }
    t->d = *d;
    t->max_batch = max_batch;
    t->max_seqlen = max_seqlen;
    t->vbatch = vbatch;
    t->vseqlen = vseqlen;
    return t;
}

static tg_data *tg_m3_data_new(const tg_dims *d, int max_batch, int max_seqlen, int vbatch, int vseqlen,
                               unsigned long long seed, char **err);

tg_data *tg_data_new(const tg_dims *d, int max_batch, int max_seqlen, int min_chunk, int vbatch, int vseqlen,
                     unsigned long long seed, char **err)
{
    *err = NULL;
    if (d->m3)
        return tg_m3_data_new(d, max_batch, max_seqlen, vbatch, vseqlen, seed, err);
    tg_data *t = tg_data_alloc(d, max_batch, max_seqlen, vbatch, vseqlen, err);
    if (!t)
        return NULL;
    const size_t E = (size_t)d->E, N = (size_t)d->N, XP = (size_t)d->XP, as = (size_t)d->act_size;
    const size_t rows = (size_t)max_batch * (size_t)max_seqlen;
    const size_t max_nc = ((size_t)max_seqlen + (size_t)min_chunk - 1) / (size_t)min_chunk;
    t->cstate_floats = (size_t)max_batch * max_nc * E * N;
    t->dsum_floats = (size_t)max_batch * max_nc * E;

    float *xc = malloc(sizeof(float) * rows * E), *dt = malloc(sizeof(float) * rows * E),
          *dbl = malloc(sizeof(float) * rows * XP), *xz = malloc(sizeof(float) * rows * 2 * E),
          *dt_bias = malloc(sizeof(float) * E), *A_log = malloc(sizeof(float) * E * N),
          *Dskip = malloc(sizeof(float) * E), *state = malloc(sizeof(float) * (size_t)max_batch * E * N);
    void *stage = malloc(as * rows * 2 * E > 4 * rows * XP ? as * rows * 2 * E : 4 * rows * XP);
    int ok = xc && dt && dbl && xz && dt_bias && A_log && Dskip && state && stage;
    if (!ok)
        *err = xstr_printf("out of host memory for %zu tokens of inputs", rows);
    if (ok) {
        /* dt_proj.bias: softplus^-1 of a step in [1e-3, 1e-1] (Mamba's init);
         * A_log = log(1..N); D near 1; states and activations uniform. */
        mg_rng r;
        mg_rng_seed(&r, seed);
        mg_rng_fill_uniform(&r, xc, rows * E, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, dt, rows * E, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, dbl, rows * XP, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, xz, rows * 2 * E, -2.0f, 2.0f);
        for (size_t e = 0; e < E; e++) {
            double step = exp(log(1e-3) + mg_rng_uniform(&r) * (log(1e-1) - log(1e-3)));
            dt_bias[e] = (float)log(expm1(step));
            Dskip[e] = (float)(0.5 + mg_rng_uniform(&r));
            for (size_t n = 0; n < N; n++)
                A_log[e * N + n] = (float)log((double)(n + 1));
        }
        mg_rng_fill_uniform(&r, state, (size_t)max_batch * E * N, -0.5f, 0.5f);
        /* round the act_t inputs and upload each */
        struct { float *h; size_t n; void **dst; const char *what; } acts[] = {
            {xc, rows * E, &t->xc, "xc"}, {dt, rows * E, &t->dt, "dt"},
            {dbl, rows * XP, &t->dbl, "x_proj output"}, {xz, rows * 2 * E, &t->xz, "xz"},
        };
        for (size_t i = 0; ok && i < sizeof acts / sizeof *acts; i++) {
            tg_round(d, acts[i].h, acts[i].n, stage);
            ok = tg_upload(acts[i].dst, stage, acts[i].n * as, acts[i].what, err) == 0;
        }
        ok = ok && tg_upload((void **)&t->dt_bias, dt_bias, sizeof(float) * E, "dt_bias", err) == 0;
        ok = ok && tg_upload((void **)&t->A_log, A_log, sizeof(float) * E * N, "A_log", err) == 0;
        ok = ok && tg_upload((void **)&t->Dskip, Dskip, sizeof(float) * E, "D", err) == 0;
        ok = ok && tg_upload((void **)&t->state_in, state, sizeof(float) * (size_t)max_batch * E * N, "state", err) == 0;
        ok = ok && tg_upload((void **)&t->state_out, NULL, sizeof(float) * (size_t)max_batch * E * N, "state", err) == 0;
        ok = ok && tg_upload(&t->g, NULL, as * rows * E, "g", err) == 0;
        ok = ok && tg_upload((void **)&t->cstate, NULL, sizeof(float) * t->cstate_floats, "chunk states", err) == 0;
        ok = ok && tg_upload((void **)&t->dsum, NULL, sizeof(float) * t->dsum_floats, "chunk sums", err) == 0;
        ok = ok && tg_reference(t, xc, dt, dbl, xz, dt_bias, A_log, Dskip, state, err) == 0;
    }
    TG_FREE(xc, dt, dbl, xz, dt_bias, A_log, Dskip, state, stage);
    if (!ok) {
        tg_data_free(t);
        return NULL;
    }
    return t;
}

/* ------------------------------------------------------------------ kernels */

struct tg_kernels {
    cudaLibrary_t lib;
    cudaKernel_t seq, state, combine, output;
    cudaKernel_t m3;   /* Mamba-3: tune_m3_chunked */
};

tg_kernels *tg_load(const void *cubin, const tg_cand *c, char **err)
{
    *err = NULL;
    tg_kernels *k = calloc(1, sizeof *k);
    if (!k) {
        *err = xstr_printf("out of host memory");
        return NULL;
    }
    cudaError_t e = cudaLibraryLoadData(&k->lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
        tg_cuda_fail(e, "cudaLibraryLoadData", err);
        free(k);
        return NULL;
    }
    const int m3 = c->m3;
    struct { cudaKernel_t *k; const char *name; int need; } ks[] = {
        {&k->seq, "tune_scan_seq", !m3 && !c->chunked},
        {&k->state, "tune_chunk_state", !m3 && c->chunked},
        {&k->combine, "tune_chunk_combine", !m3 && c->chunked},
        {&k->output, "tune_chunk_output", !m3 && c->chunked},
        {&k->m3, "tune_m3_chunked", m3},
    };
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        if (!ks[i].need)
            continue;
        if ((e = cudaLibraryGetKernel(ks[i].k, k->lib, ks[i].name)) != cudaSuccess) {
            *err = xstr_printf("cudaLibraryGetKernel(%s): %s", ks[i].name, cudaGetErrorString(e));
            tg_unload(k);
            return NULL;
        }
    }
    /* Mamba-3: the chunked kernel's dynamic shared memory is over the 48 KiB
     * default; cudaFuncSetAttribute takes a cudaKernel_t as is. */
    if (m3 && (e = cudaFuncSetAttribute((const void *)k->m3, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        c->smem)) != cudaSuccess) {
        *err = xstr_printf("cudaFuncSetAttribute(tune_m3_chunked, %d bytes of dynamic shared memory): %s", c->smem,
                           cudaGetErrorString(e));
        tg_unload(k);
        return NULL;
    }
    return k;
}

void tg_unload(tg_kernels *k)
{
    if (!k)
        return;
    if (k->lib)
        cudaLibraryUnload(k->lib);
    free(k);
}

static dim3 dim3_make(unsigned x, unsigned y, unsigned z)
{
    dim3 d;
    d.x = x;
    d.y = y;
    d.z = z;
    return d;
}

/* A parameter of a candidate kernel (templates/kernels/mamba1/tune_args.h,
 * kernels/mamba3/tune_args.h) as tg_launch's argument: launch values are its locals,
 * buffers the fields of tg_data of the same name. */
#define TG_ARG_I(name) &name
#define TG_ARG_CA(name) &t->name
#define TG_ARG_O(name) &t->name
#define TG_ARG_CF(name) &t->name
#define TG_ARG_F(name) &t->name
#define TG_ARG_CFA(name) &t->name
#define TG_ARG_FA(name) &t->name
#define TG_ARG_FIRST(kind, name) TG_ARG_##kind(name)
#define TG_ARG_NEXT(kind, name) , TG_ARG_##kind(name)

/* Enqueues one scan of BATCH x SEQLEN on STREAM. */
static cudaError_t tg_launch(tg_data *t, tg_kernels *k, const tg_cand *c, int batch, int seqlen,
                             cudaStream_t stream, const char **what)
{
    const tg_dims *d = &t->d;
    /* the generic variant's last kernel argument (see tg_cand) */
    void *gargs = (void *)c->args;
    if (d->m3) {
        /* scan_chunked_kernel's launch: grid (H, batch), CK_THREADS, CK_SMEM_BYTES */
        *what = "tune_m3_chunked";
        /* (the last entry: the generic's struct tune_dims; a specialized
         * kernel has one parameter less and never reads it) */
        void *args[] = {MG_M3_TUNE_CHUNKED_PARAMS(TG_ARG_FIRST, TG_ARG_NEXT), gargs};
        return cudaLaunchKernel((const void *)k->m3, dim3_make((unsigned)d->H, (unsigned)batch, 1),
                                dim3_make((unsigned)c->threads, 1, 1), args, (size_t)c->smem, stream);
    }
    if (!c->chunked) {
        *what = "tune_scan_seq";
        void *args[] = {MG_M1_TUNE_SEQ_PARAMS(TG_ARG_FIRST, TG_ARG_NEXT), gargs};
        return cudaLaunchKernel((const void *)k->seq, dim3_make((unsigned)batch, (unsigned)c->blocks, 1), dim3_make((unsigned)c->threads, 1, 1),
                                args, 0, stream);
    }
    int nc = (seqlen + c->chunk - 1) / c->chunk;
    cudaError_t e;
    if (nc > 1) {
        *what = "tune_chunk_state";
        void *a1[] = {MG_M1_TUNE_STATE_PARAMS(TG_ARG_FIRST, TG_ARG_NEXT), gargs};
        e = cudaLaunchKernel((const void *)k->state, dim3_make((unsigned)batch, (unsigned)c->blocks, (unsigned)(nc - 1)),
                             dim3_make((unsigned)c->threads, 1, 1), a1, (size_t)c->smem, stream);
        if (e != cudaSuccess)
            return e;
    }
    *what = "tune_chunk_combine";
    size_t n = (size_t)batch * d->E * d->N;
    void *a2[] = {MG_M1_TUNE_COMBINE_PARAMS(TG_ARG_FIRST, TG_ARG_NEXT), gargs};
    e = cudaLaunchKernel((const void *)k->combine,
                         dim3_make((unsigned)((n + (size_t)d->combine_threads - 1) / (size_t)d->combine_threads), 1, 1),
                         dim3_make((unsigned)d->combine_threads, 1, 1), a2, 0, stream);
    if (e != cudaSuccess)
        return e;
    *what = "tune_chunk_output";
    void *a3[] = {MG_M1_TUNE_OUTPUT_PARAMS(TG_ARG_FIRST, TG_ARG_NEXT), gargs};
    return cudaLaunchKernel((const void *)k->output, dim3_make((unsigned)batch, (unsigned)c->blocks, (unsigned)nc), dim3_make((unsigned)c->threads, 1, 1),
                            a3, (size_t)c->smem, stream);
}

/* Shape checks that would otherwise be launch errors or overruns. */
static int tg_shape_ok(tg_data *t, const tg_cand *c, int batch, int seqlen, char **err)
{
    if (batch < 1 || seqlen < 1 || batch > t->max_batch || seqlen > t->max_seqlen) {
        *err = xstr_printf("shape %dx%d outside the allocated %dx%d", batch, seqlen, t->max_batch, t->max_seqlen);
        return 0;
    }
    if (c->chunked && !t->d.m3) {
        size_t nc = ((size_t)seqlen + (size_t)c->chunk - 1) / (size_t)c->chunk;
        if (nc > 65535) {
            *err = xstr_printf("%zu chunks exceed the grid limit 65535", nc);
            return 0;
        }
        if ((size_t)batch * nc * (size_t)t->d.E * (size_t)t->d.N > t->cstate_floats) {
            *err = xstr_printf("chunk %d below the smallest chunk the buffers were sized for", c->chunk);
            return 0;
        }
    }
    return 1;
}

int tg_context_ok(void)
{
    cudaError_t e = cudaDeviceSynchronize();
    (void)cudaGetLastError();
    return e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

static int tg_m3_verify(tg_data *t, tg_kernels *k, const tg_cand *c, double *err_g, double *err_s, char **err);

/* Runs candidate c once at B x T and waits for it: 0, or -1 with *err. */
static int tg_run_once(tg_data *t, tg_kernels *k, const tg_cand *c, int B, int T, char **err)
{
    const char *what = "";
    cudaError_t e = tg_launch(t, k, c, B, T, 0, &what);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return tg_cuda_fail(e, what, err);
    return 0;
}

/* The verdict of a verify run at B x T: the output (n floats, called `name`
 * in the message) and the final states (ns floats) against the reference.
 * *err_g, *err_s: their rel-L2 (INFINITY with non-finite values); 1 with
 * *err when either is over the tolerance (`nonfinite` appended when a value
 * is not finite), else 0. */
static int tg_judge(const tg_data *t, int B, int T, const char *name, const float *out, size_t n, const float *s,
                    size_t ns, const char *nonfinite, double *err_g, double *err_s, char **err)
{
    mg_err eo = mg_compare_f32(out, t->g_ref, n), es = mg_compare_f32(s, t->s_ref, ns);
    *err_g = eo.n_nonfinite ? INFINITY : eo.rel_l2;
    *err_s = es.n_nonfinite ? INFINITY : es.rel_l2;
    if (mg_err_ok(&eo, t->d.tol) && mg_err_ok(&es, t->d.tol))
        return 0;
    *err = xstr_printf("wrong result at %dx%d: rel-L2 %s %.3g, final state %.3g (tolerance %.3g)%s", B, T, name, *err_g,
                       *err_s, t->d.tol, eo.n_nonfinite || es.n_nonfinite ? nonfinite : "");
    return 1;
}

int tg_verify(tg_data *t, tg_kernels *k, const tg_cand *c, double *err_g, double *err_s, char **err)
{
    *err = NULL;
    *err_g = *err_s = INFINITY;
    if (t->d.m3)
        return tg_m3_verify(t, k, c, err_g, err_s, err);
    const int B = t->vbatch, T = t->vseqlen, E = t->d.E, N = t->d.N;
    if (!tg_shape_ok(t, c, B, T, err))
        return 1;
    const size_t ng = (size_t)B * T * E, ns = (size_t)B * E * N, as = (size_t)t->d.act_size;
    /* poison the outputs so a kernel that writes nothing cannot pass */
    cudaError_t e = cudaMemset(t->g, 0xff, ng * as);
    if (e == cudaSuccess)
        e = cudaMemset(t->state_out, 0xff, ns * sizeof(float));
    if (e != cudaSuccess)
        return tg_cuda_fail(e, "cudaMemset", err);
    if (tg_run_once(t, k, c, B, T, err) != 0)
        return -1;
    void *hg = malloc(ng * as);
    float *g = malloc(ng * sizeof(float)), *s = malloc(ns * sizeof(float));
    if (!hg || !g || !s) {
        TG_FREE(hg, g, s);
        *err = xstr_printf("out of host memory");
        return -1;
    }
    e = cudaMemcpy(hg, t->g, ng * as, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(s, t->state_out, ns * sizeof(float), cudaMemcpyDeviceToHost);
    int rc = 0;
    if (e != cudaSuccess) {
        rc = tg_cuda_fail(e, "cudaMemcpy", err);
    } else {
        tg_unround(&t->d, hg, g, ng);
        rc = tg_judge(t, B, T, "g", g, ng, s, ns, ", non-finite values", err_g, err_s, err);
    }
    TG_FREE(hg, g, s);
    return rc;
}

typedef struct {
    tg_data *t;
    tg_kernels *k;
    const tg_cand *c;
    int batch, seqlen;
} tg_run_ctx;

static mg_status tg_run_fn(void *p, cudaStream_t stream)
{
    tg_run_ctx *r = p;
    const char *what = "";
    cudaError_t e = tg_launch(r->t, r->k, r->c, r->batch, r->seqlen, stream, &what);
    return mg_cuda_check(e, what);
}

int tg_time(tg_data *t, tg_kernels *k, const tg_cand *c, int batch, int seqlen, int warmup, int iters,
            double *median_ms, double *min_ms, char **err)
{
    *err = NULL;
    if (!tg_shape_ok(t, c, batch, seqlen, err))
        return -1;
    tg_run_ctx r = {t, k, c, batch, seqlen};
    mg_bench_opts o = {warmup, iters, 1, 0};
    mg_bench_stats st;
    mg_status s = mg_bench_time(0, tg_run_fn, &r, &o, &st);
    if (s != MG_OK) {
        *err = xstr_printf("%s", mg_last_error());
        return -1;
    }
    *median_ms = st.median_ms;
    *min_ms = st.min_ms;
    return 0;
}

/* ================================================================== Mamba-3
 * The chunked SSM kernel (templates/mamba3/tune_scan.cu.tmpl): per-token
 * inputs as the model's prep and angle kernels leave them (q', k' f32
 * [B][T][H][N]; A*dt, dt, lambda f32 [B][T][H]), v = the x columns of the
 * act_t in_proj output [B][T][NP] (the other columns are zeros: the kernel
 * reads only x, with the model's row stride), a nonzero initial state. The
 * reference is mg_ref_mamba3_ssm_step (f64 step recurrence) on the same
 * values (v rounded to the storage dtype first). Ranges: q', k', v, k_prev,
 * v_prev U(-1, 1) (q' and k' are BCNorm'd, biased and rotated in the model:
 * entries of order 1); dt log-uniform in [1e-3, 1e-1] (softplus of the
 * Mamba dt init); A = -exp(U(log 0.1, log 2)) (A = -max(act(dd_A), floor));
 * lambda U(0.05, 0.95) (a sigmoid); D U(0.5, 1.5); ssm U(-0.5, 0.5). */

/* The f64 reference of the verification shape: y into g_ref, and the final
 * ssm | k_prev | v_prev into s_ref. */
static int tg_m3_reference(tg_data *t, const float *q, const float *k, const float *v, const float *adt,
                           const float *dt, const float *lam, const float *D, const float *ssm0, const float *kp0,
                           const float *vp0, char **err)
{
    const tg_dims *d = &t->d;
    const size_t B = (size_t)t->vbatch, T = (size_t)t->vseqlen, H = (size_t)d->H, P = (size_t)d->P,
                 N = (size_t)d->N;
    const size_t nkq = B * T * H * N, nv = B * T * H * P, nh = B * T * H;
    const size_t nss = B * H * P * N, nkp = B * H * N, nvp = B * H * P;
    double *q64 = malloc(sizeof(double) * nkq), *k64 = malloc(sizeof(double) * nkq),
           *v64 = malloc(sizeof(double) * nv), *a64 = malloc(sizeof(double) * nh),
           *dt64 = malloc(sizeof(double) * nh), *l64 = malloc(sizeof(double) * nh), *D64 = malloc(sizeof(double) * H);
    t->ny_ref = nv;
    t->ns_ref = nss + nkp + nvp;
    t->g_ref = malloc(sizeof(double) * nv);
    t->s_ref = malloc(sizeof(double) * t->ns_ref);
    int rc = 0;
    if (!q64 || !k64 || !v64 || !a64 || !dt64 || !l64 || !D64 || !t->g_ref || !t->s_ref) {
        *err = xstr_printf("out of host memory for the reference");
        rc = -1;
        goto out;
    }
    /* the kernel at VBATCH x VSEQLEN reads rows b * VSEQLEN + i (and states
     * b * H + h): the first B*T rows (B states) of the inputs, which is what
     * the reference reads as [B][T] too */
    for (size_t i = 0; i < nkq; i++) {
        q64[i] = q[i];
        k64[i] = k[i];
    }
    for (size_t r = 0; r < B * T; r++)
        for (size_t e = 0; e < H * P; e++)
            v64[r * H * P + e] = v[r * (size_t)d->NP + (size_t)d->off_x + e];
    for (size_t i = 0; i < nh; i++) {
        a64[i] = adt[i];
        dt64[i] = dt[i];
        l64[i] = lam[i];
    }
    for (size_t h = 0; h < H; h++)
        D64[h] = D[h];
    double *ssm = t->s_ref, *kp = t->s_ref + nss, *vp = t->s_ref + nss + nkp;
    for (size_t i = 0; i < nss; i++)
        ssm[i] = ssm0[i];
    for (size_t i = 0; i < nkp; i++)
        kp[i] = kp0[i];
    for (size_t i = 0; i < nvp; i++)
        vp[i] = vp0[i];
    mg_m3_ssm_args a = {(int)B, (int)T, (int)H, (int)P, (int)N, q64, k64, v64, a64, dt64, l64, D64,
                        t->g_ref, ssm, kp, vp};
    if (mg_ref_mamba3_ssm_step(&a) != MG_OK) {
        *err = xstr_printf("the f64 reference failed: %s", mg_last_error());
        rc = -1;
    }
out:
    TG_FREE(q64, k64, v64, a64, dt64, l64, D64);
    return rc;
}

static tg_data *tg_m3_data_new(const tg_dims *d, int max_batch, int max_seqlen, int vbatch, int vseqlen,
                               unsigned long long seed, char **err)
{
    tg_data *t = tg_data_alloc(d, max_batch, max_seqlen, vbatch, vseqlen, err);
    if (!t)
        return NULL;
    const size_t H = (size_t)d->H, P = (size_t)d->P, N = (size_t)d->N, NP = (size_t)d->NP, as = (size_t)d->act_size;
    const size_t rows = (size_t)max_batch * (size_t)max_seqlen;
    const size_t nkq = rows * H * N, nh = rows * H, nss = (size_t)max_batch * H * P * N,
                 nkp = (size_t)max_batch * H * N, nvp = (size_t)max_batch * H * P;
    float *q = malloc(sizeof(float) * nkq), *k = malloc(sizeof(float) * nkq), *proj = calloc(rows * NP, sizeof(float)),
          *vtmp = malloc(sizeof(float) * rows * H * P), *adt = malloc(sizeof(float) * nh),
          *dt = malloc(sizeof(float) * nh), *lam = malloc(sizeof(float) * nh), *D = malloc(sizeof(float) * H),
          *ssm = malloc(sizeof(float) * nss), *kp = malloc(sizeof(float) * nkp), *vp = malloc(sizeof(float) * nvp);
    void *stage = malloc(as * rows * NP);
    int ok = q && k && proj && vtmp && adt && dt && lam && D && ssm && kp && vp && stage;
    if (!ok)
        *err = xstr_printf("out of host memory for %zu tokens of inputs", rows);
    if (ok) {
        mg_rng r;
        mg_rng_seed(&r, seed);
        mg_rng_fill_uniform(&r, q, nkq, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, k, nkq, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, vtmp, rows * H * P, -1.0f, 1.0f);
        for (size_t i = 0; i < rows; i++)
            memcpy(proj + i * NP + (size_t)d->off_x, vtmp + i * H * P, sizeof(float) * H * P);
        for (size_t i = 0; i < nh; i++) {
            double step = exp(log(1e-3) + mg_rng_uniform(&r) * (log(1e-1) - log(1e-3)));
            double A = -exp(log(0.1) + mg_rng_uniform(&r) * (log(2.0) - log(0.1)));
            dt[i] = (float)step;
            adt[i] = (float)(A * (double)dt[i]);
            lam[i] = (float)(0.05 + 0.9 * mg_rng_uniform(&r));
        }
        for (size_t h = 0; h < H; h++)
            D[h] = (float)(0.5 + mg_rng_uniform(&r));
        mg_rng_fill_uniform(&r, ssm, nss, -0.5f, 0.5f);
        mg_rng_fill_uniform(&r, kp, nkp, -1.0f, 1.0f);
        mg_rng_fill_uniform(&r, vp, nvp, -1.0f, 1.0f);
        tg_round(d, proj, rows * NP, stage);   /* v in the storage dtype; the reference reads it back */
        ok = tg_upload(&t->proj, stage, as * rows * NP, "in_proj output (v)", err) == 0;
        struct { float **dst; const float *h; size_t n; const char *what; } fs[] = {
            {&t->q, q, nkq, "q'"}, {&t->k, k, nkq, "k'"}, {&t->adt, adt, nh, "A*dt"}, {&t->mdt, dt, nh, "dt"},
            {&t->lam, lam, nh, "lambda"}, {&t->mD, D, H, "D"}, {&t->state_in, ssm, nss, "ssm state"},
            {&t->kp_in, kp, nkp, "k_prev"}, {&t->vp_in, vp, nvp, "v_prev"},
            {&t->state_out, NULL, nss, "ssm state out"}, {&t->kp_out, NULL, nkp, "k_prev out"},
            {&t->vp_out, NULL, nvp, "v_prev out"}, {&t->y, NULL, rows * H * P, "y"},
        };
        for (size_t i = 0; ok && i < sizeof fs / sizeof *fs; i++)
            ok = tg_upload((void **)fs[i].dst, fs[i].h, sizeof(float) * fs[i].n, fs[i].what, err) == 0;
        /* the verification shape's rows are the first vbatch * vseqlen rows
         * of every [rows][...] input (the kernel indexes b * seqlen + t) */
        ok = ok && tg_m3_reference(t, q, k, proj, adt, dt, lam, D, ssm, kp, vp, err) == 0;
    }
    TG_FREE(q, k, proj, vtmp, adt, dt, lam, D, ssm, kp, vp, stage);
    if (!ok) {
        tg_data_free(t);
        return NULL;
    }
    return t;
}

static int tg_m3_verify(tg_data *t, tg_kernels *k, const tg_cand *c, double *err_g, double *err_s, char **err)
{
    const int B = t->vbatch, T = t->vseqlen;
    if (!tg_shape_ok(t, c, B, T, err))
        return 1;
    const size_t H = (size_t)t->d.H, P = (size_t)t->d.P, N = (size_t)t->d.N;
    const size_t ny = t->ny_ref, nss = (size_t)B * H * P * N, nkp = (size_t)B * H * N, nvp = (size_t)B * H * P;
    /* poison every output (NaN) so a kernel that writes nothing cannot pass */
    cudaError_t e = cudaMemset(t->y, 0xff, ny * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemset(t->state_out, 0xff, nss * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemset(t->kp_out, 0xff, nkp * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemset(t->vp_out, 0xff, nvp * sizeof(float));
    if (e != cudaSuccess)
        return tg_cuda_fail(e, "cudaMemset", err);
    if (tg_run_once(t, k, c, B, T, err) != 0)
        return -1;
    float *y = malloc(ny * sizeof(float)), *s = malloc(t->ns_ref * sizeof(float));
    if (!y || !s) {
        TG_FREE(y, s);
        *err = xstr_printf("out of host memory");
        return -1;
    }
    e = cudaMemcpy(y, t->y, ny * sizeof(float), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(s, t->state_out, nss * sizeof(float), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(s + nss, t->kp_out, nkp * sizeof(float), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(s + nss + nkp, t->vp_out, nvp * sizeof(float), cudaMemcpyDeviceToHost);
    int rc = 0;
    if (e != cudaSuccess) {
        rc = tg_cuda_fail(e, "cudaMemcpy", err);
    } else {
        rc = tg_judge(t, B, T, "y", y, ny, s, t->ns_ref, ", non-finite values (an output not written?)", err_g, err_s,
                      err);
    }
    TG_FREE(y, s);
    return rc;
}
