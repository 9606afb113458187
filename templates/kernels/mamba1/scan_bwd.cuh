// scan_bwd.cuh: the selective scan of the Mamba-1 training path
// (the math is in the header comment of NAME_backward.cu): the forward that
// saves checkpoints and y, the gate backward, the scan backward (one span,
// or the chunk-parallel passes when MG_M1_BSCAN_CHUNKED), and the dB|dC
// reduction.
// Written against the constants of NAME_common.cuh and those NAME_backward.cu
// defines (BCK, SCAN_WARPS, RED_THREADS, BSPAN*, BCOMB_THREADS); #included by
// NAME_backward.cu inside its anonymous namespace after mg_m1_scan_body.cuh
// (scan_span), so it includes nothing itself.

// Selective scan for training: the inference scan (scan_span of
// mg_m1_scan_body.cuh, same arithmetic) that also saves y (before the gate)
// and the state at the start of every BCK-step piece: ckpt [b][nck][E][N],
// nck = ceil(seqlen/BCK) (piece 0 = the initial state). g = y * silu(z) is
// the out_proj input. Grid (batch, SCAN_BLOCKS, nc):
//   nc = 1   the sequential scan: block (b, y) walks the whole sequence from
//            state_in (NULL: zeros);
//   nc > 1   the output pass of the chunked scan (after its passes 1 and 2,
//            NAME_launch_scan_chunk_states): block z walks chunk z of
//            SCAN_CHUNK steps from its incoming state cstate [b][nc][E][N].
// A chunk is a whole number of BCK pieces, so each piece's checkpoint is
// written by the block walking it. The final state goes to state_out (NULL:
// not written; may alias state_in: read before, or only by pass 2).
// ST: episode starts, start [batch][seqlen] (scan_span zeroes the state
// before a start token; a checkpoint is the state before its piece's first
// token, so the backward's recompute zeroes at the same tokens).
static_assert(BCK <= 32, "a checkpoint chunk's start flags are one 32-bit word (bwd_stage)");
static_assert(SCAN_CHUNK % BCK == 0, "a chunk is a whole number of checkpoint pieces");
template <bool ST>
__global__ void __launch_bounds__(SCAN_THREADS)
scan_fwd_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
                const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                const float *__restrict__ Dskip, const float *state_in, const float *__restrict__ cstate,
                float *state_out, float *__restrict__ ckpt, act_t *__restrict__ ysave, act_t *__restrict__ g,
                const unsigned char *__restrict__ start)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];   // [t][B | C | xc, delta, silu(z)]
    __shared__ unsigned sst[1];   // the pass's start flags as a word (ST)
    const ModelDims dm;
    const int lane = threadIdx.x % SCAN_LANES;
    const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const size_t row0 = b * (size_t)seqlen;
    const int nck = (seqlen + BCK - 1) / BCK;
    const int c = blockIdx.z;
    const int t_begin = nc > 1 ? c * SCAN_CHUNK : 0;
    const int t_end = nc > 1 ? min(seqlen, t_begin + SCAN_CHUNK) : seqlen;

    const float *init = nc > 1 ? cstate + ((b * nc + c) * E + ec) * N
                               : (state_in ? state_in + (b * E + ec) * N : nullptr);
    float A[SCAN_NPT], s[SCAN_NPT];
#pragma unroll
    for (int j = 0; j < SCAN_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * SCAN_NPT + j]);
        s[j] = init ? init[lane * SCAN_NPT + j] : 0.0f;
    }
    const float dsk = Dskip[ec];
    float dsum = 0.0f;
    for (int t0 = t_begin; t0 < t_end; t0 += BCK) {
        if (valid) {
            float *cp = ckpt + (((b * nck + t0 / BCK) * E + e) * N) + lane * SCAN_NPT;
#pragma unroll
            for (int j = 0; j < SCAN_NPT; ++j) cp[j] = s[j];
        }
        scan_span<true, true, ST>(t0, min(t_end, t0 + BCK), row0, lane, e, valid, s, A, dt_bias, dsk, dsum,
                                  xc, dt, dbl, xz, g, sBC, dm, ysave, start, sst);
    }
    if (state_out && valid && c == nc - 1) {
#pragma unroll
        for (int j = 0; j < SCAN_NPT; ++j) state_out[(b * E + e) * N + lane * SCAN_NPT + j] = s[j];
    }
}

