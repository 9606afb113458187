/* launch_train.h: the prototypes of the Mamba-3 SISO training kernel
 * launchers (defined in kernels/mamba3/launch_train.cuh, compiled into
 * NAME_backward.cu), called by the trainer NAME_train.c. Not part of the
 * API: NAME_train.h includes it under NAME_INTERNAL, inside its extern "C"
 * block (MG_LAUNCH(fn) is NAME_launch_fn, NAME.h). The launchers whose
 * arguments name the model's types (AdamW) and those every arch shares
 * (NAME_launch_*) are declared in NAME_train.h. Activations in the storage
 * dtype are void pointers, and so are the per-head rotated k, q [tokens][H][N]
 * (stored in the storage dtype: kq_t of mg_m3_train_util.cuh); the residual
 * stream, y, the other per-head SSM inputs, states, checkpoints, gradients
 * of the SSM inputs and every partial sum are f32. Plain C, includes
 * nothing itself. */

cudaError_t MG_LAUNCH(bias_rows_train)(float *h, const float *bias, int rows, cudaStream_t st);
/* y = rmsnorm(h) * w, rstd = 1/rms per row; hcopy (NULL: none) gets a copy
 * of h (the next layer's residual stream, before out_proj adds to it). */
cudaError_t MG_LAUNCH(rmsnorm_fwd)(const float *h, const float *w, void *y, int out_f32,
                                   float *rstd, float *hcopy, int rows, cudaStream_t st);
/* The SSM inputs of the training forward: angles_train first (the table rot
 * [tokens][H][S] f32 of the rotary angles, each reduced to [-pi, pi) as the
 * f32 its cosine and sine are taken of, and the final angle), then
 * prep_train (dt, A*dt, lambda and the per-head k, q, rotated by rot's
 * angles as they are written). angles_train's dt and tnh (NULL: none) are
 * prep's dt [tokens][H] and tanh of the angle inputs [tokens][S] when it
 * ran first (the chunked path's prep_scalars_train): the walk reads them
 * instead of taking softplus of the raw dt entry for every angle and tanh
 * of the angle input for every head again (the same values). The launchers with a start argument take the
 * episode-start mask [batch][seqlen] (uint8, NULL: none; doc/math.md
 * section 9): the forward restarts every recurrence at a start, the
 * backward passes no gradient across one. */
