/*
 * scheduler.c - the scheduler thread (see scheduler.h).
 *
 * One loop: fill the window (dispatch), wait on everything that can happen
 * (poll_once: the local and remote sockets, the ZAP handler, the wake fd,
 * each local worker's stderr and pidfd), then look at the clock
 * (check_deadlines). It never looks at epoch boundaries, which is why
 * prefetch runs straight across them.
 *
 * The messages and what they mean are in replies.c, deaths, losses and
 * deadlines in supervise.c (sched_internal.h holds the state they share).
 *
 * Threads: everything here runs on the scheduler thread except start, stop,
 * wake and worker_pid. The worker records (peers) are this thread's alone;
 * what the trainer sees goes through the window.
 *
 * A worker's life: EMPTY -> SPAWNED (pool started it) -> CONFIGURED (HELLO
 * answered) -> READY (dataset open) -> GONE (BYE or death). A local death
 * is handled once the dead worker's last replies have been read (settling);
 * under the restart policy the slot is started again. A remote worker's
 * slot goes back to EMPTY when it is lost, for the next one to take.
 */
#include "scheduler.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "forkfds.h"
#include "process.h"
#include "sched_internal.h"

#define TICK_MS 100

_Static_assert(FERRY__DATASET_MAX <= FERRY__SPEC_MAX, "a dataset spec must fit in CONFIG");
_Static_assert(FERRY__PEER_HOST_MAX <= FERRY__HOST_MAX, "host names are cut to fit");

void ferry__scheduler_wake(void *arg)
{
    ferry__scheduler *s = arg;
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(s->wake_fd, &one, sizeof one);
    while (r < 0 && errno == EINTR);
}

/* The stream has ended (the trainer's thread), or a slot came free since
 * (any thread): the scheduler gives slot memory back, in its own thread. */
static void want_drain(void *arg)
{
    ferry__scheduler *s = arg;
    atomic_store(&s->drain, 1);
    ferry__scheduler_wake(s);
}

/* ------------------------------------------------------------------------
 * Dispatch
 */

/* The most tasks one ready worker may hold while local workers are still
 * starting: its share of the window among the ready and the starting
 * ones (at least 1); no bound (UINT32_MAX) once none is starting. The
 * window runs from the first READY so that the first batch is under way
 * early, but a worker ready a few ms before the others must not take the
 * whole window: the tasks queued at it wait for its slow one (a first item
 * that takes seconds), the window stays full, and the workers that come
 * ready meanwhile are given nothing until it is through (issue 36, item
 * 6). A share is what each worker holds once all are ready anyway. */
static uint32_t start_share(const ferry__scheduler *s)
{
    uint32_t ready = 0, starting = 0;
    for (uint32_t i = 0; i < s->nworkers; i++) {
        const ferry__peer *p = &s->w[i].p;
        if (p->state == FERRY__PEER_READY && !p->unreachable)
            ready++;
        else if (i < s->nlocal &&
                 (p->state == FERRY__PEER_SPAWNED || p->state == FERRY__PEER_CONFIGURED))
            starting++;
    }
    if (!starting)
        return UINT32_MAX;
    uint32_t window = ferry__flow_window(s->flow);
    uint32_t share = (window + ready + starting - 1) / (ready + starting);
    return share ? share : 1;
}

/* The ready worker with a free credit and the fewest tasks, round-robin
 * among equals, other than `skip` (NULL: any); while workers are still
 * starting, only one holding less than its share (start_share). */
static sched_worker *pick_worker(ferry__scheduler *s, const sched_worker *skip)
{
    sched_worker *best = NULL;
    uint32_t best_n = 0;
    uint32_t share = start_share(s);
    for (uint32_t k = 0; k < s->nworkers; k++) {
        sched_worker *w = &s->w[(s->rr + k) % s->nworkers];
        if (w == skip || w->p.state != FERRY__PEER_READY || w->p.unreachable)
            continue;
        uint32_t n = ferry__window_outstanding(s->win, w->p.index);
        if (n < ferry__flow_credits(s->flow, w->p.index) && n < share &&
            (!best || n < best_n)) {
            best = w;
            best_n = n;
        }
    }
    if (best)
        s->rr = (best->p.index + 1) % s->nworkers;
    return best;
}

