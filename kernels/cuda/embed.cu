/* Embedding lookup: the twin of kernels/cpu/embed.c. */
#include "cuda_ops.h"

/* bf16 rows, a multiple of 8 elements: every 16-byte load of the row
 * issued before the first store (the scalar loop below waits on each
 * element in turn: 6.8 us for one row of 4,096 on the H200, the step's
 * first kernel). */
enum {
    EMBED_THREADS = 256,
    EMBED_VECS = 4, /* 16-byte loads a thread: 8,192 elements a row */
};

static __global__ void embed_bf16x8(uint4 *__restrict__ out, const uint4 *__restrict__ table,
                                    const int32_t *__restrict__ ids, int vecs)
{
    const size_t r = blockIdx.x;
    const uint4 *src = table + (size_t)ids[r] * (size_t)vecs;
    uint4 v[EMBED_VECS];
#pragma unroll
    for (int j = 0; j < EMBED_VECS; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < vecs)
            v[j] = src[i];
    }
#pragma unroll
    for (int j = 0; j < EMBED_VECS; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < vecs)
            out[r * (size_t)vecs + i] = v[j];
    }
}

template <typename T, typename W>
static __global__ void embed_kernel(T *out, const W *table, const int32_t *ids, int dim)
{
    size_t r = blockIdx.x;
    const W *src = table + (size_t)ids[r] * (size_t)dim;
    T *o = out + r * (size_t)dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = from_f32<T>(to_f32(src[i]));
}

void cuda_embed(kernels_backend *be, void *out, const void *table, shoal_dtype wdtype,
                const int32_t *ids, int rows, int dim)
{
    SHOAL_ASSERT(rows >= 0 && dim > 0);
    CUDA_ASSERT_ALIGNED(out, shoal_dtype_bytes(be->act_dtype));
    CUDA_ASSERT_ALIGNED(table, shoal_dtype_bytes(wdtype));
    if (rows == 0 || !cuda_usable(be))
        return;
    if (be->act_dtype == SHOAL_DTYPE_BF16 && wdtype == SHOAL_DTYPE_BF16 && dim % 8 == 0 &&
        dim / 8 <= EMBED_VECS * EMBED_THREADS && (uintptr_t)out % 16 == 0 &&
        (uintptr_t)table % 16 == 0) {
        embed_bf16x8<<<rows, EMBED_THREADS, 0, cuda_of(be)->stream>>>(
            (uint4 *)out, (const uint4 *)table, ids, dim / 8);
        cuda_launched(be, "embed");
        return;
    }
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        cuda_dispatch_weight(wdtype, [&](auto wt) {
            using W = decltype(wt);
            embed_kernel<T, W><<<rows, 256, 0, cuda_of(be)->stream>>>(
                (T *)out, (const W *)table, ids, dim);
        });
    });
    cuda_launched(be, "embed");
}
