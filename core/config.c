/*
 * config.c - ferry_config: option names, types, ranges and defaults.
 *
 * One table describes every option; ferry_config_set() and
 * ferry_config_set_int() both go through it, so a value is range-checked the
 * same way whichever call sets it, and an error names the option and its
 * allowed range. A failed set leaves the config unchanged.
 */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "alloc.h"
#include "error.h"
#include "protocol.h"
#include "sampler.h"

typedef enum opt_kind { OPT_INT, OPT_BOOL, OPT_STR, OPT_ENUM } opt_kind;

typedef struct opt_def {
    const char *name;
    opt_kind kind;
    size_t offset;
    int64_t min, max;           /* OPT_INT; for OPT_STR, max is the buffer size */
    const char *const *choices; /* OPT_ENUM, NULL-terminated; value = position */
    const char *help;
} opt_def;

static const char *const placement_names[] = {"process", "thread", NULL};
static const char *const failure_names[] = {"restart", "fail", NULL};
/* Positions 0..3 are FERRY_LOG_DEBUG..FERRY_LOG_ERROR (10..40). */
static const char *const log_level_names[] = {"debug", "info", "warning", "error", NULL};

#define OFF(f) offsetof(struct ferry_config, f)
static const opt_def options[] = {
    {"dataset", OPT_STR, OFF(dataset), 0, FERRY__DATASET_MAX, NULL, "dataset spec"},
    {"batch_size", OPT_INT, OFF(batch_size), 1, FERRY__MAX_BATCH, NULL, "items per batch"},
    {"drop_last", OPT_BOOL, OFF(drop_last), 0, 1, NULL, "drop a short last batch"},
    {"shuffle", OPT_BOOL, OFF(shuffle), 0, 1, NULL, "shuffle each epoch"},
    {"seed", OPT_INT, OFF(seed), 0, INT64_MAX, NULL, "shuffle and augmentation seed"},
    {"rank", OPT_INT, OFF(rank), 0, UINT32_MAX - 1, NULL, "this trainer's shard"},
    {"world_size", OPT_INT, OFF(world_size), 1, UINT32_MAX, NULL, "number of shards"},
    {"pad_shards", OPT_BOOL, OFF(pad_shards), 0, 1, NULL,
     "each rank ceil(n / world_size) items, the order's start repeated (unless drop_last)"},
    {"workers", OPT_INT, OFF(workers), 0, 256, NULL, "local worker processes or threads"},
    {"worker_mode", OPT_ENUM, OFF(worker_mode), 0, 0, placement_names, "process or thread"},
    {"prefetch", OPT_INT, OFF(prefetch), 0, 1024, NULL, "batches in flight (0: auto)"},
    {"credits", OPT_INT, OFF(credits), 0, FERRY__MAX_CREDITS, NULL,
     "tasks queued per worker (0: auto)"},
    {"in_order", OPT_BOOL, OFF(in_order), 0, 1, NULL, "deliver in sampler order"},
    {"feed_batches", OPT_INT, OFF(feed_batches), 0, INT64_MAX, NULL,
     "batches per epoch whose indices the trainer feeds (ferry_loader_feed), at most "
     "batch_size each; 0: the loader's own sampler"},
    {"mix", OPT_STR, OFF(mix), 0, FERRY__MIX_SPEC_MAX, NULL,
     "the dataset is sources end to end, drawn by weight: SIZES;0:WEIGHTS[;STEP:WEIGHTS...]"
     "[;length=L] (positions of the mixed order)"},
    {"epochs", OPT_INT, OFF(epochs), 0, INT64_MAX, NULL, "stop after this many epochs"},
    {"max_batches", OPT_INT, OFF(max_batches), 0, INT64_MAX, NULL, "stop after this many batches"},
    {"timeout_ms", OPT_INT, OFF(timeout_ms), 0, 86400000, NULL, "per-batch deadline"},
    {"start_timeout_ms", OPT_INT, OFF(start_timeout_ms), 1, 86400000, NULL, "open deadline"},
    {"close_grace_ms", OPT_INT, OFF(close_grace_ms), 0, 600000, NULL, "STOP to SIGTERM"},
    {"epoch_barrier", OPT_BOOL, OFF(epoch_barrier), 0, 1, NULL, "no prefetch across epochs"},
    {"pin_tasks", OPT_BOOL, OFF(pin_tasks), 0, 2, NULL,
     "1: batch seq s is made by local worker s % workers only (per-worker streams); 2: batch b "
     "of each epoch by worker b % workers (torch's DataLoader's assignment)"},
    {"max_message", OPT_INT, OFF(max_message), FERRY__MIN_MESSAGE, INT64_MAX, NULL,
     "largest message"},
    {"shm", OPT_BOOL, OFF(shm), 0, 1, NULL,
     "local process workers write batches into shared memory"},
    {"shm_max_bytes", OPT_INT, OFF(shm_max_bytes), 0, INT64_MAX, NULL,
     "most shared memory for batch slots"},
    {"on_worker_failure", OPT_ENUM, OFF(on_worker_failure), 0, 0, failure_names, "restart or fail"},
    {"max_attempts", OPT_INT, OFF(max_attempts), 1, 100, NULL, "tries of a batch that kills"},
    {"worker_max_rss_bytes", OPT_INT, OFF(worker_max_rss_bytes), 0, INT64_MAX, NULL,
     "a local worker process past this private resident memory is replaced after its batch "
     "(0: never)"},
    {"max_batches_per_worker", OPT_INT, OFF(max_batches_per_worker), 0, INT64_MAX, NULL,
     "a local worker process is replaced after this many batches (0: never)"},
    {"worker_path", OPT_STR, OFF(worker_path), 0, PATH_MAX, NULL, "ferry-worker program"},
    {"worker_args", OPT_STR, OFF(worker_args), 0, FERRY__WORKER_ARGS_MAX, NULL,
     "arguments before ferry's own, one per line"},
    {"fork_server", OPT_BOOL, OFF(fork_server), 0, 1, NULL,
     "local processes are forked by one clean parent that loads the dataset once"},
    {"fork_from", OPT_INT, OFF(fork_from), -1, INT_MAX, NULL,
     "fd of a running clean parent to fork this loader's from (-1: spawn one)"},
    {"dataset_fd", OPT_INT, OFF(dataset_fd), -1, INT_MAX, NULL,
     "fd of bytes every local process worker is given (-1: none)"},
    {"bind", OPT_STR, OFF(bind), 0, FERRY__ENDPOINT_MAX, NULL,
     "tcp:// endpoint for remote workers"},
    {"curve_key", OPT_STR, OFF(curve_key), 0, PATH_MAX, NULL, "the loader's key pair file"},
    {"curve_allow", OPT_STR, OFF(curve_allow), 0, PATH_MAX, NULL, "allowed worker keys"},
    {"insecure", OPT_BOOL, OFF(insecure), 0, 1, NULL, "plain TCP, no authentication"},
    {"data_port", OPT_INT, OFF(data_port), 0, 65535, NULL,
     "port of admitted remote workers' data connections, 0: any free one"},
    {"min_workers", OPT_INT, OFF(min_workers), -1, 1280, NULL, "ready workers before open returns"},
    {"open_local_ready", OPT_INT, OFF(open_local_ready), -1, 1024, NULL,
     "local workers ready before open returns, -1: all (the others start meanwhile and are "
     "replaced as any worker is when they die)"},
    {"max_remote", OPT_INT, OFF(max_remote), 1, 1024, NULL, "remote workers at once"},
    {"heartbeat_ms", OPT_INT, OFF(heartbeat_ms), 10, 600000, NULL, "remote heartbeat interval"},
    {"heartbeat_liveness", OPT_INT, OFF(heartbeat_liveness), 1, 1000, NULL,
     "silent intervals before a remote worker is lost"},
    {"io_threads", OPT_INT, OFF(io_threads), 0, 64, NULL,
     "the loader's ZeroMQ I/O threads, 0: auto (with bind, min(CPUs, 4))"},
    {"log_level", OPT_ENUM, OFF(log_level), 0, 0, log_level_names,
     "least level of message passed on"},
};
#undef OFF

