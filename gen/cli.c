/* gen/cli.c: main() of mamba-gen: options, the order of the steps (read the
 * spec, build the tree, run the Lua side, write or print the result) and the
 * exit statuses: 0 success, 1 the spec is invalid (or the output cannot be
 * written), 2 usage errors and internal errors (bugs in the generator). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lua.h>
#include <yaml.h>

#include "lua_host.h"
#include "outdir.h"
#include "spec_yaml.h"

#ifndef MG_VERSION
#error "MG_VERSION must be defined (the generator version string)"
#endif

enum { CLI_OK = 0, CLI_SPEC_ERROR = 1, CLI_USAGE = 2, CLI_INTERNAL = 2 };

typedef struct {
    const char *output;    /* -o DIR, or NULL: ./NAME */
    const char *templates; /* --templates DIR, or NULL: embedded */
    const char *lua_test;  /* --lua-test FILE */
    const char *spec;
    int check, print_spec, spec_reference, quiet;
} cli_opts;

static void cli_usage(FILE *fp)
{
    fputs("Usage: mamba-gen [OPTION]... SPEC.yaml\n"
          "       mamba-gen tune SPEC.yaml [OPTION]...   (autotuning; not available in this build)\n"
          "Generate specialized CUDA kernels and a C host pipeline for the Mamba model\n"
          "described by SPEC.yaml.\n"
          "\n"
          "  -o, --output DIR     write the generated files into DIR (default: ./NAME,\n"
          "                       NAME being the spec's name); nothing is written if\n"
          "                       any error occurs, unchanged files are not rewritten\n"
          "      --check          only validate the spec; print \"SPEC: ok\"\n"
          "      --print-spec     print the canonical spec (defaults and derived values\n"
          "                       filled in) on standard output\n"
          "      --templates DIR  use the templates in DIR instead of the built-in copy\n"
          "      --spec-reference print the reference of every spec key (Markdown)\n"
          "  -q, --quiet          do not list the written files\n"
          "      --lua-test FILE  (developer) run the Lua file FILE in the generator's\n"
          "                       sandbox; exit 0 if it returns true or nothing\n"
          "  -h, --help           print this help and exit\n"
          "      --version        print version information and exit\n"
          "\n"
          "Exit status: 0 success; 1 invalid spec (messages are FILE:LINE:COL: ...)\n"
          "or output not writable; 2 usage error or internal error.\n",
          fp);
}

static int cli_usage_error(const char *fmt, const char *arg)
{
    fputs("mamba-gen: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nTry 'mamba-gen --help' for more information.\n", stderr);
    return CLI_USAGE;
}

/* Flushes stdout; a failed write (e.g. a full disk) must not look like success. */
static int cli_finish_stdout(int status)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("mamba-gen: error writing to standard output");
        return status == CLI_OK ? CLI_SPEC_ERROR : status;
    }
    return status;
}

