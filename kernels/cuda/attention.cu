/* Paged causal attention as split-K partials plus a merge (flash-decoding):
 * the twin of kernels/cpu/attention.c.
 *
 * A row's context (positions [0, pos]) is cut into attn_splits_of(pos + 1,
 * cap, fill) segments of whole pages of 16 (attention_mma.cuh). The cap
 * comes from the round's row count and the shape (enough blocks to fill
 * the GPU about four times, within the per-row scratch; eight measured
 * slower at batch 32 and 64, kernels/lab/README.md; once for the TMA
 * kernel, whose blocks run on from item to item), and so does fill
 * (segments a row of a small round should have for one full wave; the
 * cap is raised to that wave and never past it, attn_splits_filled), never
 * from a slice or the page table's capacity, so a sliced round equals an
 * unsliced one to the byte. The grid has `cap` segments per row, and
 * blocks past a row's count return at once (the TMA kernel's items are
 * those blocks): the launch is the same for every round of the
 * same rows, as a CUDA graph needs, and a large round of short contexts
 * launches few empty blocks.
 *
 * Three partial kernels write the same records (max, sum, sum p v) per
 * (row, query head, segment):
 *   - at head dim 128 with bf16 pages on sm_90a, the TMA kernel
 *     (attn_partial_tma, below): persistent blocks over those items, K
 *     and V staged by a copying warp in 32-token stages;
 *   - with bf16 activations and head dims 32, 64 and 128, one block per
 *     (row, KV head, group of up to 16 query heads, segment) puts the
 *     group's query heads in the 16 rows of mma.sync tiles and reads each
 *     64-token K and V tile once through the page table, double-buffered
 *     by cp.async, four warps on 16 tokens each, merged in the block;
 *   - otherwise (f32 activations, the exact mode, and other head dims) the
 *     SIMT kernel of the first version, one block per (row, KV head, chunk
 *     of up to ATTN_GQ query heads, segment).
 * The merge kernel, one block per (row, query head), rescales and adds the
 * segments in order and writes the output row. Where a round has one
 * segment a row (a round that fills the GPU alone, as batch 64 at 1k) the
 * TMA kernel writes the output rows itself and no merge runs.
 *
 * The scratch has rows for KERNELS_ATTN_SLICE_ROWS rows; kernels_attention_
 * slices() cuts longer rounds, and each slice is one partial + merge pair.
 * Each block sums in a fixed order: results are deterministic.
 *
 * Where every row of a round is its stream's only one, the TMA partials
 * start early (programmatic dependent launch, cuda_ops.h): they copy the
 * KV before each row's own position while rope with the KV write and the
 * q/k/v GEMV before it finish, and the merge starts at theirs and waits
 * for their records (SHOAL_CUDA_ATTN_EARLY; kernels/lab rows 20.1, 20.5). */
#include "attention_mma.cuh"
#include "rope.cuh"
#include "wgmma.cuh"

#include <cuda.h>

#include "common/common_limits.h"

#include <type_traits>

enum {
    ATTN_GQ = 8,       /* query heads of one KV head per partial block */
    ATTN_TILE = 32,    /* context tokens per shared-memory tile */
    ATTN_THREADS = 128,
    MERGE_THREADS = 128,
};

static __device__ __forceinline__ float kv_load(const bf16 *p)
{
    return __bfloat162float(*p);
}

static __device__ __forceinline__ float kv_load(const __nv_fp8_storage_t *p)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(*p, __NV_E4M3)));
}

/* Shared memory of a partial block, in floats. */
static size_t partial_smem_floats(int head_dim)
{
    return (size_t)ATTN_GQ * head_dim * 2            /* q, acc */
           + (size_t)ATTN_TILE * (head_dim + 1)      /* K or V tile, padded */
           + (size_t)ATTN_GQ * ATTN_TILE             /* scores, then p */
           + (size_t)ATTN_GQ * 3;                    /* m, l, correction */
}

struct attn_args {
    const unsigned char *arena;
    kernels_kv_layout L;
    int layer;
    int heads;
    int splits; /* the round's cap on segments a row, and the scratch's stride */
    int fill;   /* segments a row of the round should have (attention_mma.cuh) */
    float scale;
    int page_table_stride;
    float *scratch; /* [slice rows][heads][splits][head_dim + 2] */
};

template <typename T, typename KV>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_partial(attn_args a, const T *q, const int32_t *row_stream, const int32_t *positions,
                 const int32_t *page_table)
{
    extern __shared__ float sm[];
    const kernels_kv_layout &L = a.L;
    const int hd = L.head_dim, pt = L.page_tokens, hdp = hd + 1;
    const int group = a.heads / L.kv_heads;
    const int chunks = (group + ATTN_GQ - 1) / ATTN_GQ;
    const int r = blockIdx.x, kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * ATTN_GQ;
    const int gn = group - g0 < ATTN_GQ ? group - g0 : ATTN_GQ;
    const int split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    float *qs = sm;                        /* [ATTN_GQ][hd] */
    float *acc = qs + ATTN_GQ * hd;        /* [ATTN_GQ][hd] */
    float *tile = acc + ATTN_GQ * hd;      /* [ATTN_TILE][hd + 1] */
    float *sc = tile + ATTN_TILE * hdp;    /* [ATTN_GQ][ATTN_TILE] */
    float *m = sc + ATTN_GQ * ATTN_TILE;   /* [ATTN_GQ] */
    float *l = m + ATTN_GQ;
    float *corr = l + ATTN_GQ;

    const int ctx = positions[r] + 1;
    const int splits = attn_splits_of(ctx, a.splits, a.fill);
    if (split >= splits)
        return; /* the merge reads this row's first `splits` records alone */
    const int32_t *pages = page_table + (size_t)row_stream[r] * (size_t)a.page_table_stride;
    const int seg = attn_seg_tokens(ctx, a.splits, a.fill);
    const int t_begin = split * seg;
    const int t_end = min(ctx, (split + 1) * seg);

    const int scale_at = a.layer * L.kv_heads + kvh;
    const bool fp8 = sizeof(KV) == 1;
    const float k_scale = fp8 && L.k_scale ? L.k_scale[scale_at] : 1.0f;
    const float v_scale = fp8 && L.v_scale ? L.v_scale[scale_at] : 1.0f;
    const size_t k_off = (((size_t)a.layer * 2 + 0) * L.kv_heads + kvh) * (size_t)pt * hd;
    const size_t v_off = (((size_t)a.layer * 2 + 1) * L.kv_heads + kvh) * (size_t)pt * hd;

    const int h0 = kvh * group + g0;
    for (int e = tid; e < gn * hd; e += blockDim.x) {
        int g = e / hd, d = e % hd;
        qs[e] = to_f32(q[(size_t)r * a.heads * hd + (size_t)(h0 + g) * hd + d]);
        acc[e] = 0.0f;
    }
    if (tid < gn) {
        m[tid] = -INFINITY;
        l[tid] = 0.0f;
    }
    __syncthreads();

    for (int t0 = t_begin; t0 < t_end; t0 += ATTN_TILE) {
        const int n = min(ATTN_TILE, t_end - t0);
        /* K tile; a tile never crosses a segment, and pages come from the
         * table one token at a time, so any page size works */
        for (int e = tid; e < n * hd; e += blockDim.x) {
            int t = e / hd, d = e % hd, pos = t0 + t;
            const KV *page = (const KV *)(a.arena + (size_t)pages[pos / pt] * L.page_bytes);
            tile[t * hdp + d] = kv_load(page + k_off + (size_t)(pos % pt) * hd + d);
        }
        __syncthreads();
        for (int e = tid; e < gn * n; e += blockDim.x) {
            int g = e / n, t = e % n;
            float s = 0.0f;
            for (int d = 0; d < hd; d++)
                s += qs[g * hd + d] * tile[t * hdp + d];
            sc[g * ATTN_TILE + t] = s * k_scale * a.scale;
        }
        __syncthreads();
        /* online softmax, one warp per query head */
        for (int g = warp; g < gn; g += ATTN_THREADS / 32) {
            float s = lane < n ? sc[g * ATTN_TILE + lane] : -INFINITY;
            float mx = fmaxf(m[g], warp_reduce(s, op_max()));
            float p = lane < n ? expf(s - mx) : 0.0f;
            if (lane < n)
                sc[g * ATTN_TILE + lane] = p;
            float sum = warp_reduce(p, op_add());
            if (lane == 0) {
                float c = expf(m[g] - mx); /* 0 on the first tile (m = -inf) */
                corr[g] = c;
                l[g] = l[g] * c + sum;
                m[g] = mx;
            }
        }
        __syncthreads();
        /* V tile over the K tile, which the scores no longer need */
        for (int e = tid; e < n * hd; e += blockDim.x) {
            int t = e / hd, d = e % hd, pos = t0 + t;
            const KV *page = (const KV *)(a.arena + (size_t)pages[pos / pt] * L.page_bytes);
            tile[t * hdp + d] = kv_load(page + v_off + (size_t)(pos % pt) * hd + d);
        }
        __syncthreads();
        for (int e = tid; e < gn * hd; e += blockDim.x) {
            int g = e / hd, d = e % hd;
            float v = acc[e] * corr[g];
            for (int t = 0; t < n; t++)
                v += sc[g * ATTN_TILE + t] * tile[t * hdp + d];
            acc[e] = v;
        }
        __syncthreads();
    }

    /* an empty segment leaves m = -inf, l = 0: the merge gives it weight 0 */
    for (int e = tid; e < gn * (hd + 2); e += blockDim.x) {
        int g = e / (hd + 2), i = e % (hd + 2);
        float *rec = a.scratch + (((size_t)r * a.heads + (size_t)(h0 + g)) * a.splits + split) *
                                     (size_t)(hd + 2);
        rec[i] = i == 0 ? m[g] : i == 1 ? l[g] : acc[g * hd + i - 2] * v_scale;
    }
}

