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
 * device states), SELFCHECK_DIAG(T, r) (the diag line of a selfcheck report),
 * NST (the number of recurrent states), st_floats(i, batch) (floats of
 * state i for batch streams, all layers) and REF_FWD_EX(T, u, out, st, o)
 * (the reference's forward_ex, batch 1, on double states st[NST]),
 * CMP_STATES_ANY(prefix, batch, got, ref, gpu) (host states got[NST]
 * against the reference's ref[NST] or, ref NULL, another run's gpu[NST],
 * within TOL) and cmp_gpu (f32 against f32, within TOL)
 * (part 2): the end of the parameter-table test (param_table_end), the
 * steps of the decode-graph test (decode_graph_steps), the reset-mask tests
 * (test_decode_reset, test_decode_graph_reset, test_reset_bad_calls), the
 * prefill graph, with or without a start mask (test_prefill_graph),
 * main's first steps after the layout (fwd_model_start), the weights out
 * of the init range and back (fwd_weights_pushed, fwd_weights_init;
 * part 1: weights_tag, push_inputs), the library's
 * self-check (test_selfcheck), packed sequences (test_packed,
 * test_packed_bad_calls) and main's last steps (fwd_end). */
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

/* One decode step's slice of whole sequences: step_in gathers token t of
 * every stream, ut [batch][IN_DIM] <- u [batch][T][IN_DIM]; step_out
 * scatters a step's outputs, o [batch][T][D_MODEL] <- ot [batch][D_MODEL]. */
static void step_in(float *ut, const float *u, int batch, int T, int t)
{
    for (int b = 0; b < batch; ++b)
        memcpy(ut + n_u(b, 1), u + n_u(b, T) + n_u(1, t), n_u(1, 1) * sizeof(float));
}

static void step_out(float *o, const float *ot, int batch, int T, int t)
{
    for (int b = 0; b < batch; ++b)
        memcpy(o + n_out(b, T) + n_out(1, t), ot + n_out(b, 1), n_out(1, 1) * sizeof(float));
}

static int cmp_ref(const char *what, const float *got, const double *ref, size_t n)
{
    mg_err e = mg_compare_f32(got, ref, n);
    mg_tap_diag("%s: max_abs=%.3e rel_l2=%.3e (n=%zu)", what, e.max_abs, e.rel_l2, e.n);
    return mg_tap_ok(mg_err_ok(&e, TOL), "%s: rel_l2 <= %g", what, TOL);
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* The pushed-weights cases (fwd_weights_pushed): appended to the names of
 * their checks, and the offset REF(push_ranges) asks for on channel 0 of
 * every input token (push_inputs; 0 otherwise, and then a no-op). */
static const char *weights_tag = "";
static float u_offset0;
static void push_inputs(float *u, size_t tokens)
{
    if (u_offset0 != 0.0f)
        for (size_t i = 0; i < tokens; ++i) u[i * IN_DIM] += u_offset0;
}

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
        step_in(ut, u, batch, T, t);
        mg_tap_up(due, ut, n_u(batch, 1));
        mg_tap_up(dug, ut, n_u(batch, 1));
        s = model_decode_step(model, batch, due, doe, DEV_STATES(dse));
        if (s == MG_OK) s = model_decode_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(ot, doe, n_out(batch, 1));
        step_out(oe, ot, batch, T, t);
        mg_tap_down(ot, dog, n_out(batch, 1));
        step_out(og, ot, batch, T, t);
    }
    free(ut); free(ot);
    return s;
}

/* ---- Decode with a reset mask ---- */

/* The mask of step t: pattern 0 none, 1 some (streams b with (b + t) % 3 ==
 * 0, with values 1 and 255: any nonzero byte resets), 2 all. */
static void reset_mask(unsigned char *mask, int batch, int pattern, int t)
{
    for (int b = 0; b < batch; ++b)
        mask[b] = pattern == 2 ? 1 : pattern == 1 && (b + t) % 3 == 0 ? (unsigned char)(b % 2 ? 255 : 1) : 0;
}

