/* test_grammar_schema: JSON Schemas compiled to regexes and DFAs. Strings
 * walked at random through each DFA parse as JSON and pass a validator
 * written here for the supported keywords; hand-written documents are
 * accepted or rejected as the schema says; unsupported keywords, recursion
 * and limits give errors that name the path and the keyword. */
#include <math.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_rng.h"
#include "grammar/grammar_regex.h"
#include "grammar/grammar_schema.h"
#include "tests/test.h"

#define STR_MAX 4096

/* ---- a validator of the supported keywords -------------------------------- */

static bool validate(const cJSON *v, const cJSON *s, const cJSON *root);

static size_t utf8_count(const char *p)
{
    size_t n = 0;
    for (; *p; p++)
        n += ((unsigned char)*p & 0xC0) != 0x80;
    return n;
}

static bool has_type(const cJSON *v, const char *t)
{
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "null"))
        return cJSON_IsNull(v);
    if (!strcmp(t, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(v);
    return false;
}

static bool digits(const char *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    return true;
}

static bool valid_date(const char *p)
{
    return strlen(p) >= 10 && digits(p, 4) && p[4] == '-' && digits(p + 5, 2) && p[7] == '-' &&
           digits(p + 8, 2) && atoi(p + 5) >= 1 && atoi(p + 5) <= 12 && atoi(p + 8) >= 1 &&
           atoi(p + 8) <= 31;
}

static bool valid_time(const char *p)
{
    if (strlen(p) < 9 || !digits(p, 2) || p[2] != ':' || !digits(p + 3, 2) || p[5] != ':' ||
        !digits(p + 6, 2) || atoi(p) > 23 || atoi(p + 3) > 59 || atoi(p + 6) > 59)
        return false;
    p += 8;
    if (*p == '.') {
        p++;
        if (!digits(p, 1))
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (!strcmp(p, "Z"))
        return true;
    return (p[0] == '+' || p[0] == '-') && strlen(p) == 6 && digits(p + 1, 2) && p[3] == ':' &&
           digits(p + 4, 2) && atoi(p + 1) <= 23 && atoi(p + 4) <= 59;
}

static bool valid_uuid(const char *p)
{
    if (strlen(p) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        char ch = p[i];
        bool hex = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
        if (dash ? ch != '-' : !hex)
            return false;
    }
    return true;
}

static double num(const cJSON *s, const char *k, double dflt)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    return x ? x->valuedouble : dflt;
}

static bool validate_typed(const cJSON *v, const cJSON *s, const cJSON *root)
{
    if (cJSON_IsString(v)) {
        size_t n = utf8_count(v->valuestring);
        if (n < num(s, "minLength", 0) || n > num(s, "maxLength", INFINITY))
            return false;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
        if (f && !strcmp(f->valuestring, "date") && !(valid_date(v->valuestring) && strlen(v->valuestring) == 10))
            return false;
        if (f && !strcmp(f->valuestring, "time") && !valid_time(v->valuestring))
            return false;
        if (f && !strcmp(f->valuestring, "date-time") &&
            !(valid_date(v->valuestring) && v->valuestring[10] == 'T' && valid_time(v->valuestring + 11)))
            return false;
        if (f && !strcmp(f->valuestring, "uuid") && !valid_uuid(v->valuestring))
            return false;
    }
    if (cJSON_IsNumber(v)) {
        /* a walked exponent may overflow to infinity: compare only bounds given */
        double x = v->valuedouble;
        const char *kws[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, kws[i]);
            double y = b ? b->valuedouble : 0;
            if (b && (i == 0 ? x < y : i == 1 ? x > y : i == 2 ? x <= y : x >= y))
                return false;
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        const cJSON *r, *m;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(s, "required"))
        {
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring))
                return false;
        }
        cJSON_ArrayForEach(m, v)
        {
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, m->string);
            if (ps ? !validate(m, ps, root)
                   : (cJSON_IsFalse(addl) || (cJSON_IsObject(addl) && !validate(m, addl, root))))
                return false;
        }
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if (n < num(s, "minItems", 0) || n > num(s, "maxItems", INFINITY))
            return false;
        const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int np = cJSON_GetArraySize(prefix);
        for (int i = 0; i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(v, i);
            if (i < np ? !validate(e, cJSON_GetArrayItem(prefix, i), root)
                       : (items && !validate(e, items, root)))
                return false;
        }
    }
    return true;
}

