/* gen/lua_host.c: the sandboxed Lua state (see lua_host.h). The sandbox is
 * about keeping generation a pure function of (spec, templates): Lua gets no
 * io/os/package/debug, cannot load binary chunks, and reads files only from
 * the template root. Every call into Lua is protected, so a Lua error or an
 * allocation failure is reported, never a crash. */
#include "xstr.h"
#include "lua_host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "gen/templates_embedded.h"
#include "sha256.h"
#include "spec_yaml.h"

#ifndef MG_VERSION
#error "MG_VERSION must be defined (the generator version string)"
#endif

#define LH_MAX_FILE_SIZE (16L * 1024 * 1024) /* templates and Lua tests are small */
#define LH_REQUIRE_KEY "mamba-gen.require"  /* registry: the host's require */
#define LH_TUNE_KEY "mamba-gen.tune_cache"  /* registry: mg.tune_cache()'s table, once made */

struct lh_host {
    lua_State *L;
    char *templates_dir; /* NULL: embedded */
    int allow_print;
    lh_tune_fn tune_cache; /* serves mg.tune_cache(); NULL: it returns nil */
    void *tune_ctx;
};

static char *lh_strdup_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xstr_vprintf(fmt, ap);
    va_end(ap);
    return s ? s : strdup("mamba-gen: out of memory\n");
}

/* ------------------------------------------------------------------ files */

int lh_relpath_ok(const char *relpath, size_t len)
{
    if (len == 0 || strlen(relpath) != len || relpath[0] == '/')
        return 0;
    const char *p = relpath;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t clen = slash ? (size_t)(slash - p) : strlen(p);
        if (clen == 0 || (clen == 1 && p[0] == '.') || (clen == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!slash)
            return 1;
        p = slash + 1;
    }
}

static int lh_embedded_cmp(const void *key, const void *elem)
{
    return strcmp(key, ((const lh_embedded_file *)elem)->path);
}

/* Reads a regular file of at most LH_MAX_FILE_SIZE bytes. Non-regular files
 * are refused without blocking (O_NONBLOCK, then fstat). */
