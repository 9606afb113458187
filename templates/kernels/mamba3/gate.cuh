// mg_m3_gate.cuh: the output gate of the Mamba-3 SISO inference forward
// (gated RMSNorm per head, or y * silu(z)).
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// The gated RMSNorm's scale of a head from its sum of squares ss:
// 1/sqrt(ss/P + eps) by rsqrtf (2 ulp), where 1/sqrtf (a rounded root, then
// an IEEE division) was 2.7% of the fused chunked kernel's stall samples
// (mamba3_perf prefill on an H100). The gate's forward, the fused kernel and
// the gate backward take it from here, so they see the same bits.
__device__ __forceinline__ float gate_rms_scale(float ss) { return rsqrtf(ss / (float)P + EPS); }

// Loads head h of the token's y (yt) into yv (lane's entries p = lane + 32*i,
// 0 past P) and returns the head's scale r = 1/sqrt(mean(y^2) + eps) under
// OUTPROJ_NORM (the same in every lane: fixed butterfly; rsqrtf), else 1. The
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
        r = gate_rms_scale(ss);
    }
    return r;
}

// Head h of a token's row (y or z) as f32: the lane's entries p = lane +
// 32*i, 0 past P.
template <typename T>
__device__ __forceinline__ void gate_head_vals(const T *row, int h, int lane, float (&v)[GATE_VPL])
{
#pragma unroll
    for (int i = 0; i < GATE_VPL; ++i) {
        const int p = lane + 32 * i;
        v[i] = p < P ? to_f32(row[h * P + p]) : 0.0f;
    }
}

__device__ __forceinline__ float gate_head_load(const float *yt, int h, int lane, float (&yv)[GATE_VPL])
{
    gate_head_vals(yt, h, lane, yv);
    return gate_head_rms(yv);
}

// gate_head_store writes head h's gated outputs gt[h*P + p] (lane's
// entries p = lane + 32*i) from its values yv and scale r (gate_head_load),
// the lane's z values zv (gate_head_vals of the token's z row) and
// norm_gate_w: the expression of doc/math.md step 11. The gate kernel and
// the decode mixer share it.
__device__ __forceinline__ void gate_head_store(const float (&yv)[GATE_VPL], const float (&zv)[GATE_VPL],
                                                float r, int h, int lane, const float *ngw, act_t *gt)
{
#pragma unroll
    for (int i = 0; i < GATE_VPL; ++i) {
        const int p = lane + 32 * i;
        if (p < P) {
            const int e = h * P + p;
            const float gw = OUTPROJ_NORM ? r * ngw[e] : 1.0f;
            gt[e] = from_f32<act_t>(yv[i] * gw * silu(zv[i]));
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
// A warp loads all of its heads' y, then all of their z, before the
// outputs: one head at a time left a warp two loads in flight and the
// kernel at about half the copy rate; the per-head arithmetic (and so
// every bit) is unchanged.
// ---------------------------------------------------------------------------
// A warp's heads h = warp + j*GATE_WARPS of one token's row (y or z) as f32,
// lane entries p = lane + 32*i (0 past P or H), all loads issued together.
template <int HPW, typename T>
__device__ __forceinline__ void gate_load_heads(const T *row, int warp, int lane, float (&v)[HPW][GATE_VPL])
{
#pragma unroll
    for (int j = 0; j < HPW; ++j) {
        const int h = warp + j * GATE_WARPS;
        if (h < H) {   // warp-uniform
            gate_head_vals(row, h, lane, v[j]);
        } else {
#pragma unroll
            for (int i = 0; i < GATE_VPL; ++i) v[j][i] = 0.0f;
        }
    }
}

__global__ void __launch_bounds__(GATE_THREADS)
gate_kernel(const float *__restrict__ y, const act_t *__restrict__ proj,
            const float *__restrict__ ngw, act_t *__restrict__ g)
{
    constexpr int HPW = (H + GATE_WARPS - 1) / GATE_WARPS;   // heads per warp
    const size_t tok = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *yt = y + tok * E;
    const act_t *zt = proj + tok * NP + OFF_Z;
    act_t *gt = g + tok * E;
    float yv[HPW][GATE_VPL], zv[HPW][GATE_VPL], r[HPW];
    gate_load_heads(yt, warp, lane, yv);
    // the scales before z is loaded: fewer values live across the division
#pragma unroll
    for (int j = 0; j < HPW; ++j) r[j] = gate_head_rms(yv[j]);
    gate_load_heads(zt, warp, lane, zv);
#pragma unroll
    for (int j = 0; j < HPW; ++j) {
        const int h = warp + j * GATE_WARPS;
        if (h < H) gate_head_store(yv[j], zv[j], r[j], h, lane, ngw, gt);   // warp-uniform
    }
}
