// grad_norm.cuh: the global gradient norm (two stages) and the
// AdamW step preparation kernel.
// Shared by every arch's training path. Written against RED_THREADS,
// GNORM_BLOCKS, adamw_params (a typedef of NAME_adamw_params) and block_sum_f64 (block_sum.cuh or the
// arch's own); #included by NAME_backward.cu inside its anonymous namespace
// (through the train_optim parts), so it includes nothing itself.

// Stage 1 of the global gradient norm: block k sums g[i]^2 (f64) over the
// fixed grid-stride set of the GNORM_BLOCKS x RED_THREADS partition.
__global__ void __launch_bounds__(RED_THREADS)
sumsq_part_kernel(size_t n, const float *__restrict__ g, double *__restrict__ part)
{
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * RED_THREADS + threadIdx.x; i < n; i += (size_t)GNORM_BLOCKS * RED_THREADS) {
        const double v = g[i];
        acc += v * v;
    }
    const double t = block_sum_f64<RED_THREADS>(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

// Stage 2: stat[0] = ||g||, stat[1] = clip scale = min(1, max_norm/(||g|| + 1e-6))
// (1 when max_norm <= 0: no clipping), as torch.nn.utils.clip_grad_norm_.
// A non-finite norm (an inf or NaN in the gradients) gives clip scale 0, and
// adamw_kernel skips the whole update: weights and moments stay as they were.
__global__ void __launch_bounds__(32)
gnorm_final_kernel(const double *__restrict__ part, const adamw_params *__restrict__ hp,
                   float *__restrict__ stat)
{
    if (threadIdx.x != 0) return;
    const float max_norm = hp->max_grad_norm;
    double t = 0.0;
    for (int k = 0; k < GNORM_BLOCKS; ++k) t += part[k];
    const double nrm = sqrt(t);
    double sc = 1.0;
    if (!isfinite(nrm)) sc = 0.0;
    else if (max_norm > 0.0f) {
        sc = (double)max_norm / (nrm + 1e-6);
        if (sc > 1.0) sc = 1.0;
    }
    stat[0] = (float)nrm;
    stat[1] = (float)sc;
}

// AdamW step preparation, one thread, before the gradient norm. The
// hyperparameters of this step are p (eager call: by value) or *next (the
// training graph: device memory, so that a replayed graph performs
// successive steps): then next->step is incremented for the following
// replay. The step's hyperparameters go to *cur and the derived factors to
// coef = { decay = 1 - lr wd, step_size = lr / bc1, sqrt(bc2) } with
// bc = 1 - beta^step in f64; gnorm_final_kernel and adamw_kernel read them.
// Eager calls and graph replays compute them with this same code, so both
// give the same bits.
__global__ void __launch_bounds__(32)
adamw_prep_kernel(adamw_params p, adamw_params *next, adamw_params *cur,
                  float *__restrict__ coef)
{
    if (threadIdx.x != 0) return;
    if (next) {
        p = *next;
        next->step = p.step + 1;
    }
    *cur = p;
    const double bc1 = 1.0 - pow((double)p.beta1, (double)p.step);
    const double bc2 = 1.0 - pow((double)p.beta2, (double)p.step);
    coef[0] = (float)(1.0 - (double)p.lr * (double)p.weight_decay);
    coef[1] = (float)((double)p.lr / bc1);
    coef[2] = (float)sqrt(bc2);
}
