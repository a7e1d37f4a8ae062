/*
 * sampler.h - the index stream: which sample indices make up batch `seq`.
 *
 * Position in the data flow: first. The scheduler asks for task `seq`, then
 * for its indices, and sends them to a worker. The stream is a pure function
 * of (dataset length, options, seq): no I/O, no state that changes, so the
 * whole position of a loader is one integer and resume is exact.
 *
 * Order within an epoch: a keyed bijection on [0, n) (a Feistel network with
 * cycle-walking), keyed by (seed, epoch); identity when shuffle is off.
 * Sharding: rank r of world_size w takes positions r, r+w, r+2w, ... of the
 * epoch's order. With pad_shards (the default unless drop_last), as torch's
 * DistributedSampler: per_rank = ceil(n / w), and a position p >= n stands
 * for position p - n (the order repeated from its start), so every item is
 * served each epoch and every rank has the same number of batches. Without:
 * per_rank = n / w (the n % w left over are dropped, no index is shared).
 * Batching: per_rank items cut into batches of batch_size; the last one is
 * short unless drop_last.
 *
 * Resume, also into another shape. A position blob says how much of one
 * epoch's global order the whole job has consumed: in synchronous training
 * every rank has taken k batches of B, so positions [0, P) with P = k*B*W
 * of that epoch's order are done, whatever rank saved the blob. A sampler
 * restored from it starts with the epoch's "head": the rest P..n-1 of the
 * order, sharded over this sampler's world_size W' (rank r' takes P+r',
 * P+r'+W', ...), cut into batches of its batch_size, with its padding rule
 * at the end (padded: ceil((n-P)/W') each, positions past n repeat the
 * order's start; not padded: floor((n-P)/W') each). The head's batches sit
 * at the end of the epoch's seq range (batch_in_epoch bpe-h .. bpe-1 for a
 * head of h batches), so epoch = seq / batches_per_epoch holds everywhere
 * and later epochs are exactly a fresh run's. In the same shape the head is
 * the plain stream from batch k on: one code path. A fresh sampler's head
 * is epoch 0 from position 0, i.e. no head at all.
 *
 * Thread safety: a sampler is written by ferry__sampler_init and
 * ferry__sampler_restore, before it is shared; after that any thread may
 * call the const functions at once.
 */
#ifndef FERRY_SAMPLER_H
#define FERRY_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "mix.h"

typedef struct ferry__sampler_opts {
    uint64_t batch_size; /* >= 1 */
    int drop_last;
    int shuffle;
    uint64_t seed;
    uint32_t rank;        /* < world_size */
    uint32_t world_size;  /* >= 1 */
    int pad_shards;       /* ceil(n / w) per rank, as above; ignored with drop_last */
    uint64_t epochs;      /* 0 = no limit */
    uint64_t max_batches; /* 0 = no limit */
    /* Several sources drawn by weight (mix.h), or NULL. Not owned: it must
     * outlive every sampler made with it. The order is then the mix's
     * draw, `length` positions an epoch, over indices < its total. */
    const ferry__mix *mix;
} ferry__sampler_opts;

typedef struct ferry__sampler {
    uint64_t n; /* positions in an epoch's order: the dataset's length, or the mix's */
    ferry__sampler_opts o;
    /* derived at init */
    uint64_t per_rank;          /* items this rank sees per epoch */
    uint64_t batches_per_epoch; /* >= 1 */
    uint64_t end_seq;           /* first seq past the end; UINT64_MAX if endless */
    unsigned half_bits;         /* Feistel half width; domain is 2^(2*half_bits) */
    int pad;                    /* the padding rule (pad_shards and not drop_last), which a
                                   head applies even where n % world_size == 0 */
    /* The head (see above): epoch head_epoch's batches from head_first on
     * serve its positions head_pos.. (head_per_rank items on this rank). */
    uint64_t head_epoch;
    uint64_t head_pos;
    uint64_t head_first;
    uint64_t head_per_rank;
} ferry__sampler;

/* One batch's place in the stream. */
typedef struct ferry__sampler_task {
    uint64_t seq;
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint32_t count; /* items in the batch, 1..batch_size */
    int last_in_epoch;
} ferry__sampler_task;

/* Validates the options against n and fills *s. FERRY_EINVAL with a detail
 * (ferry__seterr) when n == 0, batch_size == 0, batch_size > UINT32_MAX,
 * world_size == 0, rank >= world_size, n < world_size, or drop_last leaves no
 * batch; with a mix, also when n is not the total of its sources. *s is
 * untouched on failure. */
int ferry__sampler_init(ferry__sampler *s, uint64_t n, const ferry__sampler_opts *o);

/* The task at `seq`: FERRY_OK, or FERRY_EOF when seq >= end_seq. Seqs
 * below ferry__sampler_start() are not part of a resumed stream (those of
 * the head's epoch give the plain stream's tasks; nothing asks for them).
 * (Named _at, not _task: ferry__sampler_task is the struct's typedef.) */
int ferry__sampler_at(const ferry__sampler *s, uint64_t seq, ferry__sampler_task *t);

/* Writes t->count indices of task t into out[]. */
void ferry__sampler_indices(const ferry__sampler *s, const ferry__sampler_task *t, uint64_t *out);

/* The epoch's order: position i (< n) of `epoch` -> a sample index. A
 * bijection on [0, n) for every (seed, epoch); the identity without shuffle.
 * With a mix, its draw at epoch * n + i. */
uint64_t ferry__sampler_permute(const ferry__sampler *s, uint64_t epoch, uint64_t i);

/* The first seq of the stream: the head's first batch (0 for a fresh one). */
uint64_t ferry__sampler_start(const ferry__sampler *s);

/* Position blobs: at most FERRY_STATE_MAX bytes. The blob holds the epoch of
 * next_seq and the global position P reached in its order, the fingerprint
 * of the order (n, seed, shuffle) and, to check and explain, the saver's
 * world_size, batch_size, rank, batch_in_epoch and flags. Not epochs or
 * max_batches, which only say where the stream ends. */
int ferry__sampler_save(const ferry__sampler *s, uint64_t next_seq, void *buf, size_t cap,
                        size_t *len);
/* Sets s's head from the blob and *next_seq to its first seq. Reads version
 * 2 blobs and version 1 (ferry before reshaping; its next_seq is turned into
 * the same global position). FERRY_ESTATE (with detail) if the blob is
 * malformed or was saved for another order (dataset length, seed, shuffle);
 * world_size, rank, batch_size, drop_last and pad_shards may differ. *s and
 * *next_seq are untouched on failure. */
int ferry__sampler_restore(ferry__sampler *s, const void *buf, size_t len, uint64_t *next_seq);

/* The blob of an epoch's start (a version 2 one, at position 0, not of a
 * mix) for a dataset of n items: an epoch's order is a function of (seed,
 * epoch, n) alone, so it is that epoch's start over the n items (the
 * dataset grew or shrank between epochs, as a replay buffer does).
 * FERRY_ESTATE when the blob is not such a start, or is malformed. out
 * holds len bytes (it may be buf). */
int ferry__sampler_state_resize(const void *buf, size_t len, uint64_t n, void *out);

/* FERRY_OK when the `count` blobs are each valid and say the same thing:
 * one order, one shape, one position (what the ranks of one synchronous job
 * save at the same step), from distinct ranks. FERRY_ESTATE naming the first
 * blob that differs and how; FERRY_EINVAL for count 0. */
int ferry__sampler_states_agree(const void *const *bufs, const size_t *lens, size_t count);

#endif
