/* model_host.h (emitted as mg_model_host.h): the part of a library's host
 * pipeline that every arch writes the same way: the parameter lookup, the
 * model object's destructor and setters, and the CUDA Graph of the decode
 * step. (model_create, the forward and the self-check share steps too, but
 * keep them inline in each arch's pipeline: split into helpers they compile
 * to other instructions.)
 * It names no model and no state: the arch's pipeline (host/ARCH/pipeline.h)
 * includes it once, after its struct model_model and the prototypes of its
 * check_call and forward, and names its recurrent states for it:
 *   STATE_PARAMS       the states as parameters of a public function
 *                      (float *d_conv_state, float *d_ssm_state, ...)
 *   STATE_ARGS         the same names as arguments
 *   NO_STATES          NULL for each state (a call from a fresh state)
 *   CHECK_STATES(fn, batch, seqlen, u, out, required)
 *                      the arch's check_call of those states
 * and its forward takes (..., STATE_ARGS, last_only, decode, reset); for
 * packed sequences (mg_packed_host.h) also
 *   STATE_SIZES(batch) the states' sizes in floats, { ... } in STATE_ARGS order
 *   N_STATES           how many there are
 *   FORWARD_STARTS(batch, seqlen, u, out, start)
 *                      its prefill forward with a start mask, on STATE_ARGS
 *   FORWARD_ON(batch, seqlen, u, out, sp)
 *                      its prefill forward on the states sp[0..N_STATES)
 * and its struct model_model holds pk, pk_u, pk_out, pk_start, pk_off,
 * pk_idx, pk_st[] (the packed workspace, allocated here by the first packed
 * call: models that never pack do not pay for it).
 * The names model_X / MODEL_X, MODEL_NAME, MODEL_UPPER, SCAN_SPEC_WHY,
 * HAS_CHUNKED, LOWP and GRAPH_CAPTURE_MODE come from NAME.c. Plain C11. */

int model_param_index(const char *pname)
{
    if (!pname) return -1;
    for (int i = 0; i < MODEL_N_PARAMS; ++i)
        if (strcmp(model_params[i].name, pname) == 0) return i;
    return -1;
}

/* Bytes of a workspace buffer, rounded up to 256. */
static size_t ws_bytes(size_t elems, size_t elem_size)
{
    return (elems * elem_size + 255u) & ~(size_t)255u;
}

/* ---- Handles: every model and decode graph of this library is in the
 * runtime's registry (mg_handle.h) while it lives; a call checks its
 * handle there before reading it, so a destroyed or forged handle, or a
 * graph whose model was destroyed, is an error rather than a read of freed
 * memory. The kinds are the addresses of these objects. ---- */
static const char model_kind_model = 'm', model_kind_graph = 'g';

/* MG_OK if m is a live model of this library, else the error for fn. */
static mg_status model_live(const model_model *m, const char *fn)
{
    if (!m) return mg_fail(MG_ERR_INVALID_ARG, "%s: model is NULL", fn);
    if (!mg_handle_live(m, &model_kind_model))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %p is not a live " MODEL_NAME " model (destroyed, or not from "
                       MODEL_NAME "_create)", fn, (const void *)m);
    return MG_OK;
}
#define MODEL_LIVE(m, fn) do { const mg_status live_s_ = model_live((m), (fn)); if (live_s_ != MG_OK) return live_s_; } while (0)

/* Frees what create allocated (any part may still be NULL). */
static void model_free(model_model *m)
{
#ifdef ARCH_DESTROY
    ARCH_DESTROY(m);
#endif
    mg_dev_free(m->pk);
    mg_dev_free(m->wa);
    mg_dev_free(m->ws);
    mg_blas_destroy(m->blas);
    free(m);
}

/* The packed-sequence workspace (NAME_prefill_packed, _from): the padded
 * input [MAX_TOKENS][IN_DIM] and output [MAX_TOKENS][D_MODEL] (f32), the
 * start mask [MAX_TOKENS], the offsets [MAX_BATCH + 1], the sequence order
 * [MAX_BATCH] and MAX_BATCH rows of every state; one allocation. */
