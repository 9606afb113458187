// mg_m3_chunked_body.cuh: the body of the chunked SSM scan of the Mamba-3
// SISO forward, written once against a dims policy `Dm` so that the shipped
// kernel (mg_m3_chunked_fwd.cuh: inference, and the forward for training,
// which also saves the state entering every chunk as the chunked backward's
// checkpoint) and the autotuner's candidates compile the same code:
//   - the shipped kernel and the specialized tune candidates pass a policy
//     whose members are compile-time constants (FIXED = true);
//   - the generic tune candidate passes its struct tune_dims, whose members
//     are kernel arguments (a library with runtime dimensions).
// A policy has the int members N, P, H, E, NP, OFF_X (as in NAME_common.cuh),
// nw, pw, ny, ldn (CK_NW, CK_PW, CK_NY, CK_LDN: the state split, the output
// items, the staged row stride, which follow from N and P; their order is
// that of mg/tune.lua m3_dims), and the compile-time bounds NW_MAX >= nw,
// PW_MAX >= pw of the register arrays: loops over them run to the bound
// with a guard (folded away when the member is a constant). The launch shape (CK_Q, CK_WARPS,
// CK_THREADS, CK_LDQ, CK_LDW) is whatever CK_* constants are in scope where
// it is included: NAME_common.cuh's for inference; NAME_backward.cu
// includes it in a namespace of its own with the chunked backward's chunk.
// Also needed from the includer: act_t, op_t, to_f32, from_f32, FULL_MASK
// and mg_m3_tiles.cuh. Included inside the anonymous namespace of the
// package's .cu files (or inlined into a tune candidate): it includes
// nothing itself.

// ===========================================================================
// Chunked scan: doc/math.md "Chunked form", chunk length CK_Q.
//
// Decomposition. One block per (sequence b, head h) (grid (H, batch)) walks
// the chunks in order; the P x N state stays on chip (f32, in the
// accumulator registers of the warps) from the first chunk to the last, so
// no chunk state ever goes through device memory. Per chunk:
//   A  stage q' and k' ([CK_Q][N]), v ([P][CK_Q], transposed) and the
//      per-token scalars (A*dt, gamma = lam*dt, the next token's
//      (1-lam)*dt) in shared memory (rows past the end of the sequence are
//      zeros);
//   B  warp 0: cs_t = prefix sum of A*dt in the chunk (fixed shuffle order),
//      exp(cs_t), scale_s = gamma_s + (1-lam_{s+1}) dt_{s+1}, and the state
//      weights w_s = exp(cs_end - cs_s) scale_s;
//   C  Kw[n][s] = w_s k'_s[n] (transposed), and the outputs, per work item
//      of 16 rows t x CK_PW columns p:
//        y_t = exp(cs_t) Hs_c q'_t                          (inter-chunk)
//            + sum_{s<=t} W[t][s] v_s + D v_t,              (intra-chunk)
//        W[t][s] = (q'_t . k'_s) exp(cs_t - cs_s) scale_s  (s < t),
//        W[t][t] = gamma_t (q'_t . k'_t),
//      with Q'K'^T computed 16 x 16 at a time (only the causal blocks),
//      masked and weighted in registers, staged per warp, then times V;
//   D  Hs_{c+1} = exp(cs_end) Hs_c + V^T Kw (each warp its 16 x CK_NW tile),
//      and the entering state of the next chunk is staged for C.
// Why this split: the intra-chunk products are the flops (Q x Q x N and
// Q x Q x P per chunk) and run on tiles; the sequential dependency left is
// one P x N multiply-add per chunk, on chip. A three-pass form (local
// states, a combine over chunks, a correction pass) would parallelise over
// chunks as well, but it writes and reads a P x N f32 state per chunk and
// head through device memory (as many bytes as the chunk's q' and k' at
// Q = N/2) and runs the chunk products twice over; with batch x heads
// blocks (H per sequence) the GPU is already filled at the shapes this
// targets.
// The initial state enters as Hs_init + (1-lam_0) dt_0 v_prev k_prev^T;
// the final state is the last Hs, k_prev = k' and v_prev = v of the last
// token (read from the f32 / storage inputs, so they are exact).
//
// Tiles: 16 x 8 x 16 products in the fragment layout of mma.m16n8k16 (lane
// l: g = l/4 and c = 2*(l%4); accumulator c[0], c[1] at row g, columns c,
// c+1; c[2], c[3] at row g+8). With bf16/f16 storage they run on the tensor
// cores (mma.sync, operands rounded to the storage dtype, f32 accumulate);
// with f32 storage the same tiles run as f32 FMA from shared memory (f32
// means f32: no TF32). State, accumulators, cumulative sums and the
// exponentials are f32. Every operand is stored [row][k] (k contiguous),
// rows padded by 16 bytes, so the fragment loads (8 rows x 4 words) hit 32
// different banks. The order of every sum is fixed: bit-identical reruns.
// ===========================================================================

