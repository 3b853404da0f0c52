/* The shared segment across real processes: a live cluster's segment is
 * refused, a dead cluster's is replaced, another layout is refused with
 * what to do, and a process killed while it holds the segment lock leaves
 * a lock the next holder repairs. */
#include "shm/shm_segment.h"
#include "tests/test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char name[32];
/* small tables, so the repair's full scans are quick */
static const shm_segment_sizes sizes = {.workers = 4, .pages = 256, .streams = 16, .leases = 64};

static void hash_of(int i, common_hash *h)
{
    common_hash_bytes(&i, sizeof i, h);
}

static void create_attach_and_refuse_a_second_creator(void)
{
    shm_segment *a = NULL, *b = NULL, *ro = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_segment_create(name, &sizes, &a, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!a)
        return;
    CHECK(shm_segment_attach(name, false, &b, &diag) == SHOAL_OK);
    CHECK(shm_segment_attach(name, true, &ro, &diag) == SHOAL_OK);
    shm_worker_row *w = shm_segment_worker(b, 3);
    atomic_store(&w->pages_free, 123);
    CHECK_EQ_INT(atomic_load(&shm_segment_worker(ro, 3)->pages_free), 123);
    CHECK_EQ_INT(shm_segment_header_of(ro)->creator_pid, getpid());
    shm_segment *c = NULL;
    CHECK(shm_segment_create(name, &sizes, &c, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "already runs");
    CHECK(shm_segment_create("bad/name", &sizes, &c, &diag) == SHOAL_ERR_INVALID);
    shm_segment_close(ro);
    shm_segment_close(b);
    shm_segment_close(a); /* the creator unlinks */
    CHECK(shm_segment_attach(name, true, &ro, &diag) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "is the cluster");
}

static void segment_of_a_killed_cluster_is_replaced(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        shm_segment *s = NULL;
        if (shm_segment_create(name, &sizes, &s, NULL) != SHOAL_OK)
            _exit(1);
        raise(SIGKILL); /* dies without unlinking */
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_attach(name, true, &s, &diag) == SHOAL_OK); /* it is there */
    CHECK(s && shm_segment_header_of(s)->creator_pid == pid);
    shm_segment_close(s);
    shm_segment *fresh = NULL;
    CHECK_MSG(shm_segment_create(name, &sizes, &fresh, &diag) == SHOAL_OK, "%s", diag.msg);
    CHECK(fresh && shm_segment_header_of(fresh)->creator_pid == getpid());
    shm_segment_close(fresh);
}

/* A cluster killed under another name leaves a segment that the next
 * start (of any name) removes. */
static void stale_segments_of_other_names_are_swept(void)
{
    char other[40];
    snprintf(other, sizeof other, "%s-old", name);
    pid_t pid = fork();
    if (pid == 0) {
        shm_segment *s = NULL;
        if (shm_segment_create(other, &sizes, &s, NULL) != SHOAL_OK)
            _exit(1);
        raise(SIGKILL);
    }
    waitpid(pid, NULL, 0);
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_attach(other, true, &s, &diag) == SHOAL_OK);
    shm_segment_close(s);
    shm_segment *mine = NULL;
    CHECK(shm_segment_create(name, &sizes, &mine, &diag) == SHOAL_OK);
    s = NULL;
    CHECK(shm_segment_attach(other, true, &s, &diag) == SHOAL_ERR_NOT_FOUND);
    shm_segment_close(s);
    shm_segment_close(mine);
}

/* What is not a segment under a segment's name, a FIFO or an empty file
 * (anyone may make them in /dev/shm), is refused at once by name, and a
 * sweep of stale segments passes it by: opening the FIFO hung the
 * coordinator's start for ever (blocked in open, SIGTERM masked). */
static void a_fifo_or_an_empty_file_under_a_segment_name_is_refused_at_once(void)
{
    char fifo[40], empty[40], path[64];
    snprintf(fifo, sizeof fifo, "%s-fifo", name);
    snprintf(empty, sizeof empty, "%s-empty", name);
    snprintf(path, sizeof path, "/dev/shm/shoal.%s", fifo);
    CHECK(mkfifo(path, 0600) == 0);
    snprintf(path, sizeof path, "/dev/shm/shoal.%s", empty);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0);
    close(fd);
    alarm(20); /* a hang fails the test instead of holding ctest */
    const char *names[] = {fifo, empty};
    for (int i = 0; i < 2; i++) {
        shm_segment *s = NULL;
        shoal_diag diag = {{0}};
        CHECK_EQ_INT(shm_segment_attach(names[i], true, &s, &diag), SHOAL_ERR_FORMAT);
        CHECK_HAS(diag.msg, "is not a shoal segment");
        shm_segment_close(s);
    }
    shm_segment *mine = NULL; /* sweeps the stale ones of other names */
    shoal_diag diag = {{0}};
    CHECK(shm_segment_create(name, &sizes, &mine, &diag) == SHOAL_OK);
    shm_segment_close(mine);
    alarm(0);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/dev/shm/shoal.%s", names[i]);
        unlink(path);
    }
}

