/* cli_util.c: the command-line conventions of mamba-gen and mamba-tune
 * (cli_util.h). One copy, so that both programs word their usage errors
 * alike. */
#include "cli_util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>

int cu_usage_error(const char *prog, int code, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help' for more information.\n", prog);
    return code;
}

int cu_getopt_error(const char *prog, int code, int c, char **argv)
{
    if (c == ':')
        return cu_usage_error(prog, code, "option '%s' requires an argument", argv[optind - 1]);
    if (optopt) {
        char opt[3] = {'-', (char)optopt, '\0'};
        return cu_usage_error(prog, code, "unknown option '%s'", opt);
    }
    return cu_usage_error(prog, code, "unknown option '%s'", argv[optind - 1]);
}

int cu_finish_stdout(const char *prog, int status)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        const int e = errno;   /* perror reports the write's error */
        char what[96];
        snprintf(what, sizeof what, "%s: error writing to standard output", prog);
        errno = e;
        perror(what);
        return status == 0 ? 1 : status;
    }
    return status;
}
