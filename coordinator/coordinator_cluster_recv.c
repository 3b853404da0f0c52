/* coordinator_cluster_recv.c: one receiving thread per worker: checks each
 * message, and under the lock takes HELLO (the model facts), STEP (tokens
 * to the streams' callbacks), REJECT and HEARTBEAT. */
#include "coordinator_cluster_internal.h"

#include "common/common_log.h"
#include "common/common_time.h"

#include <stdio.h>
#include <string.h>

static void on_hello(coordinator_cluster *c, cworker *w, const shm_hello *h)
{
    if (!c->have_facts) {
        c->have_facts = true;
        c->vocab = h->vocab;
        c->max_model_len = h->max_model_len;
        c->page_tokens = h->page_tokens;
        c->fingerprint = h->fingerprint;
    } else if (!common_hash_equal(&c->fingerprint, &h->fingerprint) || c->vocab != h->vocab ||
               c->page_tokens != h->page_tokens) {
        LOG_ERROR("worker %d runs another model or page layout than the cluster; not used "
                  "(start every worker with the same --model, --page-tokens and KV dtype)",
                  w->index);
        return;
    }
    if (h->max_model_len < c->max_model_len)
        c->max_model_len = h->max_model_len;
    if (!w->ours) {
        w->pid = h->pid;
        w->exit_code = SHM_EXIT_UNKNOWN; /* not our child: no status to read */
    }
    snprintf(w->device, sizeof w->device, "%s", h->device);
    w->state = W_ALIVE;
    w->ready_ms = common_mono_ms();
    w->draining = w->bye_sent = false; /* a drain flag still set drains it again */
    w->load = h->load;
    LOG_INFO("worker %d (pid %d, device %s) is ready", w->index, (int)h->pid, h->device);
    pthread_cond_broadcast(&c->changed);
}

static void deliver(coordinator_cluster *c, cworker *w, const shm_event *ev)
{
    cstream **p = cluster_slot_of(c, ev->stream_id);
    cstream *s = *p;
    /* Late events of a cancelled stream, or of a worker the stream has
     * left, are dropped; so are repeats of a delivered index. */
    if (!s || s->worker != w->index)
        return;
    if (ev->token >= 0) {
        if (ev->index != s->delivered)
            return;
        s->tokens[s->prompt_len + s->delivered++] = ev->token;
    }
    s->fn(s->ctx, ev, NULL);
    if (ev->finish) {
        cluster_stream_free(cluster_stream_take(c, s->id));
    }
}

static void on_reject(coordinator_cluster *c, cworker *w, const shm_reject *r)
{
    cstream *s = *cluster_slot_of(c, r->stream_id);
    if (!s || s->worker != w->index)
        return;
    shm_event ev;
    memset(&ev, 0, sizeof ev);
    ev.stream_id = s->id;
    ev.token = -1;
    ev.finish = COORDINATOR_FINISH_ERROR;
    s->fn(s->ctx, &ev, r->text);
    cluster_stream_free(cluster_stream_take(c, s->id));
}

void *cluster_rx_main(void *arg)
{
    cworker *w = arg;
    coordinator_cluster *c = w->c;
    while (!atomic_load(&c->stopping)) {
        void *msg;
        size_t bytes;
        shoal_err err = shm_channel_recv(w->ch, 100, &msg, &bytes);
        if (err == SHOAL_ERR_TIMEOUT)
            continue;
        if (err)
            break;
        shm_msg_type type;
        shoal_diag diag = {{0}};
        if (shm_proto_check(msg, bytes, &type, &diag)) {
            LOG_WARN("worker %d: dropped a message: %s", w->index, diag.msg);
            shm_channel_free(msg, bytes);
            continue;
        }
        pthread_mutex_lock(&c->lock);
        w->last_seen_ms = common_mono_ms();
        void *out[MOVE_MAX];
        size_t out_bytes[MOVE_MAX];
        int out_worker[MOVE_MAX], n_out = 0;
        switch (type) {
        case SHM_MSG_HELLO:
            on_hello(c, w, msg);
            cluster_place_waiting(c, out, out_bytes, out_worker, &n_out, MOVE_MAX);
            break;
        case SHM_MSG_STEP: {
            const shm_step *st = msg;
            w->load = st->load;
            const shm_event *ev = (const shm_event *)(st + 1);
            if (w->state == W_ALIVE)
                for (uint32_t i = 0; i < st->h.count; i++)
                    deliver(c, w, &ev[i]);
            break;
        }
        case SHM_MSG_REJECT:
            on_reject(c, w, msg);
            break;
        case SHM_MSG_HEARTBEAT:
            w->load = ((const shm_heartbeat *)msg)->load;
            break;
        default:
            LOG_WARN("worker %d: sent message type %d, meant for workers", w->index, type);
        }
        pthread_mutex_unlock(&c->lock);
        cluster_send_all(c, out, out_bytes, out_worker, n_out);
        shm_channel_free(msg, bytes);
    }
    return NULL;
}
