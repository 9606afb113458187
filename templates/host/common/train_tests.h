/* train_tests.h: what NAME_train_test.c shares with the training test of
 * every other arch. Not a standalone header: the program includes it twice.
 *
 * First, right after its own #includes (part 1): the sizes and tolerances,
 * the globals every arch has (blob, d_blob, inside, n_tens, tr), the
 * allocation and comparison helpers (FALLOC, DALLOC_H, imin, imax, n_u,
 * n_out, cmp_ref).
 *
 * Then, after its arch's globals (dims, lay, tens) and helpers (run_out,
 * run_alloc, gpu_run, run_free) and the arguments that differ by arch:
 * NO_STATES (NULL for every state argument of the library's calls),
 * NO_STATE0 (gpu_run's fresh start), MATRIX_SUFFIXES (the names of the
 * weights that are matrices), and for the training graph: NST, st_floats,
 * RAND_CALL, STATE_ARGS, CREATE_CHECKS_STATE, STATE_NAMES, and for packed
 * sequences REF_TRAIN_PACKED and REF_TRAIN_PACKED_FROM (the reference's packed forward_ex and
 * backward_ex from zero states) and CMP_FINAL_STATES (part 2): the
 * tests every arch runs word for word: AdamW vs a CPU implementation in
 * double (test_adamw), a NaN gradient skips the update (test_adamw_skip),
 * dynamic loss scaling (test_loss_scaling), gradient accumulation
 * (test_grad_accumulate), a few MSE training steps
 * (test_training), the training step as a CUDA Graph (test_train_graph),
 * AdamW's bad arguments (test_bad_adamw), packed sequences
 * (test_train_packed); and the steps of main around the
 * arch's own tests (train_budget, train_start, test_grads_first,
 * test_grads_chunks, test_grads_pushed, train_end). The chunked-backward tests' call (chunked_call) is in part
 * 1. */
#ifndef MG_TRAIN_TESTS_PART1
#define MG_TRAIN_TESTS_PART1

#define IN_DIM      MODEL_IN_DIM
#define D_MODEL     MODEL_D_MODEL
#define N_LAYERS    MODEL_N_LAYERS
#define MAX_BATCH   MODEL_MAX_BATCH
#define MAX_SEQ_LEN MODEL_MAX_SEQ_LEN
#define WFLOATS     ((size_t)MODEL_WEIGHTS_FLOATS)
#define FWD_TOL     MODEL_CHECK_TOL
#define GRAD_TOL    MODEL_GRAD_TOL
#define CKPT        MODEL_CKPT_STRIDE
#define ADAMW_TOL   2e-6
#define REF_MACS_PER_TOKEN (4.0 * MODEL_REF_MACS_PER_TOKEN)   /* forward + backward of the reference */
#define REF_BUDGET_MACS 4.0e9

static int n_tens;
static float *blob, *d_blob;
static model_trainer *tr;

#define FALLOC(n) ((float *)mg_tap_calloc((size_t)(n) * sizeof(float)))
#define DALLOC_H(n) ((double *)mg_tap_calloc((size_t)(n) * sizeof(double)))

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }
static size_t n_u(int b, int t) { return (size_t)b * t * IN_DIM; }
static size_t n_out(int b, int t) { return (size_t)b * t * D_MODEL; }

#define TRAIN_INIT_SEED 20240607ull   /* the weights of every check but the pushed ones */

/* The pushed-weights case (test_grads_pushed): appended to the names of
 * its checks, and the offset MODEL_REF(push_ranges) asks for on channel 0
 * of every input token (push_inputs; 0 otherwise, and then a no-op). */
static const char *weights_tag = "";
static float u_offset0;
static void push_inputs(float *u, size_t tokens)
{
    if (u_offset0 != 0.0f)
        for (size_t i = 0; i < tokens; ++i) u[i * IN_DIM] += u_offset0;
}

/* 1 for blob elements inside a tensor, 0 for padding. */
static unsigned char *inside;

static int cmp_ref(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    mg_err e = mg_compare_f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e.max_abs, e.rel_l2, e.n);
    return mg_tap_ok(mg_err_ok(&e, tol), "%s: rel_l2 <= %g", what, tol);
}

/* An initial state's gradient vs the reference; where the reference's is
 * all zeros (an exact 0: from a fresh start, k_prev and v_prev of Mamba-3
 * enter only through their product), 0 vs 0 proves nothing: a TAP skip
 * saying so (the random-state run compares that gradient). */
