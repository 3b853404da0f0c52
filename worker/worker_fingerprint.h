/* worker_fingerprint.h: the model fingerprint, the root of every KV hash.
 *
 * SHA-256 over everything that changes the bytes of a KV page: the layout
 * version, config.json as written, every weight file's whole content (or,
 * for dummy weights, the seed), tokenizer.json and tokenizer_config.json
 * (the chat template) when present, the KV dtype and the page size. Two
 * workers share pages, and a stored state is used, only under equal
 * fingerprints. Weight files are hashed in 64 MiB chunks on all processors,
 * then the chunk hashes are hashed in order. */
#ifndef SHOAL_WORKER_FINGERPRINT_H
#define SHOAL_WORKER_FINGERPRINT_H

#include "common/common_hash.h"
#include "model/model_weights.h"

/* The version of the KV page layout (kernels_kv_layout): bump it whenever
 * the bytes of a page would mean something else. */
#define WORKER_KV_LAYOUT_VERSION 1

shoal_err worker_fingerprint_compute(const char *model_dir, const model_weights *w,
                                     uint64_t dummy_seed, shoal_dtype kv_dtype, int page_tokens,
                                     common_hash *out, shoal_diag *diag);

#endif
