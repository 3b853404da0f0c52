/* bench_grammar_index: builds the token index of a JSON-schema-shaped regex
 * over a real byte-level BPE vocabulary (Qwen3's tokenizer.json) and prints
 * the DFA's states, the build time, the index's bytes, and the cost of one
 * decode step's masks: looking up and copying 64 rows (a batch of 64
 * streams). Figures only; nothing is asserted on time.
 *
 *   bench_grammar_index [tokenizer.json]
 *
 * The vocabulary's strings are GPT-2's byte-to-unicode alphabet; each code
 * point maps back to one byte. Added tokens are special (never allowed) but
 * for <|im_end|> and <|endoftext|>, which are the end ids. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common_file.h"
#include "common/common_rng.h"
#include "common/common_time.h"
#include "grammar/grammar_index.h"

#ifndef SHOAL_QWEN3_TOKENIZER
#define SHOAL_QWEN3_TOKENIZER "tokenizer.json"
#endif

enum { BATCH_ROWS = 64, TOKEN_BYTES_MAX = 256 };

/* GPT-2's printable stand-ins: bytes 33..126, 161..172 and 174..255 stand
 * for themselves, the others for U+0100 onwards in byte order. */
static void byte_alphabet(int16_t byte_of_cp[512])
{
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_of_cp[self ? b : 256 + n++] = (int16_t)b;
    }
}

/* The bytes a vocabulary string stands for; -1 if a code point is outside
 * the alphabet. */
static int token_bytes(const char *s, const int16_t byte_of_cp[512], uint8_t *out)
{
    const uint8_t *p = (const uint8_t *)s;
    int n = 0;
    while (*p) {
        uint32_t cp;
        if (p[0] < 0x80) {
            cp = p[0];
            p += 1;
        } else if ((p[0] & 0xE0) == 0xC0 && p[1]) {
            cp = ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
            p += 2;
        } else {
            return -1; /* the alphabet stops at U+0143: two bytes at most */
        }
        if (cp >= 512 || byte_of_cp[cp] < 0 || n >= TOKEN_BYTES_MAX)
            return -1;
        out[n++] = (uint8_t)byte_of_cp[cp];
    }
    return n;
}

