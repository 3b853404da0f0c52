#include "coordinator_tokenizer.h"

#include "common/common_assert.h"
#include "common/common_file.h"
#include "common/common_limits.h"
#include "coordinator_bpe.h"
#include "coordinator_limits.h"
#include "coordinator_pretok.h"
#include "coordinator_utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct added_token {
    char *content; /* as matched: NFC'd when normalized and the normalizer is NFC */
    size_t bytes;
    int32_t id;
    bool special;
    bool normalized;
} added_token;

/* Leftmost-longest matching of added tokens: the tokens of one set, sorted
 * by first byte and then longest first, so the first that matches at a
 * position is the longest there. */
typedef struct added_matcher {
    const added_token **tokens;
    size_t count;
    uint32_t first[257]; /* tokens starting with byte b: [first[b], first[b + 1]) */
} added_matcher;

enum { ID_PRESENT = 1, ID_SPECIAL = 2, ID_ADDED_RAW = 4 };

struct coordinator_tokenizer {
    coordinator_bpe *bpe;
    coordinator_pretok *pretok;
    added_token *added;
    size_t added_count;
    added_matcher raw;  /* normalized=false: matched before normalizing */
    added_matcher norm; /* normalized=true: matched after */
    int32_t vocab_size;
    uint32_t *dec_off; /* bytes of id i: dec_bytes[dec_off[i] .. dec_off[i + 1]) */
    unsigned char *dec_bytes;
    uint8_t *id_flags;
    int32_t *prefix_ids; /* the post-processor's tokens around the text */
    size_t prefix_count;
    int32_t *suffix_ids;
    size_t suffix_count;
};

struct coordinator_tokenizer_work {
    const coordinator_tokenizer *tok;
    coordinator_bpe_scratch *bpe;
    coordinator_pretok_scratch *pretok;
};

/* ---- loading ---- */

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

static int by_first_then_longest(const void *a, const void *b)
{
    const added_token *x = *(const added_token *const *)a, *y = *(const added_token *const *)b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    return x->bytes > y->bytes ? -1 : x->bytes < y->bytes ? 1 : 0;
}

static shoal_err build_matcher(coordinator_tokenizer *tok, added_matcher *m, bool normalized)
{
    m->tokens = malloc((tok->added_count ? tok->added_count : 1) * sizeof *m->tokens);
    if (!m->tokens)
        return SHOAL_ERR_NOMEM;
    for (size_t i = 0; i < tok->added_count; i++)
        if (tok->added[i].normalized == normalized)
            m->tokens[m->count++] = &tok->added[i];
    qsort(m->tokens, m->count, sizeof *m->tokens, by_first_then_longest);
    size_t k = 0;
    for (unsigned b = 0; b <= 256; b++) {
        while (k < m->count && (unsigned char)m->tokens[k]->content[0] < b)
            k++;
        m->first[b] = (uint32_t)k;
    }
    m->first[256] = (uint32_t)m->count;
    return SHOAL_OK;
}

