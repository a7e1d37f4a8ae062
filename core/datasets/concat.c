/*
 * concat.c - several datasets end to end, as one: what the option `mix`
 * draws from when the sources are C datasets (ferry.Mix of spec strings).
 *
 * Spec: concat:SPEC|SPEC|...  (2..FERRY__MIX_SOURCES_MAX specs of any
 * kind but concat itself, separated by '|', which no spec of theirs may
 * hold). Source k's items are indices offset[k] .. offset[k] + length[k] - 1,
 * in the order given. Every source must have the same schema (field names,
 * dtypes and shapes, all of fixed shape): a batch holds items of several.
 *
 * A batch is built source by source: the indices of each source are
 * gathered (in the batch's order), the source fills scratch buffers of its
 * own, and its rows are copied to their places in the batch. A batch of one
 * source only is filled in place, without the copy. A source's failure is
 * reported with the batch's index, and the source named.
 *
 * Threads: the handle belongs to one worker, as every dataset's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"
#include "mix.h"

#define CONCAT_SEP '|'

typedef struct concat {
    uint32_t k;
    ferry__dataset *src; /* k open datasets */
    uint64_t *offset;    /* k + 1: offset[k] is the total */
    /* per call: the batch grouped by source (local indices, their places
     * in the batch, each one's source), group starts, and scratch */
    uint64_t *local;
    uint32_t *where, *src_of;
    size_t cap;      /* of local, where and src_of */
    uint32_t *start; /* k + 1 */
    void *scratch[FERRY_MAX_FIELDS];
    size_t scratch_cap[FERRY_MAX_FIELDS];
} concat;

static void concat_close(void *handle)
{
    concat *c = handle;

    if (!c)
        return;
    for (uint32_t i = 0; c->src && i < c->k; i++)
        ferry__dataset_close(&c->src[i]);
    for (int f = 0; f < FERRY_MAX_FIELDS; f++)
        free(c->scratch[f]);
    free(c->src);
    free(c->offset);
    free(c->local);
    free(c->where);
    free(c->src_of);
    free(c->start);
    free(c);
}

/* Source i's schema is source 0's: names, dtypes, shapes, all fixed. */
static int same_schema(const concat *c, uint32_t i, char *errbuf, size_t errlen)
{
    const ferry_dataset_schema *a = &c->src[0].schema, *b = &c->src[i].schema;

    if (a->nfields != b->nfields)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "concat: source %lu has %d fields, source 0 has %d: the "
                                  "sources must have the same fields",
                                  (unsigned long)i, b->nfields, a->nfields);
    for (int f = 0; f < a->nfields; f++) {
        const ferry_field_spec *x = &a->fields[f], *y = &b->fields[f];
        if (y->ndim == FERRY_NDIM_VAR || x->ndim == FERRY_NDIM_VAR)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "concat: field '%s' of source %lu has a variable shape; "
                                      "concat takes fields of fixed shape",
                                      y->ndim == FERRY_NDIM_VAR ? y->name : x->name,
                                      (unsigned long)(y->ndim == FERRY_NDIM_VAR ? i : 0));
        int same = strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim;
        for (int d = 0; same && d < x->ndim; d++)
            same = x->shape[d] == y->shape[d];
        if (!same)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "concat: field %d of source %lu is '%s' (%s, %d dims), "
                                      "of source 0 '%s' (%s, %d dims), or their shapes differ: "
                                      "the sources must have the same fields",
                                      f, (unsigned long)i, y->name, ferry_dtype_name(y->dtype),
                                      y->ndim, x->name, ferry_dtype_name(x->dtype), x->ndim);
    }
    return FERRY_OK;
}

static int concat_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                       ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    uint32_t k = 1;
    for (const char *p = args; *p; p++)
        k += *p == CONCAT_SEP;
    if (!args[0] || k < 2 || k > FERRY__MIX_SOURCES_MAX)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "concat: expected 2..%d dataset specs separated by '|', got "
                                  "\"%.200s\"",
                                  FERRY__MIX_SOURCES_MAX, args);
    concat *c = calloc(1, sizeof *c);
    if (!c || !(c->src = calloc(k, sizeof *c->src)) ||
        !(c->offset = calloc(k + 1, sizeof *c->offset)) ||
        !(c->start = calloc(k + 1, sizeof *c->start))) {
        concat_close(c);
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "concat: out of memory");
    }
    c->k = k;
    const char *from = args;
    int rc = FERRY_OK;
    for (uint32_t i = 0; i < k && rc == FERRY_OK; i++) {
        const char *end = strchr(from, CONCAT_SEP);
        size_t len = end ? (size_t)(end - from) : strlen(from);
        char *spec = malloc(len + 1);
        char why[FERRY_DATASET_MESSAGE_MAX];
        if (!spec) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "concat: out of memory");
            break;
        }
        memcpy(spec, from, len);
        spec[len] = '\0';
        if (strncmp(spec, "concat:", 7) == 0 || strcmp(spec, "concat") == 0)
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                    "concat: source %lu is a concat itself; list its sources "
                                    "instead",
                                    (unsigned long)i);
        else if ((rc = ferry__dataset_open_flags(&c->src[i], spec, ctx,
                                                 FERRY__DATASET_KEEP_LOADED, why, sizeof why)) !=
                 FERRY_OK)
            rc = ferry__dataset_err(errbuf, errlen, rc, "concat: source %lu (%.200s): %s",
                                    (unsigned long)i, spec, why);
        else if (i > 0)
            rc = same_schema(c, i, errbuf, errlen);
        if (rc == FERRY_OK)
            c->offset[i + 1] = c->offset[i] + c->src[i].length;
        free(spec);
        from = end ? end + 1 : from + len;
    }
    if (rc == FERRY_OK)
        rc = same_schema(c, 0, errbuf, errlen); /* source 0's own fields are fixed */
    if (rc != FERRY_OK) {
        concat_close(c);
        return rc;
    }
    *schema = c->src[0].schema;
    *handle = c;
    return FERRY_OK;
}

