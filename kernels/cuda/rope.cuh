/* The body of q's and k's norm and rotation (rope.cu), shared with the
 * decode attention that rotates its own rows (attention.cu): one warp a
 * head, each lane owning whole rotation pairs. */
#ifndef SHOAL_KERNELS_CUDA_ROPE_CUH
#define SHOAL_KERNELS_CUDA_ROPE_CUH

#include "cuda_ops.h"

extern "C" {
#include "common/common_limits.h"
}

enum { ROPE_WARPS = 4 };

/* Rotation pairs a lane holds: i = lane + 32 j for j < ROPE_PAIRS_MAX. */
#define ROPE_PAIRS_MAX ((SHOAL_MODEL_HEAD_DIM_MAX / 2 + 31) / 32)

/* Norm and rotation of one head at v by one warp, into out (v itself for
 * in place: each lane reads its pairs before it writes them; NULL: none);
 * cos_sin(j, i, &c, &s) gives pair i's (the lane's j-th), and every value
 * (to be) stored at out[e] is also handed to sink(e, value). The one body
 * of every kernel that rotates, so their bits are the plain kernel's. */
template <typename T, typename CosSin, typename Sink>
static __device__ __forceinline__ void norm_rope_head(const T *v, T *out, int head_dim, int lane,
                                                      const float *norm_weight, float eps,
                                                      CosSin cos_sin, Sink sink)
{
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
#pragma unroll
    for (int j = 0; j < ROPE_PAIRS_MAX; j++) {
        int i = lane + 32 * j;
        if (i >= half)
            break;
        float a = to_f32(v[i]), b = to_f32(v[i + half]);
        if (norm_weight) {
            a = norm_weight[i] * (a * inv);
            b = norm_weight[i + half] * (b * inv);
        }
        float c, s;
        cos_sin(j, i, &c, &s);
        T ta = from_f32<T>(a * c - b * s), tb = from_f32<T>(b * c + a * s);
        if (out) {
            out[i] = ta;
            out[i + half] = tb;
        }
        sink(i, ta);
        sink(i + half, tb);
    }
}

/* cos and sin of pos * inv_freq[i] (a float32 product, as transformers
 * computes position * inv_freq) */
static __device__ __forceinline__ void rope_angle(float pos, const float *inv_freq, int i, float *c,
                                                  float *s)
{
    float f = pos * inv_freq[i];
    *c = cosf(f);
    *s = sinf(f);
}

#endif
