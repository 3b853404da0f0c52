#include "worker_engine.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "common/common_time.h"

#include <stdlib.h>
#include <string.h>

typedef struct stream {
    uint64_t id;
    int32_t *tokens; /* prompt, then output; capacity prompt_len + max_tokens */
    int len;
    int prompt_len;
    int max_tokens;
    int generated;
    int index_base;
    kernels_sample_params sp;
    bool ignore_eos;
    int stop_count;
    int32_t stop_ids[WORKER_STOP_IDS_MAX];
    common_hash root;    /* chain root: fingerprint and salt */
    common_hash *hashes; /* block hashes [0, hashed) */
    int hashed;
    int32_t *pages; /* page table */
    int n_pages;
    int published; /* blocks [0, published) went to the prefix cache */
    int computed;  /* tokens whose KV is in pages */
    int cached_tokens;
    bool admitted_once;
    bool first_admission; /* admitted once and not preempted since */
    /* A restore in progress (worker_async_source): blocks [job_first,
     * job_first + job_blocks) arrive from the store or are computed. */
    void *job;
    int job_first, job_blocks;
    int batch_slot; /* index in this step's batch, or -1 */
    int rows;       /* rows in this step */
    int state_slot; /* hybrids: the model's state slot while running, or -1 */
    int hit_slot;   /* hybrids: the checkpoint its prefix hit starts from, or -1 */
    bool has_tail;  /* hybrids: tail is the checkpoint of its latest decode block */
    common_hash tail;
} stream;

struct worker_engine {
    worker_model *m;
    worker_engine_options o;
    const model_config *cfg;
    int pt;
    int pages_cap; /* pages one stream can hold */
    worker_pages *pages;
    common_hash fingerprint;
    bool broken;
    /* Hybrid models (gated DeltaNet layers) keep each running stream's
     * recurrent state in a model state slot ([0, parallel)); free_slots
     * holds those no stream has. Checkpoints take the slots after them. */
    bool hybrid;
    int *free_slots, n_free_slots;
    worker_checkpoints *ckpts;

    stream **running; /* admission order; [0, n_running) */
    int n_running;
    stream **waiting; /* ring; preempted streams go to the front */
    int wait_cap, wait_head, n_waiting;
    uint64_t *cancelled; /* ids whose CANCELLED event is still to report */
    int n_cancelled, cancel_cap;

    /* step scratch, sized at open */
    int32_t *ids, *pos, *row_stream, *table, *logit_rows, *slots;
    stream **batch;
    stream **logit_stream;
    kernels_sample_params *params;
    kernels_sample_result *results;
    int32_t *pen_off, *pen_tok, *pen_cnt, *sort_buf;
    int pen_cap;

    /* How fast steps run (EWMAs; 0: not measured yet): small steps give
     * the fixed cost, big ones the prefill speed beyond it. A restore
     * shares a history's blocks with the store's reads by it. */
    worker_speed speed;

    worker_engine_stats stats;
};

static void stream_free(stream *s)
{
    if (!s)
        return;
    free(s->tokens);
    free(s->hashes);
    free(s->pages);
    free(s);
}

static void end_job(worker_engine *e, stream *s, bool passed)
{
    if (s->job) {
        e->o.restore.end(e->o.restore.ctx, s->job, passed);
        s->job = NULL;
    }
}

/* What a stream holds goes back: its pages and its state slot. */
static void release_pages(worker_engine *e, stream *s)
{
    end_job(e, s, false); /* before the pages go: the source lets go of them first */
    for (int i = 0; i < s->n_pages; i++)
        worker_pages_unref(e->pages, s->pages[i]);
    s->n_pages = 0;
    s->computed = 0;
    s->published = 0;
    if (s->state_slot >= 0) {
        e->free_slots[e->n_free_slots++] = s->state_slot;
        s->state_slot = -1;
    }
}

/* Hash of block b (common_block_hash), computed once and kept. */
static const common_hash *block_hash(worker_engine *e, stream *s, int b)
{
    while (s->hashed <= b) {
        int k = s->hashed;
        SHOAL_ASSERT((k + 1) * e->pt <= s->len);
        common_block_hash(k == 0 ? &s->root : &s->hashes[k - 1], s->tokens + k * e->pt, e->pt,
                          &s->hashes[k]);
        s->hashed++;
    }
    return &s->hashes[b];
}

/* ---- queues ---- */

static stream *wait_pop(worker_engine *e)
{
    stream *s = e->waiting[e->wait_head];
    e->wait_head = (e->wait_head + 1) % e->wait_cap;
    e->n_waiting--;
    return s;
}

static void wait_push_back(worker_engine *e, stream *s)
{
    SHOAL_ASSERT(e->n_waiting < e->wait_cap);
    e->waiting[(e->wait_head + e->n_waiting) % e->wait_cap] = s;
    e->n_waiting++;
}

static void wait_push_front(worker_engine *e, stream *s)
{
    SHOAL_ASSERT(e->n_waiting < e->wait_cap);
    e->wait_head = (e->wait_head + e->wait_cap - 1) % e->wait_cap;
    e->waiting[e->wait_head] = s;
    e->n_waiting++;
}

static void running_remove(worker_engine *e, int i)
{
    memmove(&e->running[i], &e->running[i + 1],
            (size_t)(e->n_running - i - 1) * sizeof *e->running);
    e->n_running--;
}

/* ---- open / close ---- */

/* A cached page is evicted: the checkpoint at its block goes with it. */
static void drop_checkpoint(void *ctx, int page, const common_hash *hash,
                            const common_hash *parent)
{
    (void)page, (void)parent;
    worker_checkpoints_evict(ctx, hash);
}

