// launch_train.cuh: the launchers of the Mamba-1 training kernels, the C
// functions the trainer (NAME_train.c) calls: MG_LAUNCH(fn) is
// NAME_launch_fn (NAME_common.cuh). #included by NAME_backward.cu after its
// anonymous namespace (C linkage), so it includes nothing itself. (The
// launchers of the kernels every arch shares stay in
// templates/common/train_optim.cu.tmpl.)
// A kernel (or launch helper) with an episode-start parameter comes in two
// instances: `start ? k<true> : k<false>` picks the one for this call and
// the single launch passes start as given, NULL exactly when the maskless
// instance runs, so each argument list is written once.

// Blocks of a grid-stride kernel over n elements (at most 4096).
static unsigned grid_for(size_t n)
{
    size_t blocks = (n + RED_THREADS - 1) / RED_THREADS;
    if (blocks > 4096) blocks = 4096;
    if (blocks < 1) blocks = 1;
    return (unsigned)blocks;
}


// ===========================================================================
// Launchers (C linkage, prototypes in NAME_train.h under NAME_INTERNAL).
// Arguments are checked by NAME_train.c before any launch.
// ===========================================================================
extern "C" cudaError_t MG_LAUNCH(bias_rows_train)(float *h, const float *bias, int rows, cudaStream_t st)
{
    const size_t n = (size_t)rows * D;
    bias_rows_train_kernel<<<grid_for(n), RED_THREADS, 0, st>>>(n, bias, h);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(conv_fwd)(int batch, int seqlen, const void *xz, const float *cw,
                                      const float *cb, float *state, float *cs0, void *xc,
                                      const unsigned char *start, cudaStream_t st)
{
    const int ntiles = (seqlen + CONV_TILE - 1) / CONV_TILE;
    const dim3 grid((unsigned)batch * ntiles, CONV_BLOCKS);
    const auto kernel = start ? conv_fwd_kernel<true> : conv_fwd_kernel<false>;
    kernel<<<grid, CONV_THREADS, 0, st>>>(
        seqlen, ntiles, static_cast<const act_t *>(xz), cw, cb, state, cs0, static_cast<act_t *>(xc), start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan_fwd)(int batch, int seqlen, int chunked, const void *xc, const void *dt,
                                      const void *dbl, const void *xz, const float *dt_bias,
                                      const float *A_log, const float *Dskip, const float *state_in,
                                      float *state_out, float *cstate, float *dsum, float *ckpt, void *y,
                                      void *g, const unsigned char *start, cudaStream_t st)
{
    int nc = 1;
#if MG_M1_SCAN_CHUNKED
    if (chunked) {   // passes 1 and 2 of the chunked scan (NAME_kernels.cu), then the output pass here
        nc = (seqlen + SCAN_CHUNK - 1) / SCAN_CHUNK;
        const cudaError_t e = MG_LAUNCH(scan_chunk_states)(batch, seqlen, xc, dt, dbl, dt_bias, A_log, state_in,
                                                           cstate, dsum, start, st);
        if (e != cudaSuccess) return e;
    }
#else
    if (chunked) return cudaErrorInvalidValue;   // no chunked scan in this library
    (void)cstate;
    (void)dsum;
#endif
    const dim3 grid(batch, SCAN_BLOCKS, nc);
    const auto kernel = start ? scan_fwd_kernel<true> : scan_fwd_kernel<false>;
    kernel<<<grid, SCAN_THREADS, 0, st>>>(
        seqlen, nc, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
        static_cast<const act_t *>(dbl), static_cast<const act_t *>(xz), dt_bias, A_log, Dskip,
        state_in, cstate, state_out, ckpt, static_cast<act_t *>(y), static_cast<act_t *>(g), start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(colsum_part)(int rows, const float *x, float *part, cudaStream_t st)
{
    const int blocks = (rows + NORMB_ROWS - 1) / NORMB_ROWS;
    colsum_part_kernel<<<blocks, RED_THREADS, 0, st>>>(rows, x, part);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(gate_bwd)(int tokens, const void *y, const void *xz, const float *dg,
                                      void *g, float *dy, void *dxz, cudaStream_t st)
{
    const size_t n = (size_t)tokens * E;
    gate_bwd_kernel<<<grid_for(n), RED_THREADS, 0, st>>>(n, static_cast<const act_t *>(y),
                                                         static_cast<const act_t *>(xz), dg,
                                                         static_cast<act_t *>(g), dy,
                                                         static_cast<act_t *>(dxz));
    return cudaGetLastError();
}

// scan_bwd_kernel's shared memory (static + the dynamic dB | dC group
// buffer) above 48 KiB needs the opt-in, once per process and instance
// (function-local statics: initialised once, thread-safe).
template <bool ST>
static cudaError_t scan_bwd_smem_optin()
{
    static const cudaError_t e = BWD_SMEM_BYTES + 64 > 48 * 1024
        ? cudaFuncSetAttribute(scan_bwd_kernel<ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, BWD_RED_BYTES)
        : cudaSuccess;
    return e;
}

template <bool ST>
static cudaError_t scan_bwd_launch(int batch, int seqlen, int nspans, const void *xc, const void *dt,
                                   const void *dbl, const float *dt_bias, const float *A_log,
                                   const float *Dskip, const float *ckpt, const float *dy,
                                   float *dxc, void *ddt, float *part_bc, float *part_A,
                                   float *part_D, float *part_dtb, float *span_p, float *span_ds,
                                   float *dss, const unsigned char *start, cudaStream_t st)
{
    const cudaError_t oe = scan_bwd_smem_optin<ST>();
    if (oe != cudaSuccess) return oe;
    const act_t *xc_ = static_cast<const act_t *>(xc), *dt_ = static_cast<const act_t *>(dt);
    const act_t *dbl_ = static_cast<const act_t *>(dbl);
    if (nspans <= 1) {   // sequential: one span over the whole sequence
        scan_bwd_kernel<ST><<<dim3(batch, BW_BLOCKS, 1), BW_THREADS, BWD_RED_BYTES, st>>>(
            seqlen, batch * seqlen, (seqlen + BCK - 1) / BCK, xc_, dt_, dbl_, dt_bias, A_log, Dskip, ckpt, dy,
            nullptr, dxc, static_cast<act_t *>(ddt), part_bc, part_A, part_D, part_dtb, dss, start);
        return cudaGetLastError();
    }
#if MG_M1_BSCAN_CHUNKED
    if (nspans != (seqlen + BSPAN - 1) / BSPAN || !span_p || !span_ds) return cudaErrorInvalidValue;
    scan_bwd_span_kernel<ST><<<dim3(batch, BW_BLOCKS, nspans), SPAN_THREADS, 0, st>>>(
        seqlen, dt_, dbl_, dt_bias, A_log, dy, span_p, span_ds, start);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const size_t n = (size_t)batch * E * N;
    scan_bwd_combine_kernel<<<(unsigned)((n + BCOMB_THREADS - 1) / BCOMB_THREADS), BCOMB_THREADS, 0, st>>>(
        batch, nspans, span_p, span_ds);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    scan_bwd_kernel<ST><<<dim3(batch, BW_BLOCKS, nspans), BW_THREADS, BWD_RED_BYTES, st>>>(
        seqlen, batch * seqlen, BSPAN_CK, xc_, dt_, dbl_, dt_bias, A_log, Dskip, ckpt, dy, span_ds, dxc,
        static_cast<act_t *>(ddt), part_bc, part_A, part_D, part_dtb, dss, start);
    return cudaGetLastError();
#else
    (void)span_p;
    (void)span_ds;
    return cudaErrorInvalidValue;   // no chunk-parallel backward in this library
#endif
}

// start NULL: the maskless kernels; else the episode-start ones (ST = true).
extern "C" cudaError_t MG_LAUNCH(scan_bwd)(int batch, int seqlen, int nspans, const void *xc, const void *dt,
                                      const void *dbl, const float *dt_bias, const float *A_log,
                                      const float *Dskip, const float *ckpt, const float *dy,
                                      float *dxc, void *ddt, float *part_bc, float *part_A,
                                      float *part_D, float *part_dtb, float *span_p, float *span_ds,
                                      float *dss, const unsigned char *start, cudaStream_t st)
{
    const auto launch = start ? scan_bwd_launch<true> : scan_bwd_launch<false>;
    return launch(batch, seqlen, nspans, xc, dt, dbl, dt_bias, A_log, Dskip, ckpt, dy, dxc, ddt, part_bc, part_A, part_D,
                  part_dtb, span_p, span_ds, dss, start, st);
}

extern "C" cudaError_t MG_LAUNCH(bc_reduce)(int tokens, const float *part_bc, void *ddbl, cudaStream_t st)
{
    const size_t n = (size_t)tokens * 2 * N;
    bc_reduce_kernel<<<(unsigned)((n + RED_THREADS - 1) / RED_THREADS), RED_THREADS, 0, st>>>(
        tokens, part_bc, static_cast<act_t *>(ddbl));
    return cudaGetLastError();
}


extern "C" cudaError_t MG_LAUNCH(conv_bwd)(int batch, int seqlen, const void *xz, const float *cw,
                                      const float *cb, const float *cs0, const float *dxc, void *dxz,
                                      float *dcs, float *part_w, float *part_b, const unsigned char *start,
                                      cudaStream_t st)
{
    const int ntiles = (seqlen + CONV_TILE - 1) / CONV_TILE;
    const dim3 grid((unsigned)batch * ntiles, CONV_BLOCKS);
    const auto kernel = start ? conv_bwd_kernel<true> : conv_bwd_kernel<false>;
    kernel<<<grid, CONV_THREADS, 0, st>>>(
        seqlen, ntiles, static_cast<const act_t *>(xz), cw, cb, cs0, dxc, static_cast<act_t *>(dxz), dcs,
        part_w, part_b, start);
    return cudaGetLastError();
}

// The three groups of a layer's sums as jobs of one sum_parts_jobs call:
// each job's rows summed in the groups and order of sum_parts_segs (so the
// bits are those of one launch pair per group).
static_assert(CONV_PART_GROUP == RED_PART_GROUP, "layer_param_sums: one group size for its jobs");
extern "C" cudaError_t MG_LAUNCH(layer_param_sums)(int nrows, float *part_rows, float *gnorm, int nparts,
                                                   float *part_A, float *part_D, float *part_dtb, float *gA,
                                                   float *gD, float *gdtb, int nconv, float *part_w,
                                                   float *part_b, float *gw, float *gb, cudaStream_t st)
{
    red_jobs s = {};
    red_jobs_add(s, part_rows, D, D, nrows, gnorm);
    red_jobs_add(s, part_A, (size_t)E * N, E * N, nparts, gA);
    red_jobs_add(s, part_D, E, E, nparts, gD);
    red_jobs_add(s, part_dtb, E, E, nparts, gdtb);
    red_jobs_add(s, part_w, (size_t)E * K, E * K, nconv, gw);
    red_jobs_add(s, part_b, E, E, nconv, gb);
    return sum_parts_jobs<RED_PART_GROUP>(s, st);
}

extern "C" cudaError_t MG_LAUNCH(adamw)(float *w, const float *g, float *m, float *v, const float *stat,
                                   const adamw_params *hp, const float *coef, void *wa,
                                   cudaStream_t st)
{
    adamw_kernel<<<grid_for(WEIGHTS_TOTAL), RED_THREADS, 0, st>>>(
        WEIGHTS_TOTAL, w, g, m, v, stat, hp, coef, static_cast<act_t *>(wa));
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(convert_train)(const float *w, void *wa, cudaStream_t st)
{
    convert_train_kernel<<<grid_for(WEIGHTS_TOTAL), RED_THREADS, 0, st>>>(WEIGHTS_TOTAL, w, static_cast<act_t *>(wa));
    return cudaGetLastError();
}