static shoal_err parse_added(coordinator_tokenizer *tok, const cJSON *list, const char *label,
                             shoal_diag *diag)
{
    if (!list || cJSON_IsNull(list))
        return SHOAL_OK;
    if (!cJSON_IsArray(list))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: added_tokens is not an array", label);
    int n = cJSON_GetArraySize(list);
    if (n > COORDINATOR_ADDED_TOKENS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: %d added tokens, over the limit of %d",
                              label, n, COORDINATOR_ADDED_TOKENS_MAX);
    tok->added = calloc(n ? (size_t)n : 1, sizeof *tok->added);
    if (!tok->added)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        size_t i = tok->added_count;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        added_token *t = &tok->added[i];
        if (!json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &t->id) ||
            !cJSON_IsString(content) || content->valuestring[0] == '\0' ||
            strlen(content->valuestring) > COORDINATOR_TOKEN_BYTES_MAX)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: added_tokens[%zu] needs an id in [0, %d) and a content of "
                                  "1 to %d bytes",
                                  label, i, SHOAL_MODEL_VOCAB_MAX, COORDINATOR_TOKEN_BYTES_MAX);
        const char *s = content->valuestring;
        if (coordinator_utf8_valid_prefix((const unsigned char *)s, strlen(s)) != strlen(s))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: added_tokens[%zu] is not valid UTF-8", label, i);
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, unsupported[k])))
                return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                      "%s: added token '%.64s' sets %s, which shoal does not "
                                      "implement",
                                      label, s, unsupported[k]);
        t->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        /* HF's default for a missing 'normalized' is true unless special. */
        const cJSON *nz = cJSON_GetObjectItemCaseSensitive(e, "normalized");
        t->normalized = cJSON_IsBool(nz) ? cJSON_IsTrue(nz) : !t->special;
        if (t->normalized && coordinator_pretok_normalizes(tok->pretok))
            t->content = (char *)utf8proc_NFC((const utf8proc_uint8_t *)s);
        else
            t->content = strdup(s);
        if (!t->content)
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
        t->bytes = strlen(t->content);
        for (size_t j = 0; j < i; j++)
            if (tok->added[j].id == t->id) {
                free(t->content);
                return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                      "%s: added tokens '%.64s' and '%.64s' share id %d", label,
                                      tok->added[j].content, s, (int)t->id);
            }
        tok->added_count++;
    }
    if (build_matcher(tok, &tok->raw, false) != SHOAL_OK ||
        build_matcher(tok, &tok->norm, true) != SHOAL_OK)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    return SHOAL_OK;
}

/* TemplateProcessing for one sequence: the special tokens before and after
 * "$A". Pairs are not used by shoal. */
static shoal_err parse_template(coordinator_tokenizer *tok, const cJSON *tp, const char *label,
                                shoal_diag *diag)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(tp, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(tp, "special_tokens");
    if (!cJSON_IsArray(single))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: TemplateProcessing without a 'single' array", label);
    size_t total = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, single)
    {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (st) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
            const cJSON *entry = cJSON_IsString(name)
                                     ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring)
                                     : NULL;
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
            if (!cJSON_IsArray(ids))
                return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                      "%s: TemplateProcessing names special token '%.64s' that "
                                      "special_tokens does not list with ids",
                                      label, cJSON_IsString(name) ? name->valuestring : "?");
            total += (size_t)cJSON_GetArraySize(ids);
        }
    }
    if (total > 64)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: TemplateProcessing adds %zu tokens (over 64)", label, total);
    tok->prefix_ids = malloc((total + 1) * sizeof(int32_t));
    tok->suffix_ids = malloc((total + 1) * sizeof(int32_t));
    if (!tok->prefix_ids || !tok->suffix_ids)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    bool seen_a = false;
    cJSON_ArrayForEach(item, single)
    {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (seq) {
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(seq, "id");
            if (seen_a || !cJSON_IsString(sid) || strcmp(sid->valuestring, "A") != 0)
                return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                      "%s: TemplateProcessing 'single' must hold sequence A "
                                      "once",
                                      label);
            seen_a = true;
        } else if (st) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(specials, name->valuestring), "ids");
            const cJSON *v;
            cJSON_ArrayForEach(v, ids)
            {
                int32_t id;
                if (!json_id(v, &id))
                    return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                          "%s: TemplateProcessing token '%.64s' has a bad id",
                                          label, name->valuestring);
                if (seen_a)
                    tok->suffix_ids[tok->suffix_count++] = id;
                else
                    tok->prefix_ids[tok->prefix_count++] = id;
            }
        } else {
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: TemplateProcessing item is neither SpecialToken nor "
                                  "Sequence",
                                  label);
        }
    }
    if (!seen_a)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: TemplateProcessing 'single' lacks sequence A", label);
    return SHOAL_OK;
}

