// conv.cuh: the causal depthwise conv + SiLU of the Mamba-1 forward
// (NAME_kernels.cu): the kernel parallel over time tiles, which also updates
// the conv state. Both scan modes
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
// written by tile 0 (conv_fwd_tile<ST, true>), after it has read its old
// state, and no other tile reads the old state, so the two may alias. reset
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
    conv_fwd_tile<ST, true>(seqlen, ntiles, xz, cw, cb, fresh ? nullptr : state_in, state_out, xc, start);
}
