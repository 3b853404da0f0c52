/* coordinator_hangup.h: notices when a client hangs up on a waiting request.
 *
 * libmicrohttpd does not watch a suspended connection, and a request waits
 * suspended while its prompt is prefilled, while a non-streamed completion
 * runs, and between streamed tokens. A client that goes away then would
 * keep its streams running until the next write fails, or to the end. This
 * watcher holds the sockets of such requests in its own epoll set with
 * EPOLLRDHUP and calls back as soon as the peer closes (a half-close counts
 * as going away, as nginx treats it), so the request's streams are
 * cancelled within milliseconds.
 *
 * Registrations are slots with a generation, so a late event for a
 * registration that was removed is recognised and dropped. The callback
 * runs on the watcher's thread with the watcher's lock held: when
 * coordinator_hangup_remove returns, the callback is not running for that
 * registration and never will. The callback must not call into the
 * watcher. */
#ifndef SHOAL_COORDINATOR_HANGUP_H
#define SHOAL_COORDINATOR_HANGUP_H

#include "common/common_error.h"

#include <stdint.h>

typedef struct coordinator_hangup coordinator_hangup;

typedef void (*coordinator_hangup_fn)(void *ctx);

/* Starts a watcher for at most `slots` sockets at once. */
shoal_err coordinator_hangup_open(int slots, coordinator_hangup **out, shoal_diag *diag);

/* Stops the thread and frees; NULL allowed. No registration may remain
 * that the caller still relies on. */
void coordinator_hangup_close(coordinator_hangup *h);

/* Watches fd (not owned; it must stay open until removed): fn(ctx) is
 * called once when its peer closes. *id names the registration.
 * SHOAL_ERR_LIMIT when every slot is taken, SHOAL_ERR_IO if epoll refuses
 * the descriptor. Any thread. */
shoal_err coordinator_hangup_add(coordinator_hangup *h, int fd, coordinator_hangup_fn fn, void *ctx,
                                 uint64_t *id);

/* Stops watching; waits for a callback of this registration that is
 * running. Unknown or already removed ids are ignored. Any thread but the
 * watcher's. */
void coordinator_hangup_remove(coordinator_hangup *h, uint64_t id);

#endif