static shoal_err parse_post_processor(coordinator_tokenizer *tok, const cJSON *pp,
                                      const char *label, shoal_diag *diag)
{
    if (!pp || cJSON_IsNull(pp))
        return SHOAL_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "?";
    if (strcmp(t, "ByteLevel") == 0) /* only adjusts offsets, which shoal does not report */
        return SHOAL_OK;
    if (strcmp(t, "TemplateProcessing") == 0) {
        if (tok->prefix_ids)
            return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                  "%s: more than one TemplateProcessing", label);
        return parse_template(tok, pp, label, diag);
    }
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
        {
            shoal_err err = parse_post_processor(tok, e, label, diag);
            if (err != SHOAL_OK)
                return err;
        }
        return SHOAL_OK;
    }
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "%s: post_processor '%.32s' is not supported", label, t);
}

static shoal_err check_decoder(const cJSON *dec, const char *label, shoal_diag *diag)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "ByteLevel") == 0)
        return SHOAL_OK;
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "%s: decoder '%.32s' is not supported (shoal decodes ByteLevel)", label,
                          cJSON_IsString(type) ? type->valuestring : "none");
}

/* The decode table: for each id the bytes HF's ByteLevel decoder gives it.
 * A token whose characters all stand for bytes gives those bytes; one with
 * any other character (an added token like "<think> ") gives its UTF-8 as
 * is, which is what HF does too. */
typedef struct id_text {
    const char *str;
    uint32_t bytes;
} id_text;

static shoal_err collect_vocab(void *ctx, const char *str, size_t bytes, int32_t id)
{
    id_text *texts = ctx;
    texts[id].str = str;
    texts[id].bytes = (uint32_t)bytes;
    return SHOAL_OK;
}

static size_t token_to_bytes(const char *str, size_t n, unsigned char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        coordinator_utf8_kind kind;
        unsigned cp;
        size_t len = coordinator_utf8_next((const unsigned char *)str + i, n - i, &kind, &cp);
        int b = kind == COORDINATOR_UTF8_CHAR ? coordinator_bpe_char_byte(cp) : -1;
        if (b < 0) {
            memcpy(out, str, n);
            return n;
        }
        out[o++] = (unsigned char)b;
        i += len;
    }
    return o;
}

