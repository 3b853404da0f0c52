/* common_log.h: one-line log records on stderr.
 *
 * Each line is "<time> <process> <level>: message". Any thread may call. */
#ifndef SHOAL_COMMON_LOG_H
#define SHOAL_COMMON_LOG_H

typedef enum common_log_level {
    COMMON_LOG_DEBUG = 0,
    COMMON_LOG_INFO,
    COMMON_LOG_WARN,
    COMMON_LOG_ERROR,
} common_log_level;

/* Sets the process name printed on each line (copied) and the lowest level
 * that is printed. Call once from main before other threads start. */
void common_log_init(const char *process, common_log_level min_level);

void common_log(common_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define LOG_DEBUG(...) common_log(COMMON_LOG_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) common_log(COMMON_LOG_INFO, __VA_ARGS__)
#define LOG_WARN(...) common_log(COMMON_LOG_WARN, __VA_ARGS__)
#define LOG_ERROR(...) common_log(COMMON_LOG_ERROR, __VA_ARGS__)

#endif
