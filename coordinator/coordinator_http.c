/* coordinator_http.c: the server's libmicrohttpd side: the daemon, the
 * access and completion callbacks that drive each request's state
 * (coordinator_http_internal.h), whole answers, and open, drain, close. */
#include "coordinator_http_internal.h"

#include "common/common_log.h"
#include "common/common_time.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- whole answers ---- */

/* Queues a whole http_answer (not a stream) with the headers every one
 * carries, and frees resp. */
enum MHD_Result http_queue_whole(http_req *r, int status, struct MHD_Response *resp)
{
    http_add_cors(r, resp);
    if (atomic_load(&r->h->draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->state = RS_DONE;
    return ok;
}

enum MHD_Result http_send_body(http_req *r, int status, const char *type, const char *data,
                               size_t bytes)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(bytes, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 405 && r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->meta.request_id[0])
        MHD_add_response_header(resp, "X-Request-Id", r->meta.request_id);
    /* when to try again: a 429 clears as streams finish, a 503 (draining,
     * no worker serving, bodies' memory full) takes longer */
    if (status == 429 || status == 503)
        MHD_add_response_header(resp, "Retry-After", status == 429 ? "1" : "5");
    return http_queue_whole(r, status, resp);
}

enum MHD_Result http_send_json(http_req *r, int status, const coordinator_buf *b)
{
    return http_send_body(r, status, "application/json", b->data ? b->data : "", b->len);
}

enum MHD_Result http_send_error(http_req *r, const coordinator_api_error *e)
{
    coordinator_buf b;
    coordinator_buf_init(&b);
    enum MHD_Result ok = coordinator_response_error(&b, e)
                             ? http_send_json(r, e->status, &b)
                             : http_send_body(r, 500, "application/json", "{}", 2);
    coordinator_buf_fini(&b);
    return ok;
}

enum MHD_Result http_send_simple_error(http_req *r, int status, const char *type, const char *code,
                                       const char *message)
{
    coordinator_api_error e;
    coordinator_api_error_set(&e, status, type, NULL, "%s", message);
    e.code = code;
    return http_send_error(r, &e);
}

enum MHD_Result http_send_nomem(http_req *r)
{
    return http_send_simple_error(r, 500, "server_error", NULL, "out of memory");
}

/* ---- the access handler ---- */

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **con_cls)
{
    coordinator_http *h = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = http_req_new(h, conn);
        if (!r)
            return MHD_NO;
        *con_cls = r;
        return http_on_headers(r, url, method);
    }
    switch (r->state) {
    case RS_BODY:
        if (*upload_size) {
            enum MHD_Result ok = http_on_upload(r, upload_data, *upload_size);
            *upload_size = 0;
            return ok;
        }
        return http_dispatch(r);
    case RS_WAIT:
        return http_answer(r);
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
    http_cancel_all(r);
    /* 499: the client left before its answer was complete (nginx's code). */
    int status = r->status;
    if (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
        status = 503;
    else if (left && (r->state == RS_WAIT || r->state == RS_STREAM || r->state == RS_BODY))
        status = 499;
    coordinator_metrics_request(&h->metrics, r->endpoint, status);
    if (r->choices) { /* a request the client left was computed too (as vLLM counts) */
        coordinator_usage u = http_usage_of(r);
        coordinator_metrics_tokens(&h->metrics, (uint64_t)u.prompt_tokens,
                                   (uint64_t)u.completion_tokens, (uint64_t)u.cached_tokens);
    }
    if (r->choices && status == 200)
        coordinator_metrics_observe(&h->metrics.duration, common_mono_ns() - r->start_ns);
    atomic_fetch_sub(&h->active, 1);
    http_req_unref(r);
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
            http_client_gone(r);
            http_req_unref(r);
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
#ifdef SHOAL_TESTING /* a test's output: test builds only (coordinator_http_internal.h) */
    if (h && (h->test_output = getenv("SHOAL_TEST_OUTPUT_TEXT")) != NULL)
        h->test_output_bytes = strlen(h->test_output);
#endif
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
        .ignore_unknown_fields = o->ignore_unknown_fields,
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
