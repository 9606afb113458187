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

extern "C" cudaError_t MG_LAUNCH(group_rows)(const float *src, float *dst, int width, const int *off, const int *idx,
                                             int k, int len, int scatter, cudaStream_t stream)
{
    const int nrows = k * len;
    group_rows_kernel<<<packed_blocks(nrows), 128, 0, stream>>>(src, dst, width, off, idx, len, nrows, scatter);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(group_states)(const float *src, float *dst, size_t per, const int *idx, int k,
                                               int nseq, int n_layers, int scatter, cudaStream_t stream)
{
    const int nrows = n_layers * k;
    group_states_kernel<<<packed_blocks(nrows), 128, 0, stream>>>(src, dst, per, idx, k, nseq, nrows, scatter);
    return cudaGetLastError();
}
