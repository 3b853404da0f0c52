/* Tests of coordinator_toolcall: a finished completion's text read as
 * content and tool calls in the Qwen3 (hermes) and Llama 3 (JSON)
 * formats, what stays content when a block is not a call, and the prefix
 * of a stream that may be sent before the choice ends. */
#include "../test.h"
#include "coordinator/coordinator_toolcall.h"

#include <ctype.h>

#define QWEN3 COORDINATOR_CHAT_QWEN3
#define LLAMA3 COORDINATOR_CHAT_LLAMA3

static uint64_t rng = 42;

static coordinator_toolcall_result parse(coordinator_chat_format f, const char *text)
{
    coordinator_toolcall_result res;
    CHECK_EQ_INT(coordinator_toolcall_parse(f, text, strlen(text), &rng, &res), SHOAL_OK);
    return res;
}

/* The result has no calls and its content is all of text. */
static void plain(coordinator_chat_format f, const char *text)
{
    coordinator_toolcall_result res = parse(f, text);
    CHECK_MSG(res.count == 0, "%s: %d calls", text, res.count);
    CHECK_MSG(res.has_content && res.content_bytes == strlen(text), "%s: content of %zu bytes",
              text, res.content_bytes);
    coordinator_toolcall_result_fini(&res);
}

static void call_is(const coordinator_toolcall *c, const char *name, const char *arguments)
{
    CHECK_MSG(strcmp(c->name, name) == 0, "name '%s', want '%s'", c->name, name);
    CHECK_MSG(strcmp(c->arguments, arguments) == 0, "arguments '%s', want '%s'", c->arguments,
              arguments);
    CHECK_EQ_INT(strlen(c->id), 29);
    CHECK(strncmp(c->id, "call_", 5) == 0);
    for (int i = 5; i < 29; i++)
        CHECK(isalnum((unsigned char)c->id[i]));
}

static void text_without_a_call_is_all_content(void)
{
    plain(QWEN3, "The weather is fine.");
    plain(QWEN3, "");
    plain(QWEN3, "a <tool_call without its bracket");
    plain(LLAMA3, "The weather is fine.");
    plain(LLAMA3, "{\"name\": \"f\"} and more");
    plain(LLAMA3, "[1, 2]");
}

static void one_qwen3_call_with_no_text_has_null_content(void)
{
    coordinator_toolcall_result res = parse(
        QWEN3, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"days\": 2}}\n</tool_call>");
    CHECK_EQ_INT(res.count, 1);
    CHECK(!res.has_content);
    if (res.count == 1)
        call_is(&res.calls[0], "get_weather", "{\"city\":\"Paris\",\"days\":2}");
    coordinator_toolcall_result_fini(&res);
    coordinator_toolcall_result_fini(&res); /* idempotent */
}

static void two_calls_follow_the_text_before_them(void)
{
    const char *text = "Let me check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                       "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, "
                       "{\"y\": null}]}}\n</tool_call>";
    coordinator_toolcall_result res = parse(QWEN3, text);
    CHECK_EQ_INT(res.count, 2);
    CHECK(res.has_content && res.content_bytes == strlen("Let me check both."));
    if (res.count == 2) {
        call_is(&res.calls[0], "a", "{}");
        call_is(&res.calls[1], "b", "{\"x\":[1,{\"y\":null}]}");
        CHECK(strcmp(res.calls[0].id, res.calls[1].id) != 0);
    }
    coordinator_toolcall_result_fini(&res);
}

static void braces_and_tags_inside_strings_are_text(void)
{
    coordinator_toolcall_result res = parse(
        QWEN3, "<tool_call>{\"name\": \"f\", \"arguments\": {\"code\": \"if (x) { y(\\\"}\\\"); "
               "}\", \"s\": \"<tool_call>\"}}</tool_call>");
    CHECK_EQ_INT(res.count, 1);
    if (res.count == 1)
        call_is(&res.calls[0], "f",
                "{\"code\":\"if (x) { y(\\\"}\\\"); }\",\"s\":\"<tool_call>\"}");
    coordinator_toolcall_result_fini(&res);
}

/* As vLLM: a block that is not a call leaves the text as it was, all of
 * it content, calls that did parse included. */
