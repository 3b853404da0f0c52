/* The GEMMs of a decode round (2 to GR_BM rows, bf16) that stream their
 * weights as one wave of blocks, one a multiprocessor:
 *
 * - matmul_swiglu: out[r][j] = silu(g) * u, where g and u are row r of
 *   `in` times rows j of the gate and up weights: no projections through
 *   memory, no swiglu pass. A block takes a tile of HALF gate rows and the
 *   same up rows, all of k (n = 12,288: 128 blocks of 1.5 MB).
 * - matmul_add_rmsnorm's parts: part p = in[:, p k / P ...] times the
 *   same columns of w, f32, summed by the norm after it (matmul.cu). A
 *   block takes a tile of 128 weight rows and one part's k (down, 4,096 x
 *   12,288 in four parts: 128 blocks of 768 KB).
 *
 * Why: at 9 to 64 rows cuBLAS's GEMMs read the 8B shape's weights at 3.4
 * to 4.0 TB/s on the H200 where a copy runs at 4.3, and cannot start
 * their weight reads before the kernel before them ends.
 *
 * How: a producer warp copies stages of 64 k by the tensor memory
 * accelerator (the tile's weight boxes, then the round's rows; boxes past
 * n or k land as zeros) and one warpgroup multiplies them on the tensor
 * cores, the weights as the A operand (m64: the tile's rows in 64-row
 * slices) and the rows as B (wgmma m64n64k16), one stage's products in
 * flight while it waits for the next. The weights of the first stages
 * are copied before the wait on the kernel before (programmatic launch):
 * they do not depend on it. At the end the f32 sums go through shared
 * memory: g and u rounded to bf16 as the stored projections are, silu(g)
 * * u as the swiglu kernel forms it; or the part, as f32.
 *
 * Measured (H200, kernels/lab rows 30.1-30.6): gate/up with swiglu at 64
 * rows 52.2 us against cuBLAS's batched GEMM and the pass's 59.4
 * (shoal-lab-ops --gate-up), 48.0 against 56.2 at 9 rows; in the model,
 * with down's and o's parts, batch 64 at 1k +2.2% and batch 16 +4.1%
 * against cuBLAS. Tiles of 64 weight rows for a plain matmul (q/k/v, 96
 * blocks) were slower than cuBLAS (20.2 against 16.2 us at 64 rows): the
 * round's rows are read from L2 once a tile, as many bytes as the
 * weights'. */
#include "cuda_ops.h"
#include "wgmma.cuh"

enum {
    GR_BM = 64,       /* rows of the round at most (wgmma's n) */
    GR_BK = 64,       /* k a stage: one 128-byte swizzled row */
    GR_THREADS = 160, /* a warpgroup and the producer warp */
    GR_X_BYTES = GR_BM * GR_BK * 2,
};

enum gr_mode { GR_SWIGLU, GR_PARTS };

/* A block's tile: TILES slices of 64 weight rows (SWIGLU: the first half
 * gate rows, the second the same up rows) and STAGES stages of 64 k. */
template <int TILES, int STAGES> struct gr_shape {
    static constexpr int rows = 64 * TILES;
    static constexpr int w_bytes = rows * GR_BK * 2;
    static constexpr int stage_bytes = w_bytes + GR_X_BYTES;
    static constexpr int red_stride = rows + 4; /* f32 a row of the sums: no conflicts */
    static constexpr size_t smem =
        1024 /* the swizzle's alignment */ + (size_t)STAGES * stage_bytes;
    static_assert((size_t)GR_BM * red_stride * 4 <= (size_t)STAGES * stage_bytes,
                  "the sums fit in the stages' memory");
};

/* SWIGLU: wmap the gate, umap the up weights (n rows each), out bf16
 * [rows][n]. PARTS: wmap the weights (n rows), umap unused, out f32
 * [gridDim.y][rows][n], block (x, y) part y of k: steps [y ksteps,
 * (y + 1) ksteps) of 64. */
