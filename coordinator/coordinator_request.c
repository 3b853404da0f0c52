#include "coordinator_request.h"

#include "coordinator_utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Values a body may hold beyond the ids of a longest token-id prompt: a
 * cJSON value costs about 64 bytes, so a body of small values ("[1,1,..."
 * of 32 MiB) would cost 40 times its size; counted before parsing. */
#define JSON_VALUES_EXTRA 65536

void coordinator_api_error_set(coordinator_api_error *err, int status, const char *type,
                               const char *param, const char *fmt, ...)
{
    err->status = status;
    err->type = type;
    err->code = NULL;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* A 400 for field `param`; returns SHOAL_ERR_INVALID. */
static shoal_err bad(coordinator_api_error *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static shoal_err bad(coordinator_api_error *err, const char *param, const char *fmt, ...)
{
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = NULL;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return SHOAL_ERR_INVALID;
}

static shoal_err nomem(coordinator_api_error *err)
{
    coordinator_api_error_set(err, 500, "server_error", NULL, "out of memory");
    return SHOAL_ERR_NOMEM;
}

static const char *type_name(const cJSON *it)
{
    if (cJSON_IsString(it))
        return "a string";
    if (cJSON_IsNumber(it))
        return "a number";
    if (cJSON_IsBool(it))
        return "a boolean";
    if (cJSON_IsArray(it))
        return "an array";
    if (cJSON_IsObject(it))
        return "an object";
    return "null";
}

/* ---- the body before parsing ---- */

/* Decimal digits at s[i ..], within n. */
static size_t digits_at(const char *s, size_t n, size_t i)
{
    size_t j = i;
    while (j < n && s[j] >= '0' && s[j] <= '9')
        j++;
    return j - i;
}

/* Whether the n bytes at s (a run of [0-9+-.eE]) are one number by RFC
 * 8259's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. cJSON
 * reads numbers by strtod, which also takes a leading zero (01) and a
 * bare point (1., 1.e5); Python's json (vLLM) refuses both. */
static bool json_number_valid(const char *s, size_t n)
{
    size_t i = s[0] == '-', d = digits_at(s, n, i);
    if (d == 0 || (d > 1 && s[i] == '0')) /* an integer part, no leading zero */
        return false;
    i += d;
    if (i < n && s[i] == '.') {
        if ((d = digits_at(s, n, ++i)) == 0)
            return false;
        i += d;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i += i + 1 < n && (s[i + 1] == '+' || s[i + 1] == '-') ? 2 : 1;
        if ((d = digits_at(s, n, i)) == 0)
            return false;
        i += d;
    }
    return i == n;
}

/* Checks nesting depth, counts values outside strings, checks numbers
 * against JSON's grammar and finds NUL characters, in one pass over UTF-8
 * that is already known valid. Other malformed JSON is left to cJSON. A
 * NUL is refused rather than cut at: cJSON's strings end at one, so
 * "a\u0000b" would silently become "a". */
static shoal_err prescan(const char *body, size_t bytes, size_t values_max,
                         coordinator_api_error *err)
{
    int depth = 0;
    size_t values = 1;
    bool in_string = false;
    for (size_t i = 0; i < bytes; i++) {
        char c = body[i];
        if (c == '\0' ||
            (in_string && c == '\\' && bytes - i >= 6 && memcmp(body + i + 1, "u0000", 5) == 0))
            return bad(err, NULL,
                       "the request body holds a NUL character (U+0000, at byte %zu), which "
                       "shoal does not take in text; remove it",
                       i);
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
            continue;
        }
        switch (c) {
        case '"':
            in_string = true;
            break;
        case '[':
        case '{':
            if (++depth > COORDINATOR_JSON_DEPTH_MAX)
                return bad(err, NULL,
                           "the request body nests arrays and objects deeper than %d levels",
                           COORDINATOR_JSON_DEPTH_MAX);
            values++;
            break;
        case ']':
        case '}':
            depth--;
            break;
        case ',':
            if (++values > values_max)
                return bad(err, NULL,
                           "the request body holds more than %zu JSON values (the context is "
                           "shorter than that)",
                           values_max);
            break;
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                size_t n = 0; /* the body need not end in a NUL: no strspn */
                while (i + n < bytes && memchr("0123456789+-.eE", body[i + n], 15))
                    n++;
                if (!json_number_valid(body + i, n))
                    return bad(err, NULL,
                               "the request body is not valid JSON: '%.*s' (at byte %zu) is "
                               "not a JSON number (no leading zeros, a digit after the point)",
                               (int)(n < 32 ? n : 32), body + i, i);
                i += n - 1;
            }
            break;
        }
    }
    return SHOAL_OK;
}

/* ---- fields ---- */

static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static shoal_err get_bool(const cJSON *obj, const char *name, bool *out, coordinator_api_error *err)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return SHOAL_OK;
    if (!cJSON_IsBool(it))
        return bad(err, name, "'%s' must be a boolean, not %s", name, type_name(it));
    *out = cJSON_IsTrue(it);
    return SHOAL_OK;
}

/* An integer in [lo, hi]; JSON numbers are doubles, so 3.0 counts as 3. */
static shoal_err get_int(const cJSON *obj, const char *name, long long lo, long long hi,
                         bool *given, long long *out, coordinator_api_error *err)
{
    const cJSON *it = field(obj, name);
    if (given)
        *given = it != NULL;
    if (!it)
        return SHOAL_OK;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it))
        return bad(err, name, "'%s' must be an integer, not %s", name, type_name(it));
    if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi)
        return bad(err, name, "'%s' must be an integer from %lld to %lld, not %.17g", name, lo, hi,
                   v);
    *out = (long long)v;
    return SHOAL_OK;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static shoal_err get_float(const cJSON *obj, const char *name, double lo, bool lo_open, double hi,
                           float *out, coordinator_api_error *err)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return SHOAL_OK;
    if (!cJSON_IsNumber(it))
        return bad(err, name, "'%s' must be a number, not %s", name, type_name(it));
    double v = it->valuedouble;
    /* the bounds hold for the float the worker gets: 1e-300 is > 0 but
     * becomes 0, and 1e39 becomes infinite */
    float f = (float)v;
    bool in = isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    bool f_in = isfinite(f) && (lo_open ? f > (float)lo : f >= (float)lo) && f <= (float)hi;
    if (in && !f_in && isinf(hi))
        return bad(err, name,
                   "'%s' is %.17g, which a 32-bit float makes %g: it must be a finite number "
                   "%s %g",
                   name, v, (double)f, lo_open ? ">" : ">=", lo);
    if (in && !f_in)
        return bad(err, name,
                   "'%s' is %.17g, which a 32-bit float makes %g: it must be in %s%g, %g]", name,
                   v, (double)f, lo_open ? "(" : "[", lo, hi);
    if (!in) {
        if (isinf(hi))
            return bad(err, name, "'%s' must be a finite number %s %g, not %.17g", name,
                       lo_open ? ">" : ">=", lo, v);
        return bad(err, name, "'%s' must be a number in %s%g, %g], not %.17g", name,
                   lo_open ? "(" : "[", lo, hi, v);
    }
    *out = f;
    return SHOAL_OK;
}

