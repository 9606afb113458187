// mg_m3_gate_bwd.cuh: the backward of the Mamba-3 SISO output gate.
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// Gate backward, NORMB_ROWS tokens per block, warp w handling heads w,
// w+GATEB_WARPS, ... (the forward gate's map with the backward's block of
// GATEB_WARPS warps: fewer heads a warp, fewer registers; each head's
// arithmetic is the same whichever warp does it). Per (token, e), with dg = dL/dg:
//   g  = y gw silu(z) recomputed with the forward's arithmetic (out_proj's dW input;
//        g NULL: not written, the caller's buffer holds the forward's g already)
//   dz = dg y gw silu'(z) -> dproj[:, OFF_Z + e]
//   OUTPROJ_NORM (gw = r w, r = rms factor of the head's y): du = dg silu(z),
//     dy = r w du - r^3/P y sum_p(du w y);  part_gw[blk][e] += du y r
//   else: dy = dg silu(z)

// Each v[k] replaced by its sum over the warp (an xor butterfly, the same
// on every lane), the K sums' butterflies side by side (K independent
// shuffle chains, not one after another).
template <int K>
__device__ __forceinline__ void warp_sum_each(float (&v)[K])
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(FULL_MASK, v[k], o);
}

__global__ void __launch_bounds__(GATEB_THREADS)
gate_bwd_kernel(int tokens, const float *__restrict__ y, const act_t *__restrict__ proj,
                const float *__restrict__ ngw, const float *__restrict__ dg,
                act_t *__restrict__ g, float *__restrict__ dy, act_t *__restrict__ dproj,
                float *__restrict__ part_gw)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * NORMB_ROWS;
    const int nr = min(NORMB_ROWS, tokens - r0);
    // A head of this warp exists for every hi when the warps cover H
    // exactly: no test at all then (it would keep each head's loads behind
    // the previous head's work).
#define GB_HEAD_OK(h) (H % GATEB_WARPS == 0 || (h) < H)
    float acc[GATE_HPW][GATE_VPL], gwv[GATE_HPW][GATE_VPL];
#pragma unroll
    for (int hi = 0; hi < GATE_HPW; ++hi)
#pragma unroll
        for (int i = 0; i < GATE_VPL; ++i) {
            const int h = warp + hi * GATEB_WARPS, p = lane + 32 * i;
            acc[hi][i] = 0.0f;
            gwv[hi][i] = OUTPROJ_NORM && GB_HEAD_OK(h) && p < P ? ngw[h * P + p] : 0.0f;
        }
    for (int rr = 0; rr < nr; ++rr) {
        const size_t tok = (size_t)(r0 + rr);
        const float *yt = y + tok * E;
        const float *dgt = dg + tok * E;
        const act_t *zt = proj + tok * NP + OFF_Z;
        // Every input of the token's heads first (one memory latency per
        // token, not per head); 0 past P and past H.
        float yh[GATE_HPW][GATE_VPL], zh[GATE_HPW][GATE_VPL], dgh[GATE_HPW][GATE_VPL];
#pragma unroll
        for (int hi = 0; hi < GATE_HPW; ++hi)
#pragma unroll
            for (int i = 0; i < GATE_VPL; ++i) {
                const int h = warp + hi * GATEB_WARPS, p = lane + 32 * i;
                const bool ok = GB_HEAD_OK(h) && p < P;
                yh[hi][i] = ok ? yt[h * P + p] : 0.0f;
                zh[hi][i] = ok ? to_f32(zt[h * P + p]) : 0.0f;
                dgh[hi][i] = ok ? dgt[h * P + p] : 0.0f;
            }
        // The heads' scales r with gate_head_rms's arithmetic, then their
        // gradients, then (OUTPROJ_NORM) dy: each step for every head of the
        // warp before the next, so that the heads' shuffle butterflies run
        // side by side (GATE_HPW independent chains) instead of one head's
        // after another's. Per head the same operations in the same order.
        float rh[GATE_HPW];
#pragma unroll
        for (int hi = 0; hi < GATE_HPW; ++hi) {
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < GATE_VPL; ++i) ss += yh[hi][i] * yh[hi][i];
            rh[hi] = ss;
        }
        if (OUTPROJ_NORM) warp_sum_each(rh);
#pragma unroll
        for (int hi = 0; hi < GATE_HPW; ++hi) rh[hi] = OUTPROJ_NORM ? gate_rms_scale(rh[hi]) : 1.0f;
        float du[GATE_HPW][GATE_VPL], dot[GATE_HPW];
#pragma unroll
        for (int hi = 0; hi < GATE_HPW; ++hi) {
            const int h = warp + hi * GATEB_WARPS;
            const float(&yv)[GATE_VPL] = yh[hi];
            const float r = rh[hi];
            dot[hi] = 0.0f;
#pragma unroll
            for (int i = 0; i < GATE_VPL; ++i) {
                const int p = lane + 32 * i;
                du[hi][i] = 0.0f;
                if (GB_HEAD_OK(h) && p < P) {
                    const size_t e = h * P + p;
                    const float gw = OUTPROJ_NORM ? r * gwv[hi][i] : 1.0f;
                    const float z = zh[hi][i];
                    const float sz = silu(z);
                    const float dgv = dgh[hi][i];
                    if (g) g[tok * E + e] = from_f32<act_t>(yv[i] * gw * sz);
                    dproj[tok * NP + OFF_Z + e] = from_f32<act_t>(dgv * (yv[i] * gw) * dsilu(z));
                    du[hi][i] = dgv * sz;
                    if (OUTPROJ_NORM) {
                        dot[hi] += du[hi][i] * gwv[hi][i] * yv[i];
                        acc[hi][i] += du[hi][i] * yv[i] * r;
                    } else {
                        dy[tok * E + e] = du[hi][i];
                    }
                }
            }
        }
        if (OUTPROJ_NORM) {
            warp_sum_each(dot);
#pragma unroll
            for (int hi = 0; hi < GATE_HPW; ++hi) {
                const int h = warp + hi * GATEB_WARPS;
                const float r = rh[hi];
                const float c3 = r * r * r * dot[hi] / (float)P;
#pragma unroll
                for (int i = 0; i < GATE_VPL; ++i) {
                    const int p = lane + 32 * i;
                    if (GB_HEAD_OK(h) && p < P) {
                        const size_t e = h * P + p;
                        dy[tok * E + e] = r * gwv[hi][i] * du[hi][i] - c3 * yh[hi][i];
                    }
                }
            }
        }
    }
    if (OUTPROJ_NORM) {
#pragma unroll
        for (int hi = 0; hi < GATE_HPW; ++hi) {
            const int h = warp + hi * GATEB_WARPS;
            if (!GB_HEAD_OK(h)) break;
#pragma unroll
            for (int i = 0; i < GATE_VPL; ++i) {
                const int p = lane + 32 * i;
                if (p < P) part_gw[(size_t)blockIdx.x * E + h * P + p] = acc[hi][i];
            }
        }
    }
}
#undef GB_HEAD_OK
