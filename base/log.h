/*
 * log.h - where the loader's messages go: the trainer's callback
 * (ferry_config_set_log) or stderr.
 *
 * A ferry__log is three plain fields copied into every room that speaks (the
 * scheduler, the pool, the remote side), so a message needs no lookup and no
 * lock of the loader's. One message is one call with one line: the event and
 * everything a reader needs about it, never a message per worker followed by
 * another per batch.
 *
 * Thread safety: ferry__logf may be called from any thread; the calls are
 * serialised by one process-wide lock, so a callback never runs twice at
 * once (ferry.h promises it).
 */
#ifndef FERRY_BASE_LOG_H
#define FERRY_BASE_LOG_H

#include <stdint.h>

#include "ferry.h"

typedef struct ferry__log {
    ferry_log_fn fn; /* NULL: stderr */
    void *user;
    int level; /* messages below it are dropped */
} ferry__log;

/* The default: INFO and above to stderr. */
#define FERRY__LOG_DEFAULT ((ferry__log){NULL, NULL, FERRY_LOG_INFO})

/* Whether a message at `level` would go anywhere: callers that must work to
 * build one ask first. */
int ferry__log_on(const ferry__log *lg, int level);

/* Formats one message (at most 1 KiB; longer is cut with "...") and hands
 * it on: to lg->fn, or to stderr as "ferry: LEVEL: message". A NULL lg is
 * the default. */
void ferry__logf(const ferry__log *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether the n-th (from 1) of a repeating event is worth a line: the
 * first `first`, then each power of two, so a flood writes a few dozen
 * lines whatever its size, each saying how many so far. */
static inline int ferry__log_nth(uint64_t n, uint64_t first)
{
    return n <= first || (n & (n - 1)) == 0;
}

/* The level named `name` ("debug", "info", "warning", "error"), or 0. */
int ferry__log_level_from_name(const char *name);

#endif