static size_t packed_ws_bytes(void)
{
    const size_t sf[N_STATES] = STATE_SIZES(MODEL_MAX_BATCH);
    size_t b = ws_bytes((size_t)MAX_TOKENS * IN_DIM, sizeof(float)) + ws_bytes((size_t)MAX_TOKENS * D_MODEL, sizeof(float))
             + ws_bytes((size_t)MAX_TOKENS, 1) + ws_bytes((size_t)MODEL_MAX_BATCH + 1, sizeof(int))
             + ws_bytes((size_t)MODEL_MAX_BATCH, sizeof(int));
    for (int i = 0; i < N_STATES; ++i) b += ws_bytes(sf[i], sizeof(float));
    return b;
}

/* The packed workspace of m, allocated by its first packed call (then
 * counted in workspace_bytes); nothing to do after that. */
static mg_status packed_ws(model_model *m)
{
    if (m->pk) return MG_OK;
    const size_t pkb = packed_ws_bytes();
    const mg_status s = mg_dev_alloc(&m->pk, pkb, MODEL_NAME " packed-sequence workspace");
    if (s != MG_OK) return s;
    char *p = (char *)m->pk;
    m->pk_u = (float *)(void *)p;        p += ws_bytes((size_t)MAX_TOKENS * IN_DIM, sizeof(float));
    m->pk_out = (float *)(void *)p;      p += ws_bytes((size_t)MAX_TOKENS * D_MODEL, sizeof(float));
    m->pk_start = (unsigned char *)p;    p += ws_bytes((size_t)MAX_TOKENS, 1);
    m->pk_off = (int *)(void *)p;        p += ws_bytes((size_t)MODEL_MAX_BATCH + 1, sizeof(int));
    m->pk_idx = (int *)(void *)p;        p += ws_bytes((size_t)MODEL_MAX_BATCH, sizeof(int));
    const size_t sf[N_STATES] = STATE_SIZES(MODEL_MAX_BATCH);
    for (int i = 0; i < N_STATES; ++i) {
        m->pk_st[i] = (float *)(void *)p;
        p += ws_bytes(sf[i], sizeof(float));
    }
    m->ws_total += pkb;
    return MG_OK;
}

/* The last step of create: m gets its serial and enters the registry (on
 * failure it is freed). */
static mg_status model_register(model_model *m)
{
    static _Atomic unsigned long long next_serial = 1;
    m->serial = next_serial++;
    const mg_status s = mg_handle_add(m, &model_kind_model);
    if (s != MG_OK) model_free(m);
    return s;
}

void model_destroy(model_model *m)
{
    if (!m || !mg_handle_live(m, &model_kind_model)) return;   /* NULL, or already destroyed: nothing to do */
    mg_handle_remove(m);
    model_free(m);
}

size_t model_workspace_bytes(const model_model *m)
{
    return mg_handle_live(m, &model_kind_model) ? m->ws_total : 0;
}

mg_status model_set_stream(model_model *m, cudaStream_t stream)
{
    MODEL_LIVE(m, MODEL_NAME "_set_stream");
    mg_status s = mg_blas_set_stream(m->blas, stream);
    if (s != MG_OK) return s;
    m->stream = stream;
    return MG_OK;
}

mg_status model_set_weights(model_model *m, const float *d_weights, size_t n_floats)
{
    MODEL_LIVE(m, MODEL_NAME "_set_weights");
    if (!d_weights) return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_weights: weights pointer is NULL");
    if (n_floats != (size_t)MODEL_WEIGHTS_FLOATS)
        return mg_fail(MG_ERR_SIZE, MODEL_NAME "_set_weights: blob has %zu floats, expected %zu (" MODEL_UPPER "_WEIGHTS_FLOATS)",
                       n_floats, (size_t)MODEL_WEIGHTS_FLOATS);
    if (!mg_aligned(d_weights, 16))
        return mg_fail(MG_ERR_ALIGNMENT, MODEL_NAME "_set_weights: weights pointer %p is not 16-byte aligned",
                       (const void *)d_weights);
    m->w = d_weights;
    return model__convert_weights(m);
}

