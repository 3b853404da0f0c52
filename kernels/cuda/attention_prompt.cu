/* Prompt attention on tensor cores (flash attention over the page table):
 * the CUDA side of the attention_prompt op, whose CPU twin is the CPU
 * attention itself (the same function; kernels_backend.h).
 *
 * One block per (tile of 64 rows, query head); 4 warps of 16 rows
 * (prompt_shape: tiles of 128 rows, by switch). The block stages its Q
 * tile once, then walks the keys of its rows' stream in tiles of 64
 * tokens through the page table, double-buffered by cp.async (K and V of
 * a token from one page lookup): S = Q K^T and O += P V on mma.sync, with
 * the online softmax in registers, its scale folded into one FMA before
 * each exp (flash attention 2). Causal masking by each row's own
 * position; tiles wholly at or before every row of a warp skip the mask,
 * tiles wholly after them are skipped by that warp. Rows of several
 * streams in one tile are correct (the block takes one stream at a time,
 * the other rows masked), only slower: the model sends runs of one stream.
 * Heavier tiles (later rows see more keys) start first.
 *
 * bf16 activations and head dims 32, 64 and 128 take this kernel; other
 * shapes, and f32 activations (the exact mode), go to the partial path. */
#include "attention_mma.cuh"

#include <limits.h>

enum { PR_BN = 64 };

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

/* The block's tile of rows: WARPS warps of MT m-tiles (16 rows) each, a
 * warp's rows contiguous. SHOAL_CUDA_PROMPT_TILE picks one (cuda_ops.h):
 * 1 (default) = 64 rows, 4 warps of 16 (two blocks a multiprocessor); 2 =
 * 128 rows, 4 warps of 32 (each K and V fragment read from shared memory
 * serves two m-tiles; Q's fragments read per tile instead of held: 255
 * registers and spills at head dim 128); 3 = 128 rows, 8 warps of 16 (K
 * and V staged once for twice the rows; one block a multiprocessor at 222
 * registers). kernels/lab/README.md has the timings. */
template <int WARPS, int MT, bool Q_IN_REGS, int MIN_BLOCKS> struct prompt_shape {
    static constexpr int THREADS = WARPS * 32, BM = WARPS * 16 * MT, M_TILES = MT;
    static constexpr bool QREG = Q_IN_REGS; /* Q's fragments held, else read per tile */
    static constexpr int MINB = MIN_BLOCKS; /* blocks a multiprocessor (register cap) */
};

template <int HD, int BM> static constexpr size_t prompt_smem_bytes()
{
    return (size_t)BM * HD * 2 /* Q */ + 4 * (size_t)PR_BN * HD * 2 /* K, V x 2 */;
}

/* A warp's scores of MT m-tiles of query rows (Q rows qrow0 .. of the
 * staged tile at qbase, or qf where held) against the PR_BN staged keys:
 * s[mt][nt] is a C fragment. Each K fragment serves every m-tile. */
template <int HD, int MT, bool QREG>
static __device__ __forceinline__ void prompt_scores(float (&s)[MT][PR_BN / 8][4],
                                                     const uint32_t (&qf)[MT][HD / 16][4],
                                                     uint32_t qbase, int qrow0, uint32_t kbase)
{
    constexpr int NT = PR_BN / 8;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kp = 0; kp < HD / 32; kp++) {
        uint32_t a[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                if (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        a[mt][half][e] = qf[mt][2 * kp + half][e];
                } else {
                    mma::ldsm_x4(a[mt][half],
                                 qbase + mma::swz<HD>(qrow0 + mt * 16 + (lane & 7) +
                                                          ((lane >> 3) & 1) * 8,
                                                      (2 * kp + half) * 2 + (lane >> 4)));
                }
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t b[4];
            mma::ldsm_x4(b, kbase + mma::swz<HD>(nt * 8 + (lane & 7), kp * 4 + (lane >> 3)));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma::mma_bf16(s[mt][nt], a[mt][0], b[0], b[1]);
                mma::mma_bf16(s[mt][nt], a[mt][1], b[2], b[3]);
            }
        }
    }
}

