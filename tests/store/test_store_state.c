/* The state store as the engine uses it, on a real LMDB directory under
 * /tmp: round trips, refusals, eviction order, a full map, the writer
 * queue, reader slots of killed processes. */
#include "store/store_admin.h"
#include "store/store_state.h"
#include "store_test_util.h"
#include "tests/test.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *self_exe = "/proc/self/exe";

static store_state *open_store(const store_state_options *o)
{
    store_state *s = NULL;
    shoal_diag d = {{0}};
    shoal_err err = store_state_open(o, &s, &d);
    CHECK_MSG(err == SHOAL_OK, "%s", d.msg);
    return s;
}

/* Puts block i of seed (parent: parent_i, or an unstored root when < 0). */
static shoal_err put_block(store_state *s, const store_page_layout *l, uint64_t seed, uint64_t i,
                           long parent_i, int tokens)
{
    uint8_t *page = malloc(l->page_bytes);
    tu_page(page, l->page_bytes, seed, i);
    common_hash h = tu_hash(seed, i);
    common_hash parent = parent_i < 0 ? tu_hash(seed + 1000, i) : tu_hash(seed, (uint64_t)parent_i);
    shoal_err err = store_state_put_async(s, &h, &parent, tokens, page, l->page_bytes);
    free(page);
    return err;
}

/* get block i of seed: SHOAL_OK only when its bytes are the ones put. */
static shoal_err get_block(store_state *s, const store_page_layout *l, uint64_t seed, uint64_t i,
                           int *tokens, shoal_diag *d)
{
    uint8_t *page = malloc(l->page_bytes), *want = malloc(l->page_bytes);
    common_hash h = tu_hash(seed, i);
    shoal_err err = store_state_get(s, &h, page, l->page_bytes, tokens, d);
    tu_page(want, l->page_bytes, seed, i);
    if (err == SHOAL_OK && memcmp(page, want, l->page_bytes) != 0)
        err = SHOAL_ERR_BROKEN;
    free(page);
    free(want);
    return err;
}

static bool stored(store_state *s, uint64_t seed, uint64_t i)
{
    common_hash h = tu_hash(seed, i);
    int n = -1;
    CHECK_EQ_INT(store_state_lookup(s, &h, 1, &n, NULL), SHOAL_OK);
    return n == 1;
}

static store_state_stats stats_of(store_state *s)
{
    store_state_stats st;
    shoal_diag d = {{0}};
    CHECK_MSG(store_state_stats_get(s, &st, &d) == SHOAL_OK, "%s", d.msg);
    return st;
}

