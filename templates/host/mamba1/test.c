/*
 * NAME_test.c: TAP test of a generated Mamba-1 library on the GPU
 * against the f64 reference path (runtime/mg_ref_mamba1):
 *   - the parameter table equals the reference's blob layout;
 *   - prefill vs reference (out, final conv_state, final ssm_state), from a
 *     random initial state and from a fresh start, incl. batch = MAX_BATCH
 *     and a length that is not a multiple of the scan's time chunk;
 *   - continuation: prefill T1 then T2 with the state carried equals one
 *     prefill over T1+T2 (and the reference);
 *   - T decode steps equal a prefill over T tokens;
 *   - bad calls return the right status, with a message, and touch nothing;
 *   - two identical prefills give bit-identical results;
 *   - weights out of the init range (mg_ref_mamba1_push_ranges: softplus's
 *     argument above its threshold): out and final states vs the reference;
 *   - NAME_selfcheck passes;
 *   - chunked scan (when the library has it): chunked vs sequential
 *     (rel_l2 <= CHUNK_TOL) and vs the reference, lengths not a multiple of
 *     the chunk, one chunk, many chunks, from a random state; auto dispatch;
 *   - burn-in: last-step output and states vs prefill and the reference;
 *   - decode CUDA Graph: replays bit-identical to eager decode steps.
 *   - decode with a reset mask (none, some, all streams, NULL) on every
 *     decode path == decode with those streams' states zeroed, bit for bit;
 *     the decode graph with a reset buffer changed between replays == eager;
 *     bad reset calls return the documented status and launch nothing.
 *   - episode starts (prefill_starts, burn_in_starts; doc/math.md §9) on the
 *     sequential and the chunked scan: vs the reference's forward_ex with
 *     mixed starts (t = 0, chunk edges, mid-chunk, consecutive tokens, the
 *     last token, streams without) and with every stream starting at one
 *     token: out, final conv and ssm states; chunked vs sequential; burn-in
 *     vs prefill; bit for bit: an all-zero or NULL mask == prefill, starts
 *     at t = 0 == zero initial states, nothing leaks across a start;
 *     decode_step_reset with the start column as reset == prefill_starts
 *     (TOL); the hand split into separate prefill calls (TOL); bad calls.
 *   - fused single-token decode vs the unfused path (within the tolerance;
 *     unfused decode == prefill with seqlen 1, bit for bit).
 *   - single-launch decode (level 2, when the library has it; the default
 *     path of every decode test above) vs the fused path over several steps
 *     at batch 1, a middle batch and MAX_BATCH (out of every step, final
 *     states, within the tolerance), and vs the f64 reference; the decode
 *     graph on both paths.
 * Relative-L2 tolerance MODEL_CHECK_TOL (of the storage precision).
 * Case sizes follow the cost of the CPU reference (MODEL_REF_MACS_PER_TOKEN
 * multiply-adds per token); MG_TEST_SCALE (default 1) scales that budget.
 * Prints "1..0 # SKIP no CUDA device" without a GPU.
 * The library is named through model_alias.h (model_X = NAME_X, MODEL_X =
 * NAME_X), the TAP harness is the runtime's (mg_tap.h).
 */
#include "model_alias.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_cuda.h"
#include "mg_ref_mamba1.h"
#include "mg_tap.h"

#include "fwd_tests.h"   /* part 1: sizes, tolerance, common globals and helpers */

#define REF_BUDGET_MACS 4.0e9                   /* reference work of the whole run at scale 1 */
#define SCAN_CHUNK MODEL_SCAN_CHUNK
#define CHUNK_TOL MODEL_CHUNK_VS_SEQ_TOL      /* chunked vs sequential scan, rel_l2 */

/* ---------------------------------------------------------------- helpers */
static mg_m1_dims dims;
static mg_m1_layout lay;
/* The decode level the cases come back to: the library's default, or the
 * fused path under MG_TEST_NO_CLUSTERS=1 (mg_tap_no_clusters: the
 * single-launch decode's thread-block clusters left out). */
static int dec_default = MODEL_DECODE_DEFAULT;

#if MODEL_HAS_DECODE_SINGLE
/* Under MG_TEST_NO_CLUSTERS=1: the single-launch decode case `what` as a TAP
 * skip with the reason, and 1 (the caller returns); else 0. */
static int skip_single_launch(const char *what)
{
    if (!mg_tap_no_clusters()) return 0;
    mg_tap_skip("MG_TEST_NO_CLUSTERS=1: the single-launch decode runs as thread-block clusters", what);
    return 1;
}
#endif

/* GPU prefill on host data. cs/ss: initial state in, final state out (both
 * NULL: fresh start). Returns the status of the prefill call. */
static mg_status gpu_prefill(int batch, int T, const float *u, float *out, float *cs, float *ss)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *du = mg_tap_dalloc(n_u(batch, T)), *dout = mg_tap_dalloc(n_out(batch, T));
    float *dcs = cs ? mg_tap_dalloc(ncs) : NULL, *dss = ss ? mg_tap_dalloc(nss) : NULL;
    mg_tap_up(du, u, n_u(batch, T));
    if (cs) mg_tap_up(dcs, cs, ncs);
    if (ss) mg_tap_up(dss, ss, nss);
    mg_status s = model_prefill(model, batch, T, du, dout, dcs, dss);
    if (s == MG_OK) {
        mg_tap_down(out, dout, n_out(batch, T));
        if (cs) mg_tap_down(cs, dcs, ncs);
        if (ss) mg_tap_down(ss, dss, nss);
    }
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dcs); mg_dev_free(dss);
    return s;
}

/* Reference prefill: f32 inputs and initial states (NULL: fresh start, no
 * state out), f64 outputs. */
static void ref_prefill(int batch, int T, const float *u, const float *cs0, const float *ss0,
                        double *out, double *cs, double *ss)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    if (cs) for (size_t i = 0; i < ncs; ++i) cs[i] = cs0 ? cs0[i] : 0.0;
    if (ss) for (size_t i = 0; i < nss; ++i) ss[i] = ss0 ? ss0[i] : 0.0;
    if (mg_ref_mamba1_forward(&dims, &lay, blob, batch, T, u, out, cs, ss) != MG_OK) mg_tap_bail("reference forward");
}

static int cmp_gpu(const char *what, const float *got, const float *ref, size_t n)
{
    mg_err e = mg_compare_f32f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e.max_abs, e.rel_l2, e.n);
    return mg_tap_ok(mg_err_ok(&e, TOL), "%s: rel_l2 <= %g", what, TOL);
}

/* A random initial state of `batch` streams, conv ~ N(0, 0.5) (seed) and
 * ssm ~ N(0, 0.5) (seed + 1), in cs0/ss0 and in the copies a and b that
 * two runs from it update. */
static void rand_state2(int batch, uint64_t seed, float *cs0, float *ss0, float *csa, float *ssa, float *csb,
                        float *ssb)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    mg_tap_randn(cs0, ncs, seed, 0.5f);
    mg_tap_randn(ss0, nss, seed + 1, 0.5f);
    memcpy(csa, cs0, ncs * sizeof(float)); memcpy(ssa, ss0, nss * sizeof(float));
    memcpy(csb, cs0, ncs * sizeof(float)); memcpy(ssb, ss0, nss * sizeof(float));
}

/* The last step's out of each stream: out [batch][T][D] -> last [batch][D]
 * (elements of elem bytes: f32 from the GPU, f64 from the reference). */
static void last_step(void *last, const void *out, int batch, int T, size_t elem)
{
    for (int b = 0; b < batch; ++b)
        memcpy((char *)last + n_out(b, 1) * elem, (const char *)out + (n_out(b, T) + n_out(1, T - 1)) * elem,
               n_out(1, 1) * elem);
}

/* The states of n decode runs back from the device: dcs[k], dss[k] into
 * cs[k], ss[k] (ncs, nss floats), k = 0 .. n-1. */
static void down_states(int n, float *const cs[], float *const ss[], float *const dcs[], float *const dss[],
                        size_t ncs, size_t nss)
{
    for (int k = 0; k < n; ++k) { mg_tap_down(cs[k], dcs[k], ncs); mg_tap_down(ss[k], dss[k], nss); }
}

/* A decode check's three comparisons, in this order: got = {out of every
 * step (nout floats), conv_state, ssm_state} of `batch` streams against
 * another GPU run's (gpu), or when gpu is NULL the reference's (ref); named
 * "CASE: out (every step)", "CASE: conv_state", "CASE: ssm_state". */
static void cmp_decode(const char *what_case, size_t nout, int batch, const float *const got[3],
                       const float *const gpu[3], const double *const ref[3])
{
    static const char *const label[3] = { "out (every step)", "conv_state", "ssm_state" };
    const size_t n[3] = { nout, model_conv_state_floats(batch), model_ssm_state_floats(batch) };
    char what[160];
    for (int i = 0; i < 3; ++i) {
        snprintf(what, sizeof what, "%s: %s", what_case, label[i]);
        if (gpu) cmp_gpu(what, got[i], gpu[i], n[i]);
        else cmp_ref(what, got[i], ref[i], n[i]);
    }
}

/* for fwd_tests.h: the reference's functions, the state arguments of a
 * fresh start and of a decode step, a selfcheck report's diag line */
#define REF(x) mg_ref_mamba1_##x
#define NST 2                                   /* states: conv, ssm */
/* Floats of state i (0 conv, 1 ssm) for batch streams, all layers. */
static size_t st_floats(int i, int batch)
{
    return i == 0 ? model_conv_state_floats(batch) : model_ssm_state_floats(batch);
}
#define NO_STATES NULL, NULL
#define DEV_STATES(st) st[0], st[1]
#define REF_FWD_EX(T, u, out, st, o) mg_ref_mamba1_forward_ex(&dims, &lay, blob, 1, T, u, out, st[0], st[1], o)
/* Host states got against the reference's (ref) or another run's (gpu). */
static void cmp_states_any(const char *prefix, int batch, float *const got[], double *const ref[], float *const gpu[])
{
    static const char *const name[NST] = { "conv_state", "ssm_state" };
    char what[256];
    for (int i = 0; i < NST; ++i) {
        snprintf(what, sizeof what, "%s: %s", prefix, name[i]);
        if (ref) cmp_ref(what, got[i], ref[i], st_floats(i, batch));
        else cmp_gpu(what, got[i], gpu[i], st_floats(i, batch));
    }
}
#define CMP_STATES_ANY(prefix, batch, got, ref, gpu) cmp_states_any(prefix, batch, got, ref, gpu)
#define SELFCHECK_DIAG(T, r)                                                                                        \
    mg_tap_diag("selfcheck b=1 T=%d: out rel_l2=%.3e, conv_state rel_l2=%.3e, ssm_state rel_l2=%.3e", T,           \
                r.out.rel_l2, r.conv_state.rel_l2, r.ssm_state.rel_l2)

#include "fwd_tests.h"   /* part 2: the parameter table's end, the decode-graph steps, main's first and last steps */

/* ---------------------------------------------------------------- tests */

