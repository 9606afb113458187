// scan_body.cuh: the bodies of the Mamba-1 forward scan kernels (sequential
// and chunked), written once against a dims policy `Dm` so that the shipped
// library and the autotuner compile the same code:
//   - the shipped kernels (scan_fwd.cuh, and the training forward of
//     scan_bwd.cuh) and the specialized tune candidates pass a policy whose
//     members are compile-time constants (every loop over a channel's states
//     unrolls, arrays and shared memory are sized statically);
//   - the generic tune candidate passes struct tune_dims, whose members are
//     kernel arguments (a hand-written library with runtime dimensions).
// A policy has the int members E, E2, N, R, XP (model dims), lanes (threads
// sharing one channel's state), npt (= N / lanes), channels (per block),
// tchunk (timesteps staged in shared memory per pass), and the compile-time
// bound NPT_MAX >= npt of the register arrays: loops over a channel's states
// run to NPT_MAX with a guard j < npt (folded away when npt is a constant),
// so the arrays stay in registers in the generic build too. The stage
// `Stage` is indexed stage[t][k], rows of 2N + 3 * channels floats (a static
// array, or the generic's dynamic shared memory): see scan_stage.
// Also needed from the includer: act_t, to_f32, from_f32, silu, softplus,
// FULL_MASK, SCAN_THREADS, SCAN_CHUNK, COMBINE_THREADS. FDT = true
// (the inference kernels when the generator fuses dt_proj into the scan):
// the `dt` argument is dt_proj.weight [E][R] instead of the dt_proj output,
// and the staging computes each channel's dt from the dt_low columns.
// #included inside the
// anonymous namespace of NAME_kernels.cu / NAME_backward.cu or inlined into
// a tune candidate, so it includes nothing itself.

// size_t without <stddef.h> (the tune candidates include no system header).
typedef decltype(sizeof(0)) mg_size_t;

// ---------------------------------------------------------------------------
// The decay a = exp(delta A) of every Mamba-1 recurrence (forward scans,
// combine, backward, decode), written once so that every path computes the
// same bits: 2^((delta log2 e) A) by the SFU's ex2.approx.ftz.f32 (relative
// error below 2^-22; a result under 2^-126 is flushed to 0, a decay that
// small is 0 to f32 state sums anyway). Why not expf: the accurate expf is
// seven FMA-pipe instructions around its one MUFU.EX2, and the scan issues
// one decay per (step, channel, state): with d_state 64 those instructions
// bound the chunked scan's two passes (doc/math.md §5). Why delta log2 e
// first: it is one multiply per step and channel; the per-state work is one
// multiply and the ex2. scan_l2e(delta) is that per-step factor; pass it
// with A (unscaled: the backward needs A itself) to scan_decay.
// ---------------------------------------------------------------------------
constexpr float SCAN_LOG2E = 1.4426950408889634f;
__device__ __forceinline__ float scan_l2e(float delta) { return delta * SCAN_LOG2E; }
__device__ __forceinline__ float scan_decay(float l2e_delta, float A)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(l2e_delta * A));
    return r;
}

// The most dt_proj columns (dt_rank) a fused-dt scan holds per channel;
// mg/derive_mamba1.lua fuses only up to this (SCAN_FDT_RMAX there).
constexpr int SCAN_FDT_RMAX = 16;

// Rows of a fused-dt scan's shared dt_proj weights (scan_span's sWdt): one
// per channel of the block with FDT (whose dims policy has a constant
// channel count: the shipped kernels), else a placeholder row.
template <bool FDT, class Dm> struct scan_fdt_rows { static constexpr int value = 1; };
template <class Dm> struct scan_fdt_rows<true, Dm> { static constexpr int value = Dm::channels; };

