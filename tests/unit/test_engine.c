/* The engine: batch invariance (alone, among others, with prefix hits,
 * through preemption), the prefix cache, page accounting after every kind
 * of end, admission control, stop conditions, and a stress run of 200
 * streams through a pool too small for them at once.
 *
 * SHOAL_TEST_DEVICE picks the backend (default cpu). On the CPU backend a
 * stream's output must equal its solo run exactly. On a GPU, cuBLAS picks
 * other tiles for other batch sizes, so equality with the solo run is
 * measured and printed ("equal to solo: N of M"), not required; the same
 * batch run twice must still agree, and the page and prefix tests hold. */
#include "common/common_rng.h"
#include "tests/test.h"
#include "tests/test_model.h"
#include "worker/worker_engine.h"
#include "worker/worker_warmup.h"

#include <stdint.h>

enum { MAX_STREAMS = 256, MAX_OUT = 64 };

/* The model: a parity fixture, llama3-scaled-bf16 unless SHOAL_TEST_MODEL
 * names another (CTest runs the engine on a Qwen3-MoE one too). */
#define MODEL_DIR test_model_dir("llama3-scaled-bf16")
static int vocab;

typedef struct req {
    int32_t prompt[1100];
    int prompt_len;
    int max_tokens;
    kernels_sample_params sp;
    int32_t out[MAX_OUT];
    int out_len;
    int finish;
    int cached;
} req;

static const char *device = "cpu";
static bool exact; /* batch invariance is required (CPU) or measured */
static int solo_equal, solo_total;

static kernels_sample_params greedy(void)
{
    kernels_sample_params p = {0};
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

static kernels_sample_params seeded(uint64_t seed)
{
    kernels_sample_params p = greedy();
    p.temperature = 0.9f;
    p.top_k = 50;
    p.top_p = 0.95f;
    p.seed = seed;
    if (seed % 3 == 0) {
        p.repetition_penalty = 1.2f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.3f;
    }
    return p;
}

typedef struct setup {
    int parallel;
    int batch_tokens;
    int kv_pages;
    int max_model_len;
} setup;

/* Hybrid models keep a state checkpoint at every page here, so that their
 * prefix hits are those of the other models (test_hybrid_prefix tests the
 * engine's own choice of boundaries). */
enum { HYBRID_CHECKPOINTS = 512, HYBRID_INTERVAL = 16 };

static worker_engine_options engine_options(const setup *st)
{
    worker_engine_options eo = {.max_batch_tokens = st->batch_tokens,
                                .parallel = st->parallel,
                                .max_queued = 1024,
                                .max_model_len = st->max_model_len,
                                .checkpoints = HYBRID_CHECKPOINTS,
                                .checkpoint_interval = HYBRID_INTERVAL};
    return eo;
}

static worker_model *open_model(const setup *st)
{
    worker_engine_options eo = engine_options(st);
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = MODEL_DIR;
    mo.kv_pages = st->kv_pages;
    mo.threads = 2;
    mo.device = device;
    worker_engine_size_model(&eo, &mo);
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_model_open(&mo, &m, &diag) == SHOAL_OK, "%s", diag.msg);
    return m;
}

static worker_engine *open_engine(worker_model *m, const setup *st)
{
    worker_engine_options eo = engine_options(st);
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_engine_open(m, &eo, &e, &diag) == SHOAL_OK, "%s", diag.msg);
    return e;
}

static void submit(worker_engine *e, req *r, uint64_t id)
{
    worker_request wr = {0};
    wr.id = id;
    wr.prompt = r->prompt;
    wr.prompt_len = r->prompt_len;
    wr.max_tokens = r->max_tokens;
    wr.sampling = r->sp;
    wr.ignore_eos = true;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_engine_submit(e, &wr, &diag) == SHOAL_OK, "%s", diag.msg);
    r->out_len = 0;
    r->finish = 0;
}

/* Steps until idle, collecting events into reqs[id]. cancel_at: cancel
 * stream cancel_id once `cancel_at` tokens have been produced overall. */
