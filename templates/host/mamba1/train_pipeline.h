/* train_pipeline.h (emitted as mg_m1_train_pipeline.h): the host pipeline
 * of the Mamba-1 training path, the body of NAME_train.c up to the training
 * graph: the trainer and its workspace, forward_train, backward, the AdamW
 * step and the MSE training step. It names no model: NAME_train.c defines,
 * before including it once, this model's constants (dimensions, blob
 * offsets, workspace sizes) and the names the pipeline uses (model_X is
 * NAME_X, MODEL_X is NAME_X in capitals, MODEL_NAME "NAME" for messages, and
 * the spec values quoted in messages). Plain C11; what the pipeline does is
 * described at the top of NAME_train.c.
 * What both archs' trainers do the same way (life cycle, argument checks,
 * loss-scaling accessors, the training graph's object) is mg_train_host.h,
 * included below. */

struct model_trainer {
    cudaStream_t stream;
    unsigned long long serial;   /* unique per trainer of the process (training graphs check it) */
    mg_blas *blas;
    model_model *model;   /* attached model (low-precision copy refresh), or NULL */
    void *ws;
    /* state of the last forward_train */
    int have_fwd, batch, seqlen;
    const float *w;
    const unsigned char *fwd_start;   /* its start mask (device [batch][seqlen], or NULL): the backward's */
    const unsigned char *start;       /* the mask of the next forward_train (set_starts), or NULL */
    /* saved activations */
    float *h;      /* [L+1][MAX_TOKENS][D] residual stream at each layer input; [L] = norm_f input */
    float *rstd;   /* [L+1][MAX_TOKENS] */
    float *ckpt;   /* [L][MAX_BATCH*MAX_CKPTS*E*N] */
    float *cs0;    /* [L][MAX_BATCH*E*(K-1)] */
    float *u;      /* [MAX_TOKENS][IN_DIM] (input_dim > 0) */
    char *hn, *xz, *xc, *dbl, *dt, *y;   /* act, [L][MAX_TOKENS][...] */
    /* scratch */
    char *g;       /* act [MAX_TOKENS][E]: out_proj input (forward and backward) */
    char *dh_act;  /* act [MAX_TOKENS][D] (LOWP only) */
    char *ddt, *ddbl, *dxz;   /* act */
    char *wa;      /* act [WEIGHTS_FLOATS] GEMM weights (LOWP only) */
    float *dh, *dhn, *dg, *dy, *dxc;
    float *part_bc, *part_A, *part_D, *part_dtb, *part_cw, *part_cb, *part_rows;
    float *span_p, *span_ds;       /* chunked scan backward: per span products / adjoints (or NULL) */
    float *cstate, *dsum;          /* chunked training forward: chunk states, sums of delta (or NULL) */
    int scan_choice;               /* MODEL_SCAN_SPEC | _SEQUENTIAL | _CHUNKED (the scan's walk) */
    float *gacc;                   /* gradient accumulation: the backward's scratch blob (NULL until turned on) */
    int accumulate;                /* the backward adds its parameter gradients to grads */
    int sms;                       /* multiprocessors of the device (0: not asked yet) */
    float *outbuf, *dout, *stat, *loss;
    double *gpart;
    float *scaler;                 /* loss scaling state (device, see launch_scaler_init) */
    int scaling;                   /* backward applies the loss scale */
    int hold_scale;                /* backward leaves the scale as it is (graph warm-up) */
    model_adamw_params *hp;   /* the hyperparameters of the last eager AdamW step (device) */
    float *coef;                   /* its derived factors: decay, step size, sqrt(bc2) (device) */
    /* packed sequences (forward_train_packed; mg_train_host.h) */
    float *pk_u;                   /* [MAX_TOKENS][IN_DIM] padded u, then padded du */
    unsigned char *pk_start;       /* [MAX_TOKENS] the packing's start mask */
    int *pk_off;                   /* [MAX_BATCH + 1] cu_seqlens on the device */
    int pk_nseq, pk_maxlen;        /* the packing of the last forward */
    int fwd_packed;                /* the last forward_train was packed: 1 from zero states, 2 from given ones */
    float *pk_st[2];               /* MAX_BATCH rows of each state (forward_train_packed_from's copies) */
};

/* Sizes (p == NULL) or carves (p != NULL) the workspace; below. */
static size_t carve(model_trainer *t, char *p);
#include "mg_train_host.h"