// Stage timesteps [t0, t0 + nt) of the block's channels for the scan
// backward kernels, with what each step computes per channel alone:
// sIn[tt][0] = xc (skipped when xc is NULL), [1] = delta = softplus(raw),
// [2] = dy, and with DSP [3] = softplus'(raw), raw = dt + dt_bias;
// coalesced, by the whole block. Why staged: read inside the step loops
// they cost one memory latency per step (see scan_stage in
// mg_m1_scan_body.cuh). Why delta and softplus' here: every lane of a
// channel computed them at every step (twice: the recompute and the
// reverse walk), most of a step's transcendental work; here each (step,
// channel) is computed once, by a thread with threadIdx.x % BW_CHANNELS
// == its column (the block is channels x lanes threads), whose channel's
// dt_bias the caller passes (dtb_s). Channels past E stage xc and dt of
// channel E-1 (their threads compute on it) and dy = 0 (so they add nothing
// to the block's dB sums).
// RAW: [1] = dt as loaded (before the bias), for scan_bwd_span_kernel,
// which computes softplus in its step loop: staged there, its dsum and
// adjoints took other bits (the compiler contracts the step's arithmetic
// differently), and its ST and maskless instances then disagreed.
// ST: also the start flags of the steps as one word (warp 0: the flag
// loads issued first, the ballot after the staging): bit tt of *sst =
// start[row0 + t0 + tt].
constexpr int BWD_IN = 4;   // sIn slots: xc, delta, dy, softplus'
template <bool ST = false, bool DSP = true, bool RAW = false, int THREADS = BW_THREADS>
__device__ __forceinline__ void bwd_stage(int t0, int nt, size_t row0, const act_t *__restrict__ xc,
                                          const act_t *__restrict__ dt, const float *__restrict__ dy,
                                          float dtb_s, float (*sIn)[BWD_IN][BW_CHANNELS],
                                          const unsigned char *__restrict__ start = nullptr,
                                          unsigned *sst = nullptr)
{
    const int e0 = blockIdx.y * BW_CHANNELS;
    bool flag = false;
    if (ST && threadIdx.x < 32) flag = start_flag(start + row0, t0, nt, t0 + nt);
    for (int i = threadIdx.x; i < nt * BW_CHANNELS; i += THREADS) {
        const int tt = i / BW_CHANNELS, c = i % BW_CHANNELS;   // c == threadIdx.x % BW_CHANNELS (THREADS: a multiple)
        const size_t row = row0 + t0 + tt;
        const int ee = min(e0 + c, E - 1);
        // the three loads first, then the arithmetic: the dy load placed
        // after the softplus waited for it (a second memory latency per
        // element)
        const float xcv = xc ? to_f32(xc[row * E + ee]) : 0.0f;
        const float dtv = to_f32(dt[row * E + ee]);
        const float dyv = e0 + c < E ? dy[row * E + ee] : 0.0f;
        if (xc) sIn[tt][0][c] = xcv;
        const float raw = dtv + dtb_s;
        sIn[tt][1][c] = RAW ? dtv : softplus(raw);
        sIn[tt][2][c] = dyv;
        if (DSP) sIn[tt][3][c] = dsoftplus(raw);
    }
    if (ST && threadIdx.x < 32) {
        const unsigned w = start_word(flag);
        if (threadIdx.x == 0) *sst = w;
    }
}