// ---------------------------------------------------------------------------
// scan_stage: load timesteps [t0, t0 + nt) of what the block's channels read
// into shared memory, coalesced, by the whole block, with what each step
// computes per channel alone. Row tt of the stage:
//   [0, N)                B_t            [N, 2N)   C_t (when OUT)
//   [2N, 2N+ch)           xc of the block's channels
//   [2N+ch, 2N+2ch)       delta = softplus(dt + dt_bias) of the channels;
//                         with FDT, dt = dt_low . dt_proj.weight[e] first
//                         (dt_proj fused into the scan)
//   [2N+2ch, 2N+3ch)      silu(z) (when OUT)
// with ch = dm.channels. Why staged: every step of the recurrence needs
// these per channel; read from global memory inside the step loop, each
// step waits one memory latency (the loop carries the state, so the loads
// of step t+1 are not issued before step t ends), and the scan runs at ~1
// us per step. Staged, a pass pays one latency per tchunk steps. Why delta
// and the gate here: the lanes sharing a channel each computed them (dt's
// dot product, softplus, silu: most of a step's instructions); here each
// (step, channel) is computed once, by the thread whose column it is.
// Element (tt, c) is done by a thread with threadIdx.x % ch == c (the block
// is ch x lanes threads), whose channel's dt_bias and (FDT) dt_proj row the
// caller passes: dtb_s, and wdt_s, the row in shared memory. Channels past
// E (a partial last block) stage channel E-1, as their threads compute on
// it.
// ---------------------------------------------------------------------------
template <bool OUT, bool FDT = false, class Dm, class Stage>
__device__ __forceinline__ void
scan_stage(int t0, int nt, mg_size_t row0, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
           const act_t *__restrict__ dbl, const act_t *__restrict__ xz, float dtb_s,
           const float *wdt_s, Stage sBC, Dm dm)
{
    const int E = dm.E, E2 = dm.E2, N = dm.N, R = dm.R, XP = dm.XP, ch = dm.channels;
    // staged dbl columns: B | C (or B)
    const int W = OUT ? 2 * N : N;
    for (int i = threadIdx.x; i < nt * W; i += SCAN_THREADS) {
        const int tt = i / W, k = i % W;
        sBC[tt][k] = to_f32(dbl[(row0 + t0 + tt) * XP + R + k]);
    }
    const int e0 = blockIdx.y * ch;
    for (int i = threadIdx.x; i < nt * ch; i += SCAN_THREADS) {
        const int tt = i / ch, c = i % ch;   // c == threadIdx.x % ch: dtb_s, wdt_s are its own
        const mg_size_t row = row0 + t0 + tt;
        const int ee = min(e0 + c, E - 1);
        sBC[tt][2 * N + c] = to_f32(xc[row * E + ee]);
        float dtr;   // the dt_proj output of this channel and step
        if (FDT) {
            // dt_low . dt_proj.weight[e] in f32, rounded to the storage
            // dtype as the GEMM's output would be (another order of the
            // same R products: rounding-level differences from it); a warp's
            // lanes share the step, so each dt_low load is one broadcast
            float acc = 0.0f;
#pragma unroll
            for (int r = 0; r < (FDT ? SCAN_FDT_RMAX : 1); ++r)
                if (r < R) acc += to_f32(dbl[row * XP + r]) * wdt_s[r];
            dtr = to_f32(from_f32<act_t>(acc));
        } else {
            dtr = to_f32(dt[row * E + ee]);
        }
        sBC[tt][2 * N + ch + c] = softplus(dtr + dtb_s);
        if (OUT) sBC[tt][2 * N + 2 * ch + c] = silu(to_f32(xz[row * E2 + E + ee]));
    }
}

