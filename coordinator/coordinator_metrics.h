/* coordinator_metrics.h: the coordinator's counters and /metrics.
 *
 * Counters and histograms are fixed arrays of atomics: any thread records
 * with relaxed atomic adds (no lock, no allocation; recording a token is
 * a handful of instructions), and GET /metrics renders them in the
 * Prometheus text format (version 0.0.4) together with the workers' state,
 * which the caller passes in as it read it from the cluster.
 *
 * Exported (all prefixed shoal_):
 *   http_requests_total{route,status}        requests answered, by status
 *   prompt_tokens_total, generation_tokens_total
 *   prefix_cache_queries_total               prompt tokens sent to workers
 *   prefix_cache_hits_total                  of those, served from cache
 *   stream_chunks_total                      SSE events sent (a chunk carries
 *                                            every token of a stream that
 *                                            arrived since its last one)
 *   time_to_first_token_seconds              histogram, per choice
 *   inter_token_latency_seconds              histogram, per token after the first
 *   request_duration_seconds                 histogram, per generation request
 *   http_requests_running, http_body_bytes, streams_running, streams_waiting
 *   (gauges)
 *   worker_up, worker_restarts_total, worker_streams{state},
 *   worker_kv_pages{state="free|active|cached"}, worker_kv_pages_total,
 *   worker_steps_total, worker_computed_tokens_total,
 *   worker_prefix_cache_hits_total (device pages: its own or a peer's),
 *   worker_restored_tokens_total (read back from the state store),
 *   worker_state_spilled_pages_total, worker_state_refused_total,
 *   worker_state_dropped_pages_total, worker_state_skipped_pages_total
 *   (--learn-conversations),
 *   worker_generated_tokens_total,
 *   worker_preemptions_total                 per worker{worker,device}
 *   streams_resumed_total                    streams moved off a dead worker
 *
 * And under vLLM's names (prefixed vllm:, label model_name), for the
 * dashboards made for it: num_requests_running, num_requests_waiting,
 * kv_cache_usage_perc, prefix_cache_queries_total, prefix_cache_hits_total,
 * prompt_tokens_total, generation_tokens_total, num_preemptions_total, and
 * the histograms time_to_first_token_seconds, inter_token_latency_seconds
 * and e2e_request_latency_seconds. */
#ifndef SHOAL_COORDINATOR_METRICS_H
#define SHOAL_COORDINATOR_METRICS_H

#include "coordinator_buf.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum coordinator_endpoint {
    COORDINATOR_ENDPOINT_CHAT = 0,    /* /v1/chat/completions */
    COORDINATOR_ENDPOINT_COMPLETIONS, /* /v1/completions */
    COORDINATOR_ENDPOINT_MODELS,      /* /v1/models */
    COORDINATOR_ENDPOINT_TOKENIZE,    /* /tokenize */
    COORDINATOR_ENDPOINT_DETOKENIZE,  /* /detokenize */
    COORDINATOR_ENDPOINT_HEALTH,      /* /health */
    COORDINATOR_ENDPOINT_METRICS,     /* /metrics */
    COORDINATOR_ENDPOINT_OTHER,       /* anything else (404) */
    COORDINATOR_ENDPOINT__COUNT
} coordinator_endpoint;

/* Its path, as the route label prints it. */
const char *coordinator_endpoint_path(coordinator_endpoint endpoint);

/* Statuses counted by their own label; others count as "other". 499 is
 * nginx's "client closed request": the client went away first. */
enum { COORDINATOR_METRICS_STATUSES = 14 };

enum { COORDINATOR_METRICS_BUCKETS = 24 };

typedef struct coordinator_histogram {
    const double *bounds; /* upper bounds in seconds, ascending; +Inf implied */
    int bucket_count;
    _Atomic uint64_t counts[COORDINATOR_METRICS_BUCKETS + 1]; /* not cumulative */
    _Atomic uint64_t sum_ns;
} coordinator_histogram;

typedef struct coordinator_metrics {
    _Atomic uint64_t requests[COORDINATOR_ENDPOINT__COUNT][COORDINATOR_METRICS_STATUSES + 1];
    _Atomic uint64_t prompt_tokens;
    _Atomic uint64_t generation_tokens;
    _Atomic uint64_t prefix_queries;
    _Atomic uint64_t prefix_hits;
    _Atomic uint64_t stream_chunks;
    _Atomic int64_t http_running;
    _Atomic int64_t http_body_bytes; /* buffers of bodies being read (the budget's use) */
    coordinator_histogram ttft;
    coordinator_histogram itl;
    coordinator_histogram duration;
} coordinator_metrics;

/* Zeroes every counter. */
void coordinator_metrics_init(coordinator_metrics *m);

/* One answered request. */
void coordinator_metrics_request(coordinator_metrics *m, coordinator_endpoint endpoint, int status);

/* Tokens of a finished generation request. */
void coordinator_metrics_tokens(coordinator_metrics *m, uint64_t prompt, uint64_t generated,
                                uint64_t cached);

void coordinator_metrics_observe(coordinator_histogram *h, uint64_t ns);

/* The workers' state, copied from the cluster by the caller. */
typedef struct coordinator_metrics_worker {
    int index;
    char device[16];
    bool alive;
    int restarts;
    int running;
    int waiting;
    int pages_total;
    int pages_free;
    int pages_active;
    int pages_cached;
    uint64_t steps;
    uint64_t computed_tokens;
    uint64_t cached_tokens;
    uint64_t generated_tokens;
    uint64_t preemptions;
    uint64_t restore_tokens; /* of cached_tokens, from the state store */
    uint64_t import_tokens;  /* of cached_tokens, copied from another worker */
    uint64_t states_spilled;
    uint64_t states_refused;
    uint64_t states_dropped;
    uint64_t states_skipped;
} coordinator_metrics_worker;

enum { COORDINATOR_METRICS_MODEL_LABEL_BYTES = 512 };

typedef struct coordinator_metrics_cluster {
    const char *model_name; /* the served name: vLLM's model_name label (cut to fit its bytes) */
    int worker_count;
    const coordinator_metrics_worker *workers;
    uint64_t resumed;
} coordinator_metrics_cluster;

/* The Prometheus text of m and the cluster's state into out (cleared
 * first). false if memory ran out. */
bool coordinator_metrics_render(const coordinator_metrics *m,
                                const coordinator_metrics_cluster *cluster, coordinator_buf *out);

#endif