const void *model__gemm_weights(const model_model *m)
{
    if (!mg_handle_live(m, &model_kind_model) || !m->w) return NULL;
#if LOWP
    return m->wa;
#else
    return m->w;
#endif
}

mg_status model_set_scan(model_model *m, int choice)
{
    MODEL_LIVE(m, MODEL_NAME "_set_scan");
    if (choice != MODEL_SCAN_SPEC && choice != MODEL_SCAN_SEQUENTIAL && choice != MODEL_SCAN_CHUNKED)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_scan: unknown choice %d (0 spec, 1 sequential, 2 chunked)", choice);
    if (choice == MODEL_SCAN_CHUNKED && !HAS_CHUNKED)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_scan: this library has no chunked scan "
                       SCAN_SPEC_WHY);
#ifdef ARCH_SET_SCAN
    /* the arch's workspace for that choice (Mamba-3: the unfused buffers) */
    mg_status s = ARCH_SET_SCAN(m, choice);
    if (s != MG_OK) return s;
#endif
    m->scan_choice = choice;
    return MG_OK;
}

/* ---- Decode with a reset mask ----
 * reset [batch] is uint8 in device memory (or host memory registered with
 * CUDA: the kernels read it), nonzero = that stream starts an episode: its
 * states are zeros before the step. NULL = no reset. A host pointer the
 * device cannot read would fault the kernels, so it is refused here
 * (mg_dev_readable: a host-side lookup, no launch, no sync). */
static mg_status check_reset(const char *fn, const unsigned char *reset)
{
    return reset ? mg_dev_readable(reset, fn, "reset") : MG_OK;
}

mg_status model_decode_step_reset(model_model *m, int batch, const float *d_u, float *d_out, STATE_PARAMS,
                                  const uint8_t *d_reset)
{
    static const char fn[] = MODEL_NAME "_decode_step_reset";
    mg_status s = CHECK_STATES(fn, batch, 1, d_u, d_out, 1);
    if (s == MG_OK) s = check_reset(fn, d_reset);
    if (s != MG_OK) return s;
    return forward(m, batch, 1, d_u, d_out, STATE_ARGS, 0, 1, d_reset);
}

/* ---- CUDA Graph of the decode step ---- */
struct model_graph {
    model_model *m;
    unsigned long long serial;   /* m->serial at capture: the model is still the one captured */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

void model_decode_graph_destroy(model_graph *g)
{
    if (!g || !mg_handle_live(g, &model_kind_graph)) return;   /* NULL, or already destroyed */
    mg_handle_remove(g);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}

/* The decode graph (seqlen 1, decode 1), with or without a reset buffer,
 * or the prefill graph (decode 0: batch x seqlen tokens, states optional),
 * with or without a start mask buffer (FORWARD_STARTS); fn names the
 * caller. */
static mg_status graph_create(const char *fn, model_model *m, int batch, int seqlen, int decode,
                              const float *d_u, float *d_out, STATE_PARAMS, const unsigned char *reset,
                              const unsigned char *start, model_graph **out)
{
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, "%s: graph pointer is NULL", fn);
    *out = NULL;
    mg_status s = CHECK_STATES(fn, batch, seqlen, d_u, d_out, decode);
    if (s == MG_OK) s = check_reset(fn, reset);
    if (s == MG_OK && start) s = mg_dev_readable(start, fn, "start");
    if (s != MG_OK) return s;
    model_graph *g = (model_graph *)calloc(1, sizeof *g);
    if (!g) return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if ((s = mg_handle_add(g, &model_kind_graph)) != MG_OK) { free(g); return s; }
    g->m = m;
    g->serial = m->serial;
    /* Capture on an internal stream (the legacy default stream cannot be
     * captured), after the model's pending work. A warm-up call from a fresh
     * state on that stream first, so cuBLAS has set itself up for these
     * shapes and this stream before the capture; it writes out only. */
    const cudaStream_t old = m->stream;
    cudaStream_t cap = NULL;
    cudaError_t ce = cudaStreamSynchronize(old);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking);
    if (ce != cudaSuccess) { mg_handle_remove(g); free(g); return mg_cuda_check(ce, "graph_create: stream"); }
    s = model_set_stream(m, cap);
    if (s == MG_OK) s = forward(m, batch, seqlen, d_u, d_out, NO_STATES, 0, decode, NULL);
    if (s == MG_OK) s = mg_cuda_check(cudaStreamSynchronize(cap), "graph_create: warm-up");
    if (s == MG_OK) {
        s = mg_cuda_check(cudaStreamBeginCapture(cap, GRAPH_CAPTURE_MODE), "graph_create: cudaStreamBeginCapture");
        if (s == MG_OK) {
            /* the kernels read reset[] and start[] at every replay: a mask
             * is the buffer's contents at launch time */
            const mg_status sf = start ? FORWARD_STARTS(batch, seqlen, d_u, d_out, start)
                                       : forward(m, batch, seqlen, d_u, d_out, STATE_ARGS, 0, decode, reset);
            /* End the capture whatever happened, so the stream is usable again. */
            const cudaError_t ee = cudaStreamEndCapture(cap, &g->graph);
            s = sf != MG_OK ? sf : mg_cuda_check(ee, "graph_create: cudaStreamEndCapture");
        }
    }
    if (s == MG_OK)
        s = mg_cuda_check(cudaGraphInstantiate(&g->exec, g->graph, 0), "graph_create: cudaGraphInstantiate");
    const mg_status sr = model_set_stream(m, old);
    if (s == MG_OK) s = sr;
    cudaStreamDestroy(cap);
    if (s != MG_OK) { model_decode_graph_destroy(g); return s; }
    *out = g;
    return MG_OK;
}

