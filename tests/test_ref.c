/* test_ref.c: unit tests of the Mamba-1 reference path (runtime/mg_ref_mamba1):
 * the blob layout against offsets computed by hand, a tiny model against
 * numbers derived by hand, the conv and the scan against naive loops, state
 * continuation, batch independence, and the backward against central finite
 * differences on every parameter, the input and the initial state: single
 * entries (all of them, or a random sample), and directional derivatives
 * along random directions over each whole tensor. CPU only. */
#include "tap.h"
#include "mg_runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double *dvec(size_t n)
{
    return tap_calloc(n, sizeof(double));
}

static double max_rel_diff(const double *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return den > 0 ? num / den : num;
}

static void fill_normal(mg_rng *r, double *x, size_t n, double std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = std * mg_rng_normal(r);
}

static double silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* ------------------------------------------------------------ layout */

static void test_layout(void)
{
    /* D=4 L=2 N=2 E=8 K=3 R=1 input_dim=3. Each tensor starts at the next
     * multiple of 64 floats:
     *   input_proj.w 0 (12), input_proj.b 64 (4),
     *   layer 0: norm 128 (4), in_proj 192 (64), conv_w 256 (24), conv_b 320 (8),
     *            x_proj 384 (5*8=40), dt_w 448 (8), dt_b 512 (8), A_log 576 (16),
     *            D 640 (8), out_proj 704 (32 -> 736)
     *   layer 1: the same + 640: 768 832 896 960 1024 1088 1152 1216 1280 1344
     *   norm_f 1408 (4) -> total 1472. */
    mg_m1_dims d = { .d_model = 4, .n_layers = 2, .d_state = 2, .d_inner = 8,
                     .d_conv = 3, .dt_rank = 1, .input_dim = 3, .norm_eps = 1e-5 };
    mg_m1_layout l;
    tap_is_int(mg_ref_mamba1_layout(&d, &l), MG_OK, "layout: ok");
    tap_is_int((long long)l.input_proj_w, 0, "layout: input_proj.weight at 0");
    tap_is_int((long long)l.input_proj_b, 64, "layout: input_proj.bias at 64");
    size_t want[2][10] = {
        { 128, 192, 256, 320, 384, 448, 512, 576, 640, 704 },
        { 768, 832, 896, 960, 1024, 1088, 1152, 1216, 1280, 1344 },
    };
    int all = 1;
    for (int i = 0; i < 2; i++) {
        const mg_m1_layer_off *o = &l.layers[i];
        size_t got[10] = { o->norm_w, o->in_proj_w, o->conv_w, o->conv_b, o->x_proj_w,
                           o->dt_proj_w, o->dt_proj_b, o->A_log, o->D, o->out_proj_w };
        for (int k = 0; k < 10; k++)
            if (got[k] != want[i][k]) {
                tap_diag("layer %d tensor %d: got %zu want %zu", i, k, got[k], want[i][k]);
                all = 0;
            }
    }
    tap_ok(all, "layout: layer offsets as computed by hand");
    tap_is_int((long long)l.norm_f_w, 1408, "layout: norm_f.weight at 1408");
    tap_is_int((long long)l.total, 1472, "layout: total 1472 floats");

    mg_m1_tensor t[32];
    int n = mg_ref_mamba1_tensors(&d, &l, t, 32);
    tap_is_int(n, 23, "tensors: 2 + 10*2 + 1");
    tap_is_str(t[4].name, "backbone.layers.0.mixer.conv1d.weight", "tensors: name of #4");
    tap_is_int((long long)t[4].offset, 256, "tensors: offset of #4");
    tap_is_int((long long)t[4].numel, 24, "tensors: numel of #4");
    tap_is_str(t[21].name, "backbone.layers.1.mixer.out_proj.weight", "tensors: name of #21");
    tap_is_str(t[22].name, "backbone.norm_f.weight", "tensors: last is norm_f");
    int tiled = 1;
    for (int i = 0; i < n; i++) {
        size_t end = i + 1 < n ? t[i + 1].offset : l.total;
        if (t[i].offset % 64 || t[i].offset + t[i].numel > end || end - (t[i].offset + t[i].numel) >= 64)
            tiled = 0;
    }
    tap_ok(tiled, "tensors: aligned, in order, no overlap, padding < 64");
    tap_is_int(mg_ref_mamba1_tensors(&d, &l, NULL, 0), 23, "tensors: count with out=NULL");
    mg_ref_mamba1_layout_free(&l);

    /* D=5 L=1 N=4 E=10 K=4 R=1, identity input; tensors longer than 64:
     *   norm 0 (5), in_proj 64 (100 -> 164), conv_w 192 (40), conv_b 256 (10),
     *   x_proj 320 (90 -> 410), dt_w 448 (10), dt_b 512 (10), A_log 576 (40),
     *   D 640 (10), out_proj 704 (50 -> 754), norm_f 768 (5) -> total 832. */
    mg_m1_dims d2 = { .d_model = 5, .n_layers = 1, .d_state = 4, .d_inner = 10,
                      .d_conv = 4, .dt_rank = 1, .input_dim = 0, .norm_eps = 1e-5 };
    tap_is_int(mg_ref_mamba1_layout(&d2, &l), MG_OK, "layout 2: ok");
    const mg_m1_layer_off *o = &l.layers[0];
    size_t got2[12] = { o->norm_w, o->in_proj_w, o->conv_w, o->conv_b, o->x_proj_w,
                        o->dt_proj_w, o->dt_proj_b, o->A_log, o->D, o->out_proj_w,
                        l.norm_f_w, l.total };
    size_t want2[12] = { 0, 64, 192, 256, 320, 448, 512, 576, 640, 704, 768, 832 };
    tap_ok(memcmp(got2, want2, sizeof got2) == 0, "layout 2: offsets as computed by hand");
    tap_is_int(mg_ref_mamba1_tensors(&d2, &l, NULL, 0), 11, "layout 2: 11 tensors");
    mg_ref_mamba1_layout_free(&l);

    mg_m1_dims bad = d2;
    bad.d_model = 0;
    mg_status s = mg_ref_mamba1_layout(&bad, &l);
    tap_is_int(s, MG_ERR_INVALID_ARG, "layout: d_model=0 rejected");
    tap_ok(strstr(mg_last_error(), "d_model") != NULL, "layout: message names d_model (%s)",
           mg_last_error());
    bad = d2;
    bad.norm_eps = 0;
    tap_is_int(mg_ref_mamba1_layout(&bad, &l), MG_ERR_INVALID_ARG, "layout: norm_eps=0 rejected");
    bad = d2;
    bad.input_dim = -1;
    tap_is_int(mg_ref_mamba1_layout(&bad, &l), MG_ERR_INVALID_ARG, "layout: input_dim<0 rejected");
}

