/* test_grammar_index: the token index against brute force (every token
 * stepped through the DFA byte by byte from every state) over a made-up
 * vocabulary with tokens that split UTF-8 characters, duplicates, empty and
 * special tokens and two end ids; must-end states; the memory bound. */
#include <stdint.h>

#include "common/common_rng.h"
#include "grammar/grammar_index.h"
#include "tests/test.h"

enum { VOCAB_FIXED = 32, VOCAB_N = 301, TOKEN_BYTES_MAX = 8 };

static const char *fixed[VOCAB_FIXED] = {
    "a", "b", "ab", "abc", "\"", "{", "}", "",            /* 7: empty */
    "<eos>", "<pad>",                                     /* 8 end id, special; 9 special */
    "\xc3", "\xa9", "\xc3\xa9", "\xc3\xa9\xe4", "\xb8\xad", "\xe4\xb8\xad", /* é and 中, split */
    "aa", "ba", "1", "12", "0", "a\"", " ", "name", ", ", "\"}",
    "a",          /* 26: a duplicate of 0 */
    "\xc3\xa9",   /* 27: a duplicate of 12 */
    "<|im_end|>", /* 28: an end id not flagged special */
    "\xe4", "x", "\": ",
};

typedef struct vocab_fixture {
    uint8_t bytes[VOCAB_N][TOKEN_BYTES_MAX];
    const uint8_t *ptrs[VOCAB_N];
    uint32_t lens[VOCAB_N];
    uint8_t special[VOCAB_N];
    int32_t end_ids[2];
    grammar_vocab v;
} vocab_fixture;

/* The fixed tokens, then random ones made of ASCII and of UTF-8 cut at any
 * byte (so lead bytes and continuations appear alone and in pairs). */
static void vocab_make(vocab_fixture *f)
{
    static const char *parts[] = {"a", "b", "c", "x", "1", "0", "\"", " ", ":", ",", "{", "}",
                                  "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xce\xb1"};
    uint64_t rng = 7;
    memset(f, 0, sizeof *f);
    for (uint32_t t = 0; t < VOCAB_N; t++) {
        if (t < VOCAB_FIXED) {
            f->lens[t] = (uint32_t)strlen(fixed[t]);
            memcpy(f->bytes[t], fixed[t], f->lens[t]);
        } else {
            uint8_t buf[32];
            size_t n = 0, want = 1 + common_rng_next(&rng) % 3;
            for (size_t k = 0; k < want; k++) {
                const char *p = parts[common_rng_next(&rng) % (sizeof parts / sizeof parts[0])];
                memcpy(buf + n, p, strlen(p));
                n += strlen(p);
            }
            size_t from = common_rng_next(&rng) % n;
            size_t len = 1 + common_rng_next(&rng) % (n - from);
            if (len > TOKEN_BYTES_MAX)
                len = TOKEN_BYTES_MAX;
            memcpy(f->bytes[t], buf + from, len);
            f->lens[t] = (uint32_t)len;
        }
        f->ptrs[t] = f->bytes[t];
    }
    f->special[8] = f->special[9] = 1;
    f->end_ids[0] = 8;
    f->end_ids[1] = 28;
    f->v = (grammar_vocab){VOCAB_N, f->ptrs, f->lens, f->special, f->end_ids, 2};
}

static bool is_end(const vocab_fixture *f, uint32_t t)
{
    return (int32_t)t == f->end_ids[0] || (int32_t)t == f->end_ids[1];
}

/* What a token does in state s, stepped byte by byte. */
static int32_t brute_next(const grammar_dfa *dfa, const vocab_fixture *f, int32_t s, uint32_t t)
{
    if (is_end(f, t))
        return grammar_dfa_accepting(dfa, s) ? GRAMMAR_END : GRAMMAR_DEAD;
    if (f->lens[t] == 0 || f->special[t])
        return GRAMMAR_DEAD;
    for (uint32_t i = 0; i < f->lens[t] && s != GRAMMAR_DEAD; i++)
        s = grammar_dfa_step(dfa, s, f->bytes[t][i]);
    return s;
}

static const char *regexes[] = {
    "[a-c]*",
    "(ab|\\u00e9\\u4e2d)+",
    "\\{\"name\": \"[a-z]{1,8}\", \"age\": (0|[1-9][0-9]{0,2})\\}",
    "[\\u00e0-\\u00ff]{1,3}x?",
    "a{2}|b",
    ".*",
    "[^a]*\xf0\x9f\x98\x80",
    "\"([^\"\\\\]|\\\\.)*\"",
    "ab",
};

