/* tests/checkpoint.c: NAME_load_safetensors and NAME_save_safetensors of a
 * generated library, without a GPU (tests/checkpoint.test builds it against
 * a package, with -DCK_NAME=name -DCK_UPPER=NAME, and gives it a scratch
 * directory): f32 round trip bit for bit (padding zeroed), bf16 and f16
 * round trips equal to the rounded values, the metadata, names with and
 * without a "backbone." prefix, files with a missing, extra or misshaped tensor, a
 * truncated file and wrong arguments refused with a message. Written
 * against model_alias.h. */
#include "model_alias.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mg_safetensors.h>
#include <mg_tap.h>

#define CK_CAT2(a, b) a##_##b
#define CK_CAT(a, b) CK_CAT2(a, b)
#ifndef model_load_safetensors
#define model_load_safetensors CK_CAT(CK_NAME, load_safetensors)
#endif
#ifndef model_save_safetensors
#define model_save_safetensors CK_CAT(CK_NAME, save_safetensors)
#endif
#define CK_SPEC_SHA256 CK_CAT(CK_UPPER, SPEC_SHA256)

#define NP MODEL_N_PARAMS
#define NF ((size_t)MODEL_WEIGHTS_FLOATS)

static char dir[4096];

static const char *path_of(const char *file)
{
    static char buf[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, file);
    return buf[k];
}

static float *new_blob(void)
{
    float *b = (float *)malloc(NF * sizeof *b);
    if (!b) mg_tap_bail("out of memory");
    return b;
}

/* Whether index j of the blob is inside some parameter. */
static int in_param(size_t j)
{
    for (int i = 0; i < NP; ++i)
        if (j >= model_params[i].offset && j < model_params[i].offset + model_params[i].numel) return 1;
    return 0;
}

static int same_bits(const float *a, const float *b) { return memcmp(a, b, NF * sizeof *a) == 0; }

/* First index where a and b differ (bits), or NF. */
static size_t first_diff(const float *a, const float *b)
{
    for (size_t j = 0; j < NF; ++j)
        if (memcmp(a + j, b + j, sizeof *a) != 0) return j;
    return NF;
}

/* The table for mg_st_write: names (with `prefix`), shapes, data from blob. */
typedef struct table {
    const char *names[NP + 1];
    char *owned[NP + 1];
    long dims[NP + 1][4];
    const long *shapes[NP + 1];
    int ndims[NP + 1];
    const float *data[NP + 1];
    size_t n;
} table;

/* A table name without a leading "backbone.". */
static const char *canon(const char *name)
{
    return strncmp(name, "backbone.", 9) == 0 ? name + 9 : name;
}

/* The table's names (canonical ones when `use_canon`) with `prefix`. */
static void table_init(table *t, const float *blob, const char *prefix, int use_canon)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; ++i) {
        const char *nm = use_canon ? canon(model_params[i].name) : model_params[i].name;
        const size_t len = strlen(prefix) + strlen(nm) + 1;
        t->owned[i] = (char *)malloc(len);
        if (!t->owned[i]) mg_tap_bail("out of memory");
        snprintf(t->owned[i], len, "%s%s", prefix, nm);
        t->names[i] = t->owned[i];
        t->ndims[i] = model_params[i].ndim;
        for (int d = 0; d < model_params[i].ndim; ++d) t->dims[i][d] = model_params[i].shape[d];
        t->shapes[i] = t->dims[i];
        t->data[i] = blob + model_params[i].offset;
    }
    t->n = NP;
}

static void table_free(table *t)
{
    for (int i = 0; i <= NP; ++i) free(t->owned[i]);
}

static void table_write(const table *t, const char *path)
{
    const mg_status s = mg_st_write(path, t->n, t->names, t->shapes, t->ndims, t->data, MG_ST_F32, NULL);
    if (s != MG_OK) {
        mg_tap_diag("%s", mg_last_error());
        mg_tap_bail("mg_st_write failed");
    }
}

/* A load that must fail with `want` and a message containing each of the
 * non-NULL strings, leaving the blob untouched. */
