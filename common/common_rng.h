/* common_rng.h: small deterministic random numbers (SplitMix64).
 *
 * For dummy weights, demo models and tests: the same seed gives the same
 * numbers on every machine. Not for anything secret. */
#ifndef SHOAL_COMMON_RNG_H
#define SHOAL_COMMON_RNG_H

#include <stdint.h>

static inline uint64_t common_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float common_rng_uniform(uint64_t *state)
{
    return (float)((double)(common_rng_next(state) >> 11) * 0x1.0p-52 - 1.0);
}

#endif
