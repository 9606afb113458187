/* mg_tap.c: the TAP harness and buffer helpers of the emitted test programs
 * (mg_tap.h). Output goes to stdout and is flushed per test line, so a crash
 * still shows how far the program got. */
#include "mg_tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "mg_cuda.h"
#include "mg_rng.h"

static int n_tests, n_failed;

/* 1 when the environment variable name is set to exactly "1" (the switches'
 * rule: any other value, or none, leaves them off). */
static int env_is_one(const char *name)
{
    const char *env = getenv(name);
    return env && strcmp(env, "1") == 0;
}

int mg_tap_require_gpu(void) { return env_is_one("MG_REQUIRE_GPU"); }

int mg_tap_no_clusters(void) { return env_is_one("MG_TEST_NO_CLUSTERS"); }

int mg_tap_start(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mg_device_count() == 0) {
        if (mg_tap_require_gpu()) {
            /* a broken CUDA setup must not pass as a skip */
            printf("not ok 1 - a CUDA device (MG_REQUIRE_GPU=1: no device is a failure, not a skip)\n");
            printf("1..1\n");
            fflush(stdout);
            exit(1);
        }
        printf("1..0 # SKIP no CUDA device\n");
        return 0;
    }
    return 1;
}

int mg_tap_budget(double ref_budget_macs, double macs_per_token, int min_tokens, double *scale)
{
    *scale = 1.0;
    const char *env = getenv("MG_TEST_SCALE");
    if (env && atof(env) > 0.0) *scale = atof(env);
    const double budget_d = *scale * ref_budget_macs / macs_per_token;
    if (budget_d > 1e8) return 100000000;
    return (int)budget_d > min_tokens ? (int)budget_d : min_tokens;
}

void mg_tap_diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("# ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

size_t mg_tap_diag_bits(const char *what, const float *a, const float *b, size_t n)
{
    size_t k = 0, first = 0;
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof a[i]) == 0) continue;
        if (k++ == 0) first = i;
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > mx || d != d) mx = d;
    }
    if (k)
        mg_tap_diag("%s: %zu of %zu floats differ, the first at %zu (%.9g vs %.9g), max |a - b| = %.3e", what, k, n,
                    first, (double)a[first], (double)b[first], mx);
    return k;
}

int mg_tap_ok(int pass, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", pass ? "" : "not ", ++n_tests);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    if (!pass) n_failed++;
    fflush(stdout);
    return pass;
}

void mg_tap_skip(const char *why, const char *what)
{
    printf("ok %d - %s # SKIP %s\n", ++n_tests, what, why);
    fflush(stdout);
}

