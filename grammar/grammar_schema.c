/* grammar_schema.c: a JSON Schema walked once, top down, each keyword
 * writing its piece of the regex into a growing buffer. The pieces that
 * must appear more than once (a property's value before and after the
 * first optional one, an array's items) are built into buffers of their
 * own and copied. */
#include "grammar/grammar_schema.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common_limits.h"
#include "grammar/grammar_regex.h"

/* One JSON string character (see the header): the escapes \uXXXX leave out
 * D800..DFFF, since a lone surrogate makes the text invalid. */
#define RE_CHAR                                                                                    \
    "(?:[^\"\\\\\\u0000-\\u001f]|\\\\[\"\\\\/bfnrt]|\\\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|"      \
    "[dD][0-7][0-9a-fA-F]{2}))"
#define RE_STRING "\"" RE_CHAR "*\""
#define RE_UINT "(?:0|[1-9][0-9]*)"
#define RE_INT "-?" RE_UINT
#define RE_FRAC_EXP "(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
#define RE_NUMBER RE_INT RE_FRAC_EXP
#define RE_SCALAR "(?:" RE_STRING "|" RE_NUMBER "|true|false|null)"
#define RE_COLON ":[ ]?"
#define RE_COMMA ",[ ]?"

#define RE_DATE "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
#define RE_TIME                                                                                    \
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define RE_UUID "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

#define PATH_BYTES 256

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

typedef struct ctx {
    const cJSON *root;
    shoal_diag *diag;
    sbuf *out;                /* where the schema being walked writes */
    char path[PATH_BYTES];    /* "properties.age.items" */
    size_t path_n;
    const char *refs[SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX]; /* the $refs being expanded */
    unsigned n_refs;
    unsigned depth;
} ctx;

/* ---- output --------------------------------------------------------------- */

static shoal_err put_n(ctx *c, const char *s, size_t n)
{
    sbuf *b = c->out;
    if (b->n + n > SHOAL_GRAMMAR_REGEX_BYTES_MAX)
        return shoal_diag_set(c->diag, SHOAL_ERR_LIMIT,
                              "schema: %s%sthe regex passes %u bytes (SHOAL_GRAMMAR_REGEX_BYTES_MAX)",
                              c->path, c->path_n ? ": " : "", SHOAL_GRAMMAR_REGEX_BYTES_MAX);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return shoal_diag_set(c->diag, SHOAL_ERR_NOMEM, "schema: out of memory");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return SHOAL_OK;
}

static shoal_err put(ctx *c, const char *s) { return put_n(c, s, strlen(s)); }

/* s[0..n) as literal regex text: ASCII punctuation escaped, controls as
 * escapes, everything else (UTF-8 included) as it is. */
static shoal_err put_literal(ctx *c, const char *s, size_t n)
{
    shoal_err err = SHOAL_OK;
    for (size_t i = 0; i < n && !err; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if ((ch >= 0x21 && ch <= 0x2f) || (ch >= 0x3a && ch <= 0x40) || (ch >= 0x5b && ch <= 0x60) ||
            (ch >= 0x7b && ch <= 0x7e)) {
            e[0] = '\\';
            e[1] = (char)ch;
            err = put_n(c, e, 2);
        } else if (ch == '\n') {
            err = put(c, "\\n");
        } else if (ch == '\r') {
            err = put(c, "\\r");
        } else if (ch == '\t') {
            err = put(c, "\\t");
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(e, sizeof e, "\\u%04x", ch);
            err = put(c, e);
        } else {
            err = put_n(c, s + i, 1);
        }
    }
    return err;
}

/* A quantifier for lo..hi repeats, hi < 0 for no bound; the caller has
 * checked both against SHOAL_GRAMMAR_REPEAT_MAX. */
static shoal_err put_count(ctx *c, long lo, long hi)
{
    char q[48];
    if (lo == 0 && hi < 0)
        return put(c, "*");
    if (lo == 1 && hi < 0)
        return put(c, "+");
    if (lo == 0 && hi == 1)
        return put(c, "?");
    if (lo == 1 && hi == 1)
        return SHOAL_OK;
    if (hi < 0)
        snprintf(q, sizeof q, "{%ld,}", lo);
    else if (lo == hi)
        snprintf(q, sizeof q, "{%ld}", lo);
    else
        snprintf(q, sizeof q, "{%ld,%ld}", lo, hi);
    return put(c, q);
}

