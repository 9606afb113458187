/* mg_ref_seqs.c: the checks of the episode-start and packed-sequence
 * options, the segment plan (mg_ref_seqs.h), and the drivers that run a
 * plan for the Mamba-1 and Mamba-3 reference entry points
 * (mg_ref_seqs_impl.h). Nothing here knows a model: a call is cut into
 * segments, each a plain call of its own, and the states and gradients
 * are routed between them. */
#include "mg_ref_seqs_impl.h"

#include <stdlib.h>
#include <string.h>

static int seqs_active(const mg_ref_seqs *o)
{
    return o != NULL && (o->start != NULL || o->cu_seqlens != NULL);
}

/* The packed options against a call of batch 1 and a buffer of seqlen
 * tokens. Every entry is read before anything is trusted, so a bad array
 * is reported, not walked. */
static mg_status check_packed(const mg_ref_seqs *o, int batch, int seqlen,
                              const char *fn)
{
    if (batch != 1)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: packed sequences (cu_seqlens) "
                       "need batch 1, got batch %d", fn, batch);
    if (o->nseq < 1)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: packed sequences need nseq >= 1, "
                       "got %d", fn, o->nseq);
    if (o->nseq > o->max_seqs)
        return mg_fail(MG_ERR_SIZE, "%s: %d packed sequences, more than "
                       "max_seqs %d", fn, o->nseq, o->max_seqs);
    const int32_t *cu = o->cu_seqlens;
    if (cu[0] != 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens[0] must be 0, got %ld",
                       fn, (long)cu[0]);
    for (int i = 0; i < o->nseq; i++)
        if (cu[i + 1] <= cu[i])
            return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens must be strictly "
                           "increasing (no empty sequence): cu_seqlens[%d] = %ld, "
                           "cu_seqlens[%d] = %ld", fn, i, (long)cu[i], i + 1,
                           (long)cu[i + 1]);
    if (cu[o->nseq] > seqlen)
        return mg_fail(MG_ERR_SIZE, "%s: cu_seqlens[%d] = %ld tokens, more than "
                       "the %d the buffer holds (seqlen)", fn, o->nseq,
                       (long)cu[o->nseq], seqlen);
    return MG_OK;
}

static mg_status check_opts(const mg_ref_seqs *o, int batch, int seqlen,
                            const char *fn)
{
    if (batch < 0 || seqlen < 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: batch %d, seqlen %d", fn, batch,
                       seqlen);
    if (o == NULL)
        return MG_OK;
    if (o->cu_seqlens != NULL)
        return check_packed(o, batch, seqlen, fn);
    if (o->nseq != 0 || o->max_seqs != 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: nseq %d / max_seqs %d given "
                       "without cu_seqlens", fn, o->nseq, o->max_seqs);
    return MG_OK;
}

/* Appends the segments of one stream, tokens [row0, row0 + len): a new
 * segment at every start after the first token. */
static void plan_stream(const unsigned char *start, size_t row0, int len,
                        int stream, mg_ref_plan *p)
{
    int first = p->nseg;
    for (int t = 0; t < len; t++) {
        int is_start = start != NULL && start[row0 + (size_t)t] != 0;
        if (t == 0 || is_start) {
            mg_ref_seg *s = &p->seg[p->nseg++];
            s->row = row0 + (size_t)t;
            s->len = 0;
            s->stream = stream;
            s->from_init = t == 0 && !is_start;
            s->to_final = false;
        }
        p->seg[p->nseg - 1].len++;
    }
    if (p->nseg > first)
        p->seg[p->nseg - 1].to_final = true;
}

