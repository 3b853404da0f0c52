/* shoal-bench: an OpenAI-API load generator for any server (shoal, vLLM,
 * llama.cpp's server), so all are measured the same way.
 *
 * Workloads:
 *   random         /v1/completions, prompts of random token ids
 *                  (--input-len, --range-ratio), --output-len tokens each
 *   shared-prefix  /v1/completions, --prefixes system prompts of
 *                  --prefix-len tokens, each followed by the tails of
 *                  --users users
 *   multi-turn     /v1/chat/completions, --conversations conversations of
 *                  --turns turns; each turn carries the whole history
 * Load: --concurrency requests in flight, or --rate requests per second
 * (Poisson arrivals); until --requests are done or --duration passes.
 * Every request streams (SSE) with ignore_eos, so it produces exactly
 * --output-len tokens on servers that honour it, and asks for usage.
 *
 * Reports TTFT, inter-token latency and end-to-end latency (p50, p90, p99),
 * output and total tokens/s, request throughput, errors and cached prompt
 * tokens (usage.prompt_tokens_details.cached_tokens), as text and, with
 * --json FILE, as JSON. A progress line runs on stderr. A stream whose
 * tokens all leave no text (special tokens, which servers skip, as a
 * random-weight model may pick) is a success counted apart
 * (requests_without_text): its tokens count, its TTFT is not taken. */
#include "bench_stats.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum workload { W_RANDOM, W_SHARED, W_MULTI };

typedef struct config {
    const char *url;
    const char *model;
    const char *api_key;
    const char *json_path;
    enum workload workload;
    int concurrency;
    double rate;
    int requests;
    double duration_s;
    int input_len;
    int output_len;
    double range_ratio;
    int prefixes, users, prefix_len;
    int conversations, turns;
    int vocab;
    uint64_t seed;
    double timeout_s;
} config;

/* One conversation of the multi-turn workload: its history as JSON. */
typedef struct conversation {
    cJSON *messages;
    int turn;
    bool busy;
} conversation;

typedef struct request {
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    double t_start, t_first, t_last;
    int chunks;
    int completion_tokens, prompt_tokens, cached_tokens;
    bool got_usage;
    long status;
    char *line;
    size_t line_len, line_cap;
    char *reply;
    size_t reply_len, reply_cap;
    int conv;
    bench_samples itl;
    bool failed;
    char error[160];
} request;

typedef struct run {
    config c;
    CURLM *multi;
    uint64_t rng;
    int started, finished, ok, failed;
    int no_text; /* ok, but every token was one the server leaves out of text */
    int in_flight;
    double t0;
    bench_samples ttft, itl, e2e;
    long long out_tokens, prompt_tokens, cached_tokens;
    conversation *convs;
    int32_t **prefix_ids;
    char first_error[200];
} run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static int rand_len(run *r, int len)
{
    if (r->c.range_ratio <= 0.0)
        return len;
    double lo = len * (1.0 - r->c.range_ratio), hi = len * (1.0 + r->c.range_ratio);
    int n = (int)(lo + rng_unit(&r->rng) * (hi - lo + 1.0));
    return n < 1 ? 1 : n;
}

static void add_ids(cJSON *arr, run *r, int n)
{
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(
            arr, cJSON_CreateNumber((double)(rng_next(&r->rng) % (uint64_t)r->c.vocab)));
}

/* Random words, for chat text: about one token each. */
static void add_words(char *buf, size_t cap, run *r, int words)
{
    static const char *const w[] = {"the",    "river", "stone",  "light", "moves", "under",
                                    "quiet",  "north", "field",  "glass", "seven", "orange",
                                    "winter", "paper", "signal", "harbor"};
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < words && n + 16 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? " " : "",
                              w[rng_next(&r->rng) % (sizeof w / sizeof w[0])]);
}

