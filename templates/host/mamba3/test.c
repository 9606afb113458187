/*
 * NAME_test.c: TAP test of a generated Mamba-3 SISO library "NAME"
 * on the GPU against the f64 reference path (runtime/mg_ref_mamba3):
 *   - the parameter table equals the reference's blob layout;
 *   - prefill vs reference (out and the four final states ssm, k_prev,
 *     v_prev, angle; every state comparison frame-invariant: ssm and k_prev
 *     each in the frame of its own final angle, the angle on the circle,
 *     mg_ref_mamba3_compare_states), from a random initial state and from a fresh start,
 *     incl. batch = MAX_BATCH and lengths that are not a multiple of the
 *     chunk (MODEL_CHUNK) nor of the scan's staged time chunk (MODEL_SCAN_TCHUNK);
 *   - continuation: two windows, and four windows (one of length 1), with
 *     the state carried, equal the reference over the whole sequence and
 *     one GPU prefill over it;
 *   - T decode steps equal a prefill over T tokens (from a random state);
 *   - a long sequence (MAX_SEQ_LEN) vs the reference: the angle recurrence
 *     stays accurate;
 *   - bad calls return the right status, with a message, and touch nothing;
 *   - two identical prefills give bit-identical results;
 *   - chunked scan (when the library has it, MODEL_HAS_CHUNKED_SCAN): forced
 *     chunked vs the f64 reference and vs the forced sequential scan
 *     (MODEL_CHUNK_VS_SEQ_TOL), from a nonzero initial state, at lengths
 *     that are not a multiple of the chunk and shorter than one chunk; four
 *     windows of chunked prefills vs one call;
 *   - burn-in: last-step output and the four final states vs prefill and the
 *     reference, from a random state and from a fresh start (NULL states);
 *   - decode CUDA Graph: replays bit-identical to eager decode steps (out of
 *     every step, the four final states); creation leaves the states untouched;
 *   - decode with a reset mask (none, some, all streams, NULL), on the fused
 *     single-token kernels and on the prefill kernels (batch above
 *     DEC_MAX_BATCH) == decode with those streams' states zeroed, bit for
 *     bit; the decode graph with a reset buffer changed between replays ==
 *     eager; bad reset calls return the documented status and launch nothing;
 *   - weights out of the init range (mg_ref_mamba3_push_ranges: softplus's
 *     argument above its threshold, the a_floor clamp binding): out and the
 *     four final states vs the reference;
 *   - NAME_selfcheck passes.
 * Relative-L2 tolerance MODEL_CHECK_TOL (of the storage precision). Every
 * comparison prints max_abs and rel_l2. Case sizes follow the cost of the
 * CPU reference (MODEL_REF_MACS_PER_TOKEN multiply-adds per token); MG_TEST_SCALE
 * (default 1) scales that budget.
 * Prints "1..0 # SKIP no CUDA device" without a GPU.
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
#include "mg_rng.h"
#include "mg_ref_mamba3.h"
#include "mg_tap.h"

#include "fwd_tests.h"   /* part 1: sizes, tolerance, common globals and helpers */

#define CHUNK       MODEL_CHUNK       /* chunk length of the spec */
#define REF_BUDGET_MACS 2.0e10                  /* reference work of the whole run at scale 1 */
#define NST 4                                   /* states: ssm, k_prev, v_prev, angle */

/* ---------------------------------------------------------------- helpers */
static mg_m3_dims dims;
static mg_m3_layout lay;

static const char *const st_name[NST] = { "ssm", "k_prev", "v_prev", "angle" };

static size_t st_floats(int i, int batch)
{
    switch (i) {
    case 0: return model_ssm_state_floats(batch);
    case 1: return model_k_prev_state_floats(batch);
    case 2: return model_v_prev_state_floats(batch);
    default: return model_angle_state_floats(batch);
    }
}

/* The four states of `batch` streams, on the host (f32) or reference (f64). */
typedef struct hstate { int batch; float *s[NST]; } hstate;
typedef struct rstate { int batch; double *s[NST]; } rstate;

static hstate hs_new(int batch)
{
    hstate h = { batch, { NULL } };
    for (int i = 0; i < NST; ++i) h.s[i] = FALLOC(st_floats(i, batch));
    return h;
}
static void hs_free(hstate *h) { for (int i = 0; i < NST; ++i) free(h->s[i]); }
static void hs_copy(hstate *dst, const hstate *src)
{
    for (int i = 0; i < NST; ++i) memcpy(dst->s[i], src->s[i], st_floats(i, src->batch) * sizeof(float));
}
static void hs_zero(hstate *h)
{
    for (int i = 0; i < NST; ++i) memset(h->s[i], 0, st_floats(i, h->batch) * sizeof(float));
}
/* A random state: ssm, k_prev, v_prev ~ N(0, 0.5), angle ~ U[0, 2pi). */
static void hs_rand(hstate *h, uint64_t seed)
{
    for (int i = 0; i < 3; ++i) mg_tap_randn(h->s[i], st_floats(i, h->batch), seed + (uint64_t)i, 0.5f);
    mg_rng r;
    mg_rng_seed(&r, seed + 3);
    mg_rng_fill_uniform(&r, h->s[3], st_floats(3, h->batch), 0.0f, 6.2831850f);
}
/* hs_rand, and the copies a and (when not NULL) b that runs from it update. */
static void hs_rand_copies(hstate *h, uint64_t seed, hstate *a, hstate *b)
{
    hs_rand(h, seed);
    hs_copy(a, h);
    if (b) hs_copy(b, h);
}
static rstate rs_new(int batch)
{
    rstate r;
    r.batch = batch;
    for (int i = 0; i < NST; ++i) r.s[i] = DALLOC_H(st_floats(i, batch));
    return r;
}
static void rs_free(rstate *r) { for (int i = 0; i < NST; ++i) free(r->s[i]); }

/* The states st on the device: ds[i] a fresh buffer holding st's state i
 * (NULL st: every ds[i] NULL, a fresh start); free with mg_dev_free. */
static void hs_dev(const hstate *st, int batch, float *ds[NST])
{
    for (int i = 0; i < NST; ++i) {
        ds[i] = NULL;
        if (st) {
            ds[i] = mg_tap_dalloc(st_floats(i, batch));
            mg_tap_up(ds[i], st->s[i], st_floats(i, batch));
        }
    }
}

/* The library's calls that gpu_call makes on host data. */
enum { CALL_PREFILL, CALL_PREFILL_STARTS, CALL_BURN_IN_STARTS };

/* GPU prefill (which: CALL_PREFILL), prefill_starts or burn_in_starts
 * (with the device start mask dstart, NULL allowed: the calls' NULL case)
 * on host data. st: initial state in, final state out (NULL: fresh start).
 * out: [batch][T] outputs, burn-in's [batch] last ones. Returns the call's
 * status. */
static mg_status gpu_call(int batch, int T, const float *u, float *out, hstate *st, int which,
                          const unsigned char *dstart)
{
    const size_t no = which == CALL_BURN_IN_STARTS ? n_out(batch, 1) : n_out(batch, T);
    float *du = mg_tap_dalloc(n_u(batch, T)), *dout = mg_tap_dalloc(no);
    float *ds[NST];
    mg_tap_up(du, u, n_u(batch, T));
    hs_dev(st, batch, ds);
    mg_status s = which == CALL_PREFILL ? model_prefill(model, batch, T, du, dout, ds[0], ds[1], ds[2], ds[3])
                : which == CALL_PREFILL_STARTS
                    ? model_prefill_starts(model, batch, T, du, dout, ds[0], ds[1], ds[2], ds[3], dstart)
                    : model_burn_in_starts(model, batch, T, du, dout, ds[0], ds[1], ds[2], ds[3], dstart);
    if (s == MG_OK) {
        mg_tap_down(out, dout, no);
        if (st)
            for (int i = 0; i < NST; ++i) mg_tap_down(st->s[i], ds[i], st_floats(i, batch));
    }
    mg_dev_free(du); mg_dev_free(dout);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    return s;
}

/* GPU prefill on host data (gpu_call). */
static mg_status gpu_prefill(int batch, int T, const float *u, float *out, hstate *st)
{
    return gpu_call(batch, T, u, out, st, CALL_PREFILL, NULL);
}

