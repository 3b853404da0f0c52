#include "shm_arena.h"

#include "common/common_limits.h"

#include "common/common_log.h"
#include "shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct shm_arena_exporter {
    int listen_fd;
    int stop_pipe[2]; /* a byte on [1] ends the thread */
    int arena_fd;     /* the caller's */
    shm_arena_info info;
    char what[SHM_CLUSTER_NAME_MAX + 48]; /* "cluster 'x', worker 3" for the log */
    pthread_t thread;
};

/* The abstract socket address "\0shoal.<cluster>.arena.<index>", after the
 * checks of the cluster name (as shm_segment's) and the index. */
static shoal_err address_of(const char *cluster, int index, struct sockaddr_un *addr,
                            socklen_t *len, shoal_diag *diag)
{
    if (!shm_cluster_name_ok(cluster))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster name '%s': use 1 to %d letters, digits, '-' or '_'",
                              cluster, SHM_CLUSTER_NAME_MAX - 1);
    if (index < 0 || index >= SHM_SEGMENT_WORKERS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster '%s': worker index %d is not in [0, %d)", cluster, index,
                              SHM_SEGMENT_WORKERS_MAX);
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    /* sun_path[0] stays 0: the abstract namespace. The name is not
     * NUL-terminated there; its length is in the address length. */
    int k = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "shoal.%s.arena.%d", cluster,
                     index);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
    return SHOAL_OK;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void set_timeout(int fd, int option, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

shoal_err shm_arena_info_check(const shm_arena_info *info, shoal_diag *diag)
{
    if (info->magic != SHM_ARENA_MAGIC)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "not a shoal arena message (magic 0x%016llx)",
                              (unsigned long long)info->magic);
    if (info->version != SHM_ARENA_VERSION)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "arena message version %u, this build speaks %u: run one build of "
                              "shoal throughout the cluster",
                              info->version, SHM_ARENA_VERSION);
    if (memchr(info->backend, '\0', sizeof info->backend) == NULL || info->backend[0] == '\0')
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "arena message names no backend");
    if (info->pid <= 0 || info->device < -1 || info->arena_bytes == 0 || info->page_bytes == 0 ||
        info->page_count <= 0 ||
        info->page_bytes > info->arena_bytes / (uint64_t)info->page_count)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "arena message does not add up: pid %d, device %d, %d pages of "
                              "%llu bytes in an arena of %llu",
                              (int)info->pid, (int)info->device, (int)info->page_count,
                              (unsigned long long)info->page_bytes,
                              (unsigned long long)info->arena_bytes);
    return SHOAL_OK;
}

/* ---- the exporter ---- */

/* Hands one connection the info and the fd, if its peer is our user. */
static void serve_one(shm_arena_exporter *e, int c)
{
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
        LOG_WARN("arena export (%s): cannot read a peer's credentials: %s", e->what,
                 strerror(errno));
        return;
    }
    if (cred.uid != geteuid()) {
        LOG_WARN("arena export (%s): refused pid %d of uid %u: only processes of uid %u may map "
                 "this arena",
                 e->what, (int)cred.pid, (unsigned)cred.uid, (unsigned)geteuid());
        return;
    }
    set_timeout(c, SO_SNDTIMEO, SHOAL_ARENA_SEND_TIMEOUT_MS);
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = &e->info, .iov_len = sizeof e->info};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &e->arena_fd, sizeof(int));
    ssize_t n = sendmsg(c, &msg, MSG_NOSIGNAL);
    if (n != (ssize_t)sizeof e->info)
        LOG_WARN("arena export (%s): sending to pid %d: %s", e->what, (int)cred.pid,
                 n < 0 ? strerror(errno) : "short write");
}

