/* common_limits.h: every bound of shoal in one place, each with its reason.
 *
 * Input that would pass a bound is refused with SHOAL_ERR_LIMIT and a message
 * that names the bound; nothing grows past these at run time. */
#ifndef SHOAL_COMMON_LIMITS_H
#define SHOAL_COMMON_LIMITS_H

/* A model directory file we read whole (config.json, generation_config.json,
 * model.safetensors.index.json). Real ones are a few KiB to ~100 KiB. */
#define SHOAL_JSON_FILE_BYTES_MAX (16u * 1024u * 1024u)

/* A safetensors JSON header. The Rust safetensors crate refuses headers over
 * 100 MB; real headers of large models are ~1 MB. */
#define SHOAL_SAFETENSORS_HEADER_BYTES_MAX (100u * 1024u * 1024u)

/* Tensors in one safetensors file, and shards in one model: a 70B model has
 * ~700 tensors in ~30 shards. */
#define SHOAL_SAFETENSORS_TENSORS_MAX 65536
#define SHOAL_MODEL_SHARDS_MAX 1024

/* Dimensions of one tensor: transformers weights have at most 4. */
#define SHOAL_TENSOR_DIMS_MAX 8

/* Length of a tensor name; HF names are under 100 characters. */
#define SHOAL_TENSOR_NAME_BYTES_MAX 256

/* Model shape bounds: far above any published model, low enough that size
 * products of them cannot overflow 64 bits. */
#define SHOAL_MODEL_LAYERS_MAX 512
#define SHOAL_MODEL_HIDDEN_MAX 65536
#define SHOAL_MODEL_INTERMEDIATE_MAX 262144
#define SHOAL_MODEL_HEADS_MAX 256
#define SHOAL_MODEL_HEAD_DIM_MAX 512
#define SHOAL_MODEL_VOCAB_MAX (4 * 1024 * 1024)
#define SHOAL_MODEL_EOS_IDS_MAX 16

/* Context length of one stream, in tokens (the largest published context
 * windows are 1M tokens). */
#define SHOAL_CONTEXT_TOKENS_MAX (1024 * 1024)

/* Tokens per KV page: a power of two between these. 16 is vLLM's default;
 * above 256 a page wastes too much of its last, partly filled block. */
#define SHOAL_PAGE_TOKENS_MIN 1
#define SHOAL_PAGE_TOKENS_MAX 256

/* Rows (tokens) in one forward pass: bounds the activation buffers, which
 * are sized once at start for this many rows. */
#define SHOAL_BATCH_ROWS_MAX 8192

/* Streams in one forward pass. */
#define SHOAL_BATCH_STREAMS_MAX 512

/* Streams waiting for admission in one worker: past this, submit answers
 * "retry later" (the coordinator's 429/503) instead of queueing unbounded. */
#define SHOAL_QUEUED_STREAMS_MAX 65536

/* Threads of the CPU backend's pool. */
#define SHOAL_CPU_THREADS_MAX 256

/* Path lengths we build (model directory + file name). */
#define SHOAL_PATH_BYTES_MAX 4096

#endif
