// util.cuh: device helpers of the Mamba-1 kernels, shared by
// NAME_kernels.cu and NAME_backward.cu (an unused one generates no code):
// dtype stores, the conv's arithmetic (one step, one time tile), derivatives
// of the activations (the RMSNorm row is the shared mg_rms_row.cuh). Written
// against NAME_common.cuh (E, E2, K, CONV_*, act_t, from_f32); #included
// inside the .cu file's anonymous namespace, so it includes nothing itself.

// Store 4 consecutive values (one float4 of a row) in the output dtype.
__device__ __forceinline__ void store4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
template <typename T> __device__ __forceinline__ void store4(T *p, float4 v)
{
    p[0] = from_f32<T>(v.x); p[1] = from_f32<T>(v.y);
    p[2] = from_f32<T>(v.z); p[3] = from_f32<T>(v.w);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// d silu(x)/dx = s (1 + x (1 - s)), s = sigmoid(x)
__device__ __forceinline__ float dsilu(float x)
{
    const float s = sigmoidf_(x);
    return s * (1.0f + x * (1.0f - s));
}
// d softplus(x)/dx with the threshold 20 (x > 20: identity)
__device__ __forceinline__ float dsoftplus(float x) { return x > 20.0f ? 1.0f : sigmoidf_(x); }


// The causal conv's pre-activation at one step: bias + sum_k w[k] x[k] over
// the window x[0 .. K-1] (inputs t-K+1 .. t, oldest first), summed in k
// order. Every conv kernel (prefill, training forward and backward) computes
// it with this function, and the decode step writes the same expression, so
// all produce the same bits.
__device__ __forceinline__ float conv_pre(const float (&w)[K], const float *x, float bias)
{
    float acc = bias;
#pragma unroll
    for (int k = 0; k < K; ++k) acc += w[k] * x[k];
    return acc;
}

// The conv inputs of one (sequence, channel) around a time tile starting at
// t0: xs[i] = x at t = t0 - (K-1) + i, read from xp (the channel's x in xz
// [t][E2]) for 0 <= t < tend, from the conv state s0 [K-1] (oldest first;
// NULL: zeros) for t < 0 (t0 >= 0: only the first K-1 can be), and 0 from
// tend on (t0 < tend). The loop unrolls into independent loads, all in
// flight together; steps from tend on load step tend-1 again (a cached
// line) and discard it, so the loads need no branches.
template <int NX>
__device__ __forceinline__ void conv_load(int t0, int tend, const act_t *xp, const float *s0, float (&xs)[NX])
{
#pragma unroll
    for (int i = 0; i < NX; ++i) {
        const int t = t0 - (K - 1) + i;
        if (i < K - 1 && t < 0) {
            xs[i] = s0 ? s0[(K - 1) + t] : 0.0f;
        } else {
            const float v = to_f32(xp[(size_t)min(t, tend - 1) * E2]);
            xs[i] = t < tend ? v : 0.0f;
        }
    }
}

// Episode starts in the conv (doc/math.md §9): a tap of output t reads 0
// when its input lies before the latest start at or before t. conv_starts:
// the start flags of an input window as a word (start_bits), bit i = a
// start at t = t0 - (K-1) + i, none outside [0, tend); the calling warp must
// be whole (the kernels take it before dropping the threads past E). A
// thread block's threads share (sequence, tile), so the word is uniform and
// a window without a start runs the maskless code. conv_masked: the window
// of the output whose newest input is index i (inputs i .. i+K-1): tap k is
// kept unless a start lies after its input, at i+k+1 .. i+K-1 (a running
// flag from the newest tap down), so conv_pre then sums the same terms as a
// fresh sequence's first steps.
template <int NX>
__device__ __forceinline__ unsigned conv_starts(int t0, int tend, const unsigned char *sp)
{
    static_assert(NX <= 32, "a conv window's start flags are one 32-bit word");
    return start_bits(sp, t0 - (K - 1), NX, tend);
}
template <int NX>
__device__ __forceinline__ void conv_masked(const float (&xs)[NX], unsigned sf, int i, float (&xw)[K])
{
    bool cut = false;
    xw[K - 1] = xs[i + K - 1];
#pragma unroll
    for (int k = K - 2; k >= 0; --k) {
        cut = cut || start_at(sf, i + k + 1);
        xw[k] = cut ? 0.0f : xs[i + k];
    }
}

// The body of the forward conv kernels (prefill, training forward): causal
// depthwise conv + bias + SiLU, xc[b,t,e] = silu(conv_pre over x[b, t-K+1..t, e]).
// Grid (batch * ntiles, CONV_BLOCKS), block x = b * ntiles + tile (adjacent
// blocks: adjacent tiles of one sequence, whose windows overlap in L2),
// ntiles = ceil(seqlen / CONV_TILE); one thread per (channel, tile of
// CONV_TILE steps), consecutive threads on consecutive channels (coalesced).
// The thread loads its tile's inputs and the K-1 before it into registers
// together (conv_load: from xz [tokens][2E], or from the conv state s0
// [b][E][K-1] before t = 0, NULL: zeros), then computes each step. The tile
// that ends the sequence writes its last K-1 inputs to state_out (NULL: not
// written), after it has read its own s0 entries: state_out may alias s0
// only when the call is one tile (the caller's business).
// ST: episode starts, start [batch][seqlen] (uint8): the taps before the
// latest start read zeros (conv_masked), and so do the final state's
// entries before the sequence's last start. ST = false compiles none of it.
// W0 (the inference conv, whose state_out may alias s0): with more than
// one tile the final state is written by tile 0, after it has read s0,
// from the sequence's last K-1 inputs loaded for it (no other tile reads
// s0: its inputs start at t >= CONV_TILE >= K-1), instead of by the last
// tile (which could overwrite s0 before tile 0 reads it). The same values.
// cblk: the block of CONV_THREADS channels this call computes; -1 (the
// conv kernels) = blockIdx.y; tid: the thread's channel in it, -1 =
// threadIdx.x. The fused conv + x_proj kernel, whose one block covers every
// channel of its tile, runs groups of CONV_THREADS threads (whole warps)
// over the channel blocks.
static_assert(CONV_TILE >= K - 1, "only tile 0 reads the initial conv state");
template <bool ST = false, bool W0 = false>
__device__ __forceinline__ void conv_fwd_tile(int seqlen, int ntiles, const act_t *__restrict__ xz,
                                              const float *__restrict__ cw, const float *__restrict__ cb,
                                              const float *s0, float *state_out, act_t *__restrict__ xc,
                                              const unsigned char *__restrict__ start = nullptr, int cblk = -1,
                                              int tid = -1)
{
    const int e = (cblk < 0 ? (int)blockIdx.y : cblk) * CONV_THREADS + (tid < 0 ? (int)threadIdx.x : tid);
    unsigned sf = 0;   // ST: the window's start flags, taken while the warp is whole
    if constexpr (ST) {
        const int ts = (int)(blockIdx.x % ntiles) * CONV_TILE;
        sf = conv_starts<K - 1 + CONV_TILE>(ts, min(seqlen, ts + CONV_TILE),
                                            start + (blockIdx.x / ntiles) * (size_t)seqlen);
    }
    if (e >= E) return;
    const size_t b = blockIdx.x / ntiles;
    const int t0 = (int)(blockIdx.x % ntiles) * CONV_TILE;
    const int n = min(CONV_TILE, seqlen - t0);   // steps [t0, t0 + n)
    float w[K], xs[K - 1 + CONV_TILE];           // xs[i]: x at t0 - (K-1) + i
#pragma unroll
    for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
    const float bias = cb[e];
    const size_t st = (b * E + e) * (K - 1);
    const act_t *xp = xz + b * (size_t)seqlen * E2 + e;
    act_t *op = xc + b * (size_t)seqlen * E + e;
    conv_load(t0, t0 + n, xp, s0 ? s0 + st : nullptr, xs);
    if (ST && sf != 0) {   // (a tile without a start: the maskless code below, the same terms)
#pragma unroll
        for (int i = 0; i < CONV_TILE; ++i) {
            if (i < n) {
                float xw[K];
                conv_masked(xs, sf, i, xw);
                op[(size_t)(t0 + i) * E] = from_f32<act_t>(silu(conv_pre(w, xw, bias)));
            }
        }
        if (state_out && t0 + n == seqlen && (!W0 || ntiles == 1)) {
            // state_out[k] = xs[n + k], 0 where a start follows it (at n+k+1 .. n+K-2)
#pragma unroll
            for (int i = 1; i <= CONV_TILE; ++i) {
                if (i == n) {
                    bool cut = false;
#pragma unroll
                    for (int k = K - 2; k >= 0; --k) {
                        state_out[st + k] = cut ? 0.0f : xs[i + k];
                        cut = cut || start_at(sf, i + k);
                    }
                }
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < CONV_TILE; ++i)
            if (i < n) op[(size_t)(t0 + i) * E] = from_f32<act_t>(silu(conv_pre(w, xs + i, bias)));
        if (state_out && t0 + n == seqlen && (!W0 || ntiles == 1)) {
            // state_out[k] = xs[n + k]: unrolled over n so that xs stays in registers
#pragma unroll
            for (int i = 1; i <= CONV_TILE; ++i) {
                if (i == n) {
#pragma unroll
                    for (int k = 0; k < K - 1; ++k) state_out[st + k] = xs[i + k];
                }
            }
        }
    }
    if (W0 && state_out && ntiles > 1 && t0 == 0) {
        // the final state from the last K-1 inputs t = seqlen-K+1 .. seqlen-1
        // (>= 0 here), 0 where a start follows its input (as the last tile's)
        float v[K - 1];
#pragma unroll
        for (int k = 0; k < K - 1; ++k) v[k] = to_f32(xp[(size_t)(seqlen - (K - 1) + k) * E2]);
        if constexpr (ST) {
            const unsigned char *sp = start + b * (size_t)seqlen;
            bool cut = false;
#pragma unroll
            for (int k = K - 2; k >= 0; --k) {
                if (cut) v[k] = 0.0f;
                cut = cut || sp[seqlen - (K - 1) + k] != 0;
            }
        }
#pragma unroll
        for (int k = 0; k < K - 1; ++k) state_out[st + k] = v[k];
    }
}