static void test_param_table(void)
{
    int good = lay.total == (size_t)MODEL_WEIGHTS_FLOATS;
    if (!good) mg_tap_diag("blob: %zu floats, reference layout %zu", (size_t)MODEL_WEIGHTS_FLOATS, lay.total);
    /* Walk the reference layout in blob order and match the table entry by entry. */
    int i = 0;
#define EXPECT(nm, off) do { \
        if (i >= MODEL_N_PARAMS || strcmp(model_params[i].name, nm) != 0 || model_params[i].offset != (off)) { \
            mg_tap_diag("entry %d: expected %s at %zu, got %s at %zu", i, nm, (size_t)(off), \
                 i < MODEL_N_PARAMS ? model_params[i].name : "(end)", \
                 i < MODEL_N_PARAMS ? model_params[i].offset : (size_t)0); \
            good = 0; } \
        ++i; } while (0)
    char nm[128];
#if MODEL_INPUT_DIM > 0
    EXPECT("backbone.input_proj.weight", lay.input_proj_w);
    EXPECT("backbone.input_proj.bias", lay.input_proj_b);
#endif
    for (int l = 0; l < MODEL_N_LAYERS && good; ++l) {
        const mg_m1_layer_off *lo = &lay.layers[l];
#define LAYER(suffix, field) snprintf(nm, sizeof nm, "backbone.layers.%d.%s", l, suffix); EXPECT(nm, lo->field)
        LAYER("norm.weight", norm_w);
        LAYER("mixer.in_proj.weight", in_proj_w);
        LAYER("mixer.conv1d.weight", conv_w);
        LAYER("mixer.conv1d.bias", conv_b);
        LAYER("mixer.x_proj.weight", x_proj_w);
        LAYER("mixer.dt_proj.weight", dt_proj_w);
        LAYER("mixer.dt_proj.bias", dt_proj_b);
        LAYER("mixer.A_log", A_log);
        LAYER("mixer.D", D);
        LAYER("mixer.out_proj.weight", out_proj_w);
#undef LAYER
    }
    if (good) EXPECT("backbone.norm_f.weight", lay.norm_f_w);
#undef EXPECT
    if (good && i != MODEL_N_PARAMS) { mg_tap_diag("table has %d entries, layout %d", MODEL_N_PARAMS, i); good = 0; }
    param_table_end(good);
}

