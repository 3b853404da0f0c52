/* cuda_ops.h: the CUDA backend's state and its ops, one file each, shared
 * by its op table. Private to kernels/cuda/.
 *
 * Every op is a launcher (host) that asserts its shapes, dtypes and
 * alignment, launches on the backend's stream and checks the launch error,
 * plus its kernels, templated on the activation type (float or bf16) and,
 * where they differ, the weight or KV type: one template, no copies. */
#ifndef SHOAL_KERNELS_CUDA_OPS_H
#define SHOAL_KERNELS_CUDA_OPS_H

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"

extern "C" {
#include "common/common_assert.h"
#include "common/common_limits.h"
#include "kernels/kernels_attention_slices.h"
}

#include <stdint.h>

/* Bytes of cuBLAS workspace, given to it at open so that it never
 * allocates during a GEMM (32 MiB is what cuBLAS asks for on Hopper). */
#define CUDA_CUBLAS_WORKSPACE_BYTES (32u << 20)

/* Bytes of matmul_add_rmsnorm's f32 parts: four parts of 64 rows of 8,192
 * (matmul.cu: gemm_parts takes no more). */
#define CUDA_GEMM_PARTS_BYTES ((size_t)4 * 64 * 8192 * 4)

/* Attention partial scratch per row: one (max, sum, acc[head_dim]) F32
 * record per query head and segment. 512 KiB a row holds 32 query heads of
 * 128 dims in 31 segments; the segment count is capped to fit (and at
 * CUDA_ATTN_SPLITS_MAX), from the shape and the round's rows (a round of
 * fewer rows than KERNELS_ATTN_SLICE_ROWS shares their scratch), and each row
 * takes as many as its own context needs (attention_mma.cuh), so a
 * launch's results never depend on how many rows the scratch has. */
#define CUDA_ATTN_ROW_SCRATCH_BYTES (512u << 10)
#define CUDA_ATTN_SPLITS_MAX 64

/* Matmuls of at most this many rows may take our GEMV (matmul.cu), and
 * by default those of one row do: at one row it streams the weights
 * faster than cuBLAS, at two and more cuBLAS's kernels win (lab, H200). */
#define CUDA_GEMV_ROWS_MAX 8
#define CUDA_GEMV_ROWS_DEFAULT 1

/* q's and k's norm and rotation with the KV write run as one kernel
 * (rope.cu) up to this many rows: a decode round's (at 64 rows on the
 * H200 3 us where the three kernels take 7.4); a prompt's rows take the
 * three, whose KV write moves 16 bytes a thread. */
#define CUDA_ROPE_KV_ROWS_MAX 256

/* Sampling (sample.cu): a row is read in at most this many chunks by as
 * many blocks, whose summaries (24 bytes each) the row's block merges;
 * the scratch holds SHOAL_BATCH_ROWS_MAX rows' worth plus the chunks that
 * make a small round fill the GPU (four blocks a multiprocessor). The
 * split path marks penalised tokens in a shared-memory bitmap of the
 * vocabulary: up to 262,144 tokens (32 KiB); larger vocabularies take the
 * first version. */
#define CUDA_SAMPLE_PARTS_MAX 64
#define CUDA_SAMPLE_PART_BYTES 24
#define CUDA_SAMPLE_BITMAP_TOKENS_MAX (1 << 18)

/* Recorded graphs a backend holds (graph_end's slots). */
#define CUDA_GRAPH_SLOTS 1024

/* The gated DeltaNet ops (deltanet.cu) work on a batch's runs (the rows of
 * one stream). A batch of at most CUDA_DELTANET_WALK_ROWS rows more than
 * it has streams (a decode round, a few short prompt pieces) takes them
 * in its kernels: a block per row, which leaves at once unless its row
 * starts a run, then walks to the run's end; no pass before, no block
 * left over at one row a stream. A larger one (a prompt chunk, where a
 * block a row would mostly leave at once) has its runs listed first by
 * one block into the scratch of CUDA_DELTANET_RUNS_INTS ints (the count,
 * the conv's items, then SHOAL_BATCH_ROWS_MAX + 1 run starts and as many
 * item offsets). */
