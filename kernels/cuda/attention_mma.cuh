/* attention_mma.cuh: what the tensor-core attention kernels share (the
 * decode partials in attention.cu and the prompt kernel in
 * attention_prompt.cu). Private to kernels/cuda/.
 *
 * Tiles of K, V and Q sit in shared memory as bf16 rows of HD elements,
 * 16-byte chunks XOR-swizzled by the row so that ldmatrix over 8 rows of
 * one chunk column hits 8 different bank groups. Scores and outputs come
 * from mma.sync m16n8k16 (bf16 in, f32 accumulate), which Hopper runs on
 * its tensor cores; fp8 pages are widened to bf16 as they are staged (every
 * e4m3 value is exact in bf16) and their scales applied to the f32 sums.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16): lane l holds A rows l/4 and
 * l/4 + 8 at columns 2(l%4) + {0,1} (+8 in a2, a3); B columns l/4 at rows
 * 2(l%4) + {0,1} (+8 in b1); C rows l/4 (c0, c1) and l/4 + 8 (c2, c3) at
 * columns 2(l%4) + {0,1}. */
#ifndef SHOAL_KERNELS_CUDA_ATTENTION_MMA_CUH
#define SHOAL_KERNELS_CUDA_ATTENTION_MMA_CUH

#include "cuda_ops.h"

/* Context tokens per split of a decode row: the partial kernels cut a row
 * of ctx tokens into segments of attn_seg_tokens(ctx, cap, fill) tokens
 * (whole pages of 16), attn_splits_of(ctx, cap, fill) of them, where cap
 * and fill are the round's (cuda_attention picks them from the round's
 * rows and the shape, never from a slice): a row's result depends on its
 * context and the size of its round, not on how the round is sliced.
 * About 192 tokens a segment (three tiles) keep each block a pipeline of
 * three tiles; that gives a batch-1 row of 4k context only 22 segments a
 * KV head, 176 blocks for 132 multiprocessors. So a round of few rows
 * (fill > 0) takes at least `fill` segments a row, down to one tile of 64
 * tokens each, which fills the GPU once over at batch 1 and changes
 * nothing at batch 4 and up (their cap is under 22 segments at 4k).
 * fill = 0 is the first rule (SHOAL_CUDA_ATTN_FILL=0). */
#define CUDA_ATTN_SPLIT_TOKENS 192
#define CUDA_ATTN_SPLIT_TOKENS_MIN 64
#define CUDA_ATTN_SEG_ALIGN 16

static __host__ __device__ __forceinline__ int attn_seg_tokens(int ctx, int splits_max, int fill)
{
    int s = (ctx + CUDA_ATTN_SPLIT_TOKENS - 1) / CUDA_ATTN_SPLIT_TOKENS;
    if (fill > 0) {
        int most = (ctx + CUDA_ATTN_SPLIT_TOKENS_MIN - 1) / CUDA_ATTN_SPLIT_TOKENS_MIN;
        int f = fill < most ? fill : most;
        s = s > f ? s : f;
    }
    s = s < 1 ? 1 : s < splits_max ? s : splits_max;
    int seg = (ctx + s - 1) / s;
    return (seg + CUDA_ATTN_SEG_ALIGN - 1) / CUDA_ATTN_SEG_ALIGN * CUDA_ATTN_SEG_ALIGN;
}

/* Segments of a row of ctx tokens: every one non-empty. */
static __host__ __device__ __forceinline__ int attn_splits_of(int ctx, int splits_max, int fill)
{
    int seg = attn_seg_tokens(ctx, splits_max, fill);
    return (ctx + seg - 1) / seg;
}

