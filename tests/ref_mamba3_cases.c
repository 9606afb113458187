/* ref_mamba3_cases.c: the helpers and model cases the test_ref_mamba3
 * program's files share (ref_mamba3_cases.h). */
#include "ref_mamba3_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}
double *dalloc(size_t n) { return zalloc(n, sizeof(double)); }
float *falloc(size_t n) { return zalloc(n, sizeof(float)); }
void fill_d(mg_rng *r, double *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mg_rng_uniform(r);
}
void fill_f(mg_rng *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * mg_rng_uniform(r));
}
/* max |a-b| / max(max|b|, tiny) */
double rel_err(const double *a, const double *b, size_t n)
{
    double m = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= m)) m = e; /* NaN sticks */
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    return m / (s > 1e-300 ? s : 1e-300);
}

mg_m3_dims dims_of(int D, int L, int N, int E, int P, int G,
                   double rope, int input_dim, mg_m3_a_act act,
                   int outproj_norm, double a_floor)
{
    mg_m3_dims d;
    memset(&d, 0, sizeof d);
    d.d_model = D;
    d.n_layers = L;
    d.d_state = N;
    d.d_inner = E;
    d.headdim = P;
    d.nheads = E / P;
    d.ngroups = G;
    d.n_angles = (int)floor(N * rope) / 2;
    d.input_dim = input_dim;
    d.norm_eps = 1e-5;
    d.a_floor = a_floor;
    d.a_activation = act;
    d.outproj_norm = outproj_norm != 0;
    return d;
}

/* ------------------------------------------------------------------ */
/* model cases shared by continuation and FD tests                     */

int mcase_make(mcase *c, const char *label, mg_m3_dims d, int B, int T,
               unsigned long long seed)
{
    memset(c, 0, sizeof *c);
    c->label = label;
    c->d = d;
    if (mg_ref_mamba3_layout(&c->d, &c->l) != MG_OK) return 0;
    c->w = falloc(c->l.total);
    if (mg_ref_mamba3_init(&c->d, &c->l, c->w, seed) != MG_OK) return 0;
    mg_rng r;
    mg_rng_seed(&r, seed * 1000003ULL + 17);
    /* larger steps than the init's dt in [1e-3, 1e-1], so that the SSM and
     * the angles weigh in the gradients: DT = softplus(U(-1.5, 0.5)) */
    for (int li = 0; li < d.n_layers; li++)
        fill_f(&r, c->w + c->l.layers[li].dt_bias, (size_t)d.nheads, -1.5, 0.5);
    c->B = B;
    c->T = T;
    c->I = d.input_dim > 0 ? (size_t)d.input_dim : (size_t)d.d_model;
    size_t L = (size_t)d.n_layers, H = (size_t)d.nheads;
    c->nu = (size_t)B * T * c->I;
    c->nout = (size_t)B * T * d.d_model;
    c->nS = L * B * H * d.headdim * d.d_state;
    c->nK = L * B * H * d.d_state;
    c->nV = L * B * H * d.headdim;
    c->nA = L * B * H * d.n_angles;
    c->u = falloc(c->nu);
    fill_f(&r, c->u, c->nu, -1.5, 1.5);
    c->s0 = dalloc(c->nS); c->k0 = dalloc(c->nK); c->v0 = dalloc(c->nV);
    c->a0 = dalloc(c->nA);
    fill_d(&r, c->s0, c->nS, -0.5, 0.5);
    fill_d(&r, c->k0, c->nK, -1.5, 1.5);
    fill_d(&r, c->v0, c->nV, -0.5, 0.5);
    fill_d(&r, c->a0, c->nA, 0.3, 6.0);
    c->dout = dalloc(c->nout);
    c->wS = dalloc(c->nS); c->wK = dalloc(c->nK); c->wV = dalloc(c->nV);
    c->wA = dalloc(c->nA);
    fill_d(&r, c->dout, c->nout, -1.0, 1.0);
    fill_d(&r, c->wS, c->nS, -0.5, 0.5);
    fill_d(&r, c->wK, c->nK, -0.5, 0.5);
    fill_d(&r, c->wV, c->nV, -0.5, 0.5);
    fill_d(&r, c->wA, c->nA, -0.5, 0.5);
    return 1;
}

void mcase_free(mcase *c)
{
    free(c->w); free(c->u); free(c->s0); free(c->k0); free(c->v0); free(c->a0);
    free(c->dout); free(c->wS); free(c->wK); free(c->wV); free(c->wA);
    mg_ref_mamba3_layout_free(&c->l);
}

double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* loss = <out, dout> + <final state, w*> from the initial state of c. */
double mcase_loss(const mcase *c)
{
    double *out = dalloc(c->nout), *s = dalloc(c->nS), *k = dalloc(c->nK),
           *v = dalloc(c->nV), *a = dalloc(c->nA);
    memcpy(s, c->s0, c->nS * sizeof *s);
    memcpy(k, c->k0, c->nK * sizeof *k);
    memcpy(v, c->v0, c->nV * sizeof *v);
    memcpy(a, c->a0, c->nA * sizeof *a);
    mg_status st = mg_ref_mamba3_forward(&c->d, &c->l, c->w, c->B, c->T, c->u,
                                         out, s, k, v, a);
    double L = st == MG_OK ? dot(out, c->dout, c->nout) + dot(s, c->wS, c->nS) +
                                 dot(k, c->wK, c->nK) + dot(v, c->wV, c->nV) +
                                 dot(a, c->wA, c->nA)
                           : NAN;
    free(out); free(s); free(k); free(v); free(a);
    return L;
}
