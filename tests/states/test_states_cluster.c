/* Conversation states through the real cluster (issue #9): a coordinator
 * with a real shoal-worker process on the CPU backend, --learn-conversations
 * and a real LMDB directory under /tmp, and a KV pool so small that every
 * turn's pages are evicted (spilled) before the next turn.
 *
 *   - turns 2 and 3 of a conversation restore their history from LMDB
 *     (counted) and answer exactly as a full recomputation does; after the
 *     whole cluster is stopped and started again, turn 3 is restored from
 *     disk and answers the same (--restore-mode read: every stored block
 *     is read, so the counts are exact);
 *   - with --restore-mode overlap (the default) the worker computes the
 *     head of the history while the tail is read: both parts are used,
 *     and the answer is still exact; a history short enough for the
 *     engine's first chunk, cold on disk, is computed whole, and its pages
 *     are known to be stored (evicted again, none is written twice);
 *   - states of another model fingerprint are never used; a record with a
 *     flipped payload byte, or one resealed under another fingerprint, is
 *     refused, counted and computed while the blocks around it restore;
 *     the turn is still answered correctly, and the page computed for it
 *     is written over the bad record at the stop;
 *   - SIGTERM makes a worker write what it learned before it exits;
 *   - the flags are checked with messages that name them. */
#include "common/common_hash.h"
#include "coordinator/coordinator_cluster.h"
#include "store/store_state.h"
#include "tests/states/conv_test_util.h"
#include "tests/store/store_test_util.h"
#include "tests/stream_test_util.h"
#include "tests/test.h"
#include "tests/test_model.h"
#include "worker/worker_engine.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MODEL test_model_dir("llama3-scaled-bf16")
enum { PT = CU_PT, KV_PAGES = CU_KV_PAGES, GEN = CU_GEN, LEN_MAX = CU_LEN_MAX };

extern char **environ;

/* Blocks an engine computed (and published) for a prompt and GEN tokens:
 * the last token is sampled, never run through the model. */
static int blocks_after(int prompt_len)
{
    return (prompt_len + GEN - 1) / PT;
}

/* ---- the cluster ---- */

static char runtime_dir[64];

/* A cluster on state_dir; restore_mode "read" or "overlap", chunks of at
 * most batch tokens. */
