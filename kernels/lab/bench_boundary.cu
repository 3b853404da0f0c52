/* shoal-lab-boundary: what a kernel boundary of the one-row decode chain
 * costs, and whether a dependency on a count the kernel before raises
 * (an acquire spin) costs less than programmatic serialization's wait
 * (griddepcontrol.wait, which returns once the whole grid before has
 * completed and its memory is flushed).
 *
 * A stand-in of the 8B model's layer at one row, its kernels in the
 * model's order and grids, weights of the 8B shape (36 layers, 13.9 GB,
 * so every step reads cold weights):
 *
 *   norm (1 block) -> q/k/v GEMV [6144][4096] -> attention (128 blocks,
 *   each a head's 128 values in, a record out; no KV) -> merge (32
 *   blocks) -> o GEMV [4096][4096] -> norm -> gate/up GEMV [24576][4096]
 *   -> down GEMV [4096][12288]
 *
 * in these variants, each recorded as one graph of a step:
 *
 *   pdl     every kernel launched with programmatic serialization, each
 *           triggering its dependents at its start and waiting
 *           (griddepcontrol.wait) before it reads its input;
 *   model   as pdl, but the norms launched plainly (the backend's choice
 *           at one row, kernels/lab row 22.3);
 *   count   as pdl, but each kernel waits until the kernel before has
 *           counted all its blocks done (a release add a block after its
 *           writes, a relaxed spin and an acquire fence by one thread a
 *           block, as CUTLASS's generic barrier), not for that grid's
 *           completion; the counts zeroed by a memset at the step's start;
 *   nonorm  as pdl without the norm kernels (a GEMV reads the one before's
 *           output);  noattn  as model without attention and merge;
 *   bare    the four GEMVs alone;
 *   kv      as model, the attention stand-in copying its segment's 64 KB
 *           of KV (16.8 MB a layer, the 8B model's at 4k) before it waits;
 *           kv-pdl  the same with the norms as pdl;
 *   fold    the norms inside the GEMVs (kernels/lab row 23.1's shape):
 *           q/k/v and gate/up take 1 / rms of the x they stream, o and
 *           down add into x; six kernels a layer;
 *   *-l     the plain GEMVs by fold's loop (90-100 registers, four or
 *           five blocks a multiprocessor, where the backend's take 160-164
 *           and three);
 *   S, H, A the model's parts, one at a time: S gate/up as the backend's
 *           SwiGLU GEMV (12,288 outputs, two gate and two up warps a
 *           block); H the attention stand-in with the TMA partials'
 *           footprint (264 blocks, 147 registers, 106 KB, the KV copied
 *           before the wait); A the weights a matrix an allocation, as
 *           the model loads them.
 *
 * Also the same chain with no weights (every GEMV of 1 row of 8 columns):
 * the boundaries' latency alone. Results: kernels/lab/README.md rows
 * 25.1, 25.2 and 25.7.
 *
 *   shoal-lab-boundary [--device N] [--steps N] [--sleep NS] [--plant]
 *
 * Prints each way's microseconds a step and a layer, beside the bytes'
 * time at the copy bandwidth measured in the same run, and how many
 * outputs differ from the first variant with the same kernels (none may:
 * only the waiting or the launch differs). --sleep: a
 * count's spin sleeps NS nanoseconds between polls (default 0). --plant
 * makes count wait for one block fewer than the kernel before has, so its
 * outputs should differ (the planted fault). */
#include "common/common_dtype.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/kernels_backend.h"
#include "kernels/lab/lab_util.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "shoal-lab-boundary: %s: %s\n", #x, cudaGetErrorString(e_));         \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

enum { HID = 4096, QKV = 6144, INTER = 12288, LAYERS = 36, HEADS = 32, KVH = 8, HD = 128 };
enum { KERNELS = 8 /* a layer */ };
enum wait_mode { W_PDL, W_COUNT };

