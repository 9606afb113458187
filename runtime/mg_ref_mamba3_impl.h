/* mg_ref_mamba3_impl.h: what the files of the Mamba-3 SISO reference share
 * (not installed; the API is mg_ref_mamba3.h, the math doc/math.md).
 * Everything is computed in f64 from the f32 weight blob. One job per file:
 *   mg_ref_mamba3.c      dims, the weight blob layout, tensor table, init
 *   mg_ref_mamba3_ssm.c  the SSM core: the step recurrence, its reverse, and
 *                        the chunked form
 *   mg_ref_mamba3_fwd.c  the model forward and its entry points
 *   mg_ref_mamba3_bwd.c  the model backward and its entry points
 *   mg_ref_mamba3_seqs.c the entry points with episode starts and packed
 *                        sequences (mg_ref_seqs.h): the calls as segments
 *
 * Structure: m3_forward_run() is the one forward; it either reuses one
 * activation scratch for every layer (forward only) or keeps every layer's
 * per-token activations (backward). The backward then walks the layers in
 * reverse, and inside each layer: out_proj and gate, the step recurrence in
 * reverse (m3_ssm_step_bwd; the SSM states of one (batch, head) sequence are
 * recomputed by the forward's own step code rather than stored for the
 * whole layer), the angle recurrence in reverse, then the per-token maps
 * (splits, BCNorm, in_proj, pre-norm). */
#ifndef MG_REF_MAMBA3_IMPL_H
#define MG_REF_MAMBA3_IMPL_H

#include <math.h>
#include <stddef.h>

#include "mg_ref_mamba3.h"

#define M3_PI 3.14159265358979323846
#define M3_2PI 6.28318530717958647692

/* The functions below are shared between the reference's files only: kept
 * out of libmgrt's exported symbols. */
#if defined(__GNUC__)
#define M3_HIDDEN __attribute__((visibility("hidden")))
#else
#define M3_HIDDEN
#endif

/* ---- scalar maps, f64 */

