#include "cpu_ops.h"

#include "common/common_assert.h"
#include "kernels/kernels_fp8.h"

#include <string.h>

struct kv_write_job {
    unsigned char *arena;
    const kernels_kv_layout *layout;
    const kernels_batch *batch;
    int layer;
    const float *k;
    const float *v;
    size_t stride; /* elements from one row of k (and v) to the next */
};

static void kv_write_task(void *ctx, int r, int thread)
{
    const struct kv_write_job *j = ctx;
    const kernels_kv_layout *L = j->layout;
    int pos = j->batch->positions[r];
    int stream = j->batch->row_stream[r];
    int page = j->batch->page_table[(size_t)stream * (size_t)j->batch->page_table_stride +
                                    (size_t)(pos / L->page_tokens)];
    int slot = pos % L->page_tokens;
    bool fp8 = L->dtype == SHOAL_DTYPE_F8_E4M3;
    size_t elem = shoal_dtype_bytes(L->dtype);
    for (int kv = 0; kv < 2; kv++) {
        const float *src = (kv ? j->v : j->k) + (size_t)r * j->stride;
        const float *scales = kv ? L->v_scale : L->k_scale;
        for (int h = 0; h < L->kv_heads; h++) {
            size_t at = ((((size_t)j->layer * 2 + (size_t)kv) * (size_t)L->kv_heads + (size_t)h) *
                             (size_t)L->page_tokens +
                         (size_t)slot) *
                        (size_t)L->head_dim * elem;
            unsigned char *dst = j->arena + (size_t)page * L->page_bytes + at;
            const float *x = src + (size_t)h * (size_t)L->head_dim;
            if (fp8) {
                /* x / scale, as vLLM quantises: a division, not a multiply
                 * by the reciprocal, so both backends round alike */
                float scale = scales ? scales[(size_t)j->layer * (size_t)L->kv_heads + (size_t)h]
                                     : 1.0f;
                for (int d = 0; d < L->head_dim; d++)
                    dst[d] = kernels_f32_to_e4m3(x[d] / scale);
            } else if (L->dtype == SHOAL_DTYPE_F32) {
                memcpy(dst, x, (size_t)L->head_dim * sizeof(float));
            } else {
                uint16_t *dst16 = (uint16_t *)dst;
                for (int d = 0; d < L->head_dim; d++)
                    dst16[d] = shoal_f32_to_bf16(x[d]);
            }
        }
    }
}

/* k and v rows `stride` elements apart into the pages. */
static void kv_write_rows(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                          const kernels_batch *batch, int layer, const void *k, const void *v,
                          size_t stride)
{
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3 ||
                 layout->dtype == SHOAL_DTYPE_F32);
    struct kv_write_job j = {arena, layout, batch, layer, k, v, stride};
    common_pool_run(cpu_of(be)->pool, batch->rows, kv_write_task, &j);
}

void cpu_kv_write(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                  const kernels_batch *batch, int layer, const void *k, const void *v)
{
    kv_write_rows(be, arena, layout, batch, layer, k, v,
                  (size_t)layout->kv_heads * (size_t)layout->head_dim);
}

/* The composition the contract names: nothing to save on the CPU, where
 * every op already works in place in cache. */
void cpu_qk_norm_rope_kv_write(kernels_backend *be, void *q_out, const void *q, void *k,
                               const void *v, int stride, int heads, const float *q_norm,
                               const float *k_norm, float eps, const float *inv_freq,
                               void *arena, const kernels_kv_layout *layout,
                               const kernels_batch *batch, int layer)
{
    int hd = layout->head_dim, kvh = layout->kv_heads, rows = batch->rows;
    int q_stride = stride ? stride : heads * hd, k_stride = stride ? stride : kvh * hd;
    SHOAL_ASSERT(stride == 0 || (stride >= heads * hd + 2 * kvh * hd && q_out != q));
    if (q_out != q)
        for (int r = 0; r < rows; r++)
            memcpy((float *)q_out + (size_t)r * (size_t)(heads * hd),
                   (const float *)q + (size_t)r * (size_t)q_stride,
                   (size_t)(heads * hd) * sizeof(float));
    cpu_qk_norm_rope(be, q_out, rows, heads, hd, heads * hd, q_norm, eps, batch->positions,
                     inv_freq);
    cpu_qk_norm_rope(be, k, rows, kvh, hd, k_stride, k_norm, eps, batch->positions, inv_freq);
    kv_write_rows(be, arena, layout, batch, layer, k, v, (size_t)k_stride);
}

/* The composition the contract names, as on the CUDA backend with its
 * switch off: the worker's decode rounds take this op where a backend
 * has it, so the CPU's parity runs go through the worker's one-op path. */
void cpu_attention_rope_kv(kernels_backend *be, void *out, void *q_out, const void *q, void *k,
                           const void *v, int stride, int heads, const float *q_norm,
                           const float *k_norm, float eps, const float *inv_freq, void *arena,
                           const kernels_kv_layout *layout, const kernels_batch *batch,
                           int layer, float scale)
{
    cpu_qk_norm_rope_kv_write(be, q_out, q, k, v, stride, heads, q_norm, k_norm, eps, inv_freq,
                              arena, layout, batch, layer);
    cpu_attention(be, out, q_out, heads, arena, layout, batch, layer, scale);
}
