/*
 * feed.h - the batches a trainer feeds (option feed_batches): which indices
 * each stream position holds, from the trainer's ferry_loader_feed() until
 * the scheduler takes the position out as a task.
 *
 * Position in the data flow: beside the sampler. With a feed, the window's
 * sampler runs over the epoch's batch positions (one each, in order) and
 * the feed says what each stands for. Positions are fed in order, with no
 * gap; a position fed already, or before the feed's start (a resume), is
 * skipped, so a trainer may feed an epoch again from its start. A whole
 * feed is checked before any of it is kept: a bad one changes nothing.
 * Taken positions are forgotten at the next feed, so a long run keeps only
 * what lies between the window and the trainer's lead.
 *
 * Threads: none of its own; the window calls it under its mutex.
 */
#ifndef FERRY_CORE_FEED_H
#define FERRY_CORE_FEED_H

#include <stdint.h>

typedef struct ferry__feed {
    uint32_t max;   /* indices a batch may hold (batch_size) */
    uint64_t items; /* every index is below this (the dataset's length) */
    /* Positions first .. end-1 are kept, count[k] indices each from off[k]
     * in idx; those below next were taken. */
    uint64_t first, next, end;
    uint32_t *count;
    uint64_t *off, *idx;
    uint64_t rows_cap, idx_len, idx_cap;
} ferry__feed;

/* An empty feed whose first position is start, of batches of 1..max
 * indices below items. */
void ferry__feed_init(ferry__feed *f, uint32_t max, uint64_t items, uint64_t start);
void ferry__feed_free(ferry__feed *f);

/* Keeps positions first_seq .. first_seq+n-1 (counts[k] indices each, one
 * batch after another in indices[]) up to stop (the stream's end):
 * FERRY_OK, or FERRY_EINVAL (a gap, a count out of 1..max), FERRY_ERANGE
 * (an index past items), FERRY_ENOMEM, each with its detail, and nothing
 * kept. */
int ferry__feed_add(ferry__feed *f, uint64_t first_seq, uint64_t n, const uint32_t *counts,
                    const uint64_t *indices, uint64_t stop);

/* Whether position seq (the next to take) was fed. */
static inline int ferry__feed_has(const ferry__feed *f, uint64_t seq)
{
    return seq < f->end;
}

/* Takes position seq (fed, and the next in order): its indices into out
 * (room for max), and their number. */
uint32_t ferry__feed_take(ferry__feed *f, uint64_t seq, uint64_t *out);

#endif
