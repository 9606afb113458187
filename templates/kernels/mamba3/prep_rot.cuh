// mg_m3_prep_rot.cuh: the per-token maps and the rotary angle of the Mamba-3
// SISO forward for training, in two kernels whose per-head k and q are
// written once, already rotated. The inference split path writes them
// unrotated (prep_kernel) and rotates them in place (angles_kernel): at the
// training shapes that read and write of k and q is most of the two kernels'
// memory traffic (4 f32 streams of tokens x H x N), so training takes the
// angles first, as a table of reduced angles, and rotates in prep.
// The chunked training scans go one step further: they build k', q' in
// their stage from the in_proj row, the token's 1/rms (prep_scalars_kernel)
// and the angle table (kq_build4 below), so no per-head row is written or
// read at all on that path.
// The table, rot [tok][H][S] f32, holds each rotation's angle as the f32 in
// [-pi, pi) its cosine and sine are taken of (angle_reduced): a reader
// takes them with rot_cos_sin, the same bits as angle_cos_sin of the f64
// angle. Why not the (cos, sin) pairs: half the bytes (written once, read
// by both chunked scans, the backward twice), for one sincosf per use.
// Included inside the anonymous namespace of NAME_backward.cu after
// mg_m3_prep.cuh and mg_m3_angles.cuh (whose helpers it uses), before the
// chunked scans (which use kq_build4).
static_assert(N % 2 == 0, "prep_rot_kernel stores (even, odd) pairs");

// One entry of k (or q) before the rotation, as prep_rot_kernel and
// kq_build4 build it: x the raw in_proj entry of the group's B (C) row, r
// the row's 1/rms, w the norm weight, b the head's bias. One expression for
// both, so that they give the same bits.
__device__ __forceinline__ float bc_entry(float x, float r, float w, float b) { return x * r * w + b; }

// ---------------------------------------------------------------------------
// angles_cs_kernel: angles_kernel's walk (doc/math.md steps 6-7, the same
// grid, thread map, f64 slice sums and wrapped f64 walk: the same angles to
// the bit) with dt_t[h] = softplus(dd_dt + dt_bias) taken from the in_proj
// row (head_scalars' expression: prep's dt to the bit), writing every
// rotation's reduced angle into rot [tok][H][S] (angle_reduced) instead of
// rotating k and q. DTF: dt_t[h] and tanh of the angle input read from dt
// [tok][H] and tnh [tok][S] (prep_scalars_kernel's outputs, the same
// expressions: the same values), where the walk took softplus of the raw dt
// entry in each of a head's S threads and tanh of the angle input in each
// of H heads' blocks, at every step of both passes.
// angle_out (optional) may alias angle_in, as in angles_kernel. STARTS:
// start [batch][seqlen] restarts the sum, as in angles_kernel.
// ---------------------------------------------------------------------------
// A token's inputs to its increment when prep ran first: tanh of the angle
// input and dt, both f32.
struct ang_tdt {
    float tn, dt;
};

template <bool STARTS, bool DTF>
__global__ void __launch_bounds__(ANGLE_THREADS)
angles_cs_kernel(int seqlen, const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                 const float *__restrict__ dt, const float *__restrict__ tnh, const float *angle_in,
                 float *angle_out, float *__restrict__ rot, const unsigned char *__restrict__ start)
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

    const auto ld = [&](int t) {   // token t's tanh and dt (DTF), or its angle input and raw dt entry
        if constexpr (DTF) {
            return ang_tdt{tnh[(row0 + t) * S + a], dt[(row0 + t) * H + h]};
        } else {
            const act_t *pr = proj + (row0 + t) * NP;
            return ang_raw<act_t>{pr[OFF_ANG + a], pr[OFF_DT + h]};
        }
    };
    const auto inc = [&](const auto &x) {   // theta_t - theta_{t-1} before the wrap
        if constexpr (DTF) return angle_inc(x.tn, x.dt);
        else return angle_inc(ang_tanh_of(x.ang), row_dt_of(x.dt, dtb));
    };
    const auto is_start = [&](int t) { return start[row0 + t] != 0; };
    // Walk the slice from its starting angle; one reduced angle per token.
    double th = angle_slice_start<STARTS>(th0, t0, t1, a, sl, part, pflag, ld, inc, is_start);
    th = angle_slice_walk<STARTS>(th, t0, t1, ld, inc, is_start, [&](int t, double tht) {
        rot[((row0 + t) * H + h) * S + a] = angle_reduced(tht);
    });
    if (angle_out && t1 == seqlen && t1 > t0) angle_out[st] = (float)th;
}

