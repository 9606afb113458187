/* test_ref_seqs.c: the reference paths with episode starts and packed
 * sequences (mg_ref_seqs.h; the *_ex entry points of mg_ref_mamba1.h and
 * mg_ref_mamba3.h), every group run for both architectures through one
 * adapter (ref_seqs_arch.h):
 *   - the segment plan of a mask and of cu_seqlens;
 *   - bad options and arguments: a clear status and message, nothing
 *     written;
 *   - starts at t = 0, at chunk edges, mid-chunk, on consecutive tokens,
 *     on every token and on none, forward and backward, against the
 *     test's own hand split (bit-identical; weight gradients to 1e-13, the
 *     sum order differs), against the plain call (no starts), against
 *     token-by-token steps with the states zeroed at each start (the decode
 *     reset), and the boundary seen from both sides;
 *   - packed sequences of lengths 1, Q-1, Q, Q+1 and 3Q+2, with and without
 *     starts inside, against the hand split and against a start mask;
 *   - the backward with starts and packed against central finite
 *     differences of the forward with the same options;
 *   - the f32 entry points.
 * Q = 4 stands for the chunk length of the GPU scans the cases are placed
 * against. CPU only. */
#include "tap.h"
#include "ref_seqs_arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define Q 4
/* Weight gradients are sums over segments; the hand split adds them in
 * the opposite order to the library's plan, and f64 addition is not
 * associative, so they agree to rounding, not to the bit. */
#define WGRAD_TOL 1e-13

/* ------------------------------------------------------------ cases */

/* Batched: B streams of T tokens. */
enum { B = 5, T = 13 };

/* The start mask of the batched case:
 *   0: none; 1: t = 0 and t = 2Q (a chunk edge); 2: t = 5 (mid-chunk),
 *   6, 7 (consecutive) and 12 (the last token); 3: every token;
 *   4: t = Q-1 and Q (consecutive, across a chunk edge) and 11. */
static void mask_pattern(unsigned char *m)
{
    memset(m, 0, (size_t)B * T);
    m[1 * T + 0] = m[1 * T + 2 * Q] = 1;
    m[2 * T + 5] = m[2 * T + 6] = m[2 * T + 7] = m[2 * T + 12] = 1;
    memset(m + 3 * T, 1, T);
    m[4 * T + Q - 1] = m[4 * T + Q] = m[4 * T + 11] = 1;
}

static void streams_batched(hstream *s, int nb, int nt)
{
    for (int b = 0; b < nb; b++) {
        s[b].row = (size_t)b * nt;
        s[b].len = nt;
    }
}

/* Packed: lengths 1, Q-1, Q, Q+1, 3Q+2 in a buffer of CAP tokens. */
enum { NSEQ = 5, CAP = 30 };
static const int32_t CU[NSEQ + 1] = { 0, 1, Q, 2 * Q, 3 * Q + 1, 6 * Q + 3 };

static void streams_packed(hstream *s, const int32_t *cu, int nseq)
{
    for (int i = 0; i < nseq; i++) {
        s[i].row = (size_t)cu[i];
        s[i].len = cu[i + 1] - cu[i];
    }
}

static mg_ref_seqs opts_start(const unsigned char *m)
{
    mg_ref_seqs o = { m, NULL, 0, 0 };
    return o;
}

static mg_ref_seqs opts_packed(const unsigned char *m, const int32_t *cu, int nseq, int max)
{
    mg_ref_seqs o = { m, cu, nseq, max };
    return o;
}

static void states_copy(const arch *a, int nstr, double **dst, double *const *src)
{
    for (int k = 0; k < a->ns; k++)
        memcpy(dst[k], src[k], states_n(a, nstr, k) * sizeof *dst[k]);
}

static int states_same(const arch *a, int nstr, double *const *x, double *const *y)
{
    int ok = 1;
    for (int k = 0; k < a->ns; k++)
        ok &= same(x[k], y[k], states_n(a, nstr, k));
    return ok;
}

/* ------------------------------------------------------------ plan */

