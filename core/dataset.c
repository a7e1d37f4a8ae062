/*
 * dataset.c - opening a dataset from its spec and building batches from it.
 *
 * Position in the data flow: inside the worker loop. The worker opens the
 * spec it was given in CONFIG once, then calls ferry__dataset_get_batch for
 * every TASK with buffers that live inside the reply message, so the dataset
 * writes each batch exactly once and nothing is copied afterwards.
 *
 * The kinds live in core/datasets/, one file each, and reach this file
 * through one shape (ferry__dataset_kind in core/datasets/kinds.h): a name
 * and an open that yields a ferry_dataset_ops table + handle, the same table
 * a plugin exports:
 *   synthetic  item i's bytes are a function of i (tests, benchmarks);
 *   npy        .npy files, read-only, one field per file;
 *   plugin     a shared object exporting ferry_dataset_plugin();
 *   imagefolder  JPEG/PNG files in torchvision's ImageFolder layout,
 *              decoded, cropped and resized in C;
 *   wds        the same from WebDataset tar shards;
 *   concat     several of these end to end (what option mix draws from).
 * This file holds their registry and does not trust any of them: after open
 * it validates the schema (so a batch's sizes can be computed without
 * overflow anywhere downstream), and around get_batch it checks the indices
 * and the error message. It also defines the small helpers the kinds share,
 * and hands the schema over in the form READY carries it.
 *
 * Invariants of an open ferry__dataset: ops != NULL, length >= 1, the schema
 * passed validate_schema(), item_bytes[f] is the size of one item of field f
 * (at most FERRY__ITEM_BYTES_MAX). A failed open leaves it all zero.
 *
 * Threads: a ferry__dataset belongs to one worker (one thread). The built-in
 * kinds keep no global state, so thread workers may each open their own.
 */
#include "dataset.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <limits.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <ctype.h>
#include <pthread.h>

#include "datasets/kinds.h"
#include "error.h"
#include "forkfds.h"


/* The kinds a spec may name, found by the text before its ':'. */
static const ferry__dataset_kind *const dataset_kinds[] = {
    &ferry__synthetic_kind,
    &ferry__npy_kind,
    &ferry__plugin_kind,
    &ferry__imagefolder_kind,
    &ferry__wds_kind,
    &ferry__concat_kind,
};

/* Kinds registered at run time (ferry_dataset_register), looked up after the
 * built-ins. Registration normally happens once before any worker starts;
 * the lock makes a later one safe too. */
#define FERRY__REGISTERED_MAX 8
#define FERRY__KIND_NAME_MAX 32
static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t registered_once = PTHREAD_ONCE_INIT;

/* A fork taken while a thread registers or looks up a kind: the child's
 * lock would never be released (a registration changes
 * one entry at a time). */
static void registered_lock_forks(void)
{
    ferry__forkfds_unlock_in_child(&registered_lock);
}

static void lock_registered(void)
{
    pthread_once(&registered_once, registered_lock_forks);
    pthread_mutex_lock(&registered_lock);
}
static ferry__dataset_kind registered[FERRY__REGISTERED_MAX];
static char registered_names[FERRY__REGISTERED_MAX][FERRY__KIND_NAME_MAX];
static size_t nregistered;