static int cmp_ref_state_grad(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    size_t nz = 0;
    for (size_t i = 0; i < n; ++i) nz += ref[i] != 0.0;
    if (nz > 0) return cmp_ref(what, got, ref, n, tol);
    mg_err e = mg_compare_f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e (the reference's is exactly 0)", what, e.max_abs);
    mg_tap_skip("the exact gradient is 0 here, 0 vs 0 proves nothing (checked from a random state)", what);
    return 1;
}

#if MODEL_HAS_CHUNKED_BWD
/* The call of a chunked-backward test (NAME in its checks, DIAG_NAME in
 * its diag line) over chunks of q steps (UNIT): B = min(2, MAX_BATCH), T =
 * t0 less one when a multiple of stride, *n chunks. 0 (a TAP skip) when T
 * is one chunk at most, else 1. */
static int chunked_call(int t0, int q, int stride, const char *name, const char *diag_name, const char *unit,
                        int *B, int *T, int *n)
{
    *T = t0;
    if (*T % stride == 0) --*T;
    if (*T <= q) {
        char why[64], what[128];
        snprintf(why, sizeof why, "MAX_SEQ_LEN allows one %s only", unit);
        snprintf(what, sizeof what, "%s over several %ss", name, unit);
        mg_tap_skip(why, what);
        return 0;
    }
    *B = imin(2, MAX_BATCH);
    *n = (*T + q - 1) / q;
    mg_tap_diag("%s: b=%d T=%d, %d %ss of %d steps (last %d)", diag_name, *B, *T, *n, unit, q, *T - (*n - 1) * q);
    return 1;
}
#endif

#else /* part 2 */

static int is_matrix(const char *nm)
{
    static const char *suffix[] = { MATRIX_SUFFIXES };
    const size_t ln = strlen(nm);
    for (size_t k = 0; k < sizeof suffix / sizeof suffix[0]; ++k) {
        const size_t ls = strlen(suffix[k]);
        if (ln >= ls && strcmp(nm + ln - ls, suffix[k]) == 0) return 1;
    }
    return 0;
}

static void test_adamw(int clip, int matrices_only, uint64_t seed)
{
    float *w = FALLOC(WFLOATS), *g = FALLOC(WFLOATS), *m = FALLOC(WFLOATS), *v = FALLOC(WFLOATS);
    float *w2 = FALLOC(WFLOATS), *m2 = FALLOC(WFLOATS), *v2 = FALLOC(WFLOATS), *stat = FALLOC(2);
    double *rw = DALLOC_H(WFLOATS), *rm = DALLOC_H(WFLOATS), *rv = DALLOC_H(WFLOATS);
    memcpy(w, blob, WFLOATS * sizeof(float));
    mg_tap_randn(g, WFLOATS, seed, 0.01f);
    mg_tap_randn(m, WFLOATS, seed + 1, 0.001f);
    mg_tap_randn(v, WFLOATS, seed + 2, 1e-4f);
    unsigned char *dec = (unsigned char *)mg_tap_calloc(WFLOATS);
    for (int i = 0; i < n_tens; ++i)
        memset(dec + tens[i].offset, matrices_only ? is_matrix(tens[i].name) : 1, tens[i].numel);
    for (size_t i = 0; i < WFLOATS; ++i) {
        v[i] = v[i] * v[i];
        if (!inside[i]) { g[i] = 0.0f; w[i] = 0.0f; m[i] = 0.5f; v[i] = 0.25f; }   /* padding sentinels */
    }
    double nrm = 0.0;
    for (size_t i = 0; i < WFLOATS; ++i) nrm += (double)g[i] * g[i];
    nrm = sqrt(nrm);
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.1f;
    p.max_grad_norm = clip ? (float)(0.25 * nrm) : 0.0f;
    p.step = 3;
    p.wd_matrices_only = matrices_only;
    /* CPU reference in double (torch.optim.AdamW + clip_grad_norm_) */
    double sc = 1.0;
    if (p.max_grad_norm > 0.0f) { sc = (double)p.max_grad_norm / (nrm + 1e-6); if (sc > 1.0) sc = 1.0; }
    const double bc1 = 1.0 - pow(p.beta1, p.step), bc2 = 1.0 - pow(p.beta2, p.step);
    for (size_t i = 0; i < WFLOATS; ++i) {
        if (!inside[i]) { rw[i] = w[i]; rm[i] = m[i]; rv[i] = v[i]; continue; }
        const double gi = g[i] * sc;
        double pw = w[i];
        if (dec[i]) pw *= 1.0 - (double)p.lr * p.weight_decay;
        rm[i] = p.beta1 * (double)m[i] + (1.0 - p.beta1) * gi;
        rv[i] = p.beta2 * (double)v[i] + (1.0 - p.beta2) * gi * gi;
        rw[i] = pw - (double)p.lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + p.eps);
    }
    float *dw = mg_tap_dalloc(WFLOATS), *dg = mg_tap_dalloc(WFLOATS), *dm = mg_tap_dalloc(WFLOATS), *dv = mg_tap_dalloc(WFLOATS);
    mg_tap_up(dw, w, WFLOATS); mg_tap_up(dg, g, WFLOATS); mg_tap_up(dm, m, WFLOATS); mg_tap_up(dv, v, WFLOATS);
    mg_status s = model_adamw_step(tr, dw, dg, dm, dv, &p);
    const char *how = clip ? "clipping active" : "no clipping";
    const char *wd = matrices_only ? "decay on matrices" : "decay on all";
    if (mg_tap_ok(s == MG_OK, "adamw_step (%s, %s) runs", how, wd)) {
        mg_tap_down(w2, dw, WFLOATS); mg_tap_down(m2, dm, WFLOATS); mg_tap_down(v2, dv, WFLOATS);
        mg_tap_down(stat, model_trainer_grad_norm(tr), 2);
        char what[160];
        snprintf(what, sizeof what, "adamw (%s, %s): weights vs CPU double", how, wd);
        cmp_ref(what, w2, rw, WFLOATS, ADAMW_TOL);
        snprintf(what, sizeof what, "adamw (%s, %s): m vs CPU double", how, wd);
        cmp_ref(what, m2, rm, WFLOATS, ADAMW_TOL);
        snprintf(what, sizeof what, "adamw (%s, %s): v vs CPU double", how, wd);
        cmp_ref(what, v2, rv, WFLOATS, ADAMW_TOL);
        mg_tap_diag("grad norm: device %.9g, CPU %.9g; clip scale device %.9g, CPU %.9g", stat[0], nrm, stat[1], sc);
        mg_tap_ok(fabs(stat[0] - nrm) <= 1e-6 * nrm && fabs(stat[1] - sc) <= 1e-6 * sc,
               "adamw (%s): device global grad norm and clip scale match the CPU", how);
        size_t bad = 0;
        for (size_t i = 0; i < WFLOATS; ++i)
            if (!inside[i] && (w2[i] != w[i] || m2[i] != m[i] || v2[i] != v[i])) ++bad;
        mg_tap_ok(bad == 0, "adamw (%s, %s): padding never written (%zu changed)", how, wd, bad);
    } else {
        mg_tap_diag("%s", mg_last_error());
    }
    mg_dev_free(dw); mg_dev_free(dg); mg_dev_free(dm); mg_dev_free(dv);
    free(w); free(g); free(m); free(v); free(w2); free(m2); free(v2); free(stat); free(dec);
    free(rw); free(rm); free(rv);
}

/* A NaN among the gradients: adamw_step leaves weights and moments as they
 * were, and the norm it reports is not finite. */
static void test_adamw_skip(uint64_t seed)
{
    float *w = FALLOC(WFLOATS), *g = FALLOC(WFLOATS), *m = FALLOC(WFLOATS), *v = FALLOC(WFLOATS);
    float *w2 = FALLOC(WFLOATS), *m2 = FALLOC(WFLOATS), *v2 = FALLOC(WFLOATS), stat[2];
    memcpy(w, blob, WFLOATS * sizeof(float));
    mg_tap_randn(g, WFLOATS, seed, 0.01f);
    mg_tap_randn(m, WFLOATS, seed + 1, 0.001f);
    mg_tap_randn(v, WFLOATS, seed + 2, 0.01f);
    for (size_t i = 0; i < WFLOATS; ++i) v[i] *= v[i];
    size_t k = WFLOATS / 2;
    while (k < WFLOATS && !inside[k]) ++k;   /* an element of a tensor */
    g[k < WFLOATS ? k : 0] = NAN;
    float *dw = mg_tap_dalloc(WFLOATS), *dg = mg_tap_dalloc(WFLOATS), *dm = mg_tap_dalloc(WFLOATS), *dv = mg_tap_dalloc(WFLOATS);
    mg_tap_up(dw, w, WFLOATS); mg_tap_up(dg, g, WFLOATS); mg_tap_up(dm, m, WFLOATS); mg_tap_up(dv, v, WFLOATS);
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.1f;
    p.max_grad_norm = 1.0f; p.step = 1;
    mg_status s = model_adamw_step(tr, dw, dg, dm, dv, &p);
    if (mg_tap_ok(s == MG_OK, "adamw_step with a NaN gradient runs")) {
        mg_tap_down(w2, dw, WFLOATS); mg_tap_down(m2, dm, WFLOATS); mg_tap_down(v2, dv, WFLOATS);
        mg_tap_down(stat, model_trainer_grad_norm(tr), 2);
        mg_tap_ok(memcmp(w, w2, WFLOATS * sizeof(float)) == 0 && memcmp(m, m2, WFLOATS * sizeof(float)) == 0 &&
               memcmp(v, v2, WFLOATS * sizeof(float)) == 0,
               "adamw_step with a NaN gradient skips the update (weights, m, v unchanged)");
        mg_tap_ok(!isfinite(stat[0]) && stat[1] == 0.0f, "... and reports a non-finite norm, clip scale 0 (%g, %g)",
               stat[0], stat[1]);
    } else {
        mg_tap_diag("%s", mg_last_error());
    }
    mg_dev_free(dw); mg_dev_free(dg); mg_dev_free(dm); mg_dev_free(dv);
    free(w); free(g); free(m); free(v); free(w2); free(m2); free(v2);
}

/* The loss scale's arguments, its growth after finite backward calls and its
 * back-off after an overflowing one (dout so large that dout * S is inf). */
