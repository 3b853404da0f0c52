/* The one-row GEMV's warp: a weight row streamed in 16-byte loads and
 * its dot products with the input rows (matmul.cu's GEMV; the kernel lab's
 * persistent variants, kernels/lab/bench_persistent.cu, take the same
 * sums). */
#ifndef SHOAL_KERNELS_CUDA_GEMV_CUH
#define SHOAL_KERNELS_CUDA_GEMV_CUH

#include "cuda_ops.h"

/* Few rows (decode): the GEMM is a stream over the weights, which cuBLAS
 * reads well below the copy bandwidth at one row. One warp per weight row
 * n reads it once in 16-byte loads, gemv_unroll of them in flight per lane
 * (kept out of L1, so the inputs, read by every warp, stay there), and
 * takes the dot products with all R input rows; the k-sums go lane-local
 * then across the warp, the same order for every row count. */
enum { GEMV_WARPS = 4, GEMV_LOADS_ONE_ROW = 16, GEMV_LOADS_ROWS = 8 };

/* Loads in flight a lane: at one row a whole 4,096-column row (16 a lane,
 * every load of the q/k/v, o, gate/up and lm_head rows issued before the
 * wait; 160-164 registers, three blocks a multiprocessor); at more rows 8
 * (each row's input loads take registers too). SHOAL_CUDA_GEMV_LOADS=8
 * takes 8 at one row as well (kernels/lab row 22.2). */
template <int R> static constexpr __host__ __device__ int gemv_unroll()
{
    return R == 1 ? GEMV_LOADS_ONE_ROW : GEMV_LOADS_ROWS;
}

static __device__ __forceinline__ uint4 ld_stream16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b)
{
    const __nv_bfloat162 *x = (const __nv_bfloat162 *)&a, *y = (const __nv_bfloat162 *)&b;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
        s = fmaf(fx.x, fy.x, s);
        s = fmaf(fx.y, fy.y, s);
    }
    return s;
}

template <bool COHERENT> static __device__ __forceinline__ uint4 x_at(const uint4 *p)
{
    if constexpr (COHERENT)
        return *p;
    else
        return __ldg(p);
}

/* One warp's dot products of weight row wr (chunks 16-byte chunks) with
 * the R input rows at x, lane-local in ascending chunk order (so a row's
 * sum is the same whichever kernel streams it); acc is the lane's part.
 * The first U loads of each lane (gemv_unroll), weights only, are issued
 * before wait() (the GEMV: pdl_wait, cuda_ops.h, for the kernel that
 * writes the input), so the weight stream starts while that kernel
 * drains. A warp without a row (valid false) waits and adds nothing.
 * COHERENT: the input rows by plain loads, where the same kernel wrote
 * them (else through the read-only path, __ldg). SQ: sq[r] also gets the
 * lane's part of input row r's sum of squares, chunk by chunk in the
 * same order (each chunk of the row is some lane's, once). */
template <int R, bool COHERENT = false, int U = gemv_unroll<R>(), bool SQ = false, typename Wait>
static __device__ __forceinline__ void gemv_dot(float (&acc)[R], const uint4 *wr, const uint4 *x,
                                                int chunks, int lane, bool valid, Wait wait,
                                                float *sq = nullptr)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.0f;
        if constexpr (SQ)
            sq[r] = 0.0f;
    }
    /* one input chunk into the sums of row r */
    auto take = [&](uint4 wv, int r, int chunk) {
        const uint4 xv = x_at<COHERENT>(x + (size_t)r * chunks + chunk);
        acc[r] += dot8_bf16(wv, xv);
        if constexpr (SQ)
            sq[r] += dot8_bf16(xv, xv); /* the chunk's sum of squares */
    };
    /* the first group of loads, before the wait; the loops after are
     * the plain ones (unpredicated full groups, then a tail) */
    uint4 wv[U];
    int c = lane;
    const bool first = valid && c + (U - 1) * 32 < chunks;
    if (first)
#pragma unroll
        for (int u = 0; u < U; u++)
            wv[u] = ld_stream16(wr + c + u * 32);
    wait();
    if (!valid)
        return;
    if (first) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                take(wv[u], r, c + u * 32);
        c += U * 32;
    }
    for (; c + (U - 1) * 32 < chunks; c += U * 32) {
#pragma unroll
        for (int u = 0; u < U; u++)
            wv[u] = ld_stream16(wr + c + u * 32);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                take(wv[u], r, c + u * 32);
    }
    for (; c < chunks; c += 32) {
        uint4 w1 = ld_stream16(wr + c);
#pragma unroll
        for (int r = 0; r < R; r++)
            take(w1, r, c);
    }
}

#endif
