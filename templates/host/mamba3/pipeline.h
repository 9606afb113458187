/* pipeline.h (emitted as mg_m3_pipeline.h): the host pipeline of a Mamba-3
 * SISO library, the body of NAME.c. It names no model: NAME.c defines,
 * before including it once, this model's constants (dimensions, blob
 * offsets, optional paths), its parameter table, and the names the
 * pipeline uses: model_X is NAME_X, MODEL_X is NAME_X in capitals,
 * MODEL_NAME "NAME" and MODEL_UPPER "NAME in capitals" (for messages), and
 * the spec values the pipeline quotes or hands to the reference. The
 * launchers are MG_LAUNCH(fn) (NAME.h).
 * What every arch's pipeline does the same way (setters, destructor, the
 * decode graph) is mg_model_host.h, included below with this arch's states.
 * Plain C11; what the pipeline does is described at the top of NAME.c. */

/* ---- The model: stream, cuBLAS handle, borrowed weights, fixed workspace ---- */
struct model_model {
    cudaStream_t stream;
    mg_blas *blas;
    const float *w;     /* borrowed weights blob; NULL until set_weights */
    void *ws;           /* one device allocation holding every buffer below */
    float *h;           /* [MAX_TOKENS][D_MODEL]  residual stream (f32) */
    void *hn;           /* [MAX_TOKENS][D_MODEL]  normed input of in_proj */
    void *proj;         /* [MAX_TOKENS][NP_DIM]   in_proj output: z|x|B|C|dd_dt|dd_A|trap|angles */
    void *g;            /* [MAX_TOKENS][D_INNER]  gated output, input of out_proj */
    void *wa;           /* low-precision copy of the blob (act elements, blob offsets); NULL for f32 */
    void *seg_ws;       /* SEG_WS_BYTES: the fused scan's segment form (HAS_CHUNKED_FUSED) */
    /* The unfused kernels' buffers (prep, angles, scan, gate), one
     * allocation of split_tokens tokens: every call that does not take the
     * fused chunked kernel (the sequential scan, large decode batches; all
     * calls without HAS_CHUNKED_FUSED). */
    void *split_ws;
    void *split_old;    /* a smaller one replaced by split_reserve: kept for graphs captured on it */
    size_t split_tokens, split_bytes, split_old_bytes;
    float *dt;          /* [split_tokens][N_HEADS]  DT */
    float *adt;         /* [split_tokens][N_HEADS]  A*DT */
    float *lam;         /* [split_tokens][N_HEADS]  lambda */
    float *k;           /* [split_tokens][N_HEADS][D_STATE]  k (rotated in place) */
    float *q;           /* [split_tokens][N_HEADS][D_STATE]  q (rotated in place) */
    float *y;           /* [split_tokens][D_INNER]  SSM output (f32) */
    int scan_choice;    /* MODEL_SCAN_SPEC | _SEQUENTIAL | _CHUNKED */
    unsigned long long serial;   /* unique per model of the process (decode graphs check it) */
    int sms;            /* SMs of the device at create (the fused scan's segments) */
    size_t ws_total;    /* device bytes held: ws + wa + split_ws (+ split_old) + pk */
    /* packed sequences (mg_model_host.h): one allocation pk holding the
     * padded input and output, the start mask and the offsets */
    void *pk;
    float *pk_u, *pk_out;
    unsigned char *pk_start;
    int *pk_off;
    int *pk_idx;                    /* [MAX_BATCH] sequence order by length (prefill_packed_from) */
    float *pk_st[4];                /* MAX_BATCH rows of each of its (up to 4) states (prefill_packed_from) */
};

/* The unfused buffers for a scan choice (below; model_set_scan calls it
 * through ARCH_SET_SCAN, destroy frees them through ARCH_DESTROY). */
static mg_status split_reserve(model_model *m, int choice);
#define ARCH_SET_SCAN(m, choice) split_reserve((m), (choice))
#define ARCH_DESTROY(m) (mg_dev_free((m)->split_ws), mg_dev_free((m)->split_old))

/* The arch's checks and forward, for the common part (mg_model_host.h). */
static mg_status check_call(const model_model *m, const char *fn, int batch, int seqlen,
                            const float *u, const float *out, const float *const st[4],
                            int states_required);
static mg_status forward(model_model *m, int batch, int seqlen, const float *u, float *out,
                         float *ssm, float *kp, float *vp, float *ang, int last_only, int decode,
                         const unsigned char *reset);
#define STATE_PARAMS float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle
#define STATE_ARGS d_ssm, d_k_prev, d_v_prev, d_angle
#define NO_STATES NULL, NULL, NULL, NULL
#define CHECK_STATES(fn, batch, seqlen, u, out, required) \
    check_call(m, fn, batch, seqlen, u, out, (const float *const[4]){ STATE_ARGS }, required)
static mg_status forward_ex(model_model *m, int batch, int seqlen, const float *u, float *out,
                            float *ssm, float *kp, float *vp, float *ang, int last_only, int decode,
                            const unsigned char *reset, const unsigned char *start);
#define N_STATES 4
#define STATE_SIZES(batch) { model_ssm_state_floats(batch), model_k_prev_state_floats(batch), \
                             model_v_prev_state_floats(batch), model_angle_state_floats(batch) }
#define FORWARD_STARTS(batch, seqlen, u, out, start) \
    forward_ex(m, batch, seqlen, u, out, STATE_ARGS, 0, 0, NULL, start)
