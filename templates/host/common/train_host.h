/* train_host.h (emitted as mg_train_host.h): the part of a library's
 * training pipeline that every arch writes the same way: the workspace
 * rounding, the trainer's life cycle (create, destroy, set_stream, the
 * workspace size), the argument checks (need_ptr, CHECK, check_adamw), the
 * GEMM-weight and activation addressing helpers, the gradient-norm and
 * loss-scaling accessors, and the training graph's object, parameter write,
 * launch and set_params. It names no model: the arch's training pipeline
 * (host/ARCH/train_pipeline.h) includes it once, after its struct
 * model_trainer (with the common fields: stream, blas, ws, w, wa, stat,
 * scaler, scaling, scan_choice, gacc, accumulate) and the prototype of its
 * carve(); the arch's
 * NAME_train.c defines model_X / MODEL_X, MODEL_NAME, LOWP, ACT_SIZE and
 * MAX_TOKENS; the struct also holds the packed-sequence fields (pk_u,
 * pk_start, pk_off, pk_nseq, pk_maxlen, fwd_packed; carved by carve()).
 * Plain C11. */

static size_t ws_bytes(size_t elems, size_t elem_size)
{
    return (elems * elem_size + 255u) & ~(size_t)255u;
}

size_t model_trainer_workspace_bytes(void)
{
    return carve(NULL, NULL);
}

/* ---- Handles: trainers and training graphs are in the runtime's
 * registry while they live (as models are: mg_model_host.h). ---- */
static const char trainer_kind_trainer = 't', trainer_kind_graph = 'g';

/* MG_OK if t is a live trainer of this library, else the error for fn. */
static mg_status trainer_live(const model_trainer *t, const char *fn)
{
    if (!t) return mg_fail(MG_ERR_INVALID_ARG, "%s: trainer is NULL", fn);
    if (!mg_handle_live(t, &trainer_kind_trainer))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %p is not a live " MODEL_NAME " trainer (destroyed, or not from "
                       MODEL_NAME "_trainer_create)", fn, (const void *)t);
    return MG_OK;
}
#define TRAINER_LIVE(t, fn) do { const mg_status live_s_ = trainer_live((t), (fn)); if (live_s_ != MG_OK) return live_s_; } while (0)

static void trainer_free(model_trainer *t)
{
    mg_dev_free(t->gacc);
    mg_dev_free(t->ws);
    mg_blas_destroy(t->blas);
    free(t);
}

mg_status model_trainer_create(model_trainer **out, cudaStream_t stream)
{
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_trainer_create: trainer pointer is NULL");
    *out = NULL;
    if (mg_device_count() == 0)
        return mg_fail(MG_ERR_NO_DEVICE, MODEL_NAME "_trainer_create: no CUDA device");
    model_trainer *t = (model_trainer *)calloc(1, sizeof *t);
    if (!t) return mg_fail(MG_ERR_OUT_OF_MEMORY, MODEL_NAME "_trainer_create: out of host memory");
    t->stream = stream;
    t->scan_choice = MODEL_SCAN_SPEC;
    mg_status s = mg_blas_create(&t->blas, stream);
    if (s != MG_OK) { free(t); return s; }
    if (GEMM_TF32 && (s = mg_blas_set_tf32(t->blas, 1)) != MG_OK) { mg_blas_destroy(t->blas); free(t); return s; }
    const size_t total = carve(t, NULL);
    s = mg_dev_alloc(&t->ws, total, MODEL_NAME " training workspace");
    if (s != MG_OK) { mg_blas_destroy(t->blas); free(t); return s; }
    carve(t, (char *)t->ws);
    /* The statistics read by adamw before any norm was computed: zero. */
    cudaError_t ce = cudaMemsetAsync(t->stat, 0, 2 * sizeof(float), stream);
    if (ce == cudaSuccess) {
        const float s0 = MODEL_LOSS_SCALE_INIT;
        t->scaling = s0 > 0.0f;
        ce = model_launch_scaler_init(t->scaler, t->scaling ? s0 : 1.0f, MODEL_LOSS_SCALE_GROWTH, stream);
    }
    if (ce != cudaSuccess) {
        s = mg_cuda_check(ce, MODEL_NAME "_trainer_create: initialising the statistics");
        trainer_free(t);
        return s;
    }
    static _Atomic unsigned long long next_serial = 1;
    t->serial = next_serial++;
    if ((s = mg_handle_add(t, &trainer_kind_trainer)) != MG_OK) { trainer_free(t); return s; }
    *out = t;
    return MG_OK;
}

