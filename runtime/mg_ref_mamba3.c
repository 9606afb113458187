/* mg_ref_mamba3.c: the Mamba-3 SISO reference path (see mg_ref_mamba3.h and
 * doc/math.md). Everything is computed in f64 from the f32 weight blob.
 *
 * Structure: m3_forward_run() is the one forward; it either reuses one
 * activation scratch for every layer (forward only) or keeps every layer's
 * per-token activations (backward). The backward then walks the layers in
 * reverse, and inside each layer: out_proj and gate, the step recurrence in
 * reverse (ssm_step_bwd; the SSM states of one (batch, head) sequence are
 * recomputed by the forward's own step code rather than stored for the
 * whole layer), the angle recurrence in reverse, then the per-token maps
 * (splits, BCNorm, in_proj, pre-norm). */
#include "mg_ref_mamba3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_rng.h"

#define M3_PI 3.14159265358979323846
#define M3_2PI 6.28318530717958647692

/* ------------------------------------------------------------------ */
/* scalar helpers                                                      */

static double sigm(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static double dsoftplus(double x) { return x > 20.0 ? 1.0 : sigm(x); }
static double silu(double x) { return x * sigm(x); }
static double dsilu(double x)
{
    double s = sigm(x);
    return s * (1.0 + x * (1.0 - s));
}
static double a_act(mg_m3_a_act k, double v)
{
    if (k == MG_M3_A_SOFTPLUS) return softplus(v);
    return v >= 0 ? 1.0 + v : 1.0 / (1.0 - v);
}
static double da_act(mg_m3_a_act k, double v)
{
    if (k == MG_M3_A_SOFTPLUS) return dsoftplus(v);
    return v >= 0 ? 1.0 : 1.0 / ((1.0 - v) * (1.0 - v));
}
/* theta mod 2pi, in [0, 2pi). */
static double wrap2pi(double th)
{
    th = fmod(th, M3_2PI);
    if (th < 0) th += M3_2PI;
    if (th >= M3_2PI) th -= M3_2PI;
    return th;
}
static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

/* ------------------------------------------------------------------ */
/* dims and layout                                                     */

static mg_status check_dims(const mg_m3_dims *d)
{
    if (!d) return mg_fail(MG_ERR_INVALID_ARG, "mamba3: dims is NULL");
    if (d->d_model <= 0 || d->n_layers < 0 || d->d_state <= 0 ||
        d->d_inner <= 0 || d->headdim <= 0 || d->nheads <= 0 ||
        d->ngroups <= 0 || d->n_angles < 0 || d->input_dim < 0)
        return mg_fail(MG_ERR_INVALID_ARG,
                       "mamba3: dims out of range (d_model %d, n_layers %d, "
                       "d_state %d, d_inner %d, headdim %d, nheads %d, "
                       "ngroups %d, n_angles %d, input_dim %d)",
                       d->d_model, d->n_layers, d->d_state, d->d_inner,
                       d->headdim, d->nheads, d->ngroups, d->n_angles,
                       d->input_dim);
    if ((long)d->nheads * d->headdim != d->d_inner)
        return mg_fail(MG_ERR_INVALID_ARG,
                       "mamba3: d_inner %d != nheads %d * headdim %d",
                       d->d_inner, d->nheads, d->headdim);
    if (d->nheads % d->ngroups != 0)
        return mg_fail(MG_ERR_INVALID_ARG,
                       "mamba3: nheads %d not divisible by ngroups %d",
                       d->nheads, d->ngroups);
    if (2 * d->n_angles > d->d_state)
        return mg_fail(MG_ERR_INVALID_ARG,
                       "mamba3: 2*n_angles = %d > d_state %d",
                       2 * d->n_angles, d->d_state);
    if (!(d->norm_eps > 0))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: norm_eps %g must be > 0",
                       d->norm_eps);
    if (!(d->a_floor >= 0))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: a_floor %g must be >= 0",
                       d->a_floor);
    if (d->a_activation != MG_M3_A_HEAVY_TAIL &&
        d->a_activation != MG_M3_A_SOFTPLUS)
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: a_activation %d unknown",
                       (int)d->a_activation);
    return MG_OK;
}

size_t mg_ref_mamba3_in_proj_dim(const mg_m3_dims *d)
{
    return 2 * (size_t)d->d_inner + 2 * (size_t)d->ngroups * d->d_state +
           3 * (size_t)d->nheads + (size_t)d->n_angles;
}

mg_status mg_ref_mamba3_layout(const mg_m3_dims *d, mg_m3_layout *out)
{
    if (!out) return mg_fail(MG_ERR_INVALID_ARG, "mamba3: layout is NULL");
    memset(out, 0, sizeof *out);
    mg_status st = check_dims(d);
    if (st != MG_OK) return st;
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner,
           N = (size_t)d->d_state, H = (size_t)d->nheads,
           NP = mg_ref_mamba3_in_proj_dim(d);
    size_t pos = 0;
#define PUT(field, n) do { (field) = pos; pos = up64(pos + (n)); } while (0)
    out->input_proj_w = out->input_proj_b = MG_M3_NO_TENSOR;
    if (d->input_dim > 0) {
        PUT(out->input_proj_w, D * (size_t)d->input_dim);
        PUT(out->input_proj_b, D);
    }
    if (d->n_layers > 0) {
        out->layers = calloc((size_t)d->n_layers, sizeof *out->layers);
        if (!out->layers)
            return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: layout: out of memory");
    }
    for (int l = 0; l < d->n_layers; l++) {
        mg_m3_layer_off *o = &out->layers[l];
        PUT(o->norm_w, D);
        PUT(o->in_proj_w, NP * D);
        PUT(o->dt_bias, H);
        PUT(o->B_norm_w, N);
        PUT(o->C_norm_w, N);
        PUT(o->B_bias, H * N);
        PUT(o->C_bias, H * N);
        PUT(o->D, H);
        o->norm_gate_w = MG_M3_NO_TENSOR;
        if (d->outproj_norm) PUT(o->norm_gate_w, E);
        PUT(o->out_proj_w, D * E);
    }
    PUT(out->norm_f_w, D);
#undef PUT
    out->total = pos;
    return MG_OK;
}

void mg_ref_mamba3_layout_free(mg_m3_layout *l)
{
    if (!l) return;
    free(l->layers);
    l->layers = NULL;
}

static void add_param(mg_m3_param *out, size_t cap, size_t *n, const char *key,
                      int layer, const char *suffix, size_t offset, int ndim,
                      long s0, long s1, long s2)
{
    if (out && *n < cap) {
        mg_m3_param *p = &out[*n];
        memset(p, 0, sizeof *p);
        p->key = key;
        if (layer >= 0)
            snprintf(p->name, sizeof p->name, "layers.%d.%s", layer, suffix);
        else
            snprintf(p->name, sizeof p->name, "%s", suffix);
        p->ndim = ndim;
        p->shape[0] = s0;
        p->shape[1] = ndim > 1 ? s1 : 0;
        p->shape[2] = ndim > 2 ? s2 : 0;
        p->offset = offset;
        p->numel = (size_t)s0 * (size_t)(ndim > 1 ? s1 : 1) *
                   (size_t)(ndim > 2 ? s2 : 1);
        p->layer = layer;
    }
    (*n)++;
}

