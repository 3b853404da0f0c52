#include "cpu_ops.h"

#include <math.h>

struct swiglu_job {
    float *out;
    const float *gate;
    const float *up;
    int dim;
};

static void swiglu_task(void *ctx, int r, int thread)
{
    const struct swiglu_job *j = ctx;
    size_t off = (size_t)r * (size_t)j->dim;
    for (int i = 0; i < j->dim; i++) {
        float g = j->gate[off + (size_t)i];
        j->out[off + (size_t)i] = g / (1.0f + expf(-g)) * j->up[off + (size_t)i];
    }
}

void cpu_swiglu(kernels_backend *be, void *out, const void *gate, const void *up, int rows,
                int dim)
{
    struct swiglu_job j = {out, gate, up, dim};
    common_pool_run(cpu_of(be)->pool, rows, swiglu_task, &j);
}

/* The two projections, then the product: the composition that defines the
 * op (kernels_backend.h). Each matmul already splits the weight rows over
 * the threads, which is where a one-row pass spends its time. */
void cpu_matmul_swiglu(kernels_backend *be, void *out, void *up, const void *in, const void *wg,
                       const void *wu, shoal_dtype wdtype, int rows, int n, int k)
{
    cpu_matmul(be, out, SHOAL_DTYPE_F32, in, wg, wdtype, rows, n, k);
    cpu_matmul(be, up, SHOAL_DTYPE_F32, in, wu, wdtype, rows, n, k);
    cpu_swiglu(be, out, out, up, rows, n);
}
