/*
 * window.c - the prefetch window (see window.h).
 *
 * Lists are intrusive and doubly linked through the entries' slot numbers,
 * so moving an entry between them is O(1) and nothing is allocated after
 * ferry__window_new.
 */
#include "window.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "batch.h"
#include "clock.h"
#include "error.h"
#include "feed.h"

#define SLOT_BITS 10 /* FERRY__WINDOW_MAX == 1 << SLOT_BITS */
#define NONE (-1)
#define WAIT_MS 1000 /* a waiting next() looks again at least this often */

enum { E_FREE = 0, E_PENDING, E_DONE };

typedef struct wlist {
    int32_t head, tail;
    uint32_t n;
} wlist;

typedef struct worker_tasks {
    wlist sent;       /* oldest first */
    uint64_t busy_ms; /* when its oldest became its current task */
} worker_tasks;

struct ferry__window {
    uint32_t entries;  /* e[]'s length: the most prefetch may grow to */
    uint32_t prefetch; /* the most in flight now (under mu; flow control moves it) */
    uint32_t wake_at; /* in flight after a delivery that wakes the scheduler */
    uint32_t nworkers;
    int in_order;
    int epoch_barrier;
    uint32_t max_attempts;
    ferry__sampler_opts sampler_opts;
    uint32_t feed_max; /* > 0: indices come from the trainer's feed */
    uint64_t feed_batches;
    unsigned char state[FERRY_STATE_MAX];
    size_t state_len;
    void (*wake)(void *);
    void *wake_arg;

    ferry__window_entry *e;
    uint64_t *indices;     /* every entry's, batch_size each */
    worker_tasks *workers; /* scheduler only */
    wlist resend;          /* scheduler only, lowest seq first */

    /* --- shared, under mu --- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t waiters; /* threads inside wait_cv: a filing wakes only when some */
    ferry__phase phase;
    int opened; /* ferry__window_open: what open waits for */
    int fatal_code;
    char fatal_msg[FERRY__ERRMSG_MAX];
    ferry__sampler sampler;
    uint64_t n;
    /* The stream position of the trainer's first batch, moved on past
     * what it skipped (ferry__window_skip_epoch): the position of its next
     * batch is start_seq + st.delivered. */
    uint64_t start_seq;
    uint64_t next_seq;
    uint64_t drop_below; /* entries of lower seq are dropped when done */
    uint64_t asked; /* next() calls so far: the trainer wants batch asked-1 */
    uint32_t in_flight;
    wlist free, done;
    ferry_stats st;
    ferry__feed feed; /* feed_max > 0: what the trainer fed (feed.h) */
    /* Out of order: the epoch whose batches are handed out now, and how
     * many of them are still to come. A later epoch's batches wait until
     * then, so epochs never interleave and last_in_epoch marks the last
     * one handed out (see deliverable_locked). */
    uint64_t deliv_epoch, deliv_left;
};

/* ------------------------------------------------------------------------
 * Lists
 */

static void list_init(wlist *l)
{
    l->head = l->tail = NONE;
    l->n = 0;
}

static void list_insert_before(ferry__window *win, wlist *l, int32_t at, int32_t i)
{
    ferry__window_entry *x = &win->e[i];
    x->next = at;
    x->prev = at == NONE ? l->tail : win->e[at].prev;
    if (x->prev == NONE)
        l->head = i;
    else
        win->e[x->prev].next = i;
    if (at == NONE)
        l->tail = i;
    else
        win->e[at].prev = i;
    l->n++;
}

static void list_push(ferry__window *win, wlist *l, int32_t i)
{
    list_insert_before(win, l, NONE, i);
}

static void list_remove(ferry__window *win, wlist *l, int32_t i)
{
    ferry__window_entry *x = &win->e[i];
    if (x->prev == NONE)
        l->head = x->next;
    else
        win->e[x->prev].next = x->next;
    if (x->next == NONE)
        l->tail = x->prev;
    else
        win->e[x->next].prev = x->prev;
    x->prev = x->next = NONE;
    l->n--;
}

static int32_t slot_of(const ferry__window *win, const ferry__window_entry *e)
{
    return (int32_t)(e - win->e);
}

