/* test_runtime.c: unit tests of libmgrt's status codes, PRNG, comparison
 * helpers (and the frame-invariant comparison of rotary states) and
 * CUDA/cuBLAS wrappers. Everything but the GEMMs runs without a
 * GPU; the GPU part is skipped when mg_device_count() is 0 (a failure with
 * MG_REQUIRE_GPU=1). Also the MG_REQUIRE_GPU=1 switch itself, with the
 * devices hidden (CUDA_VISIBLE_DEVICES=""): a generated test program's start
 * (mg_tap_start, run as a child of this program) and the GPU shell suites
 * (tests/gpu_lib.sh) skip without it and fail with it. */
#include "tap.h"
#include "mg_runtime.h"
#include "mg_tap.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_GPU_TESTS 21

/* ------------------------------------------------------------ status */

static void *thread_fail(void *arg)
{
    (void)arg;
    static char seen[256];
    /* A fresh thread starts with an empty message, and its failure does not
     * touch the main thread's. */
    snprintf(seen, sizeof seen, "%s", mg_last_error());
    mg_fail(MG_ERR_IO, "thread message");
    return seen;
}

static void test_status(void)
{
    static const char *names[] = {
        "MG_OK", "MG_ERR_INVALID_ARG", "MG_ERR_ALIGNMENT", "MG_ERR_SIZE",
        "MG_ERR_NO_DEVICE", "MG_ERR_CUDA", "MG_ERR_CUBLAS", "MG_ERR_NVRTC",
        "MG_ERR_OUT_OF_MEMORY", "MG_ERR_STATE", "MG_ERR_MISMATCH", "MG_ERR_IO",
    };
    int names_ok = 1, strs_ok = 1;
    for (int i = 0; i < 12; i++) {
        if (strcmp(mg_status_name((mg_status)i), names[i]) != 0) {
            tap_diag("name of %d: %s", i, mg_status_name((mg_status)i));
            names_ok = 0;
        }
        const char *s = mg_status_str((mg_status)i);
        if (s == NULL || s[0] == '\0')
            strs_ok = 0;
        for (int j = 0; j < i; j++)
            if (strcmp(s, mg_status_str((mg_status)j)) == 0)
                strs_ok = 0;
    }
    tap_ok(names_ok, "status: a stable name for every code");
    tap_ok(strs_ok, "status: a distinct description for every code");
    tap_is_str(mg_status_name((mg_status)99), "MG_ERR_UNKNOWN", "status: unknown code named");
    tap_ok(mg_status_str((mg_status)-1)[0] != '\0', "status: unknown code described");

    tap_is_str(mg_last_error(), "", "status: no message before a failure");
    mg_status s = mg_fail(MG_ERR_SIZE, "blob has %zu floats, expected %d (%s)", (size_t)10, 64, "w");
    tap_is_int(s, MG_ERR_SIZE, "mg_fail returns its code");
    tap_is_str(mg_last_error(), "blob has 10 floats, expected 64 (w)", "mg_fail formats the message");
    mg_clear_error();
    tap_is_str(mg_last_error(), "", "mg_clear_error empties it");
    mg_fail(MG_ERR_NO_DEVICE, NULL);
    tap_is_str(mg_last_error(), mg_status_str(MG_ERR_NO_DEVICE), "mg_fail with no format: the description");

    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mg_fail(MG_ERR_IO, "%s", big);
    size_t n = strlen(mg_last_error());
    tap_ok(n > 500 && n < sizeof big && strcmp(mg_last_error() + n - 3, "...") == 0,
           "mg_fail: an overlong message is truncated and marked (%zu chars)", n);

    mg_fail(MG_ERR_STATE, "main message");
    pthread_t th;
    void *ret = NULL;
    if (pthread_create(&th, NULL, thread_fail, NULL) == 0 && pthread_join(th, &ret) == 0) {
        tap_is_str((const char *)ret, "", "status: a new thread starts with no message");
        tap_is_str(mg_last_error(), "main message", "status: messages are per thread");
    } else {
        tap_skip(2, "could not start a thread");
    }
    mg_clear_error();
}

/* ------------------------------------------------------------ rng */

static void test_rng(void)
{
    mg_rng r;
    /* xoshiro256** from state {1,2,3,4}: first outputs 11520, 0 (reference
     * implementation by Blackman and Vigna). */
    r.s[0] = 1; r.s[1] = 2; r.s[2] = 3; r.s[3] = 4;
    uint64_t a = mg_rng_u64(&r), b = mg_rng_u64(&r);
    tap_ok(a == 11520 && b == 0, "rng: xoshiro256** reference outputs (%llu, %llu)",
           (unsigned long long)a, (unsigned long long)b);
    /* splitmix64 from 0: the reference sequence. */
    mg_rng_seed(&r, 0);
    tap_ok(r.s[0] == 0xe220a8397b1dcdafULL && r.s[1] == 0x6e789e6aa1b965f4ULL
           && r.s[2] == 0x06c45d188009454fULL && r.s[3] == 0xf88bb8a8724c81ecULL,
           "rng: seeding is splitmix64 (reference values for seed 0)");

    mg_rng r1, r2;
    mg_rng_seed(&r1, 42);
    mg_rng_seed(&r2, 42);
    int same = 1;
    for (int i = 0; i < 1000; i++)
        if (mg_rng_u64(&r1) != mg_rng_u64(&r2))
            same = 0;
    tap_ok(same, "rng: same seed, same stream");
    mg_rng_seed(&r2, 43);
    int diff = 0;
    for (int i = 0; i < 10; i++)
        diff += mg_rng_u64(&r1) != mg_rng_u64(&r2);
    tap_ok(diff == 10, "rng: another seed, another stream");

    const int n = 1000000;
    double s1 = 0, s2 = 0, lo = 1, hi = 0;
    mg_rng_seed(&r, 1);
    for (int i = 0; i < n; i++) {
        double u = mg_rng_uniform(&r);
        s1 += u;
        s2 += u * u;
        lo = fmin(lo, u);
        hi = fmax(hi, u);
    }
    double mean = s1 / n, var = s2 / n - mean * mean;
    tap_ok(lo >= 0 && hi < 1, "rng: uniform in [0, 1)");
    /* standard errors: mean 0.29/sqrt(n) = 2.9e-4, var ~ 0.075/sqrt(n) */
    tap_near(mean, 0.5, 5 * 2.9e-4, 0, "rng: uniform mean 1/2");
    tap_near(var, 1.0 / 12, 5 * 7.5e-5, 0, "rng: uniform variance 1/12");

    double m1 = 0, m2 = 0, m3 = 0, m4 = 0;
    mg_rng_seed(&r, 2);
    for (int i = 0; i < n; i++) {
        double z = mg_rng_normal(&r);
        m1 += z; m2 += z * z; m3 += z * z * z; m4 += z * z * z * z;
    }
    m1 /= n; m2 /= n; m3 /= n; m4 /= n;
    tap_near(m1, 0, 5e-3, 0, "rng: normal mean 0 (%.4f)", m1);
    tap_near(m2, 1, 7e-3, 0, "rng: normal variance 1 (%.4f)", m2);
    tap_near(m3, 0, 1.2e-2, 0, "rng: normal skewness 0 (%.4f)", m3);
    tap_near(m4, 3, 5e-2, 0, "rng: normal kurtosis 3 (%.4f)", m4);

    float *x = malloc(100000 * sizeof *x);
    mg_rng_seed(&r, 3);
    mg_rng_fill_uniform(&r, x, 100000, -2.0f, 3.0f);
    int inr = 1;
    double sm = 0;
    for (int i = 0; i < 100000; i++) {
        if (!(x[i] >= -2.0f && x[i] < 3.0f))
            inr = 0;
        sm += x[i];
    }
    tap_ok(inr, "rng: fill_uniform in [lo, hi)");
    tap_near(sm / 100000, 0.5, 5 * 1.44 / sqrt(100000.0), 0, "rng: fill_uniform mean");
    mg_rng_fill_normal(&r, x, 100000, 1.5f, 0.25f);
    double q1 = 0, q2 = 0;
    for (int i = 0; i < 100000; i++) {
        q1 += x[i];
        q2 += (double)x[i] * x[i];
    }
    q1 /= 100000;
    tap_near(q1, 1.5, 5 * 0.25 / sqrt(100000.0), 0, "rng: fill_normal mean");
    tap_near(sqrt(q2 / 100000 - q1 * q1), 0.25, 0.005, 0, "rng: fill_normal std");
    free(x);
}

