/* launch.h: the prototypes of the Mamba-3 SISO inference kernel launchers
 * (defined in kernels/mamba3/launch_fwd.cuh, compiled into NAME_kernels.cu),
 * called by NAME.c. Not part of the API: NAME.h includes it under
 * NAME_INTERNAL, inside its extern "C" block (MG_LAUNCH(fn) is
 * NAME_launch_fn, NAME.h); declared once so that both compilers check one
 * prototype. Activation buffers (the storage dtype) are passed as void
 * pointers; the residual stream, weights, states and the per-head SSM
 * inputs are f32. Each returns the launch status. Plain C, includes nothing
 * itself. */

/* h[rows][D] = input_proj.bias broadcast over rows (before the input GEMM). */
cudaError_t MG_LAUNCH(bias_rows)(float *h, const float *bias, int rows, cudaStream_t stream);
/* y[rows][D] = rmsnorm(h[rows][D]) * w; y has type act (out_f32 = 0) or f32. */
cudaError_t MG_LAUNCH(rmsnorm)(const float *h, const float *w, void *y, int out_f32,
                               int rows, cudaStream_t stream);
/* y[r][D] = rmsnorm(h[r*in_stride + in_off]) * w, f32 out (burn-in: last rows). */
cudaError_t MG_LAUNCH(rmsnorm_rows)(const float *h, const float *w, float *y, int rows,
                                    int in_stride, int in_off, cudaStream_t stream);
/* Per token, from the in_proj output proj [tokens][IN_PROJ_DIM]:
 * dt, adt (= A*dt), lam [tokens][H]; unrotated k = BCNorm(B)+B_bias and
 * q = BCNorm(C)+C_bias, [tokens][H][N]. */
cudaError_t MG_LAUNCH(prep)(int tokens, const void *proj, const float *dt_bias,
                            const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                            const float *C_bias, float *dt, float *adt, float *lam, float *k,
                            float *q, cudaStream_t stream);
/* The launchers that read a recurrent state (angles, scan, decode_mixer)
 * take reset [batch] (uint8, NULL: none): a sequence whose entry is nonzero
 * starts from zero states instead of its states in (the decode step's reset
 * mask; prefill passes NULL). Those that carry a state across tokens
 * (angles, scan, scan_chunked, scan_fused) take start [batch][seqlen]
 * (uint8, NULL: none): a new episode at every token whose entry is nonzero
 * (doc/math.md section 9; prefill_starts, burn_in_starts). */
/* Angle recurrence (sequential in t) and rotary of k and q in place.
 * angle_in NULL: zeros; angle_out NULL: not written (may alias angle_in). */
cudaError_t MG_LAUNCH(angles)(int batch, int seqlen, const void *proj, const float *dt,
                              const float *angle_in, float *angle_out, float *k, float *q,
                              const unsigned char *reset, const unsigned char *start, cudaStream_t stream);
/* The SSM (exponential-trapezoidal recurrence) -> y [tokens][E] (f32).
 * Each state pointer: NULL in = zeros, NULL out = not written; out may alias in. */
cudaError_t MG_LAUNCH(scan)(int batch, int seqlen, const void *proj, const float *k,
                            const float *q, const float *dt, const float *adt, const float *lam,
                            const float *Dskip, const float *ssm_in, const float *kp_in,
                            const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                            float *y, const unsigned char *reset, const unsigned char *start,
                            cudaStream_t stream);
/* Gate: g = y*silu(z), or per head y*rms(y)*norm_gate_w*silu(z) -> g [tokens][E] (act). */
cudaError_t MG_LAUNCH(gate)(int tokens, const float *y, const void *proj, const float *norm_gate_w,
                            void *g, cudaStream_t stream);
/* The chunked form of the same SSM (one launch; same arguments and state
 * semantics as scan; defined when the model has the chunked
 * scan, MG_M3_CHUNKED). */
