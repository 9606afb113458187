/* pipeline.h (emitted as mg_m1_pipeline.h): the host pipeline of a Mamba-1
 * library, the body of NAME.c. It names no model: NAME.c defines, before
 * including it once, this model's constants (dimensions, blob offsets,
 * launch sizes), its parameter table, and the names the pipeline uses:
 * model_X is NAME_X, MODEL_X is NAME_X in capitals, MODEL_NAME "NAME" (for
 * messages), and the spec values quoted in messages. What every arch's
 * pipeline does the same way (setters, destructor, the decode graph) is
 * mg_model_host.h, included below with this arch's states. Plain C11; what the
 * pipeline does is described at the top of NAME.c. */

/* ---- The model: stream, cuBLAS handle, borrowed weights, fixed workspace ---- */
struct model_model {
    cudaStream_t stream;
    mg_blas *blas;
    const float *w;     /* borrowed weights blob; NULL until set_weights */
    void *ws;           /* one device allocation holding every buffer below */
    float *h;           /* [MAX_TOKENS][D_MODEL]  residual stream (f32) */
    void *hn;           /* [MAX_TOKENS][D_MODEL]  normed input of in_proj */
    void *xz;           /* [MAX_TOKENS][2E] in_proj output: x | z */
    void *xc;           /* [MAX_TOKENS][D_INNER]  conv + SiLU output */
    void *dbl;          /* [MAX_TOKENS][XP_DIM] x_proj output: dt_low | B | C */
    void *dt;           /* [MAX_TOKENS][D_INNER]  dt_proj output (before bias, softplus) */
    void *g;            /* [MAX_TOKENS][D_INNER]  gated scan output, input of out_proj */
    float *cstate;      /* chunked scan: chunk states [MAX_BATCH][MAX_CHUNKS][E][N] (NULL without) */
    float *dsum;        /* chunked scan: per-chunk sum of delta [MAX_BATCH][MAX_CHUNKS][E] */
    float *dpart;       /* fused decode: x_proj partials [MAX_BATCH][CONV_BLOCKS][XP_DIM] */
    int decode_fused;   /* decode path: MODEL_DECODE_UNFUSED | _FUSED | _SINGLE (MODEL_DECODE_DEFAULT) */
    int decode_tile;    /* single-launch decode: streams per cluster, 0 = per call (decode_tile_for) */
    int decode_clusters;   /* single-launch decode clusters the device runs at once (0: unknown) */
    void *wa;           /* low-precision copy of the blob (act elements, blob offsets); NULL for f32 */
    int scan_choice;    /* MODEL_SCAN_SPEC | _SEQUENTIAL | _CHUNKED */
    int cxp_max_tokens; /* prefill calls of at most this many tokens: fused conv + x_proj (0: never) */
    unsigned long long serial;   /* unique per model of the process (decode graphs check it) */
    size_t ws_total;    /* device bytes held: ws (+ wa) + pk */
    int sms;            /* multiprocessors of the device (scan.mode auto picks the scan with it) */
    /* packed sequences (mg_model_host.h): one allocation pk holding the
     * padded input and output, the start mask and the offsets */
    void *pk;
    float *pk_u, *pk_out;
    unsigned char *pk_start;
    int *pk_off;
    int *pk_idx;                    /* [MAX_BATCH] sequence order by length (prefill_packed_from) */
    float *pk_st[4];                /* MAX_BATCH rows of each of its (up to 4) states (prefill_packed_from) */
};

/* The arch's checks and forward, for the common part (mg_model_host.h). */
static mg_status check_call(const model_model *m, const char *fn, int batch, int seqlen,
                            const float *u, const float *out, const float *cs, const float *ss,
                            int states_required);
static mg_status forward(model_model *m, int batch, int seqlen, const float *u, float *out,
                         float *cs, float *ss, int last_only, int decode, const unsigned char *reset);
#define STATE_PARAMS float *d_conv_state, float *d_ssm_state
#define STATE_ARGS d_conv_state, d_ssm_state
#define NO_STATES NULL, NULL
#define CHECK_STATES(fn, batch, seqlen, u, out, required) \
    check_call(m, fn, batch, seqlen, u, out, d_conv_state, d_ssm_state, required)
static mg_status forward_starts(model_model *m, int batch, int seqlen, const float *u, float *out,
                                float *cs, float *ss, int last_only, int decode, const unsigned char *reset,
                                const unsigned char *start);
