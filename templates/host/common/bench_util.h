/* bench_util.h: what the bench programs of every arch share (included
 * once by NAME_bench.c, after model_alias.h, mg_bench.h, mg_cuda.h and
 * mg_rng.h): the CSV file and the ceilings the rows are quoted against,
 * errors that end the program, random device buffers, one row of the
 * report (the program defines WHAT_WIDTH, the width of its first column),
 * the command line. */
static FILE *csv;
static mg_ceilings ceil_;
static double gemm_ceiling_tflops;   /* the GEMM rate of this spec's storage dtype */

static void die(const char *what, mg_status s)
{
    fprintf(stderr, MODEL_NAME "_bench: %s: %s: %s\n", what, mg_status_name(s), mg_last_error());
    exit(1);
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    mg_status s = mg_dev_alloc(&p, bytes ? bytes : 4, "bench buffer");
    if (s != MG_OK) die("alloc", s);
    return p;
}

/* Random device data (never zeros: they would flatter the timings). */
static float *drandom(size_t n, uint64_t seed, float lo, float hi)
{
    float *h = malloc(n * sizeof *h), *d = dalloc(n * sizeof *d);
    if (!h) { fprintf(stderr, MODEL_NAME "_bench: out of host memory\n"); exit(1); }
    mg_rng r;
    mg_rng_seed(&r, seed);
    mg_rng_fill_uniform(&r, h, n, lo, hi);
    if (cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess) die("upload", MG_ERR_CUDA);
    free(h);
    return d;
}

/* One row of the report: what, shape, time, and the derived rates. */
static void report(const char *what, int batch, int seqlen, const mg_bench_stats *st,
                   double tokens, double bytes, double flops)
{
    double s = st->median_ms * 1e-3;
    double gbps = bytes / s / 1e9, tflops = flops / s / 1e12;
    printf("%-*s %5d %6d %10.4f %12.0f %9.1f %6.1f%% %8.2f %6.1f%%\n", WHAT_WIDTH, what, batch, seqlen,
           st->median_ms, tokens / s, gbps, 100.0 * gbps / ceil_.copy_gbps, tflops,
           100.0 * tflops / gemm_ceiling_tflops);
    if (csv)
        fprintf(csv, MODEL_NAME "," MODEL_PRECISION ",%s,%d,%d,%.6f,%.6f,%.1f,%.2f,%.4f,%.4f,%.4f\n", what,
                batch, seqlen, st->median_ms, st->min_ms, tokens / s, gbps, gbps / ceil_.copy_gbps,
                tflops, tflops / gemm_ceiling_tflops);
}

/* The command line (--csv FILE, --iters N), a device, its ceilings and the
 * GEMM ceiling of the storage dtype; returns -1 to go on, else the exit
 * status of the program. */
static int bench_start(int argc, char **argv, int *iters)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv = fopen(argv[++i], "a");
            if (!csv) { perror(argv[i]); return 1; }
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            *iters = atoi(argv[++i]);
            if (*iters < 1) *iters = 1;
        } else {
            fprintf(stderr, "usage: %s [--csv FILE] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (mg_device_count() == 0) {
        fprintf(stderr, MODEL_NAME "_bench: no CUDA device\n");
        return 77;
    }
    mg_status s = mg_bench_ceilings(&ceil_);
    if (s != MG_OK) die("ceilings", s);
    gemm_ceiling_tflops = MODEL_F32_STORAGE ? ceil_.f32_tflops : ceil_.bf16_tflops;
    return -1;
}
