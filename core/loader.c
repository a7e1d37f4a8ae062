/*
 * loader.c - the public ferry_loader_* functions, and nothing else: each
 * checks its arguments and hands over to the window (what the trainer
 * reads) or the scheduler (the thread that runs the workers).
 *
 * A loader is its options, its prefetch window and its scheduler. Open
 * builds the window, starts the scheduler, and waits until the window runs
 * (open_local_ready local workers, every one by default, and min_workers
 * in all are ready) or fails; close
 * stops the scheduler, which shuts the workers down, then frees the window.
 *
 * Threads: one trainer thread at a time calls these; the scheduler thread
 * runs behind them. Only the window is shared between the two.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ferry_dataset.h"
#include "batch.h"
#include "config.h"
#include "dataset.h"
#include "error.h"
#include "peer.h"
#include "profile.h"
#include "scheduler.h"
#include "window.h"

struct ferry_loader {
    ferry_config cfg;
    ferry__window *win;
    ferry__scheduler *sched;
    ferry__profile *prof; /* where each batch's time went (profile.h) */
};

static int check_config(const ferry_config *cfg)
{
    if (!cfg->dataset[0])
        return ferry__seterr(FERRY_EINVAL, "option 'dataset' is empty");
    if (cfg->rank >= cfg->world_size)
        return ferry__seterr(FERRY_EINVAL, "rank %lld must be below world_size %lld",
                             (long long)cfg->rank, (long long)cfg->world_size);
    if (cfg->workers == 0 && !cfg->bind[0])
        return ferry__seterr(FERRY_EINVAL, "workers is 0 and no bind endpoint is set: the loader "
                                           "would have no workers");
    if (ferry__config_min_workers(cfg) > ferry__config_slots(cfg))
        return ferry__seterr(FERRY_EINVAL,
                             "min_workers %lld is more than the %lld workers the loader can have "
                             "(workers + max_remote)",
                             (long long)ferry__config_min_workers(cfg),
                             (long long)ferry__config_slots(cfg));
    if (cfg->workers == 0 && ferry__config_min_workers(cfg) == 0)
        return ferry__seterr(FERRY_EINVAL, "min_workers must be at least 1 without local workers "
                                           "(the dataset's length comes from a worker)");
    if (cfg->mix[0] && cfg->feed_batches)
        return ferry__seterr(FERRY_EINVAL, "mix and feed_batches: a mix is ferry's own order of "
                                           "the sources, a feed the trainer's; use one");
    if (cfg->pin_tasks && (cfg->bind[0] || cfg->workers == 0))
        return ferry__seterr(FERRY_EINVAL, "pin_tasks needs local workers and no bind: each "
                                           "batch is made by one given local worker");
    if (cfg->feed_batches && (cfg->shuffle > 0 || cfg->world_size > 1 || cfg->drop_last))
        return ferry__seterr(FERRY_EINVAL, "feed_batches: the trainer's feed decides each batch "
                                           "and its order; shuffle, world_size and drop_last "
                                           "are its own to apply");
    if ((cfg->worker_max_rss_bytes || cfg->max_batches_per_worker) &&
        cfg->worker_mode == FERRY__PLACE_THREAD)
        return ferry__seterr(FERRY_EINVAL,
                             "option '%s' replaces worker processes, and thread workers "
                             "(worker_mode thread) cannot be: their memory is the trainer's. "
                             "Use worker_mode process, or leave the option 0",
                             cfg->worker_max_rss_bytes ? "worker_max_rss_bytes"
                                                       : "max_batches_per_worker");
    if (ferry__config_prefetch(cfg) > FERRY__WINDOW_MAX)
        return ferry__seterr(FERRY_EINVAL, "prefetch %lld is more than %d",
                             (long long)ferry__config_prefetch(cfg), FERRY__WINDOW_MAX);
    return FERRY_OK;
}