#define FORWARD_ON(batch, seqlen, u, out, sp) \
    forward_ex(m, batch, seqlen, u, out, (sp)[0], (sp)[1], (sp)[2], (sp)[3], 0, 0, NULL, NULL)
#include "mg_model_host.h"

/* Tokens the unfused buffers need for a scan choice: every token of a call
 * when a call of that choice may run the sequential scan on long inputs,
 * else the calls that still take it (seqlen 1, or below the auto rule's
 * threshold) at the largest batch. */
static size_t split_tokens_for(int choice)
{
#if HAS_CHUNKED_FUSED
    if (choice == MODEL_SCAN_CHUNKED) return (size_t)MODEL_MAX_BATCH;
#if SCAN_MODE_ID == 1
    if (choice == MODEL_SCAN_SPEC) return (size_t)MODEL_MAX_BATCH;
#elif SCAN_MODE_ID == 2
    if (choice == MODEL_SCAN_SPEC) {
        const size_t len = SCAN_AUTO_MIN_LEN - 1 < MODEL_MAX_SEQ_LEN ? SCAN_AUTO_MIN_LEN - 1 : MODEL_MAX_SEQ_LEN;
        return (size_t)MODEL_MAX_BATCH * (len > 0 ? len : 1);
    }
#endif
#else
    (void)choice;
#endif
    return MAX_TOKENS;
}

/* (Re)allocates the unfused buffers for at least the tokens a scan choice
 * needs (never shrinks). The buffer it replaces stays allocated until
 * destroy: a decode graph captured before may still read it. */
static mg_status split_reserve(model_model *m, int choice)
{
    const size_t tokens = split_tokens_for(choice);
    if (m->split_ws && tokens <= m->split_tokens) return MG_OK;
    const size_t b_sc = ws_bytes(tokens * N_HEADS, sizeof(float));
    const size_t b_kq = ws_bytes(tokens * HN_DIM, sizeof(float));
    const size_t b_y = ws_bytes(tokens * D_INNER, sizeof(float));
    const size_t total = 3 * b_sc + 2 * b_kq + b_y;
    void *ws = NULL;
    mg_status s = mg_dev_alloc(&ws, total, MODEL_NAME " unfused-kernel workspace");
    if (s != MG_OK) return s;
    if (m->split_ws) {   /* the one it replaces stays until destroy; an older one goes */
        mg_dev_free(m->split_old);
        m->ws_total -= m->split_old_bytes;
        m->split_old = m->split_ws;
        m->split_old_bytes = m->split_bytes;
    }
    m->split_ws = ws;
    m->split_bytes = total;
    m->split_tokens = tokens;
    m->ws_total += total;
    char *p = (char *)ws;
    m->dt = (float *)p;  p += b_sc;
    m->adt = (float *)p; p += b_sc;
    m->lam = (float *)p; p += b_sc;
    m->k = (float *)p;   p += b_kq;
    m->q = (float *)p;   p += b_kq;
    m->y = (float *)p;
    return MG_OK;
}
#define ARCH_SET_SCAN(m, choice) split_reserve((m), (choice))

mg_status model_create(model_model **out, cudaStream_t stream)
{
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_create: model pointer is NULL");
    *out = NULL;
    if (mg_device_count() == 0)
        return mg_fail(MG_ERR_NO_DEVICE, MODEL_NAME "_create: no CUDA device");
    model_model *m = (model_model *)calloc(1, sizeof *m);
    if (!m) return mg_fail(MG_ERR_OUT_OF_MEMORY, MODEL_NAME "_create: out of host memory");
    m->stream = stream;
    mg_status s = mg_blas_create(&m->blas, stream);
    if (s != MG_OK) { free(m); return s; }
    if (GEMM_TF32 && (s = mg_blas_set_tf32(m->blas, 1)) != MG_OK) { mg_blas_destroy(m->blas); free(m); return s; }

    const size_t b_h = ws_bytes(MAX_TOKENS * D_MODEL, sizeof(float));
    const size_t b_hn = ws_bytes(MAX_TOKENS * D_MODEL, ACT_SIZE);
    const size_t b_proj = ws_bytes(MAX_TOKENS * NP_DIM, ACT_SIZE);
    const size_t b_g = ws_bytes(MAX_TOKENS * D_INNER, ACT_SIZE);
    const size_t b_seg = ws_bytes(SEG_WS_BYTES, 1);
    const size_t total = b_h + b_hn + b_proj + b_g + b_seg;
    s = mg_dev_alloc(&m->ws, total, MODEL_NAME " workspace");
    if (s != MG_OK) { mg_blas_destroy(m->blas); free(m); return s; }
#if LOWP
    s = mg_dev_alloc(&m->wa, (size_t)MODEL_WEIGHTS_FLOATS * ACT_SIZE, MODEL_NAME " " PRECISION_NAME " weights copy");
    if (s != MG_OK) { mg_dev_free(m->ws); mg_blas_destroy(m->blas); free(m); return s; }
#endif
    char *p = (char *)m->ws;
    m->h = (float *)p;   p += b_h;
    m->hn = p;           p += b_hn;
    m->proj = p;         p += b_proj;
    m->g = p;            p += b_g;
    m->seg_ws = SEG_WS_BYTES ? p : NULL;
    m->scan_choice = MODEL_SCAN_SPEC;
    m->sms = mg_device_sms();
    m->ws_total = total + (LOWP ? (size_t)MODEL_WEIGHTS_FLOATS * ACT_SIZE : 0);
    s = split_reserve(m, MODEL_SCAN_SPEC);
    if (s != MG_OK) { mg_dev_free(m->wa); mg_dev_free(m->ws); mg_blas_destroy(m->blas); free(m); return s; }
    if ((s = model_register(m)) != MG_OK) return s;
    *out = m;
    return MG_OK;
}