#define N_STATES 2
#define STATE_SIZES(batch) { model_conv_state_floats(batch), model_ssm_state_floats(batch) }
#define FORWARD_STARTS(batch, seqlen, u, out, start) \
    forward_starts(m, batch, seqlen, u, out, d_conv_state, d_ssm_state, 0, 0, NULL, start)
#define FORWARD_ON(batch, seqlen, u, out, sp) \
    forward_starts(m, batch, seqlen, u, out, (sp)[0], (sp)[1], 0, 0, NULL, NULL)
#include "mg_model_host.h"

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
    const size_t b_xz = ws_bytes(MAX_TOKENS * XZ_DIM, ACT_SIZE);
    const size_t b_e = ws_bytes(MAX_TOKENS * D_INNER, ACT_SIZE);
    const size_t b_dbl = ws_bytes(MAX_TOKENS * XP_DIM, ACT_SIZE);
    const size_t b_cst = ws_bytes(CSTATE_FLOATS, sizeof(float));
    const size_t b_dsum = ws_bytes(DSUM_FLOATS, sizeof(float));
    const size_t b_dpart = ws_bytes(DEC_PART_FLOATS, sizeof(float));
    const size_t total = b_h + b_hn + b_xz + 3 * b_e + b_dbl + b_cst + b_dsum + b_dpart;
    s = mg_dev_alloc(&m->ws, total, MODEL_NAME " workspace");
    if (s != MG_OK) { mg_blas_destroy(m->blas); free(m); return s; }
#if LOWP
    s = mg_dev_alloc(&m->wa, (size_t)MODEL_WEIGHTS_FLOATS * ACT_SIZE, MODEL_NAME " " MODEL_PRECISION " weights copy");
    if (s != MG_OK) { mg_dev_free(m->ws); mg_blas_destroy(m->blas); free(m); return s; }
#endif
    char *p = (char *)m->ws;
    m->h = (float *)p;   p += b_h;
    m->hn = p;           p += b_hn;
    m->xz = p;           p += b_xz;
    m->xc = p;           p += b_e;
    m->dbl = p;          p += b_dbl;
    m->dt = p;           p += b_e;
    m->g = p;            p += b_e;
    m->cstate = CSTATE_FLOATS ? (float *)p : NULL;  p += b_cst;
    m->dsum = DSUM_FLOATS ? (float *)p : NULL;  p += b_dsum;
    m->dpart = (float *)p;
    m->ws_total = total + (LOWP ? (size_t)MODEL_WEIGHTS_FLOATS * ACT_SIZE : 0);
    m->decode_fused = MODEL_DECODE_DEFAULT;
    m->scan_choice = MODEL_SCAN_SPEC;
    m->cxp_max_tokens = MODEL_CONV_XPROJ_MAX_TOKENS;
    m->sms = mg_device_sms();
#if HAS_DECODE_SINGLE
    /* An unknown count (an error here) leaves one stream per cluster. */
    if (model_launch_decode_persistent_clusters(&m->decode_clusters) != cudaSuccess) m->decode_clusters = 0;
#endif
    if ((s = model_register(m)) != MG_OK) return s;
    *out = m;
    return MG_OK;
}

mg_status model__convert_weights(model_model *m)
{
    MODEL_LIVE(m, MODEL_NAME "__convert_weights");
    return model__convert_weights_on(m, m->stream);
}

mg_status model__convert_weights_on(model_model *m, cudaStream_t stream)
{
    MODEL_LIVE(m, MODEL_NAME "__convert_weights");
    if (!m->w) return mg_fail(MG_ERR_STATE, MODEL_NAME "__convert_weights: no weights set (" MODEL_NAME "_set_weights)");
#if LOWP
    MG_CUDA(model_launch_convert(m->w, m->wa, (size_t)MODEL_WEIGHTS_FLOATS, stream));
#else
    (void)stream;
#endif
    return MG_OK;
}

mg_status model_set_decode_fused(model_model *m, int fused)
{
    MODEL_LIVE(m, MODEL_NAME "_set_decode_fused");
    if (fused == MODEL_DECODE_SINGLE && !HAS_DECODE_SINGLE)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_decode_fused: this library has no single-launch decode "
                       "(" DECODE_SINGLE_WHY ")");
    if (fused < MODEL_DECODE_UNFUSED || fused > MODEL_DECODE_SINGLE)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_decode_fused: level %d (0 unfused, 1 fused, 2 single launch)", fused);
    m->decode_fused = fused;
    return MG_OK;
}

