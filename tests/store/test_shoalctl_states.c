/* shoalctl states against a real store: while a process has it open (a
 * running cluster) and after it closed; exit codes 0 ok, 1 error, 2 usage. */
#include "store/store_state.h"
#include "store_test_util.h"
#include "tests/test.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char out[65536];

static int ctl(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
               const char *a5)
{
    const char *args[] = {a0, a1, a2, a3, a4, a5, NULL};
    return tu_shoalctl(out, sizeof out, args);
}

static void hex(char *buf, uint64_t seed, uint64_t i)
{
    common_hash h = tu_hash(seed, i);
    common_hash_hex(&h, buf);
}

static void put_chain(store_state *s, const store_page_layout *l, uint64_t seed, int n)
{
    uint8_t *page = malloc(l->page_bytes);
    for (int i = 0; i < n; i++) {
        common_hash h = tu_hash(seed, (uint64_t)i);
        common_hash parent = i == 0 ? tu_hash(seed, 1000) : tu_hash(seed, (uint64_t)i - 1);
        tu_page(page, l->page_bytes, seed, (uint64_t)i);
        CHECK_EQ_INT(store_state_put_async(s, &h, &parent, 16, page, l->page_bytes), SHOAL_OK);
    }
    free(page);
}

static void test_states_commands_on_a_running_then_stopped_store(void)
{
    char dir[128], copy[200], a0[65], a2[65], a3[65], b1[65], prefix[13];
    tu_tempdir(dir, sizeof dir, "ctl");
    snprintf(copy, sizeof copy, "%s-copy", dir);
    store_page_layout l = tu_layout(2, 2, 32, 16);
    store_state_options o = tu_options(dir, 16 << 20, 1, l);
    store_state *s = NULL;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_state_open(&o, &s, &d), SHOAL_OK);
    put_chain(s, &l, 200, 4); /* a0 <- a1 <- a2 <- a3 */
    put_chain(s, &l, 201, 2); /* b0 <- b1 */
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    hex(a0, 200, 0);
    hex(a2, 200, 2);
    hex(a3, 200, 3);
    hex(b1, 201, 1);

    /* the store is open in this process: a running worker */
    CHECK_EQ_INT(ctl("states", "list", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "2 chain(s)");
    char a3_16[17], b1_16[17]; /* list shows 16 hex digits of each end */
    snprintf(a3_16, sizeof a3_16, "%.16s", a3);
    snprintf(b1_16, sizeof b1_16, "%.16s", b1);
    CHECK_HAS(out, a3_16);
    CHECK_HAS(out, b1_16);

    memcpy(prefix, a3, 12);
    prefix[12] = '\0';
    CHECK_EQ_INT(ctl("states", "show", prefix, "--state-dir", dir, NULL), 0);
    const char *p0 = strstr(out, a0), *p3 = strstr(out, a3);
    CHECK_MSG(p0 && p3 && p0 < p3, "root first: %s", out);

    CHECK_EQ_INT(ctl("states", "stats", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "records      6");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "checked 6 record(s)");
    CHECK_HAS(out, "0 corrupt, 0 index problem(s)");

    CHECK_EQ_INT(ctl("states", "compact", "--state-dir", dir, NULL, NULL), 1);
    CHECK_HAS(out, "in use");
    CHECK_EQ_INT(ctl("states", "compact", "--to", copy, "--state-dir", dir), 0);
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", copy, NULL, NULL), 0);
    CHECK_HAS(out, "checked 6 record(s)");

    memcpy(prefix, b1, 12);
    CHECK_EQ_INT(ctl("states", "rm", prefix, "--state-dir", dir, NULL), 0);
    CHECK_HAS(out, "removed 2 record(s)");
    CHECK_EQ_INT(ctl("states", "list", "--state-dir", dir, NULL, NULL), 0);
    CHECK(strstr(out, b1_16) == NULL);
    CHECK_HAS(out, "1 chain(s)");
    store_state_close(s);

    /* stopped: a flipped byte is found, named, and removed with its chain's rest */
    common_hash h2 = tu_hash(200, 2);
    CHECK(tu_flip_record_byte(dir, &o.fingerprint, &h2, STORE_RECORD_HEADER_BYTES + 7));
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 1);
    CHECK_HAS(out, "CORRUPT");
    CHECK_HAS(out, a2);
    CHECK_HAS(out, "checksum mismatch");
    CHECK_HAS(out, "rm --corrupt");
    CHECK_EQ_INT(ctl("states", "rm", "--corrupt", "--state-dir", dir, NULL), 0);
    CHECK_HAS(out, "removed 2 record(s)");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "checked 2 record(s)");

    CHECK_EQ_INT(ctl("states", "compact", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "compacted");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "checked 2 record(s)");
    /* the compacted store works for the engine */
    CHECK_EQ_INT(store_state_open(&o, &s, &d), SHOAL_OK);
    uint8_t *page = malloc(l.page_bytes), *want = malloc(l.page_bytes);
    common_hash h0 = tu_hash(200, 0);
    CHECK_EQ_INT(store_state_get(s, &h0, page, l.page_bytes, NULL, &d), SHOAL_OK);
    tu_page(want, l.page_bytes, 200, 0);
    CHECK(memcmp(page, want, l.page_bytes) == 0);
    free(page);
    free(want);
    store_state_close(s);

    CHECK_EQ_INT(ctl("states", "rm", "--all", "--state-dir", dir, NULL), 0);
    CHECK_EQ_INT(ctl("states", "stats", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "records      0");
    CHECK_HAS(out, "removed 6"); /* lifetime counters survive */
    tu_rmtree(dir);
    tu_rmtree(copy);
}

