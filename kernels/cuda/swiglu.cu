/* SwiGLU: the twin of kernels/cpu/swiglu.c. */
#include "cuda_ops.h"

template <typename T>
static __global__ void swiglu_kernel(T *out, const T *gate, const T *up, size_t n)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
    }
}

/* bf16, a multiple of 8 elements: 16-byte loads and stores. */
static __global__ void swiglu_bf16x8(uint4 *out, const uint4 *gate, const uint4 *up, size_t vecs)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < vecs;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 gv = gate[i], uv = up[i], ov;
        const bf16 *g = (const bf16 *)&gv, *u = (const bf16 *)&uv;
        bf16 *o = (bf16 *)&ov;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float x = __bfloat162float(g[j]);
            o[j] = __float2bfloat16_rn(x / (1.0f + expf(-x)) * __bfloat162float(u[j]));
        }
        out[i] = ov;
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
    if (be->act_dtype == SHOAL_DTYPE_BF16 && n % 8 == 0 && (uintptr_t)out % 16 == 0 &&
        (uintptr_t)gate % 16 == 0 && (uintptr_t)up % 16 == 0) {
        size_t vblocks = (n / 8 + 255) / 256;
        if (vblocks > 65536)
            vblocks = 65536;
        swiglu_bf16x8<<<(unsigned)vblocks, 256, 0, cuda_of(be)->stream>>>(
            (uint4 *)out, (const uint4 *)gate, (const uint4 *)up, n / 8);
        cuda_launched(be, "swiglu");
        return;
    }
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