/* The merge, one block per (row, query head), segments in order. The
 * first version walks the segments three times per thread, each load
 * waiting on the last; WIDE (SHOAL_CUDA_ATTN_FILL >= 1) loads every
 * segment's (max, sum) at once into shared memory, computes each weight
 * once, and leaves the loop over the accumulators free to have many loads
 * in flight. Same expressions in the same order: the same bits.
 *
 * Launched with programmatic serialization (the TMA partials let it start
 * at theirs): the row's segment count, from the step's positions, before
 * the wait; after it, where a row has at most MERGE_HELD segments and a
 * thread one output, every load of the block at once, each thread holding
 * the maxima, sums and its accumulators in registers (one round trip of
 * the memory where the shared-memory walk takes three). */
enum { MERGE_HELD = 32 };

template <typename T, bool WIDE>
static __global__ void __launch_bounds__(MERGE_THREADS)
    attn_merge(const float *scratch, T *out, int heads, int head_dim, int splits_max, int fill,
               const int32_t *positions)
{
    const int r = blockIdx.x, h = blockIdx.y;
    const size_t rec_floats = (size_t)head_dim + 2;
    const float *rec = scratch + ((size_t)r * heads + h) * splits_max * rec_floats;
    const int splits = attn_splits_of(positions[r] + 1, splits_max, fill);
    T *o = out + ((size_t)r * heads + h) * head_dim;
    pdl_wait(); /* the records */
    /* a GEMV after may start fetching its weights: after the wait, so not
     * under the partials, which its loads would slow (kernels/lab row
     * 13.2); letting it start only once the records are read measured
     * slower (row 20.2) */
    pdl_trigger();
    if (WIDE && splits <= MERGE_HELD && head_dim <= (int)blockDim.x) {
        const int d = threadIdx.x;
        float ms[MERGE_HELD], ls[MERGE_HELD], acc[MERGE_HELD];
#pragma unroll
        for (int s = 0; s < MERGE_HELD; s++)
            if (s < splits) {
                ms[s] = rec[s * rec_floats];
                ls[s] = rec[s * rec_floats + 1];
                acc[s] = d < head_dim ? rec[s * rec_floats + 2 + d] : 0.0f;
            }
        float mx = -INFINITY;
#pragma unroll
        for (int s = 0; s < MERGE_HELD; s++)
            if (s < splits)
                mx = fmaxf(mx, ms[s]);
        float den = 0.0f, num = 0.0f;
#pragma unroll
        for (int s = 0; s < MERGE_HELD; s++)
            if (s < splits && ms[s] != -INFINITY) {
                const float w = expf(ms[s] - mx);
                den += ls[s] * w;
                num += acc[s] * w;
            }
        if (d < head_dim)
            o[d] = from_f32<T>(num / den);
        return;
    }
    if constexpr (WIDE) {
        __shared__ float ms[CUDA_ATTN_SPLITS_MAX], ls[CUDA_ATTN_SPLITS_MAX];
        __shared__ float ws[CUDA_ATTN_SPLITS_MAX];
        for (int s = threadIdx.x; s < splits; s += blockDim.x) {
            ms[s] = rec[s * rec_floats];
            ls[s] = rec[s * rec_floats + 1];
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int s = 0; s < splits; s++)
            mx = fmaxf(mx, ms[s]);
        for (int s = threadIdx.x; s < splits; s += blockDim.x)
            ws[s] = ms[s] != -INFINITY ? expf(ms[s] - mx) : 0.0f;
        __syncthreads();
        float den = 0.0f;
        for (int s = 0; s < splits; s++)
            if (ms[s] != -INFINITY)
                den += ls[s] * ws[s];
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float num = 0.0f;
#pragma unroll 8
            for (int s = 0; s < splits; s++)
                if (ms[s] != -INFINITY)
                    num += rec[s * rec_floats + 2 + d] * ws[s];
            o[d] = from_f32<T>(num / den);
        }
    } else {
        float mx = -INFINITY;
        for (int s = 0; s < splits; s++)
            mx = fmaxf(mx, rec[s * rec_floats]);
        float den = 0.0f;
        for (int s = 0; s < splits; s++) {
            float ms = rec[s * rec_floats];
            if (ms != -INFINITY)
                den += rec[s * rec_floats + 1] * expf(ms - mx);
        }
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float num = 0.0f;
            for (int s = 0; s < splits; s++) {
                float ms = rec[s * rec_floats];
                if (ms != -INFINITY)
                    num += rec[s * rec_floats + 2 + d] * expf(ms - mx);
            }
            o[d] = from_f32<T>(num / den);
        }
    }
}

/* Segments a row of a round of `rows` rows may have: enough for about
 * `per_sm` blocks a multiprocessor over the round (SHOAL_CUDA_ATTN_BLOCKS,
 * default 4; blocks_per_row is the
 * grid's other factor per row), within CUDA_ATTN_SPLITS_MAX and the
 * scratch. From the round and the shape, never from the slice: with fill
 * the scratch a row may use is the budget of KERNELS_ATTN_SLICE_ROWS rows
 * shared by the round's rows (up to that many), which the scratch always
 * has (alloc_attn_scratch), so a round of one row may take 64 segments of
 * a 32-head model where the first rule's 512 KiB held 31.
 *
 * With `resident` > 0 (the partial blocks a multiprocessor holds at once)
 * the count is then raised, up to three times, to the one whose blocks
 * fill their last wave best (fewest segments on a tie): at batch 64 of an
 * 8-KV-head model the rule's 2 segments make 1,024 blocks, 2.6 waves of
 * 396 on 132 multiprocessors holding three each, where 3 make 1,536, 3.9
 * waves (SHOAL_CUDA_ATTN_WAVE, default 1; 0 = the rule alone). */