static char *make_body(run *r, request *q)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", r->c.model);
    cJSON_AddNumberToObject(root, "max_tokens", r->c.output_len);
    cJSON_AddBoolToObject(root, "stream", true);
    cJSON_AddBoolToObject(root, "ignore_eos", true);
    cJSON_AddNumberToObject(root, "temperature", 0);
    cJSON *so = cJSON_AddObjectToObject(root, "stream_options");
    cJSON_AddBoolToObject(so, "include_usage", true);
    if (r->c.workload == W_MULTI) {
        conversation *cv = &r->convs[q->conv];
        char text[16384];
        add_words(text, sizeof text, r, rand_len(r, r->c.input_len));
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(cv->messages, m);
        cJSON_AddItemToObject(root, "messages", cJSON_Duplicate(cv->messages, true));
    } else {
        cJSON *prompt = cJSON_AddArrayToObject(root, "prompt");
        if (r->c.workload == W_SHARED) {
            int p = (int)(rng_next(&r->rng) % (uint64_t)r->c.prefixes);
            for (int i = 0; i < r->c.prefix_len; i++)
                cJSON_AddItemToArray(prompt, cJSON_CreateNumber(r->prefix_ids[p][i]));
            int tail = r->c.input_len - r->c.prefix_len; /* its length varies by --range-ratio */
            add_ids(prompt, r, rand_len(r, tail > 1 ? tail : 1));
        } else {
            add_ids(prompt, r, rand_len(r, r->c.input_len));
        }
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static bool append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return false;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* One SSE line: "data: {...}" or "data: [DONE]". */
static void on_line(request *q, const char *line)
{
    if (line[0] == '{' && !q->failed) { /* an error's JSON body, not an event */
        cJSON *j = cJSON_Parse(line);
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        if (cJSON_IsString(msg)) {
            q->failed = true;
            snprintf(q->error, sizeof q->error, "%s", msg->valuestring);
        }
        cJSON_Delete(j);
        return;
    }
    if (strncmp(line, "data:", 5) != 0)
        return;
    line += 5;
    while (*line == ' ')
        line++;
    if (strcmp(line, "[DONE]") == 0)
        return;
    cJSON *j = cJSON_Parse(line);
    if (!j)
        return;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (err && !q->failed) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        q->failed = true;
        snprintf(q->error, sizeof q->error, "%s",
                 cJSON_IsString(msg) ? msg->valuestring : "error event in the stream");
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
    if (c0) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c0, "text");
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        if (!text && delta)
            text = cJSON_GetObjectItemCaseSensitive(delta, "content");
        if (cJSON_IsString(text) && text->valuestring[0]) {
            double t = now_s();
            if (q->chunks == 0)
                q->t_first = t;
            else
                bench_samples_add(&q->itl, t - q->t_last);
            q->t_last = t;
            q->chunks++;
            append(&q->reply, &q->reply_len, &q->reply_cap, text->valuestring,
                   strlen(text->valuestring));
        }
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(usage)) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        const cJSON *det = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
        const cJSON *cached = det ? cJSON_GetObjectItemCaseSensitive(det, "cached_tokens") : NULL;
        if (cJSON_IsNumber(ct)) {
            q->completion_tokens = ct->valueint;
            q->got_usage = true;
        }
        if (cJSON_IsNumber(pt))
            q->prompt_tokens = pt->valueint;
        if (cJSON_IsNumber(cached))
            q->cached_tokens = cached->valueint;
    }
    cJSON_Delete(j);
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *ctx)
{
    request *q = ctx;
    size_t n = size * nmemb;
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            if (q->line_len && q->line[q->line_len - 1] == '\r')
                q->line[--q->line_len] = '\0';
            if (q->line_len)
                on_line(q, q->line);
            q->line_len = 0;
            if (q->line)
                q->line[0] = '\0';
        } else if (!append(&q->line, &q->line_len, &q->line_cap, &data[i], 1)) {
            return 0;
        }
    }
    return n;
}