int ferry_dataset_register(const ferry_dataset_ops *ops)
{
    if (!ops || !ferry__dataset_abi_ok(ops->abi_version) || !ops->open || !ops->length ||
        !ops->get_batch || !ops->close)
        return ferry__seterr(FERRY_EINVAL, "ferry_dataset_register: the table needs abi_version "
                                           "%d..%d and all four functions",
                             FERRY_DATASET_ABI_OLDEST, FERRY_DATASET_ABI);
    const char *name = ops->name ? ops->name : "";
    size_t len = strlen(name);
    int ok = len > 0 && len < FERRY__KIND_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)name[i]) || name[i] == '_';
    if (!ok)
        return ferry__seterr(FERRY_EINVAL, "ferry_dataset_register: kind name '%s' must be 1-%d "
                                           "letters, digits or '_'",
                             name, FERRY__KIND_NAME_MAX - 1);
    for (size_t k = 0; k < FERRY__ARRAY_LEN(dataset_kinds); k++) {
        if (strcmp(dataset_kinds[k]->name, name) == 0)
            return ferry__seterr(FERRY_EINVAL,
                                 "ferry_dataset_register: '%s' is a built-in dataset kind", name);
    }
    lock_registered();
    size_t slot = nregistered;
    for (size_t k = 0; k < nregistered; k++) {
        if (strcmp(registered_names[k], name) == 0)
            slot = k;
    }
    int rc = FERRY_OK;
    if (slot == FERRY__REGISTERED_MAX) {
        rc = ferry__seterr(FERRY_ELIMIT, "ferry_dataset_register: %d kinds are registered already",
                           FERRY__REGISTERED_MAX);
    } else {
        memcpy(registered_names[slot], name, len + 1);
        registered[slot] = (ferry__dataset_kind){
            .name = registered_names[slot], .ops = ops, .open = ferry__dataset_open_builtin};
        if (slot == nregistered)
            nregistered++;
    }
    pthread_mutex_unlock(&registered_lock);
    return rc;
}

/* --- Helpers shared by the kinds (declared in datasets/kinds.h) --- */

int ferry__dataset_err(char *buf, size_t len, int code, const char *fmt, ...)
{
    va_list ap;
    if (len == 0)
        return code;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return code;
}

int ferry__parse_u64(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0)
        return -1;
    for (size_t k = 0; k < len; k++) {
        if (s[k] < '0' || s[k] > '9')
            return -1;
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, s[k] - '0', &v))
            return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int ferry__grow(void *pp, size_t *cap, size_t want, size_t elem)
{
    void **p = pp;
    if (want <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64, bytes;
    while (n < want) {
        if (__builtin_mul_overflow(n, 2, &n))
            return -1;
    }
    if (__builtin_mul_overflow(n, elem, &bytes))
        return -1;
    void *q = realloc(*p, bytes);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

int ferry__pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -1 : -2;
        got += (size_t)n;
    }
    return 0;
}

int ferry__next_comma_token(const char **cur, const char **tok, size_t *len)
{
    const char *comma;
    if (*cur == NULL)
        return 0;
    comma = strchr(*cur, ',');
    *tok = *cur;
    *len = comma ? (size_t)(comma - *cur) : strlen(*cur);
    *cur = comma ? comma + 1 : NULL;
    return 1;
}

int ferry__shape_bytes(size_t elsize, const int64_t *shape, int ndim, size_t *out)
{
    size_t n = elsize;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n))
            return -1;
    }
    *out = n;
    return 0;
}

/* A dataset's failure code as ferry passes it on: its own when it is one of
 * ferry's codes, `fallback` otherwise, so that a plugin returning 1 or -999
 * can neither look like success nor confuse the caller. */
static int known_failure(int rc, int fallback)
{
    if (rc < 0 && strcmp(ferry_err_name(rc), "FERRY_UNKNOWN") != 0)
        return rc;
    return fallback;
}

int ferry__dataset_open_ops(ferry__dataset *d, const ferry_dataset_ops *ops, const char *args,
                            const ferry_dataset_ctx *ctx, char *errbuf, size_t errlen)
{
    int rc = ops->open(&d->handle, args, ctx, &d->schema, errbuf, errlen);
    if (errlen > 0)
        errbuf[errlen - 1] = '\0';
    if (rc != FERRY_OK)
        return known_failure(rc, FERRY_EDATASET);
    d->ops = ops;
    return FERRY_OK;
}

