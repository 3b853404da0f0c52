/* test_grammar_regex: the regex DFA against PCRE2 as the oracle (anchored
 * at both ends, UTF mode), over random, walked and mutated strings; syntax
 * errors that name their offset; the state limits. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "common/common_rng.h"
#include "common/common_assert.h"
#include "grammar/grammar_regex.h"
#include "tests/test.h"

typedef uint64_t shoal_rng;
static void shoal_rng_seed(shoal_rng *r, uint64_t seed) { *r = seed; }
static uint32_t shoal_rng_below(shoal_rng *r, uint32_t n)
{
    return n ? (uint32_t)(common_rng_next(r) % n) : 0;
}

/* Each regex of the dialect with strings it matches (seeds for mutation). */
typedef struct regex_case {
    const char *re;
    const char *samples[4];
} regex_case;

static const regex_case cases[] = {
    {"abc", {"abc"}},
    {"", {""}},
    {"()", {""}},
    {"a|b|", {"a", "b", ""}},
    {"(ab|cd)*e", {"e", "abcde", "cdcdabe"}},
    {"(?:x|yz)+", {"x", "yzx", "xxyz"}},
    {"a?b?c?", {"", "ac", "abc"}},
    {"[a-c]{2}", {"ab", "cc"}},
    {"x{3,}", {"xxx", "xxxxxxx"}},
    {"(ab){1,3}", {"ab", "ababab"}},
    {"a{0,2}b{2,4}", {"bb", "aabbbb", "abbb"}},
    {"(a|b)*a(a|b){3}", {"abbb", "bbaaaa"}},
    {"[^a-z]*", {"", "AB1", "\xc3\xa9\n"}},
    {".+", {"a", "\xe4\xb8\xad z", "\xf0\x9f\x98\x80"}},
    {".?\\n", {"\n", "a\n"}},
    {"\\d+\\.\\d*", {"1.", "12.50"}},
    {"\\w+\\s\\w+", {"ab c", "x_1\tY"}},
    {"[\\d\\s]+", {"1 2", "\t9"}},
    {"\\D\\W\\S", {"a!b", "\xc3\xa9 \xc3\xa9"}},
    {"\\\\\\.\\\"\\/\\n\\r\\t\\f\\v", {"\\.\"/\n\r\t\f\v"}},
    {"\\u00e9+\\u4e2d", {"\xc3\xa9\xe4\xb8\xad", "\xc3\xa9\xc3\xa9\xe4\xb8\xad"}},
    {"[\\u0080-\\u07ff]+", {"\xc2\x80", "\xdf\xbf\xc3\xa9"}},
    {"[\xce\xb1-\xcf\x89]+", {"\xce\xb1", "\xcf\x89\xce\xb2"}},
    {"[^\\u0000-\\u007f]{1,3}", {"\xc3\xa9", "\xe4\xb8\xad\xf0\x9f\x98\x80"}},
    {"[\\u007f-\\u0800]*", {"\x7f", "\xe0\xa0\x80", "\xc2\x80"}},
    {"[\\u07ff-\\ue000]", {"\xdf\xbf", "\xed\x9f\xbf", "\xee\x80\x80"}},
    {"[\xf0\x9f\x98\x80-\xf0\x9f\x99\x8f]+x", {"\xf0\x9f\x98\x80x", "\xf0\x9f\x99\x8f\xf0\x9f\x98\x81x"}},
    {"[^a]", {"b", "\xf4\x8f\xbf\xbf", "\n"}},
    {"[\\u1000-\\u10ff\\u3400-\\u4dbf]{2}", {"\xe1\x80\x80\xe3\x90\x80"}},
    {"[]a]+[a-][-b]", {"]a-b", "aa-"}},
    {"[\\]\\-\\\\]+", {"]-\\"}},
    {"[^\\s\\S]", {""}},
    {"\\{\"name\": \"[a-z]{1,8}\", \"age\": (0|[1-9][0-9]{0,2})\\}",
     {"{\"name\": \"bob\", \"age\": 42}", "{\"name\": \"abcdefgh\", \"age\": 0}"}},
    {"\\[(\"([^\"\\\\]|\\\\[\"\\\\/bfnrt])*\"(, ?\"([^\"\\\\]|\\\\[\"\\\\/bfnrt])*\"){0,3})?\\]",
     {"[]", "[\"a\\n\", \"\xc3\xa9\"]", "[\"\",\"x\"]"}},
    {"(true|false|null|-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?)",
     {"true", "-0.5e+3", "120"}},
};

