// mg_m3_train_fwd.cuh: the Mamba-3 SISO forward for training, where it differs
// from inference: the sequential scan that saves a state checkpoint every
// CKPT_STRIDE steps. (The bias rows and the RMSNorm that saves 1/rms are
// mg_train_norm.cuh; prep, angles and the gate are the inference kernels:
// mg_m3_prep.cuh, mg_m3_angles.cuh, mg_m3_gate.cuh.)
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// The SSM forward for training (doc/math.md steps 8-10), one block per (head,
// sequence): the inference scan's recurrence and arithmetic, with the state
// saved at the start of every CKPT_STRIDE-step chunk into
// ckpt [b][h][nck][P][N] (nck = ceil(seqlen/CKPT_STRIDE); chunk 0 = the initial
// state). y [tok][E] f32. States: NULL in = zeros, NULL out = not written;
// out may alias in (each entry is read and written by its owner only).
// STARTS: start [batch][seqlen] as in scan_kernel (alpha = beta = 0 at a
// start token; no state in for a stream starting at t = 0).
template <bool STARTS>
__global__ void __launch_bounds__(BTHREADS)
scan_fwd_kernel(int seqlen, const act_t *__restrict__ proj, const kq_t *__restrict__ k,
                const kq_t *__restrict__ q, const float *__restrict__ dt,
                const float *__restrict__ adt, const float *__restrict__ lam,
                const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
                const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                float *__restrict__ ckpt, float *__restrict__ y, const unsigned char *__restrict__ start)
{
    __shared__ float sk[CKPT_STRIDE][N];
    __shared__ float sq[CKPT_STRIDE][N];
    __shared__ float sv[CKPT_STRIDE][P];
    __shared__ float sc[CKPT_STRIDE][4];   // alpha, beta, gamma, (pad)
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int lane = threadIdx.x % BL, rg = threadIdx.x / BL;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;
    const int nck = (seqlen + CKPT_STRIDE - 1) / CKPT_STRIDE;
    if constexpr (STARTS) {
        if (seqlen > 0 && start[row0]) ssm_in = kp_in = vp_in = nullptr;   // an episode starts at t = 0
    }

    float hs[BRPT][BNPT], kp[BNPT], vp[BRPT];
#pragma unroll
    for (int i = 0; i < BNPT; ++i)
        kp[i] = kp_in ? kp_in[bh * N + lane + i * BL] : 0.0f;
#pragma unroll
    for (int j = 0; j < BRPT; ++j) {
        const int p = rg + j * BRG;
        vp[j] = vp_in ? vp_in[bh * P + p] : 0.0f;
#pragma unroll
        for (int i = 0; i < BNPT; ++i)
            hs[j][i] = ssm_in ? ssm_in[(bh * P + p) * N + lane + i * BL] : 0.0f;
    }
    const float dsk = Dskip[h];

    for (int c = 0; c < nck; ++c) {
        const int t0 = c * CKPT_STRIDE;
        const int nt = min(CKPT_STRIDE, seqlen - t0);
        float *cp = ckpt + (bh * nck + c) * (size_t)(P * N);
#pragma unroll
        for (int j = 0; j < BRPT; ++j) {
            const int p = rg + j * BRG;
#pragma unroll
            for (int i = 0; i < BNPT; ++i) cp[p * N + lane + i * BL] = hs[j][i];
        }
        __syncthreads();   // the previous pass is done reading the stage
        for (int i = threadIdx.x; i < nt * N; i += BTHREADS) {
            const int tt = i / N, n = i % N;
            const size_t kq = ((row0 + t0 + tt) * H + h) * N + n;
            sk[tt][n] = to_f32(k[kq]);
            sq[tt][n] = to_f32(q[kq]);
        }
        for (int i = threadIdx.x; i < nt * P; i += BTHREADS) {
            const int tt = i / P, p = i % P;
            sv[tt][p] = to_f32(proj[(row0 + t0 + tt) * NP + OFF_X + h * P + p]);
        }
        for (int tt = threadIdx.x; tt < nt; tt += BTHREADS) {
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
            float kt[BNPT], qt[BNPT];
#pragma unroll
            for (int i = 0; i < BNPT; ++i) {
                kt[i] = sk[tt][lane + i * BL];
                qt[i] = sq[tt][lane + i * BL];
            }
#pragma unroll
            for (int j = 0; j < BRPT; ++j) {
                const int p = rg + j * BRG;
                const float v = sv[tt][p];
                const float bv = be * vp[j], gv = ga * v;
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < BNPT; ++i) {
                    hs[j][i] = al * hs[j][i] + bv * kp[i] + gv * kt[i];
                    acc += hs[j][i] * qt[i];
                }
#pragma unroll
                for (int o = BL / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(BMASK, acc, o);
                if (lane == 0) y[(row0 + t0 + tt) * E + h * P + p] = acc + dsk * v;
                vp[j] = v;
            }
#pragma unroll
            for (int i = 0; i < BNPT; ++i) kp[i] = kt[i];
        }
    }
    if (seqlen > 0) {
        __syncthreads();
        if (kp_out && rg == 0) {
#pragma unroll
            for (int i = 0; i < BNPT; ++i) kp_out[bh * N + lane + i * BL] = kp[i];
        }
#pragma unroll
        for (int j = 0; j < BRPT; ++j) {
            const int p = rg + j * BRG;
            if (vp_out && lane == 0) vp_out[bh * P + p] = vp[j];
            if (ssm_out) {
#pragma unroll
                for (int i = 0; i < BNPT; ++i) ssm_out[(bh * P + p) * N + lane + i * BL] = hs[j][i];
            }
        }
    }
}
