/* mg_cuda.c: checked cudart/cuBLAS wrappers. Links cudart and cuBLAS only,
 * never libcuda: without a driver every call fails with a status (no crash),
 * and mg_device_count() is 0. */
#include "mg_cuda.h"

#include <stdlib.h>
#include <cublas_v2.h>

struct mg_blas {
    cublasHandle_t h;
    cudaStream_t stream;
    int tf32;   /* f32 GEMMs on TF32 tensor cores (mg_blas_set_tf32) */
};

int mg_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error state */
        return 0;
    }
    return n < 0 ? 0 : n;
}

int mg_device_sms(void)
{
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return n > 0 ? n : 1;
}

mg_status mg_cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return MG_OK;
    mg_status s;
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
        s = MG_ERR_NO_DEVICE;
        break;
    case cudaErrorMemoryAllocation:
        s = MG_ERR_OUT_OF_MEMORY;
        break;
    default:
        s = MG_ERR_CUDA;
        break;
    }
    return mg_fail(s, "%s: %s (%s)", what ? what : "CUDA call",
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

static mg_status blas_check(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return MG_OK;
    mg_status s = st == CUBLAS_STATUS_ALLOC_FAILED ? MG_ERR_OUT_OF_MEMORY
                                                   : MG_ERR_CUBLAS;
    return mg_fail(s, "%s: %s (%s)", what, cublasGetStatusString(st),
                   cublasGetStatusName(st));
}

mg_status mg_dev_alloc(void **p, size_t bytes, const char *what)
{
    if (p == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_dev_alloc(%s): p is NULL",
                       what ? what : "?");
    *p = NULL;
    if (bytes == 0)
        return MG_OK;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        mg_status s = e == cudaErrorMemoryAllocation ? MG_ERR_OUT_OF_MEMORY
                      : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
                          ? MG_ERR_NO_DEVICE : MG_ERR_CUDA;
        return mg_fail(s, "cudaMalloc of %zu bytes for %s failed: %s (%s)",
                       bytes, what ? what : "?", cudaGetErrorString(e),
                       cudaGetErrorName(e));
    }
    return MG_OK;
}

void mg_dev_free(void *p)
{
    if (p)
        (void)cudaFree(p);
}

size_t mg_dtype_size(mg_dtype t)
{
    switch (t) {
    case MG_F32: return 4;
    case MG_BF16: return 2;
    case MG_F16: return 2;
    }
    return 0;
}

const char *mg_dtype_name(mg_dtype t)
{
    switch (t) {
    case MG_F32: return "f32";
    case MG_BF16: return "bf16";
    case MG_F16: return "f16";
    }
    return "?";
}

static int dtype_valid(mg_dtype t)
{
    return t == MG_F32 || t == MG_BF16 || t == MG_F16;
}

static cudaDataType_t cuda_type(mg_dtype t)
{
    switch (t) {
    case MG_BF16: return CUDA_R_16BF;
    case MG_F16: return CUDA_R_16F;
    case MG_F32: break;
    }
    return CUDA_R_32F;
}