/* A kernel's wait: griddepcontrol.wait, or the count of the kernel
 * before reaching its grid (one thread spins, the block follows). */
struct waiter {
    const unsigned *count; /* NULL: griddepcontrol.wait */
    unsigned target, sleep_ns;
    __device__ __forceinline__ void operator()() const
    {
        if (!count) {
            pdl_wait();
            return;
        }
        /* relaxed polls (an acquire a poll would invalidate the
         * multiprocessor's L1 each time), one acquire fence after */
        if (threadIdx.x == 0) {
            unsigned v;
            for (;;) {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];"
                             : "=r"(v)
                             : "l"(count)
                             : "memory");
                if (v >= target)
                    break;
                if (sleep_ns)
                    __nanosleep(sleep_ns);
            }
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
        __syncthreads();
    }
};

/* After the block's last write: counted done, released to the next
 * kernel's spin. */
static __device__ __forceinline__ void count_done(unsigned *done)
{
    if (!done)
        return;
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(done) : "memory");
}

/* out[n] = w[n][k] x in[k], one warp a row (the backend's GEMV sums);
 * COHERENT input loads under count (the kernel before may still be
 * resident, and its writes are ordered by the acquire, not by a grid's
 * completion). SWIGLU: the backend's matmul_swiglu shape, w the joined
 * [gate | up] rows of n each, a block's first two warps two gate rows and
 * its last two the same up rows, out[j] = silu(g) * u (g and u rounded
 * first), swapped through shared memory. */
template <bool SWIGLU>
static __device__ __forceinline__ int gemv_row(int n, int warp)
{
    return SWIGLU ? blockIdx.x * 2 + (warp & 1) + (warp >> 1) * n
                  : blockIdx.x * GEMV_WARPS + warp;
}

template <bool SWIGLU>
static __device__ __forceinline__ void gemv_store(bf16 *out, int n, int row, int lane, int warp,
                                                  float acc, bool valid)
{
    if constexpr (!SWIGLU) {
        if (valid && lane == 0)
            out[row] = __float2bfloat16_rn(acc);
    } else {
        __shared__ float part[GEMV_WARPS];
        if (lane == 0)
            part[warp] = acc;
        __syncthreads();
        const int j = blockIdx.x * 2 + threadIdx.x;
        if (threadIdx.x < 2 && j < n) {
            const float g = __bfloat162float(__float2bfloat16_rn(part[threadIdx.x]));
            const float u = __bfloat162float(__float2bfloat16_rn(part[2 + threadIdx.x]));
            out[j] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
        }
    }
}

template <bool COHERENT, bool SWIGLU = false>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv(bf16 *out, const bf16 *in, const bf16 *w, int n, int k, waiter wt, unsigned *done)
{
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = gemv_row<SWIGLU>(n, warp);
    const bool valid = SWIGLU ? blockIdx.x * 2 < n : row < n;
    float acc[1];
    gemv_dot<1, COHERENT>(acc, (const uint4 *)(w + (size_t)(valid ? row : 0) * k),
                          (const uint4 *)in, k / 8, lane, valid, wt);
    gemv_store<SWIGLU>(out, n, row, lane, warp, valid ? warp_reduce(acc[0], op_add()) : 0.0f,
                       valid);
    count_done(done);
}

/* The norms folded into the GEMVs (kernels/lab row 23.1's shape): RMS,
 * each warp sums the squares of the input row it streams anyway and
 * scales its dot by 1 / rms (the norm's weight would be folded into w);
 * ADD, the row's output added to the residual x (out, in place: x's
 * element read after the wait, beside the input's loads). pdl mode only. */
