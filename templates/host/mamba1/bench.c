// NAME_bench.c: the benchmark program of a Mamba-1 library. Times the
// generated pipeline (prefill; decode unfused, fused and as a CUDA Graph,
// single-launch eager and as a CUDA Graph when the library has it; the
// training step eager and as a CUDA Graph, and the graph again with episode
// starts, "train step (graph; starts)": every stream starts an episode at
// the window's middle token, the cost model's figures of the maskless
// step) on the GPU with CUDA events
// (warm-up first, L2 flushed between runs, median of many runs) and reports
// each figure against the ceilings this GPU measures for itself (device copy
// bandwidth, cuBLAS GEMM rate), as a table on stdout and as CSV rows
// (--csv FILE).
//
//   ./NAME_bench [--csv FILE] [--iters N]
//
// Cost model (per token, from the generator's mg/cost.lua; model_alias.h
// has the figures of this model): GEMM flops, other flops, bytes moved;
// weights read per call.
// The library is named through model_alias.h (model_X = NAME_X, MODEL_X =
// NAME_X).
#include "model_alias.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mg_bench.h>
#include <mg_cuda.h>
#include <mg_ref_mamba1.h>
#include <mg_rng.h>

#define WHAT_WIDTH 22   /* the first column of the table */

typedef struct {
    model_model *m;
    int batch, seqlen;
    const float *u;
    float *out, *cs, *ss;
} bench_ctx;

#include "bench_util.h"

static mg_status run_prefill(void *p, cudaStream_t stream)
{
    bench_ctx *c = p;
    (void)stream;
    return model_prefill(c->m, c->batch, c->seqlen, c->u, c->out, c->cs, c->ss);
}

static mg_status run_decode(void *p, cudaStream_t stream)
{
    bench_ctx *c = p;
    (void)stream;
    return model_decode_step(c->m, c->batch, c->u, c->out, c->cs, c->ss);
}

#if MODEL_TRAINING
static mg_status run_train(void *p, cudaStream_t stream)
{
    train_ctx *x = p;
    (void)stream;
    return model_train_step_mse(x->t, x->w, x->grads, x->m, x->v, &x->p, x->c.batch, x->c.seqlen,
                                     x->c.u, x->target, NULL, NULL, x->loss);
}
#endif