static const char *schema_regex =
    "\\{\"id\": (0|[1-9][0-9]{0,8}), "
    "\"name\": \"([^\"\\\\\\u0000-\\u001f]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}){1,64}\", "
    "\"email\": \"[a-z0-9._]{1,32}@[a-z]{1,16}\\.(com|org|net)\", "
    "\"tags\": \\[(\"[a-z]{1,12}\"(, \"[a-z]{1,12}\"){0,7})?\\], "
    "\"active\": (true|false), "
    "\"score\": -?(0|[1-9][0-9]{0,8})(\\.[0-9]{1,6})?\\}";

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : SHOAL_QWEN3_TOKENIZER;
    shoal_diag diag = {{0}};
    char *text = NULL;
    size_t text_bytes = 0;
    if (common_file_read(path, 64u << 20, &text, &text_bytes, &diag) != SHOAL_OK) {
        fprintf(stderr, "bench_grammar_index: %s\n", diag.msg);
        return 1;
    }
    cJSON *root = cJSON_ParseWithLength(text, text_bytes);
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(added)) {
        fprintf(stderr, "bench_grammar_index: %s: no model.vocab or added_tokens\n", path);
        return 1;
    }
    uint32_t n_tokens = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, vocab) if ((uint32_t)it->valuedouble + 1 > n_tokens) n_tokens =
        (uint32_t)it->valuedouble + 1;
    cJSON_ArrayForEach(it, added)
    {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        if (id + 1 > n_tokens)
            n_tokens = id + 1;
    }
    uint8_t **bytes = calloc(n_tokens, sizeof *bytes);
    uint32_t *lens = calloc(n_tokens, sizeof *lens);
    uint8_t *special = calloc(n_tokens, 1);
    int16_t byte_of_cp[512];
    uint8_t buf[TOKEN_BYTES_MAX];
    int32_t end_ids[2];
    uint32_t n_end = 0, unmapped = 0;
    byte_alphabet(byte_of_cp);
    cJSON_ArrayForEach(it, vocab)
    {
        uint32_t id = (uint32_t)it->valuedouble;
        int n = token_bytes(it->string, byte_of_cp, buf);
        if (n < 0) {
            unmapped++;
            continue;
        }
        bytes[id] = malloc((size_t)n + 1);
        memcpy(bytes[id], buf, (size_t)n);
        lens[id] = (uint32_t)n;
    }
    cJSON_ArrayForEach(it, added)
    {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        special[id] = 1;
        if ((!strcmp(content, "<|im_end|>") || !strcmp(content, "<|endoftext|>")) && n_end < 2)
            end_ids[n_end++] = (int32_t)id;
    }
    grammar_vocab v = {n_tokens, (const uint8_t *const *)bytes, lens, special, end_ids, n_end};
    printf("vocabulary: %u ids, %d added (special), %u end ids, %u strings outside the byte "
           "alphabet\n",
           n_tokens, cJSON_GetArraySize(added), n_end, unmapped);

    const char *regexes[2] = {schema_regex, "\"([^\"\\\\\\u0000-\\u001f]|\\\\[\"\\\\/bfnrt])*\""};
    const char *names[2] = {"schema (id, name{1,64}, email, tags{0,8}, active, score)",
                            "one JSON string, unbounded"};
    for (int r = 0; r < 2; r++) {
        grammar_dfa *dfa = NULL;
        grammar_index *idx = NULL;
        uint64_t t0 = common_mono_ns();
        if (grammar_dfa_compile(regexes[r], strlen(regexes[r]), NULL, &dfa, &diag) != SHOAL_OK) {
            fprintf(stderr, "bench_grammar_index: %s\n", diag.msg);
            return 1;
        }
        uint64_t t1 = common_mono_ns();
        if (grammar_index_build(dfa, &v, NULL, &idx, &diag) != SHOAL_OK) {
            fprintf(stderr, "bench_grammar_index: %s\n", diag.msg);
            return 1;
        }
        uint64_t t2 = common_mono_ns();
        uint32_t states = grammar_index_states(idx), words = grammar_index_mask_words(idx);
        uint64_t pairs = 0;
        for (uint32_t s = 0; s < states; s++)
            pairs += grammar_index_allowed(idx, (int32_t)s);
        printf("\n%s\n  regex %zu bytes; DFA %u states; compile %.2f ms; index build %.1f ms "
               "(%.1f us a state)\n  index %.1f MiB: %u words a row, %llu (token, next) pairs\n",
               names[r], strlen(regexes[r]), states, (t1 - t0) / 1e6, (t2 - t1) / 1e6,
               (t2 - t1) / 1e3 / states, grammar_index_bytes(idx) / 1048576.0, words,
               (unsigned long long)pairs);

        /* One decode step: 64 streams in random states, each row copied into
         * the batch's mask buffer. */
        uint32_t *batch = malloc((size_t)BATCH_ROWS * words * sizeof *batch);
        int32_t st[BATCH_ROWS];
        uint64_t rng = 1;
        enum { STEPS = 20000 };
        uint64_t sum = 0, t3 = common_mono_ns();
        for (int k = 0; k < STEPS; k++) {
            for (int i = 0; i < BATCH_ROWS; i++)
                st[i] = (int32_t)(common_rng_next(&rng) % states);
            for (int i = 0; i < BATCH_ROWS; i++)
                memcpy(batch + (size_t)i * words, grammar_index_mask(idx, st[i]),
                       words * sizeof *batch);
            sum += batch[(size_t)(k % BATCH_ROWS) * words + (uint32_t)k % words];
        }
        uint64_t t4 = common_mono_ns();
        double step_ns = (double)(t4 - t3) / STEPS;
        printf("  64 rows looked up and copied: %.1f us a step (%.2f GB/s) [%llu]\n", step_ns / 1e3,
               (double)BATCH_ROWS * words * 4 / step_ns, (unsigned long long)(sum & 1));

        /* The next state of an allowed token, as the sampler would ask. */
        enum { LOOKUPS = 1000000 };
        int64_t acc = 0;
        uint64_t t5 = common_mono_ns();
        for (int k = 0; k < LOOKUPS; k++) {
            int32_t s = (int32_t)(common_rng_next(&rng) % states);
            uint32_t t = (uint32_t)(common_rng_next(&rng) % n_tokens);
            acc += grammar_index_next(idx, s, t);
        }
        uint64_t t6 = common_mono_ns();
        printf("  grammar_index_next: %.1f ns a lookup [%lld]\n", (double)(t6 - t5) / LOOKUPS,
               (long long)(acc & 1));
        free(batch);
        grammar_index_free(idx);
        grammar_dfa_free(dfa);
    }
    for (uint32_t t = 0; t < n_tokens; t++)
        free(bytes[t]);
    free(bytes);
    free(lens);
    free(special);
    cJSON_Delete(root);
    free(text);
    return 0;
}
