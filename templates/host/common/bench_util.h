/* bench_util.h: what the bench programs of every arch share (included
 * once by NAME_bench.c, after model_alias.h, mg_bench.h, mg_cuda.h and
 * mg_rng.h, and after its bench_ctx, the arguments of one prefill or decode
 * call): the cost model's figures, the CSV file and the ceilings the rows
 * are quoted against, errors that end the program, random device buffers,
 * one row of the report (the program defines WHAT_WIDTH, the width of its
 * first column) and its timing (time_row: --only, --profile), the command line, the model on the device, the graph
 * replays, the training rows' buffers. */
#define GEMM_FLOPS_PER_TOKEN  MODEL_COST_GEMM_FLOPS_PER_TOKEN
#define OTHER_FLOPS_PER_TOKEN MODEL_COST_OTHER_FLOPS_PER_TOKEN
#define BYTES_PER_TOKEN       MODEL_COST_BYTES_PER_TOKEN
#define WEIGHT_BYTES          MODEL_COST_WEIGHT_BYTES
#define STATE_BYTES_PER_SEQ   MODEL_COST_STATE_BYTES_PER_SEQ

static FILE *csv;
static int bench_profile;            /* --profile: each row one run inside the profiler's capture range */
static const char *bench_only[16];   /* --only PATTERN (repeatable): the rows to run (none: all) */
static int bench_n_only;
static mg_ceilings ceil_;
static double gemm_ceiling_tflops;   /* the GEMM rate of this spec's storage dtype (allow_tf32: TF32's) */
static char csv_tail[800];           /* the columns every CSV row ends with (csv_tail_init) */

/* A CSV field from free text: commas and line breaks become ';' and ' ',
 * so the plain comma split of bench/plot.sh (and of users' scripts) holds. */
static void csv_field(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < n; i++)
        dst[i] = src[i] == ',' ? ';' : (src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
    dst[i] = 0;
}

/* The ceilings measured in this run (the fractions of the row are taken
 * against them: a plot reads them back instead of dividing rounded
 * fractions), then where the row comes from: GPU, the driver's and the
 * runtime's CUDA versions, the mamba-gen commit ($MG_BENCH_COMMIT, which
 * bench/run.sh sets; else the generator's version), the UTC date and the
 * spec's SHA-256. */
static void csv_tail_init(void)
{
    char gpu[256], commit[96];
    csv_field(gpu, sizeof gpu, ceil_.gpu);
    const char *cm = getenv("MG_BENCH_COMMIT");
    csv_field(commit, sizeof commit, cm && *cm ? cm : MODEL_GENERATOR_VERSION);
    char date[32] = "unknown";
    time_t now = time(NULL);
    const struct tm *tmv = gmtime(&now);
    if (tmv) strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", tmv);
    snprintf(csv_tail, sizeof csv_tail, "%.1f,%.2f,%.3f,%s,%d.%d,%d.%d,%s,%s,%s", ceil_.copy_gbps,
             ceil_.bf16_tflops, ceil_.f32_tflops, gpu, ceil_.driver_version / 1000,
             ceil_.driver_version % 1000 / 10, ceil_.runtime_version / 1000, ceil_.runtime_version % 1000 / 10,
             commit, date, MODEL_SPEC_SHA256);
}

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

static float *hmalloc(size_t n)
{
    float *h = malloc(n * sizeof *h);
    if (!h) { fprintf(stderr, MODEL_NAME "_bench: out of host memory\n"); exit(1); }
    return h;
}

/* Random device data (never zeros: they would flatter the timings). */
static float *drandom(size_t n, uint64_t seed, float lo, float hi)
{
    float *h = hmalloc(n), *d = dalloc(n * sizeof *d);
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
    char field[128];
    csv_field(field, sizeof field, what);   /* "ssm core (chunked, split)": no comma may split the row */
    if (csv)
        fprintf(csv, MODEL_NAME "," MODEL_PRECISION_LABEL ",%s,%d,%d,%.6f,%.6f,%.1f,%.2f,%.4f,%.4f,%.4f,%.6f,%s\n", field,
                batch, seqlen, st->median_ms, st->min_ms, tokens / s, gbps, gbps / ceil_.copy_gbps,
                tflops, tflops / gemm_ceiling_tflops, st->p99_ms, csv_tail);
}

