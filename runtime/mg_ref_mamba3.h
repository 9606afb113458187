/* mg_ref_mamba3.h: the Mamba-3 SISO reference path. Plain C, runtime dims,
 * f64 accumulation, the step recurrence of doc/math.md (not the chunked form).
 * It is the oracle every generated Mamba-3 pipeline is checked against:
 * forward with state in/out, backward by reverse-mode through the step
 * recurrence, and an f64 evaluator of the chunked form of the SSM core (the
 * blueprint of the GPU chunked kernels). Weights come in the same f32 blob
 * layout as the generated libraries (doc/HACKING.md, "Weight blob layout
 * (Mamba-3 SISO)"), laid out independently by mg_ref_mamba3_layout. */
#ifndef MG_REF_MAMBA3_H
#define MG_REF_MAMBA3_H
#include <stdbool.h>
#include <stddef.h>
#include "mg_status.h"
#include "mg_ref_seqs.h"
#include "mg_compare.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_m3_a_act {
    MG_M3_A_HEAVY_TAIL = 0,  /* 1+v (v >= 0), 1/(1-v) (v < 0) */
    MG_M3_A_SOFTPLUS = 1
} mg_m3_a_act;

typedef struct mg_m3_dims {
    int d_model;    /* D */
    int n_layers;
    int d_state;    /* N */
    int d_inner;    /* E = expand * D = nheads * headdim */
    int headdim;    /* P */
    int nheads;     /* H */
    int ngroups;    /* G, divides H; head h uses group h / (H/G) */
    int n_angles;   /* S = floor(N * rope_fraction) / 2, 2S <= N */
    int input_dim;  /* 0 = identity input projection */
    double norm_eps;
    double a_floor;          /* A = -max(act(dd_A), a_floor) */
    mg_m3_a_act a_activation;
    bool outproj_norm;       /* gated RMSNorm before out_proj, else y*silu(z) */
} mg_m3_dims;

/* Offset of a tensor that the configuration does not have. */
#define MG_M3_NO_TENSOR ((size_t)-1)

/* Offsets (in floats) of one layer's tensors in the blob. */
typedef struct mg_m3_layer_off {
    size_t norm_w, in_proj_w, dt_bias, B_norm_w, C_norm_w, B_bias, C_bias, D,
           norm_gate_w,   /* MG_M3_NO_TENSOR unless outproj_norm */
           out_proj_w;
} mg_m3_layer_off;

typedef struct mg_m3_layout {
    size_t input_proj_w, input_proj_b;   /* MG_M3_NO_TENSOR unless input_dim > 0 */
    mg_m3_layer_off *layers;             /* n_layers entries (malloc'd) */
    size_t norm_f_w;
    size_t total;                        /* floats, multiple of 64 */
} mg_m3_layout;

/* in_proj outputs: 2E + 2GN + 3H + S. */
size_t mg_ref_mamba3_in_proj_dim(const mg_m3_dims *d);

/* Checks the dims (positive sizes, E = H*P, G | H, 2S <= N, eps > 0,
 * a_floor >= 0) and computes the layout. */
mg_status mg_ref_mamba3_layout(const mg_m3_dims *d, mg_m3_layout *out);
void mg_ref_mamba3_layout_free(mg_m3_layout *l);

/* One tensor of the blob, in blob order. */
typedef struct mg_m3_param {
    const char *key;     /* "in_proj_w", ... (the layout field name) */
    char name[64];       /* PyTorch state_dict name, e.g. "layers.0.mixer.D" */
    int ndim;
    long shape[3];
    size_t offset;       /* floats */
    size_t numel;
    int layer;           /* -1 for input_proj / norm_f */
} mg_m3_param;

/* The blob's tensors in order. out may be NULL (count only); otherwise it
 * has room for cap entries (MG_ERR_SIZE if too few). *count gets the
 * number of tensors. */
mg_status mg_ref_mamba3_params(const mg_m3_dims *d, const mg_m3_layout *l,
                               mg_m3_param *out, size_t cap, size_t *count);

/* Fill a blob with a plausible random initialisation (deterministic in
 * seed): linear weights and biases U(-1/sqrt(in), 1/sqrt(in)), norm weights,
 * B_bias, C_bias and D in 1 +- 0.1, dt_bias = softplus^-1(dt) with
 * log(dt) uniform in [log 1e-3, log 1e-1]. Padding is zeroed. */
