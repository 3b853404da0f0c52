#include "coordinator_http.h"

#include "common/common_hash.h"
#include "common/common_log.h"
#include "common/common_rng.h"
#include "common/common_time.h"
#include "coordinator_buf.h"
#include "coordinator_detok.h"
#include "coordinator_hangup.h"
#include "coordinator_limits.h"
#include "coordinator_metrics.h"
#include "coordinator_request.h"
#include "coordinator_response.h"
#include "coordinator_stop.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

/* Bytes libmicrohttpd asks a streamed response for at once. */
enum { SSE_BLOCK_BYTES = 32 * 1024 };

/* A non-streamed request without stop strings has no use for each token
 * as it comes: its connection is woken at the end, or after this many
 * events so that its queue stays short. */
enum { WAKE_EVERY_EVENTS = 64 };

/* ---- the server ---- */

/* One HTTP thread's tokenizer work area and prompt buffer (max_model_len
 * ids), made at start: a request's prompt is built here, then copied out
 * at its exact size. */
typedef struct text_slot {
    coordinator_tokenizer_work *work;
    int32_t *ids;
    bool busy;
} text_slot;

typedef struct http_req http_req;

struct coordinator_http {
    coordinator_cluster *cluster;
    const coordinator_tokenizer *tok;
    const coordinator_chat *chat;
    char *model;
    char *api_key;
    size_t api_key_len;
    char *allowed_origin; /* NULL: no CORS */
    coordinator_request_limits limits;
    size_t body_bytes_max;
    size_t bodies_bytes_max;
    _Atomic size_t bodies_bytes; /* the buffers of bodies being read, all requests */
    int streams_max;
    int threads;
    struct MHD_Daemon *daemon;
    int port;
    long long started_s;
    coordinator_hangup *hangup;
    coordinator_metrics metrics;
    _Atomic int streams; /* choices in flight */
    _Atomic int active;  /* requests in flight */
    _Atomic bool draining;
    _Atomic uint64_t rng;
    pthread_mutex_t lock; /* the live list and the text slots */
    pthread_cond_t slot_free;
    http_req *live;
    text_slot *slots;
};

/* Ids and unseeded choices' seeds. */
static uint64_t random64(coordinator_http *h)
{
    uint64_t state =
        atomic_fetch_add_explicit(&h->rng, 0x9e3779b97f4a7c15ull, memory_order_relaxed);
    return common_rng_next(&state);
}

/* ---- requests ---- */

/* One event as the cluster's thread queued it. */
typedef struct queued {
    shm_event ev;
    uint64_t t_ns;
    int choice;
} queued;

typedef struct http_choice {
    http_req *r;
    int index;
    uint64_t stream_id;
    /* under r->mu */
    bool submitted; /* a stream exists, or did */
    bool cancelled; /* cancel was called (or is being called) */
    bool released;  /* its reference on the request was dropped */
    bool failed;    /* the cluster ended it with an error */
    char error[SHM_REJECT_TEXT_BYTES];
    /* the HTTP thread's */
    bool done;          /* nothing more for the client */
    bool cancel_wanted; /* a stop string matched */
    bool started;       /* its first chunk went out */
    bool finish_sent;
    const char *finish_reason;
    int tokens;
    uint64_t last_ns;
    coordinator_detok detok;
    coordinator_stop *stop;
    /* output not yet written: all of it for a body, this turn's for SSE */
    coordinator_buf text;
    int32_t *ids;
    int ids_len, ids_cap;
    coordinator_token_logprob *lps;
    int lps_len, lps_cap;
} http_choice;

typedef enum req_state {
    RS_BODY,   /* reading the body */
    RS_WAIT,   /* streams submitted; no response queued yet */
    RS_STREAM, /* the SSE response is queued */
    RS_DONE,   /* a whole response is queued */
} req_state;

struct http_req {
    coordinator_http *h;
    struct MHD_Connection *conn;
    http_req *prev, *next; /* h->live, under h->lock */
    _Atomic int refs;
    pthread_mutex_t mu;
    /* under mu */
    bool parked; /* suspended by us; only we resume it */
    bool gone;   /* the client left, or the request completed */
    bool broken; /* the queue could not grow */
    queued *pending;
    int pending_len, pending_cap;
    int pending_wake; /* events of those that call for a wake-up */
    /* the HTTP thread's */
    coordinator_endpoint endpoint;
    char model_arg[COORDINATOR_NAME_BYTES_MAX + 1]; /* /v1/models/{name} */
    const char *allow;                              /* methods, for a 405 */
    req_state state;
    int status;
    bool has_early;
    bool preflight; /* a CORS preflight (OPTIONS) of a known route */
    coordinator_api_error early;
    char *body;
    size_t body_len, body_cap, body_discarded;
    coordinator_request req;
    int32_t *prompt;
    int prompt_len;
    int max_tokens;
    int n;
    http_choice *choices;
    int streams_counted;
    queued *work;
    int work_cap;
    coordinator_response_meta meta;
    coordinator_buf out;
    size_t out_pos;
    bool ended;
    bool cached_known;
    int cached_tokens;
    uint64_t start_ns;
    bool watched;
    uint64_t hangup_id;
};

