/* launch.h: the prototypes of the Mamba-1 forward kernel launchers
 * (defined in kernels/mamba1/launch.cuh, compiled into NAME_kernels.cu),
 * called by the host pipeline NAME.c. Not part of the API: NAME.h includes
 * it under NAME_INTERNAL, inside its extern "C" block, after defining
 * MG_LAUNCH(fn) as NAME_launch_fn; declared once so that both compilers check
 * one prototype. The launchers of optional kernels (chunked scan,
 * single-launch decode, weight copy) exist only in the libraries that have
 * them (NAME.h: NAME_HAS_*). Activation buffers (the storage dtype) are
 * passed as void pointers; the residual stream, weights and states are f32.
 * Each returns the launch status. Plain C, includes nothing itself. */

/* h[rows][D] = input_proj.bias broadcast over rows (before the input GEMM). */
cudaError_t MG_LAUNCH(bias_rows)(float *h, const float *bias, int rows, cudaStream_t stream);
/* y[rows][D] = rmsnorm(h[rows][D]) * w; y has type act (out_f32 = 0) or f32. */
cudaError_t MG_LAUNCH(rmsnorm)(const float *h, const float *w, void *y, int out_f32,
                        int rows, cudaStream_t stream);
/* The launchers that read a recurrent state take reset [batch] (uint8, NULL:
 * none): a sequence whose entry is nonzero starts from zeros instead of its
 * state in (the decode step's reset mask; prefill passes NULL). Those of
 * the conv and the scans take start [batch][seqlen] (uint8, NULL: none, the
 * maskless kernels): episode starts, the states zeroed before every token
 * whose entry is nonzero (doc/math.md §9; NAME_prefill_starts). */
/* Causal depthwise conv + SiLU over x = xz[:, 0:E], parallel over time tiles;
 * conv state in/out (state_in NULL: zeros; state_out NULL: not written; they
 * may alias). One launch. */
cudaError_t MG_LAUNCH(conv)(int batch, int seqlen, const void *xz, const float *conv_w,
                     const float *conv_b, const float *state_in, float *state_out,
                     void *xc, const unsigned char *reset, const unsigned char *start,
                     cudaStream_t stream);
/* The conv (as MG_LAUNCH(conv), the same bits) and x_proj of the same
 * tokens in one launch: dbl[tokens][XP] = xc . x_proj_w^T (x_proj_w: the
 * GEMM weights, storage dtype), summed in a fixed order other than the
 * GEMM's. Only in libraries with MODEL_HAS_CONV_XPROJ. */
cudaError_t MG_LAUNCH(conv_xproj)(int batch, int seqlen, const void *xz, const float *conv_w,
                           const float *conv_b, const float *state_in, float *state_out,
                           void *xc, const void *x_proj_w, void *dbl, const unsigned char *reset,
                           const unsigned char *start, cudaStream_t stream);
/* Selective scan + D skip + SiLU(z) gate -> g[tokens][E]. dt: the dt_proj
 * output [tokens][E], or with MODEL_SCAN_FUSE_DT dt_proj.weight [E][R] (the
 * scan computes dt itself; also for scan_chunked). */
cudaError_t MG_LAUNCH(scan)(int batch, int seqlen, const void *xc, const void *dt,
                     const void *dbl, const void *xz, const float *dt_bias,
                     const float *A_log, const float *Dskip, const float *state_in,
                     float *state_out, void *g, const unsigned char *reset, const unsigned char *start,
                     cudaStream_t stream);
/* Fused decode of one layer's mixer for one token per sequence: conv step
 * (conv_state in place), x_proj partials part [batch][CONV_BLOCKS][XP] f32,
 * then dt_proj + scan step (ssm_state in place) + gate -> g [batch][E].
 * x_proj_w / dt_proj_w are the GEMM weights (storage dtype). States NULL:
 * zeros in, nothing out. Two launches. */
cudaError_t MG_LAUNCH(decode_mixer)(int batch, const void *xz, const float *conv_w,
                             const float *conv_b, float *conv_state, const void *x_proj_w,
                             const void *dt_proj_w, const float *dt_bias,
                             const float *A_log, const float *Dskip, float *ssm_state,
                             void *xc, float *part, void *g, const unsigned char *reset,
                             cudaStream_t stream);
/* The single-launch decode step of the whole backbone: u [batch][IN_DIM] ->
 * out [batch][D]; w the f32 blob, wg the GEMM weights (storage dtype, blob
 * offsets); states [N_LAYERS][batch][...] in place (NULL: zeros in, nothing
 * out). spc streams per cluster, 1..DEC_SEQS (cudaErrorInvalidValue
 * otherwise); each stream's results are the same for every spc. One
 * cluster launch (cudaLaunchKernelEx), capturable in a graph. */
cudaError_t MG_LAUNCH(decode_persistent)(int batch, int spc, const float *u, float *out, const float *w,
                                  const void *wg, float *conv_state, float *ssm_state,
                                  const unsigned char *reset, cudaStream_t stream);
/* *n = how many clusters of the single-launch decode the current device
 * runs at once (cudaOccupancyMaxActiveClusters; 0 on error). */
cudaError_t MG_LAUNCH(decode_persistent_clusters)(int *n);
/* y[r][D] = rmsnorm(h[r*in_stride + in_off]) * w, f32 out (burn-in: last rows). */
cudaError_t MG_LAUNCH(rmsnorm_rows)(const float *h, const float *w, float *y, int rows,
                             int in_stride, int in_off, cudaStream_t stream);
/* Passes 1 and 2 of the chunked scan (chunk states, then the combine): the
 * incoming state of every chunk into cstate (layout below). */
cudaError_t MG_LAUNCH(scan_chunk_states)(int batch, int seqlen, const void *xc, const void *dt,
                                  const void *dbl, const float *dt_bias, const float *A_log,
                                  const float *state_in, float *cstate, float *dsum,
                                  const unsigned char *start, cudaStream_t stream);
/* Chunked scan (three launches); cstate [batch][nc][E][N], dsum [batch][nc][E]
 * f32 workspace, nc = ceil(seqlen / SCAN_CHUNK). state_in/out may alias. */
cudaError_t MG_LAUNCH(scan_chunked)(int batch, int seqlen, const void *xc, const void *dt,
                             const void *dbl, const void *xz, const float *dt_bias,
                             const float *A_log, const float *Dskip,
                             const float *state_in, float *state_out, float *cstate,
                             float *dsum, void *g, const unsigned char *reset, const unsigned char *start,
                             cudaStream_t stream);
/* wa[i] = (storage dtype) w[i], i < n (round to nearest). */
cudaError_t MG_LAUNCH(convert)(const float *w, void *wa, size_t n, cudaStream_t stream);
