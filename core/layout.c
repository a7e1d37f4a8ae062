/*
 * layout.c - where a batch's fields lie (see layout.h).
 */
#include "layout.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "dataset.h"

size_t ferry__layout_lead(const void *base)
{
    return (FERRY__FIELD_ALIGN - (uintptr_t)base % FERRY__FIELD_ALIGN) % FERRY__FIELD_ALIGN;
}

size_t ferry__layout_fixed_bytes(const ferry_dataset_schema *s, const size_t *item_bytes,
                                 uint32_t count)
{
    size_t total = 0;
    for (int f = 0; f < s->nfields; f++)
        total += FERRY__ROUND_UP(item_bytes[f] * count, FERRY__FIELD_ALIGN);
    return total;
}

size_t ferry__layout_frame_bytes(const ferry_dataset_schema *s, const size_t *item_bytes,
                                 uint32_t count)
{
    return FERRY__FIELD_ALIGN + ferry__layout_fixed_bytes(s, item_bytes, count);
}

int ferry__layout_fits(const ferry_dataset_schema *s, const size_t *item_bytes, uint32_t count,
                       const void *base, size_t cap)
{
    return ferry__layout_lead(base) + ferry__layout_fixed_bytes(s, item_bytes, count) <= cap;
}

void ferry__layout_fixed(const ferry_dataset_schema *s, const size_t *item_bytes, uint32_t count,
                         const void *base, ferry__batch_hdr *h)
{
    size_t off = ferry__layout_lead(base);
    memset(h, 0, sizeof *h);
    h->count = count;
    h->nfields = (uint32_t)s->nfields;
    for (int f = 0; f < s->nfields; f++) {
        ferry__field_desc *d = &h->fields[f];
        memcpy(d->name, s->fields[f].name, FERRY_NAME_MAX);
        d->dtype = s->fields[f].dtype;
        if (s->fields[f].ndim == FERRY_NDIM_VAR) {
            d->var = 1;
            continue;
        }
        d->ndim = s->fields[f].ndim + 1;
        d->shape[0] = count;
        memcpy(&d->shape[1], s->fields[f].shape, sizeof(int64_t) * (size_t)s->fields[f].ndim);
        d->offset = off;
        d->nbytes = item_bytes[f] * count;
        off += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
    }
}

int ferry__layout_var_sizes(ferry__batch_hdr *h, const ferry_var_field *var, size_t *total,
                            char *why, size_t cap)
{
    *total = 0;
    for (uint32_t f = 0; f < h->nfields; f++) {
        if (!h->fields[f].var)
            continue;
        const ferry_var_field *v = &var[f];
        ferry__field_desc *d = &h->fields[f];
        size_t n = 0;
        int ok = v->data != NULL && v->ndim >= 1 && v->ndim <= FERRY_MAX_DIMS;
        for (int k = 0; ok && k < v->ndim; k++)
            ok = v->shape[k] >= 1;
        if (ok)
            ok = ferry__shape_bytes(ferry_dtype_size(d->dtype), v->shape, v->ndim, &n) == 0 &&
                 n <= SIZE_MAX / 2;
        if (!ok) {
            snprintf(why, cap,
                     "field '%s' of variable shape: the dataset gave %s (%d dims; 1..%d dims, "
                     "each >= 1, are allowed)",
                     d->name, v->data ? "a shape no batch can hold" : "no data", v->ndim,
                     FERRY_MAX_DIMS);
            return FERRY_EBATCH;
        }
        d->ndim = v->ndim;
        memcpy(d->shape, v->shape, sizeof d->shape[0] * (size_t)v->ndim);
        d->nbytes = n;
        *total += FERRY__ROUND_UP(n, FERRY__FIELD_ALIGN);
        if (*total > SIZE_MAX / 2) {
            snprintf(why, cap, "the fields of variable shape add up to more than memory holds");
            return FERRY_EBATCH;
        }
    }
    return FERRY_OK;
}

size_t ferry__layout_place_var(ferry__batch_hdr *h, size_t end)
{
    for (uint32_t f = 0; f < h->nfields; f++) {
        ferry__field_desc *d = &h->fields[f];
        if (!d->var)
            continue;
        d->offset = end;
        end += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
    }
    return end;
}
