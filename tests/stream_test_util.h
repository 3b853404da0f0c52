/* stream_test_util.h: what a cluster test keeps of one stream it submits
 * to coordinator_cluster: the first TS_TOKENS_MAX tokens, how many came,
 * whether each came with the next index, the cached prompt tokens, the
 * finish and its error. ts_stream_event is the event callback to pass with
 * it; done is set last, so that once the test sees it the stream may go. */
#ifndef SHOAL_TESTS_STREAM_TEST_UTIL_H
#define SHOAL_TESTS_STREAM_TEST_UTIL_H

#include "coordinator/coordinator_cluster.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

enum { TS_TOKENS_MAX = 64 };

typedef struct ts_stream {
    pthread_mutex_t lock;
    int32_t tokens[TS_TOKENS_MAX];
    int n;    /* tokens received */
    bool gap; /* a token came with another index than the next */
    int cached;
    int finish;
    char error[256];
    atomic_int done;
} ts_stream;

static inline void ts_stream_init(ts_stream *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
}

/* Tokens received so far, while events may still arrive. */
static inline int ts_stream_tokens(ts_stream *r)
{
    pthread_mutex_lock(&r->lock);
    int n = r->n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static inline void ts_stream_event(void *ctx, const shm_event *ev, const char *error)
{
    ts_stream *r = ctx;
    pthread_mutex_lock(&r->lock);
    if (ev->token >= 0) {
        if (ev->index != r->n)
            r->gap = true;
        if (ev->index == 0)
            r->cached = ev->cached_tokens;
        if (r->n < TS_TOKENS_MAX)
            r->tokens[r->n] = ev->token;
        r->n++;
    }
    if (ev->finish) {
        r->finish = ev->finish;
        if (error)
            snprintf(r->error, sizeof r->error, "%s", error);
    }
    pthread_mutex_unlock(&r->lock);
    /* last: once done, the waiting thread may drop r */
    if (ev->finish)
        atomic_store(&r->done, 1);
}

#endif
