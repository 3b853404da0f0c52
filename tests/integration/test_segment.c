/* The shared segment across real processes: a live cluster's segment is
 * refused, a dead cluster's is replaced, another layout is refused with
 * what to do, and a process killed while it holds the segment lock leaves
 * a lock the next holder repairs. */
#include "shm/shm_segment.h"
#include "tests/test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char name[32];

static void create_attach_and_refuse_a_second_creator(void)
{
    shm_segment *a = NULL, *b = NULL, *ro = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_segment_create(name, &a, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!a)
        return;
    CHECK(shm_segment_attach(name, false, &b, &diag) == SHOAL_OK);
    CHECK(shm_segment_attach(name, true, &ro, &diag) == SHOAL_OK);
    shm_worker_row *w = shm_segment_worker(b, 3);
    atomic_store(&w->pages_free, 123);
    CHECK_EQ_INT(atomic_load(&shm_segment_worker(ro, 3)->pages_free), 123);
    CHECK_EQ_INT(shm_segment_header_of(ro)->creator_pid, getpid());
    shm_segment *c = NULL;
    CHECK(shm_segment_create(name, &c, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "already runs");
    CHECK(shm_segment_create("bad/name", &c, &diag) == SHOAL_ERR_INVALID);
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
        if (shm_segment_create(name, &s, NULL) != SHOAL_OK)
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
    CHECK_MSG(shm_segment_create(name, &fresh, &diag) == SHOAL_OK, "%s", diag.msg);
    CHECK(fresh && shm_segment_header_of(fresh)->creator_pid == getpid());
    shm_segment_close(fresh);
}

static void another_layout_is_refused(void)
{
    shm_segment *s = NULL, *t = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_create(name, &s, &diag) == SHOAL_OK);
    if (!s)
        return;
    shm_segment_header_of(s)->version = SHM_SEGMENT_VERSION + 1;
    CHECK(shm_segment_attach(name, false, &t, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "layout version");
    CHECK(shm_segment_create(name, &t, &diag) == SHOAL_ERR_FORMAT); /* never replaced */
    CHECK_HAS(diag.msg, "layout version");
    shm_segment_close(s);
    /* an object that is not shoal's at all */
    char path[64];
    snprintf(path, sizeof path, "/shoal.%s", name);
    int fd = shm_open(path, O_CREAT | O_RDWR, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 8192) == 0);
    close(fd);
    CHECK(shm_segment_attach(name, true, &t, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "not a shoal segment");
    CHECK(shm_segment_create(name, &t, &diag) == SHOAL_ERR_FORMAT);
    shm_unlink(path);
}

static void holder_killed_inside_the_lock_leaves_it_repairable(void)
{
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_create(name, &s, &diag) == SHOAL_OK);
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

int main(void)
{
    snprintf(name, sizeof name, "test-%d", (int)getpid());
    TEST_RUN(create_attach_and_refuse_a_second_creator);
    TEST_RUN(segment_of_a_killed_cluster_is_replaced);
    TEST_RUN(another_layout_is_refused);
    TEST_RUN(holder_killed_inside_the_lock_leaves_it_repairable);
    return TEST_EXIT();
}
