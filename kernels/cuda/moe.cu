/* Mixture of experts: the twin of kernels/cpu/moe.c.
 *
 * Routing is one warp a row (softmax over the experts, then top-k by warp
 * arg-max). No step synchronises with the host, so a decode round that
 * routes stays one recorded graph, and only experts some row routes to
 * are read.
 *
 * Rounds of more than GEMV_ROWS rows run a grouped GEMM over the (row,
 * slot) pairs sorted by expert:
 *   1. one block counts the pairs of each expert, places each pair in its
 *      expert's run and cuts every run into tiles of TILE_M pairs (the
 *      tile list and its length stay on the device);
 *   2. gate/up: a block a (tile, GEMM_COLS_GU columns), A the tile's input
 *      rows gathered by pair, B the expert's gate and up rows, mma.sync
 *      bf16 over cp.async stages; silu(g) * u (g and u rounded to bf16 as
 *      matmul_swiglu stores them) into the pairs' hidden rows;
 *   3. down: the same GEMM over the hidden rows and the expert's down rows;
 *   4. each row's output: the slots' outputs weighted, in slot order.
 * The grid has room for the most tiles a round can have (pairs / TILE_M,
 * plus one a routed expert); blocks past the count the sort wrote return
 * at once. Each tile reads its expert's weights once.
 *
 * Rounds of at most GEMV_ROWS rows take GEMVs by pair instead (no sort;
 * a one-row round reads its top-k experts' bytes once). Element dtypes
 * other than bf16 (the f32 exact mode) take plain per-pair kernels of the
 * same function. */
#include "attention_mma.cuh"
#include "cuda_ops.h"

#include "common/common_limits.h"

using namespace mma;

enum {
    TILE_M = 64,          /* pairs of a tile */
    GEMM_COLS_GU = 64,    /* gate/up: columns of each of the two matrices a block */
    GEMM_COLS_DOWN = 128, /* down: columns a block */
    GEMM_B_ROWS = 128,    /* weight rows of a stage, both ways */
    TILE_K = 64,
    STAGES = 4,
    ROW_HALVES = TILE_K + 8, /* a smem row: 144 bytes, so ldmatrix's 8 rows hit 8 bank groups */
    GEMM_THREADS = 256,
};
static_assert(2 * GEMM_COLS_GU == GEMM_B_ROWS && GEMM_COLS_DOWN == GEMM_B_ROWS,
              "a stage holds the block's weight rows, both ways");
static_assert(GEMM_THREADS / 8 * 2 == TILE_M && GEMM_THREADS / 8 * 4 == GEMM_B_ROWS && TILE_K == 64,
              "a thread copies 2 A and 4 B chunks of 16 bytes a stage");
static_assert(GEMM_COLS_GU % 64 == 0 && GEMM_COLS_DOWN % 64 == 0,
              "four warps across the columns, ldmatrix pairs of 16");

/* ---- routing ---- */