static int open_window(ferry__window **win, const ferry_config *cfg)
{
    int fed = cfg->feed_batches > 0;
    ferry__mix *mix = NULL;
    if (cfg->mix[0]) {
        int rc = ferry__mix_parse(cfg->mix, &mix);
        if (rc != FERRY_OK)
            return rc;
    }
    ferry__window_opts o = {
        .prefetch = (uint32_t)ferry__config_prefetch(cfg),
        .entries = (uint32_t)ferry__config_window_entries(cfg),
        .nworkers = (uint32_t)ferry__config_slots(cfg),
        .in_order = (int)cfg->in_order,
        .epoch_barrier = (int)cfg->epoch_barrier,
        .max_attempts = (uint32_t)cfg->max_attempts,
        .feed_max = fed ? (uint32_t)cfg->batch_size : 0,
        .feed_batches = fed ? (uint64_t)cfg->feed_batches : 0,
        /* Fed: the sampler runs over the epoch's batch positions, one each,
         * in order; the feed says what each stands for. */
        .sampler = {.batch_size = fed ? 1 : (uint64_t)cfg->batch_size,
                    .drop_last = (int)cfg->drop_last,
                    .shuffle = fed ? 0 : cfg->shuffle < 0 ? (int)cfg->seed_set : (int)cfg->shuffle,
                    .seed = (uint64_t)cfg->seed,
                    .rank = (uint32_t)cfg->rank,
                    .world_size = (uint32_t)cfg->world_size,
                    .pad_shards = (int)cfg->pad_shards,
                    .epochs = (uint64_t)cfg->epochs,
                    .max_batches = (uint64_t)cfg->max_batches,
                    .mix = mix}, /* the window's from here on */
        .state = cfg->state_len ? cfg->state : NULL,
        .state_len = cfg->state_len,
    };
    return ferry__window_new(win, &o);
}

int ferry_loader_open(ferry_loader **out, const ferry_config *cfg)
{
    if (!out || !cfg)
        return ferry__seterr(FERRY_EINVAL, "out and cfg must not be NULL");
    int rc = check_config(cfg);
    if (rc != FERRY_OK)
        return rc;
    ferry_loader *ld = ferry__calloc(1, sizeof *ld);
    if (!ld)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    ld->cfg = *cfg;
    /* Relative paths are the trainer's: resolved here, where they were
     * written, not in each worker's directory. */
    rc = ferry__dataset_absolute(cfg->dataset, ld->cfg.dataset, sizeof ld->cfg.dataset);
    if (rc != FERRY_OK) {
        free(ld);
        return rc;
    }
    rc = ferry__profile_new(&ld->prof, (uint32_t)ferry__config_slots(&ld->cfg),
                            (int)ld->cfg.in_order);
    if (rc == FERRY_OK)
        rc = open_window(&ld->win, &ld->cfg);
    if (rc == FERRY_OK)
        rc = ferry__scheduler_start(&ld->sched, &ld->cfg, ld->win);
    if (rc == FERRY_OK)
        rc = ferry__window_wait_started(ld->win);
    if (rc != FERRY_OK) {
        /* Keep the failure's detail across the shutdown. */
        char msg[FERRY__ERRMSG_MAX];
        strncpy(msg, ferry_last_error(), sizeof msg - 1);
        msg[sizeof msg - 1] = '\0';
        ferry__scheduler_stop(ld->sched);
        ferry__window_free(ld->win);
        ferry__profile_free(ld->prof);
        free(ld);
        return ferry__seterr_str(rc, msg);
    }
    *out = ld;
    return FERRY_OK;
}

int ferry_loader_next(ferry_loader *ld, ferry_batch **out)
{
    return ferry_loader_next_timeout(ld, out, -1);
}

