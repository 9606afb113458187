// mg_m3_launch_decode.cuh: the launchers of the Mamba-3 SISO single-token
// decode kernels (mg_m3_decode.cuh; C linkage, prototypes in mg_m3_launch.h;
// MG_LAUNCH(fn) of NAME.h names them NAME_launch_fn). The host pipeline
// takes this path for decode steps of batch <= DEC_MAX_BATCH (its
// DEC_MAX_BATCH, from the same derived value); a batch outside 1..
// DEC_MAX_BATCH is refused here with cudaErrorInvalidValue. The three
// kernels of a layer and the final norm_f are launched with pdl_launch
// (mg_pdl.cuh): each may start while the one before it drains. Included by
// NAME_kernels.cu after its anonymous namespace (the kernels): it includes
// nothing itself.

namespace {
// The GEMVs are compiled for NB = 1, 2, 4, .. DEC_NB_MAX rows; a call runs
// the smallest instance holding its batch (the rows past it are zeros).
template <int NB>
cudaError_t dec_in_proj_launch(int batch, const float *h, const float *norm_w, const act_t *w, act_t *proj,
                               cudaStream_t stream)
{
    if constexpr (NB < DEC_NB_MAX) {
        if (batch > NB) return dec_in_proj_launch<2 * NB>(batch, h, norm_w, w, proj, stream);
    }
    return pdl_launch(dec_in_proj_kernel<NB>, DEC_IN_BLOCKS, DEC_THREADS, 0, stream, batch, h, norm_w, w, proj);
}

template <int NB>
cudaError_t dec_out_proj_launch(int batch, const act_t *g, const act_t *w, const float *res, float *h,
                                cudaStream_t stream)
{
    if constexpr (NB < DEC_NB_MAX) {
        if (batch > NB) return dec_out_proj_launch<2 * NB>(batch, g, w, res, h, stream);
    }
    return pdl_launch(dec_out_proj_kernel<NB>, DEC_OUT_BLOCKS, DEC_THREADS, 0, stream, batch, g, w, res, h);
}
} // namespace

extern "C" cudaError_t MG_LAUNCH(decode_in_proj)(int batch, const float *h, const float *norm_w, const void *w,
                                                 void *proj, cudaStream_t stream)
{
    if (batch < 1 || batch > DEC_MAX_BATCH) return cudaErrorInvalidValue;
    return dec_in_proj_launch<1>(batch, h, norm_w, static_cast<const act_t *>(w), static_cast<act_t *>(proj),
                                 stream);
}

extern "C" cudaError_t MG_LAUNCH(decode_mixer)(int batch, const void *proj, const float *dt_bias,
                                               const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                               const float *C_bias, const float *Dskip, const float *norm_gate_w,
                                               float *ssm, float *k_prev, float *v_prev, float *angle, void *g,
                                               const unsigned char *reset, cudaStream_t stream)
{
    if (batch < 1 || batch > DEC_MAX_BATCH) return cudaErrorInvalidValue;
    const dim3 grid(H, batch);
    return pdl_launch(dec_mixer_kernel, grid, DEC_MIX_THREADS, 0, stream, static_cast<const act_t *>(proj), dt_bias,
                      B_norm_w, C_norm_w, B_bias, C_bias, Dskip, norm_gate_w, ssm, k_prev, v_prev, angle,
                      static_cast<act_t *>(g), reset);
}

extern "C" cudaError_t MG_LAUNCH(decode_out_proj)(int batch, const void *g, const void *w, const float *res,
                                                  float *h, cudaStream_t stream)
{
    if (batch < 1 || batch > DEC_MAX_BATCH) return cudaErrorInvalidValue;
    return dec_out_proj_launch<1>(batch, static_cast<const act_t *>(g), static_cast<const act_t *>(w), res, h,
                                  stream);
}

extern "C" cudaError_t MG_LAUNCH(decode_norm_f)(int batch, const float *h, const float *w, float *out,
                                                cudaStream_t stream)
{
    if (batch < 1 || batch > DEC_MAX_BATCH) return cudaErrorInvalidValue;
    const dim3 block(NORM_THREADS, NORM_ROWS);
    return pdl_launch(dec_norm_f_kernel, (unsigned)((batch + NORM_ROWS - 1) / NORM_ROWS), block, 0, stream, batch, h,
                      w, out);
}
