/* Tests of coordinator_detok: streamed text is final, valid UTF-8 at every
 * step, holds back a character split across tokens, and adds up to
 * exactly what decode gives for the whole sequence. */
#include "text_ref.h"

#include "../test.h"
#include "common/common_file.h"
#include "coordinator/coordinator_detok.h"
#include "coordinator/coordinator_tokenizer.h"
#include "coordinator/coordinator_utf8.h"

#define IDS_CAP (1u << 20)

static coordinator_tokenizer *tok;
static coordinator_tokenizer_work *work;
static int32_t *ids;
static char *whole, *streamed;

static unsigned char *raw, *lossy;

/* Streams ids[0..n) one at a time; checks every chunk, and the total
 * against decode and against the non-streaming lossy conversion of all
 * the ids' bytes. */
static bool stream_matches_decode(const int32_t *list, size_t n, unsigned flags)
{
    size_t whole_len = 0, got = 0, raw_len = 0;
    if (coordinator_tokenizer_decode(tok, list, n, flags, whole, 4 * IDS_CAP, &whole_len) !=
        SHOAL_OK)
        return false;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *b;
        if ((flags & COORDINATOR_DECODE_SKIP_SPECIAL) &&
            coordinator_tokenizer_is_special(tok, list[i]))
            continue;
        size_t len = coordinator_tokenizer_token_bytes(tok, list[i], &b);
        if (len)
            memcpy(raw + raw_len, b, len);
        raw_len += len;
    }
    size_t lossy_len = coordinator_utf8_lossy(raw, raw_len, lossy);
    if (lossy_len != whole_len || memcmp(lossy, whole, whole_len) != 0)
        return false;
    coordinator_detok d;
    coordinator_detok_init(&d, tok, flags);
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        char chunk[COORDINATOR_DETOK_PUSH_BYTES_MAX];
        size_t len = 0;
        ok &= coordinator_detok_push(&d, list[i], chunk, sizeof chunk, &len) == SHOAL_OK;
        /* Every chunk is whole characters: valid UTF-8 on its own. */
        ok &= coordinator_utf8_valid_prefix((unsigned char *)chunk, len) == len;
        memcpy(streamed + got, chunk, len);
        got += len;
    }
    got += coordinator_detok_finish(&d, streamed + got);
    return ok && got == whole_len && memcmp(streamed, whole, got) == 0;
}

static void streamed_text_equals_decode_for_the_corpus(void)
{
    char *json;
    size_t bytes;
    shoal_diag diag = {{0}};
    CHECK(common_file_read(TEXT_CORPUS, 1u << 24, &json, &bytes, &diag) == SHOAL_OK);
    cJSON *corpus = cJSON_Parse(json);
    int texts = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItem(corpus, "strings"))
    {
        size_t n = 0;
        CHECK(coordinator_tokenizer_encode(tok, work, s->valuestring, strlen(s->valuestring), 0,
                                           ids, IDS_CAP, &n, &diag) == SHOAL_OK);
        CHECK_MSG(stream_matches_decode(ids, n, 0), "text %d", texts);
        CHECK_MSG(stream_matches_decode(ids, n, COORDINATOR_DECODE_SKIP_SPECIAL), "text %d", texts);
        /* Each id on its own (a multi-byte character cut by every
         * boundary), and the ids reversed (bytes in orders no text has). */
        for (size_t i = 0; i < n; i++)
            CHECK(stream_matches_decode(ids + i, 1, 0));
        for (size_t i = 0; i < n / 2; i++) {
            int32_t t = ids[i];
            ids[i] = ids[n - 1 - i];
            ids[n - 1 - i] = t;
        }
        CHECK_MSG(stream_matches_decode(ids, n, 0), "text %d reversed", texts);
        texts++;
    }
    printf("  %d texts streamed\n", texts);
    CHECK(texts >= 300);
    cJSON_Delete(corpus);
    free(json);
}

/* The token of one raw byte (its byte-level character). */
static int32_t byte_token(unsigned char b)
{
    unsigned char buf[4];
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
        unsigned k = 0;
        for (unsigned i = 0; i < b; i++)
            k += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE));
        cp = 256 + k;
    }
    size_t n = coordinator_utf8_put(cp, buf);
    buf[n] = '\0';
    return coordinator_tokenizer_token_id(tok, (char *)buf);
}

static size_t push(coordinator_detok *d, int32_t id, char *out)
{
    size_t len = 99;
    CHECK(coordinator_detok_push(d, id, out, COORDINATOR_DETOK_PUSH_BYTES_MAX, &len) == SHOAL_OK);
    return len;
}

