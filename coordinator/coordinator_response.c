#include "coordinator_response.h"

#include "coordinator_utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOKEN_TEXT_BYTES = 3 * COORDINATOR_TOKEN_BYTES_MAX + 1 };

void coordinator_response_meta_init(coordinator_response_meta *m, coordinator_request_kind kind,
                                    const char *model, const coordinator_tokenizer *tok,
                                    int top_logprobs, const char *client_id, uint64_t id_bits,
                                    long long created)
{
    m->kind = kind;
    const char *prefix = kind == COORDINATOR_REQUEST_CHAT ? "chatcmpl" : "cmpl";
    if (client_id)
        snprintf(m->id, sizeof m->id, "%s-%s", prefix, client_id);
    else
        snprintf(m->id, sizeof m->id, "%s-%016llx", prefix, (unsigned long long)id_bits);
    snprintf(m->request_id, sizeof m->request_id, "%s", client_id ? client_id : m->id);
    m->created = created;
    m->model = model;
    m->tok = tok;
    m->top_logprobs = top_logprobs;
}

size_t coordinator_response_token_text(const coordinator_tokenizer *tok, int32_t id, char *out,
                                       const unsigned char **raw, size_t *raw_bytes)
{
    const unsigned char *b = NULL;
    size_t n = tok ? coordinator_tokenizer_token_bytes(tok, id, &b) : 0;
    *raw = b;
    *raw_bytes = n;
    size_t len = n ? coordinator_utf8_lossy(b, n, (unsigned char *)out) : 0;
    out[len] = '\0';
    return len;
}

static double finite_logprob(float v)
{
    return isfinite(v) ? (double)v : -9999.0;
}

/* ---- whole bodies (cJSON) ---- */

/* Prints root into out, then frees root. */
static bool print_into(coordinator_buf *out, cJSON *root)
{
    coordinator_buf_clear(out);
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return false;
    coordinator_buf_str(out, text);
    free(text);
    return !coordinator_buf_failed(out);
}

static cJSON *int_array(const int32_t *ids, int n)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        cJSON *v = cJSON_CreateNumber(ids[i]);
        if (!v) {
            cJSON_Delete(arr);
            return NULL;
        }
        cJSON_AddItemToArray(arr, v);
    }
    return arr;
}

static cJSON *bytes_array(const unsigned char *b, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(b[i]));
    return arr;
}

/* {"token", "logprob", "bytes"} of one id. */
static cJSON *logprob_entry(const coordinator_tokenizer *tok, int32_t id, float lp, char *text)
{
    const unsigned char *raw;
    size_t raw_bytes;
    coordinator_response_token_text(tok, id, text, &raw, &raw_bytes);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", text);
    cJSON_AddNumberToObject(e, "logprob", finite_logprob(lp));
    cJSON_AddItemToObject(e, "bytes", bytes_array(raw, raw_bytes));
    return e;
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}. */
static cJSON *chat_logprobs(const coordinator_response_meta *m, const coordinator_token_logprob *lp,
                            int n, char *text)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(obj, "content");
    for (int i = 0; i < n; i++) {
        cJSON *e = logprob_entry(m->tok, lp[i].token, lp[i].logprob, text);
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        int k = lp[i].top_count < m->top_logprobs ? lp[i].top_count : m->top_logprobs;
        for (int j = 0; j < k; j++)
            cJSON_AddItemToArray(
                top, logprob_entry(m->tok, lp[i].top_ids[j], lp[i].top_logprobs[j], text));
        cJSON_AddItemToArray(content, e);
    }
    return obj;
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static cJSON *completion_logprobs(const coordinator_response_meta *m,
                                  const coordinator_token_logprob *lp, int n, char *text)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(obj, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(obj, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(obj, "top_logprobs");
    cJSON *offsets = cJSON_AddArrayToObject(obj, "text_offset");
    long long offset = 0;
    for (int i = 0; i < n; i++) {
        const unsigned char *raw;
        size_t raw_bytes;
        size_t len = coordinator_response_token_text(m->tok, lp[i].token, text, &raw, &raw_bytes);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(text));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(finite_logprob(lp[i].logprob)));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        offset += (long long)len;
        cJSON *top = cJSON_CreateObject();
        int k = lp[i].top_count < m->top_logprobs ? lp[i].top_count : m->top_logprobs;
        for (int j = 0; j < k; j++) {
            coordinator_response_token_text(m->tok, lp[i].top_ids[j], text, &raw, &raw_bytes);
            cJSON_AddNumberToObject(top, text, finite_logprob(lp[i].top_logprobs[j]));
        }
        cJSON_AddItemToArray(tops, top);
    }
    return obj;
}