static __global__ void moe_route_kernel(int32_t *ids, float *weights, const float *logits, int rows,
                                        int experts, int topk, bool renorm)
{
    constexpr int PER_LANE = SHOAL_MODEL_EXPERTS_MAX / 32;
    pdl_trigger();
    pdl_wait(); /* the router's logits */
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const float *l = logits + (size_t)row * experts;
    float p[PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int e = i * 32 + lane;
        p[i] = e < experts ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    for (int o = 16; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        p[i] = i * 32 + lane < experts ? expf(p[i] - mx) : -1.0f; /* -1: never picked */
        sum += fmaxf(p[i], 0.0f);
    }
    sum = warp_reduce(sum, op_add());
    float picked = 0.0f, mine = 0.0f;
    int my_id = 0;
    for (int j = 0; j < topk; j++) {
        float best = -2.0f;
        int at = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (p[i] > best) { /* the lane's lowest index wins a tie: i ascends */
                best = p[i];
                at = i * 32 + lane;
            }
        for (int o = 16; o > 0; o /= 2) {
            float b2 = __shfl_xor_sync(0xffffffffu, best, o);
            int a2 = __shfl_xor_sync(0xffffffffu, at, o);
            if (b2 > best || (b2 == best && a2 < at)) {
                best = b2;
                at = a2;
            }
        }
        if (at % 32 == lane) {
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                if (i == at / 32)
                    p[i] = -2.0f;
        }
        float w = best / sum;
        picked += w;
        if (lane == j) {
            mine = w;
            my_id = at;
        }
    }
    if (lane < topk) {
        ids[(size_t)row * topk + lane] = my_id;
        weights[(size_t)row * topk + lane] = renorm ? mine / picked : mine;
    }
}

void cuda_moe_route(kernels_backend *be, int32_t *ids, float *weights, const float *logits,
                    int rows, int experts, int topk, bool renorm)
{
    SHOAL_ASSERT(rows >= 0 && topk >= 1 && topk <= experts && topk <= 32 &&
                 experts <= SHOAL_MODEL_EXPERTS_MAX);
    if (rows == 0 || !cuda_usable(be))
        return;
    cuda_launch_pdl(cuda_of(be)->stream, dim3((unsigned)(rows + 3) / 4), 128, moe_route_kernel, ids,
                    weights, logits, rows, experts, topk, renorm);
    cuda_launched(be, "moe_route");
}

/* ---- the scratch ---- */

typedef struct moe_scratch {
    int32_t *offsets;                 /* [experts + 1]: each expert's run of sorted pairs */
    int32_t *ntiles;                  /* [1] */
    int32_t *tile_expert, *tile_row0; /* [tiles_max] */
    int32_t *sorted, *place;          /* [pairs]: pair at a sorted place, and back */
    void *h;                          /* [pairs][n] act: the experts' hidden rows */
    void *y;                          /* [pairs][k] act: the experts' outputs */
} moe_scratch;

/* The most tiles `pairs` pairs over `experts` experts cut into: whole
 * tiles, plus at most one partial tile for each expert that has a pair. */
static int tiles_max(int pairs, int experts)
{
    return (pairs + TILE_M - 1) / TILE_M + (experts < pairs ? experts : pairs);
}

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static size_t scratch_layout(int rows, int topk, int n, int k, size_t act, unsigned char *base,
                             moe_scratch *s)
{
    size_t pairs = (size_t)rows * (size_t)topk, at = 0;
    size_t offs[7];
    offs[0] = at, at = align256(at + (SHOAL_MODEL_EXPERTS_MAX + 1) * 4);
    offs[1] = at, at = align256(at + 4);
    offs[2] = at, at = align256(at + (size_t)tiles_max((int)pairs, SHOAL_MODEL_EXPERTS_MAX) * 4);
    offs[3] = at, at = align256(at + (size_t)tiles_max((int)pairs, SHOAL_MODEL_EXPERTS_MAX) * 4);
    offs[4] = at, at = align256(at + pairs * 4);
    offs[5] = at, at = align256(at + pairs * 4);
    offs[6] = at, at = align256(at + pairs * (size_t)n * act);
    size_t y = at;
    at = align256(at + pairs * (size_t)k * act);
    if (s) {
        s->offsets = (int32_t *)(base + offs[0]);
        s->ntiles = (int32_t *)(base + offs[1]);
        s->tile_expert = (int32_t *)(base + offs[2]);
        s->tile_row0 = (int32_t *)(base + offs[3]);
        s->sorted = (int32_t *)(base + offs[4]);
        s->place = (int32_t *)(base + offs[5]);
        s->h = base + offs[6];
        s->y = base + y;
    }
    return at;
}

size_t cuda_moe_scratch_bytes(kernels_backend *be, int rows, int topk, int n, int k)
{
    return scratch_layout(rows, topk, n, k, shoal_dtype_bytes(be->act_dtype), NULL, NULL);
}

/* ---- 1. the pairs by expert, and the tiles ---- */

static __global__ void moe_sort_kernel(moe_scratch s, const int32_t *ids, int pairs, int experts)
{
    __shared__ int count[SHOAL_MODEL_EXPERTS_MAX], cursor[SHOAL_MODEL_EXPERTS_MAX],
        tile_at[SHOAL_MODEL_EXPERTS_MAX + 1];
    pdl_trigger();
    pdl_wait(); /* the routing */
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0, tiles = 0;
        for (int e = 0; e < experts; e++) {
            s.offsets[e] = at;
            cursor[e] = at;
            tile_at[e] = tiles;
            at += count[e];
            tiles += (count[e] + TILE_M - 1) / TILE_M;
        }
        s.offsets[experts] = at;
        tile_at[experts] = tiles;
        *s.ntiles = tiles;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        for (int t = tile_at[e]; t < tile_at[e + 1]; t++) {
            s.tile_expert[t] = e;
            s.tile_row0[t] = s.offsets[e] + (t - tile_at[e]) * TILE_M;
        }
    /* the order within an expert's run varies from run to run; no result
     * depends on it (a GEMM row's sums do not depend on its tile row) */
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int at = atomicAdd(&cursor[ids[p]], 1);
        s.sorted[at] = p;
        s.place[p] = at;
    }
}