/* A string field of 1..max bytes; *out stays NULL when absent. */
static shoal_err get_string(const cJSON *obj, const char *name, size_t max, const char **out,
                            size_t *bytes, coordinator_api_error *err)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return SHOAL_OK;
    if (!cJSON_IsString(it))
        return bad(err, name, "'%s' must be a string, not %s", name, type_name(it));
    size_t n = strlen(it->valuestring);
    if (max && n > max)
        return bad(err, name, "'%s' is %zu bytes long, over the limit of %zu", name, n, max);
    *out = it->valuestring;
    if (bytes)
        *bytes = n;
    return SHOAL_OK;
}

/* A JSON array of token ids into a new array; count bounded first. */
static shoal_err get_ids(const cJSON *arr, const char *name, int max_count, int vocab,
                         int32_t **out, int *count, coordinator_api_error *err)
{
    int n = cJSON_GetArraySize(arr);
    if (n > max_count)
        return bad(err, name, "'%s' has %d token ids, more than the context of %d tokens", name, n,
                   max_count);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids)
        return nomem(err);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < 0 || v >= vocab) {
            free(ids);
            if (!cJSON_IsNumber(it))
                return bad(err, name, "'%s'[%d] must be a token id, not %s", name, i,
                           type_name(it));
            return bad(err, name, "'%s'[%d] = %.17g is not a token id (0 to %d)", name, i, v,
                       vocab - 1);
        }
        ids[i++] = (int32_t)v;
    }
    *out = ids;
    *count = n;
    return SHOAL_OK;
}

/* ---- messages ---- */

/* Joins the text parts of a content array with "\n" (as vLLM does) into a
 * string node that replaces the array in the tree, which owns it. */
static shoal_err join_parts(cJSON *msg, cJSON *parts, size_t index, const char **out,
                            coordinator_api_error *err)
{
    char param[64];
    size_t total = 0;
    int count = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, parts)
    {
        snprintf(param, sizeof param, "messages[%zu].content[%d]", index, count);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part))
            return bad(err, param, "'%s' must be an object, not %s", param, type_name(part));
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0)
            return bad(err, param, "'%s': only parts of type \"text\" are supported", param);
        if (!cJSON_IsString(text))
            return bad(err, param, "'%s'.text must be a string", param);
        total += strlen(text->valuestring) + 1;
        count++;
    }
    char *joined = malloc(total + 1);
    if (!joined)
        return nomem(err);
    size_t at = 0;
    cJSON_ArrayForEach(part, parts)
    {
        const char *s = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (at)
            joined[at++] = '\n';
        size_t n = strlen(s);
        memcpy(joined + at, s, n);
        at += n;
    }
    joined[at] = '\0';
    cJSON *node = cJSON_CreateString(joined);
    free(joined);
    if (!node || !cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", node)) {
        cJSON_Delete(node);
        return nomem(err);
    }
    *out = node->valuestring;
    return SHOAL_OK;
}

/* A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-]. */
static bool tool_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > COORDINATOR_TOOL_NAME_CHARS_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* One message's tool_calls (assistant turns) and tool_call_id (tool
 * turns). Each call's arguments, JSON text in a string, is parsed and
 * rendered from the parsed value, as vLLM does (it json.loads them before
 * the template runs), so the model sees what it would have written; text
 * that is not JSON is a 400, as there. An empty string is {}. */
static shoal_err parse_message_tools(const cJSON *msg, size_t index, coordinator_chat_message *m,
                                     coordinator_request *r, coordinator_api_error *err)
{
    char param[64];
    const cJSON *calls = field(msg, "tool_calls");
    snprintf(param, sizeof param, "messages[%zu].tool_calls", index);
    if (calls && cJSON_GetArraySize(calls) > 0) {
        if (strcmp(m->role, "assistant") != 0)
            return bad(err, param, "'%s': only assistant messages make tool calls", param);
        m->tool_calls = &r->calls_[r->call_count_];
        const cJSON *call;
        int j = 0;
        cJSON_ArrayForEach(call, calls)
        {
            coordinator_chat_tool_call *tc = &r->calls_[r->call_count_];
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%d]", index, j);
            if (!cJSON_IsObject(call))
                return bad(err, param, "'%s' must be an object, not %s", param, type_name(call));
            const cJSON *id = field(call, "id"), *type = field(call, "type");
            const cJSON *fn = field(call, "function");
            if (id && !cJSON_IsString(id))
                return bad(err, param, "'%s.id' must be a string, not %s", param, type_name(id));
            if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0))
                return bad(err, param, "'%s.type' must be \"function\"", param);
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%d].function", index, j);
            if (!cJSON_IsObject(fn))
                return bad(err, param, "'%s' must be an object, not %s", param,
                           fn ? type_name(fn) : "missing");
            const cJSON *name = field(fn, "name"), *args = field(fn, "arguments");
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%d].function.name", index, j);
            if (!cJSON_IsString(name) || name->valuestring[0] == '\0')
                return bad(err, param, "'%s' must be a non-empty string", param);
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%d].function.arguments", index,
                     j);
            if (!cJSON_IsString(args))
                return bad(err, param, "'%s' must be a string of JSON, not %s", param,
                           args ? type_name(args) : "missing");
            const char *text = args->valuestring;
            size_t n = strlen(text);
            cJSON *value = NULL;
            if (n == 0) {
                value = cJSON_CreateObject();
                if (!value)
                    return nomem(err);
            } else {
                const char *end = NULL;
                value = cJSON_ParseWithLengthOpts(text, n, &end, false);
                while (value && end < text + n &&
                       (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
                    end++;
                if (!value || end != text + n) {
                    cJSON_Delete(value);
                    return bad(err, param, "'%s' is not valid JSON: %.80s", param, text);
                }
            }
            r->call_args_[r->call_count_] = value;
            *tc = (coordinator_chat_tool_call){.id = id ? id->valuestring : NULL,
                                               .name = name->valuestring,
                                               .arguments = text,
                                               .arguments_value = value};
            r->call_count_++;
            m->tool_call_count++;
            j++;
        }
    }
    const cJSON *call_id = field(msg, "tool_call_id");
    snprintf(param, sizeof param, "messages[%zu].tool_call_id", index);
    if (call_id) {
        if (!cJSON_IsString(call_id))
            return bad(err, param, "'%s' must be a string, not %s", param, type_name(call_id));
        m->tool_call_id = call_id->valuestring;
    }
    return SHOAL_OK;
}

