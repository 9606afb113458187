/* test_safetensors.c: libmgrt's safetensors reader and writer
 * (runtime/mg_safetensors.h). Every file is made here, in a temporary
 * directory: by the writer (f32, bf16, f16, read back exactly), byte for
 * byte as the Python library writes it (compatibility), and hostile: every
 * truncation and every single-byte corruption of a small file, bad header
 * lengths, a list of bad JSON headers, bad offsets, unknown dtypes, shapes
 * whose size overflows. Also the parameter-table loader with its combined
 * error message. */
#include "tap.h"
#include "mg_safetensors.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static const char *tpath(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL || fwrite(buf, 1, n, fp) != n || fclose(fp) != 0) {
        printf("Bail out! cannot write %s\n", path);
        exit(2);
    }
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = tap_calloc((size_t)len + 1, 1);
    *n = fread(b, 1, (size_t)len, fp);
    fclose(fp);
    return b;
}

/* A file: 8-byte length, header (padded with spaces to a multiple of 8 when
 * pad), then data. Returns its bytes (caller frees) and length. */
static unsigned char *make_file(const char *header, int pad, const void *data, size_t dlen,
                                size_t *len)
{
    size_t h = strlen(header), hp = pad ? (h + 7) / 8 * 8 : h;
    unsigned char *b = tap_calloc(8 + hp + dlen, 1);
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)hp >> (8 * k));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, ' ', hp - h);
    if (dlen)
        memcpy(b + 8 + hp, data, dlen);
    *len = 8 + hp + dlen;
    return b;
}

static void put_file(const char *path, const char *header, const void *data, size_t dlen)
{
    size_t n;
    unsigned char *b = make_file(header, 1, data, dlen, &n);
    write_bytes(path, b, n);
    free(b);
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static int has(const char *msg, const char *sub) { return strstr(msg, sub) != NULL; }

/* ------------------------------------------------------------ conversions */

static void test_conversions(void)
{
    static const struct { uint32_t in; uint16_t bf16; } bf[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8: tie, to even (down) */
        {0x3f818000u, 0x3f82}, /* 1 + 3*2^-8: tie, to even (up) */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0xbf800000u, 0xbf80}, /* -1 */
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000},
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x000116c2u, 0x0001}, /* an f32 subnormal */
        {0x00008000u, 0x0000}, /* tie at the smallest subnormal: even */
        {0x40490fdbu, 0x4049}, /* pi */
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++) {
        uint16_t h = mg_st_f32_to_bf16(u2f(bf[i].in));
        if (h != bf[i].bf16) {
            tap_diag("bf16(%08x) = %04x, want %04x", bf[i].in, h, bf[i].bf16);
            ok = 0;
        }
    }
    tap_ok(ok, "f32 -> bf16: known values, round to nearest even, inf, subnormals");
    uint16_t hn = mg_st_f32_to_bf16(u2f(0x7fc00001u));
    tap_ok((hn & 0x7f80) == 0x7f80 && (hn & 0x7f) != 0, "f32 -> bf16: NaN stays NaN (%04x)", hn);
    hn = mg_st_f32_to_bf16(u2f(0x7f800001u)); /* payload only in the low bits */
    tap_ok((hn & 0x7f80) == 0x7f80 && (hn & 0x7f) != 0, "f32 -> bf16: a low-payload NaN stays NaN (%04x)", hn);

    static const struct { float in; uint16_t f16; } hf[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.5f, 0x3800}, {0.1f, 0x2e66},
        {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00}, {1e9f, 0x7c00},
        {-65520.0f, 0xfc00}, {0x1p-14f, 0x0400}, {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},                  /* tie at half the smallest subnormal: even */
        {0x1.0002p-25f, 0x0001},             /* above it */
        {0x1.8p-24f, 0x0002},                /* 1.5 ulp: tie, to even (2) */
        {0x1.4p-23f, 0x0002},                /* 2.5 ulp: tie, to even (2) */
        {0x1.ff8p-15f, 0x03ff},              /* the largest subnormal */
        {0x1.ffcp-15f, 0x0400},              /* tie with the smallest normal: even (up) */
        {1.0f + 0x1p-11f, 0x3c00},           /* tie, to even (down) */
        {1.0f + 0x1.8p-10f, 0x3c02},         /* tie, to even (up) */
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {0x1p-30f, 0x0000}, {-0x1p-30f, 0x8000},
        {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
    };
    ok = 1;
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        uint16_t h = mg_st_f32_to_f16(hf[i].in);
        if (h != hf[i].f16) {
            tap_diag("f16(%a) = %04x, want %04x", (double)hf[i].in, h, hf[i].f16);
            ok = 0;
        }
    }
    tap_ok(ok, "f32 -> f16: known values, round to nearest even, overflow, subnormals, inf");
    hn = mg_st_f32_to_f16(NAN);
    tap_ok((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0, "f32 -> f16: NaN stays NaN (%04x)", hn);
    hn = mg_st_f32_to_f16(u2f(0xff800001u));
    tap_ok((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0 && (hn & 0x8000),
           "f32 -> f16: a low-payload negative NaN stays NaN (%04x)", hn);

    /* every 16-bit pattern: the f32 value is exact, and converting back
     * gives the same bits (NaNs stay NaN) */
    int f16_exact = 1, f16_back = 1, bf_back = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        int e = (int)(h >> 10) & 31, m = (int)(h & 0x3ff);
        double want = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                         : ldexp(1024 + m, e - 25);
        if (h & 0x8000)
            want = -want;
        float got = mg_st_f16_to_f32((uint16_t)h);
        if (e == 31 && m) {
            if (!isnan(got))
                f16_exact = 0;
        } else if ((double)got != want || !signbit(got) != !signbit(want)) {
            if (f16_exact)
                tap_diag("f16 %04x -> %a, want %a", h, (double)got, want);
            f16_exact = 0;
        }
        uint16_t back = mg_st_f32_to_f16(got);
        if (e == 31 && m ? !((back & 0x7c00) == 0x7c00 && (back & 0x3ff)) : back != h)
            f16_back = 0;
        float bg = mg_st_bf16_to_f32((uint16_t)h);
        if (f2u(bg) != h << 16)
            bf_back = 0;
        uint16_t bb = mg_st_f32_to_bf16(bg);
        int bnan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (bnan ? !((bb & 0x7f80) == 0x7f80 && (bb & 0x7f)) : bb != h)
            bf_back = 0;
    }
    tap_ok(f16_exact, "f16 -> f32: every pattern exact (subnormals, inf, NaN)");
    tap_ok(f16_back, "f16 -> f32 -> f16: every pattern comes back");
    tap_ok(bf_back, "bf16 -> f32 -> bf16: every pattern comes back");
}

