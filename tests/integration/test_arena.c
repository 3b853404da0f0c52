/* Arena export and import across real processes, on the CPU backend (the
 * path a GPU worker takes too, with a memfd for the VMM allocation): a
 * worker's arena is fetched over its socket, mapped, read in place and
 * copied from, and stays readable after its worker is killed; a missing
 * worker is NOT_FOUND at once, a silent one times out, a malformed message
 * is refused, and so is a process of another user. */
#include "kernels/cpu/cpu_backend.h"
#include "shm/shm_arena.h"
#include "tests/test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* An odd page size: pages do not fall on host pages. */
#define PAGE_BYTES (3 * 4096 + 136)
#define PAGES 8

static char cluster[32];

static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char)(((i + seed) * 2654435761u) >> 13);
}

static void fill(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(i, seed);
}

static bool is_pattern(const unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != pattern(i, seed))
            return false;
    return true;
}

static bool is_zero(const unsigned char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i])
            return false;
    return true;
}

static kernels_backend *open_cpu(void)
{
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    if (cpu_backend_open(1, &be, &diag) != SHOAL_OK) {
        fprintf(stderr, "cpu backend: %s\n", diag.msg);
        exit(1);
    }
    return be;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Page `page` of a device arena, downloaded. */
static void read_page(kernels_backend *be, void *arena, int page, unsigned char *out)
{
    CHECK(be->download(be, out, (unsigned char *)arena + (size_t)page * PAGE_BYTES, PAGE_BYTES) ==
          SHOAL_OK);
}

static shm_arena_info info_of(size_t arena_bytes)
{
    shm_arena_info info = {.epoch = 7,
                           .arena_bytes = arena_bytes,
                           .page_bytes = PAGE_BYTES,
                           .page_count = PAGES,
                           .device = -1};
    snprintf(info.backend, sizeof info.backend, "cpu");
    return info;
}

/* The child of the first test: a worker with pattern 1 in page 3 of its
 * arena, serving it as worker 2; on a byte from `go` it writes pattern 2
 * into page 4 and says so. Never returns. */
static void exporting_worker(int ready, int go)
{
    kernels_backend *be = open_cpu();
    void *arena;
    int fd;
    size_t mapped;
    unsigned char page[PAGE_BYTES];
    shm_arena_exporter *e = NULL;
    if (be->arena_create(be, PAGES * PAGE_BYTES, &arena, &fd, &mapped) != SHOAL_OK)
        _exit(2);
    fill(page, PAGE_BYTES, 1);
    be->upload(be, (unsigned char *)arena + 3 * PAGE_BYTES, page, PAGE_BYTES);
    shm_arena_info info = info_of(mapped);
    shoal_diag diag = {{0}};
    if (shm_arena_export_start(cluster, 2, fd, &info, &e, &diag) != SHOAL_OK) {
        fprintf(stderr, "child: %s\n", diag.msg);
        _exit(3);
    }
    char x;
    if (write(ready, "r", 1) != 1 || read(go, &x, 1) != 1)
        _exit(4);
    fill(page, PAGE_BYTES, 2);
    be->upload(be, (unsigned char *)arena + 4 * PAGE_BYTES, page, PAGE_BYTES);
    if (write(ready, "w", 1) != 1)
        _exit(5);
    for (;;)
        pause();
}

static void a_killed_workers_arena_is_fetched_mapped_copied_and_outlives_it(void)
{
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        exporting_worker(ready[1], go[0]);
    }
    close(ready[1]);
    close(go[0]);
    char x = 0;
    CHECK_MSG(read(ready[0], &x, 1) == 1 && x == 'r', "the exporting child died before serving");
    if (x != 'r') {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return;
    }

    shm_arena_info info;
    int fd = -1;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_arena_fetch(cluster, 2, 2000, &info, &fd, &diag) == SHOAL_OK, "%s", diag.msg);
    CHECK(fd >= 0);
    CHECK_EQ_INT(info.magic, SHM_ARENA_MAGIC);
    CHECK_EQ_INT(info.pid, pid);
    CHECK_EQ_INT(info.epoch, 7);
    CHECK_EQ_INT(info.page_bytes, PAGE_BYTES);
    CHECK_EQ_INT(info.page_count, PAGES);
    CHECK_EQ_INT(info.device, -1);
    CHECK(strcmp(info.backend, "cpu") == 0);
    /* rounded up to whole host pages */
    CHECK(info.arena_bytes >= PAGES * PAGE_BYTES && info.arena_bytes % 4096 == 0);

    kernels_backend *be = open_cpu();
    void *peer = NULL, *own = NULL;
    int own_fd = -1;
    size_t own_bytes = 0;
    unsigned char page[PAGE_BYTES];
    CHECK(be->arena_import(be, fd, info.arena_bytes, &peer) == SHOAL_OK);
    /* the fd is not needed once mapped */
    close(fd);
    if (!peer)
        goto out_kill;
    /* another fetch is served too, with the same arena */
    int fd2 = -1;
    shm_arena_info again;
    CHECK_MSG(shm_arena_fetch(cluster, 2, 2000, &again, &fd2, &diag) == SHOAL_OK, "%s",
              diag.msg);
    CHECK(again.arena_bytes == info.arena_bytes);
    if (fd2 >= 0)
        close(fd2);

    read_page(be, peer, 3, page);
    CHECK(is_pattern(page, PAGE_BYTES, 1));
    read_page(be, peer, 2, page);
    CHECK(is_zero(page, PAGE_BYTES));

    /* page 3 of the peer's arena into page 3 of ours, through the op */
    CHECK(be->arena_create(be, PAGES * PAGE_BYTES, &own, &own_fd, &own_bytes) == SHOAL_OK);
    CHECK(own_bytes == info.arena_bytes && own_fd >= 0);
    read_page(be, own, 3, page);
    CHECK(is_zero(page, PAGE_BYTES)); /* zero-filled */
    CHECK(be->copy(be, (unsigned char *)own + 3 * PAGE_BYTES,
                   (unsigned char *)peer + 3 * PAGE_BYTES, PAGE_BYTES) == SHOAL_OK);
    CHECK(be->sync(be) == SHOAL_OK);
    read_page(be, own, 3, page);
    CHECK(is_pattern(page, PAGE_BYTES, 1));
    read_page(be, own, 4, page);
    CHECK(is_zero(page, PAGE_BYTES));

    /* the mapping is the worker's memory, not a snapshot of it */
    CHECK(write(go[1], "g", 1) == 1);
    CHECK(read(ready[0], &x, 1) == 1 && x == 'w');
    read_page(be, peer, 4, page);
    CHECK(is_pattern(page, PAGE_BYTES, 2));