mg_status model__convert_weights(model_model *m)
{
    MODEL_LIVE(m, MODEL_NAME "__convert_weights");
    if (!m->w) return mg_fail(MG_ERR_STATE, MODEL_NAME "__convert_weights: no weights set (" MODEL_NAME "_set_weights)");
#if LOWP
    MG_CUDA(MG_LAUNCH(convert)(m->w, m->wa, (size_t)MODEL_WEIGHTS_FLOATS, m->stream));
#endif
    return MG_OK;
}

#if HAS_CHUNKED_FUSED
/* Segments per sequence of the fused scan for a batch: 1 (whole sequences,
 * one block per (sequence, head)) while batch x H blocks fill the device
 * (FUSED_MIN_BLOCKS per SM), else as many as bring the blocks up to that;
 * the launcher clamps it to the chunks and to the workspace's slots. */
static int fused_segments(const model_model *m, int batch)
{
    const int blocks = batch * N_HEADS, target = FUSED_MIN_BLOCKS * m->sms;
    const int nseg = target / blocks;
    return nseg >= 2 ? nseg : 1;
}
#endif

#if HAS_CHUNKED
/* Which scan a prefill of seqlen tokens uses (decode: always sequential). */
static int use_chunked(const model_model *m, int seqlen)
{
    if (m->scan_choice == MODEL_SCAN_SEQUENTIAL) return 0;
    if (m->scan_choice == MODEL_SCAN_CHUNKED) return 1;
#if SCAN_MODE_ID == 1
    return seqlen >= 2;
#else
    return seqlen >= SCAN_AUTO_MIN_LEN;
#endif
}
#endif

size_t model_ssm_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * SSM_PER_SEQ : 0;
}

size_t model_k_prev_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * KPREV_PER_SEQ : 0;
}

size_t model_v_prev_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * VPREV_PER_SEQ : 0;
}

size_t model_angle_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * ANGLE_PER_SEQ : 0;
}

/* Checks shared by prefill, burn_in, decode_step and decode_graph_create; fn
 * names the caller in messages.
 * st[4] = ssm, k_prev, v_prev, angle. */
static mg_status check_call(const model_model *m, const char *fn, int batch, int seqlen,
                            const float *u, const float *out, const float *const st[4],
                            int states_required)
{
    static const char *const st_name[4] = { "ssm", "k_prev", "v_prev", "angle" };
    MODEL_LIVE(m, fn);
    if (!m->w) return mg_fail(MG_ERR_STATE, "%s: no weights set (" MODEL_NAME "_set_weights)", fn);
    if (batch < 1 || batch > MODEL_MAX_BATCH)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch = %d is out of range 1..%d", fn, batch, MODEL_MAX_BATCH);
    if (seqlen < 1 || seqlen > MODEL_MAX_SEQ_LEN)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: seqlen = %d is out of range 1..%d", fn, seqlen, MODEL_MAX_SEQ_LEN);
    if (!u) return mg_fail(MG_ERR_INVALID_ARG, "%s: u is NULL", fn);
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, "%s: out is NULL", fn);
    int given = 0;
    for (int i = 0; i < 4; ++i) given += st[i] != NULL;
    if (states_required && given != 4)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: the four states are required (got ssm %s, k_prev %s, v_prev %s, angle %s)",
                       fn, st[0] ? "set" : "NULL", st[1] ? "set" : "NULL", st[2] ? "set" : "NULL",
                       st[3] ? "set" : "NULL");
    if (given != 0 && given != 4)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: ssm, k_prev, v_prev and angle must all be given or all be NULL "
                       "(got ssm %s, k_prev %s, v_prev %s, angle %s)",
                       fn, st[0] ? "set" : "NULL", st[1] ? "set" : "NULL", st[2] ? "set" : "NULL",
                       st[3] ? "set" : "NULL");
    if (!mg_aligned(u, 16)) return mg_fail(MG_ERR_ALIGNMENT, "%s: u %p is not 16-byte aligned", fn, (const void *)u);
    if (!mg_aligned(out, 16)) return mg_fail(MG_ERR_ALIGNMENT, "%s: out %p is not 16-byte aligned", fn, (const void *)out);
    for (int i = 0; i < 4; ++i)
        if (st[i] && !mg_aligned(st[i], 16))
            return mg_fail(MG_ERR_ALIGNMENT, "%s: %s state %p is not 16-byte aligned", fn, st_name[i],
                           (const void *)st[i]);
    return MG_OK;
}

/* One decode step of batch <= DEC_MAX_BATCH sequences (seqlen 1; arguments
 * checked, states all NULL or all set): per layer the in_proj GEMV with the
 * input RMSNorm fused, the fused mixer (prep, angles, one scan step, gate;
 * the states in place) and the out_proj GEMV into the residual
 * (mg_m3_decode.cuh), instead of the prefill kernels at one token and cuBLAS
 * at M = batch. Only launches on the model's stream, into its fixed
 * workspace: capturable, so the decode graph replays exactly this path. The
 * input projection (f32, any input_dim) is the prefill's; without one,
 * layer 0 reads u where prefill copies it to h first. norm_f is the
 * prefill's row kernel behind the decode chain's wait
 * (MG_LAUNCH(decode_norm_f)). */