void model_trainer_destroy(model_trainer *t)
{
    if (!t || !mg_handle_live(t, &trainer_kind_trainer)) return;   /* NULL, or already destroyed */
    mg_handle_remove(t);
    trainer_free(t);
}

mg_status model_trainer_set_stream(model_trainer *t, cudaStream_t stream)
{
    TRAINER_LIVE(t, MODEL_NAME "_trainer_set_stream");
    mg_status s = mg_blas_set_stream(t->blas, stream);
    if (s != MG_OK) return s;
    t->stream = stream;
    return MG_OK;
}

const float *model_trainer_grad_norm(const model_trainer *t)
{
    return mg_handle_live(t, &trainer_kind_trainer) ? t->stat : NULL;
}

const float *model_trainer_loss_scale(const model_trainer *t)
{
    return mg_handle_live(t, &trainer_kind_trainer) ? t->scaler : NULL;
}

mg_status model_trainer_set_loss_scaling(model_trainer *t, float init_scale, int growth_interval)
{
    static const char fn[] = MODEL_NAME "_trainer_set_loss_scaling";
    TRAINER_LIVE(t, fn);
    int ex = 0;
    /* A power of two has mantissa exactly 0.5 in frexp's [0.5, 1) form. */
    if (init_scale != 0.0f &&
        !(init_scale >= 1.0f && init_scale <= 16777216.0f && frexpf(init_scale, &ex) == 0.5f))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: init_scale = %g (need 0 = off, or a power of two in [1, 2^24])",
                       fn, (double)init_scale);
    if (growth_interval < 1)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: growth_interval = %d (need >= 1)", fn, growth_interval);
    MG_CUDA(model_launch_scaler_init(t->scaler, init_scale > 0.0f ? init_scale : 1.0f, growth_interval, t->stream));
    t->scaling = init_scale > 0.0f;
    return MG_OK;
}

mg_status model_trainer_set_grad_accumulate(model_trainer *t, int on)
{
    static const char fn[] = MODEL_NAME "_trainer_set_grad_accumulate";
    TRAINER_LIVE(t, fn);
    if (on != 0 && on != 1) return mg_fail(MG_ERR_INVALID_ARG, "%s: on = %d (0 overwrite, 1 accumulate)", fn, on);
    /* the scratch blob the backward writes before adding it: once, here,
     * never on a backward */
    if (on && !t->gacc) {
        const mg_status s = mg_dev_alloc((void **)&t->gacc, (size_t)WEIGHTS_FLOATS * sizeof(float),
                                         MODEL_NAME " gradient accumulation blob");
        if (s != MG_OK) return s;
    }
    t->accumulate = on;
    return MG_OK;
}

