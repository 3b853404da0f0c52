/* coordinator_http_sse.c: the SSE writer of a streamed answer.
 *
 * libmicrohttpd pulls the response through sse_read on the HTTP thread:
 * it hands out what r->out holds, takes the events queued since, writes
 * their chunks (coordinator_response.h), and suspends the connection when
 * there is nothing to send. */
#include "coordinator_http_internal.h"

#include "coordinator_toolcall.h"

#include <string.h>

/* Tool calls in a stream. A call is sent whole, once its choice has
 * ended: the text that may become a call (from Qwen3's first <tool_call>,
 * or a Llama 3 answer that begins as a JSON object) is held back, the
 * text before it goes out as content as it comes (untrimmed, unlike a
 * body's: its white space went out before a call followed), and at the
 * end the held text is parsed as a whole body's would be. Each call is then one delta
 * {"tool_calls": [{"index", "id", "type", "function": {"name",
 * "arguments"}}]} before the finish chunk (finish_reason "tool_calls"); if
 * there is no call the held text goes out as content. One delta per call,
 * with all its arguments, is a stream that the openai clients' stream
 * helpers accumulate like any other; streaming the arguments as they are
 * written would need the JSON parsed incrementally, and gives the client
 * nothing it can run before the call is whole. */

/* This turn's new text of a choice read for tool calls: into tool_text,
 * and *out / *bytes set to what may go out as content now. */
static void tool_hold(http_req *r, http_choice *c, const char **out, size_t *bytes)
{
    coordinator_buf_append(&c->tool_text, c->text.data ? c->text.data : "", c->text.len);
    if (coordinator_buf_failed(&c->tool_text))
        r->out.failed = true; /* out of memory: the stream ends in an error */
    size_t plain = coordinator_toolcall_plain_prefix(
        r->tool_format, c->tool_text.data ? c->tool_text.data : "", c->tool_text.len);
    *out = c->tool_text.data ? c->tool_text.data + c->tool_sent : "";
    *bytes = plain - c->tool_sent;
    c->tool_sent = plain;
}

/* At a read choice's end: its calls as deltas, or the held text as
 * content; the finish reason to send. */
static const char *tool_finish(http_req *r, http_choice *c, int index)
{
    const char *text = c->tool_text.data ? c->tool_text.data : "";
    coordinator_toolcall_result res;
    if (coordinator_toolcall_parse(r->tool_format, text, c->tool_text.len, &r->call_rng, &res) !=
        SHOAL_OK) {
        r->out.failed = true; /* out of memory: the stream ends in an error */
        return c->finish_reason;
    }
    for (int j = 0; j < res.count; j++) {
        coordinator_chunk k = {.index = index,
                               .tool_call = &res.calls[j],
                               .tool_index = j,
                               .usage_null = r->req.include_usage};
        coordinator_response_chunk(&r->out, &r->meta, &k);
    }
    if (res.count == 0 && c->tool_sent < c->tool_text.len) {
        coordinator_chunk k = {.index = index,
                               .text = text + c->tool_sent,
                               .text_bytes = c->tool_text.len - c->tool_sent,
                               .usage_null = r->req.include_usage};
        coordinator_response_chunk(&r->out, &r->meta, &k);
    }
    c->tool_sent = c->tool_text.len;
    const char *finish = res.count > 0 ? "tool_calls" : c->finish_reason;
    coordinator_toolcall_result_fini(&res);
    return finish;
}

/* SSE chunks for what this turn produced, and the end of the stream. */
void http_write_chunks(http_req *r)
{
    bool chat = r->req.kind == COORDINATOR_REQUEST_CHAT;
    int chunks = 0;
    for (int i = 0; i < r->n; i++) {
        http_choice *c = &r->choices[i];
        const char *text = c->text.data ? c->text.data : "";
        size_t text_bytes = c->text.len;
        if (r->tool_parse && c->text.len)
            tool_hold(r, c, &text, &text_bytes);
        bool content = text_bytes || c->ids_len || c->lps_len;
        if (content) {
            coordinator_chunk k = {
                .index = i,
                .text = text,
                .text_bytes = text_bytes,
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
        if (!content)
            coordinator_buf_clear(&c->text); /* held back, in tool_text */
        if (c->done && !c->finish_sent) {
            const char *finish = r->tool_parse ? tool_finish(r, c, i) : c->finish_reason;
            coordinator_chunk k = {.index = i,
                                   .text = "",
                                   .finish_reason = finish,
                                   .stop_reason = c->stop_reason,
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
    if (http_all_done(r) && !r->ended) {
        if (r->req.include_usage) {
            coordinator_usage u = http_usage_of(r);
            coordinator_response_chunk_usage(&r->out, &r->meta, &u);
        }
        coordinator_response_chunk_done(&r->out);
        r->ended = true;
    }
}

/* The end of a stream that failed after it began. */
void http_write_stream_error(http_req *r, const coordinator_api_error *e)
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
        if (!http_take_events(r, &e)) {
            http_cancel_all(r);
            http_write_stream_error(r, &e);
            continue;
        }
        http_write_chunks(r);
        if (r->out.len)
            continue;
        if (http_park(r))
            return 0;
    }
}

static void sse_free(void *cls)
{
    http_req_unref(cls);
}

/* Queues r's SSE response; sse_read writes it from r->out as events come. */
enum MHD_Result http_sse_start(http_req *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK_BYTES, sse_read, r, sse_free);
    if (!resp)
        return MHD_NO;
    atomic_fetch_add(&r->refs, 1); /* the response's, dropped by sse_free */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    MHD_add_response_header(resp, "X-Request-Id", r->meta.request_id);
    http_add_cors(r, resp);
    enum MHD_Result ok = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->state = RS_STREAM;
    return ok;
}
