// decode.cuh: the single-token decode of the Mamba-1 forward
// (NAME_kernels.cu): the fused two-kernel mixer step, and the single-launch
// step of the whole backbone (MG_M1_DECODE_PERSISTENT: thread-block
// clusters, cooperative_groups included by NAME_kernels.cu).
// Written against the constants of NAME_common.cuh (dims, CONV_*, SCAN_*,
// DEC_*, the weight offsets DOFF_* / DL0_*, act_t); #included by
// NAME_kernels.cu inside its anonymous namespace, so it includes nothing
// itself.

// ---------------------------------------------------------------------------
// The fused single-token decode (seqlen 1): two kernels replace conv, the
// x_proj and dt_proj GEMMs and the scan of one layer.
//   1. decode_conv_xproj_kernel, grid (batch, CONV_BLOCKS), one thread per
//      channel: the conv step of conv_silu_kernel (same expression order)
//      with the conv state updated in place, xc written (storage dtype, as
//      the unfused path stores it), and this block's partial x_proj
//      products: part[b][blk][j] = sum over the block's channels e (lanes
//      strided, then a shuffle butterfly) of xc[e] * x_proj.weight[j][e].
//   2. decode_scan_kernel, grid (batch, SCAN_BLOCKS): every block sums the
//      CONV_BLOCKS partials of its sequence in block order (dbl = dt_low |
//      B | C, rounded to the storage dtype as the GEMM output is), computes
//      its channels' dt = dt_low . dt_proj.weight[e] (rounded likewise), and
//      runs one step of the scan_span<true> arithmetic: state in place,
//      g = (C.s + D x) silu(z).
// No atomics, fixed summation order: deterministic. The x_proj / dt_proj
// products are summed in a different order than cuBLAS's, so the fused
// step agrees with the unfused one (and with prefill) to rounding, not to
// the bit. NULL states: zeros in, nothing written (graph warm-up).
// reset [batch] (NULL: none): a sequence whose entry is nonzero reads zeros
// instead of its states (a new episode) and writes them as usual; the flag
// is read where the state is loaded, so a reset costs no launch.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(CONV_THREADS)
decode_conv_xproj_kernel(const act_t *__restrict__ xz, const float *__restrict__ cw,
                         const float *__restrict__ cb, float *state, const act_t *__restrict__ xw,
                         act_t *__restrict__ xc, float *__restrict__ part,
                         const unsigned char *__restrict__ reset)
{
    __shared__ float sx[CONV_THREADS];
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    const size_t b = blockIdx.x;
    const bool fresh = !state || (reset && reset[b]);   // zeros in
    float xv = 0.0f;
    if (e < E) {
        float w[K], win[K];
#pragma unroll
        for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
        const float bias = cb[e];
        const size_t st = (b * E + e) * (K - 1);
#pragma unroll
        for (int k = 0; k < K - 1; ++k) win[k] = fresh ? 0.0f : state[st + k];
        win[K - 1] = to_f32(xz[b * E2 + e]);
        float acc = bias;
#pragma unroll
        for (int k = 0; k < K; ++k) acc += w[k] * win[k];
        const act_t xs = from_f32<act_t>(silu(acc));
        xc[b * E + e] = xs;
        xv = to_f32(xs);
        if (state) {
#pragma unroll
            for (int k = 0; k < K - 1; ++k) state[st + k] = win[k + 1];
        }
    }
    sx[threadIdx.x] = xv;
    __syncthreads();
    const int warp = threadIdx.x >> 5, ln = threadIdx.x & 31;
    const int e0 = blockIdx.y * CONV_THREADS;
    const int ne = min(CONV_THREADS, E - e0);
    for (int j = warp; j < XP; j += CONV_THREADS / 32) {
        const act_t *wr = xw + (size_t)j * E + e0;
        float acc = 0.0f;
        for (int i = ln; i < ne; i += 32) acc += sx[i] * to_f32(wr[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
        if (ln == 0) part[(b * CONV_BLOCKS + blockIdx.y) * XP + j] = acc;
    }
}

__global__ void __launch_bounds__(SCAN_THREADS)
decode_scan_kernel(const float *__restrict__ part, const act_t *__restrict__ xc,
                   const act_t *__restrict__ xz, const act_t *__restrict__ dtw,
                   const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                   const float *__restrict__ Dskip, float *state, act_t *__restrict__ g,
                   const unsigned char *__restrict__ reset)
{
    __shared__ float sdbl[XP];
    const size_t b = blockIdx.x;
    const bool fresh = !state || (reset && reset[b]);   // zeros in
    for (int j = threadIdx.x; j < XP; j += SCAN_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < CONV_BLOCKS; ++p) acc += part[(b * CONV_BLOCKS + p) * XP + j];
        sdbl[j] = to_f32(from_f32<act_t>(acc));
    }
    __syncthreads();
    const int lane = threadIdx.x % SCAN_LANES;
    const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    float dtv = 0.0f;
    const act_t *wr = dtw + (size_t)ec * R;
#pragma unroll 8
    for (int r = 0; r < R; ++r) dtv += sdbl[r] * to_f32(wr[r]);
    dtv = to_f32(from_f32<act_t>(dtv));
    const float x = to_f32(xc[b * E + ec]);
    const float delta = softplus(dtv + dt_bias[ec]);
    const float dx = delta * x;
    const float dl = scan_l2e(delta);
    const float z = to_f32(xz[b * E2 + E + ec]);
    const size_t sb = (b * E + ec) * N + lane * SCAN_NPT;
    float y = 0.0f;
#pragma unroll
    for (int j = 0; j < SCAN_NPT; ++j) {
        const int n = lane * SCAN_NPT + j;
        const float A = -expf(A_log[(size_t)ec * N + n]);
        float s = fresh ? 0.0f : state[sb + j];
        s = scan_decay(dl, A) * s + dx * sdbl[R + n];
        y += s * sdbl[R + N + n];
        if (state && valid) state[sb + j] = s;
    }
#pragma unroll
    for (int o = SCAN_LANES / 2; o > 0; o >>= 1) y += __shfl_xor_sync(FULL_MASK, y, o);
    y += Dskip[ec] * x;
    if (valid && lane == 0) g[b * E + e] = from_f32<act_t>(y * silu(z));
}
#if MG_M1_DECODE_PERSISTENT

// ---------------------------------------------------------------------------
// decode_persistent_kernel: one decode step of the whole backbone in ONE
// launch (input_proj, every layer, norm_f). A thread-block cluster of
// DEC_CLUSTER blocks serves `spc` consecutive streams (1 <= spc <=
// DEC_SEQS, chosen per launch): grid = ceil(batch / spc) * DEC_CLUSTER,
// compiled for SEQS streams at most (its register arrays and shared memory;
// instances SEQS = 1 for spc = 1 and SEQS = DEC_SEQS, whose per-stream
// arithmetic is the same),
// cluster rank r = blockIdx.x % DEC_CLUSTER, streams b0 .. b0 + ns - 1 with
// b0 = (blockIdx.x / DEC_CLUSTER) * spc and ns = min(spc, batch - b0).
// Clusters are independent, so no grid-wide synchronisation. Block r owns
// the channels [r*DEC_EC, (r+1)*DEC_EC) of every layer: their in_proj rows
// (x and z), conv step and conv state, dt_proj rows, scan step and ssm
// state, gate. Why several streams per cluster: the block holds its GEMV
// weights in registers, so the streams of a cluster share one read of them
// (the step is bound by those loads' latency, not by the arithmetic), and a
// large batch runs as one wave of co-resident clusters instead of several.
// Every block keeps its own copy of each stream's residual stream h [D] in
// shared memory; the copies stay bit-identical because every block
// computes them with the same code from the same values. Per layer, for
// each of its streams:
//   1. RMSNorm of h (each block, redundantly), hn rounded to act_t;
//   2. in_proj rows of the block's channels (x | z, rounded);
//   3. conv step (conv state in place), xc rounded;
//   4. x_proj partial over the block's channels -> s_xpart [XP];
//      cluster.sync; dbl = sum of the DEC_CLUSTER partials in rank order,
//      read through distributed shared memory (rounded to act_t);
//   5. dt = dt_low . dt_proj[e] (rounded), softplus, scan step (ssm state in
//      place), g = (C.s + D x) silu(z) (rounded);
//   6. out_proj partial over the block's channels -> s_pout [D];
//      cluster.sync; h += sum of the partials in rank order.
// With DEC_PUSH, the 1-stream instance exchanges the partials of steps 4
// and 6 by push instead (dec_push_all below: st.async into every block's
// slots, an mbarrier per exchange; the same sums in the same order).
// The layer's new conv and ssm states are stored after the arrive of step
// 6's barrier (an arrive releases every earlier store: one just before it
// would hold the block until the store reached memory).
// 2 cluster barriers per layer (for all the cluster's streams at once) plus
// one before exit (no block may leave while another still reads its shared
// memory). The buffers a remote block reads (s_xpart, s_pout) are rewritten
// only after the next barrier that every reader reaches after its reads, so
// one buffer each suffices.
// Rounding to the storage dtype at the points where the unfused path stores
// activations (hn, xz, xc, dbl, dt, g); every sum is f32 in a fixed order
// (lane-strided, then shuffle butterflies, then ranks in order), the same
// for a stream whichever spc the launch used: no atomics, deterministic, and
// a stream's results do not depend on the streams it shares a cluster with.
// Every block first hints its whole step's reads into L2
// (dec_prefetch_step). The per-channel parameters of a layer and the
// states are loaded into registers, and the GEMV weights too when they fit
// the register budget (DecGemv::ONE_PASS), while the previous layer waits
// at its last cluster barrier (layer 0's: during the input projection):
// load_layer. NULL states: zeros in, nothing written (graph warm-up); reset
// [batch] (NULL: none) as in the fused kernels above.
// ---------------------------------------------------------------------------
namespace cg = cooperative_groups;

constexpr int DEC_WARPS = DEC_THREADS / 32;
constexpr int DEC_DPT = (D + DEC_THREADS - 1) / DEC_THREADS;   // residual values per thread (norms)
// Weight vectors a thread keeps in registers per GEMV pass (the register
// file per thread shrinks with the block size).
constexpr int DEC_PREFETCH_VECS = 8 * 256 / DEC_THREADS > 0 ? 8 * 256 / DEC_THREADS : 1;
// input_proj columns; a placeholder width when there is no input_proj (the
// code that uses it is then discarded, but must still be well-formed).
constexpr int DEC_IN_COLS = DEC_IN_DIM > 0 ? DEC_IN_DIM : DEC_IN_VW;

constexpr int dec_min(int a, int b) { return a < b ? a : b; }
constexpr int dec_max(int a, int b) { return a > b ? a : b; }
constexpr int dec_pow2ceil(int x) { return x <= 1 ? 1 : 2 * dec_pow2ceil((x + 1) / 2); }

// VW consecutive storage elements, aligned for one vector load.
template <int VW, typename T> struct alignas(VW * sizeof(T)) dvec { T v[VW]; };

// DecGemv: y[s][r] = W[r] . x[s] for rows r in [0, NR) of NC columns and the
// ns streams s, x[s] = x + s*XS in shared memory (f32). Row r is at b0 +
// r*LD for r < SPLIT, else b1 + (r-SPLIT)*LD (in_proj: the x rows, then the
// z rows of the block's channels). Groups of GL lanes (a power of two <= 32)
// share a row, each lane taking every GL-th vector of VW elements; rows are
// dealt to the DEC_THREADS/GL groups; each pass loads U rows per group
// (U*VPL vectors per thread in registers) before any product, so their
// latencies overlap, and uses them for every stream. Sum per lane in column
// order, then a shuffle butterfly over the group: fixed order, the same for
// every stream. Every thread of the block must call compute()/run()
// (shuffles; ns is the same in every thread).
template <int NR, int NC, int VW, int LD, int SPLIT, typename WT>
struct DecGemv {
    static constexpr int NV = NC / VW;
    static constexpr int GL = dec_min(32, dec_pow2ceil(NV));
    static constexpr int NG = DEC_THREADS / GL;
    static constexpr int VPL = (NV + GL - 1) / GL;
    static constexpr int RPG = (NR + NG - 1) / NG;
    static constexpr int U = dec_max(1, dec_min(RPG, DEC_PREFETCH_VECS / VPL));
    static constexpr int PASSES = (RPG + U - 1) / U;
    static constexpr bool ONE_PASS = PASSES == 1;
    static_assert(NC % VW == 0, "rows are whole vectors");
    const WT *b0, *b1;
    dvec<VW, WT> w[U][VPL];

    __device__ __forceinline__ DecGemv(const WT *r0, const WT *r1) : b0(r0), b1(r1) {}
    __device__ __forceinline__ const WT *row(int r) const
    {
        return r < SPLIT ? b0 + (size_t)r * LD : b1 + (size_t)(r - SPLIT) * LD;
    }
    __device__ __forceinline__ void load(int p)
    {
        const int grp = threadIdx.x / GL, gl = threadIdx.x % GL;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int r = grp + (p * U + u) * NG;
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                const int vi = gl + v * GL;
                if (r < NR && vi < NV) w[u][v] = *reinterpret_cast<const dvec<VW, WT> *>(row(r) + vi * VW);
            }
        }
    }
    // out(s, r, acc) for the pass's rows and every stream. SP streams at a
    // time (the last group may have fewer), the pass's U rows side by side:
    // their SP x U butterflies are independent, so their shuffles overlap
    // instead of each row's waiting for the previous row's (at batch 1 the
    // step is a chain of such latencies). Each (stream, row) sum is the same
    // as row by row: per lane in column order, then the butterfly.
    template <int XS, int SP, typename OutF>
    __device__ __forceinline__ void compute(int p, const float *x, int ns, OutF out)
    {
        const int grp = threadIdx.x / GL, gl = threadIdx.x % GL;
#pragma unroll 1
        for (int s0 = 0; s0 < ns; s0 += SP) {
            float acc[SP][U];
#pragma unroll
            for (int j = 0; j < SP; ++j) {
                const float *xs = x + (s0 + j) * XS;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int r = grp + (p * U + u) * NG;
                    acc[j][u] = 0.0f;
                    if (s0 + j >= ns) continue;
#pragma unroll
                    for (int v = 0; v < VPL; ++v) {
                        const int vi = gl + v * GL;
                        if (r < NR && vi < NV) {
#pragma unroll
                            for (int q = 0; q < VW; ++q) acc[j][u] += to_f32(w[u][v].v[q]) * xs[vi * VW + q];
                        }
                    }
                }
            }
#pragma unroll
            for (int o = GL / 2; o > 0; o >>= 1) {
#pragma unroll
                for (int j = 0; j < SP; ++j)
#pragma unroll
                    for (int u = 0; u < U; ++u) acc[j][u] += __shfl_xor_sync(FULL_MASK, acc[j][u], o);
            }
#pragma unroll
            for (int j = 0; j < SP; ++j) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int r = grp + (p * U + u) * NG;
                    if (gl == 0 && r < NR && s0 + j < ns) out(s0 + j, r, acc[j][u]);
                }
            }
        }
    }
    // Pass 0's weights ahead of time, when it is the only pass.
    __device__ __forceinline__ void prefetch()
    {
        if constexpr (ONE_PASS) load(0);
    }
    // Every pass (pass 0 from registers after prefetch(): prefetched = true).
    template <int XS, int SP = 1, typename OutF>
    __device__ __forceinline__ void run(const float *x, int ns, OutF out, bool prefetched)
    {
        const int first = (ONE_PASS && prefetched) ? 1 : 0;
        if (first == 1) compute<XS, SP>(0, x, ns, out);
#pragma unroll 1
        for (int p = first; p < PASSES; ++p) {
            load(p);
            compute<XS, SP>(p, x, ns, out);
        }
    }
};

