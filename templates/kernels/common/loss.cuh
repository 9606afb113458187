// loss.cuh: the MSE loss (two stages) and the dynamic loss-scaling
// kernels.
// Shared by every arch's training path. Written against RED_THREADS,
// GNORM_BLOCKS and block_sum_f64 (block_sum.cuh or the
// arch's own); #included by NAME_backward.cu inside its anonymous namespace
// (through the train_optim parts), so it includes nothing itself.

// MSE loss stage 1: dout = (out - target) * scale, part[block] = sum (out-target)^2 (f64).
__global__ void __launch_bounds__(RED_THREADS)
mse_part_kernel(size_t n, const float *__restrict__ out, const float *__restrict__ target, float scale,
                float *__restrict__ dout, double *__restrict__ part)
{
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)GNORM_BLOCKS * RED_THREADS) {
        const float dlt = out[i] - target[i];
        dout[i] = dlt * scale;
        acc += (double)dlt * dlt;
    }
    const double t = block_sum_f64<RED_THREADS>(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

// loss = factor * sum(part), parts in order.
__global__ void __launch_bounds__(32)
sum_final_kernel(const double *__restrict__ part, double factor, float *__restrict__ loss)
{
    if (threadIdx.x != 0) return;
    double t = 0.0;
    for (int k = 0; k < GNORM_BLOCKS; ++k) t += part[k];
    *loss = (float)(t * factor);
}

// ---- Dynamic loss scaling ----
// scaler = { S, finite backward calls since S last changed, non-finite
// backward calls in total, growth interval }. The backward multiplies dout by
// S (S a power of two, so the scaling is exact) to keep the storage-dtype
// gradient wires out of f16's subnormal range, and divides every gradient it
// returns by S. A non-finite parameter gradient halves S (down to 1); every
// growth-interval finite calls double it (up to 2^24), as AMP's GradScaler.
__global__ void __launch_bounds__(32)
scaler_init_kernel(float *__restrict__ scaler, float s, float interval)
{
    if (threadIdx.x != 0) return;
    scaler[0] = s;
    scaler[1] = 0.0f;
    scaler[2] = 0.0f;
    scaler[3] = interval;
}

// x[i] /= S over the fixed GNORM_BLOCKS x RED_THREADS grid-stride partition;
// part (optional) [block] = the number of non-finite results in the block.
__global__ void __launch_bounds__(RED_THREADS)
unscale_kernel(size_t n, float *__restrict__ x, const float *__restrict__ scaler, double *__restrict__ part)
{
    const float inv = 1.0f / scaler[0];   // exact: S is a power of two
    double bad = 0.0;
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)GNORM_BLOCKS * RED_THREADS) {
        const float v = x[i] * inv;
        x[i] = v;
        if (!isfinite(v)) bad += 1.0;
    }
    if (!part) return;
    const double t = block_sum_f64<RED_THREADS>(bad);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

// One thread: the non-finite count of unscale_kernel's partials (fixed
// order) decides the next S.
__global__ void __launch_bounds__(32)
scaler_update_kernel(const double *__restrict__ part, float *__restrict__ scaler)
{
    if (threadIdx.x != 0) return;
    double bad = 0.0;
    for (int k = 0; k < GNORM_BLOCKS; ++k) bad += part[k];
    if (bad > 0.0) {
        scaler[0] = fmaxf(scaler[0] * 0.5f, 1.0f);
        scaler[1] = 0.0f;
        scaler[2] += 1.0f;
    } else if (scaler[1] + 1.0f >= scaler[3]) {
        scaler[0] = fminf(scaler[0] * 2.0f, 16777216.0f);
        scaler[1] = 0.0f;
    } else {
        scaler[1] += 1.0f;
    }
}