int ferry__dataset_open_builtin(const ferry__dataset_kind *kind, ferry__dataset *d,
                                const char *args, const ferry_dataset_ctx *ctx, char *errbuf,
                                size_t errlen)
{
    return ferry__dataset_open_ops(d, kind->ops, args, ctx, errbuf, errlen);
}

/* --- Opening, validating, building batches --- */

static const char *ops_name(const ferry_dataset_ops *ops)
{
    return ops->name ? ops->name : "plugin";
}

/* Finds the kind in "KIND:ARGS" (or a bare "KIND"): sets *kind and *args, or
 * returns FERRY_EDATASET naming the kinds there are. */
static int find_kind(const char *spec, const ferry__dataset_kind **kind, const char **args,
                     char *errbuf, size_t errlen)
{
    const char *colon = strchr(spec, ':');
    size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);

    *args = colon ? colon + 1 : spec + klen;
    for (size_t k = 0; k < FERRY__ARRAY_LEN(dataset_kinds); k++) {
        const char *name = dataset_kinds[k]->name;
        if (strlen(name) == klen && memcmp(name, spec, klen) == 0) {
            *kind = dataset_kinds[k];
            return FERRY_OK;
        }
    }
    char also[FERRY__REGISTERED_MAX * (FERRY__KIND_NAME_MAX + 2)] = "";
    size_t used = 0;
    lock_registered();
    for (size_t k = 0; k < nregistered && !*kind; k++) {
        if (strlen(registered_names[k]) == klen && memcmp(registered_names[k], spec, klen) == 0)
            *kind = &registered[k];
        used += (size_t)snprintf(also + used, sizeof also - used, ", %s", registered_names[k]);
    }
    pthread_mutex_unlock(&registered_lock);
    if (*kind)
        return FERRY_OK;
    const char *hint = klen == 6 && memcmp(spec, "python", 6) == 0
                           ? "; python: datasets are served by Python workers, which "
                             "ferry.Loader starts (python -m ferry.worker)"
                           : "";
    return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                              "unknown dataset kind '%.*s' (expected synthetic, npy, plugin, "
                              "imagefolder, wds, concat%s)%s",
                              (int)klen, spec, also, hint);
}

/* Appends n bytes of s to out (cap bytes) at *len, counting what does not
 * fit, so one check at the end says whether everything did. */
static void append(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    if (*len + n < cap)
        memcpy(out + *len, s, n);
    *len += n;
}

int ferry__dataset_spec_paths(const char *spec, size_t len, size_t base, ferry__span *path,
                              int max)
{
    const char *colon = memchr(spec, ':', len);
    const ferry__dataset_kind *kind = NULL;
    for (size_t k = 0; colon && k < FERRY__ARRAY_LEN(dataset_kinds); k++) {
        const char *name = dataset_kinds[k]->name;
        if (strlen(name) == (size_t)(colon - spec) && memcmp(name, spec, strlen(name)) == 0)
            kind = dataset_kinds[k];
    }
    if (!kind || !kind->paths || max <= 0)
        return 0;
    /* The kinds read NUL-terminated args: a copy of this spec's. */
    size_t alen = len - (size_t)(colon + 1 - spec);
    char *args = malloc(alen + 1);
    if (!args)
        return 0;
    memcpy(args, colon + 1, alen);
    args[alen] = '\0';
    int n = kind->paths(args, path, max);
    free(args);
    for (int i = 0; i < n; i++)
        path[i].off += base + (size_t)(colon + 1 - spec);
    return n;
}

