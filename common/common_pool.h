/* common_pool.h: a fixed pool of threads that runs one parallel loop at a time.
 *
 * The CPU backend runs every op as one loop of independent tasks. The calling
 * thread works too, so a pool of N threads starts N-1 helpers. Threads spin
 * briefly before they sleep: a decode step issues hundreds of short loops,
 * and a wake-up through the kernel for each would cost more than the work. */
#ifndef SHOAL_COMMON_POOL_H
#define SHOAL_COMMON_POOL_H

#include "common_error.h"

typedef struct common_pool common_pool;

/* fn runs once for each task in [0, tasks); thread is in [0, threads). */
typedef void (*common_pool_fn)(void *ctx, int task, int thread);

/* Starts a pool of `threads` threads in all (1 = run inline, no helpers;
 * 0 = one per online processor). *out is owned by the caller until
 * common_pool_close. Returns SHOAL_ERR_NOMEM or SHOAL_ERR_LIMIT. */
shoal_err common_pool_open(int threads, common_pool **out);

/* Stops the helpers and frees the pool. NULL is allowed. */
void common_pool_close(common_pool *pool);

/* Threads in the pool, the caller included. */
int common_pool_threads(const common_pool *pool);

/* Runs fn over all tasks and returns when every task has finished. Only one
 * thread may call run on a pool at a time; fn must not call run. */
void common_pool_run(common_pool *pool, int tasks, common_pool_fn fn, void *ctx);

#endif