/* Reference prefill: f32 inputs and initial state st0 (NULL: fresh start),
 * f64 outputs; rs (NULL: no state out) gets the final state. */
static void ref_prefill(int batch, int T, const float *u, const hstate *st0, double *out, rstate *rs)
{
    if (rs)
        for (int i = 0; i < NST; ++i)
            for (size_t j = 0; j < st_floats(i, batch); ++j) rs->s[i][j] = st0 ? st0->s[i][j] : 0.0;
    if (mg_ref_mamba3_forward(&dims, &lay, blob, batch, T, u, out, rs ? rs->s[0] : NULL,
                              rs ? rs->s[1] : NULL, rs ? rs->s[2] : NULL, rs ? rs->s[3] : NULL) != MG_OK)
        mg_tap_bail("reference forward");
}

/* One comparison's diag line and TAP line: "WHAT: rel_l2 <= TOL". */
static int report_tol(const char *what, const mg_err *e, double tol)
{
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e->max_abs, e->rel_l2, e->n);
    return mg_tap_ok(mg_err_ok(e, tol), "%s: rel_l2 <= %g", what, tol);
}

static int cmp_gpu_tol(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    mg_err e = mg_compare_f32f32(got, ref, n);
    return report_tol(what, &e, tol);
}

static int cmp_gpu(const char *what, const float *got, const float *ref, size_t n)
{
    return cmp_gpu_tol(what, got, ref, n, TOL);
}

/* The four states of batch streams, host arrays got[NST], against the
 * reference's (ref) or, when ref is NULL, another GPU run's (gpu), within
 * tol; prefix names the case. Frame-invariant
 * (mg_ref_mamba3_compare_states): ssm and k_prev each turned back by its
 * own side's final angle, the angle on the circle (its rel_l2: the rms
 * angular error over that of a uniform angle), so the absolute angle's
 * drift over a long bf16 sequence, which no output sees, is measured once,
 * in the angle, and not again in every rotated state; under pushed
 * weights, the angle and ssm states in two parts of heads
 * (mg_ref_mamba3_tap_angle_pushed, mg_ref_mamba3_tap_ssm_pushed). */
static void cmp_host_states(const char *prefix, int batch, float *const got[], double *const ref[],
                            float *const gpu[], double tol)
{
    char what[256];
    mg_err e[NST];
    mg_ref_mamba3_compare_states(&dims, batch, (const float *const *)got, (const double *const *)ref,
                                 (const float *const *)gpu, e);
    for (int i = 0; i < NST; ++i) {
        snprintf(what, sizeof what, "%s: %s", prefix, st_name[i]);
        if (i == NST - 1 && weights_tag[0])
            mg_ref_mamba3_tap_angle_pushed(&dims, batch, what, got[i], ref ? ref[i] : NULL, gpu && !ref ? gpu[i] : NULL,
                                           tol, MODEL_F32_EXACT);
        else if (i == 0 && weights_tag[0])
            mg_ref_mamba3_tap_ssm_pushed(&dims, batch, what, got[0], got[NST - 1], ref ? ref[0] : NULL,
                                         ref ? ref[NST - 1] : NULL, gpu && !ref ? gpu[0] : NULL,
                                         gpu && !ref ? gpu[NST - 1] : NULL, tol);
        else
            report_tol(what, &e[i], tol);
    }
}

/* cmp_host_states of an hstate against an rstate (ref) or another hstate (gpu). */
static void cmp_states_tol(const char *prefix, const hstate *got, const rstate *ref, const hstate *gpu, double tol)
{
    cmp_host_states(prefix, got->batch, got->s, ref ? ref->s : NULL, ref ? NULL : gpu->s, tol);
}

static void cmp_states(const char *prefix, const hstate *got, const rstate *ref, const hstate *gpu)
{
    cmp_states_tol(prefix, got, ref, gpu, TOL);
}
static void cmp_ref_states(const char *prefix, const hstate *got, const rstate *ref) { cmp_states(prefix, got, ref, NULL); }
static void cmp_gpu_states(const char *prefix, const hstate *got, const hstate *gpu) { cmp_states(prefix, got, NULL, gpu); }

/* A GPU prefill of u from the state st0 (out, final states st) against
 * the reference's (computed into rout, rs): "CASE: out" and the four states. */
static void cmp_ref_prefill(const char *what_case, int batch, int T, const float *u, const hstate *st0,
                            const float *out, const hstate *st, double *rout, rstate *rs)
{
    char what[256];   /* room for any case name the callers format */
    ref_prefill(batch, T, u, st0, rout, rs);
    snprintf(what, sizeof what, "%s: out", what_case);
    cmp_ref(what, out, rout, n_out(batch, T));
    cmp_ref_states(what_case, st, rs);
}

/* for fwd_tests.h: the reference's functions, the state arguments of a
 * fresh start and of a decode step, a selfcheck report's diag line */
#define REF(x) mg_ref_mamba3_##x
#define NO_STATES NULL, NULL, NULL, NULL
#define DEV_STATES(st) st[0], st[1], st[2], st[3]
#define REF_FWD_EX(T, u, out, st, o) \
    mg_ref_mamba3_forward_ex(&dims, &lay, blob, 1, T, u, out, st[0], st[1], st[2], st[3], o)
#define CMP_STATES_ANY(prefix, batch, got, ref, gpu) cmp_host_states(prefix, batch, got, ref, gpu, TOL)
#define SELFCHECK_DIAG(T, r)                                                                                        \
    mg_tap_diag("selfcheck b=1 T=%d: out rel_l2=%.3e, ssm %.3e, k_prev %.3e, v_prev %.3e, angle %.3e", T,          \
                r.out.rel_l2, r.ssm.rel_l2, r.k_prev.rel_l2, r.v_prev.rel_l2, r.angle.rel_l2)

#include "fwd_tests.h"   /* part 2: the parameter table's end, the decode-graph steps, main's first and last steps */

/* ---------------------------------------------------------------- tests */

static void test_param_table(void)
{
    int good = lay.total == (size_t)MODEL_WEIGHTS_FLOATS;
    if (!good) mg_tap_diag("blob: %zu floats, reference layout %zu", (size_t)MODEL_WEIGHTS_FLOATS, lay.total);
    size_t count = 0;
    if (mg_ref_mamba3_params(&dims, &lay, NULL, 0, &count) != MG_OK) mg_tap_bail("mg_ref_mamba3_params");
    mg_m3_param *ref = (mg_m3_param *)mg_tap_malloc(count * sizeof *ref);
    if (mg_ref_mamba3_params(&dims, &lay, ref, count, &count) != MG_OK) mg_tap_bail("mg_ref_mamba3_params");
    if (count != (size_t)MODEL_N_PARAMS) {
        mg_tap_diag("table has %d entries, reference %zu", MODEL_N_PARAMS, count);
        good = 0;
    }
    /* Entry by entry, in blob order: name, offset, shape, numel. */
    for (size_t i = 0; i < count && i < (size_t)MODEL_N_PARAMS && good; ++i) {
        const model_param_info *p = &model_params[i];
        int same = strcmp(p->name, ref[i].name) == 0 && p->offset == ref[i].offset &&
                   p->numel == ref[i].numel && p->ndim == ref[i].ndim;
        for (int k = 0; k < p->ndim && same; ++k) same = (long)p->shape[k] == ref[i].shape[k];
        if (!same) {
            mg_tap_diag("entry %zu: expected %s at %zu (%zu floats), got %s at %zu (%zu floats)", i, ref[i].name,
                 ref[i].offset, ref[i].numel, p->name, p->offset, p->numel);
            good = 0;
        }
    }
    free(ref);
    param_table_end(good);
}

/* Prefill from a random initial state (or a fresh start) vs the reference. */
static void test_prefill(int batch, int T, int with_state, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *out = FALLOC(n_out(batch, T));
    double *rout = DALLOC_H(n_out(batch, T));
    hstate st = hs_new(batch), st0 = hs_new(batch);
    rstate rs = rs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    push_inputs(u, (size_t)batch * T);
    hs_rand_copies(&st0, seed + 1, &st, NULL);
    char what[200];
    char how[128];
    snprintf(how, sizeof how, "%s%s", with_state ? "from a random state" : "fresh start (NULL states)", weights_tag);
    mg_status s = gpu_prefill(batch, T, u, out, with_state ? &st : NULL);
    if (!mg_tap_ok(s == MG_OK, "prefill batch=%d seqlen=%d %s runs", batch, T, how)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        ref_prefill(batch, T, u, with_state ? &st0 : NULL, rout, with_state ? &rs : NULL);
        snprintf(what, sizeof what, "prefill b=%d T=%d %s: out", batch, T, how);
        cmp_ref(what, out, rout, n_out(batch, T));
        if (with_state) {
            snprintf(what, sizeof what, "prefill b=%d T=%d %s", batch, T, how);
            cmp_ref_states(what, &st, &rs);
        }
    }
    free(u); free(out); free(rout);
    hs_free(&st); hs_free(&st0); rs_free(&rs);
}

