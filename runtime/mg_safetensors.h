/* mg_safetensors.h: safetensors checkpoints read (mmap, validated) and
 * written (atomically), plain C, no CUDA.
 *
 * The format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON header, then the data
 * buffer. The header is an object mapping each tensor name to
 *   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
 * (offsets relative to the data buffer) plus an optional "__metadata__"
 * object of string -> string.
 *
 * Reading: mg_st_open maps the file read-only and checks all of it before
 * returning: the header length (at most MG_ST_MAX_HEADER bytes, inside the
 * file), the JSON (a strict parser: UTF-8, escapes incl. surrogate pairs,
 * unsigned integers only, no duplicate keys, no unknown keys in a tensor
 * entry, nothing after the object but spaces), every dtype known, every
 * shape's element count and byte size free of overflow, every tensor's
 * data_offsets inside the data buffer with end - begin equal to its byte
 * size, and no two tensors' bytes overlapping (gaps are allowed). After
 * that no call reads outside the mapping. (A file truncated by another
 * process while mapped can still raise SIGBUS, as with any mmap.)
 *
 * Writing: mg_st_write writes the tensors sorted by name (byte order), their
 * data contiguous from offset 0, the header padded with spaces to a multiple
 * of 8 (so the data starts 8-byte aligned): byte for byte what the Python
 * library writes for the same tensors of one dtype. A temporary file in the
 * same directory is renamed over the path, so readers see the old file or
 * the whole new one.
 *
 * Errors: MG_ERR_IO (the file cannot be opened, read or written, or is not
 * a valid safetensors file), MG_ERR_INVALID_ARG (NULL or bad arguments, a
 * name not in the file, a dtype a call does not convert), MG_ERR_SIZE (a
 * shape that differs from the one expected, a blob too small, a checkpoint
 * that does not match a parameter table), MG_ERR_OUT_OF_MEMORY. Every
 * message names the file and what is wrong (mg_last_error()). */
#ifndef MG_SAFETENSORS_H
#define MG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "mg_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header accepted (the reference implementation's limit). */
#define MG_ST_MAX_HEADER 100000000u
/* Most dimensions a tensor may have. */
#define MG_ST_MAX_NDIM 32

/* The dtypes of the format (all whole bytes per element). */
typedef enum mg_st_dtype {
    MG_ST_F32 = 0, MG_ST_BF16 = 1, MG_ST_F16 = 2, /* the three mg_st_read_f32 converts */
    MG_ST_F64, MG_ST_BOOL, MG_ST_U8, MG_ST_I8, MG_ST_I16, MG_ST_U16,
    MG_ST_I32, MG_ST_U32, MG_ST_I64, MG_ST_U64, MG_ST_F8_E4M3, MG_ST_F8_E5M2,
    MG_ST_F8_E8M0, MG_ST_C64,
    MG_ST_DTYPE_COUNT
} mg_st_dtype;
/* "F32", "BF16", ... ("?" for a value out of range). */
const char *mg_st_dtype_name(mg_st_dtype t);
/* Bytes per element (0 for a value out of range). */
size_t mg_st_dtype_size(mg_st_dtype t);

/* One tensor of an open file; pointers stay valid until mg_st_close. */
typedef struct mg_st_info {
    const char *name;
    mg_st_dtype dtype;
    int ndim;
    const long *shape;     /* ndim entries */
    size_t numel;          /* product of shape (1 for a scalar) */
    const void *data;      /* raw little-endian bytes, maybe unaligned */
    size_t bytes;          /* numel * mg_st_dtype_size(dtype) */
} mg_st_info;

typedef struct mg_st_file mg_st_file;

/* Map and validate a file; *out is NULL on error. */
mg_status mg_st_open(const char *path, mg_st_file **out);
/* Unmap and free (NULL is a no-op). */
void mg_st_close(mg_st_file *f);
/* Number of tensors. */
size_t mg_st_count(const mg_st_file *f);
/* Tensor i, in the header's order (0 <= i < mg_st_count). */
mg_status mg_st_get(const mg_st_file *f, size_t i, mg_st_info *info);
/* Tensor by name; MG_ERR_INVALID_ARG (message names the file and the
 * tensor) when absent. */
mg_status mg_st_find(const mg_st_file *f, const char *name, mg_st_info *info);
/* The "__metadata__" entries: count, entry i, value by key (NULL if none). */
size_t mg_st_metadata_count(const mg_st_file *f);
mg_status mg_st_metadata_get(const mg_st_file *f, size_t i, const char **key, const char **value);
const char *mg_st_metadata(const mg_st_file *f, const char *key);

/* Tensor `name` (F32, BF16 or F16) converted to f32 into dst (numel
 * floats; bf16 and f16 convert exactly), after checking that its shape is
 * shape[0..ndim) (MG_ERR_SIZE otherwise). */
mg_status mg_st_read_f32(const mg_st_file *f, const char *name, const long *shape, int ndim,
                         float *dst);

/* Fill a flat f32 blob of blob_floats floats from a parameter table: entry
 * i is the tensor names[i] of shape shapes[i][0..ndims[i]) at blob offset
 * offsets[i] (in floats). Every table name must be in the file and every
 * file tensor in the table; a file name that starts with strip_prefix (if
 * not NULL, e.g. "backbone.") is matched without it. All problems (missing
 * names, unexpected names, wrong shapes, dtypes other than F32/BF16/F16,
 * ambiguous names) are checked before anything is written and reported
 * together in one MG_ERR_SIZE message, counts first (a message longer than
 * mg_last_error's buffer is cut and ends in "..."). The blob is untouched
 * on error. */
mg_status mg_st_load_table(const mg_st_file *f, const char *const *names,
                           const long *const *shapes, const int *ndims, const size_t *offsets,
                           size_t n, const char *strip_prefix, float *blob, size_t blob_floats);

/* Write n f32 tensors (names[i], shape shapes[i][0..ndims[i]), values
 * data[i]) as dtype MG_ST_F32, MG_ST_BF16 or MG_ST_F16 (round to nearest
 * even; NaN stays NaN) to path, atomically. metadata_json, if not NULL, is
 * a JSON object of string values ({"format":"pt"}) stored as
 * "__metadata__". Names must be distinct, valid UTF-8 and not
 * "__metadata__". */
mg_status mg_st_write(const char *path, size_t n, const char *const *names,
                      const long *const *shapes, const int *ndims, const float *const *data,
                      mg_st_dtype dtype, const char *metadata_json);

/* The conversions used (exact from bf16/f16; round to nearest even to). */
float mg_st_bf16_to_f32(uint16_t h);
float mg_st_f16_to_f32(uint16_t h);
uint16_t mg_st_f32_to_bf16(float x);
uint16_t mg_st_f32_to_f16(float x);

#ifdef __cplusplus
}
#endif
#endif
