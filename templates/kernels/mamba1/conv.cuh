// conv.cuh: the causal depthwise conv + SiLU of the Mamba-1 forward
// (NAME_kernels.cu): the sequential kernel, and the time-chunked kernel
// with its state update for the chunked path (MG_M1_SCAN_CHUNKED).
// Written against the constants of NAME_common.cuh (E, E2, K, CONV_*,
// SCAN_CHUNK, act_t); #included by NAME_kernels.cu inside its anonymous
// namespace, so it includes nothing itself.

// ---------------------------------------------------------------------------
// conv_silu_kernel: causal depthwise conv (width K) + bias + SiLU.
//   xc[b,t,e] = silu(bias[e] + sum_k w[e,k] * x[b, t-K+1+k, e])
// x is the first E columns of the in_proj output xz [tokens][2E]; inputs
// before t = 0 come from conv_state [b][e][K-1] (oldest first; zeros when
// state_in is NULL). Grid (batch, CONV_BLOCKS), one thread per
// (sequence, channel) walking t in order with the last K values in registers:
// consecutive threads read consecutive channels (coalesced), each input is
// read once, and the final window is the new conv state (written in place
// after the thread has read its old state; NULL state_out: not written).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(CONV_THREADS)
conv_silu_kernel(int seqlen, const act_t *__restrict__ xz, const float *__restrict__ cw,
                 const float *__restrict__ cb, const float *state_in, float *state_out,
                 act_t *__restrict__ xc)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    float w[K], win[K];
#pragma unroll
    for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
    const float bias = cb[e];
    const size_t st = (b * E + e) * (K - 1);
#pragma unroll
    for (int k = 0; k < K - 1; ++k) win[k] = state_in ? state_in[st + k] : 0.0f;
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    act_t *op = xc + b * (size_t)seqlen * E + e;
    conv_steps(0, seqlen, xp, op, w, win, bias);
    if (state_out) {
#pragma unroll
        for (int k = 0; k < K - 1; ++k) state_out[st + k] = win[k];
    }
}
#if MG_M1_SCAN_CHUNKED

// ---------------------------------------------------------------------------
// conv_chunked_kernel: the conv of conv_silu_kernel, parallel over time
// chunks of SCAN_CHUNK steps (grid (batch, CONV_BLOCKS, nc)) for the chunked
// path: each thread starts its window from the K-1 inputs before its chunk
// (from xz, or from conv_state before t = 0) and computes with the same
// arithmetic as conv_silu_kernel (same bits). It writes xc only; the new
// conv state is written afterwards by conv_state_kernel (state_in may alias
// state_out, and chunk 0 reads it).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(CONV_THREADS)
conv_chunked_kernel(int seqlen, const act_t *__restrict__ xz, const float *__restrict__ cw,
                    const float *__restrict__ cb, const float *__restrict__ state_in,
                    act_t *__restrict__ xc)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    const int t0 = blockIdx.z * SCAN_CHUNK;
    const int t1 = min(seqlen, t0 + SCAN_CHUNK);
    float w[K], win[K];
#pragma unroll
    for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
    const float bias = cb[e];
    const size_t st = (b * E + e) * (K - 1);
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    act_t *op = xc + b * (size_t)seqlen * E + e;
#pragma unroll
    for (int k = 0; k < K - 1; ++k) {
        const int t = t0 - (K - 1) + k;
        win[k] = t >= 0 ? to_f32(xp[(size_t)t * E2]) : (state_in ? state_in[st + (K - 1) + t] : 0.0f);
    }
    conv_steps(t0, t1, xp, op, w, win, bias);
}

// conv_state_kernel: state[b][e][:] = the last K-1 inputs of the sequence,
// oldest first, drawn from the old state where seqlen < K-1 (read fully
// before writing: in place). Grid (batch, CONV_BLOCKS).
__global__ void __launch_bounds__(CONV_THREADS)
conv_state_kernel(int seqlen, const act_t *__restrict__ xz, float *state)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    const size_t st = (b * E + e) * (K - 1);
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    float v[K];
#pragma unroll
    for (int k = 0; k < K - 1; ++k) {
        const int t = seqlen - (K - 1) + k;
        v[k] = t >= 0 ? to_f32(xp[(size_t)t * E2]) : state[st + (K - 1) + t];
    }
#pragma unroll
    for (int k = 0; k < K - 1; ++k) state[st + k] = v[k];
}
#endif // MG_M1_SCAN_CHUNKED