/* Takes what r's body buffer grows to (cap bytes, from r->body_cap) from
 * the server's budget for bodies being read; false, taking nothing, where
 * that would pass it. The buffer itself is r's to grow. */
static bool body_reserve(http_req *r, size_t cap)
{
    coordinator_http *h = r->h;
    size_t more = cap > r->body_cap ? cap - r->body_cap : 0;
    size_t was = atomic_fetch_add(&h->bodies_bytes, more);
    if (was + more > h->bodies_bytes_max) {
        atomic_fetch_sub(&h->bodies_bytes, more);
        return false;
    }
    return true;
}

/* Frees r's body buffer and gives its bytes back to the budget. */
static void body_release(http_req *r)
{
    atomic_fetch_sub(&r->h->bodies_bytes, r->body_cap);
    free(r->body);
    r->body = NULL;
    r->body_cap = 0;
}

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
        free(c->ids);
        free(c->lps);
    }
    free(r->choices);
    coordinator_request_fini(&r->req);
    coordinator_buf_fini(&r->out);
    free(r->prompt);
    body_release(r);
    free(r->pending);
    free(r->work);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void req_unref(http_req *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
        req_free(r);
}

static http_req *req_new(coordinator_http *h, struct MHD_Connection *conn)
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
        req_unref(r);
}

static void cancel_all(http_req *r)
{
    for (int i = 0; r->choices && i < r->n; i++)
        cancel_choice(r, &r->choices[i]);
}

/* The cluster's thread: queue and wake, nothing more. */
static void on_event(void *ctx, const shm_event *ev, const char *error)
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
        req_unref(r);
}

/* The hangup watcher's thread: the client closed its socket. */
static void client_gone(void *ctx)
{
    http_req *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->gone = true;
    if (r->parked) {
        r->parked = false;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    cancel_all(r);
}

/* Suspends the connection until an event calls for it, unless one
 * already does or the client left. */
static bool park(http_req *r)
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

/* ---- responses ---- */

/* The CORS headers every answer carries when an origin is allowed. */
static void add_cors(http_req *r, struct MHD_Response *resp)
{
    if (!r->h->allowed_origin)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->h->allowed_origin);
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id");
    if (strcmp(r->h->allowed_origin, "*") != 0)
        MHD_add_response_header(resp, "Vary", "Origin");
}

/* Queues a whole answer (not a stream) with the headers every one
 * carries, and frees resp. */
static enum MHD_Result queue_whole(http_req *r, int status, struct MHD_Response *resp)
{
    add_cors(r, resp);
    if (atomic_load(&r->h->draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->state = RS_DONE;
    return ok;
}

static enum MHD_Result send_body(http_req *r, int status, const char *type, const char *data,
                                 size_t bytes)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(bytes, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 405 && r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->meta.id[0])
        MHD_add_response_header(resp, "X-Request-Id", r->meta.id);
    return queue_whole(r, status, resp);
}

static enum MHD_Result send_json(http_req *r, int status, const coordinator_buf *b)
{
    return send_body(r, status, "application/json", b->data ? b->data : "", b->len);
}

static enum MHD_Result send_error(http_req *r, const coordinator_api_error *e)
{
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result ok = coordinator_response_error(&b, e)
                             ? send_json(r, e->status, &b)
                             : send_body(r, 500, "application/json", "{}", 2);
    coordinator_buf_fini(&b);
    return ok;
}

static enum MHD_Result send_simple_error(http_req *r, int status, const char *type,
                                         const char *code, const char *message)
{
    coordinator_api_error e;
    coordinator_api_error_set(&e, status, type, NULL, "%s", message);
    e.code = code;
    return send_error(r, &e);
}

static enum MHD_Result send_nomem(http_req *r)
{
    return send_simple_error(r, 500, "server_error", NULL, "out of memory");
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

/* ---- generation: events into output ---- */

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
    if (coordinator_stop_feed(c->stop, text, bytes, out, &n) >= 0) {
        c->done = true;
        c->cancel_wanted = true;
        c->finish_reason = "stop";
    }
    coordinator_buf_append(&c->text, out, n);
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
        emit_text(c, piece, n);
        if (c->done)
            return;
    }
    if (!ev->finish || ev->finish == COORDINATOR_FINISH_ERROR)
        return; /* an error is the request's (c->failed, under the lock) */
    char tail[COORDINATOR_DETOK_FINISH_BYTES_MAX];
    emit_text(c, tail, coordinator_detok_finish(&c->detok, tail));
    if (c->done)
        return;
    if (c->stop) {
        char held[COORDINATOR_STOP_BYTES_MAX];
        coordinator_buf_append(&c->text, held, coordinator_stop_flush(c->stop, held));
    }
    c->done = true;
    c->finish_reason = ev->finish == 2 ? "length" : ev->finish == 3 ? "abort" : "stop";
}

/* Takes every queued event. Returns false if a choice failed or memory
 * ran out (*why set); the caller answers with an error. */
static bool take_events(http_req *r, coordinator_api_error *why)
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

static bool all_done(const http_req *r)
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