static void another_layout_is_refused(void)
{
    shm_segment *s = NULL, *t = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_create(name, &sizes, &s, &diag) == SHOAL_OK);
    if (!s)
        return;
    shm_segment_header_of(s)->version = SHM_SEGMENT_VERSION + 1;
    CHECK(shm_segment_attach(name, false, &t, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "layout version");
    CHECK(shm_segment_create(name, &sizes, &t, &diag) == SHOAL_ERR_FORMAT); /* never replaced */
    CHECK_HAS(diag.msg, "layout version");
    shm_segment_header_of(s)->version = SHM_SEGMENT_VERSION;
    /* a table's offset out of place (a crafted header): readers would
     * go past the object (shoalctl did) */
    uint64_t *offsets[] = {&shm_segment_header_of(s)->workers_offset,
                           &shm_segment_header_of(s)->pages_offset,
                           &shm_segment_header_of(s)->index_offset,
                           &shm_segment_header_of(s)->leases_offset};
    for (int i = 0; i < 4; i++) {
        uint64_t was = *offsets[i];
        *offsets[i] = 1ull << 40;
        CHECK_MSG(shm_segment_attach(name, true, &t, &diag) == SHOAL_ERR_FORMAT,
                  "offset %d out of place: attached", i);
        *offsets[i] = was;
    }
    CHECK(shm_segment_attach(name, true, &t, &diag) == SHOAL_OK);
    shm_segment_close(t);
    t = NULL;
    shm_segment_close(s);
    /* an object that is not shoal's at all */
    char path[64];
    snprintf(path, sizeof path, "/shoal.%s", name);
    int fd = shm_open(path, O_CREAT | O_RDWR, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 8192) == 0);
    close(fd);
    CHECK(shm_segment_attach(name, true, &t, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "not a shoal segment");
    CHECK(shm_segment_create(name, &sizes, &t, &diag) == SHOAL_ERR_FORMAT);
    shm_unlink(path);
}

static void holder_killed_inside_the_lock_leaves_it_repairable(void)
{
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_create(name, &sizes, &s, &diag) == SHOAL_OK);
    if (!s)
        return;
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        shm_segment *c = NULL;
        if (shm_segment_attach(name, false, &c, NULL) != SHOAL_OK)
            _exit(1);
        shm_segment_lock(c);
        /* the test hook: stop inside the critical section */
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char x;
    CHECK(read(ready[0], &x, 1) == 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    shm_segment_lock(s); /* EOWNERDEAD: repaired */
    shm_segment_header_of(s)->generation++;
    shm_segment_unlock(s);
    CHECK_EQ_INT(shm_segment_header_of(s)->repairs, 1);
    shm_segment_lock(s); /* and usable afterwards, with no repair */
    shm_segment_unlock(s);
    CHECK_EQ_INT(shm_segment_header_of(s)->repairs, 1);
    close(ready[0]);
    close(ready[1]);
    shm_segment_close(s);
}

/* Publish on two workers, find leads, lease the longest run, refuse to
 * unpublish a leased page, release. */
static void index_and_leases(void)
{
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_segment_create(name, &sizes, &s, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!s)
        return;
    uint64_t e0, e1;
    CHECK(shm_worker_register(s, 0, getpid(), "cpu", 100, 4096, &e0, &diag) == SHOAL_OK);
    CHECK(shm_worker_register(s, 1, getpid(), "cpu", 100, 4096, &e1, &diag) == SHOAL_OK);
    CHECK(shm_worker_register(s, 2, getpid(), "cpu", 300, 4096, &e1, &diag) == SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "--segment-pages");
    common_hash h[6];
    for (int i = 0; i < 6; i++)
        hash_of(i, &h[i]);
    shm_segment_lock(s);
    for (int i = 0; i < 5; i++) /* worker 0 holds blocks 0..4 at pages 10+i */
        shm_index_insert(s, 0, 10 + i, &h[i]);
    for (int i = 0; i < 2; i++) /* worker 1 holds blocks 0..1 */
        shm_index_insert(s, 1, 20 + i, &h[i]);
    shm_segment_unlock(s);
    int32_t lead[4];
    CHECK_EQ_INT(shm_index_leads(s, h, 6, lead), 5);
    CHECK_EQ_INT(lead[0], 5);
    CHECK_EQ_INT(lead[1], 2);
    CHECK_EQ_INT(lead[2], 0);
    /* worker 1 leases from worker 0: all five */
    int32_t pages[8], slots[8];
    shm_lease l = {.pages = pages, .slots = slots};
    shm_lease_chain(s, 1, h, 6, 8, &l);
    CHECK_EQ_INT(l.count, 5);
    CHECK_EQ_INT(l.worker, 0);
    CHECK_EQ_INT(pages[4], 14);
    CHECK_EQ_INT(atomic_load(&shm_segment_pages(s, 0)[12].leases), 1);
    /* at most max pages */
    int32_t p2[2], s2[2];
    shm_lease l2 = {.pages = p2, .slots = s2};
    shm_lease_chain(s, 1, h, 6, 2, &l2);
    CHECK_EQ_INT(l2.count, 2);
    shm_lease_release(s, &l2);
    shm_segment_lock(s);
    CHECK(!shm_index_remove(s, 0, 12)); /* leased: stays */
    shm_segment_unlock(s);
    shm_lease_release(s, &l);
    CHECK_EQ_INT(atomic_load(&shm_segment_pages(s, 0)[12].leases), 0);
    shm_segment_lock(s);
    CHECK(shm_index_remove(s, 0, 12));
    shm_segment_unlock(s);
    CHECK_EQ_INT(shm_index_leads(s, h, 6, lead), 2);
    CHECK_EQ_INT(lead[0], 2);
    /* a worker never leases from itself; a lease from a re-registered
     * owner is let go without touching the new process's rows */
    shm_lease_chain(s, 0, h, 6, 8, &l);
    CHECK_EQ_INT(l.count, 2);
    CHECK_EQ_INT(l.worker, 1);
    CHECK(shm_worker_register(s, 1, getpid(), "cpu", 100, 4096, &e1, &diag) == SHOAL_OK);
    CHECK_EQ_INT(shm_index_leads(s, h, 6, lead), 2); /* worker 1's entries went */
    CHECK_EQ_INT(lead[1], 0);
    shm_lease_release(s, &l);
    int used = 0;
    for (int i = 0; i < sizes.leases; i++)
        used += shm_segment_leases(s)[i].pid != 0;
    CHECK_EQ_INT(used, 0);
    shm_worker_forget(s, 0, SHM_WORKER_DEAD, 9);
    CHECK_EQ_INT(shm_index_leads(s, h, 6, lead), 0);
    CHECK_EQ_INT(atomic_load(&shm_segment_worker(s, 0)->state), SHM_WORKER_DEAD);
    shm_segment_close(s);
}