// ---------------------------------------------------------------------------
// L2 prefetch hints (prefetch.global.L2: nothing is waited for, no register
// is written, no value changes) of what scan_stage loads for the next pass
// of scan_span: per step its dbl columns (B | C, or B; with FDT the dt_low
// columns before them too) and the block's channels of xc, dt (without FDT)
// and z (OUT), a thread per (step, array), each issuing the 128-byte lines
// that cover its range (none past it). Why: a pass's staging waits for all
// of its loads before the walk starts, and where a few blocks share an SM
// (mamba1_long's sequential scan at batch 8: two blocks of 256 threads)
// nothing hides that wait: 40% of its stall samples sat in the staging
// (H100, bench/results/h100-2026-12-07-profile-mamba1_long.txt). Issued
// once the pass is staged, the next pass's lines come into L2 while this
// one computes.
// The two line walks are also the scan backward's (scan_bwd.cuh) and the
// decode step's (decode.cuh): scan_prefetch_range issues the 128-byte lines
// covering [p, p + bytes) (none past it) from the calling thread alone,
// scan_prefetch_block the same lines dealt over the block's nt threads
// (thread i every nt-th line from the i-th).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void scan_prefetch_line(mg_size_t l)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const void *>(l)));
}
__device__ __forceinline__ void scan_prefetch_range(const void *p, mg_size_t bytes)
{
    const mg_size_t a = reinterpret_cast<mg_size_t>(p);
    for (mg_size_t l = a & ~(mg_size_t)127; l < a + bytes; l += 128) scan_prefetch_line(l);
}
__device__ __forceinline__ void scan_prefetch_block(const void *p, mg_size_t bytes, int nt)
{
    const mg_size_t a = reinterpret_cast<mg_size_t>(p);
    for (mg_size_t l = (a & ~(mg_size_t)127) + (mg_size_t)threadIdx.x * 128; l < a + bytes; l += (mg_size_t)nt * 128)
        scan_prefetch_line(l);
}
template <bool OUT, bool FDT, class Dm>
__device__ __forceinline__ void scan_prefetch_pass(int t0, int nt, mg_size_t row0, const act_t *xc,
                                                   const act_t *dt, const act_t *dbl, const act_t *xz,
                                                   Dm dm)
{
    const int E = dm.E, E2 = dm.E2, N = dm.N, R = dm.R, XP = dm.XP, ch = dm.channels;
    const int W = OUT ? 2 * N : N;
    const int e0 = blockIdx.y * ch;
    const mg_size_t ne = (mg_size_t)min(ch, E - e0);
    for (int i = threadIdx.x; i < nt * 4; i += SCAN_THREADS) {
        const mg_size_t row = row0 + t0 + i / 4;
        switch (i % 4) {
        case 0: scan_prefetch_range(dbl + row * XP + (FDT ? 0 : R), (mg_size_t)(FDT ? R + W : W) * sizeof(act_t)); break;
        case 1: scan_prefetch_range(xc + row * E + e0, ne * sizeof(act_t)); break;
        case 2: if (!FDT) scan_prefetch_range(dt + row * E + e0, ne * sizeof(act_t)); break;
        default: if (OUT) scan_prefetch_range(xz + row * E2 + E + e0, ne * sizeof(act_t)); break;
        }
    }
}

// Lanes a channel from which scan_group sums y as a reduce-scatter over its
// steps rather than a butterfly per step. Why a bound: at 16 lanes (d_state
// 64) the reduce-scatter took mamba1_long's prefill b8 T4096 from 3.565 to
// 3.496 ms (graph, -1.9%), at 4 lanes (d_state 16) mamba1_rl's b64 T256
// from 0.847 to 0.877 ms (+3.5%; H100, the same bits both ways,
// bench/results/h100-2026-12-07e-ab-m1-ytrans.csv): there it saves 5
// shuffles of 8 per group and reads each lane's x and gate from the stage
// at a stride of 128 floats (one bank).
constexpr int SCAN_RS_MIN_LANES = 8;