/* A free batch slot for a task to local worker w, or -1 when there is
 * none. Running out is said once per run of tasks without a slot, and at
 * most once a minute: the batches still come (by message), but the trainer
 * should know that it holds what shm_max_bytes allows, or that the limit is
 * below the window. */
#define SLOTS_WARN_EVERY_MS 60000
static int32_t give_slot(ferry__scheduler *s, const sched_worker *w)
{
    int32_t slot = ferry__shm_give(s->shm, w->p.index);
    if (slot >= 0 || !ferry__shm_nslots(s->shm)) {
        s->slots_out = 0;
        return slot;
    }
    uint64_t now = ferry__now_ms();
    if (!s->slots_out &&
        (!s->slots_warned_ms || now - s->slots_warned_ms >= SLOTS_WARN_EVERY_MS)) {
        s->slots_warned_ms = now;
        ferry__logf(&s->log, FERRY_LOG_WARN,
                    "all %u batch slots (shm_max_bytes %lld) are in flight or held by the "
                    "trainer: batches come by message until it releases some (release batches "
                    "sooner, or raise shm_max_bytes)",
                    ferry__shm_nslots(s->shm), (long long)s->cfg.shm_max_bytes);
    }
    s->slots_out = 1;
    return -1;
}

/* Sends task e to w, with a free batch slot when w is local (a process
 * or a thread) and one is free: with none (all held by the trainer, say)
 * the batch comes back by message, so a trainer that keeps batches never
 * stalls the stream. e->shm_slot says which slot went, -1 none. */
static int send_task(ferry__scheduler *s, ferry__window_entry *e, sched_worker *w)
{
    zmq_msg_t p;
    if (zmq_msg_init_size(&p, (size_t)e->t.count * 8) != 0)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a task");
    ferry__indices_pack(e->indices, e->t.count, zmq_msg_data(&p));
    e->shm_slot = s->shm && !w->p.remote ? give_slot(s, w) : -1;
    s->out.type = FERRY__MSG_TASK;
    s->out.u.task = (ferry__task){.id = e->id,
                                  .epoch = e->t.epoch,
                                  .batch_in_epoch = e->t.batch_in_epoch,
                                  .seq = e->t.seq,
                                  .count = e->t.count};
    if (e->shm_slot >= 0) {
        s->out.u.task.shm_offset = ferry__shm_offset(s->shm, e->shm_slot);
        s->out.u.task.shm_bytes = ferry__shm_slot_bytes(s->shm);
    }
    int rc = sched_send(s, w, &p);
    if (rc != FERRY_OK) {
        s->send_errno = errno;
        zmq_msg_close(&p);
        if (e->shm_slot >= 0)
            ferry__shm_take_back(s->shm, e->shm_slot);
        e->shm_slot = -1;
    }
    return rc;
}

/* A task could not be sent to w. For a local process that means it has just
 * gone away and its pidfd has not said so yet: w takes no more work, and the
 * death (with its exit status, under either policy) is handled when the
 * pidfd fires. A remote worker whose connection is gone is given up at once.
 * Returns 1 to go on dispatching; anything else fails the loader. */
static int send_failed(ferry__scheduler *s, sched_worker *w)
{
    if (!w->p.remote && ferry__pool_pid(s->pool, w->p.index)) {
        w->p.unreachable = 1;
        return 1;
    }
    if (w->p.remote) {
        ferry__sched_on_send_failure(s, w, s->send_errno);
        return 1;
    }
    char who[64], msg[FERRY__ERRMSG_MAX];
    sched_describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "could not send a task to %s: %s", who, ferry_last_error());
    ferry__window_fail(s->win, FERRY_EWORKER, msg);
    return 0;
}

