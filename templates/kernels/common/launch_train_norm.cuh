// mg_launch_train_norm.cuh: the launchers of the shared training RMSNorm
// kernels and of the in-order sum of partials (mg_train_norm.cuh), the same
// for every arch (C linkage, prototypes in the arch's launch_train.h;
// MG_LAUNCH(fn) of NAME.h names them NAME_launch_fn). Arguments are checked
// by NAME_train.c before any launch. Included by NAME_backward.cu after its
// anonymous namespace (the kernels): it includes nothing itself.

extern "C" cudaError_t MG_LAUNCH(rmsnorm_fwd)(const float *h, const float *w, void *y, int out_f32,
                                              float *rstd, float *hcopy, int rows, cudaStream_t st)
{
    const dim3 block(NORM_THREADS, NORM_ROWS);
    const unsigned grid = (unsigned)((rows + NORM_ROWS - 1) / NORM_ROWS);
    if (out_f32)
        rmsnorm_fwd_kernel<float><<<grid, block, 0, st>>>(h, w, static_cast<float *>(y), rstd, hcopy, rows);
    else
        rmsnorm_fwd_kernel<act_t><<<grid, block, 0, st>>>(h, w, static_cast<act_t *>(y), rstd, hcopy, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(rmsnorm_bwd)(int rows, const float *h, const float *w,
                                              const float *rstd, const float *dy, const float *dscale,
                                              int accumulate, float *dh, void *dh_act, float *part,
                                              cudaStream_t st)
{
    const int blocks = (rows + NORMB_ROWS - 1) / NORMB_ROWS;
    rmsnorm_bwd_kernel<<<blocks, NORM_THREADS, 0, st>>>(rows, h, w, rstd, dy, dscale, accumulate, dh,
                                                        static_cast<act_t *>(dh_act), part);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(reduce_parts)(float *part, int nparts, size_t pstride, int n,
                                               float *out, cudaStream_t st)
{
    return sum_parts<RED_PART_GROUP>(part, nparts, pstride, n, out, st);
}