mg_status model_set_decode_tile(model_model *m, int streams_per_cluster)
{
    MODEL_LIVE(m, MODEL_NAME "_set_decode_tile");
    if (streams_per_cluster < 0 || streams_per_cluster > MODEL_DECODE_SINGLE_MAX_TILE)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_decode_tile: %d streams per cluster is out of range "
                       "0..%d (0: per call)", streams_per_cluster, MODEL_DECODE_SINGLE_MAX_TILE);
    m->decode_tile = streams_per_cluster;
    return MG_OK;
}

mg_status model_set_conv_xproj(model_model *m, int max_tokens)
{
    MODEL_LIVE(m, MODEL_NAME "_set_conv_xproj");
    if (max_tokens < -1)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_conv_xproj: max_tokens = %d (-1 default, 0 never, "
                       "> 0 the largest call fused)", max_tokens);
    if (max_tokens > 0 && !HAS_CONV_XPROJ)
        return mg_fail(MG_ERR_INVALID_ARG, MODEL_NAME "_set_conv_xproj: this library has no fused conv + x_proj "
                       "kernel (%s)", CONV_XPROJ_WHY);
    m->cxp_max_tokens = max_tokens < 0 ? MODEL_CONV_XPROJ_MAX_TOKENS : max_tokens;
    return MG_OK;
}

#if HAS_DECODE_SINGLE
/* Streams per cluster of a single-launch decode of `batch` streams: the
 * set tile, else the fewest that fit the batch into the co-resident
 * clusters (more only add work to each cluster's critical path), within
 * 1..MODEL_DECODE_SINGLE_MAX_TILE. */
static int decode_tile_for(const model_model *m, int batch)
{
    if (m->decode_tile > 0) return m->decode_tile;
    int t = m->decode_clusters > 0 ? (batch + m->decode_clusters - 1) / m->decode_clusters : 1;
    if (t < 1) t = 1;
    return t < MODEL_DECODE_SINGLE_MAX_TILE ? t : MODEL_DECODE_SINGLE_MAX_TILE;
}
#endif

#if HAS_CHUNKED
/* Which scan a call of batch x seqlen tokens uses. auto: the chunked scan
 * from SCAN_AUTO_MIN_LEN steps when the sequential one would run fewer
 * than SCAN_AUTO_BLOCKS_PER_SM blocks per SM (it walks the sequence one
 * step after another per block: fast only with enough blocks side by
 * side); for a spec tuned with chunk_size: auto, what the sweep measured
 * overrides that at the batches it measured (SCAN_AUTO_TUNED_LEN steps and
 * more: chunked up to SCAN_AUTO_CHUNK_BATCH streams, sequential from
 * SCAN_AUTO_SEQ_BATCH). */
static int use_chunked(const model_model *m, int batch, int seqlen)
{
    if (m->scan_choice == MODEL_SCAN_SEQUENTIAL) return 0;
    if (m->scan_choice == MODEL_SCAN_CHUNKED) return 1;
#if SCAN_MODE_ID == 1
    (void)batch;
    return seqlen > SCAN_CHUNK;    /* one chunk: the sequential kernel computes the same */
#else
    if (seqlen < SCAN_AUTO_MIN_LEN) return 0;
#if SCAN_AUTO_TUNED_LEN > 0
    if (seqlen >= SCAN_AUTO_TUNED_LEN) {
        if (batch <= SCAN_AUTO_CHUNK_BATCH) return 1;
        if (SCAN_AUTO_SEQ_BATCH > 0 && batch >= SCAN_AUTO_SEQ_BATCH) return 0;
    }
#endif
    return (long)batch * SCAN_AUTO_SEQ_BLOCKS < (long)SCAN_AUTO_BLOCKS_PER_SM * m->sms;
#endif
}
#endif

size_t model_conv_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * CONV_STATE_PER_SEQ : 0;
}

size_t model_ssm_state_floats(int batch)
{
    return batch > 0 ? (size_t)N_LAYERS * (size_t)batch * SSM_STATE_PER_SEQ : 0;
}