static bool validate(const cJSON *v, const cJSON *s, const cJSON *root)
{
    if (cJSON_IsTrue(s))
        return true;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        const char *r = k->valuestring;
        const char *defs = strncmp(r, "#/$defs/", 8) == 0 ? "$defs" : "definitions";
        const char *name = strrchr(r, '/') + 1;
        return validate(v, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, defs), name),
                        root);
    }
    const char *alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++) {
        if ((k = cJSON_GetObjectItemCaseSensitive(s, alts[a]))) {
            int hits = 0, n = 0;
            const cJSON *alt;
            cJSON_ArrayForEach(alt, k)
            {
                hits += validate(v, alt, root);
                n++;
            }
            return a == 2 ? hits == n : hits > 0;
        }
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(v, k, true))
        return false;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        bool in = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, k) in |= cJSON_Compare(v, e, true);
        if (!in)
            return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        bool ok = false;
        if (cJSON_IsString(k)) {
            ok = has_type(v, k->valuestring);
        } else {
            const cJSON *t;
            cJSON_ArrayForEach(t, k) ok |= has_type(v, t->valuestring);
        }
        if (!ok)
            return false;
    }
    return validate_typed(v, s, root);
}

/* ---- DFA helpers --------------------------------------------------------- */

static bool dfa_match(const grammar_dfa *dfa, const char *s)
{
    int32_t st = grammar_dfa_start(dfa);
    for (; *s; s++)
        st = grammar_dfa_step(dfa, st, (uint8_t)*s);
    return st != GRAMMAR_DEAD && grammar_dfa_accepting(dfa, st);
}

/* A string the DFA accepts, by a random walk over live transitions: stop
 * at an accepting state when a coin says so (or near the length bound). */
static bool walk_string(uint64_t *rng, const grammar_dfa *dfa, char *s, size_t *n)
{
    int32_t st = grammar_dfa_start(dfa);
    *n = 0;
    for (;;) {
        if (grammar_dfa_accepting(dfa, st) && (common_rng_next(rng) % 4 == 0 || *n > STR_MAX / 2))
            break;
        if (*n >= STR_MAX - 1)
            return false;
        uint8_t ok[256];
        int n_ok = 0;
        for (int b = 0; b < 256; b++)
            if (grammar_dfa_step(dfa, st, (uint8_t)b) != GRAMMAR_DEAD)
                ok[n_ok++] = (uint8_t)b;
        if (n_ok == 0)
            break;
        /* past half the bound, prefer the bytes that close: '"', ']', '}' */
        uint8_t b = ok[common_rng_next(rng) % (uint64_t)n_ok];
        if (*n > STR_MAX / 4)
            for (int i = 0; i < n_ok; i++)
                if (ok[i] == '"' || ok[i] == ']' || ok[i] == '}')
                    b = ok[i];
        s[(*n)++] = (char)b;
        st = grammar_dfa_step(dfa, st, b);
    }
    s[*n] = '\0';
    return grammar_dfa_accepting(dfa, st);
}