static void a_block_that_is_not_a_call_leaves_all_the_text_as_content(void)
{
    plain(QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}\n</tool_call>"); /* bad JSON */
    plain(QWEN3, "<tool_call>\n{\"arguments\": {}}\n</tool_call>");                 /* no name */
    plain(QWEN3, "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>");
    plain(QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>");
    plain(QWEN3, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
    plain(QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} {}\n</tool_call>");
    plain(QWEN3, "<tool_call>\n[]\n</tool_call>");
    plain(QWEN3, "hi <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
                 "<tool_call>oops</tool_call>");
}

/* A last block without </tool_call> runs to the end of the text: a call
 * if its JSON is whole (generation stopped at the tag), else content. */
static void an_unterminated_last_block_runs_to_the_end(void)
{
    coordinator_toolcall_result res =
        parse(QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
    CHECK_EQ_INT(res.count, 1);
    if (res.count == 1)
        call_is(&res.calls[0], "f", "{\"a\":1}");
    coordinator_toolcall_result_fini(&res);
    plain(QWEN3, "<tool_call>\n{\"name\": \"f\", \"argum");
    plain(QWEN3, "<tool_call>");
}

static void more_blocks_than_the_bound_are_content(void)
{
    static const char block[] = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    for (int count = COORDINATOR_TOOL_CALLS_MAX; count <= COORDINATOR_TOOL_CALLS_MAX + 1; count++) {
        char *text = malloc((size_t)count * sizeof block + 1);
        text[0] = '\0';
        for (int i = 0; i < count; i++)
            strcat(text, block);
        coordinator_toolcall_result res = parse(QWEN3, text);
        CHECK_EQ_INT(res.count, count == COORDINATOR_TOOL_CALLS_MAX ? count : 0);
        coordinator_toolcall_result_fini(&res);
        free(text);
    }
}

static void a_llama3_call_is_the_whole_text_as_one_object(void)
{
    coordinator_toolcall_result res =
        parse(LLAMA3, "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n");
    CHECK_EQ_INT(res.count, 1);
    CHECK(!res.has_content);
    if (res.count == 1)
        call_is(&res.calls[0], "get_weather", "{\"city\":\"Oslo\"}");
    coordinator_toolcall_result_fini(&res);
    res = parse(LLAMA3, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"q\": \"}{\"}}");
    CHECK_EQ_INT(res.count, 1);
    if (res.count == 1)
        call_is(&res.calls[0], "f", "{\"q\":\"}{\"}");
    coordinator_toolcall_result_fini(&res);
    plain(LLAMA3, "Sure: {\"name\": \"f\", \"parameters\": {}}");
    plain(LLAMA3, "{\"name\": \"f\", \"parameters\": 1}");
    plain(LLAMA3, "{\"parameters\": {}}");
}

/* What a stream may send before the end, and that it never shrinks as
 * the text grows token by token. */
static void a_stream_holds_back_only_what_may_become_a_call(void)
{
    const char *q = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    size_t tag = strlen("Checking.\n");
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(QWEN3, q, strlen(q)), tag);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(QWEN3, q, tag + 4), tag); /* "<too" */
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(QWEN3, "a <tool_cal", 11), 2);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(QWEN3, "a <tool_caX", 11), 11);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(QWEN3, "x<", 2), 1);
    size_t last = 0;
    for (size_t n = 0; n <= strlen(q); n++) {
        size_t p = coordinator_toolcall_plain_prefix(QWEN3, q, n);
        CHECK_MSG(p >= last && p <= n, "at %zu: %zu after %zu", n, p, last);
        last = p;
    }
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, "  ", 2), 0);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, " {\"name\"", 8), 0);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, "<|pyth", 6), 0);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, "<|python_tag|>{", 15), 0);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, " Hello", 6), 6);
    CHECK_EQ_INT(coordinator_toolcall_plain_prefix(LLAMA3, "<b>", 3), 3);
}

int main(void)
{
    TEST_RUN(text_without_a_call_is_all_content);
    TEST_RUN(one_qwen3_call_with_no_text_has_null_content);
    TEST_RUN(two_calls_follow_the_text_before_them);
    TEST_RUN(braces_and_tags_inside_strings_are_text);
    TEST_RUN(a_block_that_is_not_a_call_leaves_all_the_text_as_content);
    TEST_RUN(an_unterminated_last_block_runs_to_the_end);
    TEST_RUN(more_blocks_than_the_bound_are_content);
    TEST_RUN(a_llama3_call_is_the_whole_text_as_one_object);
    TEST_RUN(a_stream_holds_back_only_what_may_become_a_call);
    return TEST_EXIT();
}
