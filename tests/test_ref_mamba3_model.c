/* test_ref_mamba3_model.c: groups 5 and 6 of the test_ref_mamba3 program
 * (test_ref_mamba3.c): continuation across calls, and central finite
 * differences on every parameter, the input and every initial state: a few
 * single entries per tensor, and directional derivatives along random
 * directions over the whole tensor (every entry at once). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_ref_mamba3.h"
#include "mg_rng.h"
#include "ref_mamba3_cases.h"
#include "tap.h"

/* ------------------------------------------------------------------ */
/* 5. continuation                                                     */

/* Copies tokens [t0, t0+len) of u ([B][T][I]). */
static float *u_slice(const mcase *c, int t0, int len)
{
    float *x = falloc((size_t)c->B * len * c->I);
    for (int b = 0; b < c->B; b++)
        memcpy(x + (size_t)b * len * c->I, c->u + ((size_t)b * c->T + t0) * c->I,
               (size_t)len * c->I * sizeof *x);
    return x;
}
static double *d_slice(const double *src, int B, int T, size_t W, int t0, int len)
{
    double *x = dalloc((size_t)B * len * W);
    for (int b = 0; b < B; b++)
        memcpy(x + (size_t)b * len * W, src + ((size_t)b * T + t0) * W,
               (size_t)len * W * sizeof *x);
    return x;
}

