// scan_fwd.cuh: the selective scan of the Mamba-1 forward (NAME_kernels.cu):
// scan_span (the per-step recurrence every path shares), the sequential
// scan kernel, and the three kernels of the chunked scan (MG_M1_SCAN_CHUNKED).
// Written against the constants of NAME_common.cuh (E, E2, N, R, XP,
// SCAN_*, COMBINE_THREADS, act_t); #included by NAME_kernels.cu inside its
// anonymous namespace, so it includes nothing itself.

// ---------------------------------------------------------------------------
// scan_span: the selective scan of one channel over timesteps
// [t_begin, t_end) of sequence b, state s in registers (in/out). Shared by the
// sequential scan and both recurrence passes of the chunked scan, so every
// path computes the per-step recurrence with the same arithmetic:
//   delta = softplus(dt[b,t,e] + dt_bias[e])             (threshold 20)
//   s[n]  = exp(delta * A[e,n]) * s[n] + delta * B[b,t,n] * xc[b,t,e]
// OUT = true: also
//   y     = sum_n s[n] * C[b,t,n] + Dskip[e] * xc[b,t,e]
//   g[b,t,e] = y * silu(z[b,t,e])
// OUT = false: no output; dsum += delta (the chunk's sum of delta, from
// which the combine pass gets the chunk's decay prod_t exp(delta_t A) =
// exp(A * dsum)). B (and C when OUT) of SCAN_TCHUNK timesteps are staged in
// shared memory per pass, loaded coalesced by the whole block, so every
// thread of the block must call it with the same range.
// ---------------------------------------------------------------------------
template <bool OUT>
__device__ __forceinline__ void
scan_span(int t_begin, int t_end, size_t row0, int lane, int e, int ec, bool valid,
          float (&s)[SCAN_NPT], const float (&A)[SCAN_NPT], float dtb, float dsk, float &dsum,
          const act_t *__restrict__ xc, const act_t *__restrict__ dt,
          const act_t *__restrict__ dbl, const act_t *__restrict__ xz, act_t *__restrict__ g,
          float (*sBC)[2 * N])
{
    constexpr int W = OUT ? 2 * N : N;   // staged columns per timestep: B | C, or B
    for (int t0 = t_begin; t0 < t_end; t0 += SCAN_TCHUNK) {
        const int nt = min(SCAN_TCHUNK, t_end - t0);
        __syncthreads();   // the previous pass is done reading sBC
        for (int i = threadIdx.x; i < nt * W; i += SCAN_THREADS) {
            const int tt = i / W, k = i % W;
            sBC[tt][k] = to_f32(dbl[(row0 + t0 + tt) * XP + R + k]);
        }
        __syncthreads();
        for (int tt = 0; tt < nt; ++tt) {
            const size_t row = row0 + t0 + tt;
            const float x = to_f32(xc[row * E + ec]);
            const float delta = softplus(to_f32(dt[row * E + ec]) + dtb);
            const float dx = delta * x;
            if (OUT) {
                const float z = to_f32(xz[row * E2 + E + ec]);
                float y = 0.0f;
#pragma unroll
                for (int j = 0; j < SCAN_NPT; ++j) {
                    const int n = lane * SCAN_NPT + j;
                    s[j] = expf(delta * A[j]) * s[j] + dx * sBC[tt][n];
                    y += s[j] * sBC[tt][N + n];
                }
#pragma unroll
                for (int o = SCAN_LANES / 2; o > 0; o >>= 1) y += __shfl_xor_sync(FULL_MASK, y, o);
                y += dsk * x;
                if (valid && lane == 0) g[row * E + e] = from_f32<act_t>(y * silu(z));
            } else {
#pragma unroll
                for (int j = 0; j < SCAN_NPT; ++j) {
                    const int n = lane * SCAN_NPT + j;
                    s[j] = expf(delta * A[j]) * s[j] + dx * sBC[tt][n];
                }
                dsum += delta;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// scan_kernel: the sequential selective scan with the D skip and the SiLU(z)
// gate (scan_span<true> over the whole sequence). dt is the dt_proj output
// [tokens][E]; B and C are columns R..R+2N of the x_proj output dbl
// [tokens][XP]; z is columns E..2E of xz [tokens][2E]; A = -exp(A_log) is
// computed once per channel.
// Grid (batch, SCAN_BLOCKS); block SCAN_THREADS = SCAN_CHANNELS
// channels x SCAN_LANES lanes. A channel's N states live in registers, split
// over its SCAN_LANES lanes (SCAN_NPT states each, adjacent lanes in one
// warp); y is summed by a fixed xor-shuffle butterfly over those lanes, so
// every lane holds the same bits and lane 0 stores g. Channels past E (a
// partial last block) compute on channel E-1 so that every lane takes part
// in the shuffles, and store nothing. The final state is written to
// state_out (may alias state_in; NULL: not written).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(SCAN_THREADS)
scan_kernel(int seqlen, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
            const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
            const float *__restrict__ dt_bias, const float *__restrict__ A_log,
            const float *__restrict__ Dskip, const float *state_in, float *state_out,
            act_t *__restrict__ g)
{
    __shared__ float sBC[SCAN_TCHUNK][2 * N];   // [t][B(N) | C(N)]
    const int lane = threadIdx.x % SCAN_LANES;
    const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const size_t row0 = b * (size_t)seqlen;

    float A[SCAN_NPT], s[SCAN_NPT];
    const size_t sb = (b * E + ec) * N + lane * SCAN_NPT;
#pragma unroll
    for (int j = 0; j < SCAN_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * SCAN_NPT + j]);
        s[j] = state_in ? state_in[sb + j] : 0.0f;
    }
    float dsum = 0.0f;
    scan_span<true>(0, seqlen, row0, lane, e, ec, valid, s, A, dt_bias[ec], Dskip[ec], dsum,
                    xc, dt, dbl, xz, g, sBC);
    if (state_out && valid) {
#pragma unroll
        for (int j = 0; j < SCAN_NPT; ++j) state_out[sb + j] = s[j];
    }
}
#if MG_M1_SCAN_CHUNKED

// ---------------------------------------------------------------------------
// The chunked scan. The sequence is cut into nc = ceil(seqlen / SCAN_CHUNK)
// chunks (the last one may be shorter). Per channel and state n, step t maps
// s -> a_t s + b_t with a_t = exp(delta_t A), b_t = delta_t B_t[n] xc_t; a
// chunk composes to the pair (a_c, b_c) = (prod a_t, its local end state from
// zero), and pairs combine with (a1,b1)o(a0,b0) = (a1 a0, a1 b0 + b1)
// (math.md). Three launches on the stream:
//   1. chunk_state_kernel, grid (batch, SCAN_BLOCKS, nc-1): chunks 0..nc-2
//      from a zero state -> b_c into cstate slot c+1, sum of delta into dsum
//      (a_c = exp(A * dsum), recomputed by the combine). The last chunk's
//      pair is not needed (the output pass carries it to the final state).
//   2. chunk_combine_kernel, one thread per (b, e, n): in fixed order
//      c = 0..nc-2, s_in(c+1) = a_c s_in(c) + b_c from s_in(0) = state_in
//      (or 0); writes every chunk's incoming state over cstate slot c.
//   3. chunk_output_kernel, grid (batch, SCAN_BLOCKS, nc): each chunk
//      re-runs its recurrence from its true incoming state, writing g; the
//      last chunk writes the final state.
// Workspace: cstate [batch][nc][E][N], dsum [batch][nc][E], f32 (the
// model's, sized for MAX_BATCH x SCAN_MAX_CHUNKS). state_in is read only by
// the combine and state_out written only by the output pass, so they may
// alias (in-place states) without a race. No atomics, fixed order:
// deterministic. Same block shape and staging as scan_kernel.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(SCAN_THREADS)
chunk_state_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                   const act_t *__restrict__ dbl, const float *__restrict__ dt_bias,
                   const float *__restrict__ A_log, float *__restrict__ cstate,
                   float *__restrict__ dsum_out)
{
    __shared__ float sBC[SCAN_TCHUNK][2 * N];
    const int lane = threadIdx.x % SCAN_LANES;
    const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const int c = blockIdx.z;   // 0 .. nc-2: full chunks
    float A[SCAN_NPT], s[SCAN_NPT];
#pragma unroll
    for (int j = 0; j < SCAN_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * SCAN_NPT + j]);
        s[j] = 0.0f;
    }
    float dsum = 0.0f;
    scan_span<false>(c * SCAN_CHUNK, (c + 1) * SCAN_CHUNK, b * (size_t)seqlen, lane, e, ec, valid,
                     s, A, dt_bias[ec], 0.0f, dsum, xc, dt, dbl, nullptr, nullptr, sBC);
    if (valid) {
        float *cs = cstate + ((b * nc + c + 1) * E + e) * N + lane * SCAN_NPT;
#pragma unroll
        for (int j = 0; j < SCAN_NPT; ++j) cs[j] = s[j];
        if (lane == 0) dsum_out[(b * nc + c) * E + e] = dsum;
    }
}

