/* common_error.h: the one error enum of shoal, and a diagnostic buffer.
 *
 * Functions that act return shoal_err; predicates return bool. Codes from
 * errno, nng, LMDB and CUDA are translated where they enter shoal. A function
 * that can fail for a reason a person must read (which file, which tensor,
 * what was expected) also takes a shoal_diag and writes one line into it. */
#ifndef SHOAL_COMMON_ERROR_H
#define SHOAL_COMMON_ERROR_H

#include <stdarg.h>
#include <stddef.h>

typedef enum shoal_err {
    SHOAL_OK = 0,
    SHOAL_ERR_NOMEM,       /* an allocation failed */
    SHOAL_ERR_IO,          /* a read, write, open or map failed */
    SHOAL_ERR_FORMAT,      /* input is malformed (file, message, request) */
    SHOAL_ERR_UNSUPPORTED, /* well-formed, but not something shoal runs */
    SHOAL_ERR_INVALID,     /* a caller passed an argument out of range */
    SHOAL_ERR_LIMIT,       /* a bound of common_limits.h would be passed */
    SHOAL_ERR_NOT_FOUND,   /* a named thing does not exist */
    SHOAL_ERR_DEVICE,      /* the compute device (CUDA) reported an error */
    SHOAL_ERR_BROKEN,      /* the object failed earlier and is unusable */
    SHOAL_ERR_TIMEOUT,     /* nothing arrived or finished in the time given */
    SHOAL_ERR_CLOSED,      /* the other end or the object is closed */
    SHOAL_ERR__COUNT
} shoal_err;

/* A static English name for err; never NULL, also for unknown values. */
const char *shoal_strerror(shoal_err err);

enum { SHOAL_DIAG_BYTES = 512 };

/* One line saying what went wrong, for a person. Owned by the caller. */
typedef struct shoal_diag {
    char msg[SHOAL_DIAG_BYTES];
} shoal_diag;

/* Writes a printf-style message into diag (NULL diag is allowed and ignored)
 * and returns err, so a failing path reads `return shoal_diag_set(d, E, ...)`. */
shoal_err shoal_diag_set(shoal_diag *diag, shoal_err err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears diag (NULL allowed). */
void shoal_diag_clear(shoal_diag *diag);

#endif
