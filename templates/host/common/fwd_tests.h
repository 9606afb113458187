/* fwd_tests.h: what NAME_test.c (the inference test program) shares with
 * the test program of every other arch. Not a standalone header: the
 * program includes it twice.
 *
 * First, right after its own #includes (part 1): the sizes and the
 * tolerance, the globals every arch has (blob, d_blob, model), the
 * allocation and comparison helpers (FALLOC, DALLOC_H, n_u, n_out, cmp_ref,
 * imin, imax).
 *
 * Then, after its arch's globals (dims, lay) and helpers and the names that
 * differ by arch: REF(x) (the reference's function mg_ref_<arch>_x),
 * NO_STATES (NULL for every state argument of the library's calls),
 * DEV_STATES(st) (the state arguments of a decode step from an array of
 * device states), SELFCHECK_DIAG(T, r) (the diag line of a selfcheck report)
 * (part 2): the end of the parameter-table test (param_table_end), the
 * steps of the decode-graph test (decode_graph_steps), main's first steps
 * after the layout (fwd_model_start), the library's self-check
 * (test_selfcheck) and main's last steps (fwd_end). */
#ifndef MG_FWD_TESTS_PART1
#define MG_FWD_TESTS_PART1

#define IN_DIM      MODEL_IN_DIM
#define D_MODEL     MODEL_D_MODEL
#define MAX_BATCH   MODEL_MAX_BATCH
#define MAX_SEQ_LEN MODEL_MAX_SEQ_LEN
#define TOL         MODEL_CHECK_TOL
#define SCAN_TCHUNK MODEL_SCAN_TCHUNK       /* timesteps per pass of the scan kernel */
#define REF_MACS_PER_TOKEN MODEL_REF_MACS_PER_TOKEN

static float *blob;             /* host copy of the weights */
static float *d_blob;           /* device weights */
static model_model *model;

#define FALLOC(n) ((float *)mg_tap_malloc((size_t)(n) * sizeof(float)))
#define DALLOC_H(n) ((double *)mg_tap_malloc((size_t)(n) * sizeof(double)))

static size_t n_u(int b, int t) { return (size_t)b * t * IN_DIM; }
static size_t n_out(int b, int t) { return (size_t)b * t * D_MODEL; }

static int cmp_ref(const char *what, const float *got, const double *ref, size_t n)
{
    mg_err e = mg_compare_f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e.max_abs, e.rel_l2, e.n);
    return mg_tap_ok(mg_err_ok(&e, TOL), "%s: rel_l2 <= %g", what, TOL);
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

#else /* part 2 */

#define FWD_STR_(x) #x
#define FWD_STR(x) FWD_STR_(x)          /* the name of a REF(x) function, for messages */

/* The end of the parameter-table test, after the arch's entry-by-entry
 * match (good: it matched): numel = product of the shape, every tensor
 * 64-aligned inside the blob; then the test's TAP line. */
static void param_table_end(int good)
{
    for (int j = 0; j < MODEL_N_PARAMS && good; ++j) {
        const model_param_info *p = &model_params[j];
        size_t n = 1;
        for (int k = 0; k < p->ndim; ++k) n *= (size_t)p->shape[k];
        if (n != p->numel || p->offset % 64 != 0 || p->offset + p->numel > (size_t)MODEL_WEIGHTS_FLOATS) {
            mg_tap_diag("%s: numel %zu, shape product %zu, offset %zu", p->name, p->numel, n, p->offset);
            good = 0;
        }
    }
    mg_tap_ok(good, "parameter table (%d tensors, %zu floats) equals the reference layout",
           MODEL_N_PARAMS, (size_t)MODEL_WEIGHTS_FLOATS);
}

/* The decode-graph test's steps: T eager decode steps and T replays of the
 * graph g, token by token from u [batch][T]. The eager step reads due and
 * writes doe and the device states dse (DEV_STATES), the graph reads dug
 * and writes dog (its fixed buffers); the outputs of every step are
 * gathered in oe (eager) and og (graph), [batch][T]. s: the status so far
 * (nothing runs unless MG_OK); returns the first failure, else MG_OK. */