static shoal_err build_decode_table(coordinator_tokenizer *tok, const char *label, shoal_diag *diag)
{
    int32_t max = coordinator_bpe_max_id(tok->bpe);
    for (size_t i = 0; i < tok->added_count; i++)
        if (tok->added[i].id > max)
            max = tok->added[i].id;
    tok->vocab_size = max + 1;
    size_t n = (size_t)tok->vocab_size;
    id_text *texts = calloc(n ? n : 1, sizeof *texts);
    tok->dec_off = calloc(n + 1, sizeof *tok->dec_off);
    tok->id_flags = calloc(n ? n : 1, 1);
    if (!texts || !tok->dec_off || !tok->id_flags) {
        free(texts);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    }
    coordinator_bpe_each(tok->bpe, collect_vocab, texts);
    /* An added token's text wins over the vocabulary's for its id, as in
     * HF's decode. Added tokens keep the content as written. */
    for (size_t i = 0; i < tok->added_count; i++) {
        added_token *t = &tok->added[i];
        texts[t->id].str = t->content;
        texts[t->id].bytes = (uint32_t)t->bytes;
        tok->id_flags[t->id] |= (t->special ? ID_SPECIAL : 0) | (t->normalized ? 0 : ID_ADDED_RAW);
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += texts[i].bytes;
    tok->dec_bytes = malloc(total ? total : 1);
    if (!tok->dec_bytes) {
        free(texts);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        tok->dec_off[i] = (uint32_t)o;
        if (texts[i].str) {
            tok->id_flags[i] |= ID_PRESENT;
            o += token_to_bytes(texts[i].str, texts[i].bytes, tok->dec_bytes + o);
        }
    }
    tok->dec_off[n] = (uint32_t)o;
    free(texts);
    return SHOAL_OK;
}

shoal_err coordinator_tokenizer_parse(const char *json, size_t bytes, const char *label,
                                      coordinator_tokenizer **out, shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (bytes > COORDINATOR_TOKENIZER_FILE_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: %zu bytes, over the limit of %u", label,
                              bytes, COORDINATOR_TOKENIZER_FILE_BYTES_MAX);
    cJSON *root = cJSON_ParseWithLength(json, bytes);
    if (!root)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: not valid JSON (truncated file?) near byte %td", label,
                              cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : (ptrdiff_t)-1);
    coordinator_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
        goto out_json;
    }
    if (!cJSON_IsObject(root)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: not a JSON object", label);
        goto out_tok;
    }
    err = coordinator_bpe_build(cJSON_GetObjectItemCaseSensitive(root, "model"), label, &tok->bpe,
                                diag);
    if (err != SHOAL_OK)
        goto out_tok;
    err = coordinator_pretok_build(cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                                   cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), label,
                                   &tok->pretok, diag);
    if (err != SHOAL_OK)
        goto out_tok;
    err = check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), label, diag);
    if (err != SHOAL_OK)
        goto out_tok;
    err = parse_added(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), label, diag);
    if (err != SHOAL_OK)
        goto out_tok;
    err = parse_post_processor(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), label,
                               diag);
    if (err != SHOAL_OK)
        goto out_tok;
    err = build_decode_table(tok, label, diag);
    if (err != SHOAL_OK)
        goto out_tok;
    for (size_t i = 0; i < tok->prefix_count + tok->suffix_count; i++) {
        int32_t id =
            i < tok->prefix_count ? tok->prefix_ids[i] : tok->suffix_ids[i - tok->prefix_count];
        if (id >= tok->vocab_size || !(tok->id_flags[id] & ID_PRESENT)) {
            err =
                shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                               "%s: post_processor adds id %d, which has no token", label, (int)id);
            goto out_tok;
        }
    }
    cJSON_Delete(root);
    *out = tok;
    return SHOAL_OK;
out_tok:
    coordinator_tokenizer_close(tok);
out_json:
    cJSON_Delete(root);
    return err;
}

shoal_err coordinator_tokenizer_open(const char *path, coordinator_tokenizer **out,
                                     shoal_diag *diag)
{
    char *json;
    size_t bytes;
    *out = NULL;
    shoal_err err =
        common_file_read(path, COORDINATOR_TOKENIZER_FILE_BYTES_MAX, &json, &bytes, diag);
    if (err != SHOAL_OK)
        return err;
    err = coordinator_tokenizer_parse(json, bytes, path, out, diag);
    free(json);
    return err;
}

void coordinator_tokenizer_close(coordinator_tokenizer *tok)
{
    if (!tok)
        return;
    coordinator_bpe_free(tok->bpe);
    coordinator_pretok_free(tok->pretok);
    for (size_t i = 0; i < tok->added_count; i++)
        free(tok->added[i].content);
    free(tok->added);
    free(tok->raw.tokens);
    free(tok->norm.tokens);
    free(tok->dec_off);
    free(tok->dec_bytes);
    free(tok->id_flags);
    free(tok->prefix_ids);
    free(tok->suffix_ids);
    free(tok);
}

/* ---- lookups ---- */

int32_t coordinator_tokenizer_vocab_size(const coordinator_tokenizer *tok)
{
    return tok->vocab_size;
}

int32_t coordinator_tokenizer_token_id(const coordinator_tokenizer *tok, const char *str)
{
    for (size_t i = 0; i < tok->added_count; i++)
        if (strcmp(tok->added[i].content, str) == 0)
            return tok->added[i].id;
    return coordinator_bpe_vocab_id(tok->bpe, str, strlen(str));
}

bool coordinator_tokenizer_is_special(const coordinator_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->vocab_size && (tok->id_flags[id] & ID_SPECIAL);
}

