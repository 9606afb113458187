// mg_m3_tiles.cuh: the 16 x 8 x 16 tile products of the Mamba-3 SISO chunked
// scans (forward and backward), on the tensor cores (mma.sync, bf16/f16
// operands, f32 accumulate) or as f32 FMA (f32 storage: no TF32). The
// engine follows the staged operand type op_t of NAME_common.cuh: the
// overloads below are selected by the operand pointer type. Also the
// chunk's cumulative decay (ck_cumsum), the part of phase B both scans share.
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// The decay exp(x) of an intra-chunk weight (x = cs_t - cs_s <= 0: the W
// entries of the chunked forward scans, the L entries of the backward):
// __expf, the hardware's ex2.approx of x log2 e (error 2 + 1.2|x| ulp; at
// x < -20 the weight is below 2e-9 of its row), where expf's range handling
// around the same ex2 was 4.5% of the fused kernel's and 4.8% of the
// training forward's stall samples (H100 profiles of mamba3_perf; one per
// entry, Q^2/2 a chunk). Forward and backward take it from here, so the
// backward differentiates the weights the forward used. The per-row decays
// (exp of cs, of carry - cs) keep expf.
__device__ __forceinline__ float ck_wdecay(float x) { return __expf(x); }

// V consecutive storage elements as one load or store: aligned to their
// size by default; the chunked backward's rows of eight are 16-byte
// aligned in every dtype (avec<8, 16>: 32 bytes of f32 as two 16-byte
// accesses), where the fused kernel's FV-wide vectors are 16 bytes.
template <int V, int ALIGN = V * (int)sizeof(act_t)> struct alignas(ALIGN) avec {
    act_t e[V];
};

// The staged operands have the storage type (op_t == act_t: f32, bf16 or
// f16), converted with to_f32 / from_f32. Four consecutive values into a
// staged row (16-byte aligned for f32, 8-byte for 16-bit types):
__device__ __forceinline__ void op_st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
__device__ __forceinline__ void op_st4(__nv_bfloat16 *p, float4 v)
{
    reinterpret_cast<__nv_bfloat162 *>(p)[0] = __floats2bfloat162_rn(v.x, v.y);
    reinterpret_cast<__nv_bfloat162 *>(p)[1] = __floats2bfloat162_rn(v.z, v.w);
}
__device__ __forceinline__ void op_st4(__half *p, float4 v)
{
    reinterpret_cast<__half2 *>(p)[0] = __floats2half2_rn(v.x, v.y);
    reinterpret_cast<__half2 *>(p)[1] = __floats2half2_rn(v.z, v.w);
}
static_assert(sizeof(op_t) == sizeof(act_t), "staged operands have the storage type");