/* Prefill from the given initial state (or a fresh start) vs the reference. */
static void test_prefill(int batch, int T, int with_state, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *out = FALLOC(n_out(batch, T));
    float *cs = FALLOC(ncs), *ss = FALLOC(nss), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    double *rout = DALLOC_H(n_out(batch, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    push_inputs(u, (size_t)batch * T);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    memcpy(cs, cs0, ncs * sizeof(float));
    memcpy(ss, ss0, nss * sizeof(float));
    char what[160];
    char how[128];
    snprintf(how, sizeof how, "%s%s", with_state ? "from a random state" : "fresh start (NULL states)", weights_tag);
    mg_status s = gpu_prefill(batch, T, u, out, with_state ? cs : NULL, with_state ? ss : NULL);
    if (!mg_tap_ok(s == MG_OK, "prefill batch=%d seqlen=%d %s runs", batch, T, how)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        ref_prefill(batch, T, u, with_state ? cs0 : NULL, with_state ? ss0 : NULL, rout,
                    with_state ? rcs : NULL, with_state ? rss : NULL);
        snprintf(what, sizeof what, "prefill b=%d T=%d %s: out", batch, T, how);
        cmp_ref(what, out, rout, n_out(batch, T));
        if (with_state) {
            snprintf(what, sizeof what, "prefill b=%d T=%d %s: conv_state", batch, T, how);
            cmp_ref(what, cs, rcs, ncs);
            snprintf(what, sizeof what, "prefill b=%d T=%d %s: ssm_state", batch, T, how);
            cmp_ref(what, ss, rss, nss);
        }
    }
    free(u); free(out); free(cs); free(ss); free(cs0); free(ss0); free(rout); free(rcs); free(rss);
}

/* Prefill T1 then T2 carrying the state == one prefill over T1+T2. */
static void test_continuation(int batch, int T1, int T2, uint64_t seed)
{
    const int T = T1 + T2;
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *u1 = FALLOC(n_u(batch, T1)), *u2 = FALLOC(n_u(batch, T2));
    float *o1 = FALLOC(n_out(batch, T1)), *o2 = FALLOC(n_out(batch, T2));
    float *split = FALLOC(n_out(batch, T)), *whole = FALLOC(n_out(batch, T));
    float *cs = FALLOC(ncs), *ss = FALLOC(nss), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *csw = FALLOC(ncs), *ssw = FALLOC(nss);
    double *rout = DALLOC_H(n_out(batch, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    for (int b = 0; b < batch; ++b) {
        memcpy(u1 + n_u(b, T1), u + n_u(b, T), n_u(1, T1) * sizeof(float));
        memcpy(u2 + n_u(b, T2), u + n_u(b, T) + n_u(1, T1), n_u(1, T2) * sizeof(float));
    }
    memcpy(cs, cs0, ncs * sizeof(float)); memcpy(ss, ss0, nss * sizeof(float));
    memcpy(csw, cs0, ncs * sizeof(float)); memcpy(ssw, ss0, nss * sizeof(float));
    mg_status s1 = gpu_prefill(batch, T1, u1, o1, cs, ss);
    mg_status s2 = s1 == MG_OK ? gpu_prefill(batch, T2, u2, o2, cs, ss) : s1;
    mg_status s3 = gpu_prefill(batch, T, u, whole, csw, ssw);
    char what[160];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK && s3 == MG_OK,
                "continuation b=%d: prefill %d + %d and prefill %d run", batch, T1, T2, T)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        for (int b = 0; b < batch; ++b) {
            memcpy(split + n_out(b, T), o1 + n_out(b, T1), n_out(1, T1) * sizeof(float));
            memcpy(split + n_out(b, T) + n_out(1, T1), o2 + n_out(b, T2), n_out(1, T2) * sizeof(float));
        }
        ref_prefill(batch, T, u, cs0, ss0, rout, rcs, rss);
        snprintf(what, sizeof what, "continuation %d+%d vs reference %d: out", T1, T2, T);
        cmp_ref(what, split, rout, n_out(batch, T));
        snprintf(what, sizeof what, "continuation %d+%d vs reference %d: conv_state", T1, T2, T);
        cmp_ref(what, cs, rcs, ncs);
        snprintf(what, sizeof what, "continuation %d+%d vs reference %d: ssm_state", T1, T2, T);
        cmp_ref(what, ss, rss, nss);
        snprintf(what, sizeof what, "continuation %d+%d vs one prefill of %d: out", T1, T2, T);
        cmp_gpu(what, split, whole, n_out(batch, T));
        snprintf(what, sizeof what, "continuation %d+%d vs one prefill of %d: ssm_state", T1, T2, T);
        cmp_gpu(what, ss, ssw, nss);
    }
    free(u); free(u1); free(u2); free(o1); free(o2); free(split); free(whole);
    free(cs); free(ss); free(cs0); free(ss0); free(csw); free(ssw); free(rout); free(rcs); free(rss);
}

/* T decode steps from a zero state == one prefill over the T tokens. */
static void test_decode(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *dout = FALLOC(n_out(batch, T));
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    float *pcs = FALLOC(ncs), *pss = FALLOC(nss), *dcs_h = FALLOC(ncs), *dss_h = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    memset(pcs, 0, ncs * sizeof(float)); memset(pss, 0, nss * sizeof(float));
    mg_status s = gpu_prefill(batch, T, u, pout, pcs, pss);

    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout_t = mg_tap_dalloc(n_out(batch, 1));
    float *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss);
    if (cudaMemset(dcs, 0, ncs * sizeof(float)) != cudaSuccess ||
        cudaMemset(dss, 0, nss * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    for (int t = 0; t < T && s == MG_OK; ++t) {
        step_in(ut, u, batch, T, t);
        mg_tap_up(du, ut, n_u(batch, 1));
        s = model_decode_step(model, batch, du, dout_t, dcs, dss);
        if (s != MG_OK) break;
        mg_tap_down(ot, dout_t, n_out(batch, 1));
        step_out(dout, ot, batch, T, t);
    }
    if (s == MG_OK) { mg_tap_down(dcs_h, dcs, ncs); mg_tap_down(dss_h, dss, nss); }
    char what[160];
    if (!mg_tap_ok(s == MG_OK, "decode: %d steps of batch %d and prefill run", T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        snprintf(what, sizeof what, "decode x%d vs prefill %d", T, T);
        cmp_decode(what, n_out(batch, T), batch, (const float *const[3]){ dout, dcs_h, dss_h },
                   (const float *const[3]){ pout, pcs, pss }, NULL);
    }
    mg_dev_free(du); mg_dev_free(dout_t); mg_dev_free(dcs); mg_dev_free(dss);
    free(u); free(pout); free(dout); free(ut); free(ot); free(pcs); free(pss); free(dcs_h); free(dss_h);
}

/* Fused single-token decode vs the unfused path: T steps from the same
 * random state, each step run three ways with its own states: fused decode,
 * unfused decode (set_decode_fused 0) and prefill with seqlen 1. Unfused
 * decode and prefill run the same kernels: bit-identical. Fused vs unfused:
 * within TOL (the x_proj / dt_proj sums are ordered differently). */
static void test_decode_fused(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, 1) * T), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, 1) * T, seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    float *of = FALLOC(n_out(batch, 1) * T), *ou = FALLOC(n_out(batch, 1) * T), *op = FALLOC(n_out(batch, 1) * T);
    float *csf = FALLOC(ncs), *ssf = FALLOC(nss), *csu = FALLOC(ncs), *ssu = FALLOC(nss), *csp = FALLOC(ncs), *ssp = FALLOC(nss);
    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout = mg_tap_dalloc(n_out(batch, 1));
    float *dcs[3], *dss[3];
    for (int k = 0; k < 3; ++k) {
        dcs[k] = mg_tap_dalloc(ncs); dss[k] = mg_tap_dalloc(nss);
        mg_tap_up(dcs[k], cs0, ncs); mg_tap_up(dss[k], ss0, nss);
    }
    mg_status s = MG_OK;
    for (int t = 0; t < T && s == MG_OK; ++t) {
        mg_tap_up(du, u + n_u(batch, 1) * t, n_u(batch, 1));
        s = model_set_decode_fused(model, 1);
        if (s == MG_OK) s = model_decode_step(model, batch, du, dout, dcs[0], dss[0]);
        if (s == MG_OK) mg_tap_down(of + n_out(batch, 1) * t, dout, n_out(batch, 1));
        if (s == MG_OK) s = model_set_decode_fused(model, 0);
        if (s == MG_OK) s = model_decode_step(model, batch, du, dout, dcs[1], dss[1]);
        if (s == MG_OK) mg_tap_down(ou + n_out(batch, 1) * t, dout, n_out(batch, 1));
        if (s == MG_OK) s = model_prefill(model, batch, 1, du, dout, dcs[2], dss[2]);
        if (s == MG_OK) mg_tap_down(op + n_out(batch, 1) * t, dout, n_out(batch, 1));
    }
    model_set_decode_fused(model, dec_default);
    if (!mg_tap_ok(s == MG_OK, "fused / unfused decode and prefill(seqlen 1): %d steps of batch %d run", T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        down_states(3, (float *const[]){ csf, csu, csp }, (float *const[]){ ssf, ssu, ssp }, dcs, dss, ncs, nss);
        mg_tap_ok(memcmp(ou, op, n_out(batch, 1) * T * sizeof(float)) == 0 &&
               memcmp(csu, csp, ncs * sizeof(float)) == 0 && memcmp(ssu, ssp, nss * sizeof(float)) == 0,
               "unfused decode == prefill with seqlen 1: out and states bit-identical");
        char what[160];
        snprintf(what, sizeof what, "fused vs unfused decode x%d (batch %d)", T, batch);
        cmp_decode(what, n_out(batch, 1) * T, batch, (const float *const[3]){ of, csf, ssf },
                   (const float *const[3]){ ou, csu, ssu }, NULL);
    }
    for (int k = 0; k < 3; ++k) { mg_dev_free(dcs[k]); mg_dev_free(dss[k]); }
    mg_dev_free(du); mg_dev_free(dout);
    free(u); free(cs0); free(ss0); free(of); free(ou); free(op);
    free(csf); free(ssf); free(csu); free(ssu); free(csp); free(ssp);
}

/* Single-launch decode (level 2) vs the fused path (level 1): T steps of
 * batch streams from the same random state, each path with its own states;
 * out of every step and the final states within TOL. Also the single-launch
 * steps vs the f64 reference (a prefill of the T tokens from that state).
 * Without the kernel: level 2 is refused. */
static void test_decode_single(int batch, int T, uint64_t seed)
{
#if MODEL_HAS_DECODE_SINGLE
    if (skip_single_launch("single-launch decode vs fused decode and the reference")) return;
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss), *ut = FALLOC(n_u(batch, 1));
    float *o1 = FALLOC(n_out(batch, 1)), *os = FALLOC(n_out(batch, T)), *of = FALLOC(n_out(batch, T));
    float *css = FALLOC(ncs), *sss = FALLOC(nss), *csf = FALLOC(ncs), *ssf = FALLOC(nss);
    double *rout = (double *)mg_tap_malloc(n_out(batch, T) * sizeof(double));
    double *rcs = (double *)mg_tap_malloc(ncs * sizeof(double)), *rss = (double *)mg_tap_malloc(nss * sizeof(double));
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout = mg_tap_dalloc(n_out(batch, 1));
    float *dcs[2], *dss[2];
    for (int k = 0; k < 2; ++k) {
        dcs[k] = mg_tap_dalloc(ncs); dss[k] = mg_tap_dalloc(nss);
        mg_tap_up(dcs[k], cs0, ncs); mg_tap_up(dss[k], ss0, nss);
    }
    static const int level[2] = { MODEL_DECODE_SINGLE, MODEL_DECODE_FUSED };
    mg_status s = MG_OK;
    for (int t = 0; t < T && s == MG_OK; ++t) {
        step_in(ut, u, batch, T, t);
        mg_tap_up(du, ut, n_u(batch, 1));
        for (int k = 0; k < 2 && s == MG_OK; ++k) {
            s = model_set_decode_fused(model, level[k]);
            if (s == MG_OK) s = model_decode_step(model, batch, du, dout, dcs[k], dss[k]);
            if (s != MG_OK) break;
            mg_tap_down(o1, dout, n_out(batch, 1));
            float *dst = k == 0 ? os : of;
            for (int b = 0; b < batch; ++b)
                memcpy(dst + n_out(b, T) + n_out(1, t), o1 + n_out(b, 1), n_out(1, 1) * sizeof(float));
        }
    }
    model_set_decode_fused(model, dec_default);
    if (!mg_tap_ok(s == MG_OK, "single-launch / fused decode: %d steps of batch %d run", T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        down_states(2, (float *const[]){ css, csf }, (float *const[]){ sss, ssf }, dcs, dss, ncs, nss);
        char what[160];
        const float *const single[3] = { os, css, sss };
        snprintf(what, sizeof what, "single-launch vs fused decode x%d (batch %d)", T, batch);
        cmp_decode(what, n_out(batch, T), batch, single, (const float *const[3]){ of, csf, ssf }, NULL);
        snprintf(what, sizeof what, "single-launch decode x%d (batch %d) vs reference", T, batch);
        double sc;
        if ((double)batch * T <= mg_tap_budget(REF_BUDGET_MACS, REF_MACS_PER_TOKEN, 8, &sc) / 8.0) {
            ref_prefill(batch, T, u, cs0, ss0, rout, rcs, rss);
            cmp_decode(what, n_out(batch, T), batch, single, NULL, (const double *const[3]){ rout, rcs, rss });
        } else {   /* the three checks cmp_decode would make */
            static const char *const part[3] = { "out (every step)", "conv_state", "ssm_state" };
            char name[200];
            for (int i = 0; i < 3; ++i) {
                snprintf(name, sizeof name, "%s: %s", what, part[i]);
                mg_tap_skip("reference too costly at this scale (batch x steps over an eighth of the reference "
                            "budget; raise MG_TEST_SCALE)", name);
            }
        }
    }
    for (int k = 0; k < 2; ++k) { mg_dev_free(dcs[k]); mg_dev_free(dss[k]); }
    mg_dev_free(du); mg_dev_free(dout);
    free(u); free(cs0); free(ss0); free(ut); free(o1); free(os); free(of);
    free(css); free(sss); free(csf); free(ssf); free(rout); free(rcs); free(rss);
#else
    (void)batch; (void)T; (void)seed;
    mg_tap_expect_status(model_set_decode_fused(model, 2), MG_ERR_INVALID_ARG,
                  "set_decode_fused(2) without the single-launch kernel");
#endif
}

/* T decode_step_reset steps of batch streams: inputs from u [batch][T],
 * the reset mask of step t the column m[b][t] (host [batch][T]), states
 * dcs / dss (device) in place, outputs to out_h [batch][T] (host). */
static mg_status decode_reset_walk(int batch, int T, const float *u, const unsigned char *m, float *dcs, float *dss,
                                   float *out_h)
{
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    unsigned char *col = (unsigned char *)mg_tap_calloc((size_t)batch);
    float *du = mg_tap_dalloc(n_u(batch, 1)), *dout = mg_tap_dalloc(n_out(batch, 1));
    unsigned char *dm = dalloc_bytes((size_t)batch);
    mg_status s = MG_OK;
    for (int t = 0; t < T && s == MG_OK; ++t) {
        for (int b = 0; b < batch; ++b) col[b] = m[(size_t)b * T + t];
        up_mask(dm, col, batch);
        step_in(ut, u, batch, T, t);
        mg_tap_up(du, ut, n_u(batch, 1));
        s = model_decode_step_reset(model, batch, du, dout, dcs, dss, dm);
        if (s != MG_OK) break;
        mg_tap_down(ot, dout, n_out(batch, 1));
        step_out(out_h, ot, batch, T, t);
    }
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dm);
    free(ut); free(ot); free(col);
    return s;
}

/* The single-launch decode's streams per cluster (set_decode_tile): T
 * steps of batch streams from random states, with a reset mask on every
 * third stream at step 1, once per tile 1..MAX_TILE and with the per-call
 * default (0); every tile gives the same bits as tile 1 (a stream's sums
 * keep their order whichever streams share its cluster; batch is chosen so
 * that the last cluster is partly filled). Then the bad tiles. */
static void test_decode_tiles(int batch, int T, uint64_t seed)
{
#if MODEL_HAS_DECODE_SINGLE
    if (skip_single_launch("single-launch decode tiles")) return;
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    const size_t no = n_out(batch, 1) * (size_t)T;
    float *u = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *o[2] = { FALLOC(no), FALLOC(no) }, *csh[2] = { FALLOC(ncs), FALLOC(ncs) };
    float *ssh[2] = { FALLOC(nss), FALLOC(nss) };
    unsigned char *m = (unsigned char *)mg_tap_calloc((size_t)batch * T);
    for (int b = 0; b < batch; b += 3) if (T > 1) m[(size_t)b * T + 1] = 1;   /* every third stream resets at step 1 */
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    float *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss);
    mg_status s = model_set_decode_fused(model, MODEL_DECODE_SINGLE);
    /* the last round, tile MAX_TILE + 1, sets the per-call default (0) */
    for (int tile = 1; tile <= MODEL_DECODE_SINGLE_MAX_TILE + 1 && s == MG_OK; ++tile) {
        const int set = tile > MODEL_DECODE_SINGLE_MAX_TILE ? 0 : tile;
        const int k = tile == 1 ? 0 : 1;   /* tile 1: the bits the others must give */
        s = model_set_decode_tile(model, set);
        mg_tap_up(dcs, cs0, ncs); mg_tap_up(dss, ss0, nss);
        if (s == MG_OK) s = decode_reset_walk(batch, T, u, m, dcs, dss, o[k]);
        if (s != MG_OK) break;
        mg_tap_down(csh[k], dcs, ncs); mg_tap_down(ssh[k], dss, nss);
        if (k == 0) continue;
        char what[64];
        if (set) snprintf(what, sizeof what, "%d streams per cluster", set);
        else snprintf(what, sizeof what, "the per-call tile (0)");
        mg_tap_ok(memcmp(o[0], o[1], no * sizeof(float)) == 0 && memcmp(csh[0], csh[1], ncs * sizeof(float)) == 0 &&
                  memcmp(ssh[0], ssh[1], nss * sizeof(float)) == 0,
                  "single-launch decode x%d (batch %d, resets): %s == 1 stream per cluster, bit for bit",
                  T, batch, what);
    }
    if (!mg_tap_ok(s == MG_OK, "single-launch decode with every tile 1..%d and 0 runs (batch %d)",
                   MODEL_DECODE_SINGLE_MAX_TILE, batch))
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    model_set_decode_tile(model, 0);
    model_set_decode_fused(model, dec_default);
    mg_tap_expect_error(model_set_decode_tile(model, MODEL_DECODE_SINGLE_MAX_TILE + 1), MG_ERR_INVALID_ARG,
                        "out of range", "set_decode_tile(MAX_TILE + 1)");
    mg_tap_expect_error(model_set_decode_tile(model, -1), MG_ERR_INVALID_ARG, "out of range", "set_decode_tile(-1)");
    mg_tap_expect_status(model_set_decode_tile(NULL, 1), MG_ERR_INVALID_ARG, "set_decode_tile NULL model");
    mg_dev_free(dcs); mg_dev_free(dss);
    free(u); free(cs0); free(ss0); free(m);
    for (int k = 0; k < 2; ++k) { free(o[k]); free(csh[k]); free(ssh[k]); }
#else
    (void)batch; (void)T; (void)seed;
    mg_tap_expect_status(model_set_decode_tile(model, 2), MG_ERR_INVALID_ARG,
                         "set_decode_tile(2) without the single-launch kernel");
    mg_tap_ok(model_set_decode_tile(model, 0) == MG_OK && model_set_decode_tile(model, 1) == MG_OK,
              "set_decode_tile 0 and 1 accepted without the single-launch kernel (nothing to tile)");
    model_set_decode_tile(model, 0);
#endif
}

