/* grammar_index.c: per DFA state, the mask of allowed tokens and each
 * allowed token's next state.
 *
 * The vocabulary is walked as a trie in sorted form: tokens sorted by their
 * bytes, each with the length of the prefix it shares with the one before
 * (lcp). Walking them in order from a state, the DFA states after each byte
 * of the previous token stay on a stack, so a shared prefix is stepped once
 * per state, and a byte that leads to GRAMMAR_DEAD skips every following
 * token that shares the prefix through that byte: a trie's subtree, pruned. */
#include "grammar/grammar_index.h"

#include <stdlib.h>
#include <string.h>

#include "common/common_assert.h"
#include "common/common_limits.h"

typedef struct pair {
    uint32_t token;
    int32_t next; /* a state, or GRAMMAR_END for an end id */
} pair;

struct grammar_index {
    uint32_t n_states, n_tokens, words;
    uint32_t *masks;     /* [state * words + word] */
    pair *pairs;         /* each state's, sorted by token */
    uint64_t *pair_off;  /* [state], [n_states] is the end */
    uint8_t *must_end;   /* [state] */
    uint64_t bytes;
};

/* A token as the sort sees it: its bytes ride along, so qsort needs no
 * context. */
typedef struct tok_ref {
    const uint8_t *b;
    uint32_t len, id;
} tok_ref;

static int tok_cmp(const void *xa, const void *ya)
{
    const tok_ref *x = xa, *y = ya;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->b, y->b, n) : 0;
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

shoal_err grammar_index_build(const grammar_dfa *dfa, const grammar_vocab *vocab,
                              const grammar_limits *limits, grammar_index **out, shoal_diag *diag)
{
    grammar_limits def;
    if (!limits) {
        grammar_limits_default(&def);
        limits = &def;
    }
    *out = NULL;
    if (vocab->n_tokens == 0 || vocab->n_tokens > SHOAL_MODEL_VOCAB_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "grammar index: %u tokens, expected 1 to %d (SHOAL_MODEL_VOCAB_MAX)",
                              vocab->n_tokens, SHOAL_MODEL_VOCAB_MAX);
    for (uint32_t i = 0; i < vocab->n_end_ids; i++)
        if (vocab->end_ids[i] < 0 || (uint32_t)vocab->end_ids[i] >= vocab->n_tokens)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "grammar index: end id %d (number %u) is not below the %u tokens",
                                  vocab->end_ids[i], i, vocab->n_tokens);

    uint32_t n_states = grammar_dfa_states(dfa), n_tok = vocab->n_tokens;
    uint32_t words = (n_tok + 31) / 32;
    uint64_t rows_bytes = (uint64_t)n_states * words * sizeof(uint32_t);
    if (rows_bytes > limits->index_bytes_max)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "grammar index: %u states x %u mask words need %llu bytes, over "
                              "%llu (grammar_limits.index_bytes_max)",
                              n_states, words, (unsigned long long)rows_bytes,
                              (unsigned long long)limits->index_bytes_max);

    shoal_err err = SHOAL_ERR_NOMEM;
    grammar_index *idx = calloc(1, sizeof *idx);
    uint8_t *is_end = calloc(n_tok, 1);
    tok_ref *order = malloc((size_t)n_tok * sizeof *order);
    uint32_t *lcp = malloc((size_t)n_tok * sizeof *lcp);
    int32_t *next_of = malloc((size_t)n_tok * sizeof *next_of);
    int32_t *stack = NULL;
    size_t cap_pairs = 0;
    if (!idx || !is_end || !order || !lcp || !next_of)
        goto out_nomem;
    idx->n_states = n_states;
    idx->n_tokens = n_tok;
    idx->words = words;
    idx->masks = calloc((size_t)n_states * words, sizeof *idx->masks);
    idx->pair_off = calloc((size_t)n_states + 1, sizeof *idx->pair_off);
    idx->must_end = calloc(n_states, 1);
    if (!idx->masks || !idx->pair_off || !idx->must_end)
        goto out_nomem;
    for (uint32_t i = 0; i < vocab->n_end_ids; i++)
        is_end[vocab->end_ids[i]] = 1;

    size_t n = 0;
    uint32_t len_max = 0;
    for (uint32_t t = 0; t < n_tok; t++) {
        if (vocab->lens[t] == 0 || is_end[t] || (vocab->special && vocab->special[t]))
            continue;
        order[n++] = (tok_ref){vocab->bytes[t], vocab->lens[t], t};
        if (vocab->lens[t] > len_max)
            len_max = vocab->lens[t];
    }
    qsort(order, n, sizeof *order, tok_cmp);
    for (size_t i = 0; i < n; i++) {
        uint32_t l = 0;
        if (i > 0) {
            uint32_t m = order[i].len < order[i - 1].len ? order[i].len : order[i - 1].len;
            while (l < m && order[i].b[l] == order[i - 1].b[l])
                l++;
        }
        lcp[i] = l;
    }
    stack = malloc(((size_t)len_max + 1) * sizeof *stack);
    if (!stack)
        goto out_nomem;

    uint64_t n_pairs = 0;
    for (uint32_t s = 0; s < n_states; s++) {
        uint32_t *row = idx->masks + (size_t)s * words;
        uint32_t valid = 0; /* stack[0..valid] hold the states after that many bytes */
        stack[0] = (int32_t)s;
        for (size_t i = 0; i < n; i++) {
            const tok_ref *tk = &order[i];
            uint32_t d = lcp[i] < valid ? lcp[i] : valid;
            int32_t st = stack[d];
            for (; d < tk->len; d++) {
                st = grammar_dfa_step(dfa, st, tk->b[d]);
                if (st == GRAMMAR_DEAD)
                    break;
                stack[d + 1] = st;
            }
            if (d < tk->len) {
                /* byte d is dead: so is every token sharing bytes 0..d */
                while (i + 1 < n && lcp[i + 1] > d)
                    i++;
                valid = d;
                continue;
            }
            valid = tk->len;
            row[tk->id / 32] |= 1u << (tk->id % 32);
            next_of[tk->id] = st;
        }
        bool accepting = grammar_dfa_accepting(dfa, (int32_t)s);
        if (accepting)
            for (uint32_t i = 0; i < vocab->n_end_ids; i++) {
                uint32_t t = (uint32_t)vocab->end_ids[i];
                row[t / 32] |= 1u << (t % 32);
                next_of[t] = GRAMMAR_END;
            }
        uint64_t count = 0;
        for (uint32_t w = 0; w < words; w++)
            count += (uint64_t)__builtin_popcount(row[w]);
        uint64_t total = rows_bytes + (n_pairs + count) * sizeof(pair);
        if (total > limits->index_bytes_max) {
            err = shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                                 "grammar index: the masks and (token, next) pairs need more than "
                                 "%llu bytes (grammar_limits.index_bytes_max) by state %u of %u",
                                 (unsigned long long)limits->index_bytes_max, s, n_states);
            goto out;
        }
        if (n_pairs + count > cap_pairs) {
            size_t cap = cap_pairs ? cap_pairs : 1024;
            while (cap < n_pairs + count)
                cap *= 2;
            pair *q = realloc(idx->pairs, cap * sizeof *q);
            if (!q)
                goto out_nomem;
            idx->pairs = q;
            cap_pairs = cap;
        }
        bool only_end = true;
        for (uint32_t w = 0; w < words; w++)
            for (uint32_t bits = row[w]; bits; bits &= bits - 1) {
                uint32_t t = w * 32 + (uint32_t)__builtin_ctz(bits);
                idx->pairs[n_pairs++] = (pair){t, next_of[t]};
                only_end &= is_end[t] != 0;
            }
        idx->must_end[s] = accepting && only_end;
        idx->pair_off[s + 1] = n_pairs;
    }
    if (n_pairs > 0 && n_pairs < cap_pairs) { /* hold what index_bytes_max counted, no more */
        pair *q = realloc(idx->pairs, n_pairs * sizeof *q);
        if (q)
            idx->pairs = q;
    }
    idx->bytes = rows_bytes + n_pairs * sizeof(pair);
    *out = idx;
    idx = NULL;
    err = SHOAL_OK;
    goto out;