// ---------------------------------------------------------------------------
// scan_group: steps [tt0, tt0 + U) of a staged pass of scan_span (below:
// what a group computes and why), for the thread's channel c (within the
// block; e in the model, valid: e < E) and its states s; sw: the pass's
// start flags (ST). WHOLE: every step of the group is within the pass's nt
// staged steps, so no step is clamped or guarded; the pass's last group
// when nt is not a multiple of U is the WHOLE = false instance, whose steps
// past nt are computed on step nt-1's inputs and leave s, dsum and the
// outputs alone. Both compute each value with the same operations in the
// same order. Why two instances: in every pass but a sequence's last the
// groups are whole, and the guards' selects, branches and reconvergence
// points were a good part of a step's instructions, which bound this scan
// (Nsight Compute: 64% of the issue slots busy at mamba1_rl's batch 64).
// ---------------------------------------------------------------------------
template <bool WHOLE, bool OUT, bool SAVE, bool ST, int U, class Dm, class Stage>
__device__ __forceinline__ void
scan_group(int tt0, int nt, int t0, mg_size_t row0, int lane, int e, int c, bool valid, unsigned sw,
           float (&s)[Dm::NPT_MAX], const float (&A)[Dm::NPT_MAX], float dsk, float &dsum,
           act_t *__restrict__ g, Stage sBC, Dm dm, act_t *__restrict__ ysave)
{
    const int E = dm.E, N = dm.N, ch = dm.channels;
    float xg[U], dg[U], dxg[U], zg[U], ag[U][Dm::NPT_MAX];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int tt = WHOLE ? tt0 + u : min(tt0 + u, nt - 1);
        const float x = sBC[tt][2 * N + c];
        const float delta = sBC[tt][2 * N + ch + c];
        xg[u] = x;
        dg[u] = delta;
        dxg[u] = delta * x;
        zg[u] = OUT ? sBC[tt][2 * N + 2 * ch + c] : 0.0f;   // silu(z)
        const float dl = scan_l2e(delta);
#pragma unroll
        for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) ag[u][j] = scan_decay(dl, A[j]);
    }
    float yg[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int tt = WHOLE ? tt0 + u : min(tt0 + u, nt - 1);
        const bool on = WHOLE || tt0 + u < nt;
        if (ST && start_at(sw, tt0 + u)) {   // an episode starts here: the state before it is 0
#pragma unroll
            for (int j = 0; j < Dm::NPT_MAX; ++j) s[j] = 0.0f;
            if (!OUT) dsum = __int_as_float(0x7f800000);   // +INFINITY: the chunk's decay is 0
        }
        float y = 0.0f;
#pragma unroll
        for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) {
            const int n = lane * dm.npt + j;
            const float sn = ag[u][j] * s[j] + dxg[u] * sBC[tt][n];
            s[j] = on ? sn : s[j];
            if (OUT) y += s[j] * sBC[tt][N + n];
        }
        yg[u] = y;
        if (!OUT && on) dsum += dg[u];
    }
    if (OUT && dm.lanes >= SCAN_RS_MIN_LANES) {
        // y of the U steps, each summed over the channel's lanes by the
        // butterfly's tree (offsets lanes/2, lanes/4, .., 1) but as a
        // reduce-scatter: at the first levels a lane keeps half of its
        // steps' partial sums, sends the other half to its partner and adds
        // what it receives, so U steps take U - 1 shuffles there where a
        // butterfly per step takes U each level; the levels past log2(U)
        // (lanes > U) are the butterfly on the one sum left. Every sum adds
        // the same pairs in the same order as the per-step butterfly (a + b
        // and b + a are the same bits), so y is unchanged. Lane l then holds
        // the sums of steps [start, start + vf) and stores them when its
        // butterfly offsets' bits are 0 (one lane per step group), reading
        // that step's x and gate from the stage.
        constexpr int LU = ws_ilog2(U);
        const int start = rs_halve<LU, true>(yg, lane, dm.lanes / 2);   // yg[k] holds step start + k
        // the butterfly levels left: offsets below lanes >> log2(U)
        const int obf = (dm.lanes / 2) >> LU;
        for (int o = obf; o > 0; o >>= 1) yg[0] += __shfl_xor_sync(FULL_MASK, yg[0], o);
        // steps this lane holds: U / lanes where lanes < U, else 1
        const int vf = dm.lanes >= U ? 1 : U / dm.lanes;
        const int bmask = obf > 0 ? 2 * obf - 1 : 0;   // the butterfly offsets' bits
        if (valid && (lane & bmask) == 0) {
#pragma unroll
            for (int k = 0; k < U; ++k) if (k < vf) {
                const int u = start + k;
                if (WHOLE || tt0 + u < nt) {
                    const int tt = tt0 + u;
                    const float y = yg[k] + dsk * sBC[tt][2 * N + c];
                    const mg_size_t row = row0 + t0 + tt;
                    if (SAVE) ysave[row * E + e] = from_f32<act_t>(y);
                    g[row * E + e] = from_f32<act_t>(y * sBC[tt][2 * N + 2 * ch + c]);
                }
            }
        }
    } else if (OUT) {
        // fewer lanes: a butterfly per step, lane 0 stores
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int o = dm.lanes / 2; o > 0; o >>= 1) yg[u] += __shfl_xor_sync(FULL_MASK, yg[u], o);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const float y = yg[u] + dsk * xg[u];
            const mg_size_t row = row0 + t0 + tt0 + u;
            if (valid && lane == 0 && (WHOLE || tt0 + u < nt)) {
                if (SAVE) ysave[row * E + e] = from_f32<act_t>(y);
                g[row * E + e] = from_f32<act_t>(y * zg[u]);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// scan_span: the selective scan of one channel over timesteps
// [t_begin, t_end) of sequence b, state s in registers (in/out). Shared by the
// sequential scan, both recurrence passes of the chunked scan and the
// training forward, so every path computes the per-step recurrence with the
// same arithmetic:
//   delta = softplus(dt[b,t,e] + dt_bias[e])             (threshold 20)
//   s[n]  = exp(delta * A[e,n]) * s[n] + delta * B[b,t,n] * xc[b,t,e]
// OUT = true: also
//   y     = sum_n s[n] * C[b,t,n] + Dskip[e] * xc[b,t,e]
//   g[b,t,e] = y * silu(z[b,t,e])      (and ysave[b,t,e] = y when SAVE)
// OUT = false: no output; dsum += delta (the chunk's sum of delta, from
// which the combine pass gets the chunk's decay prod_t exp(delta_t A) =
// exp(A * dsum)). The inputs of tchunk timesteps are staged in shared
// memory per pass (scan_stage), so every thread of the block must call it
// with the same range.
// ST = true (episode starts, doc/math.md §9): start [tokens] (uint8, the
// call's [batch][seqlen] mask, indexed by row like the inputs) is staged
// per pass as one word (start_flag, start_word; tchunk <= 32) into *sst (shared, the
// caller's), which every thread then holds in a register; before the update of a
// step whose entry is nonzero the state is zeroed (s_{t-1} := 0, a fresh
// sequence's first step: the same arithmetic), and with OUT = false dsum
// becomes +INFINITY, the flag of a chunk whose decay a_c is 0 (the combine
// pass tests it: chunk_combine_body<true>). ST = false: none of this is
// compiled (the instructions of the maskless kernels are unchanged).
// ---------------------------------------------------------------------------
template <bool OUT, bool SAVE = false, bool ST = false, bool FDT = false, class Dm, class Stage>
__device__ __forceinline__ void
scan_span(int t_begin, int t_end, mg_size_t row0, int lane, int e, bool valid,
          float (&s)[Dm::NPT_MAX], const float (&A)[Dm::NPT_MAX], const float *__restrict__ dt_bias,
          float dsk, float &dsum,
          const act_t *__restrict__ xc, const act_t *__restrict__ dt,
          const act_t *__restrict__ dbl, const act_t *__restrict__ xz, act_t *__restrict__ g,
          Stage sBC, Dm dm, act_t *__restrict__ ysave = nullptr,
          const unsigned char *__restrict__ start = nullptr, unsigned *sst = nullptr)
{
    const int E = dm.E, ch = dm.channels;
    const int c = threadIdx.x / dm.lanes;   // this thread's channel within the block
    // steps per group (below): fewer where a thread holds more states (their
    // decays are kept for the group)
    constexpr int U = Dm::NPT_MAX <= 4 ? 4 : (Dm::NPT_MAX <= 8 ? 2 : 1);
    // The channel whose delta and gate this thread stages (scan_stage):
    // its dt_bias and (FDT: dt is dt_proj.weight [E][R]) its dt_proj row,
    // which the block loads into shared memory once, a row per channel
    // (padded to RMAX + 1 floats: the channels of a warp read different
    // banks). Why not registers: R floats a thread, 16 at mamba1_long,
    // took the chunked output pass to 94 registers (31% occupancy on an
    // H100); from shared memory it needs 64. The first pass's barrier
    // orders the load before the staging reads it.
    const int es = min((int)(blockIdx.y * ch + threadIdx.x % ch), E - 1);
    const float dtb_s = dt_bias[es];
    __shared__ float sWdt[scan_fdt_rows<FDT, Dm>::value][SCAN_FDT_RMAX + 1];
    if (FDT) {
        for (int i = threadIdx.x; i < ch * dm.R; i += SCAN_THREADS) {
            const int cc = i / dm.R, r = i % dm.R;
            sWdt[cc][r] = to_f32(dt[(mg_size_t)min((int)blockIdx.y * ch + cc, E - 1) * dm.R + r]);
        }
    }
    const float *wdt_s = FDT ? sWdt[threadIdx.x % ch] : nullptr;
    for (int t0 = t_begin; t0 < t_end; t0 += dm.tchunk) {
        const int nt = min(dm.tchunk, t_end - t0);
        __syncthreads();   // the previous pass is done reading the stage
        // warp 0: the pass's start flags as one word (nt <= 32), the loads
        // issued before the staging's, the ballot after them
        bool flag = false;
        if (ST && threadIdx.x < 32) flag = start_flag(start + row0, t0, nt, t_end);
        scan_stage<OUT, FDT>(t0, nt, row0, xc, dt, dbl, xz, dtb_s, wdt_s, sBC, dm);
        if (ST && threadIdx.x < 32) {
            const unsigned w = start_word(flag);
            if (threadIdx.x == 0) *sst = w;
        }
        __syncthreads();
        const unsigned sw = ST ? *sst : 0u;   // bit tt: a start at t0 + tt
        if (t0 + dm.tchunk < t_end)   // the next pass into L2 while this one computes (hints only)
            scan_prefetch_pass<OUT, FDT>(t0 + dm.tchunk, min(dm.tchunk, t_end - t0 - dm.tchunk), row0, xc, dt, dbl,
                                         xz, dm);
        // The pass in groups of U steps: first what each step computes
        // without the state (dt, delta, the decays exp(delta A), the gate),
        // then the recurrence of the U steps, then their outputs. Why: the
        // state is the only thing carried from step to step, but in program
        // order each step's independent work sat behind the previous step's
        // output (its shuffles, division, store); a warp issues in order,
        // and at the few warps per SM of this scan every step paid the whole
        // chain's latency. Grouped, the U steps' independent parts overlap.
        // Each value is computed with the same operations in the same order
        // as a step-at-a-time loop. Steps past nt (the pass's last group) are
        // computed on step nt-1's inputs and leave s, dsum and the outputs
        // alone (scan_group: whole groups, then a partial last one).
        // U = 1 (a thread holds more than 8 states): every step through the
        // guarded instance, as before the split. Why: there the whole
        // instance saved no time where the scan is long, and at mamba1_long's
        // batch 8, 32 steps (one block an SM: latency-bound) its prefill was
        // 15-20% slower on an H200; ptxas gave its scan_kernel 80 registers
        // instead of 96 (bench/results/h200-2026-12-06-ab-scan-whole-groups.csv)
        if (U == 1) {
            for (int tt0 = 0; tt0 < nt; ++tt0)
                scan_group<false, OUT, SAVE, ST, U>(tt0, nt, t0, row0, lane, e, c, valid, sw, s, A, dsk, dsum, g, sBC,
                                                    dm, ysave);
            continue;
        }
        const int whole_end = nt - nt % U;   // the groups before it are whole
        for (int tt0 = 0; tt0 < whole_end; tt0 += U)
            scan_group<true, OUT, SAVE, ST, U>(tt0, nt, t0, row0, lane, e, c, valid, sw, s, A, dsk, dsum, g, sBC, dm,
                                               ysave);
        if (whole_end < nt)
            scan_group<false, OUT, SAVE, ST, U>(whole_end, nt, t0, row0, lane, e, c, valid, sw, s, A, dsk, dsum, g,
                                                sBC, dm, ysave);
    }
}

// ---------------------------------------------------------------------------
// The sequential selective scan with the D skip and the SiLU(z) gate
// (scan_span<true> over the whole sequence). dt is the dt_proj output
// [tokens][E]; B and C are columns R..R+2N of the x_proj output dbl
// [tokens][XP]; z is columns E..2E of xz [tokens][2E]; A = -exp(A_log) is
// computed once per channel.
// Grid (batch, blocks); block SCAN_THREADS = channels x lanes. A channel's N
// states live in registers, split over its lanes (npt states each, adjacent
// lanes in one warp); y is summed over those lanes by a fixed xor-shuffle
// tree, a group of steps at a time (scan_group), and the lane holding a
// step's sum stores its g.
// Channels past E (a partial last block) compute on channel E-1 so that
// every lane takes part in the shuffles, and store nothing. The final state
// is written to state_out (may alias state_in; NULL: not written).
// ST, start, sst: episode starts (scan_span).
// ---------------------------------------------------------------------------
template <bool ST = false, bool FDT = false, class Dm, class Stage>
__device__ __forceinline__ void
scan_seq_body(int seqlen, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
              const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
              const float *__restrict__ dt_bias, const float *__restrict__ A_log,
              const float *__restrict__ Dskip, const float *state_in, float *state_out,
              act_t *__restrict__ g, Stage sBC, Dm dm,
              const unsigned char *__restrict__ start = nullptr, unsigned *sst = nullptr)
{
    const int E = dm.E, N = dm.N;
    const int lane = threadIdx.x % dm.lanes;
    const int e = blockIdx.y * dm.channels + threadIdx.x / dm.lanes;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const mg_size_t b = blockIdx.x;
    const mg_size_t row0 = b * (mg_size_t)seqlen;

    float A[Dm::NPT_MAX], s[Dm::NPT_MAX];
    const mg_size_t sb = (b * E + ec) * N + lane * dm.npt;
#pragma unroll
    for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) {
        A[j] = -expf(A_log[(mg_size_t)ec * N + lane * dm.npt + j]);
        s[j] = state_in ? state_in[sb + j] : 0.0f;
    }
    float dsum = 0.0f;
    scan_span<true, false, ST, FDT>(0, seqlen, row0, lane, e, valid, s, A, dt_bias, Dskip[ec], dsum,
                               xc, dt, dbl, xz, g, sBC, dm, nullptr, start, sst);
    if (state_out && valid) {
#pragma unroll
        for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) state_out[sb + j] = s[j];
    }
}

