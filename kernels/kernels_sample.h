/* kernels_sample.h: what the sample op computes, and the arithmetic that
 * every backend shares so that a stream's sampled tokens are the same on the
 * CPU and on a GPU, whatever else is in its batch.
 *
 * Per row, given raw logits z[0..vocab):
 *
 *  1. Raw log-probabilities: lp_i = z_i - logsumexp(z). The result holds the
 *     chosen token's lp and, when params.logprobs = N > 0, the N largest lp
 *     with their ids, ordered by lp descending, then id ascending.
 *  2. Penalties, for each (token t, output count c) of the row's list:
 *       repetition (HF):    a_t = a_t > 0 ? a_t / rp : a_t * rp
 *       presence, frequency (OpenAI): a_t = a_t - (presence * (c > 0) + frequency * c)
 *     in that order. Tokens seen only in the prompt are listed with c = 0:
 *     repetition applies to them, presence and frequency do not.
 *  3. temperature <= 0: the token is argmax a (lowest id among equal maxima),
 *     as it is when the largest a is not finite (a row masked to -inf).
 *  4. Else p_i = kernels_sample_exp((a_i - max a) / temperature): the largest
 *     p is exactly 1. Tokens are ordered by p descending, then id ascending
 *     (kernels_sample_prob_key). Each p is weighed as the integer
 *     w_i = floor(p_i * 2^40), so every sum below is exact and the same in
 *     any order on any device.
 *       top_k (1 <= k < vocab): keep the first k tokens.
 *       top_p (< 1): of those, keep the shortest prefix whose weight is at
 *         least top_p times their total weight (at least one token).
 *       min_p (> 0): of those, keep tokens with p_i >= min(min_p, 1).
 *     u is drawn from (seed, step) by kernels_sample_u64; the token is the
 *     first kept one, in order, at which the running weight exceeds
 *     floor(u * kept_total / 2^64).
 *
 * Everything here is plain IEEE single-precision arithmetic with no fused
 * multiply-add (the CUDA side is built with -fmad=false and C's default
 * contraction is off in ISO mode), so both sides compute the same bits. */
#ifndef SHOAL_KERNELS_SAMPLE_H
#define SHOAL_KERNELS_SAMPLE_H

#include "kernels/kernels_hd.h"

#include <stdint.h>

enum { KERNELS_SAMPLE_LOGPROBS_MAX = 20 };

/* One row's sampling parameters. */
typedef struct kernels_sample_params {
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0 or >= vocab: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; must be > 0 */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int32_t logprobs;         /* top raw log-probabilities to return, 0..20 */
    uint64_t seed;            /* the stream's seed */
    uint64_t step;            /* the stream's token index: u depends on both */
} kernels_sample_params;

/* One row's result. */
typedef struct kernels_sample_result {
    int32_t token;
    float logprob; /* raw log-probability of token */
    int32_t top_ids[KERNELS_SAMPLE_LOGPROBS_MAX];
    float top_logprobs[KERNELS_SAMPLE_LOGPROBS_MAX]; /* first params.logprobs are set */
} kernels_sample_result;

#ifdef __cplusplus
static_assert(sizeof(kernels_sample_params) == 48, "kernels_sample_params layout");
static_assert(sizeof(kernels_sample_result) == 168, "kernels_sample_result layout");
#else
_Static_assert(sizeof(kernels_sample_params) == 48, "kernels_sample_params layout");
_Static_assert(sizeof(kernels_sample_result) == 168, "kernels_sample_result layout");
#endif

/* Weight of probability 1 in the fixed-point sums: 2^40. With at most 2^22
 * tokens a row's total stays under 2^62. */
#define KERNELS_SAMPLE_ONE 1099511627776.0

/* SplitMix64's output function of one step from x (Steele et al.). */
KERNELS_HD uint64_t kernels_splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The uniform draw of a stream's step, as 64 bits (u = value / 2^64):
 * counter-based, so it depends on nothing but (seed, step). */
