/* tap.c: TAP helpers (see tap.h). */
#include "tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_n, tap_failed, tap_planned = -1;

/* In a variadic function: `call`, with ap the va_list of the arguments
 * after the parameter `last`. */
#define WITH_VA(ap, last, call)  \
    do {                         \
        va_list ap;              \
        va_start(ap, last);      \
        call;                    \
        va_end(ap);              \
    } while (0)

void tap_plan(int n)
{
    tap_planned = n;
    printf("1..%d\n", n);
    fflush(stdout);
}

void tap_no_plan(void)
{
    tap_planned = -1;
}

static void vreport(int pass, const char *fmt, va_list ap)
{
    tap_n++;
    if (!pass)
        tap_failed++;
    printf("%sok %d - ", pass ? "" : "not ", tap_n);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

int tap_ok(int cond, const char *fmt, ...)
{
    WITH_VA(ap, fmt, vreport(cond != 0, fmt, ap));
    return cond != 0;
}

int tap_is_int(long long got, long long want, const char *fmt, ...)
{
    int pass = got == want;
    WITH_VA(ap, fmt, vreport(pass, fmt, ap));
    if (!pass)
        tap_diag("     got: %lld\n expected: %lld", got, want);
    return pass;
}

int tap_is_str(const char *got, const char *want, const char *fmt, ...)
{
    int pass = (got == NULL && want == NULL)
               || (got != NULL && want != NULL && strcmp(got, want) == 0);
    WITH_VA(ap, fmt, vreport(pass, fmt, ap));
    if (!pass)
        tap_diag("     got: %s%s%s\n expected: %s%s%s", got ? "'" : "",
                 got ? got : "NULL", got ? "'" : "", want ? "'" : "",
                 want ? want : "NULL", want ? "'" : "");
    return pass;
}

int tap_near(double got, double want, double abs_tol, double rel_tol,
             const char *fmt, ...)
{
    double d = fabs(got - want);
    int pass = !isnan(got) && !isnan(want)
               && (got == want || d <= abs_tol || d <= rel_tol * fabs(want));
    WITH_VA(ap, fmt, vreport(pass, fmt, ap));
    if (!pass)
        tap_diag("     got: %.17g\n expected: %.17g\n    |diff|: %.3e (abs_tol %.3e, "
                 "rel %.3e, rel_tol %.3e)", got, want, d, abs_tol,
                 want != 0 ? d / fabs(want) : INFINITY, rel_tol);
    return pass;
}

void tap_diag(const char *fmt, ...)
{
    char buf[4096];
    WITH_VA(ap, fmt, vsnprintf(buf, sizeof buf, fmt, ap));
    /* One "# " per line so multi-line diagnostics stay TAP comments. */
    char *line = buf;
    for (;;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        printf("# %s\n", line);
        if (!nl)
            break;
        line = nl + 1;
    }
    fflush(stdout);
}

void tap_skip(int n, const char *fmt, ...)
{
    char buf[1024];
    WITH_VA(ap, fmt, vsnprintf(buf, sizeof buf, fmt, ap));
    for (int i = 0; i < n; i++) {
        tap_n++;
        printf("ok %d # SKIP %s\n", tap_n, buf);
    }
    fflush(stdout);
}

void tap_skip_all(const char *fmt, ...)
{
    char buf[1024];
    WITH_VA(ap, fmt, vsnprintf(buf, sizeof buf, fmt, ap));
    printf("1..0 # SKIP %s\n", buf);
    fflush(stdout);
    exit(0);
}

void *tap_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

int tap_count(void)
{
    return tap_n;
}

int tap_failures(void)
{
    return tap_failed;
}

int tap_done(void)
{
    if (tap_planned < 0) { /* no plan up front: trailing plan */
        printf("1..%d\n", tap_n);
        tap_planned = tap_n;
    }
    if (tap_planned >= 0 && tap_planned != tap_n) {
        printf("# planned %d tests but ran %d\n", tap_planned, tap_n);
        fflush(stdout);
        return 1;
    }
    if (tap_failed) {
        printf("# failed %d of %d tests\n", tap_failed, tap_n);
        fflush(stdout);
        return 1;
    }
    fflush(stdout);
    return 0;
}
