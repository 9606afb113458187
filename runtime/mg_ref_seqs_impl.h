/* mg_ref_seqs_impl.h: the drivers the Mamba-1 and Mamba-3 reference entry
 * points share to run a segment plan (mg_ref_seqs.h) as plain calls of
 * batch 1 (not installed; kept out of libmgrt's exported symbols). An
 * architecture supplies its state's shape and one function that runs a
 * segment; the drivers do the state routing, the zeroing at episode starts
 * and the sum of the weight gradients, once for both. */
#ifndef MG_REF_SEQS_IMPL_H
#define MG_REF_SEQS_IMPL_H

#include "mg_ref_seqs.h"

#if defined(__GNUC__)
#define SEQS_HIDDEN __attribute__((visibility("hidden")))
#else
#define SEQS_HIDDEN
#endif

#define MG_REF_SEQS_MAX_STATES 4

/* An architecture's recurrent state: n arrays, each
 * [n_layers][nstreams][per[k]] in the caller's buffers. */
typedef struct mg_ref_state_shape {
    int n_layers;
    int n;
    size_t per[MG_REF_SEQS_MAX_STATES];
} mg_ref_state_shape;

/* One segment as a plain forward of batch 1: st[k] is state k,
 * [n_layers][per[k]], read as the initial state and left holding the
 * final one. */
typedef mg_status (*mg_ref_seg_fwd_fn)(void *ctx, const mg_ref_seg *seg,
                                       double *const *st);

/* One segment as a plain backward of batch 1: st0[k] the initial state
 * (NULL: zeros), dT[k] the gradient of the final state (NULL: 0), d0[k]
 * receives the gradient of the initial state (NULL: not wanted), dblob
 * this segment's weight gradient (overwritten). */
typedef mg_status (*mg_ref_seg_bwd_fn)(void *ctx, const mg_ref_seg *seg,
                                       double *const *st0, double *const *dT,
                                       double *const *d0, double *dblob);

/* What an entry point with options does first: o checked against the
 * call (mg_ref_seqs_plan) and planned. *plain is set when o is NULL or
 * asks for nothing beyond the plain call (no start mask, no cu_seqlens):
 * then no plan is held and the entry point makes the plain call. */
SEQS_HIDDEN mg_status mg_ref_seqs_prepare(const mg_ref_seqs *o, int batch, int seqlen,
                                          const char *fn, mg_ref_plan *p, int *plain);

/* Runs the plan's segments, stream by stream: each stream's state is taken
 * from states[k] (NULL: zeros), zeroed before every segment that starts an
 * episode, and written back after its last segment (NULL: not written). */
SEQS_HIDDEN mg_status mg_ref_seqs_forward(const mg_ref_plan *p,
                                          const mg_ref_state_shape *sh,
                                          double *const *states,
                                          mg_ref_seg_fwd_fn fn, void *ctx);

/* The backward of the plan: a segment that takes the caller's initial
 * state gets st0 (NULL arrays: zeros) and hands its initial-state gradient
 * to d0; any other segment starts from zeros and no gradient leaves it
 * (d0 of a stream whose first token starts an episode is 0). The stream's
 * last segment gets dT. A stream with no tokens passes dT to d0 (its final
 * state is its initial one). dblob [nblob] = the sum of the segments'
 * weight gradients, in plan order. Each of st0, dT, d0 may be NULL (all
 * its arrays NULL). */
SEQS_HIDDEN mg_status mg_ref_seqs_backward(const mg_ref_plan *p,
                                           const mg_ref_state_shape *sh,
                                           const double *const *st0,
                                           const double *const *dT,
                                           double *const *d0, double *dblob,
                                           size_t nblob, mg_ref_seg_bwd_fn fn,
                                           void *ctx);

/* Sets rows [from, to) of a [rows][width] buffer to 0 (x NULL: nothing):
 * the rows of a packed call past cu_seqlens[nseq]. */
SEQS_HIDDEN void mg_ref_seqs_zero_rows(double *x, size_t from, size_t to,
                                       size_t width);

#endif
