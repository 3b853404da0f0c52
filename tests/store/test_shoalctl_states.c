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
    TEST_RUN(test_states_usage_and_errors_have_their_exit_codes);
    TEST_RUN(test_stores_of_garbage_pages_are_errors_not_crashes);
    return TEST_EXIT();
}
