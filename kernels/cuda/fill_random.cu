/* The dummy-weight generator: the twin of kernels/cpu/fill_random.c, the
 * same numbers to the bit. The float steps are written with __fmul_rn and
 * __fadd_rn, which the compiler never fuses into an fma: the host computes
 * base + scale * u with two roundings. */
#include "cuda_ops.h"

static __global__ void fill_random_kernel(uint16_t *dst, size_t n, uint64_t state, float base,
                                          float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        /* common_rng_next after i + 1 steps */
        uint64_t z = state + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z = z ^ (z >> 31);
        /* common_rng_uniform: the product by 2^-52 is exact, so a fused
         * multiply-subtract rounds the same as the host's two steps */
        float u = (float)(__dsub_rn(__dmul_rn((double)(z >> 11), 0x1.0p-52), 1.0));
        float f = __fadd_rn(base, __fmul_rn(scale, u));
        /* shoal_f32_to_bf16: round to nearest even, NaN kept quiet */
        uint32_t b = __float_as_uint(f);
        uint16_t h;
        if ((b & 0x7fffffffu) > 0x7f800000u)
            h = (uint16_t)((b >> 16) | 0x40u);
        else
            h = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
        dst[i] = h;
    }
}

void cuda_fill_random(kernels_backend *be, void *dst, size_t n, uint64_t state, float base,
                      float scale)
{
    CUDA_ASSERT_ALIGNED(dst, 2);
    if (n == 0 || !cuda_usable(be))
        return;
    size_t blocks = (n + 255) / 256;
    if (blocks > 132 * 64)
        blocks = 132 * 64;
    fill_random_kernel<<<(unsigned)blocks, 256, 0, cuda_of(be)->stream>>>((uint16_t *)dst, n,
                                                                          state, base, scale);
    cuda_launched(be, "fill_random");
}
