#include "coordinator_stop.h"

#include "common/common_assert.h"
#include "coordinator_limits.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct stop_string {
    unsigned char text[COORDINATOR_STOP_BYTES_MAX];
    /* fail[k]: the length of the longest proper border of text[0..k]
     * (the KMP failure function of the prefix of k + 1 bytes). */
    uint16_t fail[COORDINATOR_STOP_BYTES_MAX];
    uint16_t len;
    uint16_t state; /* bytes of text matched by the end of what was fed */
} stop_string;

struct coordinator_stop {
    int count;
    int matched; /* index of the match, or -1 */
    size_t held_len;
    char held[COORDINATOR_STOP_BYTES_MAX]; /* < longest stop string */
    stop_string str[];
};

shoal_err coordinator_stop_new(const char *const *strs, const size_t *lens, int count,
                               coordinator_stop **out)
{
    *out = NULL;
    if (count < 0 || count > COORDINATOR_STOP_STRINGS_MAX)
        return SHOAL_ERR_INVALID;
    for (int i = 0; i < count; i++)
        if (lens[i] == 0 || lens[i] > COORDINATOR_STOP_BYTES_MAX)
            return SHOAL_ERR_INVALID;
    coordinator_stop *s = malloc(sizeof *s + (size_t)count * sizeof s->str[0]);
    if (!s)
        return SHOAL_ERR_NOMEM;
    s->count = count;
    for (int i = 0; i < count; i++) {
        stop_string *t = &s->str[i];
        t->len = (uint16_t)lens[i];
        memcpy(t->text, strs[i], lens[i]);
        t->fail[0] = 0;
        for (size_t k = 1, b = 0; k < t->len; k++) {
            while (b > 0 && t->text[k] != t->text[b])
                b = t->fail[b - 1];
            if (t->text[k] == t->text[b])
                b++;
            t->fail[k] = (uint16_t)b;
        }
    }
    coordinator_stop_reset(s);
    *out = s;
    return SHOAL_OK;
}

void coordinator_stop_free(coordinator_stop *s)
{
    free(s);
}

void coordinator_stop_reset(coordinator_stop *s)
{
    s->matched = -1;
    s->held_len = 0;
    for (int i = 0; i < s->count; i++)
        s->str[i].state = 0;
}

size_t coordinator_stop_out_bytes(const coordinator_stop *s, size_t n)
{
    return s->held_len + n;
}

size_t coordinator_stop_held(const coordinator_stop *s)
{
    return s->held_len;
}

/* Advances one automaton by byte c; true when the whole string matched. */
static bool step(stop_string *t, unsigned char c)
{
    size_t q = t->state;
    if (q == t->len) /* only after a match, which ends matching */
        q = t->fail[q - 1];
    while (q > 0 && t->text[q] != c)
        q = t->fail[q - 1];
    if (t->text[q] == c)
        q++;
    t->state = (uint16_t)q;
    return q == t->len;
}

int coordinator_stop_feed(coordinator_stop *s, const char *text, size_t n, char *out,
                          size_t *out_bytes)
{
    *out_bytes = 0;
    if (s->matched >= 0)
        return s->matched;
    if (s->count == 0) {
        memcpy(out, text, n);
        *out_bytes = n;
        return -1;
    }
    /* The text so far, seen as held[0..held_len) followed by text[0..n). */
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < s->count; k++) {
            if (!step(&s->str[k], (unsigned char)text[i]))
                continue;
            /* It ends at held_len + i; it began len - 1 bytes before. The
             * held tail covers every partial match, so the start is in it
             * or in text. */
            size_t end = s->held_len + i + 1;
            SHOAL_ASSERT(end >= s->str[k].len);
            size_t start = end - s->str[k].len;
            size_t from_held = start < s->held_len ? start : s->held_len;
            memcpy(out, s->held, from_held);
            if (start > s->held_len)
                memcpy(out + from_held, text, start - s->held_len);
            *out_bytes = start;
            s->matched = k;
            s->held_len = 0;
            return k;
        }
    }
    /* No match: hold the longest tail that is still a prefix of a stop
     * string, pass on the rest. */
    size_t hold = 0;
    for (int k = 0; k < s->count; k++)
        if (s->str[k].state > hold)
            hold = s->str[k].state;
    size_t total = s->held_len + n;
    SHOAL_ASSERT(hold <= total && hold < COORDINATOR_STOP_BYTES_MAX);
    size_t emit = total - hold;
    size_t from_held = emit < s->held_len ? emit : s->held_len;
    memcpy(out, s->held, from_held);
    if (emit > s->held_len)
        memcpy(out + from_held, text, emit - s->held_len);
    *out_bytes = emit;
    /* The new held tail: the last `hold` bytes of held + text. */
    char tail[COORDINATOR_STOP_BYTES_MAX];
    for (size_t j = 0; j < hold; j++) {
        size_t at = emit + j;
        tail[j] = at < s->held_len ? s->held[at] : text[at - s->held_len];
    }
    memcpy(s->held, tail, hold);
    s->held_len = hold;
    return -1;
}

size_t coordinator_stop_flush(coordinator_stop *s, char *out)
{
    if (s->matched >= 0)
        return 0;
    size_t n = s->held_len;
    memcpy(out, s->held, n);
    s->held_len = 0;
    for (int k = 0; k < s->count; k++)
        s->str[k].state = 0;
    return n;
}
