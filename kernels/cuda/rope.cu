/* QK-norm and rotary embedding, in place: the twin of kernels/cpu/rope.c.
 * One warp per (row, head); each lane owns whole rotation pairs (i,
 * i + head_dim / 2), so the in-place update needs no barrier. The normed
 * value stays in float into the rotation, as in the CPU reference. */
#include "cuda_ops.h"

enum { ROPE_WARPS = 4 };

template <typename T>
static __global__ void rope_kernel(T *x, int rows, int heads, int head_dim, int row_stride,
                                   const float *norm_weight, float eps, const int32_t *positions,
                                   const float *inv_freq)
{
    int task = blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (task >= rows * heads)
        return;
    int r = task / heads, h = task % heads;
    T *v = x + (size_t)r * (size_t)row_stride + (size_t)h * (size_t)head_dim;
    float inv = 1.0f;
    if (norm_weight) {
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += 32) {
            float e = to_f32(v[i]);
            ss += e * e;
        }
        ss = warp_reduce(ss, op_add());
        inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
    }
    int half = head_dim / 2;
    float pos = (float)positions[r];
    for (int i = lane; i < half; i += 32) {
        float a = to_f32(v[i]), b = to_f32(v[i + half]);
        if (norm_weight) {
            a = norm_weight[i] * (a * inv);
            b = norm_weight[i + half] * (b * inv);
        }
        /* float32 product, as transformers computes position * inv_freq */
        float f = pos * inv_freq[i];
        float c = cosf(f), s = sinf(f);
        v[i] = from_f32<T>(a * c - b * s);
        v[i + half] = from_f32<T>(b * c + a * s);
    }
}

void cuda_qk_norm_rope(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                       int row_stride, const float *norm_weight, float eps,
                       const int32_t *positions, const float *inv_freq)
{
    SHOAL_ASSERT(rows >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0);
    SHOAL_ASSERT(row_stride >= heads * head_dim);
    CUDA_ASSERT_ALIGNED(x, shoal_dtype_bytes(be->act_dtype));
    if (rows == 0 || !cuda_usable(be))
        return;
    int tasks = rows * heads;
    int blocks = (tasks + ROPE_WARPS - 1) / ROPE_WARPS;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rope_kernel<T><<<blocks, ROPE_WARPS * 32, 0, cuda_of(be)->stream>>>(
            (T *)x, rows, heads, head_dim, row_stride, norm_weight, eps, positions, inv_freq);
    });
    cuda_launched(be, "qk_norm_rope");
}