/* ---- the schema path in diagnostics ---------------------------------------- */

static size_t path_push(ctx *c, const char *seg)
{
    size_t was = c->path_n;
    int w = snprintf(c->path + c->path_n, PATH_BYTES - c->path_n, "%s%s", c->path_n ? "." : "", seg);
    if (w > 0)
        c->path_n += (size_t)w < PATH_BYTES - c->path_n ? (size_t)w : PATH_BYTES - 1 - c->path_n;
    return was;
}

static size_t path_push_index(ctx *c, const char *seg, int i)
{
    char s[64];
    snprintf(s, sizeof s, "%s.%d", seg, i);
    return path_push(c, s);
}

static void path_pop(ctx *c, size_t was)
{
    c->path_n = was;
    c->path[was] = '\0';
}

#define FAIL(c, err, ...) fail((c), (err), __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static shoal_err fail(ctx *c, shoal_err err, const char *fmt,
                                                             ...)
{
    char msg[SHOAL_DIAG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return shoal_diag_set(c->diag, err, "schema: %s%s%s", c->path, c->path_n ? ": " : "", msg);
}

/* ---- keyword values ----------------------------------------------------------- */

/* A count keyword (minLength, maxItems, ...): *v stays as given when absent. */
static shoal_err get_count(ctx *c, const cJSON *s, const char *kw, long *v)
{
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!k)
        return SHOAL_OK;
    if (!cJSON_IsNumber(k) || k->valuedouble < 0 || k->valuedouble != floor(k->valuedouble))
        return FAIL(c, SHOAL_ERR_FORMAT, "'%s' is not a non-negative integer", kw);
    if (k->valuedouble > SHOAL_GRAMMAR_REPEAT_MAX)
        return FAIL(c, SHOAL_ERR_LIMIT, "'%s' %.0f is over %d (SHOAL_GRAMMAR_REPEAT_MAX)", kw,
                    k->valuedouble, SHOAL_GRAMMAR_REPEAT_MAX);
    *v = (long)k->valuedouble;
    return SHOAL_OK;
}

static bool is_annotation(const char *k)
{
    static const char *const names[] = {"title",   "description", "examples", "default", "$schema",
                                        "$id",     "$comment",    "$defs",    "definitions"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(k, names[i]) == 0)
            return true;
    return false;
}

static bool is_supported(const char *k)
{
    static const char *const names[] = {
        "type",      "enum",      "const",          "properties",       "required",
        "additionalProperties",   "items",          "prefixItems",      "minItems",
        "maxItems",  "minLength", "maxLength",      "pattern",          "format",
        "minimum",   "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf",
        "oneOf",     "allOf",     "$ref"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(k, names[i]) == 0)
            return true;
    return is_annotation(k);
}

/* The keywords that name other schemas: beside them only annotations. */
static shoal_err only_annotations_beside(ctx *c, const cJSON *s, const char *kw)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
    {
        if (strcmp(k->string, kw) != 0 && !is_annotation(k->string))
            return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'%s' beside '%s' is not supported", k->string,
                        kw);
    }
    return SHOAL_OK;
}

/* ---- the walk --------------------------------------------------------------- */

static shoal_err emit(ctx *c, const cJSON *s);

/* Builds the regex of s into *dst (its own buffer), under path segment seg. */
static shoal_err emit_into(ctx *c, const cJSON *s, const char *seg, sbuf *dst)
{
    size_t was = path_push(c, seg);
    sbuf *saved = c->out;
    c->out = dst;
    shoal_err err = emit(c, s);
    c->out = saved;
    path_pop(c, was);
    return err;
}

/* Any JSON value nesting depth brackets deep (0: the scalars). */
static shoal_err emit_any(ctx *c, unsigned depth);

static shoal_err emit_any_object(ctx *c, unsigned depth)
{
    shoal_err err = SHOAL_OK;
    for (int copy = 0; copy < 2 && !err; copy++) {
        err = put(c, copy == 0 ? "\\{(?:" : "(?:" RE_COMMA);
        if (!err)
            err = put(c, RE_STRING RE_COLON);
        if (!err)
            err = emit_any(c, depth - 1);
    }
    return err ? err : put(c, ")*)?\\}");
}