// L2 prefetch hints (prefetch.global.L2) of what scan_bwd_kernel stages
// for checkpoint chunk c of sequence b: per step its B | C row of dbl and
// the block's channels of xc, dt and dy, and the chunk's checkpoint rows of
// the block's channels: the 128-byte lines covering each range (none past
// it: scan_prefetch_range of mg_m1_scan_body.cuh), a thread per (step,
// array), the block's threads dealing the checkpoint's lines
// (scan_prefetch_block).
__device__ __forceinline__ void bwd_prefetch_chunk(int c, size_t row0, size_t b, int nck,
                                                   const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                                                   const act_t *__restrict__ dbl, const float *__restrict__ dy,
                                                   const float *__restrict__ ckpt)
{
    const int e0 = blockIdx.y * BW_CHANNELS;
    const size_t ne = (size_t)min(BW_CHANNELS, E - e0);
    const int t0 = c * BCK;
    for (int i = threadIdx.x; i < BCK * 4; i += BW_THREADS) {
        const size_t row = row0 + t0 + i / 4;
        switch (i % 4) {
        case 0: scan_prefetch_range(dbl + row * XP + R, 2 * N * sizeof(act_t)); break;
        case 1: scan_prefetch_range(xc + row * E + e0, ne * sizeof(act_t)); break;
        case 2: scan_prefetch_range(dt + row * E + e0, ne * sizeof(act_t)); break;
        default: scan_prefetch_range(dy + row * E + e0, ne * sizeof(float)); break;
        }
    }
    scan_prefetch_block(ckpt + ((b * nck + c) * E + e0) * N, ne * N * sizeof(float), BW_THREADS);
}

// Gate backward, per (token, e): g = y silu(z) (recomputed: out_proj's dW input),
// dy = dg silu(z) (f32, into the scan backward), dz = dg y silu'(z) -> dxz[:, E+e].
__global__ void __launch_bounds__(RED_THREADS)
gate_bwd_kernel(size_t n, const act_t *__restrict__ y, const act_t *__restrict__ xz,
                const float *__restrict__ dg, act_t *__restrict__ g, float *__restrict__ dy,
                act_t *__restrict__ dxz)
{
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * RED_THREADS) {
        const size_t row = i / E, e = i % E;
        const float yv = to_f32(y[i]);
        const float z = to_f32(xz[row * E2 + E + e]);
        const float sz = silu(z);
        const float gg = dg[i];
        g[i] = from_f32<act_t>(yv * sz);
        dy[i] = gg * sz;
        dxz[row * E2 + E + e] = from_f32<act_t>(gg * yv * dsilu(z));
    }
}

// The warp's dB | dC reduce-scatter of scan_bwd_kernel: BC_V values per
// thread (its states' dB and dC), 2^BC_LEVELS channel groups per warp,
// BC_HALVE halving levels, BC_VF values left per thread; the remaining
// butterfly levels use the offsets in BC_BUTTERFLY_MASK, and only threads
// with those bits clear store. With 32 lanes per channel (one channel a
// warp: BC_LEVELS 0) there is nothing to reduce: every thread stores its
// own dB and dC values.
constexpr int BC_V = 2 * BW_NPT;
constexpr int BC_LEVELS = ws_ilog2(32 / BW_LANES);
constexpr int BC_HALVE = BC_LEVELS < ws_ilog2(BC_V) ? BC_LEVELS : ws_ilog2(BC_V);
constexpr int BC_VF = BC_V >> BC_HALVE;
constexpr int BC_BUTTERFLY_MASK = BC_HALVE < BC_LEVELS ? 2 * (16 >> BC_HALVE) - BW_LANES : 0;
static_assert((BC_HALVE >= 1 && BC_VF <= BW_NPT) || (BC_LEVELS == 0 && BC_VF == BC_V),
              "a window holds dB or dC values, not both (or, one channel a warp, all of the thread's)");

