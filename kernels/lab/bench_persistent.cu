/* shoal-lab-persistent: whether one persistent kernel a layer could pay at
 * one row (kernels/lab/README.md, "Next at one row"), measured on the
 * decode MLP at the 8B shape (gate and up [12288][4096], down
 * [4096][12288], bf16):
 *
 *   pair        the backend's two kernels as the model calls them
 *               (matmul_swiglu's GEMV, then matmul's; programmatic
 *               serialization between them, so the down GEMV's first
 *               loads run under the gate/up GEMV's tail);
 *   persistent  one cooperative kernel of every resident block: each warp
 *               streams gate and up rows in a loop and writes silu(g) * u,
 *               issues its first down row's first loads, meets the others
 *               at a grid barrier, then streams down rows. The warps take
 *               the GEMV's sums (gemv.cuh), so the outputs equal the
 *               pair's bit for bit.
 *
 *   shoal-lab-persistent [--device N] [--calls N]
 *
 * Weights rotate through ten layers' MLPs (3 GB), so every call reads cold
 * weights as a step does. Prints each variant's microseconds a call (the
 * pair also replayed from a graph of --calls calls, as the model runs it,
 * and the grid barrier alone, a use, beside a lighter one)
 * (median of five runs of --calls back-to-back calls, default 50) beside
 * the bytes' time at the copy bandwidth measured in the same run, and
 * whether the two variants' outputs are equal. First run in the sixteenth
 * session (kernels/lab/README.md row 22.1): the pair streams at the copy
 * bandwidth, the persistent kernel is 5-12 us slower, a barrier costs
 * 1.4-2.9 us. */
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
            fprintf(stderr, "shoal-lab-persistent: %s: %s\n", #x, cudaGetErrorString(e_));       \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

enum { HID = 4096, INTER = 12288, LAYERS = 10, PW = 4 /* warps a persistent block */ };

/* A generation barrier over the grid's blocks (all resident: a
 * cooperative launch). Every thread of every block calls it once a use. */
struct grid_sync {
    unsigned count, gen;
};

static __device__ __forceinline__ void grid_barrier(grid_sync *gs)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = &gs->gen;
        const unsigned g = *gen; /* read before arriving: the last arrival moves it */
        __threadfence();         /* the block's writes, before its arrival */
        if (atomicAdd(&gs->count, 1u) == gridDim.x - 1) {
            atomicExch(&gs->count, 0u); /* for the next use, before anyone passes */
            __threadfence();
            atomicAdd(&gs->gen, 1u);
        } else {
            while (*gen == g)
                __nanosleep(64);
        }
        __threadfence(); /* the others' writes, after the pass */
    }
    __syncthreads();
}

/* The MLP at one row: act[j] = silu(g_j) * u_j with g and u rounded to
 * bf16 first (matmul_gemv's SwiGLU epilogue), then out = wd x act. */
static __global__ void __launch_bounds__(PW * 32)
    mlp_persistent(bf16 *out, bf16 *act, const bf16 *in, const bf16 *wg, const bf16 *wu,
                   const bf16 *wd, grid_sync *gs)
{
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * PW + (threadIdx.x >> 5), nw = gridDim.x * PW;
    for (int j = gw; j < INTER; j += nw) {
        float g[1], u[1];
        gemv_dot<1>(g, (const uint4 *)(wg + (size_t)j * HID), (const uint4 *)in, HID / 8, lane,
                    true, [] {});
        gemv_dot<1>(u, (const uint4 *)(wu + (size_t)j * HID), (const uint4 *)in, HID / 8, lane,
                    true, [] {});
        const float gs_ = warp_reduce(g[0], op_add()), us = warp_reduce(u[0], op_add());
        if (lane == 0) {
            const float gf = to_f32(from_f32<bf16>(gs_)), uf = to_f32(from_f32<bf16>(us));
            act[j] = from_f32<bf16>(gf / (1.0f + expf(-gf)) * uf);
        }
    }
    /* the first down row: its first loads, the barrier (every warp of the
     * block calls it once), the rest; act read by plain loads after it */
    for (int r = gw, first = 1; first || r < HID; r += nw, first = 0) {
        const bool valid = r < HID;
        float d[1];
        const uint4 *w = (const uint4 *)(wd + (size_t)(valid ? r : 0) * INTER);
        if (first)
            gemv_dot<1, true>(d, w, (const uint4 *)act, INTER / 8, lane, valid,
                              [gs] { grid_barrier(gs); });
        else
            gemv_dot<1, true>(d, w, (const uint4 *)act, INTER / 8, lane, true, [] {});
        if (!valid)
            break;
        const float v = warp_reduce(d[0], op_add());
        if (lane == 0)
            out[r] = from_f32<bf16>(v);
    }
}

