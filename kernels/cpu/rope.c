/* QK-norm (Qwen3) and rotary embedding, in place, one task per row. */
#include "cpu_ops.h"

#include "common/common_limits.h"

#include <math.h>

struct rope_job {
    float *x;
    int heads;
    int head_dim;
    int row_stride;
    const float *norm_weight;
    float eps;
    const int32_t *positions;
    const float *inv_freq;
};

static void rope_task(void *ctx, int r, int thread)
{
    const struct rope_job *j = ctx;
    int half = j->head_dim / 2;
    float cosv[SHOAL_MODEL_HEAD_DIM_MAX / 2], sinv[SHOAL_MODEL_HEAD_DIM_MAX / 2];
    float pos = (float)j->positions[r];
    for (int i = 0; i < half; i++) {
        /* float32 product, as transformers computes position * inv_freq */
        float f = pos * j->inv_freq[i];
        cosv[i] = cosf(f);
        sinv[i] = sinf(f);
    }
    for (int h = 0; h < j->heads; h++) {
        float *v = j->x + (size_t)r * (size_t)j->row_stride + (size_t)h * (size_t)j->head_dim;
        if (j->norm_weight) {
            float inv = 1.0f / sqrtf(cpu_sum_squares(v, j->head_dim) / (float)j->head_dim + j->eps);
            for (int i = 0; i < j->head_dim; i++)
                v[i] = j->norm_weight[i] * (v[i] * inv);
        }
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cosv[i] - b * sinv[i];
            v[i + half] = b * cosv[i] + a * sinv[i];
        }
    }
}

void cpu_qk_norm_rope(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                      int row_stride, const float *norm_weight, float eps,
                      const int32_t *positions, const float *inv_freq)
{
    struct rope_job j = {x, heads, head_dim, row_stride, norm_weight, eps, positions, inv_freq};
    common_pool_run(cpu_of(be)->pool, rows, rope_task, &j);
}