/* ------------------------------------------------------------------------
 * Life
 */

/* A full window that drains one delivery at a time wakes the scheduler
 * once per prefetch/4 batches, not once per batch: each wake-up can cost
 * the trainer a context switch (about 30 us on a busy 2-core machine),
 * while the window still holds at least 3/4 of prefetch. */
static void set_prefetch(ferry__window *win, uint32_t prefetch)
{
    win->prefetch = prefetch < win->entries ? prefetch : win->entries;
    win->wake_at = win->prefetch - (win->prefetch >= 8 ? win->prefetch / 4 : 1);
}

int ferry__window_new(ferry__window **out, const ferry__window_opts *o)
{
    uint32_t entries = o->entries > o->prefetch ? o->entries : o->prefetch;
    ferry__mix *mix = (ferry__mix *)o->sampler.mix;
    if (o->prefetch == 0 || entries > FERRY__WINDOW_MAX) {
        ferry__mix_free(mix);
        return ferry__seterr(FERRY_EINVAL, "prefetch %u is not in 1..%d", entries,
                             FERRY__WINDOW_MAX);
    }
    if (o->state_len > FERRY_STATE_MAX) {
        ferry__mix_free(mix);
        return ferry__seterr(FERRY_ESTATE, "the resume state is %zu bytes, more than %d",
                             o->state_len, FERRY_STATE_MAX);
    }
    ferry__window *win = ferry__calloc(1, sizeof *win);
    if (!win) {
        ferry__mix_free(mix);
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the prefetch window");
    }
    win->entries = entries;
    win->nworkers = o->nworkers;
    win->in_order = o->in_order;
    win->epoch_barrier = o->epoch_barrier;
    win->max_attempts = o->max_attempts;
    set_prefetch(win, o->prefetch);
    win->sampler_opts = o->sampler;
    win->feed_max = o->feed_max;
    win->feed_batches = o->feed_batches;
    uint64_t per_entry = o->feed_max ? o->feed_max : o->sampler.batch_size;
    if (o->state_len)
        memcpy(win->state, o->state, o->state_len);
    win->state_len = o->state_len;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&win->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&win->mu, NULL);
    list_init(&win->free);
    list_init(&win->done);
    list_init(&win->resend);
    win->e = ferry__calloc(entries, sizeof *win->e);
    win->workers = ferry__calloc(o->nworkers ? o->nworkers : 1, sizeof *win->workers);
    if (!win->e || !win->workers)
        goto fail;
    for (uint32_t w = 0; w < o->nworkers; w++)
        list_init(&win->workers[w].sent);
    /* One block for every entry's indices: pages of entries never used
     * (a window that flow control never grows) are never touched. */
    win->indices = ferry__malloc((size_t)entries * per_entry * sizeof(uint64_t));
    if (!win->indices)
        goto fail;
    for (uint32_t i = 0; i < entries; i++) {
        win->e[i].indices = win->indices + (size_t)i * per_entry;
        win->e[i].worker = NONE;
        win->e[i].shm_slot = NONE;
        list_push(win, &win->free, (int32_t)i);
    }
    *out = win;
    return FERRY_OK;
fail:
    ferry__window_free(win);
    return ferry__seterr(FERRY_ENOMEM, "out of memory creating the prefetch window");
}

void ferry__window_free(ferry__window *win)
{
    if (!win)
        return;
    for (uint32_t i = 0; win->e && i < win->entries; i++) {
        ferry_batch_release(win->e[i].batch);
        free(win->e[i].errmsg);
    }
    free(win->indices);
    ferry__feed_free(&win->feed);
    ferry__mix_free((ferry__mix *)win->sampler_opts.mix);
    pthread_mutex_destroy(&win->mu);
    pthread_cond_destroy(&win->cv);
    free(win->e);
    free(win->workers);
    free(win);
}

void ferry__window_set_wake(ferry__window *win, void (*wake)(void *), void *arg)
{
    win->wake = wake;
    win->wake_arg = arg;
}

/* ------------------------------------------------------------------------
 * Phase and failure
 */