/* ------------------------------------------------------------ round trips */

static void test_roundtrip(void)
{
    float a[6] = {1.0f, -2.5f, 0.1f, 3.0e38f, 1e-40f, -0.0f};
    float b[3] = {INFINITY, -INFINITY, 65520.0f};
    float c[1] = {42.0f};
    float big[1000];
    for (int i = 0; i < 1000; i++)
        big[i] = (float)sin(i * 0.37) * (float)(1 << (i % 20));
    const char *names[] = {"layer.b", "layer.a", "scalar", "empty", "big"};
    long sa[] = {2, 3}, sb[] = {3}, se[] = {0, 5}, sbig[] = {10, 10, 10};
    const long *shapes[] = {sb, sa, NULL, se, sbig};
    int ndims[] = {1, 2, 0, 2, 3};
    const float *data[] = {b, a, c, NULL, big};
    const mg_st_dtype dts[] = {MG_ST_F32, MG_ST_BF16, MG_ST_F16};
    for (int k = 0; k < 3; k++) {
        mg_st_dtype dt = dts[k];
        const char *dn = mg_st_dtype_name(dt);
        const char *p = tpath("rt.safetensors");
        mg_status s = mg_st_write(p, 5, names, shapes, ndims, data, dt,
                                  "{\"format\":\"pt\",\"note\":\"q\\\"\\u00e9\"}");
        if (!tap_ok(s == MG_OK, "%s: write 5 tensors (%s)", dn, mg_last_error())) {
            tap_skip(7, "no file");
            continue;
        }
        mg_st_file *f = NULL;
        s = mg_st_open(p, &f);
        if (!tap_ok(s == MG_OK && f != NULL, "%s: open it (%s)", dn, mg_last_error())) {
            tap_skip(6, "no file");
            continue;
        }
        tap_is_int((long long)mg_st_count(f), 5, "%s: 5 tensors", dn);
        /* sorted by name, contiguous */
        mg_st_info in;
        int order_ok = 1;
        const char *want_order[] = {"big", "empty", "layer.a", "layer.b", "scalar"};
        const unsigned char *prev_end = NULL;
        for (size_t i = 0; i < 5; i++) {
            if (mg_st_get(f, i, &in) != MG_OK || strcmp(in.name, want_order[i]) != 0 ||
                in.dtype != dt || (prev_end && (const unsigned char *)in.data != prev_end))
                order_ok = 0;
            prev_end = (const unsigned char *)in.data + in.bytes;
        }
        tap_ok(order_ok, "%s: tensors sorted by name, data contiguous", dn);
        tap_ok(mg_st_find(f, "layer.a", &in) == MG_OK && in.ndim == 2 && in.shape[0] == 2 &&
               in.shape[1] == 3 && in.numel == 6 && in.bytes == 6 * mg_st_dtype_size(dt) &&
               mg_st_find(f, "scalar", &in) == MG_OK && in.ndim == 0 && in.numel == 1 &&
               mg_st_find(f, "empty", &in) == MG_OK && in.numel == 0 && in.bytes == 0,
               "%s: find: shapes, element counts, byte sizes (scalar, empty)", dn);
        const char *note = mg_st_metadata(f, "note");
        tap_ok(mg_st_metadata_count(f) == 2 && mg_st_metadata(f, "format") &&
               strcmp(mg_st_metadata(f, "format"), "pt") == 0 && note &&
               strcmp(note, "q\"\xc3\xa9") == 0 && mg_st_metadata(f, "nope") == NULL,
               "%s: metadata read back", dn);
        /* values: exact for f32, the converted value for bf16/f16 */
        float ra[6], rb[3], rc[1], rbig[1000], rz[1];
        int vals = mg_st_read_f32(f, "layer.a", sa, 2, ra) == MG_OK &&
                   mg_st_read_f32(f, "layer.b", sb, 1, rb) == MG_OK &&
                   mg_st_read_f32(f, "scalar", NULL, 0, rc) == MG_OK &&
                   mg_st_read_f32(f, "empty", se, 2, rz) == MG_OK &&
                   mg_st_read_f32(f, "big", sbig, 3, rbig) == MG_OK;
        const float *src[] = {a, b, c, big};
        const float *got[] = {ra, rb, rc, rbig};
        const int cnt[] = {6, 3, 1, 1000};
        for (int t = 0; t < 4 && vals; t++)
            for (int i = 0; i < cnt[t]; i++) {
                float w = src[t][i];
                if (dt == MG_ST_BF16) w = mg_st_bf16_to_f32(mg_st_f32_to_bf16(w));
                if (dt == MG_ST_F16) w = mg_st_f16_to_f32(mg_st_f32_to_f16(w));
                if (f2u(got[t][i]) != f2u(w)) {
                    tap_diag("%s: tensor %d [%d]: %a, want %a", dn, t, i, (double)got[t][i], (double)w);
                    vals = 0;
                    break;
                }
            }
        tap_ok(vals, "%s: every value read back bit-exact", dn);
        if (dt == MG_ST_F16)
            tap_ok(rb[2] == INFINITY && ra[3] == INFINITY && ra[4] == 0.0f && f2u(ra[5]) == 0x80000000u &&
                   ra[2] == mg_st_f16_to_f32(0x2e66),
                   "f16: 65520 and 3e38 -> inf, 1e-40 -> 0, -0 kept, 0.1 -> 0x2e66");
        else if (dt == MG_ST_BF16)
            tap_ok(rb[0] == INFINITY && rb[1] == -INFINITY && ra[4] != 0.0f && ra[1] == -2.5f,
                   "bf16: inf kept, the f32 subnormal 1e-40 kept (nonzero), -2.5 exact");
        else
            tap_ok(ra[4] == 1e-40f && ra[3] == 3.0e38f && f2u(ra[5]) == 0x80000000u,
                   "f32: subnormal, large, -0 exact");
        mg_st_close(f);
    }
}

