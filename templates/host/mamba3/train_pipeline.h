/* train_pipeline.h (emitted as mg_m3_train_pipeline.h): the host pipeline
 * of the Mamba-3 SISO training path, the body of NAME_train.c up to the
 * training graph: the trainer and its workspace, forward_train, backward,
 * the AdamW step and the MSE training step. It names no model: NAME_train.c
 * defines, before including it once, this model's constants (dimensions,
 * blob offsets, workspace sizes, which SSM backward it has) and the names
 * the pipeline uses (model_X is NAME_X, MODEL_X is NAME_X in capitals,
 * MODEL_NAME "NAME" for messages, CHUNKED_BWD_WHY why a library has no
 * chunked SSM backward). Plain C11; what the pipeline does is described at
 * the top of NAME_train.c.
 * What both archs' trainers do the same way (life cycle, argument checks,
 * loss-scaling accessors, the training graph's object) is mg_train_host.h,
 * included below. */

struct model_trainer {
    cudaStream_t stream;
    unsigned long long serial;   /* unique per trainer of the process (training graphs check it) */
    mg_blas *blas;
    model_model *model;   /* attached model (its GEMM copy refreshed after every update), or NULL */
    const float *model_w;      /* the blob the attached model was last pointed at */
    void *ws;
    /* state of the last forward_train */
    int have_fwd, batch, seqlen;
    int ssm_in_last;   /* rot, dt, adt, lam, k, q (chunked: rbc) and g still hold the last layer's (forward_train's) */
    const float *w;
    /* saved activations */
    float *h;      /* [L+1][MAX_TOKENS][D] residual stream at each layer input; [L] = norm_f input */
    float *rstd;   /* [L+1][MAX_TOKENS] */
    float *y;      /* [L][MAX_TOKENS][E] SSM output before the gate */
    float *ckpt;   /* [L][MAX_BATCH*H*MAX_CKPTS*P*N] Hs at every chunk start */
    float *kp0, *vp0, *ang0;   /* [L][MAX_BATCH*...] initial k_prev, v_prev, angle states */
    float *u;      /* [MAX_TOKENS][IN_DIM] (input_dim > 0) */
    char *hn, *proj;   /* act, [L][MAX_TOKENS][...] */
    /* scratch */
    float *dt, *adt, *lam;   /* [MAX_TOKENS][H] per-head SSM inputs */
    char *k, *q;             /* act [MAX_TOKENS][H][N] rotated k', q' (the storage dtype) */
    float *rot;              /* [MAX_TOKENS][H][S] rotary angles (reduced) */
    float *rbc;              /* [MAX_TOKENS][2G] 1/rms of the raw B, C rows (chunked path: k', q' built in the scans) */
    float *tnh;              /* [MAX_TOKENS][S] tanh of the angle inputs (chunked path: the angle table's walk) */
    char *g;       /* act [MAX_TOKENS][E]: out_proj input (forward and backward) */
    char *dh_act;  /* act [MAX_TOKENS][D] (LOWP only) */
    char *dproj;   /* act [MAX_TOKENS][NP] gradient of the in_proj output */
    char *wa;      /* act [WEIGHTS_FLOATS] GEMM weights (LOWP only) */
    float *dh, *dhn, *dg, *dy, *dv;
    float *dk, *dq;          /* [MAX_TOKENS][H][N] (f32; the chunked backward's bf16 for 16-bit storage) */
    float *dadt, *ddt, *dlam, *gdtb;   /* [MAX_TOKENS][H] */
    float *gth;              /* [MAX_TOKENS][H][S] */
    float *gBn, *gCn;        /* [MAX_TOKENS][N] */
    float *part_D, *part_rows;
    float *part_kq;   /* [2][batch * ceil(seqlen / 16)][HN_DIM]: dk, dq per 16-token tile (chunked backward) */
    float *outbuf, *dout, *stat, *loss;
    double *gpart;
    model_adamw_params *hp;   /* the hyperparameters of the last eager AdamW step (device) */
    float *coef;                   /* its derived factors: decay, step size, sqrt(bc2) (device) */
    float *scaler;                 /* loss scaling state (device, see launch_scaler_init) */
    int scaling;                   /* backward applies the loss scale */
    int hold_scale;                /* backward leaves the scale as it is (graph warm-up) */
    int scan_choice;               /* MODEL_SCAN_SPEC | _SEQUENTIAL | _CHUNKED (the training SSM) */
    float *gacc;                   /* gradient accumulation: the backward's scratch blob (NULL until turned on) */
    int accumulate;                /* the backward adds its parameter gradients to grads */
    int fwd_chunked;               /* the last forward_train ran the chunked SSM (its checkpoints) */
    const unsigned char *start;    /* episode-start mask of the next forward_train (device, NULL: none) */
    const unsigned char *fwd_start;   /* the mask the last forward_train ran with (its backward's) */
    /* packed sequences (forward_train_packed; mg_train_host.h) */
    float *pk_u;                   /* [MAX_TOKENS][IN_DIM] padded u, then padded du */
    unsigned char *pk_start;       /* [MAX_TOKENS] the packing's start mask */
    int *pk_off;                   /* [MAX_BATCH + 1] cu_seqlens on the device */
    int pk_nseq, pk_maxlen;        /* the packing of the last forward */
    int fwd_packed;                /* the last forward_train was packed: 1 from zero states, 2 from given ones */
    float *pk_st[4];               /* MAX_BATCH rows of each state (forward_train_packed_from's copies) */
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
    const size_t L = N_LAYERS, MT = MAX_TOKENS, E = D_INNER, MB = MAX_BATCH, H = N_HEADS;
    TAKE(h, float *, (L + 1) * MT * D_MODEL, 4);
    TAKE(rstd, float *, (L + 1) * MT, 4);
    TAKE(y, float *, L * MT * E, 4);
    TAKE(ckpt, float *, L * MB * MAX_CKPTS * SSM_PER_SEQ, 4);
    TAKE(kp0, float *, L * MB * KPREV_PER_SEQ, 4);
    TAKE(vp0, float *, L * MB * VPREV_PER_SEQ, 4);
    TAKE(ang0, float *, L * MB * ANGLE_PER_SEQ, 4);
    TAKE(u, float *, HAS_INPUT_PROJ ? MT * IN_DIM : 1, 4);
    TAKE(pk_u, float *, MT * IN_DIM, 4);
    TAKE(pk_start, unsigned char *, MT, 1);
    TAKE(pk_off, int *, MB + 1, 4);
    TAKE(pk_st[0], float *, L * MB * SSM_PER_SEQ, 4);
    TAKE(pk_st[1], float *, L * MB * KPREV_PER_SEQ, 4);
    TAKE(pk_st[2], float *, L * MB * VPREV_PER_SEQ, 4);
    TAKE(pk_st[3], float *, L * MB * ANGLE_PER_SEQ, 4);
    TAKE(hn, char *, L * MT * D_MODEL, ACT_SIZE);
    TAKE(proj, char *, L * MT * NP_DIM, ACT_SIZE);
    TAKE(dt, float *, MT * H, 4);
    TAKE(adt, float *, MT * H, 4);
    TAKE(lam, float *, MT * H, 4);
    TAKE(k, char *, MT * HN_DIM, ACT_SIZE);
    TAKE(q, char *, MT * HN_DIM, ACT_SIZE);
    TAKE(rot, float *, MT * HS_DIM, 4);
    TAKE(rbc, float *, HAS_CHUNKED_BWD ? MT * 2 * N_GROUPS : 1, 4);
    TAKE(tnh, float *, HAS_CHUNKED_BWD ? MT * N_ANGLES : 1, 4);
    TAKE(g, char *, MT * E, ACT_SIZE);
    TAKE(dh_act, char *, LOWP ? MT * D_MODEL : 1, ACT_SIZE);
    TAKE(dproj, char *, MT * NP_DIM, ACT_SIZE);
    TAKE(wa, char *, LOWP ? WEIGHTS_FLOATS : 1, ACT_SIZE);
    TAKE(dh, float *, MT * D_MODEL, 4);
    TAKE(dhn, float *, MT * D_MODEL, 4);
    TAKE(dg, float *, MT * E, 4);
    TAKE(dy, float *, MT * E, 4);
    TAKE(dv, float *, MT * E, 4);
    TAKE(dk, float *, MT * HN_DIM, 4);
    TAKE(dq, float *, MT * HN_DIM, 4);
    TAKE(dadt, float *, MT * H, 4);
    TAKE(ddt, float *, MT * H, 4);
    TAKE(dlam, float *, MT * H, 4);
    TAKE(gdtb, float *, MT * H, 4);
    TAKE(gth, float *, MT * HS_DIM, 4);
    TAKE(gBn, float *, MT * D_STATE, 4);
    TAKE(gCn, float *, MT * D_STATE, 4);
    TAKE(part_D, float *, MB * H, 4);
    TAKE(part_rows, float *, NORMB_MAX_BLOCKS * PART_WIDTH, 4);
    /* the chunked backward's dk, dq sums per 16-token tile (B/C bias gradients) */
    TAKE(part_kq, float *, HAS_CHUNKED_BWD ? 2 * MB * ((MAX_SEQ_LEN + 15) / 16) * HN_DIM : 1, 4);
    TAKE(outbuf, float *, MT * D_MODEL, 4);
    TAKE(dout, float *, MT * D_MODEL, 4);
    TAKE(stat, float *, 2, 4);
    TAKE(loss, float *, 1, 4);
    TAKE(gpart, double *, GNORM_BLOCKS, 8);
    TAKE(hp, model_adamw_params *, 1, sizeof(model_adamw_params));
    TAKE(coef, float *, 4, 4);
    TAKE(scaler, float *, 4, 4);
#undef TAKE
    return off;
}

