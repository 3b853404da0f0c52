/* common_args.h: command-line values, checked the same way in every program. */
#ifndef SHOAL_COMMON_ARGS_H
#define SHOAL_COMMON_ARGS_H

#include "common/common_error.h"

/* Parses s as an integer in [lo, hi] into *out. SHOAL_ERR_INVALID on a bad
 * value, with diag "<flag> '<s>': expected an integer in [lo, hi]". */
shoal_err common_args_int(const char *flag, const char *s, long long lo, long long hi,
                          long long *out, shoal_diag *diag);

/* Parses s as a size in GiB (a decimal number, fractions allowed) above 0
 * and at most hi_gib into *bytes. SHOAL_ERR_INVALID on a bad value, with
 * diag "<flag> '<s>': expected a number of GiB in (0, hi]". */
shoal_err common_args_gib(const char *flag, const char *s, double hi_gib,
                          unsigned long long *bytes, shoal_diag *diag);

/* A program's own flag that takes an int: getopt_long's val for it, the
 * flag as written ("--port"), its range and where its value goes. */
typedef struct common_args_int_flag {
    int val;
    const char *flag;
    long long lo, hi;
    int *dst;
} common_args_int_flag;

/* When val is the val of one of ints[0 .. n-1], parses s into its dst as
 * common_args_int does (SHOAL_ERR_INVALID on a bad value, dst unchanged);
 * SHOAL_ERR_NOT_FOUND when val is none of theirs. The ranges must fit an
 * int (asserted). */
shoal_err common_args_int_flags(const common_args_int_flag *ints, size_t n, int val, const char *s,
                                shoal_diag *diag);

/* common_args_int into an int, for programs that report as they parse: on a
 * bad value it prints "<program>: <diag>" to stderr and returns -1 (the
 * caller exits with status 2); else 0. */
int common_parse_int(const char *program, const char *flag, const char *s, long lo, long hi,
                     int *out);

#endif
