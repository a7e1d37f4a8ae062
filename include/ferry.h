/*
 * ferry.h - the public API of ferry, a data loader for machine-learning
 * training.
 *
 * A loader owns a pool of workers (processes started from the ferry-worker
 * program, or threads) for its whole lifetime. It hands the workers batches of
 * sample indices drawn from one endless, deterministic stream that runs
 * straight across epoch boundaries, keeps at most `prefetch` batches in flight,
 * and gives the trainer the finished batches in order.
 *
 * Conventions:
 *  - Every fallible call returns an int: FERRY_OK (0) or a negative FERRY_E*
 *    code. Results come back through out-parameters, which are left untouched
 *    on failure.
 *  - After a failed call, ferry_last_error() gives a sentence with the detail
 *    (which option, which worker, which index, the dataset's own message). It
 *    is per thread and stays until the next failing call on that thread.
 *  - Handles are opaque. A loader is used from one thread at a time; its
 *    batches may be released from any thread.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_BUILDING) && defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0

/* The error table: name, value, message. One place makes the enum,
 * ferry_strerror() and ferry_err_name(). */
#define FERRY_ERRNO_MAP(X)                                                                         \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EOPTION, -3, "unknown option")                                                               \
    X(EDATASET, -4, "dataset could not be opened")                                                 \
    X(EBATCH, -5, "dataset failed to produce a batch")                                             \
    X(ERANGE, -6, "index out of range")                                                            \
    X(EPROTO, -7, "malformed protocol message")                                                    \
    X(ESPAWN, -8, "worker could not be started")                                                   \
    X(EWORKER, -9, "worker died")                                                                  \
    X(ETIMEDOUT, -10, "timed out")                                                                 \
    X(EOF, -11, "end of stream")                                                                   \
    X(ECLOSED, -12, "loader has failed and can only be closed")                                    \
    X(ESTATE, -13, "resume state is invalid or does not match")                                    \
    X(ESYS, -14, "system call failed")                                                             \
    X(ELIMIT, -15, "resource limit reached")                                                       \
    X(EFORMAT, -16, "malformed file")                                                              \
    X(EVERSION, -17, "version mismatch")                                                           \
    X(EMISMATCH, -18, "workers disagree about the dataset")                                        \
    X(EAGAIN, -19, "no batch ready yet")

typedef enum ferry_err {
#define FERRY__ERR_ENUM(name, value, msg) FERRY_##name = value,
    FERRY_ERRNO_MAP(FERRY__ERR_ENUM)
#undef FERRY__ERR_ENUM
} ferry_err;

/* The fixed description of an error code ("invalid argument"). */
FERRY_API const char *ferry_strerror(int err);
/* The code's name ("FERRY_EINVAL"), or "FERRY_UNKNOWN". */
FERRY_API const char *ferry_err_name(int err);
/* The detail of the last failed call on this thread; "" if none. */
FERRY_API const char *ferry_last_error(void);
FERRY_API const char *ferry_version(void);

/* Element types. The values are part of the wire protocol: never renumber. */
typedef enum ferry_dtype {
    FERRY_DTYPE_U8 = 1,
    FERRY_DTYPE_I8 = 2,
    FERRY_DTYPE_U16 = 3,
    FERRY_DTYPE_I16 = 4,
    FERRY_DTYPE_U32 = 5,
    FERRY_DTYPE_I32 = 6,
    FERRY_DTYPE_U64 = 7,
    FERRY_DTYPE_I64 = 8,
    FERRY_DTYPE_F16 = 9,
    FERRY_DTYPE_F32 = 10,
    FERRY_DTYPE_F64 = 11,
    FERRY_DTYPE_BOOL = 12,
} ferry_dtype;

/* Size in bytes of one element of `dtype`, 0 for an unknown dtype. */
FERRY_API size_t ferry_dtype_size(int dtype);
/* The dtype's name, as numpy names it: "uint8", "int8", "uint16", "int16",
 * "uint32", "int32", "uint64", "int64", "float16", "float32", "float64",
 * "bool"; NULL for an unknown dtype. These names are the one convention
 * everywhere in ferry (messages, tools, Python); numpy's type strings ("<f4")
 * are read only where numpy's own headers are (npy files). */
