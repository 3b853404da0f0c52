/* Tests of coordinator_stop: stop strings found across pieces of streamed
 * text, never emitted, with only a possible beginning of one held back;
 * checked against a plain search of the whole text on random inputs. */
#include "../test.h"
#include "common/common_rng.h"
#include "coordinator/coordinator_limits.h"
#include "coordinator/coordinator_stop.h"

#include <stdint.h>

static coordinator_stop *make(int count, const char *const *strs)
{
    size_t lens[COORDINATOR_STOP_STRINGS_MAX];
    for (int i = 0; i < count; i++)
        lens[i] = strlen(strs[i]);
    coordinator_stop *s = NULL;
    CHECK(coordinator_stop_new(strs, lens, count, &s) == SHOAL_OK);
    return s;
}

/* Feeds pieces; returns the text emitted (into out) and the match. */
static int feed_all(coordinator_stop *s, const char *const *pieces, int n, char *out,
                    size_t *out_len)
{
    *out_len = 0;
    int match = -1;
    for (int i = 0; i < n && match < 0; i++) {
        size_t got;
        match = coordinator_stop_feed(s, pieces[i], strlen(pieces[i]), out + *out_len, &got);
        *out_len += got;
    }
    if (match < 0)
        *out_len += coordinator_stop_flush(s, out + *out_len);
    out[*out_len] = '\0';
    return match;
}

static void text_without_stop_strings_passes_at_once(void)
{
    coordinator_stop *s = make(0, NULL);
    char out[64];
    size_t n;
    CHECK(coordinator_stop_feed(s, "hello", 5, out, &n) == -1 && n == 5);
    CHECK(memcmp(out, "hello", 5) == 0 && coordinator_stop_held(s) == 0);
    coordinator_stop_free(s);
}

static void a_possible_beginning_is_held_and_released_when_it_diverges(void)
{
    const char *stops[] = {"STOP"};
    coordinator_stop *s = make(1, stops);
    char out[64];
    size_t n;
    CHECK(coordinator_stop_feed(s, "abcST", 5, out, &n) == -1);
    CHECK(n == 3 && memcmp(out, "abc", 3) == 0 && coordinator_stop_held(s) == 2);
    CHECK(coordinator_stop_feed(s, "Ox", 2, out, &n) == -1);
    CHECK(n == 4 && memcmp(out, "STOx", 4) == 0 && coordinator_stop_held(s) == 0);
    CHECK(coordinator_stop_feed(s, "S", 1, out, &n) == -1 && n == 0);
    CHECK(coordinator_stop_flush(s, out) == 1 && out[0] == 'S');
    coordinator_stop_free(s);
}

static void a_stop_string_split_over_pieces_ends_the_text_before_it(void)
{
    const char *stops[] = {"</answer>"};
    const char *pieces[] = {"The answer is 42", ".</", "ans", "wer>", " and more"};
    coordinator_stop *s = make(1, stops);
    char out[128];
    size_t n;
    CHECK_EQ_INT(feed_all(s, pieces, 5, out, &n), 0);
    CHECK_MSG(strcmp(out, "The answer is 42.") == 0, "'%s'", out);
    /* after a match nothing more comes out */
    size_t more;
    CHECK(coordinator_stop_feed(s, "x", 1, out, &more) == 0 && more == 0);
    CHECK(coordinator_stop_flush(s, out) == 0);
    coordinator_stop_free(s);
}

static void overlapping_prefixes_are_not_missed(void)
{
    /* "aab" inside "aaab": a naive restart after the failed third 'a'
     * would miss it. */
    const char *stops[] = {"aab"};
    const char *pieces[] = {"x", "a", "a", "a", "b", "y"};
    coordinator_stop *s = make(1, stops);
    char out[64];
    size_t n;
    CHECK_EQ_INT(feed_all(s, pieces, 6, out, &n), 0);
    CHECK_MSG(strcmp(out, "xa") == 0, "'%s'", out);
    coordinator_stop_free(s);
}

static void the_stop_string_that_ends_first_wins(void)
{
    const char *stops[] = {"abcd", "bc", "c"};
    const char *pieces[] = {"zab", "cd"};
    coordinator_stop *s = make(3, stops);
    char out[64];
    size_t n;
    /* "bc" and "c" both end at the same 'c'; the one listed first wins */
    CHECK_EQ_INT(feed_all(s, pieces, 2, out, &n), 1);
    CHECK_MSG(strcmp(out, "za") == 0, "'%s'", out);
    coordinator_stop_free(s);
}

static void multibyte_stop_strings_hold_whole_characters(void)
{
    const char *stops[] = {"\xe3\x80\x82\xe3\x80\x82"}; /* two ideographic full stops */
    coordinator_stop *s = make(1, stops);
    char out[64];
    size_t n;
    CHECK(coordinator_stop_feed(s, "\xe4\xbd\xa0\xe3\x80\x82", 6, out, &n) == -1);
    CHECK(n == 3 && coordinator_stop_held(s) == 3); /* the held tail is one whole character */
    CHECK(coordinator_stop_feed(s, "\xe3\x80\x82!", 4, out, &n) == 0);
    CHECK(n == 0);
    coordinator_stop_free(s);
}