static coordinator_cluster *start_with(const char *state_dir, const char *restore_mode, int batch)
{
    coordinator_cluster_options o;
    cu_cluster_options(&o, MODEL, SHOAL_WORKER_BIN, runtime_dir, state_dir);
    o.max_batch_tokens = batch;
    o.restore_mode = restore_mode;
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static coordinator_cluster *start(const char *state_dir)
{
    return start_with(state_dir, "read", 256);
}

/* Turn t through the cluster: the answer equals the reference; returns the
 * prompt tokens that came from the worker's caches. */
static int turn(coordinator_cluster *c, int t)
{
    int cached;
    CHECK_MSG(cu_turn(c, t, &cached), "turn %d's answer differs from a full recomputation",
              t + 1);
    return cached;
}

/* Turn t, whose prompt must find exactly `cached` tokens in the caches. */
static void turn_expect(coordinator_cluster *c, int t, int cached)
{
    int got = turn(c, t);
    CHECK_MSG(got == cached, "turn %d: %d prompt tokens from the caches, expected %d", t + 1, got,
              cached);
}

/* How many of hashes[0..n) lead and are stored for this model. */
static int stored(const char *dir, const common_hash *hashes, int n)
{
    store_state_options o = {.dir = dir,
                             .spill_bytes = 1ull << 30,
                             .fingerprint = cu_fingerprint,
                             .layout = cu_layout,
                             .queue_slots = 1};
    store_state *s = NULL;
    shoal_diag diag = {{0}};
    int got = -1;
    if (store_state_open(&o, &s, &diag) == SHOAL_OK &&
        store_state_lookup(s, hashes, n, &got, &diag) != SHOAL_OK)
        got = -1;
    if (got < 0)
        fprintf(stderr, "  store: %s\n", diag.msg);
    store_state_close(s);
    return got;
}

/* Waits until the first n blocks of tokens are stored (spills are
 * written off the engine's step, a little later). */
static bool wait_stored(const char *dir, const int32_t *tokens, int n)
{
    common_hash h[LEN_MAX / PT];
    cu_chain(tokens, n, h);
    for (int t = 0; t < 20000; t += 20) {
        if (stored(dir, h, n) == n)
            return true;
        usleep(20000);
    }
    fprintf(stderr, "  %d of %d blocks stored after 20 s\n", stored(dir, h, n), n);
    return false;
}

/* ---- tests ---- */

static void three_turns_restore_from_lmdb_and_after_a_restart(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "conv");
    coordinator_cluster *c = start(dir);
    if (!c)
        return;
    turn_expect(c, 0, 0);
    CHECK(cu_evict_all(c, 0));
    int b1 = blocks_after(cu_conv_len[0]); /* turn 1's blocks, answer included */
    CHECK(wait_stored(dir, cu_conv[1], b1));
    uint64_t before = cu_load(c).restore_tokens;
    /* turn 2: its history comes from LMDB, not from the evicted pages */
    turn_expect(c, 1, b1 * PT);
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens - before, b1 * PT);
    CHECK(cu_evict_all(c, 1));
    int b2 = blocks_after(cu_conv_len[1]);
    CHECK(wait_stored(dir, cu_conv[2], b2));
    before = cu_load(c).restore_tokens;
    turn_expect(c, 2, b2 * PT);
    l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens - before, b2 * PT);
    CHECK(l.states_spilled >= (uint64_t)b2);
    CHECK_EQ_INT(l.states_refused, 0);
    printf("  turn 2 restored %d tokens, turn 3 %d; %llu pages spilled\n", b1 * PT, b2 * PT,
           (unsigned long long)l.states_spilled);
    /* Stop the whole cluster: the worker writes turn 3's pages too. */
    coordinator_cluster_close(c);
    int b3 = (cu_conv_len[2] - 1) / PT; /* all of turn 3's prompt but its last token */
    CHECK(wait_stored(dir, cu_conv[2], b3));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 2, b3 * PT);
    l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, b3 * PT);
    printf("  after a restart turn 3 restored %d of %d prompt tokens\n", b3 * PT, cu_conv_len[2]);
    coordinator_cluster_close(c);
    char text[4096];
    const char *args[] = {"states", "verify", "--state-dir", dir, NULL};
    int rc = tu_shoalctl(text, sizeof text, args);
    CHECK_MSG(rc == 0, "shoalctl states verify: %d: %s", rc, text);
out:
    tu_rmtree(dir);
}