mg_status model_trainer_set_scan(model_trainer *t, int choice)
{
    static const char fn[] = MODEL_NAME "_trainer_set_scan";
    TRAINER_LIVE(t, fn);
    if (choice != MODEL_SCAN_SPEC && choice != MODEL_SCAN_SEQUENTIAL && choice != MODEL_SCAN_CHUNKED)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: unknown choice %d (0 spec, 1 sequential, 2 chunked)", fn, choice);
    if (choice == MODEL_SCAN_CHUNKED && !HAS_CHUNKED_BWD)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: this library has no chunked SSM backward " CHUNKED_BWD_WHY, fn);
    t->scan_choice = choice;
    return MG_OK;
}

/* The mask is read by the kernels of every later forward_train and
 * backward: one the device cannot read is refused here (a host-side
 * pointer lookup), and the mask set before stays. */
mg_status model_trainer_set_starts(model_trainer *t, const unsigned char *d_start)
{
    static const char fn[] = MODEL_NAME "_trainer_set_starts";
    TRAINER_LIVE(t, fn);
    if (d_start) {
        struct cudaPointerAttributes a;
        const cudaError_t ce = cudaPointerGetAttributes(&a, d_start);
        if (ce != cudaSuccess) (void)cudaGetLastError();   /* not sticky */
        if (ce != cudaSuccess || a.type == cudaMemoryTypeUnregistered)
            return mg_fail(MG_ERR_INVALID_ARG, "%s: %p is not memory the device can read (pass device memory, or "
                           "cudaHostRegister it)", fn, (const void *)d_start);
    }
    t->start = d_start;
    return MG_OK;
}