/* ------------------------------------------------------------ init */

static void test_init(void)
{
    mg_m1_dims d = { .d_model = 16, .n_layers = 2, .d_state = 4, .d_inner = 32,
                     .d_conv = 4, .dt_rank = 1, .input_dim = 5, .norm_eps = 1e-5 };
    mg_m1_layout l;
    mg_ref_mamba1_layout(&d, &l);
    float *a = malloc(l.total * sizeof *a), *b = malloc(l.total * sizeof *b);
    for (size_t i = 0; i < l.total; i++)
        a[i] = b[i] = 123.0f;
    tap_is_int(mg_ref_mamba1_init(&d, &l, a, 7), MG_OK, "init: ok");
    mg_ref_mamba1_init(&d, &l, b, 7);
    tap_ok(memcmp(a, b, l.total * sizeof *a) == 0, "init: deterministic in the seed");
    mg_ref_mamba1_init(&d, &l, b, 8);
    tap_ok(memcmp(a, b, l.total * sizeof *a) != 0, "init: another seed, other weights");

    mg_m1_tensor t[32];
    int n = mg_ref_mamba1_tensors(&d, &l, t, 32);
    int pad0 = 1, ranges = 1;
    for (int i = 0; i < n; i++) {
        size_t end = i + 1 < n ? t[i + 1].offset : l.total;
        for (size_t k = t[i].offset + t[i].numel; k < end; k++)
            if (a[k] != 0.0f)
                pad0 = 0;
    }
    for (int li = 0; li < 2; li++) {
        const mg_m1_layer_off *o = &l.layers[li];
        for (int e = 0; e < 32; e++) {
            double dt = mg_ref_softplus(a[o->dt_proj_b + e]);
            if (!(dt >= 0.999e-3 && dt <= 1.001e-1))
                ranges = 0;
            if (fabs(a[o->D + e] - 1.0) > 0.1 + 1e-6)
                ranges = 0;
            for (int k = 0; k < 4; k++)
                if (fabs(a[o->A_log + e * 4 + k] - log(k + 1.0)) > 0.0100001)
                    ranges = 0;
        }
        double bnd = 1.0 / sqrt(16.0);
        for (int k = 0; k < 2 * 32 * 16; k++)
            if (fabs(a[o->in_proj_w + k]) > bnd)
                ranges = 0;
        for (int k = 0; k < 16; k++)
            if (fabs(a[o->norm_w + k] - 1.0) > 0.1 + 1e-6)
                ranges = 0;
    }
    tap_ok(pad0, "init: padding is zero");
    tap_ok(ranges, "init: dt in [1e-3, 1e-1], D and norms near 1, A_log ~ log(n+1), in_proj bounded");
    free(a);
    free(b);
    mg_ref_mamba1_layout_free(&l);
}

/* ------------------------------------------------------------ hand-derived case */

/* D=2 E=2 N=1 K=2 R=1, one layer, identity input, eps=1e-5. Weights:
 *   norm.w = [1,1]; in_proj = [[1,0],[0,1],[1,0],[0,-1]]  (x = hn, z = [hn0,-hn1]);
 *   conv.w = [[0.5,1],[0,1]], conv.b = [0,0.5];
 *   x_proj = [[0,0],[1,0],[0,1]]  (dt_low = 0, B = xc0, C = xc1);
 *   dt_proj.w = [[1],[1]], dt_proj.b = [0, log(e-1)]  (delta = [log 2, 1]);
 *   A_log = [0, log 2]  (A = [-1,-2]); D = [1,0]; out_proj = I; norm_f = [1,2]. */
static void hand_weights(const mg_m1_layout *l, double *w, int with_input)
{
    memset(w, 0, l->total * sizeof *w);
    const mg_m1_layer_off *o = &l->layers[0];
    w[o->norm_w] = 1; w[o->norm_w + 1] = 1;
    double inp[8] = { 1, 0, 0, 1, 1, 0, 0, -1 };
    memcpy(w + o->in_proj_w, inp, sizeof inp);
    w[o->conv_w + 0] = 0.5; w[o->conv_w + 1] = 1; w[o->conv_w + 2] = 0; w[o->conv_w + 3] = 1;
    w[o->conv_b] = 0; w[o->conv_b + 1] = 0.5;
    double xp[6] = { 0, 0, 1, 0, 0, 1 };
    memcpy(w + o->x_proj_w, xp, sizeof xp);
    w[o->dt_proj_w] = 1; w[o->dt_proj_w + 1] = 1;
    w[o->dt_proj_b] = 0; w[o->dt_proj_b + 1] = log(exp(1.0) - 1.0);
    w[o->A_log] = 0; w[o->A_log + 1] = log(2.0);
    w[o->D] = 1; w[o->D + 1] = 0;
    w[o->out_proj_w] = 1; w[o->out_proj_w + 3] = 1;
    w[l->norm_f_w] = 1; w[l->norm_f_w + 1] = 2;
    if (with_input) {
        /* input_proj = [[1,0,0],[0,0,1]], bias [0.5,-2]: u=[0.5,*,1] -> h=[1,-1] */
        double ip[6] = { 1, 0, 0, 0, 0, 1 };
        memcpy(w + l->input_proj_w, ip, sizeof ip);
        w[l->input_proj_b] = 0.5; w[l->input_proj_b + 1] = -2;
    }
}