/* Fills the window: while a worker has a free credit and the window has a
 * task to send (one to send again first), send it. */
/* Whether some ready worker other than w could take a task later (it has
 * no free credit now). */
static int another_ready(const ferry__scheduler *s, const sched_worker *w)
{
    for (uint32_t i = 0; i < s->nworkers; i++) {
        const sched_worker *o = &s->w[i];
        if (o != w && o->p.state == FERRY__PEER_READY && !o->p.unreachable)
            return 1;
    }
    return 0;
}

/* With pin_tasks, the worker task e belongs to (by its seq, or with 2 by
 * its batch in the epoch, as torch's DataLoader assigns batches), or NULL
 * while it cannot take one (not ready, or no free credit): e waits, and
 * the tasks behind it with it (they are dispatched in order). */
static sched_worker *pinned_worker(ferry__scheduler *s, const ferry__window_entry *e)
{
    uint64_t k = s->cfg.pin_tasks == 2 ? e->t.batch_in_epoch : e->t.seq;
    sched_worker *w = &s->w[k % s->nlocal];
    if (w->p.state != FERRY__PEER_READY || w->p.unreachable ||
        ferry__window_outstanding(s->win, w->p.index) >= ferry__flow_credits(s->flow, w->p.index))
        return NULL;
    return w;
}

static void dispatch(ferry__scheduler *s)
{
    for (;;) {
        sched_worker *w = s->cfg.pin_tasks ? NULL : pick_worker(s, NULL);
        if (!w && !s->cfg.pin_tasks)
            return;
        ferry__window_entry *e = ferry__window_take(s->win);
        if (!e)
            return;
        if (s->cfg.pin_tasks && !(w = pinned_worker(s, e))) {
            ferry__window_unsent(s->win, e);
            return;
        }
        if (!s->cfg.pin_tasks && e->avoid == (int32_t)w->p.index) {
            /* Its dataset failed on this one: another worker, now if one
             * has a credit, later if one will; w only when it is alone. */
            sched_worker *o = pick_worker(s, w);
            if (o)
                w = o;
            else if (another_ready(s, w)) {
                ferry__window_unsent(s->win, e);
                return;
            }
        }
        /* Before the send: the worker may start (and its make_ns clock with
         * it) before send_task returns. */
        e->sent_ns = ferry__now_ns();
        if (send_task(s, e, w) == FERRY_OK) {
            uint64_t now = ferry__now_ms();
            ferry__window_sent(s->win, e, w->p.index, now);
            w->p.sent_ms = now;
            continue;
        }
        ferry__window_unsent(s->win, e);
        if (!send_failed(s, w))
            return;
    }
}

/* ------------------------------------------------------------------------
 * Waiting
 */

/* The deaths and disconnections whose last replies are in are acted on
 * (supervise.c). Every message waiting on the router is read first, not
 * only a drain's budget: a local worker that retired sent its BYE before it
 * exited, and the send that tells its end (EHOSTUNREACH) says so even while
 * its BYE still waits here, behind other workers' batches; read later, the
 * retirement would be taken for a crash. */
static void settle(ferry__scheduler *s)
{
    if (s->settling)
        ferry__sched_drain(s, s->router, INT_MAX);
    ferry__sched_settle(s);
}

/* One round of waiting: the sockets, the wake fd, the ZAP handler, and
 * every live local worker's stderr and pidfd. */