static void test_loss_scaling(int B, int T, uint64_t seed)
{
    float sc[4];
    mg_tap_down(sc, model_trainer_loss_scale(tr), 4);
    mg_tap_ok(sc[0] == (MODEL_LOSS_SCALE_INIT > 0.0f ? MODEL_LOSS_SCALE_INIT : 1.0f) &&
           sc[3] == (float)MODEL_LOSS_SCALE_GROWTH,
           "a new trainer's loss scale is the default for " MODEL_PRECISION " (%g, interval %g)", sc[0], sc[3]);
    static const float bad_s[] = { 3.0f, 0.5f, 33554432.0f, -2.0f, NAN };
    for (size_t i = 0; i < sizeof bad_s / sizeof bad_s[0]; ++i) {
        mg_status s = model_trainer_set_loss_scaling(tr, bad_s[i], 10);
        mg_tap_ok(s == MG_ERR_INVALID_ARG, "set_loss_scaling(%g) -> MG_ERR_INVALID_ARG", (double)bad_s[i]);
    }
    mg_tap_ok(model_trainer_set_loss_scaling(tr, 4.0f, 0) == MG_ERR_INVALID_ARG,
           "set_loss_scaling(growth_interval 0) -> MG_ERR_INVALID_ARG");
    mg_tap_ok(model_trainer_set_loss_scaling(NULL, 4.0f, 1) == MG_ERR_INVALID_ARG,
           "set_loss_scaling(NULL trainer) -> MG_ERR_INVALID_ARG");

    float *u = FALLOC(n_u(B, T)), *dout = FALLOC(n_out(B, T));
    mg_tap_randn(u, n_u(B, T), seed, 1.0f);
    mg_tap_randn(dout, n_out(B, T), seed + 1, 1.0f);
    run_out r;
    run_alloc(&r, B, T);
    /* growth: S = 2, interval 2: two finite calls -> 4, a third -> 4 (count 1) */
    mg_status s = model_trainer_set_loss_scaling(tr, 2.0f, 2);
    for (int k = 0; k < 3 && s == MG_OK; ++k) {
        s = gpu_run(B, T, u, NO_STATE0, dout, 1, &r);
        mg_tap_down(sc, model_trainer_loss_scale(tr), 4);
        if (k == 1)
            mg_tap_ok(s == MG_OK && sc[0] == 4.0f && sc[1] == 0.0f,
                   "loss scale 2, interval 2: doubled after two finite backward calls (%g, %g)", sc[0], sc[1]);
    }
    mg_tap_ok(s == MG_OK && sc[0] == 4.0f && sc[1] == 1.0f && sc[2] == 0.0f,
           "... a third call counts 1 toward the next growth (%g, %g, %g non-finite)", sc[0], sc[1], sc[2]);
    /* back-off: dout * S overflows f32 */
    for (size_t i = 0; i < n_out(B, T); ++i) dout[i] = dout[i] < 0.0f ? -1e38f : 1e38f;
    s = model_trainer_set_loss_scaling(tr, 16777216.0f, 2000);
    if (s == MG_OK) s = gpu_run(B, T, u, NO_STATE0, dout, 1, &r);
    mg_tap_down(sc, model_trainer_loss_scale(tr), 4);
    size_t nonfin = 0;
    for (size_t i = 0; i < WFLOATS; ++i) nonfin += !isfinite(r.grads[i]);
    mg_tap_ok(s == MG_OK && nonfin > 0 && sc[0] == 8388608.0f && sc[1] == 0.0f && sc[2] == 1.0f,
           "an overflowing backward: non-finite gradients (%zu), the scale halves (%g), one non-finite call (%g)",
           nonfin, sc[0], sc[2]);
    /* off: S reads 1 and stays */
    s = model_trainer_set_loss_scaling(tr, 0.0f, 1);
    mg_tap_randn(dout, n_out(B, T), seed + 1, 1.0f);
    if (s == MG_OK) s = gpu_run(B, T, u, NO_STATE0, dout, 0, &r);
    mg_tap_down(sc, model_trainer_loss_scale(tr), 4);
    mg_tap_ok(s == MG_OK && sc[0] == 1.0f && sc[1] == 0.0f, "loss scaling off: the scale reads 1 and does not move");
    /* back to this precision's default */
    s = model_trainer_set_loss_scaling(tr, MODEL_LOSS_SCALE_INIT, MODEL_LOSS_SCALE_GROWTH);
    if (s != MG_OK) mg_tap_bail("set_loss_scaling (default)");
    run_free(&r);
    free(u); free(dout);
}

/* ---------------------------------------------------------------- training */
static void test_training(int B, int T, int steps, uint64_t seed)
{
    float *u = FALLOC(n_u(B, T)), *tgt = FALLOC(n_out(B, T)), *out = FALLOC(n_out(B, T)), *loss = FALLOC(steps);
    mg_tap_randn(u, n_u(B, T), seed, 1.0f);
    mg_tap_randn(tgt, n_out(B, T), seed + 1, 0.5f);
    float *dw = mg_tap_dalloc(WFLOATS), *dg = mg_tap_dalloc(WFLOATS), *dm = mg_tap_dalloc(WFLOATS), *dv = mg_tap_dalloc(WFLOATS);
    float *du = mg_tap_dalloc(n_u(B, T)), *dt = mg_tap_dalloc(n_out(B, T)), *dout = mg_tap_dalloc(n_out(B, T)), *dl = mg_tap_dalloc(steps);
    mg_tap_up(dw, blob, WFLOATS); mg_tap_up(du, u, n_u(B, T)); mg_tap_up(dt, tgt, n_out(B, T));
    if (cudaMemset(dm, 0, WFLOATS * sizeof(float)) != cudaSuccess ||
        cudaMemset(dv, 0, WFLOATS * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    mg_status s = model_forward_train(tr, dw, B, T, du, dout, NO_STATES);
    double hl = 0.0;
    if (s == MG_OK) {
        mg_tap_down(out, dout, n_out(B, T));
        for (size_t i = 0; i < n_out(B, T); ++i) hl += 0.5 * ((double)out[i] - tgt[i]) * ((double)out[i] - tgt[i]);
        hl /= (double)n_out(B, T);
    }
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-2f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.0f;
    p.max_grad_norm = 1.0f;
    /* Per step: the loss, the gradient norm and the loss scale, printed if
     * the loss does not go down (they show where a run went wrong). */
    float *gn = FALLOC(steps), *ls = FALLOC(steps), two[2], four[4];
    for (int k = 0; k < steps && s == MG_OK; ++k) {
        p.step = k + 1;
        s = model_train_step_mse(tr, dw, dg, dm, dv, &p, B, T, du, dt, NO_STATES, dl + k);
        if (s != MG_OK) break;
        mg_tap_down(two, model_trainer_grad_norm(tr), 2);
        mg_tap_down(four, model_trainer_loss_scale(tr), 4);
        gn[k] = two[0];
        ls[k] = four[0];
    }
    if (mg_tap_ok(s == MG_OK, "%d MSE training steps (b=%d T=%d) run", steps, B, T)) {
        mg_tap_down(loss, dl, steps);
        int fin = 1;
        for (int k = 0; k < steps; ++k) fin = fin && isfinite(loss[k]);
        if (!fin || !(loss[steps - 1] < 0.8 * loss[0]))
            for (int k = 0; k < steps; ++k)
                mg_tap_diag("step %2d: loss %.6g, grad norm %.6g, loss scale after it %g", k + 1, loss[k], gn[k], ls[k]);
        mg_tap_diag("loss: step 1 %.6g, step %d %.6g (host loss of forward_train %.6g)", loss[0], steps, loss[steps - 1], hl);
        mg_tap_ok(fabs(loss[0] - hl) <= 1e-5 * hl, "device MSE loss equals the host loss of forward_train's output");
        mg_tap_ok(loss[steps - 1] < 0.8 * loss[0], "training reduces the loss (%.4g -> %.4g)", loss[0], loss[steps - 1]);
    } else {
        mg_tap_diag("%s", mg_last_error());
    }
    mg_dev_free(dw); mg_dev_free(dg); mg_dev_free(dm); mg_dev_free(dv);
    mg_dev_free(du); mg_dev_free(dt); mg_dev_free(dout); mg_dev_free(dl);
    free(u); free(tgt); free(out); free(loss); free(gn); free(ls);
}

/* AdamW's bad arguments (dw, dg, dm, dv: device weights, gradient, moments;
 * du: a B x T input). *p is left at the valid hyperparameters of the
 * last call, for the caller's further checks. */
static void test_bad_adamw(float *dw, float *dg, float *dm, float *dv, float *du, int B, int T, model_adamw_params *pp)
{
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.step = 1;
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dv, NULL), MG_ERR_INVALID_ARG, "adamw params = NULL");
    mg_tap_expect_status(model_adamw_step(tr, NULL, dg, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw weights = NULL");
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm + 1, dv, &p), MG_ERR_ALIGNMENT, "adamw misaligned m");
    p.step = 0;
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw step = 0");
    p.step = 1; p.beta1 = 1.0f;
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw beta1 = 1");
    p.beta1 = 0.9f; p.eps = 0.0f;
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw eps = 0");
    p.eps = 1e-8f; p.lr = -1.0f;
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw lr < 0");
    p.lr = 1e-3f;
    mg_tap_expect_status(model_adamw_step(tr, dw, dw, dm, dv, &p), MG_ERR_INVALID_ARG, "adamw grads = weights");
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm, dm, &p), MG_ERR_INVALID_ARG, "adamw v = m");
    mg_tap_expect_status(model_adamw_step(tr, dw, dg, dm + 4, dm, &p), MG_ERR_INVALID_ARG, "adamw m overlaps v");
    mg_tap_expect_status(model_train_step_mse(tr, dw, dg, dm, dv, &p, B, T, du, NULL, NO_STATES, NULL),
                  MG_ERR_INVALID_ARG, "train_step_mse target = NULL");
    *pp = p;
}

