/* The checkpoint table of hybrid models (worker_checkpoints.h): the slots
 * it hands out, its LRU order, and which leavings the state store sees
 * (kept checkpoints the store lacks, leaving for room or with their page;
 * never a dropped one). */
#include "tests/test.h"
#include "worker/worker_checkpoints.h"

enum { SEEN_MAX = 16 };

typedef struct seen {
    common_hash hash[SEEN_MAX];
    int slot[SEEN_MAX];
    int n;
} seen;

static void note(void *ctx, const common_hash *hash, int slot)
{
    seen *s = ctx;
    if (s->n < SEEN_MAX) {
        s->hash[s->n] = *hash;
        s->slot[s->n++] = slot;
    }
}

static common_hash h(int i)
{
    common_hash x;
    common_hash_bytes(&i, sizeof i, &x);
    return x;
}

static void check(const worker_checkpoints *c)
{
    shoal_diag d = {{0}};
    CHECK_MSG(worker_checkpoints_check(c, &d), "%s", d.msg);
}

static void test_the_store_sees_kept_checkpoints_as_they_leave(void)
{
    worker_checkpoints *c = NULL;
    CHECK_EQ_INT(worker_checkpoints_open(4, 3, &c), SHOAL_OK);
    seen s = {0};
    worker_checkpoints_on_evict(c, note, &s);
    common_hash a = h(1), b = h(2), x = h(3), y = h(4), z = h(5);
    int sa = worker_checkpoints_add(c, &a, true);
    int sb = worker_checkpoints_add(c, &b, false);
    int sx = worker_checkpoints_add(c, &x, true);
    CHECK(sa >= 4 && sa < 7 && sb >= 4 && sb < 7 && sx >= 4 && sx < 7 && sa != sb && sb != sx);
    CHECK_EQ_INT(worker_checkpoints_add(c, &a, true), -1); /* held already */
    check(c);
    /* full: the oldest (a, kept) leaves for room, its slot still holding it */
    CHECK_EQ_INT(worker_checkpoints_add(c, &y, true), sa);
    CHECK_EQ_INT(s.n, 1);
    CHECK(common_hash_equal(&s.hash[0], &a) && s.slot[0] == sa);
    /* b is not kept: it leaves unseen */
    CHECK_EQ_INT(worker_checkpoints_add(c, &z, true), sb);
    CHECK_EQ_INT(s.n, 1);
    /* x found (used now), then dropped: unseen; y leaves with its page: seen */
    CHECK_EQ_INT(worker_checkpoints_find(c, &x, true), sx);
    worker_checkpoints_drop(c, &x);
    CHECK_EQ_INT(worker_checkpoints_find(c, &x, false), -1);
    CHECK_EQ_INT(s.n, 1);
    worker_checkpoints_evict(c, &y);
    CHECK_EQ_INT(s.n, 2);
    CHECK(common_hash_equal(&s.hash[1], &y));
    /* a stored one leaves unseen, and the shutdown write lists only the rest */
    worker_checkpoints_add(c, &a, true);
    worker_checkpoints_mark_stored(c, &z);
    seen listed = {0};
    CHECK_EQ_INT(worker_checkpoints_each_unstored(c, note, &listed), 1);
    CHECK(common_hash_equal(&listed.hash[0], &a));
    worker_checkpoints_evict(c, &z);
    CHECK_EQ_INT(s.n, 2);
    worker_checkpoints_stats st;
    worker_checkpoints_stats_get(c, &st);
    CHECK_EQ_INT(st.held, 1);
    CHECK_EQ_INT((int)st.evictions, 2);
    CHECK_EQ_INT((int)st.dropped, 3); /* x forgotten, y and z with their pages */
    check(c);
    worker_checkpoints_close(c);
}

int main(void)
{
    TEST_RUN(test_the_store_sees_kept_checkpoints_as_they_leave);
    return TEST_EXIT();
}