ferry_config *ferry_config_new(void)
{
    ferry_config *c = ferry__calloc(1, sizeof *c);
    if (!c)
        return NULL;
    strcpy(c->dataset, "synthetic:n=60000,dim=784");
    c->batch_size = 256;
    c->shuffle = -1;
    c->world_size = 1;
    c->pad_shards = 1;
    c->workers = 2;
    c->worker_mode = FERRY__PLACE_PROCESS;
    c->credits = 0; /* auto: ferry__config_credits */
    c->in_order = 1;
    c->start_timeout_ms = 30000;
    c->close_grace_ms = 2000;
    c->max_message = (int64_t)1 << 31;
    c->shm = 1;
    c->shm_max_bytes = (int64_t)1 << 30;
    c->on_worker_failure = FERRY__ON_FAILURE_RESTART;
    c->max_attempts = 3;
    c->min_workers = -1;
    c->open_local_ready = -1;
    c->fork_from = -1;
    c->dataset_fd = -1;
    c->max_remote = 16;
    c->heartbeat_ms = 400;
    c->heartbeat_liveness = 3;
    c->log_level = 1; /* info */
    return c;
}

void ferry_config_free(ferry_config *cfg)
{
    free(cfg);
}

int64_t ferry__config_credits(const ferry_config *cfg)
{
    if (cfg->credits > 0)
        return cfg->credits;
    /* At least 32 items queued per worker: a tiny batch is built in less
     * time than a round trip's wake-ups take, and only a deep queue keeps
     * the worker busy meanwhile (batch size 1: 16 credits, 123 -> 45 us
     * per batch in process placement). Never fewer than 2, which hide one
     * batch's round trip behind the next's building. */
    int64_t c = (32 + cfg->batch_size - 1) / cfg->batch_size;
    return c < 2 ? 2 : c > 16 ? 16 : c;
}

