/* fuzz/fuzz_spec.c: libFuzzer target for the spec path of mamba-gen: the
 * input is a spec file. Each iteration does what `mamba-gen -o DIR SPEC`
 * and `mamba-gen --print-spec SPEC` do (gen/cli.c cli_run): a fresh Lua
 * host (no state carried between iterations), sy_load (the YAML checks of
 * gen/spec_yaml.c), lh_run_main (validation, derivation, the templates),
 * and for a valid spec od_check_files and od_write into a directory that is
 * removed afterwards. No tune cache is served (`auto` takes its default).
 *
 * Crashes (besides the sanitizers' own): a Lua error that is not a spec
 * error (exit 2 of mamba-gen: a generator bug), an emitted file set that
 * od_check_files rejects, a write into the scratch directory that fails, a
 * leaked file descriptor or a file left behind. `make fuzz` builds and runs
 * it (fuzz/run.sh). */
#include "fuzz_util.h"

#include <stdint.h>

#include "lua_host.h"
#include "outdir.h"
#include "spec_yaml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_internal(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_spec: %s\n%s\n", what, msg ? msg : "");
    abort();
}

/* Runs COMMAND on the spec file PATH in a fresh host; fills *R (free it
 * with lh_result_free) unless sy_load rejects the file (then returns -1). */
static int fz_run(const char *path, const char *command, lh_result *r)
{
    char *err = NULL;
    lh_options lo = {NULL, 0, NULL, NULL};
    lh_host *h = lh_new(&lo, &err);
    if (!h)
        fz_internal("lh_new failed", err);
    char hash[SHA256_HEX_SIZE];
    if (sy_load(lh_state(h), path, hash, &err) != 0) {
        if (!err || strncmp(err, path, strlen(path)) != 0) /* messages are PATH:... */
            fz_internal("sy_load: an error without the path", err);
        free(err);
        lh_free(h);
        return -1;
    }
    lh_args a = {command, path, hash, NULL};
    int status = lh_run_main(h, &a, r);
    lh_free(h);
    if (status == LH_INTERNAL)
        fz_internal("internal error (a Lua error that is not a spec error)", r->message);
    if (status != LH_OK && status != LH_SPEC_ERRORS)
        fz_internal("lh_run_main: unknown status", NULL);
    return status;
}

static void fz_emit(const char *dir, const lh_result *r)
{
    od_file *files = calloc(r->nfiles ? r->nfiles : 1, sizeof *files);
    if (!files)
        abort();
    for (size_t i = 0; i < r->nfiles; i++) {
        files[i].path = r->files[i].path;
        files[i].data = r->files[i].content;
        files[i].size = r->files[i].size;
    }
    char *err = NULL;
    if (od_check_files(files, r->nfiles, &err) != 0)
        fz_internal("od_check_files rejects the emitted file set", err);
    if (od_write(dir, files, r->nfiles, &err) != 0)
        fz_internal("od_write failed in the scratch directory", err);
    free(files);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd0 = fz_begin();
    char work[600], spec[700], out[700];
    snprintf(work, sizeof work, "%s/w", fz_setup());
    snprintf(spec, sizeof spec, "%s/spec.yaml", work);
    snprintf(out, sizeof out, "%s/out", work);
    if (mkdir(work, 0755) != 0)
        fz_internal("cannot make the work directory (left over?)", strerror(errno));
    fz_write(spec, data, size);

    lh_result r;
    int status = fz_run(spec, "emit", &r);
    if (status >= 0) {
        if (status == LH_OK)
            fz_emit(out, &r);
        lh_result_free(&r);
    }
    if (status == LH_OK) { /* the same spec again: the --print-spec text */
        memset(&r, 0, sizeof r);
        int st = fz_run(spec, "print-spec", &r);
        if (st != LH_OK || !r.text)
            fz_internal("print-spec fails on a spec that emits", st >= 0 ? r.message : "sy_load rejects it");
        lh_result_free(&r);
    }
    fz_check_clean(work, fd0);
    return 0;
}