static void drain(worker_engine *e, req *reqs, int cancel_at, uint64_t cancel_id)
{
    worker_event *ev = malloc((size_t)worker_engine_events_max(e) * sizeof *ev);
    int produced = 0, guard = 0;
    while (worker_engine_busy(e) && guard++ < 100000) {
        int n;
        shoal_diag diag = {{0}};
        shoal_err err = worker_engine_step(e, ev, &n, &diag);
        CHECK_MSG(err == SHOAL_OK, "%s", diag.msg);
        if (err)
            break;
        for (int i = 0; i < n; i++) {
            req *r = &reqs[ev[i].stream_id];
            if (ev[i].token >= 0) {
                CHECK_EQ_INT(ev[i].index, r->out_len);
                if (r->out_len < MAX_OUT)
                    r->out[r->out_len++] = ev[i].token;
                if (ev[i].index == 0)
                    r->cached = ev[i].cached_tokens;
                produced++;
            }
            if (ev[i].finish)
                r->finish = ev[i].finish;
        }
        if (cancel_at >= 0 && produced >= cancel_at) {
            CHECK(worker_engine_cancel(e, cancel_id));
            cancel_at = -1;
        }
    }
    free(ev);
}

static bool all_pages_returned(worker_engine *e)
{
    const worker_pages *p = worker_engine_pages(e);
    worker_pages_stats ps;
    worker_pages_stats_get(p, &ps);
    int32_t *zero = calloc((size_t)ps.total, sizeof *zero);
    shoal_diag diag = {{0}};
    bool ok = worker_pages_check(p, zero, &diag);
    CHECK_MSG(ok, "%s", diag.msg);
    CHECK_EQ_INT(ps.active, 0);
    free(zero);
    return ok && ps.active == 0;
}

static uint64_t rng = 99;

static void random_tokens(int32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)vocab);
}

static void random_prompt(req *r, int len, const int32_t *prefix, int prefix_len)
{
    int kept = prefix_len < len ? prefix_len : len;
    r->prompt_len = len;
    if (prefix && kept > 0)
        memcpy(r->prompt, prefix, (size_t)kept * sizeof *prefix);
    random_tokens(r->prompt + kept, len - kept);
}

/* Each request alone, in a fresh engine: the reference. */
static void run_solo(req *reqs, int n, int max_model_len)
{
    setup st = {1, 512, 80, max_model_len};
    worker_model *m = open_model(&st);
    for (int i = 0; i < n; i++) {
        worker_engine *e = open_engine(m, &st);
        submit(e, &reqs[i], (uint64_t)i);
        drain(e, reqs, -1, 0);
        worker_engine_close(e);
    }
    worker_model_close(m);
}

static void copy_outputs(req *dst, const req *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = src[i];
}

static int count_differences(const req *a, const req *b, int n)
{
    int diff = 0;
    for (int i = 0; i < n; i++)
        if (a[i].out_len != b[i].out_len ||
            memcmp(a[i].out, b[i].out, (size_t)a[i].out_len * 4) != 0) {
            diff++;
            if (exact)
                fprintf(stderr, "  stream %d differs (%d vs %d tokens)\n", i, a[i].out_len,
                        b[i].out_len);
        }
    return diff;
}

/* Streams whose output differs from their solo run: must be none on the
 * CPU; counted on a GPU. */
static int solo_differences(const req *solo_runs, const req *batch_runs, int n)
{
    int diff = count_differences(solo_runs, batch_runs, n);
    solo_equal += n - diff;
    solo_total += n;
    return exact ? diff : 0;
}

static req solo[MAX_STREAMS], mixed[MAX_STREAMS];