/* Carve the workspace (p != NULL) or size it (p == NULL). */
static size_t carve(model_trainer *t, char *p)
{
    size_t off = 0;
#define TAKE(field, type, elems, esize) do { size_t b_ = ws_bytes((elems), (esize)); \
        if (p) { t->field = (type)(void *)(p + off); } \
        off += b_; } while (0)
    const size_t L = N_LAYERS, MT = MAX_TOKENS, E = D_INNER, MB = MAX_BATCH;
    TAKE(h, float *, (L + 1) * MT * D_MODEL, 4);
    TAKE(rstd, float *, (L + 1) * MT, 4);
    TAKE(ckpt, float *, L * MB * MAX_CKPTS * E * D_STATE, 4);
    TAKE(cs0, float *, L * MB * CS_PER_SEQ, 4);
    TAKE(u, float *, HAS_INPUT_PROJ ? MT * IN_DIM : 1, 4);
    TAKE(pk_u, float *, MT * IN_DIM, 4);
    TAKE(pk_start, unsigned char *, MT, 1);
    TAKE(pk_off, int *, MB + 1, 4);
    TAKE(pk_st[0], float *, L * MB * CS_PER_SEQ, 4);
    TAKE(pk_st[1], float *, L * MB * SS_PER_SEQ, 4);
    TAKE(hn, char *, L * MT * D_MODEL, ACT_SIZE);
    TAKE(xz, char *, L * MT * XZ_DIM, ACT_SIZE);
    TAKE(xc, char *, L * MT * E, ACT_SIZE);
    TAKE(dbl, char *, L * MT * XP_DIM, ACT_SIZE);
    TAKE(dt, char *, L * MT * E, ACT_SIZE);
    TAKE(y, char *, L * MT * E, ACT_SIZE);
    TAKE(g, char *, MT * E, ACT_SIZE);
    TAKE(dh_act, char *, LOWP ? MT * D_MODEL : 1, ACT_SIZE);
    TAKE(ddt, char *, MT * E, ACT_SIZE);
    TAKE(ddbl, char *, MT * XP_DIM, ACT_SIZE);
    TAKE(dxz, char *, MT * XZ_DIM, ACT_SIZE);
    TAKE(wa, char *, LOWP ? WEIGHTS_FLOATS : 1, ACT_SIZE);
    TAKE(dh, float *, MT * D_MODEL, 4);
    TAKE(dhn, float *, MT * D_MODEL, 4);
    TAKE(dg, float *, MT * E, 4);
    TAKE(dy, float *, MT * E, 4);
    TAKE(dxc, float *, MT * E, 4);
    TAKE(part_bc, float *, BSCAN_BLOCKS * MT * 2 * D_STATE, 4);
    /* scan-backward partials per (sequence, span): BSCAN_PARTS spans at most */
    TAKE(part_A, float *, MB * BSCAN_PARTS * E * D_STATE, 4);
    TAKE(part_D, float *, MB * BSCAN_PARTS * E, 4);
    TAKE(part_dtb, float *, MB * BSCAN_PARTS * E, 4);
#if HAS_CHUNKED_BWD
    TAKE(span_p, float *, (size_t)BSCAN_SPAN_FLOATS, 4);    /* [MB][max spans][E][N] */
    TAKE(span_ds, float *, (size_t)BSCAN_SPAN_FLOATS, 4);
    TAKE(cstate, float *, CSTATE_FLOATS, 4);   /* chunked training forward: [MB][max chunks][E][N] */
    TAKE(dsum, float *, DSUM_FLOATS, 4);
#endif
    /* conv-backward partials per (sequence, time tile) */
    TAKE(part_cw, float *, CONV_PARTS * E * D_CONV, 4);
    TAKE(part_cb, float *, CONV_PARTS * E, 4);
    TAKE(part_rows, float *, NORMB_MAX_BLOCKS * D_MODEL, 4);
    TAKE(outbuf, float *, MT * D_MODEL, 4);
    TAKE(dout, float *, MT * D_MODEL, 4);
    TAKE(stat, float *, 2, 4);
    TAKE(loss, float *, 1, 4);
    TAKE(gpart, double *, GNORM_BLOCKS, 8);
    TAKE(scaler, float *, 4, 4);
    TAKE(hp, model_adamw_params *, 1, sizeof(model_adamw_params));
    TAKE(coef, float *, 4, 4);
#undef TAKE
    return off;
}

mg_status model_trainer_set_starts(model_trainer *t, const unsigned char *d_start)
{
    static const char fn[] = MODEL_NAME "_trainer_set_starts";
    TRAINER_LIVE(t, fn);
    if (d_start) CHECK(mg_dev_readable(d_start, fn, "start"));
    t->start = d_start;
    return MG_OK;
}

