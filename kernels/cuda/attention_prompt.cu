/* Prompt attention on tensor cores (flash attention over the page table):
 * the CUDA side of the attention_prompt op, whose CPU twin is the CPU
 * attention itself (the same function; kernels_backend.h).
 *
 * One block per (tile of 64 rows, query head); 4 warps, 16 rows each. The
 * block stages its Q tile once, then walks the keys of its rows' stream in
 * tiles of 64 tokens through the page table, double-buffered by cp.async:
 * S = Q K^T and O += P V on mma.sync, with the online softmax in registers
 * (flash attention 2). Causal masking by each row's own position; tiles
 * wholly at or before every row's position skip the mask. Rows of several
 * streams in one tile are correct (the block takes one stream at a time,
 * the other rows masked), only slower: the model sends runs of one stream.
 * Heavier tiles (later rows see more keys) start first.
 *
 * bf16 activations and head dims 32, 64 and 128 take this kernel; other
 * shapes, and f32 activations (the exact mode), go to the partial path. */
#include "attention_mma.cuh"

#include <limits.h>

enum { PR_BM = 64, PR_BN = 64, PR_THREADS = 128 };

struct prompt_args {
    const unsigned char *arena;
    size_t page_bytes;
    int pt_shift;
    int kv_heads;
    int group; /* query heads per KV head */
    int heads;
    size_t k_off, v_off; /* elements into a page: this layer's K and V of KV head 0 */
    size_t head_stride;  /* elements from one KV head's block to the next */
    const float *k_scale, *v_scale; /* [kv_heads] of this layer, or NULL */
    float scale_log2;               /* softmax scale times log2(e) */
    int page_table_stride;
    int rows;
};

template <int HD> static constexpr size_t prompt_smem_bytes()
{
    return (size_t)PR_BM * HD * 2 /* Q */ + 4 * (size_t)PR_BN * HD * 2 /* K, V x 2 */;
}

