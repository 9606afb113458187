/* ref_seqs_arch.c: the two architectures behind one interface and the
 * test's own hand split of a call (ref_seqs_arch.h). */
#include "ref_seqs_arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

double *dz(size_t n)
{
    return tap_calloc(n, sizeof(double));
}

void fill(mg_rng *r, double *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * mg_rng_uniform(r);
}

double rel_diff(const double *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= num))
            num = isnan(e) ? INFINITY : e;
        den = fmax(den, fabs(b[i]));
    }
    return den > 0 ? num / den : num;
}

int same(const double *a, const double *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

size_t states_n(const arch *a, int nstr, int k)
{
    return (size_t)a->L * (size_t)nstr * a->per[k];
}

void states_new(const arch *a, int nstr, double **st, mg_rng *r, double lo, double hi)
{
    for (int k = 0; k < 4; k++) {
        st[k] = NULL;
        if (k < a->ns) {
            st[k] = dz(states_n(a, nstr, k));
            if (r)
                fill(r, st[k], states_n(a, nstr, k), lo, hi);
        }
    }
}

void states_free(const arch *a, double **st)
{
    for (int k = 0; k < a->ns; k++) {
        free(st[k]);
        st[k] = NULL;
    }
}

/* ------------------------------------------------------------ models */

static void widen(const float *wf, double *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = wf[i];
}

void arch_make_m1(arch *a, unsigned long long seed)
{
    memset(a, 0, sizeof *a);
    a->name = "mamba1";
    a->d1 = (mg_m1_dims){ .d_model = 4, .n_layers = 2, .d_state = 3, .d_inner = 8,
                          .d_conv = 4, .dt_rank = 2, .input_dim = 3, .norm_eps = 1e-5 };
    if (mg_ref_mamba1_layout(&a->d1, &a->l1) != MG_OK)
        exit(2);
    a->L = 2;
    a->ns = 2;
    a->per[0] = 8 * 3;   /* conv [E][K-1] */
    a->per[1] = 8 * 3;   /* ssm [E][N] */
    a->I = 3;
    a->D = 4;
    a->nblob = a->l1.total;
    float *wf = tap_calloc(a->nblob, sizeof *wf);
    mg_ref_mamba1_init(&a->d1, &a->l1, wf, seed);
    a->w = dz(a->nblob);
    widen(wf, a->w, a->nblob);
    free(wf);
    mg_rng r;
    mg_rng_seed(&r, seed + 1);
    /* dt of order 1: the init's [1e-3, 1e-1] would let the states fade
     * so little that a wrong carry could hide under a tolerance, and a
     * start would change little. */
    for (int l = 0; l < a->L; l++)
        fill(&r, a->w + a->l1.layers[l].dt_proj_b, 8, -1.0, 1.0);
}

void arch_make_m3(arch *a, unsigned long long seed)
{
    memset(a, 0, sizeof *a);
    a->name = "mamba3";
    a->mamba3 = 1;
    mg_m3_dims d;
    memset(&d, 0, sizeof d);
    d.d_model = 6;
    d.n_layers = 2;
    d.d_state = 4;
    d.d_inner = 8;
    d.headdim = 2;
    d.nheads = 4;
    d.ngroups = 2;
    d.n_angles = 2;
    d.input_dim = 3;
    d.norm_eps = 1e-5;
    d.a_floor = 1e-4;
    d.a_activation = MG_M3_A_SOFTPLUS;
    a->d3 = d;
    if (mg_ref_mamba3_layout(&a->d3, &a->l3) != MG_OK)
        exit(2);
    a->L = 2;
    a->ns = 4;
    a->per[0] = 4 * 2 * 4;   /* ssm [H][P][N] */
    a->per[1] = 4 * 4;       /* k_prev [H][N] */
    a->per[2] = 4 * 2;       /* v_prev [H][P] */
    a->per[3] = 4 * 2;       /* angle [H][S] */
    a->I = 3;
    a->D = 6;
    a->nblob = a->l3.total;
    a->has_dT = 1;
    float *wf = tap_calloc(a->nblob, sizeof *wf);
    mg_ref_mamba3_init(&a->d3, &a->l3, wf, seed);
    a->w = dz(a->nblob);
    widen(wf, a->w, a->nblob);
    free(wf);
    mg_rng r;
    mg_rng_seed(&r, seed + 1);
    /* DT = softplus(U(-1.5, 0.5)), as the FD cases of test_ref_mamba3 */
    for (int l = 0; l < a->L; l++)
        fill(&r, a->w + a->l3.layers[l].dt_bias, 4, -1.5, 0.5);
}

void arch_free(arch *a)
{
    free(a->w);
    if (a->mamba3)
        mg_ref_mamba3_layout_free(&a->l3);
    else
        mg_ref_mamba1_layout_free(&a->l1);
}

/* ------------------------------------------------------------ entry points */

mg_status arch_fwd(const arch *a, int B, int T, const double *u, double *out,
                   double **st, const mg_ref_seqs *o)
{
    if (!a->mamba3)
        return o ? mg_ref_mamba1_forward_f64_ex(&a->d1, &a->l1, a->w, B, T, u, out,
                                                st[0], st[1], o)
                 : mg_ref_mamba1_forward_f64(&a->d1, &a->l1, a->w, B, T, u, out,
                                             st[0], st[1]);
    return o ? mg_ref_mamba3_forward_f64_ex(&a->d3, &a->l3, a->w, B, T, u, out,
                                            st[0], st[1], st[2], st[3], o)
             : mg_ref_mamba3_forward_f64(&a->d3, &a->l3, a->w, B, T, u, out,
                                         st[0], st[1], st[2], st[3]);
}

mg_status arch_bwd(const arch *a, int B, int T, const double *u, double **st0,
                   const double *dout, double **dT, double *out, double *dblob,
                   double *du, double **d0, const mg_ref_seqs *o)
{
    if (!a->mamba3)
        return o ? mg_ref_mamba1_backward_f64_ex(&a->d1, &a->l1, a->w, B, T, u, st0[0],
                                                 st0[1], dout, dblob, du, d0[0], d0[1], o)
                 : mg_ref_mamba1_backward_f64(&a->d1, &a->l1, a->w, B, T, u, st0[0],
                                              st0[1], dout, dblob, du, d0[0], d0[1]);
    return o ? mg_ref_mamba3_backward_f64_ex(&a->d3, &a->l3, a->w, B, T, u, st0[0], st0[1],
                                             st0[2], st0[3], dout, dT[0], dT[1], dT[2],
                                             dT[3], out, dblob, du, d0[0], d0[1], d0[2],
                                             d0[3], o)
             : mg_ref_mamba3_backward_f64(&a->d3, &a->l3, a->w, B, T, u, st0[0], st0[1],
                                          st0[2], st0[3], dout, dT[0], dT[1], dT[2],
                                          dT[3], out, dblob, du, d0[0], d0[1], d0[2],
                                          d0[3]);
}

mg_status arch_fwd_f32(const arch *a, const float *wf, int B, int T, const float *uf,
                       double *out, double **st, const mg_ref_seqs *o)
{
    if (!a->mamba3)
        return mg_ref_mamba1_forward_ex(&a->d1, &a->l1, wf, B, T, uf, out, st[0], st[1], o);
    return mg_ref_mamba3_forward_ex(&a->d3, &a->l3, wf, B, T, uf, out, st[0], st[1],
                                    st[2], st[3], o);
}

mg_status arch_bwd_f32(const arch *a, const float *wf, int B, int T, const float *uf,
                       double **st0, const double *dout, double **dT, double *out,
                       double *dblob, double *du, double **d0, const mg_ref_seqs *o)
{
    if (!a->mamba3)
        return mg_ref_mamba1_backward_ex(&a->d1, &a->l1, wf, B, T, uf, st0[0], st0[1],
                                         dout, dblob, du, d0[0], d0[1], o);
    return mg_ref_mamba3_backward_ex(&a->d3, &a->l3, wf, B, T, uf, st0[0], st0[1], st0[2],
                                     st0[3], dout, dT[0], dT[1], dT[2], dT[3], out, dblob,
                                     du, d0[0], d0[1], d0[2], d0[3], o);
}

/* ------------------------------------------------------------ hand split */

/* Stream s's state k between the [L][nstr][per] layout and [L][per]. */
static void take(const arch *a, double *dst, const double *src, int nstr, int s, int k)
{
    for (int l = 0; l < a->L; l++)
        for (size_t i = 0; i < a->per[k]; i++)
            dst[(size_t)l * a->per[k] + i] =
                src ? src[((size_t)l * nstr + s) * a->per[k] + i] : 0.0;
}

static void give(const arch *a, double *dst, const double *src, int nstr, int s, int k)
{
    if (!dst)
        return;
    for (int l = 0; l < a->L; l++)
        for (size_t i = 0; i < a->per[k]; i++)
            dst[((size_t)l * nstr + s) * a->per[k] + i] = src[(size_t)l * a->per[k] + i];
}

/* End of the piece of s that begins at t: the next start, or the end. */
static int piece_end(const hstream *s, const unsigned char *start, int t)
{
    int e = t + 1;
    while (e < s->len && !(start && start[s->row + (size_t)e]))
        e++;
    return e;
}

void hand_fwd(const arch *a, int nstr, const hstream *s, const unsigned char *start,
              const double *u, double *out, double **st)
{
    double *loc[4] = { NULL };
    for (int k = 0; k < a->ns; k++)
        loc[k] = dz((size_t)a->L * a->per[k]);
    for (int i = 0; i < nstr; i++) {
        for (int k = 0; k < a->ns; k++)
            take(a, loc[k], st[k], nstr, i, k);
        for (int t = 0; t < s[i].len;) {
            int e = piece_end(&s[i], start, t);
            if (start && start[s[i].row + (size_t)t])
                for (int k = 0; k < a->ns; k++)
                    memset(loc[k], 0, (size_t)a->L * a->per[k] * sizeof *loc[k]);
            size_t r = s[i].row + (size_t)t;
            if (arch_fwd(a, 1, e - t, u + r * a->I, out + r * a->D, loc, NULL) != MG_OK)
                tap_diag("hand split forward: %s", mg_last_error());
            t = e;
        }
        for (int k = 0; k < a->ns; k++)
            give(a, st[k], loc[k], nstr, i, k);
    }
    for (int k = 0; k < a->ns; k++)
        free(loc[k]);
}

void hand_bwd(const arch *a, int nstr, const hstream *s, const unsigned char *start,
              const double *u, double **st0, const double *dout, double **dT,
              double *out, double *dblob, double *du, double **d0)
{
    /* every piece's weight gradient, kept to be summed at the end */
    size_t maxp = 0;
    for (int i = 0; i < nstr; i++)
        maxp += (size_t)s[i].len;
    double *g = dz(maxp * a->nblob);
    size_t np = 0;
    double *l0[4] = { NULL }, *lT[4] = { NULL }, *ld[4] = { NULL };
    for (int k = 0; k < a->ns; k++) {
        l0[k] = dz((size_t)a->L * a->per[k]);
        lT[k] = dz((size_t)a->L * a->per[k]);
        ld[k] = dz((size_t)a->L * a->per[k]);
    }
    for (int i = 0; i < nstr; i++) {
        for (int k = 0; k < a->ns; k++) {
            take(a, l0[k], st0[k], nstr, i, k);
            take(a, lT[k], dT[k], nstr, i, k);
            memset(ld[k], 0, (size_t)a->L * a->per[k] * sizeof *ld[k]);
        }
        for (int t = 0; t < s[i].len;) {
            int e = piece_end(&s[i], start, t);
            int first = t == 0 && !(start && start[s[i].row]);
            int last = e == s[i].len;
            double *x0[4] = { NULL }, *xT[4] = { NULL }, *xd[4] = { NULL };
            for (int k = 0; k < a->ns; k++) {
                x0[k] = first && st0[k] ? l0[k] : NULL;
                xT[k] = last && dT[k] ? lT[k] : NULL;
                xd[k] = first && d0[k] ? ld[k] : NULL;
            }
            size_t r = s[i].row + (size_t)t;
            if (arch_bwd(a, 1, e - t, u + r * a->I, x0, dout + r * a->D, xT,
                         out ? out + r * a->D : NULL, g + np * a->nblob,
                         du ? du + r * a->I : NULL, xd, NULL) != MG_OK)
                tap_diag("hand split backward: %s", mg_last_error());
            np++;
            t = e;
        }
        for (int k = 0; k < a->ns; k++)
            give(a, d0[k], ld[k], nstr, i, k);
    }
    for (size_t j = 0; j < a->nblob; j++) {
        double acc = 0.0;
        for (size_t p = np; p-- > 0;)
            acc += g[p * a->nblob + j];
        dblob[j] = acc;
    }
    for (int k = 0; k < a->ns; k++) {
        free(l0[k]);
        free(lT[k]);
        free(ld[k]);
    }
    free(g);
}
