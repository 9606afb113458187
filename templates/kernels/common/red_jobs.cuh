// red_jobs.cuh: several per-parameter sums of partial rows in one pair of
// launches, each sum ("job") with its own row count: the fused form of one
// sum_parts_segs call (mg_train_norm.cuh) per group of parameters. The
// Mamba-1 backward sums a layer's RMSNorm weight, scan parameters (A_log,
// D, dt_proj.bias) and conv weight and bias this way at the end of the
// layer: 2 launches instead of 6. Why: at small shapes these sums are a few
// microseconds each, most of it launch and latency (the RL spec's T = 32
// training step ran 18 of them). Each column is summed exactly as
// sum_parts_segs<G> sums it (groups of G rows in row order, each group's
// sum written over its first row, then the groups in order; no first stage
// where a job has at most G rows), so its bits do not depend on the jobs
// launched with it. Deterministic, no atomics.
// Written against RED_THREADS of NAME_backward.cu; included inside its
// anonymous namespace after mg_train_norm.cuh, so it includes nothing itself.

constexpr int RED_MAX_JOBS = 8;
struct red_jobs {
    float *part[RED_MAX_JOBS];     // job k's partials: nparts[k] rows ...
    size_t pstride[RED_MAX_JOBS];  // ... of pstride[k] floats
    float *out[RED_MAX_JOBS];      // its sums
    int start[RED_MAX_JOBS];       // its first flattened column
    int nparts[RED_MAX_JOBS];
    int ncols;                     // columns in all
    int njob;
};
// The job of flattened column c and c's column within it. Selected with
// constant indices (an unrolled walk), so that the parameter struct is read
// in place, not copied to local memory for a runtime index.
struct red_job {
    float *part;
    size_t pstride;
    float *out;
    int i;
    int nparts;
};
__device__ __forceinline__ red_job red_job_of(const red_jobs &s, int c)
{
    red_job r = { s.part[0], s.pstride[0], s.out[0], c - s.start[0], s.nparts[0] };
#pragma unroll
    for (int k = 1; k < RED_MAX_JOBS; ++k)
        if (k < s.njob && c >= s.start[k]) r = { s.part[k], s.pstride[k], s.out[k], c - s.start[k], s.nparts[k] };
    return r;
}

// Stage 1, grid (the most groups of any job, columns): group blockIdx.x of
// column c, in place, for the jobs with more than G rows (sum_group, as
// reduce_groups_kernel).
template <int G>
__global__ void __launch_bounds__(RED_THREADS)
reduce_groups_jobs_kernel(const red_jobs s)
{
    const int c = blockIdx.y * RED_THREADS + threadIdx.x;
    if (c >= s.ncols) return;
    const red_job g = red_job_of(s, c);
    const int p0 = blockIdx.x * G;
    if (g.nparts <= G || p0 >= g.nparts) return;
    sum_group<G>(g.part + (size_t)p0 * g.pstride + g.i, g.pstride, p0, g.nparts);
}

// Stage 2: out = the rows (or the groups' sums, G rows apart) in order
// (sum_rows, as reduce_parts_kernel).
template <int G>
__global__ void __launch_bounds__(RED_THREADS)
reduce_parts_jobs_kernel(const red_jobs s)
{
    const int c = blockIdx.x * RED_THREADS + threadIdx.x;
    if (c >= s.ncols) return;
    const red_job g = red_job_of(s, c);
    const bool grouped = g.nparts > G;
    g.out[g.i] = sum_rows(g.part, grouped ? (g.nparts + G - 1) / G : g.nparts, g.pstride * (grouped ? G : 1), g.i);
}

// Job njob of s: nparts rows of part (pstride floats a row, n columns)
// summed into out.
static void red_jobs_add(red_jobs &s, float *part, size_t pstride, int n, int nparts, float *out)
{
    if (s.njob == 0) s.ncols = 0;
    s.part[s.njob] = part;
    s.pstride[s.njob] = pstride;
    s.out[s.njob] = out;
    s.start[s.njob] = s.ncols;
    s.nparts[s.njob] = nparts;
    s.ncols += n;
    ++s.njob;
}

template <int G>
static cudaError_t sum_parts_jobs(const red_jobs &s, cudaStream_t st)
{
    const unsigned cols = (unsigned)((s.ncols + RED_THREADS - 1) / RED_THREADS);
    int groups = 0;   // the most stage-1 groups of any job (0: no job needs stage 1)
    for (int k = 0; k < s.njob; ++k)
        if (s.nparts[k] > G) groups = groups > (s.nparts[k] + G - 1) / G ? groups : (s.nparts[k] + G - 1) / G;
    if (groups > 0) {
        reduce_groups_jobs_kernel<G><<<dim3((unsigned)groups, cols), RED_THREADS, 0, st>>>(s);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    reduce_parts_jobs_kernel<G><<<cols, RED_THREADS, 0, st>>>(s);
    return cudaGetLastError();
}