/* ---- 2 and 3. the grouped GEMM ---- */

/* C[pairs of a tile][N] = A[.][K] x B_e[N][K]^T for the tile's expert e.
 * GATE_UP: A row i is the input row of pair sorted[row0 + i] (in [rows][K]),
 * B the gate rows (b0) and the up rows (b1), GEMM_COLS_GU columns of each
 * a block; out (the hidden rows, [pairs][N]) gets silu(g) * u. Else A row
 * i is a[row0 + i] ([pairs][K]), B the down rows, GEMM_COLS_DOWN columns a
 * block, and out ([pairs][N]) the product. bf16 everywhere, f32 sums; K
 * and N multiples of 8. Eight warps: two of 32 rows by four of a quarter
 * of the block's columns (of each matrix); STAGES stages of TILE_K in
 * dynamic shared memory, GEMM_B_ROWS weight rows each. */
template <bool GATE_UP>
static __global__ void __launch_bounds__(GEMM_THREADS)
    moe_gemm_kernel(moe_scratch s, bf16 *out, const bf16 *a, const bf16 *b0, const bf16 *b1,
                    int topk, int N, int K)
{
    constexpr int NB = GATE_UP ? 2 : 1;
    constexpr int COLS = GATE_UP ? GEMM_COLS_GU : GEMM_COLS_DOWN; /* of each matrix */
    constexpr int WN = COLS / 4, NP = WN / 16;                    /* a warp's, in ldmatrix pairs */
    constexpr int A_HALVES = TILE_M * ROW_HALVES, B_HALVES = GEMM_B_ROWS * ROW_HALVES;
    extern __shared__ __align__(16) bf16 smem[];
    pdl_trigger();
    pdl_wait(); /* the tiles, and the rows of the kernels before */
    int t = blockIdx.y;
    if (t >= *s.ntiles)
        return;
    int e = s.tile_expert[t], row0 = s.tile_row0[t], rend = s.offsets[e + 1];
    int n0 = blockIdx.x * COLS;
    size_t mat = (size_t)N * (size_t)K;
    const bf16 *w0 = b0 + (size_t)e * mat, *w1 = GATE_UP ? b1 + (size_t)e * mat : w0;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    /* this thread's chunks of a stage: column lc of A rows lr and lr + 32,
     * and of B rows lr + 32 i (i < 4) */
    int lr = tid / 8, lc = (tid % 8) * 8;
    const bf16 *arow[2], *brow[4];
    bool avalid[2], bvalid[4];
    for (int i = 0; i < 2; i++) {
        int r = row0 + lr + 32 * i;
        avalid[i] = r < rend;
        int src = avalid[i] ? (GATE_UP ? s.sorted[r] / topk : r) : 0;
        arow[i] = a + (size_t)src * (size_t)K;
    }
    for (int i = 0; i < 4; i++) {
        int r = lr + 32 * i, b = r / COLS, n = n0 + r % COLS;
        bvalid[i] = n < N;
        brow[i] = (b ? w1 : w0) + (size_t)(bvalid[i] ? n : 0) * K;
    }
    int ktiles = (K + TILE_K - 1) / TILE_K;
    auto load = [&](int stage, int kt) {
        bf16 *sa = smem + (size_t)stage * (A_HALVES + B_HALVES), *sb = sa + A_HALVES;
        int kc = kt * TILE_K + lc;
        bool kin = kc < K;
        for (int i = 0; i < 2; i++)
            cp_async16(smem_addr(&sa[(lr + 32 * i) * ROW_HALVES + lc]), arow[i] + (kin ? kc : 0),
                       avalid[i] && kin);
        for (int i = 0; i < 4; i++)
            cp_async16(smem_addr(&sb[(lr + 32 * i) * ROW_HALVES + lc]), brow[i] + (kin ? kc : 0),
                       bvalid[i] && kin);
    };
    float acc[NB][2][2 * NP][4];
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2 * NP; j++)
                for (int q = 0; q < 4; q++)
                    acc[b][i][j][q] = 0.0f;
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < ktiles)
            load(st, st);
        cp_async_commit();
    }
    int wm = (warp / 4) * 32, wn = (warp % 4) * WN;
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const bf16 *sa = smem + (size_t)(kt % STAGES) * (A_HALVES + B_HALVES), *sb = sa + A_HALVES;
#pragma unroll
        for (int kk = 0; kk < TILE_K / 16; kk++) {
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(
                    af[mt],
                    smem_addr(
                        &sa[(wm + mt * 16 + lane % 16) * ROW_HALVES + kk * 16 + (lane / 16) * 8]));
#pragma unroll
            for (int b = 0; b < NB; b++)
#pragma unroll
                for (int np = 0; np < NP; np++) {
                    uint32_t bf[4];
                    int r = b * COLS + wn + np * 16 + lane % 8 + 8 * (lane / 16);
                    ldsm_x4(bf, smem_addr(&sb[r * ROW_HALVES + kk * 16 + 8 * ((lane / 8) % 2)]));
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_bf16(acc[b][mt][2 * np], af[mt], bf[0], bf[1]);
                        mma_bf16(acc[b][mt][2 * np + 1], af[mt], bf[2], bf[3]);
                    }
                }
        }
        int next = kt + STAGES - 1;
        if (next < ktiles)
            load(next % STAGES, next);
        cp_async_commit();
    }
    cp_async_wait<0>();
    for (int mt = 0; mt < 2; mt++)
        for (int half = 0; half < 2; half++) {
            int r = row0 + wm + mt * 16 + lane / 4 + 8 * half;
            if (r >= rend)
                continue;
            for (int nt = 0; nt < 2 * NP; nt++) {
                int c = n0 + wn + nt * 8 + 2 * (lane % 4);
                if (c >= N)
                    continue;
                float v0 = acc[0][mt][nt][2 * half], v1 = acc[0][mt][nt][2 * half + 1];
                if (GATE_UP) {
                    float g0 = __bfloat162float(__float2bfloat16_rn(v0));
                    float g1 = __bfloat162float(__float2bfloat16_rn(v1));
                    float u0 = __bfloat162float(__float2bfloat16_rn(acc[NB - 1][mt][nt][2 * half]));
                    float u1 =
                        __bfloat162float(__float2bfloat16_rn(acc[NB - 1][mt][nt][2 * half + 1]));
                    v0 = g0 / (1.0f + expf(-g0)) * u0;
                    v1 = g1 / (1.0f + expf(-g1)) * u1;
                }
                *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)r * N + c) =
                    __floats2bfloat162_rn(v0, v1);
            }
        }
}

