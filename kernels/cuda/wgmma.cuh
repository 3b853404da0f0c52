/* wgmma.cuh: Hopper's warpgroup matrix multiply (wgmma.mma_async), as the
 * prompt attention kernel uses it. Private to kernels/cuda/.
 *
 * A warpgroup (4 warps, 128 threads) multiplies a 64 x 16 A by a 16 x N B
 * into a 64 x N f32 accumulator held across its threads: warp w of the
 * group holds rows 16w .. 16w + 15, in the layout of mma.sync's m16n8 C
 * fragment repeated N / 8 times (d[i] is the fragment of columns 8i ..
 * 8i + 7), so the flash-attention softmax of attention_mma.cuh runs on it
 * unchanged. A comes from shared memory or from registers (the m16n8k16 A
 * fragment, per warp); B from shared memory.
 *
 * Shared-memory operands here are tiles of 128-byte rows in the 128-byte
 * swizzle: 16-byte chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4) from
 * a 1024-byte-aligned base, which is what the hardware's swizzle mode 1
 * reads (address bits 4-6 XOR bits 7-9). A tile of 128-element bf16 rows
 * is two such tiles, one per 64-column half (sw128_at).
 *
 * The instructions need sm_90a: compiled for anything else, the wrappers
 * are empty and cuda_wgmma_usable() says no (attention_prompt.cu). */
#ifndef SHOAL_KERNELS_CUDA_WGMMA_CUH
#define SHOAL_KERNELS_CUDA_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SHOAL_WGMMA 1
#endif

namespace wg {

/* Byte offset of 16-byte chunk c (of HD * 2 / 16) of row `row` in a tile of
 * ROWS rows of bf16 elements, stored as 64-column halves of ROWS x 128
 * bytes each, 128-byte swizzled. */
template <int ROWS>
static __device__ __forceinline__ uint32_t sw128_at(int row, int c)
{
    return (uint32_t)((c >> 3) * (ROWS * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}

/* A shared-memory matrix descriptor, 128-byte swizzle: start address, the
 * leading and stride byte offsets (PTX ISA, "Matrix Descriptor Format";
 * all in 16-byte units). K-major tiles: stride = 1024 (8 rows of 128
 * bytes), leading unused. MN-major: leading = bytes from one 64-element
 * half to the next, stride = 1024 (8 rows along K). */
static __device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lead, uint32_t stride)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lead & 0x3ffff) >> 4) << 16 |
           (uint64_t)((stride & 0x3ffff) >> 4) << 32 | 1ull << 62;
}