static int lh_read_disk(const char *path, char **data, size_t *size, char **err)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        *err = lh_strdup_printf("%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    const char *bad = NULL;
    if (fstat(fd, &st) != 0)
        bad = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        bad = "is a directory";
    else if (!S_ISREG(st.st_mode))
        bad = "not a regular file";
    else if (st.st_size > LH_MAX_FILE_SIZE)
        bad = "file too large";
    if (bad) {
        *err = lh_strdup_printf("%s: %s", path, bad);
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        *err = lh_strdup_printf("%s: out of memory", path);
        return -1;
    }
    for (;;) {
        if (len == cap) { /* the file grew: allow it up to the limit */
            if (cap > (size_t)LH_MAX_FILE_SIZE) {
                free(buf);
                close(fd);
                *err = lh_strdup_printf("%s: file too large", path);
                return -1;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                close(fd);
                *err = lh_strdup_printf("%s: out of memory", path);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            *err = lh_strdup_printf("%s: %s", path, strerror(e));
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    *data = buf;
    *size = len;
    return 0;
}

int lh_read_template(lh_host *h, const char *relpath, char **data, size_t *size, char **err)
{
    *err = NULL;
    if (!lh_relpath_ok(relpath, strlen(relpath))) {
        *err = lh_strdup_printf("invalid template path '%s' (must be relative, without '.' or '..' "
                                "components)", relpath);
        return -1;
    }
    if (h->templates_dir) {
        char *full = lh_strdup_printf("%s/%s", h->templates_dir, relpath);
        int rc = lh_read_disk(full, data, size, err);
        free(full);
        return rc;
    }
    const lh_embedded_file *f =
        bsearch(relpath, lh_embedded_files, lh_embedded_count, sizeof *lh_embedded_files, lh_embedded_cmp);
    if (!f) {
        *err = lh_strdup_printf("templates/%s: no such file in the embedded templates", relpath);
        return -1;
    }
    char *buf = malloc(f->size + 1);
    if (!buf) {
        *err = lh_strdup_printf("templates/%s: out of memory", relpath);
        return -1;
    }
    memcpy(buf, f->data, f->size);
    buf[f->size] = '\0';
    *data = buf;
    *size = f->size;
    return 0;
}

/* ------------------------------------------------------------------ globals */

/* mg.read(relpath) -> string | nil, message */
static int lh_mg_read(lua_State *L)
{
    lh_host *h = lua_touserdata(L, lua_upvalueindex(1));
    size_t len;
    const char *rel = luaL_checklstring(L, 1, &len);
    if (!lh_relpath_ok(rel, len)) {
        luaL_pushfail(L);
        lua_pushfstring(L, "mg.read: invalid path '%s' (must be relative, without '.' or '..' components "
                           "or NUL)", rel);
        return 2;
    }
    char *data, *err;
    size_t size;
    if (lh_read_template(h, rel, &data, &size, &err) != 0) {
        luaL_pushfail(L);
        lua_pushstring(L, err);
        free(err);
        return 2;
    }
    /* If lua_pushlstring raises a memory error the buffer leaks; the run
     * then ends with an internal error anyway. */
    lua_pushlstring(L, data, size);
    free(data);
    return 1;
}

/* mg.sha256(s) -> lowercase hex */
static int lh_mg_sha256(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    char hex[SHA256_HEX_SIZE];
    sha256_hex(s, len, hex);
    lua_pushstring(L, hex);
    return 1;
}

static void lh_setfield_str(lua_State *L, const char *k, const char *v)
{
    if (!v)
        return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* Pushes mg.tune_cache()'s table: the GPU strings, the directory, and each
 * cache file parsed into a tree (entries = {{path=, tree=}}); files that do
 * not parse go to bad, with the reason. */
static void lh_push_tune(lua_State *L, const lh_tune_input *t)
{
    lua_createtable(L, 0, 8);
    lh_setfield_str(L, "gpu", t->gpu);
    lh_setfield_str(L, "cc", t->cc);
    lh_setfield_str(L, "driver", t->driver);
    lh_setfield_str(L, "gpu_source", t->gpu_source);
    if (t->sms > 0) {
        lua_pushinteger(L, t->sms);
        lua_setfield(L, -2, "sms");
    }
    lh_setfield_str(L, "dir", t->dir);
    lua_newtable(L); /* entries */
    lua_newtable(L); /* bad */
    lua_Integer ne = 0, nb = 0;
    for (size_t i = 0; i < t->nfiles; i++) {
        char *err = NULL;
        if (sy_parse(L, t->files[i].path, t->files[i].data, t->files[i].size, &err) != 0) {
            lua_pushstring(L, err ? err : t->files[i].path);
            free(err);
            lua_rawseti(L, -2, ++nb);
            continue;
        }
        lua_createtable(L, 0, 2);
        lua_insert(L, -2);
        lua_setfield(L, -2, "tree");
        lua_pushstring(L, t->files[i].path);
        lua_setfield(L, -2, "path");
        lua_rawseti(L, -3, ++ne);
    }
    lua_setfield(L, -3, "bad");
    lua_setfield(L, -2, "entries");
}

/* mg.tune_cache() -> { gpu=, cc=, driver=, sms=, gpu_source=, dir=, entries=,
 * bad= } | nil: what the host knows for resolving `auto` values (the
 * current GPU and the autotune cache). Lua decides whether it needs it; the
 * host looks for the GPU and reads the cache on the first call only (later
 * calls return the same table), and returns nil when it serves no cache. */
static int lh_mg_tune_cache(lua_State *L)
{
    lh_host *h = lua_touserdata(L, lua_upvalueindex(1));
    if (!h->tune_cache) {
        lua_pushnil(L);
        return 1;
    }
    if (lua_getfield(L, LUA_REGISTRYINDEX, LH_TUNE_KEY) == LUA_TTABLE)
        return 1;
    lua_pop(L, 1);
    lh_tune_input t;
    memset(&t, 0, sizeof t);
    if (h->tune_cache(h->tune_ctx, &t) != 0)
        return luaL_error(L, "mg.tune_cache: out of memory");
    lh_push_tune(L, &t);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, LH_TUNE_KEY);
    return 1;
}

/* load(chunk [, chunkname [, mode [, env]]]) with text chunks only: the
 * template engine compiles templates, but nothing may load bytecode (which
 * can break the VM's memory safety). Upvalue 1: the original load. */
static int lh_load(lua_State *L)
{
    int has_env = !lua_isnone(L, 4);
    const char *mode = luaL_optstring(L, 3, "t");
    if (strcmp(mode, "t") != 0) {
        luaL_pushfail(L);
        lua_pushliteral(L, "load: only text chunks (mode \"t\") are allowed");
        return 2;
    }
    lua_settop(L, 4);
    int base = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushliteral(L, "t");
    if (has_env)
        lua_pushvalue(L, 4);
    lua_call(L, has_env ? 4 : 3, LUA_MULTRET);
    return lua_gettop(L) - base;
}

/* require(name): "a.b" -> a/b.lua of the template root, run once; the
 * value is cached (nil results cached as true, as Lua's require does).
 * Upvalue 1: host; upvalue 2: cache table. A module being loaded is marked
 * with the cache table itself, which catches require loops. */
static int lh_require(lua_State *L)
{
    lh_host *h = lua_touserdata(L, lua_upvalueindex(1));
    size_t nlen;
    const char *name = luaL_checklstring(L, 1, &nlen);
    lua_settop(L, 1);
    lua_pushvalue(L, 1);
    if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) {
        if (lua_rawequal(L, -1, lua_upvalueindex(2)))
            return luaL_error(L, "require: module '%s' is required again while it is being loaded (a loop)", name);
        return 1;
    }
    lua_pop(L, 1);
    /* Names are dot-separated identifiers, which maps them onto safe paths. */
    int ok = nlen > 0 && strlen(name) == nlen && name[0] != '.' && name[nlen - 1] != '.';
    for (size_t i = 0; ok && i < nlen; i++) {
        char ch = name[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
             (ch == '.' && name[i + 1] != '.');
    }
    if (!ok)
        return luaL_error(L, "require: invalid module name '%s' (expected names like mg.tmpl)", name);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < nlen; i++)
        luaL_addchar(&b, name[i] == '.' ? '/' : name[i]);
    luaL_addstring(&b, ".lua");
    luaL_pushresult(&b); /* index 2: relpath */
    const char *rel = lua_tostring(L, 2);
    char *data, *err;
    size_t size;
    if (lh_read_template(h, rel, &data, &size, &err) != 0) {
        lua_pushfstring(L, "require: module '%s' not found: %s", name, err);
        free(err);
        return lua_error(L);
    }
    lua_pushfstring(L, "@templates/%s", rel); /* index 3: chunk name */
    int rc = luaL_loadbufferx(L, data, size, lua_tostring(L, 3), "t");
    free(data);
    if (rc != LUA_OK)
        return lua_error(L);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, lua_upvalueindex(2)); /* loading mark */
    lua_rawset(L, lua_upvalueindex(2));
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 3);
    lua_call(L, 2, 1); /* errors propagate with their own traceback */
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, 1);
    lua_pushvalue(L, -2);
    lua_rawset(L, lua_upvalueindex(2));
    return 1;
}

