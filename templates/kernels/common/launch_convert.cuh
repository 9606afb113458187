// mg_launch_convert.cuh: the launcher of the weight conversion (mg_convert.cuh)
// of libraries with a 16-bit storage dtype, the same for every arch (C
// linkage, prototype in the arch's launch.h). Included by NAME_kernels.cu
// after its anonymous namespace, under the arch's *_LOWP: it includes
// nothing itself.

extern "C" cudaError_t MG_LAUNCH(convert)(const float *w, void *wa, size_t n, cudaStream_t stream)
{
    size_t blocks = (n + CONVERT_THREADS - 1) / CONVERT_THREADS;
    if (blocks > (size_t)CONVERT_BLOCKS_MAX) blocks = CONVERT_BLOCKS_MAX;
    if (blocks == 0) return cudaSuccess;
    convert_kernel<<<(unsigned)blocks, CONVERT_THREADS, 0, stream>>>(w, static_cast<act_t *>(wa), n);
    return cudaGetLastError();
}
