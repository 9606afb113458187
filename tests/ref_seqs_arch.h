/* ref_seqs_arch.h: what the test_ref_seqs program's files share: a small
 * random model of either architecture behind one interface (forward and
 * backward, plain or with mg_ref_seqs options, states as up to four
 * arrays), and the test's own hand split of a call into segments, written
 * without the library's plan so that the two can be held against each
 * other. */
#ifndef MG_TEST_REF_SEQS_ARCH_H
#define MG_TEST_REF_SEQS_ARCH_H

#include <stddef.h>

#include "mg_runtime.h"

/* A model of one architecture, f64 weights. */
typedef struct arch {
    const char *name;
    int mamba3;          /* 0: Mamba-1, 1: Mamba-3 SISO */
    int L, ns;           /* layers, state arrays (2 or 4) */
    size_t per[4];       /* doubles per state array, layer and stream */
    size_t I, D;         /* input and output row widths */
    size_t nblob;
    int has_dT;          /* the backward takes final-state gradients */
    mg_m1_dims d1;
    mg_m1_layout l1;
    mg_m3_dims d3;
    mg_m3_layout l3;
    double *w;           /* [nblob] */
} arch;

/* The Mamba-1 (D=4 L=2 N=3 E=8 K=4 R=2 input_dim=3) and Mamba-3 (D=6 L=2
 * N=4 E=8 P=2 H=4 G=2 S=2 input_dim=3, softplus A) test models, with step
 * sizes of order 1 so the states weigh in every output. */
void arch_make_m1(arch *a, unsigned long long seed);
void arch_make_m3(arch *a, unsigned long long seed);
void arch_free(arch *a);

/* Forward over [B][T] rows of u; st[k] (k < ns, each may be NULL) the
 * states, [L][streams][per[k]]. o NULL: the plain entry point. */
mg_status arch_fwd(const arch *a, int B, int T, const double *u, double *out,
                   double **st, const mg_ref_seqs *o);
/* Backward; dT is ignored and out left as it is for Mamba-1 (its
 * backward has neither). o NULL: the plain entry point. */
mg_status arch_bwd(const arch *a, int B, int T, const double *u, double **st0,
                   const double *dout, double **dT, double *out, double *dblob,
                   double *du, double **d0, const mg_ref_seqs *o);
/* The f32 entry points (blob and input rounded to f32 by the caller). */
mg_status arch_fwd_f32(const arch *a, const float *wf, int B, int T, const float *uf,
                       double *out, double **st, const mg_ref_seqs *o);
mg_status arch_bwd_f32(const arch *a, const float *wf, int B, int T, const float *uf,
                       double **st0, const double *dout, double **dT, double *out,
                       double *dblob, double *du, double **d0, const mg_ref_seqs *o);

/* A stream of a call: rows [row, row + len), its state slot is its index. */
typedef struct hstream {
    size_t row;
    int len;
} hstream;

/* The hand split: every stream cut before each token whose start byte
 * (start[row], NULL: none) is set, each piece a plain call of batch 1,
 * from the stream's state for the first piece unless it is a start, from
 * zeros otherwise. st: [L][nstr][per] states in/out (arrays may be NULL). */
void hand_fwd(const arch *a, int nstr, const hstream *s, const unsigned char *start,
              const double *u, double *out, double **st);
/* The same for the backward: the pieces' weight gradients are summed in
 * reverse order (last stream's last piece first), the opposite of the
 * library's plan order, so that equal sums mean equal up to rounding. */
void hand_bwd(const arch *a, int nstr, const hstream *s, const unsigned char *start,
              const double *u, double **st0, const double *dout, double **dT,
              double *out, double *dblob, double *du, double **d0);

/* Allocation (exits on failure), fills, comparisons. */
double *dz(size_t n);
void fill(mg_rng *r, double *x, size_t n, double lo, double hi);
/* max |a - b| / max |b| (NaN: infinite) */
double rel_diff(const double *a, const double *b, size_t n);
/* 1 if the n doubles are bit-identical (also -0 vs 0 and NaN payloads) */
int same(const double *a, const double *b, size_t n);
/* the state arrays of a: nstr streams each, random or zero */
void states_new(const arch *a, int nstr, double **st, mg_rng *r, double lo, double hi);
void states_free(const arch *a, double **st);
size_t states_n(const arch *a, int nstr, int k);

#endif
