// mg_m3_angles.cuh: the data-dependent rotary angle of the Mamba-3 SISO
// forward, parallel over time; one definition for inference and training,
// so both rotate k and q with the same bits.
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// ---------------------------------------------------------------------------
// angles_kernel: doc/math.md steps 6-7, parallel over time.
//   theta_t = (theta_{t-1} + pi * tanh(angles_t[a]) * dt_t[h]) mod 2pi
//   (k[2a], k[2a+1]) <- rotation by theta_t, the same for q (in place).
// One block per (head h, sequence b): grid (H, batch). Thread (a, sl) =
// (threadIdx.x % S, threadIdx.x / S) owns angle a over time slice sl of
// ceil(seqlen / ANGLE_SLICES) steps. Pass 1: each thread sums its slice's
// increments in f64. Then one thread per angle turns the slice sums into
// exclusive prefixes, slice by slice in index order (deterministic). Pass 2:
// each thread starts from theta_0 + its prefix, wrapped into [0, 2pi), and
// walks its slice exactly as the reference does (add, wrap with fmod in
// f64), so nothing drifts over long sequences; cos/sin are taken in f64 and
// rounded once. Consecutive threads are consecutive angles of one token:
// their k/q pairs are contiguous (coalesced). The initial angle is read by
// every thread before the first barrier and the final one written by the
// last slice's thread after the second, so out may alias in. cs (optional,
// training) [tok][H][S][2] receives the (cos, sin) of every rotation: the
// backward's R^T.
// STARTS (start [batch][seqlen] bytes given; doc/math.md section 9): at a
// token whose start entry is nonzero the sum restarts, theta_t = pi *
// tanh(angles_t[a]) * dt_t[h] mod 2pi. A slice's sum is then the sum from
// its last start on, with a flag that it holds one; the prefix over the
// slices restarts at a flagged slice, and a slice after any start starts
// from that prefix alone, not from theta_0. The instance without starts is
// the code as it was.
// ---------------------------------------------------------------------------
// The angle reduced into [0, 2pi) (2pi: TWO_PI_D): fmod, then one step up
// or down. A walk's angle leaves [0, 2pi) by less than 2pi per token, and
// the f64 fmod is a loop slow enough to make the angle kernels compute-
// bound, so the three ranges a step lands in skip it with the same bits:
// on [0, 2pi) and (-2pi, 0) fmod is the identity; on [2pi, 4pi) its exact
// result th - 2pi is what the subtraction gives (exact by Sterbenz's
// lemma, 2pi/2 <= th <= 2*2pi). NaN and anything farther take fmod.
__device__ __forceinline__ double wrap_2pi(double th)
{
    if (th >= 0.0 && th < TWO_PI_D) return th;
    if (th >= TWO_PI_D && th < 2.0 * TWO_PI_D) return th - TWO_PI_D;
    if (!(th > -TWO_PI_D && th < 0.0)) th = fmod(th, TWO_PI_D);
    if (th < 0.0) th += TWO_PI_D;
    if (th >= TWO_PI_D) th -= TWO_PI_D;
    return th;
}

// The cosine and sine (f32) of an angle th in [0, 2pi) (wrap_2pi's range),
// for every rotation (the angle kernels, the fused chunked kernel, decode;
// training's kernels take them of the table of reduced angles that
// angles_cs_kernel writes, mg_m3_prep_rot.cuh): th moved to [-pi, pi) in f64 (th - 2pi is exact
// there, Sterbenz's lemma), rounded once to f32 (error <= 2^-24 pi,
// 1.9e-7; angle_reduced) and taken by the hardware's sin.approx and
// cos.approx (__sincosf: absolute error at most 2^-21.41, 3.6e-7, on
// [-pi, pi]; rot_cos_sin). Why not f64 sincos rounded to f32 (error 6e-8):
// one per (token, head, angle) bound the angle kernels by the f64 pipe, at
// half the f32 rate on an H100 and far less on other parts. Why not the
// accurate sincosf (~1 ulp): its range checks and polynomials were 12% of
// the chunked backward's stall samples (mamba3_perf on an H100) for an
// error below the 1.9e-7 of the angle's own rounding, which the hardware
// form only doubles. Every rotation takes this one function, so the
// kernels agree bit for bit; the running angle itself stays f64, so
// nothing drifts with t (doc/math.md section 5).
__device__ __forceinline__ float angle_reduced(double th)
{
    const double r = th >= PI_D ? th - TWO_PI_D : th;
    return (float)r;
}
__device__ __forceinline__ void rot_cos_sin(float r, float &c, float &s)
{
    __sincosf(r, &s, &c);
}
__device__ __forceinline__ void angle_cos_sin(double th, float &c, float &s)
{
    rot_cos_sin(angle_reduced(th), c, s);
}