namespace mma {

static __device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Byte offset of 16-byte chunk c of row `row` in a tile of HD-element bf16
 * rows. */
template <int HD> static __device__ __forceinline__ uint32_t swz(int row, int c)
{
    constexpr int CH = HD / 8;
    constexpr int MASK = CH < 8 ? CH - 1 : 7;
    return (uint32_t)(row * (HD * 2) + ((c ^ (row & MASK)) << 4));
}

/* swz as a tile layout: where scores() and accumulate() find chunk c of
 * a K or V row (another layout, with the same at(), may take its place). */
template <int HD> struct swz_rows {
    static __device__ __forceinline__ uint32_t at(int row, int c) { return swz<HD>(row, c); }
};

static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, asynchronously; zeros where !valid (src is
 * then not read). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t two)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    float2 f = __half22float2(__half2(h));
    return pack_bf16(f.x, f.y);
}

/* Stages rows [0, ROWS) of a K or V tile: token t0 + row of the stream
 * whose pages are `pages`, at element offset `off` of each page (layer,
 * K or V, KV head). Rows at or past t_end are zeros, and their page is
 * never looked up. bf16 pages go by cp.async (the caller commits and
 * waits); fp8 pages are read, widened and stored here. */
template <int HD, int ROWS, int THREADS, typename KV> struct kv_tile;

/* The rows of a tile as stored (HD elements of KV a token) by cp.async, 16
 * bytes a copy: chunk c of row `row` goes to dst + at(row, c). */
template <int HD, int ROWS, int THREADS, typename KV, typename At>
static __device__ __forceinline__ void cp_async_rows(uint32_t dst, const unsigned char *arena,
                                                     size_t page_bytes, const int32_t *pages,
                                                     int pt_shift, size_t off, int t0,
                                                     int t_end, At at)
{
    constexpr int CH = HD * (int)sizeof(KV) / 16;
    const int pt_mask = (1 << pt_shift) - 1;
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
        int row = i / CH, c = i % CH, tok = t0 + row;
        bool valid = tok < t_end;
        const void *src = arena;
        if (valid)
            src = arena + (size_t)pages[tok >> pt_shift] * page_bytes +
                  (off + (size_t)(tok & pt_mask) * HD) * sizeof(KV) + (size_t)c * 16;
        cp_async16(dst + at(row, c), src, valid);
    }
}

template <int HD, int ROWS, int THREADS> struct kv_tile<HD, ROWS, THREADS, bf16> {
    static __device__ __forceinline__ void load(uint32_t dst, const unsigned char *arena,
                                                size_t page_bytes, const int32_t *pages,
                                                int pt_shift, size_t off, int t0, int t_end)
    {
        cp_async_rows<HD, ROWS, THREADS, bf16>(dst, arena, page_bytes, pages, pt_shift, off, t0,
                                               t_end,
                                               [](int row, int c) { return swz<HD>(row, c); });
    }
};

template <int HD, int ROWS, int THREADS> struct kv_tile<HD, ROWS, THREADS, __nv_fp8_storage_t> {
    static __device__ __forceinline__ void load(uint32_t dst, const unsigned char *arena,
                                                size_t page_bytes, const int32_t *pages,
                                                int pt_shift, size_t off, int t0, int t_end)
    {
        constexpr int CH = HD / 8;
        const int pt_mask = (1 << pt_shift) - 1;
#pragma unroll
        for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
            int row = i / CH, c = i % CH, tok = t0 + row;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (tok < t_end) {
                const uint8_t *src = arena + (size_t)pages[tok >> pt_shift] * page_bytes + off +
                                     (size_t)(tok & pt_mask) * HD + c * 8;
                uint2 raw = *(const uint2 *)src;
                v.x = fp8x2_to_bf16x2((uint16_t)(raw.x & 0xffff));
                v.y = fp8x2_to_bf16x2((uint16_t)(raw.x >> 16));
                v.z = fp8x2_to_bf16x2((uint16_t)(raw.y & 0xffff));
                v.w = fp8x2_to_bf16x2((uint16_t)(raw.y >> 16));
            }
            asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst + swz<HD>(row, c)),
                         "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
        }
    }
};