static void outputs_equal_alone_and_among_sixteen_others(void)
{
    int32_t prefix[64];
    for (int i = 0; i < 64; i++)
        prefix[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)vocab);
    for (int i = 0; i < 17; i++) {
        /* lengths 1..~200; every third shares a 64-token prefix */
        random_prompt(&solo[i], 1 + (i * 37) % 200 + (i % 3 == 0 ? 64 : 0), prefix,
                      i % 3 == 0 ? 64 : 0);
        solo[i].max_tokens = 8 + i % 9;
        solo[i].sp = i % 2 ? seeded(1000 + (uint64_t)i) : greedy();
    }
    run_solo(solo, 17, 512);
    for (int i = 0; i < 17; i++)
        CHECK_EQ_INT(solo[i].out_len, solo[i].max_tokens);

    /* all together, chunked prefill of 48 rows a step */
    copy_outputs(mixed, solo, 17);
    setup st = {16, 48, 200, 512};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    for (int i = 0; i < 17; i++)
        submit(e, &mixed[i], (uint64_t)i);
    drain(e, mixed, -1, 0);
    CHECK_EQ_INT(solo_differences(solo, mixed, 17), 0);
    int hits = 0;
    for (int i = 0; i < 17; i++)
        hits += mixed[i].cached > 0;
    /* a second round: every prompt is cached now, outputs still equal */
    for (int i = 0; i < 17; i++)
        submit(e, &mixed[i], (uint64_t)i);
    drain(e, mixed, -1, 0);
    CHECK_EQ_INT(solo_differences(solo, mixed, 17), 0);
    int hits2 = 0;
    for (int i = 0; i < 17; i++)
        hits2 += mixed[i].cached > 0;
    printf("  streams with prefix hits: %d in round one, %d in round two\n", hits, hits2);
    CHECK(hits2 >= 14); /* all but prompts under one page */
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    worker_model_close(m);
}

static void outputs_equal_through_preemption(void)
{
    /* 16 streams of one-page prompts that grow to four pages each, in a pool
     * of 20: admission lets all in, decoding runs out of pages */
    for (int i = 0; i < 16; i++) {
        random_prompt(&solo[i], 15, NULL, 0);
        solo[i].max_tokens = 40;
        solo[i].sp = i % 2 ? seeded(50 + (uint64_t)i) : greedy();
    }
    run_solo(solo, 16, 512);
    copy_outputs(mixed, solo, 16);
    setup small = {16, 64, 20, 512};
    worker_model *m = open_model(&small);
    worker_engine *e = open_engine(m, &small);
    for (int i = 0; i < 16; i++)
        submit(e, &mixed[i], (uint64_t)i);
    drain(e, mixed, -1, 0);
    worker_engine_stats es;
    worker_engine_stats_get(e, &es);
    printf("  small pool: %llu preemptions\n", (unsigned long long)es.preemptions);
    CHECK(es.preemptions > 0);
    CHECK_EQ_INT(solo_differences(solo, mixed, 16), 0);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    worker_model_close(m);
}

static void shared_thousand_token_prefix_prefills_only_the_tail(void)
{
    static req r[3];
    int32_t prefix[1000];
    random_tokens(prefix, 1000);
    random_prompt(&r[0], 1040, prefix, 1000);
    random_prompt(&r[1], 1030, prefix, 1000);
    r[0].max_tokens = r[1].max_tokens = 6;
    r[0].sp = r[1].sp = greedy();
    r[2] = r[1];
    setup st = {4, 512, 160, 2048};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    submit(e, &r[0], 0);
    drain(e, r, -1, 0);
    worker_engine_stats before, after;
    worker_engine_stats_get(e, &before);
    submit(e, &r[1], 1);
    drain(e, r, -1, 0);
    worker_engine_stats_get(e, &after);
    uint64_t computed = after.computed_tokens - before.computed_tokens;
    /* 62 full pages (992 tokens) are shared; 38 prompt tokens and 5 fed-back
     * output tokens are computed */
    printf("  second stream: %d cached, %llu rows computed\n", r[1].cached,
           (unsigned long long)computed);
    CHECK_EQ_INT(r[1].cached, 992);
    CHECK_EQ_INT(computed, 1030 - 992 + 5);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    /* cold: a fresh engine computes everything, with the same output */
    e = open_engine(m, &st);
    submit(e, &r[2], 2);
    drain(e, r, -1, 0);
    CHECK_EQ_INT(r[2].cached, 0);
    CHECK(r[1].out_len == 6);
    CHECK(!exact || memcmp(r[1].out, r[2].out, sizeof r[1].out) == 0);
    worker_engine_close(e);
    worker_model_close(m);
}

