/* coordinator_http_routes.c: the routes and their handlers.
 *
 * Generation (/v1/chat/completions, /v1/completions) parses the request,
 * builds its prompt in one of the per-thread text slots and submits each
 * choice to the cluster (the answer follows in coordinator_http_state.c);
 * /tokenize, /detokenize, /v1/models, /metrics and /health answer at once. */
#include "coordinator_http_internal.h"

#include "common/common_hash.h"
#include "common/common_log.h"
#include "common/common_rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const http_route routes[] = {
    {"/v1/chat/completions", COORDINATOR_ENDPOINT_CHAT, "POST"},
    {"/v1/completions", COORDINATOR_ENDPOINT_COMPLETIONS, "POST"},
    {"/v1/models", COORDINATOR_ENDPOINT_MODELS, "GET, HEAD"},
    {"/tokenize", COORDINATOR_ENDPOINT_TOKENIZE, "POST"},
    {"/detokenize", COORDINATOR_ENDPOINT_DETOKENIZE, "POST"},
    {"/health", COORDINATOR_ENDPOINT_HEALTH, "GET, HEAD"},
    {"/metrics", COORDINATOR_ENDPOINT_METRICS, "GET, HEAD"},
};

const http_route *http_route_find(http_req *r, const char *url)
{
    static const char models_prefix[] = "/v1/models/";
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(url, routes[i].path) == 0)
            return &routes[i];
    size_t n = sizeof models_prefix - 1;
    if (strncmp(url, models_prefix, n) == 0 && url[n] && strlen(url + n) < sizeof r->model_arg) {
        snprintf(r->model_arg, sizeof r->model_arg, "%s", url + n);
        return &routes[2];
    }
    return NULL;
}

