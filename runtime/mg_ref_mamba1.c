/* mg_ref_mamba1.c: the Mamba-1 reference path (doc/math.md, Mamba-1 and
 * Backbone sections). Plain C, runtime dims, everything in f64; the step
 * recurrence, not the chunked form. Forward and backward.
 *
 * Structure: one function runs a layer's forward (layer_fwd) and always
 * leaves its activations in an m1_act; with a state-history buffer it also
 * keeps every scan state. forward_all() runs the backbone with it, optionally
 * keeping every layer's input. The backward runs forward_all keeping the
 * layer inputs, then for each layer in reverse re-runs layer_fwd with the
 * state history on and backpropagates through it (layer_bwd). There is one
 * forward. */
#include "mg_ref_mamba1.h"
#include "mg_ref_seqs_impl.h"
#include "mg_rng.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ small math */

double mg_ref_softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static double silu(double x)
{
    return x * sigmoid(x);
}

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x) */
static double silu_grad(double x)
{
    double s = sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}

/* y[o] = (b ? b[o] : 0) + sum_i W[o][i] x[i]; W row-major [out][in]. */
static void linear(const double *x, const double *W, const double *b,
                   int out, int in, double *y)
{
    for (int o = 0; o < out; o++) {
        const double *wr = W + (size_t)o * in;
        double acc = 0.0;
        for (int i = 0; i < in; i++)
            acc += wr[i] * x[i];
        y[o] = (b ? b[o] : 0.0) + acc;
    }
}

/* ------------------------------------------------------------ dims, layout */

static mg_status check_dims(const mg_m1_dims *d, const char *fn)
{
    if (d == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: dims is NULL", fn);
#define POS(f) if (d->f <= 0) \
        return mg_fail(MG_ERR_INVALID_ARG, "%s: " #f " must be > 0 (got %d)", fn, d->f)
    POS(d_model);
    POS(n_layers);
    POS(d_state);
    POS(d_inner);
    POS(d_conv);
    POS(dt_rank);
#undef POS
    if (d->input_dim < 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: input_dim must be >= 0 (got %d)",
                       fn, d->input_dim);
    if (!(d->norm_eps > 0.0) || !isfinite(d->norm_eps))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: norm_eps must be finite and > 0 (got %g)",
                       fn, d->norm_eps);
    /* Keep every per-token row and per-layer tensor comfortably inside int
     * and size_t arithmetic. */
    const long long lim = 1LL << 24;
    if (d->d_model > lim || d->d_inner > lim || d->d_state > 4096 || d->d_conv > 4096
        || d->dt_rank > lim || d->input_dim > lim || d->n_layers > 65536)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: dims out of range", fn);
    return MG_OK;
}

static size_t up64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}

mg_status mg_ref_mamba1_layout(const mg_m1_dims *d, mg_m1_layout *out)
{
    if (out == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_ref_mamba1_layout: out is NULL");
    memset(out, 0, sizeof *out);
    mg_status s = check_dims(d, "mg_ref_mamba1_layout");
    if (s != MG_OK)
        return s;
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner, N = (size_t)d->d_state;
    size_t K = (size_t)d->d_conv, R = (size_t)d->dt_rank, I = (size_t)d->input_dim;
    out->layers = calloc((size_t)d->n_layers, sizeof *out->layers);
    if (out->layers == NULL)
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mg_ref_mamba1_layout: out of memory");
    size_t o = 0;
#define PUT(dst, n) do { o = up64(o); (dst) = o; o += (n); } while (0)
    if (I > 0) {
        PUT(out->input_proj_w, D * I);
        PUT(out->input_proj_b, D);
    }
    for (int l = 0; l < d->n_layers; l++) {
        mg_m1_layer_off *L = &out->layers[l];
        PUT(L->norm_w, D);
        PUT(L->in_proj_w, 2 * E * D);
        PUT(L->conv_w, E * K);
        PUT(L->conv_b, E);
        PUT(L->x_proj_w, (R + 2 * N) * E);
        PUT(L->dt_proj_w, E * R);
        PUT(L->dt_proj_b, E);
        PUT(L->A_log, E * N);
        PUT(L->D, E);
        PUT(L->out_proj_w, D * E);
    }
    PUT(out->norm_f_w, D);
#undef PUT
    out->total = up64(o);
    return MG_OK;
}

void mg_ref_mamba1_layout_free(mg_m1_layout *l)
{
    if (l == NULL)
        return;
    free(l->layers);
    l->layers = NULL;
}

/* The layout handed in must be the one of these dims. */
static mg_status check_layout(const mg_m1_dims *d, const mg_m1_layout *l, const char *fn)
{
    if (l == NULL || l->layers == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: layout is NULL or not computed", fn);
    mg_m1_layout ref;
    mg_status s = mg_ref_mamba1_layout(d, &ref);
    if (s != MG_OK)
        return s;
    int same = ref.total == l->total && ref.norm_f_w == l->norm_f_w
               && (d->input_dim == 0 || (ref.input_proj_w == l->input_proj_w
                                         && ref.input_proj_b == l->input_proj_b))
               && memcmp(ref.layers, l->layers,
                         (size_t)d->n_layers * sizeof *l->layers) == 0;
    mg_ref_mamba1_layout_free(&ref);
    if (!same)
        return mg_fail(MG_ERR_SIZE, "%s: the layout does not match the dims", fn);
    return MG_OK;
}

int mg_ref_mamba1_tensors(const mg_m1_dims *d, const mg_m1_layout *l,
                          mg_m1_tensor *out, int max)
{
    if (d == NULL || l == NULL || l->layers == NULL)
        return -1;
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner, N = (size_t)d->d_state;
    size_t K = (size_t)d->d_conv, R = (size_t)d->dt_rank, I = (size_t)d->input_dim;
    int n = 0;
#define ADD(lay, off, cnt, ...) do { \
        if (out && n < max) { \
            snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__); \
            out[n].offset = (off); out[n].numel = (cnt); out[n].layer = (lay); } \
        n++; } while (0)
    if (I > 0) {
        ADD(-1, l->input_proj_w, D * I, "backbone.input_proj.weight");
        ADD(-1, l->input_proj_b, D, "backbone.input_proj.bias");
    }
    for (int i = 0; i < d->n_layers; i++) {
        const mg_m1_layer_off *L = &l->layers[i];
        ADD(i, L->norm_w, D, "backbone.layers.%d.norm.weight", i);
        ADD(i, L->in_proj_w, 2 * E * D, "backbone.layers.%d.mixer.in_proj.weight", i);
        ADD(i, L->conv_w, E * K, "backbone.layers.%d.mixer.conv1d.weight", i);
        ADD(i, L->conv_b, E, "backbone.layers.%d.mixer.conv1d.bias", i);
        ADD(i, L->x_proj_w, (R + 2 * N) * E, "backbone.layers.%d.mixer.x_proj.weight", i);
        ADD(i, L->dt_proj_w, E * R, "backbone.layers.%d.mixer.dt_proj.weight", i);
        ADD(i, L->dt_proj_b, E, "backbone.layers.%d.mixer.dt_proj.bias", i);
        ADD(i, L->A_log, E * N, "backbone.layers.%d.mixer.A_log", i);
        ADD(i, L->D, E, "backbone.layers.%d.mixer.D", i);
        ADD(i, L->out_proj_w, D * E, "backbone.layers.%d.mixer.out_proj.weight", i);
    }
    ADD(-1, l->norm_f_w, D, "backbone.norm_f.weight");
#undef ADD
    return n;
}