/* Four streams with one new 1,000-token prefix, submitted together into a
 * pass that has room for all of them: the first computes the prefix, the
 * others wait a pass for it (its blocks are being computed) and then take
 * its 62 full pages from the cache, where all four used to compute them. */
static void streams_admitted_together_compute_a_new_prefix_once(void)
{
    static req r[5];
    int32_t prefix[1000];
    random_tokens(prefix, 1000);
    int total = 0;
    for (int i = 0; i < 4; i++) {
        random_prompt(&r[i], 1010 + 10 * i, prefix, 1000);
        r[i].max_tokens = 4;
        r[i].sp = greedy();
        total += r[i].prompt_len;
    }
    r[4] = r[3];
    setup st = {4, 4096, 400, 2048};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    for (int i = 0; i < 4; i++)
        submit(e, &r[i], (uint64_t)i);
    drain(e, r, -1, 0);
    worker_engine_stats stats;
    worker_engine_stats_get(e, &stats);
    printf("  cached %d %d %d %d; %llu rows computed, %llu admissions put off\n", r[0].cached,
           r[1].cached, r[2].cached, r[3].cached, (unsigned long long)stats.computed_tokens,
           (unsigned long long)stats.deferred);
    CHECK_EQ_INT(r[0].cached, 0);
    for (int i = 1; i < 4; i++)
        CHECK_EQ_INT(r[i].cached, 992);
    CHECK_EQ_INT(stats.computed_tokens, total - 3 * 992 + 4 * 3);
    CHECK(stats.deferred >= 3);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    /* the same output as alone on a cold engine */
    e = open_engine(m, &st);
    submit(e, &r[4], 4);
    drain(e, r, -1, 0);
    CHECK_EQ_INT(r[4].cached, 0);
    CHECK(r[3].out_len == 4 && r[4].out_len == 4);
    CHECK(!exact || memcmp(r[3].out, r[4].out, sizeof r[3].out) == 0);
    worker_engine_close(e);
    worker_model_close(m);
}

static void cancelled_stream_returns_its_pages(void)
{
    static req r[4];
    for (int i = 0; i < 4; i++) {
        random_prompt(&r[i], 40 + 20 * i, NULL, 0);
        r[i].max_tokens = 30;
        r[i].sp = greedy();
    }
    setup st = {4, 64, 64, 512};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    for (int i = 0; i < 4; i++)
        submit(e, &r[i], (uint64_t)i);
    drain(e, r, 10, 2); /* cancel stream 2 once ten tokens exist */
    CHECK_EQ_INT(r[2].finish, WORKER_FINISH_CANCELLED);
    CHECK(r[2].out_len < 30);
    CHECK_EQ_INT(r[0].finish, WORKER_FINISH_LENGTH);
    CHECK_EQ_INT(r[0].out_len, 30);
    CHECK(all_pages_returned(e));
    /* cancelling a waiting stream and an unknown id */
    submit(e, &r[3], 9);
    CHECK(worker_engine_cancel(e, 9));
    CHECK(!worker_engine_cancel(e, 12345));
    drain(e, r, -1, 0);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    worker_model_close(m);
}

static void admission_refuses_what_can_never_fit(void)
{
    setup st = {4, 64, 8, 256};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    int32_t prompt[300] = {0};
    worker_request wr = {.id = 1, .prompt = prompt, .prompt_len = 200, .max_tokens = 100};
    wr.sampling = greedy();
    shoal_diag diag = {{0}};
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "context length of 256");
    wr.prompt_len = 120; /* 120 + 20 = 140 tokens = 9 pages > 8 */
    wr.max_tokens = 20;
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "the pool has 8");
    wr.prompt_len = 0;
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_INVALID);
    wr.prompt_len = 3;
    prompt[1] = vocab;
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "outside the vocabulary");
    prompt[1] = 0;
    wr.sampling.top_p = 0.0f;
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_INVALID);
    wr.sampling = greedy();
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_OK);
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_ERR_INVALID); /* id in use */
    CHECK_HAS(diag.msg, "in use");
    worker_engine_close(e); /* closing with live streams frees them */
    worker_model_close(m);
}