mg_status mg_ref_mamba3_init(const mg_m3_dims *d, const mg_m3_layout *l,
                             float *blob, unsigned long long seed);

/* Moves a few heads' weights out of the init range, deterministically in
 * seed, so that tests compare a library with the reference where the init
 * never goes. Per layer: heads h % 3 == 0 get dt_bias = 22 + U(0, 2), so
 * softplus's argument is above its threshold 20 (the linear branch, DT =
 * x, DT about 22); heads h % 3 == 1 get the dd_A row of in_proj = -c e_0
 * (c = min(0.4 / a_floor, 4000)), so dd_A = -c x̂_0 is about -3e4 and the
 * activation falls below a_floor (the clamp A = -a_floor binds) wherever
 * channel 0 of the normalized input x̂ is above ~2.5, which an offset of 8
 * on that channel of the residual stream makes every token's: with
 * input_dim > 0, input_proj.bias[0] += 8; with input_dim = 0 the caller
 * adds *u_offset0 (8, else 0) to channel 0 of every input token. |dd_A|
 * stays under f16's range. The rest of the blob is left as it is. */
mg_status mg_ref_mamba3_push_ranges(const mg_m3_dims *d, const mg_m3_layout *l, float *blob,
                                    unsigned long long seed, float *u_offset0);

/* Recurrent state, per layer. All f64, layout [n_layers][batch][...]:
 *   ssm    [n_layers][batch][H][P][N]
 *   k_prev [n_layers][batch][H][N]   rotated k' of the last token
 *   v_prev [n_layers][batch][H][P]   v (x) of the last token
 *   angle  [n_layers][batch][H][S]   theta of the last token, in [0, 2pi)
 * Each pointer may be NULL: zeros in, nothing out. */

/* The four states of batch streams (all layers, the layouts above, f32
 * as a generated library holds them) against the reference's (ref, f64)
 * or, when ref is NULL, against another f32 result (ref32), frame-
 * invariantly (mg_compare.h, "Rotary states"): ssm and k_prev each turned
 * back by its own side's final angle, v_prev as it is, the angle on the
 * circle (mg_compare_angle_f32: its rel_l2 is the rms angular error over
 * the rms of a uniform angle). err: ssm, k_prev, v_prev, angle. The one
 * comparison of Mamba-3 states every test program and self-check uses:
 * the absolute angle of two correct runs drifts apart over long sequences
 * with rounded inputs, while the states relative to it agree. */
void mg_ref_mamba3_compare_states(const mg_m3_dims *d, int batch, const float *const got[4],
                                  const double *const ref[4], const float *const ref32[4], mg_err err[4]);

/* The angle state of a call with mg_ref_mamba3_push_ranges' weights, in two
 * parts: err[0] over the heads whose DT stays in the init range, err[1]
 * over the heads whose DT bias it raised (mg_ref_mamba3_pushed_dt_head).
 * Each comparison as mg_compare_angle_f32 (against ref, f64) or, when ref
 * is NULL, mg_compare_angle_f32f32 (against ref32). Why two parts: at DT
 * about 22 a head's angle turns by up to 70 rad a step, so the rounding of
 * each increment (an f32 ulp of 70 is 8e-6 rad; with bf16/f16 inputs to
 * DT, 0.1 rad and more) adds up in the absolute angle as a random walk that
 * no output sees; the states relative to it (the frame-invariant ssm and
 * k_prev checks) and the outputs still agree. The other heads keep the
 * usual bound. */
int mg_ref_mamba3_pushed_dt_head(int h);
void mg_ref_mamba3_compare_angle_pushed(const mg_m3_dims *d, int batch, const float *got, const double *ref,
                                        const float *ref32, mg_err err[2]);
/* The ssm state under those weights, in the same two parts of heads: each
 * part compared frame-invariantly (turned back by each side's own final
 * angle, as mg_ref_mamba3_compare_states). Why: the state is a sum of
 * terms each turned by the angle walked since its token; at DT ~ 22 the
 * rounding of those 70-rad increments reaches the relative rotations too
 * (about 1e-5 over a dozen steps in f32), not only the absolute angle. */
void mg_ref_mamba3_compare_ssm_pushed(const mg_m3_dims *d, int batch, const float *got, const float *got_angle,
                                      const double *ref, const double *ref_angle, const float *ref32,
                                      const float *ref32_angle, mg_err err[2]);