mg_status mg_ref_mamba3_params(const mg_m3_dims *d, const mg_m3_layout *l,
                               mg_m3_param *out, size_t cap, size_t *count)
{
    mg_status st = check_dims(d);
    if (st != MG_OK) return st;
    if (!l || !count || (d->n_layers > 0 && !l->layers))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: params: NULL argument");
    long D = d->d_model, E = d->d_inner, N = d->d_state, H = d->nheads;
    long NP = (long)mg_ref_mamba3_in_proj_dim(d);
    size_t n = 0;
    if (d->input_dim > 0) {
        add_param(out, cap, &n, "input_proj_w", -1, "input_proj.weight",
                  l->input_proj_w, 2, D, d->input_dim, 0);
        add_param(out, cap, &n, "input_proj_b", -1, "input_proj.bias",
                  l->input_proj_b, 1, D, 0, 0);
    }
    for (int i = 0; i < d->n_layers; i++) {
        const mg_m3_layer_off *o = &l->layers[i];
        add_param(out, cap, &n, "norm_w", i, "norm.weight", o->norm_w, 1, D, 0, 0);
        add_param(out, cap, &n, "in_proj_w", i, "mixer.in_proj.weight",
                  o->in_proj_w, 2, NP, D, 0);
        add_param(out, cap, &n, "dt_bias", i, "mixer.dt_bias", o->dt_bias, 1, H, 0, 0);
        add_param(out, cap, &n, "B_norm_w", i, "mixer.B_norm.weight",
                  o->B_norm_w, 1, N, 0, 0);
        add_param(out, cap, &n, "C_norm_w", i, "mixer.C_norm.weight",
                  o->C_norm_w, 1, N, 0, 0);
        add_param(out, cap, &n, "B_bias", i, "mixer.B_bias", o->B_bias, 3, H, 1, N);
        add_param(out, cap, &n, "C_bias", i, "mixer.C_bias", o->C_bias, 3, H, 1, N);
        add_param(out, cap, &n, "D", i, "mixer.D", o->D, 1, H, 0, 0);
        if (d->outproj_norm)
            add_param(out, cap, &n, "norm_gate_w", i, "mixer.norm.weight",
                      o->norm_gate_w, 1, E, 0, 0);
        add_param(out, cap, &n, "out_proj_w", i, "mixer.out_proj.weight",
                  o->out_proj_w, 2, D, E, 0);
    }
    add_param(out, cap, &n, "norm_f_w", -1, "norm_f.weight", l->norm_f_w, 1, D, 0, 0);
    *count = n;
    if (out && n > cap)
        return mg_fail(MG_ERR_SIZE, "mamba3: params: %zu tensors, room for %zu",
                       n, cap);
    return MG_OK;
}

/* ------------------------------------------------------------------ */
/* init                                                                */

static void fill_u(mg_rng *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * mg_rng_uniform(r));
}

mg_status mg_ref_mamba3_init(const mg_m3_dims *d, const mg_m3_layout *l,
                             float *blob, unsigned long long seed)
{
    mg_status st = check_dims(d);
    if (st != MG_OK) return st;
    if (!l || !blob || (d->n_layers > 0 && !l->layers))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: init: NULL argument");
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner,
           N = (size_t)d->d_state, H = (size_t)d->nheads,
           NP = mg_ref_mamba3_in_proj_dim(d);
    mg_rng r;
    mg_rng_seed(&r, (uint64_t)seed);
    memset(blob, 0, l->total * sizeof *blob);
    if (d->input_dim > 0) {
        double b = 1.0 / sqrt((double)d->input_dim);
        fill_u(&r, blob + l->input_proj_w, D * (size_t)d->input_dim, -b, b);
        fill_u(&r, blob + l->input_proj_b, D, -b, b);
    }
    for (int i = 0; i < d->n_layers; i++) {
        const mg_m3_layer_off *o = &l->layers[i];
        fill_u(&r, blob + o->norm_w, D, 0.9, 1.1);
        double b = 1.0 / sqrt((double)D);
        fill_u(&r, blob + o->in_proj_w, NP * D, -b, b);
        for (size_t h = 0; h < H; h++) {
            double lo = log(1e-3), hi = log(1e-1);
            double dt = exp(lo + (hi - lo) * mg_rng_uniform(&r));
            blob[o->dt_bias + h] = (float)(dt + log(-expm1(-dt)));
        }
        fill_u(&r, blob + o->B_norm_w, N, 0.9, 1.1);
        fill_u(&r, blob + o->C_norm_w, N, 0.9, 1.1);
        fill_u(&r, blob + o->B_bias, H * N, 0.9, 1.1);
        fill_u(&r, blob + o->C_bias, H * N, 0.9, 1.1);
        fill_u(&r, blob + o->D, H, 0.9, 1.1);
        if (d->outproj_norm) fill_u(&r, blob + o->norm_gate_w, E, 0.9, 1.1);
        b = 1.0 / sqrt((double)E);
        fill_u(&r, blob + o->out_proj_w, D * E, -b, b);
    }
    fill_u(&r, blob + l->norm_f_w, D, 0.9, 1.1);
    return MG_OK;
}

/* ------------------------------------------------------------------ */
/* SSM core: step form, its reverse, and the chunked form              */

static mg_status check_ssm_args(const mg_m3_ssm_args *a)
{
    if (!a) return mg_fail(MG_ERR_INVALID_ARG, "mamba3 ssm: args is NULL");
    if (a->batch < 0 || a->seqlen < 0 || a->nheads <= 0 || a->headdim <= 0 ||
        a->d_state <= 0)
        return mg_fail(MG_ERR_INVALID_ARG,
                       "mamba3 ssm: bad sizes (batch %d, seqlen %d, nheads %d, "
                       "headdim %d, d_state %d)", a->batch, a->seqlen,
                       a->nheads, a->headdim, a->d_state);
    if ((size_t)a->batch * (size_t)a->seqlen > 0 &&
        (!a->q || !a->k || !a->v || !a->adt || !a->dt || !a->lam || !a->D ||
         !a->y))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3 ssm: NULL input or output");
    return MG_OK;
}

/* The step recurrence of one (b, h) sequence: hs [P][N], kp [N], vp [P]
 * hold the entering state and are left holding the final one. Writes y
 * when want_y; save (optional): [T][P][N], the state after every token.
 * The forward and the backward's recompute share this code, so the
 * recomputed states are bit-identical to the forward's. */
static void ssm_bh_run(const mg_m3_ssm_args *a, int b, int h, double *hs,
                       double *kp, double *vp, int want_y, double *save)
{
    const int T = a->seqlen, H = a->nheads, P = a->headdim, N = a->d_state;
    for (int t = 0; t < T; t++) {
        size_t tok = ((size_t)b * T + t) * H + h;
        const double *q = a->q + tok * N, *k = a->k + tok * N,
                     *v = a->v + tok * P;
        double dt = a->dt[tok], lam = a->lam[tok];
        double al = exp(a->adt[tok]);
        double be = (1.0 - lam) * dt * al, ga = lam * dt;
        for (int p = 0; p < P; p++) {
            double *row = hs + (size_t)p * N, acc = 0.0;
            for (int n = 0; n < N; n++) {
                row[n] = al * row[n] + be * vp[p] * kp[n] + ga * v[p] * k[n];
                acc += row[n] * q[n];
            }
            if (want_y) a->y[tok * P + p] = acc + a->D[h] * v[p];
        }
        if (save) memcpy(save + (size_t)t * P * N, hs, (size_t)P * N * sizeof *hs);
        memcpy(kp, k, (size_t)N * sizeof *kp);
        memcpy(vp, v, (size_t)P * sizeof *vp);
    }
}

