// conv_xproj.cuh: the fused conv + x_proj kernel of the Mamba-1 prefill
// (NAME_kernels.cu, MG_M1_CONV_XPROJ): for calls of few tokens, the causal
// conv and the x_proj GEMM of a layer in one launch (mg/derive_mamba1.lua
// d.cxp_fuse says when it is emitted and why). Written against the
// constants of NAME_common.cuh (E, XP, CONV_*, act_t); #included by
// NAME_kernels.cu inside its anonymous namespace after mg_m1_conv.cuh, so it
// includes nothing itself.

#if MG_M1_CONV_XPROJ
static_assert(CONV_TILE <= 32, "a lane stores each token's x_proj output");
// Rows of x_proj.weight a lane holds: E columns strided by 32 lanes.
constexpr int CXP_VPL = (E + 31) / 32;
// Groups of CONV_THREADS threads a block runs the conv's channel blocks on
// (up to 4, at most 512 threads): more warps share the x_proj rows, which
// is what a block waits on when few blocks run (one stream).
constexpr int cxp_min(int a, int b) { return a < b ? a : b; }
constexpr int CXP_GROUPS = cxp_min(cxp_min(CONV_BLOCKS, 4), 512 / CONV_THREADS);
constexpr int CXP_THREADS = CXP_GROUPS * CONV_THREADS;
constexpr int CXP_WARPS = CXP_THREADS / 32;
// The x_proj sums' reduce-scatter (below): halving levels (while the tile's
// token count halves evenly, at most the warp's 5), sums a lane holds after
// them, and the lane bits of the butterfly levels left.
constexpr int CXP_HALVE = cxp_min(5, ws_ctz(CONV_TILE));
constexpr int CXP_VF = CONV_TILE >> CXP_HALVE;
constexpr int CXP_BFLY_BITS = (32 >> CXP_HALVE) - 1;

// ---------------------------------------------------------------------------
// conv_xproj_kernel: grid (batch * ntiles), CXP_THREADS threads; block x =
// b * ntiles + tile as in conv_silu_kernel, but one block covers every
// channel of its tile (the CONV_BLOCKS channel blocks dealt to CXP_GROUPS
// groups of CONV_THREADS threads).
//   1. the conv of the tile: conv_fwd_tile per channel block, the very code
//      of conv_silu_kernel (xc, and the final conv state from tile 0: the
//      same bits, the same aliasing rule for state_in / state_out);
//   2. the tile's xc rows, as stored (rounded to act_t), read back into
//      shared memory (the block's own global writes, visible after the
//      barrier);
//   3. dbl[t][j] = sum_e xc[t][e] * x_proj.weight[j][e] for the tile's
//      tokens t and every output j: warp w takes rows j = w, w + CXP_WARPS,
//      ..., each lane the columns e = lane + 32 i in registers; per token,
//      the lane's products summed in i order, then a butterfly over the
//      warp (the tile's tokens side by side); rounded to act_t once, as
//      the GEMM's output is.
// The sums are f32 in a fixed order (no atomics): deterministic, but not
// cuBLAS's order, so dbl agrees with the unfused path to rounding, not to
// the bit (xc and the conv state are bit-identical). reset [batch] and ST /
// start as in conv_silu_kernel.
// ---------------------------------------------------------------------------
template <bool ST>
__global__ void __launch_bounds__(CXP_THREADS)
conv_xproj_kernel(int seqlen, int ntiles, const act_t *__restrict__ xz, const float *__restrict__ cw,
                  const float *__restrict__ cb, const float *state_in, float *state_out,
                  act_t *__restrict__ xc, const act_t *__restrict__ xw, act_t *__restrict__ dbl,
                  const unsigned char *__restrict__ reset, const unsigned char *__restrict__ start)
{
    __shared__ float sx[CONV_TILE][E];   // the tile's xc rows, as stored
    const size_t b = blockIdx.x / ntiles;
    const bool fresh = reset && reset[b];
    for (int g = threadIdx.x / CONV_THREADS; g < CONV_BLOCKS; g += CXP_GROUPS)
        conv_fwd_tile<ST, true>(seqlen, ntiles, xz, cw, cb, fresh ? nullptr : state_in, state_out, xc, start, g,
                                (int)(threadIdx.x % CONV_THREADS));
    const int t0 = (int)(blockIdx.x % ntiles) * CONV_TILE;
    const int n = min(CONV_TILE, seqlen - t0);   // tokens [t0, t0 + n) of sequence b
    const size_t row0 = b * (size_t)seqlen + t0;
    __syncthreads();   // the tile's xc, written above by the whole block
    for (int i = threadIdx.x; i < n * E; i += CXP_THREADS) sx[i / E][i % E] = to_f32(xc[row0 * E + i]);
    __syncthreads();
    const int warp = threadIdx.x >> 5, ln = threadIdx.x & 31;
    for (int j = warp; j < XP; j += CXP_WARPS) {
        float w[CXP_VPL];
#pragma unroll
        for (int i = 0; i < CXP_VPL; ++i) {
            const int e = ln + 32 * i;
            w[i] = e < E ? to_f32(xw[(size_t)j * E + e]) : 0.0f;
        }
        // every token's sum first, then the butterflies: independent
        // chains that overlap (tokens past n reuse row n-1 and are dropped)
        float acc[CONV_TILE];
#pragma unroll
        for (int t = 0; t < CONV_TILE; ++t) {
            const int tr = min(t, n - 1);
            acc[t] = 0.0f;
#pragma unroll
            for (int i = 0; i < CXP_VPL; ++i) {
                const int e = ln + 32 * i;
                if (e < E) acc[t] += sx[tr][e] * w[i];
            }
        }
        // The tokens' sums over the warp by the butterfly's tree (offsets
        // 16, 8, .., 1) as a reduce-scatter: at each of the first CXP_HALVE
        // levels a lane keeps half of its tokens' partial sums, sends the
        // other half to its partner and adds what it receives; the levels
        // left are the butterfly on the CXP_VF sums each lane then holds.
        // The same pairs in the same order as a butterfly per token (a + b
        // and b + a are the same bits), with CONV_TILE - 1 shuffles where
        // those took 5 CONV_TILE (16 tokens: 16 shuffles and 30 selects for
        // 80 shuffles and 80 adds, against 128 multiply-adds of products).
        const int start = rs_halve<CXP_HALVE>(acc, ln, 16);   // acc[k] holds token start + k
#pragma unroll
        for (int l = CXP_HALVE; l < 5; ++l) {
#pragma unroll
            for (int k = 0; k < CXP_VF; ++k) acc[k] += __shfl_xor_sync(FULL_MASK, acc[k], 16 >> l);
        }
        // the lanes whose butterfly offsets' bits are 0 store their tokens'
        if ((ln & CXP_BFLY_BITS) == 0) {
#pragma unroll
            for (int k = 0; k < CXP_VF; ++k)
                if (start + k < n) dbl[(row0 + start + k) * XP + j] = from_f32<act_t>(acc[k]);
        }
    }
}
#endif // MG_M1_CONV_XPROJ