/* ------------------------------------------------------------ compare */

static void test_compare(void)
{
    float got[3] = { 1, 2, 3 };
    double ref[3] = { 1, 2, 4 };
    mg_err e = mg_compare_f32(got, ref, 3);
    tap_near(e.max_abs, 1, 0, 0, "compare: max_abs");
    tap_near(e.rel_l2, 1 / sqrt(21.0), 0, 1e-15, "compare: rel_l2 = 1/sqrt(21)");
    tap_near(e.ref_norm, sqrt(21.0), 0, 1e-15, "compare: ref_norm");
    tap_ok(e.n == 3 && e.n_nonfinite == 0, "compare: counts");
    tap_ok(mg_err_ok(&e, 0.25) && !mg_err_ok(&e, 0.2), "compare: mg_err_ok against tolerances");

    float reff[3] = { 1, 2, 4 };
    mg_err e2 = mg_compare_f32f32(got, reff, 3);
    tap_ok(e2.max_abs == e.max_abs && e2.rel_l2 == e.rel_l2, "compare: f32f32 same as f32 vs f64");
    double gotd[3] = { 1, 2, 3 };
    mg_err e3 = mg_compare_f64(gotd, ref, 3);
    tap_ok(e3.max_abs == e.max_abs && e3.rel_l2 == e.rel_l2, "compare: f64 same as f32 vs f64");

    float bad[4] = { 1, NAN, INFINITY, 5 };
    double r4[4] = { 1, 1, 1, 4 };
    mg_err e4 = mg_compare_f32(bad, r4, 4);
    tap_is_int((long long)e4.n_nonfinite, 2, "compare: NaN and Inf counted");
    tap_ok(e4.max_abs == 1 && isfinite(e4.rel_l2), "compare: finite part still measured");
    tap_ok(!mg_err_ok(&e4, 1e9), "compare: non-finite never ok");

    double z[2] = { 0, 0 };
    float fz[2] = { 0, 0 }, fe[2] = { 0, 1e-30f };
    mg_err e5 = mg_compare_f32(fz, z, 2);
    tap_ok(e5.rel_l2 == 0 && mg_err_ok(&e5, 0), "compare: zero vs zero is exact");
    mg_err e6 = mg_compare_f32(fe, z, 2);
    tap_ok(e6.rel_l2 > 1e200 && !mg_err_ok(&e6, 1), "compare: nonzero vs zero reference fails");
    mg_err e7 = mg_compare_f32(NULL, NULL, 0);
    tap_ok(e7.n == 0 && e7.rel_l2 == 0, "compare: empty");

    /* angles on the circle: a wrap a step apart is no error, a real one stays */
    const double aref[4] = { 0.01, 6.27, 3.0, 1.0 };
    const float agot[4] = { 6.2931853f, 0.0116f, 3.0f, 1.5f };   /* 2π + 0.01, 0.0116, ... */
    float aw[4];
    mg_angle_on_circle(aw, agot, aref, NULL, 4);
    tap_near(aw[0], 0.01, 1e-6, 0, "angle on circle: 2π + 0.01 -> 0.01 (ref 0.01)");
    tap_near(aw[1], 6.2947853, 1e-6, 0, "angle on circle: 0.0116 -> 2π + 0.0116 (ref 6.27)");
    tap_ok(aw[2] == 3.0f && aw[3] == 1.5f, "angle on circle: values near their reference unchanged");
    const float aref32[2] = { 0.01f, 6.27f };
    float agot2[2] = { 6.2931853f, 0.0116f };
    mg_angle_on_circle(agot2, agot2, NULL, aref32, 2);
    tap_ok(fabs(agot2[0] - 0.01) < 1e-6 && fabs(agot2[1] - 6.2947853) < 1e-6,
           "angle on circle: against an f32 result, in place");
    mg_err ea = mg_compare_f32(aw, aref, 4);
    tap_near(ea.max_abs, 0.5, 0, 1e-6, "angle on circle: the real error (0.5) is what remains");

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mg_err_print(f, "out", &e);
    mg_err_print(f, "nan", &e4);
    fclose(f);
    tap_is_str(buf, "out: max_abs=1.000e+00 rel_l2=2.182e-01 (n=3)\n"
                    "nan: max_abs=1.000e+00 rel_l2=2.425e-01 (n=4, nonfinite=2)\n",
               "compare: mg_err_print format");
    free(buf);
}

/* ------------------------------------------------------------ rotary states */

/* x turned forward by angle, as math.md's k' rotation (the inverse of
 * mg_derotate_f64, written out here independently). */
static void rotate(double *x, const double *angle, const mg_rot_shape *sh)
{
    for (size_t h = 0; h < sh->heads; h++)
        for (size_t r = 0; r < sh->rows; r++)
            for (size_t a = 0; a < sh->s; a++) {
                double *v = x + (h * sh->rows + r) * sh->n + 2 * a;
                const double c = cos(angle[h * sh->s + a]), sn = sin(angle[h * sh->s + a]);
                const double x0 = v[0], x1 = v[1];
                v[0] = c * x0 - sn * x1;
                v[1] = sn * x0 + c * x1;
            }
}

static void to_f32(float *y, const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
}

/* The pairing and sign of the de-rotation on one row: (1, 0) turned by
 * π/2 is (0, 1) (math.md: k'[2a+1] = sin θ·k[2a] + ...), and back. */
static void test_derotate_pairs(void)
{
    const mg_rot_shape sh = { 1, 1, 6, 2 };   /* 2 pairs rotated, entries 4, 5 pass */
    const double ang[2] = { 1.5707963267948966, 3.141592653589793 };
    double x[6] = { 0, 1, 2, 3, 4, 5 }, w[6];
    mg_derotate_f64(w, x, ang, &sh);
    tap_ok(fabs(w[0] - 1) < 1e-15 && fabs(w[1]) < 1e-15, "derotate: (0, 1) turned back by π/2 is (1, 0)");
    tap_ok(fabs(w[2] + 2) < 1e-15 && fabs(w[3] + 3) < 1e-15, "derotate: turned back by π negates the pair");
    tap_ok(w[4] == 4 && w[5] == 5, "derotate: entries past 2S pass unchanged");
    rotate(w, ang, &sh);
    double d = 0;
    for (int i = 0; i < 6; i++) d = fmax(d, fabs(w[i] - x[i]));
    tap_ok(d < 1e-15, "derotate: the inverse of math.md's rotation (max diff %.1e)", d);
}

/* ref: a random state (heads x rows x n) with angles; got: the same state
 * in a frame turned by delta (every head and pair its own offset), its
 * angles moved by delta and wrapped; both in f32 as a library holds them. */
static void drifted_pair(const mg_rot_shape *sh, uint64_t seed, double delta_scale, double *ref, double *rang,
                         float *got, float *gang, float *ref32, float *rang32)
{
    const size_t n = sh->heads * sh->rows * sh->n, na = sh->heads * sh->s;
    mg_rng r;
    mg_rng_seed(&r, seed);
    double *g = (double *)tap_calloc(n, sizeof(double)), *ga = (double *)tap_calloc(na, sizeof(double));
    double *delta = (double *)tap_calloc(na, sizeof(double));
    for (size_t i = 0; i < na; i++) {   /* the angles first: a seed gives the same ones for any rows */
        rang[i] = 6.283185307179586 * mg_rng_uniform(&r);
        delta[i] = delta_scale * (2 * mg_rng_uniform(&r) - 1);
        ga[i] = fmod(rang[i] + delta[i] + 6.283185307179586, 6.283185307179586);
    }
    for (size_t i = 0; i < n; i++) ref[i] = mg_rng_normal(&r);
    memcpy(g, ref, n * sizeof(double));
    rotate(g, delta, sh);
    to_f32(got, g, n);
    to_f32(gang, ga, na);
    to_f32(ref32, ref, n);
    to_f32(rang32, rang, na);
    free(g); free(ga); free(delta);
}

