/* QK-norm and rotary embedding, in place: the twin of kernels/cpu/rope.c.
 * One warp per (row, head); each lane owns whole rotation pairs (i,
 * i + head_dim / 2), so the in-place update needs no barrier. The normed
 * value stays in float into the rotation, as in the CPU reference.
 *
 * Also qk_norm_rope_kv_write at the rows the GEMV takes: q's heads, k's
 * heads and v's heads of a row are one launch's warps, k's warps storing
 * each rotated element twice (in place, and its stored value into the
 * page), v's copying theirs into the page. One launch and one dependent
 * round trip instead of three, and launched with programmatic
 * serialization after the q/k/v GEMV: the page slot and the rotation's
 * cos and sin are ready before the wait for q, k and v. */
#include "rope.cuh"

template <typename T>
static __global__ void rope_kernel(T *y, int y_stride, const T *x, int rows, int heads,
                                   int head_dim, int x_stride, const float *norm_weight,
                                   float eps, const int32_t *positions, const float *inv_freq)
{
    int task = blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (task >= rows * heads)
        return;
    int r = task / heads, h = task % heads;
    const T *v = x + (size_t)r * (size_t)x_stride + (size_t)h * (size_t)head_dim;
    T *out = y + (size_t)r * (size_t)y_stride + (size_t)h * (size_t)head_dim;
    float pos = (float)positions[r];
    norm_rope_head(
        v, out, head_dim, lane, norm_weight, eps,
        [&](int, int i, float *c, float *s) { rope_angle(pos, inv_freq, i, c, s); },
        [](int, T) {});
}

void cuda_qk_norm_rope_to(kernels_backend *be, void *y, int y_stride, const void *x, int rows,
                          int heads, int head_dim, int x_stride, const float *norm_weight,
                          float eps, const int32_t *positions, const float *inv_freq)
{
    SHOAL_ASSERT(rows >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0);
    SHOAL_ASSERT(head_dim <= SHOAL_MODEL_HEAD_DIM_MAX);
    SHOAL_ASSERT(x_stride >= heads * head_dim && y_stride >= heads * head_dim);
    CUDA_ASSERT_ALIGNED(x, shoal_dtype_bytes(be->act_dtype));
    CUDA_ASSERT_ALIGNED(y, shoal_dtype_bytes(be->act_dtype));
    if (rows == 0 || !cuda_usable(be))
        return;
    int tasks = rows * heads;
    int blocks = (tasks + ROPE_WARPS - 1) / ROPE_WARPS;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rope_kernel<T><<<blocks, ROPE_WARPS * 32, 0, cuda_of(be)->stream>>>(
            (T *)y, y_stride, (const T *)x, rows, heads, head_dim, x_stride, norm_weight, eps,
            positions, inv_freq);
    });
    cuda_launched(be, "qk_norm_rope");
}

void cuda_qk_norm_rope(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                       int row_stride, const float *norm_weight, float eps,
                       const int32_t *positions, const float *inv_freq)
{
    cuda_qk_norm_rope_to(be, x, row_stride, x, rows, heads, head_dim, row_stride, norm_weight,
                         eps, positions, inv_freq);
}

/* Warps (row, task): tasks [0, heads) are q's heads, [heads, heads + kvh)
 * k's, [heads + kvh, heads + 2 kvh) v's. Every thread waits (pdl_wait)
 * before it reads q, k or v, and before it returns. */
template <typename T, typename KV>
static __global__ void rope_kv_kernel(T *q_out, const T *q, T *k, const T *v, int q_stride,
                                      int k_stride, int heads, const float *q_norm,
                                      const float *k_norm, float eps, const float *inv_freq,
                                      unsigned char *arena, kernels_kv_layout L,
                                      kernels_batch B, int layer)
{
    pdl_trigger(); /* decode attention after may start copying the KV before the new rows */
    const int kvh = L.kv_heads, hd = L.head_dim, per_row = heads + 2 * kvh;
    const int task = blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const bool valid = task < B.rows * per_row;
    const int r = valid ? task / per_row : 0, t = task % per_row;
    /* what the GEMV does not write: the rotation and the page slot */
    float cs[ROPE_PAIRS_MAX], sn[ROPE_PAIRS_MAX];
    int slot = 0;
    unsigned char *page = NULL;
    if (valid && t < heads + kvh) {
        float pos = (float)B.positions[r];
#pragma unroll
        for (int j = 0; j < ROPE_PAIRS_MAX; j++)
            if (lane + 32 * j < hd / 2)
                rope_angle(pos, inv_freq, lane + 32 * j, &cs[j], &sn[j]);
    }
    if (valid && t >= heads)
        page = kv_row_page(arena, L, B, r, &slot);
    pdl_wait();
    if (!valid)
        return;
    auto angle = [&](int j, int, float *c, float *s) {
        *c = cs[j];
        *s = sn[j];
    };
    if (t < heads) {
        norm_rope_head(q + (size_t)r * q_stride + (size_t)t * hd,
                       q_out + ((size_t)r * heads + t) * hd, hd, lane, q_norm, eps, angle,
                       [](int, T) {});
        return;
    }
    const int kv = t >= heads + kvh, h = t - heads - kv * kvh;
    const float *scales = kv ? L.v_scale : L.k_scale;
    const float scale = scales ? scales[layer * kvh + h] : 1.0f;
    KV *dst = (KV *)page + kv_head_at(L, layer, kv, h, slot);
    size_t row_at = (size_t)r * k_stride + (size_t)h * hd;
    if (kv) { /* as kv_write: the stored v, converted */
        for (int d = lane; d < hd; d += 32)
            kv_store(dst + d, to_f32(v[row_at + d]), scale);
        return;
    }
    /* k rotated, stored, and its stored value converted, as kv_write reads it */
    norm_rope_head(k + row_at, k + row_at, hd, lane, k_norm, eps, angle,
                   [&](int d, T x) { kv_store(dst + d, to_f32(x), scale); });
}

