/* The split-K GEMM of a decode round: out[rows][n] = in[rows][k] x
 * w[n][k]^T, bf16, for 2 to SK_BM rows (matmul.cu sends it those where
 * SHOAL_CUDA_GEMM_SPLITK=1; off by default: measured slower than cuBLAS
 * in the model, kernels/lab/README.md row 18.1).
 *
 * Why: at 64 rows cuBLAS's GEMMs read the weights at 2.8-3.7 TB/s on the
 * H200 (the q/k/v, o and down projections of the 8B shape) where a copy
 * runs at 4.3: a tile of 128 weight rows by 64 rows is one block, and n of
 * 4,096 makes 32 tiles for 132 multiprocessors.
 *
 * How: each tile's k is split over the S blocks of a thread-block cluster
 * (splitk_shape picks S and the stages: the most stages in flight of the
 * shapes whose clusters all fit at once). A block streams its k range in
 * stages of 64 (eight where it has a multiprocessor to itself, four where
 * two share one): a producer warp copies the tile's 128 weight rows (past
 * n: zeros) and the round's rows by the tensor memory accelerator, and one
 * warpgroup multiplies them on the tensor cores (wgmma m64n64k16, twice a
 * k16 step: weight rows 0-63 and 64-127). At the end every block writes
 * its f32 sums to its shared memory, and block r of the cluster adds the
 * S blocks' sums of its share of the rows through distributed shared
 * memory, in rank order, and writes them as bf16: the result does not
 * depend on scheduling, with no workspace, atomics or second kernel.
 *
 * The weights of the first stages are copied before the wait on the
 * kernel before (programmatic launch): they do not depend on it.
 *
 * Measured (H200, shoal-lab-ops --gemm): 1-3 us faster than cuBLAS at 2
 * to 32 rows for o and down, 1-3 us slower at 64 rows for q/k/v and o,
 * even for down; in the model slower at batch 16 and 64 all the same. */
#include "cuda_ops.h"
#include "wgmma.cuh"

extern "C" {
#include "common/common_log.h"
}

#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

enum {
    SK_BN = 128,       /* weight rows a block (two m64 halves) */
    SK_BM = 64,        /* rows of the round at most (wgmma's n) */
    SK_BK = 64,        /* k a stage: one 128-byte swizzled row */
    SK_STAGES_2 = 4,   /* stages where two blocks share a multiprocessor */
    SK_STAGES_1 = 8,   /* where a block has one to itself */
    SK_THREADS = 160,  /* a warpgroup and the producer warp */
    SK_SPLITS_MAX = 8, /* the portable cluster size */
    SK_W_BYTES = SK_BN * SK_BK * 2,
    SK_X_BYTES = SK_BM * SK_BK * 2,
    SK_STAGE_BYTES = SK_W_BYTES + SK_X_BYTES,
    SK_RED_STRIDE = SK_BN + 4, /* f32 a row of the sums: no bank conflicts */
};

static constexpr size_t splitk_smem_bytes(int stages)
{
    return 1024 /* alignment to the swizzle's repeat */ + (size_t)stages * SK_STAGE_BYTES;
}
static_assert((size_t)SK_BM * SK_RED_STRIDE * 4 <= (size_t)SK_STAGES_2 * SK_STAGE_BYTES,
              "the sums fit in the stages' memory");

