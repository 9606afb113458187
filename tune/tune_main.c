/* tune/tune_main.c: main() of mamba-tune, the autotuner (`mamba-gen tune`
 * runs it; doc/tuning.md). Steps: the Lua side emits one scan translation
 * unit per candidate (chunk size x block size: the Mamba-1 scan kernels,
 * or the Mamba-3 SISO chunked SSM kernel) and a manifest; NVRTC
 * compiles them to cubins for the GPU's architecture (in parallel); each
 * cubin is loaded, checked against the f64 reference (Mamba-1: the scan;
 * Mamba-3: the SSM step recurrence) and, only if
 * right, timed at every requested shape; the best chunked variant goes to
 * the autotune cache (written atomically), every measurement to a CSV.
 * A candidate that fails to compile, load, launch or verify is recorded and
 * skipped. The `generic` candidate (the same kernel with the model dims as
 * kernel arguments, in the launch shape of one specialized candidate) is
 * verified and timed like the others but never chosen: per shape, the
 * fastest specialized chunked time against it is printed as
 * `specialized best vs generic: X.XXx` and written to the CSV. Exit status: 0 when a best variant was found (with
 * --compile-only: when at least one candidate compiled), 1 when none, or on
 * a spec, device or cache error; 2 usage errors. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gen/lua_host.h"
#include "gen/outdir.h"
#include "gen/spec_yaml.h"
#include "gen/tune_cache.h"
#include "tune_gpu.h"
#include "tune_nvrtc.h"

#ifndef MG_VERSION
#error "MG_VERSION must be defined (the generator version string)"
#endif
#ifndef MG_CUDA_INCLUDE
#define MG_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

enum { TM_OK = 0, TM_FAIL = 1, TM_USAGE = 2 };
#define TM_MAX_LIST 32
#define TM_MAX_GARGS 32   /* ints in the generic candidate's struct tune_dims */

typedef struct {
    const char *spec, *templates, *cache_dir, *csv, *emit_dir, *arch, *cuda_include;
    const char *chunks, *threads; /* lists as given (checked), passed to Lua */
    int seqlens[TM_MAX_LIST], nseqlens, batches[TM_MAX_LIST], nbatches;
    int iters, warmup, device, jobs, quiet, compile_only, no_cache, print_key, no_sequential, no_generic;
} tm_opts;

typedef struct {
    char id[48], file[96];
    int chunked, chunk, threads, channels, blocks;
    int generic;       /* the generic baseline (mode "generic"; chunked too): never chosen */
    int smem;          /* dynamic shared memory per block: Mamba-3, and the
                        * Mamba-1 generic's B/C stage; else 0 */
    const char *src;   /* the source text (owned by the Lua result) */
    tn_result cub;
    char *status;      /* NULL: fine so far; else why it was skipped */
    int compiled, verified;
    double err_g, err_s;
    double ms[TM_MAX_LIST * TM_MAX_LIST], min_ms[TM_MAX_LIST * TM_MAX_LIST];
    int timed[TM_MAX_LIST * TM_MAX_LIST];
} tm_cand;

typedef struct {
    char spec_name[128], arch[32], precision[16], target[16], key_spec[80], key_templates[80], generator[64];
    int E, N, R, XP, act_size, combine_threads, max_batch, max_seq_len;
    char model_arch[32];   /* "mamba1" | "mamba3_siso" */
    int m3, H, P, NP, off_x;   /* Mamba-3 SISO dims (m3 = 1) */
    double tol;
    char default_seqlens[256], default_batches[256];
    int gargs[TM_MAX_GARGS], ngargs;   /* the generic candidate's struct tune_dims */
    char generic_same_as[48];          /* the specialized candidate of its launch shape */
    tm_cand *cands;
    size_t ncands;
} tm_manifest;

static int tm_progress_tty;
static int tm_quiet;

static void tm_usage(FILE *fp)
{
    fputs("Usage: mamba-tune [OPTION]... SPEC.yaml   (also: mamba-gen tune SPEC.yaml [OPTION]...)\n"
          "Autotune the selective scan of the model in SPEC.yaml on this machine's GPU\n"
          "(mamba1: the scan kernels; mamba3_siso: the chunked SSM kernel): compile every\n"
          "candidate (chunk size x block size) with NVRTC, check it against the f64\n"
          "reference, time it, and store the best in the autotune cache that\n"
          "`scan.chunk_size: auto` reads at generation time.\n"
          "\n"
          "  --seqlen LIST        sequence lengths to time, comma-separated (default: the\n"
          "                       spec's max_seq_len, /4 and /16, those >= 16)\n"
          "  --batch LIST         batch sizes to time (default: 1 and max_batch)\n"
          "  --chunks LIST        chunk sizes to try (default 16,32,64,128,256)\n"
          "  --threads LIST       scan block sizes to try, multiples of 32 (default\n"
          "                       64,128,256,512; mamba3_siso: 128,256,512)\n"
          "  --no-sequential      do not time the sequential scan as a baseline (mamba1)\n"
          "  --no-generic         do not time the generic variant (model dims as kernel\n"
          "                       arguments) that the specialized kernels are compared with\n"
          "  --iters N            timed runs per point, median reported (default 20)\n"
          "  --warmup N           untimed runs first (default 3)\n"
          "  --device N           CUDA device (default 0)\n"
          "  --jobs N             parallel NVRTC compiles (default: CPUs, at most 8)\n"
          "  --cache-dir DIR      autotune cache (default: $MG_TUNE_CACHE, else\n"
          "                       $XDG_CACHE_HOME/mamba-gen, else ~/.cache/mamba-gen)\n"
          "  --no-cache           do not write the cache\n"
          "  --csv FILE           write every measurement as CSV (the sweep plot's input)\n"
          "  --compile-only       compile the candidates and stop (no GPU needed)\n"
          "  --arch sm_XY         architecture for --compile-only (default: the spec's target)\n"
          "  --emit DIR           also write the candidates' sources and manifest into DIR\n"
          "  --print-key          print the spec's cache key parts and exit (no GPU needed)\n"
          "  --templates DIR      use the templates in DIR instead of the built-in copy\n"
          "  --cuda-include DIR   CUDA headers for NVRTC (bf16/f16; default $CUDA_HOME/include,\n"
          "                       else " MG_CUDA_INCLUDE ")\n"
          "  -q, --quiet          no progress and no table\n"
          "  -h, --help           print this help and exit\n"
          "      --version        print version information and exit\n"
          "\n"
          "Exit status: 0 a best variant was found and stored (--compile-only: at least\n"
          "one candidate compiled); 1 none, or a spec, device or cache error; 2 usage.\n",
          fp);
}