int64_t ferry__config_prefetch(const ferry_config *cfg)
{
    if (cfg->prefetch > 0)
        return cfg->prefetch;
    int64_t slots = ferry__config_slots(cfg);
    int64_t auto_window = 2 * slots * ferry__config_credits(cfg);
    return cfg->bind[0] && auto_window > 1024 ? 1024 : auto_window;
}

/* The most batches flow control may grow an automatic window to (the
 * window's entries): 512, within 32 MiB of index arrays, never below the
 * automatic window; a window the user fixed stays as it is. */
int64_t ferry__config_window_entries(const ferry_config *cfg)
{
    int64_t window = ferry__config_prefetch(cfg);
    if (cfg->prefetch > 0)
        return window;
    int64_t most = ((int64_t)32 << 20) / (8 * cfg->batch_size);
    most = most > 512 ? 512 : most;
    return window > most ? window : most;
}

int ferry__count_lines(const char *s)
{
    int n = 0;
    for (const char *p = s; *p; n++) {
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p + strlen(p);
    }
    return n;
}

int64_t ferry__config_slots(const ferry_config *cfg)
{
    return cfg->workers + (cfg->bind[0] ? cfg->max_remote : 0);
}

int ferry__config_io_threads(const ferry_config *cfg)
{
    if (cfg->io_threads > 0)
        return (int)cfg->io_threads;
    if (!cfg->bind[0])
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus;
}

int64_t ferry__config_min_workers(const ferry_config *cfg)
{
    if (cfg->min_workers >= 0)
        return cfg->min_workers;
    /* by default, the local workers open waits for (every one) */
    int64_t local = cfg->open_local_ready >= 0 && cfg->open_local_ready < cfg->workers
                        ? cfg->open_local_ready
                        : cfg->workers;
    return local > 0 ? local : 1;
}

static const opt_def *find_option(const char *key)
{
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        if (strcmp(options[i].name, key) == 0)
            return &options[i];
    }
    return NULL;
}

static int64_t *int_field(ferry_config *cfg, const opt_def *d)
{
    return (int64_t *)((char *)cfg + d->offset);
}

/* Stores an integer after the range check; the one place values land. */
static int store_int(ferry_config *cfg, const opt_def *d, int64_t v)
{
    if (v < d->min || v > d->max) {
        if (d->kind == OPT_BOOL)
            return ferry__seterr(FERRY_EINVAL, "option '%s' is a boolean (0 or 1), got %lld",
                                 d->name, (long long)v);
        return ferry__seterr(FERRY_EINVAL, "option '%s' must be between %lld and %lld, got %lld",
                             d->name, (long long)d->min, (long long)d->max, (long long)v);
    }
    *int_field(cfg, d) = v;
    if (strcmp(d->name, "seed") == 0)
        cfg->seed_set = 1;
    return FERRY_OK;
}

static const opt_def *lookup(const ferry_config *cfg, const char *key, int *rc)
{
    if (!cfg || !key) {
        *rc = ferry__seterr(FERRY_EINVAL, "config and key must not be NULL");
        return NULL;
    }
    const opt_def *d = find_option(key);
    if (!d)
        *rc = ferry__seterr(FERRY_EOPTION, "unknown option '%s'", key);
    return d;
}

