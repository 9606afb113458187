// mg_m3_angles_bwd.cuh: the backward of the rotary angle (mg_m3_angles.cuh),
// parallel over time with the forward's grid and thread map.
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ---------------------------------------------------------------------------
// angles_bwd_kernel: the backward of angles_kernel, parallel over time with
// its grid and thread map. With k', q' the rotated values (k, q after the
// forward) and dk', dq' their gradients, per token:
//   g_t = -dk'0 k'1 + dk'1 k'0 - dq'0 q'1 + dq'1 q'0   (d L / d theta_t, local)
//   (dk0, dk1) = R(theta_t)^T (dk'0, dk'1), the same for q  -> in place
//   gth_t = sum_{s >= t} g_s   (theta_t feeds every later theta with
//            derivative 1, the mod 2pi included)
// Pass 1 (per thread, its slice): undo the rotation, write g_t into gth and
// sum it over the slice (f32, t in order). One thread per angle turns the
// slice sums into exclusive suffix sums, last slice first. Pass 2: walk the
// slice backwards accumulating from its suffix, gth_t = suffix + the slice's
// sum from t on (f32, t from the end). dangle0 (optional) [b][H][S] = d L / d
// theta_0 = gth of the first token (0 for an empty sequence). Each entry is
// read and written by one thread: deterministic.
// STARTS (start [batch][seqlen]; doc/math.md section 9): theta_t depends on
// the thetas since the last start only, so the suffix sums stop at a
// start: gth_t = sum of g_s over s >= t up to the next start (excluded).
// Pass 1 sums a slice's g up to its first start (the part that reaches the
// slices before it) and flags the slice; the suffix over the slices
// restarts at a flagged slice; pass 2 resets its running sum after a start
// token. dangle0 is then 0 for a stream whose first token is a start.
// GIVEN: the chunked SSM backward (mg_m3_chunked_bwd.cuh, phase D) has
// already un-rotated dk, dq and written g_t into gth; pass 1 only reads it
// (k, q, rot, dk, dq are not touched and may be null).
// ---------------------------------------------------------------------------
template <bool STARTS, bool GIVEN = false>
__global__ void __launch_bounds__(ANGLE_THREADS)
angles_bwd_kernel(int seqlen, const kq_t *__restrict__ k, const kq_t *__restrict__ q,
                  const float *__restrict__ rot, float *__restrict__ dk, float *__restrict__ dq,
                  float *__restrict__ gth, float *__restrict__ dangle0, const unsigned char *__restrict__ start)
{
    __shared__ float part[ANGLE_SLICES][S];
    __shared__ unsigned char pflag[STARTS ? ANGLE_SLICES : 1][S];
    const int a = threadIdx.x % S, sl = threadIdx.x / S;
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const int len = (seqlen + ANGLE_SLICES - 1) / ANGLE_SLICES;
    const int t0 = min(seqlen, sl * len), t1 = min(seqlen, t0 + len);
    const size_t row0 = b * (size_t)seqlen;

    // Pass 1: the local terms and the un-rotated gradients.
    float sum = 0.0f;
    bool fl = false;   // STARTS: a start seen in this slice (sum stops growing there)
    // (GIVEN: unrolled so that the loads of several tokens are in flight;
    // the sum's order is unchanged)
#pragma unroll(GIVEN ? 4 : 1)
    for (int t = t0; t < t1; ++t) {
        const size_t tok = row0 + t;
        float gl;
        if constexpr (GIVEN) {
            gl = gth[(tok * H + h) * S + a];
        } else {
            const size_t base = (tok * H + h) * N + 2 * a;
            const float2 kk = ld2_f32(k + base);
            const float2 qq = ld2_f32(q + base);
            const float2 g = *reinterpret_cast<const float2 *>(dk + base);
            const float2 f = *reinterpret_cast<const float2 *>(dq + base);
            float rc, rs;
            rot_cos_sin(rot[(tok * H + h) * S + a], rc, rs);
            gl = -g.x * kk.y + g.y * kk.x - f.x * qq.y + f.y * qq.x;
            *reinterpret_cast<float2 *>(dk + base) = unrotate_pair(rc, rs, g);
            *reinterpret_cast<float2 *>(dq + base) = unrotate_pair(rc, rs, f);
            gth[(tok * H + h) * S + a] = gl;
        }
        if constexpr (STARTS) {
            if (start[tok]) fl = true;
            if (!fl) sum += gl;
        } else {
            sum += gl;
        }
    }
    part[sl][a] = sum;
    if constexpr (STARTS) pflag[sl][a] = fl;
    __syncthreads();
    if (sl == 0) {   // exclusive suffix over the slices, last first
        float run = 0.0f;
        for (int j = ANGLE_SLICES - 1; j >= 0; --j) {
            const float v = part[j][a];
            part[j][a] = run;
            if constexpr (STARTS) {
                if (pflag[j][a]) run = v;   // nothing crosses slice j's first start
                else run += v;
            } else {
                run += v;
            }
        }
    }
    __syncthreads();

    // Pass 2: the running sum from the end of the sequence.
    float run = part[sl][a];
#pragma unroll(GIVEN ? 4 : 1)
    for (int t = t1 - 1; t >= t0; --t) {
        float *gp = gth + ((row0 + t) * H + h) * S + a;
        run += *gp;
        *gp = run;
        if constexpr (STARTS) {
            if (start[row0 + t]) run = 0.0f;   // no gradient crosses a start
        }
    }
    if (dangle0 && sl == 0) dangle0[(b * H + h) * (size_t)S + a] = run;
}
