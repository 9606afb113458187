// mg_train_norm.cuh: the RMSNorm of the training path, the same for every
// arch: the bias rows that start the input projection, the forward that
// saves 1/rms (its row is mg_rms_row.cuh, the inference one), the backward
// with its weight-gradient partials, and the in-order sum of partials that
// finishes every per-parameter reduction.
// Written against NAME_common.cuh (D, NORM_*, act_t, store4) and the
// NORMB_ROWS, RED_THREADS of NAME_backward.cu; included inside the anonymous
// namespace of NAME_backward.cu, so it includes nothing itself.

// h[row][:] = bias (before the input GEMM accumulates u . W^T into h).
__global__ void __launch_bounds__(RED_THREADS)
bias_rows_train_kernel(size_t n, const float *__restrict__ bias, float *__restrict__ h)
{
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * RED_THREADS)
        h[i] = bias[i % D];
}

// y[row] = h[row] * r * w, r = rsqrt(mean(h[row]^2) + eps), and rstd[row] = r.
// NORM_ROWS rows a block (threadIdx.y), NORM_ITERS float4 per thread, warp
// butterflies then warps in order (as the inference RMSNorm). hcopy (NULL:
// none) gets the row as loaded: the training forward's next residual
// stream, which the out_proj GEMM then accumulates into, copied here
// instead of by a separate copy of the whole stream (one launch and one
// read of h less per layer; the same bytes).
template <typename OutT>
__global__ void __launch_bounds__(NORM_THREADS * NORM_ROWS)
rmsnorm_fwd_kernel(const float *__restrict__ h, const float *__restrict__ w, OutT *__restrict__ y,
                   float *__restrict__ rstd, float *__restrict__ hcopy, int rows)
{
    const size_t row = (size_t)blockIdx.x * NORM_ROWS + threadIdx.y;
    if (row >= (size_t)rows) return;   // the last block's spare rows (NORM_ROWS > 1: no barrier below)
    __shared__ float part[NORM_WARPS];
    float4 v[NORM_ITERS];
    const float r = rms_load(reinterpret_cast<const float4 *>(h + row * D), v, part);
    if (threadIdx.x == 0) rstd[row] = r;
    if (hcopy) {
        float4 *cr = reinterpret_cast<float4 *>(hcopy + row * D);
#pragma unroll
        for (int i = 0; i < NORM_ITERS; ++i) {
            const int c = threadIdx.x + i * NORM_THREADS;
            if (c < NORM_VECS) cr[c] = v[i];
        }
    }
    rms_store(y, row, w, v, r);
}

