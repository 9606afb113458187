/* gen/spec_yaml.c: spec file -> Lua spec tree (doc/HACKING.md, "The spec
 * tree"). Uses libyaml's event API (not the document API) so every node keeps
 * its position and nothing is resolved behind our back: anchors, aliases,
 * tags, duplicate keys and extra documents are all visible as events and
 * rejected here with the position of the offending token. Typing of plain
 * scalars is left to Lua (validate.lua). */
#include "xstr.h"
#include "spec_yaml.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <yaml.h>

#define SY_STD_TAG_PREFIX "tag:yaml.org,2002:"
#define SY_MAX_KEY_CHARS 1024 /* libyaml's limit on an implicit (simple) key */
#define SY_EMPTY_MSG "the spec is empty: expected a mapping of keys such as name, arch, model"

/* Formats a message as "PATH:LINE:COL: ..." (or "PATH: ..." when LINE is 0)
 * into a malloc'd string. Returns NULL only when out of memory. */
static char *sy_format(const char *path, unsigned long line, unsigned long col, const char *fmt,
                       va_list ap)
{
    char *msg = xstr_vprintf(fmt, ap);
    if (!msg)
        return NULL;
    char *s = line > 0 ? xstr_printf("%s:%lu:%lu: %s", path, line, col, msg)
                       : xstr_printf("%s: %s", path, msg);
    free(msg);
    return s;
}

static char *sy_oom(void)
{
    /* strdup may fail too; callers treat NULL as "out of memory". */
    return strdup("mamba-gen: out of memory");
}

/* Sets *ERR (file-level message when LINE is 0) and returns -1. */
static int sy_set_err(char **err, const char *path, unsigned long line, unsigned long col,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    *err = sy_format(path, line, col, fmt, ap);
    va_end(ap);
    if (!*err)
        *err = sy_oom();
    return -1;
}

/* The code point of the UTF-8 sequence at S[0..LEN) and its length in
 * *N, or -1 (with *N = 1) for a byte that does not start a valid sequence. */
static long sy_utf8_decode(const unsigned char *s, size_t len, size_t *n)
{
    *n = 1;
    if (s[0] < 0x80)
        return s[0];
    size_t need = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : 0;
    if (need == 0 || need > len)
        return -1;
    long cp = s[0] & (0x7F >> need);
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *n = need;
    return cp;
}

/* Is code point CP unsafe to print as is (it could move the cursor, hide
 * text or reorder it on a terminal)? C0/C1 controls, DEL, line and
 * paragraph separators, bidi controls, zero-width marks, BOM. */
static int sy_unsafe_cp(long cp)
{
    return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x200B && cp <= 0x200F) ||
           (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2069) || cp == 0xFEFF;
}

char *sy_escape(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    /* at most SY_QUOTE_MAX_CHARS characters of at most 6 output bytes each */
    char *out = malloc((size_t)SY_QUOTE_MAX_CHARS * 6 + 8);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    int chars = 0;
    while (i < len) {
        if (chars == SY_QUOTE_MAX_CHARS) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        size_t n;
        long cp = sy_utf8_decode(s + i, len - i, &n);
        if (cp < 0) {
            o += (size_t)sprintf(out + o, "\\x%02x", s[i]);
        } else if (cp == 0) {
            o += (size_t)sprintf(out + o, "\\0");
        } else if (cp == '\n') {
            o += (size_t)sprintf(out + o, "\\n");
        } else if (cp == '\r') {
            o += (size_t)sprintf(out + o, "\\r");
        } else if (cp == '\t') {
            o += (size_t)sprintf(out + o, "\\t");
        } else if (cp == '\\') {
            o += (size_t)sprintf(out + o, "\\\\");
        } else if (cp < 0x80 && sy_unsafe_cp(cp)) {
            o += (size_t)sprintf(out + o, "\\x%02lx", (unsigned long)cp);
        } else if (sy_unsafe_cp(cp)) {
            o += (size_t)sprintf(out + o, "\\u%04lX", (unsigned long)cp);
        } else {
            memcpy(out + o, s + i, n);
            o += n;
        }
        i += n;
        chars++;
    }
    out[o] = '\0';
    return out;
}

