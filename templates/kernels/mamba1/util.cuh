// util.cuh: device helpers of the Mamba-1 kernels, shared by
// NAME_kernels.cu and NAME_backward.cu (an unused one generates no code):
// dtype stores, the RMSNorm of a row, the conv's time loop, derivatives of
// the activations. Written against NAME_common.cuh (D, E, E2, K, EPS,
// NORM_*, act_t, from_f32); #included
// inside the .cu file's anonymous namespace, so it includes nothing itself.

// Store 4 consecutive values (one float4 of a row) in the output dtype.
__device__ __forceinline__ void store4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
template <typename T> __device__ __forceinline__ void store4(T *p, float4 v)
{
    p[0] = from_f32<T>(v.x); p[1] = from_f32<T>(v.y);
    p[2] = from_f32<T>(v.z); p[3] = from_f32<T>(v.w);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// d silu(x)/dx = s (1 + x (1 - s)), s = sigmoid(x)
__device__ __forceinline__ float dsilu(float x)
{
    const float s = sigmoidf_(x);
    return s * (1.0f + x * (1.0f - s));
}
// d softplus(x)/dx with the threshold 20 (x > 20: identity)
__device__ __forceinline__ float dsoftplus(float x) { return x > 20.0f ? 1.0f : sigmoidf_(x); }

// The RMSNorm of one row of D floats by a block of NORM_THREADS threads, in
// two halves so that a kernel can use r in between. rms_load: the row is
// read once as NORM_VECS float4 vectors, NORM_ITERS per thread, kept in v;
// the sum of squares is reduced in f32 by a warp shuffle butterfly, then
// across the NORM_WARPS warps in index order (part: the kernel's shared
// NORM_WARPS floats), so every thread gets the same, deterministic
// r = 1 / sqrt(mean(row^2) + eps). rms_store: y[row] = v * r * w in the
// output dtype.
__device__ __forceinline__ float rms_load(const float4 *hr, float4 (&v)[NORM_ITERS], float *part)
{
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        v[i] = (c < NORM_VECS) ? hr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_WARPS; ++i) tot += part[i];
    return 1.0f / sqrtf(tot / (float)D + EPS);
}

template <typename OutT>
__device__ __forceinline__ void rms_store(const float4 (&v)[NORM_ITERS], float r, const float *w, OutT *y,
                                          size_t row)
{
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    OutT *yr = y + row * D;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_VECS) {
            const float4 g = w4[c];
            store4(yr + 4 * c, make_float4(v[i].x * r * g.x, v[i].y * r * g.y, v[i].z * r * g.z, v[i].w * r * g.w));
        }
    }
}

// The causal depthwise conv + bias + SiLU of one (sequence, channel) over
// steps [t0, t1): xp / op point at the channel's x in xz [t][E2] and xc
// [t][E]; win holds the K-1 inputs before t0 and ends with the last K-1
// (the new conv state). Every conv kernel runs this loop, so all compute
// the same bits.
__device__ __forceinline__ void conv_steps(int t0, int t1, const act_t *xp, act_t *op, const float (&w)[K],
                                           float (&win)[K], float bias)
{
    for (int t = t0; t < t1; ++t) {
        win[K - 1] = to_f32(xp[(size_t)t * E2]);
        float acc = bias;
#pragma unroll
        for (int k = 0; k < K; ++k) acc += w[k] * win[k];
        op[(size_t)t * E] = from_f32<act_t>(silu(acc));
#pragma unroll
        for (int k = 0; k < K - 1; ++k) win[k] = win[k + 1];
    }
}