template <typename T, typename KV>
static void launch_rope_kv(cudaStream_t stream, unsigned blocks, T *q_out, const T *q, T *k,
                           const T *v, int q_stride, int k_stride, int heads,
                           const float *q_norm, const float *k_norm, float eps,
                           const float *inv_freq, unsigned char *arena,
                           const kernels_kv_layout &L, const kernels_batch &B, int layer)
{
    cuda_launch_pdl(stream, blocks, ROPE_WARPS * 32, rope_kv_kernel<T, KV>, q_out, q, k, v,
                    q_stride, k_stride, heads, q_norm, k_norm, eps, inv_freq, arena, L, B, layer);
}

void cuda_qk_norm_rope_kv_write(kernels_backend *be, void *q_out, const void *q, void *k,
                                const void *v, int stride, int heads, const float *q_norm,
                                const float *k_norm, float eps, const float *inv_freq,
                                void *arena, const kernels_kv_layout *layout,
                                const kernels_batch *batch, int layer)
{
    const cuda_state *st = cuda_of(be);
    int rows = batch->rows, kvh = layout->kv_heads, hd = layout->head_dim;
    int q_stride = stride ? stride : heads * hd, k_stride = stride ? stride : kvh * hd;
    SHOAL_ASSERT(stride == 0 || (stride >= (heads + 2 * kvh) * hd && q_out != q));
    if (!st->rope_kv_fused || rows > CUDA_ROPE_KV_ROWS_MAX) {
        /* a prompt's many rows: the plain kernels (kv_write's 16-byte moves) */
        cuda_qk_norm_rope_to(be, q_out, heads * hd, q, rows, heads, hd, q_stride, q_norm, eps,
                             batch->positions, inv_freq);
        cuda_qk_norm_rope(be, k, rows, kvh, hd, k_stride, k_norm, eps, batch->positions,
                          inv_freq);
        cuda_kv_write_rows(be, arena, layout, batch, layer, k, v, k_stride);
        return;
    }
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3);
    SHOAL_ASSERT(layer >= 0 && layer < layout->layers && rows >= 0 && heads > 0);
    SHOAL_ASSERT(hd > 0 && hd % 2 == 0 && hd <= SHOAL_MODEL_HEAD_DIM_MAX);
    size_t ab = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(arena, 16);
    CUDA_ASSERT_ALIGNED(q_out, ab);
    CUDA_ASSERT_ALIGNED(q, ab);
    CUDA_ASSERT_ALIGNED(k, ab);
    CUDA_ASSERT_ALIGNED(v, ab);
    if (rows == 0 || !cuda_usable(be))
        return;
    unsigned blocks = (unsigned)((rows * (heads + 2 * kvh) + ROPE_WARPS - 1) / ROPE_WARPS);
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        if (layout->dtype == SHOAL_DTYPE_BF16)
            launch_rope_kv<T, bf16>(st->stream, blocks, (T *)q_out, (const T *)q, (T *)k,
                                    (const T *)v, q_stride, k_stride, heads, q_norm, k_norm, eps,
                                    inv_freq, (unsigned char *)arena, *layout, *batch, layer);
        else
            launch_rope_kv<T, __nv_fp8_storage_t>(st->stream, blocks, (T *)q_out, (const T *)q,
                                                  (T *)k, (const T *)v, q_stride, k_stride,
                                                  heads, q_norm, k_norm, eps, inv_freq,
                                                  (unsigned char *)arena, *layout, *batch,
                                                  layer);
    });
    cuda_launched(be, "qk_norm_rope_kv_write");
}
