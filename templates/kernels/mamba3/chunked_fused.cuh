// mg_m3_chunked_fused.cuh: the whole SSM core of the Mamba-3 SISO inference
// forward in one kernel (chunked scan, MG_M3_FUSED): from the in_proj output
// to the gated output g, for prefill and burn-in.
// Included inside the anonymous namespace of NAME_kernels.cu after
// mg_m3_prep.cuh, mg_m3_angles.cuh, mg_m3_chunked_body.cuh,
// mg_m3_chunked_fwd.cuh and mg_m3_gate.cuh (whose pieces it runs): it
// includes nothing itself.

// ===========================================================================
// Why one kernel. The unfused path (prep -> angles -> scan_chunked -> gate)
// writes the per-head k' and q' in f32 ([tokens][H][N] each), rotates them
// in place, reads them back in the scan, writes y in f32 and reads it again
// in the gate: at H = 32, N = 128 that is ~33 KB per token through device
// memory for data that is a function of ~1 KB of the in_proj row. Here the
// block of (sequence b, head h) that walks the chunks builds its chunk's
// operands on chip straight from the in_proj rows and writes g once, in the
// storage dtype.
//
// Per chunk of CK_Q tokens (the scan's own steps B, C, D are those of
// mg_m3_chunked_body.cuh, shared). The stage is written for throughput:
// every load from device memory is in a flat loop over the chunk (many in
// flight per thread, nothing waits on a previous token), and the per-token
// reductions and the angle walk then read shared memory only.
//   A1 (flat loads) the group's raw B and C rows into the k' and q' stage
//      (op_t is the storage type: exact), v (natural or transposed:
//      FUSED_VLD), tanh of the
//      angle inputs (f32, the value angles_kernel takes) and the 1/rms of
//      the raw B and C rows (bc_rms, prep_kernel's order), both from the
//      token prologue's rows (token_prologue_kernel, one launch before,
//      for every head), and head h's scalars dt, A*dt, lambda of the
//      chunk's tokens and of the next chunk's first (head_scalars, as
//      prep_kernel); rows past the sequence's end are zeros.
//   A2 the per-step weights gamma and (1-lam') dt'; the angle threads sum
//      their slice's increments.
//   A3 in place: the entries n >= 2S become BCNorm + per-head bias; the
//      rotated pairs are built by thread (a, sl), which owns angle a over
//      time slice sl of CK_ASTEPS steps: it starts from the angle entering
//      the chunk plus the sums of the slices before its own (in slice
//      order: fixed) and walks its steps exactly as angles_kernel does
//      (f64, wrapped into [0, 2pi) every step, sin/cos in f64 rounded
//      once). The angle leaving the chunk is carried in shared memory (f64).
//   B, C the scan's decay and outputs; the outputs (+ D v) go to a shared
//      f32 tile Y [CK_Q][P] (which reuses the tanh tile's space) instead of
//      device memory;
//   D  the state step; one warp per token row the gate's per-head scale
//      (gate_head_load: the rms of gate_kernel), then a flat loop writes
//      g = y * scale * norm_gate_w * silu(z) in the storage dtype.
// The states: ssm as in the chunked scan; k_prev is the last token's
// rotated k' in f32 (written where it is computed); v_prev its v; the
// angle the carried f64 angle rounded to f32. Every read of an input state
// happens before the first barrier of the loop and every write after it,
// so out may alias in.
//
// Segments (few blocks: batch x H well under the SMs, e.g. one sequence).
// The chunks of a sequence are split into nseg segments of whole chunks,
// grid (H, batch, nseg), in four launches (after the token prologue):
//   1. seg_angle_kernel: each segment's sum of angle increments (f64);
//   2. scan_fused_kernel<FUSED_LOCAL>: each segment's final state from a
//      zero state (the chunk loop without outputs) and its decay (the
//      product of the chunks' exp(cs_end)), its angle starting from the
//      input angle plus the sums of the segments before it;
//   3. seg_combine_kernel, grid (H, batch, CMB_BLOCKS): the state entering every
//      segment, E_0 = the initial state (with the k_prev/v_prev term),
//      E_s = decay_{s-1} E_{s-1} + local_{s-1}, in segment order, and the
//      angles entering them;
//   4. scan_fused_kernel<FUSED_SEGMENT>: each segment's outputs from its
//      entering state and angle; the last segment writes the final states.
// The states' inputs are read in launches 1-3 and the outputs written in 4
// only, so out may still alias in. The segment states are the same
// "shifted" states the chunk loop carries, so nothing else changes at a
// segment edge.
//
// Episode starts (STARTS, start [batch][seqlen] bytes; doc/math.md
// section 9): the chunk's start flags are staged in s_cs for ck_decay and
// ck_outputs (mg_m3_chunked_body.cuh, "Episode starts"), the beta copy of
// a token followed by a start is dropped (s_nx), and the angle walk
// restarts at a start: a slice's sum runs from its last start, and a
// thread after a start in the chunk starts from the slices since the last
// one (not from the angle entering the chunk). A stream whose first token
// is a start reads no state in. Segments: seg_angle_kernel sums each
// segment from its last start and flags it (in sg.th, which launch 3
// overwrites last segment first, so the flags it reads are intact); the
// prefix over the segments restarts at a flagged one. A local state and
// its decay (0 for a segment holding a start) need nothing more.
//
// The same arithmetic as the unfused path except where the angle sums
// restart: per chunk and slice here, per sequence slice there (f64 sums of
// the same increments in another grouping: agreement to f64 rounding
// before the wrap).
// ===========================================================================