// Selective-scan backward (see the header). Grid (batch, BW_BLOCKS, spans),
// the forward scan's block shape. Block z walks the checkpoint chunks
// [z*span_ck, min(nck, (z+1)*span_ck)) from last to first, starting from
// ds = ds_end[b][z][E][N] (NULL: 0, the end of the sequence). The sequential
// backward is the launch with one span (span_ck >= nck, ds_end NULL); the
// chunk-parallel one launches a span per block z after scan_bwd_span_kernel
// and scan_bwd_combine_kernel gave each its entering ds. Outputs, for
// sequence b, span z of nz = gridDim.z:
//   dxc [row][E] f32   = sum_n ds delta B + Dskip dy (x_proj's dX is added later)
//   ddt [row][E] act   = d(dt_proj output) = ddelta softplus'(dt + dt_bias)
//   part_bc [blk][row][2N] = this block's channel sums of dB | dC (every row
//                      belongs to one span: written once)
//   part_A [b*nz+z][E][N], part_D [b*nz+z][E], part_dtb [b*nz+z][E]: sums
//                      over the span's steps
//   dss [b][E][N] (optional) = dL/d(initial state), from span 0
// ST: episode starts, start [batch][seqlen]: the recompute zeroes the state
// before a start token as the forward did; at a start the state entering
// the step is the constant 0, so its decay term (q) is 0 and the adjoint
// carried to t-1 is 0 (no gradient crosses the start; dss of a sequence
// starting at t = 0 is 0).
// The step loops of scan_bwd_kernel: unrolled over the BCK steps of a
// checkpoint chunk when its recomputed states fit registers (BCK x
// BW_NPT <= 64 floats a thread), so that hs is indexed by constants and
// stays in registers (steps past a partial chunk's end are skipped);
// otherwise loops, with hs in local memory. Why: with hs in local memory
// every step of the reverse walk loads its states back (mamba1_rl: the
// kernel was 31% of the RL training step on the H200, at 6% occupancy).
// Unrolled, the kernel is compiled for 128 registers a thread (512 / block
// size blocks per SM): where hs fits (mamba1_rl: no spills) the blocks of a
// batch-64 call still run in one wave.
constexpr int BWD_UNROLL = BCK * BW_NPT <= 64 ? BCK : 1;
constexpr int BWD_MIN_BLOCKS = (BWD_UNROLL > 1 && BW_THREADS <= 512) ? 512 / BW_THREADS : 1;