template <int TILES, int STAGES, gr_mode MODE>
static __global__ void __launch_bounds__(GR_THREADS, 1)
    gemm_rows(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap umap,
              const __grid_constant__ CUtensorMap xmap, void *out, int rows, int n, int ksteps,
              int pre_max)
{
#ifdef SHOAL_WGMMA
    using S = gr_shape<TILES, STAGES>;
    constexpr int HALF = S::rows / 2;
    extern __shared__ unsigned char gr_raw[];
    __shared__ alignas(8) uint64_t full[STAGES], empty[STAGES];
    const int j0 = (int)blockIdx.x * (MODE == GR_SWIGLU ? HALF : S::rows);
    const int k0 = (int)blockIdx.y * ksteps * GR_BK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned char *smem = wg::align_1024(gr_raw);
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(full);
    const uint32_t empty0 = (uint32_t)__cvta_generic_to_shared(empty);
    wg::stages_init(full0, empty0, STAGES, 4); /* lane 0 of each computing warp */
    __syncthreads();
    pdl_trigger();
    if (warp == 4) {
        if (lane == 0) {
            int pre = ksteps < STAGES ? ksteps : STAGES;
            pre = pre < pre_max ? pre : pre_max;
            const uint32_t stage_bytes = S::w_bytes + (uint32_t)rows * GR_BK * 2;
            auto weights = [&](int s, uint32_t st, uint32_t bar) {
                wg::bar_arrive_expect(bar, stage_bytes);
                if constexpr (MODE == GR_SWIGLU) {
                    wg::tma_load_2d(st, &wmap, k0 + s * GR_BK, j0, bar);
                    wg::tma_load_2d(st + HALF * 128, &umap, k0 + s * GR_BK, j0, bar);
                } else {
                    wg::tma_load_2d(st, &wmap, k0 + s * GR_BK, j0, bar);
                }
            };
            for (int s = 0; s < pre; s++)
                weights(s, base + s * S::stage_bytes, full0 + 8 * s);
            pdl_wait(); /* the rows are the kernel before's output */
            for (int s = 0; s < pre; s++)
                wg::tma_load_2d(base + s * S::stage_bytes + S::w_bytes, &xmap, k0 + s * GR_BK, 0,
                                full0 + 8 * s);
            for (int s = pre; s < ksteps; s++) {
                const int slot = s % STAGES;
                const uint32_t st = base + slot * S::stage_bytes, bar = full0 + 8 * slot;
                /* a fresh slot's wait passes at once (parity 1) */
                wg::bar_wait(empty0 + 8 * slot, ((s / STAGES) & 1) ^ 1);
                weights(s, st, bar);
                wg::tma_load_2d(st + S::w_bytes, &xmap, k0 + s * GR_BK, 0, bar);
            }
        }
        return; /* the computing warps' barriers below are theirs alone */
    }
    float d[TILES][8][4]; /* the tile's weight rows (64 a slice) by the round's rows */
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                d[t][i][e] = 0.0f;
    for (int s = 0; s < ksteps; s++) {
        const int slot = s % STAGES;
        const uint32_t w = base + slot * S::stage_bytes, x = w + S::w_bytes;
        wg::bar_wait(full0 + 8 * slot, (s / STAGES) & 1);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < GR_BK / 16; kk++) { /* 32 bytes of each swizzled row */
            const uint64_t b = wg::desc(x + kk * 32, 16, 1024);
#pragma unroll
            for (int t = 0; t < TILES; t++)
                wg::mma_ss_n64(d[t], wg::desc(w + t * 64 * 128 + kk * 32, 16, 1024), b);
        }
        wg::commit();
        /* the stage before is read once its products are done: one
         * stage's products stay in flight while this one's copy lands */
        wg::wait<1>();
        if (s > 0 && lane == 0)
            wg::bar_arrive(empty0 + 8 * ((s - 1) % STAGES));
    }
    wg::wait<0>();
#pragma unroll
    for (int t = 0; t < TILES; t++)
        wg::keep(d[t]);
    /* every stage has landed and been read by the whole group: the
     * stages' memory takes the sums, red[row of the round][tile row] */
    wg::named_sync(1, 128);
    float *red = (float *)smem;