static void poll_once(ferry__scheduler *s, int timeout_ms)
{
    zmq_pollitem_t *items = s->items;
    int n = 0;
    items[n++] = (zmq_pollitem_t){.socket = s->router, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = s->wake_fd, .events = ZMQ_POLLIN};
    zmq_pollitem_t *remote_items = items + n;
    if (s->remote)
        n += ferry__remote_poll_items(s->remote, remote_items);
    zmq_pollitem_t *pool_items = items + n;
    n += ferry__pool_poll_items(s->pool, pool_items);
    if ((s->settling || s->probe_at_ms) && timeout_ms > 2)
        timeout_ms = 2; /* a gone worker's last replies, or a probe, are due */
    if (zmq_poll(items, n, timeout_ms) <= 0) {
        if (s->remote)
            ferry__sched_probe_remote(s);
        settle(s);
        return;
    }
    if (items[1].revents & ZMQ_POLLIN) {
        uint64_t v;
        while (read(s->wake_fd, &v, sizeof v) < 0 && errno == EINTR)
            ;
        if (s->shm && atomic_exchange(&s->drain, 0))
            ferry__shm_drain(s->shm);
    }
    if (s->remote) {
        ferry__remote_serve_zap(s->remote, remote_items, ferry__sched_zap_refused, s);
        ferry__sched_probe_remote(s);
    }
    if (items[0].revents & ZMQ_POLLIN)
        ferry__sched_drain(s, s->router, 64);
    void *readable[2];
    int nr = s->remote ? ferry__remote_readable(s->remote, remote_items, readable) : 0;
    for (int i = 0; i < nr; i++)
        ferry__sched_drain(s, readable[i], 64);
    int nev = ferry__pool_after_poll(s->pool, pool_items, s->events);
    for (int i = 0; i < nev; i++) {
        const ferry__pool_event *ev = &s->events[i];
        if (ev->kind == FERRY__POOL_DIED) {
            ferry__sched_on_death(s, ev);
        } else if (ev->kind == FERRY__POOL_PARENT_DIED) {
            ferry__sched_on_parent_death(s, ev);
        } else {
            /* A thread cannot be replaced like a process: the loader fails
             * (and an open in progress returns at once). */
            char msg[FERRY__ERRMSG_MAX];
            snprintf(msg, sizeof msg, "worker %u (thread) stopped: %s", ev->index, ev->words);
            ferry__window_fail(s->win, ev->code, msg);
        }
    }
    settle(s);
}

/* Every TRIM_EVERY_MS, the batch slots left free for TRIM_IDLE_MS beyond
 * TRIM_SPARES give their memory back (ferry__shm_trim). Free slots are
 * given last-freed first, so in a steady stream the slots in use cycle
 * within a few milliseconds and those idle for a second are the ones a
 * burst once needed: the start, an epoch's end, a trainer that held many
 * batches. Their pages go back, as torch's batches' shared memory does
 * when freed, and a slot written again faults them in afresh (a few ms per
 * 40 MB batch, in the worker). Once the stream has ended (every batch
 * delivered), every free slot gives its memory back: none will be written
 * again. */
#define TRIM_EVERY_MS 250
#define TRIM_IDLE_MS 1000
#define TRIM_SPARES 1

/* The deadlines count whole milliseconds: looked at once per millisecond
 * at most, however fast the replies come. */
static void check_deadlines(ferry__scheduler *s)
{
    uint64_t now = ferry__now_ms();
    if (now == s->checked_ms)
        return;
    s->checked_ms = now;
    ferry__sched_check_deadlines(s);
    if (s->shm && now - s->trimmed_ms >= TRIM_EVERY_MS) {
        s->trimmed_ms = now;
        if (ferry__window_ended(s->win))
            ferry__shm_trim(s->shm, 0, 0);
        else
            ferry__shm_trim(s->shm, TRIM_SPARES, TRIM_IDLE_MS);
    }
}

/* ------------------------------------------------------------------------
 * Shutdown: STOP, grace period, SIGTERM, SIGKILL; every child reaped.
 */

/* Workers still to go: local ones running, and remote ones until their
 * BYE (their STOP is then known to have got out before the socket closes). */
static int workers_left(ferry__scheduler *s)
{
    uint32_t left = ferry__pool_left(s->pool);
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        ferry__peer_state st = s->w[i].p.state;
        left += st == FERRY__PEER_CONFIGURED || st == FERRY__PEER_READY;
    }
    return left > 0;
}