static cJSON *usage_object(const coordinator_usage *u)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddNumberToObject(obj, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(obj, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(obj, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *details = cJSON_AddObjectToObject(obj, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", u->cached_tokens);
    return obj;
}

/* A string of exactly n bytes (cJSON takes NUL-terminated strings; the
 * text never holds a NUL, which JSON input cannot produce and the
 * detokenizer passes through only from a token of that byte). */
static cJSON *string_n(const char *s, size_t n)
{
    char *copy = malloc(n + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, n);
    copy[n] = '\0';
    cJSON *v = cJSON_CreateString(copy);
    free(copy);
    return v;
}

bool coordinator_response_body(coordinator_buf *out, const coordinator_response_meta *m,
                               const coordinator_choice_out *choices, int n,
                               const coordinator_usage *usage, const int32_t *prompt_ids,
                               int prompt_len)
{
    bool chat = m->kind == COORDINATOR_REQUEST_CHAT;
    char *text = malloc(TOKEN_TEXT_BYTES);
    cJSON *root = text ? cJSON_CreateObject() : NULL;
    if (!root) {
        free(text);
        return false;
    }
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n; i++) {
        const coordinator_choice_out *c = &choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            const coordinator_toolcall_result *tc = c->tool_calls;
            if (tc && tc->count > 0) {
                if (tc->has_content)
                    cJSON_AddItemToObject(msg, "content", string_n(c->text, tc->content_bytes));
                else
                    cJSON_AddNullToObject(msg, "content");
                cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
                for (int j = 0; j < tc->count; j++) {
                    cJSON *call = cJSON_CreateObject();
                    cJSON_AddItemToArray(calls, call);
                    cJSON_AddStringToObject(call, "id", tc->calls[j].id);
                    cJSON_AddStringToObject(call, "type", "function");
                    cJSON *fn = cJSON_AddObjectToObject(call, "function");
                    cJSON_AddStringToObject(fn, "name", tc->calls[j].name);
                    cJSON_AddStringToObject(fn, "arguments", tc->calls[j].arguments);
                }
            } else {
                cJSON_AddItemToObject(msg, "content", string_n(c->text, c->text_bytes));
            }
        } else {
            cJSON_AddItemToObject(ch, "text", string_n(c->text, c->text_bytes));
        }
        if (c->logprobs)
            cJSON_AddItemToObject(
                ch, "logprobs",
                chat ? chat_logprobs(m, c->logprobs, c->logprob_count, text)
                     : completion_logprobs(m, c->logprobs, c->logprob_count, text));
        else
            cJSON_AddNullToObject(ch, "logprobs");
        if (c->finish_reason)
            cJSON_AddStringToObject(ch, "finish_reason", c->finish_reason);
        else
            cJSON_AddNullToObject(ch, "finish_reason");
        if (c->stop_reason.text)
            cJSON_AddItemToObject(ch, "stop_reason",
                                  string_n(c->stop_reason.text, c->stop_reason.text_bytes));
        else if (c->stop_reason.by_token)
            cJSON_AddNumberToObject(ch, "stop_reason", c->stop_reason.token);
        else
            cJSON_AddNullToObject(ch, "stop_reason");
        if (c->token_ids) {
            if (!chat && prompt_ids)
                cJSON_AddItemToObject(ch, "prompt_token_ids", int_array(prompt_ids, prompt_len));
            cJSON_AddItemToObject(ch, "token_ids", int_array(c->token_ids, c->token_count));
        }
    }
    if (chat && prompt_ids)
        cJSON_AddItemToObject(root, "prompt_token_ids", int_array(prompt_ids, prompt_len));
    cJSON_AddItemToObject(root, "usage", usage_object(usage));
    free(text);
    return print_into(out, root);
}

bool coordinator_response_error(coordinator_buf *out, const coordinator_api_error *err)
{
    /* The message and the param quote the client's input and are cut to
     * fit their buffers, maybe inside a character: they go out as valid
     * UTF-8. */
    char message[3 * sizeof err->message], param[3 * sizeof err->param];
    size_t len = strnlen(err->message, sizeof err->message);
    len =
        coordinator_utf8_lossy((const unsigned char *)err->message, len, (unsigned char *)message);
    message[len] = '\0';
    len = strnlen(err->param, sizeof err->param);
    len = coordinator_utf8_lossy((const unsigned char *)err->param, len, (unsigned char *)param);
    param[len] = '\0';
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (param[0])
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    return print_into(out, root);
}

bool coordinator_response_models(coordinator_buf *out, const char *model, long long created,
                                 int max_model_len, bool one)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "shoal");
    cJSON_AddStringToObject(m, "root", model);
    cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
    if (one)
        return print_into(out, m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, m);
    return print_into(out, root);
}