out_kill:
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (peer) {
        /* the worker is gone; its pages are not */
        read_page(be, peer, 3, page);
        CHECK(is_pattern(page, PAGE_BYTES, 1));
        read_page(be, peer, 4, page);
        CHECK(is_pattern(page, PAGE_BYTES, 2));
        be->arena_unmap(be, peer, info.arena_bytes);
    }
    /* and its name went with it */
    CHECK(shm_arena_fetch(cluster, 2, 2000, &info, &fd, &diag) == SHOAL_ERR_NOT_FOUND);
    if (own) {
        be->arena_unmap(be, own, own_bytes);
        close(own_fd);
    }
    kernels_backend_close(be);
    close(ready[0]);
    close(go[1]);
}

static void fetch_from_an_index_nobody_serves_is_not_found_at_once(void)
{
    shm_arena_info info;
    int fd = 123;
    shoal_diag diag = {{0}};
    double t0 = now_ms();
    CHECK(shm_arena_fetch(cluster, 9, 5000, &info, &fd, &diag) == SHOAL_ERR_NOT_FOUND);
    double ms = now_ms() - t0;
    CHECK_MSG(ms < 1000, "took %.0f ms", ms);
    CHECK_EQ_INT(fd, -1);
    CHECK_HAS(diag.msg, cluster);
    CHECK_HAS(diag.msg, "worker 9");
    CHECK(shm_arena_fetch(cluster, -1, 100, &info, &fd, &diag) == SHOAL_ERR_INVALID);
    CHECK(shm_arena_fetch(cluster, 64, 100, &info, &fd, &diag) == SHOAL_ERR_INVALID);
    CHECK(shm_arena_fetch("bad.name", 0, 100, &info, &fd, &diag) == SHOAL_ERR_INVALID);
}

/* A listening socket at worker `index`'s name that never accepts. */
static int listen_at(int index)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int k = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "shoal.%s.arena.%d", cluster,
                     index);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 ||
        bind(s, (struct sockaddr *)&addr,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k)) != 0 ||
        listen(s, 4) != 0) {
        fprintf(stderr, "listen_at %d: %s\n", index, strerror(errno));
        exit(1);
    }
    return s;
}

static void a_silent_exporter_times_out(void)
{
    int s = listen_at(6);
    shm_arena_info info;
    int fd = -1;
    shoal_diag diag = {{0}};
    double t0 = now_ms();
    CHECK(shm_arena_fetch(cluster, 6, 300, &info, &fd, &diag) == SHOAL_ERR_TIMEOUT);
    double ms = now_ms() - t0;
    CHECK_MSG(ms >= 280 && ms < 2000, "took %.0f ms", ms);
    CHECK_HAS(diag.msg, "worker 6");
    CHECK_EQ_INT(fd, -1);
    close(s);
}