cudaError_t MG_LAUNCH(scan_chunked)(int batch, int seqlen, const void *proj, const float *k,
                                    const float *q, const float *dt, const float *adt, const float *lam,
                                    const float *Dskip, const float *ssm_in, const float *kp_in,
                                    const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                                    float *y, const unsigned char *start, cudaStream_t stream);
/* The whole SSM core of a layer in one launch (prep, angles, the chunked
 * scan and the gate; defined when MG_M3_FUSED): from the in_proj output
 * proj to g [tokens][E] (act). The four states as in scan (NULL in = zeros,
 * NULL out = not written, out may alias in); norm_gate_w NULL without
 * outproj_norm. seg_ws (SEG_WS_BYTES) holds the token prologue's rows
 * (batch x seqlen <= MAX_TOKENS) and the segment form's slots: nseg > 1
 * splits each sequence in up to nseg segments run side by side (four
 * launches), for batches too small to fill the GPU. No workspace, or more
 * tokens than it holds: cudaErrorInvalidValue, nothing launched. The norm
 * weights and biases are read as 16-byte vectors (every tensor of the
 * weight blob is 256-byte aligned): a pointer among them that is not
 * 16-byte aligned gives cudaErrorMisalignedAddress, nothing launched. */
cudaError_t MG_LAUNCH(scan_fused)(int batch, int seqlen, int nseg, void *seg_ws, const void *proj,
                                  const float *dt_bias,
                                  const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                  const float *C_bias, const float *Dskip, const float *norm_gate_w,
                                  const float *ssm_in, const float *kp_in, const float *vp_in,
                                  const float *angle_in, float *ssm_out, float *kp_out, float *vp_out,
                                  float *angle_out, void *g, const unsigned char *start, cudaStream_t stream);
/* wa[i] = (storage dtype) w[i], i < n (round to nearest); defined with a
 * 16-bit storage dtype (MG_M3_LOWP). */
cudaError_t MG_LAUNCH(convert)(const float *w, void *wa, size_t n, cudaStream_t stream);
/* The single-token decode step (seqlen 1, 1 <= batch <= DEC_MAX_BATCH of
 * NAME_common.cuh; kernels/mamba3/launch_decode.cuh). in_proj with the
 * input RMSNorm fused: proj[b] = (rmsnorm(h[b]) * norm_w, storage dtype) .
 * w^T, w the storage-dtype in_proj weight [IN_PROJ_DIM][D]. */
cudaError_t MG_LAUNCH(decode_in_proj)(int batch, const float *h, const float *norm_w, const void *w,
                                      void *proj, cudaStream_t stream);
/* prep, angles, one scan step and the gate of one token per sequence:
 * proj [batch][IN_PROJ_DIM] -> g [batch][E] (storage dtype). The states are
 * updated in place (NULL: zeros in, not written); norm_gate_w is NULL
 * without outproj_norm. */
cudaError_t MG_LAUNCH(decode_mixer)(int batch, const void *proj, const float *dt_bias,
                                    const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                    const float *C_bias, const float *Dskip, const float *norm_gate_w,
                                    float *ssm, float *k_prev, float *v_prev, float *angle, void *g,
                                    const unsigned char *reset, cudaStream_t stream);
/* h[b] = res[b] + g[b] . w^T (f32 accumulate), w the storage-dtype out_proj
 * weight [D][E]; res may be h (the residual add) or another [batch][D]. */
cudaError_t MG_LAUNCH(decode_out_proj)(int batch, const void *g, const void *w, const float *res, float *h,
                                       cudaStream_t stream);
/* out[b] = rmsnorm(h[b]) * w (f32), b < batch: norm_f at the end of a decode
 * step, the same bits as MG_LAUNCH(rmsnorm) with out_f32, launched as part
 * of the decode chain. */
cudaError_t MG_LAUNCH(decode_norm_f)(int batch, const float *h, const float *w, float *out, cudaStream_t stream);
