// grad_accum.cuh: gradient accumulation of the training path
// (NAME_backward.cu, train_optim "norm" part): with accumulation on, a
// backward writes its parameter gradients into the trainer's scratch blob
// and this kernel adds them to the caller's blob, g[i] = g[i] + part[i]: one
// rounding per element, no atomics, the same result whatever the grid (a
// sum of two in a fixed order), so accumulating the same gradient twice
// onto zeros gives exactly 2g. Written against RED_THREADS and GNORM_BLOCKS
// of the train_optim constants; includes nothing itself.
__global__ void __launch_bounds__(RED_THREADS)
grad_accum_kernel(size_t n, float *__restrict__ g, const float *__restrict__ part)
{
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)GNORM_BLOCKS * RED_THREADS)
        g[i] = g[i] + part[i];
}
