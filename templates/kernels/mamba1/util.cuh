// util.cuh: small device helpers of the Mamba-1 kernels, shared by
// NAME_kernels.cu and NAME_backward.cu (an unused one generates no code).
// Written against NAME_common.cuh (from_f32); #included inside the .cu
// file's anonymous namespace, so it includes nothing itself.

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
