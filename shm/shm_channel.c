#include "shm_channel.h"

#include "common/common_limits.h"
#include "shm/shm_proto.h"

#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct shm_channel {
    nng_socket sock;
};

static shoal_err nng_to_err(int rv)
{
    switch (rv) {
    case 0: return SHOAL_OK;
    case NNG_ETIMEDOUT: return SHOAL_ERR_TIMEOUT;
    case NNG_EAGAIN: return SHOAL_ERR_TIMEOUT;
    case NNG_ECLOSED: return SHOAL_ERR_CLOSED;
    case NNG_ENOMEM: return SHOAL_ERR_NOMEM;
    default: return SHOAL_ERR_IO;
    }
}

/* Opens a pair socket for the socket file `path`, writing its URL. */
static shoal_err open_socket(const char *path, char *url, size_t url_bytes, shm_channel **out,
                             shoal_diag *diag)
{
    *out = NULL;
    if (snprintf(url, url_bytes, "ipc://%s", path) >= (int)url_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", path);
    shm_channel *ch = calloc(1, sizeof *ch);
    if (!ch)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "channel: no memory");
    int rv = nng_pair0_open(&ch->sock);
    if (rv == 0)
        rv = nng_socket_set_size(ch->sock, NNG_OPT_RECVMAXSZ, SHM_MSG_BYTES_MAX);
    if (rv != 0) {
        free(ch);
        return shoal_diag_set(diag, nng_to_err(rv), "channel: %s", nng_strerror(rv));
    }
    *out = ch;
    return SHOAL_OK;
}

shoal_err shm_channel_listen(const char *path, shm_channel **out, shoal_diag *diag)
{
    char url[SHOAL_PATH_BYTES_MAX + 8];
    shoal_err err = open_socket(path, url, sizeof url, out, diag);
    if (err)
        return err;
    nng_listener l;
    unlink(path); /* a socket file left by a killed coordinator */
    int rv = nng_listener_create(&l, (*out)->sock, url);
    if (rv == 0)
        rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600);
    if (rv == 0)
        rv = nng_listener_start(l, 0);
    if (rv != 0) {
        shm_channel_close(*out);
        *out = NULL;
        return shoal_diag_set(diag, nng_to_err(rv), "%s: cannot listen: %s", path,
                              nng_strerror(rv));
    }
    return SHOAL_OK;
}

shoal_err shm_channel_dial(const char *path, shm_channel **out, shoal_diag *diag)
{
    char url[SHOAL_PATH_BYTES_MAX + 8];
    shoal_err err = open_socket(path, url, sizeof url, out, diag);
    if (err)
        return err;
    nng_socket_set_ms((*out)->sock, NNG_OPT_RECONNMINT, 20);
    nng_socket_set_ms((*out)->sock, NNG_OPT_RECONNMAXT, 500);
    int rv = nng_dial((*out)->sock, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        shm_channel_close(*out);
        *out = NULL;
        return shoal_diag_set(diag, nng_to_err(rv), "%s: cannot dial: %s", path,
                              nng_strerror(rv));
    }
    return SHOAL_OK;
}

void shm_channel_close(shm_channel *ch)
{
    if (!ch)
        return;
    nng_close(ch->sock);
    free(ch);
}

shoal_err shm_channel_send(shm_channel *ch, const void *msg, size_t bytes, int timeout_ms)
{
    nng_socket_set_ms(ch->sock, NNG_OPT_SENDTIMEO, timeout_ms < 0 ? NNG_DURATION_INFINITE
                                                                  : timeout_ms);
    return nng_to_err(nng_send(ch->sock, (void *)msg, bytes, 0));
}

shoal_err shm_channel_recv(shm_channel *ch, int timeout_ms, void **msg, size_t *bytes)
{
    int flags = NNG_FLAG_ALLOC;
    if (timeout_ms == 0)
        flags |= NNG_FLAG_NONBLOCK;
    else
        nng_socket_set_ms(ch->sock, NNG_OPT_RECVTIMEO,
                          timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
    *msg = NULL;
    *bytes = 0;
    return nng_to_err(nng_recv(ch->sock, msg, bytes, flags));
}

void shm_channel_free(void *msg, size_t bytes)
{
    if (msg)
        nng_free(msg, bytes);
}