__device__ __forceinline__ float round_act(float x) { return to_f32(from_f32<act_t>(x)); }

// Sums of v[s] over the block for the ns streams (every thread gets them):
// warp butterflies, then the warps in index order. s_red: [SEQS]
// [DEC_WARPS] floats; a __syncthreads before the next use of s_red is the
// caller's (the layers have several in between).
template <int SEQS>
__device__ __forceinline__ void dec_block_sums(float (&v)[SEQS], int ns, float (*s_red)[DEC_WARPS])
{
#pragma unroll
    for (int s = 0; s < SEQS; ++s) {
        if (s < ns) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v[s] += __shfl_xor_sync(FULL_MASK, v[s], o);
            if ((threadIdx.x & 31) == 0) s_red[s][threadIdx.x >> 5] = v[s];
        }
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < SEQS; ++s) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < DEC_WARPS; ++i) t += s < ns ? s_red[s][i] : 0.0f;
        v[s] = t;
    }
}

// L2 prefetch hints (the line walks of mg_m1_scan_body.cuh) of [p, p +
// bytes), its lines dealt over the block's threads, or (rows) of `rows`
// ranges of `bytes` at stride `ld` elements, a thread per row.
__device__ __forceinline__ void dec_pf_range(const void *p, size_t bytes)
{
    scan_prefetch_block(p, bytes, DEC_THREADS);
}
template <typename T>
__device__ __forceinline__ void dec_pf_rows(const T *p, int rows, size_t ld, size_t bytes)
{
    for (int r = threadIdx.x; r < rows; r += DEC_THREADS) scan_prefetch_range(p + (size_t)r * ld, bytes);
}