// ---------------------------------------------------------------------------
// prep_rot_kernel: prep_kernel (one block of PREP_THREADS per token, the same
// per-head scalars and BCNorm'd k, q) with the rotation of angles_kernel
// applied before the store: thread pairs (2a, 2a+1) of a head, pair a < S
// rotated by rot[tok][h][a] (rot_cos_sin, rotate_pair: angles_kernel's
// expressions), the
// rest stored as they are, in kq_t (mg_m3_train_util.cuh: the storage type).
// Each thread stores a pair, consecutive threads on consecutive pairs
// (coalesced).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(PREP_THREADS)
prep_rot_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt_bias,
                const float *__restrict__ Bnw, const float *__restrict__ Cnw,
                const float *__restrict__ Bbias, const float *__restrict__ Cbias,
                const float *__restrict__ rot, float *__restrict__ dt, float *__restrict__ adt,
                float *__restrict__ lam, kq_t *__restrict__ k, kq_t *__restrict__ q)
{
    __shared__ float rB[G], rC[G];
    const size_t tok = blockIdx.x;
    const act_t *pr = proj + tok * NP;
    token_maps(pr, tok, dt_bias, rB, rC, dt, adt, lam);
    __syncthreads();
    kq_t *kt = k + tok * (size_t)(H * N);
    kq_t *qt = q + tok * (size_t)(H * N);
    const float *rt = rot + tok * (size_t)(H * S);
    for (int i = threadIdx.x; i < H * N / 2; i += PREP_THREADS) {
        const int h = i / (N / 2), a = i % (N / 2), n = 2 * a, g = h / HPG;
        const int e = h * N + n;
        float2 kv, qv;
        kv.x = bc_entry(to_f32(pr[OFF_B + g * N + n]), rB[g], Bnw[n], Bbias[e]);
        kv.y = bc_entry(to_f32(pr[OFF_B + g * N + n + 1]), rB[g], Bnw[n + 1], Bbias[e + 1]);
        qv.x = bc_entry(to_f32(pr[OFF_C + g * N + n]), rC[g], Cnw[n], Cbias[e]);
        qv.y = bc_entry(to_f32(pr[OFF_C + g * N + n + 1]), rC[g], Cnw[n + 1], Cbias[e + 1]);
        if (a < S) {
            float c, sn;
            rot_cos_sin(rt[h * S + a], c, sn);
            kv = rotate_pair(c, sn, kv);
            qv = rotate_pair(c, sn, qv);
        }
        st2_from_f32(kt + 2 * i, kv);
        st2_from_f32(qt + 2 * i, qv);
    }
}

