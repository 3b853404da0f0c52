/* coordinator_cluster_route.c: the router: the cost model that picks a
 * worker for a stream, the per-worker routing memory, and the SUBMIT that
 * places a stream (a new one, one that waits, or one moved off a dead
 * worker). */
#include "coordinator_cluster_internal.h"

#include "common/common_log.h"

#include <stdlib.h>
#include <string.h>

/* The router's weight of one stream in flight, in prompt tokens: placing a
 * stream on a worker with one more stream costs about as much as
 * prefilling this many more tokens there. */
enum { ROUTE_STREAM_TOKENS = 256 };

/* A block another worker holds is copied rather than computed: on an H200
 * a 4k-token prefix imports well over 20x faster than it prefills, so it
 * saves about 95% of its cost (docs/BENCHMARKS.md, issue #8). */
enum { ROUTE_IMPORT_SAVES = 95 };

/* Block hashes of a prompt's full blocks, as the engine computes them. */
static int prompt_blocks(const coordinator_cluster *c, const cstream *s, common_hash *out, int max)
{
    common_hash root;
    common_block_root(&c->fingerprint, s->has_salt ? &s->salt : NULL, &root);
    int blocks = (s->prompt_len - 1) / c->page_tokens;
    if (blocks > max)
        blocks = max;
    for (int b = 0; b < blocks; b++)
        common_block_hash(b == 0 ? &root : &out[b - 1], s->tokens + b * c->page_tokens,
                          c->page_tokens, &out[b]);
    return blocks;
}

/* Chooses an alive worker for s, other than `avoid`; -1 if none.
 * prefix: cost(w) = uncached prompt tokens on w + ROUTE_STREAM_TOKENS x
 * streams in flight on w; the lowest cost wins, ties to fewer streams,
 * then the lower index. */
static int route(coordinator_cluster *c, const common_hash *blocks, int n_blocks, int avoid)
{
    int best = -1;
    long long best_cost = 0;
    /* what the segment's index says each worker holds now, and the longest
     * prefix any worker holds (which another worker can import) */
    int32_t lead[SHM_SEGMENT_WORKERS_MAX] = {0};
    int any = 0;
    if (c->seg && c->o.route == COORDINATOR_ROUTE_PREFIX && n_blocks > 0)
        any = shm_index_leads(c->seg, blocks, n_blocks, lead);
    for (int k = 0; k < c->n; k++) {
        int i = c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN ? (c->rr_next + k) % c->n : k;
        cworker *w = &c->w[i];
        if (w->state != W_ALIVE || w->draining || i == avoid)
            continue;
        long long cost = (long long)w->inflight;
        if (c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN) {
            best = i;
            break;
        }
        if (c->o.route == COORDINATOR_ROUTE_PREFIX) {
            int hits = 0;
            while (hits < n_blocks && w->prefix[common_hash_u64(&blocks[hits]) % PREFIX_SLOTS] ==
                                          common_hash_u64(&blocks[hits]))
                hits++;
            if (lead[i] > hits)
                hits = lead[i];
            /* blocks held elsewhere are imported at a fraction of their
             * compute cost */
            long long imported = any > hits ? any - hits : 0;
            cost = (long long)ROUTE_STREAM_TOKENS * w->inflight - (long long)hits * c->page_tokens -
                   imported * c->page_tokens * ROUTE_IMPORT_SAVES / 100;
        }
        if (best < 0 || cost < best_cost ||
            (cost == best_cost && w->inflight < c->w[best].inflight)) {
            best = i;
            best_cost = cost;
        }
    }
    if (best >= 0 && c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN)
        c->rr_next = (best + 1) % c->n;
    return best;
}

static void remember_prefix(coordinator_cluster *c, int worker, const common_hash *blocks, int n)
{
    for (int b = 0; b < n; b++)
        c->w[worker].prefix[common_hash_u64(&blocks[b]) % PREFIX_SLOTS] =
            common_hash_u64(&blocks[b]);
}

/* A SUBMIT for s as it stands: prompt plus what was delivered. */
static void *build_submit(const cstream *s, size_t *bytes)
{
    int n = s->prompt_len + s->delivered;
    *bytes = shm_msg_bytes(SHM_MSG_SUBMIT, (uint32_t)n);
    shm_submit *m = calloc(1, *bytes);
    if (!m)
        return NULL;
    shm_header_init(&m->h, SHM_MSG_SUBMIT, *bytes, (uint32_t)n);
    m->stream_id = s->id;
    m->max_tokens = s->max_tokens - s->delivered;
    m->stop_count = s->stop_count;
    m->sampling = s->sampling;
    memcpy(m->stop_ids, s->stop_ids, sizeof m->stop_ids);
    m->ignore_eos = s->ignore_eos;
    m->has_salt = s->has_salt;
    m->index_base = s->delivered;
    m->salt = s->salt;
    memcpy(m + 1, s->tokens, (size_t)n * 4);
    return m;
}

/* Places s (lock held) and returns the message to send after unlocking, or
 * NULL with s->worker = -1 when no worker is alive. */
void *cluster_place(coordinator_cluster *c, cstream *s, int avoid, size_t *bytes)
{
    common_hash *blocks = NULL;
    int n_blocks = 0;
    if (c->o.route == COORDINATOR_ROUTE_PREFIX && c->have_facts && s->prompt_len > 1) {
        int max = (s->prompt_len - 1) / c->page_tokens;
        blocks = malloc((size_t)(max ? max : 1) * sizeof *blocks);
        if (blocks)
            n_blocks = prompt_blocks(c, s, blocks, max);
    }
    int w = route(c, blocks, n_blocks, avoid);
    s->worker = w;
    void *msg = NULL;
    if (w >= 0) {
        c->w[w].inflight++;
        remember_prefix(c, w, blocks, n_blocks);
        msg = build_submit(s, bytes);
    }
    free(blocks);
    return msg;
}

/* Places streams that wait for a worker (lock held). */
void cluster_place_waiting(coordinator_cluster *c, void **out, size_t *out_bytes, int *out_worker,
                           int *n_out, int max_out)
{
    for (int b = 0; b < BUCKETS; b++)
        for (cstream *s = c->buckets[b]; s && *n_out < max_out; s = s->next) {
            if (s->worker >= 0)
                continue;
            size_t bytes = 0;
            void *msg = cluster_place(c, s, -1, &bytes);
            if (!msg)
                return;
            out[*n_out] = msg;
            out_bytes[*n_out] = bytes;
            out_worker[(*n_out)++] = s->worker;
            c->resumed++;
        }
}

void cluster_send_all(coordinator_cluster *c, void **msgs, size_t *bytes, int *worker, int n)
{
    for (int i = 0; i < n; i++) {
        if (shm_channel_send(c->w[worker[i]].ch, msgs[i], bytes[i], 1000))
            LOG_WARN("worker %d: a resumed stream could not be sent", worker[i]);
        free(msgs[i]);
    }
}