bool coordinator_tokenizer_is_added_raw(const coordinator_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->vocab_size && (tok->id_flags[id] & ID_ADDED_RAW);
}

size_t coordinator_tokenizer_token_bytes(const coordinator_tokenizer *tok, int32_t id,
                                         const unsigned char **bytes)
{
    if (id < 0 || id >= tok->vocab_size || !(tok->id_flags[id] & ID_PRESENT)) {
        *bytes = NULL;
        return 0;
    }
    *bytes = tok->dec_bytes + tok->dec_off[id];
    return tok->dec_off[id + 1] - tok->dec_off[id];
}

/* ---- work areas ---- */

shoal_err coordinator_tokenizer_work_open(const coordinator_tokenizer *tok,
                                          coordinator_tokenizer_work **out, shoal_diag *diag)
{
    *out = NULL;
    coordinator_tokenizer_work *w = calloc(1, sizeof *w);
    if (!w || coordinator_bpe_scratch_open(&w->bpe) != SHOAL_OK ||
        coordinator_pretok_scratch_open(tok->pretok, &w->pretok) != SHOAL_OK) {
        coordinator_tokenizer_work_close(w);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no memory for a tokenizer work area");
    }
    w->tok = tok;
    *out = w;
    return SHOAL_OK;
}

void coordinator_tokenizer_work_close(coordinator_tokenizer_work *work)
{
    if (!work)
        return;
    coordinator_bpe_scratch_close(work->bpe);
    coordinator_pretok_scratch_close(work->pretok);
    free(work);
}

/* ---- encoding ---- */

typedef struct encoder {
    const coordinator_tokenizer *tok;
    coordinator_tokenizer_work *work;
    bool skip_special; /* special added tokens are text */
    int32_t *ids;
    size_t cap;
    size_t n;
    shoal_diag *diag;
} encoder;

static shoal_err over_cap(encoder *e)
{
    return shoal_diag_set(e->diag, SHOAL_ERR_LIMIT,
                          "the text is more than %zu tokens (the limit of this request)", e->cap);
}

static shoal_err put_id(encoder *e, int32_t id)
{
    if (e->n == e->cap)
        return over_cap(e);
    e->ids[e->n++] = id;
    return SHOAL_OK;
}

static shoal_err on_word(void *ctx, const unsigned char *word, size_t bytes)
{
    encoder *e = ctx;
    shoal_err err =
        coordinator_bpe_word(e->tok->bpe, e->work->bpe, word, bytes, e->ids, e->cap, &e->n);
    if (err == SHOAL_ERR_LIMIT)
        return over_cap(e);
    if (err != SHOAL_OK)
        return shoal_diag_set(e->diag, err, "no memory to merge a word of %zu bytes", bytes);
    return SHOAL_OK;
}

/* The longest added token of m at s (n bytes left), or NULL. */
static const added_token *match_at(const added_matcher *m, const unsigned char *s, size_t n,
                                   bool skip_special)
{
    for (uint32_t k = m->first[s[0]]; k < m->first[s[0] + 1]; k++) {
        const added_token *t = m->tokens[k];
        if (t->bytes <= n && memcmp(t->content, s, t->bytes) == 0 && !(skip_special && t->special))
            return t;
    }
    return NULL;
}

typedef shoal_err (*piece_fn)(encoder *e, const unsigned char *s, size_t n);

/* Cuts s at the added tokens of m, leftmost-longest: tokens become their
 * ids, the text between goes to gap. */
static shoal_err split_added(encoder *e, const added_matcher *m, const unsigned char *s, size_t n,
                             piece_fn gap)
{
    shoal_err err;
    size_t done = 0;
    if (m->count > 0) {
        for (size_t i = 0; i < n;) {
            const added_token *t = NULL;
            if (m->first[s[i]] != m->first[s[i] + 1])
                t = match_at(m, s + i, n - i, e->skip_special);
            if (!t) {
                i++;
                continue;
            }
            if (i > done && (err = gap(e, s + done, i - done)) != SHOAL_OK)
                return err;
            if ((err = put_id(e, t->id)) != SHOAL_OK)
                return err;
            done = i = i + t->bytes;
        }
    }
    return done < n ? gap(e, s + done, n - done) : SHOAL_OK;
}