bool coordinator_response_tokenize(coordinator_buf *out, const coordinator_tokenizer *tok,
                                   const int32_t *ids, int n, int max_model_len, bool token_strs)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "count", n);
    cJSON_AddNumberToObject(root, "max_model_len", max_model_len);
    cJSON_AddItemToObject(root, "tokens", int_array(ids, n));
    if (token_strs) {
        char *text = malloc(TOKEN_TEXT_BYTES);
        cJSON *strs = cJSON_AddArrayToObject(root, "token_strs");
        for (int i = 0; text && i < n; i++) {
            const unsigned char *raw;
            size_t raw_bytes;
            coordinator_response_token_text(tok, ids[i], text, &raw, &raw_bytes);
            cJSON_AddItemToArray(strs, cJSON_CreateString(text));
        }
        if (!text) {
            cJSON_Delete(root);
            root = NULL;
        }
        free(text);
    } else {
        cJSON_AddNullToObject(root, "token_strs");
    }
    return print_into(out, root);
}

bool coordinator_response_detokenize(coordinator_buf *out, const char *text, size_t bytes)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "prompt", string_n(text, bytes));
    return print_into(out, root);
}

/* ---- streamed chunks (written directly) ---- */

/* `data: {"id":"...","object":"...","created":N,"model":"...",` */
static void chunk_envelope(coordinator_buf *out, const coordinator_response_meta *m)
{
    coordinator_buf_str(out, "data: {\"id\":");
    coordinator_buf_json_string(out, m->id, strlen(m->id));
    coordinator_buf_str(out, m->kind == COORDINATOR_REQUEST_CHAT
                                 ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                                 : ",\"object\":\"text_completion\",\"created\":");
    coordinator_buf_int(out, m->created);
    coordinator_buf_str(out, ",\"model\":");
    coordinator_buf_json_string(out, m->model, strlen(m->model));
    coordinator_buf_str(out, ",");
}

static void ids_json(coordinator_buf *out, const int32_t *ids, int n)
{
    coordinator_buf_str(out, "[");
    for (int i = 0; i < n; i++) {
        if (i)
            coordinator_buf_str(out, ",");
        coordinator_buf_int(out, ids[i]);
    }
    coordinator_buf_str(out, "]");
}