void test_continuation(void)
{
    mcase c;
    if (!mcase_make(&c, "cont",
                    dims_of(6, 2, 4, 8, 2, 2, 0.5, 3, MG_M3_A_HEAVY_TAIL, 1, 1e-4),
                    2, 11, 99)) {
        tap_ok(0, "continuation: setup");
        return;
    }
    const size_t D = (size_t)c.d.d_model;
    /* one call */
    double *out = dalloc(c.nout), *s = dalloc(c.nS), *k = dalloc(c.nK),
           *v = dalloc(c.nV), *a = dalloc(c.nA);
    memcpy(s, c.s0, c.nS * sizeof *s);
    memcpy(k, c.k0, c.nK * sizeof *k);
    memcpy(v, c.v0, c.nV * sizeof *v);
    memcpy(a, c.a0, c.nA * sizeof *a);
    mg_status st = mg_ref_mamba3_forward(&c.d, &c.l, c.w, c.B, c.T, c.u, out, s, k, v, a);
    /* two calls: 4 + 7 tokens */
    int T1 = 4, T2 = c.T - T1;
    double *s2 = dalloc(c.nS), *k2 = dalloc(c.nK), *v2 = dalloc(c.nV), *a2 = dalloc(c.nA);
    memcpy(s2, c.s0, c.nS * sizeof *s2);
    memcpy(k2, c.k0, c.nK * sizeof *k2);
    memcpy(v2, c.v0, c.nV * sizeof *v2);
    memcpy(a2, c.a0, c.nA * sizeof *a2);
    float *u1 = u_slice(&c, 0, T1), *u2 = u_slice(&c, T1, T2);
    double *o1 = dalloc((size_t)c.B * T1 * D), *o2 = dalloc((size_t)c.B * T2 * D);
    /* keep the mid state for the backward chain */
    double *sm = dalloc(c.nS), *km = dalloc(c.nK), *vm = dalloc(c.nV), *am = dalloc(c.nA);
    if (st == MG_OK)
        st = mg_ref_mamba3_forward(&c.d, &c.l, c.w, c.B, T1, u1, o1, s2, k2, v2, a2);
    memcpy(sm, s2, c.nS * sizeof *sm);
    memcpy(km, k2, c.nK * sizeof *km);
    memcpy(vm, v2, c.nV * sizeof *vm);
    memcpy(am, a2, c.nA * sizeof *am);
    if (st == MG_OK)
        st = mg_ref_mamba3_forward(&c.d, &c.l, c.w, c.B, T2, u2, o2, s2, k2, v2, a2);
    double *o12 = dalloc(c.nout);
    for (int b = 0; b < c.B; b++) {
        memcpy(o12 + (size_t)b * c.T * D, o1 + (size_t)b * T1 * D, T1 * D * sizeof *o12);
        memcpy(o12 + ((size_t)b * c.T + T1) * D, o2 + (size_t)b * T2 * D,
               T2 * D * sizeof *o12);
    }
    double e = fmax(fmax(rel_err(o12, out, c.nout), rel_err(s2, s, c.nS)),
                    fmax(fmax(rel_err(k2, k, c.nK), rel_err(v2, v, c.nV)),
                         rel_err(a2, a, c.nA)));
    tap_ok(st == MG_OK && e < 1e-14,
           "forward: two calls (4 + 7 tokens, state carried) == one call: %.1e", e);
    /* zero-length call leaves the state as it is */
    memcpy(s2, s, c.nS * sizeof *s2);
    st = mg_ref_mamba3_forward(&c.d, &c.l, c.w, c.B, 0, NULL, NULL, s2, k2, v2, a2);
    tap_ok(st == MG_OK && rel_err(s2, s, c.nS) == 0, "forward: seqlen 0 keeps the state");

    /* backward: one call vs the chain call 2 -> call 1 */
    double *g = dalloc(c.l.total), *du = dalloc(c.nu), *gs = dalloc(c.nS),
           *gk = dalloc(c.nK), *gv = dalloc(c.nV), *ga = dalloc(c.nA);
    double *outb = dalloc(c.nout);
    st = mg_ref_mamba3_backward(&c.d, &c.l, c.w, c.B, c.T, c.u, c.s0, c.k0, c.v0,
                                c.a0, c.dout, c.wS, c.wK, c.wV, c.wA, outb, g, du,
                                gs, gk, gv, ga);
    tap_ok(st == MG_OK && rel_err(outb, out, c.nout) == 0,
           "backward's forward output == forward");
    /* the f64 entry points on the widened blob and input: the same numbers */
    {
        double *wb = dalloc(c.l.total), *ub = dalloc(c.nu), *o64 = dalloc(c.nout),
               *g64 = dalloc(c.l.total), *du64 = dalloc(c.nu);
        for (size_t i = 0; i < c.l.total; i++) wb[i] = c.w[i];
        for (size_t i = 0; i < c.nu; i++) ub[i] = c.u[i];
        mg_status r1 = mg_ref_mamba3_forward_f64(&c.d, &c.l, wb, c.B, c.T, ub, o64,
                                                 NULL, NULL, NULL, NULL);
        double *o32 = dalloc(c.nout);
        mg_status r2 = mg_ref_mamba3_forward(&c.d, &c.l, c.w, c.B, c.T, c.u, o32,
                                             NULL, NULL, NULL, NULL);
        mg_status r3 = mg_ref_mamba3_backward_f64(
            &c.d, &c.l, wb, c.B, c.T, ub, c.s0, c.k0, c.v0, c.a0, c.dout, c.wS,
            c.wK, c.wV, c.wA, NULL, g64, du64, NULL, NULL, NULL, NULL);
        tap_ok(r1 == MG_OK && r2 == MG_OK && r3 == MG_OK &&
                   rel_err(o64, o32, c.nout) == 0 &&
                   rel_err(g64, g, c.l.total) == 0 && rel_err(du64, du, c.nu) == 0,
               "f64 entry points == f32 entry points on the same values");
        free(wb); free(ub); free(o64); free(g64); free(du64); free(o32);
    }
    double *g1 = dalloc(c.l.total), *g2 = dalloc(c.l.total);
    double *du1 = dalloc((size_t)c.B * T1 * c.I), *du2 = dalloc((size_t)c.B * T2 * c.I);
    double *ms = dalloc(c.nS), *mk = dalloc(c.nK), *mv = dalloc(c.nV), *ma = dalloc(c.nA);
    double *gs1 = dalloc(c.nS), *gk1 = dalloc(c.nK), *gv1 = dalloc(c.nV), *ga1 = dalloc(c.nA);
    double *dout1 = d_slice(c.dout, c.B, c.T, D, 0, T1),
           *dout2 = d_slice(c.dout, c.B, c.T, D, T1, T2);
    mg_status st2 = mg_ref_mamba3_backward(&c.d, &c.l, c.w, c.B, T2, u2, sm, km, vm,
                                           am, dout2, c.wS, c.wK, c.wV, c.wA, NULL,
                                           g2, du2, ms, mk, mv, ma);
    if (st2 == MG_OK)
        st2 = mg_ref_mamba3_backward(&c.d, &c.l, c.w, c.B, T1, u1, c.s0, c.k0, c.v0,
                                     c.a0, dout1, ms, mk, mv, ma, NULL, g1, du1,
                                     gs1, gk1, gv1, ga1);
    for (size_t i = 0; i < c.l.total; i++) g1[i] += g2[i];
    double *du12 = dalloc(c.nu);
    for (int b = 0; b < c.B; b++) {
        memcpy(du12 + (size_t)b * c.T * c.I, du1 + (size_t)b * T1 * c.I,
               T1 * c.I * sizeof *du12);
        memcpy(du12 + ((size_t)b * c.T + T1) * c.I, du2 + (size_t)b * T2 * c.I,
               T2 * c.I * sizeof *du12);
    }
    e = fmax(fmax(rel_err(g1, g, c.l.total), rel_err(du12, du, c.nu)),
             fmax(fmax(rel_err(gs1, gs, c.nS), rel_err(gk1, gk, c.nK)),
                  fmax(rel_err(gv1, gv, c.nV), rel_err(ga1, ga, c.nA))));
    tap_ok(st2 == MG_OK && e < 1e-12,
           "backward chained over two calls (final-state grads in) == one call: %.1e", e);

    free(out); free(s); free(k); free(v); free(a); free(s2); free(k2); free(v2);
    free(a2); free(u1); free(u2); free(o1); free(o2); free(o12); free(sm); free(km);
    free(vm); free(am); free(g); free(du); free(gs); free(gk); free(gv); free(ga);
    free(outb); free(g1); free(g2); free(du1); free(du2); free(ms); free(mk);
    free(mv); free(ma); free(gs1); free(gk1); free(gv1); free(ga1); free(dout1);
    free(dout2); free(du12);
    mcase_free(&c);
}

