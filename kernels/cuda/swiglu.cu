/* SwiGLU: the twin of kernels/cpu/swiglu.c. */
#include "cuda_ops.h"

template <typename T>
static __global__ void swiglu_kernel(T *out, const T *gate, const T *up, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
    }
}

void cuda_swiglu(kernels_backend *be, void *out, const void *gate, const void *up, int rows,
                 int dim)
{
    SHOAL_ASSERT(rows >= 0 && dim > 0);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(gate, a);
    CUDA_ASSERT_ALIGNED(up, a);
    size_t n = (size_t)rows * (size_t)dim;
    if (n == 0 || !cuda_usable(be))
        return;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        swiglu_kernel<T><<<(unsigned)blocks, 256, 0, cuda_of(be)->stream>>>(
            (T *)out, (const T *)gate, (const T *)up, n);
    });
    cuda_launched(be, "swiglu");
}
