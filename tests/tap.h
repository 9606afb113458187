/* tap.h: TAP (Test Anything Protocol) helpers for the C test programs.
 *   tap_plan(n);  tap_ok(cond, "name %d", i);  tap_is_int(got, want, ...);
 *   tap_near(got, want, abs_tol, rel_tol, ...);  tap_diag(...);
 *   tap_skip(n, "reason") for tests that cannot run (e.g. no GPU);
 *   tap_skip_all("reason") when nothing can run;
 *   tap_calloc(n, size) for test data (exits on out of memory);
 *   return tap_done();  -> 0 if every test passed and the count matches.
 * Every check returns 1 on pass, 0 on failure. Not thread-safe. */
#ifndef MG_TESTS_TAP_H
#define MG_TESTS_TAP_H

#include <stddef.h>

#if defined(__GNUC__)
#define TAP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TAP_PRINTF(a, b)
#endif

void tap_plan(int n);
/* No plan up front: tap_done() prints "1..N" after the tests (also the
 * default when tap_plan is never called). */
void tap_no_plan(void);
int tap_ok(int cond, const char *fmt, ...) TAP_PRINTF(2, 3);
int tap_is_int(long long got, long long want, const char *fmt, ...) TAP_PRINTF(3, 4);
int tap_is_str(const char *got, const char *want, const char *fmt, ...) TAP_PRINTF(3, 4);
/* Passes if |got - want| <= abs_tol or |got - want| <= rel_tol * |want|;
 * a NaN (in got or want) never passes. */
int tap_near(double got, double want, double abs_tol, double rel_tol,
             const char *fmt, ...) TAP_PRINTF(5, 6);
void tap_diag(const char *fmt, ...) TAP_PRINTF(1, 2);
/* Records n skipped tests, each "ok K # SKIP reason". */
void tap_skip(int n, const char *fmt, ...) TAP_PRINTF(2, 3);
/* Prints "1..0 # SKIP reason" and exits 0. Call before any test. */
void tap_skip_all(const char *fmt, ...) TAP_PRINTF(1, 2);
/* calloc of n entries of size bytes (at least one, so never NULL on
 * success) for test data; out of memory ends the program with status 2. */
void *tap_calloc(size_t n, size_t size);
/* Number of tests run so far / failed so far. */
int tap_count(void);
int tap_failures(void);
/* Exit status: 0 if all passed and the count matches the plan, else 1. */
int tap_done(void);

#endif