/* ------------------------------------------------------------------ file */

void sy_file_free(sy_file *f)
{
    free(f->data);
    f->data = NULL;
    f->size = 0;
}

/* Rejects what is not a regular file of at most SY_MAX_FILE_SIZE bytes. */
static int sy_check_stat(const char *path, const struct stat *st, char **err)
{
    if (S_ISDIR(st->st_mode))
        return sy_set_err(err, path, 0, 0, "is a directory, expected a YAML spec file");
    if (!S_ISREG(st->st_mode))
        return sy_set_err(err, path, 0, 0, "not a regular file, expected a YAML spec file");
    if (st->st_size > SY_MAX_FILE_SIZE)
        return sy_set_err(err, path, 0, 0, "the spec is too large (%lld bytes; the limit is 1 MiB)",
                          (long long)st->st_size);
    return 0;
}

int sy_read_file(const char *path, sy_file *f, char **err)
{
    struct stat st;
    f->data = NULL;
    f->size = 0;
    f->hash[0] = '\0';
    *err = NULL;
    /* stat first so a FIFO or device is rejected without even opening it. */
    if (stat(path, &st) != 0)
        return sy_set_err(err, path, 0, 0, "cannot open: %s", strerror(errno));
    if (sy_check_stat(path, &st, err) != 0)
        return -1;
    /* O_NONBLOCK: if the path was swapped for a FIFO since stat, open must
     * not wait for a writer; fstat below then rejects it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return sy_set_err(err, path, 0, 0, "cannot open: %s", strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sy_set_err(err, path, 0, 0, "cannot stat: %s", strerror(e));
    }
    if (sy_check_stat(path, &st, err) != 0) {
        close(fd);
        return -1;
    }
    /* Bounded read: at most limit+1 bytes, so a file that grows after fstat
     * is still caught as too large and never read without end. */
    size_t cap = (size_t)SY_MAX_FILE_SIZE + 2;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        *err = sy_oom();
        return -1;
    }
    size_t len = 0;
    while (len < cap - 1) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return sy_set_err(err, path, 0, 0, "read error: %s", strerror(e));
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (len > (size_t)SY_MAX_FILE_SIZE) {
        free(buf);
        return sy_set_err(err, path, 0, 0, "the spec is too large (more than %ld bytes; the limit is 1 MiB)",
                          SY_MAX_FILE_SIZE);
    }
    buf[len] = '\0';
    f->data = buf;
    f->size = len;
    sha256_hex(buf, len, f->hash);
    return 0;
}

/* ------------------------------------------------------------------ parse */

typedef struct {
    lua_State *L;
    const char *path;
    const char *data;
    size_t size;
    yaml_parser_t parser;
    yaml_event_t ev;  /* the current event */
    int have_ev;      /* ev must be deleted */
    char *err;        /* set on failure */
} sy_ctx;

static int sy_fail(sy_ctx *c, const yaml_mark_t *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    free(c->err);
    c->err = sy_format(c->path, (unsigned long)m->line + 1, (unsigned long)m->column + 1, fmt, ap);
    va_end(ap);
    if (!c->err)
        c->err = sy_oom();
    return -1;
}

/* sy_fail with FMT's one %s taking TEXT[0..LEN), escaped and shortened
 * (sy_escape): user text never reaches the terminal raw. */
static int sy_fail_text(sy_ctx *c, const yaml_mark_t *m, const char *fmt, const char *text, size_t len)
{
    char *q = sy_escape(text, len);
    if (!q) {
        free(c->err);
        c->err = sy_oom();
        return -1;
    }
    sy_fail(c, m, fmt, q);
    free(q);
    return -1;
}