static mg_status decode_forward(model_model *m, int batch, const float *u, float *out, float *ssm, float *kp,
                                float *vp, float *ang, const unsigned char *reset)
{
    const cudaStream_t st = m->stream;
    const float *w = m->w;
    const char *wg = (const char *)model__gemm_weights(m);   /* GEMV weights, ACT elements */
#if HAS_INPUT_PROJ
    MG_CUDA(MG_LAUNCH(bias_rows)(m->h, w + OFF_INPUT_PROJ_B, batch, st));
    const mg_status si = mg_linear(m->blas, batch, D_MODEL, IN_DIM, MG_F32, u, IN_DIM,
                                   w + OFF_INPUT_PROJ_W, IN_DIM, MG_F32, m->h, D_MODEL, 1.0f, 1.0f);
    if (si != MG_OK) return si;
    const float *h0 = m->h;
#else
    const float *h0 = u;   /* layer 0 reads the input in place: no copy h = u */
#endif
    for (int l = 0; l < N_LAYERS; ++l) {
        const size_t lo = (size_t)l * LAYER_STRIDE;   /* layer l's blob offset */
        const size_t sb = (size_t)l * (size_t)batch;  /* layer l's first state row */
        const float *hin = l == 0 ? h0 : m->h;   /* the residual stream entering layer l */
        MG_CUDA(MG_LAUNCH(decode_in_proj)(batch, hin, w + lo + L0_NORM_W, wg + (lo + L0_IN_PROJ_W) * ACT_SIZE,
                                          m->proj, st));
        MG_CUDA(MG_LAUNCH(decode_mixer)(batch, m->proj, w + lo + L0_DT_BIAS, w + lo + L0_B_NORM_W,
                                        w + lo + L0_C_NORM_W, w + lo + L0_B_BIAS, w + lo + L0_C_BIAS, w + lo + L0_D,
#if OUTPROJ_NORM
                                        w + lo + L0_NORM_GATE_W,
#else
                                        NULL,
#endif
                                        ssm ? ssm + sb * SSM_PER_SEQ : NULL, kp ? kp + sb * KPREV_PER_SEQ : NULL,
                                        vp ? vp + sb * VPREV_PER_SEQ : NULL, ang ? ang + sb * ANGLE_PER_SEQ : NULL,
                                        m->g, reset, st));
        MG_CUDA(MG_LAUNCH(decode_out_proj)(batch, m->g, wg + (lo + L0_OUT_PROJ_W) * ACT_SIZE, hin, m->h, st));
    }
    MG_CUDA(MG_LAUNCH(decode_norm_f)(batch, m->h, w + OFF_NORM_F_W, out, st));
    return MG_OK;
}

/* The forward over batch x seqlen tokens (arguments already checked; the
 * states are all NULL or all set). last_only (burn-in): out is [batch][D],
 * the last token of each sequence: the last layer's out_proj and norm_f run
 * on those rows only. reset [batch] (device, NULL: none; decode only): the
 * sequences whose entry is nonzero start from zero states; the kernels that
 * load a state read it (no launch of its own, so a decode graph replays it
 * with whatever mask the buffer holds). Decode never takes the chunked or
 * fused kernels, which therefore do not take it. start [batch][seqlen]
 * (device, NULL: none; prefill_starts and burn_in_starts): episode starts
 * (doc/math.md section 9), read by every kernel that carries a state
 * across tokens (angles, the sequential, chunked and fused scans), on
 * every path of the scan choice. forward() is forward_ex without starts
 * (mg_model_host.h calls it). */
