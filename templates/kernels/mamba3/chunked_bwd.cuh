// mg_m3_chunked_bwd.cuh: the chunked SSM backward of Mamba-3 SISO on the
// tensor-core tiles of mg_m3_tiles.cuh (shape: the CKB_* constants of
// NAME_backward.cu).
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ===========================================================================
// Chunked SSM backward: the backward of doc/math.md "Chunked form", chunk length
// CKB_Q, for scan.mode chunked (or auto on long calls).
//
// One block per (head h, sequence b) walks the chunks from last to first
// with the adjoint G = dL/d(state entering the next chunk) (P x N, f32) in
// the warps' accumulator registers, as the chunked forward holds the state.
// Its phases wait on staging and on one-warp scans, so two blocks share an
// SM where their shared memory fits (CKB_MIN_BLOCKS: mamba3_perf's 256
// blocks then run as one wave instead of 1.94): E dY is staged where M and
// W were (they are dead after phase D), and no per-token array is kept
// that another holds already.
// Inside a chunk (local t, s; k, q the rotated k', q'; cs_t the prefix sum
// of A*dt; E_t = exp(cs_t); scale_s = gamma_s + (1-lam_{s+1}) dt_{s+1};
// w_s = exp(cs_end - cs_s) scale_s; Lm[t][s] = exp(cs_t - cs_s) scale_s for
// s < t, gamma_t on the diagonal) the forward is
//   y_t = E_t Hc q_t + sum_{s<=t} Lm[t][s] (q_t.k_s) v_s + D v_t,
//   Hc' = exp(cs_end) Hc + sum_s w_s v_s k_s^T,
// with Hc the chunk's entering state (shifted form: the true state at the
// chunk start plus (1-lam_{t0}) dt_{t0} v_{t0-1} k_{t0-1}^T, as the chunked
// forward for training saves it). Its backward, with M = Lm o (dY V^T) and
// W = Lm o (Q K^T) (causal, staged), per chunk:
//   dV = W^T dY + D dY + diag(w) K G^T
//   dQ = diag(E) dY Hc + M K
//   dK = M^T Q + diag(w) V G
//   G <- exp(cs_end) G + (diag(E) dY)^T Q        (dL/dHc)
// and the scalars: dcs_t = E_t dy_t.(Hc q_t) + sum_{s<t} R[t][s]
// - sum_{t'>t} R[t'][t] - w_t dw_t (R = M o QK^T off the diagonal,
// dw_s = v_s.(G k_s)), plus exp(cs_end) <G, Hc> + sum_s w_s dw_s at cs_end;
// d(A dt)_r = sum_{t>=r} dcs_t; dscale_s = sum_{t>s} (dy_t.v_s)(q_t.k_s)
// exp(cs_t - cs_s) + exp(cs_end - cs_s) dw_s; dgamma_t = dscale_t +
// (dy_t.v_t)(q_t.k_t); then lambda and dt from gamma = lam dt and the
// shifted term (1-lam_t) dt_t, whose gradient is dscale_{t-1} (the previous
// chunk's last token for t = chunk start: held until that chunk is done).
// Products run on the 16 x 8 x 16 tiles of the forward (tensor cores for
// bf16/f16 with operands rounded to the storage dtype, f32 FMA for f32);
// every sum has a fixed order (partials per tile in shared memory, summed
// in tile order): bit-identical reruns, no atomics. Outputs and their
// layouts are those of scan_bwd_kernel.
//
// Episode starts (STARTS, start [batch][seqlen] bytes; doc/math.md section
// 9). The forward's masks (mg_m3_chunked_body.cuh, "Episode starts") make
// constant zeros of E_t (t at or after the chunk's first start), of the
// pairs Lm[t][s] with a start in (s, t], of w_s (s before the chunk's last
// start) and of exp(cs_end) (a chunk holding a start), and drop the
// shifted term (1-lam_t) dt_t of a start token t. Every derivative above
// is the masked factor times something, so the same formulas with the same
// masks are the backward: the staged flags give lst_t (last start at or
// before t, over s_adt, as in ck_decay), phase B masks E, exp(cs_end - cs_s)
// (the dscale factor) and w, ckb_block the pairs (M, W and their sums), and
// the shifted-term gradient dscale_{t-1} is not given to a start token t
// (nor to the first token of the chunk walked before, when it is a start).
// No adjoint crosses a start: G leaving a chunk with a start is the part
// of its tokens before the first start, 0 when that is the first token.
// ===========================================================================

// One causal 16 x 16 block (t-tile tb, s-tile sb) of QK^T and dY V^T into
// M, W and the block's partial sums (phase C below). STARTS: s_lst[t] is
// the last start at or before row t (-1: none); pairs across one are 0.
template <bool STARTS>
__device__ __forceinline__ void ckb_block(int tb, int sb, int lane, const op_t *Qs, const op_t *Ks,
                                          const op_t *Ys, const op_t *Vs, op_t *Mm, op_t *Wm,
                                          const float *s_cs, const float *s_scl, const float *s_gam,
                                          float *s_dg, float *rowR, float *colR, float *colS, const float *s_lst)
{
    const int g = lane >> 2, cc = (lane & 3) * 2;
    const int t0 = tb * 16, s0 = sb * 16;
    float qk[2][4], dv[2][4];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int r = 0; r < 4; ++r) qk[jj][r] = dv[jj][r] = 0.0f;
    // (each tile with its own A load: one A for both raised the kernel's
    // register pressure into spills)
#pragma unroll 2
    for (int ks = 0; ks < N; ks += 16)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
            tile_mma_core<false, false>(qk[jj], Qs + t0 * CKB_LDN + ks, Ks + (s0 + 8 * jj) * CKB_LDN + ks, lane, CKB_LDN,
                                        CKB_LDN);
#pragma unroll 2
    for (int ks = 0; ks < P; ks += 16)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
            tile_mma_core<false, false>(dv[jj], Ys + t0 * CKB_LDP + ks, Vs + (s0 + 8 * jj) * CKB_LDP + ks, lane, CKB_LDP,
                                        CKB_LDP);
    float rsum[2], csum[2][2], ssum[2][2];   // rows g, g+8: sum over s of R; [jj][col cc / cc+1]:
#pragma unroll                                // sums over t of R and of the dscale terms
    for (int e = 0; e < 2; ++e) {
        rsum[e] = 0.0f;
        csum[0][e] = csum[1][e] = ssum[0][e] = ssum[1][e] = 0.0f;
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int tr = t0 + g + 8 * (r >> 1), sc = s0 + 8 * jj + cc + (r & 1);
            float m = 0.0f, w = 0.0f;
            if (sc < tr && (!STARTS || sc >= (int)s_lst[tr])) {
                // rounded products, then rounded adds: whether the compiler
                // contracts a product into a sum must not depend on the
                // STARTS branch around it (an all-zero mask gives the
                // maskless bits)
                const float lm = ck_wdecay(s_cs[tr] - s_cs[sc]);
                const float L = __fmul_rn(lm, s_scl[sc]);
                const float rr = __fmul_rn(dv[jj][r], qk[jj][r]);
                const float rl = __fmul_rn(rr, L);
                m = L * dv[jj][r];
                w = L * qk[jj][r];
                rsum[r >> 1] = __fadd_rn(rsum[r >> 1], rl);
                csum[jj][r & 1] = __fadd_rn(csum[jj][r & 1], rl);
                ssum[jj][r & 1] = __fadd_rn(ssum[jj][r & 1], __fmul_rn(rr, lm));
            } else if (sc == tr) {
                m = s_gam[tr] * dv[jj][r];
                w = s_gam[tr] * qk[jj][r];
                s_dg[tr] = dv[jj][r] * qk[jj][r];
            }
            Mm[tr * CKB_LDQ + sc] = from_f32<op_t>(m);
            Wm[tr * CKB_LDQ + sc] = from_f32<op_t>(w);
        }
    // rows: the 4 lanes of a row group (xor 1, 2); columns: the 8 row groups (xor 4, 8, 16)
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        rsum[0] += __shfl_xor_sync(FULL_MASK, rsum[0], o);
        rsum[1] += __shfl_xor_sync(FULL_MASK, rsum[1], o);
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                csum[jj][e] += __shfl_xor_sync(FULL_MASK, csum[jj][e], o);
                ssum[jj][e] += __shfl_xor_sync(FULL_MASK, ssum[jj][e], o);
            }
    if ((lane & 3) == 0) {
        rowR[sb * CKB_Q + t0 + g] = rsum[0];
        rowR[sb * CKB_Q + t0 + g + 8] = rsum[1];
    }
    if (g == 0) {
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                colR[tb * CKB_Q + s0 + 8 * jj + cc + e] = csum[jj][e];
                colS[tb * CKB_Q + s0 + 8 * jj + cc + e] = ssum[jj][e];
            }
    }
}

// The raw form of the stage build (kq_stage_raw) where its scratch fits the
// M and W tiles, which are free during the stage.
constexpr bool CKB_RAW = kq_build::raw_fits_bytes(CKB_Q, 2 * CKB_Q * CKB_LDQ * (int)sizeof(op_t));
// Phase A's v and dy staged 8 entries a thread (16-byte vectors of v's
// in_proj columns and of dy): the rows' v columns 16-byte aligned, P a
// multiple of 8 with 8-entry groups inside a 32-lane slice, and whole warps
// of items (so every lane reaches each shuffle).
constexpr bool CKB_VDY = (NP * (int)sizeof(act_t)) % 16 == 0 && (OFF_X * (int)sizeof(act_t)) % 16 == 0 &&
                         P % 8 == 0 && (CKB_Q * P / 8) % 32 == 0;