mg_status mg_ref_seqs_plan(const mg_ref_seqs *o, int batch, int seqlen,
                           const char *fn, mg_ref_plan *out)
{
    if (fn == NULL)
        fn = "mg_ref_seqs_plan";
    if (out == NULL)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: plan is NULL", fn);
    memset(out, 0, sizeof *out);
    mg_status st = check_opts(o, batch, seqlen, fn);
    if (st != MG_OK)
        return st;
    const int packed = o != NULL && o->cu_seqlens != NULL;
    const unsigned char *start = o != NULL ? o->start : NULL;
    out->nstreams = packed ? o->nseq : batch;
    out->ntok = packed ? (size_t)o->cu_seqlens[o->nseq] : (size_t)batch * seqlen;
    /* At most one segment per token. */
    out->seg = calloc(out->ntok ? out->ntok : 1, sizeof *out->seg);
    if (out->seg == NULL)
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (int s = 0; s < out->nstreams; s++) {
        size_t row0 = packed ? (size_t)o->cu_seqlens[s] : (size_t)s * seqlen;
        int len = packed ? (int)(o->cu_seqlens[s + 1] - o->cu_seqlens[s]) : seqlen;
        plan_stream(start, row0, len, s, out);
    }
    return MG_OK;
}

mg_status mg_ref_seqs_prepare(const mg_ref_seqs *o, int batch, int seqlen,
                              const char *fn, mg_ref_plan *p, int *plain)
{
    *plain = 1;
    if (o == NULL)
        return MG_OK;
    mg_status rc = mg_ref_seqs_plan(o, batch, seqlen, fn, p);
    if (rc != MG_OK)
        return rc;
    *plain = !seqs_active(o);
    if (*plain)
        mg_ref_seqs_plan_free(p);
    return MG_OK;
}

