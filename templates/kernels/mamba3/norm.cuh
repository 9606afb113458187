// mg_m3_norm.cuh: the RMSNorm of the Mamba-3 SISO inference forward (block
// pre-norm and norm_f) and the bias rows that start the input projection.
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
// One block of NORM_THREADS threads per row (grid = rows). The row is read
// once as NORM_VECS float4 vectors, NORM_ITERS per thread, kept in registers.
// The sum of squares is reduced in f32 by a warp shuffle butterfly, then
// across the NORM_WARPS warps in index order, so every thread computes the
// same, deterministic scale. Output: the storage dtype (block pre-norm,
// feeding in_proj) or f32 (norm_f, the model output). Input row of output
// row r: r * in_stride + in_off (1, 0: every row; seqlen, seqlen-1: the last
// token of each sequence, burn-in).
// ---------------------------------------------------------------------------
template <typename OutT>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *__restrict__ h, const float *__restrict__ w, OutT *__restrict__ y,
               int in_stride, int in_off)
{
    const size_t row = blockIdx.x;
    const float4 *hr = reinterpret_cast<const float4 *>(h + (row * in_stride + in_off) * D);
    float4 v[NORM_ITERS];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        v[i] = (c < NORM_VECS) ? hr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
    __shared__ float part[NORM_WARPS];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_WARPS; ++i) tot += part[i];
    const float r = 1.0f / sqrtf(tot / (float)D + EPS);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    OutT *yr = y + row * D;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_VECS) {
            const float4 g = w4[c];
            store4(yr + 4 * c, make_float4(v[i].x * r * g.x, v[i].y * r * g.y,
                                           v[i].z * r * g.z, v[i].w * r * g.w));
        }
    }
}
