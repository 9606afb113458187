// mg_adamw.cuh: the fused AdamW step over a weight blob and the trainer's
// conversion of the weights to the storage dtype, for every arch.
// Written against NAME_common.cuh (act_t), the RED_THREADS and param_class
// of NAME_backward.cu (which elements are weights) and adamw_params (the
// train_optim "norm" part); included inside the anonymous namespace of
// NAME_backward.cu, so it includes nothing itself. The arch's adamw_kernel
// is a one-line wrapper of adamw_blob (Mamba-1's also writes the
// low-precision copy, Mamba-3's passes none).

// Fused AdamW over the whole blob (PyTorch torch.optim.AdamW order):
//   g = grad * stat[1];  p *= 1 - lr wd (decoupled; matrices only if asked)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= step_size m / (sqrt(v)/sqrt(bc2) + eps),  step_size = lr/bc1
// Padding elements are never written. wa (optional: nullptr for none) gets
// the low-precision copy of the updated weights. Nothing is written when
// stat[0] (the norm) is not finite.
__device__ __forceinline__ void adamw_blob(size_t n, float *__restrict__ w, const float *__restrict__ g,
                                           float *__restrict__ m, float *__restrict__ v,
                                           const float *__restrict__ stat, const adamw_params *__restrict__ hp,
                                           const float *__restrict__ coef, act_t *__restrict__ wa)
{
    if (!isfinite(stat[0])) return;   // non-finite gradients: the step is skipped
    const float sc = stat[1];
    const float beta1 = hp->beta1, beta2 = hp->beta2, eps = hp->eps;
    const int matrices_only = hp->wd_matrices_only;
    const float decay = coef[0], step_size = coef[1], bc2_sqrt = coef[2];
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * RED_THREADS) {
        const int cls = param_class(i);
        if (cls == 0) continue;
        const float gi = g[i] * sc;
        float p = w[i];
        if (!matrices_only || cls == 1) p *= decay;
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        m[i] = mi;
        v[i] = vi;
        w[i] = p;
        if (wa) wa[i] = from_f32<act_t>(p);
    }
}

// wa[i] = (act_t) w[i] (the trainer's GEMM copy of the weights, low-precision storage).
__global__ void __launch_bounds__(RED_THREADS)
convert_train_kernel(size_t n, const float *__restrict__ w, act_t *__restrict__ wa)
{
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * RED_THREADS)
        wa[i] = from_f32<act_t>(w[i]);
}