// ---------------------------------------------------------------------------
// prep_scalars_kernel: prep_rot_kernel's per-token part alone (token_maps:
// the per-head dt, A*dt, lambda, and the 1/rms of each group's raw B and C
// rows, written to rbc [tok][2G]: B's G values, then C's), for the chunked
// training scans, which build k', q' themselves (kq_build4). Same grid and
// block as prep_rot_kernel, the same values to the bit. tnh (NULL: none)
// gets the tanh of the token's S angle inputs, for angles_cs_kernel<DTF>.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(PREP_THREADS)
prep_scalars_kernel(const act_t *__restrict__ proj, const float *__restrict__ dt_bias, float *__restrict__ dt,
                    float *__restrict__ adt, float *__restrict__ lam, float *__restrict__ rbc,
                    float *__restrict__ tnh)
{
    __shared__ float rB[G], rC[G];
    const size_t tok = blockIdx.x;
    token_maps(proj + tok * NP, tok, dt_bias, rB, rC, dt, adt, lam);
    if (tnh)
        for (int a = threadIdx.x; a < S; a += PREP_THREADS) tnh[tok * S + a] = ang_tanh_of(proj[tok * NP + OFF_ANG + a]);
    __syncthreads();
    for (int g = threadIdx.x; g < G; g += PREP_THREADS) {
        rbc[tok * (2 * G) + g] = rB[g];
        rbc[tok * (2 * G) + G + g] = rC[g];
    }
}

// The 128-byte lines kq_build4 reads for a token and head (the table's row,
// the group's B and C entries): KQB_LINES of them, line w given by
// kq_build_line, for the chunked scans' prefetch of the next chunk.
constexpr int KQB_LCS = S * 4 / 128 > 0 ? S * 4 / 128 : 1;
constexpr int KQB_LBC = N * (int)sizeof(act_t) / 128 > 0 ? N * (int)sizeof(act_t) / 128 : 1;
constexpr int KQB_LINES = KQB_LCS + 2 * KQB_LBC;

// What the chunked training scans build k', q' from (kq_build4): the
// in_proj rows, prep_scalars_kernel's rbc, angles_cs_kernel's angle table and the
// layer's BCNorm weights and per-head biases.
// (KQB_VEC_BC: a token's row and the B, C offsets are multiples of 4
// entries, so 4-entry vectors of them are aligned; kqb_load below)
constexpr bool KQB_VEC_BC = N % 4 == 0 && NP % 4 == 0 && OFF_B % 4 == 0 && OFF_C % 4 == 0;
struct kq_build {
    static constexpr bool BUILD = true;   // (mg_m3_chunked_body.cuh's source policy)
    static constexpr int LINES = KQB_LINES;
    // Whether a stage of cq rows (row stride ldq of its Kw tile) takes the
    // raw form (kq_stage_raw, kq_stage_finish): the raw B and C rows in
    // 4-entry copies, and the angles and 1/rms, (S + 2) floats a row, in
    // the Kw tile, which is free during the stage.
    __host__ __device__ static constexpr bool raw_fits(int cq, int ldq)
    {
        return raw_fits_bytes(cq, N * ldq * (int)sizeof(op_t));
    }
    // The row stride of v staged in its natural layout [cq][P + pad] by the
    // chunked forward (ck_vnat), or 0 where it does not take it: 16-bit
    // storage (the transposed tile forms are ldmatrix.trans; f32's are
    // scalar loads), rows of 4-entry vectors, p >= cq.
    __host__ __device__ static constexpr int vnat_ld(int cq, int p)
    {
        return sizeof(op_t) == 2 && p >= cq && p % 8 == 0 && NP % 4 == 0 && OFF_X % 4 == 0 ? p + 8 : 0;
    }
    // ... in `bytes` of scratch (the backward's M and W tiles)
    __host__ __device__ static constexpr bool raw_fits_bytes(int cq, int bytes)
    {
        return KQB_VEC_BC && cq * (S + 2) * 4 <= bytes;
    }
    const act_t *proj;                        // [tok][NP]
    const float *rbc;                         // [tok][2G]
    const float *rot;                         // [tok][H][S] reduced angles
    const float *Bnw, *Cnw, *Bbias, *Cbias;   // [N], [N], [H][N], [H][N]
};

