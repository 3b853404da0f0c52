#include "common_dtype.h"

static const struct {
    const char *name;
    size_t bytes;
} dtype_info[SHOAL_DTYPE__COUNT] = {
    [SHOAL_DTYPE_INVALID] = {"INVALID", 0}, [SHOAL_DTYPE_F32] = {"F32", 4},
    [SHOAL_DTYPE_F16] = {"F16", 2},         [SHOAL_DTYPE_BF16] = {"BF16", 2},
    [SHOAL_DTYPE_F64] = {"F64", 8},         [SHOAL_DTYPE_I64] = {"I64", 8},
    [SHOAL_DTYPE_I32] = {"I32", 4},         [SHOAL_DTYPE_I16] = {"I16", 2},
    [SHOAL_DTYPE_I8] = {"I8", 1},           [SHOAL_DTYPE_U8] = {"U8", 1},
    [SHOAL_DTYPE_BOOL] = {"BOOL", 1},       [SHOAL_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [SHOAL_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

size_t shoal_dtype_bytes(shoal_dtype dtype)
{
    return (unsigned)dtype < SHOAL_DTYPE__COUNT ? dtype_info[dtype].bytes : 0;
}

const char *shoal_dtype_name(shoal_dtype dtype)
{
    return (unsigned)dtype < SHOAL_DTYPE__COUNT ? dtype_info[dtype].name : "INVALID";
}

shoal_dtype shoal_dtype_parse(const char *name)
{
    for (int d = 1; d < SHOAL_DTYPE__COUNT; d++)
        if (strcmp(name, dtype_info[d].name) == 0)
            return (shoal_dtype)d;
    return SHOAL_DTYPE_INVALID;
}

float shoal_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t shoal_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to or past 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal half: subnormal */
        if (abs < 0x33000000u)
            return (uint16_t)sign;
        /* value = man24 * 2^(exp - 150); in units of 2^-24 that is
         * man24 >> (126 - exp), rounded to nearest even. */
        uint32_t exp = abs >> 23;
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp;
        uint32_t out = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (out & 1u)))
            out++;
        return (uint16_t)(sign | out);
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | (((r >> 23) - 127 + 15) << 10) | ((r >> 13) & 0x3ffu));
}
