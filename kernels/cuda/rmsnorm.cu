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
 * 16-byte loads and stores. */
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
    /* a row of one vector a thread: its weights (no kernel writes them)
     * fetched before the wait, so the row's read is the one round trip */
    const bool held = vecs <= (int)blockDim.x;
    float4 hw0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), hw1 = hw0;
    if (held && (int)threadIdx.x < vecs) {
        hw0 = ((const float4 *)weight)[2 * threadIdx.x];
        hw1 = ((const float4 *)weight)[2 * threadIdx.x + 1];
    }
    pdl_wait(); /* launched early (SHOAL_CUDA_NORM_EARLY): x and the residual */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
        uint4 xv = xr[i];
        bf16 *xe = (bf16 *)&xv;
        if (rr) {
            uint4 rv = rr[i];
            const bf16 *re = (const bf16 *)&rv;
#pragma unroll
            for (int j = 0; j < 8; j++)
                xe[j] = __float2bfloat16_rn(__bfloat162float(xe[j]) + __bfloat162float(re[j]));
            xr[i] = xv;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = __bfloat162float(xe[j]);
            ss += v * v;
        }
    }
    ss = block_reduce(ss, op_add(), red);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    /* each thread reads back only the vectors it wrote above */
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
        uint4 xv = xr[i], ov;
        const bf16 *xe = (const bf16 *)&xv;
        bf16 *oe = (bf16 *)&ov;
        const float4 w0 = held ? hw0 : ((const float4 *)weight)[2 * i];
        const float4 w1 = held ? hw1 : ((const float4 *)weight)[2 * i + 1];
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int j = 0; j < 8; j++)
            oe[j] = __float2bfloat16_rn(w[j] * (__bfloat162float(xe[j]) * inv));
        o[i] = ov;
    }
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
        int threads = dim / 8 >= 512 ? 512 : dim / 8 >= 256 ? 256 : 128;
        const int early = cuda_of(be)->norm_early;
        if (early > 0 && rows >= early)
            cuda_launch_pdl(cuda_of(be)->stream, (unsigned)rows, (unsigned)threads,
                            rmsnorm_bf16x8, (bf16 *)out, (bf16 *)x, (const bf16 *)residual,
                            weight, dim, eps);
        else
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