/* Checks shared by prefill and decode_step; fn names the caller in messages. */
static mg_status check_call(const model_model *m, const char *fn, int batch, int seqlen,
                            const float *u, const float *out, const float *cs, const float *ss,
                            int states_required)
{
    MODEL_LIVE(m, fn);
    if (!m->w) return mg_fail(MG_ERR_STATE, "%s: no weights set (" MODEL_NAME "_set_weights)", fn);
    if (batch < 1 || batch > MODEL_MAX_BATCH)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch = %d is out of range 1..%d", fn, batch, MODEL_MAX_BATCH);
    if (seqlen < 1 || seqlen > MODEL_MAX_SEQ_LEN)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: seqlen = %d is out of range 1..%d", fn, seqlen, MODEL_MAX_SEQ_LEN);
    if (!u) return mg_fail(MG_ERR_INVALID_ARG, "%s: u is NULL", fn);
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (states_required && (!cs || !ss))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: conv_state and ssm_state are required (got %s, %s)",
                       fn, cs ? "conv_state" : "NULL", ss ? "ssm_state" : "NULL");
    if ((cs == NULL) != (ss == NULL))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: conv_state and ssm_state must both be given or both be NULL (got %s, %s)",
                       fn, cs ? "conv_state" : "NULL", ss ? "ssm_state" : "NULL");
    if (!mg_aligned(u, 16)) return mg_fail(MG_ERR_ALIGNMENT, "%s: u %p is not 16-byte aligned", fn, (const void *)u);
    if (!mg_aligned(out, 16)) return mg_fail(MG_ERR_ALIGNMENT, "%s: out %p is not 16-byte aligned", fn, (const void *)out);
    if (cs && !mg_aligned(cs, 16))
        return mg_fail(MG_ERR_ALIGNMENT, "%s: conv_state %p is not 16-byte aligned", fn, (const void *)cs);
    if (ss && !mg_aligned(ss, 16))
        return mg_fail(MG_ERR_ALIGNMENT, "%s: ssm_state %p is not 16-byte aligned", fn, (const void *)ss);
    return MG_OK;
}

/* The forward over batch x seqlen tokens (arguments already checked). */
/* last_only (burn-in): out is [batch][D], the last token of each sequence:
 * the last layer's out_proj and norm_f run on those rows only. reset
 * [batch] (device, NULL: none): the sequences whose entry is nonzero start
 * from zero states; the kernels that load a state read it (no launch of
 * its own, so a decode graph replays it with whatever mask the buffer
 * holds). start [batch][seqlen] (device, NULL: none; prefill and burn-in
 * only): episode starts, handed to the conv and scan launchers, which run
 * the maskless kernels for NULL (doc/math.md §9). */