/* The line of out holding needle, copied into line ("" when none). */
static void line_of(char *line, size_t bytes, const char *needle)
{
    line[0] = '\0';
    const char *at = strstr(out, needle);
    if (!at)
        return;
    while (at > out && at[-1] != '\n')
        at--;
    size_t n = strcspn(at, "\n");
    snprintf(line, bytes, "%.*s", (int)n, at);
}

/* list's row of the chain ending at end: its numbers, bytes as printed. */
typedef struct list_row {
    int blocks, checkpoints, parts;
    unsigned long long tokens;
    char bytes[32], state_bytes[32];
} list_row;

static bool list_row_of(const common_hash *end, list_row *r)
{
    char full[65], line[512], b[16], bu[8], sb[16], su[8];
    common_hash_hex(end, full);
    full[16] = '\0';
    line_of(line, sizeof line, full);
    if (sscanf(line, "%*s %*s %d %llu %15s %7s %d %d %15s %7s", &r->blocks, &r->tokens, b, bu,
               &r->checkpoints, &r->parts, sb, su) != 8)
        return false;
    snprintf(r->bytes, sizeof r->bytes, "%s %s", b, bu);
    snprintf(r->state_bytes, sizeof r->state_bytes, "%s %s", sb, su);
    return true;
}

static void check_row(const common_hash *end, int blocks, unsigned long long tokens,
                      const char *bytes, int checkpoints, int parts, const char *state_bytes)
{
    list_row r = {0};
    CHECK_MSG(list_row_of(end, &r), "no row of the chain in:\n%s", out);
    CHECK_EQ_INT(r.blocks, blocks);
    CHECK_EQ_INT((int)r.tokens, (int)tokens);
    CHECK_MSG(strcmp(r.bytes, bytes) == 0, "bytes %s, want %s", r.bytes, bytes);
    CHECK_EQ_INT(r.checkpoints, checkpoints);
    CHECK_EQ_INT(r.parts, parts);
    CHECK_MSG(strcmp(r.state_bytes, state_bytes) == 0, "state bytes %s, want %s", r.state_bytes,
              state_bytes);
}

/* Pages of 8192 bytes (records of 8384) and checkpoints of 2.5 pages, so
 * 3 parts each: one at the end of chain A (a0..a4), one at b0 of chain B
 * (b0 <- b1), which then hangs off the middle of B. Every verb says what
 * the records are; verify finds a part in another part's place (what a
 * reader refuses, so rm --corrupt removes it). */
