/* coordinator_http_internal.h: what the files of the HTTP server share.
 *
 * The server (coordinator_http.h) is one module in five files:
 *   coordinator_http.c         libmicrohttpd: the daemon, its connection
 *                              callbacks, whole answers, open and close
 *   coordinator_http_admit.c   what a request passes before it runs: the
 *                              API key, CORS, Content-Length, body limits
 *   coordinator_http_state.c   a request's life: references, events queued
 *                              from the cluster, suspend and resume, the
 *                              first answer
 *   coordinator_http_sse.c     the SSE writer of a streamed answer
 *   coordinator_http_routes.c  the route table and each route's handler
 * Nothing here is for use outside coordinator/coordinator_http*.c. Functions
 * shared between those files carry the prefix http_. */
#ifndef SHOAL_COORDINATOR_HTTP_INTERNAL_H
#define SHOAL_COORDINATOR_HTTP_INTERNAL_H

#include "coordinator_buf.h"
#include "coordinator_detok.h"
#include "coordinator_hangup.h"
#include "coordinator_http.h"
#include "coordinator_limits.h"
#include "coordinator_metrics.h"
#include "coordinator_request.h"
#include "coordinator_response.h"
#include "coordinator_stop.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Bytes libmicrohttpd asks a streamed response for at once. */
enum { SSE_BLOCK_BYTES = 32 * 1024 };

/* A non-streamed request without stop strings has no use for each token
 * as it comes: its connection is woken at the end, or after this many
 * events so that its queue stays short. */
enum { WAKE_EVERY_EVENTS = 64 };

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
#ifdef SHOAL_TESTING
    /* Test builds: SHOAL_TEST_OUTPUT_TEXT, which replaces every choice's
     * text, TEST_OUTPUT_BYTES a token (the tokens stay the model's), so
     * that a model of random weights can be made to answer with, say, a
     * tool call. NULL: the model's own text. */
    const char *test_output;
    size_t test_output_bytes;
#endif
};

#ifdef SHOAL_TESTING
enum { TEST_OUTPUT_BYTES = 4 };
#endif

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
    coordinator_stop_reason stop_reason;
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
    /* A streamed choice whose output is read for tool calls: all of its
     * text, and how much of it went out as content. */
    coordinator_buf tool_text;
    size_t tool_sent;
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
    /* The output is read for tool calls (tools given, tool_choice auto),
     * in the chat template's format; call ids come from call_rng. */
    bool tool_parse;
    coordinator_chat_format tool_format;
    uint64_t call_rng;
    coordinator_buf out;
    size_t out_pos;
    bool ended;
    bool cached_known;
    int cached_tokens;
    uint64_t start_ns;
    bool watched;
    uint64_t hangup_id;
};

/* A route: its path, what it serves, the methods it allows ("GET, HEAD"). */
typedef struct http_route {
    const char *path;
    coordinator_endpoint endpoint;
    const char *methods;
} http_route;

/* ---- coordinator_http.c: whole answers (each sets r->status, RS_DONE) ---- */

/* Queues resp with the headers every whole answer carries; frees resp. */
enum MHD_Result http_queue_whole(http_req *r, int status, struct MHD_Response *resp);
enum MHD_Result http_send_body(http_req *r, int status, const char *type, const char *data,
                               size_t bytes);
enum MHD_Result http_send_json(http_req *r, int status, const coordinator_buf *b);
/* OpenAI's error body with e's status. */
enum MHD_Result http_send_error(http_req *r, const coordinator_api_error *e);
enum MHD_Result http_send_simple_error(http_req *r, int status, const char *type, const char *code,
                                       const char *message);
enum MHD_Result http_send_nomem(http_req *r);

/* ---- coordinator_http_admit.c ---- */

/* The first access-handler call, with the headers: route, key, size; an
 * error found is kept in r->early (or answered at once, for a body that
 * is not read). */
enum MHD_Result http_on_headers(http_req *r, const char *url, const char *method);
/* A piece of the body: kept within the limits, or read and dropped. */
enum MHD_Result http_on_upload(http_req *r, const char *data, size_t bytes);
/* Frees r's body buffer and gives its bytes back to the server's budget. */
void http_body_release(http_req *r);
/* The CORS headers every answer carries when an origin is allowed. */
void http_add_cors(http_req *r, struct MHD_Response *resp);
/* 204 to a CORS preflight of a known route. */
enum MHD_Result http_send_preflight(http_req *r);

/* ---- coordinator_http_state.c ---- */

/* A request for a new connection, on the server's live list; NULL
 * without memory. Its one reference is the connection's. */
http_req *http_req_new(coordinator_http *h, struct MHD_Connection *conn);
void http_req_unref(http_req *r);
/* Cancels every submitted choice's stream. Never with a lock held. */
void http_cancel_all(http_req *r);
/* The cluster's event callback (coordinator_event_fn); ctx is the
 * http_choice. */
void http_on_event(void *ctx, const shm_event *ev, const char *error);
/* The hangup watcher's callback: the client closed its socket. */
void http_client_gone(void *ctx);
/* Suspends the connection until an event calls for it; false when one
 * already does or the client left. */
bool http_park(http_req *r);
/* Takes every queued event into the choices' output; false (with *why)
 * when a choice failed or memory ran out. */
bool http_take_events(http_req *r, coordinator_api_error *why);
bool http_all_done(const http_req *r);
coordinator_usage http_usage_of(const http_req *r);
/* RS_WAIT: the first answer to a submitted request, or another wait. */
enum MHD_Result http_answer(http_req *r);

/* ---- coordinator_http_sse.c ---- */

/* SSE chunks for what this turn produced, and the stream's end. */
void http_write_chunks(http_req *r);
/* The end of a stream that failed after it began. */
void http_write_stream_error(http_req *r, const coordinator_api_error *e);
/* Queues the SSE response (RS_STREAM); it takes a reference on r. */
enum MHD_Result http_sse_start(http_req *r);

/* ---- coordinator_http_routes.c ---- */

/* The route of url, or NULL; /v1/models/{name} sets r->model_arg. */
const http_route *http_route_find(http_req *r, const char *url);
/* Whether method is one of a route's methods. */
bool http_route_allows(const char *methods, const char *method);
/* The body is read: answers the early error, the preflight or the route. */
enum MHD_Result http_dispatch(http_req *r);

#endif
