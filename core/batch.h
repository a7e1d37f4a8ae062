/*
 * batch.h - a delivered batch: views into the received payload frame.
 *
 * Position in the data flow: last. The scheduler makes a ferry_batch from a
 * BATCH message and its payload frame (taking the frame, so the tensors'
 * bytes are never copied); the trainer reads views and releases it. When a
 * field's bytes do not sit at a 16-byte boundary in the received frame (the
 * worker guessed the receiver's buffer alignment wrong), they are copied once
 * into an aligned block, and `realigned` says so.
 *
 * Thread safety: a batch is owned by one thread at a time; release from any.
 */
#ifndef FERRY_CORE_BATCH_H
#define FERRY_CORE_BATCH_H

#include <zmq.h>

#include "ferry.h"
#include "protocol.h"

#define FERRY__ALIGN 16

struct ferry_batch {
    ferry_batch_info info;
    int nfields;
    int realigned;
    ferry_tensor fields[FERRY_MAX_FIELDS];
    char names[FERRY_MAX_FIELDS][FERRY_NAME_MAX];
    zmq_msg_t payload;
    void *copy;         /* aligned copy, when realigned */
    uint64_t indices[]; /* info.size entries */
};

/* Builds a batch from a checked header (ferry__msg_check_payload passed) and
 * its payload frame, which it takes over on success (left to the caller on
 * failure). indices: the task's info.size indices, copied. FERRY_ENOMEM on
 * failure. */
int ferry__batch_new(ferry_batch **out, const ferry__batch_hdr *h, zmq_msg_t *payload,
                     const ferry_batch_info *info, const uint64_t *indices);

#endif
