/* coordinator_buf.h: a growable byte buffer for bodies and SSE chunks.
 *
 * Responses are written into a buffer that a request keeps for its whole
 * life: it grows (doubling) to the largest chunk it has held and is then
 * reused, so streaming a token allocates nothing once a stream is under
 * way. A failed allocation is sticky: later appends do nothing and
 * coordinator_buf_failed says so, so a writer checks once at the end.
 *
 * Not thread-safe; one owner at a time. */
#ifndef SHOAL_COORDINATOR_BUF_H
#define SHOAL_COORDINATOR_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct coordinator_buf {
    char *data; /* NUL-terminated while not failed (the NUL is not counted) */
    size_t len;
    size_t cap;
    bool failed;
} coordinator_buf;

/* An empty buffer (no allocation yet). */
void coordinator_buf_init(coordinator_buf *b);

/* Frees the storage; the buffer is empty and usable again. */
void coordinator_buf_fini(coordinator_buf *b);

/* Empties the buffer and keeps its storage. Clears a failure. */
void coordinator_buf_clear(coordinator_buf *b);

/* Makes room for `bytes` more bytes (and a NUL). false on failure. */
bool coordinator_buf_reserve(coordinator_buf *b, size_t bytes);

bool coordinator_buf_failed(const coordinator_buf *b);

void coordinator_buf_append(coordinator_buf *b, const void *data, size_t bytes);
void coordinator_buf_str(coordinator_buf *b, const char *s);
void coordinator_buf_printf(coordinator_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void coordinator_buf_int(coordinator_buf *b, long long v);

/* A number as JSON has it: shortest "%.9g" of a float's value (which
 * reads back to the same float); a value JSON cannot hold (an infinite
 * log-probability) is written as -9999.0, as vLLM does. */
void coordinator_buf_json_float(coordinator_buf *b, float v);

/* s (n bytes of UTF-8) as a quoted JSON string: '"', '\\' and control
 * characters escaped, everything else as it is. */
void coordinator_buf_json_string(coordinator_buf *b, const char *s, size_t n);

/* The bytes of s as a JSON array of numbers ([104,105]): OpenAI's `bytes`
 * field of a log-probability entry. */
void coordinator_buf_json_bytes(coordinator_buf *b, const unsigned char *s, size_t n);

#endif