/* Determinism: identical calls give identical bits; NULL states == zero states. */
static void test_determinism(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *o1 = FALLOC(n_out(batch, T)), *o2 = FALLOC(n_out(batch, T));
    float *o3 = FALLOC(n_out(batch, T));
    float *cs1 = FALLOC(ncs), *ss1 = FALLOC(nss), *cs2 = FALLOC(ncs), *ss2 = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs1, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss1, nss, seed + 2, 0.5f);
    memcpy(cs2, cs1, ncs * sizeof(float)); memcpy(ss2, ss1, nss * sizeof(float));
    mg_status s1 = gpu_prefill(batch, T, u, o1, cs1, ss1);
    mg_status s2 = gpu_prefill(batch, T, u, o2, cs2, ss2);
    mg_tap_ok(s1 == MG_OK && s2 == MG_OK && memcmp(o1, o2, n_out(batch, T) * sizeof(float)) == 0 &&
           memcmp(cs1, cs2, ncs * sizeof(float)) == 0 && memcmp(ss1, ss2, nss * sizeof(float)) == 0,
           "deterministic: two identical prefills (b=%d T=%d) give bit-identical out and states", batch, T);
    memset(cs1, 0, ncs * sizeof(float)); memset(ss1, 0, nss * sizeof(float));
    s1 = gpu_prefill(batch, T, u, o1, cs1, ss1);
    s2 = gpu_prefill(batch, T, u, o3, NULL, NULL);
    mg_tap_ok(s1 == MG_OK && s2 == MG_OK && memcmp(o1, o3, n_out(batch, T) * sizeof(float)) == 0,
           "fresh start: NULL states give the same bits as zero states");
    free(u); free(o1); free(o2); free(o3); free(cs1); free(ss1); free(cs2); free(ss2);
}

/* ---------------------------------------------------------------- inference extras */

/* The fused conv + x_proj kernel (MODEL_HAS_CONV_XPROJ) against the conv
 * kernel + x_proj GEMM on the same call, from a random state: out and the
 * states within TOL (x_proj's sums in another order), layer 0's conv state
 * bit-identical (the same conv code on the same inputs); then the
 * setter's refusals. Without the kernel: set_conv_xproj refuses a bound
 * above 0 and takes 0 and -1. */
static void test_conv_xproj(int batch, int T, uint64_t seed)
{
    const int all = MAX_BATCH * MAX_SEQ_LEN;
#if MODEL_HAS_CONV_XPROJ
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *of = FALLOC(n_out(batch, T)), *og = FALLOC(n_out(batch, T));
    float *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss), *csf = FALLOC(ncs), *ssf = FALLOC(nss);
    float *csg = FALLOC(ncs), *ssg = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    rand_state2(batch, seed + 1, cs0, ss0, csf, ssf, csg, ssg);
    mg_status s1 = model_set_conv_xproj(model, all);
    if (s1 == MG_OK) s1 = gpu_prefill(batch, T, u, of, csf, ssf);
    mg_status s2 = model_set_conv_xproj(model, 0);
    if (s2 == MG_OK) s2 = gpu_prefill(batch, T, u, og, csg, ssg);
    if (model_set_conv_xproj(model, -1) != MG_OK) mg_tap_bail("set_conv_xproj(-1)");
    char what[160];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "prefill b=%d T=%d with the fused conv + x_proj and with conv + GEMM run",
                   batch, T)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        snprintf(what, sizeof what, "fused conv + x_proj vs conv + GEMM b=%d T=%d: out", batch, T);
        cmp_gpu(what, of, og, n_out(batch, T));
        snprintf(what, sizeof what, "fused conv + x_proj vs conv + GEMM b=%d T=%d: ssm_state", batch, T);
        cmp_gpu(what, ssf, ssg, nss);
        snprintf(what, sizeof what, "fused conv + x_proj vs conv + GEMM b=%d T=%d: conv_state", batch, T);
        cmp_gpu(what, csf, csg, ncs);
        mg_tap_ok(memcmp(csf, csg, ncs / MODEL_N_LAYERS * sizeof(float)) == 0,
                  "fused conv + x_proj vs conv + GEMM b=%d T=%d: layer 0 conv_state bit-identical", batch, T);
    }
    free(u); free(of); free(og); free(cs0); free(ss0); free(csf); free(ssf); free(csg); free(ssg);
#else
    (void)batch; (void)T; (void)seed;
    mg_tap_expect_status(model_set_conv_xproj(model, all), MG_ERR_INVALID_ARG,
                         "set_conv_xproj refuses a bound without the fused kernel");
#endif
    mg_tap_expect_status(model_set_conv_xproj(model, -2), MG_ERR_INVALID_ARG, "set_conv_xproj refuses -2");
    mg_tap_expect_status(model_set_conv_xproj(NULL, 0), MG_ERR_INVALID_ARG, "set_conv_xproj refuses a NULL model");
    mg_tap_ok(model_set_conv_xproj(model, 0) == MG_OK && model_set_conv_xproj(model, -1) == MG_OK,
              "set_conv_xproj takes 0 (never) and -1 (the default)");
}

#if MODEL_HAS_CHUNKED_SCAN
static int cmp_tol(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    mg_err e = mg_compare_f32f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e.max_abs, e.rel_l2, e.n);
    return mg_tap_ok(mg_err_ok(&e, tol), "%s: rel_l2 <= %g", what, tol);
}

static void set_scan_or_bail(int choice)
{
    if (model_set_scan(model, choice) != MG_OK) mg_tap_bail("set_scan");
}

/* Chunked vs sequential scan from a random state (GPU, same inputs), and
 * chunked vs the reference when with_ref. */
static void test_chunked(int batch, int T, int with_ref, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *oc = FALLOC(n_out(batch, T)), *os = FALLOC(n_out(batch, T));
    float *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss), *csc = FALLOC(ncs), *ssc = FALLOC(nss);
    float *css = FALLOC(ncs), *sss = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    rand_state2(batch, seed + 1, cs0, ss0, csc, ssc, css, sss);
    set_scan_or_bail(MODEL_SCAN_CHUNKED);
    mg_status s1 = gpu_prefill(batch, T, u, oc, csc, ssc);
    set_scan_or_bail(MODEL_SCAN_SEQUENTIAL);
    mg_status s2 = gpu_prefill(batch, T, u, os, css, sss);
    set_scan_or_bail(MODEL_SCAN_SPEC);
    char what[160];
    const int nc = (T + SCAN_CHUNK - 1) / SCAN_CHUNK;
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "chunked and sequential prefill b=%d T=%d (%d chunks of %d) run",
                batch, T, nc, SCAN_CHUNK)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        snprintf(what, sizeof what, "chunked vs sequential b=%d T=%d: out", batch, T);
        cmp_tol(what, oc, os, n_out(batch, T), CHUNK_TOL);
        snprintf(what, sizeof what, "chunked vs sequential b=%d T=%d: ssm_state", batch, T);
        cmp_tol(what, ssc, sss, nss, CHUNK_TOL);
        /* Layer 0's conv state holds raw in_proj outputs of the same input
         * on both paths: bit-identical. Deeper layers see inputs that differ
         * by the two scans' f32 rounding, so they are held to CHUNK_TOL. */
        const size_t ncs0 = ncs / MODEL_N_LAYERS;
        mg_tap_ok(memcmp(csc, css, ncs0 * sizeof(float)) == 0,
               "chunked vs sequential b=%d T=%d: layer 0 conv_state bit-identical", batch, T);
        snprintf(what, sizeof what, "chunked vs sequential b=%d T=%d: conv_state", batch, T);
        cmp_tol(what, csc, css, ncs, CHUNK_TOL);
        if (with_ref) {
            double *rout = DALLOC_H(n_out(batch, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
            ref_prefill(batch, T, u, cs0, ss0, rout, rcs, rss);
            snprintf(what, sizeof what, "chunked b=%d T=%d vs reference: out", batch, T);
            cmp_ref(what, oc, rout, n_out(batch, T));
            snprintf(what, sizeof what, "chunked b=%d T=%d vs reference: ssm_state", batch, T);
            cmp_ref(what, ssc, rss, nss);
            free(rout); free(rcs); free(rss);
        }
    }
    free(u); free(oc); free(os); free(cs0); free(ss0); free(csc); free(ssc); free(css); free(sss);
}

/* The spec's own dispatch picks the chunked scan where it should: same bits
 * as forcing it. */
static void test_dispatch(int batch, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *o1 = FALLOC(n_out(batch, T)), *o2 = FALLOC(n_out(batch, T));
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_status s1 = gpu_prefill(batch, T, u, o1, NULL, NULL);
    set_scan_or_bail(MODEL_SCAN_CHUNKED);
    mg_status s2 = gpu_prefill(batch, T, u, o2, NULL, NULL);
    set_scan_or_bail(MODEL_SCAN_SPEC);
    mg_tap_ok(s1 == MG_OK && s2 == MG_OK && memcmp(o1, o2, n_out(batch, T) * sizeof(float)) == 0,
           "scan mode " MODEL_SCAN_MODE ": seqlen %d takes the chunked scan (same bits as forcing it)", T);
    free(u); free(o1); free(o2);
}
#endif