/* Our dialect's \uXXXX is PCRE2's \x{XXXX}, and our \v (the character
 * U+000B) is a class in PCRE2. */
static void to_pcre(const char *re, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; re[i] && o + 12 < cap; i++) {
        if (re[i] == '\\' && re[i + 1] == 'u') {
            o += (size_t)snprintf(out + o, cap - o, "\\x{%.4s}", re + i + 2);
            i += 5;
        } else if (re[i] == '\\' && re[i + 1] == 'v') {
            o += (size_t)snprintf(out + o, cap - o, "\\x{0b}");
            i += 1;
        } else if (re[i] == '\\' && re[i + 1]) {
            out[o++] = re[i++];
            out[o++] = re[i];
        } else {
            out[o++] = re[i];
        }
    }
    out[o] = 0;
}

static bool dfa_match(const grammar_dfa *dfa, const uint8_t *s, size_t n)
{
    int32_t st = grammar_dfa_start(dfa);
    for (size_t i = 0; i < n && st != GRAMMAR_DEAD; i++)
        st = grammar_dfa_step(dfa, st, s[i]);
    return grammar_dfa_accepting(dfa, st);
}

static bool pcre_match(pcre2_code *code, pcre2_match_data *md, const uint8_t *s, size_t n)
{
    int rc = pcre2_match(code, s, n, 0, 0, md, NULL);
    if (rc >= 0)
        return true;
    /* PCRE2 refuses invalid UTF-8 outright; the DFA matches valid UTF-8 only */
    SHOAL_ASSERT(rc == PCRE2_ERROR_NOMATCH || (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21));
    return false;
}

/* Pieces random strings are made of: ASCII, UTF-8 of every length, and
 * byte sequences that are not UTF-8 (a surrogate, an overlong form, past
 * U+10FFFF, a lone continuation, a cut lead). */
static const char *pieces[] = {
    "a", "b", "z", "0", "9", "_", " ", "\n", "\t", "\"", "\\", "{", "}", "[", "]", ",", ":",
    "-", ".", "\x7f", "\x0b", "\xc2\x80", "\xc3\xa9", "\xce\xb1", "\xdf\xbf", "\xe0\xa0\x80",
    "\xe4\xb8\xad", "\xed\x9f\xbf", "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x9f\x98\x80",
    "\xf4\x8f\xbf\xbf", "\xed\xa0\x80", "\xc0\x80", "\xf4\x90\x80\x80", "\x80", "\xc3", "\xe4\xb8",
};
#define N_PIECES (sizeof pieces / sizeof pieces[0])

enum { STR_MAX = 256 };

typedef struct str {
    uint8_t b[STR_MAX];
    size_t n;
} str;

static void str_put(str *s, const void *p, size_t n)
{
    if (s->n + n <= STR_MAX) {
        memcpy(s->b + s->n, p, n);
        s->n += n;
    }
}

