// mg_m3_train_util.cuh: small device helpers of the Mamba-3 SISO training
// kernels: the per-head k', q' storage type and its pair loads / stores, and
// the derivatives of the activations.
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

// The per-head rotated k', q' [tokens][H][N] of the training path are
// stored in the storage dtype (kq_t): written once by prep_rot_kernel and
// read by the forward and backward scans and the angle backward. Why: at
// f32 they were four of the largest streams of a training step (mamba3_perf:
// 537 MB each, written once, read three times); the chunked kernels round
// them to the storage type for the tensor cores anyway, and every other
// reader converts to f32 on load. f32 storage: f32, as before.
typedef act_t kq_t;

// Two consecutive values of p as f32 (one 4- or 8-byte load), and two f32
// values stored (rounded to the storage type): the (even, odd) rotation pairs.
__device__ __forceinline__ float2 ld2_f32(const float *p) { return *reinterpret_cast<const float2 *>(p); }
__device__ __forceinline__ float2 ld2_f32(const __nv_bfloat16 *p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
__device__ __forceinline__ float2 ld2_f32(const __half *p) { return __half22float2(*reinterpret_cast<const __half2 *>(p)); }
__device__ __forceinline__ void st2_from_f32(float *p, float2 v) { *reinterpret_cast<float2 *>(p) = v; }
__device__ __forceinline__ void st2_from_f32(__nv_bfloat16 *p, float2 v)
{
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v.x, v.y);
}
__device__ __forceinline__ void st2_from_f32(__half *p, float2 v) { *reinterpret_cast<__half2 *>(p) = __floats2half2_rn(v.x, v.y); }
