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
template <bool ST, bool FDT>
__global__ void __launch_bounds__(SCAN_THREADS)
chunk_state_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                   const act_t *__restrict__ dbl, const float *__restrict__ dt_bias,
                   const float *__restrict__ A_log, float *__restrict__ cstate,
                   float *__restrict__ dsum_out, const unsigned char *__restrict__ start)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];
    __shared__ unsigned sst[1];
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

template <bool ST, bool FDT>
__global__ void __launch_bounds__(SCAN_THREADS)
chunk_output_kernel(int seqlen, int nc, const act_t *__restrict__ xc, const act_t *__restrict__ dt,
                    const act_t *__restrict__ dbl, const act_t *__restrict__ xz,
                    const float *__restrict__ dt_bias, const float *__restrict__ A_log,
                    const float *__restrict__ Dskip, const float *__restrict__ cstate,
                    float *state_out, act_t *__restrict__ g, const unsigned char *__restrict__ start)
{
    __shared__ float sBC[SCAN_TCHUNK][SCAN_STAGE_W];
    __shared__ unsigned sst[1];
    chunk_output_body<ST, FDT>(seqlen, nc, xc, dt, dbl, xz, dt_bias, A_log, Dskip, cstate, state_out, g, sBC,
                          ModelDims(), start, sst);
}
#endif // MG_M1_SCAN_CHUNKED