/* Its TAP lines: "WHAT (heads at init-range DT): rel_l2 <= tol" and
 * "WHAT (heads at DT ~ 22)" within the larger of tol and
 * MG_REF_M3_ANGLE_FAST_TOL, each with its diagnostic line. */
void mg_ref_mamba3_tap_ssm_pushed(const mg_m3_dims *d, int batch, const char *what, const float *got,
                                  const float *got_angle, const double *ref, const double *ref_angle,
                                  const float *ref32, const float *ref32_angle, double tol);
/* The TAP lines of that comparison, for the test programs: "WHAT (heads at
 * init-range DT): rel_l2 <= tol", then for the fast heads "WHAT (heads at
 * DT ~ 22)": within MG_REF_M3_ANGLE_FAST_TOL when f32_storage (about 10x
 * the random walk of the increments' rounding at the tests' lengths, far
 * below the ~1 of a wrong angle), else a skip: with bf16/f16 inputs to DT
 * their absolute angle is below the inputs' resolution (the ssm and k_prev
 * states relative to it, and the outputs, are checked by the caller). Each
 * check with its diagnostic line (max_abs, rel_l2, n). */
#define MG_REF_M3_ANGLE_FAST_TOL 1e-3
void mg_ref_mamba3_tap_angle_pushed(const mg_m3_dims *d, int batch, const char *what, const float *got,
                                    const double *ref, const float *ref32, double tol, int f32_storage);

/* Forward over [batch][seqlen]. u: [batch][seqlen][input_dim or D] (f32),
 * out: [batch][seqlen][D] (f64; may be NULL). The state arrays are read as
 * the initial state and overwritten with the final state (unchanged when
 * seqlen = 0). */
mg_status mg_ref_mamba3_forward(const mg_m3_dims *d, const mg_m3_layout *l,
                                const float *blob, int batch, int seqlen,
                                const float *u, double *out,
                                double *ssm, double *k_prev, double *v_prev,
                                double *angle);

/* The same with the weights blob and the input in f64 (finite differences
 * need perturbations finer than f32; the f32 entry points widen their
 * arguments and call these). */
mg_status mg_ref_mamba3_forward_f64(const mg_m3_dims *d, const mg_m3_layout *l,
                                    const double *blob, int batch, int seqlen,
                                    const double *u, double *out,
                                    double *ssm, double *k_prev, double *v_prev,
                                    double *angle);

/* Backward of loss = <out, dout> + <ssm_T, dssm_T> + <k_prev_T, dk_prev_T>
 *   + <v_prev_T, dv_prev_T> + <angle_T, dangle_T>
 * (the final-state terms let a sequence split across calls be
 * backpropagated call by call; NULL = zero). Runs the forward itself, from
 * the initial state (ssm0, ..., NULL = zeros; not modified), saving its
 * activations, then the step recurrence in reverse.
 * Outputs (each may be NULL except dblob):
 *   out     [batch][seqlen][D]  the forward output
 *   dblob   [l->total]          d loss / d weights, in the blob layout
 *                               (padding 0); overwritten, not accumulated
 *   du      [batch][seqlen][input_dim or D]
 *   dssm0, dk_prev0, dv_prev0, dangle0: d loss / d initial state, same
 *   layouts as the state.
 * The a_floor clamp passes no gradient when active; mod 2pi has derivative 1.
 * MG_M3_BWD_STATES: the parameters after u, the same for the f32 entry and
 * the f64 one (which differ in the precision of blob and u only). */
#define MG_M3_BWD_STATES                                                     \
    const double *ssm0, const double *k_prev0,                               \
    const double *v_prev0, const double *angle0,                             \
    const double *dout,                                                      \
    const double *dssm_T, const double *dk_prev_T,                           \
    const double *dv_prev_T, const double *dangle_T,                         \
    double *out, double *dblob, double *du,                                  \
    double *dssm0, double *dk_prev0,                                         \
    double *dv_prev0, double *dangle0
mg_status mg_ref_mamba3_backward(const mg_m3_dims *d, const mg_m3_layout *l,
                                 const float *blob, int batch, int seqlen,
                                 const float *u, MG_M3_BWD_STATES);

mg_status mg_ref_mamba3_backward_f64(const mg_m3_dims *d, const mg_m3_layout *l,
                                     const double *blob, int batch, int seqlen,
                                     const double *u, MG_M3_BWD_STATES);

