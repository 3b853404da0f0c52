#include "coordinator_utf8.h"

#include <string.h>

size_t coordinator_utf8_next(const unsigned char *s, size_t n, coordinator_utf8_kind *kind,
                             unsigned *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *kind = COORDINATOR_UTF8_CHAR;
        if (cp)
            *cp = c;
        return 1;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF, v;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0; /* overlong below U+0800 */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates U+D800..U+DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90; /* overlong below U+10000 */
        else if (c == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else {
        *kind = COORDINATOR_UTF8_BAD; /* a continuation byte, C0, C1 or F5..FF */
        return 1;
    }
    /* Only the second byte has a narrowed range; later ones are 80..BF. */
    for (size_t i = 1; i < len; i++) {
        if (i == n) {
            *kind = COORDINATOR_UTF8_SHORT;
            return i;
        }
        unsigned b = s[i];
        if (b < lo || b > hi) {
            *kind = COORDINATOR_UTF8_BAD;
            return i;
        }
        v = v << 6 | (b & 0x3F);
        lo = 0x80;
        hi = 0xBF;
    }
    *kind = COORDINATOR_UTF8_CHAR;
    if (cp)
        *cp = v;
    return len;
}

size_t coordinator_utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* ASCII runs dominate real text: test 8 bytes at a time. */
        while (i + 8 <= n) {
            unsigned long long w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i == n)
            break;
        coordinator_utf8_kind kind;
        size_t len = coordinator_utf8_next(s + i, n - i, &kind, NULL);
        if (kind != COORDINATOR_UTF8_CHAR)
            break;
        i += len;
    }
    return i;
}

size_t coordinator_utf8_lossy_bytes(const unsigned char *s, size_t n)
{
    size_t i = 0, out = 0;
    while (i < n) {
        coordinator_utf8_kind kind;
        size_t len = coordinator_utf8_next(s + i, n - i, &kind, NULL);
        out += kind == COORDINATOR_UTF8_CHAR ? len : 3;
        i += len;
    }
    return out;
}

size_t coordinator_utf8_lossy(const unsigned char *s, size_t n, unsigned char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        coordinator_utf8_kind kind;
        size_t len = coordinator_utf8_next(s + i, n - i, &kind, NULL);
        if (kind == COORDINATOR_UTF8_CHAR) {
            memcpy(out + o, s + i, len);
            o += len;
        } else {
            out[o++] = 0xEF;
            out[o++] = 0xBF;
            out[o++] = 0xBD;
        }
        i += len;
    }
    return o;
}

size_t coordinator_utf8_put(unsigned cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static void sink_put(coordinator_utf8_sink *out, const unsigned char *s, size_t n)
{
    if (out->len < out->cap) {
        size_t room = out->cap - out->len;
        memcpy(out->buf + out->len, s, n < room ? n : room);
    }
    out->len += n;
}

static const unsigned char replacement[3] = {0xEF, 0xBF, 0xBD};

void coordinator_utf8_stream_feed(coordinator_utf8_stream *st, const unsigned char *s, size_t n,
                                  coordinator_utf8_sink *out)
{
    size_t i = 0;
    coordinator_utf8_kind kind;
    /* First finish what is held, looking at it together with up to 4 new
     * bytes: enough to decide any sequence that starts in the held part. */
    while (st->held_bytes > 0 && i < n) {
        unsigned char tmp[8];
        size_t h = st->held_bytes, m = n - i < 4 ? n - i : 4;
        memcpy(tmp, st->held, h);
        memcpy(tmp + h, s + i, m);
        size_t len = coordinator_utf8_next(tmp, h + m, &kind, NULL);
        if (kind == COORDINATOR_UTF8_SHORT) {
            /* Only possible when fewer than 4 new bytes came: hold all. */
            memcpy(st->held, tmp, h + m);
            st->held_bytes = (unsigned char)(h + m);
            return;
        }
        if (kind == COORDINATOR_UTF8_CHAR)
            sink_put(out, tmp, len);
        else
            sink_put(out, replacement, 3);
        if (len >= h) {
            i += len - h;
            st->held_bytes = 0;
        } else {
            memmove(st->held, st->held + len, h - len);
            st->held_bytes = (unsigned char)(h - len);
        }
    }
    while (i < n) {
        size_t v = coordinator_utf8_valid_prefix(s + i, n - i);
        sink_put(out, s + i, v);
        i += v;
        if (i == n)
            break;
        size_t len = coordinator_utf8_next(s + i, n - i, &kind, NULL);
        if (kind == COORDINATOR_UTF8_SHORT) {
            memcpy(st->held, s + i, len);
            st->held_bytes = (unsigned char)len;
            return;
        }
        sink_put(out, replacement, 3);
        i += len;
    }
}

void coordinator_utf8_stream_finish(coordinator_utf8_stream *st, coordinator_utf8_sink *out)
{
    /* What is held is a valid start of one character (a SHORT), so it is
     * one maximal ill-formed subpart. */
    if (st->held_bytes > 0)
        sink_put(out, replacement, 3);
    st->held_bytes = 0;
}