static shoal_err parse_messages(cJSON *arr, coordinator_request *r, coordinator_api_error *err)
{
    if (!cJSON_IsArray(arr))
        return bad(err, "messages", "'messages' must be an array, not %s", type_name(arr));
    int n = cJSON_GetArraySize(arr);
    if (n == 0)
        return bad(err, "messages", "'messages' must hold at least one message");
    if (n > COORDINATOR_CHAT_MESSAGES_MAX)
        return bad(err, "messages", "'messages' holds %d messages, over the limit of %d", n,
                   COORDINATOR_CHAT_MESSAGES_MAX);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages)
        return nomem(err);
    /* Every message's tool calls go in one array, counted first. */
    size_t calls = 0, at = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        const cJSON *tc = cJSON_IsObject(it) ? field(it, "tool_calls") : NULL;
        if (!tc) {
            at++;
            continue;
        }
        char param[64];
        snprintf(param, sizeof param, "messages[%zu].tool_calls", at);
        if (!cJSON_IsArray(tc))
            return bad(err, param, "'%s' must be an array, not %s", param, type_name(tc));
        int k = cJSON_GetArraySize(tc);
        if (k > COORDINATOR_TOOL_CALLS_MAX)
            return bad(err, param, "'%s' holds %d tool calls, over the limit of %d", param, k,
                       COORDINATOR_TOOL_CALLS_MAX);
        calls += (size_t)k;
        at++;
    }
    if (calls) {
        r->calls_ = calloc(calls, sizeof *r->calls_);
        r->call_args_ = calloc(calls, sizeof *r->call_args_);
        if (!r->calls_ || !r->call_args_)
            return nomem(err);
    }
    r->message_count = (size_t)n;
    size_t i = 0;
    cJSON *msg;
    cJSON_ArrayForEach(msg, arr)
    {
        char param[64];
        coordinator_chat_message *m = &r->messages[i];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!cJSON_IsObject(msg))
            return bad(err, param, "'%s' must be an object, not %s", param, type_name(msg));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!cJSON_IsString(role))
            return bad(err, param, "'%s' must be a string", param);
        /* OpenAI's "developer" messages are its newer name for system ones. */
        m->role = strcmp(role->valuestring, "developer") == 0 ? "system" : role->valuestring;
        if (strcmp(m->role, "system") != 0 && strcmp(m->role, "user") != 0 &&
            strcmp(m->role, "assistant") != 0 && strcmp(m->role, "tool") != 0)
            return bad(err, param, "'%s' must be system, developer, user, assistant or tool",
                       param);
        bool assistant = strcmp(m->role, "assistant") == 0;
        cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (cJSON_IsString(content)) {
            m->content = content->valuestring;
        } else if (cJSON_IsArray(content)) {
            shoal_err e = join_parts(msg, content, i, &m->content, err);
            if (e)
                return e;
        } else if ((!content || cJSON_IsNull(content)) && assistant) {
            m->content = ""; /* an assistant turn of only tool calls has none */
        } else {
            return bad(err, param, "'%s' must be a string or an array of text parts, not %s", param,
                       content ? type_name(content) : "missing");
        }
        shoal_err e = parse_message_tools(msg, i, m, r, err);
        if (e)
            return e;
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
        snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
        if (reasoning && !cJSON_IsNull(reasoning)) {
            if (!cJSON_IsString(reasoning))
                return bad(err, param, "'%s' must be a string", param);
            m->reasoning_content = reasoning->valuestring;
        }
        i++;
    }
    return SHOAL_OK;
}

/* ---- features this server does not have ---- */

static shoal_err refuse_unsupported(const cJSON *root, coordinator_request_kind kind,
                                    coordinator_api_error *err)
{
    const cJSON *it;
    if (kind == COORDINATOR_REQUEST_COMPLETION && (it = field(root, "tools")) &&
        (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > 0))
        return bad(err, "tools", "tools are for /v1/chat/completions, not /v1/completions");
    /* `functions` and `function_call` are OpenAI's deprecated forms of
     * tools and tool_choice. */
    if ((it = field(root, "functions")) && (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > 0))
        return bad(err, "functions",
                   "'functions' is not supported by this server; send them as 'tools'");
    if ((it = field(root, "function_call")))
        return bad(err, "function_call",
                   "'function_call' is not supported by this server; use 'tool_choice'");
    if ((it = field(root, "response_format"))) {
        const cJSON *type =
            cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "type") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0)
            return bad(err, "response_format",
                       "only response_format {\"type\": \"text\"} is supported");
    }
    if ((it = field(root, "logit_bias")) && (!cJSON_IsObject(it) || cJSON_GetArraySize(it) > 0))
        return bad(err, "logit_bias", "logit_bias is not supported by this server");
    if (kind == COORDINATOR_REQUEST_COMPLETION) {
        if ((it = field(root, "echo")) && !cJSON_IsBool(it))
            return bad(err, "echo", "'echo' must be a boolean");
        if (cJSON_IsTrue(it) && (it = field(root, "logprobs")) && !cJSON_IsFalse(it))
            return bad(err, "echo",
                       "'echo' with 'logprobs' needs the prompt's log-probabilities, which this "
                       "server does not compute; leave out one of them");
        if ((it = field(root, "suffix")) && !(cJSON_IsString(it) && it->valuestring[0] == '\0'))
            return bad(err, "suffix", "suffix is not supported by this server");
    }
    return SHOAL_OK;
}

