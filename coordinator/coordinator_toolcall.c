#include "coordinator_toolcall.h"

#include "common/common_rng.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char open_tag[] = "<tool_call>";
static const char close_tag[] = "</tool_call>";
static const char python_tag[] = "<|python_tag|>";
enum {
    OPEN_BYTES = sizeof open_tag - 1,
    CLOSE_BYTES = sizeof close_tag - 1,
    PYTHON_BYTES = sizeof python_tag - 1,
};

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The first n-byte needle in s[0..bytes), or NULL (memmem is not C11). */
static const char *find(const char *s, size_t bytes, const char *needle, size_t n)
{
    for (size_t i = 0; i + n <= bytes; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, n) == 0)
            return s + i;
    return NULL;
}

void coordinator_toolcall_result_fini(coordinator_toolcall_result *out)
{
    for (int i = 0; out->calls && i < out->count; i++) {
        free(out->calls[i].name);
        free(out->calls[i].arguments);
    }
    free(out->calls);
    memset(out, 0, sizeof *out);
}

static void make_id(char id[COORDINATOR_TOOLCALL_ID_BYTES], uint64_t *rng)
{
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(id, "call_", 5);
    for (int i = 0; i < 24; i++)
        id[5 + i] = alnum[common_rng_next(rng) % (sizeof alnum - 1)];
    id[COORDINATOR_TOOLCALL_ID_BYTES - 1] = '\0';
}

typedef enum parsed {
    PARSED_CALL,
    PARSED_NOT_A_CALL,
    PARSED_NOMEM,
} parsed;

/* s[0..bytes), white space around it allowed, as exactly one JSON object
 * {"name": string, <args_key or alt_key>: object} into *call. */
static parsed parse_call(const char *s, size_t bytes, const char *args_key, const char *alt_key,
                         coordinator_toolcall *call)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, bytes, &end, false);
    if (!root)
        return PARSED_NOT_A_CALL;
    while (end < s + bytes && is_space(*end))
        end++;
    parsed res = PARSED_NOT_A_CALL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(root, args_key);
    if (!args && alt_key)
        args = cJSON_GetObjectItemCaseSensitive(root, alt_key);
    if (end != s + bytes || !cJSON_IsObject(root) || !cJSON_IsString(name) ||
        name->valuestring[0] == '\0' || !cJSON_IsObject(args))
        goto out_delete;
    res = PARSED_NOMEM;
    call->name = malloc(strlen(name->valuestring) + 1);
    call->arguments = cJSON_PrintUnformatted(args);
    if (!call->name || !call->arguments) {
        free(call->name);
        free(call->arguments);
        call->name = call->arguments = NULL;
        goto out_delete;
    }
    strcpy(call->name, name->valuestring);
    res = PARSED_CALL;
out_delete:
    cJSON_Delete(root);
    return res;
}

static shoal_err parse_qwen3(const char *text, size_t bytes, coordinator_toolcall_result *out)
{
    const char *first = find(text, bytes, open_tag, OPEN_BYTES);
    if (!first)
        return SHOAL_OK;
    int blocks = 0;
    for (const char *p = first; p; blocks++) {
        const char *body = p + OPEN_BYTES;
        const char *close = find(body, (size_t)(text + bytes - body), close_tag, CLOSE_BYTES);
        p = close ? find(close, (size_t)(text + bytes - close), open_tag, OPEN_BYTES) : NULL;
    }
    if (blocks > COORDINATOR_TOOL_CALLS_MAX)
        return SHOAL_OK;
    out->calls = calloc((size_t)blocks, sizeof *out->calls);
    if (!out->calls)
        return SHOAL_ERR_NOMEM;
    for (const char *p = first; p;) {
        const char *body = p + OPEN_BYTES;
        const char *close = find(body, (size_t)(text + bytes - body), close_tag, CLOSE_BYTES);
        const char *body_end = close ? close : text + bytes;
        coordinator_toolcall *call = &out->calls[out->count];
        parsed res = parse_call(body, (size_t)(body_end - body), "arguments", NULL, call);
        if (res != PARSED_CALL) {
            coordinator_toolcall_result_fini(out);
            return res == PARSED_NOMEM ? SHOAL_ERR_NOMEM : SHOAL_OK;
        }
        out->count++;
        p = close ? find(close, (size_t)(text + bytes - close), open_tag, OPEN_BYTES) : NULL;
    }
    size_t content = (size_t)(first - text);
    while (content > 0 && is_space(text[content - 1]))
        content--;
    out->has_content = content > 0;
    out->content_bytes = content;
    return SHOAL_OK;
}

static shoal_err parse_llama3(const char *text, size_t bytes, coordinator_toolcall_result *out)
{
    const char *s = text, *end = text + bytes;
    while (s < end && is_space(*s))
        s++;
    if ((size_t)(end - s) >= PYTHON_BYTES && memcmp(s, python_tag, PYTHON_BYTES) == 0)
        s += PYTHON_BYTES;
    out->calls = calloc(1, sizeof *out->calls);
    if (!out->calls)
        return SHOAL_ERR_NOMEM;
    parsed res = parse_call(s, (size_t)(end - s), "parameters", "arguments", &out->calls[0]);
    if (res != PARSED_CALL) {
        coordinator_toolcall_result_fini(out);
        return res == PARSED_NOMEM ? SHOAL_ERR_NOMEM : SHOAL_OK;
    }
    out->count = 1;
    out->has_content = false;
    out->content_bytes = 0;
    return SHOAL_OK;
}

shoal_err coordinator_toolcall_parse(coordinator_chat_format format, const char *text, size_t bytes,
                                     uint64_t *id_rng, coordinator_toolcall_result *out)
{
    memset(out, 0, sizeof *out);
    shoal_err e = format == COORDINATOR_CHAT_QWEN3 ? parse_qwen3(text, bytes, out)
                                                   : parse_llama3(text, bytes, out);
    if (e)
        return e;
    if (out->count == 0) { /* no calls: all of it is content */
        out->has_content = true;
        out->content_bytes = bytes;
    }
    for (int i = 0; i < out->count; i++)
        make_id(out->calls[i].id, id_rng);
    return SHOAL_OK;
}

size_t coordinator_toolcall_plain_prefix(coordinator_chat_format format, const char *text,
                                         size_t bytes)
{
    if (format != COORDINATOR_CHAT_QWEN3) {
        size_t i = 0;
        while (i < bytes && is_space(text[i]))
            i++;
        if (i == bytes || text[i] == '{')
            return 0;
        size_t n = bytes - i < PYTHON_BYTES ? bytes - i : PYTHON_BYTES;
        return memcmp(text + i, python_tag, n) == 0 ? 0 : bytes;
    }
    const char *tag = find(text, bytes, open_tag, OPEN_BYTES);
    if (tag)
        return (size_t)(tag - text);
    /* The longest tail that is the start of a tag (shorter than a tag, or
     * find would have seen it). */
    for (size_t n = bytes < OPEN_BYTES - 1 ? bytes : OPEN_BYTES - 1; n > 0; n--)
        if (memcmp(text + bytes - n, open_tag, n) == 0)
            return bytes - n;
    return bytes;
}
