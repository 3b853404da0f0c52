/* coordinator_limits.h: the bounds of text in and out (tokenizer, chat
 * templates, detokenizer), each with its reason.
 *
 * These belong with the others in common/common_limits.h; they live here
 * until that file takes them, and nothing outside coordinator/ reads them.
 * Input past a bound is refused with SHOAL_ERR_LIMIT and a message naming it. */
#ifndef SHOAL_COORDINATOR_LIMITS_H
#define SHOAL_COORDINATOR_LIMITS_H

/* A tokenizer.json or tokenizer_config.json read whole. Real tokenizer.json
 * files are 2-20 MB (Qwen3: 11 MB, Llama-3: 9 MB). */
#define COORDINATOR_TOKENIZER_FILE_BYTES_MAX (128u * 1024u * 1024u)

/* One text given to encode. A context of SHOAL_CONTEXT_TOKENS_MAX tokens
 * holds about 4 MiB of text; 16 MiB leaves room for long tokens (runs of
 * spaces) while bounding the work and scratch of one call. */
#define COORDINATOR_TEXT_BYTES_MAX (16u * 1024u * 1024u)

/* Bytes of one vocabulary or added token. Real tokens are under 256 bytes;
 * the bound keeps per-token output buffers of the detokenizer small. */
#define COORDINATOR_TOKEN_BYTES_MAX 1024

/* Added (special) tokens of one tokenizer: Llama-3 has 256, Qwen3 26. */
#define COORDINATOR_ADDED_TOKENS_MAX 65536

/* Merges of one BPE model: Llama-3 has 280k. */
#define COORDINATOR_MERGES_MAX (4 * 1024 * 1024)

/* Bytes of the pre-tokenizer's split regex; real ones are ~150 bytes. */
#define COORDINATOR_REGEX_BYTES_MAX 4096

/* Messages in one conversation given to a chat template, and bytes of one
 * chat template (Qwen3's is 4 KiB). */
#define COORDINATOR_CHAT_MESSAGES_MAX 4096
#define COORDINATOR_CHAT_TEMPLATE_BYTES_MAX (1024u * 1024u)

/* ---- the HTTP API (coordinator_request, coordinator_http) ---- */

/* Bytes of one request body. The longest prompt (SHOAL_CONTEXT_TOKENS_MAX
 * tokens) is about 7 MiB as JSON token ids and 4 MiB as text; JSON escapes
 * can grow text up to six times. 32 MiB holds all of that; the server
 * refuses a larger Content-Length with 413 before reading the body, and
 * --max-body-bytes lowers it. */
#define COORDINATOR_BODY_BYTES_MAX (32u * 1024u * 1024u)

/* Nesting of arrays and objects in a request body. The deepest real
 * request (a message whose content is a list of parts) is 4 levels; a
 * bound far under cJSON's own (1000) keeps its recursion shallow. */
#define COORDINATOR_JSON_DEPTH_MAX 32

/* Choices of one request (n): as many as the streams in flight
 * (COORDINATOR_STREAMS_MAX, below); --max-streams bounds it further (a
 * request of more choices than that is a 400, never a 429). Choices past
 * the workers' --parallel wait in their queues like any stream. */
#define COORDINATOR_CHOICES_MAX COORDINATOR_STREAMS_MAX

/* The bytes of all request bodies being read at once (--max-body-memory-mib
 * lowers it): a body that would pass it is answered 503, retry shortly.
 * Without it 4,096 connections of --max-body-bytes each could hold 128
 * GiB. */
#define COORDINATOR_BODIES_BYTES_MAX (1024ull << 20)

/* A request body's first buffer: its Content-Length up to this, then grown
 * (doubled) as the bytes arrive, up to --max-body-bytes. */
#define COORDINATOR_BODY_FIRST_BYTES (64u << 10)

/* Stop strings of one request, and bytes of each. OpenAI allows 4; vLLM
 * sets no bound. Matching costs (stop strings x output bytes), and each
 * stop string keeps a table of its bytes per choice. */
#define COORDINATOR_STOP_STRINGS_MAX 16
#define COORDINATOR_STOP_BYTES_MAX 256

/* Stop token ids of one request (vLLM's stop_token_ids): the worker
 * protocol carries this many (SHM_STOP_IDS_MAX). */
#define COORDINATOR_STOP_IDS_MAX 16

/* Top log-probabilities per token: OpenAI's bound, and what a worker
 * returns at most (SHM_LOGPROBS_MAX). */
#define COORDINATOR_LOGPROBS_MAX 20

/* Tool definitions of one request (`tools`), and tool calls of one
 * assistant message, parsed from a request or from a completion's text.
 * OpenAI allows 128 tools; every definition is rendered into the prompt,
 * so more would crowd the context. 64 calls is far past what a model makes
 * in one turn, and bounds the ids and strings a response builds. */
#define COORDINATOR_TOOLS_MAX 128
#define COORDINATOR_TOOL_CALLS_MAX 64

/* Characters of a function's name: OpenAI's bound, of [A-Za-z0-9_-]. */
#define COORDINATOR_TOOL_NAME_CHARS_MAX 64

/* Bytes of the model name a request names, of cache_salt, and of an API
 * key: far above real ones, low enough to copy onto the stack. */
#define COORDINATOR_NAME_BYTES_MAX 256

/* A client's X-Request-Id: visible ASCII but '"' and '\\', at most
 * this many bytes (vLLM takes any; 128 covers UUIDs and trace ids). */
#define COORDINATOR_REQUEST_ID_BYTES_MAX 128

/* HTTP connections at once, and streams (choices of requests) in flight at
 * once; past the first the listener stops accepting, past the second a
 * request gets 429. Each connection holds a socket and a few KiB. */
#define COORDINATOR_CONNECTIONS_MAX 4096
#define COORDINATOR_STREAMS_MAX 4096

/* Threads that serve HTTP (libmicrohttpd's pool). Tokenizing a long prompt
 * occupies one; one thread streams hundreds of thousands of tokens/s. */
#define COORDINATOR_HTTP_THREADS_MAX 64

#endif
