#include "coordinator_bpe.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "coordinator_limits.h"
#include "coordinator_utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One vocabulary entry; its string lives in the model's arena. */
typedef struct vocab_entry {
    uint32_t off;
    uint32_t bytes;
    int32_t id;
} vocab_entry;

/* One merge, keyed by (left id << 32 | right id). */
typedef struct merge_entry {
    uint64_t key;
    uint32_t rank;
    int32_t id;
} merge_entry;

#define MERGE_EMPTY UINT64_MAX

struct coordinator_bpe {
    char *arena; /* vocabulary strings, back to back */
    size_t arena_bytes;
    vocab_entry *vocab;
    size_t vocab_count;
    uint32_t *vocab_slots; /* index + 1 into vocab, 0 = empty; power of two */
    size_t vocab_mask;
    merge_entry *merges; /* open addressing; power of two */
    size_t merge_mask;
    int32_t byte_id[256];            /* token of each byte's character, -1 if none */
    unsigned char byte_utf8[256][2]; /* each byte's character in UTF-8 */
    uint8_t byte_utf8_len[256];
    int32_t unk_id; /* -1 if no unk_token */
    int32_t max_id;
    bool ignore_merges;
    /* the most text bytes one token stands for (its characters: one a
     * byte): a word of n bytes gives at least n / longest ids */
    size_t longest;
};

/* ---- the byte-level alphabet ---- */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves; the other
 * 68 (controls, space, DEL, NBSP, soft hyphen) take U+0100 onwards, in
 * byte order. */
static bool byte_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

unsigned coordinator_bpe_byte_char(unsigned char b)
{
    if (byte_printable(b))
        return b;
    unsigned k = 0;
    for (unsigned i = 0; i < b; i++)
        k += !byte_printable(i);
    return 256 + k;
}

int coordinator_bpe_char_byte(unsigned cp)
{
    if (cp < 256)
        return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    unsigned k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!byte_printable(b) && k-- == 0)
            return (int)b;
    return -1;
}

/* ---- hashing ---- */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ h >> 29;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ x >> 31;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- vocabulary ---- */

int32_t coordinator_bpe_vocab_id(const coordinator_bpe *bpe, const char *str, size_t bytes)
{
    size_t i = hash_bytes(str, bytes) & bpe->vocab_mask;
    for (;;) {
        uint32_t slot = bpe->vocab_slots[i];
        if (slot == 0)
            return -1;
        const vocab_entry *e = &bpe->vocab[slot - 1];
        if (e->bytes == bytes && memcmp(bpe->arena + e->off, str, bytes) == 0)
            return e->id;
        i = (i + 1) & bpe->vocab_mask;
    }
}

shoal_err coordinator_bpe_each(const coordinator_bpe *bpe,
                               shoal_err (*fn)(void *ctx, const char *str, size_t bytes,
                                               int32_t id),
                               void *ctx)
{
    for (size_t i = 0; i < bpe->vocab_count; i++) {
        const vocab_entry *e = &bpe->vocab[i];
        shoal_err err = fn(ctx, bpe->arena + e->off, e->bytes, e->id);
        if (err != SHOAL_OK)
            return err;
    }
    return SHOAL_OK;
}

int32_t coordinator_bpe_max_id(const coordinator_bpe *bpe)
{
    return bpe->max_id;
}

static bool json_id(const cJSON *v, int32_t *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d >= SHOAL_MODEL_VOCAB_MAX || floor(d) != d)
        return false;
    *out = (int32_t)d;
    return true;
}

