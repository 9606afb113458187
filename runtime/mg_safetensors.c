/* mg_safetensors.c: safetensors read (mmap + a strict JSON header parser,
 * every length checked against the mapping) and write (temporary file +
 * rename). The format and the checks: mg_safetensors.h. */
#include "mg_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ST_LITTLE_ENDIAN 1
#else
#define ST_LITTLE_ENDIAN 0
#endif

/* ------------------------------------------------------------ dtypes */

static const struct { const char *name; size_t size; } st_dtypes[MG_ST_DTYPE_COUNT] = {
    [MG_ST_F32] = {"F32", 4},         [MG_ST_BF16] = {"BF16", 2},
    [MG_ST_F16] = {"F16", 2},         [MG_ST_F64] = {"F64", 8},
    [MG_ST_BOOL] = {"BOOL", 1},       [MG_ST_U8] = {"U8", 1},
    [MG_ST_I8] = {"I8", 1},           [MG_ST_I16] = {"I16", 2},
    [MG_ST_U16] = {"U16", 2},         [MG_ST_I32] = {"I32", 4},
    [MG_ST_U32] = {"U32", 4},         [MG_ST_I64] = {"I64", 8},
    [MG_ST_U64] = {"U64", 8},         [MG_ST_F8_E4M3] = {"F8_E4M3", 1},
    [MG_ST_F8_E5M2] = {"F8_E5M2", 1}, [MG_ST_F8_E8M0] = {"F8_E8M0", 1},
    [MG_ST_C64] = {"C64", 8},
};

const char *mg_st_dtype_name(mg_st_dtype t)
{
    return (unsigned)t < MG_ST_DTYPE_COUNT ? st_dtypes[t].name : "?";
}

size_t mg_st_dtype_size(mg_st_dtype t)
{
    return (unsigned)t < MG_ST_DTYPE_COUNT ? st_dtypes[t].size : 0;
}

static int st_dtype_lookup(const char *s, mg_st_dtype *t)
{
    for (int i = 0; i < MG_ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *t = (mg_st_dtype)i;
            return 1;
        }
    return 0;
}

static int st_is_float(mg_st_dtype t)
{
    return t == MG_ST_F32 || t == MG_ST_BF16 || t == MG_ST_F16;
}

/* ------------------------------------------------------------ conversions */

float mg_st_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mg_st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0 && m == 0) {
        u = sign;
    } else if (e == 0) {              /* subnormal: normalize */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ff) << 13);
    } else if (e == 31) {             /* inf, NaN (payload kept) */
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t mg_st_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: quiet, sign kept */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t mg_st_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                          /* NaN: quiet, top payload kept */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u)                         /* >= 65520 (or inf): inf */
        return (uint16_t)(sign | 0x7c00);
    if (a >= 0x38800000u) {                       /* normal f16 */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u)                          /* below 2^-25: zero */
        return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                     /* 14..24: units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

/* ------------------------------------------------------------ strings */

typedef struct sb { char *p; size_t len, cap; int oom; } sb;