/* ------------------------------------------------------------ init */

static void fill_u(mg_rng *r, float *x, size_t n, double lo, double hi)
{
    mg_rng_fill_uniform(r, x, n, (float)lo, (float)hi);
}

mg_status mg_ref_mamba1_init(const mg_m1_dims *d, const mg_m1_layout *l,
                             float *blob, unsigned long long seed)
{
    mg_status s = check_dims(d, "mg_ref_mamba1_init");
    if (s == MG_OK)
        s = check_layout(d, l, "mg_ref_mamba1_init");
    if (s != MG_OK)
        return s;
    if (blob == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_ref_mamba1_init: blob is NULL");
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner, N = (size_t)d->d_state;
    size_t K = (size_t)d->d_conv, R = (size_t)d->dt_rank, I = (size_t)d->input_dim;
    memset(blob, 0, l->total * sizeof *blob);
    mg_rng r;
    mg_rng_seed(&r, seed);
    if (I > 0) {
        double b = 1.0 / sqrt((double)I);
        fill_u(&r, blob + l->input_proj_w, D * I, -b, b);
        fill_u(&r, blob + l->input_proj_b, D, -b, b);
    }
    for (int i = 0; i < d->n_layers; i++) {
        const mg_m1_layer_off *L = &l->layers[i];
        fill_u(&r, blob + L->norm_w, D, 0.9, 1.1);
        double bd = 1.0 / sqrt((double)D), be = 1.0 / sqrt((double)E);
        double bk = 1.0 / sqrt((double)K), br = 1.0 / sqrt((double)R);
        fill_u(&r, blob + L->in_proj_w, 2 * E * D, -bd, bd);
        fill_u(&r, blob + L->conv_w, E * K, -bk, bk);
        fill_u(&r, blob + L->conv_b, E, -bk, bk);
        fill_u(&r, blob + L->x_proj_w, (R + 2 * N) * E, -be, be);
        fill_u(&r, blob + L->dt_proj_w, E * R, -br, br);
        for (size_t e = 0; e < E; e++) {
            /* dt = exp(U(log 1e-3, log 1e-1)); bias = softplus^-1(dt). */
            double dt = exp(log(1e-3) + (log(1e-1) - log(1e-3)) * mg_rng_uniform(&r));
            blob[L->dt_proj_b + e] = (float)(dt + log(-expm1(-dt)));
        }
        for (size_t e = 0; e < E; e++)
            for (size_t n = 0; n < N; n++)
                blob[L->A_log + e * N + n] =
                    (float)(log((double)(n + 1)) + 0.01 * (2.0 * mg_rng_uniform(&r) - 1.0));
        fill_u(&r, blob + L->D, E, 0.9, 1.1);
        fill_u(&r, blob + L->out_proj_w, D * E, -be, be);
    }
    fill_u(&r, blob + l->norm_f_w, D, 0.9, 1.1);
    return MG_OK;
}

/* ------------------------------------------------------------ sequence kernels */

void mg_ref_m1_conv(int T, int E, int K, const double *x, int ldx,
                    const double *w, const double *bias, double *state,
                    double *pre, double *xc)
{
    const int S = K - 1;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) {
                int j = t - S + k;
                double v = j >= 0 ? x[(size_t)j * ldx + e]
                           : (state ? state[(size_t)e * S + (j + S)] : 0.0);
                acc += w[(size_t)e * K + k] * v;
            }
            acc += bias[e];
            if (pre)
                pre[(size_t)t * E + e] = acc;
            xc[(size_t)t * E + e] = silu(acc);
        }
    }
    if (state == NULL)
        return;
    /* New state: inputs T-S .. T-1. Entry i reads old entry T+i > i when it
     * comes from the old state, so updating in increasing i is safe. */
    for (int e = 0; e < E; e++)
        for (int i = 0; i < S; i++) {
            int j = T - S + i;
            state[(size_t)e * S + i] = j >= 0 ? x[(size_t)j * ldx + e]
                                              : state[(size_t)e * S + (j + S)];
        }
}

void mg_ref_m1_scan(int T, int E, int N, const double *xc, const double *delta,
                    const double *A, const double *Bm, const double *Cm, int ldbc,
                    const double *Dp, double *s, double *y, double *s_hist)
{
    for (int t = 0; t < T; t++) {
        const double *Bt = Bm + (size_t)t * ldbc, *Ct = Cm + (size_t)t * ldbc;
        for (int e = 0; e < E; e++) {
            double dl = delta[(size_t)t * E + e], xv = xc[(size_t)t * E + e];
            double acc = 0.0;
            for (int n = 0; n < N; n++) {
                size_t i = (size_t)e * N + n;
                double sv = exp(dl * A[i]) * s[i] + dl * Bt[n] * xv;
                s[i] = sv;
                acc += sv * Ct[n];
                if (s_hist)
                    s_hist[((size_t)t * E + e) * N + n] = sv;
            }
            y[(size_t)t * E + e] = acc + Dp[e] * xv;
        }
    }
}

