/* Mixture of experts on the CPU: routing (softmax, top-k) and the experts'
 * SwiGLU MLPs over the pairs (row, slot) that the routing gives.
 *
 * moe_experts sorts the pairs by expert (stable: pair order within an
 * expert) and runs each expert's three matmuls over the rows it got, so
 * that an expert's weights stream once a pass and only experts some row
 * routes to are read. Every element is a matmul's dot product in its fixed
 * order and the weighted sum goes slot by slot, so a row's output does not
 * depend on which rows share its pass (batch invariance, as every CPU op). */
#include "cpu_ops.h"

#include "common/common_assert.h"

#include <math.h>
#include <string.h>

void cpu_moe_route(kernels_backend *be, int32_t *ids, float *weights, const float *logits, int rows,
                   int experts, int topk, bool renorm)
{
    (void)be;
    SHOAL_ASSERT(topk >= 1 && topk <= experts && experts <= SHOAL_MODEL_EXPERTS_MAX);
    float p[SHOAL_MODEL_EXPERTS_MAX];
    bool taken[SHOAL_MODEL_EXPERTS_MAX];
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * (size_t)experts;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < experts; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < experts; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
            taken[e] = false;
        }
        float picked = 0.0f;
        int32_t *id = ids + (size_t)r * (size_t)topk;
        float *w = weights + (size_t)r * (size_t)topk;
        for (int j = 0; j < topk; j++) {
            int best = -1;
            for (int e = 0; e < experts; e++)
                if (!taken[e] && (best < 0 || p[e] > p[best]))
                    best = e;
            taken[best] = true;
            id[j] = best;
            w[j] = p[best] / sum;
            picked += w[j];
        }
        if (renorm)
            for (int j = 0; j < topk; j++)
                w[j] /= picked;
    }
}

/* The scratch's regions, for pairs = rows x topk (all F32 but the two
 * index lists): inputs gathered by expert [pairs][k], gate and up
 * [pairs][n] each, expert outputs [pairs][k], the sorted pairs and each
 * pair's place in that order. */
typedef struct moe_scratch {
    float *x, *g, *u, *y;
    int32_t *order, *place;
} moe_scratch;

static size_t scratch_layout(int rows, int topk, int n, int k, unsigned char *base, moe_scratch *s)
{
    size_t pairs = (size_t)rows * (size_t)topk, at = 0;
    size_t fx = pairs * (size_t)k * 4, fn = pairs * (size_t)n * 4, fi = pairs * 4;
    if (s) {
        s->x = (float *)(base + at);
        s->g = (float *)(base + at + fx);
        s->u = (float *)(base + at + fx + fn);
        s->y = (float *)(base + at + fx + 2 * fn);
        s->order = (int32_t *)(base + at + 2 * fx + 2 * fn);
        s->place = (int32_t *)(base + at + 2 * fx + 2 * fn + fi);
    }
    return 2 * fx + 2 * fn + 2 * fi;
}

size_t cpu_moe_scratch_bytes(kernels_backend *be, int rows, int topk, int n, int k)
{
    (void)be;
    return scratch_layout(rows, topk, n, k, NULL, NULL);
}

void cpu_moe_experts(kernels_backend *be, void *out, const void *in, const int32_t *ids,
                     const float *weights, int rows, int topk, const kernels_weight *wg,
                     const kernels_weight *wu, const kernels_weight *wd, void *scratch)
{
    int n = (int)wg->rows, k = (int)wg->cols, experts = wg->experts;
    SHOAL_ASSERT(wg->format == KERNELS_WEIGHT_DENSE && wu->dtype == wg->dtype &&
                 wd->dtype == wg->dtype && wd->rows == k && wd->cols == n && wu->rows == n &&
                 wu->cols == k && wu->experts == experts && wd->experts == experts);
    moe_scratch s;
    scratch_layout(rows, topk, n, k, scratch, &s);
    int pairs = rows * topk;
    /* counting sort of the pairs by expert */
    int count[SHOAL_MODEL_EXPERTS_MAX + 1] = {0};
    for (int p = 0; p < pairs; p++) {
        SHOAL_ASSERT(ids[p] >= 0 && ids[p] < experts);
        count[ids[p] + 1]++;
    }
    for (int e = 0; e < experts; e++)
        count[e + 1] += count[e];
    int fill[SHOAL_MODEL_EXPERTS_MAX];
    memcpy(fill, count, (size_t)experts * sizeof fill[0]);
    for (int p = 0; p < pairs; p++) {
        int at = fill[ids[p]]++;
        s.order[at] = p;
        s.place[p] = at;
    }
    const float *x = in;
    for (int at = 0; at < pairs; at++)
        memcpy(s.x + (size_t)at * (size_t)k, x + (size_t)(s.order[at] / topk) * (size_t)k,
               (size_t)k * sizeof(float));
    for (int e = 0; e < experts; e++) {
        int r0 = count[e], m = count[e + 1] - count[e];
        if (m == 0)
            continue; /* an expert no row routes to is never read */
        float *g = s.g + (size_t)r0 * (size_t)n;
        cpu_matmul_swiglu(be, g, s.u + (size_t)r0 * (size_t)n, s.x + (size_t)r0 * (size_t)k,
                          kernels_weight_expert(wg, e), kernels_weight_expert(wu, e), wg->dtype, m,
                          n, k);
        cpu_matmul(be, s.y + (size_t)r0 * (size_t)k, SHOAL_DTYPE_F32, g,
                   kernels_weight_expert(wd, e), wd->dtype, m, k, n);
    }
    float *o = out;
    for (int r = 0; r < rows; r++) {
        float *dst = o + (size_t)r * (size_t)k;
        for (int j = 0; j < topk; j++) {
            float w = weights[(size_t)r * (size_t)topk + (size_t)j];
            const float *y = s.y + (size_t)s.place[r * topk + j] * (size_t)k;
            for (int i = 0; i < k; i++)
                dst[i] = j == 0 ? w * y[i] : dst[i] + w * y[i];
        }
    }
}