out_nomem:
    err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "grammar index: out of memory");
out:
    grammar_index_free(idx);
    free(is_end);
    free(order);
    free(lcp);
    free(next_of);
    free(stack);
    return err;
}

void grammar_index_free(grammar_index *idx)
{
    if (!idx)
        return;
    free(idx->masks);
    free(idx->pairs);
    free(idx->pair_off);
    free(idx->must_end);
    free(idx);
}

int32_t grammar_index_start(const grammar_index *idx)
{
    (void)idx;
    return 0; /* grammar_dfa_start's */
}

uint32_t grammar_index_states(const grammar_index *idx)
{
    return idx->n_states;
}

uint32_t grammar_index_mask_words(const grammar_index *idx)
{
    return idx->words;
}

const uint32_t *grammar_index_mask(const grammar_index *idx, int32_t state)
{
    SHOAL_ASSERT(state >= 0 && (uint32_t)state < idx->n_states);
    return idx->masks + (size_t)state * idx->words;
}

int32_t grammar_index_next(const grammar_index *idx, int32_t state, uint32_t token)
{
    if (state < 0 || (uint32_t)state >= idx->n_states || token >= idx->n_tokens)
        return GRAMMAR_DEAD;
    uint32_t w = idx->masks[(size_t)state * idx->words + token / 32];
    if (!(w & (1u << (token % 32))))
        return GRAMMAR_DEAD;
    uint64_t lo = idx->pair_off[state], hi = idx->pair_off[state + 1];
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (idx->pairs[mid].token < token)
            lo = mid + 1;
        else
            hi = mid;
    }
    SHOAL_ASSERT(lo < idx->pair_off[state + 1] && idx->pairs[lo].token == token);
    return idx->pairs[lo].next;
}

uint32_t grammar_index_allowed(const grammar_index *idx, int32_t state)
{
    SHOAL_ASSERT(state >= 0 && (uint32_t)state < idx->n_states);
    return (uint32_t)(idx->pair_off[state + 1] - idx->pair_off[state]);
}

bool grammar_index_must_end(const grammar_index *idx, int32_t state)
{
    SHOAL_ASSERT(state >= 0 && (uint32_t)state < idx->n_states);
    return idx->must_end[state];
}

uint64_t grammar_index_bytes(const grammar_index *idx)
{
    return idx->bytes;
}