static bool start_one(run *r)
{
    request *q = calloc(1, sizeof *q);
    if (!q)
        return false;
    q->conv = -1;
    if (r->c.workload == W_MULTI) {
        for (int i = 0; i < r->c.conversations; i++) {
            conversation *cv = &r->convs[(r->started + i) % r->c.conversations];
            if (!cv->busy && cv->turn < r->c.turns) {
                q->conv = (int)(cv - r->convs);
                cv->busy = true;
                break;
            }
        }
        if (q->conv < 0) {
            free(q);
            return false;
        }
    }
    q->body = make_body(r, q);
    q->easy = curl_easy_init();
    char url[1024], auth[600];
    snprintf(url, sizeof url, "%s%s", r->c.url,
             r->c.workload == W_MULTI ? "/v1/chat/completions" : "/v1/completions");
    q->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (r->c.api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->c.api_key);
        q->headers = curl_slist_append(q->headers, auth);
    }
    curl_easy_setopt(q->easy, CURLOPT_URL, url);
    curl_easy_setopt(q->easy, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(q->easy, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(q->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(q->easy, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(q->easy, CURLOPT_PRIVATE, q);
    curl_easy_setopt(q->easy, CURLOPT_TIMEOUT_MS, (long)(r->c.timeout_s * 1000));
    curl_easy_setopt(q->easy, CURLOPT_NOSIGNAL, 1L);
    q->t_start = now_s();
    curl_multi_add_handle(r->multi, q->easy);
    r->started++;
    r->in_flight++;
    return true;
}

static void finish_one(run *r, CURL *easy, CURLcode code)
{
    request *q;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&q);
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->line_len)
        on_line(q, q->line);
    double t_end = now_s();
    /* A stream whose tokens were all ones the server leaves out of the
     * text (special tokens) is a success with tokens but no first-token
     * time: counted ok, out of the TTFT and ITL samples. */
    bool text = q->chunks > 0;
    bool ok = code == CURLE_OK && q->status == 200 && !q->failed &&
              (text || (q->got_usage && q->completion_tokens > 0));
    if (ok) {
        r->ok++;
        r->no_text += !text;
        if (text)
            bench_samples_add(&r->ttft, (q->t_first - q->t_start) * 1e3);
        bench_samples_add(&r->e2e, (t_end - q->t_start) * 1e3);
        for (size_t i = 0; i < q->itl.n; i++)
            bench_samples_add(&r->itl, q->itl.v[i] * 1e3);
        r->out_tokens += q->got_usage ? q->completion_tokens : q->chunks;
        r->prompt_tokens += q->prompt_tokens;
        r->cached_tokens += q->cached_tokens;
    } else {
        r->failed++;
        if (!r->first_error[0]) {
            if (code == CURLE_OK && q->status != 200 && q->error[0])
                snprintf(r->first_error, sizeof r->first_error, "HTTP %ld: %s", q->status,
                         q->error);
            else if (code != CURLE_OK || q->error[0])
                snprintf(r->first_error, sizeof r->first_error, "%s",
                         code != CURLE_OK ? curl_easy_strerror(code) : q->error);
            else if (q->status != 200)
                snprintf(r->first_error, sizeof r->first_error, "HTTP status %ld", q->status);
            else
                snprintf(r->first_error, sizeof r->first_error,
                         "HTTP 200 but no tokens in the stream");
        }
    }
    if (q->conv >= 0) {
        conversation *cv = &r->convs[q->conv];
        cv->busy = false;
        cv->turn++;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", q->reply ? q->reply : "");
        cJSON_AddItemToArray(cv->messages, m);
    }
    curl_multi_remove_handle(r->multi, easy);
    curl_easy_cleanup(easy);
    curl_slist_free_all(q->headers);
    cJSON_free(q->body);
    free(q->line);
    free(q->reply);
    bench_samples_free(&q->itl);
    free(q);
    r->in_flight--;
    r->finished++;
}

static void progress(run *r, bool last)
{
    double t = now_s() - r->t0;
    int total = r->c.requests > 0 ? r->c.requests : 0;
    int width = 30, fill = total ? (int)((double)r->finished / total * width) : 0;
    if (!total && r->c.duration_s > 0)
        fill = (int)(t / r->c.duration_s * width);
    if (fill > width)
        fill = width;
    fprintf(stderr, "\r[%.*s%*s] %d done, %d failed, %lld tokens, %.1f s%s", fill,
            "##############################", width - fill, "", r->finished, r->failed,
            r->out_tokens, t, last ? "\n" : "");
}

static void usage(FILE *f)
{
    fprintf(f, "usage: shoal-bench --url URL [options]\n"
               "  --url URL              server base URL, e.g. http://127.0.0.1:8000\n"
               "  --model NAME           model name sent in requests (default: the first\n"
               "                         of the server's GET /v1/models)\n"
               "  --api-key KEY          sent as a bearer token\n"
               "  --workload W           random | shared-prefix | multi-turn (default random)\n"
               "  --concurrency N        requests in flight (default 16)\n"
               "  --rate R               requests per second, Poisson arrivals (default: as\n"
               "                         fast as --concurrency allows)\n"
               "  --requests N           stop after N requests (default 100)\n"
               "  --duration S           or stop starting requests after S seconds\n"
               "  --input-len N          prompt tokens (default 128)\n"
               "  --output-len N         output tokens (default 128)\n"
               "  --range-ratio R        prompt lengths uniform in N*(1-R)..N*(1+R) (default 0;\n"
               "                         shared-prefix: the tails' lengths)\n"
               "  --prefixes N --users M --prefix-len N   shared-prefix shape (4, 8, 3/4 input)\n"
               "  --conversations N --turns T             multi-turn shape (concurrency, 4)\n"
               "  --vocab N              token ids are drawn below N (default 32000)\n"
               "  --seed N               (default 1)\n"
               "  --timeout S            per request (default 600)\n"
               "  --json FILE            write the report as JSON\n");
}

static int parse_args(int argc, char **argv, config *c)
{
    static const struct option opts[] = {{"url", 1, 0, 'u'},           {"model", 1, 0, 'm'},
                                         {"api-key", 1, 0, 'k'},       {"workload", 1, 0, 'w'},
                                         {"concurrency", 1, 0, 'c'},   {"rate", 1, 0, 'r'},
                                         {"requests", 1, 0, 'n'},      {"duration", 1, 0, 'd'},
                                         {"input-len", 1, 0, 'i'},     {"output-len", 1, 0, 'o'},
                                         {"range-ratio", 1, 0, 'R'},   {"prefixes", 1, 0, 'P'},
                                         {"users", 1, 0, 'U'},         {"prefix-len", 1, 0, 'L'},
                                         {"conversations", 1, 0, 'C'}, {"turns", 1, 0, 'T'},
                                         {"vocab", 1, 0, 'V'},         {"seed", 1, 0, 's'},
                                         {"timeout", 1, 0, 't'},       {"json", 1, 0, 'j'},
                                         {"help", 0, 0, 'h'},          {0, 0, 0, 0}};
    *c = (config){.model = NULL,
                  .workload = W_RANDOM,
                  .concurrency = 16,
                  .requests = 100,
                  .input_len = 128,
                  .output_len = 128,
                  .prefixes = 4,
                  .users = 8,
                  .turns = 4,
                  .vocab = 32000,
                  .seed = 1,
                  .timeout_s = 600};
    c->api_key = getenv("SHOAL_API_KEY");
    bool requests_given = false;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        double v = optarg ? strtod(optarg, &end) : 0;
        bool num_ok = optarg && end != optarg && *end == '\0' && v >= 0;
        switch (o) {
        case 'u':
            c->url = optarg;
            continue;
        case 'm':
            c->model = optarg;
            continue;
        case 'k':
            c->api_key = optarg;
            continue;
        case 'j':
            c->json_path = optarg;
            continue;
        case 'h':
            usage(stdout);
            exit(0);
        case 'w':
            if (strcmp(optarg, "random") == 0)
                c->workload = W_RANDOM;
            else if (strcmp(optarg, "shared-prefix") == 0)
                c->workload = W_SHARED;
            else if (strcmp(optarg, "multi-turn") == 0)
                c->workload = W_MULTI;
            else {
                fprintf(stderr,
                        "shoal-bench: --workload '%s': random, shared-prefix or "
                        "multi-turn\n",
                        optarg);
                return 2;
            }
            continue;
        case '?':
            usage(stderr);
            return 2;
        }
        if (!num_ok) {
            fprintf(stderr, "shoal-bench: %s '%s': expected a non-negative number\n",
                    argv[optind - 1], optarg);
            return 2;
        }
        switch (o) {
        case 'c':
            c->concurrency = (int)v;
            break;
        case 'r':
            c->rate = v;
            break;
        case 'n':
            c->requests = (int)v;
            requests_given = true;
            break;
        case 'd':
            c->duration_s = v;
            break;
        case 'i':
            c->input_len = (int)v;
            break;
        case 'o':
            c->output_len = (int)v;
            break;
        case 'R':
            c->range_ratio = v;
            break;
        case 'P':
            c->prefixes = (int)v;
            break;
        case 'U':
            c->users = (int)v;
            break;
        case 'L':
            c->prefix_len = (int)v;
            break;
        case 'C':
            c->conversations = (int)v;
            break;
        case 'T':
            c->turns = (int)v;
            break;
        case 'V':
            c->vocab = (int)v;
            break;
        case 's':
            c->seed = (uint64_t)v;
            break;
        case 't':
            c->timeout_s = v;
            break;
        }
    }
    if (!c->url || optind < argc) {
        usage(stderr);
        return 2;
    }
    if (c->duration_s > 0 && !requests_given)
        c->requests = 0; /* the duration decides */
    if (!c->prefix_len)
        c->prefix_len = c->input_len * 3 / 4;
    if (!c->conversations)
        c->conversations = c->concurrency;
    if (c->workload == W_MULTI && !requests_given && c->duration_s <= 0)
        c->requests = c->conversations * c->turns;
    if (c->concurrency < 1 || c->input_len < 1 || c->output_len < 1 || c->vocab < 1 ||
        c->prefixes < 1 || c->users < 1 || c->prefix_len >= c->input_len || c->turns < 1) {
        fprintf(stderr, "shoal-bench: --concurrency, --input-len, --output-len, --vocab, "
                        "--prefixes, --users, --turns must be at least 1, and --prefix-len "
                        "below --input-len\n");
        return 2;
    }
    return 0;
}

