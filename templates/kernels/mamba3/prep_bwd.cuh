// mg_m3_prep_bwd.cuh: the backward of the per-token maps (mg_m3_prep.cuh).
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// Per-token backward of doc/math.md steps 1-6 (one block per token). Inputs: the
// gradients of the SSM inputs (dadt, ddt, dlam [tok][H]; dk, dq [tok][H][N]
// of the unrotated k, q; dv [tok][E], or NULL when the x columns of dproj
// are written already) and gth [tok][H][S]. Writes the
// in_proj gradient row dproj[tok] (storage dtype) for x, B, C, dd_dt, dd_A,
// trap and angles (z comes from the gate backward), and per-token partial
// rows of the parameter gradients (summed over tokens by colsum + reduce):
//   gdtb [tok][H] (dt_bias), gBn, gCn [tok][N] (B_norm / C_norm weights).
//   dDT  = ddt + pi sum_a gth tanh(ang_a) + dadt A;   dA = dadt DT
//   dd_dt = dDT softplus'(dd_dt + dt_bias);  dd_A = -dA act'(dd_A) (0 when the
//   a_floor clamp is active); trap = dlam lam (1 - lam);
//   ang_a = pi (1 - tanh^2) sum_h gth[h][a] DT_h
//   BCNorm per group: dB^ = sum of the group's heads' dk; dB = r w dB^ -
//   r^3/N B sum(dB^ w B); gBn += dB^ B r (groups in order); the same for C.
// DK: the type of dk, dq (float from scan_bwd; dkq_t from the chunked
// backward), summed over the heads in f32.
template <class DK>
__global__ void __launch_bounds__(PREP_THREADS)
prep_bwd_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt,
                const float *__restrict__ lam, const float *__restrict__ dt_bias,
                const float *__restrict__ Bnw, const float *__restrict__ Cnw,
                const DK *__restrict__ dk, const DK *__restrict__ dq,
                const float *__restrict__ dv, const float *__restrict__ dadt,
                const float *__restrict__ ddt, const float *__restrict__ dlam,
                const float *__restrict__ gth, act_t *__restrict__ dproj,
                float *__restrict__ gdtb, float *__restrict__ gBn, float *__restrict__ gCn)
{
    __shared__ float stn[S];
    __shared__ float rB[G], rC[G], dotB[G], dotC[G];
    __shared__ float sgb[N], sgc[N];   // the current group's head sums of dk, dq per n
    constexpr int NJ = (N + PREP_THREADS - 1) / PREP_THREADS;   // entries n per thread
    const size_t tok = blockIdx.x;
    const act_t *pr = proj + tok * NP;
    act_t *dp = dproj + tok * NP;
    const DK *dkt = dk + tok * (size_t)(H * N), *dqt = dq + tok * (size_t)(H * N);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int a = threadIdx.x; a < S; a += PREP_THREADS) stn[a] = ang_tanh_of(pr[OFF_ANG + a]);
    // BCNorm per group, groups in order. Why this shape: each group's head
    // sums dB^, dC^ are read from dk, dq once, by every thread (one n each,
    // heads in order), into shared memory, where the group's statistics
    // (warp 0) and its gradient rows read them; summing them in the warp
    // of the group left the block's other warps idle on the largest read
    // of the kernel (G = 1: one warp of four), and read it twice.
    float ab[NJ], ac[NJ];   // gBn, gCn of this thread's n (groups in order)