static int attn_splits_cap(int sm_count, int per_sm, int rows, int blocks_per_row, int heads,
                           int head_dim, bool fill, int resident = 0)
{
    size_t per_split = (size_t)heads * ((size_t)head_dim + 2) * sizeof(float);
    size_t budget = CUDA_ATTN_ROW_SCRATCH_BYTES;
    if (fill)
        budget = budget * KERNELS_ATTN_SLICE_ROWS /
                 (size_t)(rows < KERNELS_ATTN_SLICE_ROWS ? rows : KERNELS_ATTN_SLICE_ROWS);
    long long fit = (long long)(budget / per_split);
    long long s = CUDA_ATTN_SPLITS_MAX < fit ? CUDA_ATTN_SPLITS_MAX : fit;
    long long per_round = (long long)rows * blocks_per_row;
    long long want = ((long long)per_sm * sm_count + per_round - 1) / per_round;
    if (want < s)
        s = want;
    if (s < 1)
        s = 1;
    if (resident > 0 && s == want) {
        long long wave = (long long)resident * sm_count, best = s;
        double best_fill = 0.0;
        for (long long t = want; t <= 3 * want && t <= fit && t <= CUDA_ATTN_SPLITS_MAX; t++) {
            long long blocks = per_round * t;
            double f = (double)blocks / (double)(((blocks + wave - 1) / wave) * wave);
            if (f > best_fill + 0.01) {
                best_fill = f;
                best = t;
            }
        }
        s = best;
    }
    return (int)s;
}

/* Segments a row of a small round may have and stay within a wave of two
 * partial blocks a multiprocessor: 0 where the round's rows alone pass it.
 * Two is what three K/V stages (100 KB of shared memory at head dim 128)
 * leave room for; with two stages (68 KB) three blocks fit, but a wave of
 * three (more, shorter segments) measured slower at batch 1 on the H200:
 * 4k 15.6 -> 19.7 us, 8k 21.2 -> 25.0 us (32k 56.5 -> 51.5 us). */
static int attn_splits_wave(int sm_count, int rows, int blocks_per_row)
{
    long long per_round = (long long)rows * blocks_per_row;
    return (int)(2LL * sm_count / per_round);
}

/* The round's cap (the grid's segments a row and the scratch's stride)
 * and fill (attention_mma.cuh) with short segments on: the first rule's
 * cap, raised to one wave where that is more, within the shared scratch
 * budget; and fill that wave. So segments are added only while the round
 * stays in one wave: a row of 4k takes 32 of 128 tokens (256 blocks at
 * batch 1, where the first rule gave 22, 176 blocks), a row of 8k or 32k
 * the one wave's 32 or 33 (the first rule: 31), not the 43 or 64 that the
 * shared budget alone allowed, which crossed into a second wave and
 * measured slower (lab, H200). A function of the round's rows and the
 * shape, never of a slice. */
static void attn_splits_filled(int sm_count, int per_sm, int resident, int rows,
                               int blocks_per_row, int heads, int head_dim, int *cap, int *fill)
{
    int rule = attn_splits_cap(sm_count, per_sm, rows, blocks_per_row, heads, head_dim, false,
                               resident);
    int most = attn_splits_cap(sm_count, per_sm, rows, blocks_per_row, heads, head_dim, true);
    int wave = attn_splits_wave(sm_count, rows, blocks_per_row);
    int f = wave < most ? wave : most;
    *cap = rule > f ? rule : f;
    *fill = f;
}

/* ---- the tensor-core partial kernel ---- */

/* STAGES: K and V tiles in shared memory, STAGES - 1 of them in flight
 * while one is used (SHOAL_CUDA_ATTN_STAGES, 2 by default: 68 KB a block
 * at head dim 128, three blocks a multiprocessor; 3 takes 100 KB, two
 * blocks). fp8 KV stages its tiles as stored (half the bytes, by
 * cp.async like bf16) and widens the one in use into a bf16 K and V tile
 * of its own. */
enum { TC_GM = 16, TC_BN = 64, TC_THREADS = 128 };

template <int HD, typename KV, int STAGES> static constexpr size_t tc_partial_smem_bytes()
{
    constexpr size_t tile = (size_t)TC_BN * HD * 2, staged = (size_t)TC_BN * HD * sizeof(KV);
    return (size_t)TC_GM * HD * 2 /* Q */ + 2 * STAGES * staged /* K, V */ +
           (sizeof(KV) == 1 ? 2 * tile : 0) /* fp8: K and V widened */;
}

/* Q's tile of a tensor-core partial block or item: the group's gn query
 * heads (rows, the first head's row of q) by cp.async into the 16 rows of
 * the tile at qs, zeros past gn; threads 0 .. TC_THREADS - 1 take a part
 * each (the caller commits and waits). */
template <int HD>
static __device__ __forceinline__ void stage_q(uint32_t qs, const bf16 *rows, int gn)
{
    constexpr int CH = HD / 8;
    for (int i = threadIdx.x; i < TC_GM * CH; i += TC_THREADS) {
        const int g = i / CH, c = i % CH;
        const bool valid = g < gn;
        mma::cp_async16(qs + mma::swz<HD>(g, c), rows + (valid ? (size_t)g * HD + c * 8 : 0),
                        valid);
    }
}

/* A warp's scores (C fragments of NT * 8 keys) set to -inf from its key
 * `valid` on: the keys past its segment. */
template <int NT>
static __device__ __forceinline__ void mask_past(float (&sc)[NT][4], int valid)
{
    if (valid >= NT * 8)
        return;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (nt * 8 + (lane & 3) * 2 + (e & 1) >= valid)
                sc[nt][e] = -INFINITY;
}

/* The end of a tensor-core partial block or item: the four computing
 * warps' states (each its own running max m, sum l and o over the keys it
 * took) merged through shared memory at red ([4 warps][red_rows][HD + 2]
 * floats, red_rows >= gn; rows past red_rows are not kept) into one record
 * (max, sum, sum p v) per query head: head g's at rec + g * g_stride.
 * sync() is the barrier of the computing threads (threads 0-127).
 *
 * With `direct` (a round of one segment a row: no merge), the heads'
 * output rows instead, head g's at direct + g * HD: sum p v / sum, the
 * merge's expression for one segment (its weight exp(0) = 1), so the same
 * bits as the record and the merge. */
template <int HD, typename Sync>
static __device__ __forceinline__ void partial_store(float *red, const float (&o)[HD / 8][4],
                                                     const float (&m)[2], float (&l)[2],
                                                     int red_rows, int gn, float v_scale,
                                                     float *rec, size_t g_stride, Sync sync,
                                                     bf16 *direct = nullptr)
{
    constexpr int DT = HD / 8, REC = HD + 2;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        const int row = (lane >> 2) + hr * 8;
        if (row >= red_rows)
            continue; /* a query head past the group: not kept */
        float *w = red + ((size_t)warp * red_rows + row) * REC;
        if ((lane & 3) == 0) {
            w[0] = m[hr];
            w[1] = l[hr];
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            w[2 + dt * 8 + (lane & 3) * 2] = o[dt][2 * hr];
            w[2 + dt * 8 + (lane & 3) * 2 + 1] = o[dt][2 * hr + 1];
        }
    }
    sync();
    if (direct) {
        for (int e = tid; e < gn * HD; e += TC_THREADS) {
            const int g = e / HD, i = 2 + e % HD;
            float mw[4], mx = -INFINITY;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                mw[w] = red[((size_t)w * red_rows + g) * REC];
                mx = fmaxf(mx, mw[w]);
            }
            float sum = 0.0f, v = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const float f = exp2f(mw[w] - mx);
                sum += red[((size_t)w * red_rows + g) * REC + 1] * f;
                v += red[((size_t)w * red_rows + g) * REC + i] * f;
            }
            direct[(size_t)g * HD + i - 2] = from_f32<bf16>(v * v_scale / sum);
        }
        return;
    }
    for (int e = tid; e < gn * REC; e += TC_THREADS) {
        int g = e / REC, i = e % REC;
        float mw[4], mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            mw[w] = red[((size_t)w * red_rows + g) * REC];
            mx = fmaxf(mx, mw[w]);
        }
        float v;
        if (mx == -INFINITY) { /* an empty segment: weight 0 in the merge */
            v = i == 0 ? -INFINITY : 0.0f;
        } else if (i == 0) {
            v = mx * 0.6931471805599453f; /* log2 units back to natural ones */
        } else {
            v = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; w++)
                v += red[((size_t)w * red_rows + g) * REC + i] * exp2f(mw[w] - mx);
            if (i > 1)
                v *= v_scale;
        }
        rec[(size_t)g * g_stride + i] = v;
    }
}