static grammar_dfa *compile_schema(const char *text, cJSON **schema_out)
{
    cJSON *schema = cJSON_Parse(text);
    SHOAL_ASSERT(schema);
    char *re = NULL;
    size_t len = 0;
    shoal_diag diag = {{0}};
    shoal_err err = grammar_schema_regex(schema, &re, &len, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s: %s", text, diag.msg);
    grammar_dfa *dfa = NULL;
    if (err == SHOAL_OK) {
        err = grammar_dfa_compile(re, len, NULL, &dfa, &diag);
        CHECK_MSG(err == SHOAL_OK, "%s: regex %s: %s", text, re, diag.msg);
    }
    free(re);
    *schema_out = schema;
    return dfa;
}

/* ---- the schemas --------------------------------------------------------- */

typedef struct schema_case {
    const char *schema;
    const char *valid[6];
    const char *invalid[8];
} schema_case;

static const schema_case cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"
     "\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0}},"
     "\"required\":[\"name\",\"age\"]}",
     {"{\"name\":\"bob\",\"age\":42}", "{\"name\": \"\\u00e9\\n\", \"age\": 0}",
      "{\"name\":\"\xe4\xb8\xad\",\"age\":7}"},
     {"{\"name\":\"bob\"}", "{\"name\":\"bob\",\"age\":-1}", "{\"name\":\"\",\"age\":1}",
      "{\"name\":\"123456789\",\"age\":1}", "{\"name\":\"b\",\"age\":1,\"x\":1}",
      "{\"name\":1,\"age\":1}", "{\"age\":1,\"name\":\"b\"}", "{\"name\":\"b\" ,\"age\":1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
     "\"c\":{\"type\":\"number\"},\"d\":{\"type\":\"string\"}},\"required\":[\"c\"],"
     "\"additionalProperties\":false}",
     {"{\"c\":1}", "{\"a\":true,\"c\":-0.5e3}", "{\"b\":null,\"c\":2,\"d\":\"x\"}",
      "{\"a\":false,\"b\":null,\"c\":1.25,\"d\":\"\"}"},
     {"{}", "{\"a\":true}", "{\"c\":1,\"a\":true}", "{\"c\":01}", "{\"c\":1,}",
      "{\"c\":1,\"e\":2}"}},
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"integer\"}}}",
     {"{}", "{\"x\":1}", "{\"y\":-2}", "{\"x\":1, \"y\":2}"},
     {"{\"y\":1,\"x\":2}", "{,}", "{\"x\":1,}", "{\"x\":1.5}"}},
    {"{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":"
     "{\"type\":\"string\",\"format\":\"uuid\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"string\",\"maxLength\":3},\"minItems\":1,\"maxItems\":3}},\"required\":[\"id\",\"tags\"]}},"
     "\"required\":[\"user\"]}",
     {"{\"user\":{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"tags\":[\"a\"]}}",
      "{\"user\": {\"id\": \"123E4567-E89B-12D3-A456-426614174000\", \"tags\": [\"a\", \"bc\", "
      "\"def\"]}}"},
     {"{\"user\":{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"tags\":[]}}",
      "{\"user\":{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"tags\":[\"a\",\"b\",\"c\","
      "\"d\"]}}",
      "{\"user\":{\"id\":\"123e4567\",\"tags\":[\"a\"]}}",
      "{\"user\":{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"tags\":[\"abcd\"]}}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}",
     {"[1,2]", "[1, 2, 3, 4]", "[0,-7,3]"},
     {"[]", "[1]", "[1,2,3,4,5]", "[1,\"a\"]", "[1 ,2]"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\"}}", {"[]", "[1.5]", "[1,2,3,4,5,6,7,8]"},
     {"[", "[,]", "[1,]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
     "\"items\":{\"type\":\"boolean\"},\"minItems\":1}",
     {"[\"a\"]", "[\"a\",1]", "[\"a\",1,true,false]"},
     {"[]", "[1]", "[\"a\",true]", "[\"a\",1,2]"}},
    {"{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1,2]}]}",
     {"\"red\"", "\"green\"", "1", "null", "{\"a\":[1,2]}"},
     {"\"blue\"", "2", "\"Red\"", "{\"a\":[1]}"}},
    {"{\"type\":\"string\",\"enum\":[\"a.b\",\"c|d\",3]}", {"\"a.b\"", "\"c|d\""},
     {"3", "\"axb\"", "\"c\""}},
    {"{\"const\":\"fixed \\\"q\\\"\"}", {"\"fixed \\\"q\\\"\""}, {"\"fixed\"", "\"fixed \"q\"\""}},
    {"{\"anyOf\":[{\"type\":\"integer\",\"maximum\":-1},{\"type\":\"string\",\"maxLength\":2},"
     "{\"type\":\"null\"}]}",
     {"-5", "\"ab\"", "null"},
     {"5", "0", "\"abc\"", "true"}},
    {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"array\",\"maxItems\":0}],\"description\":"
     "\"d\"}",
     {"true", "[]"},
     {"[1]", "null"}},
    {"{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
     "\"required\":[\"x\"]}},\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/pt\"},"
     "\"b\":{\"$ref\":\"#/$defs/pt\"}},\"required\":[\"a\"]}",
     {"{\"a\":{\"x\":1}}", "{\"a\":{\"x\":1},\"b\":{\"x\":-3}}"},
     {"{\"b\":{\"x\":1}}", "{\"a\":{}}", "{\"a\":{\"x\":\"1\"}}"}},
    {"{\"definitions\":{\"s\":{\"type\":\"string\",\"minLength\":3}},\"allOf\":[{\"$ref\":"
     "\"#/definitions/s\"}]}",
     {"\"abc\"", "\"\\\\\\\"x\""},
     {"\"ab\"", "3"}},
    {"{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
     "\"t\":{\"type\":\"string\",\"format\":\"time\"},\"dt\":{\"type\":\"string\",\"format\":"
     "\"date-time\"}},\"required\":[\"d\",\"t\",\"dt\"]}",
     {"{\"d\":\"2024-02-29\",\"t\":\"23:59:59Z\",\"dt\":\"2024-01-01T00:00:00.5+05:30\"}"},
     {"{\"d\":\"2024-13-01\",\"t\":\"23:59:59Z\",\"dt\":\"2024-01-01T00:00:00Z\"}",
      "{\"d\":\"2024-01-01\",\"t\":\"24:00:00Z\",\"dt\":\"2024-01-01T00:00:00Z\"}",
      "{\"d\":\"2024-01-01\",\"t\":\"12:00:00\",\"dt\":\"2024-01-01T00:00:00Z\"}"}},
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+-[0-9]{2}$\"}", {"\"ab-12\""},
     {"\"ab-1\"", "\"AB-12\"", "\"xab-12\"x"}},
    {"{\"type\":[\"string\",\"integer\"],\"minLength\":2,\"maxLength\":2}", {"\"ab\"", "17"},
     {"\"a\"", "1.5", "null"}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":1}}",
     {"{}", "{\"a\":1}", "{\"a\":1, \"b\":22}"},
     {"{\"a\":0}", "{\"a\":\"x\"}"}},
    {"{\"title\":\"anything\"}", {"1", "\"x\"", "{\"a\":[1,{\"b\":null}]}", "[]"}, {"{", "tru"}},
};

static void walked_strings_parse_and_validate(void)
{
    uint64_t rng = 7;
    static char s[STR_MAX];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        cJSON *schema;
        grammar_dfa *dfa = compile_schema(cases[ci].schema, &schema);
        int walked = 0, fails = 0;
        for (int i = 0; dfa && i < 400 && fails < 3; i++) {
            size_t n;
            if (!walk_string(&rng, dfa, s, &n))
                continue;
            walked++;
            cJSON *doc = cJSON_ParseWithLength(s, n);
            bool ok = doc && validate(doc, schema, schema);
            if (!ok) {
                fails++;
                fprintf(stderr, "  schema %s: walked %s (%s)\n", cases[ci].schema, s,
                        doc ? "invalid" : "no JSON");
            }
            CHECK(ok);
            cJSON_Delete(doc);
        }
        CHECK_MSG(!dfa || walked >= 40, "%s: %d walks ended", cases[ci].schema, walked);
        grammar_dfa_free(dfa);
        cJSON_Delete(schema);
    }
}

