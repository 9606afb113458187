// mg_m3_scan.cuh: the sequential SSM scan of the Mamba-3 SISO inference
// forward (state in registers, one block per sequence and head).
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ---------------------------------------------------------------------------
// scan_walk: the sequential SSM scan of one (sequence b, head h) per block
// (grid (H, batch)), t in order (doc/math.md steps 8-10):
//   alpha = exp(adt), beta = (1-lam)*dt*alpha, gamma = lam*dt
//   Hs[p][n] = alpha*Hs[p][n] + beta*vp[p]*kp[n] + gamma*v[p]*k'[n]
//   y[p]     = sum_n Hs[p][n]*q'[n] + Dskip[h]*v[p]
//   kp <- k', vp <- v   (the previous token's rotated k and v)
// written once for the inference scan (scan_kernel below) and the training
// forward (scan_fwd_kernel, mg_m3_train_fwd.cuh), which differ only in their
// block shape, the dtype of k' and q', and the training's checkpoints. S is
// the shape: S::LANES threads share a row p of Hs, each owning S::NPT
// entries n = lane + i*S::LANES; a thread owns S::RPT rows p = rowgroup +
// j*S::ROWGROUPS; S::THREADS threads; S::TCHUNK timesteps of k', q', v and
// alpha/beta/gamma staged in shared memory per pass (the caller's arrays
// sk, sq, sv, sc), loaded coalesced by the whole block; S::MASK the
// shuffle mask. v is the head's slice of x (in_proj columns OFF_X + h*P
// ..). y[p] is summed over the row's lanes by a fixed xor-shuffle
// butterfly; lane 0 stores it (f32). Each state is read by its owner at the
// start and written by its owner at the end (out may alias in; NULL in =
// zeros, NULL out = not written). reset [batch] (NULL: none): a stream
// whose entry is nonzero starts from zeros. STARTS: start [batch][seqlen]
// (uint8): alpha = beta = 0 at a start token (zero state, k_prev, v_prev
// in), and no state in for a stream starting at t = 0. CKPT (training):
// the state at the start of every pass saved into ckpt [b][h][nck][P][N]
// (nck = ceil(seqlen / S::TCHUNK); pass 0's = the initial state).
// ---------------------------------------------------------------------------
template <int LANES_, int NPT_, int RPT_, int ROWGROUPS_, int THREADS_, int TCHUNK_, unsigned MASK_>
struct ScanShape {
    static constexpr int LANES = LANES_, NPT = NPT_, RPT = RPT_, ROWGROUPS = ROWGROUPS_;
    static constexpr int THREADS = THREADS_, TCHUNK = TCHUNK_;
    static constexpr unsigned MASK = MASK_;
};