// Four consecutive values of the storage type as f32, one 16- or 8-byte
// load: the per-head k', q' rows of the training path (kq_t, the storage
// type) and of inference (f32) staged by the chunked kernels.
struct alignas(8) mg_bf16x4 { __nv_bfloat162 a, b; };
struct alignas(8) mg_f16x4 { __half2 a, b; };
__device__ __forceinline__ float4 ld4_f32(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 ld4_f32(const __nv_bfloat16 *p)
{
    const mg_bf16x4 v = *reinterpret_cast<const mg_bf16x4 *>(p);
    const float2 x = __bfloat1622float2(v.a), y = __bfloat1622float2(v.b);
    return make_float4(x.x, x.y, y.x, y.y);
}
__device__ __forceinline__ float4 ld4_f32(const __half *p)
{
    const mg_f16x4 v = *reinterpret_cast<const mg_f16x4 *>(p);
    const float2 x = __half22float2(v.a), y = __half22float2(v.b);
    return make_float4(x.x, x.y, y.x, y.y);
}

// Two consecutive values as f32 (one 4-byte load for the 16-bit types,
// 8-byte for f32), and two f32 values stored, each rounded to nearest as
// from_f32 rounds it: the (even, odd) rotation pairs of the training path,
// and 2 x 2 blocks of the staged tiles (even columns of padded rows).
__device__ __forceinline__ float2 ld2_f32(const float *p) { return *reinterpret_cast<const float2 *>(p); }
__device__ __forceinline__ float2 ld2_f32(const __nv_bfloat16 *p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
__device__ __forceinline__ float2 ld2_f32(const __half *p) { return __half22float2(*reinterpret_cast<const __half2 *>(p)); }
__device__ __forceinline__ void st2_from_f32(float *p, float2 v) { *reinterpret_cast<float2 *>(p) = v; }
__device__ __forceinline__ void st2_from_f32(__nv_bfloat16 *p, float2 v)
{
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v.x, v.y);
}
__device__ __forceinline__ void st2_from_f32(__half *p, float2 v) { *reinterpret_cast<__half2 *>(p) = __floats2half2_rn(v.x, v.y); }

// The shared-memory address of p (for cp.async and ldmatrix).
__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four consecutive values of the storage type copied from global into
// shared memory without passing through registers (cp.async, sm_80+: 8
// bytes for the 16-bit types, 16 for f32, the alignment ld4_f32 needs);
// zeros when !in (src is then not read, but must be a valid address).
// Why: a staging loop that loads into registers and stores waits on each
// load before its store, so few loads are in flight per thread; these
// copies are all issued before any is waited on (cp_async_wait_all, then
// a barrier, before the stage is read). The bits are the source's, as the
// f32 round trip of ld4_f32 and op_st4 gave for the same type.
// The copies themselves: B bytes (4, 8 or 16) through L1 (cp.async.ca),
// or 16 bytes around it (cp.async.cg: the stage is read from shared memory
// only), zeros when !in. Every cp.async of the kernels goes through these.
template <int B> __device__ __forceinline__ void cp_async_ca(void *dst, const void *src, bool in)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_u32(dst)), "l"(src), "n"(B),
                 "r"(in ? B : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_cg16(void *dst, const void *src, bool in)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(in ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(op_t *dst, const op_t *src, bool in)
{
    cp_async_ca<4 * (int)sizeof(op_t)>(dst, src, in);
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// stage4: four values of a k', q' row (n a multiple of 4) into the stage,
// zeros when !in: copied as they are (cp_async4) when the row has the
// staged type (f32 rows with f32 storage), else converted on load (f32
// rows staged as a 16-bit type). After the stage's
// loop: cp_async_wait_all, then a barrier.
__device__ __forceinline__ void stage4(op_t *dst, const op_t *src, bool in) { cp_async4(dst, src, in); }
template <typename KQ>
__device__ __forceinline__ void stage4(op_t *dst, const KQ *src, bool in)
{
    op_st4(dst, in ? ld4_f32(src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
}

// c += A . B for one 16 x 8 tile, k = 16, in the fragment layout of
// mma.m16n8k16 (lane l: g = l/4, cc = 2*(l%4); c[0], c[1] at row g, columns
// cc, cc+1; c[2], c[3] at row g+8). Operands in shared memory:
//   AT = false: a points at A[row 0][k 0], A row-major [m][k] (stride LDA);
//   AT = true:  a points at A^T[k 0][row 0], i.e. A stored [k][m];
//   BK = false: b points at B^T[col 0][k 0], B stored [n][k] (stride LDB);
//   BK = true:  b points at B[k 0][col 0], B stored [k][n].
// The transposed forms let the backward multiply by a staged matrix's
// transpose without staging a second copy. k runs 0..15 in order for every
// form (fixed summation order).
// The row strides LDA, LDB are arguments of the core forms (tile_mma_row
// below passes its template arguments; the generic tune candidate runtime
// values). f32 operands: FMA from shared memory.
template <bool AT, bool BK>
__device__ __forceinline__ void tile_mma_core(float c[4], const float *a, const float *b, int lane, int LDA, int LDB)
{
    const int g = lane >> 2, cc = (lane & 3) * 2;
    if (!AT && !BK) {
        const float *a0 = a + g * LDA, *a1 = a + (g + 8) * LDA;
        const float *b0 = b + cc * LDB, *b1 = b + (cc + 1) * LDB;
#pragma unroll
        for (int k = 0; k < 16; k += 4) {
            const float4 x0 = *reinterpret_cast<const float4 *>(a0 + k);
            const float4 x1 = *reinterpret_cast<const float4 *>(a1 + k);
            const float4 y0 = *reinterpret_cast<const float4 *>(b0 + k);
            const float4 y1 = *reinterpret_cast<const float4 *>(b1 + k);
            c[0] = fmaf(x0.x, y0.x, c[0]); c[0] = fmaf(x0.y, y0.y, c[0]); c[0] = fmaf(x0.z, y0.z, c[0]); c[0] = fmaf(x0.w, y0.w, c[0]);
            c[1] = fmaf(x0.x, y1.x, c[1]); c[1] = fmaf(x0.y, y1.y, c[1]); c[1] = fmaf(x0.z, y1.z, c[1]); c[1] = fmaf(x0.w, y1.w, c[1]);
            c[2] = fmaf(x1.x, y0.x, c[2]); c[2] = fmaf(x1.y, y0.y, c[2]); c[2] = fmaf(x1.z, y0.z, c[2]); c[2] = fmaf(x1.w, y0.w, c[2]);
            c[3] = fmaf(x1.x, y1.x, c[3]); c[3] = fmaf(x1.y, y1.y, c[3]); c[3] = fmaf(x1.z, y1.z, c[3]); c[3] = fmaf(x1.w, y1.w, c[3]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const float x0 = AT ? a[k * LDA + g] : a[g * LDA + k];
            const float x1 = AT ? a[k * LDA + g + 8] : a[(g + 8) * LDA + k];
            const float y0 = BK ? b[k * LDB + cc] : b[cc * LDB + k];
            const float y1 = BK ? b[k * LDB + cc + 1] : b[(cc + 1) * LDB + k];
            c[0] = fmaf(x0, y0, c[0]);
            c[1] = fmaf(x0, y1, c[1]);
            c[2] = fmaf(x1, y0, c[2]);
            c[3] = fmaf(x1, y1, c[3]);
        }
    }
}

// The fragments come from shared memory by ldmatrix (one instruction per
// operand; .trans for the transposed forms): 8 x 8 blocks of 16-bit values,
// each row 16 bytes and 16-byte aligned (row strides are multiples of 8
// elements, tile corners at multiples of 8). Lane l addresses row l % 8 of
// block l / 8. A's blocks are (rows 0-7, k 0-7), (rows 8-15, k 0-7),
// (rows 0-7, k 8-15), (rows 8-15, k 8-15): a0..a3 of mma.m16n8k16; B's are
// (k 0-7), (k 8-15) of columns 0-7: b0, b1. The same values as element
// loads, so the same products bit for bit.

// The one instruction, per 16-bit operand type (the last argument only
// selects the overload).
__device__ __forceinline__ void mma_16816(float c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned b0, unsigned b1, const __nv_bfloat16 *)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned b0, unsigned b1, const __half *)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16-bit operands (T = __nv_bfloat16 or __half): ldmatrix + mma.sync. The
// two fragment loads are separate helpers so that a row of tiles sharing A
// (tile_mma_row) loads A's once.
template <bool AT, typename T>
__device__ __forceinline__ void frag_a(unsigned (&f)[4], const T *a, int lane, int LDA)
{
    const int r = lane & 7, i = lane >> 3;
    if (!AT) {   // stored [m][k]: block i at rows 8*(i&1), k 8*(i>>1)
        const unsigned pa = smem_u32(a + (r + 8 * (i & 1)) * LDA + 8 * (i >> 1));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]) : "r"(pa) : "memory");
    } else {     // stored [k][m]: block i at k 8*(i>>1), rows 8*(i&1), transposed
        const unsigned pa = smem_u32(a + (r + 8 * (i >> 1)) * LDA + 8 * (i & 1));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]) : "r"(pa) : "memory");
    }
}
template <bool BK, typename T>
__device__ __forceinline__ void frag_b(unsigned (&f)[2], const T *b, int lane, int LDB)
{
    const int r = lane & 7, i = lane >> 3;
    if (!BK) {   // stored [n][k]: block i (lanes 0-15) at k 8*i
        const unsigned pb = smem_u32(b + r * LDB + 8 * (i & 1));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1 }, [%2];\n"
                     : "=r"(f[0]), "=r"(f[1]) : "r"(pb) : "memory");
    } else {     // stored [k][n]: block i at k 8*i, transposed
        const unsigned pb = smem_u32(b + (r + 8 * (i & 1)) * LDB);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 { %0, %1 }, [%2];\n"
                     : "=r"(f[0]), "=r"(f[1]) : "r"(pb) : "memory");
    }
}
template <bool AT, bool BK, typename T>
__device__ __forceinline__ void tile_mma_core(float c[4], const T *a, const T *b, int lane, int LDA, int LDB)
{
    unsigned fa[4], fb[2];
    frag_a<AT>(fa, a, lane, LDA);
    frag_b<BK>(fb, b, lane, LDB);
    mma_16816(c, fa[0], fa[1], fa[2], fa[3], fb[0], fb[1], a);
}