/* ------------------------------------------------------------ reference format */

static void test_reference_bytes(void)
{
    /* What the Python library writes for save_file({"a": tensor([1., 2.])}):
     * the compact header, padded with spaces to a multiple of 8. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    float v[2] = {1.0f, 2.0f};
    unsigned char le[8];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++)
            le[4 * i + k] = (unsigned char)(f2u(v[i]) >> (8 * k));
    size_t n;
    unsigned char *want = make_file(hdr, 1, le, 8, &n);
    tap_is_int((long long)n, 8 + 56 + 8, "reference: header of 54 bytes padded to 56");
    write_bytes(tpath("ref.safetensors"), want, n);
    mg_st_file *f = NULL;
    float got[2] = {0, 0};
    long sh[] = {2};
    tap_ok(mg_st_open(tpath("ref.safetensors"), &f) == MG_OK &&
           mg_st_read_f32(f, "a", sh, 1, got) == MG_OK && got[0] == 1.0f && got[1] == 2.0f,
           "reference: a hand-built file reads back (%s)", mg_last_error());
    mg_st_close(f);

    const char *nm[] = {"a"};
    const long *shp[] = {sh};
    int nd[] = {1};
    const float *dp[] = {v};
    size_t m = 0;
    unsigned char *mine = NULL;
    if (mg_st_write(tpath("mine.safetensors"), 1, nm, shp, nd, dp, MG_ST_F32, NULL) == MG_OK)
        mine = read_bytes(tpath("mine.safetensors"), &m);
    tap_ok(mine && m == n && memcmp(mine, want, n) == 0, "reference: the writer's bytes are the same");
    free(mine);
    free(want);

    /* with metadata and two bf16 tensors given out of order */
    const char *hdr2 = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                       "\"x\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[2,6]}}";
    unsigned char d2[6] = {0x80, 0x3f, 0x00, 0x40, 0x40, 0xc0}; /* 1, 2, -3 */
    want = make_file(hdr2, 1, d2, 6, &n);
    float xs[2] = {2.0f, -3.0f}, ws[1] = {1.0f};
    long s1[] = {1}, s21[] = {2, 1};
    const char *nm2[] = {"x", "w"};
    const long *shp2[] = {s21, s1};
    int nd2[] = {2, 1};
    const float *dp2[] = {xs, ws};
    mine = NULL;
    if (mg_st_write(tpath("mine2.safetensors"), 2, nm2, shp2, nd2, dp2, MG_ST_BF16, "{\"format\":\"pt\"}") == MG_OK)
        mine = read_bytes(tpath("mine2.safetensors"), &m);
    tap_ok(mine && m == n && memcmp(mine, want, n) == 0,
           "reference: metadata first, names sorted, bf16 little-endian, same bytes");
    tap_ok(mine && (m - 8 - 6) % 8 == 0 && mine[8 + (m - 8 - 6) - 1] == ' ',
           "reference: the header is padded with spaces to a multiple of 8");
    free(mine);
    free(want);

    /* pretty-printed JSON, escapes, a surrogate pair, gaps, tensors in any
     * order, empty tensors sharing an offset: all valid */
    const char *hdr3 =
        "{\n  \"b\\u00e9ta\\/\\ud83d\\ude00\" : { \"shape\" : [ 1 ], \"dtype\" : \"F16\",\n"
        "  \"data_offsets\" : [ 4 , 6 ] } ,\r\n\t\"z\": {\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[6,6]},"
        " \"y\": {\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},"
        "\"e\": {\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[6,6]},"
        "\"__metadata__\": {}}\n";
    unsigned char d3[16] = {0, 0, 0, 0, 0x00, 0x3c, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0};
    put_file(tpath("pretty.safetensors"), hdr3, d3, 16);
    f = NULL;
    mg_st_info in;
    mg_status s = mg_st_open(tpath("pretty.safetensors"), &f);
    tap_ok(s == MG_OK, "valid: whitespace, escapes, surrogate pair, gaps, empty tensors (%s)", mg_last_error());
    float one = 0;
    tap_ok(s == MG_OK && mg_st_count(f) == 4 &&
           mg_st_read_f32(f, "b\xc3\xa9ta/\xf0\x9f\x98\x80", s1, 1, &one) == MG_OK && one == 1.0f &&
           mg_st_find(f, "y", &in) == MG_OK && in.dtype == MG_ST_I64 && in.ndim == 0 &&
           ((const unsigned char *)in.data)[0] == 7 && mg_st_metadata_count(f) == 0,
           "valid: names decoded to UTF-8, values and dtypes as written");
    tap_ok(s == MG_OK && mg_st_read_f32(f, "y", NULL, 0, &one) == MG_ERR_INVALID_ARG &&
           has(mg_last_error(), "I64"), "read_f32 refuses an I64 tensor (%s)", mg_last_error());
    mg_st_close(f);
}

