/* mg_ref_mamba1.h: the Mamba-1 reference path. Plain C, runtime dims, f64
 * accumulation, the step recurrence of math.md (not the chunked form). It is
 * the oracle every generated Mamba-1 pipeline is checked against. Weights
 * come in the same f32 blob layout as the generated libraries
 * (doc/HACKING.md), laid out independently by mg_ref_mamba1_layout. */
#ifndef MG_REF_MAMBA1_H
#define MG_REF_MAMBA1_H
#include <stddef.h>
#include "mg_status.h"
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

/* Forward over [batch][seqlen]. u: [batch][seqlen][input_dim or D] (f32),
 * out: [batch][seqlen][D] (f64). conv_state [n_layers][batch][E][K-1] and
 * ssm_state [n_layers][batch][E][N] (f64) are read as the initial state and
 * overwritten with the final state; NULL means zeros in, nothing out. */
mg_status mg_ref_mamba1_forward(const mg_m1_dims *d, const mg_m1_layout *l,
                                const float *blob, int batch, int seqlen,
                                const float *u, double *out,
                                double *conv_state, double *ssm_state);

#ifdef __cplusplus
}
#endif
#endif