/* Two states that differ only by a rotation (the absolute angle drifted)
 * compare equal frame-invariantly, not raw; a state that is wrong beyond
 * the rotation, or turned the wrong way, fails frame-invariantly too. */
static void test_rotated_states(void)
{
    const mg_rot_shape sh = { 6, 3, 8, 4 };   /* 6 heads x 3 rows x N 8, rope_fraction 1.0 */
    const size_t n = sh.heads * sh.rows * sh.n, na = sh.heads * sh.s;
    double *ref = (double *)tap_calloc(n, sizeof(double)), *rang = (double *)tap_calloc(na, sizeof(double));
    float *got = (float *)tap_calloc(n, sizeof(float)), *gang = (float *)tap_calloc(na, sizeof(float));
    float *ref32 = (float *)tap_calloc(n, sizeof(float)), *rang32 = (float *)tap_calloc(na, sizeof(float));
    drifted_pair(&sh, 77, 0.3, ref, rang, got, gang, ref32, rang32);

    mg_err raw = mg_compare_f32(got, ref, n);
    mg_err inv = mg_compare_rotated_f32(got, gang, ref, rang, &sh);
    tap_diag("drift up to 0.3 rad: raw rel_l2 %.3e, frame-invariant %.3e", raw.rel_l2, inv.rel_l2);
    tap_ok(!mg_err_ok(&raw, 0.02), "rotated states: a drifted frame fails the raw comparison (%.3e)", raw.rel_l2);
    tap_ok(mg_err_ok(&inv, 1e-6), "rotated states: ... and passes turned back by each side's angle (%.3e)", inv.rel_l2);
    mg_err inv32 = mg_compare_rotated_f32f32(got, gang, ref32, rang32, &sh);
    tap_ok(mg_err_ok(&inv32, 1e-6), "rotated states: the same against an f32 result (%.3e)", inv32.rel_l2);
    tap_near(inv.ref_norm, raw.ref_norm, 0, 1e-12, "rotated states: turning back keeps the reference's norm");

    /* wrong beyond the rotation: one head's rows scaled by 1.1 */
    float *bad = (float *)tap_calloc(n, sizeof(float));
    memcpy(bad, got, n * sizeof(float));
    for (size_t i = 0; i < sh.rows * sh.n; i++) bad[2 * sh.rows * sh.n + i] *= 1.1f;
    mg_err eb = mg_compare_rotated_f32(bad, gang, ref, rang, &sh);
    tap_ok(!mg_err_ok(&eb, 0.02) && eb.rel_l2 > 0.03, "rotated states: a head scaled by 1.1 fails (%.3e)", eb.rel_l2);
    /* the state turned the way its angle says, but the angle kept: a
     * rotation the angle does not account for is an error */
    mg_err ek = mg_compare_rotated_f32(got, rang32, ref, rang, &sh);
    tap_ok(!mg_err_ok(&ek, 0.02), "rotated states: a drifted state with the undrifted angle fails (%.3e)", ek.rel_l2);
    /* the tail past 2S is not turned: rope_fraction 0.5 keeps it raw */
    const mg_rot_shape half = { 6, 3, 8, 2 };
    drifted_pair(&half, 78, 0.3, ref, rang, got, gang, ref32, rang32);
    mg_err eh = mg_compare_rotated_f32(got, gang, ref, rang, &half);
    tap_ok(mg_err_ok(&eh, 1e-6), "rotated states: rope_fraction 0.5 (pairs 0..S-1 turned, the rest raw) (%.3e)", eh.rel_l2);

    /* angles on the circle: a wrap is no error, the drift is what counts,
     * over the fixed scale of a uniform angle */
    const double ar[3] = { 0.01, 6.27, 3.0 };
    const float ag[3] = { 6.2931853f, 0.0116f, 3.3f };
    mg_err ea = mg_compare_angle_f32(ag, ar, 3);
    const double rms = sqrt((0.0 + 0.02478530718 * 0.02478530718 + 0.09 + 0.0) / 3);
    tap_near(ea.max_abs, 0.3, 1e-6, 0, "angle compare: max_abs is the largest wrapped difference (0.3)");
    tap_near(ea.rel_l2, rms / MG_ANGLE_SCALE, 1e-6, 0, "angle compare: rel_l2 = rms wrapped error / (2π/√3) (%.4e)",
             ea.rel_l2);
    const float ar32[3] = { 0.01f, 6.27f, 3.0f };
    mg_err ea32 = mg_compare_angle_f32f32(ag, ar32, 3);
    tap_near(ea32.rel_l2, ea.rel_l2, 1e-6, 0, "angle compare: the same against an f32 result");
    const float nanv[1] = { NAN };
    mg_err en = mg_compare_angle_f32(nanv, ar, 1);
    tap_ok(!mg_err_ok(&en, 1e9), "angle compare: a NaN angle never passes");

    free(ref); free(rang); free(got); free(gang); free(ref32); free(rang32); free(bad);
}

/* mg_ref_mamba3_compare_states on a model's state layout: a final state
 * whose frame drifted (ssm and k_prev turned by the angle's drift, per
 * layer, stream and head) passes; v_prev off by 10% fails there only. */
static void test_m3_compare_states(void)
{
    mg_m3_dims d;
    memset(&d, 0, sizeof d);
    d.n_layers = 2; d.nheads = 3; d.headdim = 4; d.d_state = 8; d.n_angles = 4;
    const int B = 2;
    const size_t heads = (size_t)d.n_layers * B * d.nheads;
    const size_t n[4] = { heads * 4 * 8, heads * 8, heads * 4, heads * 4 };
    double *ref[4];
    float *got[4], *r32[4];
    for (int i = 0; i < 4; i++) {
        ref[i] = (double *)tap_calloc(n[i], sizeof(double));
        got[i] = (float *)tap_calloc(n[i], sizeof(float));
        r32[i] = (float *)tap_calloc(n[i], sizeof(float));
    }
    const mg_rot_shape ssm = { heads, 4, 8, 4 }, kp = { heads, 1, 8, 4 };
    float *ga2 = (float *)tap_calloc(n[3], sizeof(float)), *ra2 = (float *)tap_calloc(n[3], sizeof(float));
    double *rang2 = (double *)tap_calloc(n[3], sizeof(double));
    drifted_pair(&ssm, 90, 0.2, ref[0], ref[3], got[0], got[3], r32[0], r32[3]);
    /* k_prev with the same angles and drift: seed 90 repeats them */
    drifted_pair(&kp, 90, 0.2, ref[1], rang2, got[1], ga2, r32[1], ra2);
    mg_rng r;
    mg_rng_seed(&r, 91);
    for (size_t j = 0; j < n[2]; j++) ref[2][j] = mg_rng_normal(&r);
    to_f32(got[2], ref[2], n[2]);
    to_f32(r32[2], ref[2], n[2]);
    mg_err e[4], e32[4];
    mg_ref_mamba3_compare_states(&d, B, (const float *const *)got, (const double *const *)ref, NULL, e);
    mg_ref_mamba3_compare_states(&d, B, (const float *const *)got, NULL, (const float *const *)r32, e32);
    mg_err raw = mg_compare_f32(got[0], ref[0], n[0]);
    tap_diag("m3 states: ssm raw %.3e, frame-invariant %.3e; k_prev %.3e; angle %.3e (max %.3f rad)", raw.rel_l2,
             e[0].rel_l2, e[1].rel_l2, e[3].rel_l2, e[3].max_abs);
    tap_ok(!mg_err_ok(&raw, 0.02) && mg_err_ok(&e[0], 1e-6) && mg_err_ok(&e[1], 1e-6) && mg_err_ok(&e[2], 1e-7),
           "m3 states: a drifted frame passes ssm, k_prev frame-invariantly (raw ssm fails), v_prev as rounded to f32");
    tap_ok(e[3].max_abs > 0.1 && e[3].max_abs <= 0.2 + 1e-6, "m3 states: the angle's drift is reported as such");
    tap_ok(e32[0].rel_l2 == e[0].rel_l2 || fabs(e32[0].rel_l2 - e[0].rel_l2) < 1e-7,
           "m3 states: against an f32 result the same");
    for (size_t j = 0; j < n[2]; j++) got[2][j] *= 1.1f;
    mg_ref_mamba3_compare_states(&d, B, (const float *const *)got, (const double *const *)ref, NULL, e);
    tap_ok(!mg_err_ok(&e[2], 0.05) && mg_err_ok(&e[0], 1e-6), "m3 states: v_prev off by 10%% fails, ssm still passes");
    for (int i = 0; i < 4; i++) { free(ref[i]); free(got[i]); free(r32[i]); }
    free(ga2); free(ra2); free(rang2);
}