/* Line and column (1-based, in characters) of byte OFFSET: libyaml gives
 * reader errors (bad UTF-8, control characters) as a byte offset only. */
static void sy_offset_pos(const sy_ctx *c, size_t offset, yaml_mark_t *m)
{
    size_t line = 0, col = 0;
    if (offset > c->size)
        offset = c->size;
    for (size_t i = 0; i < offset; i++) {
        unsigned char ch = (unsigned char)c->data[i];
        if (ch == '\n' || (ch == '\r' && (i + 1 >= c->size || c->data[i + 1] != '\n'))) {
            line++;
            col = 0;
        } else if ((ch & 0xC0) != 0x80) { /* count characters, not continuation bytes */
            col++;
        }
    }
    m->index = offset;
    m->line = line;
    m->column = col;
}

/* The byte at MARK (libyaml counts lines and characters, not bytes), or
 * -1 past the end. Used to recognise a tab where libyaml only says it found
 * a character that cannot start a token. */
static int sy_byte_at(const sy_ctx *c, const yaml_mark_t *m)
{
    size_t i = 0, line = 0, col = 0;
    while (i < c->size && line < m->line) {
        unsigned char ch = (unsigned char)c->data[i++];
        if (ch == '\n' || (ch == '\r' && (i >= c->size || c->data[i] != '\n')))
            line++;
    }
    while (i < c->size && col < m->column) {
        i++;
        while (i < c->size && ((unsigned char)c->data[i] & 0xC0) == 0x80)
            i++;
        col++;
    }
    return i < c->size ? (unsigned char)c->data[i] : -1;
}

/* Byte index of the start of line LINE (0-based), or c->size. */
static size_t sy_line_start(const sy_ctx *c, size_t line)
{
    size_t i = 0, l = 0;
    while (i < c->size && l < line) {
        unsigned char ch = (unsigned char)c->data[i++];
        if (ch == '\n' || (ch == '\r' && (i >= c->size || c->data[i] != '\n')))
            l++;
    }
    return i;
}

/* libyaml allows at most 1024 characters in an implicit key and reports a
 * longer one as a generic syntax error somewhere on its line. Reports
 * such a key on line LINE (0-based) and returns -1, or returns 0. */
static int sy_long_key(sy_ctx *c, size_t line)
{
    size_t i = sy_line_start(c, line), col = 0;
    while (i < c->size && (c->data[i] == ' ' || c->data[i] == '-')) {
        i++;
        col++;
    }
    size_t start = i, chars = 0;
    while (i < c->size && c->data[i] != '\n' && c->data[i] != '\r' && c->data[i] != '#') {
        if (c->data[i] == ':' && (i + 1 >= c->size || c->data[i + 1] == ' ' || c->data[i + 1] == '\n' ||
                                  c->data[i + 1] == '\r'))
            break;
        if (((unsigned char)c->data[i] & 0xC0) != 0x80)
            chars++;
        i++;
    }
    if (chars <= SY_MAX_KEY_CHARS || i >= c->size || c->data[i] != ':')
        return 0;
    yaml_mark_t m = {start, line, col};
    char *q = sy_escape(c->data + start, i - start);
    if (!q) {
        free(c->err);
        c->err = sy_oom();
        return -1;
    }
    sy_fail(c, &m, "key '%s' is %lu characters long; YAML allows at most %d characters in a key", q,
            (unsigned long)chars, SY_MAX_KEY_CHARS);
    free(q);
    return -1;
}

/* Is code point CP a space other than U+0020 and the tab (which YAML does
 * not take as white space, so it silently becomes part of a key)? */
static int sy_unicode_space(long cp)
{
    return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000 || cp == 0xFEFF;
}

/* Rejects a Unicode space (a non-breaking space, typically pasted from a
 * web page or a word processor) in the indentation of a line: YAML reads it
 * as the first character of a key, not as indentation. */
