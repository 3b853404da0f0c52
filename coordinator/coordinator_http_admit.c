/* coordinator_http_admit.c: what a request passes before it runs.
 *
 * With the headers: the route, the API key (compared in constant time),
 * CORS preflights, the Transfer-Encoding and Content-Length (a body over
 * the limit is refused before it is read); while the body is read: its
 * size and the server's budget for all bodies being read. An error found
 * early is kept and answered once the body is read. */
#include "coordinator_http_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
void http_body_release(http_req *r)
{
    atomic_fetch_sub(&r->h->bodies_bytes, r->body_cap);
    free(r->body);
    r->body = NULL;
    r->body_cap = 0;
}

/* The CORS headers every answer carries when an origin is allowed. */
void http_add_cors(http_req *r, struct MHD_Response *resp)
{
    if (!r->h->allowed_origin)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->h->allowed_origin);
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
    if (strcmp(r->h->allowed_origin, "*") != 0)
        MHD_add_response_header(resp, "Vary", "Origin");
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
enum MHD_Result http_on_headers(http_req *r, const char *url, const char *method)
{
    coordinator_http *h = r->h;
    const http_route *rt = http_route_find(r, url);
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
    } else if (!http_route_allows(rt->methods, method)) {
        r->allow = rt->methods;
        snprintf(msg, sizeof msg, "Method %.16s is not allowed here; use %s", method, rt->methods);
        set_early(r, 405, "invalid_request_error", "method_not_allowed", msg);
    }
    /* A body in a coding other than chunked cannot be read: libmicrohttpd
     * would wait for it until the connection times out. */
    const char *te =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te && strcasecmp(te, "chunked") != 0) {
        /* an error found first (a 401, a 503) is the http_answer, but now */
        if (!r->has_early) {
            snprintf(msg, sizeof msg,
                     "Transfer-Encoding '%.64s' is not supported: send the body as it is, "
                     "with a Content-Length, or chunked",
                     te);
            set_early(r, 501, "invalid_request_error", "not_implemented", msg);
        }
        return http_send_error(r, &r->early);
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
        return http_send_error(r, &r->early);
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
            return http_send_error(r, &r->early);
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

enum MHD_Result http_on_upload(http_req *r, const char *data, size_t bytes)
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
        http_body_release(r);
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
            http_body_release(r);
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
enum MHD_Result http_send_preflight(http_req *r)
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
    return http_queue_whole(r, 204, resp);
}

bool coordinator_http_origin_valid(const char *origin)
{
    size_t n = strlen(origin);
    bool plain = n <= COORDINATOR_NAME_BYTES_MAX;
    for (size_t i = 0; i < n; i++) /* it goes into a header as it is */
        plain &= (unsigned char)origin[i] > 0x20 && origin[i] != 0x7f;
    return plain;
}