mg_status mg_blas_create(mg_blas **out, cudaStream_t stream)
{
    if (out == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_blas_create: out is NULL");
    *out = NULL;
    if (mg_device_count() == 0)
        return mg_fail(MG_ERR_NO_DEVICE,
                       "mg_blas_create: no usable CUDA device or driver");
    mg_blas *b = calloc(1, sizeof *b);
    if (b == NULL)
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mg_blas_create: out of host memory");
    mg_status s = blas_check(cublasCreate(&b->h), "cublasCreate");
    if (s != MG_OK) {
        free(b);
        return s;
    }
    /* Default math: no TF32 and no BF16x9 emulation unless asked for; f32
     * GEMMs also use the pedantic compute type (see gemm()): f32 stays f32
     * unless mg_blas_set_tf32 asks for TF32 (calloc: off). */
    s = blas_check(cublasSetMathMode(b->h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (s == MG_OK)
        s = blas_check(cublasSetStream(b->h, stream), "cublasSetStream");
    if (s != MG_OK) {
        cublasDestroy(b->h);
        free(b);
        return s;
    }
    b->stream = stream;
    *out = b;
    return MG_OK;
}

void mg_blas_destroy(mg_blas *b)
{
    if (b == NULL)
        return;
    cublasDestroy(b->h);
    free(b);
}

mg_status mg_blas_set_tf32(mg_blas *b, int on)
{
    if (b == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_blas_set_tf32: b is NULL");
    if (on != 0 && on != 1)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_blas_set_tf32: on = %d (0 or 1)", on);
    b->tf32 = on;
    return MG_OK;
}

mg_status mg_blas_set_stream(mg_blas *b, cudaStream_t stream)
{
    if (b == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_blas_set_stream: b is NULL");
    mg_status s = blas_check(cublasSetStream(b->h, stream), "cublasSetStream");
    if (s == MG_OK)
        b->stream = stream;
    return s;
}

/* Shared argument checks. Everything is validated before the handle is
 * looked at, so the checks work (and are tested) without a GPU. M, N, K are
 * the caller's sizes; `sum` names the one the product sums over ('M', 'N'
 * or 'K'): it must be > 0 (cuBLAS does not scale C for k = 0 in every
 * version), the others >= 0. */
static mg_status check_gemm(const char *fn, mg_blas *b, int M, int N, int K, char sum,
                            mg_dtype in, mg_dtype out,
                            const void *p1, const char *n1, int ld1, int min1,
                            const void *p2, const char *n2, int ld2, int min2,
                            const void *p3, const char *n3, int ld3, int min3)
{
    if (M < (sum == 'M') || N < (sum == 'N') || K < (sum == 'K'))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: bad sizes M=%d N=%d K=%d "
                       "(need M %s 0, N %s 0, K %s 0)", fn, M, N, K,
                       sum == 'M' ? ">" : ">=", sum == 'N' ? ">" : ">=",
                       sum == 'K' ? ">" : ">=");
    if (!dtype_valid(in) || !dtype_valid(out))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: bad dtype (in=%d, out=%d)",
                       fn, (int)in, (int)out);
    if (out != MG_F32 && out != in)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: output type %s with input type %s "
                       "(the output must be f32 or the input type)", fn,
                       mg_dtype_name(out), mg_dtype_name(in));
    const void *ps[3] = { p1, p2, p3 };
    const char *ns[3] = { n1, n2, n3 };
    int lds[3] = { ld1, ld2, ld3 }, mins[3] = { min1, min2, min3 };
    for (int i = 0; i < 3; i++) {
        if (ps[i] == NULL)
            return mg_fail(MG_ERR_INVALID_ARG, "%s: %s is NULL", fn, ns[i]);
        if (lds[i] < mins[i])
            return mg_fail(MG_ERR_INVALID_ARG, "%s: ld of %s is %d, less than "
                           "its row length %d", fn, ns[i], lds[i], mins[i]);
    }
    if (b == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: blas handle is NULL", fn);
    return MG_OK;
}

/* Row-major <-> column-major.
 *
 * cuBLAS is column-major. A row-major matrix P[r][c] with row stride ld is,
 * read column-major with leading dimension ld, the matrix P^T (c x r). So
 * every row-major product is computed as its transpose:
 *
 * mg_linear:  Y[M][N] = X[M][K] . W[N][K]^T
 *   transpose: Y^T (N x M) = W (N x K) . X^T (K x M).
 *   Column-major views: buffer W = W^T (K x N, ld ldw)  -> op T gives W;
 *                       buffer X = X^T (K x M, ld ldx)  -> op N gives X^T;
 *                       buffer Y = Y^T (N x M, ld ldy).
 *   => gemm(transa=T, transb=N, m=N, n=M, k=K, A=W/ldw, B=X/ldx, C=Y/ldy).
 *
 * mg_linear_dx:  dX[M][K] = dY[M][N] . W[N][K]
 *   transpose: dX^T (K x M) = W^T (K x N) . dY^T (N x M).
 *   Views: buffer W = W^T (K x N) -> op N; buffer dY = dY^T (N x M) -> op N;
 *          buffer dX = dX^T (K x M).
 *   => gemm(N, N, m=K, n=M, k=N, A=W/ldw, B=dY/lddy, C=dX/lddx).
 *
 * mg_linear_dw:  dW[N][K] = dY[M][N]^T . X[M][K]
 *   transpose: dW^T (K x N) = X^T (K x M) . dY (M x N).
 *   Views: buffer X = X^T (K x M) -> op N; buffer dY = dY^T (N x M) -> op T
 *          gives dY; buffer dW = dW^T (K x N).
 *   => gemm(N, T, m=K, n=N, k=M, A=X/ldx, B=dY/lddy, C=dW/lddw).
 *
 * Leading dimensions passed to cuBLAS are the row strides, and cuBLAS needs
 * lda >= rows of the stored (column-major) matrix, i.e. row stride >= row
 * length: checked in check_gemm. f32 compute (CUBLAS_COMPUTE_32F, or its
 * _PEDANTIC form for f32 operands) with f32 alpha/beta for every storage
 * type. */
static mg_status gemm(mg_blas *b, const char *fn, cublasOperation_t ta,
                      cublasOperation_t tb, int m, int n, int k,
                      float alpha, mg_dtype in, const void *A, int lda,
                      const void *B, int ldb, float beta, mg_dtype out,
                      void *C, int ldc)
{
    if (m == 0 || n == 0)
        return MG_OK;
    /* f32 operands: the pedantic f32 compute type, which also ignores
     * NVIDIA_TF32_OVERRIDE=1 (that variable turns TF32 on for
     * CUBLAS_COMPUTE_32F, even under CUBLAS_PEDANTIC_MATH: measured on an
     * H200 with cuBLAS 13.1, rel error 3e-4 instead of 1e-7). 16-bit
     * operands: CUBLAS_COMPUTE_32F (tensor cores, f32 accumulation). */
    cublasComputeType_t ct = in != MG_F32 ? CUBLAS_COMPUTE_32F
                             : b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32   /* asked for: mg_blas_set_tf32 */
                             : CUBLAS_COMPUTE_32F_PEDANTIC;
    cublasStatus_t st = cublasGemmEx(b->h, ta, tb, m, n, k, &alpha,
                                     A, cuda_type(in), lda, B, cuda_type(in), ldb,
                                     &beta, C, cuda_type(out), ldc,
                                     ct, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return mg_fail(st == CUBLAS_STATUS_ALLOC_FAILED ? MG_ERR_OUT_OF_MEMORY : MG_ERR_CUBLAS,
                       "%s: cublasGemmEx(m=%d n=%d k=%d, %s -> %s) failed: %s (%s)",
                       fn, m, n, k, mg_dtype_name(in), mg_dtype_name(out),
                       cublasGetStatusString(st), cublasGetStatusName(st));
    return MG_OK;
}

mg_status mg_linear(mg_blas *b, int M, int N, int K,
                    mg_dtype in, const void *X, int ldx,
                    const void *W, int ldw,
                    mg_dtype out, void *Y, int ldy,
                    float alpha, float beta)
{
    mg_status s = check_gemm("mg_linear", b, M, N, K, 'K', in, out,
                             X, "X", ldx, K, W, "W", ldw, K, Y, "Y", ldy, N);
    if (s != MG_OK)
        return s;
    return gemm(b, "mg_linear", CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, alpha,
                in, W, ldw, X, ldx, beta, out, Y, ldy);
}

mg_status mg_linear_dx(mg_blas *b, int M, int N, int K,
                       mg_dtype in, const void *dY, int lddy,
                       const void *W, int ldw,
                       mg_dtype out, void *dX, int lddx, float beta)
{
    /* The contraction here is over N, so N must be > 0 and K may be any
     * non-negative count. */
    mg_status s = check_gemm("mg_linear_dx", b, M, N, K, 'N', in, out,
                             dY, "dY", lddy, N, W, "W", ldw, K, dX, "dX", lddx, K);
    if (s != MG_OK)
        return s;
    return gemm(b, "mg_linear_dx", CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, 1.0f,
                in, W, ldw, dY, lddy, beta, out, dX, lddx);
}

mg_status mg_linear_dw(mg_blas *b, int M, int N, int K,
                       mg_dtype in, const void *dY, int lddy,
                       const void *X, int ldx,
                       mg_dtype out, void *dW, int lddw, float beta)
{
    /* Contraction over M (tokens); M == 0 would mean dW = beta*dW, which
     * cuBLAS does not do for k = 0 in every version: refused. */
    mg_status s = check_gemm("mg_linear_dw", b, M, N, K, 'M', in, out,
                             dY, "dY", lddy, N, X, "X", ldx, K, dW, "dW", lddw, K);
    if (s != MG_OK)
        return s;
    return gemm(b, "mg_linear_dw", CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, 1.0f,
                in, X, ldx, dY, lddy, beta, out, dW, lddw);
}

int mg_aligned(const void *p, size_t align)
{
    if (p == NULL || align == 0)
        return 0;
    return ((uintptr_t)p % align) == 0;
}

mg_status mg_dev_readable(const void *p, const char *fn, const char *what)
{
    if (!p) return mg_fail(MG_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
    struct cudaPointerAttributes a;
    const cudaError_t ce = cudaPointerGetAttributes(&a, p);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();   /* not sticky: clear it for the next call */
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %s %p is not a pointer CUDA knows (%s)", fn, what, p,
                       cudaGetErrorString(ce));
    }
    if (a.type == cudaMemoryTypeUnregistered)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %s %p is host memory the device cannot read "
                       "(pass device memory, or cudaHostRegister it)", fn, what, p);
    return MG_OK;
}