/* ---- argument checks ---- */
static mg_status need_ptr(const char *fn, const void *p, const char *what, int required)
{
    if (!p) {
        if (required) return mg_fail(MG_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
        return MG_OK;
    }
    if (!mg_aligned(p, 16)) return mg_fail(MG_ERR_ALIGNMENT, "%s: %s %p is not 16-byte aligned", fn, what, p);
    return MG_OK;
}

#define CHECK(x) do { mg_status s_ = (x); if (s_ != MG_OK) return s_; } while (0)

/* The four blobs of an AdamW step (weights, gradients, m, v; WEIGHTS_FLOATS
 * each) must not overlap: the step reads the gradients while it writes the
 * others, and m and v are updated from their own old values. NULLs are
 * need_ptr's business. */
static mg_status blobs_disjoint(const char *fn, const void *w, const void *g, const void *m, const void *v)
{
    const void *const ptr[4] = { w, g, m, v };
    static const char *const name[4] = { "weights", "grads", "m", "v" };
    const uintptr_t n = (uintptr_t)WEIGHTS_FLOATS * sizeof(float);
    for (int i = 0; i < 4; ++i)
        for (int j = i + 1; j < 4; ++j) {
            const uintptr_t a = (uintptr_t)ptr[i], b = (uintptr_t)ptr[j];
            if (a && b && a < b + n && b < a + n)
                return mg_fail(MG_ERR_INVALID_ARG, "%s: %s (%p) and %s (%p) overlap (each blob is %zu bytes)", fn,
                               name[i], ptr[i], name[j], ptr[j], (size_t)n);
        }
    return MG_OK;
}

/* Activation buffers of layer l. */
static char *act_l(char *base, int l, size_t per_token)
{
    return base + (size_t)l * MAX_TOKENS * per_token * ACT_SIZE;
}

static const void *gemm_w(const model_trainer *t)
{
#if LOWP
    return t->wa;
#else
    return t->w;
#endif
}

/* Element offset in the GEMM weights (same offsets in both dtypes). */
static const void *wptr(const void *base, size_t off)
{
    return (const char *)base + off * ACT_SIZE;
}

static int finite_f(float x) { return x == x && x - x == 0.0f; }

static mg_status check_adamw(const char *fn, const model_adamw_params *p)
{
    if (!p) return mg_fail(MG_ERR_INVALID_ARG, "%s: params is NULL", fn);
    if (!finite_f(p->lr) || p->lr < 0.0f)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: lr = %g (need a finite value >= 0)", fn, (double)p->lr);
    if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f) || !(p->beta2 >= 0.0f && p->beta2 < 1.0f))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: beta1 = %g, beta2 = %g (need [0, 1))", fn,
                       (double)p->beta1, (double)p->beta2);
    if (!finite_f(p->eps) || p->eps <= 0.0f)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: eps = %g (need a finite value > 0)", fn, (double)p->eps);
    if (!finite_f(p->weight_decay) || p->weight_decay < 0.0f)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: weight_decay = %g (need a finite value >= 0)", fn,
                       (double)p->weight_decay);
    if (p->max_grad_norm != p->max_grad_norm)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: max_grad_norm is NaN", fn);
    if (p->step < 1) return mg_fail(MG_ERR_INVALID_ARG, "%s: step = %d (1-based, need >= 1)", fn, p->step);
    if (p->wd_matrices_only != 0 && p->wd_matrices_only != 1)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: wd_matrices_only = %d (0 or 1)", fn, p->wd_matrices_only);
    return MG_OK;
}

/* ---- CUDA Graph of the training step ---- */
struct model_train_graph {
    model_trainer *t;
    unsigned long long serial;   /* t->serial at capture */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *dmem;                      /* device: next, cur, coef */
    model_adamw_params *next;   /* hyperparameters of the next replay (its step count) */
    model_adamw_params *cur;    /* those of the replay in flight */
    float *coef;                     /* derived factors of the replay in flight */
};

/* MG_OK if g is a live training graph whose trainer is the one it was
 * captured on and still lives, else the error for fn. */
