// launch.cuh: the launchers of the Mamba-1 forward kernels, the C functions
// the host pipeline (NAME.c) calls: MG_LAUNCH(fn) is NAME_launch_fn
// (NAME_common.cuh). #included by NAME_kernels.cu after its anonymous
// namespace (C linkage), so it includes nothing itself; the launchers of
// optional kernels exist with them (MG_M1_* of NAME_common.cuh).
// A kernel (or launch helper) with an episode-start parameter comes in two
// instances: `start ? k<true> : k<false>` picks the one for this call and
// the single launch passes start as given, NULL exactly when the maskless
// instance runs, so each argument list is written once.

// ===========================================================================
// Launchers (C linkage, prototypes in NAME.h under NAME_INTERNAL).
// Argument ranges are checked by the host pipeline before any launch.
// ===========================================================================
template <bool ST>
static cudaError_t conv_launch(int batch, int seqlen, const void *xz, const float *conv_w, const float *conv_b,
                               const float *state_in, float *state_out, void *xc, const unsigned char *reset,
                               const unsigned char *start, cudaStream_t stream)
{
    // Time tiles of CONV_TILE steps; tile 0 both reads state_in and writes
    // state_out (they may alias): one launch.
    const int ntiles = (seqlen + CONV_TILE - 1) / CONV_TILE;
    conv_silu_kernel<ST><<<dim3((unsigned)batch * ntiles, CONV_BLOCKS), CONV_THREADS, 0, stream>>>(
        seqlen, ntiles, static_cast<const act_t *>(xz), conv_w, conv_b, state_in, state_out,
        static_cast<act_t *>(xc), reset, start);
    return cudaGetLastError();
}

// start NULL: the maskless kernels (ST = false); else the episode-start ones.
extern "C" cudaError_t MG_LAUNCH(conv)(int batch, int seqlen, const void *xz, const float *conv_w,
                                const float *conv_b, const float *state_in, float *state_out,
                                void *xc, const unsigned char *reset, const unsigned char *start,
                                cudaStream_t stream)
{
    const auto launch = start ? conv_launch<true> : conv_launch<false>;
    return launch(batch, seqlen, xz, conv_w, conv_b, state_in, state_out, xc, reset, start, stream);
}

#if MG_M1_CONV_XPROJ
// One block per (sequence, conv tile), every channel (conv_xproj_kernel).
extern "C" cudaError_t MG_LAUNCH(conv_xproj)(int batch, int seqlen, const void *xz, const float *conv_w,
                                      const float *conv_b, const float *state_in, float *state_out,
                                      void *xc, const void *x_proj_w, void *dbl, const unsigned char *reset,
                                      const unsigned char *start, cudaStream_t stream)
{
    const int ntiles = (seqlen + CONV_TILE - 1) / CONV_TILE;
    // start NULL: the maskless instance (which never reads it)
    const auto kernel = start ? conv_xproj_kernel<true> : conv_xproj_kernel<false>;
    kernel<<<dim3((unsigned)batch * ntiles), CXP_THREADS, 0, stream>>>(
        seqlen, ntiles, static_cast<const act_t *>(xz), conv_w, conv_b, state_in, state_out,
        static_cast<act_t *>(xc), static_cast<const act_t *>(x_proj_w), static_cast<act_t *>(dbl), reset, start);
    return cudaGetLastError();
}
#endif

