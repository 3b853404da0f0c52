/* Tests of coordinator_chat: renderings equal to the model's own Jinja
 * template run by @huggingface/jinja (node, in the test), token for token
 * after encoding, and clear refusals of unknown templates and bad input. */
#include "text_ref.h"

#include "../test.h"
#include "common/common_file.h"
#include "coordinator/coordinator_chat.h"
#include "coordinator/coordinator_tokenizer.h"

#define CHATS SHOAL_TEXT_TESTS "/chats.json"
#define IDS_CAP 65536

static coordinator_chat *qwen3_chat, *llama3_chat, *llama3_always_chat;
static FILE *chat_ref; /* the reference, started first thing in main */
static coordinator_tokenizer *qwen3_tok, *llama3_tok;

/* Meta's Llama-3 Instruct template: the packaged one with its last
 * statement under `if add_generation_prompt` (as ref_chat.js builds it). */
static coordinator_chat *open_meta_llama3(void)
{
    static const char gen[] = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
    char *json;
    size_t bytes;
    shoal_diag diag = {{0}};
    if (common_file_read(LLAMA3_CONFIG, 1u << 24, &json, &bytes, &diag) != SHOAL_OK)
        return NULL;
    cJSON *root = cJSON_Parse(json);
    const char *tpl = cJSON_GetObjectItem(root, "chat_template")->valuestring;
    size_t keep = strlen(tpl) - strlen(gen);
    char meta[4096];
    snprintf(meta, sizeof meta, "%.*s{%% if add_generation_prompt %%}%s{%% endif %%}", (int)keep,
             tpl, gen);
    coordinator_chat *chat = NULL;
    shoal_err err = coordinator_chat_from_template(meta, strlen(meta), "<|begin_of_text|>",
                                                   "<|end_of_text|>", &chat, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s", diag.msg);
    cJSON_Delete(root);
    free(json);
    return chat;
}

/* A case's messages as the renderer takes them. Tool calls come as
 * OpenAI sends them (arguments a JSON string); a case with
 * "arguments_as_values" also gives each call its arguments parsed, as
 * vLLM renders them (ref_chat.js parses them likewise). The parsed values
 * hang off the case, which outlives the rendering. */
static size_t messages_of(cJSON *c, coordinator_chat_message *msgs, size_t cap)
{
    static coordinator_chat_tool_call calls[256];
    size_t n = 0, n_calls = 0;
    bool as_values = cJSON_IsTrue(cJSON_GetObjectItem(c, "arguments_as_values"));
    cJSON *parsed = cJSON_AddArrayToObject(c, "_parsed");
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages"))
    {
        if (n == cap)
            break;
        const cJSON *rc = cJSON_GetObjectItem(m, "reasoning_content");
        const cJSON *id = cJSON_GetObjectItem(m, "tool_call_id");
        msgs[n] = (coordinator_chat_message){
            .role = cJSON_GetObjectItem(m, "role")->valuestring,
            .content = cJSON_GetObjectItem(m, "content")->valuestring,
            .reasoning_content = rc ? rc->valuestring : NULL,
            .tool_calls = calls + n_calls,
            .tool_call_id = id ? id->valuestring : NULL,
        };
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(m, "tool_calls"))
        {
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            const char *args = cJSON_GetObjectItem(fn, "arguments")->valuestring;
            cJSON *value = as_values ? cJSON_Parse(args) : NULL;
            if (value)
                cJSON_AddItemToArray(parsed, value);
            CHECK(n_calls < sizeof calls / sizeof calls[0]);
            calls[n_calls++] = (coordinator_chat_tool_call){
                .id = cJSON_GetObjectItem(tc, "id")->valuestring,
                .name = cJSON_GetObjectItem(fn, "name")->valuestring,
                .arguments = args,
                .arguments_value = value,
            };
            msgs[n].tool_call_count++;
        }
        n++;
    }
    return n;
}

