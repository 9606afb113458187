/* mg_compare.c: max-abs and relative-L2 errors of a result against the
 * reference. Non-finite entries (in got, or in ref) are counted and left
 * out of the norms, so the finite part still reads meaningfully. */
#include "mg_compare.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Digest log: with MG_DIGEST_DIR set, every result handed to
 * mg_compare_f32/mg_compare_f32f32 is hashed (FNV-1a over its bytes) and
 * appended, in call order, to DIR/<program>.digest. Two builds of the same
 * library that print the same digest files computed bit-identical outputs,
 * states and gradients (a refactor's proof that nothing changed). */
static void digest_log(const char *kind, const float *got, const float *other, size_t n)
{
    static FILE *f;
    static int tried;
    static unsigned long seq;
    if (!tried) {
        tried = 1;
        const char *dir = getenv("MG_DIGEST_DIR");
        if (dir && *dir) {
            char exe[512] = "prog", path[1024];
            ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (k > 0) exe[k] = 0;
            const char *base = strrchr(exe, '/');
            snprintf(path, sizeof path, "%s/%s.digest", dir, base ? base + 1 : exe);
            f = fopen(path, "w");
        }
    }
    if (!f) return;
    uint64_t h = 1469598103934665603ull, h2 = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)got;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    if (other) {
        b = (const unsigned char *)other;
        for (size_t i = 0; i < n * sizeof(float); i++) h2 = (h2 ^ b[i]) * 1099511628211ull;
    }
    fprintf(f, "%lu %s n=%zu %016llx %016llx\n", seq++, kind, n, (unsigned long long)h,
            (unsigned long long)(other ? h2 : 0));
    fflush(f);
}

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

/* Running sums of one comparison; NaN/Inf on either side is counted, not summed. */
typedef struct { double max_abs, d2, r2; size_t nf; } cmp_acc;

static void acc_add(cmp_acc *a, double g, double r)
{
    if (!isfinite(g) || !isfinite(r)) {
        a->nf++;
        return;
    }
    double d = fabs(g - r);
    if (d > a->max_abs)
        a->max_abs = d;
    a->d2 += d * d;
    a->r2 += r * r;
}

/* One comparison; got and ref each come as float (*32) or double (*64),
 * the other pointer NULL. A float widens to double exactly, so every entry
 * point sums the same values in the same order. */
static mg_err compare(const float *got32, const double *got64,
                      const float *ref32, const double *ref64, size_t n)
{
    cmp_acc a = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++)
        acc_add(&a, got32 ? got32[i] : got64[i], ref32 ? ref32[i] : ref64[i]);
    return finish(a.max_abs, a.d2, a.r2, n, a.nf);
}

mg_err mg_compare_f32(const float *got, const double *ref, size_t n)
{
    digest_log("ref", got, NULL, n);
    return compare(got, NULL, NULL, ref, n);
}

mg_err mg_compare_f32f32(const float *got, const float *ref, size_t n)
{
    digest_log("gpu", got, ref, n);
    return compare(got, NULL, ref, NULL, n);
}

mg_err mg_compare_f64(const double *got, const double *ref, size_t n)
{
    return compare(NULL, got, NULL, ref, n);
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

void mg_angle_on_circle(float *w, const float *got, const double *ref, const float *ref32, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        const double r = ref ? ref[j] : (double)ref32[j];
        w[j] = (float)(r + remainder((double)got[j] - r, 6.283185307179586));
    }
}

/* ---- rotary states (mg_compare.h: "Rotary states") ---- */

void mg_derotate_f64(double *w, const double *x, const double *angle, const mg_rot_shape *sh)
{
    for (size_t h = 0; h < sh->heads; h++) {
        const double *th = angle + h * sh->s;
        for (size_t r = 0; r < sh->rows; r++) {
            const size_t o = (h * sh->rows + r) * sh->n;
            for (size_t a = 0; a < sh->s; a++) {
                const double c = cos(th[a]), sn = sin(th[a]);
                const double x0 = x[o + 2 * a], x1 = x[o + 2 * a + 1];
                w[o + 2 * a] = c * x0 + sn * x1;
                w[o + 2 * a + 1] = -sn * x0 + c * x1;
            }
            if (w != x)
                for (size_t j = 2 * sh->s; j < sh->n; j++) w[o + j] = x[o + j];
        }
    }
}

