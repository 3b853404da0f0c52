#include "cpu_ops.h"

#include <math.h>

float cpu_sum_squares(const float *x, int n)
{
    /* 16 lanes, summed pairwise at the end: the compiler vectorises this
     * without reassociating, and the order is fixed. */
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += x[i + l] * x[i + l];
    for (int l = 0; i < n; i++, l++)
        lane[l] += x[i] * x[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] += lane[l + w];
    return lane[0];
}

struct rmsnorm_job {
    float *out;
    float *x;
    const float *residual;
    const float *weight;
    int dim;
    float eps;
};

static void rmsnorm_task(void *ctx, int r, int thread)
{
    const struct rmsnorm_job *j = ctx;
    size_t off = (size_t)r * (size_t)j->dim;
    float *x = j->x + off;
    float *o = j->out + off;
    if (j->residual) {
        const float *res = j->residual + off;
        for (int i = 0; i < j->dim; i++)
            x[i] += res[i];
    }
    float inv = 1.0f / sqrtf(cpu_sum_squares(x, j->dim) / (float)j->dim + j->eps);
    for (int i = 0; i < j->dim; i++)
        o[i] = j->weight[i] * (x[i] * inv);
}

void cpu_rmsnorm(kernels_backend *be, void *out, void *x, const void *residual,
                 const float *weight, int rows, int dim, float eps)
{
    struct rmsnorm_job j = {out, x, residual, weight, dim, eps};
    common_pool_run(cpu_of(be)->pool, rows, rmsnorm_task, &j);
}
