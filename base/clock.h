/*
 * clock.h - monotonic milliseconds and absolute deadlines, for every timed
 * wait in ferry (the scheduler, the trainer's waits, the worker's
 * heartbeats), and nanoseconds for the per-batch timings. Header-only.
 */
#ifndef FERRY_BASE_CLOCK_H
#define FERRY_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC. */
static inline uint64_t ferry__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Nanoseconds on CLOCK_MONOTONIC, for per-batch timings. */
static inline uint64_t ferry__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The absolute time `ms` from now on `clock`, for the timed pthread waits. */
static inline struct timespec ferry__deadline_ts(clockid_t clock, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
