/* mg_ref_seqs.h: episode starts inside a sequence and packed variable-length
 * sequences, for the reference paths of both architectures
 * (doc/math.md, "Episode starts and packed sequences").
 *
 * The options say how the tokens of a call are cut into independent
 * segments. mg_ref_seqs_plan checks them and lists the segments; the
 * Mamba-1 and Mamba-3 *_ex entry points then run their plain forward or
 * backward on every segment as a call of its own (batch 1): a start mask
 * or a packed call is, by construction, the hand split of the sequences,
 * bit for bit (the weight gradients are the segments' sums, in plan
 * order). The plan is public so that test programs can split by hand the
 * same way. */
#ifndef MG_REF_SEQS_H
#define MG_REF_SEQS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "mg_status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The options of an *_ex call; NULL options (or all fields zero) = the
 * plain call.
 *
 * start: [batch][seqlen] (packed: [seqlen]), nonzero where a new episode
 *   begins at that token: every recurrent state is zeroed before the token
 *   (as at t = 0 of a fresh sequence) and no gradient crosses the boundary.
 *   A start at the first token of a stream means that stream's initial
 *   state is ignored (and its gradient is 0). NULL: no starts.
 * cu_seqlens: NULL for a [batch][seqlen] call. Otherwise the call is packed:
 *   batch must be 1, u holds a stream of `seqlen` tokens (the buffer's
 *   capacity) and sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]).
 *   nseq + 1 entries: cu_seqlens[0] = 0, strictly increasing (an empty
 *   sequence is an error: it would have no token to carry its state, and
 *   an equal pair is more often a caller's bug than intended),
 *   cu_seqlens[nseq] <= seqlen. The states are then [n_layers][nseq][...],
 *   one per sequence, in and out, like a batch of nseq. Output and input
 *   gradient rows past cu_seqlens[nseq] are written as zeros.
 * nseq: packed: the number of sequences (>= 1); else 0.
 * max_seqs: packed: the most sequences the caller accepts (what its state
 *   buffers hold); nseq > max_seqs is an error. Else 0. */
typedef struct mg_ref_seqs {
    const unsigned char *start;
    const int32_t *cu_seqlens;
    int nseq;
    int max_seqs;
} mg_ref_seqs;

/* One segment: tokens [row, row + len) of the call's [batch * seqlen]
 * token rows, all of one stream, with no start after its first token. */
typedef struct mg_ref_seg {
    size_t row;
    int len;          /* >= 1 */
    int stream;       /* state slot: b, or the sequence when packed */
    bool from_init;   /* the stream's first segment, not starting an episode:
                         it begins from the caller's initial state (else
                         from zeros) */
    bool to_final;    /* the stream's last segment: its final state is the
                         stream's */
} mg_ref_seg;

/* The segments of a call, streams in order, each stream's in time order. */
typedef struct mg_ref_plan {
    mg_ref_seg *seg;  /* nseg entries (malloc'd) */
    int nseg;
    int nstreams;     /* batch, or nseq when packed */
    size_t ntok;      /* rows covered: batch * seqlen, or cu_seqlens[nseq] */
} mg_ref_plan;

/* Checks o against a call of [batch][seqlen] and lists its segments. fn
 * names the calling entry point in the messages. On any error nothing is
 * allocated (out->seg = NULL): MG_ERR_INVALID_ARG for a NULL out, a batch
 * other than 1 when packed, nseq < 1, cu_seqlens[0] != 0, entries not
 * strictly increasing, nseq / max_seqs without cu_seqlens; MG_ERR_SIZE for
 * nseq > max_seqs and cu_seqlens[nseq] > seqlen. */
mg_status mg_ref_seqs_plan(const mg_ref_seqs *o, int batch, int seqlen,
                           const char *fn, mg_ref_plan *out);
void mg_ref_seqs_plan_free(mg_ref_plan *p);

#ifdef __cplusplus
}
#endif
#endif