template <bool RMS, bool ADD, bool SWIGLU = false>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_fold(bf16 *out, const bf16 *in, const bf16 *w, int n, int k, waiter wt, unsigned *done)
{
    static_assert(!(ADD && SWIGLU), "the add is the plain GEMV's");
    constexpr int U = GEMV_LOADS_ONE_ROW;
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = gemv_row<SWIGLU>(n, warp);
    const bool valid = SWIGLU ? blockIdx.x * 2 < n : row < n;
    const uint4 *wr = (const uint4 *)(w + (size_t)(valid ? row : 0) * k), *x = (const uint4 *)in;
    const int chunks = k / 8;
    uint4 wv[U];
    if (valid)
#pragma unroll
        for (int u = 0; u < U; u++)
            wv[u] = ld_stream16(wr + lane + u * 32);
    wt();
    float acc = 0.0f, ss = 0.0f, resid = 0.0f;
    if (valid) {
        if (ADD && lane == 0)
            resid = __bfloat162float(out[row]);
        for (int c = lane;; c += U * 32) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint4 xv = __ldg(x + c + u * 32);
                acc += dot8_bf16(wv[u], xv);
                if (RMS)
                    ss += dot8_bf16(xv, xv);
            }
            if (c + U * 32 >= chunks)
                break;
#pragma unroll
            for (int u = 0; u < U; u++)
                wv[u] = ld_stream16(wr + c + U * 32 + u * 32);
        }
        acc = warp_reduce(acc, op_add());
        if (RMS)
            acc *= rsqrtf(warp_reduce(ss, op_add()) / (float)k + 1e-6f);
        if (ADD)
            acc = resid + __bfloat162float(__float2bfloat16_rn(acc));
    }
    gemv_store<SWIGLU>(out, n, row, lane, warp, acc, valid);
    count_done(done);
}

/* x += in (bf16), out = x / rms(x): the model's norm at one row, one
 * block of 512 threads, a vector of 8 a thread. */
static __global__ void __launch_bounds__(512)
    norm(bf16 *out, bf16 *x, const bf16 *in, waiter wt, unsigned *done)
{
    __shared__ float red[32];
    pdl_trigger();
    wt();
    uint4 xv = ((uint4 *)x)[threadIdx.x], iv = ((const uint4 *)in)[threadIdx.x];
    bf16 *xe = (bf16 *)&xv;
    const bf16 *ie = (const bf16 *)&iv;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        xe[j] = __float2bfloat16_rn(__bfloat162float(xe[j]) + __bfloat162float(ie[j]));
        ss += __bfloat162float(xe[j]) * __bfloat162float(xe[j]);
    }
    ((uint4 *)x)[threadIdx.x] = xv;
    ss = block_reduce(ss, op_add(), red);
    const float inv = rsqrtf(ss / HID + 1e-6f);
    uint4 ov;
    bf16 *oe = (bf16 *)&ov;
#pragma unroll
    for (int j = 0; j < 8; j++)
        oe[j] = __float2bfloat16_rn(__bfloat162float(xe[j]) * inv);
    ((uint4 *)out)[threadIdx.x] = ov;
    count_done(done);
}

/* The attention stand-in: block b (a KV head's segment) reads its KV
 * head's four q heads and k (the q/k/v output) and writes a record of
 * 4 x 128 floats: the dependency shape of the TMA partials, no KV. */
static __global__ void __launch_bounds__(128)
    attn(float *rec, const bf16 *qkv, waiter wt, unsigned *done)
{
    pdl_trigger();
    wt();
    const int g = blockIdx.x % KVH, t = threadIdx.x;
    const float k = __bfloat162float(qkv[HEADS * HD + g * HD + t]);
#pragma unroll
    for (int h = 0; h < 4; h++)
        rec[((size_t)blockIdx.x * 4 + h) * HD + t] =
            __bfloat162float(qkv[(g * 4 + h) * HD + t]) * k;
    count_done(done);
}

/* The merge stand-in: block h (a query head) sums its head's records over
 * the 16 segments into the o GEMV's input. */