/* Whether the SSM of a call of seqlen steps runs chunked: the trainer's
 * choice, else the spec's scan.mode (SCAN_MODE_ID). The forward for
 * training decides (the chunked forward saves the state entering every
 * chunk, the sequential one the state every MODEL_CKPT_STRIDE steps) and the backward
 * follows the forward it differentiates (t->fwd_chunked). */
static int scan_chunked(const model_trainer *t, int seqlen)
{
#if HAS_CHUNKED_BWD
    if (t->scan_choice == MODEL_SCAN_SEQUENTIAL) return 0;
    if (t->scan_choice == MODEL_SCAN_CHUNKED) return 1;
#if SCAN_MODE_ID == 1
    (void)seqlen;
    return 1;   /* any length: a call shorter than a chunk is one partial chunk */
#else
    return seqlen >= SCAN_AUTO_MIN_LEN;
#endif
#else
    (void)t;
    (void)seqlen;
    return 0;   /* the only SSM of this library (set_scan refuses CHUNKED) */
#endif
}

mg_status model_trainer_attach_model(model_trainer *t, model_model *m)
{
    TRAINER_LIVE(t, MODEL_NAME "_trainer_attach_model");
    t->model = m;
    t->model_w = NULL;
    return MG_OK;
}

/* Per-token column sums of x [tokens][width] into out[width]: two stages,
 * fixed order (blocks of NORMB_ROWS tokens, then the blocks in order). */
static mg_status colsum(const model_trainer *t, int tokens, int width, const float *x, float *out)
{
    const int nrb = (tokens + NORMB_ROWS - 1) / NORMB_ROWS;
    MG_CUDA(model_launch_colsum_part(tokens, width, x, t->part_rows, t->stream));
    MG_CUDA(model_launch_reduce_parts(t->part_rows, nrb, (size_t)width, width, out, t->stream));
    return MG_OK;
}

/* The per-token SSM inputs of a layer (weights lw, in_proj output proj,
 * the initial angle ang0, the final one to ang_out, NULL: not kept):
 * forward_train's and the backward's recompute (the same kernels: the same
 * bits). The chunked SSM gets dt, A*dt, lambda, rbc and tnh
 * (prep_scalars_train: its scans build k', q' in their stage), then the
 * angle table rot, whose walk reads that dt and tnh; the sequential one gets rot first, then dt, A*dt,
 * lambda and the per-head k', q' rows rotated by it (prep_train). */
static mg_status ssm_prep(const model_trainer *t, int chunked, int batch, int seqlen, const void *proj,
                          const float *lw, const float *ang0, float *ang_out, const unsigned char *start)
{
    const int tokens = batch * seqlen;
#if HAS_CHUNKED_BWD
    if (chunked) {
        MG_CUDA(model_launch_prep_scalars_train(tokens, proj, lw + L0_DT_BIAS, t->dt, t->adt, t->lam, t->rbc,
                                                t->tnh, t->stream));
        MG_CUDA(model_launch_angles_train(batch, seqlen, proj, lw + L0_DT_BIAS, t->dt, t->tnh, ang0, ang_out,
                                          t->rot, start, t->stream));
        return MG_OK;
    }
#else
    (void)chunked;
#endif
    MG_CUDA(model_launch_angles_train(batch, seqlen, proj, lw + L0_DT_BIAS, NULL, NULL, ang0, ang_out, t->rot,
                                      start, t->stream));
    MG_CUDA(model_launch_prep_train(tokens, proj, lw + L0_DT_BIAS, lw + L0_B_NORM_W, lw + L0_C_NORM_W,
                                    lw + L0_B_BIAS, lw + L0_C_BIAS, t->rot, t->dt, t->adt, t->lam, t->k, t->q,
                                    t->stream));
    return MG_OK;
}