mg_status model_trainer_set_scan(model_trainer *t, int choice)
{
    static const char fn[] = MODEL_NAME "_trainer_set_scan";
    TRAINER_LIVE(t, fn);
    if (choice != MODEL_SCAN_SPEC && choice != MODEL_SCAN_SEQUENTIAL && choice != MODEL_SCAN_CHUNKED)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: unknown choice %d (0 spec, 1 sequential, 2 chunked)", fn, choice);
    if (choice == MODEL_SCAN_CHUNKED && !HAS_CHUNKED_BWD)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: this library has no chunked scan backward "
                       "(spec scan.mode \"" SCAN_MODE_NAME "\", max_seq_len " MAX_SEQ_LEN_STR "; auto emits it from seqlen " BSCAN_AUTO_MIN_LEN_STR ")", fn);
    t->scan_choice = choice;
    return MG_OK;
}

/* Spans of the scan of a call of batch x seqlen steps: 1 = the sequential
 * walk (forward and backward); more = the chunked training forward and the
 * chunk-parallel backward, with spans (= chunks) of BSCAN_SPAN steps. auto:
 * from BSCAN_AUTO_MIN_LEN steps when the sequential walk would run fewer
 * than SCAN_AUTO_BLOCKS_PER_SM blocks per SM (the inference rule). */
static int bwd_spans(model_trainer *t, int batch, int seqlen)
{
#if HAS_CHUNKED_BWD
    int chunked;
    if (t->scan_choice == MODEL_SCAN_SEQUENTIAL) chunked = 0;
    else if (t->scan_choice == MODEL_SCAN_CHUNKED) chunked = 1;
    else {
#if BSCAN_MODE_ID == 1
        (void)batch;
        chunked = seqlen > BSCAN_SPAN;   /* one span: the sequential walk computes the same */
#else
        if (!t->sms) t->sms = mg_device_sms();
        chunked = seqlen >= BSCAN_AUTO_MIN_LEN &&
                  (long)batch * (long)SCAN_AUTO_SEQ_BLOCKS < (long)SCAN_AUTO_BLOCKS_PER_SM * t->sms;
#endif
    }
    return chunked ? (seqlen + BSCAN_SPAN - 1) / BSCAN_SPAN : 1;
#else
    (void)t;
    (void)batch;
    (void)seqlen;
    return 1;
#endif
}

mg_status model_trainer_attach_model(model_trainer *t, model_model *m)
{
    TRAINER_LIVE(t, MODEL_NAME "_trainer_attach_model");
    t->model = m;
    return MG_OK;
}


/* Checks of a forward-for-training call shared by forward_train, the MSE
 * step and the training graph. */
static mg_status check_forward(const char *fn, const float *w, int batch, int seqlen, const float *u,
                               const float *cs, const float *ss)
{
    if (batch < 1 || batch > MAX_BATCH)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch = %d is out of range 1..%d", fn, batch, MAX_BATCH);
    if (seqlen < 1 || seqlen > MAX_SEQ_LEN)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: seqlen = %d is out of range 1..%d", fn, seqlen, MAX_SEQ_LEN);
    CHECK(need_ptr(fn, w, "weights", 1));
    CHECK(need_ptr(fn, u, "u", 1));
    if ((cs == NULL) != (ss == NULL))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: conv_state and ssm_state must both be given or both be NULL", fn);
    CHECK(need_ptr(fn, cs, "conv_state", 0));
    CHECK(need_ptr(fn, ss, "ssm_state", 0));
    return MG_OK;
}

