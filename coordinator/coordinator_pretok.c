#include "coordinator_pretok.h"

#include "coordinator_limits.h"
#include "coordinator_utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* GPT-2's split, which a ByteLevel pre-tokenizer applies when use_regex is
 * true (its default). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Unicode White_Space, which is what Oniguruma's \s matches. */
#define WHITE_SPACE_SET "\\t-\\r\\x{85}\\p{Z}"

struct coordinator_pretok {
    bool nfc;
    pcre2_code *re; /* NULL: each piece is one word */
};

struct coordinator_pretok_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    unsigned char *out; /* normalized text */
    size_t out_cap;
    utf8proc_int32_t *cps; /* one segment, decomposed */
    size_t cps_cap;
};

/* ---- building ---- */

static const char *json_type(const cJSON *v)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static shoal_err parse_normalizer(coordinator_pretok *pt, const cJSON *v, const char *label,
                                  shoal_diag *diag)
{
    if (!v || cJSON_IsNull(v))
        return SHOAL_OK;
    const char *type = json_type(v);
    if (type && strcmp(type, "NFC") == 0) {
        pt->nfc = true;
        return SHOAL_OK;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "normalizers");
        if (!cJSON_IsArray(list))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: normalizer Sequence without a 'normalizers' array", label);
        const cJSON *e;
        cJSON_ArrayForEach(e, list)
        {
            shoal_err err = parse_normalizer(pt, e, label, diag);
            if (err != SHOAL_OK)
                return err;
        }
        return SHOAL_OK;
    }
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "%s: normalizer '%.32s' is not supported (shoal knows NFC)", label,
                          type ? type : "?");
}

/* Copies pattern into out (cap bytes) with \s and \S replaced by Unicode
 * White_Space. Returns false if it does not fit or uses \S inside [...]. */
static bool rewrite_whitespace(const char *pat, char *out, size_t cap)
{
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; pat[i]; i++) {
        const char *add = NULL;
        char two[4] = {pat[i], 0, 0, 0}; /* up to "[^]" and its NUL */
        if (pat[i] == '\\' && pat[i + 1]) {
            char c = pat[++i];
            if (c == 's')
                add = in_class ? WHITE_SPACE_SET : "[" WHITE_SPACE_SET "]";
            else if (c == 'S' && !in_class)
                add = "[^" WHITE_SPACE_SET "]";
            else if (c == 'S')
                return false;
            else
                two[1] = c;
        } else if (pat[i] == '[' && !in_class) {
            in_class = true;
            /* A ']' first in the class (after an optional '^') is literal. */
            if (pat[i + 1] == '^') {
                two[1] = pat[++i];
            }
            if (pat[i + 1] == ']')
                two[strlen(two)] = pat[++i];
        } else if (pat[i] == ']' && in_class) {
            in_class = false;
        }
        if (!add)
            add = two;
        size_t len = strlen(add);
        if (o + len >= cap)
            return false;
        memcpy(out + o, add, len);
        o += len;
    }
    out[o] = '\0';
    return true;
}

static shoal_err compile_regex(coordinator_pretok *pt, const char *pattern, const char *label,
                               shoal_diag *diag)
{
    if (strlen(pattern) > COORDINATOR_REGEX_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: split regex of %zu bytes, over the limit of %d", label,
                              strlen(pattern), COORDINATOR_REGEX_BYTES_MAX);
    char *rewritten = malloc(4 * COORDINATOR_REGEX_BYTES_MAX);
    if (!rewritten)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    if (!rewrite_whitespace(pattern, rewritten, 4 * COORDINATOR_REGEX_BYTES_MAX)) {
        free(rewritten);
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: split regex uses \\S inside a character class", label);
    }
    int code;
    PCRE2_SIZE at;
    pt->re = pcre2_compile((PCRE2_SPTR)rewritten, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                           &code, &at, NULL);
    free(rewritten);
    if (!pt->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(code, msg, sizeof msg);
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: split regex does not compile: %s (near byte %zu of the "
                              "rewritten pattern)",
                              label, (const char *)msg, (size_t)at);
    }
    /* Without JIT (an unsupported CPU), pcre2_match interprets: slower, same
     * results. */
    (void)pcre2_jit_compile(pt->re, PCRE2_JIT_COMPLETE);
    return SHOAL_OK;
}

/* A ByteLevel step: add_prefix_space must be off; returns its use_regex. */
static shoal_err parse_byte_level(const cJSON *v, const char *label, bool *use_regex,
                                  shoal_diag *diag)
{
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "add_prefix_space")))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: ByteLevel pre-tokenizer with add_prefix_space is not "
                              "supported",
                              label);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "use_regex");
    *use_regex = !cJSON_IsFalse(r);
    return SHOAL_OK;
}