static mg_status forward_train(model_trainer *t, const float *w, int batch, int seqlen,
                               const float *u, float *out, float *ssm, float *kp, float *vp, float *ang)
{
    const int tokens = batch * seqlen;
    const cudaStream_t st = t->stream;
    const size_t E = D_INNER, MB = MAX_BATCH;
    t->have_fwd = 0;
    t->ssm_in_last = 0;
    t->fwd_packed = 0;
    t->w = w;
    t->batch = batch;
    t->seqlen = seqlen;
    const int chunked = scan_chunked(t, seqlen);
    t->fwd_chunked = chunked;
    const unsigned char *start = t->start;   /* episode starts (NULL: none), for the backward too */
    t->fwd_start = start;
#if LOWP
    MG_CUDA(model_launch_convert_train(w, t->wa, st));
#endif
    const void *wa = gemm_w(t);

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
        const size_t lb = (size_t)l * (size_t)batch;
        float *h_l = t->h + (size_t)l * MAX_TOKENS * D_MODEL;
        float *h_n = h_l + MAX_TOKENS * D_MODEL;
        float *rstd_l = t->rstd + (size_t)l * MAX_TOKENS;
        float *y_l = t->y + (size_t)l * MAX_TOKENS * E;
        char *hn = act_l(t->hn, l, D_MODEL), *proj = act_l(t->proj, l, NP_DIM);
        float *ckpt = t->ckpt + (size_t)l * MB * MAX_CKPTS * SSM_PER_SEQ;
        float *kp0 = t->kp0 + (size_t)l * MB * KPREV_PER_SEQ;
        float *vp0 = t->vp0 + (size_t)l * MB * VPREV_PER_SEQ;
        float *ang0 = t->ang0 + (size_t)l * MB * ANGLE_PER_SEQ;
        float *ssm_l = ssm ? ssm + lb * SSM_PER_SEQ : NULL;
        float *kp_l = kp ? kp + lb * KPREV_PER_SEQ : NULL;
        float *vp_l = vp ? vp + lb * VPREV_PER_SEQ : NULL;
        float *ang_l = ang ? ang + lb * ANGLE_PER_SEQ : NULL;

        /* hn = rmsnorm(h_l), and h_n = h_l (the next residual stream, which
         * the out_proj GEMM below accumulates into) in the same pass */
        MG_CUDA(model_launch_rmsnorm_fwd(h_l, lw + L0_NORM_W, hn, 0, rstd_l, h_n, tokens, st));
        CHECK(mg_linear(t->blas, tokens, NP_DIM, D_MODEL, ACT, hn, D_MODEL, wptr(law, L0_IN_PROJ_W), D_MODEL,
                        ACT, proj, NP_DIM, 1.0f, 0.0f));
        /* the initial k_prev, v_prev, angle (the initial Hs is checkpoint 0) */
        if (ssm_l) {
            MG_CUDA(cudaMemcpyAsync(kp0, kp_l, (size_t)batch * KPREV_PER_SEQ * sizeof(float), cudaMemcpyDeviceToDevice, st));
            MG_CUDA(cudaMemcpyAsync(vp0, vp_l, (size_t)batch * VPREV_PER_SEQ * sizeof(float), cudaMemcpyDeviceToDevice, st));
            MG_CUDA(cudaMemcpyAsync(ang0, ang_l, (size_t)batch * ANGLE_PER_SEQ * sizeof(float), cudaMemcpyDeviceToDevice, st));
        } else {
            MG_CUDA(cudaMemsetAsync(kp0, 0, (size_t)batch * KPREV_PER_SEQ * sizeof(float), st));
            MG_CUDA(cudaMemsetAsync(vp0, 0, (size_t)batch * VPREV_PER_SEQ * sizeof(float), st));
            MG_CUDA(cudaMemsetAsync(ang0, 0, (size_t)batch * ANGLE_PER_SEQ * sizeof(float), st));
        }
        CHECK(ssm_prep(t, chunked, batch, seqlen, proj, lw, ang0, ang_l, start));
#if HAS_CHUNKED_BWD
        /* chunked: the scan builds k', q' in its stage from proj, rbc and rot
         * (the values prep_train writes, to the bit): no per-head rows */
        if (chunked)
            MG_CUDA(model_launch_scan_fwd_chunked(batch, seqlen, proj, t->rbc, t->rot, lw + L0_B_NORM_W,
                                            lw + L0_C_NORM_W, lw + L0_B_BIAS, lw + L0_C_BIAS, t->dt, t->adt,
                                            t->lam, lw + L0_D, ssm_l, kp0, vp0, ssm_l, kp_l, vp_l, ckpt, y_l,
                                            start, st));
        else
#endif
        MG_CUDA(model_launch_scan_fwd(batch, seqlen, proj, t->k, t->q, t->dt, t->adt, t->lam, lw + L0_D,
                                ssm_l, kp0, vp0, ssm_l, kp_l, vp_l, ckpt, y_l, start, st));
#if OUTPROJ_NORM
        MG_CUDA(model_launch_gate_fwd(tokens, y_l, proj, lw + L0_NORM_GATE_W, t->g, st));
#else
        MG_CUDA(model_launch_gate_fwd(tokens, y_l, proj, NULL, t->g, st));
#endif
        CHECK(mg_linear(t->blas, tokens, D_MODEL, D_INNER, ACT, t->g, D_INNER, wptr(law, L0_OUT_PROJ_W), D_INNER,
                        MG_F32, h_n, D_MODEL, 1.0f, 1.0f));
    }
    MG_CUDA(model_launch_rmsnorm_fwd(t->h + (size_t)N_LAYERS * MAX_TOKENS * D_MODEL, w + OFF_NORM_F_W, out, 1,
                               t->rstd + (size_t)N_LAYERS * MAX_TOKENS, NULL, tokens, st));
    t->have_fwd = 1;
    t->ssm_in_last = 1;   /* nothing after the last layer's prep wrote them */
    return MG_OK;
}

static mg_status check_forward(const char *fn, const float *d_weights, int batch, int seqlen, const float *d_u,
                               const float *d_ssm, const float *d_k_prev, const float *d_v_prev,
                               const float *d_angle);

mg_status model_forward_train(model_trainer *t, const float *d_weights, int batch, int seqlen,
                            const float *d_u, float *d_out,
                            float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    static const char fn[] = MODEL_NAME "_forward_train";
    TRAINER_LIVE(t, fn);
    CHECK(need_ptr(fn, d_out, "out", 1));
    CHECK(check_forward(fn, d_weights, batch, seqlen, d_u, d_ssm, d_k_prev, d_v_prev, d_angle));
    return forward_train(t, d_weights, batch, seqlen, d_u, d_out, d_ssm, d_k_prev, d_v_prev, d_angle);
}