static void final_norm(double h0, double h1, double eps, double out[2])
{
    double r = 1.0 / sqrt((h0 * h0 + h1 * h1) / 2 + eps);
    out[0] = h0 * r * 1;
    out[1] = h1 * r * 2;
}

static void test_hand(void)
{
    const double eps = 1e-5, L2 = log(2.0);
    mg_m1_dims d = { .d_model = 2, .n_layers = 1, .d_state = 1, .d_inner = 2,
                     .d_conv = 2, .dt_rank = 1, .input_dim = 0, .norm_eps = eps };
    mg_m1_layout l;
    mg_ref_mamba1_layout(&d, &l);
    double *w = dvec(l.total);
    hand_weights(&l, w, 0);

    /* Sequence u0 = [1,-1], u1 = [2,1], fresh state. */
    double u[4] = { 1, -1, 2, 1 }, out[4], cs[2], ss[2];
    cs[0] = cs[1] = ss[0] = ss[1] = 0;
    tap_is_int(mg_ref_mamba1_forward_f64(&d, &l, w, 1, 2, u, out, cs, ss), MG_OK, "hand: forward ok");

    double want[4];
    /* t = 0: hn = [r0,-r0]; x = [r0,-r0]; z = [r0,r0]. */
    double r0 = 1 / sqrt(1 + eps);
    double xc0 = silu(r0);              /* 1*x0 + 0.5*0 (fresh state) */
    double xc1 = silu(-r0 + 0.5);       /* 1*x1 + 0*0 + 0.5 */
    double s0 = L2 * xc0 * xc0;         /* delta0 * B * xc0, B = xc0 */
    double s1 = 1.0 * xc0 * xc1;        /* delta1 = 1 */
    double y0 = s0 * xc1 + xc0, y1 = s1 * xc1;   /* C = xc1, D = [1,0] */
    final_norm(1 + y0 * silu(r0), -1 + y1 * silu(r0), eps, want);
    /* t = 1: hn = [2 r1, r1]; x = [2r1, r1]; z = [2r1, -r1]. */
    double r1 = 1 / sqrt(2.5 + eps);
    double xc0b = silu(2 * r1 + 0.5 * r0);       /* w[0]=0.5 on x0 at t=0 */
    double xc1b = silu(r1 + 0.5);                /* w[0]=0 */
    double s0b = 0.5 * s0 + L2 * xc0b * xc0b;    /* exp(log2 * -1) = 0.5 */
    double s1b = exp(-2.0) * s1 + xc0b * xc1b;   /* exp(1 * -2) */
    double y0b = s0b * xc1b + xc0b, y1b = s1b * xc1b;
    final_norm(2 + y0b * silu(2 * r1), 1 + y1b * silu(-r1), eps, want + 2);
    for (int i = 0; i < 4; i++)
        tap_near(out[i], want[i], 0, 1e-14, "hand: out[%d] = %.15f", i, want[i]);
    tap_near(cs[0], 2 * r1, 0, 1e-15, "hand: final conv_state[0] = x0 at t=1");
    tap_near(cs[1], r1, 0, 1e-15, "hand: final conv_state[1] = x1 at t=1");
    tap_near(ss[0], s0b, 0, 1e-14, "hand: final ssm_state[0]");
    tap_near(ss[1], s1b, 0, 1e-14, "hand: final ssm_state[1]");

    /* Same first token with an initial state: conv [c0,c1], ssm [q0,q1]. */
    double c0 = 0.3, c1 = -0.7, q0 = 0.25, q1 = -1.5;
    cs[0] = c0; cs[1] = c1; ss[0] = q0; ss[1] = q1;
    mg_ref_mamba1_forward_f64(&d, &l, w, 1, 1, u, out, cs, ss);
    double p0 = silu(0.5 * c0 + r0), p1 = silu(0 * c1 - r0 + 0.5);
    double t0 = 0.5 * q0 + L2 * p0 * p0, t1 = exp(-2.0) * q1 + p0 * p1;
    final_norm(1 + (t0 * p1 + p0) * silu(r0), -1 + (t1 * p1) * silu(r0), eps, want);
    tap_near(out[0], want[0], 0, 1e-14, "hand, initial state: out[0]");
    tap_near(out[1], want[1], 0, 1e-14, "hand, initial state: out[1]");
    tap_near(ss[0], t0, 0, 1e-14, "hand, initial state: ssm_state[0]");
    tap_near(ss[1], t1, 0, 1e-14, "hand, initial state: ssm_state[1]");
    tap_ok(cs[0] == r0 && cs[1] == -r0, "hand, initial state: conv_state = last x");

    /* NULL states: zeros in, nothing out: same as the first case. */
    double out2[4];
    mg_ref_mamba1_forward_f64(&d, &l, w, 1, 2, u, out2, NULL, NULL);
    final_norm(2 + y0b * silu(2 * r1), 1 + y1b * silu(-r1), eps, want + 2);
    tap_near(out2[3], want[3], 0, 1e-14, "hand: NULL states mean zeros");

    /* input_dim = 3 with an input_proj mapping u=[0.5,9,1] to h=[1,-1]:
     * same first output. */
    mg_m1_dims di = d;
    di.input_dim = 3;
    mg_m1_layout li;
    mg_ref_mamba1_layout(&di, &li);
    double *wi = dvec(li.total);
    hand_weights(&li, wi, 1);
    double ui[3] = { 0.5, 9, 1 };
    mg_ref_mamba1_forward_f64(&di, &li, wi, 1, 1, ui, out, NULL, NULL);
    final_norm(1 + y0 * silu(r0), -1 + y1 * silu(r0), eps, want);
    tap_near(out[0], want[0], 0, 1e-14, "hand, input_proj: out[0]");
    tap_near(out[1], want[1], 0, 1e-14, "hand, input_proj: out[1]");

    /* The f32 entry point reads the f32 blob: equal to f64 on the rounded blob. */
    float *wf = malloc(l.total * sizeof *wf);
    for (size_t i = 0; i < l.total; i++) {
        wf[i] = (float)w[i];
        w[i] = wf[i];
    }
    float uf[4] = { 1, -1, 2, 1 };
    double oa[4], ob[4];
    mg_ref_mamba1_forward(&d, &l, wf, 1, 2, uf, oa, NULL, NULL);
    mg_ref_mamba1_forward_f64(&d, &l, w, 1, 2, u, ob, NULL, NULL);
    tap_ok(memcmp(oa, ob, sizeof oa) == 0, "f32 entry point = f64 on the same values");

    /* Argument checks. */
    tap_is_int(mg_ref_mamba1_forward(&d, &l, NULL, 1, 2, uf, oa, NULL, NULL),
               MG_ERR_INVALID_ARG, "forward: NULL blob rejected");
    tap_is_int(mg_ref_mamba1_forward(&d, &l, wf, 0, 2, uf, oa, NULL, NULL),
               MG_ERR_INVALID_ARG, "forward: batch 0 rejected");
    tap_is_int(mg_ref_mamba1_forward(&di, &l, wf, 1, 2, uf, oa, NULL, NULL),
               MG_ERR_SIZE, "forward: layout of other dims rejected");
    free(wf);
    free(w);
    free(wi);
    mg_ref_mamba1_layout_free(&l);
    mg_ref_mamba1_layout_free(&li);
}