/* ------------------------------------------------------------ hostile files */

static void test_truncation_and_corruption(void)
{
    const char *p = tpath("small.safetensors");
    float a[3] = {1, 2, 3}, b[2] = {4, 5};
    long sa[] = {3}, sb[] = {1, 2};
    const char *nm[] = {"a", "b"};
    const long *sh[] = {sa, sb};
    int nd[] = {1, 2};
    const float *dp[] = {a, b};
    mg_st_write(p, 2, nm, sh, nd, dp, MG_ST_F16, "{\"k\":\"v\"}");
    size_t n = 0;
    unsigned char *full = read_bytes(p, &n);
    if (!tap_ok(full != NULL && n > 100, "a small file to cut (%zu bytes)", n)) {
        tap_skip(3, "no file");
        return;
    }
    const char *q = tpath("cut.safetensors");
    int all_err = 1, clean = 1;
    for (size_t len = 0; len < n; len++) {
        write_bytes(q, full, len);
        mg_st_file *f = (mg_st_file *)1;
        mg_status s = mg_st_open(q, &f);
        if (s == MG_OK) {
            tap_diag("a file cut to %zu of %zu bytes opened", len, n);
            all_err = 0;
            mg_st_close(f);
        } else if (f != NULL || s != MG_ERR_IO || !has(mg_last_error(), q)) {
            clean = 0;
        }
    }
    tap_ok(all_err, "every truncation (0..%zu bytes) is an error", n - 1);
    tap_ok(clean, "... MG_ERR_IO naming the file, *out NULL");

    /* every byte replaced by a few values: never a crash; what opens reads */
    static const unsigned char vals[] = {0x00, 0xff, '"', '{', '}', '[', ',', '9', '\\', 0x80};
    int reads_ok = 1;
    for (size_t i = 0; i < n; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            unsigned char *c = tap_calloc(n, 1);
            memcpy(c, full, n);
            c[i] = vals[v];
            write_bytes(q, c, n);
            free(c);
            mg_st_file *f = NULL;
            if (mg_st_open(q, &f) == MG_OK) {
                for (size_t t = 0; t < mg_st_count(f); t++) {
                    mg_st_info in;
                    float buf[8];
                    if (mg_st_get(f, t, &in) != MG_OK)
                        reads_ok = 0;
                    else if (in.numel <= 8 && in.ndim <= 2 &&
                             (in.dtype == MG_ST_F16 || in.dtype == MG_ST_F32 || in.dtype == MG_ST_BF16))
                        reads_ok &= mg_st_read_f32(f, in.name, in.shape, in.ndim, buf) == MG_OK;
                }
                mg_st_close(f);
            }
        }
    tap_ok(reads_ok, "every single-byte corruption: an error or a file that reads (no crash)");

    /* header lengths */
    static const uint64_t lens[] = {0, 1, 7, UINT64_MAX, (uint64_t)1 << 63, 100000001u, 0};
    int len_ok = 1;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        uint64_t L = k == sizeof lens / sizeof lens[0] - 1 ? n - 8 + 1 : lens[k];
        unsigned char *c = tap_calloc(n, 1);
        memcpy(c, full, n);
        for (int j = 0; j < 8; j++)
            c[j] = (unsigned char)(L >> (8 * j));
        write_bytes(q, c, n);
        free(c);
        mg_st_file *f = NULL;
        if (mg_st_open(q, &f) != MG_ERR_IO) {
            tap_diag("header length %llu accepted", (unsigned long long)L);
            len_ok = 0;
            mg_st_close(f);
        } else if (L > 100000000u && !has(mg_last_error(), "exceeds the limit")) {
            tap_diag("%s", mg_last_error());
            len_ok = 0;
        } else if (L == n - 7 && !has(mg_last_error(), "past the end of the file")) {
            tap_diag("%s", mg_last_error());
            len_ok = 0;
        }
    }
    tap_ok(len_ok, "corrupted header lengths (0, 1, 7, 2^64-1, 2^63, 100000001, one past the end) fail");
    free(full);
}

