/* Tests of coordinator_metrics: counters, cumulative histogram buckets and
 * per-worker series in the Prometheus text format, exact under concurrent
 * recording. */
#include "../test.h"
#include "coordinator/coordinator_metrics.h"

#include <pthread.h>
#include <stdint.h>

/* The value of the sample line that starts with `series ` (name and
 * labels exactly), or -1. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
    }
    return -1;
}

static void counters_and_requests_by_status(void)
{
    coordinator_metrics m;
    coordinator_metrics_init(&m);
    coordinator_metrics_request(&m, COORDINATOR_ENDPOINT_CHAT, 200);
    coordinator_metrics_request(&m, COORDINATOR_ENDPOINT_CHAT, 200);
    coordinator_metrics_request(&m, COORDINATOR_ENDPOINT_CHAT, 400);
    coordinator_metrics_request(&m, COORDINATOR_ENDPOINT_OTHER, 404);
    coordinator_metrics_request(&m, COORDINATOR_ENDPOINT_COMPLETIONS, 418);
    coordinator_metrics_tokens(&m, 100, 20, 64);
    coordinator_metrics_tokens(&m, 5, 1, 0);
    atomic_fetch_add(&m.stream_chunks, 3);
    coordinator_metrics_cluster c = {0};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_metrics_render(&m, &c, &b));
    const char *t = b.data;
    CHECK(sample(t, "shoal_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}") ==
          2);
    CHECK(sample(t, "shoal_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"}") ==
          1);
    CHECK(sample(t, "shoal_http_requests_total{route=\"other\",status=\"404\"}") == 1);
    CHECK(sample(t, "shoal_http_requests_total{route=\"/v1/completions\",status=\"other\"}") == 1);
    CHECK(sample(t, "shoal_prompt_tokens_total") == 105);
    CHECK(sample(t, "shoal_generation_tokens_total") == 21);
    CHECK(sample(t, "shoal_prefix_cache_queries_total") == 105);
    CHECK(sample(t, "shoal_prefix_cache_hits_total") == 64);
    CHECK(sample(t, "shoal_stream_chunks_total") == 3);
    CHECK_HAS(t, "# TYPE shoal_generation_tokens_total counter\n");
    coordinator_buf_fini(&b);
}

static void histograms_are_cumulative_with_sum_and_count(void)
{
    coordinator_metrics m;
    coordinator_metrics_init(&m);
    coordinator_metrics_observe(&m.ttft, 500000);            /* 0.5 ms */
    coordinator_metrics_observe(&m.ttft, 1000000);           /* 1 ms: on the bound, counts in it */
    coordinator_metrics_observe(&m.ttft, 30000000);          /* 30 ms */
    coordinator_metrics_observe(&m.ttft, 10000000000000ull); /* 10 000 s: +Inf only */
    coordinator_metrics_cluster c = {0};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_metrics_render(&m, &c, &b));
    const char *t = b.data;
    CHECK(sample(t, "shoal_time_to_first_token_seconds_bucket{le=\"0.001\"}") == 2);
    CHECK(sample(t, "shoal_time_to_first_token_seconds_bucket{le=\"0.02\"}") == 2);
    CHECK(sample(t, "shoal_time_to_first_token_seconds_bucket{le=\"0.04\"}") == 3);
    CHECK(sample(t, "shoal_time_to_first_token_seconds_bucket{le=\"2560\"}") == 3);
    CHECK(sample(t, "shoal_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 4);
    CHECK(sample(t, "shoal_time_to_first_token_seconds_count") == 4);
    double sum = sample(t, "shoal_time_to_first_token_seconds_sum");
    CHECK_MSG(sum > 10000.0314 && sum < 10000.0316, "%f", sum);
    CHECK(sample(t, "shoal_inter_token_latency_seconds_count") == 0);
    CHECK_HAS(t, "# TYPE shoal_inter_token_latency_seconds histogram\n");
    coordinator_buf_fini(&b);
}

static void workers_have_pages_streams_and_counters(void)
{
    coordinator_metrics m;
    coordinator_metrics_init(&m);
    coordinator_metrics_worker w[2] = {
        {.index = 0,
         .device = "cpu",
         .alive = true,
         .running = 3,
         .waiting = 1,
         .pages_total = 100,
         .pages_free = 60,
         .pages_active = 30,
         .pages_cached = 10,
         .steps = 7,
         .cached_tokens = 64,
         .restore_tokens = 16,
         .import_tokens = 32,
         .states_spilled = 5,
         .states_refused = 2,
         .states_dropped = 1,
         .states_skipped = 7,
         .generated_tokens = 9},
        {.index = 1, .device = "1\"}\n", .alive = false, .restarts = 2, .running = 2},
    };
    coordinator_metrics_cluster c = {.worker_count = 2, .workers = w, .resumed = 4};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_metrics_render(&m, &c, &b));
    const char *t = b.data;
    CHECK(sample(t, "shoal_worker_up{worker=\"0\",device=\"cpu\"}") == 1);
    CHECK(sample(t, "shoal_worker_up{worker=\"1\",device=\"1___\"}") == 0); /* sanitised */
    CHECK(sample(t, "shoal_worker_kv_pages{worker=\"0\",device=\"cpu\",state=\"free\"}") == 60);
    CHECK(sample(t, "shoal_worker_kv_pages{worker=\"0\",device=\"cpu\",state=\"active\"}") == 30);
    CHECK(sample(t, "shoal_worker_kv_pages{worker=\"0\",device=\"cpu\",state=\"cached\"}") == 10);
    CHECK(sample(t, "shoal_worker_kv_pages_total{worker=\"0\",device=\"cpu\"}") == 100);
    CHECK(sample(t, "shoal_worker_streams{worker=\"0\",device=\"cpu\",state=\"waiting\"}") == 1);
    /* imported and restored tokens count apart from the worker's own hits */
    CHECK(sample(t, "shoal_worker_prefix_cache_hits_total{worker=\"0\",device=\"cpu\"}") == 16);
    CHECK(sample(t, "shoal_worker_imported_tokens_total{worker=\"0\",device=\"cpu\"}") == 32);
    CHECK(sample(t, "shoal_worker_restored_tokens_total{worker=\"0\",device=\"cpu\"}") == 16);
    CHECK(sample(t, "shoal_worker_state_spilled_pages_total{worker=\"0\",device=\"cpu\"}") == 5);
    CHECK(sample(t, "shoal_worker_state_refused_total{worker=\"0\",device=\"cpu\"}") == 2);
    CHECK(sample(t, "shoal_worker_state_dropped_pages_total{worker=\"0\",device=\"cpu\"}") == 1);
    CHECK(sample(t, "shoal_worker_state_skipped_pages_total{worker=\"0\",device=\"cpu\"}") == 7);
    CHECK(sample(t, "shoal_worker_restarts_total{worker=\"1\",device=\"1___\"}") == 2);
    CHECK(sample(t, "shoal_streams_running") == 5 && sample(t, "shoal_streams_waiting") == 1);
    CHECK(sample(t, "shoal_streams_resumed_total") == 4);
    /* every line is a comment or "name{labels} value" */
    for (const char *p = t; *p;) {
        const char *end = strchr(p, '\n');
        CHECK(end != NULL);
        if (!end)
            break;
        if (*p != '#') {
            const char *space = memchr(p, ' ', (size_t)(end - p));
            CHECK_MSG(space && space > p, "line '%.*s'", (int)(end - p), p);
        }
        p = end + 1;
    }
    coordinator_buf_fini(&b);
}