/* main's first step once the program has the weights (blob, from the
 * reference's initialisation) and their tensors (tens, n_tens): the padding
 * map, the device copy, the trainer, the loss-scaling test; then the loss
 * scale of the gradient tests. The gradient tests use dout ~ N(0, 1): with
 * loss scaling (the f16 default) a scale that suits it, 2^10, so the
 * comparisons also check that the scale is divided out exactly. */
static void train_start(void)
{
    inside = (unsigned char *)mg_tap_calloc(WFLOATS);
    for (int i = 0; i < n_tens; ++i) memset(inside + tens[i].offset, 1, tens[i].numel);
    d_blob = mg_tap_dalloc(WFLOATS + 64);
    mg_tap_up(d_blob, blob, WFLOATS);
    if (model_trainer_create(&tr, 0) != MG_OK) mg_tap_bail(MODEL_NAME "_trainer_create");
    test_loss_scaling(imin(2, MAX_BATCH), imin(MAX_SEQ_LEN, 5), 808);
    if (MODEL_LOSS_SCALE_INIT > 0.0f && model_trainer_set_loss_scaling(tr, 1024.0f, 2000) != MG_OK)
        mg_tap_bail("set_loss_scaling");
}

/* Tokens the CPU reference may process in the whole run (MG_TEST_SCALE
 * scales the budget), said in a diag line. */
static int train_budget(void)
{
    double scale;
    const int budget = mg_tap_budget(REF_BUDGET_MACS, REF_MACS_PER_TOKEN, 8, &scale);
    mg_tap_diag("reference budget: %d tokens (MG_TEST_SCALE=%g)", budget, scale);
    return budget;
}

/* The first gradient checks vs the reference: batch *ba, a length *ta
 * crossing checkpoint chunks and not a multiple of the stride, from a
 * random state; then a fresh start. */
static void grads_first_shape(int budget, int *ba, int *ta)
{
    *ba = imin(2, MAX_BATCH);
    *ta = imin(MAX_SEQ_LEN, imin(2 * CKPT + 3, imax(1, budget / 3 / *ba)));
}
static void test_grads_first(int budget, int *ba, int *ta)
{
    grads_first_shape(budget, ba, ta);
    test_grads(*ba, *ta, 1, 101);
    const int bb = imin(3, MAX_BATCH);
    const int tb = imin(MAX_SEQ_LEN, imin(CKPT + 1, imax(1, budget / 4 / bb)));
    test_grads(bb, tb, 0, 202);
}

/* The gradients of one sequence over several chunks (T = 3q + 3: three
 * chunks of q steps and a partial one, q the arch's chunk) vs the
 * reference, at batch 1 from a random state: the first checks stay within
 * one chunk on the LM-sized specs, where the reference budget allows a few
 * tokens only. Cost: the reference's forward + backward is about
 * REF_MACS_PER_TOKEN multiply-adds a token (4x the forward's), and it ran
 * at about 1.4e9 of those per second on one core of a 2-core build machine
 * (mamba3_lm dims, gcc -O2), so CHUNKS_CASE_MACS = 1.25e10 is this case's
 * cap: under 10 s there and a few seconds on a GPU host's core (mamba3_lm
 * at 195 tokens: 1.2e10; mamba3_perf: 6e9; mamba1_130m: 3.6e8 a token,
 * so it gets T = 33, three checkpoint chunks of 16, instead of three
 * chunks of 64). A
 * T that fits only one checkpoint chunk is a TAP skip. MG_TEST_SCALE
 * scales the cap as it scales the budget. */
#define CHUNKS_CASE_MACS 1.25e10
static void test_grads_chunks(int q, uint64_t seed)
{
    double scale;
    const int afford = mg_tap_budget(CHUNKS_CASE_MACS, REF_MACS_PER_TOKEN, 1, &scale);
    const int want = imin(MAX_SEQ_LEN, 3 * q + 3);
    int T = imin(want, afford);
    if (T % CKPT == 0) --T;
    if (T < want)
        mg_tap_diag("gradients over several chunks: T=%d of the %d wanted (3 chunks of %d + 3), the reference's "
                    "cap (%.3g multiply-adds, MG_TEST_SCALE=%g) at %.3g a token", T, want, q,
                    CHUNKS_CASE_MACS * scale, scale, (double)REF_MACS_PER_TOKEN);
    if (T <= CKPT) {
        char what[96];
        snprintf(what, sizeof what, "gradients over several chunks (b=1 T=%d) vs the reference", want);
        mg_tap_skip("reference too costly at this scale (raise MG_TEST_SCALE)", what);
        return;
    }
    mg_tap_diag("gradients over several chunks: b=1 T=%d, %d chunks of %d, %d checkpoint chunks of %d", T,
                (T + q - 1) / q, q, (T + CKPT - 1) / CKPT, CKPT);
    test_grads(1, T, 1, seed);
}

/* Weights out of the init range: MODEL_REF(push_ranges) moves some heads'
 * or channels' weights there (softplus's argument above its threshold;
 * Mamba-3: the a_floor clamp binding), deterministically in seed, in the
 * host blob (the reference's) and its device copy (forward_train reads it
 * every call); then forward_train's out and final states and every
 * gradient vs the reference (test_grads, batch b, T steps, from a random
 * state); then the init weights back. */
static void test_grads_pushed(int b, int T, uint64_t seed)
{
    if (MODEL_REF(push_ranges)(&dims, &lay, blob, seed, &u_offset0) != MG_OK) mg_tap_bail("push_ranges");
    mg_tap_up(d_blob, blob, WFLOATS);
    weights_tag = ", weights out of the init range";
    mg_tap_diag("weights out of the init range (seed %llu); input channel 0 offset %g", (unsigned long long)seed,
                (double)u_offset0);
    test_grads(b, T, 1, seed + 1);
    if (MODEL_REF(init)(&dims, &lay, blob, TRAIN_INIT_SEED) != MG_OK) mg_tap_bail("init");
    mg_tap_up(d_blob, blob, WFLOATS);
    weights_tag = "";
    u_offset0 = 0.0f;
}

/* N replays of the training-step graph == N eager train_step_mse calls, bit
 * for bit (weights, moments, loss of every step, final states), from the
 * same random states; then new hyperparameters through set_params (a halved
 * lr, the next step count) for one more step on both sides. */