template <bool STARTS>
__global__ void __launch_bounds__(CKB_THREADS, CKB_MIN_BLOCKS)
scan_bwd_chunked_kernel(int seqlen, const act_t *__restrict__ proj, const kq_build bld, const float *__restrict__ dt,
                        const float *__restrict__ adt, const float *__restrict__ lam,
                        const float *__restrict__ Dskip, const float *__restrict__ ckpt,
                        const float *__restrict__ kp0, const float *__restrict__ vp0,
                        const float *__restrict__ dy, const float *__restrict__ rot,
                        dkq_t *__restrict__ dk, dkq_t *__restrict__ dq,
                        act_t *__restrict__ dproj, float *__restrict__ dadt_o, float *__restrict__ ddt_o,
                        float *__restrict__ dlam_o, float *__restrict__ gth, float *__restrict__ part_D,
                        float *__restrict__ part_k, float *__restrict__ part_q,
                        float *__restrict__ dssm0, float *__restrict__ dkp0, float *__restrict__ dvp0,
                        const unsigned char *__restrict__ start)
{
    extern __shared__ __align__(16) unsigned char bq_smem[];
    op_t *Qs = reinterpret_cast<op_t *>(bq_smem);   // [CKB_Q][LDN] q'_t
    op_t *Ks = Qs + CKB_Q * CKB_LDN;                      // [CKB_Q][LDN] k'_s
    op_t *Ys = Ks + CKB_Q * CKB_LDN;                      // [CKB_Q][LDP] dy_t
    op_t *Vs = Ys + CKB_Q * CKB_LDP;                      // [CKB_Q][LDP] v_s
    op_t *Hc = Vs + CKB_Q * CKB_LDP;                      // [P][LDN]  state entering the chunk
    op_t *Gs = Hc + P * CKB_LDN;                       // [P][LDN]  adjoint G of the state leaving it
    op_t *Mm = Gs + P * CKB_LDN;                       // [CKB_Q][LDQ] M[t][s] (causal)
    op_t *Wm = Mm + CKB_Q * CKB_LDQ;                      // [CKB_Q][LDQ] W[t][s] (causal)
    // [CKB_Q][LDP] E_t dy_t, phase F's operand: staged where M and W were
    // (dead after phase D) when it fits there, so that two blocks share an
    // SM (CKB_MIN_BLOCKS), else in a buffer of its own.
    op_t *Ye = CKB_YE_IN_M ? Mm : Wm + CKB_Q * CKB_LDQ;
    float *fs = reinterpret_cast<float *>(Wm + CKB_Q * CKB_LDQ + (CKB_YE_IN_M ? 0 : CKB_Q * CKB_LDP));
    float *s_adt = fs, *s_cs = fs + CKB_Q, *s_ecs = fs + 2 * CKB_Q, *s_gam = fs + 3 * CKB_Q;
    float *s_scl = fs + 4 * CKB_Q, *s_dt = fs + 5 * CKB_Q, *s_lam = fs + 6 * CKB_Q;
    float *s_ew = fs + 7 * CKB_Q, *s_w = fs + 8 * CKB_Q, *s_dg = fs + 9 * CKB_Q;
    float *s_dcs = fs + 10 * CKB_Q, *s_dsc = fs + 11 * CKB_Q, *s_dw = fs + 12 * CKB_Q;
    float *s_yvp = fs + 13 * CKB_Q;             // [CKB_Q][CKB_YVP] partial dy_t . v_t per row slice
                                                // (phase E: s_yvp[t][0] = their sum)
    float *rowR = s_yvp + CKB_Q * CKB_YVP;       // [CKB_T][CKB_Q] row sums of R per s-tile
    float *colR = rowR + CKB_T * CKB_Q;          // [CKB_T][CKB_Q] column sums of R per t-tile
    float *colS = colR + CKB_T * CKB_Q;          // [CKB_T][CKB_Q] column sums for dscale per t-tile
    float *pint = colS + CKB_T * CKB_Q;          // [N/CW][CKB_Q] partial dy_t.(Hc q_t) per column group
    float *pdw = pint + (N / CKB_CW) * CKB_Q;    // [N/CW][CKB_Q] partial dw_s per column group
    float *s_wp = pdw + (N / CKB_CW) * CKB_Q;    // [WARPS] per-warp <G, Hc>
    float *s_misc = s_wp + CKB_WARPS;          // [16]

    if (seqlen <= 0) return;
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, cc = (lane & 3) * 2;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;
    const int nck = (seqlen + CKPT_STRIDE - 1) / CKPT_STRIDE;   // checkpoints of the sequence
    const int nch = (seqlen + CKB_Q - 1) / CKB_Q;     // backward chunks
    const size_t tps = (size_t)(seqlen + 15) / 16;     // 16-token tiles per sequence (part_k, part_q rows)
    const float dsk = Dskip[h];
    if constexpr (STARTS) {
        if (start[row0]) kp0 = vp0 = nullptr;   // a start at t = 0: the initial state is not read
    }
    bool pend_start = false;   // STARTS: the first token of the chunk walked last is a start (thread 0)

    // This warp's adjoint tile: rows p0s.., columns n0s..; ga[j][r] holds
    // (p0s + g + 8*(r/2), n0s + 8j + cc + r%2).
    const int p0s = (warp % (P / 16)) * 16, n0s = (warp / (P / 16)) * CKB_NW;
    float ga[CKB_NW / 8][4];
#pragma unroll
    for (int j = 0; j < CKB_NW / 8; ++j) {
        ga[j][0] = ga[j][1] = ga[j][2] = ga[j][3] = 0.0f;
#pragma unroll
        for (int r = 0; r < 4; ++r)
            Gs[(p0s + g + 8 * (r >> 1)) * CKB_LDN + n0s + 8 * j + cc + (r & 1)] = from_f32<op_t>(0.0f);
    }
    float gD = 0.0f;   // sum_t dy_t . v_t (thread 0; the chunks' sums, last chunk first)
    // Pending d dt / d lam of the first token of the chunk walked last
    // (thread 0): its shifted-term gradient comes from this chunk's last token.
    float pend_ddt = 0.0f, pend_dlam = 0.0f;

    for (int c = nch - 1; c >= 0; --c) {
        const int c0 = c * CKB_Q;
        const int len = min(CKB_Q, seqlen - c0);
        __syncthreads();   // the previous chunk is done with the stage; Gs is written
        // ---- A: stage the chunk (rows past the sequence end are zeros) ----
        for (int i = tid; i < CKB_Q; i += CKB_THREADS) {
            float a = 0.0f, d = 0.0f, l = 0.0f, nx = 0.0f;
            if (i < len) {
                const size_t th = (row0 + c0 + i) * H + h;
                a = adt[th];
                d = dt[th];
                l = lam[th];
                if (c0 + i + 1 < seqlen) nx = (1.0f - lam[th + H]) * dt[th + H];
            }
            if constexpr (STARTS) {
                float f = 0.0f;
                if (i < len) {
                    f = start[row0 + c0 + i] ? 1.0f : 0.0f;
                    if (c0 + i + 1 < seqlen && start[row0 + c0 + i + 1]) nx = 0.0f;   // its beta copy is dropped
                }
                s_cs[i] = f;   // the start flags, for phase B
            }
            // scale_i = gamma_i + (1 - lam_{i+1}) dt_{i+1}: the rounded product,
            // then a rounded add (no contraction), as when it was summed in phase B
            const float gm = l * d;
            s_adt[i] = a; s_dt[i] = d; s_lam[i] = l; s_gam[i] = gm; s_scl[i] = __fadd_rn(gm, nx);
            s_dg[i] = 0.0f;
        }
        // q', k' built from the in_proj rows, the token's 1/rms and the
        // angle table (kq_stage_build: prep_rot_kernel's values), the
        // forward's stage to the bit; where it fits (CKB_RAW) as the
        // forward does it: the raw rows, angles and 1/rms copied
        // (kq_stage_raw; the M and W tiles, free until phase C, hold the
        // angles and 1/rms), built in place after the barrier below
        if constexpr (CKB_RAW)
            kq_stage_raw(bld, Qs, Ks, CKB_LDN, reinterpret_cast<float *>(Mm), row0 + c0, len, h, tid, CKB_Q,
                         CKB_THREADS);
        else
            kq_stage_build(bld, Qs, Ks, CKB_LDN, row0 + c0, len, h, tid, CKB_Q, CKB_THREADS);
        // v and dy, and dy_t . v_t (f32) in partials over warp-wide row
        // slices: a warp's lanes cover min(P, 32) consecutive p of a row
        // (CKB_THREADS and P are multiples of 32 and 16), summed by a fixed
        // xor butterfly within the slice. A thread's items go in batches of
        // VB (up to 8): the batch's loads first (in flight together), then its
        // stores and sums, the same values in the same order as one at a time.
        // The loads are unconditional: a row past the sequence end reads the
        // chunk's first row (a token of the sequence) and its values are
        // replaced by zeros after the batch. Why: a load under `if (i < len)`
        // was converted inside its branch, so each waited for the one
        // before (Nsight Compute on an H100: a quarter of the kernel's stall
        // samples at mamba3_perf's b8 T4096, after the q', k' copies).
        if constexpr (CKB_VDY) {
            // 8 consecutive p a thread (16-byte loads of v, two of dy), the
            // products summed in the thread as the butterfly's first three
            // levels pair them ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)), then
            // the remaining levels across the slice's SEG/8 threads: the
            // tree of the 32-lane butterfly, pair for pair (rounded
            // products and adds, no contraction), so the same bits with an
            // eighth of its shuffles. Rows past the end as below.
            constexpr int SEG = P < 32 ? P : 32;
            constexpr int NV8 = CKB_Q * P / 8;   // 8-entry items (whole warps: see CKB_VDY)
            for (int vi = tid; vi < NV8; vi += CKB_THREADS) {
                const int i = vi / (P / 8), p = 8 * (vi % (P / 8));
                const size_t tok = row0 + c0 + (i < len ? i : 0);
                const avec<8, 16> vr = *reinterpret_cast<const avec<8, 16> *>(proj + tok * NP + OFF_X + h * P + p);
                const float4 g0 = *reinterpret_cast<const float4 *>(dy + tok * E + h * P + p);
                const float4 g1 = *reinterpret_cast<const float4 *>(dy + tok * E + h * P + p + 4);
                const float gy[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
                float x[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float v = i < len ? to_f32(vr.e[j]) : 0.0f;
                    const float gj = i < len ? gy[j] : 0.0f;
                    Vs[i * CKB_LDP + p + j] = from_f32<op_t>(v);
                    Ys[i * CKB_LDP + p + j] = from_f32<op_t>(gj);
                    x[j] = __fmul_rn(v, gj);
                }
                float yv = __fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), __fadd_rn(x[2], x[3])),
                                     __fadd_rn(__fadd_rn(x[4], x[5]), __fadd_rn(x[6], x[7])));
#pragma unroll
                for (int o = 1; o < SEG / 8; o <<= 1) yv = __fadd_rn(yv, __shfl_xor_sync(FULL_MASK, yv, o));
                if (p % SEG == 0) s_yvp[i * CKB_YVP + p / SEG] = yv;
            }
        } else {
            constexpr int SEG = P < 32 ? P : 32;
            constexpr int VI = CKB_Q * P / CKB_THREADS;   // items per thread
            constexpr int VB = VI < 8 ? VI : 8;
            static_assert(CKB_Q * P % CKB_THREADS == 0 && VI % VB == 0, "v, dy items: whole batches per thread");
#pragma unroll 1
            for (int u0 = 0; u0 < VI; u0 += VB) {
                act_t vraw[VB];
                float graw[VB];
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int idx = tid + (u0 + u) * CKB_THREADS, i = idx / P, p = idx % P;
                    const size_t tok = row0 + c0 + (i < len ? i : 0);
                    vraw[u] = proj[tok * NP + OFF_X + h * P + p];
                    graw[u] = dy[tok * E + h * P + p];
                }
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int idx = tid + (u0 + u) * CKB_THREADS, i = idx / P, p = idx % P;
                    const float v = i < len ? to_f32(vraw[u]) : 0.0f;
                    const float gy = i < len ? graw[u] : 0.0f;
                    Vs[i * CKB_LDP + p] = from_f32<op_t>(v);
                    Ys[i * CKB_LDP + p] = from_f32<op_t>(gy);
                    float yv = v * gy;
#pragma unroll
                    for (int o = 1; o < SEG; o <<= 1) yv += __shfl_xor_sync(FULL_MASK, yv, o);
                    if (p % SEG == 0) s_yvp[i * CKB_YVP + p / SEG] = yv;
                }
            }
        }
        // The entering state (the chunked forward's checkpoint: the shifted
        // form), in this warp's tile layout and staged (Hc). <G, Hc> per warp
        // for the cs_end term.
        float wdot = 0.0f;
        {
            const float *cp = ckpt + (bh * nck + (size_t)c0 / CKPT_STRIDE) * (size_t)(P * N);
            float2 hv[CKB_NW / 8][2];   // all loads first (memory-level parallelism)
#pragma unroll
            for (int j = 0; j < CKB_NW / 8; ++j)
#pragma unroll
                for (int rr = 0; rr < 2; ++rr)
                    hv[j][rr] = *reinterpret_cast<const float2 *>(cp + (p0s + g + 8 * rr) * N + n0s + 8 * j + cc);
#pragma unroll
            for (int j = 0; j < CKB_NW / 8; ++j)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float e = (r & 1) ? hv[j][r >> 1].y : hv[j][r >> 1].x;
                    wdot += ga[j][r] * e;
                }