void worker_engine_size_model(const worker_engine_options *opt, worker_model_options *mo)
{
    mo->max_rows = opt->max_batch_tokens;
    mo->max_streams = opt->parallel;
    mo->state_slots = opt->parallel + opt->checkpoints;
    mo->max_logit_rows = opt->parallel;
    mo->max_pages_per_stream = (opt->max_model_len + mo->page_tokens - 1) / mo->page_tokens;
}

shoal_err worker_engine_open(worker_model *m, const worker_engine_options *opt,
                             worker_engine **out, shoal_diag *diag)
{
    *out = NULL;
    const kernels_kv_layout *kv = worker_model_kv_layout(m);
    int pages_per_stream = worker_model_max_pages_per_stream(m);
    if (opt->parallel < 1 || opt->parallel > worker_model_max_logit_rows(m) ||
        opt->parallel > worker_model_max_streams(m))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "engine: parallel %d must be in [1, %d] (the model's stream limit)",
                              opt->parallel, worker_model_max_logit_rows(m));
    if (opt->max_batch_tokens < 1 || opt->max_batch_tokens > worker_model_max_rows(m))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "engine: max batch tokens %d must be in [1, %d]",
                              opt->max_batch_tokens, worker_model_max_rows(m));
    if (opt->max_model_len < 2 || opt->max_model_len > pages_per_stream * kv->page_tokens)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "engine: max model len %d must be in [2, %d]", opt->max_model_len,
                              pages_per_stream * kv->page_tokens);
    if (opt->max_queued < 1 || opt->max_queued > SHOAL_QUEUED_STREAMS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "engine: queue of %d must be in [1, %d]",
                              opt->max_queued, SHOAL_QUEUED_STREAMS_MAX);
    worker_engine *e = calloc(1, sizeof *e);
    if (!e)
        return SHOAL_ERR_NOMEM;
    e->m = m;
    e->o = *opt;
    e->cfg = worker_model_config(m);
    e->pt = kv->page_tokens;
    e->pages_cap = (opt->max_model_len + e->pt - 1) / e->pt;
    e->fingerprint = *worker_model_fingerprint(m);
    e->wait_cap = opt->max_queued + opt->parallel;
    e->cancel_cap = opt->max_queued + opt->parallel;
    int rows = opt->max_batch_tokens, streams = opt->parallel;
    e->pen_cap = worker_model_penalty_cap(m);
    e->hybrid = worker_model_slot_bytes(m) > 0;
    int ckpts = e->hybrid ? opt->checkpoints : 0;
    if (opt->checkpoints < 0 || opt->checkpoint_interval < 0 ||
        opt->checkpoint_interval % kv->page_tokens != 0) {
        free(e);
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "engine: %d checkpoints every %d tokens: need a count >= 0 and an "
                              "interval that is 0 or a multiple of the page size %d",
                              opt->checkpoints, opt->checkpoint_interval, kv->page_tokens);
    }
    if (e->hybrid && worker_model_state_slots(m) < streams + ckpts) {
        free(e);
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "engine: parallel %d and %d checkpoints need as many state slots; "
                              "the model has %d",
                              streams, ckpts, worker_model_state_slots(m));
    }
    e->free_slots = malloc((size_t)streams * sizeof *e->free_slots);
    e->slots = malloc((size_t)streams * 4);
    if (!e->free_slots || !e->slots)
        goto out_nomem;
    for (int i = 0; i < streams; i++)
        e->free_slots[e->n_free_slots++] = streams - 1 - i;
    if (worker_pages_open(worker_model_kv_pages(m), opt->segment, opt->worker_index, &e->pages) !=
            SHOAL_OK ||
        worker_checkpoints_open(streams, ckpts, &e->ckpts) != SHOAL_OK)
        goto out_nomem;
    if (ckpts > 0)
        worker_pages_on_evict(e->pages, drop_checkpoint, e->ckpts);
    e->running = calloc((size_t)streams, sizeof *e->running);
    e->waiting = calloc((size_t)e->wait_cap, sizeof *e->waiting);
    e->cancelled = calloc((size_t)e->cancel_cap, sizeof *e->cancelled);
    e->ids = malloc((size_t)rows * 4);
    e->pos = malloc((size_t)rows * 4);
    e->row_stream = malloc((size_t)rows * 4);
    e->logit_rows = malloc((size_t)streams * 4);
    e->table = malloc((size_t)streams * (size_t)e->pages_cap * 4);
    e->batch = calloc((size_t)streams, sizeof *e->batch);
    e->logit_stream = calloc((size_t)streams, sizeof *e->logit_stream);
    e->params = calloc((size_t)streams, sizeof *e->params);
    e->results = calloc((size_t)streams, sizeof *e->results);
    e->pen_off = malloc((size_t)(streams + 1) * 4);
    e->pen_tok = malloc((size_t)e->pen_cap * 4);
    e->pen_cnt = malloc((size_t)e->pen_cap * 4);
    e->sort_buf = malloc((size_t)opt->max_model_len * 4);
    if (!e->running || !e->waiting || !e->cancelled || !e->ids || !e->pos || !e->row_stream ||
        !e->logit_rows || !e->table || !e->batch || !e->logit_stream || !e->params ||
        !e->results || !e->pen_off || !e->pen_tok || !e->pen_cnt || !e->sort_buf)
        goto out_nomem;
    *out = e;
    return SHOAL_OK;
out_nomem:
    worker_engine_close(e);
    return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "engine: no memory for its tables");
}