// The tile products with the staged N-wide operands (row stride ldn): a
// template argument when the policy is fixed, a runtime one otherwise.
// A row of nj such tiles sharing A (tile_mma_row: A's fragment loaded once).
// The fixed form runs all NJ tiles of c and ignores nj, so its callers pass
// nj == NJ: an output item's row of tiles is declared [Dm::PW_MAX / 8] and
// used to dm.pw / 8, which a fixed policy makes equal (ck_pw_whole).
template <class Dm> __host__ __device__ constexpr bool ck_pw_whole()
{
    if constexpr (Dm::FIXED) return Dm::PW_MAX == Dm::pw;
    else return true;
}
template <class Dm, int NJ>
__device__ __forceinline__ void ck_mma_row_ldn(const Dm dm, float (&c)[NJ][4], int nj, const op_t *a, const op_t *bt,
                                               int lane)
{
    if constexpr (Dm::FIXED)
        tile_mma_row<false, false, Dm::ldn, Dm::ldn>(c, a, bt, lane);
    else
        tile_mma_row_core<false, false>(c, nj, a, bt, lane, dm.ldn, dm.ldn);
}

// ---- Episode starts (STARTS; doc/math.md section 9). With a start mask
// the stage puts the chunk's start flags (1.0f / 0.0f) into s_cs (which
// ck_decay overwrites) and zeroes the beta copy of a token followed by a
// start (s_nx). ck_decay then also turns the flags into lst_t, the last
// start at or before row t in the chunk (-1: none), written over s_adt
// (dead after the prefix sum), and masks what crosses a start:
//   exp(cs_t) -> 0 for t at or after the chunk's first start (the entering
//      state does not reach it),
//   w_s -> 0 for s before the chunk's last start, exp(cs_end) -> 0 when the
//      chunk holds one (the state leaving the chunk is that of its last
//      episode);
// ck_outputs drops the pairs s < t with lst_t > s (a start in (s, t]). cs
// itself is not restarted: inside an episode the differences cs_t - cs_s
// are the sums they were. The instances without STARTS are the code as it
// was.

// ---- The pieces of a chunk's work after its stage (sections B, C, D of
// the design above), shared by ck_fwd_body and the fused inference kernel
// (mg_m3_chunked_fused.cuh), which stages the chunk differently but runs
// the same arithmetic on it. fs is the block's per-step scalars, 7 CK_Q + 4
// floats: s_adt, s_gam, s_nx (staged), s_cs, s_ecs, s_scl, s_w (written
// here), s_misc.

// B: cumulative decay and weights (warp 0, fixed order). The caller
// synchronises the block after it. STARTS: see above (flags in s_cs in,
// lst over s_adt out).
template <bool STARTS = false>
__device__ __forceinline__ void ck_decay(float *fs, int warp, int lane)
{
    float *s_adt = fs;
    const float *s_gam = fs + CK_Q, *s_nx = fs + 2 * CK_Q;
    float *s_cs = fs + 3 * CK_Q, *s_ecs = fs + 4 * CK_Q, *s_scl = fs + 5 * CK_Q, *s_w = fs + 6 * CK_Q;
    float *s_misc = fs + 7 * CK_Q;
    if (warp != 0) return;
    int lcarry;   // STARTS: the chunk's last start (-1: none)
    const float carry = ck_cumsum<CK_Q, STARTS>(s_adt, s_cs, lane, lcarry);   // cs at the chunk's end
    for (int i = lane; i < CK_Q; i += 32) {
        const float cs = s_cs[i], sc = s_gam[i] + s_nx[i];
        if constexpr (STARTS) {
            s_ecs[i] = s_adt[i] < 0.0f ? expf(cs) : 0.0f;
            s_scl[i] = sc;
            s_w[i] = i >= lcarry ? expf(carry - cs) * sc : 0.0f;
        } else {
            s_ecs[i] = expf(cs);
            s_scl[i] = sc;
            s_w[i] = expf(carry - cs) * sc;
        }
    }
    if (lane == 0) {
        if constexpr (STARTS) s_misc[0] = lcarry < 0 ? expf(carry) : 0.0f;
        else s_misc[0] = expf(carry);
    }
}