__device__ __forceinline__ const char *kq_build_line(const kq_build &s, size_t tok, int h, int w)
{
    const int g = h / HPG;
    if (w < KQB_LCS) return reinterpret_cast<const char *>(s.rot + (tok * H + h) * S) + 128 * w;
    const int off = w < KQB_LCS + KQB_LBC ? OFF_B : OFF_C;
    const int l = w < KQB_LCS + KQB_LBC ? w - KQB_LCS : w - KQB_LCS - KQB_LBC;
    return reinterpret_cast<const char *>(s.proj + tok * NP + off + g * N) + 128 * l;
}

// What kq_stage_build reads for one item (token, head, entries n..n+3),
// loaded before any of it is used: the group's raw B and C entries, the
// token's two 1/rms and the reduced angles of pairs n/2, n/2 + 1 (their
// cosines and sines are taken in kqb_make). Whole vectors where the layout
// allows (KQB_VEC_BC: a token's row and the B, C offsets multiples of 4
// entries; KQB_VEC_CS: S even, so that the two pairs are both rotated or
// both not and their table entries are 8-byte aligned), else entry by
// entry; a pair at or past S loads a valid entry (pair S - 1 or S - 2)
// that kqb_make does not use: no load waits on a condition.
constexpr bool KQB_VEC_CS = S % 2 == 0;
static_assert(S >= 1 && (!KQB_VEC_CS || S >= 2), "kqb_load: a valid pair to load");
struct kqb_in {
    float4 b, c;
    float2 ra;         // the reduced angles of pairs n/2 and n/2 + 1
    float rb, rc;
};
__device__ __forceinline__ kqb_in kqb_load(const kq_build &s, size_t tok, int h, int n)
{
    const int g = h / HPG;
    const act_t *pr = s.proj + tok * NP;
    kqb_in x;
    if constexpr (KQB_VEC_BC) {
        x.b = ld4_f32(pr + OFF_B + g * N + n);
        x.c = ld4_f32(pr + OFF_C + g * N + n);
    } else {
        x.b = make_float4(to_f32(pr[OFF_B + g * N + n]), to_f32(pr[OFF_B + g * N + n + 1]),
                          to_f32(pr[OFF_B + g * N + n + 2]), to_f32(pr[OFF_B + g * N + n + 3]));
        x.c = make_float4(to_f32(pr[OFF_C + g * N + n]), to_f32(pr[OFF_C + g * N + n + 1]),
                          to_f32(pr[OFF_C + g * N + n + 2]), to_f32(pr[OFF_C + g * N + n + 3]));
    }
    x.rb = s.rbc[tok * (2 * G) + g];
    x.rc = s.rbc[tok * (2 * G) + G + g];
    const float *rt = s.rot + (tok * H + h) * S;
    if constexpr (KQB_VEC_CS) {
        x.ra = *reinterpret_cast<const float2 *>(rt + min(n / 2, S - 2));
    } else {
        x.ra = make_float2(rt[min(n / 2, S - 1)], rt[min(n / 2 + 1, S - 1)]);
    }
    return x;
}