static void test_plan(void)
{
    unsigned char m[2 * 6] = { 1, 0, 1, 1, 0, 0,
                               0, 0, 0, 0, 0, 1 };
    mg_ref_seqs o = opts_start(m);
    mg_ref_plan p;
    tap_is_int(mg_ref_seqs_plan(&o, 2, 6, "t", &p), MG_OK, "plan: start mask ok");
    /* stream 0: [0,2) start, [2,3) start, [3,6) start; stream 1: [0,5) init, [5,6) start */
    int rows[5] = { 0, 2, 3, 6, 11 }, lens[5] = { 2, 1, 3, 5, 1 };
    int init[5] = { 0, 0, 0, 1, 0 }, fin[5] = { 0, 0, 1, 0, 1 };
    int ok = p.nseg == 5 && p.nstreams == 2 && p.ntok == 12;
    for (int i = 0; ok && i < 5; i++)
        ok = (int)p.seg[i].row == rows[i] && p.seg[i].len == lens[i]
             && p.seg[i].stream == i / 3 && p.seg[i].from_init == init[i]
             && p.seg[i].to_final == fin[i];
    tap_ok(ok, "plan: segments, streams, from_init and to_final of a mask");
    mg_ref_seqs_plan_free(&p);
    tap_ok(p.seg == NULL, "plan: freed");

    int32_t cu[4] = { 0, 2, 3, 7 };
    unsigned char pm[9] = { 0, 0, 1, 0, 0, 1, 0, 1, 1 };
    o = opts_packed(pm, cu, 3, 3);
    tap_is_int(mg_ref_seqs_plan(&o, 1, 9, "t", &p), MG_OK, "plan: packed ok");
    /* seq 0 [0,2) init; seq 1 [2,3) start; seq 2 [3,5) init, [5,7) start */
    ok = p.nseg == 4 && p.nstreams == 3 && p.ntok == 7 && p.seg[0].from_init
         && p.seg[0].to_final && !p.seg[1].from_init && p.seg[1].stream == 1
         && p.seg[2].row == 3 && p.seg[2].len == 2 && p.seg[2].from_init
         && !p.seg[2].to_final && p.seg[3].row == 5 && p.seg[3].len == 2
         && !p.seg[3].from_init && p.seg[3].to_final && p.seg[3].stream == 2;
    tap_ok(ok, "plan: packed segments (the starts past cu_seqlens[nseq] are not read)");
    mg_ref_seqs_plan_free(&p);
    tap_is_int(mg_ref_seqs_plan(NULL, 3, 4, NULL, &p), MG_OK, "plan: NULL options ok");
    tap_ok(p.nseg == 3 && p.seg[1].row == 4 && p.seg[1].len == 4 && p.seg[1].from_init
           && p.seg[1].to_final, "plan: NULL options, one segment per stream");
    mg_ref_seqs_plan_free(&p);
}

/* ------------------------------------------------------------ errors */

typedef struct bad {
    const char *what;
    int batch, seqlen;
    int32_t cu[4];
    int has_cu, nseq, max_seqs;
    mg_status want;
    const char *msg;
} bad;

static const bad BAD[] = {
    { "cu_seqlens[0] != 0", 1, 10, { 1, 3, 5 }, 1, 2, 4, MG_ERR_INVALID_ARG, "cu_seqlens[0] must be 0" },
    { "an empty sequence", 1, 10, { 0, 3, 3, 5 }, 1, 3, 4, MG_ERR_INVALID_ARG, "no empty sequence" },
    { "decreasing cu_seqlens", 1, 10, { 0, 4, 2, 5 }, 1, 3, 4, MG_ERR_INVALID_ARG, "strictly increasing" },
    { "a total past the buffer", 1, 10, { 0, 3, 11 }, 1, 2, 4, MG_ERR_SIZE, "the 10 the buffer holds" },
    { "more sequences than max_seqs", 1, 10, { 0, 1, 2, 3 }, 1, 3, 2, MG_ERR_SIZE, "more than max_seqs 2" },
    { "nseq 0", 1, 10, { 0 }, 1, 0, 4, MG_ERR_INVALID_ARG, "nseq >= 1" },
    { "packed with batch 2", 2, 5, { 0, 3, 5 }, 1, 2, 4, MG_ERR_INVALID_ARG, "need batch 1" },
    { "nseq without cu_seqlens", 1, 10, { 0 }, 0, 2, 0, MG_ERR_INVALID_ARG, "without cu_seqlens" },
};

/* Sentinel-filled buffers: a failed call must leave them as they were. */
static void sentinel(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = 7.25;
}

static int untouched(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 7.25)
            return 0;
    return 1;
}