template <int HD, typename KV>
static __global__ void __launch_bounds__(PR_THREADS)
    attn_prompt_kernel(prompt_args a, const bf16 *q, bf16 *out, const int32_t *row_stream,
                       const int32_t *positions, const int32_t *page_table)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[PR_BM], row_p[PR_BM];
    constexpr int CH = HD / 8, NT = PR_BN / 8, DT = HD / 8;
    const uint32_t qs = mma::smem_addr(smem);
    const uint32_t ks0 = qs + PR_BM * HD * 2;
    const uint32_t vs0 = ks0 + 2 * PR_BN * HD * 2;
    const uint32_t tile_bytes = PR_BN * HD * 2;

    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, kvh = h / a.group;
    const int r0 = tile * PR_BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t q_stride = (size_t)a.heads * HD;

    if (tid < PR_BM) {
        int r = r0 + tid;
        row_s[tid] = r < a.rows ? row_stream[r] : -1;
        row_p[tid] = r < a.rows ? positions[r] : -1;
    }
    for (int i = tid; i < PR_BM * CH; i += PR_THREADS) {
        int row = i / CH, c = i % CH, r = r0 + row;
        bool valid = r < a.rows;
        mma::cp_async16(qs + mma::swz<HD>(row, c),
                        valid ? (const void *)(q + (size_t)r * q_stride + (size_t)h * HD + c * 8)
                              : (const void *)q,
                        valid);
    }
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    __syncthreads();

    uint32_t qf[HD / 16][4];
    mma::q_fragments<HD>(qf, qs, warp * 16);

    const int lr0 = warp * 16 + (lane >> 2), lr1 = lr0 + 8;
    const int my_s[2] = {row_s[lr0], row_s[lr1]};
    const int my_p[2] = {row_p[lr0], row_p[lr1]};
    const float k_scale = a.k_scale ? a.k_scale[kvh] : 1.0f;
    const float v_scale = a.v_scale ? a.v_scale[kvh] : 1.0f;
    const float sl2 = a.scale_log2 * k_scale;
    const size_t k_off = a.k_off + (size_t)kvh * a.head_stride;
    const size_t v_off = a.v_off + (size_t)kvh * a.head_stride;

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    unsigned long long done = 0;
    for (;;) {
        /* the next stream of this tile (one pass in the usual case) */
        int s = -1;
        for (int i = 0; i < PR_BM; i++)
            if (!((done >> i) & 1) && row_s[i] >= 0) {
                s = row_s[i];
                break;
            }
        if (s < 0)
            break;
        int maxp = -1, minp = INT_MAX;
        bool alone = true;
        for (int i = 0; i < PR_BM; i++) {
            if (row_s[i] == s) {
                done |= 1ull << i;
                maxp = max(maxp, row_p[i]);
                minp = min(minp, row_p[i]);
            } else if (row_s[i] >= 0) {
                alone = false;
            }
        }
        const bool in[2] = {my_s[0] == s, my_s[1] == s};
        const int32_t *pages = page_table + (size_t)s * (size_t)a.page_table_stride;
        const int kv_end = maxp + 1;
        const int ntiles = (kv_end + PR_BN - 1) / PR_BN;

        mma::kv_tile<HD, PR_BN, PR_THREADS, KV>::load(ks0, a.arena, a.page_bytes, pages, a.pt_shift,
                                                  k_off, 0, kv_end);
        mma::kv_tile<HD, PR_BN, PR_THREADS, KV>::load(vs0, a.arena, a.page_bytes, pages, a.pt_shift,
                                                  v_off, 0, kv_end);
        mma::cp_async_commit();
        for (int j = 0; j < ntiles; j++) {
            const uint32_t kb = ks0 + (j & 1) * tile_bytes, vb = vs0 + (j & 1) * tile_bytes;
            if (j + 1 < ntiles) {
                const uint32_t nb = ((j + 1) & 1) * tile_bytes;
                mma::kv_tile<HD, PR_BN, PR_THREADS, KV>::load(ks0 + nb, a.arena, a.page_bytes, pages,
                                                          a.pt_shift, k_off, (j + 1) * PR_BN,
                                                          kv_end);
                mma::kv_tile<HD, PR_BN, PR_THREADS, KV>::load(vs0 + nb, a.arena, a.page_bytes, pages,
                                                          a.pt_shift, v_off, (j + 1) * PR_BN,
                                                          kv_end);
                mma::cp_async_commit();
                mma::cp_async_wait<1>();
            } else {
                mma::cp_async_wait<0>();
            }
            __syncthreads();

            float sc[NT][4];
            mma::scores<HD, NT>(sc, qf, kb, 0);
            const int key0 = j * PR_BN;
            const bool masked = !alone || key0 + PR_BN - 1 > minp;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = sc[nt][e] * sl2;
                    if (masked) {
                        int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                        int hr = e >> 1;
                        v = in[hr] && key <= my_p[hr] ? v : -INFINITY;
                    }
                    sc[nt][e] = v;
                }
            mma::softmax_step<HD, NT>(sc, o, m, l);
            mma::accumulate<HD, NT>(o, sc, vb, 0);
            __syncthreads(); /* the buffer is refilled two tiles on */
        }
    }

#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    }
    const int rows_of[2] = {r0 + lr0, r0 + lr1};
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int r = rows_of[hr];
        if (r >= a.rows)
            continue;
        /* every row sees at least its own key, so l > 0 */
        float inv = v_scale / l[hr];
        bf16 *dst = out + (size_t)r * q_stride + (size_t)h * HD + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *(uint32_t *)(dst + dt * 8) = mma::pack_bf16(o[dt][2 * hr] * inv,
                                                          o[dt][2 * hr + 1] * inv);
    }
}

/* The instances this file provides, and their shared-memory limits. */
template <typename F> static bool prompt_dispatch(int hd, shoal_dtype kv, F f)
{
    bool fp8 = kv == SHOAL_DTYPE_F8_E4M3;
    switch (hd) {
    case 32:
        fp8 ? f(attn_prompt_kernel<32, __nv_fp8_storage_t>, prompt_smem_bytes<32>())
            : f(attn_prompt_kernel<32, bf16>, prompt_smem_bytes<32>());
        return true;
    case 64:
        fp8 ? f(attn_prompt_kernel<64, __nv_fp8_storage_t>, prompt_smem_bytes<64>())
            : f(attn_prompt_kernel<64, bf16>, prompt_smem_bytes<64>());
        return true;
    case 128:
        fp8 ? f(attn_prompt_kernel<128, __nv_fp8_storage_t>, prompt_smem_bytes<128>())
            : f(attn_prompt_kernel<128, bf16>, prompt_smem_bytes<128>());
        return true;
    default: return false;
    }
}