static void test_train_graph(int B, int T, int steps, uint64_t seed)
{
    float *u, *tgt, *st0[NST];
    RAND_CALL(B, T, seed, 0.5f, &u, &tgt, st0);
    float *ha = FALLOC(WFLOATS), *hb = FALLOC(WFLOATS);
    float *le = FALLOC(steps + 1), *lg = FALLOC(steps + 1);
    /* e: eager buffers, g: graph buffers (fixed pointers) */
    float *dwe = mg_tap_dalloc(WFLOATS), *dge = mg_tap_dalloc(WFLOATS), *dme = mg_tap_dalloc(WFLOATS), *dve = mg_tap_dalloc(WFLOATS);
    float *dwg = mg_tap_dalloc(WFLOATS), *dgg = mg_tap_dalloc(WFLOATS), *dmg = mg_tap_dalloc(WFLOATS), *dvg = mg_tap_dalloc(WFLOATS);
    float *du = mg_tap_dalloc(n_u(B, T)), *dt = mg_tap_dalloc(n_out(B, T)), *dle = mg_tap_dalloc(1), *dlg = mg_tap_dalloc(1);
    float *dse[NST], *dsg[NST];
    for (int i = 0; i < NST; ++i) {
        dse[i] = mg_tap_dalloc(st_floats(i, B));
        dsg[i] = mg_tap_dalloc(st_floats(i, B));
        mg_tap_up(dse[i], st0[i], st_floats(i, B));
        mg_tap_up(dsg[i], st0[i], st_floats(i, B));
    }
    mg_tap_up(dwe, blob, WFLOATS); mg_tap_up(dwg, blob, WFLOATS);
    mg_tap_up(du, u, n_u(B, T)); mg_tap_up(dt, tgt, n_out(B, T));
    if (cudaMemset(dme, 0, WFLOATS * sizeof(float)) != cudaSuccess || cudaMemset(dve, 0, WFLOATS * sizeof(float)) != cudaSuccess ||
        cudaMemset(dmg, 0, WFLOATS * sizeof(float)) != cudaSuccess || cudaMemset(dvg, 0, WFLOATS * sizeof(float)) != cudaSuccess)
        mg_tap_bail("cudaMemset");
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-2f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.05f;
    p.max_grad_norm = 1.0f; p.step = 1; p.wd_matrices_only = 1;
    model_train_graph *g = NULL;
    mg_status s = model_train_graph_create(tr, dwg, dgg, dmg, dvg, &p, B, T, du, dt, STATE_ARGS(dsg), dlg, &g);
    if (!mg_tap_ok(s == MG_OK, "train_graph_create b=%d T=%d", B, T)) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    if (s == MG_OK) {
        int same = 1;
        mg_tap_down(ha, dwg, WFLOATS);
        same = memcmp(ha, blob, WFLOATS * sizeof(float)) == 0;
        for (int i = 0; i < NST; ++i) {
            if (!CREATE_CHECKS_STATE(i)) continue;
            float *h = FALLOC(st_floats(i, B));
            mg_tap_down(h, dsg[i], st_floats(i, B));
            same = same && memcmp(h, st0[i], st_floats(i, B) * sizeof(float)) == 0;
            free(h);
        }
        mg_tap_ok(same, "train_graph_create leaves the weights and the states untouched");
    }
    for (int k = 0; k <= steps && s == MG_OK; ++k) {
        if (k == steps) {   /* new hyperparameters for the last step */
            p.lr = 5e-3f; p.step = steps + 1;
            s = model_train_graph_set_params(g, &p);
            if (s != MG_OK) break;
        }
        p.step = k + 1;
        s = model_train_step_mse(tr, dwe, dge, dme, dve, &p, B, T, du, dt, STATE_ARGS(dse), dle);
        if (s == MG_OK) s = model_train_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(le + k, dle, 1);
        mg_tap_down(lg + k, dlg, 1);
    }
    if (g) {
        if (mg_tap_ok(s == MG_OK, "train graph: %d replays (the last after set_params) and %d eager steps run", steps + 1, steps + 1)) {
            mg_tap_ok(memcmp(le, lg, (size_t)(steps + 1) * sizeof(float)) == 0,
                   "train graph replay == eager train_step_mse: loss of every step bit-identical (%.6g -> %.6g)",
                   le[0], le[steps]);
            mg_tap_down(ha, dwe, WFLOATS); mg_tap_down(hb, dwg, WFLOATS);
            int same = memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            if (!same) { mg_err e = mg_compare_f32f32(hb, ha, WFLOATS); mg_tap_diag("graph vs eager weights: rel_l2 %.3e", e.rel_l2); }
            mg_tap_ok(same, "train graph replay == eager: weights bit-identical after %d steps", steps + 1);
            mg_tap_down(ha, dme, WFLOATS); mg_tap_down(hb, dmg, WFLOATS);
            same = memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            mg_tap_down(ha, dve, WFLOATS); mg_tap_down(hb, dvg, WFLOATS);
            same = same && memcmp(ha, hb, WFLOATS * sizeof(float)) == 0;
            mg_tap_ok(same, "train graph replay == eager: AdamW moments m, v bit-identical");
            same = 1;
            for (int i = 0; i < NST; ++i) {
                float *a = FALLOC(st_floats(i, B)), *b = FALLOC(st_floats(i, B));
                mg_tap_down(a, dse[i], st_floats(i, B)); mg_tap_down(b, dsg[i], st_floats(i, B));
                same = same && memcmp(a, b, st_floats(i, B) * sizeof(float)) == 0;
                free(a); free(b);
            }
            mg_tap_ok(same, "train graph replay == eager: final " STATE_NAMES " states bit-identical");
        } else {
            mg_tap_diag("%s", mg_last_error());
        }
        model_train_graph_destroy(g);
    }
    mg_dev_free(dwe); mg_dev_free(dge); mg_dev_free(dme); mg_dev_free(dve);
    mg_dev_free(dwg); mg_dev_free(dgg); mg_dev_free(dmg); mg_dev_free(dvg);
    mg_dev_free(du); mg_dev_free(dt); mg_dev_free(dle); mg_dev_free(dlg);
    for (int i = 0; i < NST; ++i) { mg_dev_free(dse[i]); mg_dev_free(dsg[i]); free(st0[i]); }
    free(u); free(tgt); free(ha); free(hb); free(le); free(lg);
}

/* The start of the bad-call tests: device buffers for a B x T call (dout,
 * dg and dw 4 floats longer, for a misaligned pointer), the weights in dw;
 * a fresh trainer refuses backward before forward_train, trainer_create
 * refuses NULL. */
static void bad_calls_start(int B, int T, float **du, float **dout, float **dg, float **dm, float **dv, float **dw)
{
    *du = mg_tap_dalloc(n_u(B, T)); *dout = mg_tap_dalloc(n_out(B, T) + 4); *dg = mg_tap_dalloc(WFLOATS + 4);
    *dm = mg_tap_dalloc(WFLOATS); *dv = mg_tap_dalloc(WFLOATS); *dw = mg_tap_dalloc(WFLOATS + 4);
    mg_tap_up(*dw, blob, WFLOATS);
    model_trainer *fresh = NULL;
    if (model_trainer_create(&fresh, 0) != MG_OK) mg_tap_bail(MODEL_NAME "_trainer_create");
    mg_tap_expect_status(model_backward(fresh, *dout, *dg, NULL, NO_STATES), MG_ERR_STATE, "backward before forward_train");
    model_trainer_destroy(fresh);
    /* a destroyed trainer is refused, not read (the handle registry) */
    mg_tap_expect_status(model_backward(fresh, *dout, *dg, NULL, NO_STATES), MG_ERR_INVALID_ARG, "backward on a destroyed trainer");
    model_trainer_destroy(fresh);   /* a second destroy is a no-op */
    mg_tap_expect_status(model_trainer_create(NULL, 0), MG_ERR_INVALID_ARG, "trainer_create(NULL)");
}

/* Gradient accumulation, on one forward_train (fresh state) and several
 * backward calls with the same dout, which give the same gradient g every
 * time (deterministic; the loss scale, when on, is set so that it does not
 * move between them): accumulation off overwrites grads (two calls over
 * different garbage, bit-identical, padding 0); on, the next call gives
 * g + g == 2g exactly and the one after (2g) + g as the host computes it in
 * f32; du still overwrites; off again overwrites (== g). Then the setter's
 * bad arguments. */
