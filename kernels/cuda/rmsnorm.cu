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
    pdl_trigger(); /* a GEMV after may start fetching its weights */
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

/* bf16 rows of a multiple of 8: the same arithmetic per element, in
 * 16-byte loads and stores (the helpers in cuda_ops.h, which the GEMV
 * that takes the norm itself shares, matmul.cu). */
static __global__ void rmsnorm_bf16x8(bf16 *out, bf16 *x, const bf16 *residual,
                                      const float *weight, int dim, float eps)
{
    __shared__ float red[32];
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    size_t off = (size_t)blockIdx.x * (size_t)dim;
    uint4 *xr = (uint4 *)(x + off);
    const uint4 *rr = residual ? (const uint4 *)(residual + off) : NULL;
    uint4 *o = (uint4 *)(out + off);
    const int vecs = dim / 8;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
        uint4 xv = xr[i];
        if (rr) {
            xv = bf16x8_add(xv, rr[i]);
            xr[i] = xv;
        }
        ss = bf16x8_sum_squares(xv, ss);
    }
    ss = block_reduce(ss, op_add(), red);
    float inv = rms_inv(ss, dim, eps);
    /* each thread reads back only the vectors it wrote above */
    for (int i = threadIdx.x; i < vecs; i += blockDim.x)
        o[i] = bf16x8_rms_scale(xr[i], weight + 8 * (size_t)i, inv);
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
    if (be->act_dtype == SHOAL_DTYPE_BF16 && dim % 8 == 0 && (uintptr_t)out % 16 == 0 &&
        (uintptr_t)x % 16 == 0 && (uintptr_t)residual % 16 == 0 && (uintptr_t)weight % 16 == 0) {
        int threads = rmsnorm_x8_threads(dim / 8);
        rmsnorm_bf16x8<<<rows, threads, 0, cuda_of(be)->stream>>>(
            (bf16 *)out, (bf16 *)x, (const bf16 *)residual, weight, dim, eps);
        cuda_launched(be, "rmsnorm");
        return;
    }
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rmsnorm_kernel<T><<<rows, 256, 0, cuda_of(be)->stream>>>(
            (T *)out, (T *)x, (const T *)residual, weight, dim, eps);
    });
    cuda_launched(be, "rmsnorm");
}