shoal_err cuda_attention_prompt_init(kernels_backend *be)
{
    cudaError_t e = cudaSuccess;
    for (int hd : {32, 64, 128})
        for (shoal_dtype kv : {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3})
            prompt_dispatch(hd, kv, [&](auto kernel, size_t bytes) {
                if (e == cudaSuccess)
                    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)bytes);
            });
    if (e != cudaSuccess)
        cuda_fail(be, "attention prompt: raise the shared-memory limit", e);
    return cuda_of(be)->err;
}

bool cuda_attention_prompt_fits(kernels_backend *be, int heads, const kernels_kv_layout *layout)
{
    int hd = layout->head_dim;
    return be->act_dtype == SHOAL_DTYPE_BF16 && cuda_of(be)->attn_tc &&
           (hd == 32 || hd == 64 || hd == 128) && heads % layout->kv_heads == 0;
}

void cuda_attention_prompt(kernels_backend *be, void *out, const void *q, int heads,
                           const void *arena, const kernels_kv_layout *layout,
                           const kernels_batch *batch, int layer, float scale)
{
    if (!cuda_attention_prompt_fits(be, heads, layout)) {
        cuda_attention(be, out, q, heads, arena, layout, batch, layer, scale);
        return;
    }
    const kernels_kv_layout *L = layout;
    SHOAL_ASSERT(L->dtype == SHOAL_DTYPE_BF16 || L->dtype == SHOAL_DTYPE_F8_E4M3);
    SHOAL_ASSERT(layer >= 0 && layer < L->layers && batch->rows >= 0);
    SHOAL_ASSERT(batch->page_table_stride > 0);
    SHOAL_ASSERT((L->page_tokens & (L->page_tokens - 1)) == 0);
    CUDA_ASSERT_ALIGNED(out, 16);
    CUDA_ASSERT_ALIGNED(q, 16);
    CUDA_ASSERT_ALIGNED(arena, 16);
    if (batch->rows == 0 || !cuda_usable(be))
        return;
    const int hd = L->head_dim;
    prompt_args a;
    a.arena = (const unsigned char *)arena;
    a.page_bytes = L->page_bytes;
    a.pt_shift = __builtin_ctz((unsigned)L->page_tokens);
    a.kv_heads = L->kv_heads;
    a.group = heads / L->kv_heads;
    a.heads = heads;
    a.head_stride = (size_t)L->page_tokens * hd;
    a.k_off = ((size_t)layer * 2 + 0) * L->kv_heads * a.head_stride;
    a.v_off = ((size_t)layer * 2 + 1) * L->kv_heads * a.head_stride;
    bool fp8 = L->dtype == SHOAL_DTYPE_F8_E4M3;
    a.k_scale = fp8 && L->k_scale ? L->k_scale + (size_t)layer * L->kv_heads : NULL;
    a.v_scale = fp8 && L->v_scale ? L->v_scale + (size_t)layer * L->kv_heads : NULL;
    a.scale_log2 = scale * 1.4426950408889634f;
    a.page_table_stride = batch->page_table_stride;
    a.rows = batch->rows;
    dim3 grid((unsigned)((batch->rows + PR_BM - 1) / PR_BM), (unsigned)heads);
    cudaStream_t stream = cuda_of(be)->stream;
    prompt_dispatch(hd, L->dtype, [&](auto kernel, size_t bytes) {
        kernel<<<grid, PR_THREADS, bytes, stream>>>(a, (const bf16 *)q, (bf16 *)out,
                                                    batch->row_stream, batch->positions,
                                                    batch->page_table);
    });
    cuda_launched(be, "attention prompt");
}
