/* Prefix hits of hybrid models (gated DeltaNet layers) through the engine:
 * the boundaries where it keeps state checkpoints (a prompt's last full
 * page, each turn's end, every checkpoint_interval tokens), hits taken only
 * where pages and a checkpoint meet, checkpoint eviction (its own LRU, and
 * with its page), and that every hit gives the tokens of a cold run, greedy
 * and seeded: on the CPU they must be equal, bit for bit. Planted faults
 * turn it red: a hit that takes the pages but leaves the stream's slot as
 * it was (the KV without its state), and checkpoints kept under the block
 * before theirs (a state of the wrong block).
 *
 * SHOAL_TEST_MODEL picks the fixture (default qwen3next-bf16; CTest runs
 * the Qwen3.5 one too). */
#include "tests/test.h"
#include "tests/test_model.h"
#include "worker/worker_engine.h"

#include "common/common_rng.h"

#include <stdint.h>

#define MODEL_DIR test_model_dir("qwen3next-bf16")
enum { PT = 16, MAX_OUT = 32, MAX_PROMPT = 600 };

static int vocab;
static uint64_t rng = 7;

typedef struct req {
    int32_t prompt[MAX_PROMPT];
    int prompt_len;
    int max_tokens;
    kernels_sample_params sp;
    int32_t out[MAX_OUT];
    int out_len;
    int cached;
} req;

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
    p.top_k = 40;
    p.seed = seed;
    return p;
}

static void random_tokens(int32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)vocab);
}

typedef struct engine_setup {
    int checkpoints;
    int interval;
    int kv_pages;
} engine_setup;

static worker_engine_options options(const engine_setup *st)
{
    worker_engine_options eo = {.max_batch_tokens = 128,
                                .parallel = 4,
                                .max_queued = 64,
                                .max_model_len = 1024,
                                .checkpoints = st->checkpoints,
                                .checkpoint_interval = st->interval};
    return eo;
}

/* Two copies of the model: engines share their model's KV arena, so the
 * cold runs go through their own while an engine on the first holds cached
 * pages. */
static worker_model *model, *cold_model;

static worker_model *open_model(void)
{
    engine_setup widest = {64, 0, 256};
    worker_engine_options eo = options(&widest);
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = MODEL_DIR;
    mo.kv_pages = 256;
    mo.threads = 2;
    worker_engine_size_model(&eo, &mo);
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_model_open(&mo, &m, &diag) == SHOAL_OK, "%s", diag.msg);
    return m;
}

/* An engine over m (one at a time on each model); page pressure comes
 * from long prompts in the model's 256 pages. */
static worker_engine *open_engine_on(worker_model *m, const engine_setup *st)
{
    worker_engine_options eo = options(st);
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_engine_open(m, &eo, &e, &diag) == SHOAL_OK, "%s", diag.msg);
    return e;
}

static worker_engine *open_engine(const engine_setup *st)
{
    return open_engine_on(model, st);
}

/* Runs r to its end on e (alone), recording its tokens and cached count. */
static void run(worker_engine *e, req *r)
{
    worker_request wr = {0};
    wr.id = 1;
    wr.prompt = r->prompt;
    wr.prompt_len = r->prompt_len;
    wr.max_tokens = r->max_tokens;
    wr.sampling = r->sp;
    wr.ignore_eos = true;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_engine_submit(e, &wr, &diag) == SHOAL_OK, "%s", diag.msg);
    r->out_len = 0;
    worker_event *ev = malloc((size_t)worker_engine_events_max(e) * sizeof *ev);
    for (int guard = 0; worker_engine_busy(e) && guard < 10000; guard++) {
        int n;
        CHECK_MSG(worker_engine_step(e, ev, &n, &diag) == SHOAL_OK, "%s", diag.msg);
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0)
                continue;
            if (ev[i].index == 0)
                r->cached = ev[i].cached_tokens;
            if (r->out_len < MAX_OUT)
                r->out[r->out_len++] = ev[i].token;
        }
    }
    free(ev);
    CHECK_EQ_INT(r->out_len, r->max_tokens);
}