static shoal_err emit_any(ctx *c, unsigned depth)
{
    if (depth == 0)
        return put(c, RE_SCALAR);
    shoal_err err = put(c, "(?:" RE_SCALAR "|");
    if (!err)
        err = emit_any_object(c, depth);
    for (int copy = 0; copy < 2 && !err; copy++) {
        err = put(c, copy == 0 ? "|\\[(?:" : "(?:" RE_COMMA);
        if (!err)
            err = emit_any(c, depth - 1);
    }
    return err ? err : put(c, ")*)?\\])");
}

static shoal_err emit_string(ctx *c, const cJSON *s)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    long lo = 0, hi = -1;
    shoal_err err = get_count(c, s, "minLength", &lo);
    if (!err)
        err = get_count(c, s, "maxLength", &hi);
    if (err)
        return err;
    if ((fmt || pat) && (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                         cJSON_GetObjectItemCaseSensitive(s, "maxLength")))
        return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'minLength' or 'maxLength' beside '%s' is not supported",
                    fmt ? "format" : "pattern");
    if (fmt && pat)
        return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'pattern' beside 'format' is not supported");
    if (fmt) {
        if (!cJSON_IsString(fmt))
            return FAIL(c, SHOAL_ERR_FORMAT, "'format' is not a string");
        const char *f = fmt->valuestring;
        const char *re = strcmp(f, "date") == 0        ? RE_DATE
                         : strcmp(f, "time") == 0      ? RE_TIME
                         : strcmp(f, "date-time") == 0 ? RE_DATE "T" RE_TIME
                         : strcmp(f, "uuid") == 0      ? RE_UUID
                                                       : NULL;
        if (!re)
            return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'format' \"%s\" is not supported", f);
        err = put(c, "\"");
        if (!err)
            err = put(c, re);
        return err ? err : put(c, "\"");
    }
    if (pat) {
        if (!cJSON_IsString(pat))
            return FAIL(c, SHOAL_ERR_FORMAT, "'pattern' is not a string");
        const char *p = pat->valuestring;
        size_t n = strlen(p);
        if (n && p[0] == '^')
            p++, n--;
        /* a '$' ends the pattern unless an odd run of backslashes escapes it */
        if (n && p[n - 1] == '$') {
            size_t bs = 0;
            while (bs + 1 < n && p[n - 2 - bs] == '\\')
                bs++;
            if (bs % 2 == 0)
                n--;
        }
        grammar_dfa *dfa = NULL;
        shoal_diag pd = {{0}};
        if (grammar_dfa_compile(p, n, NULL, &dfa, &pd) != SHOAL_OK)
            return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'pattern' is outside the regex dialect: %s",
                        pd.msg);
        /* The pattern matches the string's characters, the regex its JSON
         * text: the two agree only where no character needs escaping. Every
         * state the DFA keeps is reachable, so one live step on such a byte
         * anywhere means some match holds it. */
        bool escapes = false;
        for (uint32_t st = 0; st < grammar_dfa_states(dfa) && !escapes; st++)
            for (int b = 0; b < 0x20 && !escapes; b++)
                escapes = grammar_dfa_step(dfa, (int32_t)st, (uint8_t)b) != GRAMMAR_DEAD;
        for (uint32_t st = 0; st < grammar_dfa_states(dfa) && !escapes; st++)
            escapes = grammar_dfa_step(dfa, (int32_t)st, '"') != GRAMMAR_DEAD ||
                      grammar_dfa_step(dfa, (int32_t)st, '\\') != GRAMMAR_DEAD;
        grammar_dfa_free(dfa);
        if (escapes)
            return FAIL(c, SHOAL_ERR_UNSUPPORTED,
                        "'pattern' may match '\"', '\\' or a control character, which JSON "
                        "escapes");
        err = put(c, "\"(?:");
        if (!err)
            err = put_n(c, p, n);
        return err ? err : put(c, ")\"");
    }
    if (hi >= 0 && hi < lo)
        return FAIL(c, SHOAL_ERR_FORMAT, "'maxLength' is below 'minLength'");
    err = put(c, "\"" RE_CHAR);
    if (!err)
        err = put_count(c, lo, hi);
    return err ? err : put(c, "\"");
}