int mg_tap_section_rule(const char *part, const char *only, int k, const char *name)
{
    if (part && *part) {
        int i, n, used = 0;
        if (sscanf(part, "%d/%d%n", &i, &n, &used) != 2 || part[used] != '\0' || n < 1 || i < 0 || i >= n) return -1;
        if (k % n != i) return 0;
    }
    if (!only || !*only) return 1;
    /* comma-separated substrings; an empty one matches nothing */
    for (const char *p = only; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            for (const char *q = name; strlen(q) >= len; ++q)
                if (strncmp(q, p, len) == 0) return 1;
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

int mg_tap_section(const char *name)
{
    static int k;   /* this section's index: the calls so far */
    const char *part = getenv("MG_TEST_PART"), *only = getenv("MG_TEST_ONLY");
    const int run = mg_tap_section_rule(part, only, k++, name);
    if (run < 0) {
        printf("Bail out! MG_TEST_PART=\"%s\": expected i/n with 0 <= i < n\n", part);
        exit(1);
    }
    if (!run) {
        char what[160];
        snprintf(what, sizeof what, "section %s", name);
        const int in_part = mg_tap_section_rule(part, NULL, k - 1, name);
        mg_tap_skip(in_part ? "not selected (MG_TEST_ONLY)" : "not in this part (MG_TEST_PART)", what);
    }
    return run;
}

void mg_tap_bail(const char *what)
{
    printf("Bail out! %s: %s\n", what, mg_last_error());
    exit(1);
}

void mg_tap_expect_status(mg_status got, mg_status want, const char *what)
{
    const char *msg = mg_last_error();
    mg_tap_ok(got == want && msg && msg[0], "bad call: %s -> %s", what, mg_status_name(want));
    mg_tap_diag("got %s: %s", mg_status_name(got), msg ? msg : "(null)");
    mg_clear_error();
}

void mg_tap_expect_error(mg_status got, mg_status want, const char *needle, const char *what)
{
    const char *msg = mg_last_error();
    const int named = msg && strstr(msg, needle) != NULL;   /* before mg_tap_expect_status clears it */
    mg_tap_expect_status(got, want, what);
    mg_tap_ok(named, "%s: the message contains \"%s\"", what, needle);
}

int mg_tap_done(void)
{
    printf("1..%d\n", n_tests);
    if (n_failed) mg_tap_diag("%d of %d tests failed", n_failed, n_tests);
    return n_failed ? 1 : 0;
}

float *mg_tap_dalloc(size_t n)
{
    void *p = NULL;
    if (mg_dev_alloc(&p, (n ? n : 1) * sizeof(float), "test buffer") != MG_OK) mg_tap_bail("cudaMalloc");
    /* zeros, so that a test never hands a kernel memory nobody wrote (the
     * bad-call tests run on inputs they do not fill; compute-sanitizer's
     * initcheck reports such reads) */
    if (cudaMemset(p, 0, (n ? n : 1) * sizeof(float)) != cudaSuccess) mg_tap_bail("cudaMemset");
    return (float *)p;
}

void mg_tap_up(float *d, const float *h, size_t n)
{
    if (n && cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) mg_tap_bail("upload");
}

void mg_tap_down(float *h, const float *d, size_t n)
{
    if (cudaDeviceSynchronize() != cudaSuccess) mg_tap_bail("sync");
    if (n && cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) mg_tap_bail("download");
}

static void *checked(void *p)
{
    if (!p) { printf("Bail out! out of host memory\n"); exit(1); }
    return p;
}

void *mg_tap_malloc(size_t bytes) { return checked(malloc(bytes ? bytes : 1)); }

void *mg_tap_calloc(size_t bytes) { return checked(calloc(1, bytes ? bytes : 1)); }

void mg_tap_randn(float *x, size_t n, uint64_t seed, float std)
{
    mg_rng r;
    mg_rng_seed(&r, seed);
    mg_rng_fill_normal(&r, x, n, 0.0f, std);
}

void mg_tap_states(int nst, const size_t *n, uint64_t seed, float std, int ref_copy, float **ds, float **hs,
                   double **rs)
{
    for (int i = 0; i < nst; ++i) {
        ds[i] = mg_tap_dalloc(n[i]);
        hs[i] = (float *)mg_tap_malloc(n[i] * sizeof(float));
        rs[i] = (double *)mg_tap_calloc(n[i] * sizeof(double));
        mg_tap_randn(hs[i], n[i], seed + (uint64_t)i, std);
        if (ref_copy)
            for (size_t j = 0; j < n[i]; ++j) rs[i][j] = hs[i][j];
        mg_tap_up(ds[i], hs[i], n[i]);
    }
}

void mg_tap_states_free(int nst, float **ds, float **hs, double **rs)
{
    for (int i = 0; i < nst; ++i) {
        mg_dev_free(ds[i]);
        free(hs[i]);
        free(rs[i]);
    }
}

void mg_tap_start_mask(unsigned char *m, int batch, int T, int pattern, int edge_a, int edge_b)
{
    if (batch < 1 || T < 1) return;
    memset(m, 0, (size_t)batch * (size_t)T);
    for (int b = 0; b < batch; ++b) {
        unsigned char *r = m + (size_t)b * (size_t)T;
        const unsigned char v = b % 2 ? 255 : 1;
        if (pattern == MG_TAP_STARTS_MID) {
            r[T / 2 + 1 < T ? T / 2 + 1 : T - 1] = v;
        } else if (pattern == MG_TAP_STARTS_FIRST) {
            r[0] = v;
        } else if (pattern == MG_TAP_STARTS_MIXED) {
            switch (b % 5) {
            case 1:
                r[0] = v;
                r[T / 2] = v;
                break;
            case 2:
                for (int t = edge_a; edge_a > 0 && t < T; t += edge_a) r[t] = v;
                for (int t = edge_b; edge_b > 0 && t < T; t += edge_b) r[t] = v;
                r[T - 1] = v;
                break;
            case 3:
                for (int t = 3; t <= 5 && t < T; ++t) r[t] = v;
                if (edge_a > 0 && edge_a + edge_a / 2 + 1 < T) r[edge_a + edge_a / 2 + 1] = v;
                break;
            case 4:
                for (int t = 2; t < T; t += 7) r[t] = v;
                if (T >= 2) r[T - 2] = v;
                break;
            default:
                break;
            }
        }
    }
}