/* The same figures under vLLM's names, labelled with the model's name
 * (escaped as the text format wants). */
static void vllm_names_carry_the_same_figures(void)
{
    coordinator_metrics m;
    coordinator_metrics_init(&m);
    coordinator_metrics_tokens(&m, 40, 9, 0);
    atomic_store(&m.prefix_queries, 40);
    atomic_store(&m.prefix_hits, 16);
    coordinator_metrics_observe(&m.ttft, 1000000);
    coordinator_metrics_observe(&m.itl, 30000000);
    coordinator_metrics_observe(&m.itl, 30000000);
    coordinator_metrics_worker w[2] = {
        {.index = 0, .device = "0", .running = 3, .waiting = 1, .pages_total = 100,
         .pages_active = 30, .pages_free = 60, .preemptions = 2},
        {.index = 1, .device = "1", .running = 2, .pages_total = 300, .pages_active = 10,
         .preemptions = 1},
    };
    coordinator_metrics_cluster c = {
        .model_name = "qwen\"3\\x", .worker_count = 2, .workers = w};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_metrics_render(&m, &c, &b));
    const char *t = b.data;
#define L "{model_name=\"qwen\\\"3\\\\x\"}"
    CHECK_MSG(sample(t, "vllm:num_requests_running" L) == 5, "%s", strstr(t, "vllm:"));
    CHECK(sample(t, "vllm:num_requests_waiting" L) == 1);
    CHECK(sample(t, "vllm:kv_cache_usage_perc" L) == 0.1); /* 40 of 400 pages active */
    CHECK(sample(t, "vllm:prefix_cache_queries_total" L) == 40);
    CHECK(sample(t, "vllm:prefix_cache_hits_total" L) == 16);
    CHECK(sample(t, "vllm:prompt_tokens_total" L) == 40);
    CHECK(sample(t, "vllm:generation_tokens_total" L) == 9);
    CHECK(sample(t, "vllm:num_preemptions_total" L) == 3);
    CHECK(sample(t, "vllm:time_to_first_token_seconds_count" L) == 1);
    CHECK(sample(t, "vllm:inter_token_latency_seconds_count" L) == 2);
    CHECK(sample(t, "vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\\\"3\\\\x\","
                    "le=\"0.04\"}") == 2);
    CHECK(sample(t, "vllm:e2e_request_latency_seconds_count" L) == 0);
    CHECK_HAS(t, "# TYPE vllm:time_to_first_token_seconds histogram\n");
    CHECK_HAS(t, "# TYPE vllm:kv_cache_usage_perc gauge\n");
