/* NAME_nccl.c: data-parallel training of the generated library on several
 * GPUs of one host with NCCL (an example program, `make NAME_nccl`; it
 * names no model: model_alias.h does).
 *
 * One process drives every GPU: each rank holds a full copy of the weights,
 * its AdamW moments and a trainer, and runs forward_train + backward on its
 * own shard of the batch; the flat gradient blobs are summed across the
 * ranks with one ncclAllReduce (the blob is one contiguous f32 array:
 * NAME_WEIGHTS_FLOATS floats, padding included, so the whole model is one
 * collective), then every rank takes the same fused AdamW step. The
 * replicas stay bit-identical: every rank adds the same gradients and
 * steps the same weights with the same arithmetic.
 *
 * The loss is a stand-in for the caller's: L = sum(out * r) / (global
 * tokens x D_MODEL) with r a fixed random tensor, whose dL/dout is r scaled
 * (a constant, so no loss kernel is needed here); any dL/dout the caller
 * computes goes into backward the same way.
 *
 *   NAME_nccl [--gpus N] [--steps K] [--batch B] [--seqlen T]
 *
 * Prints the L2 norm of the gradient of every step (the global one, as
 * every rank sees it after the all-reduce), whether the replicas ended
 * bit-identical, and a 64-bit FNV-1a digest of the final weights (two runs
 * with the same arguments print the same digest: deterministic). Exit 0
 * when the replicas agree. With 2 ranks the sum of each gradient entry is
 * a + b, the same bits in either order; with more ranks NCCL's reduction
 * order is fixed for a given topology and NCCL version. */
#include "model_alias.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <mg_rng.h>
#include MODEL_REF_HEADER

#define MAX_GPUS 16

static void die(const char *what, const char *detail)
{
    fprintf(stderr, MODEL_NAME "_nccl: %s: %s\n", what, detail);
    exit(1);
}

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_)); } while (0)
#define NCCL_OK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) die(#call, ncclGetErrorString(r_)); } while (0)
#define MG_OK_(call) do { mg_status s_ = (call); if (s_ != MG_OK) die(#call, mg_last_error()); } while (0)

/* The reference path's initial weights (the test and bench programs' too). */
static float *initial_weights(void)
{
    model_ref_dims dims = MODEL_REF_DIMS;
    model_ref_layout lay;
    memset(&lay, 0, sizeof lay);
    MG_OK_(MODEL_REF(layout)(&dims, &lay));
    float *hw = malloc(sizeof(float) * lay.total);
    if (!hw) die("init", "out of host memory");
    MG_OK_(MODEL_REF(init)(&dims, &lay, hw, 1));
    if (lay.total != MODEL_WEIGHTS_FLOATS) die("init", "the reference layout is not the library's blob");
    return hw;
}

