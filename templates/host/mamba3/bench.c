// NAME_bench.c: the benchmark program of a Mamba-3 SISO library. Times on
// the GPU with CUDA events (warm-up first, L2 flushed between runs, median
// of many runs; runtime/mg_bench.h) and reports each figure against the
// ceilings this GPU measures for itself (device copy bandwidth, cuBLAS GEMM
// rate), as a table on stdout and CSV rows (--csv FILE):
//   - the SSM core alone: from the in_proj output (q/k sources B and C, v,
//     dt, A, trap, angles, z) to the gated y, without the in/out
//     projections: prep + angles + scan + gate, for the spec's scan
//     (chunked and sequential when the library has the chunked kernel), and
//     each of its kernels alone;
//   - the whole model forward (prefill) and decode steps (eager and as a
//     CUDA Graph);
//   - with training: forward_train + backward, and the whole training step
//     (+ MSE loss + AdamW) eager and as a CUDA Graph.
//
//   ./NAME_bench [--csv FILE] [--iters N]
//
// Cost model (per token, from the generator's mg/cost.lua; model_alias.h
// has the figures of this model): GEMM flops, other flops, bytes moved;
// weights read per call; SSM core (one layer) flops (chunked form and
// sequential) and bytes.
// Reference (brief.md): the official Mamba-3 SISO Triton kernel, bf16, batch 8,
// seqlen 4096, 32 heads, headdim 64, d_state 128, chunk 64, on an H200: SSM
// forward 0.96 ms, forward + backward 4.30 ms (specs/mamba3_perf.yaml has
// those shapes). With training, the SSM core forward for training + backward
// ("ssm core fwd+bwd" rows) is the op that the 4.30 ms times.
// The library is named through model_alias.h (model_X = NAME_X, MODEL_X =
// NAME_X).
#define MODEL_INTERNAL 1   /* the kernel launchers, to time the SSM core alone */
#include "model_alias.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mg_bench.h>
#include <mg_cuda.h>
#include <mg_ref_mamba3.h>
#include <mg_rng.h>

#define NP_DIM  MODEL_IN_PROJ_DIM
#define N_HEADS MODEL_N_HEADS
#define D_STATE MODEL_D_STATE
#define D_INNER MODEL_D_INNER
#define WHAT_WIDTH 26   /* the first column of the table */

typedef struct {
    model_model *m;
    int batch, seqlen;
    const float *u;
    float *out, *ssm, *kp, *vp, *ang;
} bench_ctx;

#include "bench_util.h"

static mg_status run_prefill(void *p, cudaStream_t stream)
{
    bench_ctx *c = p;
    (void)stream;
    return model_prefill(c->m, c->batch, c->seqlen, c->u, c->out, c->ssm, c->kp, c->vp, c->ang);
}

static mg_status run_decode(void *p, cudaStream_t stream)
{
    bench_ctx *c = p;
    (void)stream;
    return model_decode_step(c->m, c->batch, c->u, c->out, c->ssm, c->kp, c->vp, c->ang);
}

#if MODEL_TRAINING
static mg_status run_train(void *p, cudaStream_t stream)
{
    train_ctx *x = p;
    (void)stream;
    return model_train_step_mse(x->t, x->w, x->grads, x->m, x->v, &x->p, x->c.batch, x->c.seqlen,
                                     x->c.u, x->target, NULL, NULL, NULL, NULL, x->loss);
}

/* forward_train + backward: the model's forward and backward without the
 * loss and the optimizer (the figure to set beside a forward+backward). */
static mg_status run_fwd_bwd(void *p, cudaStream_t stream)
{
    train_ctx *x = p;
    (void)stream;
    mg_status s = model_forward_train(x->t, x->w, x->c.batch, x->c.seqlen, x->c.u, x->c.out,
                                    NULL, NULL, NULL, NULL);
    if (s != MG_OK) return s;
    return model_backward(x->t, x->dout, x->grads, NULL, NULL, NULL, NULL, NULL);
}
#endif

/* The SSM core of layer 0 on a random in_proj output. parts: bit 0 prep,
 * 1 angles, 2 scan, 3 gate, 4 the fused kernel (all four, chunked: what
 * prefill runs when the library has it); chunked selects the scan kernel. */
typedef struct {
    int batch, seqlen, parts, chunked, nseg;
    void *seg_ws;   /* the fused kernel's segment workspace (nseg > 1) */
    const void *proj;
    const float *dt_bias, *Bnw, *Cnw, *Bb, *Cb, *Dsk, *ngw;
    float *dt, *adt, *lam, *k, *q, *y, *ssm, *kp, *vp, *ang;
    void *g;
} core_ctx;

