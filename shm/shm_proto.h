/* shm_proto.h: the messages between the coordinator and its workers.
 *
 * Each message is one nng message on a pair socket (ipc:// in the runtime
 * directory): a 16-byte header (magic, version, type, total bytes, count)
 * and a fixed-layout, little-endian body. Every received message is checked
 * by shm_proto_check before use: magic, version, type, and a size that
 * matches the type and its count exactly, and a load with no negative
 * count. No pointers cross: ids do.
 *
 *   coordinator -> worker   SUBMIT (a stream and its prompt), CANCEL, SHUTDOWN
 *   worker -> coordinator   HELLO (once, after the model loaded), STEP (every
 *                           token one engine step produced, and the worker's
 *                           load), REJECT (a SUBMIT the engine refused),
 *                           HEARTBEAT (while idle) */
#ifndef SHOAL_SHM_PROTO_H
#define SHOAL_SHM_PROTO_H

#include "common/common_error.h"
#include "common/common_hash.h"

#include <stddef.h>
#include <stdint.h>

#define SHM_PROTO_MAGIC 0x6c616f68u /* "hoal" read little-endian */
#define SHM_PROTO_VERSION 4 /* 2: shm_load counts the state store's work; 3: and its skips;
                              4: SUBMIT carries logit_bias, min_tokens and a grammar */

/* Largest prompt a SUBMIT carries, and events a STEP carries: bounded so a
 * receiver can size its buffers (nng's receive limit is set from these). */
#define SHM_PROMPT_TOKENS_MAX (1024 * 1024)
#define SHM_STEP_EVENTS_MAX 65536
#define SHM_STOP_IDS_MAX 16
#define SHM_REJECT_TEXT_BYTES 256
#define SHM_LOGPROBS_MAX 20 /* top log-probabilities per token (OpenAI's limit) */
#define SHM_LOGIT_BIAS_MAX 1024 /* logit_bias entries of one stream */
#define SHM_GRAMMAR_BYTES_MAX (64u * 1024u) /* SHOAL_GRAMMAR_REGEX_BYTES_MAX */

typedef enum shm_msg_type {
    SHM_MSG_HELLO = 1,
    SHM_MSG_SUBMIT = 2,
    SHM_MSG_CANCEL = 3,
    SHM_MSG_STEP = 4,
    SHM_MSG_REJECT = 5,
    SHM_MSG_HEARTBEAT = 6,
    SHM_MSG_SHUTDOWN = 7,
} shm_msg_type;

typedef struct shm_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t bytes; /* the whole message, header included */
    uint32_t count; /* prompt tokens (SUBMIT), events (STEP), else 0 */
} shm_header;
_Static_assert(sizeof(shm_header) == 16, "shm_header layout");

/* The worker's load, in STEP and HEARTBEAT. */
typedef struct shm_load {
    int32_t running;
    int32_t waiting;
    int32_t pages_total;
    int32_t pages_free;
    int32_t pages_active;
    int32_t pages_cached;
    uint64_t steps;
    uint64_t computed_tokens;
    uint64_t cached_tokens;
    uint64_t generated_tokens;
    uint64_t preemptions;
    /* The state store (--learn-conversations; zero without it). */
    uint64_t restore_tokens; /* prompt tokens read back from the store (counted in
                                cached_tokens too) */
    uint64_t states_spilled; /* evicted pages queued for the store */
    uint64_t states_refused; /* stored records refused (checksum, fingerprint) */
    uint64_t states_dropped; /* spills dropped: the store's queue was full */
    uint64_t states_skipped; /* evicted pages the store held already: not written */
} shm_load;
_Static_assert(sizeof(shm_load) == 104, "shm_load layout");
_Static_assert(offsetof(shm_load, restore_tokens) == 64, "shm_load layout");

typedef struct shm_hello {
    shm_header h;
    int32_t worker;  /* index the coordinator gave it */
    int32_t pid;
    int32_t vocab;
    int32_t max_model_len;
    int32_t page_tokens;
    int32_t parallel;
    char device[16]; /* "cpu" or the GPU index, NUL-terminated */
    common_hash fingerprint;
    shm_load load;
} shm_hello;
_Static_assert(sizeof(shm_hello) == 16 + 24 + 16 + 32 + 104, "shm_hello layout");

/* A stream's sampling settings, as the engine's sample op takes them. */
typedef struct shm_sampling {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t logprobs;
    uint64_t seed;
} shm_sampling;
_Static_assert(sizeof(shm_sampling) == 40, "shm_sampling layout");

/* One logit_bias entry: bias is added to the token's logit before
 * sampling (-inf: the token is never sampled). */
typedef struct shm_bias {
    int32_t token;
    float bias;
} shm_bias;
_Static_assert(sizeof(shm_bias) == 8, "shm_bias layout");