/* Builds the sandbox (runs protected: any allocation may fail). */
static int lh_setup(lua_State *L)
{
    lh_host *h = lua_touserdata(L, 1);
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},          {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table},    {LUA_MATHLIBNAME, luaopen_math},
        {LUA_UTF8LIBNAME, luaopen_utf8},    {NULL, NULL},
    };
    for (const luaL_Reg *lib = libs; lib->func; lib++) {
        luaL_requiref(L, lib->name, lib->func, 1);
        lua_pop(L, 1);
    }
    lua_pushglobaltable(L);
    int g = lua_gettop(L);
    /* Files come only through require/mg.read. */
    lua_pushnil(L);
    lua_setfield(L, g, "dofile");
    lua_pushnil(L);
    lua_setfield(L, g, "loadfile");
    if (!h->allow_print) {
        lua_pushnil(L);
        lua_setfield(L, g, "print");
    }
    /* string.dump is useless without binary load. */
    lua_getfield(L, g, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);

    lua_getfield(L, g, "load");
    lua_pushcclosure(L, lh_load, 1);
    lua_setfield(L, g, "load");

    lua_pushlightuserdata(L, h);
    lua_newtable(L); /* module cache */
    lua_pushcclosure(L, lh_require, 2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, LH_REQUIRE_KEY);
    lua_setfield(L, g, "require");

    lua_createtable(L, 0, 4);
    lua_pushlightuserdata(L, h);
    lua_pushcclosure(L, lh_mg_read, 1);
    lua_setfield(L, -2, "read");
    lua_pushlightuserdata(L, h);
    lua_pushcclosure(L, lh_mg_tune_cache, 1);
    lua_setfield(L, -2, "tune_cache");
    lua_pushcfunction(L, lh_mg_sha256);
    lua_setfield(L, -2, "sha256");
    lua_pushliteral(L, MG_VERSION);
    lua_setfield(L, -2, "version");
    lua_setfield(L, g, "mg");
    return 0;
}

