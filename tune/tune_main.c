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
 * `specialized best vs generic: X.XXx` and written to the CSV. Exit status:
 * 0 when a best variant was found (with --compile-only: when at least one
 * candidate compiled), 1 when none, or on a spec, device or cache error;
 * 2 usage errors. This file: the options and main(), which runs the steps
 * of tune_manifest.c, tune_sweep.c and tune_report.c in order (tune.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/cli_util.h"
#include "gen/lua_host.h"
#include "gen/outdir.h"
#include "gen/spec_yaml.h"
#include "gen/tune_cache.h"
#include "tune.h"

#ifndef MG_VERSION
#error "MG_VERSION must be defined (the generator version string)"
#endif
#ifndef MG_CUDA_INCLUDE
#define MG_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

static void tm_usage(FILE *fp)
{
    fputs("Usage: mamba-tune [OPTION]... SPEC.yaml   (also: mamba-gen tune SPEC.yaml [OPTION]...)\n"
          "Autotune the selective scan of the model in SPEC.yaml on this machine's GPU\n"
          "(mamba1: the scan kernels; mamba3_siso: the chunked SSM kernel): compile every\n"
          "candidate (chunk size x block size, for mamba1 also x lanes per channel) with\n"
          "NVRTC, check it against the f64 reference, time it, and store the best in the\n"
          "autotune cache that `scan.chunk_size: auto` reads at generation time.\n"
          "\n"
          "  --seqlen LIST        sequence lengths to time, comma-separated (default: the\n"
          "                       spec's max_seq_len, /4 and /16, those >= 16)\n"
          "  --batch LIST         batch sizes to time (default: 1 and max_batch)\n"
          "  --chunks LIST        chunk sizes to try (default 16,32,64,128,256)\n"
          "  --threads LIST       scan block sizes to try, multiples of 32 (default\n"
          "                       64,128,256,512; mamba3_siso: 128,256,512)\n"
          "  --lanes LIST         mamba1: threads sharing one channel's state, powers of\n"
          "                       two (default: the spec's own count x 1, 2, 4, those\n"
          "                       leaving 1..16 states per thread)\n"
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

/* A usage error: the message, the --help hint, TM_USAGE. */
#define tm_usage_error(fmt, arg) cu_usage_error("mamba-tune", TM_USAGE, fmt, arg)

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
    enum { O_SEQ = 256, O_BATCH, O_CHUNKS, O_THREADS, O_LANES, O_NOSEQ, O_NOGEN, O_ITERS, O_WARMUP, O_DEVICE, O_JOBS, O_CACHE,
           O_NOCACHE, O_CSV, O_COMPILE, O_ARCH, O_EMIT, O_KEY, O_TEMPLATES, O_INC, O_VERSION };
    static const struct option lo[] = {
        {"seqlen", required_argument, NULL, O_SEQ},      {"batch", required_argument, NULL, O_BATCH},
        {"chunks", required_argument, NULL, O_CHUNKS},   {"threads", required_argument, NULL, O_THREADS},
        {"lanes", required_argument, NULL, O_LANES},
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
        case O_LANES:
            if (tm_parse_list("--lanes", optarg, 1, 32, v, &n) != 0)
                return TM_USAGE;
            for (int i = 0; i < n; i++)
                if (v[i] & (v[i] - 1))
                    return tm_usage_error("--lanes '%s': lanes per channel are powers of two (1..32)", optarg);
            o->lanes = optarg;   /* the d_state bounds are checked on the Lua side, which knows N */
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
        default: return cu_getopt_error("mamba-tune", TM_USAGE, c, argv);
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

/* ------------------------------------------------------------------ the Lua side */

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
    const char *opts[12];
    int n = 0;
    if (o->chunks) {
        opts[n++] = "chunks";
        opts[n++] = o->chunks;
    }
    if (o->threads) {
        opts[n++] = "threads";
        opts[n++] = o->threads;
    }
    if (o->lanes) {
        opts[n++] = "lanes";
        opts[n++] = o->lanes;
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

/* ------------------------------------------------------------------ main */

/* One run: the Lua side's result (the candidates' sources) and its
 * manifest, then the compile target and the device. */
typedef struct {
    lh_host *h;
    lh_result r;
    tm_manifest m;
    char nvrtc[32];
    tg_device dev;
    const char *arch, *include;
    char incbuf[4096];
} tm_run;

static void tm_defaults(tm_opts *o)
{
    memset(o, 0, sizeof *o);
    o->iters = 20;
    o->warmup = 3;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->jobs = ncpu > 8 ? 8 : ncpu > 0 ? (int)ncpu : 1;
}

/* The candidates from the Lua side and their manifest. */
static int tm_load(const tm_opts *o, tm_run *run)
{
    int status = tm_sources(o, &run->h, &run->r);
    char *err = NULL;
    if (status == TM_OK && tm_read_manifest(&run->r, &run->m, o->quiet, &err) != 0) {
        fprintf(stderr, "mamba-tune: %s\n", err);
        free(err);
        status = TM_USAGE;
    }
    return status;
}

static void tm_print_key(const tm_manifest *m)
{
    printf("format %s\nspec %s\nspec_name %s\ngenerator %s\ntemplates %s\n", TC_FORMAT, m->key_spec,
           m->spec_name, m->generator, m->key_templates);
}

/* --emit DIR: the candidates' sources and the manifest, as Lua made them. */
static int tm_emit(const tm_opts *o, const lh_result *r)
{
    char *err = NULL;
    od_file *files = calloc(r->nfiles, sizeof *files);
    for (size_t i = 0; files && i < r->nfiles; i++) {
        files[i].path = r->files[i].path;
        files[i].data = r->files[i].content;
        files[i].size = r->files[i].size;
    }
    if (!files || od_write(o->emit_dir, files, r->nfiles, &err) != 0) {
        fprintf(stderr, "mamba-tune: %s\n", files ? err : "out of memory");
        free(err);
        free(files);
        return TM_FAIL;
    }
    free(files);
    return TM_OK;
}

/* Shapes: the options, else the spec's defaults (from the manifest). */
static void tm_default_shapes(tm_opts *o, const tm_manifest *m)
{
    if (o->nseqlens == 0 && tm_parse_list("default seqlens", m->default_seqlens, 1, 1048576, o->seqlens, &o->nseqlens))
        o->nseqlens = 0;
    if (o->nbatches == 0 && tm_parse_list("default batches", m->default_batches, 1, 65536, o->batches, &o->nbatches))
        o->nbatches = 0;
}

/* What to compile for: the GPU's architecture (opened here), or --arch /
 * the spec's target with --compile-only; the CUDA headers for NVRTC. */
static int tm_target(const tm_opts *o, tm_run *run)
{
    char *err = NULL;
    tn_version(run->nvrtc, sizeof run->nvrtc);
    run->arch = o->arch ? o->arch : run->m.target;
    if (!o->compile_only) {
        if (tg_open(o->device, &run->dev, &err) != 0) {
            fprintf(stderr, "mamba-tune: %s\n", err);
            free(err);
            return TM_FAIL;
        }
        run->arch = run->dev.arch;
    }
    if (!tn_arch_supported(run->arch)) {
        fprintf(stderr, "mamba-tune: NVRTC %s cannot compile for %s\n", run->nvrtc, run->arch);
        return TM_FAIL;
    }
    const char *cuda_home = getenv("CUDA_HOME");
    run->include = o->cuda_include;
    if (!run->include && cuda_home && *cuda_home) {
        snprintf(run->incbuf, sizeof run->incbuf, "%s/include", cuda_home);
        run->include = run->incbuf;
    }
    if (!run->include)
        run->include = MG_CUDA_INCLUDE;
    return TM_OK;
}

/* Compiles every candidate; names those that fail. --compile-only ends
 * here with the list (TM_OK when one compiled); else -1: go on. */
static int tm_compile(const tm_opts *o, tm_run *run)
{
    tm_manifest *m = &run->m;
    if (!o->quiet)
        fprintf(stderr, "mamba-tune: %s (%s, %s): %zu candidates for %s%s%s, NVRTC %s\n", m->spec_name,
                m->precision, o->spec, m->ncands, run->arch, o->compile_only ? "" : " on ",
                o->compile_only ? "" : run->dev.name, run->nvrtc);
    tm_compile_all(m, run->arch, run->include, o->jobs);
    size_t ncompiled = 0;
    for (size_t i = 0; i < m->ncands; i++) {
        ncompiled += m->cands[i].compiled;
        if (!m->cands[i].compiled)
            fprintf(stderr, "mamba-tune: %s: %s\n", m->cands[i].id, m->cands[i].status ? m->cands[i].status : "?");
    }
    if (!o->compile_only)
        return -1;
    printf("compiled %zu of %zu candidates for %s\n", ncompiled, m->ncands, run->arch);
    for (size_t i = 0; i < m->ncands; i++)
        printf("%-12s %-10s chunk %3d threads %4d: %s (%zu bytes)\n", m->cands[i].id,
               tm_mode(&m->cands[i]), m->cands[i].chunk, m->cands[i].threads,
               m->cands[i].compiled ? "compiled" : "FAILED", m->cands[i].cub.size);
    return ncompiled > 0 ? TM_OK : TM_FAIL;
}

/* After the sweep: the table, the comparison with the generic, the CSV,
 * and the best variant into the cache. */
static int tm_report(const tm_opts *o, tm_run *run)
{
    const tm_manifest *m = &run->m;
    int status = TM_OK;
    double score;
    const tm_cand *best_seq;
    const tm_cand *best = tm_choose_best(m, o->nseqlens * o->nbatches, &score, &best_seq);
    if (!o->quiet)
        tm_print_table(o, m, &run->dev, run->nvrtc, best);
    tm_print_generic(o, m);
    if (o->csv && tm_write_csv(o->csv, m, &run->dev, o) != 0)
        status = TM_FAIL;
    if (!best) {
        fprintf(stderr, "mamba-tune: no chunked candidate was verified and timed at every shape; "
                        "the cache is not written\n");
        return TM_FAIL;
    }
    if (m->m3)
        printf("best: chunk_size %d, scan_threads %d (%.3fx the fastest chunked variant per shape, geometric mean)\n",
               best->chunk, best->threads, score);
    else
        printf("best: chunk_size %d, scan_threads %d, scan_lanes %d (%.3fx the fastest chunked variant per shape, "
               "geometric mean)\n", best->chunk, best->threads, best->threads / best->channels, score);
    if (!o->no_cache && tm_write_cache(o, m, &run->dev, run->nvrtc, best, score, best_seq) != 0)
        status = TM_FAIL;
    return status;
}

/* The sweep proper, once the candidates are known. */
static int tm_tune(tm_opts *o, tm_run *run)
{
    int status;
    if (o->emit_dir && (status = tm_emit(o, &run->r)) != TM_OK)
        return status;
    tm_default_shapes(o, &run->m);
    if ((status = tm_target(o, run)) != TM_OK)
        return status;
    if ((status = tm_compile(o, run)) >= 0)
        return status;
    if ((status = tm_sweep(o, &run->m)) != TM_OK)
        return status;
    return tm_report(o, run);
}

int main(int argc, char **argv)
{
    tm_opts o;
    tm_defaults(&o);
    int status = tm_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    tm_progress_setup(o.quiet);
    tm_run run;
    memset(&run, 0, sizeof run);
    status = tm_load(&o, &run);
    if (status == TM_OK && o.print_key)
        tm_print_key(&run.m);
    else if (status == TM_OK)
        status = tm_tune(&o, &run);
    tm_manifest_free(&run.m);
    lh_result_free(&run.r);
    lh_free(run.h);
    return cu_finish_stdout("mamba-tune", status);   /* a failed write: TM_FAIL */
}