static mg_status train_graph_live(const model_train_graph *g, const char *fn)
{
    if (!g) return mg_fail(MG_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    if (!mg_handle_live(g, &trainer_kind_graph) || !g->exec)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %p is not a live training graph (destroyed, or not from "
                       MODEL_NAME "_train_graph_create)", fn, (const void *)g);
    if (!mg_handle_live(g->t, &trainer_kind_trainer) || g->t->serial != g->serial)
        return mg_fail(MG_ERR_STATE, "%s: the graph's trainer was destroyed (destroy the graph first)", fn);
    return MG_OK;
}

void model_train_graph_destroy(model_train_graph *g)
{
    if (!g || !mg_handle_live(g, &trainer_kind_graph)) return;   /* NULL, or already destroyed */
    mg_handle_remove(g);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    mg_dev_free(g->dmem);
    free(g);
}

/* Write p to the graph's device hyperparameters, on the trainer's stream
 * (a one-thread kernel with p by value: ordered, no host buffer to keep). */
static mg_status graph_write_params(model_train_graph *g, const model_adamw_params *p)
{
    /* prep with next = NULL stores p at its `cur` argument: here g->next */
    MG_CUDA(model_launch_adamw_prep(p, NULL, g->next, g->coef, g->t->stream));
    return MG_OK;
}

mg_status model_train_graph_launch(model_train_graph *g)
{
    CHECK(train_graph_live(g, MODEL_NAME "_train_graph_launch"));
    MG_CUDA(cudaGraphLaunch(g->exec, g->t->stream));
    return MG_OK;
}

mg_status model_train_graph_set_params(model_train_graph *g, const model_adamw_params *p)
{
    static const char fn[] = MODEL_NAME "_train_graph_set_params";
    CHECK(train_graph_live(g, fn));
    CHECK(check_adamw(fn, p));
    return graph_write_params(g, p);
}

/* ---- Packed sequences in training (cu_seqlens; doc/math.md §9,
 * mg_packed_host.h). forward_train_packed runs forward_train on the padded
 * batch [nseq][maxlen] with the start mask of the packing (the trainer's
 * own buffers: pk_u, pk_start, pk_off; the padded output in outbuf) and
 * remembers the packing; the backward that follows gathers dout into the
 * padded layout (zeros at the pads, in the trainer's dout buffer) and
 * scatters du back. Any other forward_train forgets it.
 * forward_train_packed_from (sequences from given states) lays each
 * sequence left-aligned instead (its state at t = 0, zeros after it), no
 * start mask, on copies of the states in pk_st (fwd_packed = 2). ---- */
#include "mg_packed_host.h"

/* Before the forward (arguments checked). from = 0: the caller's n states
 * zeroed, u and the start mask gathered into the right-aligned rows. from
 * = 1 (given states): the offsets uploaded, u gathered left-aligned (zeros
 * after each sequence), the caller's states copied into the trainer's own
 * rows pk_st (the forward overwrites its states; the caller's stay). */
static mg_status trainer_packed_pre(model_trainer *t, const packed_shape *ps, const int32_t *cu, const float *u,
                                    float *const *sp, const size_t *sf, int n, int from)
{
    t->have_fwd = 0;
    t->fwd_packed = 0;
    if (!from) {
        CHECK(packed_zero_states(sp, sf, n, t->stream));
        return packed_gather(ps, cu, t->pk_off, u, t->pk_u, IN_DIM, t->pk_start, t->stream);
    }
    MG_CUDA(cudaMemcpyAsync(t->pk_off, cu, (size_t)(ps->nseq + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                            t->stream));
    MG_CUDA(MG_LAUNCH(group_rows)(u, t->pk_u, IN_DIM, t->pk_off, NULL, ps->nseq, ps->maxlen, 0, t->stream));
    for (int i = 0; i < n; ++i)
        MG_CUDA(cudaMemcpyAsync(t->pk_st[i], sp[i], sf[i] * sizeof(float), cudaMemcpyDeviceToDevice, t->stream));
    return MG_OK;
}

/* After it: the real tokens' outputs scattered into out (from the rows
 * trainer_packed_pre laid out), the packing kept: fwd_packed = 1, or 2
 * from given states, whose backward may give initial-state gradients. */
static mg_status trainer_packed_post(model_trainer *t, const packed_shape *ps, float *out, int from)
{
    if (from)
        MG_CUDA(MG_LAUNCH(group_rows)(t->outbuf, out, D_MODEL, t->pk_off, NULL, ps->nseq, ps->maxlen, 1, t->stream));
    else
        MG_CUDA(MG_LAUNCH(unpack_rows)(t->outbuf, out, D_MODEL, t->pk_off, ps->nseq, ps->maxlen, t->stream));
    t->pk_nseq = ps->nseq;
    t->pk_maxlen = ps->maxlen;
    t->fwd_packed = from ? 2 : 1;
    return MG_OK;
}

/* The backward of a packed forward: dout [total][D_MODEL] into the padded
 * t->dout (pads 0); the caller runs the backward on it with du (if wanted)
 * into pk_u, then trainer_packed_du scatters it. */
static mg_status trainer_packed_dout(model_trainer *t, const float *dout)
{
    if (t->fwd_packed == 2)
        MG_CUDA(MG_LAUNCH(group_rows)(dout, t->dout, D_MODEL, t->pk_off, NULL, t->pk_nseq, t->pk_maxlen, 0, t->stream));
    else
        MG_CUDA(MG_LAUNCH(pack_rows)(dout, t->dout, D_MODEL, t->pk_off, t->pk_nseq, t->pk_maxlen, NULL, t->stream));
    return MG_OK;
}

static mg_status trainer_packed_du(model_trainer *t, float *du)
{
    if (t->fwd_packed == 2)
        MG_CUDA(MG_LAUNCH(group_rows)(t->pk_u, du, IN_DIM, t->pk_off, NULL, t->pk_nseq, t->pk_maxlen, 1, t->stream));
    else
        MG_CUDA(MG_LAUNCH(unpack_rows)(t->pk_u, du, IN_DIM, t->pk_off, t->pk_nseq, t->pk_maxlen, t->stream));
    return MG_OK;
}