static void *serve(void *arg)
{
    shm_arena_exporter *e = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = e->listen_fd, .events = POLLIN},
                              {.fd = e->stop_pipe[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            LOG_ERROR("arena export (%s): poll: %s; no longer serving", e->what, strerror(errno));
            return NULL;
        }
        if (p[1].revents)
            return NULL;
        if (!p[0].revents)
            continue;
        int c = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            /* Out of fds or memory: the connection waits in the backlog;
             * wait a little (or for stop) rather than spin on it. */
            if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
                LOG_WARN("arena export (%s): accept: %s", e->what, strerror(errno));
                poll(&p[1], 1, 100);
            }
            continue;
        }
        serve_one(e, c);
        close(c);
    }
}

shoal_err shm_arena_export_start(const char *cluster, int worker_index, int fd,
                                 const shm_arena_info *info, shm_arena_exporter **out,
                                 shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    struct sockaddr_un addr;
    socklen_t addr_len = 0;
    if ((err = address_of(cluster, worker_index, &addr, &addr_len, diag)))
        return err;
    if (fd < 0 || fcntl(fd, F_GETFD) < 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster '%s', worker %d: arena fd %d is not open", cluster,
                              worker_index, fd);
    shm_arena_exporter *e = calloc(1, sizeof *e);
    if (!e)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "arena export: no memory");
    e->listen_fd = -1;
    e->stop_pipe[0] = e->stop_pipe[1] = -1;
    e->arena_fd = fd;
    e->info = *info;
    e->info.magic = SHM_ARENA_MAGIC;
    e->info.version = SHM_ARENA_VERSION;
    e->info.pid = (int32_t)getpid();
    snprintf(e->what, sizeof e->what, "cluster '%s', worker %d", cluster, worker_index);
    shoal_diag why = {{0}};
    if (shm_arena_info_check(&e->info, &why)) {
        err = shoal_diag_set(diag, SHOAL_ERR_INVALID, "%s: %s", e->what, why.msg);
        goto out_free;
    }
    e->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (e->listen_fd < 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: arena socket: %s", e->what,
                             strerror(errno));
        goto out_free;
    }
    if (bind(e->listen_fd, (struct sockaddr *)&addr, addr_len) != 0) {
        if (errno == EADDRINUSE)
            err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                 "%s: another process already serves this worker's arena (a "
                                 "second worker with index %d, or a cluster of the same name)",
                                 e->what, worker_index);
        else
            err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot bind the arena socket: %s",
                                 e->what, strerror(errno));
        goto out_close;
    }
    if (listen(e->listen_fd, SHOAL_ARENA_BACKLOG) != 0 || pipe2(e->stop_pipe, O_CLOEXEC) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot listen for arena fetches: %s",
                             e->what, strerror(errno));
        goto out_close;
    }
    int rc = pthread_create(&e->thread, NULL, serve, e);
    if (rc != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: cannot start the arena thread: %s",
                             e->what, strerror(rc));
        goto out_close;
    }
    *out = e;
    return SHOAL_OK;
out_close:
    if (e->stop_pipe[0] >= 0) {
        close(e->stop_pipe[0]);
        close(e->stop_pipe[1]);
    }
    close(e->listen_fd);
out_free:
    free(e);
    return err;
}

