/* gen/cli.c: main() of mamba-gen: options, the order of the steps (read the
 * spec, build the tree, resolve autotuned values, run the Lua side, write or
 * print the result) and the exit statuses: 0 success, 1 the spec is invalid
 * (or the output cannot be written), 2 usage errors and internal errors (bugs
 * in the generator). `mamba-gen tune ...` runs the mamba-tune program. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <yaml.h>

#include "cli_util.h"
#include "gpu_query.h"
#include "hf_config.h"
#include "lua_host.h"
#include "outdir.h"
#include "spec_yaml.h"
#include "tune_cache.h"

#ifndef MG_VERSION
#error "MG_VERSION must be defined (the generator version string)"
#endif

enum { CLI_OK = 0, CLI_SPEC_ERROR = 1, CLI_USAGE = 2, CLI_INTERNAL = 2 };

typedef struct {
    const char *output;    /* -o DIR, or NULL: ./NAME */
    const char *templates; /* --templates DIR, or NULL: embedded */
    const char *lua_test;  /* --lua-test FILE */
    const char *gpu;       /* --gpu NAME, or NULL */
    const char *tune_cache; /* --tune-cache DIR, or NULL */
    const char *from_hf;   /* --from-hf CONFIG.json, or NULL */
    const char *name;      /* --name NAME (with --from-hf), or NULL */
    const char *spec;
    int check, print_spec, spec_reference, quiet;
} cli_opts;

static void cli_usage(FILE *fp)
{
    fputs("Usage: mamba-gen [OPTION]... SPEC.yaml\n"
          "       mamba-gen --from-hf CONFIG.json [--name NAME] [-o SPEC.yaml]\n"
          "       mamba-gen tune SPEC.yaml [OPTION]...   (autotuning on the GPU: runs mamba-tune;\n"
          "                                              see mamba-gen tune --help)\n"
          "Generate specialized CUDA kernels and a C host pipeline for the Mamba model\n"
          "described by SPEC.yaml.\n"
          "\n"
          "  -o, --output DIR     write the generated files into DIR (default: ./NAME,\n"
          "                       NAME being the spec's name); nothing is written if\n"
          "                       any error occurs, unchanged files are not rewritten,\n"
          "                       other files in DIR are kept; the new set replaces\n"
          "                       DIR at once (concurrent runs take turns)\n"
          "      --check          only validate the spec; print \"SPEC: ok\"\n"
          "      --print-spec     print the canonical spec (defaults and derived values\n"
          "                       filled in) on standard output\n"
          "      --templates DIR  use the templates in DIR instead of the built-in copy\n"
          "      --spec-reference print the reference of every spec key (Markdown)\n"
          "  -q, --quiet          do not list the written files\n"
          "      --gpu NAME       resolve `auto` values (scan.chunk_size) from the autotune\n"
          "                       cache entries of the GPU named NAME (as mamba-tune\n"
          "                       prints it), or \"none\"; default: $MG_GPU, else the\n"
          "                       first CUDA device, if any (else chunk_size 64)\n"
          "      --tune-cache DIR the autotune cache directory (default: $MG_TUNE_CACHE,\n"
          "                       else $XDG_CACHE_HOME/mamba-gen, else ~/.cache/mamba-gen)\n"
          "      --from-hf CONFIG.json  write a spec (arch mamba1) for the Hugging Face\n"
          "                       MambaConfig CONFIG.json (the config.json of a Mamba-1\n"
          "                       *-hf checkpoint, e.g. state-spaces/mamba-130m-hf) on\n"
          "                       standard output, or into the file given with -o;\n"
          "                       shapes.max_batch/max_seq_len are placeholders to edit\n"
          "      --name NAME      with --from-hf: the spec's name (default: from the\n"
          "                       config's _name_or_path, else mamba1_dD_lL)\n"
          "      --lua-test FILE  (developer) run the Lua file FILE in the generator's\n"
          "                       sandbox; exit 0 if it returns true or nothing\n"
          "  -h, --help           print this help and exit\n"
          "      --version        print version information and exit\n"
          "\n"
          "Exit status: 0 success; 1 invalid spec (messages are FILE:LINE:COL: ...)\n"
          "or output not writable; 2 usage error or internal error.\n",
          fp);
}

