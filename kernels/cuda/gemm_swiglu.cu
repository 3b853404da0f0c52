/* matmul_swiglu past the GEMV's rows: out[r][j] = silu(g) * u, where g
 * and u are row r of `in` times rows j of the gate and up weights, bf16,
 * for 2 to GS_BM rows (a decode round, a short prompt), as one kernel:
 * no projections through memory, no swiglu pass.
 *
 * Why: at 64 rows cuBLAS's batched GEMM of gate and up (24,576 x 4,096
 * on the 8B shape) reads its 201 MB in 53.5 us on the H200 where the copy
 * bandwidth takes 46.9, and the swiglu pass after it adds 2.5 us a layer
 * (kernels/lab/README.md, the twenty-third session's trace).
 *
 * How: a block takes GS_HALF gate rows and the same up rows (a tile of
 * 2 GS_HALF weight rows), all of k: n = 12,288 makes 128 blocks, one a
 * multiprocessor, each streaming 1.5 MB, where the round's rows are a
 * third of the weights' bytes read from L2. A producer warp copies
 * stages of 64 k by the tensor memory accelerator (the gate box, the up
 * box below it, then the round's rows; boxes past n or k land as zeros)
 * and one warpgroup multiplies them on the tensor cores, the weights as
 * the A operand (m64: the tile's rows in 64-row slices) and the rows as
 * B (wgmma m64n64k16), one stage's products in flight while it waits for
 * the next. The weights of the first stages are copied before the wait
 * on the kernel before (programmatic launch): they do not depend on it.
 * At the end the f32 sums go through shared memory, g and u rounded to
 * bf16 as the stored projections are, silu(g) * u as the swiglu kernel
 * forms it. */
#include "cuda_ops.h"
#include "wgmma.cuh"

extern "C" {
#include "common/common_log.h"
}

#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

enum {
    GS_BM = 64,       /* rows of the round at most (wgmma's n) */
    GS_BK = 64,       /* k a stage: one 128-byte swizzled row */
    GS_THREADS = 160, /* a warpgroup and the producer warp */
    GS_X_BYTES = GS_BM * GS_BK * 2,
};

template <int HALF, int STAGES> struct gs_shape {
    static constexpr int tiles = 2 * HALF / 64; /* m64 slices of the tile */
    static constexpr int w_bytes = 2 * HALF * GS_BK * 2;
    static constexpr int stage_bytes = w_bytes + GS_X_BYTES;
    static constexpr int red_stride = 2 * HALF + 4; /* f32 a row of the sums: no conflicts */
    static constexpr size_t smem =
        1024 /* the swizzle's alignment */ + (size_t)STAGES * stage_bytes;
    static_assert(2 * HALF % 64 == 0, "the tile is whole m64 slices");
    static_assert((size_t)GS_BM * red_stride * 4 <= (size_t)STAGES * stage_bytes,
                  "the sums fit in the stages' memory");
};