/* ---- Episode starts and packed sequences --------------------------------
 * (doc/math.md, "Episode starts and packed sequences"; the options:
 * mg_ref_seqs.h.) The forward and backward above with a start mask
 * [batch][seqlen] and/or packed sequences (cu_seqlens over a batch of one);
 * the other arguments mean what they mean there. seqs NULL, or with
 * neither start nor cu_seqlens: the plain call (the options still checked).
 * Otherwise the call runs as its segments (mg_ref_seqs_plan), each a plain
 * call of batch 1 on its rows, from the stream's state (a stream's first
 * segment when no episode starts at its first token) or from zeros (every
 * other segment: Hs, k_prev, v_prev and the angle, so the angle sum
 * restarts at 0 and the start token's beta term vanishes). Outputs, final
 * states, du and the initial-state gradients are bit-identical to the plain
 * entry points on the hand-split segments; dblob is the sum of the
 * segments' gradients, in plan order. The final-state gradients (d*_T)
 * enter a stream's last segment only; no gradient crosses a start, and a
 * stream whose first token starts an episode gets initial-state gradients
 * 0. Packed (seqs->cu_seqlens): batch 1, seqlen = the tokens u and out
 * (dout, du) hold; the states and their gradients are
 * [n_layers][nseq][...]; the rows of out and du past cu_seqlens[nseq] are
 * written as zeros. Errors (checked before anything is written): those of
 * the plain call and of mg_ref_seqs_plan. */
mg_status mg_ref_mamba3_forward_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                   const float *blob, int batch, int seqlen,
                                   const float *u, double *out,
                                   double *ssm, double *k_prev, double *v_prev,
                                   double *angle, const mg_ref_seqs *seqs);
mg_status mg_ref_mamba3_forward_f64_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                       const double *blob, int batch, int seqlen,
                                       const double *u, double *out,
                                       double *ssm, double *k_prev, double *v_prev,
                                       double *angle, const mg_ref_seqs *seqs);
mg_status mg_ref_mamba3_backward_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                    const float *blob, int batch, int seqlen,
                                    const float *u, MG_M3_BWD_STATES,
                                    const mg_ref_seqs *seqs);
mg_status mg_ref_mamba3_backward_f64_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                        const double *blob, int batch, int seqlen,
                                        const double *u, MG_M3_BWD_STATES,
                                        const mg_ref_seqs *seqs);

/* The SSM core of one layer (doc/math.md steps 8-10), on precomputed per-token
 * inputs. Per (batch b, token t, head h):
 *   alpha = exp(adt), beta = (1-lam)*dt*alpha, gamma = lam*dt,
 *   Hs_t = alpha Hs_{t-1} + beta v_{t-1} k'_{t-1}^T + gamma v_t k'_t^T,
 *   y_t  = Hs_t q'_t + D v_t. */
typedef struct mg_m3_ssm_args {
    int batch, seqlen, nheads, headdim, d_state;   /* B, T, H, P, N */
    const double *q;    /* [B][T][H][N] q' (rotated) */
    const double *k;    /* [B][T][H][N] k' (rotated) */
    const double *v;    /* [B][T][H][P] */
    const double *adt;  /* [B][T][H] A*DT */
    const double *dt;   /* [B][T][H] DT */
    const double *lam;  /* [B][T][H] lambda */
    const double *D;    /* [H] */
    double *y;          /* [B][T][H][P] out */
    double *ssm;        /* [B][H][P][N] in/out; NULL: zeros in, nothing out */
    double *k_prev;     /* [B][H][N]    in/out; NULL: zeros in, nothing out */
    double *v_prev;     /* [B][H][P]    in/out; NULL: zeros in, nothing out */
} mg_m3_ssm_args;

/* The step recurrence (what mg_ref_mamba3_forward uses). */
mg_status mg_ref_mamba3_ssm_step(const mg_m3_ssm_args *a);

/* The chunked form of doc/math.md with chunk length `chunk` (>= 1; the last
 * chunk may be shorter): per chunk, cumulative sums of adt, intra-chunk
 * causal sums with the shifted gamma scale_s = gamma_s + (1-lam_{s+1})
 * dt_{s+1} (dt past the end of the call = 0), chunk states passed on as
 * Hs <- exp(cs_end) Hs + S_c; the initial state enters as
 * ssm + (1-lam_0) dt_0 v_prev k_prev^T. Same results and final state as
 * mg_ref_mamba3_ssm_step up to f64 rounding. */
mg_status mg_ref_mamba3_ssm_chunked(const mg_m3_ssm_args *a, int chunk);

#ifdef __cplusplus
}
#endif
#endif