static void test_hostile_headers(void)
{
    /* each header is padded and followed by 16 zero bytes of data */
    static const struct { const char *hdr, *msg; } bad[] = {
        {"", "not a JSON object"},
        {"[]", "not a JSON object"},
        {"\"a\"", "not a JSON object"},
        {"{", "expected a string, the header ends"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", "expected '}'"},
        {"{}x", "trailing characters"},
        {"{}{}", "trailing characters"},
        {"{} ,", "trailing characters"},
        {"{'a':1}", "expected a string"},
        {"{\"a\":null}", "expected '{'"},
        {"{\"a\":true}", "expected '{'"},
        {"{\"a\":1}", "expected '{'"},
        {"{\"a\" {}}", "expected ':'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", "expected a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],}}", "expected a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", "\"a\" appears twice"},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "duplicate key \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"shape\":[2],\"data_offsets\":[0,8]}}", "duplicate key \"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"data_offsets\":[0,8]}}", "duplicate key \"data_offsets\""},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate key \"__metadata__\""},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", "metadata key \"k\" appears twice"},
        {"{\"__metadata__\":{\"k\":1}}", "metadata value of \"k\" is not a string"},
        {"{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", "not a string"},
        {"{\"__metadata__\":[]}", "expected '{'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", "unknown key \"extra\""},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "no \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "no \"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "no \"data_offsets\""},
        {"{\"a\":{}}", "no \"dtype\""},
        {"{\"a\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,8]}}", "unknown dtype \"F128\""},
        {"{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "unknown dtype \"f32\""},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", "unknown dtype \"F4\""},
        {"{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", "expected a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", "negative number"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", "not an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", "not an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", "leading zero"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[+2],\"data_offsets\":[0,8]}}", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[[2]],\"data_offsets\":[0,8]}}", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,8]}}", "expected '['"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,8]}}", "does not fit in 64 bits"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,8]}}", "does not fit in 64 bits"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,8]}}", "too large"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
         "\"data_offsets\":[0,4]}}", "more than 32 dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}", "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", "overflows"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", "decrease"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", "past the data buffer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", "past the data buffer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "hold 4 bytes, its F32 shape needs 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", "expected ']'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", "expected ','"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[8,10]}}", "overlap"},
        {"{\"a\\x\":{}}", "bad escape"},
        {"{\"a\\u12\":{}}", "bad \\u escape"},
        {"{\"a\\u12g4\":{}}", "bad \\u escape"},
        {"{\"a\\ud800\":{}}", "unpaired high surrogate"},
        {"{\"a\\ud800\\u0041\":{}}", "unpaired high surrogate"},
        {"{\"a\\udc00\":{}}", "unpaired low surrogate"},
        {"{\"a\\u0000\":{}}", "NUL character"},
        {"{\"a\tb\":{}}", "control character"},
        {"{\"a\nb\":{}}", "control character"},
        {"{\"a\xff\":{}}", "invalid UTF-8"},
        {"{\"a\xc0\xaf\":{}}", "invalid UTF-8"},
        {"{\"a\xed\xa0\x80\":{}}", "invalid UTF-8"},
        {"{\"a\xf4\x90\x80\x80\":{}}", "invalid UTF-8"},
        {"{\"a\xe2\x82\":{}}", "invalid UTF-8"},
        {"{\"abc", "unterminated string"},
        {"{\"abc\\", "bad escape '\\ '"},
    };
    int nbad = (int)(sizeof bad / sizeof bad[0]);
    unsigned char zeros[16] = {0};
    const char *p = tpath("bad.safetensors");
    int all_ok = 1;
    for (int i = 0; i < nbad; i++) {
        put_file(p, bad[i].hdr, zeros, 16);
        mg_st_file *f = NULL;
        mg_status s = mg_st_open(p, &f);
        if (s != MG_ERR_IO || f != NULL || !has(mg_last_error(), p) || !has(mg_last_error(), bad[i].msg)) {
            tap_diag("bad header %d (%s): %s: %s", i, bad[i].hdr, mg_status_name(s), mg_last_error());
            all_ok = 0;
            mg_st_close(f);
        }
    }
    tap_ok(all_ok, "%d hostile headers: each MG_ERR_IO, the file named, the fault described", nbad);
    /* the header length itself without padding: a NUL inside, a header cut
     * short of its data */
    size_t n;
    unsigned char *b = make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, zeros, 8, &n);
    b[8 + 3] = 0;
    write_bytes(p, b, n);
    mg_st_file *f = NULL;
    tap_ok(mg_st_open(p, &f) == MG_ERR_IO && has(mg_last_error(), "control character"),
           "a NUL byte inside the header is an error (%s)", mg_last_error());
    free(b);
    /* nesting: arrays of arrays 1000 deep never recurse */
    char deep[2100];
    snprintf(deep, sizeof deep, "{\"a\":{\"dtype\":\"F32\",\"shape\":");
    size_t L = strlen(deep);
    for (int k = 0; k < 1000; k++)
        deep[L++] = '[';
    deep[L] = '\0';
    put_file(p, deep, zeros, 16);
    tap_ok(mg_st_open(p, &f) == MG_ERR_IO && has(mg_last_error(), "expected an integer"),
           "deep nesting is an error (%s)", mg_last_error());

    /* open errors */
    tap_ok(mg_st_open(tpath("does-not-exist"), &f) == MG_ERR_IO && f == NULL &&
           has(mg_last_error(), "does-not-exist") && has(mg_last_error(), "cannot open"),
           "a missing file: MG_ERR_IO (%s)", mg_last_error());
    tap_ok(mg_st_open(dir, &f) == MG_ERR_IO && has(mg_last_error(), "not a regular file"),
           "a directory: MG_ERR_IO (%s)", mg_last_error());
    write_bytes(p, "\x02\0\0\0\0\0\0", 7);
    tap_ok(mg_st_open(p, &f) == MG_ERR_IO && has(mg_last_error(), "too short"),
           "a 7-byte file: MG_ERR_IO (%s)", mg_last_error());
    put_file(p, "{}", NULL, 0);
    tap_ok(mg_st_open(p, &f) == MG_OK && mg_st_count(f) == 0, "an empty header {} is a valid file");
    mg_st_close(f);
    tap_ok(mg_st_open(NULL, &f) == MG_ERR_INVALID_ARG && mg_st_open(p, NULL) == MG_ERR_INVALID_ARG,
           "NULL arguments: MG_ERR_INVALID_ARG");
    mg_st_close(NULL);
}