/* Loads the entering state of (b, h) (zeros where the pointer is NULL). */
static void ssm_bh_load(const mg_m3_ssm_args *a, int b, int h, double *hs,
                        double *kp, double *vp)
{
    const int H = a->nheads, P = a->headdim, N = a->d_state;
    size_t bh = (size_t)b * H + h;
    for (size_t i = 0; i < (size_t)P * N; i++)
        hs[i] = a->ssm ? a->ssm[bh * P * N + i] : 0.0;
    for (int n = 0; n < N; n++) kp[n] = a->k_prev ? a->k_prev[bh * N + n] : 0.0;
    for (int p = 0; p < P; p++) vp[p] = a->v_prev ? a->v_prev[bh * P + p] : 0.0;
}

static mg_status ssm_step_core(const mg_m3_ssm_args *a)
{
    const int B = a->batch, H = a->nheads, P = a->headdim, N = a->d_state;
    double *hs = malloc(((size_t)P * N + N + P) * sizeof *hs);
    if (!hs) return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 ssm: out of memory");
    double *kp = hs + (size_t)P * N, *vp = kp + N;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
            ssm_bh_load(a, b, h, hs, kp, vp);
            ssm_bh_run(a, b, h, hs, kp, vp, 1, NULL);
            if (a->ssm) memcpy(a->ssm + bh * P * N, hs, (size_t)P * N * sizeof *hs);
            if (a->k_prev) memcpy(a->k_prev + bh * N, kp, (size_t)N * sizeof *kp);
            if (a->v_prev) memcpy(a->v_prev + bh * P, vp, (size_t)P * sizeof *vp);
        }
    free(hs);
    return MG_OK;
}

mg_status mg_ref_mamba3_ssm_step(const mg_m3_ssm_args *a)
{
    mg_status st = check_ssm_args(a);
    if (st != MG_OK) return st;
    return ssm_step_core(a);
}

mg_status mg_ref_mamba3_ssm_chunked(const mg_m3_ssm_args *a, int chunk)
{
    mg_status st = check_ssm_args(a);
    if (st != MG_OK) return st;
    if (chunk < 1)
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3 ssm: chunk %d < 1", chunk);
    const int B = a->batch, T = a->seqlen, H = a->nheads, P = a->headdim,
              N = a->d_state;
    double *hs = malloc(((size_t)P * N * 2 + 2 * (size_t)chunk) * sizeof *hs);
    if (!hs) return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 ssm: out of memory");
    double *sc = hs + (size_t)P * N, *cs = sc + (size_t)P * N, *scale = cs + chunk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
#define TOK(t) (((size_t)b * T + (t)) * H + h)
            for (size_t i = 0; i < (size_t)P * N; i++)
                hs[i] = a->ssm ? a->ssm[bh * P * N + i] : 0.0;
            if (T > 0 && a->k_prev && a->v_prev) {
                double w = (1.0 - a->lam[TOK(0)]) * a->dt[TOK(0)];
                for (int p = 0; p < P; p++)
                    for (int n = 0; n < N; n++)
                        hs[(size_t)p * N + n] +=
                            w * a->v_prev[bh * P + p] * a->k_prev[bh * N + n];
            }
            for (int c0 = 0; c0 < T; c0 += chunk) {
                int len = T - c0 < chunk ? T - c0 : chunk;
                double run = 0.0;
                for (int i = 0; i < len; i++) {
                    size_t tok = TOK(c0 + i);
                    run += a->adt[tok];
                    cs[i] = run;
                    double next = 0.0;
                    if (c0 + i + 1 < T) {
                        size_t nx = TOK(c0 + i + 1);
                        next = (1.0 - a->lam[nx]) * a->dt[nx];
                    }
                    scale[i] = a->lam[tok] * a->dt[tok] + next;
                }
                /* outputs */
                for (int i = 0; i < len; i++) {
                    size_t tok = TOK(c0 + i);
                    const double *q = a->q + tok * N, *k = a->k + tok * N,
                                 *v = a->v + tok * P;
                    double *y = a->y + tok * P;
                    double ecs = exp(cs[i]);
                    for (int p = 0; p < P; p++) {
                        double acc = 0.0;
                        for (int n = 0; n < N; n++) acc += hs[(size_t)p * N + n] * q[n];
                        y[p] = ecs * acc;
                    }
                    for (int s = 0; s < i; s++) {
                        size_t ts = TOK(c0 + s);
                        const double *ks = a->k + ts * N, *vs = a->v + ts * P;
                        double qk = 0.0;
                        for (int n = 0; n < N; n++) qk += q[n] * ks[n];
                        double w = exp(cs[i] - cs[s]) * scale[s] * qk;
                        for (int p = 0; p < P; p++) y[p] += w * vs[p];
                    }
                    double qk = 0.0;
                    for (int n = 0; n < N; n++) qk += q[n] * k[n];
                    double diag = a->D[h] + a->lam[tok] * a->dt[tok] * qk;
                    for (int p = 0; p < P; p++) y[p] += diag * v[p];
                }
                /* chunk state, passed on */
                memset(sc, 0, (size_t)P * N * sizeof *sc);
                for (int i = 0; i < len; i++) {
                    size_t tok = TOK(c0 + i);
                    const double *k = a->k + tok * N, *v = a->v + tok * P;
                    double w = exp(cs[len - 1] - cs[i]) * scale[i];
                    for (int p = 0; p < P; p++)
                        for (int n = 0; n < N; n++)
                            sc[(size_t)p * N + n] += w * v[p] * k[n];
                }
                double ee = exp(cs[len - 1]);
                for (size_t j = 0; j < (size_t)P * N; j++) hs[j] = ee * hs[j] + sc[j];
            }
            if (a->ssm) memcpy(a->ssm + bh * P * N, hs, (size_t)P * N * sizeof *hs);
            if (T > 0) {
                if (a->k_prev)
                    memcpy(a->k_prev + bh * N, a->k + TOK(T - 1) * N,
                           (size_t)N * sizeof *hs);
                if (a->v_prev)
                    memcpy(a->v_prev + bh * P, a->v + TOK(T - 1) * P,
                           (size_t)P * sizeof *hs);
            }
#undef TOK
        }
    free(hs);
    return MG_OK;
}

/* Reverse of ssm_step_core. a->ssm/k_prev/v_prev: the initial state (read
 * only here; NULL = zeros). The states after every token are recomputed
 * per (b, h) (T*P*N doubles at a time, not B*H*T*P*N per layer), by the
 * forward's own code. dy [B][T][H][P]; final
 * state grads dssmT [B][H][P][N], dkT [B][H][N], dvT [B][H][P] (NULL = 0).
 * Outputs (overwritten): dq, dk [B][T][H][N], dv [B][T][H][P], dadt, ddt,
 * dlam [B][T][H]; dD [H] is accumulated; dssm0, dk0, dv0 (NULL: dropped). */