// The rotation of one (even, odd) pair by the angle with cosine c, sine s;
// the one expression of every kernel that rotates (angles_kernel here, the
// training forward's prep_rot_kernel), so they give the same bits.
__device__ __forceinline__ float2 rotate_pair(float c, float s, float2 v)
{
    float2 o;
    o.x = c * v.x - s * v.y;
    o.y = s * v.x + c * v.y;
    return o;
}

// The transpose R(theta)^T v: a rotated pair's gradient taken back to the
// pair before the rotation (the angle backward, and the chunked SSM
// backward that does the rotary part itself), one expression for both.
__device__ __forceinline__ float2 unrotate_pair(float c, float s, float2 v)
{
    float2 o;
    o.x = c * v.x + s * v.y;
    o.y = -s * v.x + c * v.y;
    return o;
}

// A token's angle increment theta_t - theta_{t-1} before the wrap: pi
// tanh(angle input) dt, in f64 from the f32 tanh and dt (doc/math.md step
// 6). The one expression of every angle walk and sum (the angle kernels,
// the fused kernel's walk and segment sums, decode), so they give the same
// bits.
__device__ __forceinline__ double angle_inc(float tanh_in, float dt) { return PI_D * (double)tanh_in * (double)dt; }

// The slice walks below take a token's increment in two steps: ld(t)
// loads its inputs (a small struct, from device memory) and inc(x) turns
// them into theta_t - theta_{t-1} (f64). Why: the walk's sum is a chain,
// but the loads are not; loading ANGLE_U tokens' inputs before adding any
// keeps ANGLE_U loads in flight per thread, where a load per step waited
// out the memory latency once per token (ncu: angles_cs_kernel and
// seg_angle_kernel bound by long scoreboard stalls). The sums are formed
// in the same order: the same bits.
constexpr int ANGLE_U = 4;
// A token's inputs to its increment: the angle input (storage dtype) and
// dt (f32, or its raw in_proj entry before softplus: D).
template <class D> struct ang_raw {
    act_t ang;
    D dt;
};

// The tokens [t0, t1) of a slice in order: step(t, x, st) with x = ld(t)
// and (STARTS) st = is_start(t), the inputs of ANGLE_U tokens loaded before
// the first of them is stepped.
template <bool STARTS, class Ld, class IsStart, class Step>
__device__ __forceinline__ void angle_slice_steps(int t0, int t1, Ld ld, IsStart is_start, Step step)
{
    for (int t = t0; t < t1; t += ANGLE_U) {
        decltype(ld(t)) x[ANGLE_U];
        bool st[ANGLE_U];
#pragma unroll
        for (int j = 0; j < ANGLE_U; ++j)
            if (t + j < t1) {
                x[j] = ld(t + j);
                st[j] = STARTS && is_start(t + j);
            }
#pragma unroll
        for (int j = 0; j < ANGLE_U; ++j)
            if (t + j < t1) step(t + j, x[j], st[j]);
    }
}

// The starting angle of thread (a, sl)'s time slice [t0, t1): pass 1 sums
// the slice's increments inc(ld(t)) in f64, one thread per angle turns the
// slice sums into exclusive prefixes in slice order (deterministic), and
// the start is th0 plus the prefix, wrapped. part: the block's
// [ANGLE_SLICES][S] shared scratch. Every thread of the block calls it
// (two barriers). The angle kernels of inference and training share it.
// STARTS: is_start(t) says whether token t starts an episode; pflag is the
// block's [ANGLE_SLICES][S] shared flags (unused without STARTS). A slice
// sums from its last start on; the prefix restarts at a slice that holds a
// start, and th0 is added only while no start came before the slice.
template <bool STARTS, class Ld, class Inc, class IsStart>
__device__ __forceinline__ double angle_slice_start(double th0, int t0, int t1, int a, int sl,
                                                    double (*part)[S], unsigned char (*pflag)[S], Ld ld, Inc inc,
                                                    IsStart is_start)
{
    double sum = 0.0;
    bool fl = false;
    angle_slice_steps<STARTS>(t0, t1, ld, is_start, [&](int, const decltype(ld(t0)) &x, bool st) {
        if (st) {
            sum = 0.0;
            fl = true;
        }
        sum += inc(x);
    });
    part[sl][a] = sum;
    if constexpr (STARTS) pflag[sl][a] = fl;
    __syncthreads();
    if (sl == 0) {   // exclusive prefix over the slices, in order
        double run = 0.0;
        bool started = false;
        for (int j = 0; j < ANGLE_SLICES; ++j) {
            const double v = part[j][a];
            part[j][a] = run;
            if constexpr (STARTS) {
                const bool f = pflag[j][a];
                pflag[j][a] = started;   // a start before slice j
                if (f) {
                    run = v;
                    started = true;
                } else {
                    run += v;
                }
            } else {
                run += v;
            }
        }
    }
    __syncthreads();
    if constexpr (STARTS) {
        if (pflag[sl][a]) return wrap_2pi(part[sl][a]);
    }
    return wrap_2pi(th0 + part[sl][a]);
}

