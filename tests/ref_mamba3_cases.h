/* ref_mamba3_cases.h: what the two files of the test_ref_mamba3 program
 * share: allocation and random fills, the relative error, dims of tiny
 * configs, and the model cases (mcase) of the continuation and finite
 * difference groups (test_ref_mamba3_model.c). */
#ifndef MG_TEST_REF_MAMBA3_CASES_H
#define MG_TEST_REF_MAMBA3_CASES_H

#include <stddef.h>

#include "mg_ref_mamba3.h"
#include "mg_rng.h"

/* calloc that exits the program (status 2) when memory runs out */
double *dalloc(size_t n);
float *falloc(size_t n);
/* uniform in [lo, hi) */
void fill_d(mg_rng *r, double *x, size_t n, double lo, double hi);
void fill_f(mg_rng *r, float *x, size_t n, double lo, double hi);
/* max |a-b| / max(max|b|, tiny) */
double rel_err(const double *a, const double *b, size_t n);
mg_m3_dims dims_of(int D, int L, int N, int E, int P, int G,
                   double rope, int input_dim, mg_m3_a_act act,
                   int outproj_norm, double a_floor);

/* A model case: weights, input, initial state and the loss weights. */
typedef struct mcase {
    const char *label;
    mg_m3_dims d;
    mg_m3_layout l;
    float *w;
    int B, T;
    size_t I, nu, nout, nS, nK, nV, nA;
    float *u;
    double *s0, *k0, *v0, *a0;          /* initial state */
    double *dout, *wS, *wK, *wV, *wA;   /* loss weights */
} mcase;

/* 1 if the layout and init succeeded. */
int mcase_make(mcase *c, const char *label, mg_m3_dims d, int B, int T,
               unsigned long long seed);
void mcase_free(mcase *c);
double dot(const double *a, const double *b, size_t n);
/* loss = <out, dout> + <final state, w*> from the initial state of c. */
double mcase_loss(const mcase *c);

/* The groups of test_ref_mamba3_model.c (5. continuation, 6. finite
 * differences), run by main in test_ref_mamba3.c. */
void test_continuation(void);
void test_fd_sensitivity(void);
void test_fd(void);

#endif