static mg_status ssm_step_bwd(const mg_m3_ssm_args *a, const double *dy, const double *dssmT,
                              const double *dkT, const double *dvT,
                              double *dq, double *dk, double *dv, double *dadt,
                              double *ddt, double *dlam, double *dD,
                              double *dssm0, double *dk0, double *dv0)
{
    const int B = a->batch, T = a->seqlen, H = a->nheads, P = a->headdim,
              N = a->d_state;
    size_t PN = (size_t)P * N;
    double *dh = malloc((2 * PN + 4 * (size_t)N + 2 * (size_t)P) * sizeof *dh);
    double *hsv = malloc(((size_t)T * PN + PN + N + P) * sizeof *hsv);
    if (!dh || !hsv) {
        free(dh);
        free(hsv);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 ssm bwd: out of memory");
    }
    double *wh = hsv + (size_t)T * PN, *wk = wh + PN, *wv = wk + N;
    double *zero = dh + PN;                 /* PN + N + P zeros */
    double *dkp0 = zero + PN + N + P, *dvp0 = dkp0 + N;
    double *hk = dvp0 + P, *hv = hk + N;    /* dHs^T v [N], dHs^T v_prev [N] */
    memset(zero, 0, (PN + N + P) * sizeof *zero);
    size_t nt = (size_t)B * T * H;
    memset(dq, 0, nt * N * sizeof *dq);
    memset(dk, 0, nt * N * sizeof *dk);
    memset(dv, 0, nt * P * sizeof *dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
#define TOK(t) (((size_t)b * T + (t)) * H + h)
            const double *s0 = a->ssm ? a->ssm + bh * PN : zero;
            const double *k0 = a->k_prev ? a->k_prev + bh * N : zero;
            const double *v0 = a->v_prev ? a->v_prev + bh * P : zero;
            ssm_bh_load(a, b, h, wh, wk, wv);
            ssm_bh_run(a, b, h, wh, wk, wv, 0, hsv);
            for (size_t i = 0; i < PN; i++) dh[i] = dssmT ? dssmT[bh * PN + i] : 0.0;
            memset(dkp0, 0, (size_t)N * sizeof *dkp0);
            memset(dvp0, 0, (size_t)P * sizeof *dvp0);
            double *dkl = T > 0 ? dk + TOK(T - 1) * N : dkp0;
            double *dvl = T > 0 ? dv + TOK(T - 1) * P : dvp0;
            if (dkT) for (int n = 0; n < N; n++) dkl[n] += dkT[bh * N + n];
            if (dvT) for (int p = 0; p < P; p++) dvl[p] += dvT[bh * P + p];
            for (int t = T - 1; t >= 0; t--) {
                size_t tok = TOK(t);
                const double *q = a->q + tok * N, *k = a->k + tok * N,
                             *v = a->v + tok * P, *dyt = dy + tok * P;
                const double *hst = hsv + (size_t)t * PN;
                const double *hsp = t > 0 ? hsv + (size_t)(t - 1) * PN : s0;
                const double *kp = t > 0 ? a->k + TOK(t - 1) * N : k0;
                const double *vp = t > 0 ? a->v + TOK(t - 1) * P : v0;
                double *dkp = t > 0 ? dk + TOK(t - 1) * N : dkp0;
                double *dvp = t > 0 ? dv + TOK(t - 1) * P : dvp0;
                double dt = a->dt[tok], lam = a->lam[tok];
                double al = exp(a->adt[tok]);
                double be = (1.0 - lam) * dt * al, ga = lam * dt;
                /* y = Hs q + D v */
                for (int p = 0; p < P; p++) {
                    dD[h] += dyt[p] * v[p];
                    dv[tok * P + p] += a->D[h] * dyt[p];
                    for (int n = 0; n < N; n++) {
                        dh[(size_t)p * N + n] += dyt[p] * q[n];
                        dq[tok * N + n] += hst[(size_t)p * N + n] * dyt[p];
                    }
                }
                /* Hs = al Hsp + be vp kp^T + ga v k^T */
                double dal = 0.0, dbe = 0.0, dga = 0.0;
                for (int n = 0; n < N; n++) hk[n] = hv[n] = 0.0;
                for (int p = 0; p < P; p++) {
                    double rk = 0.0, rkp = 0.0;
                    for (int n = 0; n < N; n++) {
                        double g = dh[(size_t)p * N + n];
                        dal += g * hsp[(size_t)p * N + n];
                        rk += g * k[n];
                        rkp += g * kp[n];
                        hk[n] += g * v[p];
                        hv[n] += g * vp[p];
                    }
                    dga += v[p] * rk;
                    dbe += vp[p] * rkp;
                    dv[tok * P + p] += ga * rk;
                    dvp[p] += be * rkp;
                }
                for (int n = 0; n < N; n++) {
                    dk[tok * N + n] += ga * hk[n];
                    dkp[n] += be * hv[n];
                }
                for (size_t i = 0; i < PN; i++) dh[i] *= al;
                double daltot = dal + dbe * (1.0 - lam) * dt;
                dadt[tok] = daltot * al;
                ddt[tok] = dbe * (1.0 - lam) * al + dga * lam;
                dlam[tok] = -dbe * dt * al + dga * dt;
            }
            if (dssm0) memcpy(dssm0 + bh * PN, dh, PN * sizeof *dh);
            if (dk0) memcpy(dk0 + bh * N, dkp0, (size_t)N * sizeof *dh);
            if (dv0) memcpy(dv0 + bh * P, dvp0, (size_t)P * sizeof *dh);
#undef TOK
        }
    free(dh);
    free(hsv);
    return MG_OK;
}

/* ------------------------------------------------------------------ */
/* the forward                                                         */

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

static void acts_free(m3_acts *a)
{
    double **f[] = {&a->hin, &a->rin, &a->hn, &a->proj, &a->v, &a->dt, &a->A,
                    &a->adt, &a->lam, &a->rB, &a->rC, &a->kq, &a->qq, &a->kr,
                    &a->qr, &a->theta, &a->y, &a->ry, &a->g};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        free(*f[i]);
        *f[i] = NULL;
    }
}

static mg_status acts_alloc(m3_acts *a, const mg_m3_dims *d, size_t BT)
{
    memset(a, 0, sizeof *a);
    size_t D = (size_t)d->d_model, E = (size_t)d->d_inner, N = (size_t)d->d_state,
           H = (size_t)d->nheads, G = (size_t)d->ngroups, S = (size_t)d->n_angles,
           NP = mg_ref_mamba3_in_proj_dim(d);
    struct { double **p; size_t n; } t[] = {
        {&a->hin, BT * D}, {&a->rin, BT}, {&a->hn, BT * D}, {&a->proj, BT * NP},
        {&a->v, BT * E}, {&a->dt, BT * H}, {&a->A, BT * H}, {&a->adt, BT * H},
        {&a->lam, BT * H}, {&a->rB, BT * G}, {&a->rC, BT * G},
        {&a->kq, BT * H * N}, {&a->qq, BT * H * N}, {&a->kr, BT * H * N},
        {&a->qr, BT * H * N}, {&a->theta, BT * H * S},
        {&a->y, BT * E}, {&a->ry, BT * H},
        {&a->g, BT * E}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (t[i].n == 0) continue;
        *t[i].p = calloc(t[i].n, sizeof(double));
        if (!*t[i].p) {
            acts_free(a);
            return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
        }
    }
    return MG_OK;
}

/* State pointers of layer li (NULL stays NULL). */
typedef struct m3_lstate { double *ssm, *kp, *vp, *ang; } m3_lstate;

