// mg_m3_norm_bwd.cuh: the first stage of the deterministic column sums of
// the Mamba-3 SISO per-token weight gradients (partials per block of rows;
// the RMSNorm backward and the in-order sum of the partials are the shared
// mg_train_norm.cuh).
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses): it includes nothing itself.

// part[block][c] = sum over the block's NORMB_ROWS rows of x[row][c] (rows in
// order), x [rows][width]: the first stage of every per-token column sum
// (input_proj.bias, dt_bias, B/C_norm weights, B/C biases). Grid
// (ceil(rows/NORMB_ROWS), column blocks).
__global__ void __launch_bounds__(RED_THREADS)
colsum_part_kernel(int rows, int width, const float *__restrict__ x, float *__restrict__ part)
{
    const int r0 = blockIdx.x * NORMB_ROWS;
    const int nr = min(NORMB_ROWS, rows - r0);
    for (int c = blockIdx.y * RED_THREADS + threadIdx.x; c < width; c += gridDim.y * RED_THREADS) {
        float acc = 0.0f;
        for (int rr = 0; rr < nr; ++rr) acc += x[(size_t)(r0 + rr) * width + c];
        part[(size_t)blockIdx.x * width + c] = acc;
    }
}