static void fail_locked(ferry__window *win, int code, const char *msg)
{
    if (win->phase == FERRY__PHASE_FAILED)
        return;
    win->phase = FERRY__PHASE_FAILED;
    win->fatal_code = code;
    snprintf(win->fatal_msg, sizeof win->fatal_msg, "%s", msg ? msg : ferry_last_error());
    pthread_cond_broadcast(&win->cv);
}

void ferry__window_fail(ferry__window *win, int code, const char *msg)
{
    pthread_mutex_lock(&win->mu);
    fail_locked(win, code, msg);
    pthread_mutex_unlock(&win->mu);
}

/* Out of order: delivery moves on to the epoch of stream position seq,
 * the first of it not yet handed out. */
static void deliver_from_locked(ferry__window *win, uint64_t seq)
{
    uint64_t bpe = win->sampler.batches_per_epoch;
    win->deliv_epoch = seq / bpe;
    uint64_t end = seq - seq % bpe + bpe;
    if (end < seq || end > win->sampler.end_seq)
        end = win->sampler.end_seq;
    win->deliv_left = end > seq ? end - seq : 0;
}

int ferry__window_start(ferry__window *win, uint64_t n)
{
    pthread_mutex_lock(&win->mu);
    /* Fed: the positions are the epoch's batches; n is what their indices index. */
    int rc = ferry__sampler_init(&win->sampler, win->feed_max ? win->feed_batches : n,
                                 &win->sampler_opts);
    if (rc == FERRY_OK && win->state_len)
        rc = ferry__sampler_restore(&win->sampler, win->state, win->state_len, &win->start_seq);
    if (rc != FERRY_OK) {
        fail_locked(win, rc, NULL);
    } else if (win->phase == FERRY__PHASE_STARTING) {
        win->n = n;
        win->next_seq = win->start_seq;
        ferry__feed_init(&win->feed, win->feed_max, n, win->start_seq);
        deliver_from_locked(win, win->start_seq);
        win->phase = FERRY__PHASE_RUNNING;
        pthread_cond_broadcast(&win->cv);
    }
    pthread_mutex_unlock(&win->mu);
    return rc;
}

ferry__phase ferry__window_phase(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    ferry__phase p = win->phase;
    pthread_mutex_unlock(&win->mu);
    return p;
}

static void wait_cv(ferry__window *win, uint64_t ms)
{
    struct timespec ts = ferry__deadline_ts(CLOCK_MONOTONIC, ms);
    win->waiters++;
    pthread_cond_timedwait(&win->cv, &win->mu, &ts);
    win->waiters--;
}

/* The failure, as this thread's error. Caller holds mu. */
static int report_failure_locked(ferry__window *win)
{
    char msg[FERRY__ERRMSG_MAX];
    int rc = win->fatal_code;
    snprintf(msg, sizeof msg, "%s", win->fatal_msg);
    pthread_mutex_unlock(&win->mu);
    return ferry__seterr_str(rc, msg);
}

void ferry__window_open(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    win->opened = 1;
    pthread_cond_broadcast(&win->cv);
    pthread_mutex_unlock(&win->mu);
}

int ferry__window_is_open(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    int o = win->opened;
    pthread_mutex_unlock(&win->mu);
    return o;
}

int ferry__window_wait_started(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    while (win->phase != FERRY__PHASE_FAILED && !win->opened)
        wait_cv(win, WAIT_MS);
    if (win->phase == FERRY__PHASE_FAILED)
        return report_failure_locked(win);
    pthread_mutex_unlock(&win->mu);
    return FERRY_OK;
}

/* ------------------------------------------------------------------------
 * Counters
 */

static uint64_t *counter(ferry_stats *st, ferry__stat s)
{
    switch (s) {
    case FERRY__STAT_MALFORMED:
        return &st->malformed;
    case FERRY__STAT_STALE:
        return &st->stale;
    case FERRY__STAT_RESTARTS:
        return &st->restarts;
    case FERRY__STAT_TIMEOUTS:
        return &st->timeouts;
    case FERRY__STAT_JOINED:
        return &st->joined;
    case FERRY__STAT_LOST:
        return &st->lost;
    case FERRY__STAT_RETIREMENTS:
        return &st->retirements;
    case FERRY__STAT_REJECTED:
        break;
    }
    return &st->rejected;
}

