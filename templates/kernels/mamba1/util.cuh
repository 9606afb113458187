// util.cuh: device helpers of the Mamba-1 kernels, shared by
// NAME_kernels.cu and NAME_backward.cu (an unused one generates no code):
// dtype stores, the conv's time loop, derivatives of the activations (the
// RMSNorm row is the shared mg_rms_row.cuh). Written against NAME_common.cuh
// (E, E2, K, act_t, from_f32); #included
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
