/* coordinator_tokenizer.h: text to token ids and back, from a HF tokenizer.json.
 *
 * Reads byte-level BPE tokenizers (Qwen2/Qwen3, Llama-3, GPT-2 style) and
 * encodes exactly as HF tokenizers does:
 *   1. added tokens (special or not, normalized=false) are matched in the
 *      raw text, leftmost-longest, and become their ids; they are never
 *      split or merged;
 *   2. each piece between them is normalized (NFC for Qwen3), and added
 *      tokens with normalized=true are matched in the result;
 *   3. each remaining piece is split by the pre-tokenizer's regex;
 *   4. each word is mapped to byte-level symbols and merged by rank (BPE);
 *   5. with COORDINATOR_ENCODE_ADD_SPECIAL, the post-processor's tokens are
 *      added (TemplateProcessing: Meta's Llama-3 prepends BOS; Qwen3 adds
 *      none).
 * Decoding maps each id back to its bytes and replaces ill-formed UTF-8 as
 * HF's ByteLevel decoder does (one U+FFFD per maximal ill-formed subpart).
 * transformers' clean_up_tokenization_spaces is not applied: it is not part
 * of tokenizer.json and breaks decode(encode(s)) == s.
 *
 * Anything in a tokenizer.json that shoal does not implement (another model
 * type, normalizer, pre-tokenizer or decoder; added tokens with lstrip,
 * rstrip or single_word) is refused with SHOAL_ERR_UNSUPPORTED and a
 * message naming it, never guessed at.
 *
 * Threads: a tokenizer is immutable once open; any number of threads may
 * encode and decode with it at once, each with its own work area. */
#ifndef SHOAL_COORDINATOR_TOKENIZER_H
#define SHOAL_COORDINATOR_TOKENIZER_H

#include "common/common_error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct coordinator_tokenizer coordinator_tokenizer;
typedef struct coordinator_tokenizer_work coordinator_tokenizer_work;

/* Flags of coordinator_tokenizer_encode. */
enum {
    /* Add the post-processor's tokens (HF add_special_tokens=True). */
    COORDINATOR_ENCODE_ADD_SPECIAL = 1u << 0,
    /* Encode the text of special added tokens as plain text instead of as
     * their ids (HF split_special_tokens / encode_special_tokens). Use it
     * for text a client sent, so "<|im_end|>" typed by a user cannot end a
     * turn. Non-special added tokens (Qwen3's <think>) still match. */
    COORDINATOR_ENCODE_SPECIAL_AS_TEXT = 1u << 1,
};

/* Flags of coordinator_tokenizer_decode and the detokenizer. */
enum {
    /* Leave out added tokens marked special (HF skip_special_tokens). */
    COORDINATOR_DECODE_SKIP_SPECIAL = 1u << 0,
};

/* Reads the tokenizer.json at path. On success *out is owned by the caller
 * (coordinator_tokenizer_close). Errors: SHOAL_ERR_NOT_FOUND, SHOAL_ERR_IO,
 * SHOAL_ERR_FORMAT (not JSON, truncated, a merge naming an unknown token,
 * ...), SHOAL_ERR_UNSUPPORTED (a model or step shoal does not implement),
 * SHOAL_ERR_LIMIT (past coordinator_limits.h), SHOAL_ERR_NOMEM; diag says
 * which and where. */
shoal_err coordinator_tokenizer_open(const char *path, coordinator_tokenizer **out,
                                     shoal_diag *diag);

/* The same from a tokenizer.json already in memory (json, bytes long, need
 * not be NUL-terminated; not kept). label names it in messages. */
shoal_err coordinator_tokenizer_parse(const char *json, size_t bytes, const char *label,
                                      coordinator_tokenizer **out, shoal_diag *diag);

/* Frees tok; NULL allowed. No work area of tok may be in use. */
void coordinator_tokenizer_close(coordinator_tokenizer *tok);

/* One more than the largest token id (vocabulary and added tokens). */
int32_t coordinator_tokenizer_vocab_size(const coordinator_tokenizer *tok);

/* The id of the token whose text is str (an added token's content, or a
 * vocabulary entry as written in tokenizer.json), or -1. */
int32_t coordinator_tokenizer_token_id(const coordinator_tokenizer *tok, const char *str);

/* True if id is an added token marked special (<|im_end|>, <|eot_id|>). */
bool coordinator_tokenizer_is_special(const coordinator_tokenizer *tok, int32_t id);

/* True if id is an added token matched on the raw text (normalized=false,
 * special or not): encode cuts the text there before normalizing it, so
 * its pieces on either side are normalized apart, as in HF. */
bool coordinator_tokenizer_is_added_raw(const coordinator_tokenizer *tok, int32_t id);

/* The bytes that id decodes to (*bytes points into tok, valid while tok is
 * open; not NUL-terminated, and may be part of a UTF-8 character). Returns
 * the length, or 0 with *bytes = NULL for an id with no token. At most
 * COORDINATOR_TOKEN_BYTES_MAX. */
size_t coordinator_tokenizer_token_bytes(const coordinator_tokenizer *tok, int32_t id,
                                         const unsigned char **bytes);

/* A work area for encoding: regex match state, normalization buffers, the
 * BPE cache. One per thread; it grows to the largest text it has seen
 * (never past COORDINATOR_TEXT_BYTES_MAX) and then stays. Owned by the
 * caller; must be closed before tok. */
shoal_err coordinator_tokenizer_work_open(const coordinator_tokenizer *tok,
                                          coordinator_tokenizer_work **out, shoal_diag *diag);
void coordinator_tokenizer_work_close(coordinator_tokenizer_work *work);

/* Encodes text (bytes long; need not be NUL-terminated) into ids[0..cap),
 * setting *n_ids. flags: COORDINATOR_ENCODE_*. Errors:
 *   SHOAL_ERR_FORMAT  text is not valid UTF-8 (diag gives the byte offset);
 *   SHOAL_ERR_LIMIT   text is over COORDINATOR_TEXT_BYTES_MAX, or its ids
 *                     do not fit in cap (encoding stops there: a prompt far
 *                     over the limit costs no more than cap tokens of work);
 *   SHOAL_ERR_NOMEM   the work area could not grow.
 * On error *n_ids is 0. work must be this tokenizer's. */
shoal_err coordinator_tokenizer_encode(const coordinator_tokenizer *tok,
                                       coordinator_tokenizer_work *work, const char *text,
                                       size_t bytes, unsigned flags, int32_t *ids, size_t cap,
                                       size_t *n_ids, shoal_diag *diag);

/* Decodes ids[0..n) into out (cap bytes) as UTF-8 and NUL-terminates it;
 * *out_bytes is the length without the NUL. Ids with no token (such as the
 * padding rows past the tokenizer in a model's vocabulary) give nothing, as
 * in HF. flags: COORDINATOR_DECODE_*. If out is too small (cap may be 0 and
 * out NULL) returns SHOAL_ERR_LIMIT with *out_bytes set to the length
 * needed. Any thread. */
shoal_err coordinator_tokenizer_decode(const coordinator_tokenizer *tok, const int32_t *ids,
                                       size_t n, unsigned flags, char *out, size_t cap,
                                       size_t *out_bytes);

#endif