/* nwin prefills of lens[0..nwin-1] tokens carrying the state == the
 * reference over the whole sequence, and == one GPU prefill over it. */
static void test_windows(int batch, int nwin, const int *lens, uint64_t seed)
{
    int T = 0;
    for (int w = 0; w < nwin; ++w) T += lens[w];
    float *u = FALLOC(n_u(batch, T)), *split = FALLOC(n_out(batch, T)), *whole = FALLOC(n_out(batch, T));
    float *uw = FALLOC(n_u(batch, T)), *ow = FALLOC(n_out(batch, T));
    double *rout = DALLOC_H(n_out(batch, T));
    hstate st0 = hs_new(batch), st = hs_new(batch), stw = hs_new(batch);
    rstate rs = rs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&st0, seed + 1, &st, &stw);
    char desc[96] = "", what[240];
    for (int w = 0, len = 0; w < nwin; ++w)
        len += snprintf(desc + len, sizeof desc - (size_t)len, w ? "+%d" : "%d", lens[w]);
    mg_status s = MG_OK;
    for (int w = 0, t0 = 0; w < nwin && s == MG_OK; t0 += lens[w], ++w) {
        const int L = lens[w];
        for (int b = 0; b < batch; ++b)
            memcpy(uw + n_u(b, L), u + n_u(b, T) + n_u(1, t0), n_u(1, L) * sizeof(float));
        s = gpu_prefill(batch, L, uw, ow, &st);
        for (int b = 0; b < batch && s == MG_OK; ++b)
            memcpy(split + n_out(b, T) + n_out(1, t0), ow + n_out(b, L), n_out(1, L) * sizeof(float));
    }
    mg_status s3 = gpu_prefill(batch, T, u, whole, &stw);
    if (!mg_tap_ok(s == MG_OK && s3 == MG_OK, "windows b=%d: prefills %s and one prefill of %d run", batch, desc, T)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        snprintf(what, sizeof what, "windows %s vs reference %d", desc, T);
        cmp_ref_prefill(what, batch, T, u, &st0, split, &st, rout, &rs);
        snprintf(what, sizeof what, "windows %s vs one prefill of %d: out", desc, T);
        cmp_gpu(what, split, whole, n_out(batch, T));
        snprintf(what, sizeof what, "windows %s vs one prefill of %d", desc, T);
        cmp_gpu_states(what, &st, &stw);
    }
    free(u); free(split); free(whole); free(uw); free(ow); free(rout);
    hs_free(&st0); hs_free(&st); hs_free(&stw); rs_free(&rs);
}

/* T decode steps from a random state == one prefill over the T tokens. */
static void test_decode(int batch, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *dout = FALLOC(n_out(batch, T));
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    hstate pst = hs_new(batch), dst = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&pst, seed + 1, &dst, NULL);
    mg_status s = gpu_prefill(batch, T, u, pout, &pst);

    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout_t = mg_tap_dalloc(n_out(batch, 1));
    float *ds[NST];
    hs_dev(&dst, batch, ds);
    for (int t = 0; t < T && s == MG_OK; ++t) {
        step_in(ut, u, batch, T, t);
        mg_tap_up(du, ut, n_u(batch, 1));
        s = model_decode_step(model, batch, du, dout_t, ds[0], ds[1], ds[2], ds[3]);
        if (s != MG_OK) break;
        mg_tap_down(ot, dout_t, n_out(batch, 1));
        step_out(dout, ot, batch, T, t);
    }
    if (s == MG_OK)
        for (int i = 0; i < NST; ++i) mg_tap_down(dst.s[i], ds[i], st_floats(i, batch));
    char what[160];
    if (!mg_tap_ok(s == MG_OK, "decode: %d steps of batch %d and prefill run", T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        snprintf(what, sizeof what, "decode x%d vs prefill %d: out (every step)", T, T);
        cmp_gpu(what, dout, pout, n_out(batch, T));
        snprintf(what, sizeof what, "decode x%d vs prefill %d", T, T);
        cmp_gpu_states(what, &dst, &pst);
    }
    mg_dev_free(du); mg_dev_free(dout_t);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(u); free(pout); free(dout); free(ut); free(ot);
    hs_free(&pst); hs_free(&dst);
}

/* Determinism: identical calls give identical bits; NULL states == zero states. */
static void test_determinism(int batch, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *o1 = FALLOC(n_out(batch, T)), *o2 = FALLOC(n_out(batch, T));
    float *o3 = FALLOC(n_out(batch, T));
    hstate s1st = hs_new(batch), s2st = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&s1st, seed + 1, &s2st, NULL);
    mg_status s1 = gpu_prefill(batch, T, u, o1, &s1st);
    mg_status s2 = gpu_prefill(batch, T, u, o2, &s2st);
    int same = s1 == MG_OK && s2 == MG_OK && memcmp(o1, o2, n_out(batch, T) * sizeof(float)) == 0;
    for (int i = 0; i < NST && same; ++i)
        same = memcmp(s1st.s[i], s2st.s[i], st_floats(i, batch) * sizeof(float)) == 0;
    mg_tap_ok(same, "deterministic: two identical prefills (b=%d T=%d) give bit-identical out and states", batch, T);
    hs_zero(&s1st);
    s1 = gpu_prefill(batch, T, u, o1, &s1st);
    s2 = gpu_prefill(batch, T, u, o3, NULL);
    mg_tap_ok(s1 == MG_OK && s2 == MG_OK && memcmp(o1, o3, n_out(batch, T) * sizeof(float)) == 0,
           "fresh start: NULL states give the same bits as zero states");
    free(u); free(o1); free(o2); free(o3);
    hs_free(&s1st); hs_free(&s2st);
}

/* Burn-in: last-step output and final states vs prefill (and the reference),
 * from a random state (with_state) or a fresh start (NULL states). */
/* burn_in's final states (bst) against the reference's (ref) or, when ref
 * is NULL, prefill's (gpu): "burn_in b=B T=T vs VS: <state>". */
static void cmp_burn_in_states(int batch, int T, const char *vs, const hstate *bst, const rstate *ref,
                               const hstate *gpu)
{
    char what[200];
    snprintf(what, sizeof what, "burn_in b=%d T=%d vs %s", batch, T, vs);
    cmp_states(what, bst, ref, gpu);
}

