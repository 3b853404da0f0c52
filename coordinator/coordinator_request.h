/* coordinator_request.h: an HTTP API request body, parsed and checked.
 *
 * Turns the JSON body of POST /v1/chat/completions, /v1/completions,
 * /tokenize and /detokenize into a coordinator_request, and refuses what
 * cannot run with an OpenAI-style error that names the field (HTTP 400,
 * or 404 for a model that is not served). Fields and their ranges follow
 * OpenAI's API and vLLM's extensions of it. A field this server does not
 * read is a 400 naming it, or, with limits.ignore_unknown_fields, ignored
 * and named for a warning (vLLM's behaviour); a field of theirs that
 * changes the output and that this server does not do (min_tokens,
 * guided_json, ...) is a 400 either way. null means "not given" for every
 * optional field.
 *
 * What is checked, before anything is allocated for the request: the body
 * is valid UTF-8, JSON of at most COORDINATOR_JSON_DEPTH_MAX levels; every
 * field has its type and range; counts (messages, tools, tool calls of a
 * message, stop strings, stop ids, n, top log-probabilities) are within
 * coordinator_limits.h; a token-id
 * prompt has at most max_model_len ids, each below the vocabulary. Then
 * coordinator_request_prompt builds the prompt's ids (chat template and
 * tokenizer) with a bound of max_model_len tokens, and
 * coordinator_request_fit checks prompt + max_tokens against the context.
 *
 * Pure: no I/O, no global state; any thread may parse, each its own
 * request. The fuzz target tests/fuzz/fuzz_api_request.c runs all three
 * steps on arbitrary bodies. */
#ifndef SHOAL_COORDINATOR_REQUEST_H
#define SHOAL_COORDINATOR_REQUEST_H

#include "common/common_error.h"
#include "coordinator_chat.h"
#include "coordinator_limits.h"
#include "coordinator_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum coordinator_request_kind {
    COORDINATOR_REQUEST_CHAT,       /* POST /v1/chat/completions */
    COORDINATOR_REQUEST_COMPLETION, /* POST /v1/completions */
    COORDINATOR_REQUEST_TOKENIZE,   /* POST /tokenize (vLLM's, and llama.cpp's `content`) */
    COORDINATOR_REQUEST_DETOKENIZE, /* POST /detokenize */
} coordinator_request_kind;

/* An error for the client: OpenAI's {"error": {message, type, param, code}}
 * with its HTTP status. */
typedef struct coordinator_api_error {
    int status;       /* 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type; /* "invalid_request_error", "authentication_error", ... (static) */
    const char *code; /* a static code ("model_not_found"), or NULL */
    char param[64];   /* the field at fault ("messages[2].content"), or "" */
    char message[SHOAL_DIAG_BYTES];
} coordinator_api_error;