static void test_errors(const arch *a)
{
    const size_t rows = 10;
    double *u = dz(rows * a->I), *out = dz(rows * a->D), *dout = dz(rows * a->D);
    double *du = dz(rows * a->I), *g = dz(a->nblob);
    double *st[4], *d0[4], *dT[4] = { NULL };
    states_new(a, 4, st, NULL, 0, 0);
    states_new(a, 4, d0, NULL, 0, 0);
    unsigned char m[10] = { 0 };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const bad *c = &BAD[i];
        mg_ref_seqs o = opts_packed(m, c->has_cu ? c->cu : NULL, c->nseq, c->max_seqs);
        sentinel(out, rows * a->D);
        for (int k = 0; k < a->ns; k++)
            sentinel(st[k], states_n(a, 4, k));
        mg_status s = arch_fwd(a, c->batch, c->seqlen / c->batch, u, out, st, &o);
        int clean = untouched(out, rows * a->D);
        for (int k = 0; k < a->ns; k++)
            clean &= untouched(st[k], states_n(a, 4, k));
        tap_ok(s == c->want && strstr(mg_last_error(), c->msg) && strstr(mg_last_error(), "forward_ex")
               && clean, "%s errors: forward with %s: %s, nothing written (%s)", a->name, c->what,
               mg_status_name(c->want), mg_last_error());
        sentinel(g, a->nblob);
        sentinel(du, rows * a->I);
        for (int k = 0; k < a->ns; k++)
            sentinel(d0[k], states_n(a, 4, k));
        s = arch_bwd(a, c->batch, c->seqlen / c->batch, u, st, dout, dT, NULL, g, du, d0, &o);
        clean = untouched(g, a->nblob) && untouched(du, rows * a->I);
        for (int k = 0; k < a->ns; k++)
            clean &= untouched(d0[k], states_n(a, 4, k));
        tap_ok(s == c->want && strstr(mg_last_error(), c->msg) && strstr(mg_last_error(), "backward_ex")
               && clean, "%s errors: backward with %s: %s, nothing written (%s)", a->name, c->what,
               mg_status_name(c->want), mg_last_error());
    }
    /* NULL where required, with valid options. */
    int32_t cu[3] = { 0, 4, 10 };
    mg_ref_seqs o = opts_packed(NULL, cu, 2, 2);
    sentinel(out, rows * a->D);
    tap_is_int(arch_fwd(a, 1, 10, NULL, out, st, &o), MG_ERR_INVALID_ARG,
               "%s errors: forward with u NULL rejected (%s)", a->name, mg_last_error());
    tap_ok(untouched(out, rows * a->D), "%s errors: u NULL: nothing written", a->name);
    if (!a->mamba3)   /* Mamba-3's out may be NULL */
        tap_is_int(arch_fwd(a, 1, 10, u, NULL, st, &o), MG_ERR_INVALID_ARG,
                   "%s errors: forward with out NULL rejected (%s)", a->name, mg_last_error());
    sentinel(du, rows * a->I);
    tap_is_int(arch_bwd(a, 1, 10, u, st, NULL, dT, NULL, g, du, d0, &o), MG_ERR_INVALID_ARG,
               "%s errors: backward with dout NULL rejected (%s)", a->name, mg_last_error());
    tap_is_int(arch_bwd(a, 1, 10, u, st, dout, dT, NULL, NULL, du, d0, &o), MG_ERR_INVALID_ARG,
               "%s errors: backward with the weight gradient NULL rejected (%s)", a->name,
               mg_last_error());
    tap_ok(untouched(du, rows * a->I), "%s errors: NULL outputs: nothing written", a->name);
    states_free(a, st);
    states_free(a, d0);
    free(u); free(out); free(dout); free(du); free(g);
}

/* ------------------------------------------------------------ starts, forward */

/* A call with the mask against the hand split, from the states st0. */
static void fwd_vs_hand(const arch *a, const unsigned char *m, const double *u, double **st0,
                        const char *what)
{
    hstream s[B];
    streams_batched(s, B, T);
    size_t no = (size_t)B * T * a->D;
    double *o1 = dz(no), *o2 = dz(no), *s1[4], *s2[4];
    states_new(a, B, s1, NULL, 0, 0);
    states_new(a, B, s2, NULL, 0, 0);
    states_copy(a, B, s1, st0);
    states_copy(a, B, s2, st0);
    mg_ref_seqs o = opts_start(m);
    tap_is_int(arch_fwd(a, B, T, u, o1, s1, &o), MG_OK, "%s starts %s: forward ok", a->name, what);
    hand_fwd(a, B, s, m, u, o2, s2);
    tap_ok(same(o1, o2, no), "%s starts %s: outputs bit-identical to the hand split", a->name, what);
    tap_ok(states_same(a, B, s1, s2), "%s starts %s: final states bit-identical to the hand split",
           a->name, what);
    states_free(a, s1);
    states_free(a, s2);
    free(o1); free(o2);
}

/* Token by token, the states of a stream zeroed before each of its starts
 * (what a decode step with a reset mask does), against one masked call. */
static void steps_vs_mask(const arch *a, const unsigned char *m, const double *u, double **st0)
{
    size_t no = (size_t)B * T * a->D;
    double *o1 = dz(no), *o2 = dz(no), *s1[4], *s2[4];
    double *ut = dz((size_t)B * a->I), *ot = dz((size_t)B * a->D);
    states_new(a, B, s1, NULL, 0, 0);
    states_new(a, B, s2, NULL, 0, 0);
    states_copy(a, B, s1, st0);
    states_copy(a, B, s2, st0);
    mg_ref_seqs o = opts_start(m);
    arch_fwd(a, B, T, u, o1, s1, &o);
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            memcpy(ut + (size_t)b * a->I, u + ((size_t)b * T + t) * a->I, a->I * sizeof *ut);
            if (m[b * T + t])
                for (int k = 0; k < a->ns; k++)
                    for (int l = 0; l < a->L; l++)
                        memset(s2[k] + ((size_t)l * B + b) * a->per[k], 0,
                               a->per[k] * sizeof *s2[k]);
        }
        arch_fwd(a, B, 1, ut, ot, s2, NULL);
        for (int b = 0; b < B; b++)
            memcpy(o2 + ((size_t)b * T + t) * a->D, ot + (size_t)b * a->D, a->D * sizeof *ot);
    }
    tap_ok(same(o1, o2, no), "%s starts: outputs bit-identical to steps with the states zeroed "
           "at each start (max rel %.1e)", a->name, rel_diff(o1, o2, no));
    tap_ok(states_same(a, B, s1, s2), "%s starts: final states bit-identical to those steps",
           a->name);
    states_free(a, s1);
    states_free(a, s2);
    free(o1); free(o2); free(ut); free(ot);
}