int ferry__dataset_absolute(const char *spec, char *out, size_t cap)
{
    ferry__span path[64];
    int n = ferry__dataset_spec_paths(spec, strlen(spec), 0, path, 64);
    char cwd[PATH_MAX] = "";
    size_t len = 0, from = 0;
    for (int i = 0; i < n; i++) {
        size_t at = path[i].off;
        if (path[i].len == 0 || spec[at] == '/')
            continue;
        if (!cwd[0] && !getcwd(cwd, sizeof cwd))
            return ferry__syserr(FERRY_ESYS,
                                 "getcwd (to make the dataset's relative paths absolute)", errno);
        append(out, cap, &len, spec + from, at - from);
        append(out, cap, &len, cwd, strlen(cwd));
        append(out, cap, &len, "/", 1);
        from = at;
    }
    append(out, cap, &len, spec + from, strlen(spec + from));
    if (len >= cap)
        return ferry__seterr(FERRY_EINVAL,
                             "option 'dataset' with its relative paths made absolute (against "
                             "%s) is %zu bytes, more than %zu",
                             cwd, len, cap - 1);
    out[len] = '\0';
    return FERRY_OK;
}

/* Checks the schema and length a dataset reported and computes item_bytes,
 * so nothing downstream has to trust a plugin's arithmetic. */
static int validate_schema(ferry__dataset *d, char *errbuf, size_t errlen)
{
    const ferry_dataset_schema *sc = &d->schema;
    const char *who = ops_name(d->ops);

    if (sc->nfields < 1 || sc->nfields > FERRY_MAX_FIELDS)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "dataset %s reports %d fields (expected 1..%d)", who, sc->nfields,
                                  FERRY_MAX_FIELDS);
    if (d->length == 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "dataset %s has no items", who);
    for (int f = 0; f < sc->nfields; f++) {
        const ferry_field_spec *fs = &sc->fields[f];
        size_t elsize = ferry_dtype_size(fs->dtype), bytes;

        if (memchr(fs->name, '\0', sizeof fs->name) == NULL)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "dataset %s: the name of field %d is not NUL-terminated", who,
                                      f);
        if (fs->name[0] == '\0')
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "dataset %s: field %d has an empty name", who, f);
        for (int g = 0; g < f; g++) {
            if (strcmp(sc->fields[g].name, fs->name) == 0)
                return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                          "dataset %s: field name '%s' appears twice", who,
                                          fs->name);
        }
        if (elsize == 0)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "dataset %s: field '%s' has unknown dtype %d", who, fs->name,
                                      (int)fs->dtype);
        if (fs->ndim == FERRY_NDIM_VAR) { /* shape[0]: bytes per item to reserve */
            if (fs->shape[0] < 0 || (uint64_t)fs->shape[0] > FERRY__ITEM_BYTES_MAX)
                return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                          "dataset %s: field '%s' of variable shape reserves %" PRId64
                                          " bytes per item (expected 0..1 GiB)",
                                          who, fs->name, fs->shape[0]);
            d->item_bytes[f] = 0;
            continue;
        }
        if (fs->ndim < 0 || fs->ndim > FERRY_MAX_DIMS - 1)
            return ferry__dataset_err(
                errbuf, errlen, FERRY_EDATASET,
                "dataset %s: field '%s' has %d dims per item (expected 0..%d)", who, fs->name,
                fs->ndim, FERRY_MAX_DIMS - 1);
        for (int k = 0; k < fs->ndim; k++) {
            if (fs->shape[k] < 1)
                return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                          "dataset %s: field '%s' has dim %d of size %" PRId64
                                          " (expected >= 1)",
                                          who, fs->name, k, fs->shape[k]);
        }
        if (ferry__shape_bytes(elsize, fs->shape, fs->ndim, &bytes) != 0 ||
            bytes > FERRY__ITEM_BYTES_MAX)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "dataset %s: one item of field '%s' is larger than 1 GiB",
                                      who, fs->name);
        d->item_bytes[f] = bytes;
    }
    return FERRY_OK;
}

int ferry__dataset_open(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                        char *errbuf, size_t errlen)
{
    return ferry__dataset_open_flags(ds, spec, ctx, 0, errbuf, errlen);
}