static int sy_check_indent(sy_ctx *c)
{
    size_t i = 0, line = 0;
    while (i < c->size) {
        size_t col = 0;
        while (i < c->size && (c->data[i] == ' ' || c->data[i] == '\t')) {
            i++;
            col++;
        }
        if (i < c->size && (unsigned char)c->data[i] >= 0x80) {
            size_t n;
            long cp = sy_utf8_decode((const unsigned char *)c->data + i, c->size - i, &n);
            if (sy_unicode_space(cp)) {
                yaml_mark_t m = {i, line, col};
                return sy_fail(c, &m, "%s (U+%04lX) in the indentation: YAML indentation must use ASCII spaces",
                               cp == 0xA0 ? "a non-breaking space" : cp == 0xFEFF ? "a byte-order mark"
                                                                                  : "a Unicode space",
                               (unsigned long)cp);
            }
        }
        while (i < c->size && c->data[i] != '\n' && c->data[i] != '\r')
            i++;
        if (i < c->size && c->data[i] == '\r' && i + 1 < c->size && c->data[i + 1] == '\n')
            i++;
        if (i < c->size) {
            i++;
            line++;
        }
    }
    return 0;
}

/* Turns a libyaml failure into our message. */
static int sy_parser_error(sy_ctx *c)
{
    yaml_parser_t *p = &c->parser;
    const char *problem = p->problem ? p->problem : "unknown error";
    yaml_mark_t m;
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        free(c->err);
        c->err = sy_oom();
        return -1;
    case YAML_READER_ERROR:
        sy_offset_pos(c, p->problem_offset, &m);
        if (strstr(problem, "UTF-8") || strstr(problem, "Unicode")) {
            if (p->problem_value >= 0)
                return sy_fail(c, &m, "invalid UTF-8 (%s 0x%02x): the spec must be UTF-8 text", problem,
                               (unsigned)p->problem_value);
            return sy_fail(c, &m, "invalid UTF-8 (%s): the spec must be UTF-8 text", problem);
        }
        if (strstr(problem, "control characters") && p->problem_value >= 0)
            return sy_fail(c, &m, "control character U+%04X is not allowed in YAML", (unsigned)p->problem_value);
        return sy_fail(c, &m, "cannot read YAML: %s", problem);
    case YAML_SCANNER_ERROR:
    case YAML_PARSER_ERROR:
        if (sy_long_key(c, p->problem_mark.line) != 0 || (p->context && sy_long_key(c, p->context_mark.line) != 0))
            return -1;
        if (sy_byte_at(c, &p->problem_mark) == '\t')
            return sy_fail(c, &p->problem_mark, "YAML syntax error: %s: a tab (YAML indentation must use spaces)",
                           problem);
        if (p->context)
            return sy_fail(c, &p->problem_mark, "YAML syntax error: %s (%s at line %lu, column %lu)", problem,
                           p->context, (unsigned long)p->context_mark.line + 1,
                           (unsigned long)p->context_mark.column + 1);
        return sy_fail(c, &p->problem_mark, "YAML syntax error: %s", problem);
    default:
        m.line = m.column = 0;
        m.index = 0;
        return sy_fail(c, &m, "YAML error: %s", problem);
    }
}

/* Advances to the next event (the previous one is freed). */
static int sy_next(sy_ctx *c)
{
    if (c->have_ev) {
        yaml_event_delete(&c->ev);
        c->have_ev = 0;
    }
    if (!yaml_parser_parse(&c->parser, &c->ev))
        return sy_parser_error(c);
    c->have_ev = 1;
    return 0;
}

static const char *sy_kind_name(yaml_event_type_t t)
{
    switch (t) {
    case YAML_SCALAR_EVENT: return "a scalar";
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "an unexpected YAML event";
    }
}

/* Rejects an explicit tag: a spec gives every value its type by how it is
 * written (validate.lua types plain scalars), so a tag could only be
 * ignored or contradict that (`!!null 128`). Standard tags are shown in
 * their short form (!!null). */
