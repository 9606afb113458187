// mg_m3_scan.cuh: the sequential SSM scan of the Mamba-3 SISO inference
// forward (state in registers, one block per sequence and head).
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ---------------------------------------------------------------------------
// scan_kernel (sequential): doc/math.md steps 8-10 for one (sequence b, head h)
// per block (grid (H, batch)), t in order:
//   alpha = exp(adt), beta = (1-lam)*dt*alpha, gamma = lam*dt
//   Hs[p][n] = alpha*Hs[p][n] + beta*vp[p]*kp[n] + gamma*v[p]*k'[n]
//   y[p]     = sum_n Hs[p][n]*q'[n] + Dskip[h]*v[p]
//   kp <- k', vp <- v   (the previous token's rotated k and v)
// v is the head's slice of x (in_proj columns OFF_X + h*P ..). The state
// Hs[P][N] lives in registers: thread (rowgroup r, lane l) owns rows
// p = r + j*SCAN_ROWGROUPS (j < SCAN_RPT) and entries n = l + i*SCAN_LANES
// (i < SCAN_NPT). k', q', v and alpha/beta/gamma of SCAN_TCHUNK timesteps
// are staged in shared memory per pass, loaded coalesced by the whole block.
// y[p] is summed over the row's lanes by a fixed xor-shuffle butterfly;
// lane 0 stores it (f32). Each state is read by its owner at the start and
// written by its owner at the end (out may alias in; NULL in = zeros, NULL
// out = not written).
// ---------------------------------------------------------------------------
template <bool STARTS>
__global__ void __launch_bounds__(SCAN_THREADS)
scan_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ k,
            const float *__restrict__ q, const float *__restrict__ dt,
            const float *__restrict__ adt, const float *__restrict__ lam,
            const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
            const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
            float *__restrict__ y, const unsigned char *__restrict__ reset,
            const unsigned char *__restrict__ start)
{
    __shared__ float sk[SCAN_TCHUNK][N];
    __shared__ float sq[SCAN_TCHUNK][N];
    __shared__ float sv[SCAN_TCHUNK][P];
    __shared__ float sc[SCAN_TCHUNK][4];   // alpha, beta, gamma, (pad)
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int lane = threadIdx.x % SCAN_LANES, rg = threadIdx.x / SCAN_LANES;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;   // first token of the sequence
    if (reset && reset[b]) ssm_in = kp_in = vp_in = nullptr;   // a new sequence: zero states in
    if constexpr (STARTS) {
        if (seqlen > 0 && start[row0]) ssm_in = kp_in = vp_in = nullptr;   // an episode starts at t = 0
    }

    float hs[SCAN_RPT][SCAN_NPT], kp[SCAN_NPT], vp[SCAN_RPT];
#pragma unroll
    for (int i = 0; i < SCAN_NPT; ++i)
        kp[i] = kp_in ? kp_in[bh * N + lane + i * SCAN_LANES] : 0.0f;
#pragma unroll
    for (int j = 0; j < SCAN_RPT; ++j) {
        const int p = rg + j * SCAN_ROWGROUPS;
        vp[j] = vp_in ? vp_in[bh * P + p] : 0.0f;
#pragma unroll
        for (int i = 0; i < SCAN_NPT; ++i)
            hs[j][i] = ssm_in ? ssm_in[(bh * P + p) * N + lane + i * SCAN_LANES] : 0.0f;
    }
    const float dsk = Dskip[h];

    for (int t0 = 0; t0 < seqlen; t0 += SCAN_TCHUNK) {
        const int nt = min(SCAN_TCHUNK, seqlen - t0);
        __syncthreads();   // the previous pass is done reading the stage
        for (int i = threadIdx.x; i < nt * N; i += SCAN_THREADS) {
            const int tt = i / N, n = i % N;
            const size_t kq = ((row0 + t0 + tt) * H + h) * N + n;
            sk[tt][n] = k[kq];
            sq[tt][n] = q[kq];
        }
        for (int i = threadIdx.x; i < nt * P; i += SCAN_THREADS) {
            const int tt = i / P, p = i % P;
            sv[tt][p] = to_f32(proj[(row0 + t0 + tt) * NP + OFF_X + h * P + p]);
        }
        for (int tt = threadIdx.x; tt < nt; tt += SCAN_THREADS) {
            const size_t th = (row0 + t0 + tt) * H + h;
            const float d = dt[th], l = lam[th];
            const float al = expf(adt[th]);
            sc[tt][0] = al;
            sc[tt][1] = (1.0f - l) * d * al;
            sc[tt][2] = l * d;
            sc[tt][3] = 0.0f;
            if constexpr (STARTS) {
                if (start[row0 + t0 + tt]) sc[tt][0] = sc[tt][1] = 0.0f;   // zero state, k_prev, v_prev in
            }
        }
        __syncthreads();
        for (int tt = 0; tt < nt; ++tt) {
            const float al = sc[tt][0], be = sc[tt][1], ga = sc[tt][2];
            float kt[SCAN_NPT], qt[SCAN_NPT];
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) {
                kt[i] = sk[tt][lane + i * SCAN_LANES];
                qt[i] = sq[tt][lane + i * SCAN_LANES];
            }
#pragma unroll
            for (int j = 0; j < SCAN_RPT; ++j) {
                const int p = rg + j * SCAN_ROWGROUPS;
                const float v = sv[tt][p];
                const float bv = be * vp[j], gv = ga * v;
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < SCAN_NPT; ++i) {
                    hs[j][i] = al * hs[j][i] + bv * kp[i] + gv * kt[i];
                    acc += hs[j][i] * qt[i];
                }
#pragma unroll
                for (int o = SCAN_LANES / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(SCAN_MASK, acc, o);
                if (lane == 0) y[(row0 + t0 + tt) * E + h * P + p] = acc + dsk * v;
                vp[j] = v;
            }
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) kp[i] = kt[i];
        }
    }
    if (seqlen > 0) {
        __syncthreads();
        if (kp_out && rg == 0) {
#pragma unroll
            for (int i = 0; i < SCAN_NPT; ++i) kp_out[bh * N + lane + i * SCAN_LANES] = kp[i];
        }
#pragma unroll
        for (int j = 0; j < SCAN_RPT; ++j) {
            const int p = rg + j * SCAN_ROWGROUPS;
            if (vp_out && lane == 0) vp_out[bh * P + p] = vp[j];
            if (ssm_out) {
#pragma unroll
                for (int i = 0; i < SCAN_NPT; ++i)
                    ssm_out[(bh * P + p) * N + lane + i * SCAN_LANES] = hs[j][i];
            }
        }
    }
}