static shoal_err parse_split(const cJSON *v, const char *label, const char **pattern,
                             shoal_diag *diag)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(v, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(v, "behavior");
    if (!cJSON_IsString(re))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: Split pre-tokenizer without a Regex pattern is not supported",
                              label);
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: Split behavior '%.32s' is not supported (shoal knows "
                              "Isolated)",
                              label, cJSON_IsString(behavior) ? behavior->valuestring : "?");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "invert")))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED, "%s: inverted Split is not supported",
                              label);
    *pattern = re->valuestring;
    return SHOAL_OK;
}

static shoal_err parse_pre_tokenizer(coordinator_pretok *pt, const cJSON *v, const char *label,
                                     shoal_diag *diag)
{
    shoal_err err;
    bool use_regex = false;
    const char *type = json_type(v);
    if (!v || cJSON_IsNull(v) || !type)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: no pre_tokenizer: shoal reads byte-level BPE, which has one",
                              label);
    if (strcmp(type, "ByteLevel") == 0) {
        err = parse_byte_level(v, label, &use_regex, diag);
        if (err == SHOAL_OK && use_regex)
            err = compile_regex(pt, gpt2_pattern, label, diag);
        return err;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "pretokenizers");
        int n = cJSON_GetArraySize(list);
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        if (n == 1 && json_type(a) && strcmp(json_type(a), "ByteLevel") == 0)
            return parse_pre_tokenizer(pt, a, label, diag);
        if (n == 2 && json_type(a) && strcmp(json_type(a), "Split") == 0 && json_type(b) &&
            strcmp(json_type(b), "ByteLevel") == 0) {
            const char *pattern = NULL;
            err = parse_split(a, label, &pattern, diag);
            if (err == SHOAL_OK)
                err = parse_byte_level(b, label, &use_regex, diag);
            if (err == SHOAL_OK && use_regex)
                err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                     "%s: a Split followed by a ByteLevel with its own regex is "
                                     "not supported",
                                     label);
            if (err == SHOAL_OK)
                err = compile_regex(pt, pattern, label, diag);
            return err;
        }
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer Sequence of %d steps is not supported (shoal "
                              "knows [Split, ByteLevel] and [ByteLevel])",
                              label, n);
    }
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer '%.32s' is not supported (shoal reads byte-level "
                          "BPE)",
                          label, type);
}

shoal_err coordinator_pretok_build(const cJSON *normalizer, const cJSON *pre_tokenizer,
                                   const char *label, coordinator_pretok **out, shoal_diag *diag)
{
    *out = NULL;
    coordinator_pretok *pt = calloc(1, sizeof *pt);
    if (!pt)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory", label);
    shoal_err err = parse_normalizer(pt, normalizer, label, diag);
    if (err == SHOAL_OK)
        err = parse_pre_tokenizer(pt, pre_tokenizer, label, diag);
    if (err != SHOAL_OK) {
        coordinator_pretok_free(pt);
        return err;
    }
    *out = pt;
    return SHOAL_OK;
}

void coordinator_pretok_free(coordinator_pretok *pt)
{
    if (!pt)
        return;
    pcre2_code_free(pt->re);
    free(pt);
}

bool coordinator_pretok_normalizes(const coordinator_pretok *pt)
{
    return pt->nfc;
}

shoal_err coordinator_pretok_scratch_open(const coordinator_pretok *pt,
                                          coordinator_pretok_scratch **out)
{
    coordinator_pretok_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    if (pt->re) {
        s->md = pcre2_match_data_create_from_pattern(pt->re, NULL);
        s->mctx = pcre2_match_context_create(NULL);
        /* The default JIT stack is 32 KiB on the machine stack; a private
         * one that may grow to 1 MiB keeps deep matches off it. */
        s->jit = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
        if (!s->md || !s->mctx || !s->jit) {
            coordinator_pretok_scratch_close(s);
            return SHOAL_ERR_NOMEM;
        }
        pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    }
    *out = s;
    return SHOAL_OK;
}

void coordinator_pretok_scratch_close(coordinator_pretok_scratch *s)
{
    if (!s)
        return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit);
    free(s->out);
    free(s->cps);
    free(s);
}

/* ---- NFC ---- */

/* Characters that NFC leaves alone and that never combine with what comes
 * before them (canonical combining class 0, NFC_Quick_Check=Yes, never the
 * second of a composition pair). NFC(a + b) = NFC(a) + NFC(b) when b starts
 * with one, so text is cut before them and only the pieces between that
 * hold other characters go through utf8proc. The fuzzer checks the result
 * against utf8proc_NFC of the whole text. */