static mg_status forward_ex(model_model *m, int batch, int seqlen, const float *u, float *out,
                            float *ssm, float *kp, float *vp, float *ang, int last_only, int decode,
                            const unsigned char *reset, const unsigned char *start)
{
    /* a decode step within the GEMV batch: the single-token kernels */
    if (decode && seqlen == 1 && !last_only && batch <= DEC_MAX_BATCH)
        return decode_forward(m, batch, u, out, ssm, kp, vp, ang, reset);
    const int tokens = batch * seqlen;
    const float *w = m->w;
    const char *wg = (const char *)model__gemm_weights(m);   /* GEMM weights, ACT elements */
#if HAS_CHUNKED
    const int chunked = !decode && use_chunked(m, seqlen);
#else
    (void)decode;
#endif
    const cudaStream_t st = m->stream;
    mg_status s;

#if HAS_INPUT_PROJ
    /* Residual stream: h = u . input_proj.weight^T + input_proj.bias. */
    MG_CUDA(MG_LAUNCH(bias_rows)(m->h, w + OFF_INPUT_PROJ_B, tokens, st));
    s = mg_linear(m->blas, tokens, D_MODEL, IN_DIM, MG_F32, u, IN_DIM, w + OFF_INPUT_PROJ_W, IN_DIM,
                  MG_F32, m->h, D_MODEL, 1.0f, 1.0f);
    if (s != MG_OK) return s;
#else
    /* Residual stream: h = u (identity input projection). */
    MG_CUDA(cudaMemcpyAsync(m->h, u, (size_t)tokens * D_MODEL * sizeof(float), cudaMemcpyDeviceToDevice, st));
#endif

    for (int l = 0; l < N_LAYERS; ++l) {
        const float *lw = w + (size_t)l * LAYER_STRIDE;
        const char *lg = wg + (size_t)l * LAYER_STRIDE * ACT_SIZE;
#define GW(off) ((const void *)(lg + (off) * ACT_SIZE))
        const size_t lb = (size_t)l * (size_t)batch;
        float *ssm_l = ssm ? ssm + lb * SSM_PER_SEQ : NULL;
        float *kp_l = kp ? kp + lb * KPREV_PER_SEQ : NULL;
        float *vp_l = vp ? vp + lb * VPREV_PER_SEQ : NULL;
        float *ang_l = ang ? ang + lb * ANGLE_PER_SEQ : NULL;

        /* hn = rmsnorm(h) * norm.weight */
        MG_CUDA(MG_LAUNCH(rmsnorm)(m->h, lw + L0_NORM_W, m->hn, 0, tokens, st));
        /* proj = hn . in_proj.weight^T   [tokens][NP_DIM] */
        s = mg_linear(m->blas, tokens, NP_DIM, D_MODEL, ACT, m->hn, D_MODEL, GW(L0_IN_PROJ_W), D_MODEL,
                      ACT, m->proj, NP_DIM, 1.0f, 0.0f);
        if (s != MG_OK) return s;
#if HAS_CHUNKED_FUSED
        /* chunked: the whole SSM core in one kernel, proj -> g; the four
         * states carried */
        if (chunked) {
#if OUTPROJ_NORM
            const float *ngw = lw + L0_NORM_GATE_W;
#else
            const float *ngw = NULL;
#endif
            MG_CUDA(MG_LAUNCH(scan_fused)(batch, seqlen, fused_segments(m, batch), m->seg_ws, m->proj, lw + L0_DT_BIAS, lw + L0_B_NORM_W, lw + L0_C_NORM_W,
                                          lw + L0_B_BIAS, lw + L0_C_BIAS, lw + L0_D, ngw, ssm_l, kp_l, vp_l, ang_l,
                                          ssm_l, kp_l, vp_l, ang_l, m->g, start, st));
        } else {
#endif
        /* (the unfused buffers are sized for every call that gets here) */
        if ((size_t)tokens > m->split_tokens)
            return mg_fail(MG_ERR_STATE, MODEL_NAME ": %d tokens for the unfused kernels' workspace of %zu",
                           tokens, m->split_tokens);
        /* dt, A*dt, lambda; k, q = BCNorm + per-head bias (unrotated) */
        MG_CUDA(MG_LAUNCH(prep)(tokens, m->proj, lw + L0_DT_BIAS, lw + L0_B_NORM_W, lw + L0_C_NORM_W,
                           lw + L0_B_BIAS, lw + L0_C_BIAS, m->dt, m->adt, m->lam, m->k, m->q, st));
        /* theta recurrence, rotary of k and q in place; angle state carried */
        MG_CUDA(MG_LAUNCH(angles)(batch, seqlen, m->proj, m->dt, ang_l, ang_l, m->k, m->q, reset, start, st));
        /* y = SSM(...); ssm, k_prev, v_prev states carried */
#if HAS_CHUNKED
        if (chunked)
            MG_CUDA(MG_LAUNCH(scan_chunked)(batch, seqlen, m->proj, m->k, m->q, m->dt, m->adt, m->lam,
                                       lw + L0_D, ssm_l, kp_l, vp_l, ssm_l, kp_l, vp_l, m->y, start, st));
        else
#endif
        MG_CUDA(MG_LAUNCH(scan)(batch, seqlen, m->proj, m->k, m->q, m->dt, m->adt, m->lam, lw + L0_D,
                           ssm_l, kp_l, vp_l, ssm_l, kp_l, vp_l, m->y, reset, start, st));
        /* g = gate(y, z) */
#if OUTPROJ_NORM
        MG_CUDA(MG_LAUNCH(gate)(tokens, m->y, m->proj, lw + L0_NORM_GATE_W, m->g, st));
#else
        MG_CUDA(MG_LAUNCH(gate)(tokens, m->y, m->proj, NULL, m->g, st));
#endif
#if HAS_CHUNKED_FUSED
        }
#endif
        /* h += g . out_proj.weight^T (burn-in, last layer: the last token's rows only,
         * row b*seqlen + seqlen-1, through the leading dimensions) */
        if (last_only && l == N_LAYERS - 1)
            s = mg_linear(m->blas, batch, D_MODEL, D_INNER, ACT,
                          (const char *)m->g + (size_t)(seqlen - 1) * D_INNER * ACT_SIZE, seqlen * D_INNER,
                          GW(L0_OUT_PROJ_W), D_INNER, MG_F32, m->h + (size_t)(seqlen - 1) * D_MODEL,
                          seqlen * D_MODEL, 1.0f, 1.0f);
        else
            s = mg_linear(m->blas, tokens, D_MODEL, D_INNER, ACT, m->g, D_INNER, GW(L0_OUT_PROJ_W), D_INNER,
                          MG_F32, m->h, D_MODEL, 1.0f, 1.0f);
        if (s != MG_OK) return s;
#undef GW
    }
    /* out = rmsnorm(h) * norm_f.weight (f32); burn-in: last rows only */
    if (last_only)
        MG_CUDA(MG_LAUNCH(rmsnorm_rows)(m->h, w + OFF_NORM_F_W, out, batch, seqlen, seqlen - 1, st));
    else
        MG_CUDA(MG_LAUNCH(rmsnorm)(m->h, w + OFF_NORM_F_W, out, 1, tokens, st));
    return MG_OK;
}