/* ---- generation fields ---- */

static shoal_err parse_stop(const cJSON *root, coordinator_request *r, int vocab,
                            coordinator_api_error *err)
{
    const cJSON *stop = field(root, "stop");
    if (stop) {
        if (cJSON_IsString(stop)) {
            r->stop[0] = stop->valuestring;
            r->stop_count = 1;
        } else if (cJSON_IsArray(stop)) {
            int n = cJSON_GetArraySize(stop);
            if (n > COORDINATOR_STOP_STRINGS_MAX)
                return bad(err, "stop", "'stop' holds %d strings, over the limit of %d", n,
                           COORDINATOR_STOP_STRINGS_MAX);
            const cJSON *s;
            cJSON_ArrayForEach(s, stop)
            {
                if (!cJSON_IsString(s))
                    return bad(err, "stop", "'stop'[%d] must be a string, not %s", r->stop_count,
                               type_name(s));
                r->stop[r->stop_count++] = s->valuestring;
            }
        } else {
            return bad(err, "stop", "'stop' must be a string or an array of strings, not %s",
                       type_name(stop));
        }
        for (int i = 0; i < r->stop_count; i++) {
            size_t n = strlen(r->stop[i]);
            if (n == 0)
                return bad(err, "stop", "'stop' strings must not be empty");
            if (n > COORDINATOR_STOP_BYTES_MAX)
                return bad(err, "stop", "'stop'[%d] is %zu bytes long, over the limit of %d", i, n,
                           COORDINATOR_STOP_BYTES_MAX);
            r->stop_bytes[i] = n;
        }
    }
    const cJSON *ids = field(root, "stop_token_ids");
    if (ids) {
        if (!cJSON_IsArray(ids))
            return bad(err, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        int n = cJSON_GetArraySize(ids);
        if (n > COORDINATOR_STOP_IDS_MAX)
            return bad(err, "stop_token_ids", "'stop_token_ids' holds %d ids, over the limit of %d",
                       n, COORDINATOR_STOP_IDS_MAX);
        int32_t *list = NULL;
        int count = 0;
        shoal_err e = get_ids(ids, "stop_token_ids", n, vocab, &list, &count, err);
        if (e)
            return e;
        memcpy(r->stop_ids, list, (size_t)count * sizeof *list);
        r->stop_id_count = count;
        free(list);
    }
    return SHOAL_OK;
}

static shoal_err parse_sampling(const cJSON *root, coordinator_request *r,
                                coordinator_api_error *err)
{
    coordinator_request_sampling *s = &r->sampling;
    shoal_err e;
    if ((e = get_float(root, "temperature", 0, false, INFINITY, &s->temperature, err)) ||
        (e = get_float(root, "top_p", 0, true, 1, &s->top_p, err)) ||
        (e = get_float(root, "min_p", 0, false, 1, &s->min_p, err)) ||
        (e = get_float(root, "presence_penalty", -2, false, 2, &s->presence_penalty, err)) ||
        (e = get_float(root, "frequency_penalty", -2, false, 2, &s->frequency_penalty, err)) ||
        (e = get_float(root, "repetition_penalty", 0, true, INFINITY, &s->repetition_penalty, err)))
        return e;
    long long v;
    bool given;
    if ((e = get_int(root, "top_k", -1, INT32_MAX, &given, &v, err)))
        return e;
    if (given)
        s->top_k = (int32_t)v;
    /* Seeds are 64-bit; JSON numbers reach cJSON as doubles, exact to 2^53,
     * which is as much of a seed as any client can send exactly. */
    const cJSON *seed = field(root, "seed");
    if (seed) {
        double d = seed->valuedouble;
        if (!cJSON_IsNumber(seed) || !isfinite(d) || d != floor(d) || d < -0x1p63 || d >= 0x1p64)
            return bad(err, "seed", "'seed' must be an integer from -2^63 to 2^64 - 1");
        s->has_seed = true;
        s->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    }
    return SHOAL_OK;
}

static shoal_err parse_generation(const cJSON *root, const coordinator_request_limits *limits,
                                  coordinator_request *r, coordinator_api_error *err)
{
    shoal_err e;
    long long v = 0;
    bool given = false;
    if ((e = refuse_unsupported(root, r->kind, err)))
        return e;
    /* max_completion_tokens is the newer name of max_tokens in chat. */
    if ((e = get_int(root, "max_tokens", 1, INT32_MAX, &given, &v, err)))
        return e;
    if (given)
        r->max_tokens = (int)v;
    if (r->kind == COORDINATOR_REQUEST_CHAT) {
        if ((e = get_int(root, "max_completion_tokens", 1, INT32_MAX, &given, &v, err)))
            return e;
        if (given)
            r->max_tokens = (int)v;
    }
    if ((e = get_int(root, "n", 1, COORDINATOR_CHOICES_MAX, &given, &v, err)))
        return e;
    if (given)
        r->n = (int)v;
    if ((e = get_int(root, "best_of", 1, COORDINATOR_CHOICES_MAX, &given, &v, err)))
        return e;
    if (given && v != r->n && v != 1)
        return bad(err, "best_of", "best_of other than n is not supported by this server");
    if ((e = parse_sampling(root, r, err)) || (e = parse_stop(root, r, limits->vocab, err)))
        return e;
    /* Log-probabilities: a boolean and top_logprobs in chat, a count in
     * completions. */
    if (r->kind == COORDINATOR_REQUEST_COMPLETION && (e = get_bool(root, "echo", &r->echo, err)))
        return e;
    if (r->kind == COORDINATOR_REQUEST_CHAT) {
        if ((e = get_bool(root, "logprobs", &r->logprobs, err)))
            return e;
        if ((e = get_int(root, "top_logprobs", 0, COORDINATOR_LOGPROBS_MAX, &given, &v, err)))
            return e;
        if (given) {
            if (v > 0 && !r->logprobs)
                return bad(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            r->top_logprobs = (int)v;
        }
    } else {
        if ((e = get_int(root, "logprobs", 0, COORDINATOR_LOGPROBS_MAX, &given, &v, err)))
            return e;
        if (given) {
            r->logprobs = true;
            r->top_logprobs = (int)v;
        }
    }
    if ((e = get_bool(root, "stream", &r->stream, err)))
        return e;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad(err, "stream_options", "'stream_options' must be an object, not %s",
                       type_name(so));
        if (!r->stream)
            return bad(err, "stream_options", "'stream_options' needs 'stream': true");
        if ((e = get_bool(so, "include_usage", &r->include_usage, err)))
            return bad(err, "stream_options.include_usage",
                       "'stream_options.include_usage' must be a boolean");
    }
    const char *user = NULL;
    if ((e = get_bool(root, "ignore_eos", &r->ignore_eos, err)) ||
        (e = get_bool(root, "include_stop_str_in_output", &r->include_stop_str_in_output, err)) ||
        (e = get_bool(root, "skip_special_tokens", &r->skip_special_tokens, err)) ||
        (e = get_bool(root, "return_token_ids", &r->return_token_ids, err)) ||
        (e = get_string(root, "user", 0, &user, NULL, err)) ||
        (e = get_string(root, "cache_salt", COORDINATOR_NAME_BYTES_MAX, &r->cache_salt,
                        &r->cache_salt_bytes, err)))
        return e;
    if (r->cache_salt && r->cache_salt_bytes == 0)
        return bad(err, "cache_salt", "'cache_salt' must not be empty");
    return SHOAL_OK;
}

/* tools, tool_choice and parallel_tool_calls. */
static shoal_err parse_tools(const cJSON *root, coordinator_request *r, coordinator_api_error *err)
{
    char param[64];
    const cJSON *tools = field(root, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools))
            return bad(err, "tools", "'tools' must be an array, not %s", type_name(tools));
        int n = cJSON_GetArraySize(tools);
        if (n > COORDINATOR_TOOLS_MAX)
            return bad(err, "tools", "'tools' holds %d tools, over the limit of %d", n,
                       COORDINATOR_TOOLS_MAX);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            snprintf(param, sizeof param, "tools[%d]", i);
            if (!cJSON_IsObject(t))
                return bad(err, param, "'%s' must be an object, not %s", param, type_name(t));
            const cJSON *type = field(t, "type"), *fn = field(t, "function");
            snprintf(param, sizeof param, "tools[%d].type", i);
            if (!(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0))
                return bad(err, param, "'%s' must be \"function\"", param);
            snprintf(param, sizeof param, "tools[%d].function", i);
            if (!cJSON_IsObject(fn))
                return bad(err, param, "'%s' must be an object, not %s", param,
                           fn ? type_name(fn) : "missing");
            const cJSON *name = field(fn, "name"), *desc = field(fn, "description");
            const cJSON *params = field(fn, "parameters"), *strict = field(fn, "strict");
            snprintf(param, sizeof param, "tools[%d].function.name", i);
            if (!cJSON_IsString(name))
                return bad(err, param, "'%s' must be a string, not %s", param,
                           name ? type_name(name) : "missing");
            if (!tool_name_valid(name->valuestring))
                return bad(err, param,
                           "'%s' must be 1 to %d characters of a-z, A-Z, 0-9, _ and -, not "
                           "'%.80s'",
                           param, COORDINATOR_TOOL_NAME_CHARS_MAX, name->valuestring);
            snprintf(param, sizeof param, "tools[%d].function.description", i);
            if (desc && !cJSON_IsString(desc))
                return bad(err, param, "'%s' must be a string, not %s", param, type_name(desc));
            snprintf(param, sizeof param, "tools[%d].function.parameters", i);
            if (params && !cJSON_IsObject(params))
                return bad(err, param, "'%s' must be an object (a JSON Schema), not %s", param,
                           type_name(params));
            snprintf(param, sizeof param, "tools[%d].function.strict", i);
            if (strict && !cJSON_IsBool(strict))
                return bad(err, param, "'%s' must be a boolean, not %s", param, type_name(strict));
            i++;
        }
        if (n > 0) {
            r->tools = tools;
            r->tool_count = n;
            r->tool_choice = COORDINATOR_TOOL_CHOICE_AUTO;
        }
    }
    r->parallel_tool_calls = true;
    shoal_err e = get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err);
    if (e)
        return e;
    /* /tokenize renders the tools and generates nothing: no choice to make. */
    const cJSON *choice = field(root, "tool_choice");
    if (!choice || r->kind != COORDINATOR_REQUEST_CHAT)
        return SHOAL_OK;
    if (cJSON_IsString(choice)) {
        if (strcmp(choice->valuestring, "none") == 0) {
            r->tool_choice = COORDINATOR_TOOL_CHOICE_NONE;
            return SHOAL_OK;
        }
        if (strcmp(choice->valuestring, "auto") == 0)
            return SHOAL_OK; /* auto with no tools is none */
        if (strcmp(choice->valuestring, "required") == 0)
            return bad(err, "tool_choice",
                       "tool_choice \"required\" needs constrained decoding, which this server "
                       "does not do yet; use \"auto\" or \"none\"");
        return bad(err, "tool_choice",
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                   "\"function\", \"function\": {\"name\": ...}}, not \"%.80s\"",
                   choice->valuestring);
    }
    const cJSON *type = cJSON_IsObject(choice) ? field(choice, "type") : NULL;
    const cJSON *fn = cJSON_IsObject(choice) ? field(choice, "function") : NULL;
    const cJSON *name = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
    if (!(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0) ||
        !cJSON_IsString(name))
        return bad(err, "tool_choice",
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                   "\"function\", \"function\": {\"name\": ...}}");
    bool known = false;
    const cJSON *t;
    if (r->tools)
        cJSON_ArrayForEach(t, r->tools)
        {
            known = known || strcmp(cJSON_GetObjectItemCaseSensitive(
                                        cJSON_GetObjectItemCaseSensitive(t, "function"), "name")
                                        ->valuestring,
                                    name->valuestring) == 0;
        }
    if (!known)
        return bad(err, "tool_choice.function.name",
                   "'tool_choice' names the function '%.80s', which is not in 'tools'",
                   name->valuestring);
    return bad(err, "tool_choice",
               "tool_choice naming a function needs constrained decoding, which this server does "
               "not do yet; use \"auto\" or \"none\"");
}

