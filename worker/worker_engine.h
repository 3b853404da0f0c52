/* worker_engine.h: the engine loop of one worker.
 *
 * Continuous batching with chunked prefill: each step builds one batch of a
 * decode row for every running stream whose prompt is done, plus prompt
 * chunks of streams still prefilling and of newly admitted ones, within a
 * token budget (max_batch_tokens) and a stream limit (parallel). It runs one
 * forward pass over those ragged rows, samples one token for every stream
 * that reached the end of its known tokens, and reports all tokens of the
 * step together as events.
 *
 * Pages: every full block of a stream (prompt and output) is published in
 * the prefix cache under a chained SHA-256 hash, rooted in the model
 * fingerprint and the request's cache salt, so a later stream with the same
 * prefix takes those pages by reference and prefills only the rest. When a
 * decode needs a page and none is left, the most recently admitted other
 * stream is preempted: its pages are released (they stay cached where
 * published) and it is recomputed later from its tokens. Admission refuses
 * a stream that could never fit. One thread drives an engine.
 *
 * Hybrid models (gated DeltaNet layers): each running stream owns a state
 * slot. Pages alone are no prefix for them: a hit needs the recurrent state
 * at the prefix's end, a checkpoint (worker_checkpoints.h). The engine ends
 * prompt chunks at the prompt's last full block and at every
 * checkpoint_interval tokens, and copies the stream's state there after the
 * step; in decode it keeps the state at the latest block boundary (a
 * turn's end, when the stream finishes). A later stream takes the longest
 * chain of cached pages that ends at a checkpoint, pages and state
 * together. So a repeated prompt or a conversation's next turn reuses all
 * but its last partial block (one page is the smallest reusable prefix),
 * and prompts that share only a head reuse it up to a multiple of the
 * interval. The state store (restore.state) serves them too: a job of
 * pages and the checkpoint at its end, taken whole or not at all. Other
 * workers' pages are not taken for hybrids. */
#ifndef SHOAL_WORKER_ENGINE_H
#define SHOAL_WORKER_ENGINE_H

#include "common/common_hash.h"
#include "kernels/kernels_sample.h"
#include "worker/worker_checkpoints.h"
#include "worker/worker_model.h"
#include "worker/worker_pages.h"

#include <stdbool.h>
#include <stdint.h>

enum { WORKER_STOP_IDS_MAX = 16 };
/* The default checkpoint_interval of hybrid models (tokens). */
enum { WORKER_CHECKPOINT_INTERVAL = 512 };

/* A place a prefix's KV can come from besides this worker's own pages, at
 * once: another worker's arena (issue #8). Given
 * the chain hashes[0..n) of blocks that follow the stream's local hits
 * (parent: the hash before hashes[0]), it takes pages from `pages` with
 * worker_pages_alloc, fills them with those blocks' KV, publishes them,
 * writes their ids to pages_out, and returns how many leading blocks it
 * filled (0 when it has none). It may not fill a block it cannot vouch for. */
typedef struct worker_prefix_source {
    int (*fill)(void *ctx, worker_pages *pages, uint64_t stream, const common_hash *hashes,
                const common_hash *parent, int n, int32_t *pages_out);
    void *ctx;
} worker_prefix_source;

