/* gen/gpu_query.c: the current GPU for the generator (see gpu_query.h).
 * The CUDA runtime is opened with dlopen and asked through four entry points
 * whose C signatures have been stable since CUDA 11; the device name is the
 * first member of struct cudaDeviceProp (char name[256]), so a large zeroed
 * buffer stands in for the struct. The library is never closed: once
 * initialised, cudart has exit handlers that must stay mapped. */
#include "gpu_query.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*gq_count_fn)(int *);
typedef int (*gq_props_fn)(void *, int);
typedef int (*gq_attr_fn)(int *, int, int);
typedef int (*gq_ver_fn)(int *);
typedef const char *(*gq_errstr_fn)(int);

/* cudaDevAttrComputeCapabilityMajor/Minor, cudaDevAttrMultiProcessorCount */
enum { GQ_ATTR_CC_MAJOR = 75, GQ_ATTR_CC_MINOR = 76, GQ_ATTR_SMS = 16 };

/* NAME given by hand (SOURCE: "--gpu" or "MG_GPU"); "none": no GPU. */
static void gq_set_name(gq_gpu *out, const char *name, const char *source)
{
    if (strcmp(name, "none") == 0) {
        snprintf(out->source, sizeof out->source, "no GPU (%s%snone)", source,
                 strcmp(source, "MG_GPU") == 0 ? "=" : " ");
        return;
    }
    out->found = 1;
    snprintf(out->name, sizeof out->name, "%s", name);
    snprintf(out->source, sizeof out->source, "%s", source);
}

/* dlsym into a function pointer without the object/function pointer
 * conversion warning. */
static void *gq_sym(void *lib, const char *name)
{
    return dlsym(lib, name);
}

void gq_detect(const char *override_name, gq_gpu *out)
{
    memset(out, 0, sizeof *out);
    const char *env = getenv("MG_GPU");
    if (override_name && *override_name) {
        gq_set_name(out, override_name, "--gpu");
        return;
    }
    if (env && *env) {
        gq_set_name(out, env, "MG_GPU");
        return;
    }
    static const char *const libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", NULL};
    void *lib = NULL;
    for (int i = 0; libs[i] && !lib; i++)
        lib = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(out->source, sizeof out->source, "no GPU known (the CUDA runtime, libcudart.so, is not installed)");
        return;
    }
    gq_count_fn count;
    gq_props_fn props;
    gq_attr_fn attr;
    gq_ver_fn drv;
    gq_errstr_fn errstr;
    void *p;
    p = gq_sym(lib, "cudaGetDeviceCount");
    memcpy(&count, &p, sizeof count);
    p = gq_sym(lib, "cudaGetDeviceProperties");
    memcpy(&props, &p, sizeof props);
    p = gq_sym(lib, "cudaDeviceGetAttribute");
    memcpy(&attr, &p, sizeof attr);
    p = gq_sym(lib, "cudaDriverGetVersion");
    memcpy(&drv, &p, sizeof drv);
    p = gq_sym(lib, "cudaGetErrorString");
    memcpy(&errstr, &p, sizeof errstr);
    if (!count || !props || !attr) {
        snprintf(out->source, sizeof out->source, "no GPU known (libcudart lacks cudaGetDeviceCount)");
        return;
    }
    int n = 0, e = count(&n);
    if (e != 0 || n <= 0) {
        snprintf(out->source, sizeof out->source, "no CUDA device (%s)",
                 e != 0 ? (errstr ? errstr(e) : "cudaGetDeviceCount failed") : "no devices found");
        return;
    }
    /* struct cudaDeviceProp is about 1 KiB; 16 KiB leaves room for growth */
    unsigned char *buf = calloc(1, 16384);
    int major = 0, minor = 0;
    if (!buf || props(buf, 0) != 0) {
        snprintf(out->source, sizeof out->source, "no GPU known (cudaGetDeviceProperties failed)");
        free(buf);
        return;
    }
    out->found = 1;
    memcpy(out->name, buf, sizeof out->name - 1);
    free(buf);
    if (attr(&major, GQ_ATTR_CC_MAJOR, 0) == 0 && attr(&minor, GQ_ATTR_CC_MINOR, 0) == 0)
        snprintf(out->cc, sizeof out->cc, "%d.%d", major, minor);
    int sms = 0;
    if (attr(&sms, GQ_ATTR_SMS, 0) == 0 && sms > 0)
        out->sms = sms;
    int v = 0;
    if (drv && drv(&v) == 0 && v > 0)
        snprintf(out->driver, sizeof out->driver, "%d.%d", v / 1000, (v % 1000) / 10);
    snprintf(out->source, sizeof out->source, "device 0 of the CUDA runtime");
}