/* mg_ref_mamba3_push_ranges does what the test programs rely on: in layer
 * 0, for N(0, 1) tokens with the input offset it asks for, the pushed
 * heads' softplus argument is above 20 and their dd_A activation below
 * a_floor at every token (the clamp binds), within f16's range. */
static void test_m3_push_ranges(void)
{
    mg_m3_dims d = { .d_model = 16, .n_layers = 1, .d_state = 16, .d_inner = 32, .headdim = 16, .nheads = 2,
                     .ngroups = 1, .n_angles = 4, .input_dim = 0, .norm_eps = 1e-5, .a_floor = 1e-4,
                     .a_activation = MG_M3_A_HEAVY_TAIL, .outproj_norm = true };
    mg_m3_layout l;
    if (mg_ref_mamba3_layout(&d, &l) != MG_OK) { tap_ok(0, "push_ranges: layout"); return; }
    float *blob = (float *)tap_calloc(l.total, sizeof(float)), off = 0;
    mg_ref_mamba3_init(&d, &l, blob, 5);
    const mg_status ps = mg_ref_mamba3_push_ranges(&d, &l, blob, 6, &off);
    tap_ok(ps == MG_OK && off > 0, "push_ranges: input_dim 0 asks for an input offset (%g)", (double)off);
    const size_t D = 16, oDT = 2 * 32 + 2 * 16, oA = oDT + 2;   /* in_proj rows z|x|B|C|dd_dt|dd_A */
    mg_rng r;
    mg_rng_seed(&r, 7);
    int dt_hi = 1, floored = 1, in_f16 = 1;
    for (int t = 0; t < 2000; t++) {
        double x[16], ms = 0;
        for (size_t i = 0; i < D; i++) x[i] = mg_rng_normal(&r) + (i == 0 ? off : 0.0);
        for (size_t i = 0; i < D; i++) ms += x[i] * x[i];
        const double rr = 1.0 / sqrt(ms / D + d.norm_eps);
        double pr[2][2];   /* [dt | A][head] */
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 2; h++) {
                const float *row = blob + l.layers[0].in_proj_w + ((k ? oA : oDT) + (size_t)h) * D;
                double acc = 0;
                for (size_t i = 0; i < D; i++) acc += row[i] * x[i] * rr * blob[l.layers[0].norm_w + i];
                pr[k][h] = acc;
            }
        dt_hi = dt_hi && pr[0][0] + blob[l.layers[0].dt_bias + 0] > 20.0;
        const double v = pr[1][1], act = v >= 0 ? 1 + v : 1 / (1 - v);
        floored = floored && act < d.a_floor;
        in_f16 = in_f16 && fabs(v) < 65504.0;
    }
    tap_ok(dt_hi, "push_ranges: head 0's softplus argument is above 20 at every token");
    tap_ok(floored, "push_ranges: head 1's A activation is below a_floor at every token (the clamp binds)");
    tap_ok(in_f16, "push_ranges: head 1's dd_A stays within f16's range");
    free(blob);
    mg_ref_mamba3_layout_free(&l);
}

/* mg_ref_mamba3_compare_angle_pushed splits the angle state by
 * mg_ref_mamba3_pushed_dt_head: an error on a fast head shows in err[1]
 * only, one on another head in err[0] only (layout [layers][batch][H][S]). */
static void test_m3_angle_pushed(void)
{
    mg_m3_dims d = { .d_model = 16, .n_layers = 2, .d_state = 16, .d_inner = 64, .headdim = 16, .nheads = 4,
                     .ngroups = 1, .n_angles = 3, .input_dim = 0, .norm_eps = 1e-5, .a_floor = 1e-4,
                     .a_activation = MG_M3_A_HEAVY_TAIL, .outproj_norm = true };
    enum { B = 2, N = 2 * B * 4 * 3 };
    float got[N], r32[N];
    double ref[N];
    for (int i = 0; i < N; i++) ref[i] = r32[i] = got[i] = (float)(0.1 * i);
    tap_ok(mg_ref_mamba3_pushed_dt_head(0) && !mg_ref_mamba3_pushed_dt_head(1) && mg_ref_mamba3_pushed_dt_head(3),
           "pushed_dt_head: heads 0 and 3 of 4 are the fast ones");
    mg_err e[2];
    const int fast_i = ((1 * B + 1) * 4 + 3) * 3 + 2, slow_i = ((1 * B + 0) * 4 + 2) * 3 + 1;   /* head 3, head 2 */
    got[fast_i] += 0.5f;
    mg_ref_mamba3_compare_angle_pushed(&d, B, got, ref, NULL, e);
    tap_ok(e[0].n == N / 2 && e[1].n == N / 2 && e[0].max_abs == 0.0 && fabs(e[1].max_abs - 0.5) < 1e-6,
           "angle_pushed: a fast head's error is in err[1] only (n %zu/%zu, max %.3g/%.3g)", e[0].n, e[1].n,
           e[0].max_abs, e[1].max_abs);
    got[fast_i] -= 0.5f;
    got[slow_i] += 6.283185307179586f + 0.25f;   /* a turn plus 0.25: 0.25 on the circle */
    mg_ref_mamba3_compare_angle_pushed(&d, B, got, NULL, r32, e);
    tap_ok(e[1].max_abs == 0.0 && fabs(e[0].max_abs - 0.25) < 1e-5,
           "angle_pushed (f32 ref): another head's error is in err[0] only, on the circle (max %.3g/%.3g)",
           e[0].max_abs, e[1].max_abs);
}

/* mg_tap_diag_bits counts the floats whose bits differ (0 and -0 differ,
 * a NaN equals its own bits). */
static void test_tap_diag_bits(void)
{
    float a[4] = { 1.0f, 0.0f, NAN, 3.0f }, b[4] = { 1.0f, -0.0f, NAN, 3.5f };
    memcpy(&b[2], &a[2], sizeof a[2]);
    tap_ok(mg_tap_diag_bits("diag_bits self-test", a, b, 4) == 2, "mg_tap_diag_bits: 2 of 4 differ (-0, 3.5)");
    tap_ok(mg_tap_diag_bits("diag_bits self-test", a, a, 4) == 0, "mg_tap_diag_bits: a buffer against itself: 0");
}

/* mg_tap_section_rule: the parts of MG_TEST_PART cover every section once,
 * MG_TEST_ONLY selects by substring, a malformed part is refused. */