FERRY_API const char *ferry_dtype_name(int dtype);
/* The dtype named `name` (one of the names above), or 0 for none. */
FERRY_API int ferry_dtype_from_name(const char *name);

#define FERRY_MAX_DIMS 8
#define FERRY_MAX_FIELDS 16
#define FERRY_NAME_MAX 64

/* A view of one field of a batch. shape[0] is the number of items in the
 * batch. `data` is aligned to at least 16 bytes and stays valid until the
 * batch is released. */
typedef struct ferry_tensor {
    const char *name;
    ferry_dtype dtype;
    int ndim;
    int64_t shape[FERRY_MAX_DIMS];
    const void *data;
    size_t nbytes;
    uint64_t reserved[4]; /* room to grow (see "ABI" in docs/install.md); zero */
} ferry_tensor;

/* ----------------------------------------------------------------------------
 * Configuration. Options are set by name; see docs/options.md for the list.
 */
typedef struct ferry_config ferry_config;

/* A config with every option at its default, or NULL when out of memory. */
FERRY_API ferry_config *ferry_config_new(void);
FERRY_API void ferry_config_free(ferry_config *cfg);
/* Sets option `key` from its text form ("256", "true", "process", ...).
 * FERRY_EOPTION for an unknown key, FERRY_EINVAL for a bad value; the config
 * is unchanged on failure. */
FERRY_API int ferry_config_set(ferry_config *cfg, const char *key, const char *value);
/* Sets an integer or boolean option. Same errors as ferry_config_set. */
FERRY_API int ferry_config_set_int(ferry_config *cfg, const char *key, int64_t value);
/* Where the loader's messages go: worker deaths and restarts, remote workers
 * joining, lost or refused, warnings (plain TCP without CURVE, a worker thread
 * that did not stop). One call per event with one line (no newline) and its
 * level; only levels at or above option `log_level` (default "info") are
 * passed. The levels' values are Python logging's. The callback runs on the
 * loader's own thread, or the caller's inside ferry_loader_open() and
 * ferry_loader_close(); calls are never concurrent. It must return quickly
 * and must not call into ferry. Without one (fn NULL), messages go to
 * stderr as "ferry: LEVEL: message". What workers themselves write (a
 * dataset's prints, the worker program's messages) goes to the trainer's
 * stderr as written. */
typedef enum ferry_log_level {
    FERRY_LOG_DEBUG = 10,
    FERRY_LOG_INFO = 20,
    FERRY_LOG_WARN = 30,
    FERRY_LOG_ERROR = 40,
} ferry_log_level;
typedef void (*ferry_log_fn)(void *user, int level, const char *message);
FERRY_API int ferry_config_set_log(ferry_config *cfg, ferry_log_fn fn, void *user);
/* "debug", "info", "warning", "error" (the names option log_level takes);
 * NULL for another level. */
FERRY_API const char *ferry_log_level_name(int level);

/* Told of each local worker process the loader reaps (libuv's exit_cb):
 * its index, its pid and its wait status as waitpid() gave it, or -1 when
 * the status is unknown (someone else reaped it: SIGCHLD set to SIG_IGN, or
 * a handler of the program's that reaps every child). A worker that died
 * and was replaced, and every worker at ferry_loader_close(), is reported
 * once. Thread workers and the clean parent are not. The callback runs
 * where the log callback does (the loader's own thread, or the caller's
 * inside ferry_loader_close()), never concurrently; it must return quickly
 * and must not call into ferry. fn NULL: nobody is told. */
typedef void (*ferry_exit_fn)(void *user, uint32_t index, int pid, int status);
FERRY_API int ferry_config_set_exit_fn(ferry_config *cfg, ferry_exit_fn fn, void *user);

/* Resume from a blob saved by ferry_loader_state(). The blob names a place
 * in one epoch's global order (the order of every rank together): the
 * samples the whole job had consumed, which in synchronous training are the
 * same whichever rank saved it. The loader starts at the next sample of
 * that order. In the shape the state was saved in, that is the batch after
 * the last one delivered. In another shape (world_size, rank, batch_size,
 * drop_last, pad_shards may all differ) the rest of that epoch is dealt out
 * over this loader's ranks as rank r takes positions P+r, P+r+world_size,
 * ..., cut into its batches, with its padding rule at the epoch's end; the
 * epochs after are a fresh run's (docs/c-api.md, "Saving and resuming the
 * position"). The blob is copied. Checked at open: FERRY_ESTATE when it is
 * malformed or of another order (dataset length, seed, shuffle). */