static void entry_json(coordinator_buf *out, const coordinator_tokenizer *tok, int32_t id, float lp,
                       char *text)
{
    const unsigned char *raw;
    size_t raw_bytes;
    size_t len = coordinator_response_token_text(tok, id, text, &raw, &raw_bytes);
    coordinator_buf_str(out, "{\"token\":");
    coordinator_buf_json_string(out, text, len);
    coordinator_buf_str(out, ",\"logprob\":");
    coordinator_buf_json_float(out, lp);
    coordinator_buf_str(out, ",\"bytes\":");
    coordinator_buf_json_bytes(out, raw, raw_bytes);
}

static void chunk_logprobs(coordinator_buf *out, const coordinator_response_meta *m,
                           const coordinator_chunk *c)
{
    char text[TOKEN_TEXT_BYTES];
    if (m->kind == COORDINATOR_REQUEST_CHAT) {
        coordinator_buf_str(out, "{\"content\":[");
        for (int i = 0; i < c->logprob_count; i++) {
            const coordinator_token_logprob *lp = &c->logprobs[i];
            if (i)
                coordinator_buf_str(out, ",");
            entry_json(out, m->tok, lp->token, lp->logprob, text);
            coordinator_buf_str(out, ",\"top_logprobs\":[");
            int k = lp->top_count < m->top_logprobs ? lp->top_count : m->top_logprobs;
            for (int j = 0; j < k; j++) {
                if (j)
                    coordinator_buf_str(out, ",");
                entry_json(out, m->tok, lp->top_ids[j], lp->top_logprobs[j], text);
                coordinator_buf_str(out, "}");
            }
            coordinator_buf_str(out, "]}");
        }
        coordinator_buf_str(out, "]}");
        return;
    }
    /* Completions: text_offset counts from the start of this chunk's text;
     * a client that needs absolute offsets adds the text it has. */
    const unsigned char *raw;
    size_t raw_bytes;
    coordinator_buf_str(out, "{\"tokens\":[");
    for (int i = 0; i < c->logprob_count; i++) {
        size_t len =
            coordinator_response_token_text(m->tok, c->logprobs[i].token, text, &raw, &raw_bytes);
        if (i)
            coordinator_buf_str(out, ",");
        coordinator_buf_json_string(out, text, len);
    }
    coordinator_buf_str(out, "],\"token_logprobs\":[");
    for (int i = 0; i < c->logprob_count; i++) {
        if (i)
            coordinator_buf_str(out, ",");
        coordinator_buf_json_float(out, c->logprobs[i].logprob);
    }
    coordinator_buf_str(out, "],\"top_logprobs\":[");
    for (int i = 0; i < c->logprob_count; i++) {
        const coordinator_token_logprob *lp = &c->logprobs[i];
        coordinator_buf_str(out, i ? ",{" : "{");
        int k = lp->top_count < m->top_logprobs ? lp->top_count : m->top_logprobs;
        for (int j = 0; j < k; j++) {
            size_t len =
                coordinator_response_token_text(m->tok, lp->top_ids[j], text, &raw, &raw_bytes);
            if (j)
                coordinator_buf_str(out, ",");
            coordinator_buf_json_string(out, text, len);
            coordinator_buf_str(out, ":");
            coordinator_buf_json_float(out, lp->top_logprobs[j]);
        }
        coordinator_buf_str(out, "}");
    }
    coordinator_buf_str(out, "],\"text_offset\":[");
    long long offset = 0;
    for (int i = 0; i < c->logprob_count; i++) {
        size_t len =
            coordinator_response_token_text(m->tok, c->logprobs[i].token, text, &raw, &raw_bytes);
        if (i)
            coordinator_buf_str(out, ",");
        coordinator_buf_int(out, offset);
        offset += (long long)len;
    }
    coordinator_buf_str(out, "]}");
}

