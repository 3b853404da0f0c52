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
 * kernels further down instead: the same algorithm on warpgroup MMA, a
 * block holding the query heads of one KV head (prompt_rows_map), in its
 * warp-specialized form (attn_prompt_ws: tiles copied by the tensor memory
 * accelerator) where a tensor map of the arena can be made, else with
 * every thread copying (attn_prompt_wgmma).
 *
 * bf16 activations and head dims 32, 64, 128 and 256 (Qwen3.5's and
 * Qwen3-Next's full attention: 64-row tiles of 4 warps, 160 KiB of shared
 * memory, a few spilled registers) take these kernels; other shapes, and
 * f32 activations (the exact mode), go to the partial path. */
#include "attention_mma.cuh"
#include "wgmma.cuh"

#include <algorithm>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <limits.h>
#include <string.h>

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
    int tiles; /* attn_prompt_ws: tiles of BM / pack tokens (its items: heads / pack x tiles) */
    bool stale_q; /* attn_prompt_ws, tests: the next item's Q never copied (a planted fault) */
    /* attn_prompt_ws: the arena as rows of 128 bf16 (a token's K or V of one
     * KV head), boxes of 64 columns by a page's tokens, 128-byte swizzle */
    CUtensorMap kv_map;
};

/* Where a block's tile rows come from: row i is the query row of token t0
 * + i % tb at query head h0 + i / tb. The mma.sync kernels take one head a
 * block (tb = the tile's rows); the wgmma kernels the `pack` query heads
 * of one KV head (tb = rows / pack), so that each K and V tile staged
 * serves all of them: a quarter of the loads at Qwen3's grouping. */
struct prompt_rows_map {
    int t0, tb, h0;
};

/* The block's rows (tb = a tile's tokens). The grid is (query heads /
 * pack, tiles) (attn_prompt_ws deals the same items in the same order:
 * ws_item), the heaviest tiles (the last rows, which see the most
 * keys) first, so the blocks of every head at one tile go out together and
 * a causal prompt's longest blocks never start in its last wave. One
 * head's tiles after another's (the grid before) left the last head's
 * longest blocks to the end: on the H200, warp-specialized kernel, 1,024
 * tokens 187 -> 243 TFLOP/s, 2,048 302 -> 342, 3,072 380 -> 391, 4,096
 * 425 -> 423 (kernels/lab/README.md row 16.3). */
static __device__ __forceinline__ prompt_rows_map prompt_tile_map(int x, int y, int tiles, int tb,
                                                                  int pack)
{
    return {(tiles - 1 - y) * tb, tb, x * pack};
}

static __device__ __forceinline__ prompt_rows_map prompt_block_map(int tb, int pack)
{
    return prompt_tile_map((int)blockIdx.x, (int)blockIdx.y, (int)gridDim.y, tb, pack);
}

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

/* The stream and position of row i of a block's tile (prompt_rows_map;
 * -1 past the last token). */
static __device__ __forceinline__ void prompt_row_at(prompt_rows_map map, int i, int rows,
                                                     const int32_t *row_stream,
                                                     const int32_t *positions, int *s, int *p)
{
    const int r = map.t0 + i % map.tb;
    *s = r < rows ? row_stream[r] : -1;
    *p = r < rows ? positions[r] : -1;
}

/* prompt_row_at of each of a block's BM rows into row_s and row_p, rows
 * tid, tid + THREADS, ... */
template <int BM, int THREADS>
static __device__ __forceinline__ void
prompt_rows_fill(int *row_s, int *row_p, const int32_t *row_stream, const int32_t *positions,
                 int rows, prompt_rows_map map, int tid)
{
    for (int i = tid; i < BM; i += THREADS)
        prompt_row_at(map, i, rows, row_stream, positions, &row_s[i], &row_p[i]);
}

/* The query rows row0 .. row0 + n - 1 of a block's tile by cp.async, chunk
 * c of row `row` at qs + L::at(row, c) (zeros past the last token), by
 * threads tid of THREADS. The caller commits and waits. */
template <int HD, int THREADS, typename L>
static __device__ __forceinline__ void prompt_copy_q(uint32_t qs, const bf16 *q, int rows,
                                                     int heads, prompt_rows_map map, int row0,
                                                     int n, int tid)
{
    constexpr int CH = HD / 8;
    const size_t q_stride = (size_t)heads * HD;
    for (int i = tid; i < n * CH; i += THREADS) {
        int row = row0 + i / CH, c = i % CH, r = map.t0 + row % map.tb, h = map.h0 + row / map.tb;
        bool valid = r < rows;
        mma::cp_async16(qs + L::at(row, c),
                        valid ? (const void *)(q + (size_t)r * q_stride + (size_t)h * HD + c * 8)
                              : (const void *)q,
                        valid);
    }
}