/* Malformed messages, each from a server written by hand in a child. */
typedef struct bad_message {
    const char *what;
    void (*spoil)(shm_arena_info *);
    size_t bytes; /* of the info sent */
    int fds;      /* sent with it */
    const char *says;
} bad_message;

static void bad_magic(shm_arena_info *i)
{
    i->magic ^= 1;
}
static void other_version(shm_arena_info *i)
{
    i->version = SHM_ARENA_VERSION + 1;
}
static void pages_past_the_arena(shm_arena_info *i)
{
    i->page_count = (int32_t)(i->arena_bytes / i->page_bytes + 1);
}
static void no_backend_name(shm_arena_info *i)
{
    memset(i->backend, 'x', sizeof i->backend);
}
static void nothing_spoiled(shm_arena_info *i)
{
}

static void serve_by_hand(const bad_message *m, int ready)
{
    int s = listen_at(5);
    int c = -1;
    if (write(ready, "r", 1) != 1 || (c = accept(s, NULL, NULL)) < 0)
        _exit(2);
    shm_arena_info info = info_of(PAGES * 4096 * 4);
    info.magic = SHM_ARENA_MAGIC;
    info.version = SHM_ARENA_VERSION;
    info.pid = (int32_t)getpid();
    m->spoil(&info);
    int f = memfd_create("fake-arena", MFD_CLOEXEC);
    int fds[2] = {f, f};
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = &info, .iov_len = m->bytes};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (m->fds) {
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE((size_t)m->fds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)m->fds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)m->fds * sizeof(int));
    }
    if (sendmsg(c, &msg, MSG_NOSIGNAL) != (ssize_t)m->bytes)
        _exit(3);
    close(c);
    _exit(0);
}

static void a_malformed_message_is_refused_as_format(void)
{
    const bad_message cases[] = {
        {"bad magic", bad_magic, sizeof(shm_arena_info), 1, "not a shoal arena message"},
        {"other version", other_version, sizeof(shm_arena_info), 1, "version"},
        {"pages past the arena", pages_past_the_arena, sizeof(shm_arena_info), 1,
         "does not add up"},
        {"no backend name", no_backend_name, sizeof(shm_arena_info), 1, "names no backend"},
        {"short", nothing_spoiled, 20, 1, "closed after 20 of 64 bytes"},
        {"no fd", nothing_spoiled, sizeof(shm_arena_info), 0, "no file descriptor"},
        {"two fds", nothing_spoiled, sizeof(shm_arena_info), 2, "more than one"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_message *m = &cases[i];
        int ready[2];
        CHECK(pipe(ready) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(ready[0]);
            serve_by_hand(m, ready[1]);
        }
        close(ready[1]);
        char x;
        CHECK(read(ready[0], &x, 1) == 1);
        close(ready[0]);
        int before = open_fds();
        shm_arena_info info;
        int fd = 123;
        shoal_diag diag = {{0}};
        shoal_err err = shm_arena_fetch(cluster, 5, 2000, &info, &fd, &diag);
        CHECK_MSG(err == SHOAL_ERR_FORMAT, "%s: %s (%s)", m->what, shoal_strerror(err), diag.msg);
        CHECK_EQ_INT(fd, -1);
        CHECK_HAS(diag.msg, m->says);
        CHECK_HAS(diag.msg, "worker 5");
        CHECK_HAS(diag.msg, cluster);
        CHECK_MSG(open_fds() == before, "%s: an fd leaked", m->what);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: server child failed",
                  m->what);
    }
}