static void refused_states_are_never_used(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "refuse");
    /* States of another model under this conversation's very block hashes,
     * with payloads of noise: a worker must never find them. */
    common_hash other;
    common_hash_bytes("another model", 13, &other);
    common_hash h[LEN_MAX / PT];
    int b1 = blocks_after(cu_conv_len[0]);
    cu_chain(cu_conv[1], b1, h);
    store_state_options so = {
        .dir = dir, .spill_bytes = 1ull << 30, .fingerprint = other, .layout = cu_layout};
    store_state *s = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(store_state_open(&so, &s, &diag) == SHOAL_OK, "%s", diag.msg);
    uint8_t *page = malloc(cu_layout.page_bytes);
    common_hash root;
    common_block_root(&cu_fingerprint, NULL, &root);
    for (int b = 0; s && page && b < b1; b++) {
        tu_page(page, cu_layout.page_bytes, 5, (uint64_t)b);
        CHECK(store_state_put_async(s, &h[b], b ? &h[b - 1] : &root, PT, page, cu_layout.page_bytes) ==
              SHOAL_OK);
    }
    free(page);
    if (s)
        CHECK(store_state_flush(s, 10000) == SHOAL_OK);
    store_state_close(s);

    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 0, 0); /* nothing restored: they are another model's */
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, 0);
    CHECK(cu_evict_all(c, 2));
    CHECK(wait_stored(dir, cu_conv[1], b1));
    coordinator_cluster_close(c);

    /* One flipped payload byte in block 3: it is refused and computed, the
     * blocks before and after it restore (their own checksums hold). */
    CHECK(tu_flip_record_byte(dir, &cu_fingerprint, &h[3], STORE_RECORD_HEADER_BYTES + 100));
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, (b1 - 1) * PT);
    l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, (b1 - 1) * PT);
    CHECK_EQ_INT(l.states_refused, 1);
    coordinator_cluster_close(c);

    /* The stop wrote the page computed for block 3 over its bad record. */
    char text[8192];
    const char *args[] = {"states", "verify", "--state-dir", dir, NULL};
    int rc = tu_shoalctl(text, sizeof text, args);
    CHECK_MSG(rc == 0, "shoalctl states verify after the repair: %d: %s", rc, text);

    /* Block 1 resealed as another model's (its checksum is right): refused
     * the same way; block 3 restores again, and so do the rest of the
     * prompt's blocks, turn 2's own stored at the stop included. */
    CHECK(tu_reseal_with_fingerprint(dir, &cu_fingerprint, &h[1], &other));
    rc = tu_shoalctl(text, sizeof text, args);
    CHECK_MSG(rc == 1, "shoalctl states verify: %d: %s", rc, text);
    CHECK_HAS(text, "fingerprint");
    c = start(dir);
    if (!c)
        goto out;
    int prompt_blocks = (cu_conv_len[1] - 1) / PT;
    turn_expect(c, 1, (prompt_blocks - 1) * PT);
    l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, (prompt_blocks - 1) * PT);
    CHECK_EQ_INT(l.states_refused, 1);
    coordinator_cluster_close(c);
    rc = tu_shoalctl(text, sizeof text, args);
    CHECK_MSG(rc == 0, "shoalctl states verify after the second repair: %d: %s", rc, text);
out:
    tu_rmtree(dir);
}

/* Turn t in overlap mode after its history was evicted and stored: the
 * answer is exact, the restore counter matches usage, and the engine's
 * first chunk (two blocks, claimed at admission) was never read. Returns
 * the restored tokens; *history gets the stored blocks it could use. */
static int overlap_turn(coordinator_cluster *c, const char *dir, int t, int *history)
{
    CHECK(cu_evict_all(c, t));
    int prompt_blocks = (cu_conv_len[t] - 1) / PT;
    common_hash h[LEN_MAX / PT];
    cu_chain(cu_conv[t], prompt_blocks, h);
    CHECK(wait_stored(dir, cu_conv[t], blocks_after(cu_conv_len[t - 1])));
    *history = stored(dir, h, prompt_blocks);
    uint64_t before = cu_load(c).restore_tokens;
    int got = turn(c, t);
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens - before, got);
    CHECK_MSG(got % PT == 0 && got <= (*history - 2) * PT,
              "turn %d restored %d tokens of a %d-block history", t + 1, got, *history);
    return got;
}

/* The default mode: the engine computes from the bottom of the history
 * (two blocks a step here) while the readers come down from the top. That
 * the readers get some blocks depends on the threads being scheduled
 * while the engine computes: a few tries make it certain. */
static void overlap_computes_the_head_and_restores_the_tail(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "overlap");
    coordinator_cluster *c = start_with(dir, "overlap", 2 * PT);
    if (!c)
        goto out;
    turn_expect(c, 0, 0);
    int got = 0, history = 0, tries = 0;
    for (int t = 1; tries < 6 && got < PT; tries++, t = t == 1 ? 2 : 1)
        got = overlap_turn(c, dir, t, &history);
    CHECK_MSG(got >= PT, "no block was restored in %d tries", tries);
    printf("  restored %d of %d history blocks (try %d); the engine computed the rest\n",
           got / PT, history, tries);
    coordinator_cluster_close(c);
out:
    tu_rmtree(dir);
}

/* Drops the store's file from the page cache (its writes synced first);
 * false where the file system keeps it in memory all the same (tmpfs):
 * some page of it is still resident (mincore over a map of it, which reads
 * nothing). */