/* ------------------------------------------------------------ conv and scan vs naive */

static void test_conv_scan(void)
{
    mg_rng r;
    mg_rng_seed(&r, 11);
    const int E = 3, K = 4, S = K - 1;
    for (int T = 1; T <= 7; T += 3) {   /* 1 and 4: T < S, T = S+1; 7 */
        double *x = dvec((size_t)T * 5), *w = dvec(E * K), *b = dvec(E);
        double st[3 * 3], st0[3 * 3], *pre = dvec((size_t)T * E), *xc = dvec((size_t)T * E);
        fill_normal(&r, x, (size_t)T * 5, 1);
        fill_normal(&r, w, E * K, 1);
        fill_normal(&r, b, E, 1);
        fill_normal(&r, st, E * S, 1);
        memcpy(st0, st, sizeof st);
        mg_ref_m1_conv(T, E, K, x, 5, w, b, st, pre, xc);
        /* naive: the padded sequence [state ; x], a plain window sum. */
        double *xp = dvec((size_t)(T + S) * E);
        for (int e = 0; e < E; e++) {
            for (int k = 0; k < S; k++)
                xp[k * E + e] = st0[e * S + k];
            for (int t = 0; t < T; t++)
                xp[(S + t) * E + e] = x[t * 5 + e];
        }
        double err = 0, serr = 0;
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                double p = b[e];
                for (int k = 0; k < K; k++)
                    p += w[e * K + k] * xp[(t + k) * E + e];
                err = fmax(err, fabs(pre[t * E + e] - p) + fabs(xc[t * E + e] - p / (1 + exp(-p))));
            }
        for (int e = 0; e < E; e++)
            for (int k = 0; k < S; k++)
                serr = fmax(serr, fabs(st[e * S + k] - xp[(T + k) * E + e]));
        tap_ok(err < 1e-13, "conv T=%d: matches the padded window sum (err %.2e)", T, err);
        tap_ok(serr == 0, "conv T=%d: new state = last K-1 inputs", T);
        /* NULL state = zeros. */
        double *xc2 = dvec((size_t)T * E);
        mg_ref_m1_conv(T, E, K, x, 5, w, b, NULL, NULL, xc2);
        double z = 0;
        for (int e = 0; e < E; e++) {
            double p = b[e] + w[e * K + S] * x[e];
            z = fmax(z, fabs(xc2[e] - silu(p)));
        }
        tap_ok(z < 1e-15, "conv T=%d: NULL state means zeros", T);
        free(x); free(w); free(b); free(pre); free(xc); free(xp); free(xc2);
    }

    /* Scan against the closed form
     *   s_t = exp(A sum_{i<=t} d_i) s_init + sum_{j<=t} exp(A sum_{j<i<=t} d_i) d_j B_j x_j */
    const int T = 9, N = 4;
    double *xcv = dvec(T * E), *dl = dvec(T * E), *A = dvec(E * N), *BC = dvec(T * 2 * N + 1);
    double Dp[3], s[3 * 4], s0[3 * 4], *y = dvec(T * E), *hist = dvec(T * E * N);
    fill_normal(&r, xcv, T * E, 1);
    for (int i = 0; i < T * E; i++)
        dl[i] = mg_ref_softplus(mg_rng_normal(&r) - 1);
    for (int i = 0; i < E * N; i++)
        A[i] = -exp(0.5 * mg_rng_normal(&r));
    fill_normal(&r, BC, T * 2 * N, 1);
    fill_normal(&r, Dp, E, 1);
    fill_normal(&r, s, E * N, 1);
    memcpy(s0, s, sizeof s);
    mg_ref_m1_scan(T, E, N, xcv, dl, A, BC, BC + N, 2 * N, Dp, s, y, hist);
    double ey = 0, es = 0, eh = 0, ynorm = 0;
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            double yy = Dp[e] * xcv[t * E + e];
            for (int n = 0; n < N; n++) {
                double cum = 0;
                for (int i = 0; i <= t; i++)
                    cum += dl[i * E + e];
                double sv = exp(A[e * N + n] * cum) * s0[e * N + n];
                for (int j = 0; j <= t; j++) {
                    double c = 0;
                    for (int i = j + 1; i <= t; i++)
                        c += dl[i * E + e];
                    sv += exp(A[e * N + n] * c) * dl[j * E + e] * BC[j * 2 * N + n] * xcv[j * E + e];
                }
                yy += sv * BC[t * 2 * N + N + n];
                eh = fmax(eh, fabs(hist[(t * E + e) * N + n] - sv) / (1 + fabs(sv)));
                if (t == T - 1)
                    es = fmax(es, fabs(s[e * N + n] - sv) / (1 + fabs(sv)));
            }
            ey = fmax(ey, fabs(y[t * E + e] - yy));
            ynorm = fmax(ynorm, fabs(yy));
        }
    tap_ok(ey / ynorm < 1e-13, "scan: y matches the closed form (rel %.2e)", ey / ynorm);
    tap_ok(es < 1e-13, "scan: final state matches the closed form (%.2e)", es);
    tap_ok(eh < 1e-13, "scan: state history matches the closed form (%.2e)", eh);
    free(xcv); free(dl); free(A); free(BC); free(y); free(hist);
}