/* ------------------------------------------------------------------ */
/* 6. finite differences                                               */

/* Steps: h1 = 2^-13, h2 = 2^-14, Richardson: (4 D(h2) - D(h1)) / 3, error
 * O(h^4). (Steps near 2^-6 already cross the 2pi wrap of a final angle in
 * some entries, so the loss has large higher derivatives: at 2^-10 the
 * extrapolated error was ~5e-8, at 2^-13 it is ~1e-10; the rounding noise
 * of the f64 loss, ~1e-16 * |loss terms| / h, stays below 1e-10.) f32
 * entries are first rounded to a multiple of 2^-20 (|x| < 8 here), so that
 * x +- h is exact in f32 and the step is the one intended. */
static const double FD_H1 = 1.0 / 8192.0;

static float round20(float x) { return (float)(ldexp(nearbyint(ldexp((double)x, 20)), -20)); }

/* Sets the entry under test: an f32 one (PF) or an f64 one (PD). */
static void fd_set(float *pf, double *pd, double v)
{
    if (pf)
        *pf = (float)v;
    else
        *pd = v;
}

/* The Richardson-extrapolated central difference of the loss in the f32
 * entry PF or else the f64 entry PD (left as it was). */
static double fd_entry(const mcase *c, float *pf, double *pd)
{
    double x0 = pf ? (double)*pf : *pd, r[2];
    for (int i = 0; i < 2; i++) {
        double h = FD_H1 / (double)(1 << i);
        fd_set(pf, pd, x0 + h);
        double lp = mcase_loss(c);
        fd_set(pf, pd, x0 - h);
        double lm = mcase_loss(c);
        r[i] = (lp - lm) / (2.0 * h);
    }
    fd_set(pf, pd, x0);
    return (4.0 * r[1] - r[0]) / 3.0;
}
static double fd_float(const mcase *c, float *p) { return fd_entry(c, p, NULL); }
static double fd_double(const mcase *c, double *p) { return fd_entry(c, NULL, p); }

/* Error of one entry: |analytic - fd| / max(|analytic|, |fd|, floor),
 * floor = 1e-2 * the RMS of all analytic parameter gradients of the case:
 * entries whose gradient is tiny against the rest are held to an absolute
 * accuracy of FD_TOL * floor = 1e-10 * RMS, which is about the rounding
 * noise of the f64 loss difference (~1e-16 * |loss| / h). */
static double g_err(double ga, double gf, double floor_)
{
    double s = fmax(fmax(fabs(ga), fabs(gf)), floor_);
    return fabs(ga - gf) / s;
}

#define FD_TOL 1e-8
#define MAX_PICK 12

/* entries to test in a tensor of numel n: first, last, and random ones;
 * for in_proj.weight one row in each section z|x|B|C|dd_dt|dd_A|trap|angles */