/* A source whose blocks arrive while the engine computes others: the state
 * store (issue #9), whose reads from disk can take longer than computing.
 *   start  given the chain hashes[0..n) that follows the stream's local and
 *          imported hits (parent: the hash before hashes[0]), finds how many
 *          leading blocks k it holds, takes k pages from `pages` into
 *          pages_out (the stream's page table: block i's KV goes to
 *          pages_out[i], whoever fills it) and starts reading them in the
 *          background, the last block first; returns k (0: no job) and its
 *          job in *job. The engine would compute up to `claim` blocks at
 *          once (its first chunk), at `speed`; the source leaves it those
 *          it should compute.
 *   take   the engine reached block i of the job, having claimed `claimed`
 *          blocks for this chunk already: READY (read and in its page; the
 *          engine skips it), WAIT (being read, or better left to the
 *          readers), or COMPUTE (the source will not read it: the engine
 *          computes it). The engine takes the lowest blocks while the reads
 *          come down from the top; the source shares the blocks between
 *          the two by their speeds, so a turn waits for about max(compute
 *          the head, read the tail), never for both.
 *   end    the stream is past the job (passed: every block is in its page,
 *          published unless another page held it), or its pages go back
 *          (preemption, cancel): the source lets go of pages_out.
 *   pump   once a step, before the batch is built, on the engine's thread:
 *          puts what was read into its pages; with wait_ms > 0 (nothing
 *          else to do) it first waits up to that long for a read.
 *   state  hybrids, whose jobs are all or nothing (take, of any block,
 *          says of the whole job: WAIT until every block is READY,
 *          COMPUTE once any failed): every block is READY; puts the state
 *          checkpoint at the job's last block into model state slot
 *          `slot`: READY done, WAIT still being read, COMPUTE failed (the
 *          slot may have been written: the engine restores it from its
 *          local hit).
 * All calls come from the engine's thread. */
/* How fast the engine computes: a step costs fixed_s plus a block of
 * prompt per 1 / bps seconds (0: not measured yet). */
typedef struct worker_speed {
    double bps;
    double fixed_s;
} worker_speed;

typedef enum worker_take {
    WORKER_TAKE_COMPUTE = 0,
    WORKER_TAKE_READY,
    WORKER_TAKE_WAIT,
} worker_take;

typedef struct worker_async_source {
    int (*start)(void *ctx, worker_pages *pages, uint64_t stream, const common_hash *hashes,
                 const common_hash *parent, int n, int claim, worker_speed speed,
                 int32_t *pages_out, void **job);
    worker_take (*take)(void *ctx, void *job, int block, int claimed, worker_speed speed);
    void (*end)(void *ctx, void *job, bool passed);
    void (*pump)(void *ctx, int wait_ms);
    worker_take (*state)(void *ctx, void *job, int slot);
    void *ctx;
} worker_async_source;

typedef struct worker_engine_options {
    int max_batch_tokens; /* rows of one step (the model's max_rows) */
    int parallel;         /* running streams at most */
    int max_queued;       /* waiting streams at most */
    int max_model_len;    /* prompt + output tokens of one stream */
    /* The cluster's shared segment and this worker's slot in it, or NULL:
     * the page state then lives there (worker_pages.h). */
    shm_segment *segment;
    int worker_index;
    worker_prefix_source import;  /* tried after local hits; fill NULL: none */
    worker_async_source restore;  /* tried after imports; start NULL: none */
    /* Hybrid models (worker_checkpoints.h): the state checkpoints kept for
     * prefix hits, in model state slots after the running streams' (0:
     * none, every prompt computes from its start); and every how many
     * tokens a prompt takes one (a multiple of the page size; 0: only at
     * the prompt's last full block and at each turn's end). */
    int checkpoints;
    int checkpoint_interval;
} worker_engine_options;

typedef struct worker_request {
    uint64_t id; /* the caller's; unique among live streams */
    const int32_t *prompt;
    int prompt_len;
    int max_tokens;
    kernels_sample_params sampling; /* step is set by the engine */
    bool ignore_eos;
    int stop_count;
    int32_t stop_ids[WORKER_STOP_IDS_MAX];
    bool has_salt; /* cache_salt: prefixes are shared only under the same salt */
    common_hash salt;
    /* Index of the stream's first output token: a stream resumed after a
     * worker failure continues its count and its seeded draws (keyed by
     * the index) where it stopped. 0 for a new stream. */
    int index_base;
} worker_request;

typedef enum worker_finish {
    WORKER_FINISH_NONE = 0,
    WORKER_FINISH_STOP,      /* EOS or a stop token id (the token is reported) */
    WORKER_FINISH_LENGTH,    /* max_tokens or max_model_len reached */
    WORKER_FINISH_CANCELLED, /* cancel(); no token in this event */
} worker_finish;