bool http_route_allows(const char *methods, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = methods; (p = strstr(p, method)) != NULL; p += n)
        if ((p == methods || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* Ids and unseeded choices' seeds. */
static uint64_t random64(coordinator_http *h)
{
    uint64_t state =
        atomic_fetch_add_explicit(&h->rng, 0x9e3779b97f4a7c15ull, memory_order_relaxed);
    return common_rng_next(&state);
}

/* ---- text slots ---- */

static text_slot *slot_take(coordinator_http *h)
{
    pthread_mutex_lock(&h->lock);
    for (;;) {
        for (int i = 0; i < h->threads; i++)
            if (!h->slots[i].busy) {
                h->slots[i].busy = true;
                pthread_mutex_unlock(&h->lock);
                return &h->slots[i];
            }
        /* Only as many handlers run at once as there are threads. */
        pthread_cond_wait(&h->slot_free, &h->lock);
    }
}

static void slot_give(coordinator_http *h, text_slot *s)
{
    pthread_mutex_lock(&h->lock);
    s->busy = false;
    pthread_cond_signal(&h->slot_free);
    pthread_mutex_unlock(&h->lock);
}

/* ---- generation: a request into streams ---- */

static int submit_status(shoal_err err)
{
    return err == SHOAL_ERR_INVALID || err == SHOAL_ERR_LIMIT ? 400 : 503;
}

static shoal_err build_prompt(http_req *r, coordinator_api_error *e)
{
    coordinator_http *h = r->h;
    text_slot *s = slot_take(h);
    size_t n = 0;
    shoal_err err = coordinator_request_prompt(&r->req, h->tok, h->chat, s->work, s->ids,
                                               (size_t)h->limits.max_model_len, &n, e);
    if (!err) {
        r->prompt = malloc((n ? n : 1) * sizeof *r->prompt);
        if (r->prompt) {
            memcpy(r->prompt, s->ids, n * sizeof *r->prompt);
            r->prompt_len = (int)n;
        } else {
            coordinator_api_error_set(e, 500, "server_error", NULL, "out of memory");
            err = SHOAL_ERR_NOMEM;
        }
    }
    slot_give(h, s);
    return err;
}

/* echo: each choice's text starts with the prompt, as given (a text
 * prompt) or decoded (token ids), ahead of what the stop strings see; a
 * stream sends it with the first chunk. false if memory ran out. */
static bool echo_prompt(http_req *r)
{
    const coordinator_request *q = &r->req;
    const char *text = q->prompt_text;
    size_t len = q->prompt_text_bytes;
    char *decoded = NULL;
    if (!text) {
        unsigned flags = q->skip_special_tokens ? COORDINATOR_DECODE_SKIP_SPECIAL : 0;
        coordinator_tokenizer_decode(r->h->tok, r->prompt, (size_t)r->prompt_len, flags, NULL, 0,
                                     &len);
        decoded = malloc(len + 1);
        if (!decoded || coordinator_tokenizer_decode(r->h->tok, r->prompt, (size_t)r->prompt_len,
                                                     flags, decoded, len + 1, &len) != SHOAL_OK) {
            free(decoded);
            return false;
        }
        text = decoded;
    }
    bool ok = true;
    for (int i = 0; i < r->n; i++) {
        coordinator_buf_append(&r->choices[i].text, text, len);
        ok = ok && !coordinator_buf_failed(&r->choices[i].text);
    }
    free(decoded);
    return ok;
}

static enum MHD_Result generate(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_api_error e;
    coordinator_request_kind kind = r->endpoint == COORDINATOR_ENDPOINT_CHAT
                                        ? COORDINATOR_REQUEST_CHAT
                                        : COORDINATOR_REQUEST_COMPLETION;
    if (coordinator_request_parse(kind, r->body, r->body_len, &h->limits, &r->req, &e) ||
        build_prompt(r, &e) ||
        coordinator_request_fit(&r->req, r->prompt_len, &h->limits, &r->max_tokens, &e))
        return http_send_error(r, &e);
    if (r->req.ignored_fields[0])
        LOG_WARN("http: %s: ignored unknown field%s %s (--ignore-unknown-fields)",
                 kind == COORDINATOR_REQUEST_CHAT ? "/v1/chat/completions" : "/v1/completions",
                 strchr(r->req.ignored_fields, ',') ? "s" : "", r->req.ignored_fields);
    const char *client_id = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (client_id && coordinator_request_id_check(client_id, &e))
        return http_send_error(r, &e);
    http_body_release(r); /* parsed: the request keeps what it needs */
    const coordinator_request *q = &r->req;
    r->n = q->n;
    if (r->n > h->streams_max) { /* never fits: a 429 would be retried for ever */
        coordinator_api_error_set(&e, 400, "invalid_request_error", "n",
                                  "'n' is %d, more than the %d streams this server runs at once "
                                  "(--max-streams)",
                                  r->n, h->streams_max);
        return http_send_error(r, &e);
    }
    if (atomic_fetch_add(&h->streams, r->n) + r->n > h->streams_max) {
        atomic_fetch_sub(&h->streams, r->n);
        return http_send_simple_error(r, 429, "rate_limit_error", NULL,
                                      "too many requests in flight; retry later");
    }
    r->streams_counted = r->n;
    coordinator_response_meta_init(&r->meta, kind, h->model, h->tok, q->top_logprobs, client_id,
                                   random64(h), (long long)time(NULL));
    /* With tool_choice "none" the tools were rendered all the same (as
     * vLLM does); only "auto" reads the output for calls. */
    r->tool_parse = kind == COORDINATOR_REQUEST_CHAT && q->tools &&
                    q->tool_choice == COORDINATOR_TOOL_CHOICE_AUTO && h->chat;
    if (r->tool_parse)
        r->tool_format = coordinator_chat_format_of(h->chat);
    r->call_rng = random64(h);
    r->choices = calloc((size_t)r->n, sizeof *r->choices);
    if (!r->choices)
        return http_send_nomem(r);
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        c->r = r;
        c->index = i;
        coordinator_buf_init(&c->text);
        coordinator_buf_init(&c->tool_text);
        coordinator_detok_init(&c->detok, h->tok,
                               q->skip_special_tokens ? COORDINATOR_DECODE_SKIP_SPECIAL : 0);
        if (q->stop_count &&
            coordinator_stop_new(q->stop, q->stop_bytes, q->stop_count, &c->stop) != SHOAL_OK)
            return http_send_nomem(r);
    }
    if (q->echo && !echo_prompt(r))
        return http_send_nomem(r);
    coordinator_stream_request sr;
    memset(&sr, 0, sizeof sr);
    sr.prompt = r->prompt;
    sr.prompt_len = r->prompt_len;
    sr.max_tokens = r->max_tokens;
    sr.sampling = (shm_sampling){
        .temperature = q->sampling.temperature,
        .top_k = q->sampling.top_k > 0 ? q->sampling.top_k : 0, /* the engine's "off" */
        .top_p = q->sampling.top_p,
        .min_p = q->sampling.min_p,
        .repetition_penalty = q->sampling.repetition_penalty,
        .presence_penalty = q->sampling.presence_penalty,
        .frequency_penalty = q->sampling.frequency_penalty,
        .logprobs = q->logprobs ? q->top_logprobs : 0,
    };
    sr.ignore_eos = q->ignore_eos;
    sr.stop_count = q->stop_id_count;
    memcpy(sr.stop_ids, q->stop_ids, (size_t)q->stop_id_count * sizeof sr.stop_ids[0]);
    if (q->cache_salt) {
        sr.has_salt = true;
        common_hash_bytes(q->cache_salt, q->cache_salt_bytes, &sr.salt);
    }
    /* Chat streams start with each choice's role; an error before the
     * first token replaces them with an error response. */
    if (q->stream && kind == COORDINATOR_REQUEST_CHAT)
        for (int i = 0; i < r->n; i++) {
            coordinator_chunk k = {
                .index = i, .role = true, .text = "", .usage_null = q->include_usage};
            if (i == 0 && q->return_token_ids) {
                k.prompt_ids = r->prompt;
                k.prompt_len = r->prompt_len;
            }
            coordinator_response_chunk(&r->out, &r->meta, &k);
        }
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        /* Seeded choices differ by their index, so n > 1 with a seed
         * gives n different, reproducible samples. */
        sr.sampling.seed = q->sampling.has_seed ? q->sampling.seed + (uint64_t)i : random64(h);
        /* The stream's reference, taken before its first event can come. */
        atomic_fetch_add(&r->refs, 1);
        c->submitted = true;
        shoal_diag diag = {{0}};
        shoal_err err =
            coordinator_cluster_submit(h->cluster, &sr, http_on_event, c, &c->stream_id, &diag);
        if (err) {
            c->submitted = false;
            c->released = true;
            http_req_unref(r);
            http_cancel_all(r);
            coordinator_api_error_set(&e, submit_status(err),
                                      submit_status(err) == 400 ? "invalid_request_error"
                                                                : "server_error",
                                      NULL, "%s", diag.msg);
            return http_send_error(r, &e);
        }
    }
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info && coordinator_hangup_add(h->hangup, info->connect_fd, http_client_gone, r,
                                       &r->hangup_id) == SHOAL_OK)
        r->watched = true;
    r->state = RS_WAIT;
    return http_answer(r);
}

