/* RMSNorm with the residual add: the twin of kernels/cpu/rmsnorm.c. One
 * block per row. With bf16 activations the sum x + residual is rounded to
 * bf16 where it is stored, and the norm is taken of the stored value, so
 * the output is a function of the residual stream as the next layer sees
 * it (vLLM's fused_add_rms_norm does the same). */
#include "cuda_ops.h"

template <typename T>
static __global__ void rmsnorm_kernel(T *out, T *x, const T *residual, const float *weight,
                                      int dim, float eps)
{
    __shared__ float red[32];
    size_t off = (size_t)blockIdx.x * (size_t)dim;
    T *xr = x + off;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = to_f32(xr[i]);
        if (residual) {
            T stored = from_f32<T>(v + to_f32(residual[off + i]));
            xr[i] = stored;
            v = to_f32(stored);
        }
        ss += v * v;
    }
    ss = block_reduce(ss, op_add(), red);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    /* each thread reads back only the elements it wrote above */
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[off + i] = from_f32<T>(weight[i] * (to_f32(xr[i]) * inv));
}

void cuda_rmsnorm(kernels_backend *be, void *out, void *x, const void *residual,
                  const float *weight, int rows, int dim, float eps)
{
    SHOAL_ASSERT(rows >= 0 && dim > 0);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(x, a);
    CUDA_ASSERT_ALIGNED(residual, a);
    CUDA_ASSERT_ALIGNED(weight, 4);
    if (rows == 0 || !cuda_usable(be))
        return;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rmsnorm_kernel<T><<<rows, 256, 0, cuda_of(be)->stream>>>(
            (T *)out, (T *)x, (const T *)residual, weight, dim, eps);
    });
    cuda_launched(be, "rmsnorm");
}