static coordinator_usage usage_of(const http_req *r)
{
    coordinator_usage u = {.prompt_tokens = r->prompt_len, .cached_tokens = r->cached_tokens};
    for (int i = 0; i < r->n; i++)
        u.completion_tokens += r->choices[i].tokens;
    return u;
}

/* SSE chunks for what this turn produced, and the end of the stream. */
static void write_chunks(http_req *r)
{
    bool chat = r->req.kind == COORDINATOR_REQUEST_CHAT;
    int chunks = 0;
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        bool content = c->text.len || c->ids_len || c->lps_len;
        if (content) {
            coordinator_chunk k = {
                .index = i,
                .text = c->text.data ? c->text.data : "",
                .text_bytes = c->text.len,
                .token_ids = r->req.return_token_ids ? c->ids : NULL,
                .token_count = c->ids_len,
                .logprobs = r->req.logprobs ? c->lps : NULL,
                .logprob_count = c->lps_len,
                .usage_null = r->req.include_usage,
            };
            if (!chat && r->req.return_token_ids && !c->started) {
                k.prompt_ids = r->prompt;
                k.prompt_len = r->prompt_len;
            }
            coordinator_response_chunk(&r->out, &r->meta, &k);
            chunks++;
            c->started = true;
            coordinator_buf_clear(&c->text);
            c->ids_len = 0;
            c->lps_len = 0;
        }
        if (c->done && !c->finish_sent) {
            coordinator_chunk k = {.index = i,
                                   .text = "",
                                   .finish_reason = c->finish_reason,
                                   .usage_null = r->req.include_usage};
            if (r->req.return_token_ids)
                k.token_ids = c->ids; /* an empty list */
            if (!chat && r->req.return_token_ids && !c->started) {
                k.prompt_ids = r->prompt;
                k.prompt_len = r->prompt_len;
            }
            coordinator_response_chunk(&r->out, &r->meta, &k);
            c->started = true;
            c->finish_sent = true;
        }
    }
    if (chunks)
        atomic_fetch_add_explicit(&r->h->metrics.stream_chunks, (uint64_t)chunks,
                                  memory_order_relaxed);
    if (all_done(r) && !r->ended) {
        if (r->req.include_usage) {
            coordinator_usage u = usage_of(r);
            coordinator_response_chunk_usage(&r->out, &r->meta, &u);
        }
        coordinator_response_chunk_done(&r->out);
        r->ended = true;
    }
}

/* The end of a stream that failed after it began. */
static void write_stream_error(http_req *r, const coordinator_api_error *e)
{
    coordinator_response_chunk_error(&r->out, e);
    coordinator_response_chunk_done(&r->out);
    r->ended = true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_req *r = cls;
    for (;;) {
        if (r->out_pos < r->out.len) {
            size_t n = r->out.len - r->out_pos;
            n = n < max ? n : max;
            memcpy(buf, r->out.data + r->out_pos, n);
            r->out_pos += n;
            if (r->out_pos == r->out.len) {
                coordinator_buf_clear(&r->out);
                r->out_pos = 0;
            }
            return (ssize_t)n;
        }
        if (coordinator_buf_failed(&r->out))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&r->mu);
        bool gone = r->gone;
        pthread_mutex_unlock(&r->mu);
        if (gone)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        coordinator_api_error e;
        if (!take_events(r, &e)) {
            cancel_all(r);
            write_stream_error(r, &e);
            continue;
        }
        write_chunks(r);
        if (r->out.len)
            continue;
        if (park(r))
            return 0;
    }
}

static void sse_free(void *cls)
{
    req_unref(cls);
}

/* A non-streamed response of every choice. A choice with no tokens
 * still lists its (empty) token ids and log-probabilities. */
static const int32_t no_ids[1];
static const coordinator_token_logprob no_logprobs[1];

static enum MHD_Result send_completion(http_req *r)
{
    coordinator_choice_out outs[COORDINATOR_CHOICES_MAX];
    if (r->n < 1 || r->n > COORDINATOR_CHOICES_MAX)
        return send_nomem(r);
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        outs[i] = (coordinator_choice_out){
            .text = c->text.data ? c->text.data : "",
            .text_bytes = c->text.len,
            .token_ids = r->req.return_token_ids ? (c->ids ? c->ids : no_ids) : NULL,
            .token_count = c->ids_len,
            .logprobs = r->req.logprobs ? (c->lps ? c->lps : no_logprobs) : NULL,
            .logprob_count = c->lps_len,
            .finish_reason = c->finish_reason,
        };
    }
    coordinator_usage u = usage_of(r);
    coordinator_buf b;
    coordinator_buf_init(&b);
    bool ok = coordinator_response_body(&b, &r->meta, outs, r->n, &u,
                                        r->req.return_token_ids ? r->prompt : NULL, r->prompt_len);
    enum MHD_Result res = ok ? send_json(r, 200, &b) : send_nomem(r);
    coordinator_buf_fini(&b);
    return res;
}

/* The first answer to a submitted request (an access-handler call after
 * its events woke it): the SSE response, the whole body, an error, or
 * another wait. */