/* ------------------------------------------------------------ model */

typedef struct m1 {
    int D, E, N, K, R, L, I, XP, in_dim;
    double eps;
} m1;

static m1 m1_of(const mg_m1_dims *d)
{
    m1 m;
    m.D = d->d_model;
    m.E = d->d_inner;
    m.N = d->d_state;
    m.K = d->d_conv;
    m.R = d->dt_rank;
    m.L = d->n_layers;
    m.I = d->input_dim;
    m.XP = m.R + 2 * m.N;
    m.in_dim = m.I > 0 ? m.I : m.D;
    m.eps = d->norm_eps;
    return m;
}

/* One layer's activations over [B*T] tokens (row i = b*T + t). */
typedef struct m1_act {
    double *rstd;  /* [BT]       1/sqrt(mean(h^2)+eps) */
    double *hn;    /* [BT][D]    rmsnorm(h) * norm.weight */
    double *xz;    /* [BT][2E]   in_proj output */
    double *pre;   /* [BT][E]    conv pre-activation */
    double *xc;    /* [BT][E]    silu(pre) */
    double *dbl;   /* [BT][XP]   x_proj output: dt_low | B | C */
    double *dtr;   /* [BT][E]    dt_proj(dt_low) + bias (before softplus) */
    double *delta; /* [BT][E] */
    double *y;     /* [BT][E]    scan output incl. D skip */
    double *g;     /* [BT][E]    y * silu(z) */
    double *shist; /* [BT][E][N] scan states (NULL: not kept) */
    double *A;     /* [E][N]     -exp(A_log) */
    double *s;     /* [E][N]     scan state being advanced */
    double *orow;  /* [D]        out_proj output of one token */
} m1_act;

