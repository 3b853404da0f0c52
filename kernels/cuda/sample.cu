/* Sampling: the twin of kernels/cpu/sample.c, semantics in kernels_sample.h.
 *
 * Two passes (the default, SHOAL_CUDA_SAMPLE=1):
 *   - sample_scan: (row, chunk) blocks, as many chunks a row as it takes
 *     for the round to fill the GPU (a lone 151,936-logit row in 64 chunks).
 *     Threads stride through their chunk by the block in 16-byte loads,
 *     and each block writes its chunk's raw max and sum of exp (for the
 *     log-sum-exp), its largest adjusted value key (greedy's token) and
 *     largest adjusted value (the temperature path's max).
 *   - sample_kernel<true>: one block a row merges its chunks; a greedy row
 *     without logprobs is then done. The rest walk the row with the same
 *     strided loads, penalised tokens marked in a shared bitmap of the
 *     vocabulary (the count is found by binary search in the sorted list).
 * The first version (SHOAL_CUDA_SAMPLE=0, sample_kernel<false>): one block
 * a row, each thread walking its own contiguous run of the vocabulary with
 * one cursor in the penalty list, as the CPU does. Its loads are not
 * coalesced: 118 us for one row of 151,936 on an H200 (kernels/lab).
 *
 * Every choice is made on keys or integer weights whose maximum or sum
 * does not depend on the order the elements are seen in (ties: the lower
 * id, kernels_sample_value_key), so both versions and any chunking pick
 * the CPU's token to the bit; only the log-sum-exp, a double sum, rounds
 * differently. Every cut is a radix selection on the 64-bit key, a byte
 * per pass, with the counts or fixed-point weights of each byte value
 * summed in shared memory by integer atomics. This file is built with
 * -fmad=false, so the shared float arithmetic (kernels_sample.h) rounds as
 * on the host. */
#include "cuda_ops.h"

#include <math.h>

enum {
    SAMPLE_THREADS = 512,
    SCAN_THREADS = 256,
    /* a chunk's fewest logits: 2,048 floats are two 16-byte loads a thread */
    SCAN_CHUNK_MIN = 2048,
};

typedef unsigned long long u64;

/* ---- what both kernels share ---- */

/* Penalties change nothing (kernels_sample_penalize is the identity up to
 * the sign of a zero, which no key or probability sees). */
static __device__ __forceinline__ bool penalties_on(const kernels_sample_params &sp)
{
    return !(sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f &&
             sp.frequency_penalty == 0.0f);
}