/* chat_template_kwargs.enable_thinking, add_generation_prompt and the
 * tools. */
static shoal_err parse_chat_options(const cJSON *root, coordinator_request *r,
                                    coordinator_api_error *err)
{
    shoal_err e = get_bool(root, "add_generation_prompt", &r->add_generation_prompt, err);
    if (e || (e = parse_tools(root, r, err)))
        return e;
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw)
        return SHOAL_OK;
    if (!cJSON_IsObject(kw))
        return bad(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    const cJSON *think = field(kw, "enable_thinking");
    if (think) {
        if (!cJSON_IsBool(think))
            return bad(err, "chat_template_kwargs.enable_thinking",
                       "'chat_template_kwargs.enable_thinking' must be a boolean");
        r->thinking =
            cJSON_IsTrue(think) ? COORDINATOR_CHAT_THINKING_ON : COORDINATOR_CHAT_THINKING_OFF;
    }
    return SHOAL_OK;
}

/* prompt: a string, an array of token ids, or a one-element array of
 * either (the batch form, with one prompt). */
static shoal_err parse_prompt(const cJSON *root, const coordinator_request_limits *limits,
                              coordinator_request *r, coordinator_api_error *err)
{
    const cJSON *p = field(root, "prompt");
    if (!p)
        return bad(err, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) >= 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child))) {
        if (cJSON_GetArraySize(p) > 1)
            return bad(err, "prompt", "'prompt' with more than one prompt is not supported");
        p = p->child;
    }
    if (cJSON_IsString(p)) {
        r->prompt_text = p->valuestring;
        r->prompt_text_bytes = strlen(p->valuestring);
        return SHOAL_OK;
    }
    if (!cJSON_IsArray(p))
        return bad(err, "prompt", "'prompt' must be a string or an array of token ids, not %s",
                   type_name(p));
    r->has_prompt_ids = true;
    return get_ids(p, "prompt", limits->max_model_len, limits->vocab, &r->prompt_ids,
                   &r->prompt_id_count, err);
}