static m3_lstate lstate(const mg_m3_dims *d, int B, int li, double *ssm,
                        double *kp, double *vp, double *ang)
{
    size_t H = (size_t)d->nheads, P = (size_t)d->headdim, N = (size_t)d->d_state,
           S = (size_t)d->n_angles, L = (size_t)li * (size_t)B;
    m3_lstate s;
    s.ssm = ssm ? ssm + L * H * P * N : NULL;
    s.kp = kp ? kp + L * H * N : NULL;
    s.vp = vp ? vp + L * H * P : NULL;
    s.ang = ang ? ang + L * H * S : NULL;
    return s;
}

static void ssm_args_of(const mg_m3_dims *d, int B, int T, const m3_acts *a,
                        const double *Dd, m3_lstate st, mg_m3_ssm_args *s)
{
    s->batch = B;
    s->seqlen = T;
    s->nheads = d->nheads;
    s->headdim = d->headdim;
    s->d_state = d->d_state;
    s->q = a->qr;
    s->k = a->kr;
    s->v = a->v;
    s->adt = a->adt;
    s->dt = a->dt;
    s->lam = a->lam;
    s->D = Dd;
    s->y = a->y;
    s->ssm = st.ssm;
    s->k_prev = st.kp;
    s->v_prev = st.vp;
}

/* One layer: h [BT][D] is updated in place (h += mixer(norm(h))); the
 * state st is read and overwritten. a receives the activations. */
static mg_status layer_forward(const mg_m3_dims *d, const mg_m3_layer_off *o,
                               const double *w, int B, int T, double *h,
                               m3_lstate st, m3_acts *a,
                               double *Dd, double *tmp)
{
    const size_t D = (size_t)d->d_model, E = (size_t)d->d_inner,
                 N = (size_t)d->d_state, H = (size_t)d->nheads,
                 G = (size_t)d->ngroups, S = (size_t)d->n_angles,
                 P = (size_t)d->headdim, NP = mg_ref_mamba3_in_proj_dim(d),
                 BT = (size_t)B * T, HG = H / G;
    const size_t oB = 2 * E, oC = 2 * E + G * N, oDT = 2 * E + 2 * G * N,
                 oA = oDT + H, oTR = oA + H, oANG = oTR + H;
    const double eps = d->norm_eps;
    for (size_t bt = 0; bt < BT; bt++) {
        const double *x = h + bt * D;
        double *hin = a->hin + bt * D, *hn = a->hn + bt * D,
               *pr = a->proj + bt * NP;
        double ms = 0.0;
        for (size_t i = 0; i < D; i++) {
            hin[i] = x[i];
            ms += x[i] * x[i];
        }
        double r = 1.0 / sqrt(ms / (double)D + eps);
        a->rin[bt] = r;
        for (size_t i = 0; i < D; i++) hn[i] = x[i] * r * w[o->norm_w + i];
        for (size_t j = 0; j < NP; j++) {
            const double *wr = w + o->in_proj_w + j * D;
            double acc = 0.0;
            for (size_t i = 0; i < D; i++) acc += wr[i] * hn[i];
            pr[j] = acc;
        }
        for (size_t e = 0; e < E; e++) a->v[bt * E + e] = pr[E + e];
        for (size_t hh = 0; hh < H; hh++) {
            size_t th = bt * H + hh;
            double dt = softplus(pr[oDT + hh] + w[o->dt_bias + hh]);
            double act = a_act(d->a_activation, pr[oA + hh]);
            double A = -(act >= d->a_floor ? act : d->a_floor);
            a->dt[th] = dt;
            a->A[th] = A;
            a->adt[th] = A * dt;
            a->lam[th] = sigm(pr[oTR + hh]);
        }
        for (size_t g = 0; g < G; g++) {
            const double *Bg = pr + oB + g * N, *Cg = pr + oC + g * N;
            double sb = 0.0, sc = 0.0;
            for (size_t n = 0; n < N; n++) {
                sb += Bg[n] * Bg[n];
                sc += Cg[n] * Cg[n];
            }
            a->rB[bt * G + g] = 1.0 / sqrt(sb / (double)N + eps);
            a->rC[bt * G + g] = 1.0 / sqrt(sc / (double)N + eps);
        }
        for (size_t hh = 0; hh < H; hh++) {
            size_t g = hh / HG;
            const double *Bg = pr + oB + g * N, *Cg = pr + oC + g * N;
            double rb = a->rB[bt * G + g], rc = a->rC[bt * G + g];
            double *k = a->kq + (bt * H + hh) * N, *q = a->qq + (bt * H + hh) * N;
            for (size_t n = 0; n < N; n++) {
                k[n] = Bg[n] * rb * w[o->B_norm_w + n] + w[o->B_bias + hh * N + n];
                q[n] = Cg[n] * rc * w[o->C_norm_w + n] + w[o->C_bias + hh * N + n];
            }
        }
    }
    /* angles (sequential in t) and rotation */
    for (int b = 0; b < B; b++)
        for (size_t hh = 0; hh < H; hh++) {
            for (size_t s = 0; s < S; s++)
                tmp[s] = st.ang ? st.ang[((size_t)b * H + hh) * S + s] : 0.0;
            for (int t = 0; t < T; t++) {
                size_t bt = (size_t)b * T + t, th = bt * H + hh;
                const double *pr = a->proj + bt * NP;
                const double *k = a->kq + th * N, *q = a->qq + th * N;
                double *kr = a->kr + th * N, *qr = a->qr + th * N;
                for (size_t s = 0; s < S; s++) {
                    tmp[s] = wrap2pi(tmp[s] + M3_PI * tanh(pr[oANG + s]) * a->dt[th]);
                    a->theta[th * S + s] = tmp[s];
                    double c = cos(tmp[s]), sn = sin(tmp[s]);
                    kr[2 * s] = c * k[2 * s] - sn * k[2 * s + 1];
                    kr[2 * s + 1] = sn * k[2 * s] + c * k[2 * s + 1];
                    qr[2 * s] = c * q[2 * s] - sn * q[2 * s + 1];
                    qr[2 * s + 1] = sn * q[2 * s] + c * q[2 * s + 1];
                }
                for (size_t n = 2 * S; n < N; n++) {
                    kr[n] = k[n];
                    qr[n] = q[n];
                }
            }
            if (st.ang && T > 0)
                for (size_t s = 0; s < S; s++)
                    st.ang[((size_t)b * H + hh) * S + s] = tmp[s];
        }
    /* SSM */
    for (size_t hh = 0; hh < H; hh++) Dd[hh] = w[o->D + hh];
    mg_m3_ssm_args sa;
    ssm_args_of(d, B, T, a, Dd, st, &sa);
    mg_status rc = ssm_step_core(&sa);
    if (rc != MG_OK) return rc;
    /* gate, out_proj, residual */
    for (size_t bt = 0; bt < BT; bt++) {
        const double *y = a->y + bt * E, *z = a->proj + bt * NP;
        double *g = a->g + bt * E;
        for (size_t hh = 0; hh < H; hh++) {
            double ry = 1.0;
            if (d->outproj_norm) {
                double ms = 0.0;
                for (size_t p = 0; p < P; p++) ms += y[hh * P + p] * y[hh * P + p];
                ry = 1.0 / sqrt(ms / (double)P + eps);
                a->ry[bt * H + hh] = ry;
            }
            for (size_t p = 0; p < P; p++) {
                size_t e = hh * P + p;
                double gw = d->outproj_norm ? ry * w[o->norm_gate_w + e] : 1.0;
                g[e] = y[e] * gw * silu(z[e]);
            }
        }
        double *x = h + bt * D;
        for (size_t i = 0; i < D; i++) {
            const double *wr = w + o->out_proj_w + i * E;
            double acc = 0.0;
            for (size_t e = 0; e < E; e++) acc += wr[e] * g[e];
            x[i] += acc;
        }
    }
    return MG_OK;
}