static void hand_written_documents_are_accepted_or_rejected(void)
{
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        cJSON *schema;
        grammar_dfa *dfa = compile_schema(cases[ci].schema, &schema);
        for (int k = 0; dfa && k < 6 && cases[ci].valid[k]; k++) {
            const char *d = cases[ci].valid[k];
            cJSON *doc = cJSON_Parse(d);
            CHECK_MSG(doc && validate(doc, schema, schema), "the test's own valid %s", d);
            CHECK_MSG(dfa_match(dfa, d), "%s rejects valid %s", cases[ci].schema, d);
            cJSON_Delete(doc);
        }
        for (int k = 0; dfa && k < 8 && cases[ci].invalid[k]; k++)
            CHECK_MSG(!dfa_match(dfa, cases[ci].invalid[k]), "%s accepts invalid %s",
                      cases[ci].schema, cases[ci].invalid[k]);
        grammar_dfa_free(dfa);
        cJSON_Delete(schema);
    }
}

/* ---- errors -------------------------------------------------------------- */

static void check_error(const char *text, shoal_err want, const char *f1, const char *f2)
{
    cJSON *schema = cJSON_Parse(text);
    SHOAL_ASSERT(schema);
    char *re = (char *)1;
    size_t len = 1;
    shoal_diag diag = {{0}};
    shoal_err err = grammar_schema_regex(schema, &re, &len, &diag);
    CHECK_MSG(err == want, "%s: got %d (%s), want %d", text, err, diag.msg, want);
    CHECK(re == NULL);
    CHECK_HAS(diag.msg, f1);
    if (f2)
        CHECK_HAS(diag.msg, f2);
    cJSON_Delete(schema);
}

