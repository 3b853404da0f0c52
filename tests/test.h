/* test.h: the harness of shoal's C tests.
 *
 * A test file defines functions named after the behaviour they prove and
 * lists them in main with TEST_RUN. A failed CHECK prints where and why and
 * marks the test failed; main returns non-zero if any test failed, which
 * CTest counts. SHOAL_TEST_ONLY=TEXT runs only the tests whose names hold
 * TEXT (a sanitizer's run of one test). */
#ifndef SHOAL_TEST_H
#define SHOAL_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failed_total;
static int test_failed_now;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                      \
            test_failed_now = 1;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            test_failed_now = 1;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

/* The diag message must contain every given fragment. */
#define CHECK_HAS(text, fragment)                                                                  \
    CHECK_MSG(strstr((text), (fragment)) != NULL, "'%s' lacks '%s'", (text), (fragment))

/* Whether the test hooks are compiled in (SHOAL_TESTING, as tools/test
 * builds): a test that needs one says it is skipped in a build without. */
static inline int test_hooks(const char *name)
{
#ifdef SHOAL_TESTING
    (void)name;
    return 1;
#else
    printf("skip %s: needs the test hooks (a build with -DSHOAL_TESTING=ON, as tools/test "
           "makes)\n",
           name);
    return 0;
#endif
}

static inline int test_selected(const char *name)
{
    const char *only = getenv("SHOAL_TEST_ONLY");
    return !only || strstr(name, only) != NULL;
}

#define TEST_RUN(fn)                                                                               \
    do {                                                                                           \
        if (!test_selected(#fn))                                                                   \
            break;                                                                                 \
        test_failed_now = 0;                                                                       \
        fn();                                                                                      \
        printf("%s %s\n", test_failed_now ? "FAIL" : "ok", #fn);                                   \
        fflush(stdout);                                                                            \
        test_failed_total += test_failed_now;                                                      \
    } while (0)

#define TEST_EXIT() (test_failed_total ? 1 : 0)

#endif