FERRY_API int ferry_config_set_state(ferry_config *cfg, const void *state, size_t len);

/* Whether the states of several ranks (count blobs, lens[i] bytes each) may
 * stand for one job: FERRY_OK when each is valid and all were saved by one
 * job (order, world_size, batch_size) at one step (the same epoch and
 * batch), by distinct ranks; then any one of them resumes the job.
 * FERRY_ESTATE naming the first that differs and how (a rank that stopped a
 * batch early or late, one of another job, a corrupted one); FERRY_EINVAL
 * for count 0. Needs no loader. */
FERRY_API int ferry_state_check(const void *const *states, const size_t *lens, size_t count);

/* ----------------------------------------------------------------------------
 * The loader.
 */
typedef struct ferry_loader ferry_loader;
typedef struct ferry_batch ferry_batch;

/* Starts the workers and returns once every one has opened the dataset.
 * On failure nothing is left running and *out is untouched. */
FERRY_API int ferry_loader_open(ferry_loader **out, const ferry_config *cfg);

/* The next batch, in sampler order unless in_order is off. Blocks until one
 * is ready. Returns:
 *  FERRY_OK       *out is a batch the caller must ferry_batch_release();
 *  FERRY_EBATCH   this batch could not be had, and the next call goes on
 *                 with the following one: the dataset failed on it
 *                 (ferry_last_error() names the worker, the first failing
 *                 index and the dataset's message), or it is larger than
 *                 max_message (both sizes named), or workers failed on it
 *                 max_attempts times, or a local worker sent it not
 *                 matching the dataset's schema (what differed named);
 *  FERRY_ERANGE   likewise, for a batch with an index the dataset does not
 *                 have (the plugin's own answer for a missing item);
 *  FERRY_EOF      the stream has ended (epochs or max_batches reached);
 *  FERRY_EWORKER, FERRY_ETIMEDOUT, ...: the loader cannot go on; close it.
 * Only FERRY_EBATCH and FERRY_ERANGE are per batch; after any other code
 * but FERRY_OK the stream is over. */
FERRY_API int ferry_loader_next(ferry_loader *ld, ferry_batch **out);

/* ferry_loader_next waiting at most timeout_ms (0: not at all; negative: as
 * long as it takes), so a trainer can do something else meanwhile, or
 * notice Ctrl-C. FERRY_EAGAIN when no batch was ready by then: nothing has
 * changed, the loader is fine, call again. Otherwise as ferry_loader_next. */
FERRY_API int ferry_loader_next_timeout(ferry_loader *ld, ferry_batch **out, int64_t timeout_ms);

/* Size of the dataset in items and the number of batches in one epoch of
 * this rank. */
FERRY_API int ferry_loader_length(ferry_loader *ld, uint64_t *items, uint64_t *batches_per_epoch);

/* The dataset's schema: each field's name, dtype and the shape of one item
 * (the batch dimension left out), as the workers reported it before open
 * returned. The struct is defined in ferry_dataset.h. */
typedef struct ferry_dataset_schema ferry_dataset_schema;
FERRY_API int ferry_loader_schema(ferry_loader *ld, ferry_dataset_schema *out);

/* With option feed_batches > 0, the trainer says which indices each batch
 * holds: the loader runs over feed_batches batches per epoch (batch seq s
 * is batch s % feed_batches of epoch s / feed_batches), and this gives the
 * indices of batches first_seq .. first_seq+n-1, counts[k] (1..batch_size)
 * each, one batch after another in indices[]. Feed in order and ahead of
 * the prefetch window (the next epochs too, for prefetch across epochs): a
 * batch not fed yet is not started. A batch fed already, or before a
 * resume's start, is skipped, so a resumed loader may be fed again from
 * its epoch's start. Tasks carry the indices: remote workers serve fed
 * batches as any others. FERRY_EINVAL (not fed in order, a count out of
 * range, no feed_batches) or FERRY_ERANGE (an index past the dataset's
 * end), with nothing kept; any thread. */