/* The sign bounds of minimum/maximum: lo_kind 0 none, 1 ">= 0", 2 ">= 1";
 * hi_kind 0 none, 1 "<= 0", 2 "<= -1". Others are refused. */
static shoal_err sign_bounds(ctx *c, const cJSON *s, bool integer, int *lo_kind, int *hi_kind)
{
    static const char *const kws[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    *lo_kind = *hi_kind = 0;
    for (int i = 0; i < 4; i++) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(s, kws[i]);
        if (!k)
            continue;
        if (!cJSON_IsNumber(k))
            return FAIL(c, SHOAL_ERR_FORMAT, "'%s' is not a number", kws[i]);
        double v = k->valuedouble;
        int kind = 0;
        if (integer) {
            /* x >= 0, x > -1 | x >= 1, x > 0 | x <= 0, x < 1 | x <= -1, x < 0 */
            if (i == 0)
                kind = v == 0 ? 1 : v == 1 ? 2 : 0;
            else if (i == 1)
                kind = v == -1 ? 1 : v == 0 ? 2 : 0;
            else if (i == 2)
                kind = v == 0 ? 1 : v == -1 ? 2 : 0;
            else
                kind = v == 1 ? 1 : v == 0 ? 2 : 0;
        } else if (i == 0 && v == 0) {
            kind = 1;
        }
        if (kind == 0)
            return FAIL(c, SHOAL_ERR_UNSUPPORTED,
                        "'%s' %g is not supported (only bounds that fix the sign: %s)", kws[i], v,
                        integer ? "minimum 0 or 1, maximum 0 or -1" : "minimum 0");
        int *slot = i < 2 ? lo_kind : hi_kind;
        if (kind > *slot)
            *slot = kind;
    }
    if (*lo_kind && *hi_kind && !(*lo_kind == 1 && *hi_kind == 1))
        return FAIL(c, SHOAL_ERR_FORMAT, "no %s lies between 'minimum' and 'maximum'",
                    integer ? "integer" : "number");
    return SHOAL_OK;
}

static shoal_err emit_integer(ctx *c, const cJSON *s)
{
    int lo, hi;
    shoal_err err = sign_bounds(c, s, true, &lo, &hi);
    if (err)
        return err;
    if (lo == 1 && hi == 1)
        return put(c, "0");
    if (lo == 1)
        return put(c, RE_UINT);
    if (lo == 2)
        return put(c, "[1-9][0-9]*");
    if (hi == 1)
        return put(c, "(?:0|-[1-9][0-9]*)");
    if (hi == 2)
        return put(c, "-[1-9][0-9]*");
    return put(c, "(?:" RE_INT ")");
}

static shoal_err emit_number(ctx *c, const cJSON *s)
{
    int lo, hi;
    shoal_err err = sign_bounds(c, s, false, &lo, &hi);
    if (err)
        return err;
    return put(c, lo ? "(?:" RE_UINT RE_FRAC_EXP ")" : "(?:" RE_NUMBER ")");
}

