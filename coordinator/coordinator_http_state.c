/* coordinator_http_state.c: a generation request's life.
 *
 * RS_BODY (reading the body) -> RS_WAIT (streams submitted: the
 * connection is suspended until the cluster's thread queues an event that
 * calls for it) -> RS_STREAM (the SSE response is queued) or RS_DONE (a
 * whole answer). The request is reference-counted: the connection, each
 * stream and a queued SSE response hold one each. */
#include "coordinator_http_internal.h"

#include "common/common_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the request and its references ---- */

static void req_free(http_req *r)
{
    coordinator_http *h = r->h;
    pthread_mutex_lock(&h->lock);
    if (r->prev)
        r->prev->next = r->next;
    else
        h->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    pthread_mutex_unlock(&h->lock);
    if (r->streams_counted)
        atomic_fetch_sub(&h->streams, r->streams_counted);
    for (int i = 0; r->choices && i < r->n; i++) {
        http_choice *c = &r->choices[i];
        coordinator_stop_free(c->stop);
        coordinator_buf_fini(&c->text);
        coordinator_buf_fini(&c->tool_text);
        free(c->ids);
        free(c->lps);
    }
    free(r->choices);
    coordinator_request_fini(&r->req);
    coordinator_buf_fini(&r->out);
    free(r->prompt);
    http_body_release(r);
    free(r->pending);
    free(r->work);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void http_req_unref(http_req *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
        req_free(r);
}

http_req *http_req_new(coordinator_http *h, struct MHD_Connection *conn)
{
    http_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->h = h;
    r->conn = conn;
    atomic_init(&r->refs, 1); /* the connection's, dropped when it completes */
    pthread_mutex_init(&r->mu, NULL);
    coordinator_buf_init(&r->out);
    r->start_ns = common_mono_ns();
    pthread_mutex_lock(&h->lock);
    r->next = h->live;
    if (h->live)
        h->live->prev = r;
    h->live = r;
    pthread_mutex_unlock(&h->lock);
    atomic_fetch_add(&h->active, 1);
    return r;
}

/* Cancels a choice's stream once, and drops its reference unless its
 * final event already did. Never with a lock held: cancel waits for the
 * cluster's thread, which may be in on_event waiting for r->mu. */
static void cancel_choice(http_req *r, http_choice *c)
{
    pthread_mutex_lock(&r->mu);
    bool cancel = c->submitted && !c->cancelled;
    c->cancelled = true;
    pthread_mutex_unlock(&r->mu);
    if (!cancel)
        return;
    coordinator_cluster_cancel(r->h->cluster, c->stream_id);
    /* From here on_event is never called for it again. */
    pthread_mutex_lock(&r->mu);
    bool release = !c->released;
    c->released = true;
    pthread_mutex_unlock(&r->mu);
    if (release)
        http_req_unref(r);
}

void http_cancel_all(http_req *r)
{
    for (int i = 0; r->choices && i < r->n; i++)
        cancel_choice(r, &r->choices[i]);
}

/* The cluster's thread: queue and wake, nothing more. */
void http_on_event(void *ctx, const shm_event *ev, const char *error)
{
    http_choice *c = ctx;
    http_req *r = c->r;
    uint64_t t = common_mono_ns();
    bool release = false;
    pthread_mutex_lock(&r->mu);
    if (r->pending_len == r->pending_cap) {
        int cap = r->pending_cap ? 2 * r->pending_cap : 16;
        queued *grown = realloc(r->pending, (size_t)cap * sizeof *grown);
        if (grown) {
            r->pending = grown;
            r->pending_cap = cap;
        } else {
            r->broken = true;
        }
    }
    if (r->pending_len < r->pending_cap) {
        queued *q = &r->pending[r->pending_len++];
        q->ev = *ev;
        q->t_ns = t;
        q->choice = c->index;
    }
    if (ev->finish) {
        if (error) {
            c->failed = true;
            snprintf(c->error, sizeof c->error, "%s", error);
        }
        release = !c->released;
        c->released = true;
    }
    bool wake = r->req.stream || ev->finish || r->req.stop_count > 0 || r->broken ||
                r->pending_len % WAKE_EVERY_EVENTS == 0;
    r->pending_wake += wake;
    if (wake && r->parked) {
        r->parked = false;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    if (release)
        http_req_unref(r);
}

/* The hangup watcher's thread: the client closed its socket. */
void http_client_gone(void *ctx)
{
    http_req *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->gone = true;
    if (r->parked) {
        r->parked = false;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    http_cancel_all(r);
}

/* Suspends the connection until an event calls for it, unless one
 * already does or the client left. */
bool http_park(http_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool suspend = r->pending_wake == 0 && !r->gone && !r->broken;
    if (suspend) {
        r->parked = true;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    return suspend;
}

/* ---- events into output ---- */

static bool push_id(http_choice *c, int32_t id)
{
    if (c->ids_len == c->ids_cap) {
        int cap = c->ids_cap ? 2 * c->ids_cap : 64;
        int32_t *grown = realloc(c->ids, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        c->ids = grown;
        c->ids_cap = cap;
    }
    c->ids[c->ids_len++] = id;
    return true;
}

static bool push_logprob(http_choice *c, const shm_event *ev)
{
    if (c->lps_len == c->lps_cap) {
        int cap = c->lps_cap ? 2 * c->lps_cap : 16;
        coordinator_token_logprob *grown = realloc(c->lps, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        c->lps = grown;
        c->lps_cap = cap;
    }
    coordinator_token_logprob *l = &c->lps[c->lps_len++];
    l->token = ev->token;
    l->logprob = ev->logprob;
    int k = ev->top_count;
    k = k < 0 ? 0 : k > COORDINATOR_LOGPROBS_MAX ? COORDINATOR_LOGPROBS_MAX : k;
    l->top_count = k;
    memcpy(l->top_ids, ev->top_ids, (size_t)k * sizeof l->top_ids[0]);
    memcpy(l->top_logprobs, ev->top_logprobs, (size_t)k * sizeof l->top_logprobs[0]);
    return true;
}

/* Text that became final goes through the stop strings into the
 * choice's output; a match ends the choice and asks for its cancel. */
static void emit_text(http_choice *c, const char *text, size_t bytes)
{
    if (!c->stop) {
        coordinator_buf_append(&c->text, text, bytes);
        return;
    }
    char out[COORDINATOR_DETOK_PUSH_BYTES_MAX + COORDINATOR_STOP_BYTES_MAX];
    size_t n = 0;
    int k = coordinator_stop_feed(c->stop, text, bytes, out, &n);
    coordinator_buf_append(&c->text, out, n);
    if (k >= 0) {
        const coordinator_request *q = &c->r->req;
        c->done = true;
        c->cancel_wanted = true;
        c->finish_reason = "stop";
        c->stop_reason = (coordinator_stop_reason){.text = q->stop[k], .text_bytes = q->stop_bytes[k]};
        if (q->include_stop_str_in_output) /* vLLM's: the match is part of the text */
            coordinator_buf_append(&c->text, q->stop[k], q->stop_bytes[k]);
    }
}

static void take_event(http_req *r, http_choice *c, const shm_event *ev, uint64_t t)
{
    coordinator_http *h = r->h;
    if (c->done)
        return; /* after a stop string: the rest was cancelled */
    if (ev->token >= 0) {
        c->tokens++;
        if (c->tokens == 1) {
            coordinator_metrics_observe(&h->metrics.ttft, t - r->start_ns);
            if (!r->cached_known) {
                r->cached_known = true;
                r->cached_tokens = ev->cached_tokens;
            }
        } else {
            coordinator_metrics_observe(&h->metrics.itl, t - c->last_ns);
        }
        c->last_ns = t;
        if ((r->req.return_token_ids && !push_id(c, ev->token)) ||
            (r->req.logprobs && !push_logprob(c, ev))) {
            c->text.failed = true;
            return;
        }
        char piece[COORDINATOR_DETOK_PUSH_BYTES_MAX];
        size_t n = 0;
        coordinator_detok_push(&c->detok, ev->token, piece, sizeof piece, &n);
#ifdef SHOAL_TESTING
        if (h->test_output) {
            size_t at = (size_t)(c->tokens - 1) * TEST_OUTPUT_BYTES;
            n = at >= h->test_output_bytes                      ? 0
                : h->test_output_bytes - at < TEST_OUTPUT_BYTES ? h->test_output_bytes - at
                                                                : TEST_OUTPUT_BYTES;
            memcpy(piece, h->test_output + at, n);
        }
#endif
        emit_text(c, piece, n);
        if (c->done)
            return;
    }
    if (!ev->finish || ev->finish == COORDINATOR_FINISH_ERROR)
        return; /* an error is the request's (c->failed, under the lock) */
    char tail[COORDINATOR_DETOK_FINISH_BYTES_MAX];
    size_t tail_bytes = coordinator_detok_finish(&c->detok, tail);
#ifdef SHOAL_TESTING
    if (h->test_output)
        tail_bytes = 0;
#endif
    emit_text(c, tail, tail_bytes);
    if (c->done)
        return;
    if (c->stop) {
        char held[COORDINATOR_STOP_BYTES_MAX];
        coordinator_buf_append(&c->text, held, coordinator_stop_flush(c->stop, held));
    }
    c->done = true;
    c->finish_reason = ev->finish == 2 ? "length" : ev->finish == 3 ? "abort" : "stop";
    if (ev->finish == 1 && ev->token >= 0) /* a stop id of the request, not the model's end */
        for (int i = 0; i < r->req.stop_id_count; i++)
            if (r->req.stop_ids[i] == ev->token)
                c->stop_reason = (coordinator_stop_reason){.by_token = true, .token = ev->token};
}

/* Takes every queued event. Returns false if a choice failed or memory
 * ran out (*why set); the caller answers with an error. */
bool http_take_events(http_req *r, coordinator_api_error *why)
{
    pthread_mutex_lock(&r->mu);
    queued *batch = r->pending;
    int n = r->pending_len, cap = r->pending_cap;
    r->pending = r->work;
    r->pending_cap = r->work_cap;
    r->pending_len = 0;
    r->pending_wake = 0;
    r->work = batch;
    r->work_cap = cap;
    bool broken = r->broken;
    pthread_mutex_unlock(&r->mu);
    /* The swap above keeps both queues: their capacity is reused. */
    for (int i = 0; i < n; i++)
        take_event(r, &r->choices[batch[i].choice], &batch[i].ev, batch[i].t_ns);
    bool ok = !broken;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n && ok; i++) {
        if (r->choices[i].failed) {
            coordinator_api_error_set(why, 503, "server_error", NULL,
                                      "the worker refused the stream: %s", r->choices[i].error);
            ok = false;
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n && ok; i++)
        if (r->choices[i].text.failed)
            broken = true;
    if (broken && ok) {
        coordinator_api_error_set(why, 500, "server_error", NULL, "out of memory");
        ok = false;
    }
    for (int i = 0; i < r->n; i++)
        if (r->choices[i].cancel_wanted) {
            r->choices[i].cancel_wanted = false;
            cancel_choice(r, &r->choices[i]);
        }
    return ok;
}

bool http_all_done(const http_req *r)
{
    for (int i = 0; i < r->n; i++)
        if (!r->choices[i].done)
            return false;
    return true;
}

static bool any_output(const http_req *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->choices[i].tokens > 0 || r->choices[i].done)
            return true;
    return false;
}

coordinator_usage http_usage_of(const http_req *r)
{
    coordinator_usage u = {.prompt_tokens = r->prompt_len, .cached_tokens = r->cached_tokens};
    for (int i = 0; i < r->n; i++)
        u.completion_tokens += r->choices[i].tokens;
    return u;
}

/* ---- the first answer ---- */

/* A non-streamed response of every choice. A choice with no tokens
 * still lists its (empty) token ids and log-probabilities. */
static const int32_t no_ids[1];
static const coordinator_token_logprob no_logprobs[1];

static enum MHD_Result send_completion(http_req *r)
{
    coordinator_choice_out *outs =
        r->n >= 1 && r->n <= COORDINATOR_CHOICES_MAX ? malloc((size_t)r->n * sizeof *outs) : NULL;
    coordinator_toolcall_result *calls = outs ? calloc((size_t)r->n, sizeof *calls) : NULL;
    if (!calls) {
        free(outs);
        return http_send_nomem(r);
    }
    bool nomem = false;
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        if (r->tool_parse &&
            coordinator_toolcall_parse(r->tool_format, c->text.data ? c->text.data : "",
                                       c->text.len, &r->call_rng, &calls[i]) != SHOAL_OK)
            nomem = true;
        outs[i] = (coordinator_choice_out){
            .text = c->text.data ? c->text.data : "",
            .text_bytes = c->text.len,
            .token_ids = r->req.return_token_ids ? (c->ids ? c->ids : no_ids) : NULL,
            .token_count = c->ids_len,
            .logprobs = r->req.logprobs ? (c->lps ? c->lps : no_logprobs) : NULL,
            .logprob_count = c->lps_len,
            .finish_reason = calls[i].count > 0 ? "tool_calls" : c->finish_reason,
            .stop_reason = c->stop_reason,
            .tool_calls = &calls[i],
        };
    }
    coordinator_usage u = http_usage_of(r);
    coordinator_buf b;
    coordinator_buf_init(&b);
    bool ok = !nomem &&
              coordinator_response_body(&b, &r->meta, outs, r->n, &u,
                                        r->req.return_token_ids ? r->prompt : NULL, r->prompt_len);
    enum MHD_Result res = ok ? http_send_json(r, 200, &b) : http_send_nomem(r);
    coordinator_buf_fini(&b);
    for (int i = 0; i < r->n; i++)
        coordinator_toolcall_result_fini(&calls[i]);
    free(calls);
    free(outs);
    return res;
}

/* The first answer to a submitted request (an access-handler call after
 * its events woke it): the SSE response, the whole body, an error, or
 * another wait. */
enum MHD_Result http_answer(http_req *r)
{
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool gone = r->gone;
        pthread_mutex_unlock(&r->mu);
        if (gone)
            return MHD_NO;
        coordinator_api_error e;
        if (!http_take_events(r, &e)) {
            http_cancel_all(r);
            if (r->req.stream && any_output(r)) {
                http_write_stream_error(r, &e);
                return http_sse_start(r);
            }
            coordinator_buf_clear(&r->out);
            return http_send_error(r, &e);
        }
        if (r->req.stream && any_output(r)) {
            http_write_chunks(r);
            return http_sse_start(r);
        }
        if (!r->req.stream && http_all_done(r))
            return send_completion(r);
        if (http_park(r))
            return MHD_YES;
    }
}
