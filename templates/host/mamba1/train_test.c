/*
 * NAME_train_test.c: TAP test of the training path of a Mamba-1 library on the
 * GPU against the f64 reference (runtime/mg_ref_mamba1):
 *   - forward_train out and final states vs the reference forward;
 *   - the gradient of every parameter tensor, of u and of the initial states
 *     vs mg_ref_mamba1_backward (rel-L2 <= MODEL_GRAD_TOL per tensor; max_abs and
 *     rel_l2 printed), from a random state and from a fresh start, with a
 *     length crossing a checkpoint chunk; padding of the gradient blob is 0;
 *     then one sequence of three chunks and a partial one at batch 1
 *     (test_grads_chunks: the reference's cost capped per case);
 *   - two identical runs give bit-identical gradients (and NULL optional
 *     outputs do not change the parameter gradients);
 *   - AdamW vs a CPU implementation in double, with clipping inactive and
 *     active, decay on every tensor and on matrices only; padding untouched;
 *     a NaN gradient skips the update;
 *   - dynamic loss scaling: arguments, growth, back-off on overflow, off;
 *   - gradient accumulation: off overwrites grads; on, backward adds
 *     (2g, then 2g + g, bit for bit), du still overwrites; the setter's
 *     bad arguments;
 *   - a few MSE training steps reduce the loss; the device loss equals the
 *     host loss of forward_train's output;
 *   - the training step captured as a CUDA Graph: N replays == N eager
 *     train_step_mse calls, bit-identical weights, moments, losses, states
 *     (with a set_params change of the learning rate before the last);
 *   - when MAX_SEQ_LEN allows, the gradients of one sequence longer than 256
 *     steps, not a multiple of the checkpoint stride (with the chunk-parallel
 *     scan backward, when the spec's mode picks it: several spans, the last
 *     one partial);
 *   - the chunk-parallel scan backward forced (when emitted) on a call of
 *     three spans, the last partial: gradients vs the reference (budget
 *     allowing) and vs the sequential backward (rel-L2 1e-5 in f32), two
 *     runs bit-identical;
 *   - weights out of the init range (mg_ref_mamba1_push_ranges: softplus's
 *     argument above its threshold): every gradient vs the reference;
 *   - episode starts (trainer_set_starts; doc/math.md §9) on the sequential
 *     and the chunked walk (chunked forward, chunk-parallel backward): vs
 *     the reference's forward_ex / backward_ex with mixed starts (t = 0,
 *     span and checkpoint edges, mid-span, consecutive tokens, the last
 *     token, streams without) and with every stream starting at one token:
 *     out, final states, every parameter gradient, du, the initial-state
 *     gradients (exactly 0 for streams starting at t = 0); bit for bit: an
 *     all-zero mask == no mask, a cleared mask gives the maskless bits,
 *     backward uses its forward's mask; the training graph replaying with
 *     the mask buffer rewritten between replays == eager steps; bad calls;
 *   - bad calls return the right status with a message.
 * Case sizes follow the cost of the CPU reference (MODEL_REF_MACS_PER_TOKEN
 * multiply-adds per token for the forward, about 3x that for the backward); MG_TEST_SCALE
 * (default 1) scales the budget. Prints "1..0 # SKIP no CUDA device" without a GPU.
 * The library is named through model_alias.h (model_X = NAME_X, MODEL_X =
 * NAME_X), the TAP harness is the runtime's (mg_tap.h).
 */
#include "model_alias.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_cuda.h"
#include "mg_ref_mamba1.h"
#include "mg_tap.h"

#include "train_tests.h"   /* part 1: sizes, tolerances, common globals and helpers */

/* for train_tests.h: the state arguments of a fresh start (the library's
 * calls, gpu_run), the weights AdamW may decay with wd_matrices_only */
#define NO_STATES NULL, NULL
#define NO_STATE0 NULL, NULL
#define MATRIX_SUFFIXES "input_proj.weight", "in_proj.weight", "conv1d.weight", "x_proj.weight", "dt_proj.weight", "out_proj.weight"

/* ---------------------------------------------------------------- helpers */
static mg_m1_dims dims;
static mg_m1_layout lay;
static mg_m1_tensor *tens;

/* ---------------------------------------------------------------- gradients */
typedef struct run_out {
    float *out, *cs, *ss, *grads, *du, *dcs, *dss;
} run_out;

static void run_alloc(run_out *r, int B, int T)
{
    r->out = FALLOC(n_out(B, T));
    r->cs = FALLOC(model_conv_state_floats(B));
    r->ss = FALLOC(model_ssm_state_floats(B));
    r->grads = FALLOC(WFLOATS);
    r->du = FALLOC(n_u(B, T));
    r->dcs = FALLOC(model_conv_state_floats(B));
    r->dss = FALLOC(model_ssm_state_floats(B));
}
static void run_free(run_out *r)
{
    free(r->out); free(r->cs); free(r->ss); free(r->grads); free(r->du); free(r->dcs); free(r->dss);
}

/* The random inputs of a B x T call: u ~ N(0, 1) (seed), y ~ N(0, ysd)
 * (seed + 1: dout, or the MSE target), initial conv and ssm states
 * ~ N(0, 0.5) (seed + 2, seed + 3). */
static void rand_call(int B, int T, uint64_t seed, float ysd, float **u, float **y, float **cs0, float **ss0)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    *u = FALLOC(n_u(B, T)); *y = FALLOC(n_out(B, T)); *cs0 = FALLOC(ncs); *ss0 = FALLOC(nss);
    mg_tap_randn(*u, n_u(B, T), seed, 1.0f);
    push_inputs(*u, (size_t)B * T);
    mg_tap_randn(*y, n_out(B, T), seed + 1, ysd);
    mg_tap_randn(*cs0, ncs, seed + 2, 0.5f);
    mg_tap_randn(*ss0, nss, seed + 3, 0.5f);
}

/* forward_train + backward on the GPU. cs0/ss0 NULL: fresh start. want_opt:
 * ask for du and the state gradients. */
