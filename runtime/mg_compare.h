/* mg_compare.h: comparing a result (float, as read back from the GPU)
 * with the f64 reference: max-abs and relative-L2 error per tensor, and a
 * one-line report. */
#ifndef MG_COMPARE_H
#define MG_COMPARE_H
#include <stddef.h>
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct mg_err {
    double max_abs;     /* max |got - ref| */
    double rel_l2;      /* ||got - ref||_2 / max(||ref||_2, tiny) */
    double ref_norm;    /* ||ref||_2 */
    size_t n;           /* elements compared */
    size_t n_nonfinite; /* NaN/Inf in got (or in ref); left out of the norms */
} mg_err;
mg_err mg_compare_f32(const float *got, const double *ref, size_t n);
mg_err mg_compare_f32f32(const float *got, const float *ref, size_t n);
/* Added: f64 result against f64 reference (reference self-consistency). */
mg_err mg_compare_f64(const double *got, const double *ref, size_t n);
/* Angles (θ mod 2π: 6.28 and 0.0 are the same angle) put on the circle of
 * their reference before a comparison: w[j] = r + (got[j] - r wrapped into
 * [-π, π]) with r = ref[j] (ref, f64) or ref32[j] (ref NULL: another
 * result), so two correct paths that wrap a step apart compare equal and
 * only the true angular error counts. w may alias got. */
void mg_angle_on_circle(float *w, const float *got, const double *ref, const float *ref32, size_t n);
/* ---- Rotary states, compared in their own frame ----
 *
 * A rotary model (Mamba-3) turns pairs (2a, 2a+1), a < s, of every row of
 * its k' and of its ssm state along N by the running angle θ (doc/math.md
 * §3, step 7). Only angle differences reach the outputs, so two correct
 * runs whose absolute angle drifts apart over thousands of steps (rounded
 * inputs of the angle sum) hold states that differ by a rotation and
 * nothing else. These helpers compare such states frame-invariantly: each
 * side is first turned back by its own final angle (the state then holds
 * R(θ_s - θ_T)·k_s: relative angles only), then compared as usual. The
 * rotation is an isometry, so with equal angles on both sides this is the
 * raw comparison up to rounding; with different angles, a state that is
 * wrong beyond the rotation still shows. */
typedef struct mg_rot_shape {
    size_t heads;   /* angle vectors: n_layers * batch * H */
    size_t rows;    /* rows per head turned by that head's angle: P (ssm), 1 (k_prev) */
    size_t n;       /* entries per row: N */
    size_t s;       /* rotated pairs per row, <= n/2; entries 2s..n-1 pass */
} mg_rot_shape;
/* w = x turned back by angle (x: heads x rows x n, angle: heads x s):
 * w[2a] = cos θ x[2a] + sin θ x[2a+1], w[2a+1] = -sin θ x[2a] + cos θ x[2a+1],
 * the inverse of math.md's k' rotation. w may alias x. */
void mg_derotate_f64(double *w, const double *x, const double *angle, const mg_rot_shape *sh);
/* got (with its final angle got_angle) against ref (ref_angle), each
 * turned back by its own angle first; max_abs and rel_l2 as
 * mg_compare_f32. The raw got goes to the digest log as mg_compare_f32's. */
mg_err mg_compare_rotated_f32(const float *got, const float *got_angle, const double *ref,
                              const double *ref_angle, const mg_rot_shape *sh);
/* The same against another f32 result (ref, ref_angle). */
mg_err mg_compare_rotated_f32f32(const float *got, const float *got_angle, const float *ref,
                                 const float *ref_angle, const mg_rot_shape *sh);
/* Angles compared on the circle: each difference wrapped into [-π, π]
 * (6.28 and 0.0 are the same angle), max_abs in radians, rel_l2 = the rms
 * of the wrapped differences divided by MG_ANGLE_SCALE (ref_norm =
 * MG_ANGLE_SCALE * sqrt(n)): a measure of the angular error alone,
 * independent of where on the circle the angles happen to lie. */
#define MG_ANGLE_SCALE 3.627598728468436   /* 2π/√3, the rms of an angle uniform on [0, 2π) */
mg_err mg_compare_angle_f32(const float *got, const double *ref, size_t n);
mg_err mg_compare_angle_f32f32(const float *got, const float *ref, size_t n);
/* Prints "name: max_abs=... rel_l2=... (n=...)" to f. */
void mg_err_print(FILE *f, const char *name, const mg_err *e);
/* 1 if e is finite everywhere and rel_l2 <= tol. */
int mg_err_ok(const mg_err *e, double tol);
#ifdef __cplusplus
}
#endif
#endif
