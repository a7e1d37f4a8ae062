/*
 * batch.c - ferry_batch: zero-copy views of a received BATCH (see batch.h).
 */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"

/* Points every field at its bytes, in the frame when aligned, else in one
 * aligned copy holding all fields. */
static int place_fields(ferry_batch *b, const ferry__batch_hdr *h)
{
    const unsigned char *base = zmq_msg_data(&b->payload);
    int aligned = 1;
    size_t total = 0;
    for (uint32_t f = 0; f < h->nfields; f++) {
        if ((uintptr_t)(base + h->fields[f].offset) % FERRY__ALIGN)
            aligned = 0;
        total += FERRY__ROUND_UP(h->fields[f].nbytes, FERRY__FIELD_ALIGN);
    }
    unsigned char *dst = NULL;
    if (!aligned) {
        dst = ferry__aligned_alloc(FERRY__FIELD_ALIGN, total ? total : 64);
        if (!dst)
            return FERRY_ENOMEM;
        b->copy = dst;
        b->realigned = 1;
    }
    for (uint32_t f = 0; f < h->nfields; f++) {
        const ferry__field_desc *d = &h->fields[f];
        ferry_tensor *t = &b->fields[f];
        memcpy(b->names[f], d->name, FERRY_NAME_MAX);
        t->name = b->names[f];
        t->dtype = d->dtype;
        t->ndim = d->ndim;
        memcpy(t->shape, d->shape, sizeof t->shape);
        t->nbytes = d->nbytes;
        if (aligned) {
            t->data = base + d->offset;
        } else {
            memcpy(dst, base + d->offset, d->nbytes);
            t->data = dst;
            dst += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
        }
    }
    b->nfields = (int)h->nfields;
    return FERRY_OK;
}

int ferry__batch_new(ferry_batch **out, const ferry__batch_hdr *h, zmq_msg_t *payload,
                     const ferry_batch_info *info, const uint64_t *indices)
{
    ferry_batch *b = ferry__calloc(1, sizeof *b + (size_t)info->size * sizeof(uint64_t));
    if (!b)
        return FERRY_ENOMEM;
    b->info = *info;
    memcpy(b->indices, indices, (size_t)info->size * sizeof(uint64_t));
    zmq_msg_init(&b->payload);
    zmq_msg_move(&b->payload, payload);
    if (place_fields(b, h) != FERRY_OK) {
        zmq_msg_move(payload, &b->payload); /* hand the frame back untouched */
        zmq_msg_close(&b->payload);
        free(b);
        return FERRY_ENOMEM;
    }
    *out = b;
    return FERRY_OK;
}

void ferry_batch_get_info(const ferry_batch *b, ferry_batch_info *info)
{
    if (b && info)
        *info = b->info;
}

const uint64_t *ferry_batch_indices(const ferry_batch *b)
{
    return b ? b->indices : NULL;
}

int ferry_batch_nfields(const ferry_batch *b)
{
    return b ? b->nfields : 0;
}

int ferry_batch_field_at(const ferry_batch *b, int i, ferry_tensor *t)
{
    if (!b || !t || i < 0 || i >= b->nfields)
        return ferry__seterr(FERRY_EINVAL, "field number %d does not exist (batch has %d)", i,
                             b ? b->nfields : 0);
    *t = b->fields[i];
    return FERRY_OK;
}

int ferry_batch_field(const ferry_batch *b, const char *name, ferry_tensor *t)
{
    if (!b || !name || !t)
        return ferry__seterr(FERRY_EINVAL, "batch, name and tensor must not be NULL");
    for (int i = 0; i < b->nfields; i++) {
        if (strcmp(b->names[i], name) == 0) {
            *t = b->fields[i];
            return FERRY_OK;
        }
    }
    return ferry__seterr(FERRY_EINVAL, "batch has no field '%s'", name);
}

void ferry_batch_release(ferry_batch *b)
{
    if (!b)
        return;
    zmq_msg_close(&b->payload);
    free(b->copy);
    free(b);
}