/* ---- the other routes ---- */

static enum MHD_Result tokenize(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_api_error e;
    if (coordinator_request_parse(COORDINATOR_REQUEST_TOKENIZE, r->body, r->body_len, &h->limits,
                                  &r->req, &e) ||
        build_prompt(r, &e))
        return http_send_error(r, &e);
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result res =
        coordinator_response_tokenize(&b, h->tok, r->prompt, r->prompt_len, h->limits.max_model_len,
                                      r->req.return_token_strs)
            ? http_send_json(r, 200, &b)
            : http_send_nomem(r);
    coordinator_buf_fini(&b);
    return res;
}

static enum MHD_Result detokenize(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_api_error e;
    if (coordinator_request_parse(COORDINATOR_REQUEST_DETOKENIZE, r->body, r->body_len, &h->limits,
                                  &r->req, &e))
        return http_send_error(r, &e);
    unsigned flags = r->req.skip_special_tokens ? COORDINATOR_DECODE_SKIP_SPECIAL : 0;
    size_t need = 0;
    coordinator_tokenizer_decode(h->tok, r->req.prompt_ids, (size_t)r->req.prompt_id_count, flags,
                                 NULL, 0, &need);
    char *text = malloc(need + 1);
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result res;
    if (text &&
        coordinator_tokenizer_decode(h->tok, r->req.prompt_ids, (size_t)r->req.prompt_id_count,
                                     flags, text, need + 1, &need) == SHOAL_OK &&
        coordinator_response_detokenize(&b, text, need))
        res = http_send_json(r, 200, &b);
    else
        res = http_send_nomem(r);
    free(text);
    coordinator_buf_fini(&b);
    return res;
}

static enum MHD_Result models(http_req *r)
{
    coordinator_http *h = r->h;
    if (r->model_arg[0] && strcmp(r->model_arg, h->model) != 0) {
        coordinator_api_error e;
        coordinator_api_error_set(&e, 404, "invalid_request_error", "model",
                                  "The model `%s` does not exist.", r->model_arg);
        e.code = "model_not_found";
        return http_send_error(r, &e);
    }
    coordinator_buf b;
    coordinator_buf_init(&b);
    bool ok = coordinator_response_models(&b, h->model, h->started_s, h->limits.max_model_len,
                                          r->model_arg[0] != '\0');
    enum MHD_Result res = ok ? http_send_json(r, 200, &b) : http_send_nomem(r);
    coordinator_buf_fini(&b);
    return res;
}