// Vectors of the in_proj rows: FV elements (16 bytes) when every row starts
// 16-byte aligned (NP a multiple of FV), else single elements. The splits
// B, C, x, z start at multiples of 16 elements and N, P are multiples of
// 16, so their vectors are aligned too; FVU is the width over the
// unrotated entries n >= 2S of k' and q'.
constexpr int FV = (NP * (int)sizeof(act_t)) % 16 == 0 ? 16 / (int)sizeof(act_t) : 1;
constexpr int FVU = (2 * S) % FV == 0 ? FV : 1;
template <int V> __device__ __forceinline__ avec<V> avec_ld(const act_t *p)
{
    return *reinterpret_cast<const avec<V> *>(p);
}
template <int V> __device__ __forceinline__ void avec_st(act_t *p, const avec<V> &v)
{
    *reinterpret_cast<avec<V> *>(p) = v;
}
template <int V> __device__ __forceinline__ avec<V> avec_zero()
{
    avec<V> v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.e[j] = from_f32<act_t>(0.0f);
    return v;
}
static_assert(FV == 1 || (OFF_B % FV == 0 && OFF_C % FV == 0 && OFF_X % FV == 0 && OFF_Z % FV == 0 &&
                          N % FV == 0 && P % FV == 0 && CK_LDN % FV == 0), "aligned row vectors");

// V consecutive f32 weights (norm weights, biases) from p: 16-byte loads when
// V is a multiple of 4 (p is then 16-byte aligned: every weight tensor
// starts 256-byte aligned, the launcher checks the pointers, and the
// offsets used are multiples of 4), else one at a time. The same values;
// a quarter of the load instructions (ncu: the fused kernel's k', q'
// build and its gate were issue-bound on these scalar loads).
template <int V> __device__ __forceinline__ void f32_row_ld(const float *__restrict__ p, float (&v)[V])
{
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int k = 0; k < V / 4; ++k) {
            const float4 t = *reinterpret_cast<const float4 *>(p + 4 * k);
            v[4 * k] = t.x;
            v[4 * k + 1] = t.y;
            v[4 * k + 2] = t.z;
            v[4 * k + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = p[j];
    }
}

// v staged in its natural layout [CK_Q][FUSED_VLD] by cp.async and read
// through the transposed tile forms (ldmatrix.trans: the same fragments,
// as the training's forward, ck_vnat), where the transposed copy went
// through registers with 2-byte stores: 16-bit storage (f32's transposed
// tile forms are scalar loads) copied as 16-byte row vectors, P >= CK_Q so
// that [CK_Q][P + 8] fits the [P][CK_LDQ] tile. 0: the transposed copy.
constexpr int FUSED_VLD =
    sizeof(op_t) == 2 && sizeof(op_t) == sizeof(act_t) && FV * (int)sizeof(act_t) == 16 && P >= CK_Q && P % 8 == 0
        ? P + 8
        : 0;
static_assert(FUSED_VLD == 0 || CK_Q * FUSED_VLD <= P * CK_LDQ, "natural v in the Vt tile");

// The segment workspace (launches 1-4), slot (b * H + h) * nseg + s.
struct fused_seg {
    int nseg, seg_chunks;   // segments per sequence, chunks per segment
    float *state;           // [slot][P][N]: local final states (2), then entering states (3)
    float *dec;             // [slot]: the segment's decay (2)
    double *asum;           // [slot][S]: the segment's angle increments (1)
    double *th;             // [slot][S]: the angle entering the segment (3)
    const float *aux;       // [token][AUX_W]: the token prologue's rows (token_prologue_kernel)
};

// ---- The token prologue (one launch before the fused kernel, for every
// head at once): per token of the call, the 1/rms of each group's raw B
// and C rows (bc_rms, prep_kernel's order) and tanh of the angle inputs,
// into aux [token][AUX_W] = 1/rms(B_g) [G] | 1/rms(C_g) [G] | tanh [S].
// Why: every head's block of the fused kernel reads them, and computed
// them itself from the same in_proj row, H times over (ncu: the fused
// kernel is bound by its instruction count). The same expressions on the
// same values: the same bits. One warp per token.
constexpr int PRO_WARPS = 8;   // tokens per block
__global__ void __launch_bounds__(PRO_WARPS * 32)
token_prologue_kernel(size_t tokens, const act_t *__restrict__ proj, float *__restrict__ aux)
{
    const int lane = threadIdx.x & 31;
    const size_t tok = (size_t)blockIdx.x * PRO_WARPS + (threadIdx.x >> 5);
    if (tok >= tokens) return;   // the whole warp: bc_rms shuffles over all its lanes
    const act_t *pr = proj + tok * NP;
    float *row = aux + tok * AUX_W;
    for (int g = 0; g < G; ++g) {
        float rb, rc;
        bc_rms(pr + OFF_B + g * N, pr + OFF_C + g * N, lane, rb, rc);
        if (lane == 0) {
            row[g] = rb;
            row[G + g] = rc;
        }
    }
    for (int a = lane; a < S; a += 32) row[2 * G + a] = ang_tanh_of(pr[OFF_ANG + a]);
}