static void unsupported_keywords_and_recursion_are_refused_by_path(void)
{
    check_error("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":3}}}",
                SHOAL_ERR_UNSUPPORTED, "schema: properties.age: 'multipleOf' is not supported", NULL);
    check_error("{\"not\":{}}", SHOAL_ERR_UNSUPPORTED, "schema: 'not' is not supported", NULL);
    check_error("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":"
                "\"integer\",\"minimum\":5}]}}",
                SHOAL_ERR_UNSUPPORTED, "schema: items.anyOf.1: 'minimum' 5", NULL);
    check_error("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":"
                "\"#/$defs/node\"}}}},\"$ref\":\"#/$defs/node\"}",
                SHOAL_ERR_UNSUPPORTED, "$defs.node.properties.next", "'$ref' \"#/$defs/node\" is recursive");
    check_error("{\"$ref\":\"#/$defs/none\"}", SHOAL_ERR_FORMAT, "'$ref' \"#/$defs/none\" names nothing",
                NULL);
    check_error("{\"$ref\":\"http://x/s.json\"}", SHOAL_ERR_UNSUPPORTED, "'$ref'", NULL);
    check_error("{\"type\":\"string\",\"format\":\"email\"}", SHOAL_ERR_UNSUPPORTED,
                "'format' \"email\" is not supported", NULL);
    check_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", SHOAL_ERR_UNSUPPORTED,
                "'pattern' is outside the regex dialect", NULL);
    check_error("{\"type\":\"string\",\"pattern\":\"a.b\"}", SHOAL_ERR_UNSUPPORTED,
                "'pattern' may match", NULL);
    check_error("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", SHOAL_ERR_UNSUPPORTED,
                "'allOf' of more than one", NULL);
    check_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
                SHOAL_ERR_UNSUPPORTED, "'required' names \"b\"", NULL);
    check_error("{\"type\":\"string\",\"maxLength\":1000}", SHOAL_ERR_LIMIT,
                "'maxLength' 1000 is over 256 (SHOAL_GRAMMAR_REPEAT_MAX)", NULL);
    check_error("{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{},\"c\":{},\"d\":{},\"e\":{},"
                "\"f\":{},\"g\":{},\"h\":{},\"i\":{}}}",
                SHOAL_ERR_LIMIT, "9 optional properties, over 8 (SHOAL_GRAMMAR_OPTIONAL_MAX)", NULL);
    check_error("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\","
                "\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":"
                "\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":"
                "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\","
                "\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":"
                "\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":"
                "{\"type\":\"array\"}}}}}}}}}}}}}}}}}",
                SHOAL_ERR_LIMIT, "SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX", NULL);
    check_error("{\"type\":\"integer\",\"minimum\":0,\"maximum\":-1}", SHOAL_ERR_FORMAT,
                "no integer lies between", NULL);
}