#pragma unroll
            for (int j = 0; j < CKB_NW / 8; ++j)   // (a lane's columns cc, cc + 1: one paired store)
#pragma unroll
                for (int rr = 0; rr < 2; ++rr)
                    st2_from_f32(Hc + (p0s + g + 8 * rr) * CKB_LDN + n0s + 8 * j + cc, hv[j][rr]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) wdot += __shfl_xor_sync(FULL_MASK, wdot, o);
            if (lane == 0) s_wp[warp] = wdot;
        }
        if constexpr (CKB_RAW) cp_async_wait_all();
        __syncthreads();
        if constexpr (CKB_RAW)   // (the barrier after B covers it)
            kq_stage_finish(bld, Qs, Ks, CKB_LDN, reinterpret_cast<const float *>(Mm), len, h, tid, CKB_Q, CKB_THREADS);
        // ---- B: cumulative decay and weights (warp 0, fixed order) ----
        if (warp == 0) {
            int lcarry;   // STARTS: the chunk's last start (-1: none)
            const float carry = ck_cumsum<CKB_Q, STARTS>(s_adt, s_cs, lane, lcarry);   // cs at the chunk's end
            for (int i = lane; i < CKB_Q; i += 32) {
                const float cs = s_cs[i], sc = s_scl[i];
                if constexpr (STARTS) {
                    const float ew = i >= lcarry ? expf(carry - cs) : 0.0f;
                    s_ecs[i] = s_adt[i] < 0.0f ? expf(cs) : 0.0f;
                    s_ew[i] = ew;
                    s_w[i] = ew * sc;
                } else {
                    const float ew = expf(carry - cs);
                    s_ecs[i] = expf(cs);
                    s_ew[i] = ew;
                    s_w[i] = ew * sc;
                }
            }
            if (lane == 0) {
                if constexpr (STARTS) s_misc[0] = lcarry < 0 ? expf(carry) : 0.0f;
                else s_misc[0] = expf(carry);
            }
        }
        __syncthreads();
        // The chunk walked next (c - 1): the lines its q', k' are built
        // from, its rows of dy, v, the lines of its A*dt, dt and lambda, and
        // its checkpoint into L2 while this one computes (one 128-byte line
        // per prefetch), so its staging waits on L2 rather than on HBM.
        if (c > 0) {
            constexpr int LKQ = KQB_LINES;   // the lines k', q' are built from (kq_build_line)
            constexpr int LY = P * 4 / 128 > 0 ? P * 4 / 128 : 1;
            constexpr int LV = P * (int)sizeof(act_t) / 128 > 0 ? P * (int)sizeof(act_t) / 128 : 1;
            constexpr int LC = P * N * 4 / 128;
            const size_t r0 = row0 + c0 - CKB_Q;
            for (int i = tid; i < CKB_Q * (LKQ + LY + LV + 3) + LC; i += CKB_THREADS) {
                const char *pf;
                if (i < LC) {
                    pf = reinterpret_cast<const char *>(ckpt + (bh * nck + (size_t)(c0 - CKB_Q) / CKPT_STRIDE) * (size_t)(P * N)) + 128 * i;
                } else {
                    const int u = i - LC, t = u % CKB_Q, w = u / CKB_Q;
                    const size_t tok = r0 + t;
                    if (w < LKQ) pf = kq_build_line(bld, tok, h, w);
                    else if (w < LKQ + LY) pf = reinterpret_cast<const char *>(dy + tok * E + h * P) + 128 * (w - LKQ);
                    else if (w < LKQ + LY + LV)
                        pf = reinterpret_cast<const char *>(proj + tok * NP + OFF_X + h * P) + 128 * (w - LKQ - LY);
                    else if (w == LKQ + LY + LV) pf = reinterpret_cast<const char *>(adt + tok * H + h);
                    else if (w == LKQ + LY + LV + 1) pf = reinterpret_cast<const char *>(dt + tok * H + h);
                    else pf = reinterpret_cast<const char *>(lam + tok * H + h);
                }
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pf));
            }
        }
        // ---- C: the causal blocks of M and W with their partial sums ----
        {
            int cnt = 0;
            for (int tb = 0; tb < CKB_T; ++tb)
                for (int sb = 0; sb <= tb; ++sb, ++cnt)
                    if (cnt % CKB_WARPS == warp)
                        ckb_block<STARTS>(tb, sb, lane, Qs, Ks, Ys, Vs, Mm, Wm, s_cs, s_scl, s_gam, s_dg, rowR,
                                          colR, colS, s_adt);
        }
        __syncthreads();
        // ---- D: dV items, and dK + dQ items (16 rows x CKB_CW columns each) ----
        // A dK + dQ item computes dk' then dq' for the same rows and columns,
        // so that the rotary backward (mg_m3_angles_bwd.cuh) happens here, in
        // registers: each lane holds both columns (2a, 2a+1) of a rotated
        // pair, un-rotates them (R(theta)^T, rot [tok][H][S]) before the
        // store, and sums the local angle gradient
        //   g_t = -dk'0 k'1 + dk'1 k'0 - dq'0 q'1 + dq'1 q'0
        // (k', q' as staged) into gth [tok][H][S]; angles_bwd_kernel<.., true>
        // then only turns g into suffix sums. No pass over the per-head f32
        // dk, dq is left for the rotation.
        {
            constexpr int NV = CKB_T * (P / CKB_CW), NQ = CKB_T * (N / CKB_CW);
            for (int it = warp; it < NV + NQ; it += CKB_WARPS) {
                float acc[CKB_CW / 8][4];
#pragma unroll
                for (int j = 0; j < CKB_CW / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
                if (it < NV) {
                    // dv_s = w_s (G k_s)[p] + sum_{t>=s} W[t][s] dy_t + D dy_s
                    const int ms = it % CKB_T, s0 = ms * 16, p0 = (it / CKB_T) * CKB_CW;
                    for (int kn = 0; kn < N; kn += 16)
                        tile_mma_row<false, false, CKB_LDN, CKB_LDN>(acc, Ks + s0 * CKB_LDN + kn,
                                                                   Gs + p0 * CKB_LDN + kn, lane);
                    const float w0 = s_w[s0 + g], w1 = s_w[s0 + g + 8];
#pragma unroll
                    for (int j = 0; j < CKB_CW / 8; ++j) {
                        acc[j][0] *= w0; acc[j][1] *= w0; acc[j][2] *= w1; acc[j][3] *= w1;
                    }
                    for (int tb = ms; tb < CKB_T; ++tb)
                        tile_mma_row<true, true, CKB_LDQ, CKB_LDP>(acc, Wm + tb * 16 * CKB_LDQ + s0,
                                                                 Ys + tb * 16 * CKB_LDP + p0, lane);
#pragma unroll
                    for (int j = 0; j < CKB_CW / 8; ++j) {
                        // dy_s of both rows: one 8-byte load each (p even and
                        // E, P even), both issued before either is used (each
                        // had waited for its load at its store); a row past
                        // the end reads the chunk's first row, not stored
                        float2 dys2[2];
#pragma unroll
                        for (int rr = 0; rr < 2; ++rr) {
                            const int sr = s0 + g + 8 * rr, p = p0 + 8 * j + cc;
                            dys2[rr] = *reinterpret_cast<const float2 *>(
                                dy + (row0 + c0 + (sr < len ? sr : 0)) * E + h * P + p);
                        }
#pragma unroll
                        for (int rr = 0; rr < 2; ++rr) {
                            const int sr = s0 + g + 8 * rr, p = p0 + 8 * j + cc;
                            if (sr < len) {
                                // dv is the x columns of the in_proj gradient
                                // row (v = x): stored there in the storage
                                // dtype, as prep_bwd stored it from an f32 dv
                                const size_t tok = row0 + c0 + sr;
                                const float2 dys = dys2[rr];
                                float2 out;
                                out.x = acc[j][2 * rr] + dsk * dys.x;
                                out.y = acc[j][2 * rr + 1] + dsk * dys.y;
                                // (two scalar stores: a row of NP values need not
                                // keep pairs aligned)
                                act_t *dx = dproj + tok * NP + OFF_X + h * P + p;
                                dx[0] = from_f32<act_t>(out.x);
                                dx[1] = from_f32<act_t>(out.y);
                            }
                        }
                    }
                } else {
                    const int i2 = it - NV;
                    const int m0 = (i2 % CKB_T) * 16, cg = i2 / CKB_T, n0 = cg * CKB_CW;
                    float ga_loc[CKB_CW / 8][2];   // local angle gradient per (pair j, row rr)
#pragma unroll
                    for (int j = 0; j < CKB_CW / 8; ++j) ga_loc[j][0] = ga_loc[j][1] = 0.0f;
                    // the (cos, sin) of this lane's rotated pairs, both rows,
                    // taken once for the dk' and dq' passes (the angle loads
                    // issued before any is used); a row past the end reads
                    // the chunk's first row and is not stored
                    float2 rcs_j[CKB_CW / 8][2];
#pragma unroll
                    for (int j = 0; j < CKB_CW / 8; ++j) {
                        const int n = n0 + 8 * j + cc;
                        rcs_j[j][0] = rcs_j[j][1] = make_float2(1.0f, 0.0f);
                        if (n < 2 * S) {
#pragma unroll
                            for (int rr = 0; rr < 2; ++rr) {
                                const int tr = m0 + g + 8 * rr;
                                rcs_j[j][rr].x = rot[((row0 + c0 + (tr < len ? tr : 0)) * H + h) * S + n / 2];
                            }
                        }
                    }
#pragma unroll
                    for (int j = 0; j < CKB_CW / 8; ++j)
                        if (n0 + 8 * j + cc < 2 * S) {
#pragma unroll
                            for (int rr = 0; rr < 2; ++rr) {
                                const float ra = rcs_j[j][rr].x;
                                rot_cos_sin(ra, rcs_j[j][rr].x, rcs_j[j][rr].y);
                            }
                        }
#pragma unroll 1
                    for (int pass = 0; pass < 2; ++pass) {   // dk' first, then dq'
                        const bool isq = pass == 1;
#pragma unroll
                        for (int j = 0; j < CKB_CW / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
                        // first product: dY Hc (dq') or V G (dk'), k over p
                        const op_t *A1 = isq ? Ys : Vs;
                        const op_t *B1 = isq ? Hc : Gs;
                        for (int kp = 0; kp < P; kp += 16)
                            tile_mma_row<false, true, CKB_LDP, CKB_LDN>(acc, A1 + m0 * CKB_LDP + kp,
                                                                      B1 + kp * CKB_LDN + n0, lane);
                        // its row dot with q'_t (dq': dy_t.(Hc q_t)) or k'_s (dk': dw_s), f32;
                        // q', k' read from the stage, which holds the kq_t
                        // values exactly (not again from global memory)
                        const op_t *rv = isq ? Qs : Ks;
                        float rd[2] = {0.0f, 0.0f};
#pragma unroll
                        for (int rr = 0; rr < 2; ++rr) {
                            const int tr = m0 + g + 8 * rr;
                            if (tr < len) {
                                const op_t *vr = rv + tr * CKB_LDN;
#pragma unroll
                                for (int j = 0; j < CKB_CW / 8; ++j) {
                                    const int n = n0 + 8 * j + cc;
                                    rd[rr] += acc[j][2 * rr] * to_f32(vr[n]) + acc[j][2 * rr + 1] * to_f32(vr[n + 1]);
                                }
                            }
                        }
#pragma unroll
                        for (int o = 1; o < 4; o <<= 1) {
                            rd[0] += __shfl_xor_sync(FULL_MASK, rd[0], o);
                            rd[1] += __shfl_xor_sync(FULL_MASK, rd[1], o);
                        }
                        float *pd = (isq ? pint : pdw) + cg * CKB_Q;
                        if ((lane & 3) == 0) {
                            pd[m0 + g] = rd[0];
                            pd[m0 + g + 8] = rd[1];
                        }
                        const float *sc = isq ? s_ecs : s_w;
                        const float e0 = sc[m0 + g], e1 = sc[m0 + g + 8];
#pragma unroll
                        for (int j = 0; j < CKB_CW / 8; ++j) {
                            acc[j][0] *= e0; acc[j][1] *= e0; acc[j][2] *= e1; acc[j][3] *= e1;
                        }
                        if (isq) {
                            // + M K: sum over s <= t
                            for (int sb = 0; sb <= m0 / 16; ++sb)
                                tile_mma_row<false, true, CKB_LDQ, CKB_LDN>(acc, Mm + m0 * CKB_LDQ + sb * 16,
                                                                          Ks + sb * 16 * CKB_LDN + n0, lane);
                        } else {
                            // + M^T Q: sum over t >= s
                            for (int tb = m0 / 16; tb < CKB_T; ++tb)
                                tile_mma_row<true, true, CKB_LDQ, CKB_LDN>(acc, Mm + tb * 16 * CKB_LDQ + m0,
                                                                         Qs + tb * 16 * CKB_LDN + n0, lane);
                        }
                        dkq_t *out = isq ? dq : dk;
                        float *pcol = isq ? part_q : part_k;
                        const op_t *stg = isq ? Qs : Ks;   // k', q' as staged (the kq_t values, exactly)
#pragma unroll
                        for (int j = 0; j < CKB_CW / 8; ++j) {
                            const int n = n0 + 8 * j + cc;
                            float2 col = make_float2(0.0f, 0.0f);   // the item's column sums, rows in order
                            const float2 *rcs = rcs_j[j];
#pragma unroll
                            for (int rr = 0; rr < 2; ++rr) {
                                const int tr = m0 + g + 8 * rr;
                                if (tr < len) {
                                    const size_t th = (row0 + c0 + tr) * H + h;
                                    float2 o = make_float2(acc[j][2 * rr], acc[j][2 * rr + 1]);
                                    if (n < 2 * S) {   // a rotated pair a = n / 2 (n is even)
                                        const float v0 = to_f32(stg[tr * CKB_LDN + n]);
                                        const float v1 = to_f32(stg[tr * CKB_LDN + n + 1]);
                                        // the order of angles_bwd_kernel's sum: dk' terms, then dq'
                                        float gl = ga_loc[j][rr];
                                        gl = isq ? __fmaf_rn(-o.x, v1, gl) : __fmul_rn(-o.x, v1);
                                        gl = __fmaf_rn(o.y, v0, gl);
                                        ga_loc[j][rr] = gl;
                                        o = unrotate_pair(rcs[rr].x, rcs[rr].y, o);
                                        if (isq) gth[th * S + n / 2] = gl;
                                    }
                                    st2_from_f32(out + th * N + n, o);   // (dkq_t: rounded here)
                                    col.x += o.x;   // the tile sums from the f32 values
                                    col.y += o.y;
                                }
                            }
                            // B_bias / C_bias: the 16 rows' sum of dk / dq per column
                            // (rows g and g + 8, then the row groups: xor 4, 8,
                            // 16), one partial row per 16-token tile, summed over
                            // the tiles by reduce_parts; a tile past the sequence
                            // end (m0 >= len) has no row
                            if (pcol && m0 < len) {
#pragma unroll
                                for (int o = 4; o < 32; o <<= 1) {
                                    col.x += __shfl_xor_sync(FULL_MASK, col.x, o);
                                    col.y += __shfl_xor_sync(FULL_MASK, col.y, o);
                                }
                                if (g == 0)
                                    *reinterpret_cast<float2 *>(pcol + ((b * tps + (c0 + m0) / 16) * H + h) * N + n) = col;
                            }
                        }
                    }   // pass
                }
            }
        }
        __syncthreads();
        // ---- E: E dY for phase F (M and W are dead: see Ye); per-token
        // scalars (thread per token), then warp 0 in order ----
        // (dy in batches of loads in flight together, unconditional as in
        // phase A: rows past the end read the chunk's first row, then 0)
        {
            constexpr int VI = CKB_Q * P / CKB_THREADS;   // items per thread (phase A's)
            constexpr int VB = VI < 8 ? VI : 8;
#pragma unroll 1
            for (int u0 = 0; u0 < VI; u0 += VB) {
                float graw[VB];
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int idx = tid + (u0 + u) * CKB_THREADS, i = idx / P, p = idx % P;
                    graw[u] = dy[(row0 + c0 + (i < len ? i : 0)) * E + h * P + p];
                }
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int idx = tid + (u0 + u) * CKB_THREADS, i = idx / P, p = idx % P;
                    const float gy = i < len ? graw[u] : 0.0f;
                    Ye[i * CKB_LDP + p] = from_f32<op_t>(s_ecs[i] * gy);
                }
            }
        }
        for (int t = tid; t < CKB_Q; t += CKB_THREADS) {
            const int tb = t / 16;
            float rs = 0.0f, cr = 0.0f, cs = 0.0f, pi = 0.0f, dw = 0.0f, yv = 0.0f;
            for (int sb = 0; sb <= tb; ++sb) rs += rowR[sb * CKB_Q + t];
            for (int t2 = tb; t2 < CKB_T; ++t2) {
                cr += colR[t2 * CKB_Q + t];
                cs += colS[t2 * CKB_Q + t];
            }
#pragma unroll
            for (int cg = 0; cg < N / CKB_CW; ++cg) {
                pi += pint[cg * CKB_Q + t];
                dw += pdw[cg * CKB_Q + t];
            }
#pragma unroll
            for (int j = 0; j < CKB_YVP; ++j) yv += s_yvp[t * CKB_YVP + j];   // 0 past the end
            if (t >= len) pi = dw = 0.0f;
            s_dcs[t] = s_ecs[t] * pi + rs - cr - s_w[t] * dw;
            s_dsc[t] = cs + s_ew[t] * dw;
            s_dw[t] = s_w[t] * dw;
            s_yvp[t * CKB_YVP] = yv;   // row t's partials are read above, by this thread only
        }
        __syncthreads();
        if (warp == 0) {
            // cs_end term: exp(cs_end) <G, Hc> (warps in order) + sum_s w_s dw_s
            float ws = 0.0f;
            for (int i = lane; i < CKB_Q; i += 32) ws += s_dw[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(FULL_MASK, ws, o);
            float gh = 0.0f;
            for (int w = 0; w < CKB_WARPS; ++w) gh += s_wp[w];
            const float cend = s_misc[0] * gh + ws;
            // d(A dt)_r = sum_{t >= r} dcs_t: reverse inclusive scan, last segment first
            float carry = cend;
            for (int hi = CKB_Q; hi > 0; hi -= 32) {
                const int i = hi - 1 - lane;   // lane 0 takes the last token of the segment
                float x = i >= 0 ? s_dcs[i] : 0.0f;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const float yv = __shfl_up_sync(FULL_MASK, x, o);
                    if (lane >= o) x += yv;
                }
                x += carry;
                if (i >= 0 && i < len) dadt_o[(row0 + c0 + i) * H + h] = x;
                carry = __shfl_sync(FULL_MASK, x, 31);
            }
            // d lam, d dt: gamma_t = lam_t dt_t (dgamma = dscale_t + diagonal),
            // shifted term (1 - lam_t) dt_t with gradient dscale_{t-1}.
            // (explicit roundings: the STARTS branch must not change which
            // product the compiler contracts into the sum)
            for (int t = lane; t < len; t += 32) {
                const float dgam = s_dsc[t] + s_dg[t];
                float ddt = __fmul_rn(dgam, s_lam[t]), dl = __fmul_rn(dgam, s_dt[t]);
                if (t > 0) {
                    const float dn = s_dsc[t - 1];
                    if (!STARTS || (int)s_adt[t] != t) {   // a start token has no shifted term
                        ddt = __fmaf_rn(dn, 1.0f - s_lam[t], ddt);
                        dl = __fmaf_rn(-dn, s_dt[t], dl);
                    }
                    const size_t th = (row0 + c0 + t) * H + h;
                    ddt_o[th] = ddt;
                    dlam_o[th] = dl;
                } else {
                    // token c0: finished once the previous chunk (or the
                    // initial state) gives its shifted-term gradient
                    s_misc[1] = ddt;
                    s_misc[2] = dl;
                }
            }
            // sum_t dy_t . v_t of the chunk (D's gradient): the lanes over
            // the tokens in order, then a butterfly; one serial walk over the
            // chunk's tokens on warp 0 held up the next chunk
            float cy = 0.0f;
            for (int t = lane; t < len; t += 32) cy += s_yvp[t * CKB_YVP];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) cy += __shfl_xor_sync(FULL_MASK, cy, o);
            if (lane == 0) {
                // the chunk walked before this one: its first token's shifted
                // term belongs to this chunk's last token (a full chunk)
                if (c + 1 < nch) {
                    const int tn = c0 + CKB_Q;
                    const size_t th = (row0 + tn) * H + h;
                    const float dn = s_dsc[CKB_Q - 1], l = lam[th], d = dt[th];
                    if (STARTS && pend_start) {   // a start: no shifted term
                        ddt_o[th] = pend_ddt;
                        dlam_o[th] = pend_dlam;
                    } else {
                        ddt_o[th] = __fmaf_rn(dn, 1.0f - l, pend_ddt);
                        dlam_o[th] = __fmaf_rn(-dn, d, pend_dlam);
                    }
                }
                pend_ddt = s_misc[1];
                pend_dlam = s_misc[2];
                if constexpr (STARTS) pend_start = s_adt[0] == 0.0f;   // lst_0 = 0: this chunk starts with one
                gD += cy;
            }
        }
        // ---- F: G <- exp(cs_end) G + (E dY)^T Q, staged for the next chunk ----
        {
            const float ech = s_misc[0];
#pragma unroll
            for (int j = 0; j < CKB_NW / 8; ++j) {
                ga[j][0] *= ech; ga[j][1] *= ech; ga[j][2] *= ech; ga[j][3] *= ech;
            }
            for (int kt = 0; kt < CKB_Q; kt += 16)
                tile_mma_row<true, true, CKB_LDP, CKB_LDN>(ga, Ye + kt * CKB_LDP + p0s, Qs + kt * CKB_LDN + n0s, lane);
#pragma unroll
            for (int j = 0; j < CKB_NW / 8; ++j)   // (a lane's columns cc, cc + 1: one paired store)
#pragma unroll
                for (int rr = 0; rr < 2; ++rr)
                    st2_from_f32(Gs + (p0s + g + 8 * rr) * CKB_LDN + n0s + 8 * j + cc,
                                 make_float2(ga[j][2 * rr], ga[j][2 * rr + 1]));
        }
    }
    // ---- The initial state: Hc_0 = Hs_init + w0 v_prev k_prev^T ----
    __syncthreads();   // every read of the stage is done: reuse it as f32 G
    float *Gf = reinterpret_cast<float *>(bq_smem);   // [P][N]
    float *s_row = Gf + P * N;                        // [P] G k_prev