/* A key given twice in one object: the last value is the one read, as
 * Python's json (vLLM) and llama.cpp's server read it, where cJSON's lookup
 * finds the first. Every object of the tree loses its earlier duplicates;
 * keys are sorted, not compared pairwise, so a body of many keys costs
 * n log n (prescan bounds the values and the nesting). */
typedef struct keyed {
    cJSON *item;
    size_t order;
} keyed;

static int by_key_then_order(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    int c = strcmp(x->item->string, y->item->string);
    return c ? c : x->order < y->order ? -1 : x->order > y->order;
}

static shoal_err keep_last_keys(cJSON *node, coordinator_api_error *err)
{
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node))
        return SHOAL_OK;
    size_t n = 0;
    for (cJSON *c = node->child; c; c = c->next) {
        shoal_err e = keep_last_keys(c, err);
        if (e)
            return e;
        n++;
    }
    if (!cJSON_IsObject(node) || n < 2)
        return SHOAL_OK;
    keyed *keys = malloc(n * sizeof *keys);
    if (!keys) {
        coordinator_api_error_set(err, 500, "server_error", NULL, "no memory for the request");
        return SHOAL_ERR_NOMEM;
    }
    size_t i = 0;
    for (cJSON *c = node->child; c; c = c->next, i++)
        keys[i] = (keyed){c, i};
    qsort(keys, n, sizeof *keys, by_key_then_order);
    for (i = 0; i + 1 < n; i++)
        if (strcmp(keys[i].item->string, keys[i + 1].item->string) == 0)
            cJSON_Delete(cJSON_DetachItemViaPointer(node, keys[i].item));
    free(keys);
    return SHOAL_OK;
}

/* ---- the fields a request may give ---- */

/* What each kind reads (NULL-terminated). A field of no list is
 * unknown: a 400, or with ignore_unknown_fields a warning. "user",
 * "metadata" and "store" (false) change nothing at OpenAI either unless a
 * completion is stored, which store: true asks and is refused. */
static const char *const generation_fields[] = {
    "model", "max_tokens", "n", "best_of", "temperature", "top_p", "min_p", "top_k",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
    "stop_token_ids", "logprobs", "stream", "stream_options", "ignore_eos",
    "skip_special_tokens", "return_token_ids", "user", "cache_salt", "add_special_tokens",
    "include_stop_str_in_output",
    "tools", "functions", "tool_choice", "response_format", "logit_bias", NULL};
static const char *const chat_fields[] = {
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
    "chat_template_kwargs", "parallel_tool_calls", "metadata", "store", NULL};
static const char *const completion_fields[] = {"prompt", "echo", "suffix", NULL};
static const char *const tokenize_fields[] = {
    "model", "messages", "prompt", "content", "add_special", "add_special_tokens",
    "return_token_strs", "add_generation_prompt", "chat_template_kwargs", "tools", NULL};
static const char *const detokenize_fields[] = {"model", "tokens", "skip_special_tokens", NULL};

/* Fields of OpenAI's or vLLM's API that change what a request produces
 * and that this server does not do yet: refused by name whatever
 * ignore_unknown_fields says, since ignoring them would answer another
 * request than the one asked. */
static const char *const unsupported_fields[] = {
    "min_tokens", "continue_final_message", "prompt_logprobs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structured_outputs", "allowed_token_ids", "bad_words",
    "use_beam_search", "length_penalty", "truncate_prompt_tokens", "logits_processors",
    "chat_template", "documents", "prediction", "audio", "web_search_options",
    "spaces_between_special_tokens", "return_tokens_as_token_ids", NULL};

static bool listed(const char *const *list, const char *name)
{
    for (; *list; list++)
        if (strcmp(*list, name) == 0)
            return true;
    return false;
}

