/* mg_cuda.h: thin, checked wrappers over cudart and cuBLAS used by the
 * generated host pipelines: device queries, buffers, a cuBLAS handle bound
 * to a stream, and row-major "linear layer" GEMMs in PyTorch's convention
 * (y = x . W^T). Links cudart and cuBLAS only; never libcuda. */
#ifndef MG_CUDA_H
#define MG_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "mg_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no device
 * (never an error). */
int mg_device_count(void);

/* Multiprocessors of the current device (1 when the query fails): launch
 * choices that depend on how many blocks run side by side. */
int mg_device_sms(void);

/* Turn a cudaError_t into a status + message naming the call site. */
mg_status mg_cuda_check(cudaError_t e, const char *what);
#define MG_CUDA(call) do { cudaError_t mg__e = (call); \
    if (mg__e != cudaSuccess) return mg_cuda_check(mg__e, #call); } while (0)

/* Device allocation with a readable message on failure; *p is NULL on error. */
mg_status mg_dev_alloc(void **p, size_t bytes, const char *what);
void mg_dev_free(void *p);

/* Storage types of GEMM operands. */
typedef enum mg_dtype { MG_F32 = 0, MG_BF16 = 1, MG_F16 = 2 } mg_dtype;
size_t mg_dtype_size(mg_dtype t);
const char *mg_dtype_name(mg_dtype t);

/* A cuBLAS handle bound to a stream; f32 GEMMs never use TF32 unless
 * mg_blas_set_tf32 turned it on for this handle. */
typedef struct mg_blas mg_blas;
mg_status mg_blas_create(mg_blas **out, cudaStream_t stream);
void mg_blas_destroy(mg_blas *b);
mg_status mg_blas_set_stream(mg_blas *b, cudaStream_t stream);
/* on = 1: the handle's GEMMs with f32 operands run on TF32 tensor cores
 * (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to 10 mantissa bits, f32
 * accumulation); 0 (the default): f32 compute (pedantic). 16-bit operands
 * are unaffected. MG_ERR_INVALID_ARG for a NULL handle or another value. */
mg_status mg_blas_set_tf32(mg_blas *b, int on);

/* Row-major linear layer, PyTorch convention:
 *   Y[M][N] = alpha * X[M][K] . W[N][K]^T + beta * Y[M][N]
 * ldx, ldw, ldy are row strides in elements. X and W have type `in`,
 * Y has type `out` (f32 or the storage type); compute is always f32. */
mg_status mg_linear(mg_blas *b, int M, int N, int K,
                    mg_dtype in, const void *X, int ldx,
                    const void *W, int ldw,
                    mg_dtype out, void *Y, int ldy,
                    float alpha, float beta);
/* Gradient helpers for training (same convention):
 *   dX[M][K] = dY[M][N] . W[N][K]           (+ beta*dX)
 *   dW[N][K] = dY[M][N]^T . X[M][K]         (+ beta*dW)   */
mg_status mg_linear_dx(mg_blas *b, int M, int N, int K,
                       mg_dtype in, const void *dY, int lddy,
                       const void *W, int ldw,
                       mg_dtype out, void *dX, int lddx, float beta);
mg_status mg_linear_dw(mg_blas *b, int M, int N, int K,
                       mg_dtype in, const void *dY, int lddy,
                       const void *X, int ldx,
                       mg_dtype out, void *dW, int lddw, float beta);

/* True if p is aligned to `align` bytes (NULL is not aligned). */
int mg_aligned(const void *p, size_t align);

/* MG_OK if kernels can read p: device or managed memory, or host memory
 * registered with CUDA (cudaPointerGetAttributes, a host-side lookup: no
 * launch, no sync). Else MG_ERR_INVALID_ARG with "FN: WHAT P is not a
 * pointer CUDA knows (...)" or "... is host memory the device cannot read
 * (...)" (a pointer unknown to CUDA, or plain host memory, would fault the
 * kernels that read it). p NULL: MG_ERR_INVALID_ARG ("WHAT is NULL"). */
mg_status mg_dev_readable(const void *p, const char *fn, const char *what);

#ifdef __cplusplus
}
#endif
#endif
