/* tune_args.h: the kernel parameters of the Mamba-1 scan tune candidates
 * (templates/mamba1/tune_scan.cu.tmpl), in order, declared once for both
 * sides: the candidate source (CUDA; the template inlines this file) and
 * mamba-tune's launches (tune/tune_gpu.c, C). Each list is
 * LIST(FIRST, NEXT): FIRST(kind, name) for the first parameter and
 * NEXT(kind, name) for every further one, so a side can put its separators
 * in NEXT. kind:
 *   I    int, a launch value (seqlen, nc, batch)
 *   CA   const act_t *__restrict__     O    act_t *__restrict__ (written)
 *   CF   const float *__restrict__     F    float *__restrict__ (written)
 *   CFA  const float * (may alias FA)  FA   float * (may alias CFA)
 * The body functions of kernels/mamba1/scan_body.cuh take the same
 * parameters in the same order (then the B/C stage and the dims policy);
 * the generic candidate's kernels take one more, its struct tune_dims.
 * Plain C and CUDA: no includes, macros only. */
#ifndef MG_M1_TUNE_ARGS_H
#define MG_M1_TUNE_ARGS_H

/* the sequential scan */
#define MG_M1_TUNE_SEQ_PARAMS(FIRST, NEXT) \
    FIRST(I, seqlen) NEXT(CA, xc) NEXT(CA, dt) NEXT(CA, dbl) NEXT(CA, xz) NEXT(CF, dt_bias) \
    NEXT(CF, A_log) NEXT(CF, Dskip) NEXT(CFA, state_in) NEXT(FA, state_out) NEXT(O, g)
/* chunked pass 1: chunk states */
#define MG_M1_TUNE_STATE_PARAMS(FIRST, NEXT) \
    FIRST(I, seqlen) NEXT(I, nc) NEXT(CA, xc) NEXT(CA, dt) NEXT(CA, dbl) NEXT(CF, dt_bias) \
    NEXT(CF, A_log) NEXT(F, cstate) NEXT(F, dsum)
/* chunked pass 2: the cross-chunk combine */
#define MG_M1_TUNE_COMBINE_PARAMS(FIRST, NEXT) \
    FIRST(I, batch) NEXT(I, nc) NEXT(CF, A_log) NEXT(CFA, state_in) NEXT(F, cstate) NEXT(CF, dsum)
/* chunked pass 3: the outputs */
#define MG_M1_TUNE_OUTPUT_PARAMS(FIRST, NEXT) \
    FIRST(I, seqlen) NEXT(I, nc) NEXT(CA, xc) NEXT(CA, dt) NEXT(CA, dbl) NEXT(CA, xz) \
    NEXT(CF, dt_bias) NEXT(CF, A_log) NEXT(CF, Dskip) NEXT(CF, cstate) NEXT(FA, state_out) NEXT(O, g)

#endif /* MG_M1_TUNE_ARGS_H */