FERRY_API int ferry_loader_feed(ferry_loader *ld, uint64_t first_seq, uint64_t n,
                                const uint32_t *counts, const uint64_t *indices);

/* Saves the stream position after the last batch delivered, as a blob of at
 * most FERRY_STATE_MAX bytes (version 2: 80 bytes; version 1 blobs, from
 * ferry before resume into another shape, are still read). Only in in_order
 * mode (FERRY_EINVAL otherwise). FERRY_ELIMIT if `cap` is too small (*len
 * says how much is needed). */
#define FERRY_STATE_MAX 128
FERRY_API int ferry_loader_state(ferry_loader *ld, void *buf, size_t cap, size_t *len);

/* The blob ferry_loader_state() would give at the start of epoch `epoch`
 * (before its first batch), whatever has been delivered: a loader opened
 * with it starts that epoch from its first batch (a script that sets the
 * epoch itself, e.g. a sampler's set_epoch(5) when it resumes). In either
 * delivery order (an epoch's start is the same position); FERRY_ERANGE when
 * the stream ends before that epoch; FERRY_ELIMIT as ferry_loader_state(). */
FERRY_API int ferry_loader_state_at_epoch(ferry_loader *ld, uint64_t epoch, void *buf,
                                          size_t cap, size_t *len);

/* Skips the rest of the epoch the trainer is in: the next batch is the
 * next epoch's first, and the batches of this one never come (a loop that
 * leaves its epoch early, as torch's DataLoader drops the rest at the next
 * `for`). What is done of them is released now, what is in flight when it
 * comes, and what was not sent yet is never made; the next epoch's tasks,
 * prefetched already, stay. The state (ferry_loader_state) is the next
 * epoch's start after it. *skipped (may be NULL): the batches passed over,
 * 0 at an epoch's start. A fed loader (option feed_batches) takes the next
 * epoch's batches as they are fed. Only in in_order mode: FERRY_EINVAL
 * otherwise. */
FERRY_API int ferry_loader_skip_epoch(ferry_loader *ld, uint64_t *skipped);

typedef struct ferry_stats {
    uint64_t dispatched; /* tasks sent to workers */
    uint64_t completed;  /* batches (or failures) received from workers */
    uint64_t delivered;  /* batches handed to the trainer by next() */
    uint64_t failed;     /* batches the dataset failed on */
    uint64_t realigned;  /* batches copied to meet the alignment promise */
    uint64_t malformed;  /* messages dropped as malformed */
    uint64_t stale;      /* messages dropped: from a worker given up on, or replies for no task */
    uint64_t restarts;   /* workers replaced after dying or timing out */
    uint64_t timeouts;   /* batches that ran past timeout_ms */
    uint64_t joined;     /* remote workers that became ready */
    uint64_t lost;       /* remote workers given up: silent, unreachable, or said BYE */
    uint64_t rejected;   /* remote workers refused: key not allowed, bad HELLO or READY, full */
    uint32_t workers;    /* workers alive and ready, local and remote */
    uint32_t in_flight;  /* dispatched, not yet delivered */
    uint32_t prefetch;   /* the window: the most batches in flight now (the option, or
                            measured: see credits_why) */
    uint32_t credits;    /* tasks queued at one worker at most: the most any ready worker
                            may hold now (the option, or measured per worker) */
    uint64_t shared;     /* batches (of those completed) that came through shared-memory
                            slots; the rest came by message */
    /* Where the loader's memory is: its shared-memory batch slots (local
     * process workers write batches there; 0s without them). */
    uint64_t slot_bytes;  /* the size of one slot: a batch's bytes, rounded up */
    uint32_t slots;       /* slots in the pool (the window's, and some spare) */
    uint32_t slots_held;  /* slots holding a batch: in the window, or in the trainer's hands */
    uint64_t slot_memory; /* bytes of slot memory allocated now (slots are allocated when
                             first written and given back when idle) */
    /* With bind: connections to the remote sockets open now, admitted or
     * not, and how many times new ones were turned away at the cap. */
    uint32_t remote_connections;
    uint32_t connections_turned_away;
    /* Flow control (docs/remote.md, "Latency"): each worker's credits start
     * at the automatic rule's and are raised to cover the round trip
     * measured for it; the window follows them. Why each is what it is:
     * a FERRY_SIZED_* value (ferry_sized_name). */
    uint32_t credits_min;   /* the fewest any ready worker may hold */
    uint32_t credits_why;   /* the reason that weighs most over the workers */
    uint32_t prefetch_why;
    uint32_t round_trip_us; /* the longest round trip measured to a ready worker (both
                               transfers, not the build); 0: none measured yet */
    uint64_t retirements; /* local workers replaced on purpose, between batches: past
                             worker_max_rss_bytes or max_batches_per_worker (not in
                             restarts: nothing failed) */
    uint64_t reserved[7]; /* room to grow (see "ABI" in docs/install.md); zero */
} ferry_stats;