#undef L
    coordinator_buf_fini(&b);
}

static coordinator_metrics shared;

static void *record(void *arg)
{
    for (int i = 0; i < 1000000; i++) {
        coordinator_metrics_request(&shared, COORDINATOR_ENDPOINT_COMPLETIONS, 200);
        coordinator_metrics_observe(&shared.itl, 2000000);
        coordinator_metrics_tokens(&shared, 0, 1, 0);
    }
    return arg;
}

static void concurrent_recording_loses_nothing(void)
{
    coordinator_metrics_init(&shared);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, record, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    coordinator_metrics_cluster c = {0};
    coordinator_buf b;
    coordinator_buf_init(&b);
    CHECK(coordinator_metrics_render(&shared, &c, &b));
    CHECK(sample(b.data, "shoal_http_requests_total{route=\"/v1/completions\",status=\"200\"}") ==
          4000000);
    CHECK(sample(b.data, "shoal_inter_token_latency_seconds_count") == 4000000);
    CHECK(sample(b.data, "shoal_generation_tokens_total") == 4000000);
    coordinator_buf_fini(&b);
}

int main(void)
{
    TEST_RUN(counters_and_requests_by_status);
    TEST_RUN(histograms_are_cumulative_with_sum_and_count);
    TEST_RUN(workers_have_pages_streams_and_counters);
    TEST_RUN(vllm_names_carry_the_same_figures);
    TEST_RUN(concurrent_recording_loses_nothing);
    return TEST_EXIT();
}