static int tm_usage_error(const char *fmt, const char *arg)
{
    fputs("mamba-tune: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nTry 'mamba-tune --help' for more information.\n", stderr);
    return TM_USAGE;
}

/* "a,b,c" of integers in [lo, hi] into OUT (at most TM_MAX_LIST). */
static int tm_parse_list(const char *opt, const char *s, int lo, int hi, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || (*end && *end != ',') || *n == TM_MAX_LIST) {
            fprintf(stderr, "mamba-tune: %s '%s': expected up to %d comma-separated integers in %d..%d\n", opt, s,
                    TM_MAX_LIST, lo, hi);
            return -1;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "mamba-tune: %s '%s': trailing comma\n", opt, s);
            return -1;
        }
    }
    if (*n == 0) {
        fprintf(stderr, "mamba-tune: %s needs at least one value\n", opt);
        return -1;
    }
    return 0;
}

static int tm_parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    int n, v[TM_MAX_LIST];
    if (tm_parse_list(opt, s, lo, hi, v, &n) != 0)
        return -1;
    if (n != 1) {
        fprintf(stderr, "mamba-tune: %s takes one integer\n", opt);
        return -1;
    }
    *out = v[0];
    return 0;
}

static int tm_parse(int argc, char **argv, tm_opts *o)
{
    enum { O_SEQ = 256, O_BATCH, O_CHUNKS, O_THREADS, O_NOSEQ, O_NOGEN, O_ITERS, O_WARMUP, O_DEVICE, O_JOBS, O_CACHE,
           O_NOCACHE, O_CSV, O_COMPILE, O_ARCH, O_EMIT, O_KEY, O_TEMPLATES, O_INC, O_VERSION };
    static const struct option lo[] = {
        {"seqlen", required_argument, NULL, O_SEQ},      {"batch", required_argument, NULL, O_BATCH},
        {"chunks", required_argument, NULL, O_CHUNKS},   {"threads", required_argument, NULL, O_THREADS},
        {"no-sequential", no_argument, NULL, O_NOSEQ},   {"no-generic", no_argument, NULL, O_NOGEN},
        {"iters", required_argument, NULL, O_ITERS},
        {"warmup", required_argument, NULL, O_WARMUP},   {"device", required_argument, NULL, O_DEVICE},
        {"jobs", required_argument, NULL, O_JOBS},       {"cache-dir", required_argument, NULL, O_CACHE},
        {"no-cache", no_argument, NULL, O_NOCACHE},      {"csv", required_argument, NULL, O_CSV},
        {"compile-only", no_argument, NULL, O_COMPILE},  {"arch", required_argument, NULL, O_ARCH},
        {"emit", required_argument, NULL, O_EMIT},       {"print-key", no_argument, NULL, O_KEY},
        {"templates", required_argument, NULL, O_TEMPLATES}, {"cuda-include", required_argument, NULL, O_INC},
        {"quiet", no_argument, NULL, 'q'},               {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, O_VERSION},       {NULL, 0, NULL, 0},
    };
    int v[TM_MAX_LIST], n;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, ":qh", lo, NULL);
        if (c == -1)
            break;
        switch (c) {
        case O_SEQ:
            if (tm_parse_list("--seqlen", optarg, 1, 1048576, o->seqlens, &o->nseqlens) != 0)
                return TM_USAGE;
            break;
        case O_BATCH:
            if (tm_parse_list("--batch", optarg, 1, 65536, o->batches, &o->nbatches) != 0)
                return TM_USAGE;
            break;
        case O_CHUNKS:
            if (tm_parse_list("--chunks", optarg, 1, 4096, v, &n) != 0)
                return TM_USAGE;
            for (int i = 0; i < n; i++)
                if (v[i] != 16 && v[i] != 32 && v[i] != 64 && v[i] != 128 && v[i] != 256)
                    return tm_usage_error("--chunks '%s': chunk sizes are 16, 32, 64, 128 or 256", optarg);
            o->chunks = optarg;
            break;
        case O_THREADS:
            if (tm_parse_list("--threads", optarg, 32, 1024, v, &n) != 0)
                return TM_USAGE;
            for (int i = 0; i < n; i++)
                if (v[i] % 32)
                    return tm_usage_error("--threads '%s': block sizes are multiples of 32 (32..1024)", optarg);
            o->threads = optarg;
            break;
        case O_NOSEQ: o->no_sequential = 1; break;
        case O_NOGEN: o->no_generic = 1; break;
        case O_ITERS:
            if (tm_parse_int("--iters", optarg, 1, 100000, &o->iters) != 0)
                return TM_USAGE;
            break;
        case O_WARMUP:
            if (tm_parse_int("--warmup", optarg, 1, 100000, &o->warmup) != 0)
                return TM_USAGE;
            break;
        case O_DEVICE:
            if (tm_parse_int("--device", optarg, 0, 1024, &o->device) != 0)
                return TM_USAGE;
            break;
        case O_JOBS:
            if (tm_parse_int("--jobs", optarg, 1, 256, &o->jobs) != 0)
                return TM_USAGE;
            break;
        case O_CACHE: o->cache_dir = optarg; break;
        case O_NOCACHE: o->no_cache = 1; break;
        case O_CSV: o->csv = optarg; break;
        case O_COMPILE: o->compile_only = 1; break;
        case O_ARCH: o->arch = optarg; break;
        case O_EMIT: o->emit_dir = optarg; break;
        case O_KEY: o->print_key = 1; break;
        case O_TEMPLATES: o->templates = optarg; break;
        case O_INC: o->cuda_include = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'h': tm_usage(stdout); return TM_OK;
        case O_VERSION: printf("mamba-tune (mamba-gen) %s\n", MG_VERSION); return TM_OK;
        case ':': return tm_usage_error("option '%s' requires an argument", argv[optind - 1]);
        default:
            if (optopt) {
                char s[3] = {'-', (char)optopt, '\0'};
                return tm_usage_error("unknown option '%s'", s);
            }
            return tm_usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind == argc)
        return tm_usage_error("%s", "missing SPEC.yaml");
    if (argc - optind > 1)
        return tm_usage_error("unexpected argument '%s' (one spec per run)", argv[optind + 1]);
    o->spec = argv[optind];
    if (o->arch && !o->compile_only)
        return tm_usage_error("%s", "--arch is for --compile-only (a sweep compiles for the GPU it runs on)");
    if (o->arch) {
        int a;
        if (sscanf(o->arch, "sm_%d", &a) != 1 || a < 50)
            return tm_usage_error("--arch '%s': expected sm_XY, e.g. sm_90", o->arch);
    }
    return -1;
}