static __global__ void __launch_bounds__(128)
    merge(bf16 *o_in, const float *rec, waiter wt, unsigned *done)
{
    pdl_trigger();
    wt();
    const int h = blockIdx.x, g = h / 4, t = threadIdx.x;
    float s = 0.0f;
    for (int seg = 0; seg < 16; seg++)
        s += rec[((size_t)(seg * KVH + g) * 4 + h % 4) * HD + t];
    o_in[h * HD + t] = __float2bfloat16_rn(s * 0.0625f);
    count_done(done);
}

/* The attention stand-in with the KV: block b copies its segment's 64 KB
 * of K and V (128 tokens) into shared memory by cp.async before it waits
 * (as the TMA partials copy every stage before the row's own), then takes
 * a dot of its head's q with a row of it. 64 KB a block: three blocks a
 * multiprocessor at most, as the TMA partials. */
enum { KV_SEG_BYTES = 64 << 10, KV_THREADS = 160 };

/* The block's segment of KV copied into stage by cp.async, issued before
 * the wait and landed after it. */
static __device__ __forceinline__ void stage_segment(uint4 *stage, const unsigned char *kv,
                                                     const waiter &wt)
{
    const unsigned char *src = kv + (size_t)blockIdx.x * KV_SEG_BYTES;
    for (int i = threadIdx.x; i < KV_SEG_BYTES / 16; i += KV_THREADS) {
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(stage + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + i * 16));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    wt();
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
}
static __global__ void __launch_bounds__(KV_THREADS)
    attn_kv(float *rec, const bf16 *qkv, const unsigned char *kv, waiter wt, unsigned *done)
{
    extern __shared__ uint4 stage[];
    pdl_trigger();
    stage_segment(stage, kv, wt);
    const int g = blockIdx.x % KVH, t = threadIdx.x;
    if (t < HD) {
        const bf16 *kr = (const bf16 *)stage + (blockIdx.x & 127) * HD;
        const float k = __bfloat162float(kr[t]) + __bfloat162float(qkv[HEADS * HD + g * HD + t]);
#pragma unroll
        for (int h = 0; h < 4; h++)
            rec[((size_t)blockIdx.x * 4 + h) * HD + t] =
                __bfloat162float(qkv[(g * 4 + h) * HD + t]) * k;
    }
    count_done(done);
}

/* attn_kv with the TMA partials' footprint at batch 1 and 4k: 264 blocks
 * (33 segments of 8 KV heads), 106 KB of shared memory and 140 values a
 * thread held across a barrier (147 registers, as the partials), so
 * that, like them, two fit a multiprocessor, the first once one of the
 * q/k/v GEMV's three 160-register blocks has left it, the second once
 * all three have. */
enum { KVH_SEGS = 33 * KVH, KVH_SMEM = 106 << 10, KEEP = 140 };
static __global__ void __launch_bounds__(KV_THREADS, 2)
    attn_heavy(float *rec, const bf16 *qkv, const unsigned char *kv, waiter wt, unsigned *done)
{
    extern __shared__ uint4 stage[];
    pdl_trigger();
    stage_segment(stage, kv, wt);
    const float *sf = (const float *)stage;
    float keep[KEEP];
#pragma unroll
    for (int i = 0; i < KEEP; i++)
        keep[i] = sf[i * KV_THREADS + threadIdx.x];
    __syncthreads(); /* every value live across it */
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < KEEP; i++)
        sum = fmaf(keep[i], keep[KEEP - 1 - i], sum);
    const int g = blockIdx.x % KVH, t = threadIdx.x;
    if (t < HD) {
        const float k = sum + __bfloat162float(qkv[HEADS * HD + g * HD + t]);
#pragma unroll
        for (int h = 0; h < 4; h++)
            rec[((size_t)blockIdx.x * 4 + h) * HD + t] =
                __bfloat162float(qkv[(g * 4 + h) * HD + t]) * k;
    }
    count_done(done);
}