static shoal_err emit_object(ctx *c, const cJSON *s)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return FAIL(c, SHOAL_ERR_FORMAT, "'properties' is not an object");
    if (req && !cJSON_IsArray(req))
        return FAIL(c, SHOAL_ERR_FORMAT, "'required' is not an array");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return FAIL(c, SHOAL_ERR_FORMAT, "'additionalProperties' is not a boolean or a schema");
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
    {
        if (!cJSON_IsString(r))
            return FAIL(c, SHOAL_ERR_FORMAT, "'required' holds a non-string");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return FAIL(c, SHOAL_ERR_UNSUPPORTED,
                        "'required' names \"%s\", which is not in 'properties' (no extra "
                        "property is generated)",
                        r->valuestring);
    }
    int n = cJSON_GetArraySize(props);
    if (n == 0) {
        if (addl && cJSON_IsObject(addl)) {
            sbuf v = {0};
            shoal_err err = emit_into(c, addl, "additionalProperties", &v);
            for (int copy = 0; copy < 2 && !err; copy++) {
                err = put(c, copy == 0 ? "\\{(?:" RE_STRING RE_COLON : "(?:" RE_COMMA RE_STRING RE_COLON);
                if (!err)
                    err = put_n(c, v.p, v.n);
            }
            free(v.p);
            return err ? err : put(c, ")*)?\\}");
        }
        if (addl && cJSON_IsFalse(addl))
            return put(c, "\\{\\}");
        if (props)
            return put(c, "\\{\\}");
        return emit_any_object(c, SHOAL_GRAMMAR_JSON_DEPTH);
    }

    /* Each property's "key":value once; then, from the end, tail[i] is
     * properties i.. after one already written (each behind a comma, the
     * optional ones in (?:...)?), and head is the same with nothing written
     * yet: from the first property on, an optional one is either written
     * (its text then tail) or skipped (the head of the rest), until the
     * first required one, which is always written. */
    sbuf *kv = calloc((size_t)n, sizeof *kv);
    bool *opt = calloc((size_t)n, sizeof *opt);
    shoal_err err = SHOAL_OK;
    if (!kv || !opt) {
        err = FAIL(c, SHOAL_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    int n_opt = 0, i = 0;
    const cJSON *p;
    size_t was = path_push(c, "properties");
    cJSON_ArrayForEach(p, props)
    {
        bool required = false;
        cJSON_ArrayForEach(r, req) required |= strcmp(r->valuestring, p->string) == 0;
        opt[i] = !required;
        n_opt += !required;
        sbuf *saved = c->out;
        c->out = &kv[i];
        err = put(c, "\"");
        if (!err)
            err = put_literal(c, p->string, strlen(p->string));
        c->out = saved;
        /* The key is a JSON string: its '"', '\' and controls escaped as
         * cJSON prints them. Keys that need that are rare; refuse them. */
        for (const char *q = p->string; *q && !err; q++)
            if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
                err = FAIL(c, SHOAL_ERR_UNSUPPORTED, "property name \"%s\" needs escaping",
                           p->string);
        if (!err) {
            c->out = &kv[i];
            err = put(c, "\"" RE_COLON);
            c->out = saved;
        }
        if (!err)
            err = emit_into(c, p, p->string, &kv[i]);
        if (err)
            break;
        i++;
    }
    path_pop(c, was);
    if (err)
        goto out_free;
    if (n_opt > SHOAL_GRAMMAR_OPTIONAL_MAX) {
        err = FAIL(c, SHOAL_ERR_LIMIT, "%d optional properties, over %d (SHOAL_GRAMMAR_OPTIONAL_MAX)",
                   n_opt, SHOAL_GRAMMAR_OPTIONAL_MAX);
        goto out_free;
    }
    err = put(c, "\\{");
    /* head: opened groups for skipped optional properties close at the end */
    int open = 0;
    for (int h = 0; h < n && !err; h++) {
        if (opt[h])
            err = put(c, "(?:");
        if (!err)
            err = put_n(c, kv[h].p, kv[h].n);
        for (int t = h + 1; t < n && !err; t++) {
            err = put(c, opt[t] ? "(?:" RE_COMMA : RE_COMMA);
            if (!err)
                err = put_n(c, kv[t].p, kv[t].n);
            if (!err && opt[t])
                err = put(c, ")?");
        }
        if (!opt[h])
            break;
        if (!err)
            err = put(c, "|");
        open++;
    }
    for (; open > 0 && !err; open--)
        err = put(c, ")");
    if (!err)
        err = put(c, "\\}");
out_free:
    for (int k = 0; kv && k < n; k++)
        free(kv[k].p);
    free(kv);
    free(opt);
    return err;
}

static shoal_err emit_array(ctx *c, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    long lo = 0, hi = -1;
    shoal_err err = get_count(c, s, "minItems", &lo);
    if (!err)
        err = get_count(c, s, "maxItems", &hi);
    if (err)
        return err;
    if (hi >= 0 && hi < lo)
        return FAIL(c, SHOAL_ERR_FORMAT, "'maxItems' is below 'minItems'");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'items' that is not a schema is not supported");
    if (prefix && !cJSON_IsArray(prefix))
        return FAIL(c, SHOAL_ERR_FORMAT, "'prefixItems' is not an array");
    /* items true (or absent without prefixItems) is any value */
    bool tail = items ? !cJSON_IsFalse(items) : !prefix;
    int m = cJSON_GetArraySize(prefix);
    if (hi >= 0 && m > hi)
        m = (int)hi;
    if (lo > m && !tail)
        return FAIL(c, SHOAL_ERR_FORMAT, "'minItems' %ld is more than 'prefixItems' allows", lo);
    sbuf item = {0};
    if (tail) {
        if (items && cJSON_IsObject(items)) {
            err = emit_into(c, items, "items", &item);
        } else {
            sbuf *saved = c->out;
            c->out = &item;
            err = emit_any(c, SHOAL_GRAMMAR_JSON_DEPTH - 1);
            c->out = saved;
        }
        if (err)
            goto out;
    }
    err = put(c, "\\[");
    /* prefix element j (0-based) is optional once j >= lo: nested groups,
     * the tail inside the innermost */
    int open = 0;
    for (int j = 0; j < m && !err; j++) {
        if (j >= lo) {
            err = put(c, "(?:");
            open++;
        }
        if (!err && j > 0)
            err = put(c, RE_COMMA);
        if (!err) {
            char seg[32];
            snprintf(seg, sizeof seg, "prefixItems.%d", j);
            size_t was = path_push(c, seg);
            err = emit(c, cJSON_GetArrayItem(prefix, j));
            path_pop(c, was);
        }
    }
    if (!err && tail && (hi < 0 || hi > m)) {
        long tlo = lo > m ? lo - m : 0, thi = hi < 0 ? -1 : hi - m;
        if (m == 0) {
            /* item (, item){tlo-1, thi-1}, all optional when tlo == 0 */
            if (tlo == 0)
                err = put(c, "(?:");
            if (!err)
                err = put_n(c, item.p, item.n);
            if (!err)
                err = put(c, "(?:" RE_COMMA);
            if (!err)
                err = put_n(c, item.p, item.n);
            if (!err)
                err = put(c, ")");
            if (!err)
                err = put_count(c, tlo ? tlo - 1 : 0, thi < 0 ? -1 : thi - 1);
            if (!err && tlo == 0)
                err = put(c, ")?");
        } else {
            err = put(c, "(?:" RE_COMMA);
            if (!err)
                err = put_n(c, item.p, item.n);
            if (!err)
                err = put(c, ")");
            if (!err)
                err = put_count(c, tlo, thi);
        }
    }
    for (; open > 0 && !err; open--)
        err = put(c, ")?");
    if (!err)
        err = put(c, "\\]");
out:
    free(item.p);
    return err;
}

static shoal_err emit_type(ctx *c, const cJSON *s, const char *t)
{
    if (strcmp(t, "string") == 0)
        return emit_string(c, s);
    if (strcmp(t, "integer") == 0)
        return emit_integer(c, s);
    if (strcmp(t, "number") == 0)
        return emit_number(c, s);
    if (strcmp(t, "boolean") == 0)
        return put(c, "(?:true|false)");
    if (strcmp(t, "null") == 0)
        return put(c, "null");
    if (strcmp(t, "object") == 0)
        return emit_object(c, s);
    if (strcmp(t, "array") == 0)
        return emit_array(c, s);
    return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'type' \"%s\" is not supported", t);
}

