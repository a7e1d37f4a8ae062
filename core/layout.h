/*
 * layout.h - where a batch's fields lie in the bytes it is built in: a pure
 * function of the dataset's schema, the item count and where those bytes
 * start, shared by every worker (worker.c) and tested by itself
 * (tests/test_layout.c).
 *
 * Every field starts at a FERRY__FIELD_ALIGN (64-byte) boundary counted
 * from the lead: the distance from the bytes' start to the first such
 * boundary in this process's memory, so each field is aligned where it is
 * written (see worker.c for why the receiver sees the same alignment).
 * Fixed fields come first, in schema order, each item_bytes * count long;
 * fields of variable shape (FERRY_NDIM_VAR) follow once the dataset has
 * said their shapes, in schema order.
 */
#ifndef FERRY_CORE_LAYOUT_H
#define FERRY_CORE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "ferry_dataset.h"
#include "protocol.h"

/* How far from base the first 64-byte boundary is. */
size_t ferry__layout_lead(const void *base);

/* The bytes the fixed fields of a batch of `count` items take from a
 * 64-byte boundary: each rounded up to FERRY__FIELD_ALIGN. item_bytes is at
 * most 1 GiB and count at most FERRY__MAX_BATCH: nothing overflows. */
size_t ferry__layout_fixed_bytes(const ferry_dataset_schema *s, const size_t *item_bytes,
                                 uint32_t count);

/* The bytes a payload frame for `count` items needs: room for any lead,
 * then the fixed fields. */
size_t ferry__layout_frame_bytes(const ferry_dataset_schema *s, const size_t *item_bytes,
                                 uint32_t count);

/* Whether a batch of `count` items fits in `cap` bytes at base (the fixed
 * fields; the variable ones are placed, or moved, once filled). */
int ferry__layout_fits(const ferry_dataset_schema *s, const size_t *item_bytes, uint32_t count,
                       const void *base, size_t cap);

/* Fills h's field table (names, dtypes, shapes, offsets from base, sizes)
 * for `count` items laid out from the lead of base, and h->count,
 * h->nfields; the rest of h is zeroed. A variable field gets var = 1 and
 * its place later (ferry__layout_var). */
void ferry__layout_fixed(const ferry_dataset_schema *s, const size_t *item_bytes, uint32_t count,
                         const void *base, ferry__batch_hdr *h);

/* The variable fields' shapes and sizes as the dataset filled them
 * (var[f] for each variable field f) into h, and *total, the bytes they
 * take each from a 64-byte boundary. FERRY_EBATCH, with why written, when
 * the dataset gave something no batch may hold (no data, a dim < 1, more
 * than FERRY_MAX_DIMS dims, more bytes than memory holds). */
int ferry__layout_var_sizes(ferry__batch_hdr *h, const ferry_var_field *var, size_t *total,
                            char *why, size_t cap);

/* Places the variable fields one after another from offset `end` (a
 * 64-byte boundary from the same base as the fixed ones); returns where
 * the last one ends. */
size_t ferry__layout_place_var(ferry__batch_hdr *h, size_t end);

#endif