// The walk of thread (a, sl)'s slice [t0, t1) from its starting angle th
// (angle_slice_start): per token, the sum restarts at an episode start
// (STARTS), adds inc(ld(t)) and wraps, and at(t, th) gets the wrapped
// angle (for angle_cos_sin or angle_reduced). Returns the angle after the
// slice. The angle kernels of inference and training share it.
template <bool STARTS, class Ld, class Inc, class IsStart, class At>
__device__ __forceinline__ double angle_slice_walk(double th, int t0, int t1, Ld ld, Inc inc, IsStart is_start,
                                                   At at)
{
    angle_slice_steps<STARTS>(t0, t1, ld, is_start, [&](int t, const decltype(ld(t0)) &x, bool st) {
        if (st) th = 0.0;   // a new episode: the sum restarts
        th = wrap_2pi(th + inc(x));
        at(t, th);
    });
    return th;
}

template <bool STARTS>
__global__ void __launch_bounds__(ANGLE_THREADS)
angles_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt,
              const float *angle_in, float *angle_out, float *__restrict__ k,
              float *__restrict__ q, float *__restrict__ cs, const unsigned char *__restrict__ reset,
              const unsigned char *__restrict__ start)
{
    __shared__ double part[ANGLE_SLICES][S];
    __shared__ unsigned char pflag[STARTS ? ANGLE_SLICES : 1][S];
    const int a = threadIdx.x % S, sl = threadIdx.x / S;
    const int h = blockIdx.x;
    const size_t b = blockIdx.y;
    const size_t st = (b * H + h) * (size_t)S + a;
    const double th0 = angle_in && !(reset && reset[b]) ? (double)angle_in[st] : 0.0;
    const int len = (seqlen + ANGLE_SLICES - 1) / ANGLE_SLICES;
    const int t0 = min(seqlen, sl * len), t1 = min(seqlen, t0 + len);
    const size_t row0 = b * (size_t)seqlen;

    const auto ld = [&](int t) {   // the angle input and dt of token t
        const size_t tok = row0 + t;
        return ang_raw<float>{proj[tok * NP + OFF_ANG + a], dt[tok * H + h]};
    };
    const auto inc = [](const ang_raw<float> &x) {   // theta_t - theta_{t-1} before the wrap
        return angle_inc(ang_tanh_of(x.ang), x.dt);
    };
    const auto is_start = [&](int t) { return start[row0 + t] != 0; };
    // Walk the slice from its starting angle, rotating k and q.
    double th = angle_slice_start<STARTS>(th0, t0, t1, a, sl, part, pflag, ld, inc, is_start);
    th = angle_slice_walk<STARTS>(th, t0, t1, ld, inc, is_start, [&](int t, double tht) {
        float c, s;
        angle_cos_sin(tht, c, s);
        const size_t tok = row0 + t;
        float2 *kp = reinterpret_cast<float2 *>(k + (tok * H + h) * N + 2 * a);
        float2 *qp = reinterpret_cast<float2 *>(q + (tok * H + h) * N + 2 * a);
        *kp = rotate_pair(c, s, *kp);
        *qp = rotate_pair(c, s, *qp);
        if (cs) {
            float2 v;
            v.x = c;
            v.y = s;
            reinterpret_cast<float2 *>(cs)[(tok * H + h) * S + a] = v;
        }
    });
    if (angle_out && t1 == seqlen && t1 > t0) angle_out[st] = (float)th;
}