/* Plain or programmatic launch (cuda_ops.h's launcher). */
template <typename... Params, typename... Args>
static void launch_cfg(cudaStream_t s, bool pdl, unsigned blocks, unsigned threads, size_t smem,
                       void (*kernel)(Params...), Args... args)
{
    if (pdl)
        cuda_launch_pdl_smem(s, dim3(blocks), threads, smem, kernel, args...);
    else
        kernel<<<blocks, threads, smem, s>>>(args...);
    CK(cudaGetLastError());
}

template <typename... Params, typename... Args>
static void launch(cudaStream_t s, bool pdl, unsigned blocks, unsigned threads,
                   void (*kernel)(Params...), Args... args)
{
    launch_cfg(s, pdl, blocks, threads, 0, kernel, args...);
}

/* Programmatic, with dynamic shared memory. */
template <typename... Params, typename... Args>
static void launch_smem(cudaStream_t s, unsigned blocks, unsigned threads, size_t smem,
                        void (*kernel)(Params...), Args... args)
{
    launch_cfg(s, true, blocks, threads, smem, kernel, args...);
}

/* A layer's matrices in order, q/k/v, o, gate/up (joined), down: rows
 * by k, back to back (tiny: 8 rows each, k 4,096). */
enum { MATS = 4 };
struct layer_shape {
    int rows[MATS], k[MATS];
    size_t elems(int i) const { return (size_t)rows[i] * (size_t)k[i]; }
    size_t total() const { return elems(0) + elems(1) + elems(2) + elems(3); }
};

static layer_shape shape_of(bool tiny)
{
    if (tiny)
        return {{8, 8, 8, 8}, {HID, HID, HID, HID}};
    return {{QKV, HID, 2 * INTER, HID}, {HID, HID, HID, INTER}};
}

struct bufs {
    bf16 *w, *x, *xn, *qkv, *o_in, *o, *act, *down;
    bf16 *sep[LAYERS][MATS]; /* the 8B layers' matrices, each its own allocation */
    float *rec;
    unsigned *counts;
    unsigned char *kv; /* 36 layers of 264 segments of 64 KB (16.8-17.3 MB a layer) */
};

/* A variant of the layer: how kernels wait, and which kernels it has. */
enum norm_way { N_PDL, N_PLAIN, N_NONE, N_FOLD };
enum attn_way { A_STAND, A_NONE, A_KV, A_HEAVY };
struct variant {
    const char *name;
    wait_mode wait;
    norm_way norm;
    attn_way attn;
    bool lean;   /* the plain GEMVs by gemv_fold's loop (90-100 registers, not 160) */
    bool swiglu; /* gate/up as the backend's matmul_swiglu, 12,288 outputs */
    bool sep;    /* the weights in separate allocations, as the model loads them */
};
enum { KV_SEGS = 32 * KVH, KV_SEGS_MAX = KVH_SEGS };

