/* worker_model.h: a loaded model and its forward pass over paged KV.
 *
 * The model owns its backend buffers: weights (in place where the backend
 * reads host memory, else uploaded once), the KV page arena, and activation
 * buffers sized at open for max_rows rows. Nothing is allocated per forward
 * pass. One thread drives a model. */
#ifndef SHOAL_WORKER_MODEL_H
#define SHOAL_WORKER_MODEL_H

#include "common/common_error.h"
#include "common/common_hash.h"
#include "kernels/kernels_backend.h"
#include "kernels/kernels_sample.h"
#include "model/model_cache.h"
#include "model/model_config.h"

#include <stdint.h>

typedef enum worker_load_format {
    WORKER_LOAD_AUTO = 0, /* read the safetensors of the model directory */
    WORKER_LOAD_DUMMY,    /* read config.json only; random weights at the real shapes */
} worker_load_format;

typedef struct worker_model_options {
    const char *model_dir;
    worker_load_format load_format;
    const char *device;        /* "cpu" or a GPU index */
    int threads;               /* CPU backend threads, 0 = one per processor */
    int page_tokens;           /* tokens per KV page */
    int kv_pages;              /* pages in the arena; 0: sized from free memory after the
                                  weights and buffers are placed (kv_memory_fraction) */
    int kv_pages_max;          /* with kv_pages 0: the most it is sized to (a cluster's
                                  segment rows for a worker); 0: no bound but the streams' */
    double kv_memory_fraction; /* of the memory free then; 0: 0.9 on a GPU (as vLLM's
                                  --gpu-memory-utilization), 0.25 on the CPU */
    int max_rows;              /* rows of one forward pass */
    int max_logit_rows;        /* rows whose logits one pass can return */
    int max_streams;           /* streams in one pass */
    int max_pages_per_stream;
    int state_slots; /* hybrids: streams whose recurrent states are kept (state slots);
                        0: max_streams */
    uint64_t dummy_seed;
    shoal_dtype act_dtype; /* backend activations; INVALID = the backend's default */
    shoal_dtype kv_dtype;  /* KV pages: BF16 (default) or F8_E4M3 (scales 1.0) */
    /* CUDA backend: its settings (kernels/cuda/cuda_backend.h; tests),
     * read at open; NULL (default): cuda_options_default's */
    const struct cuda_options *cuda;
} worker_model_options;

/* Sensible defaults: cpu, 16-token pages, 2048 rows, 64 logit rows... */
void worker_model_options_default(worker_model_options *opt);

typedef struct worker_model worker_model;

/* A run of at least this many rows of one stream is a prompt chunk: the
 * prompt kernel reads its context once per 64 rows where the partials
 * read it once per row, and below this the partials' finer split wins. */
#define WORKER_ATTN_PROMPT_ROWS 16

/* One forward pass, in host memory. Rows as in kernels_batch; page_table
 * is [streams][page_table_stride]; logit_rows lists which rows' logits to
 * return, in order. A hybrid model (gated DeltaNet layers) keeps each
 * stream's recurrent state in a slot: state_slots[s] is stream s's (NULL:
 * slot s); its rows must be consecutive positions in row order, and a
 * stream whose first row is at position 0 starts from a zero state, any
 * other from what its slot holds. */
typedef struct worker_forward {
    int rows;
    const int32_t *token_ids;
    const int32_t *positions;
    const int32_t *row_stream;
    int streams;
    int page_table_stride;
    const int32_t *page_table;
    int logit_count;
    const int32_t *logit_rows;
    const int32_t *state_slots; /* [streams] */
} worker_forward;

/* Loads the model. Errors name the file, tensor and what was expected. */
shoal_err worker_model_open(const worker_model_options *opt, worker_model **out, shoal_diag *diag);

/* Frees everything; NULL allowed. */
void worker_model_close(worker_model *m);

const model_config *worker_model_config(const worker_model *m);
const kernels_kv_layout *worker_model_kv_layout(const worker_model *m);
/* What the model keeps per stream, layer by layer (model/model_cache.h);
 * the KV layout is its attention group's. */
const model_cache_spec *worker_model_cache_spec(const worker_model *m);
int worker_model_kv_pages(const worker_model *m);
/* Hybrids: the state slots and the bytes of one (0 for models without
 * linear layers); a slot's bytes to and from host memory, and a copy of
 * one slot to another (a stream's state checkpointed or restored). */
int worker_model_state_slots(const worker_model *m);
size_t worker_model_slot_bytes(const worker_model *m);
shoal_err worker_model_slot_read(worker_model *m, int slot, void *host, shoal_diag *diag);
shoal_err worker_model_slot_write(worker_model *m, int slot, const void *host, shoal_diag *diag);
shoal_err worker_model_slot_copy(worker_model *m, int dst, int src, shoal_diag *diag);
/* The KV page arena (device; kv_pages pages of the kv layout's page_bytes
 * from offset 0), its mapped size (rounded up to the device's mapping
 * granularity) and the fd that names it for other processes
 * (shm/shm_arena.h serves it; kernels_backend.h's arena_import maps it).
 * All three are the model's: valid until worker_model_close, which unmaps
 * the arena and closes the fd (stop serving the fd before). */
int worker_model_arena_fd(const worker_model *m);
void *worker_model_arena(const worker_model *m);
size_t worker_model_arena_bytes(const worker_model *m);
int worker_model_max_rows(const worker_model *m);
int worker_model_max_logit_rows(const worker_model *m);
int worker_model_max_streams(const worker_model *m);
int worker_model_max_pages_per_stream(const worker_model *m);
/* Rows a decode round may have to be recorded as a graph and replayed
 * (every row sampled, one a stream): 0 where the backend records none. */
int worker_model_graph_rows(const worker_model *m);
/* Penalty entries one step can carry (worker_model_step). */
int worker_model_penalty_cap(const worker_model *m);
/* SHA-256 of everything that changes the KV bytes this model writes: see
 * worker_model.c. Prefix-cache hashes are rooted in it. */
const common_hash *worker_model_fingerprint(const worker_model *m);
kernels_backend *worker_model_backend(worker_model *m);

/* Runs one pass: writes the KV of every row into its page slot and fills
 * logits (host, [logit_count][vocab] F32). Input is checked against the
 * bounds given at open (rows, streams, pages, token ids, positions) and
 * refused with SHOAL_ERR_INVALID or SHOAL_ERR_LIMIT before any work. */
shoal_err worker_model_forward(worker_model *m, const worker_forward *f, float *logits,
                               shoal_diag *diag);

/* Penalty lists of the rows that sample, as the sample op takes them
 * (kernels_backend.h): CSR offsets [logit_count + 1], tokens and counts. */
typedef struct worker_penalties {
    const int32_t *offsets;
    const int32_t *tokens;
    const int32_t *counts;
    int entries;
} worker_penalties;

/* Runs one pass and samples one token for each logit row on the device,
 * with params[logit_count] and penalties (NULL for none); only the results
 * come back to the host. */
shoal_err worker_model_step(worker_model *m, const worker_forward *f,
                            const kernels_sample_params *params, const worker_penalties *pen,
                            kernels_sample_result *results, shoal_diag *diag);

/* The experts that the last pass routed its first `rows` rows to in layer
 * `layer`, a mixture-of-experts layer: ids [rows][experts_per_tok] (host),
 * highest routing weight first. For benchmarks (the experts a round reads)
 * and tests. SHOAL_ERR_INVALID for a dense layer or rows past a pass. */
shoal_err worker_model_routing(worker_model *m, int layer, int rows, int32_t *ids,
                               shoal_diag *diag);

#endif
