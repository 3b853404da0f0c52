/* Row gather: the twin of kernels/cpu/gather.c. */
#include "cuda_ops.h"

template <typename T>
static __global__ void gather_kernel(T *out, const T *in, const int32_t *idx, int dim)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    size_t r = blockIdx.x;
    const T *src = in + (size_t)idx[r] * (size_t)dim;
    T *o = out + r * (size_t)dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = src[i];
}

void cuda_gather(kernels_backend *be, void *out, const void *in, const int32_t *idx, int rows,
                 int dim)
{
    SHOAL_ASSERT(rows >= 0 && dim > 0);
    CUDA_ASSERT_ALIGNED(out, shoal_dtype_bytes(be->act_dtype));
    CUDA_ASSERT_ALIGNED(in, shoal_dtype_bytes(be->act_dtype));
    if (rows == 0 || !cuda_usable(be))
        return;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        gather_kernel<T><<<rows, 256, 0, cuda_of(be)->stream>>>((T *)out, (const T *)in, idx, dim);
    });
    cuda_launched(be, "gather");
}