void mg_ref_seqs_plan_free(mg_ref_plan *p)
{
    if (p == NULL)
        return;
    free(p->seg);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ drivers */

/* State k of one stream between the caller's [n_layers][nstreams][per]
 * layout and a batch of one's [n_layers][per]. get: src NULL gives zeros;
 * put: dst NULL writes nothing. */
static void state_get(double *dst, const double *src, int n_layers,
                      int nstreams, int stream, size_t per)
{
    for (int l = 0; l < n_layers; l++) {
        double *d = dst + (size_t)l * per;
        if (src != NULL)
            memcpy(d, src + ((size_t)l * nstreams + stream) * per, per * sizeof *d);
        else
            memset(d, 0, per * sizeof *d);
    }
}

static void state_put(double *dst, const double *src, int n_layers,
                      int nstreams, int stream, size_t per)
{
    if (dst == NULL)
        return;
    for (int l = 0; l < n_layers; l++)
        memcpy(dst + ((size_t)l * nstreams + stream) * per, src + (size_t)l * per,
               per * sizeof *dst);
}

/* One stream's copy of every state array: buf[k] holds n_layers * per[k]
 * doubles (zeros), all carved from the block returned (NULL: no memory). */
static double *stream_alloc(const mg_ref_state_shape *sh, double **buf)
{
    size_t tot = 0;
    for (int k = 0; k < sh->n; k++)
        tot += (size_t)sh->n_layers * sh->per[k];
    double *mem = calloc(tot ? tot : 1, sizeof *mem);
    if (mem == NULL)
        return NULL;
    size_t o = 0;
    for (int k = 0; k < sh->n; k++) {
        buf[k] = mem + o;
        o += (size_t)sh->n_layers * sh->per[k];
    }
    return mem;
}

/* src: NULL, or n arrays of which any may be NULL (zeros). */
static void stream_get(const mg_ref_state_shape *sh, double **buf,
                       const double *const *src, int nstreams, int s)
{
    for (int k = 0; k < sh->n; k++)
        state_get(buf[k], src ? src[k] : NULL, sh->n_layers, nstreams, s, sh->per[k]);
}

static void stream_put(const mg_ref_state_shape *sh, double *const *dst,
                       double *const *buf, int nstreams, int s)
{
    for (int k = 0; k < sh->n; k++)
        state_put(dst ? dst[k] : NULL, buf[k], sh->n_layers, nstreams, s, sh->per[k]);
}

static void stream_zero(const mg_ref_state_shape *sh, double **buf)
{
    for (int k = 0; k < sh->n; k++)
        memset(buf[k], 0, (size_t)sh->n_layers * sh->per[k] * sizeof *buf[k]);
}

mg_status mg_ref_seqs_forward(const mg_ref_plan *p, const mg_ref_state_shape *sh,
                              double *const *states, mg_ref_seg_fwd_fn fn, void *ctx)
{
    double *st[MG_REF_SEQS_MAX_STATES];
    double *mem = stream_alloc(sh, st);
    if (mem == NULL)
        return mg_fail(MG_ERR_OUT_OF_MEMORY, "reference: out of host memory");
    mg_status rc = MG_OK;
    int i = 0;
    for (int s = 0; s < p->nstreams && rc == MG_OK; s++) {
        stream_get(sh, st, (const double *const *)states, p->nstreams, s);
        for (; rc == MG_OK && i < p->nseg && p->seg[i].stream == s; i++) {
            /* An episode starts: every state is zeroed before its token. */
            if (!p->seg[i].from_init)
                stream_zero(sh, st);
            rc = fn(ctx, &p->seg[i], st);
        }
        if (rc == MG_OK)
            stream_put(sh, states, st, p->nstreams, s);
    }
    free(mem);
    return rc;
}

/* The arrays handed to a segment: the stream's copy where the caller gave
 * the array, else NULL. */
static void pick(const mg_ref_state_shape *sh, const double *const *caller,
                 double **buf, double **out)
{
    for (int k = 0; k < sh->n; k++)
        out[k] = caller != NULL && caller[k] != NULL ? buf[k] : NULL;
}

mg_status mg_ref_seqs_backward(const mg_ref_plan *p, const mg_ref_state_shape *sh,
                               const double *const *st0, const double *const *dT,
                               double *const *d0, double *dblob, size_t nblob,
                               mg_ref_seg_bwd_fn fn, void *ctx)
{
    double *b0[MG_REF_SEQS_MAX_STATES], *bT[MG_REF_SEQS_MAX_STATES],
           *bd[MG_REF_SEQS_MAX_STATES];
    double *a0[MG_REF_SEQS_MAX_STATES], *aT[MG_REF_SEQS_MAX_STATES],
           *ad[MG_REF_SEQS_MAX_STATES], *none[MG_REF_SEQS_MAX_STATES] = { NULL };
    double *m0 = stream_alloc(sh, b0), *mT = stream_alloc(sh, bT),
           *md = stream_alloc(sh, bd);
    double *gseg = calloc(nblob ? nblob : 1, sizeof *gseg);
    mg_status rc = MG_OK;
    if (!m0 || !mT || !md || !gseg) {
        rc = mg_fail(MG_ERR_OUT_OF_MEMORY, "reference: out of host memory");
        goto done;
    }
    pick(sh, st0, b0, a0);
    pick(sh, dT, bT, aT);
    pick(sh, (const double *const *)d0, bd, ad);
    memset(dblob, 0, nblob * sizeof *dblob);
    int i = 0;
    for (int s = 0; s < p->nstreams && rc == MG_OK; s++) {
        stream_get(sh, b0, st0, p->nstreams, s);
        stream_get(sh, bT, dT, p->nstreams, s);
        /* 0 unless a segment takes the initial state. */
        stream_zero(sh, bd);
        int any = 0;
        for (; rc == MG_OK && i < p->nseg && p->seg[i].stream == s; i++) {
            const mg_ref_seg *g = &p->seg[i];
            any = 1;
            rc = fn(ctx, g, g->from_init ? a0 : none, g->to_final ? aT : none,
                    g->from_init ? ad : none, gseg);
            for (size_t j = 0; rc == MG_OK && j < nblob; j++)
                dblob[j] += gseg[j];
        }
        /* No token: the final state is the initial one. */
        if (!any)
            for (int k = 0; k < sh->n; k++)
                memcpy(bd[k], bT[k], (size_t)sh->n_layers * sh->per[k] * sizeof *bd[k]);
        if (rc == MG_OK)
            stream_put(sh, d0, bd, p->nstreams, s);
    }
done:
    free(m0);
    free(mT);
    free(md);
    free(gseg);
    return rc;
}

void mg_ref_seqs_zero_rows(double *x, size_t from, size_t to, size_t width)
{
    if (x != NULL && to > from)
        memset(x + from * width, 0, (to - from) * width * sizeof *x);
}
