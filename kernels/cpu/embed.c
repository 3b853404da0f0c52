#include "cpu_ops.h"

struct embed_job {
    float *out;
    const void *table;
    shoal_dtype wdtype;
    const int32_t *ids;
    int dim;
};

static void embed_task(void *ctx, int r, int thread)
{
    const struct embed_job *j = ctx;
    size_t base = (size_t)j->ids[r] * (size_t)j->dim;
    float *o = j->out + (size_t)r * (size_t)j->dim;
    for (int i = 0; i < j->dim; i++)
        o[i] = shoal_load_f32(j->table, j->wdtype, base + (size_t)i);
}

void cpu_embed(kernels_backend *be, void *out, const void *table, shoal_dtype wdtype,
               const int32_t *ids, int rows, int dim)
{
    struct embed_job j = {out, table, wdtype, ids, dim};
    common_pool_run(cpu_of(be)->pool, rows, embed_task, &j);
}
