/* coordinator_bpe.h: the byte-level BPE model of a tokenizer.json.
 *
 * Holds the vocabulary (token string -> id) and the merges ((left, right)
 * -> (rank, merged id)) and turns one pre-tokenized word (raw bytes) into
 * ids exactly as HF tokenizers' BPE does: each byte becomes the token of its
 * byte-level character, then the adjacent pair of lowest rank is merged
 * (leftmost first among equal ranks) until no pair has a merge. With
 * ignore_merges (Llama-3) a word that is itself in the vocabulary is that
 * token. Internal to the tokenizer (coordinator_tokenizer.h is the API).
 *
 * A model is immutable after _build and may be used from many threads, each
 * with its own scratch. */
#ifndef SHOAL_COORDINATOR_BPE_H
#define SHOAL_COORDINATOR_BPE_H

#include "common/common_error.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct coordinator_bpe coordinator_bpe;

/* The GPT-2 byte-level alphabet: the code point that stands for byte b, and
 * the byte a code point stands for (-1 if it stands for none). */
unsigned coordinator_bpe_byte_char(unsigned char b);
int coordinator_bpe_char_byte(unsigned cp);

/* Builds the model from the "model" object of a tokenizer.json. label names
 * the file in messages. Refuses (SHOAL_ERR_UNSUPPORTED) options that change
 * results and that shoal does not implement: dropout, byte_fallback,
 * subword prefixes or suffixes. A merge whose parts or result are not in
 * the vocabulary is SHOAL_ERR_FORMAT, as in HF. Release with _free. */
shoal_err coordinator_bpe_build(const cJSON *model, const char *label, coordinator_bpe **out,
                                shoal_diag *diag);

/* Frees bpe (NULL allowed). */
void coordinator_bpe_free(coordinator_bpe *bpe);

/* The id of a vocabulary token given as its byte-level string (as written
 * in tokenizer.json), or -1. */
int32_t coordinator_bpe_vocab_id(const coordinator_bpe *bpe, const char *str, size_t bytes);

/* Calls fn for every vocabulary entry (string as in tokenizer.json). Stops
 * at and returns the first error fn returns. */
shoal_err coordinator_bpe_each(const coordinator_bpe *bpe,
                               shoal_err (*fn)(void *ctx, const char *str, size_t bytes,
                                               int32_t id),
                               void *ctx);

/* Largest id in the vocabulary, or -1 if it is empty. */
int32_t coordinator_bpe_max_id(const coordinator_bpe *bpe);

/* Per-thread scratch: the merge work arrays (grown to the longest word
 * seen, never past a word of COORDINATOR_TEXT_BYTES_MAX) and a 4 MiB
 * cache of short words. */
typedef struct coordinator_bpe_scratch coordinator_bpe_scratch;

shoal_err coordinator_bpe_scratch_open(coordinator_bpe_scratch **out);
void coordinator_bpe_scratch_close(coordinator_bpe_scratch *s);

/* Appends the ids of the word (bytes long, >= 1) to ids[*n..cap). If they
 * do not fit, returns SHOAL_ERR_LIMIT with *n unchanged; SHOAL_ERR_NOMEM if
 * the scratch could not grow. */
shoal_err coordinator_bpe_word(const coordinator_bpe *bpe, coordinator_bpe_scratch *s,
                               const unsigned char *word, size_t bytes, int32_t *ids, size_t cap,
                               size_t *n);

#endif