template <int SK_STAGES>
static __global__ void __launch_bounds__(SK_THREADS, SK_STAGES == SK_STAGES_2 ? 2 : 1)
    gemm_splitk(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                bf16 *out, int rows, int n, int ksteps)
{
#ifdef SHOAL_WGMMA
    extern __shared__ unsigned char sk_raw[];
    __shared__ alignas(8) uint64_t full[SK_STAGES], empty[SK_STAGES];
    cg::cluster_group cluster = cg::this_cluster();
    const int splits = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int tile = (int)blockIdx.x / splits;
    const int s0 = rank * ksteps / splits, steps = (rank + 1) * ksteps / splits - s0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned char *smem = wg::align_1024(sk_raw);
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(full);
    const uint32_t empty0 = (uint32_t)__cvta_generic_to_shared(empty);
    wg::stages_init(full0, empty0, SK_STAGES, 4); /* lane 0 of each computing warp */
    __syncthreads();
    pdl_trigger();
    if (warp == 4) {
        if (lane == 0) {
            const int pre = steps < SK_STAGES ? steps : SK_STAGES;
            const uint32_t stage_bytes = SK_W_BYTES + (uint32_t)rows * SK_BK * 2;
            for (int s = 0; s < pre; s++) {
                wg::bar_arrive_expect(full0 + 8 * s, stage_bytes);
                wg::tma_load_2d(base + s * SK_STAGE_BYTES, &wmap, (s0 + s) * SK_BK, tile * SK_BN,
                                full0 + 8 * s);
            }
            pdl_wait(); /* the rows are the kernel before's output */
            for (int s = 0; s < pre; s++)
                wg::tma_load_2d(base + s * SK_STAGE_BYTES + SK_W_BYTES, &xmap, (s0 + s) * SK_BK, 0,
                                full0 + 8 * s);
            for (int s = pre; s < steps; s++) {
                const int slot = s % SK_STAGES;
                const uint32_t st = base + slot * SK_STAGE_BYTES;
                wg::bar_wait(empty0 + 8 * slot, ((s / SK_STAGES) & 1) ^ 1);
                wg::bar_arrive_expect(full0 + 8 * slot, stage_bytes);
                wg::tma_load_2d(st, &wmap, (s0 + s) * SK_BK, tile * SK_BN, full0 + 8 * slot);
                wg::tma_load_2d(st + SK_W_BYTES, &xmap, (s0 + s) * SK_BK, 0, full0 + 8 * slot);
            }
        }
        __syncwarp(); /* the warp whole again at the cluster's barrier */
    } else {
        float d0[8][4], d1[8][4]; /* weight rows 0-63, 64-127 by the round's 64 rows */
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                d0[i][e] = d1[i][e] = 0.0f;
        for (int s = 0; s < steps; s++) {
            const int slot = s % SK_STAGES;
            const uint32_t w = base + slot * SK_STAGE_BYTES, x = w + SK_W_BYTES;
            wg::bar_wait(full0 + 8 * slot, (s / SK_STAGES) & 1);
            wg::fence();
#pragma unroll
            for (int kk = 0; kk < SK_BK / 16; kk++) { /* 32 bytes of each swizzled row */
                const uint64_t b = wg::desc(x + kk * 32, 16, 1024);
                wg::mma_ss_n64(d0, wg::desc(w + kk * 32, 16, 1024), b);
                wg::mma_ss_n64(d1, wg::desc(w + 64 * 128 + kk * 32, 16, 1024), b);
            }
            wg::commit();
            wg::wait<0>();
            wg::keep(d0);
            wg::keep(d1);
            if (lane == 0)
                wg::bar_arrive(empty0 + 8 * slot);
        }
        /* every stage has landed and been read by the whole group: the
         * stages' memory takes the sums, red[row of the round][weight row] */
        wg::named_sync(1, 128);
        float *red = (float *)smem;
        wg::sums_to_smem(d0, red, SK_RED_STRIDE, 0, warp, lane);
        wg::sums_to_smem(d1, red, SK_RED_STRIDE, 64, warp, lane);
    }
    cluster.sync(); /* every block's sums written */
    pdl_wait();     /* out may still be read by the kernel before (passed already) */
    /* block `rank` adds the cluster's sums of its share of the round's rows,
     * four weight rows a thread; every block's four loaded before the first
     * add (distributed shared memory is far: one wait, not `splits`), then
     * added in rank order */
    const int m0 = rank * SK_BM / splits, m1 = (rank + 1) * SK_BM / splits;
    const int m_end = m1 < rows ? m1 : rows;
    const float *red = (const float *)smem;
    for (int idx = threadIdx.x; idx < (m_end - m0) * (SK_BN / 4); idx += SK_THREADS) {
        const int m = m0 + idx / (SK_BN / 4), j = 4 * (idx % (SK_BN / 4));
        const int col = tile * SK_BN + j;
        if (col >= n)
            continue;
        float4 part[SK_SPLITS_MAX];
#pragma unroll
        for (int q = 0; q < SK_SPLITS_MAX; q++)
            if (q < splits)
                part[q] = *(const float4 *)(cluster.map_shared_rank(red, q) +
                                            m * SK_RED_STRIDE + j);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int q = 0; q < SK_SPLITS_MAX; q++)
            if (q < splits) {
                v[0] += part[q].x;
                v[1] += part[q].y;
                v[2] += part[q].z;
                v[3] += part[q].w;
            }
        bf16 *o = out + (size_t)m * n + col;
        if (col + 3 < n && (uintptr_t)o % 8 == 0) {
            __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v[0], v[1]),
                                   __floats2bfloat162_rn(v[2], v[3])};
            *(uint2 *)o = *(const uint2 *)h;
        } else {
            for (int e = 0; e < 4 && col + e < n; e++)
                o[e] = __float2bfloat16_rn(v[e]);
        }
    }
    cluster.sync(); /* no block leaves while another reads its sums */
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
        const cuuint32_t box[2] = {SK_BK, (cuuint32_t)box_rows};
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

/* The launch's shape: the blocks a tile's k is split over (S) and the
 * stages a block. Of the shapes whose clusters all fit on the GPU at once
 * (one wave; clusters of 4 with eight stages do not for 32 tiles on the
 * H200: 30 fit), the one with the most stages in flight, at most eight a
 * multiprocessor; on a tie the fewer blocks (fewer sums to add).
 * SHOAL_CUDA_GEMM_SPLITK_S and _STAGES fix either. */