static void test_burn_in(int batch, int T, int with_state, int with_ref, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *last = FALLOC(n_out(batch, 1));
    float *plast = FALLOC(n_out(batch, 1));
    hstate st0 = hs_new(batch), pst = hs_new(batch), bst = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&st0, seed + 1, &pst, &bst);
    const char *how = with_state ? "from a random state" : "fresh start (NULL states)";
    mg_status s1 = gpu_prefill(batch, T, u, pout, with_state ? &pst : NULL);

    float *du = mg_tap_dalloc(n_u(batch, T)), *dlast = mg_tap_dalloc(n_out(batch, 1));
    float *ds[NST];
    mg_tap_up(du, u, n_u(batch, T));
    hs_dev(with_state ? &bst : NULL, batch, ds);
    mg_status s2 = model_burn_in(model, batch, T, du, dlast, ds[0], ds[1], ds[2], ds[3]);
    if (s2 == MG_OK) {
        mg_tap_down(last, dlast, n_out(batch, 1));
        if (with_state)
            for (int i = 0; i < NST; ++i) mg_tap_down(bst.s[i], ds[i], st_floats(i, batch));
    }
    char what[200];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "burn_in b=%d T=%d %s and prefill run", batch, T, how)) {
        mg_tap_diag("%s: %s", mg_status_name(s2 != MG_OK ? s2 : s1), mg_last_error());
    } else {
        for (int b = 0; b < batch; ++b)
            memcpy(plast + n_out(b, 1), pout + n_out(b, T) + n_out(1, T - 1), n_out(1, 1) * sizeof(float));
        snprintf(what, sizeof what, "burn_in b=%d T=%d %s vs prefill's last step: last_out", batch, T, how);
        cmp_gpu(what, last, plast, n_out(batch, 1));
        if (with_state) cmp_burn_in_states(batch, T, "prefill", &bst, NULL, &pst);
        if (with_ref) {
            double *rout = DALLOC_H(n_out(batch, T)), *rlast = DALLOC_H(n_out(batch, 1));
            rstate rs = rs_new(batch);
            ref_prefill(batch, T, u, with_state ? &st0 : NULL, rout, with_state ? &rs : NULL);
            for (int b = 0; b < batch; ++b)
                memcpy(rlast + n_out(b, 1), rout + n_out(b, T) + n_out(1, T - 1), n_out(1, 1) * sizeof(double));
            snprintf(what, sizeof what, "burn_in b=%d T=%d %s vs reference: last_out", batch, T, how);
            cmp_ref(what, last, rlast, n_out(batch, 1));
            if (with_state) cmp_burn_in_states(batch, T, "reference", &bst, &rs, NULL);
            free(rout); free(rlast); rs_free(&rs);
        }
    }
    mg_dev_free(du); mg_dev_free(dlast);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(u); free(pout); free(last); free(plast);
    hs_free(&st0); hs_free(&pst); hs_free(&bst);
}

/* Decode graph: T replays == T eager decode steps, bit for bit (out of every
 * step, the four final states), from the same random state. */
static void test_decode_graph(int batch, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T));
    float *oe = FALLOC(n_out(batch, T)), *og = FALLOC(n_out(batch, T));
    hstate st0 = hs_new(batch), ste = hs_new(batch), stg = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand(&st0, seed + 1);
    /* eager buffers / graph buffers (fixed pointers) */
    float *due = mg_tap_dalloc(n_u(batch, 1)), *doe = mg_tap_dalloc(n_out(batch, 1));
    float *dug = mg_tap_dalloc(n_u(batch, 1)), *dog = mg_tap_dalloc(n_out(batch, 1));
    float *dse[NST], *dsg[NST];
    hs_dev(&st0, batch, dse);
    hs_dev(&st0, batch, dsg);
    if (cudaMemset(dug, 0, n_u(batch, 1) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");   /* warm-up input */
    model_graph *g = NULL;
    mg_status s = model_decode_graph_create(model, batch, dug, dog, dsg[0], dsg[1], dsg[2], dsg[3], &g);
    if (!mg_tap_ok(s == MG_OK, "decode_graph_create batch=%d", batch)) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    /* creation left the states untouched */
    if (s == MG_OK) {
        int untouched = 1;
        for (int i = 0; i < NST; ++i) {
            mg_tap_down(stg.s[i], dsg[i], st_floats(i, batch));
            untouched = untouched && memcmp(stg.s[i], st0.s[i], st_floats(i, batch) * sizeof(float)) == 0;
        }
        mg_tap_ok(untouched, "decode_graph_create leaves ssm, k_prev, v_prev and angle untouched");
    }
    s = decode_graph_steps(g, batch, T, u, due, doe, dse, dug, dog, oe, og, s);
    if (g) {
        if (mg_tap_ok(s == MG_OK, "decode graph: %d replays and %d eager steps of batch %d run", T, T, batch)) {
            int same_st = 1;
            for (int i = 0; i < NST; ++i) {
                mg_tap_down(ste.s[i], dse[i], st_floats(i, batch));
                mg_tap_down(stg.s[i], dsg[i], st_floats(i, batch));
                if (memcmp(ste.s[i], stg.s[i], st_floats(i, batch) * sizeof(float)) != 0) {
                    mg_err e = mg_compare_f32f32(stg.s[i], ste.s[i], st_floats(i, batch));
                    mg_tap_diag("graph vs eager %s: rel_l2 %.3e", st_name[i], e.rel_l2);
                    same_st = 0;
                }
            }
            int same_out = memcmp(oe, og, n_out(batch, T) * sizeof(float)) == 0;
            if (!same_out) { mg_err e = mg_compare_f32f32(og, oe, n_out(batch, T)); mg_tap_diag("graph vs eager out: rel_l2 %.3e", e.rel_l2); }
            mg_tap_ok(same_out, "decode graph replay == eager decode: out of every step, bit-identical");
            mg_tap_ok(same_st, "decode graph replay == eager decode: final ssm, k_prev, v_prev, angle bit-identical");
        } else {
            mg_tap_diag("%s", mg_last_error());
        }
        model_decode_graph_destroy(g);
    }
    mg_dev_free(due); mg_dev_free(doe); mg_dev_free(dug); mg_dev_free(dog);
    for (int i = 0; i < NST; ++i) { mg_dev_free(dse[i]); mg_dev_free(dsg[i]); }
    free(u); free(oe); free(og);
    hs_free(&st0); hs_free(&ste); hs_free(&stg);
}

#if MODEL_HAS_CHUNKED_SCAN
static void set_scan(int choice)
{
    if (model_set_scan(model, choice) != MG_OK) mg_tap_bail(MODEL_NAME "_set_scan");
}

/* The chunked scan (forced) vs the f64 reference and vs the sequential scan
 * (forced), from a random nonzero initial state (ssm, k_prev, v_prev, angle). */
static void test_chunked_vs_sequential(int batch, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *oc = FALLOC(n_out(batch, T)), *os = FALLOC(n_out(batch, T));
    double *rout = DALLOC_H(n_out(batch, T));
    hstate st0 = hs_new(batch), sc = hs_new(batch), ss = hs_new(batch);
    rstate rs = rs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&st0, seed + 1, &sc, &ss);
    set_scan(MODEL_SCAN_CHUNKED);
    mg_status s1 = gpu_prefill(batch, T, u, oc, &sc);
    set_scan(MODEL_SCAN_SEQUENTIAL);
    mg_status s2 = gpu_prefill(batch, T, u, os, &ss);
    set_scan(MODEL_SCAN_SPEC);
    char what[200];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "chunked and sequential prefill b=%d T=%d (chunk %d) run", batch, T,
                MODEL_SCAN_CHUNK)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        snprintf(what, sizeof what, "chunked b=%d T=%d vs reference", batch, T);
        cmp_ref_prefill(what, batch, T, u, &st0, oc, &sc, rout, &rs);
        snprintf(what, sizeof what, "chunked vs sequential b=%d T=%d: out", batch, T);
        cmp_gpu_tol(what, oc, os, n_out(batch, T), MODEL_CHUNK_VS_SEQ_TOL);
        snprintf(what, sizeof what, "chunked vs sequential b=%d T=%d", batch, T);
        cmp_states_tol(what, &sc, NULL, &ss, MODEL_CHUNK_VS_SEQ_TOL);
    }
    free(u); free(oc); free(os); free(rout);
    hs_free(&st0); hs_free(&sc); hs_free(&ss); rs_free(&rs);
}
#endif