template <int HD, typename KV, int STAGES>
static __global__ void __launch_bounds__(TC_THREADS)
    attn_partial_tc(attn_args a, const bf16 *q, const int32_t *row_stream,
                    const int32_t *positions, const int32_t *page_table)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int DT = HD / 8, REC = HD + 2;
    const kernels_kv_layout &L = a.L;
    const int group = a.heads / L.kv_heads;
    const int chunks = (group + TC_GM - 1) / TC_GM;
    const int r = blockIdx.x, kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * TC_GM;
    const int gn = min(TC_GM, group - g0);
    const int split = blockIdx.z;
    const int ctx = positions[r] + 1;
    const int splits = attn_splits_of(ctx, a.splits, a.fill);
    if (split >= splits)
        return; /* the merge reads this row's first `splits` records alone */
    const int seg = attn_seg_tokens(ctx, a.splits, a.fill);
    const int tb = split * seg, te = min(ctx, tb + seg);
    const int warp = threadIdx.x >> 5;
    const int h0 = kvh * group + g0;
    const uint32_t qs = mma::smem_addr(smem);
    constexpr bool FP8 = sizeof(KV) == 1;
    constexpr uint32_t tile_bytes = TC_BN * HD * sizeof(KV); /* a staged tile */
    const uint32_t ks0 = qs + TC_GM * HD * 2, vs0 = ks0 + STAGES * tile_bytes;
    const uint32_t kw = vs0 + STAGES * tile_bytes, vw = kw + TC_BN * HD * 2; /* fp8: widened */

    /* the group's query heads are the rows of the tile; the rest are zeros */
    stage_q<HD>(qs, q + ((size_t)r * a.heads + (size_t)h0) * HD, gn);
    const int32_t *pages = page_table + (size_t)row_stream[r] * (size_t)a.page_table_stride;
    const int pt_shift = __ffs(L.page_tokens) - 1;
    const size_t head_elems = (size_t)L.page_tokens * HD;
    const size_t k_off = (((size_t)a.layer * 2 + 0) * L.kv_heads + kvh) * head_elems;
    const size_t v_off = (((size_t)a.layer * 2 + 1) * L.kv_heads + kvh) * head_elems;
    const int scale_at = a.layer * L.kv_heads + kvh;
    const float k_scale = FP8 && L.k_scale ? L.k_scale[scale_at] : 1.0f;
    const float v_scale = FP8 && L.v_scale ? L.v_scale[scale_at] : 1.0f;
    const float sl2 = a.scale * 1.4426950408889634f * k_scale;
    typedef typename std::conditional<FP8, mma::kv_tile_fp8_staged<HD, TC_BN, TC_THREADS>,
                                      mma::kv_tile<HD, TC_BN, TC_THREADS, bf16>>::type tile_io;

    /* STAGES stages: tiles j + 1 .. j + STAGES - 1 are in flight while j
     * is used; one commit group a tile (empty past the last; Q rides with
     * the first), so waiting for all but the last STAGES - 1 groups means
     * tile j has landed */
    constexpr int AHEAD = STAGES - 1;
    const int ntiles = (te - tb + TC_BN - 1) / TC_BN;
#pragma unroll
    for (int p = 0; p < AHEAD; p++) {
        if (p < ntiles) {
            tile_io::load(ks0 + p * tile_bytes, a.arena, L.page_bytes, pages, pt_shift, k_off,
                          tb + p * TC_BN, te);
            tile_io::load(vs0 + p * tile_bytes, a.arena, L.page_bytes, pages, pt_shift, v_off,
                          tb + p * TC_BN, te);
        }
        mma::cp_async_commit();
    }

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    uint32_t qf[HD / 16][4];
    for (int j = 0; j < ntiles; j++) {
        uint32_t kb = ks0 + (j % STAGES) * tile_bytes;
        uint32_t vb = vs0 + (j % STAGES) * tile_bytes;
        if (j + AHEAD < ntiles) { /* into the stage that tile j - 1 used */
            const uint32_t nb = ((j + AHEAD) % STAGES) * tile_bytes;
            tile_io::load(ks0 + nb, a.arena, L.page_bytes, pages, pt_shift, k_off,
                          tb + (j + AHEAD) * TC_BN, te);
            tile_io::load(vs0 + nb, a.arena, L.page_bytes, pages, pt_shift, v_off,
                          tb + (j + AHEAD) * TC_BN, te);
        }
        mma::cp_async_commit();
        mma::cp_async_wait<AHEAD>();
        __syncthreads();
        if constexpr (FP8) { /* widen tile j; the last tile's mma is done */
            tile_io::widen(kw, kb);
            tile_io::widen(vw, vb);
            kb = kw;
            vb = vw;
            __syncthreads();
        }
        if (j == 0)
            mma::q_fragments<HD>(qf, qs, 0);
        /* each warp takes 16 tokens of the tile */
        float sc[2][4];
        mma::scores<HD, 2>(sc, qf, kb, warp * 16);
        mask_past<2>(sc, te - (tb + j * TC_BN + warp * 16));
        mma::softmax_step<HD, 2>(sc, sl2, o, m, l);
        mma::accumulate<HD, 2>(o, sc, vb, warp * 16);
        __syncthreads(); /* the stage is refilled STAGES tiles on */
    }
    mma::cp_async_wait<0>();

    /* the four warps' states, merged through shared memory (the tiles are
     * done with) into one record per query head */
    partial_store<HD>((float *)(smem + TC_GM * HD * 2), o, m, l, TC_GM, gn, v_scale,
                      a.scratch + (((size_t)r * a.heads + (size_t)h0) * a.splits + split) * REC,
                      (size_t)a.splits * REC, [] { __syncthreads(); });
}

template <int STAGES, typename F> static bool partial_tc_dispatch_stages(int hd, bool fp8, F f)
{
    switch (hd) {
#define TC_CASE(HD)                                                                              \
    case HD:                                                                                     \
        fp8 ? f(attn_partial_tc<HD, __nv_fp8_storage_t, STAGES>,                                 \
                tc_partial_smem_bytes<HD, __nv_fp8_storage_t, STAGES>())                         \
            : f(attn_partial_tc<HD, bf16, STAGES>, tc_partial_smem_bytes<HD, bf16, STAGES>());   \
        return true;
        TC_CASE(32)
        TC_CASE(64)
        TC_CASE(128)
        TC_CASE(256)
#undef TC_CASE
    default: return false;
    }
}

template <typename F> static bool partial_tc_dispatch(int hd, shoal_dtype kv, int stages, F f)
{
    bool fp8 = kv == SHOAL_DTYPE_F8_E4M3;
    return stages == 2 ? partial_tc_dispatch_stages<2>(hd, fp8, f)
                       : partial_tc_dispatch_stages<3>(hd, fp8, f);
}

/* ---- the partial kernel fed by the tensor memory accelerator ---- */

