/* Paged causal attention, the reference. One task per (row, KV head): the
 * query heads that share a KV head (GQA) read each page once together. The
 * softmax is online, page by page, so no scratch grows with the context.
 *
 * fp8 KV: K = e4m3 * k_scale and V = e4m3 * v_scale, so the scales come
 * out of the sums: scores are (q . e4m3) * k_scale, and the output is
 * (sum p e4m3) * v_scale / l. F32 KV (the CPU's exact pages) reads the
 * floats as they were written. */
#include "cpu_ops.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "kernels/kernels_fp8.h"

#include <math.h>
#include <string.h>

enum { ATTN_GROUP_CHUNK = 8 }; /* query heads handled together in one pass */

static inline float bf16f(uint16_t h)
{
    return shoal_bf16_to_f32(h);
}

static float dot_bf16(const float *q, const uint16_t *k, int n)
{
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += q[i + l] * bf16f(k[i + l]);
    for (int l = 0; i < n; i++, l++)
        lane[l] += q[i] * bf16f(k[i]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] += lane[l + w];
    return lane[0];
}

static float dot_f32(const float *q, const float *k, int n)
{
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += q[i + l] * k[i + l];
    for (int l = 0; i < n; i++, l++)
        lane[l] += q[i] * k[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] += lane[l + w];
    return lane[0];
}

static float dot_e4m3(const float *q, const uint8_t *k, int n)
{
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += q[i + l] * kernels_e4m3_to_f32(k[i + l]);
    for (int l = 0; i < n; i++, l++)
        lane[l] += q[i] * kernels_e4m3_to_f32(k[i]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] += lane[l + w];
    return lane[0];
}

struct attn_job {
    float *out;
    const float *q;
    int heads;
    const unsigned char *arena;
    const kernels_kv_layout *layout;
    const kernels_batch *batch;
    int layer;
    float scale;
};

enum kv_kind { KV_BF16, KV_FP8, KV_F32 };

/* The body of every KV dtype; kind is a constant in each caller, so each
 * gets its own inner loops, and the bf16 one is the loop it always was. */
