// mg_m3_decode.cuh: the single-token decode step of the Mamba-3 SISO forward
// (seqlen 1, batch <= DEC_MAX_BATCH): per layer three kernels instead of
// rmsnorm, the cuBLAS in_proj, prep, angles, scan, gate and the cuBLAS
// out_proj, which at one token per sequence are launch- and latency-bound
// (prep and gate run one block per token; cuBLAS at M = 1..8 is far from
// the weights' bandwidth).
//   1. dec_in_proj_kernel<NB>: proj = rmsnorm(h) * norm_w . in_proj.weight^T
//   2. dec_mixer_kernel: prep + angles + one scan step + gate per (head, seq)
//   3. dec_out_proj_kernel<NB>: h = res + g . out_proj.weight^T (res = h)
// and after the last layer dec_norm_f_kernel (norm_f, the prefill's row).
// Written against NAME_common.cuh (dims, SCAN_*, GATE_VPL, PREP_NPL, NORM_*,
// DEC_*, act_t) and after mg_rms_row.cuh (the RMSNorm row helpers),
// mg_m3_angles.cuh (wrap_2pi) and mg_pdl.cuh; #included by
// NAME_kernels.cu inside its anonymous namespace: it includes nothing itself.
//
// Each kernel issues its L2 prefetch hints first, then waits for the kernel
// before it (pdl_wait, mg_pdl.cuh: with programmatic dependent launch the
// hints overlap that kernel's tail).
//
// Every sum has a fixed order (lanes, then a shuffle butterfly, then warps
// or K-parts in index order; no atomics): bit-identical from run to run, so
// a decode graph replays eager decode steps bit for bit. The mixer repeats
// the prefill kernels' expressions in their order (same BCNorm and gate
// butterflies, the same scan thread layout), and the in_proj GEMV the
// RMSNorm kernel's sum of squares, so decode and prefill differ only by the
// GEMVs' summation order against cuBLAS's.

// ---------------------------------------------------------------------------
// GEMV (batch NB rows, NB a power of two <= DEC_NB_MAX; rows past the call's
// batch are staged as zeros and not stored): out[b][j] = sum_k x[b][k] W[j][k]
// with W the storage-dtype GEMM weight [ROWS][K] (row-major, as mg_linear
// reads it). A block of DEC_THREADS owns RPB = (DEC_WARPS/KS)*RW rows: warp w
// owns rows slot*RW .. +RW (slot = w % (DEC_WARPS/KS)) of K-part
// kp = w / (DEC_WARPS/KS). Per pass the block stages KT columns of every
// input row in shared memory (storage dtype), then each lane loads VPL
// 16-byte vectors per row (vectors kp*32 + lane + i*32*KS of the pass), all
// issued before use, so RW*VPL loads per lane are in flight, and every weight
// byte is read once per call for all NB rows. Accumulation is f32 (fmaf per
// element in order), then a xor butterfly per (row, b), then the K-parts in
// order (dec_gemv_sum).
// ---------------------------------------------------------------------------

// The two storage elements of a 32-bit word as f32 (exact); the pointer only
// selects the dtype.
__device__ __forceinline__ void dec_pair(unsigned u, float &lo, float &hi, const __nv_bfloat16 *)
{
    lo = __uint_as_float(u << 16);
    hi = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void dec_pair(unsigned u, float &lo, float &hi, const __half *)
{
    lo = __half2float(__ushort_as_half((unsigned short)(u & 0xffffu)));
    hi = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}

// 16 bytes (DEC_VW storage elements of type T = act_t) -> f32. (A template
// so that the branch of the other dtypes is never instantiated.)
template <typename T = act_t>
__device__ __forceinline__ void dec_unpack(const uint4 &u, float (&f)[DEC_VW])
{
    const unsigned w[4] = { u.x, u.y, u.z, u.w };
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) dec_pair(w[i], f[2 * i], f[2 * i + 1], static_cast<const T *>(nullptr));
    }
}