/* The tensor-core partials with K and V staged by TMA (sm_90a; head dim
 * 128, bf16 pages of 8 tokens or more; TMA_STAGES stages, two blocks a
 * multiprocessor). The cp.async kernel keeps one 64-token tile in flight
 * a block while it reads the other, and ramps up anew in every block.
 * Here the shared memory holds S = TMA_STAGES stages of 32 tokens (16 KB
 * of K and V), S - 1 of them in flight, and a block is persistent: it
 * takes the launch's
 * items (row, KV head, query-head group, segment) i = blockIdx.x, +
 * gridDim.x, ... (items past a row's segments are skipped), and its stages
 * run on from one item into the next, so the copies do not drain between
 * items.
 *
 * A fifth warp only copies: a box of 16 rows (a page's part, or a page of
 * 8) a copy, whole 256-byte rows through a 3-D map or, with
 * SHOAL_CUDA_ATTN_TMA_ROWS=0, one 64-column half (2-D), counted on the
 * stage's `full` barrier once its `empty` one says the two warps that read
 * it are done. The four computing warps take the stages in pairs, even
 * stages warps 0 and 1, odd ones 2 and 3, 16 tokens a warp, each with its
 * own running max, sum and o, merged at each item's end (partial_store,
 * through its own area, which Q's copy shares); no block-wide barrier a
 * stage. An item of an odd count of stages is given an empty one
 * (completed by the copying warp without bytes), so every item starts on
 * an even stage: which warp sums which keys, and so the result to the bit,
 * is the item's own, whatever the block ran before it (a sliced launch
 * equals an unsliced one). S is even, so a stage slot is always read by
 * the same pair, and a pair waits on a slot's phases in order. Rows past
 * the segment are not copied where a whole box is past it, and are taken
 * as zeros (V) or -inf (scores) in registers: a stage may hold a stale
 * tail. The copies ask L2 for 128-byte promotion (SHOAL_CUDA_ATTN_TMA_L2):
 * at 256 the L2 ran at 96% of its throughput while the DRAM gave 88%.
 * Against the cp.async kernel on the H200 (kernels/lab/README.md rows
 * 17.1-17.7): batch 64 at 1k 2.82 -> 3.25 TB/s, batch 1 at 32k 2.45 ->
 * 2.89, batch 32 and 64 at 4k-32k 3.62-4.13 -> 3.87-4.42 (torch SDPA on
 * contiguous KV in the same call: 3.56-4.40); the 8B model's batch-64
 * step 7,709 -> 8,156-8,262 tokens/s. */
enum { TMA_BN = 32, TMA_THREADS = 160, TMA_HD = 128, TMA_BOX_MAX = 16, TMA_STAGES = 6 };

struct attn_tma_args {
    attn_args a;
    int rows;           /* the slice's */
    bf16 *out;          /* the slice's output where the round has one segment a row, or null */
    /* 1: launched with programmatic serialization (SHOAL_CUDA_ATTN_EARLY,
     * one row a stream): the copying warp waits for the kernels before
     * (pdl_wait) only at the first stage that holds its row's own
     * position, which rope with the KV write stores this round, so the
     * stages before are copied while those kernels run; the computing
     * warps wait before they read Q */
    int early;
    /* 1 (attention_rope_kv, SHOAL_CUDA_ATTN_ROPE; with early): the kernel
     * takes the round's q, k and v rows as the q/k/v GEMV wrote them, side
     * by side `qkv_stride` elements a row (the q parameter), and does what
     * rope with the KV write would: the computing warps norm and rotate
     * the group's q heads into the Q tile, and the copying warp of each
     * (row, KV head)'s last segment norms and rotates k and stores k and
     * v into the page (arena_w) before it copies that stage */
    int rope;
    int qkv_stride;
    const float *q_norm, *k_norm, *inv_freq;
    float eps;
    unsigned char *arena_w;
    /* the stages the copying warp keeps ahead of the computing warps at
     * most (SHOAL_CUDA_ATTN_DEPTH; S or more: all S): before it copies
     * stage g it also waits until stage g - ahead has been read. Fewer
     * bytes queued at the memory, where every block runs item after item:
     * batch 32 at 4k and 64 at 4k 2% faster with 4 of 6 (kernels/lab row
     * 26.5); a row of one segment of at most 4 stages is as before */
    int ahead;
    CUtensorMap kv_map; /* cuda_kv_map, boxes of min(page, 16) rows */
};

struct sw128_rows32 {
    static __device__ __forceinline__ uint32_t at(int row, int c)
    {
        return wg::sw128_at<TMA_BN>(row, c);
    }
};

/* A tile of whole 256-byte rows as the 3-D map lands them: each 128-byte
 * half swizzled as the 128-byte row it is (row * 2 + half of the tile). */
struct sw128_rows256 {
    static __device__ __forceinline__ uint32_t at(int row, int c)
    {
        const int h = c >> 3;
        return (uint32_t)(row * 256 + h * 128 + (((c & 7) ^ ((row * 2 + h) & 7)) << 4));
    }
};

/* Shared memory of a block: the stages, 1,024-byte aligned, then Q's
 * tile or partial_store's rows of the group's gn query heads. */
static size_t tma_partial_smem_bytes(int gn)
{
    size_t q = (size_t)TC_GM * TMA_HD * 2, red = (size_t)4 * gn * (TMA_HD + 2) * sizeof(float);
    return 1024 + 2 * TMA_STAGES * (size_t)TMA_BN * TMA_HD * 2 + (q > red ? q : red);
}

/* An item of the launch: the segment of one (row, KV head, group) block
 * of the cp.async kernel's grid. */
struct tma_item {
    int r, kvh, h0, gn, split, tb, te, ntiles;
};

#ifdef SHOAL_WGMMA
static __device__ __forceinline__ bool tma_item_of(int i, const attn_args &a, int chunks,
                                                   const int32_t *positions, tma_item &it)
{
    const int ky = a.L.kv_heads * chunks, group = a.heads / a.L.kv_heads;
    it.split = i % a.splits;
    const int y = (i / a.splits) % ky;
    it.r = i / (a.splits * ky);
    it.kvh = y / chunks;
    const int g0 = (y % chunks) * TC_GM;
    it.gn = min(TC_GM, group - g0);
    it.h0 = it.kvh * group + g0;
    const int ctx = positions[it.r] + 1;
    if (it.split >= attn_splits_of(ctx, a.splits, a.fill))
        return false; /* the merge reads this row's first `splits` records alone */
    const int seg = attn_seg_tokens(ctx, a.splits, a.fill);
    it.tb = it.split * seg;
    it.te = min(ctx, it.tb + seg);
    it.ntiles = (it.te - it.tb + TMA_BN - 1) / TMA_BN;
    return true;
}
#endif

#ifdef SHOAL_WGMMA
/* attention_rope_kv's new row, by the copying warp of the last segment of
 * (row, KV head kvh) before it copies that stage: k normed and rotated,
 * and v, stored into the row's page slot as rope with the KV write stores
 * them (norm_rope_head, the same bits), then ordered before the tensor
 * memory accelerator's reads (a proxy fence). row: the row's q/k/v. */