/* Burn-in: last-step output and final states vs prefill (and the reference). */
static void test_burn_in(int batch, int T, int with_ref, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *last = FALLOC(n_out(batch, 1));
    float *plast = FALLOC(n_out(batch, 1));
    float *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss), *pcs = FALLOC(ncs), *pss = FALLOC(nss);
    float *bcs = FALLOC(ncs), *bss = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    rand_state2(batch, seed + 1, cs0, ss0, pcs, pss, bcs, bss);
    mg_status s1 = gpu_prefill(batch, T, u, pout, pcs, pss);

    float *du = mg_tap_dalloc(n_u(batch, T)), *dlast = mg_tap_dalloc(n_out(batch, 1));
    float *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss);
    mg_tap_up(du, u, n_u(batch, T)); mg_tap_up(dcs, bcs, ncs); mg_tap_up(dss, bss, nss);
    mg_status s2 = model_burn_in(model, batch, T, du, dlast, dcs, dss);
    if (s2 == MG_OK) { mg_tap_down(last, dlast, n_out(batch, 1)); mg_tap_down(bcs, dcs, ncs); mg_tap_down(bss, dss, nss); }
    char what[160];
    if (!mg_tap_ok(s1 == MG_OK && s2 == MG_OK, "burn_in b=%d T=%d and prefill run", batch, T)) {
        mg_tap_diag("%s", mg_last_error());
    } else {
        last_step(plast, pout, batch, T, sizeof *plast);
        snprintf(what, sizeof what, "burn_in b=%d T=%d vs prefill's last step: last_out", batch, T);
        cmp_gpu(what, last, plast, n_out(batch, 1));
        snprintf(what, sizeof what, "burn_in b=%d T=%d vs prefill: conv_state", batch, T);
        cmp_gpu(what, bcs, pcs, ncs);
        snprintf(what, sizeof what, "burn_in b=%d T=%d vs prefill: ssm_state", batch, T);
        cmp_gpu(what, bss, pss, nss);
        if (with_ref) {
            double *rout = DALLOC_H(n_out(batch, T)), *rlast = DALLOC_H(n_out(batch, 1));
            double *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
            ref_prefill(batch, T, u, cs0, ss0, rout, rcs, rss);
            last_step(rlast, rout, batch, T, sizeof *rlast);
            snprintf(what, sizeof what, "burn_in b=%d T=%d vs reference: last_out", batch, T);
            cmp_ref(what, last, rlast, n_out(batch, 1));
            snprintf(what, sizeof what, "burn_in b=%d T=%d vs reference: ssm_state", batch, T);
            cmp_ref(what, bss, rss, nss);
            free(rout); free(rlast); free(rcs); free(rss);
        }
    }
    mg_dev_free(du); mg_dev_free(dlast); mg_dev_free(dcs); mg_dev_free(dss);
    free(u); free(pout); free(last); free(plast); free(cs0); free(ss0); free(pcs); free(pss);
    free(bcs); free(bss);
}

/* ---------------------------------------------------------------- episode starts (doc/math.md §9) */

/* The mask of a pattern (mg_tap_start_mask) for [batch][T]: the mixed one
 * marks the chunked scan's chunk edges and the scan's staging edges. */
static unsigned char *start_mask(int batch, int T, int pattern)
{
    unsigned char *m = (unsigned char *)mg_tap_calloc((size_t)batch * T);
    mg_tap_start_mask(m, batch, T, pattern, SCAN_CHUNK, SCAN_TCHUNK);
    return m;
}
static const char *const pattern_name[4] = { "all-zero mask", "every stream at a mid-window token",
                                             "every stream at t = 0", "mixed starts" };

/* GPU prefill_starts (burn: burn_in_starts, out is then [batch][D]) on host
 * data with the host mask m (NULL: the call gets a NULL mask); states as
 * gpu_prefill. */
static mg_status gpu_starts(int batch, int T, const float *u, float *out, float *cs, float *ss,
                            const unsigned char *m, int burn)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    const size_t no = burn ? n_out(batch, 1) : n_out(batch, T);
    float *du = mg_tap_dalloc(n_u(batch, T)), *dout = mg_tap_dalloc(no);
    float *dcs = cs ? mg_tap_dalloc(ncs) : NULL, *dss = ss ? mg_tap_dalloc(nss) : NULL;
    unsigned char *dm = m ? dalloc_bytes((size_t)batch * T) : NULL;
    mg_tap_up(du, u, n_u(batch, T));
    if (cs) mg_tap_up(dcs, cs, ncs);
    if (ss) mg_tap_up(dss, ss, nss);
    if (m && cudaMemcpy(dm, m, (size_t)batch * T, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy mask");
    mg_status s = burn ? model_burn_in_starts(model, batch, T, du, dout, dcs, dss, dm)
                       : model_prefill_starts(model, batch, T, du, dout, dcs, dss, dm);
    if (s == MG_OK) {
        mg_tap_down(out, dout, no);
        if (cs) mg_tap_down(cs, dcs, ncs);
        if (ss) mg_tap_down(ss, dss, nss);
    }
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dcs); mg_dev_free(dss); mg_dev_free(dm);
    return s;
}

/* The scans a masked call can take: sequential, and chunked when emitted. */
#if MODEL_HAS_CHUNKED_SCAN
#define N_SCANS 2
#else
#define N_SCANS 1
#endif
static const int scan_of[2] = { MODEL_SCAN_SEQUENTIAL, MODEL_SCAN_CHUNKED };
static const char *const scan_name[2] = { "sequential scan", "chunked scan" };
static void use_scan(int k)
{
    if (model_set_scan(model, scan_of[k]) != MG_OK) mg_tap_bail("set_scan");
}
static void scan_spec(void)
{
    if (model_set_scan(model, MODEL_SCAN_SPEC) != MG_OK) mg_tap_bail("set_scan");
}

/* prefill_starts from random states vs the reference with the same mask
 * (mg_ref_mamba1_forward_ex): out, final conv and ssm states, on every
 * scan; the scans against each other (CHUNK_TOL); burn_in_starts vs
 * prefill_starts' last step and states. */
static void test_starts_ref(int batch, int T, int pattern, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *out[N_SCANS], *cs[N_SCANS], *ss[N_SCANS];
    double *rout = DALLOC_H(n_out(batch, T)), *rcs = DALLOC_H(ncs), *rss = DALLOC_H(nss);
    unsigned char *m = start_mask(batch, T, pattern);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    for (size_t i = 0; i < ncs; ++i) rcs[i] = cs0[i];
    for (size_t i = 0; i < nss; ++i) rss[i] = ss0[i];
    const mg_ref_seqs seqs = { m, NULL, 0, 0 };
    if (mg_ref_mamba1_forward_ex(&dims, &lay, blob, batch, T, u, rout, rcs, rss, &seqs) != MG_OK)
        mg_tap_bail("mg_ref_mamba1_forward_ex");
    char what[200];
    for (int k = 0; k < N_SCANS; ++k) {
        out[k] = FALLOC(n_out(batch, T)); cs[k] = FALLOC(ncs); ss[k] = FALLOC(nss);
        memcpy(cs[k], cs0, ncs * sizeof(float)); memcpy(ss[k], ss0, nss * sizeof(float));
        use_scan(k);
        const mg_status s = gpu_starts(batch, T, u, out[k], cs[k], ss[k], m, 0);
        if (!mg_tap_ok(s == MG_OK, "prefill_starts b=%d T=%d (%s, %s) runs", batch, T, pattern_name[pattern],
                       scan_name[k])) {
            mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
            continue;
        }
        static const char *const part[3] = { "out", "conv_state", "ssm_state" };
        const float *got[3] = { out[k], cs[k], ss[k] };
        const double *ref[3] = { rout, rcs, rss };
        const size_t n[3] = { n_out(batch, T), ncs, nss };
        for (int i = 0; i < 3; ++i) {
            snprintf(what, sizeof what, "prefill_starts b=%d T=%d %s, %s vs reference forward_ex: %s", batch, T,
                     pattern_name[pattern], scan_name[k], part[i]);
            cmp_ref(what, got[i], ref[i], n[i]);
        }
        if (k == 0) {   /* burn-in with the same mask: the last step and the states of prefill_starts */
            float *last = FALLOC(n_out(batch, 1)), *plast = FALLOC(n_out(batch, 1));
            float *bcs = FALLOC(ncs), *bss = FALLOC(nss);
            memcpy(bcs, cs0, ncs * sizeof(float)); memcpy(bss, ss0, nss * sizeof(float));
            const mg_status sb = gpu_starts(batch, T, u, last, bcs, bss, m, 1);
            if (mg_tap_ok(sb == MG_OK, "burn_in_starts b=%d T=%d (%s) runs", batch, T, pattern_name[pattern])) {
                last_step(plast, out[0], batch, T, sizeof *plast);
                snprintf(what, sizeof what, "burn_in_starts vs prefill_starts' last step (%s): last_out",
                         pattern_name[pattern]);
                cmp_gpu(what, last, plast, n_out(batch, 1));
                snprintf(what, sizeof what, "burn_in_starts vs prefill_starts (%s): conv_state", pattern_name[pattern]);
                cmp_gpu(what, bcs, cs[0], ncs);
                snprintf(what, sizeof what, "burn_in_starts vs prefill_starts (%s): ssm_state", pattern_name[pattern]);
                cmp_gpu(what, bss, ss[0], nss);
            } else {
                mg_tap_diag("%s: %s", mg_status_name(sb), mg_last_error());
            }
            free(last); free(plast); free(bcs); free(bss);
        }
    }
#if MODEL_HAS_CHUNKED_SCAN
    snprintf(what, sizeof what, "prefill_starts chunked vs sequential (%s): out", pattern_name[pattern]);
    cmp_tol(what, out[1], out[0], n_out(batch, T), CHUNK_TOL);
    snprintf(what, sizeof what, "prefill_starts chunked vs sequential (%s): ssm_state", pattern_name[pattern]);
    cmp_tol(what, ss[1], ss[0], nss, CHUNK_TOL);
#endif
    scan_spec();
    for (int k = 0; k < N_SCANS; ++k) { free(out[k]); free(cs[k]); free(ss[k]); }
    free(u); free(cs0); free(ss0); free(rout); free(rcs); free(rss); free(m);
}

/* What a mask must not change, bit for bit, on every scan:
 *   - an all-zero mask == prefill (out, states), and a NULL mask too;
 *   - a start at t = 0 of every stream == prefill from zero states (the
 *     initial states, random here, ignored);
 *   - no leak across a start: with stream b starting at s_b (mid-window,
 *     per stream), other inputs before s_b and other initial states give
 *     the same out from s_b on and the same final states. */
