/* Conversation states of a hybrid model (gated DeltaNet layers) through
 * the real cluster: a coordinator with a real shoal-worker process on the
 * CPU backend, --learn-conversations and a real LMDB directory under /tmp,
 * and a KV pool so small that every turn's pages are evicted before the
 * next turn, their state checkpoints with them.
 *
 *   - a turn's pages and the state checkpoint at their end go to LMDB
 *     together; the next turn restores both and answers exactly as a full
 *     recomputation does; after the whole cluster is stopped and started
 *     again, the next turn is restored from disk the same way;
 *   - a checkpoint with a flipped byte, or one part of it resealed in the
 *     place of another, is refused: the turn takes none of the stored
 *     pages (no KV without its state) and is computed, still exact;
 *   - planted faults in the worker (test builds: SHOAL_TEST_RESTORE_FAULT)
 *     show the comparison can fail: KV restored without its state, or
 *     with the state of an earlier block, answer differently. */
#include "common/common_hash.h"
#include "coordinator/coordinator_cluster.h"
#include "store/store_state.h"
#include "tests/store/store_test_util.h"
#include "tests/stream_test_util.h"
#include "tests/test.h"
#include "tests/test_model.h"
#include "worker/worker_engine.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define MODEL test_model_dir("qwen3next-bf16")
#define VOCAB test_model_vocab("qwen3next-bf16")
enum { PT = 16, KV_PAGES = 24, GEN = 20, LEN_MAX = 400, TURNS = 3 };

/* ---- the reference: each prompt alone in a fresh in-process engine ---- */

static worker_model *ref_model;
static common_hash fingerprint;
static store_page_layout layout;
static size_t state_bytes;

static void reference(const int32_t *prompt, int len, int32_t *out)
{
    worker_engine_options eo = {
        .max_batch_tokens = 256, .parallel = 1, .max_queued = 4, .max_model_len = 1024};
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_engine_open(ref_model, &eo, &e, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!e)
        return;
    worker_request r = {
        .id = 1, .prompt = prompt, .prompt_len = len, .max_tokens = GEN, .ignore_eos = true};
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    CHECK(worker_engine_submit(e, &r, &diag) == SHOAL_OK);
    worker_event ev[8];
    int n = 0;
    while (worker_engine_busy(e)) {
        int k;
        CHECK(worker_engine_step(e, ev, &k, &diag) == SHOAL_OK);
        for (int i = 0; i < k; i++)
            if (ev[i].token >= 0 && n < GEN)
                out[n++] = ev[i].token;
    }
    CHECK_EQ_INT(n, GEN);
    worker_engine_close(e);
}

static void open_reference_model(void)
{
    worker_engine_options eo = {
        .max_batch_tokens = 256, .parallel = 1, .max_queued = 4, .max_model_len = 1024};
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = MODEL;
    mo.kv_pages = 64;
    mo.threads = 1;
    worker_engine_size_model(&eo, &mo);
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_model_open(&mo, &ref_model, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!ref_model)
        exit(1);
    fingerprint = *worker_model_fingerprint(ref_model);
    state_bytes = worker_model_slot_bytes(ref_model);
    CHECK_MSG(state_bytes > 0, "%s is no hybrid model", MODEL);
    const kernels_kv_layout *kv = worker_model_kv_layout(ref_model);
    layout = (store_page_layout){.page_tokens = kv->page_tokens,
                                 .layers = kv->layers,
                                 .kv_heads = kv->kv_heads,
                                 .head_dim = kv->head_dim,
                                 .dtype = kv->dtype,
                                 .page_bytes = kv->page_bytes};
}

/* ---- the conversation: conv[t] is the last prompt, its answer, a new message ---- */

static uint64_t rng = 77;
static int32_t conv[TURNS][LEN_MAX];
static int conv_len[TURNS];
static int32_t answer[TURNS][GEN];
static int32_t filler[4][KV_PAGES * PT];
static const int user_len[TURNS] = {100, 30, 25};

static int32_t next_token(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng >> 33) % VOCAB);
}

static void make_conversation(void)
{
    int len = 0;
    for (int t = 0; t < TURNS; t++) {
        if (t > 0) {
            memcpy(conv[t], conv[t - 1], (size_t)conv_len[t - 1] * 4);
            memcpy(conv[t] + conv_len[t - 1], answer[t - 1], GEN * 4);
            len = conv_len[t - 1] + GEN;
        }
        for (int k = 0; k < user_len[t]; k++)
            conv[t][len++] = next_token();
        conv_len[t] = len;
        reference(conv[t], len, answer[t]);
    }
    for (int f = 0; f < 4; f++)
        for (int k = 0; k < KV_PAGES * PT; k++)
            filler[f][k] = next_token();
}

/* Blocks turn t ran through the model (its last token is sampled only):
 * the last one ends at the state checkpoint of its turn's end. */