static void write_report(run *r, double seconds)
{
    double p[3] = {50, 90, 99};
    bench_samples *sets[3] = {&r->ttft, &r->itl, &r->e2e};
    const char *names[3] = {"ttft_ms", "itl_ms", "e2e_ms"};
    double v[3][3];
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 3; k++)
            v[s][k] = bench_percentile(sets[s], p[k]);
    double out_tps = r->out_tokens / seconds;
    double total_tps = (double)(r->out_tokens + r->prompt_tokens) / seconds;
    printf("requests: %d ok, %d failed in %.2f s (%.2f requests/s)\n", r->ok, r->failed, seconds,
           r->ok / seconds);
    if (r->no_text)
        printf("requests whose tokens had no text (special tokens only; not in TTFT): %d\n",
               r->no_text);
    printf("tokens: %lld output (%.1f tokens/s), %lld prompt, %lld prompt tokens cached "
           "(%.1f%%); total %.1f tokens/s\n",
           r->out_tokens, out_tps, r->prompt_tokens, r->cached_tokens,
           r->prompt_tokens ? 100.0 * (double)r->cached_tokens / (double)r->prompt_tokens : 0.0,
           total_tps);
    for (int s = 0; s < 3; s++)
        printf("%-8s p50 %9.2f   p90 %9.2f   p99 %9.2f\n", names[s], v[s][0], v[s][1], v[s][2]);
    if (r->first_error[0])
        printf("first error: %s\n", r->first_error);
    if (!r->c.json_path)
        return;
    cJSON *root = cJSON_CreateObject();
    for (int s = 0; s < 3; s++) {
        cJSON *o = cJSON_AddObjectToObject(root, names[s]);
        cJSON_AddNumberToObject(o, "p50", v[s][0]);
        cJSON_AddNumberToObject(o, "p90", v[s][1]);
        cJSON_AddNumberToObject(o, "p99", v[s][2]);
        cJSON_AddNumberToObject(o, "mean", bench_mean(sets[s]));
    }
    cJSON_AddNumberToObject(root, "output_tokens_per_s", out_tps);
    cJSON_AddNumberToObject(root, "total_tokens_per_s", total_tps);
    cJSON_AddNumberToObject(root, "requests_per_s", r->ok / seconds);
    cJSON_AddNumberToObject(root, "requests_ok", r->ok);
    cJSON_AddNumberToObject(root, "requests_failed", r->failed);
    cJSON_AddNumberToObject(root, "requests_without_text", r->no_text);
    cJSON_AddNumberToObject(root, "output_tokens", (double)r->out_tokens);
    cJSON_AddNumberToObject(root, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(root, "cached_prompt_tokens", (double)r->cached_tokens);
    cJSON_AddNumberToObject(root, "duration_s", seconds);
    static const char *const wl[] = {"random", "shared-prefix", "multi-turn"};
    cJSON_AddStringToObject(root, "workload", wl[r->c.workload]);
    cJSON_AddNumberToObject(root, "concurrency", r->c.concurrency);
    cJSON_AddNumberToObject(root, "input_len", r->c.input_len);
    cJSON_AddNumberToObject(root, "output_len", r->c.output_len);
    char *text = cJSON_Print(root);
    FILE *f = fopen(r->c.json_path, "w");
    if (!f || fputs(text, f) == EOF || fputc('\n', f) == EOF || fclose(f) != 0)
        fprintf(stderr, "shoal-bench: cannot write %s: %s\n", r->c.json_path, strerror(errno));
    cJSON_free(text);
    cJSON_Delete(root);
}