static int sy_check_tag(sy_ctx *c, const yaml_mark_t *m, const yaml_char_t *tagu)
{
    const char *tag = (const char *)tagu;
    if (!tag)
        return 0;
    size_t plen = strlen(SY_STD_TAG_PREFIX);
    char *shown = strncmp(tag, SY_STD_TAG_PREFIX, plen) == 0 ? xstr_printf("!!%s", tag + plen) : strdup(tag);
    if (!shown) {
        free(c->err);
        c->err = sy_oom();
        return -1;
    }
    sy_fail_text(c, m, "tag %s is not allowed: a spec takes no explicit tags; write the plain value "
                       "(quote it to make it a string)", shown, strlen(shown));
    free(shown);
    return -1;
}

/* Pushes {kind=KIND, line=, col=}. */
static void sy_push_node(lua_State *L, const char *kind, const yaml_mark_t *m, int extra)
{
    lua_createtable(L, 0, 3 + extra);
    lua_pushstring(L, kind);
    lua_setfield(L, -2, "kind");
    lua_pushinteger(L, (lua_Integer)m->line + 1);
    lua_setfield(L, -2, "line");
    lua_pushinteger(L, (lua_Integer)m->column + 1);
    lua_setfield(L, -2, "col");
}

/* What every node start is checked for: no anchor, no tag, and for a
 * collection the nesting depth. */
static int sy_check_start(sy_ctx *c, const yaml_mark_t *m, const yaml_char_t *anchor, const yaml_char_t *tag,
                          yaml_event_type_t kind, int depth)
{
    if (anchor)
        return sy_fail_text(c, m, "anchors (&%s) are not allowed in a spec", (const char *)anchor,
                            strlen((const char *)anchor));
    if (sy_check_tag(c, m, tag) != 0)
        return -1;
    if (kind != YAML_SCALAR_EVENT && depth > SY_MAX_DEPTH)
        return sy_fail(c, m, "nesting deeper than %d levels", SY_MAX_DEPTH);
    return 0;
}

/* Converts the node that starts at the current event (at nesting level
 * DEPTH, root mapping = 1) and pushes it; returns 0, or -1 with c->err set
 * (the stack is then left for lua_pcall to discard). */
