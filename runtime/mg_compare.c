/* mg_compare.c: max-abs and relative-L2 errors of a result against the
 * reference. Non-finite entries (in got, or in ref) are counted and left
 * out of the norms, so the finite part still reads meaningfully. */
#include "mg_compare.h"

#include <math.h>

static mg_err finish(double max_abs, double d2, double r2, size_t n, size_t nf)
{
    mg_err e;
    e.max_abs = max_abs;
    e.ref_norm = sqrt(r2);
    e.rel_l2 = sqrt(d2) / fmax(e.ref_norm, 1e-300);
    e.n = n;
    e.n_nonfinite = nf;
    return e;
}

mg_err mg_compare_f32(const float *got, const double *ref, size_t n)
{
    double max_abs = 0, d2 = 0, r2 = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) || !isfinite(r)) {
            nf++;
            continue;
        }
        double d = fabs(g - r);
        if (d > max_abs)
            max_abs = d;
        d2 += d * d;
        r2 += r * r;
    }
    return finish(max_abs, d2, r2, n, nf);
}

mg_err mg_compare_f32f32(const float *got, const float *ref, size_t n)
{
    double max_abs = 0, d2 = 0, r2 = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) || !isfinite(r)) {
            nf++;
            continue;
        }
        double d = fabs(g - r);
        if (d > max_abs)
            max_abs = d;
        d2 += d * d;
        r2 += r * r;
    }
    return finish(max_abs, d2, r2, n, nf);
}

mg_err mg_compare_f64(const double *got, const double *ref, size_t n)
{
    double max_abs = 0, d2 = 0, r2 = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) || !isfinite(r)) {
            nf++;
            continue;
        }
        double d = fabs(g - r);
        if (d > max_abs)
            max_abs = d;
        d2 += d * d;
        r2 += r * r;
    }
    return finish(max_abs, d2, r2, n, nf);
}

void mg_err_print(FILE *f, const char *name, const mg_err *e)
{
    if (e->n_nonfinite)
        fprintf(f, "%s: max_abs=%.3e rel_l2=%.3e (n=%zu, nonfinite=%zu)\n",
                name, e->max_abs, e->rel_l2, e->n, e->n_nonfinite);
    else
        fprintf(f, "%s: max_abs=%.3e rel_l2=%.3e (n=%zu)\n",
                name, e->max_abs, e->rel_l2, e->n);
}

int mg_err_ok(const mg_err *e, double tol)
{
    return e->n_nonfinite == 0 && isfinite(e->rel_l2) && isfinite(e->max_abs)
           && e->rel_l2 <= tol;
}