/* Reads replies and reaps until no worker is left or `ms` have passed:
 * reading lets the workers finish their sends. */
static void wait_workers(ferry__scheduler *s, uint64_t ms)
{
    uint64_t deadline = ferry__now_ms() + ms;
    for (;;) {
        ferry__pool_reap_exited(s->pool);
        if (!workers_left(s))
            return;
        uint64_t now = ferry__now_ms();
        if (now >= deadline)
            return;
        uint64_t left = deadline - now;
        poll_once(s, (int)(left < TICK_MS ? left : TICK_MS));
    }
}

#define IDLE_GRACE_MS 100

static void shutdown_workers(ferry__scheduler *s)
{
    uint64_t grace = (uint64_t)s->cfg.close_grace_ms;
    s->closing = 1;
    /* The clean parent holds no work: it goes at once. */
    ferry__pool_parent_stop(s->pool);
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (w->p.ident.len && w->p.state != FERRY__PEER_GONE && w->p.state != FERRY__PEER_EMPTY)
            sched_send_simple(s, w, FERRY__MSG_STOP);
    }
    ferry__window_fail(s->win, FERRY_ECLOSED, "the loader is closing");
    /* The grace period is for workers still holding work (a batch being
     * built, a dataset's close): one that holds none and has not left
     * within IDLE_GRACE_MS (an interpreter tearing down its modules, say)
     * has nothing to lose and is killed, so close() and Ctrl-C return at
     * once. */
    uint64_t t0 = ferry__now_ms();
    wait_workers(s, grace < IDLE_GRACE_MS ? grace : IDLE_GRACE_MS);
    for (uint32_t i = 0; i < s->nlocal; i++) {
        if (ferry__pool_pid(s->pool, i) && !ferry__window_outstanding(s->win, i))
            ferry__pool_kill(s->pool, i, "it had no work and had not left when the loader closed");
    }
    uint64_t spent = ferry__now_ms() - t0;
    wait_workers(s, grace > spent ? grace - spent : 0);
    /* A remote worker that has not said BYE by now cannot be made to: it
     * finds the loader gone by its heartbeats and reconnects. */
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        if (s->w[i].p.state == FERRY__PEER_CONFIGURED || s->w[i].p.state == FERRY__PEER_READY)
            s->w[i].p.state = FERRY__PEER_GONE;
    }
    ferry__pool_cancel_threads(s->pool);
    if (workers_left(s)) {
        ferry__pool_signal(s->pool, SIGTERM);
        /* A stopped worker only acts on SIGTERM once continued. */
        ferry__pool_signal(s->pool, SIGCONT);
        wait_workers(s, grace / 2 > 200 ? grace / 2 : 200);
    }
    if (workers_left(s))
        ferry__pool_kill_all(s->pool);
    /* Thread workers see the cancel within one poll period. */
    s->ctx_leaked = ferry__pool_join_threads(s->pool, grace > 1000 ? grace : 1000);
}

static void *scheduler_main(void *arg)
{
    ferry__scheduler *s = arg;
    for (uint32_t i = 0; i < s->nlocal; i++) {
        int rc = ferry__pool_start(s->pool, i);
        if (rc != FERRY_OK) {
            ferry__window_fail(s->win, rc, NULL);
            break;
        }
        s->w[i].p.state = FERRY__PEER_SPAWNED;
    }
    while (!atomic_load(&s->stop)) {
        dispatch(s);
        poll_once(s, TICK_MS);
        check_deadlines(s);
    }
    shutdown_workers(s);
    return NULL;
}

/* ------------------------------------------------------------------------
 * Start and stop
 */

/* Frees everything of a scheduler whose thread has ended (or never
 * started). */