static mg_status forward_train(model_trainer *t, const float *w, int batch, int seqlen,
                               const float *u, float *out, float *cs, float *ss)
{
    const int tokens = batch * seqlen;
    const cudaStream_t st = t->stream;
    const size_t E = D_INNER;
    t->have_fwd = 0;
    t->fwd_packed = 0;
    t->w = w;
    t->batch = batch;
    t->seqlen = seqlen;
    const unsigned char *start = t->start;   /* episode starts (NULL: the maskless kernels) */
    t->fwd_start = start;
#if LOWP
    MG_CUDA(model_launch_convert_train(w, t->wa, st));
#endif
    const void *wa = gemm_w(t);
    const int chunked = bwd_spans(t, batch, seqlen) > 1;   /* the scan parallel over chunks */

#if HAS_INPUT_PROJ
    MG_CUDA(cudaMemcpyAsync(t->u, u, (size_t)tokens * IN_DIM * sizeof(float), cudaMemcpyDeviceToDevice, st));
    MG_CUDA(model_launch_bias_rows_train(t->h, w + OFF_INPUT_PROJ_B, tokens, st));
    CHECK(mg_linear(t->blas, tokens, D_MODEL, IN_DIM, MG_F32, u, IN_DIM, w + OFF_INPUT_PROJ_W, IN_DIM,
                    MG_F32, t->h, D_MODEL, 1.0f, 1.0f));
#else
    MG_CUDA(cudaMemcpyAsync(t->h, u, (size_t)tokens * D_MODEL * sizeof(float), cudaMemcpyDeviceToDevice, st));
#endif
    for (int l = 0; l < N_LAYERS; ++l) {
        const float *lw = w + (size_t)l * LAYER_STRIDE;
        const void *law = wptr(wa, (size_t)l * LAYER_STRIDE);
        float *h_l = t->h + (size_t)l * MAX_TOKENS * D_MODEL;
        float *h_n = h_l + MAX_TOKENS * D_MODEL;
        float *rstd_l = t->rstd + (size_t)l * MAX_TOKENS;
        char *hn = act_l(t->hn, l, D_MODEL), *xz = act_l(t->xz, l, XZ_DIM), *xc = act_l(t->xc, l, E);
        char *dbl = act_l(t->dbl, l, XP_DIM), *dt = act_l(t->dt, l, E), *y = act_l(t->y, l, E);
        float *ckpt = t->ckpt + (size_t)l * MAX_BATCH * MAX_CKPTS * E * D_STATE;
        float *cs0 = t->cs0 + (size_t)l * MAX_BATCH * CS_PER_SEQ;
        float *cs_l = cs ? cs + (size_t)l * batch * CS_PER_SEQ : NULL;
        float *ss_l = ss ? ss + (size_t)l * batch * SS_PER_SEQ : NULL;

        /* hn = rmsnorm(h_l), and h_n = h_l (the next residual stream, which
         * the out_proj GEMM below accumulates into) in the same pass */
        MG_CUDA(model_launch_rmsnorm_fwd(h_l, lw + L0_NORM_W, hn, 0, rstd_l, h_n, tokens, st));
        CHECK(mg_linear(t->blas, tokens, XZ_DIM, D_MODEL, ACT, hn, D_MODEL, wptr(law, L0_IN_PROJ_W), D_MODEL,
                        ACT, xz, XZ_DIM, 1.0f, 0.0f));
        /* xc = conv(x); the conv state in place, its initial window saved to
         * cs0 (zeros for a fresh start) for the backward */
        MG_CUDA(model_launch_conv_fwd(batch, seqlen, xz, lw + L0_CONV_W, lw + L0_CONV_B, cs_l, cs0, xc, start, st));
        CHECK(mg_linear(t->blas, tokens, XP_DIM, D_INNER, ACT, xc, D_INNER, wptr(law, L0_X_PROJ_W), D_INNER,
                        ACT, dbl, XP_DIM, 1.0f, 0.0f));
        CHECK(mg_linear(t->blas, tokens, D_INNER, DT_RANK, ACT, dbl, XP_DIM, wptr(law, L0_DT_PROJ_W), DT_RANK,
                        ACT, dt, D_INNER, 1.0f, 0.0f));
        MG_CUDA(model_launch_scan_fwd(batch, seqlen, chunked, xc, dt, dbl, xz, lw + L0_DT_PROJ_B, lw + L0_A_LOG,
                                       lw + L0_D, ss_l, ss_l, t->cstate, t->dsum, ckpt, y, t->g, start, st));
        CHECK(mg_linear(t->blas, tokens, D_MODEL, D_INNER, ACT, t->g, D_INNER, wptr(law, L0_OUT_PROJ_W), D_INNER,
                        MG_F32, h_n, D_MODEL, 1.0f, 1.0f));
    }
    MG_CUDA(model_launch_rmsnorm_fwd(t->h + (size_t)N_LAYERS * MAX_TOKENS * D_MODEL, w + OFF_NORM_F_W, out, 1,
                                      t->rstd + (size_t)N_LAYERS * MAX_TOKENS, NULL, tokens, st));
    t->have_fwd = 1;
    return MG_OK;
}

mg_status model_forward_train(model_trainer *t, const float *d_weights, int batch, int seqlen,
                            const float *d_u, float *d_out, float *d_conv_state, float *d_ssm_state)
{
    static const char fn[] = MODEL_NAME "_forward_train";
    TRAINER_LIVE(t, fn);
    CHECK(check_forward(fn, d_weights, batch, seqlen, d_u, d_conv_state, d_ssm_state));
    CHECK(need_ptr(fn, d_out, "out", 1));
    return forward_train(t, d_weights, batch, seqlen, d_u, d_out, d_conv_state, d_ssm_state);
}

