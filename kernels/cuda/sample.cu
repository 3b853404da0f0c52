/* Sampling: the twin of kernels/cpu/sample.c, semantics in kernels_sample.h.
 *
 * One block per row. Each thread owns a contiguous run of the vocabulary, so
 * it can walk the row's sorted penalty list with one cursor, as the CPU
 * does, and see adjusted logits without writing them anywhere. Every cut is
 * a radix selection on the 64-bit key, a byte per pass, with the counts or
 * fixed-point weights of each byte value summed in shared memory by integer
 * atomics: integer sums do not depend on their order, so the chosen token
 * is the CPU's to the bit. This file is built with -fmad=false, so the
 * shared float arithmetic (kernels_sample.h) rounds as on the host. */
#include "cuda_ops.h"

#include <math.h>

enum { SAMPLE_THREADS = 512 };

typedef unsigned long long u64;

struct srow {
    const float *z;
    int vocab;
    const int32_t *ptok, *pcnt;
    int plen;
    kernels_sample_params sp;
    float a_max;
    int c0, c1; /* this thread's tokens */
    int cur0;   /* first penalty entry at or after c0 */
};

/* Calls f(i, value) for this thread's tokens in order: the raw logit, or
 * with adjust the penalised one. */
template <typename F> static __device__ __forceinline__ void walk(const srow &v, bool adjust, F f)
{
    int cur = v.cur0;
    for (int i = v.c0; i < v.c1; i++) {
        float a = v.z[i];
        if (adjust && cur < v.plen && v.ptok[cur] == i) {
            a = kernels_sample_penalize(a, v.pcnt[cur], &v.sp);
            cur++;
        }
        f(i, a);
    }
}

struct select_q {
    bool prob; /* KEY_PROB (adjusted, p) or raw value keys */
    bool weighted;
    u64 floor_key;
    float p_min;
};

/* key, p, counted? and weight of token i with value a */
static __device__ __forceinline__ bool counted(const srow &v, const select_q &q, int i, float a,
                                               u64 *key, u64 *w)
{
    float p = 0.0f;
    if (q.prob) {
        p = kernels_sample_prob(a, v.a_max, v.sp.temperature);
        *key = kernels_sample_prob_key(p, i);
    } else {
        *key = kernels_sample_value_key(a, i);
    }
    *w = q.weighted ? kernels_sample_weight(p) : 1;
    return *key >= q.floor_key && p >= q.p_min;
}

struct sample_shared {
    u64 hist[256];
    u64 pick[2];
    u64 red_u[32];
    double red_d[32];
    float red_f[32];
    u64 cand[KERNELS_SAMPLE_LOGPROBS_MAX];
    int ncand;
};

static __device__ u64 counted_total(const srow &v, const select_q &q, sample_shared &sh)
{
    u64 total = 0;
    walk(v, q.prob, [&](int i, float a) {
        u64 key, w;
        if (counted(v, q, i, a, &key, &w))
            total += w;
    });
    return block_reduce(total, op_add(), sh.red_u);
}

/* The key of the first counted token, in descending key order, at which
 * the running weight exceeds t (the counted total must exceed t). */
static __device__ u64 select_first_above(const srow &v, const select_q &q, u64 t,
                                         sample_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 prefix = 0, mask = 0, above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            sh.hist[b] = 0;
        __syncthreads();
        walk(v, q.prob, [&](int i, float a) {
            u64 key, w;
            if (counted(v, q, i, a, &key, &w) && (key & mask) == prefix)
                atomicAdd(&sh.hist[(key >> shift) & 255u], w);
        });
        __syncthreads();
        if (warp == 0) {
            /* lane l holds bins 255 - 8l down to 248 - 8l: lanes in key order */
            int top = 255 - 8 * lane;
            u64 s = 0;
            for (int j = 0; j < 8; j++)
                s += sh.hist[top - j];
            u64 incl = s;
            for (int o = 1; o < 32; o <<= 1) {
                u64 n = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += n;
            }
            unsigned hit = __ballot_sync(0xffffffffu, above + incl > t);
            int first = hit ? __ffs(hit) - 1 : 31;
            if (lane == first) {
                u64 run = above + incl - s;
                int b = top - 7;
                for (int j = 0; j < 8; j++) {
                    if (run + sh.hist[top - j] > t) {
                        b = top - j;
                        break;
                    }
                    run += sh.hist[top - j];
                }
                sh.pick[0] = (u64)b;
                sh.pick[1] = run;
            }
        }
        __syncthreads();
        prefix |= sh.pick[0] << shift;
        above = sh.pick[1];
        mask |= (u64)255u << shift;
    }
    return prefix;
}