void worker_engine_close(worker_engine *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_running; i++) {
        release_pages(e, e->running[i]);
        stream_free(e->running[i]);
    }
    for (int i = 0; i < e->n_waiting; i++)
        stream_free(e->waiting[(e->wait_head + i) % e->wait_cap]);
    worker_pages_close(e->pages);
    worker_checkpoints_close(e->ckpts);
    free(e->running), free(e->waiting), free(e->cancelled);
    free(e->ids), free(e->pos), free(e->row_stream), free(e->logit_rows), free(e->table);
    free(e->batch), free(e->logit_stream), free(e->params), free(e->results);
    free(e->pen_off), free(e->pen_tok), free(e->pen_cnt), free(e->sort_buf);
    free(e->free_slots), free(e->slots);
    free(e);
}

/* ---- submit / cancel ---- */

static stream *find_live(worker_engine *e, uint64_t id, int *running_index, int *wait_index)
{
    *running_index = *wait_index = -1;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) {
            *running_index = i;
            return e->running[i];
        }
    for (int i = 0; i < e->n_waiting; i++) {
        stream *s = e->waiting[(e->wait_head + i) % e->wait_cap];
        if (s->id == id) {
            *wait_index = i;
            return s;
        }
    }
    return NULL;
}

static shoal_err check_sampling(const kernels_sample_params *p, shoal_diag *diag)
{
    if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !(p->repetition_penalty > 0.0f) ||
        !(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f) ||
        !(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f) || p->top_k < 0 ||
        p->logprobs < 0 || p->logprobs > KERNELS_SAMPLE_LOGPROBS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "sampling: temperature >= 0, top_p in (0, 1], min_p in [0, 1], "
                              "repetition_penalty > 0, presence and frequency penalties in "
                              "[-2, 2], top_k >= 0, logprobs in [0, %d]",
                              KERNELS_SAMPLE_LOGPROBS_MAX);
    return SHOAL_OK;
}

shoal_err worker_engine_submit(worker_engine *e, const worker_request *r, shoal_diag *diag)
{
    if (e->broken)
        return shoal_diag_set(diag, SHOAL_ERR_BROKEN, "engine: broken by an earlier error");
    if (r->prompt_len < 1)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "request: the prompt is empty");
    if (r->max_tokens < 1)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "request: max_tokens must be at least 1");
    if ((int64_t)r->prompt_len + r->max_tokens > e->o.max_model_len)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "request: %d prompt tokens + max_tokens %d is over the context "
                              "length of %d tokens",
                              r->prompt_len, r->max_tokens, e->o.max_model_len);
    int64_t pages = ((int64_t)r->prompt_len + r->max_tokens + e->pt - 1) / e->pt;
    if (pages > worker_model_kv_pages(e->m))
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "request: %d prompt tokens + max_tokens %d need %lld KV pages, the "
                              "pool has %d",
                              r->prompt_len, r->max_tokens, (long long)pages,
                              worker_model_kv_pages(e->m));
    for (int i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->cfg->vocab)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "request: prompt token %d is %d, outside the vocabulary of %d",
                                  i, r->prompt[i], e->cfg->vocab);
    if (r->index_base < 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "request: negative index base");
    if (r->stop_count < 0 || r->stop_count > WORKER_STOP_IDS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "request: at most %d stop token ids",
                              WORKER_STOP_IDS_MAX);
    shoal_err err = check_sampling(&r->sampling, diag);
    if (err)
        return err;
    if (e->n_waiting >= e->o.max_queued)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "engine: %d streams already wait; retry later",
                              e->n_waiting);
    int ri, wi;
    if (find_live(e, r->id, &ri, &wi))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "request: stream id %llu is in use",
                              (unsigned long long)r->id);
    stream *s = calloc(1, sizeof *s);
    int cap = r->prompt_len + r->max_tokens;
    if (s) {
        s->tokens = malloc((size_t)cap * 4);
        s->hashes = malloc((size_t)(cap / e->pt + 1) * sizeof *s->hashes);
        s->pages = malloc((size_t)e->pages_cap * 4);
    }
    if (!s || !s->tokens || !s->hashes || !s->pages) {
        stream_free(s);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "engine: no memory for a stream");
    }
    s->id = r->id;
    memcpy(s->tokens, r->prompt, (size_t)r->prompt_len * 4);
    s->len = s->prompt_len = r->prompt_len;
    s->max_tokens = r->max_tokens;
    s->index_base = r->index_base;
    s->sp = r->sampling;
    s->ignore_eos = r->ignore_eos;
    s->stop_count = r->stop_count;
    memcpy(s->stop_ids, r->stop_ids, sizeof s->stop_ids);
    /* streams share pages only with the same model, layout and salt */
    common_block_root(&e->fingerprint, r->has_salt ? &r->salt : NULL, &s->root);
    s->batch_slot = -1;
    s->state_slot = s->hit_slot = -1;
    wait_push_back(e, s);
    return SHOAL_OK;
}

bool worker_engine_cancel(worker_engine *e, uint64_t id)
{
    int ri, wi;
    stream *s = find_live(e, id, &ri, &wi);
    if (!s || e->n_cancelled == e->cancel_cap)
        return false;
    if (ri >= 0) {
        release_pages(e, s);
        running_remove(e, ri);
    } else {
        /* close the gap in the ring */
        for (int i = wi; i > 0; i--)
            e->waiting[(e->wait_head + i) % e->wait_cap] =
                e->waiting[(e->wait_head + i - 1) % e->wait_cap];
        e->wait_head = (e->wait_head + 1) % e->wait_cap;
        e->n_waiting--;
    }
    e->cancelled[e->n_cancelled++] = id;
    stream_free(s);
    return true;
}