/* Packed sequences (mg_train_host.h). from = 0: the right-aligned padded
 * batch's forward with the packing's start mask in place of the trainer's
 * own (set_starts' mask is kept for the next plain forward), on the
 * caller's states zeroed. from = 1 with states (forward_train_packed_from):
 * left-aligned rows, no start mask at all, on the trainer's copies of the
 * states; without states it is from = 0. */
static mg_status forward_packed(model_trainer *t, const char *fn, int from, const float *d_weights, int nseq,
                                const int32_t *cu_seqlens, const float *d_u, float *d_out, float *d_conv_state,
                                float *d_ssm_state)
{
    TRAINER_LIVE(t, fn);
    packed_shape ps = { 0, 0, 0 };
    CHECK(packed_check(fn, nseq, cu_seqlens, MAX_BATCH, MAX_SEQ_LEN, &ps));
    CHECK(check_forward(fn, d_weights, ps.nseq, ps.maxlen, d_u, d_conv_state, d_ssm_state));
    CHECK(need_ptr(fn, d_out, "out", 1));
    from = from && d_conv_state;   /* no states: zeros in */
    float *const sp[2] = { d_conv_state, d_ssm_state };
    const size_t sf[2] = { (size_t)N_LAYERS * ps.nseq * CS_PER_SEQ, (size_t)N_LAYERS * ps.nseq * SS_PER_SEQ };
    CHECK(trainer_packed_pre(t, &ps, cu_seqlens, d_u, sp, sf, 2, from));
    float *const *fs = from ? t->pk_st : sp;   /* the states the forward runs on */
    const unsigned char *const own = t->start;
    t->start = from ? NULL : t->pk_start;
    const mg_status s = forward_train(t, d_weights, ps.nseq, ps.maxlen, t->pk_u, t->outbuf, fs[0], fs[1]);
    t->start = own;
    CHECK(s);
    return trainer_packed_post(t, &ps, d_out, from);
}

mg_status model_forward_train_packed(model_trainer *t, const float *d_weights, int nseq, const int32_t *cu_seqlens,
                                     const float *d_u, float *d_out, float *d_conv_state, float *d_ssm_state)
{
    return forward_packed(t, MODEL_NAME "_forward_train_packed", 0, d_weights, nseq, cu_seqlens, d_u, d_out,
                          d_conv_state, d_ssm_state);
}

mg_status model_forward_train_packed_from(model_trainer *t, const float *d_weights, int nseq,
                                          const int32_t *cu_seqlens, const float *d_u, float *d_out,
                                          float *d_conv_state, float *d_ssm_state)
{
    return forward_packed(t, MODEL_NAME "_forward_train_packed_from", 1, d_weights, nseq, cu_seqlens, d_u, d_out,
                          d_conv_state, d_ssm_state);
}