static mg_status run_core(void *p, cudaStream_t st)
{
    core_ctx *c = p;
    const int tokens = c->batch * c->seqlen;
    if (c->parts & 1)
        MG_CUDA(model_launch_prep(tokens, c->proj, c->dt_bias, c->Bnw, c->Cnw, c->Bb, c->Cb, c->dt, c->adt,
                           c->lam, c->k, c->q, st));
    if (c->parts & 2)
        MG_CUDA(model_launch_angles(c->batch, c->seqlen, c->proj, c->dt, c->ang, c->ang, c->k, c->q, NULL, NULL, st));
    if (c->parts & 4) {
#if MODEL_HAS_CHUNKED_SCAN
        if (c->chunked)
            MG_CUDA(model_launch_scan_chunked(c->batch, c->seqlen, c->proj, c->k, c->q, c->dt, c->adt, c->lam,
                                       c->Dsk, c->ssm, c->kp, c->vp, c->ssm, c->kp, c->vp, c->y, NULL, st));
        else
#endif
        MG_CUDA(model_launch_scan(c->batch, c->seqlen, c->proj, c->k, c->q, c->dt, c->adt, c->lam, c->Dsk,
                           c->ssm, c->kp, c->vp, c->ssm, c->kp, c->vp, c->y, NULL, NULL, st));
    }
    if (c->parts & 8)
        MG_CUDA(model_launch_gate(tokens, c->y, c->proj, c->ngw, c->g, st));
#if MODEL_HAS_FUSED_PREFILL
    if (c->parts & 16)
        MG_CUDA(model_launch_scan_fused(c->batch, c->seqlen, c->nseg, c->seg_ws, c->proj, c->dt_bias, c->Bnw, c->Cnw, c->Bb, c->Cb,
                                        c->Dsk, c->ngw, c->ssm, c->kp, c->vp, c->ang, c->ssm, c->kp, c->vp,
                                        c->ang, c->g, NULL, st));
#endif
    return MG_OK;
}

#if MODEL_TRAINING
/* The SSM core's forward for training and backward (the training
 * kernels of NAME_backward.cu): prep, angles, scan (saving
 * checkpoints), gate; then the gate, scan, angle and prep backward, from a
 * random gradient of the gated output to the in_proj-output gradient and
 * the per-token parameter-gradient rows. chunked: 1 the chunked forward and
 * backward (chunk MODEL_BWD_CHUNK), 0 the sequential ones. */
typedef struct {
    core_ctx *c;
    int chunked, parts;   /* parts: the kernels to run, BK_* bits (BK_ALL: the whole op) */
    float *rot, *rbc, *tnh, *ckpt, *dg, *dy, *dk, *dq, *dv, *dadt, *ddt, *dlam, *partD, *partgw, *gth, *gdtb, *gBn, *gCn;
    void *dproj;
} core_bwd_ctx;

enum { BK_PREP = 1, BK_ANGLES = 2, BK_SCAN = 4, BK_GATE = 8, BK_GATE_BWD = 16, BK_SCAN_BWD = 32,
       BK_ANGLES_BWD = 64, BK_PREP_BWD = 128, BK_ALL = 255 };

/* Bytes per token the kernels of `parts` move, by the cost model
 * (mg/cost.lua tcore_*): the chunked path's scan, angle and prep kernels
 * where chunked, else the sequential path's. */
static double core_bwd_bytes(int parts, int chunked)
{
    double b = 0.0;
    if (parts & BK_ANGLES) b += chunked ? MODEL_COST_TCORE_ANGLES_CK_BYTES_PER_TOKEN : MODEL_COST_TCORE_ANGLES_BYTES_PER_TOKEN;
    if (parts & BK_PREP) b += chunked ? MODEL_COST_TCORE_PREP_CK_BYTES_PER_TOKEN : MODEL_COST_TCORE_PREP_BYTES_PER_TOKEN;
    if (parts & BK_SCAN) b += chunked ? MODEL_COST_TCORE_FSCAN_CK_BYTES_PER_TOKEN : MODEL_COST_TCORE_FSCAN_SEQ_BYTES_PER_TOKEN;
    if (parts & BK_GATE) b += MODEL_COST_TCORE_GATE_BYTES_PER_TOKEN;
    if (parts & BK_GATE_BWD) b += MODEL_COST_TCORE_GATE_BWD_BYTES_PER_TOKEN;
    if (parts & BK_SCAN_BWD) b += chunked ? MODEL_COST_TCORE_BSCAN_CK_BYTES_PER_TOKEN : MODEL_COST_TCORE_BSCAN_SEQ_BYTES_PER_TOKEN;
    if (parts & BK_ANGLES_BWD)
        b += chunked ? MODEL_COST_TCORE_ANGLES_SUMS_BYTES_PER_TOKEN : MODEL_COST_TCORE_ANGLES_BWD_BYTES_PER_TOKEN;
    if (parts & BK_PREP_BWD) b += chunked ? MODEL_COST_TCORE_PREP_BWD_CK_BYTES_PER_TOKEN : MODEL_COST_TCORE_PREP_BWD_SEQ_BYTES_PER_TOKEN;
    return b;
}

