/* coordinator_pretok.h: the normalizer and pre-tokenizer of a tokenizer.json.
 *
 * Normalizers: none, or NFC (Qwen3), computed with utf8proc. Pre-tokenizers:
 * one Split by regex with behavior "Isolated" followed by ByteLevel without
 * its own regex (Qwen2/3, Llama-3), or a lone ByteLevel with its GPT-2
 * regex. The regex is compiled with PCRE2 (UTF + UCP, JIT). HF compiles it
 * with Oniguruma, whose \s is Unicode White_Space; PCRE2's \s also takes
 * U+180E, so \s and \S are rewritten to the White_Space set before
 * compiling. Anything else is refused with SHOAL_ERR_UNSUPPORTED naming it.
 * Internal to the tokenizer.
 *
 * A pretok is immutable after _build and may be shared between threads,
 * each with its own scratch. */
#ifndef SHOAL_COORDINATOR_PRETOK_H
#define SHOAL_COORDINATOR_PRETOK_H

#include "common/common_error.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct coordinator_pretok coordinator_pretok;
typedef struct coordinator_pretok_scratch coordinator_pretok_scratch;

/* Builds from the "normalizer" and "pre_tokenizer" values of a
 * tokenizer.json (either may be NULL or JSON null). Release with _free. */
shoal_err coordinator_pretok_build(const cJSON *normalizer, const cJSON *pre_tokenizer,
                                   const char *label, coordinator_pretok **out, shoal_diag *diag);
void coordinator_pretok_free(coordinator_pretok *pt);

/* True if the normalizer changes text (NFC). */
bool coordinator_pretok_normalizes(const coordinator_pretok *pt);

shoal_err coordinator_pretok_scratch_open(const coordinator_pretok *pt,
                                          coordinator_pretok_scratch **out);
void coordinator_pretok_scratch_close(coordinator_pretok_scratch *s);

/* Normalizes s (n bytes of valid UTF-8). *out points at s itself when the
 * text is unchanged, else into the scratch, valid until the next call with
 * this scratch. SHOAL_ERR_NOMEM if the scratch cannot grow. */
shoal_err coordinator_pretok_normalize(const coordinator_pretok *pt, coordinator_pretok_scratch *s,
                                       const unsigned char *text, size_t n,
                                       const unsigned char **out, size_t *out_n, shoal_diag *diag);

/* True if NFC leaves cp alone and cp never combines with what precedes it
 * (canonical combining class 0, NFC_Quick_Check=Yes, never the second of a
 * composition pair): normalization cuts text before such characters and
 * passes runs of them through untouched. A fixed list of ranges (ASCII,
 * Latin-1 and Latin Extended, kana, CJK ideographs, Hangul syllables,
 * emoji); tests/text checks every one of them against utf8proc. */
bool coordinator_pretok_nfc_inert(unsigned cp);

/* Splits s (n bytes of valid UTF-8) into words and calls fn on each, in
 * order; words cover s exactly. Stops at the first error of fn and returns
 * it. SHOAL_ERR_LIMIT if the regex engine hits its match limit. */
shoal_err coordinator_pretok_split(const coordinator_pretok *pt, coordinator_pretok_scratch *s,
                                   const unsigned char *text, size_t n,
                                   shoal_err (*fn)(void *ctx, const unsigned char *word,
                                                   size_t bytes),
                                   void *ctx, shoal_diag *diag);

#endif
