/*
 * config.h - the loader's options, as one plain struct.
 *
 * The public ferry_config is this struct; ferry_config_set() fills it through
 * a table of option names, types and ranges (config.c), so every option is
 * checked in one place and the loader reads plain fields.
 */
#ifndef FERRY_CORE_CONFIG_H
#define FERRY_CORE_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "ferry.h"
#include "log.h"
#include "mix.h"

#define FERRY__ENDPOINT_MAX 256
/* A dataset spec, with its NUL; the wire protocol carries as much (checked
 * where CONFIG is built). */
#define FERRY__DATASET_MAX 4096
/* worker_args: the arguments put before ferry's own, one per line (at most
 * FERRY__WORKER_ARGS_N of them). */
#define FERRY__WORKER_ARGS_MAX 4096
#define FERRY__WORKER_ARGS_N 32

typedef enum ferry__on_failure {
    FERRY__ON_FAILURE_RESTART = 0,
    FERRY__ON_FAILURE_FAIL = 1,
} ferry__on_failure;

typedef enum ferry__placement {
    FERRY__PLACE_PROCESS = 0,
    FERRY__PLACE_THREAD = 1,
} ferry__placement;

struct ferry_config {
    char dataset[FERRY__DATASET_MAX];
    char mix[FERRY__MIX_SPEC_MAX]; /* several sources drawn by weight (sampler/mix.h), "" = none */
    int64_t batch_size;
    int64_t drop_last;
    int64_t shuffle; /* -1: on when a seed was set */
    int64_t seed;
    int64_t seed_set;
    int64_t rank;
    int64_t world_size;
    int64_t pad_shards;
    int64_t workers;
    int64_t worker_mode; /* ferry__placement */
    int64_t prefetch;    /* 0: 2 * workers * credits */
    int64_t credits;     /* 0: ferry__config_credits decides */
    int64_t in_order;
    int64_t feed_batches; /* > 0: the trainer feeds each batch's indices (ferry_loader_feed) */
    int64_t epochs;
    int64_t max_batches;
    int64_t timeout_ms; /* a batch not delivered within this: error; 0 = off */
    int64_t start_timeout_ms;
    int64_t close_grace_ms;
    int64_t epoch_barrier;
    int64_t pin_tasks; /* 1: task seq s goes to local worker s % workers only; 2: batch b
                        * of each epoch to worker b % workers (torch's assignment) */
    int64_t max_message;       /* ZMQ_MAXMSGSIZE for the loader's socket */
    int64_t shm;               /* local process workers' batches through shared memory */
    int64_t shm_max_bytes;     /* the most memory for their slots */
    int64_t on_worker_failure; /* ferry__on_failure */
    int64_t max_attempts;      /* workers a batch may take down before it is given up */
    int64_t worker_max_rss_bytes;   /* a local process worker retires past this private
                                     * memory (retire.h); 0: never */
    int64_t max_batches_per_worker; /* ... or after answering this many tasks; 0: never */
    char worker_path[PATH_MAX];
    char worker_args[FERRY__WORKER_ARGS_MAX]; /* newline-separated, before ferry's own */
    int64_t fork_server;     /* local processes are forked by one clean parent (pool.h) */
    int64_t fork_from;       /* a clean parent's control socket to fork ours from, -1: none */
    int64_t dataset_fd;      /* bytes every local process worker is given (--data-fd), -1: none */
    char bind[FERRY__ENDPOINT_MAX]; /* tcp:// endpoint for remote workers, "" = none */
    char curve_key[PATH_MAX];       /* the loader's key pair file */
    char curve_allow[PATH_MAX];     /* allow-list file or directory of worker .pub files */
    int64_t insecure;               /* plain TCP allowed (warned about) */
    int64_t data_port;              /* plain TCP: the data socket's port, 0: any free one */
    int64_t min_workers;            /* -1: workers, or 1 when there are none */
    int64_t open_local_ready;       /* local workers ready before open returns; -1: all */
    int64_t max_remote;
    int64_t heartbeat_ms;
    int64_t heartbeat_liveness;
    int64_t io_threads; /* the loader's ZeroMQ I/O threads, 0: auto */
    int64_t log_level; /* position in the level names: debug, info, warning, error */
    ferry_log_fn log_fn;
    void *log_user;
    ferry_exit_fn exit_fn; /* told of each worker process reaped */
    void *exit_user;
    unsigned char state[FERRY_STATE_MAX];
    size_t state_len;
};

/* Tasks queued per worker: the option, or when 0, enough for 32 items
 * (ceil(32 / batch_size)), at least 2 and at most 16. */
int64_t ferry__config_credits(const ferry_config *cfg);

/* The effective prefetch window of a config: 2 x credits per worker slot
 * (local workers plus max_remote when bound), at most 1024 when remote. */
int64_t ferry__config_prefetch(const ferry_config *cfg);
/* The window's entries: the most batches flow control may keep in flight. */
int64_t ferry__config_window_entries(const ferry_config *cfg);

/* Worker slots: local workers, then max_remote remote ones when bound. */
int64_t ferry__config_slots(const ferry_config *cfg);

/* The lines of a newline-separated list (worker_args): 0 for "", and a
 * trailing newline ends the last line without starting another. */
int ferry__count_lines(const char *s);

/* Where this config's messages go, at which level. */
ferry__log ferry__config_log(const ferry_config *cfg);

/* The loader's ZeroMQ I/O threads: io_threads when set; else, with bind,
 * one per online CPU up to 4 (each remote connection's receiving and CURVE
 * decryption run on one I/O thread, and libzmq gives each new connection
 * to the least loaded one); else 1, ZeroMQ's default (ipc:// and inproc
 * ask little of it). */
int ferry__config_io_threads(const ferry_config *cfg);

/* Ready workers (local and remote) open waits for. */
int64_t ferry__config_min_workers(const ferry_config *cfg);

#endif