/* The one forward. acts: n_layers entries when save (each layer keeps its
 * activations and SSM states), else one scratch reused. h: [BT][D], left
 * holding the input of norm_f; rf [BT] its rms factors. */
static mg_status m3_forward_run(const mg_m3_dims *d, const mg_m3_layout *l,
                                const double *w, int B, int T, const double *u,
                                double *out, double *ssm, double *kp, double *vp,
                                double *ang, m3_acts *acts, int save, double *h,
                                double *rf)
{
    const size_t D = (size_t)d->d_model, BT = (size_t)B * T;
    const size_t I = d->input_dim > 0 ? (size_t)d->input_dim : D;
    size_t sz = (size_t)d->nheads + (size_t)d->n_angles + 1;
    double *scratch = malloc(sz * sizeof *scratch);
    if (!scratch) return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
    double *Dd = scratch, *tmp = scratch + d->nheads;
    for (size_t bt = 0; bt < BT; bt++) {
        const double *x = u + bt * I;
        for (size_t i = 0; i < D; i++) {
            if (d->input_dim > 0) {
                const double *wr = w + l->input_proj_w + i * I;
                double acc = w[l->input_proj_b + i];
                for (size_t j = 0; j < I; j++) acc += wr[j] * x[j];
                h[bt * D + i] = acc;
            } else {
                h[bt * D + i] = x[i];
            }
        }
    }
    mg_status rc = MG_OK;
    for (int li = 0; li < d->n_layers && rc == MG_OK; li++)
        rc = layer_forward(d, &l->layers[li], w, B, T, h,
                           lstate(d, B, li, ssm, kp, vp, ang),
                           save ? &acts[li] : &acts[0], Dd, tmp);
    free(scratch);
    if (rc != MG_OK) return rc;
    for (size_t bt = 0; bt < BT; bt++) {
        const double *x = h + bt * D;
        double ms = 0.0;
        for (size_t i = 0; i < D; i++) ms += x[i] * x[i];
        double r = 1.0 / sqrt(ms / (double)D + d->norm_eps);
        rf[bt] = r;
        if (out)
            for (size_t i = 0; i < D; i++)
                out[bt * D + i] = x[i] * r * w[l->norm_f_w + i];
    }
    return MG_OK;
}

static mg_status check_call(const mg_m3_dims *d, const mg_m3_layout *l,
                            const void *blob, int batch, int seqlen,
                            const void *u)
{
    mg_status st = check_dims(d);
    if (st != MG_OK) return st;
    if (!l || !blob || (d->n_layers > 0 && !l->layers))
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: NULL layout or blob");
    if (batch < 0 || seqlen < 0)
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: batch %d, seqlen %d", batch,
                       seqlen);
    if ((size_t)batch * seqlen > 0 && !u)
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3: u is NULL");
    return MG_OK;
}

/* f32 -> f64 copies of the blob and the input (the f32 entry points). */
static mg_status widen(const mg_m3_dims *d, const mg_m3_layout *l,
                       const float *blob, int batch, int seqlen, const float *u,
                       double **wb, double **ub)
{
    size_t nu = (size_t)batch * seqlen *
                (size_t)(d->input_dim > 0 ? d->input_dim : d->d_model);
    *wb = malloc((l->total ? l->total : 1) * sizeof **wb);
    *ub = malloc((nu ? nu : 1) * sizeof **ub);
    if (!*wb || !*ub) {
        free(*wb);
        free(*ub);
        *wb = *ub = NULL;
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
    }
    for (size_t i = 0; i < l->total; i++) (*wb)[i] = blob[i];
    for (size_t i = 0; i < nu; i++) (*ub)[i] = u[i];
    return MG_OK;
}

mg_status mg_ref_mamba3_forward(const mg_m3_dims *d, const mg_m3_layout *l,
                                const float *blob, int batch, int seqlen,
                                const float *u, double *out, double *ssm,
                                double *k_prev, double *v_prev, double *angle)
{
    mg_status rc = check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    double *wb, *ub;
    rc = widen(d, l, blob, batch, seqlen, u, &wb, &ub);
    if (rc != MG_OK) return rc;
    rc = mg_ref_mamba3_forward_f64(d, l, wb, batch, seqlen, ub, out, ssm, k_prev,
                                   v_prev, angle);
    free(wb);
    free(ub);
    return rc;
}

mg_status mg_ref_mamba3_forward_f64(const mg_m3_dims *d, const mg_m3_layout *l,
                                    const double *blob, int batch, int seqlen,
                                    const double *u, double *out, double *ssm,
                                    double *k_prev, double *v_prev, double *angle)
{
    mg_status rc = check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    size_t BT = (size_t)batch * seqlen, D = (size_t)d->d_model;
    m3_acts acts;
    rc = acts_alloc(&acts, d, BT);
    if (rc != MG_OK) return rc;
    double *h = malloc((BT * D + BT + 1) * sizeof *h);
    if (!h) {
        acts_free(&acts);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
    }
    rc = m3_forward_run(d, l, blob, batch, seqlen, u, out, ssm, k_prev, v_prev,
                        angle, &acts, 0, h, h + BT * D);
    free(h);
    acts_free(&acts);
    return rc;
}

/* ------------------------------------------------------------------ */
/* the backward                                                        */

/* RMSNorm backward: y = x * r * w, r = 1/sqrt(mean(x^2) + eps) (given).
 * dw += dy*x*r (if dw); dx = (or +=, if add) r*w*dy - r^3/n * x * sum(dy*w*x).
 * w == NULL: weight 1. dx may be dy itself. */
static void rms_bwd(size_t n, const double *x, double r, const double *w,
                    const double *dy, double *dw, double *dx, int add)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double wi = w ? (double)w[i] : 1.0;
        if (dw) dw[i] += dy[i] * x[i] * r;
        s += dy[i] * wi * x[i];
    }
    double c = r * r * r * s / (double)n;
    for (size_t i = 0; i < n; i++) {
        double wi = w ? (double)w[i] : 1.0;
        double g = r * wi * dy[i] - c * x[i];
        dx[i] = add ? dx[i] + g : g;
    }
}

/* Backward of one layer. dh [BT][D]: in: d loss/d layer output; out:
 * d loss/d layer input. */