static mg_status forward_starts(model_model *m, int batch, int seqlen, const float *u, float *out,
                                float *cs, float *ss, int last_only, int decode, const unsigned char *reset,
                                const unsigned char *start)
{
#if HAS_DECODE_SINGLE
    /* decode (seqlen 1), level 2: the whole step in one cluster launch */
    if (decode && seqlen == 1 && m->decode_fused == MODEL_DECODE_SINGLE) {
        MG_CUDA(model_launch_decode_persistent(batch, decode_tile_for(m, batch), u, out, m->w, model__gemm_weights(m),
                                               cs, ss, reset, m->stream));
        return MG_OK;
    }
#endif
    /* decode (seqlen 1): the fused mixer kernels unless switched off */
    const int fused = decode && m->decode_fused == MODEL_DECODE_FUSED && seqlen == 1;
    const int tokens = batch * seqlen;
    const float *w = m->w;
    const char *wg = (const char *)model__gemm_weights(m);   /* GEMM weights, ACT elements */
#if HAS_CHUNKED
    const int chunked = use_chunked(m, batch, seqlen);   /* scan parallel over time chunks */
#endif
    const cudaStream_t st = m->stream;
    mg_status s;

#if HAS_INPUT_PROJ
    /* Residual stream: h = u . input_proj.weight^T + input_proj.bias. */
    MG_CUDA(model_launch_bias_rows(m->h, w + OFF_INPUT_PROJ_B, tokens, st));
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
        float *cs_l = cs ? cs + (size_t)l * batch * CONV_STATE_PER_SEQ : NULL;
        float *ss_l = ss ? ss + (size_t)l * batch * SSM_STATE_PER_SEQ : NULL;

        /* hn = rmsnorm(h) * norm.weight */
        MG_CUDA(model_launch_rmsnorm(m->h, lw + L0_NORM_W, m->hn, 0, tokens, st));
        /* xz = hn . in_proj.weight^T   [tokens][2E] */
        s = mg_linear(m->blas, tokens, XZ_DIM, D_MODEL, ACT, m->hn, D_MODEL, GW(L0_IN_PROJ_W), D_MODEL,
                      ACT, m->xz, XZ_DIM, 1.0f, 0.0f);
        if (s != MG_OK) return s;
        if (fused) {
            /* conv step + x_proj + dt_proj + scan step + gate: two kernels */
            MG_CUDA(model_launch_decode_mixer(batch, m->xz, lw + L0_CONV_W, lw + L0_CONV_B, cs_l, GW(L0_X_PROJ_W),
                                            GW(L0_DT_PROJ_W), lw + L0_DT_PROJ_B, lw + L0_A_LOG, lw + L0_D, ss_l,
                                            m->xc, m->dpart, m->g, reset, st));
        } else {
        /* xc = silu(causal_conv(x) + bias), conv state carried (parallel over
         * time tiles whatever the scan mode); dbl = xc . x_proj.weight^T
         * [tokens][DT_RANK+2N]: for few tokens one fused kernel, else the
         * conv kernel and a GEMM */
#if HAS_CONV_XPROJ
        if (tokens <= m->cxp_max_tokens) {
            MG_CUDA(model_launch_conv_xproj(batch, seqlen, m->xz, lw + L0_CONV_W, lw + L0_CONV_B, cs_l, cs_l,
                                            m->xc, GW(L0_X_PROJ_W), m->dbl, reset, start, st));
        } else
#endif
        {
            MG_CUDA(model_launch_conv(batch, seqlen, m->xz, lw + L0_CONV_W, lw + L0_CONV_B, cs_l, cs_l,
                                    m->xc, reset, start, st));
            s = mg_linear(m->blas, tokens, XP_DIM, D_INNER, ACT, m->xc, D_INNER, GW(L0_X_PROJ_W), D_INNER,
                          ACT, m->dbl, XP_DIM, 1.0f, 0.0f);
            if (s != MG_OK) return s;
        }
        /* dt = dbl[:, 0:DT_RANK] . dt_proj.weight^T   [tokens][D_INNER] (bias added in the scan);
         * SCAN_FUSE_DT: the scan computes it from dt_proj.weight itself */
#if SCAN_FUSE_DT
        const void *dtin = GW(L0_DT_PROJ_W);
#else
        s = mg_linear(m->blas, tokens, D_INNER, DT_RANK, ACT, m->dbl, XP_DIM, GW(L0_DT_PROJ_W), DT_RANK,
                      ACT, m->dt, D_INNER, 1.0f, 0.0f);
        if (s != MG_OK) return s;
        const void *dtin = m->dt;
#endif
        /* g = selective_scan(...) * silu(z), ssm state carried */
#if HAS_CHUNKED
        if (chunked)
            MG_CUDA(model_launch_scan_chunked(batch, seqlen, m->xc, dtin, m->dbl, m->xz, lw + L0_DT_PROJ_B,
                                            lw + L0_A_LOG, lw + L0_D, ss_l, ss_l, m->cstate, m->dsum, m->g, reset,
                                            start, st));
        else
#endif
            MG_CUDA(model_launch_scan(batch, seqlen, m->xc, dtin, m->dbl, m->xz, lw + L0_DT_PROJ_B,
                                    lw + L0_A_LOG, lw + L0_D, ss_l, ss_l, m->g, reset, start, st));
        }
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
        MG_CUDA(model_launch_rmsnorm_rows(m->h, w + OFF_NORM_F_W, out, batch, seqlen, seqlen - 1, st));
    else
        MG_CUDA(model_launch_rmsnorm(m->h, w + OFF_NORM_F_W, out, 1, tokens, st));
    return MG_OK;
}

/* The forward of the common part (mg_model_host.h: decode steps, decode
 * graphs): no episode starts. */
static mg_status forward(model_model *m, int batch, int seqlen, const float *u, float *out,
                         float *cs, float *ss, int last_only, int decode, const unsigned char *reset)
{
    return forward_starts(m, batch, seqlen, u, out, cs, ss, last_only, decode, reset, NULL);
}