int worker_engine_events_max(const worker_engine *e)
{
    return e->o.parallel + e->cancel_cap;
}

bool worker_engine_busy(const worker_engine *e)
{
    return e->n_running > 0 || e->n_waiting > 0 || e->n_cancelled > 0;
}

void worker_engine_stats_get(const worker_engine *e, worker_engine_stats *out)
{
    *out = e->stats;
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    worker_pages_stats_get(e->pages, &out->pages);
    worker_checkpoints_stats_get(e->ckpts, &out->checkpoints);
    out->state_slots = e->hybrid ? e->o.parallel : 0;
    out->slot_bytes = worker_model_slot_bytes(e->m);
}

const worker_pages *worker_engine_pages(const worker_engine *e)
{
    return e->pages;
}

worker_pages *worker_engine_pages_mut(worker_engine *e)
{
    return e->pages;
}

worker_checkpoints *worker_engine_checkpoints(worker_engine *e)
{
    return e->hybrid ? e->ckpts : NULL;
}

static void stream_info(const stream *s, bool running, worker_stream_info *out)
{
    out->id = s->id;
    out->running = running;
    out->prefilling = running && s->computed < s->len - 1;
    out->prompt_tokens = s->prompt_len;
    out->tokens = s->len;
    out->generated = s->generated;
    out->pages = s->n_pages;
    out->cached_tokens = s->cached_tokens;
}

int worker_engine_streams(const worker_engine *e, worker_stream_info *out, int max)
{
    int n = 0;
    for (int i = 0; i < e->n_running && n < max; i++)
        stream_info(e->running[i], true, &out[n++]);
    for (int i = 0; i < e->n_waiting && n < max; i++)
        stream_info(e->waiting[(e->wait_head + i) % e->wait_cap], false, &out[n++]);
    return n;
}

/* ---- one step ---- */

/* Preempts the most recently admitted running stream after index `after`:
 * its pages go back (published ones stay cached, so its recompute is often
 * a prefix hit) and it waits at the front of the queue. */
static bool preempt_latest(worker_engine *e, int after)
{
    int i = e->n_running - 1;
    if (i <= after)
        return false;
    stream *v = e->running[i];
    SHOAL_ASSERT(v->batch_slot < 0); /* later streams are not scheduled yet */
    release_pages(e, v);
    v->first_admission = false;
    running_remove(e, i);
    wait_push_front(e, v);
    e->stats.preemptions++;
    return true;
}

/* Gives s (running index idx) pages for tokens [0, upto). With preempt,
 * later streams lose theirs when the pool is empty. false if it cannot. */
static bool grow(worker_engine *e, int idx, stream *s, int upto, bool preempt)
{
    int need = (upto + e->pt - 1) / e->pt;
    while (s->n_pages < need) {
        int pg = worker_pages_alloc(e->pages, s->id);
        if (pg < 0) {
            if (preempt && preempt_latest(e, idx))
                continue;
            return false;
        }
        s->pages[s->n_pages++] = pg;
    }
    return true;
}

typedef struct batch_build {
    int rows;
    int streams;
    int logits;
    int budget;
} batch_build;

static void add_rows(worker_engine *e, batch_build *b, stream *s, int n)
{
    SHOAL_ASSERT(n > 0 && s->computed + n <= s->len && s->computed + n <= s->n_pages * e->pt);
    if (s->batch_slot < 0) {
        s->batch_slot = b->streams;
        e->batch[b->streams++] = s;
    }
    for (int i = 0; i < n; i++) {
        e->ids[b->rows] = s->tokens[s->computed + i];
        e->pos[b->rows] = s->computed + i;
        e->row_stream[b->rows] = s->batch_slot;
        b->rows++;
    }
    s->rows = n;
    b->budget -= n;
    if (s->computed + n == s->len) { /* the last known token: sample after it */
        e->logit_rows[b->logits] = b->rows - 1;
        e->logit_stream[b->logits++] = s;
    }
}

/* Clamps a prompt chunk of n tokens of s to what the restore job lets it
 * compute now: blocks the store delivered are skipped (counted as
 * restored), blocks still being read end the chunk, the rest are claimed
 * for computing. Ends the job once the stream is past it. */
static int job_chunk(worker_engine *e, stream *s, int n)
{
    const worker_async_source *src = &e->o.restore;
    int pt = e->pt, end = (s->job_first + s->job_blocks) * pt;
    while (s->computed % pt == 0 && s->computed < end) {
        worker_take t =
            src->take(src->ctx, s->job, s->computed / pt - s->job_first, 0, e->speed);
        if (t == WORKER_TAKE_COMPUTE)
            break;
        if (t == WORKER_TAKE_WAIT)
            return 0;
        /* READY: the store's page holds this block (published by the source) */
        SHOAL_ASSERT(s->published == s->computed / pt);
        s->computed += pt;
        s->published++;
        e->stats.restore_tokens += (uint64_t)pt;
        if (s->first_admission) {
            s->cached_tokens += pt;
            e->stats.cached_tokens += (uint64_t)pt;
        }
    }
    if (s->computed >= end) {
        end_job(e, s, true);
        return n < s->len - s->computed ? n : s->len - s->computed;
    }
    if (n > s->len - s->computed)
        n = s->len - s->computed;
    /* the chunk's later blocks inside the job: claim each, stop at one the
     * store has or is reading */
    int first = s->computed / pt;
    for (int blk = first + 1; blk * pt < s->computed + n && blk * pt < end; blk++)
        if (src->take(src->ctx, s->job, blk - s->job_first, blk - first, e->speed) !=
            WORKER_TAKE_COMPUTE) {
            n = blk * pt - s->computed;
            break;
        }
    return n;
}