/* A usage error: the message, the --help hint, CLI_USAGE. */
#define cli_usage_error(fmt, arg) cu_usage_error("mamba-gen", CLI_USAGE, fmt, arg)

/* Flushes stdout; a failed write (e.g. a full disk) is CLI_SPEC_ERROR. */
static int cli_finish_stdout(int status)
{
    return cu_finish_stdout("mamba-gen", status);
}

/* Returns -1 to continue, or an exit status. */
static int cli_parse(int argc, char **argv, cli_opts *o)
{
    enum { OPT_CHECK = 256, OPT_PRINT_SPEC, OPT_TEMPLATES, OPT_VERSION, OPT_LUA_TEST, OPT_SPEC_REF, OPT_GPU,
           OPT_TUNE_CACHE, OPT_FROM_HF, OPT_NAME };
    static const struct option longopts[] = {
        {"output", required_argument, NULL, 'o'},
        {"check", no_argument, NULL, OPT_CHECK},
        {"print-spec", no_argument, NULL, OPT_PRINT_SPEC},
        {"templates", required_argument, NULL, OPT_TEMPLATES},
        {"quiet", no_argument, NULL, 'q'},
        {"lua-test", required_argument, NULL, OPT_LUA_TEST},
        {"spec-reference", no_argument, NULL, OPT_SPEC_REF},
        {"gpu", required_argument, NULL, OPT_GPU},
        {"tune-cache", required_argument, NULL, OPT_TUNE_CACHE},
        {"from-hf", required_argument, NULL, OPT_FROM_HF},
        {"name", required_argument, NULL, OPT_NAME},
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
        case OPT_GPU: o->gpu = optarg; break;
        case OPT_TUNE_CACHE: o->tune_cache = optarg; break;
        case OPT_FROM_HF: o->from_hf = optarg; break;
        case OPT_NAME: o->name = optarg; break;
        case OPT_VERSION: version = 1; break;
        default: return cu_getopt_error("mamba-gen", CLI_USAGE, c, argv);
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
    if (o->name && !o->from_hf)
        return cli_usage_error("%s", "--name is only used with --from-hf");
    if (o->from_hf) {
        if (optind < argc)
            return cli_usage_error("--from-hf takes no spec ('%s')", argv[optind]);
        if (o->check || o->print_spec || o->lua_test || o->spec_reference)
            return cli_usage_error("%s", "--from-hf cannot be combined with --check, --print-spec, --lua-test or "
                                         "--spec-reference (run --check on the spec it writes)");
        if (!*o->from_hf)
            return cli_usage_error("%s", "--from-hf needs a file name");
        if (o->output && !*o->output)
            return cli_usage_error("%s", "-o/--output needs a non-empty file name");
        return -1;
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
    if (o->gpu && !*o->gpu)
        return cli_usage_error("%s", "--gpu needs a device name (or none)");
    if (o->tune_cache && !*o->tune_cache)
        return cli_usage_error("%s", "--tune-cache needs a non-empty directory name");
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

/* What mg.tune_cache() serves (cli_tune_cache): the GPU found and the cache
 * files read on Lua's first call, kept until the run is over. */
typedef struct {
    const cli_opts *o;
    gq_gpu gpu;
    char *dir;
    char *spec_name; /* the spec's name: the cache's entries named for it are read first */
    tc_files cache;
    lh_tune_file *files;
} cli_tune_data;

/* lh_tune_fn: --gpu / $MG_GPU / the first CUDA device, and the files of the
 * cache directory (read only when a GPU is known). A cache that cannot be
 * found or read is a note, not an error: `auto` then takes its default. */
static int cli_tune_cache(void *ctx, lh_tune_input *t)
{
    cli_tune_data *td = ctx;
    char *err = NULL;
    gq_detect(td->o->gpu, &td->gpu);
    t->gpu = td->gpu.found ? td->gpu.name : NULL;
    t->cc = td->gpu.cc[0] ? td->gpu.cc : NULL;
    t->driver = td->gpu.driver[0] ? td->gpu.driver : NULL;
    t->sms = td->gpu.sms;
    t->gpu_source = td->gpu.source;
    td->dir = tc_dir(td->o->tune_cache, &err);
    if (!td->dir) {
        fprintf(stderr, "mamba-gen: note: %s\n", err);
        free(err);
    } else if (td->gpu.found) {
        tc_select sel = {td->spec_name, td->gpu.name};
        if (tc_read(td->dir, &sel, &td->cache, &err) != 0) {
            fprintf(stderr, "mamba-gen: note: %s (the cache is not used)\n", err);
            free(err);
        }
        for (size_t i = 0; i < td->cache.nwarnings; i++)
            fprintf(stderr, "mamba-gen: warning: %s\n", td->cache.warnings[i]);
    }
    t->dir = td->dir;
    td->files = calloc(td->cache.n ? td->cache.n : 1, sizeof *td->files);
    if (!td->files)
        return -1;
    for (size_t i = 0; i < td->cache.n; i++) {
        td->files[i].path = td->cache.files[i].path;
        td->files[i].data = td->cache.files[i].data;
        td->files[i].size = td->cache.files[i].size;
    }
    t->files = td->files;
    t->nfiles = td->cache.n;
    return 0;
}

static void cli_tune_data_free(cli_tune_data *td)
{
    free(td->files);
    tc_files_free(&td->cache);
    free(td->dir);
    free(td->spec_name);
}

/* The spec's top-level `name` scalar (the tree on the top of L's stack), or
 * NULL: only an index into the tune cache, Lua checks the spec. */
static char *cli_spec_name(lua_State *L)
{
    char *name = NULL;
    int top = lua_gettop(L);
    if (lua_type(L, -1) == LUA_TTABLE && lua_getfield(L, top, "keys") == LUA_TTABLE &&
        lua_getfield(L, top, "values") == LUA_TTABLE) {
        for (lua_Integer i = 1; !name && lua_rawgeti(L, top + 1, i) == LUA_TTABLE; i++) {
            if (lua_getfield(L, -1, "value") == LUA_TSTRING && strcmp(lua_tostring(L, -1), "name") == 0 &&
                lua_rawgeti(L, top + 2, i) == LUA_TTABLE && lua_getfield(L, -1, "value") == LUA_TSTRING)
                name = strdup(lua_tostring(L, -1));
            lua_settop(L, top + 2);
        }
    }
    lua_settop(L, top);
    return name;
}

/* --lua-test FILE: the test's own output, then its verdict. */
static int cli_lua_test(const cli_opts *o, lh_host *h)
{
    char *err = NULL;
    int status = lh_run_file(h, o->lua_test, &err);
    fflush(stdout); /* the test's own output first */
    if (status != 0) {
        fputs(err, stderr);
        free(err);
    }
    return status;
}

/* --spec-reference: the Markdown text from Lua, no spec. */
static int cli_spec_reference(lh_host *h)
{
    lua_pushnil(lh_state(h)); /* no spec tree */
    lh_args a = {"spec-reference", "", "", NULL};
    lh_result r;
    int status = lh_run_main(h, &a, &r);
    if (status != LH_OK)
        fputs(r.message, stderr);
    else
        fwrite(r.text, 1, r.text_size, stdout);
    lh_result_free(&r);
    return status == LH_OK ? CLI_OK : CLI_INTERNAL;
}

/* --from-hf: the spec on stdout, or written to -o FILE. */
static int cli_from_hf(const cli_opts *o, lh_host *h)
{
    char *text = NULL, *err = NULL;
    size_t size = 0;
    int status = hf_from_config(h, o->from_hf, o->name, &text, &size, &err);
    if (status != 0) {
        fputs(err, stderr);
        free(err);
        return status == 1 ? CLI_SPEC_ERROR : CLI_INTERNAL;
    }
    if (!o->output) {
        fwrite(text, 1, size, stdout);
    } else if (hf_write_file(o->output, text, size, &err) != 0) {
        fprintf(stderr, "mamba-gen: %s\n", err);
        free(err);
        status = CLI_SPEC_ERROR;
    } else if (!o->quiet) {
        printf("wrote %s\n", o->output);
    }
    free(text);
    return status;
}

/* What Lua made of the spec: the notes, then the errors or the product. */
static int cli_report(const cli_opts *o, int status, const lh_result *r)
{
    for (size_t i = 0; i < r->nnotes; i++)
        fprintf(stderr, "mamba-gen: note: %s\n", r->notes[i]);
    if (status != LH_OK) {
        fputs(r->message, stderr);
        return status == LH_SPEC_ERRORS ? CLI_SPEC_ERROR : CLI_INTERNAL;
    }
    if (o->check) {
        if (!o->quiet)
            printf("%s: ok\n", o->spec);
        return CLI_OK;
    }
    if (o->print_spec) {
        fwrite(r->text, 1, r->text_size, stdout);
        return CLI_OK;
    }
    return cli_emit(o, r);
}

/* The steps of a run: the Lua host, then the mode (a Lua test, the spec
 * reference, or a spec: read it, let Lua validate and derive it, asking for
 * the autotune cache when it has `auto` values, and report). */
static int cli_run(const cli_opts *o)
{
    char *err = NULL;
    cli_tune_data td;
    memset(&td, 0, sizeof td);
    td.o = o;
    lh_options lo = {o->templates, o->lua_test != NULL, cli_tune_cache, &td};
    lh_host *h = lh_new(&lo, &err);
    if (!h) {
        fprintf(stderr, "%s\n", err);
        free(err);
        return CLI_USAGE;
    }
    int status;
    if (o->lua_test) {
        status = cli_lua_test(o, h);
    } else if (o->from_hf) {
        status = cli_from_hf(o, h);
    } else if (o->spec_reference) {
        status = cli_spec_reference(h);
    } else {
        char hash[SHA256_HEX_SIZE];
        if (sy_load(lh_state(h), o->spec, hash, &err) != 0) { /* the spec's tree on the stack */
            fprintf(stderr, "%s\n", err);
            free(err);
            status = CLI_SPEC_ERROR;
        } else {
            td.spec_name = cli_spec_name(lh_state(h));
            const char *command = o->check ? "check" : o->print_spec ? "print-spec" : "emit";
            lh_args a = {command, o->spec, hash, NULL};
            lh_result r;
            status = cli_report(o, lh_run_main(h, &a, &r), &r);
            lh_result_free(&r);
        }
    }
    lh_free(h);
    cli_tune_data_free(&td);
    return cli_finish_stdout(status);
}

/* `mamba-gen tune ARGS...` runs `mamba-tune ARGS...`: $MG_TUNE if set, else
 * mamba-tune next to this executable (the build tree or the bindir), else
 * the first on PATH. Only returns on failure. */
static int cli_tune(int argc, char **argv)
{
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) {
        fputs("mamba-gen: out of memory\n", stderr);
        return CLI_INTERNAL;
    }
    av[0] = "mamba-tune";
    for (int i = 2; i < argc; i++)
        av[i - 1] = argv[i];
    const char *env = getenv("MG_TUNE");
    if (env && *env) {
        execv(env, av);
        fprintf(stderr, "mamba-gen tune: cannot run %s (MG_TUNE): %s\n", env, strerror(errno));
        free(av);
        return CLI_USAGE;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 16);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            strcpy(slash + 1, "mamba-tune");
            if (access(self, X_OK) == 0)
                execv(self, av);
        }
    }
    execvp("mamba-tune", av);
    fprintf(stderr, "mamba-gen tune: cannot run mamba-tune: %s\n"
                    "(it is installed next to mamba-gen; set MG_TUNE to its path)\n",
            strerror(errno));
    free(av);
    return CLI_USAGE;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "tune") == 0)
        return cli_tune(argc, argv);
    cli_opts o;
    memset(&o, 0, sizeof o);
    int status = cli_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    return cli_run(&o);
}