static mg_status backward(model_trainer *t, const float *dout, float *gr, float *du, float *dcs, float *dss)
{
    const int batch = t->batch, seqlen = t->seqlen, tokens = batch * seqlen;
    const int nrb = (tokens + NORMB_ROWS - 1) / NORMB_ROWS;   /* row blocks of the norm partials */
    const int nsp = bwd_spans(t, batch, seqlen);   /* spans of the scan backward (1: sequential) */
    const int nparts = batch * nsp;         /* scan-backward partials per parameter */
    const cudaStream_t st = t->stream;
    const float *w = t->w;
    const void *wa = gemm_w(t);
    const size_t E = D_INNER;
    const unsigned char *start = t->fwd_start;   /* the forward's episode starts (NULL: none) */
#if LOWP
    void *dhA = t->dh_act;   /* act copy of dh for the out_proj GEMMs */
#else
    void *dhA = t->dh;
#endif
    void *dhA_out = LOWP ? dhA : NULL;

    /* Gradient accumulation: the tensors below go to the trainer's scratch
     * blob, added to the caller's at the end (after the unscale). */
    float *const grads = gr;
    if (t->accumulate) gr = t->gacc;
    /* Overwrite semantics: every tensor is written below; the padding is 0. */
    MG_CUDA(cudaMemsetAsync(gr, 0, WEIGHTS_FLOATS * sizeof(float), st));

    /* out = rmsnorm(h_L) * norm_f.weight */
    MG_CUDA(model_launch_rmsnorm_bwd(tokens, t->h + (size_t)N_LAYERS * MAX_TOKENS * D_MODEL, w + OFF_NORM_F_W,
                                      t->rstd + (size_t)N_LAYERS * MAX_TOKENS, dout, t->scaling ? t->scaler : NULL,
                                      0, t->dh, dhA_out,
                                      t->part_rows, st));
    MG_CUDA(model_launch_reduce_parts(t->part_rows, nrb, D_MODEL, D_MODEL, gr + OFF_NORM_F_W, st));

    for (int l = N_LAYERS - 1; l >= 0; --l) {
        const float *lw = w + (size_t)l * LAYER_STRIDE;
        float *gl = gr + (size_t)l * LAYER_STRIDE;
        const void *law = wptr(wa, (size_t)l * LAYER_STRIDE);
        const float *h_l = t->h + (size_t)l * MAX_TOKENS * D_MODEL;
        const float *rstd_l = t->rstd + (size_t)l * MAX_TOKENS;
        char *hn = act_l(t->hn, l, D_MODEL), *xz = act_l(t->xz, l, XZ_DIM), *xc = act_l(t->xc, l, E);
        char *dbl = act_l(t->dbl, l, XP_DIM), *dt = act_l(t->dt, l, E), *y = act_l(t->y, l, E);
        const float *ckpt = t->ckpt + (size_t)l * MAX_BATCH * MAX_CKPTS * E * D_STATE;
        const float *cs0 = t->cs0 + (size_t)l * MAX_BATCH * CS_PER_SEQ;
        float *dcs_l = dcs ? dcs + (size_t)l * batch * CS_PER_SEQ : NULL;
        float *dss_l = dss ? dss + (size_t)l * batch * SS_PER_SEQ : NULL;

        /* out_proj and the gate */
        CHECK(mg_linear_dx(t->blas, tokens, D_MODEL, D_INNER, ACT, dhA, D_MODEL, wptr(law, L0_OUT_PROJ_W), D_INNER,
                           MG_F32, t->dg, D_INNER, 0.0f));
        MG_CUDA(model_launch_gate_bwd(tokens, y, xz, t->dg, t->g, t->dy, t->dxz, st));
        CHECK(mg_linear_dw(t->blas, tokens, D_MODEL, D_INNER, ACT, dhA, D_MODEL, t->g, D_INNER,
                           MG_F32, gl + L0_OUT_PROJ_W, D_INNER, 0.0f));
        /* selective scan */
        MG_CUDA(model_launch_scan_bwd(batch, seqlen, nsp, xc, dt, dbl, lw + L0_DT_PROJ_B, lw + L0_A_LOG, lw + L0_D,
                                       ckpt, t->dy, t->dxc, t->ddt, t->part_bc, t->part_A, t->part_D, t->part_dtb,
                                       t->span_p, t->span_ds, dss_l, start, st));
        /* (its parameter partials [sequence][span] are summed at the layer's end) */
        MG_CUDA(model_launch_bc_reduce(tokens, t->part_bc, t->ddbl, st));
        /* dt_proj (input: dbl[:, :R]), then x_proj */
        CHECK(mg_linear_dw(t->blas, tokens, D_INNER, DT_RANK, ACT, t->ddt, D_INNER, dbl, XP_DIM,
                           MG_F32, gl + L0_DT_PROJ_W, DT_RANK, 0.0f));
        CHECK(mg_linear_dx(t->blas, tokens, D_INNER, DT_RANK, ACT, t->ddt, D_INNER, wptr(law, L0_DT_PROJ_W), DT_RANK,
                           ACT, t->ddbl, XP_DIM, 0.0f));
        CHECK(mg_linear_dw(t->blas, tokens, XP_DIM, D_INNER, ACT, t->ddbl, XP_DIM, xc, D_INNER,
                           MG_F32, gl + L0_X_PROJ_W, D_INNER, 0.0f));
        CHECK(mg_linear_dx(t->blas, tokens, XP_DIM, D_INNER, ACT, t->ddbl, XP_DIM, wptr(law, L0_X_PROJ_W), D_INNER,
                           MG_F32, t->dxc, D_INNER, 1.0f));
        /* conv + SiLU */
        /* (partials per (sequence, time tile), summed at the layer's end) */
        MG_CUDA(model_launch_conv_bwd(batch, seqlen, xz, lw + L0_CONV_W, lw + L0_CONV_B, cs0, t->dxc, t->dxz,
                                       dcs_l, t->part_cw, t->part_cb, start, st));
        /* in_proj, then the block's RMSNorm (adds into the residual gradient) */
        CHECK(mg_linear_dw(t->blas, tokens, XZ_DIM, D_MODEL, ACT, t->dxz, XZ_DIM, hn, D_MODEL,
                           MG_F32, gl + L0_IN_PROJ_W, D_MODEL, 0.0f));
        CHECK(mg_linear_dx(t->blas, tokens, XZ_DIM, D_MODEL, ACT, t->dxz, XZ_DIM, wptr(law, L0_IN_PROJ_W), D_MODEL,
                           MG_F32, t->dhn, D_MODEL, 0.0f));
        MG_CUDA(model_launch_rmsnorm_bwd(tokens, h_l, lw + L0_NORM_W, rstd_l, t->dhn, NULL, 1, t->dh, dhA_out,
                                          t->part_rows, st));
        /* the layer's parameter sums, each over its partial rows in order:
         * the norm's row blocks, the scan's [sequence][span], the conv's
         * [sequence][tile] (one pair of launches for the three) */
        MG_CUDA(model_launch_layer_param_sums(nrb, t->part_rows, gl + L0_NORM_W, nparts, t->part_A, t->part_D,
                                              t->part_dtb, gl + L0_A_LOG, gl + L0_D, gl + L0_DT_PROJ_B,
                                              batch * ((seqlen + CONV_TILE_STEPS - 1) / CONV_TILE_STEPS), t->part_cw,
                                              t->part_cb, gl + L0_CONV_W, gl + L0_CONV_B, st));
    }

#if HAS_INPUT_PROJ
    CHECK(mg_linear_dw(t->blas, tokens, D_MODEL, IN_DIM, MG_F32, t->dh, D_MODEL, t->u, IN_DIM,
                       MG_F32, gr + OFF_INPUT_PROJ_W, IN_DIM, 0.0f));
    MG_CUDA(model_launch_colsum_part(tokens, t->dh, t->part_rows, st));
    MG_CUDA(model_launch_reduce_parts(t->part_rows, nrb, D_MODEL, D_MODEL, gr + OFF_INPUT_PROJ_B, st));
    if (du)
        CHECK(mg_linear_dx(t->blas, tokens, D_MODEL, IN_DIM, MG_F32, t->dh, D_MODEL, w + OFF_INPUT_PROJ_W, IN_DIM,
                           MG_F32, du, IN_DIM, 0.0f));
#else
    if (du)
        MG_CUDA(cudaMemcpyAsync(du, t->dh, (size_t)tokens * D_MODEL * sizeof(float), cudaMemcpyDeviceToDevice, st));
#endif
    if (t->scaling) {
        /* Everything above carries the loss scale S: divide it out (exact),
         * count non-finite parameter gradients, and adapt S. */
        MG_CUDA(model_launch_unscale(WEIGHTS_FLOATS, gr, t->scaler, t->gpart, st));
        if (du) MG_CUDA(model_launch_unscale((size_t)tokens * IN_DIM, du, t->scaler, NULL, st));
        if (dcs) MG_CUDA(model_launch_unscale((size_t)N_LAYERS * batch * CS_PER_SEQ, dcs, t->scaler, NULL, st));
        if (dss) MG_CUDA(model_launch_unscale((size_t)N_LAYERS * batch * SS_PER_SEQ, dss, t->scaler, NULL, st));
        if (!t->hold_scale) MG_CUDA(model_launch_scaler_update(t->gpart, t->scaler, st));
    }
    if (t->accumulate) MG_CUDA(model_launch_grad_accum(WEIGHTS_FLOATS, grads, gr, st));
    return MG_OK;
}

