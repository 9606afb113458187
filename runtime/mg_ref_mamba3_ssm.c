/* mg_ref_mamba3_ssm.c: the SSM core of the Mamba-3 SISO reference
 * (mg_ref_mamba3_impl.h): the step recurrence of doc/math.md, its reverse
 * (states recomputed by the forward's own code), and the f64 evaluator of
 * the chunked form, the blueprint of the GPU chunked kernels. */
#include "mg_ref_mamba3_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

mg_status m3_ssm_step_core(const mg_m3_ssm_args *a)
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
    return m3_ssm_step_core(a);
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

/* Reverse of m3_ssm_step_core. a->ssm/k_prev/v_prev: the initial state (read
 * only here; NULL = zeros). The states after every token are recomputed
 * per (b, h) (T*P*N doubles at a time, not B*H*T*P*N per layer), by the
 * forward's own code. dy [B][T][H][P]; final
 * state grads dssmT [B][H][P][N], dkT [B][H][N], dvT [B][H][P] (NULL = 0).
 * Outputs (overwritten): dq, dk [B][T][H][N], dv [B][T][H][P], dadt, ddt,
 * dlam [B][T][H]; dD [H] is accumulated; dssm0, dk0, dv0 (NULL: dropped). */
mg_status m3_ssm_step_bwd(const mg_m3_ssm_args *a, const double *dy, const double *dssmT,
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