/* o[mt] += p[mt] v over the PR_BN staged values; each V fragment serves
 * every m-tile. */
template <int HD, int MT>
static __device__ __forceinline__ void prompt_accumulate(float (&o)[MT][HD / 8][4],
                                                         const float (&p)[MT][PR_BN / 8][4],
                                                         uint32_t vbase)
{
    constexpr int NT = PR_BN / 8;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            a[mt][0] = mma::pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = mma::pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = mma::pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = mma::pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            mma::ldsm_x4_trans(b, vbase + mma::swz<HD>(kk * 16 + (lane & 7) +
                                                           ((lane >> 3) & 1) * 8,
                                                       dp * 2 + (lane >> 4)));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma::mma_bf16(o[mt][2 * dp], a[mt], b[0], b[1]);
                mma::mma_bf16(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

/* Stages K and V tokens [t0, t0 + PR_BN) of one stream (zeros at or past
 * t_end): the K row at k_off (elements into a page) and the V row at
 * v_off. bf16 pages go by cp.async with one page lookup and one address a
 * row for both (a thread copies the same 16-byte column of PR_BN /
 * (THREADS / CH) rows, so the swizzle is one constant); fp8 pages take the
 * shared kv_tile loader. The caller commits and waits. */
template <int HD, int THREADS, typename KV> struct prompt_kv;

template <int HD, int THREADS> struct prompt_kv<HD, THREADS, bf16> {
    static __device__ __forceinline__ void load(uint32_t kdst, uint32_t vdst,
                                                const unsigned char *arena, size_t page_bytes,
                                                const int32_t *pages, int pt_shift, size_t k_off,
                                                size_t v_off, int t0, int t_end)
    {
        constexpr int CH = HD / 8, RPP = THREADS / CH; /* rows a pass */
        static_assert(THREADS % CH == 0 && PR_BN % RPP == 0, "prompt_kv: tile shape");
        const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
        const int pt_mask = (1 << pt_shift) - 1;
        const size_t gap = (v_off - k_off) * sizeof(bf16);
#pragma unroll
        for (int k = 0; k < PR_BN / RPP; k++) {
            const int row = r0 + k * RPP, tok = t0 + row;
            const bool valid = tok < t_end;
            const unsigned char *src = arena;
            if (valid)
                src = arena + (size_t)pages[tok >> pt_shift] * page_bytes +
                      (k_off + (size_t)(tok & pt_mask) * HD) * sizeof(bf16) + (size_t)c * 16;
            const uint32_t at = mma::swz<HD>(row, c);
            mma::cp_async16(kdst + at, src, valid);
            mma::cp_async16(vdst + at, valid ? src + gap : src, valid);
        }
    }
};

template <int HD, int THREADS> struct prompt_kv<HD, THREADS, __nv_fp8_storage_t> {
    static __device__ __forceinline__ void load(uint32_t kdst, uint32_t vdst,
                                                const unsigned char *arena, size_t page_bytes,
                                                const int32_t *pages, int pt_shift, size_t k_off,
                                                size_t v_off, int t0, int t_end)
    {
        using T = mma::kv_tile<HD, PR_BN, THREADS, __nv_fp8_storage_t>;
        T::load(kdst, arena, page_bytes, pages, pt_shift, k_off, t0, t_end);
        T::load(vdst, arena, page_bytes, pages, pt_shift, v_off, t0, t_end);
    }
};

static __device__ __forceinline__ int warp_max(int v)
{
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

template <int HD, typename S, typename KV>
static __global__ void __launch_bounds__(S::THREADS, S::MINB)
    attn_prompt_kernel(prompt_args a, const bf16 *q, bf16 *out, const int32_t *row_stream,
                       const int32_t *positions, const int32_t *page_table)
{
    constexpr int BM = S::BM, THREADS = S::THREADS, MT = S::M_TILES;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[BM], row_p[BM];
    constexpr int CH = HD / 8, DT = HD / 8, NT = PR_BN / 8;
    const uint32_t qs = mma::smem_addr(smem);
    const uint32_t ks0 = qs + BM * HD * 2;
    const uint32_t vs0 = ks0 + 2 * PR_BN * HD * 2;
    const uint32_t tile_bytes = PR_BN * HD * 2;

    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, kvh = h / a.group;
    const int r0 = tile * BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wrow0 = warp * 16 * MT; /* the warp's first row in the tile */
    const size_t q_stride = (size_t)a.heads * HD;

    for (int i = tid; i < BM; i += THREADS) {
        int r = r0 + i;
        row_s[i] = r < a.rows ? row_stream[r] : -1;
        row_p[i] = r < a.rows ? positions[r] : -1;
    }
    for (int i = tid; i < BM * CH; i += THREADS) {
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

    uint32_t qf[MT][HD / 16][4];
    if (S::QREG)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            mma::q_fragments<HD>(qf[mt], qs, wrow0 + mt * 16);

    const float k_scale = a.k_scale ? a.k_scale[kvh] : 1.0f;
    const float v_scale = a.v_scale ? a.v_scale[kvh] : 1.0f;
    const float sl2 = a.scale_log2 * k_scale;
    const size_t k_off = a.k_off + (size_t)kvh * a.head_stride;
    const size_t v_off = a.v_off + (size_t)kvh * a.head_stride;

    float o[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

    unsigned long long done[(BM + 63) / 64] = {};
    for (;;) {
        /* the next stream of this tile (one pass in the usual case) */
        int s = -1;
        for (int i = 0; i < BM; i++)
            if (!((done[i >> 6] >> (i & 63)) & 1) && row_s[i] >= 0) {
                s = row_s[i];
                break;
            }
        if (s < 0)
            break;
        int maxp = -1;
        for (int i = 0; i < BM; i++)
            if (row_s[i] == s) {
                done[i >> 6] |= 1ull << (i & 63);
                maxp = max(maxp, row_p[i]);
            }
        /* the lane's rows of s (m-tile mt, C fragment half hr): the last key
         * each sees, -1 for rows of other streams. The warp skips keys past
         * all its rows, and needs no mask for keys at or before all of them,
         * unless it also holds rows of another stream. */
        int last[MT][2];
        int lane_max = -1, lane_negmin = -INT_MAX, lane_other = 0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                int lr = wrow0 + mt * 16 + (lane >> 2) + 8 * hr;
                int rs = row_s[lr], rp = row_p[lr];
                last[mt][hr] = rs == s ? rp : -1;
                if (rs == s) {
                    lane_max = max(lane_max, rp);
                    lane_negmin = max(lane_negmin, -rp);
                } else if (rs >= 0) {
                    lane_other = 1;
                }
            }
        const int w_max = warp_max(lane_max), w_min = -warp_max(lane_negmin);
        const bool w_other = warp_max(lane_other) != 0;
        const int32_t *pages = page_table + (size_t)s * (size_t)a.page_table_stride;
        const int kv_end = maxp + 1;
        const int ntiles = (kv_end + PR_BN - 1) / PR_BN;

        prompt_kv<HD, THREADS, KV>::load(ks0, vs0, a.arena, a.page_bytes, pages, a.pt_shift, k_off,
                                         v_off, 0, kv_end);
        mma::cp_async_commit();
        for (int j = 0; j < ntiles; j++) {
            const uint32_t kb = ks0 + (j & 1) * tile_bytes, vb = vs0 + (j & 1) * tile_bytes;
            if (j + 1 < ntiles) {
                const uint32_t nb = ((j + 1) & 1) * tile_bytes;
                prompt_kv<HD, THREADS, KV>::load(ks0 + nb, vs0 + nb, a.arena, a.page_bytes, pages,
                                                 a.pt_shift, k_off, v_off, (j + 1) * PR_BN,
                                                 kv_end);
                mma::cp_async_commit();
                mma::cp_async_wait<1>();
            } else {
                mma::cp_async_wait<0>();
            }
            __syncthreads();

            const int key0 = j * PR_BN;
            if (key0 <= w_max) { /* else every key is past the warp's rows: p = 0 */
                float sc[MT][NT][4];
                prompt_scores<HD, MT, S::QREG>(sc, qf, qs, wrow0, kb);
                if (w_other || key0 + PR_BN - 1 > w_min)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                                if (key > last[mt][e >> 1])
                                    sc[mt][nt][e] = -INFINITY;
                            }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    mma::softmax_step<HD, NT>(sc[mt], sl2, o[mt], m[mt], l[mt]);
                prompt_accumulate<HD, MT>(o, sc, vb);
            }
            __syncthreads(); /* the buffer is refilled two tiles on */
        }
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float lsum = l[mt][hr];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            int r = r0 + wrow0 + mt * 16 + (lane >> 2) + 8 * hr;
            if (r >= a.rows)
                continue;
            /* every row sees at least its own key, so l > 0 */
            float inv = v_scale / lsum;
            bf16 *dst = out + (size_t)r * q_stride + (size_t)h * HD + (lane & 3) * 2;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(uint32_t *)(dst + dt * 8) = mma::pack_bf16(o[mt][dt][2 * hr] * inv,
                                                              o[mt][dt][2 * hr + 1] * inv);
        }
}

/* The instances this file provides: f(kernel, shared-memory bytes, threads,
 * rows a block) for head dim hd, KV dtype kv and tile variant `tile`
 * (SHOAL_CUDA_PROMPT_TILE). */
template <int HD, typename S, typename F> static void prompt_instance(bool fp8, F f)
{
    constexpr size_t bytes = prompt_smem_bytes<HD, S::BM>();
    fp8 ? f(attn_prompt_kernel<HD, S, __nv_fp8_storage_t>, bytes, S::THREADS, S::BM)
        : f(attn_prompt_kernel<HD, S, bf16>, bytes, S::THREADS, S::BM);
}

template <int HD, typename F> static void prompt_tile_dispatch(int tile, bool fp8, F f)
{
    switch (tile) {
    case 2: prompt_instance<HD, prompt_shape<4, 2, false, 1>>(fp8, f); break;
    case 3: prompt_instance<HD, prompt_shape<8, 1, true, 1>>(fp8, f); break;
    default: prompt_instance<HD, prompt_shape<4, 1, true, 1>>(fp8, f); break;
    }
}

template <typename F> static bool prompt_dispatch(int hd, shoal_dtype kv, int tile, F f)
{
    bool fp8 = kv == SHOAL_DTYPE_F8_E4M3;
    switch (hd) {
    case 32: prompt_tile_dispatch<32>(tile, fp8, f); return true;
    case 64: prompt_tile_dispatch<64>(tile, fp8, f); return true;
    case 128: prompt_tile_dispatch<128>(tile, fp8, f); return true;
    default: return false;
    }
}

shoal_err cuda_attention_prompt_init(kernels_backend *be)
{
    cudaError_t e = cudaSuccess;
    for (int hd : {32, 64, 128})
        for (shoal_dtype kv : {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3})
            prompt_dispatch(hd, kv, cuda_of(be)->prompt_tile,
                            [&](auto kernel, size_t bytes, int, int) {
                                if (e == cudaSuccess)
                                    e = cudaFuncSetAttribute(
                                        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
    cudaStream_t stream = cuda_of(be)->stream;
    prompt_dispatch(hd, L->dtype, cuda_of(be)->prompt_tile,
                    [&](auto kernel, size_t bytes, int threads, int bm) {
                        dim3 grid((unsigned)((batch->rows + bm - 1) / bm), (unsigned)heads);
                        kernel<<<grid, threads, bytes, stream>>>(a, (const bf16 *)q, (bf16 *)out,
                                                                 batch->row_stream,
                                                                 batch->positions,
                                                                 batch->page_table);
                    });
    cuda_launched(be, "attention prompt");
}