static void random_string(shoal_rng *rng, const regex_case *c, str *s)
{
    s->n = 0;
    size_t len = shoal_rng_below(rng, 12);
    for (size_t i = 0; i < len; i++) {
        uint32_t k = shoal_rng_below(rng, 10);
        if (k < 5) {
            const char *p = pieces[shoal_rng_below(rng, N_PIECES)];
            str_put(s, p, strlen(p));
        } else if (k < 9 && c->samples[0] && c->samples[0][0]) {
            const char *smp = c->samples[shoal_rng_below(rng, 1)];
            str_put(s, smp + shoal_rng_below(rng, (uint32_t)strlen(smp)), 1);
        } else {
            uint8_t b = (uint8_t)shoal_rng_below(rng, 256);
            str_put(s, &b, 1);
        }
    }
}

/* A string the DFA accepts, by a random walk over live transitions. */
static bool walk_string(shoal_rng *rng, const grammar_dfa *dfa, str *s)
{
    int32_t st = grammar_dfa_start(dfa);
    s->n = 0;
    for (;;) {
        if (grammar_dfa_accepting(dfa, st) && (shoal_rng_below(rng, 6) == 0 || s->n > STR_MAX - 8))
            return true;
        if (s->n >= STR_MAX)
            return false;
        uint8_t ok[256];
        int n_ok = 0;
        for (int b = 0; b < 256; b++)
            if (grammar_dfa_step(dfa, st, (uint8_t)b) != GRAMMAR_DEAD)
                ok[n_ok++] = (uint8_t)b;
        if (n_ok == 0)
            return grammar_dfa_accepting(dfa, st);
        uint8_t b = ok[shoal_rng_below(rng, (uint32_t)n_ok)];
        s->b[s->n++] = b;
        st = grammar_dfa_step(dfa, st, b);
    }
}

static void mutate(shoal_rng *rng, str *s)
{
    uint32_t k = shoal_rng_below(rng, 5);
    size_t at = s->n ? shoal_rng_below(rng, (uint32_t)s->n + 1) : 0;
    const char *p = pieces[shoal_rng_below(rng, N_PIECES)];
    size_t pn = strlen(p);
    if (k == 0 && s->n > 0 && at < s->n) { /* delete a byte */
        memmove(s->b + at, s->b + at + 1, s->n - at - 1);
        s->n--;
    } else if (k == 1 && s->n + pn <= STR_MAX) { /* insert a piece */
        memmove(s->b + at + pn, s->b + at, s->n - at);
        memcpy(s->b + at, p, pn);
        s->n += pn;
    } else if (k == 2 && at < s->n) { /* replace a byte */
        s->b[at] = (uint8_t)shoal_rng_below(rng, 256);
    } else if (k == 3 && s->n > 0 && 2 * s->n <= STR_MAX) { /* double it */
        memcpy(s->b + s->n, s->b, s->n);
        s->n *= 2;
    } else if (s->n > 0) { /* cut it */
        s->n = at;
    }
}