// One pass: acc[r][b] += sum over this lane's vectors of the KT staged
// columns (k0 .. k0+KT) of W[row0 + r][.] * xs[b][.].
template <int NB, int K, int KT, int RW, int KS, int VPL>
__device__ __forceinline__ void dec_gemv_pass(const act_t *__restrict__ W, int rows, int row0, int k0,
                                              const act_t (*xs)[KT], float (&acc)[RW][NB], int kp, int lane)
{
    constexpr int TV = KT / DEC_VW;   // vectors per row and pass
    // Loads in flight per lane: RW*VPL, or half of them (two rounds) when
    // RW*NB accumulators would leave too few registers for them.
    constexpr int CH = (RW * NB > 16 && VPL % 2 == 0) ? VPL / 2 : VPL;
#pragma unroll
    for (int c = 0; c < VPL; c += CH) {
        uint4 wv[RW][CH];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const uint4 *wr = reinterpret_cast<const uint4 *>(W + (size_t)(row0 + r) * K + k0);
#pragma unroll
            for (int i = 0; i < CH; ++i) {
                const int v = kp * 32 + lane + (c + i) * 32 * KS;
                wv[r][i] = (v < TV && row0 + r < rows) ? __ldg(wr + v) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            const int v = kp * 32 + lane + (c + i) * 32 * KS;
            if (v < TV) {
                float wf[RW][DEC_VW];
#pragma unroll
                for (int r = 0; r < RW; ++r) dec_unpack(wv[r][i], wf[r]);
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    float xf[DEC_VW];
                    dec_unpack(*reinterpret_cast<const uint4 *>(&xs[b][v * DEC_VW]), xf);
#pragma unroll
                    for (int r = 0; r < RW; ++r) {
#pragma unroll
                        for (int e = 0; e < DEC_VW; ++e) acc[r][b] = fmaf(wf[r][e], xf[e], acc[r][b]);
                    }
                }
            }
        }
    }
}

// Requests this lane's weight vectors of the first pass from L2, before the
// block stages its inputs: the weights do not depend on them, so their DRAM
// latency overlaps the staging (and, for in_proj, the RMSNorm scales).
template <int K, int KT, int RW, int KS, int VPL>
__device__ __forceinline__ void dec_gemv_prefetch(const act_t *W, int rows, int row0, int kp, int lane)
{
    constexpr int TV = KT / DEC_VW;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int v = kp * 32 + lane + i * 32 * KS;
            if (v < TV && row0 + r < rows)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (size_t)(row0 + r) * K + (size_t)v * DEC_VW));
        }
    }
}

