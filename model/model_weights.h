/* model_weights.h: the tensors of a Hugging Face model directory.
 *
 * A directory holds model.safetensors, or shards listed by
 * model.safetensors.index.json. Files are memory-mapped, never read whole.
 * With the dummy source (--load-format dummy) no file is read: each tensor
 * asked for is made at the asked shape with deterministic random values. */
#ifndef SHOAL_MODEL_WEIGHTS_H
#define SHOAL_MODEL_WEIGHTS_H

#include "common/common_dtype.h"
#include "common/common_error.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct model_weights model_weights;

/* A tensor's bytes and dtype. data lives as long as the model_weights. */
typedef struct model_tensor_ref {
    const void *data;
    shoal_dtype dtype;
    uint64_t bytes;
} model_tensor_ref;

/* Opens the safetensors of dir. Errors name the file and what is wrong. */
shoal_err model_weights_open(const char *dir, model_weights **out, shoal_diag *diag);

/* A source of random tensors (bf16 for matrices, values near one for
 * vectors, as norms have), the same for the same seed. */
shoal_err model_weights_open_dummy(uint64_t seed, model_weights **out);

/* How the dummy source makes `name` (a tensor of `dims` dimensions):
 * element i is bf16(base + scale * u_i), u_i the (i + 1)-th
 * common_rng_uniform from *state. A backend's fill_random makes the same
 * numbers where the tensor lives, without get() and its host copy. */
void model_weights_dummy_recipe(const model_weights *w, const char *name, int dims, uint64_t *state,
                                float *base, float *scale);

/* Closes; NULL allowed. Pointers from get() die with it. */
void model_weights_close(model_weights *w);

/* Finds `name`, which must have exactly the given shape and be F32, F16 or
 * BF16. SHOAL_ERR_NOT_FOUND when absent; SHOAL_ERR_FORMAT for a wrong
 * shape; SHOAL_ERR_UNSUPPORTED for another dtype. diag names the file, the
 * tensor and what was expected. data is aligned to its element size. */
shoal_err model_weights_get(model_weights *w, const char *name, int dims, const int64_t *shape,
                            model_tensor_ref *out, shoal_diag *diag);

/* True when the model files hold `name` (always false for dummy). */
bool model_weights_has(const model_weights *w, const char *name);

/* The mapped files (0 for dummy): shard i's whole bytes, for fingerprints. */
int model_weights_shards(const model_weights *w);
void model_weights_shard(const model_weights *w, int i, const void **data, size_t *bytes);

/* True for the dummy source. */
bool model_weights_is_dummy(const model_weights *w);

#endif
