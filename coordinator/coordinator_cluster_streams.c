/* coordinator_cluster_streams.c: the stream table (by id, in hash chains)
 * and the streams' public calls, submit and cancel. */
#include "coordinator_cluster_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- the stream table (callers hold the lock) ---- */

cstream **cluster_slot_of(coordinator_cluster *c, uint64_t id)
{
    cstream **p = &c->buckets[id % BUCKETS];
    while (*p && (*p)->id != id)
        p = &(*p)->next;
    return p;
}

void cluster_stream_free(cstream *s)
{
    if (s)
        free(s->tokens);
    free(s);
}

/* Removes and returns the stream, or NULL. */
cstream *cluster_stream_take(coordinator_cluster *c, uint64_t id)
{
    cstream **p = cluster_slot_of(c, id);
    cstream *s = *p;
    if (s) {
        *p = s->next;
        c->live--;
        if (s->worker >= 0)
            c->w[s->worker].inflight--;
    }
    return s;
}

/* ---- submit and cancel ---- */

shoal_err coordinator_cluster_submit(coordinator_cluster *c, const coordinator_stream_request *r,
                                     coordinator_event_fn fn, void *ctx, uint64_t *stream_id,
                                     shoal_diag *diag)
{
    if (r->prompt_len < 1 || r->max_tokens < 1)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "the prompt must have a token and max_tokens must be at least 1");
    if (r->stop_count < 0 || r->stop_count > SHM_STOP_IDS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "at most %d stop token ids", SHM_STOP_IDS_MAX);
    if ((long long)r->prompt_len + r->max_tokens > c->max_model_len)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%d prompt tokens + max_tokens %d is over the context length of "
                              "%d tokens",
                              r->prompt_len, r->max_tokens, c->max_model_len);
    cstream *s = calloc(1, sizeof *s);
    if (s)
        s->tokens = malloc(((size_t)r->prompt_len + (size_t)r->max_tokens) * 4);
    if (!s || !s->tokens) {
        cluster_stream_free(s);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory for a stream");
    }
    memcpy(s->tokens, r->prompt, (size_t)r->prompt_len * 4);
    s->prompt_len = r->prompt_len;
    s->max_tokens = r->max_tokens;
    s->sampling = r->sampling;
    s->ignore_eos = r->ignore_eos;
    s->stop_count = r->stop_count;
    memcpy(s->stop_ids, r->stop_ids, sizeof s->stop_ids);
    s->has_salt = r->has_salt;
    s->salt = r->salt;
    s->fn = fn;
    s->ctx = ctx;
    pthread_mutex_lock(&c->lock);
    s->id = c->next_id++;
    size_t bytes = 0;
    void *msg = cluster_place(c, s, -1, &bytes);
    int w = s->worker;
    if (!msg) {
        pthread_mutex_unlock(&c->lock);
        cluster_stream_free(s);
        return shoal_diag_set(diag, w >= 0 ? SHOAL_ERR_NOMEM : SHOAL_ERR_BROKEN,
                              w >= 0 ? "cluster: no memory" : "no worker is alive; retry later");
    }
    cstream **p = cluster_slot_of(c, s->id);
    *p = s;
    c->live++;
    *stream_id = s->id;
    pthread_mutex_unlock(&c->lock);
    /* Sent without the lock: a worker blocked sending its STEP to us must
     * not wait on a submit that waits on the lock. */
    shoal_err err = shm_channel_send(c->w[w].ch, msg, bytes, 5000);
    free(msg);
    if (err) {
        pthread_mutex_lock(&c->lock);
        cluster_stream_free(cluster_stream_take(c, *stream_id));
        pthread_mutex_unlock(&c->lock);
        return shoal_diag_set(diag, SHOAL_ERR_BROKEN, "worker %d did not take the stream: %s", w,
                              shoal_strerror(err));
    }
    return SHOAL_OK;
}

void coordinator_cluster_cancel(coordinator_cluster *c, uint64_t stream_id)
{
    pthread_mutex_lock(&c->lock);
    cstream *s = cluster_stream_take(c, stream_id);
    int w = s ? s->worker : -1;
    pthread_mutex_unlock(&c->lock);
    cluster_stream_free(s);
    if (w >= 0) {
        shm_cancel m;
        shm_header_init(&m.h, SHM_MSG_CANCEL, sizeof m, 0);
        m.stream_id = stream_id;
        shm_channel_send(c->w[w].ch, &m, sizeof m, 1000);
    }
}