static void test_grad_accumulate(int B, int T, uint64_t seed)
{
    float *u = FALLOC(n_u(B, T)), *dout = FALLOC(n_out(B, T));
    float *g = FALLOC(WFLOATS), *got = FALLOC(WFLOATS), *want = FALLOC(WFLOATS), *du1 = FALLOC(n_u(B, T)),
          *du2 = FALLOC(n_u(B, T));
    mg_tap_randn(u, n_u(B, T), seed, 1.0f);
    mg_tap_randn(dout, n_out(B, T), seed + 1, 1.0f);
    float *d_u = mg_tap_dalloc(n_u(B, T)), *d_out = mg_tap_dalloc(n_out(B, T)), *d_dout = mg_tap_dalloc(n_out(B, T));
    float *d_g = mg_tap_dalloc(WFLOATS), *d_du = mg_tap_dalloc(n_u(B, T));
    mg_tap_up(d_u, u, n_u(B, T));
    mg_tap_up(d_dout, dout, n_out(B, T));
    /* loss scaling as this precision uses it (on for f16), from a scale low
     * enough not to overflow here, reset so that it does not grow between
     * the calls below */
    mg_status s = model_trainer_set_loss_scaling(tr, MODEL_LOSS_SCALE_INIT > 0.0f ? 1024.0f : 0.0f, 2000);
    if (s == MG_OK) s = model_forward_train(tr, d_blob, B, T, d_u, d_out, NO_STATES);

    /* off: overwrite, whatever grads held */
    for (size_t i = 0; i < WFLOATS; ++i) got[i] = 7.0f + (float)(i % 13);
    mg_tap_up(d_g, got, WFLOATS);
    if (s == MG_OK) s = model_backward(tr, d_dout, d_g, d_du, NO_STATES);
    if (s == MG_OK) { mg_tap_down(g, d_g, WFLOATS); mg_tap_down(du1, d_du, n_u(B, T)); }
    for (size_t i = 0; i < WFLOATS; ++i) got[i] = -3.0f;
    mg_tap_up(d_g, got, WFLOATS);
    if (s == MG_OK) s = model_backward(tr, d_dout, d_g, NULL, NO_STATES);
    if (s == MG_OK) mg_tap_down(got, d_g, WFLOATS);
    size_t pad = 0, nonfin = 0, nonzero = 0;
    for (size_t i = 0; i < WFLOATS; ++i) {
        pad += !inside[i] && g[i] != 0.0f;
        nonfin += !(g[i] - g[i] == 0.0f);
        nonzero += g[i] != 0.0f;
    }
    mg_tap_diag("grad accumulation b=%d T=%d: %zu nonzero, %zu non-finite gradients", B, T, nonzero, nonfin);
    mg_tap_ok(s == MG_OK && nonfin == 0 && nonzero > 0 && pad == 0 && memcmp(got, g, WFLOATS * sizeof(float)) == 0,
              "grad accumulation off: backward overwrites grads (bit-identical over different contents, padding 0)");

    /* on: g + g, then (g + g) + g */
    if (s == MG_OK) s = model_trainer_set_grad_accumulate(tr, 1);
    mg_tap_ok(s == MG_OK, "trainer_set_grad_accumulate(1)");
    if (s == MG_OK) s = model_backward(tr, d_dout, d_g, d_du, NO_STATES);
    if (s == MG_OK) { mg_tap_down(got, d_g, WFLOATS); mg_tap_down(du2, d_du, n_u(B, T)); }
    for (size_t i = 0; i < WFLOATS; ++i) want[i] = 2.0f * g[i];
    mg_tap_ok(s == MG_OK && memcmp(got, want, WFLOATS * sizeof(float)) == 0,
              "grad accumulation on: a second backward gives grads == 2g, bit-identical");
    mg_tap_ok(s == MG_OK && memcmp(du1, du2, n_u(B, T) * sizeof(float)) == 0,
              "grad accumulation on: du is overwritten (== the first backward's)");
    if (s == MG_OK) s = model_backward(tr, d_dout, d_g, NULL, NO_STATES);
    if (s == MG_OK) mg_tap_down(got, d_g, WFLOATS);
    for (size_t i = 0; i < WFLOATS; ++i) want[i] = want[i] + g[i];   /* f32, as the kernel adds */
    mg_tap_ok(s == MG_OK && memcmp(got, want, WFLOATS * sizeof(float)) == 0,
              "grad accumulation on: a third backward gives grads == 2g + g (f32), bit-identical");

    /* off again: overwrite */
    if (s == MG_OK) s = model_trainer_set_grad_accumulate(tr, 0);
    if (s == MG_OK) s = model_backward(tr, d_dout, d_g, NULL, NO_STATES);
    if (s == MG_OK) mg_tap_down(got, d_g, WFLOATS);
    mg_tap_ok(s == MG_OK && memcmp(got, g, WFLOATS * sizeof(float)) == 0,
              "grad accumulation turned off again: backward overwrites grads (== g)");
    if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());

    mg_tap_expect_status(model_trainer_set_grad_accumulate(tr, 2), MG_ERR_INVALID_ARG, "trainer_set_grad_accumulate(2)");
    mg_tap_expect_status(model_trainer_set_grad_accumulate(tr, -1), MG_ERR_INVALID_ARG, "trainer_set_grad_accumulate(-1)");
    mg_tap_expect_status(model_trainer_set_grad_accumulate(NULL, 1), MG_ERR_INVALID_ARG,
                         "trainer_set_grad_accumulate(NULL trainer)");
    /* the refused calls left accumulation off: a backward still overwrites */
    for (size_t i = 0; i < WFLOATS; ++i) got[i] = 5.0f;
    mg_tap_up(d_g, got, WFLOATS);
    s = model_backward(tr, d_dout, d_g, NULL, NO_STATES);
    if (s == MG_OK) mg_tap_down(got, d_g, WFLOATS);
    mg_tap_ok(s == MG_OK && memcmp(got, g, WFLOATS * sizeof(float)) == 0,
              "refused trainer_set_grad_accumulate calls leave the setting as it was");

    if (model_trainer_set_loss_scaling(tr, MODEL_LOSS_SCALE_INIT, MODEL_LOSS_SCALE_GROWTH) != MG_OK)
        mg_tap_bail("set_loss_scaling (default)");
    mg_dev_free(d_u); mg_dev_free(d_out); mg_dev_free(d_dout); mg_dev_free(d_g); mg_dev_free(d_du);
    free(u); free(dout); free(g); free(got); free(want); free(du1); free(du2);
}

/* The program defines this one after this part. */
/* The inputs of a packed training test: up to 5 sequences of the wanted
 * lengths (capped to 1..MAX_SEQ_LEN, at most MAX_BATCH of them), random u
 * and dy on the host and the device, and device out, grads and du. */
typedef struct packed_io {
    int32_t cu[6];
    int nseq, total;
    float *u, *dy, *d_u, *d_out, *d_dy, *d_g, *d_du;
} packed_io;

static void packed_io_init(packed_io *p, const int want[5], uint64_t seed)
{
    p->nseq = imin(5, MAX_BATCH);
    p->cu[0] = 0;
    for (int i = 0; i < p->nseq; ++i) p->cu[i + 1] = p->cu[i] + imax(1, imin(want[i], MAX_SEQ_LEN));
    p->total = p->cu[p->nseq];
    const size_t nu = n_u(1, p->total), no = n_out(1, p->total);
    p->u = FALLOC(nu);
    p->dy = FALLOC(no);
    mg_tap_randn(p->u, nu, seed, 1.0f);
    mg_tap_randn(p->dy, no, seed + 1, 1.0f);
    p->d_u = mg_tap_dalloc(nu);
    p->d_out = mg_tap_dalloc(no);
    p->d_dy = mg_tap_dalloc(no);
    p->d_g = mg_tap_dalloc(WFLOATS);
    p->d_du = mg_tap_dalloc(nu);
    mg_tap_up(p->d_u, p->u, nu);
    mg_tap_up(p->d_dy, p->dy, no);
}