int ferry_loader_next_timeout(ferry_loader *ld, ferry_batch **out, int64_t timeout_ms)
{
    if (!ld || !out)
        return ferry__seterr(FERRY_EINVAL, "loader and out must not be NULL");
    ferry__profile_enter(ld->prof);
    int rc = ferry__window_next(ld->win, out, timeout_ms);
    if (rc == FERRY_OK)
        ferry__profile_delivered(ld->prof, *out);
    else if (rc != FERRY_EAGAIN)
        ferry__profile_broke(ld->prof);
    /* The stream's last batch (the last of an epoch, or of max_batches):
     * no slot will be given again, and the slots' memory goes back now
     * rather than at the scheduler's next trim. Looked at only there, not
     * for every batch. */
    if (rc == FERRY_OK && ((*out)->info.last_in_epoch || ld->cfg.max_batches > 0) &&
        ferry__window_ended(ld->win))
        ferry__scheduler_stream_ended(ld->sched);
    return rc;
}

int ferry_loader_length(ferry_loader *ld, uint64_t *items, uint64_t *batches_per_epoch)
{
    if (!ld)
        return ferry__seterr(FERRY_EINVAL, "loader must not be NULL");
    return ferry__window_length(ld->win, items, batches_per_epoch);
}

int ferry_loader_schema(ferry_loader *ld, ferry_dataset_schema *out)
{
    if (!ld || !out)
        return ferry__seterr(FERRY_EINVAL, "loader and out must not be NULL");
    const ferry__schema *sc = ferry__scheduler_schema(ld->sched);
    memset(out, 0, sizeof *out);
    out->nfields = (int)sc->nfields;
    for (uint32_t f = 0; f < sc->nfields; f++) {
        const ferry__item_field *in = &sc->fields[f];
        ferry_field_spec *o = &out->fields[f];
        memcpy(o->name, in->name, sizeof o->name);
        o->dtype = in->dtype;
        if (in->var) {
            o->ndim = FERRY_NDIM_VAR;
            o->shape[0] = in->ndim ? in->shape[0] : 0;
            continue;
        }
        o->ndim = in->ndim;
        for (int d = 0; d < in->ndim; d++)
            o->shape[d] = in->shape[d];
    }
    return FERRY_OK;
}

int ferry_loader_state(ferry_loader *ld, void *buf, size_t cap, size_t *len)
{
    if (!ld || !len)
        return ferry__seterr(FERRY_EINVAL, "loader and len must not be NULL");
    return ferry__window_save(ld->win, buf, cap, len);
}

int ferry_loader_feed(ferry_loader *ld, uint64_t first_seq, uint64_t n, const uint32_t *counts,
                      const uint64_t *indices)
{
    if (!ld || (n && (!counts || !indices)))
        return ferry__seterr(FERRY_EINVAL, "loader, counts and indices must not be NULL");
    return ferry__window_feed(ld->win, first_seq, n, counts, indices);
}

int ferry_loader_skip_epoch(ferry_loader *ld, uint64_t *skipped)
{
    uint64_t n = 0;
    if (!ld)
        return ferry__seterr(FERRY_EINVAL, "loader must not be NULL");
    int rc = ferry__window_skip_epoch(ld->win, &n);
    if (skipped)
        *skipped = n;
    if (rc == FERRY_OK && n && ferry__window_ended(ld->win))
        ferry__scheduler_stream_ended(ld->sched); /* as next() does at the stream's last batch */
    return rc;
}

int ferry_loader_state_at_epoch(ferry_loader *ld, uint64_t epoch, void *buf, size_t cap,
                                size_t *len)
{
    if (!ld || !len)
        return ferry__seterr(FERRY_EINVAL, "loader and len must not be NULL");
    return ferry__window_save_epoch(ld->win, epoch, buf, cap, len);
}

int ferry_loader_stats(ferry_loader *ld, ferry_stats *st)
{
    if (!ld || !st)
        return ferry__seterr(FERRY_EINVAL, "loader and stats must not be NULL");
    ferry__window_stats(ld->win, st);
    if (ld->sched)
        ferry__scheduler_usage(ld->sched, st);
    return FERRY_OK;
}