#pragma unroll
    for (int j = 0; j < CKB_NW / 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int p = p0s + g + 8 * (r >> 1), n = n0s + 8 * j + cc + (r & 1);
            Gf[p * N + n] = ga[j][r];
            if (dssm0) dssm0[(bh * P + p) * N + n] = ga[j][r];
        }
    __syncthreads();
    const float l0 = lam[row0 * H + h], d0 = dt[row0 * H + h];
    const float w0 = (1.0f - l0) * d0;
    for (int p = tid; p < P; p += CKB_THREADS) {
        float s = 0.0f;
        if (kp0)
            for (int n = 0; n < N; ++n) s += Gf[p * N + n] * kp0[bh * N + n];
        s_row[p] = s;
        if (dvp0) dvp0[bh * P + p] = w0 * s;
    }
    if (dkp0)
        for (int n = tid; n < N; n += CKB_THREADS) {
            float s = 0.0f;
            if (vp0)
                for (int p = 0; p < P; ++p) s += Gf[p * N + n] * vp0[bh * P + p];
            dkp0[bh * N + n] = w0 * s;
        }
    __syncthreads();
    if (tid == 0) {
        float dw0 = 0.0f;
        if (vp0)
            for (int p = 0; p < P; ++p) dw0 += vp0[bh * P + p] * s_row[p];
        ddt_o[row0 * H + h] = pend_ddt + dw0 * (1.0f - l0);
        dlam_o[row0 * H + h] = pend_dlam - dw0 * d0;
        part_D[bh] = gD;
    }
}