/* Packed sequences (mg_train_host.h). from = 0: the right-aligned padded
 * batch's forward with the packing's start mask in place of the trainer's
 * own (set_starts' mask is kept for the next plain forward), on the
 * caller's states zeroed. from = 1 with states (forward_train_packed_from):
 * left-aligned rows, no start mask at all, on the trainer's copies of the
 * states; without states it is from = 0. */
static mg_status forward_packed(model_trainer *t, const char *fn, int from, const float *d_weights, int nseq,
                                const int32_t *cu_seqlens, const float *d_u, float *d_out,
                                float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    TRAINER_LIVE(t, fn);
    packed_shape ps = { 0, 0, 0 };
    CHECK(packed_check(fn, nseq, cu_seqlens, MAX_BATCH, MAX_SEQ_LEN, &ps));
    CHECK(need_ptr(fn, d_out, "out", 1));
    CHECK(check_forward(fn, d_weights, ps.nseq, ps.maxlen, d_u, d_ssm, d_k_prev, d_v_prev, d_angle));
    from = from && d_ssm;   /* no states: zeros in */
    float *const sp[4] = { d_ssm, d_k_prev, d_v_prev, d_angle };
    const size_t nl = (size_t)N_LAYERS * ps.nseq;
    const size_t sf[4] = { nl * SSM_PER_SEQ, nl * KPREV_PER_SEQ, nl * VPREV_PER_SEQ, nl * ANGLE_PER_SEQ };
    CHECK(trainer_packed_pre(t, &ps, cu_seqlens, d_u, sp, sf, 4, from));
    float *const *fs = from ? t->pk_st : sp;   /* the states the forward runs on */
    const unsigned char *const own = t->start;
    t->start = from ? NULL : t->pk_start;
    const mg_status s = forward_train(t, d_weights, ps.nseq, ps.maxlen, t->pk_u, t->outbuf, fs[0], fs[1], fs[2],
                                      fs[3]);
    t->start = own;
    CHECK(s);
    return trainer_packed_post(t, &ps, d_out, from);
}

mg_status model_forward_train_packed(model_trainer *t, const float *d_weights, int nseq, const int32_t *cu_seqlens,
                                     const float *d_u, float *d_out,
                                     float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    return forward_packed(t, MODEL_NAME "_forward_train_packed", 0, d_weights, nseq, cu_seqlens, d_u, d_out, d_ssm,
                          d_k_prev, d_v_prev, d_angle);
}

mg_status model_forward_train_packed_from(model_trainer *t, const float *d_weights, int nseq,
                                          const int32_t *cu_seqlens, const float *d_u, float *d_out,
                                          float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    return forward_packed(t, MODEL_NAME "_forward_train_packed_from", 1, d_weights, nseq, cu_seqlens, d_u, d_out,
                          d_ssm, d_k_prev, d_v_prev, d_angle);
}

/* The checks of a forward over [batch][seqlen] with optional states. */
static mg_status check_forward(const char *fn, const float *d_weights, int batch, int seqlen, const float *d_u,
                               const float *d_ssm, const float *d_k_prev, const float *d_v_prev,
                               const float *d_angle)
{
    if (batch < 1 || batch > MAX_BATCH)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch = %d is out of range 1..%d", fn, batch, MAX_BATCH);
    if (seqlen < 1 || seqlen > MAX_SEQ_LEN)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: seqlen = %d is out of range 1..%d", fn, seqlen, MAX_SEQ_LEN);
    CHECK(need_ptr(fn, d_weights, "weights", 1));
    CHECK(need_ptr(fn, d_u, "u", 1));
    const int given = (d_ssm != NULL) + (d_k_prev != NULL) + (d_v_prev != NULL) + (d_angle != NULL);
    if (given != 0 && given != 4)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: ssm, k_prev, v_prev and angle must all be given or all be NULL "
                       "(got ssm %s, k_prev %s, v_prev %s, angle %s)", fn,
                       d_ssm ? "set" : "NULL", d_k_prev ? "set" : "NULL", d_v_prev ? "set" : "NULL",
                       d_angle ? "set" : "NULL");
    CHECK(need_ptr(fn, d_ssm, "ssm", 0));
    CHECK(need_ptr(fn, d_k_prev, "k_prev", 0));
    CHECK(need_ptr(fn, d_v_prev, "v_prev", 0));
    CHECK(need_ptr(fn, d_angle, "angle", 0));
    return MG_OK;
}

