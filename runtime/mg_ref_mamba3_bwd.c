/* mg_ref_mamba3_bwd.c: the backward of the Mamba-3 SISO reference
 * (mg_ref_mamba3_impl.h): reverse mode through the layers of the forward
 * run, and the f32 and f64 entry points. */
#include "mg_ref_mamba3_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Backward of y = W x for W [rows][cols] at w: dW += dy x^T (into dw) and
 * dx += W^T dy, row by row. */
static void linear_bwd(const double *w, double *dw, const double *x, const double *dy, double *dx,
                       size_t rows, size_t cols)
{
    for (size_t i = 0; i < rows; i++) {
        const double *wr = w + i * cols;
        double *dwr = dw + i * cols;
        for (size_t e = 0; e < cols; e++) {
            dwr[e] += dy[i] * x[e];
            dx[e] += wr[e] * dy[i];
        }
    }
}

/* Backward of one layer. dh [BT][D]: in: d loss/d layer output; out:
 * d loss/d layer input. */
static mg_status layer_backward(const mg_m3_dims *d, const mg_m3_layer_off *o,
                                const double *w, int B, int T, const m3_acts *a,
                                m3_lstate st0, m3_lstate dstT, m3_lstate dst0,
                                double *dh, double *dw)
{
    M3_SIZES(d, B, T);
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
        linear_bwd(w + o->out_proj_w, dw + o->out_proj_w, g, dmo, dgv, D, E);
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
    m3_ssm_args_of(d, B, T, a, Dd, st0, &sa);
    double *dD = calloc(H, sizeof *dD);
    if (!dD) {
        free(mem);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "mamba3 bwd: out of memory");
    }
    mg_status rc = m3_ssm_step_bwd(&sa, dy, dstT.ssm, dstT.kp, dstT.vp, dq, dk,
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
        linear_bwd(w + o->in_proj_w, dw + o->in_proj_w, hn, dp, dhn, NP, D);
        rms_bwd(D, a->hin + bt * D, a->rin[bt], w + o->norm_w, dhn,
                dw + o->norm_w, dh + bt * D, 1);
    }
    free(mem);
    return MG_OK;
}

mg_status m3_check_bwd_call(const mg_m3_dims *d, const mg_m3_layout *l,
                            const void *blob, int batch, int seqlen, const void *u,
                            const double *dout, const double *dblob)
{
    mg_status rc = m3_check_call(d, l, blob, batch, seqlen, u);
    if (rc != MG_OK) return rc;
    if (!dblob) return mg_fail(MG_ERR_INVALID_ARG, "mamba3 bwd: dblob is NULL");
    if ((size_t)batch * seqlen > 0 && !dout)
        return mg_fail(MG_ERR_INVALID_ARG, "mamba3 bwd: dout is NULL");
    return MG_OK;
}

mg_status mg_ref_mamba3_backward_f64(const mg_m3_dims *d, const mg_m3_layout *l,
                                     const double *blob, int batch, int seqlen,
                                     const double *u, MG_M3_BWD_STATES)
{
    mg_status rc = m3_check_bwd_call(d, l, blob, batch, seqlen, u, dout, dblob);
    if (rc != MG_OK) return rc;
    const size_t BT = (size_t)batch * seqlen, D = (size_t)d->d_model,
                 L = (size_t)d->n_layers, Bs = (size_t)batch,
                 H = (size_t)d->nheads, P = (size_t)d->headdim,
                 N = (size_t)d->d_state, S = (size_t)d->n_angles;
    const size_t I = d->input_dim > 0 ? (size_t)d->input_dim : D;
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
        rc = m3_acts_alloc(&acts[nalloc], d, BT);
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
        m3_lstate st0 = m3_layer_state(d, batch, (int)li, s0, k0, v0, a0);
        m3_lstate dT = m3_layer_state(d, batch, (int)li, (double *)dssm_T,
                              (double *)dk_prev_T, (double *)dv_prev_T,
                              (double *)dangle_T);
        m3_lstate d0 = m3_layer_state(d, batch, (int)li, dssm0, dk_prev0, dv_prev0, dangle0);
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
    for (size_t i = 0; i < nalloc; i++) m3_acts_free(&acts[i]);
    free(acts);
    free(h);
    free(stm);
    return rc;
}

mg_status mg_ref_mamba3_backward(const mg_m3_dims *d, const mg_m3_layout *l,
                                 const float *blob, int batch, int seqlen,
                                 const float *u, MG_M3_BWD_STATES)
{
    double *wb, *ub;
    mg_status rc = m3_widen(d, l, blob, batch, seqlen, u, &wb, &ub);
    if (rc != MG_OK) return rc;
    rc = mg_ref_mamba3_backward_f64(d, l, wb, batch, seqlen, ub, ssm0, k_prev0,
                                    v_prev0, angle0, dout, dssm_T, dk_prev_T,
                                    dv_prev_T, dangle_T, out, dblob, du, dssm0,
                                    dk_prev0, dv_prev0, dangle0);
    free(wb);
    free(ub);
    return rc;
}