static uint64_t concat_length(void *handle)
{
    const concat *c = handle;
    return c->offset[c->k];
}

/* The source of global index i: the last whose offset is <= i. */
static uint32_t source_of(const concat *c, uint64_t i)
{
    uint32_t lo = 0, hi = c->k;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->offset[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Out of memory for the batch's bookkeeping: said as the dataset's failure. */
static int no_memory(const ferry_batch_request *req, ferry_dataset_error *err)
{
    err->index = req->count ? req->indices[0] : 0;
    snprintf(err->message, sizeof err->message, "concat: out of memory for a batch of %zu",
             req->count);
    return FERRY_ENOMEM;
}

static int grow_scratch(concat *c, int f, size_t bytes)
{
    if (c->scratch_cap[f] >= bytes)
        return 0;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return -1;
    free(c->scratch[f]);
    c->scratch[f] = p;
    c->scratch_cap[f] = bytes;
    return 0;
}

/* Source s's items of the batch: its local indices, built into dst (in
 * place when the whole batch is its) or scratch and copied row by row. */
static int build_source(concat *c, const ferry_batch_request *req, void *const dst[], uint32_t s,
                        size_t from, size_t n, int whole, ferry_dataset_error *err)
{
    const uint64_t *local = c->local + from;
    const uint32_t *where = c->where + from;
    ferry__dataset *d = &c->src[s];
    void *bufs[FERRY_MAX_FIELDS] = {0};
    for (int f = 0; f < d->schema.nfields; f++) {
        if (whole) {
            bufs[f] = dst[f];
        } else if (grow_scratch(c, f, n * d->item_bytes[f] + 1) != 0) {
            return no_memory(req, err);
        } else {
            bufs[f] = c->scratch[f];
        }
    }
    ferry_batch_request sub = *req;
    sub.indices = local;
    sub.count = n;
    int rc = ferry__dataset_get_batch(d, &sub, bufs, err);
    if (rc != FERRY_OK) {
        char why[FERRY_DATASET_MESSAGE_MAX];
        snprintf(why, sizeof why, "%s", err->message);
        err->index += c->offset[s]; /* the batch's index, not the source's */
        snprintf(err->message, sizeof err->message, "concat: source %lu: %s",
                 (unsigned long)s, why);
        return rc;
    }
    for (int f = 0; !whole && f < d->schema.nfields; f++) {
        size_t b = d->item_bytes[f];
        for (size_t j = 0; j < n; j++)
            memcpy((char *)dst[f] + (size_t)where[j] * b, (char *)bufs[f] + j * b, b);
    }
    return FERRY_OK;
}

static int concat_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                            ferry_dataset_error *err)
{
    concat *c = handle;
    size_t cap = c->cap;
    if (ferry__grow(&c->local, &c->cap, req->count, sizeof *c->local) != 0)
        return no_memory(req, err);
    if (c->cap != cap || !c->where) {
        free(c->where);
        free(c->src_of);
        c->where = malloc(c->cap * sizeof *c->where);
        c->src_of = malloc(c->cap * sizeof *c->src_of);
        if (!c->where || !c->src_of) {
            free(c->where);
            free(c->src_of);
            c->where = NULL;
            c->src_of = NULL;
            c->cap = 0;
            return no_memory(req, err);
        }
    }
    /* The batch grouped by source, each group in the batch's order (a
     * counting sort): then each source builds its items in one call. */
    memset(c->start, 0, (c->k + 1) * sizeof *c->start);
    for (size_t j = 0; j < req->count; j++) {
        c->src_of[j] = source_of(c, req->indices[j]);
        c->start[c->src_of[j] + 1]++;
    }
    for (uint32_t s = 0; s < c->k; s++)
        c->start[s + 1] += c->start[s];
    for (size_t j = 0; j < req->count; j++) {
        uint32_t s = c->src_of[j], at = c->start[s]++;
        c->local[at] = req->indices[j] - c->offset[s];
        c->where[at] = (uint32_t)j;
    }
    /* start[s] is now the end of group s, the start of group s + 1. */
    for (uint32_t s = 0, from = 0; s < c->k; from = c->start[s], s++) {
        size_t n = c->start[s] - from;
        if (n == 0)
            continue;
        int rc = build_source(c, req, dst, s, from, n, n == req->count, err);
        if (rc != FERRY_OK)
            return rc;
    }
    return FERRY_OK;
}

static const ferry_dataset_ops concat_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "concat",
    .open = concat_open,
    .length = concat_length,
    .get_batch = concat_get_batch,
    .close = concat_close,
};

/* The file paths of every source's spec, as offsets in args. */
static int concat_paths(const char *args, ferry__span *path, int max)
{
    int n = 0;
    const char *from = args;
    while (n < max) {
        const char *end = strchr(from, CONCAT_SEP);
        size_t len = end ? (size_t)(end - from) : strlen(from);
        n += ferry__dataset_spec_paths(from, len, (size_t)(from - args), path + n, max - n);
        if (!end)
            break;
        from = end + 1;
    }
    return n;
}

const ferry__dataset_kind ferry__concat_kind = {
    .name = "concat",
    .ops = &concat_ops,
    .open = ferry__dataset_open_builtin,
    .paths = concat_paths,
};
