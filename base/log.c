/*
 * log.c - the loader's messages to the trainer's callback or stderr (see
 * log.h).
 */
#include "log.h"

#include "forkfds.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_lock_forks(void)
{
    ferry__forkfds_unlock_in_child(&log_lock);
}

static const struct {
    int level;
    const char *name;
} levels[] = {
    {FERRY_LOG_DEBUG, "debug"},
    {FERRY_LOG_INFO, "info"},
    {FERRY_LOG_WARN, "warning"},
    {FERRY_LOG_ERROR, "error"},
};

const char *ferry_log_level_name(int level)
{
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (levels[i].level == level)
            return levels[i].name;
    return NULL;
}

int ferry__log_level_from_name(const char *name)
{
    for (size_t i = 0; name && i < sizeof levels / sizeof levels[0]; i++)
        if (strcmp(levels[i].name, name) == 0)
            return levels[i].level;
    return 0;
}

int ferry__log_on(const ferry__log *lg, int level)
{
    return level >= (lg ? lg->level : FERRY_LOG_INFO);
}

void ferry__logf(const ferry__log *lg, int level, const char *fmt, ...)
{
    static const ferry__log fallback = FERRY__LOG_DEFAULT;
    if (!lg)
        lg = &fallback;
    if (!ferry__log_on(lg, level))
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof line)
        memcpy(line + sizeof line - 4, "...", 4);
    /* One line: a newline inside (a worker's words) would split it. */
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    const char *name = ferry_log_level_name(level);
    pthread_once(&log_once, log_lock_forks);
    pthread_mutex_lock(&log_lock);
    if (lg->fn)
        lg->fn(lg->user, level, line);
    else
        fprintf(stderr, "ferry: %s: %s\n", name ? name : "log", line);
    pthread_mutex_unlock(&log_lock);
}