/* Whether the row labelled `label` ("WHAT bBATCH TSEQLEN") runs: every row
 * without --only; else the rows where some pattern occurs and is not
 * followed by a digit (so "T256" does not pick "T2560", nor "b6" "b64"). */
static int row_wanted(const char *label)
{
    if (bench_n_only == 0) return 1;
    for (int i = 0; i < bench_n_only; i++) {
        const size_t n = strlen(bench_only[i]);
        for (const char *p = strstr(label, bench_only[i]); p; p = strstr(p + 1, bench_only[i]))
            if (p[n] < '0' || p[n] > '9') return 1;
    }
    return 0;
}

/* Times one row (what, batch x seqlen) with mg_bench_time unless --only
 * leaves it out: -> 1 when timed (st filled; a failure ends the program),
 * 0 when left out. With --profile the row is one run inside the profiler's
 * capture range (bench/profile.sh). */
static int time_row(const char *what, int batch, int seqlen, cudaStream_t stream, mg_bench_fn fn, void *ctx,
                    const mg_bench_opts *o, mg_bench_stats *st)
{
    char label[160];
    snprintf(label, sizeof label, "%s b%d T%d", what, batch, seqlen);
    if (!row_wanted(label)) return 0;
    mg_bench_opts ro = *o;
    ro.profile = bench_profile;
    const mg_status s = mg_bench_time(stream, fn, ctx, &ro, st);
    if (s != MG_OK) die(label, s);
    return 1;
}

/* A decode row: one token for each of batch streams (weights read once,
 * every stream's state read and written). */
static void report_decode(const char *what, int batch, const mg_bench_stats *st)
{
    report(what, batch, 1, st, batch, WEIGHT_BYTES + batch * (BYTES_PER_TOKEN + STATE_BYTES_PER_SEQ),
           batch * (GEMM_FLOPS_PER_TOKEN + OTHER_FLOPS_PER_TOKEN));
}

/* A device reset mask of batch bytes for the "reset mask" decode rows:
 * every other stream resets (the kernels of both kinds of stream run), so
 * the row shows what reading the mask costs next to the maskless one. */
static uint8_t *bench_reset_mask(int batch)
{
    uint8_t *h = malloc((size_t)batch), *d = dalloc((size_t)batch);
    if (!h) { fprintf(stderr, MODEL_NAME "_bench: out of host memory\n"); exit(1); }
    for (int i = 0; i < batch; i++) h[i] = (uint8_t)(i % 2);
    if (cudaMemcpy(d, h, (size_t)batch, cudaMemcpyHostToDevice) != cudaSuccess) die("upload", MG_ERR_CUDA);
    free(h);
    return d;
}

/* The decode latency curve: one graph-replayed step per batch size of
 * latency_batches (1, 2, 4, ... and MAX_BATCH), LATENCY_ITERS timed steps
 * each (enough runs for a 99th percentile), printed as p50 and p99; the
 * CSV row's median_ms is the p50, p99_ms the tail. */
#define LATENCY_ITERS 400
static int latency_batches(int *b, int cap)
{
    int n = 0;
    for (int x = 1; x < MODEL_MAX_BATCH && n < cap - 1; x *= 2) b[n++] = x;
    b[n++] = MODEL_MAX_BATCH;
    return n;
}

static void report_latency(int batch, const mg_bench_stats *st)
{
    report_decode("decode latency (graph)", batch, st);
    printf("%-*s %5d   p50 %.4f ms  p99 %.4f ms  (%d steps)\n", WHAT_WIDTH, "  p50 / p99", batch, st->median_ms,
           st->p99_ms, st->iters);
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
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc && bench_n_only < 16) {
            bench_only[bench_n_only++] = argv[++i];
        } else if (strcmp(argv[i], "--profile") == 0) {
            bench_profile = 1;
        } else {
            fprintf(stderr, "usage: %s [--csv FILE] [--iters N] [--only PATTERN]... [--profile]\n"
                            "  --only PATTERN  run the rows whose label \"WHAT bBATCH TSEQLEN\" contains PATTERN\n"
                            "                  (not followed by a digit; up to 16 patterns)\n"
                            "  --profile       each row: warm-up, then one run between cudaProfilerStart/Stop\n"
                            "                  (for ncu --profile-from-start off; bench/profile.sh)\n", argv[0]);
            return 2;
        }
    }
    if (mg_device_count() == 0) {
        fprintf(stderr, MODEL_NAME "_bench: no CUDA device\n");
        return 77;
    }
    mg_status s = mg_bench_ceilings(&ceil_);
    if (s != MG_OK) die("ceilings", s);
    gemm_ceiling_tflops = MODEL_TF32 ? ceil_.tf32_tflops : MODEL_F32_STORAGE ? ceil_.f32_tflops : ceil_.bf16_tflops;
    csv_tail_init();
    return -1;
}