// Everything block `rank` of a cluster will read from global memory in the
// step's layers, hinted into L2 at the start of the step: its slices of the
// GEMV weights and of the per-channel parameters, and its streams' states.
// Why: each layer's loads wait on memory before its first product, and
// without the hints those waits come one layer after another; with them
// the whole step's lines are requested at once and the layers find them in
// L2 (where a step that follows another finds them anyway).
__device__ __forceinline__ void dec_prefetch_step(const float *w, const act_t *wg, const float *conv_state,
                                                  const float *ssm_state, int batch, int b0, int ns, int e0)
{
    constexpr size_t A = sizeof(act_t);
    for (int l = 0; l < N_LAYERS; ++l) {
        const float *lw = w + (size_t)l * DOFF_LAYER_STRIDE;
        const act_t *lg = wg + (size_t)l * DOFF_LAYER_STRIDE;
        dec_pf_range(lg + DL0_IN_PROJ_W + (size_t)e0 * D, (size_t)DEC_EC * D * A);
        dec_pf_range(lg + DL0_IN_PROJ_W + (size_t)(E + e0) * D, (size_t)DEC_EC * D * A);
        dec_pf_rows(lg + DL0_X_PROJ_W + e0, XP, E, (size_t)DEC_EC * A);
        dec_pf_rows(lg + DL0_OUT_PROJ_W + e0, D, E, (size_t)DEC_EC * A);
        dec_pf_range(lg + DL0_DT_PROJ_W + (size_t)e0 * R, (size_t)DEC_EC * R * A);
        dec_pf_range(lw + DL0_CONV_W + (size_t)e0 * K, (size_t)DEC_EC * K * 4);
        dec_pf_range(lw + DL0_A_LOG + (size_t)e0 * N, (size_t)DEC_EC * N * 4);
        dec_pf_range(lw + DL0_CONV_B + e0, (size_t)DEC_EC * 4);
        dec_pf_range(lw + DL0_DT_PROJ_B + e0, (size_t)DEC_EC * 4);
        dec_pf_range(lw + DL0_D + e0, (size_t)DEC_EC * 4);
        dec_pf_range(lw + DL0_NORM_W, (size_t)D * 4);
        for (int s = 0; s < ns; ++s) {
            const size_t b = (size_t)l * batch + b0 + s;
            if (conv_state) dec_pf_range(conv_state + (b * E + e0) * (K - 1), (size_t)DEC_EC * (K - 1) * 4);
            if (ssm_state) dec_pf_range(ssm_state + (b * E + e0) * N, (size_t)DEC_EC * N * 4);
        }
    }
    dec_pf_range(w + DOFF_NORM_F_W, (size_t)D * 4);
}