static void destroy(ferry__scheduler *s)
{
    if (s->router)
        zmq_close(s->router);
    ferry__remote_close(s->remote);
    ferry__pool_free(s->pool);
    /* The workers are gone; batches the trainer still holds keep the
     * mapping until they are released. */
    ferry__shm_close(s->shm);
    ferry__flow_free(s->flow);
    if (s->zctx && !s->ctx_leaked)
        zmq_ctx_term(s->zctx);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    ferry__forkfds_close(s->data_fd);
    ferry__endpoint_remove(s->ipc_dir);
    for (uint32_t i = 0; s->w && i < s->nworkers; i++)
        free(s->w[i].held_ready);
    free(s->w);
    free(s->names);
    pthread_mutex_destroy(&s->names_lock);
    free(s->items);
    free(s->events);
    free(s);
}

static int alloc_tables(ferry__scheduler *s)
{
    s->w = ferry__calloc(s->nworkers, sizeof *s->w);
    s->items = ferry__calloc(2 + FERRY__REMOTE_POLL_ITEMS + FERRY__POOL_POLL_ITEMS(s->nlocal),
                             sizeof *s->items);
    s->events = ferry__calloc((size_t)s->nlocal + 1, sizeof *s->events);
    s->names = ferry__calloc(s->nworkers, sizeof *s->names);
    if (!s->w || !s->items || !s->events || !s->names)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    for (uint32_t i = 0; i < s->nworkers; i++) {
        s->w[i].p.index = i;
        s->w[i].p.remote = i >= s->nlocal;
    }
    return FERRY_OK;
}

/* The guard's thread saw a remote connection close: the scheduler probes
 * its remote workers (ferry__sched_probe_remote). */
static void connection_closed(void *arg)
{
    ferry__scheduler *s = arg;
    atomic_fetch_add(&s->closed_conns, 1);
    ferry__scheduler_wake(s);
}

/* fds a bound loader keeps out of the remote connections' reach: for the
 * trainer, and 8 per local worker (ferry__pool_start's need). */
#define FD_RESERVE 64

/* The context, the local socket, the wake fd, and the remote socket when
 * bound. */
static int setup_sockets(ferry__scheduler *s)
{
    /* libzmq aborts rather than fail when its threads' pollers cannot get an
     * fd; its context, socket, listener and our eventfd take about nine,
     * and each further I/O thread two (its epoll fd and its mailbox). */
    int io_threads = ferry__config_io_threads(&s->cfg);
    int rc = ferry__fd_headroom(12 + 2 * (io_threads - 1), "opening a loader");
    if (rc != FERRY_OK)
        return rc;
    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        return ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
    if (zmq_ctx_set(s->zctx, ZMQ_BLOCKY, 0) != 0)
        return ferry__seterr(FERRY_ESYS, "setting ZMQ_BLOCKY: %s", zmq_strerror(errno));
    /* Before the first socket: libzmq starts its I/O threads with it. */
    if (zmq_ctx_set(s->zctx, ZMQ_IO_THREADS, io_threads) != 0)
        return ferry__seterr(FERRY_ESYS, "setting ZMQ_IO_THREADS to %d: %s", io_threads,
                             zmq_strerror(errno));
    rc = ferry__socket_new(s->zctx, ZMQ_ROUTER, s->cfg.max_message, &s->router);
    if (rc == FERRY_OK)
        rc = ferry__socket_bind(s->router, s->endpoint, FERRY_ESYS);
    if (rc != FERRY_OK)
        return rc;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0)
        return ferry__syserr(FERRY_ESYS, "eventfd", errno);
    for (uint32_t i = 0; i < s->nlocal; i++)
        s->w[i].p.sock = s->router;
    if (!s->cfg.bind[0])
        return FERRY_OK;
    ferry__remote_opts ro = {.bind = s->cfg.bind,
                             .curve_key = s->cfg.curve_key,
                             .curve_allow = s->cfg.curve_allow,
                             .insecure = (int)s->cfg.insecure,
                             .data_port = s->cfg.data_port,
                             .max_remote = s->cfg.max_remote,
                             .max_message = s->cfg.max_message,
                             .heartbeat_ms = s->cfg.heartbeat_ms,
                             .liveness = s->cfg.heartbeat_liveness,
                             .fd_reserve = FD_RESERVE + 8 * (int64_t)s->nlocal,
                             .closed = connection_closed,
                             .closed_arg = s,
                             .log = s->log};
    rc = ferry__remote_open(&s->remote, s->zctx, &ro);
    for (uint32_t i = s->nlocal; rc == FERRY_OK && i < s->nworkers; i++)
        s->w[i].p.sock = ferry__remote_socket(s->remote);
    return rc;
}