static void test_starts_exact(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch), no = n_out(batch, T);
    float *u = FALLOC(n_u(batch, T)), *u2 = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *o1 = FALLOC(no), *o2 = FALLOC(no), *cs1 = FALLOC(ncs), *ss1 = FALLOC(nss), *cs2 = FALLOC(ncs), *ss2 = FALLOC(nss);
    unsigned char *zero = start_mask(batch, T, MG_TAP_STARTS_NONE), *first = start_mask(batch, T, MG_TAP_STARTS_FIRST);
    unsigned char *leak = (unsigned char *)mg_tap_calloc((size_t)batch * T);
    int *sb = (int *)mg_tap_calloc((size_t)batch * sizeof(int));
    for (int b = 0; b < batch; ++b) {   /* one start per stream, mid-window, not at a chunk edge */
        sb[b] = imin(T - 1, T / 2 + 1 + b % 3);
        leak[(size_t)b * T + sb[b]] = (unsigned char)(b % 2 ? 255 : 1);
    }
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
#define SAME(a, b, n) (memcmp((a), (b), (n) * sizeof(float)) == 0)
    for (int k = 0; k < N_SCANS; ++k) {
        use_scan(k);
        mg_status s;
        /* all-zero and NULL masks */
        memcpy(cs1, cs0, ncs * sizeof(float)); memcpy(ss1, ss0, nss * sizeof(float));
        memcpy(cs2, cs0, ncs * sizeof(float)); memcpy(ss2, ss0, nss * sizeof(float));
        s = gpu_prefill(batch, T, u, o1, cs1, ss1);
        if (s == MG_OK) s = gpu_starts(batch, T, u, o2, cs2, ss2, zero, 0);
        mg_tap_ok(s == MG_OK && SAME(o1, o2, no) && SAME(cs1, cs2, ncs) && SAME(ss1, ss2, nss),
                  "prefill_starts with an all-zero mask == prefill (%s): out and states bit-identical", scan_name[k]);
        memcpy(cs2, cs0, ncs * sizeof(float)); memcpy(ss2, ss0, nss * sizeof(float));
        if (s == MG_OK) s = gpu_starts(batch, T, u, o2, cs2, ss2, NULL, 0);
        mg_tap_ok(s == MG_OK && SAME(o1, o2, no) && SAME(cs1, cs2, ncs) && SAME(ss1, ss2, nss),
                  "prefill_starts with a NULL mask == prefill (%s): bit-identical", scan_name[k]);
        /* a start at t = 0 everywhere == zero initial states */
        memset(cs1, 0, ncs * sizeof(float)); memset(ss1, 0, nss * sizeof(float));
        memcpy(cs2, cs0, ncs * sizeof(float)); memcpy(ss2, ss0, nss * sizeof(float));
        if (s == MG_OK) s = gpu_prefill(batch, T, u, o1, cs1, ss1);
        if (s == MG_OK) s = gpu_starts(batch, T, u, o2, cs2, ss2, first, 0);
        mg_tap_ok(s == MG_OK && SAME(o1, o2, no) && SAME(ss1, ss2, nss) && SAME(cs1, cs2, ncs),
                  "prefill_starts, every stream starting at t = 0 from random states == prefill from zero states "
                  "(%s): out and states bit-identical", scan_name[k]);
        /* no leak across a start */
        memcpy(u2, u, n_u(batch, T) * sizeof(float));
        for (int b = 0; b < batch; ++b)
            mg_tap_randn(u2 + n_u(b, T), n_u(1, sb[b]), seed + 10 + (uint64_t)b, 1.0f);
        memcpy(cs1, cs0, ncs * sizeof(float)); memcpy(ss1, ss0, nss * sizeof(float));
        mg_tap_randn(cs2, ncs, seed + 3, 0.5f);
        mg_tap_randn(ss2, nss, seed + 4, 0.5f);
        if (s == MG_OK) s = gpu_starts(batch, T, u, o1, cs1, ss1, leak, 0);
        if (s == MG_OK) s = gpu_starts(batch, T, u2, o2, cs2, ss2, leak, 0);
        int same = s == MG_OK && SAME(cs1, cs2, ncs) && SAME(ss1, ss2, nss);
        for (int b = 0; b < batch && same; ++b)
            same = SAME(o1 + n_out(b, T) + n_out(1, sb[b]), o2 + n_out(b, T) + n_out(1, sb[b]), n_out(1, T - sb[b]));
        mg_tap_ok(same, "prefill_starts: other inputs before each stream's start and other initial states change "
                  "nothing from the start on (%s): out and final states bit-identical", scan_name[k]);
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    }
#undef SAME
    scan_spec();
    free(u); free(u2); free(cs0); free(ss0); free(o1); free(o2); free(cs1); free(ss1); free(cs2); free(ss2);
    free(zero); free(first); free(leak); free(sb);
}

/* prefill_starts (mixed starts, random states) == T decode_step_reset calls
 * whose reset mask is the start column of each step (within TOL, as decode
 * vs prefill: the fused and single-launch decode sum the GEMVs in their
 * own order). */
static void test_starts_decode(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *pout = FALLOC(n_out(batch, T)), *dout_h = FALLOC(n_out(batch, T));
    float *pcs = FALLOC(ncs), *pss = FALLOC(nss), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *dcs_h = FALLOC(ncs), *dss_h = FALLOC(nss);
    unsigned char *m = start_mask(batch, T, MG_TAP_STARTS_MIXED);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    memcpy(pcs, cs0, ncs * sizeof(float)); memcpy(pss, ss0, nss * sizeof(float));
    mg_status s = gpu_starts(batch, T, u, pout, pcs, pss, m, 0);
    float *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss);
    mg_tap_up(dcs, cs0, ncs); mg_tap_up(dss, ss0, nss);
    if (s == MG_OK) s = decode_reset_walk(batch, T, u, m, dcs, dss, dout_h);
    if (!mg_tap_ok(s == MG_OK, "prefill_starts and %d decode_step_reset steps of batch %d run", T, batch)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        mg_tap_down(dcs_h, dcs, ncs); mg_tap_down(dss_h, dss, nss);
        char what[160];
        snprintf(what, sizeof what, "decode_step_reset x%d (reset = the start column) vs prefill_starts (mixed)", T);
        cmp_decode(what, n_out(batch, T), batch, (const float *const[3]){ dout_h, dcs_h, dss_h },
                   (const float *const[3]){ pout, pcs, pss }, NULL);
    }
    mg_dev_free(dcs); mg_dev_free(dss);
    free(u); free(pout); free(dout_h); free(pcs); free(pss); free(cs0); free(ss0);
    free(dcs_h); free(dss_h); free(m);
}

/* The states of stream b ([n_layers][batch][per]) to / from a batch-1
 * buffer ([n_layers][1][per]). */
static void stream_state(float *one, const float *all, int batch, int b, size_t per, int to_one)
{
    for (int l = 0; l < MODEL_N_LAYERS; ++l) {
        float *p1 = one + (size_t)l * per;
        float *pa = (float *)all + ((size_t)l * batch + b) * per;
        if (to_one) memcpy(p1, pa, per * sizeof(float));
        else memcpy(pa, p1, per * sizeof(float));
    }
}

/* prefill_starts (mixed starts, random states) == the same sequences split
 * by hand at the starts (mg_ref_seqs_plan: the reference's own segments),
 * one prefill of batch 1 per segment, from the stream's state or from zero
 * states, the stream's final state from its last segment. Within TOL, not
 * bit for bit: the segments' GEMMs have other shapes, and cuBLAS may sum
 * them in another order (the exact checks are test_starts_exact's). */
static void test_starts_split(int batch, int T, uint64_t seed)
{
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    const size_t pcs1 = model_conv_state_floats(1) / MODEL_N_LAYERS, pss1 = model_ssm_state_floats(1) / MODEL_N_LAYERS;
    float *u = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *mout = FALLOC(n_out(batch, T)), *mcs = FALLOC(ncs), *mss = FALLOC(nss);
    float *sout = FALLOC(n_out(batch, T)), *scs = FALLOC(ncs), *sss = FALLOC(nss);
    float *cs1 = FALLOC(model_conv_state_floats(1)), *ss1 = FALLOC(model_ssm_state_floats(1));
    unsigned char *m = start_mask(batch, T, MG_TAP_STARTS_MIXED);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    mg_ref_plan plan;
    const mg_ref_seqs seqs = { m, NULL, 0, 0 };
    if (mg_ref_seqs_plan(&seqs, batch, T, "test_starts_split", &plan) != MG_OK) mg_tap_bail("mg_ref_seqs_plan");
    for (int k = 0; k < N_SCANS; ++k) {
        use_scan(k);
        memcpy(mcs, cs0, ncs * sizeof(float)); memcpy(mss, ss0, nss * sizeof(float));
        memcpy(scs, cs0, ncs * sizeof(float)); memcpy(sss, ss0, nss * sizeof(float));
        mg_status s = gpu_starts(batch, T, u, mout, mcs, mss, m, 0);
        for (int i = 0; i < plan.nseg && s == MG_OK; ++i) {
            const mg_ref_seg *g = &plan.seg[i];
            if (g->from_init) {
                stream_state(cs1, scs, batch, g->stream, pcs1, 1);
                stream_state(ss1, sss, batch, g->stream, pss1, 1);
            } else {
                memset(cs1, 0, model_conv_state_floats(1) * sizeof(float));
                memset(ss1, 0, model_ssm_state_floats(1) * sizeof(float));
            }
            s = gpu_prefill(1, g->len, u + g->row * IN_DIM, sout + g->row * D_MODEL, cs1, ss1);
            if (s == MG_OK && g->to_final) {
                stream_state(cs1, scs, batch, g->stream, pcs1, 0);
                stream_state(ss1, sss, batch, g->stream, pss1, 0);
            }
        }
        char what[200];
        if (!mg_tap_ok(s == MG_OK, "prefill_starts b=%d T=%d and its %d segments as separate prefill calls run (%s)",
                       batch, T, plan.nseg, scan_name[k])) {
            mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
            continue;
        }
        static const char *const part[3] = { "out", "conv_state", "ssm_state" };
        const float *got[3] = { mout, mcs, mss }, *want[3] = { sout, scs, sss };
        const size_t n[3] = { n_out(batch, T), ncs, nss };
        for (int i = 0; i < 3; ++i) {
            snprintf(what, sizeof what, "prefill_starts (mixed, %s) vs the hand split into prefill calls "
                     "(within TOL: the pieces' GEMMs have other shapes): %s", scan_name[k], part[i]);
            cmp_gpu(what, got[i], want[i], n[i]);
        }
    }
    mg_ref_seqs_plan_free(&plan);
    scan_spec();
    free(u); free(cs0); free(ss0); free(mout); free(mcs); free(mss); free(sout); free(scs); free(sss);
    free(cs1); free(ss1); free(m);
}

/* Bad calls of prefill_starts / burn_in_starts: the documented status, and
 * nothing launched (out and the states keep their sentinel values). */
static void test_starts_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH), T = imin(3, MAX_SEQ_LEN);
    const size_t no = n_out(B, T), ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *du = mg_tap_dalloc(n_u(B, T)), *dout = mg_tap_dalloc(no), *dcs = mg_tap_dalloc(ncs), *dss = mg_tap_dalloc(nss);
    float *sent = FALLOC(no + ncs + nss), *back = FALLOC(no + ncs + nss);
    for (size_t i = 0; i < no + ncs + nss; ++i) sent[i] = 777.0f + (float)(i % 53);
    mg_tap_up(dout, sent, no); mg_tap_up(dcs, sent + no, ncs); mg_tap_up(dss, sent + no + ncs, nss);
    unsigned char *dm = dalloc_bytes((size_t)B * T);
    unsigned char *hm = (unsigned char *)mg_tap_calloc((size_t)B * T);   /* plain host memory */
    if (cudaMemset(dm, 1, (size_t)B * T) != cudaSuccess) mg_tap_bail("cudaMemset");
    mg_tap_expect_error(model_prefill_starts(model, B, T, du, dout, dcs, dss, hm), MG_ERR_INVALID_ARG,
                        "_prefill_starts: start", "prefill_starts with a mask in unregistered host memory");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du, dout, dcs, dss, hm), MG_ERR_INVALID_ARG,
                         "burn_in_starts with a mask in unregistered host memory");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, dout, dcs, dss, (const uint8_t *)(uintptr_t)0x1000),
                         MG_ERR_INVALID_ARG, "prefill_starts with a mask pointer CUDA does not know");
    mg_tap_expect_status(model_prefill_starts(NULL, B, T, du, dout, dcs, dss, dm), MG_ERR_INVALID_ARG,
                         "prefill_starts with a NULL model");
    mg_tap_expect_status(model_prefill_starts(model, 0, T, du, dout, dcs, dss, dm), MG_ERR_INVALID_ARG,
                         "prefill_starts batch = 0");
    mg_tap_expect_status(model_prefill_starts(model, B, MAX_SEQ_LEN + 1, du, dout, dcs, dss, dm), MG_ERR_INVALID_ARG,
                         "prefill_starts seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du, dout, dcs, NULL, dm), MG_ERR_INVALID_ARG,
                         "prefill_starts conv_state without ssm_state");
    mg_tap_expect_status(model_prefill_starts(model, B, T, du + 1, dout, dcs, dss, dm), MG_ERR_ALIGNMENT,
                         "prefill_starts misaligned u");
    mg_tap_expect_status(model_burn_in_starts(model, B, T, du, NULL, dcs, dss, dm), MG_ERR_INVALID_ARG,
                         "burn_in_starts last_out = NULL");
    mg_tap_down(back, dout, no); mg_tap_down(back + no, dcs, ncs); mg_tap_down(back + no + ncs, dss, nss);
    mg_tap_ok(cudaDeviceSynchronize() == cudaSuccess && memcmp(back, sent, (no + ncs + nss) * sizeof(float)) == 0,
              "bad prefill_starts / burn_in_starts calls left out and the states untouched");
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dcs); mg_dev_free(dss); mg_dev_free(dm);
    free(sent); free(back); free(hm);
}

