/* common_time.h: the clocks shoal reads. Monotonic time for durations and
 * deadlines; wall-clock time only for what crosses a process boundary or
 * reaches a person (heartbeats and "since" in the shared segment). */
#ifndef SHOAL_COMMON_TIME_H
#define SHOAL_COMMON_TIME_H

#include <stdint.h>
#include <time.h>

static inline uint64_t common_clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in ns and in ms. */
static inline uint64_t common_mono_ns(void)
{
    return common_clock_ns(CLOCK_MONOTONIC);
}

static inline long long common_mono_ms(void)
{
    return (long long)(common_mono_ns() / 1000000ull);
}

/* CLOCK_REALTIME in ns. */
static inline uint64_t common_wall_ns(void)
{
    return common_clock_ns(CLOCK_REALTIME);
}

#endif
