/*
 * window.h - the prefetch window: the batches in flight, their order, and
 * the loader's failure state.
 *
 * Position in the data flow: between the sampler and the trainer. The
 * scheduler takes tasks from the window (which draws them from the sampler
 * while fewer than `prefetch` are in flight), tells it which worker each
 * went to, and files each reply; ferry_loader_next() takes finished batches
 * out in sampler order (or completion order without in_order). Nothing here
 * knows of sockets, processes or the wire format: a test drives the window
 * by itself (tests/test_window.c).
 *
 * An entry is in exactly one list at a time:
 *   free -> (taken) -> sent to worker w [w's list, oldest first]
 *        -> done [done list, in completion order] -> free (delivered)
 * and a sent entry whose worker died goes to the resend list (lowest seq
 * first) until it is sent again. Lookups are O(1): a reply's task id names
 * its entry, each worker's list gives its oldest task, and with in_order the
 * entry of seq s is always slot s % entries (the seqs in flight are then
 * one contiguous run no longer than the window).
 *
 * Threads: the scheduler thread and the trainer's thread. Everything the
 * two share (the free and done lists, counters, the phase) is under one
 * mutex; the condition variable wakes the trainer. Worker lists, the resend
 * list and the fields of an entry that is not done are the scheduler's
 * alone, so the lookups it makes per message take no lock.
 *
 * Invariants: in_flight (entries not free) <= prefetch; every such entry's
 * seq is in [start_seq + delivered, next_seq).
 */
#ifndef FERRY_CORE_WINDOW_H
#define FERRY_CORE_WINDOW_H

#include <stdint.h>

#include "ferry.h"
#include "flow.h"
#include "sampler.h"

/* The most batches a window holds (slots are numbered in the task id's low
 * bits). */
#define FERRY__WINDOW_MAX 1024

typedef struct ferry__window ferry__window;

typedef enum ferry__phase {
    FERRY__PHASE_STARTING = 0, /* waiting for workers; no sampler yet */
    FERRY__PHASE_RUNNING,
    FERRY__PHASE_FAILED, /* the first failure is kept; next() reports it */
} ferry__phase;

/* Counters kept beside the window's own, for ferry_loader_stats(). */
typedef enum ferry__stat {
    FERRY__STAT_MALFORMED,
    FERRY__STAT_STALE,
    FERRY__STAT_RESTARTS,
    FERRY__STAT_TIMEOUTS,
    FERRY__STAT_JOINED,
    FERRY__STAT_LOST,
    FERRY__STAT_REJECTED,
    FERRY__STAT_RETIREMENTS,
} ferry__stat;

typedef struct ferry__window_opts {
    uint32_t prefetch; /* 1..FERRY__WINDOW_MAX: the most in flight at first */
    uint32_t entries;  /* the most it may grow to (ferry__window_set_flow); 0: prefetch */
    uint32_t nworkers; /* worker indices are 0..nworkers-1 */
    int in_order;
    int epoch_barrier;     /* hold an epoch's first batch until it is asked for */
    uint32_t max_attempts; /* worker deaths a batch may cause before it is given up */
    ferry__sampler_opts sampler; /* its mix, if any, is the window's to free, even when
                                    ferry__window_new fails */
    /* feed_max > 0: the sampler runs over feed_batches positions per epoch
     * (batch_size 1), and a batch's indices, up to feed_max of them, are the
     * ones ferry__window_feed gave for its seq. */
    uint32_t feed_max;
    uint64_t feed_batches;
    const void *state; /* resume blob (copied), or NULL */
    size_t state_len;
} ferry__window_opts;

/* One batch in flight. The scheduler reads these fields of an entry it took
 * until the entry is done. */
