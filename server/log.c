/*
 * Logging: one line per event on stderr, "<UTC time> <LEVEL> <message>".
 * etcd logs JSON through zap; cairn keeps plain lines, since nothing parses
 * them. Levels follow etcd's --log-level names; panic and fatal map to error.
 * fprintf on one FILE is atomic per call in glibc, so threads never
 * interleave within a line.
 */
#include "server/server.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

static atomic_int min_level = CAIRN_LOG_INFO;

void cairn_log_set_level(int level)
{
    atomic_store(&min_level, level);
}

int cairn_log_level_parse(const char *s)
{
    static const struct {
        const char *name;
        int level;
    } names[] = {{"debug", CAIRN_LOG_DEBUG}, {"info", CAIRN_LOG_INFO},
                 {"warn", CAIRN_LOG_WARN},   {"error", CAIRN_LOG_ERROR},
                 {"panic", CAIRN_LOG_ERROR}, {"fatal", CAIRN_LOG_ERROR}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0)
            return names[i].level;
    return -1;
}

void cairn_log(int level, const char *fmt, ...)
{
    static const char *const tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (level < atomic_load(&min_level))
        return;
    if (level < CAIRN_LOG_DEBUG || level > CAIRN_LOG_ERROR)
        level = CAIRN_LOG_ERROR;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            tags[level], msg);
}
