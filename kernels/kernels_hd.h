/* kernels_hd.h: small functions compiled for the host and, under nvcc, for
 * the device too, so that the CPU reference and the CUDA kernels share one
 * definition where bits must agree. */
#ifndef SHOAL_KERNELS_HD_H
#define SHOAL_KERNELS_HD_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KERNELS_HD static inline __host__ __device__
#else
#define KERNELS_HD static inline
#endif

KERNELS_HD uint32_t kernels_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KERNELS_HD float kernels_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