uint64_t ferry__window_count(ferry__window *win, ferry__stat s)
{
    pthread_mutex_lock(&win->mu);
    uint64_t v = ++*counter(&win->st, s);
    pthread_mutex_unlock(&win->mu);
    return v;
}

uint32_t ferry__window_add_workers(ferry__window *win, int delta)
{
    pthread_mutex_lock(&win->mu);
    if (delta > 0)
        win->st.workers++;
    else if (delta < 0 && win->st.workers)
        win->st.workers--;
    uint32_t v = win->st.workers;
    pthread_mutex_unlock(&win->mu);
    return v;
}

void ferry__window_stats(ferry__window *win, ferry_stats *st)
{
    pthread_mutex_lock(&win->mu);
    *st = win->st;
    st->in_flight = win->in_flight;
    st->prefetch = win->prefetch;
    pthread_mutex_unlock(&win->mu);
}

void ferry__window_set_flow(ferry__window *win, const ferry__flow_summary *fs)
{
    pthread_mutex_lock(&win->mu);
    set_prefetch(win, fs->window);
    win->st.credits = fs->credits_max;
    win->st.credits_min = fs->credits_min;
    win->st.credits_why = fs->credits_why;
    win->st.prefetch_why = fs->window_why;
    win->st.round_trip_us = fs->round_trip_us;
    pthread_mutex_unlock(&win->mu);
}

int ferry__window_full(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    int full = win->in_flight >= win->prefetch;
    pthread_mutex_unlock(&win->mu);
    return full;
}

/* ------------------------------------------------------------------------
 * The scheduler's side
 */

/* Entry e (on no list, found by no reply: worker NONE, id UINT64_MAX)
 * freed unused: a batch of an epoch the trainer skipped. Returns its
 * batch, to be released once mu is let go. Caller holds mu. */
static ferry_batch *drop_locked(ferry__window *win, ferry__window_entry *e)
{
    ferry_batch *b = e->batch;
    free(e->errmsg);
    e->batch = NULL;
    e->errmsg = NULL;
    e->err = 0;
    e->state = E_FREE;
    list_push(win, &win->free, slot_of(win, e));
    win->in_flight--;
    return b;
}

/* A free entry for the task at next_seq: with in_order, slot seq % entries
 * (free, since the seqs in flight are contiguous, unless a task of a
 * skipped epoch still holds it: NULL until it comes); else any. Caller
 * holds mu and has checked in_flight < prefetch. */
static ferry__window_entry *claim_locked(ferry__window *win, uint64_t seq)
{
    int32_t i = win->in_order ? (int32_t)(seq % win->entries) : win->free.head;
    if (win->e[i].state != E_FREE)
        return NULL;
    list_remove(win, &win->free, i);
    return &win->e[i];
}

/* Whether the epoch barrier holds task t back: an epoch's first batch is
 * not started until the trainer asks for it, i.e. has finished the whole
 * previous epoch (PyTorch's behaviour, kept for comparison). */
static int barrier_holds_locked(const ferry__window *win, const ferry__sampler_task *t)
{
    return win->epoch_barrier && t->batch_in_epoch == 0 && win->asked < t->seq - win->start_seq + 1;
}

ferry__window_entry *ferry__window_take(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    ferry__window_entry *e = NULL;
    ferry__sampler_task t;
    if (win->phase != FERRY__PHASE_RUNNING)
        goto out;
    while (win->resend.head != NONE) {
        e = &win->e[win->resend.head];
        list_remove(win, &win->resend, win->resend.head);
        if (e->t.seq >= win->drop_below)
            goto out;
        e->id = UINT64_MAX; /* of a skipped epoch: made by no one, holding no batch */
        drop_locked(win, e);
        e = NULL;
    }
    if (win->in_flight >= win->prefetch ||
        ferry__sampler_at(&win->sampler, win->next_seq, &t) != FERRY_OK ||
        barrier_holds_locked(win, &t) || (win->feed_max && !ferry__feed_has(&win->feed, t.seq)) ||
        !(e = claim_locked(win, t.seq)))
        goto out;
    e->state = E_PENDING;
    e->t = t;
    e->id = t.seq << SLOT_BITS | (uint64_t)slot_of(win, e);
    e->worker = NONE;
    e->attempts = 0;
    e->sends = 0;
    e->avoid = NONE;
    win->in_flight++;
    win->next_seq++;
    win->st.dispatched++;
    if (win->feed_max) { /* under the lock: a feed may move the arrays */
        e->t.count = ferry__feed_take(&win->feed, t.seq, e->indices);
        pthread_mutex_unlock(&win->mu);
        return e;
    }
    pthread_mutex_unlock(&win->mu);
    /* Outside the lock: the entry is the scheduler's until it is done. */
    ferry__sampler_indices(&win->sampler, &e->t, e->indices);
    return e;
out:
    pthread_mutex_unlock(&win->mu);
    return e;
}