/* The f64 copy of n floats (malloc'd; NULL when out of memory). */
static double *widen(const float *x, size_t n)
{
    double *w = (double *)malloc((n ? n : 1) * sizeof(double));
    if (w)
        for (size_t i = 0; i < n; i++) w[i] = x[i];
    return w;
}

/* An error no tolerance accepts: what a comparison reports when it could
 * not run (host memory exhausted), so that a check fails rather than passes. */
static mg_err failed_compare(size_t n)
{
    mg_err e = finish(INFINITY, INFINITY, 1.0, n, n ? n : 1);
    return e;
}

/* got / ref in f64, each turned back by its own angle, then compared. The
 * angles and ref come as f64 (ref64, ref_ang64) or f32 (ref32, ref_ang32). */
static mg_err compare_rotated(const float *got, const float *got_angle, const double *ref64,
                              const double *ref_ang64, const float *ref32, const float *ref_ang32,
                              const mg_rot_shape *sh)
{
    const size_t n = sh->heads * sh->rows * sh->n, na = sh->heads * sh->s;
    double *g = widen(got, n), *ga = widen(got_angle, na);
    double *r = ref64 ? (double *)malloc((n ? n : 1) * sizeof(double)) : widen(ref32, n);
    double *ra = ref_ang64 ? NULL : widen(ref_ang32, na);
    mg_err e;
    if (!g || !ga || !r || (!ref_ang64 && !ra)) {
        e = failed_compare(n);
    } else {
        if (ref64) memcpy(r, ref64, n * sizeof(double));
        mg_derotate_f64(g, g, ga, sh);
        mg_derotate_f64(r, r, ref_ang64 ? ref_ang64 : ra, sh);
        e = compare(NULL, g, NULL, r, n);
    }
    free(g); free(ga); free(r); free(ra);
    return e;
}

mg_err mg_compare_rotated_f32(const float *got, const float *got_angle, const double *ref,
                              const double *ref_angle, const mg_rot_shape *sh)
{
    digest_log("ref", got, NULL, sh->heads * sh->rows * sh->n);
    return compare_rotated(got, got_angle, ref, ref_angle, NULL, NULL, sh);
}

mg_err mg_compare_rotated_f32f32(const float *got, const float *got_angle, const float *ref,
                                 const float *ref_angle, const mg_rot_shape *sh)
{
    digest_log("gpu", got, ref, sh->heads * sh->rows * sh->n);
    return compare_rotated(got, got_angle, NULL, NULL, ref, ref_angle, sh);
}

/* Wrapped differences: max |d| and the sum of d², d = got - ref wrapped
 * into [-π, π]; the norm is the fixed MG_ANGLE_SCALE per entry. */
static mg_err compare_angle(const float *got, const double *ref64, const float *ref32, size_t n)
{
    cmp_acc a = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        const double r = ref64 ? ref64[i] : (double)ref32[i];
        const double d = remainder((double)got[i] - r, 6.283185307179586);
        acc_add(&a, d, 0.0);
    }
    return finish(a.max_abs, a.d2, MG_ANGLE_SCALE * MG_ANGLE_SCALE * (double)n, n, a.nf);
}

mg_err mg_compare_angle_f32(const float *got, const double *ref, size_t n)
{
    digest_log("ref", got, NULL, n);
    return compare_angle(got, ref, NULL, n);
}

mg_err mg_compare_angle_f32f32(const float *got, const float *ref, size_t n)
{
    digest_log("gpu", got, ref, n);
    return compare_angle(got, NULL, ref, n);
}
