// mg_m3_launch_train.cuh: the launchers of the Mamba-3 SISO training kernels
// (C linkage, prototypes in mg_m3_launch_train.h and NAME_train.h; MG_LAUNCH(fn)
// of NAME.h names them NAME_launch_fn; the four whose inference
// twin has the same job end in _train). Arguments are checked by
// NAME_train.c before any launch. Included by NAME_backward.cu after its
// anonymous namespace (the kernels): it includes nothing itself.
// A kernel (or launch helper) with an episode-start parameter comes in two
// instances: `start ? k<true> : k<false>` picks the one for this call and
// the single launch passes start as given, NULL exactly when the maskless
// instance runs, so each argument list is written once.
// The per-head k', q' buffers (void * in the C prototypes: their element
// type is kq_t, the storage type) as the kernels take them.
static inline const kq_t *kq_ptr(const void *p) { return static_cast<const kq_t *>(p); }

extern "C" cudaError_t MG_LAUNCH(bias_rows_train)(float *h, const float *bias, int rows, cudaStream_t st)
{
    const size_t n = (size_t)rows * D;
    bias_rows_train_kernel<<<grid_for(n), RED_THREADS, 0, st>>>(n, bias, h);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(prep_train)(int tokens, const void *proj, const float *dt_bias,
                                             const float *B_norm_w, const float *C_norm_w, const float *B_bias,
                                             const float *C_bias, const float *rot, float *dt, float *adt,
                                             float *lam, void *k, void *q, cudaStream_t st)
{
    prep_rot_kernel<<<tokens, PREP_THREADS, 0, st>>>(static_cast<const act_t *>(proj), dt_bias, B_norm_w,
                                                     C_norm_w, B_bias, C_bias, rot, dt, adt, lam,
                                                     static_cast<kq_t *>(k), static_cast<kq_t *>(q));
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(prep_scalars_train)(int tokens, const void *proj, const float *dt_bias, float *dt,
                                                     float *adt, float *lam, float *rbc, float *tnh, cudaStream_t st)
{
    prep_scalars_kernel<<<tokens, PREP_THREADS, 0, st>>>(static_cast<const act_t *>(proj), dt_bias, dt, adt, lam, rbc,
                                                         tnh);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(angles_train)(int batch, int seqlen, const void *proj, const float *dt_bias,
                                               const float *dt, const float *tnh, const float *angle_in,
                                               float *angle_out, float *rot, const unsigned char *start,
                                               cudaStream_t st)
{
    // start [batch][seqlen] (NULL: none): the kernels' STARTS instance only
    // when a mask is given, here and below; dt and tnh (both or neither):
    // the instance that reads prep's dt and tanh
    if ((dt == nullptr) != (tnh == nullptr)) return cudaErrorInvalidValue;
    const auto kernel = dt ? (start ? angles_cs_kernel<true, true> : angles_cs_kernel<false, true>)
                           : (start ? angles_cs_kernel<true, false> : angles_cs_kernel<false, false>);
    kernel<<<dim3(ANGLE_BLOCKS, batch), ANGLE_THREADS, 0, st>>>(
        seqlen, static_cast<const act_t *>(proj), dt_bias, dt, tnh, angle_in, angle_out, rot, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan_fwd)(int batch, int seqlen, const void *proj, const void *k,
                                           const void *q, const float *dt, const float *adt,
                                           const float *lam, const float *Dskip, const float *ssm_in,
                                           const float *kp_in, const float *vp_in, float *ssm_out,
                                           float *kp_out, float *vp_out, float *ckpt, float *y,
                                           const unsigned char *start, cudaStream_t st)
{
    const auto kernel = start ? scan_fwd_kernel<true> : scan_fwd_kernel<false>;
    kernel<<<dim3(H, batch), BTHREADS, 0, st>>>(
        seqlen, static_cast<const act_t *>(proj), kq_ptr(k), kq_ptr(q), dt, adt, lam, Dskip, ssm_in, kp_in, vp_in,
        ssm_out, kp_out, vp_out, ckpt, y, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(gate_fwd)(int tokens, const float *y, const void *proj,
                                           const float *norm_gate_w, void *g, cudaStream_t st)
{
    gate_kernel<<<tokens, GATE_THREADS, 0, st>>>(y, static_cast<const act_t *>(proj), norm_gate_w,
                                                     static_cast<act_t *>(g));
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(colsum_part)(int rows, int width, const float *x, float *part,
                                              cudaStream_t st)
{
    const int blocks = (rows + NORMB_ROWS - 1) / NORMB_ROWS;
    int cb = (width + RED_THREADS - 1) / RED_THREADS;
    if (cb > 64) cb = 64;
    colsum_part_kernel<<<dim3(blocks, cb), RED_THREADS, 0, st>>>(rows, width, x, part);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(gate_bwd)(int tokens, const float *y, const void *proj,
                                           const float *norm_gate_w, const float *dg, void *g, float *dy,
                                           void *dproj, float *part_gw, cudaStream_t st)
{
    const int blocks = (tokens + NORMB_ROWS - 1) / NORMB_ROWS;
    gate_bwd_kernel<<<blocks, GATEB_THREADS, 0, st>>>(tokens, y, static_cast<const act_t *>(proj),
                                                     norm_gate_w, dg, static_cast<act_t *>(g), dy,
                                                     static_cast<act_t *>(dproj), part_gw);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan_bwd)(int batch, int seqlen, const void *proj, const void *k,
                                           const void *q, const float *dt, const float *adt,
                                           const float *lam, const float *Dskip, const float *ckpt,
                                           const float *kp0, const float *vp0, const float *dy, float *dk,
                                           float *dq, float *dv, float *dadt, float *ddt, float *dlam,
                                           float *part_D, float *dssm0, float *dkp0, float *dvp0,
                                           const unsigned char *start, cudaStream_t st)
{
    const auto kernel = start ? scan_bwd_kernel<true> : scan_bwd_kernel<false>;
    kernel<<<dim3(H, batch), BTHREADS, 0, st>>>(
        seqlen, static_cast<const act_t *>(proj), kq_ptr(k), kq_ptr(q), dt, adt, lam, Dskip, ckpt, kp0, vp0, dy, dk, dq,
        dv, dadt, ddt, dlam, part_D, dssm0, dkp0, dvp0, start);
    return cudaGetLastError();
}

#if MG_M3_CKB
extern "C" cudaError_t MG_LAUNCH(scan_bwd_chunked)(int batch, int seqlen, const void *proj, const float *rbc,
                                                   const float *rot, const float *B_norm_w, const float *C_norm_w,
                                                   const float *B_bias, const float *C_bias, const float *dt,
                                                   const float *adt, const float *lam, const float *Dskip,
                                                   const float *ckpt, const float *kp0, const float *vp0,
                                                   const float *dy, void *dk, void *dq, void *dproj, float *dadt,
                                                   float *ddt, float *dlam, float *gth, float *part_D,
                                                   float *part_k, float *part_q,
                                                   float *dssm0, float *dkp0, float *dvp0,
                                                   const unsigned char *start, cudaStream_t st)
{
    const kq_build bld = {static_cast<const act_t *>(proj), rbc, rot, B_norm_w, C_norm_w, B_bias, C_bias};
    // Dynamic shared memory above 48 KiB needs the opt-in, once per process.
    const cudaFuncAttribute fa = cudaFuncAttributeMaxDynamicSharedMemorySize;
    static const cudaError_t attr = CKB_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_bwd_chunked_kernel<false>, fa, CKB_SMEM_BYTES)
        : cudaSuccess;
    static const cudaError_t attr_st = CKB_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_bwd_chunked_kernel<true>, fa, CKB_SMEM_BYTES)
        : cudaSuccess;
    if (attr != cudaSuccess) return attr;
    if (attr_st != cudaSuccess) return attr_st;
    // Two blocks per SM (CKB_MIN_BLOCKS) need the SM's whole shared memory
    // carveout; ask for it rather than leave the choice to the driver.
    const cudaFuncAttribute ca = cudaFuncAttributePreferredSharedMemoryCarveout;
    static const cudaError_t carve = CKB_MIN_BLOCKS > 1
        ? cudaFuncSetAttribute(scan_bwd_chunked_kernel<false>, ca, (int)cudaSharedmemCarveoutMaxShared)
        : cudaSuccess;
    static const cudaError_t carve_st = CKB_MIN_BLOCKS > 1
        ? cudaFuncSetAttribute(scan_bwd_chunked_kernel<true>, ca, (int)cudaSharedmemCarveoutMaxShared)
        : cudaSuccess;
    if (carve != cudaSuccess) return carve;
    if (carve_st != cudaSuccess) return carve_st;
    const auto kernel = start ? scan_bwd_chunked_kernel<true> : scan_bwd_chunked_kernel<false>;
    kernel<<<dim3(H, batch), CKB_THREADS, CKB_SMEM_BYTES, st>>>(
        seqlen, static_cast<const act_t *>(proj), bld, dt, adt, lam, Dskip, ckpt, kp0, vp0, dy, rot,
        static_cast<dkq_t *>(dk), static_cast<dkq_t *>(dq), static_cast<act_t *>(dproj), dadt, ddt, dlam, gth,
        part_D, part_k, part_q, dssm0, dkp0, dvp0, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(scan_fwd_chunked)(int batch, int seqlen, const void *proj, const float *rbc,
                                                   const float *rot, const float *B_norm_w, const float *C_norm_w,
                                                   const float *B_bias, const float *C_bias, const float *dt,
                                                   const float *adt, const float *lam, const float *Dskip,
                                                   const float *ssm_in, const float *kp_in, const float *vp_in,
                                                   float *ssm_out, float *kp_out, float *vp_out, float *ckpt, float *y,
                                                   const unsigned char *start, cudaStream_t st)
{
    using ckpt_fwd::scan_chunked_built_kernel;
    const cudaFuncAttribute fa = cudaFuncAttributeMaxDynamicSharedMemorySize;
    static const cudaError_t attr = ckpt_fwd::CK_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_chunked_built_kernel<false, kq_build>, fa, ckpt_fwd::CK_SMEM_BYTES)
        : cudaSuccess;
    static const cudaError_t attr_st = ckpt_fwd::CK_SMEM_BYTES > 48 * 1024
        ? cudaFuncSetAttribute(scan_chunked_built_kernel<true, kq_build>, fa, ckpt_fwd::CK_SMEM_BYTES)
        : cudaSuccess;
    if (attr != cudaSuccess) return attr;
    if (attr_st != cudaSuccess) return attr_st;
    const kq_build bld = {static_cast<const act_t *>(proj), rbc, rot, B_norm_w, C_norm_w, B_bias, C_bias};
    const int slots = (seqlen + CKPT_STRIDE - 1) / CKPT_STRIDE;   // the sequential path's checkpoint layout
    const dim3 grid(H, batch);
    const auto kernel = start ? scan_chunked_built_kernel<true, kq_build> : scan_chunked_built_kernel<false, kq_build>;
    kernel<<<grid, ckpt_fwd::CK_THREADS, ckpt_fwd::CK_SMEM_BYTES, st>>>(
        seqlen, bld, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in, ssm_out, kp_out, vp_out, y, ckpt, CKPT_STRIDE,
        slots, start);
    return cudaGetLastError();
}
#endif

extern "C" cudaError_t MG_LAUNCH(angles_bwd)(int batch, int seqlen, const void *k, const void *q,
                                             const float *rot, float *dk, float *dq, float *gth,
                                             float *dangle0, const unsigned char *start, cudaStream_t st)
{
    const auto kernel = start ? angles_bwd_kernel<true> : angles_bwd_kernel<false>;
    kernel<<<dim3(ANGLE_BLOCKS, batch), ANGLE_THREADS, 0, st>>>(seqlen, kq_ptr(k), kq_ptr(q), rot, dk, dq,
        gth, dangle0, start);
    return cudaGetLastError();
}

// The angle recurrence's backward after scan_bwd_chunked, which already
// un-rotated dk, dq and wrote the local terms g into gth: the suffix sums
// only (angles_bwd_kernel's GIVEN instance; gth in place, dangle0 optional).
extern "C" cudaError_t MG_LAUNCH(angles_bwd_sums)(int batch, int seqlen, float *gth, float *dangle0,
                                                  const unsigned char *start, cudaStream_t st)
{
    const auto kernel = start ? angles_bwd_kernel<true, true> : angles_bwd_kernel<false, true>;
    kernel<<<dim3(ANGLE_BLOCKS, batch), ANGLE_THREADS, 0, st>>>(
        seqlen, nullptr, nullptr, nullptr, nullptr, nullptr, gth, dangle0, start);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(prep_bwd)(int tokens, const void *proj, const float *dt,
                                           const float *lam, const float *dt_bias, const float *B_norm_w,
                                           const float *C_norm_w, const float *dk, const float *dq,
                                           const float *dv, const float *dadt, const float *ddt,
                                           const float *dlam, const float *gth, void *dproj, float *gdtb,
                                           float *gBn, float *gCn, cudaStream_t st)
{
    prep_bwd_kernel<float><<<tokens, PREP_THREADS, 0, st>>>(static_cast<const act_t *>(proj), dt, lam, dt_bias,
                                                            B_norm_w, C_norm_w, dk, dq, dv, dadt, ddt, dlam, gth,
                                                            static_cast<act_t *>(dproj), gdtb, gBn, gCn);
    return cudaGetLastError();
}

#if MG_M3_CKB
// prep_bwd after scan_bwd_chunked: dk, dq in its dkq_t, the x columns of
// dproj written by it already.
extern "C" cudaError_t MG_LAUNCH(prep_bwd_ck)(int tokens, const void *proj, const float *dt,
                                              const float *lam, const float *dt_bias, const float *B_norm_w,
                                              const float *C_norm_w, const void *dk, const void *dq,
                                              const float *dadt, const float *ddt, const float *dlam,
                                              const float *gth, void *dproj, float *gdtb, float *gBn, float *gCn,
                                              cudaStream_t st)
{
    prep_bwd_kernel<dkq_t><<<tokens, PREP_THREADS, 0, st>>>(
        static_cast<const act_t *>(proj), dt, lam, dt_bias, B_norm_w, C_norm_w, static_cast<const dkq_t *>(dk),
        static_cast<const dkq_t *>(dq), nullptr, dadt, ddt, dlam, gth, static_cast<act_t *>(dproj), gdtb, gBn, gCn);
    return cudaGetLastError();
}
#endif


extern "C" cudaError_t MG_LAUNCH(adamw)(float *w, const float *g, float *m, float *v, const float *stat,
                                        const adamw_params *hp, const float *coef, cudaStream_t st)
{
    adamw_kernel<<<grid_for(WEIGHTS_TOTAL), RED_THREADS, 0, st>>>(WEIGHTS_TOTAL, w, g, m, v, stat, hp, coef);
    return cudaGetLastError();
}

extern "C" cudaError_t MG_LAUNCH(convert_train)(const float *w, void *wa, cudaStream_t st)
{
    convert_train_kernel<<<grid_for(WEIGHTS_TOTAL), RED_THREADS, 0, st>>>(WEIGHTS_TOTAL, w, static_cast<act_t *>(wa));
    return cudaGetLastError();
}
