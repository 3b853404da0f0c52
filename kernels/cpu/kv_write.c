#include "cpu_ops.h"

#include "common/common_assert.h"

struct kv_write_job {
    unsigned char *arena;
    const kernels_kv_layout *layout;
    const kernels_batch *batch;
    int layer;
    const float *k;
    const float *v;
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
    size_t width = (size_t)L->kv_heads * (size_t)L->head_dim;
    for (int kv = 0; kv < 2; kv++) {
        const float *src = (kv ? j->v : j->k) + (size_t)r * width;
        for (int h = 0; h < L->kv_heads; h++) {
            uint16_t *dst = (uint16_t *)(j->arena + (size_t)page * L->page_bytes) +
                            ((((size_t)j->layer * 2 + (size_t)kv) * (size_t)L->kv_heads +
                              (size_t)h) * (size_t)L->page_tokens + (size_t)slot) *
                                (size_t)L->head_dim;
            for (int d = 0; d < L->head_dim; d++)
                dst[d] = shoal_f32_to_bf16(src[(size_t)h * (size_t)L->head_dim + (size_t)d]);
        }
    }
}

void cpu_kv_write(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                  const kernels_batch *batch, int layer, const void *k, const void *v)
{
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16);
    struct kv_write_job j = {arena, layout, batch, layer, k, v};
    common_pool_run(cpu_of(be)->pool, batch->rows, kv_write_task, &j);
}