// The kernel's modes: the whole sequence per block; a segment's local
// state only; a segment's outputs from its entering state.
enum { FUSED_WHOLE = 0, FUSED_LOCAL = 1, FUSED_SEGMENT = 2 };

// The angle entering segment s of (b, h) (a = angle): the input angle plus
// the previous segments' sums, in segment order, wrapped (FUSED_LOCAL and
// seg_combine_kernel: the same bits).
template <bool STARTS = false>
__device__ __forceinline__ double seg_angle_start(const fused_seg &sg, const float *ang_in, size_t bh, int s, int a)
{
    double pre = 0.0;
    bool started = false;   // STARTS: a segment before s holds a start (flag 1.0 in sg.th, launch 1)
    for (int j = 0; j < s; ++j) {
        const double v = sg.asum[(bh * sg.nseg + j) * S + a];
        if constexpr (STARTS) {
            if (sg.th[(bh * sg.nseg + j) * S + a] != 0.0) {
                pre = v;
                started = true;
                continue;
            }
        }
        pre += v;
    }
    if constexpr (STARTS) {
        if (started) return wrap_2pi(pre);
    }
    return wrap_2pi((ang_in ? (double)ang_in[bh * S + a] : 0.0) + pre);
}

template <int MODE, bool STARTS>
__global__ void __launch_bounds__(CK_THREADS, CK_FUSED_MIN_BLOCKS)
scan_fused_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                  const float *__restrict__ Bnw, const float *__restrict__ Cnw,
                  const float *__restrict__ Bbias, const float *__restrict__ Cbias,
                  const float *__restrict__ Dskip, const float *__restrict__ ngw, const float *ssm_in,
                  const float *kp_in, const float *vp_in, const float *ang_in, float *ssm_out, float *kp_out,
                  float *vp_out, float *ang_out, act_t *__restrict__ gout, fused_seg sg,
                  const unsigned char *__restrict__ start)
{
    const ck_dims_fixed dm;
    extern __shared__ __align__(16) unsigned char ck_smem[];
    op_t *Qs = reinterpret_cast<op_t *>(ck_smem);   // [CK_Q][CK_LDN]  q'_t
    op_t *Ks = Qs + CK_Q * CK_LDN;                    // [CK_Q][CK_LDN]  k'_s
    op_t *Kw = Ks + CK_Q * CK_LDN;                    // [N][CK_LDQ]     w_s k'_s[n] (transposed)
    op_t *Vt = Kw + N * CK_LDQ;                       // [P][CK_LDQ]     v_s[p] (transposed), or
                                                      // [CK_Q][FUSED_VLD] v_s (natural)
    op_t *Hb = Vt + P * CK_LDQ;                       // [P][CK_LDN]     state entering the chunk
    op_t *Wt = Hb + P * CK_LDN;                       // [CK_WARPS][16][CK_LDW]  per-warp W tile
    float *fs = reinterpret_cast<float *>(Wt + CK_WARPS * 16 * CK_LDW);   // 7 CK_Q + 4 step scalars
    float *s_adt = fs, *s_gam = fs + CK_Q, *s_nx = fs + 2 * CK_Q;
    float *s_sf = fs + 3 * CK_Q;                      // STARTS: the start flags (s_cs, before ck_decay)
    float *Ys = fs + 7 * CK_Q + 4;                    // [CK_Q][CK_LDY]  y + D v (f32), or:
    float *s_tanh = Ys;                               // [CK_Q][S]       tanh of the angle inputs (stage only)
    float *s_dt = Ys + CK_YT;                         // [CK_Q + 4]      dt (row CK_Q: next chunk's first)
    float *s_lam = s_dt + CK_Q + 4;                   // [CK_Q + 4]      lambda
    float *s_rb = s_lam + CK_Q + 4;                   // [CK_Q]          1/rms(B_g); then the gate's scales
    float *s_rc = s_rb + CK_Q;                        // [CK_Q]          1/rms(C_g)
    double *s_part = reinterpret_cast<double *>(s_rc + CK_Q);   // [CK_ASL][S] slice sums
    double *s_th = s_part + CK_ASL * S;               // [S]             angle entering the chunk

    if (seqlen <= 0) return;
    const int h = blockIdx.x, grp = h / HPG;
    const size_t b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;   // first token of the sequence
    const float dtb = dt_bias[h], dsk = Dskip[h];
    // The angle thread: angle a over slice sl (threads past CK_ASL slices idle).
    const int aa = tid % S, asl = tid / S;
    const bool ang_thread = asl < CK_ASL;

    // This warp's state tile (rows p0s.., columns n0s..), the initial state.
    const int p0s = (warp % (P / 16)) * 16, n0s = (warp / (P / 16)) * CK_NW;
    // The chunks this block walks: the whole sequence, or segment `seg`.
    const int seg = MODE == FUSED_WHOLE ? 0 : blockIdx.z;
    const size_t slot = bh * (MODE == FUSED_WHOLE ? 1 : sg.nseg) + seg;
    const int c_begin = MODE == FUSED_WHOLE ? 0 : seg * sg.seg_chunks * CK_Q;
    const int c_end = MODE == FUSED_WHOLE ? seqlen : min(seqlen, c_begin + sg.seg_chunks * CK_Q);
    const bool last_seg = c_end == seqlen;
    float hs[CK_NW / 8][4];
    if constexpr (STARTS) {
        if (MODE == FUSED_WHOLE && start[row0]) ssm_in = kp_in = vp_in = nullptr;   // a start at t = 0
    }
    if (MODE == FUSED_WHOLE) {
        float w0 = 0.0f;
        if (kp_in && vp_in) {
            float d0, adt0, lam0;
            row_head_scalars(proj + row0 * NP, h, dtb, d0, adt0, lam0);
            w0 = (1.0f - lam0) * d0;
        }
        ck_state_init(dm, hs, Hb, ssm_in, kp_in, vp_in, w0, bh, p0s, n0s, lane);
        if (tid < S) s_th[tid] = ang_in ? (double)ang_in[bh * S + tid] : 0.0;
    } else if (MODE == FUSED_LOCAL) {
        ck_state_init(dm, hs, Hb, nullptr, nullptr, nullptr, 0.0f, bh, p0s, n0s, lane);
        if (tid < S) s_th[tid] = seg_angle_start<STARTS>(sg, ang_in, bh, seg, tid);
    } else {
        // the entering state of slot (b, h, seg): ck_state_init reads
        // [bh][P][N] of the pointer it is given, hence the base moved back
        // by bh states (slot >= bh)
        ck_state_init(dm, hs, Hb, sg.state + (slot - bh) * (size_t)(P * N), nullptr, nullptr, 0.0f, bh, p0s, n0s,
                      lane);
        if (tid < S) s_th[tid] = sg.th[slot * S + tid];
    }
    float dec = 1.0f;   // FUSED_LOCAL: the product of the chunks' decays (thread 0)
    if (MODE != FUSED_WHOLE) {   // these write the final states only from the last segment
        if (!last_seg) kp_out = nullptr;
        if (MODE == FUSED_LOCAL) kp_out = nullptr;
    }

    for (int c0 = c_begin; c0 < c_end; c0 += CK_Q) {
        const int len = min(CK_Q, seqlen - c0);
        const act_t *pc = proj + (row0 + c0) * NP;   // the chunk's first in_proj row
        __syncthreads();   // the previous chunk is done with the stage, Y and s_th; Hb is written
        // ---- A1: flat loads of the chunk's rows ----
        // (the cp.async copies first, so that they fly while the per-row
        // scalars below wait for their loads)
        if constexpr (FV * (int)sizeof(act_t) == 16) {
            // 16-byte rows: copied without passing through registers
            // (cp.async, rows past len zero-filled), every copy in flight at
            // once; waited for before the barrier that ends A1
            for (int idx = tid; idx < CK_Q * (N / FV); idx += CK_THREADS) {
                const int i = idx / (N / FV), n = FV * (idx % (N / FV));
                const bool in = i < len;
                const act_t *pr = pc + (size_t)(in ? i : 0) * NP + grp * N + n;
                cp_async_cg16(Ks + i * CK_LDN + n, pr + OFF_B, in);
                cp_async_cg16(Qs + i * CK_LDN + n, pr + OFF_C, in);
            }
        } else {
#pragma unroll 4
            for (int idx = tid; idx < CK_Q * (N / FV); idx += CK_THREADS) {
                const int i = idx / (N / FV), n = FV * (idx % (N / FV));
                avec<FV> bv = avec_zero<FV>(), cv = bv;
                if (i < len) {
                    const act_t *pr = pc + (size_t)i * NP + grp * N + n;
                    bv = avec_ld<FV>(pr + OFF_B);
                    cv = avec_ld<FV>(pr + OFF_C);
                }
                avec_st(Ks + i * CK_LDN + n, bv);
                avec_st(Qs + i * CK_LDN + n, cv);
            }
        }
        if constexpr (FUSED_VLD > 0) {
            // v in its natural layout, 16-byte copies (rows past len zero-filled)
            for (int idx = tid; idx < CK_Q * (P / FV); idx += CK_THREADS) {
                const int i = idx / (P / FV), p = FV * (idx % (P / FV));
                const bool in = i < len;
                cp_async_cg16(Vt + i * FUSED_VLD + p, pc + (size_t)(in ? i : 0) * NP + OFF_X + h * P + p, in);
            }
        } else {
#pragma unroll 4
            for (int idx = tid; idx < CK_Q * (P / FV); idx += CK_THREADS) {
                const int i = idx / (P / FV), p = FV * (idx % (P / FV));
                const avec<FV> xv = i < len ? avec_ld<FV>(pc + (size_t)i * NP + OFF_X + h * P + p) : avec_zero<FV>();
#pragma unroll
                for (int j = 0; j < FV; ++j) Vt[(p + j) * CK_LDQ + i] = xv.e[j];
            }
        }
        for (int i = tid; i <= CK_Q; i += CK_THREADS) {
            float d = 0.0f, a = 0.0f, l = 0.0f;
            if (c0 + i < seqlen) {
                const act_t *pr = pc + (size_t)i * NP;
                row_head_scalars(pr, h, dtb, d, a, l);
            }
            s_dt[i] = d;
            s_lam[i] = l;
            if (i < CK_Q) s_adt[i] = a;
            if constexpr (STARTS) {
                if (i < CK_Q) s_sf[i] = c0 + i < seqlen && start[row0 + c0 + i] ? 1.0f : 0.0f;
            }
        }
        {   // the token prologue's rows: the group's 1/rms of B and C, tanh of the angle inputs
            const float *ar = sg.aux + (row0 + c0) * AUX_W;
            for (int i = tid; i < len; i += CK_THREADS) {
                s_rb[i] = ar[(size_t)i * AUX_W + grp];
                s_rc[i] = ar[(size_t)i * AUX_W + G + grp];
            }
#pragma unroll 4
            for (int idx = tid; idx < len * S; idx += CK_THREADS)
                s_tanh[idx] = ar[(size_t)(idx / S) * AUX_W + 2 * G + idx % S];
        }
        if constexpr (FV * (int)sizeof(act_t) == 16) cp_async_wait_all();
        __syncthreads();
        // ---- A2: step weights, the angle slices' sums ----
        for (int i = tid; i < CK_Q; i += CK_THREADS) {
            float ga = 0.0f, nx = 0.0f;
            if (i < len) {
                ga = s_lam[i] * s_dt[i];
                if (c0 + i + 1 < seqlen) nx = (1.0f - s_lam[i + 1]) * s_dt[i + 1];
                if constexpr (STARTS) {
                    if (c0 + i + 1 < seqlen && start[row0 + c0 + i + 1]) nx = 0.0f;   // its beta copy is dropped
                }
            }
            s_gam[i] = ga;
            s_nx[i] = nx;
        }
        double th_start = 0.0;   // this angle thread's angle entering the chunk
        const int at0 = min(len, asl * CK_ASTEPS), at1 = min(len, at0 + CK_ASTEPS);   // its steps
        if (ang_thread) {
            double sum = 0.0;
            for (int i = at0; i < at1; ++i) {
                if constexpr (STARTS) {
                    if (s_sf[i] != 0.0f) sum = 0.0;   // the slice's sum from its last start
                }
                sum += angle_inc(s_tanh[i * S + aa], s_dt[i]);
            }
            s_part[asl * S + aa] = sum;
            th_start = s_th[aa];
        }
        __syncthreads();
        // ---- A3: k' and q' in place: the unrotated entries, then the
        // rotated pairs, walking the angle ----
        constexpr int NU = (N - 2 * S) / FVU;   // vectors of unrotated entries per row
        // rope_fraction 1.0 leaves none (NU = 0, the loop runs no step);
        // the divisor stays nonzero so the index arithmetic compiles
        constexpr int NU_DIV = NU > 0 ? NU : 1;
        for (int idx = tid; idx < len * NU; idx += CK_THREADS) {
            const int i = idx / NU_DIV, n = 2 * S + FVU * (idx % NU_DIV);
            avec<FVU> kb = avec_ld<FVU>(Ks + i * CK_LDN + n), qb = avec_ld<FVU>(Qs + i * CK_LDN + n);
            const float rb = s_rb[i], rc = s_rc[i];
            const bool last = kp_out && c0 + i == seqlen - 1;
            float bw[FVU], bbi[FVU], cw[FVU], cbi[FVU];
            f32_row_ld(Bnw + n, bw);
            f32_row_ld(Bbias + h * N + n, bbi);
            f32_row_ld(Cnw + n, cw);
            f32_row_ld(Cbias + h * N + n, cbi);
#pragma unroll
            for (int j = 0; j < FVU; ++j) {
                const float kv = to_f32(kb.e[j]) * rb * bw[j] + bbi[j];
                const float qv = to_f32(qb.e[j]) * rc * cw[j] + cbi[j];
                if (last) kp_out[bh * N + n + j] = kv;
                kb.e[j] = from_f32<op_t>(kv);
                qb.e[j] = from_f32<op_t>(qv);
            }
            avec_st(Ks + i * CK_LDN + n, kb);
            avec_st(Qs + i * CK_LDN + n, qb);
        }
        if (ang_thread) {
            double pre = 0.0;
            int j0 = 0;   // STARTS: the slice of the last start before this thread's steps
            bool started = false;
            if constexpr (STARTS) {
                for (int i = at0 - 1; i >= 0; --i)
                    if (s_sf[i] != 0.0f) {
                        j0 = i / CK_ASTEPS;
                        started = true;
                        break;
                    }
            }
            for (int j = j0; j < asl; ++j) pre += s_part[j * S + aa];
            double th = wrap_2pi((started ? 0.0 : th_start) + pre);
            const int n = 2 * aa;
            const float bw0 = Bnw[n], bw1 = Bnw[n + 1], cw0 = Cnw[n], cw1 = Cnw[n + 1];
            const float bb0 = Bbias[h * N + n], bb1 = Bbias[h * N + n + 1];
            const float cb0 = Cbias[h * N + n], cb1 = Cbias[h * N + n + 1];
            for (int i = at0; i < at1; ++i) {
                if constexpr (STARTS) {
                    if (s_sf[i] != 0.0f) th = 0.0;   // a new episode: the sum restarts
                }
                th = th + angle_inc(s_tanh[i * S + aa], s_dt[i]);
                if (th < 0.0 || th >= TWO_PI_D) th = wrap_2pi(th);   // fmod is the identity on [0, 2pi)
                float c, s;
                angle_cos_sin(th, c, s);
                op_t *kr = Ks + i * CK_LDN + n, *qr = Qs + i * CK_LDN + n;
                const float k0 = to_f32(kr[0]) * s_rb[i] * bw0 + bb0, k1 = to_f32(kr[1]) * s_rb[i] * bw1 + bb1;
                const float q0 = to_f32(qr[0]) * s_rc[i] * cw0 + cb0, q1 = to_f32(qr[1]) * s_rc[i] * cw1 + cb1;
                const float kr0 = c * k0 - s * k1, kr1 = s * k0 + c * k1;
                kr[0] = from_f32<op_t>(kr0);
                kr[1] = from_f32<op_t>(kr1);
                qr[0] = from_f32<op_t>(c * q0 - s * q1);
                qr[1] = from_f32<op_t>(s * q0 + c * q1);
                if (kp_out && c0 + i == seqlen - 1) {
                    kp_out[bh * N + n] = kr0;
                    kp_out[bh * N + n + 1] = kr1;
                }
            }
            if (at1 == len && at1 > at0) s_th[aa] = th;   // the angle leaving the chunk
        }
        __syncthreads();
        // ---- B: cumulative decay and weights ----
        ck_decay<STARTS>(fs, warp, lane);
        __syncthreads();
        // The next chunk's B, C, x and z rows into L2 while this one computes,
        // and the columns from OFF_DT to the row's end (dt, A, lambda and the
        // angle inputs of every head: the first loads of the next stage).
        if (c0 + CK_Q < c_end) {
            constexpr int LN = (N * (int)sizeof(act_t) + 127) / 128, LP = (P * (int)sizeof(act_t) + 127) / 128;
            constexpr int LD = ((NP - OFF_DT) * (int)sizeof(act_t) + 127) / 128;
            const int nxt = min(CK_Q, c_end - c0 - CK_Q);
            for (int i = tid; i < nxt * (2 * LN + 2 * LP + LD); i += CK_THREADS) {
                const int t = i % nxt, w = i / nxt;
                const char *row = reinterpret_cast<const char *>(pc + (size_t)(CK_Q + t) * NP);
                const char *pf;
                if (w < LN) pf = row + sizeof(act_t) * (OFF_B + grp * N) + 128 * w;
                else if (w < 2 * LN) pf = row + sizeof(act_t) * (OFF_C + grp * N) + 128 * (w - LN);
                else if (w < 2 * LN + LP) pf = row + sizeof(act_t) * (OFF_X + h * P) + 128 * (w - 2 * LN);
                else if (w < 2 * LN + 2 * LP) pf = row + sizeof(act_t) * (OFF_Z + h * P) + 128 * (w - 2 * LN - LP);
                else pf = row + sizeof(act_t) * OFF_DT + 128 * (w - 2 * LN - 2 * LP);
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pf));
            }
            // and its prologue rows (contiguous)
            const char *ar = reinterpret_cast<const char *>(sg.aux + (row0 + c0 + CK_Q) * AUX_W);
            const int la = (nxt * AUX_W * 4 + 127) / 128;
            for (int i = tid; i < la; i += CK_THREADS) asm volatile("prefetch.global.L2 [%0];" ::"l"(ar + 128 * i));
        }
        // ---- C: Kw and the outputs, into Y (FUSED_LOCAL: Kw only) ----
        if (MODE == FUSED_LOCAL) {
            ck_weighted_k(dm, Ks, Kw, fs, tid);
            if (tid == 0) dec *= fs[7 * CK_Q];
        } else {
            ck_outputs<STARTS, FUSED_VLD>(dm, Qs, Ks, Kw, Vt, Hb, Wt, fs, dsk, len, tid, warp, lane,
                       [&](int tr, int p, float o0, float o1) {
                           float2 o;
                           o.x = o0;
                           o.y = o1;
                           *reinterpret_cast<float2 *>(Ys + tr * CK_LDY + p) = o;
                       });
        }
        __syncthreads();   // Kw and Y are complete; every read of Hb is done
        // ---- D: the state step; the gate of the chunk's rows ----
        ck_state_step<FUSED_VLD>(dm, hs, Vt, Kw, Hb, fs, p0s, n0s, lane);
        if (MODE != FUSED_LOCAL) {
            // the gate's per-head scale of each row, GATE_ROWS rows of a
            // warp at once (their loads and butterflies side by side: one
            // row at a time waited out each shuffle in turn); a row past
            // len repeats row len - 1 and is not stored
            constexpr int GATE_ROWS = 4;
            for (int i0 = warp; i0 < len; i0 += GATE_ROWS * CK_WARPS) {
                float yv[GATE_ROWS][GATE_VPL];
#pragma unroll
                for (int u = 0; u < GATE_ROWS; ++u)
                    gate_head_vals(Ys + min(i0 + u * CK_WARPS, len - 1) * CK_LDY, 0, lane, yv[u]);
#pragma unroll
                for (int u = 0; u < GATE_ROWS; ++u) {
                    const float r = gate_head_rms(yv[u]);
                    if (lane == 0 && i0 + u * CK_WARPS < len) s_rb[i0 + u * CK_WARPS] = r;
                }
            }
            __syncthreads();
#pragma unroll 2
            for (int idx = tid; idx < len * (P / FV); idx += CK_THREADS) {
                const int i = idx / (P / FV), p = FV * (idx % (P / FV)), e = h * P + p;
                const avec<FV> zv = avec_ld<FV>(pc + (size_t)i * NP + OFF_Z + e);
                const float r = s_rb[i];
                float nw[FV];
                if constexpr (OUTPROJ_NORM) f32_row_ld(ngw + e, nw);
                avec<FV> gv;
#pragma unroll
                for (int j = 0; j < FV; ++j) {
                    const float gw = OUTPROJ_NORM ? r * nw[j] : 1.0f;
                    gv.e[j] = from_f32<act_t>(Ys[i * CK_LDY + p + j] * gw * silu(to_f32(zv.e[j])));
                }
                avec_st(gout + (row0 + c0 + i) * E + e, gv);
            }
        }
    }
    __syncthreads();
    if (MODE == FUSED_LOCAL) {   // the segment's local state and decay
        ck_state_store(dm, hs, sg.state + slot * (size_t)(P * N), p0s, n0s, lane);
        if (tid == 0) sg.dec[slot] = dec;
        return;
    }
    // Final states (every input state was read before the loop's first
    // barrier, or in an earlier launch): the whole sequence's block, or the
    // last segment's.
    if (!last_seg) return;
    if (ssm_out) ck_state_store(dm, hs, ssm_out + bh * (size_t)(P * N), p0s, n0s, lane);
    const size_t last = row0 + seqlen - 1;
    if (vp_out)
        for (int p = tid; p < P; p += CK_THREADS) vp_out[bh * P + p] = to_f32(proj[last * NP + OFF_X + h * P + p]);
    if (ang_out && tid < S) ang_out[bh * S + tid] = (float)s_th[tid];
}