static void test_fwd_starts(const arch *a, mg_rng *r)
{
    size_t nu = (size_t)B * T * a->I, no = (size_t)B * T * a->D;
    double *u = dz(nu), *st0[4];
    fill(r, u, nu, -1.5, 1.5);
    states_new(a, B, st0, r, -0.5, 0.5);
    unsigned char m[B * T], zeros[B * T], ones[B * T];
    mask_pattern(m);
    memset(zeros, 0, sizeof zeros);
    memset(ones, 1, sizeof ones);
    fwd_vs_hand(a, m, u, st0, "(t=0, chunk edges, mid-chunk, consecutive, last, all, none)");
    fwd_vs_hand(a, zeros, u, st0, "(none anywhere)");
    fwd_vs_hand(a, ones, u, st0, "(every token)");

    /* No starts = the plain call; empty options = the plain call. */
    double *o1 = dz(no), *o2 = dz(no), *s1[4], *s2[4];
    states_new(a, B, s1, NULL, 0, 0);
    states_new(a, B, s2, NULL, 0, 0);
    states_copy(a, B, s1, st0);
    states_copy(a, B, s2, st0);
    mg_ref_seqs oz = opts_start(zeros), empty = { NULL, NULL, 0, 0 };
    arch_fwd(a, B, T, u, o1, s1, &oz);
    arch_fwd(a, B, T, u, o2, s2, NULL);
    tap_ok(same(o1, o2, no) && states_same(a, B, s1, s2),
           "%s starts: an all-zero mask gives the plain batched call, bit for bit", a->name);
    states_copy(a, B, s1, st0);
    arch_fwd(a, B, T, u, o1, s1, &empty);
    tap_ok(same(o1, o2, no) && states_same(a, B, s1, s2),
           "%s starts: options without start or cu_seqlens give the plain call", a->name);

    /* A start at t = 0 ignores the initial state: stream 1's and 3's
     * changed, nothing else does. */
    mg_ref_seqs om = opts_start(m);
    states_copy(a, B, s1, st0);
    arch_fwd(a, B, T, u, o1, s1, &om);
    states_copy(a, B, s2, st0);
    for (int k = 0; k < a->ns; k++)
        for (int l = 0; l < a->L; l++)
            for (int b = 1; b <= 3; b += 2)
                fill(r, s2[k] + ((size_t)l * B + b) * a->per[k], a->per[k], 2.0, 3.0);
    arch_fwd(a, B, T, u, o2, s2, &om);
    tap_ok(same(o1, o2, no) && states_same(a, B, s1, s2),
           "%s starts: a start at t=0 ignores that stream's initial state", a->name);
    /* ... and a start without the state also holds the other way: the
     * same stream without the start at t = 0 does see it. */
    unsigned char m2[B * T];
    memcpy(m2, m, sizeof m2);
    m2[1 * T] = 0;
    mg_ref_seqs om2 = opts_start(m2);
    states_copy(a, B, s1, st0);
    arch_fwd(a, B, T, u, o1, s1, &om2);
    states_copy(a, B, s2, st0);
    for (int k = 0; k < a->ns; k++)
        for (int l = 0; l < a->L; l++)
            fill(r, s2[k] + ((size_t)l * B + 1) * a->per[k], a->per[k], 2.0, 3.0);
    arch_fwd(a, B, T, u, o2, s2, &om2);
    tap_ok(!same(o1 + (size_t)1 * T * a->D, o2 + (size_t)1 * T * a->D, a->D),
           "%s starts: (sensitivity) without the start the initial state changes the first output",
           a->name);

    /* The boundary from both sides: input before stream 2's start at t=5
     * moves the outputs before it and none after it. */
    states_copy(a, B, s1, st0);
    arch_fwd(a, B, T, u, o1, s1, &om);
    double keep = u[((size_t)2 * T + 4) * a->I];
    u[((size_t)2 * T + 4) * a->I] += 0.5;
    states_copy(a, B, s2, st0);
    arch_fwd(a, B, T, u, o2, s2, &om);
    u[((size_t)2 * T + 4) * a->I] = keep;
    size_t r5 = ((size_t)2 * T + 5) * a->D, r4 = ((size_t)2 * T + 4) * a->D;
    tap_ok(!same(o1 + r4, o2 + r4, a->D) && same(o1 + r5, o2 + r5, (size_t)(T - 5) * a->D),
           "%s starts: input before a start reaches no output after it", a->name);

    steps_vs_mask(a, m, u, st0);
    states_free(a, s1);
    states_free(a, s2);
    states_free(a, st0);
    free(o1); free(o2); free(u);
}