void ferry__window_sent(ferry__window *win, ferry__window_entry *e, uint32_t worker,
                        uint64_t now_ms)
{
    worker_tasks *wt = &win->workers[worker];
    e->worker = (int32_t)worker;
    e->sends++;
    if (wt->sent.n == 0)
        wt->busy_ms = now_ms;
    list_push(win, &wt->sent, slot_of(win, e));
}

/* Puts e on the resend list, keeping it ordered by seq. */
static void resend(ferry__window *win, ferry__window_entry *e)
{
    int32_t at = win->resend.head;
    while (at != NONE && win->e[at].t.seq < e->t.seq)
        at = win->e[at].next;
    e->worker = NONE;
    list_insert_before(win, &win->resend, at, slot_of(win, e));
}

void ferry__window_unsent(ferry__window *win, ferry__window_entry *e)
{
    resend(win, e);
}

ferry__window_entry *ferry__window_find(ferry__window *win, uint32_t worker, uint64_t id)
{
    ferry__window_entry *e = &win->e[id & (FERRY__WINDOW_MAX - 1)];
    if ((id & (FERRY__WINDOW_MAX - 1)) >= win->entries || e->id != id ||
        e->worker != (int32_t)worker)
        return NULL;
    return e;
}

static ferry__window_entry *deliverable_locked(ferry__window *win);

/* Files e as done. Caller holds mu; e is on no list. Returns whether the
 * trainer is waiting and can now go on (with in_order, a batch filed ahead
 * of the one it waits for does not count): the caller then wakes it
 * (wake_unlocked) once it has let go of mu, so the woken thread does not at
 * once block on a mutex still held, and a trainer busy elsewhere, or
 * waiting for another batch, costs no wake-up at all. */
static int done_locked(ferry__window *win, ferry__window_entry *e, ferry_batch *b, int err,
                       char *errmsg)
{
    e->state = E_DONE;
    e->worker = NONE;
    e->id = UINT64_MAX; /* no reply finds it any more */
    e->batch = b;
    e->err = err;
    e->errmsg = errmsg;
    if (b) {
        win->st.realigned += (uint64_t)b->realigned;
        win->st.shared += (uint64_t)b->shared;
    }
    win->st.completed++;
    list_push(win, &win->done, slot_of(win, e));
    return win->waiters > 0 && deliverable_locked(win) != NULL;
}

/* A waiter noted under mu is inside pthread_cond_timedwait by the time mu
 * is free again, so this broadcast after the unlock cannot miss it; should
 * it time out first, it finds the entry anyway. */
static void wake_unlocked(ferry__window *win, int waiting)
{
    if (waiting)
        pthread_cond_broadcast(&win->cv);
}

/* Takes e off its worker's list of sent tasks; the worker's next task, if
 * any, has been its current one since now_ms. */
static void off_worker(ferry__window *win, ferry__window_entry *e, uint64_t now_ms)
{
    worker_tasks *wt = &win->workers[e->worker];
    list_remove(win, &wt->sent, slot_of(win, e));
    if (wt->sent.n)
        wt->busy_ms = now_ms;
}

