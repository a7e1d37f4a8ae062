/*
 * profile.h - where each delivered batch's time went, kept on the
 * trainer's side (profile.c), and the verdict drawn from it (verdict.c).
 *
 * A batch's life from dispatch to delivery is split into four stages that
 * add up to it exactly: make (the worker's build), transit (flight - make:
 * queued at the worker and both transfers), order (arrived, held back
 * while the trainer waited for an earlier batch) and held (arrived,
 * waiting for the trainer to ask). Beside them the trainer's own time:
 * its wait inside next() and its step between next() calls.
 *
 * Threads: the trainer's thread writes the figures, inside next(); any
 * thread reads them (ferry__profile_snapshot) through a sequence counter,
 * so the writer never waits and a reader retries a torn copy. The trace,
 * when on, is the trainer thread's alone.
 */
#ifndef FERRY_CORE_PROFILE_H
#define FERRY_CORE_PROFILE_H

#include <stdint.h>

#include "ferry.h"

typedef struct ferry__profile ferry__profile;

/* A profile for `workers` worker slots, its span starting now. FERRY_ENOMEM. */
int ferry__profile_new(ferry__profile **out, uint32_t workers, int in_order);
void ferry__profile_free(ferry__profile *p);

/* The trainer's thread, in next(): a call begins (a call after one that
 * timed out goes on with the same wait); it delivered b; it ended without a
 * batch and the next call starts a new wait (failure, end of stream). */
void ferry__profile_enter(ferry__profile *p);
void ferry__profile_delivered(ferry__profile *p, const ferry_batch *b);
void ferry__profile_broke(ferry__profile *p);

/* The figures since the start of one worker's batches, or all (-1); the
 * ferry_stats fields are left 0 for the caller. Any thread. */
void ferry__profile_snapshot(ferry__profile *p, int32_t worker, ferry_profile *out);

/* Keeps the last `max` batches for a trace (0: none); the trainer's thread. */
int ferry__profile_trace(ferry__profile *p, uint32_t max);
/* Writes them as Chrome trace-event JSON; FERRY_ESYS with the reason. */
int ferry__profile_trace_write(ferry__profile *p, const char *path);

/* The histogram bucket of a time in ns (see ferry_profile_stage). */
static inline int ferry__profile_bucket(uint64_t ns)
{
    if (ns < 1024)
        return 0;
    int m = 63 - __builtin_clzll(ns); /* >= 10 */
    int i = 1 + (m - 10) * 4 + (int)((ns >> (m - 2)) & 3);
    return i < FERRY_PROFILE_BUCKETS ? i : FERRY_PROFILE_BUCKETS - 1;
}

#endif
