/* coordinator_stop.h: stop strings, matched on the text a stream produces.
 *
 * Text arrives in pieces (what the detokenizer made final at each token).
 * The matcher passes text on as soon as it cannot be part of a stop
 * string, holds back the shortest tail that could still begin one, and
 * reports the first stop string that completes (the one that ends
 * earliest; of those that end at the same byte, the one listed first).
 * The text before the match is passed on; the match and anything after it
 * are never emitted, as in OpenAI's API.
 *
 * Each stop string runs a Knuth-Morris-Pratt automaton, so feeding costs
 * (stop strings x bytes fed) whatever the text, and the held tail is at
 * most the longest stop string less one byte. Input is UTF-8 that ends on
 * a character boundary (the detokenizer's output) and stop strings are
 * valid UTF-8, so a held tail always starts on a character boundary and
 * everything passed on is whole characters.
 *
 * A matcher is one allocation made when the request is parsed; feeding
 * allocates nothing. Not thread-safe. */
#ifndef SHOAL_COORDINATOR_STOP_H
#define SHOAL_COORDINATOR_STOP_H

#include "common/common_error.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct coordinator_stop coordinator_stop;

/* A matcher for stop strings strs[0..count), with lens[i] bytes each
 * (1..COORDINATOR_STOP_BYTES_MAX, count <= COORDINATOR_STOP_STRINGS_MAX;
 * the strings are copied). SHOAL_ERR_INVALID for an empty or too long
 * string or too many, SHOAL_ERR_NOMEM. *out is the caller's
 * (coordinator_stop_free). count may be 0: then nothing ever matches. */
shoal_err coordinator_stop_new(const char *const *strs, const size_t *lens, int count,
                               coordinator_stop **out);
void coordinator_stop_free(coordinator_stop *s);

/* Starts over (for the next choice): nothing held, no partial match. */
void coordinator_stop_reset(coordinator_stop *s);

/* Bytes that coordinator_stop_feed may write for n bytes fed. */
size_t coordinator_stop_out_bytes(const coordinator_stop *s, size_t n);

/* Feeds n bytes of text. Writes what became final to out (at least
 * coordinator_stop_out_bytes(s, n) bytes) and its length to *out_bytes.
 * Returns the index of the stop string that matched, or -1. After a
 * match the matcher is done: further feeds write nothing and return the
 * same index. */
int coordinator_stop_feed(coordinator_stop *s, const char *text, size_t n, char *out,
                          size_t *out_bytes);

/* Ends the text: writes the held tail (which did not become a stop
 * string) to out (at least COORDINATOR_STOP_BYTES_MAX bytes); returns its
 * length. Nothing after a match. */
size_t coordinator_stop_flush(coordinator_stop *s, char *out);

/* Bytes held back now. */
size_t coordinator_stop_held(const coordinator_stop *s);

#endif