static void packed_io_free(packed_io *p)
{
    mg_dev_free(p->d_u); mg_dev_free(p->d_out); mg_dev_free(p->d_dy); mg_dev_free(p->d_g); mg_dev_free(p->d_du);
    free(p->u); free(p->dy);
}

/* Packed sequences in training (doc/math.md §9): forward_train_packed +
 * backward over lengths 1, chunk-1, chunk, chunk+1 and a long one (chunk =
 * MODEL_SCAN_CHUNK) vs the reference's packed forward_ex / backward_ex
 * (cu_seqlens, zero initial states): out and final states within FWD_TOL,
 * every weight gradient and du within GRAD_TOL; vs forward_train + backward
 * of each sequence alone (batch 1, zero states; weight gradients summed on
 * the host): out within FWD_TOL, du and the gradients within GRAD_TOL.
 * Then the refusals: a backward with initial-state gradients after a
 * packed forward, and bad cu_seqlens (out and states untouched). */
static void test_train_packed(uint64_t seed)
{
    const int C = MODEL_SCAN_CHUNK;
    const int want[5] = { 1, C - 1, C, C + 1, 2 * C + 3 };
    packed_io io;
    packed_io_init(&io, want, seed);
    const int nseq = io.nseq, total = io.total;
    const int32_t *cu = io.cu;
    const float *u = io.u, *dy = io.dy;
    float *d_u = io.d_u, *d_out = io.d_out, *d_dy = io.d_dy, *d_g = io.d_g, *d_du = io.d_du;
    float *ds[NST], *hs[NST];
    double *rs[NST];
    size_t sn[NST];
    for (int i = 0; i < NST; ++i) sn[i] = st_floats(i, nseq);
    mg_tap_states(NST, sn, seed + 5, 1.0f, 0, ds, hs, rs);   /* ignored by the call; zero for the reference */
    double *rout = DALLOC_H(n_out(1, total)), *rg = DALLOC_H(WFLOATS), *rdu = DALLOC_H(n_u(1, total));
    const mg_ref_seqs o = { NULL, cu, nseq, nseq };
    REF_TRAIN_PACKED(total, u, dy, rout, rs, rg, rdu, &o);
    float *out = FALLOC(n_out(1, total)), *g = FALLOC(WFLOATS), *gu = FALLOC(n_u(1, total));
    mg_status s = model_forward_train_packed(tr, d_blob, nseq, cu, d_u, d_out, STATE_ARGS(ds));
    if (s == MG_OK) s = model_backward(tr, d_dy, d_g, d_du, NO_STATES);
    char what[240];
    if (!mg_tap_ok(s == MG_OK, "forward_train_packed + backward (%d sequences, %d tokens) run", nseq, total)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        mg_tap_down(out, d_out, n_out(1, total));
        mg_tap_down(g, d_g, WFLOATS);
        mg_tap_down(gu, d_du, n_u(1, total));
        for (int i = 0; i < NST; ++i) mg_tap_down(hs[i], ds[i], st_floats(i, nseq));
#define WHAT(x) (snprintf(what, sizeof what, "packed (%d sequences) vs reference _ex (cu_seqlens): %s", nseq, (x)), what)
        cmp_ref(WHAT("forward_train out"), out, rout, n_out(1, total), FWD_TOL);
        CMP_FINAL_STATES(WHAT("forward_train"), nseq, hs, rs);
        for (int i = 0; i < n_tens; ++i) {
            char nm[120];
            snprintf(nm, sizeof nm, "grad %s", tens[i].name);
            cmp_ref(WHAT(nm), g + tens[i].offset, rg + tens[i].offset, tens[i].numel, GRAD_TOL);
        }
        cmp_ref(WHAT("du"), gu, rdu, n_u(1, total), GRAD_TOL);
#undef WHAT
        /* each sequence alone: forward_train + backward at batch 1 from zero states */
        double *sg = DALLOC_H(WFLOATS), *sout = DALLOC_H(n_out(1, total)), *sdu = DALLOC_H(n_u(1, total));
        float *g1 = FALLOC(WFLOATS), *o1 = FALLOC(n_out(1, total)), *u1 = FALLOC(n_u(1, total));
        mg_status s1 = MG_OK;
        for (int q = 0; q < nseq && s1 == MG_OK; ++q) {
            const int len = cu[q + 1] - cu[q];
            /* its own buffers: every pointer 16-byte aligned whatever IN_DIM is */
            float *a_u = mg_tap_dalloc(n_u(1, len)), *a_o = mg_tap_dalloc(n_out(1, len));
            float *a_dy = mg_tap_dalloc(n_out(1, len)), *a_du = mg_tap_dalloc(n_u(1, len));
            mg_tap_up(a_u, u + n_u(1, cu[q]), n_u(1, len));
            mg_tap_up(a_dy, dy + n_out(1, cu[q]), n_out(1, len));
            s1 = model_forward_train(tr, d_blob, 1, len, a_u, a_o, NO_STATES);
            if (s1 == MG_OK) s1 = model_backward(tr, a_dy, d_g, a_du, NO_STATES);
            if (s1 == MG_OK) {
                mg_tap_down(g1, d_g, WFLOATS);
                for (size_t j = 0; j < WFLOATS; ++j) sg[j] += g1[j];
                mg_tap_down(o1 + n_out(1, cu[q]), a_o, n_out(1, len));
                mg_tap_down(u1 + n_u(1, cu[q]), a_du, n_u(1, len));
            }
            mg_dev_free(a_u); mg_dev_free(a_o); mg_dev_free(a_dy); mg_dev_free(a_du);
        }
        if (mg_tap_ok(s1 == MG_OK, "forward_train + backward of each packed sequence alone run")) {
            for (size_t j = 0; j < n_out(1, total); ++j) sout[j] = o1[j];
            for (size_t j = 0; j < n_u(1, total); ++j) sdu[j] = u1[j];
#define WHAT(x) (snprintf(what, sizeof what, "packed (%d sequences) vs each sequence alone: %s", nseq, (x)), what)
            cmp_ref(WHAT("forward_train out (within FWD_TOL)"), out, sout, n_out(1, total), FWD_TOL);
            cmp_ref(WHAT("du (within GRAD_TOL)"), gu, sdu, n_u(1, total), GRAD_TOL);
            cmp_ref(WHAT("weight gradients, summed over the sequences (within GRAD_TOL)"), g, sg, WFLOATS, GRAD_TOL);
#undef WHAT
        } else {
            mg_tap_diag("%s: %s", mg_status_name(s1), mg_last_error());
        }
        free(sg); free(sout); free(sdu); free(g1); free(o1); free(u1);
    }
    /* refusals: initial-state gradients after a packed forward; bad cu_seqlens, nothing written */
    s = model_forward_train_packed(tr, d_blob, nseq, cu, d_u, d_out, STATE_ARGS(ds));
    if (s != MG_OK) mg_tap_bail("forward_train_packed");
    mg_tap_expect_status(model_backward(tr, d_dy, d_g, d_du, STATE_ARGS(ds)), MG_ERR_INVALID_ARG,
                         "backward after forward_train_packed refuses initial-state gradients");
    if (cudaDeviceSynchronize() != cudaSuccess) mg_tap_bail("cudaDeviceSynchronize");
    for (size_t j = 0; j < n_out(1, total); ++j) out[j] = -99.5f;
    mg_tap_up(d_out, out, n_out(1, total));
    for (int i = 0; i < NST; ++i) mg_tap_down(hs[i], ds[i], st_floats(i, nseq));
    static const struct { const char *what; int nseq; int32_t v[3]; } bad[] = {
        { "nseq = 0", 0, { 0, 1, 0 } },
        { "cu_seqlens[0] = 2", 1, { 2, 3, 0 } },
        { "an empty sequence", 2, { 0, 1, 1 } },
        { "a sequence longer than MAX_SEQ_LEN", 1, { 0, MAX_SEQ_LEN + 1, 0 } },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        snprintf(what, sizeof what, "forward_train_packed refuses %s", bad[k].what);
        mg_tap_expect_status(model_forward_train_packed(tr, d_blob, bad[k].nseq, bad[k].v, d_u, d_out, STATE_ARGS(ds)),
                             MG_ERR_INVALID_ARG, what);
    }
    mg_tap_expect_status(model_forward_train_packed(tr, d_blob, 1, NULL, d_u, d_out, STATE_ARGS(ds)),
                         MG_ERR_INVALID_ARG, "forward_train_packed refuses cu_seqlens NULL");
    mg_tap_expect_status(model_forward_train_packed(NULL, d_blob, nseq, cu, d_u, d_out, STATE_ARGS(ds)),
                         MG_ERR_INVALID_ARG, "forward_train_packed refuses a NULL trainer");
    if (cudaDeviceSynchronize() != cudaSuccess) mg_tap_bail("cudaDeviceSynchronize");
    float *chk = FALLOC(n_out(1, total));
    mg_tap_down(chk, d_out, n_out(1, total));
    int same = memcmp(chk, out, n_out(1, total) * sizeof(float)) == 0;
    free(chk);
    for (int i = 0; i < NST; ++i) {
        float *x = FALLOC(st_floats(i, nseq));
        mg_tap_down(x, ds[i], st_floats(i, nseq));
        same &= memcmp(x, hs[i], st_floats(i, nseq) * sizeof(float)) == 0;
        free(x);
    }
    mg_tap_ok(same, "forward_train_packed's refused calls wrote nothing (out and states unchanged)");
    mg_tap_states_free(NST, ds, hs, rs);
    packed_io_free(&io);
    free(out); free(g); free(gu); free(rout); free(rg); free(rdu);
}