void ferry__window_complete(ferry__window *win, ferry__window_entry *e, ferry_batch *b, int err,
                            char *errmsg, uint64_t now_ms)
{
    off_worker(win, e, now_ms);
    pthread_mutex_lock(&win->mu);
    if (e->t.seq < win->drop_below) { /* of an epoch the trainer skipped */
        e->worker = NONE;
        e->id = UINT64_MAX;
        e->batch = b;
        e->errmsg = errmsg;
        b = drop_locked(win, e);
        pthread_mutex_unlock(&win->mu);
        ferry_batch_release(b);
        return;
    }
    int waiting = done_locked(win, e, b, err, errmsg);
    pthread_mutex_unlock(&win->mu);
    wake_unlocked(win, waiting);
}

int ferry__window_retry(ferry__window *win, ferry__window_entry *e, uint64_t now_ms)
{
    if (e->attempts + 1 >= win->max_attempts)
        return 0;
    off_worker(win, e, now_ms);
    e->attempts++;
    e->avoid = e->worker;
    resend(win, e);
    return 1;
}

uint32_t ferry__window_outstanding(const ferry__window *win, uint32_t worker)
{
    return win->workers[worker].sent.n;
}

const ferry__window_entry *ferry__window_current(const ferry__window *win, uint32_t worker,
                                                 uint64_t *since_ms)
{
    const worker_tasks *wt = &win->workers[worker];
    if (wt->sent.head == NONE)
        return NULL;
    if (since_ms)
        *since_ms = wt->busy_ms;
    return &win->e[wt->sent.head];
}

/* "41, 3, 17, ... (256 in all)": the first indices of a batch. */
static void describe_indices(const ferry__window_entry *e, char *buf, size_t cap)
{
    size_t off = 0;
    uint32_t shown = e->t.count < 8 ? e->t.count : 8;
    buf[0] = '\0';
    for (uint32_t i = 0; i < shown && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%llu", i ? ", " : "",
                                (unsigned long long)e->indices[i]);
    if (shown < e->t.count && off < cap)
        snprintf(buf + off, cap - off, ", ... (%u in all)", e->t.count);
}

/* Gives up entry e, which has taken down e->attempts workers. */
static void give_up(ferry__window *win, ferry__window_entry *e, const char *death)
{
    char idx[256];
    describe_indices(e, idx, sizeof idx);
    char *msg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (msg)
        snprintf(msg, FERRY__ERRMSG_MAX,
                 "batch %llu (epoch %llu, batch %llu; indices %s) was given up after %u "
                 "workers died on it; the last: %s",
                 (unsigned long long)e->t.seq, (unsigned long long)e->t.epoch,
                 (unsigned long long)e->t.batch_in_epoch, idx, e->attempts, death);
    list_remove(win, &win->resend, slot_of(win, e));
    pthread_mutex_lock(&win->mu);
    if (e->t.seq < win->drop_below) { /* of an epoch the trainer skipped */
        e->worker = NONE;
        e->id = UINT64_MAX;
        e->errmsg = msg;
        drop_locked(win, e);
        pthread_mutex_unlock(&win->mu);
        return;
    }
    int waiting = done_locked(win, e, NULL, FERRY_EBATCH, msg);
    pthread_mutex_unlock(&win->mu);
    wake_unlocked(win, waiting);
}

void ferry__window_requeue(ferry__window *win, uint32_t worker, ferry__charge charge, uint64_t id,
                           const char *death)
{
    worker_tasks *wt = &win->workers[worker];
    ferry__window_entry *charged = NULL;
    if (charge == FERRY__CHARGE_OLDEST && wt->sent.head != NONE)
        charged = &win->e[wt->sent.head];
    else if (charge == FERRY__CHARGE_TASK)
        charged = ferry__window_find(win, worker, id);
    while (wt->sent.head != NONE) {
        ferry__window_entry *e = &win->e[wt->sent.head];
        list_remove(win, &wt->sent, wt->sent.head);
        resend(win, e);
    }
    if (charged && ++charged->attempts >= win->max_attempts)
        give_up(win, charged, death);
}

/* ------------------------------------------------------------------------
 * The trainer's side
 */

/* The entry to deliver next, or NULL: in order, the one with the next seq
 * once it is done; otherwise the earliest completed of the epoch being
 * handed out. Caller holds mu. */