/* ------------------------------------------------------------ continuation, batch */

typedef struct model {
    mg_m1_dims d;
    mg_m1_layout l;
    double *w;
    size_t ncs, nss;   /* per layer per batch element */
} model;

static void model_make(model *m, mg_m1_dims d, unsigned long long seed)
{
    m->d = d;
    mg_ref_mamba1_layout(&m->d, &m->l);
    float *wf = malloc(m->l.total * sizeof *wf);
    mg_ref_mamba1_init(&m->d, &m->l, wf, seed);
    m->w = dvec(m->l.total);
    for (size_t i = 0; i < m->l.total; i++)
        m->w[i] = wf[i];
    free(wf);
    m->ncs = (size_t)d.d_inner * (d.d_conv - 1);
    m->nss = (size_t)d.d_inner * d.d_state;
}

static void model_free(model *m)
{
    free(m->w);
    mg_ref_mamba1_layout_free(&m->l);
}

static void test_continuation_batch(void)
{
    mg_m1_dims d = { .d_model = 6, .n_layers = 2, .d_state = 3, .d_inner = 12,
                     .d_conv = 4, .dt_rank = 2, .input_dim = 5, .norm_eps = 1e-5 };
    model m;
    model_make(&m, d, 3);
    mg_rng r;
    mg_rng_seed(&r, 5);
    const int B = 3, L = d.n_layers, I = d.input_dim, D = d.d_model;
    const int T1s[3] = { 2, 1, 6 }, T2s[3] = { 5, 1, 3 };   /* T1 < K-1 too */
    for (int c = 0; c < 3; c++) {
        int T1 = T1s[c], T2 = T2s[c], T = T1 + T2;
        double *u = dvec((size_t)B * T * I), *u1 = dvec((size_t)B * T1 * I), *u2 = dvec((size_t)B * T2 * I);
        fill_normal(&r, u, (size_t)B * T * I, 1);
        for (int b = 0; b < B; b++) {
            memcpy(u1 + (size_t)b * T1 * I, u + (size_t)b * T * I, (size_t)T1 * I * sizeof *u);
            memcpy(u2 + (size_t)b * T2 * I, u + ((size_t)b * T + T1) * I, (size_t)T2 * I * sizeof *u);
        }
        size_t ncs = L * B * m.ncs, nss = L * B * m.nss;
        double *csA = dvec(ncs), *ssA = dvec(nss), *csB = dvec(ncs), *ssB = dvec(nss);
        fill_normal(&r, csA, ncs, 1);
        fill_normal(&r, ssA, nss, 1);
        memcpy(csB, csA, ncs * sizeof *csA);
        memcpy(ssB, ssA, nss * sizeof *ssA);
        double *out = dvec((size_t)B * T * D), *o1 = dvec((size_t)B * T1 * D), *o2 = dvec((size_t)B * T2 * D);
        mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, B, T, u, out, csA, ssA);
        mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, B, T1, u1, o1, csB, ssB);
        mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, B, T2, u2, o2, csB, ssB);
        double e = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int k = 0; k < D; k++) {
                    double v = t < T1 ? o1[((size_t)b * T1 + t) * D + k]
                                      : o2[((size_t)b * T2 + t - T1) * D + k];
                    e = fmax(e, fabs(v - out[((size_t)b * T + t) * D + k]));
                }
        tap_ok(e < 1e-13, "continuation %d+%d: outputs equal one call over %d (%.2e)", T1, T2, T, e);
        tap_ok(max_rel_diff(csB, csA, ncs) == 0, "continuation %d+%d: final conv state equal", T1, T2);
        tap_ok(max_rel_diff(ssB, ssA, nss) < 1e-13, "continuation %d+%d: final ssm state equal", T1, T2);
        free(u); free(u1); free(u2); free(csA); free(ssA); free(csB); free(ssB);
        free(out); free(o1); free(o2);
    }

    /* Batch independence: a batch of 3 = three calls of one, each with its
     * slice of the state ([L][B][...] layout). */
    const int T = 7;
    double *u = dvec((size_t)B * T * I), *out = dvec((size_t)B * T * D);
    size_t ncs = L * B * m.ncs, nss = L * B * m.nss;
    double *cs = dvec(ncs), *ss = dvec(nss);
    fill_normal(&r, u, (size_t)B * T * I, 1);
    fill_normal(&r, cs, ncs, 1);
    fill_normal(&r, ss, nss, 1);
    double *cs_in = dvec(ncs), *ss_in = dvec(nss);
    memcpy(cs_in, cs, ncs * sizeof *cs);
    memcpy(ss_in, ss, nss * sizeof *ss);
    mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, B, T, u, out, cs, ss);
    double eo = 0, es = 0;
    for (int b = 0; b < B; b++) {
        double *c1 = dvec(L * m.ncs), *s1 = dvec(L * m.nss), *o1 = dvec((size_t)T * D);
        for (int li = 0; li < L; li++) {
            memcpy(c1 + li * m.ncs, cs_in + ((size_t)li * B + b) * m.ncs, m.ncs * sizeof *c1);
            memcpy(s1 + li * m.nss, ss_in + ((size_t)li * B + b) * m.nss, m.nss * sizeof *s1);
        }
        mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, 1, T, u + (size_t)b * T * I, o1, c1, s1);
        eo = fmax(eo, max_rel_diff(o1, out + (size_t)b * T * D, (size_t)T * D));
        for (int li = 0; li < L; li++) {
            es = fmax(es, max_rel_diff(c1 + li * m.ncs, cs + ((size_t)li * B + b) * m.ncs, m.ncs));
            es = fmax(es, max_rel_diff(s1 + li * m.nss, ss + ((size_t)li * B + b) * m.nss, m.nss));
        }
        free(c1); free(s1); free(o1);
    }
    tap_ok(eo == 0, "batch independence: outputs equal per-sequence calls (%.2e)", eo);
    tap_ok(es == 0, "batch independence: final states equal per-sequence calls (%.2e)", es);

    /* seqlen 0: states pass through untouched. */
    memcpy(cs, cs_in, ncs * sizeof *cs);
    memcpy(ss, ss_in, nss * sizeof *ss);
    tap_is_int(mg_ref_mamba1_forward_f64(&m.d, &m.l, m.w, B, 0, u, out, cs, ss), MG_OK,
               "seqlen 0: ok");
    tap_ok(memcmp(cs, cs_in, ncs * sizeof *cs) == 0 && memcmp(ss, ss_in, nss * sizeof *ss) == 0,
           "seqlen 0: states unchanged");
    free(u); free(out); free(cs); free(ss); free(cs_in); free(ss_in);
    model_free(&m);
}