/* ------------------------------------------------------------ starts, backward */

typedef struct bwd_out {
    double *out, *g, *du, *d0[4];
} bwd_out;

static void bwd_out_new(const arch *a, int nstr, size_t rows, bwd_out *x)
{
    x->out = dz(rows * a->D);
    x->g = dz(a->nblob);
    x->du = dz(rows * a->I);
    states_new(a, nstr, x->d0, NULL, 0, 0);
}

static void bwd_out_free(const arch *a, bwd_out *x)
{
    free(x->out); free(x->g); free(x->du);
    states_free(a, x->d0);
}

/* Compares two backward results over rows: outputs, du and initial-state
 * gradients bit for bit, weight gradients to WGRAD_TOL. */
static void bwd_compare(const arch *a, int nstr, size_t rows, const bwd_out *x,
                        const bwd_out *y, const char *what)
{
    double eg = rel_diff(x->g, y->g, a->nblob);
    tap_ok(same(x->du, y->du, rows * a->I), "%s %s: du bit-identical", a->name, what);
    tap_ok(states_same(a, nstr, x->d0, y->d0), "%s %s: initial-state gradients bit-identical",
           a->name, what);
    if (a->mamba3)
        tap_ok(same(x->out, y->out, rows * a->D), "%s %s: the backward's outputs bit-identical",
               a->name, what);
    tap_ok(eg < WGRAD_TOL, "%s %s: weight gradients equal to %.0e (rel %.1e)", a->name, what,
           WGRAD_TOL, eg);
}

static void test_bwd_starts(const arch *a, mg_rng *r)
{
    size_t rows = (size_t)B * T, nu = rows * a->I, no = rows * a->D;
    double *u = dz(nu), *dout = dz(no), *st0[4], *dT[4] = { NULL };
    fill(r, u, nu, -1.5, 1.5);
    fill(r, dout, no, -1.0, 1.0);
    states_new(a, B, st0, r, -0.5, 0.5);
    if (a->has_dT)
        states_new(a, B, dT, r, -0.5, 0.5);
    unsigned char m[B * T], zeros[B * T], ones[B * T];
    mask_pattern(m);
    memset(zeros, 0, sizeof zeros);
    memset(ones, 1, sizeof ones);
    const unsigned char *masks[3] = { m, zeros, ones };
    const char *names[3] = { "backward starts (pattern)", "backward starts (none)",
                             "backward starts (every token)" };
    hstream s[B];
    streams_batched(s, B, T);
    bwd_out x, y;
    bwd_out_new(a, B, rows, &x);
    bwd_out_new(a, B, rows, &y);
    for (int i = 0; i < 3; i++) {
        mg_ref_seqs o = opts_start(masks[i]);
        tap_is_int(arch_bwd(a, B, T, u, st0, dout, dT, x.out, x.g, x.du, x.d0, &o), MG_OK,
                   "%s %s: ok", a->name, names[i]);
        hand_bwd(a, B, s, masks[i], u, st0, dout, dT, y.out, y.g, y.du, y.d0);
        bwd_compare(a, B, rows, &x, &y, names[i]);
        if (i == 0) {
            /* streams 1 and 3 start at t = 0: no gradient into their
             * initial state; stream 0 has one */
            int zero = 1, nonzero = 0;
            for (int k = 0; k < a->ns; k++)
                for (int l = 0; l < a->L; l++)
                    for (size_t j = 0; j < a->per[k]; j++) {
                        zero &= x.d0[k][((size_t)l * B + 1) * a->per[k] + j] == 0.0;
                        zero &= x.d0[k][((size_t)l * B + 3) * a->per[k] + j] == 0.0;
                        nonzero |= x.d0[k][((size_t)l * B + 0) * a->per[k] + j] != 0.0;
                    }
            tap_ok(zero && nonzero, "%s backward starts: initial-state gradients exactly 0 where "
                   "t=0 starts an episode (and not elsewhere)", a->name);
        }
    }
    /* No starts: the plain batched backward. */
    mg_ref_seqs oz = opts_start(zeros);
    arch_bwd(a, B, T, u, st0, dout, dT, x.out, x.g, x.du, x.d0, &oz);
    arch_bwd(a, B, T, u, st0, dout, dT, y.out, y.g, y.du, y.d0, NULL);
    bwd_compare(a, B, rows, &x, &y, "backward, all-zero mask vs the plain call");
    bwd_out_free(a, &x);
    bwd_out_free(a, &y);
    states_free(a, st0);
    if (a->has_dT)
        states_free(a, dT);
    free(u); free(dout);
}