// Kw[n][s] = w_s k'_s[n] (transposed): the chunk's term of the state
// update (ck_state_step), and part of ck_outputs. A thread transposes a
// 2 x 2 block (rows i, i+1 of Ks, columns n, n+1) with paired loads and
// stores: a quarter of the instructions of one element at a time, each
// element the same product, rounded the same way.
template <class Dm>
__device__ __forceinline__ void ck_weighted_k(const Dm dm, const op_t *Ks, op_t *Kw, const float *fs, int tid)
{
    const int N = dm.N, CK_LDN = dm.ldn;
    const float *s_w = fs + 6 * CK_Q;
    for (int idx = tid; idx < (CK_Q / 2) * (N / 2); idx += CK_THREADS) {
        const int i = 2 * (idx % (CK_Q / 2)), n = 2 * (idx / (CK_Q / 2));
        const float w0 = s_w[i], w1 = s_w[i + 1];
        const float2 k0 = ld2_f32(Ks + i * CK_LDN + n), k1 = ld2_f32(Ks + (i + 1) * CK_LDN + n);
        st2_from_f32(Kw + n * CK_LDQ + i, make_float2(k0.x * w0, k1.x * w1));
        st2_from_f32(Kw + (n + 1) * CK_LDQ + i, make_float2(k0.y * w0, k1.y * w1));
    }
}

