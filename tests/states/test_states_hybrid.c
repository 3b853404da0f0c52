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
#include "tests/states/conv_test_util.h"
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
enum { PT = CU_PT, KV_PAGES = CU_KV_PAGES, GEN = CU_GEN, LEN_MAX = CU_LEN_MAX };

/* Blocks turn t ran through the model (its last token is sampled only):
 * the last one ends at the state checkpoint of its turn's end. */
static int turn_blocks(int t)
{
    return (cu_conv_len[t] + GEN - 1) / PT;
}

/* ---- the cluster ---- */

static char runtime_dir[64];

static coordinator_cluster *start(const char *state_dir)
{
    coordinator_cluster_options o;
    cu_cluster_options(&o, MODEL, SHOAL_WORKER_BIN, runtime_dir, state_dir);
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static void turn_expect(coordinator_cluster *c, int t, int cached)
{
    int got;
    CHECK_MSG(cu_turn(c, t, &got), "turn %d's answer differs from a full recomputation",
              t + 1);
    CHECK_MSG(got == cached, "turn %d: %d prompt tokens from the caches, expected %d", t + 1, got,
              cached);
}

/* Whether the store holds the first n blocks of tokens and the state
 * checkpoint at the last of them, waiting up to 20 s for the writer. */
static bool wait_restorable(const char *dir, const int32_t *tokens, int n)
{
    common_hash h[LEN_MAX / PT];
    cu_chain(tokens, n, h);
    store_state_options o = {.dir = dir,
                             .spill_bytes = 1ull << 30,
                             .fingerprint = cu_fingerprint,
                             .layout = cu_layout,
                             .state_bytes = cu_state_bytes};
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
    cu_chain(tokens, b + 1, h);
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
    CHECK(cu_evict_all(c, 0));
    int b1 = turn_blocks(0);
    CHECK(wait_restorable(dir, cu_conv[1], b1));
    /* turn 2: its history and the state at its end come from LMDB */
    turn_expect(c, 1, b1 * PT);
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, b1 * PT);
    CHECK_EQ_INT(l.states_refused, 0);
    printf("  turn 2 restored %d tokens and a %zu-byte state\n", b1 * PT, cu_state_bytes);
    /* the restored state is this worker's checkpoint now: a prompt that
     * ends just past it takes it and the pages from memory */
    {
        int got;
        ts_stream r;
        CHECK(cu_run(c, cu_conv[1], b1 * PT + 5, 1, &r));
        got = r.cached;
        shm_load again = cu_settled_load(c);
        CHECK_MSG(got == b1 * PT, "a prompt on the restored prefix: %d tokens cached, expected %d",
                  got, b1 * PT);
        CHECK_EQ_INT(again.restore_tokens, b1 * PT); /* none read again */
    }
    /* a stop writes turn 2's pages and checkpoints; a new process restores
     * turn 3 from disk alone */
    coordinator_cluster_close(c);
    int b2 = turn_blocks(1);
    CHECK(wait_restorable(dir, cu_conv[2], b2));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 2, b2 * PT);
    l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, b2 * PT);
    printf("  after a restart turn 3 restored %d of %d prompt tokens\n", b2 * PT, cu_conv_len[2]);
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
    return wait_restorable(dir, cu_conv[1], turn_blocks(0));
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
    int parts = (int)((cu_state_bytes + cu_layout.page_bytes - 1) / cu_layout.page_bytes);
    common_hash last = part_key(cu_conv[1], b1 - 1, parts - 1);
    CHECK(tu_flip_record_byte(dir, &cu_fingerprint, &last, STORE_RECORD_HEADER_BYTES + 5));
    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, 0);
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, 0);
    CHECK_EQ_INT(l.states_refused, 1);
    coordinator_cluster_close(c);

    /* part 1 resealed in part 0's place: a sound record in the wrong place */
    tu_rmtree(dir);
    if (!store_turn_one(dir))
        goto out;
    common_hash p0 = part_key(cu_conv[1], b1 - 1, 0), p1 = part_key(cu_conv[1], b1 - 1, 1);
    CHECK(parts >= 2 && tu_reseal_copy(dir, &cu_fingerprint, &p1, &p0));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, 0);
    l = cu_settled_load(c);
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
                bool same = cu_turn(c, 1, &cached);
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
    cu_open(MODEL, 77);
    CHECK_MSG(cu_state_bytes > 0, "%s is no hybrid model", MODEL);
    TEST_RUN(turns_restore_pages_and_state_from_lmdb_and_after_a_restart);
    TEST_RUN(damaged_checkpoints_are_never_used);
    TEST_RUN(planted_faults_answer_differently);
    cu_close();
    rmdir(runtime_dir);
    return TEST_EXIT();
}