static shoal_err build_vocab(coordinator_bpe *bpe, const cJSON *vocab, const char *label,
                             shoal_diag *diag)
{
    if (!cJSON_IsObject(vocab))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: model.vocab is not an object", label);
    size_t count = 0, bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        size_t len = strlen(e->string);
        if (len == 0 || len > COORDINATOR_TOKEN_BYTES_MAX)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: model.vocab has a token of %zu bytes (allowed: 1 to %d)",
                                  label, len, COORDINATOR_TOKEN_BYTES_MAX);
        if (++count > SHOAL_MODEL_VOCAB_MAX)
            return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: model.vocab has more than %d tokens",
                                  label, SHOAL_MODEL_VOCAB_MAX);
        bytes += len;
    }
    bpe->arena = malloc(bytes ? bytes : 1);
    bpe->vocab = malloc((count ? count : 1) * sizeof *bpe->vocab);
    size_t slots = pow2_at_least(count * 2);
    bpe->vocab_slots = calloc(slots, sizeof *bpe->vocab_slots);
    if (!bpe->arena || !bpe->vocab || !bpe->vocab_slots)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory for a vocabulary of %zu", label,
                              count);
    bpe->vocab_mask = slots - 1;
    bpe->max_id = -1;
    cJSON_ArrayForEach(e, vocab)
    {
        int32_t id;
        if (!json_id(e, &id))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: model.vocab['%.64s'] is not an id in [0, %d)", label,
                                  e->string, SHOAL_MODEL_VOCAB_MAX);
        size_t len = strlen(e->string);
        size_t i = hash_bytes(e->string, len) & bpe->vocab_mask;
        while (bpe->vocab_slots[i] != 0) {
            const vocab_entry *o = &bpe->vocab[bpe->vocab_slots[i] - 1];
            if (o->bytes == len && memcmp(bpe->arena + o->off, e->string, len) == 0)
                return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: model.vocab lists '%.64s' twice",
                                      label, e->string);
            i = (i + 1) & bpe->vocab_mask;
        }
        size_t chars = 0;
        for (size_t k = 0; k < len; k++)
            chars += ((unsigned char)e->string[k] & 0xC0) != 0x80;
        if (chars > bpe->longest)
            bpe->longest = chars;
        vocab_entry *v = &bpe->vocab[bpe->vocab_count];
        v->off = (uint32_t)bpe->arena_bytes;
        v->bytes = (uint32_t)len;
        v->id = id;
        memcpy(bpe->arena + bpe->arena_bytes, e->string, len);
        bpe->arena_bytes += len;
        bpe->vocab_slots[i] = (uint32_t)++bpe->vocab_count;
        if (id > bpe->max_id)
            bpe->max_id = id;
    }
    /* The token that each byte starts as. HF drops a character that has
     * no token (without an unk_token); so do we. */
    for (unsigned b = 0; b < 256; b++) {
        unsigned char buf[4];
        size_t n = coordinator_utf8_put(coordinator_bpe_byte_char((unsigned char)b), buf);
        SHOAL_ASSERT(n <= 2); /* the alphabet ends at U+0143 */
        memcpy(bpe->byte_utf8[b], buf, n);
        bpe->byte_utf8_len[b] = (uint8_t)n;
        bpe->byte_id[b] = coordinator_bpe_vocab_id(bpe, (const char *)buf, n);
    }
    return SHOAL_OK;
}

/* ---- merges ---- */

static merge_entry *merge_slot(const coordinator_bpe *bpe, uint64_t key)
{
    size_t i = mix64(key) & bpe->merge_mask;
    while (bpe->merges[i].key != MERGE_EMPTY && bpe->merges[i].key != key)
        i = (i + 1) & bpe->merge_mask;
    return &bpe->merges[i];
}

/* Splits one merge entry into its two parts: "a b" or ["a", "b"]. */
static bool merge_parts(const cJSON *m, const char **a, size_t *na, const char **b, size_t *nb)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        if (!sp || sp == s || sp[1] == '\0' || strchr(sp + 1, ' '))
            return false;
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return true;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y))
            return false;
        *a = x->valuestring;
        *na = strlen(*a);
        *b = y->valuestring;
        *nb = strlen(*b);
        return *na > 0 && *nb > 0;
    }
    return false;
}