static bool drop_store_from_cache(const char *dir)
{
    char path[128];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size == 0) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = ((size_t)sb.st_size + page - 1) / page;
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *in = malloc(pages);
    size_t resident = pages;
    if (map != MAP_FAILED && in && mincore(map, (size_t)sb.st_size, in) == 0) {
        resident = 0;
        for (size_t i = 0; i < pages; i++)
            resident += in[i] & 1;
    }
    if (map != MAP_FAILED)
        munmap(map, (size_t)sb.st_size);
    free(in);
    close(fd);
    return resident == 0;
}

/* Overlap mode, a history on disk short enough for the engine's first
 * chunk: computed whole (the disk's first reads would take about as long).
 * Its blocks are in the store all the same, so when they are evicted
 * again none is downloaded and written a second time. */
static void a_history_computed_whole_is_not_written_again(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "whole");
    coordinator_cluster *c = start_with(dir, "overlap", 256);
    if (!c)
        goto out;
    turn_expect(c, 0, 0);
    coordinator_cluster_close(c); /* the worker writes what it learned */
    int history = blocks_after(cu_conv_len[0]);
    common_hash h[LEN_MAX / PT];
    cu_chain(cu_conv[1], history, h);
    CHECK_EQ_INT(stored(dir, h, history), history);
    CHECK(cu_conv_len[1] <= 256);
    if (!drop_store_from_cache(dir)) {
        printf("  skipped: the store's file system keeps it in memory\n");
        goto out;
    }
    c = start_with(dir, "overlap", 256);
    if (!c)
        goto out;
    turn(c, 1);
    shm_load l = cu_settled_load(c);
    CHECK_EQ_INT(l.restore_tokens, 0); /* computed, not read */
    CHECK(cu_evict_all(c, 2));
    uint64_t skipped = cu_settled_load(c).states_skipped - l.states_skipped;
    CHECK_MSG(skipped >= (uint64_t)history,
              "evicting a turn of %d stored history blocks skipped %llu of them", history,
              (unsigned long long)skipped);
    printf("  %d history blocks computed whole; evicted again, %llu pages the store held\n",
           history, (unsigned long long)skipped);
    coordinator_cluster_close(c);
out:
    tu_rmtree(dir);
}

static void sigterm_writes_what_the_worker_learned(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "term");
    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 0, 0); /* its pages stay cached: nothing spilled */
    int b1 = blocks_after(cu_conv_len[0]);
    common_hash h[LEN_MAX / PT];
    cu_chain(cu_conv[1], b1, h);
    int n = stored(dir, h, b1);
    CHECK_EQ_INT(n, 0);
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK(st.worker[0].pid > 0 && kill(st.worker[0].pid, SIGTERM) == 0);
    CHECK(wait_stored(dir, cu_conv[1], b1));
    coordinator_cluster_close(c);
out:
    tu_rmtree(dir);
}

/* A worker the coordinator restarted (after a SIGKILL) writes what it
 * learned when the cluster stops, as one it started first does: it was
 * killed at the stop instead, its states lost, because the supervisor
 * thread that forked it exited first (PR_SET_PDEATHSIG is a thread's). */
static void a_restarted_worker_writes_what_it_learned_at_the_stop(void)
{
    char dir[64];
    tu_tempdir(dir, sizeof dir, "restart");
    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    int first = st.worker[0].pid;
    CHECK(first > 0 && kill(first, SIGKILL) == 0);
    bool back = false;
    for (int t = 0; t < 30000 && !back; t += 20) {
        usleep(20000);
        coordinator_cluster_stats_get(c, &st);
        back = st.worker[0].alive && st.worker[0].pid > 0 && st.worker[0].pid != first;
    }
    CHECK_MSG(back, "worker 0 was not restarted after a SIGKILL");
    turn_expect(c, 0, 0); /* its pages stay cached: nothing spilled */
    int b1 = blocks_after(cu_conv_len[0]);
    common_hash h[LEN_MAX / PT];
    cu_chain(cu_conv[1], b1, h);
    CHECK_EQ_INT(stored(dir, h, b1), 0);
    coordinator_cluster_close(c);
    CHECK_MSG(stored(dir, h, b1) == b1, "%d of %d blocks stored by the restarted worker",
              stored(dir, h, b1), b1);
out:
    tu_rmtree(dir);
}