static void test_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH), T = imin(3, MAX_SEQ_LEN);
    const size_t nu = n_u(B, T), no = n_out(B, T);
    size_t ns_tot = nu + no + 4;
    float *du = mg_tap_dalloc(nu), *dout = mg_tap_dalloc(no + 4), *ds[NST];
    for (int i = 0; i < NST; ++i) {
        ds[i] = mg_tap_dalloc(st_floats(i, B) + 4);
        ns_tot += st_floats(i, B) + 4;
    }
    float *sent = FALLOC(ns_tot), *back = FALLOC(ns_tot);
    for (size_t i = 0; i < ns_tot; ++i) sent[i] = 12345.0f + (float)(i % 97);
    memset(back, 0, ns_tot * sizeof(float));
    mg_tap_up(du, sent, nu);
    mg_tap_up(dout, sent, no + 4);
    for (int i = 0; i < NST; ++i) mg_tap_up(ds[i], sent, st_floats(i, B) + 4);
    float *s0 = ds[0], *s1 = ds[1], *s2 = ds[2], *s3 = ds[3];

    mg_tap_expect_status(model_prefill(NULL, B, T, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill with a NULL model");
    mg_tap_expect_status(model_prefill(model, 0, T, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill batch = 0");
    mg_tap_expect_status(model_prefill(model, MAX_BATCH + 1, T, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_prefill(model, B, 0, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill seqlen = 0");
    mg_tap_expect_status(model_prefill(model, B, MAX_SEQ_LEN + 1, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_prefill(model, B, T, NULL, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill u = NULL");
    mg_tap_expect_status(model_prefill(model, B, T, du, NULL, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill out = NULL");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, NULL, s1, s2, s3), MG_ERR_INVALID_ARG, "prefill states without ssm");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, NULL, s2, s3), MG_ERR_INVALID_ARG, "prefill states without k_prev");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, s1, NULL, s3), MG_ERR_INVALID_ARG, "prefill states without v_prev");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, s1, s2, NULL), MG_ERR_INVALID_ARG, "prefill states without angle");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, NULL, NULL, NULL, s3), MG_ERR_INVALID_ARG, "prefill angle state only");
    mg_tap_expect_status(model_prefill(model, B, T, du + 1, dout, s0, s1, s2, s3), MG_ERR_ALIGNMENT, "prefill misaligned u");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout + 1, s0, s1, s2, s3), MG_ERR_ALIGNMENT, "prefill misaligned out");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0 + 1, s1, s2, s3), MG_ERR_ALIGNMENT, "prefill misaligned ssm");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, s1 + 2, s2, s3), MG_ERR_ALIGNMENT, "prefill misaligned k_prev");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, s1, s2 + 1, s3), MG_ERR_ALIGNMENT, "prefill misaligned v_prev");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, s0, s1, s2, s3 + 3), MG_ERR_ALIGNMENT, "prefill misaligned angle");
    mg_tap_expect_status(model_decode_step(model, B, du, dout, NULL, NULL, NULL, NULL), MG_ERR_INVALID_ARG, "decode_step without states");
    mg_tap_expect_status(model_decode_step(model, B, du, dout, s0, s1, s2, NULL), MG_ERR_INVALID_ARG, "decode_step without angle");
    mg_tap_expect_status(model_decode_step(model, 0, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "decode_step batch = 0");
    mg_tap_expect_status(model_decode_step(model, MAX_BATCH + 1, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "decode_step batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_burn_in(NULL, B, T, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in with a NULL model");
    mg_tap_expect_status(model_burn_in(model, B, T, du, NULL, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in last_out = NULL");
    mg_tap_expect_status(model_burn_in(model, B, T, NULL, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in u = NULL");
    mg_tap_expect_status(model_burn_in(model, 0, T, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in batch = 0");
    mg_tap_expect_status(model_burn_in(model, B, 0, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in seqlen = 0");
    mg_tap_expect_status(model_burn_in(model, B, MAX_SEQ_LEN + 1, du, dout, s0, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_burn_in(model, B, T, du, dout, s0, s1, s2, NULL), MG_ERR_INVALID_ARG, "burn_in states without angle");
    mg_tap_expect_status(model_burn_in(model, B, T, du, dout, NULL, s1, s2, s3), MG_ERR_INVALID_ARG, "burn_in states without ssm");
    mg_tap_expect_status(model_burn_in(model, B, T, du, dout + 1, s0, s1, s2, s3), MG_ERR_ALIGNMENT, "burn_in misaligned last_out");
    mg_tap_expect_status(model_burn_in(model, B, T, du, dout, s0, s1, s2 + 1, s3), MG_ERR_ALIGNMENT, "burn_in misaligned v_prev");
    {
        model_graph *g = NULL;
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, NULL, NULL, NULL, NULL, &g), MG_ERR_INVALID_ARG, "decode_graph_create without states");
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, s0, s1, NULL, s3, &g), MG_ERR_INVALID_ARG, "decode_graph_create without v_prev");
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, s0, s1, s2, s3, NULL), MG_ERR_INVALID_ARG, "decode_graph_create graph pointer NULL");
        mg_tap_expect_status(model_decode_graph_create(NULL, B, du, dout, s0, s1, s2, s3, &g), MG_ERR_INVALID_ARG, "decode_graph_create with a NULL model");
        mg_tap_expect_status(model_decode_graph_create(model, MAX_BATCH + 1, du, dout, s0, s1, s2, s3, &g), MG_ERR_INVALID_ARG, "decode_graph_create batch = MAX_BATCH + 1");
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, s0, s1, s2, s3 + 1, &g), MG_ERR_ALIGNMENT, "decode_graph_create misaligned angle");
        mg_tap_ok(g == NULL, "failed decode_graph_create calls leave the graph pointer NULL");
        mg_tap_expect_status(model_decode_graph_launch(NULL), MG_ERR_INVALID_ARG, "decode_graph_launch NULL");
        model_decode_graph_destroy(NULL);
    }
    mg_tap_expect_status(model_set_weights(model, NULL, (size_t)MODEL_WEIGHTS_FLOATS), MG_ERR_INVALID_ARG, "set_weights NULL blob");
    mg_tap_expect_status(model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS - 1), MG_ERR_SIZE, "set_weights one float short");
    mg_tap_expect_status(model_set_weights(model, d_blob + 1, (size_t)MODEL_WEIGHTS_FLOATS), MG_ERR_ALIGNMENT, "set_weights misaligned blob");

    int untouched = 1;
    mg_tap_down(back, dout, no + 4);
    untouched = memcmp(back, sent, (no + 4) * sizeof(float)) == 0;
    for (int i = 0; i < NST; ++i) {
        mg_tap_down(back, ds[i], st_floats(i, B) + 4);
        untouched = untouched && memcmp(back, sent, (st_floats(i, B) + 4) * sizeof(float)) == 0;
    }
    mg_tap_ok(untouched, "bad calls left out, ssm, k_prev, v_prev and angle untouched");
    /* The failed set_weights calls kept the weights: a valid call still works. */
    mg_status s = model_prefill(model, B, T, du, dout, NULL, NULL, NULL, NULL);
    mg_tap_ok(s == MG_OK && cudaDeviceSynchronize() == cudaSuccess, "a valid call after the bad ones succeeds");
    mg_dev_free(du); mg_dev_free(dout);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(sent); free(back);
}

/* ---------------------------------------------------------------- episode starts */
/* prefill_starts / burn_in_starts (doc/math.md section 9) against the
 * reference's _ex entry points, decode steps with the reset mask, and the
 * maskless call. */

/* The start mask [batch][T] of a pattern: 0 none (all zero); 1 mixed:
 * stream 0 starts at t = 0, mid-chunk, on two consecutive tokens at a
 * chunk edge (CHUNK - 1, CHUNK), at the scan's staging edge, on the last
 * token of a chunk and on the last token of the call; stream 1 has none;
 * stream 2 starts at t = 1, at 2 CHUNK and at 2 CHUNK + 1; stream b > 2 at
 * (b * 7) % T (values 1 and 255: any nonzero byte starts an episode); 2
 * every stream: at t = 0, mid-sequence and on its last token. */
static void start_mask(unsigned char *m, int batch, int T, int pattern)
{
    memset(m, 0, (size_t)batch * T);
    if (pattern == 0) return;
    for (int b = 0; b < batch; ++b) {
        unsigned char *r = m + (size_t)b * T;
        if (pattern == 2) {
            r[0] = 1;
            r[T / 2] = 1;
            r[T - 1] = 255;
            continue;
        }
        const int at0[] = { 0, CHUNK / 2 + 1, CHUNK - 1, CHUNK, SCAN_TCHUNK, 2 * CHUNK - 1, T - 1 };
        const int at2[] = { 1, 2 * CHUNK, 2 * CHUNK + 1 };
        if (b == 0) {
            for (size_t i = 0; i < sizeof at0 / sizeof at0[0]; ++i)
                if (at0[i] >= 0 && at0[i] < T) r[at0[i]] = (unsigned char)(i % 2 ? 255 : 1);
        } else if (b == 2) {
            for (size_t i = 0; i < sizeof at2 / sizeof at2[0]; ++i)
                if (at2[i] < T) r[at2[i]] = 1;
        } else if (b > 2) {
            r[(b * 7) % T] = 255;
        }
    }
}

static unsigned char *up_starts(const unsigned char *m, int batch, int T)
{
    unsigned char *d = dalloc_bytes((size_t)batch * T);
    if (cudaMemcpy(d, m, (size_t)batch * T, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy starts");
    return d;
}

/* GPU prefill_starts (last_only: burn_in_starts) on host data (gpu_call). */
static mg_status gpu_prefill_starts(int batch, int T, const float *u, float *out, hstate *st,
                                    const unsigned char *dstart, int last_only)
{
    return gpu_call(batch, T, u, out, st, last_only ? CALL_BURN_IN_STARTS : CALL_PREFILL_STARTS, dstart);
}

/* The reference with a start mask (mg_ref_mamba3_forward_ex), from st0. */
static void ref_prefill_starts(int batch, int T, const float *u, const hstate *st0, const unsigned char *mask,
                               double *out, rstate *rs)
{
    for (int i = 0; i < NST; ++i)
        for (size_t j = 0; j < st_floats(i, batch); ++j) rs->s[i][j] = st0->s[i][j];
    mg_ref_seqs o;
    memset(&o, 0, sizeof o);
    o.start = mask;
    if (mg_ref_mamba3_forward_ex(&dims, &lay, blob, batch, T, u, out, rs->s[0], rs->s[1], rs->s[2], rs->s[3], &o) !=
        MG_OK)
        mg_tap_bail("reference forward_ex");
}

/* prefill_starts (and burn_in_starts) from a random state with the mask
 * of `pattern` vs the reference: out (burn-in: the last step) and the
 * final states. path names the scan the caller set. */
static void test_prefill_starts(int batch, int T, int pattern, const char *path, uint64_t seed)
{
    static const char *const pname[3] = { "no starts", "mixed starts", "every stream starts" };
    float *u = FALLOC(n_u(batch, T)), *out = FALLOC(n_out(batch, T)), *last = FALLOC(n_out(batch, 1));
    double *rout = DALLOC_H(n_out(batch, T)), *rlast = DALLOC_H(n_out(batch, 1));
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)batch * T);
    hstate st0 = hs_new(batch), st = hs_new(batch), bst = hs_new(batch);
    rstate rs = rs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&st0, seed + 1, &st, &bst);
    start_mask(mask, batch, T, pattern);
    unsigned char *dmask = up_starts(mask, batch, T);
    mg_status s1 = gpu_prefill_starts(batch, T, u, out, &st, dmask, 0);
    mg_status s2 = gpu_prefill_starts(batch, T, u, last, &bst, dmask, 1);
    char what[256];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "prefill_starts and burn_in_starts b=%d T=%d (%s, %s) run", batch, T,
                   pname[pattern], path)) {
        mg_tap_diag("%s: %s", mg_status_name(s1 != MG_OK ? s1 : s2), mg_last_error());
    } else {
        ref_prefill_starts(batch, T, u, &st0, mask, rout, &rs);
        snprintf(what, sizeof what, "prefill_starts b=%d T=%d (%s, %s) vs reference_ex: out", batch, T,
                 pname[pattern], path);
        cmp_ref(what, out, rout, n_out(batch, T));
        snprintf(what, sizeof what, "prefill_starts b=%d T=%d (%s, %s) vs reference_ex", batch, T, pname[pattern],
                 path);
        cmp_ref_states(what, &st, &rs);
        for (int b = 0; b < batch; ++b)
            memcpy(rlast + n_out(b, 1), rout + n_out(b, T) + n_out(1, T - 1), n_out(1, 1) * sizeof(double));
        snprintf(what, sizeof what, "burn_in_starts b=%d T=%d (%s, %s) vs reference_ex: last_out", batch, T,
                 pname[pattern], path);
        cmp_ref(what, last, rlast, n_out(batch, 1));
        snprintf(what, sizeof what, "burn_in_starts b=%d T=%d (%s, %s) vs reference_ex", batch, T, pname[pattern],
                 path);
        cmp_ref_states(what, &bst, &rs);
    }
    mg_dev_free(dmask);
    free(u); free(out); free(last); free(rout); free(rlast); free(mask);
    hs_free(&st0); hs_free(&st); hs_free(&bst); rs_free(&rs);
}