static void test_states_tell_kv_pages_from_state_checkpoints(void)
{
    char dir[128], prefix[13], line[512], hex_a[3][65], hex_b[3][65];
    tu_tempdir(dir, sizeof dir, "ctl-ckpt");
    store_page_layout l = tu_layout(2, 2, 32, 16);
    store_state_options o = tu_options(dir, 16 << 20, 1, l);
    o.state_bytes = 5 * l.page_bytes / 2;
    store_state *s = NULL;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_state_open(&o, &s, &d), SHOAL_OK);
    CHECK_EQ_INT(store_state_checkpoint_parts(s), 3);
    uint8_t *state = malloc(o.state_bytes), *back = malloc(o.state_bytes);
    tu_page(state, o.state_bytes, 7, 0);
    common_hash a4 = tu_hash(300, 4), b0 = tu_hash(301, 0), b1 = tu_hash(301, 1);
    common_hash pa[3], pb[3];
    for (uint32_t i = 0; i < 3; i++) {
        store_record_part_hash(&a4, i, &pa[i]);
        store_record_part_hash(&b0, i, &pb[i]);
        common_hash_hex(&pa[i], hex_a[i]);
        common_hash_hex(&pb[i], hex_b[i]);
    }
    put_chain(s, &l, 300, 5);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &a4, state, o.state_bytes), SHOAL_OK);
    put_chain(s, &l, 301, 2);
    CHECK_EQ_INT(store_state_put_checkpoint_async(s, &b0, state, o.state_bytes), SHOAL_OK);
    CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
    store_state_close(s);

    /* chains: A ends at a4's last part; B's pages end at b1, its
     * checkpoint's chain (b0 and 3 parts) at b0's last part */
    CHECK_EQ_INT(ctl("states", "list", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "CHECKPOINTS");
    check_row(&pa[2], 5, 80, "65.5 KiB", 1, 3, "24.6 KiB");
    check_row(&pb[2], 1, 16, "32.8 KiB", 1, 3, "24.6 KiB");
    check_row(&b1, 2, 32, "16.4 KiB", 0, 0, "0 B");
    CHECK_HAS(out, "3 chain(s), 8 block(s) along them");
    CHECK_HAS(out, "2 checkpoint(s) in 6 state part(s), 49.1 KiB");

    memcpy(prefix, hex_a[2], 12);
    prefix[12] = '\0';
    CHECK_EQ_INT(ctl("states", "show", prefix, "--state-dir", dir, NULL), 0);
    for (int i = 0; i < 3; i++) {
        char want[16];
        snprintf(want, sizeof want, "state %d/3", i);
        line_of(line, sizeof line, hex_a[i]);
        CHECK_MSG(strstr(line, want) != NULL, "part %d: %s", i, line);
    }
    char a4_hex[65];
    common_hash_hex(&a4, a4_hex);
    line_of(line, sizeof line, a4_hex);
    CHECK_HAS(line, "KV page");
    CHECK_HAS(line, " 1  KV page"); /* its one child: part 0 */

    /* 7 pages and 6 parts of 8384 bytes */
    CHECK_EQ_INT(ctl("states", "stats", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "records      13 (106.4 KiB)");
    CHECK_HAS(out, "KV pages     7 (57.3 KiB)");
    CHECK_HAS(out, "state parts  6 (49.1 KiB) of 2 checkpoint(s)");
    CHECK_HAS(out, "chains       3");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "checked 13 record(s), 106.4 KiB: 7 KV page(s) and 6 state part(s) sound, "
                   "0 corrupt, 0 index problem(s)");

    /* faults a checksum cannot see: B's part 1 holds A's (it names A's
     * part 0 as its parent), A's part 1 holds A's part 2 */
    CHECK(tu_reseal_copy(dir, &o.fingerprint, &pa[1], &pb[1]));
    CHECK(tu_reseal_copy(dir, &o.fingerprint, &pa[2], &pa[1]));
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 1);
    line_of(line, sizeof line, hex_a[1]);
    CHECK_HAS(line, "CORRUPT");
    CHECK_HAS(line, "header says state part 2 of 3; its place in the index is part 1");
    line_of(line, sizeof line, hex_b[1]);
    CHECK_HAS(line, "CORRUPT");
    CHECK_HAS(line, "state part 1 of 3 names another parent than its index entry");
    CHECK(strstr(out, hex_a[2]) == NULL); /* the part after it is where it belongs */
    CHECK_HAS(out, "7 KV page(s) and 4 state part(s) sound, 2 corrupt, 0 index problem(s)");
    CHECK_HAS(out, "rm --corrupt");
    /* the engine refuses what verify names, and reads the rest */
    CHECK_EQ_INT(store_state_open(&o, &s, &d), SHOAL_OK);
    CHECK_EQ_INT(store_state_get_checkpoint(s, &a4, back, o.state_bytes, &d), SHOAL_ERR_FORMAT);
    CHECK_EQ_INT(store_state_get_checkpoint(s, &b0, back, o.state_bytes, &d), SHOAL_ERR_FORMAT);
    store_state_close(s);

    /* each goes with the part after it; the two part 0s stay, checkpoints
     * that kept only their first part (as after eviction) */
    CHECK_EQ_INT(ctl("states", "rm", "--corrupt", "--state-dir", dir, NULL), 0);
    CHECK_HAS(out, "removed 4 record(s)");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "7 KV page(s) and 2 state part(s) sound, 0 corrupt, 0 index problem(s)");
    CHECK_EQ_INT(ctl("states", "list", "--state-dir", dir, NULL, NULL), 0);
    check_row(&pa[0], 5, 80, "49.1 KiB", 1, 1, "8.2 KiB");
    check_row(&pb[0], 1, 16, "16.4 KiB", 1, 1, "8.2 KiB");
    CHECK_EQ_INT(ctl("states", "stats", "--state-dir", dir, NULL, NULL), 0);
    CHECK_HAS(out, "state parts  2 (16.4 KiB) of 2 checkpoint(s)");

    /* a part 0 in a page's place (a1, under the page a0) is in the right
     * place for a part 0, but not under the key a0's part 0 would have */
    common_hash a0 = tu_hash(300, 0), a1 = tu_hash(300, 1);
    char a0_16[65], a1_hex[65];
    common_hash_hex(&a0, a0_16);
    a0_16[16] = '\0'; /* the message names 16 hex digits */
    common_hash_hex(&a1, a1_hex);
    CHECK(tu_reseal_copy(dir, &o.fingerprint, &pb[0], &a1));
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 1);
    line_of(line, sizeof line, a1_hex);
    CHECK_HAS(line, "CORRUPT");
    CHECK_HAS(line, "state part 0 of 3 not keyed as part 0 of block");
    CHECK_HAS(line, a0_16);
    CHECK_HAS(out, "6 KV page(s) and 2 state part(s) sound, 1 corrupt, 0 index problem(s)");
    free(state);
    free(back);
    tu_rmtree(dir);
}