static size_t gemm_smem_bytes(void)
{
    return (size_t)STAGES * (TILE_M + GEMM_B_ROWS) * ROW_HALVES * sizeof(bf16);
}

/* Both GEMMs' dynamic shared memory, past the 48 KiB a launch gets unasked:
 * once a process (a function attribute; it is no stream work, so it may
 * come while a graph records). */
static bool gemm_smem_ready(kernels_backend *be)
{
    static bool ready;
    if (ready)
        return true;
    int bytes = (int)gemm_smem_bytes();
    cudaError_t e = cudaFuncSetAttribute(moe_gemm_kernel<true>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(moe_gemm_kernel<false>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) {
        cuda_fail(be, "moe_experts: shared memory of the grouped GEMM", e);
        return false;
    }
    ready = true;
    return true;
}

/* ---- rounds of few rows: GEMVs by pair, no sort ----
 *
 * At most GEMV_ROWS rows: gate/up takes a block a (pair, GEMV_BLOCK_ROWS
 * hidden rows), a warp two gate rows and the same two up rows of the
 * pair's expert, every lane streaming 16-byte chunks of them against the
 * pair's input row; down takes a block a (row, GEMV_DOWN_COLS output
 * columns, one a warp) and sums the row's slots in order, each slot's output rounded
 * to bf16 first, so the weighted sum needs no pass of its own. A one-row
 * round reads its top-k experts' bytes once; rows that share an expert
 * read it again, from L2 where they run together. Three kernels a layer
 * (route, gate/up, down) where the sorted path takes five. */
enum { GEMV_ROWS = 8, GEMV_WARP_ROWS = 2, GEMV_BLOCK_ROWS = 4 * GEMV_WARP_ROWS };

static __device__ __forceinline__ void fma8(float &acc, uint4 w, uint4 x)
{
    const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w, *xp = (const __nv_bfloat162 *)&x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
    }
}

