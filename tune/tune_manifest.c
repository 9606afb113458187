/* tune/tune_manifest.c: the manifest the Lua side writes for mamba-tune
 * (mg/tune.lua sources: `key value` lines, then one `candidate` line per
 * variant) read into a tm_manifest (tune.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune.h"

int tm_read_manifest(const lh_result *r, tm_manifest *m, int quiet, char **err)
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
            if (!quiet)
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

void tm_manifest_free(tm_manifest *m)
{
    for (size_t i = 0; i < m->ncands; i++) {
        tn_result_free(&m->cands[i].cub);
        free(m->cands[i].status);
    }
    free(m->cands);
}