static void test_states_usage_and_errors_have_their_exit_codes(void)
{
    char dir[128];
    tu_tempdir(dir, sizeof dir, "ctl-err");
    CHECK_EQ_INT(ctl("states", NULL, NULL, NULL, NULL, NULL), 2);
    CHECK_EQ_INT(ctl("states", "list", NULL, NULL, NULL, NULL), 2);
    CHECK_HAS(out, "--state-dir");
    CHECK_EQ_INT(ctl("states", "frob", "--state-dir", dir, NULL, NULL), 2);
    CHECK_EQ_INT(ctl("states", "rm", "--state-dir", dir, NULL, NULL), 2);
    CHECK_EQ_INT(ctl("states", "list", "--bogus", "--state-dir", dir, NULL), 2);
    CHECK_EQ_INT(ctl("states", "show", "--state-dir", dir, NULL, NULL), 2);
    CHECK_EQ_INT(ctl("frob", NULL, NULL, NULL, NULL, NULL), 2);
    CHECK_EQ_INT(ctl("states", "--help", NULL, NULL, NULL, NULL), 0);
    /* errors name the file and what to do */
    CHECK_EQ_INT(ctl("states", "list", "--state-dir", "/tmp/shoal-no-such-store", NULL, NULL), 1);
    CHECK_HAS(out, "/tmp/shoal-no-such-store");
    CHECK_HAS(out, "check --state-dir");
    CHECK_EQ_INT(ctl("states", "verify", "--state-dir", dir, NULL, NULL), 1);
    CHECK_HAS(out, "no state store here");
    CHECK_HAS(out, "--learn-conversations");

    store_state_options o = tu_options(dir, 1 << 20, 1, tu_layout(1, 1, 8, 4));
    store_state *s = NULL;
    CHECK_EQ_INT(store_state_open(&o, &s, NULL), SHOAL_OK);
    store_state_close(s);
    CHECK_EQ_INT(ctl("states", "show", "00000000", "--state-dir", dir, NULL), 1);
    CHECK_HAS(out, "no stored block");
    CHECK_EQ_INT(ctl("states", "show", "abc", "--state-dir", dir, NULL), 1);
    CHECK_HAS(out, "8 to 64 hex digits");
    tu_rmtree(dir);
}


