/* mg_ref_mamba1.h: the Mamba-1 reference path. Plain C, runtime dims, f64
 * accumulation, the step recurrence of doc/math.md (not the chunked form). It is
 * the oracle every generated Mamba-1 pipeline is checked against. Weights
 * come in the same f32 blob layout as the generated libraries
 * (doc/HACKING.md), laid out independently by mg_ref_mamba1_layout. */
#ifndef MG_REF_MAMBA1_H
#define MG_REF_MAMBA1_H
#include <stddef.h>
#include "mg_status.h"
#include "mg_ref_seqs.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_m1_dims {
    int d_model;    /* D */
    int n_layers;
    int d_state;    /* N */
    int d_inner;    /* E = expand * D */
    int d_conv;     /* K */
    int dt_rank;    /* R */
    int input_dim;  /* 0 = identity input projection */
    double norm_eps;
} mg_m1_dims;

/* Offsets (in floats) of one layer's tensors in the blob. */
typedef struct mg_m1_layer_off {
    size_t norm_w, in_proj_w, conv_w, conv_b, x_proj_w, dt_proj_w, dt_proj_b,
           A_log, D, out_proj_w;
} mg_m1_layer_off;

typedef struct mg_m1_layout {
    size_t input_proj_w, input_proj_b;   /* valid when input_dim > 0 */
    mg_m1_layer_off *layers;             /* n_layers entries (malloc'd) */
    size_t norm_f_w;
    size_t total;                        /* floats, multiple of 64 */
} mg_m1_layout;

mg_status mg_ref_mamba1_layout(const mg_m1_dims *d, mg_m1_layout *out);
void mg_ref_mamba1_layout_free(mg_m1_layout *l);

/* Fill a blob with a plausible random initialisation (deterministic in
 * seed): linear weights U(-1/sqrt(in), 1/sqrt(in)), norm weights near 1,
 * A_log = log(1..N) (+ noise), dt_proj.bias giving dt in [1e-3, 1e-1], D near 1. */
mg_status mg_ref_mamba1_init(const mg_m1_dims *d, const mg_m1_layout *l,
                             float *blob, unsigned long long seed);

/* Moves some channels' weights out of the init range, deterministically in
 * seed, so that tests compare a library with the reference where the init
 * never goes: per layer, channels e % 4 == 0 get dt_proj.bias = 22 +
 * U(0, 2), so softplus's argument is above its threshold 20 (the linear
 * branch, delta = x, about 22). *u_offset0 (the input offset mamba3's
 * counterpart may ask for) is 0. The rest of the blob is left as it is. */
mg_status mg_ref_mamba1_push_ranges(const mg_m1_dims *d, const mg_m1_layout *l, float *blob,
                                    unsigned long long seed, float *u_offset0);

/* Forward over [batch][seqlen]. u: [batch][seqlen][input_dim or D] (f32),
 * out: [batch][seqlen][D] (f64). conv_state [n_layers][batch][E][K-1] and
 * ssm_state [n_layers][batch][E][N] (f64) are read as the initial state and
 * overwritten with the final state; NULL means zeros in, nothing out. */
mg_status mg_ref_mamba1_forward(const mg_m1_dims *d, const mg_m1_layout *l,
                                const float *blob, int batch, int seqlen,
                                const float *u, double *out,
                                double *conv_state, double *ssm_state);

/* ---- Added beyond the first contract ------------------------------------ */

/* One tensor of the blob, PyTorch (Hugging Face *-hf) name. */
typedef struct mg_m1_tensor {
    char name[64];      /* e.g. "backbone.layers.0.mixer.in_proj.weight" */
    size_t offset;      /* floats from the start of the blob */
    size_t numel;
    int layer;          /* -1 for input_proj.* and norm_f.weight */
} mg_m1_tensor;

/* The tensors in blob order: (input_dim > 0 ? 2 : 0) + 10*n_layers + 1 of
 * them. Fills min(count, max) entries of out (out may be NULL) and returns
 * the count, or -1 if d or l is NULL. */
int mg_ref_mamba1_tensors(const mg_m1_dims *d, const mg_m1_layout *l,
                          mg_m1_tensor *out, int max);

/* Same as mg_ref_mamba1_forward with the weights blob and the input in f64
 * (finite differences need perturbations finer than f32). */
mg_status mg_ref_mamba1_forward_f64(const mg_m1_dims *d, const mg_m1_layout *l,
                                    const double *blob, int batch, int seqlen,
                                    const double *u, double *out,
                                    double *conv_state, double *ssm_state);