mg_status model_backward(model_trainer *t, const float *d_dout, float *d_grads,
                       float *d_du, float *d_dconv_state, float *d_dssm_state)
{
    static const char fn[] = MODEL_NAME "_backward";
    TRAINER_LIVE(t, fn);
    if (!t->have_fwd)
        return mg_fail(MG_ERR_STATE, "%s: no saved activations (" MODEL_NAME "_forward_train first)", fn);
    CHECK(need_ptr(fn, d_dout, "dout", 1));
    CHECK(need_ptr(fn, d_grads, "grads", 1));
    CHECK(need_ptr(fn, d_du, "du", 0));
    CHECK(need_ptr(fn, d_dconv_state, "dconv_state", 0));
    CHECK(need_ptr(fn, d_dssm_state, "dssm_state", 0));
    if (t->fwd_packed == 2) {
        /* a packed forward from given states: rows per sequence, initial-state gradients allowed */
        CHECK(trainer_packed_dout(t, d_dout));
        CHECK(backward(t, t->dout, d_grads, d_du ? t->pk_u : NULL, d_dconv_state, d_dssm_state));
        return d_du ? trainer_packed_du(t, d_du) : MG_OK;
    }
    if (t->fwd_packed) {
        /* a packed forward: its sequences started from zero states */
        if (d_dconv_state || d_dssm_state)
            return mg_fail(MG_ERR_INVALID_ARG, "%s: the forward was " MODEL_NAME "_forward_train_packed, whose "
                           "sequences start from zero states: dconv_state and dssm_state must be NULL", fn);
        CHECK(trainer_packed_dout(t, d_dout));
        CHECK(backward(t, t->dout, d_grads, d_du ? t->pk_u : NULL, NULL, NULL));
        return d_du ? trainer_packed_du(t, d_du) : MG_OK;
    }
    return backward(t, d_dout, d_grads, d_du, d_dconv_state, d_dssm_state);
}

