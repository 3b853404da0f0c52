#include "common_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static char log_process[32] = "shoal";
static common_log_level log_min = COMMON_LOG_INFO;

void common_log_init(const char *process, common_log_level min_level)
{
    snprintf(log_process, sizeof log_process, "%s", process);
    log_min = min_level;
}

void common_log(common_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < log_min)
        return;
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %s %s: ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L, log_process,
                     names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fputs per record so lines of concurrent threads do not interleave. */
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}