int ferry_config_set(ferry_config *cfg, const char *key, const char *value)
{
    int rc;
    const opt_def *d = lookup(cfg, key, &rc);
    if (!d)
        return rc;
    if (!value)
        return ferry__seterr(FERRY_EINVAL, "option '%s': value must not be NULL", key);

    switch (d->kind) {
    case OPT_STR: {
        size_t len = strlen(value);
        if (len >= (size_t)d->max)
            return ferry__seterr(FERRY_EINVAL, "option '%s' is too long (%zu bytes, limit %lld)",
                                 key, len, (long long)d->max - 1);
        if (strcmp(key, "worker_args") == 0 && ferry__count_lines(value) > FERRY__WORKER_ARGS_N)
            return ferry__seterr(FERRY_EINVAL, "option 'worker_args' has more than %d arguments",
                                 FERRY__WORKER_ARGS_N);
        memcpy((char *)cfg + d->offset, value, len + 1);
        return FERRY_OK;
    }
    case OPT_ENUM: {
        char list[128] = "";
        for (int i = 0; d->choices[i]; i++) {
            if (strcmp(d->choices[i], value) == 0) {
                *int_field(cfg, d) = i;
                return FERRY_OK;
            }
            size_t at = strlen(list);
            snprintf(list + at, sizeof list - at, "%s%s", i == 0 ? "" : d->choices[i + 1] ? ", " : " or ",
                     d->choices[i]);
        }
        return ferry__seterr(FERRY_EINVAL, "option '%s' must be %s; got '%s'", key, list, value);
    }
    case OPT_BOOL:
        if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcasecmp(value, "on"))
            return store_int(cfg, d, 1);
        if (!strcasecmp(value, "false") || !strcasecmp(value, "no") || !strcasecmp(value, "off"))
            return store_int(cfg, d, 0);
        __attribute__((fallthrough)); /* 0 / 1 */
    case OPT_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end != '\0')
            return ferry__seterr(FERRY_EINVAL, "option '%s' needs an integer, got '%s'", key,
                                 value);
        return store_int(cfg, d, v);
    }
    }
    return ferry__seterr(FERRY_EINVAL, "option '%s' cannot be set", key);
}

int ferry_config_set_int(ferry_config *cfg, const char *key, int64_t value)
{
    int rc;
    const opt_def *d = lookup(cfg, key, &rc);
    if (!d)
        return rc;
    if (d->kind == OPT_STR)
        return ferry__seterr(FERRY_EINVAL, "option '%s' takes a string", key);
    if (d->kind == OPT_ENUM) {
        int n = 0;
        while (d->choices[n])
            n++;
        if (value < 0 || value >= n)
            return ferry__seterr(FERRY_EINVAL, "option '%s' must be 0..%d, got %lld", key, n - 1,
                                 (long long)value);
        *int_field(cfg, d) = value;
        return FERRY_OK;
    }
    return store_int(cfg, d, value);
}

int ferry_config_set_log(ferry_config *cfg, ferry_log_fn fn, void *user)
{
    if (!cfg)
        return ferry__seterr(FERRY_EINVAL, "config must not be NULL");
    cfg->log_fn = fn;
    cfg->log_user = fn ? user : NULL;
    return FERRY_OK;
}

int ferry_config_set_exit_fn(ferry_config *cfg, ferry_exit_fn fn, void *user)
{
    if (!cfg)
        return ferry__seterr(FERRY_EINVAL, "config must not be NULL");
    cfg->exit_fn = fn;
    cfg->exit_user = fn ? user : NULL;
    return FERRY_OK;
}

ferry__log ferry__config_log(const ferry_config *cfg)
{
    return (ferry__log){cfg->log_fn, cfg->log_user, (int)(cfg->log_level + 1) * 10};
}

int ferry_config_set_state(ferry_config *cfg, const void *state, size_t len)
{
    if (!cfg || (!state && len))
        return ferry__seterr(FERRY_EINVAL, "config and state must not be NULL");
    if (len > FERRY_STATE_MAX)
        return ferry__seterr(FERRY_ESTATE, "state blob is %zu bytes, at most %d are valid", len,
                             FERRY_STATE_MAX);
    if (len)
        memcpy(cfg->state, state, len);
    cfg->state_len = len;
    return FERRY_OK;
}

int ferry_state_check(const void *const *states, const size_t *lens, size_t count)
{
    return ferry__sampler_states_agree(states, lens, count);
}