static void up_mask(unsigned char *d, const unsigned char *h, int batch)
{
    if (cudaMemcpy(d, h, (size_t)batch, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy mask");
}

/* A device buffer of n bytes (mg_tap_dalloc: floats, 256-byte aligned). */
static unsigned char *dalloc_bytes(size_t n) { return (unsigned char *)mg_tap_dalloc((n + 3) / 4); }

/* Zero the states of the streams whose mask byte is set: every state,
 * every layer ([n_layers][batch][per stream]), on the device. */
static void zero_streams(float *const ds[], int batch, const unsigned char *mask)
{
    for (int i = 0; i < NST; ++i) {
        const size_t per = st_floats(i, 1) / MODEL_N_LAYERS;
        for (int l = 0; l < MODEL_N_LAYERS; ++l)
            for (int b = 0; b < batch; ++b)
                if (mask[b] && cudaMemset(ds[i] + ((size_t)l * batch + b) * per, 0, per * sizeof(float)) != cudaSuccess)
                    mg_tap_bail("cudaMemset");
    }
}

/* Whether the NST device states of two runs are bit-identical. */
static int same_states(float *const da[], float *const db[], int batch)
{
    int same = 1;
    for (int i = 0; i < NST && same; ++i) {
        const size_t n = st_floats(i, batch);
        float *a = FALLOC(n), *b = FALLOC(n);
        mg_tap_down(a, da[i], n);
        mg_tap_down(b, db[i], n);
        same = memcmp(a, b, n * sizeof(float)) == 0;
        free(a); free(b);
    }
    return same;
}

/* Decode with a reset mask vs its definition: T steps from random states
 * (nonzero, so a stream that ignores its reset, or one reset that should
 * not be, changes the results) with the mask of `pattern` (0 none, 1 some,
 * changing every step, 2 all, 3 a NULL mask): decode_step_reset (run a)
 * against decode_step after zeroing the masked streams' states (run b).
 * Same kernels on the same values: out of every step and the final states
 * bit-identical, in every storage dtype. Two TAP lines per pattern. */
static void test_decode_reset(int batch, int T, const char *path, uint64_t seed)
{
    static const char *const pname[4] = { "no stream reset", "some streams reset", "every stream reset",
                                          "NULL mask" };
    float *u = FALLOC(n_u(batch, T)), *oa = FALLOC(n_out(batch, T)), *ob = FALLOC(n_out(batch, T));
    float *du = mg_tap_dalloc(n_u(batch, 1)), *doa = mg_tap_dalloc(n_out(batch, 1)), *dob = mg_tap_dalloc(n_out(batch, 1));
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)batch), *dmask = dalloc_bytes((size_t)batch);
    float *dsa[NST], *dsb[NST];
    for (int i = 0; i < NST; ++i) { dsa[i] = mg_tap_dalloc(st_floats(i, batch)); dsb[i] = mg_tap_dalloc(st_floats(i, batch)); }
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    for (int pattern = 0; pattern < 4; ++pattern) {
        for (int i = 0; i < NST; ++i) {
            const size_t n = st_floats(i, batch);
            float *h = FALLOC(n);
            mg_tap_randn(h, n, seed + 1 + (uint64_t)(pattern * NST + i), 0.5f);
            mg_tap_up(dsa[i], h, n);
            mg_tap_up(dsb[i], h, n);
            free(h);
        }
        mg_status s = MG_OK;
        for (int t = 0; t < T && s == MG_OK; ++t) {
            float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
            step_in(ut, u, batch, T, t);
            mg_tap_up(du, ut, n_u(batch, 1));
            reset_mask(mask, batch, pattern == 3 ? 0 : pattern, t);
            up_mask(dmask, mask, batch);
            s = model_decode_step_reset(model, batch, du, doa, DEV_STATES(dsa), pattern == 3 ? NULL : dmask);
            if (s == MG_OK) {
                zero_streams(dsb, batch, mask);
                s = model_decode_step(model, batch, du, dob, DEV_STATES(dsb));
            }
            if (s == MG_OK) {
                mg_tap_down(ot, doa, n_out(batch, 1));
                step_out(oa, ot, batch, T, t);
                mg_tap_down(ot, dob, n_out(batch, 1));
                step_out(ob, ot, batch, T, t);
            }
            free(ut); free(ot);
        }
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        const int same_out = s == MG_OK && memcmp(oa, ob, n_out(batch, T) * sizeof(float)) == 0;
        if (s == MG_OK && !same_out) {
            mg_err e = mg_compare_f32f32(oa, ob, n_out(batch, T));
            mg_tap_diag("decode_step_reset vs zeroed decode_step: out rel_l2 %.3e", e.rel_l2);
        }
        mg_tap_ok(same_out, "decode_step_reset (%s, %s, batch %d, %d steps) == decode_step with those streams' "
                  "states zeroed: out of every step, bit-identical", pname[pattern], path, batch, T);
        mg_tap_ok(s == MG_OK && same_states(dsa, dsb, batch),
                  "decode_step_reset (%s, %s, batch %d): final states bit-identical", pname[pattern], path, batch);
    }
    for (int i = 0; i < NST; ++i) { mg_dev_free(dsa[i]); mg_dev_free(dsb[i]); }
    mg_dev_free(du); mg_dev_free(doa); mg_dev_free(dob); mg_dev_free(dmask);
    free(u); free(oa); free(ob); free(mask);
}

/* Random device states for batch streams (seed), twice: a[] and b[] hold
 * the same values (one for the eager calls, one for a graph). */
static void dev_state_pair(float *a[], float *b[], int batch, uint64_t seed)
{
    for (int i = 0; i < NST; ++i) {
        const size_t n = st_floats(i, batch);
        float *h = FALLOC(n);
        mg_tap_randn(h, n, seed + 1 + (uint64_t)i, 0.5f);
        a[i] = mg_tap_dalloc(n); b[i] = mg_tap_dalloc(n);
        mg_tap_up(a[i], h, n); mg_tap_up(b[i], h, n);
        free(h);
    }
}

/* The decode graph with a reset buffer: T replays, the mask in the graph's
 * buffer changed before each (some streams, none, all, others), against T
 * eager decode_step_reset calls with the same masks from a buffer of their
 * own, from the same random states: out of every step and the final states
 * bit-identical (a graph that kept the mask it was captured with, or read
 * none, differs). */
