/* mg_status.h: status codes and error messages shared by the runtime and
 * every generated library. A failing call returns a code and leaves a
 * readable, thread-local message in mg_last_error(). */
#ifndef MG_STATUS_H
#define MG_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_status {
    MG_OK = 0,
    MG_ERR_INVALID_ARG = 1,   /* a NULL pointer, a count out of range */
    MG_ERR_ALIGNMENT = 2,     /* a device pointer not aligned as required */
    MG_ERR_SIZE = 3,          /* a buffer or blob of the wrong size */
    MG_ERR_NO_DEVICE = 4,     /* no usable CUDA device or driver */
    MG_ERR_CUDA = 5,          /* a CUDA runtime call failed */
    MG_ERR_CUBLAS = 6,        /* a cuBLAS call failed */
    MG_ERR_NVRTC = 7,         /* an NVRTC compile failed */
    MG_ERR_OUT_OF_MEMORY = 8, /* host or device allocation failed */
    MG_ERR_STATE = 9,         /* call out of order (e.g. no weights set) */
    MG_ERR_MISMATCH = 10,     /* a result disagreed with the reference */
    MG_ERR_IO = 11            /* a file could not be read or written */
} mg_status;

/* Stable name of a code, e.g. "MG_ERR_SIZE". */
const char *mg_status_name(mg_status s);
/* One-line description of a code. */
const char *mg_status_str(mg_status s);
/* Message of the last failure on this thread ("" if none). */
const char *mg_last_error(void);
/* Record a failure: sets the thread's message (printf format) and returns s,
 * so callers write `return mg_fail(MG_ERR_SIZE, "...", ...)`. */
mg_status mg_fail(mg_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear the thread's message. */
void mg_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