static shoal_err build_merges(coordinator_bpe *bpe, const cJSON *merges, const char *label,
                              shoal_diag *diag)
{
    if (!cJSON_IsArray(merges))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: model.merges is not an array", label);
    int count = cJSON_GetArraySize(merges);
    if (count > COORDINATOR_MERGES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: %d merges, over the limit of %d", label,
                              count, COORDINATOR_MERGES_MAX);
    size_t slots = pow2_at_least((size_t)count * 2);
    bpe->merges = malloc(slots * sizeof *bpe->merges);
    char *joined = malloc(2 * COORDINATOR_TOKEN_BYTES_MAX + 1);
    if (!bpe->merges || !joined) {
        free(joined);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory for %d merges", label, count);
    }
    for (size_t i = 0; i < slots; i++)
        bpe->merges[i].key = MERGE_EMPTY;
    bpe->merge_mask = slots - 1;
    shoal_err err = SHOAL_OK;
    uint32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        const char *a, *b;
        size_t na, nb;
        if (!merge_parts(m, &a, &na, &b, &nb)) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s: merge %u is neither \"a b\" nor [\"a\", \"b\"]", label, rank);
            goto out;
        }
        int32_t ia = coordinator_bpe_vocab_id(bpe, a, na);
        int32_t ib = coordinator_bpe_vocab_id(bpe, b, nb);
        int32_t ij = -1;
        if (na + nb <= 2 * COORDINATOR_TOKEN_BYTES_MAX) {
            memcpy(joined, a, na);
            memcpy(joined + na, b, nb);
            ij = coordinator_bpe_vocab_id(bpe, joined, na + nb);
        }
        if (ia < 0 || ib < 0 || ij < 0) {
            err =
                shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                               "%s: merge %u ('%.*s' + '%.*s'): %s is not in the vocabulary", label,
                               rank, (int)(na > 64 ? 64 : na), a, (int)(nb > 64 ? 64 : nb), b,
                               ia < 0   ? "the left part"
                               : ib < 0 ? "the right part"
                                        : "the merged token");
            goto out;
        }
        /* A pair listed twice keeps its later rank, as HF's map does. */
        merge_entry *e = merge_slot(bpe, (uint64_t)ia << 32 | (uint32_t)ib);
        e->key = (uint64_t)ia << 32 | (uint32_t)ib;
        e->rank = rank++;
        e->id = ij;
    }
out:
    free(joined);
    return err;
}

static bool opt_empty_string(const cJSON *v)
{
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && v->valuestring[0] == '\0');
}

shoal_err coordinator_bpe_build(const cJSON *model, const char *label, coordinator_bpe **out,
                                shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (!cJSON_IsObject(model))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: 'model' is missing or not an object",
                              label);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: model type '%.32s' is not supported (shoal reads byte-level "
                              "BPE tokenizers)",
                              label, cJSON_IsString(type) ? type->valuestring : "?");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: BPE dropout is not supported (it makes encoding random)", label);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: BPE byte_fallback (SentencePiece-style BPE) is not supported",
                              label);
    if (!opt_empty_string(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        !opt_empty_string(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: BPE continuing_subword_prefix / end_of_word_suffix are not "
                              "supported",
                              label);
    coordinator_bpe *bpe = calloc(1, sizeof *bpe);
    if (!bpe)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    bpe->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    err = build_vocab(bpe, cJSON_GetObjectItemCaseSensitive(model, "vocab"), label, diag);
    if (err != SHOAL_OK)
        goto out_free;
    err = build_merges(bpe, cJSON_GetObjectItemCaseSensitive(model, "merges"), label, diag);
    if (err != SHOAL_OK)
        goto out_free;
    bpe->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        bpe->unk_id = coordinator_bpe_vocab_id(bpe, unk->valuestring, strlen(unk->valuestring));
        if (bpe->unk_id < 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s: unk_token '%.64s' is not in the vocabulary", label,
                                 unk->valuestring);
            goto out_free;
        }
    }
    for (unsigned b = 0; b < 256; b++)
        if (bpe->byte_id[b] < 0)
            bpe->byte_id[b] = bpe->unk_id;
    *out = bpe;
    return SHOAL_OK;
out_free:
    coordinator_bpe_free(bpe);
    return err;
}

void coordinator_bpe_free(coordinator_bpe *bpe)
{
    if (!bpe)
        return;
    free(bpe->arena);
    free(bpe->vocab);
    free(bpe->vocab_slots);
    free(bpe->merges);
    free(bpe);
}

/* ---- merging one word ---- */

/* Words up to this many bytes, giving up to CACHE_IDS ids, are cached: they
 * are nearly all words of real text, and each repeats often. 64Ki slots of
 * 64 bytes: 4 MiB per work area, direct-mapped (a collision just merges the
 * word again). */
#define CACHE_WORD_BYTES 22
#define CACHE_IDS 8
#define CACHE_SLOTS (1u << 16)

