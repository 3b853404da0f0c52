#include "common_pool.h"

#include "common_limits.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

enum { POOL_SPIN_ROUNDS = 20000 };

struct pool_helper {
    common_pool *pool;
    int index;
    pthread_t thread;
};

struct common_pool {
    int threads;
    struct pool_helper *helpers;
    int helpers_started;

    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation; /* bumped for each loop; helpers wait for a change */
    atomic_bool stopping;

    /* The loop in flight, valid while generation is the current one. */
    common_pool_fn fn;
    void *ctx;
    int tasks;
    atomic_int next_task;
    atomic_int busy; /* helpers still inside the loop */
};

static void pool_work(common_pool *pool, int thread)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (t >= pool->tasks)
            return;
        pool->fn(pool->ctx, t, thread);
    }
}

static void *pool_helper_main(void *arg)
{
    struct pool_helper *h = arg;
    common_pool *pool = h->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stopping) && spins < POOL_SPIN_ROUNDS)
            spins++;
        if (gen == seen && !atomic_load(&pool->stopping)) {
            pthread_mutex_lock(&pool->lock);
            while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping))
                pthread_cond_wait(&pool->wake, &pool->lock);
            pthread_mutex_unlock(&pool->lock);
        }
        if (atomic_load(&pool->stopping))
            return NULL;
        seen = gen;
        pool_work(pool, h->index);
        atomic_fetch_sub_explicit(&pool->busy, 1, memory_order_release);
    }
}

shoal_err common_pool_open(int threads, common_pool **out)
{
    *out = NULL;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > SHOAL_CPU_THREADS_MAX)
        return SHOAL_ERR_LIMIT;
    common_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return SHOAL_ERR_NOMEM;
    pool->threads = threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->helpers = calloc((size_t)threads, sizeof *pool->helpers);
    if (!pool->helpers)
        goto out_close;
    for (int i = 1; i < threads; i++) {
        pool->helpers[i].pool = pool;
        pool->helpers[i].index = i;
        if (pthread_create(&pool->helpers[i].thread, NULL, pool_helper_main, &pool->helpers[i]))
            goto out_close;
        pool->helpers_started = i;
    }
    *out = pool;
    return SHOAL_OK;
out_close:
    common_pool_close(pool);
    return SHOAL_ERR_NOMEM;
}

void common_pool_close(common_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->stopping, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i <= pool->helpers_started; i++)
        pthread_join(pool->helpers[i].thread, NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    free(pool->helpers);
    free(pool);
}

int common_pool_threads(const common_pool *pool)
{
    return pool->threads;
}

void common_pool_run(common_pool *pool, int tasks, common_pool_fn fn, void *ctx)
{
    if (tasks <= 0)
        return;
    if (pool->threads == 1 || tasks == 1) {
        for (int t = 0; t < tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->tasks = tasks;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->busy, pool->threads - 1, memory_order_relaxed);
    /* The release on generation publishes fn, ctx and tasks to the helpers. */
    pthread_mutex_lock(&pool->lock);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    pool_work(pool, 0);
    while (atomic_load_explicit(&pool->busy, memory_order_acquire) != 0)
        ;
}