static __device__ __forceinline__ int32_t key_id(u64 key)
{
    return (int32_t)(0xffffffffu - (uint32_t)key);
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(kernels_sample_result *results, const float *logits, int vocab,
                  const kernels_sample_params *params, const int32_t *offsets,
                  const int32_t *tokens, const int32_t *counts)
{
    __shared__ sample_shared sh;
    const int row = blockIdx.x;
    srow v;
    v.z = logits + (size_t)row * (size_t)vocab;
    v.vocab = vocab;
    v.sp = params[row];
    v.a_max = 0.0f;
    v.ptok = v.pcnt = NULL;
    v.plen = 0;
    if (offsets) {
        int b = offsets[row];
        v.ptok = tokens + b;
        v.pcnt = counts + b;
        v.plen = offsets[row + 1] - b;
    }
    int per = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
    v.c0 = min(vocab, (int)threadIdx.x * per);
    v.c1 = min(vocab, v.c0 + per);
    int lo = 0, hi = v.plen; /* lower bound of c0 in the sorted list */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v.ptok[mid] < v.c0)
            lo = mid + 1;
        else
            hi = mid;
    }
    v.cur0 = lo;
    kernels_sample_result *res = &results[row];

    /* 1. raw log-probabilities */
    float z_max = -INFINITY;
    walk(v, false, [&](int i, float a) { z_max = fmaxf(z_max, a); });
    z_max = block_reduce(z_max, op_max(), sh.red_f);
    double sum = 0.0;
    walk(v, false, [&](int i, float a) { sum += exp((double)a - (double)z_max); });
    sum = block_reduce(sum, op_add(), sh.red_d);
    const double lse = (double)z_max + log(sum);

    int n = v.sp.logprobs < vocab ? v.sp.logprobs : vocab;
    if (n > 0) {
        select_q q = {false, false, 0, 0.0f};
        u64 cut = select_first_above(v, q, (u64)n - 1, sh);
        if (threadIdx.x == 0)
            sh.ncand = 0;
        __syncthreads();
        walk(v, false, [&](int i, float a) {
            u64 key = kernels_sample_value_key(a, i);
            if (key >= cut)
                sh.cand[atomicAdd(&sh.ncand, 1)] = key;
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            /* exactly n candidates; order them by key, descending */
            for (int i = 1; i < n; i++) {
                u64 key = sh.cand[i];
                int at = i;
                while (at > 0 && sh.cand[at - 1] < key) {
                    sh.cand[at] = sh.cand[at - 1];
                    at--;
                }
                sh.cand[at] = key;
            }
            for (int i = 0; i < n; i++) {
                int32_t id = key_id(sh.cand[i]);
                res->top_ids[i] = id;
                res->top_logprobs[i] = (float)((double)v.z[id] - lse);
            }
        }
    }

    /* 2.-3. penalties; greedy takes the largest adjusted value key */
    u64 best = 0;
    float a_max = -INFINITY;
    walk(v, true, [&](int i, float a) {
        u64 key = kernels_sample_value_key(a, i);
        best = key > best ? key : best;
        a_max = fmaxf(a_max, a);
    });
    best = block_reduce(best, op_max(), sh.red_u);
    a_max = block_reduce(a_max, op_max(), sh.red_f);
    int32_t token;
    if (!(v.sp.temperature > 0.0f) || !isfinite(a_max)) {
        token = key_id(best);
    } else {
        /* 4. the cuts, then the draw */
        v.a_max = a_max;
        u64 cut = 0;
        if (kernels_sample_top_k_on(&v.sp, vocab)) {
            select_q q = {true, false, 0, 0.0f};
            cut = select_first_above(v, q, (u64)v.sp.top_k - 1, sh);
        }
        if (v.sp.top_p < 1.0f) {
            select_q q = {true, true, cut, 0.0f};
            u64 target = kernels_sample_top_p_target(v.sp.top_p, counted_total(v, q, sh));
            cut = select_first_above(v, q, target - 1, sh);
        }
        select_q q = {true, true, cut, v.sp.min_p > 0.0f ? kernels_sample_min_p(&v.sp) : 0.0f};
        u64 kept = counted_total(v, q, sh);
        u64 t = kernels_mulhi64(kernels_sample_u64(v.sp.seed, v.sp.step), kept);
        token = key_id(select_first_above(v, q, t, sh));
    }
    if (threadIdx.x == 0) {
        res->token = token;
        res->logprob = (float)((double)v.z[token] - lse);
    }
}

void cuda_sample(kernels_backend *be, kernels_sample_result *results, const float *logits,
                 int rows, int vocab, const kernels_sample_params *params,
                 const int32_t *penalty_offsets, const int32_t *penalty_tokens,
                 const int32_t *penalty_counts)
{
    SHOAL_ASSERT(rows >= 0 && vocab > 0);
    SHOAL_ASSERT((penalty_offsets == NULL) == (penalty_tokens == NULL) &&
                 (penalty_tokens == NULL) == (penalty_counts == NULL));
    CUDA_ASSERT_ALIGNED(results, 8);
    CUDA_ASSERT_ALIGNED(params, 8);
    CUDA_ASSERT_ALIGNED(logits, 4);
    if (rows == 0 || !cuda_usable(be))
        return;
    sample_kernel<<<rows, SAMPLE_THREADS, 0, cuda_of(be)->stream>>>(
        results, logits, vocab, params, penalty_offsets, penalty_tokens, penalty_counts);
    cuda_launched(be, "sample");
}