#pragma unroll
    for (int t = 0; t < TILES; t++)
        wg::sums_to_smem(d[t], red, S::red_stride, 64 * t, warp, lane);
    wg::named_sync(1, 128);
    pdl_wait(); /* out may have been read by a kernel before (passed long since) */
    if constexpr (MODE == GR_SWIGLU) {
        /* two outputs a thread: g at tile row jj, u at HALF + jj */
        bf16 *o0 = (bf16 *)out;
        for (int idx = threadIdx.x; idx < rows * (HALF / 2); idx += 128) {
            const int m = idx / (HALF / 2), jj = 2 * (idx % (HALF / 2)), j = j0 + jj;
            const float2 g2 = *(const float2 *)(red + m * S::red_stride + jj);
            const float2 u2 = *(const float2 *)(red + m * S::red_stride + HALF + jj);
            const float g[2] = {__bfloat162float(__float2bfloat16_rn(g2.x)),
                                __bfloat162float(__float2bfloat16_rn(g2.y))};
            const float u[2] = {__bfloat162float(__float2bfloat16_rn(u2.x)),
                                __bfloat162float(__float2bfloat16_rn(u2.y))};
            bf16 h[2];
#pragma unroll
            for (int e = 0; e < 2; e++)
                h[e] = __float2bfloat16_rn(g[e] / (1.0f + expf(-g[e])) * u[e]);
            bf16 *o = o0 + (size_t)m * n + j;
            if (j + 1 < n && (uintptr_t)o % 4 == 0) {
                *(__nv_bfloat162 *)o = __halves2bfloat162(h[0], h[1]);
            } else {
                for (int e = 0; e < 2 && j + e < n; e++)
                    o[e] = h[e];
            }
        }
    } else {
        /* four f32 a thread; n a multiple of 4 (the caller's rule) */
        float *part = (float *)out + (size_t)blockIdx.y * rows * n;
        for (int idx = threadIdx.x; idx < rows * (S::rows / 4); idx += 128) {
            const int m = idx / (S::rows / 4), jj = 4 * (idx % (S::rows / 4)), j = j0 + jj;
            if (j < n)
                *(float4 *)(part + (size_t)m * n + j) =
                    *(const float4 *)(red + m * S::red_stride + jj);
        }
    }
#endif
}

/* cuda_ops.h: the tensor maps of the GEMMs' operands, from the backend's
 * cache, direct-mapped on the address (a map is the address and shape
 * encoded: a hit is exact, a miss is encoded again, at a graph's capture
 * in the decode rounds). The index mixes address bits far apart, so that
 * gate and up weights, whose addresses differ in high bits alone, take
 * different entries. */
bool cuda_gemm_map(cuda_state *st, const void *p, int k, int height, int box_rows, CUtensorMap *out)
{
    const uintptr_t a = (uintptr_t)p;
    cuda_gemm_tmap *t = &st->gemm_maps[((a >> 8) ^ (a >> 17) ^ (a >> 26)) % CUDA_GEMM_MAPS];
    if (t->ptr != p || t->k != k || t->height != height || t->box_rows != box_rows) {
        const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)height};
        const cuuint64_t strides[1] = {(cuuint64_t)k * 2};
        const cuuint32_t box[2] = {GR_BK, (cuuint32_t)box_rows};
        CUtensorMap m;
        if (!cuda_tmap_bf16(st, &m, 2, p, dims, strides, box, 128))
            return false;
        static_assert(sizeof m == sizeof t->map, "cuda_gemm_tmap.map holds a CUtensorMap");
        memcpy(t->map, &m, sizeof m);
        t->ptr = p;
        t->k = k;
        t->height = height;
        t->box_rows = box_rows;
    }
    memcpy(out, t->map, sizeof *out);
    return true;
}

/* matmul_swiglu's kernels by SHOAL_CUDA_GEMM_SWIGLU: 1 = halves of 96
 * rows, six stages (n = 12,288: 128 blocks, one a multiprocessor); 2 =
 * halves of 64, four stages, two blocks a multiprocessor (192 blocks; row
 * 30.1: slower); 3 = halves of 96, four stages (fewer bytes queued at the
 * memory; slower). */
struct gr_variant {
    void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, void *, int, int, int, int);
    int tile_rows; /* output columns a block: SWIGLU the half */
    size_t smem;
};