static enum MHD_Result answer(http_req *r)
{
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool gone = r->gone;
        pthread_mutex_unlock(&r->mu);
        if (gone)
            return MHD_NO;
        coordinator_api_error e;
        if (!take_events(r, &e)) {
            cancel_all(r);
            if (r->req.stream && any_output(r)) {
                write_stream_error(r, &e);
                goto out_stream;
            }
            coordinator_buf_clear(&r->out);
            return send_error(r, &e);
        }
        if (r->req.stream && any_output(r)) {
            write_chunks(r);
            goto out_stream;
        }
        if (!r->req.stream && all_done(r))
            return send_completion(r);
        if (park(r))
            return MHD_YES;
    }
out_stream:;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK_BYTES, sse_read, r, sse_free);
    if (!resp)
        return MHD_NO;
    atomic_fetch_add(&r->refs, 1); /* the response's, dropped by sse_free */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    MHD_add_response_header(resp, "X-Request-Id", r->meta.id);
    add_cors(r, resp);
    enum MHD_Result ok = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->state = RS_STREAM;
    return ok;
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
        return send_error(r, &e);
    body_release(r); /* parsed: the request keeps what it needs */
    const coordinator_request *q = &r->req;
    r->n = q->n;
    if (r->n > h->streams_max) { /* never fits: a 429 would be retried for ever */
        coordinator_api_error_set(&e, 400, "invalid_request_error", "n",
                                  "'n' is %d, more than the %d streams this server runs at once "
                                  "(--max-streams)",
                                  r->n, h->streams_max);
        return send_error(r, &e);
    }
    if (atomic_fetch_add(&h->streams, r->n) + r->n > h->streams_max) {
        atomic_fetch_sub(&h->streams, r->n);
        return send_simple_error(r, 429, "rate_limit_error", NULL,
                                 "too many requests in flight; retry later");
    }
    r->streams_counted = r->n;
    coordinator_response_meta_init(&r->meta, kind, h->model, h->tok, q->top_logprobs, random64(h),
                                   (long long)time(NULL));
    r->choices = calloc((size_t)r->n, sizeof *r->choices);
    if (!r->choices)
        return send_nomem(r);
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        c->r = r;
        c->index = i;
        coordinator_buf_init(&c->text);
        coordinator_detok_init(&c->detok, h->tok,
                               q->skip_special_tokens ? COORDINATOR_DECODE_SKIP_SPECIAL : 0);
        if (q->stop_count &&
            coordinator_stop_new(q->stop, q->stop_bytes, q->stop_count, &c->stop) != SHOAL_OK)
            return send_nomem(r);
    }
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
            coordinator_cluster_submit(h->cluster, &sr, on_event, c, &c->stream_id, &diag);
        if (err) {
            c->submitted = false;
            c->released = true;
            req_unref(r);
            cancel_all(r);
            coordinator_api_error_set(&e, submit_status(err),
                                      submit_status(err) == 400 ? "invalid_request_error"
                                                                : "server_error",
                                      NULL, "%s", diag.msg);
            return send_error(r, &e);
        }
    }
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info && coordinator_hangup_add(h->hangup, info->connect_fd, client_gone, r,
                                       &r->hangup_id) == SHOAL_OK)
        r->watched = true;
    r->state = RS_WAIT;
    return answer(r);
}

/* ---- the other routes ---- */

static enum MHD_Result tokenize(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_api_error e;
    if (coordinator_request_parse(COORDINATOR_REQUEST_TOKENIZE, r->body, r->body_len, &h->limits,
                                  &r->req, &e) ||
        build_prompt(r, &e))
        return send_error(r, &e);
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result res =
        coordinator_response_tokenize(&b, h->tok, r->prompt, r->prompt_len, h->limits.max_model_len,
                                      r->req.return_token_strs)
            ? send_json(r, 200, &b)
            : send_nomem(r);
    coordinator_buf_fini(&b);
    return res;
}

static enum MHD_Result detokenize(http_req *r)
{
    coordinator_http *h = r->h;
    coordinator_api_error e;
    if (coordinator_request_parse(COORDINATOR_REQUEST_DETOKENIZE, r->body, r->body_len, &h->limits,
                                  &r->req, &e))
        return send_error(r, &e);
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
        res = send_json(r, 200, &b);
    else
        res = send_nomem(r);
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
        return send_error(r, &e);
    }
    coordinator_buf b;
    coordinator_buf_init(&b);
    bool ok = coordinator_response_models(&b, h->model, h->started_s, h->limits.max_model_len,
                                          r->model_arg[0] != '\0');
    enum MHD_Result res = ok ? send_json(r, 200, &b) : send_nomem(r);
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
        res = send_nomem(r);
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
        .worker_count = st->workers, .workers = w, .resumed = st->resumed};
    atomic_store(&h->metrics.http_running, atomic_load(&h->active));
    atomic_store(&h->metrics.http_body_bytes, (int64_t)atomic_load(&h->bodies_bytes));
    res = coordinator_metrics_render(&h->metrics, &c, &b)
              ? send_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len)
              : send_nomem(r);
out:
    coordinator_buf_fini(&b);
    free(st);
    free(w);
    return res;
}