static mg_status backward(model_trainer *t, const float *dout, float *gr, float *du,
                          float *dssm, float *dkp, float *dvp, float *dang)
{
    const int batch = t->batch, seqlen = t->seqlen, tokens = batch * seqlen;
    const int nrb = (tokens + NORMB_ROWS - 1) / NORMB_ROWS;   /* token blocks of the partials */
    const cudaStream_t st = t->stream;
    const float *w = t->w;
    const void *wa = gemm_w(t);
    const size_t E = D_INNER, MB = MAX_BATCH;
#if LOWP
    void *dhA = t->dh_act;   /* act copy of dh for the out_proj GEMMs */
#else
    void *dhA = t->dh;
#endif
    void *dhA_out = LOWP ? dhA : NULL;
    const int chunked = t->fwd_chunked;   /* the SSM of the forward's checkpoints, for every layer */
#if HAS_CHUNKED_BWD
    const size_t kq_rows = (size_t)batch * ((seqlen + 15) / 16);   /* rows of each half of part_kq */
#endif
    const unsigned char *start = t->fwd_start;   /* and its episode starts */
    /* The last layer's SSM inputs, and its gated output g, are still in
     * the trainer's buffers when the forward was the last thing to write
     * them: the backward walks the layers from the last, so that layer
     * skips their recompute (and the gate backward the store of g). Used
     * once (a second backward, or the next layers, recompute). */
    const int reuse_last = t->ssm_in_last;
    t->ssm_in_last = 0;

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
        const size_t lb = (size_t)l * (size_t)batch;
        const float *h_l = t->h + (size_t)l * MAX_TOKENS * D_MODEL;
        const float *rstd_l = t->rstd + (size_t)l * MAX_TOKENS;
        const float *y_l = t->y + (size_t)l * MAX_TOKENS * E;
        char *hn = act_l(t->hn, l, D_MODEL), *proj = act_l(t->proj, l, NP_DIM);
        const float *ckpt = t->ckpt + (size_t)l * MB * MAX_CKPTS * SSM_PER_SEQ;
        const float *kp0 = t->kp0 + (size_t)l * MB * KPREV_PER_SEQ;
        const float *vp0 = t->vp0 + (size_t)l * MB * VPREV_PER_SEQ;
        const float *ang0 = t->ang0 + (size_t)l * MB * ANGLE_PER_SEQ;
        float *dssm_l = dssm ? dssm + lb * SSM_PER_SEQ : NULL;
        float *dkp_l = dkp ? dkp + lb * KPREV_PER_SEQ : NULL;
        float *dvp_l = dvp ? dvp + lb * VPREV_PER_SEQ : NULL;
        float *dang_l = dang ? dang + lb * ANGLE_PER_SEQ : NULL;
#if OUTPROJ_NORM
        const float *ngw = lw + L0_NORM_GATE_W;
#else
        const float *ngw = NULL;
#endif

        /* out_proj and the gate */
        CHECK(mg_linear_dx(t->blas, tokens, D_MODEL, D_INNER, ACT, dhA, D_MODEL, wptr(law, L0_OUT_PROJ_W), D_INNER,
                           MG_F32, t->dg, D_INNER, 0.0f));
        /* (the last layer's g is still the forward's when reuse_last: the
         * gate backward writes the same bits, so it skips them) */
        MG_CUDA(model_launch_gate_bwd(tokens, y_l, proj, ngw, t->dg, reuse_last && l == N_LAYERS - 1 ? NULL : t->g,
                                t->dy, t->dproj, t->part_rows, st));
#if OUTPROJ_NORM
        MG_CUDA(model_launch_reduce_parts(t->part_rows, nrb, E, (int)E, gl + L0_NORM_GATE_W, st));
#endif
        CHECK(mg_linear_dw(t->blas, tokens, D_MODEL, D_INNER, ACT, dhA, D_MODEL, t->g, D_INNER,
                           MG_F32, gl + L0_OUT_PROJ_W, D_INNER, 0.0f));
        /* recompute the SSM inputs (forward arithmetic), with the rotary
         * cos/sin (the same kernels as the forward: the same bits) */
        if (!(reuse_last && l == N_LAYERS - 1)) {
            CHECK(ssm_prep(t, chunked, batch, seqlen, proj, lw, ang0, NULL, start));
        }
        /* the SSM, in reverse from the checkpoints */
#if HAS_CHUNKED_BWD
        /* then the rotary and the angle recurrence, in reverse: the chunked
         * backward un-rotates dk, dq and writes the local angle terms
         * itself (only the suffix sums are left), the sequential one leaves
         * all of it to angles_bwd */
        if (chunked) {
            MG_CUDA(model_launch_scan_bwd_chunked(batch, seqlen, proj, t->rbc, t->rot, lw + L0_B_NORM_W,
                                            lw + L0_C_NORM_W, lw + L0_B_BIAS, lw + L0_C_BIAS, t->dt, t->adt,
                                            t->lam, lw + L0_D, ckpt, kp0, vp0, t->dy, t->dk, t->dq, t->dproj,
                                            t->dadt, t->ddt, t->dlam, t->gth, t->part_D, t->part_kq,
                                            t->part_kq + kq_rows * HN_DIM, dssm_l, dkp_l, dvp_l, start, st));
            MG_CUDA(model_launch_angles_bwd_sums(batch, seqlen, t->gth, dang_l, start, st));
        } else
#else
        (void)chunked;
#endif
        {
            MG_CUDA(model_launch_scan_bwd(batch, seqlen, proj, t->k, t->q, t->dt, t->adt, t->lam, lw + L0_D, ckpt,
                                    kp0, vp0, t->dy, t->dk, t->dq, t->dv, t->dadt, t->ddt, t->dlam, t->part_D,
                                    dssm_l, dkp_l, dvp_l, start, st));
            MG_CUDA(model_launch_angles_bwd(batch, seqlen, t->k, t->q, t->rot, t->dk, t->dq, t->gth, dang_l, start,
                                      st));
        }
        MG_CUDA(model_launch_reduce_parts(t->part_D, batch, N_HEADS, N_HEADS, gl + L0_D, st));
        /* per-token maps: dproj (B, C, dd_dt, dd_A, trap, angles, and x unless the chunked
         * backward stored it) and parameter rows; after the chunked backward,
         * dk, dq hold its entry type (bf16 for 16-bit storage) */
#if HAS_CHUNKED_BWD
        if (chunked)
            MG_CUDA(model_launch_prep_bwd_ck(tokens, proj, t->dt, t->lam, lw + L0_DT_BIAS, lw + L0_B_NORM_W,
                                       lw + L0_C_NORM_W, t->dk, t->dq, t->dadt, t->ddt, t->dlam, t->gth,
                                       t->dproj, t->gdtb, t->gBn, t->gCn, st));
        else
#endif
        MG_CUDA(model_launch_prep_bwd(tokens, proj, t->dt, t->lam, lw + L0_DT_BIAS, lw + L0_B_NORM_W,
                                lw + L0_C_NORM_W, t->dk, t->dq, t->dv, t->dadt, t->ddt, t->dlam,
                                t->gth, t->dproj, t->gdtb, t->gBn, t->gCn, st));
        CHECK(colsum(t, tokens, N_HEADS, t->gdtb, gl + L0_DT_BIAS));
        CHECK(colsum(t, tokens, D_STATE, t->gBn, gl + L0_B_NORM_W));
        CHECK(colsum(t, tokens, D_STATE, t->gCn, gl + L0_C_NORM_W));
#if HAS_CHUNKED_BWD
        if (chunked) {   /* from the chunked backward's tile sums: no pass over dk, dq */
            MG_CUDA(model_launch_reduce_parts(t->part_kq, (int)kq_rows, HN_DIM, HN_DIM, gl + L0_B_BIAS, st));
            MG_CUDA(model_launch_reduce_parts(t->part_kq + kq_rows * HN_DIM, (int)kq_rows, HN_DIM, HN_DIM,
                                        gl + L0_C_BIAS, st));
        } else
#endif
        {
            CHECK(colsum(t, tokens, HN_DIM, t->dk, gl + L0_B_BIAS));
            CHECK(colsum(t, tokens, HN_DIM, t->dq, gl + L0_C_BIAS));
        }
        /* in_proj, then the block's RMSNorm (adds into the residual gradient) */
        CHECK(mg_linear_dw(t->blas, tokens, NP_DIM, D_MODEL, ACT, t->dproj, NP_DIM, hn, D_MODEL,
                           MG_F32, gl + L0_IN_PROJ_W, D_MODEL, 0.0f));
        CHECK(mg_linear_dx(t->blas, tokens, NP_DIM, D_MODEL, ACT, t->dproj, NP_DIM, wptr(law, L0_IN_PROJ_W), D_MODEL,
                           MG_F32, t->dhn, D_MODEL, 0.0f));
        MG_CUDA(model_launch_rmsnorm_bwd(tokens, h_l, lw + L0_NORM_W, rstd_l, t->dhn, NULL, 1, t->dh, dhA_out,
                                   t->part_rows, st));
        MG_CUDA(model_launch_reduce_parts(t->part_rows, nrb, D_MODEL, D_MODEL, gl + L0_NORM_W, st));
    }

