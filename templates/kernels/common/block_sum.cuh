// block_sum.cuh: the block-wide f64 sum of the training reductions (norm,
// loss, loss-scaling partials). Written against FULL_MASK (NAME_common.cuh);
// #included by NAME_backward.cu inside its anonymous namespace, so it
// includes nothing itself.

// Block-wide f64 sum of one value per thread, fixed order (xor butterfly in
// each warp, then warps in index order by thread 0). Result valid in thread 0.
template <int THREADS>
__device__ __forceinline__ double block_sum_f64(double v)
{
    __shared__ double wsum[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int i = 0; i < THREADS / 32; ++i) t += wsum[i];
    return t;
}