template <class S, bool STARTS, bool CKPT, typename KQ>
__device__ __forceinline__ void
scan_walk(int seqlen, const act_t *__restrict__ proj, const KQ *__restrict__ k, const KQ *__restrict__ q,
          const float *__restrict__ dt, const float *__restrict__ adt, const float *__restrict__ lam,
          const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in, const float *vp_in,
          float *ssm_out, float *kp_out, float *vp_out, float *__restrict__ ckpt, float *__restrict__ y,
          const unsigned char *__restrict__ reset, const unsigned char *__restrict__ start,
          float (&sk)[S::TCHUNK][N], float (&sq)[S::TCHUNK][N], float (&sv)[S::TCHUNK][P],
          float (&sc)[S::TCHUNK][4])
{
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int lane = threadIdx.x % S::LANES, rg = threadIdx.x / S::LANES;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;   // first token of the sequence
    if (reset && reset[b]) ssm_in = kp_in = vp_in = nullptr;   // a new sequence: zero states in
    if constexpr (STARTS) {
        if (seqlen > 0 && start[row0]) ssm_in = kp_in = vp_in = nullptr;   // an episode starts at t = 0
    }

    float hs[S::RPT][S::NPT], kp[S::NPT], vp[S::RPT];
#pragma unroll
    for (int i = 0; i < S::NPT; ++i)
        kp[i] = kp_in ? kp_in[bh * N + lane + i * S::LANES] : 0.0f;
#pragma unroll
    for (int j = 0; j < S::RPT; ++j) {
        const int p = rg + j * S::ROWGROUPS;
        vp[j] = vp_in ? vp_in[bh * P + p] : 0.0f;
#pragma unroll
        for (int i = 0; i < S::NPT; ++i)
            hs[j][i] = ssm_in ? ssm_in[(bh * P + p) * N + lane + i * S::LANES] : 0.0f;
    }
    const float dsk = Dskip[h];
    const int nck = CKPT ? (seqlen + S::TCHUNK - 1) / S::TCHUNK : 0;

    for (int t0 = 0, c = 0; t0 < seqlen; t0 += S::TCHUNK, ++c) {
        const int nt = min(S::TCHUNK, seqlen - t0);
        if constexpr (CKPT) {
            float *cp = ckpt + (bh * nck + c) * (size_t)(P * N);
#pragma unroll
            for (int j = 0; j < S::RPT; ++j) {
                const int p = rg + j * S::ROWGROUPS;
#pragma unroll
                for (int i = 0; i < S::NPT; ++i) cp[p * N + lane + i * S::LANES] = hs[j][i];
            }
        }
        __syncthreads();   // the previous pass is done reading the stage
        for (int i = threadIdx.x; i < nt * N; i += S::THREADS) {
            const int tt = i / N, n = i % N;
            const size_t kq = ((row0 + t0 + tt) * H + h) * N + n;
            sk[tt][n] = to_f32(k[kq]);
            sq[tt][n] = to_f32(q[kq]);
        }
        for (int i = threadIdx.x; i < nt * P; i += S::THREADS) {
            const int tt = i / P, p = i % P;
            sv[tt][p] = to_f32(proj[(row0 + t0 + tt) * NP + OFF_X + h * P + p]);
        }
        for (int tt = threadIdx.x; tt < nt; tt += S::THREADS) {
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
            float kt[S::NPT], qt[S::NPT];
#pragma unroll
            for (int i = 0; i < S::NPT; ++i) {
                kt[i] = sk[tt][lane + i * S::LANES];
                qt[i] = sq[tt][lane + i * S::LANES];
            }
#pragma unroll
            for (int j = 0; j < S::RPT; ++j) {
                const int p = rg + j * S::ROWGROUPS;
                const float v = sv[tt][p];
                const float bv = be * vp[j], gv = ga * v;
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < S::NPT; ++i) {
                    hs[j][i] = al * hs[j][i] + bv * kp[i] + gv * kt[i];
                    acc += hs[j][i] * qt[i];
                }
#pragma unroll
                for (int o = S::LANES / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(S::MASK, acc, o);
                if (lane == 0) y[(row0 + t0 + tt) * E + h * P + p] = acc + dsk * v;
                vp[j] = v;
            }
#pragma unroll
            for (int i = 0; i < S::NPT; ++i) kp[i] = kt[i];
        }
    }
    if (seqlen > 0) {
        __syncthreads();
        if (kp_out && rg == 0) {
#pragma unroll
            for (int i = 0; i < S::NPT; ++i) kp_out[bh * N + lane + i * S::LANES] = kp[i];
        }
#pragma unroll
        for (int j = 0; j < S::RPT; ++j) {
            const int p = rg + j * S::ROWGROUPS;
            if (vp_out && lane == 0) vp_out[bh * P + p] = vp[j];
            if (ssm_out) {
#pragma unroll
                for (int i = 0; i < S::NPT; ++i)
                    ssm_out[(bh * P + p) * N + lane + i * S::LANES] = hs[j][i];
            }
        }
    }
}

// The inference scan (scan_walk in the inference block shape, SCAN_*):
// k', q' f32 [tok][H][N], y f32 [tok][E].
using InferScan = ScanShape<SCAN_LANES, SCAN_NPT, SCAN_RPT, SCAN_ROWGROUPS, SCAN_THREADS, SCAN_TCHUNK, SCAN_MASK>;
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
    scan_walk<InferScan, STARTS, false>(seqlen, proj, k, q, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in, ssm_out,
                                        kp_out, vp_out, nullptr, y, reset, start, sk, sq, sv, sc);
}