/* forward_train_packed_from + backward: every sequence from its own random
 * initial states vs the reference's packed forward_ex / backward_ex from
 * the same states (REF_TRAIN_PACKED_FROM): out, every weight gradient, du
 * and the initial-state gradients (rows per sequence); the caller's states
 * are read only (unchanged after the call). */
static void test_train_packed_from(uint64_t seed)
{
    const int C = MODEL_SCAN_CHUNK;
    const int want[5] = { C + 3, 1, C, 2, C - 1 };
    packed_io io;
    packed_io_init(&io, want, seed);
    const int nseq = io.nseq, total = io.total;
    const int32_t *cu = io.cu;
    const float *u = io.u, *dy = io.dy;
    float *d_u = io.d_u, *d_out = io.d_out, *d_dy = io.d_dy, *d_g = io.d_g, *d_du = io.d_du;
    float *ds[NST], *dds[NST] = { NULL }, *hs[NST], *hds[NST] = { NULL };
    double *rs[NST], *rs0[NST] = { NULL }, *rds[NST] = { NULL };
    size_t sn[NST];
    for (int i = 0; i < NST; ++i) sn[i] = st_floats(i, nseq);
    mg_tap_states(NST, sn, seed + 5, 0.5f, 1, ds, hs, rs);   /* random, the reference from the same */
    for (int i = 0; i < NST; ++i) {
        dds[i] = mg_tap_dalloc(sn[i]);
        hds[i] = FALLOC(sn[i]);
        rs0[i] = DALLOC_H(sn[i]);
        rds[i] = DALLOC_H(sn[i]);
        memcpy(rs0[i], rs[i], sn[i] * sizeof(double));
    }
    double *rout = DALLOC_H(n_out(1, total)), *rg = DALLOC_H(WFLOATS), *rdu = DALLOC_H(n_u(1, total));
    const mg_ref_seqs o = { NULL, cu, nseq, nseq };
    REF_TRAIN_PACKED_FROM(total, u, dy, rout, rs, rs0, rg, rdu, rds, &o);
    float *out = FALLOC(n_out(1, total)), *g = FALLOC(WFLOATS), *gu = FALLOC(n_u(1, total));
    mg_status s = model_forward_train_packed_from(tr, d_blob, nseq, cu, d_u, d_out, STATE_ARGS(ds));
    if (s == MG_OK) s = model_backward(tr, d_dy, d_g, d_du, STATE_ARGS(dds));
    char what[240];
    if (!mg_tap_ok(s == MG_OK, "forward_train_packed_from + backward (%d sequences, %d tokens, random initial "
                   "states) run", nseq, total)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        mg_tap_down(out, d_out, n_out(1, total));
        mg_tap_down(g, d_g, WFLOATS);
        mg_tap_down(gu, d_du, n_u(1, total));
#define WHAT(x) (snprintf(what, sizeof what, "packed from given states (%d sequences) vs reference _ex: %s", nseq, \
                          (x)), what)
        cmp_ref(WHAT("forward_train out"), out, rout, n_out(1, total), FWD_TOL);
        for (int i = 0; i < n_tens; ++i) {
            char nm[120];
            snprintf(nm, sizeof nm, "grad %s", tens[i].name);
            cmp_ref(WHAT(nm), g + tens[i].offset, rg + tens[i].offset, tens[i].numel, GRAD_TOL);
        }
        cmp_ref(WHAT("du"), gu, rdu, n_u(1, total), GRAD_TOL);
        int kept = 1;
        for (int i = 0; i < NST; ++i) {
            char nm[120];
            snprintf(nm, sizeof nm, "initial-state gradient %d", i);
            mg_tap_down(hds[i], dds[i], st_floats(i, nseq));
            cmp_ref(WHAT(nm), hds[i], rds[i], st_floats(i, nseq), GRAD_TOL);
            float *x = FALLOC(st_floats(i, nseq));
            mg_tap_down(x, ds[i], st_floats(i, nseq));
            kept &= memcmp(x, hs[i], st_floats(i, nseq) * sizeof(float)) == 0;
            free(x);
        }
#undef WHAT
        mg_tap_ok(kept, "forward_train_packed_from leaves the caller's states as they were (read only)");
    }
    mg_tap_expect_status(model_forward_train_packed_from(NULL, d_blob, nseq, cu, d_u, d_out, STATE_ARGS(ds)),
                         MG_ERR_INVALID_ARG, "forward_train_packed_from refuses a NULL trainer");
    mg_tap_states_free(NST, ds, hs, rs);
    for (int i = 0; i < NST; ++i) { mg_dev_free(dds[i]); free(hds[i]); free(rs0[i]); free(rds[i]); }
    packed_io_free(&io);
    free(out); free(g); free(gu); free(rout); free(rg); free(rdu);
}

static void test_bad_calls(void);

/* main's last tests (ba: the batch of the first gradient check), once the
 * arch's own are done, and the end of the program but for the reference's
 * layout (the program frees it). */
static void train_end(int ba)
{
    if (mg_tap_section("adamw")) {
        test_adamw(0, 0, 404);
        test_adamw(1, 1, 505);
        test_adamw_skip(909);
        test_grad_accumulate(ba, imin(MAX_SEQ_LEN, CKPT + 3), 919);
    }

    /* Training from this precision's default loss scale. */
    if (model_trainer_set_loss_scaling(tr, MODEL_LOSS_SCALE_INIT, MODEL_LOSS_SCALE_GROWTH) != MG_OK)
        mg_tap_bail("set_loss_scaling (default)");

    if (mg_tap_section("training")) test_training(ba, imin(MAX_SEQ_LEN, 16), 20, 606);

    /* The training step as a CUDA Graph: replays == eager steps, bit for bit. */
    if (mg_tap_section("train graph")) test_train_graph(ba, imin(MAX_SEQ_LEN, CKPT + 5), 4, 707);

    if (mg_tap_section("bad calls")) test_bad_calls();

    model_trainer_destroy(tr);
    mg_dev_free(d_blob);
    free(blob); free(tens); free(inside);
}

#endif /* part 2 */
