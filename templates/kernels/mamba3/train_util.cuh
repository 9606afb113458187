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

// ld2_f32 / st2_from_f32 (two consecutive values, the rotation pairs) are
// mg_m3_tiles.cuh's, included before this file.