#pragma unroll
    for (int j = 0; j < NJ; ++j) ab[j] = ac[j] = 0.0f;
    for (int g = 0; g < G; ++g) {
        for (int n = threadIdx.x; n < N; n += PREP_THREADS) {
            float gb = 0.0f, gc = 0.0f;
            for (int hh = g * HPG; hh < (g + 1) * HPG; ++hh) {
                gb += to_f32(dkt[hh * N + n]);
                gc += to_f32(dqt[hh * N + n]);
            }
            sgb[n] = gb;
            sgc[n] = gc;
        }
        __syncthreads();
        if (warp == 0) {
            float sb = 0.0f, sc = 0.0f, db = 0.0f, dc = 0.0f;
#pragma unroll
            for (int i = 0; i < PREP_NPL; ++i) {
                const int n = lane + 32 * i;
                if (n < N) {
                    const float bv = to_f32(pr[OFF_B + g * N + n]);
                    const float cv = to_f32(pr[OFF_C + g * N + n]);
                    sb += bv * bv;
                    sc += cv * cv;
                    const float gb = sgb[n], gc = sgc[n];
                    db += gb * Bnw[n] * bv;
                    dc += gc * Cnw[n] * cv;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                sb += __shfl_xor_sync(FULL_MASK, sb, o);
                sc += __shfl_xor_sync(FULL_MASK, sc, o);
                db += __shfl_xor_sync(FULL_MASK, db, o);
                dc += __shfl_xor_sync(FULL_MASK, dc, o);
            }
            if (lane == 0) {
                rB[g] = bc_rms_scale(sb);
                rC[g] = bc_rms_scale(sc);
                dotB[g] = db;
                dotC[g] = dc;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int n = threadIdx.x + j * PREP_THREADS;
            if (n < N) {
                const float wb = Bnw[n], wc = Cnw[n];
                const float bv = to_f32(pr[OFF_B + g * N + n]);
                const float cv = to_f32(pr[OFF_C + g * N + n]);
                const float gb = sgb[n], gc = sgc[n];
                const float rb = rB[g], rc = rC[g];
                dp[OFF_B + g * N + n] = from_f32<act_t>(rb * wb * gb - rb * rb * rb * dotB[g] / (float)N * bv);
                dp[OFF_C + g * N + n] = from_f32<act_t>(rc * wc * gc - rc * rc * rc * dotC[g] / (float)N * cv);
                ab[j] += gb * bv * rb;
                ac[j] += gc * cv * rc;
            }
        }
        __syncthreads();   // sgb, sgc are rewritten for the next group
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int n = threadIdx.x + j * PREP_THREADS;
        if (n < N) {
            gBn[tok * N + n] = ab[j];
            gCn[tok * N + n] = ac[j];
        }
    }
    for (int h = threadIdx.x; h < H; h += PREP_THREADS) {
        const size_t th = tok * H + h;
        const float d = dt[th], l = lam[th];
        const float xa = to_f32(pr[OFF_A + h]);
        const float act = a_act(xa);
        const bool live = act >= A_FLOOR;   // the clamp passes no gradient when active
        const float A = -(live ? act : A_FLOOR);
        float ang = 0.0f;
        for (int a = 0; a < S; ++a) ang += gth[th * S + a] * stn[a];
        const float dDT = ddt[th] + PI_F * ang + dadt[th] * A;
        const float dA = dadt[th] * d;
        const float dpre = dDT * dsoftplus(to_f32(pr[OFF_DT + h]) + dt_bias[h]);
        dp[OFF_DT + h] = from_f32<act_t>(dpre);
        gdtb[th] = dpre;
        dp[OFF_A + h] = from_f32<act_t>(live ? -dA * da_act(xa) : 0.0f);
        dp[OFF_TRAP + h] = from_f32<act_t>(dlam[th] * l * (1.0f - l));
    }
    for (int a = threadIdx.x; a < S; a += PREP_THREADS) {
        float acc = 0.0f;
        for (int h = 0; h < H; ++h) acc += gth[(tok * H + h) * S + a] * dt[tok * H + h];
        dp[OFF_ANG + a] = from_f32<act_t>(PI_F * (1.0f - stn[a] * stn[a]) * acc);
    }
    if (dv)   // (NULL: the chunked backward stored the x columns itself)
        for (int e = threadIdx.x; e < E; e += PREP_THREADS)
            dp[OFF_X + e] = from_f32<act_t>(dv[tok * E + e]);
}