/* Appends what curl reads to a bounded buffer. */
struct body_buf {
    char data[65536];
    size_t len;
};

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    struct body_buf *b = user;
    size_t len = size * n, room = sizeof b->data - 1 - b->len;
    size_t take = len < room ? len : room;
    memcpy(b->data + b->len, p, take);
    b->len += take;
    b->data[b->len] = '\0';
    return len;
}

/* The first model the server serves (GET /v1/models), for requests that
 * name none: into name; false with a line on stderr that says why. */
static bool first_served_model(const config *c, char *name, size_t bytes)
{
    char url[1024], auth[600];
    snprintf(url, sizeof url, "%s/v1/models", c->url);
    struct body_buf *b = calloc(1, sizeof *b);
    CURL *easy = curl_easy_init();
    struct curl_slist *headers = NULL;
    if (c->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->api_key);
        headers = curl_slist_append(NULL, auth);
    }
    bool ok = false;
    long status = 0;
    if (b && easy) {
        curl_easy_setopt(easy, CURLOPT_URL, url);
        curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(easy, CURLOPT_WRITEDATA, b);
        curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)(c->timeout_s * 1000));
        CURLcode code = curl_easy_perform(easy);
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        cJSON *j = code == CURLE_OK ? cJSON_Parse(b->data) : NULL;
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, 0), "id");
        if (code != CURLE_OK)
            fprintf(stderr, "shoal-bench: GET %s: %s\n", url, curl_easy_strerror(code));
        else if (status != 200 || !cJSON_IsString(id))
            fprintf(stderr, "shoal-bench: GET %s: HTTP %ld, no model in the answer: %.300s\n", url,
                    status, b->data);
        else
            ok = (size_t)snprintf(name, bytes, "%s", id->valuestring) < bytes;
        cJSON_Delete(j);
    }
    if (!ok)
        fprintf(stderr, "shoal-bench: give --model NAME (the model the server serves)\n");
    curl_slist_free_all(headers);
    if (easy)
        curl_easy_cleanup(easy);
    free(b);
    return ok;
}