KERNELS_HD uint64_t kernels_sample_u64(uint64_t seed, uint64_t step)
{
    return kernels_splitmix64(seed ^ (step * 0xd1342543de82ef95ull));
}

/* floor(a * b / 2^64) */
KERNELS_HD uint64_t kernels_mulhi64(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
    return __umul64hi(a, b);
#else
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

/* e^x for x <= 0 in single precision, within 2 ulp of the true value, and
 * exactly 1 at 0; 0 under -87 (no subnormals) and for NaN. The library exp
 * differs between the C library and CUDA in the last bit, which would move
 * a sampling boundary; this one is the same everywhere. */
KERNELS_HD float kernels_sample_exp(float x)
{
    if (!(x > -87.0f)) /* also NaN and -inf */
        return 0.0f;
    if (x >= 0.0f)
        return 1.0f;
    /* x = n ln2 + r, |r| <= ln2 / 2; ln2 split so n * ln2_hi is exact */
    float n = x * 1.44269504f;
    n = n >= 0.0f ? (float)(int)(n + 0.5f) : -(float)(int)(0.5f - n);
    float r = x - n * 0.693145752f;
    r = r - n * 1.42860677e-6f;
    /* Taylor to degree 7 on |r| <= 0.347: truncation under 2^-25 */
    float p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int e = (int)n + 127; /* n in [-126, 0]: a normal power of two */
    return p * kernels_bits_f32((uint32_t)e << 23);
}

/* w = floor(p * 2^40) for p in [0, 1]. */
KERNELS_HD uint64_t kernels_sample_weight(float p)
{
    return (uint64_t)((double)p * KERNELS_SAMPLE_ONE);
}

/* A total order of (value desc, id asc) as one unsigned key, larger first:
 * the value's bits made monotone in the high half, the id reversed in the
 * low half. NaN orders as -inf; -0 as +0. */
KERNELS_HD uint64_t kernels_sample_value_key(float v, int32_t id)
{
    if (v != v)
        v = kernels_bits_f32(0xff800000u);
    if (v == 0.0f)
        v = 0.0f;
    uint32_t u = kernels_f32_bits(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

/* The order of step 4: p (>= 0) descending, then id ascending. */
KERNELS_HD uint64_t kernels_sample_prob_key(float p, int32_t id)
{
    return ((uint64_t)kernels_f32_bits(p) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

/* Step 2 for one listed token. */
KERNELS_HD float kernels_sample_penalize(float a, int32_t count, const kernels_sample_params *sp)
{
    if (sp->repetition_penalty != 1.0f)
        a = a > 0.0f ? a / sp->repetition_penalty : a * sp->repetition_penalty;
    float presence = count > 0 ? sp->presence_penalty : 0.0f;
    float frequency = sp->frequency_penalty * (float)count;
    return a - (presence + frequency);
}

/* Step 4's probability of adjusted logit a, given the row's max and the
 * temperature. */
KERNELS_HD float kernels_sample_prob(float a, float a_max, float temperature)
{
    return kernels_sample_exp((a - a_max) / temperature);
}

/* top_k active for this row? */
KERNELS_HD int kernels_sample_top_k_on(const kernels_sample_params *sp, int vocab)
{
    return sp->top_k > 0 && sp->top_k < vocab;
}

/* top_p's weight target out of the top-k total: at least 1, so the set is
 * never empty. */
KERNELS_HD uint64_t kernels_sample_top_p_target(float top_p, uint64_t total)
{
    double t = (double)top_p * (double)total;
    uint64_t target = t <= 0.0 ? 0 : (uint64_t)t;
    if ((double)target < t)
        target++; /* ceil: the prefix weight must reach top_p * total */
    return target ? target : 1;
}

KERNELS_HD float kernels_sample_min_p(const kernels_sample_params *sp)
{
    return sp->min_p > 1.0f ? 1.0f : sp->min_p;
}

#endif