static enum MHD_Result health(http_req *r)
{
    if (atomic_load(&r->h->draining))
        return send_simple_error(r, 503, "server_error", NULL, "the server is shutting down");
    if (!coordinator_cluster_healthy(r->h->cluster))
        return send_simple_error(r, 503, "server_error", NULL,
                                 "a worker is not answering; see /metrics");
    return send_body(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

/* ---- routing and the access handler ---- */

static const struct route {
    const char *path;
    coordinator_endpoint endpoint;
    const char *methods;
} routes[] = {
    {"/v1/chat/completions", COORDINATOR_ENDPOINT_CHAT, "POST"},
    {"/v1/completions", COORDINATOR_ENDPOINT_COMPLETIONS, "POST"},
    {"/v1/models", COORDINATOR_ENDPOINT_MODELS, "GET, HEAD"},
    {"/tokenize", COORDINATOR_ENDPOINT_TOKENIZE, "POST"},
    {"/detokenize", COORDINATOR_ENDPOINT_DETOKENIZE, "POST"},
    {"/health", COORDINATOR_ENDPOINT_HEALTH, "GET, HEAD"},
    {"/metrics", COORDINATOR_ENDPOINT_METRICS, "GET, HEAD"},
};

static const struct route *find_route(http_req *r, const char *url)
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

static bool method_allowed(const char *methods, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = methods; (p = strstr(p, method)) != NULL; p += n)
        if ((p == methods || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* "Bearer KEY", compared in time that does not depend on where it differs. */
static bool authorized(coordinator_http *h, struct MHD_Connection *conn)
{
    if (!h->api_key)
        return true;
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!v || strncasecmp(v, "Bearer ", 7) != 0)
        return false;
    v += 7;
    while (*v == ' ')
        v++;
    size_t n = strlen(v);
    unsigned diff = n != h->api_key_len;
    for (size_t i = 0; i < h->api_key_len; i++)
        diff |= (unsigned char)h->api_key[i] ^ (unsigned char)(i < n ? v[i] : 0);
    return diff == 0;
}

static void set_early(http_req *r, int status, const char *type, const char *code,
                      const char *message)
{
    r->has_early = true;
    coordinator_api_error_set(&r->early, status, type, NULL, "%s", message);
    r->early.code = code;
}

/* A body that would pass the budget of all bodies being read: 503, which
 * OpenAI's clients retry. */
static void set_bodies_full(http_req *r)
{
    char msg[200];
    snprintf(msg, sizeof msg,
             "Request bodies being read hold the %zu MiB this server buffers for them "
             "(--max-body-memory-mib); retry shortly",
             r->h->bodies_bytes_max >> 20);
    set_early(r, 503, "server_error", "bodies_over_budget", msg);
}

/* The request's Content-Length headers: whether two of them disagree. */
typedef struct length_seen {
    const char *first;
    bool conflict;
} length_seen;

static enum MHD_Result see_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    length_seen *ls = cls;
    if (key && value && strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (ls->first && strcmp(ls->first, value) != 0)
            ls->conflict = true;
        if (!ls->first)
            ls->first = value;
    }
    return MHD_YES;
}

/* The first call, with the headers: route, key, size. An error is kept
 * and answered once the body is read (answering before would close the
 * connection with the body unread, which resets it before the client
 * reads the answer), but for a body too large, which is not read. */
static enum MHD_Result on_headers(http_req *r, const char *url, const char *method)
{
    coordinator_http *h = r->h;
    const struct route *rt = find_route(r, url);
    r->endpoint = rt ? rt->endpoint : COORDINATOR_ENDPOINT_OTHER;
    r->state = RS_BODY;
    char msg[SHOAL_DIAG_BYTES];
    if (atomic_load(&h->draining)) {
        set_early(r, 503, "server_error", NULL, "the server is shutting down");
    } else if (rt && h->allowed_origin && strcmp(method, "OPTIONS") == 0) {
        /* a browser's preflight carries no credentials */
        r->preflight = true;
        r->allow = rt->methods;
    } else if (r->endpoint != COORDINATOR_ENDPOINT_HEALTH && !authorized(h, r->conn)) {
        set_early(r, 401, "authentication_error", "invalid_api_key",
                  "Incorrect or missing API key: send \"Authorization: Bearer KEY\"");
    } else if (!rt) {
        snprintf(msg, sizeof msg, "Not found: %.200s", url);
        set_early(r, 404, "invalid_request_error", "not_found", msg);
    } else if (!method_allowed(rt->methods, method)) {
        r->allow = rt->methods;
        snprintf(msg, sizeof msg, "Method %.16s is not allowed here; use %s", method, rt->methods);
        set_early(r, 405, "invalid_request_error", "method_not_allowed", msg);
    }
    /* A body in a coding other than chunked cannot be read: libmicrohttpd
     * would wait for it until the connection times out. */
    const char *te =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te && strcasecmp(te, "chunked") != 0) {
        /* an error found first (a 401, a 503) is the answer, but now */
        if (!r->has_early) {
            snprintf(msg, sizeof msg,
                     "Transfer-Encoding '%.64s' is not supported: send the body as it is, "
                     "with a Content-Length, or chunked",
                     te);
            set_early(r, 501, "invalid_request_error", "not_implemented", msg);
        }
        return send_error(r, &r->early);
    }
    /* Two lengths that differ leave the body's end in doubt: libmicrohttpd
     * reads by the first, a proxy in front may have used the other (request
     * smuggling). Refused, as RFC 9112 says; the same value twice is one. */
    length_seen ls = {NULL, false};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, see_length, &ls);
    if (ls.conflict) {
        if (!r->has_early)
            set_early(r, 400, "invalid_request_error", "invalid_content_length",
                      "Content-Length is given twice with different values: send one");
        return send_error(r, &r->early);
    }
    const char *cl =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long len = strtoull(cl, &end, 10);
        if (errno || end == cl || len > h->body_bytes_max) {
            snprintf(msg, sizeof msg, "The request body is over the limit of %zu bytes",
                     h->body_bytes_max);
            set_early(r, 413, "invalid_request_error", "request_too_large", msg);
            return send_error(r, &r->early);
        }
        if (!r->has_early && !r->preflight && len > 0) {
            /* the declared length, up to COORDINATOR_BODY_FIRST_BYTES; the
             * rest as it arrives: a client that declares 32 MiB and sends
             * nothing holds no more than that (1,000 such connections
             * reserved 33 GB when the whole length was taken at once) */
            size_t cap =
                len < COORDINATOR_BODY_FIRST_BYTES ? (size_t)len : COORDINATOR_BODY_FIRST_BYTES;
            if (!body_reserve(r, cap)) {
                set_bodies_full(r); /* the body is read and dropped, then the 503 */
                return MHD_YES;
            }
            r->body = malloc(cap + 1);
            if (!r->body) {
                atomic_fetch_sub(&h->bodies_bytes, cap);
                return MHD_NO;
            }
            r->body_cap = cap;
        }
    }
    return MHD_YES;
}

