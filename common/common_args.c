#include "common_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int common_parse_int(const char *program, const char *flag, const char *s, long lo, long hi,
                     int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s': expected an integer in [%ld, %ld]\n", program, flag, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int common_parse_gib(const char *program, const char *flag, const char *s, double hi_gib,
                     unsigned long long *bytes)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *s == '\0' || *end != '\0' || !(v > 0.0 && v <= hi_gib)) {
        fprintf(stderr, "%s: %s '%s': expected a number of GiB in (0, %g]\n", program, flag, s,
                hi_gib);
        return -1;
    }
    *bytes = (unsigned long long)(v * 1073741824.0);
    return 0;
}