int main(int argc, char **argv)
{
    int iters = 30;
    int rc = bench_start(argc, argv, &iters);
    if (rc >= 0) return rc;
    mg_status s;
    printf(MODEL_NAME ": mamba1 D=%d E=%d N=%d layers=%d precision=" MODEL_PRECISION_LABEL "\n",
           MODEL_D_MODEL, MODEL_D_INNER, MODEL_D_STATE, MODEL_N_LAYERS);
    mg_bench_print_ceilings(stdout, &ceil_);
    printf("GEMM ceiling used: %.1f TFLOP/s (" MODEL_PRECISION_LABEL " storage)\n\n", gemm_ceiling_tflops);

    /* Weights: the reference path's initialisation, uploaded once. */
    cudaStream_t stream;
    mg_m1_dims dims = MODEL_REF_DIMS;
    mg_m1_layout lay;
    if ((s = mg_ref_mamba1_layout(&dims, &lay)) != MG_OK) die("layout", s);
    float *hw = hmalloc(lay.total), *w;
    if ((s = mg_ref_mamba1_init(&dims, &lay, hw, 1)) != MG_OK) die("init", s);
    model_model *m = bench_model(hw, lay.total, &w, &stream);
    printf("%-22s %5s %6s %10s %12s %9s %7s %8s %7s\n", "what", "batch", "seqlen", "ms", "tokens/s",
           "GB/s", "of copy", "TFLOP/s", "of GEMM");

    const int B = MODEL_MAX_BATCH, T = MODEL_MAX_SEQ_LEN;
    float *u = drandom((size_t)B * T * MODEL_IN_DIM, 2, -1.0f, 1.0f);
    float *out = dalloc(sizeof(float) * (size_t)B * T * MODEL_D_MODEL);
    float *cs = drandom(model_conv_state_floats(B), 3, -0.5f, 0.5f);
    float *ss = drandom(model_ssm_state_floats(B), 4, -0.5f, 0.5f);
    mg_bench_opts o = {3, iters, 1, 0};
    static const int prefill[][2] = MODEL_BENCH_PREFILL;   /* {batch, seqlen} of each prefill row */
    static const int decode[] = MODEL_BENCH_DECODE;        /* batch of each decode row */
    const size_t n_prefill = sizeof prefill / sizeof prefill[0];
    mg_bench_stats st;

    /* Prefill: the largest batch, and sequence lengths up to the largest. */
    for (size_t i = 0; i < n_prefill; ++i) {
        bench_ctx c = {m, prefill[i][0], prefill[i][1], u, out, cs, ss};
        double tok = (double)c.batch * c.seqlen;
        if (time_row("prefill", c.batch, c.seqlen, stream, run_prefill, &c, &o, &st))
            report("prefill", c.batch, c.seqlen, &st, tok, WEIGHT_BYTES + tok * BYTES_PER_TOKEN,
                   tok * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
        /* the same call captured once as a CUDA Graph and replayed (states
         * advancing in place): what the launches of the eager call cost */
        model_graph *pg = NULL;
        /* (a capture the library refuses is reported, not fatal: the other rows still run) */
        if ((s = model_prefill_graph_create(m, c.batch, c.seqlen, u, out, cs, ss, &pg)) != MG_OK)
            fprintf(stderr, MODEL_NAME "_bench: prefill graph b%d T%d: %s: %s (row skipped)\n", c.batch, c.seqlen,
                    mg_status_name(s), mg_last_error());
        else if (time_row("prefill (graph)", c.batch, c.seqlen, stream, run_graph, pg, &o, &st))
            report("prefill (graph)", c.batch, c.seqlen, &st, tok, WEIGHT_BYTES + tok * BYTES_PER_TOKEN,
                   tok * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
        model_decode_graph_destroy(pg);
#if MODEL_HAS_CONV_XPROJ
        /* the other conv + x_proj path of this shape (the fused kernel up to
         * MODEL_CONV_XPROJ_MAX_TOKENS tokens, conv + GEMM above): where the
         * default bound should sit */
        const int fused = tok <= MODEL_CONV_XPROJ_MAX_TOKENS;
        const char *alt = fused ? "prefill (graph; conv + x_proj GEMM)" : "prefill (graph; fused conv + x_proj)";
        pg = NULL;
        if ((s = model_set_conv_xproj(m, fused ? 0 : MODEL_MAX_BATCH * MODEL_MAX_SEQ_LEN)) == MG_OK &&
            (s = model_prefill_graph_create(m, c.batch, c.seqlen, u, out, cs, ss, &pg)) == MG_OK &&
            time_row(alt, c.batch, c.seqlen, stream, run_graph, pg, &o, &st))
            report(alt, c.batch, c.seqlen, &st, tok, WEIGHT_BYTES + tok * BYTES_PER_TOKEN,
                   tok * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
        else if (s != MG_OK)
            fprintf(stderr, MODEL_NAME "_bench: %s b%d T%d: %s: %s (row skipped)\n", alt, c.batch, c.seqlen,
                    mg_status_name(s), mg_last_error());
        model_decode_graph_destroy(pg);
        model_set_conv_xproj(m, -1);
#endif
    }

    /* Decode: one token per stream, eager launches (latency bound): the
     * unfused path (the prefill kernels with seqlen 1), then the fused
     * single-token path, eager and as a CUDA Graph, then (when the library
     * has it) the single-launch path, eager and as a CUDA Graph. */
    for (size_t i = 0; i < sizeof decode / sizeof decode[0]; ++i) {
        bench_ctx c = {m, decode[i], 1, u, out, cs, ss};
        if ((s = model_set_decode_fused(m, 0)) != MG_OK) die("set_decode_fused", s);
        if (time_row("decode (unfused)", c.batch, 1, stream, run_decode, &c, &o, &st))
            report_decode("decode (unfused)", c.batch, &st);
        if ((s = model_set_decode_fused(m, MODEL_DECODE_FUSED)) != MG_OK) die("set_decode_fused", s);
        if (time_row("decode (eager)", c.batch, 1, stream, run_decode, &c, &o, &st))
            report_decode("decode (eager)", c.batch, &st);
        /* The same step captured once as a CUDA Graph and replayed. */
        model_graph *g = NULL;
        if ((s = model_decode_graph_create(m, c.batch, u, out, cs, ss, &g)) != MG_OK) die("graph", s);
        if (time_row("decode (graph)", c.batch, 1, stream, run_graph, g, &o, &st))
            report_decode("decode (graph)", c.batch, &st);
        model_decode_graph_destroy(g);
        /* the same with a reset mask (every other stream starts an episode) */
        uint8_t *mask = bench_reset_mask(c.batch);
        if ((s = model_decode_graph_create_reset(m, c.batch, u, out, cs, ss, mask, &g)) != MG_OK)
            die("graph (reset mask)", s);
        if (time_row("decode (graph; mask)", c.batch, 1, stream, run_graph, g, &o, &st))
            report_decode("decode (graph; mask)", c.batch, &st);
        model_decode_graph_destroy(g);
        mg_dev_free(mask);
#if MODEL_HAS_DECODE_SINGLE
        /* The single-launch decode (one cluster kernel for the whole step),
         * eager and as a CUDA Graph. */
        if ((s = model_set_decode_fused(m, MODEL_DECODE_SINGLE)) != MG_OK) die("set_decode_fused", s);
        if (time_row("decode single (eager)", c.batch, 1, stream, run_decode, &c, &o, &st))
            report_decode("decode single (eager)", c.batch, &st);
        g = NULL;
        if ((s = model_decode_graph_create(m, c.batch, u, out, cs, ss, &g)) != MG_OK) die("graph single", s);
        if (time_row("decode single (graph)", c.batch, 1, stream, run_graph, g, &o, &st))
            report_decode("decode single (graph)", c.batch, &st);
        model_decode_graph_destroy(g);
#endif
        if ((s = model_set_decode_fused(m, MODEL_DECODE_DEFAULT)) != MG_OK) die("set_decode_fused", s);
    }
#if MODEL_HAS_DECODE_SINGLE
    /* The single-launch decode at the largest decode batch with each fixed
     * number of streams per cluster (set_decode_tile), beside the per-call
     * choice of the rows above: whether that choice is the fastest on this
     * GPU (its co-resident clusters decide it). */
    {
        const int bmax = decode[sizeof decode / sizeof decode[0] - 1];
        if ((s = model_set_decode_fused(m, MODEL_DECODE_SINGLE)) != MG_OK) die("set_decode_fused", s);
        for (int tile = 1; tile <= MODEL_DECODE_SINGLE_MAX_TILE; ++tile) {
            char what[48];
            snprintf(what, sizeof what, "decode single (graph; tile %d)", tile);
            if ((s = model_set_decode_tile(m, tile)) != MG_OK) die("set_decode_tile", s);
            model_graph *g = NULL;
            if ((s = model_decode_graph_create(m, bmax, u, out, cs, ss, &g)) != MG_OK) die("graph single", s);
            if (time_row(what, bmax, 1, stream, run_graph, g, &o, &st)) report_decode(what, bmax, &st);
            model_decode_graph_destroy(g);
        }
        if ((s = model_set_decode_tile(m, 0)) != MG_OK) die("set_decode_tile", s);
        if ((s = model_set_decode_fused(m, MODEL_DECODE_DEFAULT)) != MG_OK) die("set_decode_fused", s);
    }
#endif
    /* The decode latency curve: the library's default decode path (set
     * back above), graph replay, p50 / p99 per batch size. */
    {
        int lb[32];
        const int nl = latency_batches(lb, 32);
        mg_bench_opts ol = {10, LATENCY_ITERS, 1, 0};
        for (int i = 0; i < nl; ++i) {
            model_graph *g = NULL;
            if ((s = model_decode_graph_create(m, lb[i], u, out, cs, ss, &g)) != MG_OK) die("graph", s);
            if (time_row("decode latency (graph)", lb[i], 1, stream, run_graph, g, &ol, &st))
                report_latency(lb[i], &st);
            model_decode_graph_destroy(g);
        }
    }

#if MODEL_TRAINING
    /* Training step: forward_train + MSE loss + backward + AdamW, from a
     * fresh state, on a copy of the weights (the step updates them). */
    {
        train_ctx x;
        train_start(&x, stream, w, lay.total, B, T);
        for (size_t i = 0; i < n_prefill; ++i) {
            if (prefill[i][0] != MODEL_MAX_BATCH) continue;   /* the largest batch only */
            x.c.batch = prefill[i][0]; x.c.seqlen = prefill[i][1]; x.c.u = u;
            if (time_row("train step", x.c.batch, x.c.seqlen, stream, run_train, &x, &o, &st))
                report("train step", x.c.batch, x.c.seqlen, &st, (double)x.c.batch * x.c.seqlen,
                       MODEL_COST_TRAIN_WEIGHT_BYTES + (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_BYTES_PER_TOKEN,
                       (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_FLOPS_PER_TOKEN);
            /* The same step captured once as a CUDA Graph and replayed (the
             * AdamW step count advances on the device). */
            {
                model_train_graph *tg = NULL;
                if ((s = model_train_graph_create(x.t, x.w, x.grads, x.m, x.v, &x.p, x.c.batch, x.c.seqlen, u,
                                                x.target, NULL, NULL, x.loss, &tg)) != MG_OK) die("train graph", s);
                if (time_row("train step (graph)", x.c.batch, x.c.seqlen, stream, run_train_graph, tg, &o, &st))
                    report("train step (graph)", x.c.batch, x.c.seqlen, &st, (double)x.c.batch * x.c.seqlen,
                           MODEL_COST_TRAIN_WEIGHT_BYTES + (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_BYTES_PER_TOKEN,
                           (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_FLOPS_PER_TOKEN);
                model_train_graph_destroy(tg);
            }
            /* The same graph with episode starts (trainer_set_starts): every
             * stream starts an episode at the window's middle token, the
             * masked conv and scan kernels in the forward and the backward
             * (the target: within 5% of the row above). */
            {
                const size_t nm = (size_t)x.c.batch * x.c.seqlen;
                unsigned char *hm = (unsigned char *)calloc(nm, 1), *dm = NULL;
                if (!hm) die("mask", MG_ERR_OUT_OF_MEMORY);
                for (int b = 0; b < x.c.batch; ++b) hm[(size_t)b * x.c.seqlen + x.c.seqlen / 2] = 1;
                if ((s = mg_dev_alloc((void **)&dm, nm, "start mask")) != MG_OK) die("mask", s);
                if (cudaMemcpy(dm, hm, nm, cudaMemcpyHostToDevice) != cudaSuccess) die("mask", MG_ERR_CUDA);
                if ((s = model_trainer_set_starts(x.t, dm)) != MG_OK) die("trainer_set_starts", s);
                model_train_graph *tg = NULL;
                if ((s = model_train_graph_create(x.t, x.w, x.grads, x.m, x.v, &x.p, x.c.batch, x.c.seqlen, u,
                                                x.target, NULL, NULL, x.loss, &tg)) != MG_OK) die("train graph", s);
                if (time_row("train step (graph; starts)", x.c.batch, x.c.seqlen, stream, run_train_graph, tg, &o, &st))
                    report("train step (graph; starts)", x.c.batch, x.c.seqlen, &st, (double)x.c.batch * x.c.seqlen,
                           MODEL_COST_TRAIN_WEIGHT_BYTES + (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_BYTES_PER_TOKEN,
                           (double)x.c.batch * x.c.seqlen * MODEL_COST_TRAIN_FLOPS_PER_TOKEN);
                model_train_graph_destroy(tg);
                if ((s = model_trainer_set_starts(x.t, NULL)) != MG_OK) die("trainer_set_starts", s);
                mg_dev_free(dm);
                free(hm);
            }
        }
        train_end(&x);
    }
#endif

    model_destroy(m);
    mg_dev_free(u); mg_dev_free(out); mg_dev_free(cs); mg_dev_free(ss); mg_dev_free(w);
    mg_ref_mamba1_layout_free(&lay);
    cudaStreamDestroy(stream);
    if (csv) fclose(csv);
    return 0;
}
