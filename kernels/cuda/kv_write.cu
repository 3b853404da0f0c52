/* KV write into pages: the twin of kernels/cpu/kv_write.c. One block per
 * row; K and V of all KV heads (bf16 into bf16 pages in 16-byte moves).
 * fp8 goes through the hardware e4m3 conversion (round to nearest even,
 * saturating), which the contract test holds to the bytes of the CPU
 * encoder. */
#include "cuda_ops.h"

template <typename T, typename KV>
static __global__ void kv_write_kernel(unsigned char *arena, kernels_kv_layout L,
                                       kernels_batch B, int layer, const T *k, const T *v,
                                       int stride)
{
    int r = blockIdx.x, slot;
    KV *base = (KV *)kv_row_page(arena, L, B, r, &slot);
    int width = L.kv_heads * L.head_dim;
    for (int e = threadIdx.x; e < 2 * width; e += blockDim.x) {
        int kv = e / width, rem = e % width;
        int h = rem / L.head_dim, d = rem % L.head_dim;
        float x = to_f32((kv ? v : k)[(size_t)r * (size_t)stride + (size_t)rem]);
        const float *scales = kv ? L.v_scale : L.k_scale;
        float scale = scales ? scales[layer * L.kv_heads + h] : 1.0f;
        kv_store(base + kv_head_at(L, layer, kv, h, slot) + d, x, scale);
    }
}

/* bf16 rows into bf16 pages, head dims of a multiple of 8: the same bytes
 * in 16-byte moves (a prompt chunk's KV write at copy speed). stride in
 * 16-byte vectors. */
static __global__ void kv_write_bf16x8(unsigned char *arena, kernels_kv_layout L, kernels_batch B,
                                       int layer, const uint4 *k, const uint4 *v, int stride)
{
    int r = blockIdx.x, slot;
    uint4 *base = (uint4 *)kv_row_page(arena, L, B, r, &slot);
    int hv = L.head_dim / 8, vw = L.kv_heads * hv; /* vectors a head, a row */
    for (int e = threadIdx.x; e < 2 * vw; e += blockDim.x) {
        int kv = e >= vw, rem = kv ? e - vw : e;
        int h = rem / hv, d = rem % hv;
        size_t at = kv_head_at(L, layer, kv, h, slot) / 8 + (size_t)d;
        base[at] = (kv ? v : k)[(size_t)r * (size_t)stride + (size_t)rem];
    }
}

/* k and v rows `stride` elements apart (act_dtype) into the pages. */
void cuda_kv_write_rows(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                        const kernels_batch *batch, int layer, const void *k, const void *v,
                        int stride)
{
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3);
    SHOAL_ASSERT(layer >= 0 && layer < layout->layers && batch->rows >= 0);
    SHOAL_ASSERT(stride >= layout->kv_heads * layout->head_dim);
    CUDA_ASSERT_ALIGNED(arena, 16);
    CUDA_ASSERT_ALIGNED(k, shoal_dtype_bytes(be->act_dtype));
    CUDA_ASSERT_ALIGNED(v, shoal_dtype_bytes(be->act_dtype));
    if (batch->rows == 0 || !cuda_usable(be))
        return;
    if (be->act_dtype == SHOAL_DTYPE_BF16 && layout->dtype == SHOAL_DTYPE_BF16 &&
        layout->head_dim % 8 == 0 && stride % 8 == 0 && (uintptr_t)k % 16 == 0 &&
        (uintptr_t)v % 16 == 0) {
        kv_write_bf16x8<<<batch->rows, 256, 0, cuda_of(be)->stream>>>(
            (unsigned char *)arena, *layout, *batch, layer, (const uint4 *)k, (const uint4 *)v,
            stride / 8);
        cuda_launched(be, "kv_write");
        return;
    }
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        if (layout->dtype == SHOAL_DTYPE_BF16)
            kv_write_kernel<T, bf16><<<batch->rows, 256, 0, cuda_of(be)->stream>>>(
                (unsigned char *)arena, *layout, *batch, layer, (const T *)k, (const T *)v,
                stride);
        else
            kv_write_kernel<T, __nv_fp8_storage_t><<<batch->rows, 256, 0, cuda_of(be)->stream>>>(
                (unsigned char *)arena, *layout, *batch, layer, (const T *)k, (const T *)v,
                stride);
    });
    cuda_launched(be, "kv_write");
}

void cuda_kv_write(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                   const kernels_batch *batch, int layer, const void *k, const void *v)
{
    cuda_kv_write_rows(be, arena, layout, batch, layer, k, v,
                       layout->kv_heads * layout->head_dim);
}