static __device__ __forceinline__ void fence()
{
#ifdef SHOAL_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void commit()
{
#ifdef SHOAL_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N> static __device__ __forceinline__ void wait()
{
#ifdef SHOAL_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Shared memory written by threads (cp.async, st.shared) made visible to
 * the tensor cores' reads, which go through the async proxy. */
static __device__ __forceinline__ void fence_smem()
{
#ifdef SHOAL_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Shared-memory barriers (mbarrier) between the warps of a block and the
 * tensor memory accelerator's copies: one thread initializes a barrier with
 * the arrivals a phase takes (bar_init_fence, then the block syncs);
 * arrive() counts one; arrive_expect() counts one and adds the bytes that
 * copies will bring (they complete the phase as they land); wait(parity)
 * returns once the phase of that parity has completed (0 for a barrier's
 * first phase, 1 for its second, ...; on a fresh barrier, parity 1 is taken
 * as done, which is how a producer's first wait on an empty slot passes). */
static __device__ __forceinline__ void bar_init(uint32_t bar, int count)
{
#ifdef SHOAL_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

static __device__ __forceinline__ void bar_init_fence()
{
#ifdef SHOAL_WGMMA
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void bar_arrive(uint32_t bar)
{
#ifdef SHOAL_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

static __device__ __forceinline__ void bar_arrive_expect(uint32_t bar, uint32_t bytes)
{
#ifdef SHOAL_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
#endif
}

static __device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity)
{
#ifdef SHOAL_WGMMA
    asm volatile("{\n.reg .pred done;\nretry:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra retry;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#endif
}

/* The stages of a TMA-fed GEMM (gemm_rows.cu): dynamic
 * shared memory from its first 1,024-byte boundary (the swizzle's repeat;
 * the allocation asks for 1,024 more), and the stages' barrier pairs at
 * full0 and empty0 (8 bytes apart), set by thread 0: `full` completes
 * once the producer's copies have landed, `empty` once each of the
 * `consumers` computing warps has arrived. The block syncs after. */
static __device__ __forceinline__ unsigned char *align_1024(unsigned char *raw)
{
    return raw + ((1024 - ((uintptr_t)raw & 1023)) & 1023);
}

static __device__ __forceinline__ void stages_init(uint32_t full0, uint32_t empty0, int stages,
                                                   int consumers)
{
    if (threadIdx.x == 0) {
        for (int i = 0; i < stages; i++) {
            bar_init(full0 + 8 * i, 1);
            bar_init(empty0 + 8 * i, consumers);
        }
        bar_init_fence();
    }
}

/* One m64n64 accumulator (d of a warpgroup's thread, warp w of the group)
 * into shared memory transposed: red[column][col0 + row], `stride` floats
 * a column (the GEMMs' A rows are weight rows, their columns the round's
 * rows). */
static __device__ __forceinline__ void sums_to_smem(const float (&d)[8][4], float *red, int stride,
                                                    int col0, int warp, int lane)
{
    const int r = col0 + 16 * warp + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(8 * i + c + (e & 1)) * stride + r + (e >> 1) * 8] = d[i][e];
}

/* One box of a 2-D tensor map (a __grid_constant__ kernel parameter) at
 * column `col`, row `row` into shared memory at dst, its bytes counted on
 * barrier bar. The map's 128-byte swizzle applies as sw128_at's does, from
 * dst (a multiple of 1,024 bytes). */
static __device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, int col, int row,
                                                   uint32_t bar)
{
#ifdef SHOAL_WGMMA
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
#endif
}

/* The same from a 3-D tensor map: the box at (x, y, z). */
static __device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *map, int x, int y,
                                                   int z, uint32_t bar)
{
#ifdef SHOAL_WGMMA
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
#endif
}

/* A named block barrier (ids 1-15; 0 is __syncthreads): waits until
 * `count` threads of the block have come to barrier `id`. */
static __device__ __forceinline__ void named_sync(int id, int count)
{
#ifdef SHOAL_WGMMA
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

/* The registers a warpgroup's threads may hold from here on (warp
 * specialization: the copying group gives registers to the computing ones). */
template <int N> static __device__ __forceinline__ void regs_dec()
{
#ifdef SHOAL_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N> static __device__ __forceinline__ void regs_inc()
{
#ifdef SHOAL_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* The compiler sees an accumulator as written when the mma is issued; it
 * is written when the group is waited on. keep() pins each register's
 * reads after the wait, and its writes (a rescale, P's packing) before
 * the next wgmma.fence. */
static __device__ __forceinline__ void pin(float &x)
{
    asm volatile("" : "+f"(x)::"memory");
}

static __device__ __forceinline__ void pin(uint32_t &x)
{
    asm volatile("" : "+r"(x)::"memory");
}

template <typename T, int N> static __device__ __forceinline__ void keep(T (&d)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            pin(d[i][e]);
}

#define SHOAL_WG_D64(c)                                                                       \
    c(d[0][0]), c(d[0][1]), c(d[0][2]), c(d[0][3]), c(d[1][0]), c(d[1][1]),   \
        c(d[1][2]), c(d[1][3]), c(d[2][0]), c(d[2][1]), c(d[2][2]),              \
        c(d[2][3]), c(d[3][0]), c(d[3][1]), c(d[3][2]), c(d[3][3]),              \
        c(d[4][0]), c(d[4][1]), c(d[4][2]), c(d[4][3]), c(d[5][0]),              \
        c(d[5][1]), c(d[5][2]), c(d[5][3]), c(d[6][0]), c(d[6][1]),              \
        c(d[6][2]), c(d[6][3]), c(d[7][0]), c(d[7][1]), c(d[7][2]),              \
        c(d[7][3]), c(d[8][0]), c(d[8][1]), c(d[8][2]), c(d[8][3]),              \
        c(d[9][0]), c(d[9][1]), c(d[9][2]), c(d[9][3]), c(d[10][0]),             \
        c(d[10][1]), c(d[10][2]), c(d[10][3]), c(d[11][0]), c(d[11][1]),         \
        c(d[11][2]), c(d[11][3]), c(d[12][0]), c(d[12][1]), c(d[12][2]),         \
        c(d[12][3]), c(d[13][0]), c(d[13][1]), c(d[13][2]), c(d[13][3]),         \
        c(d[14][0]), c(d[14][1]), c(d[14][2]), c(d[14][3]), c(d[15][0]),         \
        c(d[15][1]), c(d[15][2]), c(d[15][3])
#define SHOAL_WG_R64                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
    "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
    "%55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d += A B, m64n128k16, bf16 in, f32 accumulate; A and B K-major in
 * shared memory. */
static __device__ __forceinline__ void mma_ss(float (&d)[16][4], uint64_t a, uint64_t b)
{
#ifdef SHOAL_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SHOAL_WG_R64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SHOAL_WG_D64("+f")
                 : "l"(a), "l"(b), "r"(1));
#endif
}

/* d = A B, as mma_ss: d's old values are neither read nor kept alive. */
static __device__ __forceinline__ void mma_ss_first(float (&d)[16][4], uint64_t a, uint64_t b)
{
#ifdef SHOAL_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SHOAL_WG_R64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SHOAL_WG_D64("=f")
                 : "l"(a), "l"(b), "r"(0));
#endif
}

/* d += A B, m64n128k16: A from registers (each warp's m16n8k16 A fragment
 * of its 16 rows), B N-major in shared memory (rows of K, N contiguous). */
static __device__ __forceinline__ void mma_rs_nmajor(float (&d)[16][4], const uint32_t (&a)[4],
                                                     uint64_t b)
{
#ifdef SHOAL_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SHOAL_WG_R64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SHOAL_WG_D64("+f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}

#define SHOAL_WG_D32(c)                                                                       \
    c(d[0][0]), c(d[0][1]), c(d[0][2]), c(d[0][3]), c(d[1][0]), c(d[1][1]), c(d[1][2]),       \
        c(d[1][3]), c(d[2][0]), c(d[2][1]), c(d[2][2]), c(d[2][3]), c(d[3][0]), c(d[3][1]),   \
        c(d[3][2]), c(d[3][3]), c(d[4][0]), c(d[4][1]), c(d[4][2]), c(d[4][3]), c(d[5][0]),   \
        c(d[5][1]), c(d[5][2]), c(d[5][3]), c(d[6][0]), c(d[6][1]), c(d[6][2]), c(d[6][3]),   \
        c(d[7][0]), c(d[7][1]), c(d[7][2]), c(d[7][3])

/* d += A B, m64n64k16, bf16 in, f32 accumulate; A and B K-major in shared
 * memory (gemm_rows.cu: A the weights, B the
 * round's rows). */
static __device__ __forceinline__ void mma_ss_n64(float (&d)[8][4], uint64_t a, uint64_t b)
{
#ifdef SHOAL_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SHOAL_WG_D32("+f")
                 : "l"(a), "l"(b), "r"(1));
#endif
}

#undef SHOAL_WG_D32
#undef SHOAL_WG_D64
#undef SHOAL_WG_R64

} // namespace wg

#endif