/* calloc of n doubles, never NULL for n == 0 on success. */
static double *dalloc(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

static int size_ok(size_t a, size_t b, size_t c, size_t d)
{
    /* a*b*c*d doubles must fit in size_t bytes. */
    size_t lim = SIZE_MAX / sizeof(double);
    size_t v = 1, f[4] = { a, b, c, d };
    for (int i = 0; i < 4; i++) {
        if (f[i] != 0 && v > lim / f[i])
            return 0;
        v *= f[i];
    }
    return 1;
}

static void act_free(m1_act *a)
{
    free(a->rstd); free(a->hn); free(a->xz); free(a->pre); free(a->xc);
    free(a->dbl); free(a->dtr); free(a->delta); free(a->y); free(a->g);
    free(a->shist); free(a->A); free(a->s); free(a->orow);
    memset(a, 0, sizeof *a);
}

static mg_status act_alloc(m1_act *a, const m1 *m, size_t BT, int keep_states)
{
    memset(a, 0, sizeof *a);
    size_t E = (size_t)m->E, N = (size_t)m->N;
    a->rstd = dalloc(BT);
    a->hn = dalloc(BT * m->D);
    a->xz = dalloc(BT * 2 * E);
    a->pre = dalloc(BT * E);
    a->xc = dalloc(BT * E);
    a->dbl = dalloc(BT * m->XP);
    a->dtr = dalloc(BT * E);
    a->delta = dalloc(BT * E);
    a->y = dalloc(BT * E);
    a->g = dalloc(BT * E);
    a->A = dalloc(E * N);
    a->s = dalloc(E * N);
    a->orow = dalloc((size_t)m->D);
    int ok = a->rstd && a->hn && a->xz && a->pre && a->xc && a->dbl && a->dtr
             && a->delta && a->y && a->g && a->A && a->s && a->orow;
    if (ok && keep_states) {
        a->shist = dalloc(BT * E * N);
        ok = a->shist != NULL;
    }
    if (!ok) {
        act_free(a);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba1 reference: out of host memory");
    }
    return MG_OK;
}

/* v[0..D) -> out = v * r * w, returns r = 1/sqrt(mean(v^2) + eps). */
static double rmsnorm(const double *v, const double *w, int D, double eps, double *out)
{
    double ss = 0.0;
    for (int i = 0; i < D; i++)
        ss += v[i] * v[i];
    double r = 1.0 / sqrt(ss / D + eps);
    for (int i = 0; i < D; i++)
        out[i] = v[i] * r * w[i];
    return r;
}

/* One residual block over B sequences of T tokens:
 *   h_out = h_in + mixer(rmsnorm(h_in) * norm.weight)
 * h_out may equal h_in. conv_state [B][E][K-1] and ssm_state [B][E][N] are
 * the initial state, overwritten with the final one (NULL: zeros, not
 * written). Activations are left in *a (scan states too if a->shist). */
static void layer_fwd(const m1 *m, const double *w, const mg_m1_layer_off *lo,
                      int B, int T, const double *h_in, double *h_out,
                      double *conv_state, double *ssm_state, m1_act *a)
{
    const int D = m->D, E = m->E, N = m->N, K = m->K, R = m->R, XP = m->XP;
    const size_t BT = (size_t)B * T;
    for (size_t i = 0; i < (size_t)E * N; i++)
        a->A[i] = -exp(w[lo->A_log + i]);
    for (size_t i = 0; i < BT; i++) {
        a->rstd[i] = rmsnorm(h_in + i * D, w + lo->norm_w, D, m->eps, a->hn + i * D);
        linear(a->hn + i * D, w + lo->in_proj_w, NULL, 2 * E, D, a->xz + i * 2 * E);
    }
    for (int b = 0; b < B; b++) {
        size_t r0 = (size_t)b * T;
        mg_ref_m1_conv(T, E, K, a->xz + r0 * 2 * E, 2 * E, w + lo->conv_w, w + lo->conv_b,
                       conv_state ? conv_state + (size_t)b * E * (K - 1) : NULL,
                       a->pre + r0 * E, a->xc + r0 * E);
    }
    for (size_t i = 0; i < BT; i++) {
        linear(a->xc + i * E, w + lo->x_proj_w, NULL, XP, E, a->dbl + i * XP);
        linear(a->dbl + i * XP, w + lo->dt_proj_w, w + lo->dt_proj_b, E, R, a->dtr + i * E);
        for (int e = 0; e < E; e++)
            a->delta[i * E + e] = mg_ref_softplus(a->dtr[i * E + e]);
    }
    for (int b = 0; b < B; b++) {
        size_t r0 = (size_t)b * T, sn = (size_t)E * N;
        double *st = ssm_state ? ssm_state + (size_t)b * sn : NULL;
        if (st)
            memcpy(a->s, st, sn * sizeof *st);
        else
            memset(a->s, 0, sn * sizeof *a->s);
        mg_ref_m1_scan(T, E, N, a->xc + r0 * E, a->delta + r0 * E, a->A,
                       a->dbl + r0 * XP + R, a->dbl + r0 * XP + R + N, XP,
                       w + lo->D, a->s, a->y + r0 * E,
                       a->shist ? a->shist + r0 * sn : NULL);
        if (st)
            memcpy(st, a->s, sn * sizeof *st);
    }
    for (size_t i = 0; i < BT; i++) {
        for (int e = 0; e < E; e++)
            a->g[i * E + e] = a->y[i * E + e] * silu(a->xz[i * 2 * E + E + e]);
        linear(a->g + i * E, w + lo->out_proj_w, NULL, D, E, a->orow);
        for (int d = 0; d < D; d++)
            h_out[i * D + d] = h_in[i * D + d] + a->orow[d];
    }
}

/* The backbone: input_proj (or identity), the layers, norm_f.
 * hs: NULL, or [(L+1)][BT][D] receiving every layer's input and the final
 * residual stream (hs[L]). act: scratch/activations of the last layer run. */
static mg_status forward_all(const m1 *m, const mg_m1_layout *lay, const double *w,
                             int B, int T, const double *u, double *out,
                             double *conv_state, double *ssm_state, double *hs)
{
    const size_t BT = (size_t)B * T, D = (size_t)m->D;
    m1_act a;
    mg_status st = act_alloc(&a, m, BT, 0);
    if (st != MG_OK)
        return st;
    double *h = hs ? hs : dalloc(BT * D);
    if (h == NULL) {
        act_free(&a);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba1 reference: out of host memory");
    }
    for (size_t i = 0; i < BT; i++) {
        if (m->I > 0)
            linear(u + i * m->I, w + lay->input_proj_w, w + lay->input_proj_b,
                   m->D, m->I, h + i * D);
        else
            memcpy(h + i * D, u + i * D, D * sizeof *h);
    }
    for (int l = 0; l < m->L; l++) {
        double *hi = hs ? hs + (size_t)l * BT * D : h;
        double *ho = hs ? hs + (size_t)(l + 1) * BT * D : h;
        layer_fwd(m, w, &lay->layers[l], B, T, hi, ho,
                  conv_state ? conv_state + (size_t)l * B * m->E * (m->K - 1) : NULL,
                  ssm_state ? ssm_state + (size_t)l * B * m->E * m->N : NULL, &a);
    }
    const double *hf = hs ? hs + (size_t)m->L * BT * D : h;
    for (size_t i = 0; i < BT; i++)
        (void)rmsnorm(hf + i * D, w + lay->norm_f_w, m->D, m->eps, out + i * D);
    if (!hs)
        free(h);
    act_free(&a);
    return MG_OK;
}

/* Backward of rmsnorm: out = h * r * w, r = (mean(h^2)+eps)^-1/2.
 *   dw[i] += dout[i] h[i] r
 *   dh[j] += r g[j] - r^3 h[j] (sum_i g[i] h[i]) / D,  g = dout * w  */
static void rmsnorm_bwd(const double *h, const double *w, double r, int D,
                        const double *dout, double *dw, double *dh)
{
    double dot = 0.0;
    for (int i = 0; i < D; i++) {
        dw[i] += dout[i] * h[i] * r;
        dot += dout[i] * w[i] * h[i];
    }
    double c = r * r * r * dot / D;
    for (int i = 0; i < D; i++)
        dh[i] += r * dout[i] * w[i] - c * h[i];
}

/* Backward scratch. */
typedef struct m1_bws {
    double *dy, *dz, *dxc, *ddelta, *ddbl; /* [BT][E] x4, [BT][XP] */
    double *dxx;   /* [T+K-1][E]: grads of the conv inputs of one sequence */
    double *ds;    /* [E][N] */
    double *dxz;   /* [2E] */
    double *dhn;   /* [D] */
    double *dg;    /* [E] */
} m1_bws;

static void bws_free(m1_bws *s)
{
    free(s->dy); free(s->dz); free(s->dxc); free(s->ddelta); free(s->ddbl);
    free(s->dxx); free(s->ds); free(s->dxz); free(s->dhn); free(s->dg);
    memset(s, 0, sizeof *s);
}

static mg_status bws_alloc(m1_bws *s, const m1 *m, int T, size_t BT)
{
    size_t E = (size_t)m->E;
    s->dy = dalloc(BT * E);
    s->dz = dalloc(BT * E);
    s->dxc = dalloc(BT * E);
    s->ddelta = dalloc(BT * E);
    s->ddbl = dalloc(BT * m->XP);
    s->dxx = dalloc(((size_t)T + m->K - 1) * E);
    s->ds = dalloc(E * m->N);
    s->dxz = dalloc(2 * E);
    s->dhn = dalloc((size_t)m->D);
    s->dg = dalloc(E);
    if (!(s->dy && s->dz && s->dxc && s->ddelta && s->ddbl && s->dxx && s->ds
          && s->dxz && s->dhn && s->dg)) {
        bws_free(s);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba1 reference: out of host memory");
    }
    return MG_OK;
}

/* Backward of one block, given its activations in *a (from layer_fwd with
 * a->shist), its input h_in and initial states cs0 [B][E][K-1], ss0
 * [B][E][N]. dh: on entry dL/dh_out, on exit dL/dh_in. Parameter gradients
 * are accumulated into gw (same layout as w); dcs/dss receive the
 * gradients w.r.t. cs0/ss0 (overwritten). */
static void layer_bwd(const m1 *m, const double *w, const mg_m1_layer_off *lo,
                      double *gw, int B, int T, const double *h_in, const m1_act *a,
                      const double *cs0, const double *ss0, double *dh,
                      double *dcs, double *dss, m1_bws *s)
{
    const int D = m->D, E = m->E, N = m->N, K = m->K, R = m->R, XP = m->XP, S = K - 1;
    const size_t BT = (size_t)B * T, sn = (size_t)E * N;
    const double *Wout = w + lo->out_proj_w, *Dp = w + lo->D;
    double *gWout = gw + lo->out_proj_w, *gDp = gw + lo->D;

    /* out_proj, gate, D skip, dC (needs s_t), per token. */
    memset(s->ddbl, 0, BT * XP * sizeof *s->ddbl);
    for (size_t i = 0; i < BT; i++) {
        const double *dop = dh + i * D;          /* dL/d(out_proj output) */
        for (int e = 0; e < E; e++)
            s->dg[e] = 0.0;
        for (int d = 0; d < D; d++) {
            double g0 = dop[d];
            const double *wr = Wout + (size_t)d * E;
            double *gr = gWout + (size_t)d * E;
            for (int e = 0; e < E; e++) {
                gr[e] += g0 * a->g[i * E + e];
                s->dg[e] += wr[e] * g0;
            }
        }
        double *dC = s->ddbl + i * XP + R + N;
        for (int e = 0; e < E; e++) {
            double z = a->xz[i * 2 * E + E + e], yv = a->y[i * E + e];
            double xcv = a->xc[i * E + e];
            double dy = s->dg[e] * silu(z);
            s->dz[i * E + e] = s->dg[e] * yv * silu_grad(z);
            s->dy[i * E + e] = dy;
            gDp[e] += dy * xcv;
            s->dxc[i * E + e] = dy * Dp[e];
            const double *st = a->shist + (i * E + e) * N;
            for (int n = 0; n < N; n++)
                dC[n] += dy * st[n];
        }
    }

    /* The scan in reverse: s_t = exp(delta A) s_{t-1} + delta B_t xc_t,
     * y_t = C_t . s_t + ... ; ds carries dL/ds_t backwards. */
    double *gAlog = gw + lo->A_log;
    for (int b = 0; b < B; b++) {
        memset(s->ds, 0, sn * sizeof *s->ds);
        for (int t = T - 1; t >= 0; t--) {
            size_t i = (size_t)b * T + t;
            const double *Bt = a->dbl + i * XP + R, *Ct = a->dbl + i * XP + R + N;
            double *dB = s->ddbl + i * XP + R;
            for (int e = 0; e < E; e++) {
                double dl = a->delta[i * E + e], xcv = a->xc[i * E + e];
                double dyv = s->dy[i * E + e];
                const double *sprev = t > 0 ? a->shist + ((i - 1) * E + e) * N
                                            : ss0 + (size_t)b * sn + (size_t)e * N;
                double dd = 0.0, dx = 0.0;
                for (int n = 0; n < N; n++) {
                    size_t k = (size_t)e * N + n;
                    double An = a->A[k];
                    double dsn = s->ds[k] + dyv * Ct[n];
                    double dA = exp(dl * An);
                    double gda = dsn * sprev[n];          /* dL/d exp(delta A) */
                    dd += gda * dA * An + dsn * Bt[n] * xcv;
                    /* dL/dA_log = dL/dA * dA/dA_log = dL/dA * A */
                    gAlog[k] += gda * dA * dl * An;
                    dB[n] += dsn * dl * xcv;
                    dx += dsn * dl * Bt[n];
                    s->ds[k] = dsn * dA;
                }
                s->ddelta[i * E + e] = dd;
                s->dxc[i * E + e] += dx;
            }
        }
        if (dss)
            memcpy(dss + (size_t)b * sn, s->ds, sn * sizeof *dss);
    }

    /* softplus, dt_proj, x_proj, per token; then conv pre-activation. */
    const double *Wdt = w + lo->dt_proj_w, *Wx = w + lo->x_proj_w;
    double *gWdt = gw + lo->dt_proj_w, *gbdt = gw + lo->dt_proj_b, *gWx = gw + lo->x_proj_w;
    for (size_t i = 0; i < BT; i++) {
        const double *dbl = a->dbl + i * XP;
        double *ddbl = s->ddbl + i * XP;
        for (int e = 0; e < E; e++) {
            double x = a->dtr[i * E + e], gd = s->ddelta[i * E + e];
            double gr = x > 20.0 ? gd : gd * sigmoid(x);
            gbdt[e] += gr;
            for (int r = 0; r < R; r++) {
                gWdt[(size_t)e * R + r] += gr * dbl[r];
                ddbl[r] += Wdt[(size_t)e * R + r] * gr;
            }
        }
        const double *xc = a->xc + i * E;
        double *dxc = s->dxc + i * E;
        for (int j = 0; j < XP; j++) {
            double gj = ddbl[j];
            const double *wr = Wx + (size_t)j * E;
            double *gr = gWx + (size_t)j * E;
            for (int e = 0; e < E; e++) {
                gr[e] += gj * xc[e];
                dxc[e] += wr[e] * gj;
            }
        }
        for (int e = 0; e < E; e++)   /* dxc -> dpre, in place */
            dxc[e] *= silu_grad(a->pre[i * E + e]);
    }

    /* conv: pre_t[e] = bias[e] + sum_k w[e,k] xx_{t-S+k}[e]; xx_j for
     * j < 0 is the initial conv state, dxx indexed j + S. Then in_proj and
     * the block's rmsnorm, per token. */
    const double *Wc = w + lo->conv_w, *Win = w + lo->in_proj_w;
    double *gWc = gw + lo->conv_w, *gbc = gw + lo->conv_b, *gWin = gw + lo->in_proj_w;
    for (int b = 0; b < B; b++) {
        size_t r0 = (size_t)b * T;
        memset(s->dxx, 0, ((size_t)T + S) * E * sizeof *s->dxx);
        for (int t = 0; t < T; t++) {
            const double *dpre = s->dxc + (r0 + t) * E;
            for (int e = 0; e < E; e++) {
                double gp = dpre[e];
                gbc[e] += gp;
                for (int k = 0; k < K; k++) {
                    int j = t - S + k;
                    double xv = j >= 0 ? a->xz[(r0 + j) * 2 * E + e]
                                       : cs0[((size_t)b * E + e) * S + (j + S)];
                    gWc[(size_t)e * K + k] += gp * xv;
                    s->dxx[(size_t)(j + S) * E + e] += gp * Wc[(size_t)e * K + k];
                }
            }
        }
        if (dcs)
            for (int e = 0; e < E; e++)
                for (int k = 0; k < S; k++)
                    dcs[((size_t)b * E + e) * S + k] = s->dxx[(size_t)k * E + e];
        for (int t = 0; t < T; t++) {
            size_t i = r0 + t;
            for (int e = 0; e < E; e++) {
                s->dxz[e] = s->dxx[(size_t)(t + S) * E + e];
                s->dxz[E + e] = s->dz[i * E + e];
            }
            const double *hn = a->hn + i * D;
            for (int d = 0; d < D; d++)
                s->dhn[d] = 0.0;
            for (int o = 0; o < 2 * E; o++) {
                double go = s->dxz[o];
                const double *wr = Win + (size_t)o * D;
                double *gr = gWin + (size_t)o * D;
                for (int d = 0; d < D; d++) {
                    gr[d] += go * hn[d];
                    s->dhn[d] += wr[d] * go;
                }
            }
            /* dh already holds dL/dh_out (the residual path); add the norm path. */
            rmsnorm_bwd(h_in + i * D, w + lo->norm_w, a->rstd[i], D, s->dhn,
                        gw + lo->norm_w, dh + i * D);
        }
    }
}

/* ------------------------------------------------------------ public entry points */

static mg_status check_call(const mg_m1_dims *d, const mg_m1_layout *l, const void *blob,
                            int batch, int seqlen, const void *u, const void *o,
                            const char *oname, const char *fn)
{
    mg_status s = check_dims(d, fn);
    if (s == MG_OK)
        s = check_layout(d, l, fn);
    if (s != MG_OK)
        return s;
    if (blob == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: blob is NULL", fn);
    if (u == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: u is NULL", fn);
    if (o == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: %s is NULL", fn, oname);
    if (batch < 1 || seqlen < 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch must be >= 1 and seqlen >= 0 "
                       "(got batch=%d seqlen=%d)", fn, batch, seqlen);
    size_t BT = (size_t)batch * (size_t)seqlen;
    int D = d->d_model, E = d->d_inner, N = d->d_state;
    if (!size_ok(BT, (size_t)E, (size_t)N, 1) || !size_ok(BT, 2, (size_t)E, 1)
        || !size_ok(BT, (size_t)d->n_layers + 1, (size_t)D, 1)
        || !size_ok(BT, (size_t)(d->dt_rank + 2 * N), 1, 1)
        || !size_ok(BT, (size_t)(d->input_dim > 0 ? d->input_dim : D), 1, 1))
        return mg_fail(MG_ERR_SIZE, "%s: batch*seqlen=%zu is too large", fn, BT);
    return MG_OK;
}

/* check_call for a backward, which also needs grad_blob. */
static mg_status check_bwd_call(const mg_m1_dims *d, const mg_m1_layout *l, const void *blob,
                                int batch, int seqlen, const void *u, const double *dout,
                                const double *grad_blob, const char *fn)
{
    mg_status s = check_call(d, l, blob, batch, seqlen, u, dout, "dout", fn);
    if (s == MG_OK && grad_blob == NULL)
        s = mg_fail(MG_ERR_INVALID_ARG, "%s: grad_blob is NULL", fn);
    return s;
}

static double *to_f64(const float *x, size_t n)
{
    double *y = dalloc(n);
    if (y)
        for (size_t i = 0; i < n; i++)
            y[i] = x[i];
    return y;
}

/* The f32 entry points: check the call, then widen the blob and the input
 * to double (exactly) for the f64 path. On MG_OK the caller frees *w and *ud. */
static mg_status widen_call(const mg_m1_dims *d, const mg_m1_layout *l, const float *blob,
                            int batch, int seqlen, const float *u, const void *o,
                            const char *oname, const char *fn, double **w, double **ud)
{
    mg_status s = check_call(d, l, blob, batch, seqlen, u, o, oname, fn);
    if (s != MG_OK)
        return s;
    size_t nu = (size_t)batch * seqlen * (d->input_dim > 0 ? d->input_dim : d->d_model);
    *w = to_f64(blob, l->total);
    *ud = to_f64(u, nu);
    if (*w == NULL || *ud == NULL) {
        free(*w);
        free(*ud);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    return MG_OK;
}

mg_status mg_ref_mamba1_forward_f64(const mg_m1_dims *d, const mg_m1_layout *l,
                                    const double *blob, int batch, int seqlen,
                                    const double *u, double *out,
                                    double *conv_state, double *ssm_state)
{
    mg_status s = check_call(d, l, blob, batch, seqlen, u, out, "out",
                             "mg_ref_mamba1_forward");
    if (s != MG_OK)
        return s;
    m1 m = m1_of(d);
    return forward_all(&m, l, blob, batch, seqlen, u, out, conv_state, ssm_state, NULL);
}

mg_status mg_ref_mamba1_forward(const mg_m1_dims *d, const mg_m1_layout *l,
                                const float *blob, int batch, int seqlen,
                                const float *u, double *out,
                                double *conv_state, double *ssm_state)
{
    double *w = NULL, *ud = NULL;
    mg_status s = widen_call(d, l, blob, batch, seqlen, u, out, "out",
                             "mg_ref_mamba1_forward", &w, &ud);
    if (s != MG_OK)
        return s;
    m1 m = m1_of(d);
    s = forward_all(&m, l, w, batch, seqlen, ud, out, conv_state, ssm_state, NULL);
    free(w); free(ud);
    return s;
}

mg_status mg_ref_mamba1_backward_f64(const mg_m1_dims *d, const mg_m1_layout *l,
                                     const double *blob, int batch, int seqlen,
                                     const double *u, MG_M1_BWD_STATES)
{
    const char *fn = "mg_ref_mamba1_backward";
    mg_status st = check_bwd_call(d, l, blob, batch, seqlen, u, dout, grad_blob, fn);
    if (st != MG_OK)
        return st;
    const m1 m = m1_of(d);
    const int B = batch, T = seqlen, D = m.D, E = m.E, N = m.N, S = m.K - 1;
    const size_t BT = (size_t)B * T;
    const size_t ncs = (size_t)B * E * S, nss = (size_t)B * E * N; /* per layer */

    double *hs = dalloc(((size_t)m.L + 1) * BT * D);
    double *outbuf = dalloc(BT * D);
    double *dh = dalloc(BT * D);
    double *hout = dalloc(BT * D);
    double *cs0 = dalloc(ncs), *ss0 = dalloc(nss);   /* a layer's initial state */
    double *csw = dalloc(ncs), *ssw = dalloc(nss);   /* advanced by layer_fwd */
    m1_act a;
    m1_bws bw;
    memset(&a, 0, sizeof a);
    memset(&bw, 0, sizeof bw);
    if (!(hs && outbuf && dh && hout && cs0 && ss0 && csw && ssw)) {
        st = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        goto done;
    }
    if ((st = act_alloc(&a, &m, BT, 1)) != MG_OK || (st = bws_alloc(&bw, &m, T, BT)) != MG_OK)
        goto done;

    /* 1. forward, keeping every layer's input. The states are copied: the
     *    forward advances them and the caller's are read-only. */
    {
        double *csa = NULL, *ssa = NULL;
        if (conv_state_in && (csa = dalloc(ncs * m.L)) != NULL)
            memcpy(csa, conv_state_in, ncs * m.L * sizeof *csa);
        if (ssm_state_in && (ssa = dalloc(nss * m.L)) != NULL)
            memcpy(ssa, ssm_state_in, nss * m.L * sizeof *ssa);
        if ((conv_state_in && !csa) || (ssm_state_in && !ssa))
            st = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        else
            st = forward_all(&m, l, blob, B, T, u, outbuf, csa, ssa, hs);
        free(csa);
        free(ssa);
        if (st != MG_OK)
            goto done;
    }

    /* 2. norm_f. */
    memset(grad_blob, 0, l->total * sizeof *grad_blob);
    {
        const double *hf = hs + (size_t)m.L * BT * D;
        for (size_t i = 0; i < BT; i++) {
            const double *h = hf + i * D;
            double ss = 0.0;
            for (int k = 0; k < D; k++)
                ss += h[k] * h[k];
            double r = 1.0 / sqrt(ss / D + m.eps);
            rmsnorm_bwd(h, blob + l->norm_f_w, r, D, dout + i * D,
                        grad_blob + l->norm_f_w, dh + i * D);
        }
    }

    /* 3. layers in reverse: recompute with the scan states kept, backprop. */
    for (int li = m.L - 1; li >= 0; li--) {
        if (conv_state_in)
            memcpy(cs0, conv_state_in + (size_t)li * ncs, ncs * sizeof *cs0);
        if (ssm_state_in)
            memcpy(ss0, ssm_state_in + (size_t)li * nss, nss * sizeof *ss0);
        memcpy(csw, cs0, ncs * sizeof *csw);
        memcpy(ssw, ss0, nss * sizeof *ssw);
        const double *hin = hs + (size_t)li * BT * D;
        layer_fwd(&m, blob, &l->layers[li], B, T, hin, hout, csw, ssw, &a);
        layer_bwd(&m, blob, &l->layers[li], grad_blob, B, T, hin, &a, cs0, ss0, dh,
                  dconv_state_in ? dconv_state_in + (size_t)li * ncs : NULL,
                  dssm_state_in ? dssm_state_in + (size_t)li * nss : NULL, &bw);
    }

    /* 4. input_proj (or identity). */
    if (m.I > 0) {
        const double *W = blob + l->input_proj_w;
        double *gW = grad_blob + l->input_proj_w, *gb = grad_blob + l->input_proj_b;
        for (size_t i = 0; i < BT; i++) {
            const double *ui = u + i * m.I, *g = dh + i * D;
            double *dui = du ? du + i * m.I : NULL;
            if (dui)
                for (int j = 0; j < m.I; j++)
                    dui[j] = 0.0;
            for (int k = 0; k < D; k++) {
                gb[k] += g[k];
                for (int j = 0; j < m.I; j++) {
                    gW[(size_t)k * m.I + j] += g[k] * ui[j];
                    if (dui)
                        dui[j] += W[(size_t)k * m.I + j] * g[k];
                }
            }
        }
    } else if (du) {
        memcpy(du, dh, BT * D * sizeof *du);
    }
    st = MG_OK;

done:
    act_free(&a);
    bws_free(&bw);
    free(hs); free(outbuf); free(dh); free(hout);
    free(cs0); free(ss0); free(csw); free(ssw);
    return st;
}

mg_status mg_ref_mamba1_backward(const mg_m1_dims *d, const mg_m1_layout *l,
                                 const float *blob, int batch, int seqlen,
                                 const float *u, MG_M1_BWD_STATES)
{
    double *w = NULL, *ud = NULL;
    mg_status s = widen_call(d, l, blob, batch, seqlen, u, dout, "dout",
                             "mg_ref_mamba1_backward", &w, &ud);
    if (s != MG_OK)
        return s;
    s = mg_ref_mamba1_backward_f64(d, l, w, batch, seqlen, ud, conv_state_in,
                                   ssm_state_in, dout, grad_blob, du,
                                   dconv_state_in, dssm_state_in);
    free(w); free(ud);
    return s;
}

/* ------------------------------------------------------------ episode starts, packed sequences */

/* The _ex entry points run their call as segments (mg_ref_seqs_plan), each
 * a plain call of batch 1 on its rows: the hand split, literally. */
typedef struct m1_seg_ctx {
    const mg_m1_dims *d;
    const mg_m1_layout *l;
    const double *w, *u, *dout;
    double *out, *du;
    size_t in_dim, D;
} m1_seg_ctx;

static m1_seg_ctx m1_seg_ctx_of(const mg_m1_dims *d, const mg_m1_layout *l, const double *w,
                                const double *u, double *out, const double *dout, double *du)
{
    m1_seg_ctx c = { d, l, w, u, dout, out, du,
                     (size_t)(d->input_dim > 0 ? d->input_dim : d->d_model),
                     (size_t)d->d_model };
    return c;
}

/* The states as the segment drivers see them: conv, then ssm. */
static mg_ref_state_shape m1_state_shape(const mg_m1_dims *d)
{
    mg_ref_state_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layers = d->n_layers;
    sh.n = 2;
    sh.per[0] = (size_t)d->d_inner * (size_t)(d->d_conv - 1);
    sh.per[1] = (size_t)d->d_inner * (size_t)d->d_state;
    return sh;
}

static mg_status m1_seg_fwd(void *vc, const mg_ref_seg *g, double *const *st)
{
    const m1_seg_ctx *c = vc;
    return mg_ref_mamba1_forward_f64(c->d, c->l, c->w, 1, g->len, c->u + g->row * c->in_dim,
                                     c->out + g->row * c->D, st[0], st[1]);
}

static mg_status m1_seg_bwd(void *vc, const mg_ref_seg *g, double *const *st0,
                            double *const *dT, double *const *d0, double *dblob)
{
    (void)dT;   /* the Mamba-1 loss has no final-state term */
    const m1_seg_ctx *c = vc;
    return mg_ref_mamba1_backward_f64(c->d, c->l, c->w, 1, g->len, c->u + g->row * c->in_dim,
                                      st0[0], st0[1], c->dout + g->row * c->D, dblob,
                                      c->du ? c->du + g->row * c->in_dim : NULL, d0[0], d0[1]);
}

mg_status mg_ref_mamba1_forward_f64_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                       const double *blob, int batch, int seqlen,
                                       const double *u, double *out,
                                       double *conv_state, double *ssm_state,
                                       const mg_ref_seqs *seqs)
{
    const char *fn = "mg_ref_mamba1_forward_ex";
    mg_ref_plan p;
    int plain;
    mg_status s = check_call(d, l, blob, batch, seqlen, u, out, "out", fn);
    if (s == MG_OK)
        s = mg_ref_seqs_prepare(seqs, batch, seqlen, fn, &p, &plain);
    if (s != MG_OK)
        return s;
    if (plain)
        return mg_ref_mamba1_forward_f64(d, l, blob, batch, seqlen, u, out, conv_state,
                                         ssm_state);
    m1_seg_ctx c = m1_seg_ctx_of(d, l, blob, u, out, NULL, NULL);
    mg_ref_state_shape sh = m1_state_shape(d);
    double *st[2] = { conv_state, ssm_state };
    s = mg_ref_seqs_forward(&p, &sh, st, m1_seg_fwd, &c);
    if (s == MG_OK)
        mg_ref_seqs_zero_rows(out, p.ntok, (size_t)batch * seqlen, c.D);
    mg_ref_seqs_plan_free(&p);
    return s;
}

mg_status mg_ref_mamba1_forward_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                   const float *blob, int batch, int seqlen,
                                   const float *u, double *out,
                                   double *conv_state, double *ssm_state,
                                   const mg_ref_seqs *seqs)
{
    double *w = NULL, *ud = NULL;
    mg_status s = widen_call(d, l, blob, batch, seqlen, u, out, "out",
                             "mg_ref_mamba1_forward_ex", &w, &ud);
    if (s != MG_OK)
        return s;
    s = mg_ref_mamba1_forward_f64_ex(d, l, w, batch, seqlen, ud, out, conv_state, ssm_state,
                                     seqs);
    free(w); free(ud);
    return s;
}

mg_status mg_ref_mamba1_backward_f64_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                        const double *blob, int batch, int seqlen,
                                        const double *u, MG_M1_BWD_STATES,
                                        const mg_ref_seqs *seqs)
{
    const char *fn = "mg_ref_mamba1_backward_ex";
    mg_ref_plan p;
    int plain;
    mg_status s = check_bwd_call(d, l, blob, batch, seqlen, u, dout, grad_blob, fn);
    if (s == MG_OK)
        s = mg_ref_seqs_prepare(seqs, batch, seqlen, fn, &p, &plain);
    if (s != MG_OK)
        return s;
    if (plain)
        return mg_ref_mamba1_backward_f64(d, l, blob, batch, seqlen, u, conv_state_in,
                                          ssm_state_in, dout, grad_blob, du,
                                          dconv_state_in, dssm_state_in);
    m1_seg_ctx c = m1_seg_ctx_of(d, l, blob, u, NULL, dout, du);
    mg_ref_state_shape sh = m1_state_shape(d);
    const double *st0[2] = { conv_state_in, ssm_state_in };
    double *d0[2] = { dconv_state_in, dssm_state_in };
    s = mg_ref_seqs_backward(&p, &sh, st0, NULL, d0, grad_blob, l->total, m1_seg_bwd, &c);
    if (s == MG_OK)
        mg_ref_seqs_zero_rows(du, p.ntok, (size_t)batch * seqlen, c.in_dim);
    mg_ref_seqs_plan_free(&p);
    return s;
}

mg_status mg_ref_mamba1_backward_ex(const mg_m1_dims *d, const mg_m1_layout *l,
                                    const float *blob, int batch, int seqlen,
                                    const float *u, MG_M1_BWD_STATES,
                                    const mg_ref_seqs *seqs)
{
    double *w = NULL, *ud = NULL;
    mg_status s = widen_call(d, l, blob, batch, seqlen, u, dout, "dout",
                             "mg_ref_mamba1_backward_ex", &w, &ud);
    if (s != MG_OK)
        return s;
    s = mg_ref_mamba1_backward_f64_ex(d, l, w, batch, seqlen, ud, conv_state_in,
                                      ssm_state_in, dout, grad_blob, du, dconv_state_in,
                                      dssm_state_in, seqs);
    free(w); free(ud);
    return s;
}

/* ------------------------------------------------------------------ */
/* weights out of the init range (tests)                               */

mg_status mg_ref_mamba1_push_ranges(const mg_m1_dims *d, const mg_m1_layout *l, float *blob,
                                    unsigned long long seed, float *u_offset0)
{
    mg_status s = check_dims(d, "mg_ref_mamba1_push_ranges");
    if (s == MG_OK) s = check_layout(d, l, "mg_ref_mamba1_push_ranges");
    if (s != MG_OK) return s;
    if (!blob || !u_offset0) return mg_fail(MG_ERR_INVALID_ARG, "mg_ref_mamba1_push_ranges: NULL argument");
    mg_rng r;
    mg_rng_seed(&r, seed);
    for (int li = 0; li < d->n_layers; li++)
        for (int e = 0; e < d->d_inner; e += 4)
            blob[l->layers[li].dt_proj_b + (size_t)e] = (float)(22.0 + 2.0 * mg_rng_uniform(&r));
    *u_offset0 = 0.0f;
    return MG_OK;
}