// A barrier of the `threads` threads (whole warps) that use barrier `id`
// (1..15; 0 is __syncthreads'), with the ordering of shared memory that
// __syncthreads gives among them.
__device__ __forceinline__ void ck_group_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// C: Kw = w_s k'_s (transposed), and the outputs of the chunk's len rows:
// sink(tr, p, o0, o1) receives rows tr < len, columns p and p+1 (the
// inter- and intra-chunk terms plus D v). Reads Qs, Ks, Vt, Hb; Wt holds a
// 16 x CK_LDW W tile per warp. The caller synchronises the block after it
// (Kw complete, every read of Hb done).
// VLD > 0: v staged in its natural layout [CK_Q][VLD] instead (ck_fwd_body,
// the training's forward), read through the transposed tile forms.
// The intra-chunk W blocks (16 x 16, rows t0.., columns s0..; s0 <= t0)
// do not depend on the item's columns p: with one item per warp (CK_NY ==
// CK_WARPS), the kp warps of row tile mt (its P / CK_PW column parts)
// share them. In rounds of kp blocks, warp of part ph computes block
// r0 + ph into its tile, the group meets at barrier 1 + mt, and each warp
// then multiplies every block of the round, in block order, from the tile
// of the warp that computed it. Why: each warp computed all mt + 1 blocks
// itself, so the two warps of a row tile computed the same blocks twice,
// and the warps of the last row tile did about twice the work of the first
// while the others waited at the barrier after this phase (the fused
// kernel's profile: 7.5% of its stall samples at that barrier). Each
// output's sums keep their order and each W entry its expression: the same
// bits. Otherwise (several items per warp, or a chunk of one row tile)
// each warp computes its own.
template <bool STARTS = false, int VLD = 0, class Dm, class Sink>
__device__ __forceinline__ void ck_outputs(const Dm dm, const op_t *Qs, const op_t *Ks, op_t *Kw, const op_t *Vt,
                                           const op_t *Hb, op_t *Wt, const float *fs, float dsk, int len,
                                           int tid, int warp, int lane, Sink sink)
{
    op_t *Ww = Wt + warp * 16 * CK_LDW;   // this warp's W tile
    const int N = dm.N;
    const int CK_PW = dm.pw, CK_NY = dm.ny, CK_LDN = dm.ldn;
    const int g = lane >> 2, cc = (lane & 3) * 2;
    const float *s_gam = fs + CK_Q, *s_cs = fs + 3 * CK_Q, *s_ecs = fs + 4 * CK_Q, *s_scl = fs + 5 * CK_Q;
    ck_weighted_k(dm, Ks, Kw, fs, tid);
    for (int it = warp; it < CK_NY; it += CK_WARPS) {
        const int mt = it % (CK_Q / 16), t0 = mt * 16, p0 = (it / (CK_Q / 16)) * CK_PW;
        static_assert(ck_pw_whole<Dm>(), "ck_mma_row_ldn's fixed form fills all PW_MAX / 8 tiles of acc");
        float acc[Dm::PW_MAX / 8][4];
#pragma unroll
        for (int j = 0; j < Dm::PW_MAX / 8; ++j) if (j < CK_PW / 8) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        // inter-chunk: exp(cs_t) * (Q' Hs^T)[t][p]
#pragma unroll 2
        for (int ks = 0; ks < N; ks += 16)
            ck_mma_row_ldn(dm, acc, CK_PW / 8, Qs + t0 * CK_LDN + ks, Hb + p0 * CK_LDN + ks, lane);
        {
            const float e0 = s_ecs[t0 + g], e1 = s_ecs[t0 + g + 8];
#pragma unroll
            for (int j = 0; j < Dm::PW_MAX / 8; ++j) if (j < CK_PW / 8) {
                acc[j][0] *= e0; acc[j][1] *= e0; acc[j][2] *= e1; acc[j][3] *= e1;
            }
        }
        // intra-chunk: the causal 16 x 16 blocks of W, times V
        const float cst0 = s_cs[t0 + g], cst1 = s_cs[t0 + g + 8];
        const float gam0 = s_gam[t0 + g], gam1 = s_gam[t0 + g + 8];
        // STARTS: lst of the two rows (ck_decay, over s_adt): s < lst_t crosses a start
        const int lst0 = STARTS ? (int)fs[t0 + g] : -1, lst1 = STARTS ? (int)fs[t0 + g + 8] : -1;
        // the W block of columns s0.. into the tile W
        const auto w_block = [&](int s0, op_t *W) {
            float sq[2][4];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) sq[jj][0] = sq[jj][1] = sq[jj][2] = sq[jj][3] = 0.0f;
#pragma unroll 2
            for (int ks = 0; ks < N; ks += 16)
                ck_mma_row_ldn(dm, sq, 2, Qs + t0 * CK_LDN + ks, Ks + s0 * CK_LDN + ks, lane);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int tr = t0 + g + 8 * (r >> 1), sc = s0 + 8 * jj + cc + (r & 1);
                    float wv = 0.0f;
                    if (sc < tr && (!STARTS || sc >= ((r >> 1) ? lst1 : lst0)))
                        wv = sq[jj][r] * ck_wdecay(((r >> 1) ? cst1 : cst0) - s_cs[sc]) * s_scl[sc];
                    else if (sc == tr)
                        wv = sq[jj][r] * ((r >> 1) ? gam1 : gam0);
                    W[(g + 8 * (r >> 1)) * CK_LDW + 8 * jj + cc + (r & 1)] = from_f32<op_t>(wv);
                }
        };
        // acc += the W block of columns s0.. (tile W) times V's rows s0..
        const auto w_times_v = [&](int s0, const op_t *W) {
            if constexpr (VLD > 0)
                tile_mma_row_core<false, true>(acc, CK_PW / 8, W, Vt + s0 * VLD + p0, lane, CK_LDW, VLD);
            else
                tile_mma_row_core<false, false>(acc, CK_PW / 8, W, Vt + p0 * CK_LDQ + s0, lane, CK_LDW, CK_LDQ);
        };
        constexpr int T = CK_Q / 16;   // row tiles; barrier ids 1..T
        // Shared W blocks need one named barrier per row tile (ids 1..T; 0 is
        // __syncthreads, 16 in all): a chunk of 256 rows (T = 16) takes the
        // per-warp form. One row tile: one block, nothing to share.
        constexpr bool W_SHARE = T > 1 && T <= 15;
        if (W_SHARE && CK_NY == CK_WARPS) {
            const int kp = CK_NY / T, ph = it / T;   // the row tile's warps (it = warp) and this one's part
            for (int r0 = 0; r0 <= mt; r0 += kp) {
                if (r0 + ph <= mt) w_block((r0 + ph) * 16, Ww);
                ck_group_sync(1 + mt, 32 * kp);   // the round's blocks are written
                for (int j = 0; j < kp && r0 + j <= mt; ++j) w_times_v((r0 + j) * 16, Wt + (mt + j * T) * 16 * CK_LDW);
                if (r0 + kp <= mt) ck_group_sync(1 + mt, 32 * kp);   // read before the next round's writes
            }
        } else {
            for (int sb = 0; sb <= mt; ++sb) {
                w_block(sb * 16, Ww);
                __syncwarp();
                w_times_v(sb * 16, Ww);
                __syncwarp();
            }
        }
        // + D v_t; hand the rows inside the sequence to the sink (pairs of p)
