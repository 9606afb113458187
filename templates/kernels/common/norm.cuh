// mg_norm.cuh: the RMSNorm of the inference forward (layer pre-norm and
// norm_f; its row is mg_rms_row.cuh) and the bias rows that start the input
// projection, the same for every arch.
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

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
// NORM_THREADS threads per row, NORM_ROWS rows a block (threadIdx.y; grid =
// ceil(rows / NORM_ROWS); mg_rms_row.cuh says why). The row is read
// once as NORM_VECS float4 vectors, NORM_ITERS per thread, kept in registers.
// The sum of squares is reduced in f32 by a warp shuffle butterfly, then
// across the NORM_WARPS warps in index order, so every thread computes the
// same, deterministic scale. Output: the storage dtype (block pre-norm,
// feeding in_proj) or f32 (norm_f, the model output). Input row of output
// row r: r * in_stride + in_off (1, 0: every row; seqlen, seqlen-1: the last
// token of each sequence, burn-in).
// ---------------------------------------------------------------------------
template <typename OutT>
__global__ void __launch_bounds__(NORM_THREADS * NORM_ROWS)
rmsnorm_kernel(const float *__restrict__ h, const float *__restrict__ w, OutT *__restrict__ y,
               int in_stride, int in_off, int rows)
{
    const size_t row = (size_t)blockIdx.x * NORM_ROWS + threadIdx.y;
    if (row >= (size_t)rows) return;   // the last block's spare rows (NORM_ROWS > 1: no barrier below)
    __shared__ float part[NORM_WARPS];
    float4 v[NORM_ITERS];
    const float r = rms_load(reinterpret_cast<const float4 *>(h + (row * in_stride + in_off) * D), v, part);
    rms_store(y, row, w, v, r);
}