/* Stages the block's BM rows (prompt_rows_map): their streams and
 * positions into row_s and row_p, and their query rows (prompt_copy_q).
 * The caller commits and waits. */
template <int HD, int BM, int THREADS, typename L>
static __device__ __forceinline__ void
prompt_stage_q(uint32_t qs, int *row_s, int *row_p, const bf16 *q, const int32_t *row_stream,
               const int32_t *positions, int rows, int heads, prompt_rows_map map, int tid)
{
    prompt_rows_fill<BM, THREADS>(row_s, row_p, row_stream, positions, rows, map, tid);
    prompt_copy_q<HD, THREADS, L>(qs, q, rows, heads, map, 0, BM, tid);
}

/* The next stream among the tile's rows not yet done (-1: none left): its
 * rows are marked done and *maxp is the last position among them. A tile
 * holds one stream in the usual case (the model sends runs of one). Each
 * warp works it out on its own, a lane a row (BM a multiple of 32): rs[k]
 * and rp[k] are row 32 k + lane's stream and position, and every lane gets
 * the same result. */
template <int BM>
static __device__ __forceinline__ int prompt_next_stream_lanes(const int (&rs)[BM / 32],
                                                               const int (&rp)[BM / 32],
                                                               unsigned (&done)[BM / 32], int *maxp)
{
    const int lane = threadIdx.x & 31;
    int first = -INT_MAX; /* minus the first row not done */
#pragma unroll
    for (int k = BM / 32 - 1; k >= 0; k--)
        if (!((done[k] >> lane) & 1) && rs[k] >= 0)
            first = -(32 * k + lane);
    first = -warp_max(first);
    *maxp = -1;
    if (first == INT_MAX)
        return -1;
    int s = -1;
#pragma unroll
    for (int k = 0; k < BM / 32; k++) {
        const int v = __shfl_sync(0xffffffffu, rs[k], first & 31);
        if (k == first >> 5)
            s = v;
    }
    int mp = -1;
#pragma unroll
    for (int k = 0; k < BM / 32; k++) {
        const bool mine = rs[k] == s;
        done[k] |= __ballot_sync(0xffffffffu, mine);
        if (mine)
            mp = max(mp, rp[k]);
    }
    *maxp = warp_max(mp);
    return s;
}

/* prompt_next_stream_lanes over rows staged in shared memory. */
template <int BM>
static __device__ __forceinline__ int prompt_next_stream(const int *row_s, const int *row_p,
                                                         unsigned (&done)[BM / 32], int *maxp)
{
    const int lane = threadIdx.x & 31;
    int rs[BM / 32], rp[BM / 32];
#pragma unroll
    for (int k = 0; k < BM / 32; k++) {
        rs[k] = row_s[32 * k + lane];
        rp[k] = row_p[32 * k + lane];
    }
    return prompt_next_stream_lanes<BM>(rs, rp, done, maxp);
}

