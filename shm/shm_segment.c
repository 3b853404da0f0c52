#include "shm_segment.h"

#include "common/common_assert.h"
#include "common/common_log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct shm_segment {
    char path[SHM_CLUSTER_NAME_MAX + 8];
    void *base;
    size_t bytes;
    bool creator;
};

bool shm_pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static bool good_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= SHM_CLUSTER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The layout, carved in one pass: header, then the worker table. */
static size_t layout(uint64_t *workers_offset)
{
    size_t off = (sizeof(shm_segment_header) + 63) & ~(size_t)63;
    *workers_offset = off;
    off += SHM_SEGMENT_WORKERS_MAX * sizeof(shm_worker_row);
    return (off + 4095) & ~(size_t)4095;
}

/* Checks a mapped header; diag says what to do when it is not ours. */
static shoal_err check_header(const shm_segment_header *h, size_t bytes, const char *path,
                              shoal_diag *diag)
{
    if (bytes < sizeof *h || h->magic != SHM_SEGMENT_MAGIC)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s is not a shoal segment; remove it or pick another "
                              "--cluster name",
                              path);
    if (h->version != SHM_SEGMENT_VERSION)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s has layout version %u, this build uses %u: stop the "
                              "cluster that made it and start one build throughout",
                              path, h->version, SHM_SEGMENT_VERSION);
    if (h->total_bytes != bytes || h->header_bytes != sizeof *h)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s: header says %llu bytes, the object has %zu", path,
                              (unsigned long long)h->total_bytes, bytes);
    return SHOAL_OK;
}

static shoal_err map_fd(int fd, size_t bytes, bool read_only, shm_segment *s, shoal_diag *diag)
{
    void *p = mmap(NULL, bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: cannot map: %s", s->path,
                              strerror(errno));
    s->base = p;
    s->bytes = bytes;
    return SHOAL_OK;
}

shoal_err shm_segment_create(const char *name, shm_segment **out, shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (!good_name(name))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster name '%s': use 1 to %d letters, digits, '-' or '_'", name,
                              SHM_CLUSTER_NAME_MAX - 1);
    shm_segment *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    snprintf(s->path, sizeof s->path, "/shoal.%s", name);
    uint64_t workers_offset;
    size_t bytes = layout(&workers_offset);
    int fd = shm_open(s->path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* A segment is there: refuse a live cluster's, replace a dead one's. */
        shm_segment *old = NULL;
        shoal_diag why = {{0}};
        err = shm_segment_attach(name, true, &old, &why);
        if (!err) {
            pid_t creator = shm_segment_header_of(old)->creator_pid;
            shm_segment_close(old);
            if (shm_pid_alive(creator)) {
                err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                     "cluster '%s' already runs (coordinator pid %d); stop it or "
                                     "pick another --cluster name",
                                     name, (int)creator);
                goto out_free;
            }
            LOG_WARN("replacing /dev/shm%s left by a coordinator (pid %d) that is gone", s->path,
                     (int)creator);
        } else if (err == SHOAL_ERR_FORMAT) {
            shoal_diag_set(diag, err, "%s", why.msg);
            goto out_free;
        }
        shm_unlink(s->path);
        fd = shm_open(s->path, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: cannot create: %s", s->path,
                             strerror(errno));
        goto out_free;
    }
    s->creator = true;
    /* Reserve every byte now: a full tmpfs fails here, not with SIGBUS in
     * the middle of a run. */
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "/dev/shm%s: cannot reserve %zu bytes: %s (is /dev/shm full?)",
                             s->path, bytes, strerror(rc));
        goto out_close_fd;
    }
    if ((err = map_fd(fd, bytes, false, s, diag)))
        goto out_close_fd;
    close(fd);
    shm_segment_header *h = s->base;
    memset(h, 0, bytes);
    h->version = SHM_SEGMENT_VERSION;
    h->header_bytes = sizeof *h;
    h->total_bytes = bytes;
    h->created_ns = now_ns();
    h->creator_pid = (int32_t)getpid();
    h->workers_max = SHM_SEGMENT_WORKERS_MAX;
    snprintf(h->cluster, sizeof h->cluster, "%s", name);
    h->workers_offset = workers_offset;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    /* the magic last: an attacher never sees a half-made header as ours */
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_SEGMENT_MAGIC;
    *out = s;
    return SHOAL_OK;
out_close_fd:
    close(fd);
    shm_unlink(s->path);
out_free:
    free(s);
    return err;
}

shoal_err shm_segment_attach(const char *name, bool read_only, shm_segment **out,
                             shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (!good_name(name))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "cluster name '%s' is not valid", name);
    shm_segment *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    snprintf(s->path, sizeof s->path, "/shoal.%s", name);
    int fd = shm_open(s->path, read_only ? O_RDONLY : O_RDWR, 0);
    if (fd < 0) {
        err = shoal_diag_set(diag, errno == ENOENT ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_IO,
                             "/dev/shm%s: %s (is the cluster '%s' running?)", s->path,
                             strerror(errno), name);
        goto out_free;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: %s", s->path, strerror(errno));
        goto out_close_fd;
    }
    if ((err = map_fd(fd, (size_t)st.st_size, read_only, s, diag)))
        goto out_close_fd;
    close(fd);
    if ((err = check_header(s->base, s->bytes, s->path, diag))) {
        munmap(s->base, s->bytes);
        goto out_free;
    }
    *out = s;
    return SHOAL_OK;
out_close_fd:
    close(fd);
out_free:
    free(s);
    return err;
}

void shm_segment_close(shm_segment *s)
{
    if (!s)
        return;
    if (s->base)
        munmap(s->base, s->bytes);
    if (s->creator)
        shm_unlink(s->path);
    free(s);
}

shm_segment_header *shm_segment_header_of(shm_segment *s)
{
    return s->base;
}

shm_worker_row *shm_segment_worker(shm_segment *s, int index)
{
    SHOAL_ASSERT(index >= 0 && index < SHM_SEGMENT_WORKERS_MAX);
    shm_segment_header *h = s->base;
    return (shm_worker_row *)((char *)s->base + h->workers_offset) + index;
}

void shm_segment_lock(shm_segment *s)
{
    shm_segment_header *h = s->base;
    int rc = pthread_mutex_lock(&h->lock);
    if (rc == EOWNERDEAD) {
        /* The holder died inside its critical section. What the lock guards
         * today is the generation counter, bumped as the last step: nothing
         * is half-written. Later regions recount here. */
        h->repairs++;
        pthread_mutex_consistent(&h->lock);
        rc = 0;
    }
    SHOAL_ASSERT(rc == 0);
}

void shm_segment_unlock(shm_segment *s)
{
    shm_segment_header *h = s->base;
    pthread_mutex_unlock(&h->lock);
}
