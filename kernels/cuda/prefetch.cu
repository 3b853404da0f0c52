/* The prefetch hint (kernels_backend.h): weights an op soon reads, moved
 * into L2 while the kernels before it leave the memory idle. No CPU twin:
 * the CPU backend has no such op.
 *
 * At one row a decode layer's attention chain (rope, the partials, the
 * merge) is bound by latency, not bytes: about 15 us a layer at 4k
 * context for 4 us of KV at the copy bandwidth. The o projection's
 * weights after it (32 MiB at the 8B shape) may stream in meanwhile, so
 * that its GEMV reads them from L2. */
#include "cuda_ops.h"

enum { PREFETCH_BLOCK_BYTES = 256 << 10, PREFETCH_PIECE = 64 << 10 };

/* Launched with programmatic serialization after the kernel before (the
 * q/k/v matmul). Each block waits for that kernel, so that the kernels
 * after, which start as this one triggers, still find everything before
 * it complete once they wait; then asks for its slice of the bytes, which
 * stream in while those kernels wait on each other (with early, before
 * the wait: under the kernel before's own stream, for comparison). */
static __global__ void prefetch_l2(const unsigned char *p, size_t bytes, bool early)
{
    pdl_trigger();
    if (!early)
        pdl_wait();
    const size_t b0 = (size_t)blockIdx.x * PREFETCH_BLOCK_BYTES;
    const size_t end = b0 + PREFETCH_BLOCK_BYTES < bytes ? b0 + PREFETCH_BLOCK_BYTES : bytes;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0)
        for (size_t o = b0; o < end; o += PREFETCH_PIECE) {
            uint32_t n = (uint32_t)(end - o < PREFETCH_PIECE ? end - o : PREFETCH_PIECE);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + o), "r"(n)
                         : "memory");
        }
#else
    for (size_t o = b0 + (size_t)threadIdx.x * 128; o < end; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + o));
#endif
    if (early)
        pdl_wait();
}

void cuda_prefetch(kernels_backend *be, const void *p, size_t bytes, int rows)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(rows >= 0);
    if (bytes > st->prefetch_bytes)
        bytes = st->prefetch_bytes;
    bytes &= ~(size_t)15; /* the bulk prefetch's unit */
    if (bytes == 0 || rows > st->prefetch_rows || (uintptr_t)p % 16 != 0 || !cuda_usable(be))
        return;
    unsigned blocks = (unsigned)((bytes + PREFETCH_BLOCK_BYTES - 1) / PREFETCH_BLOCK_BYTES);
    cuda_launch_pdl(st->stream, dim3(blocks), 32, prefetch_l2, (const unsigned char *)p, bytes,
                    st->prefetch_early);
    cuda_launched(be, "prefetch");
}