void coordinator_response_chunk(coordinator_buf *out, const coordinator_response_meta *m,
                                const coordinator_chunk *c)
{
    bool chat = m->kind == COORDINATOR_REQUEST_CHAT;
    chunk_envelope(out, m);
    if (chat && c->prompt_ids) {
        coordinator_buf_str(out, "\"prompt_token_ids\":");
        ids_json(out, c->prompt_ids, c->prompt_len);
        coordinator_buf_str(out, ",");
    }
    coordinator_buf_str(out, "\"choices\":[{\"index\":");
    coordinator_buf_int(out, c->index);
    if (chat) {
        coordinator_buf_str(out, ",\"delta\":{");
        if (c->tool_call) {
            const coordinator_toolcall *t = c->tool_call;
            coordinator_buf_str(out, "\"tool_calls\":[{\"index\":");
            coordinator_buf_int(out, c->tool_index);
            coordinator_buf_str(out, ",\"id\":");
            coordinator_buf_json_string(out, t->id, strlen(t->id));
            coordinator_buf_str(out, ",\"type\":\"function\",\"function\":{\"name\":");
            coordinator_buf_json_string(out, t->name, strlen(t->name));
            coordinator_buf_str(out, ",\"arguments\":");
            coordinator_buf_json_string(out, t->arguments, strlen(t->arguments));
            coordinator_buf_str(out, "}}]");
        } else if (c->role) {
            coordinator_buf_str(out, "\"role\":\"assistant\",\"content\":");
            coordinator_buf_json_string(out, c->text, c->text_bytes);
        } else if (c->text_bytes || !c->finish_reason) {
            coordinator_buf_str(out, "\"content\":");
            coordinator_buf_json_string(out, c->text, c->text_bytes);
        }
        coordinator_buf_str(out, "}");
    } else {
        coordinator_buf_str(out, ",\"text\":");
        coordinator_buf_json_string(out, c->text, c->text_bytes);
    }
    coordinator_buf_str(out, ",\"logprobs\":");
    if (c->logprobs && c->logprob_count > 0)
        chunk_logprobs(out, m, c);
    else
        coordinator_buf_str(out, "null");
    coordinator_buf_str(out, ",\"finish_reason\":");
    if (c->finish_reason)
        coordinator_buf_json_string(out, c->finish_reason, strlen(c->finish_reason));
    else
        coordinator_buf_str(out, "null");
    if (c->finish_reason) { /* vLLM's: on the chunk that ends the choice */
        coordinator_buf_str(out, ",\"stop_reason\":");
        if (c->stop_reason.text)
            coordinator_buf_json_string(out, c->stop_reason.text, c->stop_reason.text_bytes);
        else if (c->stop_reason.by_token)
            coordinator_buf_int(out, c->stop_reason.token);
        else
            coordinator_buf_str(out, "null");
    }
    if (!chat && c->prompt_ids) {
        coordinator_buf_str(out, ",\"prompt_token_ids\":");
        ids_json(out, c->prompt_ids, c->prompt_len);
    }
    if (c->token_ids) {
        coordinator_buf_str(out, ",\"token_ids\":");
        ids_json(out, c->token_ids, c->token_count);
    }
    coordinator_buf_str(out, c->usage_null ? "}],\"usage\":null}\n\n" : "}]}\n\n");
}

void coordinator_response_chunk_usage(coordinator_buf *out, const coordinator_response_meta *m,
                                      const coordinator_usage *u)
{
    chunk_envelope(out, m);
    coordinator_buf_printf(out,
                           "\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":"
                           "%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":"
                           "%d}}}\n\n",
                           u->prompt_tokens, u->completion_tokens,
                           u->prompt_tokens + u->completion_tokens, u->cached_tokens);
}

void coordinator_response_chunk_error(coordinator_buf *out, const coordinator_api_error *err)
{
    coordinator_buf body;
    coordinator_buf_init(&body);
    if (coordinator_response_error(&body, err)) {
        coordinator_buf_str(out, "data: ");
        coordinator_buf_append(out, body.data, body.len);
        coordinator_buf_str(out, "\n\n");
    } else {
        out->failed = true;
    }
    coordinator_buf_fini(&body);
}

void coordinator_response_chunk_done(coordinator_buf *out)
{
    coordinator_buf_str(out, "data: [DONE]\n\n");
}
