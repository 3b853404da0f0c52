/* coordinator_response.h: the JSON bodies and SSE chunks the API sends.
 *
 * Whole bodies (a finished completion, an error, /v1/models, /tokenize,
 * /detokenize) are built with cJSON. Streamed chunks are written straight
 * into the request's buffer: their envelope (id, object, created, model) is
 * formatted once per request, and each chunk adds the text, token ids and
 * log-probabilities of the tokens it carries, so a streamed token costs no
 * allocation. Every chunk is one SSE event, "data: {json}\n\n"; a stream
 * ends with "data: [DONE]\n\n". Shapes follow OpenAI's API, with vLLM's
 * token_ids / prompt_token_ids where the request asked for them.
 *
 * Pure functions; any thread, each with its own buffers. */
#ifndef SHOAL_COORDINATOR_RESPONSE_H
#define SHOAL_COORDINATOR_RESPONSE_H

#include "coordinator_buf.h"
#include "coordinator_limits.h"
#include "coordinator_request.h"
#include "coordinator_tokenizer.h"
#include "coordinator_toolcall.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A token's log-probability and its top alternatives, as a worker reports
 * them. */
typedef struct coordinator_token_logprob {
    int32_t token;
    float logprob;
    int32_t top_count;
    int32_t top_ids[COORDINATOR_LOGPROBS_MAX];
    float top_logprobs[COORDINATOR_LOGPROBS_MAX];
} coordinator_token_logprob;

/* usage: prompt, completion and cached prompt tokens. */
typedef struct coordinator_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
} coordinator_usage;

/* What every body and chunk of one response names. */
typedef struct coordinator_response_meta {
    coordinator_request_kind kind;    /* CHAT or COMPLETION */
    /* "chatcmpl-<id>" or "cmpl-<id>": <id> the client's X-Request-Id, else
     * 16 random hex digits */
    char id[16 + COORDINATOR_REQUEST_ID_BYTES_MAX];
    /* the X-Request-Id header of the answer: the client's, else id */
    char request_id[16 + COORDINATOR_REQUEST_ID_BYTES_MAX];
    long long created;                /* Unix seconds */
    const char *model;                /* the served name; must outlive the meta */
    const coordinator_tokenizer *tok; /* token strings of log-probabilities */
    int top_logprobs;                 /* alternatives per token the request asked for */
} coordinator_response_meta;

/* Fills meta: id from the client's request id (NULL: none; checked by
 * coordinator_request_id_check), else from 64 random bits. */
void coordinator_response_meta_init(coordinator_response_meta *m, coordinator_request_kind kind,
                                    const char *model, const coordinator_tokenizer *tok,
                                    int top_logprobs, const char *client_id, uint64_t id_bits,
                                    long long created);

/* What ended a choice with finish_reason "stop", as vLLM's stop_reason
 * says it: a stop string (text set), a stop token id of stop_token_ids
 * (by_token), or null (neither: the model's end of text). */
typedef struct coordinator_stop_reason {
    const char *text; /* the stop string, not NUL-terminated, or NULL */
    size_t text_bytes;
    bool by_token;
    int32_t token;
} coordinator_stop_reason;

/* One finished choice of a non-streamed response. */
typedef struct coordinator_choice_out {
    const char *text;
    size_t text_bytes;
    const int32_t *token_ids; /* NULL unless return_token_ids */
    int token_count;
    const coordinator_token_logprob *logprobs; /* NULL unless logprobs were asked for */
    int logprob_count;
    const char *finish_reason; /* "stop", "length", "tool_calls", or NULL */
    /* Chat: the calls read from text (NULL, or a count of 0: none). With
     * calls the message's content is the result's (text's first
     * content_bytes, or null) and its tool_calls list them. */
    const coordinator_toolcall_result *tool_calls;
    coordinator_stop_reason stop_reason;
} coordinator_choice_out;

/* The body of a finished (non-streamed) chat completion or completion
 * into out (cleared first). prompt_ids (NULL unless return_token_ids):
 * the prompt's ids, as prompt_token_ids. false if memory ran out. */
bool coordinator_response_body(coordinator_buf *out, const coordinator_response_meta *m,
                               const coordinator_choice_out *choices, int n,
                               const coordinator_usage *usage, const int32_t *prompt_ids,
                               int prompt_len);

/* One streamed chunk's content for one choice. */
typedef struct coordinator_chunk {
    int index;
    bool role;        /* chat: the first chunk, delta {"role":"assistant","content":""} */
    const char *text; /* new text (may be empty) */
    size_t text_bytes;
    const int32_t *token_ids; /* new token ids (return_token_ids), or NULL */
    int token_count;
    const coordinator_token_logprob *logprobs; /* for the new tokens, or NULL */
    int logprob_count;
    const char *finish_reason; /* set on the last chunk of the choice */
    coordinator_stop_reason stop_reason; /* with finish_reason */
    const int32_t *prompt_ids; /* return_token_ids: with the first chunk, or NULL */
    int prompt_len;
    bool usage_null; /* include_usage: every chunk but the last says "usage":null */
    /* Chat: a whole tool call as this chunk's delta, {"tool_calls":
     * [{"index": tool_index, "id", "type": "function", "function": {"name",
     * "arguments"}}]}, in place of content (NULL: none). */
    const coordinator_toolcall *tool_call;
    int tool_index;
} coordinator_chunk;

/* Appends one SSE event with this chunk to out. */
void coordinator_response_chunk(coordinator_buf *out, const coordinator_response_meta *m,
                                const coordinator_chunk *c);

/* Appends the usage event of a stream with include_usage (choices []). */
void coordinator_response_chunk_usage(coordinator_buf *out, const coordinator_response_meta *m,
                                      const coordinator_usage *usage);

/* Appends an error event (a failure after the stream began), as vLLM
 * sends it: data: {"error": {...}}. */
void coordinator_response_chunk_error(coordinator_buf *out, const coordinator_api_error *err);

/* Appends "data: [DONE]\n\n". */
void coordinator_response_chunk_done(coordinator_buf *out);

/* {"error": {"message", "type", "param", "code"}} into out (cleared first). */
bool coordinator_response_error(coordinator_buf *out, const coordinator_api_error *err);

/* GET /v1/models (a list of the one model), or with `one`
 * GET /v1/models/{model} (the model object alone). */
bool coordinator_response_models(coordinator_buf *out, const char *model, long long created,
                                 int max_model_len, bool one);

/* POST /tokenize: {"count", "max_model_len", "tokens", "token_strs"}. */
bool coordinator_response_tokenize(coordinator_buf *out, const coordinator_tokenizer *tok,
                                   const int32_t *ids, int n, int max_model_len, bool token_strs);

/* POST /detokenize: {"prompt": text}. */
bool coordinator_response_detokenize(coordinator_buf *out, const char *text, size_t bytes);

/* A token's text for log-probabilities: its bytes with any incomplete or
 * ill-formed UTF-8 replaced by U+FFFD, into out (at least
 * 3 * COORDINATOR_TOKEN_BYTES_MAX + 1 bytes, NUL-terminated). Returns the
 * length; *raw and *raw_bytes get the token's bytes. */
size_t coordinator_response_token_text(const coordinator_tokenizer *tok, int32_t id, char *out,
                                       const unsigned char **raw, size_t *raw_bytes);

#endif