/* Why the loader's credits or window are what they are (ferry_stats). */
typedef enum ferry_sized {
    FERRY_SIZED_DEFAULT = 0, /* the automatic rule (batch size, workers): nothing measured
                                asks for more */
    FERRY_SIZED_USER = 1,    /* fixed by the option (credits, prefetch) */
    FERRY_SIZED_NEED = 2,    /* raised to cover a measured round trip */
    FERRY_SIZED_MEMORY = 3,  /* more was needed; shm_max_bytes' worth of batches allows no more */
    FERRY_SIZED_LIMIT = 4,   /* more was needed; the hard limit (64 credits, 1024 batches) */
} ferry_sized;

/* "default", "user", "need", "memory", "limit"; "?" for anything else. */
FERRY_API const char *ferry_sized_name(int why);

/* A snapshot of the loader's counters; safe while another thread is in
 * ferry_loader_next(). */
FERRY_API int ferry_loader_stats(ferry_loader *ld, ferry_stats *st);

/* The TCP endpoint remote workers connect to, as bound (a `*` port in the
 * `bind` option resolved to the real one), e.g. "tcp://10.0.0.5:5555".
 * FERRY_ESTATE when the loader was opened without `bind`; FERRY_ELIMIT when
 * it does not fit in cap bytes. */
FERRY_API int ferry_loader_endpoint(ferry_loader *ld, char *buf, size_t cap);

/* The process id of local worker `index` (0 <= index < workers), or 0 in
 * *pid when it is a thread or not running at the moment (being replaced). */
FERRY_API int ferry_loader_worker_pid(ferry_loader *ld, uint32_t index, int *pid);

/* The host name (NUL-terminated, at most 63 bytes) and the pid on that
 * host of the remote worker in slot `index` (workers <= index < workers +
 * max_remote), or of the last one that held it; "" and 0 for a local slot
 * or one no remote worker has taken. Any thread. FERRY_EINVAL: no such
 * slot; FERRY_ELIMIT: the name does not fit in cap bytes. */
FERRY_API int ferry_loader_worker_host(ferry_loader *ld, uint32_t index, char *buf, size_t cap,
                                       int *pid);

/* Page-locking batch slots for a device (pinned memory, cudaHostRegister):
 * a batch from a local process worker lies in a slot of shared memory,
 * the same slots batch after batch, so a slot registered once with a
 * device runtime needs no staging copy for any batch that later lands in
 * it. ferry_loader_keep_slots() tells the loader that slots may be
 * registered: from then on no slot's pages are given back to the system
 * (a registered range must stay backed by the pages it had when it was
 * registered), so the slot memory stays at the most that was ever in
 * flight and held at once. Call it before registering anything.
 * ferry_batch_slot() gives the whole range of the slot batch `b` lies in
 * (the same range for every batch in that slot; fields lie inside it), or
 * FERRY_EINVAL when the batch did not come in a slot (a remote or thread
 * worker's, one sent by message because every slot was taken, or a copy).
 * The ranges stay mapped while the loader is open or any of its batches is
 * held: unregister them before ferry_loader_close(). A slot is reused as
 * soon as its batch is released, so release a batch only once the device
 * has finished copying from it. */
FERRY_API int ferry_loader_keep_slots(ferry_loader *ld);