lh_host *lh_new(const lh_options *opts, char **err)
{
    *err = NULL;
    lh_host *h = calloc(1, sizeof *h);
    if (!h) {
        *err = lh_strdup_printf("mamba-gen: out of memory");
        return NULL;
    }
    h->allow_print = opts->allow_print;
    h->tune_cache = opts->tune_cache;
    h->tune_ctx = opts->tune_ctx;
    if (opts->templates_dir) {
        struct stat st;
        if (stat(opts->templates_dir, &st) != 0) {
            *err = lh_strdup_printf("mamba-gen: --templates %s: %s", opts->templates_dir, strerror(errno));
            free(h);
            return NULL;
        }
        if (!S_ISDIR(st.st_mode)) {
            *err = lh_strdup_printf("mamba-gen: --templates %s: not a directory", opts->templates_dir);
            free(h);
            return NULL;
        }
        h->templates_dir = strdup(opts->templates_dir);
        if (!h->templates_dir) {
            free(h);
            *err = lh_strdup_printf("mamba-gen: out of memory");
            return NULL;
        }
    }
    h->L = luaL_newstate();
    if (!h->L) {
        lh_free(h);
        *err = lh_strdup_printf("mamba-gen: out of memory");
        return NULL;
    }
    lua_pushcfunction(h->L, lh_setup);
    lua_pushlightuserdata(h->L, h);
    if (lua_pcall(h->L, 1, 0, 0) != LUA_OK) {
        *err = lh_strdup_printf("mamba-gen: cannot set up Lua: %s", lua_tostring(h->L, -1));
        lh_free(h);
        return NULL;
    }
    return h;
}

void lh_free(lh_host *h)
{
    if (!h)
        return;
    if (h->L)
        lua_close(h->L);
    free(h->templates_dir);
    free(h);
}

lua_State *lh_state(lh_host *h)
{
    return h->L;
}

/* ------------------------------------------------------------------ calls */

/* Message handler: spec errors pass through untouched (they are data, not
 * bugs); anything else becomes a string with the traceback. */