/* r's tokens on a fresh engine with no checkpoints (nothing cached). */
static void run_cold(const req *r, req *cold)
{
    *cold = *r;
    engine_setup none = {0, 0, 256};
    worker_engine *e = open_engine_on(cold_model, &none);
    run(e, cold);
    CHECK_EQ_INT(cold->cached, 0);
    worker_engine_close(e);
}

static bool same_tokens(const req *a, const req *b)
{
    return a->out_len == b->out_len &&
           memcmp(a->out, b->out, (size_t)a->out_len * sizeof a->out[0]) == 0;
}

static void check_like_cold(const req *r, const char *what)
{
    req cold;
    run_cold(r, &cold);
    CHECK_MSG(same_tokens(r, &cold), "%s: tokens differ from a cold run", what);
}

static void make(req *r, int len, int max_tokens, kernels_sample_params sp)
{
    r->prompt_len = len;
    r->max_tokens = max_tokens;
    r->sp = sp;
    random_tokens(r->prompt, len);
}

/* Prompts of every length around a page: the second run of each reuses
 * all its full pages but the one holding its last token. */
static void a_repeated_prompt_reuses_all_but_its_last_page(void)
{
    static const int lens[] = {1, 15, 16, 17, 31, 32, 33, 100, 129};
    engine_setup st = {64, 0, 256};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        worker_engine *e = open_engine(&st);
        req first, again;
        make(&first, lens[i], 8, i % 2 ? seeded(11 + i) : greedy());
        run(e, &first);
        again = first;
        run(e, &again);
        int want = (lens[i] - 1) / PT * PT;
        printf("  prompt of %3d: cached %3d of it the second time (want %d)\n", lens[i],
               again.cached, want);
        CHECK_EQ_INT(first.cached, 0);
        CHECK_EQ_INT(again.cached, want);
        CHECK_MSG(same_tokens(&first, &again), "prompt of %d: tokens differ on the hit", lens[i]);
        check_like_cold(&again, "repeated prompt");
        worker_engine_close(e);
    }
}

/* A conversation: each turn's prompt is the last one, its reply and a new
 * message; it starts from the state at the last page boundary the previous
 * turn computed (the reply's). */
static void a_next_turn_starts_at_the_previous_turns_end(void)
{
    engine_setup st = {64, 0, 256};
    worker_engine *e = open_engine(&st);
    req turn;
    make(&turn, 40, 20, greedy());
    for (int t = 0; t < 4; t++) {
        run(e, &turn);
        /* the last token of the reply was sampled, not computed */
        int computed = turn.prompt_len + turn.max_tokens - 1;
        req next = turn;
        memcpy(next.prompt + turn.prompt_len, turn.out, (size_t)turn.out_len * 4);
        next.prompt_len = turn.prompt_len + turn.out_len;
        random_tokens(next.prompt + next.prompt_len, 13);
        next.prompt_len += 13;
        next.sp = t % 2 ? seeded(70 + (uint64_t)t) : greedy();
        run(e, &next);
        printf("  turn %d: %d-token prompt, %d cached (the reply ended at %d)\n", t + 1,
               next.prompt_len, next.cached, computed);
        CHECK_EQ_INT(next.cached, computed / PT * PT);
        check_like_cold(&next, "next turn");
        turn = next;
        turn.max_tokens = 20;
        if (turn.prompt_len + 40 > MAX_PROMPT)
            break;
    }
    worker_engine_close(e);
}

/* Two prompts that share their first 150 tokens and nothing after: with an
 * interval of 64 the second reuses 128 tokens; with none it reuses nothing
 * (the first prompt's checkpoints are at its own end); with checkpoints
 * off, no prompt reuses anything. */