/* The AdamW phase (arguments checked): prep (hyperparameters p by value,
 * or the device copy *next of a training graph), global norm, update, and
 * the attached model's low-precision copy. The trainer's own GEMM copy of
 * the weights is refreshed by the next forward_train. */
static mg_status adamw(model_trainer *t, float *w, const float *g, float *m, float *v,
                       const model_adamw_params *p, model_adamw_params *next,
                       model_adamw_params *cur, float *coef)
{
    MG_CUDA(model_launch_adamw_prep(p, next, cur, coef, t->stream));
    MG_CUDA(model_launch_grad_norm(g, cur, t->gpart, t->stat, t->stream));
    MG_CUDA(model_launch_adamw(w, g, m, v, t->stat, cur, coef, NULL, t->stream));
    if (t->model) CHECK(model__convert_weights_on(t->model, t->stream));
    return MG_OK;
}

mg_status model_adamw_step(model_trainer *t, float *d_weights, const float *d_grads,
                         float *d_m, float *d_v, const model_adamw_params *p)
{
    static const char fn[] = MODEL_NAME "_adamw_step";
    TRAINER_LIVE(t, fn);
    CHECK(check_adamw(fn, p));
    CHECK(need_ptr(fn, d_weights, "weights", 1));
    CHECK(need_ptr(fn, d_grads, "grads", 1));
    CHECK(need_ptr(fn, d_m, "m", 1));
    CHECK(need_ptr(fn, d_v, "v", 1));
    CHECK(blobs_disjoint(fn, d_weights, d_grads, d_m, d_v));
    return adamw(t, d_weights, d_grads, d_m, d_v, p, NULL, t->hp, t->coef);
}

/* One MSE training step (arguments checked); AdamW hyperparameters as in adamw(). */
static mg_status train_step(model_trainer *t, float *w, float *grads, float *m, float *v,
                            const model_adamw_params *p, model_adamw_params *next,
                            model_adamw_params *cur, float *coef, int batch, int seqlen,
                            const float *u, const float *target, float *cs, float *ss, float *loss)
{
    CHECK(forward_train(t, w, batch, seqlen, u, t->outbuf, cs, ss));
    const size_t n = (size_t)batch * seqlen * D_MODEL;
    MG_CUDA(model_launch_mse(n, t->outbuf, target, t->dout, t->gpart, loss ? loss : t->loss, t->stream));
    CHECK(backward(t, t->dout, grads, NULL, NULL, NULL));
    return adamw(t, w, grads, m, v, p, next, cur, coef);
}

mg_status model_train_step_mse(model_trainer *t, float *d_weights, float *d_grads,
                             float *d_m, float *d_v, const model_adamw_params *p,
                             int batch, int seqlen, const float *d_u, const float *d_target,
                             float *d_conv_state, float *d_ssm_state, float *d_loss)
{
    static const char fn[] = MODEL_NAME "_train_step_mse";
    TRAINER_LIVE(t, fn);
    CHECK(check_adamw(fn, p));
    CHECK(need_ptr(fn, d_target, "target", 1));
    CHECK(need_ptr(fn, d_grads, "grads", 1));
    CHECK(need_ptr(fn, d_m, "m", 1));
    CHECK(need_ptr(fn, d_v, "v", 1));
    CHECK(blobs_disjoint(fn, d_weights, d_grads, d_m, d_v));
    if (d_loss && !mg_aligned(d_loss, 4))
        return mg_fail(MG_ERR_ALIGNMENT, "%s: loss %p is not 4-byte aligned", fn, (void *)d_loss);
    CHECK(check_forward(fn, d_weights, batch, seqlen, d_u, d_conv_state, d_ssm_state));
    return train_step(t, d_weights, d_grads, d_m, d_v, p, NULL, t->hp, t->coef, batch, seqlen, d_u, d_target,
                      d_conv_state, d_ssm_state, d_loss);
}
