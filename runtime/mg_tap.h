/* mg_tap.h: the harness of the emitted test programs (NAME_test,
 * NAME_train_test): TAP output on stdout (numbered "ok" / "not ok" lines,
 * "# " diagnostics, skips, "Bail out!"), and the buffer helpers every test
 * uses, which bail out instead of returning errors so that a test case reads
 * as a straight line. One process runs one TAP stream: the counters are
 * process-wide. */
#ifndef MG_TAP_H
#define MG_TAP_H
#include <stddef.h>
#include <stdint.h>
#include "mg_status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The start of a test program: line-buffered stdout; without a CUDA device,
 * the plan "1..0 # SKIP no CUDA device" and 0 (the program then exits 0).
 * With MG_REQUIRE_GPU=1 in the environment (set it on GPU machines) no
 * device is a failure instead: "not ok 1 - a CUDA device ...", the plan
 * "1..1", and exit(1), so a broken CUDA setup cannot pass as a skip. */
int mg_tap_start(void);

/* 1 when MG_REQUIRE_GPU=1 is set: a skip for lack of a device (or of
 * anything a GPU run needs) must be a failure. */
int mg_tap_require_gpu(void);

/* 1 when MG_TEST_NO_CLUSTERS=1 is set: the test programs leave out the
 * kernels that run as thread-block clusters with distributed shared memory
 * (Mamba-1's single-launch decode: its own sections become TAP skips, and
 * decode runs on the fused path instead). Why: compute-sanitizer's
 * racecheck (2025.3) stops the whole program with an internal error at such
 * a kernel, checked or not; make check-sanitize sets this for its
 * racecheck runs. */
int mg_tap_no_clusters(void);

/* Tokens the CPU reference may process in the whole run: ref_budget_macs
 * (the reference work at scale 1) times MG_TEST_SCALE (default 1; *scale
 * gets it) over macs_per_token, at least min_tokens, at most 1e8. */
int mg_tap_budget(double ref_budget_macs, double macs_per_token, int min_tokens, double *scale);

/* "# " + the formatted text + newline. */
void mg_tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* After a failed bit-identity check: "# WHAT: K of N floats differ, the
 * first at I (A vs B), max |a - b| = M", or nothing when a and b are the
 * same bits. Returns K. */
size_t mg_tap_diag_bits(const char *what, const float *a, const float *b, size_t n);

/* One numbered test line: "ok N - TEXT" or "not ok N - TEXT"; returns pass
 * (so a failure can print diagnostics: if (!mg_tap_ok(...)) mg_tap_diag(...)). */
int mg_tap_ok(int pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "ok N - WHAT # SKIP WHY". */
void mg_tap_skip(const char *why, const char *what);

/* Sections: the named groups of cases of a test program, in call order
 * (k = 0, 1, ...). mg_tap_section(name) says whether section k runs in this
 * process: always, unless the environment narrows it:
 *   MG_TEST_PART="i/n"    the sections with k % n == i (0 <= i < n): n
 *                         processes with i = 0..n-1 run every section once
 *                         between them, side by side (a slow tool such as
 *                         compute-sanitizer racecheck, over one program);
 *   MG_TEST_ONLY="a,b"    the sections whose name contains a or b.
 * A section left out is one TAP skip naming it ("ok N - section NAME #
 * SKIP ..."). The setup a program does before its first section runs in
 * every process. A malformed MG_TEST_PART bails out. */
int mg_tap_section(const char *name);

/* The rule alone (no environment, no output): 1 when section k named name
 * runs under part (NULL or "": every section) and only (NULL or "": no
 * filter), 0 when it does not, -1 when part is not "i/n" with 0 <= i < n. */
int mg_tap_section_rule(const char *part, const char *only, int k, const char *name);

/* "Bail out! WHAT: <mg_last_error()>" and exit(1). */
void mg_tap_bail(const char *what) __attribute__((noreturn));

/* A call that must fail: "ok" when it returned want with a message in
 * mg_last_error(); the message is printed and cleared. */
void mg_tap_expect_status(mg_status got, mg_status want, const char *what);

/* The same, and the message must contain needle (it names the function and
 * the argument at fault): one test for the status, one for the message. */
void mg_tap_expect_error(mg_status got, mg_status want, const char *needle, const char *what);

/* The plan "1..N" (printed last), a diagnostic naming the failures if any;
 * returns the exit status of the program (1 when a test failed). */
int mg_tap_done(void);

/* Device buffer of n floats (at least one), zero-filled, or bail out. */
float *mg_tap_dalloc(size_t n);
/* Upload / download n floats (download synchronizes the device first); bail
 * out on error. */
void mg_tap_up(float *d, const float *h, size_t n);
void mg_tap_down(float *h, const float *d, size_t n);
/* Host memory (at least one byte), or bail out; _calloc zeroes it. */
void *mg_tap_malloc(size_t bytes);
void *mg_tap_calloc(size_t bytes);
/* x[0..n) ~ N(0, std^2) from mg_rng seeded with seed. */
void mg_tap_randn(float *x, size_t n, uint64_t seed, float std);
/* Initial states of the tests that pass states in: for each of the nst
 * states (n[i] floats) hs[i] on the host ~ N(0, std^2) (seed + i), ds[i]
 * its device copy, and rs[i] the f64 reference's initial state: hs[i]
 * (ref_copy 1) or zeros (0: a call that must ignore the states given).
 * Bail out on error; mg_tap_states_free frees the three arrays. */
void mg_tap_states(int nst, const size_t *n, uint64_t seed, float std, int ref_copy, float **ds, float **hs,
                   double **rs);
void mg_tap_states_free(int nst, float **ds, float **hs, double **rs);
/* An episode-start mask m [batch][T] (doc/math.md §9) of a test pattern;
 * set bytes are 1 in even streams and 255 in odd ones (any nonzero byte is
 * a start):
 *   MG_TAP_STARTS_NONE    no start (all zero);
 *   MG_TAP_STARTS_MID     every stream at one mid-window token, T/2 + 1
 *                         (the last token when T < 3);
 *   MG_TAP_STARTS_FIRST   every stream at t = 0;
 *   MG_TAP_STARTS_MIXED   by stream b % 5: none; t = 0 and t = T/2; every
 *                         multiple of edge_a and of edge_b (chunk edges of
 *                         the kernels; <= 0: none) and the last token (a
 *                         last episode of one token); the consecutive
 *                         tokens 3, 4, 5 and edge_a + edge_a/2 + 1 (mid-
 *                         chunk); every 7th token from 2 and T-2.
 * Tokens past T are left out. */
enum { MG_TAP_STARTS_NONE = 0, MG_TAP_STARTS_MID = 1, MG_TAP_STARTS_FIRST = 2, MG_TAP_STARTS_MIXED = 3 };
void mg_tap_start_mask(unsigned char *m, int batch, int T, int pattern, int edge_a, int edge_b);

#ifdef __cplusplus
}
#endif
#endif
