// train_conv.cuh: the causal conv + SiLU of the Mamba-1 training path: the
// forward from a saved initial window, its backward, and the first stage of
// the sum of the backward's weight/bias partials. Both conv kernels are
// parallel over time tiles of CONV_TILE steps: grid (batch * ntiles,
// CONV_BLOCKS), block x = b * ntiles + tile, ntiles = ceil(seqlen /
// CONV_TILE), one thread per (channel, tile), consecutive threads on
// consecutive channels (coalesced). Written against the constants of
// NAME_common.cuh and those NAME_backward.cu defines (KM1, RED_THREADS,
// CONV_PART_GROUP); #included by NAME_backward.cu inside its anonymous
// namespace, so it includes nothing itself.

// Causal depthwise conv + bias + SiLU (the inference conv's conv_fwd_tile,
// same bits, the inference's rule for the states: W0). The initial window
// comes from state [b][E][K-1] (NULL: zeros), which the final window then
// overwrites (NULL: not written); tile 0, the only tile that reads it, also
// saves it (zeros for NULL) to cs0, the trainer's copy for the backward,
// before the final window is written (by tile 0 too when there are more
// tiles: conv_fwd_tile<ST, true>). Why here: the copy was a launch of its
// own per layer.
// ST: episode starts, start [batch][seqlen] (conv_fwd_tile).
template <bool ST>
__global__ void __launch_bounds__(CONV_THREADS)
conv_fwd_kernel(int seqlen, int ntiles, const act_t *__restrict__ xz, const float *__restrict__ cw,
                const float *__restrict__ cb, float *state, float *__restrict__ cs0,
                act_t *__restrict__ xc, const unsigned char *__restrict__ start)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (blockIdx.x % ntiles == 0 && e < E) {
        const size_t st = ((size_t)(blockIdx.x / ntiles) * E + e) * (K - 1);
#pragma unroll
        for (int k = 0; k < K - 1; ++k) cs0[st + k] = state ? state[st + k] : 0.0f;
    }
    conv_fwd_tile<ST, true>(seqlen, ntiles, xz, cw, cb, state, state, xc, start);
}

// Conv backward over one time tile [t0, t0 + n) of one (sequence, channel):
//   pre_t = bias + sum_k w[k] x_{t-K+1+k} (recomputed), dpre_t = dxc_t silu'(pre_t)
//   dw[k] += dpre_t x_{t-K+1+k}, dbias += dpre_t  (the tile's steps)
//   dx_j = sum_{t=j}^{j+K-1} w[j-t+K-1] dpre_t    (t < seqlen; the tile's inputs j)
// dx_j needs dpre at t up to j+K-1, past the tile's end: the tile recomputes
// the dpre of the K-1 steps after it (reading xz and dxc there), so every
// dx_j is written once, by the tile owning input j, to dxz[row][e]; the
// inputs before t = 0 (j < 0) go from tile 0 to the initial-state gradient
// dcs[b][e][j+K-1] (NULL: dropped). Each dx_j is summed from 0 in order of
// increasing t, as a serial walk's shift register would: the same bits
// whatever the tiling. The inputs (t0-K+1 .. t0+n+K-2) and output gradients
// (t0 .. t0+n+K-2) are loaded into registers first, all in flight together.
// Partials of the tile: part_w [b*ntiles + tile][E][K], part_b [..][E]
// (summed over the tile's steps in order; the launcher sums them over
// (sequence, tile) in index order, in two stages).
// ST: episode starts, start [batch][seqlen]: pre_t and dw use the masked
// window of the forward (conv_masked), and a term w dpre_t of dx_j (dcs for
// j < 0) exists only when no start lies in (j, t] (no gradient crosses a
// start); the kept terms are summed in the same order. ST = false compiles
// none of it.
constexpr int CONV_BX = CONV_TILE + 2 * KM1;   // inputs a backward tile reads
constexpr int CONV_BD = CONV_TILE + KM1;       // steps whose dpre it computes
template <bool ST>
__global__ void __launch_bounds__(CONV_THREADS)
conv_bwd_kernel(int seqlen, int ntiles, const act_t *__restrict__ xz, const float *__restrict__ cw,
                const float *__restrict__ cb, const float *__restrict__ cs0,
                const float *__restrict__ dxc, act_t *__restrict__ dxz, float *__restrict__ dcs,
                float *__restrict__ part_w, float *__restrict__ part_b, const unsigned char *__restrict__ start)
{
    const int e = blockIdx.y * CONV_THREADS + threadIdx.x;
    // ST: sf bit i = a start at t0-K+1+i, taken while the warp is whole; a
    // window without one runs the maskless code (the same terms)
    unsigned sf = 0;
    if constexpr (ST) {
        const int ts = (int)(blockIdx.x % ntiles) * CONV_TILE;
        sf = conv_starts<CONV_BX>(ts, min(seqlen, ts + CONV_BD), start + (blockIdx.x / ntiles) * (size_t)seqlen);
    }
    const bool masked = ST && sf != 0;
    if (e >= E) return;
    const size_t b = blockIdx.x / ntiles;
    const int tile = (int)(blockIdx.x % ntiles);
    const int t0 = tile * CONV_TILE;
    const int n = min(CONV_TILE, seqlen - t0);
    const int tend = min(seqlen, t0 + CONV_BD);   // dpre is needed at steps [t0, tend)
    const size_t row0 = b * (size_t)seqlen;
    const size_t st = (b * E + e) * KM1;
    float w[K];
#pragma unroll
    for (int k = 0; k < K; ++k) w[k] = cw[e * K + k];
    const float bias = cb[e];

    float xs[CONV_BX], dps[CONV_BD];   // xs[i]: x at t0-K+1+i; dps[q]: dxc, then dpre, at t0+q
    conv_load(t0, tend, xz + row0 * E2 + e, cs0 + st, xs);
#pragma unroll
    for (int q = 0; q < CONV_BD; ++q) {   // (from tend on: step tend-1 again, discarded; no branches)
        const float v = dxc[(row0 + min(t0 + q, tend - 1)) * E + e];
        dps[q] = t0 + q < tend ? v : 0.0f;
    }
    if (masked) {
#pragma unroll
        for (int q = 0; q < CONV_BD; ++q) {
            if (t0 + q < tend) {
                float xw[K];
                conv_masked(xs, sf, q, xw);
                dps[q] *= dsilu(conv_pre(w, xw, bias));
            }
        }
    } else {
#pragma unroll
        for (int q = 0; q < CONV_BD; ++q)
            if (t0 + q < tend) dps[q] *= dsilu(conv_pre(w, xs + q, bias));
    }

    float gw[K], gb = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) gw[k] = 0.0f;