static enum MHD_Result on_upload(http_req *r, const char *data, size_t bytes)
{
    coordinator_http *h = r->h;
    if (r->has_early || r->preflight) {
        /* Read and dropped, so the answer reaches the client; a client
         * that sends far more than it may is cut off. */
        r->body_discarded += bytes;
        return r->body_discarded > 2 * h->body_bytes_max ? MHD_NO : MHD_YES;
    }
    if (r->body_len + bytes > h->body_bytes_max) {
        /* chunked, without a Content-Length */
        char msg[128];
        snprintf(msg, sizeof msg, "The request body is over the limit of %zu bytes",
                 h->body_bytes_max);
        set_early(r, 413, "invalid_request_error", "request_too_large", msg);
        body_release(r);
        r->body_discarded = r->body_len + bytes;
        return MHD_YES;
    }
    if (r->body_len + bytes > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + bytes)
            cap *= 2;
        cap = cap > h->body_bytes_max ? h->body_bytes_max : cap;
        if (!body_reserve(r, cap)) { /* read and dropped; then the 503 */
            set_bodies_full(r);
            body_release(r);
            r->body_discarded = r->body_len + bytes;
            return MHD_YES;
        }
        char *grown = realloc(r->body, cap + 1);
        if (!grown) {
            atomic_fetch_sub(&h->bodies_bytes, cap - r->body_cap);
            return MHD_NO;
        }
        r->body = grown;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, bytes);
    r->body_len += bytes;
    return MHD_YES;
}

/* A CORS preflight: 204 with what the route allows; the headers a
 * browser asks for are allowed (as vLLM's default allows any). */
static enum MHD_Result send_preflight(http_req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    char methods[64];
    snprintf(methods, sizeof methods, "%s, OPTIONS", r->allow);
    const char *asked =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods);
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            asked && asked[0] ? asked : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    return queue_whole(r, 204, resp);
}

static enum MHD_Result dispatch(http_req *r)
{
    /* The server is closing (coordinator_http_close marked it): nothing
     * new starts. */
    pthread_mutex_lock(&r->mu);
    bool gone = r->gone;
    pthread_mutex_unlock(&r->mu);
    if (gone)
        return MHD_NO;
    if (r->has_early)
        return send_error(r, &r->early);
    if (r->preflight)
        return send_preflight(r);
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
        return send_simple_error(r, 404, "invalid_request_error", "not_found", "Not found");
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **con_cls)
{
    coordinator_http *h = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = req_new(h, conn);
        if (!r)
            return MHD_NO;
        *con_cls = r;
        return on_headers(r, url, method);
    }
    switch (r->state) {
    case RS_BODY:
        if (*upload_size) {
            enum MHD_Result ok = on_upload(r, upload_data, *upload_size);
            *upload_size = 0;
            return ok;
        }
        return dispatch(r);
    case RS_WAIT:
        return answer(r);
    default:
        return MHD_YES;
    }
}

