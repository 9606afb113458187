/* launch_train.h: the prototypes of the Mamba-1 training kernel launchers
 * (defined in kernels/mamba1/launch_train.cuh, compiled into
 * NAME_backward.cu), called by the trainer NAME_train.c. Not part of the
 * API: NAME_train.h includes it under NAME_INTERNAL, inside its extern "C"
 * block (MG_LAUNCH(fn) is NAME_launch_fn, NAME.h). The launchers whose
 * arguments name the model's types (AdamW) and those every arch shares
 * (NAME_launch_*) are declared in NAME_train.h. Activations (the storage dtype)
 * as void pointers. Plain C, includes nothing itself. */

cudaError_t MG_LAUNCH(bias_rows_train)(float *h, const float *bias, int rows, cudaStream_t st);
/* y = rmsnorm(h) * w, rstd = 1/rms per row; hcopy (NULL: none) gets a copy
 * of h (the next layer's residual stream, before out_proj adds to it). */
cudaError_t MG_LAUNCH(rmsnorm_fwd)(const float *h, const float *w, void *y, int out_f32,
                               float *rstd, float *hcopy, int rows, cudaStream_t st);
/* start [batch][seqlen] (uint8, NULL: none, the maskless kernels) of the
 * conv and scan launchers below: episode starts (doc/math.md §9,
 * NAME_trainer_set_starts), the same mask in the forward and the backward. */
/* Conv + SiLU parallel over time tiles from the initial window in state
 * (NULL: zeros), which is saved to cs0 (zeros for NULL) and then replaced
 * by the final window (NULL: not written). */
cudaError_t MG_LAUNCH(conv_fwd)(int batch, int seqlen, const void *xz, const float *cw,
                            const float *cb, float *state, float *cs0, void *xc,
                            const unsigned char *start, cudaStream_t st);
/* The training forward's scan: chunked 0 sequential, 1 chunked (passes 1
 * and 2 of the inference scan into cstate [batch][nc][E][N] and dsum
 * [batch][nc][E], nc = ceil(seqlen / SCAN_CHUNK); HAS_CHUNKED_SCAN only).
 * Saves y and the checkpoints ckpt [batch][ceil(seqlen/CKPT_STRIDE)][E][N]. */
cudaError_t MG_LAUNCH(scan_fwd)(int batch, int seqlen, int chunked, const void *xc, const void *dt,
                            const void *dbl, const void *xz, const float *dt_bias,
                            const float *A_log, const float *Dskip, const float *state_in,
                            float *state_out, float *cstate, float *dsum, float *ckpt, void *y,
                            void *g, const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(rmsnorm_bwd)(int rows, const float *h, const float *w, const float *rstd,
                               const float *dy, const float *dscale, int accumulate, float *dh,
                               void *dh_act, float *part, cudaStream_t st);
cudaError_t MG_LAUNCH(colsum_part)(int rows, const float *x, float *part, cudaStream_t st);
/* A layer's parameter sums at the end of its backward, in one pair of
 * launches (mg_red_jobs.cuh): the RMSNorm weight gnorm [D] from nrows
 * partial rows of part_rows [.][D], d A_log, d D, d dt_proj.bias from the
 * scan backward's nparts partial rows part_A [.][E][N], part_D, part_dtb
 * [.][E], and the conv's gw [E][K], gb [E] from the conv_bwd launch's
 * nconv = batch * tiles partial rows part_w, part_b, each over its rows in
 * order, in groups of CONV_PART_GROUP (= RED_PART_GROUP) rows: each sum
 * has the bits a launch pair of its own would give. */
cudaError_t MG_LAUNCH(layer_param_sums)(int nrows, float *part_rows, float *gnorm, int nparts, float *part_A,
                                        float *part_D, float *part_dtb, float *gA, float *gD, float *gdtb,
                                        int nconv, float *part_w, float *part_b, float *gw, float *gb,
                                        cudaStream_t st);
/* out[i] = sum over the nparts rows of part (stride pstride), fixed order;
 * part is scratch (overwritten when nparts > RED_PART_GROUP). */
cudaError_t MG_LAUNCH(reduce_parts)(float *part, int nparts, size_t pstride, int n,
                                float *out, cudaStream_t st);
cudaError_t MG_LAUNCH(gate_bwd)(int tokens, const void *y, const void *xz, const float *dg,
                            void *g, float *dy, void *dxz, cudaStream_t st);
/* nspans 1: the sequential scan backward (span_p, span_ds unused, may be
 * NULL); nspans = ceil(seqlen / BSCAN_SPAN) > 1: the chunk-parallel one
 * (HAS_CHUNKED_BWD only), span_p / span_ds [batch][nspans][E][N] scratch.
 * part_A [batch*nspans][E][N], part_D / part_dtb [batch*nspans][E]. */
cudaError_t MG_LAUNCH(scan_bwd)(int batch, int seqlen, int nspans, const void *xc, const void *dt,
                            const void *dbl, const float *dt_bias, const float *A_log,
                            const float *Dskip, const float *ckpt, const float *dy,
                            float *dxc, void *ddt, float *part_bc, float *part_A,
                            float *part_D, float *part_dtb, float *span_p, float *span_ds,
                            float *dss, const unsigned char *start, cudaStream_t st);
cudaError_t MG_LAUNCH(bc_reduce)(int tokens, const float *part_bc, void *ddbl, cudaStream_t st);
/* The conv backward, parallel over time tiles of CONV_TILE steps: dxz[:, :E],
 * dcs (NULL: not written), and the per-(sequence, tile) partials of the
 * weight and bias gradients, part_w [batch*tiles][E][K], part_b
 * [batch*tiles][E], which layer_param_sums sums. One launch. */
cudaError_t MG_LAUNCH(conv_bwd)(int batch, int seqlen, const void *xz, const float *cw,
                            const float *cb, const float *cs0, const float *dxc, void *dxz,
                            float *dcs, float *part_w, float *part_b, const unsigned char *start,
                            cudaStream_t st);
cudaError_t MG_LAUNCH(convert_train)(const float *w, void *wa, cudaStream_t st);