static void test_open_makes_a_private_directory(void)
{
    char dir[128], sub[160], path[200];
    tu_tempdir(dir, sizeof dir, "perm");
    snprintf(sub, sizeof sub, "%s/states", dir);
    store_state_options o = tu_options(sub, 1 << 20, 1, tu_layout(1, 1, 8, 4));
    store_state *s = open_store(&o);
    struct stat st;
    CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
    const char *files[] = {"data.mdb", "lock.mdb", "open.lock"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", sub, files[i]);
        CHECK_MSG(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "%s mode %o", files[i],
                  (unsigned)(st.st_mode & 0777));
    }
    /* one handle per directory per process */
    store_state *again = NULL;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_state_open(&o, &again, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "already open");
    store_state_close(s);
    /* a directory others can read is refused, with the fix named */
    chmod(sub, 0755);
    CHECK_EQ_INT(store_state_open(&o, &again, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "chmod 700");
    CHECK(again == NULL);
    tu_rmtree(dir);
}

/* A new store in a new directory (dir, 128 bytes) holding one chain of 64
 * blocks of seed, open. */
static store_state *open_with_chain(char *dir, const char *name, uint64_t seed,
                                    store_page_layout *l, store_state_options *o)
{
    tu_tempdir(dir, 128, name);
    *l = tu_layout(2, 2, 64, 16);
    *o = tu_options(dir, 64ull << 20, 1, *l);
    store_state *s = open_store(o);
    for (uint64_t i = 0; s && i < 64; i++)
        CHECK_EQ_INT(put_block(s, l, seed, i, (long)i - 1, 16), SHOAL_OK);
    return s;
}

/* A data.mdb cut short (a copy that stopped, a full disk) is refused at
 * open, naming the file and what to do, where the first read of a missing
 * page was a SIGBUS in every worker that restored from it, and in
 * shoalctl states list and verify. A whole file opens. */
static void test_a_data_file_cut_short_is_refused_at_open(void)
{
    char dir[128], path[200];
    store_page_layout l;
    store_state_options o;
    store_state *s = open_with_chain(dir, "cut", 7, &l, &o);
    store_state_close(s);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 64 * 1024);
    s = open_store(&o); /* whole: it opens */
    CHECK(s && stored(s, 7, 63));
    store_state_close(s);
    CHECK(truncate(path, st.st_size / 2) == 0);
    store_state *cut = NULL;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_state_open(&o, &cut, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "data.mdb");
    CHECK_HAS(d.msg, "cut short");
    CHECK(cut == NULL);
    /* meta pages of garbage: damaged, and the message says what to do */
    int fd = open(path, O_WRONLY);
    static unsigned char junk[8192];
    memset(junk, 0xab, sizeof junk);
    CHECK(fd >= 0 && pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
    close(fd);
    CHECK_EQ_INT(store_state_open(&o, &cut, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "the store is damaged");
    CHECK_HAS(d.msg, "shoalctl states verify");
    CHECK(cut == NULL);
    tu_rmtree(dir);
}

static void test_put_get_round_trips_page_sized_payloads(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "rt");
    /* the page of an 8B model (Qwen3-8B: 36 layers, 8 KV heads, 128 dims,
     * 16 tokens, bf16): 2.25 MiB, many LMDB overflow pages */
    store_page_layout l = tu_layout(36, 8, 128, 16);
    store_state_options o = tu_options(dir, 64ull << 20, 1, l);
    store_state *s = open_store(&o);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(put_block(s, &l, 10, (uint64_t)i, i - 1, i == 3 ? 5 : 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    shoal_diag d = {{0}};
    for (int i = 0; i < 4; i++) {
        int tokens = 0;
        CHECK_EQ_INT(get_block(s, &l, 10, (uint64_t)i, &tokens, &d), SHOAL_OK);
        CHECK_EQ_INT(tokens, i == 3 ? 5 : 16);
    }
    CHECK_EQ_INT(get_block(s, &l, 10, 99, NULL, &d), SHOAL_ERR_NOT_FOUND);
    store_state_stats st = stats_of(s);
    CHECK_EQ_INT(st.puts, 4);
    CHECK_EQ_INT(st.writes, 4);
    CHECK_EQ_INT(st.hits, 4);
    CHECK_EQ_INT(st.misses, 1);
    CHECK_EQ_INT(st.records, 4);
    CHECK_EQ_INT(st.bytes, 4 * store_record_bytes(&l));
    /* a block put again is only marked used */
    CHECK_EQ_INT(put_block(s, &l, 10, 0, -1, 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    st = stats_of(s);
    CHECK_EQ_INT(st.duplicates, 1);
    CHECK_EQ_INT(st.records, 4);
    /* bad arguments */
    uint8_t small[16] = {0};
    common_hash h = tu_hash(10, 50);
    CHECK_EQ_INT(store_state_put_async(s, &h, &h, 16, small, sizeof small), SHOAL_ERR_INVALID);
    CHECK_EQ_INT(put_block(s, &l, 10, 50, -1, 0), SHOAL_ERR_INVALID);
    CHECK_EQ_INT(put_block(s, &l, 10, 50, -1, 17), SHOAL_ERR_INVALID);
    CHECK_EQ_INT(store_state_get(s, &h, small, sizeof small, NULL, &d), SHOAL_ERR_INVALID);
    store_state_close(s);

    /* states survive the process's handle */
    s = open_store(&o);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(get_block(s, &l, 10, (uint64_t)i, NULL, &d), SHOAL_OK);
    store_state_close(s);
    tu_rmtree(dir);
}

static void test_lookup_counts_the_leading_stored_blocks(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "lookup");
    store_page_layout l = tu_layout(2, 2, 16, 16);
    store_state_options o = tu_options(dir, 1 << 20, 1, l);
    store_state *s = open_store(&o);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(put_block(s, &l, 20, (uint64_t)i, i - 1, 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    common_hash hs[7];
    for (int i = 0; i < 7; i++)
        hs[i] = tu_hash(20, (uint64_t)i);
    hs[5] = tu_hash(21, 0); /* not stored */
    int n = -1;
    CHECK_EQ_INT(store_state_lookup(s, hs, 7, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 5);
    CHECK_EQ_INT(store_state_lookup(s, hs + 5, 2, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(store_state_lookup(s, hs, 0, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(store_state_lookup_keys(s, hs, 7, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 5);
    CHECK_EQ_INT(store_state_lookup_keys(s, hs + 5, 2, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 0);
    /* residency: records found are counted, a missing one is not, and a
     * record just read is in the page cache */
    uint64_t resident = 99, total = 99;
    CHECK_EQ_INT(get_block(s, &l, 20, 2, NULL, NULL), SHOAL_OK);
    CHECK_EQ_INT(store_state_resident(s, hs, 7, &resident, &total, NULL), SHOAL_OK);
    CHECK_EQ_INT(total, 5); /* blocks 0-4; hs[5] and hs[6] are not stored */
    CHECK(resident >= 1 && resident <= total);
    CHECK_EQ_INT(store_state_resident(s, hs + 5, 1, &resident, &total, NULL), SHOAL_OK);
    CHECK_EQ_INT(total, 0);
    CHECK_EQ_INT(resident, 0);
    store_state_close(s);
    tu_rmtree(dir);
}

typedef struct problems {
    int records, index;
    char last[256];
} problems;

static void note_problem(void *ctx, const store_admin_problem *p)
{
    problems *pr = ctx;
    if (p->record)
        pr->records++;
    else
        pr->index++;
    snprintf(pr->last, sizeof pr->last, "%s", p->what);
}

static void test_other_fingerprint_and_flipped_byte_are_refused_and_counted(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "refuse");
    store_page_layout l = tu_layout(2, 2, 32, 16);
    store_state_options o = tu_options(dir, 1 << 22, 1, l);
    store_state *s = open_store(&o);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(put_block(s, &l, 30, (uint64_t)i, i - 1, 16), SHOAL_OK);
    store_state_close(s);

    /* block 1: its header now says another model (checksum resealed, so
     * only the fingerprint is wrong); block 2: one payload bit flipped */
    common_hash other = tu_hash(2, 0), h1 = tu_hash(30, 1), h2 = tu_hash(30, 2);
    CHECK(tu_reseal_with_fingerprint(dir, &o.fingerprint, &h1, &other));
    CHECK(tu_flip_record_byte(dir, &o.fingerprint, &h2, STORE_RECORD_HEADER_BYTES + 100));

    s = open_store(&o);
    shoal_diag d = {{0}};
    CHECK_EQ_INT(get_block(s, &l, 30, 0, NULL, &d), SHOAL_OK);
    CHECK_EQ_INT(get_block(s, &l, 30, 1, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "fingerprint");
    CHECK_EQ_INT(get_block(s, &l, 30, 2, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "checksum");
    CHECK_EQ_INT(get_block(s, &l, 30, 3, NULL, &d), SHOAL_OK);
    store_state_stats st = stats_of(s);
    CHECK_EQ_INT(st.refused, 2);
    CHECK_EQ_INT(st.hits, 2);
    common_hash chain[4];
    for (int i = 0; i < 4; i++)
        chain[i] = tu_hash(30, (uint64_t)i);
    int n = -1;
    CHECK_EQ_INT(store_state_lookup(s, chain, 4, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 1); /* the header of block 1 fails */
    CHECK_EQ_INT(store_state_lookup_keys(s, chain, 4, &n, NULL), SHOAL_OK);
    CHECK_EQ_INT(n, 4); /* keys only: the records are not read */
    store_state_close(s);

    /* the same model with another page layout refuses even good records */
    store_state_options o2 = o;
    o2.layout = tu_layout(2, 2, 16, 32); /* same bytes, other shape */
    s = open_store(&o2);
    CHECK_EQ_INT(get_block(s, &o2.layout, 30, 0, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "page layout");
    CHECK_EQ_INT(stats_of(s).refused, 1);
    store_state_close(s);

    /* another model simply does not see these records */
    store_state_options o3 = tu_options(dir, 1 << 22, 3, l);
    s = open_store(&o3);
    CHECK_EQ_INT(get_block(s, &l, 30, 0, NULL, &d), SHOAL_ERR_NOT_FOUND);
    CHECK_EQ_INT(stats_of(s).refused, 0);
    store_state_close(s);

    /* verify reports both, and nothing else; the counts reached the store */
    store_admin *a = NULL;
    CHECK_EQ_INT(store_admin_open(dir, &a, &d), SHOAL_OK);
    problems pr = {0};
    store_admin_verify_result r;
    CHECK_EQ_INT(store_admin_verify(a, note_problem, &pr, &r, &d), SHOAL_OK);
    CHECK_EQ_INT(r.records, 4);
    CHECK_EQ_INT(r.corrupt, 2);
    CHECK_EQ_INT(r.index_problems, 0);
    CHECK_EQ_INT(pr.records, 2);
    store_admin_stats as;
    CHECK_EQ_INT(store_admin_stats_get(a, &as, &d), SHOAL_OK);
    CHECK_EQ_INT(as.refused, 3);
    CHECK_EQ_INT(as.misses, 1);
    uint64_t removed = 0;
    CHECK_EQ_INT(store_admin_remove_corrupt(a, &removed, &d), SHOAL_OK);
    CHECK_EQ_INT(removed, 3); /* 1 (and 2, 3 after it) */
    CHECK_EQ_INT(store_admin_verify(a, NULL, NULL, &r, &d), SHOAL_OK);
    CHECK_EQ_INT(r.records, 1);
    CHECK_EQ_INT(r.corrupt + r.index_problems, 0);
    store_admin_close(a);
    tu_rmtree(dir);
}

static void test_eviction_keeps_under_the_limit_least_recently_used_first(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "evict");
    store_page_layout l = tu_layout(2, 2, 16, 16);
    uint64_t rec = store_record_bytes(&l);
    store_state_options o = tu_options(dir, 10 * rec, 1, l);
    store_state *s = open_store(&o);
    shoal_diag d = {{0}};
    /* ten separate conversations fill the store */
    for (int i = 0; i < 10; i++)
        CHECK_EQ_INT(put_block(s, &l, 40, (uint64_t)i, -1, 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    CHECK_EQ_INT(stats_of(s).bytes, 10 * rec);
    /* using the oldest makes it the newest */
    CHECK_EQ_INT(get_block(s, &l, 40, 0, NULL, &d), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    for (int i = 10; i < 13; i++) {
        CHECK_EQ_INT(put_block(s, &l, 40, (uint64_t)i, -1, 16), SHOAL_OK);
        CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
        CHECK(stats_of(s).bytes <= 10 * rec);
    }
    CHECK(stored(s, 40, 0));
    CHECK(!stored(s, 40, 1));
    CHECK(!stored(s, 40, 2));
    CHECK(!stored(s, 40, 3));
    for (int i = 4; i < 13; i++)
        CHECK_MSG(stored(s, 40, (uint64_t)i), "block %d", i);
    CHECK_EQ_INT(stats_of(s).evictions, 3);
    store_state_close(s);
    tu_rmtree(dir);

    /* a chain loses its tail first; a prefix goes last */
    tu_tempdir(dir, sizeof dir, "evict-chain");
    o = tu_options(dir, 5 * rec, 1, l);
    s = open_store(&o);
    for (int i = 0; i < 4; i++) /* c0 <- c1 <- c2 <- c3 */
        CHECK_EQ_INT(put_block(s, &l, 41, (uint64_t)i, i - 1, 16), SHOAL_OK);
    CHECK_EQ_INT(put_block(s, &l, 42, 0, -1, 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    for (int i = 1; i < 3; i++) { /* two more conversations: two evictions */
        CHECK_EQ_INT(put_block(s, &l, 42, (uint64_t)i, -1, 16), SHOAL_OK);
        CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    }
    CHECK(stored(s, 41, 0));
    CHECK(stored(s, 41, 1));
    CHECK(!stored(s, 41, 2));
    CHECK(!stored(s, 41, 3));
    CHECK(stored(s, 42, 0) && stored(s, 42, 1) && stored(s, 42, 2));
    store_state_close(s);

    /* the index stayed whole through the evictions */
    store_admin *a = NULL;
    store_admin_verify_result r;
    CHECK_EQ_INT(store_admin_open(dir, &a, &d), SHOAL_OK);
    CHECK_EQ_INT(store_admin_verify(a, NULL, NULL, &r, &d), SHOAL_OK);
    CHECK_EQ_INT(r.records, 5);
    CHECK_EQ_INT(r.corrupt + r.index_problems, 0);
    store_admin_close(a);
    tu_rmtree(dir);
}

/* The record of h is not in the page cache. */
static bool on_disk(store_state *s, const common_hash *h)
{
    uint64_t resident = 1, total = 0;
    CHECK_EQ_INT(store_state_resident(s, h, 1, &resident, &total, NULL), SHOAL_OK);
    return total == 1 && resident == 0;
}

/* Drops data.mdb of dir from the page cache (its pages are clean: commits
 * sync). */
static void drop_cache(const char *dir)
{
    char path[200];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(fdatasync(fd) == 0);
    CHECK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    close(fd);
}

static void test_a_full_map_is_handled_by_evicting_or_growing(void)
{
    char dir[128];
    shoal_diag d = {{0}};
    store_page_layout l = tu_layout(4, 4, 64, 16); /* 64 KiB pages */
    enum { n = 60 };

    /* a map that cannot grow: evictions make room, every write lands */
    tu_tempdir(dir, sizeof dir, "mapfull");
    store_state_options o = tu_options(dir, 1ull << 30, 1, l);
    o.map_bytes = o.map_bytes_max = 1 << 20;
    store_state *s = open_store(&o);
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(put_block(s, &l, 50, (uint64_t)i, -1, 16), SHOAL_OK);
        if (i % 3 == 2)
            CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    }
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    store_state_stats st = stats_of(s);
    CHECK(st.map_full > 0);
    CHECK_EQ_INT(st.map_grows, 0);
    CHECK_EQ_INT(st.write_errors, 0);
    CHECK_EQ_INT(st.writes, n);
    CHECK(st.evictions > 0);
    CHECK(st.bytes < (1 << 20));
    CHECK_EQ_INT(get_block(s, &l, 50, n - 1, NULL, &d), SHOAL_OK);
    store_state_close(s);
    store_admin *a = NULL;
    store_admin_verify_result r;
    CHECK_EQ_INT(store_admin_open(dir, &a, &d), SHOAL_OK);
    CHECK_EQ_INT(store_admin_verify(a, NULL, NULL, &r, &d), SHOAL_OK);
    CHECK_EQ_INT(r.corrupt + r.index_problems, 0);
    store_admin_close(a);
    tu_rmtree(dir);

    /* a map that may grow: it does, and nothing is evicted */
    tu_tempdir(dir, sizeof dir, "mapgrow");
    o = tu_options(dir, 1ull << 30, 1, l);
    o.map_bytes = 1 << 20;
    o.map_bytes_max = 64 << 20;
    s = open_store(&o);
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(put_block(s, &l, 51, (uint64_t)i, -1, 16), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    st = stats_of(s);
    CHECK(st.map_grows > 0);
    CHECK(st.map_bytes > (1 << 20));
    CHECK_EQ_INT(st.evictions, 0);
    CHECK_EQ_INT(st.records, n);
    /* reads past the page cache find the records in the grown map (its
     * address is looked up again after each growth): exact, and direct
     * where the file system has O_DIRECT */
    char path[200];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int probe = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (probe >= 0)
        close(probe);
    common_hash all[n];
    uint64_t resident = 1, total = 0;
    for (int i = 0; i < n; i++)
        all[i] = tu_hash(51, (uint64_t)i);
    /* pages the writer just wrote may take a moment to leave */
    for (int tries = 0; tries < 20 && resident > 0; tries++) {
        drop_cache(dir);
        CHECK_EQ_INT(store_state_resident(s, all, n, &resident, &total, NULL), SHOAL_OK);
        if (resident > 0)
            usleep(50000);
    }
    size_t bytes = store_state_read_bytes(s);
    uint8_t *buf = aligned_alloc(4096, bytes), *want = malloc(l.page_bytes);
    uint64_t on_disk_reads = 0; /* records read while not in the page cache */
    for (int i = 0; i < n; i++) {
        size_t at = 0;
        on_disk_reads += on_disk(s, &all[i]);
        CHECK_EQ_INT(store_state_read(s, &all[i], buf, bytes, &at, NULL, &d), SHOAL_OK);
        tu_page(want, l.page_bytes, 51, (uint64_t)i);
        CHECK(memcmp(buf + at, want, l.page_bytes) == 0);
    }
    free(buf);
    free(want);
    /* each of them direct (a base not looked up again after the growth
     * would copy them from the map, or read other bytes and refuse), and
     * there were some (a page this process maps stays in the cache) */
    if (probe >= 0) {
        CHECK_EQ_INT(stats_of(s).direct_reads, on_disk_reads);
        CHECK_MSG(on_disk_reads > 0, "no record left the page cache");
    }
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(get_block(s, &l, 51, (uint64_t)i, NULL, &d), SHOAL_OK);
    store_state_close(s);
    tu_rmtree(dir);
}

typedef struct putter {
    store_state *s;
    const store_page_layout *l;
    int ok, dropped;
    atomic_bool finished;
} putter;

static void *putter_main(void *arg)
{
    putter *p = arg;
    for (int i = 0; i < 20; i++) {
        shoal_err err = put_block(p->s, p->l, 60, (uint64_t)i, -1, 16);
        p->ok += err == SHOAL_OK;
        p->dropped += err == SHOAL_ERR_LIMIT;
    }
    atomic_store(&p->finished, true);
    return NULL;
}

static void test_full_queue_drops_and_counts_without_blocking(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "queue");
    store_page_layout l = tu_layout(2, 2, 16, 16);
    store_state_options o = tu_options(dir, 1 << 22, 1, l);
    o.queue_slots = 4;
    store_state *s = open_store(&o);
    /* another process holds the environment's write lock: the writer
     * stalls, as behind a slow disk or a busy neighbour */
    int hold = -1;
    pid_t holder = tu_spawn_holder(self_exe, "--hold-writer", dir, &hold);
    CHECK(holder > 0);
    /* the puts run on a thread of their own, so a put that waited for room
     * would fail this test instead of hanging it */
    putter p = {.s = s, .l = &l};
    pthread_t t;
    double t0 = tu_now_ms();
    pthread_create(&t, NULL, putter_main, &p);
    while (!atomic_load(&p.finished) && tu_now_ms() - t0 < 5000)
        usleep(1000);
    double took = tu_now_ms() - t0;
    bool finished = atomic_load(&p.finished);
    CHECK_MSG(finished, "20 puts did not return within 5 s: a put blocked on the full queue");
    if (!finished) {
        close(hold); /* let the writer go, so the puts can end */
        hold = -1;
    }
    pthread_join(t, NULL);
    int ok = p.ok, dropped = p.dropped;
    CHECK_MSG(took < 1000, "20 puts took %.0f ms", took);
    CHECK_EQ_INT(ok, 4);
    CHECK_EQ_INT(dropped, 16);
    store_state_stats st = stats_of(s);
    CHECK_EQ_INT(st.drops, 16);
    CHECK_EQ_INT(st.queue_slots, 4);
    if (hold >= 0) {
        CHECK_EQ_INT(store_state_flush(s, 50), SHOAL_ERR_TIMEOUT);
        CHECK_EQ_INT(st.queued, 4);
        close(hold);
    }
    waitpid(holder, NULL, 0);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    st = stats_of(s);
    CHECK_EQ_INT(st.writes, 4);
    CHECK_EQ_INT(st.queued, 0);
    store_state_close(s);
    /* the drops are in the store's lifetime counters too */
    store_admin *a = NULL;
    shoal_diag d = {{0}};
    store_admin_stats as;
    CHECK_EQ_INT(store_admin_open(dir, &a, &d), SHOAL_OK);
    CHECK_EQ_INT(store_admin_stats_get(a, &as, &d), SHOAL_OK);
    CHECK_EQ_INT(as.drops, 16);
    CHECK_EQ_INT(as.records, 4);
    store_admin_close(a);
    tu_rmtree(dir);
}

static void test_reader_slots_of_a_killed_reader_are_cleared(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "readers");
    store_state_options o = tu_options(dir, 1 << 20, 1, tu_layout(1, 1, 8, 4));
    store_state *s = open_store(&o);
    int hold = -1, cleared = -1;
    pid_t reader = tu_spawn_holder(self_exe, "--hold-reader", dir, &hold);
    CHECK(reader > 0);
    CHECK_EQ_INT(store_state_reader_check(s, &cleared, NULL), SHOAL_OK);
    CHECK_EQ_INT(cleared, 0); /* alive: its slot stays */
    kill(reader, SIGKILL);
    waitpid(reader, NULL, 0);
    close(hold);
    CHECK_EQ_INT(store_state_reader_check(s, &cleared, NULL), SHOAL_OK);
    CHECK_EQ_INT(cleared, 1);
    CHECK_EQ_INT(store_state_reader_check(s, &cleared, NULL), SHOAL_OK);
    CHECK_EQ_INT(cleared, 0);
    store_state_close(s);
    tu_rmtree(dir);
}

static void test_handle_refuses_use_after_fork(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "fork");
    store_page_layout l = tu_layout(1, 1, 8, 4);
    store_state_options o = tu_options(dir, 1 << 20, 1, l);
    store_state *s = open_store(&o);
    pid_t pid = fork();
    if (pid == 0) {
        shoal_err err = put_block(s, &l, 70, 0, -1, 4);
        store_state_close(s); /* leaves the parent's store alone */
        _exit(err == SHOAL_ERR_BROKEN ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ_INT(put_block(s, &l, 70, 1, -1, 4), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    CHECK(stored(s, 70, 1));
    store_state_close(s);
    tu_rmtree(dir);
}

typedef struct reader_ctx {
    store_state *s;
    const store_page_layout *l;
    int seed;
    atomic_int wrong;
    atomic_int hits;
} reader_ctx;

static void *reader_main(void *arg)
{
    reader_ctx *r = arg;
    for (int k = 0; k < 300; k++) {
        shoal_err err =
            get_block(r->s, r->l, (uint64_t)r->seed, (uint64_t)(k * 7 % 80), NULL, NULL);
        if (err == SHOAL_OK)
            atomic_fetch_add(&r->hits, 1);
        else if (err != SHOAL_ERR_NOT_FOUND)
            atomic_fetch_add(&r->wrong, 1);
    }
    return NULL;
}

static void test_gets_from_many_threads_while_the_writer_writes(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "threads");
    store_page_layout l = tu_layout(2, 2, 64, 16);
    store_state_options o = tu_options(dir, 64 << 20, 1, l);
    store_state *s = open_store(&o);
    for (int i = 0; i < 40; i++)
        put_block(s, &l, 80, (uint64_t)i, i - 1, 16);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    reader_ctx r = {.s = s, .l = &l, .seed = 80};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, reader_main, &r);
    for (int i = 40; i < 80; i++)
        put_block(s, &l, 80, (uint64_t)i, i - 1, 16);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_INT(atomic_load(&r.wrong), 0);
    CHECK(atomic_load(&r.hits) >= 4 * 100); /* about half the blocks were there from the start */
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    CHECK_EQ_INT(stats_of(s).records, 80);
    store_state_close(s);
    tu_rmtree(dir);
}

/* store_state_read: a record on the disk is read with O_DIRECT (where the
 * file system has it), one in the page cache is copied from the map, and
 * either way the page comes back exact, refused when it fails its checks. */
static void test_read_goes_past_the_page_cache_for_a_record_on_disk(void)
{
    char dir[128], path[200];
    tu_tempdir(dir, sizeof dir, "direct");
    store_page_layout l = tu_layout(36, 8, 128, 16); /* 8B: 2.25 MiB pages */
    store_state_options o = tu_options(dir, 64ull << 20, 1, l);
    store_state *s = open_store(&o);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(put_block(s, &l, 12, (uint64_t)i, i - 1, i == 3 ? 7 : 16), SHOAL_OK);
    store_state_close(s);
    common_hash h[4];
    for (int i = 0; i < 4; i++)
        h[i] = tu_hash(12, (uint64_t)i);
    CHECK(tu_flip_record_byte(dir, &o.fingerprint, &h[2], STORE_RECORD_HEADER_BYTES + 4096));
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int probe = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    bool direct = probe >= 0;
    if (probe >= 0)
        close(probe);
    else
        printf("# no O_DIRECT on this file system: reads copy from the map\n");
    /* dropped while nothing maps the file (a page this process maps, as
     * the fault-around of a B-tree page may, stays), then opened: with
     * MDB_NORDAHEAD its lookups read their own pages only */
    drop_cache(dir);
    s = open_store(&o);
    uint64_t resident = 9, total = 0;
    for (int tries = 0; tries < 20 && resident > 0; tries++) {
        CHECK_EQ_INT(store_state_resident(s, h, 4, &resident, &total, NULL), SHOAL_OK);
        if (resident > 0) {
            usleep(50000);
            drop_cache(dir);
        }
    }
    CHECK_EQ_INT(total, 4);
    if (resident > 0)
        printf("# %llu of 4 records stayed in the page cache\n", (unsigned long long)resident);

    size_t bytes = store_state_read_bytes(s);
    CHECK(bytes >= store_record_bytes(&l) + 4096 && bytes % 4096 == 0);
    uint8_t *buf = aligned_alloc(4096, bytes), *want = malloc(l.page_bytes);
    shoal_diag d = {{0}};
    size_t at = 0;
    int tokens = 0;
    uint64_t direct_want = 0; /* reads of a record on disk into an aligned buffer */
    /* from the disk, twice (a direct read leaves the page cache as it was) */
    for (int pass = 0; pass < 2; pass++) {
        memset(buf, 0, bytes);
        direct_want += direct && on_disk(s, &h[3]);
        CHECK_EQ_INT(store_state_read(s, &h[3], buf, bytes, &at, &tokens, &d), SHOAL_OK);
        tu_page(want, l.page_bytes, 12, 3);
        CHECK(at + l.page_bytes <= bytes);
        CHECK(memcmp(buf + at, want, l.page_bytes) == 0);
        CHECK_EQ_INT(tokens, 7);
        CHECK_EQ_INT(stats_of(s).direct_reads, direct_want);
    }
    /* a flipped payload bit is refused on the direct path too */
    bool refused_on_disk = on_disk(s, &h[2]);
    CHECK_EQ_INT(store_state_read(s, &h[2], buf, bytes, &at, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "checksum");
    CHECK_EQ_INT(stats_of(s).refused, 1);
    /* an unaligned buffer is copied into from the map */
    bool unaligned_on_disk = on_disk(s, &h[1]);
    CHECK_EQ_INT(store_state_read(s, &h[1], buf + 16, bytes - 16, &at, &tokens, &d), SHOAL_OK);
    tu_page(want, l.page_bytes, 12, 1);
    CHECK(memcmp(buf + 16 + at, want, l.page_bytes) == 0);
    CHECK_EQ_INT(stats_of(s).direct_reads, direct_want);
    /* in the page cache now (get faults it in): copied from the map */
    CHECK_EQ_INT(get_block(s, &l, 12, 0, NULL, &d), SHOAL_OK);
    CHECK(!on_disk(s, &h[0]));
    CHECK_EQ_INT(store_state_read(s, &h[0], buf, bytes, &at, &tokens, &d), SHOAL_OK);
    tu_page(want, l.page_bytes, 12, 0);
    CHECK(memcmp(buf + at, want, l.page_bytes) == 0);
    CHECK_EQ_INT(stats_of(s).direct_reads, direct_want);
    /* the test saw the path it is about: a direct read */
    if (direct)
        CHECK_MSG(direct_want > 0, "block 3 stayed in the page cache: no direct read");
    if (direct && (!refused_on_disk || !unaligned_on_disk))
        printf("# block 2 %s, block 1 %s on disk when read\n", refused_on_disk ? "was" : "not",
               unaligned_on_disk ? "was" : "not");
    /* edges: a buffer short of a record, a block not stored */
    CHECK_EQ_INT(store_state_read(s, &h[0], buf, store_record_bytes(&l) - 1, &at, NULL, &d),
                 SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "record of");
    common_hash none = tu_hash(12, 99);
    CHECK_EQ_INT(store_state_read(s, &none, buf, bytes, &at, NULL, &d), SHOAL_ERR_NOT_FOUND);
    store_state_stats st = stats_of(s);
    CHECK_EQ_INT(st.hits, 5);
    CHECK_EQ_INT(st.misses, 1);
    free(buf);
    free(want);
    store_state_close(s);
    tu_rmtree(dir);
}


/* A data.mdb cut short while a process has it open (a disk that filled, a
 * copy swapped in): LMDB's next read of a page past the new end faults
 * (SIGBUS), which killed the process, a worker at every restart. Now the
 * read returns SHOAL_ERR_FORMAT naming the file and what to do, every
 * later call fails at once the same way, and the process lives on; also
 * for an admin handle's verify. A fault outside the store's map still
 * crashes (not tested: it would end this test). */
static void test_a_file_cut_short_under_an_open_store_is_an_error_not_a_crash(void)
{
    char dir[128], path[200];
    store_page_layout l;
    store_state_options o;
    store_state *s = open_with_chain(dir, "cut-open", 9, &l, &o);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    int tokens = 0;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(get_block(s, &l, 9, 63, &tokens, &d), SHOAL_OK);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    CHECK(truncate(path, 2 * 4096) == 0); /* the two meta pages alone */
    CHECK_EQ_INT(get_block(s, &l, 9, 63, &tokens, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "data.mdb is damaged");
    CHECK_HAS(d.msg, "past the file's end");
    CHECK_HAS(d.msg, "move");
    memset(&d, 0, sizeof d);
    common_hash h = tu_hash(9, 1);
    int stored = -1;
    CHECK_EQ_INT(store_state_lookup(s, &h, 1, &stored, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "data.mdb is damaged");
    store_state_close(s);

    /* an admin handle opened on the whole file, then the file cut */
    tu_rmtree(dir);
    s = open_with_chain(dir, "cut-open-admin", 9, &l, &o);
    store_state_close(s);
    store_admin *a = NULL;
    CHECK_EQ_INT(store_admin_open(dir, &a, &d), SHOAL_OK);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    CHECK(truncate(path, 2 * 4096) == 0);
    store_admin_verify_result r;
    memset(&d, 0, sizeof d);
    CHECK_EQ_INT(store_admin_verify(a, NULL, NULL, &r, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "data.mdb is damaged");
    store_admin_close(a);
    tu_rmtree(dir);
}

/* State checkpoints (hybrid models): parts of page size, all or none;
 * each read checks the part its key names; the last part's presence
 * finds the latest checkpoint; a page and a part are never taken for
 * each other; eviction takes a checkpoint's last part first. */
static void test_state_checkpoints_round_trip_all_or_nothing(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "ckpt");
    store_page_layout l = tu_layout(1, 1, 8, 4); /* 128-byte pages */
    store_state_options o = tu_options(dir, 1 << 20, 1, l);
    o.state_bytes = 3 * l.page_bytes + 40; /* four parts, the last padded */
    o.queue_slots = 6;
    store_state *s = open_store(&o);
    if (!s)
        return;
    CHECK_EQ_INT(store_state_checkpoint_parts(s), 4);
    uint8_t *state = malloc(o.state_bytes), *back = malloc(o.state_bytes);
    tu_page(state, o.state_bytes, 9, 1);
    common_hash block = tu_hash(1, 5), other = tu_hash(1, 6);
    CHECK_EQ_INT(put_block(s, &l, 1, 5, -1, 4), SHOAL_OK);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &block, state, o.state_bytes), SHOAL_OK);
    /* a wrong size; and no room for four parts behind the first five, unless
     * the writer took them already */
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &block, state, o.state_bytes - 1),
                 SHOAL_ERR_INVALID);
    store_state_stats before = stats_of(s);
    shoal_err full = store_state_put_checkpoint_async(s, &other, state, o.state_bytes);
    CHECK(full == SHOAL_OK || full == SHOAL_ERR_LIMIT);
    CHECK_EQ_INT(store_state_flush(s, 5000), SHOAL_OK);
    if (full == SHOAL_ERR_LIMIT)
        CHECK_EQ_INT((int)(stats_of(s).drops - before.drops), 1);
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_state_get_checkpoint(s, &block, back, o.state_bytes, &d), SHOAL_OK);
    CHECK(memcmp(back, state, o.state_bytes) == 0);
    common_hash list[3] = {tu_hash(1, 4), block, tu_hash(1, 7)};
    int last = -2;
    CHECK_EQ_INT(store_state_checkpoint_last(s, list, 3, &last, &d), SHOAL_OK);
    CHECK_EQ_INT(last, 1);
    CHECK_EQ_INT(store_state_checkpoint_last(s, list, 1, &last, &d), SHOAL_OK);
    CHECK_EQ_INT(last, -1);
    /* parts read one by one, each its own */
    size_t rb = store_state_read_bytes(s), at = 0;
    uint8_t *buf = aligned_alloc(4096, (rb + 4095) / 4096 * 4096);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(store_state_read_part(s, &block, i, buf, rb, &at, &d), SHOAL_OK);
        size_t n = i < 3 ? l.page_bytes : 40;
        CHECK(memcmp(buf + at, state + (size_t)i * l.page_bytes, n) == 0);
    }
    CHECK_EQ_INT(store_state_read_part(s, &block, 4, buf, rb, &at, &d), SHOAL_ERR_INVALID);
    /* pages queued into the slots the parts used are pages again */
    for (uint64_t i = 0; i < 8; i++) { /* four at a time: the queue holds six */
        CHECK_EQ_INT(put_block(s, &l, 3, i, i ? (long)i - 1 : -1, 4), SHOAL_OK);
        if (i % 4 == 3)
            CHECK_EQ_INT(store_state_flush(s, 5000), SHOAL_OK);
    }
    for (uint64_t i = 0; i < 8; i++)
        CHECK_EQ_INT(get_block(s, &l, 3, i, NULL, &d), SHOAL_OK);
    /* a page is no part and a part no page */
    common_hash part0;
    store_record_part_hash(&block, 0, &part0);
    CHECK_EQ_INT(store_state_get(s, &part0, buf, rb, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "state part where a KV page belongs");
    store_state_close(s);
    /* part 2 resealed under part 1's key: a valid record, the wrong part */
    common_hash part1, part2;
    store_record_part_hash(&block, 1, &part1);
    store_record_part_hash(&block, 2, &part2);
    CHECK(tu_reseal_copy(dir, &o.fingerprint, &part2, &part1));
    s = open_store(&o);
    CHECK_EQ_INT(store_state_get_checkpoint(s, &block, back, o.state_bytes, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "state part 2 of 4");
    store_state_close(s);
    /* a flipped byte in the last part refuses the whole checkpoint */
    tu_rmtree(dir);
    s = open_store(&o);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &block, state, o.state_bytes), SHOAL_OK);
    store_state_close(s);
    common_hash part3;
    store_record_part_hash(&block, 3, &part3);
    CHECK(tu_flip_record_byte(dir, &o.fingerprint, &part3, STORE_RECORD_HEADER_BYTES + 3));
    s = open_store(&o);
    CHECK_EQ_INT(store_state_get_checkpoint(s, &block, back, o.state_bytes, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "checksum");
    store_state_close(s);
    /* eviction: the last part goes first, and the checkpoint is not found */
    tu_rmtree(dir);
    o.spill_bytes = 5 * store_record_bytes(&l);
    s = open_store(&o);
    CHECK_EQ_INT(put_block(s, &l, 1, 5, -1, 4), SHOAL_OK);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &block, state, o.state_bytes), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 5000), SHOAL_OK);
    CHECK_EQ_INT(store_state_checkpoint_last(s, list, 3, &last, &d), SHOAL_OK);
    CHECK_EQ_INT(last, 1);
    CHECK_EQ_INT(put_block(s, &l, 2, 0, -1, 4), SHOAL_OK); /* a sixth record */
    CHECK_EQ_INT(store_state_flush(s, 5000), SHOAL_OK);
    CHECK_EQ_INT(store_state_checkpoint_last(s, list, 3, &last, &d), SHOAL_OK);
    CHECK_EQ_INT(last, -1);
    CHECK_EQ_INT(store_state_get_checkpoint(s, &block, back, o.state_bytes, &d),
                 SHOAL_ERR_NOT_FOUND);
    CHECK(stored(s, 1, 5)); /* the block stays: its checkpoint was its chain's end */
    store_state_close(s);
    /* a queue of fewer slots than a checkpoint's parts never takes one */
    tu_rmtree(dir);
    o.queue_slots = 3;
    s = open_store(&o);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &block, state, o.state_bytes),
                 SHOAL_ERR_UNSUPPORTED);
    store_state_close(s);
    free(buf);
    free(state);
    free(back);
    tu_rmtree(dir);
}

int main(int argc, char **argv)
{
    tu_holder_main(argc, argv);
    TEST_RUN(test_open_makes_a_private_directory);
    TEST_RUN(test_a_data_file_cut_short_is_refused_at_open);
    TEST_RUN(test_a_file_cut_short_under_an_open_store_is_an_error_not_a_crash);
    TEST_RUN(test_put_get_round_trips_page_sized_payloads);
    TEST_RUN(test_lookup_counts_the_leading_stored_blocks);
    TEST_RUN(test_other_fingerprint_and_flipped_byte_are_refused_and_counted);
    TEST_RUN(test_read_goes_past_the_page_cache_for_a_record_on_disk);
    TEST_RUN(test_eviction_keeps_under_the_limit_least_recently_used_first);
    TEST_RUN(test_a_full_map_is_handled_by_evicting_or_growing);
    TEST_RUN(test_full_queue_drops_and_counts_without_blocking);
    TEST_RUN(test_reader_slots_of_a_killed_reader_are_cleared);
    TEST_RUN(test_handle_refuses_use_after_fork);
    TEST_RUN(test_gets_from_many_threads_while_the_writer_writes);
    TEST_RUN(test_state_checkpoints_round_trip_all_or_nothing);
    return TEST_EXIT();
}