static int pick(const mcase *c, const mg_m3_param *p, mg_rng *r, size_t *idx)
{
    int m = 0;
    if (!strcmp(p->key, "in_proj_w")) {
        const mg_m3_dims *d = &c->d;
        size_t E = (size_t)d->d_inner, GN = (size_t)d->ngroups * d->d_state,
               H = (size_t)d->nheads, S = (size_t)d->n_angles, Dm = (size_t)d->d_model;
        size_t starts[8] = {0, E, 2 * E, 2 * E + GN, 2 * E + 2 * GN,
                            2 * E + 2 * GN + H, 2 * E + 2 * GN + 2 * H,
                            2 * E + 2 * GN + 3 * H};
        size_t lens[8] = {E, E, GN, GN, H, H, H, S};
        for (int s = 0; s < 8; s++) {
            if (lens[s] == 0) continue;
            size_t row = starts[s] + (size_t)(mg_rng_uniform(r) * (double)lens[s]);
            idx[m++] = row * Dm + (size_t)(mg_rng_uniform(r) * (double)Dm);
        }
        /* the last section again (G > 1 / S > 1: the last row) */
        idx[m++] = p->numel - 1;
        return m;
    }
    idx[m++] = 0;
    if (p->numel > 1) idx[m++] = p->numel - 1;
    for (int i = 0; i < 3 && (size_t)m < p->numel; i++) {
        size_t j = (size_t)(mg_rng_uniform(r) * (double)p->numel);
        int dup = 0;
        for (int k = 0; k < m; k++) dup |= idx[k] == j;
        if (!dup) idx[m++] = j;
    }
    return m;
}

/* ---- directional derivatives ------------------------------------------
 * The loss through the f64 entry point (blob wb, input ub: c's f32 values
 * widened, so the analytic gradient of the f32 entry point is the gradient
 * here), the initial states of c. A tensor x (inside wb, ub or one of c's
 * states) is moved along a direction v over all its entries: the
 * Richardson-extrapolated central difference of L(x + t v) at t = 0
 * against <g, v>, v ~ N(0, 1) per entry (every entry moves by a few steps
 * at most). Two step pairs: FD_H1, FD_H1/2 and FD_H1/4, FD_H1/8; a
 * direction's error is the smaller of the two: a direction moves every
 * token's dd_A at once, and the larger steps can cross the a_floor clamp's
 * kink of case E (one direction there is off by 3.5e-8 with them), while
 * the smaller ones alone carry more rounding noise (up to 3e-8). A wrong
 * gradient is wrong at both. */
#define N_DIRS 6

typedef struct dctx {
    const mcase *c;
    double *wb, *ub;
    double *out, *s, *k, *v, *a;   /* scratch */
} dctx;

static double loss64(dctx *x)
{
    const mcase *c = x->c;
    memcpy(x->s, c->s0, c->nS * sizeof *x->s);
    memcpy(x->k, c->k0, c->nK * sizeof *x->k);
    memcpy(x->v, c->v0, c->nV * sizeof *x->v);
    memcpy(x->a, c->a0, c->nA * sizeof *x->a);
    mg_status st = mg_ref_mamba3_forward_f64(&c->d, &c->l, x->wb, c->B, c->T, x->ub, x->out, x->s, x->k,
                                             x->v, x->a);
    return st == MG_OK ? dot(x->out, c->dout, c->nout) + dot(x->s, c->wS, c->nS) +
                             dot(x->k, c->wK, c->nK) + dot(x->v, c->wV, c->nV) + dot(x->a, c->wA, c->nA)
                       : NAN;
}

/* d/dt L(x + t dir) at 0 with steps h1, h1/2; x[0..n) left as it was. */
static double fd_dir(dctx *c, double *x, const double *dir, size_t n, double h1)
{
    double *x0 = dalloc(n), r[2];
    memcpy(x0, x, n * sizeof *x0);
    for (int i = 0; i < 2; i++) {
        double h = h1 / (double)(1 << i), lp, lm;
        for (size_t j = 0; j < n; j++) x[j] = x0[j] + h * dir[j];
        lp = loss64(c);
        for (size_t j = 0; j < n; j++) x[j] = x0[j] - h * dir[j];
        lm = loss64(c);
        r[i] = (lp - lm) / (2.0 * h);
    }
    memcpy(x, x0, n * sizeof *x0);
    free(x0);
    return (4.0 * r[1] - r[0]) / 3.0;
}