// The block's sums: each (row, b) over the warp's lanes (xor butterfly),
// then over the KS K-parts in order; part is the block's
// __shared__ float[KS][RPB][NB]. Returns with part[0][rr][b] holding the
// sum of row rr of the block (after a barrier).
template <int NB, int RW, int KS, int RPB>
__device__ __forceinline__ void dec_gemv_sum(float (&acc)[RW][NB], float (*part)[RPB][NB], int kp, int slot,
                                             int lane)
{
#pragma unroll
    for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            float s = acc[r][b];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
            if (lane == 0) part[kp][slot * RW + r][b] = s;
        }
    }
    __syncthreads();
    if constexpr (KS > 1) {
        for (int i = threadIdx.x; i < RPB * NB; i += DEC_THREADS) {
            const int rr = i / NB, b = i % NB;
            float s = part[0][rr][b];
#pragma unroll
            for (int q = 1; q < KS; ++q) s += part[q][rr][b];
            part[0][rr][b] = s;   // only this thread touches (rr, b)
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------
// dec_in_proj_kernel<NB>: proj[b][j] = sum_k hn[b][k] * W[j][k], j < NP,
// hn = (storage dtype) (h[b][k] * r_b * norm_w[k]) as the RMSNorm kernel
// writes it (the input norm fused: every block computes the NB scales r_b
// from h in L2 with the RMSNorm kernel's helpers, mg_rms_row.cuh: warp w of
// the block takes the part of RMSNorm warp vw = w, w + DEC_WARPS, .. of each
// row, lane l playing that warp's thread 32*vw + l, and rms_scale adds the
// parts in index order, so hn matches the unfused path's bits). Why not one
// warp per row: its NORM_WARPS rounds of loads and butterflies ran one after
// another while the block's other warps waited at the barrier (ncu, H100:
// barrier stalls were the in_proj GEMV's largest share at batch 1).
// grid DEC_IN_BLOCKS, block DEC_THREADS.
// ---------------------------------------------------------------------------
template <int NB>
__global__ void __launch_bounds__(DEC_THREADS)
dec_in_proj_kernel(int batch, const float *__restrict__ h, const float *__restrict__ nw,
                   const act_t *__restrict__ W, act_t *__restrict__ proj)
{
    __shared__ __align__(16) act_t xs[NB][DEC_IN_KT];
    __shared__ float part[DEC_IN_KS][DEC_IN_RPB][NB];
    __shared__ float rpart[NB][NORM_WARPS];   // the rows' sums of squares per RMSNorm warp
    __shared__ float rs[NB];
    constexpr int SLOTS = DEC_WARPS / DEC_IN_KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp % SLOTS, kp = warp / SLOTS;
    const int row0 = blockIdx.x * DEC_IN_RPB + slot * DEC_IN_RW;
    dec_gemv_prefetch<D, DEC_IN_KT, DEC_IN_RW, DEC_IN_KS, DEC_IN_VPL>(W, NP, row0, kp, lane);
    pdl_wait();      // h is the previous kernel's output
    pdl_release();
    for (int i = warp; i < batch * NORM_WARPS; i += DEC_WARPS) {
        const int b = i / NORM_WARPS, vw = i % NORM_WARPS;
        float4 v[NORM_ITERS];
        const float ss = rms_warp_sumsq(reinterpret_cast<const float4 *>(h + (size_t)b * D), vw * 32 + lane, v);
        if (lane == 0) rpart[b][vw] = ss;
    }
    __syncthreads();
    if (threadIdx.x < batch) rs[threadIdx.x] = rms_scale(rpart[threadIdx.x]);
    float acc[DEC_IN_RW][NB];
#pragma unroll
    for (int r = 0; r < DEC_IN_RW; ++r) {
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
    }
    constexpr int C4 = DEC_IN_KT / 4;   // float4s of h per row and pass
    for (int k0 = 0; k0 < D; k0 += DEC_IN_KT) {
        __syncthreads();   // rs written / the previous pass is done reading xs
        for (int i = threadIdx.x; i < NB * C4; i += DEC_THREADS) {
            const int b = i / C4, c = i % C4;
            float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (b < batch) {
                const float4 v = reinterpret_cast<const float4 *>(h + (size_t)b * D + k0)[c];
                const float4 g = reinterpret_cast<const float4 *>(nw + k0)[c];
                const float r = rs[b];
                y = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
            }
            store4(&xs[b][4 * c], y);
        }
        __syncthreads();
        dec_gemv_pass<NB, D, DEC_IN_KT, DEC_IN_RW, DEC_IN_KS, DEC_IN_VPL>(W, NP, row0, k0, xs, acc, kp, lane);
    }
    dec_gemv_sum<NB, DEC_IN_RW, DEC_IN_KS, DEC_IN_RPB>(acc, part, kp, slot, lane);
    for (int i = threadIdx.x; i < DEC_IN_RPB * NB; i += DEC_THREADS) {
        const int rr = i / NB, b = i % NB, j = blockIdx.x * DEC_IN_RPB + rr;
        if (b < batch && j < NP) proj[(size_t)b * NP + j] = from_f32<act_t>(part[0][rr][b]);
    }
}

// ---------------------------------------------------------------------------
// dec_out_proj_kernel<NB>: h[b][i] = res[b][i] + sum_k g[b][k] * W[i][k],
// i < D (f32 accumulate, f32 residual; each (b, i) read and written by one
// thread, so res may alias h: res is h, or the model input u at layer 0
// without an input projection, which saves the copy h = u).
// grid DEC_OUT_BLOCKS, block DEC_THREADS.
// ---------------------------------------------------------------------------
template <int NB>
__global__ void __launch_bounds__(DEC_THREADS)
dec_out_proj_kernel(int batch, const act_t *__restrict__ g, const act_t *__restrict__ W, const float *res, float *h)
{
    __shared__ __align__(16) act_t xs[NB][DEC_OUT_KT];
    __shared__ float part[DEC_OUT_KS][DEC_OUT_RPB][NB];
    constexpr int SLOTS = DEC_WARPS / DEC_OUT_KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp % SLOTS, kp = warp / SLOTS;
    const int row0 = blockIdx.x * DEC_OUT_RPB + slot * DEC_OUT_RW;
    dec_gemv_prefetch<E, DEC_OUT_KT, DEC_OUT_RW, DEC_OUT_KS, DEC_OUT_VPL>(W, D, row0, kp, lane);
    pdl_wait();      // g is the mixer's output
    pdl_release();
    float acc[DEC_OUT_RW][NB];
#pragma unroll
    for (int r = 0; r < DEC_OUT_RW; ++r) {
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
    }
    constexpr int CV = DEC_OUT_KT / DEC_VW;   // 16-byte vectors of g per row and pass
    for (int k0 = 0; k0 < E; k0 += DEC_OUT_KT) {
        if (k0 > 0) __syncthreads();   // the previous pass is done reading xs
        for (int i = threadIdx.x; i < NB * CV; i += DEC_THREADS) {
            const int b = i / CV, c = i % CV;
            reinterpret_cast<uint4 *>(&xs[b][0])[c] =
                b < batch ? reinterpret_cast<const uint4 *>(g + (size_t)b * E + k0)[c] : make_uint4(0u, 0u, 0u, 0u);
        }
        __syncthreads();
        dec_gemv_pass<NB, E, DEC_OUT_KT, DEC_OUT_RW, DEC_OUT_KS, DEC_OUT_VPL>(W, D, row0, k0, xs, acc, kp, lane);
    }
    dec_gemv_sum<NB, DEC_OUT_RW, DEC_OUT_KS, DEC_OUT_RPB>(acc, part, kp, slot, lane);
    for (int i = threadIdx.x; i < DEC_OUT_RPB * NB; i += DEC_THREADS) {
        const int rr = i / NB, b = i % NB, j = blockIdx.x * DEC_OUT_RPB + rr;
        if (b < batch && j < D) h[(size_t)b * D + j] = res[(size_t)b * D + j] + part[0][rr][b];
    }
}

// ---------------------------------------------------------------------------
// dec_norm_f_kernel: out[b] = rmsnorm(h[b]) * norm_f.weight (f32), b < batch:
// rmsnorm_kernel<float> (mg_norm.cuh: the same row helpers, so the same bits
// as prefill's norm_f) behind pdl_wait, so that the decode step's last
// kernel is launched as part of the chain and its launch overlaps the last
// out_proj GEMV. grid ceil(batch / NORM_ROWS), block (NORM_THREADS, NORM_ROWS).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(NORM_THREADS * NORM_ROWS)
dec_norm_f_kernel(int batch, const float *__restrict__ h, const float *__restrict__ w, float *__restrict__ y)
{
    pdl_wait();      // h is the last out_proj GEMV's output
    pdl_release();
    const size_t row = (size_t)blockIdx.x * NORM_ROWS + threadIdx.y;
    if (row >= (size_t)batch) return;   // the last block's spare rows (NORM_ROWS > 1: no barrier below)
    __shared__ float part[NORM_WARPS];
    float4 v[NORM_ITERS];
    const float r = rms_load(reinterpret_cast<const float4 *>(h + row * D), v, part);
    rms_store(y, row, w, v, r);
}

// ---------------------------------------------------------------------------
// dec_mixer_kernel: one token of sequence b, head h per block (grid
// (H, batch), DEC_MIX_THREADS threads; the mixer is per head apart from the
// group's BCNorm scale, which each head's block recomputes: N values).
// From proj[b][NP] (in_proj output) it does, in the order and with the
// expressions of the prefill kernels:
//   prep_kernel (mg_m3_prep.cuh): dt, A*dt, lambda; k, q = BCNorm + bias
//     (the group's rms over N by warp 0 with prep_kernel's butterfly);
//   angles_kernel (mg_m3_angles.cuh) at one step: theta = wrap(wrap(theta0)
//     + pi tanh(x) dt) in f64, (cos, sin) rounded to f32, k and q rotated;
//   scan_kernel (mg_m3_scan.cuh) at one step, with its thread layout (thread
//     (rowgroup, lane) owns rows p = rg + j*SCAN_ROWGROUPS, entries
//     n = lane + i*SCAN_LANES): Hs = alpha Hs + beta vp kp + gamma v k',
//     y = Hs q' + D v (butterfly over the row's lanes), kp <- k', vp <- v;
//   gate_kernel (mg_m3_gate.cuh): g = y * [rms(y) * norm_w] * silu(z),
//     warp 0 holding the head's P values as gate_head_load does.
// States are updated in place (ssm, kp, vp, angle: NULL = zeros in, not
// written); each entry is read and written by the same thread. reset
// [batch] (NULL: none): a sequence whose entry is nonzero reads zeros
// instead of its states (a new episode) and writes them as usual; the flag
// is read where the states are loaded, so a reset costs no launch.
// Loads come first, in two rounds: before pdl_wait the states, the reset
// flag and the weights; after it the whole in_proj row the block reads
// (B, C, x, z, the head's scalars, the angle input). The angle threads
// (a warp of their own where the block has room) then take their f64 angle
// step before the first barrier, beside warp 0's BCNorm sums, and rotate
// k and q after prep. The arithmetic is that of the prefill kernels.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(DEC_MIX_THREADS)
dec_mixer_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                 const float *__restrict__ Bnw, const float *__restrict__ Cnw,
                 const float *__restrict__ Bbias, const float *__restrict__ Cbias,
                 const float *__restrict__ Dskip, const float *__restrict__ ngw, float *ssm, float *kps,
                 float *vps, float *ang, act_t *__restrict__ g, const unsigned char *__restrict__ reset)
{
    __shared__ float sk[N], sq[N], sv[P], sy[P];
    __shared__ float sc[4];   // dt, A*dt, lambda, BCNorm scale of B
    __shared__ float rC;      // BCNorm scale of C
    static_assert(S <= DEC_MIX_THREADS && P <= DEC_MIX_THREADS, "a thread per angle and per row");
    // The angle threads a = tid - ANG0 < S: past warp 0 where the block has
    // room, so that their f64 angle step runs while warp 0 sums the BCNorm
    // squares and loads z (warp 0 is the block's longest path).
    constexpr int ANG0 = DEC_MIX_THREADS >= 32 + S ? 32 : 0;
    constexpr int NPM = (N + DEC_MIX_THREADS - 1) / DEC_MIX_THREADS;   // entries n per thread
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const size_t bh = b * H + h;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sl = tid % SCAN_LANES, rg = tid / SCAN_LANES;
    const bool scanner = tid < SCAN_THREADS;
    const int a = tid - ANG0;
    const bool angler = a >= 0 && a < S;
    const act_t *pr = proj + b * NP;
    const int grp = h / HPG;

    // Before pdl_wait, the loads that do not read this step's in_proj output:
    // the reset flag, the states (written by the previous decode step's
    // mixer, which has finished by the time this kernel starts: mg_pdl.cuh)
    // and the weights. With programmatic dependent launch their latency
    // overlaps the in_proj GEMV; every load is issued before any is used.
    const bool fresh = reset && reset[b];   // zero states in
    float hs[SCAN_RPT][SCAN_NPT], kp[SCAN_NPT], vp[SCAN_RPT];
    if (scanner) {
#pragma unroll
        for (int i = 0; i < SCAN_NPT; ++i) kp[i] = kps && !fresh ? kps[bh * N + sl + i * SCAN_LANES] : 0.0f;
#pragma unroll
        for (int j = 0; j < SCAN_RPT; ++j) {
            const int p = rg + j * SCAN_ROWGROUPS;
            vp[j] = vps && !fresh ? vps[bh * P + p] : 0.0f;
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) hs[j][i] = ssm && !fresh ? ssm[(bh * P + p) * N + sl + i * SCAN_LANES] : 0.0f;
        }
    }
    const double th0 = angler && ang && !fresh ? (double)ang[bh * S + a] : 0.0;
    float bw[NPM], bbi[NPM], cw[NPM], cbi[NPM];
#pragma unroll
    for (int j = 0; j < NPM; ++j) {
        const int n = tid + j * DEC_MIX_THREADS;
        if (n < N) {
            bw[j] = Bnw[n];
            bbi[j] = Bbias[h * N + n];
            cw[j] = Cnw[n];
            cbi[j] = Cbias[h * N + n];
        }
    }
    const float dsk = Dskip[h];
    pdl_wait();      // proj is the in_proj GEMV's output
    pdl_release();

    // This step's in_proj row, every read issued together: the group's
    // BCNorm scales (warp 0, prep_kernel's order), x, this thread's B and C
    // entries, the head's scalars and the angle input (the angle threads),
    // z (warp 0, for the gate).
    if (warp == 0) {
        float rb, rc;
        bc_rms(pr + OFF_B + grp * N, pr + OFF_C + grp * N, lane, rb, rc);
        if (lane == 0) {
            sc[3] = rb;
            rC = rc;
        }
    }
    if (tid < P) sv[tid] = to_f32(pr[OFF_X + h * P + tid]);
    float braw[NPM], craw[NPM];
#pragma unroll
    for (int j = 0; j < NPM; ++j) {
        const int n = tid + j * DEC_MIX_THREADS;
        if (n < N) {
            braw[j] = to_f32(pr[OFF_B + grp * N + n]);
            craw[j] = to_f32(pr[OFF_C + grp * N + n]);
        }
    }
    float zv[GATE_VPL];
    if (warp == 0) gate_head_vals(pr + OFF_Z, h, lane, zv);
    // angles, one step of the recurrence per angle a (before the barrier:
    // it needs only the head's dt): every angle thread computes the head's
    // scalars (the same values), angle 0 shares them with the scan
    float ca = 0.0f, sa = 0.0f, tha = 0.0f;
    if (angler) {
        float d, adt, lam;
        row_head_scalars(pr, h, dt_bias[h], d, adt, lam);
        if (a == 0) {
            sc[0] = d;
            sc[1] = adt;
            sc[2] = lam;
        }
        const float tin = ang_tanh_of(pr[OFF_ANG + a]);
        double th = wrap_2pi(th0 + 0.0);   // angles_kernel's slice start (prefix 0)
        th = wrap_2pi(th + angle_inc(tin, d));
        angle_cos_sin(th, ca, sa);
        tha = (float)th;
    }
    __syncthreads();
    // prep: k, q = BCNorm + bias
#pragma unroll
    for (int j = 0; j < NPM; ++j) {
        const int n = tid + j * DEC_MIX_THREADS;
        if (n < N) {
            sk[n] = braw[j] * sc[3] * bw[j] + bbi[j];
            sq[n] = craw[j] * rC * cw[j] + cbi[j];
        }
    }
    __syncthreads();

    // rotary of k and q by the angles above
    if (angler) {
        const float c = ca, s = sa;
        const float k0 = sk[2 * a], k1 = sk[2 * a + 1], q0 = sq[2 * a], q1 = sq[2 * a + 1];
        sk[2 * a] = c * k0 - s * k1;
        sk[2 * a + 1] = s * k0 + c * k1;
        sq[2 * a] = c * q0 - s * q1;
        sq[2 * a + 1] = s * q0 + c * q1;
        if (ang) ang[bh * S + a] = tha;
    }
    __syncthreads();

    // one scan step
    if (scanner) {
        const float d = sc[0], l = sc[2];
        const float al = expf(sc[1]);
        const float be = (1.0f - l) * d * al, ga = l * d;
        // k' and q' are read from shared memory where used (not copied to
        // registers as scan_kernel does): the same values, and room for
        // the state at P*N/threads = 64 entries per thread.
#pragma unroll
        for (int j = 0; j < SCAN_RPT; ++j) {
            const int p = rg + j * SCAN_ROWGROUPS;
            const float v = sv[p];
            const float bv = be * vp[j], gv = ga * v;
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) {
                hs[j][i] = al * hs[j][i] + bv * kp[i] + gv * sk[sl + i * SCAN_LANES];
                acc += hs[j][i] * sq[sl + i * SCAN_LANES];
            }
#pragma unroll
            for (int o = SCAN_LANES / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(SCAN_MASK, acc, o);
            if (sl == 0) sy[p] = acc + dsk * v;
            if (vps && sl == 0) vps[bh * P + p] = v;
            if (ssm) {
#pragma unroll
                for (int i = 0; i < SCAN_NPT; ++i) ssm[(bh * P + p) * N + sl + i * SCAN_LANES] = hs[j][i];
            }
        }
        if (kps && rg == 0) {
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) kps[bh * N + sl + i * SCAN_LANES] = sk[sl + i * SCAN_LANES];
        }
    }
    __syncthreads();

    // gate (warp 0): the head's P values, lane l holding p = l + 32*i
    if (warp == 0) {
        float yv[GATE_VPL];
        const float r = gate_head_load(sy, 0, lane, yv);   // sy is the head's row: h = 0
        gate_head_store(yv, zv, r, h, lane, ngw, g + b * E);
    }
}
