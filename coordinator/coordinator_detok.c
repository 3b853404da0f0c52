#include "coordinator_detok.h"

void coordinator_detok_init(coordinator_detok *d, const coordinator_tokenizer *tok, unsigned flags)
{
    d->tok = tok;
    d->flags = flags;
    d->utf8 = (coordinator_utf8_stream){{0}, 0};
}

shoal_err coordinator_detok_push(coordinator_detok *d, int32_t id, char *out, size_t cap,
                                 size_t *out_bytes)
{
    *out_bytes = 0;
    if ((d->flags & COORDINATOR_DECODE_SKIP_SPECIAL) &&
        coordinator_tokenizer_is_special(d->tok, id))
        return SHOAL_OK;
    const unsigned char *b;
    size_t len = coordinator_tokenizer_token_bytes(d->tok, id, &b);
    if (len == 0)
        return SHOAL_OK;
    /* Measure first on a copy, so a too-small buffer consumes nothing. */
    coordinator_utf8_stream probe = d->utf8;
    coordinator_utf8_sink sink = {NULL, 0, 0};
    coordinator_utf8_stream_feed(&probe, b, len, &sink);
    if (sink.len > cap)
        return SHOAL_ERR_LIMIT;
    sink = (coordinator_utf8_sink){(unsigned char *)out, cap, 0};
    coordinator_utf8_stream_feed(&d->utf8, b, len, &sink);
    *out_bytes = sink.len;
    return SHOAL_OK;
}

size_t coordinator_detok_finish(coordinator_detok *d, char *out)
{
    coordinator_utf8_sink sink = {(unsigned char *)out, COORDINATOR_DETOK_FINISH_BYTES_MAX, 0};
    coordinator_utf8_stream_finish(&d->utf8, &sink);
    return sink.len;
}

size_t coordinator_detok_held(const coordinator_detok *d)
{
    return d->utf8.held_bytes;
}