static void agrees_with_pcre2_on_every_construct(void)
{
    shoal_rng rng;
    shoal_rng_seed(&rng, 42);
    long checked = 0, matched = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const regex_case *c = &cases[ci];
        grammar_dfa *dfa = NULL;
        shoal_diag diag = {{0}};
        shoal_err err = grammar_dfa_compile(c->re, strlen(c->re), NULL, &dfa, &diag);
        CHECK_MSG(err == SHOAL_OK, "%s: %s", c->re, diag.msg);
        if (err != SHOAL_OK)
            continue;
        char pre[1024];
        to_pcre(c->re, pre, sizeof pre);
        int perr;
        PCRE2_SIZE poff;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pre, PCRE2_ZERO_TERMINATED,
                                         PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &perr,
                                         &poff, NULL);
        SHOAL_ASSERT(code);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        int fails = 0;
        for (int i = 0; i < 4000 && fails < 5; i++) {
            str s;
            int kind = i % 4;
            if (kind == 0) {
                random_string(&rng, c, &s);
            } else if (kind == 1) {
                if (!walk_string(&rng, dfa, &s))
                    continue;
            } else {
                const char *smp = c->samples[shoal_rng_below(&rng, 1)];
                if (kind == 2 || !walk_string(&rng, dfa, &s)) {
                    s.n = 0;
                    str_put(&s, smp ? smp : "", smp ? strlen(smp) : 0);
                }
                for (uint32_t m = shoal_rng_below(&rng, 3) + 1; m > 0; m--)
                    mutate(&rng, &s);
            }
            bool want = pcre_match(code, md, s.b, s.n);
            bool got = dfa_match(dfa, s.b, s.n);
            checked++;
            matched += want;
            if (want != got) {
                fails++;
                fprintf(stderr, "  regex %s: pcre2 %d, dfa %d on:", c->re, want, got);
                for (size_t k = 0; k < s.n; k++)
                    fprintf(stderr, " %02x", s.b[k]);
                fputc('\n', stderr);
            }
            CHECK(want == got);
        }
        for (int k = 0; k < 4 && c->samples[k]; k++) {
            bool want = pcre_match(code, md, (const uint8_t *)c->samples[k], strlen(c->samples[k]));
            CHECK_MSG(dfa_match(dfa, (const uint8_t *)c->samples[k], strlen(c->samples[k])) == want,
                      "%s on sample %d", c->re, k);
        }
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        grammar_dfa_free(dfa);
    }
    printf("  %ld strings, %ld matching\n", checked, matched);
    CHECK(matched > checked / 10);
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A code point near the places where UTF-8 ranges split: the ends of each
 * encoding length, of the surrogates, of a 6-bit continuation group. */
static uint32_t edge_cp(shoal_rng *rng)
{
    static const uint32_t edges[] = {0x0,    0x7F,   0x80,   0x7FF,   0x800,   0xFFF,
                                     0x1000, 0xD7FF, 0xE000, 0xFFFF,  0x10000, 0x3FFFF,
                                     0x40000, 0xFFFFF, 0x100000, 0x10FFFF};
    uint32_t k = shoal_rng_below(rng, 4), cp;
    if (k == 0)
        cp = edges[shoal_rng_below(rng, sizeof edges / sizeof edges[0])];
    else if (k == 1)
        cp = shoal_rng_below(rng, 0x800);
    else if (k == 2)
        cp = shoal_rng_below(rng, 0x10000);
    else
        cp = shoal_rng_below(rng, 0x110000);
    int32_t d = (int32_t)shoal_rng_below(rng, 5) - 2;
    if ((int64_t)cp + d >= 0 && cp + d <= 0x10FFFF)
        cp += d;
    if (cp >= 0xD800 && cp <= 0xDFFF)
        cp = shoal_rng_below(rng, 2) ? 0xD7FF - shoal_rng_below(rng, 3) : 0xE000 + shoal_rng_below(rng, 3);
    return cp;
}

/* Writes a class endpoint: \uXXXX in the BMP, the character past it. */
static size_t class_end(uint32_t cp, char *out)
{
    if (cp < 0x10000)
        return (size_t)sprintf(out, "\\u%04x", cp);
    return utf8_put(cp, out);
}

