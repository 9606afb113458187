/* fuzz/fuzz_tune_cache.c: libFuzzer target for the autotune cache as
 * mamba-gen reads it (doc/tuning.md): the input is the cache directory's
 * content, its files (up to FZ_MAX_FILES, separated by lines "@@FILE@@"),
 * written into a scratch cache directory as SPECNAME-<16 hex>.json entries
 * of the fixed spec below (mamba1, `scan.chunk_size: auto`), the last one
 * named other.json. Each iteration then does what `mamba-gen --check
 * --gpu "NVIDIA H200" --tune-cache DIR` does (gen/cli.c cli_tune_cache):
 * tc_read (gen/tune_cache.c) with the spec's and the GPU's preference,
 * each file parsed by sy_parse into a tree (gen/lua_host.c lh_push_tune)
 * and looked up by mg/tune.lua resolve, in a fresh Lua host. It also feeds
 * the input to tc_file_name / tc_buf_json_str (entry names, JSON strings).
 * MG_FUZZ_VERBOSE=1 prints the lookup's note (which entry was taken, or why
 * none) for each input.
 *
 * "@SPEC@", "@GENERATOR@" and "@TEMPLATES@" in the input are replaced with
 * the fixed spec's key parts (computed once through mg/tune.lua key), so
 * seed entries match whatever the template set is now: the corpus in
 * fuzz/corpus/tune_cache/ reaches the "tuned" path and stays valid when
 * templates change.
 *
 * Crashes (besides the sanitizers' own): a Lua error that is not a spec
 * error, a resolved chunk_size that is not a tune candidate, tc_read
 * handing over a file beyond its bounds, a leaked descriptor, a file left
 * behind. `make fuzz` builds and runs it (fuzz/run.sh). */
#include "fuzz_util.h"

#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "lua_host.h"
#include "spec_yaml.h"
#include "tune_cache.h"

#define FZ_MAX_FILES 8
#define FZ_GPU "NVIDIA H200"
#define FZ_SEP "\n@@FILE@@\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fz_spec[] =
    "name: tuned_m\n"
    "arch: mamba1\n"
    "model: {d_model: 256, n_layers: 2, d_state: 64, expand: 2, d_conv: 4}\n"
    "precision: f32\n"
    "scan: {mode: chunked, chunk_size: auto}\n"
    "shapes: {max_batch: 8, max_seq_len: 4096}\n"
    "emit: {training: true, inference: true, deterministic: true}\n"
    "target: sm_90\n";

static char *fz_key[3]; /* spec, generator, templates */
static const char *const fz_key_tag[3] = {"@SPEC@", "@GENERATOR@", "@TEMPLATES@"};

static void fz_die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_tune_cache: %s\n%s\n", what, msg ? msg : "");
    abort();
}

static lh_host *fz_host(lh_tune_fn fn, void *ctx)
{
    char *err = NULL;
    lh_options lo = {NULL, 0, fn, ctx};
    lh_host *h = lh_new(&lo, &err);
    if (!h)
        fz_die("lh_new failed", err);
    if (sy_parse(lh_state(h), "tuned_m.yaml", fz_spec, sizeof fz_spec - 1, &err) != 0)
        fz_die("the fixed spec does not parse", err);
    return h;
}

/* The fixed spec's key parts, through mg/tune.lua (what mamba-tune --print-key prints). */
static void fz_key_init(void)
{
    lh_host *h = fz_host(NULL, NULL);
    lua_State *L = lh_state(h);
    static const char code[] = "local tree = ...\n"
                               "local spec = require('mg.validate').validate(tree)\n"
                               "local k = require('mg.tune').key(spec)\n"
                               "return k.spec, k.generator, k.templates\n";
    if (luaL_loadbufferx(L, code, sizeof code - 1, "=fuzz_key", "t") != LUA_OK)
        fz_die("key chunk", lua_tostring(L, -1));
    lua_insert(L, -2); /* the chunk under the tree */
    if (lua_pcall(L, 1, 3, 0) != LUA_OK)
        fz_die("key parts", lua_tostring(L, -1));
    for (int i = 0; i < 3; i++)
        if (!lua_isstring(L, i - 3) || !(fz_key[i] = strdup(lua_tostring(L, i - 3))))
            fz_die("key parts: not strings", NULL);
    lh_free(h);
}

static void fz_key_free(void)
{
    for (int i = 0; i < 3; i++)
        free(fz_key[i]);
}

/* DATA[0..SIZE) with the key tags replaced (malloc'd, NUL-terminated). */
static char *fz_subst(const char *data, size_t size, size_t *len)
{
    size_t cap = size + 1;
    for (size_t i = 0; i < size; i++)
        if (data[i] == '@')
            cap += 64; /* a tag never grows by more */
    char *s = malloc(cap), *o = s;
    if (!s)
        abort();
    for (size_t i = 0; i < size;) {
        int k;
        for (k = 0; k < 3; k++) {
            size_t tl = strlen(fz_key_tag[k]);
            if (size - i >= tl && memcmp(data + i, fz_key_tag[k], tl) == 0) {
                size_t vl = strlen(fz_key[k]);
                memcpy(o, fz_key[k], vl);
                o += vl;
                i += tl;
                break;
            }
        }
        if (k == 3)
            *o++ = data[i++];
    }
    *o = '\0';
    *len = (size_t)(o - s);
    return s;
}