extern "C" cudaError_t MG_LAUNCH(scan)(int batch, int seqlen, const void *xc, const void *dt,
                                const void *dbl, const void *xz, const float *dt_bias,
                                const float *A_log, const float *Dskip, const float *state_in,
                                float *state_out, void *g, const unsigned char *reset,
                                const unsigned char *start, cudaStream_t stream)
{
    const dim3 grid(batch, SCAN_BLOCKS);
    const auto kernel = start ? scan_kernel<true, SCAN_FUSE_DT> : scan_kernel<false, SCAN_FUSE_DT>;
    kernel<<<grid, SCAN_THREADS, 0, stream>>>(
        seqlen, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
        static_cast<const act_t *>(dbl), static_cast<const act_t *>(xz), dt_bias, A_log, Dskip,
        state_in, state_out, static_cast<act_t *>(g), reset, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(decode_mixer)(int batch, const void *xz, const float *conv_w,
                                        const float *conv_b, float *conv_state, const void *x_proj_w,
                                        const void *dt_proj_w, const float *dt_bias,
                                        const float *A_log, const float *Dskip, float *ssm_state,
                                        void *xc, float *part, void *g, const unsigned char *reset,
                                        cudaStream_t stream)
{
    decode_conv_xproj_kernel<<<dim3(batch, CONV_BLOCKS), CONV_THREADS, 0, stream>>>(
        static_cast<const act_t *>(xz), conv_w, conv_b, conv_state, static_cast<const act_t *>(x_proj_w),
        static_cast<act_t *>(xc), part, reset);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    decode_scan_kernel<<<dim3(batch, SCAN_BLOCKS), SCAN_THREADS, 0, stream>>>(
        part, static_cast<const act_t *>(xc), static_cast<const act_t *>(xz),
        static_cast<const act_t *>(dt_proj_w), dt_bias, A_log, Dskip, ssm_state, static_cast<act_t *>(g), reset);
    return cudaGetLastError();
}
#if MG_M1_DECODE_PERSISTENT

// The cluster launch of decode_persistent_kernel for `batch` streams, spc
// per cluster (grid = ceil(batch / spc) clusters).
static cudaLaunchConfig_t decode_persistent_config(int batch, int spc, cudaStream_t stream,
                                                   cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((batch + spc - 1) / spc) * DEC_CLUSTER, 1, 1);
    cfg.blockDim = dim3(DEC_THREADS, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = DEC_CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

extern "C" cudaError_t MG_LAUNCH(decode_persistent)(int batch, int spc, const float *u, float *out, const float *w,
                                             const void *wg, float *conv_state, float *ssm_state,
                                             const unsigned char *reset, cudaStream_t stream)
{
    if (batch < 1 || spc < 1 || spc > DEC_SEQS) return cudaErrorInvalidValue;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = decode_persistent_config(batch, spc, stream, attr);
    // One stream per cluster (a batch within the co-resident clusters, the
    // latency case) takes the instance compiled for one: its registers and
    // shared memory are sized for one stream, not DEC_SEQS.
    auto *const kernel = spc == 1 ? decode_persistent_kernel<1> : decode_persistent_kernel<DEC_SEQS>;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, batch, spc, u, out, w, static_cast<const act_t *>(wg),
                                             conv_state, ssm_state, reset);
    return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(decode_persistent_clusters)(int *n)
{
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = decode_persistent_config(1, 1, 0, attr);
    *n = 0;
    // the instance of several streams a cluster: the one a batch beyond this
    // count runs (the one-stream instance fits at least as many)
    const cudaError_t e = cudaOccupancyMaxActiveClusters(n, decode_persistent_kernel<DEC_SEQS>, &cfg);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   // a query error is not the next launch's
        *n = 0;
    }
    return e;
}
#endif
#if MG_M1_SCAN_CHUNKED

// Passes 1 and 2 of the chunked scan: every chunk's incoming state into
// cstate; reset [batch] (NULL: none) zeroes a sequence's state_in; ST:
// episode starts (start [batch][seqlen]).
template <bool ST, bool FDT>
static cudaError_t chunk_states_launch(int batch, int seqlen, const void *xc, const void *dt, const void *dbl,
                                       const float *dt_bias, const float *A_log, const float *state_in,
                                       float *cstate, float *dsum, const unsigned char *reset,
                                       const unsigned char *start, cudaStream_t stream)
{
    const int nc = (seqlen + SCAN_CHUNK - 1) / SCAN_CHUNK;
    if (nc > 1) {
        chunk_state_kernel<ST, FDT><<<dim3(batch, SCAN_BLOCKS, nc - 1), SCAN_THREADS, 0, stream>>>(
            seqlen, nc, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
            static_cast<const act_t *>(dbl), dt_bias, A_log, cstate, dsum, start);
        const cudaError_t e1 = cudaGetLastError();
        if (e1 != cudaSuccess) return e1;
    }
    const size_t n = (size_t)batch * E * N;
    chunk_combine_kernel<ST><<<(unsigned)((n + COMBINE_THREADS - 1) / COMBINE_THREADS), COMBINE_THREADS, 0,
                               stream>>>(batch, nc, A_log, state_in, cstate, dsum, reset);
    return cudaGetLastError();
}

// The same for the training forward (which runs its own output pass after;
// its dt is the dt_proj output, never fused).
extern "C" cudaError_t MG_LAUNCH(scan_chunk_states)(int batch, int seqlen, const void *xc, const void *dt,
                                             const void *dbl, const float *dt_bias, const float *A_log,
                                             const float *state_in, float *cstate, float *dsum,
                                             const unsigned char *start, cudaStream_t stream)
{
    const auto launch = start ? chunk_states_launch<true, false> : chunk_states_launch<false, false>;
    return launch(batch, seqlen, xc, dt, dbl, dt_bias, A_log, state_in, cstate, dsum, nullptr, start, stream);
}

template <bool ST>
static cudaError_t scan_chunked_launch(int batch, int seqlen, const void *xc, const void *dt, const void *dbl,
                                       const void *xz, const float *dt_bias, const float *A_log,
                                       const float *Dskip, const float *state_in, float *state_out,
                                       float *cstate, float *dsum, void *g, const unsigned char *reset,
                                       const unsigned char *start, cudaStream_t stream)
{
    const int nc = (seqlen + SCAN_CHUNK - 1) / SCAN_CHUNK;
    if constexpr (SCAN_SELF_COMBINE) {
        // pass 1 (copying the initial state to slot 0), then the output pass
        // walking the combine per block: one launch fewer
        if (nc > 1) {
            chunk_state_kernel<ST, SCAN_FUSE_DT, true><<<dim3(batch, SCAN_BLOCKS, nc - 1), SCAN_THREADS, 0, stream>>>(
                seqlen, nc, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
                static_cast<const act_t *>(dbl), dt_bias, A_log, cstate, dsum, start, state_in, reset);
            const cudaError_t e1 = cudaGetLastError();
            if (e1 != cudaSuccess) return e1;
        }
        chunk_output_kernel<ST, SCAN_FUSE_DT, true><<<dim3(batch, SCAN_BLOCKS, nc), SCAN_THREADS, 0, stream>>>(
            seqlen, nc, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
            static_cast<const act_t *>(dbl), static_cast<const act_t *>(xz), dt_bias, A_log, Dskip,
            cstate, state_out, static_cast<act_t *>(g), start, state_in, dsum, reset);
        return cudaGetLastError();
    } else {
        const cudaError_t e = chunk_states_launch<ST, SCAN_FUSE_DT>(batch, seqlen, xc, dt, dbl, dt_bias, A_log,
                                                                    state_in, cstate, dsum, reset, start, stream);
        if (e != cudaSuccess) return e;
        chunk_output_kernel<ST, SCAN_FUSE_DT><<<dim3(batch, SCAN_BLOCKS, nc), SCAN_THREADS, 0, stream>>>(
            seqlen, nc, static_cast<const act_t *>(xc), static_cast<const act_t *>(dt),
            static_cast<const act_t *>(dbl), static_cast<const act_t *>(xz), dt_bias, A_log, Dskip,
            cstate, state_out, static_cast<act_t *>(g), start);
        return cudaGetLastError();
    }
}

extern "C" cudaError_t MG_LAUNCH(scan_chunked)(int batch, int seqlen, const void *xc, const void *dt,
                                        const void *dbl, const void *xz, const float *dt_bias,
                                        const float *A_log, const float *Dskip,
                                        const float *state_in, float *state_out, float *cstate,
                                        float *dsum, void *g, const unsigned char *reset,
                                        const unsigned char *start, cudaStream_t stream)
{
    const auto launch = start ? scan_chunked_launch<true> : scan_chunked_launch<false>;
    return launch(batch, seqlen, xc, dt, dbl, xz, dt_bias, A_log, Dskip, state_in, state_out, cstate, dsum, g, reset,
                  start, stream);
}
#endif