mg_status model_decode_graph_create(model_model *m, int batch, const float *d_u, float *d_out,
                                    STATE_PARAMS, model_graph **out)
{
    return graph_create(MODEL_NAME "_decode_graph_create", m, batch, 1, 1, d_u, d_out, STATE_ARGS, NULL, NULL, out);
}

mg_status model_decode_graph_create_reset(model_model *m, int batch, const float *d_u, float *d_out,
                                          STATE_PARAMS, const uint8_t *d_reset, model_graph **out)
{
    return graph_create(MODEL_NAME "_decode_graph_create_reset", m, batch, 1, 1, d_u, d_out, STATE_ARGS, d_reset,
                        NULL, out);
}

mg_status model_prefill_graph_create(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                                     STATE_PARAMS, model_graph **out)
{
    return graph_create(MODEL_NAME "_prefill_graph_create", m, batch, seqlen, 0, d_u, d_out, STATE_ARGS, NULL, NULL,
                        out);
}

mg_status model_prefill_graph_create_starts(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                                            STATE_PARAMS, const uint8_t *d_start, model_graph **out)
{
    return graph_create(MODEL_NAME "_prefill_graph_create_starts", m, batch, seqlen, 0, d_u, d_out, STATE_ARGS,
                        NULL, d_start, out);
}

