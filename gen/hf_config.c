/* gen/hf_config.c: `mamba-gen --from-hf` (see hf_config.h): reads the
 * config, calls require("mg.hf").from_hf(text, path, name) in the generator's
 * sandbox, and turns its result or its errors into C data. */
#include "hf_config.h"
#include "lua_host.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

static char *hf_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* The whole file, NUL-terminated, at most HF_MAX_BYTES. */
static int hf_read(const char *path, char **data, size_t *size, char **err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        *err = hf_printf("mamba-gen: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= HF_MAX_BYTES)
                break;
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    int rerr = ferror(fp);
    fclose(fp);
    if (!buf) {
        *err = hf_printf("mamba-gen: out of memory reading %s\n", path);
        return -1;
    }
    if (rerr) {
        free(buf);
        *err = hf_printf("mamba-gen: cannot read %s: read error\n", path);
        return -1;
    }
    if (n > HF_MAX_BYTES) {
        free(buf);
        *err = hf_printf("mamba-gen: %s: larger than %u bytes; not a config.json\n", path, HF_MAX_BYTES);
        return -1;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return 0;
}

/* require("mg.hf").from_hf(text, path, name): 1..3 the arguments. */
static int hf_call(lua_State *L)
{
    lua_getglobal(L, "require");
    lua_pushliteral(L, "mg.hf");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "from_hf");
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_call(L, 3, 1);
    if (lua_type(L, -1) != LUA_TSTRING)
        return luaL_error(L, "mg.hf.from_hf returned a %s, expected a string", luaL_typename(L, -1));
    return 1;
}

/* The spec_errors list at the top of L as "PATH:LINE:COL: MSG" lines. */
static char *hf_format_errors(lua_State *L, const char *path)
{
    luaL_Buffer b;
    int errs = lua_gettop(L);
    lua_getfield(L, errs, "spec_errors");
    int list = lua_gettop(L);
    luaL_buffinit(L, &b);
    for (lua_Integer i = 1; lua_rawgeti(L, list, i) == LUA_TTABLE; i++) {
        int e = lua_gettop(L);
        lua_getfield(L, e, "line");
        lua_getfield(L, e, "col");
        lua_getfield(L, e, "msg");
        lua_Integer line = lua_tointeger(L, -3), col = lua_tointeger(L, -2);
        const char *msg = lua_tostring(L, -1);
        char *s = line > 0 ? hf_printf("%s:%lld:%lld: %s\n", path, (long long)line, (long long)col, msg ? msg : "?")
                           : hf_printf("mamba-gen: %s\n", msg ? msg : "?");
        lua_settop(L, e - 1);
        if (s) {
            luaL_addstring(&b, s);
            free(s);
        }
    }
    lua_pop(L, 1);
    luaL_pushresult(&b);
    size_t len;
    const char *t = lua_tolstring(L, -1, &len);
    char *out = malloc(len + 1);
    if (out)
        memcpy(out, t, len + 1);
    lua_settop(L, errs);
    return out;
}

int hf_from_config(lh_host *h, const char *path, const char *name, char **text, size_t *size, char **err)
{
    char *data;
    size_t n;
    *text = NULL;
    *err = NULL;
    if (hf_read(path, &data, &n, err) != 0)
        return 1;
    lua_State *L = lh_state(h);
    int top = lua_gettop(L);
    lua_pushcfunction(L, lh_msgh);
    lua_pushcfunction(L, hf_call);
    lua_pushlstring(L, data, n);
    free(data);
    lua_pushstring(L, path);
    if (name)
        lua_pushstring(L, name);
    else
        lua_pushnil(L);
    int rc = lua_pcall(L, 3, 1, top + 1), status;
    if (rc == LUA_OK) {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        *text = malloc(len + 1);
        if (*text) {
            memcpy(*text, s, len + 1);
            *size = len;
            status = 0;
        } else {
            *err = hf_printf("mamba-gen: out of memory\n");
            status = 2;
        }
    } else if (rc != LUA_ERRMEM && lua_type(L, -1) == LUA_TTABLE) {
        *err = hf_format_errors(L, path);
        status = 1;
    } else {
        const char *msg = rc == LUA_ERRMEM ? "out of memory" : lua_tostring(L, -1);
        *err = hf_printf("mamba-gen: internal error: %s\n", msg ? msg : "(no message)");
        status = 2;
    }
    lua_settop(L, top);
    if (!*err && status != 0)
        status = 2;
    return status;
}

int hf_write_file(const char *path, const char *data, size_t size, char **err)
{
    char *tmp = hf_printf("%s.tmpXXXXXX", path);
    if (!tmp) {
        *err = hf_printf("out of memory");
        return -1;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        *err = hf_printf("cannot write %s: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    mode_t mask = umask(0);
    umask(mask);
    int e = fchmod(fd, 0666 & ~mask) != 0 ? errno : 0;
    size_t off = 0;
    while (!e && off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            e = w < 0 ? errno : EIO;
        else
            off += (size_t)w;
    }
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        *err = hf_printf("cannot write %s: %s", path, strerror(e));
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