/* The finite differences along N_DIRS random directions over all of x:
 * fd[k][2] (the two step pairs) and the directions (dirs, [N_DIRS][n]) for
 * dir_err. */
static void dir_fds(dctx *c, mg_rng *r, double *x, size_t n, double *dirs, double (*fd)[2])
{
    for (int k = 0; k < N_DIRS; k++) {
        double *dir = dirs + (size_t)k * n;
        for (size_t j = 0; j < n; j++) dir[j] = mg_rng_normal(r);
        fd[k][0] = fd_dir(c, x, dir, n, FD_H1);
        fd[k][1] = fd_dir(c, x, dir, n, FD_H1 / 4.0);
    }
}

/* Worst error of the analytic gradient g of x against the differences:
 * |<g, v> - fd| / max(|<g, v>|, |fd|, floor), floor = 1e-3 ||g|| (the size
 * of <g, v> for v ~ N(0, I)) and at least the case's floor fl per entry. */
static double dir_err(const double *g, size_t n, const double *dirs, double (*fd)[2], double fl)
{
    double worst = 0.0, floor_ = fmax(1e-3 * sqrt(dot(g, g, n)), fl);
    for (int k = 0; k < N_DIRS; k++) {
        double gv = dot(g, dirs + (size_t)k * n, n);
        double e = fmin(g_err(gv, fd[k][0], floor_), g_err(gv, fd[k][1], floor_));
        if (!(e <= worst)) worst = e;   /* NaN sticks */
    }
    return worst;
}

/* One tensor: the directional check, then the same directions against the
 * gradient with its largest entry off by a relative 1e-5, which must fail
 * (the check sees a single wrong entry); counts the caught ones. */
static void dir_tensor(dctx *c, mg_rng *r, const char *label, const char *name, double *x, const double *g,
                       size_t n, double fl, int *caught, int *tried)
{
    double *dirs = dalloc((size_t)N_DIRS * n), fd[N_DIRS][2];
    dir_fds(c, r, x, n, dirs, fd);
    double e = dir_err(g, n, dirs, fd, fl), gn = sqrt(dot(g, g, n));
    if (!tap_ok(e < FD_TOL && gn > 0, "%s: d/d %s along %d random directions over all %zu entries, max err %.1e "
                                      "(|g| %.2g)", label, name, N_DIRS, n, e, gn))
        for (int k = 0; k < N_DIRS; k++)
            tap_diag("direction %d: <g, v> %.12e fd %.12e / %.12e", k, dot(g, dirs + (size_t)k * n, n), fd[k][0],
                     fd[k][1]);
    double *gw = dalloc(n);
    memcpy(gw, g, n * sizeof *gw);
    size_t jm = 0;
    for (size_t j = 1; j < n; j++)
        if (fabs(gw[j]) > fabs(gw[jm])) jm = j;
    gw[jm] *= 1.0 + 1e-5;
    double ew = dir_err(gw, n, dirs, fd, fl);
    ++*tried;
    if (ew >= FD_TOL) ++*caught;
    else tap_diag("%s: %s with entry %zu off by 1e-5 relative passes (max err %.1e)", label, name, jm, ew);
    free(gw);
    free(dirs);
}