// A row of tiles sharing A: c[j] += A . B_j for j < nj (NJ the bound of c),
// B_j the j-th block of 8 columns (b + 8 j rows of B^T when !BK, b + 8 j
// columns of B when BK): tile_mma_core of each, in j order, with A's
// fragment loaded once for the row (as a loop of tile_mma calls, each
// loaded it again: the loads are volatile asm). The same products in the
// same order: the same bits. f32 operands: tile_mma_core of each.
template <bool AT, bool BK, int NJ, typename T>
__device__ __forceinline__ void tile_mma_row_core(float (&c)[NJ][4], int nj, const T *a, const T *b, int lane,
                                                  int LDA, int LDB)
{
    const int bstep = BK ? 8 : 8 * LDB;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            if (j < nj) tile_mma_core<AT, BK>(c[j], a, b + j * bstep, lane, LDA, LDB);
    } else {
        unsigned fa[4];
        frag_a<AT>(fa, a, lane, LDA);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            if (j < nj) {
                unsigned fb[2];
                frag_b<BK>(fb, b + j * bstep, lane, LDB);
                mma_16816(c[j], fa[0], fa[1], fa[2], fa[3], fb[0], fb[1], a);
            }
    }
}
template <bool AT, bool BK, int LDA, int LDB, int NJ, typename T>
__device__ __forceinline__ void tile_mma_row(float (&c)[NJ][4], const T *a, const T *b, int lane)
{
    static_assert(sizeof(T) == 4 || (LDA % 8 == 0 && LDB % 8 == 0), "ldmatrix rows are 16-byte aligned");
    tile_mma_row_core<AT, BK>(c, NJ, a, b, lane, LDA, LDB);
}

