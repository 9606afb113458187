/* cli_util.[ch]: the command-line conventions mamba-gen and mamba-tune share
 * (cu_): a usage error names the program and points to --help, getopt's own
 * errors read the same in both, and a failed write to stdout is an error. */
#ifndef MG_CLI_UTIL_H
#define MG_CLI_UTIL_H

/* Prints "PROG: " FMT (with ARG) and the --help hint on stderr; returns
 * CODE (the program's usage exit status). */
int cu_usage_error(const char *prog, int code, const char *fmt, const char *arg);

/* The usage error for what getopt_long returned in C when it is not an
 * option the program knows (':' a missing argument, else an unknown
 * option), as cu_usage_error. Call it right after getopt_long (it reads
 * optind and optopt). */
int cu_getopt_error(const char *prog, int code, int c, char **argv);

/* Flushes stdout; a failed write (e.g. a full disk) must not look like
 * success: then "PROG: error writing to standard output: <errno text>" on
 * stderr, and 1 for a STATUS of 0 (other statuses are kept). */
int cu_finish_stdout(const char *prog, int status);

#endif
