// mg_m3_scan_bwd.cuh: the sequential SSM backward of Mamba-3 SISO (recompute
// each CKPT_STRIDE-step chunk from its checkpoint, then walk it in reverse).
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// SSM backward (see the header), one block per (head, sequence), the
// training forward scan's thread layout. Per chunk (last to first): stage
// k' and v of the chunk's steps and of the token before it (k_prev/v_prev
// for the first chunk), q', dy, alpha/beta/gamma/dt/lambda; recompute the
// chunk's states from its checkpoint into hsc[CKPT_STRIDE+1][BRPT][BNPT]; walk the
// chunk in reverse. Per step the column sums over p (dq'[n], G^T v, G^T v_prev)
// and the scalar sums (dal, dbe, dga) are reduced by xor butterflies over a
// warp's rowgroups, then over the warps in index order; the row sums
// G k', G k'_prev by butterflies over a row's lanes. Outputs for (b, h):
//   dk, dq [tok][H][N] (of the rotated k', q'), dv [tok][E],
//   dadt, ddt, dlam [tok][H], part_D[b][h] = sum_t dy . v,
//   dssm0, dkp0, dvp0 (optional): d L / d initial Hs, k_prev, v_prev.
// STARTS (start [batch][seqlen]; doc/math.md section 9): alpha = beta = 0 at
// a start token, as in the forward. That is the whole backward of a start:
// the recompute zeroes the state there, G * alpha drops the adjoint carried
// to the token before, beta * (...) drops the k_prev / v_prev terms owed
// to it, and d(A dt), the beta parts of d dt and d lambda vanish (alpha and
// beta multiply only zeros at that step). A stream whose first token is a
// start gets zero initial-state gradients the same way.
// The reverse walk's column sums over a warp's rowgroups: each thread's
// BCS_V values (cq, chk, chv: BNPT columns n = lane + i BL each) summed
// over the lanes that share its columns (offsets BWSH/2 down to BL), by the
// butterfly's tree but as a reduce-scatter (rs_halve_at, mg_warp_sums.cuh)
// for the first BCS_HALVE levels; any levels left are the butterfly on the
// BCS_VF values each lane then holds. Every sum adds the same pairs in the
// same order as the per-value butterfly (a + b and b + a are the same
// bits). Then the lanes whose remaining butterfly bits are 0 store their
// values into the warp's row of red, where lane 0 of each rowgroup 0 column
// stored all of them. Why: at mamba3_rl's shape (4 lanes a row, 8
// rowgroups a warp, 16 columns a lane) the butterfly took 144 shuffles and
// 144 adds a step, the reduce-scatter 42 of each (and 84 selects); the
// scan backward was about half of mamba3_rl's training step (H100,
// bench/results/h100-2026-12-07b-bench-3fd91ca.csv: 0.92 of 1.35 ms of a
// layer's SSM core forward + backward).
constexpr int BCS_V = 3 * BNPT;                          // values a thread
constexpr int BCS_LEVELS = ws_ilog2(BWSH / BL);          // levels of the column sums
// (at one level the reduce-scatter's selects cost what its shuffles save:
// the per-value butterfly there, BCS_HALVE 0)
constexpr int BCS_HALVE = BCS_LEVELS < 2 ? 0 : (BCS_LEVELS < ws_ctz(BCS_V) ? BCS_LEVELS : ws_ctz(BCS_V));
constexpr int BCS_VF = BCS_V >> BCS_HALVE;               // values a lane holds after them
// Value f of the thread's three arrays, in place (f a constant once the
// loops below are unrolled, so the arrays stay where the caller has them).
__device__ __forceinline__ float &bcs_at(float (&cq)[BNPT], float (&chk)[BNPT], float (&chv)[BNPT], int f)
{
    return f < BNPT ? cq[f] : (f < 2 * BNPT ? chk[f - BNPT] : chv[f - 2 * BNPT]);
}
__device__ __forceinline__ void bcs_reduce_store(float (&cq)[BNPT], float (&chk)[BNPT], float (&chv)[BNPT], int lane,
                                                 int wl, float *red_w)
{
    // value k of the three arrays holds value start + k
    const int start = rs_halve_at<BCS_HALVE, false, BCS_V>(
        [&](int f) -> float & { return bcs_at(cq, chk, chv, f); }, wl, BWSH / 2, BMASK);
#pragma unroll
    for (int l = BCS_HALVE; l < BCS_LEVELS; ++l) {
        const int o = (BWSH / 2) >> l;
#pragma unroll
        for (int k = 0; k < BCS_VF; ++k) {
            float &x = bcs_at(cq, chk, chv, k);
            x += __shfl_xor_sync(BMASK, x, o);
        }
    }
    // the butterfly levels' offsets ((BWSH/2) >> l for l >= BCS_HALVE, all >= BL)
    constexpr int BMASK_BITS = BCS_HALVE < BCS_LEVELS ? 2 * ((BWSH / 2) >> BCS_HALVE) - BL : 0;
    if ((wl & BMASK_BITS) == 0) {
#pragma unroll
        for (int k = 0; k < BCS_VF; ++k) {
            const int f = start + k, a = f / BNPT, i = f % BNPT;   // array (cq | chk | chv), entry
            red_w[a * N + lane + i * BL] = bcs_at(cq, chk, chv, k);
        }
    }
}

