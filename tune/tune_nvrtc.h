/* tune/tune_nvrtc.h: compiling one autotuning candidate (a CUDA source
 * text) to a cubin with NVRTC, in-process. Needs libnvrtc only: no driver,
 * no GPU, no nvcc; safe to call from several threads at once. */
#ifndef MG_TUNE_NVRTC_H
#define MG_TUNE_NVRTC_H

#include <stddef.h>

typedef struct {
    char *cubin;  /* malloc'd cubin bytes, NULL on failure */
    size_t size;
    char *log;    /* malloc'd compile log (may be empty), or NULL */
} tn_result;

/* Compiles SRC (file name NAME in messages) for ARCH ("sm_90") with
 * -std=c++17, no fast math, and -I INCLUDE_DIR when not
 * NULL (cuda_bf16.h / cuda_fp16.h of the toolkit). 0, or -1 with *ERR set
 * (free it; the log, if any, in out->log). */
int tn_compile(const char *src, const char *name, const char *arch, const char *include_dir,
               tn_result *out, char **err);
void tn_result_free(tn_result *r);

/* "13.0", NVRTC's own version. */
void tn_version(char *buf, size_t n);

/* 1 if NVRTC can compile for ARCH ("sm_90"). */
int tn_arch_supported(const char *arch);

#endif