int lh_msgh(lua_State *L)
{
    if (lua_type(L, 1) == LUA_TTABLE) {
        lua_pushliteral(L, "spec_errors");
        if (lua_rawget(L, 1) == LUA_TTABLE) {
            lua_settop(L, 1);
            return 1;
        }
        lua_pop(L, 1);
    }
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

typedef struct {
    const lh_args *args;
    lh_result *r;
    int failed;             /* main raised an error (the object is at index 1) */
    const char *spec_label; /* prefix of spec error lines */
    char *tree_name;        /* top-level `name` scalar of the tree, if any */
} lh_call;

static const char *lh_basename(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Copies the string at INDEX (must be a string) into a malloc'd buffer. */
static char *lh_dup_lua_string(lua_State *L, int index, size_t *len_out)
{
    size_t len;
    const char *s = lua_tolstring(L, index, &len);
    char *d = malloc(len + 1);
    if (!d)
        luaL_error(L, "out of memory");
    memcpy(d, s, len);
    d[len] = '\0';
    if (len_out)
        *len_out = len;
    return d;
}

/* Gets field K of the table at T with rawget (no metamethods run). */
static int lh_rawfield(lua_State *L, int t, const char *k)
{
    t = lua_absindex(L, t); /* before the push moves relative indices */
    lua_pushstring(L, k);
    return lua_rawget(L, t);
}

/* The value of the top-level `name` key of the tree at index 1 (a
 * fallback for the default output directory when the result has no name;
 * main only returns files for a valid spec, so it is an identifier then). */
static void lh_tree_name(lua_State *L, lh_call *c)
{
    if (!lua_istable(L, 1) || lh_rawfield(L, 1, "keys") != LUA_TTABLE || lh_rawfield(L, 1, "values") != LUA_TTABLE) {
        lua_settop(L, 1);
        return;
    }
    lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
    for (lua_Integer i = 1; i <= n && !c->tree_name; i++) {
        if (lua_rawgeti(L, 2, i) == LUA_TTABLE && lh_rawfield(L, -1, "value") == LUA_TSTRING &&
            strcmp(lua_tostring(L, -1), "name") == 0 && lua_rawgeti(L, 3, i) == LUA_TTABLE &&
            lh_rawfield(L, -1, "value") == LUA_TSTRING)
            c->tree_name = lh_dup_lua_string(L, -1, NULL);
        lua_settop(L, 3);
    }
    lua_settop(L, 1);
}

/* require("mg.init").main(args); index 1: the spec tree. */
static int lh_call_main(lua_State *L)
{
    lh_call *c = lua_touserdata(L, 2);
    const lh_args *a = c->args;
    lua_settop(L, 1);
    lh_tree_name(L, c);
    lua_getfield(L, LUA_REGISTRYINDEX, LH_REQUIRE_KEY);
    lua_pushliteral(L, "mg.init");
    lua_call(L, 1, 1);
    if (!lua_istable(L, -1))
        return luaL_error(L, "module mg.init returned a %s, expected a table with main", luaL_typename(L, -1));
    lua_getfield(L, -1, "main");
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "mg.init.main is a %s, expected a function", luaL_typename(L, -1));
    lua_createtable(L, 0, 6);
    lua_pushstring(L, a->command);
    lua_setfield(L, -2, "command");
    lua_pushstring(L, a->spec_path);
    lua_setfield(L, -2, "spec_path");
    lua_pushstring(L, lh_basename(a->spec_path));
    lua_setfield(L, -2, "spec_name");
    lua_pushstring(L, a->spec_hash);
    lua_setfield(L, -2, "spec_hash");
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "spec");
    lua_newtable(L);
    for (const char *const *o = a->options; o && o[0] && o[1]; o += 2) {
        lua_pushstring(L, o[1]);
        lua_setfield(L, -2, o[0]);
    }
    lua_setfield(L, -2, "options");
    lua_call(L, 1, 1);
    return 1;
}

/* Pushes the text for stderr: one "LABEL:LINE:COL: MSG" line per entry of
 * the spec_errors list at index ERRS, in the order Lua gave them. */
static void lh_format_spec_errors(lua_State *L, int errs, const char *label)
{
    lua_Integer n = (lua_Integer)lua_rawlen(L, errs);
    if (n == 0)
        luaL_error(L, "spec_errors is an empty list");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, errs, i) != LUA_TTABLE)
            luaL_error(L, "spec_errors[%d] is a %s, expected {line=, col=, msg=}", (int)i, luaL_typename(L, -1));
        int e = lua_gettop(L);
        if (lh_rawfield(L, e, "msg") != LUA_TSTRING)
            luaL_error(L, "spec_errors[%d].msg is a %s, expected a string", (int)i, luaL_typename(L, -1));
        lh_rawfield(L, e, "line");
        lh_rawfield(L, e, "col");
        int okl, okc;
        lua_Integer line = lua_tointegerx(L, -2, &okl), col = lua_tointegerx(L, -1, &okc);
        /* format above the buffer, then move the piece down to where
         * luaL_addvalue expects it (the buffer wants balanced stack use) */
        if (okl && line > 0 && okc && col > 0)
            lua_pushfstring(L, "%s:%I:%I: %s\n", label, line, col, lua_tostring(L, -3));
        else if (okl && line > 0)
            lua_pushfstring(L, "%s:%I: %s\n", label, line, lua_tostring(L, -3));
        else
            lua_pushfstring(L, "%s: %s\n", label, lua_tostring(L, -3));
        lua_replace(L, e);
        lua_settop(L, e);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
}