template <bool STARTS>
__global__ void __launch_bounds__(BTHREADS)
scan_bwd_kernel(int seqlen, const act_t *__restrict__ proj, const kq_t *__restrict__ k,
                const kq_t *__restrict__ q, const float *__restrict__ dt,
                const float *__restrict__ adt, const float *__restrict__ lam,
                const float *__restrict__ Dskip, const float *__restrict__ ckpt,
                const float *__restrict__ kp0, const float *__restrict__ vp0,
                const float *__restrict__ dy, float *__restrict__ dk, float *__restrict__ dq,
                float *__restrict__ dv, float *__restrict__ dadt_o, float *__restrict__ ddt_o,
                float *__restrict__ dlam_o, float *__restrict__ part_D, float *__restrict__ dssm0,
                float *__restrict__ dkp0, float *__restrict__ dvp0, const unsigned char *__restrict__ start)
{
    __shared__ float sk[CKPT_STRIDE + 1][N];   // [0]: k' of the token before the chunk
    __shared__ float sq[CKPT_STRIDE][N];
    __shared__ float sv[CKPT_STRIDE + 1][P];   // [0]: v of the token before the chunk
    __shared__ float sdy[CKPT_STRIDE][P];
    __shared__ float sc[CKPT_STRIDE][8];       // alpha, beta, gamma, dt, lambda, (pad)
    __shared__ float red[BWARPS][3 * N + 4];
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int lane = threadIdx.x % BL, rg = threadIdx.x / BL;
    const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;
    const size_t bh = b * H + h;
    const size_t row0 = b * (size_t)seqlen;
    const int nck = (seqlen + CKPT_STRIDE - 1) / CKPT_STRIDE;
    const float dsk = Dskip[h];

    float dhs[BRPT][BNPT];            // G = dL/dHs_t
    float hsc[CKPT_STRIDE + 1][BRPT][BNPT];   // the chunk's states: [0] = checkpoint
    float pend_v[BRPT], pend_k[BNW];  // be_t G^T... terms owed to token t-1
    float gD = 0.0f;
#pragma unroll
    for (int j = 0; j < BRPT; ++j) {
        pend_v[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < BNPT; ++i) dhs[j][i] = 0.0f;
    }
#pragma unroll
    for (int jn = 0; jn < BNW; ++jn) pend_k[jn] = 0.0f;

    for (int c = nck - 1; c >= 0; --c) {
        const int t0 = c * CKPT_STRIDE;
        const int nt = min(CKPT_STRIDE, seqlen - t0);
        __syncthreads();   // the previous chunk is done with the stage
        for (int i = threadIdx.x; i < (nt + 1) * N; i += BTHREADS) {
            const int tt = i / N, n = i % N;
            float kv;
            if (tt > 0 || t0 > 0) kv = to_f32(k[((row0 + t0 + tt - 1) * H + h) * N + n]);
            else kv = kp0 ? kp0[bh * N + n] : 0.0f;
            sk[tt][n] = kv;
        }
        for (int i = threadIdx.x; i < nt * N; i += BTHREADS) {
            const int tt = i / N, n = i % N;
            sq[tt][n] = to_f32(q[((row0 + t0 + tt) * H + h) * N + n]);
        }
        for (int i = threadIdx.x; i < (nt + 1) * P; i += BTHREADS) {
            const int tt = i / P, p = i % P;
            float vv;
            if (tt > 0 || t0 > 0) vv = to_f32(proj[(row0 + t0 + tt - 1) * NP + OFF_X + h * P + p]);
            else vv = vp0 ? vp0[bh * P + p] : 0.0f;
            sv[tt][p] = vv;
        }
        for (int i = threadIdx.x; i < nt * P; i += BTHREADS) {
            const int tt = i / P, p = i % P;
            sdy[tt][p] = dy[(row0 + t0 + tt) * E + h * P + p];
        }
        for (int tt = threadIdx.x; tt < nt; tt += BTHREADS) {
            const size_t th = (row0 + t0 + tt) * H + h;
            const float d = dt[th], l = lam[th];
            const float al = expf(adt[th]);
            sc[tt][0] = al;
            sc[tt][1] = (1.0f - l) * d * al;
            sc[tt][2] = l * d;
            sc[tt][3] = d;
            sc[tt][4] = l;
            sc[tt][5] = sc[tt][6] = sc[tt][7] = 0.0f;
            if constexpr (STARTS) {
                if (start[row0 + t0 + tt]) sc[tt][0] = sc[tt][1] = 0.0f;   // no state, k_prev, v_prev in
            }
        }
        __syncthreads();
        // Recompute the chunk's states from its checkpoint (forward arithmetic).
        const float *cp = ckpt + (bh * nck + c) * (size_t)(P * N);
#pragma unroll
        for (int j = 0; j < BRPT; ++j) {
            const int p = rg + j * BRG;
#pragma unroll
            for (int i = 0; i < BNPT; ++i) hsc[0][j][i] = cp[p * N + lane + i * BL];
        }
        for (int tt = 0; tt < nt; ++tt) {
            const float al = sc[tt][0], be = sc[tt][1], ga = sc[tt][2];
#pragma unroll
            for (int j = 0; j < BRPT; ++j) {
                const int p = rg + j * BRG;
                const float v = sv[tt + 1][p];
                const float bv = be * sv[tt][p], gv = ga * v;
#pragma unroll
                for (int i = 0; i < BNPT; ++i) {
                    const int n = lane + i * BL;
                    hsc[tt + 1][j][i] = al * hsc[tt][j][i] + bv * sk[tt][n] + gv * sk[tt + 1][n];
                }
            }
        }
        // Walk the chunk in reverse.
        for (int tt = nt - 1; tt >= 0; --tt) {
            const float al = sc[tt][0], be = sc[tt][1], ga = sc[tt][2];
            const size_t tok = row0 + t0 + tt;
            float qt[BNPT], kt[BNPT], kpv[BNPT], cq[BNPT], chk[BNPT], chv[BNPT];
#pragma unroll
            for (int i = 0; i < BNPT; ++i) {
                const int n = lane + i * BL;
                qt[i] = sq[tt][n];
                kt[i] = sk[tt + 1][n];
                kpv[i] = sk[tt][n];
                cq[i] = chk[i] = chv[i] = 0.0f;
            }
            float sal = 0.0f, sbe = 0.0f, sga = 0.0f;
#pragma unroll
            for (int j = 0; j < BRPT; ++j) {
                const int p = rg + j * BRG;
                const float dyp = sdy[tt][p], v = sv[tt + 1][p], vpv = sv[tt][p];
                float rk = 0.0f, rkp = 0.0f;
#pragma unroll
                for (int i = 0; i < BNPT; ++i) {
                    const float gg = dhs[j][i] + dyp * qt[i];
                    cq[i] += hsc[tt + 1][j][i] * dyp;
                    sal += gg * hsc[tt][j][i];
                    rk += gg * kt[i];
                    rkp += gg * kpv[i];
                    chk[i] += gg * v;
                    chv[i] += gg * vpv;
                    dhs[j][i] = gg * al;
                }
#pragma unroll
                for (int o = BL / 2; o > 0; o >>= 1) {
                    rk += __shfl_xor_sync(BMASK, rk, o);
                    rkp += __shfl_xor_sync(BMASK, rkp, o);
                }
                if (lane == 0) {
                    sga += v * rk;
                    sbe += vpv * rkp;
                    gD += dyp * v;
                    dv[tok * E + h * P + p] = dsk * dyp + ga * rk + pend_v[j];
                    pend_v[j] = be * rkp;
                }
            }
            // column sums over the warp's rowgroups, scalars over the warp
            if constexpr (BCS_HALVE > 0) {
                bcs_reduce_store(cq, chk, chv, lane, wl, red[warp]);
            } else {
#pragma unroll
                for (int o = BWSH / 2; o >= BL; o >>= 1) {
#pragma unroll
                    for (int i = 0; i < BNPT; ++i) {
                        cq[i] += __shfl_xor_sync(BMASK, cq[i], o);
                        chk[i] += __shfl_xor_sync(BMASK, chk[i], o);
                        chv[i] += __shfl_xor_sync(BMASK, chv[i], o);
                    }
                }
            }
#pragma unroll
            for (int o = BWSH / 2; o > 0; o >>= 1) {
                sal += __shfl_xor_sync(BMASK, sal, o);
                sbe += __shfl_xor_sync(BMASK, sbe, o);
                sga += __shfl_xor_sync(BMASK, sga, o);
            }
            if (BCS_HALVE == 0 && wl < BL) {
#pragma unroll
                for (int i = 0; i < BNPT; ++i) {
                    const int n = lane + i * BL;
                    red[warp][n] = cq[i];
                    red[warp][N + n] = chk[i];
                    red[warp][2 * N + n] = chv[i];
                }
            }
            if (wl == 0) {
                red[warp][3 * N] = sal;
                red[warp][3 * N + 1] = sbe;
                red[warp][3 * N + 2] = sga;
            }
            __syncthreads();
#pragma unroll
            for (int jn = 0; jn < BNW; ++jn) {
                const int n = threadIdx.x + jn * BTHREADS;
                if (n < N) {
                    float aq = 0.0f, ahk = 0.0f, ahv = 0.0f;
#pragma unroll
                    for (int w = 0; w < BWARPS; ++w) {
                        aq += red[w][n];
                        ahk += red[w][N + n];
                        ahv += red[w][2 * N + n];
                    }
                    dq[(tok * H + h) * N + n] = aq;
                    dk[(tok * H + h) * N + n] = ga * ahk + pend_k[jn];
                    pend_k[jn] = be * ahv;
                }
            }
            if (threadIdx.x == 0) {
                float dal = 0.0f, dbe = 0.0f, dga = 0.0f;
#pragma unroll
                for (int w = 0; w < BWARPS; ++w) {
                    dal += red[w][3 * N];
                    dbe += red[w][3 * N + 1];
                    dga += red[w][3 * N + 2];
                }
                const float d = sc[tt][3], l = sc[tt][4];
                const size_t th = tok * H + h;
                dadt_o[th] = (dal + dbe * (1.0f - l) * d) * al;
                ddt_o[th] = dbe * (1.0f - l) * al + dga * l;
                dlam_o[th] = -dbe * d * al + dga * d;
            }
            __syncthreads();   // red is reused by the next step
        }
    }
    // Gradients of the initial state.
    if (dssm0) {
#pragma unroll
        for (int j = 0; j < BRPT; ++j) {
            const int p = rg + j * BRG;
#pragma unroll
            for (int i = 0; i < BNPT; ++i) dssm0[(bh * P + p) * N + lane + i * BL] = dhs[j][i];
        }
    }
    if (dvp0 && lane == 0) {
#pragma unroll
        for (int j = 0; j < BRPT; ++j) dvp0[bh * P + rg + j * BRG] = pend_v[j];
    }
    if (dkp0) {
#pragma unroll
        for (int jn = 0; jn < BNW; ++jn) {
            const int n = threadIdx.x + jn * BTHREADS;
            if (n < N) dkp0[bh * N + n] = pend_k[jn];
        }
    }
    // dD partial of this (b, h): warp butterflies, then warps in order.
#pragma unroll
    for (int o = BWSH / 2; o > 0; o >>= 1) gD += __shfl_xor_sync(BMASK, gD, o);
    if (wl == 0) red[warp][0] = gD;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < BWARPS; ++w) t += red[w][0];
        part_D[bh] = t;
    }
}
