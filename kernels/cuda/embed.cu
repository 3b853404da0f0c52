/* Embedding lookup: the twin of kernels/cpu/embed.c. */
#include "cuda_ops.h"

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