static mg_status layer_backward(const mg_m3_dims *d, const mg_m3_layer_off *o,
                                const double *w, int B, int T, const m3_acts *a,
                                m3_lstate st0, m3_lstate dstT, m3_lstate dst0,
                                double *dh, double *dw)
{
    const size_t D = (size_t)d->d_model, E = (size_t)d->d_inner,
                 N = (size_t)d->d_state, H = (size_t)d->nheads,
                 G = (size_t)d->ngroups, S = (size_t)d->n_angles,
                 P = (size_t)d->headdim, NP = mg_ref_mamba3_in_proj_dim(d),
                 BT = (size_t)B * T, HG = H / G;
    const size_t oB = 2 * E, oC = 2 * E + G * N, oDT = 2 * E + 2 * G * N,
                 oA = oDT + H, oTR = oA + H, oANG = oTR + H;
    double *dproj, *dy, *dq, *dk, *dv, *dadt, *ddt, *dlam, *Dd, *tmp;
    size_t sizes[] = {BT * NP, BT * E, BT * H * N, BT * H * N, BT * E, BT * H,
                      BT * H, BT * H};
    double **ptrs[] = {&dproj, &dy, &dq, &dk, &dv, &dadt, &ddt, &dlam};
    size_t tot = 0;
    for (int i = 0; i < 8; i++) tot += sizes[i];
    tot += H + D + 2 * G * N + 2 * S + E;
    double *mem = calloc(tot ? tot : 1, sizeof *mem);
    if (!mem) return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 bwd: out of memory");
    double *pos = mem;
    for (int i = 0; i < 8; i++) {
        *ptrs[i] = pos;
        pos += sizes[i];
    }
    Dd = pos;
    pos += H;
    tmp = pos; /* D + 2GN + 2S + E */
    double *dhn = tmp, *dBh = tmp + D, *dCh = dBh + G * N, *dth = dCh + G * N,
           *dgv = dth + 2 * S;

    /* out_proj and gate */
    for (size_t bt = 0; bt < BT; bt++) {
        const double *dmo = dh + bt * D, *g = a->g + bt * E, *y = a->y + bt * E,
                     *z = a->proj + bt * NP;
        double *dz = dproj + bt * NP, *dyt = dy + bt * E;
        for (size_t e = 0; e < E; e++) dgv[e] = 0.0;
        for (size_t i = 0; i < D; i++) {
            const double *wr = w + o->out_proj_w + i * E;
            double *dwr = dw + o->out_proj_w + i * E;
            for (size_t e = 0; e < E; e++) {
                dwr[e] += dmo[i] * g[e];
                dgv[e] += wr[e] * dmo[i];
            }
        }
        for (size_t hh = 0; hh < H; hh++) {
            if (d->outproj_norm) {
                double ry = a->ry[bt * H + hh];
                for (size_t p = 0; p < P; p++) {
                    size_t e = hh * P + p;
                    double gw = (double)w[o->norm_gate_w + e];
                    double un = y[e] * ry * gw;
                    dz[e] = dgv[e] * un * dsilu(z[e]);
                    dyt[e] = dgv[e] * silu(z[e]);  /* d loss / d un */
                }
                /* un = y * ry * gw: RMSNorm backward over the head (dx may
                 * alias dy in rms_bwd) */
                rms_bwd(P, y + hh * P, ry, w + o->norm_gate_w + hh * P,
                        dyt + hh * P, dw + o->norm_gate_w + hh * P,
                        dyt + hh * P, 0);
            } else {
                for (size_t p = 0; p < P; p++) {
                    size_t e = hh * P + p;
                    dz[e] = dgv[e] * y[e] * dsilu(z[e]);
                    dyt[e] = dgv[e] * silu(z[e]);
                }
            }
        }
    }

    /* SSM, reverse */
    for (size_t hh = 0; hh < H; hh++) Dd[hh] = w[o->D + hh];
    mg_m3_ssm_args sa;
    ssm_args_of(d, B, T, a, Dd, st0, &sa);
    double *dD = calloc(H, sizeof *dD);
    if (!dD) {
        free(mem);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 bwd: out of memory");
    }
    mg_status rc = ssm_step_bwd(&sa, dy, dstT.ssm, dstT.kp, dstT.vp, dq, dk,
                                dv, dadt, ddt, dlam, dD, dst0.ssm, dst0.kp,
                                dst0.vp);
    for (size_t hh = 0; hh < H; hh++) dw[o->D + hh] += dD[hh];
    free(dD);
    if (rc != MG_OK) {
        free(mem);
        return rc;
    }

    /* angles and rotation, reverse; dk/dq become grads of the unrotated k, q */
    for (int b = 0; b < B; b++)
        for (size_t hh = 0; hh < H; hh++) {
            size_t bhS = ((size_t)b * H + hh) * S;
            for (size_t s = 0; s < S; s++) dth[s] = dstT.ang ? dstT.ang[bhS + s] : 0.0;
            for (int ti = T - 1; ti >= 0; ti--) {
                size_t bt = (size_t)b * T + ti, th = bt * H + hh;
                const double *kr = a->kr + th * N, *qr = a->qr + th * N,
                             *pr = a->proj + bt * NP;
                double *dkr = dk + th * N, *dqr = dq + th * N;
                for (size_t s = 0; s < S; s++) {
                    dth[s] += -dkr[2 * s] * kr[2 * s + 1] + dkr[2 * s + 1] * kr[2 * s]
                              - dqr[2 * s] * qr[2 * s + 1] + dqr[2 * s + 1] * qr[2 * s];
                    double c = cos(a->theta[th * S + s]), sn = sin(a->theta[th * S + s]);
                    double k0 = c * dkr[2 * s] + sn * dkr[2 * s + 1];
                    double k1 = -sn * dkr[2 * s] + c * dkr[2 * s + 1];
                    double q0 = c * dqr[2 * s] + sn * dqr[2 * s + 1];
                    double q1 = -sn * dqr[2 * s] + c * dqr[2 * s + 1];
                    dkr[2 * s] = k0;
                    dkr[2 * s + 1] = k1;
                    dqr[2 * s] = q0;
                    dqr[2 * s + 1] = q1;
                    double tn = tanh(pr[oANG + s]);
                    dproj[bt * NP + oANG + s] += dth[s] * M3_PI * (1.0 - tn * tn) * a->dt[th];
                    ddt[th] += dth[s] * M3_PI * tn;
                }
            }
            if (dst0.ang)
                for (size_t s = 0; s < S; s++) dst0.ang[bhS + s] = dth[s];
        }

    /* per token: scalars, BCNorm, x, in_proj, pre-norm */
    for (size_t bt = 0; bt < BT; bt++) {
        const double *pr = a->proj + bt * NP;
        double *dp = dproj + bt * NP;
        for (size_t hh = 0; hh < H; hh++) {
            size_t th = bt * H + hh;
            double DT = a->dt[th], A = a->A[th], lam = a->lam[th];
            double dDT = ddt[th] + dadt[th] * A;
            double dA = dadt[th] * DT;
            double pre = pr[oDT + hh] + w[o->dt_bias + hh];
            double dpre = dDT * dsoftplus(pre);
            dp[oDT + hh] += dpre;
            dw[o->dt_bias + hh] += dpre;
            double act = a_act(d->a_activation, pr[oA + hh]);
            if (act >= d->a_floor)
                dp[oA + hh] += -dA * da_act(d->a_activation, pr[oA + hh]);
            dp[oTR + hh] += dlam[th] * lam * (1.0 - lam);
        }
        for (size_t i = 0; i < 2 * G * N; i++) dBh[i] = 0.0;
        for (size_t hh = 0; hh < H; hh++) {
            size_t g = hh / HG, th = bt * H + hh;
            for (size_t n = 0; n < N; n++) {
                dw[o->B_bias + hh * N + n] += dk[th * N + n];
                dw[o->C_bias + hh * N + n] += dq[th * N + n];
                dBh[g * N + n] += dk[th * N + n];
                dCh[g * N + n] += dq[th * N + n];
            }
        }
        for (size_t g = 0; g < G; g++) {
            rms_bwd(N, pr + oB + g * N, a->rB[bt * G + g], w + o->B_norm_w,
                    dBh + g * N, dw + o->B_norm_w, dp + oB + g * N, 1);
            rms_bwd(N, pr + oC + g * N, a->rC[bt * G + g], w + o->C_norm_w,
                    dCh + g * N, dw + o->C_norm_w, dp + oC + g * N, 1);
        }
        for (size_t e = 0; e < E; e++) dp[E + e] += dv[bt * E + e];
        /* in_proj */
        const double *hn = a->hn + bt * D;
        for (size_t i = 0; i < D; i++) dhn[i] = 0.0;
        for (size_t j = 0; j < NP; j++) {
            const double *wr = w + o->in_proj_w + j * D;
            double *dwr = dw + o->in_proj_w + j * D;
            for (size_t i = 0; i < D; i++) {
                dwr[i] += dp[j] * hn[i];
                dhn[i] += wr[i] * dp[j];
            }
        }
        rms_bwd(D, a->hin + bt * D, a->rin[bt], w + o->norm_w, dhn,
                dw + o->norm_w, dh + bt * D, 1);
    }
    free(mem);
    return MG_OK;
}

