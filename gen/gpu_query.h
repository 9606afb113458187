/* gen/gpu_query.h: which GPU the generator tunes for ("the current GPU" of
 * `chunk_size: auto`, doc/tuning.md) without linking CUDA: a name given on
 * the command line (--gpu) or in MG_GPU, else the first visible device as
 * the CUDA runtime reports it, with libcudart loaded by dlopen at run time
 * (mamba-gen starts, and generates, on machines without CUDA). */
#ifndef MG_GPU_QUERY_H
#define MG_GPU_QUERY_H

typedef struct {
    int found;          /* 1: name is set */
    char name[256];     /* device name as cudaGetDeviceProperties gives it */
    char cc[16];        /* "9.0", or "" when not known (a name given by hand) */
    char driver[16];    /* "13.0", or "" */
    int sms;            /* multiprocessors of the device, or 0 when not known
                           (a name given by hand) */
    char source[320];   /* how it was found, or why there is none (for messages) */
} gq_gpu;

/* OVERRIDE: the --gpu value or NULL. Order: OVERRIDE, $MG_GPU, the CUDA
 * runtime. The value "none" means no GPU. Never fails: without a GPU,
 * found = 0 and source says why. */
void gq_detect(const char *override_name, gq_gpu *out);

#endif