// prep_rot_kernel's values from a loaded item (the same expressions in the same
// order: bc_entry, then rotate_pair for a pair below S), the weights and
// biases read here (the same 16-byte-aligned vectors for every token: L1).
__device__ __forceinline__ void kqb_make(const kq_build &s, const kqb_in &x, int h, int n, float4 &k4, float4 &q4)
{
    const int e = h * N + n;
    const float4 bw = *reinterpret_cast<const float4 *>(s.Bnw + n), cw = *reinterpret_cast<const float4 *>(s.Cnw + n);
    const float4 bb = *reinterpret_cast<const float4 *>(s.Bbias + e);
    const float4 cb = *reinterpret_cast<const float4 *>(s.Cbias + e);
    float2 kv[2], qv[2];
    kv[0] = make_float2(bc_entry(x.b.x, x.rb, bw.x, bb.x), bc_entry(x.b.y, x.rb, bw.y, bb.y));
    kv[1] = make_float2(bc_entry(x.b.z, x.rb, bw.z, bb.z), bc_entry(x.b.w, x.rb, bw.w, bb.w));
    qv[0] = make_float2(bc_entry(x.c.x, x.rc, cw.x, cb.x), bc_entry(x.c.y, x.rc, cw.y, cb.y));
    qv[1] = make_float2(bc_entry(x.c.z, x.rc, cw.z, cb.z), bc_entry(x.c.w, x.rc, cw.w, cb.w));
    if (n / 2 < S) {
        float c, sn;
        rot_cos_sin(x.ra.x, c, sn);
        kv[0] = rotate_pair(c, sn, kv[0]);
        qv[0] = rotate_pair(c, sn, qv[0]);
    }
    if (n / 2 + 1 < S) {
        float c, sn;
        rot_cos_sin(x.ra.y, c, sn);
        kv[1] = rotate_pair(c, sn, kv[1]);
        qv[1] = rotate_pair(c, sn, qv[1]);
    }
    k4 = make_float4(kv[0].x, kv[0].y, kv[1].x, kv[1].y);
    q4 = make_float4(qv[0].x, qv[0].y, qv[1].x, qv[1].y);
}

// k' and q' entries n..n+3 (n a multiple of 4: two rotation pairs) of token
// tok, head h, in f32: prep_rot_kernel's values before its store rounds
// them to kq_t (the same expressions on the same inputs: bc_entry, then
// rotate_pair by the cosine and sine of the table's angle for a pair a < S). A stage of the
// storage type (op_t == kq_t) holding them rounded holds exactly the rows
// prep_rot_kernel would have written.
__device__ __forceinline__ void kq_build4(const kq_build &s, size_t tok, int h, int n, float4 &k4, float4 &q4)
{
    kqb_make(s, kqb_load(s, tok, h, n), h, n, k4, q4);
}

// A chunk's q', k' built into a chunked scan's stage (Qs, Ks: rows of
// stride ldn, op_t, the storage type): cq rows from token row on, the rows
// at or past len zeros (they build the chunk's first token, a valid one,
// and store 0), nt threads; the store rounds as prep_rot_kernel's does.
// A thread takes its items `inflight` at a time (1..KQB_INFLIGHT_MAX), all
// their loads issued before any is used (kqb_load), so that each group
// waits on memory once: 2 in the backward (more, and it spilled), 3 in the
// forward (the stage is most of its stall time; 4 spilled).
// (cq, nt, inflight are the callers' constants, arguments rather than
// template arguments so that the body's call, dependent on its source type,
// needs no declaration in the inference file.)
constexpr int KQB_INFLIGHT_MAX = 4;
__device__ __forceinline__ void kq_stage_build(const kq_build &s, op_t *Qs, op_t *Ks, int ldn, size_t row, int len,
                                               int h, int tid, int cq, int nt, int inflight = 2)
{
    static_assert(N % 4 == 0, "the stage is built four entries at a time");
    const int items = cq * (N / 4);
#pragma unroll 1
    for (int idx = tid; idx < items; idx += inflight * nt) {
        kqb_in x[KQB_INFLIGHT_MAX];
        int id[KQB_INFLIGHT_MAX];
#pragma unroll
        for (int u = 0; u < KQB_INFLIGHT_MAX; ++u) {
            if (u >= inflight) continue;
            // (an item past the end: the group's first built again, stored once)
            id[u] = idx + u * nt < items ? idx + u * nt : idx;
            const int i = id[u] / (N / 4), n = 4 * (id[u] % (N / 4));
            x[u] = kqb_load(s, row + (i < len ? i : 0), h, n);
        }
#pragma unroll
        for (int u = 0; u < KQB_INFLIGHT_MAX; ++u) {
            if (u >= inflight || (u > 0 && id[u] == idx)) continue;
            const int i = id[u] / (N / 4), n = 4 * (id[u] % (N / 4));
            float4 k4, q4;
            kqb_make(s, x[u], h, n, k4, q4);
            if (i >= len) k4 = q4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            op_st4(Qs + i * ldn + n, q4);
            op_st4(Ks + i * ldn + n, k4);
        }
    }
}