/* ------------------------------------------------------------------ manifest */

static int tm_read_manifest(const lh_result *r, tm_manifest *m, char **err)
{
    memset(m, 0, sizeof *m);
    if (r->nfiles == 0 || strcmp(r->files[0].path, "manifest.txt") != 0) {
        *err = strdup("internal error: the Lua side returned no manifest");
        return -1;
    }
    m->cands = calloc(r->nfiles, sizeof *m->cands);
    if (!m->cands) {
        *err = strdup("out of memory");
        return -1;
    }
    char *text = strdup(r->files[0].content);
    if (!text) {
        *err = strdup("out of memory");
        return -1;
    }
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char k[32];
        int off = 0;
        if (sscanf(line, "%31s %n", k, &off) != 1)
            continue;
        const char *v = line + off;
#define TM_STR(name, field) else if (strcmp(k, name) == 0) snprintf(m->field, sizeof m->field, "%s", v)
#define TM_INT(name, field) else if (strcmp(k, name) == 0) m->field = atoi(v)
        if (strcmp(k, "candidate") == 0) {
            tm_cand *c = &m->cands[m->ncands];
            char mode[16];
            c->smem = 0;
            if (sscanf(v, "%47s %15s %d %d %d %d %95s %d", c->id, mode, &c->chunk, &c->threads, &c->channels,
                       &c->blocks, c->file, &c->smem) < 7) {
                free(text);
                *err = strdup("internal error: bad candidate line in the manifest");
                return -1;
            }
            c->generic = strcmp(mode, "generic") == 0;   /* a chunked scan (both archs) */
            c->chunked = c->generic || strcmp(mode, "chunked") == 0;
            for (size_t i = 1; i < r->nfiles; i++)
                if (strcmp(r->files[i].path, c->file) == 0)
                    c->src = r->files[i].content;
            if (!c->src) {
                free(text);
                *err = strdup("internal error: a candidate's source is missing");
                return -1;
            }
            m->ncands++;
        }
        else if (strcmp(k, "generic_args") == 0) {
            /* NAME=VALUE ... : the ints of struct tune_dims, in order */
            const char *p = v;
            while (*p) {
                char name[32];
                int val, used = 0;
                if (sscanf(p, " %31[^= ]=%d%n", name, &val, &used) != 2 || m->ngargs == TM_MAX_GARGS) {
                    free(text);
                    *err = strdup("internal error: bad generic_args line in the manifest");
                    return -1;
                }
                m->gargs[m->ngargs++] = val;
                p += used;
                while (*p == ' ')
                    p++;
            }
        }
        TM_STR("generic_same_as", generic_same_as);
        else if (strcmp(k, "skipped") == 0) {
            if (!tm_quiet)
                fprintf(stderr, "mamba-tune: left out %s\n", v);
        }
        TM_STR("spec_name", spec_name);
        TM_STR("arch", model_arch);
        TM_INT("H", H);
        TM_INT("P", P);
        TM_INT("NP", NP);
        TM_INT("off_x", off_x);
        TM_STR("precision", precision);
        TM_STR("target", target);
        TM_STR("key_spec", key_spec);
        TM_STR("key_templates", key_templates);
        TM_STR("generator", generator);
        TM_STR("default_seqlens", default_seqlens);
        TM_STR("default_batches", default_batches);
        TM_INT("E", E);
        TM_INT("N", N);
        TM_INT("R", R);
        TM_INT("XP", XP);
        TM_INT("act_size", act_size);
        TM_INT("combine_threads", combine_threads);
        TM_INT("max_batch", max_batch);
        TM_INT("max_seq_len", max_seq_len);
        else if (strcmp(k, "tolerance") == 0) m->tol = strtod(v, NULL);
#undef TM_STR
#undef TM_INT
    }
    free(text);
    m->m3 = strcmp(m->model_arch, "mamba3_siso") == 0;
    if (m->m3 && (m->H <= 0 || m->P <= 0 || m->NP <= 0)) {
        *err = strdup("internal error: incomplete manifest (no Mamba-3 dimensions)");
        return -1;
    }
    for (size_t i = 0; i < m->ncands; i++)
        if (m->cands[i].generic && m->ngargs == 0) {
            *err = strdup("internal error: the generic candidate has no generic_args");
            return -1;
        }
    if (m->ncands == 0 || m->E <= 0 || m->N <= 0 || m->tol <= 0) {
        *err = strdup("internal error: incomplete manifest (no candidates or dimensions)");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ progress */

static void tm_progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* One status line: rewritten in place on a terminal, else one line each. */
static void tm_progress(const char *fmt, ...)
{
    if (tm_quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (tm_progress_tty) {
        fputs("\r\033[K", stderr);
        vfprintf(stderr, fmt, ap);
    } else {
        fputs("mamba-tune: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
    fflush(stderr);
}

static void tm_progress_end(void)
{
    if (!tm_quiet && tm_progress_tty)
        fputs("\r\033[K", stderr);
}

/* ------------------------------------------------------------------ compile */

typedef struct {
    tm_manifest *m;
    const char *arch, *include;
    size_t next, done;
    pthread_mutex_t mu;
} tm_pool;

static void *tm_compile_worker(void *p)
{
    tm_pool *pool = p;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        size_t i = pool->next++;
        pthread_mutex_unlock(&pool->mu);
        if (i >= pool->m->ncands)
            return NULL;
        tm_cand *c = &pool->m->cands[i];
        char *err = NULL;
        if (tn_compile(c->src, c->file, pool->arch, pool->include, &c->cub, &err) == 0) {
            c->compiled = 1;
        } else {
            const char *log = c->cub.log && *c->cub.log ? c->cub.log : "";
            size_t ll = strlen(log);
            c->status = malloc(strlen(err) + ll + 64);
            if (c->status)
                sprintf(c->status, "compile: %s%s%.*s", err, ll ? ": " : "", (int)(ll > 400 ? 400 : ll), log);
            for (char *s = c->status; s && *s; s++)
                if (*s == '\n' || *s == '\r')
                    *s = ' ';
            free(err);
        }
        pthread_mutex_lock(&pool->mu);
        size_t done = ++pool->done;
        pthread_mutex_unlock(&pool->mu);
        tm_progress("compiling for %s: %zu/%zu", pool->arch, done, pool->m->ncands);
    }
}

static void tm_compile_all(tm_manifest *m, const char *arch, const char *include, int jobs)
{
    tm_pool pool = {m, arch, include, 0, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th[64];
    int n = jobs < 64 ? jobs : 64, started = 0;
    if ((size_t)n > m->ncands)
        n = (int)m->ncands;
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, tm_compile_worker, &pool) == 0)
            started++;
    if (started == 0)
        tm_compile_worker(&pool);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    tm_progress_end();
}

/* ------------------------------------------------------------------ output */

static const char *tm_mode(const tm_cand *c)
{
    return c->generic ? "generic" : c->chunked ? "chunked" : "sequential";
}

/* Per shape S: the fastest verified specialized chunked candidate (NULL if
 * none was timed there) and the generic's time against it, *ratio =
 * generic ms / specialized ms (NAN when either is missing). */
static const tm_cand *tm_spec_best_at(const tm_manifest *m, int s, const tm_cand **generic, double *ratio)
{
    const tm_cand *best = NULL;
    *generic = NULL;
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *c = &m->cands[i];
        if (c->generic)
            *generic = c;
        else if (c->chunked && c->verified && c->timed[s] && (!best || c->ms[s] < best->ms[s]))
            best = c;
    }
    *ratio = (best && *generic && (*generic)->timed[s] && best->ms[s] > 0) ? (*generic)->ms[s] / best->ms[s] : NAN;
    return best;
}

static void tm_iso_time(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm g;
    gmtime_r(&t, &g);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &g);
}

