/*
 * retire.h - when a local worker process leaves on its own: its private
 * memory past a budget (option worker_max_rss_bytes), or its count of
 * batches reached (option max_batches_per_worker).
 *
 * Position in the data flow: inside the worker loop, after each task is
 * answered. Memory that only grows (a third-party decoder that leaks, a
 * cache nobody bounds) is given back the only way that always works: the
 * process ends and the loader starts another in its place, through the
 * path that replaces a dead worker. The worker finishes and sends the
 * batch it is on, says BYE with the reason (ferry__bye), and exits; the
 * tasks still queued at it were never started, and the loader sends them
 * again. So a retirement is between batches: nothing is lost, nothing
 * delivered twice, and the memory stays within the budget plus one
 * batch's growth.
 *
 * What is measured is the worker's private resident memory: the resident
 * pages of /proc/self/statm less its shared ones, which is the kernel's
 * RssAnon (heap, stacks, private copies). The data files it maps and the
 * batch slots it writes are shared and page cache: counting them would
 * retire a healthy worker over memory that a new process would map again
 * at once. Reading statm is one pread on an fd kept open: a few
 * microseconds a batch.
 *
 * Threads: one worker's, touched only by its main loop.
 */
#ifndef FERRY_CORE_RETIRE_H
#define FERRY_CORE_RETIRE_H

#include <stdint.h>

#include "protocol.h"

typedef struct ferry__retire {
    uint64_t max_rss;     /* bytes; 0: no budget */
    uint64_t max_batches; /* 0: no limit */
    uint64_t batches;     /* tasks answered in this session */
    uint64_t rss;         /* private resident bytes at the last look */
    int statm_fd;         /* /proc/self/statm while there is a budget, else -1 */
} ferry__retire;

/* No limits, nothing open. */
void ferry__retire_init(ferry__retire *r);

/* Sets the limits CONFIG gave (0: none) and starts the session's count
 * again. FERRY_ESYS (with detail) when a budget is set and statm cannot
 * be opened; the limits are then left unset. */
int ferry__retire_set(ferry__retire *r, uint64_t max_rss, uint64_t max_batches);

/* Called once a task is answered: counts it and says whether the worker
 * should now retire, and why (r->rss and r->batches hold the figures).
 * A failed read of statm retires no one. */
ferry__retire_reason ferry__retire_after_task(ferry__retire *r);

/* Closes what ferry__retire_set opened. */
void ferry__retire_close(ferry__retire *r);

/* This process's private resident memory in bytes (statm's resident less
 * shared pages), read through fd, an open /proc/self/statm. FERRY_ESYS. */
int ferry__private_rss(int fd, uint64_t *bytes);

#endif
