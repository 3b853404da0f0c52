/* Helpers the kernel lab's CUDA programs share (bench_persistent.cu,
 * bench_boundary.cu). */
#ifndef SHOAL_KERNELS_LAB_LAB_UTIL_CUH
#define SHOAL_KERNELS_LAB_LAB_UTIL_CUH

#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

/* Random bf16 in [-0.05, 0.05) from a hash of the index. */
static __global__ void fill_bf16(__nv_bfloat16 *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)(i * 2654435761u) ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(((float)(h & 0xffffu) / 65536.0f - 0.5f) * 0.1f);
    }
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

#endif