/* Turns main's outcome (index 1: result or error object) into R. */
static int lh_extract(lua_State *L)
{
    lh_call *c = lua_touserdata(L, 2);
    lh_result *r = c->r;
    lua_settop(L, 1);
    if (c->failed) {
        if (lua_type(L, 1) == LUA_TTABLE && lh_rawfield(L, 1, "spec_errors") == LUA_TTABLE) {
            lh_format_spec_errors(L, 2, c->spec_label);
            r->message = lh_dup_lua_string(L, -1, NULL);
            r->status = LH_SPEC_ERRORS;
            return 0;
        }
        lua_settop(L, 1);
        const char *msg = lua_tostring(L, 1);
        lua_pushfstring(L, "mamba-gen: internal error: %s\n", msg ? msg : "(no message)");
        r->message = lh_dup_lua_string(L, -1, NULL);
        r->status = LH_INTERNAL;
        return 0;
    }
    if (!lua_istable(L, 1))
        return luaL_error(L, "mg.init.main returned a %s, expected a table", luaL_typename(L, 1));
    int t = lh_rawfield(L, 1, "name");
    if (t == LUA_TSTRING) {
        r->name = lh_dup_lua_string(L, -1, NULL);
    } else if (t == LUA_TNIL) {
        r->name = c->tree_name; /* fallback: the spec's own name key */
        c->tree_name = NULL;
    } else {
        return luaL_error(L, "result.name is a %s, expected a string", lua_typename(L, t));
    }
    lua_pop(L, 1);
    t = lh_rawfield(L, 1, "notes");
    if (t == LUA_TTABLE) {
        size_t n = (size_t)lua_rawlen(L, -1);
        r->notes = calloc(n ? n : 1, sizeof *r->notes);
        if (!r->notes)
            return luaL_error(L, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if (lua_rawgeti(L, -1, (lua_Integer)i + 1) != LUA_TSTRING)
                return luaL_error(L, "result.notes[%d] is a %s, expected a string", (int)i + 1,
                                  luaL_typename(L, -1));
            r->notes[i] = lh_dup_lua_string(L, -1, NULL);
            r->nnotes = i + 1;
            lua_pop(L, 1);
        }
    } else if (t != LUA_TNIL) {
        return luaL_error(L, "result.notes is a %s, expected a list of strings", lua_typename(L, t));
    }
    lua_pop(L, 1);
    const char *cmd = c->args->command;
    if (strcmp(cmd, "print-spec") == 0 || strcmp(cmd, "spec-reference") == 0) {
        if (lh_rawfield(L, 1, "text") != LUA_TSTRING)
            return luaL_error(L, "result.text is a %s, expected a string (print-spec)", luaL_typename(L, -1));
        r->text = lh_dup_lua_string(L, -1, &r->text_size);
        lua_pop(L, 1);
    } else if (strcmp(cmd, "emit") == 0 || strcmp(cmd, "tune-sources") == 0) {
        if (lh_rawfield(L, 1, "files") != LUA_TTABLE)
            return luaL_error(L, "result.files is a %s, expected a list of {path=, content=, template=}",
                              luaL_typename(L, -1));
        int files = lua_gettop(L);
        size_t n = (size_t)lua_rawlen(L, files);
        r->files = calloc(n ? n : 1, sizeof *r->files);
        if (!r->files)
            return luaL_error(L, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if (lua_rawgeti(L, files, (lua_Integer)i + 1) != LUA_TTABLE)
                return luaL_error(L, "result.files[%d] is a %s, expected a table", (int)i + 1,
                                  luaL_typename(L, -1));
            int f = lua_gettop(L);
            lh_file *out = &r->files[i];
            r->nfiles = i + 1; /* so lh_result_free sees partial entries */
            size_t plen;
            if (lh_rawfield(L, f, "path") != LUA_TSTRING)
                return luaL_error(L, "result.files[%d].path is a %s, expected a string", (int)i + 1,
                                  luaL_typename(L, -1));
            out->path = lh_dup_lua_string(L, -1, &plen);
            if (plen != strlen(out->path))
                return luaL_error(L, "result.files[%d].path contains a NUL byte", (int)i + 1);
            if (lh_rawfield(L, f, "content") != LUA_TSTRING)
                return luaL_error(L, "result.files[%d].content (%s) is a %s, expected a string", (int)i + 1,
                                  out->path, luaL_typename(L, -1));
            out->content = lh_dup_lua_string(L, -1, &out->size);
            t = lh_rawfield(L, f, "template");
            if (t == LUA_TSTRING)
                out->template_name = lh_dup_lua_string(L, -1, NULL);
            else if (t != LUA_TNIL)
                return luaL_error(L, "result.files[%d].template is a %s, expected a string", (int)i + 1,
                                  lua_typename(L, t));
            lua_settop(L, files);
        }
        lua_pop(L, 1);
    }
    r->status = LH_OK;
    return 0;
}