static void bounds_are_refused(void)
{
    coordinator_stop *s = NULL;
    const char *one[] = {""};
    size_t zero = 0;
    CHECK(coordinator_stop_new(one, &zero, 1, &s) == SHOAL_ERR_INVALID && !s);
    char long_stop[COORDINATOR_STOP_BYTES_MAX + 2];
    memset(long_stop, 'x', sizeof long_stop);
    const char *lp[] = {long_stop};
    size_t max = COORDINATOR_STOP_BYTES_MAX, over = COORDINATOR_STOP_BYTES_MAX + 1;
    CHECK(coordinator_stop_new(lp, &max, 1, &s) == SHOAL_OK);
    coordinator_stop_free(s);
    CHECK(coordinator_stop_new(lp, &over, 1, &s) == SHOAL_ERR_INVALID);
    const char *many[COORDINATOR_STOP_STRINGS_MAX + 1];
    size_t lens[COORDINATOR_STOP_STRINGS_MAX + 1];
    for (int i = 0; i <= COORDINATOR_STOP_STRINGS_MAX; i++) {
        many[i] = "x";
        lens[i] = 1;
    }
    CHECK(coordinator_stop_new(many, lens, COORDINATOR_STOP_STRINGS_MAX, &s) == SHOAL_OK);
    coordinator_stop_free(s);
    CHECK(coordinator_stop_new(many, lens, COORDINATOR_STOP_STRINGS_MAX + 1, &s) ==
          SHOAL_ERR_INVALID);
}

/* The plain reference: the earliest end of any stop string in the whole
 * text (ties to the one listed first); the text before its start. */
static int reference(const char *text, size_t n, char stops[][8], const size_t *lens, int count,
                     size_t *keep)
{
    for (size_t end = 1; end <= n; end++)
        for (int k = 0; k < count; k++)
            if (lens[k] <= end && memcmp(text + end - lens[k], stops[k], lens[k]) == 0) {
                *keep = end - lens[k];
                return k;
            }
    *keep = n;
    return -1;
}

static void random_texts_match_a_plain_search(void)
{
    uint64_t rng = 1234;
    int mismatches = 0;
    for (int trial = 0; trial < 20000; trial++) {
        /* a small alphabet makes near-misses and overlaps common */
        int count = 1 + (int)(common_rng_next(&rng) % 3);
        char stops[3][8];
        size_t lens[3];
        const char *ptrs[3];
        for (int k = 0; k < count; k++) {
            lens[k] = 1 + common_rng_next(&rng) % 5;
            for (size_t j = 0; j < lens[k]; j++)
                stops[k][j] = (char)('a' + common_rng_next(&rng) % 3);
            ptrs[k] = stops[k];
        }
        char text[40];
        size_t n = common_rng_next(&rng) % sizeof text;
        for (size_t j = 0; j < n; j++)
            text[j] = (char)('a' + common_rng_next(&rng) % 3);
        coordinator_stop *s = NULL;
        CHECK(coordinator_stop_new(ptrs, lens, count, &s) == SHOAL_OK);
        char out[64];
        size_t got = 0, at = 0;
        int match = -1;
        size_t max_len = 0;
        for (int k = 0; k < count; k++)
            max_len = lens[k] > max_len ? lens[k] : max_len;
        while (at < n && match < 0) {
            size_t piece = 1 + common_rng_next(&rng) % 4;
            if (piece > n - at)
                piece = n - at;
            size_t w;
            match = coordinator_stop_feed(s, text + at, piece, out + got, &w);
            got += w;
            at += piece;
            if (coordinator_stop_held(s) >= max_len)
                mismatches++;
        }
        if (match < 0)
            got += coordinator_stop_flush(s, out + got);
        size_t keep;
        int want = reference(text, n, stops, lens, count, &keep);
        if (want != match || keep != got || memcmp(out, text, got) != 0)
            mismatches++;
        coordinator_stop_free(s);
    }
    CHECK_EQ_INT(mismatches, 0);
}

int main(void)
{
    TEST_RUN(text_without_stop_strings_passes_at_once);
    TEST_RUN(a_possible_beginning_is_held_and_released_when_it_diverges);
    TEST_RUN(a_stop_string_split_over_pieces_ends_the_text_before_it);
    TEST_RUN(overlapping_prefixes_are_not_missed);
    TEST_RUN(the_stop_string_that_ends_first_wins);
    TEST_RUN(multibyte_stop_strings_hold_whole_characters);
    TEST_RUN(bounds_are_refused);
    TEST_RUN(random_texts_match_a_plain_search);
    return TEST_EXIT();
}