/* ------------------------------------------------------------ read_f32 */

static void test_read_errors(void)
{
    float v[6] = {1, 2, 3, 4, 5, 6}, out[6];
    long s23[] = {2, 3}, s32[] = {3, 2}, s6[] = {6};
    const char *nm[] = {"w"};
    const long *sh[] = {s23};
    int nd[] = {2};
    const float *dp[] = {v};
    const char *p = tpath("r.safetensors");
    mg_st_write(p, 1, nm, sh, nd, dp, MG_ST_F32, NULL);
    mg_st_file *f = NULL;
    if (!tap_ok(mg_st_open(p, &f) == MG_OK, "read errors: a file")) {
        tap_skip(5, "no file");
        return;
    }
    mg_st_info in;
    tap_ok(mg_st_read_f32(f, "w", s32, 2, out) == MG_ERR_SIZE && has(mg_last_error(), p) &&
           has(mg_last_error(), "\"w\" has shape [2,3], expected [3,2]"),
           "read_f32: a wrong shape is MG_ERR_SIZE (%s)", mg_last_error());
    tap_ok(mg_st_read_f32(f, "w", s6, 1, out) == MG_ERR_SIZE && has(mg_last_error(), "expected [6]"),
           "read_f32: a wrong ndim is MG_ERR_SIZE (%s)", mg_last_error());
    tap_ok(mg_st_read_f32(f, "v", s23, 2, out) == MG_ERR_INVALID_ARG &&
           has(mg_last_error(), "no tensor \"v\""), "read_f32: a missing name (%s)", mg_last_error());
    tap_ok(mg_st_find(f, "nope", &in) == MG_ERR_INVALID_ARG && mg_st_get(f, 1, &in) == MG_ERR_INVALID_ARG &&
           has(mg_last_error(), "out of range"), "find / get: absent name, index out of range");
    const char *k, *val;
    tap_ok(mg_st_metadata_count(f) == 0 && mg_st_metadata_get(f, 0, &k, &val) == MG_ERR_INVALID_ARG,
           "no metadata: count 0, get out of range");
    mg_st_close(f);
}

/* ------------------------------------------------------------ load_table */

