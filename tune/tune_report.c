/* tune/tune_report.c: what a sweep reports (tune.h): the table of median
 * times, the specialized-vs-generic comparison, the CSV of every
 * measurement and the cache entry of the best variant (doc/tuning.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen/tune_cache.h"
#include "tune.h"

const char *tm_mode(const tm_cand *c)
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

int tm_write_csv(const char *path, const tm_manifest *m, const tg_device *dev, const tm_opts *o)
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
    tc_buf_printf(&b, "],\n  \"best\": {\"chunk_size\": %d, \"scan_threads\": %d, ", best->chunk, best->threads);
    if (!m->m3)   /* mamba1: threads sharing one channel (derive_mamba1.lua takes them with the block size) */
        tc_buf_printf(&b, "\"scan_lanes\": %d, ", best->threads / best->channels);
    tc_buf_printf(&b, "\"score\": %s},\n", tm_num(n1, sizeof n1, score));
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
        if (!m->m3 && c->channels > 0)   /* mamba1: lanes per channel (mg/tune.lua crossover) */
            tc_buf_printf(&b, ", \"lanes\": %d", c->threads / c->channels);
        tc_buf_printf(&b, ", \"median_ms\": [");
        for (int s = 0; s < o->nseqlens * o->nbatches; s++)
            tc_buf_printf(&b, "%s%s", s ? ", " : "", c->timed[s] ? tm_num(n1, sizeof n1, c->ms[s]) : "null");
        tc_buf_printf(&b, "]}%s\n", i + 1 < m->ncands ? "," : "");
    }
    tc_buf_printf(&b, "  ]\n}\n");
    return tc_buf_take(&b, NULL);
}

/* The median ms of every candidate per shape (batch x seqlen). */
void tm_print_table(const tm_opts *o, const tm_manifest *m, const tg_device *dev, const char *nvrtc,
                    const tm_cand *best)
{
    const int nshapes = o->nseqlens * o->nbatches;
    printf("%s on %s (sm %s, driver %s, NVRTC %s): median ms per shape (batch x seqlen)\n", m->spec_name,
           dev->name, dev->cc, dev->driver, nvrtc);
    printf("%-12s", "candidate");
    for (int s = 0; s < nshapes; s++) {
        char hdr[32];
        snprintf(hdr, sizeof hdr, "%dx%d", o->batches[s % o->nbatches], o->seqlens[s / o->nbatches]);
        printf(" %11s", hdr);
    }
    printf("  status\n");
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *c = &m->cands[i];
        printf("%-12s", c->id);
        for (int s = 0; s < nshapes; s++)
            c->timed[s] ? printf(" %11.4f", c->ms[s]) : printf(" %11s", "-");
        printf("  %s%s\n", c->status ? c->status : "ok", c == best ? "  <- best" : "");
    }
}

/* The speedup of specialization: per shape, the fastest specialized
 * chunked candidate against the generic one (printed also with -q). */
void tm_print_generic(const tm_opts *o, const tm_manifest *m)
{
    const int nshapes = o->nseqlens * o->nbatches;
    for (size_t i = 0; i < m->ncands; i++) {
        const tm_cand *g = &m->cands[i];
        if (!g->generic)
            continue;
        const tm_cand *same = NULL;
        for (size_t j = 0; j < m->ncands; j++)
            if (strcmp(m->cands[j].id, m->generic_same_as) == 0)
                same = &m->cands[j];
        for (int s = 0; s < nshapes; s++) {
            const tm_cand *gg;
            double ratio;
            const tm_cand *sb = tm_spec_best_at(m, s, &gg, &ratio);
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", o->batches[s % o->nbatches], o->seqlens[s / o->nbatches]);
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
}

int tm_write_cache(const tm_opts *o, const tm_manifest *m, const tg_device *dev, const char *nvrtc,
                   const tm_cand *best, double score, const tm_cand *best_seq)
{
    char *err = NULL;
    int status = TM_OK;
    char *dir = tc_dir(o->cache_dir, &err);
    if (!dir) {
        fprintf(stderr, "mamba-tune: %s\n", err);
        free(err);
        return TM_FAIL;
    }
    tc_key_parts kp = {m->key_spec, m->spec_name, m->generator, m->key_templates, dev->name, dev->cc, dev->driver,
                       nvrtc};
    char key[SHA256_HEX_SIZE];
    tc_key(&kp, key);
    char *json = tm_entry_json(m, o, dev, nvrtc, &kp, key, best, score, best_seq);
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
    return status;
}