/* A SUBMIT is the struct, then count prompt tokens (int32), then
 * bias_count shm_bias entries, then grammar_bytes bytes of a regular
 * expression in grammar_regex's dialect (no NUL) that the output must
 * match (0 bytes: unconstrained). */
typedef struct shm_submit {
    shm_header h; /* count = prompt tokens */
    uint64_t stream_id;
    int32_t max_tokens;
    int32_t stop_count;
    shm_sampling sampling;
    int32_t stop_ids[SHM_STOP_IDS_MAX];
    uint8_t ignore_eos;
    uint8_t has_salt;
    uint8_t pad[2];
    /* Index of the first token this stream produces. A stream resumed on
     * another worker after a failure continues its count (and its seeded
     * random draws, which are keyed by the index) where it stopped. */
    int32_t index_base;
    common_hash salt;
    /* Stop ids and end ids are not sampled before the stream's output
     * (index_base counted) has min_tokens tokens. */
    int32_t min_tokens;
    uint32_t bias_count;
    uint32_t grammar_bytes;
    int32_t pad2;
} shm_submit;
_Static_assert(sizeof(shm_submit) == 16 + 16 + 40 + 64 + 8 + 32 + 16, "shm_submit layout");

/* Bytes of a SUBMIT with these trailing parts. */
size_t shm_submit_bytes(uint32_t prompt_tokens, uint32_t bias_count, uint32_t grammar_bytes);

/* The trailing parts of a checked SUBMIT. */
static inline const int32_t *shm_submit_prompt(const shm_submit *s)
{
    return (const int32_t *)(s + 1);
}
static inline const shm_bias *shm_submit_bias(const shm_submit *s)
{
    return (const shm_bias *)(shm_submit_prompt(s) + s->h.count);
}
static inline const char *shm_submit_grammar(const shm_submit *s)
{
    return (const char *)(shm_submit_bias(s) + s->bias_count);
}

typedef struct shm_cancel {
    shm_header h;
    uint64_t stream_id;
} shm_cancel;
_Static_assert(sizeof(shm_cancel) == 24, "shm_cancel layout");

typedef struct shm_event {
    uint64_t stream_id;
    int32_t token; /* -1: the event carries only a finish */
    int32_t index;
    float logprob;
    int32_t finish; /* worker_finish: 0 none, 1 stop, 2 length, 3 cancelled */
    int32_t prompt_tokens;
    int32_t cached_tokens;
    int32_t top_count;
    int32_t pad;
    int32_t top_ids[SHM_LOGPROBS_MAX];
    float top_logprobs[SHM_LOGPROBS_MAX];
} shm_event;
_Static_assert(sizeof(shm_event) == 40 + 160, "shm_event layout");

typedef struct shm_step {
    shm_header h; /* count = events, which follow */
    shm_load load;
} shm_step;
_Static_assert(sizeof(shm_step) == 120, "shm_step layout");

typedef struct shm_reject {
    shm_header h;
    uint64_t stream_id;
    int32_t err; /* shoal_err */
    int32_t pad;
    char text[SHM_REJECT_TEXT_BYTES]; /* NUL-terminated */
} shm_reject;
_Static_assert(sizeof(shm_reject) == 16 + 16 + SHM_REJECT_TEXT_BYTES, "shm_reject layout");

typedef struct shm_heartbeat {
    shm_header h;
    shm_load load;
} shm_heartbeat;
_Static_assert(sizeof(shm_heartbeat) == 120, "shm_heartbeat layout");

/* Largest message either side sends: a SUBMIT of the longest prompt. */
#define SHM_MSG_BYTES_MAX                                                                         \
    (sizeof(shm_submit) + (size_t)SHM_PROMPT_TOKENS_MAX * 4 + SHM_LOGIT_BIAS_MAX * sizeof(shm_bias) + \
     SHM_GRAMMAR_BYTES_MAX)

/* Fills a header. */
void shm_header_init(shm_header *h, shm_msg_type type, size_t bytes, uint32_t count);

/* Bytes of a message of this type with `count` trailing items (a SUBMIT
 * without logit_bias or grammar: shm_submit_bytes for one with them). */
size_t shm_msg_bytes(shm_msg_type type, uint32_t count);

/* Checks a received message of `bytes` bytes: magic, version, known type,
 * a size that is exactly the type's for its count (within the bounds
 * above), and in HELLO, STEP and HEARTBEAT a load with no negative count.
 * Strings in it must be NUL-terminated. A SUBMIT's logit_bias and grammar
 * are within their bounds (token ids are checked against the vocabulary by
 * the worker). On success *type is set.
 * SHOAL_ERR_FORMAT with a message otherwise; the message is not used. */
shoal_err shm_proto_check(const void *msg, size_t bytes, shm_msg_type *type, shoal_diag *diag);

#endif
