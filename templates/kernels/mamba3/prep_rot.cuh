// mg_m3_prep_rot.cuh: the per-token maps and the rotary angle of the Mamba-3
// SISO forward for training, in two kernels whose per-head k and q are
// written once, already rotated. The inference split path writes them
// unrotated (prep_kernel) and rotates them in place (angles_kernel): at the
// training shapes that read and write of k and q is most of the two kernels'
// memory traffic (4 f32 streams of tokens x H x N), so training takes the
// angles first, as a (cos, sin) table, and rotates in prep.
// Included inside the anonymous namespace of NAME_backward.cu after
// mg_m3_prep.cuh and mg_m3_angles.cuh (whose helpers it uses).
static_assert(N % 2 == 0, "prep_rot_kernel stores (even, odd) pairs");

// ---------------------------------------------------------------------------
// angles_cs_kernel: angles_kernel's walk (doc/math.md steps 6-7, the same
// grid, thread map, f64 slice sums and wrapped f64 walk: the same angles to
// the bit) with dt_t[h] = softplus(dd_dt + dt_bias) taken from the in_proj
// row (head_scalars' expression: prep's dt to the bit), writing the (cos,
// sin) of every rotation into cs [tok][H][S][2] instead of rotating k and q.
// angle_out (optional) may alias angle_in, as in angles_kernel. STARTS:
// start [batch][seqlen] restarts the sum, as in angles_kernel.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float row_head_dt(const act_t *pr, int h, float dtb)
{
    return softplus(to_f32(pr[OFF_DT + h]) + dtb);
}

template <bool STARTS>
__global__ void __launch_bounds__(ANGLE_THREADS)
angles_cs_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                 const float *angle_in, float *angle_out, float *__restrict__ cs,
                 const unsigned char *__restrict__ start)
{
    __shared__ double part[ANGLE_SLICES][S];
    __shared__ unsigned char pflag[STARTS ? ANGLE_SLICES : 1][S];
    const int a = threadIdx.x % S, sl = threadIdx.x / S;
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const size_t st = (b * H + h) * (size_t)S + a;
    const double th0 = angle_in ? (double)angle_in[st] : 0.0;
    const float dtb = dt_bias[h];
    const int len = (seqlen + ANGLE_SLICES - 1) / ANGLE_SLICES;
    const int t0 = min(seqlen, sl * len), t1 = min(seqlen, t0 + len);
    const size_t row0 = b * (size_t)seqlen;

    const auto inc = [&](int t) {   // theta_t - theta_{t-1} before the wrap
        const act_t *pr = proj + (row0 + t) * NP;
        return PI_D * (double)tanhf(to_f32(pr[OFF_ANG + a])) * (double)row_head_dt(pr, h, dtb);
    };
    const auto is_start = [&](int t) { return start[row0 + t] != 0; };
    // Walk the slice from its starting angle; one (cos, sin) per token.
    double th = angle_slice_start<STARTS>(th0, t0, t1, a, sl, part, pflag, inc, is_start);
    th = angle_slice_walk<STARTS>(th, t0, t1, inc, is_start, [&](int t, float c, float s) {
        float2 v;
        v.x = c;
        v.y = s;
        reinterpret_cast<float2 *>(cs)[((row0 + t) * H + h) * S + a] = v;
    });
    if (angle_out && t1 == seqlen && t1 > t0) angle_out[st] = (float)th;
}

// ---------------------------------------------------------------------------
// prep_rot_kernel: prep_kernel (one block of PREP_THREADS per token, the same
// per-head scalars and BCNorm'd k, q) with the rotation of angles_kernel
// applied before the store: thread pairs (2a, 2a+1) of a head, pair a < S
// rotated by cs[tok][h][a] (rotate_pair: angles_kernel's expression), the
// rest stored as they are, in kq_t (mg_m3_train_util.cuh: the storage type).
// Each thread stores a pair, consecutive threads on consecutive pairs
// (coalesced).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(PREP_THREADS)
prep_rot_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                const float *__restrict__ Bnw, const float *__restrict__ Cnw,
                const float *__restrict__ Bbias, const float *__restrict__ Cbias,
                const float *__restrict__ cs, float *__restrict__ dt, float *__restrict__ adt,
                float *__restrict__ lam, kq_t *__restrict__ k, kq_t *__restrict__ q)
{
    __shared__ float rB[G], rC[G];
    const size_t tok = blockIdx.x;
    const act_t *pr = proj + tok * NP;
    token_maps(pr, tok, dt_bias, rB, rC, dt, adt, lam);
    __syncthreads();
    kq_t *kt = k + tok * (size_t)(H * N);
    kq_t *qt = q + tok * (size_t)(H * N);
    const float2 *ct = reinterpret_cast<const float2 *>(cs) + tok * (size_t)(H * S);
    for (int i = threadIdx.x; i < H * N / 2; i += PREP_THREADS) {
        const int h = i / (N / 2), a = i % (N / 2), n = 2 * a, g = h / HPG;
        const int e = h * N + n;
        float2 kv, qv;
        kv.x = to_f32(pr[OFF_B + g * N + n]) * rB[g] * Bnw[n] + Bbias[e];
        kv.y = to_f32(pr[OFF_B + g * N + n + 1]) * rB[g] * Bnw[n + 1] + Bbias[e + 1];
        qv.x = to_f32(pr[OFF_C + g * N + n]) * rC[g] * Cnw[n] + Cbias[e];
        qv.y = to_f32(pr[OFF_C + g * N + n + 1]) * rC[g] * Cnw[n + 1] + Cbias[e + 1];
        if (a < S) {
            const float2 r = ct[h * S + a];
            kv = rotate_pair(r.x, r.y, kv);
            qv = rotate_pair(r.x, r.y, qv);
        }
        st2_from_f32(kt + 2 * i, kv);
        st2_from_f32(qt + 2 * i, qv);
    }
}