/* Runs shoal-worker with args; its exit status, stderr into err. */
static int worker_flags(char *err, size_t bytes, const char *const *args)
{
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)SHOAL_WORKER_BIN;
    for (int i = 0; args[i]; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, SHOAL_WORKER_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (got + 1 < bytes && (k = read(fds[0], err + got, bytes - 1 - got)) > 0)
        got += (size_t)k;
    err[got] = '\0';
    close(fds[0]);
    int status = 0;
    if (rc != 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void flags_are_checked_by_name(void)
{
    char err[4096];
    int rc;
    const char *no_dir[] = {
        "--serve", "--connect", "/nonexistent", "--model", MODEL, "--learn-conversations", NULL};
    rc = worker_flags(err, sizeof err, no_dir);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "--learn-conversations needs --state-dir");
    const char *no_learn[] = {"--serve", "--connect",   "/nonexistent", "--model",
                              MODEL,     "--state-dir", "/tmp/x",       NULL};
    rc = worker_flags(err, sizeof err, no_learn);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "--state-dir needs --learn-conversations");
    const char *zero[] = {
        "--serve", "--learn-conversations", "--state-dir", "/tmp/x", "--spill-gib", "0", NULL};
    rc = worker_flags(err, sizeof err, zero);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "--spill-gib '0': expected a number of GiB in (0, 65536]");
    const char *bad_mode[] = {"--serve",       "--learn-conversations", "--state-dir", "/tmp/x",
                              "--restore-mode", "fast",                  NULL};
    rc = worker_flags(err, sizeof err, bad_mode);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "--restore-mode 'fast': expected overlap or read");
    const char *mode_alone[] = {"--serve", "--restore-mode", "read", NULL};
    rc = worker_flags(err, sizeof err, mode_alone);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "--restore-mode needs --learn-conversations");
    const char *offline[] = {
        "--model", MODEL, "--prompt-ids", "1,2", "--learn-conversations", "--state-dir",
        "/tmp/x",  NULL};
    rc = worker_flags(err, sizeof err, offline);
    CHECK_EQ_INT(rc, 2);
    CHECK_HAS(err, "works only when serving");
}

/* A store whose data.mdb was cut short (a disk that filled): the worker
 * used to refuse to start, and every restart met the same store, so the
 * cluster served nothing. Now it serves without learned states (the error
 * in its log names the file and what to do), and the answers are those of
 * a full computation. */
static void a_damaged_store_leaves_the_worker_serving_without_states(void)
{
    char dir[64], path[96];
    tu_tempdir(dir, sizeof dir, "damaged");
    coordinator_cluster *c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 0, 0);
    CHECK(cu_evict_all(c, 0));
    CHECK(wait_stored(dir, cu_conv[1], blocks_after(cu_conv_len[0])));
    coordinator_cluster_close(c);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0);
    c = start(dir);
    if (!c)
        goto out;
    turn_expect(c, 1, 0); /* served, nothing restored */
    CHECK_EQ_INT(cu_settled_load(c).restore_tokens, 0);
    coordinator_cluster_close(c);
out:
    tu_rmtree(dir);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(runtime_dir, sizeof runtime_dir, "/tmp/shoal-states-XXXXXX");
    if (!mkdtemp(runtime_dir))
        return 1;
    cu_open(MODEL, 99);
    TEST_RUN(flags_are_checked_by_name);
    TEST_RUN(three_turns_restore_from_lmdb_and_after_a_restart);
    TEST_RUN(refused_states_are_never_used);
    TEST_RUN(overlap_computes_the_head_and_restores_the_tail);
    TEST_RUN(a_history_computed_whole_is_not_written_again);
    TEST_RUN(sigterm_writes_what_the_worker_learned);
    TEST_RUN(a_restarted_worker_writes_what_it_learned_at_the_stop);
    TEST_RUN(a_damaged_store_leaves_the_worker_serving_without_states);
    cu_close();
    rmdir(runtime_dir);
    return TEST_EXIT();
}
