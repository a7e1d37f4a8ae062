/*
 * feed.c - the batches a trainer feeds (see feed.h).
 */
#include "feed.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

void ferry__feed_init(ferry__feed *f, uint32_t max, uint64_t items, uint64_t start)
{
    memset(f, 0, sizeof *f);
    f->max = max;
    f->items = items;
    f->first = f->next = f->end = start;
}

void ferry__feed_free(ferry__feed *f)
{
    free(f->count);
    free(f->off);
    free(f->idx);
    memset(f, 0, sizeof *f);
}

/* Drops the positions taken already (below next) from the front. */
static void compact(ferry__feed *f)
{
    uint64_t gone = f->next - f->first;
    if (gone == 0)
        return;
    uint64_t keep = f->end - f->next;
    uint64_t idx_from = keep ? f->off[gone] : f->idx_len;
    memmove(f->count, f->count + gone, keep * sizeof *f->count);
    for (uint64_t k = 0; k < keep; k++)
        f->off[k] = f->off[gone + k] - idx_from;
    memmove(f->idx, f->idx + idx_from, (f->idx_len - idx_from) * sizeof *f->idx);
    f->idx_len -= idx_from;
    f->first = f->next;
}

/* *p with room for `need` items of `size` bytes (doubling); -1: no memory. */
static int grow(void *p, uint64_t *cap, uint64_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    uint64_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*(void **)p, (size_t)(c * size));
    if (!q)
        return -1;
    *(void **)p = q;
    *cap = c;
    return 0;
}

int ferry__feed_add(ferry__feed *f, uint64_t first_seq, uint64_t n, const uint32_t *counts,
                    const uint64_t *indices, uint64_t stop)
{
    if (first_seq > f->end)
        return ferry__seterr(FERRY_EINVAL, "fed batch %llu, but batch %llu is the next to feed "
                                           "(batches are fed in order, none left out)",
                             (unsigned long long)first_seq, (unsigned long long)f->end);
    uint64_t total = 0;
    for (uint64_t k = 0; k < n; k++) {
        if (counts[k] == 0 || counts[k] > f->max)
            return ferry__seterr(FERRY_EINVAL, "fed batch %llu has %u indices, not 1..%u "
                                               "(batch_size)",
                                 (unsigned long long)(first_seq + k), counts[k], f->max);
        total += counts[k];
    }
    for (uint64_t i = 0; i < total; i++)
        if (indices[i] >= f->items)
            return ferry__seterr(FERRY_ERANGE, "a fed batch has index %llu, but the dataset has "
                                               "%llu items",
                                 (unsigned long long)indices[i], (unsigned long long)f->items);
    /* What was fed already (or lies before the start) is skipped, and what
     * lies past the stream's end is not needed. */
    uint64_t from = f->end - first_seq;
    uint64_t to = stop <= first_seq ? 0 : stop - first_seq < n ? stop - first_seq : n;
    if (from >= to)
        return FERRY_OK;
    uint64_t skip_idx = 0, add_idx = 0;
    for (uint64_t k = 0; k < to; k++)
        *(k < from ? &skip_idx : &add_idx) += counts[k];
    compact(f);
    uint64_t rows = f->end - f->first + (to - from), count_cap = f->rows_cap;
    if (grow(&f->count, &count_cap, rows, sizeof *f->count) ||
        grow(&f->off, &f->rows_cap, rows, sizeof *f->off) ||
        grow(&f->idx, &f->idx_cap, f->idx_len + add_idx, sizeof *f->idx))
        return ferry__seterr(FERRY_ENOMEM, "out of memory keeping %llu fed batches",
                             (unsigned long long)rows);
    for (uint64_t k = from; k < to; k++) {
        uint64_t row = f->end - f->first;
        f->count[row] = counts[k];
        f->off[row] = f->idx_len;
        f->idx_len += counts[k];
        f->end++;
    }
    memcpy(f->idx + f->idx_len - add_idx, indices + skip_idx, add_idx * sizeof *f->idx);
    return FERRY_OK;
}

uint32_t ferry__feed_take(ferry__feed *f, uint64_t seq, uint64_t *out)
{
    uint64_t k = seq - f->first;
    uint32_t n = f->count[k];
    memcpy(out, f->idx + f->off[k], n * sizeof *out);
    f->next = seq + 1;
    return n;
}
