/* mg_ref_mamba3_seqs.c: the Mamba-3 SISO reference entry points with
 * episode starts and packed sequences (mg_ref_mamba3.h, mg_ref_seqs.h;
 * doc/math.md "Episode starts and packed sequences"). A call runs as its
 * segments, each a plain forward or backward of batch 1 on its rows, with
 * the segment drivers of mg_ref_seqs.c routing the four states (ssm,
 * k_prev, v_prev, angle) and their gradients: the hand split, literally,
 * so the results are bit-identical to it. */
#include "mg_ref_mamba3_impl.h"
#include "mg_ref_seqs_impl.h"

#include <stdlib.h>
#include <string.h>

/* What a segment's plain call needs: the weights, the call's token rows
 * (u, out, dout, du: any optional one may be NULL). */
typedef struct m3_seg_ctx {
    const mg_m3_dims *d;
    const mg_m3_layout *l;
    const double *w, *u, *dout;
    double *out, *du;
    size_t in_dim, D;
} m3_seg_ctx;

static m3_seg_ctx m3_seg_ctx_of(const mg_m3_dims *d, const mg_m3_layout *l,
                                const double *w, const double *u, double *out,
                                const double *dout, double *du)
{
    m3_seg_ctx c = { d, l, w, u, dout, out, du,
                     (size_t)(d->input_dim > 0 ? d->input_dim : d->d_model),
                     (size_t)d->d_model };
    return c;
}

/* The four states in the order of the entry points' arguments. */
static mg_ref_state_shape m3_state_shape(const mg_m3_dims *d)
{
    size_t H = (size_t)d->nheads, P = (size_t)d->headdim, N = (size_t)d->d_state;
    mg_ref_state_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layers = d->n_layers;
    sh.n = 4;
    sh.per[0] = H * P * N;
    sh.per[1] = H * N;
    sh.per[2] = H * P;
    sh.per[3] = H * (size_t)d->n_angles;
    return sh;
}

/* Row r of a [rows][width] buffer, NULL staying NULL. */
static double *row_of(double *x, size_t r, size_t width)
{
    return x ? x + r * width : NULL;
}

static mg_status m3_seg_fwd(void *vc, const mg_ref_seg *g, double *const *st)
{
    const m3_seg_ctx *c = vc;
    return mg_ref_mamba3_forward_f64(c->d, c->l, c->w, 1, g->len,
                                     c->u + g->row * c->in_dim,
                                     row_of(c->out, g->row, c->D),
                                     st[0], st[1], st[2], st[3]);
}

static mg_status m3_seg_bwd(void *vc, const mg_ref_seg *g, double *const *st0,
                            double *const *dT, double *const *d0, double *dblob)
{
    const m3_seg_ctx *c = vc;
    return mg_ref_mamba3_backward_f64(c->d, c->l, c->w, 1, g->len,
                                      c->u + g->row * c->in_dim,
                                      st0[0], st0[1], st0[2], st0[3],
                                      c->dout + g->row * c->D,
                                      dT[0], dT[1], dT[2], dT[3],
                                      row_of(c->out, g->row, c->D), dblob,
                                      row_of(c->du, g->row, c->in_dim),
                                      d0[0], d0[1], d0[2], d0[3]);
}

mg_status mg_ref_mamba3_forward_f64_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                       const double *blob, int batch, int seqlen,
                                       const double *u, double *out, double *ssm,
                                       double *k_prev, double *v_prev,
                                       double *angle, const mg_ref_seqs *seqs)
{
    mg_ref_plan p;
    int plain;
    mg_status rc = m3_check_call(d, l, blob, batch, seqlen, u);
    if (rc == MG_OK)
        rc = mg_ref_seqs_prepare(seqs, batch, seqlen, "mg_ref_mamba3_forward_ex", &p, &plain);
    if (rc != MG_OK)
        return rc;
    if (plain)
        return mg_ref_mamba3_forward_f64(d, l, blob, batch, seqlen, u, out, ssm,
                                         k_prev, v_prev, angle);
    m3_seg_ctx c = m3_seg_ctx_of(d, l, blob, u, out, NULL, NULL);
    mg_ref_state_shape sh = m3_state_shape(d);
    double *st[4] = { ssm, k_prev, v_prev, angle };
    rc = mg_ref_seqs_forward(&p, &sh, st, m3_seg_fwd, &c);
    if (rc == MG_OK)
        mg_ref_seqs_zero_rows(out, p.ntok, (size_t)batch * seqlen, c.D);
    mg_ref_seqs_plan_free(&p);
    return rc;
}

