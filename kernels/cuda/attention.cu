/* Paged causal attention as split-K partials plus a merge (flash-decoding):
 * the twin of kernels/cpu/attention.c.
 *
 * A row's context (positions [0, pos]) is cut into `splits` segments of
 * whole pages. The partial kernel runs one block per (row, KV head, chunk
 * of up to ATTN_GQ query heads of that KV head, segment): it reads the
 * segment's K and V once for all the chunk's query heads (GQA) through the
 * page table, keeps an online softmax, and writes (max, sum, sum p v) per
 * query head to scratch. The merge kernel, one block per (row, query head),
 * rescales and adds the segments in order and writes the output row.
 *
 * The scratch has rows for KERNELS_ATTN_SLICE_ROWS rows; kernels_attention_
 * slices() cuts longer rounds, and each slice is one partial + merge pair.
 * The split count depends only on the model's shape and the page table's
 * capacity, never on the slice, so a sliced round equals an unsliced one
 * to the byte. Each block sums in a fixed order: results are deterministic. */
#include "cuda_ops.h"

#include "common/common_limits.h"

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
    int splits;
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
    const int32_t *pages = page_table + (size_t)row_stream[r] * (size_t)a.page_table_stride;
    const int ctx_pages = (ctx + pt - 1) / pt;
    const int seg_pages = (ctx_pages + a.splits - 1) / a.splits;
    const int t_begin = split * seg_pages * pt;
    const int t_end = min(ctx, (split + 1) * seg_pages * pt);

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

template <typename T>
static __global__ void __launch_bounds__(MERGE_THREADS)
    attn_merge(const float *scratch, T *out, int heads, int head_dim, int splits)
{
    const int r = blockIdx.x, h = blockIdx.y;
    const size_t rec_floats = (size_t)head_dim + 2;
    const float *rec = scratch + ((size_t)r * heads + h) * splits * rec_floats;
    float mx = -INFINITY;
    for (int s = 0; s < splits; s++)
        mx = fmaxf(mx, rec[s * rec_floats]);
    float den = 0.0f;
    for (int s = 0; s < splits; s++) {
        float ms = rec[s * rec_floats];
        if (ms != -INFINITY)
            den += rec[s * rec_floats + 1] * expf(ms - mx);
    }
    T *o = out + ((size_t)r * heads + h) * head_dim;
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

/* Splits per row: enough segments of at least CUDA_ATTN_SPLIT_TOKENS_MIN
 * tokens for the longest context the page table can hold, within the
 * per-row scratch. From the shape alone, never from the slice. */
static int attn_splits(int heads, int head_dim, const kernels_kv_layout *L, int stride)
{
    long long capacity = (long long)stride * L->page_tokens;
    long long s = (capacity + CUDA_ATTN_SPLIT_TOKENS_MIN - 1) / CUDA_ATTN_SPLIT_TOKENS_MIN;
    size_t per_split = (size_t)heads * ((size_t)head_dim + 2) * sizeof(float);
    long long fit = (long long)(CUDA_ATTN_ROW_SCRATCH_BYTES / per_split);
    if (s > CUDA_ATTN_SPLITS_MAX)
        s = CUDA_ATTN_SPLITS_MAX;
    if (s > fit)
        s = fit;
    return s < 1 ? 1 : (int)s;
}

struct slice_ctx {
    kernels_backend *be;
    attn_args args;
    int chunks;
    size_t smem;
};

template <typename T, typename KV> static void launch_slice(void *p, const kernels_attn_slice *s)
{
    slice_ctx *c = (slice_ctx *)p;
    cudaStream_t stream = cuda_of(c->be)->stream;
    dim3 grid((unsigned)s->rows, (unsigned)(c->args.L.kv_heads * c->chunks),
              (unsigned)c->args.splits);
    attn_partial<T, KV><<<grid, ATTN_THREADS, c->smem, stream>>>(
        c->args, (const T *)s->q, s->row_stream, s->positions, s->page_table);
    if (!cuda_launched(c->be, "attention partial"))
        return;
    dim3 mgrid((unsigned)s->rows, (unsigned)c->args.heads);
    attn_merge<T><<<mgrid, MERGE_THREADS, 0, stream>>>(c->args.scratch, (T *)s->out,
                                                       c->args.heads, c->args.L.head_dim,
                                                       c->args.splits);
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
    if (e != cudaSuccess)
        cuda_fail(be, "attention: raise the shared-memory limit", e);
    return cuda_of(be)->err;
}

void cuda_attention(kernels_backend *be, void *out, const void *q, int heads, const void *arena,
                    const kernels_kv_layout *layout, const kernels_batch *batch, int layer,
                    float scale)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(layout->dtype == SHOAL_DTYPE_BF16 || layout->dtype == SHOAL_DTYPE_F8_E4M3);
    SHOAL_ASSERT(heads > 0 && heads % layout->kv_heads == 0);
    SHOAL_ASSERT(layout->head_dim > 0 && layout->head_dim <= SHOAL_MODEL_HEAD_DIM_MAX);
    SHOAL_ASSERT(layer >= 0 && layer < layout->layers && batch->rows >= 0);
    SHOAL_ASSERT(batch->page_table_stride > 0);
    /* one (max, sum, acc) record per query head fits a row's scratch */
    SHOAL_ASSERT((size_t)heads * ((size_t)layout->head_dim + 2) * sizeof(float) <=
                 CUDA_ATTN_ROW_SCRATCH_BYTES);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(q, a);
    CUDA_ASSERT_ALIGNED(arena, 16);
    if (batch->rows == 0 || !cuda_usable(be))
        return;
    slice_ctx c;
    c.be = be;
    c.args.arena = (const unsigned char *)arena;
    c.args.L = *layout;
    c.args.layer = layer;
    c.args.heads = heads;
    c.args.splits = attn_splits(heads, layout->head_dim, layout, batch->page_table_stride);
    c.args.scale = scale;
    c.args.page_table_stride = batch->page_table_stride;
    c.args.scratch = st->attn_scratch;
    c.chunks = (heads / layout->kv_heads + ATTN_GQ - 1) / ATTN_GQ;
    c.smem = partial_smem_floats(layout->head_dim) * sizeof(float);

    size_t row_bytes = (size_t)heads * (size_t)layout->head_dim * a;
    kernels_attn_round round;
    round.rows = batch->rows;
    round.slice_rows = st->attn_slice_rows;
    round.q = q;
    round.q_row_bytes = row_bytes;
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
