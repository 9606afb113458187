// mg_m3_prep.cuh: the per-token maps of the Mamba-3 SISO mixer (dt, A*dt,
// lambda, BCNorm'd k and q), shared by the inference forward and the
// forward for training (one definition: the same bits in both).
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ---------------------------------------------------------------------------
// prep_kernel: the per-token maps of doc/math.md steps 1-5, one block of
// PREP_THREADS per token (grid = tokens), reading the in_proj output row
// proj[tok][NP]:
//   dt[tok][h]  = softplus(dd_dt[h] + dt_bias[h])
//   adt[tok][h] = A*dt,  A = -max(act(dd_A[h]), A_FLOOR)
//   lam[tok][h] = sigmoid(trap[h])
//   k[tok][h][n] = B_g[n]*rms(B_g)*B_norm_w[n] + B_bias[h][n]   (g = h / HPG)
//   q[tok][h][n] = C_g[n]*rms(C_g)*C_norm_w[n] + C_bias[h][n]
// (unrotated; angles_kernel rotates them in place). Warp w reduces the rms
// of groups w, w+PREP_WARPS, ... over N with a fixed shuffle butterfly;
// then consecutive threads write consecutive n (coalesced).
// ---------------------------------------------------------------------------
// The per-token maps shared with the fused chunked scan
// (mg_m3_chunked_fused.cuh): one definition, so the fused kernel sees the
// same bits as prep_kernel.
// A head's scalars dt, A*dt, lambda from its in_proj outputs dd_dt, dd_A,
// trap of one token and its dt_bias dtb.
__device__ __forceinline__ void head_scalars(float ddt, float dda, float trap, float dtb, float &d, float &adt,
                                             float &lam)
{
    d = softplus(ddt + dtb);
    const float act = a_act(dda);
    const float A = -(act >= A_FLOOR ? act : A_FLOOR);
    adt = A * d;
    lam = sigmoid(trap);
}
// dt alone, of a head from its raw in_proj entry x (head_scalars'
// expression): the angle walks that need only dt (angles_cs_kernel,
// seg_angle_kernel) take it from here.
__device__ __forceinline__ float row_dt_of(act_t x, float dtb) { return softplus(to_f32(x) + dtb); }
// tanh of an angle input x (raw in_proj entry, or an f32 copy of one): the
// angle walks, prep's tnh row for them, decode and the prep backward take
// it from here, so the walk that reads prep's tnh sees the bits its own
// tanhf would give.
template <typename T> __device__ __forceinline__ float ang_tanh_of(T x) { return tanhf(to_f32(x)); }
// ... of head h from the token's in_proj row pr.
__device__ __forceinline__ void row_head_scalars(const act_t *pr, int h, float dtb, float &d, float &adt, float &lam)
{
    head_scalars(to_f32(pr[OFF_DT + h]), to_f32(pr[OFF_A + h]), to_f32(pr[OFF_TRAP + h]), dtb, d, adt, lam);
}

// The BCNorm scale 1/rms of a B or C row from its sum of squares ss over
// N: bc_rms below and the prep backward (mg_m3_prep_bwd.cuh) take it from
// here, so the backward differentiates the scale the forward used.
__device__ __forceinline__ float bc_rms_scale(float ss) { return 1.0f / sqrtf(ss / (float)N + EPS); }

// 1/rms of a token's B and C rows of one group (brow, crow: N values, in
// device or shared memory; one warp, every lane gets the result: fixed
// lane-strided sums, then a shuffle butterfly).
__device__ __forceinline__ void bc_rms(const act_t *brow, const act_t *crow, int lane, float &rb, float &rc)
{
    float sb = 0.0f, sc = 0.0f;
#pragma unroll
    for (int i = 0; i < PREP_NPL; ++i) {
        const int n = lane + 32 * i;
        if (n < N) {
            const float b = to_f32(brow[n]);
            const float c = to_f32(crow[n]);
            sb += b * b;
            sc += c * c;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sb += __shfl_xor_sync(FULL_MASK, sb, o);
        sc += __shfl_xor_sync(FULL_MASK, sc, o);
    }
    rb = bc_rms_scale(sb);
    rc = bc_rms_scale(sc);
}

// A token's maps but k and q, by a block of PREP_THREADS: the BCNorm scales
// 1/rms of every group's B and C row into rB, rC [G] (shared; warp w takes
// groups w, w+PREP_WARPS, ...) and the head scalars dt, A*dt, lambda into
// row tok of dt, adt, lam. The caller syncs before reading rB, rC.
// prep_kernel and the training forward's prep_rot_kernel share it.
__device__ __forceinline__ void token_maps(const act_t *pr, size_t tok, const float *__restrict__ dt_bias,
                                           float *rB, float *rC, float *__restrict__ dt,
                                           float *__restrict__ adt, float *__restrict__ lam)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int g = warp; g < G; g += PREP_WARPS) {
        float rb, rc;
        bc_rms(pr + OFF_B + g * N, pr + OFF_C + g * N, lane, rb, rc);
        if (lane == 0) {
            rB[g] = rb;
            rC[g] = rc;
        }
    }
    for (int h = threadIdx.x; h < H; h += PREP_THREADS)
        row_head_scalars(pr, h, dt_bias[h], dt[tok * H + h], adt[tok * H + h], lam[tok * H + h]);
}

__global__ void __launch_bounds__(PREP_THREADS)
prep_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
            const float *__restrict__ Bnw, const float *__restrict__ Cnw,
            const float *__restrict__ Bbias, const float *__restrict__ Cbias,
            float *__restrict__ dt, float *__restrict__ adt, float *__restrict__ lam,
            float *__restrict__ k, float *__restrict__ q)
{
    __shared__ float rB[G], rC[G];
    const size_t tok = blockIdx.x;
    const act_t *pr = proj + tok * NP;
    token_maps(pr, tok, dt_bias, rB, rC, dt, adt, lam);
    __syncthreads();
    float *kt = k + tok * (size_t)(H * N), *qt = q + tok * (size_t)(H * N);
    for (int i = threadIdx.x; i < H * N; i += PREP_THREADS) {
        const int h = i / N, n = i % N, g = h / HPG;
        kt[i] = to_f32(pr[OFF_B + g * N + n]) * rB[g] * Bnw[n] + Bbias[i];
        qt[i] = to_f32(pr[OFF_C + g * N + n]) * rC[g] * Cnw[n] + Cbias[i];
    }
}