int ferry__dataset_open_flags(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                              int flags, char *errbuf, size_t errlen)
{
    static const ferry_dataset_ctx no_ctx;
    /* Everything is written here first and copied to errbuf once, so the
     * dataset's own message can be prefixed and is surely NUL-terminated. */
    char msg[FERRY__ERRMSG_MAX] = "";
    const ferry__dataset_kind *kind = NULL;
    const char *args = NULL;
    ferry__dataset d;
    int rc;

    memset(&d, 0, sizeof d);
    d.keep_loaded = (flags & FERRY__DATASET_KEEP_LOADED) != 0;
    if (ds != NULL)
        memset(ds, 0, sizeof *ds);
    if (ds == NULL || spec == NULL) {
        rc = ferry__dataset_err(msg, sizeof msg, FERRY_EINVAL, "no dataset spec given");
        goto fail;
    }
    rc = find_kind(spec, &kind, &args, msg, sizeof msg);
    if (rc != FERRY_OK)
        goto fail;
    rc = kind->open(kind, &d, args, ctx ? ctx : &no_ctx, msg, sizeof msg);
    if (rc != FERRY_OK)
        goto fail;
    d.length = d.ops->length(d.handle);
    rc = validate_schema(&d, msg, sizeof msg);
    if (rc != FERRY_OK)
        goto fail;

    *ds = d;
    return FERRY_OK;

fail:
    /* Closes what the kind opened (nothing if it failed), unloading a
     * plugin unless keep_loaded. */
    ferry__dataset_close(&d);
    if (errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen, "%s", msg);
    return ferry__seterr_str(rc, msg);
}

int ferry__dataset_get_batch(ferry__dataset *ds, const ferry_batch_request *req, void *const dst[],
                             ferry_dataset_error *err)
{
    int rc;

    err->index = 0;
    err->message[0] = '\0';
    if (ds->ops == NULL) {
        snprintf(err->message, sizeof err->message, "dataset is not open");
        return ferry__seterr(FERRY_EINVAL, "dataset is not open");
    }
    /* Checked here, once, so no dataset ever reads out of bounds. */
    for (size_t k = 0; k < req->count; k++) {
        if (req->indices[k] >= ds->length) {
            err->index = req->indices[k];
            snprintf(err->message, sizeof err->message,
                     "index %" PRIu64 " out of range (dataset has %" PRIu64 " items)",
                     req->indices[k], ds->length);
            return ferry__seterr_str(FERRY_ERANGE, err->message);
        }
    }
    rc = ds->ops->get_batch(ds->handle, req, dst, err);
    if (rc == FERRY_OK)
        return FERRY_OK;
    err->message[sizeof err->message - 1] = '\0';
    if (err->message[0] == '\0')
        snprintf(err->message, sizeof err->message, "dataset %s failed (code %d) without a message",
                 ops_name(ds->ops), rc);
    return ferry__seterr_str(known_failure(rc, FERRY_EBATCH), err->message);
}

void ferry__dataset_wire_schema(const ferry__dataset *ds, ferry__schema *out)
{
    memset(out, 0, sizeof *out);
    out->nfields = (uint32_t)ds->schema.nfields;
    for (int f = 0; f < ds->schema.nfields; f++) {
        const ferry_field_spec *in = &ds->schema.fields[f];
        ferry__item_field *o = &out->fields[f];
        memcpy(o->name, in->name, sizeof o->name);
        o->dtype = in->dtype;
        if (in->ndim == FERRY_NDIM_VAR) {
            o->var = 1;
            o->ndim = in->shape[0] > 0;
            o->shape[0] = in->shape[0];
            continue;
        }
        o->ndim = in->ndim;
        memcpy(o->shape, in->shape, sizeof o->shape[0] * (size_t)in->ndim);
    }
}

void ferry__dataset_close(ferry__dataset *ds)
{
    if (ds == NULL)
        return;
    if (ds->ops != NULL)
        ds->ops->close(ds->handle);
    if (ds->dl != NULL && !ds->keep_loaded)
        dlclose(ds->dl);
    memset(ds, 0, sizeof *ds);
}
