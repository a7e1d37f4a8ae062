/*
 * batch.h - a delivered batch: named views over bytes that live somewhere
 * else (the backing).
 *
 * Position in the data flow: last. The scheduler makes a ferry_batch from
 * the fields of a reply (name, dtype, shape, pointer) and the thing their
 * bytes live in, with the function that gives it back: a received ZeroMQ
 * message (transport/zsock.h), or the shared-memory slot a local worker
 * wrote the batch into (transport/shm.h), without any user of batches
 * knowing which. The trainer reads views
 * and releases the batch, which releases the backing.
 *
 * Alignment: every field's data is at least FERRY__ALIGN aligned. When a
 * field's bytes do not sit on such a boundary where they arrived (the
 * producer guessed the receiver's buffer alignment wrong), all fields are
 * copied once into one aligned block, the backing is given back at once, and
 * `realigned` says so.
 *
 * Thread safety: a batch is owned by one thread at a time; release from any.
 */
#ifndef FERRY_CORE_BATCH_H
#define FERRY_CORE_BATCH_H

#include "ferry.h"

#define FERRY__ALIGN 16
/* Copies keep fields this far apart, like the wire layout does. */
#define FERRY__BATCH_FIELD_SPACING 64

/* Where a batch's bytes live, and how to give them back. */
typedef struct ferry__batch_backing {
    void (*release)(void *ctx);
    void *ctx;
} ferry__batch_backing;

struct ferry_batch {
    ferry_batch_info info;
    int nfields;
    int realigned;
    int shared; /* its fields are in a shared-memory slot */
    ferry__batch_backing backing; /* release == NULL once given back */
    void *copy;                   /* aligned copy, when realigned */
    uint64_t arrived_ns;          /* when the loader received it */
    /* In the same allocation, after indices: sized to the batch, so a
     * small batch is a small allocation (a 16-field table would make every
     * batch 3 KB, past malloc's per-thread caches). */
    ferry_tensor *fields;          /* nfields */
    char (*names)[FERRY_NAME_MAX]; /* nfields */
    uint64_t indices[];            /* info.size entries */
};

/* Builds a batch from nfields (1..FERRY_MAX_FIELDS) field views whose data
 * lies in `backing`. Names are copied; indices (info->size of them) are
 * copied. On success the batch owns the backing (released with the batch,
 * or at once when the fields were realigned); on failure (FERRY_ENOMEM)
 * nothing is released and the caller still owns it. */
int ferry__batch_new(ferry_batch **out, const ferry_tensor *fields, int nfields,
                     const ferry_batch_info *info, const uint64_t *indices,
                     ferry__batch_backing backing);

#endif