/* A schema whose regex passes the regex bound: 8 optional properties, each
 * value a large any-value (untyped) schema, copied once per optional one. */
static void an_oversized_regex_is_refused(void)
{
    check_error("{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{},\"c\":{},\"d\":{},\"e\":{},"
                "\"f\":{},\"g\":{},\"h\":{}}}",
                SHOAL_ERR_LIMIT, "SHOAL_GRAMMAR_REGEX_BYTES_MAX", NULL);
}

/* ---- json_object and choice --------------------------------------------- */

static void json_object_walks_are_objects_within_the_depth(void)
{
    char *re;
    size_t len;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_json_object_regex(0, &re, &len, &diag), SHOAL_ERR_INVALID);
    shoal_err err = grammar_json_object_regex(SHOAL_GRAMMAR_JSON_DEPTH, &re, &len, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s", diag.msg);
    grammar_dfa *dfa = NULL;
    err = grammar_dfa_compile(re, len, NULL, &dfa, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s", diag.msg);
    free(re);
    if (!dfa)
        return;
    CHECK(dfa_match(dfa, "{}"));
    CHECK(dfa_match(dfa, "{\"a\": [1, {\"b\":null}], \"c\":\"\\u00e9\"}"));
    CHECK(!dfa_match(dfa, "[]"));
    CHECK(!dfa_match(dfa, "{\"a\":{\"b\":{\"c\":{}}}}")); /* 4 deep */
    CHECK(!dfa_match(dfa, "{\"a\":1,}"));
    uint64_t rng = 11;
    static char s[STR_MAX];
    for (int i = 0; i < 300; i++) {
        size_t n;
        if (!walk_string(&rng, dfa, s, &n))
            continue;
        cJSON *doc = cJSON_ParseWithLength(s, n);
        CHECK_MSG(doc && cJSON_IsObject(doc), "walked %s", s);
        cJSON_Delete(doc);
    }
    grammar_dfa_free(dfa);
}

static void choice_matches_exactly_the_literals(void)
{
    const char *const choices[] = {"yes", "no", "a.b*(c)", "line\nnext", "\xc3\xa9t\xc3\xa9"};
    char *re;
    size_t len;
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(grammar_choice_regex(choices, 0, &re, &len, &diag), SHOAL_ERR_INVALID);
    shoal_err err = grammar_choice_regex(choices, 5, &re, &len, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s", diag.msg);
    grammar_dfa *dfa = NULL;
    err = grammar_dfa_compile(re, len, NULL, &dfa, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s: %s", re, diag.msg);
    free(re);
    if (!dfa)
        return;
    for (int i = 0; i < 5; i++)
        CHECK_MSG(dfa_match(dfa, choices[i]), "%s", choices[i]);
    const char *no[] = {"", "ye", "yesno", "a.b*c", "axb*(c)", "abbb(c)", "\"yes\""};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        CHECK_MSG(!dfa_match(dfa, no[i]), "%s", no[i]);
    grammar_dfa_free(dfa);
}

int main(void)
{
    TEST_RUN(walked_strings_parse_and_validate);
    TEST_RUN(hand_written_documents_are_accepted_or_rejected);
    TEST_RUN(unsupported_keywords_and_recursion_are_refused_by_path);
    TEST_RUN(an_oversized_regex_is_refused);
    TEST_RUN(json_object_walks_are_objects_within_the_depth);
    TEST_RUN(choice_matches_exactly_the_literals);
    return TEST_EXIT();
}
