// train_conv.cuh: the causal conv + SiLU of the Mamba-1 training
// path: the forward from a saved initial window, and its backward.
// Written against the constants of NAME_common.cuh and those NAME_backward.cu
// defines (KM1); #included by NAME_backward.cu inside its anonymous
// namespace, so it includes nothing itself.

// Causal depthwise conv + bias + SiLU (as the inference conv). The initial
// window comes from cs0 [b][E][K-1] (saved by the host; zeros for a fresh
// start); the final window goes to state_out (NULL: not written).
__global__ void __launch_bounds__(CONV_THREADS)
conv_fwd_kernel(int seqlen, const act_t *__restrict__ xz, const float *__restrict__ cw,
                const float *__restrict__ cb, const float *__restrict__ cs0, float *__restrict__ state_out,
                act_t *__restrict__ xc)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    float w[K], win[K];
#pragma unroll
    for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
    const float bias = cb[e];
    const size_t st = (b * E + e) * KM1;
#pragma unroll
    for (int k = 0; k < KM1; ++k) win[k] = cs0[st + k];
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    act_t *op = xc + b * (size_t)seqlen * E + e;
    conv_steps(0, seqlen, xp, op, w, win, bias);
    if (state_out) {
#pragma unroll
        for (int k = 0; k < KM1; ++k) state_out[st + k] = win[k];
    }
}

// Conv backward, one thread per (sequence, channel), forward in time:
//   pre_t = bias + sum_k w[k] x_{t-K+1+k} (recomputed), dpre_t = dxc_t silu'(pre_t)
//   dw[k] += dpre_t x_{t-K+1+k}, dbias += dpre_t, dx_j += w[k] dpre_t (j = t-K+1+k)
// dx_j is final once t passes j + K - 1: a K-deep shift register emits it to
// dxz[row][e] (j >= 0) or to the initial-state gradient dcs[b][e][j+K-1]
// (j < 0; NULL: dropped). Partials: part_w [b][E][K], part_b [b][E].
__global__ void __launch_bounds__(CONV_THREADS)
conv_bwd_kernel(int seqlen, const act_t *__restrict__ xz, const float *__restrict__ cw,
                const float *__restrict__ cb, const float *__restrict__ cs0,
                const float *__restrict__ dxc, act_t *__restrict__ dxz, float *__restrict__ dcs,
                float *__restrict__ part_w, float *__restrict__ part_b)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    const size_t row0 = b * (size_t)seqlen;
    float w[K], win[K], pend[K], gw[K];
#pragma unroll
    for (int k = 0; k < K; ++k) { w[k] = cw[e * K + k]; pend[k] = 0.0f; gw[k] = 0.0f; }
    const float bias = cb[e];
    const size_t st = (b * E + e) * KM1;
#pragma unroll
    for (int k = 0; k < KM1; ++k) win[k] = cs0[st + k];
    float gb = 0.0f;
    for (int t = 0; t < seqlen; ++t) {
        const size_t row = row0 + t;
        win[K - 1] = to_f32(xz[row * E2 + e]);
        float pre = bias;
#pragma unroll
        for (int k = 0; k < K; ++k) pre += w[k] * win[k];
        const float dp = dxc[row * E + e] * dsilu(pre);
        gb += dp;
#pragma unroll
        for (int k = 0; k < K; ++k) { gw[k] += dp * win[k]; pend[k] += w[k] * dp; }
        const int j = t - KM1;   // input index whose gradient is now final
        if (j >= 0) dxz[(row0 + j) * E2 + e] = from_f32<act_t>(pend[0]);
        else if (dcs) dcs[st + (j + KM1)] = pend[0];
#pragma unroll
        for (int k = 0; k < K - 1; ++k) { pend[k] = pend[k + 1]; win[k] = win[k + 1]; }
        pend[K - 1] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < KM1; ++k) {   // inputs seqlen-K+1 .. seqlen-1
        const int j = seqlen - KM1 + k;
        if (j >= 0) dxz[(row0 + j) * E2 + e] = from_f32<act_t>(pend[k]);
        else if (dcs) dcs[st + (j + KM1)] = pend[k];
    }
#pragma unroll
    for (int k = 0; k < K; ++k) part_w[(b * E + e) * K + k] = gw[k];
    part_b[b * E + e] = gb;
}
