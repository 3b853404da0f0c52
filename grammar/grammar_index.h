/* grammar_index.h: which tokens of a vocabulary each DFA state allows, so
 * that a constrained decoding step is a lookup (Outlines' index).
 *
 * A token is allowed in a state when stepping the DFA through all of its
 * bytes stays off GRAMMAR_DEAD; its next state is where that walk ends.
 * Tokens may split a UTF-8 character: the DFA steps bytes, so a token that
 * ends inside one leaves the DFA mid-character. An end id (EOS) is allowed
 * exactly in accepting states, and is never stepped as bytes. A token of no
 * bytes, or one flagged special, is never allowed (unless it is an end id).
 *
 * Built once, an index is immutable: any number of threads (streams) may
 * read it at once without locks. */
#ifndef SHOAL_GRAMMAR_INDEX_H
#define SHOAL_GRAMMAR_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common_error.h"
#include "grammar/grammar_regex.h"

/* grammar_index_next's answer for an end id in an accepting state: allowed,
 * and the stream ends. */
#define GRAMMAR_END (-2)

/* A vocabulary, borrowed for the duration of grammar_index_build. */
typedef struct grammar_vocab {
    uint32_t n_tokens;
    const uint8_t *const *bytes; /* bytes[t][0 .. lens[t]) */
    const uint32_t *lens;
    const uint8_t *special;      /* special[t] != 0: never allowed; NULL for none */
    const int32_t *end_ids;      /* the EOS ids, each < n_tokens */
    uint32_t n_end_ids;
} grammar_vocab;

typedef struct grammar_index grammar_index;

/* Builds the index of dfa over vocab; *out is the caller's, freed with
 * grammar_index_free, and does not refer to dfa or vocab afterwards.
 * limits NULL means the defaults. Errors: SHOAL_ERR_INVALID (an end id out
 * of range, no tokens), SHOAL_ERR_LIMIT when the bitmask rows or the
 * (token, next) pairs would pass limits->index_bytes_max (diag names it),
 * SHOAL_ERR_NOMEM. On error *out is NULL. Any thread. */
shoal_err grammar_index_build(const grammar_dfa *dfa, const grammar_vocab *vocab,
                              const grammar_limits *limits, grammar_index **out, shoal_diag *diag);

/* Frees idx (NULL allowed). */
void grammar_index_free(grammar_index *idx);

/* The state a stream starts in. */
int32_t grammar_index_start(const grammar_index *idx);

/* The number of states (as the DFA's) and the words of one mask row. */
uint32_t grammar_index_states(const grammar_index *idx);
uint32_t grammar_index_mask_words(const grammar_index *idx);

/* The allowed tokens of state (0 <= state < states): bit t % 32 of word
 * t / 32 is set when token t is allowed; bits past n_tokens are clear.
 * Valid until grammar_index_free. */
const uint32_t *grammar_index_mask(const grammar_index *idx, int32_t state);

/* The state after token in state: GRAMMAR_DEAD when the token is not
 * allowed there, GRAMMAR_END for an end id in an accepting state. A binary
 * search over the state's allowed tokens. */
int32_t grammar_index_next(const grammar_index *idx, int32_t state, uint32_t token);

/* How many tokens state allows (end ids included). None where the regex
 * matches nothing, or where no token of the vocabulary spells what the
 * regex needs next: the caller must not sample from an empty mask. */
uint32_t grammar_index_allowed(const grammar_index *idx, int32_t state);

/* Whether the stream must end in state: it is accepting and allows nothing
 * but the end ids. */
bool grammar_index_must_end(const grammar_index *idx, int32_t state);

/* The bytes the index holds (rows and pairs), for a person to read. */
uint64_t grammar_index_bytes(const grammar_index *idx);

#endif