int main(int argc, char **argv)
{
    run r;
    memset(&r, 0, sizeof r);
    int rc = parse_args(argc, argv, &r.c);
    if (rc)
        return rc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    static char served[512];
    if (!r.c.model) {
        if (!first_served_model(&r.c, served, sizeof served)) {
            curl_global_cleanup();
            return 1;
        }
        r.c.model = served;
        fprintf(stderr, "shoal-bench: model '%s' (the server's first)\n", served);
    }
    r.multi = curl_multi_init();
    r.rng = r.c.seed;
    if (r.c.workload == W_SHARED) {
        r.prefix_ids = calloc((size_t)r.c.prefixes, sizeof *r.prefix_ids);
        for (int p = 0; p < r.c.prefixes; p++) {
            r.prefix_ids[p] = malloc((size_t)r.c.prefix_len * sizeof **r.prefix_ids);
            for (int i = 0; i < r.c.prefix_len; i++)
                r.prefix_ids[p][i] = (int32_t)(rng_next(&r.rng) % (uint64_t)r.c.vocab);
        }
    }
    if (r.c.workload == W_MULTI) {
        r.convs = calloc((size_t)r.c.conversations, sizeof *r.convs);
        for (int i = 0; i < r.c.conversations; i++)
            r.convs[i].messages = cJSON_CreateArray();
    }
    bool tty = isatty(2);
    r.t0 = now_s();
    double next_arrival = r.t0, last_progress = 0;
    for (;;) {
        double t = now_s();
        bool more = (r.c.requests == 0 || r.started < r.c.requests) &&
                    (r.c.duration_s <= 0 || t - r.t0 < r.c.duration_s);
        while (more && r.in_flight < r.c.concurrency && (r.c.rate <= 0 || t >= next_arrival)) {
            if (!start_one(&r))
                break;
            if (r.c.rate > 0)
                next_arrival += -log(1.0 - rng_unit(&r.rng)) / r.c.rate;
            more = (r.c.requests == 0 || r.started < r.c.requests);
        }
        if (!more && r.in_flight == 0)
            break;
        int running;
        curl_multi_perform(r.multi, &running);
        CURLMsg *msg;
        int left, finished = 0;
        while ((msg = curl_multi_info_read(r.multi, &left)))
            if (msg->msg == CURLMSG_DONE) {
                finish_one(&r, msg->easy_handle, msg->data.result);
                finished++;
            }
        /* a finished request's slot is refilled at once: waiting in the
         * poll first (50 ms when nothing else is in flight) would leave
         * the server idle between a closed loop's requests */
        if (finished)
            continue;
        int wait_ms = 50;
        if (r.c.rate > 0 && more) {
            int until = (int)((next_arrival - now_s()) * 1e3);
            wait_ms = until < 0 ? 0 : until < 50 ? until : 50;
        }
        curl_multi_poll(r.multi, NULL, 0, wait_ms, NULL);
        if (now_s() - last_progress > (tty ? 0.25 : 5.0)) {
            progress(&r, false);
            last_progress = now_s();
        }
    }
    progress(&r, true);
    write_report(&r, now_s() - r.t0);
    curl_multi_cleanup(r.multi);
    curl_global_cleanup();
    bench_samples_free(&r.ttft);
    bench_samples_free(&r.itl);
    bench_samples_free(&r.e2e);
    for (int p = 0; r.prefix_ids && p < r.c.prefixes; p++)
        free(r.prefix_ids[p]);
    free(r.prefix_ids);
    for (int i = 0; r.convs && i < r.c.conversations; i++)
        cJSON_Delete(r.convs[i].messages);
    free(r.convs);
    return r.ok > 0 && r.failed == 0 ? 0 : 1;
}
