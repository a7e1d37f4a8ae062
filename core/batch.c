/*
 * batch.c - ferry_batch: views over a backing (see batch.h).
 */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "shm.h"

static int all_aligned(const ferry_tensor *fields, int nfields)
{
    for (int f = 0; f < nfields; f++) {
        if ((uintptr_t)fields[f].data % FERRY__ALIGN)
            return 0;
    }
    return 1;
}

/* Copies every field into one aligned block, keeping the wire spacing. */
static int copy_aligned(ferry_batch *b)
{
    size_t total = 0;
    for (int f = 0; f < b->nfields; f++)
        total += FERRY__ROUND_UP(b->fields[f].nbytes, FERRY__BATCH_FIELD_SPACING);
    unsigned char *dst = ferry__aligned_alloc(FERRY__BATCH_FIELD_SPACING, total ? total : 64);
    if (!dst)
        return FERRY_ENOMEM;
    b->copy = dst;
    for (int f = 0; f < b->nfields; f++) {
        memcpy(dst, b->fields[f].data, b->fields[f].nbytes);
        b->fields[f].data = dst;
        dst += FERRY__ROUND_UP(b->fields[f].nbytes, FERRY__BATCH_FIELD_SPACING);
    }
    b->realigned = 1;
    return FERRY_OK;
}

int ferry__batch_new(ferry_batch **out, const ferry_tensor *fields, int nfields,
                     const ferry_batch_info *info, const uint64_t *indices,
                     ferry__batch_backing backing)
{
    size_t nidx = (size_t)info->size, nf = (size_t)nfields;
    ferry_batch *b = ferry__calloc(1, sizeof *b + nidx * sizeof(uint64_t) +
                                          nf * (sizeof(ferry_tensor) + FERRY_NAME_MAX));
    if (!b)
        return FERRY_ENOMEM;
    b->fields = (ferry_tensor *)(b->indices + nidx);
    b->names = (char (*)[FERRY_NAME_MAX])(b->fields + nf);
    b->info = *info;
    memcpy(b->indices, indices, (size_t)info->size * sizeof(uint64_t));
    b->nfields = nfields;
    for (int f = 0; f < nfields; f++) {
        b->fields[f] = fields[f];
        size_t len = strnlen(fields[f].name, FERRY_NAME_MAX - 1);
        memcpy(b->names[f], fields[f].name, len);
        b->names[f][len] = '\0';
        b->fields[f].name = b->names[f];
    }
    if (!all_aligned(fields, nfields)) {
        if (copy_aligned(b) != FERRY_OK) {
            free(b);
            return FERRY_ENOMEM;
        }
        backing.release(backing.ctx); /* everything is in the copy now */
        backing.release = NULL;
    }
    b->backing = backing;
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

int ferry_batch_slot(const ferry_batch *b, void **data, size_t *len)
{
    if (!b || !data || !len)
        return ferry__seterr(FERRY_EINVAL, "batch, data and len must not be NULL");
    if (b->backing.release != ferry__shm_release)
        return ferry__seterr(FERRY_EINVAL, "the batch is not in a shared-memory slot (it came %s)",
                             b->realigned ? "realigned, as a copy" : "by message");
    ferry__shm_range(b->backing.ctx, data, len);
    return FERRY_OK;
}

void ferry_batch_release(ferry_batch *b)
{
    if (!b)
        return;
    if (b->backing.release)
        b->backing.release(b->backing.ctx);
    free(b->copy);
    free(b);
}