/* First index of the sorted list at or after token t. */
static __device__ __forceinline__ int lower_bound(const int32_t *ptok, int lo, int hi, int t)
{
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ptok[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Calls f(i, z[i]) for i in [b, e), the block's threads striding through
 * it: 16-byte loads where the row is 16-byte aligned (b is a multiple of
 * 4), four in flight a thread. */
template <typename F>
static __device__ __forceinline__ void each_logit(const float *z, int b, int e, F f)
{
    if (((uintptr_t)z & 15) == 0) {
        const float4 *z4 = (const float4 *)(z + b);
        const int n4 = (e - b) >> 2;
#pragma unroll 4
        for (int j = threadIdx.x; j < n4; j += blockDim.x) {
            float4 x = z4[j];
            int i = b + 4 * j;
            f(i, x.x);
            f(i + 1, x.y);
            f(i + 2, x.z);
            f(i + 3, x.w);
        }
        b += n4 * 4;
    }
    for (int i = b + (int)threadIdx.x; i < e; i += blockDim.x)
        f(i, z[i]);
}

/* Marks the listed tokens of [b, e) in bits (bit i - b); the block's
 * threads, then a barrier. */
static __device__ void mark_listed(unsigned *bits, int b, int e, const int32_t *ptok, int plen)
{
    const int words = (e - b + 31) / 32;
    for (int w = threadIdx.x; w < words; w += blockDim.x)
        bits[w] = 0;
    __syncthreads();
    const int lo = lower_bound(ptok, 0, plen, b), hi = lower_bound(ptok, lo, plen, e);
    for (int k = lo + (int)threadIdx.x; k < hi; k += blockDim.x) {
        int t = ptok[k] - b;
        atomicOr(&bits[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
}

/* Token i's adjusted value, given its raw value a and the bitmap of
 * [b, ...). A listed token's count is found in the list itself (the first
 * entry of the token, as the CPU's cursor finds it). */
static __device__ __forceinline__ float adjusted(float a, int i, const unsigned *bits, int b,
                                                 const int32_t *ptok, const int32_t *pcnt,
                                                 int plen, const kernels_sample_params &sp)
{
    int t = i - b;
    if (bits[t >> 5] & (1u << (t & 31)))
        a = kernels_sample_penalize(a, pcnt[lower_bound(ptok, 0, plen, i)], &sp);
    return a;
}

/* One chunk's summary (sample_scan's output). */
struct sample_part {
    double sum;  /* sum of e^(z - z_max) over the chunk's raw logits */
    u64 best;    /* largest value key of the adjusted logits */
    float z_max; /* largest raw logit (fmaxf: NaN is passed over) */
    float a_max; /* largest adjusted logit */
};
static_assert(sizeof(sample_part) == CUDA_SAMPLE_PART_BYTES, "sample_part layout");

/* ---- pass 1 of the default path: chunks ---- */

static __global__ void __launch_bounds__(SCAN_THREADS)
    sample_scan(sample_part *parts, const float *logits, int vocab, int chunk,
                const kernels_sample_params *params, const int32_t *offsets,
                const int32_t *tokens, const int32_t *counts)
{
    extern __shared__ unsigned scan_bits[]; /* chunk bits */
    __shared__ float red_f[32];
    __shared__ double red_d[32];
    __shared__ u64 red_u[32];
    const int row = blockIdx.y, part = blockIdx.x;
    const int b = part * chunk, e = min(vocab, b + chunk);
    const float *z = logits + (size_t)row * (size_t)vocab;
    const kernels_sample_params sp = params[row];
    const int32_t *ptok = NULL, *pcnt = NULL;
    int plen = 0;
    if (offsets) {
        int o = offsets[row];
        ptok = tokens + o;
        pcnt = counts + o;
        plen = offsets[row + 1] - o;
    }
    const bool adjust = plen > 0 && penalties_on(sp);
    if (adjust)
        mark_listed(scan_bits, b, e, ptok, plen);

    float z_max = -INFINITY, a_max = -INFINITY;
    u64 best = 0;
    each_logit(z, b, e, [&](int i, float a) {
        z_max = fmaxf(z_max, a);
        if (adjust)
            a = adjusted(a, i, scan_bits, b, ptok, pcnt, plen, sp);
        u64 key = kernels_sample_value_key(a, i);
        best = key > best ? key : best;
        a_max = fmaxf(a_max, a);
    });
    z_max = block_reduce(z_max, op_max(), red_f);
    a_max = block_reduce(a_max, op_max(), red_f);
    best = block_reduce(best, op_max(), red_u);
    /* second read of the chunk, from L2: -inf adds nothing (also when the
     * chunk's max is -inf, where e^(-inf - -inf) would be NaN); NaN stays.
     * Each term by expf, summed in double: the logprob within 1e-7 of the
     * CPU's exp in double, where double exp at every logit made the scan
     * of 64 rows 42 us on the H200 (29 by expf; kernels/lab row 26.4) */
    double sum = 0.0;
    each_logit(z, b, e, [&](int i, float a) {
        if (a != -INFINITY)
            sum += (double)expf(a - z_max);
    });
    sum = block_reduce(sum, op_add(), red_d);
    if (threadIdx.x == 0) {
        sample_part p;
        p.sum = sum;
        p.best = best;
        p.z_max = z_max;
        p.a_max = a_max;
        parts[(size_t)row * gridDim.x + part] = p;
    }
}

/* ---- the row kernel ---- */

struct srow {
    const float *z;
    int vocab;
    const int32_t *ptok, *pcnt;
    int plen;
    kernels_sample_params sp;
    float a_max;
    /* SPLIT: the listed tokens' bitmap, built when the walk adjusts */
    const unsigned *bits;
    bool bits_on;
    /* first version: this thread's tokens [c0, c1), first entry >= c0 */
    int c0, c1;
    int cur0;
};

/* Calls f(i, value) for every token of the row this thread sees: the raw
 * logit, or with adjust the penalised one. In any order: every caller
 * takes a max, an integer sum or a set. */
template <bool SPLIT, typename F>
static __device__ __forceinline__ void walk(const srow &v, bool adjust, F f)
{
    if constexpr (SPLIT) {
        const bool adj = adjust && v.bits_on;
        each_logit(v.z, 0, v.vocab, [&](int i, float a) {
            if (adj)
                a = adjusted(a, i, v.bits, 0, v.ptok, v.pcnt, v.plen, v.sp);
            f(i, a);
        });
    } else {
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
    double lse; /* SPLIT: the merged chunks */
    u64 best;
    float a_max;
};

template <bool SPLIT>
static __device__ u64 counted_total(const srow &v, const select_q &q, sample_shared &sh)
{
    u64 total = 0;
    walk<SPLIT>(v, q.prob, [&](int i, float a) {
        u64 key, w;
        if (counted(v, q, i, a, &key, &w))
            total += w;
    });
    return block_reduce(total, op_add(), sh.red_u);
}

/* The key of the first counted token, in descending key order, at which
 * the running weight exceeds t (the counted total must exceed t). */
template <bool SPLIT>
static __device__ u64 select_first_above(const srow &v, const select_q &q, u64 t,
                                         sample_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 prefix = 0, mask = 0, above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            sh.hist[b] = 0;
        __syncthreads();
        walk<SPLIT>(v, q.prob, [&](int i, float a) {
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

/* The row's chunks merged by warp 0 into sh.lse, sh.best and sh.a_max, in
 * a fixed order (the same bits every run). The log-sum-exp of a row whose
 * every logit is -inf (or NaN) is NaN, as the first version's
 * e^(-inf - -inf) makes it. */
static __device__ void merge_parts(const sample_part *p, int n, sample_shared &sh)
{
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float z_max = -INFINITY, a_max = -INFINITY;
        u64 best = 0;
        for (int c = lane; c < n; c += 32) {
            z_max = fmaxf(z_max, p[c].z_max);
            a_max = fmaxf(a_max, p[c].a_max);
            best = p[c].best > best ? p[c].best : best;
        }
        z_max = warp_reduce(z_max, op_max());
        a_max = warp_reduce(a_max, op_max());
        best = warp_reduce(best, op_max());
        double sum = 0.0;
        for (int c = lane; c < n; c += 32)
            if (p[c].sum != 0.0) /* also skips a chunk of -inf alone */
                sum += p[c].sum * exp((double)p[c].z_max - (double)z_max);
        sum = warp_reduce(sum, op_add());
        if (lane == 0) {
            sh.lse = z_max == -INFINITY ? (double)NAN : (double)z_max + log(sum);
            sh.best = best;
            sh.a_max = a_max;
        }
    }
    __syncthreads();
}

template <bool SPLIT>
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(kernels_sample_result *results, const float *logits, int vocab,
                  const kernels_sample_params *params, const int32_t *offsets,
                  const int32_t *tokens, const int32_t *counts, const sample_part *parts,
                  int nparts)
{
    __shared__ sample_shared sh;
    extern __shared__ unsigned row_bits[]; /* SPLIT: vocab bits */
    const int row = blockIdx.x;
    srow v;
    v.z = logits + (size_t)row * (size_t)vocab;
    v.vocab = vocab;
    v.sp = params[row];
    v.a_max = 0.0f;
    v.ptok = v.pcnt = NULL;
    v.plen = 0;
    v.bits = row_bits;
    v.bits_on = false;
    if (offsets) {
        int b = offsets[row];
        v.ptok = tokens + b;
        v.pcnt = counts + b;
        v.plen = offsets[row + 1] - b;
    }
    int per = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
    v.c0 = min(vocab, (int)threadIdx.x * per);
    v.c1 = min(vocab, v.c0 + per);
    v.cur0 = SPLIT ? 0 : lower_bound(v.ptok, 0, v.plen, v.c0);
    kernels_sample_result *res = &results[row];

    /* 1. raw log-probabilities */
    double lse;
    if constexpr (SPLIT) {
        merge_parts(parts + (size_t)row * nparts, nparts, sh);
        lse = sh.lse;
    } else {
        float z_max = -INFINITY;
        walk<SPLIT>(v, false, [&](int i, float a) { z_max = fmaxf(z_max, a); });
        z_max = block_reduce(z_max, op_max(), sh.red_f);
        double sum = 0.0;
        walk<SPLIT>(v, false, [&](int i, float a) { sum += exp((double)a - (double)z_max); });
        sum = block_reduce(sum, op_add(), sh.red_d);
        lse = (double)z_max + log(sum);
    }

    int n = v.sp.logprobs < vocab ? v.sp.logprobs : vocab;
    if (n > 0) {
        select_q q = {false, false, 0, 0.0f};
        u64 cut = select_first_above<SPLIT>(v, q, (u64)n - 1, sh);
        if (threadIdx.x == 0)
            sh.ncand = 0;
        __syncthreads();
        walk<SPLIT>(v, false, [&](int i, float a) {
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
    if constexpr (SPLIT) {
        best = sh.best;
        a_max = sh.a_max;
    } else {
        walk<SPLIT>(v, true, [&](int i, float a) {
            u64 key = kernels_sample_value_key(a, i);
            best = key > best ? key : best;
            a_max = fmaxf(a_max, a);
        });
        best = block_reduce(best, op_max(), sh.red_u);
        a_max = block_reduce(a_max, op_max(), sh.red_f);
    }
    int32_t token;
    if (!(v.sp.temperature > 0.0f) || !isfinite(a_max)) {
        token = key_id(best);
    } else {
        /* 4. the cuts, then the draw */
        if constexpr (SPLIT) {
            if (v.plen > 0 && penalties_on(v.sp)) {
                mark_listed(row_bits, 0, vocab, v.ptok, v.plen);
                v.bits_on = true;
            }
        }
        v.a_max = a_max;
        u64 cut = 0;
        if (kernels_sample_top_k_on(&v.sp, vocab)) {
            select_q q = {true, false, 0, 0.0f};
            cut = select_first_above<SPLIT>(v, q, (u64)v.sp.top_k - 1, sh);
        }
        if (v.sp.top_p < 1.0f) {
            select_q q = {true, true, cut, 0.0f};
            u64 target =
                kernels_sample_top_p_target(v.sp.top_p, counted_total<SPLIT>(v, q, sh));
            cut = select_first_above<SPLIT>(v, q, target - 1, sh);
        }
        select_q q = {true, true, cut, v.sp.min_p > 0.0f ? kernels_sample_min_p(&v.sp) : 0.0f};
        u64 kept = counted_total<SPLIT>(v, q, sh);
        u64 t = kernels_mulhi64(kernels_sample_u64(v.sp.seed, v.sp.step), kept);
        token = key_id(select_first_above<SPLIT>(v, q, t, sh));
    }
    if (threadIdx.x == 0) {
        res->token = token;
        res->logprob = (float)((double)v.z[token] - lse);
    }
}

/* Chunks a row gets in a round of `rows`: about four blocks a
 * multiprocessor over the round, chunks of at least SCAN_CHUNK_MIN logits,
 * at most CUDA_SAMPLE_PARTS_MAX. From the round's shape alone, so a graph
 * of the round launches the same grid every time. */
static int scan_parts(int sm_count, int rows, int vocab, int *chunk)
{
    long long want = (4LL * sm_count + rows - 1) / rows;
    long long most = ((long long)vocab + SCAN_CHUNK_MIN - 1) / SCAN_CHUNK_MIN;
    long long n = want < most ? want : most;
    n = n < CUDA_SAMPLE_PARTS_MAX ? n : CUDA_SAMPLE_PARTS_MAX;
    n = n < 1 ? 1 : n;
    /* a multiple of 4 (16-byte loads); then no chunk is empty */
    long long c = ((vocab + n - 1) / n + 3) / 4 * 4;
    *chunk = (int)c;
    return (int)((vocab + c - 1) / c);
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
    cuda_state *st = cuda_of(be);
    int chunk = 0;
    int nparts = scan_parts(st->sm_count, rows, vocab, &chunk);
    /* the split path's bitmaps (a chunk's, a row's) fit in shared memory
     * and its chunk summaries in the scratch, or the first version runs */
    bool split = st->sample_split && vocab <= CUDA_SAMPLE_BITMAP_TOKENS_MAX &&
                 (size_t)rows * (size_t)nparts <= (size_t)st->sample_parts_max;
    if (split) {
        sample_part *parts = (sample_part *)st->sample_parts;
        size_t chunk_bits = ((size_t)chunk + 31) / 32 * 4;
        size_t row_bits = ((size_t)vocab + 31) / 32 * 4;
        dim3 grid((unsigned)nparts, (unsigned)rows);
        sample_scan<<<grid, SCAN_THREADS, chunk_bits, st->stream>>>(
            parts, logits, vocab, chunk, params, penalty_offsets, penalty_tokens,
            penalty_counts);
        if (!cuda_launched(be, "sample scan"))
            return;
        sample_kernel<true><<<rows, SAMPLE_THREADS, row_bits, st->stream>>>(
            results, logits, vocab, params, penalty_offsets, penalty_tokens, penalty_counts,
            parts, nparts);
    } else {
        sample_kernel<false><<<rows, SAMPLE_THREADS, 0, st->stream>>>(
            results, logits, vocab, params, penalty_offsets, penalty_tokens, penalty_counts,
            NULL, 0);
    }
    cuda_launched(be, "sample");
}