static shoal_err check_fields(const cJSON *root, const coordinator_request_limits *limits,
                              coordinator_request *r, coordinator_api_error *err)
{
    const char *const *own = r->kind == COORDINATOR_REQUEST_CHAT         ? chat_fields
                             : r->kind == COORDINATOR_REQUEST_COMPLETION ? completion_fields
                             : r->kind == COORDINATOR_REQUEST_TOKENIZE   ? tokenize_fields
                                                                         : detokenize_fields;
    bool generates = r->kind == COORDINATOR_REQUEST_CHAT || r->kind == COORDINATOR_REQUEST_COMPLETION;
    char names[sizeof r->ignored_fields] = "";
    size_t len = 0;
    int unknown = 0;
    const char *first = NULL;
    for (const cJSON *f = root->child; f; f = f->next) {
        if (strcmp(f->string, "store") == 0 && !cJSON_IsFalse(f) && !cJSON_IsNull(f))
            return bad(err, "store", "'store' must be false: this server stores no completions");
        if (cJSON_IsNull(f) || listed(own, f->string) ||
            (generates && listed(generation_fields, f->string)))
            continue; /* null is "not given" for every field */
        if (generates && listed(unsupported_fields, f->string))
            return bad(err, f->string, "'%s' is not supported by this server", f->string);
        if (!first)
            first = f->string;
        if (unknown++ < 8 && len + strlen(f->string) + 5 < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", len ? ", " : "",
                                    f->string);
    }
    if (unknown == 0)
        return SHOAL_OK;
    if (unknown > 8 || len == 0)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s(%d in all)", len ? " " : "",
                                unknown);
    if (!limits->ignore_unknown_fields)
        return bad(err, unknown == 1 ? first : NULL,
                   "unknown field%s %s: this server does not honour %s (start the coordinator "
                   "with --ignore-unknown-fields to ignore unknown fields with a warning, as "
                   "vLLM does)",
                   unknown == 1 ? "" : "s", names, unknown == 1 ? "it" : "them");
    memcpy(r->ignored_fields, names, sizeof names);
    return SHOAL_OK;
}

static shoal_err check_model(const cJSON *root, const coordinator_request_limits *limits,
                             coordinator_api_error *err)
{
    const char *model = NULL;
    shoal_err e = get_string(root, "model", 0, &model, NULL, err);
    if (e || !model || !limits->model || strcmp(model, limits->model) == 0)
        return e;
    coordinator_api_error_set(err, 404, "invalid_request_error", "model",
                              "The model `%.200s` does not exist.", model);
    err->code = "model_not_found";
    return SHOAL_ERR_INVALID;
}

shoal_err coordinator_request_parse(coordinator_request_kind kind, const char *body, size_t bytes,
                                    const coordinator_request_limits *limits,
                                    coordinator_request *r, coordinator_api_error *err)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->n = 1;
    r->add_generation_prompt = true;
    r->add_special_tokens = kind != COORDINATOR_REQUEST_CHAT;
    r->skip_special_tokens = true;
    r->sampling = (coordinator_request_sampling){
        .temperature = 1.0f, .top_p = 1.0f, .top_k = -1, .repetition_penalty = 1.0f};
    shoal_err e;
    if (bytes == 0)
        return bad(err, NULL, "the request body is empty");
    size_t valid = coordinator_utf8_valid_prefix((const unsigned char *)body, bytes);
    if (valid != bytes)
        return bad(err, NULL, "the request body is not valid UTF-8 (at byte %zu)", valid);
    size_t ctx = limits->max_model_len > 0 ? (size_t)limits->max_model_len : 0;
    if ((e = prescan(body, bytes, ctx + JSON_VALUES_EXTRA, err)))
        return e;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, bytes, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + bytes ? (size_t)(end - body) : 0;
        return bad(err, NULL, "the request body is not valid JSON (at byte %zu)", at);
    }
    r->json_ = root;
    /* Anything after the value but white space is not JSON either. */
    while (end < body + bytes && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (end != body + bytes) {
        e = bad(err, NULL, "the request body is not valid JSON (text after the value at byte %zu)",
                (size_t)(end - body));
        goto out_fail;
    }
    if (!cJSON_IsObject(root)) {
        e = bad(err, NULL, "the request body must be a JSON object, not %s", type_name(root));
        goto out_fail;
    }
    if ((e = keep_last_keys(root, err)) || (e = check_model(root, limits, err)) ||
        (e = check_fields(root, limits, r, err)))
        goto out_fail;

    switch (kind) {
    case COORDINATOR_REQUEST_CHAT: {
        cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (!msgs || cJSON_IsNull(msgs)) {
            e = bad(err, "messages", "'messages' is required");
            goto out_fail;
        }
        if ((e = parse_messages(msgs, r, err)) || (e = parse_chat_options(root, r, err)) ||
            (e = get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) ||
            (e = parse_generation(root, limits, r, err)))
            goto out_fail;
        break;
    }
    case COORDINATOR_REQUEST_COMPLETION:
        if ((e = parse_prompt(root, limits, r, err)) ||
            (e = get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) ||
            (e = parse_generation(root, limits, r, err)))
            goto out_fail;
        break;
    case COORDINATOR_REQUEST_TOKENIZE: {
        cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (msgs && !cJSON_IsNull(msgs)) {
            r->add_special_tokens = false;
            if ((e = parse_messages(msgs, r, err)) || (e = parse_chat_options(root, r, err)))
                goto out_fail;
        } else {
            /* vLLM's `prompt`, or llama.cpp's `content` with `add_special`. */
            const char *name = field(root, "prompt") ? "prompt" : "content";
            if (!field(root, name)) {
                e = bad(err, "prompt", "'prompt' (or 'messages', or 'content') is required");
                goto out_fail;
            }
            if ((e = get_string(root, name, 0, &r->prompt_text, &r->prompt_text_bytes, err)))
                goto out_fail;
            if (field(root, "add_special") &&
                (e = get_bool(root, "add_special", &r->add_special_tokens, err)))
                goto out_fail;
        }
        if ((e = get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) ||
            (e = get_bool(root, "return_token_strs", &r->return_token_strs, err)))
            goto out_fail;
        break;
    }
    case COORDINATOR_REQUEST_DETOKENIZE: {
        const cJSON *t = field(root, "tokens");
        if (!t) {
            e = bad(err, "tokens", "'tokens' is required");
            goto out_fail;
        }
        if (!cJSON_IsArray(t)) {
            e = bad(err, "tokens", "'tokens' must be an array of token ids, not %s", type_name(t));
            goto out_fail;
        }
        r->has_prompt_ids = true;
        int max = limits->max_model_len > 0 ? limits->max_model_len : 0;
        if ((e = get_ids(t, "tokens", max, limits->vocab, &r->prompt_ids, &r->prompt_id_count,
                         err)) ||
            (e = get_bool(root, "skip_special_tokens", &r->skip_special_tokens, err)))
            goto out_fail;
        break;
    }
    }
    return SHOAL_OK;

out_fail:
    coordinator_request_fini(r);
    r->kind = kind;
    return e;
}

