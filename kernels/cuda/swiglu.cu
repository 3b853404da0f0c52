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

/* swiglu_rms: blocks of (row, SWIGLU_RMS_THREADS x SWIGLU_RMS_HELD 8-
 * element vectors); each thread asks for its gate and up vectors first,
 * then takes part in the row's 1 / rms of x (8 KB at hidden 4,096, from
 * L2), so that both round trips overlap. */
enum { SWIGLU_RMS_THREADS = 256 };

template <int SWIGLU_RMS_HELD>
static __global__ void __launch_bounds__(SWIGLU_RMS_THREADS)
    swiglu_rms_bf16x8(uint4 *out, const uint4 *gate, const uint4 *up, const bf16 *x, int dim,
                      int hidden, float eps)
{
    __shared__ float red[32];
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    const int r = blockIdx.y, vecs = dim / 8;
    const size_t row = (size_t)r * vecs;
    const int i0 = blockIdx.x * SWIGLU_RMS_THREADS * SWIGLU_RMS_HELD + threadIdx.x;
    uint4 gv[SWIGLU_RMS_HELD], uv[SWIGLU_RMS_HELD];
#pragma unroll
    for (int h = 0; h < SWIGLU_RMS_HELD; h++) {
        const int i = i0 + h * SWIGLU_RMS_THREADS;
        if (i < vecs) {
            gv[h] = gate[row + i];
            uv[h] = up[row + i];
        }
    }
    const float s = row_inv_rms(x + (size_t)r * hidden, hidden, eps, red);
#pragma unroll
    for (int h = 0; h < SWIGLU_RMS_HELD; h++) {
        const int i = i0 + h * SWIGLU_RMS_THREADS;
        if (i >= vecs)
            break;
        const bf16 *g = (const bf16 *)&gv[h], *u = (const bf16 *)&uv[h];
        uint4 ov;
        bf16 *o = (bf16 *)&ov;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float a = __bfloat162float(g[j]) * s;
            o[j] = __float2bfloat16_rn(a / (1.0f + expf(-a)) * (__bfloat162float(u[j]) * s));
        }
        out[row + i] = ov;
    }
}

void cuda_swiglu_rms(kernels_backend *be, void *out, const void *gate, const void *up,
                     const void *x, int rows, int dim, int hidden, float eps)
{
    SHOAL_ASSERT(be->act_dtype == SHOAL_DTYPE_BF16 && rows >= 0 && rows <= 65535);
    SHOAL_ASSERT(dim > 0 && dim % 8 == 0 && hidden > 0 && hidden % 8 == 0);
    CUDA_ASSERT_ALIGNED(out, 16);
    CUDA_ASSERT_ALIGNED(gate, 16);
    CUDA_ASSERT_ALIGNED(up, 16);
    CUDA_ASSERT_ALIGNED(x, 16);
    if (rows == 0 || !cuda_usable(be))
        return;
    const int held = cuda_of(be)->lab_swiglu_held, per_block = SWIGLU_RMS_THREADS * held;
    dim3 grid((unsigned)((dim / 8 + per_block - 1) / per_block), (unsigned)rows);
    (held == 1 ? swiglu_rms_bf16x8<1> : swiglu_rms_bf16x8<2>)<<<grid, SWIGLU_RMS_THREADS, 0,
                                                                cuda_of(be)->stream>>>(
        (uint4 *)out, (const uint4 *)gate, (const uint4 *)up, (const bf16 *)x, dim, hidden, eps);
    cuda_launched(be, "swiglu_rms");
}