static void splitk_shape(const cuda_state *st, int tiles, int ksteps, int *splits, int *stages)
{
    static const int stage_counts[2] = {SK_STAGES_1, SK_STAGES_2};
    const int cap = st->sm_count * SK_STAGES_1;
    /* a fixed shape is taken even where it takes two waves */
    const bool fixed = st->gemm_splitk_s > 0 && st->gemm_splitk_stages > 0;
    int best_score = -1;
    *splits = 1;
    *stages = SK_STAGES_2;
    for (int si = 0; si < 2; si++) {
        const int t = stage_counts[si];
        if (st->gemm_splitk_stages > 0 && st->gemm_splitk_stages != t)
            continue;
        for (int s = 1; s <= SK_SPLITS_MAX && s <= ksteps; s++) {
            if (st->gemm_splitk_s > 0 && st->gemm_splitk_s != s)
                continue;
            const bool fits = tiles <= st->gemm_clusters[si][s];
            const int slots = tiles * s * t;
            const int score = slots < cap ? slots : cap;
            if ((fits || fixed) && score > best_score) {
                best_score = score;
                *splits = s;
                *stages = t;
            }
        }
    }
}

bool cuda_matmul_splitk(kernels_backend *be, void *out, const void *in, const void *w, int rows,
                        int n, int k)
{
    cuda_state *st = cuda_of(be);
    if (!st->gemm_splitk || !st->sm90a || !st->tmap_encode || rows < 2 || rows > SK_BM ||
        k % SK_BK != 0 || (uintptr_t)in % 16 != 0 || (uintptr_t)w % 16 != 0)
        return false;
    CUtensorMap wmap, xmap;
    /* the rows' box is the round's rows: the tile's columns past them hold
     * what the stage held before, which reaches only the sums of those
     * columns, never written */
    if (!cuda_gemm_map(st, w, k, n, SK_BN, &wmap) || !cuda_gemm_map(st, in, k, rows, rows, &xmap))
        return false;
    const int tiles = (n + SK_BN - 1) / SK_BN, ksteps = k / SK_BK;
    int splits, stages;
    splitk_shape(st, tiles, ksteps, &splits, &stages);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(tiles * splits));
    cfg.blockDim = dim3(SK_THREADS);
    cfg.dynamicSmemBytes = splitk_smem_bytes(stages);
    cfg.stream = st->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)splits;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    if (stages == SK_STAGES_1)
        cudaLaunchKernelEx(&cfg, gemm_splitk<SK_STAGES_1>, wmap, xmap, (bf16 *)out, rows, n,
                           ksteps);
    else
        cudaLaunchKernelEx(&cfg, gemm_splitk<SK_STAGES_2>, wmap, xmap, (bf16 *)out, rows, n,
                           ksteps);
    cuda_launched(be, "matmul (split-k)");
    return true;
}

shoal_err cuda_matmul_splitk_init(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    memset(st->gemm_maps, 0, sizeof st->gemm_maps);
    if (!st->gemm_splitk)
        return SHOAL_OK;
    if (!st->sm90a || !st->tmap_encode) {
        LOG_WARN("cuda: SHOAL_CUDA_GEMM_SPLITK asks for the split-K GEMM, which needs sm_90a "
                 "code and the driver's tensor-map encoder; cuBLAS serves");
        st->gemm_splitk = false;
        return SHOAL_OK;
    }
    cudaError_t e = cudaFuncSetAttribute(gemm_splitk<SK_STAGES_1>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)splitk_smem_bytes(SK_STAGES_1));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_splitk<SK_STAGES_2>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)splitk_smem_bytes(SK_STAGES_2));
    /* how many clusters of each size fit at once, for splitk_shape */
    for (int si = 0; si < 2 && e == cudaSuccess; si++)
        for (int s = 1; s <= SK_SPLITS_MAX && e == cudaSuccess; s++) {
            const int stages = si == 0 ? SK_STAGES_1 : SK_STAGES_2;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)s);
            cfg.blockDim = dim3(SK_THREADS);
            cfg.dynamicSmemBytes = splitk_smem_bytes(stages);
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = (unsigned)s;
            attr.val.clusterDim.y = 1;
            attr.val.clusterDim.z = 1;
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
            int n = 0;
            e = si == 0 ? cudaOccupancyMaxActiveClusters(&n, gemm_splitk<SK_STAGES_1>, &cfg)
                        : cudaOccupancyMaxActiveClusters(&n, gemm_splitk<SK_STAGES_2>, &cfg);
            st->gemm_clusters[si][s] = n;
        }
    if (e != cudaSuccess)
        cuda_fail(be, "matmul split-k: raise the shared-memory limit, count its clusters", e);
    else
        LOG_INFO("cuda: split-K GEMM: clusters of 1-8 at once: %d %d %d %d %d %d %d %d (8 "
                 "stages), %d %d %d %d %d %d %d %d (4)",
                 st->gemm_clusters[0][1], st->gemm_clusters[0][2], st->gemm_clusters[0][3],
                 st->gemm_clusters[0][4], st->gemm_clusters[0][5], st->gemm_clusters[0][6],
                 st->gemm_clusters[0][7], st->gemm_clusters[0][8], st->gemm_clusters[1][1],
                 st->gemm_clusters[1][2], st->gemm_clusters[1][3], st->gemm_clusters[1][4],
                 st->gemm_clusters[1][5], st->gemm_clusters[1][6], st->gemm_clusters[1][7],
                 st->gemm_clusters[1][8]);
    return st->err;
}