typedef struct cache_slot {
    uint64_t hash;
    uint8_t bytes; /* 0 = empty */
    uint8_t n_ids;
    unsigned char word[CACHE_WORD_BYTES];
    int32_t ids[CACHE_IDS];
} cache_slot;

/* A pair that may merge: HF's order is lowest rank first, then leftmost. */
typedef struct heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
} heap_item;

struct coordinator_bpe_scratch {
    size_t cap; /* symbols the arrays hold */
    int32_t *sym;
    int32_t *prev;
    int32_t *next;
    heap_item *heap;
    size_t heap_cap;
    cache_slot *cache;
};

shoal_err coordinator_bpe_scratch_open(coordinator_bpe_scratch **out)
{
    coordinator_bpe_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    s->cache = calloc(CACHE_SLOTS, sizeof *s->cache);
    if (!s->cache) {
        free(s);
        return SHOAL_ERR_NOMEM;
    }
    *out = s;
    return SHOAL_OK;
}

void coordinator_bpe_scratch_close(coordinator_bpe_scratch *s)
{
    if (!s)
        return;
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s->cache);
    free(s);
}

static shoal_err scratch_reserve(coordinator_bpe_scratch *s, size_t n)
{
    if (n <= s->cap)
        return SHOAL_OK;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < n)
        cap *= 2;
    int32_t *sym = realloc(s->sym, cap * sizeof *sym);
    if (sym)
        s->sym = sym;
    int32_t *prev = realloc(s->prev, cap * sizeof *prev);
    if (prev)
        s->prev = prev;
    int32_t *next = realloc(s->next, cap * sizeof *next);
    if (next)
        s->next = next;
    if (!sym || !prev || !next)
        return SHOAL_ERR_NOMEM;
    s->cap = cap;
    return SHOAL_OK;
}

static bool heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static shoal_err heap_push(coordinator_bpe_scratch *s, size_t *len, heap_item it)
{
    if (*len == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
        heap_item *h = realloc(s->heap, cap * sizeof *h);
        if (!h)
            return SHOAL_ERR_NOMEM;
        s->heap = h;
        s->heap_cap = cap;
    }
    heap_item *h = s->heap;
    size_t i = (*len)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
    return SHOAL_OK;
}

static heap_item heap_pop(coordinator_bpe_scratch *s, size_t *len)
{
    heap_item *h = s->heap;
    heap_item top = h[0];
    heap_item last = h[--*len];
    size_t n = *len, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0)
        h[i] = last;
    return top;
}

static const merge_entry *merge_find(const coordinator_bpe *bpe, int32_t a, int32_t b)
{
    const merge_entry *e = merge_slot(bpe, (uint64_t)a << 32 | (uint32_t)b);
    return e->key == MERGE_EMPTY ? NULL : e;
}

static shoal_err push_pair(const coordinator_bpe *bpe, coordinator_bpe_scratch *s, size_t *heap_len,
                           int32_t pos)
{
    int32_t r = s->next[pos];
    if (r < 0)
        return SHOAL_OK;
    const merge_entry *m = merge_find(bpe, s->sym[pos], s->sym[r]);
    if (!m)
        return SHOAL_OK;
    return heap_push(s, heap_len, (heap_item){m->rank, (uint32_t)pos, m->id});
}

/* Runs the merges over the word's byte tokens; leaves the symbols linked
 * from index 0 in s->sym/s->next and returns how many there are. */