static void index_matches_brute_force(void)
{
    static vocab_fixture f;
    vocab_make(&f);
    long checked = 0, allowed = 0, split = 0;
    for (size_t r = 0; r < sizeof regexes / sizeof regexes[0]; r++) {
        grammar_dfa *dfa = NULL;
        grammar_index *idx = NULL;
        shoal_diag diag = {{0}};
        CHECK_EQ_INT(grammar_dfa_compile(regexes[r], strlen(regexes[r]), NULL, &dfa, &diag),
                     SHOAL_OK);
        CHECK_MSG(grammar_index_build(dfa, &f.v, NULL, &idx, &diag) == SHOAL_OK, "%s", diag.msg);
        if (!idx) {
            grammar_dfa_free(dfa);
            continue;
        }
        CHECK_EQ_INT(grammar_index_states(idx), grammar_dfa_states(dfa));
        CHECK_EQ_INT(grammar_index_start(idx), grammar_dfa_start(dfa));
        CHECK_EQ_INT(grammar_index_mask_words(idx), (VOCAB_N + 31) / 32);
        for (uint32_t s = 0; s < grammar_dfa_states(dfa); s++) {
            const uint32_t *mask = grammar_index_mask(idx, (int32_t)s);
            uint32_t count = 0;
            bool only_end = true;
            for (uint32_t t = 0; t < VOCAB_N; t++) {
                int32_t want = brute_next(dfa, &f, (int32_t)s, t);
                bool bit = (mask[t / 32] >> (t % 32)) & 1;
                int32_t got = grammar_index_next(idx, (int32_t)s, t);
                CHECK_MSG(bit == (want != GRAMMAR_DEAD) && got == want,
                          "%s state %u token %u: mask %d next %d, want %d", regexes[r], s, t, bit,
                          got, want);
                checked++;
                if (want != GRAMMAR_DEAD) {
                    count++;
                    allowed++;
                    only_end &= is_end(&f, t);
                    if (!is_end(&f, t) && want >= 0 && grammar_dfa_step(dfa, want, 0x80) != GRAMMAR_DEAD)
                        split++; /* it ended inside a character */
                }
            }
            for (uint32_t t = VOCAB_N; t < 32 * grammar_index_mask_words(idx); t++)
                CHECK(!((mask[t / 32] >> (t % 32)) & 1));
            CHECK_EQ_INT(grammar_index_allowed(idx, (int32_t)s), count);
            CHECK_EQ_INT(grammar_index_must_end(idx, (int32_t)s),
                         grammar_dfa_accepting(dfa, (int32_t)s) && only_end);
        }
        CHECK_EQ_INT(grammar_index_next(idx, 0, VOCAB_N), GRAMMAR_DEAD);
        CHECK_EQ_INT(grammar_index_next(idx, GRAMMAR_DEAD, 0), GRAMMAR_DEAD);
        grammar_index_free(idx);
        grammar_dfa_free(dfa);
    }
    printf("  %ld (state, token) pairs, %ld allowed, %ld ending inside a character\n", checked,
           allowed, split);
    CHECK(allowed > 0 && split > 0);
}

static void a_finished_match_must_end(void)
{
    static vocab_fixture f;
    vocab_make(&f);
    grammar_dfa *dfa = NULL;
    grammar_index *idx = NULL;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_dfa_compile("ab", 2, NULL, &dfa, &diag), SHOAL_OK);
    CHECK_EQ_INT(grammar_index_build(dfa, &f.v, NULL, &idx, &diag), SHOAL_OK);
    int32_t s = grammar_index_start(idx);
    CHECK(!grammar_index_must_end(idx, s));
    CHECK_EQ_INT(grammar_index_next(idx, s, 8), GRAMMAR_DEAD); /* EOS before the match */
    s = grammar_index_next(idx, s, 2);                          /* "ab" */
    CHECK(s >= 0);
    CHECK(grammar_index_must_end(idx, s));
    CHECK_EQ_INT(grammar_index_allowed(idx, s), 2);
    CHECK_EQ_INT(grammar_index_next(idx, s, 8), GRAMMAR_END);
    CHECK_EQ_INT(grammar_index_next(idx, s, 28), GRAMMAR_END);
    CHECK_EQ_INT(grammar_index_next(idx, s, 9), GRAMMAR_DEAD); /* special */
    CHECK_EQ_INT(grammar_index_next(idx, s, 7), GRAMMAR_DEAD); /* empty */
    grammar_index_free(idx);
    grammar_dfa_free(dfa);
}

static void memory_bound_and_bad_vocab_refused(void)
{
    static vocab_fixture f;
    vocab_make(&f);
    grammar_dfa *dfa = NULL;
    grammar_index *idx = (grammar_index *)&idx;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_dfa_compile(".*", 2, NULL, &dfa, &diag), SHOAL_OK);
    grammar_limits lim;
    grammar_limits_default(&lim);
    lim.index_bytes_max = 16; /* under one mask row */
    CHECK_EQ_INT(grammar_index_build(dfa, &f.v, &lim, &idx, &diag), SHOAL_ERR_LIMIT);
    CHECK(idx == NULL);
    CHECK_HAS(diag.msg, "index_bytes_max");
    lim.index_bytes_max = grammar_dfa_states(dfa) * 10 * 4 + 100; /* rows fit, pairs do not */
    CHECK_EQ_INT(grammar_index_build(dfa, &f.v, &lim, &idx, &diag), SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "(token, next) pairs");
    f.end_ids[1] = VOCAB_N;
    CHECK_EQ_INT(grammar_index_build(dfa, &f.v, NULL, &idx, &diag), SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "end id 301");
    grammar_dfa_free(dfa);
}

int main(void)
{
    TEST_RUN(index_matches_brute_force);
    TEST_RUN(a_finished_match_must_end);
    TEST_RUN(memory_bound_and_bad_vocab_refused);
    return TEST_EXIT();
}
