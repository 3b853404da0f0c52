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

/* The residual of rmsnorm_bf16x8's vector i of a row at off: a stored
 * bf16 row, or the bf16 of the sum of nparts f32 parts (matmul_add_rmsnorm:
 * a matmul split over k, its parts added here in part order and rounded
 * as the matmul's stored output would be). */
struct residual_rows {
    const bf16 *rows;
    __device__ bool some() const
    {
        return rows != nullptr;
    }
    __device__ void at(size_t off, int i, bf16 (&r)[8]) const
    {
        uint4 v = ((const uint4 *)(rows + off))[i];
        const bf16 *e = (const bf16 *)&v;
#pragma unroll
        for (int j = 0; j < 8; j++)
            r[j] = e[j];
    }
};
enum { RESIDUAL_PARTS_MAX = 8 };
struct residual_parts {
    const float *parts;
    int nparts;    /* 1 to RESIDUAL_PARTS_MAX */
    size_t stride; /* floats from one part to the next */
    __device__ bool some() const
    {
        return true;
    }
    __device__ void at(size_t off, int i, bf16 (&r)[8]) const
    {
        /* every part's loads issued before the first add: one round trip
         * (a load then its add a part took one each, 1.7 us more a row
         * of four at 64 rows) */
        float4 v[RESIDUAL_PARTS_MAX][2];
#pragma unroll
        for (int p = 0; p < RESIDUAL_PARTS_MAX; p++)
            if (p < nparts) {
                const float4 *q = (const float4 *)(parts + (size_t)p * stride + off) + 2 * i;
                v[p][0] = q[0];
                v[p][1] = q[1];
            }
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int p = 0; p < RESIDUAL_PARTS_MAX; p++)
            if (p < nparts) {
                const float4 a = v[p][0], b = v[p][1];
                s[0] += a.x, s[1] += a.y, s[2] += a.z, s[3] += a.w;
                s[4] += b.x, s[5] += b.y, s[6] += b.z, s[7] += b.w;
            }
#pragma unroll
        for (int j = 0; j < 8; j++)
            r[j] = __float2bfloat16_rn(s[j]);
    }
};

/* bf16 rows of a multiple of 8: the same arithmetic per element, in
 * 16-byte loads and stores. */
template <typename Residual>
static __global__ void rmsnorm_bf16x8(bf16 *out, bf16 *x, const Residual res, const float *weight,
                                      int dim, float eps)
{
    __shared__ float red[32];
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    size_t off = (size_t)blockIdx.x * (size_t)dim;
    uint4 *xr = (uint4 *)(x + off);
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
        if (res.some()) {
            bf16 re[8];
            res.at(off, i, re);
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

/* rmsnorm_bf16x8 of rows, launched as rmsnorm launches it */
template <typename Residual>
static void launch_rmsnorm_bf16x8(kernels_backend *be, bf16 *out, bf16 *x, Residual res,
                                  const float *weight, int rows, int dim, float eps)
{
    int threads = dim / 8 >= 512 ? 512 : dim / 8 >= 256 ? 256 : 128;
    const int early = cuda_of(be)->norm_early;
    if (early > 0 && rows >= early)
        cuda_launch_pdl(cuda_of(be)->stream, (unsigned)rows, (unsigned)threads,
                        rmsnorm_bf16x8<Residual>, out, x, res, weight, dim, eps);
    else
        rmsnorm_bf16x8<Residual>
            <<<rows, threads, 0, cuda_of(be)->stream>>>(out, x, res, weight, dim, eps);
    cuda_launched(be, "rmsnorm");
}

void cuda_rmsnorm_parts(kernels_backend *be, void *out, void *x, const float *parts, int nparts,
                        size_t part_stride, const float *weight, int rows, int dim, float eps)
{
    SHOAL_ASSERT(be->act_dtype == SHOAL_DTYPE_BF16 && dim % 8 == 0 && nparts >= 1 &&
                 nparts <= RESIDUAL_PARTS_MAX);
    SHOAL_ASSERT((uintptr_t)out % 16 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)parts % 16 == 0 &&
                 part_stride % 4 == 0 && (uintptr_t)weight % 16 == 0);
    if (rows == 0 || !cuda_usable(be))
        return;
    launch_rmsnorm_bf16x8(be, (bf16 *)out, (bf16 *)x, residual_parts{parts, nparts, part_stride},
                          weight, rows, dim, eps);
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
        launch_rmsnorm_bf16x8(be, (bf16 *)out, (bf16 *)x, residual_rows{(const bf16 *)residual},
                              weight, rows, dim, eps);
        return;
    }
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rmsnorm_kernel<T><<<rows, 256, 0, cuda_of(be)->stream>>>(
            (T *)out, (T *)x, (const T *)residual, weight, dim, eps);
    });
    cuda_launched(be, "rmsnorm");
}