static int turn_blocks(int t)
{
    return (conv_len[t] + GEN - 1) / PT;
}

static void chain(const int32_t *tokens, int n, common_hash *out)
{
    common_hash root;
    common_block_root(&fingerprint, NULL, &root);
    for (int b = 0; b < n; b++)
        common_block_hash(b == 0 ? &root : &out[b - 1], tokens + b * PT, PT, &out[b]);
}

/* ---- the cluster ---- */

static char runtime_dir[64];

static coordinator_cluster *start(const char *state_dir)
{
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = MODEL;
    o.workers = "cpu";
    o.runtime_dir = runtime_dir;
    o.worker_path = SHOAL_WORKER_BIN;
    o.threads = 1;
    o.parallel = 4;
    o.kv_pages = KV_PAGES;
    o.max_model_len = 1024;
    o.max_batch_tokens = 256;
    o.heartbeat_ms = 50;
    o.dead_after_ms = 5000; /* generous: CI shares two cores */
    o.start_timeout_ms = 60000;
    o.state_dir = state_dir;
    o.spill_gib = "0.25";
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static bool run(coordinator_cluster *c, const int32_t *prompt, int len, int max_tokens,
                ts_stream *r)
{
    ts_stream_init(r);
    coordinator_stream_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt;
    q.prompt_len = len;
    q.max_tokens = max_tokens;
    q.ignore_eos = true;
    q.sampling.top_p = 1.0f;
    q.sampling.repetition_penalty = 1.0f;
    uint64_t id;
    shoal_diag diag = {{0}};
    if (coordinator_cluster_submit(c, &q, ts_stream_event, r, &id, &diag) != SHOAL_OK) {
        fprintf(stderr, "  submit: %s\n", diag.msg);
        return false;
    }
    for (int t = 0; t < 120000 && !atomic_load(&r->done); t += 5)
        usleep(5000);
    if (!atomic_load(&r->done) || r->finish == COORDINATOR_FINISH_ERROR) {
        fprintf(stderr, "  stream: %s\n", atomic_load(&r->done) ? r->error : "timed out");
        return false;
    }
    return true;
}

static shm_load settled_load(coordinator_cluster *c)
{
    usleep(200000); /* the load of the last step comes with the next report */
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    return st.worker[0].load;
}

/* Turn t through the cluster: whether its answer equals the reference's;
 * *cached gets the prompt tokens that came from the caches. */
static bool turn_matches(coordinator_cluster *c, int t, int *cached)
{
    ts_stream r;
    *cached = -1;
    if (!run(c, conv[t], conv_len[t], GEN, &r) || r.n != GEN)
        return false;
    *cached = r.cached;
    return memcmp(r.tokens, answer[t], sizeof answer[t]) == 0;
}

static void turn_expect(coordinator_cluster *c, int t, int cached)
{
    int got;
    CHECK_MSG(turn_matches(c, t, &got), "turn %d's answer differs from a full recomputation",
              t + 1);
    CHECK_MSG(got == cached, "turn %d: %d prompt tokens from the caches, expected %d", t + 1, got,
              cached);
}

/* A long unrelated prompt takes every page: the cached ones are evicted,
 * and spilled with their checkpoints. */
static void evict_all(coordinator_cluster *c, int f)
{
    ts_stream r;
    CHECK(run(c, filler[f], KV_PAGES * PT - 8, 1, &r));
}

/* Whether the store holds the first n blocks of tokens and the state
 * checkpoint at the last of them, waiting up to 20 s for the writer. */
static bool wait_restorable(const char *dir, const int32_t *tokens, int n)
{
    common_hash h[LEN_MAX / PT];
    chain(tokens, n, h);
    store_state_options o = {.dir = dir,
                             .spill_bytes = 1ull << 30,
                             .fingerprint = fingerprint,
                             .layout = layout,
                             .state_bytes = state_bytes};
    int pages = -1, last = -2;
    for (int t = 0; t < 20000; t += 20) {
        store_state *s = NULL;
        shoal_diag diag = {{0}};
        if (store_state_open(&o, &s, &diag) == SHOAL_OK &&
            store_state_lookup(s, h, n, &pages, &diag) == SHOAL_OK &&
            store_state_checkpoint_last(s, h, n, &last, &diag) == SHOAL_OK && pages == n &&
            last == n - 1) {
            store_state_close(s);
            return true;
        }
        store_state_close(s);
        usleep(20000);
    }
    fprintf(stderr, "  %d of %d blocks stored, the last checkpoint at block %d\n", pages, n,
            last);
    return false;
}

/* The key of part i of the checkpoint at block b of tokens. */
static common_hash part_key(const int32_t *tokens, int b, int i)
{
    common_hash h[LEN_MAX / PT], part;
    chain(tokens, b + 1, h);
    store_record_part_hash(&h[b], (uint32_t)i, &part);
    return part;
}

/* ---- tests ---- */

static void turns_restore_pages_and_state_from_lmdb_and_after_a_restart(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "hybrid");
    coordinator_cluster *c = start(dir);
    if (!c)
        return;
    turn_expect(c, 0, 0);
    evict_all(c, 0);
    int b1 = turn_blocks(0);
    CHECK(wait_restorable(dir, conv[1], b1));
    /* turn 2: its history and the state at its end come from LMDB */
    turn_expect(c, 1, b1 * PT);
    shm_load l = settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, b1 * PT);
    CHECK_EQ_INT(l.states_refused, 0);
    printf("  turn 2 restored %d tokens and a %zu-byte state\n", b1 * PT, state_bytes);
    /* a stop writes turn 2's pages and checkpoints; a new process restores
     * turn 3 from disk alone */
    coordinator_cluster_close(c);
    int b2 = turn_blocks(1);
    CHECK(wait_restorable(dir, conv[2], b2));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 2, b2 * PT);
    l = settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, b2 * PT);
    printf("  after a restart turn 3 restored %d of %d prompt tokens\n", b2 * PT, conv_len[2]);
    coordinator_cluster_close(c);
    char text[4096];
    const char *args[] = {"states", "verify", "--state-dir", dir, NULL};
    int rc = tu_shoalctl(text, sizeof text, args);
    CHECK_MSG(rc == 0, "shoalctl states verify: %d: %s", rc, text);
