// mg_launch_norm.cuh: the launchers of the shared inference RMSNorm and
// bias-rows kernels (mg_norm.cuh), the same for every arch (C linkage,
// prototypes in the arch's launch.h; MG_LAUNCH(fn) of NAME.h names them
// NAME_launch_fn). Argument ranges are checked by the host pipeline before
// any launch. Included by NAME_kernels.cu after its anonymous namespace (the
// kernels): it includes nothing itself.

extern "C" cudaError_t MG_LAUNCH(bias_rows)(float *h, const float *bias, int rows, cudaStream_t stream)
{
    const size_t n4 = (size_t)rows * (D / 4);
    size_t blocks = (n4 + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    bias_rows_kernel<<<(unsigned)blocks, 256, 0, stream>>>(
        reinterpret_cast<float4 *>(h), reinterpret_cast<const float4 *>(bias), n4);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(rmsnorm)(const float *h, const float *w, void *y, int out_f32,
                                          int rows, cudaStream_t stream)
{
    const dim3 block(NORM_THREADS, NORM_ROWS);
    const unsigned grid = (unsigned)((rows + NORM_ROWS - 1) / NORM_ROWS);
    if (out_f32)
        rmsnorm_kernel<float><<<grid, block, 0, stream>>>(h, w, static_cast<float *>(y), 1, 0, rows);
    else
        rmsnorm_kernel<act_t><<<grid, block, 0, stream>>>(h, w, static_cast<act_t *>(y), 1, 0, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(rmsnorm_rows)(const float *h, const float *w, float *y, int rows,
                                               int in_stride, int in_off, cudaStream_t stream)
{
    const dim3 block(NORM_THREADS, NORM_ROWS);
    rmsnorm_kernel<float><<<(unsigned)((rows + NORM_ROWS - 1) / NORM_ROWS), block, 0, stream>>>(h, w, y, in_stride,
                                                                                                 in_off, rows);
    return cudaGetLastError();
}
