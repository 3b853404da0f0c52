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
 * On sm_90a (H100/H200) head dim 128 with bf16 pages takes the wgmma
 * kernel further down instead: the same algorithm on warpgroup MMA, a
 * block holding the query heads of one KV head (prompt_rows_map).
 *
 * bf16 activations and head dims 32, 64 and 128 take these kernels; other
 * shapes, and f32 activations (the exact mode), go to the partial path. */
#include "attention_mma.cuh"
#include "wgmma.cuh"

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
    int pack; /* query heads a block takes together (of one KV head): prompt_rows_map */
};

/* Where a block's tile rows come from: row i is the query row of token t0
 * + i % tb at query head h0 + i / tb. The mma.sync kernels take one head a
 * block (tb = the tile's rows); the wgmma kernels the `pack` query heads
 * of one KV head (tb = rows / pack), so that each K and V tile staged
 * serves all of them: a quarter of the loads at Qwen3's grouping. */
struct prompt_rows_map {
    int t0, tb, h0;
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
        for (int mt = 0; mt < MT; mt++)
            mma::p_fragment<NT>(a[mt], p[mt], kk);
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
template <int HD> struct rows_swz { /* mma.sync's tiles: attention_mma.cuh */
    static __device__ __forceinline__ uint32_t at(int row, int c) { return mma::swz<HD>(row, c); }
};
template <int ROWS> struct rows_sw128 { /* wgmma's tiles: wgmma.cuh */
    static __device__ __forceinline__ uint32_t at(int row, int c)
    {
        return wg::sw128_at<ROWS>(row, c);
    }
};

template <int HD, int THREADS, typename KV, int BN = PR_BN, typename L = rows_swz<HD>>
struct prompt_kv;

template <int HD, int THREADS, int BN, typename L> struct prompt_kv<HD, THREADS, bf16, BN, L> {
    static constexpr int CH = HD / 8, RPP = THREADS / CH; /* rows a pass */
    static_assert(THREADS % CH == 0 && BN % RPP == 0, "prompt_kv: tile shape");

    /* The page of each of the thread's rows of tokens [t0, t0 + BN) (-1
     * at or past t_end): split from load() so that a kernel can look up
     * the pages of a tile ahead and not wait on the page table's latency
     * when it stages the tile. */
    struct pages_of {
        int32_t id[BN / RPP];
    };
    static __device__ __forceinline__ void lookup(pages_of &pg, const int32_t *pages,
                                                  int pt_shift, int t0, int t_end)
    {
        const int r0 = threadIdx.x / CH;
#pragma unroll
        for (int k = 0; k < BN / RPP; k++) {
            const int tok = t0 + r0 + k * RPP;
            pg.id[k] = tok < t_end ? pages[tok >> pt_shift] : -1;
        }
    }

    static __device__ __forceinline__ void issue(uint32_t kdst, uint32_t vdst,
                                                 const unsigned char *arena, size_t page_bytes,
                                                 const pages_of &pg, int pt_shift, size_t k_off,
                                                 size_t v_off, int t0)
    {
        const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
        const int pt_mask = (1 << pt_shift) - 1;
        const size_t gap = (v_off - k_off) * sizeof(bf16);
#pragma unroll
        for (int k = 0; k < BN / RPP; k++) {
            const int row = r0 + k * RPP, tok = t0 + row;
            const bool valid = pg.id[k] >= 0;
            const unsigned char *src = arena;
            if (valid)
                src = arena + (size_t)pg.id[k] * page_bytes +
                      (k_off + (size_t)(tok & pt_mask) * HD) * sizeof(bf16) + (size_t)c * 16;
            const uint32_t at = L::at(row, c);
            mma::cp_async16(kdst + at, src, valid);
            mma::cp_async16(vdst + at, valid ? src + gap : src, valid);
        }
    }

    static __device__ __forceinline__ void load(uint32_t kdst, uint32_t vdst,
                                                const unsigned char *arena, size_t page_bytes,
                                                const int32_t *pages, int pt_shift, size_t k_off,
                                                size_t v_off, int t0, int t_end)
    {
        pages_of pg;
        lookup(pg, pages, pt_shift, t0, t_end);
        issue(kdst, vdst, arena, page_bytes, pg, pt_shift, k_off, v_off, t0);
    }
};

template <int HD, int THREADS> struct prompt_kv<HD, THREADS, __nv_fp8_storage_t, PR_BN> {
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

/* Stages the block's BM rows (prompt_rows_map): their streams and
 * positions (-1 past the last token) into row_s and row_p, and their query
 * rows by cp.async, chunk c of row `row` at qs + L::at(row, c) (zeros past
 * the last token). The caller commits and waits. */
template <int HD, int BM, int THREADS, typename L>
static __device__ __forceinline__ void prompt_stage_q(uint32_t qs, int *row_s, int *row_p,
                                                      const bf16 *q, const int32_t *row_stream,
                                                      const int32_t *positions, int rows, int heads,
                                                      prompt_rows_map map)
{
    constexpr int CH = HD / 8;
    const size_t q_stride = (size_t)heads * HD;
    for (int i = threadIdx.x; i < BM; i += THREADS) {
        int r = map.t0 + i % map.tb;
        row_s[i] = r < rows ? row_stream[r] : -1;
        row_p[i] = r < rows ? positions[r] : -1;
    }
    for (int i = threadIdx.x; i < BM * CH; i += THREADS) {
        int row = i / CH, c = i % CH, r = map.t0 + row % map.tb, h = map.h0 + row / map.tb;
        bool valid = r < rows;
        mma::cp_async16(qs + L::at(row, c),
                        valid ? (const void *)(q + (size_t)r * q_stride + (size_t)h * HD + c * 8)
                              : (const void *)q,
                        valid);
    }
}

/* The next stream among the tile's rows not yet done (-1: none left): its
 * rows are marked done and *maxp is the last position among them. A tile
 * holds one stream in the usual case (the model sends runs of one). Each
 * warp works it out on its own, a lane a row (BM a multiple of 32), with
 * the same result in every lane. */
template <int BM>
static __device__ __forceinline__ int prompt_next_stream(const int *row_s, const int *row_p,
                                                         unsigned (&done)[BM / 32], int *maxp)
{
    const int lane = threadIdx.x & 31;
    int first = -INT_MAX; /* minus the first row not done */
#pragma unroll
    for (int k = BM / 32 - 1; k >= 0; k--)
        if (!((done[k] >> lane) & 1) && row_s[32 * k + lane] >= 0)
            first = -(32 * k + lane);
    first = -warp_max(first);
    *maxp = -1;
    if (first == INT_MAX)
        return -1;
    const int s = row_s[first];
    int mp = -1;
#pragma unroll
    for (int k = 0; k < BM / 32; k++) {
        const bool mine = row_s[32 * k + lane] == s;
        done[k] |= __ballot_sync(0xffffffffu, mine);
        if (mine)
            mp = max(mp, row_p[32 * k + lane]);
    }
    *maxp = warp_max(mp);
    return s;
}

/* A warp's rows of stream s against the keys: the last key each of the
 * lane's rows sees (m-tile mt, C fragment half hr; -1 for rows of other
 * streams), and over the warp the last and the first of those and whether
 * it holds rows of another stream. The warp skips keys past w_max, and
 * needs no mask for keys at or before w_min unless `other`. */
struct prompt_warp_rows {
    int w_max, w_min;
    bool other;
};

template <int MT>
static __device__ __forceinline__ prompt_warp_rows prompt_rows_of(const int *row_s,
                                                                  const int *row_p, int s,
                                                                  int wrow0, int (&last)[MT][2])
{
    const int lane = threadIdx.x & 31;
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
    return {warp_max(lane_max), -warp_max(lane_negmin), warp_max(lane_other) != 0};
}

/* Scores of keys past a row's last set to -inf (one m-tile of C fragments
 * over NT * 8 keys from key0). */
template <int NT>
static __device__ __forceinline__ void prompt_mask(float (&sc)[NT][4], const int (&last)[2],
                                                   int key0)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
            if (key > last[e >> 1])
                sc[nt][e] = -INFINITY;
        }
}

