#include "common_args.h"

#include "common/common_assert.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

shoal_err common_args_int(const char *flag, const char *s, long long lo, long long hi,
                          long long *out, shoal_diag *diag)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "%s '%s': expected an integer in [%lld, %lld]", flag, s, lo, hi);
    *out = v;
    return SHOAL_OK;
}

shoal_err common_args_int_flags(const common_args_int_flag *ints, size_t n, int val, const char *s,
                                shoal_diag *diag)
{
    for (size_t i = 0; i < n; i++) {
        if (ints[i].val != val)
            continue;
        SHOAL_ASSERT(ints[i].lo >= INT_MIN && ints[i].hi <= INT_MAX);
        long long v;
        if (common_args_int(ints[i].flag, s, ints[i].lo, ints[i].hi, &v, diag))
            return SHOAL_ERR_INVALID;
        *ints[i].dst = (int)v;
        return SHOAL_OK;
    }
    return SHOAL_ERR_NOT_FOUND;
}

shoal_err common_args_gib(const char *flag, const char *s, double hi_gib,
                          unsigned long long *bytes, shoal_diag *diag)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *s == '\0' || *end != '\0' || !(v > 0.0 && v <= hi_gib))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "%s '%s': expected a number of GiB in (0, %g]", flag, s, hi_gib);
    *bytes = (unsigned long long)(v * 1073741824.0);
    return SHOAL_OK;
}

int common_parse_int(const char *program, const char *flag, const char *s, long lo, long hi,
                     int *out)
{
    shoal_diag diag;
    long long v;
    if (common_args_int(flag, s, lo, hi, &v, &diag)) {
        fprintf(stderr, "%s: %s\n", program, diag.msg);
        return -1;
    }
    *out = (int)v;
    return 0;
}