static void a_shared_head_is_reused_up_to_the_interval(void)
{
    static const struct {
        int checkpoints, interval, want;
    } cases[] = {{64, 64, 128}, {64, 32, 128}, {64, 0, 0}, {0, 64, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        engine_setup st = {cases[i].checkpoints, cases[i].interval, 256};
        worker_engine *e = open_engine(&st);
        req a, b;
        make(&a, 300, 6, greedy());
        make(&b, 220, 6, seeded(5));
        memcpy(b.prompt, a.prompt, 150 * sizeof a.prompt[0]);
        run(e, &a);
        run(e, &b);
        worker_engine_stats es;
        worker_engine_stats_get(e, &es);
        printf("  %2d checkpoints every %2d tokens: cached %3d (want %d), %d held\n",
               cases[i].checkpoints, cases[i].interval, b.cached, cases[i].want,
               es.checkpoints.held);
        CHECK_EQ_INT(b.cached, cases[i].want);
        check_like_cold(&b, "shared head");
        worker_engine_close(e);
    }
}

/* One checkpoint slot: a second prompt's checkpoint evicts the first's, so
 * the first prompt again finds its pages but no state and computes it all,
 * with the same tokens. */
static void an_evicted_checkpoint_takes_no_pages(void)
{
    engine_setup st = {1, 0, 256};
    worker_engine *e = open_engine(&st);
    req a, b, again;
    make(&a, 50, 4, greedy());
    make(&b, 60, 4, greedy());
    run(e, &a);
    run(e, &b);
    again = a;
    run(e, &again);
    worker_engine_stats es;
    worker_engine_stats_get(e, &es);
    printf("  one slot: cached %d, %llu evictions, %d held\n", again.cached,
           (unsigned long long)es.checkpoints.evictions, es.checkpoints.held);
    CHECK_EQ_INT(again.cached, 0);
    CHECK(es.checkpoints.evictions >= 1);
    CHECK_EQ_INT(es.checkpoints.held, 1);
    CHECK(same_tokens(&a, &again));
    worker_pages_stats ps;
    worker_pages_stats_get(worker_engine_pages(e), &ps);
    CHECK_EQ_INT(ps.active, 0);
    worker_engine_close(e);
}

/* The pool of 256 pages is filled by ten prompts of 36 pages: the first
 * prompts' pages are evicted, and their checkpoints with them; a repeat of
 * the first prompt then computes everything, the same tokens again. */
static void a_checkpoint_goes_with_its_page(void)
{
    engine_setup st = {64, 0, 256};
    worker_engine *e = open_engine(&st);
    static req r[10];
    for (int i = 0; i < 10; i++) {
        make(&r[i], 560, 2, greedy());
        run(e, &r[i]);
    }
    req again = r[0];
    run(e, &again);
    worker_engine_stats es;
    worker_engine_stats_get(e, &es);
    printf("  full pool: %llu page evictions, %llu checkpoints dropped with them, %d held; "
           "repeat cached %d\n",
           (unsigned long long)es.pages.evictions, (unsigned long long)es.checkpoints.dropped,
           es.checkpoints.held, again.cached);
    CHECK(es.pages.evictions > 0);
    CHECK(es.checkpoints.dropped > 0);
    CHECK_EQ_INT(again.cached, 0);
    CHECK(same_tokens(&r[0], &again));
    worker_engine_close(e);
}

static void the_options_are_checked(void)
{
    static const engine_setup bad[] = {{-1, 0, 256}, {4, 10, 256}, {4, -16, 256}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        worker_engine_options eo = options(&bad[i]);
        worker_engine *e = NULL;
        shoal_diag diag = {{0}};
        CHECK(worker_engine_open(model, &eo, &e, &diag) == SHOAL_ERR_INVALID);
        CHECK(strstr(diag.msg, "checkpoints") != NULL);
        printf("  %s\n", diag.msg);
    }
    /* more checkpoints than the model has slots for */
    engine_setup many = {65, 0, 256};
    worker_engine_options eo = options(&many);
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    CHECK(worker_engine_open(model, &eo, &e, &diag) == SHOAL_ERR_INVALID);
    CHECK(strstr(diag.msg, "state slots") != NULL);
    printf("  %s\n", diag.msg);
}

int main(void)
{
    vocab = test_model_vocab("qwen3next-bf16");
    model = open_model();
    cold_model = open_model();
    if (!model || !cold_model)
        return TEST_EXIT();
    printf("model %s\n", MODEL_DIR);
    TEST_RUN(a_repeated_prompt_reuses_all_but_its_last_page);
    TEST_RUN(a_next_turn_starts_at_the_previous_turns_end);
    TEST_RUN(a_shared_head_is_reused_up_to_the_interval);
    TEST_RUN(an_evicted_checkpoint_takes_no_pages);
    TEST_RUN(a_checkpoint_goes_with_its_page);
    TEST_RUN(the_options_are_checked);
    worker_model_close(model);
    worker_model_close(cold_model);
    return TEST_EXIT();
}