static mg_status forward(model_model *m, int batch, int seqlen, const float *u, float *out,
                         float *ssm, float *kp, float *vp, float *ang, int last_only, int decode,
                         const unsigned char *reset)
{
    return forward_ex(m, batch, seqlen, u, out, ssm, kp, vp, ang, last_only, decode, reset, NULL);
}

/* A start mask the device cannot read (unregistered host memory, or no
 * pointer CUDA knows) would fault the kernels: refused before any launch
 * (a host-side lookup, as check_reset does for the decode step's mask). */
static mg_status check_starts(const char *fn, const unsigned char *start)
{
    if (!start) return MG_OK;
    struct cudaPointerAttributes a;
    const cudaError_t ce = cudaPointerGetAttributes(&a, start);
    if (ce != cudaSuccess) (void)cudaGetLastError();   /* not sticky: clear it for the next call */
    if (ce != cudaSuccess || a.type == cudaMemoryTypeUnregistered)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: start mask %p is not memory the device can read (pass device "
                       "memory, or cudaHostRegister it)", fn, (const void *)start);
    return MG_OK;
}

/* prefill and burn_in (and their _starts forms): the arguments checked
 * (states optional), then the forward over the whole sequence; last_only:
 * burn_in's last-step output; start: the episode-start mask or NULL. */
static mg_status checked_forward(model_model *m, const char *fn, int batch, int seqlen, const float *u,
                                 float *out, float *ssm, float *k_prev, float *v_prev, float *angle,
                                 int last_only, const unsigned char *start)
{
    const float *const st[4] = { ssm, k_prev, v_prev, angle };
    mg_status s = check_call(m, fn, batch, seqlen, u, out, st, 0);
    if (s == MG_OK) s = check_starts(fn, start);
    if (s != MG_OK) return s;
    return forward_ex(m, batch, seqlen, u, out, ssm, k_prev, v_prev, angle, last_only, 0, NULL, start);
}

mg_status model_prefill(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                      float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    return checked_forward(m, MODEL_NAME "_prefill", batch, seqlen, d_u, d_out, d_ssm, d_k_prev, d_v_prev,
                           d_angle, 0, NULL);
}

mg_status model_prefill_starts(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                             float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle,
                             const unsigned char *d_start)
{
    return checked_forward(m, MODEL_NAME "_prefill_starts", batch, seqlen, d_u, d_out, d_ssm, d_k_prev,
                           d_v_prev, d_angle, 0, d_start);
}

mg_status model_burn_in(model_model *m, int batch, int seqlen, const float *d_u, float *d_last_out,
                      float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    return checked_forward(m, MODEL_NAME "_burn_in", batch, seqlen, d_u, d_last_out, d_ssm, d_k_prev, d_v_prev,
                           d_angle, 1, NULL);
}

mg_status model_burn_in_starts(model_model *m, int batch, int seqlen, const float *d_u, float *d_last_out,
                             float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle,
                             const unsigned char *d_start)
{
    return checked_forward(m, MODEL_NAME "_burn_in_starts", batch, seqlen, d_u, d_last_out, d_ssm, d_k_prev,
                           d_v_prev, d_angle, 1, d_start);
}

/* One token per stream: the single-token kernels up to DEC_MAX_BATCH
 * streams (decode_forward), else the prefill path with seqlen = 1; either
 * agrees with prefill to GEMM rounding. */
mg_status model_decode_step(model_model *m, int batch, const float *d_u, float *d_out,
                          float *d_ssm, float *d_k_prev, float *d_v_prev, float *d_angle)
{
    const float *const st[4] = { d_ssm, d_k_prev, d_v_prev, d_angle };
    mg_status s = check_call(m, MODEL_NAME "_decode_step", batch, 1, d_u, d_out, st, 1);
    if (s != MG_OK) return s;
    return forward(m, batch, 1, d_u, d_out, d_ssm, d_k_prev, d_v_prev, d_angle, 0, 1, NULL);
}

/* ======================================================================
 * Self-check against the f64 reference (runtime/mg_ref_mamba3).
 * ====================================================================== */

static void ref_dims(mg_m3_dims *dd)
{
    memset(dd, 0, sizeof *dd);
    dd->d_model = D_MODEL;
    dd->n_layers = N_LAYERS;
    dd->d_state = D_STATE;
    dd->d_inner = D_INNER;
    dd->headdim = HEADDIM;
    dd->nheads = N_HEADS;
    dd->ngroups = N_GROUPS;
    dd->n_angles = N_ANGLES;
    dd->input_dim = INPUT_DIM;
    dd->norm_eps = NORM_EPS;
    dd->a_floor = A_FLOOR;
    dd->a_activation = A_ACTIVATION;
    dd->outproj_norm = OUTPROJ_NORM_BOOL;
}

/* The generated parameter table and pipeline offsets must equal the
 * reference's independently computed layout (mg_ref_mamba3_params). */