static mg_status run_core_bwd(void *p, cudaStream_t st)
{
    core_bwd_ctx *x = p;
    core_ctx *c = x->c;
    const int tokens = c->batch * c->seqlen;
    /* As the trainer runs them: the chunked path's prep first (it writes
     * the scalars and the 1/rms of B, C only: its scans build k', q'), then
     * the angle table, whose walk reads prep's dt; the sequential path's
     * angle table first, then prep rotating k', q' by it. */
#if MODEL_HAS_CHUNKED_BWD
    if (x->chunked && (x->parts & BK_PREP))
        MG_CUDA(model_launch_prep_scalars_train(tokens, c->proj, c->dt_bias, c->dt, c->adt, c->lam, x->rbc,
                                                x->tnh, st));
    const float *walk_dt = x->chunked ? c->dt : NULL, *walk_tnh = x->chunked ? x->tnh : NULL;
#else
    const float *walk_dt = NULL, *walk_tnh = NULL;
#endif
    if (x->parts & BK_ANGLES)
        MG_CUDA(model_launch_angles_train(c->batch, c->seqlen, c->proj, c->dt_bias, walk_dt, walk_tnh, c->ang, NULL,
                                          x->rot, NULL, st));
    if (!walk_dt && (x->parts & BK_PREP))
        MG_CUDA(model_launch_prep_train(tokens, c->proj, c->dt_bias, c->Bnw, c->Cnw, c->Bb, c->Cb, x->rot, c->dt,
                            c->adt, c->lam, c->k, c->q, st));
    if (x->parts & BK_SCAN) {
#if MODEL_HAS_CHUNKED_BWD
        if (x->chunked)
            MG_CUDA(model_launch_scan_fwd_chunked(c->batch, c->seqlen, c->proj, x->rbc, x->rot, c->Bnw, c->Cnw, c->Bb,
                                            c->Cb, c->dt, c->adt, c->lam, c->Dsk, c->ssm, c->kp, c->vp, NULL, NULL,
                                            NULL, x->ckpt, c->y, NULL, st));
        else
#endif
        MG_CUDA(model_launch_scan_fwd(c->batch, c->seqlen, c->proj, c->k, c->q, c->dt, c->adt, c->lam, c->Dsk,
                                c->ssm, c->kp, c->vp, NULL, NULL, NULL, x->ckpt, c->y, NULL, st));
    }
    if (x->parts & BK_GATE)
        MG_CUDA(model_launch_gate_fwd(tokens, c->y, c->proj, c->ngw, c->g, st));
    if (x->parts & BK_GATE_BWD)
        MG_CUDA(model_launch_gate_bwd(tokens, c->y, c->proj, c->ngw, x->dg, c->g, x->dy, x->dproj, x->partgw, st));
    if (x->parts & BK_SCAN_BWD) {
#if MODEL_HAS_CHUNKED_BWD
        if (x->chunked)
            MG_CUDA(model_launch_scan_bwd_chunked(c->batch, c->seqlen, c->proj, x->rbc, x->rot, c->Bnw, c->Cnw, c->Bb,
                                            c->Cb, c->dt, c->adt, c->lam, c->Dsk, x->ckpt, c->kp, c->vp, x->dy,
                                            x->dk, x->dq, x->dproj,
                                            x->dadt, x->ddt, x->dlam, x->gth, x->partD, NULL, NULL, NULL, NULL,
                                            NULL, NULL, st));
        else
#endif
        MG_CUDA(model_launch_scan_bwd(c->batch, c->seqlen, c->proj, c->k, c->q, c->dt, c->adt, c->lam, c->Dsk,
                                x->ckpt, c->kp, c->vp, x->dy, x->dk, x->dq, x->dv, x->dadt, x->ddt, x->dlam,
                                x->partD, NULL, NULL, NULL, NULL, st));
    }
    if (x->parts & BK_ANGLES_BWD) {
        /* after the chunked backward, which did the rotary part itself,
         * the suffix sums only */
#if MODEL_HAS_CHUNKED_BWD
        if (x->chunked)
            MG_CUDA(model_launch_angles_bwd_sums(c->batch, c->seqlen, x->gth, NULL, NULL, st));
        else
#endif
        MG_CUDA(model_launch_angles_bwd(c->batch, c->seqlen, c->k, c->q, x->rot, x->dk, x->dq, x->gth, NULL, NULL, st));
    }
    if (x->parts & BK_PREP_BWD) {
#if MODEL_HAS_CHUNKED_BWD
        if (x->chunked)   /* dk, dq in the chunked backward's entry type */
            MG_CUDA(model_launch_prep_bwd_ck(tokens, c->proj, c->dt, c->lam, c->dt_bias, c->Bnw, c->Cnw, x->dk,
                                       x->dq, x->dadt, x->ddt, x->dlam, x->gth, x->dproj, x->gdtb, x->gBn,
                                       x->gCn, st));
        else
#endif
        MG_CUDA(model_launch_prep_bwd(tokens, c->proj, c->dt, c->lam, c->dt_bias, c->Bnw, c->Cnw, x->dk, x->dq,
                                x->dv, x->dadt, x->ddt, x->dlam, x->gth, x->dproj, x->gdtb, x->gBn, x->gCn, st));
    }
    return MG_OK;
}
#endif