/* Fills err (status, type, param may be NULL, printf-style message). */
void coordinator_api_error_set(coordinator_api_error *err, int status, const char *type,
                               const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* What a request is checked against: the served model. */
typedef struct coordinator_request_limits {
    const char *model;      /* the served model name; another in `model` is a 404 */
    int max_model_len;      /* prompt + output tokens of one stream */
    int vocab;              /* token ids are below this (the model's vocabulary) */
    int default_max_tokens; /* 0: the rest of the context, as vLLM */
    /* A field no kind of request reads: a 400 naming it (false), or
     * ignored and named in coordinator_request.ignored_fields (true,
     * vLLM's behaviour), for the caller to log. */
    bool ignore_unknown_fields;
} coordinator_request_limits;

/* tool_choice. Only the two that need no constrained decoding exist:
 * "required" and a named function are refused (400) at parse. */
typedef enum coordinator_tool_choice {
    COORDINATOR_TOOL_CHOICE_NONE, /* tools rendered, the output not parsed for calls */
    COORDINATOR_TOOL_CHOICE_AUTO, /* the model decides; the output is parsed for calls */
} coordinator_tool_choice;

/* Sampling, as OpenAI and vLLM name it; the defaults turn each off. */
typedef struct coordinator_request_sampling {
    float temperature;        /* >= 0, default 1; 0 is greedy */
    float top_p;              /* (0, 1], default 1 */
    int32_t top_k;            /* -1 or 0: off (default); else >= 1 */
    float min_p;              /* [0, 1], default 0 */
    float presence_penalty;   /* [-2, 2], default 0 */
    float frequency_penalty;  /* [-2, 2], default 0 */
    float repetition_penalty; /* > 0, default 1 */
    bool has_seed;
    uint64_t seed; /* a negative JSON seed is taken modulo 2^64 */
} coordinator_request_sampling;

typedef struct coordinator_request {
    coordinator_request_kind kind;

    /* The prompt: messages (chat; tokenize with `messages`), text
     * (completion, tokenize), or ids (completion, detokenize). Strings
     * point into the parsed body, which the request owns. */
    coordinator_chat_message *messages;
    size_t message_count;
    const char *prompt_text;
    size_t prompt_text_bytes;
    int32_t *prompt_ids;
    int prompt_id_count;
    bool has_prompt_ids;

    /* Rendering and tokenizing the prompt. */
    bool add_generation_prompt;         /* chat: default true */
    coordinator_chat_thinking thinking; /* chat_template_kwargs.enable_thinking */
    /* Tools (chat, and tokenize with messages): the `tools` array as sent,
     * each entry checked ({"type": "function", "function": {"name", ...}}),
     * in the parsed body; NULL when absent or empty. */
    const struct cJSON *tools;
    int tool_count; /* 0..COORDINATOR_TOOLS_MAX */
    /* "auto" by default when tools are given, else "none". */
    coordinator_tool_choice tool_choice;
    bool parallel_tool_calls;           /* accepted; default true (the model's choice either way) */
    bool add_special_tokens;            /* default: true for text prompts, false for chat */
    bool return_token_strs;             /* tokenize */

    /* Generation. */
    int max_tokens; /* 0: not given */
    coordinator_request_sampling sampling;
    int n;            /* choices, 1..COORDINATOR_CHOICES_MAX */
    bool logprobs;    /* return the chosen token's log-probability */
    int top_logprobs; /* and this many alternatives, 0..COORDINATOR_LOGPROBS_MAX */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    int stop_count;
    const char *stop[COORDINATOR_STOP_STRINGS_MAX];
    size_t stop_bytes[COORDINATOR_STOP_STRINGS_MAX];
    int stop_id_count; /* vLLM's stop_token_ids */
    int32_t stop_ids[COORDINATOR_STOP_IDS_MAX];
    bool ignore_eos;          /* vLLM's ignore_eos */
    bool include_stop_str_in_output; /* vLLM's: a matched stop string stays in the text */
    bool echo; /* completions: each choice's text starts with the prompt */
    bool skip_special_tokens; /* vLLM's; default true */
    bool return_token_ids;    /* vLLM's: prompt_token_ids and each choice's token_ids */
    const char *cache_salt;   /* NULL if none; 1..COORDINATOR_NAME_BYTES_MAX bytes */
    size_t cache_salt_bytes;

    /* The unknown fields ignored (limits.ignore_unknown_fields), quoted
     * and joined ("'a', 'b'"), or "" for none. */
    char ignored_fields[256];

    /* private */
    void *json_;
    coordinator_chat_tool_call *calls_; /* every message's tool_calls, one array */
    struct cJSON **call_args_;          /* the parsed arguments of calls_ */
    size_t call_count_;
} coordinator_request;

/* Parses and checks body (bytes long, need not be NUL-terminated) as a
 * request of this kind. On success r holds the request; free it with
 * coordinator_request_fini. On failure r is empty (fini is still
 * allowed) and err says why: 400 (malformed JSON, a field of the wrong
 * type or out of range, a count past its bound, an unsupported feature
 * such as tool_choice "required"), 404 (another model). SHOAL_ERR_NOMEM gives a 500 err;
 * every other failure is SHOAL_ERR_INVALID. */
shoal_err coordinator_request_parse(coordinator_request_kind kind, const char *body, size_t bytes,
                                    const coordinator_request_limits *limits,
                                    coordinator_request *r, coordinator_api_error *err);

/* Checks a client's X-Request-Id header value: 1 to
 * COORDINATOR_REQUEST_ID_BYTES_MAX bytes of visible ASCII (0x21-0x7e)
 * but '"' and '\\', so that it goes into a JSON id and a header as it is.
 * A 400 naming the header otherwise. */
shoal_err coordinator_request_id_check(const char *value, coordinator_api_error *err);

/* Frees what the request holds; it is empty afterwards. Idempotent. */
void coordinator_request_fini(coordinator_request *r);

/* Builds the prompt's token ids into ids[0..cap) and sets *n_ids: renders
 * the messages with chat (which may be NULL when the model has none: a
 * 400 for a chat request) and encodes them, or encodes the text, or copies
 * the ids. A prompt longer than cap tokens is refused (400) after at most
 * cap tokens of work; pass cap = max_model_len. An empty prompt is a 400.
 * work is the tokenizer's work area of the calling thread. */
shoal_err coordinator_request_prompt(const coordinator_request *r, const coordinator_tokenizer *tok,
                                     const coordinator_chat *chat, coordinator_tokenizer_work *work,
                                     int32_t *ids, size_t cap, size_t *n_ids,
                                     coordinator_api_error *err);

/* Checks a prompt of prompt_len tokens with the request's max_tokens
 * against the context and sets *max_tokens to what each choice may
 * produce (max_tokens, or the rest of the context when not given). 400
 * when the prompt leaves no room or prompt + max_tokens passes it. */
shoal_err coordinator_request_fit(const coordinator_request *r, int prompt_len,
                                  const coordinator_request_limits *limits, int *max_tokens,
                                  coordinator_api_error *err);

#endif