static void renderings_and_ids_match_the_jinja_reference(void)
{
    cJSON *ref = ref_collect(chat_ref, "ref_chat.js");
    char *json;
    size_t bytes;
    shoal_diag diag = {{0}};
    CHECK(common_file_read(CHATS, 1u << 24, &json, &bytes, &diag) == SHOAL_OK);
    cJSON *chats = cJSON_Parse(json);
    const cJSON *cases = cJSON_GetObjectItem(chats, "cases");
    CHECK(ref && cJSON_GetArraySize(ref) == cJSON_GetArraySize(cases));
    coordinator_tokenizer_work *qw = NULL, *lw = NULL;
    CHECK(coordinator_tokenizer_work_open(qwen3_tok, &qw, &diag) == SHOAL_OK);
    CHECK(coordinator_tokenizer_work_open(llama3_tok, &lw, &diag) == SHOAL_OK);
    static char out[1 << 16];
    static int32_t ids[IDS_CAP];
    int k = 0, thinking_cases = 0, tool_cases = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const cJSON *r = cJSON_GetArrayItem(ref, k);
        if (!r)
            break;
        const char *model = cJSON_GetObjectItem(c, "model")->valuestring;
        const char *note = cJSON_GetObjectItem(c, "note")->valuestring;
        coordinator_chat *chat = strcmp(model, "qwen3") == 0    ? qwen3_chat
                                 : strcmp(model, "llama3") == 0 ? llama3_chat
                                                                : llama3_always_chat;
        bool qwen = chat == qwen3_chat;
        coordinator_chat_message msgs[64];
        size_t n = messages_of(c, msgs, 64);
        coordinator_chat_options opt = {
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
            .thinking = COORDINATOR_CHAT_THINKING_UNSET,
            .tools = cJSON_GetObjectItem(c, "tools"),
        };
        tool_cases += cJSON_GetArraySize(opt.tools) > 0;
        const cJSON *th = cJSON_GetObjectItem(c, "enable_thinking");
        if (th) {
            opt.thinking =
                cJSON_IsTrue(th) ? COORDINATOR_CHAT_THINKING_ON : COORDINATOR_CHAT_THINKING_OFF;
            thinking_cases++;
        }
        size_t len = 0;
        shoal_err err = coordinator_chat_render(chat, msgs, n, &opt, out, sizeof out, &len, &diag);
        CHECK_MSG(err == SHOAL_OK, "%s: %s", note, diag.msg);
        size_t want_len = 0;
        unsigned char *want = ref_unhex(cJSON_GetObjectItem(r, "hex")->valuestring, &want_len);
        if (len != want_len || memcmp(out, want, len) != 0) {
            fprintf(stderr, "  FAIL %s case %d (%s):\n    got  '%s'\n", model, k, note,
                    ref_excerpt((unsigned char *)out, len));
            fprintf(stderr, "    want '%s'\n", ref_excerpt(want, want_len));
            test_failed_now = 1;
        }
        /* The rendering encodes to the reference's ids, special tokens
         * matched. */
        size_t n_ids = 0, n_want = 0;
        err = coordinator_tokenizer_encode(qwen ? qwen3_tok : llama3_tok, qwen ? qw : lw, out, len,
                                           0, ids, IDS_CAP, &n_ids, &diag);
        CHECK(err == SHOAL_OK);
        int32_t *want_ids = ref_ids(cJSON_GetObjectItem(r, "ids"), &n_want);
        CHECK_MSG(n_ids == n_want && memcmp(ids, want_ids, n_ids * sizeof *ids) == 0,
                  "%s case %d (%s): ids differ", model, k, note);
        free(want_ids);
        free(want);
        k++;
    }
    printf("  %d conversations (%d with enable_thinking set, %d with tools)\n", k, thinking_cases,
           tool_cases);
    CHECK(k >= 40 && tool_cases >= 10);
    coordinator_tokenizer_work_close(qw);
    coordinator_tokenizer_work_close(lw);
    cJSON_Delete(chats);
    free(json);
    cJSON_Delete(ref);
}