/* h[p][n] = silu(gate_e x) * (up_e x), x = in[p / topk], e = ids[p]. */
static __global__ void __launch_bounds__(128)
    moe_gemv_gate_up(bf16 *h, const bf16 *in, const int32_t *ids, const bf16 *wg, const bf16 *wu,
                     int topk, int n, int k)
{
    pdl_trigger();
    pdl_wait(); /* the routing and the normed rows */
    int p = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n0 = blockIdx.x * GEMV_BLOCK_ROWS + warp * GEMV_WARP_ROWS;
    if (n0 >= n)
        return;
    size_t e = (size_t)ids[p];
    const uint4 *x = (const uint4 *)(in + (size_t)(p / topk) * k);
    const uint4 *g[GEMV_WARP_ROWS], *u[GEMV_WARP_ROWS];
#pragma unroll
    for (int i = 0; i < GEMV_WARP_ROWS; i++) {
        size_t row = e * n + (size_t)(n0 + i < n ? n0 + i : n0);
        g[i] = (const uint4 *)(wg + row * k);
        u[i] = (const uint4 *)(wu + row * k);
    }
    float ag[GEMV_WARP_ROWS] = {}, au[GEMV_WARP_ROWS] = {};
#pragma unroll 4
    for (int c = lane; c < k / 8; c += 32) {
        uint4 xv = __ldg(x + c);
#pragma unroll
        for (int i = 0; i < GEMV_WARP_ROWS; i++) {
            fma8(ag[i], __ldg(g[i] + c), xv);
            fma8(au[i], __ldg(u[i] + c), xv);
        }
    }
#pragma unroll
    for (int i = 0; i < GEMV_WARP_ROWS; i++) {
        float gs = warp_reduce(ag[i], op_add()), us = warp_reduce(au[i], op_add());
        if (lane == 0 && n0 + i < n) {
            float gr = __bfloat162float(__float2bfloat16_rn(gs));
            float ur = __bfloat162float(__float2bfloat16_rn(us));
            h[(size_t)p * n + n0 + i] = __float2bfloat16_rn(gr / (1.0f + expf(-gr)) * ur);
        }
    }
}

/* out[r][c] = sum over j < topk of weights[p] x bf16(h[p] . down_e[c]),
 * p = r * topk + j, e = ids[p], in slot order. A warp takes one column
 * and the slots GEMV_SLOTS at a time, their rows' loads issued together
 * without a branch: a slot past topk reads slot 0's rows again and adds
 * its product times 0. */
enum { GEMV_SLOTS = 8, GEMV_DOWN_COLS = 4 /* a block's: one a warp */ };