static mg_status gpu_run(int B, int T, const float *u, const float *cs0, const float *ss0,
                         const float *dout, int want_opt, run_out *r)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *du_ = mg_tap_dalloc(n_u(B, T)), *dout_ = mg_tap_dalloc(n_out(B, T)), *dy_ = mg_tap_dalloc(n_out(B, T));
    float *dcs = cs0 ? mg_tap_dalloc(ncs) : NULL, *dss = ss0 ? mg_tap_dalloc(nss) : NULL;
    float *dg = mg_tap_dalloc(WFLOATS), *ddu = mg_tap_dalloc(n_u(B, T)), *ddcs = mg_tap_dalloc(ncs), *ddss = mg_tap_dalloc(nss);
    mg_tap_up(du_, u, n_u(B, T));
    mg_tap_up(dy_, dout, n_out(B, T));
    if (cs0) mg_tap_up(dcs, cs0, ncs);
    if (ss0) mg_tap_up(dss, ss0, nss);
    /* garbage in the outputs: overwrite semantics */
    if (cudaMemset(dg, 0x7f, WFLOATS * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    mg_status s = model_forward_train(tr, d_blob, B, T, du_, dout_, dcs, dss);
    if (s == MG_OK)
        s = model_backward(tr, dy_, dg, want_opt ? ddu : NULL, want_opt ? ddcs : NULL, want_opt ? ddss : NULL);
    if (s == MG_OK) {
        mg_tap_down(r->out, dout_, n_out(B, T));
        if (cs0) mg_tap_down(r->cs, dcs, ncs);
        if (ss0) mg_tap_down(r->ss, dss, nss);
        mg_tap_down(r->grads, dg, WFLOATS);
        if (want_opt) {
            mg_tap_down(r->du, ddu, n_u(B, T));
            mg_tap_down(r->dcs, ddcs, ncs);
            mg_tap_down(r->dss, ddss, nss);
        }
    }
    mg_dev_free(du_); mg_dev_free(dout_); mg_dev_free(dy_); mg_dev_free(dcs); mg_dev_free(dss);
    mg_dev_free(dg); mg_dev_free(ddu); mg_dev_free(ddcs); mg_dev_free(ddss);
    return s;
}

static void test_grads(int B, int T, int with_state, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *u, *dout, *cs0, *ss0;
    rand_call(B, T, seed, 1.0f, &u, &dout, &cs0, &ss0);
    char how[96];
    snprintf(how, sizeof how, "%s%s", with_state ? "random state" : "fresh start", weights_tag);
    run_out r;
    run_alloc(&r, B, T);
    mg_status s = gpu_run(B, T, u, with_state ? cs0 : NULL, with_state ? ss0 : NULL, dout, 1, &r);
    if (!mg_tap_ok(s == MG_OK, "forward_train + backward b=%d T=%d (%s) run", B, T, how)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        run_free(&r); free(u); free(dout); free(cs0); free(ss0);
        return;
    }
    double *rout = DALLOC_H(n_out(B, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
    double *rcs0 = DALLOC_H(ncs), *rss0 = DALLOC_H(nss), *rdout = DALLOC_H(n_out(B, T));
    double *rg = DALLOC_H(lay.total), *rdu = DALLOC_H(n_u(B, T)), *rdcs = DALLOC_H(ncs), *rdss = DALLOC_H(nss);
    for (size_t i = 0; i < ncs; ++i) rcs[i] = rcs0[i] = with_state ? cs0[i] : 0.0;
    for (size_t i = 0; i < nss; ++i) rss[i] = rss0[i] = with_state ? ss0[i] : 0.0;
    for (size_t i = 0; i < n_out(B, T); ++i) rdout[i] = dout[i];
    if (mg_ref_mamba1_forward(&dims, &lay, blob, B, T, u, rout, rcs, rss) != MG_OK) mg_tap_bail("reference forward");
    if (mg_ref_mamba1_backward(&dims, &lay, blob, B, T, u, with_state ? rcs0 : NULL, with_state ? rss0 : NULL,
                               rdout, rg, rdu, rdcs, rdss) != MG_OK) mg_tap_bail("reference backward");
    char what[200];
    snprintf(what, sizeof what, "b=%d T=%d %s: forward_train out", B, T, how);
    cmp_ref(what, r.out, rout, n_out(B, T), FWD_TOL);
    if (with_state) {
        snprintf(what, sizeof what, "b=%d T=%d %s: final conv_state", B, T, how);
        cmp_ref(what, r.cs, rcs, ncs, FWD_TOL);
        snprintf(what, sizeof what, "b=%d T=%d %s: final ssm_state", B, T, how);
        cmp_ref(what, r.ss, rss, nss, FWD_TOL);
    }
    for (int i = 0; i < n_tens; ++i) {
        snprintf(what, sizeof what, "b=%d T=%d %s: grad %s", B, T, how, tens[i].name);
        cmp_ref(what, r.grads + tens[i].offset, rg + tens[i].offset, tens[i].numel, GRAD_TOL);
    }
    snprintf(what, sizeof what, "b=%d T=%d %s: du", B, T, how);
    cmp_ref(what, r.du, rdu, n_u(B, T), GRAD_TOL);
    snprintf(what, sizeof what, "b=%d T=%d %s: d conv_state (initial)", B, T, how);
    cmp_ref_state_grad(what, r.dcs, rdcs, ncs, GRAD_TOL);
    snprintf(what, sizeof what, "b=%d T=%d %s: d ssm_state (initial)", B, T, how);
    cmp_ref_state_grad(what, r.dss, rdss, nss, GRAD_TOL);
    size_t bad = 0;
    for (size_t i = 0; i < WFLOATS; ++i)
        if (!inside[i] && r.grads[i] != 0.0f) ++bad;
    mg_tap_ok(bad == 0, "b=%d T=%d %s: gradient blob padding is 0 (%zu nonzero)", B, T, how, bad);
    run_free(&r);
    free(u); free(dout); free(cs0); free(ss0);
    free(rout); free(rcs); free(rss); free(rcs0); free(rss0); free(rdout); free(rg); free(rdu); free(rdcs); free(rdss);
}

static void test_determinism(int B, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *u, *dout, *cs0, *ss0;
    rand_call(B, T, seed, 1.0f, &u, &dout, &cs0, &ss0);
    run_out a, b, c;
    run_alloc(&a, B, T); run_alloc(&b, B, T); run_alloc(&c, B, T);
    mg_status s1 = gpu_run(B, T, u, cs0, ss0, dout, 1, &a);
    mg_status s2 = gpu_run(B, T, u, cs0, ss0, dout, 1, &b);
    mg_status s3 = gpu_run(B, T, u, cs0, ss0, dout, 0, &c);
    mg_tap_ok(s1 == MG_OK && s2 == MG_OK &&
           memcmp(a.grads, b.grads, WFLOATS * sizeof(float)) == 0 &&
           memcmp(a.du, b.du, n_u(B, T) * sizeof(float)) == 0 &&
           memcmp(a.dcs, b.dcs, ncs * sizeof(float)) == 0 &&
           memcmp(a.dss, b.dss, nss * sizeof(float)) == 0 &&
           memcmp(a.out, b.out, n_out(B, T) * sizeof(float)) == 0,
           "deterministic: two runs (b=%d T=%d) give bit-identical out and gradients", B, T);
    mg_tap_ok(s3 == MG_OK && memcmp(a.grads, c.grads, WFLOATS * sizeof(float)) == 0,
           "NULL du / state gradients leave the parameter gradients bit-identical");
    run_free(&a); run_free(&b); run_free(&c);
    free(u); free(dout); free(cs0); free(ss0);
}

/* ---------------------------------------------------------------- chunked scan backward */
/* Chunk-parallel vs sequential scan backward, per tensor: f32 1e-5 (the
 * README's bound for chunked vs sequential, MODEL_CHUNK_VS_SEQ_TOL). Both
 * read the same stored inputs and differ in f32 arithmetic only: a span's
 * decay is exp(A * sum delta) where the sequential walk multiplies the
 * exp(A * delta_t) step by step, and the adjoint entering a span is
 * P * in + L (the span's walk from ds = 0, scan_bwd_span_kernel, then
 * scan_bwd_combine_kernel) where the sequential walk folds the same terms
 * in step order; both are reorderings of f32 products and sums over at
 * most a span of steps, a few ulps per step, 1e-6 at most over thousands
 * (measured on an H200: <= 3.7e-7 over 3 spans). bf16/f16: the gradient
 * tolerance as before (the scan's outputs are rounded to the storage
 * dtype, so a difference in the last f32 bit can move a rounding). */
#define BWD_CVS_TOL (MODEL_LOWP ? GRAD_TOL : MODEL_CHUNK_VS_SEQ_TOL)

#if MODEL_HAS_CHUNKED_BWD
static void set_scan(int choice)
{
    if (model_trainer_set_scan(tr, choice) != MG_OK) mg_tap_bail("trainer_set_scan");
}

/* Worst per-tensor rel-L2 of the gradients of a against those of b (every
 * parameter tensor, du, the initial-state gradients); name of the worst. */
static double worst_grad_diff(const run_out *a, const run_out *b, int B, int T, const char **worst)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    size_t nmax = n_u(B, T);
    if (ncs > nmax) nmax = ncs;
    if (nss > nmax) nmax = nss;
    for (int i = 0; i < n_tens; ++i)
        if (tens[i].numel > nmax) nmax = tens[i].numel;
    double *ref = DALLOC_H(nmax), w = 0.0;
    *worst = "none";
    for (int i = -3; i < n_tens; ++i) {
        const float *x, *y;
        size_t n;
        const char *nm;
        if (i == -3) { x = a->du; y = b->du; n = n_u(B, T); nm = "du"; }
        else if (i == -2) { x = a->dcs; y = b->dcs; n = ncs; nm = "d conv_state"; }
        else if (i == -1) { x = a->dss; y = b->dss; n = nss; nm = "d ssm_state"; }
        else { x = a->grads + tens[i].offset; y = b->grads + tens[i].offset; n = tens[i].numel; nm = tens[i].name; }
        for (size_t k = 0; k < n; ++k) ref[k] = y[k];
        mg_err e = mg_compare_f32(x, ref, n);
        const double r = mg_err_ok(&e, 1e30) ? e.rel_l2 : INFINITY;   /* non-finite: worst */
        if (!(r <= w)) { w = r; *worst = nm; }
    }
    free(ref);
    return w;
}
#endif

/* The chunk-parallel scan backward forced on one call of three spans (the
 * last one partial and not a multiple of the checkpoint stride), from a
 * random state: every gradient vs the sequential backward (rel-L2 <=
 * BWD_CVS_TOL per tensor: f32 1e-5), two runs bit-identical, and vs the f64 reference
 * when the budget allows. Forced with trainer_set_scan, so it runs whatever
 * the auto threshold; the spec's own dispatch is covered by the long test. */
static void test_chunked_bwd(int budget, uint64_t seed)
{
#if MODEL_HAS_CHUNKED_BWD
    const int span = MODEL_BSCAN_SPAN;
    int B, T, nsp;   /* T: a ragged last span */
    if (!chunked_call(imin(MAX_SEQ_LEN, 2 * span + span / 2 + 3), span, span, "chunked scan backward",
                      "chunked scan backward", "span", &B, &T, &nsp))
        return;
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *u, *dout, *cs0, *ss0;
    rand_call(B, T, seed, 1.0f, &u, &dout, &cs0, &ss0);
    run_out c1, c2, sq;
    run_alloc(&c1, B, T); run_alloc(&c2, B, T); run_alloc(&sq, B, T);
    set_scan(MODEL_SCAN_CHUNKED);
    const mg_status s1 = gpu_run(B, T, u, cs0, ss0, dout, 1, &c1);
    const mg_status s2 = gpu_run(B, T, u, cs0, ss0, dout, 1, &c2);
    set_scan(MODEL_SCAN_SEQUENTIAL);
    const mg_status s3 = gpu_run(B, T, u, cs0, ss0, dout, 1, &sq);
    set_scan(MODEL_SCAN_SPEC);
    if (mg_tap_ok(s1 == MG_OK && s2 == MG_OK && s3 == MG_OK, "chunked / sequential scan backward b=%d T=%d run", B, T)) {
        mg_tap_ok(memcmp(c1.grads, c2.grads, WFLOATS * sizeof(float)) == 0 &&
               memcmp(c1.du, c2.du, n_u(B, T) * sizeof(float)) == 0 &&
               memcmp(c1.dcs, c2.dcs, ncs * sizeof(float)) == 0 &&
               memcmp(c1.dss, c2.dss, nss * sizeof(float)) == 0,
               "chunked scan backward, %d spans: two runs give bit-identical gradients", nsp);
        const char *worst;
        const double w = worst_grad_diff(&c1, &sq, B, T, &worst);
        mg_tap_diag("chunked vs sequential backward: worst rel_l2 %.3e (%s); parameter gradients %s", w, worst,
             memcmp(c1.grads, sq.grads, WFLOATS * sizeof(float)) == 0 ? "bit-identical" : "differ in rounding");
        mg_tap_ok(w <= BWD_CVS_TOL, "chunked vs sequential scan backward, %d spans: every gradient rel_l2 <= %g (worst %.3e, %s)",
               nsp, BWD_CVS_TOL, w, worst);
    } else {
        mg_tap_diag("%s", mg_last_error());
    }
    run_free(&c1); run_free(&c2); run_free(&sq);
    free(u); free(dout); free(cs0); free(ss0);
    if (budget >= T) {
        set_scan(MODEL_SCAN_CHUNKED);
        test_grads(1, T, 1, seed + 10);
        set_scan(MODEL_SCAN_SPEC);
    } else {
        mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)",
                 "chunked scan backward over several spans vs the reference");
    }
#else
    (void)budget;
    (void)seed;
    mg_tap_skip("no chunked scan backward in this library (scan.mode " MODEL_SCAN_MODE ", max_seq_len " MODEL_MAX_SEQ_LEN_STR ")",
             "chunked scan backward over several spans");
    mg_tap_ok(model_trainer_set_scan(tr, MODEL_SCAN_CHUNKED) == MG_ERR_INVALID_ARG,
           "trainer_set_scan(CHUNKED) without the kernels: MG_ERR_INVALID_ARG");
#endif
}