static void known_templates_are_recognised(void)
{
    CHECK_EQ_INT(coordinator_chat_format_of(qwen3_chat), COORDINATOR_CHAT_QWEN3);
    CHECK_EQ_INT(coordinator_chat_format_of(llama3_chat), COORDINATOR_CHAT_LLAMA3);
    CHECK_EQ_INT(coordinator_chat_format_of(llama3_always_chat), COORDINATOR_CHAT_LLAMA3_ALWAYS);
    CHECK(strcmp(coordinator_chat_format_name(COORDINATOR_CHAT_QWEN3), "qwen3") == 0);
}

static void unknown_template_is_refused_not_guessed(void)
{
    char *json;
    size_t bytes;
    shoal_diag diag = {{0}};
    CHECK(common_file_read(QWEN3_CONFIG, 1u << 24, &json, &bytes, &diag) == SHOAL_OK);
    cJSON *root = cJSON_Parse(json);
    cJSON *tpl = cJSON_GetObjectItem(root, "chat_template");
    /* One character changed: a different template, however close. */
    char *edited = strdup(tpl->valuestring);
    char *p = strstr(edited, "<think>\\n\\n</think>");
    CHECK(p != NULL);
    if (p)
        p[1] = 'T';
    coordinator_chat *chat = NULL;
    CHECK_EQ_INT(coordinator_chat_from_template(edited, strlen(edited), NULL, NULL, &chat, &diag),
                 SHOAL_ERR_UNSUPPORTED);
    CHECK(chat == NULL);
    CHECK_HAS(diag.msg, "unknown chat template");
    CHECK_HAS(diag.msg, "fingerprint");
    const char *other = "{% for m in messages %}{{ m.content }}{% endfor %}";
    CHECK_EQ_INT(coordinator_chat_from_template(other, strlen(other), NULL, NULL, &chat, &diag),
                 SHOAL_ERR_UNSUPPORTED);
    /* A config without a template, and a truncated one. */
    cJSON_DeleteItemFromObject(root, "chat_template");
    char *text = cJSON_Print(root);
    CHECK_EQ_INT(coordinator_chat_parse(text, strlen(text), "cfg", &chat, &diag), SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "no chat_template");
    CHECK_EQ_INT(coordinator_chat_parse(json, bytes / 2, "cfg", &chat, &diag), SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "cfg");
    /* The Llama-3 template without a bos_token cannot render. */
    char *ljson;
    size_t lbytes;
    CHECK(common_file_read(LLAMA3_CONFIG, 1u << 24, &ljson, &lbytes, &diag) == SHOAL_OK);
    cJSON *lroot = cJSON_Parse(ljson);
    const char *ltpl = cJSON_GetObjectItem(lroot, "chat_template")->valuestring;
    CHECK_EQ_INT(coordinator_chat_from_template(ltpl, strlen(ltpl), NULL, NULL, &chat, &diag),
                 SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "bos_token");
    cJSON_Delete(lroot);
    free(ljson);
    free(text);
    free(edited);
    cJSON_Delete(root);
    free(json);
}

/* The conversation is refused as invalid, for the reason given. */
static void refused(const coordinator_chat *chat, const coordinator_chat_message *msgs, size_t n,
                    const coordinator_chat_options *opt, const char *why)
{
    shoal_diag diag = {{0}};
    char out[256];
    size_t len;
    shoal_err err = coordinator_chat_render(chat, msgs, n, opt, out, sizeof out, &len, &diag);
    CHECK_MSG(err == SHOAL_ERR_INVALID && strstr(diag.msg, why), "'%s': %s '%s'", why,
              shoal_strerror(err), diag.msg);
}