static const float *param(const float *w, const char *pname)
{
    int i = model_param_index(pname);
    if (i < 0) { fprintf(stderr, MODEL_NAME "_bench: no parameter %s\n", pname); exit(1); }
    return w + model_params[i].offset;
}

int main(int argc, char **argv)
{
    int iters = 30;
    int rc = bench_start(argc, argv, &iters);
    if (rc >= 0) return rc;
    mg_status s;
    printf(MODEL_NAME ": mamba3_siso D=%d E=%d N=%d P=%d H=%d G=%d S=%d layers=%d "
           "precision=" MODEL_PRECISION_LABEL " scan=" MODEL_SCAN_MODE " chunk=%d (engine " MODEL_CK_ENGINE ")\n",
           MODEL_D_MODEL, MODEL_D_INNER, MODEL_D_STATE, MODEL_HEADDIM, MODEL_N_HEADS, MODEL_N_GROUPS,
           MODEL_N_ANGLES, MODEL_N_LAYERS, MODEL_CK_CHUNK);
    mg_bench_print_ceilings(stdout, &ceil_);
    printf("GEMM ceiling used: %.1f TFLOP/s (" MODEL_PRECISION_LABEL " storage)\n", gemm_ceiling_tflops);
    printf("reference: official Mamba-3 SISO Triton SSM, bf16 b=8 T=4096 H=32 P=64 N=128 chunk 64, H200: "
           "forward 0.96 ms, forward+backward 4.30 ms\n\n");

    /* Weights: the reference path's initialisation, uploaded once. */
    cudaStream_t stream;
    mg_m3_dims dims = MODEL_REF_DIMS;
    mg_m3_layout lay;
    memset(&lay, 0, sizeof lay);
    if ((s = mg_ref_mamba3_layout(&dims, &lay)) != MG_OK) die("layout", s);
    float *hw = hmalloc(lay.total), *w;
    if ((s = mg_ref_mamba3_init(&dims, &lay, hw, 1)) != MG_OK) die("init", s);
    model_model *m = bench_model(hw, lay.total, &w, &stream);
    printf("%-26s %5s %6s %10s %12s %9s %7s %8s %7s\n", "what", "batch", "seqlen", "ms", "tokens/s",
           "GB/s", "of copy", "TFLOP/s", "of GEMM");

    const int B = MODEL_MAX_BATCH, T = MODEL_MAX_SEQ_LEN;
    const size_t maxtok = (size_t)B * T;
    float *u = drandom(maxtok * MODEL_IN_DIM, 2, -1.0f, 1.0f);
    float *out = dalloc(sizeof(float) * maxtok * MODEL_D_MODEL);
    float *ssm = drandom(model_ssm_state_floats(B), 3, -0.5f, 0.5f);
    float *kp = drandom(model_k_prev_state_floats(B), 4, -0.5f, 0.5f);
    float *vp = drandom(model_v_prev_state_floats(B), 5, -0.5f, 0.5f);
    float *ang = drandom(model_angle_state_floats(B), 6, 0.0f, 6.28f);
    mg_bench_opts o = {3, iters, 1, 0};
    static const int prefill[][2] = MODEL_BENCH_PREFILL;   /* {batch, seqlen} of each prefill row */
    static const int decode[] = MODEL_BENCH_DECODE;        /* batch of each decode row */
    const size_t n_prefill = sizeof prefill / sizeof prefill[0];
    mg_bench_stats st;

    /* ---- The SSM core alone (layer 0's small weights, a random in_proj
     * output: every input in a realistic range, never zeros). ---- */
    {
        core_ctx c;
        memset(&c, 0, sizeof c);
        float *fproj = drandom(maxtok * NP_DIM, 7, -1.0f, 1.0f);
#if MODEL_LOWP
        void *proj = dalloc(maxtok * NP_DIM * MODEL_ACT_SIZE);
        if (model_launch_convert(fproj, proj, maxtok * NP_DIM, stream) != cudaSuccess ||
            cudaStreamSynchronize(stream) != cudaSuccess) die("convert proj", MG_ERR_CUDA);
        c.proj = proj;
#else
        c.proj = fproj;
#endif
        c.dt_bias = param(w, "layers.0.mixer.dt_bias");
        c.Bnw = param(w, "layers.0.mixer.B_norm.weight");
        c.Cnw = param(w, "layers.0.mixer.C_norm.weight");
        c.Bb = param(w, "layers.0.mixer.B_bias");
        c.Cb = param(w, "layers.0.mixer.C_bias");
        c.Dsk = param(w, "layers.0.mixer.D");
#if MODEL_OUTPROJ_NORM
        c.ngw = param(w, "layers.0.mixer.norm.weight");
#endif
        c.dt = dalloc(sizeof(float) * maxtok * N_HEADS);
        c.adt = dalloc(sizeof(float) * maxtok * N_HEADS);
        c.lam = dalloc(sizeof(float) * maxtok * N_HEADS);
        c.k = dalloc(sizeof(float) * maxtok * N_HEADS * D_STATE);
        c.q = dalloc(sizeof(float) * maxtok * N_HEADS * D_STATE);
        c.y = dalloc(sizeof(float) * maxtok * D_INNER);
        c.g = dalloc(MODEL_ACT_SIZE * maxtok * D_INNER);
        c.ssm = ssm; c.kp = kp; c.vp = vp; c.ang = ang;
#if MODEL_HAS_FUSED_PREFILL
        c.seg_ws = dalloc(MODEL_FUSED_SEG_WS_BYTES);
#endif
        static const int shapes[2][2] = { { MODEL_MAX_BATCH, MODEL_MAX_SEQ_LEN }, { 1, MODEL_MAX_SEQ_LEN } };
        for (int si = 0; si < (MODEL_MAX_BATCH > 1 ? 2 : 1); ++si) {
            c.batch = shapes[si][0];
            c.seqlen = shapes[si][1];
            /* the fused kernel's segments as prefill chooses them (NAME.c fused_segments) */
            c.nseg = MODEL_FUSED_MIN_BLOCKS * mg_device_sms() / (c.batch * N_HEADS);
            if (c.nseg < 2) c.nseg = 1;
            const double tok = (double)c.batch * c.seqlen;
            /* whole: the full op from proj to g (the "ssm core" rows, comparable
             * to the reference); the others are its kernels alone. */
            static const struct { const char *what; int parts, chunked, whole; } runs[] = {
#if MODEL_HAS_FUSED_PREFILL
                { "ssm core (chunked)", 16, 1, 1 },
                { "ssm core (chunked, split)", 15, 1, 1 },
#elif MODEL_HAS_CHUNKED_SCAN
                { "ssm core (chunked)", 15, 1, 1 },
#endif
#if MODEL_HAS_CHUNKED_SCAN
                { "ssm core (sequential)", 15, 0, 1 },
                { "  scan chunked", 4, 1, 0 },
#else
                { "ssm core (sequential)", 15, 0, 1 },
#endif
                { "  scan sequential", 4, 0, 0 },
                { "  prep", 1, 0, 0 },
                { "  angles", 2, 0, 0 },
                { "  gate", 8, 0, 0 },
            };
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; ++r) {
                c.parts = runs[r].parts;
                c.chunked = runs[r].chunked;
                if ((s = run_core(&c, stream)) != MG_OK) die(runs[r].what, s);   /* k, q valid for parts alone */
                if (!time_row(runs[r].what, c.batch, c.seqlen, stream, run_core, &c, &o, &st)) continue;
                /* flops: the whole op's, or the scan kernel's alone (prep,
                 * angles and the gate are memory passes: 0) */
                const double fl = runs[r].whole ? (c.chunked ? MODEL_COST_CORE_FLOPS_PER_TOKEN : MODEL_COST_CORE_SEQ_FLOPS_PER_TOKEN)
                                : (c.parts & 4) ? (c.chunked ? MODEL_COST_CORE_SCAN_FLOPS_PER_TOKEN
                                                             : MODEL_COST_CORE_SCAN_SEQ_FLOPS_PER_TOKEN) : 0.0;
                /* bytes: the fused kernel's minimum traffic, or the sum of
                 * the split kernels the row runs (parts: 1 prep, 2 angles,
                 * 4 scan, 8 gate) */
                const double by = c.parts == 16 ? MODEL_COST_CORE_BYTES_PER_TOKEN
                                : ((c.parts & 1) ? MODEL_COST_CORE_PREP_BYTES_PER_TOKEN : 0.0) +
                                  ((c.parts & 2) ? MODEL_COST_CORE_ANGLES_BYTES_PER_TOKEN : 0.0) +
                                  ((c.parts & 4) ? MODEL_COST_CORE_SCAN_BYTES_PER_TOKEN : 0.0) +
                                  ((c.parts & 8) ? MODEL_COST_CORE_GATE_BYTES_PER_TOKEN : 0.0);
                report(runs[r].what, c.batch, c.seqlen, &st, tok, tok * by, tok * fl);
            }
        }
#if MODEL_TRAINING
        /* forward for training + backward of the SSM core, the largest shape */
        {
            core_bwd_ctx x;
            memset(&x, 0, sizeof x);
            x.c = &c;
            c.batch = B;
            c.seqlen = T;
            const double tok = (double)B * T;
            x.rot = dalloc(sizeof(float) * maxtok * N_HEADS * MODEL_N_ANGLES);
            x.ckpt = dalloc(sizeof(float) * (size_t)B * N_HEADS * MODEL_MAX_CKPTS * MODEL_HEADDIM * D_STATE);
            x.dg = drandom(maxtok * D_INNER, 8, -1e-2f, 1e-2f);
            x.dy = dalloc(sizeof(float) * maxtok * D_INNER);
            x.dk = dalloc(sizeof(float) * maxtok * N_HEADS * D_STATE);
            x.dq = dalloc(sizeof(float) * maxtok * N_HEADS * D_STATE);
            x.dv = dalloc(sizeof(float) * maxtok * D_INNER);
            x.dadt = dalloc(sizeof(float) * maxtok * N_HEADS);
            x.ddt = dalloc(sizeof(float) * maxtok * N_HEADS);
            x.dlam = dalloc(sizeof(float) * maxtok * N_HEADS);
            x.partD = dalloc(sizeof(float) * B * N_HEADS);
            x.partgw = dalloc(sizeof(float) * ((maxtok + MODEL_NORMB_ROWS - 1) / MODEL_NORMB_ROWS) * D_INNER);
            x.gth = dalloc(sizeof(float) * maxtok * N_HEADS * MODEL_N_ANGLES);
            x.rbc = dalloc(sizeof(float) * maxtok * 2 * MODEL_N_GROUPS);
            x.tnh = dalloc(sizeof(float) * maxtok * MODEL_N_ANGLES);
            x.gdtb = dalloc(sizeof(float) * maxtok * N_HEADS);
            x.gBn = dalloc(sizeof(float) * maxtok * D_STATE);
            x.gCn = dalloc(sizeof(float) * maxtok * D_STATE);
            x.dproj = dalloc(MODEL_ACT_SIZE * maxtok * NP_DIM);
            /* the whole op, then its kernels alone (forward for training,
             * then backward, in launch order) */
            static const struct { const char *what; int chunked, parts; } runs[] = {
#if MODEL_HAS_CHUNKED_BWD
                { "ssm core fwd+bwd (chunked)", 1, BK_ALL },
                { "  fwd scan chunked", 1, BK_SCAN },
                { "  bwd scan chunked", 1, BK_SCAN_BWD },
                /* the chunked path's own prep, angle sums and prep backward
                 * (its angles and gates are the rows below, shared) */
                { "  fwd prep chunked", 1, BK_PREP },
                { "  bwd angle sums chunked", 1, BK_ANGLES_BWD },
                { "  bwd prep chunked", 1, BK_PREP_BWD },
#endif
                { "ssm core fwd+bwd (seq)", 0, BK_ALL },
                { "  fwd scan sequential", 0, BK_SCAN },
                { "  bwd scan sequential", 0, BK_SCAN_BWD },
                { "  fwd prep", 0, BK_PREP },
                { "  fwd angles", 0, BK_ANGLES },
                { "  fwd gate", 0, BK_GATE },
                { "  bwd gate", 0, BK_GATE_BWD },
                { "  bwd angles", 0, BK_ANGLES_BWD },
                { "  bwd prep", 0, BK_PREP_BWD },
            };
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; ++r) {
                x.chunked = runs[r].chunked;
                x.parts = BK_ALL;   /* everything valid (checkpoints of this scan) before timing parts alone */
                if ((s = run_core_bwd(&x, stream)) != MG_OK) die(runs[r].what, s);
                x.parts = runs[r].parts;
                if (time_row(runs[r].what, B, T, stream, run_core_bwd, &x, &o, &st))
                    report(runs[r].what, B, T, &st, tok, tok * core_bwd_bytes(runs[r].parts, runs[r].chunked), 0.0);
            }
            mg_dev_free(x.rot); mg_dev_free(x.ckpt); mg_dev_free(x.dg); mg_dev_free(x.dy); mg_dev_free(x.dk);
            mg_dev_free(x.dq); mg_dev_free(x.dv); mg_dev_free(x.dadt); mg_dev_free(x.ddt); mg_dev_free(x.dlam);
            mg_dev_free(x.partD); mg_dev_free(x.partgw); mg_dev_free(x.gth); mg_dev_free(x.gdtb);
            mg_dev_free(x.gBn); mg_dev_free(x.gCn); mg_dev_free(x.dproj); mg_dev_free(x.rbc); mg_dev_free(x.tnh);
        }