__global__ void __launch_bounds__(COMBINE_THREADS)
chunk_combine_kernel(int batch, int nc, const float *__restrict__ A_log, const float *state_in,
                     float *__restrict__ cstate, const float *__restrict__ dsum)
{
    const size_t i = (size_t)blockIdx.x * COMBINE_THREADS + threadIdx.x;
    if (i >= (size_t)batch * E * N) return;
    const size_t b = i / ((size_t)E * N), en = i % ((size_t)E * N), e = en / N;
    const float A = -expf(A_log[en]);
    float s = state_in ? state_in[i] : 0.0f;
    float *cs = cstate + b * nc * (size_t)E * N + en;
    const float *ds = dsum + b * nc * (size_t)E + e;
    cs[0] = s;
    for (int c = 0; c + 1 < nc; ++c) {
        s = expf(A * ds[(size_t)c * E]) * s + cs[(size_t)(c + 1) * E * N];
        cs[(size_t)(c + 1) * E * N] = s;
    }
}

__global__ void __launch_bounds__(SCAN_THREADS)
chunk_output_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                    const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
                    const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                    const float *__restrict__ Dskip, const float *__restrict__ cstate,
                    float *state_out, act_t *__restrict__ g)
{
    __shared__ float sBC[SCAN_TCHUNK][2 * N];
    const int lane = threadIdx.x % SCAN_LANES;
    const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
    const bool valid = e < E;
    const int ec = valid ? e : E - 1;
    const size_t b = blockIdx.x;
    const int c = blockIdx.z;
    const int t_begin = c * SCAN_CHUNK;
    const int t_end = min(seqlen, t_begin + SCAN_CHUNK);
    float A[SCAN_NPT], s[SCAN_NPT];
    const float *cs = cstate + ((b * nc + c) * E + ec) * N + lane * SCAN_NPT;
#pragma unroll
    for (int j = 0; j < SCAN_NPT; ++j) {
        A[j] = -expf(A_log[(size_t)ec * N + lane * SCAN_NPT + j]);
        s[j] = cs[j];
    }
    float dsum = 0.0f;
    scan_span<true>(t_begin, t_end, b * (size_t)seqlen, lane, e, ec, valid, s, A, dt_bias[ec],
                    Dskip[ec], dsum, xc, dt, dbl, xz, g, sBC);
    if (state_out && valid && c == nc - 1) {
        float *so = state_out + (b * E + e) * N + lane * SCAN_NPT;
#pragma unroll
        for (int j = 0; j < SCAN_NPT; ++j) so[j] = s[j];
    }
}
#endif // MG_M1_SCAN_CHUNKED
