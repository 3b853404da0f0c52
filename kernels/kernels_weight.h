/* kernels_weight.h: a weight as the model hands it to a backend.
 *
 * One descriptor for every format, so that a format of packed weights and
 * scales is a new value of `format` and its fields, not a new signature:
 * today every weight is DENSE (elements of dtype, row-major). A stack of
 * expert matrices of one layer is one descriptor with experts > 1:
 * [experts][rows][cols], expert e at data + e * rows * cols elements. */
#ifndef SHOAL_KERNELS_WEIGHT_H
#define SHOAL_KERNELS_WEIGHT_H

#include "common/common_dtype.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kernels_weight_format {
    KERNELS_WEIGHT_DENSE = 0, /* dtype F32, F16 or BF16 */
} kernels_weight_format;

typedef struct kernels_weight {
    const void *data; /* (device) */
    shoal_dtype dtype;
    kernels_weight_format format;
    int64_t rows, cols; /* of one matrix (a vector: cols 1) */
    int experts;        /* matrices stacked: 1 for a plain weight */
    /* Packed formats: per-group scales and zero points of group_size
     * columns (device); NULL and 0 for DENSE. */
    const void *scales, *zeros;
    int group_size;
} kernels_weight;

/* Bytes of one matrix of a DENSE weight. */
static inline size_t kernels_weight_matrix_bytes(const kernels_weight *w)
{
    return (size_t)w->rows * (size_t)w->cols * shoal_dtype_bytes(w->dtype);
}

/* Expert e's matrix of a DENSE stack. */
static inline const void *kernels_weight_expert(const kernels_weight *w, int e)
{
    return (const unsigned char *)w->data + (size_t)e * kernels_weight_matrix_bytes(w);
}

#endif