mg_status mg_ref_mamba3_forward_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                   const float *blob, int batch, int seqlen,
                                   const float *u, double *out, double *ssm,
                                   double *k_prev, double *v_prev, double *angle,
                                   const mg_ref_seqs *seqs)
{
    double *wb, *ub;
    mg_status rc = m3_widen(d, l, blob, batch, seqlen, u, &wb, &ub);
    if (rc != MG_OK) return rc;
    rc = mg_ref_mamba3_forward_f64_ex(d, l, wb, batch, seqlen, ub, out, ssm, k_prev,
                                      v_prev, angle, seqs);
    free(wb);
    free(ub);
    return rc;
}

mg_status mg_ref_mamba3_backward_f64_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                        const double *blob, int batch, int seqlen,
                                        const double *u, MG_M3_BWD_STATES,
                                        const mg_ref_seqs *seqs)
{
    mg_ref_plan p;
    int plain;
    mg_status rc = m3_check_bwd_call(d, l, blob, batch, seqlen, u, dout, dblob);
    if (rc == MG_OK)
        rc = mg_ref_seqs_prepare(seqs, batch, seqlen, "mg_ref_mamba3_backward_ex", &p, &plain);
    if (rc != MG_OK)
        return rc;
    if (plain)
        return mg_ref_mamba3_backward_f64(d, l, blob, batch, seqlen, u, ssm0, k_prev0,
                                          v_prev0, angle0, dout, dssm_T, dk_prev_T,
                                          dv_prev_T, dangle_T, out, dblob, du, dssm0,
                                          dk_prev0, dv_prev0, dangle0);
    m3_seg_ctx c = m3_seg_ctx_of(d, l, blob, u, out, dout, du);
    mg_ref_state_shape sh = m3_state_shape(d);
    const double *st0[4] = { ssm0, k_prev0, v_prev0, angle0 };
    const double *dT[4] = { dssm_T, dk_prev_T, dv_prev_T, dangle_T };
    double *d0[4] = { dssm0, dk_prev0, dv_prev0, dangle0 };
    rc = mg_ref_seqs_backward(&p, &sh, st0, dT, d0, dblob, l->total, m3_seg_bwd, &c);
    if (rc == MG_OK) {
        mg_ref_seqs_zero_rows(out, p.ntok, (size_t)batch * seqlen, c.D);
        mg_ref_seqs_zero_rows(du, p.ntok, (size_t)batch * seqlen, c.in_dim);
    }
    mg_ref_seqs_plan_free(&p);
    return rc;
}

mg_status mg_ref_mamba3_backward_ex(const mg_m3_dims *d, const mg_m3_layout *l,
                                    const float *blob, int batch, int seqlen,
                                    const float *u, MG_M3_BWD_STATES,
                                    const mg_ref_seqs *seqs)
{
    double *wb, *ub;
    mg_status rc = m3_widen(d, l, blob, batch, seqlen, u, &wb, &ub);
    if (rc != MG_OK) return rc;
    rc = mg_ref_mamba3_backward_f64_ex(d, l, wb, batch, seqlen, ub, ssm0, k_prev0,
                                       v_prev0, angle0, dout, dssm_T, dk_prev_T,
                                       dv_prev_T, dangle_T, out, dblob, du, dssm0,
                                       dk_prev0, dv_prev0, dangle0, seqs);
    free(wb);
    free(ub);
    return rc;
}