/* ------------------------------------------------------------ backward vs finite differences */

#ifndef FD_H
#define FD_H 1e-3
#endif

typedef struct fdcase {
    model *m;
    int B, T;
    double *u, *cs, *ss, *dout;   /* inputs of the loss */
    double *csw, *ssw, *out;      /* scratch */
    size_t nu, ncs, nss, nout;
} fdcase;

/* loss = <out, dout> */
static double loss(fdcase *c)
{
    memcpy(c->csw, c->cs, c->ncs * sizeof *c->cs);
    memcpy(c->ssw, c->ss, c->nss * sizeof *c->ss);
    mg_ref_mamba1_forward_f64(&c->m->d, &c->m->l, c->m->w, c->B, c->T, c->u, c->out,
                              c->csw, c->ssw);
    double s = 0;
    for (size_t i = 0; i < c->nout; i++)
        s += c->out[i] * c->dout[i];
    return s;
}

/* Central difference of the loss in the variable *p, fourth order
 * (Richardson on steps h and 2h): truncation O(h^4), so a step large enough
 * to keep rounding noise low still leaves no visible truncation error. */
static double fd(fdcase *c, double *p)
{
    double v = *p, h = FD_H * fmax(1.0, fabs(v));
    double l[4];
    const double k[4] = { -2, -1, 1, 2 };
    for (int i = 0; i < 4; i++) {
        *p = v + k[i] * h;
        l[i] = loss(c);
    }
    *p = v;
    return (8.0 * (l[2] - l[1]) - (l[3] - l[0])) / (12.0 * h);
}

/* Compares analytic gradients g[idx] with finite differences in x[idx]
 * for `count` entries (all of them when count >= n; else random ones).
 * Error measure: |fd - g| / max(|g|, 1e-3 * max_k |g_k|) over the checked
 * entries (entries far below the tensor's scale are held to that scale). */
static void fd_check(fdcase *c, mg_rng *r, double *x, const double *g, size_t n,
                     size_t count, double tol, const char *what)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(g[i]));
    double worst = 0;
    size_t worst_i = 0, checked = 0;
    double worst_fd = 0;
    for (size_t k = 0; k < (count >= n ? n : count); k++) {
        size_t i = count >= n ? k : (size_t)(mg_rng_u64(r) % n);
        double f = fd(c, x + i);
        double e = fabs(f - g[i]) / fmax(fmax(fabs(g[i]), 1e-3 * scale), 1e-300);
        if (scale == 0)
            e = fabs(f);
        if (e > worst || isnan(e)) {
            worst = isnan(e) ? INFINITY : e;
            worst_i = i;
            worst_fd = f;
        }
        checked++;
    }
    if (!tap_ok(worst < tol && scale > 0, "backward: %s (%zu of %zu entries, worst rel %.2e)",
                what, checked, n, worst))
        tap_diag("entry %zu: analytic %.17g, finite difference %.17g, scale %.3g",
                 worst_i, g[worst_i], worst_fd, scale);
}