// ---------------------------------------------------------------------------
// The chunked scan. The sequence is cut into nc = ceil(seqlen / SCAN_CHUNK)
// chunks (the last one may be shorter). Per channel and state n, step t maps
// s -> a_t s + b_t with a_t = exp(delta_t A), b_t = delta_t B_t[n] xc_t; a
// chunk composes to the pair (a_c, b_c) = (prod a_t, its local end state from
// zero), and pairs combine with (a1,b1)o(a0,b0) = (a1 a0, a1 b0 + b1)
// (doc/math.md). Three launches on the stream:
//   1. chunk_state, grid (batch, blocks, nc-1): chunks 0..nc-2 from a zero
//      state -> b_c into cstate slot c+1, sum of delta into dsum (a_c =
//      exp(A * dsum), recomputed by the combine). The last chunk's pair is
//      not needed (the output pass carries it to the final state).
//   2. chunk_combine, one thread per (b, e, n): in fixed order c = 0..nc-2,
//      s_in(c+1) = a_c s_in(c) + b_c from s_in(0) = state_in (or 0); writes
//      every chunk's incoming state over cstate slot c.
//   3. chunk_output, grid (batch, blocks, nc): each chunk re-runs its
//      recurrence from its true incoming state, writing g; the last chunk
//      writes the final state.
// Workspace: cstate [batch][nc][E][N], dsum [batch][nc][E], f32 (the
// model's, sized for MAX_BATCH x SCAN_MAX_CHUNKS). state_in is read only by
// the combine and state_out written only by the output pass, so they may
// alias (in-place states) without a race. No atomics, fixed order:
// deterministic. Same block shape and staging as the sequential scan.
// Episode starts (ST = true, doc/math.md §9): pass 1 zeroes the state at a
// start, so b_c is the chunk's state from its last start, and writes dsum
// = +INFINITY for a chunk holding one (a_c = 0: nothing enters from
// before); the combine then takes s_in(c+1) = b_c for such a chunk (not
// exp(A * inf) s, which is NaN for A = -0); the output pass zeroes at the
// starts again. A start at t = 0 makes state_in irrelevant.
// ---------------------------------------------------------------------------
template <bool ST = false, bool FDT = false, class Dm, class Stage>
__device__ __forceinline__ void
chunk_state_body(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                 const act_t *__restrict__ dbl, const float *__restrict__ dt_bias,
                 const float *__restrict__ A_log, float *__restrict__ cstate,
                 float *__restrict__ dsum_out, Stage sBC, Dm dm,
                 const unsigned char *__restrict__ start = nullptr, unsigned *sst = nullptr)
{
    const int E = dm.E, N = dm.N;
    const int lane = threadIdx.x % dm.lanes;
    const int e = blockIdx.y * dm.channels + threadIdx.x / dm.lanes;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const mg_size_t b = blockIdx.x;
    const int c = blockIdx.z;   // 0 .. nc-2: full chunks
    float A[Dm::NPT_MAX], s[Dm::NPT_MAX];
#pragma unroll
    for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) {
        A[j] = -expf(A_log[(mg_size_t)ec * N + lane * dm.npt + j]);
        s[j] = 0.0f;
    }
    float dsum = 0.0f;
    scan_span<false, false, ST, FDT>(c * SCAN_CHUNK, (c + 1) * SCAN_CHUNK, b * (mg_size_t)seqlen, lane, e, valid,
                                s, A, dt_bias, 0.0f, dsum, xc, dt, dbl, nullptr, nullptr, sBC, dm, nullptr,
                                start, sst);
    if (valid) {
        float *cs = cstate + ((b * nc + c + 1) * E + e) * N + lane * dm.npt;
#pragma unroll
        for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) cs[j] = s[j];
        if (lane == 0) dsum_out[(b * nc + c) * E + e] = dsum;
    }
}