/* Backward of loss = <out, dout> (sum over every element of
 * out[batch][seqlen][D]). Recomputes the forward (saving activations layer
 * by layer), then backpropagates through the step recurrence in reverse.
 * conv_state_in [n_layers][batch][E][K-1], ssm_state_in [n_layers][batch][E][N]
 * (f64): the initial state, NULL = zeros. Outputs (f64):
 *   grad_blob  [l->total], same layout as the blob, overwritten (padding 0);
 *   du         [batch][seqlen][input_dim or D], may be NULL;
 *   dconv_state_in, dssm_state_in: gradients w.r.t. the initial state, same
 *              shapes as the states, may be NULL (computed either way).
 * The final state gets no gradient (the loss depends on out only).
 * MG_M1_BWD_STATES: the parameters after u, the same for the f32 entry and
 * the f64 one (which differ in the precision of blob and u only). */
#define MG_M1_BWD_STATES                                                     \
    const double *conv_state_in, const double *ssm_state_in,                 \
    const double *dout, double *grad_blob, double *du,                       \
    double *dconv_state_in, double *dssm_state_in
mg_status mg_ref_mamba1_backward(const mg_m1_dims *d, const mg_m1_layout *l,
                                 const float *blob, int batch, int seqlen,
                                 const float *u, MG_M1_BWD_STATES);
mg_status mg_ref_mamba1_backward_f64(const mg_m1_dims *d, const mg_m1_layout *l,
                                     const double *blob, int batch, int seqlen,
                                     const double *u, MG_M1_BWD_STATES);

/* ---- Episode starts and packed sequences --------------------------------
 * (doc/math.md, "Episode starts and packed sequences"; the options:
 * mg_ref_seqs.h.) The forward and backward above with a start mask
 * [batch][seqlen] and/or packed sequences (cu_seqlens over a batch of one);
 * the other arguments mean what they mean there. seqs NULL, or with
 * neither start nor cu_seqlens: the plain call (the options still checked).
 * Otherwise the call runs as its segments (mg_ref_seqs_plan), each a plain
 * call of batch 1 on its rows, from the stream's state (a stream's first
 * segment when no episode starts at its first token) or from zeros (every
 * other segment): outputs, final states, du and the initial-state
 * gradients are bit-identical to the plain entry points on the hand-split
 * segments; grad_blob is the sum of the segments' gradients, in plan
 * order. An episode start zeroes the conv window too: the taps before a
 * segment's first token read zeros, and the final conv state of a stream
 * whose last segment is shorter than K-1 holds zeros before its start.
 * Packed (seqs->cu_seqlens): batch 1, seqlen = the tokens u and out (dout,
 * du) hold; the states (and their gradients) are [n_layers][nseq][...];
 * the rows of out and du past cu_seqlens[nseq] are written as zeros.
 * Errors (checked before anything is written): those of the plain call and
 * of mg_ref_seqs_plan. */
mg_status mg_ref_mamba1_forward_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                   const float *blob, int batch, int seqlen,
                                   const float *u, double *out,
                                   double *conv_state, double *ssm_state,
                                   const mg_ref_seqs *seqs);
mg_status mg_ref_mamba1_forward_f64_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                       const double *blob, int batch, int seqlen,
                                       const double *u, double *out,
                                       double *conv_state, double *ssm_state,
                                       const mg_ref_seqs *seqs);
mg_status mg_ref_mamba1_backward_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                    const float *blob, int batch, int seqlen,
                                    const float *u, MG_M1_BWD_STATES,
                                    const mg_ref_seqs *seqs);
mg_status mg_ref_mamba1_backward_f64_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                        const double *blob, int batch, int seqlen,
                                        const double *u, MG_M1_BWD_STATES,
                                        const mg_ref_seqs *seqs);

/* The two sequence kernels of the mixer, for one sequence, exposed so tests
 * can hold them against naive loops.
 * Causal depthwise conv + SiLU (doc/math.md step 2): x[t*ldx + e] (t < T,
 * e < E), w [E][K], bias [E]; state [E][K-1] (oldest first) supplies the
 * inputs before t = 0 and is overwritten with the last K-1 inputs; NULL
 * means zeros, nothing written. pre [T][E] (pre-activation; may be NULL),
 * xc [T][E] = silu(pre). */
void mg_ref_m1_conv(int T, int E, int K, const double *x, int ldx,
                    const double *w, const double *bias, double *state,
                    double *pre, double *xc);
/* Selective scan, step form (doc/math.md steps 6-7): xc, delta [T][E],
 * A [E][N] (already -exp(A_log)), B and C rows at Bm[t*ldbc + n],
 * Cm[t*ldbc + n], Dp [E]; s [E][N] is the state in/out (must not be NULL);
 * y [T][E]; s_hist [T][E][N] receives s after every step (may be NULL). */
void mg_ref_m1_scan(int T, int E, int N, const double *xc, const double *delta,
                    const double *A, const double *Bm, const double *Cm, int ldbc,
                    const double *Dp, double *s, double *y, double *s_hist);
/* softplus with PyTorch's threshold 20 (x > 20 -> x). */
double mg_ref_softplus(double x);

#ifdef __cplusplus
}
#endif
#endif