/* prefill and burn_in: the arguments checked (states optional; a start
 * mask, when given, must be memory the device can read), then the forward
 * over the whole sequence; last_only: burn_in's last-step output. */
static mg_status checked_forward(model_model *m, const char *fn, int batch, int seqlen, const float *u,
                                 float *out, float *cs, float *ss, int last_only, const unsigned char *start)
{
    mg_status s = check_call(m, fn, batch, seqlen, u, out, cs, ss, 0);
    if (s == MG_OK && start) s = mg_dev_readable(start, fn, "start");
    if (s != MG_OK) return s;
    return forward_starts(m, batch, seqlen, u, out, cs, ss, last_only, 0, NULL, start);
}

mg_status model_prefill(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                      float *d_conv_state, float *d_ssm_state)
{
    return checked_forward(m, MODEL_NAME "_prefill", batch, seqlen, d_u, d_out, d_conv_state, d_ssm_state, 0,
                           NULL);
}

mg_status model_burn_in(model_model *m, int batch, int seqlen, const float *d_u, float *d_last_out,
                      float *d_conv_state, float *d_ssm_state)
{
    return checked_forward(m, MODEL_NAME "_burn_in", batch, seqlen, d_u, d_last_out, d_conv_state, d_ssm_state,
                           1, NULL);
}

mg_status model_prefill_starts(model_model *m, int batch, int seqlen, const float *d_u, float *d_out,
                               float *d_conv_state, float *d_ssm_state, const unsigned char *d_start)
{
    return checked_forward(m, MODEL_NAME "_prefill_starts", batch, seqlen, d_u, d_out, d_conv_state, d_ssm_state,
                           0, d_start);
}

mg_status model_burn_in_starts(model_model *m, int batch, int seqlen, const float *d_u, float *d_last_out,
                               float *d_conv_state, float *d_ssm_state, const unsigned char *d_start)
{
    return checked_forward(m, MODEL_NAME "_burn_in_starts", batch, seqlen, d_u, d_last_out, d_conv_state,
                           d_ssm_state, 1, d_start);
}

/* One token per stream: the single-launch kernel (when emitted), the fused
 * single-token path, or the prefill path with seqlen = 1 (see
 * model_set_decode_fused). */
mg_status model_decode_step(model_model *m, int batch, const float *d_u, float *d_out,
                          float *d_conv_state, float *d_ssm_state)
{
    mg_status s = check_call(m, MODEL_NAME "_decode_step", batch, 1, d_u, d_out, d_conv_state,
                             d_ssm_state, 1);
    if (s != MG_OK) return s;
    return forward(m, batch, 1, d_u, d_out, d_conv_state, d_ssm_state, 0, 1, NULL);
}

/* ======================================================================
 * Self-check against the f64 reference (runtime/mg_ref_mamba1).
 * ====================================================================== */

static void ref_dims(mg_m1_dims *dd)
{
    dd->d_model = D_MODEL;
    dd->n_layers = N_LAYERS;
    dd->d_state = D_STATE;
    dd->d_inner = D_INNER;
    dd->d_conv = D_CONV;
    dd->dt_rank = DT_RANK;
    dd->input_dim = INPUT_DIM;
    dd->norm_eps = NORM_EPS;
}