/* Whether value v is of JSON Schema type t. */
static bool value_has_type(const cJSON *v, const char *t)
{
    if (strcmp(t, "string") == 0)
        return cJSON_IsString(v);
    if (strcmp(t, "number") == 0)
        return cJSON_IsNumber(v);
    if (strcmp(t, "integer") == 0)
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (strcmp(t, "boolean") == 0)
        return cJSON_IsBool(v);
    if (strcmp(t, "null") == 0)
        return cJSON_IsNull(v);
    if (strcmp(t, "object") == 0)
        return cJSON_IsObject(v);
    if (strcmp(t, "array") == 0)
        return cJSON_IsArray(v);
    return false;
}

static bool value_in_types(const cJSON *v, const cJSON *type)
{
    if (!type)
        return true;
    if (cJSON_IsString(type))
        return value_has_type(v, type->valuestring);
    const cJSON *t;
    cJSON_ArrayForEach(t, type)
    {
        if (cJSON_IsString(t) && value_has_type(v, t->valuestring))
            return true;
    }
    return false;
}

static shoal_err emit_values(ctx *c, const cJSON *s, const cJSON *values, const char *kw)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    shoal_err err = put(c, "(?:");
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, values)
    {
        if (err)
            break;
        if (!value_in_types(v, type))
            continue;
        char *text = cJSON_PrintUnformatted(v);
        if (!text)
            return FAIL(c, SHOAL_ERR_NOMEM, "out of memory");
        if (n++)
            err = put(c, "|");
        if (!err)
            err = put_literal(c, text, strlen(text));
        cJSON_free(text);
    }
    if (!err && n == 0)
        return FAIL(c, SHOAL_ERR_FORMAT, "'%s' has no value of the schema's type", kw);
    return err ? err : put(c, ")");
}

