#include "common_error.h"

#include <stdio.h>

static const char *const names[SHOAL_ERR__COUNT] = {
    [SHOAL_OK] = "ok",
    [SHOAL_ERR_NOMEM] = "out of memory",
    [SHOAL_ERR_IO] = "input/output error",
    [SHOAL_ERR_FORMAT] = "malformed input",
    [SHOAL_ERR_UNSUPPORTED] = "not supported",
    [SHOAL_ERR_INVALID] = "invalid argument",
    [SHOAL_ERR_LIMIT] = "limit exceeded",
    [SHOAL_ERR_NOT_FOUND] = "not found",
    [SHOAL_ERR_DEVICE] = "device error",
    [SHOAL_ERR_BROKEN] = "object unusable after an earlier error",
    [SHOAL_ERR_TIMEOUT] = "timed out",
    [SHOAL_ERR_CLOSED] = "closed",
};

const char *shoal_strerror(shoal_err err)
{
    if ((unsigned)err >= SHOAL_ERR__COUNT)
        return "unknown error";
    return names[err];
}

shoal_err shoal_diag_set(shoal_diag *diag, shoal_err err, const char *fmt, ...)
{
    if (diag) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(diag->msg, sizeof diag->msg, fmt, ap);
        va_end(ap);
    }
    return err;
}

void shoal_diag_clear(shoal_diag *diag)
{
    if (diag)
        diag->msg[0] = '\0';
}