static void sb_put(sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sb *b, const char *s) { sb_put(b, s, strlen(s)); }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_printf(sb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_shape(sb *b, const long *shape, int ndim)
{
    sb_str(b, "[");
    for (int d = 0; d < ndim; d++)
        sb_printf(b, d ? ",%ld" : "%ld", shape[d]);
    sb_str(b, "]");
}

/* A JSON string as serde_json writes it. */
static void sb_json_str(sb *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    sb_str(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
        switch (*c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            if (*c < 0x20) {
                memcpy(esc + 1, "u00", 3);
                esc[4] = hex[*c >> 4];
                esc[5] = hex[*c & 15];
            } else {
                sb_put(b, (const char *)c, 1);
                continue;
            }
        }
        sb_str(b, esc);
    }
    sb_str(b, "\"");
}

/* Length of the UTF-8 sequence at s (n bytes left), 0 if invalid
 * (overlong, surrogate, above U+10FFFF, truncated). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    if (c < 0x80)
        return 1;
    if (c < 0xc2)
        return 0;
    len = c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
    if (len == 0 || n < len)
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) ||
        (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

static int utf8_valid(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (k == 0)
            return 0;
        i += k;
    }
    return 1;
}

/* ------------------------------------------------------------ file object */

typedef struct st_tensor {
    const char *name;
    mg_st_dtype dtype;
    int ndim;
    size_t dims_at;          /* index into dims while parsing */
    const long *shape;
    size_t numel, bytes;
    uint64_t begin, end;
} st_tensor;

typedef struct st_meta { const char *key, *value; } st_meta;

struct mg_st_file {
    char *path;
    void *map;
    size_t map_size;
    const unsigned char *data;
    size_t data_size;
    char *arena;             /* decoded strings */
    st_tensor *t;
    size_t n, cap;
    long *dims;
    size_t n_dims, cap_dims;
    const st_tensor **by_name;
    st_meta *meta;
    size_t n_meta, cap_meta;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* ------------------------------------------------------------ JSON */

typedef struct jp {
    const unsigned char *s;
    size_t n, i;
    const char *what;        /* "PATH: header" or "metadata" */
    mg_status code;          /* status of a syntax error */
    char *arena;
    size_t used;
} jp;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static mg_status jp_fail(const jp *p, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mg_fail(p->code, "%s byte %zu: %s", p->what, p->i, msg);
}

static int jp_peek(const jp *p) { return p->i < p->n ? p->s[p->i] : -1; }

static void jp_ws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static mg_status jp_expect(jp *p, char c)
{
    jp_ws(p);
    if (jp_peek(p) != c)
        return p->i < p->n ? jp_fail(p, "expected '%c'", c)
                           : jp_fail(p, "expected '%c', the header ends", c);
    p->i++;
    jp_ws(p);
    return MG_OK;
}

/* A JSON object or array: OPEN, then *more = whether an item follows
 * (else CLOSE came at once and is consumed). */
static mg_status jp_open(jp *p, char open, char close, int *more)
{
    mg_status s = jp_expect(p, open);
    if (s != MG_OK)
        return s;
    *more = jp_peek(p) != close;
    if (!*more)
        p->i++;
    return MG_OK;
}

/* After an item of a container that CLOSE ends: ',' (*more = 1) or CLOSE
 * (*more = 0); anything else fails with MSG, or "expected 'CLOSE'" when
 * MSG is NULL. */
static mg_status jp_next(jp *p, char close, const char *msg, int *more)
{
    jp_ws(p);
    *more = jp_peek(p) == ',';
    if (*more) {
        p->i++;
        jp_ws(p);
        return MG_OK;
    }
    if (msg && jp_peek(p) != close)
        return jp_fail(p, "%s", msg);
    return jp_expect(p, close);
}

static int jp_hex4(const jp *p, size_t at, unsigned *v)
{
    if (at + 4 > p->n)
        return 0;
    *v = 0;
    for (size_t k = 0; k < 4; k++) {
        int c = p->s[at + k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* A string, decoded into the arena (never longer than its JSON form, so an
 * arena as long as the input holds every string with its NUL). */
static mg_status jp_string(jp *p, const char **out)
{
    if (jp_peek(p) != '"')
        return p->i < p->n ? jp_fail(p, "expected a string")
                           : jp_fail(p, "expected a string, the header ends");
    p->i++;
    char *start = p->arena + p->used, *o = start;
    for (;;) {
        if (p->i >= p->n)
            return jp_fail(p, "unterminated string");
        unsigned c = p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20)
            return jp_fail(p, "control character 0x%02x in a string", c);
        if (c != '\\') {
            size_t k = utf8_seq(p->s + p->i, p->n - p->i);
            if (k == 0)
                return jp_fail(p, "invalid UTF-8 in a string");
            memcpy(o, p->s + p->i, k);
            o += k;
            p->i += k;
            continue;
        }
        if (p->i + 1 >= p->n)
            return jp_fail(p, "unterminated string");
        unsigned e = p->s[p->i + 1], cp;
        switch (e) {
        case '"': case '\\': case '/': *o++ = (char)e; p->i += 2; continue;
        case 'b': *o++ = '\b'; p->i += 2; continue;
        case 'f': *o++ = '\f'; p->i += 2; continue;
        case 'n': *o++ = '\n'; p->i += 2; continue;
        case 'r': *o++ = '\r'; p->i += 2; continue;
        case 't': *o++ = '\t'; p->i += 2; continue;
        case 'u': break;
        default: return jp_fail(p, "bad escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? (int)e : '?');
        }
        if (!jp_hex4(p, p->i + 2, &cp))
            return jp_fail(p, "bad \\u escape (four hex digits expected)");
        p->i += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff)
            return jp_fail(p, "unpaired low surrogate \\u%04x", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
            unsigned lo;
            if (p->i + 1 >= p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                !jp_hex4(p, p->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                return jp_fail(p, "unpaired high surrogate \\u%04x", cp);
            p->i += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0)
            return jp_fail(p, "NUL character (\\u0000) in a string");
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else if (cp < 0x800) {
            *o++ = (char)(0xc0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            *o++ = (char)(0xe0 | (cp >> 12));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *o++ = (char)(0x80 | (cp & 0x3f));
        } else {
            *o++ = (char)(0xf0 | (cp >> 18));
            *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    *o++ = '\0';
    p->used = (size_t)(o - p->arena);
    *out = start;
    return MG_OK;
}

/* A non-negative integer that fits in 64 bits (JSON syntax: no leading
 * zeros, no sign, fraction or exponent). */
static mg_status jp_u64(jp *p, uint64_t *v)
{
    int c = jp_peek(p);
    if (c == '-')
        return jp_fail(p, "negative number");
    if (c < '0' || c > '9')
        return p->i < p->n ? jp_fail(p, "expected an integer")
                           : jp_fail(p, "expected an integer, the header ends");
    if (c == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return jp_fail(p, "number with a leading zero");
    *v = 0;
    while ((c = jp_peek(p)) >= '0' && c <= '9') {
        unsigned d = (unsigned)(c - '0');
        if (*v > (UINT64_MAX - d) / 10)
            return jp_fail(p, "integer does not fit in 64 bits");
        *v = *v * 10 + d;
        p->i++;
    }
    if (c == '.' || c == 'e' || c == 'E')
        return jp_fail(p, "number is not an integer");
    return MG_OK;
}

/* {"key": "value", ...}: the metadata object. */
static mg_status jp_meta(jp *p, st_meta **meta, size_t *n, size_t *cap)
{
    mg_status s;
    int more;
    if ((s = jp_open(p, '{', '}', &more)) != MG_OK)
        return s;
    while (more) {
        const char *k, *v;
        if ((s = jp_string(p, &k)) != MG_OK || (s = jp_expect(p, ':')) != MG_OK)
            return s;
        if (jp_peek(p) != '"')
            return jp_fail(p, "metadata value of \"%.128s\" is not a string", k);
        if ((s = jp_string(p, &v)) != MG_OK)
            return s;
        if (!grow((void **)meta, cap, *n + 1, sizeof **meta))
            return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
        (*meta)[*n].key = k;
        (*meta)[*n].value = v;
        ++*n;
        if ((s = jp_next(p, '}', "expected ',' or '}' in the metadata", &more)) != MG_OK)
            return s;
    }
    return MG_OK;
}

/* {"dtype": .., "shape": [..], "data_offsets": [b, e]}. */
static mg_status jp_tensor(jp *p, mg_st_file *f, st_tensor *t)
{
    mg_status s;
    int have_dtype = 0, have_shape = 0, have_offsets = 0, more;
    if ((s = jp_open(p, '{', '}', &more)) != MG_OK)
        return s;
    while (more) {
        const char *k;
        if ((s = jp_string(p, &k)) != MG_OK || (s = jp_expect(p, ':')) != MG_OK)
            return s;
        if (strcmp(k, "dtype") == 0) {
            const char *d;
            if (have_dtype++)
                return jp_fail(p, "tensor \"%.128s\": duplicate key \"dtype\"", t->name);
            if ((s = jp_string(p, &d)) != MG_OK)
                return s;
            if (!st_dtype_lookup(d, &t->dtype))
                return jp_fail(p, "tensor \"%.128s\": unknown dtype \"%.32s\"", t->name, d);
        } else if (strcmp(k, "shape") == 0) {
            if (have_shape++)
                return jp_fail(p, "tensor \"%.128s\": duplicate key \"shape\"", t->name);
            int dim;
            if ((s = jp_open(p, '[', ']', &dim)) != MG_OK)
                return s;
            t->dims_at = f->n_dims;
            t->ndim = 0;
            while (dim) {
                uint64_t v;
                if ((s = jp_u64(p, &v)) != MG_OK)
                    return s;
                if (v > (uint64_t)LONG_MAX)
                    return jp_fail(p, "tensor \"%.128s\": dimension %llu too large",
                                   t->name, (unsigned long long)v);
                if (t->ndim == MG_ST_MAX_NDIM)
                    return jp_fail(p, "tensor \"%.128s\": more than %d dimensions",
                                   t->name, MG_ST_MAX_NDIM);
                if (!grow((void **)&f->dims, &f->cap_dims, f->n_dims + 1, sizeof(long)))
                    return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
                f->dims[f->n_dims++] = (long)v;
                t->ndim++;
                if ((s = jp_next(p, ']', NULL, &dim)) != MG_OK)
                    return s;
            }
        } else if (strcmp(k, "data_offsets") == 0) {
            if (have_offsets++)
                return jp_fail(p, "tensor \"%.128s\": duplicate key \"data_offsets\"", t->name);
            if ((s = jp_expect(p, '[')) != MG_OK || (s = jp_u64(p, &t->begin)) != MG_OK ||
                (s = jp_expect(p, ',')) != MG_OK || (s = jp_u64(p, &t->end)) != MG_OK ||
                (s = jp_expect(p, ']')) != MG_OK)
                return s;
        } else {
            return jp_fail(p, "tensor \"%.128s\": unknown key \"%.64s\"", t->name, k);
        }
        if ((s = jp_next(p, '}', NULL, &more)) != MG_OK)
            return s;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return jp_fail(p, "tensor \"%.128s\": no \"%s\"", t->name,
                       !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return MG_OK;
}

static mg_status jp_header(jp *p, mg_st_file *f)
{
    mg_status s;
    int have_meta = 0;
    jp_ws(p);
    if (jp_peek(p) != '{')
        return jp_fail(p, "the header is not a JSON object");
    int more;
    if ((s = jp_open(p, '{', '}', &more)) != MG_OK)
        return s;
    while (more) {
        const char *k;
        if ((s = jp_string(p, &k)) != MG_OK || (s = jp_expect(p, ':')) != MG_OK)
            return s;
        if (strcmp(k, "__metadata__") == 0) {
            if (have_meta++)
                return jp_fail(p, "duplicate key \"__metadata__\"");
            if ((s = jp_meta(p, &f->meta, &f->n_meta, &f->cap_meta)) != MG_OK)
                return s;
        } else {
            if (!grow((void **)&f->t, &f->cap, f->n + 1, sizeof *f->t))
                return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
            st_tensor *t = &f->t[f->n++];
            memset(t, 0, sizeof *t);
            t->name = k;
            if ((s = jp_tensor(p, f, t)) != MG_OK)
                return s;
        }
        if ((s = jp_next(p, '}', NULL, &more)) != MG_OK)
            return s;
    }
    jp_ws(p);
    if (p->i != p->n)
        return jp_fail(p, "trailing characters after the header object");
    return MG_OK;
}

/* ------------------------------------------------------------ open */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int cmp_tensor_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

/* Sizes, offsets, duplicate names and overlaps, once the header parsed. */
static mg_status st_check(mg_st_file *f)
{
    const char *path = f->path;
    for (size_t i = 0; i < f->n; i++) {
        st_tensor *t = &f->t[i];
        t->shape = f->dims + t->dims_at;
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            size_t v = (size_t)t->shape[d];
            if ((uint64_t)t->shape[d] > SIZE_MAX || (v != 0 && numel > SIZE_MAX / v))
                return mg_fail(MG_ERR_IO, "%s: tensor \"%.128s\": shape overflows", path, t->name);
            numel *= v;
        }
        size_t es = st_dtypes[t->dtype].size;
        if (numel > SIZE_MAX / es)
            return mg_fail(MG_ERR_IO, "%s: tensor \"%.128s\": byte size overflows", path, t->name);
        t->numel = numel;
        t->bytes = numel * es;
        if (t->begin > t->end)
            return mg_fail(MG_ERR_IO, "%s: tensor \"%.128s\": data_offsets [%llu, %llu] decrease",
                           path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->end > f->data_size)
            return mg_fail(MG_ERR_IO,
                           "%s: tensor \"%.128s\": data_offsets [%llu, %llu] past the data buffer "
                           "(%zu bytes)", path, t->name, (unsigned long long)t->begin,
                           (unsigned long long)t->end, f->data_size);
        if (t->end - t->begin != t->bytes)
            return mg_fail(MG_ERR_IO,
                           "%s: tensor \"%.128s\": data_offsets [%llu, %llu] hold %llu bytes, "
                           "its %s shape needs %zu", path, t->name, (unsigned long long)t->begin,
                           (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                           st_dtypes[t->dtype].name, t->bytes);
    }
    f->by_name = malloc((f->n ? f->n : 1) * sizeof *f->by_name);
    const st_tensor **by_begin = malloc((f->n ? f->n : 1) * sizeof *by_begin);
    if (f->by_name == NULL || by_begin == NULL) {
        free(by_begin);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    for (size_t i = 0; i < f->n; i++)
        f->by_name[i] = by_begin[i] = &f->t[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, cmp_tensor_name);
    qsort(by_begin, f->n, sizeof *by_begin, cmp_tensor_begin);
    mg_status s = MG_OK;
    for (size_t i = 1; i < f->n && s == MG_OK; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            s = mg_fail(MG_ERR_IO, "%s: tensor \"%.128s\" appears twice", path, f->by_name[i]->name);
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n && s == MG_OK; i++) {
        const st_tensor *t = by_begin[i];
        if (t->bytes == 0)
            continue;
        if (prev != NULL && t->begin < prev->end)
            s = mg_fail(MG_ERR_IO, "%s: tensors \"%.128s\" and \"%.128s\" overlap in the data buffer",
                        path, prev->name, t->name);
        if (prev == NULL || t->end > prev->end)
            prev = t;
    }
    free(by_begin);
    if (s != MG_OK)
        return s;
    if (f->n_meta > 0)
        qsort(f->meta, f->n_meta, sizeof *f->meta, cmp_meta_key);
    for (size_t i = 1; i < f->n_meta; i++)
        if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0)
            return mg_fail(MG_ERR_IO, "%s: metadata key \"%.128s\" appears twice", path, f->meta[i].key);
    return MG_OK;
}

mg_status mg_st_open(const char *path, mg_st_file **out)
{
    if (out == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_open: out is NULL");
    *out = NULL;
    if (path == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_open: path is NULL");
    mg_st_file *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    mg_status s = MG_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        s = mg_fail(MG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    } else if (fstat(fd, &st) != 0) {
        s = mg_fail(MG_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s = mg_fail(MG_ERR_IO, "%s: not a regular file", path);
    } else if ((uintmax_t)st.st_size > SIZE_MAX) {
        s = mg_fail(MG_ERR_IO, "%s: too large to map", path);
    } else if (st.st_size < 8) {
        s = mg_fail(MG_ERR_IO, "%s: %lld bytes, too short for a safetensors file (8-byte header "
                    "length first)", path, (long long)st.st_size);
    } else {
        f->map_size = (size_t)st.st_size;
        f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            s = mg_fail(MG_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        }
    }
    if (fd >= 0)
        close(fd);
    if (s != MG_OK) {
        mg_st_close(f);
        return s;
    }
    const unsigned char *m = f->map;
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | m[k];
    if (hlen > MG_ST_MAX_HEADER)
        s = mg_fail(MG_ERR_IO, "%s: header length %llu exceeds the limit of %u bytes", path,
                    (unsigned long long)hlen, MG_ST_MAX_HEADER);
    else if (hlen > f->map_size - 8)
        s = mg_fail(MG_ERR_IO, "%s: header length %llu past the end of the file (%zu bytes)", path,
                    (unsigned long long)hlen, f->map_size);
    else if ((f->arena = malloc((size_t)hlen + 1)) == NULL)
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory for a header of %llu bytes", path,
                    (unsigned long long)hlen);
    if (s == MG_OK) {
        char what[1024];
        snprintf(what, sizeof what, "%s: header", path);
        jp p = {m + 8, (size_t)hlen, 0, what, MG_ERR_IO, f->arena, 0};
        f->data = m + 8 + hlen;
        f->data_size = f->map_size - 8 - (size_t)hlen;
        s = jp_header(&p, f);
        if (s == MG_OK)
            s = st_check(f);
    }
    if (s != MG_OK) {
        mg_st_close(f);
        return s;
    }
    *out = f;
    return MG_OK;
}

void mg_st_close(mg_st_file *f)
{
    if (f == NULL)
        return;
    if (f->map != NULL)
        munmap(f->map, f->map_size);
    free(f->path);
    free(f->arena);
    free(f->t);
    free(f->dims);
    free(f->by_name);
    free(f->meta);
    free(f);
}

size_t mg_st_count(const mg_st_file *f) { return f ? f->n : 0; }

static void st_info(const mg_st_file *f, const st_tensor *t, mg_st_info *info)
{
    info->name = t->name;
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    info->shape = t->shape;
    info->numel = t->numel;
    info->data = f->data + t->begin;
    info->bytes = t->bytes;
}

mg_status mg_st_get(const mg_st_file *f, size_t i, mg_st_info *info)
{
    if (f == NULL || info == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_get: %s is NULL", f ? "info" : "file");
    if (i >= f->n)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: tensor index %zu out of range (%zu tensors)",
                       f->path, i, f->n);
    st_info(f, &f->t[i], info);
    return MG_OK;
}

static const st_tensor *st_lookup(const mg_st_file *f, const char *name)
{
    st_tensor key = {.name = name};
    const st_tensor *kp = &key;
    const st_tensor **r = bsearch(&kp, f->by_name, f->n, sizeof *f->by_name, cmp_tensor_name);
    return r ? *r : NULL;
}

mg_status mg_st_find(const mg_st_file *f, const char *name, mg_st_info *info)
{
    if (f == NULL || name == NULL || info == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_find: %s is NULL",
                       !f ? "file" : !name ? "name" : "info");
    const st_tensor *t = st_lookup(f, name);
    if (t == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: no tensor \"%.256s\"", f->path, name);
    st_info(f, t, info);
    return MG_OK;
}

size_t mg_st_metadata_count(const mg_st_file *f) { return f ? f->n_meta : 0; }

mg_status mg_st_metadata_get(const mg_st_file *f, size_t i, const char **key, const char **value)
{
    if (f == NULL || key == NULL || value == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_metadata_get: a NULL argument");
    if (i >= f->n_meta)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: metadata index %zu out of range (%zu entries)",
                       f->path, i, f->n_meta);
    *key = f->meta[i].key;
    *value = f->meta[i].value;
    return MG_OK;
}

const char *mg_st_metadata(const mg_st_file *f, const char *key)
{
    if (f == NULL || key == NULL || f->n_meta == 0)
        return NULL;
    st_meta k = {key, NULL};
    const st_meta *r = bsearch(&k, f->meta, f->n_meta, sizeof *f->meta, cmp_meta_key);
    return r ? r->value : NULL;
}

/* ------------------------------------------------------------ to f32 */

static void st_to_f32(const mg_st_file *f, const st_tensor *t, float *dst)
{
    const unsigned char *src = f->data + t->begin;
    size_t n = t->numel;
    if (t->dtype == MG_ST_F32) {
#if ST_LITTLE_ENDIAN
        memcpy(dst, src, n * 4);
#else
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                         (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
            memcpy(dst + i, &u, 4);
        }
#endif
    } else if (t->dtype == MG_ST_BF16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = mg_st_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = mg_st_f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    }
}

static int shape_eq(const st_tensor *t, const long *shape, int ndim)
{
    if (t->ndim != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return 0;
    return 1;
}

mg_status mg_st_read_f32(const mg_st_file *f, const char *name, const long *shape, int ndim,
                         float *dst)
{
    if (f == NULL || name == NULL || dst == NULL || (shape == NULL && ndim > 0) || ndim < 0)
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_read_f32: a NULL pointer or a negative ndim");
    const st_tensor *t = st_lookup(f, name);
    if (t == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: no tensor \"%.256s\"", f->path, name);
    if (!st_is_float(t->dtype))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: tensor \"%.256s\" is %s, not F32, BF16 or F16",
                       f->path, name, st_dtypes[t->dtype].name);
    if (!shape_eq(t, shape, ndim)) {
        sb a = {0}, b = {0};
        sb_shape(&a, t->shape, t->ndim);
        sb_shape(&b, shape, ndim);
        mg_status s = mg_fail(MG_ERR_SIZE, "%s: tensor \"%.256s\" has shape %s, expected %s", f->path,
                              name, a.p ? a.p : "?", b.p ? b.p : "?");
        free(a.p);
        free(b.p);
        return s;
    }
    st_to_f32(f, t, dst);
    return MG_OK;
}

/* ------------------------------------------------------------ table */

typedef struct st_name { const char *name; size_t idx; } st_name;

static int cmp_st_name(const void *a, const void *b)
{
    int c = strcmp(((const st_name *)a)->name, ((const st_name *)b)->name);
    if (c != 0)
        return c;
    size_t x = ((const st_name *)a)->idx, y = ((const st_name *)b)->idx;
    return x < y ? -1 : x > y;
}

/* One problem category of load_table's message. */
typedef struct st_cat { const char *what; size_t count; sb list; } st_cat;

static void cat_add(st_cat *c, const char *name)
{
    sb_str(&c->list, c->count++ ? ", " : "");
    sb_str(&c->list, name);
}

mg_status mg_st_load_table(const mg_st_file *f, const char *const *names,
                           const long *const *shapes, const int *ndims, const size_t *offsets,
                           size_t n, const char *strip_prefix, float *blob, size_t blob_floats)
{
    if (f == NULL || (n > 0 && (names == NULL || shapes == NULL || ndims == NULL ||
                                offsets == NULL || blob == NULL)))
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_load_table: a NULL argument");
    const char *path = f->path;
    /* the table itself */
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL || ndims[i] < 0 || ndims[i] > MG_ST_MAX_NDIM ||
            (ndims[i] > 0 && shapes[i] == NULL))
            return mg_fail(MG_ERR_INVALID_ARG, "mg_st_load_table: table entry %zu: NULL name or "
                           "shape, or ndim %d out of range", i, ndims[i]);
        size_t numel = 1;
        for (int d = 0; d < ndims[i]; d++) {
            if (shapes[i][d] < 0 || (shapes[i][d] != 0 && numel > SIZE_MAX / (size_t)shapes[i][d]))
                return mg_fail(MG_ERR_INVALID_ARG, "mg_st_load_table: \"%.256s\": bad shape", names[i]);
            numel *= (size_t)shapes[i][d];
        }
        if (offsets[i] > blob_floats || numel > blob_floats - offsets[i])
            return mg_fail(MG_ERR_SIZE, "mg_st_load_table: \"%.256s\" (%zu floats at offset %zu) "
                           "does not fit a blob of %zu floats", names[i], numel, offsets[i],
                           blob_floats);
    }
    size_t plen = strip_prefix ? strlen(strip_prefix) : 0;
    st_name *tab = malloc((n ? n : 1) * sizeof *tab);
    st_name *fil = malloc((f->n ? f->n : 1) * sizeof *fil);
    const st_tensor **match = calloc(n ? n : 1, sizeof *match);
    char *used = calloc(f->n ? f->n : 1, 1);
    mg_status s = MG_OK;
    st_cat cats[5] = {{"missing", 0, {0}}, {"unexpected", 0, {0}}, {"wrong shape", 0, {0}},
                      {"unsupported dtype", 0, {0}}, {"ambiguous", 0, {0}}};
    if (tab == NULL || fil == NULL || match == NULL || used == NULL) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        tab[i] = (st_name){names[i], i};
    qsort(tab, n, sizeof *tab, cmp_st_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(tab[i - 1].name, tab[i].name) == 0) {
            s = mg_fail(MG_ERR_INVALID_ARG, "mg_st_load_table: \"%.256s\" twice in the table",
                        tab[i].name);
            goto done;
        }
    for (size_t i = 0; i < f->n; i++) {
        const char *nm = f->t[i].name;
        if (plen > 0 && strncmp(nm, strip_prefix, plen) == 0)
            nm += plen;
        fil[i] = (st_name){nm, i};
    }
    qsort(fil, f->n, sizeof *fil, cmp_st_name);
    for (size_t i = 0; i < f->n;) {           /* names equal once stripped */
        size_t j = i + 1;
        while (j < f->n && strcmp(fil[i].name, fil[j].name) == 0)
            j++;
        if (j - i > 1)
            for (size_t k = i; k < j; k++) {
                cat_add(&cats[4], f->t[fil[k].idx].name);
                used[fil[k].idx] = 1;
            }
        i = j;
    }
    for (size_t i = 0; i < n; i++) {
        size_t lo = 0, hi = f->n;             /* first file name >= names[i] */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(fil[mid].name, names[i]) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == f->n || strcmp(fil[lo].name, names[i]) != 0) {
            cat_add(&cats[0], names[i]);
            continue;
        }
        if (lo + 1 < f->n && strcmp(fil[lo + 1].name, names[i]) == 0)
            continue;                         /* ambiguous: listed already */
        const st_name *r = &fil[lo];
        const st_tensor *t = &f->t[r->idx];
        used[r->idx] = 1;
        match[i] = t;
        if (!st_is_float(t->dtype)) {
            sb_printf(&cats[3].list, "%s", cats[3].count++ ? ", " : "");
            sb_printf(&cats[3].list, "%.256s (%s)", t->name, st_dtypes[t->dtype].name);
        } else if (!shape_eq(t, shapes[i], ndims[i])) {
            sb_printf(&cats[2].list, "%s", cats[2].count++ ? ", " : "");
            sb_printf(&cats[2].list, "%.256s is ", t->name);
            sb_shape(&cats[2].list, t->shape, t->ndim);
            sb_str(&cats[2].list, ", expected ");
            sb_shape(&cats[2].list, shapes[i], ndims[i]);
        }
    }
    for (size_t i = 0; i < f->n; i++)
        if (!used[i])
            cat_add(&cats[1], f->t[i].name);
    size_t total = 0;
    int oom = 0;
    for (int c = 0; c < 5; c++) {
        total += cats[c].count;
        oom |= cats[c].list.oom;
    }
    if (oom) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    if (total > 0) {
        sb msg = {0};
        sb_printf(&msg, "does not match the parameter table (%zu problem%s:", total,
                  total == 1 ? "" : "s");
        int first = 1;
        for (int c = 0; c < 5; c++)
            if (cats[c].count) {
                sb_printf(&msg, "%s %zu %s", first ? "" : ",", cats[c].count, cats[c].what);
                first = 0;
            }
        sb_str(&msg, ")");
        for (int c = 0; c < 5; c++)
            if (cats[c].count) {
                sb_printf(&msg, "; %s: ", cats[c].what);
                sb_str(&msg, cats[c].list.p);
            }
        s = mg_fail(MG_ERR_SIZE, "%s: %s", path, msg.oom ? "does not match the parameter table" : msg.p);
        free(msg.p);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        st_to_f32(f, match[i], blob + offsets[i]);
done:
    for (int c = 0; c < 5; c++)
        free(cats[c].list.p);
    free(tab);
    free(fil);
    free(match);
    free(used);
    return s;
}

/* ------------------------------------------------------------ write */

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return 0;
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

mg_status mg_st_write(const char *path, size_t n, const char *const *names,
                      const long *const *shapes, const int *ndims, const float *const *data,
                      mg_st_dtype dtype, const char *metadata_json)
{
    if (path == NULL || (n > 0 && (names == NULL || shapes == NULL || ndims == NULL || data == NULL)))
        return mg_fail(MG_ERR_INVALID_ARG, "mg_st_write: a NULL argument");
    if (!st_is_float(dtype))
        return mg_fail(MG_ERR_INVALID_ARG, "%s: cannot write dtype %s (F32, BF16 or F16)", path,
                       mg_st_dtype_name(dtype));
    mg_status s = MG_OK;
    size_t es = st_dtypes[dtype].size;
    const char *const **order = malloc((n ? n : 1) * sizeof *order);
    size_t *numel = malloc((n ? n : 1) * sizeof *numel);
    st_meta *meta = NULL;
    size_t n_meta = 0, cap_meta = 0;
    char *marena = NULL, *tmp = NULL;
    unsigned char *cbuf = NULL;
    sb h = {0};
    int fd = -1;
    if (order == NULL || numel == NULL) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL || !utf8_valid(names[i]) || strcmp(names[i], "__metadata__") == 0) {
            s = mg_fail(MG_ERR_INVALID_ARG, "%s: tensor %zu: name %s", path, i,
                        names[i] == NULL ? "is NULL" : "is not valid UTF-8 or is \"__metadata__\"");
            goto done;
        }
        if (ndims[i] < 0 || ndims[i] > MG_ST_MAX_NDIM || (ndims[i] > 0 && shapes[i] == NULL)) {
            s = mg_fail(MG_ERR_INVALID_ARG, "%s: tensor \"%.256s\": ndim %d out of range or NULL "
                        "shape", path, names[i], ndims[i]);
            goto done;
        }
        numel[i] = 1;
        for (int d = 0; d < ndims[i]; d++) {
            long v = shapes[i][d];
            if (v < 0 || (v != 0 && numel[i] > SIZE_MAX / es / (size_t)v)) {
                s = mg_fail(MG_ERR_INVALID_ARG, "%s: tensor \"%.256s\": negative or overflowing "
                            "shape", path, names[i]);
                goto done;
            }
            numel[i] *= (size_t)v;
        }
        if (numel[i] > 0 && data[i] == NULL) {
            s = mg_fail(MG_ERR_INVALID_ARG, "%s: tensor \"%.256s\": data is NULL", path, names[i]);
            goto done;
        }
        order[i] = &names[i];
    }
    qsort(order, n, sizeof *order, cmp_name_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(*order[i - 1], *order[i]) == 0) {
            s = mg_fail(MG_ERR_INVALID_ARG, "%s: tensor \"%.256s\" given twice", path, *order[i]);
            goto done;
        }
    if (metadata_json != NULL) {
        size_t ml = strlen(metadata_json);
        if ((marena = malloc(ml + 1)) == NULL) {
            s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
        char what[1024];
        snprintf(what, sizeof what, "%s: metadata", path);
        jp p = {(const unsigned char *)metadata_json, ml, 0, what, MG_ERR_INVALID_ARG, marena, 0};
        if ((s = jp_meta(&p, &meta, &n_meta, &cap_meta)) != MG_OK)
            goto done;
        jp_ws(&p);
        if (p.i != p.n) {
            s = jp_fail(&p, "trailing characters after the metadata object");
            goto done;
        }
        st_meta *sorted = malloc((n_meta ? n_meta : 1) * sizeof *sorted);
        if (sorted == NULL) {
            s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
        if (n_meta > 0)
            memcpy(sorted, meta, n_meta * sizeof *meta);
        qsort(sorted, n_meta, sizeof *sorted, cmp_meta_key);
        for (size_t i = 1; i < n_meta && s == MG_OK; i++)
            if (strcmp(sorted[i - 1].key, sorted[i].key) == 0)
                s = mg_fail(MG_ERR_INVALID_ARG, "%s: metadata key \"%.256s\" given twice", path,
                            sorted[i].key);
        free(sorted);
        if (s != MG_OK)
            goto done;
    }
    /* the header, as the reference writes it */
    sb_str(&h, "{");
    if (metadata_json != NULL) {
        sb_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            sb_str(&h, i ? "," : "");
            sb_json_str(&h, meta[i].key);
            sb_str(&h, ":");
            sb_json_str(&h, meta[i].value);
        }
        sb_str(&h, n > 0 ? "}," : "}");
    }
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)(order[k] - names);
        sb_str(&h, k ? "," : "");
        sb_json_str(&h, names[i]);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":", st_dtypes[dtype].name);
        sb_shape(&h, shapes[i], ndims[i]);
        uint64_t bytes = (uint64_t)numel[i] * es;
        if (off + bytes < off) {
            s = mg_fail(MG_ERR_INVALID_ARG, "%s: the data overflows 64 bits", path);
            goto done;
        }
        sb_printf(&h, ",\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_str(&h, "}");
    while (!h.oom && h.len % 8 != 0)
        sb_str(&h, " ");
    if (h.oom) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
        goto done;
    }
    if (h.len > MG_ST_MAX_HEADER) {
        s = mg_fail(MG_ERR_INVALID_ARG, "%s: header of %zu bytes exceeds the limit of %u", path,
                    h.len, MG_ST_MAX_HEADER);
        goto done;
    }
    /* a temporary file beside path, renamed over it */
    static atomic_uint counter;
    size_t plen = strlen(path);
    if ((tmp = malloc(plen + 64)) == NULL) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (int tries = 0; fd < 0; tries++) {
        snprintf(tmp, plen + 64, "%s.tmp.%ld.%u", path, (long)getpid(),
                 atomic_fetch_add(&counter, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || tries > 100)) {
            s = mg_fail(MG_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto done;
        }
    }
    enum { CHUNK = 16384 };
    unsigned char hl[8];
    for (int k = 0; k < 8; k++)
        hl[k] = (unsigned char)((uint64_t)h.len >> (8 * k));
    int ok = write_all(fd, hl, 8) && write_all(fd, h.p, h.len);
    if (ok && (cbuf = malloc(CHUNK * 4)) == NULL) {
        s = mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (size_t k = 0; k < n && ok; k++) {
        size_t i = (size_t)(order[k] - names);
        for (size_t at = 0; at < numel[i] && ok; at += CHUNK) {
            size_t m = numel[i] - at < CHUNK ? numel[i] - at : CHUNK;
            const float *x = data[i] + at;
            for (size_t j = 0; j < m; j++) {
                uint32_t u;
                if (dtype == MG_ST_F32) {
                    memcpy(&u, &x[j], 4);
                    cbuf[4 * j] = (unsigned char)u;
                    cbuf[4 * j + 1] = (unsigned char)(u >> 8);
                    cbuf[4 * j + 2] = (unsigned char)(u >> 16);
                    cbuf[4 * j + 3] = (unsigned char)(u >> 24);
                } else {
                    u = dtype == MG_ST_BF16 ? mg_st_f32_to_bf16(x[j]) : mg_st_f32_to_f16(x[j]);
                    cbuf[2 * j] = (unsigned char)u;
                    cbuf[2 * j + 1] = (unsigned char)(u >> 8);
                }
            }
            ok = write_all(fd, cbuf, m * es);
        }
    }
    if (!ok || fsync(fd) != 0) {
        s = mg_fail(MG_ERR_IO, "%s: cannot write %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        s = mg_fail(MG_ERR_IO, "%s: cannot write %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        s = mg_fail(MG_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL;
    {   /* the rename on disk too, best effort */
        char *dir = strdup(path);
        if (dir != NULL) {
            char *slash = strrchr(dir, '/');
            const char *d = slash == NULL ? "." : slash == dir ? "/" : (*slash = '\0', dir);
            int dfd = open(d, O_RDONLY | O_CLOEXEC);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
            free(dir);
        }
    }
done:
    if (fd >= 0)
        close(fd);
    if (tmp != NULL) {
        unlink(tmp);
        free(tmp);
    }
    free(cbuf);
    free(h.p);
    free(meta);
    free(marena);
    free(order);
    free(numel);
    return s;
}
