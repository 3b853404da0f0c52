/* coordinator_toolcall.h: tool calls parsed out of a model's output.
 *
 * A model that was given tools answers with its calls written in the text
 * in its chat template's format; this module turns a finished completion's
 * text into OpenAI's content + tool_calls, as vLLM's tool parsers do:
 *   qwen3    (vLLM's "hermes" parser) each <tool_call>...</tool_call> block
 *            holds one JSON object {"name": string, "arguments": object}.
 *            The content is the text before the first block, trailing
 *            white space trimmed, NULL if nothing is left; text between
 *            and after blocks is dropped. A last block without its
 *            </tool_call> runs to the end of the text (generation stopped
 *            there). If any block is not such an object (bad JSON, no
 *            name, arguments not an object) there are no calls and the
 *            whole text is the content, tags and all, as vLLM answers.
 *   llama3   (vLLM's "llama3_json") the whole text, white space trimmed
 *            and after an optional <|python_tag|>, is one JSON object
 *            {"name": string, "parameters" or "arguments": object}: one
 *            call and no content. Anything else is plain content.
 * Each call's arguments are re-serialized compactly (cJSON_PrintUnformatted)
 * as the string OpenAI's `arguments` is, and each call gets an id
 * "call_" + 24 letters and digits.
 *
 * Pure; any thread, each with its own result. */
#ifndef SHOAL_COORDINATOR_TOOLCALL_H
#define SHOAL_COORDINATOR_TOOLCALL_H

#include "common/common_error.h"
#include "coordinator_chat.h"
#include "coordinator_limits.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "call_" + 24 characters of [A-Za-z0-9], and the NUL. */
enum { COORDINATOR_TOOLCALL_ID_BYTES = 5 + 24 + 1 };

typedef struct coordinator_toolcall {
    char id[COORDINATOR_TOOLCALL_ID_BYTES];
    char *name;      /* NUL-terminated; owned by the result */
    char *arguments; /* compact JSON of the arguments object; owned by the result */
} coordinator_toolcall;

typedef struct coordinator_toolcall_result {
    /* The content: text[0 .. content_bytes) of the text parsed, or none
     * (OpenAI's null) when has_content is false. */
    bool has_content;
    size_t content_bytes;
    int count; /* 0: no calls; the content is then the whole text */
    coordinator_toolcall *calls;
} coordinator_toolcall_result;

/* Parses text (bytes long, need not be NUL-terminated) in format's
 * convention into out, which is owned by the caller until
 * coordinator_toolcall_result_fini. id_rng is the state of the random
 * numbers the call ids come from (common_rng). Text with more than
 * COORDINATOR_TOOL_CALLS_MAX blocks is all content. Errors:
 * SHOAL_ERR_NOMEM (out is then empty). */
shoal_err coordinator_toolcall_parse(coordinator_chat_format format, const char *text, size_t bytes,
                                     uint64_t *id_rng, coordinator_toolcall_result *out);

/* Frees what out holds; it is empty afterwards. Idempotent. */
void coordinator_toolcall_result_fini(coordinator_toolcall_result *out);

/* How many bytes at the start of text (a choice's output so far) cannot
 * become part of a tool call, whatever follows: a stream sends these as
 * content and holds the rest until the choice ends. Qwen3: up to the
 * first <tool_call>, or up to a tail that may be the start of one. Llama
 * 3: none while the text is white space or starts as a JSON object or
 * <|python_tag|> does, else all of it. Never decreases as text grows. */
size_t coordinator_toolcall_plain_prefix(coordinator_chat_format format, const char *text,
                                         size_t bytes);

#endif