static int sy_node(sy_ctx *c, int depth)
{
    lua_State *L = c->L;
    yaml_event_t *e = &c->ev;
    luaL_checkstack(L, 8, "spec nesting");
    switch (e->type) {
    case YAML_ALIAS_EVENT:
        return sy_fail_text(c, &e->start_mark, "aliases (*%s) are not allowed in a spec: write the value out",
                            (const char *)e->data.alias.anchor, strlen((const char *)e->data.alias.anchor));
    case YAML_SCALAR_EVENT: {
        if (sy_check_start(c, &e->start_mark, e->data.scalar.anchor, e->data.scalar.tag, e->type, depth) != 0)
            return -1;
        sy_push_node(L, "scalar", &e->start_mark, 2);
        lua_pushlstring(L, (const char *)e->data.scalar.value, e->data.scalar.length);
        lua_setfield(L, -2, "value");
        lua_pushboolean(L, e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
        lua_setfield(L, -2, "plain");
        return 0;
    }
    case YAML_SEQUENCE_START_EVENT: {
        yaml_mark_t start = e->start_mark;
        if (sy_check_start(c, &start, e->data.sequence_start.anchor, e->data.sequence_start.tag, e->type, depth) != 0)
            return -1;
        sy_push_node(L, "seq", &start, 1);
        lua_newtable(L); /* items */
        lua_Integer n = 0;
        for (;;) {
            if (sy_next(c) != 0)
                return -1;
            if (e->type == YAML_SEQUENCE_END_EVENT)
                break;
            if (sy_node(c, depth + 1) != 0)
                return -1;
            lua_rawseti(L, -2, ++n);
        }
        lua_setfield(L, -2, "items");
        return 0;
    }
    case YAML_MAPPING_START_EVENT: {
        yaml_mark_t start = e->start_mark;
        if (sy_check_start(c, &start, e->data.mapping_start.anchor, e->data.mapping_start.tag, e->type, depth) != 0)
            return -1;
        sy_push_node(L, "map", &start, 2);
        lua_newtable(L); /* keys */
        lua_newtable(L); /* values */
        lua_newtable(L); /* seen: key text -> line of its first occurrence */
        int node = lua_gettop(L) - 3, keys = node + 1, values = node + 2, seen = node + 3;
        lua_Integer n = 0;
        for (;;) {
            if (sy_next(c) != 0)
                return -1;
            if (e->type == YAML_MAPPING_END_EVENT)
                break;
            if (e->type == YAML_SEQUENCE_START_EVENT || e->type == YAML_MAPPING_START_EVENT)
                return sy_fail(c, &e->start_mark, "a mapping key must be a scalar, found %s",
                               sy_kind_name(e->type));
            yaml_mark_t kmark = e->start_mark;
            if (sy_node(c, depth + 1) != 0) /* aliases are reported there */
                return -1;
            lua_getfield(L, -1, "value");
            lua_pushvalue(L, -1);
            if (lua_rawget(L, seen) != LUA_TNIL) {
                lua_Integer first = lua_tointeger(L, -1);
                size_t klen;
                const char *k = lua_tolstring(L, -2, &klen);
                char *q = sy_escape(k, klen);
                if (!q) {
                    free(c->err);
                    c->err = sy_oom();
                    return -1;
                }
                sy_fail(c, &kmark, "duplicate key '%s' (first defined at line %lld)", q, (long long)first);
                free(q);
                return -1;
            }
            lua_pop(L, 1);
            lua_pushinteger(L, (lua_Integer)kmark.line + 1);
            lua_rawset(L, seen);
            lua_rawseti(L, keys, ++n);
            if (sy_next(c) != 0)
                return -1;
            if (sy_node(c, depth + 1) != 0)
                return -1;
            lua_rawseti(L, values, n);
        }
        lua_pop(L, 1); /* seen */
        lua_setfield(L, node, "values");
        lua_setfield(L, node, "keys");
        return 0;
    }
    default:
        return sy_fail(c, &e->start_mark, "unexpected YAML event %d", (int)e->type);
    }
}

/* Checks the root node just pushed: the spec must be a non-empty mapping. */
static int sy_check_root(sy_ctx *c, const yaml_mark_t *doc_mark)
{
    lua_State *L = c->L;
    lua_getfield(L, -1, "kind");
    const char *kind = lua_tostring(L, -1);
    yaml_mark_t m;
    m.index = 0;
    lua_getfield(L, -2, "line");
    m.line = (size_t)lua_tointeger(L, -1) - 1;
    lua_getfield(L, -3, "col");
    m.column = (size_t)lua_tointeger(L, -1) - 1;
    lua_pop(L, 2);
    if (strcmp(kind, "map") == 0) {
        lua_pop(L, 1);
        return 0;
    }
    if (strcmp(kind, "scalar") == 0) {
        lua_getfield(L, -2, "value");
        lua_getfield(L, -3, "plain");
        int empty = lua_rawlen(L, -2) == 0 && lua_toboolean(L, -1);
        lua_pop(L, 2);
        if (empty)
            return sy_fail(c, doc_mark, SY_EMPTY_MSG);
        /* `KEY: value` with KEY over 1024 characters reads as one scalar */
        if (sy_long_key(c, m.line) != 0)
            return -1;
        return sy_fail(c, &m, "the spec must be a mapping of keys such as name, arch, model, found a scalar");
    }
    return sy_fail(c, &m, "the spec must be a mapping of keys such as name, arch, model, found a sequence");
}

/* Runs under lua_pcall so that a Lua memory error cannot longjmp past the
 * libyaml cleanup in sy_parse. Returns the tree, or nothing with c->err. */
static int sy_parse_protected(lua_State *L)
{
    sy_ctx *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    yaml_mark_t first = {0, 0, 0};
    if (sy_check_indent(c) != 0)
        return 0;
    if (sy_next(c) != 0)
        return 0;
    if (c->ev.type != YAML_STREAM_START_EVENT) {
        sy_fail(c, &c->ev.start_mark, "unexpected YAML event at the start of the stream");
        return 0;
    }
    if (sy_next(c) != 0)
        return 0;
    if (c->ev.type == YAML_STREAM_END_EVENT) { /* no document at all: empty or only comments */
        sy_fail(c, &first, SY_EMPTY_MSG);
        return 0;
    }
    yaml_mark_t doc_mark = c->ev.start_mark;
    if (sy_next(c) != 0 || sy_node(c, 1) != 0 || sy_check_root(c, &doc_mark) != 0)
        return 0;
    if (sy_next(c) != 0)
        return 0;
    if (c->ev.type != YAML_DOCUMENT_END_EVENT) {
        sy_fail(c, &c->ev.start_mark, "unexpected YAML event after the document");
        return 0;
    }
    if (sy_next(c) != 0)
        return 0;
    if (c->ev.type == YAML_DOCUMENT_START_EVENT) {
        sy_fail(c, &c->ev.start_mark, "more than one document in the spec (the first starts at line %lu); "
                                      "a spec is a single YAML document",
                (unsigned long)doc_mark.line + 1);
        return 0;
    }
    if (c->ev.type != YAML_STREAM_END_EVENT) {
        sy_fail(c, &c->ev.start_mark, "unexpected YAML event after the document");
        return 0;
    }
    return 1;
}

int sy_parse(lua_State *L, const char *path, const char *data, size_t size, char **err)
{
    /* A UTF-8 byte-order mark (some Windows editors write one) is no part of
     * the text: skipped, so columns on line 1 count from after it. */
    if (size >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) {
        data += 3;
        size -= 3;
    }
    sy_ctx c = {.L = L, .path = path, .data = data, .size = size};
    *err = NULL;
    if (!yaml_parser_initialize(&c.parser)) {
        *err = sy_oom();
        return -1;
    }
    yaml_parser_set_input_string(&c.parser, (const unsigned char *)data, size);
    /* Never guess UTF-16 from a BOM: a spec is UTF-8, anything else is an error. */
    yaml_parser_set_encoding(&c.parser, YAML_UTF8_ENCODING);
    int top = lua_gettop(L);
    lua_pushcfunction(L, sy_parse_protected);
    lua_pushlightuserdata(L, &c);
    int rc = lua_pcall(L, 1, 1, 0);
    if (c.have_ev)
        yaml_event_delete(&c.ev);
    yaml_parser_delete(&c.parser);
    if (rc != LUA_OK) {
        free(c.err);
        if (rc == LUA_ERRMEM) {
            *err = sy_oom();
        } else {
            const char *msg = lua_tostring(L, -1);
            size_t len = strlen(path) + 64 + (msg ? strlen(msg) : 0);
            *err = malloc(len);
            if (*err)
                snprintf(*err, len, "%s: internal error while reading the spec: %s", path, msg ? msg : "?");
            else
                *err = sy_oom();
        }
        lua_settop(L, top);
        return -1;
    }
    if (c.err) {
        *err = c.err;
        lua_settop(L, top);
        return -1;
    }
    return 0;
}

int sy_load(lua_State *L, const char *path, char hash[SHA256_HEX_SIZE], char **err)
{
    sy_file f;
    if (sy_read_file(path, &f, err) != 0)
        return -1;
    memcpy(hash, f.hash, SHA256_HEX_SIZE);
    int rc = sy_parse(L, path, f.data, f.size, err);
    sy_file_free(&f);
    return rc;
}
