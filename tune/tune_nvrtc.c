/* tune/tune_nvrtc.c: NVRTC compile of a candidate to a cubin (see
 * tune_nvrtc.h). */
#include "gen/xstr.h"
#include "tune_nvrtc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

void tn_version(char *buf, size_t n)
{
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
        snprintf(buf, n, "%d.%d", major, minor);
    else
        snprintf(buf, n, "unknown");
}

int tn_arch_supported(const char *arch)
{
    int want = 0, n = 0;
    if (sscanf(arch, "sm_%d", &want) != 1 || nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0)
        return 0;
    int *a = malloc(sizeof *a * (size_t)n);
    int ok = 0;
    if (a && nvrtcGetSupportedArchs(a) == NVRTC_SUCCESS)
        for (int i = 0; i < n; i++)
            ok |= a[i] == want;
    free(a);
    return ok;
}

void tn_result_free(tn_result *r)
{
    free(r->cubin);
    free(r->log);
    memset(r, 0, sizeof *r);
}

int tn_compile(const char *src, const char *name, const char *arch, const char *include_dir,
               tn_result *out, char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        *err = xstr_printf("%s: nvrtcCreateProgram: %s", name, nvrtcGetErrorString(rc));
        return -1;
    }
    char archopt[64], incopt[4096 + 8];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[5];
    int nopts = 0;
    opts[nopts++] = archopt;
    opts[nopts++] = "-std=c++17";
    opts[nopts++] = "--fmad=true"; /* nvcc's default, as the library build */
    if (include_dir && *include_dir) {
        snprintf(incopt, sizeof incopt, "-I%s", include_dir);
        opts[nopts++] = incopt;
    }
    rc = nvrtcCompileProgram(prog, nopts, opts);
    size_t logsize = 0;
    if (nvrtcGetProgramLogSize(prog, &logsize) == NVRTC_SUCCESS && logsize > 0) {
        out->log = malloc(logsize + 1);
        if (out->log && nvrtcGetProgramLog(prog, out->log) == NVRTC_SUCCESS)
            out->log[logsize] = '\0';
        else if (out->log)
            out->log[0] = '\0';
    }
    if (rc != NVRTC_SUCCESS) {
        *err = xstr_printf("%s: compile failed (%s)", name, nvrtcGetErrorString(rc));
        nvrtcDestroyProgram(&prog);
        return -1;
    }
    size_t size = 0;
    rc = nvrtcGetCUBINSize(prog, &size);
    if (rc != NVRTC_SUCCESS || size == 0) {
        *err = xstr_printf("%s: no cubin (%s; is %s a real architecture?)", name,
                         rc != NVRTC_SUCCESS ? nvrtcGetErrorString(rc) : "empty", arch);
        nvrtcDestroyProgram(&prog);
        return -1;
    }
    out->cubin = malloc(size);
    if (!out->cubin || nvrtcGetCUBIN(prog, out->cubin) != NVRTC_SUCCESS) {
        *err = xstr_printf("%s: cannot read the cubin", name);
        nvrtcDestroyProgram(&prog);
        tn_result_free(out);
        return -1;
    }
    out->size = size;
    nvrtcDestroyProgram(&prog);
    return 0;
}