out:
    tu_rmtree(dir);
}

/* A store with turn 1 stopped into it: its pages and its checkpoints. */
static bool store_turn_one(const char *dir)
{
    coordinator_cluster *c = start(dir);
    if (!c)
        return false;
    turn_expect(c, 0, 0);
    coordinator_cluster_close(c);
    return wait_restorable(dir, conv[1], turn_blocks(0));
}

static void damaged_checkpoints_are_never_used(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "hybrid-bad");
    int b1 = turn_blocks(0);
    if (!store_turn_one(dir))
        goto out;
    /* the last part of the checkpoint at turn 1's end, one flipped byte:
     * every stored page of the chain is there, but without its state none
     * may be used */
    int parts = (int)((state_bytes + layout.page_bytes - 1) / layout.page_bytes);
    common_hash last = part_key(conv[1], b1 - 1, parts - 1);
    CHECK(tu_flip_record_byte(dir, &fingerprint, &last, STORE_RECORD_HEADER_BYTES + 5));
    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, 0);
    shm_load l = settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, 0);
    CHECK_EQ_INT(l.states_refused, 1);
    coordinator_cluster_close(c);

    /* part 1 resealed in part 0's place: a sound record in the wrong place */
    tu_rmtree(dir);
    if (!store_turn_one(dir))
        goto out;
    common_hash p0 = part_key(conv[1], b1 - 1, 0), p1 = part_key(conv[1], b1 - 1, 1);
    CHECK(parts >= 2 && tu_reseal_copy(dir, &fingerprint, &p1, &p0));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, 0);
    l = settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, 0);
    CHECK(l.states_refused >= 1);
    coordinator_cluster_close(c);
out:
    tu_rmtree(dir);
}

/* The planted faults turn the comparison red: a restore that skips the
 * state, or takes the state of an earlier block (turn 1's prompt ends at
 * one), answers unlike a full recomputation. */
static void planted_faults_answer_differently(void)
{
    if (!test_hooks(__func__))
        return;
    static const char *const faults[] = {"no-state", "wrong-block"};
    for (int f = 0; f < 2; f++) {
        char dir[64];
        tu_tempdir(dir, sizeof dir, "hybrid-fault");
        if (store_turn_one(dir)) {
            setenv("SHOAL_TEST_RESTORE_FAULT", faults[f], 1);
            coordinator_cluster *c = start(dir);
            unsetenv("SHOAL_TEST_RESTORE_FAULT");
            int cached = -1;
            if (c) {
                bool same = turn_matches(c, 1, &cached);
                CHECK_MSG(cached == turn_blocks(0) * PT, "fault %s: %d tokens restored",
                          faults[f], cached);
                CHECK_MSG(!same, "fault %s: the answer still equals a full recomputation",
                          faults[f]);
                coordinator_cluster_close(c);
            }
        }
        tu_rmtree(dir);
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(runtime_dir, sizeof runtime_dir, "/tmp/shoal-hstates-XXXXXX");
    if (!mkdtemp(runtime_dir))
        return 1;
    open_reference_model();
    make_conversation();
    TEST_RUN(turns_restore_pages_and_state_from_lmdb_and_after_a_restart);
    TEST_RUN(damaged_checkpoints_are_never_used);
    TEST_RUN(planted_faults_answer_differently);
    worker_model_close(ref_model);
    rmdir(runtime_dir);
    return TEST_EXIT();
}