// One step of the chunk-state combine: the state entering chunk c+1 from
// the one entering chunk c (s), chunk c's sum of delta (ds: +INFINITY when
// it holds a start, ST) and its local end state (*nx): a s + *nx, a =
// exp(A ds) (scan_decay), or *nx alone after a start. Shared by chunk_combine_body and
// the self-combining output blocks (chunk_output_body<SELF>), so both give
// the same bits.
template <bool ST>
__device__ __forceinline__ float combine_step(float s, float A, float ds, const float *nx)
{
    if (ST && ds == __int_as_float(0x7f800000))   // the chunk holds a start
        return *nx;
    return scan_decay(scan_l2e(ds), A) * s + *nx;
}

template <bool ST = false, class Dm>
__device__ __forceinline__ void
chunk_combine_body(int batch, int nc, const float *__restrict__ A_log, const float *state_in,
                   float *__restrict__ cstate, const float *__restrict__ dsum, Dm dm)
{
    const int E = dm.E, N = dm.N;
    const mg_size_t i = (mg_size_t)blockIdx.x * COMBINE_THREADS + threadIdx.x;
    if (i >= (mg_size_t)batch * E * N) return;
    const mg_size_t b = i / ((mg_size_t)E * N), en = i % ((mg_size_t)E * N), e = en / N;
    const float A = -expf(A_log[en]);
    float s = state_in ? state_in[i] : 0.0f;
    float *cs = cstate + b * nc * (mg_size_t)E * N + en;
    const float *ds = dsum + b * nc * (mg_size_t)E + e;
    cs[0] = s;
    for (int c = 0; c + 1 < nc; ++c) {
        s = combine_step<ST>(s, A, ds[(mg_size_t)c * E], cs + (mg_size_t)(c + 1) * E * N);
        cs[(mg_size_t)(c + 1) * E * N] = s;
    }
}

