// norm.cuh: the row kernels of the Mamba-1 forward (NAME_kernels.cu): the
// input_proj bias fill, RMSNorm, and the low-precision weight copy.
// Written against the constants of NAME_common.cuh (D, NORM_*, CONVERT_*,
// act_t) and store4 (util.cuh); #included by NAME_kernels.cu inside its
// anonymous namespace, so it includes nothing itself. The weight copy
// exists only in low-precision libraries (MG_M1_LOWP).

// ---------------------------------------------------------------------------
// bias_rows_kernel: h[row][:] = bias[:] for every row, the first half of the
// input projection (the GEMM then accumulates u . W^T into h with beta = 1).
// Grid-stride over rows*D/4 float4s; block 256. Memory-bound copy.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(256)
bias_rows_kernel(float4 *__restrict__ h, const float4 *__restrict__ bias, size_t n4)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x)
        h[i] = bias[i % (D / 4)];
}

// ---------------------------------------------------------------------------
// rmsnorm_kernel: y[row] = h[row] * rsqrt(mean(h[row]^2) + eps) * w.
// One block of NORM_THREADS threads per row (grid = rows; rms_load and
// rms_store in util.cuh: deterministic, the row read once). The input is
// the f32 residual stream; the output is the storage dtype (layer norms, feeding in_proj) or f32 (norm_f, the
// model output). Input row of output row r: r * in_stride + in_off (1, 0:
// every row; seqlen, seqlen-1: the last token of each sequence, burn-in).
// ---------------------------------------------------------------------------
template <typename OutT>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *__restrict__ h, const float *__restrict__ w, OutT *__restrict__ y,
               int in_stride, int in_off)
{
    const size_t row = blockIdx.x;
    __shared__ float part[NORM_WARPS];
    float4 v[NORM_ITERS];
    const float r = rms_load(reinterpret_cast<const float4 *>(h + (row * in_stride + in_off) * D), v, part);
    rms_store(v, r, w, y, row);
}

#if MG_M1_LOWP

// ---------------------------------------------------------------------------
// convert_kernel: wa[i] = (act_t) w[i] (round to nearest) over the whole
// blob: the low-precision copy has the blob's offsets in elements. Grid
// stride, CONVERT_THREADS x up to CONVERT_BLOCKS_MAX blocks.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(CONVERT_THREADS)
convert_kernel(const float *__restrict__ w, act_t *__restrict__ wa, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * CONVERT_THREADS + threadIdx.x; i < n;
         i += (size_t)gridDim.x * CONVERT_THREADS)
        wa[i] = from_f32<act_t>(w[i]);
}
#endif