/* ------------------------------------------------------------ packed */

static void test_packed(const arch *a, mg_rng *r)
{
    size_t nu = (size_t)CAP * a->I, no = (size_t)CAP * a->D, ntok = (size_t)CU[NSEQ];
    double *u = dz(nu), *dout = dz(no), *st0[4], *dT[4] = { NULL };
    fill(r, u, nu, -1.5, 1.5);
    fill(r, dout, no, -1.0, 1.0);
    states_new(a, NSEQ, st0, r, -0.5, 0.5);
    if (a->has_dT)
        states_new(a, NSEQ, dT, r, -0.5, 0.5);
    hstream s[NSEQ];
    streams_packed(s, CU, NSEQ);
    /* starts inside: the first token of sequence 2 (its initial state is
     * then ignored), a chunk edge and consecutive tokens in the long one */
    unsigned char in[CAP];
    memset(in, 0, sizeof in);
    in[CU[2]] = 1;
    in[CU[4] + Q] = in[CU[4] + 2 * Q - 1] = in[CU[4] + 2 * Q] = 1;
    in[CU[3] + 2] = 1;
    const unsigned char *masks[2] = { NULL, in };
    const char *names[2] = { "packed", "packed with starts inside" };

    double *o1 = dz(no), *o2 = dz(no), *s1[4], *s2[4];
    states_new(a, NSEQ, s1, NULL, 0, 0);
    states_new(a, NSEQ, s2, NULL, 0, 0);
    bwd_out x, y;
    bwd_out_new(a, NSEQ, CAP, &x);
    bwd_out_new(a, NSEQ, CAP, &y);
    for (int i = 0; i < 2; i++) {
        mg_ref_seqs o = opts_packed(masks[i], CU, NSEQ, 8);
        sentinel(o1, no);
        states_copy(a, NSEQ, s1, st0);
        states_copy(a, NSEQ, s2, st0);
        tap_is_int(arch_fwd(a, 1, CAP, u, o1, s1, &o), MG_OK, "%s %s: forward ok", a->name, names[i]);
        hand_fwd(a, NSEQ, s, masks[i], u, o2, s2);
        tap_ok(same(o1, o2, ntok * a->D), "%s %s (lengths 1, Q-1, Q, Q+1, 3Q+2): outputs "
               "bit-identical to the hand split", a->name, names[i]);
        tap_ok(states_same(a, NSEQ, s1, s2), "%s %s: final states bit-identical to the hand split",
               a->name, names[i]);
        int tail0 = 1;
        for (size_t j = ntok * a->D; j < no; j++)
            tail0 &= o1[j] == 0.0;
        tap_ok(tail0, "%s %s: output rows past cu_seqlens[nseq] are zeros", a->name, names[i]);

        sentinel(x.du, CAP * a->I);
        tap_is_int(arch_bwd(a, 1, CAP, u, st0, dout, dT, x.out, x.g, x.du, x.d0, &o), MG_OK,
                   "%s %s: backward ok", a->name, names[i]);
        hand_bwd(a, NSEQ, s, masks[i], u, st0, dout, dT, y.out, y.g, y.du, y.d0);
        bwd_compare(a, NSEQ, ntok, &x, &y, names[i]);
        int dtail0 = 1;
        for (size_t j = ntok * a->I; j < nu; j++)
            dtail0 &= x.du[j] == 0.0;
        tap_ok(dtail0, "%s %s: du rows past cu_seqlens[nseq] are zeros", a->name, names[i]);
    }

    /* Packed from zero states = one stream with a start at every
     * sequence's first token; its final state is the last sequence's. */
    unsigned char at_cu[CAP];
    memset(at_cu, 0, sizeof at_cu);
    for (int i = 0; i < NSEQ; i++)
        at_cu[CU[i]] = 1;
    double *z1[4], *z2[4];
    states_new(a, NSEQ, z1, NULL, 0, 0);
    states_new(a, 1, z2, NULL, 0, 0);
    mg_ref_seqs op = opts_packed(NULL, CU, NSEQ, NSEQ), om = opts_start(at_cu);
    arch_fwd(a, 1, CAP, u, o1, z1, &op);
    arch_fwd(a, 1, (int)ntok, u, o2, z2, &om);
    int last = 1;
    for (int k = 0; k < a->ns; k++)
        for (int l = 0; l < a->L; l++)
            last &= same(z1[k] + ((size_t)l * NSEQ + NSEQ - 1) * a->per[k],
                         z2[k] + (size_t)l * a->per[k], a->per[k]);
    tap_ok(same(o1, o2, ntok * a->D) && last, "%s packed: the same as a start mask at "
           "cu_seqlens over one stream (outputs, the last final state)", a->name);
    states_free(a, z1);
    states_free(a, z2);
    bwd_out_free(a, &x);
    bwd_out_free(a, &y);
    states_free(a, s1);
    states_free(a, s2);
    states_free(a, st0);
    if (a->has_dT)
        states_free(a, dT);
    free(o1); free(o2); free(u); free(dout);
}