static ferry__window_entry *deliverable_locked(ferry__window *win)
{
    if (!win->in_order) {
        /* The earliest completed of the epoch being handed out: a later
         * epoch's batch waits for the next epoch (prefetch goes on). */
        for (int32_t i = win->done.head; i != NONE; i = win->e[i].next) {
            if (win->e[i].t.epoch == win->deliv_epoch)
                return &win->e[i];
        }
        return NULL;
    }
    ferry__window_entry *e = &win->e[(win->start_seq + win->st.delivered) % win->entries];
    return e->state == E_DONE ? e : NULL;
}

/* Hands entry e's batch or failure to the trainer and frees the slot. Caller
 * holds mu; releases it. */
static int deliver_unlock(ferry__window *win, ferry__window_entry *e, ferry_batch **out)
{
    ferry_batch *b = e->batch;
    int err = e->err;
    char *msg = e->errmsg;
    e->batch = NULL;
    e->errmsg = NULL;
    e->err = 0;
    e->state = E_FREE;
    list_remove(win, &win->done, slot_of(win, e));
    list_push(win, &win->free, slot_of(win, e));
    /* Only a full window waits on the trainer: otherwise the scheduler is
     * woken by the replies and deaths it polls for. A full one is woken
     * when it has drained to wake_at (every delivery passes through each
     * level on the way down), so it refills several slots per wake-up. */
    int was_full = --win->in_flight == win->wake_at;
    win->st.delivered++;
    if (!win->in_order) {
        /* The epoch's last batch handed out, out of order, is the one
         * marked (in order that is its last position; a stream cut short
         * by max_batches marks none of its last epoch either way). */
        int last = --win->deliv_left == 0 &&
                   (win->start_seq + win->st.delivered) % win->sampler.batches_per_epoch == 0;
        if (b)
            b->info.last_in_epoch = last;
        if (!win->deliv_left)
            deliver_from_locked(win, win->start_seq + win->st.delivered);
    }
    if (err)
        win->st.failed++;
    pthread_mutex_unlock(&win->mu);
    if (was_full && win->wake)
        win->wake(win->wake_arg);
    if (err) {
        ferry__seterr_str(err, msg ? msg : "a worker failed on a batch (no memory for the detail)");
        free(msg);
        return err;
    }
    b->info.ready_ns = ferry__now_ns() - b->arrived_ns;
    *out = b;
    return FERRY_OK;
}

int ferry__window_ended(ferry__window *win)
{
    pthread_mutex_lock(&win->mu);
    int ended = win->phase == FERRY__PHASE_RUNNING &&
                win->start_seq + win->st.delivered >= win->sampler.end_seq;
    pthread_mutex_unlock(&win->mu);
    return ended;
}

int ferry__window_next(ferry__window *win, ferry_batch **out, int64_t timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : ferry__now_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&win->mu);
    win->asked = win->st.delivered + 1;
    int woke = 0;
    for (;;) {
        if (win->phase == FERRY__PHASE_FAILED)
            return report_failure_locked(win);
        ferry__window_entry *e = deliverable_locked(win);
        if (e)
            return deliver_unlock(win, e, out);
        if (win->phase == FERRY__PHASE_RUNNING &&
            win->start_seq + win->st.delivered >= win->sampler.end_seq) {
            pthread_mutex_unlock(&win->mu);
            return ferry__seterr(FERRY_EOF, "the stream has ended");
        }
        if (win->epoch_barrier && !woke && win->wake) {
            /* The scheduler may be holding an epoch's first batch for this
             * very request. */
            woke = 1;
            pthread_mutex_unlock(&win->mu);
            win->wake(win->wake_arg);
            pthread_mutex_lock(&win->mu);
            continue;
        }
        uint64_t now = ferry__now_ms();
        if (now >= deadline) {
            pthread_mutex_unlock(&win->mu);
            return ferry__seterr(FERRY_EAGAIN, "no batch was ready within %lld ms",
                                 (long long)timeout_ms);
        }
        wait_cv(win, deadline - now < WAIT_MS ? deadline - now : WAIT_MS);
    }
}