static shoal_err merge_word(const coordinator_bpe *bpe, coordinator_bpe_scratch *s,
                            const unsigned char *word, size_t bytes, size_t *count)
{
    shoal_err err = scratch_reserve(s, bytes);
    if (err != SHOAL_OK)
        return err;
    /* Bytes without a token (and no unk) are dropped, as HF drops them. */
    size_t n = 0;
    for (size_t i = 0; i < bytes; i++) {
        int32_t id = bpe->byte_id[word[i]];
        if (id < 0)
            continue;
        s->sym[n] = id;
        s->prev[n] = (int32_t)n - 1;
        s->next[n] = (int32_t)n + 1;
        n++;
    }
    if (n == 0) {
        *count = 0;
        return SHOAL_OK;
    }
    s->next[n - 1] = -1;
    size_t heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        err = push_pair(bpe, s, &heap_len, (int32_t)i);
        if (err != SHOAL_OK)
            return err;
    }
    size_t live = n;
    while (heap_len > 0) {
        heap_item top = heap_pop(s, &heap_len);
        int32_t pos = (int32_t)top.pos;
        int32_t r = s->next[pos];
        /* Stale entries: the left symbol was merged away (its prev link is
         * cut to -2), it has no right neighbour any more, or the pair at
         * pos is no longer the one this entry was made for. */
        if (s->prev[pos] == -2 || r < 0)
            continue;
        const merge_entry *m = merge_find(bpe, s->sym[pos], s->sym[r]);
        if (!m || m->id != top.id)
            continue;
        s->sym[pos] = top.id;
        s->next[pos] = s->next[r];
        if (s->next[r] >= 0)
            s->prev[s->next[r]] = pos;
        s->prev[r] = -2;
        live--;
        if (s->prev[pos] >= 0) {
            err = push_pair(bpe, s, &heap_len, s->prev[pos]);
            if (err != SHOAL_OK)
                return err;
        }
        err = push_pair(bpe, s, &heap_len, pos);
        if (err != SHOAL_OK)
            return err;
    }
    *count = live;
    return SHOAL_OK;
}

/* ignore_merges: the word's own token, if the vocabulary has it. */
static int32_t whole_word_id(const coordinator_bpe *bpe, const unsigned char *word, size_t bytes)
{
    unsigned char buf[2 * COORDINATOR_TOKEN_BYTES_MAX];
    if (bytes > COORDINATOR_TOKEN_BYTES_MAX)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < bytes; i++) {
        buf[n] = bpe->byte_utf8[word[i]][0];
        buf[n + 1] = bpe->byte_utf8[word[i]][1];
        n += bpe->byte_utf8_len[word[i]];
    }
    return coordinator_bpe_vocab_id(bpe, (const char *)buf, n);
}

shoal_err coordinator_bpe_word(const coordinator_bpe *bpe, coordinator_bpe_scratch *s,
                               const unsigned char *word, size_t bytes, int32_t *ids, size_t cap,
                               size_t *n)
{
    SHOAL_ASSERT(bytes > 0);
    cache_slot *slot = NULL;
    uint64_t h = 0;
    if (bytes <= CACHE_WORD_BYTES) {
        h = hash_bytes(word, bytes);
        slot = &s->cache[h & (CACHE_SLOTS - 1)];
        if (slot->bytes == bytes && slot->hash == h && memcmp(slot->word, word, bytes) == 0) {
            if (cap - *n < slot->n_ids)
                return SHOAL_ERR_LIMIT;
            memcpy(ids + *n, slot->ids, slot->n_ids * sizeof *ids);
            *n += slot->n_ids;
            return SHOAL_OK;
        }
    }
    if (bpe->ignore_merges) {
        int32_t id = whole_word_id(bpe, word, bytes);
        if (id >= 0) {
            if (cap - *n < 1)
                return SHOAL_ERR_LIMIT;
            ids[(*n)++] = id;
            if (slot) {
                slot->hash = h;
                slot->bytes = (uint8_t)bytes;
                slot->n_ids = 1;
                memcpy(slot->word, word, bytes);
                slot->ids[0] = id;
            }
            return SHOAL_OK;
        }
    }
    /* a word whose fewest possible ids do not fit is refused before its
     * merge, which for a word of megabytes takes seconds */
    size_t longest = bpe->longest ? bpe->longest : 1;
    if ((bytes + longest - 1) / longest > cap - *n)
        return SHOAL_ERR_LIMIT;
    size_t count;
    shoal_err err = merge_word(bpe, s, word, bytes, &count);
    if (err != SHOAL_OK)
        return err;
    if (cap - *n < count)
        return SHOAL_ERR_LIMIT;
    size_t k = *n;
    for (int32_t i = count ? 0 : -1; i >= 0; i = s->next[i])
        ids[k++] = s->sym[i];
    SHOAL_ASSERT(k - *n == count);
    if (slot && count <= CACHE_IDS) {
        slot->hash = h;
        slot->bytes = (uint8_t)bytes;
        slot->n_ids = (uint8_t)count;
        memcpy(slot->word, word, bytes);
        memcpy(slot->ids, ids + *n, count * sizeof *ids);
    }
    *n = k;
    return SHOAL_OK;
}