/* The model on the device: the weights hw (n floats, the reference path's
 * initialisation; freed here) uploaded once to *w, a stream, the model
 * created on it with those weights; prints the workspace line. */
static model_model *bench_model(float *hw, size_t n, float **w, cudaStream_t *stream)
{
    mg_status s;
    *w = dalloc(sizeof(float) * n);
    if (cudaMemcpy(*w, hw, sizeof(float) * n, cudaMemcpyHostToDevice) != cudaSuccess) die("upload", MG_ERR_CUDA);
    free(hw);
    if (cudaStreamCreate(stream) != cudaSuccess) die("stream", MG_ERR_CUDA);
    model_model *m;
    if ((s = model_create(&m, *stream)) != MG_OK) die("create", s);
    if ((s = model_set_weights(m, *w, n)) != MG_OK) die("set_weights", s);
    /* device memory: the model's (create) and the trainer's, per token of
     * the largest call (MAX_BATCH x MAX_SEQ_LEN) */
    const double tok = (double)MODEL_MAX_BATCH * MODEL_MAX_SEQ_LEN;
    const size_t mb = model_workspace_bytes(m);
    printf("workspace: create %.1f MiB (%.0f bytes per token)", mb / 1048576.0, mb / tok);
#if MODEL_TRAINING
    const size_t tb = model_trainer_workspace_bytes();
    printf(", trainer %.1f MiB (%.0f bytes per token)", tb / 1048576.0, tb / tok);
#endif
    printf("\n\n");
    return m;
}

static mg_status run_graph(void *p, cudaStream_t stream)
{
    (void)stream;
    return model_decode_graph_launch((model_graph *)p);
}

#if MODEL_TRAINING
/* The training rows: a trainer, a copy of the weights (the step updates
 * them), their gradient, the AdamW moments, the MSE target, the loss, the
 * hyperparameters, the call's shape (c), and dout for the arch's
 * forward_train + backward row (NULL where it has none). */
typedef struct {
    model_trainer *t;
    float *w, *grads, *m, *v, *target, *loss, *dout;
    model_adamw_params p;
    bench_ctx c;
} train_ctx;

/* x's buffers for the weights w (n floats) and targets of B x T tokens. */
static void train_start(train_ctx *x, cudaStream_t stream, const float *w, size_t n, int B, int T)
{
    mg_status s;
    memset(x, 0, sizeof *x);
    if ((s = model_trainer_create(&x->t, stream)) != MG_OK) die("trainer_create", s);
    x->w = dalloc(sizeof(float) * n);
    if (cudaMemcpy(x->w, w, sizeof(float) * n, cudaMemcpyDeviceToDevice) != cudaSuccess) die("copy", MG_ERR_CUDA);
    x->grads = dalloc(sizeof(float) * n);
    x->m = dalloc(sizeof(float) * n);
    x->v = dalloc(sizeof(float) * n);
    if (cudaMemset(x->m, 0, sizeof(float) * n) != cudaSuccess ||
        cudaMemset(x->v, 0, sizeof(float) * n) != cudaSuccess) die("memset", MG_ERR_CUDA);
    x->target = drandom((size_t)B * T * MODEL_D_MODEL, 5, -1.0f, 1.0f);
    x->loss = dalloc(sizeof(float));
    x->p.lr = 1e-4f; x->p.beta1 = 0.9f; x->p.beta2 = 0.999f; x->p.eps = 1e-8f;
    x->p.weight_decay = 0.01f; x->p.max_grad_norm = 1.0f; x->p.step = 1;
}

static void train_end(train_ctx *x)
{
    model_trainer_destroy(x->t);
    mg_dev_free(x->w); mg_dev_free(x->grads); mg_dev_free(x->m); mg_dev_free(x->v);
    mg_dev_free(x->target); mg_dev_free(x->dout); mg_dev_free(x->loss);
}

static mg_status run_train_graph(void *p, cudaStream_t stream)
{
    (void)stream;
    return model_train_graph_launch((model_train_graph *)p);
}
#endif