/* Hybrids: the prompt's last full block before its last token, where the
 * engine keeps the state (a repeated prompt or a next turn starts there). */
static int last_full_block_end(const worker_engine *e, const stream *s)
{
    return (s->len - 1) / e->pt * e->pt;
}

/* Hybrids with checkpoints: a chunk of n tokens ends at the next boundary
 * where the engine keeps the state, so the step leaves it in the slot. */
static int checkpoint_chunk(const worker_engine *e, const stream *s, int n)
{
    if (e->o.checkpoints == 0)
        return n;
    int c = s->computed, cut = c + n, last = last_full_block_end(e, s);
    if (c < last && last < cut)
        cut = last;
    int iv = e->o.checkpoint_interval;
    if (iv > 0 && (c / iv + 1) * iv < cut)
        cut = (c / iv + 1) * iv;
    return cut - c;
}

/* Hybrids: after a step, the state of a stream that ended on a boundary
 * the engine keeps goes into a checkpoint under that block's hash. One at
 * the stream's last known token (a decode row's block, or a prompt that
 * fills its last block) is its tail: it replaces the stream's previous
 * tail, so the latest stays, the turn's end once the stream finishes. */
static void take_checkpoint(worker_engine *e, stream *s)
{
    int c = s->computed, pt = e->pt, iv = e->o.checkpoint_interval;
    if (e->o.checkpoints == 0 || c == 0 || c % pt != 0)
        return;
    bool on_interval = iv > 0 && c % iv == 0;
    bool tail = c == s->len;
    if (!on_interval && !tail && c != last_full_block_end(e, s))
        return;
    const common_hash *h = block_hash(e, s, c / pt - 1);
    /* a turn's (its prompt's last full block, its latest decode block) is
     * what the state store keeps */
    int slot = worker_checkpoints_add(e->ckpts, h, tail || c == last_full_block_end(e, s));
    if (slot >= 0) {
        shoal_diag d = {{0}};
        if (worker_model_slot_copy(e->m, slot, s->state_slot, &d) != SHOAL_OK) {
            LOG_WARN("stream %llu: %s; no checkpoint at token %d", (unsigned long long)s->id,
                     d.msg, c);
            worker_checkpoints_drop(e->ckpts, h);
            return;
        }
    }
    if (tail && !on_interval) {
        if (s->has_tail)
            worker_checkpoints_drop(e->ckpts, &s->tail);
        s->tail = *h;
        s->has_tail = true;
    }
}

/* A hybrid's prefix hit: its slot starts from the checkpoint in model
 * slot `from`. Without one (-1), or when the copy fails, the pages go too
 * and the stream computes from its start. */
static bool start_from_checkpoint(worker_engine *e, stream *s, int from)
{
    shoal_diag d = {{0}};
    bool ok = from >= 0 && worker_model_slot_copy(e->m, s->state_slot, from, &d) == SHOAL_OK;
    if (!ok) {
        if (from >= 0)
            LOG_WARN("stream %llu: %s; it computes its prompt from the start",
                     (unsigned long long)s->id, d.msg);
        for (int i = 0; i < s->n_pages; i++)
            worker_pages_unref(e->pages, s->pages[i]);
        s->n_pages = s->computed = s->published = 0;
    }
    return ok;
}

/* Hybrids: a restore that failed leaves the stream at its local hit: the
 * job's pages go back, and its slot gets that hit's checkpoint again (the
 * failed restore may have written it); without one the stream starts over. */
static void back_to_local_hit(worker_engine *e, stream *s)
{
    int hits = s->job_first;
    end_job(e, s, false);
    while (s->n_pages > hits)
        worker_pages_unref(e->pages, s->pages[--s->n_pages]);
    s->job_blocks = 0;
    if (hits > 0)
        start_from_checkpoint(
            e, s, worker_checkpoints_find(e->ckpts, block_hash(e, s, hits - 1), false));
}

/* Hybrids: the state a restore put into s's slot is a checkpoint here
 * too, as its pages are cached here (the store has it already), so the
 * next stream on that prefix takes both from memory. */
static void keep_restored_checkpoint(worker_engine *e, stream *s)
{
    const common_hash *h = block_hash(e, s, s->computed / e->pt - 1);
    int slot = worker_checkpoints_add(e->ckpts, h, true);
    if (slot < 0)
        return;
    shoal_diag d = {{0}};
    if (worker_model_slot_copy(e->m, slot, s->state_slot, &d) == SHOAL_OK)
        worker_checkpoints_mark_stored(e->ckpts, h);
    else
        worker_checkpoints_drop(e->ckpts, h);
}

/* Hybrids: a restore is all or nothing. The stream waits until every
 * block of the job is in its page and the state checkpoint at the last
 * one is in its slot, then goes on past them; when anything failed it
 * computes them from its local hit. */
static int hybrid_job_chunk(worker_engine *e, stream *s, int n)
{
    const worker_async_source *src = &e->o.restore;
    worker_take t = src->take(src->ctx, s->job, 0, 0, e->speed); /* the whole job's */
    if (t == WORKER_TAKE_READY)
        t = src->state(src->ctx, s->job, s->state_slot);
    if (t == WORKER_TAKE_WAIT)
        return 0;
    if (t == WORKER_TAKE_READY) {
        int tokens = s->job_blocks * e->pt;
        SHOAL_ASSERT(s->published == s->computed / e->pt);
        s->computed += tokens;
        s->published += s->job_blocks;
        e->stats.restore_tokens += (uint64_t)tokens;
        if (s->first_admission) {
            s->cached_tokens += tokens;
            e->stats.cached_tokens += (uint64_t)tokens;
        }
        end_job(e, s, true);
        keep_restored_checkpoint(e, s);
    } else {
        back_to_local_hit(e, s);
    }
    return n < s->len - s->computed ? n : s->len - s->computed;
}