static void test_tap_sections(void)
{
    static const char *const names[7] = { "prefill", "decode", "decode single", "chunked", "graphs", "starts",
                                          "selfcheck" };
    int covered[7] = { 0 }, bad = 0;
    for (int i = 0; i < 3; ++i) {
        char part[16];
        snprintf(part, sizeof part, "%d/3", i);
        for (int k = 0; k < 7; ++k) {
            const int r = mg_tap_section_rule(part, NULL, k, names[k]);
            if (r < 0) bad = 1;
            covered[k] += r > 0;
            if ((r > 0) != (k % 3 == i)) bad = 1;
        }
    }
    int once = 1;
    for (int k = 0; k < 7; ++k) once = once && covered[k] == 1;
    tap_ok(!bad && once, "mg_tap_section_rule: parts 0/3, 1/3, 2/3 run each of 7 sections exactly once");
    int all = 1;
    for (int k = 0; k < 7; ++k) all = all && mg_tap_section_rule(NULL, NULL, k, names[k]) == 1 &&
                                    mg_tap_section_rule("", "", k, names[k]) == 1 &&
                                    mg_tap_section_rule("0/1", NULL, k, names[k]) == 1;
    tap_ok(all, "mg_tap_section_rule: unset, empty or 0/1 runs every section");
    tap_ok(mg_tap_section_rule(NULL, "decode", 1, "decode") == 1 &&
               mg_tap_section_rule(NULL, "decode", 2, "decode single") == 1 &&
               mg_tap_section_rule(NULL, "decode", 0, "prefill") == 0 &&
               mg_tap_section_rule(NULL, "graph,self", 4, "graphs") == 1 &&
               mg_tap_section_rule(NULL, "graph,self", 6, "selfcheck") == 1 &&
               mg_tap_section_rule(NULL, "graph,self", 3, "chunked") == 0 &&
               mg_tap_section_rule(NULL, ",", 3, "chunked") == 0 &&
               mg_tap_section_rule(NULL, "chunked-and-more", 3, "chunked") == 0,
           "mg_tap_section_rule: MG_TEST_ONLY matches comma-separated substrings, empty ones nothing");
    tap_ok(mg_tap_section_rule("1/2", "decode", 1, "decode") == 1 &&
               mg_tap_section_rule("0/2", "decode", 1, "decode") == 0 &&
               mg_tap_section_rule("1/2", "decode", 3, "chunked") == 0,
           "mg_tap_section_rule: part and filter together (both must hold)");
    static const char *const malformed[] = { "2/2", "-1/2", "0/0", "1", "1/2x", "a/b", "1/ 2x", "/2" };
    int refused = 1;
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; ++i)
        refused = refused && mg_tap_section_rule(malformed[i], NULL, 0, "x") == -1;
    tap_ok(refused, "mg_tap_section_rule: malformed parts refused (2/2, -1/2, 0/0, 1, 1/2x, a/b, /2)");
    /* MG_TEST_NO_CLUSTERS: only "1" leaves the cluster kernels out */
    static const char *const vals[4] = { NULL, "0", "yes", "1" };
    int nc_ok = 1;
    for (int i = 0; i < 4; ++i) {
        if (vals[i]) setenv("MG_TEST_NO_CLUSTERS", vals[i], 1);
        else unsetenv("MG_TEST_NO_CLUSTERS");
        nc_ok = nc_ok && mg_tap_no_clusters() == (i == 3);
    }
    unsetenv("MG_TEST_NO_CLUSTERS");
    tap_ok(nc_ok, "mg_tap_no_clusters: 1 only for MG_TEST_NO_CLUSTERS=1 (unset, 0, yes: 0)");
}

/* ------------------------------------------------------------ cuda: host side */

