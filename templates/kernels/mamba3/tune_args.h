/* tune_args.h: the kernel parameters of the Mamba-3 chunked SSM tune
 * candidates (tune_m3_chunked of templates/mamba3/tune_scan.cu.tmpl), in
 * order, declared once for both sides: the candidate source (CUDA; the
 * template inlines this file) and mamba-tune's launch (tune/tune_gpu.c, C).
 * The list is LIST(FIRST, NEXT): FIRST(kind, name) for the first parameter
 * and NEXT(kind, name) for every further one, so a side can put its
 * separators in NEXT. kind (as in kernels/mamba1/tune_args.h):
 *   I    int, a launch value (seqlen)
 *   CA   const act_t *__restrict__     CF   const float *__restrict__
 *   CFA  const float * (may alias FA)  FA   float * (may alias CFA)
 *   F    float *__restrict__ (written)
 * They are, in order, the parameters of ck_fwd_body
 * (kernels/mamba3/chunked_body.cuh) up to y; the names are mamba-tune's
 * buffers (mdt = dt, mD = Dskip, state_* = ssm_*). The generic candidate's
 * kernel takes one more, its struct tune_dims.
 * Plain C and CUDA: no includes, macros only. */
#ifndef MG_M3_TUNE_ARGS_H
#define MG_M3_TUNE_ARGS_H

#define MG_M3_TUNE_CHUNKED_PARAMS(FIRST, NEXT) \
    FIRST(I, seqlen) NEXT(CA, proj) NEXT(CF, k) NEXT(CF, q) NEXT(CF, mdt) NEXT(CF, adt) NEXT(CF, lam) \
    NEXT(CF, mD) NEXT(CFA, state_in) NEXT(CFA, kp_in) NEXT(CFA, vp_in) NEXT(FA, state_out) \
    NEXT(FA, kp_out) NEXT(FA, vp_out) NEXT(F, y)

#endif /* MG_M3_TUNE_ARGS_H */
