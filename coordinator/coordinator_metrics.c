#include "coordinator_metrics.h"

#include <stdio.h>
#include <string.h>

static const int statuses[COORDINATOR_METRICS_STATUSES] = {200, 204, 400, 401, 404, 405, 408,
                                                           413, 429, 499, 500, 501, 503, 504};

/* Bounds in seconds. Time to first token spans a cached prompt on a fast
 * GPU to a long prefill on the CPU; inter-token latency spans a fake
 * benchmark worker (microseconds) to a preempted stream (seconds). */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02,
                                    0.025,  0.03,   0.04,  0.05,   0.075, 0.1,  0.15,  0.2,
                                    0.3,    0.4,    0.5,   0.75,   1.0,   2.5,  5.0,   10.0};
static const double duration_bounds[] = {0.01,  0.025, 0.05,  0.1,   0.25,   0.5,   1.0,  2.5,
                                         5.0,   10.0,  15.0,  20.0,  30.0,   40.0,  50.0, 60.0,
                                         120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

_Static_assert(sizeof ttft_bounds / sizeof ttft_bounds[0] <= COORDINATOR_METRICS_BUCKETS, "");
_Static_assert(sizeof itl_bounds / sizeof itl_bounds[0] <= COORDINATOR_METRICS_BUCKETS, "");
_Static_assert(sizeof duration_bounds / sizeof duration_bounds[0] <= COORDINATOR_METRICS_BUCKETS,
               "");

static const char *const endpoint_paths[COORDINATOR_ENDPOINT__COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize",
    "/detokenize",          "/health",         "/metrics",   "other",
};

const char *coordinator_endpoint_path(coordinator_endpoint endpoint)
{
    return endpoint >= 0 && endpoint < COORDINATOR_ENDPOINT__COUNT ? endpoint_paths[endpoint]
                                                                   : "other";
}

static void histogram_init(coordinator_histogram *h, const double *bounds, int count)
{
    h->bounds = bounds;
    h->bucket_count = count;
    for (int i = 0; i <= COORDINATOR_METRICS_BUCKETS; i++)
        atomic_init(&h->counts[i], 0);
    atomic_init(&h->sum_ns, 0);
}

void coordinator_metrics_init(coordinator_metrics *m)
{
    for (int r = 0; r < COORDINATOR_ENDPOINT__COUNT; r++)
        for (int s = 0; s <= COORDINATOR_METRICS_STATUSES; s++)
            atomic_init(&m->requests[r][s], 0);
    atomic_init(&m->prompt_tokens, 0);
    atomic_init(&m->generation_tokens, 0);
    atomic_init(&m->prefix_queries, 0);
    atomic_init(&m->prefix_hits, 0);
    atomic_init(&m->stream_chunks, 0);
    atomic_init(&m->http_running, 0);
    atomic_init(&m->http_body_bytes, 0);
    histogram_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]));
    histogram_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]));
    histogram_init(&m->duration, duration_bounds,
                   (int)(sizeof duration_bounds / sizeof duration_bounds[0]));
}

void coordinator_metrics_request(coordinator_metrics *m, coordinator_endpoint endpoint, int status)
{
    if (endpoint < 0 || endpoint >= COORDINATOR_ENDPOINT__COUNT)
        endpoint = COORDINATOR_ENDPOINT_OTHER;
    int s = COORDINATOR_METRICS_STATUSES; /* "other" */
    for (int i = 0; i < COORDINATOR_METRICS_STATUSES; i++)
        if (statuses[i] == status)
            s = i;
    atomic_fetch_add_explicit(&m->requests[endpoint][s], 1, memory_order_relaxed);
}

void coordinator_metrics_tokens(coordinator_metrics *m, uint64_t prompt, uint64_t generated,
                                uint64_t cached)
{
    atomic_fetch_add_explicit(&m->prompt_tokens, prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->generation_tokens, generated, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prefix_queries, prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prefix_hits, cached, memory_order_relaxed);
}

