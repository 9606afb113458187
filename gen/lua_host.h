/* gen/lua_host.h: the sandboxed Lua state that runs the templates/ modules
 * (doc/HACKING.md, "Host <-> Lua contract"): which libraries and globals Lua
 * sees, how `require` and `mg.read` find files of the template root (the
 * embedded copy or a --templates directory), and the protected call of
 * require("mg.init").main(args) with its result turned into C data. The host
 * serves data (files, hashes, the autotune cache); Lua makes every decision. */
#ifndef MG_LUA_HOST_H
#define MG_LUA_HOST_H

#include <stddef.h>

#include <lua.h>

typedef struct lh_host lh_host;

/* 1 if RELPATH[0..LEN) may name a file of the template root: not empty,
 * relative, no NUL, no empty, "." or ".." component. */
int lh_relpath_ok(const char *relpath, size_t len);

/* Reads RELPATH from the template root into a malloc'd, NUL-terminated
 * buffer. 0, or -1 with *ERR set (free it). */
int lh_read_template(lh_host *h, const char *relpath, char **data, size_t *size, char **err);

/* One file of the autotune cache, as read by the host (gen/tune_cache.h). */
typedef struct {
    const char *path;
    const char *data;
    size_t size;
} lh_tune_file;

/* What the host knows for resolving `auto` values from the autotune cache
 * (mg.tune_cache(), doc/tuning.md): the current GPU and the cache's files.
 * Each file is parsed as YAML (JSON is a subset of it) into a spec-style
 * tree; files that do not parse are listed in the table's `bad` with the
 * reason. */
typedef struct {
    const char *gpu;        /* device name, or NULL: no GPU known */
    const char *cc;         /* "9.0", or NULL */
    const char *driver;     /* "13.0", or NULL */
    int sms;                /* multiprocessors of the device, or 0: not known */
    const char *gpu_source; /* how the GPU was found, or why there is none */
    const char *dir;        /* the cache directory */
    const lh_tune_file *files;
    size_t nfiles;
} lh_tune_input;

/* Finds the GPU and reads the cache for mg.tune_cache(), called the first
 * time Lua asks (mg/tune.lua resolve, for `auto` values only). Fills *T; the
 * strings and files must stay valid until lh_run_main returns (the host
 * copies them into Lua at once). 0, or -1: out of memory. */
typedef int (*lh_tune_fn)(void *ctx, lh_tune_input *t);

typedef struct {
    const char *templates_dir; /* template root on disk; NULL: the embedded copy */
    int allow_print;           /* keep `print` (--lua-test); otherwise stdout is the product's */
    lh_tune_fn tune_cache;     /* serves mg.tune_cache(); NULL: it returns nil (no cache) */
    void *tune_ctx;            /* passed to tune_cache */
} lh_options;

/* Creates the state. NULL with *ERR set (free it) if the template directory
 * is not a directory or memory runs out. */
lh_host *lh_new(const lh_options *opts, char **err);
void lh_free(lh_host *h);
lua_State *lh_state(lh_host *h);

/* What the host passes to main (the spec tree comes from the Lua stack). */
typedef struct {
    const char *command;   /* "emit" | "check" | "print-spec" | "tune-sources" */
    const char *spec_path; /* as given on the command line */
    const char *spec_hash; /* sha256 hex of the file bytes */
    const char *const *options; /* args.options: NULL, or {key, value, ..., NULL} */
} lh_args;

typedef struct {
    char *path;          /* relative to the output directory */
    char *content;
    size_t size;
    char *template_name; /* may be NULL */
} lh_file;

enum { LH_OK = 0, LH_SPEC_ERRORS = 1, LH_INTERNAL = 2 };

typedef struct {
    int status;        /* LH_OK, LH_SPEC_ERRORS or LH_INTERNAL (= exit status) */
    char *message;     /* errors: complete text for stderr (newline-terminated) */
    char *name;        /* spec name from the result, or NULL */
    char *text;        /* print-spec */
    size_t text_size;
    lh_file *files;    /* emit and tune-sources, in the order Lua gave them */
    size_t nfiles;
    char **notes;      /* result.notes: messages for stderr (no newline) */
    size_t nnotes;
} lh_result;

/* Pops the spec tree from the top of lh_state(H), calls
 * require("mg.init").main(args) and fills R. Spec errors raised as
 * error({spec_errors={{line=,col=,msg=},...}}, 0) become LH_SPEC_ERRORS with
 * one "SPEC:LINE:COL: MSG" line each; any other error or a malformed result
 * becomes LH_INTERNAL with the traceback. Returns R->status. */
int lh_run_main(lh_host *h, const lh_args *args, lh_result *r);
void lh_result_free(lh_result *r);

/* --lua-test: runs the Lua file PATH (from disk) in the sandbox. Returns 0
 * if it returns nothing, nil or true; 1 with *MESSAGE set (free it) if it
 * raises an error or returns anything else. */
int lh_run_file(lh_host *h, const char *path, char **message);

/* The message handler of every protected call into the generator's Lua
 * (lua_pcall's msgh): a spec-error table passes through untouched (data,
 * not a bug); anything else becomes a string with the traceback. */
int lh_msgh(lua_State *L);

#endif
