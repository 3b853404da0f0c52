/* L2 prefetch: a hint that an op soon reads a range of device memory.
 * No CPU twin: the CPU backend has no such op (kernels_backend.h).
 *
 * At one decode row attention reads its KV at about a quarter of the
 * memory's bandwidth (latency-bound: a few tiles a block), while the
 * o projection after it streams 33.5 MB of weights (Qwen3-8B) at the copy
 * bandwidth. Prefetched into L2 while attention runs, those weights are
 * read from L2 by the GEMV. Each thread hands the copy engine of its
 * multiprocessor one range (cp.async.bulk.prefetch.L2, sm_90), which
 * fetches it without holding the thread; the kernel ends at once. */
#include "cuda_ops.h"

enum { PREFETCH_CHUNK = 16 << 10, PREFETCH_THREADS = 32 };

/* Launched with programmatic serialization after the kernel that writes
 * attention's inputs: it touches none of them, and waits for that kernel
 * before it returns, so the kernel after this one (launched plainly)
 * still runs after it. */
static __global__ void prefetch_l2_kernel(const unsigned char *p, size_t bytes)
{
    pdl_trigger();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const size_t step = (size_t)gridDim.x * PREFETCH_THREADS * PREFETCH_CHUNK;
    for (size_t at = ((size_t)blockIdx.x * PREFETCH_THREADS + threadIdx.x) * PREFETCH_CHUNK;
         at < bytes; at += step) {
        uint32_t n = (uint32_t)(bytes - at < PREFETCH_CHUNK ? bytes - at : PREFETCH_CHUNK);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + at), "r"(n)
                     : "memory");
    }
#endif
    pdl_wait();
}

void cuda_prefetch(kernels_backend *be, const void *ptr, size_t bytes)
{
    const cuda_state *st = cuda_of(be);
    /* the copy engine takes 16-byte ranges at 16-byte addresses: a hint
     * is cut to those, never refused */
    size_t skip = (16 - (uintptr_t)ptr % 16) % 16;
    if (bytes <= skip)
        return;
    ptr = (const unsigned char *)ptr + skip;
    bytes -= skip;
    bytes = bytes < st->prefetch_bytes_max ? bytes : st->prefetch_bytes_max;
    bytes &= ~(size_t)15;
    if (bytes == 0 || !cuda_usable(be))
        return;
    size_t chunks = (bytes + PREFETCH_CHUNK - 1) / PREFETCH_CHUNK;
    size_t blocks = (chunks + PREFETCH_THREADS - 1) / PREFETCH_THREADS;
    if (blocks > (size_t)st->sm_count)
        blocks = (size_t)st->sm_count;
    cuda_launch_pdl(st->stream, (unsigned)blocks, PREFETCH_THREADS, prefetch_l2_kernel,
                    (const unsigned char *)ptr, bytes);
    cuda_launched(be, "prefetch");
}