static const char *tm_num(char *buf, size_t n, double v)
{
    if (!isfinite(v))
        snprintf(buf, n, "null");
    else
        snprintf(buf, n, "%.6g", v);
    return buf;
}

static int tm_write_csv(const char *path, const tm_manifest *m, const tg_device *dev, const tm_opts *o)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "mamba-tune: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "model,precision,gpu,mode,chunk,threads,channels,batch,seqlen,median_ms,min_ms,verified,status,"
               "speedup_vs_generic\n");
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *c = &m->cands[i];
        for (int s = 0; s < o->nseqlens * o->nbatches; s++) {
            /* speedup_vs_generic: generic ms / this row's ms; on the generic's
             * own rows, the specialized best vs generic of the shape */
            const tm_cand *g;
            double best_ratio, sp = NAN;
            tm_spec_best_at(m, s, &g, &best_ratio);
            if (c->generic)
                sp = best_ratio;
            else if (g && g->timed[s] && c->timed[s] && c->ms[s] > 0)
                sp = g->ms[s] / c->ms[s];
            int b = o->batches[s % o->nbatches], t = o->seqlens[s / o->nbatches];
            char st[200];
            snprintf(st, sizeof st, "%s", c->timed[s] ? "ok" : c->status ? c->status : "not run");
            for (char *p = st; *p; p++)
                if (*p == ',' || *p == '"')
                    *p = ';';
            fprintf(f, "%s,%s,%s,%s,%d,%d,%d,%d,%d,", m->spec_name, m->precision, dev->name, tm_mode(c), c->chunk,
                    c->threads, c->channels, b, t);
            if (c->timed[s])
                fprintf(f, "%.6f,%.6f,", c->ms[s], c->min_ms[s]);
            else
                fprintf(f, ",,");
            fprintf(f, "%d,%s,", c->verified, st);
            if (isfinite(sp))
                fprintf(f, "%.4f", sp);
            fputc('\n', f);
        }
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "mamba-tune: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static char *tm_entry_json(const tm_manifest *m, const tm_opts *o, const tg_device *dev, const char *nvrtc,
                           const tc_key_parts *kp, const char *key, const tm_cand *best, double score,
                           const tm_cand *best_seq)
{
    tc_buf b = {NULL, 0, 0, 0};
    char created[32], n1[32], n2[32];
    tm_iso_time(created, sizeof created);
    tc_buf_printf(&b, "{\n  \"format\": \"%s\",\n  \"key\": \"%s\",\n  \"key_parts\": {\n", TC_FORMAT, key);
    const char *names[] = {"spec", "spec_name", "generator", "templates", "gpu", "cc", "driver", "nvrtc"};
    const char *vals[] = {kp->spec, kp->spec_name, kp->generator, kp->templates, kp->gpu, kp->cc, kp->driver, kp->nvrtc};
    for (int i = 0; i < 8; i++) {
        tc_buf_printf(&b, "    \"%s\": ", names[i]);
        tc_buf_json_str(&b, vals[i]);
        tc_buf_printf(&b, "%s\n", i < 7 ? "," : "");
    }
    tc_buf_printf(&b, "  },\n  \"created\": \"%s\",\n  \"arch\": \"%s\",\n  \"runtime\": ", created, dev->arch);
    tc_buf_json_str(&b, dev->runtime);
    tc_buf_printf(&b, ",\n  \"nvrtc_version\": ");
    tc_buf_json_str(&b, nvrtc);
    tc_buf_printf(&b, ",\n  \"spec_path\": ");
    tc_buf_json_str(&b, o->spec);
    tc_buf_printf(&b, ",\n  \"iters\": %d,\n  \"shapes\": [", o->iters);
    for (int s = 0; s < o->nseqlens * o->nbatches; s++)
        tc_buf_printf(&b, "%s{\"batch\": %d, \"seqlen\": %d}", s ? ", " : "", o->batches[s % o->nbatches],
                      o->seqlens[s / o->nbatches]);
    tc_buf_printf(&b, "],\n  \"best\": {\"chunk_size\": %d, \"scan_threads\": %d, \"score\": %s},\n", best->chunk,
                  best->threads, tm_num(n1, sizeof n1, score));
    if (best_seq)
        tc_buf_printf(&b, "  \"best_sequential\": {\"scan_threads\": %d},\n", best_seq->threads);
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *g = &m->cands[i];
        if (!g->generic)
            continue;
        /* specialized best vs generic per shape (null: not measured) */
        tc_buf_printf(&b, "  \"generic\": {\"same_as\": ");
        tc_buf_json_str(&b, m->generic_same_as);
        tc_buf_printf(&b, ", \"chunk_size\": %d, \"scan_threads\": %d, \"speedup\": [", g->chunk, g->threads);
        for (int s = 0; s < o->nseqlens * o->nbatches; s++) {
            const tm_cand *gg;
            double r;
            tm_spec_best_at(m, s, &gg, &r);
            tc_buf_printf(&b, "%s%s", s ? ", " : "", tm_num(n1, sizeof n1, r));
        }
        tc_buf_printf(&b, "]},\n");
    }
    tc_buf_printf(&b, "  \"results\": [\n");
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *c = &m->cands[i];
        tc_buf_printf(&b, "    {\"id\": \"%s\", \"mode\": \"%s\", \"chunk_size\": %d, \"scan_threads\": %d, "
                          "\"verified\": %s, \"err_g\": %s, \"err_state\": %s, \"status\": ",
                      c->id, tm_mode(c), c->chunk, c->threads,
                      c->verified ? "true" : "false", tm_num(n1, sizeof n1, c->err_g),
                      tm_num(n2, sizeof n2, c->err_s));
        tc_buf_json_str(&b, c->status ? c->status : "ok");
        tc_buf_printf(&b, ", \"median_ms\": [");
        for (int s = 0; s < o->nseqlens * o->nbatches; s++)
            tc_buf_printf(&b, "%s%s", s ? ", " : "", c->timed[s] ? tm_num(n1, sizeof n1, c->ms[s]) : "null");
        tc_buf_printf(&b, "]}%s\n", i + 1 < m->ncands ? "," : "");
    }
    tc_buf_printf(&b, "  ]\n}\n");
    return tc_buf_take(&b, NULL);
}