/* A masked prefill == T decode steps with the reset mask of each step
 * taken from the start column t (GPU only: decode vs prefill tolerance). */
static void test_starts_vs_decode_reset(int batch, int T, const char *path, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *dout = FALLOC(n_out(batch, T));
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)batch * T), *col = (unsigned char *)mg_tap_malloc((size_t)batch);
    hstate pst = hs_new(batch), dst = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&pst, seed + 1, &dst, NULL);
    start_mask(mask, batch, T, 1);
    unsigned char *dmask = up_starts(mask, batch, T), *dcol = dalloc_bytes((size_t)batch);
    mg_status s = gpu_prefill_starts(batch, T, u, pout, &pst, dmask, 0);
    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout_t = mg_tap_dalloc(n_out(batch, 1));
    float *ds[NST];
    hs_dev(&dst, batch, ds);
    for (int t = 0; t < T && s == MG_OK; ++t) {
        step_in(ut, u, batch, T, t);
        mg_tap_up(du, ut, n_u(batch, 1));
        for (int b = 0; b < batch; ++b) col[b] = mask[(size_t)b * T + t];
        up_mask(dcol, col, batch);
        s = model_decode_step_reset(model, batch, du, dout_t, DEV_STATES(ds), dcol);
        if (s != MG_OK) break;
        mg_tap_down(ot, dout_t, n_out(batch, 1));
        step_out(dout, ot, batch, T, t);
    }
    if (s == MG_OK)
        for (int i = 0; i < NST; ++i) mg_tap_down(dst.s[i], ds[i], st_floats(i, batch));
    char what[200];
    if (!mg_tap_ok(s == MG_OK, "prefill_starts (%s) and %d decode_step_reset steps of batch %d run", path, T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        snprintf(what, sizeof what, "decode_step_reset x%d vs prefill_starts %d (%s): out (every step)", T, T, path);
        cmp_gpu(what, dout, pout, n_out(batch, T));
        snprintf(what, sizeof what, "decode_step_reset x%d vs prefill_starts %d (%s)", T, T, path);
        cmp_gpu_states(what, &dst, &pst);
    }
    mg_dev_free(du); mg_dev_free(dout_t); mg_dev_free(dmask); mg_dev_free(dcol);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(u); free(pout); free(dout); free(ut); free(ot); free(mask); free(col);
    hs_free(&pst); hs_free(&dst);
}

/* An all-zero mask (and a NULL one) == the maskless prefill and burn-in,
 * bit for bit (out and final states). */
static void test_starts_zero_mask(int batch, int T, const char *path, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *oa = FALLOC(n_out(batch, T)), *ob = FALLOC(n_out(batch, T));
    float *oc = FALLOC(n_out(batch, T));
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)batch * T);
    hstate st0 = hs_new(batch), sa = hs_new(batch), sb = hs_new(batch), sc = hs_new(batch);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    hs_rand_copies(&st0, seed + 1, &sa, &sb);
    hs_copy(&sc, &st0);
    start_mask(mask, batch, T, 0);
    unsigned char *dmask = up_starts(mask, batch, T);
    mg_status s = gpu_prefill(batch, T, u, oa, &sa);
    if (s == MG_OK) s = gpu_prefill_starts(batch, T, u, ob, &sb, dmask, 0);
    if (s == MG_OK) s = gpu_prefill_starts(batch, T, u, oc, &sc, NULL, 0);
    int same = s == MG_OK && memcmp(oa, ob, n_out(batch, T) * sizeof(float)) == 0;
    for (int i = 0; i < NST && same; ++i) same = memcmp(sa.s[i], sb.s[i], st_floats(i, batch) * sizeof(float)) == 0;
    if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    mg_tap_ok(same, "prefill_starts with an all-zero mask == prefill (%s, b=%d T=%d): out and states bit-identical",
              path, batch, T);
    same = s == MG_OK && memcmp(oa, oc, n_out(batch, T) * sizeof(float)) == 0;
    for (int i = 0; i < NST && same; ++i) same = memcmp(sa.s[i], sc.s[i], st_floats(i, batch) * sizeof(float)) == 0;
    mg_tap_ok(same, "prefill_starts with a NULL mask == prefill (%s): bit-identical", path);
    /* burn-in: the zero mask's last step == burn_in's */
    float *la = FALLOC(n_out(batch, 1)), *lb = FALLOC(n_out(batch, 1));
    hs_copy(&sa, &st0);
    hs_copy(&sb, &st0);
    float *du = mg_tap_dalloc(n_u(batch, T)), *dl = mg_tap_dalloc(n_out(batch, 1));
    float *ds[NST];
    hs_dev(&sa, batch, ds);
    mg_tap_up(du, u, n_u(batch, T));
    s = model_burn_in(model, batch, T, du, dl, DEV_STATES(ds));
    if (s == MG_OK) mg_tap_down(la, dl, n_out(batch, 1));
    if (s == MG_OK) s = gpu_prefill_starts(batch, T, u, lb, &sb, dmask, 1);
    mg_tap_ok(s == MG_OK && memcmp(la, lb, n_out(batch, 1) * sizeof(float)) == 0,
              "burn_in_starts with an all-zero mask == burn_in (%s): last_out bit-identical", path);
    mg_dev_free(du); mg_dev_free(dl); mg_dev_free(dmask);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(u); free(oa); free(ob); free(oc); free(la); free(lb); free(mask);
    hs_free(&st0); hs_free(&sa); hs_free(&sb); hs_free(&sc);
}