// RMSNorm backward over NORMB_ROWS rows per block (grid = ceil(rows/NORMB_ROWS)):
//   dx = r (w dy) - r^3/D h sum(w dy h)
//   dh = dx (accumulate = 0: norm_f) or dh + dx (layer norms: the residual path)
//   dh_act (optional) = (act_t) dh, the GEMM copy of the residual gradient
//   part[block][d] = sum over the block's rows of dy h r (weight gradient partial)
//   dscale (optional, device): dy is read as dy * *dscale (the loss scale)
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_bwd_kernel(int rows, const float *__restrict__ h, const float *__restrict__ w,
                   const float *__restrict__ rstd, const float *__restrict__ dy,
                   const float *__restrict__ dscale, int accumulate,
                   float *__restrict__ dh, act_t *__restrict__ dh_act, float *__restrict__ part)
{
    const float ds = dscale ? *dscale : 1.0f;
    __shared__ float red[2][NORM_WARPS];
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    float4 gw[NORM_ITERS], wv[NORM_ITERS];
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        gw[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        wv[i] = (c < NORM_VECS) ? w4[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const int r0 = blockIdx.x * NORMB_ROWS;
    const int nr = min(NORMB_ROWS, rows - r0);
    // The next row's h, dy, r and (accumulate) dh are loaded before this
    // row's arithmetic and barrier, so a block walking its rows waits on
    // memory once rather than once or twice per row (the values and the
    // arithmetic are unchanged; a block reads and writes only its own rows
    // of dh, each row read before it is written).
    float4 hn[NORM_ITERS], gn[NORM_ITERS], on[NORM_ITERS];
    float rn = 0.0f;
    const auto load_row = [&](int rr) {
        const size_t row = (size_t)(r0 + rr);
        const float4 *hr = reinterpret_cast<const float4 *>(h + row * D);
        const float4 *dr = reinterpret_cast<const float4 *>(dy + row * D);
        const float4 *hd = reinterpret_cast<const float4 *>(dh + row * D);
        rn = rstd[row];
#pragma unroll
        for (int i = 0; i < NORM_ITERS; ++i) {
            const int c = threadIdx.x + i * NORM_THREADS;
            hn[i] = (c < NORM_VECS) ? hr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            gn[i] = (c < NORM_VECS) ? dr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            on[i] = (accumulate && c < NORM_VECS) ? hd[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    if (nr > 0) load_row(0);
    for (int rr = 0; rr < nr; ++rr) {
        const size_t row = (size_t)(r0 + rr);
        const float r = rn;
        float4 hv[NORM_ITERS], gv[NORM_ITERS], ov[NORM_ITERS];
#pragma unroll
        for (int i = 0; i < NORM_ITERS; ++i) { hv[i] = hn[i]; gv[i] = gn[i]; ov[i] = on[i]; }
        if (rr + 1 < nr) load_row(rr + 1);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < NORM_ITERS; ++i) {
            gv[i].x *= ds; gv[i].y *= ds; gv[i].z *= ds; gv[i].w *= ds;
            dot += gv[i].x * wv[i].x * hv[i].x + gv[i].y * wv[i].y * hv[i].y +
                   gv[i].z * wv[i].z * hv[i].z + gv[i].w * wv[i].w * hv[i].w;
            gw[i].x += gv[i].x * hv[i].x * r; gw[i].y += gv[i].y * hv[i].y * r;
            gw[i].z += gv[i].z * hv[i].z * r; gw[i].w += gv[i].w * hv[i].w * r;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(FULL_MASK, dot, o);
        if ((threadIdx.x & 31) == 0) red[rr & 1][threadIdx.x >> 5] = dot;
        __syncthreads();   // one barrier per row: red is double-buffered
        float tot = 0.0f;
#pragma unroll
        for (int i = 0; i < NORM_WARPS; ++i) tot += red[rr & 1][i];
        const float k3 = r * r * r * tot / (float)D;
        float4 *ho = reinterpret_cast<float4 *>(dh + row * D);
#pragma unroll
        for (int i = 0; i < NORM_ITERS; ++i) {
            const int c = threadIdx.x + i * NORM_THREADS;
            if (c < NORM_VECS) {
                float4 o = ov[i];   // dh's row (accumulate) or 0
                o.x += r * wv[i].x * gv[i].x - k3 * hv[i].x;
                o.y += r * wv[i].y * gv[i].y - k3 * hv[i].y;
                o.z += r * wv[i].z * gv[i].z - k3 * hv[i].z;
                o.w += r * wv[i].w * gv[i].w - k3 * hv[i].w;
                ho[c] = o;
                if (dh_act) store4(dh_act + row * D + 4 * c, o);
            }
        }
    }
    float *pr = part + (size_t)blockIdx.x * D;
#pragma unroll
    for (int i = 0; i < NORM_ITERS; ++i) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_VECS) store4(pr + 4 * c, gw[i]);
    }
}

// Up to RED_MAX_SEGS sums of partial rows in one launch per stage
// (sum_parts below): segment k sums column i < n[k] of part[k] (pstride[k]
// floats a row) into out[k][i]; the flattened column c of the grid is
// segment k's column c - start[k]. One segment is a plain sum. Why several:
// the Mamba-1 backward sums A_log, D and dt_bias (and the conv weight and
// bias) over the same rows, and at short windows each launch costs more
// than its work.
constexpr int RED_MAX_SEGS = 4;
struct red_segs {
    float *part[RED_MAX_SEGS];
    float *out[RED_MAX_SEGS];
    size_t pstride[RED_MAX_SEGS];
    int start[RED_MAX_SEGS];   // first flattened column of each segment
    int ncols;                 // columns in all
    int nseg;
};
// The segment of flattened column c: its part, row stride and output, and
// c's column i within it. Selected with constant indices (an unrolled walk)
// so that the parameter struct is read in place, not copied to local
// memory for a runtime index.
struct red_seg {
    float *part;
    float *out;
    size_t pstride;
    int i;
};
__device__ __forceinline__ red_seg red_seg_of(const red_segs s, int c)
{
    red_seg r = { s.part[0], s.out[0], s.pstride[0], c - s.start[0] };
#pragma unroll
    for (int k = 1; k < RED_MAX_SEGS; ++k)
        if (k < s.nseg && c >= s.start[k]) r = { s.part[k], s.out[k], s.pstride[k], c - s.start[k] };
    return r;
}

// The two per-column sums of the reductions below (and of their fused form,
// mg_red_jobs.cuh), one definition so that every form adds in the same order.
// sum_rows: sum_{p < nparts} part[p * pstride + i], p in order.
__device__ __forceinline__ float sum_rows(const float *__restrict__ part, int nparts, size_t pstride, int i)
{
    float acc = 0.0f;
    for (int p = 0; p < nparts; ++p) acc += part[(size_t)p * pstride + i];
    return acc;
}
// sum_group: rows p0 .. p0 + G - 1 (those below nparts) of the column at
// pp = row p0's entry, summed in row order into row p0. Loads are issued
// together (unrolled), then added in order.
template <int G>
__device__ __forceinline__ void sum_group(float *pp, size_t pstride, int p0, int nparts)
{
    float v[G];
#pragma unroll
    for (int q = 0; q < G; ++q) v[q] = p0 + q < nparts ? pp[q * pstride] : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < G; ++q)
        if (p0 + q < nparts) acc += v[q];
    *pp = acc;
}

// out[i] = sum_{p < nparts} part[p * pstride + i], p in order (the last
// stage of every per-parameter reduction: sum_parts below), pstride scaled
// by gmul (the first stage's group size, or 1).
__global__ void __launch_bounds__(RED_THREADS)
reduce_parts_kernel(const red_segs s, int nparts, int gmul)
{
    const int c = blockIdx.x * RED_THREADS + threadIdx.x;
    if (c >= s.ncols) return;
    const red_seg g = red_seg_of(s, c);
    g.out[g.i] = sum_rows(g.part, nparts, g.pstride * gmul, g.i);
}

// First stage of a long sum of partials, in place: the row starting each
// group of G consecutive rows becomes the group's sum, in row order (column
// i of group g is read and written by one thread only). Loads are issued
// together (unrolled), then added in order. Grid (ngroups, columns).
template <int G>
__global__ void __launch_bounds__(RED_THREADS)
reduce_groups_kernel(const red_segs s, int nparts)
{
    const int c = blockIdx.y * RED_THREADS + threadIdx.x;
    if (c >= s.ncols) return;
    const red_seg g = red_seg_of(s, c);
    const int p0 = blockIdx.x * G;
    sum_group<G>(g.part + (size_t)p0 * g.pstride + g.i, g.pstride, p0, nparts);
}

// Partials summed per thread by reduce_groups_kernel in the per-parameter
// reductions (the Mamba-1 conv gradients use CONV_PART_GROUP).
constexpr int RED_PART_GROUP = 32;

// The segments' sums over nparts rows (the parts are scratch: with more
// than G rows they are overwritten), in a fixed order: groups of G rows in
// row order (reduce_groups_kernel), then the groups in order
// (reduce_parts_kernel). Why two stages: one thread walking hundreds of rows
// waits on its loads batch after batch (a single block took 14 us per call,
// 18 calls a step, in the Mamba-1 RL training step on the H200: the norm
// weights' 1024 row partials, the scan's per-sequence sums); the groups put
// ngroups times the threads on the loads. Deterministic: no atomics, the
// same order every run, and a column's bits do not depend on the segments
// launched with it.
template <int G>
static cudaError_t sum_parts_segs(const red_segs &s, int nparts, cudaStream_t st)
{
    const unsigned cols = (unsigned)((s.ncols + RED_THREADS - 1) / RED_THREADS);
    int gmul = 1;
    if (nparts > G) {
        const int ngroups = (nparts + G - 1) / G;
        reduce_groups_kernel<G><<<dim3(ngroups, cols), RED_THREADS, 0, st>>>(s, nparts);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        nparts = ngroups;
        gmul = G;
    }
    reduce_parts_kernel<<<cols, RED_THREADS, 0, st>>>(s, nparts, gmul);
    return cudaGetLastError();
}

// Segment nseg of s: part (pstride floats a row, n columns) summed into out.
static void red_segs_add(red_segs &s, float *part, size_t pstride, int n, float *out)
{
    if (s.nseg == 0) s.ncols = 0;
    s.part[s.nseg] = part;
    s.out[s.nseg] = out;
    s.pstride[s.nseg] = pstride;
    s.start[s.nseg] = s.ncols;
    s.ncols += n;
    ++s.nseg;
}

// One sum (the single-segment form of sum_parts_segs).
template <int G>
static cudaError_t sum_parts(float *part, int nparts, size_t pstride, int n, float *out, cudaStream_t st)
{
    red_segs s = {};
    red_segs_add(s, part, pstride, n, out);
    return sum_parts_segs<G>(s, nparts, st);
}
