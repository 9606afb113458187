/* tune/tune_sweep.c: the work of a sweep (tune.h): progress lines, the
 * parallel NVRTC compiles, and on the GPU each candidate loaded, checked
 * against the f64 reference and, only if right, timed at every shape; then
 * the choice of the best chunked variant. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tune.h"

static int tm_progress_tty;
static int tm_quiet;

void tm_progress_setup(int quiet)
{
    tm_quiet = quiet;
    tm_progress_tty = isatty(STDERR_FILENO);
}

/* One status line: rewritten in place on a terminal, else one line each. */
void tm_progress(const char *fmt, ...)
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

void tm_progress_end(void)
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

void tm_compile_all(tm_manifest *m, const char *arch, const char *include, int jobs)
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

/* ------------------------------------------------------------------ on the GPU */

void tm_set_status(tm_cand *c, char *msg)
{
    free(c->status);
    c->status = msg ? msg : strdup("failed");
}

/* Loads, verifies and times candidate I; 1 if the CUDA context was lost
 * (no later candidate can run then). */
static int tm_sweep_one(const tm_opts *o, const tm_manifest *m, tg_data *data, size_t i)
{
    const int nshapes = o->nseqlens * o->nbatches;
    tm_cand *c = &m->cands[i];
    char *err = NULL;
    tg_cand tc = {c->chunked, c->chunk, c->threads, c->blocks, c->smem, m->m3,
                  c->generic ? m->gargs : NULL, c->generic ? m->ngargs : 0};
    tm_progress("[%zu/%zu] %s: load and verify", i + 1, m->ncands, c->id);
    tg_kernels *k = tg_load(c->cub.cubin, &tc, &err);
    if (!k) {
        tm_set_status(c, err);
        return !tg_context_ok();
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
        return !tg_context_ok();
    }
    c->verified = 1;
    int lost = 0;
    for (int s = 0; s < nshapes; s++) {
        int b = o->batches[s % o->nbatches], t = o->seqlens[s / o->nbatches];
        tm_progress("[%zu/%zu] %s: timing %dx%d", i + 1, m->ncands, c->id, b, t);
        if (tg_time(data, k, &tc, b, t, o->warmup, o->iters, &c->ms[s], &c->min_ms[s], &err) == 0) {
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
    return lost;
}

int tm_sweep(const tm_opts *o, tm_manifest *m)
{
    char *err = NULL;
    int maxb = 2, maxt = 805, minchunk = 256;  /* the verification shape: 2 x 805 */
    const int vb = 2, vt = 805;                /* several chunks of every size + a partial one */
    for (int i = 0; i < o->nbatches; i++)
        maxb = o->batches[i] > maxb ? o->batches[i] : maxb;
    for (int i = 0; i < o->nseqlens; i++)
        maxt = o->seqlens[i] > maxt ? o->seqlens[i] : maxt;
    for (size_t i = 0; i < m->ncands; i++)
        if (m->cands[i].chunked && m->cands[i].chunk < minchunk)
            minchunk = m->cands[i].chunk;
    tg_dims dims = {m->E, m->N, m->R, m->XP, m->act_size, strcmp(m->precision, "bf16") == 0, m->combine_threads,
                    m->tol, m->m3, m->H, m->P, m->NP, m->off_x};
    tm_progress("preparing inputs and the f64 reference (%dx%d)", vb, vt);
    tg_data *data = tg_data_new(&dims, maxb, maxt, minchunk, vb, vt, 20240601ULL, &err);
    tm_progress_end();
    if (!data) {
        fprintf(stderr, "mamba-tune: %s\n", err);
        free(err);
        return TM_FAIL;
    }
    int lost = 0;
    for (size_t i = 0; i < m->ncands; i++) {
        tm_cand *c = &m->cands[i];
        if (!c->compiled)
            continue;
        if (lost)
            tm_set_status(c, strdup("not run: the CUDA context was lost by an earlier candidate"));
        else
            lost = tm_sweep_one(o, m, data, i);
    }
    tm_progress_end();
    tg_data_free(data);
    return TM_OK;
}

/* ------------------------------------------------------------------ the best */

/* The best chunked variant: the smallest geometric mean over the shapes
 * of its time relative to the fastest chunked variant there. */
const tm_cand *tm_choose_best(const tm_manifest *m, int nshapes, double *score_out, const tm_cand **best_seq)
{
    double best_at[TM_MAX_LIST * TM_MAX_LIST];
    for (int s = 0; s < nshapes; s++) {
        best_at[s] = INFINITY;
        for (size_t i = 0; i < m->ncands; i++)
            if (m->cands[i].chunked && !m->cands[i].generic && m->cands[i].timed[s] &&
                m->cands[i].ms[s] < best_at[s])
                best_at[s] = m->cands[i].ms[s];
    }
    const tm_cand *best = NULL;
    *best_seq = NULL;
    double best_score = INFINITY, best_seq_score = INFINITY;
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *c = &m->cands[i];
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
            *best_seq = c;
        }
    }
    *score_out = best_score;
    return best;
}