shoal_err coordinator_request_id_check(const char *value, coordinator_api_error *err)
{
    size_t n = strlen(value);
    if (n == 0 || n > COORDINATOR_REQUEST_ID_BYTES_MAX)
        return bad(err, "X-Request-Id", "the X-Request-Id header has %zu bytes; it takes 1 to %d",
                   n, COORDINATOR_REQUEST_ID_BYTES_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c < 0x21 || c > 0x7e || c == '"' || c == '\\')
            return bad(err, "X-Request-Id",
                       "the X-Request-Id header has a byte 0x%02x at %zu; it takes visible ASCII "
                       "but '\"' and '\\'",
                       c, i);
    }
    return SHOAL_OK;
}

void coordinator_request_fini(coordinator_request *r)
{
    for (size_t i = 0; r->call_args_ && i < r->call_count_; i++)
        cJSON_Delete(r->call_args_[i]);
    free(r->call_args_);
    free(r->calls_);
    free(r->messages);
    free(r->prompt_ids);
    cJSON_Delete(r->json_);
    memset(r, 0, sizeof *r);
}

/* ---- the prompt's tokens ---- */

static shoal_err encode(const coordinator_request *r, const coordinator_tokenizer *tok,
                        coordinator_tokenizer_work *work, const char *text, size_t bytes,
                        const char *param, int32_t *ids, size_t cap, size_t *n_ids,
                        coordinator_api_error *err)
{
    shoal_diag diag = {{0}};
    unsigned flags = r->add_special_tokens ? COORDINATOR_ENCODE_ADD_SPECIAL : 0;
    shoal_err e =
        coordinator_tokenizer_encode(tok, work, text, bytes, flags, ids, cap, n_ids, &diag);
    if (e == SHOAL_ERR_LIMIT)
        return bad(err, param,
                   "the prompt is longer than this model's maximum context length of %zu tokens",
                   cap);
    if (e == SHOAL_ERR_NOMEM)
        return nomem(err);
    if (e)
        return bad(err, param, "the prompt cannot be tokenized: %s", diag.msg);
    return SHOAL_OK;
}

shoal_err coordinator_request_prompt(const coordinator_request *r, const coordinator_tokenizer *tok,
                                     const coordinator_chat *chat, coordinator_tokenizer_work *work,
                                     int32_t *ids, size_t cap, size_t *n_ids,
                                     coordinator_api_error *err)
{
    *n_ids = 0;
    shoal_err e = SHOAL_OK;
    const char *param = r->kind == COORDINATOR_REQUEST_DETOKENIZE ? "tokens" : "prompt";
    if (r->messages) {
        param = "messages";
        if (!chat)
            return bad(err, param,
                       "this model has no chat template that shoal can render; use "
                       "/v1/completions");
        coordinator_chat_options opt = {.add_generation_prompt = r->add_generation_prompt,
                                        .thinking = r->thinking,
                                        .tools = r->tools};
        shoal_diag diag = {{0}};
        size_t need = 0;
        e = coordinator_chat_render(chat, r->messages, r->message_count, &opt, NULL, 0, &need,
                                    &diag);
        if (e != SHOAL_ERR_LIMIT)
            return e == SHOAL_ERR_NOMEM ? nomem(err)
                                        : bad(err, param,
                                              "the chat template refused the "
                                              "messages: %s",
                                              diag.msg);
        char *text = malloc(need + 1);
        if (!text)
            return nomem(err);
        e = coordinator_chat_render(chat, r->messages, r->message_count, &opt, text, need + 1,
                                    &need, &diag);
        if (e)
            e = e == SHOAL_ERR_NOMEM ? nomem(err)
                                     : bad(err, param,
                                           "the chat template refused the messages: "
                                           "%s",
                                           diag.msg);
        else
            e = encode(r, tok, work, text, need, param, ids, cap, n_ids, err);
        free(text);
    } else if (r->has_prompt_ids) {
        if ((size_t)r->prompt_id_count > cap)
            return bad(err, param,
                       "the prompt is longer than this model's maximum context length of %zu "
                       "tokens",
                       cap);
        memcpy(ids, r->prompt_ids, (size_t)r->prompt_id_count * sizeof *ids);
        *n_ids = (size_t)r->prompt_id_count;
    } else {
        e = encode(r, tok, work, r->prompt_text, r->prompt_text_bytes, param, ids, cap, n_ids, err);
    }
    if (e == SHOAL_OK && *n_ids == 0 && r->kind != COORDINATOR_REQUEST_TOKENIZE &&
        r->kind != COORDINATOR_REQUEST_DETOKENIZE)
        return bad(err, param, "the prompt is empty");
    return e;
}

shoal_err coordinator_request_fit(const coordinator_request *r, int prompt_len,
                                  const coordinator_request_limits *limits, int *max_tokens,
                                  coordinator_api_error *err)
{
    long long ctx = limits->max_model_len;
    if (prompt_len >= ctx)
        return bad(err, r->messages ? "messages" : "prompt",
                   "This model's maximum context length is %lld tokens. However, your prompt "
                   "has %d tokens, which leaves no room for the completion. Please reduce the "
                   "length of the prompt.",
                   ctx, prompt_len);
    long long room = ctx - prompt_len;
    if (r->max_tokens > 0) {
        if (r->max_tokens > room)
            return bad(err, "max_tokens",
                       "This model's maximum context length is %lld tokens. However, you "
                       "requested %lld tokens (%d in the prompt, %d for the completion). Please "
                       "reduce the length of the prompt or max_tokens.",
                       ctx, (long long)prompt_len + r->max_tokens, prompt_len, r->max_tokens);
        *max_tokens = r->max_tokens;
    } else if (limits->default_max_tokens > 0 && limits->default_max_tokens < room) {
        *max_tokens = limits->default_max_tokens;
    } else {
        *max_tokens = (int)room;
    }
    return SHOAL_OK;
}