static void character_split_across_tokens_is_held_until_complete(void)
{
    static const unsigned char smile[] = {0xF0, 0x9F, 0x98, 0x80}; /* U+1F600 */
    char out[COORDINATOR_DETOK_PUSH_BYTES_MAX];
    coordinator_detok d;
    coordinator_detok_init(&d, tok, 0);
    CHECK_EQ_INT(push(&d, byte_token('a'), out), 1);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(push(&d, byte_token(smile[i]), out), 0);
        CHECK_EQ_INT(coordinator_detok_held(&d), i + 1);
    }
    CHECK_EQ_INT(push(&d, byte_token(smile[3]), out), 4);
    CHECK(memcmp(out, smile, 4) == 0);
    CHECK_EQ_INT(coordinator_detok_held(&d), 0);
    CHECK_EQ_INT(coordinator_detok_finish(&d, out), 0);
}

static void bytes_that_cannot_become_text_give_replacement_at_once(void)
{
    char out[COORDINATOR_DETOK_PUSH_BYTES_MAX];
    coordinator_detok d;
    coordinator_detok_init(&d, tok, 0);
    /* A lone continuation byte can never start a character. */
    CHECK_EQ_INT(push(&d, byte_token(0x80), out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    /* A started character broken by ASCII: U+FFFD, then the ASCII. */
    CHECK_EQ_INT(push(&d, byte_token(0xE4), out), 0);
    CHECK_EQ_INT(push(&d, byte_token('x'), out), 4);
    CHECK(memcmp(out, "\xef\xbf\xbdx", 4) == 0);
    /* Two good bytes of a character, then ASCII: one U+FFFD for both. */
    CHECK_EQ_INT(push(&d, byte_token(0xE4), out), 0);
    CHECK_EQ_INT(push(&d, byte_token(0xBD), out), 0);
    CHECK_EQ_INT(push(&d, byte_token('x'), out), 4);
    CHECK(memcmp(out, "\xef\xbf\xbdx", 4) == 0);
    /* An overlong start (E0 80) is known bad at its second byte. */
    CHECK_EQ_INT(push(&d, byte_token(0xE0), out), 0);
    CHECK_EQ_INT(push(&d, byte_token(0x80), out), 6);
    /* The stream ends inside a character: one U+FFFD. */
    CHECK_EQ_INT(push(&d, byte_token(0xF0), out), 0);
    CHECK_EQ_INT(push(&d, byte_token(0x9F), out), 0);
    CHECK_EQ_INT(coordinator_detok_finish(&d, out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    /* Afterwards it starts clean. */
    CHECK_EQ_INT(push(&d, byte_token('y'), out), 1);
}

static void special_tokens_skipped_when_asked_and_small_buffers_refused(void)
{
    int32_t im_end = coordinator_tokenizer_token_id(tok, "<|im_end|>");
    char out[COORDINATOR_DETOK_PUSH_BYTES_MAX];
    coordinator_detok d;
    coordinator_detok_init(&d, tok, COORDINATOR_DECODE_SKIP_SPECIAL);
    CHECK_EQ_INT(push(&d, im_end, out), 0);
    CHECK_EQ_INT(push(&d, coordinator_tokenizer_token_id(tok, "<think>"), out), 7);
    coordinator_detok_init(&d, tok, 0);
    CHECK_EQ_INT(push(&d, im_end, out), 10);
    /* Too small: refused, and the token is not consumed. */
    CHECK_EQ_INT(push(&d, byte_token(0xE4), out), 0);
    size_t len = 99;
    CHECK_EQ_INT(coordinator_detok_push(&d, byte_token('z'), out, 2, &len), SHOAL_ERR_LIMIT);
    CHECK_EQ_INT(len, 0);
    CHECK_EQ_INT(coordinator_detok_held(&d), 1);
    CHECK_EQ_INT(push(&d, byte_token('z'), out), 4);
    /* Ids with no token add nothing. */
    CHECK_EQ_INT(push(&d, -1, out), 0);
    CHECK_EQ_INT(push(&d, 10000000, out), 0);
}

int main(void)
{
    shoal_diag diag = {{0}};
    if (coordinator_tokenizer_open(QWEN3_TOKENIZER, &tok, &diag) != SHOAL_OK ||
        coordinator_tokenizer_work_open(tok, &work, &diag) != SHOAL_OK) {
        fprintf(stderr, "%s (run tools/setup)\n", diag.msg);
        return 1;
    }
    ids = malloc(IDS_CAP * sizeof *ids);
    whole = malloc(4 * IDS_CAP);
    streamed = malloc(4 * IDS_CAP);
    raw = malloc(4 * IDS_CAP);
    lossy = malloc(12 * IDS_CAP);
    TEST_RUN(streamed_text_equals_decode_for_the_corpus);
    TEST_RUN(character_split_across_tokens_is_held_until_complete);
    TEST_RUN(bytes_that_cannot_become_text_give_replacement_at_once);
    TEST_RUN(special_tokens_skipped_when_asked_and_small_buffers_refused);
    free(ids);
    free(whole);
    free(streamed);
    free(raw);
    free(lossy);
    coordinator_tokenizer_work_close(work);
    coordinator_tokenizer_close(tok);
    return TEST_EXIT();
}