static mg_status layout_agrees(const mg_m3_dims *dims, const mg_m3_layout *lay)
{
    if (lay->total != (size_t)MODEL_WEIGHTS_FLOATS)
        return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": blob size %zu floats, reference layout says %zu",
                       (size_t)MODEL_WEIGHTS_FLOATS, lay->total);
    mg_m3_param ref[MODEL_N_PARAMS];
    size_t count = 0;
    mg_status s = mg_ref_mamba3_params(dims, lay, ref, MODEL_N_PARAMS, &count);
    if (s != MG_OK) return s;
    if (count != MODEL_N_PARAMS)
        return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": %d parameters, reference layout has %zu",
                       MODEL_N_PARAMS, count);
    for (int i = 0; i < MODEL_N_PARAMS; ++i) {
        const model_param_info *p = &model_params[i];
        if (strcmp(p->name, ref[i].name) != 0 || p->offset != ref[i].offset || p->numel != ref[i].numel ||
            p->ndim != ref[i].ndim)
            return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": parameter %d is %s at %zu (%zu floats), reference says %s at %zu (%zu floats)",
                           i, p->name, p->offset, p->numel, ref[i].name, ref[i].offset, ref[i].numel);
        for (int k = 0; k < p->ndim; ++k)
            if ((long)p->shape[k] != ref[i].shape[k])
                return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": %s dim %d is %d, reference says %ld",
                               p->name, k, p->shape[k], ref[i].shape[k]);
    }
    for (int l = 0; l < N_LAYERS; ++l) {
        const mg_m3_layer_off *lo = &lay->layers[l];
        const size_t b = (size_t)l * LAYER_STRIDE;
        if (lo->norm_w != b + L0_NORM_W || lo->in_proj_w != b + L0_IN_PROJ_W ||
            lo->dt_bias != b + L0_DT_BIAS || lo->B_norm_w != b + L0_B_NORM_W ||
            lo->C_norm_w != b + L0_C_NORM_W || lo->B_bias != b + L0_B_BIAS ||
            lo->C_bias != b + L0_C_BIAS || lo->D != b + L0_D ||
#if OUTPROJ_NORM
            lo->norm_gate_w != b + L0_NORM_GATE_W ||
#endif
            lo->out_proj_w != b + L0_OUT_PROJ_W)
            return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": layer %d offsets differ from the reference layout", l);
    }
#if HAS_INPUT_PROJ
    if (lay->input_proj_w != OFF_INPUT_PROJ_W || lay->input_proj_b != OFF_INPUT_PROJ_B)
        return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": input_proj offsets differ from the reference layout");
#endif
    if (lay->norm_f_w != OFF_NORM_F_W)
        return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": norm_f offset differs from the reference layout");
    return MG_OK;
}