static mg_status decode_graph_steps(model_graph *g, int batch, int T, const float *u, float *due, float *doe,
                                    float *const dse[], float *dug, float *dog, float *oe, float *og, mg_status s)
{
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    for (int t = 0; t < T && s == MG_OK; ++t) {
        for (int b = 0; b < batch; ++b)
            memcpy(ut + n_u(b, 1), u + n_u(b, T) + n_u(1, t), n_u(1, 1) * sizeof(float));
        mg_tap_up(due, ut, n_u(batch, 1));
        mg_tap_up(dug, ut, n_u(batch, 1));
        s = model_decode_step(model, batch, due, doe, DEV_STATES(dse));
        if (s == MG_OK) s = model_decode_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(ot, doe, n_out(batch, 1));
        for (int b = 0; b < batch; ++b)
            memcpy(oe + n_out(b, T) + n_out(1, t), ot + n_out(b, 1), n_out(1, 1) * sizeof(float));
        mg_tap_down(ot, dog, n_out(batch, 1));
        for (int b = 0; b < batch; ++b)
            memcpy(og + n_out(b, T) + n_out(1, t), ot + n_out(b, 1), n_out(1, 1) * sizeof(float));
    }
    free(ut); free(ot);
    return s;
}

/* main's steps after the parameter-table test: the weights from the
 * reference's init (host and device copies), the model, and the calls that
 * must fail before and at set_weights. */
static void fwd_model_start(void)
{
    blob = FALLOC(lay.total > (size_t)MODEL_WEIGHTS_FLOATS ? lay.total : (size_t)MODEL_WEIGHTS_FLOATS);
    if (REF(init)(&dims, &lay, blob, 20240601ull) != MG_OK) mg_tap_bail(FWD_STR(REF(init)));
    d_blob = mg_tap_dalloc((size_t)MODEL_WEIGHTS_FLOATS + 64);
    mg_tap_up(d_blob, blob, (size_t)MODEL_WEIGHTS_FLOATS);

    {   /* a destroyed model is refused, not read (the handle registry), and so is a
         * decode graph whose model was destroyed; a second destroy is a no-op */
        model_model *gone = NULL;
        if (model_create(&gone, 0) != MG_OK) mg_tap_bail(MODEL_NAME "_create");
        model_destroy(gone);
        mg_tap_expect_status(model_set_scan(gone, 0), MG_ERR_INVALID_ARG, "set_scan on a destroyed model");
        model_destroy(gone);
    }
    if (model_create(&model, 0) != MG_OK) mg_tap_bail(MODEL_NAME "_create");
    {
        float *du = mg_tap_dalloc(n_u(1, 1)), *dout = mg_tap_dalloc(n_out(1, 1));
        mg_tap_expect_status(model_prefill(model, 1, 1, du, dout, NO_STATES), MG_ERR_STATE, "prefill before set_weights");
        mg_dev_free(du); mg_dev_free(dout);
    }
    mg_tap_expect_status(model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS + 1), MG_ERR_SIZE, "set_weights one float too many");
    if (!mg_tap_ok(model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS) == MG_OK, "set_weights"))
        mg_tap_bail("set_weights");
}

/* The library's own self-check: batch 1, seqlen tokens, from a state. */
static void test_selfcheck(int seqlen)
{
    model_check_opts o;
    memset(&o, 0, sizeof o);
    o.batch = 1;
    o.seqlen = seqlen;
    o.seed = 606;
    o.with_state = 1;
    model_check_report r;
    mg_status s = model_selfcheck(&o, &r);
    SELFCHECK_DIAG(o.seqlen, r);
    if (!mg_tap_ok(s == MG_OK && r.passed, MODEL_NAME "_selfcheck passes")) mg_tap_diag("%s", mg_last_error());
}

/* main's last steps: free everything, the TAP summary (main's status). */
static int fwd_end(void)
{
    model_destroy(model);
    mg_dev_free(d_blob);
    free(blob);
    REF(layout_free)(&lay);
    return mg_tap_done();
}

#endif /* part 2 */