/* A prompt chunk of s, as long as the budget, the pages and a restore in
 * progress allow. */
static void add_prefill(worker_engine *e, batch_build *b, int idx, stream *s)
{
    int n = s->len - s->computed;
    if (n > b->budget)
        n = b->budget;
    if (s->job && (n = e->hybrid ? hybrid_job_chunk(e, s, n) : job_chunk(e, s, n)) == 0)
        return;
    if (e->hybrid)
        n = checkpoint_chunk(e, s, n);
    grow(e, idx, s, s->computed + n, false);
    int room = s->n_pages * e->pt - s->computed;
    if (n > room)
        n = room;
    if (n > 0)
        add_rows(e, b, s, n);
}

/* Blocks [from, max_blocks) from a prefix source; returns how many. */
static int fill_from(worker_engine *e, stream *s, const worker_prefix_source *src, int from,
                     int max_blocks)
{
    if (!src->fill || from >= max_blocks)
        return 0;
    block_hash(e, s, max_blocks - 1);
    const common_hash *parent = from == 0 ? &s->root : &s->hashes[from - 1];
    int n = src->fill(src->ctx, e->pages, s->id, s->hashes + from, parent, max_blocks - from,
                      s->pages + s->n_pages);
    SHOAL_ASSERT(n >= 0 && n <= max_blocks - from);
    s->n_pages += n;
    return n;
}

/* Starts a restore of blocks [from, max_blocks) from the state store,
 * whose first `budget` tokens the engine computes in this step; returns
 * how many blocks it will deliver or leave to the engine. */
static int start_job(worker_engine *e, stream *s, int from, int max_blocks, int budget)
{
    const worker_async_source *src = &e->o.restore;
    if (!src->start || from >= max_blocks)
        return 0;
    block_hash(e, s, max_blocks - 1);
    const common_hash *parent = from == 0 ? &s->root : &s->hashes[from - 1];
    void *job = NULL;
    int n = src->start(src->ctx, e->pages, s->id, s->hashes + from, parent, max_blocks - from,
                       (budget + e->pt - 1) / e->pt, e->speed, s->pages + s->n_pages, &job);
    SHOAL_ASSERT(n >= 0 && n <= max_blocks - from && (n == 0) == (job == NULL));
    s->job = job;
    s->job_first = from;
    s->job_blocks = n;
    s->n_pages += n;
    return n;
}

/* Hybrids: the longest chain of cached pages that ends at a checkpoint
 * (pages past the last checkpoint go back); the checkpoint's slot waits in
 * s->hit_slot for the stream's own slot. */
static int take_hybrid_prefix(worker_engine *e, stream *s, int max_blocks)
{
    int found = 0, hits = 0;
    s->hit_slot = -1;
    while (found < max_blocks) {
        int pg = worker_pages_lookup(e->pages, block_hash(e, s, found));
        if (pg < 0)
            break;
        s->pages[s->n_pages++] = pg;
        found++;
        if (worker_checkpoints_find(e->ckpts, block_hash(e, s, found - 1), false) >= 0)
            hits = found;
    }
    while (s->n_pages > hits)
        worker_pages_unref(e->pages, s->pages[--s->n_pages]);
    if (hits > 0)
        s->hit_slot = worker_checkpoints_find(e->ckpts, block_hash(e, s, hits - 1), true);
    s->computed = hits * e->pt;
    s->published = hits;
    return hits;
}

/* Takes the longest cached prefix of s's known tokens (leaving at least
 * one token to compute, whose logits start its output): this worker's own
 * pages first, then another worker's; then starts a restore of what the
 * state store holds after them, which arrives while the stream computes.
 * Returns the blocks the stream need not compute now. */
static int take_prefix(worker_engine *e, stream *s, int budget, int *imported, int *job_blocks)
{
    int max_blocks = (s->len - 1) / e->pt;
    int hits = 0;
    if (e->hybrid) {
        *imported = 0;
        hits = take_hybrid_prefix(e, s, max_blocks);
        *job_blocks = e->o.restore.state ? start_job(e, s, hits, max_blocks, budget) : 0;
        return hits;
    }
    while (hits < max_blocks) {
        int pg = worker_pages_lookup(e->pages, block_hash(e, s, hits));
        if (pg < 0)
            break;
        s->pages[s->n_pages++] = pg;
        hits++;
    }
    *imported = fill_from(e, s, &e->o.import, hits, max_blocks);
    hits += *imported;
    s->computed = hits * e->pt;
    s->published = hits;
    *job_blocks = start_job(e, s, hits, max_blocks, budget);
    return hits;
}

/* Whether s shares a block with a running stream that computes it now:
 * r's first unpublished block b, whose hash (a chain: the whole prefix up
 * to it) is s's block b too. Admitted now, s would take r's published
 * blocks and compute b and on as r does (streams admitted together with
 * one new system prompt each computed all of it); a pass or a few later
 * they are s's cache hits. Only blocks s could take from the cache count.
 * Looks at no page: a stream put off holds none and counts no lookup. */
