/*
 * flow.h - flow control: how many tasks each worker may hold (its
 * credits) and how many batches the window keeps in flight, sized from
 * what the loader measures of each worker.
 *
 * A worker idles unless the tasks queued at it outlast the round trip of
 * a batch back and a new task out. That round trip is 0.1 ms for a local
 * worker and tens of ms for a remote host, so one number cannot serve
 * both: each worker's credits start at the automatic rule's (from the
 * batch size) and are raised to cover the round trip measured for that
 * worker, when a worker is seen to starve for want of them.
 *
 * What is measured, per worker, over periods of at least PERIOD_REPLIES
 * replies and PERIOD_MS:
 *   busy   the share of the period it spent building (sum of make_ns)
 *   m      its mean build time (make_ns)
 *   rtt    min over the period of flight_ns - make_ns: both transfers and
 *          the wait in its queue. A task that found the worker idle did
 *          not wait, so in a period in which the worker idled at all the
 *          minimum is the round trip itself (the larger of two such
 *          periods in a row: one in which the link changed mixes old and
 *          new); in a period of solid work it is only an upper bound (the
 *          queue), and is not taken.
 * Decisions, one per period at most:
 *   - window-bound (a quarter of the replies found the window full: the
 *     trainer, not the workers, sets the pace): nothing changes.
 *   - starving (busy < BUSY_ENOUGH) and need = 1 + ceil((rtt + m/4) / m)
 *     above its credits: raised to need, within the limits below. The
 *     next period checks that it helped; if busy did not rise the
 *     bottleneck is elsewhere (the link, the host) and the raise is taken
 *     back, with no new one for a hold time that doubles each time.
 *   - saturated at the automatic credits with batches of SLOW_MAKE_NS
 *     (20 ms) or more: one credit is tried, so that no task waits at the
 *     worker holding a batch slot's memory (a local round trip is 1-2%
 *     of such a batch). If busy falls (a remote worker), it is taken back
 *     and tried again later each time, as a probe below.
 *   - saturated (busy >= BUSY_ENOUGH) above the automatic credits: 30 s
 *     after a raise (doubling after a probe that hurt) one credit less is
 *     tried, and given back if busy falls; one that did not hurt is
 *     followed by another at once. Saturated, the measurements cannot
 *     tell a shorter round trip from a long queue, so only a probe finds
 *     that the round trip shrank.
 * The window is twice the sum of the ready workers' credits, never below
 * the automatic rule's window and never above the entries it has or the
 * batches that `memory` holds. Option values fixed by the user are kept
 * as they are. Nothing here knows of sockets or clocks: the scheduler
 * passes the times in, and tests/test_flow.c drives it with a simulated
 * worker and link.
 */
#ifndef FERRY_CORE_FLOW_H
#define FERRY_CORE_FLOW_H

#include <stdint.h>

typedef struct ferry__flow ferry__flow;

typedef struct ferry__flow_opts {
    uint32_t nworkers;
    uint32_t credits;      /* fixed by the user; 0: measured */
    uint32_t auto_credits; /* the automatic rule's: each worker's floor */
    uint32_t max_credits;
    uint32_t prefetch;    /* fixed by the user; 0: measured */
    uint32_t auto_window; /* the automatic rule's window: the floor */
    uint32_t max_window;  /* the window's entries: the ceiling */
    uint64_t memory;      /* bytes of batches the measured window may hold */
} ferry__flow_opts;

/* What the flow control chose, for ferry_stats (whys: FERRY_SIZED_*). */
typedef struct ferry__flow_summary {
    uint32_t window;
    uint32_t credits_min, credits_max; /* over the ready workers */
    uint32_t credits_why, window_why;
    uint32_t round_trip_us; /* the longest round trip measured, 0: none yet */
} ferry__flow_summary;

int ferry__flow_new(ferry__flow **out, const ferry__flow_opts *o);
void ferry__flow_free(ferry__flow *f);

/* A batch's bytes, once the schema says: the measured window holds at
 * most memory / bytes batches. */
void ferry__flow_batch_bytes(ferry__flow *f, uint64_t bytes);

/* Worker w became ready (again): the automatic credits and fresh
 * measurements. It counts toward the window until it leaves. slots: each
 * task sent to it holds a batch slot (a local worker) from the moment it
 * is sent, queued or not; only such a worker is tried below the automatic
 * credits, since a remote worker's queued task holds nothing here. */
void ferry__flow_join(ferry__flow *f, uint32_t w, uint64_t now_ns, int slots);
void ferry__flow_leave(ferry__flow *f, uint32_t w);

/* A batch from worker w arrived at now_ns: built in make_ns, sent
 * flight_ns ago; window_full: the window had no room at that moment.
 * Returns 1 when a credit or the window changed. */
int ferry__flow_reply(ferry__flow *f, uint32_t w, uint64_t now_ns, uint64_t make_ns,
                      uint64_t flight_ns, int window_full);

uint32_t ferry__flow_credits(const ferry__flow *f, uint32_t w);

/* The window flow control has sized now: the most batches in flight. */
uint32_t ferry__flow_window(const ferry__flow *f);

/* Worker w's round trip as last measured, in ms (rounded up); 0: none. */
uint32_t ferry__flow_round_trip_ms(const ferry__flow *f, uint32_t w);
void ferry__flow_summary_get(const ferry__flow *f, ferry__flow_summary *out);

#endif