#define CUDA_DELTANET_WALK_ROWS 16
#define CUDA_DELTANET_RUNS_INTS (2 + 2 * (SHOAL_BATCH_ROWS_MAX + 1))

typedef struct cuda_alloc_list {
    void **ptr;
    int count, cap;
} cuda_alloc_list;

/* A tensor map of a KV arena (a CUtensorMap: rows of 128 bf16, boxes of
 * box_rows rows by 64 columns, 128-byte swizzle) and what it was made for. */
typedef struct cuda_kv_tmap {
    const void *arena;
    int page_tokens, box_rows, l2_bytes;
    bool whole_rows;
    alignas(64) unsigned char map[128];
} cuda_kv_tmap;

/* A tensor map of a bf16 matrix for gemm_rows.cu's GEMMs: `height` rows
 * of k, boxes of 64 columns by box_rows. */
typedef struct cuda_gemm_tmap {
    const void *ptr;
    int k, height, box_rows;
    alignas(64) unsigned char map[128];
} cuda_gemm_tmap;
#define CUDA_GEMM_MAPS 64

/* The backend's state (be->impl). */
typedef struct cuda_state {
    int device;
    cuda_options opt; /* as opened */
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_workspace;
    /* max(attn_slice_rows, KERNELS_ATTN_SLICE_ROWS) rows of
     * CUDA_ATTN_ROW_SCRATCH_BYTES: a small round's rows share the default
     * slice's budget (attention.cu), whatever the slice */
    float *attn_scratch;
    int attn_slice_rows;
    kernels_attn_fault attn_fault; /* tests only */
    void *sample_parts; /* sample_parts_max chunk summaries (sample.cu) */
    int sample_parts_max;
    int sm_count; /* multiprocessors */
    bool attn_tc;
    int attn_fill;
    int attn_stages; /* 2 or 3 */
    /* partial blocks a multiprocessor the segment rule aims at
     * (SHOAL_CUDA_ATTN_BLOCKS; 0 = 1 for the TMA partials, 4 for others) */
    int attn_blocks;
    int prompt_tile;   /* 1 to 3: attention_prompt.cu's prompt_shape, 4 = wgmma, 5 = ws */
    /* attn_prompt_ws: persistent (SHOAL_CUDA_PROMPT_PERSIST 1, the default),
     * a block a multiprocessor taking item after item, or at most
     * opt.prompt_blocks blocks where that is above 0 (tests: many items a
     * block); SHOAL_CUDA_PROMPT_PERSIST=0: a block an
     * item. prompt_ws_rounds: the most items a block took in any launch
     * (tests: cuda_backend_prompt_ws_rounds) */
    bool prompt_persist;
    int prompt_ws_rounds;
    /* the sm_90a kernels (wgmma, TMA) run: this build holds their code
     * for this GPU, and the options do not ask for the portable ones */
    bool sm90a;
    bool prompt_wgmma; /* tile 4 or 5 asked for, and this build and GPU run it */
    /* the TMA partials' copies: 16 whole rows, or a 64-column half of
     * them (cuda_kv_map), promoted in L2 by attn_tma_l2 bytes */
    bool attn_tma_rows;
    /* the TMA partials' stages copied ahead of their computing warps at
     * most (SHOAL_CUDA_ATTN_DEPTH, default 4; 0 or the stages or more: all
     * of them). H200: batch 32 at 4k 3,400 -> 3,464-3,468 tokens/s, batch
     * 64 at 4k 4,614 -> 4,711, at 1k +0.4%, batch 1 unchanged (kernels/lab
     * row 26.5) */
    int attn_depth;
    int attn_tma_l2; /* the copies' L2 promotion: 0, 128 (default) or 256 bytes */
    /* Where the round has one row a stream (kernels_batch), the TMA
     * partials launched with programmatic serialization after rope with
     * the KV write, which lets them start at once: their copies of the KV
     * before the round's new tokens run under the kernels before them
     * (SHOAL_CUDA_ATTN_EARLY, default 1; 0 = a plain launch). */
    bool attn_early;
    /* attention_rope_kv as one kernel (the TMA partials norm and rotate
     * their q heads and store the round's new k and v rows themselves)
     * for rounds of at most this many rows (SHOAL_CUDA_ATTN_ROPE, default
     * 2; 0 = never, the two ops). H200, the 8B shape at 4k: batch 1
     * 219.6 -> 223.9 tokens/s, 2 +0.6%, 4 -0.9%, 8 -0.5%, 64 -0.5%
     * (kernels/lab row 21.1) */
    int attn_rope;
    /* bf16 RMSNorm of at least this many rows launched with programmatic
     * serialization too, so that it and the GEMV after it start while
     * the GEMV before drains (SHOAL_CUDA_NORM_EARLY, default 2; 1 =
     * every norm, 0 = none). At one row, since the GEMV keeps a whole
     * row's loads in flight, the plain launch is faster: batch 1 at 4k
     * 226.4 -> 233.3 tokens/s (kernels/lab row 22.3) */
    int norm_early;
    /* a lane's loads in flight in the one-row GEMV: 16 (default: a 4,096-
     * column row whole, before the wait) or 8 (SHOAL_CUDA_GEMV_LOADS; the
     * same bits). H200, batch 1 at 4k: 8 -> 16 223.8-224.8 -> 227.5-228.5
     * tokens/s (kernels/lab row 22.2) */
    int gemv_loads;
    /* the RMSNorm and the residual add inside the one-row GEMV, the
     * model's norm weights folded into the matmuls after them
     * (SHOAL_CUDA_NORM_FUSED, default 1; 0 = fused_norm_rows 0: the norm
     * kernel between, the weights as loaded) */
    bool norm_fused;
    /* its blocks a multiprocessor holds at this shared memory (0: not
     * asked yet; the kernel is fixed at open, the memory by the group) */
    size_t attn_tma_smem_known;
    int attn_tma_resident;
    /* Tile 5 and the TMA partials: the driver's tensor-map encoder (NULL:
     * the cp.async kernels serve), and the arena's maps last made, one
     * per box height (cuda_kv_map). */
    void *tmap_encode;
    cuda_kv_tmap tmaps[2];
    bool attn_wave;  /* decode segments raised to fill their last wave */
    int gemv_rows_max;
    bool sample_split;
    bool gemv_swiglu;
    bool rope_kv_fused;
    bool gate_up_batched;
    /* matmul_add_rmsnorm's split of k (matmul.cu: gemm_parts): 1 = by the
     * shape (default), 0 = never (matmul then rmsnorm), N > 1 = N parts
     * wherever they fit (SHOAL_CUDA_GEMM_PARTS); its f32 parts' scratch
     * (CUDA_GEMM_PARTS_BYTES). H200, down (4096 x 12288) at 64 rows: four
     * parts 27.8 us against cuBLAS's 30.6 with its reduction pass
     * (kernels/lab row 29.1) */
    int gemm_parts;
    float *gemm_parts_buf;
    int32_t *deltanet_runs; /* CUDA_DELTANET_RUNS_INTS (deltanet.cu) */
    /* deltanet_rule's chunked form (deltanet.cu) for runs of at least
     * 64 rows (SHOAL_CUDA_DELTANET_CHUNK: default on with bf16
     * activations, off with f32 ones, whose parity it would loosen to
     * bf16's): the recurrent kernel is latency bound, each row waiting
     * for the one before */
    bool deltanet_chunk;
    unsigned long deltanet_chunk_launches; /* tests: cuda_backend_deltanet_chunk_launches */
    /* gemm_rows.cu: matmul_swiglu past the GEMV's rows as one kernel
     * (SHOAL_CUDA_GEMM_SWIGLU 1, the default; 2 and 3 the lab's other
     * shapes; 0 = cuBLAS's batched GEMM of gate and up, then the swiglu
     * pass), matmul_add_rmsnorm's parts by it (SHOAL_CUDA_GEMM_ROWS_PARTS
     * 1; 0 = cuBLAS's strided-batched GEMM), and the stages they copy
     * before the wait on the kernel before (SHOAL_CUDA_GEMM_ROWS_PRE, 6) */
    int gemm_swiglu;
    bool gemm_rows_parts;
    int gemm_rows_pre;
    unsigned long gemm_rows_launches; /* tests: cuda_backend_gemm_rows_launches */
    cuda_gemm_tmap gemm_maps[CUDA_GEMM_MAPS];
    bool capturing;
    cudaGraphExec_t graph[CUDA_GRAPH_SLOTS];
    cuda_alloc_list allocs;        /* what alloc() handed out, freed at close */
    /* The first CUDA error. An error leaves the context unusable (a fault
     * in a kernel poisons it), so every later call fails fast with it. */
    shoal_err err;
    char err_msg[256];
} cuda_state;

