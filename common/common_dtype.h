/* common_dtype.h: element types of tensors and their conversions.
 *
 * bf16 and fp16 are stored as uint16_t bit patterns. Conversions round to
 * nearest even, as torch does. */
#ifndef SHOAL_COMMON_DTYPE_H
#define SHOAL_COMMON_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum shoal_dtype {
    SHOAL_DTYPE_INVALID = 0,
    SHOAL_DTYPE_F32,
    SHOAL_DTYPE_F16,
    SHOAL_DTYPE_BF16,
    SHOAL_DTYPE_F64,
    SHOAL_DTYPE_I64,
    SHOAL_DTYPE_I32,
    SHOAL_DTYPE_I16,
    SHOAL_DTYPE_I8,
    SHOAL_DTYPE_U8,
    SHOAL_DTYPE_BOOL,
    SHOAL_DTYPE_F8_E4M3,
    SHOAL_DTYPE_F8_E5M2,
    SHOAL_DTYPE__COUNT
} shoal_dtype;

/* Bytes per element; 0 for SHOAL_DTYPE_INVALID. */
size_t shoal_dtype_bytes(shoal_dtype dtype);

/* The safetensors spelling ("BF16", "F32", ...) and back. The parse
 * returns SHOAL_DTYPE_INVALID for a name it does not know. */
const char *shoal_dtype_name(shoal_dtype dtype);
shoal_dtype shoal_dtype_parse(const char *name);

static inline float shoal_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t shoal_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float shoal_f16_to_f32(uint16_t h);
uint16_t shoal_f32_to_f16(float f);

/* Element i of a float tensor of the given dtype (F32, F16 or BF16). */
static inline float shoal_load_f32(const void *data, shoal_dtype dtype, size_t i)
{
    switch (dtype) {
    case SHOAL_DTYPE_BF16:
        return shoal_bf16_to_f32(((const uint16_t *)data)[i]);
    case SHOAL_DTYPE_F16:
        return shoal_f16_to_f32(((const uint16_t *)data)[i]);
    default:
        return ((const float *)data)[i];
    }
}

#endif