void shm_arena_export_stop(shm_arena_exporter *e)
{
    if (!e)
        return;
    ssize_t n;
    do
        n = write(e->stop_pipe[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(e->thread, NULL);
    close(e->listen_fd);
    close(e->stop_pipe[0]);
    close(e->stop_pipe[1]);
    free(e);
}

/* ---- fetching ---- */

/* Reads the info and the fd it carries, by the deadline. The caller closes
 * *fd (set whenever one arrived) on every answer. */
static shoal_err receive(int s, uint64_t deadline_ms, shm_arena_info *info, int *fd,
                         shoal_diag *diag)
{
    size_t got = 0;
    int extra_fds = 0;
    bool truncated = false;
    while (got < sizeof *info) {
        uint64_t now = now_ms();
        if (now >= deadline_ms)
            return shoal_diag_set(diag, SHOAL_ERR_TIMEOUT, "no answer in time");
        /* at least 1 ms: a zero timeout would mean none */
        set_timeout(s, SO_RCVTIMEO, (int)(deadline_ms - now));
        /* room for a few fds, so that a peer sending more is seen (and the
         * extras closed) rather than truncated away */
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = (char *)info + got, .iov_len = sizeof *info - got};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control.buf,
                             .msg_controllen = sizeof control.buf};
        ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return shoal_diag_set(diag, SHOAL_ERR_TIMEOUT, "no answer in time");
            return shoal_diag_set(diag, SHOAL_ERR_IO, "receiving: %s", strerror(errno));
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int f;
                memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
                if (*fd < 0) {
                    *fd = f;
                } else {
                    close(f);
                    extra_fds++;
                }
            }
        }
        truncated |= (msg.msg_flags & MSG_CTRUNC) != 0;
        if (n == 0)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "the exporter closed after %zu of %zu bytes", got,
                                  sizeof *info);
        got += (size_t)n;
    }
    if (*fd < 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "the message carries no file descriptor");
    if (extra_fds || truncated)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "the message carries more than one file descriptor");
    return shm_arena_info_check(info, diag);
}

shoal_err shm_arena_fetch(const char *cluster, int worker_index, int timeout_ms,
                          shm_arena_info *info, int *fd, shoal_diag *diag)
{
    shoal_err err;
    *fd = -1;
    memset(info, 0, sizeof *info);
    struct sockaddr_un addr;
    socklen_t addr_len = 0;
    if ((err = address_of(cluster, worker_index, &addr, &addr_len, diag)))
        return err;
    if (timeout_ms <= 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster '%s', worker %d: arena fetch timeout %d ms, need > 0",
                              cluster, worker_index, timeout_ms);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return shoal_diag_set(diag, SHOAL_ERR_IO, "cluster '%s', worker %d: arena socket: %s",
                              cluster, worker_index, strerror(errno));
    /* A Unix stream connect waits only while the listener's backlog is
     * full, and for at most the send timeout. With nobody listening it
     * fails at once (ECONNREFUSED). */
    set_timeout(s, SO_SNDTIMEO, timeout_ms);
    int rc;
    do
        rc = connect(s, (struct sockaddr *)&addr, addr_len);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        if (errno == ECONNREFUSED || errno == ENOENT)
            err = shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND,
                                 "cluster '%s': worker %d serves no arena (not running, not "
                                 "started yet, or dead)",
                                 cluster, worker_index);
        else if (errno == EAGAIN || errno == ETIMEDOUT || errno == EINPROGRESS)
            err = shoal_diag_set(diag, SHOAL_ERR_TIMEOUT,
                                 "cluster '%s', worker %d: the arena exporter did not accept "
                                 "within %d ms",
                                 cluster, worker_index, timeout_ms);
        else
            err = shoal_diag_set(diag, SHOAL_ERR_IO, "cluster '%s', worker %d: connect: %s",
                                 cluster, worker_index, strerror(errno));
        goto out_close;
    }
    /* Anyone may bind an abstract name: take an fd only from our user. */
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO,
                             "cluster '%s', worker %d: cannot read the exporter's credentials: %s",
                             cluster, worker_index, strerror(errno));
        goto out_close;
    }
    if (cred.uid != geteuid()) {
        err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                             "cluster '%s', worker %d: the arena socket is served by pid %d of "
                             "uid %u, not by this user (uid %u): another user's process holds "
                             "the name; stop it or pick another cluster name",
                             cluster, worker_index, (int)cred.pid, (unsigned)cred.uid,
                             (unsigned)geteuid());
        goto out_close;
    }
    shoal_diag why = {{0}};
    if ((err = receive(s, deadline, info, fd, &why))) {
        shoal_diag_set(diag, err, "cluster '%s', worker %d's arena: %s", cluster, worker_index,
                       why.msg);
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        goto out_close;
    }
out_close:
    close(s);
    return err;
}