/* Writes one m-tile of a warp's output rows (row0 = its first tile row;
 * prompt_rows_map): o over the lane's partial sums l, summed over the quad,
 * times the fp8 V scale (1 for bf16). */
template <int HD>
static __device__ __forceinline__ void prompt_store(const float (&o)[HD / 8][4],
                                                    const float (&l)[2], int row0,
                                                    prompt_rows_map map, int rows, float v_scale,
                                                    bf16 *out, size_t q_stride)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lsum = l[hr];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const int row = row0 + (lane >> 2) + 8 * hr;
        const int r = map.t0 + row % map.tb, h = map.h0 + row / map.tb;
        if (r >= rows)
            continue;
        /* every row sees at least its own key, so l > 0 */
        float inv = v_scale / lsum;
        bf16 *dst = out + (size_t)r * q_stride + (size_t)h * HD + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(uint32_t *)(dst + dt * 8) =
                mma::pack_bf16(o[dt][2 * hr] * inv, o[dt][2 * hr + 1] * inv);
    }
}

template <int HD, typename S, typename KV>
static __global__ void __launch_bounds__(S::THREADS, S::MINB)
    attn_prompt_kernel(prompt_args a, const bf16 *q, bf16 *out, const int32_t *row_stream,
                       const int32_t *positions, const int32_t *page_table)
{
    constexpr int BM = S::BM, THREADS = S::THREADS, MT = S::M_TILES;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[BM], row_p[BM];
    constexpr int DT = HD / 8, NT = PR_BN / 8;
    const uint32_t qs = mma::smem_addr(smem);
    const uint32_t ks0 = qs + BM * HD * 2;
    const uint32_t vs0 = ks0 + 2 * PR_BN * HD * 2;
    const uint32_t tile_bytes = PR_BN * HD * 2;

    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, kvh = h / a.group;
    const prompt_rows_map map = {tile * BM, BM, h};
    const int warp = threadIdx.x >> 5;
    const int wrow0 = warp * 16 * MT; /* the warp's first row in the tile */

    prompt_stage_q<HD, BM, THREADS, rows_swz<HD>>(qs, row_s, row_p, q, row_stream, positions,
                                                  a.rows, a.heads, map);
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

    unsigned done[BM / 32] = {};
    int maxp, s;
    while ((s = prompt_next_stream<BM>(row_s, row_p, done, &maxp)) >= 0) {
        int last[MT][2];
        const prompt_warp_rows w = prompt_rows_of<MT>(row_s, row_p, s, wrow0, last);
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
            if (key0 <= w.w_max) { /* else every key is past the warp's rows: p = 0 */
                float sc[MT][NT][4];
                prompt_scores<HD, MT, S::QREG>(sc, qf, qs, wrow0, kb);
                if (w.other || key0 + PR_BN - 1 > w.w_min)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        prompt_mask<NT>(sc[mt], last[mt], key0);
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
        prompt_store<HD>(o[mt], l[mt], wrow0 + mt * 16, map, a.rows, v_scale, out,
                         (size_t)a.heads * HD);
}

/* The sm_90a kernel (SHOAL_CUDA_PROMPT_TILE=4, the default where it runs:
 * head dim 128, bf16 pages): the same flash attention on Hopper's
 * warpgroup MMA (wgmma.cuh). A block of 128 rows (32 tokens of the query
 * heads of one KV head at Qwen3's grouping: prompt_rows_map) is two
 * warpgroups of 64; key tiles of 128 tokens go through the page table by
 * cp.async, a tile ahead (their pages looked up two ahead), into three
 * stages in the 128-byte swizzle the tensor cores read from shared memory.
 * Per tile j and warpgroup: S_j = Q K_j^T (8 wgmma of k16, Q and K from
 * shared memory) and O += P_{j-1} V_{j-1} (8 wgmma, P from registers, V
 * read N-major) are issued together, and the mask and online softmax of
 * S_j run while the second is still on the tensor cores (flash attention
 * 3's overlap within a warpgroup; the accumulator is laid out as mma.sync's
 * C fragments, so attention_mma.cuh's softmax serves); then O is rescaled.
 * Three stages because V_{j-1} is still read while tile j + 1 lands. A
 * warpgroup skips tiles past all its rows. kernels/lab/README.md (rows 14)
 * has the variants tried: warp specialization with a cp.async producer
 * was slower. */
enum { WG_BM = 128, WG_BN = 128, WG_HD = 128, WG_STAGES = 3, WG_THREADS = 256 };

static constexpr size_t wgmma_smem_bytes()
{
    return 1024 /* alignment to the swizzle's repeat */ + (size_t)WG_BM * WG_HD * 2 +
           2 * WG_STAGES * (size_t)WG_BN * WG_HD * 2;
}

#ifdef SHOAL_WGMMA
/* O += P V for one staged V tile at vb (the group's wgmma, issued; the
 * caller commits and waits). */
static __device__ __forceinline__ void wgmma_pv(float (&o)[WG_HD / 8][4],
                                                const uint32_t (&p)[WG_BN / 16][4], uint32_t vb)
{
#pragma unroll
    for (int kk = 0; kk < WG_BN / 16; kk++) /* 16 keys a step: 2 rows of 8 x 128 B */
        wg::mma_rs_nmajor(o, p[kk], wg::desc(vb + kk * 16 * 128, WG_BN * 128, 1024));
}

/* S = Q K^T for one staged K tile at kb and the group's Q rows at qg (K-major
 * both, one descriptor a k16 step; issued, the caller commits and waits). */
static __device__ __forceinline__ void wgmma_qk(float (&sc)[WG_BN / 8][4], uint32_t qg,
                                                uint32_t kb)
{
    wg::mma_ss_first(sc, wg::desc(qg, 16, 1024), wg::desc(kb, 16, 1024));
#pragma unroll
    for (int kk = 1; kk < WG_HD / 16; kk++) {
        const uint32_t at = (kk >> 2) * (WG_BM * 128) + (kk & 3) * 32;
        const uint32_t bt = (kk >> 2) * (WG_BN * 128) + (kk & 3) * 32;
        wg::mma_ss(sc, wg::desc(qg + at, 16, 1024), wg::desc(kb + bt, 16, 1024));
    }
}
#endif

static __global__ void __launch_bounds__(WG_THREADS, 1)
    attn_prompt_wgmma(prompt_args a, const bf16 *q, bf16 *out, const int32_t *row_stream,
                      const int32_t *positions, const int32_t *page_table)
{
#ifdef SHOAL_WGMMA
    constexpr int HD = WG_HD, BM = WG_BM, BN = WG_BN, THREADS = WG_THREADS, NT = BN / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[BM], row_p[BM];
    const uint32_t qs = (mma::smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t ks0 = qs + BM * HD * 2;
    const uint32_t tile_bytes = BN * HD * 2;
    const uint32_t vs0 = ks0 + WG_STAGES * tile_bytes;

    const int tile = gridDim.x - 1 - blockIdx.x;
    const prompt_rows_map map = {tile * (BM / a.pack), BM / a.pack, (int)blockIdx.y * a.pack};
    const int kvh = map.h0 / a.group;
    const int warp = threadIdx.x >> 5, grp = warp >> 2;
    const int wrow0 = warp * 16;

    prompt_stage_q<HD, BM, THREADS, rows_sw128<BM>>(qs, row_s, row_p, q, row_stream, positions,
                                                    a.rows, a.heads, map);
    mma::cp_async_commit();

    const size_t k_off = a.k_off + (size_t)kvh * a.head_stride;
    const size_t v_off = a.v_off + (size_t)kvh * a.head_stride;
    /* the group's 64 rows of Q: K-major, one descriptor a k16 step */
    const uint32_t qg = qs + grp * 64 * 128;

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    uint32_t p[NT / 2][4]; /* P of the tile whose O += P V is pending */

    unsigned done[BM / 32] = {};
    int maxp, s;
    /* row_s, row_p; Q is waited on with the first K/V tile (next_tile),
     * its latency under the stream scan and that tile's staging */
    __syncthreads();
    while ((s = prompt_next_stream<BM>(row_s, row_p, done, &maxp)) >= 0) {
        int last[1][2];
        const prompt_warp_rows w = prompt_rows_of<1>(row_s, row_p, s, wrow0, last);
        int g_max = -1; /* the group's last row of s: wgmma is the group's */
        for (int i = grp * 64 + (threadIdx.x & 31); i < grp * 64 + 64; i += 32)
            if (row_s[i] == s)
                g_max = max(g_max, row_p[i]);
        g_max = warp_max(g_max);
        const int32_t *pages = page_table + (size_t)s * (size_t)a.page_table_stride;
        const int kv_end = maxp + 1;
        const int ntiles = (kv_end + BN - 1) / BN;
        using KVL = prompt_kv<HD, THREADS, bf16, BN, rows_sw128<BN>>;

        /* the group's tiles: 0 .. ng - 1 (keys up to its last row) */
        const int ng = g_max < 0 ? 0 : min(ntiles, g_max / BN + 1);

        __syncthreads(); /* every group is done with the stages of the last stream */
        typename KVL::pages_of pg; /* of the tile staged next */
        KVL::lookup(pg, pages, a.pt_shift, 0, kv_end);
        KVL::issue(ks0, vs0, a.arena, a.page_bytes, pg, a.pt_shift, k_off, v_off, 0);
        mma::cp_async_commit();
        KVL::lookup(pg, pages, a.pt_shift, BN, kv_end);
        /* tile j landed and is everyone's; every group is past tile j - 1,
         * so waited on O += P_{j-2} V_{j-2}, whose stage takes tile j + 1.
         * Its pages were looked up a tile ago; tile j + 2's are looked up
         * now, their latency under this tile's work. */
        auto next_tile = [&](int j) {
            mma::cp_async_wait<0>();
            wg::fence_smem();
            __syncthreads();
            if (j + 1 < ntiles) {
                const uint32_t nb = ((j + 1) % WG_STAGES) * tile_bytes;
                KVL::issue(ks0 + nb, vs0 + nb, a.arena, a.page_bytes, pg, a.pt_shift, k_off,
                           v_off, (j + 1) * BN);
                mma::cp_async_commit();
                KVL::lookup(pg, pages, a.pt_shift, (j + 2) * BN, kv_end);
            }
        };
        /* the mask and softmax of tile j's scores; corr for o */
        auto soft = [&](float (&sc)[NT][4], int j, float (&corr)[2]) {
            const int key0 = j * BN;
            if (w.other || key0 + BN - 1 > w.w_min)
                prompt_mask<NT>(sc, last[0], key0);
            mma::softmax_scores<NT>(sc, a.scale_log2, m, l, corr);
        };
        /* p, the A registers of O += P V: written only once the last
         * O += P V that reads them is waited on */
        auto pack = [&](const float (&sc)[NT][4]) {
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++)
                mma::p_fragment<NT>(p[kk], sc, kk);
            wg::keep(p); /* packed here, not sunk past the next wgmma.fence */
        };

        /* the pending O += P V of the tile at stage `st`, alone */
        auto flush = [&](int st) {
            wg::keep(o); /* rescaled before the fence, not sunk past it */
            wg::fence();
            wgmma_pv(o, p, vs0 + st * tile_bytes);
            wg::commit();
            wg::wait<0>();
            wg::keep(o);
        };

        next_tile(0); /* tile 0 apart: no O += P V pending before it */
        if (ng > 0) {
            float sc[NT][4], corr[2];
            wg::keep(o);
            wg::fence();
            wgmma_qk(sc, qg, ks0);
            wg::commit();
            wg::wait<0>();
            wg::keep(sc);
            soft(sc, 0, corr);
            pack(sc);
            mma::rescale<HD>(o, corr);
        }
        for (int j = 1; j < ntiles; j++) {
            next_tile(j);
            const int prev = (j - 1) % WG_STAGES;
            if (j < ng) {
                float sc[NT][4], corr[2];
                wg::keep(o);
                wg::fence();
                wgmma_qk(sc, qg, ks0 + (j % WG_STAGES) * tile_bytes);
                wg::commit();
                wgmma_pv(o, p, vs0 + prev * tile_bytes);
                wg::commit();
                wg::wait<1>(); /* S_j; O += P_{j-1} V_{j-1} still running */
                wg::keep(sc);
                soft(sc, j, corr);
                wg::wait<0>();
                wg::keep(o);
                pack(sc);
                mma::rescale<HD>(o, corr);
            } else if (j == ng) {
                flush(prev);
            }
        }
        if (ng == ntiles && ng > 0)
            flush((ng - 1) % WG_STAGES);
    }
    prompt_store<HD>(o, l, wrow0, map, a.rows, 1.0f, out, (size_t)a.heads * HD);
#endif
}

/* Whether this build runs attn_prompt_wgmma on the current device: its
 * code exists only in sm_90a machine code (the PTX for newer cards
 * leaves it empty). */
static __global__ void wgmma_probe(int *ok)
{
#ifdef SHOAL_WGMMA
    *ok = 1;
#else
    *ok = 0;
#endif
}

/* The instances this file provides: f(kernel, shared-memory bytes, threads,
 * rows a block, whether it packs query heads: prompt_rows_map) for head
 * dim hd, KV dtype kv and tile variant `tile` (SHOAL_CUDA_PROMPT_TILE);
 * tile 4 is the wgmma kernel where `wgmma` says it runs and the shape is
 * its own (head dim 128, bf16 pages), else 1. */
template <int HD, typename S, typename F> static void prompt_instance(bool fp8, F f)
{
    constexpr size_t bytes = prompt_smem_bytes<HD, S::BM>();
    fp8 ? f(attn_prompt_kernel<HD, S, __nv_fp8_storage_t>, bytes, S::THREADS, S::BM, false)
        : f(attn_prompt_kernel<HD, S, bf16>, bytes, S::THREADS, S::BM, false);
}

template <int HD, typename F>
static void prompt_tile_dispatch(int tile, bool wgmma, bool fp8, F f)
{
    if (tile == 4 && wgmma && HD == WG_HD && !fp8) {
        f(attn_prompt_wgmma, wgmma_smem_bytes(), (int)WG_THREADS, (int)WG_BM, true);
        return;
    }
    switch (tile) {
    case 2: prompt_instance<HD, prompt_shape<4, 2, false, 1>>(fp8, f); break;
    case 3: prompt_instance<HD, prompt_shape<8, 1, true, 1>>(fp8, f); break;
    default: prompt_instance<HD, prompt_shape<4, 1, true, 1>>(fp8, f); break;
    }
}

template <typename F>
static bool prompt_dispatch(int hd, shoal_dtype kv, int tile, bool wgmma, F f)
{
    bool fp8 = kv == SHOAL_DTYPE_F8_E4M3;
    switch (hd) {
    case 32: prompt_tile_dispatch<32>(tile, wgmma, fp8, f); return true;
    case 64: prompt_tile_dispatch<64>(tile, wgmma, fp8, f); return true;
    case 128: prompt_tile_dispatch<128>(tile, wgmma, fp8, f); return true;
    default: return false;
    }
}

/* Runs wgmma_probe once: false where the build holds no sm_90a code for
 * this device (the launch fails, or the kernel it runs is the empty one). */
static bool wgmma_usable(kernels_backend *be)
{
    cudaStream_t stream = cuda_of(be)->stream;
    int *dev = NULL, ok = 0;
    if (cudaMalloc(&dev, sizeof *dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    wgmma_probe<<<1, 1, 0, stream>>>(dev);
    if (cudaGetLastError() != cudaSuccess ||
        cudaMemcpyAsync(&ok, dev, sizeof ok, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        ok = 0;
    (void)cudaGetLastError();
    cudaFree(dev);
    return ok == 1;
}

shoal_err cuda_attention_prompt_init(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    st->prompt_wgmma = st->prompt_tile == 4 && wgmma_usable(be);
    cudaError_t e = cudaSuccess;
    for (int hd : {32, 64, 128})
        for (shoal_dtype kv : {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3})
            prompt_dispatch(hd, kv, st->prompt_tile, st->prompt_wgmma,
                            [&](auto kernel, size_t bytes, int, int, bool) {
                                if (e == cudaSuccess)
                                    e = cudaFuncSetAttribute(
                                        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes);
                            });
    if (e != cudaSuccess)
        cuda_fail(be, "attention prompt: raise the shared-memory limit", e);
    return st->err;
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
    prompt_dispatch(hd, L->dtype, cuda_of(be)->prompt_tile, cuda_of(be)->prompt_wgmma,
                    [&](auto kernel, size_t bytes, int threads, int bm, bool packs) {
                        /* a block's rows: bm / pack tokens of pack query heads */
                        a.pack = packs && bm % a.group == 0 ? a.group : 1;
                        const int tb = bm / a.pack;
                        dim3 grid((unsigned)((batch->rows + tb - 1) / tb),
                                  (unsigned)(heads / a.pack));
                        kernel<<<grid, threads, bytes, stream>>>(a, (const bf16 *)q, (bf16 *)out,
                                                                 batch->row_stream,
                                                                 batch->positions,
                                                                 batch->page_table);
                    });
    cuda_launched(be, "attention prompt");
}
