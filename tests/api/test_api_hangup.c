/* Tests of coordinator_hangup: a peer that closes or half-closes its end of
 * a watched socket is reported once and soon; a removed registration is
 * never reported; slots are bounded and reused. */
#include "../test.h"
#include "coordinator/coordinator_hangup.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static _Atomic int calls[8];

static void on_hangup(void *ctx)
{
    atomic_fetch_add(&calls[(intptr_t)ctx], 1);
}

/* Waits up to ms for calls[i] to reach want. */
static bool wait_for(int i, int want, int ms)
{
    for (int t = 0; t < ms; t++) {
        if (atomic_load(&calls[i]) >= want)
            return true;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&calls[i]) >= want;
}

static void a_peer_that_closes_is_reported_once(void)
{
    coordinator_hangup *h = NULL;
    shoal_diag diag = {{0}};
    CHECK(coordinator_hangup_open(4, &h, &diag) == SHOAL_OK);
    int sv[2], hv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 &&
          socketpair(AF_UNIX, SOCK_STREAM, 0, hv) == 0);
    uint64_t id0, id1;
    CHECK(coordinator_hangup_add(h, sv[0], on_hangup, (void *)(intptr_t)0, &id0) == SHOAL_OK);
    CHECK(coordinator_hangup_add(h, hv[0], on_hangup, (void *)(intptr_t)1, &id1) == SHOAL_OK);
    /* data from the peer is not a hangup */
    CHECK(write(sv[1], "x", 1) == 1);
    CHECK(!wait_for(0, 1, 50));
    close(sv[1]);
    CHECK(wait_for(0, 1, 2000));
    shutdown(hv[1], SHUT_WR); /* a half-close counts */
    CHECK(wait_for(1, 1, 2000));
    CHECK(!wait_for(0, 2, 50)); /* once */
    coordinator_hangup_remove(h, id0);
    coordinator_hangup_remove(h, id1);
    coordinator_hangup_remove(h, id1); /* twice is harmless */
    close(sv[0]);
    close(hv[0]);
    close(hv[1]);
    coordinator_hangup_close(h);
}

static void a_removed_registration_is_never_reported(void)
{
    atomic_store(&calls[2], 0);
    coordinator_hangup *h = NULL;
    shoal_diag diag = {{0}};
    CHECK(coordinator_hangup_open(2, &h, &diag) == SHOAL_OK);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    uint64_t id;
    CHECK(coordinator_hangup_add(h, sv[0], on_hangup, (void *)(intptr_t)2, &id) == SHOAL_OK);
    coordinator_hangup_remove(h, id);
    close(sv[1]);
    CHECK(!wait_for(2, 1, 200));
    close(sv[0]);
    coordinator_hangup_close(h);
}

static void slots_are_bounded_and_reused(void)
{
    coordinator_hangup *h = NULL;
    shoal_diag diag = {{0}};
    CHECK(coordinator_hangup_open(2, &h, &diag) == SHOAL_OK);
    int a[2], b[2], c[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, a) == 0 &&
          socketpair(AF_UNIX, SOCK_STREAM, 0, b) == 0 &&
          socketpair(AF_UNIX, SOCK_STREAM, 0, c) == 0);
    uint64_t ia, ib, ic;
    CHECK(coordinator_hangup_add(h, a[0], on_hangup, (void *)(intptr_t)3, &ia) == SHOAL_OK);
    CHECK(coordinator_hangup_add(h, b[0], on_hangup, (void *)(intptr_t)4, &ib) == SHOAL_OK);
    CHECK(coordinator_hangup_add(h, c[0], on_hangup, (void *)(intptr_t)5, &ic) == SHOAL_ERR_LIMIT);
    coordinator_hangup_remove(h, ia);
    CHECK(coordinator_hangup_add(h, c[0], on_hangup, (void *)(intptr_t)5, &ic) == SHOAL_OK);
    CHECK(ic != ia);                  /* the slot again, a new generation */
    coordinator_hangup_remove(h, ia); /* the old id no longer names anything */
    close(c[1]);
    CHECK(wait_for(5, 1, 2000));
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
    close(c[0]);
    coordinator_hangup_close(h);
}

int main(void)
{
    TEST_RUN(a_peer_that_closes_is_reported_once);
    TEST_RUN(a_removed_registration_is_never_reported);
    TEST_RUN(slots_are_bounded_and_reused);
    return TEST_EXIT();
}