/* Every entry of x at once: the derivative along `ndir` random directions v
 * (v ~ N(0, 1) per entry), fd() of the loss in t for x + t v, against
 * <g, v>; error |fd - <g, v>| / max(|<g, v>|, 1e-3 ||g||) (||g|| is the size
 * of <g, v> for such v). */
static void fd_dir_check(fdcase *c, mg_rng *r, double *x, const double *g, size_t n, int ndir, double tol,
                         const char *what)
{
    double *x0 = dvec(n), *v = dvec(n), gn = 0, worst = 0, wf = 0, wg = 0;
    memcpy(x0, x, n * sizeof *x0);
    for (size_t i = 0; i < n; i++)
        gn += g[i] * g[i];
    gn = sqrt(gn);
    for (int k = 0; k < ndir; k++) {
        double gv = 0, t = 0;
        for (size_t i = 0; i < n; i++) {
            v[i] = mg_rng_normal(r);
            gv += g[i] * v[i];
        }
        /* x = x0 + t v through fd()'s variable t (its step: FD_H) */
        const double kk[4] = { -2, -1, 1, 2 };
        double l[4];
        for (int j = 0; j < 4; j++) {
            t = kk[j] * FD_H;
            for (size_t i = 0; i < n; i++)
                x[i] = x0[i] + t * v[i];
            l[j] = loss(c);
        }
        memcpy(x, x0, n * sizeof *x0);
        double f = (8.0 * (l[2] - l[1]) - (l[3] - l[0])) / (12.0 * FD_H);
        double e = fabs(f - gv) / fmax(fmax(fabs(gv), 1e-3 * gn), 1e-300);
        if (!(e <= worst)) {
            worst = isnan(e) ? INFINITY : e;
            wf = f;
            wg = gv;
        }
    }
    if (!tap_ok(worst < tol && gn > 0, "backward: %s along %d random directions over all %zu entries (worst rel %.2e)",
                what, ndir, n, worst))
        tap_diag("<g, v> %.17g, finite difference %.17g, |g| %.3g", wg, wf, gn);
    free(x0);
    free(v);
}