static void random_ranges_agree_with_pcre2(void)
{
    shoal_rng rng;
    shoal_rng_seed(&rng, 99);
    long checked = 0, matched = 0;
    for (int r = 0; r < 400; r++) {
        uint32_t a = edge_cp(&rng), b = edge_cp(&rng), c = edge_cp(&rng), d = edge_cp(&rng);
        if (a > b) {
            uint32_t t = a;
            a = b;
            b = t;
        }
        if (c > d) {
            uint32_t t = c;
            c = d;
            d = t;
        }
        char re[64];
        size_t n = 0;
        re[n++] = '[';
        if (r % 3 == 0)
            re[n++] = '^';
        n += class_end(a, re + n);
        re[n++] = '-';
        n += class_end(b, re + n);
        if (r % 2) {
            n += class_end(c, re + n);
            re[n++] = '-';
            n += class_end(d, re + n);
        }
        re[n++] = ']';
        re[n] = 0;
        grammar_dfa *dfa = NULL;
        shoal_diag diag = {{0}};
        CHECK_MSG(grammar_dfa_compile(re, n, NULL, &dfa, &diag) == SHOAL_OK, "%s", diag.msg);
        if (!dfa)
            continue;
        char pre[128];
        to_pcre(re, pre, sizeof pre);
        int perr;
        PCRE2_SIZE poff;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pre, PCRE2_ZERO_TERMINATED,
                                         PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &perr,
                                         &poff, NULL);
        SHOAL_ASSERT(code);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        const uint32_t near[] = {a, b, c, d};
        int fails = 0;
        for (int i = 0; i < 200 && fails < 3; i++) {
            uint32_t cp;
            if (i < 16) {
                cp = near[i / 4] + (uint32_t)(i % 4) - 1; /* each end, one below, two above */
                if (cp > 0x10FFFF)
                    continue;
            } else if (i < 100) {
                cp = near[i % 4] ^ (1u << shoal_rng_below(&rng, 21)); /* one bit away */
                if (cp > 0x10FFFF)
                    continue;
            } else {
                cp = edge_cp(&rng);
            }
            char s[4];
            size_t sn = utf8_put(cp, s);
            bool want = pcre_match(code, md, (const uint8_t *)s, sn);
            bool got = dfa_match(dfa, (const uint8_t *)s, sn);
            checked++;
            matched += want;
            if (want != got)
                fails++;
            CHECK_MSG(want == got, "%s on U+%04X: pcre2 %d, dfa %d", re, cp, want, got);
        }
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        grammar_dfa_free(dfa);
    }
    printf("  %ld code points, %ld in their class\n", checked, matched);
    CHECK(matched > checked / 5 && matched < checked);
}

typedef struct bad_case {
    const char *re;
    size_t len; /* 0: strlen */
    shoal_err err;
    const char *fragments[2];
} bad_case;

