/* common_assert.h: invariants that stay checked in release builds.
 *
 * SHOAL_ASSERT is for facts the code itself guarantees, never for input:
 * input from a file, a socket or the shared segment is validated and answered
 * with a shoal_err. SHOAL_DEBUG_ASSERT is for checks too costly for the hot
 * path; it compiles away unless SHOAL_DEBUG is defined. */
#ifndef SHOAL_COMMON_ASSERT_H
#define SHOAL_COMMON_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define SHOAL_ASSERT(cond)                                                       \
    do {                                                                         \
        if (__builtin_expect(!(cond), 0)) {                                      \
            fprintf(stderr, "shoal: assertion failed: %s (%s:%d)\n", #cond,      \
                    __FILE__, __LINE__);                                         \
            abort();                                                             \
        }                                                                        \
    } while (0)

#ifdef SHOAL_DEBUG
#define SHOAL_DEBUG_ASSERT(cond) SHOAL_ASSERT(cond)
#else
#define SHOAL_DEBUG_ASSERT(cond) ((void)0)
#endif

#endif