/* Stops every worker (STOP, a grace period, then SIGTERM and SIGKILL),
 * reaps them and frees everything. Always returns within a bounded time.
 * Batches not yet released stay valid until released. May be called from
 * any thread, but not while another thread is inside ferry_loader_next()
 * on the same loader. */
FERRY_API int ferry_loader_close(ferry_loader *ld);

/* ----------------------------------------------------------------------------
 * Batches.
 */
typedef struct ferry_batch_info {
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint64_t seq;      /* position in the whole stream, from 0 */
    uint32_t size;     /* items in this batch */
    int last_in_epoch; /* 1 for the last batch of its epoch */
    uint32_t worker;   /* index of the worker that built it */
    uint32_t attempts; /* workers it was sent to: 1, or more when a worker
                          holding it died or was given up */
    uint64_t make_ns;  /* the worker's time to build it: the dataset's calls
                          and packing, from the task's arrival to the reply */
    uint64_t flight_ns; /* from dispatch to its arrival at the loader (make_ns,
                           the queue at the worker and both transfers) */
    uint64_t ready_ns;  /* from its arrival to its delivery by next(): how long
                           it waited for the trainer (or for batches before
                           it, in order) */
    uint64_t reserved[8]; /* room to grow (see "ABI" in docs/install.md); zero */
} ferry_batch_info;

FERRY_API void ferry_batch_get_info(const ferry_batch *b, ferry_batch_info *info);
/* The sample indices the batch was built from (size entries). */
FERRY_API const uint64_t *ferry_batch_indices(const ferry_batch *b);
FERRY_API int ferry_batch_nfields(const ferry_batch *b);
/* A view of field `name` (FERRY_EINVAL if there is none) or of field number
 * `i` (0 <= i < nfields). No copy is made. */
FERRY_API int ferry_batch_field(const ferry_batch *b, const char *name, ferry_tensor *t);
FERRY_API int ferry_batch_field_at(const ferry_batch *b, int i, ferry_tensor *t);
/* The slot the batch lies in (see ferry_loader_keep_slots). */
FERRY_API int ferry_batch_slot(const ferry_batch *b, void **data, size_t *len);
/* Gives the batch's memory back. NULL is ignored. */
FERRY_API void ferry_batch_release(ferry_batch *b);

/* ----------------------------------------------------------------------------
 * Where the time goes (docs/profile.md): each delivered batch's life split
 * into stages, kept per worker as counts, sums and histograms, and a
 * verdict in one sentence. The figures are taken on the trainer's side in
 * next(), a few additions per batch, nothing allocated.
 */
#define FERRY_PROFILE_VERSION 1
#define FERRY_PROFILE_BUCKETS 128 /* see ferry_profile_bucket_le() */
#define FERRY_PROFILE_STAGES 8    /* room in ferry_profile; FERRY_STAGE_COUNT are used */

typedef enum ferry_stage {
    FERRY_STAGE_MAKE = 0,    /* the worker built it: the dataset's work and packing (make_ns) */
    FERRY_STAGE_TRANSIT = 1, /* queued at the worker and both transfers (flight_ns - make_ns) */
    FERRY_STAGE_ORDER = 2,   /* arrived, and held back while the trainer waited in next()
                                for an earlier batch (in order) */
    FERRY_STAGE_HELD = 3,    /* arrived, waiting for the trainer to ask (ready_ns - order) */
    FERRY_STAGE_WAIT = 4,    /* the trainer's wait inside next() that ended with it */
    FERRY_STAGE_STEP = 5,    /* the trainer's step with it: from next() returning it to the
                                next call (counted when that call comes) */
    FERRY_STAGE_COUNT = 6
} ferry_stage;

/* "make", "transit", "order", "held", "wait", "step"; "?" for anything else. */
FERRY_API const char *ferry_stage_name(int stage);

/* One stage: how many batches, their summed time, and a histogram.
 * Bucket 0 counts times below 1024 ns; past it each power of two from
 * 2^10 ns is cut in four equal buckets; the last is open-ended. */
typedef struct ferry_profile_stage {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t buckets[FERRY_PROFILE_BUCKETS];
} ferry_profile_stage;