static void fd_case(const char *label, mg_m3_dims d, unsigned long long seed)
{
    mcase c;
    if (!mcase_make(&c, label, d, 2, 5, seed)) {
        tap_ok(0, "%s: setup", label);
        return;
    }
    mg_rng r;
    mg_rng_seed(&r, seed + 5);
    size_t np = 0;
    mg_ref_mamba3_params(&c.d, &c.l, NULL, 0, &np);
    mg_m3_param *ps = calloc(np, sizeof *ps);
    mg_ref_mamba3_params(&c.d, &c.l, ps, np, &np);
    /* choose the entries, round them (and the tested inputs) */
    size_t (*idx)[MAX_PICK] = calloc(np, sizeof *idx);
    int *cnt = calloc(np, sizeof *cnt);
    for (size_t i = 0; i < np; i++) {
        cnt[i] = pick(&c, &ps[i], &r, idx[i]);
        for (int j = 0; j < cnt[i]; j++) {
            float *x = c.w + ps[i].offset + idx[i][j];
            *x = round20(*x);
        }
    }
    size_t ui[5];
    int nui = 0;
    ui[nui++] = 0;
    ui[nui++] = c.nu - 1;
    for (int i = 0; i < 3; i++) ui[nui++] = (size_t)(mg_rng_uniform(&r) * (double)c.nu);
    for (int i = 0; i < nui; i++) c.u[ui[i]] = round20(c.u[ui[i]]);

    double *g = dalloc(c.l.total), *du = dalloc(c.nu), *gs = dalloc(c.nS),
           *gk = dalloc(c.nK), *gv = dalloc(c.nV), *ga = dalloc(c.nA);
    mg_status st = mg_ref_mamba3_backward(&c.d, &c.l, c.w, c.B, c.T, c.u, c.s0,
                                          c.k0, c.v0, c.a0, c.dout, c.wS, c.wK,
                                          c.wV, c.wA, NULL, g, du, gs, gk, gv, ga);
    if (st != MG_OK) {
        tap_ok(0, "%s: backward runs (%s)", label, mg_last_error());
        goto out;
    }
    double rms = sqrt(dot(g, g, c.l.total) / (double)c.l.total);
    double fl = 1e-2 * rms;
    double worst_all = 0.0;
    for (size_t i = 0; i < np; i++) {
        double worst = 0.0, gmax = 0.0;
        for (int j = 0; j < cnt[i]; j++) {
            size_t o = ps[i].offset + idx[i][j];
            double gf = fd_float(&c, c.w + o);
            double e = g_err(g[o], gf, fl);
            if (!(e <= worst)) worst = e;
            gmax = fmax(gmax, fabs(g[o]));
            if (!(e < FD_TOL))
                tap_diag("%s[%zu]: analytic %.12e fd %.12e", ps[i].name, idx[i][j],
                         g[o], gf);
        }
        worst_all = fmax(worst_all, worst);
        tap_ok(worst < FD_TOL && gmax > 0, "%s: d/d %s, %d entries, max err %.1e (max |g| %.2g)",
               label, ps[i].name, cnt[i], worst, gmax);
    }
    /* the input */
    {
        double worst = 0.0;
        for (int j = 0; j < nui; j++) {
            double gf = fd_float(&c, c.u + ui[j]);
            double e = g_err(du[ui[j]], gf, fl);
            if (!(e <= worst)) worst = e;
            if (!(e < FD_TOL))
                tap_diag("u[%zu]: analytic %.12e fd %.12e", ui[j], du[ui[j]], gf);
        }
        tap_ok(worst < FD_TOL, "%s: d/d u, %d entries, max err %.1e", label, nui, worst);
    }
    /* the initial states (every layer: first, last and a middle entry of each) */
    struct { const char *name; double *x, *gx; size_t n; } sv[4] = {
        {"ssm0", c.s0, gs, c.nS}, {"k_prev0", c.k0, gk, c.nK},
        {"v_prev0", c.v0, gv, c.nV}, {"angle0", c.a0, ga, c.nA}};
    for (int k = 0; k < 4; k++) {
        if (sv[k].n == 0) continue;
        size_t per = sv[k].n / (size_t)c.d.n_layers;
        double worst = 0.0, gmax = 0.0;
        int n = 0;
        for (int li = 0; li < c.d.n_layers; li++) {
            size_t sel[3] = {li * per, li * per + per / 2 + 1, (li + 1) * per - 1};
            for (int j = 0; j < 3; j++) {
                size_t o = sel[j] < (li + 1) * per ? sel[j] : (li + 1) * per - 1;
                double gf = fd_double(&c, sv[k].x + o);
                double e = g_err(sv[k].gx[o], gf, fl);
                if (!(e <= worst)) worst = e;
                gmax = fmax(gmax, fabs(sv[k].gx[o]));
                if (!(e < FD_TOL))
                    tap_diag("%s[%zu]: analytic %.12e fd %.12e", sv[k].name, o,
                             sv[k].gx[o], gf);
                n++;
            }
        }
        tap_ok(worst < FD_TOL && gmax > 0, "%s: d/d %s, %d entries, max err %.1e",
               label, sv[k].name, n, worst);
    }
    tap_diag("%s: gradient RMS %.3g, worst parameter error %.2e", label, rms, worst_all);
    /* every entry of every tensor: directional derivatives */
    {
        dctx x = {&c, dalloc(c.l.total), dalloc(c.nu), dalloc(c.nout), dalloc(c.nS), dalloc(c.nK),
                  dalloc(c.nV), dalloc(c.nA)};
        for (size_t i = 0; i < c.l.total; i++) x.wb[i] = c.w[i];
        for (size_t i = 0; i < c.nu; i++) x.ub[i] = c.u[i];
        int caught = 0, tried = 0;
        for (size_t i = 0; i < np; i++)
            dir_tensor(&x, &r, label, ps[i].name, x.wb + ps[i].offset, g + ps[i].offset, ps[i].numel, fl,
                       &caught, &tried);
        dir_tensor(&x, &r, label, "u", x.ub, du, c.nu, fl, &caught, &tried);
        for (int k = 0; k < 4; k++)
            if (sv[k].n) dir_tensor(&x, &r, label, sv[k].name, sv[k].x, sv[k].gx, sv[k].n, fl, &caught, &tried);
        tap_ok(caught == tried, "%s: the directional checks are sensitive: a gradient with its largest entry "
                                "off by 1e-5 relative fails in %d of %d tensors", label, caught, tried);
        free(x.wb); free(x.ub); free(x.out); free(x.s); free(x.k); free(x.v); free(x.a);
    }
out:
    free(g); free(du); free(gs); free(gk); free(gv); free(ga);
    free(idx); free(cnt); free(ps);
    mcase_free(&c);
}