/* Offset of the tensor `pname` in the reference layout; 0 if unknown. */
static int ref_offset(const mg_m1_layout *lay, const char *pname, size_t *off)
{
    static const char pre[] = "backbone.layers.";
#if HAS_INPUT_PROJ
    if (strcmp(pname, "backbone.input_proj.weight") == 0) { *off = lay->input_proj_w; return 1; }
    if (strcmp(pname, "backbone.input_proj.bias") == 0) { *off = lay->input_proj_b; return 1; }
#endif
    if (strcmp(pname, "backbone.norm_f.weight") == 0) { *off = lay->norm_f_w; return 1; }
    if (strncmp(pname, pre, sizeof pre - 1) != 0) return 0;
    char *end;
    const long l = strtol(pname + sizeof pre - 1, &end, 10);
    if (*end != '.' || l < 0 || l >= N_LAYERS) return 0;
    const mg_m1_layer_off *lo = &lay->layers[l];
    const char *k = end + 1;
    if (strcmp(k, "norm.weight") == 0) *off = lo->norm_w;
    else if (strcmp(k, "mixer.in_proj.weight") == 0) *off = lo->in_proj_w;
    else if (strcmp(k, "mixer.conv1d.weight") == 0) *off = lo->conv_w;
    else if (strcmp(k, "mixer.conv1d.bias") == 0) *off = lo->conv_b;
    else if (strcmp(k, "mixer.x_proj.weight") == 0) *off = lo->x_proj_w;
    else if (strcmp(k, "mixer.dt_proj.weight") == 0) *off = lo->dt_proj_w;
    else if (strcmp(k, "mixer.dt_proj.bias") == 0) *off = lo->dt_proj_b;
    else if (strcmp(k, "mixer.A_log") == 0) *off = lo->A_log;
    else if (strcmp(k, "mixer.D") == 0) *off = lo->D;
    else if (strcmp(k, "mixer.out_proj.weight") == 0) *off = lo->out_proj_w;
    else return 0;
    return 1;
}

/* The generated parameter table and pipeline offsets must equal the
 * reference's independently computed layout. */