// RMSNorm scales rs[s] = 1 / sqrt(mean(h[s]^2) + eps) of the ns streams'
// residual rows h [SEQS][D] (shared memory), every thread getting them
// (dec_block_sums: its s_red rule applies).
template <int SEQS>
__device__ __forceinline__ void dec_rms_scales(const float (*h)[D], int ns, float (*s_red)[DEC_WARPS],
                                               float (&rs)[SEQS])
{
#pragma unroll
    for (int s = 0; s < SEQS; ++s) {
        rs[s] = 0.0f;
        if (s < ns)
            for (int j = threadIdx.x; j < D; j += DEC_THREADS) rs[s] += h[s][j] * h[s][j];
    }
    dec_block_sums(rs, ns, s_red);
#pragma unroll
    for (int s = 0; s < SEQS; ++s) rs[s] = 1.0f / sqrtf(rs[s] / (float)D + EPS);
}
// The same scale of one stream when the per-warp sums of h^2 are already in
// s_red[0] (the push path folds them into its h update: the same thread
// sums the same entries in the same order, then the same butterfly), after
// a __syncthreads: the warps' sums in index order, as dec_block_sums.
__device__ __forceinline__ float dec_rms_folded(const float (*s_red)[DEC_WARPS])
{
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < DEC_WARPS; ++i) t += s_red[0][i];
    return 1.0f / sqrtf(t / (float)D + EPS);
}