/* Bad prefill_starts / burn_in_starts calls: the status of the plain
 * calls' checks, nothing launched (out and states untouched). */
static void test_starts_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH), T = imin(3, MAX_SEQ_LEN);
    const size_t nu = n_u(B, T), no = n_out(B, T);
    float *du = mg_tap_dalloc(nu), *dout = mg_tap_dalloc(no), *ds[NST];
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)B * T);
    start_mask(mask, B, T, 2);
    unsigned char *dm = up_starts(mask, B, T);
    size_t ns_tot = no;
    for (int i = 0; i < NST; ++i) {
        ds[i] = mg_tap_dalloc(st_floats(i, B));
        ns_tot += st_floats(i, B);
    }
    float *sent = FALLOC(ns_tot), *back = FALLOC(ns_tot);
    for (size_t i = 0; i < ns_tot; ++i) sent[i] = 4321.0f + (float)(i % 89);
    mg_tap_up(dout, sent, no);
    for (int i = 0; i < NST; ++i) mg_tap_up(ds[i], sent, st_floats(i, B));
    float *s0 = ds[0], *s1 = ds[1], *s2 = ds[2], *s3 = ds[3];
    mg_tap_expect_status(model_prefill_starts(NULL, B, T, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts with a NULL model");
    mg_tap_expect_status(model_prefill_starts(model, 0, T, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts batch = 0");
    mg_tap_expect_status(model_prefill_starts(model, MAX_BATCH + 1, T, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_prefill_starts(model, B, 0, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts seqlen = 0");
    mg_tap_expect_status(model_prefill_starts(model, B, MAX_SEQ_LEN + 1, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_prefill_starts(model, B, T, NULL, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts u = NULL");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, NULL, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts out = NULL");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, dout, s0, NULL, s2, s3, dm), MG_ERR_INVALID_ARG, "prefill_starts states without k_prev");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, dout, s0, s1, s2, s3 + 1, dm), MG_ERR_ALIGNMENT, "prefill_starts misaligned angle");
    mg_tap_expect_status(model_burn_in_starts(NULL, B, T, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "burn_in_starts with a NULL model");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du, NULL, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "burn_in_starts last_out = NULL");
    mg_tap_expect_status(model_burn_in_starts(model, B, 0, du, dout, s0, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "burn_in_starts seqlen = 0");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du, dout, NULL, s1, s2, s3, dm), MG_ERR_INVALID_ARG, "burn_in_starts states without ssm");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du + 1, dout, s0, s1, s2, s3, dm), MG_ERR_ALIGNMENT, "burn_in_starts misaligned u");
    /* a mask in host memory the device cannot read */
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, dout, s0, s1, s2, s3, mask), MG_ERR_INVALID_ARG, "prefill_starts with an unregistered host mask");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du, dout, s0, s1, s2, s3, mask), MG_ERR_INVALID_ARG, "burn_in_starts with an unregistered host mask");
    int untouched = 1;
    mg_tap_down(back, dout, no);
    untouched = memcmp(back, sent, no * sizeof(float)) == 0;
    for (int i = 0; i < NST; ++i) {
        mg_tap_down(back, ds[i], st_floats(i, B));
        untouched = untouched && memcmp(back, sent, st_floats(i, B) * sizeof(float)) == 0;
    }
    mg_tap_ok(untouched, "bad prefill_starts / burn_in_starts calls left out and the states untouched");
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dm);
    for (int i = 0; i < NST; ++i) mg_dev_free(ds[i]);
    free(sent); free(back); free(mask);
}

/* Every case above on one scan path (the caller set it). */
static void test_starts_path(const char *path, int budget, uint64_t seed)
{
    const int b3 = imin(3, MAX_BATCH);
    const int T = imin(MAX_SEQ_LEN, imin(2 * CHUNK + 5, imax(2, budget / 16 / b3)));
    test_prefill_starts(b3, T, 1, path, seed);
    test_prefill_starts(imin(2, MAX_BATCH), imin(MAX_SEQ_LEN, imin(CHUNK + 3, imax(2, budget / 32))), 2, path, seed + 10);
    /* one stream over several chunks (the fused scan's segment form, where it has one) */
    test_prefill_starts(1, imin(MAX_SEQ_LEN, imin(4 * CHUNK + 3, imax(2, budget / 16))), 1, path, seed + 20);
    test_starts_vs_decode_reset(b3, imin(MAX_SEQ_LEN, imin(2 * CHUNK + 5, SCAN_TCHUNK + 9)), path, seed + 30);
    test_starts_zero_mask(b3, imin(MAX_SEQ_LEN, 2 * CHUNK + 5), path, seed + 40);
    test_starts_zero_mask(1, imin(MAX_SEQ_LEN, 4 * CHUNK + 3), path, seed + 50);
}

int main(void)
{
    if (!mg_tap_start()) return 0;
    double scale;
    /* Tokens the CPU reference may process in the whole run. */
    const int budget = mg_tap_budget(REF_BUDGET_MACS, REF_MACS_PER_TOKEN, 16, &scale);
    mg_tap_diag(MODEL_NAME ": D=%d E=%d N=%d P=%d H=%d G=%d S=%d layers=%d in_dim=%d max_batch=%d max_seq_len=%d",
         D_MODEL, MODEL_D_INNER, MODEL_D_STATE, MODEL_HEADDIM, MODEL_N_HEADS,
         MODEL_N_GROUPS, MODEL_N_ANGLES, MODEL_N_LAYERS, IN_DIM, MAX_BATCH, MAX_SEQ_LEN);
    mg_tap_diag("scan kernel %s (chunked kernel: %s, chunk %d), scan_tchunk %d, a_activation %s, outproj_norm %d, precision %s",
         MODEL_SCAN_KERNEL, MODEL_HAS_CHUNKED_SCAN ? "yes" : "no", MODEL_SCAN_CHUNK, SCAN_TCHUNK,
         MODEL_A_ACTIVATION, MODEL_OUTPROJ_NORM, MODEL_PRECISION);
    mg_tap_diag("reference budget: %d tokens (MG_TEST_SCALE=%g)", budget, scale);

    dims = (mg_m3_dims)MODEL_REF_DIMS;
    if (mg_ref_mamba3_layout(&dims, &lay) != MG_OK) mg_tap_bail("mg_ref_mamba3_layout");
    test_param_table();
    fwd_model_start();

    /* Sections (mg_tap_section: MG_TEST_PART / MG_TEST_ONLY can split or
     * narrow the run; by default every one runs, in this order). */
    /* Case A: small batch, a length spanning several chunks and staged time
     * chunks, a multiple of neither, from a random initial state. */
    int ba = imin(2, MAX_BATCH);
    const int ta_want = 4 * CHUNK - 5;
    if (ba * ta_want > budget / 4) ba = 1;
    if (mg_tap_section("prefill")) {
        const int ta = imin(MAX_SEQ_LEN, imin(ta_want, imax(1, budget / 4 / ba)));
        test_prefill(ba, ta, 1, 101);

        /* Case B: batch = MAX_BATCH, fresh start (NULL states). */
        if (MAX_BATCH > ba && MAX_BATCH <= budget / 4) {
            const int tb = imin(MAX_SEQ_LEN, imin(CHUNK + 5, imax(1, budget / 4 / MAX_BATCH)));
            test_prefill(MAX_BATCH, tb, 0, 202);
        } else if (MAX_BATCH > ba) {
            mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)", "prefill batch = MAX_BATCH vs reference");
        } else {
            test_prefill(1, imin(MAX_SEQ_LEN, imin(CHUNK + 5, imax(1, budget / 8))), 0, 202);
        }
    }

    /* Continuation across two calls, then across four (one of length 1). */
    if (mg_tap_section("continuation")) {
        const int bc = imin(2, MAX_BATCH);
        if (MAX_SEQ_LEN >= 2) {
            const int tt = imin(MAX_SEQ_LEN, imin(CHUNK + 5, imax(2, budget / 8 / bc)));
            int lens[2];
            lens[0] = imin(tt - 1, tt / 2 + 1);
            lens[1] = tt - lens[0];
            test_windows(bc, 2, lens, 303);
        } else {
            mg_tap_skip("MAX_SEQ_LEN < 2", "continuation across two prefill calls");
        }
        if (MAX_SEQ_LEN >= 4) {
            const int tt = imin(MAX_SEQ_LEN, imin(2 * CHUNK + 7, imax(4, budget / 8 / bc)));
            int lens[4];
            lens[0] = imax(1, tt / 4 - 1);
            lens[1] = 1;
            lens[2] = imax(1, tt / 4 + 1);
            lens[3] = tt - lens[0] - lens[1] - lens[2];
            if (lens[3] < 1) { lens[3] = 1; lens[0] = tt - 3; lens[2] = 1; }
            test_windows(bc, 4, lens, 313);
        } else {
            mg_tap_skip("MAX_SEQ_LEN < 4", "continuation across four prefill calls");
        }
    }