cudaError_t MG_LAUNCH(angles_train)(int batch, int seqlen, const void *proj, const float *dt_bias,
                                    const float *dt, const float *tnh, const float *angle_in, float *angle_out,
                                    float *rot, const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(prep_train)(int tokens, const void *proj, const float *dt_bias, const float *B_norm_w,
                                  const float *C_norm_w, const float *B_bias, const float *C_bias,
                                  const float *rot, float *dt, float *adt, float *lam, void *k, void *q,
                                  cudaStream_t st);
/* The chunked path's prep instead (prep_train's dt, A*dt, lambda, and rbc
 * [tokens][2G] f32, the 1/rms of each group's raw B then C row): the
 * chunked scans build k', q' from the in_proj rows, rbc and rot themselves,
 * the values prep_train would have written to the bit, so no per-head k, q
 * row is written or read on that path. tnh (NULL: none) gets [tokens][S]
 * f32, the tanh of each token's angle inputs, for angles_train. */
cudaError_t MG_LAUNCH(prep_scalars_train)(int tokens, const void *proj, const float *dt_bias, float *dt,
                                          float *adt, float *lam, float *rbc, float *tnh, cudaStream_t st);
cudaError_t MG_LAUNCH(scan_fwd)(int batch, int seqlen, const void *proj, const void *k,
                                const void *q, const float *dt, const float *adt, const float *lam,
                                const float *Dskip, const float *ssm_in, const float *kp_in,
                                const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                                float *ckpt, float *y, const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(gate_fwd)(int tokens, const float *y, const void *proj,
                                const float *norm_gate_w, void *g, cudaStream_t st);
cudaError_t MG_LAUNCH(rmsnorm_bwd)(int rows, const float *h, const float *w, const float *rstd,
                                   const float *dy, const float *dscale, int accumulate, float *dh,
                                   void *dh_act, float *part, cudaStream_t st);
cudaError_t MG_LAUNCH(colsum_part)(int rows, int width, const float *x, float *part,
                                   cudaStream_t st);
/* out[i] = sum over the nparts rows of part (stride pstride), fixed order;
 * part is scratch (overwritten when nparts > RED_PART_GROUP). */
cudaError_t MG_LAUNCH(reduce_parts)(float *part, int nparts, size_t pstride, int n,
                                    float *out, cudaStream_t st);
/* The gate's backward: dy, dz (into dproj), the gate norm's partial rows,
 * and g recomputed for out_proj's weight gradient (g NULL: not written). */
cudaError_t MG_LAUNCH(gate_bwd)(int tokens, const float *y, const void *proj,
                                const float *norm_gate_w, const float *dg, void *g, float *dy,
                                void *dproj, float *part_gw, cudaStream_t st);
cudaError_t MG_LAUNCH(scan_bwd)(int batch, int seqlen, const void *proj, const void *k,
                                const void *q, const float *dt, const float *adt, const float *lam,
                                const float *Dskip, const float *ckpt, const float *kp0,
                                const float *vp0, const float *dy, float *dk, float *dq, float *dv,
                                float *dadt, float *ddt, float *dlam, float *part_D,
                                float *dssm0, float *dkp0, float *dvp0, const unsigned char *start,
                                cudaStream_t st);
/* The chunked SSM backward (chunks of CKB_Q steps; defined when the model has
 * it, MG_M3_CKB): the arguments, outputs and layouts of scan_bwd (k', q'
 * built from proj, rbc of prep_scalars_train, rot and the layer's B/C norm
 * weights and biases, as in scan_fwd_chunked), with the
 * checkpoints of scan_fwd_chunked, and the rotary backward done in the same
 * pass: with the angle table rot of angles_train, dk and dq come out
 * un-rotated and gth [tokens][H][S] holds the local angle gradients, so
 * angles_bwd_sums (not angles_bwd) follows it. dv goes straight into the
 * x columns of dproj [tokens][NP] (storage dtype; v = x), and dk, dq
 * [tokens][H][N] are f32 for f32 storage and bf16 for 16-bit storage
 * (the package's dkq_t), so prep_bwd_ck (not prep_bwd) follows it. part_k, part_q (optional,
 * [batch * ceil(seqlen / 16)][H][N]): the sums of dk, dq over each 16-token
 * tile of a sequence, for the B/C bias gradients (reduce_parts over the
 * rows). */
cudaError_t MG_LAUNCH(scan_bwd_chunked)(int batch, int seqlen, const void *proj, const float *rbc,
                                        const float *rot, const float *B_norm_w, const float *C_norm_w,
                                        const float *B_bias, const float *C_bias, const float *dt,
                                        const float *adt, const float *lam, const float *Dskip,
                                        const float *ckpt, const float *kp0, const float *vp0,
                                        const float *dy, void *dk, void *dq, void *dproj, float *dadt,
                                        float *ddt, float *dlam, float *gth, float *part_D,
                                        float *part_k, float *part_q, float *dssm0, float *dkp0,
                                        float *dvp0, const unsigned char *start, cudaStream_t st);
/* The suffix sums of the angle recurrence over the local terms gth written
 * by scan_bwd_chunked (in place; dangle0 [batch][H][S] optional). */
cudaError_t MG_LAUNCH(angles_bwd_sums)(int batch, int seqlen, float *gth, float *dangle0,
                                       const unsigned char *start, cudaStream_t st);
/* The chunked forward for training: scan_fwd's arguments, but k', q' built
 * in the kernel's stage from proj, rbc (prep_scalars_train), rot
 * (angles_train) and the layer's B/C norm weights and biases, instead of
 * read from per-head rows; ckpt receives the state entering every chunk
 * (the shifted form of the chunked scan) at slot chunk_start / CKPT_STRIDE,
 * for scan_bwd_chunked. */
cudaError_t MG_LAUNCH(scan_fwd_chunked)(int batch, int seqlen, const void *proj, const float *rbc,
                                        const float *rot, const float *B_norm_w, const float *C_norm_w,
                                        const float *B_bias, const float *C_bias, const float *dt,
                                        const float *adt, const float *lam, const float *Dskip,
                                        const float *ssm_in, const float *kp_in, const float *vp_in,
                                        float *ssm_out, float *kp_out, float *vp_out, float *ckpt, float *y,
                                        const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(angles_bwd)(int batch, int seqlen, const void *k, const void *q,
                                  const float *rot, float *dk, float *dq, float *gth,
                                  float *dangle0, const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(prep_bwd)(int tokens, const void *proj, const float *dt, const float *lam,
                                const float *dt_bias, const float *B_norm_w, const float *C_norm_w,
                                const float *dk, const float *dq, const float *dv,
                                const float *dadt, const float *ddt, const float *dlam,
                                const float *gth, void *dproj, float *gdtb, float *gBn,
                                float *gCn, cudaStream_t st);
/* prep_bwd after scan_bwd_chunked: dk, dq in its entry type (dkq_t); the
 * x columns of dproj are written already. */
cudaError_t MG_LAUNCH(prep_bwd_ck)(int tokens, const void *proj, const float *dt, const float *lam,
                                   const float *dt_bias, const float *B_norm_w, const float *C_norm_w,
                                   const void *dk, const void *dq, const float *dadt, const float *ddt,
                                   const float *dlam, const float *gth, void *dproj, float *gdtb, float *gBn,
                                   float *gCn, cudaStream_t st);
/* wa = the blob in the storage dtype (the trainer's GEMM copy of the weights). */
cudaError_t MG_LAUNCH(convert_train)(const float *w, void *wa, cudaStream_t st);