static void test_load_table(void)
{
    /* file: backbone.{emb [4,2], layers.0.w [3], layers.0.b [2]} + norm [2] */
    float emb[8], w[3] = {0.5f, -1.5f, 2.25f}, bb[2] = {7, 8}, norm[2] = {9, 10};
    for (int i = 0; i < 8; i++)
        emb[i] = (float)i * 0.25f;
    long s42[] = {4, 2}, s3[] = {3}, s2[] = {2}, s24[] = {2, 4}, s5[] = {5};
    const char *fn[] = {"backbone.emb", "backbone.layers.0.w", "backbone.layers.0.b", "norm"};
    const long *fsh[] = {s42, s3, s2, s2};
    int fnd[] = {2, 1, 1, 1};
    const float *fdp[] = {emb, w, bb, norm};
    const char *p = tpath("model.safetensors");
    mg_st_write(p, 4, fn, fsh, fnd, fdp, MG_ST_BF16, NULL);
    mg_st_file *f = NULL;
    if (!tap_ok(mg_st_open(p, &f) == MG_OK, "table: a file with prefixed names")) {
        tap_skip(9, "no file");
        return;
    }
    /* table, 64-float aligned offsets */
    const char *tn[] = {"emb", "layers.0.w", "layers.0.b", "norm"};
    const long *tsh[] = {s42, s3, s2, s2};
    int tnd[] = {2, 1, 1, 1};
    size_t toff[] = {0, 64, 128, 192};
    float blob[256];
    for (int i = 0; i < 256; i++)
        blob[i] = -99.0f;
    mg_status s = mg_st_load_table(f, tn, tsh, tnd, toff, 4, "backbone.", blob, 256);
    int vals = s == MG_OK;
    for (int i = 0; i < 8 && vals; i++) vals = blob[i] == emb[i];
    for (int i = 0; i < 3 && vals; i++) vals = blob[64 + i] == w[i];
    vals = vals && blob[128] == 7 && blob[129] == 8 && blob[192] == 9 && blob[193] == 10 &&
           blob[8] == -99.0f && blob[67] == -99.0f && blob[255] == -99.0f;
    tap_ok(vals, "table with prefix \"backbone.\": every tensor at its offset, gaps untouched (%s)",
           mg_last_error());

    /* the same table with the prefix in its names and no strip */
    const char *tn2[] = {"backbone.emb", "backbone.layers.0.w", "backbone.layers.0.b", "norm"};
    for (int i = 0; i < 256; i++)
        blob[i] = 0;
    s = mg_st_load_table(f, tn2, tsh, tnd, toff, 4, NULL, blob, 256);
    tap_ok(s == MG_OK && blob[65] == -1.5f && blob[193] == 10, "table without a prefix (%s)", mg_last_error());

    /* without the prefix: everything missing and unexpected, in one message */
    for (int i = 0; i < 256; i++)
        blob[i] = -99.0f;
    s = mg_st_load_table(f, tn, tsh, tnd, toff, 4, NULL, blob, 256);
    const char *m = mg_last_error();
    tap_ok(s == MG_ERR_SIZE && has(m, p) && has(m, "6 problems: 3 missing, 3 unexpected") &&
           has(m, "missing: emb, layers.0.w, layers.0.b") &&
           has(m, "unexpected: backbone.emb, backbone.layers.0.b, backbone.layers.0.w"),
           "table, prefix not stripped: missing and unexpected listed together (%s)", m);
    int untouched = 1;
    for (int i = 0; i < 256; i++)
        untouched &= blob[i] == -99.0f;
    tap_ok(untouched, "table: the blob is untouched on error");

    /* every kind of problem at once */
    const char *tn3[] = {"emb", "layers.0.w", "missing.one", "missing.two"};
    const long *tsh3[] = {s24, s5, s2, s2};
    int tnd3[] = {2, 1, 1, 1};
    s = mg_st_load_table(f, tn3, tsh3, tnd3, toff, 4, "backbone.", blob, 256);
    m = mg_last_error();
    tap_ok(s == MG_ERR_SIZE &&
           has(m, "6 problems: 2 missing, 2 unexpected, 2 wrong shape)") &&
           has(m, "missing: missing.one, missing.two") &&
           has(m, "unexpected: backbone.layers.0.b, norm") &&
           has(m, "wrong shape: backbone.emb is [4,2], expected [2,4], backbone.layers.0.w is [3], expected [5]"),
           "table: missing, unexpected and misshaped names in one message (%s)", m);

    /* an unsupported dtype and an ambiguous name (hand-built file) */
    mg_st_close(f);
    unsigned char d[24] = {0};
    put_file(tpath("mixed.safetensors"),
             "{\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
             "\"p.y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
             "\"p.z\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]}}", d, 24);
    f = NULL;
    mg_st_open(tpath("mixed.safetensors"), &f);
    const char *tn4[] = {"x", "y", "z"};
    long s1[] = {1};
    const long *tsh4[] = {s1, s1, s2};
    int tnd4[] = {1, 1, 1};
    s = f ? mg_st_load_table(f, tn4, tsh4, tnd4, toff, 3, "p.", blob, 256) : MG_ERR_IO;
    m = mg_last_error();
    tap_ok(s == MG_ERR_SIZE && has(m, "3 problems: 1 unsupported dtype, 2 ambiguous)") &&
           has(m, "unsupported dtype: x (I64)") && has(m, "ambiguous: y, p.y"),
           "table: an I64 tensor and a name present with and without the prefix (%s)", m);
    const char *tn5[] = {"z"};
    const long *tsh5[] = {s2};
    const char *tn6[] = {"z", "z"};
    const long *tsh6[] = {s2, s2};
    tap_ok(f && mg_st_load_table(f, tn5, tsh5, tnd4, toff, 1, "p.", blob, 1) == MG_ERR_SIZE &&
           has(mg_last_error(), "does not fit a blob of 1 floats") &&
           mg_st_load_table(f, tn6, tsh6, tnd4, toff, 2, "p.", blob, 256) == MG_ERR_INVALID_ARG &&
           has(mg_last_error(), "twice in the table") &&
           mg_st_load_table(f, NULL, tsh5, tnd4, toff, 1, NULL, blob, 256) == MG_ERR_INVALID_ARG,
           "table: a blob too small, a name twice in the table, NULL arguments");
    mg_st_close(f);
}

/* ------------------------------------------------------------ writer */

static int leftovers(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.") != NULL)
            n++;
    if (d)
        closedir(d);
    return n;
}