// SELF (the shipped inference kernel when SCAN_SELF_COMBINE): no combine
// ran; cstate slot 0 holds the initial state (pass 1's chunk 0 copied it
// there; with one chunk, state_in is read directly: the block that reads a
// state is the one that writes it), slots 1.. the chunks' local end states,
// and this chunk's incoming state is the combine's walk over chunks 0 ..
// c-1 with the combine's arithmetic (chunk_combine_body), in registers.
template <bool ST = false, bool FDT = false, bool SELF = false, class Dm, class Stage>
__device__ __forceinline__ void
chunk_output_body(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                  const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
                  const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                  const float *__restrict__ Dskip, const float *__restrict__ cstate,
                  float *state_out, act_t *__restrict__ g, Stage sBC, Dm dm,
                  const unsigned char *__restrict__ start = nullptr, unsigned *sst = nullptr,
                  const float *state_in = nullptr, const float *__restrict__ chunk_dsum = nullptr)
{
    const int E = dm.E, N = dm.N;
    const int lane = threadIdx.x % dm.lanes;
    const int e = blockIdx.y * dm.channels + threadIdx.x / dm.lanes;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const mg_size_t b = blockIdx.x;
    const int c = blockIdx.z;
    const int t_begin = c * SCAN_CHUNK;
    const int t_end = min(seqlen, t_begin + SCAN_CHUNK);
    float A[Dm::NPT_MAX], s[Dm::NPT_MAX];
    const float *cs = cstate + ((b * nc + (SELF ? 0 : c)) * E + ec) * N + lane * dm.npt;
#pragma unroll
    for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) {
        A[j] = -expf(A_log[(mg_size_t)ec * N + lane * dm.npt + j]);
        if (SELF && nc == 1)
            s[j] = state_in ? state_in[(b * E + ec) * N + lane * dm.npt + j] : 0.0f;
        else
            s[j] = cs[j];
    }
    if (SELF) {
        for (int k = 0; k < c; ++k) {   // s_in(k+1) = a_k s_in(k) + b_k, as chunk_combine_body
            const float ds = chunk_dsum[(b * nc + k) * E + ec];
            const float *nx = cstate + ((b * nc + k + 1) * E + ec) * N + lane * dm.npt;
#pragma unroll
            for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) s[j] = combine_step<ST>(s[j], A[j], ds, nx + j);
        }
    }
    float dsum = 0.0f;
    scan_span<true, false, ST, FDT>(t_begin, t_end, b * (mg_size_t)seqlen, lane, e, valid, s, A, dt_bias,
                               Dskip[ec], dsum, xc, dt, dbl, xz, g, sBC, dm, nullptr, start, sst);
    if (state_out && valid && c == nc - 1) {
        float *so = state_out + (b * E + e) * N + lane * dm.npt;
#pragma unroll
        for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt) so[j] = s[j];
    }
}