static void bad_conversations_are_refused(void)
{
    shoal_diag diag = {{0}};
    char out[256];
    size_t len;
    coordinator_chat_options opt = {.add_generation_prompt = true};
    coordinator_chat_message ok[] = {{.role = "user", .content = "hi"}};
    coordinator_chat_message bad_role[] = {{.role = "user", .content = "hi"},
                                           {.role = "developer", .content = "x"}};
    coordinator_chat_message no_content[] = {{.role = "user"}};
    coordinator_chat_message no_role[] = {{.content = "x"}};
    refused(qwen3_chat, ok, 0, &opt, "needs a message");
    refused(qwen3_chat, bad_role, 2, &opt, "message 1: role 'developer'");
    refused(llama3_chat, no_content, 1, &opt, "no content");
    refused(qwen3_chat, no_role, 1, &opt, "role '(none)'");
    /* Tool calls only on assistant turns, each with a name and arguments;
     * tools an array. */
    coordinator_chat_tool_call call = {.name = "f", .arguments = "{}"};
    coordinator_chat_tool_call nameless = {.arguments = "{}"};
    coordinator_chat_tool_call argless = {.name = "f"};
    coordinator_chat_message user_call[] = {
        {.role = "user", .content = "hi", .tool_calls = &call, .tool_call_count = 1}};
    coordinator_chat_message bad_call[] = {
        {.role = "user", .content = "hi"},
        {.role = "assistant", .content = "", .tool_calls = &nameless, .tool_call_count = 1}};
    refused(qwen3_chat, user_call, 1, &opt, "only an assistant turn has tool calls");
    refused(llama3_chat, bad_call, 2, &opt, "message 1: tool call 0 has no name");
    bad_call[1].tool_calls = &argless;
    refused(qwen3_chat, bad_call, 2, &opt, "message 1: tool call 0 has no arguments");
    cJSON *not_array = cJSON_CreateObject();
    coordinator_chat_options with_tools = {.add_generation_prompt = true, .tools = not_array};
    refused(qwen3_chat, ok, 1, &with_tools, "tools must be an array");
    cJSON_Delete(not_array);
    /* Too small a buffer: the size needed, nothing written past cap. */
    memset(out, 'x', sizeof out);
    CHECK_EQ_INT(coordinator_chat_render(qwen3_chat, ok, 1, &opt, out, 10, &len, &diag),
                 SHOAL_ERR_LIMIT);
    const char *want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    CHECK_EQ_INT(len, strlen(want));
    CHECK(out[10] == 'x');
    CHECK_EQ_INT(coordinator_chat_render(qwen3_chat, ok, 1, &opt, NULL, 0, &len, &diag),
                 SHOAL_ERR_LIMIT);
    CHECK_EQ_INT(coordinator_chat_render(qwen3_chat, ok, 1, &opt, out, len + 1, &len, &diag),
                 SHOAL_OK);
    CHECK(strcmp(out, want) == 0);
}

int main(void)
{
    shoal_diag diag = {{0}};
    chat_ref = ref_start("ref_chat.js", "'" CHATS "'");
    if (coordinator_chat_open(QWEN3_CONFIG, &qwen3_chat, &diag) != SHOAL_OK ||
        coordinator_chat_open(LLAMA3_CONFIG, &llama3_always_chat, &diag) != SHOAL_OK ||
        coordinator_tokenizer_open(QWEN3_TOKENIZER, &qwen3_tok, &diag) != SHOAL_OK ||
        coordinator_tokenizer_open(LLAMA3_TOKENIZER, &llama3_tok, &diag) != SHOAL_OK) {
        fprintf(stderr, "%s (run tools/setup)\n", diag.msg);
        return 1;
    }
    llama3_chat = open_meta_llama3();
    if (!llama3_chat)
        return 1;
    TEST_RUN(known_templates_are_recognised);
    TEST_RUN(renderings_and_ids_match_the_jinja_reference);
    TEST_RUN(unknown_template_is_refused_not_guessed);
    TEST_RUN(bad_conversations_are_refused);
    coordinator_chat_close(qwen3_chat);
    coordinator_chat_close(llama3_chat);
    coordinator_chat_close(llama3_always_chat);
    coordinator_tokenizer_close(qwen3_tok);
    coordinator_tokenizer_close(llama3_tok);
    return TEST_EXIT();
}