/* Whether rows of another stream are left after the ones done. */
template <int BM>
static __device__ __forceinline__ bool prompt_rows_left(const int *row_s,
                                                        const unsigned (&done)[BM / 32])
{
    const int lane = threadIdx.x & 31;
    bool left = false;
#pragma unroll
    for (int k = 0; k < BM / 32; k++)
        left |= !((done[k] >> lane) & 1) && row_s[32 * k + lane] >= 0;
    return __any_sync(0xffffffffu, left);
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

    const prompt_rows_map map = prompt_block_map(BM, 1);
    const int h = map.h0, kvh = h / a.group;
    const int warp = threadIdx.x >> 5;
    const int wrow0 = warp * 16 * MT; /* the warp's first row in the tile */

    prompt_stage_q<HD, BM, THREADS, rows_swz<HD>>(qs, row_s, row_p, q, row_stream, positions,
                                                  a.rows, a.heads, map, threadIdx.x);
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

/* A warpgroup's side of the wgmma kernels: its rows' online softmax (o, m,
 * l, kept across the block's streams) and P of the tile whose O += P V is
 * pending, written only once the last O += P V that reads it is waited on. */
struct wg_rows {
    float o[WG_HD / 8][4];
    float m[2], l[2];
    uint32_t p[WG_BN / 16][4];

    __device__ __forceinline__ void start()
    {
#pragma unroll
        for (int i = 0; i < WG_HD / 8; i++)
            o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

/* The warp's rows of stream s (prompt_rows_of) and its group's tiles, 0 ..
 * ng - 1: the keys up to the group's last row of s (wgmma is the group's). */
struct wg_stream {
    prompt_warp_rows w;
    int last[1][2];
    int ng;
};

static __device__ __forceinline__ wg_stream wg_stream_of(const int *row_s, const int *row_p,
                                                         int s, int wrow0, int grp, int ntiles)
{
    wg_stream ws;
    ws.w = prompt_rows_of<1>(row_s, row_p, s, wrow0, ws.last);
    int g_max = -1;
    for (int i = grp * 64 + (threadIdx.x & 31); i < grp * 64 + 64; i += 32)
        if (row_s[i] == s)
            g_max = max(g_max, row_p[i]);
    g_max = warp_max(g_max);
    ws.ng = g_max < 0 ? 0 : min(ntiles, g_max / WG_BN + 1);
    return ws;
}

/* The mask and online softmax of tile j's scores (keys from j * WG_BN);
 * corr: O's factor. */
static __device__ __forceinline__ void wg_softmax(wg_rows &g, float (&sc)[WG_BN / 8][4],
                                                  const wg_stream &ws, int j, float scale,
                                                  float (&corr)[2])
{
    const int key0 = j * WG_BN;
    if (ws.w.other || key0 + WG_BN - 1 > ws.w.w_min)
        prompt_mask<WG_BN / 8>(sc, ws.last[0], key0);
    mma::softmax_scores<WG_BN / 8>(sc, scale, g.m, g.l, corr);
}

/* P packed as the A registers of the next O += P V, then O rescaled. */
static __device__ __forceinline__ void wg_pack_rescale(wg_rows &g, const float (&sc)[WG_BN / 8][4],
                                                       const float (&corr)[2])
{
#pragma unroll
    for (int kk = 0; kk < WG_BN / 16; kk++)
        mma::p_fragment<WG_BN / 8>(g.p[kk], sc, kk);
    wg::keep(g.p); /* packed here, not sunk past the next wgmma.fence */
    mma::rescale<WG_HD>(g.o, corr);
}

/* Tile 0 of a stream (no O += P V pending): S_0 = Q K_0^T (Q's rows at qg,
 * K's tile at kb), its mask and softmax, P_0 packed, O rescaled. */
static __device__ __forceinline__ void wg_first_tile(wg_rows &g, const wg_stream &ws, uint32_t qg,
                                                     uint32_t kb, float scale)
{
    float sc[WG_BN / 8][4], corr[2];
    wg::keep(g.o);
    wg::fence();
    wgmma_qk(sc, qg, kb);
    wg::commit();
    wg::wait<0>();
    wg::keep(sc);
    wg_softmax(g, sc, ws, 0, scale, corr);
    wg_pack_rescale(g, sc, corr);
}

/* Tile j > 0: S_j = Q K_j^T issued with O += P_{j-1} V_{j-1} (V's tile at
 * vb_prev), the mask and softmax of S_j while the second runs; v_done()
 * once it is waited on (V_{j-1}'s stage is free), then P_j packed and O
 * rescaled (flash attention 3's overlap within a warpgroup). */
template <typename F>
static __device__ __forceinline__ void wg_tile(wg_rows &g, const wg_stream &ws, int j, uint32_t qg,
                                               uint32_t kb, uint32_t vb_prev, float scale,
                                               F v_done)
{
    float sc[WG_BN / 8][4], corr[2];
    wg::keep(g.o);
    wg::fence();
    wgmma_qk(sc, qg, kb);
    wg::commit();
    wgmma_pv(g.o, g.p, vb_prev);
    wg::commit();
    wg::wait<1>(); /* S_j; O += P_{j-1} V_{j-1} still running */
    wg::keep(sc);
    wg_softmax(g, sc, ws, j, scale, corr);
    wg::wait<0>();
    wg::keep(g.o);
    v_done();
    wg_pack_rescale(g, sc, corr);
}

/* The pending O += P V alone (V's tile at vb). */
static __device__ __forceinline__ void wg_flush(wg_rows &g, uint32_t vb)
{
    wg::keep(g.o); /* rescaled before the fence, not sunk past it */
    wg::fence();
    wgmma_pv(g.o, g.p, vb);
    wg::commit();
    wg::wait<0>();
    wg::keep(g.o);
}
#endif

static __global__ void __launch_bounds__(WG_THREADS, 1)
    attn_prompt_wgmma(prompt_args a, const bf16 *q, bf16 *out, const int32_t *row_stream,
                      const int32_t *positions, const int32_t *page_table)
{
#ifdef SHOAL_WGMMA
    constexpr int HD = WG_HD, BM = WG_BM, BN = WG_BN, THREADS = WG_THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[BM], row_p[BM];
    const uint32_t qs = (mma::smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t ks0 = qs + BM * HD * 2;
    const uint32_t tile_bytes = BN * HD * 2;
    const uint32_t vs0 = ks0 + WG_STAGES * tile_bytes;

    const prompt_rows_map map = prompt_block_map(BM / a.pack, a.pack);
    const int kvh = map.h0 / a.group;
    const int warp = threadIdx.x >> 5, grp = warp >> 2;
    const int wrow0 = warp * 16;

    prompt_stage_q<HD, BM, THREADS, rows_sw128<BM>>(qs, row_s, row_p, q, row_stream, positions,
                                                    a.rows, a.heads, map, threadIdx.x);
    mma::cp_async_commit();

    const size_t k_off = a.k_off + (size_t)kvh * a.head_stride;
    const size_t v_off = a.v_off + (size_t)kvh * a.head_stride;
    /* the group's 64 rows of Q: K-major, one descriptor a k16 step */
    const uint32_t qg = qs + grp * 64 * 128;

    wg_rows g;
    g.start();

    unsigned done[BM / 32] = {};
    int maxp, s;
    /* row_s, row_p; Q is waited on with the first K/V tile (next_tile),
     * its latency under the stream scan and that tile's staging */
    __syncthreads();
    while ((s = prompt_next_stream<BM>(row_s, row_p, done, &maxp)) >= 0) {
        const int32_t *pages = page_table + (size_t)s * (size_t)a.page_table_stride;
        const int kv_end = maxp + 1;
        const int ntiles = (kv_end + BN - 1) / BN;
        const wg_stream ws = wg_stream_of(row_s, row_p, s, wrow0, grp, ntiles);
        const int ng = ws.ng;
        using KVL = prompt_kv<HD, THREADS, bf16, BN, rows_sw128<BN>>;

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
        next_tile(0); /* tile 0 apart: no O += P V pending before it */
        if (ng > 0)
            wg_first_tile(g, ws, qg, ks0, a.scale_log2);
        for (int j = 1; j < ntiles; j++) {
            next_tile(j);
            const uint32_t prev = (j - 1) % WG_STAGES * tile_bytes;
            if (j < ng)
                wg_tile(g, ws, j, qg, ks0 + (j % WG_STAGES) * tile_bytes, vs0 + prev,
                        a.scale_log2, [] {});
            else if (j == ng)
                wg_flush(g, vs0 + prev);
        }
        if (ng == ntiles && ng > 0)
            wg_flush(g, vs0 + (ng - 1) % WG_STAGES * tile_bytes);
    }
    prompt_store<HD>(g.o, g.l, wrow0, map, a.rows, 1.0f, out, (size_t)a.heads * HD);
#endif
}

/* The warp-specialized sm_90a kernel (SHOAL_CUDA_PROMPT_TILE=5, the default
 * where the driver encodes tensor maps and pages hold 8 to 256 tokens):
 * the wgmma kernel's block of 128 rows and its per-tile work, split as
 * flash attention 3 splits it. Warpgroup 0 only copies: one warp looks up
 * a tile's pages and stages K and V by the tensor memory accelerator (a
 * copy per page, or per tile of a larger page, and 64-column half;
 * prompt_args.kv_map), counted on the stage's `full` barrier, once both
 * computing warpgroups have freed the stage on its `empty` barrier.
 * Warpgroups 1 and 2 only compute, each on its 64 rows, with no
 * block-wide barrier per tile: each waits for its tile and issues S_j = Q
 * K_j^T with O += P_{j-1} V_{j-1}, the softmax of S_j under the second,
 * as the wgmma kernel does. The last tile of a stream lands on the `tail`
 * barrier first: the copying warp zeroes V's rows past the stream (stale
 * page tails, pages not copied) and then completes `full` itself.
 * Registers go from the copying warpgroup to the computing ones
 * (setmaxnreg). Against the wgmma kernel on the H200: 4,096 tokens 333 ->
 * 420-432 TFLOP/s, 2,048 281 -> 336 (kernels/lab/README.md row 16.1;
 * the two computing warpgroups taking turns at issuing, as flash
 * attention 3's ping-pong, measured slower: row 16.2).
 *
 * Persistent (SHOAL_CUDA_PROMPT_PERSIST, ws_item): a block takes item
 * after item (a tile of rows of `pack` query heads, the heaviest first),
 * and the stage ring runs on across them, so the copying warp stages the
 * next item's first K and V tiles while the computing warpgroups finish
 * this one's, and each computing warpgroup copies its rows of the next
 * item's Q once its last S = Q K^T is done. One block an item (the grid
 * of all items) is the same kernel without the overlap. */
enum { WS_THREADS = 384 };

#ifdef SHOAL_WGMMA
/* The item a block takes in its round k, or -1 past the last: the items
 * in order (heaviest first) dealt to the blocks forth and back in turn
 * (snake order), so that the blocks' sums of work differ by about one
 * round's spread. A grid of every item gives each block one. */
static __device__ __forceinline__ int ws_item(int k, int items)
{
    const long long g = gridDim.x, c = blockIdx.x;
    const long long idx = (long long)k * g + (k & 1 ? g - 1 - c : c);
    return idx < items ? (int)idx : -1;
}

/* Item idx's rows: the query heads of idx % (heads / pack), the tile of
 * tokens idx / (heads / pack) from the last (prompt_block_map's order). */
static __device__ __forceinline__ prompt_rows_map ws_item_map(const prompt_args &a, int idx)
{
    const int gx = a.heads / a.pack;
    return prompt_tile_map(idx % gx, idx / gx, a.tiles, WG_BM / a.pack, a.pack);
}

#endif

static __global__ void __launch_bounds__(WS_THREADS, 1)
    attn_prompt_ws(const __grid_constant__ prompt_args a, const bf16 *q, bf16 *out,
                   const int32_t *row_stream, const int32_t *positions, const int32_t *page_table)
{
#ifdef SHOAL_WGMMA
    constexpr int HD = WG_HD, BM = WG_BM, BN = WG_BN, S = WG_STAGES;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int row_s[BM], row_p[BM];              /* the computing warpgroups' item */
    __shared__ __align__(8) uint64_t bars[2 * S + 1]; /* full[S], empty[S], tail */
    const uint32_t qs = (mma::smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t ks0 = qs + BM * HD * 2;
    const uint32_t tile_bytes = BN * HD * 2;
    const uint32_t vs0 = ks0 + S * tile_bytes;
    const uint32_t full0 = mma::smem_addr(&bars[0]), empty0 = full0 + 8 * S;
    const uint32_t tail_bar = full0 + 16 * S;

    const int items = a.heads / a.pack * a.tiles;
    const int wgi = threadIdx.x >> 7; /* 0: copies; 1 and 2: products */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int idx = ws_item(0, items);
    if (idx < 0)
        return;

    if (wgi > 0)
        prompt_stage_q<HD, BM, 256, rows_sw128<BM>>(qs, row_s, row_p, q, row_stream, positions,
                                                    a.rows, a.heads, ws_item_map(a, idx),
                                                    threadIdx.x - 128);
    mma::cp_async_commit();
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) {
            wg::bar_init(full0 + 8 * i, 1);
            wg::bar_init(empty0 + 8 * i, 256); /* every computing thread */
        }
        wg::bar_init(tail_bar, 1);
        wg::bar_init_fence();
    }
    __syncthreads(); /* the first item's rows and the barriers; nothing block-wide after */

    uint32_t it = 0; /* tiles staged (or taken) so far: the stage and its parity */
    if (wgi == 0) {
        wg::regs_dec<40>();
        if (warp != 0)
            return;
        /* a copy: BR rows of one page (pages of more than a tile's tokens
         * give a tile part of one) */
        const int R = 1 << a.pt_shift, BR = min(R, BN), page_rows = (int)(a.page_bytes / 256);
        uint32_t tail_par = 0;
        for (int k = 0; idx >= 0; idx = ws_item(++k, items)) {
            const prompt_rows_map map = ws_item_map(a, idx);
            const int kvh = map.h0 / a.group;
            const int krow = (int)((a.k_off + (size_t)kvh * a.head_stride) / HD);
            const int vrow = (int)((a.v_off + (size_t)kvh * a.head_stride) / HD);
            /* the item's rows, a lane's own (prompt_next_stream_lanes) */
            int rs[BM / 32], rp[BM / 32];
#pragma unroll
            for (int r = 0; r < BM / 32; r++)
                prompt_row_at(map, 32 * r + lane, a.rows, row_stream, positions, &rs[r], &rp[r]);
            unsigned done[BM / 32] = {};
            int maxp, s;
            while ((s = prompt_next_stream_lanes<BM>(rs, rp, done, &maxp)) >= 0) {
                const int32_t *pages = page_table + (size_t)s * (size_t)a.page_table_stride;
                const int kv_end = maxp + 1, ntiles = (kv_end + BN - 1) / BN;
                for (int j = 0; j < ntiles; j++, it++) {
                    const uint32_t st = it % S;
                    const int valid = min(BN, kv_end - j * BN), copies = (valid + BR - 1) / BR * 4;
                    /* copy c = lane + 32 k: rows c / 4 of the tile (BR
                     * tokens), half (c / 2) % 2, K or V c % 2; its first
                     * row in the map */
                    int row[2];
#pragma unroll
                    for (int c2 = 0; c2 < 2; c2++) {
                        const int c = lane + 32 * c2, t = j * BN + (c >> 2) * BR;
                        row[c2] = c < copies ? pages[t >> a.pt_shift] * page_rows +
                                                   (c & 1 ? vrow : krow) + (t & (R - 1))
                                             : 0;
                    }
                    const bool tail = valid < BN;
                    const uint32_t bar = tail ? tail_bar : full0 + 8 * st;
                    wg::bar_wait(empty0 + 8 * st, ((it / S) & 1) ^ 1);
                    if (lane == 0)
                        wg::bar_arrive_expect(bar, (uint32_t)(copies * BR * 128));
                    __syncwarp();
#pragma unroll
                    for (int c2 = 0; c2 < 2; c2++) {
                        const int c = lane + 32 * c2;
                        if (c >= copies)
                            continue;
                        const int half = (c >> 1) & 1;
                        const uint32_t dst = (c & 1 ? vs0 : ks0) + st * tile_bytes +
                                             half * (BN * 128) + (c >> 2) * BR * 128;
                        wg::tma_load_2d(dst, &a.kv_map, half * 64, row[c2], bar);
                    }
                    if (tail) { /* V's rows past the stream zeroed, then the stage is full */
                        wg::bar_wait(tail_bar, tail_par);
                        tail_par ^= 1;
                        for (int i = lane; i < (BN - valid) * 16; i += 32) {
                            const uint32_t at =
                                vs0 + st * tile_bytes + wg::sw128_at<BN>(valid + i / 16, i % 16);
                            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at),
                                         "r"(0)
                                         : "memory");
                        }
                        wg::fence_smem();
                        __syncwarp();
                        if (lane == 0)
                            wg::bar_arrive(full0 + 8 * st);
                    }
                }
            }
        }
        return;
    }
    wg::regs_inc<232>();
    const int grp = wgi - 1;
    const int wrow0 = (warp - 4) * 16; /* the warp's first row of the tile */
    const uint32_t qg = qs + grp * 64 * 128;
    const int ctid = threadIdx.x - 128; /* of the computing threads */

    wg_rows g;
    auto release = [&](uint32_t st) { wg::bar_arrive(empty0 + 8 * st); }; /* done reading st */
    auto take = [&]() { /* the stage of the next tile, once it has landed */
        const uint32_t st = it % S;
        wg::bar_wait(full0 + 8 * st, (it / S) & 1);
        return st;
    };
    for (int k = 0; idx >= 0; k++) {
        const prompt_rows_map map = ws_item_map(a, idx);
        const int next = ws_item(k + 1, items);
        /* this group's rows of the next item's Q, once its last S = Q K^T
         * of this item is done (every thread of the group at once) */
        bool q_next = next < 0;
        auto copy_q_next = [&] {
            if (q_next)
                return;
            q_next = true;
            if (a.stale_q)
                return;
            /* every warp of the group past its waits on the products that
             * read Q: a thread copies rows of all four warps */
            wg::named_sync(2 + grp, 128);
            prompt_copy_q<HD, 128, rows_sw128<BM>>(qs, q, a.rows, a.heads, ws_item_map(a, next),
                                                   grp * 64, 64, ctid & 127);
            mma::cp_async_commit();
        };
        mma::cp_async_wait<0>();
        wg::fence_smem();
        wg::named_sync(1, 256); /* the item's rows and both groups' Q landed */

        g.start();
        unsigned done[BM / 32] = {};
        int maxp, s;
        while ((s = prompt_next_stream<BM>(row_s, row_p, done, &maxp)) >= 0) {
            const bool last = !prompt_rows_left<BM>(row_s, done); /* Q's last stream */
            const int ntiles = (maxp + 1 + BN - 1) / BN;
            const wg_stream ws = wg_stream_of(row_s, row_p, s, wrow0, grp, ntiles);
            const int ng = ws.ng;
            if (last && ng == 0)
                copy_q_next();
            uint32_t prev = 0; /* the stage of tile j - 1 */
            if (ntiles > 0) {  /* tile 0 apart: no O += P V pending before it */
                prev = take();
                if (ng > 0)
                    wg_first_tile(g, ws, qg, ks0 + prev * tile_bytes, a.scale_log2);
                else
                    release(prev);
                if (last && ng == 1)
                    copy_q_next();
                it++;
            }
            for (int j = 1; j < ntiles; j++, it++) {
                const uint32_t st = take();
                if (j < ng) {
                    wg_tile(g, ws, j, qg, ks0 + st * tile_bytes, vs0 + prev * tile_bytes,
                            a.scale_log2, [&] {
                                release(prev);
                                if (last && j == ng - 1)
                                    copy_q_next();
                            });
                } else {
                    if (j == ng && ng > 0) {
                        wg_flush(g, vs0 + prev * tile_bytes);
                        release(prev);
                    }
                    release(st);
                }
                prev = st;
            }
            if (ng == ntiles && ng > 0) {
                wg_flush(g, vs0 + prev * tile_bytes);
                release(prev);
            }
        }
        copy_q_next(); /* where no stream was left to do it */
        prompt_store<HD>(g.o, g.l, wrow0, map, a.rows, 1.0f, out, (size_t)a.heads * HD);
        if (next >= 0) {
            wg::named_sync(1, 256); /* both groups are done with the item's rows */
            prompt_rows_fill<BM, 256>(row_s, row_p, row_stream, positions, a.rows,
                                      ws_item_map(a, next), ctid);
        }
        idx = next;
    }
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
    if (tile == 5 && wgmma && HD == WG_HD && !fp8) { /* the caller has a tensor map */
        f(attn_prompt_ws, wgmma_smem_bytes(), (int)WS_THREADS, (int)WG_BM, true);
        return;
    }
    if (tile >= 4 && wgmma && HD == WG_HD && !fp8) {
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
    case 256: prompt_tile_dispatch<256>(tile, wgmma, fp8, f); return true;
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

bool cuda_tmap_bf16(const cuda_state *st, CUtensorMap *out, int rank, const void *p,
                    const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                    int l2_bytes)
{
    const cuuint32_t unit[3] = {1, 1, 1};
    return st->tmap_encode &&
           ((PFN_cuTensorMapEncodeTiled_v12000)st->tmap_encode)(
               out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)p, dims, strides,
               box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               l2_bytes == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
               : l2_bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                 : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool cuda_kv_map(kernels_backend *be, const void *arena, const kernels_kv_layout *L, int box_rows,
                 bool whole_rows, int l2_bytes, void *out)
{
    cuda_state *st = cuda_of(be);
    const int pt = L->page_tokens;
    if (!st->tmap_encode || L->head_dim != WG_HD || L->dtype != SHOAL_DTYPE_BF16 ||
        box_rows < 8 || box_rows > pt || box_rows > 256 || L->page_bytes % 256 != 0 ||
        (uintptr_t)arena % 16 != 0)
        return false; /* a box's rows start at the swizzle's 1,024-byte repeat */
    auto same = [&](const cuda_kv_tmap *t) {
        return t->arena == arena && t->page_tokens == pt && t->box_rows == box_rows &&
               t->whole_rows == whole_rows && t->l2_bytes == l2_bytes;
    };
    cuda_kv_tmap *t = &st->tmaps[0];
    if (!same(t))
        t = &st->tmaps[1];
    if (!same(t)) {
        /* the prompt kernel's boxes in slot 0, the decode partials' in 1 */
        t = &st->tmaps[box_rows > 16 ? 0 : 1];
        /* rows of 256 bytes, as many as an int row coordinate reaches (512
         * GiB, more than a GPU holds); the copies never pass the arena */
        const cuuint64_t dims2[2] = {(cuuint64_t)WG_HD, (cuuint64_t)INT_MAX};
        const cuuint64_t strides2[1] = {(cuuint64_t)WG_HD * 2};
        const cuuint32_t box2[2] = {64, (cuuint32_t)box_rows};
        const cuuint64_t dims3[3] = {64, 2, (cuuint64_t)INT_MAX};
        const cuuint64_t strides3[2] = {128, (cuuint64_t)WG_HD * 2};
        const cuuint32_t box3[3] = {64, 2, (cuuint32_t)box_rows};
        CUtensorMap m;
        bool ok = whole_rows ? cuda_tmap_bf16(st, &m, 3, arena, dims3, strides3, box3, l2_bytes)
                             : cuda_tmap_bf16(st, &m, 2, arena, dims2, strides2, box2, l2_bytes);
        if (!ok)
            return false;
        static_assert(sizeof m == sizeof t->map, "cuda_kv_tmap.map holds a CUtensorMap");
        memcpy(t->map, &m, sizeof m);
        t->arena = arena;
        t->page_tokens = pt;
        t->box_rows = box_rows;
        t->whole_rows = whole_rows;
        t->l2_bytes = l2_bytes;
    }
    memcpy(out, t->map, sizeof t->map);
    return true;
}

shoal_err cuda_attention_prompt_init(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    /* portable: the kernels every GPU runs, whatever the build holds */
    st->sm90a = !st->opt.portable && wgmma_usable(be);
    st->prompt_wgmma = st->prompt_tile >= 4 && st->sm90a;
    st->tmap_encode = NULL;
    memset(st->tmaps, 0, sizeof st->tmaps);
    if (st->sm90a) {
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &st->tmap_encode, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            st->tmap_encode = NULL; /* the cp.async kernels serve */
        (void)cudaGetLastError();
    }
    /* every kernel a call may take: tile 5's falls back to tile 4's where
     * no tensor map serves (cuda_attention_prompt) */
    cudaError_t e = cudaSuccess;
    for (int tile : {st->prompt_tile, st->prompt_tile == 5 ? 4 : st->prompt_tile})
        for (int hd : {32, 64, 128, 256})
            for (shoal_dtype kv : {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3})
                prompt_dispatch(hd, kv, tile, st->prompt_wgmma,
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
           (hd == 32 || hd == 64 || hd == 128 || hd == 256) && heads % layout->kv_heads == 0;
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
    int tile = cuda_of(be)->prompt_tile;
    if (tile == 5 && (fp8 || L->page_tokens > 256 ||
                      !cuda_kv_map(be, arena, L, L->page_tokens < WG_BN ? L->page_tokens : WG_BN,
                                   false, 256, &a.kv_map)))
        tile = 4;
    cudaStream_t stream = cuda_of(be)->stream;
    prompt_dispatch(hd, L->dtype, tile, cuda_of(be)->prompt_wgmma,
                    [&](auto kernel, size_t bytes, int threads, int bm, bool packs) {
                        /* a block's rows: bm / pack tokens of pack query heads */
                        a.pack = packs && bm % a.group == 0 ? a.group : 1;
                        const int tb = bm / a.pack;
                        const int tiles = (batch->rows + tb - 1) / tb;
                        a.tiles = tiles;
                        dim3 grid((unsigned)(heads / a.pack), (unsigned)tiles);
                        if (threads == WS_THREADS) { /* attn_prompt_ws: a row of blocks */
                            cuda_state *st = cuda_of(be);
                            const long long items = (long long)grid.x * tiles;
                            SHOAL_ASSERT(items <= INT_MAX);
                            const int most = st->opt.prompt_blocks > 0 ? st->opt.prompt_blocks
                                                                       : st->sm_count;
                            const long long blocks =
                                st->prompt_persist ? std::min<long long>(items, most) : items;
                            grid = dim3((unsigned)blocks);
                            a.stale_q = st->attn_fault == KERNELS_ATTN_FAULT_STALE_Q;
                            st->prompt_ws_rounds = std::max(st->prompt_ws_rounds,
                                                            (int)((items + blocks - 1) / blocks));
                        } else {
                            SHOAL_ASSERT(tiles <= 65535); /* gridDim.y */
                        }
                        kernel<<<grid, threads, bytes, stream>>>(a, (const bf16 *)q, (bf16 *)out,
                                                                 batch->row_stream,
                                                                 batch->positions,
                                                                 batch->page_table);
                    });
    cuda_launched(be, "attention prompt");
}