static void eos_and_stop_ids_end_a_stream(void)
{
    static req r[2];
    random_prompt(&r[0], 17, NULL, 0);
    r[0].max_tokens = 20;
    r[0].sp = greedy();
    run_solo(r, 1, 512);
    CHECK_EQ_INT(r[0].out_len, 20);
    /* stop at the fourth token's id, which the stream reports */
    int32_t stop = r[0].out[3];
    int first = 0;
    while (r[0].out[first] != stop)
        first++;
    setup st = {2, 64, 32, 512};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    worker_request wr = {.id = 1, .prompt = r[0].prompt, .prompt_len = 17, .max_tokens = 20};
    wr.sampling = greedy();
    wr.ignore_eos = true;
    wr.stop_count = 1;
    wr.stop_ids[0] = stop;
    shoal_diag diag;
    r[1] = r[0];
    r[1].out_len = 0;
    CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_OK);
    drain(e, r, -1, 0);
    CHECK_EQ_INT(r[1].out_len, first + 1);
    CHECK_EQ_INT(r[1].finish, WORKER_FINISH_STOP);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    worker_model_close(m);
}

static req again[MAX_STREAMS];

/* The 16 requests of `again` as one batch in a new engine, into dst. */
static void run_again(worker_model *m, const setup *st, req *dst)
{
    worker_engine *e = open_engine(m, st);
    copy_outputs(dst, again, 16);
    for (int i = 0; i < 16; i++)
        submit(e, &dst[i], (uint64_t)i);
    drain(e, dst, -1, 0);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
}

/* `again`: 16 prompts of len0 + step * i tokens, odd ones seeded from
 * seed0 + i, even ones greedy. */
static void fill_again(int len0, int step, int max_tokens, uint64_t seed0)
{
    for (int i = 0; i < 16; i++) {
        random_prompt(&again[i], len0 + step * i, NULL, 0);
        again[i].max_tokens = max_tokens;
        again[i].sp = i % 2 ? seeded(seed0 + (uint64_t)i) : greedy();
    }
}

static void same_batch_gives_same_outputs_run_after_run(void)
{
    fill_again(20, 13, 12, 300);
    setup st = {16, 128, 200, 512};
    worker_model *m = open_model(&st);
    for (int round = 0; round < 2; round++)
        run_again(m, &st, round ? mixed : solo);
    CHECK_EQ_INT(count_differences(solo, mixed, 16), 0);
    worker_model_close(m);
}

/* A warm-up (prompt passes into free pages, a decode round of every size)
 * leaves nothing that changes what a batch gives afterwards; on a GPU its
 * decode rounds are the graphs the batch replays. */
static void a_warmed_up_model_gives_the_same_outputs(void)
{
    fill_again(30, 17, 10, 500);
    setup st = {16, 128, 200, 512};
    for (int round = 0; round < 2; round++) {
        worker_model *m = open_model(&st);
        worker_warmup_stats ws;
        shoal_diag diag = {{0}};
        worker_warmup_mode mode = round ? WORKER_WARMUP_ON : WORKER_WARMUP_OFF;
        CHECK_MSG(worker_warmup_run(m, mode, "test", &ws, &diag) == SHOAL_OK, "%s", diag.msg);
        if (round) {
            CHECK(ws.ran);
            CHECK_EQ_INT(ws.largest_prompt, 128);
            CHECK_EQ_INT(ws.prompt_passes, 4); /* 128, 64, 32, 16 rows */
            /* every size where graphs are recorded, else 1, 2, 4, ... */
            int largest = worker_model_max_logit_rows(m);
            largest = largest < worker_model_max_streams(m) ? largest : worker_model_max_streams(m);
            largest = largest < 128 ? largest : 128;
            int pow2 = 1;
            for (int r = 1; r < largest; r *= 2)
                pow2++;
            /* each size with and without penalties */
            CHECK_EQ_INT(ws.decode_rounds, 2 * (worker_model_graph_rows(m) ? largest : pow2));
        } else {
            CHECK(!ws.ran);
        }
        run_again(m, &st, round ? mixed : solo);
        worker_model_close(m);
    }
    CHECK_EQ_INT(count_differences(solo, mixed, 16), 0);
    /* auto: only where code is loaded on first use (a device backend) */
    worker_model *m = open_model(&st);
    worker_warmup_stats ws;
    shoal_diag diag = {{0}};
    CHECK(worker_warmup_run(m, WORKER_WARMUP_AUTO, "test", &ws, &diag) == SHOAL_OK);
    CHECK(ws.ran == !worker_model_backend(m)->host_memory);
    worker_model_close(m);
}