static inline cuda_state *cuda_of(kernels_backend *be)
{
    return (cuda_state *)be->impl;
}

/* Records the first error of `what` (a CUDA call or launch) and logs it. */
void cuda_fail(kernels_backend *be, const char *what, cudaError_t e);
void cuda_fail_cublas(kernels_backend *be, const char *what, cublasStatus_t s);

/* After a launch: the launch's own error (bad configuration, no kernel
 * image) is recorded; true when the backend is still usable. */
static inline bool cuda_launched(kernels_backend *be, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        cuda_fail(be, what, e);
    return cuda_of(be)->err == SHOAL_OK;
}

/* Ops do nothing once the backend is broken: their results could not be
 * trusted, and the next sync or download reports the first error. */
static inline bool cuda_usable(kernels_backend *be)
{
    return cuda_of(be)->err == SHOAL_OK;
}

#define CUDA_ASSERT_ALIGNED(p, bytes) SHOAL_ASSERT(((uintptr_t)(p) % (bytes)) == 0)

/* ---- element types ---- */

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float to_f32(float x)
{
    return x;
}
static __device__ __forceinline__ float to_f32(bf16 x)
{
    return __bfloat162float(x);
}
static __device__ __forceinline__ float to_f32(__half x)
{
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Calls f with a value of the C++ type of an activation dtype. */
template <typename F> static void cuda_dispatch_act(shoal_dtype dt, F f)
{
    if (dt == SHOAL_DTYPE_BF16)
        f(bf16());
    else if (dt == SHOAL_DTYPE_F32)
        f(float());
    else
        SHOAL_ASSERT(!"activation dtype is BF16 or F32");
}

/* Same for a weight dtype. */
template <typename F> static void cuda_dispatch_weight(shoal_dtype dt, F f)
{
    if (dt == SHOAL_DTYPE_BF16)
        f(bf16());
    else if (dt == SHOAL_DTYPE_F16)
        f(__half());
    else if (dt == SHOAL_DTYPE_F32)
        f(float());
    else
        SHOAL_ASSERT(!"weight dtype is BF16, F16 or F32");
}

/* ---- programmatic dependent launch (sm_90) ----
 * A kernel launched with the programmatic-serialization attribute
 * (cuda_launch_pdl: the GEMV, matmul.cu; rope with the KV write, rope.cu;
 * decode attention's TMA partials and merge, attention.cu; RMSNorm,
 * rmsnorm.cu) may start while the kernel before it on the stream
 * finishes; it reads nothing that kernel writes, and writes nothing,
 * before pdl_wait(), which returns once that kernel has completed and its
 * writes are visible. Kernels that come before one call pdl_trigger() at
 * their start so that it may be scheduled early; where the kernel before
 * was itself launched so, the new one may start before the ones further
 * back have completed too, up to the last plain launch, and must not read
 * what they write either. Both are no-ops where there is no such
 * dependency. */
static __device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

/* Launches kernel<<<blocks, threads, 0, stream>>>(args...) with the
 * programmatic-serialization attribute: it must pdl_wait() before it
 * touches what the kernel before it writes. Errors surface at the
 * backend's next check, as for <<<>>> launches. */
template <typename... Params, typename... Args>
static void cuda_launch_pdl_smem(cudaStream_t stream, dim3 blocks, unsigned threads, size_t smem,
                                 void (*kernel)(Params...), Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = blocks;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* The same with no dynamic shared memory. */
template <typename... Params, typename... Args>
static void cuda_launch_pdl(cudaStream_t stream, dim3 blocks, unsigned threads,
                            void (*kernel)(Params...), Args... args)
{
    cuda_launch_pdl_smem(stream, blocks, threads, 0, kernel, args...);
}

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---- */

template <typename T, typename Op>
static __device__ __forceinline__ T warp_reduce(T v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Every thread gets the result. `shared` holds 32 T. */
template <typename T, typename Op>
static __device__ __forceinline__ T block_reduce(T v, Op op, T *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads(); /* shared may still be read from a previous reduction */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    T r = shared[0];
    for (int w = 1; w < warps; w++)
        r = op(r, shared[w]);
    return r;
}

struct op_add {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
    {
        return a + b;
    }
};
struct op_max {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
    {
        return a > b ? a : b;
    }
};

/* ---- KV pages (kernels_backend.h's layout) ---- */

/* Row r's page (bytes) in the arena, and its token slot in that page. */
static __device__ __forceinline__ unsigned char *kv_row_page(unsigned char *arena,
                                                             const kernels_kv_layout &L,
                                                             const kernels_batch &B, int r,
                                                             int *slot)
{
    int pos = B.positions[r];
    int page = B.page_table[(size_t)B.row_stream[r] * (size_t)B.page_table_stride +
                            (size_t)(pos / L.page_tokens)];
    *slot = pos % L.page_tokens;
    return arena + (size_t)page * L.page_bytes;
}

/* Elements from a page's start to (layer, kv, head, slot, dim 0). */
static __device__ __forceinline__ size_t kv_head_at(const kernels_kv_layout &L, int layer, int kv,
                                                    int head, int slot)
{
    return ((((size_t)layer * 2 + (size_t)kv) * (size_t)L.kv_heads + (size_t)head) *
                (size_t)L.page_tokens +
            (size_t)slot) *
           (size_t)L.head_dim;
}

static __device__ __forceinline__ void kv_store(bf16 *dst, float x, float scale)
{
    *dst = __float2bfloat16_rn(x);
}

static __device__ __forceinline__ void kv_store(__nv_fp8_storage_t *dst, float x, float scale)
{
    /* a division, as vLLM quantises and as the CPU twin does */
    *dst = __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}

/* ---- the ops (kernels_backend.h has their contracts) ---- */

void cuda_embed(kernels_backend *be, void *out, const void *table, shoal_dtype wdtype,
                const int32_t *ids, int rows, int dim);
void cuda_rmsnorm(kernels_backend *be, void *out, void *x, const void *residual,
                  const float *weight, int rows, int dim, float eps);
void cuda_matmul(kernels_backend *be, void *out, shoal_dtype out_dtype, const void *in,
                 const void *w, shoal_dtype wdtype, int rows, int n, int k);
void cuda_qk_norm_rope(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                       int row_stride, const float *norm_weight, float eps,
                       const int32_t *positions, const float *inv_freq);
void cuda_kv_write(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                   const kernels_batch *batch, int layer, const void *k, const void *v);
void cuda_kv_write_rows(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                        const kernels_batch *batch, int layer, const void *k, const void *v,
                        int stride);
/* qk_norm_rope's kernel out of place: y [rows][y_stride] from x [rows][x_stride]
 * (the same buffer and strides: in place) */
void cuda_qk_norm_rope_to(kernels_backend *be, void *y, int y_stride, const void *x, int rows,
                          int heads, int head_dim, int x_stride, const float *norm_weight,
                          float eps, const int32_t *positions, const float *inv_freq);
void cuda_qk_norm_rope_kv_write(kernels_backend *be, void *q_out, const void *q, void *k,
                                const void *v, int stride, int heads, const float *q_norm,
                                const float *k_norm, float eps, const float *inv_freq,
                                void *arena, const kernels_kv_layout *layout,
                                const kernels_batch *batch, int layer);
void cuda_attention(kernels_backend *be, void *out, const void *q, int heads, const void *arena,
                    const kernels_kv_layout *layout, const kernels_batch *batch, int layer,
                    float scale);
void cuda_attention_rope_kv(kernels_backend *be, void *out, void *q_out, const void *q, void *k,
                            const void *v, int stride, int heads, const float *q_norm,
                            const float *k_norm, float eps, const float *inv_freq, void *arena,
                            const kernels_kv_layout *layout, const kernels_batch *batch,
                            int layer, float scale);
void cuda_swiglu(kernels_backend *be, void *out, const void *gate, const void *up, int rows,
                 int dim);
bool cuda_matmul_add_rmsnorm(kernels_backend *be, void *out, void *x, const void *in, const void *w,
                             shoal_dtype wdtype, const float *weight, int rows, int n, int k,
                             float eps);
/* rmsnorm whose residual is the sum of nparts f32 parts (parts + p *
 * part_stride, [rows][dim] each), added in part order and rounded to bf16
 * as a stored matmul output is (bf16 rows of a multiple of 8) */
void cuda_rmsnorm_parts(kernels_backend *be, void *out, void *x, const float *parts, int nparts,
                        size_t part_stride, const float *weight, int rows, int dim, float eps);
void cuda_matmul_swiglu(kernels_backend *be, void *out, void *up, const void *in, const void *wg,
                        const void *wu, shoal_dtype wdtype, int rows, int n, int k);
void cuda_matmul_rms(kernels_backend *be, void *out, const void *x, const void *w,
                     shoal_dtype wdtype, int rows, int n, int k, float eps);
void cuda_matmul_swiglu_rms(kernels_backend *be, void *out, const void *x, const void *wg,
                            const void *wu, shoal_dtype wdtype, int rows, int n, int k, float eps);
void cuda_matmul_add(kernels_backend *be, void *x, const void *in, const void *w,
                     shoal_dtype wdtype, int rows, int n, int k);
void cuda_scale_columns(kernels_backend *be, void *w, shoal_dtype wdtype, int rows, int cols,
                        const float *scale);
void cuda_moe_route(kernels_backend *be, int32_t *ids, float *weights, const float *logits,
                    int rows, int experts, int topk, bool renorm);
size_t cuda_moe_scratch_bytes(kernels_backend *be, int rows, int topk, int n, int k);
void cuda_moe_experts(kernels_backend *be, void *out, const void *in, const int32_t *ids,
                      const float *weights, int rows, int topk, const kernels_weight *wg,
                      const kernels_weight *wu, const kernels_weight *wd, void *scratch);
void cuda_gather(kernels_backend *be, void *out, const void *in, const int32_t *idx, int rows,
                 int dim);
void cuda_sample(kernels_backend *be, kernels_sample_result *results, const float *logits,
                 int rows, int vocab, const kernels_sample_params *params,
                 const int32_t *penalty_offsets, const int32_t *penalty_tokens,
                 const int32_t *penalty_counts);
void cuda_fill_random(kernels_backend *be, void *dst, size_t n, uint64_t state, float base,
                      float scale);
void cuda_attention_prompt(kernels_backend *be, void *out, const void *q, int heads,
                           const void *arena, const kernels_kv_layout *layout,
                           const kernels_batch *batch, int layer, float scale);
void cuda_deltanet_conv(kernels_backend *be, void *out, const void *in, int in_stride,
                        const float *w, int channels, int kernel, void *states,
                        size_t slot_stride, const int32_t *slots, const kernels_batch *batch);
void cuda_deltanet_rule(kernels_backend *be, void *out, const void *x, const void *b,
                        const void *a, int ba_stride, const float *decay, const float *dt_bias,
                        int k_heads, int v_heads, int k_dim, int v_dim, void *states,
                        size_t slot_stride, const int32_t *slots, const kernels_batch *batch);
void cuda_rmsnorm_gated(kernels_backend *be, void *out, const void *x, const void *z,
                        const float *w, int rows, int heads, int dim, float eps);
void cuda_mul_sigmoid(kernels_backend *be, void *x, const void *gate, int rows, int n,
                      int gate_stride, int gate_cols);
void cuda_add(kernels_backend *be, void *x, const void *y, int rows, int n);

/* arena.cu: shared arenas (VMM, exported as POSIX fds). */
shoal_err cuda_arena_create(kernels_backend *be, size_t bytes, void **ptr, int *fd,
                            size_t *mapped_bytes);
shoal_err cuda_arena_import(kernels_backend *be, int fd, size_t bytes, void **ptr);
void cuda_arena_unmap(kernels_backend *be, void *ptr, size_t bytes);

/* attention_prompt.cu: whether the tensor-core prompt kernel takes this
 * shape (else attention_prompt runs the partial path). */
bool cuda_attention_prompt_fits(kernels_backend *be, int heads, const kernels_kv_layout *layout);
/* Probes for sm_90a code (sm90a) and the driver's tensor-map encoder. */
shoal_err cuda_attention_prompt_init(kernels_backend *be);
/* The tensor map of the arena's K and V rows (head dim 128, bf16) with
 * boxes of box_rows rows (8 to the page's tokens: a box never leaves a
 * page when its first row is a multiple of box_rows), into out (a
 * CUtensorMap); kept in st->tmaps and made again only when the arena, the
 * page size or the box changes. A box is one 64-column half of the rows
 * (a 2-D map: column, row), or with whole_rows both halves (a 3-D map:
 * column, half, row), landing as rows of 256 bytes whose 128-byte halves
 * are swizzled as the 128-byte rows they are. l2_bytes is the copies' L2
 * promotion (0, 128 or 256). False where no encoder, or the layout is not
 * one the copies take. */
bool cuda_kv_map(kernels_backend *be, const void *arena, const kernels_kv_layout *L, int box_rows,
                 bool whole_rows, int l2_bytes, void *out);

/* A tensor map (CUtensorMap) of a bf16 tensor of `rank` dimensions (2 or
 * 3; dims, strides in bytes of all but the first, box), 128-byte swizzle,
 * the copies promoted in L2 by l2_bytes (0, 128 or 256): false where the
 * driver's encoder is missing or refuses (attention_prompt.cu). */
bool cuda_tmap_bf16(const cuda_state *st, CUtensorMap *out, int rank, const void *p,
                    const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                    int l2_bytes);

/* gemm_rows.cu: the tensor map of a bf16 matrix of `height` rows of k as
 * its GEMMs copy it (boxes 64 wide, box_rows high, 128-byte swizzle; past
 * k or height the boxes land as zeros), from the backend's cache
 * (st->gemm_maps); false where the encoder refuses. */
bool cuda_gemm_map(cuda_state *st, const void *p, int k, int height, int box_rows,
                   CUtensorMap *out);

/* gemm_rows.cu: the GEMMs of 2 to 64 rows that stream their weights (bf16
 * in and weights; k a multiple of 8; in and the weights 16-byte aligned);
 * false where they do not take the operands (nothing launched).
 * cuda_gemm_swiglu: matmul_swiglu as one kernel (SHOAL_CUDA_GEMM_SWIGLU).
 * cuda_gemm_parts: nparts f32 parts of out = in w^T, part p over k's
 * columns [p k / nparts, (p + 1) k / nparts), [nparts][rows][n] at parts
 * (SHOAL_CUDA_GEMM_ROWS_PARTS; k a multiple of 64 nparts, n of 4). Their
 * init, at open after cuda_attention_prompt_init, raises their
 * shared-memory limits. */
bool cuda_gemm_swiglu(kernels_backend *be, void *out, const void *in, const void *wg,
                      const void *wu, int rows, int n, int k);
bool cuda_gemm_parts(kernels_backend *be, float *parts, const void *in, const void *w, int rows,
                     int n, int k, int nparts);
shoal_err cuda_gemm_rows_init(kernels_backend *be);

/* deltanet.cu: raises the chunked rule's shared-memory limit where
 * cuda_state.deltanet_chunk is on; once, at open. */
shoal_err cuda_deltanet_init(kernels_backend *be);

/* attention.cu: raises the kernels' shared-memory limits; once, at open. */
shoal_err cuda_attention_init(kernels_backend *be);

#endif