template <int HALF, int STAGES, int CL>
static __global__ void __launch_bounds__(GS_THREADS, 1)
    gemm_swiglu(const __grid_constant__ CUtensorMap gmap, const __grid_constant__ CUtensorMap umap,
                const __grid_constant__ CUtensorMap xmap, bf16 *out, int rows, int n, int ksteps,
                int xbox, int pre_max)
{
#ifdef SHOAL_WGMMA
    using S = gs_shape<HALF, STAGES>;
    extern __shared__ unsigned char gs_raw[];
    __shared__ alignas(8) uint64_t full[STAGES], empty[STAGES];
    const int j0 = (int)blockIdx.x * HALF;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* CL > 1: the cluster's blocks take the same rows of the round, each
     * copying its share (xbox rows) into every block's stage */
    const uint32_t rank = CL > 1 ? (uint32_t)cg::this_cluster().block_rank() : 0;
    unsigned char *smem = gs_raw + ((1024 - ((uintptr_t)gs_raw & 1023)) & 1023);
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(full);
    const uint32_t empty0 = (uint32_t)__cvta_generic_to_shared(empty);
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            wg::bar_init(full0 + 8 * i, 1);
            wg::bar_init(empty0 + 8 * i, 4 * CL); /* lane 0 of each computing warp, each block */
        }
        wg::bar_init_fence();
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* every block's barriers set before a copy lands */
    else
        __syncthreads();
    pdl_trigger();
    if (warp == 4) {
        if (lane == 0) {
            int pre = ksteps < STAGES ? ksteps : STAGES;
            pre = pre < pre_max ? pre : pre_max;
            const uint32_t stage_bytes = S::w_bytes + (uint32_t)(CL * xbox) * GS_BK * 2;
            const uint32_t xoff = S::w_bytes + rank * (uint32_t)xbox * 128;
            auto weights = [&](int s, uint32_t st, uint32_t bar) {
                wg::bar_arrive_expect(bar, stage_bytes);
                wg::tma_load_2d(st, &gmap, s * GS_BK, j0, bar);
                wg::tma_load_2d(st + HALF * 128, &umap, s * GS_BK, j0, bar);
            };
            auto xrows = [&](int s, uint32_t st, uint32_t bar) {
                if constexpr (CL > 1)
                    wg::tma_load_2d_multicast(st + xoff, &xmap, s * GS_BK, (int)rank * xbox, bar,
                                              (uint16_t)((1u << CL) - 1));
                else
                    wg::tma_load_2d(st + xoff, &xmap, s * GS_BK, 0, bar);
            };
            for (int s = 0; s < pre; s++)
                weights(s, base + s * S::stage_bytes, full0 + 8 * s);
            pdl_wait(); /* the rows are the kernel before's output */
            for (int s = 0; s < pre; s++)
                xrows(s, base + s * S::stage_bytes, full0 + 8 * s);
            for (int s = pre; s < ksteps; s++) {
                const int slot = s % STAGES;
                const uint32_t st = base + slot * S::stage_bytes, bar = full0 + 8 * slot;
                /* a fresh slot's wait passes at once (parity 1) */
                wg::bar_wait_cluster(empty0 + 8 * slot, ((s / STAGES) & 1) ^ 1);
                weights(s, st, bar);
                xrows(s, st, bar);
            }
        }
    } else {
        float d[S::tiles][8][4]; /* the tile's weight rows (64 a slice) by the round's rows */
#pragma unroll
        for (int t = 0; t < S::tiles; t++)
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
            for (int kk = 0; kk < GS_BK / 16; kk++) { /* 32 bytes of each swizzled row */
                const uint64_t b = wg::desc(x + kk * 32, 16, 1024);
#pragma unroll
                for (int t = 0; t < S::tiles; t++)
                    wg::mma_ss_n64(d[t], wg::desc(w + t * 64 * 128 + kk * 32, 16, 1024), b);
            }
            wg::commit();
            /* the stage before is read once its products are done: one
             * stage's products stay in flight while this one's copy lands */
            wg::wait<1>();
            if (s > 0 && lane == 0) {
                const uint32_t bar = empty0 + 8 * ((s - 1) % STAGES);
                wg::bar_arrive(bar);
                for (int r = 0; r < CL; r++)
                    if (r != (int)rank)
                        wg::bar_arrive_remote(bar, (uint32_t)r);
            }
        }
        wg::wait<0>();
#pragma unroll
        for (int t = 0; t < S::tiles; t++)
            wg::keep(d[t]);
        /* every stage has landed and been read by the whole group: the
         * stages' memory takes the sums, red[row of the round][tile row]
         * (a cluster's copies into it are done: each was waited for) */
        wg::named_sync(1, 128);
        float *red = (float *)smem;
        const int wr = 16 * warp + (lane >> 2), col = 2 * (lane & 3);
#pragma unroll
        for (int t = 0; t < S::tiles; t++)
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    red[(8 * i + col + (e & 1)) * S::red_stride + 64 * t + wr + (e >> 1) * 8] =
                        d[t][i][e];
        wg::named_sync(1, 128);
        pdl_wait(); /* out may have been read by a kernel before (passed long since) */
        /* two outputs a thread: g at tile row jj, u at HALF + jj */
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
            bf16 *o = out + (size_t)m * n + j;
            if (j + 1 < n && (uintptr_t)o % 4 == 0) {
                *(__nv_bfloat162 *)o = __halves2bfloat162(h[0], h[1]);
            } else {
                for (int e = 0; e < 2 && j + e < n; e++)
                    o[e] = h[e];
            }
        }
    }
    /* no block leaves while a block of its cluster may still copy into its
     * memory or arrive on its barriers */
    if constexpr (CL > 1)
        cg::this_cluster().sync();
