/*
 * dataset.h - opening a dataset from its spec string and building batches.
 *
 * Position in the data flow: inside the worker loop, which calls
 * ferry__dataset_get_batch for each TASK. Specs:
 *   synthetic:KEY=VAL,...   built-in, item i's bytes are a function of i
 *   npy:PATH[,PATH...]      .npy files (read-only), one field per file
 *   plugin:PATH[?ARGS]      a shared object exporting ferry_dataset_plugin()
 *   imagefolder:root=DIR,...  JPEG/PNG files, decoded and cropped in C
 *   wds:shards=PATTERN,...  the same from WebDataset tar shards
 *   concat:SPEC|SPEC|...    several datasets of one schema, end to end
 * Each kind is a ferry_dataset_ops table (the plugin ABI in
 * include/ferry_dataset.h); built-ins use the same table shape. The kinds
 * live in core/datasets/, one file each.
 *
 * Thread safety: a ferry__dataset belongs to one worker.
 */
#ifndef FERRY_CORE_DATASET_H
#define FERRY_CORE_DATASET_H

#include "ferry_dataset.h"
#include "protocol.h"

typedef struct ferry__dataset {
    const ferry_dataset_ops *ops;
    void *handle;
    void *dl; /* dlopen handle of a plugin, or NULL */
    uint64_t length;
    ferry_dataset_schema schema;
    size_t item_bytes[FERRY_MAX_FIELDS]; /* bytes of one item of each field */
    int keep_loaded;                     /* FERRY__DATASET_KEEP_LOADED was given */
} ferry__dataset;

/* Bytes of an array of `ndim` dims of `elsize`-byte elements. Returns 0, or
 * -1 when a dim is negative or the product overflows size_t (*out untouched). */
int ferry__shape_bytes(size_t elsize, const int64_t *shape, int ndim, size_t *out);

/* Whether a table of ABI `v` can be used. */
static inline int ferry__dataset_abi_ok(uint32_t v)
{
    return v >= FERRY_DATASET_ABI_OLDEST && v <= FERRY_DATASET_ABI;
}

/* Opens `spec`. On failure returns a negative code (FERRY_EDATASET for a spec
 * or data problem, FERRY_EFORMAT for a malformed file, FERRY_EVERSION for a
 * plugin ABI mismatch, FERRY_ENOMEM) with a message in errbuf, and *ds is
 * left zeroed. Validates the schema (1..FERRY_MAX_FIELDS fields, known
 * dtypes, unique non-empty names, positive dims, item sizes that fit). */
int ferry__dataset_open(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                        char *errbuf, size_t errlen);

/* ferry__dataset_open with flags: FERRY__DATASET_KEEP_LOADED never unloads a
 * plugin, neither on close nor on a failed open (see ferry__dataset_close). */
#define FERRY__DATASET_KEEP_LOADED 1
int ferry__dataset_open_flags(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                              int flags, char *errbuf, size_t errlen);

/* Checks every index < length (FERRY_ERANGE naming the index otherwise), then
 * has the dataset fill dst[]. On failure fills *err. */
int ferry__dataset_get_batch(ferry__dataset *ds, const ferry_batch_request *req, void *const dst[],
                             ferry_dataset_error *err);

/* The schema of open dataset ds as READY carries it (validated at open: at
 * most FERRY_MAX_FIELDS fields of at most FERRY_MAX_DIMS - 1 dims). */
void ferry__dataset_wire_schema(const ferry__dataset *ds, ferry__schema *out);

/* Closes and zeroes *ds; safe on a zeroed or already closed struct. A plugin
 * is unloaded unless opened with FERRY__DATASET_KEEP_LOADED: a worker process
 * asks for that, because a
 * plugin that started threads (an OpenMP pool, say) would have them run
 * unmapped code, and the process exits right after anyway. */
void ferry__dataset_close(ferry__dataset *ds);

/* The spec with every relative file path it names (npy files, a plugin's
 * path with a '/', imagefolder's root, wds's shard patterns) made absolute
 * against this process's working directory,
 * into out (cap bytes): the trainer resolves them, so a worker started
 * elsewhere (another directory, another host with the same mounts) reads
 * the same files. Specs of other kinds are copied as they are. FERRY_EINVAL
 * when the result does not fit, FERRY_ESYS when the working directory
 * cannot be had and a path is relative. */
int ferry__dataset_absolute(const char *spec, char *out, size_t cap);

/* The synthetic dataset's content, for tests and checkers: byte j of item i
 * of field "x" (without augmentation). Field "y" of item i is the int64 i. */
uint8_t ferry__synthetic_byte(uint64_t i, uint64_t j);

#endif