/* Runs lh_extract protected; any failure there is an internal error. */
static int lh_finish(lh_host *h, lh_call *c)
{
    lua_State *L = h->L;
    lua_pushcfunction(L, lh_msgh);
    lua_pushcfunction(L, lh_extract);
    lua_rotate(L, -3, 2); /* msgh, extract, object */
    lua_pushlightuserdata(L, c);
    int rc = lua_pcall(L, 2, 0, -4);
    if (rc != LUA_OK) {
        lh_result_free(c->r);
        const char *msg = lua_tostring(L, -1);
        c->r->message = lh_strdup_printf("mamba-gen: internal error: %s\n",
                                         rc == LUA_ERRMEM ? "out of memory" : msg ? msg : "(no message)");
        c->r->status = LH_INTERNAL;
        lua_pop(L, 1);
    }
    lua_pop(L, 1); /* msgh */
    return c->r->status;
}

int lh_run_main(lh_host *h, const lh_args *args, lh_result *r)
{
    lua_State *L = h->L;
    memset(r, 0, sizeof *r);
    r->status = LH_INTERNAL;
    lh_call c = {args, r, 0, args->spec_path, NULL};
    int tree = lua_gettop(L);
    lua_pushcfunction(L, lh_msgh);
    lua_pushcfunction(L, lh_call_main);
    lua_pushvalue(L, tree);
    lua_pushlightuserdata(L, &c);
    int rc = lua_pcall(L, 2, 1, tree + 1);
    c.failed = rc != LUA_OK;
    if (rc == LUA_ERRMEM) {
        lua_settop(L, tree - 1);
        free(c.tree_name);
        r->message = lh_strdup_printf("mamba-gen: internal error: out of memory\n");
        return r->status = LH_INTERNAL;
    }
    /* stack: tree, msgh, outcome -> keep only the outcome */
    lua_replace(L, tree);
    lua_settop(L, tree);
    lh_finish(h, &c);
    free(c.tree_name);
    lua_settop(L, tree - 1);
    return r->status;
}

void lh_result_free(lh_result *r)
{
    free(r->message);
    free(r->name);
    free(r->text);
    for (size_t i = 0; i < r->nfiles; i++) {
        free(r->files[i].path);
        free(r->files[i].content);
        free(r->files[i].template_name);
    }
    free(r->files);
    for (size_t i = 0; i < r->nnotes; i++)
        free(r->notes[i]);
    free(r->notes);
    int status = r->status;
    memset(r, 0, sizeof *r);
    r->status = status;
}

int lh_run_file(lh_host *h, const char *path, char **message)
{
    lua_State *L = h->L;
    *message = NULL;
    char *data, *err;
    size_t size;
    if (lh_read_disk(path, &data, &size, &err) != 0) {
        *message = lh_strdup_printf("mamba-gen: --lua-test %s\n", err);
        free(err);
        return 1;
    }
    int top = lua_gettop(L);
    lua_pushcfunction(L, lh_msgh);
    char *chunkname = lh_strdup_printf("@%s", path);
    int rc = luaL_loadbufferx(L, data, size, chunkname, "t");
    free(chunkname);
    free(data);
    if (rc == LUA_OK)
        rc = lua_pcall(L, 0, LUA_MULTRET, top + 1);
    int status = 0;
    if (rc != LUA_OK) {
        status = 1;
        if (lua_type(L, -1) == LUA_TTABLE) {
            /* a spec error escaped the test: show it like the CLI would */
            lh_result r;
            memset(&r, 0, sizeof r);
            lh_args a = {"lua-test", path, "", NULL};
            lh_call c = {&a, &r, 1, "<spec>", NULL};
            lh_finish(h, &c);
            *message = lh_strdup_printf("%s: uncaught spec error:\n%s", path, r.message ? r.message : "");
            lh_result_free(&r);
        } else {
            const char *msg = lua_tostring(L, -1);
            *message = lh_strdup_printf("%s\n", msg ? msg : "(error object is not a string)");
        }
    } else if (lua_gettop(L) > top + 1) {
        int first = top + 2;
        if (!(lua_isnil(L, first) || (lua_isboolean(L, first) && lua_toboolean(L, first)))) {
            status = 1;
            *message = lua_isboolean(L, first)
                           ? lh_strdup_printf("%s: returned false\n", path)
                           : lh_strdup_printf("%s: returned a %s, expected true or nothing\n", path,
                                              luaL_typename(L, first));
        }
    }
    lua_settop(L, top);
    return status;
}
