/* kernels_fp8.h: fp8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits with bias
 * 7, 3 mantissa bits, no infinities, 0x7f/0xff NaN, largest finite 448), the
 * KV cache's 8-bit format.
 *
 * The encoder rounds to nearest even and saturates to +-448 (CUDA's
 * __NV_SATFINITE); NaN becomes 0x7f. The CUDA kernels convert with the
 * hardware instruction and the contract tests hold the two to the same
 * bytes. */
#ifndef SHOAL_KERNELS_FP8_H
#define SHOAL_KERNELS_FP8_H

#include "kernels/kernels_hd.h"

KERNELS_HD uint8_t kernels_f32_to_e4m3(float f)
{
    uint32_t u = kernels_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return 0x7f;
    if (u >= 0x43e00000u) /* >= 448 (and inf): the largest finite */
        return (uint8_t)(sign | 0x7e);
    if (u < 0x3c800000u) {
        /* under 2^-6: a multiple of 2^-9, exact in float, rounded to even;
         * 8 * 2^-9 is 2^-6, whose code 0x08 is the smallest normal */
        float q = kernels_bits_f32(u) * 512.0f;
        uint32_t n = (uint32_t)q;
        float rest = q - (float)n;
        if (rest > 0.5f || (rest == 0.5f && (n & 1u)))
            n++;
        return (uint8_t)(sign | n);
    }
    /* normal: round the 23-bit mantissa to 3 bits, to nearest even; a
     * carry moves into the exponent, and the result stays <= 448 */
    u += 0x7ffffu + ((u >> 20) & 1u);
    uint32_t e = (u >> 23) - 127u + 7u;
    return (uint8_t)(sign | (e << 3) | ((u >> 20) & 7u));
}

KERNELS_HD float kernels_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    if ((b & 0x7fu) == 0x7fu)
        return kernels_bits_f32(0x7fc00000u | sign);
    if (e == 0) /* subnormal: m * 2^-9 */
        return kernels_bits_f32(kernels_f32_bits((float)m * 0.001953125f) | sign);
    return kernels_bits_f32(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

#endif