static shoal_err emit_ref(ctx *c, const cJSON *s, const cJSON *ref)
{
    if (!cJSON_IsString(ref))
        return FAIL(c, SHOAL_ERR_FORMAT, "'$ref' is not a string");
    shoal_err err = only_annotations_beside(c, s, "$ref");
    if (err)
        return err;
    const char *r = ref->valuestring;
    const char *defs = NULL, *name = NULL;
    if (strncmp(r, "#/$defs/", 8) == 0)
        defs = "$defs", name = r + 8;
    else if (strncmp(r, "#/definitions/", 14) == 0)
        defs = "definitions", name = r + 14;
    if (!defs || !*name || strchr(name, '/') || strchr(name, '~'))
        return FAIL(c, SHOAL_ERR_UNSUPPORTED,
                    "'$ref' \"%s\" is not supported (only #/$defs/NAME and #/definitions/NAME)", r);
    const cJSON *target =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, defs), name);
    if (!target)
        return FAIL(c, SHOAL_ERR_FORMAT, "'$ref' \"%s\" names nothing", r);
    for (unsigned k = 0; k < c->n_refs; k++)
        if (strcmp(c->refs[k], r) == 0)
            return FAIL(c, SHOAL_ERR_UNSUPPORTED,
                        "'$ref' \"%s\" is recursive, which a regex cannot express", r);
    if (c->n_refs == SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)
        return FAIL(c, SHOAL_ERR_LIMIT, "'$ref' chains pass %d (SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)",
                    SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX);
    c->refs[c->n_refs++] = r;
    /* the target's path in diagnostics: "$defs.NAME", from the root */
    char saved_path[PATH_BYTES];
    size_t saved_n = c->path_n;
    memcpy(saved_path, c->path, PATH_BYTES);
    c->path_n = 0;
    c->path[0] = '\0';
    path_push(c, defs);
    path_push(c, name);
    err = emit(c, target);
    if (!err) {
        memcpy(c->path, saved_path, PATH_BYTES);
        c->path_n = saved_n;
    }
    c->n_refs--;
    return err;
}

static shoal_err emit_alternatives(ctx *c, const cJSON *s, const cJSON *list, const char *kw)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return FAIL(c, SHOAL_ERR_FORMAT, "'%s' is not a non-empty array", kw);
    shoal_err err = only_annotations_beside(c, s, kw);
    if (err)
        return err;
    if (strcmp(kw, "allOf") == 0 && cJSON_GetArraySize(list) != 1)
        return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'allOf' of more than one schema is not supported");
    err = put(c, "(?:");
    const cJSON *alt;
    int i = 0;
    cJSON_ArrayForEach(alt, list)
    {
        if (!err && i)
            err = put(c, "|");
        if (!err) {
            size_t was = path_push_index(c, kw, i);
            err = emit(c, alt);
            if (!err)
                path_pop(c, was);
        }
        i++;
    }
    return err ? err : put(c, ")");
}