mg_status model_decode_graph_launch(model_graph *g)
{
    static const char fn[] = MODEL_NAME "_decode_graph_launch";
    if (!g) return mg_fail(MG_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    if (!mg_handle_live(g, &model_kind_graph) || !g->exec)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %p is not a live graph (destroyed, or not from "
                       MODEL_NAME "_decode_graph_create or " MODEL_NAME "_prefill_graph_create)", fn,
                       (const void *)g);
    if (!mg_handle_live(g->m, &model_kind_model) || g->m->serial != g->serial)
        return mg_fail(MG_ERR_STATE, "%s: the graph's model was destroyed (destroy the graph first)", fn);
    MG_CUDA(cudaGraphLaunch(g->exec, g->m->stream));
    return MG_OK;
}

/* ---- Packed variable-length sequences (cu_seqlens; doc/math.md §9) ----
 * Every check on the host (cu_seqlens is host memory) before any launch;
 * then the states are zeroed, u is gathered into the padded batch
 * [nseq][maxlen] with a start at each row's first real token, the arch's
 * forward with that mask runs on the caller's states (batch nseq: the
 * final states land in [n_layers][nseq][...]), and the real tokens' rows
 * are scattered into out. */
#include "mg_packed_host.h"

/* From given initial states (prefill_packed_from with states): the
 * sequences of each distinct length run as one unpadded batch (FORWARD_ON)
 * on MAX_BATCH-row copies of their state rows, gathered from and scattered
 * back to the caller's states; the order (by length, then index) is sorted
 * on the host and uploaded once with the offsets. */
static mg_status packed_groups(model_model *m, const packed_shape *ps, const int32_t *cu_seqlens, const float *d_u,
                               float *d_out, float *const sp[N_STATES])
{
    const int nseq = ps->nseq;
    /* the order: by length, then by index (insertion sort: nseq <= MAX_BATCH) */
    int order[MODEL_MAX_BATCH];
    for (int i = 0; i < nseq; ++i) {
        const int32_t len = cu_seqlens[i + 1] - cu_seqlens[i];
        int j = i;
        while (j > 0 && cu_seqlens[order[j - 1] + 1] - cu_seqlens[order[j - 1]] > len) {
            order[j] = order[j - 1];
            --j;
        }
        order[j] = i;
    }
    const cudaStream_t st = m->stream;
    MG_CUDA(cudaMemcpyAsync(m->pk_off, cu_seqlens, (size_t)(nseq + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    MG_CUDA(cudaMemcpyAsync(m->pk_idx, order, (size_t)nseq * sizeof(int), cudaMemcpyHostToDevice, st));
    const size_t full[N_STATES] = STATE_SIZES(nseq);
    for (int a = 0; a < nseq;) {
        const int len = cu_seqlens[order[a] + 1] - cu_seqlens[order[a]];
        int b = a + 1;
        while (b < nseq && cu_seqlens[order[b] + 1] - cu_seqlens[order[b]] == len) ++b;
        const int k = b - a;
        const int *idx = m->pk_idx + a;
        for (int i = 0; i < N_STATES; ++i)
            MG_CUDA(MG_LAUNCH(group_states)(sp[i], m->pk_st[i], full[i] / ((size_t)N_LAYERS * nseq), idx, k, nseq,
                                            N_LAYERS, 0, st));
        MG_CUDA(MG_LAUNCH(group_rows)(d_u, m->pk_u, IN_DIM, m->pk_off, idx, k, len, 0, st));
        const mg_status s = FORWARD_ON(k, len, m->pk_u, m->pk_out, m->pk_st);
        if (s != MG_OK) return s;
        MG_CUDA(MG_LAUNCH(group_rows)(m->pk_out, d_out, D_MODEL, m->pk_off, idx, k, len, 1, st));
        for (int i = 0; i < N_STATES; ++i)
            MG_CUDA(MG_LAUNCH(group_states)(m->pk_st[i], sp[i], full[i] / ((size_t)N_LAYERS * nseq), idx, k, nseq,
                                            N_LAYERS, 1, st));
        a = b;
    }
    return MG_OK;
}

/* prefill_packed (from = 0) and prefill_packed_from (from = 1): the checks,
 * then the padded batch from zero states, or, with given states and from,
 * the groups of packed_groups. */
static mg_status packed_prefill(model_model *m, const char *fn, int from, int nseq, const int32_t *cu_seqlens,
                                const float *d_u, float *d_out, STATE_PARAMS)
{
    MODEL_LIVE(m, fn);
    packed_shape ps = { 0, 0, 0 };
    mg_status s = packed_check(fn, nseq, cu_seqlens, MODEL_MAX_BATCH, MODEL_MAX_SEQ_LEN, &ps);
    if (s == MG_OK) s = CHECK_STATES(fn, ps.nseq, ps.maxlen, d_u, d_out, 0);
    if (s == MG_OK) s = packed_ws(m);   /* the first packed call of this model allocates it */
    if (s != MG_OK) return s;
    float *const sp[N_STATES] = { STATE_ARGS };
    if (from && sp[0]) return packed_groups(m, &ps, cu_seqlens, d_u, d_out, sp);
    const size_t sf[N_STATES] = STATE_SIZES(ps.nseq);
    s = packed_zero_states(sp, sf, N_STATES, m->stream);
    if (s == MG_OK) s = packed_gather(&ps, cu_seqlens, m->pk_off, d_u, m->pk_u, IN_DIM, m->pk_start, m->stream);
    if (s == MG_OK) s = FORWARD_STARTS(ps.nseq, ps.maxlen, m->pk_u, m->pk_out, m->pk_start);
    if (s != MG_OK) return s;
    MG_CUDA(MG_LAUNCH(unpack_rows)(m->pk_out, d_out, D_MODEL, m->pk_off, ps.nseq, ps.maxlen, m->stream));
    return MG_OK;
}

mg_status model_prefill_packed(model_model *m, int nseq, const int32_t *cu_seqlens, const float *d_u,
                               float *d_out, STATE_PARAMS)
{
    return packed_prefill(m, MODEL_NAME "_prefill_packed", 0, nseq, cu_seqlens, d_u, d_out, STATE_ARGS);
}

mg_status model_prefill_packed_from(model_model *m, int nseq, const int32_t *cu_seqlens, const float *d_u,
                                    float *d_out, STATE_PARAMS)
{
    return packed_prefill(m, MODEL_NAME "_prefill_packed_from", 1, nseq, cu_seqlens, d_u, d_out, STATE_ARGS);
}

/* ---- Checkpoints: a safetensors file <-> the host f32 weights blob, by
 * the parameter table (model_load_safetensors / model_save_safetensors,
 * aliased in NAME.h's internal section). Host memory only. A parameter's
 * canonical name is its table name without a leading "backbone." (Mamba-1's
 * table has the prefix, Mamba-3's has not); loading with prefix NULL tries
 * the table names as they are, then the canonical names against the file's
 * names with "backbone." removed, so either form loads in either arch. ---- */
#include "mg_safetensors.h"

/* The parameter table as mg_st_load_table and mg_st_write take it. */
typedef struct model_st_table {
    const char *names[MODEL_N_PARAMS];
    const char *canon[MODEL_N_PARAMS];   /* names without "backbone." */
    long dims[MODEL_N_PARAMS][4];
    const long *shapes[MODEL_N_PARAMS];
    int ndims[MODEL_N_PARAMS];
    size_t offsets[MODEL_N_PARAMS];
    const float *data[MODEL_N_PARAMS];   /* for a save */
    int prefixed;                        /* some table name has "backbone." */
} model_st_table;

static const char model_st_backbone[] = "backbone.";

static model_st_table *model_st_table_new(const char *fn)
{
    model_st_table *t = (model_st_table *)calloc(1, sizeof *t);
    if (!t) { mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn); return NULL; }
    const size_t bl = sizeof model_st_backbone - 1;
    for (int i = 0; i < MODEL_N_PARAMS; ++i) {
        const char *nm = model_params[i].name;
        t->names[i] = nm;
        const int pre = strncmp(nm, model_st_backbone, bl) == 0;
        t->canon[i] = pre ? nm + bl : nm;
        t->prefixed |= pre;
        t->ndims[i] = model_params[i].ndim;
        for (int d = 0; d < model_params[i].ndim && d < 4; ++d) t->dims[i][d] = model_params[i].shape[d];
        t->shapes[i] = t->dims[i];
        t->offsets[i] = model_params[i].offset;
    }
    return t;
}

/* MG_OK, or the error for fn, for a blob pointer and size. */
static mg_status model_st_check_blob(const void *blob, size_t n_floats, const char *fn)
{
    if (!blob) return mg_fail(MG_ERR_INVALID_ARG, "%s: blob is NULL", fn);
    if (n_floats != (size_t)MODEL_WEIGHTS_FLOATS)
        return mg_fail(MG_ERR_SIZE, "%s: blob has %zu floats, expected %zu (" MODEL_UPPER "_WEIGHTS_FLOATS)",
                       fn, n_floats, (size_t)MODEL_WEIGHTS_FLOATS);
    return MG_OK;
}

/* Whether some tensor name of f starts with "backbone.". */
static int model_st_file_prefixed(const mg_st_file *f)
{
    const size_t n = mg_st_count(f);
    for (size_t i = 0; i < n; ++i) {
        mg_st_info info;
        if (mg_st_get(f, i, &info) == MG_OK &&
            strncmp(info.name, model_st_backbone, sizeof model_st_backbone - 1) == 0) return 1;
    }
    return 0;
}

mg_status model_load_safetensors(const char *path, const char *prefix, float *blob, size_t n_floats)
{
    static const char fn[] = MODEL_NAME "_load_safetensors";
    if (!path) return mg_fail(MG_ERR_INVALID_ARG, "%s: path is NULL", fn);
    mg_status s = model_st_check_blob(blob, n_floats, fn);
    if (s != MG_OK) return s;
    model_st_table *t = model_st_table_new(fn);
    if (!t) return MG_ERR_OUT_OF_MEMORY;
    mg_st_file *f = NULL;
    s = mg_st_open(path, &f);
    if (s == MG_OK && prefix) {
        /* the file's names that start with `prefix`, without it, are the canonical names */
        s = mg_st_load_table(f, t->canon, t->shapes, t->ndims, t->offsets, MODEL_N_PARAMS,
                             prefix, blob, n_floats);
    } else if (s == MG_OK) {
        /* the table names as they are, then the canonical ones against the
         * file's names without "backbone." (mg_st_load_table leaves the blob
         * untouched on error); when both fail, the message of the first,
         * unless the file and the table differ in the prefix */
        s = mg_st_load_table(f, t->names, t->shapes, t->ndims, t->offsets, MODEL_N_PARAMS,
                             NULL, blob, n_floats);
        if (s == MG_ERR_SIZE) {
            char first[1024];
            size_t len = strlen(mg_last_error());
            if (len >= sizeof first) len = sizeof first - 1;
            memcpy(first, mg_last_error(), len);
            first[len] = '\0';
            s = mg_st_load_table(f, t->canon, t->shapes, t->ndims, t->offsets, MODEL_N_PARAMS,
                                 model_st_backbone, blob, n_floats);
            if (s == MG_ERR_SIZE && model_st_file_prefixed(f) == t->prefixed)
                mg_fail(MG_ERR_SIZE, "%s", first);
        }
    }
    mg_st_close(f);
    if (s == MG_OK) {   /* the padding between tensors (the table is in blob order) */
        size_t end = 0;
        for (int i = 0; i < MODEL_N_PARAMS; ++i) {
            if (model_params[i].offset > end) memset(blob + end, 0, (model_params[i].offset - end) * sizeof *blob);
            if (model_params[i].offset + model_params[i].numel > end) end = model_params[i].offset + model_params[i].numel;
        }
        if (n_floats > end) memset(blob + end, 0, (n_floats - end) * sizeof *blob);
    }
    free(t);
    return s;
}

mg_status model_save_safetensors(const char *path, const float *blob, size_t n_floats, int dtype)
{
    static const char fn[] = MODEL_NAME "_save_safetensors";
    if (!path) return mg_fail(MG_ERR_INVALID_ARG, "%s: path is NULL", fn);
    mg_status s = model_st_check_blob(blob, n_floats, fn);
    if (s != MG_OK) return s;
    if (dtype != 0 && dtype != 1 && dtype != 2)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: unknown dtype %d (0 f32, 1 bf16, 2 f16)", fn, dtype);
    model_st_table *t = model_st_table_new(fn);
    if (!t) return MG_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < MODEL_N_PARAMS; ++i) t->data[i] = blob + model_params[i].offset;
    static const char meta[] = "{\"format\":\"pt\","
#ifdef MODEL_SPEC_SHA256
        "\"mamba_gen_spec_sha256\":\"" MODEL_SPEC_SHA256 "\","
#endif
        "\"mamba_gen_model\":\"" MODEL_NAME "\"}";
    const mg_st_dtype dt = dtype == 1 ? MG_ST_BF16 : dtype == 2 ? MG_ST_F16 : MG_ST_F32;
    s = mg_st_write(path, MODEL_N_PARAMS, t->names, t->shapes, t->ndims, t->data, dt, meta);
    free(t);
    return s;
}