static mg_status layout_agrees(const mg_m1_layout *lay)
{
    if (lay->total != (size_t)MODEL_WEIGHTS_FLOATS)
        return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": blob size %zu floats, reference layout says %zu",
                       (size_t)MODEL_WEIGHTS_FLOATS, lay->total);
    for (int i = 0; i < MODEL_N_PARAMS; ++i) {
        size_t off;
        if (!ref_offset(lay, model_params[i].name, &off))
            return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": parameter %s unknown to the reference layout",
                           model_params[i].name);
        if (off != model_params[i].offset)
            return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": %s at offset %zu, reference layout says %zu",
                           model_params[i].name, model_params[i].offset, off);
    }
    for (int l = 0; l < N_LAYERS; ++l) {
        const mg_m1_layer_off *lo = &lay->layers[l];
        const size_t b = (size_t)l * LAYER_STRIDE;
        if (lo->norm_w != b + L0_NORM_W || lo->in_proj_w != b + L0_IN_PROJ_W ||
            lo->conv_w != b + L0_CONV_W || lo->conv_b != b + L0_CONV_B ||
            lo->x_proj_w != b + L0_X_PROJ_W || lo->dt_proj_w != b + L0_DT_PROJ_W ||
            lo->dt_proj_b != b + L0_DT_PROJ_B || lo->A_log != b + L0_A_LOG ||
            lo->D != b + L0_D || lo->out_proj_w != b + L0_OUT_PROJ_W)
            return mg_fail(MG_ERR_MISMATCH, MODEL_NAME ": layer %d offsets differ from the reference layout", l);
    }
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

    mg_m1_dims dims;
    ref_dims(&dims);
    mg_m1_layout lay;
    memset(&lay, 0, sizeof lay);
    mg_status s = mg_ref_mamba1_layout(&dims, &lay);
    if (s != MG_OK) return s;

    const size_t n_u = (size_t)o.batch * o.seqlen * IN_DIM;
    const size_t n_out = (size_t)o.batch * o.seqlen * D_MODEL;
    const size_t n_cs = model_conv_state_floats(o.batch);
    const size_t n_ss = model_ssm_state_floats(o.batch);
    float *blob = NULL, *u = NULL, *out = NULL, *cs = NULL, *ss = NULL;
    double *rout = NULL, *rcs = NULL, *rss = NULL;
    float *d_blob = NULL, *d_u = NULL, *d_out = NULL, *d_cs = NULL, *d_ss = NULL;
    model_model *m = NULL;

    s = layout_agrees(&lay);
    if (s != MG_OK) goto done;

    blob = (float *)malloc((size_t)MODEL_WEIGHTS_FLOATS * sizeof(float));
    u = (float *)malloc(n_u * sizeof(float));
    out = (float *)malloc(n_out * sizeof(float));
    cs = (float *)malloc(n_cs * sizeof(float));
    ss = (float *)malloc(n_ss * sizeof(float));
    rout = (double *)malloc(n_out * sizeof(double));
    rcs = (double *)malloc(n_cs * sizeof(double));
    rss = (double *)malloc(n_ss * sizeof(double));
    if (!blob || !u || !out || !cs || !ss || !rout || !rcs || !rss) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, MODEL_NAME "_selfcheck: out of host memory");
        goto done;
    }
    s = mg_ref_mamba1_init(&dims, &lay, blob, o.seed);
    if (s != MG_OK) goto done;
    mg_rng rng;
    mg_rng_seed(&rng, o.seed ^ 0x9e3779b97f4a7c15ull);
    mg_rng_fill_normal(&rng, u, n_u, 0.0f, 1.0f);
    if (o.with_state) {
        mg_rng_fill_normal(&rng, cs, n_cs, 0.0f, 0.5f);
        mg_rng_fill_normal(&rng, ss, n_ss, 0.0f, 0.5f);
    }
    for (size_t i = 0; i < n_cs; ++i) rcs[i] = o.with_state ? cs[i] : 0.0;
    for (size_t i = 0; i < n_ss; ++i) rss[i] = o.with_state ? ss[i] : 0.0;

    /* GPU */
    if ((s = mg_dev_alloc((void **)&d_blob, (size_t)MODEL_WEIGHTS_FLOATS * sizeof(float), "selfcheck weights")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_u, n_u * sizeof(float), "selfcheck u")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_out, n_out * sizeof(float), "selfcheck out")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_cs, n_cs * sizeof(float), "selfcheck conv_state")) != MG_OK ||
        (s = mg_dev_alloc((void **)&d_ss, n_ss * sizeof(float), "selfcheck ssm_state")) != MG_OK)
        goto done;
    cudaError_t ce = cudaMemcpy(d_blob, blob, (size_t)MODEL_WEIGHTS_FLOATS * sizeof(float), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(d_u, u, n_u * sizeof(float), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess && o.with_state) ce = cudaMemcpy(d_cs, cs, n_cs * sizeof(float), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess && o.with_state) ce = cudaMemcpy(d_ss, ss, n_ss * sizeof(float), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) { s = mg_cuda_check(ce, MODEL_NAME "_selfcheck: upload"); goto done; }
    if ((s = model_create(&m, 0)) != MG_OK) goto done;
    if ((s = model_set_weights(m, d_blob, (size_t)MODEL_WEIGHTS_FLOATS)) != MG_OK) goto done;
    s = model_prefill(m, o.batch, o.seqlen, d_u, d_out, o.with_state ? d_cs : NULL,
                    o.with_state ? d_ss : NULL);
    if (s != MG_OK) goto done;
    ce = cudaStreamSynchronize(0);
    if (ce == cudaSuccess) ce = cudaMemcpy(out, d_out, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess && o.with_state) ce = cudaMemcpy(cs, d_cs, n_cs * sizeof(float), cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess && o.with_state) ce = cudaMemcpy(ss, d_ss, n_ss * sizeof(float), cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess) { s = mg_cuda_check(ce, MODEL_NAME "_selfcheck: prefill"); goto done; }

    /* Reference */
    s = mg_ref_mamba1_forward(&dims, &lay, blob, o.batch, o.seqlen, u, rout,
                              o.with_state ? rcs : NULL, o.with_state ? rss : NULL);
    if (s != MG_OK) goto done;

    r.out = mg_compare_f32(out, rout, n_out);
    r.passed = mg_err_ok(&r.out, o.tol);
    if (o.with_state) {
        r.conv_state = mg_compare_f32(cs, rcs, n_cs);
        r.ssm_state = mg_compare_f32(ss, rss, n_ss);
        r.passed = r.passed && mg_err_ok(&r.conv_state, o.tol) && mg_err_ok(&r.ssm_state, o.tol);
    }
    if (rep) *rep = r;
    if (!r.passed)
        s = mg_fail(MG_ERR_MISMATCH, MODEL_NAME "_selfcheck: rel_l2 out %.3g, conv_state %.3g, ssm_state %.3g (tol %.3g)",
                    r.out.rel_l2, r.conv_state.rel_l2, r.ssm_state.rel_l2, o.tol);

done:
    model_destroy(m);
    mg_dev_free(d_blob); mg_dev_free(d_u); mg_dev_free(d_out); mg_dev_free(d_cs); mg_dev_free(d_ss);
    free(blob); free(u); free(out); free(cs); free(ss); free(rout); free(rcs); free(rss);
    mg_ref_mamba1_layout_free(&lay);
    return s;
}