// ---- Launch 1: each segment's sum of angle increments, grid (H, batch,
// nseg), CK_THREADS threads: thread (a, sl) sums a lane-strided share of
// the segment's steps in f64, then one thread per angle adds the shares in
// order.
template <bool STARTS>
__global__ void __launch_bounds__(CK_THREADS)
seg_angle_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt_bias, fused_seg sg,
                 const unsigned char *__restrict__ start)
{
    __shared__ double part[CK_ASL][S];
    __shared__ int lmax[STARTS ? CK_THREADS / 32 : 1];
    const int h = blockIdx.x, seg = blockIdx.z;
    const size_t b = blockIdx.y, bh = b * H + h;
    const int a = threadIdx.x % S, sl = threadIdx.x / S;
    const int t0 = seg * sg.seg_chunks * CK_Q, t1 = min(seqlen, t0 + sg.seg_chunks * CK_Q);
    const float dtb = dt_bias[h];
    int tl = t0;   // STARTS: the segment's last start (its sum runs from there), else t0
    if constexpr (STARTS) {
        // the last start in [t0, t1): per thread, a warp's max by butterfly,
        // then the warps' in order (no atomics)
        int m = -1;
        for (int t = t0 + (int)threadIdx.x; t < t1; t += CK_THREADS)
            if (start[b * (size_t)seqlen + t]) m = t;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(FULL_MASK, m, o));
        if ((threadIdx.x & 31) == 0) lmax[threadIdx.x >> 5] = m;
        __syncthreads();
        m = -1;
        for (int w = 0; w < CK_THREADS / 32; ++w) m = max(m, lmax[w]);
        if (m >= 0) tl = m;
        if (threadIdx.x < S) sg.th[(bh * sg.nseg + seg) * S + a] = m >= 0 ? 1.0 : 0.0;   // the flag (launch 2, 3)
    }
    if (sl < CK_ASL) {
        // SEGA_U steps' two inputs loaded at once, then summed in step
        // order (the loads of one step at a time left this launch waiting
        // on memory once per step)
        constexpr int SEGA_U = 8;
        double sum = 0.0;
        for (int t = t0 + sl; t < t1; t += SEGA_U * CK_ASL) {
            act_t xd[SEGA_U], xa[SEGA_U];
#pragma unroll
            for (int j = 0; j < SEGA_U; ++j) {
                const int tj = t + j * CK_ASL;
                if (tj < t1) {
                    const act_t *pr = proj + (b * (size_t)seqlen + tj) * NP;
                    xd[j] = pr[OFF_DT + h];
                    xa[j] = pr[OFF_ANG + a];
                }
            }
#pragma unroll
            for (int j = 0; j < SEGA_U; ++j) {
                const int tj = t + j * CK_ASL;
                if (tj >= t1 || (STARTS && tj < tl)) continue;
                const float d = row_dt_of(xd[j], dtb);
                sum += angle_inc(ang_tanh_of(xa[j]), d);
            }
        }
        part[sl][a] = sum;
    }
    __syncthreads();
    if (threadIdx.x < S) {
        double sum = 0.0;
        for (int j = 0; j < CK_ASL; ++j) sum += part[j][a];
        sg.asum[(bh * sg.nseg + seg) * S + a] = sum;
    }
}