static bool computing_elsewhere(worker_engine *e, stream *s)
{
    const int cacheable = e->hybrid && e->o.checkpoints == 0 ? 0 : (s->len - 1) / e->pt;
    for (int i = 0; i < e->n_running; i++) {
        stream *r = e->running[i];
        const int b = r->published;
        if (b < cacheable && (b + 1) * e->pt <= r->len &&
            common_hash_equal(block_hash(e, r, b), block_hash(e, s, b)))
            return true;
    }
    return false;
}

static void admit(worker_engine *e, batch_build *b)
{
    /* each waiting stream is looked at once a step: one that would compute
     * a block another computes now goes to the back, the rest keep order */
    for (int looked = e->n_waiting;
         looked > 0 && e->n_waiting > 0 && e->n_running < e->o.parallel && b->budget > 0;
         looked--) {
        stream *s = e->waiting[e->wait_head];
        if (computing_elsewhere(e, s)) {
            wait_pop(e);
            wait_push_back(e, s);
            e->stats.deferred++;
            continue;
        }
        int imported, job_blocks;
        int hits = take_prefix(e, s, b->budget, &imported, &job_blocks);
        int need = (s->len + e->pt - 1) / e->pt - hits - job_blocks;
        if (worker_pages_available(e->pages) < need) {
            release_pages(e, s); /* first come, first served: wait for room */
            break;
        }
        wait_pop(e);
        if (e->hybrid) {
            SHOAL_ASSERT(e->n_free_slots > 0); /* as many slots as running streams */
            s->state_slot = e->free_slots[--e->n_free_slots];
            if (hits > 0 && !start_from_checkpoint(e, s, s->hit_slot))
                hits = 0;
            s->hit_slot = -1;
        }
        if (!s->admitted_once) {
            s->admitted_once = true;
            s->first_admission = true;
            s->cached_tokens = hits * e->pt; /* restored blocks add as they come */
            e->stats.prompt_tokens += (uint64_t)s->prompt_len;
            e->stats.cached_tokens += (uint64_t)s->cached_tokens;
        }
        e->stats.import_tokens += (uint64_t)(imported * e->pt);
        e->running[e->n_running++] = s;
        add_prefill(e, b, e->n_running - 1, s);
    }
}

static void publish_blocks(worker_engine *e, stream *s)
{
    for (; (s->published + 1) * e->pt <= s->computed; s->published++)
        worker_pages_publish(e->pages, s->pages[s->published], block_hash(e, s, s->published),
                             s->published == 0 ? &s->root : &s->hashes[s->published - 1]);
}

static double ewma(double old, double sample)
{
    return old > 0 ? 0.7 * old + 0.3 * sample : sample;
}

/* A step of `rows` rows took dt seconds: small steps are its fixed cost
 * (the weights' pass), big ones add the prefill speed beyond that. */
static void measure_step(worker_engine *e, int rows, double dt)
{
    if (rows < SHOAL_PREFILL_SAMPLE_ROWS) {
        e->speed.fixed_s = ewma(e->speed.fixed_s, dt);
    } else {
        double beyond = dt - e->speed.fixed_s;
        if (beyond < dt / 4) /* a fixed cost measured on other shapes: ignore it */
            beyond = dt;
        e->speed.bps = ewma(e->speed.bps, (double)rows / e->pt / beyond);
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Penalty lists of the sampling rows, or false when no row has one. */
static bool build_penalties(worker_engine *e, int rows, worker_penalties *pen)
{
    bool any = false;
    for (int k = 0; k < rows; k++) {
        const kernels_sample_params *p = &e->logit_stream[k]->sp;
        any |= p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
               p->frequency_penalty != 0.0f;
    }
    if (!any)
        return false;
    int n = 0;
    for (int k = 0; k < rows; k++) {
        e->pen_off[k] = n;
        const stream *s = e->logit_stream[k];
        const kernels_sample_params *p = &s->sp;
        if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
            p->frequency_penalty == 0.0f)
            continue;
        /* distinct tokens of the whole context, each with its count in the
         * output; tokens only in the prompt get count 0 */
        memcpy(e->sort_buf, s->tokens, (size_t)s->len * 4);
        for (int i = s->prompt_len; i < s->len; i++)
            e->sort_buf[i] |= INT32_MIN; /* mark output tokens before sorting */
        for (int i = 0; i < s->len; i++) {
            int32_t t = e->sort_buf[i] & INT32_MAX;
            e->sort_buf[i] = t * 2 + (e->sort_buf[i] < 0); /* id, then prompt/output bit */
        }
        qsort(e->sort_buf, (size_t)s->len, 4, cmp_i32);
        for (int i = 0; i < s->len;) {
            int32_t t = e->sort_buf[i] / 2, count = 0;
            for (; i < s->len && e->sort_buf[i] / 2 == t; i++)
                count += e->sort_buf[i] & 1;
            SHOAL_ASSERT(n < e->pen_cap);
            e->pen_tok[n] = t;
            e->pen_cnt[n++] = count;
        }
    }
    e->pen_off[rows] = n;
    pen->offsets = e->pen_off;
    pen->tokens = e->pen_tok;
    pen->counts = e->pen_cnt;
    pen->entries = n;
    return true;
}

static bool stops(const worker_engine *e, const stream *s, int32_t tok)
{
    if (!s->ignore_eos)
        for (int i = 0; i < e->cfg->eos_count; i++)
            if (e->cfg->eos_ids[i] == tok)
                return true;
    for (int i = 0; i < s->stop_count; i++)
        if (s->stop_ids[i] == tok)
            return true;
    return false;
}

static void finish_stream(worker_engine *e, stream *s)
{
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) {
            running_remove(e, i);
            break;
        }
    release_pages(e, s);
    stream_free(s);
}