typedef struct ferry__window_entry {
    ferry__sampler_task t;
    uint64_t id;       /* the task id on the wire: seq and slot */
    uint64_t *indices; /* t.count of them */
    int32_t worker;    /* the worker it was sent to; -1 while not with one */
    uint32_t attempts; /* workers that died while working on it */
    uint32_t sends;    /* times it was sent to a worker */
    int32_t avoid;     /* a worker whose dataset failed on it: not sent there again while
                          another can take it; -1: none */
    uint64_t sent_ns;  /* when it was last sent (the scheduler sets it) */
    int32_t shm_slot;  /* the batch slot sent with it (the scheduler's), -1: none */
    /* private to window.c */
    int state;
    int32_t prev, next;
    ferry_batch *batch;
    int err;
    char *errmsg;
} ferry__window_entry;

/* A window with every slot free, in the STARTING phase. FERRY_ENOMEM or
 * FERRY_EINVAL (prefetch out of range); *out untouched on failure. */
int ferry__window_new(ferry__window **out, const ferry__window_opts *o);

/* Frees the window and every batch and message still in it. */
void ferry__window_free(ferry__window *win);

/* Called by next() when the scheduler must look again: the window was full
 * and now has room, or (epoch barrier) an epoch's first batch is asked for. */
void ferry__window_set_wake(ferry__window *win, void (*wake)(void *), void *arg);

/* ---- phase and failure (any thread) ---- */

/* Builds the sampler for `n` items (and restores the resume position) and
 * starts running; on failure the window fails with that error, which is
 * returned. */
int ferry__window_start(ferry__window *win, uint64_t n);

/* Fails the loader with `code` and `msg` (NULL: this thread's last error),
 * unless it has failed already: the first cause is the one reported. */
void ferry__window_fail(ferry__window *win, int code, const char *msg);

ferry__phase ferry__window_phase(ferry__window *win);

/* The loader is open: every worker it waits for at the start is ready
 * (the window may have run since the first was). */
void ferry__window_open(ferry__window *win);

/* Whether ferry__window_open was called. */
int ferry__window_is_open(ferry__window *win);

/* Blocks until open or failed. FERRY_OK once open, else the failure's
 * code with its message as this thread's error detail. */
int ferry__window_wait_started(ferry__window *win);

/* ---- counters (any thread) ---- */

/* Adds one to counter `s`; returns its new value. */
uint64_t ferry__window_count(ferry__window *win, ferry__stat s);

/* Adds `delta` (+1, -1, or 0 just to read it) to the number of ready
 * workers; returns the new number. */
uint32_t ferry__window_add_workers(ferry__window *win, int delta);

void ferry__window_stats(ferry__window *win, ferry_stats *st);

/* Flow control's choice: the window's prefetch from now on (at most its
 * entries; a smaller one stops new tasks until enough are delivered), and
 * the credits and reasons that stats report. */
void ferry__window_set_flow(ferry__window *win, const ferry__flow_summary *fs);

/* Whether the window has no room for another task now. */
int ferry__window_full(ferry__window *win);

/* Whether every batch of the stream has been delivered (a stream with an
 * end: `epochs` or `max_batches`). */
int ferry__window_ended(ferry__window *win);

/* ---- the scheduler's side (its thread only) ---- */

/* The next entry to send: one waiting to be sent again (lowest seq) first,
 * else a new task from the sampler while the window has room (not past the
 * stream's end, and not an epoch's first batch the barrier holds back).
 * NULL when there is none, or when not running. The entry's indices are
 * filled. */
ferry__window_entry *ferry__window_take(ferry__window *win);

/* Entry e (from take) went to `worker` at `now_ms`. */
void ferry__window_sent(ferry__window *win, ferry__window_entry *e, uint32_t worker,
                        uint64_t now_ms);

/* Entry e (from take) could not be sent: it waits to be sent again. */
void ferry__window_unsent(ferry__window *win, ferry__window_entry *e);

/* The entry of task `id` if `worker` has it, else NULL (a reply to a task
 * given up on, re-sent elsewhere, or never sent). */
ferry__window_entry *ferry__window_find(ferry__window *win, uint32_t worker, uint64_t id);

