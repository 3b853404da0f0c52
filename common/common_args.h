/* common_args.h: command-line values, checked the same way in every program. */
#ifndef SHOAL_COMMON_ARGS_H
#define SHOAL_COMMON_ARGS_H

/* Parses s as an integer in [lo, hi] into *out. On a bad value it prints
 * "<program>: <flag> '<s>': expected an integer in [lo, hi]" to stderr and
 * returns -1 (the caller exits with status 2); else 0. */
int common_parse_int(const char *program, const char *flag, const char *s, long lo, long hi,
                     int *out);

/* Parses s as a size in GiB (a decimal number, fractions allowed) above 0
 * and at most hi_gib into *bytes. On a bad value it prints "<program>:
 * <flag> '<s>': expected a number of GiB in (0, hi]" to stderr and returns
 * -1; else 0. */
int common_parse_gib(const char *program, const char *flag, const char *s, double hi_gib,
                     unsigned long long *bytes);

#endif