static void test_cuda_host(int ndev)
{
    tap_ok(mg_dtype_size(MG_F32) == 4 && mg_dtype_size(MG_BF16) == 2 && mg_dtype_size(MG_F16) == 2,
           "dtype sizes");
    tap_ok(strcmp(mg_dtype_name(MG_F32), "f32") == 0 && strcmp(mg_dtype_name(MG_BF16), "bf16") == 0
           && strcmp(mg_dtype_name(MG_F16), "f16") == 0, "dtype names");
    tap_ok(mg_dtype_size((mg_dtype)7) == 0, "dtype: unknown has size 0");
    char buf[64];
    tap_ok(mg_aligned(buf + 0, 1) && !mg_aligned(NULL, 16), "mg_aligned: any pointer to 1, NULL never");
    void *p16 = (void *)(uintptr_t)4096, *p8 = (void *)(uintptr_t)4104;
    tap_ok(mg_aligned(p16, 256) && mg_aligned(p8, 8) && !mg_aligned(p8, 16), "mg_aligned: offsets");

    tap_ok(ndev >= 0, "mg_device_count: %d (never an error)", ndev);
    tap_is_int(mg_cuda_check(cudaSuccess, "x"), MG_OK, "mg_cuda_check: success is MG_OK");
    tap_is_int(mg_cuda_check(cudaErrorMemoryAllocation, "cudaMalloc(big)"), MG_ERR_OUT_OF_MEMORY,
               "mg_cuda_check: allocation failure is out-of-memory");
    tap_ok(strstr(mg_last_error(), "cudaMalloc(big)") != NULL, "mg_cuda_check: message names the call (%s)",
           mg_last_error());
    tap_is_int(mg_cuda_check(cudaErrorNoDevice, "q"), MG_ERR_NO_DEVICE, "mg_cuda_check: no device");
    tap_is_int(mg_dev_readable(NULL, "f", "start"), MG_ERR_INVALID_ARG, "mg_dev_readable: NULL refused");
    tap_ok(strcmp(mg_last_error(), "f: start is NULL") == 0, "mg_dev_readable: NULL message (%s)", mg_last_error());
    /* plain host memory: unregistered on a device, unknown to CUDA without one; refused either way */
    tap_is_int(mg_dev_readable(buf, "f", "start"), MG_ERR_INVALID_ARG, "mg_dev_readable: stack memory refused");
    tap_ok(strncmp(mg_last_error(), "f: start 0x", 11) == 0 || strncmp(mg_last_error(), "f: start (", 10) == 0,
           "mg_dev_readable: the message names the function and the argument (%s)", mg_last_error());
    tap_is_int(mg_cuda_check(cudaErrorLaunchFailure, "k"), MG_ERR_CUDA, "mg_cuda_check: other errors");

    /* Argument checks come before any use of the handle: no GPU needed. */
    float x[4], w[4], y[4];
    mg_status s = mg_linear(NULL, 2, 2, 2, MG_F32, x, 2, w, 2, MG_F32, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: NULL handle");
    tap_ok(strstr(mg_last_error(), "handle") != NULL, "mg_linear: message (%s)", mg_last_error());
    s = mg_linear(NULL, 2, 2, 3, MG_F32, x, 2, w, 3, MG_F32, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: ldx < K");
    tap_ok(strstr(mg_last_error(), "X") != NULL, "mg_linear: message names X (%s)", mg_last_error());
    s = mg_linear(NULL, 2, 3, 2, MG_F32, x, 2, w, 2, MG_F32, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: ldy < N");
    s = mg_linear(NULL, -1, 2, 2, MG_F32, x, 2, w, 2, MG_F32, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: negative M");
    s = mg_linear(NULL, 2, 2, 2, MG_BF16, x, 2, w, 2, MG_F16, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: bf16 in, f16 out refused");
    s = mg_linear(NULL, 2, 2, 2, MG_F32, x, 2, NULL, 2, MG_F32, y, 2, 1, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear: NULL W");
    s = mg_linear_dx(NULL, 2, 3, 2, MG_F32, x, 2, w, 2, MG_F32, y, 2, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear_dx: lddy < N");
    s = mg_linear_dw(NULL, 0, 2, 2, MG_F32, x, 2, w, 2, MG_F32, y, 2, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_linear_dw: M = 0 refused");
    s = mg_blas_set_stream(NULL, 0);
    tap_is_int(s, MG_ERR_INVALID_ARG, "mg_blas_set_stream: NULL handle");
    tap_is_int(mg_blas_set_tf32(NULL, 1), MG_ERR_INVALID_ARG, "mg_blas_set_tf32: NULL handle");
    tap_is_int(mg_blas_create(NULL, 0), MG_ERR_INVALID_ARG, "mg_blas_create: NULL out");
    /* NULL is a no-op: no crash (cublasDestroy of a NULL handle), the
     * message kept, and with a device no CUDA error left behind (without
     * one, the runtime's init error is sticky: not checked). */
    (void)cudaGetLastError();
    mg_fail(MG_ERR_IO, "sentinel message");
    mg_blas_destroy(NULL);
    mg_dev_free(NULL);
    cudaError_t ce = cudaGetLastError();
    tap_ok((ndev == 0 || ce == cudaSuccess) && strcmp(mg_last_error(), "sentinel message") == 0,
           "destroy/free accept NULL: message kept (%s), CUDA error %s", mg_last_error(),
           ndev ? cudaGetErrorName(ce) : "not checked (no device)");
    mg_clear_error();
    void *p = (void *)1;
    tap_ok(mg_dev_alloc(&p, 0, "empty") == MG_OK && p == NULL, "mg_dev_alloc: 0 bytes gives NULL");

    if (ndev == 0) {
        mg_blas *b = (mg_blas *)1;
        tap_is_int(mg_blas_create(&b, 0), MG_ERR_NO_DEVICE, "no device: mg_blas_create fails cleanly");
        tap_ok(b == NULL, "no device: handle set to NULL");
        p = (void *)1;
        s = mg_dev_alloc(&p, 1024, "buf");
        tap_ok(s != MG_OK && p == NULL, "no device: mg_dev_alloc fails cleanly (%s: %s)",
               mg_status_name(s), mg_last_error());
    } else {
        tap_skip(3, "a device is present: no-device paths not reachable");
    }
}

/* ------------------------------------------------------------ cuda: GEMMs */

static uint16_t to_bf16(float f)   /* exact for the values used here */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_f16(float f)    /* normal range, round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    if ((u & 0x7fffffff) == 0)
        return (uint16_t)sign;
    int ex = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    uint32_t r = man + 0xfff + ((man >> 13) & 1);
    if (r & 0x800000) {
        r = 0;
        ex++;
    }
    return (uint16_t)(sign | ((uint32_t)ex << 10) | (r >> 13));
}

static float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (ex == 0)
        return (sign ? -1.0f : 1.0f) * ldexpf((float)man, -24);
    uint32_t u = sign | ((ex - 15 + 127) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Host copies in storage type t. */
static void *pack(const float *x, size_t n, mg_dtype t)
{
    void *p = malloc(n * mg_dtype_size(t));
    for (size_t i = 0; i < n; i++) {
        if (t == MG_F32)
            ((float *)p)[i] = x[i];
        else if (t == MG_BF16)
            ((uint16_t *)p)[i] = to_bf16(x[i]);
        else
            ((uint16_t *)p)[i] = to_f16(x[i]);
    }
    return p;
}

static float unpack1(const void *p, size_t i, mg_dtype t)
{
    if (t == MG_F32)
        return ((const float *)p)[i];
    return t == MG_BF16 ? from_bf16(((const uint16_t *)p)[i]) : from_f16(((const uint16_t *)p)[i]);
}

/* x rounded to type t and back. */
static float roundt(float x, mg_dtype t)
{
    if (t == MG_F32)
        return x;
    return t == MG_BF16 ? from_bf16(to_bf16(x)) : from_f16(to_f16(x));
}

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    if (mg_dev_alloc(&d, bytes, "test") != MG_OK)
        return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

/* Y[M][N] = alpha X W^T + beta Y0 in type `in` -> `out`, with padded strides;
 * compared with an f64 host product. */
static mg_err run_linear(mg_blas *b, int M, int N, int K, mg_dtype in, mg_dtype out,
                         int exact_inputs, float alpha, float beta, mg_rng *r)
{
    int ldx = K + 3, ldw = K + 1, ldy = N + 2;
    float *X = calloc((size_t)M * ldx, 4), *W = calloc((size_t)N * ldw, 4), *Y0 = calloc((size_t)M * ldy, 4);
    for (int i = 0; i < M * ldx; i++)
        X[i] = exact_inputs ? (float)((int)(mg_rng_u64(r) % 511) - 255) / 64 : (float)mg_rng_normal(r);
    for (int i = 0; i < N * ldw; i++)
        W[i] = exact_inputs ? (float)((int)(mg_rng_u64(r) % 511) - 255) / 64 : (float)mg_rng_normal(r);
    for (int i = 0; i < M * ldy; i++)
        Y0[i] = exact_inputs ? (float)((int)(mg_rng_u64(r) % 511) - 255) / 64 : (float)mg_rng_normal(r);
    void *hX = pack(X, (size_t)M * ldx, in), *hW = pack(W, (size_t)N * ldw, in), *hY = pack(Y0, (size_t)M * ldy, out);
    void *dX = to_dev(hX, (size_t)M * ldx * mg_dtype_size(in));
    void *dW = to_dev(hW, (size_t)N * ldw * mg_dtype_size(in));
    void *dY = to_dev(hY, (size_t)M * ldy * mg_dtype_size(out));
    mg_status s = mg_linear(b, M, N, K, in, dX, ldx, dW, ldw, out, dY, ldy, alpha, beta);
    if (s != MG_OK)
        tap_diag("mg_linear: %s", mg_last_error());
    cudaMemcpy(hY, dY, (size_t)M * ldy * mg_dtype_size(out), cudaMemcpyDeviceToHost);
    float *got = malloc((size_t)M * N * 4);
    double *ref = malloc((size_t)M * N * 8);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)unpack1(hX, (size_t)i * ldx + k, in) * unpack1(hW, (size_t)j * ldw + k, in);
            ref[i * N + j] = alpha * acc + beta * (double)roundt(Y0[(size_t)i * ldy + j], out);
            got[i * N + j] = unpack1(hY, (size_t)i * ldy + j, out);
        }
    mg_err e = mg_compare_f32(got, ref, (size_t)M * N);
    if (s != MG_OK)
        e.n_nonfinite = 1;
    /* Padding columns of Y must be untouched. */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldy; j++)
            if (unpack1(hY, (size_t)i * ldy + j, out) != roundt(Y0[(size_t)i * ldy + j], out))
                e.n_nonfinite++;
    mg_dev_free(dX); mg_dev_free(dW); mg_dev_free(dY);
    free(X); free(W); free(Y0); free(hX); free(hW); free(hY); free(got); free(ref);
    return e;
}

static void test_gemm(void)
{
    mg_blas *b = NULL;
    mg_status s = mg_blas_create(&b, 0);
    tap_is_int(s, MG_OK, "gpu: mg_blas_create (%s)", s ? mg_last_error() : "ok");
    if (s != MG_OK) {
        tap_skip(N_GPU_TESTS - 1, "no cuBLAS handle");
        return;
    }
    mg_rng r;
    mg_rng_seed(&r, 9);
    /* f32: K = 512 of N(0,1): f32 accumulation gives ~1e-7; TF32 inputs
     * (10-bit mantissa) would give ~1e-4. */
    mg_err e = run_linear(b, 37, 29, 512, MG_F32, MG_F32, 0, 1.5f, 0.5f, &r);
    mg_err_print(stdout, "# f32 linear", &e);
    tap_ok(mg_err_ok(&e, 2e-6), "gpu: f32 linear, padded strides, alpha/beta; no TF32 (rel %.2e)", e.rel_l2);
    /* The same with TF32 asked for (mg_blas_set_tf32): inputs rounded to
     * 10 mantissa bits, so the error is that of the rounding, well above
     * f32's and within f16's check tolerance; then back off, f32 again. */
    tap_is_int(mg_blas_set_tf32(b, 2), MG_ERR_INVALID_ARG, "gpu: mg_blas_set_tf32(2) refused");
    tap_is_int(mg_blas_set_tf32(b, 1), MG_OK, "gpu: mg_blas_set_tf32(1)");
    e = run_linear(b, 37, 29, 512, MG_F32, MG_F32, 0, 1.5f, 0.5f, &r);
    mg_err_print(stdout, "# f32 linear on TF32", &e);
    tap_ok(e.n_nonfinite == 0 && e.rel_l2 > 1e-5 && e.rel_l2 < 5e-3,
           "gpu: f32 linear with TF32: 1e-5 < rel %.2e < 5e-3 (the inputs' rounding)", e.rel_l2);
    mg_blas_set_tf32(b, 0);
    e = run_linear(b, 37, 29, 512, MG_F32, MG_F32, 0, 1.5f, 0.5f, &r);
    tap_ok(mg_err_ok(&e, 2e-6), "gpu: f32 linear after mg_blas_set_tf32(0): f32 again (rel %.2e)", e.rel_l2);
    mg_dtype ts[2] = { MG_BF16, MG_F16 };
    for (int i = 0; i < 2; i++) {
        /* Inputs k/64, |k| <= 255: exact in bf16 and f16, products and sums
         * exact in f32 for K = 64: the f32 output must be exact. */
        e = run_linear(b, 33, 40, 64, ts[i], MG_F32, 1, 1.0f, 1.0f, &r);
        tap_ok(e.n_nonfinite == 0 && e.max_abs == 0, "gpu: %s in, f32 out: exact (max_abs %.2e)",
               mg_dtype_name(ts[i]), e.max_abs);
        e = run_linear(b, 33, 40, 64, ts[i], ts[i], 1, 1.0f, 0.0f, &r);
        double tol = ts[i] == MG_BF16 ? 4e-3 : 5e-4;
        tap_ok(mg_err_ok(&e, tol), "gpu: %s in, %s out: rounding only (rel %.2e)",
               mg_dtype_name(ts[i]), mg_dtype_name(ts[i]), e.rel_l2);
    }

    /* dx and dw in f32 with padded strides and beta. */
    int M = 23, N = 31, K = 300, lddy = N + 1, ldw = K + 2, lddx = K + 5, ldx = K + 4, lddw = K + 3;
    float *dY = malloc((size_t)M * lddy * 4), *W = malloc((size_t)N * ldw * 4), *X = malloc((size_t)M * ldx * 4);
    float *dX0 = malloc((size_t)M * lddx * 4), *dW0 = malloc((size_t)N * lddw * 4);
    float *dXg = malloc((size_t)M * lddx * 4), *dWg = malloc((size_t)N * lddw * 4);
    mg_rng_fill_normal(&r, dY, (size_t)M * lddy, 0, 1);
    mg_rng_fill_normal(&r, W, (size_t)N * ldw, 0, 1);
    mg_rng_fill_normal(&r, X, (size_t)M * ldx, 0, 1);
    mg_rng_fill_normal(&r, dX0, (size_t)M * lddx, 0, 1);
    mg_rng_fill_normal(&r, dW0, (size_t)N * lddw, 0, 1);
    void *d_dY = to_dev(dY, (size_t)M * lddy * 4), *d_W = to_dev(W, (size_t)N * ldw * 4);
    void *d_X = to_dev(X, (size_t)M * ldx * 4), *d_dX = to_dev(dX0, (size_t)M * lddx * 4);
    void *d_dW = to_dev(dW0, (size_t)N * lddw * 4);
    tap_is_int(mg_linear_dx(b, M, N, K, MG_F32, d_dY, lddy, d_W, ldw, MG_F32, d_dX, lddx, 0.5f), MG_OK,
               "gpu: mg_linear_dx runs");
    tap_is_int(mg_linear_dw(b, M, N, K, MG_F32, d_dY, lddy, d_X, ldx, MG_F32, d_dW, lddw, 1.0f), MG_OK,
               "gpu: mg_linear_dw runs");
    cudaMemcpy(dXg, d_dX, (size_t)M * lddx * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(dWg, d_dW, (size_t)N * lddw * 4, cudaMemcpyDeviceToHost);
    double *rx = malloc((size_t)M * K * 8), *rw = malloc((size_t)N * K * 8);
    float *gx = malloc((size_t)M * K * 4), *gw = malloc((size_t)N * K * 4);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            double acc = 0;
            for (int j = 0; j < N; j++)
                acc += (double)dY[i * lddy + j] * W[j * ldw + k];
            rx[i * K + k] = acc + 0.5 * dX0[i * lddx + k];
            gx[i * K + k] = dXg[i * lddx + k];
        }
    for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++) {
            double acc = 0;
            for (int i = 0; i < M; i++)
                acc += (double)dY[i * lddy + j] * X[i * ldx + k];
            rw[j * K + k] = acc + dW0[j * lddw + k];
            gw[j * K + k] = dWg[j * lddw + k];
        }
    e = mg_compare_f32(gx, rx, (size_t)M * K);
    tap_ok(mg_err_ok(&e, 2e-6), "gpu: dX = dY W + beta dX (rel %.2e)", e.rel_l2);
    e = mg_compare_f32(gw, rw, (size_t)N * K);
    tap_ok(mg_err_ok(&e, 2e-6), "gpu: dW = dY^T X + beta dW (rel %.2e)", e.rel_l2);
    int pad = 1;
    for (int i = 0; i < M; i++)
        for (int k = K; k < lddx; k++)
            pad &= dXg[i * lddx + k] == dX0[i * lddx + k];
    for (int j = 0; j < N; j++)
        for (int k = K; k < lddw; k++)
            pad &= dWg[j * lddw + k] == dW0[j * lddw + k];
    tap_ok(pad, "gpu: dx/dw leave the row padding alone");
    mg_dev_free(d_dY); mg_dev_free(d_W); mg_dev_free(d_X); mg_dev_free(d_dX); mg_dev_free(d_dW);
    free(dY); free(W); free(X); free(dX0); free(dW0); free(dXg); free(dWg);
    free(rx); free(rw); free(gx); free(gw);

    /* Streams, allocation. */
    cudaStream_t st;
    cudaStreamCreate(&st);
    tap_is_int(mg_blas_set_stream(b, st), MG_OK, "gpu: mg_blas_set_stream");
    e = run_linear(b, 8, 8, 16, MG_F32, MG_F32, 0, 1.0f, 0.0f, &r);
    cudaStreamSynchronize(st);
    tap_ok(mg_err_ok(&e, 2e-6), "gpu: linear on a user stream");
    cudaStreamDestroy(st);
    void *p = NULL;
    s = mg_dev_alloc(&p, 1000, "buf");
    tap_ok(s == MG_OK && mg_aligned(p, 256), "gpu: mg_dev_alloc gives 256-byte aligned memory");
    tap_is_int(mg_dev_readable(p, "f", "start"), MG_OK, "gpu: mg_dev_readable: device memory is readable");
    mg_dev_free(p);
    p = (void *)1;
    s = mg_dev_alloc(&p, (size_t)1 << 60, "huge");
    tap_ok(s == MG_ERR_OUT_OF_MEMORY && p == NULL, "gpu: an impossible allocation is out-of-memory (%s)",
           mg_last_error());
    tap_is_int(mg_linear(b, 4, 4, 4, MG_F32, (void *)1, 4, (void *)1, 4, MG_BF16, (void *)1, 4, 1, 0),
               MG_ERR_INVALID_ARG, "gpu: f32 in, bf16 out refused");
    mg_blas_destroy(b);
}

/* ------------------------------------------------------------ MG_REQUIRE_GPU */

/* The child mode (MG_TEST_RUNTIME_CHILD=tap_start): the start of a generated
 * test program (mg_tap_start), then one test that a device is there. */
static int child_tap_start(void)
{
    if (!mg_tap_start()) return 0;
    mg_tap_ok(mg_device_count() > 0, "a CUDA device is present");
    return mg_tap_done();
}

/* Runs CMD with /bin/sh (stderr into stdout); out gets the start of its
 * output; returns its exit status, -1 when it did not exit normally. */
static int run_sh(const char *cmd, char *out, size_t n)
{
    out[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t got = 0, r;
    char sink[256];
    while ((r = fread(got + 1 < n ? out + got : sink, 1, got + 1 < n ? n - 1 - got : sizeof sink, f)) > 0)
        if (got + 1 < n) got += r;
    out[got] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One case: CMD exits with want_rc, its output contains `want` and not
 * `unwanted` (NULL: no such condition). */
static void expect_run(const char *what, const char *cmd, int want_rc, const char *want, const char *unwanted)
{
    static char out[16384];
    int rc = run_sh(cmd, out, sizeof out);
    int pass = rc == want_rc && strstr(out, want) != NULL && (!unwanted || strstr(out, unwanted) == NULL);
    if (!tap_ok(pass, "MG_REQUIRE_GPU: %s (exit %d, want %d)", what, rc, want_rc))
        tap_diag("command: %s\nwanted in the output: '%s'%s%s%s\noutput:\n%s", cmd, want,
                 unwanted ? ", not: '" : "", unwanted ? unwanted : "", unwanted ? "'" : "", out);
}

#define N_REQUIRE_TESTS 12

static void test_require_gpu(int ndev)
{
    char exe[4096], cmd[8192];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0 || strchr(exe, '\'') != NULL) {
        tap_skip(N_REQUIRE_TESTS, "cannot name this program (/proc/self/exe) for its child runs");
        return;
    }
    exe[len] = '\0';
    /* a generated program's start, devices hidden */
    const char *child = "CUDA_VISIBLE_DEVICES= MG_TEST_RUNTIME_CHILD=tap_start";
    snprintf(cmd, sizeof cmd, "env -u MG_REQUIRE_GPU %s '%s' 2>&1", child, exe);
    expect_run("no device, unset: the program skips (exit 0)", cmd, 0, "1..0 # SKIP no CUDA device", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=0 %s '%s' 2>&1", child, exe);
    expect_run("no device, MG_REQUIRE_GPU=0: the program skips", cmd, 0, "1..0 # SKIP no CUDA device", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 %s '%s' 2>&1", child, exe);
    expect_run("no device, MG_REQUIRE_GPU=1: the program fails (not ok, exit 1)", cmd, 1,
               "not ok 1 - a CUDA device (MG_REQUIRE_GPU=1", "# SKIP");
    if (ndev > 0) {
        snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 MG_TEST_RUNTIME_CHILD=tap_start '%s' 2>&1", exe);
        expect_run("a device, MG_REQUIRE_GPU=1: the program runs", cmd, 0, "ok 1 - a CUDA device is present",
                   "not ok");
    } else {
        tap_skip(1, "no CUDA device here: the program's device-present path is not reachable");
    }

    /* the shell suites (gpu_lib.sh), from the environment `make check` sets */
    const char *top = getenv("top_srcdir"), *devinfo = getenv("MG_DEVINFO");
    if (!top || !devinfo || strchr(top, '\'') || strchr(devinfo, '\'')) {
        tap_skip(N_REQUIRE_TESTS - 4, "top_srcdir / MG_DEVINFO not set (run it under make check)");
        return;
    }
    const char *suite = "CUDA_VISIBLE_DEVICES= sh \"$top_srcdir/tests/gpu_mamba1.test\" 2>&1";
    snprintf(cmd, sizeof cmd, "env -u MG_REQUIRE_GPU %s", suite);
    expect_run("no device, unset: gpu_mamba1.test skips", cmd, 0, "1..0 # SKIP no CUDA device", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 %s", suite);
    expect_run("no device, MG_REQUIRE_GPU=1: gpu_mamba1.test fails", cmd, 1,
               "not ok 1 - the GPU suite can run (MG_REQUIRE_GPU=1: no skip allowed): no CUDA device", "# SKIP");
    /* a device found, nvcc missing */
    suite = "MG_DEVINFO=true NVCC=no sh \"$top_srcdir/tests/gpu_mamba3.test\" 2>&1";
    snprintf(cmd, sizeof cmd, "env -u MG_REQUIRE_GPU %s", suite);
    expect_run("no nvcc, unset: gpu_mamba3.test skips", cmd, 0, "1..0 # SKIP nvcc not found", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 %s", suite);
    expect_run("no nvcc, MG_REQUIRE_GPU=1: gpu_mamba3.test fails", cmd, 1, "not ok 1 - the GPU suite can run", "# SKIP");
    /* run_program (a device found by the suite): a generated program that
     * skips for lack of a device; this program's child mode with the
     * devices hidden, and a stand-in that only prints the skip plan (the
     * shell's own guard) */
    const char *prog =
        "sh -c '. \"$top_srcdir/tests/tap.sh\"; . \"$top_srcdir/tests/gpu_lib.sh\"; tap_tmpdir; "
        "ln -s \"$0\" \"$tap_tmp/real_test\"; printf \"#!/bin/sh\\necho \\\"1..0 # SKIP no CUDA device\\\"\\n\" "
        "> \"$tap_tmp/fake_test\"; chmod +x \"$tap_tmp/fake_test\"; "
        "CUDA_VISIBLE_DEVICES=; MG_TEST_RUNTIME_CHILD=tap_start; export CUDA_VISIBLE_DEVICES MG_TEST_RUNTIME_CHILD; "
        "run_program \"$tap_tmp\" $1 prog; tap_done' '%s' %s 2>&1";
    char body[6144];
    snprintf(body, sizeof body, prog, exe, "real_test");
    snprintf(cmd, sizeof cmd, "env -u MG_REQUIRE_GPU %s", body);
    expect_run("run_program, unset: a program's device skip is a skip", cmd, 0,
               "ok 1 - prog: test program # SKIP no CUDA device", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 %s", body);
    expect_run("run_program, MG_REQUIRE_GPU=1: the program's failure is passed through", cmd, 1,
               "not ok 1 - prog: a CUDA device (MG_REQUIRE_GPU=1", "# SKIP");
    snprintf(body, sizeof body, prog, exe, "fake_test");
    snprintf(cmd, sizeof cmd, "env -u MG_REQUIRE_GPU %s", body);
    expect_run("run_program, unset: a program printing only the skip plan 1..0 is a skip", cmd, 0,
               "ok 1 - prog: test program # SKIP no CUDA device", "not ok");
    snprintf(cmd, sizeof cmd, "env MG_REQUIRE_GPU=1 %s", body);
    expect_run("run_program, MG_REQUIRE_GPU=1: a program printing only the skip plan 1..0 fails", cmd, 1,
               "not ok 1 - prog: test program ran (MG_REQUIRE_GPU=1: no skip allowed)", "ok 1 - prog: test program # SKIP");
}

/* mg_tap_start_mask: the patterns the GPU suites' episode-start tests use. */
static void test_start_mask(void)
{
    enum { B = 6, T = 40 };
    unsigned char m[B * T];
    int n = 0;
    mg_tap_start_mask(m, B, T, MG_TAP_STARTS_NONE, 16, 8);
    for (int i = 0; i < B * T; ++i) n += m[i] != 0;
    tap_ok(n == 0, "start mask none: no start");
    mg_tap_start_mask(m, B, T, MG_TAP_STARTS_MID, 16, 8);
    n = 0;
    for (int i = 0; i < B * T; ++i) n += m[i] != 0;
    tap_ok(n == B && m[21] == 1 && m[T + 21] == 255, "start mask mid: one start per stream at T/2 + 1, 1 / 255");
    mg_tap_start_mask(m, B, T, MG_TAP_STARTS_FIRST, 16, 8);
    tap_ok(m[0] && m[T] && m[5 * T] && !m[1], "start mask first: t = 0 of every stream");
    mg_tap_start_mask(m, B, T, MG_TAP_STARTS_MIXED, 16, 8);
    int row0 = 0;
    for (int t = 0; t < T; ++t) row0 += m[t] != 0;
    const unsigned char *r1 = m + T, *r2 = m + 2 * T, *r3 = m + 3 * T, *r4 = m + 4 * T, *r5 = m + 5 * T;
    tap_ok(row0 == 0 && r1[0] && r1[20] && r2[8] && r2[16] && r2[24] && r2[32] && r2[39] && !r2[12] &&
           r3[3] && r3[4] && r3[5] && r3[25] && !r3[6] && r4[2] && r4[9] && r4[38] && !r4[3] && !r5[0],
           "start mask mixed: none, t = 0 + mid, chunk edges + last, consecutive + mid-chunk, every 7th");
}

int main(void)
{
    const char *child = getenv("MG_TEST_RUNTIME_CHILD");
    if (child && strcmp(child, "tap_start") == 0) return child_tap_start();
    test_status();
    test_rng();
    test_compare();
    test_derotate_pairs();
    test_rotated_states();
    test_m3_compare_states();
    test_m3_push_ranges();
    test_m3_angle_pushed();
    test_tap_diag_bits();
    test_tap_sections();
    test_start_mask();
    int ndev = mg_device_count();
    test_cuda_host(ndev);
    if (ndev > 0) {
        test_gemm();
    } else if (mg_tap_require_gpu()) {
        tap_ok(0, "a CUDA device for the GPU tests (MG_REQUIRE_GPU=1: no skip allowed)");
        tap_skip(N_GPU_TESTS - 1, "no CUDA device (mg_device_count() = 0)");
    } else {
        tap_skip(N_GPU_TESTS, "no CUDA device (mg_device_count() = 0)");
    }
    test_require_gpu(ndev);
    return tap_done();
}