/* ------------------------------------------------------------------ main */

static void tm_manifest_free(tm_manifest *m)
{
    for (size_t i = 0; i < m->ncands; i++) {
        tn_result_free(&m->cands[i].cub);
        free(m->cands[i].status);
    }
    free(m->cands);
}

static void tm_set_status(tm_cand *c, char *msg)
{
    free(c->status);
    c->status = msg ? msg : strdup("failed");
}

/* Runs the Lua side: validate, derive, render the candidates. */
static int tm_sources(const tm_opts *o, lh_host **hp, lh_result *r)
{
    char *err = NULL;
    lh_options lo = {o->templates, 0, NULL, NULL}; /* no tune cache: `auto` derives as the default */
    lh_host *h = lh_new(&lo, &err);
    if (!h) {
        fprintf(stderr, "%s\n", err);
        free(err);
        return TM_USAGE;
    }
    *hp = h;
    char hash[SHA256_HEX_SIZE];
    if (sy_load(lh_state(h), o->spec, hash, &err) != 0) {
        fprintf(stderr, "%s\n", err);
        free(err);
        return TM_FAIL;
    }
    const char *opts[10];
    int n = 0;
    if (o->chunks) {
        opts[n++] = "chunks";
        opts[n++] = o->chunks;
    }
    if (o->threads) {
        opts[n++] = "threads";
        opts[n++] = o->threads;
    }
    if (o->no_sequential) {
        opts[n++] = "sequential";
        opts[n++] = "0";
    }
    if (o->no_generic) {
        opts[n++] = "generic";
        opts[n++] = "0";
    }
    opts[n] = NULL;
    lh_args a = {"tune-sources", o->spec, hash, opts};
    if (lh_run_main(h, &a, r) != LH_OK) {
        fputs(r->message, stderr);
        return r->status == LH_SPEC_ERRORS ? TM_FAIL : TM_USAGE;
    }
    return TM_OK;
}