template <bool ST>
__global__ void __launch_bounds__(BW_THREADS, BWD_MIN_BLOCKS)
scan_bwd_kernel(int seqlen, int tokens, int span_ck, const act_t *__restrict__ xc,
                const act_t *__restrict__ dt, const act_t *__restrict__ dbl,
                const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                const float *__restrict__ Dskip, const float *__restrict__ ckpt,
                const float *__restrict__ dy, const float *__restrict__ ds_end,
                float *__restrict__ dxc, act_t *__restrict__ ddt, float *__restrict__ part_bc,
                float *__restrict__ part_A, float *__restrict__ part_D, float *__restrict__ part_dtb,
                float *__restrict__ dss, const unsigned char *__restrict__ start)
{
    __shared__ float sBC[BCK][2 * N];
    __shared__ float sIn[BCK][BWD_IN][BW_CHANNELS];   // xc, delta, dy, softplus' of the block's channels (bwd_stage)
    __shared__ unsigned sst[1];                    // start flags of the chunk's steps, a word (ST)
    // per-warp dB | dC of BWD_RED steps, double-buffered: red[2][BWD_RED][BW_WARPS][2N]
    // in dynamic shared memory (BWD_RED_BYTES; above 48 KiB with blocks of
    // 512+ threads, see derive_mamba1 bscan_red_steps)
    extern __shared__ float bwd_red_smem[];
    float (*red)[BWD_RED][BW_WARPS][2 * N] = reinterpret_cast<float (*)[BWD_RED][BW_WARPS][2 * N]>(bwd_red_smem);
    const int lane = threadIdx.x % BW_LANES;
    const int ci = threadIdx.x / BW_LANES;   // this thread's channel within the block
    const int warp = threadIdx.x >> 5;
    const int e = blockIdx.y * BW_CHANNELS + threadIdx.x / BW_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const size_t row0 = b * (size_t)seqlen;
    const int nck = (seqlen + BCK - 1) / BCK;
    const int z = blockIdx.z;
    const size_t pb = b * gridDim.z + z;   // partial index (sequence, span)
    const int c_lo = z * span_ck;
    const int c_hi = min(nck, c_lo + span_ck);

    float A[BW_NPT], ds[BW_NPT], gA[BW_NPT];   // gA: part_A's sums before their factor A[n] (phase F)
    // Padding threads (valid false) keep ds = 0: with dy = 0 they then add
    // nothing to the block's dB sums.
    const float *dse = (ds_end && valid) ? ds_end + (pb * E + e) * N + lane * BW_NPT : nullptr;
#pragma unroll
    for (int j = 0; j < BW_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * BW_NPT + j]);
        ds[j] = dse ? dse[j] : 0.0f;
        gA[j] = 0.0f;
    }
    const float dsk = Dskip[ec];
    float gD = 0.0f, gdtb = 0.0f;
    int par = 0;

    for (int c = c_hi - 1; c >= c_lo; --c) {
        const int t0 = c * BCK;
        const int nt = min(BCK, seqlen - t0);
        // ---- A: stage the chunk (B | C rows; xc, delta, dy, softplus' of the block's channels) ----
        __syncthreads();   // the previous chunk is done reading sBC, sIn
        for (int i = threadIdx.x; i < nt * 2 * N; i += BW_THREADS) {
            const int tt = i / (2 * N), k = i % (2 * N);
            sBC[tt][k] = to_f32(dbl[(row0 + t0 + tt) * XP + R + k]);
        }
        // (bwd_stage's dt_bias loaded per chunk: a register less across the walk)
        bwd_stage<ST>(t0, nt, row0, xc, dt, dy, dt_bias[min(blockIdx.y * BW_CHANNELS + threadIdx.x % BW_CHANNELS, E - 1)],
                      sIn, start, sst);
        __syncthreads();
        const unsigned sw = ST ? *sst : 0u;   // bit tt: a start at t0 + tt
        // The chunk walked next (c - 1): its B | C rows, xc, dt, dy of the
        // block's channels and its checkpoint into L2 while this one
        // computes, so that its staging waits on L2 rather than on memory
        // (prefetch hints: nothing is waited for, no value changes).
        if (c > c_lo) bwd_prefetch_chunk(c - 1, row0, b, nck, xc, dt, dbl, dy, ckpt);
        // ---- B: recompute the chunk's states from its checkpoint (forward arithmetic) ----
        float s0[BW_NPT], hs[BCK][BW_NPT];
        const float *cp = ckpt + (((b * nck + c) * E + ec) * N) + lane * BW_NPT;
#pragma unroll
        for (int j = 0; j < BW_NPT; ++j) s0[j] = cp[j];
        {
            float s[BW_NPT];
#pragma unroll
            for (int j = 0; j < BW_NPT; ++j) s[j] = s0[j];
#pragma unroll BWD_UNROLL
            for (int tt = 0; tt < BCK; ++tt) if (tt < nt) {   // nt < BCK: the sequence's last chunk
                const float x = sIn[tt][0][ci];
                const float delta = sIn[tt][1][ci];
                const float dx = delta * x;
                const float dl = scan_l2e(delta);
                if (ST && start_at(sw, tt)) {
#pragma unroll
                    for (int j = 0; j < BW_NPT; ++j) s[j] = 0.0f;
                }
#pragma unroll
                for (int j = 0; j < BW_NPT; ++j) {
                    s[j] = scan_decay(dl, A[j]) * s[j] + dx * sBC[tt][lane * BW_NPT + j];
                    hs[tt][j] = s[j];
                }
            }
        }
        // ---- C: walk the chunk in reverse ----
#pragma unroll BWD_UNROLL
        for (int k = 0; k < BCK; ++k) if (BCK - 1 - k < nt) {   // steps past a partial chunk's end: none
            const int tt = BCK - 1 - k;
            const size_t row = row0 + t0 + tt;
            const int g = (nt - 1 - tt) % BWD_RED;   // this step's row in the dB | dC group
            const float x = sIn[tt][0][ci];
            const float delta = sIn[tt][1][ci];
            const float dyv = sIn[tt][2][ci];   // 0 for padding channels
            const bool cut = ST && start_at(sw, tt);   // an episode starts at this step
            const float dl = scan_l2e(delta);
            // Per state n the step's gradients share factors, so each
            // (step, state) does the least arithmetic (the sums over n are
            // then scaled once per step):
            //   dsn = ds[n] + dy C[n]          (the adjoint of s_t[n])
            //   q   = dsn s_{t-1}[n] a[n]      (part_A[n] sums q A[n] delta: q delta here, A[n] once in phase F)
            //   dd  = sum_n q A[n] + x sum_n dsn B[n]      (d delta)
            //   dx  = delta sum_n dsn B[n]                 (d xc, the scan's part)
            //   dB[n] = dsn delta x, dC[n] = dy s_t[n], ds[n] <- dsn a[n]
            const float dxs = delta * x;
            float dq = 0.0f, tb = 0.0f, cb[BW_NPT], cc[BW_NPT];
#pragma unroll
            for (int j = 0; j < BW_NPT; ++j) {
                const int n = lane * BW_NPT + j;
                const float sprev = tt > 0 ? hs[tt - 1][j] : s0[j];
                const float Bn = sBC[tt][n], Cn = sBC[tt][N + n];
                cc[j] = dyv * hs[tt][j];
                const float dsn = ds[j] + dyv * Cn;
                // at a start the decay a is 0: the state entering the step is
                // the constant 0 (q = 0) and no adjoint is carried to t-1
                // (one select for both; q's zero may then carry sprev's sign,
                // which the sums below, starting from +0, never keep)
                const float a = cut ? 0.0f : scan_decay(dl, A[j]);
                const float q = dsn * sprev * a;
                dq += q * A[j];
                gA[j] += q * delta;
                tb += dsn * Bn;
                cb[j] = dsn * dxs;
                ds[j] = dsn * a;
            }
#pragma unroll
            for (int o = BW_LANES / 2; o > 0; o >>= 1) {
                dq += __shfl_xor_sync(FULL_MASK, dq, o);
                tb += __shfl_xor_sync(FULL_MASK, tb, o);
            }
            const float dd = dq + x * tb, dx = delta * tb;
            const float draw = dd * sIn[tt][3][ci];   // * softplus'(dt + dt_bias)
            gD += dyv * x;
            gdtb += draw;
            if (valid && lane == 0) {
                dxc[row * E + e] = dx + dsk * dyv;
                ddt[row * E + e] = from_f32<act_t>(draw);
            }
            // ---- D: the step's dB | dC over the warp ----
            // dB, dC: sum over the warp's channels, then over the block's
            // warps in order. Within the warp a reduce-scatter: at each
            // channel-group offset a thread keeps half of its values, sends
            // the other half to its partner and adds what it receives, so
            // after log2(groups) levels each thread holds the warp sums of
            // a distinct window of its columns (2N/lanes values take 2N/lanes
            // - 1 shuffles where a butterfly per value takes
            // (2N/lanes) * log2(groups)). With fewer values than groups
            // (N < 16) the last levels are a butterfly on the one value left.
            {
                float v[BC_V];
#pragma unroll
                for (int j = 0; j < BW_NPT; ++j) { v[j] = cb[j]; v[BW_NPT + j] = cc[j]; }
                const int start = rs_halve<BC_HALVE>(v, threadIdx.x, 16);   // v[k] holds value start + k
#pragma unroll
                for (int l = BC_HALVE; l < BC_LEVELS; ++l) v[0] += __shfl_xor_sync(FULL_MASK, v[0], 16 >> l);
                if ((threadIdx.x & BC_BUTTERFLY_MASK) == 0) {
#pragma unroll
                    for (int k = 0; k < BC_VF; ++k) {
                        const int idx = start + k;   // < BW_NPT: B column, else C
                        const int col = idx < BW_NPT ? lane * BW_NPT + idx : N + lane * BW_NPT + (idx - BW_NPT);
                        red[par][g][warp][col] = v[k];
                    }
                }
            }
            // ---- E: the group's dB | dC over the block's warps ----
            // The group's warp sums over the block's warps in order, one
            // row per step (the same sums as one step at a time): one
            // barrier per BWD_RED steps; red is double-buffered, so the next
            // group's writes wait for no reader (a reader of this buffer is
            // past the next group's barrier before it is written again).
            if (g == BWD_RED - 1 || tt == 0) {
                __syncthreads();
                const size_t row_hi = row0 + t0 + tt + g;   // the group's first step (walked last to first)
                for (int i = threadIdx.x; i < (g + 1) * 2 * N; i += BW_THREADS) {
                    const int gi = i / (2 * N), col = i % (2 * N);
                    float acc = 0.0f;
#pragma unroll
                    for (int w = 0; w < BW_WARPS; ++w) acc += red[par][gi][w][col];
                    part_bc[((size_t)blockIdx.y * tokens + row_hi - gi) * (2 * N) + col] = acc;
                }
                par ^= 1;
            }
        }
    }
    // ---- F: the span's partial sums of dA, dD, d dt_bias (and ds at its start) ----
    if (valid) {
        const size_t pa = (pb * E + e) * N + lane * BW_NPT;
        const size_t sb = (b * E + e) * N + lane * BW_NPT;
#pragma unroll
        for (int j = 0; j < BW_NPT; ++j) {
            part_A[pa + j] = gA[j] * A[j];
            if (dss && z == 0) dss[sb + j] = ds[j];
        }
        if (lane == 0) {
            part_D[pb * E + e] = gD;
            part_dtb[pb * E + e] = gdtb;
        }
    }
}
#if MG_M1_BSCAN_CHUNKED

