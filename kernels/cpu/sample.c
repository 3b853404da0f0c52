/* Sampling, the reference (semantics in kernels_sample.h). One task per row.
 *
 * Every cut (top-N, top-k, top-p, the draw) is one question: in descending
 * key order, at which kept token does the running weight first exceed T?
 * It is answered by radix selection on the 64-bit key, eight passes of one
 * byte each over the row, as the CUDA twin does, so no sort and no scratch
 * is needed and sums are exact integers. Logits are only read: the adjusted
 * value of a penalised token is recomputed from its list entry on every
 * pass (the lists are sorted by token, so one cursor walks them along). */
#include "cpu_ops.h"

#include "common/common_assert.h"

#include <math.h>

typedef enum { KEY_RAW, KEY_PROB } key_kind;

typedef struct row_view {
    const float *z;
    int vocab;
    const int32_t *ptok, *pcnt; /* this row's penalty entries */
    int plen;
    const kernels_sample_params *sp;
    float a_max; /* KEY_PROB: the largest adjusted logit */
} row_view;

/* Walks a row in token order, giving each token's adjusted logit. */
typedef struct row_walk {
    const row_view *v;
    int cursor;
} row_walk;

static inline float adjusted(row_walk *w, int i)
{
    const row_view *v = w->v;
    float a = v->z[i];
    if (w->cursor < v->plen && v->ptok[w->cursor] == i) {
        a = kernels_sample_penalize(a, v->pcnt[w->cursor], v->sp);
        w->cursor++;
    }
    return a;
}

/* What a pass counts: tokens with key >= floor_key and p >= p_min
 * (KEY_PROB), weighted by 1 or by their fixed-point probability. */
typedef struct select_q {
    key_kind kind;
    bool weighted;
    uint64_t floor_key;
    float p_min;
} select_q;

static inline void token_key(const row_view *v, row_walk *w, key_kind kind, int i, uint64_t *key,
                             float *p)
{
    if (kind == KEY_RAW) {
        *key = kernels_sample_value_key(v->z[i], i);
        *p = 0.0f;
        return;
    }
    float a = adjusted(w, i);
    *p = kernels_sample_prob(a, v->a_max, v->sp->temperature);
    *key = kernels_sample_prob_key(*p, i);
}

/* Sum of weights of the tokens q counts. */
static uint64_t counted_total(const row_view *v, const select_q *q)
{
    row_walk w = {v, 0};
    uint64_t total = 0;
    for (int i = 0; i < v->vocab; i++) {
        uint64_t key;
        float p;
        token_key(v, &w, q->kind, i, &key, &p);
        if (key >= q->floor_key && p >= q->p_min)
            total += q->weighted ? kernels_sample_weight(p) : 1;
    }
    return total;
}

/* The key of the first counted token, in descending key order, at which
 * the running weight exceeds t. The counted total must exceed t. */
static uint64_t select_first_above(const row_view *v, const select_q *q, uint64_t t)
{
    uint64_t prefix = 0, prefix_mask = 0, above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        uint64_t hist[256] = {0};
        row_walk w = {v, 0};
        for (int i = 0; i < v->vocab; i++) {
            uint64_t key;
            float p;
            token_key(v, &w, q->kind, i, &key, &p);
            if (key < q->floor_key || p < q->p_min || (key & prefix_mask) != prefix)
                continue;
            hist[(key >> shift) & 255u] += q->weighted ? kernels_sample_weight(p) : 1;
        }
        int b = 255;
        for (; b > 0 && above + hist[b] <= t; b--)
            above += hist[b];
        prefix |= (uint64_t)b << shift;
        prefix_mask |= (uint64_t)255u << shift;
    }
    return prefix;
}

static inline int32_t key_id(uint64_t key)
{
    return (int32_t)(0xffffffffu - (uint32_t)key);
}

