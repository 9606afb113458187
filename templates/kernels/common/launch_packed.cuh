// mg_launch_packed.cuh: the launchers of the packed-sequence gather and
// scatter (mg_packed.cuh), the same for every arch (C linkage, prototypes
// in NAME.h's internal section; MG_LAUNCH(fn) names them NAME_launch_fn).
// Argument ranges are checked by the host before any launch. Included by
// NAME_kernels.cu after its anonymous namespace; includes nothing.

static unsigned packed_blocks(int nrows)
{
    return (unsigned)(nrows < 4096 ? nrows : 4096);
}

extern "C" cudaError_t MG_LAUNCH(pack_rows)(const float *src, float *dst, int width, const int *off, int nseq,
                                            int maxlen, unsigned char *start, cudaStream_t stream)
{
    const int nrows = nseq * maxlen;
    pack_rows_kernel<<<packed_blocks(nrows), 128, 0, stream>>>(src, dst, width, off, maxlen, nrows, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(unpack_rows)(const float *src, float *dst, int width, const int *off, int nseq,
                                              int maxlen, cudaStream_t stream)
{
    const int nrows = nseq * maxlen;
    unpack_rows_kernel<<<packed_blocks(nrows), 128, 0, stream>>>(src, dst, width, off, maxlen, nrows);
    return cudaGetLastError();
}