// Push exchange of the blocks' partial sums (DEC_PUSH, the 1-stream
// instance). Each block writes its partial vector into slot [its rank] of
// every block's receive buffer with st.async, whose completion counts the
// bytes on the receiving block's mbarrier; a block waits on its own
// mbarrier (one phase per layer) and sums the slots in rank order: the
// sums of the pull exchange, bit for bit. Why: the pull needs a cluster
// barrier (whose arrive also waits for every earlier store of the block to
// reach memory) and then a round trip to each remote block; a push is one
// trip, and nothing waits for unrelated stores. A slot is rewritten one
// layer later only after its reader has passed the exchange that follows
// its read (the receiver's next push is what the writer waits for), so one
// buffer per exchange suffices.
__device__ __forceinline__ uint32_t dec_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
// The address of the same shared variable in block `rank` of the cluster.
__device__ __forceinline__ uint32_t dec_remote(uint32_t a, int rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void dec_push(uint32_t remote_addr, float v, uint32_t remote_bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(remote_addr), "r"(__float_as_uint(v)), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ void dec_bar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(dec_smem_addr(bar)) : "memory");
}
// This block's one arrival of the phase, with the bytes the phase waits for.
__device__ __forceinline__ void dec_bar_expect(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(dec_smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// Until the phase of parity `parity` has completed (acquire at cluster
// scope: the pushed data is then visible).
__device__ __forceinline__ void dec_bar_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(dec_smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
// Every thread: the block's partial `part` [n] into slot `rank` of `slots`
// ([DEC_CLUSTER][n]) of every block of the cluster, counted on `bar`.
__device__ __forceinline__ void dec_push_all(const float *part, int n, float *slots, uint64_t *bar, int rank)
{
    const uint32_t s0 = dec_smem_addr(slots + (size_t)rank * n), b = dec_smem_addr(bar);
    for (int k = threadIdx.x; k < DEC_CLUSTER * n; k += DEC_THREADS) {
        const int q = k / n, i = k % n;
        dec_push(dec_remote(s0 + 4u * (uint32_t)i, q), part[i], dec_remote(b, q));
    }
}

// The sum of one entry over the cluster's DEC_CLUSTER partials, in rank
// order: part(q) reads block q's value (a push slot, or the block's own
// partial through distributed shared memory). Both exchanges, both forms.
template <class Part>
__device__ __forceinline__ float dec_rank_sum(Part part)
{
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < DEC_CLUSTER; ++q) acc += part(q);
    return acc;
}

template <int SEQS>
__global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS)
decode_persistent_kernel(int batch, int spc, const float *__restrict__ u, float *__restrict__ out,
                         const float *__restrict__ w, const act_t *__restrict__ wg,
                         float *conv_state, float *ssm_state, const unsigned char *__restrict__ reset)
{
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int b0 = (int)(blockIdx.x / DEC_CLUSTER) * spc;   // first stream of this cluster
    const int ns = min(spc, batch - b0);                     // its streams (>= 1)
    bool fresh[SEQS];                                    // a new episode: zero states in (reset mask)
#pragma unroll
    for (int s = 0; s < SEQS; ++s) fresh[s] = s < ns && reset && reset[b0 + s];
    const int e0 = rank * DEC_EC;                    // first channel of this block
    __shared__ __align__(16) float s_h[SEQS][D];           // residual stream (identical in every block)
    __shared__ __align__(16) float s_hn[SEQS][D];          // rmsnorm(h) * norm.weight, rounded
    __shared__ __align__(16) float s_pout[SEQS][D];        // this block's out_proj partial
    __shared__ __align__(16) float s_xz[SEQS][2 * DEC_EC]; // x | z of the block's channels, rounded
    __shared__ __align__(16) float s_xc[SEQS][DEC_EC];     // conv + SiLU, rounded
    __shared__ __align__(16) float s_g[SEQS][DEC_EC];      // gated scan output, rounded
    __shared__ __align__(16) float s_xpart[SEQS][XP];      // this block's x_proj partial
    __shared__ __align__(16) float s_dbl[SEQS][XP];        // dt_low | B | C, rounded
    __shared__ float s_red[SEQS][DEC_WARPS];
    // Push exchange (DEC_PUSH, 1-stream instance): receive slots and their
    // mbarriers ([0]: x_proj partials, [1]: out_proj partials).
    constexpr bool PUSH = DEC_PUSH && SEQS == 1;
    // Streams whose GEMV rows are reduced side by side (register budget).
    constexpr int DEC_SP = SEQS > 1 ? 2 : 1;
    __shared__ __align__(16) float s_xin[PUSH ? DEC_CLUSTER : 1][PUSH ? XP : 1];
    __shared__ __align__(16) float s_pin[PUSH ? DEC_CLUSTER : 1][PUSH ? D : 1];
    __shared__ __align__(8) uint64_t s_bar[2];
    const int tid = threadIdx.x;
    // conv / dt / scan phase: DEC_LANES threads per channel; threads past the
    // block's channels shadow its last channel (they join the shuffles) and
    // write nothing.
    const int lane = tid % DEC_LANES;
    const bool cvalid = tid / DEC_LANES < DEC_EC;
    const int cl = cvalid ? tid / DEC_LANES : DEC_EC - 1;
    const int e = e0 + cl;
    // input_proj's weights (when they fit the registers) requested first:
    // the step's first product waits on them.
    DecGemv<D, DEC_IN_COLS, DEC_IN_VW, DEC_IN_COLS, D, float> gi(w + DOFF_INPUT_PROJ_W, nullptr);
    if constexpr (DEC_IN_DIM > 0) gi.prefetch();
    dec_prefetch_step(w, wg, conv_state, ssm_state, batch, b0, ns, e0);
    if constexpr (PUSH) {
        // The mbarriers, initialised before any block may push into this
        // one: the cluster's arrive here, its wait before the first push.
        if (tid == 0) {
            dec_bar_init(&s_bar[0]);
            dec_bar_init(&s_bar[1]);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        cluster.barrier_arrive();
    }

    // ---- L: a layer's parameters and states in registers ----
    // load_layer(l) issues every load of layer l that does not depend on h:
    // its GEMV weights (when they fit the registers: DecGemv::ONE_PASS), the
    // channels' conv / dt / A / D parameters, the norm weight and the
    // streams' conv and ssm states (stream b0 + s at + s * the per-stream
    // size; zeros for a fresh stream). Layer 0's before the input projection
    // (after its own weights), layer l + 1's between the arrive and the wait
    // of layer l's last cluster barrier, so that their latency overlaps the
    // input projection and the wait for the other blocks.
    const auto conv_state_of = [&](int l) {
        return conv_state ? conv_state + ((size_t)l * batch + b0) * ((size_t)E * (K - 1)) : nullptr;
    };
    const auto ssm_state_of = [&](int l) {
        return ssm_state ? ssm_state + ((size_t)l * batch + b0) * ((size_t)E * N) : nullptr;
    };
    DecGemv<2 * DEC_EC, D, 4, D, DEC_EC, act_t> gin(nullptr, nullptr);
    DecGemv<XP, DEC_EC, DEC_VW, E, XP, act_t> gx(nullptr, nullptr);
    DecGemv<D, DEC_EC, DEC_VW, E, D, act_t> go(nullptr, nullptr);
    float cw[K], win[SEQS][K], sv[SEQS][DEC_NPT], alog[DEC_NPT], nwv[DEC_DPT];
    act_t dtw[DEC_RPL];
    float cb, dtb, dsk;
    const auto load_layer = [&](int l) {
        const float *lw = w + (size_t)l * DOFF_LAYER_STRIDE;
        const act_t *lg = wg + (size_t)l * DOFF_LAYER_STRIDE;
        const float *cs = conv_state_of(l), *ss = ssm_state_of(l);
        gin.b0 = lg + DL0_IN_PROJ_W + (size_t)e0 * D;
        gin.b1 = lg + DL0_IN_PROJ_W + (size_t)(E + e0) * D;
        gx.b0 = lg + DL0_X_PROJ_W + e0;
        go.b0 = lg + DL0_OUT_PROJ_W + e0;
        gin.prefetch();
        gx.prefetch();
        go.prefetch();
#pragma unroll
        for (int k = 0; k < K; ++k) cw[k] = lw[DL0_CONV_W + (size_t)e * K + k];
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            const bool load = cs && s < ns && !fresh[s];
#pragma unroll
            for (int k = 0; k < K - 1; ++k)
                win[s][k] = load ? cs[(size_t)s * E * (K - 1) + (size_t)e * (K - 1) + k] : 0.0f;
        }
        cb = lw[DL0_CONV_B + e];
        dtb = lw[DL0_DT_PROJ_B + e];
        dsk = lw[DL0_D + e];
#pragma unroll
        for (int j = 0; j < DEC_NPT; ++j) alog[j] = lw[DL0_A_LOG + (size_t)e * N + lane * DEC_NPT + j];
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            const bool load = ss && s < ns && !fresh[s];
#pragma unroll
            for (int j = 0; j < DEC_NPT; ++j)
                sv[s][j] = load ? ss[(size_t)s * E * N + (size_t)e * N + lane * DEC_NPT + j] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < DEC_RPL; ++q) {
            const int r = lane + q * DEC_LANES;
            dtw[q] = r < R ? lg[DL0_DT_PROJ_W + (size_t)e * R + r] : from_f32<act_t>(0.0f);
        }
#pragma unroll
        for (int i = 0; i < DEC_DPT; ++i) {
            const int j = tid + i * DEC_THREADS;
            nwv[i] = j < D ? lw[DL0_NORM_W + j] : 0.0f;
        }
    };
    load_layer(0);

    if constexpr (DEC_IN_DIM > 0) {
        // ---- I: h = u . input_proj.weight^T + input_proj.bias (f32, every block) ----
        __shared__ __align__(16) float s_u[SEQS][DEC_IN_COLS];
        for (int i = tid; i < ns * DEC_IN_DIM; i += DEC_THREADS)
            s_u[i / DEC_IN_COLS][i % DEC_IN_COLS] = u[(size_t)b0 * DEC_IN_DIM + i];   // DEC_IN_COLS == DEC_IN_DIM here
        __syncthreads();
        const float *bias = w + DOFF_INPUT_PROJ_B;
        gi.run<DEC_IN_COLS, DEC_SP>(&s_u[0][0], ns, [&](int s, int r, float acc) { s_h[s][r] = acc + bias[r]; }, true);
    } else {
        for (int i = tid; i < ns * D; i += DEC_THREADS) s_h[i / D][i % D] = u[(size_t)b0 * D + i];
    }
    __syncthreads();

    if constexpr (PUSH) cluster.barrier_wait();   // every block's mbarriers initialised

#pragma unroll 1
    for (int l = 0; l < N_LAYERS; ++l) {
        float *cs = conv_state_of(l), *ss = ssm_state_of(l);
        if (PUSH && tid == 0) {
            // This layer's phase of both exchanges: one arrival (this
            // block's) and the bytes of every block's partial.
            dec_bar_expect(&s_bar[0], 4u * DEC_CLUSTER * XP);
            dec_bar_expect(&s_bar[1], 4u * DEC_CLUSTER * D);
        }

        // ---- 1: hn = rmsnorm(h) * norm.weight ----
        {
            float rs[SEQS];
            if (PUSH && l > 0)
                rs[0] = dec_rms_folded(s_red);   // (summed in the previous layer's h update)
            else
                dec_rms_scales(s_h, ns, s_red, rs);
#pragma unroll
            for (int s = 0; s < SEQS; ++s) {
                if (s >= ns) continue;
#pragma unroll
                for (int i = 0; i < DEC_DPT; ++i) {
                    const int j = tid + i * DEC_THREADS;
                    if (j < D) s_hn[s][j] = round_act(s_h[s][j] * rs[s] * nwv[i]);
                }
            }
        }
        __syncthreads();
        // ---- 2: x | z of the block's channels ----
        gin.run<D, DEC_SP>(&s_hn[0][0], ns, [&](int s, int r, float acc) { s_xz[s][r] = round_act(acc); }, true);
        __syncthreads();
        // ---- 3: conv step (the new conv state is stored after step 6) ----
        float xv[SEQS];
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            xv[s] = 0.0f;
            if (s >= ns) continue;
            win[s][K - 1] = s_xz[s][cl];
            float cacc = cb;
#pragma unroll
            for (int k = 0; k < K; ++k) cacc += cw[k] * win[s][k];
            xv[s] = round_act(silu(cacc));
            if (cvalid && lane == 0) s_xc[s][cl] = xv[s];
        }
        __syncthreads();
        // ---- 4: x_proj: this block's partials, then the cluster's sums in rank order ----
        gx.run<DEC_EC, DEC_SP>(&s_xc[0][0], ns, [&](int s, int r, float acc) { s_xpart[s][r] = acc; }, true);
        if constexpr (PUSH) {
            __syncthreads();
            dec_push_all(&s_xpart[0][0], XP, &s_xin[0][0], &s_bar[0], rank);
            dec_bar_wait(&s_bar[0], (uint32_t)l & 1u);
            for (int i = tid; i < XP; i += DEC_THREADS)
                s_dbl[0][i] = round_act(dec_rank_sum([&](int q) { return s_xin[q][i]; }));
        } else {
            cluster.sync();
            for (int i = tid; i < ns * XP; i += DEC_THREADS)
                s_dbl[i / XP][i % XP] =
                    round_act(dec_rank_sum([&](int q) { return cluster.map_shared_rank(&s_xpart[0][0], q)[i]; }));
        }
        __syncthreads();
        // ---- 5: dt_proj + softplus, scan step (the new ssm state is stored after step 6), gate ----
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            if (s >= ns) continue;
            float dtv = 0.0f;
#pragma unroll
            for (int q = 0; q < DEC_RPL; ++q) {
                const int r = lane + q * DEC_LANES;
                if (r < R) dtv += s_dbl[s][r] * to_f32(dtw[q]);
            }
#pragma unroll
            for (int o = DEC_LANES / 2; o > 0; o >>= 1) dtv += __shfl_xor_sync(FULL_MASK, dtv, o);
            const float delta = softplus(round_act(dtv) + dtb);
            const float dx = delta * xv[s];
            const float dl = scan_l2e(delta);
            const float z = s_xz[s][DEC_EC + cl];
            float y = 0.0f;
#pragma unroll
            for (int j = 0; j < DEC_NPT; ++j) {
                const int n = lane * DEC_NPT + j;
                const float A = -expf(alog[j]);
                sv[s][j] = scan_decay(dl, A) * sv[s][j] + dx * s_dbl[s][R + n];
                y += sv[s][j] * s_dbl[s][R + N + n];
            }
#pragma unroll
            for (int o = DEC_LANES / 2; o > 0; o >>= 1) y += __shfl_xor_sync(FULL_MASK, y, o);
            y += dsk * xv[s];
            if (cvalid && lane == 0) s_g[s][cl] = round_act(y * silu(z));
        }
        __syncthreads();
        // ---- 6: out_proj: this block's partials, then h += the cluster's sums in rank order ----
        go.run<DEC_EC, DEC_SP>(&s_g[0][0], ns, [&](int s, int r, float acc) { s_pout[s][r] = acc; }, true);
        if constexpr (PUSH) {
            __syncthreads();
            dec_push_all(&s_pout[0][0], D, &s_pin[0][0], &s_bar[1], rank);
        } else {
            cluster.barrier_arrive();   // s_pout released to the cluster
        }
        // The layer's new conv and ssm states (computed in phases 3 and 5),
        // stored only now, after the arrive: an arrive releases every store
        // before it, so a state store issued just before the barriers of
        // phases 4 and 6 held the block there until it reached memory;
        // issued here, they complete while the next layer runs. Same values
        // as where computed. Then the next layer's loads (load_layer), and
        // only then the wait for the other blocks' partials.
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            if (s >= ns || !cvalid) continue;
            if (cs && lane == 0) {
#pragma unroll
                for (int k = 0; k < K - 1; ++k) cs[(size_t)s * E * (K - 1) + (size_t)e * (K - 1) + k] = win[s][k + 1];
            }
            if (ss) {
#pragma unroll
                for (int j = 0; j < DEC_NPT; ++j) ss[(size_t)s * E * N + (size_t)e * N + lane * DEC_NPT + j] = sv[s][j];
            }
        }
        if (l + 1 < N_LAYERS) load_layer(l + 1);
        if constexpr (PUSH) {
            dec_bar_wait(&s_bar[1], (uint32_t)l & 1u);
            // h += the partials, and this thread's sum of the new h^2 for the
            // next RMSNorm (dec_rms_scales' entries, order and butterfly; the
            // warps' sums in s_red, read after the barrier below).
            float sq = 0.0f;
            for (int i = tid; i < D; i += DEC_THREADS) {
                const float acc = dec_rank_sum([&](int q) { return s_pin[q][i]; });
                const float hv = s_h[0][i] + acc;
                s_h[0][i] = hv;
                sq += hv * hv;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(FULL_MASK, sq, o);
            if ((tid & 31) == 0) s_red[0][tid >> 5] = sq;
        } else {
            cluster.barrier_wait();
            for (int i = tid; i < ns * D; i += DEC_THREADS)
                s_h[i / D][i % D] += dec_rank_sum([&](int q) { return cluster.map_shared_rank(&s_pout[0][0], q)[i]; });
        }
        __syncthreads();
    }

    // ---- F: out = rmsnorm(h) * norm_f.weight (f32), written by rank 0 ----
    if (rank == 0) {
        float rs[SEQS];
        if constexpr (PUSH)
            rs[0] = dec_rms_folded(s_red);   // (summed in the last layer's h update)
        else
            dec_rms_scales(s_h, ns, s_red, rs);
        const float *nf = w + DOFF_NORM_F_W;
#pragma unroll
        for (int s = 0; s < SEQS; ++s) {
            if (s >= ns) continue;
            for (int j = tid; j < D; j += DEC_THREADS) out[(size_t)(b0 + s) * D + j] = s_h[s][j] * rs[s] * nf[j];
        }
    }
    cluster.sync();   // the other blocks may still be reading s_pout (or pushing)
}
#endif // MG_M1_DECODE_PERSISTENT
