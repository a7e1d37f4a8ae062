/*
 * ferry_dataset.h - the dataset plugin ABI.
 *
 * A dataset turns sample indices into one collated batch. Every item of a
 * dataset has the same fields, each with a fixed dtype and item shape (the
 * schema), so a batch of n items has, for each field, n * item_bytes bytes.
 * The worker allocates those buffers (inside the message it will send, so
 * nothing is copied afterwards) and the dataset fills them.
 *
 * A plugin is a shared object that exports
 *
 *     const ferry_dataset_ops *ferry_dataset_plugin(void);
 *
 * returning a static table whose abi_version is FERRY_DATASET_ABI. The loader
 * checks the version before calling anything else. A plugin needs only this
 * header: it does not link against libferry.
 *
 * Threading: one dataset handle is used by one worker at a time; handles of
 * different workers may live in the same process (thread workers), so a
 * plugin must keep no unsynchronised global state.
 */
#ifndef FERRY_DATASET_H
#define FERRY_DATASET_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table's version. 2: fields of variable shape (FERRY_NDIM_VAR) and
 * an error message of FERRY_DATASET_MESSAGE_MAX bytes (a plugin of ABI 1
 * writes at most 512 of them, at the same place: it still loads). */
#define FERRY_DATASET_ABI 2
#define FERRY_DATASET_ABI_OLDEST 1
#define FERRY_DATASET_MESSAGE_MAX 4096
#define FERRY_DATASET_PLUGIN_SYMBOL "ferry_dataset_plugin"

/* One field of an item: its name, dtype and shape (without the batch dim;
 * ndim 0 is a scalar per item).
 *
 * A field of variable shape has ndim FERRY_NDIM_VAR: each batch gives it
 * a shape of its own (1..FERRY_MAX_DIMS dims, each >= 1, with no rule
 * tying them to the batch's item count: a ragged batch padded to its
 * longest item, the bytes of a serialized object). Its shape[0] is the
 * bytes per item that each batch slot in shared memory reserves for it
 * (0: none); a batch whose variable fields do not fit what is left of its
 * slot is sent as a message instead, bounded by max_message. */
typedef struct ferry_field_spec {
    char name[FERRY_NAME_MAX];
    ferry_dtype dtype;
    int ndim;
    int64_t shape[FERRY_MAX_DIMS];
} ferry_field_spec;

#define FERRY_NDIM_VAR (-1)

/* What get_batch fills for a field of variable shape (see above): a dense
 * row-major array of the schema's dtype. */
typedef struct ferry_var_field {
    const void *data;
    int ndim; /* 1..FERRY_MAX_DIMS */
    int64_t shape[FERRY_MAX_DIMS];
} ferry_var_field;

typedef struct ferry_dataset_schema {
    int nfields;
    ferry_field_spec fields[FERRY_MAX_FIELDS];
} ferry_dataset_schema;

/* What a dataset learns at open. */
typedef struct ferry_dataset_ctx {
    uint64_t seed;         /* the loader's seed */
    uint32_t worker_index; /* this worker's index in the pool */
    uint32_t num_workers;  /* workers the loader asked for */
} ferry_dataset_ctx;

/* One batch to build. indices[] are all < the dataset's length (checked
 * before the call). */
typedef struct ferry_batch_request {
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint64_t seq;
    uint64_t seed;
    const uint64_t *indices;
    size_t count;
} ferry_batch_request;

/* What a dataset says when it fails on a batch. */
typedef struct ferry_dataset_error {
    uint64_t index; /* the first index it failed on */
    char message[FERRY_DATASET_MESSAGE_MAX];
} ferry_dataset_error;

typedef struct ferry_dataset_ops {
    uint32_t abi_version; /* FERRY_DATASET_ABI */
    const char *name;

    /* Opens the dataset described by `args` (the text after the kind in the
     * spec). Fills *schema and stores the handle in *handle. On failure
     * returns a negative FERRY_E* code and writes a message into errbuf. */
    int (*open)(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                ferry_dataset_schema *schema, char *errbuf, size_t errlen);

    /* Number of items. */
    uint64_t (*length)(void *handle);

    /* Fills dst[f] (one buffer per schema field, count * item bytes each,
     * 64-byte aligned) with the items req->indices. For a field of variable
     * shape, dst[f] is a ferry_var_field to fill instead: its data stays
     * the dataset's and must stay valid until the next get_batch or close.
     * On failure returns a negative code and fills *err; the buffers'
     * content is then undefined. */
    int (*get_batch)(void *handle, const ferry_batch_request *req, void *const dst[],
                     ferry_dataset_error *err);

    void (*close)(void *handle);
} ferry_dataset_ops;

typedef const ferry_dataset_ops *(*ferry_dataset_plugin_fn)(void);

/* ----------------------------------------------------------------------------
 * Embedding a worker. These two are in libferry (a plugin needs neither):
 * a program that has its own kind of dataset (the Python package's
 * "python:" kind is one) registers the kind's table and runs the worker
 * program's main loop, and a loader given that program (options
 * worker_path and worker_args) gets workers that open "KIND:ARGS" specs
 * with it.
 */

/* Adds `ops` as dataset kind ops->name (letters, digits and '_', at most
 * 31 characters) for every worker in this process, in any placement; the
 * table must outlive them. Registering a name again replaces its table.
 * FERRY_EINVAL for a bad table or name, or the name of a built-in kind
 * (synthetic, npy, plugin, imagefolder, wds, concat); FERRY_ELIMIT past 8 registered kinds. */
FERRY_API int ferry_dataset_register(const ferry_dataset_ops *ops);

/* The ferry-worker program: parses argv as ferry-worker does (--connect,
 * --slot, --processes, ...; see `ferry-worker --help`), runs the worker or
 * the --processes supervisor, and returns the exit code for the process.
 * `name` is the program's name in its usage text (NULL: "ferry-worker").
 * `relaunch` is the command that starts this program again, NULL-terminated
 * (e.g. {"/usr/bin/python3", "-m", "ferry.worker", NULL}): --processes
 * starts its children with it followed by argv[1...]; NULL: this process's
 * own executable. Installs signal handlers; call it from the main thread. */
FERRY_API int ferry_worker_main(int argc, char **argv, const char *name, char *const relaunch[]);

/* A 64-bit mix (splitmix64's finaliser). */
static inline uint64_t ferry_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The seed for per-sample randomness (augmentation) of item `index` in
 * `epoch`: a function of these three values only, so it is the same whatever
 * the number of workers or which worker builds the item. */
static inline uint64_t ferry_sample_seed(uint64_t seed, uint64_t epoch, uint64_t index)
{
    return ferry_mix64(ferry_mix64(ferry_mix64(seed) ^ epoch) ^ index);
}

#ifdef __cplusplus
}
#endif
#endif /* FERRY_DATASET_H */