static __global__ void __launch_bounds__(128)
    moe_gemv_down(bf16 *out, const bf16 *h, const int32_t *ids, const float *weights,
                  const bf16 *wd, int topk, int n, int k)
{
    pdl_trigger();
    pdl_wait(); /* the hidden rows */
    int r = blockIdx.y, lane = threadIdx.x % 32;
    int col = blockIdx.x * GEMV_DOWN_COLS + threadIdx.x / 32;
    if (col >= k)
        return;
    float sum = 0.0f;
    for (int j0 = 0; j0 < topk; j0 += GEMV_SLOTS) {
        const uint4 *x[GEMV_SLOTS], *w[GEMV_SLOTS];
        float wt[GEMV_SLOTS];
#pragma unroll
        for (int j = 0; j < GEMV_SLOTS; j++) {
            bool in = j0 + j < topk;
            int p = r * topk + (in ? j0 + j : 0);
            x[j] = (const uint4 *)(h + (size_t)p * n);
            w[j] = (const uint4 *)(wd + ((size_t)ids[p] * k + (size_t)col) * n);
            wt[j] = in ? weights[p] : 0.0f;
        }
        float acc[GEMV_SLOTS] = {};
        for (int c = lane; c < n / 8; c += 32) {
            uint4 xv[GEMV_SLOTS], wv[GEMV_SLOTS];
#pragma unroll
            for (int j = 0; j < GEMV_SLOTS; j++) {
                xv[j] = __ldg(x[j] + c);
                wv[j] = __ldg(w[j] + c);
            }
#pragma unroll
            for (int j = 0; j < GEMV_SLOTS; j++)
                fma8(acc[j], wv[j], xv[j]);
        }
#pragma unroll
        for (int j = 0; j < GEMV_SLOTS; j++)
            sum += wt[j] * __bfloat162float(__float2bfloat16_rn(warp_reduce(acc[j], op_add())));
    }
    if (lane == 0)
        out[(size_t)r * k + col] = __float2bfloat16_rn(sum);
}

/* ---- any dtype: a pair a block row, a thread a column ---- */

template <typename T, typename W>
static __global__ void moe_gate_up_plain(T *h, const T *in, const int32_t *ids, const W *wg,
                                         const W *wu, int topk, int n, int k)
{
    int p = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= n)
        return;
    const T *x = in + (size_t)(p / topk) * k;
    size_t off = ((size_t)ids[p] * n + c) * k;
    float g = 0.0f, u = 0.0f;
    for (int i = 0; i < k; i++) {
        float xi = to_f32(x[i]);
        g += xi * to_f32(wg[off + i]);
        u += xi * to_f32(wu[off + i]);
    }
    g = to_f32(from_f32<T>(g));
    u = to_f32(from_f32<T>(u));
    h[(size_t)p * n + c] = from_f32<T>(g / (1.0f + expf(-g)) * u);
}

template <typename T, typename W>
static __global__ void moe_down_plain(T *y, const T *h, const int32_t *ids, const W *wd, int n,
                                      int k)
{
    int p = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= k)
        return;
    const T *x = h + (size_t)p * n;
    size_t off = ((size_t)ids[p] * k + c) * n;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += to_f32(x[i]) * to_f32(wd[off + i]);
    y[(size_t)p * k + c] = from_f32<T>(s);
}

/* ---- 4. the weighted sum, slot by slot ---- */

template <typename T>
static __global__ void moe_combine_kernel(T *out, const T *y, const float *weights,
                                          const int32_t *place, int topk, int k)
{
    pdl_trigger();
    pdl_wait(); /* the experts' outputs */
    int r = blockIdx.x;
    for (int c = threadIdx.x; c < k; c += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < topk; j++) {
            int p = r * topk + j;
            int at = place ? place[p] : p;
            s += weights[p] * to_f32(y[(size_t)at * k + c]);
        }
        out[(size_t)r * k + c] = from_f32<T>(s);
    }
}