static enum MHD_Result metrics(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_cluster_stats *st = malloc(sizeof *st);
    coordinator_metrics_worker *w = malloc(COORDINATOR_WORKERS_MAX * sizeof *w);
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result res;
    if (!st || !w) {
        res = http_send_nomem(r);
        goto out;
    }
    coordinator_cluster_stats_get(h->cluster, st);
    for (int i = 0; i < st->workers; i++) {
        const coordinator_worker_stats *s = &st->worker[i];
        w[i] = (coordinator_metrics_worker){
            .index = s->index,
            .alive = s->alive,
            .restarts = s->restarts,
            .running = s->load.running,
            .waiting = s->load.waiting,
            .pages_total = s->load.pages_total,
            .pages_free = s->load.pages_free,
            .pages_active = s->load.pages_active,
            .pages_cached = s->load.pages_cached,
            .steps = s->load.steps,
            .computed_tokens = s->load.computed_tokens,
            .cached_tokens = s->load.cached_tokens,
            .generated_tokens = s->load.generated_tokens,
            .preemptions = s->load.preemptions,
            .restore_tokens = s->load.restore_tokens,
            .import_tokens = s->import_tokens,
            .states_spilled = s->load.states_spilled,
            .states_refused = s->load.states_refused,
            .states_dropped = s->load.states_dropped,
            .states_skipped = s->load.states_skipped,
        };
        snprintf(w[i].device, sizeof w[i].device, "%s", s->device);
    }
    coordinator_metrics_cluster c = {
        .model_name = h->model, .worker_count = st->workers, .workers = w, .resumed = st->resumed};
    atomic_store(&h->metrics.http_running, atomic_load(&h->active));
    atomic_store(&h->metrics.http_body_bytes, (int64_t)atomic_load(&h->bodies_bytes));
    res = coordinator_metrics_render(&h->metrics, &c, &b)
              ? http_send_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len)
              : http_send_nomem(r);
out:
    coordinator_buf_fini(&b);
    free(st);
    free(w);
    return res;
}

/* For a load balancer: 200 while at least one worker serves (new
 * streams go there), 503 when none does or the server is shutting down.
 * The body counts the workers; ?all=1 adds each one's health. */
static enum MHD_Result health(http_req *r)
{
    coordinator_cluster_health hl;
    coordinator_cluster_health_get(r->h->cluster, &hl);
    bool draining = atomic_load(&r->h->draining);
    const char *status = draining          ? "shutting down"
                         : hl.serving == 0 ? "unavailable"
                         : hl.serving < hl.workers ? "degraded"
                                                   : "ok";
    coordinator_buf b;
    coordinator_buf_init(&b);
    coordinator_buf_printf(&b, "{\"status\":\"%s\",\"workers\":%d,\"serving\":%d,\"not_serving\":%d",
                           status, hl.workers, hl.serving, hl.workers - hl.serving);
    const char *all = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "all");
    if (all && strcmp(all, "0") != 0 && strcmp(all, "false") != 0) {
        coordinator_buf_str(&b, ",\"worker\":[");
        for (int i = 0; i < hl.workers; i++)
            coordinator_buf_printf(&b, "%s{\"index\":%d,\"health\":\"%s\"}", i ? "," : "", i,
                                   coordinator_worker_health_name(hl.worker[i]));
        coordinator_buf_str(&b, "]");
    }
    coordinator_buf_str(&b, "}");
    enum MHD_Result res = coordinator_buf_failed(&b)
                              ? http_send_nomem(r)
                              : http_send_json(r, draining || hl.serving == 0 ? 503 : 200, &b);
    coordinator_buf_fini(&b);
    return res;
}

enum MHD_Result http_dispatch(http_req *r)
{
    /* The server is closing (coordinator_http_close marked it): nothing
     * new starts. */
    pthread_mutex_lock(&r->mu);
    bool gone = r->gone;
    pthread_mutex_unlock(&r->mu);
    if (gone)
        return MHD_NO;
    if (r->has_early)
        return http_send_error(r, &r->early);
    if (r->preflight)
        return http_send_preflight(r);
    switch (r->endpoint) {
    case COORDINATOR_ENDPOINT_CHAT:
    case COORDINATOR_ENDPOINT_COMPLETIONS:
        return generate(r);
    case COORDINATOR_ENDPOINT_TOKENIZE:
        return tokenize(r);
    case COORDINATOR_ENDPOINT_DETOKENIZE:
        return detokenize(r);
    case COORDINATOR_ENDPOINT_MODELS:
        return models(r);
    case COORDINATOR_ENDPOINT_METRICS:
        return metrics(r);
    case COORDINATOR_ENDPOINT_HEALTH:
        return health(r);
    default:
        return http_send_simple_error(r, 404, "invalid_request_error", "not_found", "Not found");
    }
}
