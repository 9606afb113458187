// mg_convert.cuh: the weight conversion of the inference forward with a
// 16-bit storage dtype (f32 blob -> storage dtype, round to nearest), the
// same for every arch.
// Included inside the anonymous namespace of the package's .cu files, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// convert_kernel: wa[i] = (act_t) w[i] (round to nearest), grid-stride.
__global__ void __launch_bounds__(CONVERT_THREADS)
convert_kernel(const float *__restrict__ w, act_t *__restrict__ wa, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * CONVERT_THREADS + threadIdx.x; i < n;
         i += (size_t)gridDim.x * CONVERT_THREADS)
        wa[i] = from_f32<act_t>(w[i]);
}