/* Flow control: each worker's credits and the window, from what is
 * measured, within what the user fixed and the memory allows. */
static int setup_flow(ferry__scheduler *s)
{
    const ferry_config *c = &s->cfg;
    ferry__flow_opts fo = {.nworkers = s->nworkers,
                           .credits = (uint32_t)c->credits,
                           .auto_credits = (uint32_t)ferry__config_credits(c),
                           .max_credits = FERRY__MAX_CREDITS,
                           .prefetch = c->prefetch > 0 ? (uint32_t)c->prefetch : 0,
                           .auto_window = (uint32_t)ferry__config_prefetch(c),
                           .max_window = (uint32_t)ferry__config_window_entries(c),
                           .memory = c->shm_max_bytes > 0 ? (uint64_t)c->shm_max_bytes
                                                          : (uint64_t)1 << 30};
    int rc = ferry__flow_new(&s->flow, &fo);
    if (rc == FERRY_OK)
        sched_flow_publish(s);
    return rc;
}

static int setup(ferry__scheduler *s)
{
    int threads = s->cfg.worker_mode == FERRY__PLACE_THREAD;
    int rc = alloc_tables(s);
    if (rc == FERRY_OK)
        rc = setup_flow(s);
    if (rc == FERRY_OK && !threads && s->nlocal)
        rc = ferry__find_worker(s->cfg.worker_path, s->worker_path, sizeof s->worker_path);
    /* The caller's fd may be closed once open returns: ours is a copy. */
    if (rc == FERRY_OK && s->cfg.dataset_fd >= 0) {
        ferry__forkfds_hold();
        s->data_fd = fcntl((int)s->cfg.dataset_fd, F_DUPFD_CLOEXEC, 3);
        int e = errno;
        ferry__forkfds_add(s->data_fd);
        ferry__forkfds_release();
        if (s->data_fd < 0)
            rc = ferry__seterr(FERRY_EINVAL, "option dataset_fd: %lld is not an open file (%s)",
                               (long long)s->cfg.dataset_fd, strerror(e));
    }
    if (rc == FERRY_OK)
        rc = ferry__endpoint_local(threads, s, s->ipc_dir, sizeof s->ipc_dir, s->endpoint,
                                   sizeof s->endpoint);
    if (rc == FERRY_OK)
        rc = setup_sockets(s);
    /* Sized at the first READY, once the schema says how big a batch is. */
    if (rc == FERRY_OK && s->nlocal && s->cfg.shm && s->cfg.shm_max_bytes > 0) {
        rc = ferry__shm_new(&s->shm);
        if (rc == FERRY_OK)
            ferry__shm_on_free(s->shm, want_drain, s);
    }
    if (rc != FERRY_OK)
        return rc;
    ferry__pool_opts po = {.n = s->nlocal,
                           .threads = threads,
                           .worker_path = s->worker_path,
                           .worker_args = s->cfg.worker_args,
                           .endpoint = s->endpoint,
                           .zctx = s->zctx,
                           .shm_fd = s->shm ? ferry__shm_fd(s->shm) : -1,
                           .shm = s->shm,
                           .data_fd = s->data_fd,
                           .fork_server = (int)s->cfg.fork_server,
                           .fork_from = (int)s->cfg.fork_from,
                           .dataset = s->cfg.dataset,
                           .start_timeout_ms = (int)s->cfg.start_timeout_ms,
                           .wake_fd = s->wake_fd,
                           .log = s->log,
                           .exit_fn = s->cfg.exit_fn,
                           .exit_user = s->cfg.exit_user};
    return ferry__pool_new(&s->pool, &po);
}