void coordinator_metrics_observe(coordinator_histogram *h, uint64_t ns)
{
    double s = (double)ns * 1e-9;
    int b = 0;
    while (b < h->bucket_count && s > h->bounds[b])
        b++;
    atomic_fetch_add_explicit(&h->counts[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

static uint64_t load(const _Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* A family's series are written as <prefix><name>{<labels>}: prefix
 * "shoal_" with no labels, or "vllm:" with vLLM's model_name label. */
typedef struct family {
    const char *prefix;
    const char *labels; /* "" or `model_name="..."` */
} family;

static const family shoal_family = {"shoal_", ""};

static void header(coordinator_buf *out, family f, const char *name, const char *type,
                   const char *help)
{
    coordinator_buf_printf(out, "# HELP %s%s %s\n# TYPE %s%s %s\n", f.prefix, name, help, f.prefix,
                           name, type);
}

static void sample(coordinator_buf *out, family f, const char *name, const char *value)
{
    coordinator_buf_printf(out, "%s%s%s%s%s %s\n", f.prefix, name, f.labels[0] ? "{" : "", f.labels,
                           f.labels[0] ? "}" : "", value);
}

static void counter(coordinator_buf *out, family f, const char *name, const char *help,
                    uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    header(out, f, name, "counter", help);
    sample(out, f, name, text);
}

static void gauge(coordinator_buf *out, family f, const char *name, const char *help, long long v)
{
    char text[24];
    snprintf(text, sizeof text, "%lld", v);
    header(out, f, name, "gauge", help);
    sample(out, f, name, text);
}

static void histogram(coordinator_buf *out, family f, const char *name, const char *help,
                      const coordinator_histogram *h)
{
    header(out, f, name, "histogram", help);
    const char *sep = f.labels[0] ? "," : "";
    uint64_t cumulative = 0;
    for (int b = 0; b <= h->bucket_count; b++) {
        cumulative += load(&h->counts[b]);
        char le[32];
        if (b < h->bucket_count)
            snprintf(le, sizeof le, "%g", h->bounds[b]);
        else
            snprintf(le, sizeof le, "+Inf");
        coordinator_buf_printf(out, "%s%s_bucket{%s%sle=\"%s\"} %llu\n", f.prefix, name, f.labels,
                               sep, le, (unsigned long long)cumulative);
    }
    char name_sum[96], name_count[96], text[32];
    snprintf(name_sum, sizeof name_sum, "%s_sum", name);
    snprintf(name_count, sizeof name_count, "%s_count", name);
    snprintf(text, sizeof text, "%.9f", (double)load(&h->sum_ns) * 1e-9);
    sample(out, f, name_sum, text);
    snprintf(text, sizeof text, "%llu", (unsigned long long)cumulative);
    sample(out, f, name_count, text);
}

/* vLLM's names of the same figures, so that dashboards made for vLLM
 * (its v1 engine's names) read shoal: requests are streams (a choice is
 * one), the KV cache's use is the active pages' share of all workers'
 * pages (cached pages are reusable, as vLLM's free-queue blocks are). */
static void vllm_series(const coordinator_metrics *m, const coordinator_metrics_cluster *c,
                        coordinator_buf *out)
{
    char labels[COORDINATOR_METRICS_MODEL_LABEL_BYTES + 16];
    char model[COORDINATOR_METRICS_MODEL_LABEL_BYTES];
    size_t n = 0;
    for (const char *p = c->model_name ? c->model_name : ""; *p && n + 3 < sizeof model; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n') { /* the text format's escapes */
            model[n++] = '\\';
            model[n++] = *p == '\n' ? 'n' : *p;
        } else {
            model[n++] = *p;
        }
    }
    model[n] = '\0';
    snprintf(labels, sizeof labels, "model_name=\"%s\"", model);
    family f = {"vllm:", labels};
    long long running = 0, waiting = 0, active = 0, total = 0, preempted = 0;
    for (int i = 0; i < c->worker_count; i++) {
        running += c->workers[i].running;
        waiting += c->workers[i].waiting;
        active += c->workers[i].pages_active;
        total += c->workers[i].pages_total;
        preempted += (long long)c->workers[i].preemptions;
    }
    gauge(out, f, "num_requests_running", "Streams the workers are running.", running);
    gauge(out, f, "num_requests_waiting", "Streams waiting in the workers' queues.", waiting);
    char usage[32];
    snprintf(usage, sizeof usage, "%.6f", total ? (double)active / (double)total : 0.0);
    header(out, f, "kv_cache_usage_perc", "gauge",
           "KV-cache usage: active pages over all pages, 1 is full.");
    sample(out, f, "kv_cache_usage_perc", usage);
    counter(out, f, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            load(&m->prefix_queries));
    counter(out, f, "prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
            load(&m->prefix_hits));
    counter(out, f, "prompt_tokens_total", "Prompt tokens of ended requests.",
            load(&m->prompt_tokens));
    counter(out, f, "generation_tokens_total", "Tokens generated for ended requests.",
            load(&m->generation_tokens));
    counter(out, f, "num_preemptions_total", "Streams the workers preempted.",
            (uint64_t)preempted);
    histogram(out, f, "time_to_first_token_seconds", "Time to first token, per choice.", &m->ttft);
    histogram(out, f, "inter_token_latency_seconds", "Time between consecutive output tokens.",
              &m->itl);
    histogram(out, f, "e2e_request_latency_seconds", "From arrival to the end of a request.",
              &m->duration);
}

/* A device name as a label value: only [A-Za-z0-9_.-], so it needs no
 * escaping (workers report "cpu" or a GPU index). */
static void label_value(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src[n] && n + 1 < cap; n++) {
        char c = src[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        dst[n] = ok ? c : '_';
    }
    dst[n] = '\0';
}

typedef enum worker_field {
    WF_UP,
    WF_RESTARTS,
    WF_RUNNING,
    WF_WAITING,
    WF_PAGES_FREE,
    WF_PAGES_ACTIVE,
    WF_PAGES_CACHED,
    WF_PAGES_TOTAL,
    WF_STEPS,
    WF_COMPUTED,
    WF_HITS,
    WF_GENERATED,
    WF_PREEMPTIONS,
    WF_RESTORED,
    WF_IMPORTED,
    WF_SPILLED,
    WF_REFUSED,
    WF_DROPPED,
    WF_SKIPPED,
} worker_field;

static unsigned long long worker_value(const coordinator_metrics_worker *w, worker_field f)
{
    switch (f) {
    case WF_UP:
        return w->alive;
    case WF_RESTARTS:
        return (unsigned long long)w->restarts;
    case WF_RUNNING:
        return (unsigned long long)w->running;
    case WF_WAITING:
        return (unsigned long long)w->waiting;
    case WF_PAGES_FREE:
        return (unsigned long long)w->pages_free;
    case WF_PAGES_ACTIVE:
        return (unsigned long long)w->pages_active;
    case WF_PAGES_CACHED:
        return (unsigned long long)w->pages_cached;
    case WF_PAGES_TOTAL:
        return (unsigned long long)w->pages_total;
    case WF_STEPS:
        return w->steps;
    case WF_COMPUTED:
        return w->computed_tokens;
    case WF_HITS: /* its own pages: imports and restores are counted on their own */
        return w->cached_tokens > w->restore_tokens + w->import_tokens
                   ? w->cached_tokens - w->restore_tokens - w->import_tokens
                   : 0;
    case WF_GENERATED:
        return w->generated_tokens;
    case WF_PREEMPTIONS:
        return w->preemptions;
    case WF_RESTORED:
        return w->restore_tokens;
    case WF_IMPORTED:
        return w->import_tokens;
    case WF_SPILLED:
        return w->states_spilled;
    case WF_REFUSED:
        return w->states_refused;
    case WF_DROPPED:
        return w->states_dropped;
    case WF_SKIPPED:
        return w->states_skipped;
    }
    return 0;
}

/* The per-worker series, in output order; a family's rows follow each other
 * (the first row of a name carries its HELP and TYPE). */
typedef struct worker_metric {
    const char *name, *type, *help;
    const char *label; /* extra label, or "" */
    worker_field field;
} worker_metric;

static const worker_metric worker_metrics[] = {
    {"worker_up", "gauge", "1 if the worker answers heartbeats.", "", WF_UP},
    {"worker_restarts_total", "counter", "Restarts of the worker.", "", WF_RESTARTS},
    {"worker_streams", "gauge", "Streams of the worker, by state.", ",state=\"running\"",
     WF_RUNNING},
    {"worker_streams", "gauge", "", ",state=\"waiting\"", WF_WAITING},
    {"worker_kv_pages", "gauge", "KV pages of the worker, by state.", ",state=\"free\"",
     WF_PAGES_FREE},
    {"worker_kv_pages", "gauge", "", ",state=\"active\"", WF_PAGES_ACTIVE},
    {"worker_kv_pages", "gauge", "", ",state=\"cached\"", WF_PAGES_CACHED},
    {"worker_kv_pages_total", "gauge", "KV pages of the worker's arena.", "", WF_PAGES_TOTAL},
    {"worker_steps_total", "counter", "Engine steps the worker ran.", "", WF_STEPS},
    {"worker_computed_tokens_total", "counter", "Rows the worker ran through the model.", "",
     WF_COMPUTED},
    {"worker_prefix_cache_hits_total", "counter",
     "Prompt tokens the worker took from its own cached KV pages.", "", WF_HITS},
    {"worker_restored_tokens_total", "counter",
     "Prompt tokens the worker read back from the state store instead of computing.", "",
     WF_RESTORED},
    {"worker_imported_tokens_total", "counter",
     "Prompt tokens the worker copied from another worker's KV pages instead of computing.", "",
     WF_IMPORTED},
    {"worker_state_spilled_pages_total", "counter",
     "Evicted KV pages the worker queued for the state store.", "", WF_SPILLED},
    {"worker_state_refused_total", "counter",
     "Stored states the worker refused (checksum, model fingerprint or layout).", "", WF_REFUSED},
    {"worker_state_dropped_pages_total", "counter",
     "Spills dropped because the state store's write queue was full.", "", WF_DROPPED},
    {"worker_state_skipped_pages_total", "counter",
     "Evicted KV pages the state store held already, so not written again.", "", WF_SKIPPED},
    {"worker_generated_tokens_total", "counter", "Tokens the worker generated.", "",
     WF_GENERATED},
    {"worker_preemptions_total", "counter", "Streams the worker preempted.", "", WF_PREEMPTIONS},
};

static void worker_series(coordinator_buf *out, const coordinator_metrics_cluster *c,
                          const char *name, const char *extra_label, worker_field f)
{
    for (int i = 0; i < c->worker_count; i++) {
        const coordinator_metrics_worker *w = &c->workers[i];
        char device[32];
        label_value(device, sizeof device, w->device);
        coordinator_buf_printf(out, "shoal_%s{worker=\"%d\",device=\"%s\"%s} %llu\n", name,
                               w->index, device, extra_label, worker_value(w, f));
    }
}

bool coordinator_metrics_render(const coordinator_metrics *m, const coordinator_metrics_cluster *c,
                                coordinator_buf *out)
{
    coordinator_buf_clear(out);
    header(out, shoal_family, "http_requests_total", "counter", "HTTP requests answered, by route and status.");
    for (int r = 0; r < COORDINATOR_ENDPOINT__COUNT; r++) {
        for (int s = 0; s <= COORDINATOR_METRICS_STATUSES; s++) {
            uint64_t v = load(&m->requests[r][s]);
            if (!v)
                continue;
            char status[8];
            if (s < COORDINATOR_METRICS_STATUSES)
                snprintf(status, sizeof status, "%d", statuses[s]);
            else
                snprintf(status, sizeof status, "other");
            coordinator_buf_printf(out,
                                   "shoal_http_requests_total{route=\"%s\",status=\"%s\"} %llu\n",
                                   endpoint_paths[r], status, (unsigned long long)v);
        }
    }
    counter(out, shoal_family, "prompt_tokens_total",
            "Prompt tokens of ended generation requests, those the client left included.",
            load(&m->prompt_tokens));
    counter(out, shoal_family, "generation_tokens_total",
            "Tokens generated for ended requests, those the client left included.",
            load(&m->generation_tokens));
    counter(out, shoal_family, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            load(&m->prefix_queries));
    counter(out, shoal_family, "prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
            load(&m->prefix_hits));
    counter(out, shoal_family, "stream_chunks_total", "SSE events sent on streamed responses.",
            load(&m->stream_chunks));
    histogram(out, shoal_family, "time_to_first_token_seconds",
              "From a request's arrival to its first token, per choice.", &m->ttft);
    histogram(out, shoal_family, "inter_token_latency_seconds",
              "Between consecutive tokens of a choice, as they reach the coordinator.", &m->itl);
    histogram(out, shoal_family, "request_duration_seconds", "From arrival to the end of a generation request.",
              &m->duration);
    gauge(out, shoal_family, "http_requests_running", "HTTP requests being served.",
          (long long)atomic_load_explicit(&m->http_running, memory_order_relaxed));
    gauge(out, shoal_family, "http_body_bytes",
          "Buffers of request bodies being read, against --max-body-memory-mib.",
          (long long)atomic_load_explicit(&m->http_body_bytes, memory_order_relaxed));
    long long running = 0, waiting = 0;
    for (int i = 0; i < c->worker_count; i++) {
        running += c->workers[i].running;
        waiting += c->workers[i].waiting;
    }
    gauge(out, shoal_family, "streams_running", "Streams the workers are running.", running);
    gauge(out, shoal_family, "streams_waiting", "Streams waiting in the workers' queues.", waiting);
    counter(out, shoal_family, "streams_resumed_total", "Streams moved off a dead worker.", c->resumed);

    for (size_t i = 0; i < sizeof worker_metrics / sizeof worker_metrics[0]; i++) {
        const worker_metric *wm = &worker_metrics[i];
        if (i == 0 || strcmp(wm->name, worker_metrics[i - 1].name) != 0)
            header(out, shoal_family, wm->name, wm->type, wm->help);
        worker_series(out, c, wm->name, wm->label, wm->field);
    }
    vllm_series(m, c, out);
    return !coordinator_buf_failed(out);
}
