// scan_fwd.cuh: the selective scan kernels of the Mamba-1 forward
// (NAME_kernels.cu): the sequential scan, and the three kernels of the
// chunked scan (MG_M1_SCAN_CHUNKED). Their bodies are in scan_body.cuh
// (shared with the autotuner's candidates), here compiled with the model's
// dimensions as compile-time constants (ModelDims, NAME_common.cuh). Written against the
// constants of NAME_common.cuh (E, E2, N, R, XP, SCAN_*, COMBINE_THREADS,
// act_t); #included by NAME_kernels.cu inside its anonymous namespace, after
// mg_m1_scan_body.cuh, so it includes nothing itself.

static_assert(SCAN_TCHUNK <= 32, "a pass's start flags are one 32-bit word (scan_span)");

// Sequential scan (scan_seq_body). Grid (batch, SCAN_BLOCKS). reset [batch]
// (NULL: none): a sequence whose entry is nonzero starts from zeros instead
// of state_in (the decode step's reset mask; a block scans one sequence, so
// the body just gets no state for it). ST: episode starts, start [batch]
// [seqlen] (uint8, nonzero: the states are zeroed before that token;
// scan_span), staged per pass as one word in sst; the launcher instantiates ST = true
// only for a call with a start mask, so the maskless kernel is unchanged.
// FDT: dt_proj fused into the scan (SCAN_FUSE_DT; scan_span): `dt` is then
// dt_proj.weight [E][R], and the inference launchers pass it so (the
// training forward's passes keep the dt_proj output: FDT = false).
template <bool ST, bool FDT>
__global__ void __launch_bounds__(SCAN_THREADS)
scan_kernel(int seqlen, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
            const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
            const float *__restrict__ dt_bias, const float *__restrict__ A_log,
            const float *__restrict__ Dskip, const float *state_in, float *state_out,
            act_t *__restrict__ g, const unsigned char *__restrict__ reset,
            const unsigned char *__restrict__ start)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];   // [t][B | C | xc, delta, silu(z)]
    __shared__ unsigned sst[1];   // the pass's start flags as a word (ST)
    const bool fresh = reset && reset[blockIdx.x];
    scan_seq_body<ST, FDT>(seqlen, xc, dt, dbl, xz, dt_bias, A_log, Dskip, fresh ? nullptr : state_in, state_out, g,
                      sBC, ModelDims(), start, sst);
}
#if MG_M1_SCAN_CHUNKED

// The chunked scan's three passes (see chunk_state_body in scan_body.cuh);
// ST and start as in scan_kernel (the combine reads the starts from dsum).
// COPY0 (the inference's self-combining scan, SCAN_SELF_COMBINE): the
// blocks of chunk 0 also copy the initial state, state_in (reset [batch]
// or NULL: zeros), into cstate slot 0, where the output pass reads it (it
// may not read state_in, which its last chunk overwrites in place).
template <bool ST, bool FDT, bool COPY0 = false>
__global__ void __launch_bounds__(SCAN_THREADS)
chunk_state_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                   const act_t *__restrict__ dbl, const float *__restrict__ dt_bias,
                   const float *__restrict__ A_log, float *__restrict__ cstate,
                   float *__restrict__ dsum_out, const unsigned char *__restrict__ start,
                   const float *state_in = nullptr, const unsigned char *__restrict__ reset = nullptr)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];
    __shared__ unsigned sst[1];
    if (COPY0 && blockIdx.z == 0) {
        const size_t b = blockIdx.x;
        const int e = blockIdx.y * SCAN_CHANNELS + threadIdx.x / SCAN_LANES;
        const int lane = threadIdx.x % SCAN_LANES;
        const float *si = (reset && reset[b]) ? nullptr : state_in;
        if (e < E) {
#pragma unroll
            for (int j = 0; j < SCAN_NPT; ++j) {
                const size_t en = (size_t)e * N + lane * SCAN_NPT + j;
                cstate[(b * nc) * E * N + en] = si ? si[b * E * N + en] : 0.0f;
            }
        }
    }
    chunk_state_body<ST, FDT>(seqlen, nc, xc, dt, dbl, dt_bias, A_log, cstate, dsum_out, sBC, ModelDims(), start, sst);
}

// reset [batch] (NULL: none) as in scan_kernel; one thread per (b, e, n).
template <bool ST>
__global__ void __launch_bounds__(COMBINE_THREADS)
chunk_combine_kernel(int batch, int nc, const float *__restrict__ A_log, const float *state_in,
                     float *__restrict__ cstate, const float *__restrict__ dsum,
                     const unsigned char *__restrict__ reset)
{
    const size_t b = ((size_t)blockIdx.x * COMBINE_THREADS + threadIdx.x) / ((size_t)E * N);
    const bool fresh = reset && b < (size_t)batch && reset[b];
    chunk_combine_body<ST>(batch, nc, A_log, fresh ? nullptr : state_in, cstate, dsum, ModelDims());
}

// SELF (SCAN_SELF_COMBINE): no combine launch; each block walks the
// combine for its chunk (chunk_output_body<.., SELF>) from cstate slot 0
// (COPY0), or with one chunk from state_in (reset [batch] or NULL: zeros).
template <bool ST, bool FDT, bool SELF = false>
__global__ void __launch_bounds__(SCAN_THREADS)
chunk_output_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                    const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
                    const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                    const float *__restrict__ Dskip, const float *__restrict__ cstate,
                    float *state_out, act_t *__restrict__ g, const unsigned char *__restrict__ start,
                    const float *state_in = nullptr, const float *__restrict__ dsum = nullptr,
                    const unsigned char *__restrict__ reset = nullptr)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];
    __shared__ unsigned sst[1];
    const bool fresh = SELF && reset && reset[blockIdx.x];
    chunk_output_body<ST, FDT, SELF>(seqlen, nc, xc, dt, dbl, xz, dt_bias, A_log, Dskip, cstate, state_out, g, sBC,
                                ModelDims(), start, sst, fresh ? nullptr : state_in, dsum);
}
#endif // MG_M1_SCAN_CHUNKED
