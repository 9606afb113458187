// conv.cuh: the causal depthwise conv + SiLU of the Mamba-1 forward
// (NAME_kernels.cu): the kernel parallel over time tiles, and the conv state
// update that follows it when a call has more than one tile. Both scan modes
// use them (the conv does not depend on the scan). Written against the
// constants of NAME_common.cuh (E, E2, K, CONV_*, act_t); #included by
// NAME_kernels.cu inside its anonymous namespace, so it includes nothing
// itself.

// ---------------------------------------------------------------------------
// conv_silu_kernel: causal depthwise conv (width K) + bias + SiLU.
//   xc[b,t,e] = silu(bias[e] + sum_k w[e,k] * x[b, t-K+1+k, e])
// x is the first E columns of the in_proj output xz [tokens][2E]; inputs
// before t = 0 come from conv_state [b][e][K-1] (oldest first; zeros when
// state_in is NULL). Parallel over time tiles of CONV_TILE steps, one thread
// per (channel, tile); grid and arithmetic: conv_fwd_tile (util.cuh), the
// same bits as a serial walk over time. state_out (NULL: not written) is
// written here only when the call is one tile (the launcher passes NULL
// otherwise and runs conv_state_kernel after): each thread has then read its
// old state before writing the new one, so the two may alias. reset
// [batch] (NULL: none): a sequence whose entry is nonzero starts from zeros
// instead of state_in (the decode step's reset mask). ST: episode starts,
// start [batch][seqlen] (conv_fwd_tile); the launcher instantiates ST =
// true only for a call with a start mask.
// ---------------------------------------------------------------------------
template <bool ST>
__global__ void __launch_bounds__(CONV_THREADS)
conv_silu_kernel(int seqlen, int ntiles, const act_t *__restrict__ xz, const float *__restrict__ cw,
                 const float *__restrict__ cb, const float *state_in, float *state_out,
                 act_t *__restrict__ xc, const unsigned char *__restrict__ reset,
                 const unsigned char *__restrict__ start)
{
    const bool fresh = reset && reset[blockIdx.x / ntiles];
    conv_fwd_tile<ST>(seqlen, ntiles, xz, cw, cb, fresh ? nullptr : state_in, state_out, xc, start);
}

// conv_state_kernel: state_out[b][e][:] = the last K-1 inputs of the
// sequence, oldest first, drawn from state_in (NULL: zeros) where
// seqlen < K-1; each thread reads all of its values before writing, so
// state_in may alias state_out. Runs after conv_silu_kernel when a call has
// more than one tile (tile 0 reads the old state, which the last tile must
// not overwrite). Grid (batch, CONV_BLOCKS). reset as in conv_silu_kernel;
// ST: an entry whose input lies before the sequence's last start is 0.
template <bool ST>
__global__ void __launch_bounds__(CONV_THREADS)
conv_state_kernel(int seqlen, const act_t *__restrict__ xz, const float *state_in, float *state_out,
                  const unsigned char *__restrict__ reset, const unsigned char *__restrict__ start)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (e >= E) return;
    const size_t b = blockIdx.x;
    if (reset && reset[b]) state_in = nullptr;   // a new sequence: zeros before t = 0
    const size_t st = (b * E + e) * (K - 1);
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    float v[K];
#pragma unroll
    for (int k = 0; k < K - 1; ++k) {
        const int t = seqlen - (K - 1) + k;
        v[k] = t >= 0 ? to_f32(xp[(size_t)t * E2]) : (state_in ? state_in[st + (K - 1) + t] : 0.0f);
    }
    if constexpr (ST) {   // v[k] is kept unless a start lies at k+1 .. K-2 (after its input)
        const unsigned char *sp = start + b * (size_t)seqlen;
        bool cut = false;
#pragma unroll
        for (int k = K - 2; k >= 0; --k) {
            if (cut) v[k] = 0.0f;
            const int t = seqlen - (K - 1) + k;
            cut = cut || (t >= 0 && sp[t >= 0 ? t : 0] != 0);
        }
    }
#pragma unroll
    for (int k = 0; k < K - 1; ++k) state_out[st + k] = v[k];
}