static inline __attribute__((always_inline)) void attn_body(void *ctx, int task,
                                                            const enum kv_kind kind)
{
    const bool fp8 = kind == KV_FP8;
    const struct attn_job *j = ctx;
    const kernels_kv_layout *L = j->layout;
    const kernels_batch *B = j->batch;
    int r = task / L->kv_heads;
    int kvh = task % L->kv_heads;
    int group = j->heads / L->kv_heads;
    int hd = L->head_dim;
    int pt = L->page_tokens;
    int ctx_len = B->positions[r] + 1;
    const int32_t *pages = B->page_table + (size_t)B->row_stream[r] * (size_t)B->page_table_stride;
    size_t elem = kind == KV_FP8 ? 1 : kind == KV_F32 ? 4 : 2;
    size_t k_off = ((((size_t)j->layer * 2 + 0) * (size_t)L->kv_heads + (size_t)kvh) *
                    (size_t)pt) * (size_t)hd * elem;
    size_t v_off = ((((size_t)j->layer * 2 + 1) * (size_t)L->kv_heads + (size_t)kvh) *
                    (size_t)pt) * (size_t)hd * elem;
    size_t scale_at = (size_t)j->layer * (size_t)L->kv_heads + (size_t)kvh;
    float k_scale = fp8 && L->k_scale ? L->k_scale[scale_at] : 1.0f;
    float v_scale = fp8 && L->v_scale ? L->v_scale[scale_at] : 1.0f;

    for (int g0 = 0; g0 < group; g0 += ATTN_GROUP_CHUNK) {
        int gn = group - g0 < ATTN_GROUP_CHUNK ? group - g0 : ATTN_GROUP_CHUNK;
        float m[ATTN_GROUP_CHUNK], l[ATTN_GROUP_CHUNK];
        float acc[ATTN_GROUP_CHUNK][SHOAL_MODEL_HEAD_DIM_MAX];
        const float *qh[ATTN_GROUP_CHUNK];
        for (int g = 0; g < gn; g++) {
            int h = kvh * group + g0 + g;
            qh[g] = j->q + (size_t)r * (size_t)j->heads * (size_t)hd + (size_t)h * (size_t)hd;
            m[g] = -INFINITY;
            l[g] = 0.0f;
            memset(acc[g], 0, (size_t)hd * sizeof(float));
        }
        for (int t0 = 0; t0 < ctx_len; t0 += pt) {
            int n = ctx_len - t0 < pt ? ctx_len - t0 : pt;
            const unsigned char *page = j->arena + (size_t)pages[t0 / pt] * L->page_bytes;
            const uint16_t *K = (const uint16_t *)(page + k_off);
            const uint16_t *V = (const uint16_t *)(page + v_off);
            const uint8_t *K8 = page + k_off, *V8 = page + v_off;
            const float *K32 = (const float *)(page + k_off), *V32 = (const float *)(page + v_off);
            for (int g = 0; g < gn; g++) {
                float s[SHOAL_PAGE_TOKENS_MAX];
                float mx = m[g];
                for (int t = 0; t < n; t++) {
                    if (kind == KV_FP8)
                        s[t] = dot_e4m3(qh[g], K8 + (size_t)t * (size_t)hd, hd) * k_scale *
                               j->scale;
                    else if (kind == KV_F32)
                        s[t] = dot_f32(qh[g], K32 + (size_t)t * (size_t)hd, hd) * j->scale;
                    else
                        s[t] = dot_bf16(qh[g], K + (size_t)t * (size_t)hd, hd) * j->scale;
                    mx = s[t] > mx ? s[t] : mx;
                }
                float corr = expf(m[g] - mx); /* 0 on the first page (m = -inf) */
                l[g] *= corr;
                float *a = acc[g];
                for (int d = 0; d < hd; d++)
                    a[d] *= corr;
                for (int t = 0; t < n; t++) {
                    float p = expf(s[t] - mx);
                    l[g] += p;
                    if (kind == KV_FP8) {
                        const uint8_t *vt = V8 + (size_t)t * (size_t)hd;
                        for (int d = 0; d < hd; d++)
                            a[d] += p * kernels_e4m3_to_f32(vt[d]);
                    } else if (kind == KV_F32) {
                        const float *vt = V32 + (size_t)t * (size_t)hd;
                        for (int d = 0; d < hd; d++)
                            a[d] += p * vt[d];
                    } else {
                        const uint16_t *vt = V + (size_t)t * (size_t)hd;
                        for (int d = 0; d < hd; d++)
                            a[d] += p * bf16f(vt[d]);
                    }
                }
                m[g] = mx;
            }
        }
        for (int g = 0; g < gn; g++) {
            int h = kvh * group + g0 + g;
            float *o = j->out + (size_t)r * (size_t)j->heads * (size_t)hd + (size_t)h * (size_t)hd;
            float inv = (fp8 ? v_scale : 1.0f) / l[g];
            for (int d = 0; d < hd; d++)
                o[d] = acc[g][d] * inv;
        }
    }
}

static void attn_task_bf16(void *ctx, int task, int thread)
{
    attn_body(ctx, task, KV_BF16);
}

static void attn_task_fp8(void *ctx, int task, int thread)
{
    attn_body(ctx, task, KV_FP8);
}

static void attn_task_f32(void *ctx, int task, int thread)
{
    attn_body(ctx, task, KV_F32);
}

void cpu_attention(kernels_backend *be, void *out, const void *q, int heads, const void *arena,
                   const kernels_kv_layout *layout, const kernels_batch *batch, int layer,
                   float scale)
{
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3 ||
                 layout->dtype == SHOAL_DTYPE_F32);
    SHOAL_ASSERT(heads % layout->kv_heads == 0);
    SHOAL_ASSERT(layout->page_tokens <= SHOAL_PAGE_TOKENS_MAX);
    struct attn_job j = {out, q, heads, arena, layout, batch, layer, scale};
    void (*task)(void *, int, int) = layout->dtype == SHOAL_DTYPE_F8_E4M3 ? attn_task_fp8
                                     : layout->dtype == SHOAL_DTYPE_F32   ? attn_task_f32
                                                                          : attn_task_bf16;
    common_pool_run(cpu_of(be)->pool, batch->rows * layout->kv_heads, task, &j);
}