int ferry_loader_profile(ferry_loader *ld, int32_t worker, ferry_profile *out)
{
    if (!ld || !out)
        return ferry__seterr(FERRY_EINVAL, "loader and out must not be NULL");
    uint32_t n = (uint32_t)ferry__config_slots(&ld->cfg);
    if (worker < -1 || (worker >= 0 && (uint32_t)worker >= n))
        return ferry__seterr(FERRY_EINVAL, "no worker %d (the loader has %u)", worker, n);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    ferry__profile_snapshot(ld->prof, worker, out);
    out->workers_ready = st.workers;
    out->prefetch_why = st.prefetch_why;
    out->credits_why = st.credits_why;
    return FERRY_OK;
}

int ferry_loader_trace(ferry_loader *ld, uint32_t max_batches)
{
    if (!ld)
        return ferry__seterr(FERRY_EINVAL, "loader must not be NULL");
    return ferry__profile_trace(ld->prof, max_batches);
}

int ferry_loader_trace_write(ferry_loader *ld, const char *path)
{
    if (!ld || !path)
        return ferry__seterr(FERRY_EINVAL, "loader and path must not be NULL");
    return ferry__profile_trace_write(ld->prof, path);
}

int ferry_loader_keep_slots(ferry_loader *ld)
{
    if (!ld)
        return ferry__seterr(FERRY_EINVAL, "loader must not be NULL");
    if (ld->sched)
        ferry__scheduler_keep_slots(ld->sched);
    return FERRY_OK;
}

int ferry_loader_endpoint(ferry_loader *ld, char *buf, size_t cap)
{
    if (!ld || !buf)
        return ferry__seterr(FERRY_EINVAL, "loader and buf must not be NULL");
    const char *bound = ferry__scheduler_endpoint(ld->sched);
    if (!bound)
        return ferry__seterr(FERRY_ESTATE, "the loader was opened without 'bind'");
    size_t len = strlen(bound);
    if (len >= cap)
        return ferry__seterr(FERRY_ELIMIT, "the endpoint needs %zu bytes", len + 1);
    memcpy(buf, bound, len + 1);
    return FERRY_OK;
}

int ferry_loader_worker_pid(ferry_loader *ld, uint32_t index, int *pid)
{
    uint32_t n = ld ? (uint32_t)ferry__config_slots(&ld->cfg) : 0;
    if (!ld || !pid || index >= n)
        return ferry__seterr(FERRY_EINVAL, "no worker %u (the loader has %u)", index, n);
    *pid = (int)ferry__scheduler_worker_pid(ld->sched, index);
    return FERRY_OK;
}

int ferry_loader_worker_host(ferry_loader *ld, uint32_t index, char *buf, size_t cap, int *pid)
{
    uint32_t n = ld ? (uint32_t)ferry__config_slots(&ld->cfg) : 0;
    if (!ld || !buf || !cap || !pid || index >= n)
        return ferry__seterr(FERRY_EINVAL, "no worker %u (the loader has %u)", index, n);
    char host[FERRY__PEER_HOST_MAX];
    uint32_t rpid;
    ferry__scheduler_worker_host(ld->sched, index, host, sizeof host, &rpid);
    if (strlen(host) >= cap)
        return ferry__seterr(FERRY_ELIMIT, "the host name needs %zu bytes", strlen(host) + 1);
    memcpy(buf, host, strlen(host) + 1);
    *pid = (int)rpid;
    return FERRY_OK;
}

int ferry_loader_close(ferry_loader *ld)
{
    if (!ld)
        return FERRY_OK;
    int leaked = ferry__scheduler_stop(ld->sched);
    ferry__window_free(ld->win);
    ferry__profile_free(ld->prof);
    free(ld);
    if (leaked)
        return ferry__seterr(FERRY_ETIMEDOUT, "a worker thread did not stop; its resources "
                                              "were left behind");
    return FERRY_OK;
}