typedef struct ferry_profile {
    uint32_t version;  /* FERRY_PROFILE_VERSION */
    uint32_t workers;  /* worker slots: ferry_loader_profile's `worker` is below this */
    int32_t worker;    /* whose batches: a worker's index, or -1 for all */
    uint32_t in_order; /* the loader hands batches out in order */
    uint64_t start_ns; /* the span the figures cover, on the monotonic clock: the */
    uint64_t end_ns;   /* loader's open (or an earlier snapshot) to this snapshot */
    /* Copied from ferry_stats when taken, for the verdict. */
    uint32_t workers_ready;
    uint32_t prefetch_why; /* FERRY_SIZED_* */
    uint32_t credits_why;
    uint32_t reserved32;
    ferry_profile_stage stage[FERRY_PROFILE_STAGES];
    uint64_t reserved[8]; /* room to grow (see "ABI" in docs/install.md); zero */
} ferry_profile;

/* The figures since open of one worker's batches (0 <= worker < slots)
 * or of all (worker -1). Any thread, while another is in next(). */
FERRY_API int ferry_loader_profile(ferry_loader *ld, int32_t worker, ferry_profile *out);
/* The figures between two snapshots of the same worker (`before` taken
 * first): a window of time. `out` may be `now`. */
FERRY_API void ferry_profile_since(ferry_profile *out, const ferry_profile *now,
                                   const ferry_profile *before);
/* The q-quantile (0..1) of a stage in ns, interpolated in its bucket; 0
 * with no batches. */
FERRY_API uint64_t ferry_profile_quantile(const ferry_profile_stage *s, double q);
/* The upper bound (exclusive) of bucket i in ns; UINT64_MAX for the last. */
FERRY_API uint64_t ferry_profile_bucket_le(int i);

typedef enum ferry_verdict_kind {
    FERRY_VERDICT_UNKNOWN = 0,     /* too few batches to say */
    FERRY_VERDICT_TRAINER = 1,     /* the trainer rarely waits: the loader is not the problem */
    FERRY_VERDICT_WORKERS = 2,     /* input-bound, the workers busy: more workers */
    FERRY_VERDICT_SLOW_WORKER = 3, /* one worker much slower than the others */
    FERRY_VERDICT_ORDER = 4,       /* batches wait behind a late one: in_order off */
    FERRY_VERDICT_NETWORK = 5,     /* the workers idle, the flight dominates */
    FERRY_VERDICT_MEMORY = 6,      /* the window or credits are held down by memory */
    FERRY_VERDICT_INPUT = 7,       /* input-bound, none of the above */
} ferry_verdict_kind;

/* "unknown", "trainer-bound", "input-bound", "slow-worker", "order-bound",
 * "network-bound", "memory-bound", "input-bound"; "?" for anything else. */
FERRY_API const char *ferry_verdict_name(int kind);

typedef struct ferry_verdict {
    int32_t kind;            /* FERRY_VERDICT_* */
    int32_t worker;          /* FERRY_VERDICT_SLOW_WORKER: its index; else -1 */
    uint32_t workers_needed; /* FERRY_VERDICT_WORKERS: workers that would cover the
                                trainer's rate; else 0 */
    uint32_t reserved32;
    double wait_share; /* the trainer's time in next() over its wait and step */
    char text[320];    /* the sentence */
    uint64_t reserved[4];
} ferry_verdict;

/* The verdict on a span: `all` the loader's figures, `per_worker[i]`
 * worker i's over the same span (n of them). A pure function of its
 * arguments. */
FERRY_API int ferry_profile_verdict(const ferry_profile *all, const ferry_profile *per_worker,
                                    uint32_t n, ferry_verdict *out);

/* A trace of the last `max_batches` batches delivered (0 stops it and
 * forgets them), written by ferry_loader_trace_write() as Chrome
 * trace-event JSON that Perfetto's UI opens: one track per worker (its
 * builds) and one for the trainer (waits and steps). Call both from the
 * thread that calls next(), not during it. FERRY_ENOMEM, FERRY_ESYS
 * (the file could not be written, with the reason). */
FERRY_API int ferry_loader_trace(ferry_loader *ld, uint32_t max_batches);
FERRY_API int ferry_loader_trace_write(ferry_loader *ld, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