static void test_writer(void)
{
    float v[2] = {1, 2};
    long s2[] = {2}, sneg[] = {-1}, shuge[] = {LONG_MAX, LONG_MAX};
    const long *sh[] = {s2, s2};
    int nd[] = {1, 1};
    const float *dp[] = {v, v};
    const char *p = tpath("w.safetensors");
    const char *ok_names[] = {"a", "b"};
    mg_st_write(p, 2, ok_names, sh, nd, dp, MG_ST_F32, NULL);
    size_t n0 = 0, n1 = 0;
    unsigned char *before = read_bytes(p, &n0);

    const char *dup[] = {"a", "a"};
    const char *meta_name[] = {"__metadata__", "b"};
    const char *bad_utf8[] = {"a\xff", "b"};
    const long *negs[] = {s2, sneg};
    const long *huges[] = {s2, shuge};
    int nd2[] = {1, 2};
    const float *nulls[] = {v, NULL};
    struct { mg_status s; const char *msg; } r[9];
    r[0].s = mg_st_write(p, 2, dup, sh, nd, dp, MG_ST_F32, NULL); r[0].msg = "given twice";
    r[1].s = mg_st_write(p, 2, meta_name, sh, nd, dp, MG_ST_F32, NULL); r[1].msg = "__metadata__";
    r[2].s = mg_st_write(p, 2, bad_utf8, sh, nd, dp, MG_ST_F32, NULL); r[2].msg = "UTF-8";
    r[3].s = mg_st_write(p, 2, ok_names, negs, nd, dp, MG_ST_F32, NULL); r[3].msg = "negative";
    r[4].s = mg_st_write(p, 2, ok_names, huges, nd2, dp, MG_ST_F32, NULL); r[4].msg = "overflowing";
    r[5].s = mg_st_write(p, 2, ok_names, sh, nd, nulls, MG_ST_F32, NULL); r[5].msg = "data is NULL";
    r[6].s = mg_st_write(p, 2, ok_names, sh, nd, dp, MG_ST_I64, NULL); r[6].msg = "cannot write dtype I64";
    r[7].s = mg_st_write(p, 2, ok_names, sh, nd, dp, MG_ST_F32, "{\"a\":1}"); r[7].msg = "not a string";
    r[8].s = mg_st_write(p, 2, ok_names, sh, nd, dp, MG_ST_F32, "{\"a\":\"1\",\"a\":\"2\"}"); r[8].msg = "given twice";
    int all = 1;
    for (int i = 0; i < 9; i++)
        if (r[i].s != MG_ERR_INVALID_ARG) {
            tap_diag("writer case %d: %s", i, mg_status_name(r[i].s));
            all = 0;
        }
    tap_ok(all, "writer: duplicate, reserved and non-UTF-8 names, bad shapes, NULL data, "
                "dtype I64, bad metadata: MG_ERR_INVALID_ARG");
    tap_ok(mg_st_write(p, 2, ok_names, sh, nd, dp, MG_ST_F32, "{\"a\":\"1\"} x") == MG_ERR_INVALID_ARG &&
           has(mg_last_error(), "trailing characters") && has(mg_last_error(), "metadata"),
           "writer: metadata with trailing characters (%s)", mg_last_error());
    unsigned char *after = read_bytes(p, &n1);
    tap_ok(before && after && n0 == n1 && memcmp(before, after, n0) == 0 && leftovers() == 0,
           "writer: failed writes leave the old file as it was, no temporary files");
    free(before);
    free(after);
    tap_ok(mg_st_write(tpath("no/such/dir/x.safetensors"), 2, ok_names, sh, nd, dp, MG_ST_F32, NULL) ==
               MG_ERR_IO && has(mg_last_error(), "no/such/dir") && leftovers() == 0,
           "writer: an unwritable path is MG_ERR_IO (%s)", mg_last_error());
    /* overwrite, and names that need escaping */
    const char *odd[] = {"q\"uote\\back\nnl\ttab\x01" "ctl", "\xc3\xa9t\xc3\xa9/\xf0\x9f\x98\x80"};
    mg_st_file *f = NULL;
    mg_st_info in;
    mg_status s = mg_st_write(p, 2, odd, sh, nd, dp, MG_ST_F16, NULL);
    size_t n;
    unsigned char *b = read_bytes(p, &n);
    tap_ok(s == MG_OK && b && has((const char *)b + 8, "\"q\\\"uote\\\\back\\nnl\\ttab\\u0001ctl\"") &&
           mg_st_open(p, &f) == MG_OK && mg_st_find(f, odd[0], &in) == MG_OK &&
           mg_st_find(f, odd[1], &in) == MG_OK && in.dtype == MG_ST_F16 && leftovers() == 0,
           "writer: overwrites; names escaped as serde_json does, read back (%s)", mg_last_error());
    free(b);
    mg_st_close(f);
    /* no tensors at all */
    tap_ok(mg_st_write(p, 0, NULL, NULL, NULL, NULL, MG_ST_F32, "{}") == MG_OK &&
           (b = read_bytes(p, &n)) != NULL && n == 8 + 24 &&
           memcmp(b + 8, "{\"__metadata__\":{}}     ", 24) == 0,
           "writer: no tensors, empty metadata: {\"__metadata__\":{}} padded");
    free(b);
}

/* ------------------------------------------------------------ main */

static void cleanup(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlink(tpath(e->d_name));
    if (d)
        closedir(d);
    rmdir(dir);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mg_st_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        printf("Bail out! mkdtemp %s failed\n", dir);
        return 2;
    }
    test_conversions();
    test_roundtrip();
    test_reference_bytes();
    test_truncation_and_corruption();
    test_hostile_headers();
    test_read_errors();
    test_load_table();
    test_writer();
    cleanup();
    return tap_done();
}