/* n floats uniform in [lo, hi) from seed, uploaded to a new device buffer. */
static float *upload_random(size_t n, uint64_t seed, float lo, float hi)
{
    float *h = malloc(sizeof(float) * n), *d = NULL;
    if (!h) die("upload", "out of host memory");
    mg_rng r;
    mg_rng_seed(&r, seed);
    mg_rng_fill_uniform(&r, h, n, lo, hi);
    CUDA_OK(cudaMalloc((void **)&d, sizeof(float) * n));
    CUDA_OK(cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

int main(int argc, char **argv)
{
    int ngpu = 2, steps = 3, batch = MODEL_MAX_BATCH < 2 ? MODEL_MAX_BATCH : 2;
    int seqlen = MODEL_MAX_SEQ_LEN < 64 ? MODEL_MAX_SEQ_LEN : 64;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--gpus") ? &ngpu : !strcmp(argv[i], "--steps") ? &steps
                 : !strcmp(argv[i], "--batch") ? &batch : !strcmp(argv[i], "--seqlen") ? &seqlen : NULL;
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "usage: %s [--gpus N] [--steps K] [--batch B] [--seqlen T]\n", argv[0]);
            return 2;
        }
        *dst = atoi(argv[++i]);
    }
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    if (ngpu < 1 || ngpu > MAX_GPUS || ngpu > have) {
        fprintf(stderr, MODEL_NAME "_nccl: --gpus %d: this machine has %d CUDA device(s) (at most %d)\n", ngpu, have,
                MAX_GPUS);
        return have == 0 ? 77 : 2;
    }
    if (batch < 1 || batch > MODEL_MAX_BATCH || seqlen < 1 || seqlen > MODEL_MAX_SEQ_LEN || steps < 1) {
        fprintf(stderr, MODEL_NAME "_nccl: batch 1..%d per GPU, seqlen 1..%d, steps >= 1\n", MODEL_MAX_BATCH,
                MODEL_MAX_SEQ_LEN);
        return 2;
    }

    /* One communicator per GPU, all in this process. */
    int devs[MAX_GPUS];
    ncclComm_t comm[MAX_GPUS];
    for (int r = 0; r < ngpu; r++) devs[r] = r;
    NCCL_OK(ncclCommInitAll(comm, ngpu, devs));

    /* Per rank: stream, trainer, weights (the same initial blob), moments,
     * gradients, its shard of the input, the output, dL/dout. */
    const size_t nw = MODEL_WEIGHTS_FLOATS, tok = (size_t)batch * seqlen;
    const float scale = 1.0f / ((float)ngpu * (float)tok * (float)MODEL_D_MODEL);
    float *hw = initial_weights();
    cudaStream_t st[MAX_GPUS];
    model_trainer *t[MAX_GPUS];
    float *w[MAX_GPUS], *g[MAX_GPUS], *m[MAX_GPUS], *v[MAX_GPUS], *u[MAX_GPUS], *out[MAX_GPUS], *dout[MAX_GPUS];
    for (int r = 0; r < ngpu; r++) {
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaStreamCreate(&st[r]));
        MG_OK_(model_trainer_create(&t[r], st[r]));
        CUDA_OK(cudaMalloc((void **)&w[r], sizeof(float) * nw));
        CUDA_OK(cudaMemcpy(w[r], hw, sizeof(float) * nw, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc((void **)&g[r], sizeof(float) * nw));
        CUDA_OK(cudaMalloc((void **)&m[r], sizeof(float) * nw));
        CUDA_OK(cudaMalloc((void **)&v[r], sizeof(float) * nw));
        CUDA_OK(cudaMemset(m[r], 0, sizeof(float) * nw));
        CUDA_OK(cudaMemset(v[r], 0, sizeof(float) * nw));
        u[r] = upload_random(tok * MODEL_IN_DIM, 1000 + (uint64_t)r, -1.0f, 1.0f);   /* rank r's shard */
        CUDA_OK(cudaMalloc((void **)&out[r], sizeof(float) * tok * MODEL_D_MODEL));
        dout[r] = upload_random(tok * MODEL_D_MODEL, 2000 + (uint64_t)r, -scale, scale);
    }
    free(hw);

    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f; p.weight_decay = 0.01f; p.max_grad_norm = 1.0f;
    for (int k = 0; k < steps; k++) {
        for (int r = 0; r < ngpu; r++) {   /* local gradients (fresh states: NULL) */
            CUDA_OK(cudaSetDevice(r));
            MG_OK_(model_forward_train(t[r], w[r], batch, seqlen, u[r], out[r], MODEL_NULL_STATES));
            MG_OK_(model_backward(t[r], dout[r], g[r], NULL, MODEL_NULL_STATES));
        }
        /* the global gradient on every rank: one collective over the blob */
        NCCL_OK(ncclGroupStart());
        for (int r = 0; r < ngpu; r++)
            NCCL_OK(ncclAllReduce(g[r], g[r], nw, ncclFloat, ncclSum, comm[r], st[r]));
        NCCL_OK(ncclGroupEnd());
        p.step = k + 1;
        for (int r = 0; r < ngpu; r++) {
            CUDA_OK(cudaSetDevice(r));
            MG_OK_(model_adamw_step(t[r], w[r], g[r], m[r], v[r], &p));
        }
        float norm[2];
        CUDA_OK(cudaSetDevice(0));
        CUDA_OK(cudaMemcpyAsync(norm, model_trainer_grad_norm(t[0]), sizeof norm, cudaMemcpyDeviceToHost, st[0]));
        CUDA_OK(cudaStreamSynchronize(st[0]));
        printf("step %d: global gradient norm %.6g (clip scale %.4g)\n", k + 1, norm[0], norm[1]);
    }

    /* The replicas, bit for bit, and the digest of rank 0's weights. */
    float *h0 = malloc(sizeof(float) * nw), *hr = malloc(sizeof(float) * nw);
    if (!h0 || !hr) die("compare", "out of host memory");
    int same = 1;
    for (int r = 0; r < ngpu; r++) {
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaStreamSynchronize(st[r]));
        CUDA_OK(cudaMemcpy(r ? hr : h0, w[r], sizeof(float) * nw, cudaMemcpyDeviceToHost));
        if (r && memcmp(h0, hr, sizeof(float) * nw)) same = 0;
    }
    uint64_t hsh = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)h0;
    for (size_t i = 0; i < nw * sizeof(float); i++) hsh = (hsh ^ b[i]) * 1099511628211ull;
    printf("%d GPU(s), %d step(s), batch %d x seqlen %d per GPU\n", ngpu, steps, batch, seqlen);
    printf("replicas bit-identical: %s\n", same ? "yes" : "NO");
    printf("weights fnv1a: %016llx\n", (unsigned long long)hsh);
    free(h0);
    free(hr);

    for (int r = 0; r < ngpu; r++) {
        CUDA_OK(cudaSetDevice(r));
        model_trainer_destroy(t[r]);
        cudaFree(w[r]); cudaFree(g[r]); cudaFree(m[r]); cudaFree(v[r]);
        cudaFree(u[r]); cudaFree(out[r]); cudaFree(dout[r]);
        cudaStreamDestroy(st[r]);
        ncclCommDestroy(comm[r]);
    }
    return same ? 0 : 1;
}