/* The barrier alone: n uses of it by every resident block, nothing
 * between (its cost a use, the floor of any persistent layer's phase
 * boundary). */
static __global__ void __launch_bounds__(PW * 32) barriers_only(grid_sync *gs, int n)
{
    for (int i = 0; i < n; i++)
        grid_barrier(gs);
}

/* The lighter barrier: one release add a block on a count that only
 * grows, then an acquire spin until it reaches this use's target (base
 * plus the uses so far times the grid), no reset and no fence pair. */
static __device__ __forceinline__ void grid_barrier_count(unsigned *count, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        } while ((int)(v - target) < 0);
    }
    __syncthreads();
}

static __global__ void __launch_bounds__(PW * 32)
    barriers_count(unsigned *count, unsigned base, int n)
{
    for (int i = 0; i < n; i++)
        grid_barrier_count(count, base + (unsigned)(i + 1) * gridDim.x);
}

int main(int argc, char **argv)
{
    int device = 0, calls = 50;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc)
            calls = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: shoal-lab-persistent [--device N] [--calls N]\n");
            return 2;
        }
    }
    if (calls < 1)
        calls = 1;
    char dev[16];
    snprintf(dev, sizeof dev, "%d", device);
    kernels_backend_options opt = {};
    opt.device = dev;
    opt.act_dtype = SHOAL_DTYPE_BF16;
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    if (kernels_backend_open(&opt, &be, &diag) != SHOAL_OK) {
        fprintf(stderr, "shoal-lab-persistent: %s\n", diag.msg);
        return 1;
    }
    cudaStream_t stream = cuda_of(be)->stream;

    const size_t mlp = (size_t)2 * INTER * HID + (size_t)HID * INTER; /* elements a layer */
    bf16 *pool, *in, *act, *up, *out[2];
    grid_sync *gs;
    CK(cudaMalloc(&pool, mlp * LAYERS * sizeof(bf16)));
    CK(cudaMalloc(&in, HID * sizeof(bf16)));
    CK(cudaMalloc(&act, INTER * sizeof(bf16)));
    CK(cudaMalloc(&up, INTER * sizeof(bf16)));
    CK(cudaMalloc(&out[0], HID * sizeof(bf16)));
    CK(cudaMalloc(&out[1], HID * sizeof(bf16)));
    CK(cudaMalloc(&gs, sizeof *gs));
    CK(cudaMemsetAsync(gs, 0, sizeof *gs, stream));
    fill_bf16<<<1024, 256, 0, stream>>>(pool, mlp * LAYERS, 1u);
    fill_bf16<<<4, 256, 0, stream>>>(in, HID, 2u);
    CK(cudaStreamSynchronize(stream));

    int per_sm = 0, sms = cuda_of(be)->sm_count;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mlp_persistent, PW * 32, 0));
    const unsigned blocks = (unsigned)(per_sm * sms);
    printf("persistent grid: %u blocks of %d warps (%d a multiprocessor)\n", blocks, PW, per_sm);

    auto layer = [&](int l, const bf16 **g, const bf16 **u, const bf16 **d) {
        const bf16 *base = pool + (size_t)(l % LAYERS) * mlp;
        *g = base;
        *u = base + (size_t)INTER * HID;
        *d = base + (size_t)2 * INTER * HID;
    };
    auto run_pair = [&](int l, bf16 *o) {
        const bf16 *g, *u, *d;
        layer(l, &g, &u, &d);
        be->matmul_swiglu(be, act, up, in, g, u, SHOAL_DTYPE_BF16, 1, INTER, HID);
        be->matmul(be, o, SHOAL_DTYPE_BF16, act, d, SHOAL_DTYPE_BF16, 1, HID, INTER);
    };
    auto run_persistent = [&](int l, bf16 *o) {
        const bf16 *g, *u, *d;
        layer(l, &g, &u, &d);
        void *args[] = {&o, &act, &in, &g, &u, &d, &gs};
        CK(cudaLaunchCooperativeKernel((const void *)mlp_persistent, dim3(blocks), dim3(PW * 32),
                                       args, 0, stream));
    };

    /* the same layer through both, the outputs compared */
    run_pair(0, out[0]);
    /* act cleared between, so a persistent kernel that read it before
     * every warp had written it would differ (the pair left it equal) */
    CK(cudaMemsetAsync(act, 0, INTER * sizeof(bf16), stream));
    run_persistent(0, out[1]);
    CK(cudaStreamSynchronize(stream));
    if (be->sync(be) != SHOAL_OK) {
        fprintf(stderr, "shoal-lab-persistent: the backend's ops failed\n");
        return 1;
    }
    std::vector<uint16_t> h0(HID), h1(HID);
    CK(cudaMemcpy(h0.data(), out[0], HID * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), out[1], HID * 2, cudaMemcpyDeviceToHost));
    int differ = 0;
    for (int i = 0; i < HID; i++)
        differ += h0[i] != h1[i];

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time_calls = [&](auto fn) {
        std::vector<double> t;
        for (int rep = 0; rep < 5; rep++) {
            CK(cudaEventRecord(e0, stream));
            for (int i = 0; i < calls; i++)
                fn(i, out[0]);
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back((double)ms * 1e3 / calls);
        }
        return median(t);
    };
    const double pair_us = time_calls(run_pair), pers_us = time_calls(run_persistent);

    /* the pair as the model runs it: --calls calls recorded as one graph,
     * replayed */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        run_pair(i, out[0]);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    auto replay = [&](int, bf16 *) { CK(cudaGraphLaunch(exec, stream)); };
    CK(cudaGraphLaunch(exec, stream)); /* warm */
    const double graph_us = time_calls(replay) / calls;

    /* the barrier alone, 1,000 uses a launch */
    int nb = 1000;
    void *bargs[] = {&gs, &nb};
    auto run_barriers = [&](int, bf16 *) {
        CK(cudaLaunchCooperativeKernel((const void *)barriers_only, dim3(blocks), dim3(PW * 32),
                                       bargs, 0, stream));
    };
    const double barrier_us = time_calls(run_barriers) / nb;
    unsigned *count, base = 0; /* its own count: grid_barrier's must stay 0 between uses */
    CK(cudaMalloc(&count, sizeof *count));
    CK(cudaMemsetAsync(count, 0, sizeof *count, stream));
    auto run_counts = [&](int, bf16 *) {
        void *cargs[] = {&count, &base, &nb};
        CK(cudaLaunchCooperativeKernel((const void *)barriers_count, dim3(blocks), dim3(PW * 32),
                                       cargs, 0, stream));
        base += (unsigned)nb * blocks;
    };
    const double count_us = time_calls(run_counts) / nb;

    /* the copy bandwidth of this run: (read + write) bytes over the time */
    const size_t cb = (size_t)1 << 30;
    CK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 4; i++) /* 1 GiB from the pool's second GiB to its first */
        CK(cudaMemcpyAsync(pool, (unsigned char *)pool + cb, cb, cudaMemcpyDeviceToDevice,
                           stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float cms = 0.0f;
    CK(cudaEventElapsedTime(&cms, e0, e1));
    const double copy_gbs = 4.0 * 2.0 * (double)cb / ((double)cms * 1e-3) / 1e9;
    const double bytes = (double)mlp * 2.0;

    printf("copy bandwidth %.1f GB/s: the MLP's %.1f MB in %.1f us\n", copy_gbs, bytes / 1e6,
           bytes / (copy_gbs * 1e9) * 1e6);
    printf("pair        %8.2f us a call  %7.1f GB/s\n", pair_us, bytes / (pair_us * 1e-6) / 1e9);
    printf("pair graph  %8.2f us a call  %7.1f GB/s\n", graph_us, bytes / (graph_us * 1e-6) / 1e9);
    printf("persistent  %8.2f us a call  %7.1f GB/s\n", pers_us, bytes / (pers_us * 1e-6) / 1e9);
    printf("barrier     %8.3f us a use (%u blocks)\n", barrier_us, blocks);
    printf("barrier2    %8.3f us a use (release add, acquire spin)\n", count_us);
    printf("outputs: %d of %d differ%s\n", differ, HID, differ ? " (FAIL)" : "");
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    cudaFree(count);
    cudaFree(gs);
    cudaFree(out[1]);
    cudaFree(out[0]);
    cudaFree(up);
    cudaFree(act);
    cudaFree(in);
    cudaFree(pool);
    kernels_backend_close(be);
    return differ ? 1 : 0;
}