#if HAS_INPUT_PROJ
    CHECK(mg_linear_dw(t->blas, tokens, D_MODEL, IN_DIM, MG_F32, t->dh, D_MODEL, t->u, IN_DIM,
                       MG_F32, gr + OFF_INPUT_PROJ_W, IN_DIM, 0.0f));
    CHECK(colsum(t, tokens, D_MODEL, t->dh, gr + OFF_INPUT_PROJ_B));
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
        const size_t nb = (size_t)N_LAYERS * batch;
        MG_CUDA(model_launch_unscale(WEIGHTS_FLOATS, gr, t->scaler, t->gpart, st));
        if (du) MG_CUDA(model_launch_unscale((size_t)tokens * IN_DIM, du, t->scaler, NULL, st));
        if (dssm) MG_CUDA(model_launch_unscale(nb * SSM_PER_SEQ, dssm, t->scaler, NULL, st));
        if (dkp) MG_CUDA(model_launch_unscale(nb * KPREV_PER_SEQ, dkp, t->scaler, NULL, st));
        if (dvp) MG_CUDA(model_launch_unscale(nb * VPREV_PER_SEQ, dvp, t->scaler, NULL, st));
        if (dang) MG_CUDA(model_launch_unscale(nb * ANGLE_PER_SEQ, dang, t->scaler, NULL, st));
        if (!t->hold_scale) MG_CUDA(model_launch_scaler_update(t->gpart, t->scaler, st));
    }
    if (t->accumulate) MG_CUDA(model_launch_grad_accum(WEIGHTS_FLOATS, grads, gr, st));
    return MG_OK;
}

mg_status model_backward(model_trainer *t, const float *d_dout, float *d_grads, float *d_du,
                       float *d_dssm, float *d_dk_prev, float *d_dv_prev, float *d_dangle)
{
    static const char fn[] = MODEL_NAME "_backward";
    TRAINER_LIVE(t, fn);
    if (!t->have_fwd)
        return mg_fail(MG_ERR_STATE, "%s: no saved activations (" MODEL_NAME "_forward_train first)", fn);
    CHECK(need_ptr(fn, d_dout, "dout", 1));
    CHECK(need_ptr(fn, d_grads, "grads", 1));
    CHECK(need_ptr(fn, d_du, "du", 0));
    CHECK(need_ptr(fn, d_dssm, "dssm", 0));
    CHECK(need_ptr(fn, d_dk_prev, "dk_prev", 0));
    CHECK(need_ptr(fn, d_dv_prev, "dv_prev", 0));
    CHECK(need_ptr(fn, d_dangle, "dangle", 0));
    if (t->fwd_packed == 2) {
        /* a packed forward from given states: rows per sequence, initial-state gradients allowed */
        CHECK(trainer_packed_dout(t, d_dout));
        CHECK(backward(t, t->dout, d_grads, d_du ? t->pk_u : NULL, d_dssm, d_dk_prev, d_dv_prev, d_dangle));
        return d_du ? trainer_packed_du(t, d_du) : MG_OK;
    }
    if (t->fwd_packed) {
        /* a packed forward: its sequences started from zero states */
        if (d_dssm || d_dk_prev || d_dv_prev || d_dangle)
            return mg_fail(MG_ERR_INVALID_ARG, "%s: the forward was " MODEL_NAME "_forward_train_packed, whose "
                           "sequences start from zero states: dssm, dk_prev, dv_prev and dangle must be NULL", fn);
        CHECK(trainer_packed_dout(t, d_dout));
        CHECK(backward(t, t->dout, d_grads, d_du ? t->pk_u : NULL, NULL, NULL, NULL, NULL));
        return d_du ? trainer_packed_du(t, d_du) : MG_OK;
    }
    return backward(t, d_dout, d_grads, d_du, d_dssm, d_dk_prev, d_dv_prev, d_dangle);
}

