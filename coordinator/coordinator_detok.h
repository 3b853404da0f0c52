/* coordinator_detok.h: incremental detokenization for streaming.
 *
 * One detokenizer per stream turns token ids, as the worker produces them,
 * into text that can be sent at once: every byte it gives out is final and
 * valid UTF-8. A character whose bytes are spread over several tokens (an
 * emoji, a CJK character in byte-level tokens) is held back until it is
 * complete; bytes that can never become a character are sent as U+FFFD as
 * soon as that is certain. The text of all pushes plus _finish equals
 * coordinator_tokenizer_decode of all the ids, byte for byte.
 *
 * A detokenizer is a small value (no allocation): embed it in the stream's
 * state. Not thread-safe; the tokenizer it reads may be shared. */
#ifndef SHOAL_COORDINATOR_DETOK_H
#define SHOAL_COORDINATOR_DETOK_H

#include "common/common_error.h"
#include "coordinator_limits.h"
#include "coordinator_tokenizer.h"
#include "coordinator_utf8.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes that one push can write at most: held bytes plus a longest token,
 * each byte of which could turn into a 3-byte U+FFFD. */
#define COORDINATOR_DETOK_PUSH_BYTES_MAX (3 * (COORDINATOR_TOKEN_BYTES_MAX + 3))

/* Bytes that _finish writes at most. */
#define COORDINATOR_DETOK_FINISH_BYTES_MAX 3

typedef struct coordinator_detok {
    /* private */
    const coordinator_tokenizer *tok;
    unsigned flags;
    coordinator_utf8_stream utf8;
} coordinator_detok;

/* Starts a stream over tok (which must outlive it). flags:
 * COORDINATOR_DECODE_SKIP_SPECIAL leaves out special tokens (<|im_end|>). */
void coordinator_detok_init(coordinator_detok *d, const coordinator_tokenizer *tok, unsigned flags);

/* Adds one token; writes the text that became final to out (cap bytes, not
 * NUL-terminated) and its length to *out_bytes (often 0 while a character
 * is incomplete). An id with no token adds nothing, as in decode.
 * SHOAL_ERR_LIMIT if cap is below what this token needs (it never needs
 * more than COORDINATOR_DETOK_PUSH_BYTES_MAX); then nothing is consumed. */
shoal_err coordinator_detok_push(coordinator_detok *d, int32_t id, char *out, size_t cap,
                                 size_t *out_bytes);

/* Ends the stream: an incomplete character still held becomes U+FFFD.
 * out holds COORDINATOR_DETOK_FINISH_BYTES_MAX bytes; returns bytes
 * written. The detokenizer is empty afterwards and may start again. */
size_t coordinator_detok_finish(coordinator_detok *d, char *out);

/* Bytes held back (0 to 3): an incomplete character waiting for its rest. */
size_t coordinator_detok_held(const coordinator_detok *d);

#endif