mg_status mg_ref_mamba3_backward(const mg_m3_dims *d, const mg_m3_layout *l,
                                 const float *blob, int batch, int seqlen,
                                 const float *u, const double *ssm0,
                                 const double *k_prev0, const double *v_prev0,
                                 const double *angle0, const double *dout,
                                 const double *dssm_T, const double *dk_prev_T,
                                 const double *dv_prev_T, const double *dangle_T,
                                 double *out, double *dblob, double *du,
                                 double *dssm0, double *dk_prev0,
                                 double *dv_prev0, double *dangle0)
{
    mg_status rc = check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    double *wb, *ub;
    rc = widen(d, l, blob, batch, seqlen, u, &wb, &ub);
    if (rc != MG_OK) return rc;
    rc = mg_ref_mamba3_backward_f64(d, l, wb, batch, seqlen, ub, ssm0, k_prev0,
                                    v_prev0, angle0, dout, dssm_T, dk_prev_T,
                                    dv_prev_T, dangle_T, out, dblob, du, dssm0,
                                    dk_prev0, dv_prev0, dangle0);
    free(wb);
    free(ub);
    return rc;
}

mg_status mg_ref_mamba3_backward_f64(const mg_m3_dims *d, const mg_m3_layout *l,
                                     const double *blob, int batch, int seqlen,
                                     const double *u, const double *ssm0,
                                     const double *k_prev0, const double *v_prev0,
                                     const double *angle0, const double *dout,
                                     const double *dssm_T, const double *dk_prev_T,
                                     const double *dv_prev_T, const double *dangle_T,
                                     double *out, double *dblob, double *du,
                                     double *dssm0, double *dk_prev0,
                                     double *dv_prev0, double *dangle0)
{
    mg_status rc = check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    const size_t BT = (size_t)batch * seqlen, D = (size_t)d->d_model,
                 L = (size_t)d->n_layers, Bs = (size_t)batch,
                 H = (size_t)d->nheads, P = (size_t)d->headdim,
                 N = (size_t)d->d_state, S = (size_t)d->n_angles;
    const size_t I = d->input_dim > 0 ? (size_t)d->input_dim : D;
    if (!dblob) return mg_fail(MG_ERR_INVALID_ARG, "mamba3 bwd: dblob is NULL");
    if (BT > 0 && !dout) return mg_fail(MG_ERR_INVALID_ARG, "mamba3 bwd: dout is NULL");
    const size_t nS = L * Bs * H * P * N, nK = L * Bs * H * N, nV = L * Bs * H * P,
                 nA = L * Bs * H * S;
    /* working copies of the initial state: the forward overwrites them;
     * the backward needs the initial values (st0) */
    size_t nst = 2 * (nS + nK + nV + nA);
    double *stm = calloc(nst ? nst : 1, sizeof *stm);
    double *h = malloc((BT * D + BT + 1) * sizeof *h);
    m3_acts *acts = calloc(L ? L : 1, sizeof *acts);
    size_t nalloc = 0;
    if (!stm || !h || !acts) {
        rc = mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 bwd: out of memory");
        goto done;
    }
    double *s0 = stm, *k0 = s0 + nS, *v0 = k0 + nK, *a0 = v0 + nV;
    double *s1 = a0 + nA, *k1 = s1 + nS, *v1 = k1 + nK, *a1 = v1 + nV;
    if (ssm0) memcpy(s0, ssm0, nS * sizeof *s0);
    if (k_prev0) memcpy(k0, k_prev0, nK * sizeof *k0);
    if (v_prev0) memcpy(v0, v_prev0, nV * sizeof *v0);
    if (angle0) memcpy(a0, angle0, nA * sizeof *a0);
    memcpy(s1, s0, (nS + nK + nV + nA) * sizeof *s1);
    for (; nalloc < L; nalloc++) {
        rc = acts_alloc(&acts[nalloc], d, BT);
        if (rc != MG_OK) goto done;
    }
    double *rf = h + BT * D;
    rc = m3_forward_run(d, l, blob, batch, seqlen, u, out, s1, k1, v1, a1, acts,
                        1, h, rf);
    if (rc != MG_OK) goto done;

    memset(dblob, 0, l->total * sizeof *dblob);
    /* norm_f: h now holds d loss / d h */
    for (size_t bt = 0; bt < BT; bt++)
        rms_bwd(D, h + bt * D, rf[bt], blob + l->norm_f_w, dout + bt * D,
                dblob + l->norm_f_w, h + bt * D, 0);
    for (size_t li = L; li-- > 0;) {
        m3_lstate st0 = lstate(d, batch, (int)li, s0, k0, v0, a0);
        m3_lstate dT = lstate(d, batch, (int)li, (double *)dssm_T,
                              (double *)dk_prev_T, (double *)dv_prev_T,
                              (double *)dangle_T);
        m3_lstate d0 = lstate(d, batch, (int)li, dssm0, dk_prev0, dv_prev0, dangle0);
        rc = layer_backward(d, &l->layers[li], blob, batch, seqlen, &acts[li],
                            st0, dT, d0, h, dblob);
        if (rc != MG_OK) goto done;
    }
    /* input_proj */
    for (size_t bt = 0; bt < BT; bt++) {
        const double *dh = h + bt * D;
        if (d->input_dim > 0) {
            const double *x = u + bt * I;
            if (du)
                for (size_t j = 0; j < I; j++) du[bt * I + j] = 0.0;
            for (size_t i = 0; i < D; i++) {
                dblob[l->input_proj_b + i] += dh[i];
                for (size_t j = 0; j < I; j++) {
                    dblob[l->input_proj_w + i * I + j] += dh[i] * x[j];
                    if (du) du[bt * I + j] += blob[l->input_proj_w + i * I + j] * dh[i];
                }
            }
        } else if (du) {
            memcpy(du + bt * D, dh, D * sizeof *dh);
        }
    }
done:
    for (size_t i = 0; i < nalloc; i++) acts_free(&acts[i]);
    free(acts);
    free(h);
    free(stm);
    return rc;
}
