// mg_m3_gate.cuh: the output gate of the Mamba-3 SISO inference forward
// (gated RMSNorm per head, or y * silu(z)).
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// Loads head h of the token's y (yt) into yv (lane's entries p = lane + 32*i,
// 0 past P) and returns the head's scale r = 1/sqrt(mean(y^2) + eps) under
// OUTPROJ_NORM (the same in every lane: fixed butterfly), else 1. The
// gate's forward and backward (mg_m3_gate_bwd.cuh) share it, so both see the
// same bits.
// The scale r of a head whose values yv are already loaded (gate_head_load
// without the loads; the gate backward loads all of a warp's heads first).
__device__ __forceinline__ float gate_head_rms(const float (&yv)[GATE_VPL])
{
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < GATE_VPL; ++i) ss += yv[i] * yv[i];
    float r = 1.0f;
    if (OUTPROJ_NORM) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
        r = 1.0f / sqrtf(ss / (float)P + EPS);
    }
    return r;
}

__device__ __forceinline__ float gate_head_load(const float *yt, int h, int lane, float (&yv)[GATE_VPL])
{
#pragma unroll
    for (int i = 0; i < GATE_VPL; ++i) {
        const int p = lane + 32 * i;
        yv[i] = p < P ? yt[h * P + p] : 0.0f;
    }
    return gate_head_rms(yv);
}

// Writes head h's gated outputs gt[h*P + p] (lane's entries p = lane +
// 32*i) from its values yv and scale r (gate_head_load), z (zt, the token's
// z row) and norm_gate_w: the expression of doc/math.md step 11. The gate
// kernel and the decode mixer share it.
__device__ __forceinline__ void gate_head_store(const float (&yv)[GATE_VPL], float r, int h, int lane,
                                                const act_t *zt, const float *ngw, act_t *gt)
{
#pragma unroll
    for (int i = 0; i < GATE_VPL; ++i) {
        const int p = lane + 32 * i;
        if (p < P) {
            const int e = h * P + p;
            const float gw = OUTPROJ_NORM ? r * ngw[e] : 1.0f;
            gt[e] = from_f32<act_t>(yv[i] * gw * silu(to_f32(zt[e])));
        }
    }
}

// ---------------------------------------------------------------------------
// gate_kernel: doc/math.md step 11, one block of GATE_THREADS per token; warp w
// handles heads w, w+GATE_WARPS, ...; lane l holds the head's entries
// p = l + 32*i (i < GATE_VPL):
//   OUTPROJ_NORM: g = y * rms(y over the head's P values) * norm_gate_w * silu(z)
//   else:         g = y * silu(z)
// The head's sum of squares is reduced by a fixed shuffle butterfly.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(GATE_THREADS)
gate_kernel(const float *__restrict__ y, const act_t *__restrict__ proj,
            const float *__restrict__ ngw, act_t *__restrict__ g)
{
    const size_t tok = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *yt = y + tok * E;
    const act_t *zt = proj + tok * NP + OFF_Z;
    act_t *gt = g + tok * E;
    for (int h = warp; h < H; h += GATE_WARPS) {
        float yv[GATE_VPL];
        const float r = gate_head_load(yt, h, lane, yv);
        gate_head_store(yv, r, h, lane, zt, ngw, gt);
    }
}