/* A deliberately wrong gradient must fail the per-entry FD check: on a
 * model case, one in_proj entry's analytic gradient off by a relative 1e-6
 * fails at FD_TOL, the true one passes. (The directional checks have their
 * own sensitivity test per case, in fd_case.) */
void test_fd_sensitivity(void)
{
    mcase c;
    if (!mcase_make(&c, "sens", dims_of(6, 2, 4, 8, 4, 1, 0.5, 0, MG_M3_A_HEAVY_TAIL, 1, 1e-4), 2, 5, 11)) {
        tap_ok(0, "FD sensitivity: setup");
        return;
    }
    const size_t o = c.l.layers[0].in_proj_w + 7;
    c.w[o] = round20(c.w[o]);
    double *g = dalloc(c.l.total);
    mg_status st = mg_ref_mamba3_backward(&c.d, &c.l, c.w, c.B, c.T, c.u, c.s0, c.k0, c.v0, c.a0, c.dout,
                                          c.wS, c.wK, c.wV, c.wA, NULL, g, NULL, NULL, NULL, NULL, NULL);
    double rms = sqrt(dot(g, g, c.l.total) / (double)c.l.total);
    double gf = fd_float(&c, c.w + o);
    double e_true = g_err(g[o], gf, 1e-2 * rms), e_wrong = g_err(g[o] * (1.0 + 1e-6), gf, 1e-2 * rms);
    tap_ok(st == MG_OK && e_true < FD_TOL && e_wrong > FD_TOL,
           "FD tolerance %.0e: the analytic in_proj gradient %.6g passes (err %.1e), off by 1e-6 relative it "
           "fails (err %.1e)", FD_TOL, g[o], e_true, e_wrong);
    free(g);
    mcase_free(&c);
}

void test_fd(void)
{
    /* D=6, L=2, E=8; (N, P, G, rope, input_dim, act, gate norm, a_floor) */
    fd_case("A heavy_tail gnorm rope0.5 G1 in0",
            dims_of(6, 2, 4, 8, 4, 1, 0.5, 0, MG_M3_A_HEAVY_TAIL, 1, 1e-4), 11);
    fd_case("B softplus nognorm rope1.0 G2 in3",
            dims_of(6, 2, 4, 8, 2, 2, 1.0, 3, MG_M3_A_SOFTPLUS, 0, 1e-4), 12);
    fd_case("C softplus gnorm rope0.5 G2 in5 N6",
            dims_of(6, 2, 6, 8, 2, 2, 0.5, 5, MG_M3_A_SOFTPLUS, 1, 1e-4), 13);
    fd_case("D heavy_tail nognorm rope1.0 G1 in0 N6",
            dims_of(6, 2, 6, 8, 4, 1, 1.0, 0, MG_M3_A_HEAVY_TAIL, 0, 1e-4), 14);
    /* a_floor = 1.15: heavy_tail act = 1 + v for v >= 0, so about half the
     * tokens are clamped (no gradient through the clamp) */
    fd_case("E heavy_tail clamp a_floor=1.15 gnorm rope1.0 G2 in4",
            dims_of(6, 2, 4, 8, 2, 2, 1.0, 4, MG_M3_A_HEAVY_TAIL, 1, 1.15), 15);
}