#pragma unroll
        for (int j = 0; j < Dm::PW_MAX / 8; ++j) if (j < CK_PW / 8)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int tr = t0 + g + 8 * rr, p = p0 + 8 * j + cc;
                if (tr < len)
                    sink(tr, p, acc[j][2 * rr] + dsk * to_f32(VLD > 0 ? Vt[tr * VLD + p] : Vt[p * CK_LDQ + tr]),
                         acc[j][2 * rr + 1] + dsk * to_f32(VLD > 0 ? Vt[tr * VLD + p + 1] : Vt[(p + 1) * CK_LDQ + tr]));
            }
    }
}

// D: Hs <- exp(cs_end) Hs + V^T Kw (this warp's tile hs, rows p0s..,
// columns n0s..), and stage it in Hb for the next chunk's outputs.
template <int VLD = 0, class Dm>   // (VLD: as in ck_outputs)
__device__ __forceinline__ void ck_state_step(const Dm dm, float (&hs)[Dm::NW_MAX / 8][4], const op_t *Vt,
                                              const op_t *Kw, op_t *Hb, const float *fs, int p0s, int n0s,
                                              int lane)
{
    const int CK_NW = dm.nw, CK_LDN = dm.ldn;
    const int g = lane >> 2, cc = (lane & 3) * 2;
    const float ech = fs[7 * CK_Q];
#pragma unroll
    for (int j = 0; j < Dm::NW_MAX / 8; ++j) if (j < CK_NW / 8) {
        hs[j][0] *= ech; hs[j][1] *= ech; hs[j][2] *= ech; hs[j][3] *= ech;
    }
#pragma unroll 2
    for (int ks = 0; ks < CK_Q; ks += 16)
        if constexpr (VLD > 0)
            tile_mma_row_core<true, false>(hs, CK_NW / 8, Vt + ks * VLD + p0s, Kw + n0s * CK_LDQ + ks, lane, VLD,
                                           CK_LDQ);
        else
            tile_mma_row_core<false, false>(hs, CK_NW / 8, Vt + p0s * CK_LDQ + ks, Kw + n0s * CK_LDQ + ks, lane,
                                            CK_LDQ, CK_LDQ);
#pragma unroll
    for (int j = 0; j < Dm::NW_MAX / 8; ++j) if (j < CK_NW / 8)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)   // (a lane's columns cc, cc + 1: one paired store, each rounded alone)
            st2_from_f32(Hb + (p0s + g + 8 * rr) * CK_LDN + n0s + 8 * j + cc, make_float2(hs[j][2 * rr], hs[j][2 * rr + 1]));
}

// The initial state of this warp's tile: Hs_init + (1-lam_0) dt_0 v_prev
// k_prev^T (each term present when its input is), into hs and staged in
// Hb. w0 = (1-lam_0) dt_0 of the sequence's first token (0 without
// k_prev/v_prev).
template <class Dm>
__device__ __forceinline__ void ck_state_init(const Dm dm, float (&hs)[Dm::NW_MAX / 8][4], op_t *Hb,
                                              const float *ssm_in, const float *kp_in, const float *vp_in,
                                              float w0, size_t bh, int p0s, int n0s, int lane)
{
    const int N = dm.N, P = dm.P, CK_NW = dm.nw, CK_LDN = dm.ldn;
    const int g = lane >> 2, cc = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < Dm::NW_MAX / 8; ++j) if (j < CK_NW / 8)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int p = p0s + g + 8 * (r >> 1), n = n0s + 8 * j + cc + (r & 1);
            float v = ssm_in ? ssm_in[(bh * P + p) * N + n] : 0.0f;
            if (kp_in && vp_in) v += w0 * vp_in[bh * P + p] * kp_in[bh * N + n];
            hs[j][r] = v;
            Hb[p * CK_LDN + n] = from_f32<op_t>(v);
        }
}

// This warp's tile of a P x N f32 state into dst (the final state, or a
// training checkpoint; 8-byte aligned: the API's states are 16-byte
// aligned, N even). A lane's two columns (cc, cc + 1) of a row go as one
// 8-byte store: half the store instructions of one entry at a time (the
// per-chunk checkpoint's scalar stores throttled the training forward's
// load/store unit).
template <class Dm>
__device__ __forceinline__ void ck_state_store(const Dm dm, const float (&hs)[Dm::NW_MAX / 8][4], float *dst,
                                               int p0s, int n0s, int lane)
{
    const int N = dm.N, CK_NW = dm.nw;
    const int g = lane >> 2, cc = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < Dm::NW_MAX / 8; ++j) if (j < CK_NW / 8)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
            *reinterpret_cast<float2 *>(dst + (p0s + g + 8 * rr) * N + n0s + 8 * j + cc) =
                make_float2(hs[j][2 * rr], hs[j][2 * rr + 1]);
}