static void test_decode_graph_reset(int batch, int T, const char *path, uint64_t seed)
{
    float *u = FALLOC(n_u(batch, T)), *oe = FALLOC(n_out(batch, T)), *og = FALLOC(n_out(batch, T));
    float *ut = FALLOC(n_u(batch, 1)), *ot = FALLOC(n_out(batch, 1));
    float *due = mg_tap_dalloc(n_u(batch, 1)), *doe = mg_tap_dalloc(n_out(batch, 1));
    float *dug = mg_tap_dalloc(n_u(batch, 1)), *dog = mg_tap_dalloc(n_out(batch, 1));
    unsigned char *mask = (unsigned char *)mg_tap_malloc((size_t)batch);
    unsigned char *dme = dalloc_bytes((size_t)batch), *dmg = dalloc_bytes((size_t)batch);
    float *dse[NST], *dsg[NST];
    mg_tap_randn(u, n_u(batch, T), seed, 1.0f);
    dev_state_pair(dse, dsg, batch, seed);
    reset_mask(mask, batch, 2, 0);   /* the buffer's contents at capture: all set, unlike most steps */
    up_mask(dmg, mask, batch);
    if (cudaMemset(dug, 0, n_u(batch, 1) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    model_graph *g = NULL;
    mg_status s = model_decode_graph_create_reset(model, batch, dug, dog, DEV_STATES(dsg), dmg, &g);
    if (!mg_tap_ok(s == MG_OK, "decode_graph_create_reset batch=%d (%s)", batch, path))
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    static const int step_pattern[4] = { 1, 0, 2, 1 };
    for (int t = 0; t < T && s == MG_OK; ++t) {
        step_in(ut, u, batch, T, t);
        mg_tap_up(due, ut, n_u(batch, 1));
        mg_tap_up(dug, ut, n_u(batch, 1));
        reset_mask(mask, batch, step_pattern[t % 4], t);
        up_mask(dme, mask, batch);
        up_mask(dmg, mask, batch);
        s = model_decode_step_reset(model, batch, due, doe, DEV_STATES(dse), dme);
        if (s == MG_OK) s = model_decode_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(ot, doe, n_out(batch, 1));
        step_out(oe, ot, batch, T, t);
        mg_tap_down(ot, dog, n_out(batch, 1));
        step_out(og, ot, batch, T, t);
    }
    if (g) {
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        const int same_out = s == MG_OK && memcmp(oe, og, n_out(batch, T) * sizeof(float)) == 0;
        if (s == MG_OK && !same_out) {
            mg_err e = mg_compare_f32f32(og, oe, n_out(batch, T));
            mg_tap_diag("graph vs eager out: rel_l2 %.3e", e.rel_l2);
        }
        mg_tap_ok(same_out, "decode graph with a reset mask changed between %d replays == eager decode_step_reset: "
                  "out of every step, bit-identical", T);
        mg_tap_ok(s == MG_OK && same_states(dse, dsg, batch),
                  "decode graph with a reset mask == eager decode_step_reset: final states bit-identical");
        model_decode_graph_destroy(g);
    }
    for (int i = 0; i < NST; ++i) { mg_dev_free(dse[i]); mg_dev_free(dsg[i]); }
    mg_dev_free(due); mg_dev_free(doe); mg_dev_free(dug); mg_dev_free(dog); mg_dev_free(dme); mg_dev_free(dmg);
    free(u); free(oe); free(og); free(ut); free(ot); free(mask);
}

/* ---- The prefill graph ---- */

/* Window w's start mask of test_prefill_graph: starts at scattered tokens,
 * none, or t = 0 of every stream (any nonzero byte is a start). */
static void window_starts(unsigned char *mask, int batch, int T, int w)
{
    for (int b = 0; b < batch; ++b)
        for (int t = 0; t < T; ++t)
            mask[(size_t)b * T + t] = (unsigned char)(w % 3 == 1 ? 0 : w % 3 == 2 ? (t == 0) * 7
                                                      : ((b + t + w) % 5 == 0));
}

/* W windows of T tokens through one prefill graph (fixed buffers, the
 * states advancing in place) against W eager calls from the same random
 * states: every window's out and the final states bit-identical (a graph
 * that did not advance the states, or replayed another scan, differs).
 * starts: the graph has a start-mask buffer, rewritten before each window
 * (window_starts; at capture it holds a start everywhere, unlike any
 * window), and the eager calls are prefill_starts with the same masks from
 * a buffer of their own (a graph that kept its capture-time mask differs).
 * Without starts also: a graph with NULL states (every replay == an eager
 * prefill from zeros) and bad arguments (refused, nothing captured); with
 * starts, a mask in host memory refused. */
static void test_prefill_graph(int batch, int T, int W, int starts, uint64_t seed)
{
    const size_t nm = (size_t)batch * T;
    float *hu = FALLOC(n_u(batch, T)), *oe = FALLOC(n_out(batch, T)), *og = FALLOC(n_out(batch, T));
    float *due = mg_tap_dalloc(n_u(batch, T)), *doe = mg_tap_dalloc(n_out(batch, T));
    float *dug = mg_tap_dalloc(n_u(batch, T)), *dog = mg_tap_dalloc(n_out(batch, T));
    unsigned char *mask = starts ? (unsigned char *)mg_tap_malloc(nm) : NULL;
    unsigned char *dme = starts ? dalloc_bytes(nm) : NULL, *dmg = starts ? dalloc_bytes(nm) : NULL;
    const char *what = starts ? "prefill graph with a start mask" : "prefill graph";
    float *dse[NST], *dsg[NST];
    dev_state_pair(dse, dsg, batch, seed);
    if (cudaMemset(dug, 0, n_u(batch, T) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    model_graph *g = NULL;
    mg_status s;
    if (starts) {
        memset(mask, 1, nm);
        if (cudaMemcpy(dmg, mask, nm, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy");
        s = model_prefill_graph_create_starts(model, batch, T, dug, dog, DEV_STATES(dsg), dmg, &g);
    } else {
        s = model_prefill_graph_create(model, batch, T, dug, dog, DEV_STATES(dsg), &g);
    }
    if (!mg_tap_ok(s == MG_OK, "%s_create batch=%d T=%d", starts ? "prefill_graph_create_starts"
                   : "prefill_graph_create", batch, T))
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    int same = g != NULL;
    for (int w = 0; w < W && s == MG_OK; ++w) {
        if (starts) {
            window_starts(mask, batch, T, w);
            if (cudaMemcpy(dme, mask, nm, cudaMemcpyHostToDevice) != cudaSuccess ||
                cudaMemcpy(dmg, mask, nm, cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("cudaMemcpy");
        }
        mg_tap_randn(hu, n_u(batch, T), seed + 10 + (uint64_t)w, 1.0f);
        mg_tap_up(due, hu, n_u(batch, T));
        mg_tap_up(dug, hu, n_u(batch, T));
        s = starts ? model_prefill_starts(model, batch, T, due, doe, DEV_STATES(dse), dme)
                   : model_prefill(model, batch, T, due, doe, DEV_STATES(dse));
        if (s == MG_OK) s = model_decode_graph_launch(g);
        if (s != MG_OK) break;
        mg_tap_down(oe, doe, n_out(batch, T));
        mg_tap_down(og, dog, n_out(batch, T));
        if (memcmp(oe, og, n_out(batch, T) * sizeof(float)) != 0) {
            mg_err e = mg_compare_f32f32(og, oe, n_out(batch, T));
            mg_tap_diag("window %d: graph vs eager out rel_l2 %.3e", w, e.rel_l2);
            same = 0;
        }
    }
    if (g) {
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        if (starts) {
            mg_tap_ok(s == MG_OK && same, "%s changed between %d windows == eager prefill_starts: out of every "
                      "window bit-identical", what, W);
            mg_tap_ok(s == MG_OK && same_states(dse, dsg, batch),
                      "%s == eager prefill_starts: final states bit-identical", what);
        } else {
            mg_tap_ok(s == MG_OK && same, "%s batch=%d T=%d, %d windows == eager prefill: out of every "
                      "window bit-identical", what, batch, T, W);
            mg_tap_ok(s == MG_OK && same_states(dse, dsg, batch),
                      "%s batch=%d T=%d: states advanced in place, bit-identical to eager", what, batch, T);
        }
        model_decode_graph_destroy(g);
    }
    g = NULL;
    if (starts) {
        s = model_prefill_graph_create_starts(model, batch, T, dug, dog, NO_STATES, (const unsigned char *)mask, &g);
        mg_tap_ok(s == MG_ERR_INVALID_ARG && g == NULL,
                  "prefill_graph_create_starts with a host-memory mask: invalid argument, no graph (%s)",
                  mg_last_error());
    } else {
        /* NULL states: a fresh start at every replay */
        s = model_prefill_graph_create(model, batch, T, dug, dog, NO_STATES, &g);
        same = s == MG_OK;
        for (int w = 0; w < 2 && s == MG_OK; ++w) {
            mg_tap_randn(hu, n_u(batch, T), seed + 20 + (uint64_t)w, 1.0f);
            mg_tap_up(due, hu, n_u(batch, T));
            mg_tap_up(dug, hu, n_u(batch, T));
            s = model_prefill(model, batch, T, due, doe, NO_STATES);
            if (s == MG_OK) s = model_decode_graph_launch(g);
            if (s != MG_OK) break;
            mg_tap_down(oe, doe, n_out(batch, T));
            mg_tap_down(og, dog, n_out(batch, T));
            same = same && memcmp(oe, og, n_out(batch, T) * sizeof(float)) == 0;
        }
        if (s != MG_OK) mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
        mg_tap_ok(s == MG_OK && same, "prefill graph without states: every replay == eager prefill from zeros, "
                  "bit-identical");
        model_decode_graph_destroy(g);
        /* bad arguments: an error, no graph */
        g = NULL;
        s = model_prefill_graph_create(model, batch, 0, dug, dog, NO_STATES, &g);
        mg_tap_ok(s == MG_ERR_INVALID_ARG && g == NULL,
                  "prefill_graph_create seqlen 0: invalid argument, no graph (%s)", mg_last_error());
        s = model_prefill_graph_create(model, batch, T, dug, NULL, NO_STATES, &g);
        mg_tap_ok(s == MG_ERR_INVALID_ARG && g == NULL, "prefill_graph_create out NULL: invalid argument, no graph");
        s = model_prefill_graph_create(model, batch, T, dug, dog, NO_STATES, NULL);
        mg_tap_ok(s == MG_ERR_INVALID_ARG, "prefill_graph_create graph pointer NULL: invalid argument");
    }
    for (int i = 0; i < NST; ++i) { mg_dev_free(dse[i]); mg_dev_free(dsg[i]); }
    mg_dev_free(due); mg_dev_free(doe); mg_dev_free(dug); mg_dev_free(dog); mg_dev_free(dme); mg_dev_free(dmg);
    free(hu); free(oe); free(og); free(mask);
}

/* Bad calls of the reset API: the documented status, and nothing launched
 * (out and the states keep their sentinel values). */
static void test_reset_bad_calls(void)
{
    const int B = imin(2, MAX_BATCH);
    const size_t no = n_out(B, 1);
    float *du = mg_tap_dalloc(n_u(B, 1)), *dout = mg_tap_dalloc(no);
    float *ds[NST], *sent[NST + 1];
    unsigned char *dmask = dalloc_bytes((size_t)B);
    unsigned char *hmask = (unsigned char *)mg_tap_calloc((size_t)MAX_BATCH + 1);   /* plain host memory */
    if (cudaMemset(dmask, 1, (size_t)B) != cudaSuccess) mg_tap_bail("cudaMemset");
    for (int i = 0; i <= NST; ++i) {
        const size_t n = i < NST ? st_floats(i, B) : no;
        sent[i] = FALLOC(n);
        for (size_t k = 0; k < n; ++k) sent[i][k] = 4242.0f + (float)(k % 89);
        if (i < NST) { ds[i] = mg_tap_dalloc(n); mg_tap_up(ds[i], sent[i], n); }
    }
    mg_tap_up(dout, sent[NST], no);
    mg_tap_expect_status(model_decode_step_reset(model, B, du, dout, DEV_STATES(ds), hmask), MG_ERR_INVALID_ARG,
                         "decode_step_reset with a mask in unregistered host memory");
    mg_tap_expect_status(model_decode_step_reset(NULL, B, du, dout, DEV_STATES(ds), dmask), MG_ERR_INVALID_ARG,
                         "decode_step_reset with a NULL model");
    mg_tap_expect_status(model_decode_step_reset(model, 0, du, dout, DEV_STATES(ds), dmask), MG_ERR_INVALID_ARG,
                         "decode_step_reset batch = 0");
    mg_tap_expect_status(model_decode_step_reset(model, MAX_BATCH + 1, du, dout, DEV_STATES(ds), dmask),
                         MG_ERR_INVALID_ARG, "decode_step_reset batch = MAX_BATCH + 1");
    mg_tap_expect_status(model_decode_step_reset(model, B, du, dout, NO_STATES, dmask), MG_ERR_INVALID_ARG,
                         "decode_step_reset without states");
    mg_tap_expect_status(model_decode_step_reset(model, B, NULL, dout, DEV_STATES(ds), dmask), MG_ERR_INVALID_ARG,
                         "decode_step_reset u = NULL");
    mg_tap_expect_status(model_decode_step_reset(model, B, du + 1, dout, DEV_STATES(ds), dmask), MG_ERR_ALIGNMENT,
                         "decode_step_reset misaligned u");
    {
        model_graph *g = (model_graph *)hmask;   /* must come back NULL */
        mg_tap_expect_status(model_decode_graph_create_reset(model, B, du, dout, DEV_STATES(ds), hmask, &g),
                             MG_ERR_INVALID_ARG, "decode_graph_create_reset with a mask in unregistered host memory");
        mg_tap_ok(g == NULL, "decode_graph_create_reset: no graph on error");
        mg_tap_expect_status(model_decode_graph_create_reset(model, B, du, dout, DEV_STATES(ds), dmask, NULL),
                             MG_ERR_INVALID_ARG, "decode_graph_create_reset graph pointer NULL");
        mg_tap_expect_status(model_decode_graph_create_reset(model, B, du, dout, NO_STATES, dmask, &g),
                             MG_ERR_INVALID_ARG, "decode_graph_create_reset without states");
    }
    int untouched = cudaDeviceSynchronize() == cudaSuccess;
    for (int i = 0; i <= NST && untouched; ++i) {
        const size_t n = i < NST ? st_floats(i, B) : no;
        float *back = FALLOC(n);
        mg_tap_down(back, i < NST ? ds[i] : dout, n);
        untouched = memcmp(back, sent[i], n * sizeof(float)) == 0;
        free(back);
    }
    mg_tap_ok(untouched, "bad reset calls left out and the states untouched");
    for (int i = 0; i <= NST; ++i) { if (i < NST) mg_dev_free(ds[i]); free(sent[i]); }
    mg_dev_free(du); mg_dev_free(dout); mg_dev_free(dmask);
    free(hmask);
}

/* main's steps after the parameter-table test: the weights from the
 * reference's init (host and device copies), the model, and the calls that
 * must fail before and at set_weights. */
#define FWD_INIT_SEED 20240601ull   /* the weights of every check but the pushed ones */

static void fwd_model_start(void)
{
    blob = FALLOC(lay.total > (size_t)MODEL_WEIGHTS_FLOATS ? lay.total : (size_t)MODEL_WEIGHTS_FLOATS);
    if (REF(init)(&dims, &lay, blob, FWD_INIT_SEED) != MG_OK) mg_tap_bail(FWD_STR(REF(init)));
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

/* The pushed-weights cases' start: REF(push_ranges) moves some heads' or
 * channels' weights out of the init range (softplus's argument above its
 * threshold; Mamba-3: the a_floor clamp binding), deterministically in
 * seed, in the host blob (the reference's), its device copy and the
 * model's weights; the checks that follow carry weights_tag and their
 * inputs push_inputs. fwd_weights_init ends them: the init weights back. */
static void fwd_weights_pushed(uint64_t seed)
{
    if (REF(push_ranges)(&dims, &lay, blob, seed, &u_offset0) != MG_OK) mg_tap_bail(FWD_STR(REF(push_ranges)));
    mg_tap_up(d_blob, blob, (size_t)MODEL_WEIGHTS_FLOATS);
    if (model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS) != MG_OK) mg_tap_bail("set_weights (pushed)");
    weights_tag = ", weights out of the init range";
    mg_tap_diag("weights out of the init range (%s, seed %llu); input channel 0 offset %g", FWD_STR(REF(push_ranges)),
                (unsigned long long)seed, (double)u_offset0);
}

static void fwd_weights_init(void)
{
    if (REF(init)(&dims, &lay, blob, FWD_INIT_SEED) != MG_OK) mg_tap_bail(FWD_STR(REF(init)));
    mg_tap_up(d_blob, blob, (size_t)MODEL_WEIGHTS_FLOATS);
    if (model_set_weights(model, d_blob, (size_t)MODEL_WEIGHTS_FLOATS) != MG_OK) mg_tap_bail("set_weights (init)");
    weights_tag = "";
    u_offset0 = 0.0f;
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

/* ---------------------------------------------------------------- packed sequences (doc/math.md §9) */

/* The lengths of the packed tests: 1, chunk-1, chunk, chunk+1 and a long
 * one (chunk = MODEL_SCAN_CHUNK), each within 1..MAX_SEQ_LEN, as many as
 * MAX_BATCH allows; cu gets the offsets (nseq + 1). Returns nseq. */
static int packed_cu(const int want[5], int32_t *cu)
{
    const int nseq = imin(5, MAX_BATCH);
    cu[0] = 0;
    for (int i = 0; i < nseq; ++i) cu[i + 1] = cu[i] + imax(1, imin(want[i], MAX_SEQ_LEN));
    return nseq;
}

static int packed_lengths(int32_t *cu)
{
    const int C = MODEL_SCAN_CHUNK;
    const int want[5] = { 1, C - 1, C, C + 1, 2 * C + 3 };
    return packed_cu(want, cu);
}

/* "lengths a,b,..." of a packed call, for the TAP lines. */
static void packed_label(char *lens, size_t n, const int32_t *cu, int nseq)
{
    snprintf(lens, n, "lengths %d", (int)(cu[1] - cu[0]));
    for (int i = 1; i < nseq; ++i) snprintf(lens + strlen(lens), n - strlen(lens), ",%d", (int)(cu[i + 1] - cu[i]));
}

/* Floats of one stream's slice of state i in one layer. */
static size_t st_per(int i) { return st_floats(i, 1) / MODEL_N_LAYERS; }

/* A packed prefill of cu's sequences of u (device copy du) against the
 * reference's packed forward_ex: prefill_packed_from when from, else
 * prefill_packed. ds (device) and rs (reference, in and out) hold the
 * initial states each side starts from (zeros in rs for prefill_packed,
 * which ignores ds's values). TAP: the call runs; out and every final state
 * within TOL. out and hs (the final states) are left on the host and lens
 * holds the lengths' label. Returns the call's status. */
static mg_status packed_vs_ref(int from, int nseq, const int32_t *cu, const float *u, const float *du, float *dout,
                               float *const ds[NST], float *const hs[NST], double *const rs[NST], float *out,
                               char *lens, size_t nlens)
{
    const int total = cu[nseq];
    const char *name = from ? "prefill_packed_from" : "prefill_packed";
    double *rout = DALLOC_H(n_out(1, total));
    const mg_ref_seqs o = { NULL, cu, nseq, nseq };
    if (REF_FWD_EX(total, u, rout, rs, &o) != MG_OK) mg_tap_bail(FWD_STR(REF(forward_ex)));
    packed_label(lens, nlens, cu, nseq);
    const mg_status s = from ? model_prefill_packed_from(model, nseq, cu, du, dout, DEV_STATES(ds))
                             : model_prefill_packed(model, nseq, cu, du, dout, DEV_STATES(ds));
    char what[200];
    if (!mg_tap_ok(s == MG_OK, "%s (%s) runs", name, lens)) {
        mg_tap_diag("%s: %s", mg_status_name(s), mg_last_error());
    } else {
        mg_tap_down(out, dout, n_out(1, total));
        snprintf(what, sizeof what, "%s (%s) vs reference forward_ex (cu_seqlens): out", name, lens);
        cmp_ref(what, out, rout, n_out(1, total));
        for (int i = 0; i < NST; ++i) mg_tap_down(hs[i], ds[i], st_floats(i, nseq));
        snprintf(what, sizeof what, "%s (%s) vs reference forward_ex: final states", name, lens);
        CMP_STATES_ANY(what, nseq, hs, rs, NULL);
    }
    free(rout);
    return s;
}

/* prefill_packed (every sequence from zero states; the state buffers hold
 * random values, which must be ignored) vs the reference's packed call
 * (forward_ex with cu_seqlens, zero initial states): out and every final
 * state within TOL; and vs prefill on each sequence alone from zero states
 * (the same model, other GEMM shapes): within TOL as well. */
static void test_packed(uint64_t seed)
{
    int32_t cu[6];
    const int nseq = packed_lengths(cu), total = cu[nseq];
    float *u = FALLOC(n_u(1, total)), *out = FALLOC(n_out(1, total));
    float *du = mg_tap_dalloc(n_u(1, total)), *dout = mg_tap_dalloc(n_out(1, total));
    float *ds[NST], *hs[NST];
    double *rs[NST];
    size_t sn[NST];
    for (int i = 0; i < NST; ++i) sn[i] = st_floats(i, nseq);
    mg_tap_states(NST, sn, seed + 10, 1.0f, 0, ds, hs, rs);   /* random in, zero initial states for the reference */
    mg_tap_randn(u, n_u(1, total), seed, 1.0f);
    mg_tap_up(du, u, n_u(1, total));
    char what[200], lens[64];
    if (packed_vs_ref(0, nseq, cu, u, du, dout, ds, hs, rs, out, lens, sizeof lens) == MG_OK) {
        /* each sequence alone: prefill at batch 1 from zero states */
        float *sout = FALLOC(n_out(1, total)), *sst[NST] = { NULL }, *d1[NST] = { NULL };
        for (int i = 0; i < NST; ++i) { sst[i] = FALLOC(st_floats(i, nseq)); d1[i] = mg_tap_dalloc(st_floats(i, 1)); }
        mg_status s1 = MG_OK;
        for (int q = 0; q < nseq && s1 == MG_OK; ++q) {
            for (int i = 0; i < NST; ++i)
                if (cudaMemset(d1[i], 0, st_floats(i, 1) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
            const int len = cu[q + 1] - cu[q];
            /* its own buffers: u and out of each call 16-byte aligned whatever IN_DIM is */
            float *u1 = mg_tap_dalloc(n_u(1, len)), *o1 = mg_tap_dalloc(n_out(1, len));
            mg_tap_up(u1, u + n_u(1, cu[q]), n_u(1, len));
            s1 = model_prefill(model, 1, len, u1, o1, DEV_STATES(d1));
            if (s1 == MG_OK) mg_tap_down(sout + n_out(1, cu[q]), o1, n_out(1, len));
            mg_dev_free(u1); mg_dev_free(o1);
            for (int i = 0; i < NST && s1 == MG_OK; ++i) {
                float *h1 = FALLOC(st_floats(i, 1));
                mg_tap_down(h1, d1[i], st_floats(i, 1));
                for (int l = 0; l < MODEL_N_LAYERS; ++l)
                    memcpy(sst[i] + ((size_t)l * nseq + q) * st_per(i), h1 + (size_t)l * st_per(i),
                           st_per(i) * sizeof(float));
                free(h1);
            }
        }
        if (mg_tap_ok(s1 == MG_OK, "prefill of each packed sequence alone runs")) {
            snprintf(what, sizeof what, "prefill_packed (%s) vs prefill of each sequence alone (within TOL): out",
                     lens);
            cmp_gpu(what, out, sout, n_out(1, total));
            snprintf(what, sizeof what, "prefill_packed (%s) vs prefill of each sequence alone (within TOL): final "
                     "states", lens);
            CMP_STATES_ANY(what, nseq, hs, NULL, sst);
        } else {
            mg_tap_diag("%s: %s", mg_status_name(s1), mg_last_error());
        }
        free(sout);
        for (int i = 0; i < NST; ++i) { free(sst[i]); mg_dev_free(d1[i]); }
    }
    mg_tap_states_free(NST, ds, hs, rs);
    mg_dev_free(du); mg_dev_free(dout);
    free(u); free(out);
}

/* prefill_packed_from: each sequence from its own random initial states
 * (two pairs of equal lengths, so that groups of several sequences and of
 * one run) vs the reference's packed call from the same states (forward_ex
 * with cu_seqlens: states in and out per sequence): out and every final
 * state within TOL; and with NULL states it is prefill_packed, bit for bit. */
static void test_packed_from(uint64_t seed)
{
    const int C = MODEL_SCAN_CHUNK;
    const int want[5] = { C + 1, 3, C + 1, 1, 3 };
    int32_t cu[6] = { 0 };
    const int nseq = packed_cu(want, cu), total = cu[nseq];
    float *u = FALLOC(n_u(1, total)), *out = FALLOC(n_out(1, total)), *out0 = FALLOC(n_out(1, total));
    float *du = mg_tap_dalloc(n_u(1, total)), *dout = mg_tap_dalloc(n_out(1, total));
    float *ds[NST], *hs[NST];
    double *rs[NST];
    size_t sn[NST];
    for (int i = 0; i < NST; ++i) sn[i] = st_floats(i, nseq);
    mg_tap_states(NST, sn, seed + 10, 0.5f, 1, ds, hs, rs);   /* random, the reference from the same */
    mg_tap_randn(u, n_u(1, total), seed, 1.0f);
    mg_tap_up(du, u, n_u(1, total));
    char lens[64];
    packed_vs_ref(1, nseq, cu, u, du, dout, ds, hs, rs, out, lens, sizeof lens);   /* from the random states */
    /* NULL states: prefill_packed's zeros in */
    mg_status s = model_prefill_packed_from(model, nseq, cu, du, dout, NO_STATES);
    if (s == MG_OK) mg_tap_down(out, dout, n_out(1, total));
    mg_status s0 = model_prefill_packed(model, nseq, cu, du, dout, NO_STATES);
    if (s0 == MG_OK) mg_tap_down(out0, dout, n_out(1, total));
    mg_tap_ok(s == MG_OK && s0 == MG_OK && memcmp(out, out0, n_out(1, total) * sizeof(float)) == 0,
              "prefill_packed_from with NULL states == prefill_packed, bit for bit");
    /* refusals: bad cu_seqlens, a NULL model */
    const int32_t bad_cu[3] = { 1, 2, 3 };
    mg_tap_expect_error(model_prefill_packed_from(model, 2, bad_cu, du, dout, DEV_STATES(ds)), MG_ERR_INVALID_ARG,
                        "_prefill_packed_from: cu_seqlens[0]", "prefill_packed_from with cu_seqlens[0] = 1");
    mg_tap_expect_status(model_prefill_packed_from(NULL, nseq, cu, du, dout, DEV_STATES(ds)), MG_ERR_INVALID_ARG,
                         "prefill_packed_from(NULL model)");
    mg_tap_states_free(NST, ds, hs, rs);
    mg_dev_free(du); mg_dev_free(dout);
    free(u); free(out); free(out0);
}

/* Whether n floats of device buffer d still hold the bits of h. */
static int dev_unchanged(const float *d, const float *h, size_t n)
{
    float *x = FALLOC(n);
    mg_tap_down(x, d, n);
    const int same = memcmp(x, h, n * sizeof(float)) == 0;
    free(x);
    return same;
}

/* Every bad cu_seqlens refused with MG_ERR_INVALID_ARG before anything is
 * written (out and states sentinel-filled, unchanged after), and a forged
 * model. */
static void test_packed_bad_calls(void)
{
    const int nb = MAX_BATCH + 2;
    int32_t *cu = (int32_t *)mg_tap_calloc((size_t)(nb + 1) * sizeof(int32_t));
    const size_t nu = n_u(1, 4), no = n_out(1, 4);
    float *du = mg_tap_dalloc(nu), *dout = mg_tap_dalloc(no), *ho = FALLOC(no), *ds[NST] = { NULL }, *hs[NST] = { NULL };
    for (size_t i = 0; i < no; ++i) ho[i] = -1234.5f;
    mg_tap_up(dout, ho, no);
    for (int i = 0; i < NST; ++i) {
        const size_t n = st_floats(i, MAX_BATCH + 1);
        ds[i] = mg_tap_dalloc(n);
        hs[i] = FALLOC(n);
        for (size_t j = 0; j < n; ++j) hs[i][j] = 777.25f;
        mg_tap_up(ds[i], hs[i], n);
    }
    struct { const char *what; int nseq; int32_t v[3]; int null; } bad[] = {
        { "cu_seqlens NULL", 1, { 0, 1, 0 }, 1 },
        { "nseq = 0", 0, { 0, 1, 0 }, 0 },
        { "nseq = MAX_BATCH + 1", MAX_BATCH + 1, { 0, 1, 2 }, 0 },
        { "cu_seqlens[0] = 1", 1, { 1, 2, 0 }, 0 },
        { "an empty sequence (equal entries)", 2, { 0, 1, 1 }, 0 },
        { "decreasing entries", 2, { 0, 2, 1 }, 0 },
        { "a sequence longer than MAX_SEQ_LEN", 1, { 0, MAX_SEQ_LEN + 1, 0 }, 0 },
    };
    char what[160];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        memset(cu, 0, (size_t)(nb + 1) * sizeof(int32_t));
        memcpy(cu, bad[k].v, sizeof bad[k].v);
        if (bad[k].nseq > 2)   /* valid increasing offsets past the first entries */
            for (int i = 1; i <= bad[k].nseq; ++i) cu[i] = i;
        snprintf(what, sizeof what, "prefill_packed refuses %s", bad[k].what);
        mg_tap_expect_status(model_prefill_packed(model, bad[k].nseq, bad[k].null ? NULL : cu, du, dout,
                                                  DEV_STATES(ds)), MG_ERR_INVALID_ARG, what);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) mg_tap_bail("cudaDeviceSynchronize");
    int same = dev_unchanged(dout, ho, no);
    for (int i = 0; i < NST; ++i) same &= dev_unchanged(ds[i], hs[i], st_floats(i, MAX_BATCH + 1));
    mg_tap_ok(same, "prefill_packed's refused calls wrote nothing (out and states keep their sentinels)");
    cu[0] = 0; cu[1] = 1;
    mg_tap_expect_status(model_prefill_packed(NULL, 1, cu, du, dout, DEV_STATES(ds)), MG_ERR_INVALID_ARG,
                         "prefill_packed refuses a NULL model");
    for (int i = 0; i < NST; ++i) { mg_dev_free(ds[i]); free(hs[i]); }
    mg_dev_free(du); mg_dev_free(dout);
    free(ho); free(cu);
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
