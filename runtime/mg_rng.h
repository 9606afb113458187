/* mg_rng.h: a small deterministic PRNG (splitmix64 seeding xoshiro256**)
 * so random weights and inputs of self-checks are the same everywhere. */
#ifndef MG_RNG_H
#define MG_RNG_H
#include <stdint.h>
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct mg_rng { uint64_t s[4]; } mg_rng;
void mg_rng_seed(mg_rng *r, uint64_t seed);
uint64_t mg_rng_u64(mg_rng *r);
double mg_rng_uniform(mg_rng *r);                 /* [0, 1) */
double mg_rng_normal(mg_rng *r);                  /* N(0, 1) */
void mg_rng_fill_uniform(mg_rng *r, float *x, size_t n, float lo, float hi);
void mg_rng_fill_normal(mg_rng *r, float *x, size_t n, float mean, float std);
#ifdef __cplusplus
}
#endif
#endif
