#include "coordinator_buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void coordinator_buf_init(coordinator_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->failed = false;
}

void coordinator_buf_fini(coordinator_buf *b)
{
    free(b->data);
    coordinator_buf_init(b);
}

void coordinator_buf_clear(coordinator_buf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

bool coordinator_buf_failed(const coordinator_buf *b)
{
    return b->failed;
}

bool coordinator_buf_reserve(coordinator_buf *b, size_t bytes)
{
    if (b->failed)
        return false;
    if (bytes >= SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + bytes + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
        b->failed = true;
        return false;
    }
    b->data = data;
    b->cap = cap;
    return true;
}

void coordinator_buf_append(coordinator_buf *b, const void *data, size_t bytes)
{
    if (!coordinator_buf_reserve(b, bytes))
        return;
    if (bytes)
        memcpy(b->data + b->len, data, bytes);
    b->len += bytes;
    b->data[b->len] = '\0';
}

void coordinator_buf_str(coordinator_buf *b, const char *s)
{
    coordinator_buf_append(b, s, strlen(s));
}

void coordinator_buf_printf(coordinator_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[128];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        coordinator_buf_append(b, small, (size_t)n);
        return;
    }
    if (!coordinator_buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void coordinator_buf_int(coordinator_buf *b, long long v)
{
    /* Digits written backwards; no printf on the streaming path. */
    char tmp[24];
    char *p = tmp + sizeof tmp;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    coordinator_buf_append(b, p, (size_t)(tmp + sizeof tmp - p));
}

void coordinator_buf_json_float(coordinator_buf *b, float v)
{
    if (!isfinite(v)) {
        coordinator_buf_str(b, "-9999.0");
        return;
    }
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%.9g", (double)v);
    coordinator_buf_append(b, tmp, (size_t)n);
}

void coordinator_buf_json_string(coordinator_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Worst case: every byte a \u00XX escape. */
    if (n > (SIZE_MAX - 2) / 6 || !coordinator_buf_reserve(b, 6 * n + 2)) {
        b->failed = true;
        return;
    }
    char *o = b->data + b->len;
    *o++ = '"';
    size_t run = 0; /* bytes copied as they are, flushed in one memcpy */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        memcpy(o, s + i - run, run);
        o += run;
        run = 0;
        *o++ = '\\';
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    memcpy(o, s + n - run, run);
    o += run;
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->data);
}

void coordinator_buf_json_bytes(coordinator_buf *b, const unsigned char *s, size_t n)
{
    if (!coordinator_buf_reserve(b, 4 * n + 2))
        return;
    char *o = b->data + b->len;
    *o++ = '[';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *o++ = ',';
        unsigned v = s[i];
        if (v >= 100)
            *o++ = (char)('0' + v / 100);
        if (v >= 10)
            *o++ = (char)('0' + v / 10 % 10);
        *o++ = (char)('0' + v % 10);
    }
    *o++ = ']';
    *o = '\0';
    b->len = (size_t)(o - b->data);
}