shoal_err worker_engine_step(worker_engine *e, worker_event *events, int *count,
                             shoal_diag *diag)
{
    *count = 0;
    if (e->broken)
        return shoal_diag_set(diag, SHOAL_ERR_BROKEN, "engine: broken by an earlier error");
    int nev = 0;
    for (int i = 0; i < e->n_cancelled; i++) {
        worker_event *ev = &events[nev++];
        memset(ev, 0, sizeof *ev);
        ev->stream_id = e->cancelled[i];
        ev->token = -1;
        ev->finish = WORKER_FINISH_CANCELLED;
    }
    e->n_cancelled = 0;

    if (e->o.restore.pump)
        e->o.restore.pump(e->o.restore.ctx, 0);
    batch_build b = {.budget = e->o.max_batch_tokens};
    uint64_t preempted = e->stats.preemptions;
    /* 1. one decode row for every stream whose prompt is done, oldest first */
    for (int i = 0; i < e->n_running && b.budget > 0;) {
        stream *s = e->running[i];
        if (s->computed != s->len - 1) {
            i++;
            continue;
        }
        if (!grow(e, i, s, s->len, true)) { /* s is the latest: it yields */
            SHOAL_ASSERT(i == e->n_running - 1);
            preempt_latest(e, i - 1);
            continue;
        }
        add_rows(e, &b, s, 1);
        i++;
    }
    /* 2. prompt chunks of streams still prefilling, then new streams */
    for (int i = 0; i < e->n_running && b.budget > 0; i++)
        if (e->running[i]->batch_slot < 0 && e->running[i]->computed < e->running[i]->len - 1)
            add_prefill(e, &b, i, e->running[i]);
    if (e->stats.preemptions == preempted)
        admit(e, &b);
    if (b.rows == 0) {
        bool restoring = false;
        for (int i = 0; i < e->n_running; i++)
            restoring |= e->running[i]->job != NULL;
        if (restoring) /* streams wait for the store's reads: wait with them */
            e->o.restore.pump(e->o.restore.ctx, SHOAL_STATES_WAIT_MS);
        else if (e->n_running > 1)
            /* Every running stream waits for pages that others hold: free
             * the latest one's so the rest can move. */
            preempt_latest(e, e->n_running - 2);
        *count = nev;
        return SHOAL_OK;
    }

    int stride = 1;
    for (int j = 0; j < b.streams; j++)
        stride = e->batch[j]->n_pages > stride ? e->batch[j]->n_pages : stride;
    for (int j = 0; j < b.streams; j++)
        memcpy(e->table + (size_t)j * (size_t)stride, e->batch[j]->pages,
               (size_t)e->batch[j]->n_pages * 4);
    for (int k = 0; k < b.logits; k++) {
        e->params[k] = e->logit_stream[k]->sp;
        e->params[k].step =
            (uint64_t)(e->logit_stream[k]->index_base + e->logit_stream[k]->generated);
    }
    worker_penalties pen;
    bool has_pen = build_penalties(e, b.logits, &pen);
    for (int j = 0; j < b.streams; j++)
        e->slots[j] = e->batch[j]->state_slot;
    worker_forward f = {b.rows, e->ids,   e->pos,   e->row_stream, b.streams, stride,
                        e->table, b.logits, e->logit_rows, e->hybrid ? e->slots : NULL};
    uint64_t t0 = common_mono_ns();
    shoal_err err = worker_model_step(e->m, &f, e->params, has_pen ? &pen : NULL, e->results, diag);
    if (err) {
        e->broken = true;
        return err;
    }
    measure_step(e, b.rows, (double)(common_mono_ns() - t0) / 1e9);
    e->stats.steps++;
    e->stats.computed_tokens += (uint64_t)b.rows;
    for (int j = 0; j < b.streams; j++) {
        stream *s = e->batch[j];
        s->computed += s->rows;
        s->rows = 0;
        s->batch_slot = -1;
        publish_blocks(e, s);
        if (e->hybrid)
            take_checkpoint(e, s);
        /* A chunk that computed the job's last blocks: the stream is past
         * it (job_chunk sees that only when another chunk of the prompt
         * follows, and a job that ran to the prompt's end would otherwise
         * end with its pages, as if cut short). */
        if (s->job && s->computed >= (s->job_first + s->job_blocks) * e->pt)
            end_job(e, s, true);
    }
    for (int k = 0; k < b.logits; k++) {
        stream *s = e->logit_stream[k];
        const kernels_sample_result *res = &e->results[k];
        worker_event *ev = &events[nev++];
        memset(ev, 0, sizeof *ev);
        ev->stream_id = s->id;
        ev->token = res->token;
        ev->index = s->index_base + s->generated;
        ev->logprob = res->logprob;
        ev->top_count = s->sp.logprobs;
        memcpy(ev->top_ids, res->top_ids, sizeof ev->top_ids);
        memcpy(ev->top_logprobs, res->top_logprobs, sizeof ev->top_logprobs);
        if (ev->index == 0) {
            ev->prompt_tokens = s->prompt_len;
            ev->cached_tokens = s->cached_tokens;
        }
        s->tokens[s->len++] = res->token;
        s->generated++;
        e->stats.generated_tokens++;
        if (stops(e, s, res->token))
            ev->finish = WORKER_FINISH_STOP;
        else if (s->generated == s->max_tokens)
            ev->finish = WORKER_FINISH_LENGTH;
        if (ev->finish != WORKER_FINISH_NONE)
            finish_stream(e, s);
    }
    *count = nev;
    return SHOAL_OK;
}