static __device__ __forceinline__ void tma_store_new_row(const attn_tma_args &ta, const bf16 *row,
                                                         int kvh, int pos, const int32_t *pages,
                                                         int lane)
{
    const kernels_kv_layout &L = ta.a.L;
    const int hd = TMA_HD, slot = pos & (L.page_tokens - 1);
    bf16 *page = (bf16 *)(ta.arena_w +
                          (size_t)pages[pos / L.page_tokens] * (size_t)L.page_bytes);
    const bf16 *k = row + (size_t)ta.a.heads * hd + (size_t)kvh * hd;
    const bf16 *v = k + (size_t)L.kv_heads * hd;
    const float fpos = (float)pos, *inv = ta.inv_freq;
    norm_rope_head(
        k, page + kv_head_at(L, ta.a.layer, 0, kvh, slot), hd, lane, ta.k_norm, ta.eps,
        [fpos, inv](int, int i, float *c, float *s) { rope_angle(fpos, inv, i, c, s); },
        [](int, bf16) {});
    bf16 *vd = page + kv_head_at(L, ta.a.layer, 1, kvh, slot);
    for (int d = lane; d < hd; d += 32)
        kv_store(vd + d, to_f32(v[d]), 1.0f);
    /* each lane's stores ordered before the async proxy's reads (as a TMA
     * store's writers fence before their barrier), the warp met, and each
     * copying lane fenced again before its copy */
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    __syncwarp();
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* attention_rope_kv's Q tile: the group's gn q heads at row (the first
 * head's q, as the GEMV wrote it) normed and rotated (norm_rope_head, the
 * bits rope with the KV write stores) into the tile at qtile as stage_q
 * lays it out, one computing warp a head, rows past gn zeros. */
static __device__ __forceinline__ void tma_rope_q(const attn_tma_args &ta, const bf16 *row, int pos,
                                                  int gn, unsigned char *qtile)
{
    constexpr int HD = TMA_HD, CH = HD / 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < (TC_GM - gn) * CH; i += TC_THREADS)
        *(uint4 *)(qtile + mma::swz<HD>(gn + i / CH, i % CH)) = make_uint4(0, 0, 0, 0);
    const float fpos = (float)pos, *inv = ta.inv_freq;
    for (int g = warp; g < gn; g += TC_THREADS / 32)
        norm_rope_head(
            row + (size_t)g * HD, (bf16 *)nullptr, HD, lane, ta.q_norm, ta.eps,
            [fpos, inv](int, int i, float *c, float *s) { rope_angle(fpos, inv, i, c, s); },
            [qtile, g](int e, bf16 x) {
                *(bf16 *)(qtile + mma::swz<HD>(g, e / 8) + (e % 8) * 2) = x;
            });
}
#endif

template <bool ROWS>
static __global__ void __launch_bounds__(TMA_THREADS, 2)
    attn_partial_tma(const __grid_constant__ attn_tma_args ta, const bf16 *q,
                     const int32_t *row_stream, const int32_t *positions,
                     const int32_t *page_table)
{
#ifdef SHOAL_WGMMA
    constexpr int HD = TMA_HD, REC = HD + 2, DT = HD / 8, S = TMA_STAGES;
    constexpr uint32_t HALF = TMA_BN * 128, TILE = 2 * HALF; /* a K or V stage */
    static_assert(S % 2 == 0, "a stage slot is read by one pair of warps");
    typedef typename std::conditional<ROWS, sw128_rows256, sw128_rows32>::type Lay;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) uint64_t bars[2 * S]; /* full[S], empty[S] */
    if (!ta.out)
        pdl_trigger(); /* the merge may start; it waits for the records */
    const attn_args &a = ta.a;
    const kernels_kv_layout &L = a.L;
    const int chunks = (a.heads / L.kv_heads + TC_GM - 1) / TC_GM;
    const int total = ta.rows * L.kv_heads * chunks * a.splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t base = (mma::smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t ks0 = base, vs0 = base + S * TILE, qs = vs0 + S * TILE;
    float *red = (float *)(smem + (qs - mma::smem_addr(smem))); /* shares Q's area */
    const uint32_t full0 = mma::smem_addr(&bars[0]), empty0 = full0 + 8 * S;

    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) {
            wg::bar_init(full0 + 8 * i, 1);
            wg::bar_init(empty0 + 8 * i, 2); /* a warp of the pair each */
        }
        wg::bar_init_fence();
    }
    __syncthreads();

    uint32_t g = 0; /* stages the block has taken so far: a stage's slot and parity */
    tma_item it;
    if (warp == 4) {
        /* the copying warp: lane c copies box c / 4, half (c / 2) % 2, K or
         * V c % 2; with whole rows box c / 2, both halves */
        constexpr int PER_BOX = ROWS ? 2 : 4;
        const int R = L.page_tokens, pt_shift = __ffs(R) - 1;
        const int BR = min(R, TMA_BOX_MAX), page_rows = (int)(L.page_bytes / 256);
        const int c = lane, box = c / PER_BOX, half = ROWS ? 0 : (c >> 1) & 1;
        bool waited = !ta.early;
        for (int i = blockIdx.x; i < total; i += gridDim.x) {
            if (!tma_item_of(i, a, chunks, positions, it))
                continue;
            const int32_t *pages =
                page_table + (size_t)row_stream[it.r] * (size_t)a.page_table_stride;
            const int kvrow = ((a.layer * 2 + (c & 1)) * L.kv_heads + it.kvh) * R;
            for (int j = 0; j < it.ntiles; j++, g++) {
                const uint32_t st = g % S;
                const int t0 = it.tb + j * TMA_BN, t = t0 + box * BR;
                const int boxes = min(TMA_BN / BR, (it.te - t0 + BR - 1) / BR);
                const bool go = c < boxes * PER_BOX;
                const int row = go ? pages[t >> pt_shift] * page_rows + kvrow + (t & (R - 1)) : 0;
                if (!waited && t0 + TMA_BN > positions[it.r]) { /* the row's own position */
                    pdl_wait();
                    waited = true;
                }
                /* the stage of the row's own position, in its last segment */
                if (ta.rope && it.te == positions[it.r] + 1 && t0 + TMA_BN > positions[it.r])
                    tma_store_new_row(ta, q + (size_t)it.r * ta.qkv_stride, it.kvh,
                                      positions[it.r], pages, lane);
                wg::bar_wait(empty0 + 8 * st, ((g / S) & 1) ^ 1);
                if (ta.ahead < S && g >= (uint32_t)ta.ahead) {
                    /* stage h's slot is between its copy and its reuse by
                     * stage h + S (not copied yet): the phase is unambiguous */
                    const uint32_t h = g - (uint32_t)ta.ahead;
                    wg::bar_wait(empty0 + 8 * (h % S), (h / S) & 1);
                }
                if (lane == 0)
                    wg::bar_arrive_expect(full0 + 8 * st, (uint32_t)(boxes * 2 * BR * 256));
                __syncwarp();
                const uint32_t dst = (c & 1 ? vs0 : ks0) + st * TILE;
                if (go && ROWS)
                    wg::tma_load_3d(dst + box * BR * 256, &ta.kv_map, 0, 0, row, full0 + 8 * st);
                else if (go)
                    wg::tma_load_2d(dst + half * HALF + box * BR * 128, &ta.kv_map, half * 64,
                                    row, full0 + 8 * st);
            }
            if (it.ntiles & 1) { /* an empty stage: the next item starts on an even one */
                const uint32_t st = g % S;
                wg::bar_wait(empty0 + 8 * st, ((g / S) & 1) ^ 1);
                if (lane == 0)
                    wg::bar_arrive(full0 + 8 * st);
                g++;
            }
        }
        return;
    }

    const float sl2 = a.scale * 1.4426950408889634f;
    const int pair = warp >> 1, key0 = (warp & 1) * 16; /* the warp's rows of a stage */
    if (ta.early)
        pdl_wait(); /* Q, and the scratch and output the kernels before may still read */
    for (int i = blockIdx.x; i < total; i += gridDim.x) {
        if (!tma_item_of(i, a, chunks, positions, it))
            continue;
        /* the group's query heads are the rows of the tile, the rest zeros;
         * the area held the last item's partial_store rows */
        wg::named_sync(1, TC_THREADS);
        if (ta.rope) {
            tma_rope_q(ta, q + (size_t)it.r * ta.qkv_stride + (size_t)it.h0 * HD,
                       positions[it.r], it.gn, smem + (qs - mma::smem_addr(smem)));
        } else {
            stage_q<HD>(qs, q + ((size_t)it.r * a.heads + (size_t)it.h0) * HD, it.gn);
            mma::cp_async_commit();
            mma::cp_async_wait<0>();
        }
        wg::named_sync(1, TC_THREADS);

        float o[DT][4];
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        const int staged = (it.ntiles + 1) & ~1; /* with the producer's empty stage */
        for (int j = pair; j < staged; j += 2) {
            const uint32_t st = (g + j) % S;
            const int valid = it.te - (it.tb + j * TMA_BN + key0); /* the warp's keys in it */
            wg::bar_wait(full0 + 8 * st, ((g + j) / S) & 1);
            if (valid > 0) {
                /* Q's fragments from shared memory at each stage: held
                 * across the loop they cost spills at three blocks a
                 * multiprocessor (128 registers) */
                uint32_t qf[HD / 16][4];
                mma::q_fragments<HD>(qf, qs, 0);
                float sc[2][4];
                mma::scores<HD, 2, Lay>(sc, qf, ks0 + st * TILE, key0);
                mask_past<2>(sc, valid);
                mma::softmax_step<HD, 2>(sc, sl2, o, m, l);
                mma::accumulate<HD, 2, Lay>(o, sc, vs0 + st * TILE, key0, valid);
            }
            __syncwarp();
            if (lane == 0)
                wg::bar_arrive(empty0 + 8 * st); /* the warp's reads of the stage are done */
        }
        g += staged;
        /* every warp is past its last read of Q: the area takes the rows */
        wg::named_sync(1, TC_THREADS);
        partial_store<HD>(red, o, m, l, it.gn, it.gn, 1.0f,
                          a.scratch +
                              (((size_t)it.r * a.heads + (size_t)it.h0) * a.splits + it.split) *
                                  REC,
                          (size_t)a.splits * REC, [] { wg::named_sync(1, TC_THREADS); },
                          ta.out ? ta.out + ((size_t)it.r * a.heads + (size_t)it.h0) * HD
                                 : nullptr);
    }