/* One step's 36 layers on stream s. tiny: every GEMV of 8 rows. */
static void step(cudaStream_t s, const bufs &b, const variant &v, bool tiny, bool plant,
                 unsigned sleep_ns)
{
    const bool counted = v.wait == W_COUNT;
    if (counted)
        CK(cudaMemsetAsync(b.counts, 0, LAYERS * KERNELS * sizeof(unsigned), s));
    unsigned *prev = NULL, prev_blocks = 0;
    int slot = 0;
    /* the wait on the kernel before, and this kernel's count */
    auto next = [&](unsigned blocks, waiter *wt, unsigned **done) {
        wt->count = counted ? prev : NULL;
        wt->target = prev_blocks - (plant && prev_blocks > 1 ? 1 : 0);
        wt->sleep_ns = sleep_ns;
        *done = counted ? b.counts + slot++ : NULL;
        prev = *done;
        prev_blocks = blocks;
    };
    const layer_shape L = shape_of(tiny);
    /* down's k: gate/up's outputs (its first INTER without SwiGLU) */
    const int nq = L.rows[0], no = L.rows[1], ngu = L.rows[2], nd = L.rows[3], kd = L.k[3];
    typedef void (*gemv_kernel)(bf16 *, const bf16 *, const bf16 *, int, int, waiter, unsigned *);
    /* a GEMV of n outputs by k: its grid, its wait on the kernel before */
    auto run_gemv = [&](gemv_kernel kernel, bf16 *out, const bf16 *in, const bf16 *w, int n,
                        int k, int per_block) {
        const unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
        waiter wt;
        unsigned *done;
        next(blocks, &wt, &done);
        launch(s, true, blocks, GEMV_WARPS * 32, kernel, out, in, w, n, k, wt, done);
    };
    const gemv_kernel plain = counted    ? gemv<true>
                              : v.lean ? gemv_fold<false, false>
                                       : gemv<false>;
    const bool fold = v.norm == N_FOLD;
    /* gate/up: SwiGLU's n outputs from the joined rows, or all the rows */
    auto run_gate_up = [&](const bf16 *in, const bf16 *w) {
        if (v.swiglu)
            run_gemv(fold     ? gemv_fold<true, false, true>
                     : v.lean ? gemv_fold<false, false, true>
                              : gemv<false, true>,
                     b.act, in, w, ngu / 2, HID, 2);
        else
            run_gemv(fold ? gemv_fold<true, false> : plain, b.act, in, w, ngu, HID, GEMV_WARPS);
    };
    /* attention and merge; the o GEMV's input */
    auto run_attn = [&](int l) -> const bf16 * {
        waiter wt;
        unsigned *done;
        if (v.attn == A_NONE)
            return b.qkv; /* the o GEMV reads q */
        const unsigned char *kv = b.kv + (size_t)l * KV_SEGS_MAX * KV_SEG_BYTES;
        if (v.attn == A_STAND) {
            next(16 * KVH, &wt, &done);
            launch(s, true, 16 * KVH, 128, attn, b.rec, (const bf16 *)b.qkv, wt, done);
        } else if (v.attn == A_KV) {
            next(KV_SEGS, &wt, &done);
            launch_smem(s, KV_SEGS, KV_THREADS, KV_SEG_BYTES, attn_kv, b.rec,
                        (const bf16 *)b.qkv, kv, wt, done);
        } else {
            next(KVH_SEGS, &wt, &done);
            launch_smem(s, KVH_SEGS, KV_THREADS, KVH_SMEM, attn_heavy, b.rec,
                        (const bf16 *)b.qkv, kv, wt, done);
        }
        next(HEADS, &wt, &done);
        launch(s, true, HEADS, 128, merge, b.o_in, (const float *)b.rec, wt, done);
        return b.o_in;
    };
    for (int l = 0; l < LAYERS; l++) {
        const bf16 *wm[MATS];
        for (int i = 0; i < MATS; i++)
            wm[i] = v.sep && !tiny ? b.sep[l][i]
                    : i == 0       ? b.w + (size_t)l * L.total()
                                   : wm[i - 1] + L.elems(i - 1);
        const bf16 *wq = wm[0], *wo = wm[1], *wgu = wm[2], *wd = wm[3];
        if (fold) { /* 6 kernels: the norms inside the GEMVs */
            run_gemv(gemv_fold<true, false>, b.qkv, b.x, wq, nq, HID, GEMV_WARPS);
            run_gemv(gemv_fold<false, true>, b.x, run_attn(l), wo, no, HID, GEMV_WARPS);
            run_gate_up(b.x, wgu);
            run_gemv(gemv_fold<false, true>, b.x, b.act, wd, nd, kd, GEMV_WARPS);
            continue;
        }
        waiter wt;
        unsigned *done;
        const bool norm_pdl = v.norm == N_PDL;
        /* without the norms the GEMVs read the kernel before's output */
        const bf16 *qkv_in = b.xn, *gu_in = b.xn;
        if (v.norm != N_NONE) {
            next(1, &wt, &done);
            launch(s, norm_pdl, 1, 512, norm, b.xn, b.x, (const bf16 *)b.down, wt, done);
        } else {
            qkv_in = b.down;
            gu_in = b.o;
        }
        run_gemv(plain, b.qkv, qkv_in, wq, nq, HID, GEMV_WARPS);
        run_gemv(plain, b.o, run_attn(l), wo, no, HID, GEMV_WARPS);
        if (v.norm != N_NONE) {
            next(1, &wt, &done);
            launch(s, norm_pdl, 1, 512, norm, b.xn, b.x, (const bf16 *)b.o, wt, done);
        }
        run_gate_up(gu_in, wgu);
        run_gemv(plain, b.down, b.act, wd, nd, kd, GEMV_WARPS);
    }
}