/* fp8 KV staged as it is stored, then widened in shared memory: load()
 * copies ROWS tokens of HD bytes with cp.async (asynchronous like the bf16
 * tiles, where kv_tile<fp8> waits on each load in registers), rows packed
 * at HD bytes; widen() turns a staged tile into the bf16 tile layout of
 * kv_tile (swizzled) for the mma fragments. Scales are the caller's. */
template <int HD, int ROWS, int THREADS> struct kv_tile_fp8_staged {
    static constexpr uint32_t BYTES = (uint32_t)ROWS * HD;

    static __device__ __forceinline__ void load(uint32_t dst, const unsigned char *arena,
                                                size_t page_bytes, const int32_t *pages,
                                                int pt_shift, size_t off, int t0, int t_end)
    {
        cp_async_rows<HD, ROWS, THREADS, __nv_fp8_storage_t>(
            dst, arena, page_bytes, pages, pt_shift, off, t0, t_end,
            [](int row, int c) { return (uint32_t)(row * HD + c * 16); });
    }

    static __device__ __forceinline__ void widen(uint32_t dst, uint32_t src)
    {
        constexpr int CH = HD / 16;
#pragma unroll
        for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
            int row = i / CH, c = i % CH;
            uint4 raw;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                         : "r"(src + (uint32_t)(row * HD + c * 16)));
            const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int half = 0; half < 2; half++) {
                uint32_t a = w[2 * half], b = w[2 * half + 1];
                asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(
                                 dst + swz<HD>(row, 2 * c + half)),
                             "r"(fp8x2_to_bf16x2((uint16_t)(a & 0xffff))),
                             "r"(fp8x2_to_bf16x2((uint16_t)(a >> 16))),
                             "r"(fp8x2_to_bf16x2((uint16_t)(b & 0xffff))),
                             "r"(fp8x2_to_bf16x2((uint16_t)(b >> 16))));
            }
        }
    }
};

/* One warp's scores of 16 query rows (qf, in A fragments over HD) against
 * NT * 8 staged keys starting at tile row key0 (laid out as Lay):
 * s[nt] is a C fragment. */
template <int HD, int NT, typename Lay = swz_rows<HD>>
static __device__ __forceinline__ void scores(float (&s)[NT][4], const uint32_t (&qf)[HD / 16][4],
                                              uint32_t kbase, int key0)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kp = 0; kp < HD / 32; kp++) {
            uint32_t b[4];
            ldsm_x4(b, kbase + Lay::at(key0 + nt * 8 + (lane & 7), kp * 4 + (lane >> 3)));
            mma_bf16(s[nt], qf[2 * kp], b[0], b[1]);
            mma_bf16(s[nt], qf[2 * kp + 1], b[2], b[3]);
        }
    }
}

/* The A fragment (m16n8k16) of keys 16 kk .. 16 kk + 15 of p, C fragments
 * of 8 keys each (mma.sync's and wgmma's accumulators alike), rounded to
 * bf16: what O += P V multiplies by. */