void cuda_moe_experts(kernels_backend *be, void *out, const void *in, const int32_t *ids,
                      const float *weights, int rows, int topk, const kernels_weight *wg,
                      const kernels_weight *wu, const kernels_weight *wd, void *scratch)
{
    int n = (int)wg->rows, k = (int)wg->cols, experts = wg->experts;
    SHOAL_ASSERT(wg->format == KERNELS_WEIGHT_DENSE && wu->dtype == wg->dtype &&
                 wd->dtype == wg->dtype && wd->rows == k && wd->cols == n && wu->rows == n &&
                 wu->cols == k && wu->experts == experts && wd->experts == experts &&
                 experts <= SHOAL_MODEL_EXPERTS_MAX && rows >= 0 && topk >= 1);
    if (rows == 0 || !cuda_usable(be))
        return;
    cudaStream_t st = cuda_of(be)->stream;
    size_t act = shoal_dtype_bytes(be->act_dtype);
    moe_scratch s;
    scratch_layout(rows, topk, n, k, act, (unsigned char *)scratch, &s);
    int pairs = rows * topk;
    bool tc = be->act_dtype == SHOAL_DTYPE_BF16 && wg->dtype == SHOAL_DTYPE_BF16 && k % 8 == 0 &&
              n % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)wg->data % 16 == 0 &&
              (uintptr_t)wu->data % 16 == 0 && (uintptr_t)wd->data % 16 == 0;
    if (tc) {
        /* each launch may start while the kernel before it ends
         * (programmatic dependent launch): every kernel here waits for it
         * before reading anything */
        if (rows <= GEMV_ROWS) {
            cuda_launch_pdl(
                st, dim3((unsigned)((n + GEMV_BLOCK_ROWS - 1) / GEMV_BLOCK_ROWS), (unsigned)pairs),
                128, moe_gemv_gate_up, (bf16 *)s.h, (const bf16 *)in, ids, (const bf16 *)wg->data,
                (const bf16 *)wu->data, topk, n, k);
            cuda_launch_pdl(
                st, dim3((unsigned)((k + GEMV_DOWN_COLS - 1) / GEMV_DOWN_COLS), (unsigned)rows),
                128, moe_gemv_down, (bf16 *)out, (const bf16 *)s.h, ids, weights,
                (const bf16 *)wd->data, topk, n, k);
            cuda_launched(be, "moe_experts");
            return;
        }
        if (!gemm_smem_ready(be))
            return;
        unsigned tiles = (unsigned)tiles_max(pairs, experts);
        size_t smem = gemm_smem_bytes();
        cuda_launch_pdl(st, dim3(1), 1024, moe_sort_kernel, s, ids, pairs, experts);
        cuda_launch_pdl_smem(st, dim3((unsigned)((n + GEMM_COLS_GU - 1) / GEMM_COLS_GU), tiles),
                             GEMM_THREADS, smem, moe_gemm_kernel<true>, s, (bf16 *)s.h,
                             (const bf16 *)in, (const bf16 *)wg->data, (const bf16 *)wu->data, topk,
                             n, k);
        cuda_launch_pdl_smem(st, dim3((unsigned)((k + GEMM_COLS_DOWN - 1) / GEMM_COLS_DOWN), tiles),
                             GEMM_THREADS, smem, moe_gemm_kernel<false>, s, (bf16 *)s.y,
                             (const bf16 *)s.h, (const bf16 *)wd->data, (const bf16 *)NULL, topk, k,
                             n);
        cuda_launch_pdl(st, dim3((unsigned)rows), 256, moe_combine_kernel<bf16>, (bf16 *)out,
                        (const bf16 *)s.y, weights, (const int32_t *)s.place, topk, k);
        cuda_launched(be, "moe_experts");
        return;
    }
    cuda_dispatch_act(be->act_dtype, [&](auto a) {
        using T = decltype(a);
        cuda_dispatch_weight(wg->dtype, [&](auto w) {
            using W = decltype(w);
            moe_gate_up_plain<T, W>
                <<<dim3((unsigned)pairs, (unsigned)((n + 127) / 128)), 128, 0, st>>>(
                    (T *)s.h, (const T *)in, ids, (const W *)wg->data, (const W *)wu->data, topk, n,
                    k);
            moe_down_plain<T, W>
                <<<dim3((unsigned)pairs, (unsigned)((k + 127) / 128)), 128, 0, st>>>(
                    (T *)s.y, (const T *)s.h, ids, (const W *)wd->data, n, k);
        });
        moe_combine_kernel<T>
            <<<rows, 256, 0, st>>>((T *)out, (const T *)s.y, weights, NULL, topk, k);
    });
    cuda_launched(be, "moe_experts");
}