int main(int argc, char **argv)
{
    tm_opts o;
    memset(&o, 0, sizeof o);
    o.iters = 20;
    o.warmup = 3;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.jobs = ncpu > 8 ? 8 : ncpu > 0 ? (int)ncpu : 1;
    int status = tm_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    tm_quiet = o.quiet;
    tm_progress_tty = isatty(STDERR_FILENO);

    lh_host *h = NULL;
    lh_result r;
    memset(&r, 0, sizeof r);
    status = tm_sources(&o, &h, &r);
    tm_manifest m;
    memset(&m, 0, sizeof m);
    char *err = NULL;
    if (status == TM_OK && tm_read_manifest(&r, &m, &err) != 0) {
        fprintf(stderr, "mamba-tune: %s\n", err);
        free(err);
        status = TM_USAGE;
    }
    if (status != TM_OK)
        goto done;

    if (o.print_key) {
        printf("format %s\nspec %s\nspec_name %s\ngenerator %s\ntemplates %s\n", TC_FORMAT, m.key_spec,
               m.spec_name, m.generator, m.key_templates);
        goto done;
    }
    if (o.emit_dir) {
        od_file *files = calloc(r.nfiles, sizeof *files);
        for (size_t i = 0; files && i < r.nfiles; i++) {
            files[i].path = r.files[i].path;
            files[i].data = r.files[i].content;
            files[i].size = r.files[i].size;
        }
        if (!files || od_write(o.emit_dir, files, r.nfiles, &err) != 0) {
            fprintf(stderr, "mamba-tune: %s\n", files ? err : "out of memory");
            free(err);
            free(files);
            status = TM_FAIL;
            goto done;
        }
        free(files);
    }
    /* Shapes: the options, else the spec's defaults (from the manifest). */
    if (o.nseqlens == 0 && tm_parse_list("default seqlens", m.default_seqlens, 1, 1048576, o.seqlens, &o.nseqlens))
        o.nseqlens = 0;
    if (o.nbatches == 0 && tm_parse_list("default batches", m.default_batches, 1, 65536, o.batches, &o.nbatches))
        o.nbatches = 0;

    char nvrtc[32];
    tn_version(nvrtc, sizeof nvrtc);
    tg_device dev;
    memset(&dev, 0, sizeof dev);
    const char *arch = o.arch ? o.arch : m.target;
    if (!o.compile_only) {
        if (tg_open(o.device, &dev, &err) != 0) {
            fprintf(stderr, "mamba-tune: %s\n", err);
            free(err);
            status = TM_FAIL;
            goto done;
        }
        arch = dev.arch;
    }
    if (!tn_arch_supported(arch)) {
        fprintf(stderr, "mamba-tune: NVRTC %s cannot compile for %s\n", nvrtc, arch);
        status = TM_FAIL;
        goto done;
    }
    const char *cuda_home = getenv("CUDA_HOME");
    char incbuf[4096];
    const char *include = o.cuda_include;
    if (!include && cuda_home && *cuda_home) {
        snprintf(incbuf, sizeof incbuf, "%s/include", cuda_home);
        include = incbuf;
    }
    if (!include)
        include = MG_CUDA_INCLUDE;
    if (!o.quiet)
        fprintf(stderr, "mamba-tune: %s (%s, %s): %zu candidates for %s%s%s, NVRTC %s\n", m.spec_name,
                m.precision, o.spec, m.ncands, arch, o.compile_only ? "" : " on ",
                o.compile_only ? "" : dev.name, nvrtc);
    tm_compile_all(&m, arch, include, o.jobs);
    size_t ncompiled = 0;
    for (size_t i = 0; i < m.ncands; i++) {
        ncompiled += m.cands[i].compiled;
        if (!m.cands[i].compiled)
            fprintf(stderr, "mamba-tune: %s: %s\n", m.cands[i].id, m.cands[i].status ? m.cands[i].status : "?");
    }
    if (o.compile_only) {
        printf("compiled %zu of %zu candidates for %s\n", ncompiled, m.ncands, arch);
        for (size_t i = 0; i < m.ncands; i++)
            printf("%-12s %-10s chunk %3d threads %4d: %s (%zu bytes)\n", m.cands[i].id,
                   tm_mode(&m.cands[i]), m.cands[i].chunk, m.cands[i].threads,
                   m.cands[i].compiled ? "compiled" : "FAILED", m.cands[i].cub.size);
        status = ncompiled > 0 ? TM_OK : TM_FAIL;
        goto done;
    }

    /* ---- on the GPU ---- */
    int maxb = 2, maxt = 805, minchunk = 256;  /* the verification shape: 2 x 805 */
    const int vb = 2, vt = 805;                /* several chunks of every size + a partial one */
    for (int i = 0; i < o.nbatches; i++)
        maxb = o.batches[i] > maxb ? o.batches[i] : maxb;
    for (int i = 0; i < o.nseqlens; i++)
        maxt = o.seqlens[i] > maxt ? o.seqlens[i] : maxt;
    for (size_t i = 0; i < m.ncands; i++)
        if (m.cands[i].chunked && m.cands[i].chunk < minchunk)
            minchunk = m.cands[i].chunk;
    tg_dims dims = {m.E, m.N, m.R, m.XP, m.act_size, strcmp(m.precision, "bf16") == 0, m.combine_threads, m.tol,
                    m.m3, m.H, m.P, m.NP, m.off_x};
    tm_progress("preparing inputs and the f64 reference (%dx%d)", vb, vt);
    tg_data *data = tg_data_new(&dims, maxb, maxt, minchunk, vb, vt, 20240601ULL, &err);
    tm_progress_end();
    if (!data) {
        fprintf(stderr, "mamba-tune: %s\n", err);
        free(err);
        status = TM_FAIL;
        goto done;
    }
    const int nshapes = o.nseqlens * o.nbatches;
    int lost = 0;
    for (size_t i = 0; i < m.ncands; i++) {
        tm_cand *c = &m.cands[i];
        if (!c->compiled)
            continue;
        if (lost) {
            tm_set_status(c, strdup("not run: the CUDA context was lost by an earlier candidate"));
            continue;
        }
        tg_cand tc = {c->chunked, c->chunk, c->threads, c->blocks, c->smem, m.m3,
                      c->generic ? m.gargs : NULL, c->generic ? m.ngargs : 0};
        tm_progress("[%zu/%zu] %s: load and verify", i + 1, m.ncands, c->id);
        tg_kernels *k = tg_load(c->cub.cubin, &tc, &err);
        if (!k) {
            tm_set_status(c, err);
            err = NULL;
            lost = !tg_context_ok();
            continue;
        }
        int vr = tg_verify(data, k, &tc, &c->err_g, &c->err_s, &err);
        if (vr != 0) {
            char *msg = err;
            err = NULL;
            if (msg) {
                char *full = malloc(strlen(msg) + 16);
                if (full)
                    sprintf(full, "%s: %s", vr > 0 ? "verify" : "launch", msg);
                free(msg);
                msg = full;
            }
            tm_set_status(c, msg);
            tg_unload(k);
            lost = !tg_context_ok();
            continue;
        }
        c->verified = 1;
        for (int s = 0; s < nshapes; s++) {
            int b = o.batches[s % o.nbatches], t = o.seqlens[s / o.nbatches];
            tm_progress("[%zu/%zu] %s: timing %dx%d", i + 1, m.ncands, c->id, b, t);
            if (tg_time(data, k, &tc, b, t, o.warmup, o.iters, &c->ms[s], &c->min_ms[s], &err) == 0) {
                c->timed[s] = 1;
            } else {
                char *full = malloc(strlen(err) + 64);
                if (full)
                    sprintf(full, "time %dx%d: %s", b, t, err);
                free(err);
                err = NULL;
                tm_set_status(c, full);
                if (!tg_context_ok()) {
                    lost = 1;
                    break;
                }
            }
        }
        tg_unload(k);
    }
    tm_progress_end();
    tg_data_free(data);

    /* ---- the best chunked variant: the smallest geometric mean over the
     * shapes of its time relative to the fastest chunked variant there ---- */
    double best_at[TM_MAX_LIST * TM_MAX_LIST];
    for (int s = 0; s < nshapes; s++) {
        best_at[s] = INFINITY;
        for (size_t i = 0; i < m.ncands; i++)
            if (m.cands[i].chunked && !m.cands[i].generic && m.cands[i].timed[s] && m.cands[i].ms[s] < best_at[s])
                best_at[s] = m.cands[i].ms[s];
    }
    const tm_cand *best = NULL, *best_seq = NULL;
    double best_score = INFINITY, best_seq_score = INFINITY;
    for (size_t i = 0; i < m.ncands; i++) {
        const tm_cand *c = &m.cands[i];
        int all = c->verified && !c->generic;   /* the generic baseline is never a result */
        double lsum = 0;
        for (int s = 0; s < nshapes && all; s++) {
            all = c->timed[s] && c->ms[s] > 0;
            if (all)
                lsum += log(c->ms[s] / (isfinite(best_at[s]) ? best_at[s] : c->ms[s]));
        }
        if (!all)
            continue;
        double score = exp(lsum / nshapes);
        if (c->chunked && score < best_score) {
            best_score = score;
            best = c;
        } else if (!c->chunked && score < best_seq_score) {
            best_seq_score = score;
            best_seq = c;
        }
    }

    if (!o.quiet) {
        printf("%s on %s (sm %s, driver %s, NVRTC %s): median ms per shape (batch x seqlen)\n", m.spec_name,
               dev.name, dev.cc, dev.driver, nvrtc);
        printf("%-12s", "candidate");
        for (int s = 0; s < nshapes; s++) {
            char hdr[32];
            snprintf(hdr, sizeof hdr, "%dx%d", o.batches[s % o.nbatches], o.seqlens[s / o.nbatches]);
            printf(" %11s", hdr);
        }
        printf("  status\n");
        for (size_t i = 0; i < m.ncands; i++) {
            const tm_cand *c = &m.cands[i];
            printf("%-12s", c->id);
            for (int s = 0; s < nshapes; s++)
                c->timed[s] ? printf(" %11.4f", c->ms[s]) : printf(" %11s", "-");
            printf("  %s%s\n", c->status ? c->status : "ok", c == best ? "  <- best" : "");
        }
    }
    /* the speedup of specialization: per shape, the fastest specialized
     * chunked candidate against the generic one (printed also with -q) */
    for (size_t i = 0; i < m.ncands; i++) {
        const tm_cand *g = &m.cands[i];
        if (!g->generic)
            continue;
        const tm_cand *same = NULL;
        for (size_t j = 0; j < m.ncands; j++)
            if (strcmp(m.cands[j].id, m.generic_same_as) == 0)
                same = &m.cands[j];
        for (int s = 0; s < nshapes; s++) {
            const tm_cand *gg;
            double ratio;
            const tm_cand *sb = tm_spec_best_at(&m, s, &gg, &ratio);
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", o.batches[s % o.nbatches], o.seqlens[s / o.nbatches]);
            if (isfinite(ratio)) {
                printf("specialized best vs generic: %.2fx at %s (%s %.4f ms, generic %.4f ms", ratio, shape, sb->id,
                       sb->ms[s], g->ms[s]);
                if (same && same->verified && same->timed[s] && same->ms[s] > 0)
                    printf("; same launch shape %s: %.2fx", same->id, g->ms[s] / same->ms[s]);
                printf(")\n");
            } else {
                printf("specialized best vs generic: n/a at %s (%s)\n", shape,
                       !g->timed[s] ? (g->status ? g->status : "generic not run") : "no specialized chunked time");
            }
        }
    }
    if (o.csv && tm_write_csv(o.csv, &m, &dev, &o) != 0)
        status = TM_FAIL;
    if (!best) {
        fprintf(stderr, "mamba-tune: no chunked candidate was verified and timed at every shape; "
                        "the cache is not written\n");
        status = TM_FAIL;
        goto done;
    }
    printf("best: chunk_size %d, scan_threads %d (%.3fx the fastest chunked variant per shape, geometric mean)\n",
           best->chunk, best->threads, best_score);
    if (!o.no_cache) {
        char *dir = tc_dir(o.cache_dir, &err);
        if (!dir) {
            fprintf(stderr, "mamba-tune: %s\n", err);
            free(err);
            status = TM_FAIL;
            goto done;
        }
        tc_key_parts kp = {m.key_spec, m.spec_name, m.generator, m.key_templates, dev.name, dev.cc, dev.driver, nvrtc};
        char key[SHA256_HEX_SIZE];
        tc_key(&kp, key);
        char *json = tm_entry_json(&m, &o, &dev, nvrtc, &kp, key, best, best_score, best_seq);
        char *name = tc_file_name(&kp);
        if (!json || !name) {
            fputs("mamba-tune: out of memory\n", stderr);
            status = TM_FAIL;
        } else if (tc_write_atomic(dir, name, json, strlen(json), &err) != 0) {
            fprintf(stderr, "mamba-tune: %s\n", err);
            free(err);
            status = TM_FAIL;
        } else {
            printf("cache: %s/%s\n", dir, name);
        }
        free(json);
        free(name);
        free(dir);
    }

done:
    tm_manifest_free(&m);
    lh_result_free(&r);
    lh_free(h);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("mamba-tune: error writing to standard output");
        if (status == TM_OK)
            status = TM_FAIL;
    }
    return status;
}