/* What one stream got in one step: a token and/or its end. */
typedef struct worker_event {
    uint64_t stream_id;
    int32_t token; /* -1 when the event carries only a finish */
    int32_t index; /* the token's index in the output (index_base + n) */
    float logprob;
    int32_t top_count;
    int32_t top_ids[KERNELS_SAMPLE_LOGPROBS_MAX];
    float top_logprobs[KERNELS_SAMPLE_LOGPROBS_MAX];
    int32_t finish;        /* worker_finish */
    int32_t prompt_tokens; /* with token index 0: the prompt's length */
    int32_t cached_tokens; /* with token index 0: prompt tokens served from cache */
} worker_event;

typedef struct worker_engine_stats {
    int running;
    int waiting;
    uint64_t steps;
    uint64_t prompt_tokens;   /* prompt tokens of admitted streams */
    uint64_t computed_tokens; /* rows run through the model */
    uint64_t cached_tokens;   /* prompt tokens not computed: local, imported and restored */
    uint64_t import_tokens;   /* of which copied from other workers */
    uint64_t restore_tokens;  /* of which read back from the state store */
    uint64_t generated_tokens;
    uint64_t preemptions;
    uint64_t deferred; /* admissions put off: the next block was another stream's work */
    worker_pages_stats pages;
    worker_checkpoints_stats checkpoints; /* hybrids; zero otherwise */
    int state_slots;                      /* hybrids: the running streams' slots */
    size_t slot_bytes;                    /* hybrids: bytes of one state slot */
} worker_engine_stats;

typedef struct worker_engine worker_engine;

/* Sets the row, stream and page bounds of model options so that an engine
 * with these options fits them. */
void worker_engine_size_model(const worker_engine_options *opt, worker_model_options *mo);

/* Starts an engine on a model (not owned; it must outlive the engine).
 * Options are checked against the model's bounds. */
shoal_err worker_engine_open(worker_model *m, const worker_engine_options *opt,
                             worker_engine **out, shoal_diag *diag);
void worker_engine_close(worker_engine *e);

/* Queues a stream; the prompt is copied. Refused with a message when the
 * prompt is empty or has an id outside the vocabulary, when prompt +
 * max_tokens passes max_model_len or the whole pool, when the queue is
 * full (SHOAL_ERR_LIMIT), or when the id is taken. */
shoal_err worker_engine_submit(worker_engine *e, const worker_request *r, shoal_diag *diag);

/* Cancels a stream; its pages return and a CANCELLED event is reported at
 * the next step. false if no such live stream. */
bool worker_engine_cancel(worker_engine *e, uint64_t id);

/* Events one step can report at most. */
int worker_engine_events_max(const worker_engine *e);

/* Runs one step. events must hold worker_engine_events_max(); *count gets
 * how many were written. A model error leaves the engine broken: every
 * later call fails with SHOAL_ERR_BROKEN. */
shoal_err worker_engine_step(worker_engine *e, worker_event *events, int *count,
                             shoal_diag *diag);

/* True while any stream is running or waiting (or an event is pending). */
bool worker_engine_busy(const worker_engine *e);

void worker_engine_stats_get(const worker_engine *e, worker_engine_stats *out);

/* The page pool, for accounting and tests. */
const worker_pages *worker_engine_pages(const worker_engine *e);
worker_pages *worker_engine_pages_mut(worker_engine *e);

/* Hybrids: the checkpoint table (the state store spills from it); NULL
 * for other models. */
worker_checkpoints *worker_engine_checkpoints(worker_engine *e);

/* A running or waiting stream, for the stream table (shoalctl streams). */
typedef struct worker_stream_info {
    uint64_t id;
    bool running;
    bool prefilling;
    int prompt_tokens;
    int tokens;
    int generated;
    int pages;
    int cached_tokens;
} worker_stream_info;

/* Streams now (running first, then waiting), at most max, into out. */
int worker_engine_streams(const worker_engine *e, worker_stream_info *out, int max);

#endif