int ferry__scheduler_start(ferry__scheduler **out, const ferry_config *cfg, ferry__window *win)
{
    ferry__scheduler *s = ferry__calloc(1, sizeof *s);
    if (!s)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    s->cfg = *cfg;
    s->log = ferry__config_log(cfg);
    s->win = win;
    s->wake_fd = -1;
    s->data_fd = -1;
    s->nworkers = (uint32_t)ferry__config_slots(cfg);
    s->nlocal = (uint32_t)cfg->workers;
    s->min_workers = (uint32_t)ferry__config_min_workers(cfg);
    s->open_local = cfg->open_local_ready < 0 || cfg->open_local_ready > cfg->workers
                        ? (uint32_t)cfg->workers
                        : (uint32_t)cfg->open_local_ready;
    pthread_mutex_init(&s->names_lock, NULL); /* before anything destroy() undoes */
    int rc = setup(s);
    if (rc != FERRY_OK) {
        destroy(s);
        return rc;
    }
    ferry__window_set_wake(win, ferry__scheduler_wake, s);
    s->start_deadline_ms = ferry__now_ms() + (uint64_t)cfg->start_timeout_ms;
    /* The scheduler thread takes no signals: they stay the trainer's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&s->thread, NULL, scheduler_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        rc = ferry__syserr(FERRY_ESYS, "could not start the scheduler thread", e);
        ferry__window_set_wake(win, NULL, NULL);
        destroy(s);
        return rc;
    }
    s->thread_live = 1;
    *out = s;
    return FERRY_OK;
}

int ferry__scheduler_stop(ferry__scheduler *s)
{
    if (!s)
        return 0;
    if (s->thread_live) {
        atomic_store(&s->stop, 1);
        ferry__scheduler_wake(s);
        pthread_join(s->thread, NULL);
    }
    ferry__window_set_wake(s->win, NULL, NULL);
    int leaked = s->ctx_leaked;
    destroy(s);
    return leaked;
}

const char *ferry__scheduler_endpoint(const ferry__scheduler *s)
{
    return s->remote ? ferry__remote_endpoint(s->remote) : NULL;
}

const ferry__schema *ferry__scheduler_schema(const ferry__scheduler *s)
{
    return &s->schema;
}

pid_t ferry__scheduler_worker_pid(ferry__scheduler *s, uint32_t i)
{
    return i < s->nlocal ? ferry__pool_pid(s->pool, i) : 0;
}

void ferry__scheduler_worker_host(ferry__scheduler *s, uint32_t i, char *buf, size_t cap,
                                  uint32_t *pid)
{
    pthread_mutex_lock(&s->names_lock);
    snprintf(buf, cap, "%s", i < s->nworkers ? s->names[i].host : "");
    *pid = i < s->nworkers ? s->names[i].pid : 0;
    pthread_mutex_unlock(&s->names_lock);
}

void ferry__sched_name_remote(ferry__scheduler *s, const sched_worker *w)
{
    pthread_mutex_lock(&s->names_lock);
    snprintf(s->names[w->p.index].host, sizeof s->names[w->p.index].host, "%s", w->p.host);
    s->names[w->p.index].pid = w->p.rpid;
    pthread_mutex_unlock(&s->names_lock);
}

void ferry__scheduler_stream_ended(ferry__scheduler *s)
{
    if (s->shm)
        want_drain(s);
}

void ferry__scheduler_keep_slots(ferry__scheduler *s)
{
    if (s->shm)
        ferry__shm_keep(s->shm);
}

void ferry__scheduler_usage(ferry__scheduler *s, ferry_stats *st)
{
    if (s->shm)
        ferry__shm_usage(s->shm, &st->slot_bytes, &st->slots, &st->slots_held, &st->slot_memory);
    if (s->remote)
        ferry__remote_connections(s->remote, &st->remote_connections,
                                  &st->connections_turned_away);
}
