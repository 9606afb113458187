/* mg_ref_mamba3_fwd.c: the forward of the Mamba-3 SISO reference
 * (mg_ref_mamba3_impl.h): one layer, the one forward run (shared with the
 * backward, which keeps every layer's activations), and the f32 and f64
 * entry points. */
#include "mg_ref_mamba3_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* theta mod 2pi, in [0, 2pi). */
static double wrap2pi(double th)
{
    th = fmod(th, M3_2PI);
    if (th < 0) th += M3_2PI;
    if (th >= M3_2PI) th -= M3_2PI;
    return th;
}

/* ------------------------------------------------------------------ */
/* the forward                                                         */

void m3_acts_free(m3_acts *a)
{
    double **f[] = {&a->hin, &a->rin, &a->hn, &a->proj, &a->v, &a->dt, &a->A,
                    &a->adt, &a->lam, &a->rB, &a->rC, &a->kq, &a->qq, &a->kr,
                    &a->qr, &a->theta, &a->y, &a->ry, &a->g};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        free(*f[i]);
        *f[i] = NULL;
    }
}

mg_status m3_acts_alloc(m3_acts *a, const mg_m3_dims *d, size_t BT)
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
            m3_acts_free(a);
            return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
        }
    }
    return MG_OK;
}

m3_lstate m3_layer_state(const mg_m3_dims *d, int B, int li, double *ssm,
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

void m3_ssm_args_of(const mg_m3_dims *d, int B, int T, const m3_acts *a,
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
    M3_SIZES(d, B, T);
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
    m3_ssm_args_of(d, B, T, a, Dd, st, &sa);
    mg_status rc = m3_ssm_step_core(&sa);
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
mg_status m3_forward_run(const mg_m3_dims *d, const mg_m3_layout *l,
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
                           m3_layer_state(d, B, li, ssm, kp, vp, ang),
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

mg_status m3_check_call(const mg_m3_dims *d, const mg_m3_layout *l,
                        const void *blob, int batch, int seqlen,
                        const void *u)
{
    mg_status st = m3_check_dims(d);
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

/* The f32 entry points' call checked (m3_check_call), then f64 copies of
 * the blob and the input. */
mg_status m3_widen(const mg_m3_dims *d, const mg_m3_layout *l,
                   const float *blob, int batch, int seqlen, const float *u,
                   double **wb, double **ub)
{
    *wb = *ub = NULL;
    mg_status rc = m3_check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
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
    double *wb, *ub;
    mg_status rc = m3_widen(d, l, blob, batch, seqlen, u, &wb, &ub);
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
    mg_status rc = m3_check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    size_t BT = (size_t)batch * seqlen, D = (size_t)d->d_model;
    m3_acts acts;
    rc = m3_acts_alloc(&acts, d, BT);
    if (rc != MG_OK) return rc;
    double *h = malloc((BT * D + BT + 1) * sizeof *h);
    if (!h) {
        m3_acts_free(&acts);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3: out of memory");
    }
    rc = m3_forward_run(d, l, blob, batch, seqlen, u, out, ssm, k_prev, v_prev,
                        angle, &acts, 0, h, h + BT * D);
    free(h);
    m3_acts_free(&acts);
    return rc;
}