static shoal_err emit(ctx *c, const cJSON *s)
{
    if (cJSON_IsTrue(s))
        return emit_any(c, SHOAL_GRAMMAR_JSON_DEPTH);
    if (!cJSON_IsObject(s))
        return FAIL(c, SHOAL_ERR_FORMAT, "a schema is an object or true");
    if (c->depth >= SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)
        return FAIL(c, SHOAL_ERR_LIMIT, "schemas nest past %d (SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)",
                    SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX);
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
    {
        if (!is_supported(k->string))
            return FAIL(c, SHOAL_ERR_UNSUPPORTED, "'%s' is not supported", k->string);
    }
    c->depth++;
    shoal_err err;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        err = emit_ref(c, s, v);
    else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")))
        err = emit_alternatives(c, s, v, "anyOf");
    else if ((v = cJSON_GetObjectItemCaseSensitive(s, "oneOf")))
        err = emit_alternatives(c, s, v, "oneOf");
    else if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf")))
        err = emit_alternatives(c, s, v, "allOf");
    else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        cJSON one = *v; /* a list of one value, without copying it */
        one.next = one.prev = NULL;
        one.string = NULL;
        cJSON list = {0};
        list.type = cJSON_Array;
        list.child = &one;
        one.prev = &one;
        err = emit_values(c, s, &list, "const");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        err = cJSON_IsArray(v) ? emit_values(c, s, v, "enum")
                               : FAIL(c, SHOAL_ERR_FORMAT, "'enum' is not an array");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        if (cJSON_IsString(v)) {
            err = emit_type(c, s, v->valuestring);
        } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
            err = put(c, "(?:");
            const cJSON *t;
            int i = 0;
            cJSON_ArrayForEach(t, v)
            {
                if (!err && i++)
                    err = put(c, "|");
                if (!err)
                    err = cJSON_IsString(t) ? emit_type(c, s, t->valuestring)
                                            : FAIL(c, SHOAL_ERR_FORMAT, "'type' holds a non-string");
            }
            if (!err)
                err = put(c, ")");
        } else {
            err = FAIL(c, SHOAL_ERR_FORMAT, "'type' is not a string or a non-empty list");
        }
    } else {
        /* No type: the types its keywords imply (a subset of any value,
         * which is what an untyped schema allows), else any value. */
        static const char *const obj_kw[] = {"properties", "required", "additionalProperties"};
        static const char *const arr_kw[] = {"items", "prefixItems", "minItems", "maxItems"};
        static const char *const str_kw[] = {"minLength", "maxLength", "pattern", "format"};
        static const char *const num_kw[] = {"minimum", "maximum", "exclusiveMinimum",
                                             "exclusiveMaximum"};
        const char *const *groups[4] = {obj_kw, arr_kw, str_kw, num_kw};
        size_t sizes[4] = {3, 4, 4, 4};
        const char *types[4] = {"object", "array", "string", "number"};
        int n = 0;
        err = SHOAL_OK;
        for (int g = 0; g < 4 && !err; g++) {
            bool any = false;
            for (size_t j = 0; j < sizes[g]; j++)
                any |= cJSON_GetObjectItemCaseSensitive(s, groups[g][j]) != NULL;
            if (!any)
                continue;
            err = put(c, n++ ? "|" : "(?:");
            if (!err)
                err = emit_type(c, s, types[g]);
        }
        if (!err)
            err = n ? put(c, ")") : emit_any(c, SHOAL_GRAMMAR_JSON_DEPTH);
    }
    c->depth--;
    return err;
}

/* ---- the API ------------------------------------------------------------- */

static shoal_err finish(ctx *c, shoal_err err, sbuf *b, char **out, size_t *len)
{
    if (err) {
        free(b->p);
        return err;
    }
    if (!b->p) {
        err = put(c, "");
        if (err)
            return err;
    }
    *out = b->p;
    *len = b->n;
    return SHOAL_OK;
}

shoal_err grammar_schema_regex(const cJSON *schema, char **out, size_t *len, shoal_diag *diag)
{
    sbuf b = {0};
    ctx c = {.root = schema, .diag = diag, .out = &b};
    *out = NULL;
    *len = 0;
    return finish(&c, emit(&c, schema), &b, out, len);
}

shoal_err grammar_json_object_regex(unsigned depth, char **out, size_t *len, shoal_diag *diag)
{
    sbuf b = {0};
    ctx c = {.diag = diag, .out = &b};
    *out = NULL;
    *len = 0;
    if (depth == 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "json_object: depth 0 holds no object");
    if (depth > SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "json_object: depth %u is over %d (SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX)",
                              depth, SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX);
    return finish(&c, emit_any_object(&c, depth), &b, out, len);
}

shoal_err grammar_choice_regex(const char *const *choices, size_t n, char **out, size_t *len,
                               shoal_diag *diag)
{
    sbuf b = {0};
    ctx c = {.diag = diag, .out = &b};
    *out = NULL;
    *len = 0;
    if (n == 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "choice: no choices");
    shoal_err err = SHOAL_OK;
    for (size_t i = 0; i < n && !err; i++) {
        if (i)
            err = put(&c, "|");
        if (!err)
            err = put_literal(&c, choices[i], strlen(choices[i]));
    }
    return finish(&c, err, &b, out, len);
}