/* Decode graph: T replays == T eager decode steps, bit for bit (out of every
 * step, final states), from the same random state. */
static void test_decode_graph(int batch, int T, int level, uint64_t seed)
{
    if (model_set_decode_fused(model, level) != MG_OK) mg_tap_bail("set_decode_fused");
    const size_t ncs = model_conv_state_floats(batch), nss = model_ssm_state_floats(batch);
    float *u = FALLOC(n_u(batch, T)), *cs0 = FALLOC(ncs), *ss0 = FALLOC(nss);
    float *oe = FALLOC(n_out(batch, T)), *og = FALLOC(n_out(batch, T));
    float *cse = FALLOC(ncs), *sse = FALLOC(nss), *csg = FALLOC(ncs), *ssg = FALLOC(nss);
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    mg_tap_randn(cs0, ncs, seed + 1, 0.5f);
    mg_tap_randn(ss0, nss, seed + 2, 0.5f);
    /* eager buffers / graph buffers (fixed pointers) */
    float *due = mg_tap_dalloc(n_u(batch, 1)), *doe = mg_tap_dalloc(n_out(batch, 1)), *dcse = mg_tap_dalloc(ncs), *dsse = mg_tap_dalloc(nss);
    float *dug = mg_tap_dalloc(n_u(batch, 1)), *dog = mg_tap_dalloc(n_out(batch, 1)), *dcsg = mg_tap_dalloc(ncs), *dssg = mg_tap_dalloc(nss);
    mg_tap_up(dcse, cs0, ncs); mg_tap_up(dsse, ss0, nss); mg_tap_up(dcsg, cs0, ncs); mg_tap_up(dssg, ss0, nss);
    if (cudaMemset(dug, 0, n_u(batch, 1) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");   /* warm-up input */
    model_graph *g = NULL;
    mg_status s = model_decode_graph_create(model, batch, dug, dog, dcsg, dssg, &g);
    if (!mg_tap_ok(s == MG_OK, "decode_graph_create batch=%d (decode level %d)", batch, level)) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    /* creation left the states untouched */
    if (s == MG_OK) {
        mg_tap_down(csg, dcsg, ncs); mg_tap_down(ssg, dssg, nss);
        mg_tap_ok(memcmp(csg, cs0, ncs * sizeof(float)) == 0 && memcmp(ssg, ss0, nss * sizeof(float)) == 0,
               "decode_graph_create leaves the states untouched");
    }
    s = decode_graph_steps(g, batch, T, u, due, doe, (float *const[]){ dcse, dsse }, dug, dog, oe, og, s);
    if (g) {
        if (mg_tap_ok(s == MG_OK, "decode graph: %d replays and %d eager steps of batch %d run", T, T, batch)) {
            mg_tap_down(cse, dcse, ncs); mg_tap_down(sse, dsse, nss); mg_tap_down(csg, dcsg, ncs); mg_tap_down(ssg, dssg, nss);
            int same_out = memcmp(oe, og, n_out(batch, T) * sizeof(float)) == 0;
            if (!same_out) { mg_err e = mg_compare_f32f32(og, oe, n_out(batch, T)); mg_tap_diag("graph vs eager out: rel_l2 %.3e", e.rel_l2); }
            mg_tap_ok(same_out, "decode graph replay == eager decode: out of every step, bit-identical");
            mg_tap_ok(memcmp(cse, csg, ncs * sizeof(float)) == 0 && memcmp(sse, ssg, nss * sizeof(float)) == 0,
                   "decode graph replay == eager decode: final states bit-identical");
        } else {
            mg_tap_diag("%s", mg_last_error());
        }
        model_decode_graph_destroy(g);
    }
    mg_dev_free(due); mg_dev_free(doe); mg_dev_free(dcse); mg_dev_free(dsse);
    mg_dev_free(dug); mg_dev_free(dog); mg_dev_free(dcsg); mg_dev_free(dssg);
    free(u); free(cs0); free(ss0); free(oe); free(og); free(cse); free(sse); free(csg); free(ssg);
    model_set_decode_fused(model, dec_default);
}

static void test_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH), T = imin(3, MAX_SEQ_LEN);
    const size_t nu = n_u(B, T), no = n_out(B, T);
    const size_t ncs = model_conv_state_floats(B), nss = model_ssm_state_floats(B);
    float *du = mg_tap_dalloc(nu), *dout = mg_tap_dalloc(no + 4), *dcs = mg_tap_dalloc(ncs + 4), *dss = mg_tap_dalloc(nss + 4);
    const size_t ns = nu + no + ncs + nss + 12;
    float *sent = FALLOC(ns), *back = FALLOC(ns);
    for (size_t i = 0; i < ns; ++i) sent[i] = 12345.0f + (float)(i % 97);
    memset(back, 0, ns * sizeof(float));
    mg_tap_up(du, sent, nu);
    mg_tap_up(dout, sent, no + 4);
    mg_tap_up(dcs, sent, ncs + 4);
    mg_tap_up(dss, sent, nss + 4);

    mg_tap_expect_status(model_prefill(NULL, B, T, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill with a NULL model");
    mg_tap_expect_status(model_prefill(model, 0, T, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill batch = 0");
    mg_tap_expect_status(model_prefill(model, MAX_BATCH + 1, T, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_prefill(model, B, 0, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill seqlen = 0");
    mg_tap_expect_status(model_prefill(model, B, MAX_SEQ_LEN + 1, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_prefill(model, B, T, NULL, dout, dcs, dss), MG_ERR_INVALID_ARG, "prefill u = NULL");
    mg_tap_expect_status(model_prefill(model, B, T, du, NULL, dcs, dss), MG_ERR_INVALID_ARG, "prefill out = NULL");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, dcs, NULL), MG_ERR_INVALID_ARG, "prefill conv_state without ssm_state");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, NULL, dss), MG_ERR_INVALID_ARG, "prefill ssm_state without conv_state");
    mg_tap_expect_status(model_prefill(model, B, T, du + 1, dout, dcs, dss), MG_ERR_ALIGNMENT, "prefill misaligned u");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout + 1, dcs, dss), MG_ERR_ALIGNMENT, "prefill misaligned out");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, dcs + 1, dss), MG_ERR_ALIGNMENT, "prefill misaligned conv_state");
    mg_tap_expect_status(model_prefill(model, B, T, du, dout, dcs, dss + 2), MG_ERR_ALIGNMENT, "prefill misaligned ssm_state");
    mg_tap_expect_status(model_decode_step(model, B, du, dout, NULL, NULL), MG_ERR_INVALID_ARG, "decode_step without states");
    mg_tap_expect_status(model_set_decode_fused(model, 3), MG_ERR_INVALID_ARG, "set_decode_fused(3)");
    mg_tap_expect_status(model_set_decode_fused(model, -1), MG_ERR_INVALID_ARG, "set_decode_fused(-1)");
    mg_tap_expect_status(model_set_decode_fused(NULL, 1), MG_ERR_INVALID_ARG, "set_decode_fused NULL model");
    mg_tap_expect_status(model_burn_in(model, B, T, du, NULL, dcs, dss), MG_ERR_INVALID_ARG, "burn_in last_out = NULL");
    mg_tap_expect_status(model_burn_in(model, B, MAX_SEQ_LEN + 1, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "burn_in seqlen = MAX_SEQ_LEN + 1");
    mg_tap_expect_status(model_burn_in(model, B, T, du, dout, dcs, NULL), MG_ERR_INVALID_ARG, "burn_in conv_state without ssm_state");
    {
        model_graph *g = NULL;
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, NULL, NULL, &g), MG_ERR_INVALID_ARG, "decode_graph_create without states");
        mg_tap_expect_status(model_decode_graph_create(model, B, du, dout, dcs, dss, NULL), MG_ERR_INVALID_ARG, "decode_graph_create graph pointer NULL");
        mg_tap_expect_status(model_decode_graph_launch(NULL), MG_ERR_INVALID_ARG, "decode_graph_launch NULL");
    }
    mg_tap_expect_status(model_set_scan(model, 7), MG_ERR_INVALID_ARG, "set_scan unknown choice");
#if !MODEL_HAS_CHUNKED_SCAN
    mg_tap_expect_status(model_set_scan(model, MODEL_SCAN_CHUNKED), MG_ERR_INVALID_ARG, "set_scan chunked without chunked kernels");
#endif
    mg_tap_expect_status(model_decode_step(model, 0, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "decode_step batch = 0");
    mg_tap_expect_status(model_decode_step(model, MAX_BATCH + 1, du, dout, dcs, dss), MG_ERR_INVALID_ARG, "decode_step batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_set_weights(model, NULL, (size_t)MODEL_WEIGHTS_FLOATS), MG_ERR_INVALID_ARG, "set_weights NULL blob");
    mg_tap_expect_status(model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS - 1), MG_ERR_SIZE, "set_weights one float short");
    mg_tap_expect_status(model_set_weights(model, d_blob + 1, (size_t)MODEL_WEIGHTS_FLOATS), MG_ERR_ALIGNMENT, "set_weights misaligned blob");

    mg_tap_down(back, dout, no + 4);
    mg_tap_down(back + no + 4, dcs, ncs + 4);
    mg_tap_down(back + no + ncs + 8, dss, nss + 4);
    mg_tap_ok(memcmp(back, sent, (no + 4) * sizeof(float)) == 0 &&
           memcmp(back + no + 4, sent, (ncs + 4) * sizeof(float)) == 0 &&
           memcmp(back + no + ncs + 8, sent, (nss + 4) * sizeof(float)) == 0,
           "bad calls left out, conv_state and ssm_state untouched");
    /* The failed set_weights calls kept the weights: a valid call still works. */
    mg_status s = model_prefill(model, B, T, du, dout, NULL, NULL);
    mg_tap_ok(s == MG_OK && cudaDeviceSynchronize() == cudaSuccess, "a valid call after the bad ones succeeds");
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dcs); mg_dev_free(dss);
    free(sent); free(back);
}