// Pass 1 of the chunk-parallel scan backward. Grid (batch, BW_BLOCKS,
// spans), the scan's block shape; block z takes the span of steps
// [z*BSPAN, min(seqlen, (z+1)*BSPAN)). Per (b, z, e, n):
//   span_p  = exp(A sum_t delta_t), the product of the span's a_t
//   span_ds = the adjoint at the span start when ds = 0 at its end: the
//             reverse walk ds = a_t (ds + dy_t C_t) over the span
// Why: both are what pass 2 needs to hand each span its entering ds; they
// depend on dt, dy and C only (no states, no checkpoints), so every span is
// independent. The span's C_t are staged BCK steps at a time in shared
// memory. Layout [b][z][E][N], z < gridDim.z.
// ST: episode starts, start [batch][seqlen]: at a start the walk's adjoint
// becomes 0 (nothing crosses it), and a span holding one passes nothing
// from its end to its start: span_p = 0 (pass 2's combine then hands the
// span before it only this span's local adjoint, unchanged code).
template <bool ST>
__global__ void __launch_bounds__(SPAN_THREADS)
scan_bwd_span_kernel(int seqlen, const act_t *__restrict__ dt, const act_t *__restrict__ dbl,
                     const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                     const float *__restrict__ dy, float *__restrict__ span_p, float *__restrict__ span_ds,
                     const unsigned char *__restrict__ start)
{
    __shared__ float sC[BCK][N];
    __shared__ float sIn[BCK][BWD_IN][BW_CHANNELS];   // bwd_stage<RAW> (xc and softplus' unused here)
    __shared__ unsigned sst[1];                    // start flags of the piece's steps, a word (ST)
    const int lane = threadIdx.x % SPAN_LANES;
    const int ci = threadIdx.x / SPAN_LANES;
    const int e = blockIdx.y * BW_CHANNELS + threadIdx.x / SPAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const size_t row0 = b * (size_t)seqlen;
    const int z = blockIdx.z;
    const int t_lo = z * BSPAN;
    const int t_hi = min(seqlen, t_lo + BSPAN);

    float A[SPAN_NPT], ds[SPAN_NPT];
#pragma unroll
    for (int j = 0; j < SPAN_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * SPAN_NPT + j]);
        ds[j] = 0.0f;
    }
    const float dtb = dt_bias[ec];
    float dsum = 0.0f;   // sum of delta over the span, last step first
    bool cut = false;    // ST: the span holds a start

    for (int c = (t_hi - t_lo + BCK - 1) / BCK - 1; c >= 0; --c) {
        const int t0 = t_lo + c * BCK;
        const int nt = min(BCK, t_hi - t0);
        __syncthreads();   // the previous piece is done reading sC
        for (int i = threadIdx.x; i < nt * N; i += SPAN_THREADS) {
            const int tt = i / N, k = i % N;
            sC[tt][k] = to_f32(dbl[(row0 + t0 + tt) * XP + R + N + k]);
        }
        bwd_stage<ST, false, true, SPAN_THREADS>(t0, nt, row0, nullptr, dt, dy, 0.0f, sIn, start, sst);
        __syncthreads();
        const unsigned sw = ST ? *sst : 0u;   // bit tt: a start at t0 + tt
        for (int tt = nt - 1; tt >= 0; --tt) {
            const float delta = softplus(sIn[tt][1][ci] + dtb);
            const float dyv = sIn[tt][2][ci];
            const float dl = scan_l2e(delta);
            dsum += delta;
            const bool st = ST && start_at(sw, tt);   // a start: the adjoint carried to t-1 is 0
            cut = cut || st;
#pragma unroll
            for (int j = 0; j < SPAN_NPT; ++j)
                ds[j] = (ds[j] + dyv * sC[tt][lane * SPAN_NPT + j]) * (st ? 0.0f : scan_decay(dl, A[j]));
        }
    }
    if (valid) {
        const size_t o = (((b * gridDim.z + z) * E) + e) * N + lane * SPAN_NPT;
#pragma unroll
        for (int j = 0; j < SPAN_NPT; ++j) {
            span_p[o + j] = (ST && cut) ? 0.0f : scan_decay(scan_l2e(dsum), A[j]);
            span_ds[o + j] = ds[j];
        }
    }
}

