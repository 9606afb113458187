/* mg_ref_mamba3.c: the Mamba-3 SISO reference (see mg_ref_mamba3.h; the
 * files and their jobs: mg_ref_mamba3_impl.h): the dims check, the weight
 * blob layout, the tensor table and the deterministic init. */
#include "mg_ref_mamba3_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_rng.h"
#include "mg_tap.h"

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

/* ------------------------------------------------------------------ */
/* dims and layout                                                     */

mg_status m3_check_dims(const mg_m3_dims *d)
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
    mg_status st = m3_check_dims(d);
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
    mg_status st = m3_check_dims(d);
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
    mg_status st = m3_check_dims(d);
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
/* comparing states                                                    */

void mg_ref_mamba3_compare_states(const mg_m3_dims *d, int batch, const float *const got[4],
                                  const double *const ref[4], const float *const ref32[4], mg_err err[4])
{
    const size_t heads = (size_t)d->n_layers * (size_t)batch * (size_t)d->nheads;
    const size_t N = (size_t)d->d_state, P = (size_t)d->headdim, S = (size_t)d->n_angles;
    const mg_rot_shape ssm = { heads, P, N, S }, kp = { heads, 1, N, S };
    if (ref) {
        err[0] = mg_compare_rotated_f32(got[0], got[3], ref[0], ref[3], &ssm);
        err[1] = mg_compare_rotated_f32(got[1], got[3], ref[1], ref[3], &kp);
        err[2] = mg_compare_f32(got[2], ref[2], heads * P);
        err[3] = mg_compare_angle_f32(got[3], ref[3], heads * S);
    } else {
        err[0] = mg_compare_rotated_f32f32(got[0], got[3], ref32[0], ref32[3], &ssm);
        err[1] = mg_compare_rotated_f32f32(got[1], got[3], ref32[1], ref32[3], &kp);
        err[2] = mg_compare_f32f32(got[2], ref32[2], heads * P);
        err[3] = mg_compare_angle_f32f32(got[3], ref32[3], heads * S);
    }
}

/* The angle of push_ranges' fast heads apart from the others: see the
 * header. Each part is gathered into its own arrays, then compared as a
 * whole angle state would be. */
void mg_ref_mamba3_compare_angle_pushed(const mg_m3_dims *d, int batch, const float *got, const double *ref,
                                        const float *ref32, mg_err err[2])
{
    const size_t H = (size_t)d->nheads, S = (size_t)d->n_angles;
    const size_t n = (size_t)d->n_layers * (size_t)batch * H * S;
    float *g = (float *)malloc((n ? n : 1) * sizeof *g), *r32 = (float *)malloc((n ? n : 1) * sizeof *r32);
    double *r64 = (double *)malloc((n ? n : 1) * sizeof *r64);
    memset(err, 0, 2 * sizeof *err);
    if (!g || !r32 || !r64) {
        free(g); free(r32); free(r64);
        err[0].n_nonfinite = err[1].n_nonfinite = 1;   /* no memory: fail, never pass */
        return;
    }
    for (int part = 0; part < 2; part++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const int fast = mg_ref_mamba3_pushed_dt_head((int)((i / S) % H));
            if (fast != part) continue;
            g[k] = got[i];
            if (ref) r64[k] = ref[i]; else r32[k] = ref32[i];
            k++;
        }
        err[part] = ref ? mg_compare_angle_f32(g, r64, k) : mg_compare_angle_f32f32(g, r32, k);
    }
    free(g); free(r32); free(r64);
}

/* The ssm state of push_ranges' fast heads apart from the others: each
 * part's heads (P x N state and S angles each) gathered, then compared
 * frame-invariantly as a whole ssm state would be. */
void mg_ref_mamba3_compare_ssm_pushed(const mg_m3_dims *d, int batch, const float *got, const float *got_angle,
                                      const double *ref, const double *ref_angle, const float *ref32,
                                      const float *ref32_angle, mg_err err[2])
{
    const size_t H = (size_t)d->nheads, S = (size_t)d->n_angles;
    const size_t PN = (size_t)d->headdim * (size_t)d->d_state;
    const size_t heads = (size_t)d->n_layers * (size_t)batch * H;
    const size_t nh = heads ? heads : 1;
    float *g = (float *)malloc(nh * PN * sizeof *g), *ga = (float *)malloc(nh * S * sizeof *ga);
    float *r32 = (float *)malloc(nh * PN * sizeof *r32), *r32a = (float *)malloc(nh * S * sizeof *r32a);
    double *r64 = (double *)malloc(nh * PN * sizeof *r64), *r64a = (double *)malloc(nh * S * sizeof *r64a);
    memset(err, 0, 2 * sizeof *err);
    if (!g || !ga || !r32 || !r32a || !r64 || !r64a) {
        err[0].n_nonfinite = err[1].n_nonfinite = 1;   /* no memory: fail, never pass */
    } else {
        for (int part = 0; part < 2; part++) {
            size_t k = 0;
            for (size_t hh = 0; hh < heads; hh++) {
                if (mg_ref_mamba3_pushed_dt_head((int)(hh % H)) != part) continue;
                memcpy(g + k * PN, got + hh * PN, PN * sizeof *g);
                memcpy(ga + k * S, got_angle + hh * S, S * sizeof *ga);
                if (ref) {
                    memcpy(r64 + k * PN, ref + hh * PN, PN * sizeof *r64);
                    memcpy(r64a + k * S, ref_angle + hh * S, S * sizeof *r64a);
                } else {
                    memcpy(r32 + k * PN, ref32 + hh * PN, PN * sizeof *r32);
                    memcpy(r32a + k * S, ref32_angle + hh * S, S * sizeof *r32a);
                }
                k++;
            }
            const mg_rot_shape sh = { k, (size_t)d->headdim, (size_t)d->d_state, S };
            err[part] = ref ? mg_compare_rotated_f32(g, ga, r64, r64a, &sh) : mg_compare_rotated_f32f32(g, ga, r32, r32a, &sh);
        }
    }
    free(g); free(ga); free(r32); free(r32a); free(r64); free(r64a);
}