/* Returns -1 to continue, or an exit status. */
static int cli_parse(int argc, char **argv, cli_opts *o)
{
    enum { OPT_CHECK = 256, OPT_PRINT_SPEC, OPT_TEMPLATES, OPT_VERSION, OPT_LUA_TEST, OPT_SPEC_REF };
    static const struct option longopts[] = {
        {"output", required_argument, NULL, 'o'},
        {"check", no_argument, NULL, OPT_CHECK},
        {"print-spec", no_argument, NULL, OPT_PRINT_SPEC},
        {"templates", required_argument, NULL, OPT_TEMPLATES},
        {"quiet", no_argument, NULL, 'q'},
        {"lua-test", required_argument, NULL, OPT_LUA_TEST},
        {"spec-reference", no_argument, NULL, OPT_SPEC_REF},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    int help = 0, version = 0;
    opterr = 0; /* our own messages, with the --help hint */
    for (;;) {
        int c = getopt_long(argc, argv, ":o:qh", longopts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case 'o': o->output = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'h': help = 1; break;
        case OPT_CHECK: o->check = 1; break;
        case OPT_PRINT_SPEC: o->print_spec = 1; break;
        case OPT_TEMPLATES: o->templates = optarg; break;
        case OPT_LUA_TEST: o->lua_test = optarg; break;
        case OPT_SPEC_REF: o->spec_reference = 1; break;
        case OPT_VERSION: version = 1; break;
        case ':':
            return cli_usage_error("option '%s' requires an argument", argv[optind - 1]);
        default:
            if (optopt) {
                char opt[3] = {'-', (char)optopt, '\0'};
                return cli_usage_error("unknown option '%s'", opt);
            }
            return cli_usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (help) {
        cli_usage(stdout);
        return cli_finish_stdout(CLI_OK);
    }
    if (version) {
        printf("mamba-gen %s\n%s\nlibyaml %s\n", MG_VERSION, LUA_RELEASE, yaml_get_version_string());
        return cli_finish_stdout(CLI_OK);
    }
    if (o->lua_test) {
        if (optind < argc)
            return cli_usage_error("--lua-test takes no spec ('%s')", argv[optind]);
        if (o->check || o->print_spec || o->output)
            return cli_usage_error("%s", "--lua-test cannot be combined with --check, --print-spec or -o");
        return -1;
    }
    if (o->spec_reference) {
        if (optind < argc)
            return cli_usage_error("--spec-reference takes no spec ('%s')", argv[optind]);
        if (o->check || o->print_spec || o->output)
            return cli_usage_error("%s", "--spec-reference cannot be combined with --check, --print-spec or -o");
        return -1;
    }
    if (optind == argc)
        return cli_usage_error("%s", "missing SPEC.yaml");
    if (argc - optind > 1)
        return cli_usage_error("unexpected argument '%s' (only one spec per run)", argv[optind + 1]);
    o->spec = argv[optind];
    if (o->check && o->print_spec)
        return cli_usage_error("%s", "--check and --print-spec cannot be combined");
    if (o->output && (o->check || o->print_spec))
        return cli_usage_error("%s", "-o/--output is only used when emitting (not with --check or --print-spec)");
    if (o->output && !*o->output)
        return cli_usage_error("%s", "-o/--output needs a non-empty directory name");
    return -1;
}

/* Writes R's files into the output directory and lists them. */
static int cli_emit(const cli_opts *o, const lh_result *r)
{
    const char *dir = o->output;
    if (!dir) {
        /* NAME comes from the spec: it must be a plain directory name. */
        if (!r->name || !od_path_ok(r->name) || strchr(r->name, '/')) {
            fprintf(stderr, "mamba-gen: internal error: the result has no usable spec name for the default "
                            "output directory (got %s); use -o DIR\n", r->name ? r->name : "none");
            return CLI_INTERNAL;
        }
        dir = r->name;
    }
    od_file *files = calloc(r->nfiles ? r->nfiles : 1, sizeof *files);
    if (!files) {
        fputs("mamba-gen: out of memory\n", stderr);
        return CLI_INTERNAL;
    }
    for (size_t i = 0; i < r->nfiles; i++) {
        files[i].path = r->files[i].path;
        files[i].data = r->files[i].content;
        files[i].size = r->files[i].size;
    }
    char *err = NULL;
    if (od_check_files(files, r->nfiles, &err) != 0) { /* a generator bug, not the user's */
        fprintf(stderr, "mamba-gen: internal error: %s\n", err);
        free(err);
        free(files);
        return CLI_INTERNAL;
    }
    if (od_write(dir, files, r->nfiles, &err) != 0) {
        fprintf(stderr, "mamba-gen: %s\n", err);
        free(err);
        free(files);
        return CLI_SPEC_ERROR;
    }
    if (!o->quiet) {
        size_t dlen = strlen(dir);
        while (dlen > 1 && dir[dlen - 1] == '/')
            dlen--;
        for (size_t i = 0; i < r->nfiles; i++)
            printf("%s %.*s/%s\n", files[i].written ? "wrote" : "unchanged", (int)dlen, dir, files[i].path);
    }
    free(files);
    return CLI_OK;
}

static int cli_run(const cli_opts *o)
{
    char *err = NULL;
    lh_options lo = {o->templates, o->lua_test != NULL};
    lh_host *h = lh_new(&lo, &err);
    if (!h) {
        fprintf(stderr, "%s\n", err);
        free(err);
        return CLI_USAGE;
    }
    int status;
    if (o->lua_test) {
        status = lh_run_file(h, o->lua_test, &err);
        fflush(stdout); /* the test's own output first */
        if (status != 0) {
            fputs(err, stderr);
            free(err);
        }
        lh_free(h);
        return cli_finish_stdout(status);
    }

    if (o->spec_reference) {
        lua_pushnil(lh_state(h)); /* no spec tree */
        lh_args a = {"spec-reference", "", ""};
        lh_result r;
        status = lh_run_main(h, &a, &r);
        if (status != LH_OK)
            fputs(r.message, stderr);
        else
            fwrite(r.text, 1, r.text_size, stdout);
        status = status == LH_OK ? CLI_OK : CLI_INTERNAL;
        lh_result_free(&r);
        lh_free(h);
        return cli_finish_stdout(status);
    }

    sy_file f;
    if (sy_read_file(o->spec, &f, &err) != 0) {
        fprintf(stderr, "%s\n", err);
        free(err);
        lh_free(h);
        return CLI_SPEC_ERROR;
    }
    int rc = sy_parse(lh_state(h), o->spec, f.data, f.size, &err);
    sy_file_free(&f);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        free(err);
        lh_free(h);
        return CLI_SPEC_ERROR;
    }
    const char *command = o->check ? "check" : o->print_spec ? "print-spec" : "emit";
    lh_args a = {command, o->spec, f.hash};
    lh_result r;
    status = lh_run_main(h, &a, &r);
    if (status != LH_OK) {
        fputs(r.message, stderr);
        status = status == LH_SPEC_ERRORS ? CLI_SPEC_ERROR : CLI_INTERNAL;
    } else if (o->check) {
        if (!o->quiet)
            printf("%s: ok\n", o->spec);
        status = CLI_OK;
    } else if (o->print_spec) {
        fwrite(r.text, 1, r.text_size, stdout);
        status = CLI_OK;
    } else {
        status = cli_emit(o, &r);
    }
    lh_result_free(&r);
    lh_free(h);
    return cli_finish_stdout(status);
}

int main(int argc, char **argv)
{
    /* Reserved subcommand: the autotuner arrives with a later change. */
    if (argc >= 2 && strcmp(argv[1], "tune") == 0) {
        fputs("mamba-gen tune: not available in this build\n", stderr);
        return CLI_USAGE;
    }
    cli_opts o;
    memset(&o, 0, sizeof o);
    int status = cli_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    return cli_run(&o);
}
