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
/* Prints "name: max_abs=... rel_l2=... (n=...)" to f. */
void mg_err_print(FILE *f, const char *name, const mg_err *e);
/* 1 if e is finite everywhere and rel_l2 <= tol. */
int mg_err_ok(const mg_err *e, double tol);
#ifdef __cplusplus
}
#endif
#endif