// ---- Launch 3: the state and angle entering every segment, grid (H,
// batch, CMB_BLOCKS), CMB_THREADS threads; thread i of block z owns state
// entry z * CMB_THREADS + i and walks the segments in order, turning the
// local states into entering states in place (E_s = decay_{s-1} E_{s-1} +
// local_{s-1}). Why this shape: the walk is a chain of dependent steps per
// entry, so its speed is the number of entries in flight. One block per
// (b, h) walking every entry (as this kernel first did) kept 256 chains in
// flight per head: 36% of a one-sequence prefill at 8 segments (ncu).
// Here every entry has its own thread, and each thread issues the loads
// of CMB_SEGS segments' local states at once before it walks them (the
// same products in the same order: the same bits). Block z = 0 also
// writes the angles entering the segments.
constexpr int CMB_THREADS = 256;
constexpr int CMB_BLOCKS = (P * N + CMB_THREADS - 1) / CMB_THREADS;
constexpr int CMB_SEGS = 8;   // local states loaded at once per thread
template <bool STARTS>
__global__ void __launch_bounds__(CMB_THREADS)
seg_combine_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                   const float *ssm_in, const float *kp_in, const float *vp_in, const float *ang_in, fused_seg sg,
                   const unsigned char *__restrict__ start)
{
    const int h = blockIdx.x;
    const size_t b = blockIdx.y, bh = b * H + h;
    if constexpr (STARTS) {
        if (start[b * (size_t)seqlen]) ssm_in = kp_in = vp_in = nullptr;   // a start at t = 0: no state in
    }
    const int e = blockIdx.z * CMB_THREADS + threadIdx.x;
    if (e < P * N) {
        float w0 = 0.0f;
        if (kp_in && vp_in) {   // the first token's (1-lam) dt, as the whole-sequence kernel
            float d0, adt0, lam0;
            row_head_scalars(proj + b * (size_t)seqlen * NP, h, dt_bias[h], d0, adt0, lam0);
            w0 = (1.0f - lam0) * d0;
        }
        const int p = e / N, n = e % N;
        float v = ssm_in ? ssm_in[bh * (size_t)(P * N) + e] : 0.0f;
        if (kp_in && vp_in) v += w0 * vp_in[bh * P + p] * kp_in[bh * N + n];
        float *cell = sg.state + bh * sg.nseg * (size_t)(P * N) + e;
        const float *dec = sg.dec + bh * sg.nseg;
        for (int s0 = 0; s0 < sg.nseg; s0 += CMB_SEGS) {
            const int ns = min(CMB_SEGS, sg.nseg - s0);
            float loc[CMB_SEGS], dc[CMB_SEGS];
#pragma unroll
            for (int j = 0; j < CMB_SEGS; ++j)
                if (j < ns) {
                    loc[j] = cell[(size_t)(s0 + j) * (P * N)];
                    dc[j] = dec[s0 + j];
                }
#pragma unroll
            for (int j = 0; j < CMB_SEGS; ++j)
                if (j < ns) {
                    cell[(size_t)(s0 + j) * (P * N)] = v;
                    v = dc[j] * v + loc[j];
                }
        }
    }
    if (blockIdx.z != 0) return;
    for (int a = threadIdx.x; a < S; a += CMB_THREADS) {
        if constexpr (STARTS) {
            // last segment first: seg_angle_start(s) reads the flags of the
            // segments before s, which share sg.th
            for (int s = sg.nseg - 1; s >= 0; --s)
                sg.th[(bh * sg.nseg + s) * S + a] = seg_angle_start<true>(sg, ang_in, bh, s, a);
        } else {
            for (int s = 0; s < sg.nseg; ++s) sg.th[(bh * sg.nseg + s) * S + a] = seg_angle_start(sg, ang_in, bh, s, a);
        }
    }
}
