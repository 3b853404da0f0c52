#include "coordinator_hangup.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Events taken from the kernel per wake-up. */
enum { EVENTS_MAX = 64 };

typedef struct slot {
    int fd; /* -1: free */
    uint32_t gen;
    coordinator_hangup_fn fn;
    void *ctx;
    int next_free;
} slot;

struct coordinator_hangup {
    pthread_mutex_t lock;
    int epfd;
    int stopfd; /* an eventfd that ends the thread */
    pthread_t thread;
    bool started;
    slot *slots;
    int count;
    int free_head;
};

/* The epoll data of a registration: slot index and generation. The stop
 * descriptor's data is all ones. */
static uint64_t pack(int index, uint32_t gen)
{
    return ((uint64_t)(uint32_t)index << 32) | gen;
}

static void *watch_main(void *arg)
{
    coordinator_hangup *h = arg;
    struct epoll_event ev[EVENTS_MAX];
    for (;;) {
        int n = epoll_wait(h->epfd, ev, EVENTS_MAX, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return NULL;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == UINT64_MAX)
                return NULL;
            int index = (int)(ev[i].data.u64 >> 32);
            uint32_t gen = (uint32_t)ev[i].data.u64;
            /* The lock makes the check and the call one step against
             * remove: a registration removed since epoll_wait returned
             * has another generation (or is free) by now. */
            pthread_mutex_lock(&h->lock);
            if (index < h->count && h->slots[index].fd >= 0 && h->slots[index].gen == gen) {
                slot *s = &h->slots[index];
                /* One call per registration: take it out of the set now. */
                epoll_ctl(h->epfd, EPOLL_CTL_DEL, s->fd, NULL);
                coordinator_hangup_fn fn = s->fn;
                void *ctx = s->ctx;
                s->fn = NULL;
                if (fn)
                    fn(ctx);
            }
            pthread_mutex_unlock(&h->lock);
        }
    }
}

shoal_err coordinator_hangup_open(int slots, coordinator_hangup **out, shoal_diag *diag)
{
    *out = NULL;
    coordinator_hangup *h = calloc(1, sizeof *h);
    if (!h)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "hangup watcher: no memory");
    pthread_mutex_init(&h->lock, NULL);
    h->epfd = -1;
    h->stopfd = -1;
    shoal_err err;
    h->slots = calloc((size_t)slots, sizeof *h->slots);
    if (!h->slots) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "hangup watcher: no memory");
        goto out_close;
    }
    h->count = slots;
    for (int i = 0; i < slots; i++) {
        h->slots[i].fd = -1;
        h->slots[i].next_free = i + 1 < slots ? i + 1 : -1;
    }
    h->free_head = slots ? 0 : -1;
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    h->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event stop = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (h->epfd < 0 || h->stopfd < 0 || epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->stopfd, &stop) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "hangup watcher: epoll: %s", strerror(errno));
        goto out_close;
    }
    if (pthread_create(&h->thread, NULL, watch_main, h) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "hangup watcher: cannot start a thread");
        goto out_close;
    }
    h->started = true;
    *out = h;
    return SHOAL_OK;
out_close:
    coordinator_hangup_close(h);
    return err;
}

void coordinator_hangup_close(coordinator_hangup *h)
{
    if (!h)
        return;
    if (h->started) {
        uint64_t one = 1;
        if (write(h->stopfd, &one, sizeof one) != (ssize_t)sizeof one)
            abort(); /* an eventfd write of 1 cannot fail short of a bug */
        pthread_join(h->thread, NULL);
    }
    if (h->epfd >= 0)
        close(h->epfd);
    if (h->stopfd >= 0)
        close(h->stopfd);
    free(h->slots);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

shoal_err coordinator_hangup_add(coordinator_hangup *h, int fd, coordinator_hangup_fn fn, void *ctx,
                                 uint64_t *id)
{
    shoal_err err = SHOAL_OK;
    pthread_mutex_lock(&h->lock);
    int i = h->free_head;
    if (i < 0) {
        err = SHOAL_ERR_LIMIT;
        goto out_unlock;
    }
    slot *s = &h->slots[i];
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = pack(i, s->gen)};
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        err = SHOAL_ERR_IO;
        goto out_unlock;
    }
    h->free_head = s->next_free;
    s->fd = fd;
    s->fn = fn;
    s->ctx = ctx;
    *id = pack(i, s->gen);
out_unlock:
    pthread_mutex_unlock(&h->lock);
    return err;
}

void coordinator_hangup_remove(coordinator_hangup *h, uint64_t id)
{
    int index = (int)(id >> 32);
    uint32_t gen = (uint32_t)id;
    pthread_mutex_lock(&h->lock);
    if (index < h->count && h->slots[index].fd >= 0 && h->slots[index].gen == gen) {
        slot *s = &h->slots[index];
        /* Still open (the caller's promise), so the removal is exact; it
         * fails harmlessly if the watcher already took it out. */
        epoll_ctl(h->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        s->fd = -1;
        s->fn = NULL;
        s->gen++;
        s->next_free = h->free_head;
        h->free_head = index;
    }
    pthread_mutex_unlock(&h->lock);
}