int main(int argc, char **argv)
{
    int device = 0, steps = 20;
    unsigned sleep_ns = 0;
    bool plant = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--sleep") == 0 && i + 1 < argc)
            sleep_ns = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--plant") == 0)
            plant = true;
        else {
            fprintf(stderr,
                    "usage: shoal-lab-boundary [--device N] [--steps N] [--sleep NS] [--plant]\n");
            return 2;
        }
    }
    if (steps < 1)
        steps = 1;
    CK(cudaSetDevice(device));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    bufs b = {};
    const layer_shape L8 = shape_of(false);
    const size_t big = L8.total() * LAYERS;
    CK(cudaMalloc(&b.w, big * sizeof(bf16)));
    CK(cudaMalloc(&b.x, HID * sizeof(bf16)));
    CK(cudaMalloc(&b.xn, HID * sizeof(bf16)));
    CK(cudaMalloc(&b.qkv, QKV * sizeof(bf16)));
    CK(cudaMalloc(&b.o_in, HID * sizeof(bf16)));
    CK(cudaMalloc(&b.o, HID * sizeof(bf16)));
    CK(cudaMalloc(&b.act, 2 * INTER * sizeof(bf16)));
    CK(cudaMalloc(&b.down, HID * sizeof(bf16)));
    CK(cudaMalloc(&b.rec, (size_t)KV_SEGS_MAX * 4 * HD * sizeof(float)));
    CK(cudaMalloc(&b.counts, LAYERS * KERNELS * sizeof(unsigned)));
    fill_bf16<<<2048, 256, 0, s>>>(b.w, big, 1u);
    CK(cudaStreamSynchronize(s));

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMalloc(&b.kv, (size_t)LAYERS * KV_SEGS_MAX * KV_SEG_BYTES));
    CK(cudaMemset(b.kv, 0x11, (size_t)LAYERS * KV_SEGS_MAX * KV_SEG_BYTES));
    CK(cudaFuncSetAttribute(attn_kv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            KV_SEG_BYTES));
    CK(cudaFuncSetAttribute(attn_heavy, cudaFuncAttributeMaxDynamicSharedMemorySize, KVH_SMEM));
    /* the same weights again, a matrix an allocation (the sep variants) */
    for (int l = 0; l < LAYERS; l++) {
        size_t off = (size_t)l * L8.total();
        for (int i = 0; i < MATS; i++) {
            CK(cudaMalloc(&b.sep[l][i], L8.elems(i) * sizeof(bf16)));
            CK(cudaMemcpy(b.sep[l][i], b.w + off, L8.elems(i) * sizeof(bf16),
                          cudaMemcpyDeviceToDevice));
            off += L8.elems(i);
        }
    }
    const variant vs[] = {
        {"pdl", W_PDL, N_PDL, A_STAND},      {"model", W_PDL, N_PLAIN, A_STAND},
        {"count", W_COUNT, N_PDL, A_STAND},  {"nonorm", W_PDL, N_NONE, A_STAND},
        {"noattn", W_PDL, N_PLAIN, A_NONE},  {"bare", W_PDL, N_NONE, A_NONE},
        {"kv", W_PDL, N_PLAIN, A_KV},        {"kv-pdl", W_PDL, N_PDL, A_KV},
        {"fold", W_PDL, N_FOLD, A_STAND},    {"model-l", W_PDL, N_PLAIN, A_STAND, true},
        {"bare-l", W_PDL, N_NONE, A_NONE, true}, {"kv-l", W_PDL, N_PLAIN, A_KV, true},
        /* the model's parts added to the stand-in one at a time: S the
         * SwiGLU GEMV, H the partials' footprint with the KV, A the
         * weights in separate allocations (rows 25.7) */
        {"model-l S", W_PDL, N_PLAIN, A_STAND, true, true},
        {"fold S", W_PDL, N_FOLD, A_STAND, false, true},
        {"model-l H", W_PDL, N_PLAIN, A_HEAVY, true},
        {"fold H", W_PDL, N_FOLD, A_HEAVY},
        {"model-l A", W_PDL, N_PLAIN, A_STAND, true, false, true},
        {"fold A", W_PDL, N_FOLD, A_STAND, false, false, true},
        {"model-l SHA", W_PDL, N_PLAIN, A_HEAVY, true, true, true},
        {"fold SHA", W_PDL, N_FOLD, A_HEAVY, false, true, true},
        {"model SHA", W_PDL, N_PLAIN, A_HEAVY, false, true, true},
        {"pdl SHA", W_PDL, N_PDL, A_HEAVY, false, true, true},
    };
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    for (int tiny = 1; tiny >= 0; tiny--) {
        /* each kernel set's first variant is its reference */
        std::vector<std::vector<uint16_t>> ref(24);
        for (int m = 0; m < nv; m++) {
            const variant &v = vs[m];
            /* the same inputs for every way */
            fill_bf16<<<4, 256, 0, s>>>(b.x, HID, 2u);
            fill_bf16<<<4, 256, 0, s>>>(b.down, HID, 3u);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            step(s, b, v, tiny, plant && v.wait == W_COUNT, sleep_ns);
            CK(cudaStreamEndCapture(s, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            CK(cudaGraphLaunch(exec, s)); /* one step: the output compared */
            CK(cudaStreamSynchronize(s));
            std::vector<uint16_t> got(HID);
            /* the last kernel's output: x where the norms run, else down */
            CK(cudaMemcpy(got.data(), v.norm == N_NONE ? b.down : b.x, HID * 2,
                          cudaMemcpyDeviceToHost));
            std::vector<uint16_t> &r =
                ref[(v.norm == N_NONE ? 8 : v.norm == N_FOLD ? 16 : 0) + (int)v.attn * 2 +
                    (int)v.swiglu];
            if (r.empty())
                r = got;
            int differ = 0;
            for (int i = 0; i < HID; i++)
                differ += got[i] != r[i];
            std::vector<double> t;
            for (int rep = 0; rep < 5; rep++) {
                CK(cudaEventRecord(e0, s));
                for (int i = 0; i < steps; i++)
                    CK(cudaGraphLaunch(exec, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back((double)ms * 1e3 / steps);
            }
            const double us = median(t);
            printf("%-5s %-11s %9.1f us a step %7.2f us a layer  out: %d of %d differ\n",
                   tiny ? "tiny" : "8B", v.name, us, us / LAYERS, differ, HID);
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
        }
    }

    /* the copy bandwidth of this run: (read + write) bytes over the time */
    const size_t cb = (size_t)1 << 30;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 4; i++)
        CK(cudaMemcpyAsync(b.w, (unsigned char *)b.w + cb, cb, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float cms = 0.0f;
    CK(cudaEventElapsedTime(&cms, e0, e1));
    const double copy_gbs = 4.0 * 2.0 * (double)cb / ((double)cms * 1e-3) / 1e9;
    const double bytes = (double)L8.total() * 2.0;
    printf("copy bandwidth %.1f GB/s: a layer's %.1f MB in %.2f us\n", copy_gbs, bytes / 1e6,
           bytes / (copy_gbs * 1e9) * 1e6);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 0;
}
