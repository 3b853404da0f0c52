/* coordinator_utf8.h: UTF-8 as the tokenizer and detokenizer see it.
 *
 * Valid means well-formed per Unicode: no overlong forms, no surrogates,
 * nothing past U+10FFFF. Where bytes are not valid, each maximal subpart of
 * an ill-formed sequence becomes one U+FFFD, the rule that Rust's
 * from_utf8_lossy, WHATWG's TextDecoder and Python's 'replace' all follow,
 * so lossy output here equals theirs byte for byte. Pure functions; any
 * thread may call. */
#ifndef SHOAL_COORDINATOR_UTF8_H
#define SHOAL_COORDINATOR_UTF8_H

#include <stdbool.h>
#include <stddef.h>

typedef enum coordinator_utf8_kind {
    COORDINATOR_UTF8_CHAR,  /* a whole, valid character */
    COORDINATOR_UTF8_SHORT, /* a valid start that the buffer ends in */
    COORDINATOR_UTF8_BAD,   /* a maximal ill-formed subpart: one U+FFFD */
} coordinator_utf8_kind;

/* Classifies the sequence that starts at s (n >= 1 bytes) and returns its
 * length in bytes (>= 1), its kind in *kind and, for a CHAR, its code point
 * in *cp (cp may be NULL). */
size_t coordinator_utf8_next(const unsigned char *s, size_t n, coordinator_utf8_kind *kind,
                             unsigned *cp);

/* The length of the longest valid prefix of s; == n when all of s is valid. */
size_t coordinator_utf8_valid_prefix(const unsigned char *s, size_t n);

/* Bytes that coordinator_utf8_lossy writes for s (n bytes). */
size_t coordinator_utf8_lossy_bytes(const unsigned char *s, size_t n);

/* Writes s with every ill-formed subpart replaced by U+FFFD (EF BF BD) into
 * out, which holds at least coordinator_utf8_lossy_bytes(s, n) bytes (3n is
 * always enough). A SHORT tail counts as ill-formed. Returns bytes written. */
size_t coordinator_utf8_lossy(const unsigned char *s, size_t n, unsigned char *out);

/* Where streamed text goes: len counts every byte written, but only the
 * first cap land in buf (buf may be NULL with cap 0, to measure). */
typedef struct coordinator_utf8_sink {
    unsigned char *buf;
    size_t cap;
    size_t len;
} coordinator_utf8_sink;

/* Bytes arriving in pieces (one token at a time) turned into final text:
 * whole characters go out as soon as they are complete; a character split
 * across pieces is held (at most 3 bytes) until the rest arrives; each
 * ill-formed subpart becomes one U+FFFD as soon as it is known to be one.
 * Feeding all pieces and then finishing writes exactly what
 * coordinator_utf8_lossy writes for the concatenation. Zero-initialize. */
typedef struct coordinator_utf8_stream {
    unsigned char held[4];
    unsigned char held_bytes;
} coordinator_utf8_stream;

/* Feeds s (n bytes) and writes what became final to out. */
void coordinator_utf8_stream_feed(coordinator_utf8_stream *st, const unsigned char *s, size_t n,
                                  coordinator_utf8_sink *out);

/* Ends the stream: held bytes (an incomplete character) become U+FFFD.
 * Writes at most 3 bytes; st is empty again afterwards. */
void coordinator_utf8_stream_finish(coordinator_utf8_stream *st, coordinator_utf8_sink *out);

/* Encodes cp (<= 0x10FFFF, not a surrogate) into out (4 bytes); returns its
 * length. */
size_t coordinator_utf8_put(unsigned cp, unsigned char *out);

#endif