/* The AdamW phase (arguments checked): prep (hyperparameters p by value,
 * or the device copy *next of a training graph), global norm, update, and
 * the attached model's low-precision copy (its weights pointer is already
 * this blob: set by adamw_step / train_graph_create). The trainer's own GEMM
 * copy of the weights is refreshed by the next forward_train. */
static mg_status adamw(model_trainer *t, float *w, const float *g, float *m, float *v,
                       const model_adamw_params *p, model_adamw_params *next,
                       model_adamw_params *cur, float *coef)
{
    MG_CUDA(model_launch_adamw_prep(p, next, cur, coef, t->stream));
    MG_CUDA(model_launch_grad_norm(g, cur, t->gpart, t->stat, t->stream));
    MG_CUDA(model_launch_adamw(w, g, m, v, t->stat, cur, coef, t->stream));
#if LOWP
    if (t->model) {
        /* the model's GEMM copy, converted on the trainer's stream (so a
         * captured graph refreshes it too) */
        void *mwa = (void *)model__gemm_weights(t->model);
        if (mwa && mwa != (void *)w) MG_CUDA(model_launch_convert_train(w, mwa, t->stream));
    }
#endif
    return MG_OK;
}

/* Point an attached model at the blob being trained (once per blob). */
static mg_status model_follow(model_trainer *t, const float *w)
{
    if (!t->model || t->model_w == w) return MG_OK;
    CHECK(model_set_weights(t->model, w, WEIGHTS_FLOATS));
    t->model_w = w;
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
    CHECK(model_follow(t, d_weights));
    return adamw(t, d_weights, d_grads, d_m, d_v, p, NULL, t->hp, t->coef);
}

/* One MSE training step (arguments checked); AdamW hyperparameters as in adamw(). */
static mg_status train_step(model_trainer *t, float *w, float *grads, float *m, float *v,
                            const model_adamw_params *p, model_adamw_params *next,
                            model_adamw_params *cur, float *coef, int batch, int seqlen,
                            const float *u, const float *target, float *ssm, float *kp, float *vp,
                            float *ang, float *loss)
{
    CHECK(forward_train(t, w, batch, seqlen, u, t->outbuf, ssm, kp, vp, ang));
    const size_t n = (size_t)batch * seqlen * D_MODEL;
    MG_CUDA(model_launch_mse(n, t->outbuf, target, t->dout, t->gpart, loss ? loss : t->loss, t->stream));
    CHECK(backward(t, t->dout, grads, NULL, NULL, NULL, NULL, NULL));
    return adamw(t, w, grads, m, v, p, next, cur, coef);
}

/* The checks of train_step_mse and train_graph_create. */
static mg_status check_step(const char *fn, model_trainer *t, const float *w, float *grads, float *m,
                            float *v, const model_adamw_params *p, int batch, int seqlen,
                            const float *u, const float *target, float *ssm, float *kp, float *vp,
                            float *ang, float *loss)
{
    TRAINER_LIVE(t, fn);
    CHECK(check_adamw(fn, p));
    CHECK(need_ptr(fn, target, "target", 1));
    CHECK(need_ptr(fn, grads, "grads", 1));
    CHECK(need_ptr(fn, m, "m", 1));
    CHECK(need_ptr(fn, v, "v", 1));
    CHECK(blobs_disjoint(fn, w, grads, m, v));
    if (loss && !mg_aligned(loss, 4))
        return mg_fail(MG_ERR_ALIGNMENT, "%s: loss %p is not 4-byte aligned", fn, (void *)loss);
    return check_forward(fn, w, batch, seqlen, u, ssm, kp, vp, ang);
}

mg_status model_train_step_mse(model_trainer *t, float *d_weights, float *d_grads,
                             float *d_m, float *d_v, const model_adamw_params *p,
                             int batch, int seqlen, const float *d_u, const float *d_target,
                             float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle,
                             float *d_loss)
{
    static const char fn[] = MODEL_NAME "_train_step_mse";
    CHECK(check_step(fn, t, d_weights, d_grads, d_m, d_v, p, batch, seqlen, d_u, d_target, d_ssm, d_k_prev,
                     d_v_prev, d_angle, d_loss));
    CHECK(model_follow(t, d_weights));
    return train_step(t, d_weights, d_grads, d_m, d_v, p, NULL, t->hp, t->coef, batch, seqlen, d_u, d_target,
                      d_ssm, d_k_prev, d_v_prev, d_angle, d_loss);
}