/* ---------------------------------------------------------------- episode starts (doc/math.md §9) */
/* The mask of a pattern (mg_tap_start_mask) for [B][T]: the mixed one
 * marks the backward's span edges and the checkpoint edges. */
static unsigned char *start_mask(int B, int T, int pattern)
{
    unsigned char *m = (unsigned char *)mg_tap_calloc((size_t)B * T);
    mg_tap_start_mask(m, B, T, pattern, MODEL_BSCAN_SPAN, CKPT);
    return m;
}
static unsigned char *d_start;   /* device mask buffer, MAX_BATCH x MAX_SEQ_LEN bytes */
/* Upload m [B][T] into d_start and make it the trainer's mask (m NULL: clear it). */
static void set_starts(const unsigned char *m, int B, int T)
{
    if (m && cudaMemcpy(d_start, m, (size_t)B * T, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy mask");
    if (model_trainer_set_starts(tr, m ? d_start : NULL) != MG_OK) mg_tap_bail("trainer_set_starts");
}
#if MODEL_HAS_CHUNKED_BWD
#define N_WALKS 2
#else
#define N_WALKS 1
#endif
static const int walk_of[2] = { MODEL_SCAN_SEQUENTIAL, MODEL_SCAN_CHUNKED };
static const char *const walk_name[2] = { "sequential scan", "chunked scan" };
static void use_walk(int k)
{
    if (model_trainer_set_scan(tr, walk_of[k]) != MG_OK) mg_tap_bail("trainer_set_scan");
}

/* forward_train + backward with a start mask, from random states, vs the
 * reference's forward_ex / backward_ex: out, final states, the gradient of
 * every parameter tensor, du, the initial-state gradients; on the
 * sequential scan and the chunked one (chunked forward, chunk-parallel
 * backward over several spans). */
static void test_grads_starts(int B, int T, int pattern, uint64_t seed)
{
    static const char *const pname[4] = { "no start", "every stream at a mid-window token", "every stream at t = 0",
                                          "mixed starts" };
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *u, *dout, *cs0, *ss0;
    rand_call(B, T, seed, 1.0f, &u, &dout, &cs0, &ss0);
    unsigned char *m = start_mask(B, T, pattern);
    double *rout = DALLOC_H(n_out(B, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
    double *rcs0 = DALLOC_H(ncs), *rss0 = DALLOC_H(nss), *rdout = DALLOC_H(n_out(B, T));
    double *rg = DALLOC_H(lay.total), *rdu = DALLOC_H(n_u(B, T)), *rdcs = DALLOC_H(ncs), *rdss = DALLOC_H(nss);
    for (size_t i = 0; i < ncs; ++i) rcs[i] = rcs0[i] = cs0[i];
    for (size_t i = 0; i < nss; ++i) rss[i] = rss0[i] = ss0[i];
    for (size_t i = 0; i < n_out(B, T); ++i) rdout[i] = dout[i];
    const mg_ref_seqs seqs = { m, NULL, 0, 0 };
    if (mg_ref_mamba1_forward_ex(&dims, &lay, blob, B, T, u, rout, rcs, rss, &seqs) != MG_OK)
        mg_tap_bail("reference forward_ex");
    if (mg_ref_mamba1_backward_ex(&dims, &lay, blob, B, T, u, rcs0, rss0, rdout, rg, rdu, rdcs, rdss, &seqs) != MG_OK)
        mg_tap_bail("reference backward_ex");
    set_starts(m, B, T);
    for (int k = 0; k < N_WALKS; ++k) {
        use_walk(k);
        run_out r;
        run_alloc(&r, B, T);
        const mg_status s = gpu_run(B, T, u, cs0, ss0, dout, 1, &r);
        char what[240];
        if (!mg_tap_ok(s == MG_OK, "forward_train + backward with starts b=%d T=%d (%s, %s) run", B, T, pname[pattern],
                       walk_name[k])) {
            mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
            run_free(&r);
            continue;
        }
#define WHAT(x) (snprintf(what, sizeof what, "starts b=%d T=%d %s, %s vs reference _ex: %s", B, T, pname[pattern], \
                          walk_name[k], (x)), what)
        cmp_ref(WHAT("forward_train out"), r.out, rout, n_out(B, T), FWD_TOL);
        cmp_ref(WHAT("final conv_state"), r.cs, rcs, ncs, FWD_TOL);
        cmp_ref(WHAT("final ssm_state"), r.ss, rss, nss, FWD_TOL);
        for (int i = 0; i < n_tens; ++i) {
            char nm[120];
            snprintf(nm, sizeof nm, "grad %s", tens[i].name);
            cmp_ref(WHAT(nm), r.grads + tens[i].offset, rg + tens[i].offset, tens[i].numel, GRAD_TOL);
        }
        cmp_ref(WHAT("du"), r.du, rdu, n_u(B, T), GRAD_TOL);
        cmp_ref_state_grad(WHAT("d conv_state (initial)"), r.dcs, rdcs, ncs, GRAD_TOL);
        cmp_ref_state_grad(WHAT("d ssm_state (initial)"), r.dss, rdss, nss, GRAD_TOL);
#undef WHAT
        /* streams whose token 0 is a start: their initial-state gradients are exactly 0 */
        size_t nz = 0, nfirst = 0;
        for (int l = 0; l < N_LAYERS; ++l)
            for (int b = 0; b < B; ++b) {
                if (!m[(size_t)b * T]) continue;
                nfirst += l == 0;
                const size_t pc = ncs / N_LAYERS / B, ps = nss / N_LAYERS / B;
                for (size_t i = 0; i < pc; ++i) nz += r.dcs[((size_t)l * B + b) * pc + i] != 0.0f;
                for (size_t i = 0; i < ps; ++i) nz += r.dss[((size_t)l * B + b) * ps + i] != 0.0f;
            }
        mg_tap_ok(nz == 0, "starts b=%d T=%d %s, %s: the initial-state gradients of the %zu stream(s) starting at t = 0 "
                  "are exactly 0 (%zu nonzero)", B, T, pname[pattern], walk_name[k], nfirst, nz);
        run_free(&r);
    }
    set_starts(NULL, 0, 0);
    if (model_trainer_set_scan(tr, MODEL_SCAN_SPEC) != MG_OK) mg_tap_bail("trainer_set_scan");
    free(u); free(dout); free(cs0); free(ss0); free(m);
    free(rout); free(rcs); free(rss); free(rcs0); free(rss0); free(rdout); free(rg); free(rdu); free(rdcs); free(rdss);
}

static int same_run(const run_out *a, const run_out *b, int B, int T)
{
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    /* every part, so a failure's diagnostics name each one that differs */
    size_t k = mg_tap_diag_bits("out", a->out, b->out, n_out(B, T));
    k += mg_tap_diag_bits("conv state", a->cs, b->cs, ncs);
    k += mg_tap_diag_bits("ssm state", a->ss, b->ss, nss);
    k += mg_tap_diag_bits("gradients", a->grads, b->grads, WFLOATS);
    k += mg_tap_diag_bits("du", a->du, b->du, n_u(B, T));
    k += mg_tap_diag_bits("conv state gradient", a->dcs, b->dcs, ncs);
    k += mg_tap_diag_bits("ssm state gradient", a->dss, b->dss, nss);
    return k == 0;
}

/* Bit for bit, on every scan walk: an all-zero mask == no mask (out,
 * states, every gradient), and clearing the mask gives the maskless bits
 * again; backward differentiates its forward with that forward's mask
 * (a mask cleared between them changes nothing). */
static void test_starts_exact(int B, int T, uint64_t seed)
{
    float *u, *dout, *cs0, *ss0;
    rand_call(B, T, seed, 1.0f, &u, &dout, &cs0, &ss0);
    unsigned char *zero = start_mask(B, T, MG_TAP_STARTS_NONE), *mixed = start_mask(B, T, MG_TAP_STARTS_MIXED);
    for (int k = 0; k < N_WALKS; ++k) {
        use_walk(k);
        run_out a, b, c;
        run_alloc(&a, B, T); run_alloc(&b, B, T); run_alloc(&c, B, T);
        set_starts(NULL, 0, 0);
        mg_status s = gpu_run(B, T, u, cs0, ss0, dout, 1, &a);
        set_starts(zero, B, T);
        if (s == MG_OK) s = gpu_run(B, T, u, cs0, ss0, dout, 1, &b);
        set_starts(NULL, 0, 0);
        if (s == MG_OK) s = gpu_run(B, T, u, cs0, ss0, dout, 1, &c);
        mg_tap_ok(s == MG_OK && same_run(&a, &b, B, T), "trainer with an all-zero start mask == no mask (%s): out, "
                  "states and every gradient bit-identical", walk_name[k]);
        mg_tap_ok(s == MG_OK && same_run(&a, &c, B, T), "trainer_set_starts(NULL) after a mask: the maskless bits again (%s)",
                  walk_name[k]);
        /* forward with the mixed mask, mask cleared, then backward == the mask kept */
        set_starts(mixed, B, T);
        if (s == MG_OK) s = gpu_run(B, T, u, cs0, ss0, dout, 1, &b);
        {
            const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
            float *du_ = mg_tap_dalloc(n_u(B, T)), *dout_ = mg_tap_dalloc(n_out(B, T)), *dy_ = mg_tap_dalloc(n_out(B, T));
            float *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss), *dg = mg_tap_dalloc(WFLOATS);
            float *ddu = mg_tap_dalloc(n_u(B, T)), *ddcs = mg_tap_dalloc(ncs), *ddss = mg_tap_dalloc(nss);
            mg_tap_up(du_, u, n_u(B, T)); mg_tap_up(dy_, dout, n_out(B, T));
            mg_tap_up(dcs, cs0, ncs); mg_tap_up(dss, ss0, nss);
            if (s == MG_OK) s = model_forward_train(tr, d_blob, B, T, du_, dout_, dcs, dss);
            set_starts(NULL, 0, 0);
            if (s == MG_OK) s = model_backward(tr, dy_, dg, ddu, ddcs, ddss);
            if (s == MG_OK) {
                mg_tap_down(c.out, dout_, n_out(B, T)); mg_tap_down(c.cs, dcs, ncs); mg_tap_down(c.ss, dss, nss);
                mg_tap_down(c.grads, dg, WFLOATS); mg_tap_down(c.du, ddu, n_u(B, T));
                mg_tap_down(c.dcs, ddcs, ncs); mg_tap_down(c.dss, ddss, nss);
            }
            mg_dev_free(du_); mg_dev_free(dout_); mg_dev_free(dy_); mg_dev_free(dcs); mg_dev_free(dss); mg_dev_free(dg);
            mg_dev_free(ddu); mg_dev_free(ddcs); mg_dev_free(ddss);
        }
        mg_tap_ok(s == MG_OK && same_run(&b, &c, B, T), "backward uses its forward_train's start mask (cleared in "
                  "between: the same bits, %s)", walk_name[k]);
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        run_free(&a); run_free(&b); run_free(&c);
    }
    set_starts(NULL, 0, 0);
    if (model_trainer_set_scan(tr, MODEL_SCAN_SPEC) != MG_OK) mg_tap_bail("trainer_set_scan");
    free(u); free(dout); free(cs0); free(ss0); free(zero); free(mixed);
}

/* The training graph with a start mask: captured with the trainer's mask
 * buffer, replays read what the buffer holds: a different mask every step
 * (none, every stream mid-window, mixed), each replay against an eager
 * train_step_mse with the same mask: loss of every step, weights and
 * moments bit-identical. */
static void test_train_graph_starts(int B, int T, uint64_t seed)
{
    enum { STEPS = 3 };
    static const int pat[STEPS] = { MG_TAP_STARTS_NONE, MG_TAP_STARTS_MID, MG_TAP_STARTS_MIXED };
    float *u, *tgt, *cs0, *ss0;
    rand_call(B, T, seed, 0.5f, &u, &tgt, &cs0, &ss0);
    float *ha = FALLOC(WFLOATS), *hb = FALLOC(WFLOATS), le[STEPS], lg[STEPS];
    float *dw[2], *dg[2], *dm[2], *dv[2], *dl[2];
    for (int i = 0; i < 2; ++i) {
        dw[i] = mg_tap_dalloc(WFLOATS); dg[i] = mg_tap_dalloc(WFLOATS); dm[i] = mg_tap_dalloc(WFLOATS);
        dv[i] = mg_tap_dalloc(WFLOATS); dl[i] = mg_tap_dalloc(1);
        mg_tap_up(dw[i], blob, WFLOATS);
        if (cudaMemset(dm[i], 0, WFLOATS * sizeof(float)) != cudaSuccess ||
            cudaMemset(dv[i], 0, WFLOATS * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    }
    float *du = mg_tap_dalloc(n_u(B, T)), *dt = mg_tap_dalloc(n_out(B, T));
    mg_tap_up(du, u, n_u(B, T)); mg_tap_up(dt, tgt, n_out(B, T));
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-2f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.max_grad_norm = 1.0f; p.step = 1;
    unsigned char *m = start_mask(B, T, MG_TAP_STARTS_MIXED);
    set_starts(m, B, T);
    model_train_graph *g = NULL;
    mg_status s = model_train_graph_create(tr, dw[1], dg[1], dm[1], dv[1], &p, B, T, du, dt, NULL, NULL, dl[1], &g);
    if (!mg_tap_ok(s == MG_OK, "train_graph_create with a start mask b=%d T=%d", B, T))
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    for (int k = 0; k < STEPS && s == MG_OK; ++k) {
        free(m);
        m = start_mask(B, T, pat[k]);
        set_starts(m, B, T);   /* this step's mask, in the buffer the graph captured */
        p.step = k + 1;
        s = model_train_step_mse(tr, dw[0], dg[0], dm[0], dv[0], &p, B, T, du, dt, NULL, NULL, dl[0]);
        if (s == MG_OK) s = model_train_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(le + k, dl[0], 1);
        mg_tap_down(lg + k, dl[1], 1);
    }
    if (g) {
        if (mg_tap_ok(s == MG_OK, "train graph with starts: %d replays and eager steps, a new mask each step, run", STEPS)) {
            mg_tap_ok(memcmp(le, lg, sizeof le) == 0, "train graph replay (mask rewritten between replays) == eager: "
                      "loss of every step bit-identical (%.6g %.6g %.6g)", le[0], le[1], le[2]);
            mg_tap_down(ha, dw[0], WFLOATS); mg_tap_down(hb, dw[1], WFLOATS);
            int same = memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            mg_tap_down(ha, dm[0], WFLOATS); mg_tap_down(hb, dm[1], WFLOATS);
            same = same && memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            mg_tap_down(ha, dv[0], WFLOATS); mg_tap_down(hb, dv[1], WFLOATS);
            same = same && memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            mg_tap_ok(same, "train graph replay with starts == eager: weights and moments bit-identical");
        } else {
            mg_tap_diag("%s", mg_last_error());
        }
        model_train_graph_destroy(g);
    }
    set_starts(NULL, 0, 0);
    for (int i = 0; i < 2; ++i) { mg_dev_free(dw[i]); mg_dev_free(dg[i]); mg_dev_free(dm[i]); mg_dev_free(dv[i]); mg_dev_free(dl[i]); }
    mg_dev_free(du); mg_dev_free(dt);
    free(u); free(tgt); free(cs0); free(ss0); free(ha); free(hb); free(m);
}

/* Bad calls of trainer_set_starts: the documented status, the mask kept. */
static void test_starts_bad_calls(void)
{
    unsigned char host[16] = { 0 };
    mg_tap_expect_status(model_trainer_set_starts(NULL, d_start), MG_ERR_INVALID_ARG, "trainer_set_starts NULL trainer");
    mg_tap_expect_error(model_trainer_set_starts(tr, host), MG_ERR_INVALID_ARG, "_trainer_set_starts: start",
                        "trainer_set_starts with a mask in unregistered host memory");
    mg_tap_expect_status(model_trainer_set_starts(tr, (const uint8_t *)(uintptr_t)0x1000), MG_ERR_INVALID_ARG,
                         "trainer_set_starts with a pointer CUDA does not know");
    mg_tap_ok(model_trainer_set_starts(tr, d_start) == MG_OK && model_trainer_set_starts(tr, NULL) == MG_OK,
              "trainer_set_starts: a device buffer, then NULL, accepted");
}

/* main's episode-start steps: mixed starts and every stream at one token,
 * both walks; the exact checks; the graph; bad calls. */
static void test_starts(int budget)
{
    d_start = (unsigned char *)mg_tap_dalloc(((size_t)MAX_BATCH * MAX_SEQ_LEN + 3) / 4);
    const int bs = imin(5, MAX_BATCH);
    /* at least two backward spans and several checkpoint pieces */
    const int ts = imin(MAX_SEQ_LEN, imax(imin(2 * MODEL_BSCAN_SPAN + CKPT / 2 + 1, imax(2, budget / bs)), 2 * CKPT + 3));
    if ((double)bs * ts <= budget) {
        test_grads_starts(bs, ts, MG_TAP_STARTS_MIXED, 401);
        test_grads_starts(imin(2, MAX_BATCH), imin(ts, MODEL_BSCAN_SPAN + 5), MG_TAP_STARTS_MID, 402);
    } else {
        mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)", "gradients with episode starts vs the reference");
    }
    test_starts_exact(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 2 * MODEL_BSCAN_SPAN + 5), 403);
    test_train_graph_starts(bs, imin(MAX_SEQ_LEN, MODEL_BSCAN_SPAN + CKPT + 3), 404);
    test_starts_bad_calls();
    mg_dev_free(d_start);
}

/* ---------------------------------------------------------------- training graph */
/* For train_tests.h's test_train_graph: the states as an array (conv,
 * ssm), their sizes, a call's random inputs with them, the state arguments
 * of the library's calls, the states train_graph_create is checked not to
 * touch (the ssm state), their names in the last check. */
#define NST 2
static size_t st_floats(int i, int B) { return i == 0 ? model_conv_state_floats(B) : model_ssm_state_floats(B); }
#define RAND_CALL(B, T, seed, ysd, u, y, st) rand_call(B, T, seed, ysd, u, y, &(st)[0], &(st)[1])
#define STATE_ARGS(a) (a)[0], (a)[1]
#define CREATE_CHECKS_STATE(i) ((i) == 1)
#define STATE_NAMES "conv / ssm"
/* the reference's packed call from zero states: out and final states
 * (forward_ex), weight gradients and du (backward_ex) */
static void ref_train_packed(int T, const float *u, const float *dy, double *out, double *const st[NST], double *g,
                             double *du, const mg_ref_seqs *o)
{
    double *rdy = DALLOC_H(n_out(1, T));
    for (size_t i = 0; i < n_out(1, T); ++i) rdy[i] = dy[i];
    if (mg_ref_mamba1_forward_ex(&dims, &lay, blob, 1, T, u, out, st[0], st[1], o) != MG_OK)
        mg_tap_bail("reference forward_ex (packed)");
    if (mg_ref_mamba1_backward_ex(&dims, &lay, blob, 1, T, u, NULL, NULL, rdy, g, du, NULL, NULL, o) != MG_OK)
        mg_tap_bail("reference backward_ex (packed)");
    free(rdy);
}
#define REF_TRAIN_PACKED ref_train_packed
/* The same from initial states st0 (st: in/out, starting equal to st0),
 * with the initial-state gradients dst. */
static void ref_train_packed_from(int T, const float *u, const float *dy, double *out, double *const st[NST],
                                  double *const st0[NST], double *g, double *du, double *const dst[NST],
                                  const mg_ref_seqs *o)
{
    double *rdy = DALLOC_H(n_out(1, T));
    for (size_t i = 0; i < n_out(1, T); ++i) rdy[i] = dy[i];
    if (mg_ref_mamba1_forward_ex(&dims, &lay, blob, 1, T, u, out, st[0], st[1], o) != MG_OK)
        mg_tap_bail("reference forward_ex (packed, from states)");
    if (mg_ref_mamba1_backward_ex(&dims, &lay, blob, 1, T, u, st0[0], st0[1], rdy, g, du, dst[0], dst[1], o) != MG_OK)
        mg_tap_bail("reference backward_ex (packed, from states)");
    free(rdy);
}
#define REF_TRAIN_PACKED_FROM ref_train_packed_from
static void cmp_final_states(const char *prefix, int B, float *const got[NST], double *const ref[NST])
{
    static const char *const name[NST] = { "conv_state", "ssm_state" };
    char what[300];
    for (int i = 0; i < NST; ++i) {
        snprintf(what, sizeof what, "%s: final %s", prefix, name[i]);
        cmp_ref(what, got[i], ref[i], st_floats(i, B), FWD_TOL);
    }
}
#define CMP_FINAL_STATES(prefix, B, got, ref) cmp_final_states(prefix, B, got, ref)

/* ---------------------------------------------------------------- AdamW */
#include "train_tests.h"   /* part 2: AdamW, training, the training graph, main's first and last steps */

/* ---------------------------------------------------------------- bad calls */
static void test_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH), T = imin(3, MAX_SEQ_LEN);
    float *du, *dout, *dg, *dm, *dv, *dw;
    bad_calls_start(B, T, &du, &dout, &dg, &dm, &dv, &dw);
    mg_tap_expect_status(model_forward_train(NULL, dw, B, T, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train NULL trainer");
    mg_tap_expect_status(model_forward_train(tr, NULL, B, T, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train NULL weights");
    mg_tap_expect_status(model_forward_train(tr, dw, 0, T, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train batch = 0");
    mg_tap_expect_status(model_forward_train(tr, dw, MAX_BATCH + 1, T, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_forward_train(tr, dw, B, MAX_SEQ_LEN + 1, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_forward_train(tr, dw, B, T, NULL, dout, NULL, NULL), MG_ERR_INVALID_ARG, "forward_train u = NULL");
    mg_tap_expect_status(model_forward_train(tr, dw, B, T, du, dout + 1, NULL, NULL), MG_ERR_ALIGNMENT, "forward_train misaligned out");
    mg_tap_expect_status(model_forward_train(tr, dw, B, T, du, dout, dg, NULL), MG_ERR_INVALID_ARG, "forward_train conv_state without ssm_state");
    mg_tap_expect_status(model_backward(NULL, dout, dg, NULL, NULL, NULL), MG_ERR_INVALID_ARG, "backward NULL trainer");
    mg_tap_expect_status(model_trainer_set_scan(NULL, MODEL_SCAN_SPEC), MG_ERR_INVALID_ARG, "trainer_set_scan NULL trainer");
    mg_tap_expect_status(model_trainer_set_scan(tr, 3), MG_ERR_INVALID_ARG, "trainer_set_scan unknown choice");
    if (model_forward_train(tr, dw, B, T, du, dout, NULL, NULL) != MG_OK) mg_tap_bail("forward_train");
    mg_tap_expect_status(model_backward(tr, NULL, dg, NULL, NULL, NULL), MG_ERR_INVALID_ARG, "backward dout = NULL");
    mg_tap_expect_status(model_backward(tr, dout, NULL, NULL, NULL, NULL), MG_ERR_INVALID_ARG, "backward grads = NULL");
    mg_tap_expect_status(model_backward(tr, dout, dg + 1, NULL, NULL, NULL), MG_ERR_ALIGNMENT, "backward misaligned grads");
    mg_tap_expect_status(model_backward(tr, dout, dg, du + 2, NULL, NULL), MG_ERR_ALIGNMENT, "backward misaligned du");
    model_adamw_params p;
    test_bad_adamw(dw, dg, dm, dv, du, B, T, &p);
    {
        model_train_graph *g = NULL;
        mg_tap_expect_status(model_train_graph_create(tr, dw, dg, dm, dv, &p, B, T, du, dout, NULL, NULL, NULL, NULL),
                      MG_ERR_INVALID_ARG, "train_graph_create graph pointer NULL");
        mg_tap_expect_status(model_train_graph_create(tr, dw, dg, dm, dv, &p, B, MAX_SEQ_LEN + 1, du, dout, NULL, NULL, NULL, &g),
                      MG_ERR_INVALID_ARG, "train_graph_create seqlen = MAX_SEQ_LEN + 1");
        mg_tap_expect_status(model_train_graph_create(tr, dw, dg, dm, dv, &p, B, T, du, dout, dg, NULL, NULL, &g),
                      MG_ERR_INVALID_ARG, "train_graph_create conv_state without ssm_state");
        mg_tap_expect_status(model_train_graph_launch(NULL), MG_ERR_INVALID_ARG, "train_graph_launch NULL");
        p.step = 0;
        mg_tap_expect_status(model_train_graph_create(tr, dw, dg, dm, dv, &p, B, T, du, dout, NULL, NULL, NULL, &g),
                      MG_ERR_INVALID_ARG, "train_graph_create step = 0");
        mg_tap_expect_status(model_train_graph_set_params(NULL, &p), MG_ERR_INVALID_ARG, "train_graph_set_params NULL graph");
        p.step = 1;
    }
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dg); mg_dev_free(dm); mg_dev_free(dv); mg_dev_free(dw);
}

int main(void)
{
    if (!mg_tap_start()) return 0;
    mg_tap_diag(MODEL_NAME " training: layers=%d D=%d E=%d N=%d ckpt stride=%d, workspace %.1f MiB",
         N_LAYERS, D_MODEL, MODEL_D_INNER, MODEL_D_STATE, CKPT,
         model_trainer_workspace_bytes() / 1048576.0);
    const int budget = train_budget();

    dims = (mg_m1_dims)MODEL_REF_DIMS;
    if (mg_ref_mamba1_layout(&dims, &lay) != MG_OK) mg_tap_bail("mg_ref_mamba1_layout");
    if (lay.total != WFLOATS) { printf("Bail out! blob size %zu vs reference %zu\n", WFLOATS, lay.total); return 1; }
    n_tens = mg_ref_mamba1_tensors(&dims, &lay, NULL, 0);
    tens = (mg_m1_tensor *)mg_tap_calloc((size_t)n_tens * sizeof *tens);
    mg_ref_mamba1_tensors(&dims, &lay, tens, n_tens);
    blob = FALLOC(WFLOATS);
    if (mg_ref_mamba1_init(&dims, &lay, blob, TRAIN_INIT_SEED) != MG_OK) mg_tap_bail("mg_ref_mamba1_init");
    train_start();   /* the device copy, the trainer, the loss-scaling test */

    /* Sections (mg_tap_section: MG_TEST_PART / MG_TEST_ONLY can split or
     * narrow the run; by default every one runs, in this order). */
    int ba, ta;
    grads_first_shape(budget, &ba, &ta);
    if (mg_tap_section("gradients")) test_grads_first(budget, &ba, &ta);
    /* Over several chunks of the spec (scan.chunk_size; the backward's span
     * MODEL_BSCAN_SPAN is that rounded up to whole checkpoint chunks),
     * batch 1: the one check longer than a few steps on mamba1_130m. */
    if (mg_tap_section("gradients over chunks"))
        test_grads_chunks(imax(MODEL_SCAN_CHUNK, MODEL_HAS_CHUNKED_BWD ? MODEL_BSCAN_SPAN : 0), 111);
    /* A long sequence (> 256 steps, not a multiple of the checkpoint stride):
     * many checkpoint chunks in the backward scan, one sequence. With the
     * chunk-parallel backward the spec's dispatch picks it at this length
     * (chunked: longer than a span; auto: from BSCAN_AUTO_MIN_LEN), over
     * several spans with a partial last one. */
    if (mg_tap_section("long sequence")) {
        int tl = 256 + CKPT + 3;
#if MODEL_HAS_CHUNKED_BWD
        tl = imax(tl, 2 * MODEL_BSCAN_SPAN + 3);   /* at least three spans */
#if MODEL_BSCAN_MODE_ID == 2
        tl = imax(tl, MODEL_BSCAN_AUTO_MIN_LEN);   /* auto: at the threshold or above */
#endif
        if (tl % MODEL_BSCAN_SPAN == 0) ++tl;   /* partial last span */
#endif
        if (tl % CKPT == 0) ++tl;
#if MODEL_HAS_CHUNKED_BWD
        if (MAX_SEQ_LEN >= tl)
            mg_tap_diag("long sequence T=%d: chunked scan backward, %d spans of %d steps (last %d)", tl,
                 (tl + MODEL_BSCAN_SPAN - 1) / MODEL_BSCAN_SPAN, MODEL_BSCAN_SPAN,
                 tl - (tl - 1) / MODEL_BSCAN_SPAN * MODEL_BSCAN_SPAN);
#endif
        if (MAX_SEQ_LEN >= tl && budget >= tl)
            test_grads(1, tl, 1, 212);
        else
            mg_tap_skip(MAX_SEQ_LEN >= tl ? "reference too costly at this scale (raise MG_TEST_SCALE)" : "MAX_SEQ_LEN too short",
                     "gradients of a long sequence (> 256 steps) vs the reference");
    }

    if (mg_tap_section("determinism")) test_determinism(ba, imin(MAX_SEQ_LEN, 2 * CKPT + 3), 303);

    /* The chunk-parallel scan backward over several spans. */
    if (mg_tap_section("chunked backward")) test_chunked_bwd(budget, 313);

    /* Weights out of the init range (softplus's argument above its
     * threshold): every gradient vs the reference. */
    if (mg_tap_section("pushed weights")) test_grads_pushed(ba, imin(ta, imin(MAX_SEQ_LEN, CKPT + 5)), 4711);
    /* Episode starts in training (trainer_set_starts). */
    if (mg_tap_section("starts")) test_starts(budget);

    if (mg_tap_section("packed")) {
        test_train_packed(1100);
        test_train_packed_from(1101);
    }
    train_end(ba);   /* sections: AdamW, training, the training graph, bad calls */
    mg_ref_mamba1_layout_free(&lay);
    return mg_tap_done();
}