#endif
}

template <typename F> static void partial_tma_dispatch(bool rows, F f)
{
    if (rows)
        f(attn_partial_tma<true>, tma_partial_smem_bytes);
    else
        f(attn_partial_tma<false>, tma_partial_smem_bytes);
}

/* ---- launching ---- */

struct slice_ctx {
    kernels_backend *be;
    attn_args args;
    int chunks;
    size_t smem;
    bool tc;         /* the tensor-core partial kernel */
    bool tma;        /* ... fed by TMA (attn_partial_tma; tma_args.kv_map is set) */
    bool wide_merge; /* attn_merge<T, true> */
    attn_tma_args tma_args;
    size_t tma_smem;  /* attn_partial_tma's shared memory at this group */
    int tma_resident; /* its blocks a multiprocessor holds */
};

template <typename T, typename KV> static void launch_slice(void *p, const kernels_attn_slice *s)
{
    slice_ctx *c = (slice_ctx *)p;
    cudaStream_t stream = cuda_of(c->be)->stream;
    dim3 grid((unsigned)s->rows, (unsigned)(c->args.L.kv_heads * c->chunks),
              (unsigned)c->args.splits);
    if (c->tma) { /* persistent: as many blocks as the items, up to what stays resident */
        c->tma_args.a = c->args;
        c->tma_args.rows = s->rows;
        /* one segment a row: the partials are the output, no merge */
        c->tma_args.out = c->args.splits == 1 ? (bf16 *)s->out : nullptr;
        long long items = (long long)grid.x * grid.y * grid.z;
        long long most = (long long)c->tma_resident * cuda_of(c->be)->sm_count;
        unsigned blocks = (unsigned)(items < most ? items : most);
        cuda_state *st = cuda_of(c->be);
        partial_tma_dispatch(st->attn_tma_rows,
                             [&](auto kernel, auto) {
            if (c->tma_args.early)
                cuda_launch_pdl_smem(stream, blocks, TMA_THREADS, c->tma_smem, kernel,
                                     c->tma_args, (const bf16 *)s->q, s->row_stream,
                                     s->positions, s->page_table);
            else
                kernel<<<blocks, TMA_THREADS, c->tma_smem, stream>>>(
                    c->tma_args, (const bf16 *)s->q, s->row_stream, s->positions,
                    s->page_table);
        });
    } else if (c->tc) {
        if constexpr (sizeof(T) == 2)
            partial_tc_dispatch(c->args.L.head_dim, c->args.L.dtype, cuda_of(c->be)->attn_stages,
                                [&](auto kernel, size_t bytes) {
                kernel<<<grid, TC_THREADS, bytes, stream>>>(c->args, (const bf16 *)s->q,
                                                            s->row_stream, s->positions,
                                                            s->page_table);
            });
    } else {
        attn_partial<T, KV><<<grid, ATTN_THREADS, c->smem, stream>>>(
            c->args, (const T *)s->q, s->row_stream, s->positions, s->page_table);
    }
    if (!cuda_launched(c->be, "attention partial") || (c->tma && c->tma_args.out))
        return;
    dim3 mgrid((unsigned)s->rows, (unsigned)c->args.heads);
    cuda_launch_pdl(stream, mgrid, MERGE_THREADS,
                    c->wide_merge ? attn_merge<T, true> : attn_merge<T, false>, c->args.scratch,
                    (T *)s->out, c->args.heads, c->args.L.head_dim, c->args.splits,
                    c->args.fill, s->positions);
    cuda_launched(c->be, "attention merge");
}

/* Every partial instance may take the shared memory of the largest head. */
shoal_err cuda_attention_init(kernels_backend *be)
{
    int bytes = (int)(partial_smem_floats(SHOAL_MODEL_HEAD_DIM_MAX) * sizeof(float));
    cudaError_t e = cudaSuccess;
    const void *fns[] = {
        (const void *)attn_partial<float, bf16>,
        (const void *)attn_partial<float, __nv_fp8_storage_t>,
        (const void *)attn_partial<bf16, bf16>,
        (const void *)attn_partial<bf16, __nv_fp8_storage_t>,
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0] && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    for (int hd : {32, 64, 128, 256})
        for (shoal_dtype kv : {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3})
            for (int stages : {2, 3})
                partial_tc_dispatch(hd, kv, stages, [&](auto kernel, size_t tc_bytes) {
                    if (e == cudaSuccess)
                        e = cudaFuncSetAttribute(
                            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_bytes);
                });
    for (bool rows : {false, true})
        partial_tma_dispatch(rows, [&](auto kernel, auto smem_of) {
            if (e == cudaSuccess)
                e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem_of(TC_GM));
        });
    if (e != cudaSuccess)
        cuda_fail(be, "attention: raise the shared-memory limit", e);
    return cuda_of(be)->err;
}

/* attention_rope_kv's rows for the fused TMA partials (attn_tma_args) */
struct rope_rows {
    int stride;
    const float *q_norm, *k_norm, *inv_freq;
    float eps;
};

static void attention_run(kernels_backend *be, void *out, const void *q, int heads,
                          const void *arena, const kernels_kv_layout *layout,
                          const kernels_batch *batch, int layer, float scale,
                          const rope_rows *rope);

void cuda_attention(kernels_backend *be, void *out, const void *q, int heads, const void *arena,
                    const kernels_kv_layout *layout, const kernels_batch *batch, int layer,
                    float scale)
{
    attention_run(be, out, q, heads, arena, layout, batch, layer, scale, NULL);
}

/* The arena's tensor map for the TMA partials, where the build, GPU and
 * layout take them (cuda_kv_map: bf16 pages of head dim 128); with
 * tensor-core attention at bf16 activations, the partials attention_run
 * launches. */
static bool tma_kv_map(kernels_backend *be, const void *arena, const kernels_kv_layout *layout,
                       CUtensorMap *map)
{
    cuda_state *st = cuda_of(be);
    const int pt = layout->page_tokens;
    return st->sm90a && layout->head_dim == TMA_HD &&
           cuda_kv_map(be, arena, layout, pt < TMA_BOX_MAX ? pt : TMA_BOX_MAX, st->attn_tma_rows,
                       st->attn_tma_l2, map);
}

