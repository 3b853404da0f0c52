/* The dummy-weight generator (see fill_random in kernels_backend.h): the
 * numbers of common_rng, element i from the (i + 1)-th step, so chunks are
 * made independently and in parallel. */
#include "cpu_ops.h"

#include "common/common_rng.h"

enum { FILL_CHUNK = 1 << 16 };

struct fill_job {
    uint16_t *dst;
    size_t n;
    uint64_t state;
    float base, scale;
};

static void fill_task(void *ctx, int task, int thread)
{
    const struct fill_job *j = ctx;
    size_t i0 = (size_t)task * FILL_CHUNK;
    size_t i1 = i0 + FILL_CHUNK < j->n ? i0 + FILL_CHUNK : j->n;
    uint64_t state = j->state + (uint64_t)i0 * 0x9e3779b97f4a7c15ull;
    for (size_t i = i0; i < i1; i++)
        j->dst[i] = shoal_f32_to_bf16(j->base + j->scale * common_rng_uniform(&state));
}

void cpu_fill_random(kernels_backend *be, void *dst, size_t n, uint64_t state, float base,
                     float scale)
{
    struct fill_job j = {dst, n, state, base, scale};
    common_pool_run(cpu_of(be)->pool, (int)((n + FILL_CHUNK - 1) / FILL_CHUNK), fill_task, &j);
}
