/* coordinator_limits.h: the bounds of text in and out (tokenizer, chat
 * templates, detokenizer), each with its reason.
 *
 * These belong with the others in common/common_limits.h; they live here
 * until that file takes them, and nothing outside coordinator/ reads them.
 * Input past a bound is refused with SHOAL_ERR_LIMIT and a message naming it. */
#ifndef SHOAL_COORDINATOR_LIMITS_H
#define SHOAL_COORDINATOR_LIMITS_H

/* A tokenizer.json or tokenizer_config.json read whole. Real tokenizer.json
 * files are 2-20 MB (Qwen3: 11 MB, Llama-3: 9 MB). */
#define COORDINATOR_TOKENIZER_FILE_BYTES_MAX (128u * 1024u * 1024u)

/* One text given to encode. A context of SHOAL_CONTEXT_TOKENS_MAX tokens
 * holds about 4 MiB of text; 16 MiB leaves room for long tokens (runs of
 * spaces) while bounding the work and scratch of one call. */
#define COORDINATOR_TEXT_BYTES_MAX (16u * 1024u * 1024u)

/* Bytes of one vocabulary or added token. Real tokens are under 256 bytes;
 * the bound keeps per-token output buffers of the detokenizer small. */
#define COORDINATOR_TOKEN_BYTES_MAX 1024

/* Added (special) tokens of one tokenizer: Llama-3 has 256, Qwen3 26. */
#define COORDINATOR_ADDED_TOKENS_MAX 65536

/* Merges of one BPE model: Llama-3 has 280k. */
#define COORDINATOR_MERGES_MAX (4 * 1024 * 1024)

/* Bytes of the pre-tokenizer's split regex; real ones are ~150 bytes. */
#define COORDINATOR_REGEX_BYTES_MAX 4096

/* Messages in one conversation given to a chat template, and bytes of one
 * chat template (Qwen3's is 4 KiB). */
#define COORDINATOR_CHAT_MESSAGES_MAX 4096
#define COORDINATOR_CHAT_TEMPLATE_BYTES_MAX (1024u * 1024u)

#endif