void mg_ref_mamba3_tap_ssm_pushed(const mg_m3_dims *d, int batch, const char *what, const float *got,
                                  const float *got_angle, const double *ref, const double *ref_angle,
                                  const float *ref32, const float *ref32_angle, double tol)
{
    static const char *const part[2] = { "heads at init-range DT", "heads at DT ~ 22" };
    mg_err e[2];
    mg_ref_mamba3_compare_ssm_pushed(d, batch, got, got_angle, ref, ref_angle, ref32, ref32_angle, e);
    for (int i = 0; i < 2; i++) {
        const double t = i && tol < MG_REF_M3_ANGLE_FAST_TOL ? MG_REF_M3_ANGLE_FAST_TOL : tol;
        mg_tap_diag("%s (%s): max_abs=%.3e rel_l2=%.3e (n=%zu)", what, part[i], e[i].max_abs, e[i].rel_l2, e[i].n);
        mg_tap_ok(mg_err_ok(&e[i], t), "%s (%s): rel_l2 <= %g", what, part[i], t);
    }
}

void mg_ref_mamba3_tap_angle_pushed(const mg_m3_dims *d, int batch, const char *what, const float *got,
                                    const double *ref, const float *ref32, double tol, int f32_storage)
{
    static const char *const part[2] = { "heads at init-range DT", "heads at DT ~ 22" };
    mg_err e[2];
    mg_ref_mamba3_compare_angle_pushed(d, batch, got, ref, ref32, e);
    for (int i = 0; i < 2; i++) {
        const double t = i ? MG_REF_M3_ANGLE_FAST_TOL : tol;
        if (i && !f32_storage) {
            char w[320];
            snprintf(w, sizeof w, "%s (%s)", what, part[i]);
            mg_tap_skip("absolute angle below the storage dtype's resolution at DT ~ 22 (ssm, k_prev and out are "
                        "checked)", w);
            continue;
        }
        mg_tap_diag("%s (%s): max_abs=%.3e rel_l2=%.3e (n=%zu)", what, part[i], e[i].max_abs, e[i].rel_l2, e[i].n);
        mg_tap_ok(mg_err_ok(&e[i], t), "%s (%s): rel_l2 <= %g", what, part[i], t);
    }
}

/* ------------------------------------------------------------------ */
/* weights out of the init range (tests)                               */

/* The heads whose DT bias push_ranges raises above softplus's threshold. */
int mg_ref_mamba3_pushed_dt_head(int h) { return h % 3 == 0; }

mg_status mg_ref_mamba3_push_ranges(const mg_m3_dims *d, const mg_m3_layout *l, float *blob,
                                    unsigned long long seed, float *u_offset0)
{
    mg_status s = m3_check_dims(d);
    if (s != MG_OK) return s;
    if (!l || !blob || !u_offset0) return mg_fail(MG_ERR_INVALID_ARG, "mg_ref_mamba3_push_ranges: NULL argument");
    const m3_sizes sz = m3_sizes_of(d, 1, 1);
    /* f16 holds 65504: c x̂_0 with x̂_0 up to ~12 stays below it */
    const double c = d->a_floor > 0.0 && 0.4 / d->a_floor < 4000.0 ? 0.4 / d->a_floor : 4000.0;
    const double offset = 8.0;   /* x̂_0 = 8 / sqrt(1 + 64 / D) >= 3.6 at D >= 16 */
    mg_rng r;
    mg_rng_seed(&r, seed);
    for (int li = 0; li < d->n_layers; li++) {
        const mg_m3_layer_off *L = &l->layers[li];
        for (size_t h = 0; h < sz.H; h++) {
            if (mg_ref_mamba3_pushed_dt_head((int)h)) {
                blob[L->dt_bias + h] = (float)(22.0 + 2.0 * mg_rng_uniform(&r));
            } else if (h % 3 == 1) {
                float *row = blob + L->in_proj_w + (sz.oA + h) * sz.D;
                for (size_t i = 0; i < sz.D; i++) row[i] = 0.0f;
                row[0] = (float)-c;
            }
        }
    }
    *u_offset0 = 0.0f;
    if (d->input_dim > 0)
        blob[l->input_proj_b] += (float)offset;
    else
        *u_offset0 = (float)offset;
    return MG_OK;
}
