/* coordinator_http.h: the OpenAI-compatible HTTP server of the coordinator.
 *
 * Routes (libmicrohttpd; JSON with cJSON; no HTTP parsed by hand):
 *   POST /v1/chat/completions, /v1/completions   generation, streamed (SSE)
 *                                                 or not
 *   GET  /v1/models, /v1/models/{name}
 *   POST /tokenize, /detokenize                   vLLM's shapes (and llama.cpp's
 *                                                 `content`)
 *   GET  /health    200 while every worker answers, else 503 (no key needed)
 *   GET  /metrics   Prometheus text (coordinator_metrics.h)
 * With an API key every route but /health wants "Authorization: Bearer
 * KEY" (401 otherwise). Errors are OpenAI's error body with its status:
 * 400 (a field, named), 401, 404, 405 (with Allow), 413 (a body over the
 * limit, refused from its Content-Length before it is read), 429 (more
 * streams in flight than the bound), 503 (no worker alive, a worker
 * refused the stream, or the server is draining).
 *
 * A generation request is parsed and checked (coordinator_request.h),
 * its prompt built on the HTTP thread, and each choice submitted to the
 * cluster as a stream. The cluster's thread only queues each event on the
 * request and resumes its suspended connection; the HTTP thread then
 * detokenizes, matches stop strings (cancelling the stream at a match),
 * and writes the body or SSE chunks. A client that disconnects, even while
 * its request waits, cancels its streams (coordinator_hangup.h).
 *
 * Threads: open, drain and close from one thread (main); the server runs
 * its own threads (libmicrohttpd's pool and the hangup watcher). */
#ifndef SHOAL_COORDINATOR_HTTP_H
#define SHOAL_COORDINATOR_HTTP_H

#include "common/common_error.h"
#include "coordinator_chat.h"
#include "coordinator_cluster.h"
#include "coordinator_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct coordinator_http_options {
    const char *host;        /* address to listen on (numeric or a name); default 127.0.0.1 */
    int port;                /* 0: any free port (see coordinator_http_port) */
    const char *api_key;     /* NULL or "": no key */
    const char *model_name;  /* the served model's name, as /v1/models lists it */
    int threads;             /* HTTP threads, 1..COORDINATOR_HTTP_THREADS_MAX; 0: 2 */
    size_t body_bytes_max;   /* 0: COORDINATOR_BODY_BYTES_MAX */
    size_t bodies_bytes_max; /* all bodies being read; 0: COORDINATOR_BODIES_BYTES_MAX */
    int connections_max;     /* 0: COORDINATOR_CONNECTIONS_MAX */
    int streams_max;         /* choices in flight; 0: COORDINATOR_STREAMS_MAX */
    int default_max_tokens;  /* when a request gives none; 0: the rest of the context */
    bool ignore_unknown_fields; /* a field no request reads: a warning, not a 400 */
    int idle_timeout_s;      /* an idle keep-alive connection is closed after; 0: 60 */
    /* CORS: the origin browsers may call from ("*": any, as vLLM's
     * default); NULL or "": no CORS headers, and OPTIONS is a 405 */
    const char *allowed_origin;
    /* A socket coordinator_http_bind made: coordinator_http_open takes it
     * whatever it returns (the server closes it at close, or open on an
     * error); -1: coordinator_http_open binds host and port itself. */
    int listen_fd;
} coordinator_http_options;

/* Binds host and port and listens, before anything slow starts (the
 * coordinator binds first and starts its workers after, so a port that is
 * taken is said at once, not after every model has loaded); connections
 * wait in the backlog until coordinator_http_open serves them. *fd is the
 * caller's until it is handed over in listen_fd. SHOAL_ERR_IO when the
 * address cannot be bound (the message names it and says why),
 * SHOAL_ERR_INVALID for a host that does not resolve. */
shoal_err coordinator_http_bind(const char *host, int port, int *fd, shoal_diag *diag);

typedef struct coordinator_http coordinator_http;

/* Whether origin may be an allowed_origin: no spaces or control
 * characters, at most COORDINATOR_NAME_BYTES_MAX bytes. */
bool coordinator_http_origin_valid(const char *origin);

/* Starts serving. cluster, tok and chat (NULL: the model has no chat
 * template; chat requests get a 400) must outlive the server. The
 * cluster's vocabulary and context length bound every request. Errors:
 * SHOAL_ERR_IO (the address cannot be bound), SHOAL_ERR_INVALID (bad
 * options), SHOAL_ERR_NOMEM. */
shoal_err coordinator_http_open(const coordinator_http_options *o, coordinator_cluster *cluster,
                                const coordinator_tokenizer *tok, const coordinator_chat *chat,
                                coordinator_http **out, shoal_diag *diag);

/* The port it listens on. */
int coordinator_http_port(const coordinator_http *h);

/* Starts draining: the listening socket closes, a new request on an open
 * connection gets 503 and the connection closes; requests in flight run
 * on. Idempotent. */
void coordinator_http_drain(coordinator_http *h);

/* Requests in flight (from their headers to their last byte). */
int coordinator_http_active(coordinator_http *h);

/* Cancels what is in flight, stops serving and frees; NULL allowed. Call
 * before closing the cluster. */
void coordinator_http_close(coordinator_http *h);

#endif
