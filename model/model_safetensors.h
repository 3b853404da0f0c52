/* model_safetensors.h: the safetensors file format, read and written.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON naming
 * each tensor's dtype, shape and [begin, end) byte range in the data that
 * follows. The parser trusts nothing in the header: every range must lie in
 * the data, match dtype x shape exactly, and not overlap another; names are
 * unique and bounded. Errors name the file (label), the tensor and what was
 * expected. */
#ifndef SHOAL_MODEL_SAFETENSORS_H
#define SHOAL_MODEL_SAFETENSORS_H

#include "common/common_dtype.h"
#include "common/common_error.h"
#include "common/common_file.h"
#include "common/common_limits.h"

#include <stddef.h>
#include <stdint.h>

typedef struct model_tensor_info {
    char name[SHOAL_TENSOR_NAME_BYTES_MAX];
    shoal_dtype dtype;
    int dims;
    int64_t shape[SHOAL_TENSOR_DIMS_MAX];
    uint64_t begin; /* byte offsets into the data section */
    uint64_t end;
} model_tensor_info;

typedef struct model_safetensors {
    common_map map;            /* set by _open; zero for _parse */
    const unsigned char *data; /* start of the data section */
    uint64_t data_bytes;
    int tensors;
    model_tensor_info *info; /* sorted by name */
} model_safetensors;

/* Parses a whole safetensors image of `bytes` at buf (not copied: buf must
 * outlive st). label names the file in messages. On success st->info is
 * owned by st; release with model_safetensors_close. On error st is left
 * closed. Returns SHOAL_ERR_FORMAT, SHOAL_ERR_LIMIT or SHOAL_ERR_NOMEM. */
shoal_err model_safetensors_parse(const unsigned char *buf, size_t bytes, const char *label,
                                  model_safetensors *st, shoal_diag *diag);

/* Maps the file at path and parses it. */
shoal_err model_safetensors_open(const char *path, model_safetensors *st, shoal_diag *diag);

/* Frees the index and unmaps; idempotent on a zeroed or closed st. */
void model_safetensors_close(model_safetensors *st);

/* The tensor named name, or NULL. */
const model_tensor_info *model_safetensors_find(const model_safetensors *st, const char *name);

/* Elements of a tensor (product of its shape). */
uint64_t model_tensor_elements(const model_tensor_info *t);

/* One tensor to write. */
typedef struct model_tensor_out {
    const char *name;
    shoal_dtype dtype;
    int dims;
    int64_t shape[SHOAL_TENSOR_DIMS_MAX];
    const void *data; /* dtype x shape bytes */
} model_tensor_out;

/* Writes a safetensors file of the given tensors, in order, with the header
 * padded so the data starts 8-byte aligned. The file appears whole or not at
 * all (written beside and renamed). */
shoal_err model_safetensors_write(const char *path, const model_tensor_out *tensors, int count,
                                  shoal_diag *diag);

#endif