#endif
        mg_dev_free(fproj);
#if MODEL_LOWP
        mg_dev_free(proj);
#endif
        mg_dev_free(c.dt); mg_dev_free(c.adt); mg_dev_free(c.lam); mg_dev_free(c.k); mg_dev_free(c.q);
        mg_dev_free(c.y); mg_dev_free(c.g); mg_dev_free(c.seg_ws);
    }

    /* ---- Prefill: the largest batch, and sequence lengths up to the largest. ---- */
    for (size_t i = 0; i < n_prefill; ++i) {
        bench_ctx c = {m, prefill[i][0], prefill[i][1], u, out, ssm, kp, vp, ang};
        double tok = (double)c.batch * c.seqlen;
        if (time_row("prefill", c.batch, c.seqlen, stream, run_prefill, &c, &o, &st))
            report("prefill", c.batch, c.seqlen, &st, tok, WEIGHT_BYTES + tok * BYTES_PER_TOKEN,
                   tok * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
        /* the same call captured once as a CUDA Graph and replayed (states
         * advancing in place): what the launches of the eager call cost */
        model_graph *pg = NULL;
        /* (a capture the library refuses is reported, not fatal: the other rows still run) */
        if ((s = model_prefill_graph_create(m, c.batch, c.seqlen, u, out, ssm, kp, vp, ang, &pg)) != MG_OK)
            fprintf(stderr, MODEL_NAME "_bench: prefill graph b%d T%d: %s: %s (row skipped)\n", c.batch, c.seqlen,
                    mg_status_name(s), mg_last_error());
        else if (time_row("prefill (graph)", c.batch, c.seqlen, stream, run_graph, pg, &o, &st))
            report("prefill (graph)", c.batch, c.seqlen, &st, tok, WEIGHT_BYTES + tok * BYTES_PER_TOKEN,
                   tok * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
        model_decode_graph_destroy(pg);
    }

    /* ---- Decode: one token per stream, eager launches (latency bound). ---- */
    for (size_t i = 0; i < sizeof decode / sizeof decode[0]; ++i) {
        bench_ctx c = {m, decode[i], 1, u, out, ssm, kp, vp, ang};
        if (time_row("decode (eager)", c.batch, 1, stream, run_decode, &c, &o, &st))
            report_decode("decode (eager)", c.batch, &st);
        /* the same step captured once as a CUDA Graph and replayed */
        model_graph *g = NULL;
        if ((s = model_decode_graph_create(m, c.batch, u, out, ssm, kp, vp, ang, &g)) != MG_OK) die("graph", s);
        if (time_row("decode (graph)", c.batch, 1, stream, run_graph, g, &o, &st))
            report_decode("decode (graph)", c.batch, &st);
        model_decode_graph_destroy(g);
        /* the same with a reset mask (every other stream starts an episode) */
        uint8_t *mask = bench_reset_mask(c.batch);
        if ((s = model_decode_graph_create_reset(m, c.batch, u, out, ssm, kp, vp, ang, mask, &g)) != MG_OK)
            die("graph (reset mask)", s);
        if (time_row("decode (graph; mask)", c.batch, 1, stream, run_graph, g, &o, &st))
            report_decode("decode (graph; mask)", c.batch, &st);
        model_decode_graph_destroy(g);
        mg_dev_free(mask);
    }
    /* ---- The decode latency curve (graph replay, p50 / p99 per batch). ---- */
    {
        int lb[32];
        const int nl = latency_batches(lb, 32);
        mg_bench_opts ol = {10, LATENCY_ITERS, 1, 0};
        for (int i = 0; i < nl; ++i) {
            model_graph *g = NULL;
            if ((s = model_decode_graph_create(m, lb[i], u, out, ssm, kp, vp, ang, &g)) != MG_OK) die("graph", s);
            if (time_row("decode latency (graph)", lb[i], 1, stream, run_graph, g, &ol, &st))
                report_latency(lb[i], &st);
            model_decode_graph_destroy(g);
        }
    }

#if MODEL_TRAINING
    /* Training: forward_train + backward, and the whole step (+ MSE loss +
     * AdamW) eager and as a CUDA Graph, from a fresh state, on a copy of the
     * weights (the step updates them). */
    {
        train_ctx x;
        train_start(&x, stream, w, lay.total, B, T);
        x.dout = drandom((size_t)B * T * MODEL_D_MODEL, 6, -1e-3f, 1e-3f);
        for (size_t i = 0; i < n_prefill; ++i) {
            if (prefill[i][0] != MODEL_MAX_BATCH) continue;   /* the largest batch only */
            x.c.batch = prefill[i][0]; x.c.seqlen = prefill[i][1]; x.c.u = u; x.c.out = out;
            const double tok = (double)x.c.batch * x.c.seqlen;
            const double tby = MODEL_COST_TRAIN_WEIGHT_BYTES + tok * MODEL_COST_TRAIN_BYTES_PER_TOKEN;
            const double tfl = tok * MODEL_COST_TRAIN_FLOPS_PER_TOKEN;
            if (time_row("fwd_train + backward", x.c.batch, x.c.seqlen, stream, run_fwd_bwd, &x, &o, &st))
                report("fwd_train + backward", x.c.batch, x.c.seqlen, &st, tok, tby, tfl);
            if (time_row("train step", x.c.batch, x.c.seqlen, stream, run_train, &x, &o, &st))
                report("train step", x.c.batch, x.c.seqlen, &st, tok, tby, tfl);
            model_train_graph *tg = NULL;
            if ((s = model_train_graph_create(x.t, x.w, x.grads, x.m, x.v, &x.p, x.c.batch, x.c.seqlen, u,
                                            x.target, NULL, NULL, NULL, NULL, x.loss, &tg)) != MG_OK)
                die("train graph", s);
            if (time_row("train step (graph)", x.c.batch, x.c.seqlen, stream, run_train_graph, tg, &o, &st))
                report("train step (graph)", x.c.batch, x.c.seqlen, &st, tok, tby, tfl);
            model_train_graph_destroy(tg);
            /* the same with episode starts (trainer_set_starts): every
             * stream starts an episode at a mid-window token (stream b at
             * seqlen/2 + b % 4, inside the window); target: within 5% of
             * the row above */
            {
                const size_t nm = (size_t)x.c.batch * x.c.seqlen;
                uint8_t *hm = calloc(nm, 1), *dm = dalloc(nm);
                if (!hm) { fprintf(stderr, MODEL_NAME "_bench: out of host memory\n"); exit(1); }
                for (int b = 0; b < x.c.batch; ++b) {
                    int t = x.c.seqlen / 2 + b % 4;
                    if (t >= x.c.seqlen) t = x.c.seqlen - 1;
                    hm[(size_t)b * x.c.seqlen + t] = 1;
                }
                if (cudaMemcpy(dm, hm, nm, cudaMemcpyHostToDevice) != cudaSuccess) die("upload", MG_ERR_CUDA);
                free(hm);
                if ((s = model_trainer_set_starts(x.t, dm)) != MG_OK) die("trainer_set_starts", s);
                if ((s = model_train_graph_create(x.t, x.w, x.grads, x.m, x.v, &x.p, x.c.batch, x.c.seqlen, u,
                                                x.target, NULL, NULL, NULL, NULL, x.loss, &tg)) != MG_OK)
                    die("train graph (starts)", s);
                if (time_row("train step (graph; starts)", x.c.batch, x.c.seqlen, stream, run_train_graph, tg, &o, &st))
                    report("train step (graph; starts)", x.c.batch, x.c.seqlen, &st, tok, tby, tfl);
                model_train_graph_destroy(tg);
                if ((s = model_trainer_set_starts(x.t, NULL)) != MG_OK) die("trainer_set_starts", s);
                mg_dev_free(dm);
            }
        }
        train_end(&x);
    }
#endif

    model_destroy(m);
    mg_dev_free(w); mg_dev_free(u); mg_dev_free(out);
    mg_dev_free(ssm); mg_dev_free(kp); mg_dev_free(vp); mg_dev_free(ang);
    mg_ref_mamba3_layout_free(&lay);
    cudaStreamDestroy(stream);
    if (csv) fclose(csv);
    return 0;
}