mg_status model_selfcheck(const model_check_opts *opts, model_check_report *rep)
{
    model_check_opts o = { 0, 0, 1234u, 1, 0.0 };
    if (opts) o = *opts;
    if (o.batch == 0) o.batch = MODEL_MAX_BATCH < 2 ? MODEL_MAX_BATCH : 2;
    if (o.seqlen == 0) o.seqlen = MODEL_MAX_SEQ_LEN < 16 ? MODEL_MAX_SEQ_LEN : 16;
    if (o.tol <= 0.0) o.tol = MODEL_CHECK_TOL;
    model_check_report r;
    memset(&r, 0, sizeof r);
    r.tol = o.tol;
    if (rep) *rep = r;
    if (o.batch < 1 || o.batch > MODEL_MAX_BATCH || o.seqlen < 1 || o.seqlen > MODEL_MAX_SEQ_LEN)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_selfcheck: batch %d / seqlen %d out of range 1..%d / 1..%d",
                       o.batch, o.seqlen, MODEL_MAX_BATCH, MODEL_MAX_SEQ_LEN);
    if (mg_device_count() == 0) return mg_fail(MG_ERR_NO_DEVICE, MODEL_NAME "_selfcheck: no CUDA device");

    mg_m3_dims dims;
    ref_dims(&dims);
    mg_m3_layout lay;
    memset(&lay, 0, sizeof lay);
    mg_status s = mg_ref_mamba3_layout(&dims, &lay);
    if (s != MG_OK) return s;

    const size_t n_u = (size_t)o.batch * o.seqlen * IN_DIM;
    const size_t n_out = (size_t)o.batch * o.seqlen * D_MODEL;
    size_t n_st[4];
    n_st[0] = model_ssm_state_floats(o.batch);
    n_st[1] = model_k_prev_state_floats(o.batch);
    n_st[2] = model_v_prev_state_floats(o.batch);
    n_st[3] = model_angle_state_floats(o.batch);
    float *blob = NULL, *u = NULL, *out = NULL, *hst[4] = { NULL, NULL, NULL, NULL };
    double *rout = NULL, *rst[4] = { NULL, NULL, NULL, NULL };
    float *d_blob = NULL, *d_u = NULL, *d_out = NULL, *d_st[4] = { NULL, NULL, NULL, NULL };
    model_model *m = NULL;
    int i;

    s = layout_agrees(&dims, &lay);
    if (s != MG_OK) goto done;

    blob = (float *)malloc((size_t)MODEL_WEIGHTS_FLOATS * sizeof(float));
    u = (float *)malloc(n_u * sizeof(float));
    out = (float *)malloc(n_out * sizeof(float));
    rout = (double *)malloc(n_out * sizeof(double));
    s = (blob && u && out && rout) ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    for (i = 0; i < 4; ++i) {
        hst[i] = (float *)malloc(n_st[i] * sizeof(float));
        rst[i] = (double *)malloc(n_st[i] * sizeof(double));
        if (!hst[i] || !rst[i]) s = MG_ERR_OUT_OF_MEMORY;
    }
    if (s != MG_OK) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, MODEL_NAME "_selfcheck: out of host memory");
        goto done;
    }
    s = mg_ref_mamba3_init(&dims, &lay, blob, o.seed);
    if (s != MG_OK) goto done;
    mg_rng rng;
    mg_rng_seed(&rng, o.seed ^ 0x9e3779b97f4a7c15ull);
    mg_rng_fill_normal(&rng, u, n_u, 0.0f, 1.0f);
    if (o.with_state) {
        mg_rng_fill_normal(&rng, hst[0], n_st[0], 0.0f, 0.5f);
        mg_rng_fill_normal(&rng, hst[1], n_st[1], 0.0f, 0.5f);
        mg_rng_fill_normal(&rng, hst[2], n_st[2], 0.0f, 0.5f);
        mg_rng_fill_uniform(&rng, hst[3], n_st[3], 0.0f, 6.28f);
    }
    for (i = 0; i < 4; ++i)
        for (size_t j = 0; j < n_st[i]; ++j) rst[i][j] = o.with_state ? hst[i][j] : 0.0;

    /* GPU */
    if ((s = mg_dev_alloc((void **)&d_blob, (size_t)MODEL_WEIGHTS_FLOATS * sizeof(float), "selfcheck weights")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_u, n_u * sizeof(float), "selfcheck u")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_out, n_out * sizeof(float), "selfcheck out")) != MG_OK)
        goto done;
    for (i = 0; i < 4; ++i)
        if ((s = mg_dev_alloc((void **)&d_st[i], n_st[i] * sizeof(float), "selfcheck state")) != MG_OK) goto done;
    cudaError_t ce = cudaMemcpy(d_blob, blob, (size_t)MODEL_WEIGHTS_FLOATS * sizeof(float), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(d_u, u, n_u * sizeof(float), cudaMemcpyHostToDevice);
    for (i = 0; i < 4 && ce == cudaSuccess && o.with_state; ++i)
        ce = cudaMemcpy(d_st[i], hst[i], n_st[i] * sizeof(float), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) { s = mg_cuda_check(ce, MODEL_NAME "_selfcheck: upload"); goto done; }
    if ((s = model_create(&m, 0)) != MG_OK) goto done;
    if ((s = model_set_weights(m, d_blob, (size_t)MODEL_WEIGHTS_FLOATS)) != MG_OK) goto done;
    if (o.with_state)
        s = model_prefill(m, o.batch, o.seqlen, d_u, d_out, d_st[0], d_st[1], d_st[2], d_st[3]);
    else
        s = model_prefill(m, o.batch, o.seqlen, d_u, d_out, NULL, NULL, NULL, NULL);
    if (s != MG_OK) goto done;
    ce = cudaStreamSynchronize(0);
    if (ce == cudaSuccess) ce = cudaMemcpy(out, d_out, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    for (i = 0; i < 4 && ce == cudaSuccess && o.with_state; ++i)
        ce = cudaMemcpy(hst[i], d_st[i], n_st[i] * sizeof(float), cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess) { s = mg_cuda_check(ce, MODEL_NAME "_selfcheck: prefill"); goto done; }

    /* Reference */
    if (o.with_state)
        s = mg_ref_mamba3_forward(&dims, &lay, blob, o.batch, o.seqlen, u, rout, rst[0], rst[1], rst[2], rst[3]);
    else
        s = mg_ref_mamba3_forward(&dims, &lay, blob, o.batch, o.seqlen, u, rout, NULL, NULL, NULL, NULL);
    if (s != MG_OK) goto done;

    r.out = mg_compare_f32(out, rout, n_out);
    r.passed = mg_err_ok(&r.out, o.tol);
    if (o.with_state) {
        /* Frame-invariant (mg_ref_mamba3_compare_states): ssm and k_prev
         * each turned back by its own side's final angle, the angle on the
         * circle (an angle near 0 and one near 2pi are the same rotation;
         * rel_l2 is the rms angular error over that of a uniform angle). */
        mg_err e[4];
        mg_ref_mamba3_compare_states(&dims, o.batch, (const float *const *)hst, (const double *const *)rst, NULL, e);
        r.ssm = e[0];
        r.k_prev = e[1];
        r.v_prev = e[2];
        r.angle = e[3];
        r.passed = r.passed && mg_err_ok(&r.ssm, o.tol) && mg_err_ok(&r.k_prev, o.tol) &&
                   mg_err_ok(&r.v_prev, o.tol) && mg_err_ok(&r.angle, o.tol);
    }
    if (rep) *rep = r;
    if (!r.passed)
        s = mg_fail(MG_ERR_MISMATCH, MODEL_NAME "_selfcheck: rel_l2 out %.3g, ssm %.3g, k_prev %.3g, v_prev %.3g, angle %.3g (tol %.3g)",
                    r.out.rel_l2, r.ssm.rel_l2, r.k_prev.rel_l2, r.v_prev.rel_l2, r.angle.rel_l2, o.tol);

done:
    model_destroy(m);
    mg_dev_free(d_blob); mg_dev_free(d_u); mg_dev_free(d_out);
    free(blob); free(u); free(out); free(rout);
    for (i = 0; i < 4; ++i) { mg_dev_free(d_st[i]); free(hst[i]); free(rst[i]); }
    mg_ref_mamba3_layout_free(&lay);
    return s;
}