static req stress_solo[200], stress_mixed[200];

static void two_hundred_streams_through_a_small_pool(void)
{
    int32_t prefix[48];
    for (int i = 0; i < 48; i++)
        prefix[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)vocab);
    for (int i = 0; i < 200; i++) {
        int len = 1 + (int)(common_rng_next(&rng) % 150);
        random_prompt(&stress_solo[i], len, prefix, i % 4 == 0 ? (len < 48 ? len : 48) : 0);
        stress_solo[i].max_tokens = 1 + (int)(common_rng_next(&rng) % 24);
        stress_solo[i].sp = i % 2 ? seeded(7 + (uint64_t)i) : greedy();
    }
    run_solo(stress_solo, 200, 512);
    copy_outputs(stress_mixed, stress_solo, 200);
    /* 32 pages of 16 tokens: room for a few streams at a time */
    setup st = {12, 96, 32, 512};
    worker_model *m = open_model(&st);
    worker_engine *e = open_engine(m, &st);
    for (int i = 0; i < 200; i++)
        submit(e, &stress_mixed[i], (uint64_t)i);
    drain(e, stress_mixed, -1, 0);
    worker_engine_stats es;
    worker_engine_stats_get(e, &es);
    printf("  200 streams: %llu steps, %llu preemptions, %llu cached prompt tokens\n",
           (unsigned long long)es.steps, (unsigned long long)es.preemptions,
           (unsigned long long)es.cached_tokens);
    int finished = 0;
    for (int i = 0; i < 200; i++)
        finished += stress_mixed[i].finish == WORKER_FINISH_LENGTH;
    CHECK_EQ_INT(finished, 200);
    CHECK_EQ_INT(solo_differences(stress_solo, stress_mixed, 200), 0);
    CHECK(all_pages_returned(e));
    worker_engine_close(e);
    worker_model_close(m);
}

int main(void)
{
    if (getenv("SHOAL_TEST_DEVICE"))
        device = getenv("SHOAL_TEST_DEVICE");
    exact = strcmp(device, "cpu") == 0;
    vocab = test_model_vocab("llama3-scaled-bf16");
    printf("model %s\n", MODEL_DIR);
    printf("device %s: outputs must equal solo runs: %s\n", device, exact ? "yes" : "measured");
    TEST_RUN(same_batch_gives_same_outputs_run_after_run);
    TEST_RUN(a_warmed_up_model_gives_the_same_outputs);
    TEST_RUN(outputs_equal_alone_and_among_sixteen_others);
    TEST_RUN(outputs_equal_through_preemption);
    TEST_RUN(shared_thousand_token_prefix_prefills_only_the_tail);
    TEST_RUN(streams_admitted_together_compute_a_new_prefix_once);
    TEST_RUN(cancelled_stream_returns_its_pages);
    TEST_RUN(admission_refuses_what_can_never_fit);
    TEST_RUN(eos_and_stop_ids_end_a_stream);
    TEST_RUN(two_hundred_streams_through_a_small_pool);
    printf("streams equal to their solo run: %d of %d\n", solo_equal, solo_total);
    return TEST_EXIT();
}