static void sample_row(const row_view *v0, kernels_sample_result *res)
{
    row_view v = *v0;
    const kernels_sample_params *sp = v.sp;

    /* 1. raw log-probabilities */
    float z_max = -INFINITY;
    for (int i = 0; i < v.vocab; i++)
        z_max = v.z[i] > z_max ? v.z[i] : z_max;
    double sum = 0.0;
    for (int i = 0; i < v.vocab; i++)
        sum += exp((double)v.z[i] - (double)z_max);
    double lse = (double)z_max + log(sum);

    int n = sp->logprobs < v.vocab ? sp->logprobs : v.vocab;
    if (n > 0) {
        select_q q = {KEY_RAW, false, 0, 0.0f};
        uint64_t cut = select_first_above(&v, &q, (uint64_t)n - 1);
        uint64_t keys[KERNELS_SAMPLE_LOGPROBS_MAX];
        int found = 0;
        for (int i = 0; i < v.vocab; i++) {
            uint64_t key = kernels_sample_value_key(v.z[i], i);
            if (key >= cut) {
                SHOAL_ASSERT(found < n);
                /* insertion, descending */
                int at = found++;
                while (at > 0 && keys[at - 1] < key) {
                    keys[at] = keys[at - 1];
                    at--;
                }
                keys[at] = key;
            }
        }
        SHOAL_ASSERT(found == n);
        for (int i = 0; i < n; i++) {
            int32_t id = key_id(keys[i]);
            res->top_ids[i] = id;
            res->top_logprobs[i] = (float)((double)v.z[id] - lse);
        }
    }

    /* 2.-3. penalties; greedy is the largest adjusted value key */
    row_walk w = {&v, 0};
    uint64_t best = 0;
    float a_max = -INFINITY;
    for (int i = 0; i < v.vocab; i++) {
        float a = adjusted(&w, i);
        uint64_t key = kernels_sample_value_key(a, i);
        best = key > best ? key : best;
        a_max = a > a_max ? a : a_max;
    }
    int32_t token;
    if (!(sp->temperature > 0.0f) || !isfinite(a_max)) {
        token = key_id(best);
    } else {
        /* 4. the cuts, then the draw */
        v.a_max = a_max;
        uint64_t cut = 0;
        if (kernels_sample_top_k_on(sp, v.vocab)) {
            select_q q = {KEY_PROB, false, 0, 0.0f};
            cut = select_first_above(&v, &q, (uint64_t)sp->top_k - 1);
        }
        if (sp->top_p < 1.0f) {
            select_q q = {KEY_PROB, true, cut, 0.0f};
            uint64_t target = kernels_sample_top_p_target(sp->top_p, counted_total(&v, &q));
            cut = select_first_above(&v, &q, target - 1);
        }
        select_q q = {KEY_PROB, true, cut, sp->min_p > 0.0f ? kernels_sample_min_p(sp) : 0.0f};
        uint64_t kept = counted_total(&v, &q);
        uint64_t t = kernels_mulhi64(kernels_sample_u64(sp->seed, sp->step), kept);
        token = key_id(select_first_above(&v, &q, t));
    }
    res->token = token;
    res->logprob = (float)((double)v.z[token] - lse);
}

struct sample_job {
    kernels_sample_result *results;
    const float *logits;
    int vocab;
    const kernels_sample_params *params;
    const int32_t *offsets, *tokens, *counts;
};

static void sample_task(void *ctx, int r, int thread)
{
    const struct sample_job *j = ctx;
    row_view v = {
        .z = j->logits + (size_t)r * (size_t)j->vocab,
        .vocab = j->vocab,
        .sp = &j->params[r],
    };
    if (j->offsets) {
        int b = j->offsets[r], e = j->offsets[r + 1];
        SHOAL_ASSERT(0 <= b && b <= e);
        v.ptok = j->tokens + b;
        v.pcnt = j->counts + b;
        v.plen = e - b;
        for (int i = 0; i < v.plen; i++)
            SHOAL_ASSERT(v.ptok[i] >= 0 && v.ptok[i] < j->vocab &&
                         (i == 0 || v.ptok[i - 1] < v.ptok[i]));
    }
    sample_row(&v, &j->results[r]);
}

void cpu_sample(kernels_backend *be, kernels_sample_result *results, const float *logits, int rows,
                int vocab, const kernels_sample_params *params, const int32_t *penalty_offsets,
                const int32_t *penalty_tokens, const int32_t *penalty_counts)
{
    SHOAL_ASSERT(rows >= 0 && vocab > 0);
    for (int r = 0; r < rows; r++)
        SHOAL_ASSERT(params[r].logprobs >= 0 && params[r].logprobs <= KERNELS_SAMPLE_LOGPROBS_MAX);
    struct sample_job j = {results, logits, vocab, params, penalty_offsets, penalty_tokens,
                           penalty_counts};
    common_pool_run(cpu_of(be)->pool, rows, sample_task, &j);
}