/* Every page after the two meta pages overwritten with a pattern: LMDB
 * follows the garbage, and shoalctl died of SIGBUS (exit 135) in some of
 * these stores, in every verb that read them (which ones depends on where
 * the writer put each page). Now every verb ends with exit 1 and a message
 * naming the store: damaged where a read faulted, else what LMDB found.
 * test_store_state plants a fault at a known place. */
static void test_stores_of_garbage_pages_are_errors_not_crashes(void)
{
    for (int pattern = 0; pattern < 4; pattern++) {
        char dir[128], path[200];
        tu_tempdir(dir, sizeof dir, "ctl-damaged");
        store_page_layout l = tu_layout(2, 2, 32, 16);
        store_state_options o = tu_options(dir, 16 << 20, 1, l);
        store_state *s = NULL;
        shoal_diag d = {{0}};
        CHECK_EQ_INT(store_state_open(&o, &s, &d), SHOAL_OK);
        put_chain(s, &l, 200, 40);
        CHECK_EQ_INT(store_state_flush(s, 30000), SHOAL_OK);
        store_state_close(s);
        snprintf(path, sizeof path, "%s/data.mdb", dir);
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size >= 8 * 4096);
        int fd = open(path, O_RDWR);
        unsigned char page[4096];
        for (off_t p = 2; fd >= 0 && p < st.st_size / 4096; p++) {
            CHECK(pread(fd, page, sizeof page, p * 4096) == (ssize_t)sizeof page);
            if (pattern == 0) { /* free space's bounds */
                page[12] = page[13] = 0xff;
                page[14] = page[15] = 0;
            }
            for (int i = 16; pattern == 1 && i < 64; i++) /* node offsets */
                page[i] = 0xee;
            for (int i = pattern == 2 ? 16 : 4096; i < 4096; i++)
                page[i] = (unsigned char)(i * 37);
            for (int i = pattern == 3 ? 0 : 4096; i < 4096; i++)
                page[i] = (unsigned char)(i * 131 + 7);
            CHECK(pwrite(fd, page, sizeof page, p * 4096) == (ssize_t)sizeof page);
        }
        close(fd);
        const char *verbs[] = {"verify", "list", "stats"};
        for (int i = 0; i < 3; i++) {
            int rc = ctl("states", verbs[i], "--state-dir", dir, NULL, NULL);
            CHECK_MSG(rc == 1, "pattern %d, states %s: exit %d (135: SIGBUS)", pattern,
                      verbs[i], rc);
            CHECK_HAS(out, dir);
        }
        /* a worker's open: an error, and the process lives on */
        s = NULL;
        CHECK(store_state_open(&o, &s, &d) != SHOAL_OK && s == NULL);
        tu_rmtree(dir);
    }
}

int main(void)
{
    unsetenv("SHOAL_STATE_DIR");
    TEST_RUN(test_states_commands_on_a_running_then_stopped_store);
    TEST_RUN(test_states_tell_kv_pages_from_state_checkpoints);
    TEST_RUN(test_states_usage_and_errors_have_their_exit_codes);
    TEST_RUN(test_stores_of_garbage_pages_are_errors_not_crashes);
    return TEST_EXIT();
}
