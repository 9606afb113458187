// mg_m3_launch_fwd.cuh: the launchers of the Mamba-3 SISO inference kernels
// (C linkage, prototypes in mg_m3_launch.h; MG_LAUNCH(fn) of NAME.h names
// them NAME_launch_fn). Argument ranges are checked by the host pipeline
// before any launch. Included by NAME_kernels.cu after its anonymous
// namespace (the kernels): it includes nothing itself.
// A kernel (or launch helper) with an episode-start parameter comes in two
// instances: `start ? k<true> : k<false>` picks the one for this call and
// the single launch passes start as given, NULL exactly when the maskless
// instance runs, so each argument list is written once.

extern "C" cudaError_t MG_LAUNCH(prep)(int tokens, const void *proj, const float *dt_bias,
                                       const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                       const float *C_bias, float *dt, float *adt, float *lam, float *k,
                                       float *q, cudaStream_t stream)
{
    prep_kernel<<<tokens, PREP_THREADS, 0, stream>>>(
        static_cast<const act_t *>(proj), dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, dt, adt, lam, k, q);
    return cudaGetLastError();
}

// The launchers that take a start mask (episode starts, [batch][seqlen]
// bytes, NULL: none) launch the kernels' STARTS instance only when one is
// given: the instance without is the code as it was.
extern "C" cudaError_t MG_LAUNCH(angles)(int batch, int seqlen, const void *proj, const float *dt,
                                         const float *angle_in, float *angle_out, float *k, float *q,
                                         const unsigned char *reset, const unsigned char *start,
                                         cudaStream_t stream)
{
    const dim3 grid(ANGLE_BLOCKS, batch);
    const auto kernel = start ? angles_kernel<true> : angles_kernel<false>;
    kernel<<<grid, ANGLE_THREADS, 0, stream>>>(
        seqlen, static_cast<const act_t *>(proj), dt, angle_in, angle_out, k, q, nullptr, reset, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan)(int batch, int seqlen, const void *proj, const float *k,
                                       const float *q, const float *dt, const float *adt, const float *lam,
                                       const float *Dskip, const float *ssm_in, const float *kp_in,
                                       const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                                       float *y, const unsigned char *reset, const unsigned char *start,
                                       cudaStream_t stream)
{
    const dim3 grid(H, batch);
    const auto kernel = start ? scan_kernel<true> : scan_kernel<false>;
    kernel<<<grid, SCAN_THREADS, 0, stream>>>(
        seqlen, static_cast<const act_t *>(proj), k, q, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in,
        ssm_out, kp_out, vp_out, y, reset, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(gate)(int tokens, const float *y, const void *proj,
                                       const float *norm_gate_w, void *g, cudaStream_t stream)
{
    gate_kernel<<<tokens, GATE_THREADS, 0, stream>>>(
        y, static_cast<const act_t *>(proj), norm_gate_w, static_cast<act_t *>(g));
    return cudaGetLastError();
}
#if MG_M3_CHUNKED

extern "C" cudaError_t MG_LAUNCH(scan_chunked)(int batch, int seqlen, const void *proj, const float *k,
                                               const float *q, const float *dt, const float *adt,
                                               const float *lam, const float *Dskip, const float *ssm_in,
                                               const float *kp_in, const float *vp_in, float *ssm_out,
                                               float *kp_out, float *vp_out, float *y,
                                               const unsigned char *start, cudaStream_t stream)
{
    // Dynamic shared memory above 48 KiB needs the opt-in, once per process
    // (a function-local static: initialised once, thread-safe).
    const cudaFuncAttribute fa = cudaFuncAttributeMaxDynamicSharedMemorySize;
    static const cudaError_t attr = CK_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_chunked_kernel<false>, fa, CK_SMEM_BYTES)
        : cudaSuccess;
    static const cudaError_t attr_st = CK_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_chunked_kernel<true>, fa, CK_SMEM_BYTES)
        : cudaSuccess;
    if (attr != cudaSuccess) return attr;
    if (attr_st != cudaSuccess) return attr_st;
    const dim3 grid(H, batch);
    const auto kernel = start ? scan_chunked_kernel<true> : scan_chunked_kernel<false>;
    kernel<<<grid, CK_THREADS, CK_SMEM_BYTES, stream>>>(
        seqlen, static_cast<const act_t *>(proj), k, q, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in,
        ssm_out, kp_out, vp_out, y, NULL, 0, 0, start);
    return cudaGetLastError();
}
#endif
#if MG_M3_FUSED

// The fused SSM core (mg_m3_chunked_fused.cuh): one launch per layer, or,
// with nseg > 1 segments per sequence, the four launches of its segment
// form. nseg is a request: clamped to the chunks (at least two per
// segment) and to the SEG_SLOTS slots of the workspace seg_ws
// (SEG_WS_BYTES), then evened out so that no segment is empty.
template <bool STARTS>
static cudaError_t fused_smem_optin()
{
    if (CK_FUSED_SMEM_BYTES <= 48 * 1024) return cudaSuccess;
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    cudaError_t e = cudaFuncSetAttribute(scan_fused_kernel<FUSED_WHOLE, STARTS>, a, CK_FUSED_SMEM_BYTES);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(scan_fused_kernel<FUSED_LOCAL, STARTS>, a, CK_FUSED_SMEM_BYTES);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(scan_fused_kernel<FUSED_SEGMENT, STARTS>, a, CK_FUSED_SMEM_BYTES);
    return e;
}

// The launches of the fused core, the STARTS instances or not (start [batch][seqlen], NULL: none).
template <bool STARTS>
static cudaError_t fused_launch(int batch, int seqlen, const fused_seg &sg, const act_t *pj, const float *dt_bias,
                                const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                const float *C_bias, const float *Dskip, const float *norm_gate_w,
                                const float *ssm_in, const float *kp_in, const float *vp_in, const float *angle_in,
                                float *ssm_out, float *kp_out, float *vp_out, float *angle_out, act_t *ga,
                                const unsigned char *start, cudaStream_t stream)
{
    // Dynamic shared memory above 48 KiB needs the opt-in, once per process.
    static const cudaError_t attr = fused_smem_optin<STARTS>();
    if (attr != cudaSuccess) return attr;
    if (sg.nseg == 1) {
        scan_fused_kernel<FUSED_WHOLE, STARTS><<<dim3(H, batch), CK_THREADS, CK_FUSED_SMEM_BYTES, stream>>>(
            seqlen, pj, dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, Dskip, norm_gate_w, ssm_in, kp_in, vp_in,
            angle_in, ssm_out, kp_out, vp_out, angle_out, ga, sg, start);
        return cudaGetLastError();
    }
    const dim3 grid(H, batch, sg.nseg);
    seg_angle_kernel<STARTS><<<grid, CK_THREADS, 0, stream>>>(seqlen, pj, dt_bias, sg, start);
    scan_fused_kernel<FUSED_LOCAL, STARTS><<<grid, CK_THREADS, CK_FUSED_SMEM_BYTES, stream>>>(
        seqlen, pj, dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, Dskip, norm_gate_w, nullptr, nullptr, nullptr,
        angle_in, nullptr, nullptr, nullptr, nullptr, ga, sg, start);
    seg_combine_kernel<STARTS><<<dim3(H, batch, CMB_BLOCKS), CMB_THREADS, 0, stream>>>(seqlen, pj, dt_bias, ssm_in, kp_in,
                                                                           vp_in, angle_in, sg, start);
    scan_fused_kernel<FUSED_SEGMENT, STARTS><<<grid, CK_THREADS, CK_FUSED_SMEM_BYTES, stream>>>(
        seqlen, pj, dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, Dskip, norm_gate_w, nullptr, nullptr, nullptr,
        nullptr, ssm_out, kp_out, vp_out, angle_out, ga, sg, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan_fused)(int batch, int seqlen, int nseg, void *seg_ws, const void *proj,
                                             const float *dt_bias, const float *B_norm_w, const float *C_norm_w,
                                             const float *B_bias, const float *C_bias, const float *Dskip,
                                             const float *norm_gate_w, const float *ssm_in, const float *kp_in,
                                             const float *vp_in, const float *angle_in, float *ssm_out,
                                             float *kp_out, float *vp_out, float *angle_out, void *g,
                                             const unsigned char *start, cudaStream_t stream)
{
    const act_t *pj = static_cast<const act_t *>(proj);
    act_t *ga = static_cast<act_t *>(g);
    const size_t tokens = (size_t)batch * (size_t)seqlen;
    if (!seg_ws || batch < 1 || seqlen < 1 || tokens > AUX_TOKENS) return cudaErrorInvalidValue;
    // the weights are read as 16-byte vectors (f32_row_ld)
    const uintptr_t wa = (uintptr_t)B_norm_w | (uintptr_t)C_norm_w | (uintptr_t)B_bias | (uintptr_t)C_bias |
                         (uintptr_t)norm_gate_w;
    if (wa % 16 != 0) return cudaErrorMisalignedAddress;
    const int nchunks = (seqlen + CK_Q - 1) / CK_Q;
    if (nseg > nchunks / 2) nseg = nchunks / 2;
    if (nseg > SEG_SLOTS / (batch * H)) nseg = SEG_SLOTS / (batch * H);
    fused_seg sg;
    sg.nseg = 1;
    sg.seg_chunks = nchunks;
    if (nseg > 1) {
        sg.seg_chunks = (nchunks + nseg - 1) / nseg;
        sg.nseg = (nchunks + sg.seg_chunks - 1) / sg.seg_chunks;
    }
    char *ws = static_cast<char *>(seg_ws);
    sg.state = reinterpret_cast<float *>(ws);
    sg.asum = reinterpret_cast<double *>(ws + SEG_OFF_ASUM);
    sg.th = reinterpret_cast<double *>(ws + SEG_OFF_TH);
    sg.dec = reinterpret_cast<float *>(ws + SEG_OFF_DEC);
    // the token prologue, into the workspace's rows
    float *aux = reinterpret_cast<float *>(ws + SEG_OFF_AUX);
    token_prologue_kernel<<<(unsigned)((tokens + PRO_WARPS - 1) / PRO_WARPS), PRO_WARPS * 32, 0, stream>>>(
        tokens, pj, aux);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    sg.aux = aux;
    const auto launch = start ? fused_launch<true> : fused_launch<false>;
    return launch(batch, seqlen, sg, pj, dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, Dskip, norm_gate_w, ssm_in, kp_in,
                  vp_in, angle_in, ssm_out, kp_out, vp_out, angle_out, ga, start, stream);
}
#endif