/* The request is over (answered, or the connection failed or closed). */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    coordinator_http *h = cls;
    http_req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    if (r->watched)
        coordinator_hangup_remove(h->hangup, r->hangup_id);
    pthread_mutex_lock(&r->mu);
    /* Only libmicrohttpd knows whether the whole answer went out: a
     * client that closes its socket once it has read the end (a load
     * generator exiting) can be seen by the hangup watcher before this
     * runs, and that is not a client that left. (One whose answer was
     * complete but partly still in the socket's buffer when it closed
     * counts 200 too, as its tokens do; one that left mid-answer had its
     * streams cancelled and the response ended with an error: 499.) */
    bool left = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    r->gone = true;
    r->conn = NULL;
    pthread_mutex_unlock(&r->mu);
    cancel_all(r);
    /* 499: the client left before its answer was complete (nginx's code). */
    int status = r->status;
    if (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
        status = 503;
    else if (left && (r->state == RS_WAIT || r->state == RS_STREAM || r->state == RS_BODY))
        status = 499;
    coordinator_metrics_request(&h->metrics, r->endpoint, status);
    if (r->choices) { /* a request the client left was computed too (as vLLM counts) */
        coordinator_usage u = usage_of(r);
        coordinator_metrics_tokens(&h->metrics, (uint64_t)u.prompt_tokens,
                                   (uint64_t)u.completion_tokens, (uint64_t)u.cached_tokens);
    }
    if (r->choices && status == 200)
        coordinator_metrics_observe(&h->metrics.duration, common_mono_ns() - r->start_ns);
    atomic_fetch_sub(&h->active, 1);
    req_unref(r);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    /* These two are how a request whose client left ends (we return
     * MHD_NO or END_WITH_ERROR on purpose): not worth a warning. */
    if (strstr(line, "Application reported internal error") ||
        strstr(line, "application error generating response"))
        return;
    LOG_WARN("http: %s", line);
}

/* ---- open / close ---- */

int coordinator_http_port(const coordinator_http *h)
{
    return h->port;
}

int coordinator_http_active(coordinator_http *h)
{
    return atomic_load(&h->active);
}

void coordinator_http_drain(coordinator_http *h)
{
    if (atomic_exchange(&h->draining, true))
        return;
    MHD_socket fd = MHD_quiesce_daemon(h->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

void coordinator_http_close(coordinator_http *h)
{
    if (!h)
        return;
    if (h->daemon) {
        coordinator_http_drain(h);
        /* Every request in flight ends: its streams are cancelled and a
         * suspended connection is resumed, which libmicrohttpd needs
         * before it stops. */
        for (;;) {
            pthread_mutex_lock(&h->lock);
            http_req *r = h->live;
            while (r) {
                pthread_mutex_lock(&r->mu);
                bool pending = !r->gone;
                pthread_mutex_unlock(&r->mu);
                if (pending)
                    break;
                r = r->next;
            }
            if (r)
                atomic_fetch_add(&r->refs, 1);
            pthread_mutex_unlock(&h->lock);
            if (!r)
                break;
            client_gone(r);
            req_unref(r);
        }
        MHD_stop_daemon(h->daemon);
    }
    coordinator_hangup_close(h->hangup);
    for (int i = 0; h->slots && i < h->threads; i++) {
        coordinator_tokenizer_work_close(h->slots[i].work);
        free(h->slots[i].ids);
    }
    free(h->slots);
    pthread_cond_destroy(&h->slot_free);
    pthread_mutex_destroy(&h->lock);
    free(h->model);
    free(h->api_key);
    free(h->allowed_origin);
    free(h);
}

static shoal_err resolve(const char *host, int port, struct sockaddr_storage *addr,
                         shoal_diag *diag)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || !res)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "--host %s: %s", host, gai_strerror(rc));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return SHOAL_OK;
}

shoal_err coordinator_http_bind(const char *host, int port, int *fd, shoal_diag *diag)
{
    *fd = -1;
    host = host ? host : "127.0.0.1";
    struct sockaddr_storage addr;
    shoal_err err = resolve(host, port, &addr, diag);
    if (err)
        return err;
    socklen_t len =
        addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    int s = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s, (struct sockaddr *)&addr, len) != 0 || listen(s, 1024) != 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        return shoal_diag_set(diag, SHOAL_ERR_IO, "http: cannot listen on %s port %d: %s%s", host,
                              port, strerror(e),
                              e == EADDRINUSE ? " (another server has it: stop it, or give "
                                                "--port N, 0 for any free one)"
                                              : "");
    }
    *fd = s;
    return SHOAL_OK;
}

bool coordinator_http_origin_valid(const char *origin)
{
    size_t n = strlen(origin);
    bool plain = n <= COORDINATOR_NAME_BYTES_MAX;
    for (size_t i = 0; i < n; i++) /* it goes into a header as it is */
        plain &= (unsigned char)origin[i] > 0x20 && origin[i] != 0x7f;
    return plain;
}

