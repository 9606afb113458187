/* mg_rng.c: splitmix64 seeding xoshiro256** (Blackman & Vigna), uniform
 * doubles from the top 53 bits, normals by Box-Muller. Identical streams on
 * every platform: only integer arithmetic and IEEE double operations. */
#include "mg_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void mg_rng_seed(mg_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    /* splitmix64 never yields four zero words in a row, but be safe:
     * the all-zero state is a fixed point of xoshiro. */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 0x9e3779b97f4a7c15ULL;
}

uint64_t mg_rng_u64(mg_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mg_rng_uniform(mg_rng *r)
{
    return (double)(mg_rng_u64(r) >> 11) * 0x1.0p-53;
}

double mg_rng_normal(mg_rng *r)
{
    /* Box-Muller, one value per call (the state holds no spare). u1 in
     * (0, 1] so the log is finite. */
    double u1 = 1.0 - mg_rng_uniform(r);
    double u2 = mg_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
}

void mg_rng_fill_uniform(mg_rng *r, float *x, size_t n, float lo, float hi)
{
    double a = lo, w = (double)hi - (double)lo;
    for (size_t i = 0; i < n; i++) {
        float v = (float)(a + w * mg_rng_uniform(r));
        if (v >= hi && hi > lo) /* rounding to float can reach hi */
            v = nextafterf(hi, lo);
        x[i] = v;
    }
}

void mg_rng_fill_normal(mg_rng *r, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)mean + (double)std * mg_rng_normal(r));
}