int main(void)
{
    if (!mg_tap_start()) return 0;
    double scale;
    /* Tokens the CPU reference may process in the whole run. */
    const int budget = mg_tap_budget(REF_BUDGET_MACS, REF_MACS_PER_TOKEN, 8, &scale);
    mg_tap_diag(MODEL_NAME ": D=%d E=%d N=%d K=%d R=%d layers=%d in_dim=%d max_batch=%d max_seq_len=%d scan_tchunk=%d",
         D_MODEL, MODEL_D_INNER, MODEL_D_STATE, MODEL_D_CONV, MODEL_DT_RANK,
         MODEL_N_LAYERS, IN_DIM, MAX_BATCH, MAX_SEQ_LEN, SCAN_TCHUNK);
    mg_tap_diag("reference budget: %d tokens (MG_TEST_SCALE=%g)", budget, scale);

    dims = (mg_m1_dims)MODEL_REF_DIMS;
    if (mg_ref_mamba1_layout(&dims, &lay) != MG_OK) mg_tap_bail("mg_ref_mamba1_layout");
    test_param_table();
    fwd_model_start();
    if (MODEL_HAS_DECODE_SINGLE && mg_tap_no_clusters()) {
        dec_default = MODEL_DECODE_FUSED;
        if (model_set_decode_fused(model, dec_default) != MG_OK) mg_tap_bail("set_decode_fused");
        mg_tap_diag("MG_TEST_NO_CLUSTERS=1: decode on the fused path, the single-launch decode's cases skipped");
    }

    /* Sections (mg_tap_section: MG_TEST_PART / MG_TEST_ONLY can split or
     * narrow the run; by default every one runs, in this order). */
    const int ba = imin(2, MAX_BATCH);
    if (mg_tap_section("prefill")) {
        /* Case A: small batch, a length crossing a scan time chunk (not a
         * multiple of it), from a random initial state. */
        const int ta = imin(MAX_SEQ_LEN, imin(SCAN_TCHUNK + 3, imax(1, budget / 3 / ba)));
        test_prefill(ba, ta, 1, 101);

        /* Case B: batch = MAX_BATCH, fresh start (NULL states). */
        if (MAX_BATCH > ba && MAX_BATCH <= budget / 4) {
            const int tb = imin(MAX_SEQ_LEN, imin(2 * SCAN_TCHUNK + 5, imax(1, budget / 4 / MAX_BATCH)));
            test_prefill(MAX_BATCH, tb, 0, 202);
        } else if (MAX_BATCH > ba) {
            mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)", "prefill batch = MAX_BATCH vs reference");
        } else {
            test_prefill(1, imin(MAX_SEQ_LEN, imax(1, budget / 8)), 0, 202);
        }
    }

    /* Continuation across two calls. */
    if (mg_tap_section("continuation")) {
        if (MAX_SEQ_LEN >= 2) {
            const int bc = imin(2, MAX_BATCH);
            const int tt = imin(MAX_SEQ_LEN, imin(SCAN_TCHUNK + 5, imax(2, budget / 4 / bc)));
            int t1 = tt / 2 + 1;
            if (t1 >= tt) t1 = tt - 1;
            test_continuation(bc, t1, tt - t1, 303);
        } else {
            mg_tap_skip("MAX_SEQ_LEN < 2", "continuation across two prefill calls");
        }
    }

    /* Decode steps vs prefill (GPU only: any length). */
    if (mg_tap_section("decode")) {
        test_decode(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, SCAN_TCHUNK + 3), 404);

        /* Fused single-token decode vs the unfused path and prefill(seqlen 1). */
        test_decode_fused(imin(3, MAX_BATCH), 5, 414);
        test_decode_fused(MAX_BATCH, 2, 415);
    }

    /* Single-launch decode vs the fused path (and the reference): batch 1,
     * a middle batch, MAX_BATCH. */
    if (mg_tap_section("decode single")) {
        test_decode_single(1, imin(MAX_SEQ_LEN, 6), 416);
        /* a partly filled last cluster at the largest tile: 2 * MAX_TILE + 1 streams (within MAX_BATCH) */
        test_decode_tiles(imin(MAX_BATCH, 2 * MODEL_DECODE_SINGLE_MAX_TILE + 1), imin(MAX_SEQ_LEN, 3), 419);
        if (MAX_BATCH > 2) test_decode_single((MAX_BATCH + 1) / 2, 4, 417);
        if (MAX_BATCH > 1) test_decode_single(MAX_BATCH, 3, 418);
    }

    /* Bit-identical reruns. */
    if (mg_tap_section("determinism")) test_determinism(ba, imin(MAX_SEQ_LEN, SCAN_TCHUNK + 3), 505);

    /* The fused conv + x_proj against conv + GEMM: 37 steps, two conv
     * tiles of 16 and a partial third, two streams. */
    if (mg_tap_section("conv x_proj")) test_conv_xproj(imin(2, MAX_BATCH), imin(MAX_SEQ_LEN, 37), 515);

    if (mg_tap_section("bad calls")) test_bad_calls();

#if MODEL_HAS_CHUNKED_SCAN
    /* Chunked scan: a length that is not a multiple of the chunk (several
     * chunks), exactly one chunk, a partial single chunk, vs the sequential
     * scan and the reference; then a long call (GPU only). */
    if (mg_tap_section("chunked")) {
        const int bq = imin(2, MAX_BATCH);
        const int tq = imin(MAX_SEQ_LEN, imin(3 * SCAN_CHUNK + 5, imax(1, budget / 4 / bq)));
        test_chunked(bq, tq, 1, 707);
        test_chunked(1, imin(MAX_SEQ_LEN, SCAN_CHUNK), 1, 708);
        test_chunked(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, SCAN_CHUNK / 2 + 1), 1, 709);
        test_chunked(imin(2, MAX_BATCH), MAX_SEQ_LEN, 0, 710);
#if MODEL_SCAN_MODE_ID == 2
        test_dispatch(1, imin(MAX_SEQ_LEN, MODEL_SCAN_AUTO_MIN_LEN), 711);
#else
        if (MAX_SEQ_LEN > SCAN_CHUNK) test_dispatch(1, imin(MAX_SEQ_LEN, 2 * SCAN_CHUNK + 1), 711);
#endif
    }
#endif

    /* Burn-in (target network): last step only. */
    if (mg_tap_section("burn-in")) {
        const int bb = imin(2, MAX_BATCH);
        const int tb = imin(MAX_SEQ_LEN, imin(2 * SCAN_TCHUNK + 7, imax(1, budget / 6 / bb)));
        test_burn_in(bb, tb, 1, 808);
        test_burn_in(imin(3, MAX_BATCH), 1, 0, 809);
    }

    /* Decode CUDA Graph: replay == eager, bit for bit. */
    if (mg_tap_section("decode graph")) {
        test_decode_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 8), dec_default, 909);
        test_decode_graph(MAX_BATCH, 3, dec_default, 910);
        test_decode_graph(imin(3, MAX_BATCH), 3, MODEL_DECODE_FUSED, 911);
        test_decode_graph(1, 4, dec_default, 912);
    }

    /* Prefill CUDA Graph: windows replayed == eager prefill, bit for bit
     * (short windows, and one long enough for the chunked scan at batch 1). */
    if (mg_tap_section("prefill graph")) {
        test_prefill_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 37), 3, 0, 950);
        test_prefill_graph(1, imin(MAX_SEQ_LEN, 3 * MODEL_SCAN_CHUNK + 5), 2, 0, 960);
        test_prefill_graph(imin(3, MAX_BATCH), imin(MAX_SEQ_LEN, 37), 3, 1, 970);
    }

    /* Decode with a reset mask, on every decode path, and its graph. */
    if (mg_tap_section("decode reset")) {
        static const char *const path[3] = { "unfused decode", "fused decode", "single-launch decode" };
        for (int level = MODEL_DECODE_UNFUSED; level <= (MODEL_HAS_DECODE_SINGLE && !mg_tap_no_clusters() ? MODEL_DECODE_SINGLE : MODEL_DECODE_FUSED);
             ++level) {
            if (model_set_decode_fused(model, level) != MG_OK) mg_tap_bail("set_decode_fused");
            test_decode_reset(imin(4, MAX_BATCH), 3, path[level], 920 + (uint64_t)level);
            if (MAX_BATCH > 4) test_decode_reset(MAX_BATCH, 2, path[level], 930 + (uint64_t)level);
            test_decode_graph_reset(imin(5, MAX_BATCH), 6, path[level], 940 + (uint64_t)level);
        }
        model_set_decode_fused(model, dec_default);
        test_reset_bad_calls();
    }

    /* Weights out of the init range (REF(push_ranges): softplus's argument
     * above its threshold): out and final states vs the reference, from a
     * random state, over two scan time chunks and a few steps. */
    if (mg_tap_section("pushed weights")) {
        fwd_weights_pushed(4711);
        test_prefill(imin(2, MAX_BATCH), imin(MAX_SEQ_LEN, imin(2 * SCAN_TCHUNK + 5, imax(1, budget / 8 / imin(2, MAX_BATCH)))), 1, 1101);
        fwd_weights_init();
    }
    /* Episode starts in prefill and burn-in: vs the reference (mixed starts:
     * t = 0, chunk edges, mid-chunk, consecutive, the last token; every
     * stream at one token), on every scan; the exact properties; vs decode
     * with the reset mask; vs the hand split; bad calls. */
    if (mg_tap_section("starts")) {
        const int bs = imin(5, MAX_BATCH);
        const int ts = imin(MAX_SEQ_LEN, imin(2 * SCAN_CHUNK + 9, imax(2, budget / 6 / bs)));
        test_starts_ref(bs, ts, MG_TAP_STARTS_MIXED, 1001);
        test_starts_ref(imin(3, MAX_BATCH), imin(ts, SCAN_CHUNK + 5), MG_TAP_STARTS_MID, 1002);
        test_starts_exact(imin(4, MAX_BATCH), imin(MAX_SEQ_LEN, 2 * SCAN_CHUNK + 3), 1003);
        test_starts_decode(bs, imin(MAX_SEQ_LEN, SCAN_TCHUNK + 6), 1004);
        test_starts_split(bs, imin(MAX_SEQ_LEN, 2 * SCAN_CHUNK + 9), 1005);
        test_starts_bad_calls();
        test_packed(1006);
        test_packed_from(1007);
        test_packed_bad_calls();
    }

    /* The library's own self-check. */
    if (mg_tap_section("selfcheck")) test_selfcheck(imin(MAX_SEQ_LEN, imax(1, budget / 8)));

    return fwd_end();
}