template <int NT>
static __device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&p)[NT][4],
                                                  int kk)
{
    a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

/* o += p v over NT * 8 staged values from tile row key0 (NT even; laid
 * out as Lay); p is the C fragment of the scores, rounded to bf16 A
 * fragments here. Rows at or past key0 + valid are taken as zeros,
 * whatever the tile holds there (a stale page tail times p = 0 would be
 * NaN where it holds NaN): lane l's B registers hold rows 2 (l % 4) and
 * one more, + 8 in b[1] and b[3], of each 16. */
template <int HD, int NT, typename Lay = swz_rows<HD>>
static __device__ __forceinline__ void accumulate(float (&o)[HD / 8][4], const float (&p)[NT][4],
                                                  uint32_t vbase, int key0, int valid = NT * 8)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[4];
        p_fragment<NT>(a, p, kk);
        const int t = kk * 16 + 2 * (lane & 3);
        const uint32_t lo = (t < valid ? 0xffffu : 0u) | (t + 1 < valid ? 0xffff0000u : 0u);
        const uint32_t hi = (t + 8 < valid ? 0xffffu : 0u) | (t + 9 < valid ? 0xffff0000u : 0u);
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_trans(b, vbase + Lay::at(key0 + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                             dp * 2 + (lane >> 4)));
            if (valid < NT * 8) {
                b[0] &= lo;
                b[1] &= hi;
                b[2] &= lo;
                b[3] &= hi;
            }
            mma_bf16(o[2 * dp], a, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

static __device__ __forceinline__ float ex2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Online softmax over one tile of scores for the lane's two rows: s holds
 * raw scores, `scale` times which are log2 units (the softmax scale and
 * log2(e), and an fp8 K scale), masked entries -inf; the scale is folded
 * into one FMA before each exp (flash attention 2's form). Updates the
 * running max m (log2 units) and the lane's partial sum l, turns s into p,
 * and gives the factor corr[h] by which the rows' o must be rescaled. A
 * row that has seen only -inf keeps m = -inf, l = 0 (no NaN). exp is
 * ex2.approx with flush to zero: a p under 2^-126 is 0, which no bf16 sum
 * of these rows can tell apart. */
template <int NT>
static __device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float scale,
                                                      float (&m)[2], float (&l)[2],
                                                      float (&corr)[2])
{
    /* the max and the sum in A independent chains, not one chain of NT
     * dependent steps: with two warps a scheduler there is little else to
     * hide an FMNMX's or FADD's latency behind */
    constexpr int A = NT < 4 ? NT : 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mxa[A];
#pragma unroll
        for (int i = 0; i < A; i++)
            mxa[i] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mxa[nt % A] = fmaxf(mxa[nt % A], fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        float mx = mxa[0];
#pragma unroll
        for (int i = 1; i < A; i++)
            mx = fmaxf(mx, mxa[i]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(m[h], mx * scale);
        const float base = mx == -INFINITY ? 0.0f : mx;
        corr[h] = ex2_ftz(m[h] - base);
        float suma[A];
#pragma unroll
        for (int i = 0; i < A; i++)
            suma[i] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][2 * h] = ex2_ftz(fmaf(s[nt][2 * h], scale, -base));
            s[nt][2 * h + 1] = ex2_ftz(fmaf(s[nt][2 * h + 1], scale, -base));
            suma[nt % A] += s[nt][2 * h] + s[nt][2 * h + 1];
        }
        float sum = suma[0];
#pragma unroll
        for (int i = 1; i < A; i++)
            sum += suma[i];
        l[h] = l[h] * corr[h] + sum;
        m[h] = mx;
    }
}

/* o's rows (C fragments) times corr (softmax_scores). */
template <int HD>
static __device__ __forceinline__ void rescale(float (&o)[HD / 8][4], const float (&corr)[2])
{
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        o[dt][0] *= corr[0];
        o[dt][1] *= corr[0];
        o[dt][2] *= corr[1];
        o[dt][3] *= corr[1];
    }
}

/* softmax_scores, then o rescaled at once. */
template <int HD, int NT>
static __device__ __forceinline__ void softmax_step(float (&s)[NT][4], float scale,
                                                    float (&o)[HD / 8][4], float (&m)[2],
                                                    float (&l)[2])
{
    float corr[2];
    softmax_scores<NT>(s, scale, m, l, corr);
    rescale<HD>(o, corr);
}

/* Loads 16 rows of Q (bf16, rows at q_rows[i] or zeros where NULL is
 * given through `valid`) into A fragments: rows row0 .. row0 + 15 of the
 * staged tile at qbase. */
template <int HD>
static __device__ __forceinline__ void q_fragments(uint32_t (&qf)[HD / 16][4], uint32_t qbase,
                                                   int row0)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ldsm_x4(qf[kk], qbase + swz<HD>(row0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        kk * 2 + (lane >> 4)));
}

} // namespace mma

#endif
