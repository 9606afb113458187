// dtype.cuh: conversions between the storage dtype of activations and f32
// compute (round to nearest), for each dtype whose toolkit header the
// includer has included (cuda_bf16.h, cuda_fp16.h: an unused overload
// generates no code), and softplus, which every arch computes alike (each
// arch's silu differs in rounding, so the arch defines its own).
// #included inside the anonymous namespace of NAME_common.cuh, or inlined
// into a tune candidate (which includes a toolkit header only for its own
// dtype), so it includes nothing itself.

__device__ __forceinline__ float to_f32(float x) { return x; }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
#ifdef __CUDA_BF16_TYPES_EXIST__
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
#endif
#ifdef __CUDA_FP16_TYPES_EXIST__
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
#endif

// softplus with PyTorch's threshold 20.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