static void backward_fd_suite(mg_m1_dims d, int B, int T, unsigned long long seed,
                              size_t per_tensor, const char *label)
{
    model m;
    model_make(&m, d, seed);
    mg_rng r;
    mg_rng_seed(&r, seed + 100);
    const int L = d.n_layers, in_dim = d.input_dim > 0 ? d.input_dim : d.d_model;
    /* dt of order 1 (the init's dt in [1e-3, 1e-1] leaves the dt path with
     * gradients near the finite differences' rounding noise), and one
     * channel on softplus' linear branch (threshold 20). */
    for (int li = 0; li < L; li++)
        for (int e = 0; e < d.d_inner; e++)
            m.w[m.l.layers[li].dt_proj_b + e] = mg_rng_normal(&r);
    m.w[m.l.layers[L - 1].dt_proj_b] = 25.0;
    /* Spread the weights a bit so no term is negligible. */
    for (int li = 0; li < L; li++)
        for (int k = 0; k < d.d_model; k++)
            m.w[m.l.layers[li].norm_w + k] += 0.2 * mg_rng_normal(&r);

    fdcase c;
    c.m = &m;
    c.B = B;
    c.T = T;
    c.nu = (size_t)B * T * in_dim;
    c.ncs = (size_t)L * B * m.ncs;
    c.nss = (size_t)L * B * m.nss;
    c.nout = (size_t)B * T * d.d_model;
    c.u = dvec(c.nu);
    c.cs = dvec(c.ncs);
    c.ss = dvec(c.nss);
    c.dout = dvec(c.nout);
    c.csw = dvec(c.ncs);
    c.ssw = dvec(c.nss);
    c.out = dvec(c.nout);
    fill_normal(&r, c.u, c.nu, 1);
    fill_normal(&r, c.cs, c.ncs, 1);
    fill_normal(&r, c.ss, c.nss, 0.5);
    fill_normal(&r, c.dout, c.nout, 1);

    double *gw = dvec(m.l.total), *du = dvec(c.nu), *dcs = dvec(c.ncs), *dss = dvec(c.nss);
    for (size_t i = 0; i < m.l.total; i++)
        gw[i] = NAN;   /* must be overwritten */
    mg_status s = mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, c.cs, c.ss, c.dout,
                                             gw, du, dcs, dss);
    tap_is_int(s, MG_OK, "backward %s: ok", label);

    mg_m1_tensor t[64];
    int nt = mg_ref_mamba1_tensors(&m.d, &m.l, t, 64);
    int pad0 = 1;
    for (int i = 0; i < nt; i++) {
        size_t end = i + 1 < nt ? t[i + 1].offset : m.l.total;
        for (size_t k = t[i].offset + t[i].numel; k < end; k++)
            if (gw[k] != 0.0)
                pad0 = 0;
    }
    tap_ok(pad0, "backward %s: grad_blob padding is zero", label);
    char what[128];
    for (int i = 0; i < nt; i++) {
        snprintf(what, sizeof what, "%.40s %.63s", label, t[i].name);
        fd_check(&c, &r, m.w + t[i].offset, gw + t[i].offset, t[i].numel, per_tensor, 1e-6, what);
    }
    snprintf(what, sizeof what, "%s du", label);
    fd_check(&c, &r, c.u, du, c.nu, per_tensor * 4, 1e-6, what);
    snprintf(what, sizeof what, "%s d conv_state_in", label);
    fd_check(&c, &r, c.cs, dcs, c.ncs, per_tensor * 4, 1e-6, what);
    snprintf(what, sizeof what, "%s d ssm_state_in", label);
    fd_check(&c, &r, c.ss, dss, c.nss, per_tensor * 4, 1e-6, what);

    /* Each tensor, the input and each initial state as a whole: directional
     * derivatives (every entry, also where the entries above are a sample). */
    for (int i = 0; i < nt; i++) {
        snprintf(what, sizeof what, "%.40s %.63s", label, t[i].name);
        fd_dir_check(&c, &r, m.w + t[i].offset, gw + t[i].offset, t[i].numel, 4, 1e-6, what);
    }
    snprintf(what, sizeof what, "%s du", label);
    fd_dir_check(&c, &r, c.u, du, c.nu, 4, 1e-6, what);
    snprintf(what, sizeof what, "%s d conv_state_in", label);
    fd_dir_check(&c, &r, c.cs, dcs, c.ncs, 4, 1e-6, what);
    snprintf(what, sizeof what, "%s d ssm_state_in", label);
    fd_dir_check(&c, &r, c.ss, dss, c.nss, 4, 1e-6, what);

    /* Every parameter at once: the directional derivative along a random
     * direction v equals <grad, v>. */
    {
        double *v = dvec(m.l.total), *w0 = dvec(m.l.total);
        memcpy(w0, m.w, m.l.total * sizeof *w0);
        double gv = 0, h = 1e-6;
        for (int i = 0; i < nt; i++)
            for (size_t k = t[i].offset; k < t[i].offset + t[i].numel; k++) {
                v[k] = mg_rng_normal(&r);
                gv += gw[k] * v[k];
            }
        for (size_t k = 0; k < m.l.total; k++)
            m.w[k] = w0[k] + h * v[k];
        double lp = loss(&c);
        for (size_t k = 0; k < m.l.total; k++)
            m.w[k] = w0[k] - h * v[k];
        double lm = loss(&c);
        memcpy(m.w, w0, m.l.total * sizeof *w0);
        double f = (lp - lm) / (2 * h);
        tap_near(gv, f, 0, 1e-6, "backward %s: directional derivative over all parameters", label);
        free(v);
        free(w0);
    }

    /* Optional outputs may be NULL; NULL initial states mean zeros. */
    double *gw2 = dvec(m.l.total);
    mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, c.cs, c.ss, c.dout, gw2,
                               NULL, NULL, NULL);
    tap_ok(memcmp(gw, gw2, m.l.total * sizeof *gw) == 0,
           "backward %s: same grads with du/dstate outputs NULL", label);
    double *zc = dvec(c.ncs), *zs = dvec(c.nss), *gw3 = dvec(m.l.total);
    mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, NULL, NULL, c.dout, gw2,
                               NULL, NULL, NULL);
    mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, zc, zs, c.dout, gw3,
                               NULL, NULL, NULL);
    tap_ok(memcmp(gw3, gw2, m.l.total * sizeof *gw) == 0,
           "backward %s: NULL initial states = zero states", label);

    /* The f32 entry point: same as f64 on the f32-rounded values. */
    float *wf = malloc(m.l.total * sizeof *wf), *uf = malloc(c.nu * sizeof *uf);
    for (size_t k = 0; k < m.l.total; k++) {
        wf[k] = (float)m.w[k];
        m.w[k] = wf[k];
    }
    for (size_t k = 0; k < c.nu; k++) {
        uf[k] = (float)c.u[k];
        c.u[k] = uf[k];
    }
    mg_ref_mamba1_backward(&m.d, &m.l, wf, B, T, uf, c.cs, c.ss, c.dout, gw2, NULL, NULL, NULL);
    mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, c.cs, c.ss, c.dout, gw3, NULL, NULL, NULL);
    tap_ok(memcmp(gw3, gw2, m.l.total * sizeof *gw) == 0,
           "backward %s: f32 entry point = f64 on the same values", label);
    tap_is_int(mg_ref_mamba1_backward_f64(&m.d, &m.l, m.w, B, T, c.u, NULL, NULL, c.dout, NULL,
                                          NULL, NULL, NULL),
               MG_ERR_INVALID_ARG, "backward %s: NULL grad_blob rejected", label);

    free(wf); free(uf); free(zc); free(zs); free(gw2); free(gw3);
    free(gw); free(du); free(dcs); free(dss);
    free(c.u); free(c.cs); free(c.ss); free(c.dout); free(c.csw); free(c.ssw); free(c.out);
    model_free(&m);
}

int main(void)
{
    test_layout();
    test_init();
    test_hand();
    test_conv_scan();
    test_continuation_batch();
    /* input_dim > 0, two layers: every entry of every tensor. */
    mg_m1_dims d1 = { .d_model = 4, .n_layers = 2, .d_state = 3, .d_inner = 8,
                      .d_conv = 3, .dt_rank = 2, .input_dim = 3, .norm_eps = 1e-5 };
    backward_fd_suite(d1, 2, 5, 21, (size_t)-1, "[I=3 L=2]");
    /* identity input, one layer, K=4 > T: random entries. */
    mg_m1_dims d2 = { .d_model = 6, .n_layers = 1, .d_state = 2, .d_inner = 12,
                      .d_conv = 4, .dt_rank = 1, .input_dim = 0, .norm_eps = 1e-5 };
    backward_fd_suite(d2, 2, 2, 33, 6, "[I=0 L=1 T<K]");
    return tap_done();
}