#if MODEL_HAS_CHUNKED_SCAN
    /* Chunked scan, forced: vs the reference and the sequential scan, at a
     * length of several chunks plus a partial one, and shorter than a chunk;
     * then continuation over four chunked windows vs one chunked call. */
    if (mg_tap_section("chunked")) {
        const int Q = MODEL_SCAN_CHUNK;
        const int bq = imin(2, MAX_BATCH);
        test_chunked_vs_sequential(bq, imin(MAX_SEQ_LEN, imin(3 * Q + 5, imax(2, budget / 8 / bq))), 801);
        test_chunked_vs_sequential(1, imin(MAX_SEQ_LEN, imax(2, Q / 2 + 1)), 802);
        if (MAX_SEQ_LEN >= 4) {
            const int tt = imin(MAX_SEQ_LEN, imin(3 * Q + 11, imax(4, budget / 8 / bq)));
            int lens[4];
            lens[0] = imax(1, tt / 3 + 1);
            lens[1] = 1;
            lens[2] = imax(1, tt / 3 - 1);
            lens[3] = tt - lens[0] - lens[1] - lens[2];
            if (lens[3] < 1) { lens[0] = 1; lens[1] = 1; lens[2] = 1; lens[3] = tt - 3; }
            set_scan(MODEL_SCAN_CHUNKED);
            test_windows(bq, 4, lens, 803);
            set_scan(MODEL_SCAN_SPEC);
        } else {
            mg_tap_skip("MAX_SEQ_LEN < 4", "continuation across four chunked prefill calls");
        }
    }
    {
        /* set_scan rejects an unknown choice */
        mg_tap_expect_status(model_set_scan(model, 7), MG_ERR_INVALID_ARG, "set_scan(7)");
    }
#else
    mg_tap_expect_status(model_set_scan(model, MODEL_SCAN_CHUNKED), MG_ERR_INVALID_ARG,
                  "set_scan(CHUNKED) without the chunked kernel");
#endif

    /* Decode steps vs prefill (GPU only: any length). */
    if (mg_tap_section("decode")) test_decode(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, SCAN_TCHUNK + 3), 404);

    /* A long sequence vs the reference (the angle recurrence over MAX_SEQ_LEN
     * tokens). */
    if (mg_tap_section("long sequence")) {
        if (MAX_SEQ_LEN <= 2 * budget)
            test_prefill(1, MAX_SEQ_LEN, 1, 707);
        else
            mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)",
                        "prefill of MAX_SEQ_LEN tokens vs reference");
    }

    /* Bit-identical reruns. */
    if (mg_tap_section("determinism")) test_determinism(ba, imin(MAX_SEQ_LEN, SCAN_TCHUNK + 3), 505);

    if (mg_tap_section("bad calls")) test_bad_calls();

    /* Burn-in (target network): last step only; from a random state (vs
     * prefill and the reference), a fresh start, and a single token. */
    if (mg_tap_section("burn-in")) {
        const int bb = imin(2, MAX_BATCH);
        const int tb = imin(MAX_SEQ_LEN, imin(2 * CHUNK + 7, imax(1, budget / 8 / bb)));
        test_burn_in(bb, tb, 1, 1, 808);
        test_burn_in(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, imin(CHUNK + 3, imax(1, budget / 16))), 0, 1, 809);
        test_burn_in(imin(3, MAX_BATCH), 1, 1, 0, 810);
    }

    /* Decode CUDA Graph: replay == eager, bit for bit. */
    if (mg_tap_section("decode graph")) {
        test_decode_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 8), 909);
        test_decode_graph(MAX_BATCH, 3, 910);
    }

    /* Prefill CUDA Graph: windows replayed == eager prefill, bit for bit
     * (short windows, and one long enough for the chunked scan at batch 1). */
    if (mg_tap_section("prefill graph")) {
        test_prefill_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 37), 3, 0, 950);
        test_prefill_graph(1, imin(MAX_SEQ_LEN, 3 * MODEL_SCAN_CHUNK + 5), 2, 0, 960);
        test_prefill_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 37), 3, 1, 970);
    }

    /* Decode with a reset mask (the fused single-token kernels up to
     * DEC_MAX_BATCH streams, the prefill kernels above), and its graph. */
    if (mg_tap_section("decode reset")) {
        test_decode_reset(imin(4, MAX_BATCH), 3, "fused decode", 920);
        if (MAX_BATCH > MODEL_DEC_MAX_BATCH) test_decode_reset(MAX_BATCH, 2, "prefill-kernel decode", 921);
        test_decode_graph_reset(imin(5, MAX_BATCH), 6, "fused decode", 940);
        if (MAX_BATCH > MODEL_DEC_MAX_BATCH) test_decode_graph_reset(MAX_BATCH, 5, "prefill-kernel decode", 941);
        test_reset_bad_calls();
    }

    /* Episode starts (prefill_starts, burn_in_starts) on every scan path:
     * vs the reference's _ex forward, vs decode steps with the reset mask,
     * an all-zero mask vs the maskless call; bad calls. */
    if (mg_tap_section("starts")) {
#if MODEL_HAS_CHUNKED_SCAN
        set_scan(MODEL_SCAN_SEQUENTIAL);
        test_starts_path("sequential scan", budget, 960);
        set_scan(MODEL_SCAN_CHUNKED);
        test_starts_path(MODEL_HAS_FUSED_PREFILL ? "fused chunked scan" : "chunked scan", budget, 970);
        set_scan(MODEL_SCAN_SPEC);
#else
        test_starts_path("sequential scan", budget, 960);
#endif
        test_starts_bad_calls();
        test_packed(1006);
        test_packed_from(1007);
        test_packed_bad_calls();
    }

    /* Weights out of the init range (REF(push_ranges): softplus's argument
     * above its threshold, and Mamba-3's a_floor clamp binding): out and
     * final states vs the reference, from a random state, across a chunk
     * boundary. One chunk and a few steps,
     * not more: at DT ~ 22 a head's angle moves ~60 rad a step, and the
     * f32 rounding of that increment (~4e-6 rad) adds up as a random walk
     * in the angle state (about 4e-6 relative at this length in f32,
     * against 1e-5). */
    if (mg_tap_section("pushed weights")) {
        fwd_weights_pushed(4711);
        test_prefill(imin(2, MAX_BATCH), imin(MAX_SEQ_LEN, imin(CHUNK + 5, imax(1, budget / 8 / imin(2, MAX_BATCH)))), 1, 1101);
        fwd_weights_init();
    }

    /* The library's own self-check. */
    if (mg_tap_section("selfcheck")) test_selfcheck(imin(MAX_SEQ_LEN, imin(CHUNK + 9, imax(1, budget / 8))));

    return fwd_end();
}