static shoal_err http_open(const coordinator_http_options *o, coordinator_cluster *cluster,
                           const coordinator_tokenizer *tok, const coordinator_chat *chat,
                           coordinator_http **out, shoal_diag *diag)
{
    *out = NULL;
    int fd = o->listen_fd;
    int threads = o->threads ? o->threads : 2;
    if (threads < 1 || threads > COORDINATOR_HTTP_THREADS_MAX || o->port < 0 || o->port > 65535)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "http: threads must be 1..%d and the port 0..65535",
                              COORDINATOR_HTTP_THREADS_MAX);
    if (o->api_key && strlen(o->api_key) > COORDINATOR_NAME_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "the API key is over %d bytes",
                              COORDINATOR_NAME_BYTES_MAX);
    if (o->allowed_origin && !coordinator_http_origin_valid(o->allowed_origin))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "the allowed origin '%.64s' must be '*' or an origin such as "
                              "https://example.com (no spaces or control characters, at most "
                              "%d bytes)",
                              o->allowed_origin, COORDINATOR_NAME_BYTES_MAX);
    size_t one_body = o->body_bytes_max && o->body_bytes_max < COORDINATOR_BODY_BYTES_MAX
                          ? o->body_bytes_max
                          : COORDINATOR_BODY_BYTES_MAX;
    if (o->bodies_bytes_max && o->bodies_bytes_max < one_body)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "the memory for request bodies being read (%zu bytes, "
                              "--max-body-memory-mib) must hold one body of --max-body-bytes "
                              "(%zu bytes): raise it or lower --max-body-bytes",
                              o->bodies_bytes_max, one_body);
    coordinator_http *h = calloc(1, sizeof *h);
    if (!h)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "http: no memory");
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->slot_free, NULL);
    shoal_err err;
    h->cluster = cluster;
    h->tok = tok;
    h->chat = chat;
    h->threads = threads;
    h->model = strdup(o->model_name ? o->model_name : "default");
    if (o->api_key && o->api_key[0]) {
        h->api_key = strdup(o->api_key);
        h->api_key_len = strlen(o->api_key);
    }
    if (o->allowed_origin && o->allowed_origin[0])
        h->allowed_origin = strdup(o->allowed_origin);
    h->body_bytes_max = o->body_bytes_max ? o->body_bytes_max : COORDINATOR_BODY_BYTES_MAX;
    h->bodies_bytes_max = o->bodies_bytes_max ? o->bodies_bytes_max : COORDINATOR_BODIES_BYTES_MAX;
    if (h->body_bytes_max > COORDINATOR_BODY_BYTES_MAX)
        h->body_bytes_max = COORDINATOR_BODY_BYTES_MAX;
    h->streams_max = o->streams_max ? o->streams_max : COORDINATOR_STREAMS_MAX;
    h->started_s = (long long)time(NULL);
    h->limits = (coordinator_request_limits){
        .model = h->model,
        .max_model_len = coordinator_cluster_max_model_len(cluster),
        .vocab = coordinator_cluster_vocab(cluster),
        .default_max_tokens = o->default_max_tokens,
    };
    coordinator_metrics_init(&h->metrics);
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = common_mono_ns();
    atomic_init(&h->rng, seed);
    if (!h->model || (o->api_key && o->api_key[0] && !h->api_key)) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "http: no memory");
        goto out_close;
    }
    if (h->limits.max_model_len < 2 || h->limits.vocab < 1) {
        err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                             "http: the cluster reports a context of %d tokens and a vocabulary "
                             "of %d",
                             h->limits.max_model_len, h->limits.vocab);
        goto out_close;
    }
    h->slots = calloc((size_t)threads, sizeof *h->slots);
    if (!h->slots) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "http: no memory");
        goto out_close;
    }
    for (int i = 0; i < threads; i++) {
        h->slots[i].ids = malloc((size_t)h->limits.max_model_len * sizeof *h->slots[i].ids);
        if (!h->slots[i].ids) {
            err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "http: no memory for prompts");
            goto out_close;
        }
        if ((err = coordinator_tokenizer_work_open(tok, &h->slots[i].work, diag)))
            goto out_close;
    }
    int connections = o->connections_max ? o->connections_max : COORDINATOR_CONNECTIONS_MAX;
    if ((err = coordinator_hangup_open(connections, &h->hangup, diag)))
        goto out_close;
    if (fd < 0 && (err = coordinator_http_bind(o->host, o->port, &fd, diag)))
        goto out_close;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    struct MHD_OptionItem pool[2] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
    if (threads > 1)
        pool[0] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, threads, NULL};
    h->daemon =
        MHD_start_daemon(flags, 0, NULL, NULL, on_access, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
                         h, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)connections, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)(o->idle_timeout_s ? o->idle_timeout_s : 60),
                         MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_NOTIFY_COMPLETED,
                         on_completed, h, MHD_OPTION_ARRAY, pool, MHD_OPTION_END);
    if (!h->daemon) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "http: cannot serve on %s port %d: %s",
                             o->host ? o->host : "127.0.0.1", o->port, strerror(errno));
        if (o->listen_fd < 0) /* bound here; a given one the caller's wrapper closes */
            close(fd);
        goto out_close;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : o->port;
    *out = h;
    return SHOAL_OK;
out_close:
    coordinator_http_close(h);
    return err;
}

shoal_err coordinator_http_open(const coordinator_http_options *o, coordinator_cluster *cluster,
                                const coordinator_tokenizer *tok, const coordinator_chat *chat,
                                coordinator_http **out, shoal_diag *diag)
{
    /* a given listening socket is the server's from here: the daemon
     * closes it at close, this on an error */
    shoal_err err = http_open(o, cluster, tok, chat, out, diag);
    if (err && o->listen_fd >= 0)
        close(o->listen_fd);
    return err;
}
