// train_norm.cuh: the first stage of the Mamba-1 input_proj.bias gradient
// (the RMSNorm of the training path and the second stage are the shared
// mg_train_norm.cuh). Written against the constants of NAME_common.cuh and
// those NAME_backward.cu defines (NORMB_ROWS, RED_THREADS); #included by
// NAME_backward.cu inside its anonymous namespace, so it includes nothing
// itself.

// part[block][d] = sum over the block's NORMB_ROWS rows of x[row][d] (rows in
// order): first stage of the input_proj.bias gradient.
__global__ void __launch_bounds__(RED_THREADS)
colsum_part_kernel(int rows, const float *__restrict__ x, float *__restrict__ part)
{
    const int r0 = blockIdx.x * NORMB_ROWS;
    const int nr = min(NORMB_ROWS, rows - r0);
    for (int c = threadIdx.x; c < D; c += RED_THREADS) {
        float acc = 0.0f;
        for (int rr = 0; rr < nr; ++rr) acc += x[(size_t)(r0 + rr) * D + c];
        part[(size_t)blockIdx.x * D + c] = acc;
    }
}