// ---- The chunked scan (design above), one block per (head, sequence):
// grid (H, batch), CK_THREADS threads, the policy's shared memory. ckpt
// (training only, else NULL) receives the state entering every chunk, f32
// [b][h][ckpt_slots][P][N] at slot c0/ckpt_step. KQ: the element type of
// the per-head k', q' rows (ck_kq_t: f32 in NAME_common.cuh), staged as
// op_t by stage4 (copied when KQ is op_t, as with f32 storage, else
// converted).
// Bld: where k', q' come from. ck_kq_rows (the default): the rows k, q.
// kq_build (mg_m3_prep_rot.cuh, the training's chunked path, fixed dims):
// built in the stage from bld by kq_build4, k and q unused; the stage then
// holds the values prep_rot_kernel's rows would have held, bit for bit.
// The natural layout of v in the stage (VLD of ck_outputs and
// ck_state_step), where the source allows it (kq_build::vnat_ld: the
// training's forward with 16-bit storage, rows that copy as 4-entry
// vectors, P >= CK_Q so that [CK_Q][P + pad] fits [P][CK_Q + pad]): 0 else.
template <class Bld, class Dm, bool B = Bld::BUILD> struct ck_vnat {
    static constexpr int LD = 0;
};
template <class Bld, class Dm> struct ck_vnat<Bld, Dm, true> {
    static constexpr int LD = Bld::vnat_ld(CK_Q, Dm::P);
};
struct ck_kq_rows {
    static constexpr bool BUILD = false;
    static constexpr int LINES = 0;   // (kq_build: the 128-byte lines a token's k', q' are built from)
};
template <bool STARTS = false, class Dm, typename KQ, class Bld = ck_kq_rows>
__device__ __forceinline__ void
ck_fwd_body(int seqlen, const act_t *__restrict__ proj, const KQ *__restrict__ k,
            const KQ *__restrict__ q, const float *__restrict__ dt,
            const float *__restrict__ adt, const float *__restrict__ lam,
            const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
            const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
            float *__restrict__ y, float *__restrict__ ckpt, int ckpt_step, int ckpt_slots, const Dm dm,
            const unsigned char *__restrict__ start = nullptr, const Bld bld = Bld{})
{
    const int N = dm.N, P = dm.P, H = dm.H, E = dm.E, NP = dm.NP, OFF_X = dm.OFF_X;
    const int CK_NW = dm.nw, CK_LDN = dm.ldn;
    extern __shared__ __align__(16) unsigned char ck_smem[];
    op_t *Qs = reinterpret_cast<op_t *>(ck_smem);   // [CK_Q][CK_LDN]  q'_t
    op_t *Ks = Qs + CK_Q * CK_LDN;                    // [CK_Q][CK_LDN]  k'_s
    op_t *Kw = Ks + CK_Q * CK_LDN;                    // [N][CK_LDQ]     w_s k'_s[n] (transposed)
    // v_s[p] transposed, [P][CK_LDQ]; or (VLD > 0, ck_vnat) natural, [CK_Q][VLD]
    op_t *Vt = Kw + N * CK_LDQ;
    constexpr int VLD = ck_vnat<Bld, Dm>::LD;
    op_t *Hb = Vt + P * CK_LDQ;                       // [P][CK_LDN]     state entering the chunk
    op_t *Wt = Hb + P * CK_LDN;                       // [CK_WARPS][16][CK_LDW]  per-warp W tile
    float *fs = reinterpret_cast<float *>(Wt + CK_WARPS * 16 * CK_LDW);
    float *s_adt = fs, *s_gam = fs + CK_Q, *s_nx = fs + 2 * CK_Q, *s_cs = fs + 3 * CK_Q;

    if (seqlen <= 0) return;
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;   // first token of the sequence

    // This warp's state tile: rows p0s.., columns n0s..; hs[j][r] holds
    // (p0s + g + 8*(r/2), n0s + 8j + cc + r%2).
    const int p0s = (warp % (P / 16)) * 16, n0s = (warp / (P / 16)) * CK_NW;
    float hs[Dm::NW_MAX / 8][4];
    if constexpr (STARTS) {
        if (start[row0]) ssm_in = kp_in = vp_in = nullptr;   // an episode starts at t = 0: no state in
    }
    {
        const size_t t0 = row0 * H + h;
        const float w0 = (kp_in && vp_in) ? (1.0f - lam[t0]) * dt[t0] : 0.0f;
        ck_state_init(dm, hs, Hb, ssm_in, kp_in, vp_in, w0, bh, p0s, n0s, lane);
    }
    const float dsk = Dskip[h];

    for (int c0 = 0; c0 < seqlen; c0 += CK_Q) {
        const int len = min(CK_Q, seqlen - c0);
        if (ckpt) {
            // training: the state entering the chunk (shifted form, f32) for
            // the chunked backward, slot c0 / ckpt_step of this (b, h)
            ck_state_store(dm, hs, ckpt + (bh * ckpt_slots + c0 / ckpt_step) * (size_t)(P * N), p0s, n0s, lane);
        }
        __syncthreads();   // the previous chunk is done with the stage; Hb is written
        // ---- A: stage the chunk ----
        for (int i = tid; i < CK_Q; i += CK_THREADS) {
            float a = 0.0f, ga = 0.0f, nx = 0.0f;
            if (i < len) {
                const size_t th = (row0 + c0 + i) * H + h;
                a = adt[th];
                ga = lam[th] * dt[th];
                if (c0 + i + 1 < seqlen) nx = (1.0f - lam[th + H]) * dt[th + H];
            }
            if constexpr (STARTS) {
                float f = 0.0f;
                if (i < len) {
                    f = start[row0 + c0 + i] ? 1.0f : 0.0f;
                    if (c0 + i + 1 < seqlen && start[row0 + c0 + i + 1]) nx = 0.0f;   // its beta copy is dropped
                }
                s_cs[i] = f;   // the start flags, for ck_decay
            }
            s_adt[i] = a; s_gam[i] = ga; s_nx[i] = nx;
        }
        if constexpr (Bld::BUILD) {
            if constexpr (Bld::raw_fits(CK_Q, CK_LDQ)) {
                // the raw rows, angles and 1/rms copied (Kw's tile, free
                // until phase C, holds the angles and 1/rms); q', k' built
                // from them in place after the barrier below
                kq_stage_raw(bld, Qs, Ks, CK_LDN, reinterpret_cast<float *>(Kw), row0 + c0, len, h, tid, CK_Q,
                             CK_THREADS);
            } else {
                // q', k' built from the in_proj rows (kq_stage_build, three
                // items in flight a thread: four spilled)
                kq_stage_build(bld, Qs, Ks, CK_LDN, row0 + c0, len, h, tid, CK_Q, CK_THREADS, 3);
            }
        } else {
            // q', k' rows (stage4: where it copies, all copies in flight at
            // once; waited for before the barrier below)
#pragma unroll 4
            for (int idx = tid; idx < CK_Q * (N / 4); idx += CK_THREADS) {
                const int i = idx / (N / 4), n = 4 * (idx % (N / 4));
                const bool in = i < len;
                const size_t o = ((row0 + c0 + (in ? i : 0)) * H + h) * N + n;
                stage4(Qs + i * CK_LDN + n, q + o, in);
                stage4(Ks + i * CK_LDN + n, k + o, in);
            }
        }
        if constexpr (VLD > 0) {
            // v in its natural layout, copied row by row (cp.async, 4
            // entries a copy, rows past len zero-filled): with the raw
            // stage's copies, every load of the stage in flight at once
            for (int idx = tid; idx < CK_Q * (P / 4); idx += CK_THREADS) {
                const int i = idx / (P / 4), p = 4 * (idx % (P / 4));
                const bool in = i < len;
                const op_t *src = reinterpret_cast<const op_t *>(proj) + (row0 + c0 + (in ? i : 0)) * NP + OFF_X;
                cp_async4(Vt + i * VLD + p, src + h * P + p, in);
            }
        } else {
            // v, transposed: a thread's items in batches of 8, the batch's loads
            // first (in flight together), then its stores. The loads are
            // unconditional (an item past the chunk's rows reads the chunk's
            // first row, then stores 0 or nothing): a load under its condition
            // was converted inside the branch, each waiting for the one before.
            for (int idx0 = tid; idx0 < CK_Q * P; idx0 += 8 * CK_THREADS) {
                act_t v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int idx = idx0 + u * CK_THREADS, i = idx / P, p = idx % P;
                    const int r = idx < CK_Q * P && i < len ? i : 0;
                    v[u] = proj[(row0 + c0 + r) * NP + OFF_X + h * P + p];
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int idx = idx0 + u * CK_THREADS, i = idx / P, p = idx % P;
                    if (idx < CK_Q * P) Vt[p * CK_LDQ + i] = from_f32<op_t>(i < len ? to_f32(v[u]) : 0.0f);
                }
            }
        }
        cp_async_wait_all();
        __syncthreads();
        if constexpr (Bld::BUILD) {
            if constexpr (Bld::raw_fits(CK_Q, CK_LDQ))   // (the barrier after B covers it)
                kq_stage_finish(bld, Qs, Ks, CK_LDN, reinterpret_cast<const float *>(Kw), len, h, tid, CK_Q,
                                CK_THREADS);
        }
        // ---- B: cumulative decay and weights ----
        ck_decay<STARTS>(fs, warp, lane);
        __syncthreads();
        // The next chunk's rows of q', k' and v into L2 while this one
        // computes (one 128-byte line per prefetch), and the lines holding
        // its A*dt, lambda and dt (the stage's first loads): its staging
        // then waits on L2 rather than on HBM.
        // (Built k', q': the lines they are built from, kq_build_line.)
        if (c0 + CK_Q < seqlen) {
            const int LQ = N * (int)sizeof(KQ) / 128 > 0 ? N * (int)sizeof(KQ) / 128 : 1;
            const int LKQ = Bld::BUILD ? Bld::LINES : 2 * LQ;   // lines of k', q' a token
            const int LV = P * (int)sizeof(act_t) / 128 > 0 ? P * (int)sizeof(act_t) / 128 : 1;
            const int nxt = min(CK_Q, seqlen - c0 - CK_Q);
            for (int i = tid; i < nxt * (LKQ + LV + 3); i += CK_THREADS) {
                const int t = i % nxt, w = i / nxt;
                const size_t tok = row0 + c0 + CK_Q + t;
                const char *pf;
                if (w < LKQ) {
                    if constexpr (Bld::BUILD) pf = kq_build_line(bld, tok, h, w);
                    else if (w < LQ) pf = reinterpret_cast<const char *>(q + (tok * H + h) * N) + 128 * w;
                    else pf = reinterpret_cast<const char *>(k + (tok * H + h) * N) + 128 * (w - LQ);
                }
                else if (w < LKQ + LV)
                    pf = reinterpret_cast<const char *>(proj + tok * NP + OFF_X + h * P) + 128 * (w - LKQ);
                else if (w == LKQ + LV) pf = reinterpret_cast<const char *>(adt + tok * H + h);
                else if (w == LKQ + LV + 1) pf = reinterpret_cast<const char *>(lam + tok * H + h);
                else pf = reinterpret_cast<const char *>(dt + tok * H + h);
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pf));
            }
        }
        // ---- C: Kw and the outputs (f32 y, pairs of p) ----
        float *yc = y + (row0 + c0) * E + h * P;
        ck_outputs<STARTS, VLD>(dm, Qs, Ks, Kw, Vt, Hb, Wt, fs, dsk, len, tid, warp, lane,
                   [&](int tr, int p, float o0, float o1) {
                       float2 o;
                       o.x = o0;
                       o.y = o1;
                       *reinterpret_cast<float2 *>(yc + (size_t)tr * E + p) = o;
                   });
        __syncthreads();   // Kw is complete; every read of Hb is done
        // ---- D: the state update, staged for the next chunk ----
        ck_state_step<VLD>(dm, hs, Vt, Kw, Hb, fs, p0s, n0s, lane);
    }
    // Final state. Every read of the initial state happened before the first
    // barrier of the loop, so out may alias in.
    __syncthreads();
    if (ssm_out) ck_state_store(dm, hs, ssm_out + bh * (size_t)(P * N), p0s, n0s, lane);
    const size_t last = row0 + seqlen - 1;
    if (kp_out) {
        if constexpr (Bld::BUILD) {
            // the last token's k' as its stage row held it (rounded to the
            // storage type, op_t)
            for (int n = 4 * tid; n < N; n += 4 * CK_THREADS) {
                float4 k4, q4;
                kq_build4(bld, last, h, n, k4, q4);
                kp_out[bh * N + n] = to_f32(from_f32<op_t>(k4.x));
                kp_out[bh * N + n + 1] = to_f32(from_f32<op_t>(k4.y));
                kp_out[bh * N + n + 2] = to_f32(from_f32<op_t>(k4.z));
                kp_out[bh * N + n + 3] = to_f32(from_f32<op_t>(k4.w));
            }
        } else {
            for (int n = tid; n < N; n += CK_THREADS) kp_out[bh * N + n] = to_f32(k[(last * H + h) * N + n]);
        }
    }
    if (vp_out)
        for (int p = tid; p < P; p += CK_THREADS) vp_out[bh * P + p] = to_f32(proj[last * NP + OFF_X + h * P + p]);
}