/* What cli_tune_cache serves: a fixed GPU, the files of the cache. */
typedef struct {
    const char *dir;
    tc_files cache;
    lh_tune_file *files;
    int called;
} fz_tune;

static int fz_tune_cache(void *ctx, lh_tune_input *t)
{
    fz_tune *ft = ctx;
    char *err = NULL;
    ft->called++;
    t->gpu = FZ_GPU;
    t->cc = "9.0";
    t->driver = "13.0";
    t->gpu_source = "fuzz";
    t->dir = ft->dir;
    tc_select sel = {"tuned_m", FZ_GPU};
    if (tc_read(ft->dir, &sel, &ft->cache, &err) != 0)
        fz_die("tc_read fails on the scratch cache", err);
    if (ft->cache.n > TC_MAX_FILES)
        fz_die("tc_read: more files than TC_MAX_FILES", NULL);
    ft->files = calloc(ft->cache.n ? ft->cache.n : 1, sizeof *ft->files);
    if (!ft->files)
        return -1;
    for (size_t i = 0; i < ft->cache.n; i++) {
        const tc_file *f = &ft->cache.files[i];
        if (f->size > (size_t)TC_MAX_FILE_SIZE || f->data[f->size] != '\0')
            fz_die("tc_read: a file beyond TC_MAX_FILE_SIZE or not NUL-terminated", f->path);
        ft->files[i].path = f->path;
        ft->files[i].data = f->data;
        ft->files[i].size = f->size;
    }
    t->files = ft->files;
    t->nfiles = ft->cache.n;
    return 0;
}

/* The chunk_size of the print-spec text ("    chunk_size: N"), or -1. */
static long fz_chunk(const char *text)
{
    const char *p = text ? strstr(text, "\n    chunk_size: ") : NULL;
    return p ? strtol(p + 17, NULL, 10) : -1;
}

/* Entry names and JSON strings of the input as a spec name. */
static void fz_names(const char *s)
{
    tc_key_parts k = {s, s, s, s, s, s, s, s};
    char hex[SHA256_HEX_SIZE];
    tc_key(&k, hex);
    free(tc_file_name(&k));
    free(tc_file_prefix(s));
    tc_buf b = {0};
    tc_buf_json_str(&b, s);
    size_t len;
    char *j = tc_buf_take(&b, &len);
    if (j && (len < 2 || j[0] != '"' || j[len - 1] != '"' || strlen(j) != len))
        fz_die("tc_buf_json_str: not a JSON string", j);
    free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd0 = fz_begin();
    if (!fz_key[0]) {
        fz_key_init();
        atexit(fz_key_free);
    }
    char work[600], dir[700], path[800];
    snprintf(work, sizeof work, "%s/w", fz_setup());
    snprintf(dir, sizeof dir, "%s/cache", work);
    if (mkdir(work, 0755) != 0 || mkdir(dir, 0755) != 0)
        fz_die("cannot make the work directory (left over?)", strerror(errno));

    size_t len;
    char *text = fz_subst((const char *)data, size, &len);
    fz_names(text);
    /* the files: pieces between separators */
    const char *p = text, *end = text + len;
    for (int i = 0; i < FZ_MAX_FILES && p <= end; i++) {
        const char *q = i + 1 < FZ_MAX_FILES ? memmem(p, (size_t)(end - p), FZ_SEP, strlen(FZ_SEP)) : NULL;
        const char *e = q ? q : end;
        if (q && i + 1 < FZ_MAX_FILES)
            snprintf(path, sizeof path, "%s/tuned_m-%016x.json", dir, (unsigned)i);
        else
            snprintf(path, sizeof path, "%s/%s.json", dir, i == 0 ? "tuned_m-0123456789abcdef" : "other");
        fz_write(path, p, (size_t)(e - p));
        if (!q)
            break;
        p = q + strlen(FZ_SEP);
    }
    free(text);

    fz_tune ft;
    memset(&ft, 0, sizeof ft);
    ft.dir = dir;
    lh_host *h = fz_host(fz_tune_cache, &ft);
    lh_args a = {"print-spec", "tuned_m.yaml", "0", NULL};
    lh_result r;
    int status = lh_run_main(h, &a, &r);
    lh_free(h);
    if (status != LH_OK)
        fz_die("the fixed spec fails with this cache", r.message);
    if (ft.called != 1)
        fz_die("mg.tune_cache() was not asked exactly once", NULL);
    long chunk = fz_chunk(r.text);
    if (chunk != 16 && chunk != 32 && chunk != 64 && chunk != 128 && chunk != 256)
        fz_die("a chunk_size that is not a candidate", r.text);
    if (getenv("MG_FUZZ_VERBOSE")) /* what the lookup made of the input */
        for (size_t i = 0; i < r.nnotes; i++)
            fprintf(stderr, "fuzz_tune_cache: note: %s\n", r.notes[i]);
    lh_result_free(&r);
    free(ft.files);
    tc_files_free(&ft.cache);

    fz_check_clean(work, fd0);
    return 0;
}