/* A lessee killed while it holds a lease (outside the lock) and one
 * killed inside the lock both leave a segment whose leases come back. */
static void killed_lessees_are_reclaimed(void)
{
    if (!test_hooks(__func__))
        return;
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_segment_create(name, &sizes, &s, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!s)
        return;
    uint64_t e;
    CHECK(shm_worker_register(s, 0, getpid(), "cpu", 100, 4096, &e, &diag) == SHOAL_OK);
    common_hash h[4];
    shm_segment_lock(s);
    for (int i = 0; i < 4; i++) {
        hash_of(i, &h[i]);
        shm_index_insert(s, 0, i, &h[i]);
    }
    shm_segment_unlock(s);
    for (int inside = 0; inside < 2; inside++) {
        pid_t pid = fork();
        if (pid == 0) {
            shm_segment *c = NULL;
            if (shm_segment_attach(name, false, &c, NULL) != SHOAL_OK)
                _exit(1);
            if (inside)
                setenv("SHOAL_TEST_PAUSE", "lease-locked", 1);
            int32_t pages[4], slots[4];
            shm_lease l = {.pages = pages, .slots = slots};
            shm_lease_chain(c, 1, h, 4, 4, &l);
            raise(SIGSTOP); /* holds the lease */
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status));
        int leased = 0;
        for (int i = 0; i < 4; i++)
            leased += atomic_load(&shm_segment_pages(s, 0)[i].leases);
        CHECK_EQ_INT(leased, inside ? 1 : 4); /* inside: stopped after its first page */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        uint64_t repairs = shm_segment_header_of(s)->repairs;
        shm_segment_lock(s);
        if (!inside)
            CHECK_EQ_INT(shm_lease_reclaim_locked(s), 4);
        shm_segment_unlock(s);
        CHECK_EQ_INT(shm_segment_header_of(s)->repairs, repairs + (uint64_t)inside);
        for (int i = 0; i < 4; i++)
            CHECK_EQ_INT(atomic_load(&shm_segment_pages(s, 0)[i].leases), 0);
        int32_t lead[4];
        CHECK_EQ_INT(shm_index_leads(s, h, 4, lead), 4); /* the index was rebuilt whole */
        shm_segment_lock(s);
        CHECK(shm_index_remove(s, 0, 3)); /* the owner can evict again */
        shm_index_insert(s, 0, 3, &h[3]);
        shm_segment_unlock(s);
    }
    shm_segment_close(s);
}

int main(void)
{
    snprintf(name, sizeof name, "test-%d", (int)getpid());
    TEST_RUN(create_attach_and_refuse_a_second_creator);
    TEST_RUN(segment_of_a_killed_cluster_is_replaced);
    TEST_RUN(stale_segments_of_other_names_are_swept);
    TEST_RUN(a_fifo_or_an_empty_file_under_a_segment_name_is_refused_at_once);
    TEST_RUN(another_layout_is_refused);
    TEST_RUN(holder_killed_inside_the_lock_leaves_it_repairable);
    TEST_RUN(index_and_leases);
    TEST_RUN(killed_lessees_are_reclaimed);
    return TEST_EXIT();
}