/* Files entry e (sent to a worker) as done: with batch b (taken over), or
 * failed with `err` and `errmsg` (taken over; NULL when there was no memory
 * for it). `now_ms` starts the clock on the worker's next task. */
void ferry__window_complete(ferry__window *win, ferry__window_entry *e, ferry_batch *b, int err,
                            char *errmsg, uint64_t now_ms);

/* Entry e (sent to a worker) failed there in a way another worker may not
 * (a remote host's own copy of the data): it waits to be sent again, to
 * another worker when one can take it (e->avoid), charged an attempt. 0,
 * leaving e as it was, when it has no attempt left (max_attempts): the
 * caller then files the failure. `now_ms` as for ferry__window_complete. */
int ferry__window_retry(ferry__window *win, ferry__window_entry *e, uint64_t now_ms);

/* Tasks sent to `worker` and not answered. */
uint32_t ferry__window_outstanding(const ferry__window *win, uint32_t worker);

/* The task `worker` is on (its oldest unanswered one) and since when, or
 * NULL when it has none. */
const ferry__window_entry *ferry__window_current(const ferry__window *win, uint32_t worker,
                                                 uint64_t *since_ms);

/* Who pays for a worker's death. */
typedef enum ferry__charge {
    FERRY__CHARGE_NONE = 0, /* nobody: it said BYE, or died between tasks */
    FERRY__CHARGE_OLDEST,   /* its oldest task: the one a worker works on first */
    FERRY__CHARGE_TASK,     /* exactly task `id`, which it said it was building */
} ferry__charge;

/* Worker `worker` is gone: every task it had waits to be sent again. The
 * one charged (see ferry__charge; a task `id` it no longer has charges
 * nobody) is charged an attempt, and a batch that has now taken down
 * max_attempts workers is given up: it is delivered as FERRY_EBATCH naming
 * its indices and `death`. */
void ferry__window_requeue(ferry__window *win, uint32_t worker, ferry__charge charge, uint64_t id,
                           const char *death);

/* ---- the trainer's side ---- */

/* The next batch: FERRY_OK with *out, FERRY_EBATCH or FERRY_ERANGE for a
 * batch that failed (the next call goes on), FERRY_EOF at the end of the
 * stream, or the loader's failure. Waits while none is ready, at most
 * timeout_ms (negative: as long as it takes); FERRY_EAGAIN when none was
 * ready by then, with nothing changed. */
int ferry__window_next(ferry__window *win, ferry_batch **out, int64_t timeout_ms);

/* The rest of the epoch the trainer is in is never handed out: its next
 * batch is the next epoch's first. Batches of it that are done are
 * released now, those in flight when they come, and those not yet sent
 * are never made. *skipped: how many batches it passed over (0 at an
 * epoch's start). FERRY_EINVAL out of order. */
int ferry__window_skip_epoch(ferry__window *win, uint64_t *skipped);

int ferry__window_length(ferry__window *win, uint64_t *items, uint64_t *batches_per_epoch);

/* The trainer's feed (feed_max > 0): the indices of batches first_seq ..
 * first_seq+n-1, counts[k] of them each, one batch after another in
 * indices[]. Batches are fed in order; a seq fed already, or before the
 * start, is skipped. The whole feed is checked first (counts in
 * 1..feed_max, indices < the dataset's length): a bad one keeps nothing. */
int ferry__window_feed(ferry__window *win, uint64_t first_seq, uint64_t n, const uint32_t *counts,
                       const uint64_t *indices);

/* The resume blob for the position after the last batch delivered. */
int ferry__window_save(ferry__window *win, void *buf, size_t cap, size_t *len);
/* The same position at the start of epoch `epoch` (ferry_loader_state_at_epoch). */
int ferry__window_save_epoch(ferry__window *win, uint64_t epoch, void *buf, size_t cap,
                             size_t *len);

#endif