static void expect_refused(const char *path, mg_status want, const char *what, const char *has1,
                           const char *has2)
{
    float *b = new_blob();
    for (size_t j = 0; j < NF; ++j) b[j] = -3.25f;
    const mg_status s = model_load_safetensors(path, NULL, b, NF);
    const char *msg = mg_last_error();
    int untouched = 1;
    for (size_t j = 0; j < NF; ++j) untouched &= b[j] == -3.25f;
    const int pass = s == want && (!has1 || strstr(msg, has1)) && (!has2 || strstr(msg, has2)) && untouched;
    if (!mg_tap_ok(pass, "%s: refused with %s, message names it, blob untouched", what, mg_status_name(want)))
        mg_tap_diag("got %s (blob %s): %s", mg_status_name(s), untouched ? "untouched" : "WRITTEN", msg);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]); return 2; }
    snprintf(dir, sizeof dir, "%s", argv[1]);

    /* Known values: pseudo-random floats in (-2, 2) with full mantissas
     * (not bf16- or f16-exact); padding filled with junk. */
    float *src = new_blob(), *want = new_blob(), *got = new_blob();
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t n_pad = 0;
    for (size_t j = 0; j < NF; ++j) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const float v = (float)((double)(x >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        const int p = in_param(j);
        src[j] = p ? v : 12345.0f;
        want[j] = p ? v : 0.0f;
        n_pad += !p;
    }
    mg_tap_diag("%s: %d parameters, %zu floats, %zu padding", MODEL_NAME, NP, NF, n_pad);

    /* f32: bit-identical, padding zeroed */
    mg_status s = model_save_safetensors(path_of("f32.safetensors"), src, NF, 0);
    if (!mg_tap_ok(s == MG_OK, "save f32")) mg_tap_diag("%s", mg_last_error());
    for (size_t j = 0; j < NF; ++j) got[j] = 777.0f;
    s = model_load_safetensors(path_of("f32.safetensors"), NULL, got, NF);
    if (!mg_tap_ok(s == MG_OK && same_bits(got, want), "f32 save -> load: bit-identical, padding set to 0"))
        mg_tap_diag("%s (first difference at %zu)", s == MG_OK ? "" : mg_last_error(), first_diff(got, want));

    /* metadata, names, shapes and dtype of the file */
    mg_st_file *f = NULL;
    s = mg_st_open(path_of("f32.safetensors"), &f);
    int meta_ok = s == MG_OK;
    if (meta_ok) {
        const char *fmt = mg_st_metadata(f, "format"), *mod = mg_st_metadata(f, "mamba_gen_model"),
                   *sha = mg_st_metadata(f, "mamba_gen_spec_sha256");
        meta_ok = fmt && strcmp(fmt, "pt") == 0 && mod && strcmp(mod, MODEL_NAME) == 0 && sha &&
                  strcmp(sha, CK_SPEC_SHA256) == 0 && mg_st_count(f) == (size_t)NP;
        for (int i = 0; meta_ok && i < NP; ++i) {
            mg_st_info info;
            meta_ok = mg_st_find(f, model_params[i].name, &info) == MG_OK && info.dtype == MG_ST_F32 &&
                      info.ndim == model_params[i].ndim && info.numel == model_params[i].numel;
            for (int d = 0; meta_ok && d < info.ndim; ++d) meta_ok = info.shape[d] == model_params[i].shape[d];
        }
    }
    mg_st_close(f);
    mg_tap_ok(meta_ok, "the file: metadata format/mamba_gen_model/mamba_gen_spec_sha256, every parameter F32 by name and shape");

    /* bf16 and f16: the rounded values */
    static const struct { int dtype; const char *name, *file; } lp[] = {
        {1, "bf16", "bf16.safetensors"}, {2, "f16", "f16.safetensors"}};
    for (int k = 0; k < 2; ++k) {
        float *r = new_blob();
        for (size_t j = 0; j < NF; ++j)
            r[j] = lp[k].dtype == 1 ? mg_st_bf16_to_f32(mg_st_f32_to_bf16(want[j]))
                                    : mg_st_f16_to_f32(mg_st_f32_to_f16(want[j]));
        s = model_save_safetensors(path_of(lp[k].file), src, NF, lp[k].dtype);
        if (s == MG_OK) {
            for (size_t j = 0; j < NF; ++j) got[j] = 777.0f;
            s = model_load_safetensors(path_of(lp[k].file), NULL, got, NF);
        }
        int dt_ok = 0;
        if (s == MG_OK && mg_st_open(path_of(lp[k].file), &f) == MG_OK) {
            mg_st_info info;
            dt_ok = mg_st_find(f, model_params[0].name, &info) == MG_OK &&
                    info.dtype == (lp[k].dtype == 1 ? MG_ST_BF16 : MG_ST_F16);
            mg_st_close(f);
        }
        if (!mg_tap_ok(s == MG_OK && dt_ok && same_bits(got, r) && !same_bits(r, want),
                       "%s save -> load: the %s-rounded values", lp[k].name, lp[k].name))
            mg_tap_diag("%s (first difference at %zu)", s == MG_OK ? "" : mg_last_error(), first_diff(got, r));
        free(r);
    }

    /* the canonical names (without "backbone."), bare and with "backbone.":
     * prefix NULL accepts both; "" the bare ones, "backbone." the others */
    static const struct { const char *pre, *file, *load_as; } forms[] = {
        {"", "bare.safetensors", ""}, {"backbone.", "backbone.safetensors", "backbone."}};
    table t;
    for (int k = 0; k < 2; ++k) {
        table_init(&t, src, forms[k].pre, 1);
        table_write(&t, path_of(forms[k].file));
        for (int q = 0; q < 2; ++q) {
            const char *pre = q ? forms[k].load_as : NULL;
            for (size_t j = 0; j < NF; ++j) got[j] = 777.0f;
            s = model_load_safetensors(path_of(forms[k].file), pre, got, NF);
            if (!mg_tap_ok(s == MG_OK && same_bits(got, want), "names \"%sNAME\" load with prefix %s%s%s",
                           forms[k].pre, pre ? "\"" : "", pre ? pre : "NULL", pre ? "\"" : ""))
                mg_tap_diag("%s", mg_last_error());
        }
        table_free(&t);
    }
    /* the other form with a tensor missing: the message names it */
    table_init(&t, src, model_params[0].name[0] == 'b' ? "" : "backbone.", 1);
    t.n = NP - 1;
    table_write(&t, path_of("other_missing.safetensors"));
    expect_refused(path_of("other_missing.safetensors"), MG_ERR_SIZE, "a missing tensor, names in the other form",
                   "missing", canon(model_params[NP - 1].name));
    table_free(&t);

    /* a missing tensor (the last), an extra one, a wrong shape */
    table_init(&t, src, "", 0);
    t.n = NP - 1;
    table_write(&t, path_of("missing.safetensors"));
    expect_refused(path_of("missing.safetensors"), MG_ERR_SIZE, "a missing tensor", "missing",
                   model_params[NP - 1].name);

    t.n = NP + 1;
    t.names[NP] = "layers.0.mixer.not_a_param";
    t.ndims[NP] = 1;
    t.dims[NP][0] = 4;
    t.shapes[NP] = t.dims[NP];
    t.data[NP] = src;
    table_write(&t, path_of("extra.safetensors"));
    expect_refused(path_of("extra.safetensors"), MG_ERR_SIZE, "an extra tensor", "unexpected",
                   "layers.0.mixer.not_a_param");

    t.n = NP;
    int k2 = 0;   /* a 2-D parameter: its dims swapped (same numel), else dim 0 plus one */
    for (int i = 0; i < NP; ++i)
        if (model_params[i].ndim == 2 && model_params[i].shape[0] != model_params[i].shape[1]) { k2 = i; break; }
    if (model_params[k2].ndim == 2 && model_params[k2].shape[0] != model_params[k2].shape[1]) {
        t.dims[k2][0] = model_params[k2].shape[1];
        t.dims[k2][1] = model_params[k2].shape[0];
    } else {
        t.dims[k2][0] = model_params[k2].shape[0] - 1;
    }
    table_write(&t, path_of("shape.safetensors"));
    expect_refused(path_of("shape.safetensors"), MG_ERR_SIZE, "a wrong shape", "wrong shape",
                   model_params[k2].name);
    table_free(&t);

    /* a truncated file, a file that does not exist */
    FILE *in = fopen(path_of("f32.safetensors"), "rb"), *out = fopen(path_of("truncated.safetensors"), "wb");
    if (!in || !out) mg_tap_bail("cannot open the truncated copy");
    fseek(in, 0, SEEK_END);
    const long len = ftell(in);
    fseek(in, 0, SEEK_SET);
    for (long j = 0; j < len - 100; ++j) fputc(fgetc(in), out);
    fclose(in);
    fclose(out);
    expect_refused(path_of("truncated.safetensors"), MG_ERR_IO, "a truncated file", "truncated.safetensors", NULL);
    expect_refused(path_of("nonexistent.safetensors"), MG_ERR_IO, "a file that does not exist",
                   "nonexistent.safetensors", NULL);

    /* wrong arguments */
    s = model_load_safetensors(path_of("f32.safetensors"), NULL, got, NF - 1);
    mg_tap_ok(s == MG_ERR_SIZE && strstr(mg_last_error(), "WEIGHTS_FLOATS") != NULL, "load: n_floats wrong is MG_ERR_SIZE");
    s = model_save_safetensors(path_of("x.safetensors"), src, NF + 1, 0);
    mg_tap_ok(s == MG_ERR_SIZE, "save: n_floats wrong is MG_ERR_SIZE");
    mg_tap_ok(model_load_safetensors(NULL, NULL, got, NF) == MG_ERR_INVALID_ARG &&
              model_load_safetensors(path_of("f32.safetensors"), NULL, NULL, NF) == MG_ERR_INVALID_ARG &&
              model_save_safetensors(NULL, src, NF, 0) == MG_ERR_INVALID_ARG &&
              model_save_safetensors(path_of("x.safetensors"), NULL, NF, 0) == MG_ERR_INVALID_ARG,
              "NULL path or blob is MG_ERR_INVALID_ARG");
    s = model_save_safetensors(path_of("x.safetensors"), src, NF, 3);
    mg_tap_ok(s == MG_ERR_INVALID_ARG, "save: dtype 3 is MG_ERR_INVALID_ARG");
    in = fopen(path_of("x.safetensors"), "rb");
    mg_tap_ok(in == NULL, "no file written by a refused save");
    if (in) fclose(in);

    free(src);
    free(want);
    free(got);
    return mg_tap_done();
}