static inline double sigm(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static inline double dsoftplus(double x) { return x > 20.0 ? 1.0 : sigm(x); }
static inline double silu(double x) { return x * sigm(x); }
static inline double dsilu(double x)
{
    double s = sigm(x);
    return s * (1.0 + x * (1.0 - s));
}
static inline double a_act(mg_m3_a_act k, double v)
{
    if (k == MG_M3_A_SOFTPLUS) return softplus(v);
    return v >= 0 ? 1.0 + v : 1.0 / (1.0 - v);
}
static inline double da_act(mg_m3_a_act k, double v)
{
    if (k == MG_M3_A_SOFTPLUS) return dsoftplus(v);
    return v >= 0 ? 1.0 : 1.0 / ((1.0 - v) * (1.0 - v));
}

/* The sizes one layer works with, and the column offsets of the parts of
 * an in_proj output row: z, x (at 0 and E), B, C, DT, A, trap, angles. */
typedef struct m3_sizes {
    size_t D, E, N, H, G, S, P, NP, BT, HG;
    size_t oB, oC, oDT, oA, oTR, oANG;
} m3_sizes;

/* The sizes of a B x T call as locals named like the fields (the layer
 * code's notation: D, E, N, ..., oANG). */
#define M3_SIZES(d, B, T)                                                    \
    const m3_sizes sz = m3_sizes_of(d, B, T);                                \
    const size_t D = sz.D, E = sz.E, N = sz.N, H = sz.H, G = sz.G, S = sz.S, \
                 P = sz.P, NP = sz.NP, BT = sz.BT, HG = sz.HG, oB = sz.oB,   \
                 oC = sz.oC, oDT = sz.oDT, oA = sz.oA, oTR = sz.oTR,         \
                 oANG = sz.oANG

static inline m3_sizes m3_sizes_of(const mg_m3_dims *d, int B, int T)
{
    m3_sizes z;
    z.D = (size_t)d->d_model;
    z.E = (size_t)d->d_inner;
    z.N = (size_t)d->d_state;
    z.H = (size_t)d->nheads;
    z.G = (size_t)d->ngroups;
    z.S = (size_t)d->n_angles;
    z.P = (size_t)d->headdim;
    z.NP = mg_ref_mamba3_in_proj_dim(d);
    z.BT = (size_t)B * T;
    z.HG = z.H / z.G;
    z.oB = 2 * z.E;
    z.oC = 2 * z.E + z.G * z.N;
    z.oDT = 2 * z.E + 2 * z.G * z.N;
    z.oA = z.oDT + z.H;
    z.oTR = z.oA + z.H;
    z.oANG = z.oTR + z.H;
    return z;
}

/* ---- mg_ref_mamba3.c */

/* MG_OK if the dims are in range and consistent (else MG_ERR_INVALID_ARG). */
M3_HIDDEN mg_status m3_check_dims(const mg_m3_dims *d);

/* ---- mg_ref_mamba3_ssm.c */

/* The step recurrence over all (batch, head) sequences of A (the state in A
 * is read and overwritten). */
M3_HIDDEN mg_status m3_ssm_step_core(const mg_m3_ssm_args *a);
/* Reverse of m3_ssm_step_core (the arguments at its definition). */
M3_HIDDEN mg_status m3_ssm_step_bwd(const mg_m3_ssm_args *a, const double *dy, const double *dssmT,
                                    const double *dkT, const double *dvT,
                                    double *dq, double *dk, double *dv, double *dadt,
                                    double *ddt, double *dlam, double *dD,
                                    double *dssm0, double *dk0, double *dv0);

/* ---- mg_ref_mamba3_fwd.c */

/* One layer's activations over [B*T] tokens. */
typedef struct m3_acts {
    double *hin;    /* [BT][D] layer input (residual stream) */
    double *rin;    /* [BT] rms factor of hin */
    double *hn;     /* [BT][D] pre-normed input */
    double *proj;   /* [BT][NP] in_proj output */
    double *v;      /* [BT][E] = [BT][H][P], the x slice */
    double *dt, *A, *adt, *lam;   /* [BT][H] */
    double *rB, *rC;              /* [BT][G] */
    double *kq;     /* [BT][H][N] unrotated k (biased BCNorm of B) */
    double *qq;     /* [BT][H][N] unrotated q */
    double *kr, *qr;              /* [BT][H][N] rotated */
    double *theta;  /* [BT][H][S] */
    double *y;      /* [BT][E] SSM output */
    double *ry;     /* [BT][H] gate-norm rms factor (outproj_norm) */
    double *g;      /* [BT][E] gated output */
} m3_acts;

M3_HIDDEN void m3_acts_free(m3_acts *a);
M3_HIDDEN mg_status m3_acts_alloc(m3_acts *a, const mg_m3_dims *d, size_t BT);

/* State pointers of one layer (m3_layer_state; NULL stays NULL). */
typedef struct m3_lstate { double *ssm, *kp, *vp, *ang; } m3_lstate;

M3_HIDDEN m3_lstate m3_layer_state(const mg_m3_dims *d, int B, int li, double *ssm,
                                   double *kp, double *vp, double *ang);
/* The SSM arguments of one layer: its activations A, the skip D (Dd) and
 * its state ST. */
M3_HIDDEN void m3_ssm_args_of(const mg_m3_dims *d, int B, int T, const m3_acts *a,
                              const double *Dd, m3_lstate st, mg_m3_ssm_args *s);
/* The one forward (see its definition). */
M3_HIDDEN mg_status m3_forward_run(const mg_m3_dims *d, const mg_m3_layout *l,
                                   const double *w, int B, int T, const double *u,
                                   double *out, double *ssm, double *kp, double *vp,
                                   double *ang, m3_acts *acts, int save, double *h,
                                   double *rf);
/* The argument checks of the entry points. */
M3_HIDDEN mg_status m3_check_call(const mg_m3_dims *d, const mg_m3_layout *l,
                                  const void *blob, int batch, int seqlen,
                                  const void *u);
/* m3_check_call plus the backward's outputs: dblob, and dout when there
 * are tokens (mg_ref_mamba3_bwd.c). */
M3_HIDDEN mg_status m3_check_bwd_call(const mg_m3_dims *d, const mg_m3_layout *l,
                                      const void *blob, int batch, int seqlen,
                                      const void *u, const double *dout,
                                      const double *dblob);
/* The f32 entry points: the call checked (m3_check_call), then f64 copies
 * of the blob and the input (*wb, *ub NULL on failure). */
M3_HIDDEN mg_status m3_widen(const mg_m3_dims *d, const mg_m3_layout *l,
                             const float *blob, int batch, int seqlen, const float *u,
                             double **wb, double **ub);

#endif