void cuda_attention_rope_kv(kernels_backend *be, void *out, void *q_out, const void *q, void *k,
                            const void *v, int stride, int heads, const float *q_norm,
                            const float *k_norm, float eps, const float *inv_freq, void *arena,
                            const kernels_kv_layout *layout, const kernels_batch *batch,
                            int layer, float scale)
{
    cuda_state *st = cuda_of(be);
    const int hd = layout->head_dim, kvh = layout->kv_heads;
    size_t a = shoal_dtype_bytes(be->act_dtype);
    /* one kernel where the TMA partials start early and a KV head's query
     * heads are one group; else the two ops */
    CUtensorMap map;
    if (batch->rows <= st->attn_rope && st->attn_early && batch->one_row_per_stream &&
        stride > 0 && heads % kvh == 0 && heads / kvh <= TC_GM &&
        (const unsigned char *)k == (const unsigned char *)q + (size_t)heads * hd * a &&
        (const unsigned char *)v == (const unsigned char *)k + (size_t)kvh * hd * a &&
        be->act_dtype == SHOAL_DTYPE_BF16 && st->attn_tc && tma_kv_map(be, arena, layout, &map)) {
        rope_rows r = {stride, q_norm, k_norm, inv_freq, eps};
        attention_run(be, out, q, heads, arena, layout, batch, layer, scale, &r);
        return;
    }
    cuda_qk_norm_rope_kv_write(be, q_out, q, k, v, stride, heads, q_norm, k_norm, eps, inv_freq,
                               arena, layout, batch, layer);
    cuda_attention(be, out, q_out, heads, arena, layout, batch, layer, scale);
}

static void attention_run(kernels_backend *be, void *out, const void *q, int heads,
                          const void *arena, const kernels_kv_layout *layout,
                          const kernels_batch *batch, int layer, float scale,
                          const rope_rows *rope)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3);
    SHOAL_ASSERT(heads > 0 && heads % layout->kv_heads == 0);
    SHOAL_ASSERT(layout->head_dim > 0 && layout->head_dim <= SHOAL_MODEL_HEAD_DIM_MAX);
    SHOAL_ASSERT(layer >= 0 && layer < layout->layers && batch->rows >= 0);
    SHOAL_ASSERT(batch->page_table_stride > 0);
    SHOAL_ASSERT((layout->page_tokens & (layout->page_tokens - 1)) == 0);
    /* one (max, sum, acc) record per query head fits a row's scratch */
    SHOAL_ASSERT((size_t)heads * ((size_t)layout->head_dim + 2) * sizeof(float) <=
                 CUDA_ATTN_ROW_SCRATCH_BYTES);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(q, a);
    CUDA_ASSERT_ALIGNED(arena, 16);
    if (batch->rows == 0 || !cuda_usable(be))
        return;
    int hd = layout->head_dim;
    slice_ctx c;
    c.be = be;
    c.args.arena = (const unsigned char *)arena;
    c.args.L = *layout;
    c.args.layer = layer;
    c.args.heads = heads;
    c.args.scale = scale;
    c.args.page_table_stride = batch->page_table_stride;
    c.args.scratch = st->attn_scratch;
    c.tc = be->act_dtype == SHOAL_DTYPE_BF16 && st->attn_tc &&
           (hd == 32 || hd == 64 || hd == 128 || hd == 256);
    /* the TMA partials where the build, GPU and layout take them */
    c.tma = c.tc && tma_kv_map(be, arena, layout, &c.tma_args.kv_map);
    c.tma_args.early = c.tma && st->attn_early && batch->one_row_per_stream;
    SHOAL_ASSERT(!rope || c.tma_args.early); /* cuda_attention_rope_kv checked */
    c.tma_args.rope = rope != NULL;
    c.tma_args.qkv_stride = rope ? rope->stride : 0;
    c.tma_args.q_norm = rope ? rope->q_norm : NULL;
    c.tma_args.k_norm = rope ? rope->k_norm : NULL;
    c.tma_args.inv_freq = rope ? rope->inv_freq : NULL;
    c.tma_args.eps = rope ? rope->eps : 0.0f;
    c.tma_args.arena_w = (unsigned char *)arena;
    c.tma_args.ahead = st->attn_depth;
    if (c.tma) {
        const int group = heads / layout->kv_heads;
        partial_tma_dispatch(st->attn_tma_rows,
                             [&](auto kernel, auto smem_of) {
            c.tma_smem = smem_of(group < TC_GM ? group : TC_GM);
            if (st->attn_tma_smem_known != c.tma_smem) { /* asked once per shape */
                int n = 0;
                if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, TMA_THREADS,
                                                                  c.tma_smem) != cudaSuccess ||
                    n < 1) {
                    (void)cudaGetLastError();
                    n = 1;
                }
                st->attn_tma_resident = n;
                st->attn_tma_smem_known = c.tma_smem;
            }
            c.tma_resident = st->attn_tma_resident;
        });
    }
    if (c.tc) {
        CUDA_ASSERT_ALIGNED(q, 16);
        c.chunks = (heads / layout->kv_heads + TC_GM - 1) / TC_GM;
        c.smem = 0;
    } else {
        c.chunks = (heads / layout->kv_heads + ATTN_GQ - 1) / ATTN_GQ;
        c.smem = partial_smem_floats(hd) * sizeof(float);
    }
    /* SHOAL_CUDA_ATTN_FILL: 0 the first rule and merge, 1 the wide merge,
     * 2 (default) also the segments of small rounds shortened to fill the
     * GPU (the tensor-core kernel's shape; the SIMT one keeps the rule) */
    bool fill = st->attn_fill >= 2 && c.tc;
    /* the blocks a multiprocessor the rule aims at: the TMA partials run
     * on from item to item, so one (the wave rule then fills the last
     * wave): a round that fills the GPU alone keeps whole rows, one
     * segment each, and needs no merge (batch 64 at 1k on the H200:
     * 82.9 -> 70.7 us a layer with six stages; kernels/lab row 19.1) */
    const int per_sm = st->attn_blocks > 0 ? st->attn_blocks : c.tma ? 1 : 4;
    int blocks_per_row = layout->kv_heads * c.chunks;
    c.wide_merge = st->attn_fill >= 1;
    if (fill) {
        /* the tensor-core partials at head dim 128: 68 KB a block with two
         * stages (three a multiprocessor), 100 KB with three (two); the
         * TMA ones at groups of 4 query heads 106 KB (two, as the occupancy
         * query says) */
        int resident = c.tma ? c.tma_resident : st->attn_stages == 2 ? 3 : 2;
        if (!st->attn_wave)
            resident = 0;
        attn_splits_filled(st->sm_count, per_sm, resident, batch->rows, blocks_per_row,
                           heads, hd, &c.args.splits, &c.args.fill);
    } else {
        c.args.splits = attn_splits_cap(st->sm_count, per_sm, batch->rows,
                                        blocks_per_row, heads, hd, false);
        c.args.fill = 0;
    }
    /* a slice's records fit the scratch */
    int slice_rows = batch->rows < st->attn_slice_rows ? batch->rows : st->attn_slice_rows;
    SHOAL_ASSERT((size_t)slice_rows * (size_t)c.args.splits * (size_t)heads * ((size_t)hd + 2) *
                     sizeof(float) <=
                 (size_t)(st->attn_slice_rows > KERNELS_ATTN_SLICE_ROWS ? st->attn_slice_rows
                                                                        : KERNELS_ATTN_SLICE_ROWS) *
                     CUDA_ATTN_ROW_SCRATCH_BYTES);

    size_t row_bytes = (size_t)heads * (size_t)hd * a;
    kernels_attn_round round;
    round.rows = batch->rows;
    round.slice_rows = st->attn_slice_rows;
    round.q = q;
    round.q_row_bytes = rope ? (size_t)rope->stride * a : row_bytes; /* rope: the GEMV's rows */
    round.out = out;
    round.out_row_bytes = row_bytes;
    round.row_stream = batch->row_stream;
    round.positions = batch->positions;
    round.page_table = batch->page_table;
    round.page_table_stride = batch->page_table_stride;
    round.fault = st->attn_fault;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        if (layout->dtype == SHOAL_DTYPE_BF16)
            kernels_attention_slices(&round, launch_slice<T, bf16>, &c);
        else
            kernels_attention_slices(&round, launch_slice<T, __nv_fp8_storage_t>, &c);
    });
}