/* ------------------------------------------------------------ finite differences */

/* loss = <out, dout> + <final states, dT> (Mamba-3: dT) of a call with
 * options o from the states st0. */
typedef struct fdc {
    const arch *a;
    int b, t;
    double *u, *st0[4], *dout, *dT[4];
    const mg_ref_seqs *o;
    size_t rows;
} fdc;

static double dot(const double *x, const double *y, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static double loss(const fdc *c)
{
    const arch *a = c->a;
    int nstr = c->o->cu_seqlens ? c->o->nseq : c->b;
    double *out = dz(c->rows * a->D), *st[4];
    states_new(a, nstr, st, NULL, 0, 0);
    states_copy(a, nstr, st, c->st0);
    double l = NAN;
    if (arch_fwd(a, c->b, c->t, c->u, out, st, c->o) == MG_OK) {
        l = dot(out, c->dout, c->rows * a->D);
        for (int k = 0; a->has_dT && k < a->ns; k++)
            l += dot(st[k], c->dT[k], states_n(a, nstr, k));
    }
    states_free(a, st);
    free(out);
    return l;
}

/* d/dh loss(x + h v) at 0: central differences at h and h/2, Richardson. */
static double fd_dir(const fdc *c, double *x, const double *v, size_t n, double h)
{
    double *x0 = dz(n), d[2];
    memcpy(x0, x, n * sizeof *x0);
    for (int i = 0; i < 2; i++) {
        double hh = h / (1 << i);
        for (size_t j = 0; j < n; j++)
            x[j] = x0[j] + hh * v[j];
        double lp = loss(c);
        for (size_t j = 0; j < n; j++)
            x[j] = x0[j] - hh * v[j];
        double lm = loss(c);
        d[i] = (lp - lm) / (2 * hh);
    }
    memcpy(x, x0, n * sizeof *x0);
    free(x0);
    return (4 * d[1] - d[0]) / 3;
}

#define FD_H (1.0 / 1024)
#define FD_TOL 1e-6
#define N_DIRS 3

/* Worst error of <g, v> against the differences along N_DIRS random v:
 * |fd - <g, v>| / max(|<g, v>|, 1e-3 |g|), the better of two step sizes
 * (a step can cross the angle's wrap at 2 pi or a softplus bend). */
static double dir_check(const fdc *c, mg_rng *r, double *x, const double *g, size_t n)
{
    double *v = dz(n), worst = 0, gn = sqrt(dot(g, g, n));
    for (int k = 0; k < N_DIRS; k++) {
        for (size_t j = 0; j < n; j++)
            v[j] = mg_rng_normal(r);
        double gv = dot(g, v, n), fl = fmax(fmax(fabs(gv), 1e-3 * gn), 1e-300);
        double e = fmin(fabs(fd_dir(c, x, v, n, FD_H) - gv),
                        fabs(fd_dir(c, x, v, n, FD_H / 4) - gv)) / fl;
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    free(v);
    return worst;
}

/* The backward with options o against differences of the forward with
 * them: every weight, the input, each initial state, along random
 * directions; also the plain backward's du, which ignores o, must fail. */
static void fd_case(const arch *a, mg_rng *r, int b, int t, const mg_ref_seqs *o,
                    size_t rows, const char *what)
{
    int nstr = o->cu_seqlens ? o->nseq : b;
    fdc c = { a, b, t, dz(rows * a->I), { NULL }, dz(rows * a->D), { NULL }, o, rows };
    fill(r, c.u, rows * a->I, -1.5, 1.5);
    fill(r, c.dout, rows * a->D, -1.0, 1.0);
    states_new(a, nstr, c.st0, r, -0.5, 0.5);
    if (a->has_dT)
        states_new(a, nstr, c.dT, r, -0.5, 0.5);
    bwd_out x;
    bwd_out_new(a, nstr, rows, &x);
    tap_is_int(arch_bwd(a, b, t, c.u, c.st0, c.dout, c.dT, NULL, x.g, x.du, x.d0, o), MG_OK,
               "%s FD %s: backward ok", a->name, what);
    double e = dir_check(&c, r, a->w, x.g, a->nblob);
    tap_ok(e < FD_TOL, "%s FD %s: weights along %d random directions (err %.1e)", a->name, what,
           N_DIRS, e);
    e = dir_check(&c, r, c.u, x.du, rows * a->I);
    tap_ok(e < FD_TOL, "%s FD %s: u along %d random directions (err %.1e)", a->name, what,
           N_DIRS, e);
    for (int k = 0; k < a->ns; k++) {
        e = dir_check(&c, r, c.st0[k], x.d0[k], states_n(a, nstr, k));
        tap_ok(e < FD_TOL, "%s FD %s: initial state %d along %d random directions (err %.1e)",
               a->name, what, k, N_DIRS, e);
    }
    if (!o->cu_seqlens) {
        /* sensitivity: the gradient of the call without the starts is not
         * the gradient of the call with them */
        bwd_out y;
        bwd_out_new(a, nstr, rows, &y);
        arch_bwd(a, b, t, c.u, c.st0, c.dout, c.dT, NULL, y.g, y.du, y.d0, NULL);
        e = dir_check(&c, r, c.u, y.du, rows * a->I);
        tap_ok(e > 1e3 * FD_TOL, "%s FD %s: (sensitivity) the du of the call without starts fails "
               "(err %.1e)", a->name, what, e);
        bwd_out_free(a, &y);
    }
    bwd_out_free(a, &x);
    states_free(a, c.st0);
    if (a->has_dT)
        states_free(a, c.dT);
    free(c.u);
    free(c.dout);
}

static void test_fd(const arch *a, mg_rng *r)
{
    /* 2 streams of 7: stream 0 starts at 3; stream 1 at 0, 4 and 5 */
    unsigned char m[14] = { 0, 0, 0, 1, 0, 0, 0,
                            1, 0, 0, 0, 1, 1, 0 };
    mg_ref_seqs o = opts_start(m);
    fd_case(a, r, 2, 7, &o, 14, "starts");
    /* packed lengths 2 and 5 (a start inside the second) in a buffer of 8 */
    static const int32_t cu[3] = { 0, 2, 7 };
    unsigned char pm[8] = { 0, 0, 0, 0, 1, 0, 0, 0 };
    mg_ref_seqs op = opts_packed(pm, cu, 2, 2);
    fd_case(a, r, 1, 8, &op, 8, "packed");
}

/* ------------------------------------------------------------ f32 entry points */

static void test_f32(arch *a, mg_rng *r)
{
    size_t rows = (size_t)B * T, nu = rows * a->I, no = rows * a->D;
    float *wf = tap_calloc(a->nblob, sizeof *wf), *uf = tap_calloc(nu, sizeof *uf);
    double *u = dz(nu), *dout = dz(no), *o1 = dz(no), *o2 = dz(no), *st0[4], *s1[4], *s2[4];
    double *dT[4] = { NULL };
    for (size_t i = 0; i < a->nblob; i++) {
        wf[i] = (float)a->w[i];
        a->w[i] = wf[i];
    }
    for (size_t i = 0; i < nu; i++) {
        uf[i] = (float)(3.0 * mg_rng_uniform(r) - 1.5);
        u[i] = uf[i];
    }
    fill(r, dout, no, -1, 1);
    states_new(a, B, st0, r, -0.5, 0.5);
    states_new(a, B, s1, NULL, 0, 0);
    states_new(a, B, s2, NULL, 0, 0);
    states_copy(a, B, s1, st0);
    states_copy(a, B, s2, st0);
    unsigned char m[B * T];
    mask_pattern(m);
    mg_ref_seqs o = opts_start(m);
    arch_fwd_f32(a, wf, B, T, uf, o1, s1, &o);
    arch_fwd(a, B, T, u, o2, s2, &o);
    tap_ok(same(o1, o2, no) && states_same(a, B, s1, s2),
           "%s f32: the forward_ex entry point = f64 on the same values", a->name);
    bwd_out x, y;
    bwd_out_new(a, B, rows, &x);
    bwd_out_new(a, B, rows, &y);
    arch_bwd_f32(a, wf, B, T, uf, st0, dout, dT, x.out, x.g, x.du, x.d0, &o);
    arch_bwd(a, B, T, u, st0, dout, dT, y.out, y.g, y.du, y.d0, &o);
    tap_ok(same(x.g, y.g, a->nblob) && same(x.du, y.du, nu) && states_same(a, B, x.d0, y.d0),
           "%s f32: the backward_ex entry point = f64 on the same values", a->name);
    bwd_out_free(a, &x);
    bwd_out_free(a, &y);
    states_free(a, st0);
    states_free(a, s1);
    states_free(a, s2);
    free(wf); free(uf); free(u); free(dout); free(o1); free(o2);
}

int main(void)
{
    test_plan();
    for (int i = 0; i < 2; i++) {
        arch a;
        if (i == 0)
            arch_make_m1(&a, 41);
        else
            arch_make_m3(&a, 42);
        mg_rng r;
        mg_rng_seed(&r, 100 + (unsigned)i);
        test_errors(&a);
        test_fwd_starts(&a, &r);
        test_bwd_starts(&a, &r);
        test_packed(&a, &r);
        test_fd(&a, &r);
        test_f32(&a, &r);   /* last: rounds the weights to f32 */
        arch_free(&a);
    }
    return tap_done();
}
