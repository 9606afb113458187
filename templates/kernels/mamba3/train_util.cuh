// mg_m3_train_util.cuh: small device helpers of the Mamba-3 SISO training
// kernels: the derivatives of the activations.
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// d silu(x)/dx = s (1 + x (1 - s)), s = sigmoid(x)
__device__ __forceinline__ float dsilu(float x)
{
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
// d softplus(x)/dx with the threshold 20 (x > 20: identity)
__device__ __forceinline__ float dsoftplus(float x) { return x > 20.0f ? 1.0f : sigmoid(x); }
// d act(dd_A)/dv (act of NAME_common.cuh: heavy tail or softplus)
__device__ __forceinline__ float da_act(float v)
{
    if (A_HEAVY_TAIL) {
        if (v >= 0.0f) return 1.0f;
        const float r = 1.0f / (1.0f - v);
        return r * r;
    }
    return dsoftplus(v);
}