#endif
}

/* The kernels by SHOAL_CUDA_GEMM_SWIGLU: 1 = halves of 96 rows, six
 * stages (n = 12,288: 128 blocks, one a multiprocessor); 2 = halves of
 * 64, four stages, two blocks a multiprocessor (192 blocks); 3 = halves
 * of 96, four stages (fewer bytes queued at the memory); 4 = 1 in
 * clusters of two, each block copying half of the round's rows into both
 * (a third of 1's reads from L2 gone at 64 rows). */
struct gs_variant {
    void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, bf16 *, int, int, int, int, int);
    int half, cluster;
    size_t smem;
};

static const gs_variant gs_variants[] = {
    {gemm_swiglu<96, 6, 1>, 96, 1, gs_shape<96, 6>::smem},
    {gemm_swiglu<64, 4, 1>, 64, 1, gs_shape<64, 4>::smem},
    {gemm_swiglu<96, 4, 1>, 96, 1, gs_shape<96, 4>::smem},
    {gemm_swiglu<96, 6, 2>, 96, 2, gs_shape<96, 6>::smem},
};
enum { GS_VARIANTS = sizeof gs_variants / sizeof gs_variants[0] };

bool cuda_gemm_swiglu(kernels_backend *be, void *out, const void *in, const void *wg,
                      const void *wu, int rows, int n, int k)
{
    cuda_state *st = cuda_of(be);
    if (st->gemm_swiglu < 1 || st->gemm_swiglu > GS_VARIANTS || !st->sm90a ||
        !st->tmap_encode || rows < 2 || rows > GS_BM || k % 8 != 0 ||
        ((uintptr_t)in | (uintptr_t)wg | (uintptr_t)wu) % 16 != 0)
        return false;
    const gs_variant *v = &gs_variants[st->gemm_swiglu - 1];
    /* a cluster's blocks copy xbox rows each, a multiple of 8 (a whole
     * repeat of the swizzle); rows past the round's land as zeros */
    const int xbox = v->cluster == 1 ? rows : ((rows + v->cluster - 1) / v->cluster + 7) / 8 * 8;
    CUtensorMap gmap, umap, xmap;
    /* the stage's rows past the round's hold what the stage held before,
     * which reaches only the sums of those columns, never written */
    if (!cuda_gemm_map(st, wg, k, n, v->half, &gmap) ||
        !cuda_gemm_map(st, wu, k, n, v->half, &umap) ||
        !cuda_gemm_map(st, in, k, rows, xbox, &xmap))
        return false;
    unsigned blocks = (unsigned)((n + v->half - 1) / v->half);
    blocks = (blocks + v->cluster - 1) / v->cluster * v->cluster; /* whole clusters */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(GS_THREADS);
    cfg.dynamicSmemBytes = v->smem;
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = (unsigned)v->cluster;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    cudaLaunchKernelEx(&cfg, v->kernel, gmap, umap, xmap, (bf16 *)out, rows, n,
                       (k + GS_BK - 1) / GS_BK, xbox, st->gemm_swiglu_pre);
    cuda_launched(be, "matmul_swiglu (gemm)");
    return true;
}

shoal_err cuda_gemm_swiglu_init(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    if (st->gemm_swiglu == 0)
        return SHOAL_OK;
    if (!st->sm90a || !st->tmap_encode) {
        st->gemm_swiglu = 0; /* cuBLAS's batched GEMM and the swiglu pass serve */
        return SHOAL_OK;
    }
    for (const gs_variant &v : gs_variants) {
        cudaError_t e = cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)v.smem);
        if (e != cudaSuccess) {
            cuda_fail(be, "matmul_swiglu gemm: raise the shared-memory limit", e);
            return st->err;
        }
    }
    return SHOAL_OK;
}