static shoal_err encode_words(encoder *e, const unsigned char *s, size_t n)
{
    return coordinator_pretok_split(e->tok->pretok, e->work->pretok, s, n, on_word, e, e->diag);
}

static shoal_err encode_raw_piece(encoder *e, const unsigned char *s, size_t n)
{
    const unsigned char *norm;
    size_t norm_n;
    shoal_err err = coordinator_pretok_normalize(e->tok->pretok, e->work->pretok, s, n, &norm,
                                                 &norm_n, e->diag);
    if (err != SHOAL_OK)
        return err;
    /* norm may live in the scratch: nothing below normalizes again until
     * this piece is done. */
    return split_added(e, &e->tok->norm, norm, norm_n, encode_words);
}

shoal_err coordinator_tokenizer_encode(const coordinator_tokenizer *tok,
                                       coordinator_tokenizer_work *work, const char *text,
                                       size_t bytes, unsigned flags, int32_t *ids, size_t cap,
                                       size_t *n_ids, shoal_diag *diag)
{
    shoal_err err;
    *n_ids = 0;
    SHOAL_ASSERT(work->tok == tok);
    if (bytes > COORDINATOR_TEXT_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "the text is %zu bytes, over the limit of %u bytes", bytes,
                              COORDINATOR_TEXT_BYTES_MAX);
    const unsigned char *s = (const unsigned char *)text;
    size_t valid = coordinator_utf8_valid_prefix(s, bytes);
    if (valid != bytes)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "the text is not valid UTF-8 (byte %zu of %zu, 0x%02x)", valid, bytes,
                              s[valid]);
    encoder e = {
        .tok = tok,
        .work = work,
        .skip_special = (flags & COORDINATOR_ENCODE_SPECIAL_AS_TEXT) != 0,
        .ids = ids,
        .cap = cap,
        .diag = diag,
    };
    bool add = (flags & COORDINATOR_ENCODE_ADD_SPECIAL) != 0;
    for (size_t i = 0; add && i < tok->prefix_count; i++)
        if ((err = put_id(&e, tok->prefix_ids[i])) != SHOAL_OK)
            return err;
    err = split_added(&e, &tok->raw, s, bytes, encode_raw_piece);
    if (err != SHOAL_OK)
        return err;
    for (size_t i = 0; add && i < tok->suffix_count; i++)
        if ((err = put_id(&e, tok->suffix_ids[i])) != SHOAL_OK)
            return err;
    *n_ids = e.n;
    return SHOAL_OK;
}

/* ---- decoding ---- */

shoal_err coordinator_tokenizer_decode(const coordinator_tokenizer *tok, const int32_t *ids,
                                       size_t n, unsigned flags, char *out, size_t cap,
                                       size_t *out_bytes)
{
    coordinator_utf8_stream st = {{0}, 0};
    coordinator_utf8_sink sink = {(unsigned char *)out, cap, 0};
    bool skip = (flags & COORDINATOR_DECODE_SKIP_SPECIAL) != 0;
    for (size_t i = 0; i < n; i++) {
        if (skip && coordinator_tokenizer_is_special(tok, ids[i]))
            continue;
        const unsigned char *b;
        size_t len = coordinator_tokenizer_token_bytes(tok, ids[i], &b);
        if (len > 0)
            coordinator_utf8_stream_feed(&st, b, len, &sink);
    }
    coordinator_utf8_stream_finish(&st, &sink);
    *out_bytes = sink.len;
    if (sink.len >= cap)
        return SHOAL_ERR_LIMIT;
    out[sink.len] = '\0';
    return SHOAL_OK;
}
