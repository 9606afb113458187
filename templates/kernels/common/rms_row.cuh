// mg_rms_row.cuh: the row of every RMSNorm kernel (inference and training,
// both archs): NORM_THREADS threads per row of D floats (NORM_ROWS rows a
// block),
// NORM_ITERS float4 vectors per thread kept in registers, the sum of squares
// reduced in f32 by a warp shuffle butterfly, then across the NORM_WARPS
// warps in index order, so every thread computes the same, deterministic
// scale. One copy, so every path normalises with the same bits.
// Written against NAME_common.cuh (D, EPS, NORM_*, FULL_MASK) and store4;
// included inside the anonymous namespace of the package's .cu files: it
// includes nothing itself.

// Rows per block of the RMSNorm kernels that use rms_load (threadIdx.y
// picks the row): a row of one warp (D <= 128) needs no barrier, so
// NORM_ROWS such rows share a block; wider rows take a block each. Why:
// 16K one-warp blocks (mamba1_rl, D = 128) kept the H200 at 17% achieved
// occupancy and 16% of the copy ceiling, bound by block launches (ncu,
// bench/results/h200-2026-12-05-profile-mamba1_rl.csv). The arithmetic of
// a row does not change: the same bits.
constexpr int NORM_ROWS = NORM_WARPS == 1 ? 8 : 1;

// The sum of squares of the NORM_ITERS float4 vectors that thread t (0 ..
// NORM_THREADS-1) of a row loads, v, summed over the thread's warp by a
// shuffle butterfly (every lane of the warp gets it): the part of warp
// t / 32 in the row's scale.
__device__ __forceinline__ float rms_warp_sumsq(const float4 *hr, int t, float4 (&v)[NORM_ITERS])
{
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = t + i * NORM_THREADS;
        v[i] = (c < NORM_VECS) ? hr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
    return ss;
}

// r = 1/sqrt(mean(row^2) + eps) from the row's NORM_WARPS warp parts
// (rms_warp_sumsq), added in index order.
__device__ __forceinline__ float rms_scale(const float *part)
{
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_WARPS; ++i) tot += part[i];
    return 1.0f / sqrtf(tot / (float)D + EPS);
}

// Loads row hr into v and returns r = 1/sqrt(mean(row^2) + eps), the same in
// every thread. part: the kernel's __shared__ float[NORM_WARPS] (unused with
// one warp per row: the butterfly leaves the sum in every lane, and
// 0 + part[0] of the block path is that sum, bit for bit).
__device__ __forceinline__ float rms_load(const float4 *hr, float4 (&v)[NORM_ITERS], float *part)
{
    const float ss = rms_warp_sumsq(hr, threadIdx.x, v);
    if constexpr (NORM_WARPS == 1) {
        (void)part;
        return 1.0f / sqrtf((0.0f + ss) / (float)D + EPS);
    } else {
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
        __syncthreads();
        return rms_scale(part);
    }
}

// y[row][:] = v * r * w in the output type (the storage dtype or f32).
template <typename OutT>
__device__ __forceinline__ void rms_store(OutT *y, size_t row, const float *w, const float4 (&v)[NORM_ITERS], float r)
{
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