int ferry__window_skip_epoch(ferry__window *win, uint64_t *skipped)
{
    *skipped = 0;
    if (!win->in_order)
        return ferry__seterr(FERRY_EINVAL, "the rest of an epoch can be skipped only with "
                                           "in_order on");
    ferry_batch *drop[FERRY__WINDOW_MAX];
    uint32_t ndrop = 0;
    pthread_mutex_lock(&win->mu);
    if (win->phase == FERRY__PHASE_FAILED)
        return report_failure_locked(win);
    uint64_t pos = win->start_seq + win->st.delivered, to = pos;
    if (win->phase == FERRY__PHASE_RUNNING) {
        uint64_t bpe = win->sampler.batches_per_epoch;
        to = pos % bpe ? pos - pos % bpe + bpe : pos;
        if (to > win->sampler.end_seq)
            to = win->sampler.end_seq;
    }
    if (to > pos) {
        /* Done ones go now; those in flight when they come (complete,
         * give_up), or when taken to be sent again (take); those not yet
         * taken are never made. */
        for (int32_t i = win->done.head, next; i != NONE; i = next) {
            next = win->e[i].next;
            if (win->e[i].t.seq < to) {
                list_remove(win, &win->done, i);
                drop[ndrop++] = drop_locked(win, &win->e[i]);
            }
        }
        win->start_seq += to - pos;
        if (win->next_seq < to)
            win->next_seq = to;
        win->drop_below = to;
        *skipped = to - pos;
    }
    pthread_mutex_unlock(&win->mu);
    for (uint32_t i = 0; i < ndrop; i++)
        ferry_batch_release(drop[i]);
    if (*skipped && win->wake)
        win->wake(win->wake_arg); /* room for the next epoch's tasks */
    return FERRY_OK;
}

int ferry__window_length(ferry__window *win, uint64_t *items, uint64_t *batches_per_epoch)
{
    pthread_mutex_lock(&win->mu);
    if (items)
        *items = win->n;
    if (batches_per_epoch)
        *batches_per_epoch = win->sampler.batches_per_epoch;
    pthread_mutex_unlock(&win->mu);
    return FERRY_OK;
}

int ferry__window_save_epoch(ferry__window *win, uint64_t epoch, void *buf, size_t cap,
                             size_t *len)
{
    /* An epoch's start is a position whatever the delivery order: a loader
     * out of order may start again there too (ferry.torch restarts at an
     * epoch when the dataset changed). */
    const ferry__sampler *s = &win->sampler;
    if (epoch > s->end_seq / s->batches_per_epoch ||
        epoch * s->batches_per_epoch >= s->end_seq)
        return ferry__seterr(FERRY_ERANGE, "the stream ends before epoch %llu",
                             (unsigned long long)epoch);
    return ferry__sampler_save(s, epoch * s->batches_per_epoch, buf, cap, len);
}

int ferry__window_save(ferry__window *win, void *buf, size_t cap, size_t *len)
{
    if (!win->in_order)
        return ferry__seterr(FERRY_EINVAL, "the stream position is only defined with in_order on");
    pthread_mutex_lock(&win->mu);
    uint64_t next = win->start_seq + win->st.delivered;
    int rc = ferry__sampler_save(&win->sampler, next, buf, cap, len);
    pthread_mutex_unlock(&win->mu);
    return rc;
}

/* ------------------------------------------------------------------------
 * The feed
 */

int ferry__window_feed(ferry__window *win, uint64_t first_seq, uint64_t n, const uint32_t *counts,
                       const uint64_t *indices)
{
    if (!win->feed_max)
        return ferry__seterr(FERRY_EINVAL, "this loader draws its own indices: feed_batches "
                                           "was not set");
    pthread_mutex_lock(&win->mu);
    if (win->phase == FERRY__PHASE_FAILED)
        return report_failure_locked(win);
    int rc = win->phase == FERRY__PHASE_RUNNING
                 ? ferry__feed_add(&win->feed, first_seq, n, counts, indices, win->sampler.end_seq)
                 : ferry__seterr(FERRY_EINVAL, "the loader is not open yet");
    pthread_mutex_unlock(&win->mu);
    if (rc == FERRY_OK && win->wake)
        win->wake(win->wake_arg); /* the scheduler may have waited for these */
    return rc;
}