static void syntax_errors_name_the_offset(void)
{
    static const bad_case bad[] = {
        {"a)", 0, SHOAL_ERR_INVALID, {"at byte 1", "unmatched ')'"}},
        {"x(ab", 0, SHOAL_ERR_INVALID, {"at byte 1", "')'"}},
        {"[abc", 0, SHOAL_ERR_INVALID, {"at byte 0", "']'"}},
        {"*a", 0, SHOAL_ERR_INVALID, {"at byte 0", "repeat"}},
        {"a|+", 0, SHOAL_ERR_INVALID, {"at byte 2", "repeat"}},
        {"a{3", 0, SHOAL_ERR_INVALID, {"at byte 3", "'}'"}},
        {"a{x}", 0, SHOAL_ERR_INVALID, {"at byte 2", "count"}},
        {"a{5,2}", 0, SHOAL_ERR_INVALID, {"at byte 1", "m not below n"}},
        {"a{257}", 0, SHOAL_ERR_LIMIT, {"at byte 1", "SHOAL_GRAMMAR_REPEAT_MAX"}},
        {"a{1,300}", 0, SHOAL_ERR_LIMIT, {"at byte 1", "256"}},
        {"ab\\q", 0, SHOAL_ERR_INVALID, {"at byte 2", "expected an escape"}},
        {"ab\\u12G4", 0, SHOAL_ERR_INVALID, {"at byte 6", "hex digits"}},
        {"\\ud800", 0, SHOAL_ERR_INVALID, {"at byte 0", "surrogate"}},
        {"[z-a]", 0, SHOAL_ERR_INVALID, {"at byte 2", "range"}},
        {"[a-\\d]", 0, SHOAL_ERR_INVALID, {"at byte 2", "class escape"}},
        {"a**", 0, SHOAL_ERR_INVALID, {"at byte 2", "second quantifier"}},
        {"^a", 0, SHOAL_ERR_INVALID, {"at byte 0", "anchor"}},
        {"ab$", 0, SHOAL_ERR_INVALID, {"at byte 2", "anchor"}},
        {"(?=a)", 0, SHOAL_ERR_INVALID, {"at byte 1", "(?:"}},
        {"a\xff", 0, SHOAL_ERR_INVALID, {"at byte 1", "UTF-8"}},
        {"ab\xc3", 0, SHOAL_ERR_INVALID, {"at byte 2", "cut short"}},
        {"\xed\xa0\x80", 0, SHOAL_ERR_INVALID, {"at byte 0", "surrogate"}},
        {"a\\", 0, SHOAL_ERR_INVALID, {"at byte 1", "escaped character"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        grammar_dfa *dfa = (grammar_dfa *)&dfa;
        shoal_diag diag = {{0}};
        size_t len = bad[i].len ? bad[i].len : strlen(bad[i].re);
        shoal_err err = grammar_dfa_compile(bad[i].re, len, NULL, &dfa, &diag);
        CHECK_MSG(err == bad[i].err, "%s: %s (%s)", bad[i].re, shoal_strerror(err), diag.msg);
        CHECK(dfa == NULL);
        for (int k = 0; k < 2; k++)
            CHECK_HAS(diag.msg, bad[i].fragments[k]);
    }
    char deep[2 * 70 + 2];
    memset(deep, '(', 70);
    deep[70] = 'a';
    memset(deep + 71, ')', 70);
    grammar_dfa *dfa = NULL;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_dfa_compile(deep, 141, NULL, &dfa, &diag), SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "SHOAL_GRAMMAR_DEPTH_MAX");
}

static void state_limits_trip_and_name_the_limit(void)
{
    /* (a|b)*a(a|b){12}: the last 13 letters matter, 2^13 DFA states */
    const char *re = "(a|b)*a(a|b){12}";
    grammar_limits lim;
    grammar_limits_default(&lim);
    grammar_dfa *dfa = NULL;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_dfa_compile(re, strlen(re), &lim, &dfa, &diag), SHOAL_OK);
    CHECK(dfa && grammar_dfa_states(dfa) >= 8192);
    grammar_dfa_free(dfa);
    lim.dfa_states_max = 1000;
    CHECK_EQ_INT(grammar_dfa_compile(re, strlen(re), &lim, &dfa, &diag), SHOAL_ERR_LIMIT);
    CHECK(dfa == NULL);
    CHECK_HAS(diag.msg, "more than 1000 states");
    CHECK_HAS(diag.msg, "dfa_states_max");

    const char *big = "((a{256}){256}){256}";
    CHECK_EQ_INT(grammar_dfa_compile(big, strlen(big), NULL, &dfa, &diag), SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "nfa_states_max");
}

static void pruned_states_all_reach_a_match(void)
{
    /* every state kept can reach an accepting one: a walk never gets stuck */
    const char *re = "(ab|ac|[^\\s\\S]x)*d";
    grammar_dfa *dfa = NULL;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_dfa_compile(re, strlen(re), NULL, &dfa, &diag), SHOAL_OK);
    for (uint32_t s = 0; dfa && s < grammar_dfa_states(dfa); s++) {
        bool way = grammar_dfa_accepting(dfa, (int32_t)s);
        for (int b = 0; b < 256; b++)
            way |= grammar_dfa_step(dfa, (int32_t)s, (uint8_t)b) != GRAMMAR_DEAD;
        CHECK(way);
    }
    CHECK(grammar_dfa_step(dfa, GRAMMAR_DEAD, 'a') == GRAMMAR_DEAD);
    grammar_dfa_free(dfa);
}

int main(void)
{
    TEST_RUN(agrees_with_pcre2_on_every_construct);
    TEST_RUN(random_ranges_agree_with_pcre2);
    TEST_RUN(syntax_errors_name_the_offset);
    TEST_RUN(state_limits_trip_and_name_the_limit);
    TEST_RUN(pruned_states_all_reach_a_match);
    return TEST_EXIT();
}