// The raw form of the stage build, for a kernel with room for it
// (kq_build::raw_fits): kq_stage_raw copies, without passing through
// registers (cp.async), the group's raw B rows into Ks and C rows into Qs
// (rows at or past len zero-filled), and head h's angles [cq][S] and the
// token's two 1/rms [cq][2] into scr; after cp_async_wait_all and a
// barrier, kq_stage_finish turns each item (token, four entries) into
// k', q' in place (kqb_make on the copied values: kq_stage_build's
// values, bit for bit; rows at or past len stay the zeros it stores).
// Why: every load of the stage is then in flight at once, where the build
// waits on memory once per group of items it holds in registers.
__device__ __forceinline__ void kq_stage_raw(const kq_build &s, op_t *Qs, op_t *Ks, int ldn, float *scr, size_t row,
                                             int len, int h, int tid, int cq, int nt)
{
    static_assert(sizeof(act_t) == sizeof(op_t), "the raw rows are copied in the storage type");
    const int g = h / HPG;
#pragma unroll 4
    for (int idx = tid; idx < cq * (N / 4); idx += nt) {
        const int i = idx / (N / 4), n = 4 * (idx % (N / 4));
        const bool in = i < len;
        const op_t *pr = reinterpret_cast<const op_t *>(s.proj) + (row + (in ? i : 0)) * NP + g * N + n;
        cp_async4(Ks + i * ldn + n, pr + OFF_B, in);
        cp_async4(Qs + i * ldn + n, pr + OFF_C, in);
    }
    if constexpr (S % 4 == 0) {
        // (a token's S angles are 16-byte aligned: four at a time)
#pragma unroll 4
        for (int idx = tid; idx < cq * (S / 4); idx += nt) {
            const int i = idx / (S / 4), a = 4 * (idx % (S / 4));
            const bool in = i < len;
            cp_async_cg16(scr + i * S + a, s.rot + ((row + (in ? i : 0)) * H + h) * S + a, in);
        }
    } else {
#pragma unroll 4
        for (int idx = tid; idx < cq * S; idx += nt) {
            const int i = idx / S, a = idx % S;
            const bool in = i < len;
            cp_async_ca<4>(scr + idx, s.rot + ((row + (in ? i : 0)) * H + h) * S + a, in);
        }
    }
    for (int idx = tid; idx < cq * 2; idx += nt) {
        const int i = idx / 2, w = idx % 2;
        const bool in = i < len;
        cp_async_ca<4>(scr + cq * S + idx, s.rbc + (row + (in ? i : 0)) * (2 * G) + w * G + g, in);
    }
}
__device__ __forceinline__ void kq_stage_finish(const kq_build &s, op_t *Qs, op_t *Ks, int ldn, const float *scr,
                                                int len, int h, int tid, int cq, int nt)
{
    for (int idx = tid; idx < len * (N / 4); idx += nt) {
        const int i = idx / (N / 4), n = 4 * (idx % (N / 4));
        kqb_in x;
        x.b = ld4_f32(Ks + i * ldn + n);
        x.c = ld4_f32(Qs + i * ldn + n);
        x.rb = scr[cq * S + 2 * i];
        x.rc = scr[cq * S + 2 * i + 1];
        const float *rt = scr + i * S;
        if constexpr (KQB_VEC_CS) {
            const int m = min(n / 2, S - 2);
            x.ra = make_float2(rt[m], rt[m + 1]);
        } else {
            x.ra = make_float2(rt[min(n / 2, S - 1)], rt[min(n / 2 + 1, S - 1)]);
        }
        float4 k4, q4;
        kqb_make(s, x, h, n, k4, q4);
        op_st4(Qs + i * ldn + n, q4);
        op_st4(Ks + i * ldn + n, k4);
    }
}
