/* grammar_regex.h: a regex compiled to a DFA over bytes, for constrained
 * decoding (structured outputs).
 *
 * The dialect, over UTF-8 text:
 *   literal       any code point other than the metacharacters . [ ( ) | * + ? { \ ^ $
 *                 ('}' and ']' outside a class are literals)
 *   \\ \. \" \/   and every other escaped ASCII punctuation mark: that mark
 *   \n \r \t \f \v  the control characters
 *   \uXXXX        the code point XXXX (four hex digits; not a surrogate)
 *   \d \w \s      [0-9], [A-Za-z0-9_], [ \t\n\v\f\r]; \D \W \S their complements
 *   [...]  [^...] a class of code points: single ones, ranges a-z, \d \w \s
 *                 \D \W \S; ']' first is a literal, '-' first or last is one
 *   .             any code point but \n
 *   ( ) (?: )     groups (both only group: nothing is captured)
 *   |             alternation; an empty alternative matches the empty string
 *   * + ? {n} {n,} {n,m}  greedy quantifiers, n <= m <= 256
 *                 (SHOAL_GRAMMAR_REPEAT_MAX); no lazy or possessive forms
 * A match is always of the whole text (as PCRE2 with PCRE2_ANCHORED |
 * PCRE2_ENDANCHORED | PCRE2_UTF): ^ and $ are refused rather than ignored.
 * Code points are those of Unicode: surrogates (U+D800..U+DFFF) are never
 * matched, so the DFA accepts only valid UTF-8.
 *
 * A compiled DFA is immutable: any number of threads may read it at once. */
#ifndef SHOAL_GRAMMAR_REGEX_H
#define SHOAL_GRAMMAR_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common_error.h"

/* The state after a byte no match can continue with. */
#define GRAMMAR_DEAD (-1)

/* Bounds of one compilation and of one token index. */
typedef struct grammar_limits {
    uint32_t nfa_states_max; /* Thompson NFA states (quantifiers copy operands) */
    uint32_t dfa_states_max; /* DFA states after subset construction */
    uint64_t index_bytes_max; /* a grammar_index: bitmask rows and (token, next) pairs */
} grammar_limits;

/* Fills *limits with the defaults of common_limits.h. */
void grammar_limits_default(grammar_limits *limits);

typedef struct grammar_dfa grammar_dfa;

/* Compiles re[0..len) into a DFA; *out is the caller's, freed with
 * grammar_dfa_free. limits NULL means the defaults. Errors:
 * SHOAL_ERR_INVALID for a syntax error (diag: the byte offset and what was
 * expected there), SHOAL_ERR_LIMIT past a bound (diag names it),
 * SHOAL_ERR_NOMEM. On error *out is NULL. Any thread. */
shoal_err grammar_dfa_compile(const char *re, size_t len, const grammar_limits *limits,
                              grammar_dfa **out, shoal_diag *diag);

/* Frees dfa (NULL allowed). */
void grammar_dfa_free(grammar_dfa *dfa);

/* The state before any byte. Every state the DFA keeps can still reach a
 * match, except the start state of a regex that matches nothing. */
int32_t grammar_dfa_start(const grammar_dfa *dfa);

/* The number of states; states are 0 .. count-1. */
uint32_t grammar_dfa_states(const grammar_dfa *dfa);

/* The state after byte from state, or GRAMMAR_DEAD (also from GRAMMAR_DEAD). */
static inline int32_t grammar_dfa_step(const grammar_dfa *dfa, int32_t state, uint8_t byte);

/* Whether the bytes that led to state match the whole regex. */
bool grammar_dfa_accepting(const grammar_dfa *dfa, int32_t state);

/* The layout grammar_dfa_step reads, public only so that the step inlines;
 * nothing else may touch it. */
struct grammar_dfa_core {
    uint32_t n_states;
    uint32_t n_classes;        /* bytes with the same transitions share a class */
    uint8_t class_of[256];     /* byte -> class */
    const int32_t *next;       /* [state * n_classes + class] -> state or GRAMMAR_DEAD */
};

static inline int32_t grammar_dfa_step(const grammar_dfa *dfa, int32_t state, uint8_t byte)
{
    const struct grammar_dfa_core *c = (const struct grammar_dfa_core *)dfa;
    if (state < 0)
        return GRAMMAR_DEAD;
    return c->next[(size_t)state * c->n_classes + c->class_of[byte]];
}

#endif