// Pass 2: one thread per (b, e, n) walks the nz spans from last to first and
// replaces span_ds[b][z] (the span's local adjoint) by the ds entering span z
// from its end: 0 for the last span, then P_{z+1} in_{z+1} + Lc_{z+1}. Serial
// over spans only (seqlen / BSPAN steps); in place, so no extra buffer. The
// initial-state gradient comes from pass 3's span 0, which walks its steps.
__global__ void __launch_bounds__(BCOMB_THREADS)
scan_bwd_combine_kernel(int batch, int nz, const float *__restrict__ span_p, float *__restrict__ span_ds)
{
    const size_t i = (size_t)blockIdx.x * BCOMB_THREADS + threadIdx.x;
    if (i >= (size_t)batch * E * N) return;
    const size_t b = i / ((size_t)E * N), en = i % ((size_t)E * N);
    float carry = 0.0f;
    for (int z = nz - 1; z >= 0; --z) {
        const size_t o = (b * nz + z) * (size_t)E * N + en;
        const float p = span_p[o], l = span_ds[o];
        span_ds[o] = carry;
        carry = p * carry + l;
    }
}
#endif // MG_M1_BSCAN_CHUNKED

// ddbl[row][R + i] = sum over the scan blocks (in order) of part_bc[blk][row][i].
__global__ void __launch_bounds__(RED_THREADS)
bc_reduce_kernel(int tokens, const float *__restrict__ part_bc, act_t *__restrict__ ddbl)
{
    const size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x;
    if (i >= (size_t)tokens * 2 * N) return;
    const size_t row = i / (2 * N), k = i % (2 * N);
    float acc = 0.0f;
    for (int p = 0; p < BW_BLOCKS; ++p) acc += part_bc[(size_t)p * tokens * 2 * N + i];
    ddbl[row * XP + R + k] = from_f32<act_t>(acc);
}
