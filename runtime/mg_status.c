/* mg_status.c: status code names, descriptions and the thread-local
 * message of the last failure. */
#include "mg_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MG_MSG_MAX 1024

static _Thread_local char mg_msg[MG_MSG_MAX];

const char *mg_status_name(mg_status s)
{
    switch (s) {
    case MG_OK: return "MG_OK";
    case MG_ERR_INVALID_ARG: return "MG_ERR_INVALID_ARG";
    case MG_ERR_ALIGNMENT: return "MG_ERR_ALIGNMENT";
    case MG_ERR_SIZE: return "MG_ERR_SIZE";
    case MG_ERR_NO_DEVICE: return "MG_ERR_NO_DEVICE";
    case MG_ERR_CUDA: return "MG_ERR_CUDA";
    case MG_ERR_CUBLAS: return "MG_ERR_CUBLAS";
    case MG_ERR_NVRTC: return "MG_ERR_NVRTC";
    case MG_ERR_OUT_OF_MEMORY: return "MG_ERR_OUT_OF_MEMORY";
    case MG_ERR_STATE: return "MG_ERR_STATE";
    case MG_ERR_MISMATCH: return "MG_ERR_MISMATCH";
    case MG_ERR_IO: return "MG_ERR_IO";
    }
    return "MG_ERR_UNKNOWN";
}

const char *mg_status_str(mg_status s)
{
    switch (s) {
    case MG_OK: return "success";
    case MG_ERR_INVALID_ARG: return "invalid argument";
    case MG_ERR_ALIGNMENT: return "device pointer not aligned as required";
    case MG_ERR_SIZE: return "buffer or blob of the wrong size";
    case MG_ERR_NO_DEVICE: return "no usable CUDA device or driver";
    case MG_ERR_CUDA: return "CUDA runtime call failed";
    case MG_ERR_CUBLAS: return "cuBLAS call failed";
    case MG_ERR_NVRTC: return "NVRTC compilation failed";
    case MG_ERR_OUT_OF_MEMORY: return "out of memory";
    case MG_ERR_STATE: return "call out of order";
    case MG_ERR_MISMATCH: return "result disagrees with the reference";
    case MG_ERR_IO: return "file could not be read or written";
    }
    return "unknown status code";
}

const char *mg_last_error(void)
{
    return mg_msg;
}

mg_status mg_fail(mg_status s, const char *fmt, ...)
{
    if (fmt == NULL || fmt[0] == '\0') {
        snprintf(mg_msg, sizeof mg_msg, "%s", mg_status_str(s));
        return s;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(mg_msg, sizeof mg_msg, fmt, ap);
    va_end(ap);
    if (n < 0) {
        snprintf(mg_msg, sizeof mg_msg, "%s", mg_status_str(s));
    } else if ((size_t)n >= sizeof mg_msg) {
        /* Truncated: mark it so a reader knows text is missing. */
        memcpy(mg_msg + sizeof mg_msg - 4, "...", 4);
    }
    return s;
}

void mg_clear_error(void)
{
    mg_msg[0] = '\0';
}