static const gr_variant gr_swiglu[] = {
    {gemm_rows<3, 6, GR_SWIGLU>, 96, gr_shape<3, 6>::smem},
    {gemm_rows<2, 4, GR_SWIGLU>, 64, gr_shape<2, 4>::smem},
    {gemm_rows<3, 4, GR_SWIGLU>, 96, gr_shape<3, 4>::smem},
};
enum { GR_SWIGLU_VARIANTS = sizeof gr_swiglu / sizeof gr_swiglu[0] };

/* matmul_add_rmsnorm's parts: tiles of 128 weight rows, six stages. */
static const gr_variant gr_parts = {gemm_rows<2, 6, GR_PARTS>, 128, gr_shape<2, 6>::smem};

static void gr_launch(cuda_state *st, const gr_variant *v, dim3 grid, const CUtensorMap &wmap,
                      const CUtensorMap &umap, const CUtensorMap &xmap, void *out, int rows, int n,
                      int ksteps)
{
    cuda_launch_pdl_smem(st->stream, grid, GR_THREADS, v->smem, v->kernel, wmap, umap, xmap, out,
                         rows, n, ksteps, st->gemm_rows_pre);
    st->gemm_rows_launches++;
}

bool cuda_gemm_swiglu(kernels_backend *be, void *out, const void *in, const void *wg,
                      const void *wu, int rows, int n, int k)
{
    cuda_state *st = cuda_of(be);
    if (st->gemm_swiglu < 1 || st->gemm_swiglu > GR_SWIGLU_VARIANTS || !st->sm90a ||
        !st->tmap_encode || rows < 2 || rows > GR_BM || k % 8 != 0 ||
        ((uintptr_t)in | (uintptr_t)wg | (uintptr_t)wu) % 16 != 0)
        return false;
    const gr_variant *v = &gr_swiglu[st->gemm_swiglu - 1];
    CUtensorMap gmap, umap, xmap;
    /* the stage's rows past the round's hold what the stage held before,
     * which reaches only the sums of those columns, never written */
    if (!cuda_gemm_map(st, wg, k, n, v->tile_rows, &gmap) ||
        !cuda_gemm_map(st, wu, k, n, v->tile_rows, &umap) ||
        !cuda_gemm_map(st, in, k, rows, rows, &xmap))
        return false;
    const unsigned blocks = (unsigned)((n + v->tile_rows - 1) / v->tile_rows);
    gr_launch(st, v, dim3(blocks), gmap, umap, xmap, out, rows, n, (k + GR_BK - 1) / GR_BK);
    cuda_launched(be, "matmul_swiglu (gemm)");
    return true;
}

bool cuda_gemm_parts(kernels_backend *be, float *parts, const void *in, const void *w, int rows,
                     int n, int k, int nparts)
{
    cuda_state *st = cuda_of(be);
    if (!st->gemm_rows_parts || !st->sm90a || !st->tmap_encode || rows < 2 || rows > GR_BM ||
        n % 4 != 0 || nparts < 1 || k % (GR_BK * nparts) != 0 ||
        ((uintptr_t)in | (uintptr_t)w) % 16 != 0)
        return false;
    CUtensorMap wmap, xmap;
    if (!cuda_gemm_map(st, w, k, n, gr_parts.tile_rows, &wmap) ||
        !cuda_gemm_map(st, in, k, rows, rows, &xmap))
        return false;
    const dim3 grid((unsigned)((n + gr_parts.tile_rows - 1) / gr_parts.tile_rows),
                    (unsigned)nparts);
    gr_launch(st, &gr_parts, grid, wmap, wmap, xmap, parts, rows, n, k / GR_BK / nparts);
    cuda_launched(be, "matmul_add_rmsnorm (gemm parts)");
    return true;
}

shoal_err cuda_gemm_rows_init(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    if (!st->sm90a || !st->tmap_encode) {
        /* cuBLAS's GEMMs and the passes serve */
        st->gemm_swiglu = 0;
        st->gemm_rows_parts = false;
        return SHOAL_OK;
    }
    for (const gr_variant &v : gr_swiglu)
        if (cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)v.smem) != cudaSuccess)
            goto fail;
    if (cudaFuncSetAttribute(gr_parts.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)gr_parts.smem) != cudaSuccess)
        goto fail;
    return SHOAL_OK;
fail:
    cuda_fail(be, "gemm_rows: raise the shared-memory limit", cudaGetLastError());
    return st->err;
}