// The cumulative decay of a chunk of Q steps, the first half of phase B of
// both chunked scans (ck_decay of the forward, the backward's phase B), run
// by warp 0 in a fixed order: cs_i = sum_{j<=i} A*dt_j (s_adt) into s_cs, a
// shuffle scan per 32 steps plus the carry of the ones before. Returns the
// chunk's total (cs at its end: padding rows add 0). STARTS: each step's
// start flag is read from s_cs before it is overwritten, s_adt[i] receives
// lst_i, the last start at or before i (-1: none; A*dt is not read again),
// and lcarry the chunk's last start (padding rows hold none).
template <int Q, bool STARTS>
__device__ __forceinline__ float ck_cumsum(float *s_adt, float *s_cs, int lane, int &lcarry)
{
    float carry = 0.0f;
    lcarry = -1;
    for (int seg = 0; seg < Q; seg += 32) {
        const int i = seg + lane;
        float x = i < Q ? s_adt[i] : 0.0f;
        int ls = -1;
        if constexpr (STARTS) ls = (i < Q && s_cs[i] != 0.0f) ? i : -1;   // read before s_cs is written
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float yv = __shfl_up_sync(FULL_MASK, x, o);
            if (lane >= o) x += yv;
            if constexpr (STARTS) {
                const int lv = __shfl_up_sync(FULL_MASK, ls, o);
                if (lane >= o) ls = max(ls, lv);
            }
        }
        x += carry;
        if (i < Q) s_cs[i] = x;
        carry = __shfl_sync(FULL_MASK, x, 31);
        if constexpr (STARTS) {
            ls = max(ls, lcarry);
            if (i < Q) s_adt[i] = (float)ls;
            lcarry = __shfl_sync(FULL_MASK, ls, 31);
        }
    }
    return carry;
}
