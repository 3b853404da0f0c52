/* shm_channel.h: one message channel between the coordinator and a worker.
 *
 * An nng pair socket over ipc:// (a Unix socket in the runtime directory).
 * The coordinator listens (socket file mode 0600) and the worker dials; nng
 * redials by itself if the worker starts first or the coordinator restarts.
 * Messages are shm_proto messages, at most SHM_MSG_BYTES_MAX bytes: larger
 * ones are dropped by nng before they reach us. This is the one place that
 * will grow a network path (tcp:// with TLS) for workers on other hosts.
 *
 * Threads: one sender and one receiver may use a channel at once. */
#ifndef SHOAL_SHM_CHANNEL_H
#define SHOAL_SHM_CHANNEL_H

#include "common/common_error.h"

#include <stddef.h>

typedef struct shm_channel shm_channel;

/* Listens on the socket file `path` (replacing a stale one). */
shoal_err shm_channel_listen(const char *path, shm_channel **out, shoal_diag *diag);

/* Dials the socket file `path`; succeeds before the listener exists and
 * connects when it appears. */
shoal_err shm_channel_dial(const char *path, shm_channel **out, shoal_diag *diag);

/* Closes; NULL allowed. A receiver blocked in recv returns SHOAL_ERR_CLOSED. */
void shm_channel_close(shm_channel *ch);

/* Sends a copy of msg, waiting at most timeout_ms for room (negative:
 * forever). SHOAL_ERR_TIMEOUT, SHOAL_ERR_CLOSED or SHOAL_ERR_IO. */
shoal_err shm_channel_send(shm_channel *ch, const void *msg, size_t bytes, int timeout_ms);

/* Receives one message into a buffer that *msg owns until
 * shm_channel_free(*msg, *bytes). Waits at most timeout_ms (negative:
 * forever, 0: only what is there). SHOAL_ERR_TIMEOUT or SHOAL_ERR_CLOSED. */
shoal_err shm_channel_recv(shm_channel *ch, int timeout_ms, void **msg, size_t *bytes);
void shm_channel_free(void *msg, size_t bytes);

#endif