bool coordinator_pretok_nfc_inert(unsigned cp)
{
    return cp < 0x300 || (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
           (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x1F000 && cp <= 0x1FAFF);
}

static bool reserve(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (*buf && need <= *cap)
        return true;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    void *p = realloc(*buf, c * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

/* Appends NFC of seg (a piece that starts with a starter) to s->out. */
static shoal_err nfc_segment(coordinator_pretok_scratch *s, const unsigned char *seg, size_t n,
                             size_t *o)
{
    const utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    utf8proc_ssize_t count;
    for (;;) {
        count = utf8proc_decompose_custom(seg, (utf8proc_ssize_t)n, s->cps,
                                          (utf8proc_ssize_t)s->cps_cap, opt, NULL, NULL);
        if (count < 0)
            return SHOAL_ERR_FORMAT;
        if ((size_t)count <= s->cps_cap)
            break;
        if (!reserve((void **)&s->cps, &s->cps_cap, (size_t)count, sizeof *s->cps))
            return SHOAL_ERR_NOMEM;
    }
    utf8proc_ssize_t bytes = utf8proc_reencode(s->cps, count, opt);
    if (bytes < 0)
        return SHOAL_ERR_FORMAT;
    if (!reserve((void **)&s->out, &s->out_cap, *o + (size_t)bytes, 1))
        return SHOAL_ERR_NOMEM;
    memcpy(s->out + *o, s->cps, (size_t)bytes);
    *o += (size_t)bytes;
    return SHOAL_OK;
}

shoal_err coordinator_pretok_normalize(const coordinator_pretok *pt, coordinator_pretok_scratch *s,
                                       const unsigned char *text, size_t n,
                                       const unsigned char **out, size_t *out_n, shoal_diag *diag)
{
    *out = text;
    *out_n = n;
    if (!pt->nfc)
        return SHOAL_OK;
    size_t o = 0, done = 0, i = 0;
    size_t last_inert = 0; /* start of the last inert character before i */
    while (i < n) {
        if (text[i] < 0x80) {
            last_inert = i++;
            continue;
        }
        coordinator_utf8_kind kind;
        unsigned cp;
        size_t len = coordinator_utf8_next(text + i, n - i, &kind, &cp);
        if (kind != COORDINATOR_UTF8_CHAR)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "invalid UTF-8 at byte %zu", i);
        if (coordinator_pretok_nfc_inert(cp)) {
            last_inert = i;
            i += len;
            continue;
        }
        /* A character NFC may change: the segment runs from the inert
         * character before it (which may compose with it) to the next
         * inert character. */
        size_t start = i > done && last_inert >= done ? last_inert : i;
        size_t end = i + len;
        while (end < n) {
            size_t l2 = coordinator_utf8_next(text + end, n - end, &kind, &cp);
            if (kind != COORDINATOR_UTF8_CHAR)
                return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "invalid UTF-8 at byte %zu", end);
            if (coordinator_pretok_nfc_inert(cp))
                break;
            end += l2;
        }
        if (!reserve((void **)&s->out, &s->out_cap, o + (start - done), 1))
            goto out_nomem;
        memcpy(s->out + o, text + done, start - done);
        o += start - done;
        shoal_err err = nfc_segment(s, text + start, end - start, &o);
        if (err == SHOAL_ERR_NOMEM)
            goto out_nomem;
        if (err != SHOAL_OK)
            return shoal_diag_set(diag, err, "NFC failed at byte %zu", start);
        done = i = end;
    }
    if (done == 0)
        return SHOAL_OK; /* nothing changed: keep pointing at text */
    if (!reserve((void **)&s->out, &s->out_cap, o + (n - done), 1))
        goto out_nomem;
    memcpy(s->out + o, text + done, n - done);
    o += n - done;
    *out = s->out;
    *out_n = o;
    return SHOAL_OK;
out_nomem:
    return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no memory to normalize %zu bytes", n);
}

/* ---- splitting ---- */

shoal_err coordinator_pretok_split(const coordinator_pretok *pt, coordinator_pretok_scratch *s,
                                   const unsigned char *text, size_t n,
                                   shoal_err (*fn)(void *ctx, const unsigned char *word,
                                                   size_t bytes),
                                   void *ctx, shoal_diag *diag)
{
    shoal_err err;
    if (n == 0)
        return SHOAL_OK;
    if (!pt->re)
        return fn(ctx, text, n);
    size_t at = 0, emitted = 0;
    while (at < n) {
        int rc = pcre2_match(pt->re, text, n, at, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                         rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT ||
                         rc == PCRE2_ERROR_NOMEMORY;
            return shoal_diag_set(diag, limit ? SHOAL_ERR_LIMIT : SHOAL_ERR_FORMAT,
                                  "split regex failed at byte %zu: %s", at, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing: step over one character. */
            coordinator_utf8_kind kind;
            at = ms + (ms < n ? coordinator_utf8_next(text + ms, n - ms, &kind, NULL) : 1);
            continue;
        }
        if (ms > emitted) {
            err = fn(ctx, text + emitted, ms - emitted);
            if (err != SHOAL_OK)
                return err;
        }
        err = fn(ctx, text + ms, me - ms);
        if (err != SHOAL_OK)
            return err;
        emitted = at = me;
    }
    return emitted < n ? fn(ctx, text + emitted, n - emitted) : SHOAL_OK;
}