static void an_index_is_served_once_and_freed_by_stop(void)
{
    kernels_backend *be = open_cpu();
    void *arena = NULL;
    int fd = -1;
    size_t bytes = 0;
    CHECK(be->arena_create(be, PAGES * PAGE_BYTES, &arena, &fd, &bytes) == SHOAL_OK);
    shm_arena_info info = info_of(bytes);
    shm_arena_exporter *e = NULL, *twin = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_arena_export_start(cluster, 4, fd, &info, &e, &diag) == SHOAL_OK, "%s",
              diag.msg);
    CHECK(shm_arena_export_start(cluster, 4, fd, &info, &twin, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "already serves");
    CHECK(twin == NULL);
    /* refused before any socket: an info that does not add up, a closed fd */
    shm_arena_info bad = info;
    bad.page_count = 0;
    CHECK(shm_arena_export_start(cluster, 8, fd, &bad, &twin, &diag) == SHOAL_ERR_INVALID);
    CHECK(shm_arena_export_start(cluster, 8, 999, &info, &twin, &diag) == SHOAL_ERR_INVALID);
    /* this process fetches its own, as any other */
    shm_arena_info got;
    int got_fd = -1;
    CHECK_MSG(shm_arena_fetch(cluster, 4, 2000, &got, &got_fd, &diag) == SHOAL_OK, "%s",
              diag.msg);
    CHECK_EQ_INT(got.pid, getpid());
    void *again = NULL;
    CHECK(be->arena_import(be, got_fd, got.arena_bytes, &again) == SHOAL_OK);
    /* more than the arena holds is refused, not mapped into SIGBUS */
    void *too_far = NULL;
    CHECK(be->arena_import(be, got_fd, got.arena_bytes + 4096, &too_far) == SHOAL_ERR_INVALID);
    CHECK(too_far == NULL);
    /* a peer cannot shrink the arena under its owner: the memfd is sealed */
    CHECK(ftruncate(got_fd, 0) != 0);
    close(got_fd);
    if (again) {
        unsigned char page[PAGE_BYTES];
        fill(page, PAGE_BYTES, 9);
        CHECK(be->upload(be, (unsigned char *)arena + PAGE_BYTES, page, PAGE_BYTES) == SHOAL_OK);
        read_page(be, again, 1, page);
        CHECK(is_pattern(page, PAGE_BYTES, 9));
        be->arena_unmap(be, again, got.arena_bytes);
    }
    shm_arena_export_stop(e);
    CHECK(shm_arena_fetch(cluster, 4, 2000, &got, &got_fd, &diag) == SHOAL_ERR_NOT_FOUND);
    /* stop left the arena fd open, and the name free for a restart */
    CHECK(fcntl(fd, F_GETFD) >= 0);
    CHECK_MSG(shm_arena_export_start(cluster, 4, fd, &info, &e, &diag) == SHOAL_OK, "%s",
              diag.msg);
    shm_arena_export_stop(e);
    shm_arena_export_stop(NULL);
    be->arena_unmap(be, arena, bytes);
    be->arena_unmap(be, NULL, 0);
    close(fd);
    kernels_backend_close(be);
}

/* As root only: a child turned into another user (nobody) is refused by
 * our exporter, and our fetch refuses its exporter. */
static void a_process_of_another_user_is_refused_both_ways(void)
{
    if (geteuid() != 0) {
        printf("  (skipped: needs root to run a child as another user)\n");
        return;
    }
    const uid_t nobody = 65534;
    int fd = memfd_create("arena", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
    shm_arena_info info = info_of(1 << 20);
    shm_arena_exporter *e = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_arena_export_start(cluster, 10, fd, &info, &e, &diag) == SHOAL_OK, "%s",
              diag.msg);
    /* our exporter sends nothing to nobody: it sees the end, and no fd */
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(nobody) != 0 || setuid(nobody) != 0)
            _exit(2);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        int k = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "shoal.%s.arena.10",
                         cluster);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&addr,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k)) != 0)
            _exit(3);
        char buf[sizeof(shm_arena_info)];
        union {
            char c[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control.c,
                             .msg_controllen = sizeof control.c};
        ssize_t n = recvmsg(s, &msg, 0);
        _exit(n == 0 && msg.msg_controllen == 0 ? 0 : 4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit %d",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    shm_arena_export_stop(e);
    /* nobody's exporter: our fetch refuses it before it reads anything */
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid = fork();
    if (pid == 0) {
        close(ready[0]);
        if (setgid(nobody) != 0 || setuid(nobody) != 0)
            _exit(2);
        shm_arena_exporter *theirs = NULL;
        if (shm_arena_export_start(cluster, 11, fd, &info, &theirs, NULL) != SHOAL_OK)
            _exit(3);
        if (write(ready[1], "r", 1) != 1)
            _exit(4);
        for (;;)
            pause();
    }
    close(ready[1]);
    char x;
    CHECK(read(ready[0], &x, 1) == 1);
    close(ready[0]);
    int got_fd = 123;
    shm_arena_info got;
    CHECK(shm_arena_fetch(cluster, 11, 2000, &got, &got_fd, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "another user");
    CHECK_EQ_INT(got_fd, -1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(fd);
}

int main(void)
{
    /* unique per run: CTest runs test binaries side by side */
    snprintf(cluster, sizeof cluster, "test-arena-%d", (int)getpid());
    TEST_RUN(a_killed_workers_arena_is_fetched_mapped_copied_and_outlives_it);
    TEST_RUN(fetch_from_an_index_nobody_serves_is_not_found_at_once);
    TEST_RUN(a_silent_exporter_times_out);
    TEST_RUN(a_malformed_message_is_refused_as_format);
    TEST_RUN(an_index_is_served_once_and_freed_by_stop);
    TEST_RUN(a_process_of_another_user_is_refused_both_ways);
    return TEST_EXIT();
}