#pragma unroll
    for (int q = 0; q < CONV_TILE; ++q) {
        if (q < n) {
            gb += dps[q];
            if (masked) {
                float xw[K];
                conv_masked(xs, sf, q, xw);
#pragma unroll
                for (int k = 0; k < K; ++k) gw[k] += dps[q] * xw[k];
            } else {
#pragma unroll
                for (int k = 0; k < K; ++k) gw[k] += dps[q] * xs[q + k];
            }
        }
    }
    // dx of the tile's inputs j = t0 + i (the terms at t >= seqlen do not exist)
#pragma unroll
    for (int i = 0; i < CONV_TILE; ++i) {
        if (i < n) {
            float acc = 0.0f;
            if (masked) {   // input j = t0+i is sf bit i+KM1; t = j+m reads it unless a start is at j+1 .. t
                bool cut = false;
#pragma unroll
                for (int m = 0; m < K; ++m) {
                    if (m > 0) cut = cut || start_at(sf, i + KM1 + m);
                    if (t0 + i + m < seqlen && !cut) acc += w[KM1 - m] * dps[i + m];
                }
            } else {
#pragma unroll
                for (int m = 0; m < K; ++m)
                    if (t0 + i + m < seqlen) acc += w[KM1 - m] * dps[i + m];
            }
            dxz[(row0 + t0 + i) * E2 + e] = from_f32<act_t>(acc);
        }
    }
    // inputs j = a - (K-1) < 0: their terms are t = 0 .. a (tile 0: dps[t])
    if (tile == 0 && dcs) {
#pragma unroll
        for (int a = 0; a < KM1; ++a) {
            float acc = 0.0f;
            bool cut = false;   // ST: t reads input j < 0 unless a start is at 0 .. t (sf index KM1 + t)
#pragma unroll
            for (int t = 0; t <= a; ++t) {
                if (masked) cut = cut || start_at(sf, KM1 + t);
                if (t < seqlen && !cut) acc += w[a - t] * dps[t];
            }
            dcs[st + a] = acc;
        }
    }
    const size_t p = b * ntiles + tile;
#pragma unroll
    for (int k = 0; k < K; ++k) part_w[(p * E + e) * K + k] = gw[k];
    part_b[p * E + e] = gb;
}
