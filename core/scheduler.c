/*
 * scheduler.c - the scheduler thread (see scheduler.h).
 *
 * One loop: fill the window (dispatch), wait on everything that can happen
 * (poll_once: the local and remote sockets, the ZAP handler, the wake fd,
 * each local worker's stderr and pidfd), then look at the clock
 * (check_deadlines). It never looks at epoch boundaries, which is why
 * prefetch runs straight across them.
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
#include "batch.h"
#include "clock.h"
#include "endpoint.h"
#include "error.h"
#include "peer.h"
#include "pool.h"
#include "process.h"
#include "remote.h"
#include "zsock.h"

#define TICK_MS 100
#define SETTLE_MS 500 /* the longest a dead worker's last replies are waited for */

_Static_assert(FERRY__DATASET_MAX <= FERRY__SPEC_MAX, "a dataset spec must fit in CONFIG");
_Static_assert(FERRY__PEER_HOST_MAX <= FERRY__HOST_MAX, "host names are cut to fit");

/* A worker as the scheduler sees it: the peer record, and a local
 * worker's death while it settles. */
typedef struct sched_worker {
    ferry__peer p;
    int death_pending;
    uint64_t settle_by_ms;
    ferry__pool_event death;
} sched_worker;

struct ferry__scheduler {
    ferry_config cfg;
    ferry__window *win;
    ferry__pool *pool;
    ferry__remote *remote; /* NULL without bind */
    void *zctx;
    void *router; /* local workers (ipc:// or inproc://) */
    int wake_fd;
    char ipc_dir[FERRY__IPC_DIR_MAX];
    char endpoint[FERRY__LOCAL_ENDPOINT_MAX];
    char worker_path[PATH_MAX];
    sched_worker *w;
    uint32_t nworkers; /* slots: nlocal local ones, then the remote ones */
    uint32_t nlocal;
    uint32_t min_workers;
    zmq_pollitem_t *items;    /* poll_once's scratch: 4 + 2 * nlocal */
    ferry__pool_event *events; /* nlocal */
    pthread_t thread;
    int thread_live;
    atomic_int stop;
    int ctx_leaked;

    /* --- scheduler thread only --- */
    int closing; /* shutdown has begun: deaths are expected */
    uint32_t rr; /* round-robin start for picking workers */
    uint64_t n;  /* the dataset's length, from the first READY */
    uint64_t start_deadline_ms;
    uint64_t idle_since_ms;  /* running with no ready worker since then; 0 = has some */
    uint32_t deaths_pending; /* local workers reaped, death not yet handled */
    ferry__msg in, out;      /* message scratch, too big for the stack */
};

static void lose_remote(ferry__scheduler *s, sched_worker *w, const char *why, int charge);

void ferry__scheduler_wake(void *arg)
{
    ferry__scheduler *s = arg;
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(s->wake_fd, &one, sizeof one);
    while (r < 0 && errno == EINTR);
}

static void describe(const ferry__scheduler *s, const sched_worker *w, char *buf, size_t cap)
{
    pid_t pid = w->p.remote ? 0 : ferry__pool_pid(s->pool, w->p.index);
    if (w->p.remote)
        snprintf(buf, cap, "remote worker %u (%s, pid %u)", w->p.index, w->p.host, w->p.rpid);
    else if (pid)
        snprintf(buf, cap, "worker %u (pid %d)", w->p.index, (int)pid);
    else
        snprintf(buf, cap, "worker %u (thread)", w->p.index);
}

static int send_msg(ferry__scheduler *s, sched_worker *w, zmq_msg_t *payload)
{
    return ferry__zsock_send(w->p.sock, &w->p.ident, &s->out, payload, ZMQ_DONTWAIT);
}

static int send_simple(ferry__scheduler *s, sched_worker *w, ferry__msg_type type)
{
    s->out.type = type;
    return send_msg(s, w, NULL);
}

/* ------------------------------------------------------------------------
 * Dispatch
 */

/* The ready worker with a free credit and the fewest tasks, round-robin
 * among equals. */
static sched_worker *pick_worker(ferry__scheduler *s)
{
    sched_worker *best = NULL;
    uint32_t best_n = 0;
    for (uint32_t k = 0; k < s->nworkers; k++) {
        sched_worker *w = &s->w[(s->rr + k) % s->nworkers];
        if (w->p.state != FERRY__PEER_READY || w->p.unreachable)
            continue;
        uint32_t n = ferry__window_outstanding(s->win, w->p.index);
        if (n < (uint32_t)s->cfg.credits && (!best || n < best_n)) {
            best = w;
            best_n = n;
        }
    }
    if (best)
        s->rr = (best->p.index + 1) % s->nworkers;
    return best;
}

static int send_task(ferry__scheduler *s, ferry__window_entry *e, sched_worker *w)
{
    zmq_msg_t p;
    if (zmq_msg_init_size(&p, (size_t)e->t.count * 8) != 0)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a task");
    ferry__indices_pack(e->indices, e->t.count, zmq_msg_data(&p));
    s->out.type = FERRY__MSG_TASK;
    s->out.u.task = (ferry__task){.id = e->id,
                                  .epoch = e->t.epoch,
                                  .batch_in_epoch = e->t.batch_in_epoch,
                                  .seq = e->t.seq,
                                  .count = e->t.count};
    int rc = send_msg(s, w, &p);
    if (rc != FERRY_OK)
        zmq_msg_close(&p);
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
        char why[128];
        snprintf(why, sizeof why, "its connection is gone (%s)", ferry_last_error());
        /* Charged: a remote process that crashed on a batch looks just like
         * this, and a poison batch must still be given up. */
        lose_remote(s, w, why, 1);
        return 1;
    }
    char who[64], msg[FERRY__ERRMSG_MAX];
    describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "could not send a task to %s: %s", who, ferry_last_error());
    ferry__window_fail(s->win, FERRY_EWORKER, msg);
    return 0;
}

/* Fills the window: while a worker has a free credit and the window has a
 * task to send (one to send again first), send it. */
static void dispatch(ferry__scheduler *s)
{
    for (;;) {
        sched_worker *w = pick_worker(s);
        if (!w)
            return;
        ferry__window_entry *e = ferry__window_take(s->win);
        if (!e)
            return;
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
 * Messages from workers
 */

static sched_worker *find_by_ident(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (w->p.sock == sock && w->p.ident.len == id->len && w->p.state != FERRY__PEER_GONE &&
            w->p.state != FERRY__PEER_EMPTY && memcmp(w->p.ident.id, id->id, id->len) == 0)
            return w;
    }
    return NULL;
}

/* A remote worker refused: counted, said so (rate-limited), and sent STOP
 * so it backs off instead of waiting for a CONFIG that will not come. */
static void reject_remote(ferry__scheduler *s, const ferry__ident *id, const char *why)
{
    ferry__remote_log_refusal(ferry__window_count(s->win, FERRY__STAT_REJECTED), why);
    if (id) {
        s->out.type = FERRY__MSG_STOP;
        ferry__zsock_send(ferry__remote_socket(s->remote), id, &s->out, NULL, ZMQ_DONTWAIT);
    }
}

static void zap_refused(void *arg, const char *why)
{
    reject_remote(arg, NULL, why);
}

/* Sends CONFIG (or, while closing, STOP) to a worker that said HELLO. */
static void configure_worker(ferry__scheduler *s, sched_worker *w)
{
    if (s->closing) {
        /* It started just before close: no dataset to open, just go. */
        send_simple(s, w, FERRY__MSG_STOP);
        w->p.state = FERRY__PEER_CONFIGURED;
        return;
    }
    ferry__config_msg *c = &s->out.u.config;
    memset(c, 0, sizeof *c);
    s->out.type = FERRY__MSG_CONFIG;
    memcpy(c->dataset, s->cfg.dataset, sizeof s->cfg.dataset);
    c->worker_index = w->p.index;
    c->num_workers = s->nworkers;
    c->seed = (uint64_t)s->cfg.seed;
    c->credits = (uint32_t)s->cfg.credits;
    /* Local workers are watched through their pidfds (or are threads). */
    c->heartbeat_ms = w->p.remote ? (uint32_t)s->cfg.heartbeat_ms : 0;
    c->liveness = (uint32_t)s->cfg.heartbeat_liveness;
    if (send_msg(s, w, NULL) == FERRY_OK) {
        w->p.state = FERRY__PEER_CONFIGURED;
        w->p.sent_ms = ferry__now_ms();
    }
}

/* A free remote slot: this connection's own if it had one, else the
 * first that is empty; NULL when max_remote are taken. */
static sched_worker *free_remote_slot(ferry__scheduler *s, sched_worker *own)
{
    if (own && own->p.state == FERRY__PEER_EMPTY)
        return own;
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        if (s->w[i].p.state == FERRY__PEER_EMPTY || s->w[i].p.state == FERRY__PEER_GONE)
            return &s->w[i];
    }
    return NULL;
}

static void on_hello_remote(ferry__scheduler *s, const ferry__ident *id)
{
    const ferry__hello *h = &s->in.u.hello;
    char why[FERRY__ERRMSG_MAX];
    if (!ferry__remote_hello_ok(h, why, sizeof why)) {
        reject_remote(s, id, why);
        return;
    }
    sched_worker *w = find_by_ident(s, ferry__remote_socket(s->remote), id);
    if (w) /* a second HELLO on one connection: a new session; the old one ends */
        lose_remote(s, w, "it started a new session", 0);
    w = free_remote_slot(s, w);
    if (!w) {
        snprintf(why, sizeof why, "%s (pid %u): all %lld remote slots are taken (max_remote)",
                 h->host, h->pid, (long long)s->cfg.max_remote);
        reject_remote(s, id, why);
        return;
    }
    w->p.ident = *id;
    w->p.unreachable = 0;
    w->p.delivered_any = 0;
    w->p.rpid = h->pid;
    snprintf(w->p.host, sizeof w->p.host, "%s", h->host);
    w->p.heard_ms = ferry__now_ms();
    configure_worker(s, w);
}

static void on_hello(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    if (s->remote && sock == ferry__remote_socket(s->remote)) {
        on_hello_remote(s, id);
        return;
    }
    const ferry__hello *h = &s->in.u.hello;
    if (h->version != FERRY_PROTOCOL_VERSION || h->slot < 0 || (uint32_t)h->slot >= s->nlocal) {
        fprintf(stderr, "ferry: refused HELLO (protocol version %u, slot %d) from %s\n", h->version,
                h->slot, h->host);
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    sched_worker *w = &s->w[h->slot];
    pid_t pid = ferry__pool_pid(s->pool, w->p.index);
    if (w->p.state != FERRY__PEER_SPAWNED || (pid_t)h->pid != (pid ? pid : getpid())) {
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    w->p.ident = *id;
    configure_worker(s, w);
}

/* Open returns once every local worker and at least min_workers in all are
 * ready: the dataset's length is known then, so the window can start. */
static void maybe_start(ferry__scheduler *s, uint32_t ready)
{
    if (ferry__window_phase(s->win) != FERRY__PHASE_STARTING || ready < s->min_workers)
        return;
    for (uint32_t i = 0; i < s->nlocal; i++) {
        if (s->w[i].p.state != FERRY__PEER_READY)
            return;
    }
    ferry__window_start(s->win, s->n);
}

/* READY: the worker's dataset opened with the same length as everyone
 * else's, or it did not. A local worker that cannot open the dataset fails
 * the loader; a remote host with the wrong data is turned away. */
static void on_ready(ferry__scheduler *s, sched_worker *w)
{
    const ferry__ready *r = &s->in.u.ready;
    char who[96], msg[FERRY__ERRMSG_MAX];
    if (w->p.state != FERRY__PEER_CONFIGURED) {
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    describe(s, w, who, sizeof who);
    if (r->code != 0) {
        snprintf(msg, sizeof msg, "%s could not open dataset '%s': %s", who, s->cfg.dataset,
                 r->error);
    } else if (s->n && r->length != s->n) {
        snprintf(msg, sizeof msg, "%s sees %llu items in dataset '%s', others see %llu", who,
                 (unsigned long long)r->length, s->cfg.dataset, (unsigned long long)s->n);
    } else {
        s->n = r->length;
        w->p.state = FERRY__PEER_READY;
        uint32_t ready = ferry__window_add_workers(s->win, +1);
        s->idle_since_ms = 0;
        if (w->p.remote) {
            ferry__window_count(s->win, FERRY__STAT_JOINED);
            if (ferry__window_phase(s->win) == FERRY__PHASE_RUNNING)
                fprintf(stderr, "ferry: %s joined\n", who);
        }
        maybe_start(s, ready);
        return;
    }
    if (!w->p.remote) {
        ferry__window_fail(s->win, r->code != 0 ? r->code : FERRY_EMISMATCH, msg);
        return;
    }
    reject_remote(s, &w->p.ident, msg);
    w->p.state = FERRY__PEER_EMPTY;
}

/* The worker delivered (or failed on) a task: it is alive and useful. */
static void credit_worker(sched_worker *w)
{
    w->p.delivered_any = 1;
    w->p.failed_starts = 0;
}

/* The batch's fields as views into the received payload. */
static void field_views(const ferry__batch_hdr *h, const unsigned char *base, ferry_tensor *out)
{
    for (uint32_t f = 0; f < h->nfields; f++) {
        const ferry__field_desc *d = &h->fields[f];
        out[f] = (ferry_tensor){.name = d->name,
                                .dtype = d->dtype,
                                .ndim = d->ndim,
                                .data = base + d->offset,
                                .nbytes = d->nbytes};
        memcpy(out[f].shape, d->shape, sizeof out[f].shape);
    }
}

static void on_batch(ferry__scheduler *s, sched_worker *w, zmq_msg_t *payload)
{
    const ferry__batch_hdr *h = &s->in.u.batch;
    ferry__window_entry *e = ferry__window_find(s->win, w->p.index, h->id);
    if (!e || h->count != e->t.count) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    ferry_batch_info info = {.epoch = e->t.epoch,
                             .batch_in_epoch = e->t.batch_in_epoch,
                             .seq = e->t.seq,
                             .size = e->t.count,
                             .last_in_epoch = e->t.last_in_epoch,
                             .worker = w->p.index};
    ferry_tensor fields[FERRY_MAX_FIELDS];
    field_views(h, zmq_msg_data(payload), fields);
    ferry__batch_backing backing = {.release = ferry__zsock_payload_release};
    ferry_batch *b = NULL;
    int rc = ferry__zsock_payload_keep(payload, &backing.ctx);
    if (rc == FERRY_OK) {
        rc = ferry__batch_new(&b, fields, (int)h->nfields, &info, e->indices, backing);
        if (rc != FERRY_OK)
            ferry__zsock_payload_release(backing.ctx);
    }
    if (rc != FERRY_OK) {
        ferry__window_fail(s->win, FERRY_ENOMEM, "out of memory receiving a batch");
        return;
    }
    credit_worker(w);
    ferry__window_complete(s->win, e, b, 0, NULL, ferry__now_ms());
}

static void on_fail(ferry__scheduler *s, sched_worker *w)
{
    const ferry__fail *f = &s->in.u.fail;
    ferry__window_entry *e = ferry__window_find(s->win, w->p.index, f->id);
    if (!e) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    char who[96];
    describe(s, w, who, sizeof who);
    char *msg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (msg)
        snprintf(msg, FERRY__ERRMSG_MAX, "%s failed on index %llu (epoch %llu, batch %llu): %s",
                 who, (unsigned long long)f->index, (unsigned long long)e->t.epoch,
                 (unsigned long long)e->t.batch_in_epoch, f->message);
    credit_worker(w);
    ferry__window_complete(s->win, e, NULL, f->code == FERRY_ERANGE ? FERRY_ERANGE : FERRY_EBATCH,
                           msg, ferry__now_ms());
}

/* A message that only a ready worker may send. */
static int ready_or_malformed(ferry__scheduler *s, const sched_worker *w)
{
    if (w->p.state == FERRY__PEER_READY)
        return 1;
    ferry__window_count(s->win, FERRY__STAT_MALFORMED);
    return 0;
}

static void on_message(ferry__scheduler *s, void *sock, const ferry__ident *id, zmq_msg_t *payload)
{
    if (s->in.type == FERRY__MSG_HELLO) {
        on_hello(s, sock, id);
        return;
    }
    sched_worker *w = find_by_ident(s, sock, id);
    if (!w) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    w->p.heard_ms = ferry__now_ms();
    switch (s->in.type) {
    case FERRY__MSG_READY:
        on_ready(s, w);
        break;
    case FERRY__MSG_BATCH:
        if (ready_or_malformed(s, w))
            on_batch(s, w, payload);
        break;
    case FERRY__MSG_FAIL:
        if (ready_or_malformed(s, w))
            on_fail(s, w);
        break;
    case FERRY__MSG_BYE:
        if (w->p.remote && !s->closing)
            lose_remote(s, w, "it said BYE", 0);
        else
            w->p.state = FERRY__PEER_GONE;
        break;
    case FERRY__MSG_HEARTBEAT:
        break;
    default:
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        break;
    }
}

/* Reads what is waiting on the socket, at most `budget` messages so the
 * loop also gets round to dispatching and to the pidfds. */
static void drain_socket(ferry__scheduler *s, void *sock, int budget)
{
    while (budget-- > 0) {
        ferry__ident id;
        zmq_msg_t payload;
        int rc = ferry__zsock_recv(sock, &id, &s->in, &payload, ZMQ_DONTWAIT);
        if (rc == FERRY_EPROTO) {
            ferry__window_count(s->win, FERRY__STAT_MALFORMED);
            continue;
        }
        if (rc != FERRY_OK)
            return; /* EAGAIN: nothing more */
        on_message(s, sock, &id, &payload);
        zmq_msg_close(&payload);
    }
}

/* ------------------------------------------------------------------------
 * Deaths and losses
 */

/* A local process worker has died. Its death is handled (tasks requeued,
 * the one it was on charged) only once every reply it sent before dying has
 * been read, or the charge would fall on a batch it had already answered:
 * its connection is probed, and while ZeroMQ still routes to it, its pipe
 * (and maybe a reply) is still draining; once the send fails with
 * EHOSTUNREACH the pipe has ended after its last message. Bounded by
 * SETTLE_MS. */
static void on_death(ferry__scheduler *s, const ferry__pool_event *ev)
{
    sched_worker *w = &s->w[ev->index];
    w->death = *ev;
    w->p.unreachable = 1; /* no task goes to it meanwhile */
    w->death_pending = 1;
    w->settle_by_ms = ferry__now_ms() + SETTLE_MS;
    s->deaths_pending++;
}

/* The death message: who, how, and what it said last. */
static void death_message(const sched_worker *w, ferry__peer_state was, char *msg, size_t cap)
{
    char how[256];
    const ferry__pool_event *ev = &w->death;
    ferry__describe_status(ev->status, how, sizeof how);
    snprintf(msg, cap, "worker %u (pid %d) %s%s%s%s%s%s", w->p.index, (int)ev->pid, how,
             was == FERRY__PEER_SPAWNED || was == FERRY__PEER_CONFIGURED ? " while starting" : "",
             ev->kill_reason[0] ? ", killed by ferry because " : "", ev->kill_reason,
             ev->words[0] ? "; its last words: " : "", ev->words);
}

/* The settled death of local worker w: its tasks go back to the window
 * (the one it was on charged), and under the restart policy the slot is
 * started again, unless it keeps dying without delivering anything. */
static void handle_death(ferry__scheduler *s, sched_worker *w)
{
    ferry__peer_state was = w->p.state;
    w->p.state = FERRY__PEER_GONE;
    if (s->closing)
        return;
    char msg[FERRY__ERRMSG_MAX];
    death_message(w, was, msg, sizeof msg);
    if (was == FERRY__PEER_READY)
        ferry__window_add_workers(s->win, -1);
    if (ferry__window_phase(s->win) != FERRY__PHASE_RUNNING ||
        s->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL) {
        ferry__window_fail(s->win, FERRY_EWORKER, msg);
        return;
    }
    ferry__window_requeue(s->win, w->p.index, 1, msg);
    if (!w->p.delivered_any && ++w->p.failed_starts > (uint32_t)s->cfg.max_attempts + 2) {
        char m2[FERRY__ERRMSG_MAX];
        snprintf(m2, sizeof m2,
                 "worker %u died %u times in a row without delivering a batch; the last: %s",
                 w->p.index, w->p.failed_starts, msg);
        ferry__window_fail(s->win, FERRY_EWORKER, m2);
        return;
    }
    ferry__window_count(s->win, FERRY__STAT_RESTARTS);
    fprintf(stderr, "ferry: %s; starting a replacement\n", msg);
    w->p.delivered_any = 0;
    w->p.ident.len = 0;
    w->p.unreachable = 0;
    int rc = ferry__pool_start(s->pool, w->p.index);
    if (rc != FERRY_OK)
        ferry__window_fail(s->win, rc, NULL);
    else
        w->p.state = FERRY__PEER_SPAWNED;
}

static void settle_death(ferry__scheduler *s, sched_worker *w)
{
    if (!w->death_pending)
        return;
    if (!s->closing && w->p.ident.len && ferry__now_ms() < w->settle_by_ms) {
        if (send_simple(s, w, FERRY__MSG_HEARTBEAT) == FERRY_OK || errno != EHOSTUNREACH)
            return;
    }
    w->death_pending = 0;
    s->deaths_pending--;
    handle_death(s, w);
}

static void settle_deaths(ferry__scheduler *s)
{
    for (uint32_t i = 0; s->deaths_pending && i < s->nlocal; i++)
        settle_death(s, &s->w[i]);
}

/* A remote worker is given up: gone silent past heartbeat_ms x liveness (a
 * cut link, a frozen host, a stopped process), unreachable, past its
 * timeout, or it said BYE. Its tasks go to the others, exactly like a dead
 * local worker's: the batch it was on is charged unless it said BYE
 * (silence or a dropped connection may be a crash on that batch). Its slot
 * is free for the next remote worker, and anything it sends later is
 * dropped as stale (its routing id is no longer known). */
static void lose_remote(ferry__scheduler *s, sched_worker *w, const char *why, int charge)
{
    char who[96], msg[FERRY__ERRMSG_MAX];
    describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "%s left: %s", who, why);
    ferry__peer_state was = w->p.state;
    w->p.state = FERRY__PEER_EMPTY;
    w->p.ident.len = 0;
    if (was == FERRY__PEER_READY) {
        ferry__window_add_workers(s->win, -1);
        ferry__window_count(s->win, FERRY__STAT_LOST);
    }
    ferry__window_requeue(s->win, w->p.index, charge, msg);
    if (charge && was == FERRY__PEER_READY && s->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL)
        ferry__window_fail(s->win, FERRY_EWORKER, msg);
    if (was == FERRY__PEER_READY && !s->closing)
        fprintf(stderr, "ferry: %s\n", msg);
}

/* ------------------------------------------------------------------------
 * Deadlines
 */

static void check_start_deadline(ferry__scheduler *s, uint64_t now)
{
    if (now < s->start_deadline_ms)
        return;
    ferry_stats st;
    ferry__window_stats(s->win, &st);
    uint32_t local_ready = 0;
    for (uint32_t i = 0; i < s->nlocal; i++)
        local_ready += s->w[i].p.state == FERRY__PEER_READY;
    char msg[512];
    if (s->remote)
        snprintf(msg, sizeof msg,
                 "only %u workers were ready after %lld ms (%u of %u local, %u remote on %s); "
                 "open waits for every local worker and min_workers %u in all",
                 st.workers, (long long)s->cfg.start_timeout_ms, local_ready, s->nlocal,
                 st.workers - local_ready, ferry__remote_endpoint(s->remote), s->min_workers);
    else
        snprintf(msg, sizeof msg, "only %u of %u workers were ready after %lld ms", st.workers,
                 s->nworkers, (long long)s->cfg.start_timeout_ms);
    ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
}

/* With no worker at all (every remote host gone, and no local ones, which
 * are replaced under their own limits), next() would wait forever: after
 * start_timeout_ms of that the loader fails. */
static void check_idle(ferry__scheduler *s, uint64_t now)
{
    if (s->nlocal || ferry__window_add_workers(s->win, 0))
        return;
    if (!s->idle_since_ms) {
        s->idle_since_ms = now;
    } else if (now - s->idle_since_ms >= (uint64_t)s->cfg.start_timeout_ms) {
        char msg[256];
        snprintf(msg, sizeof msg, "no worker has been ready for %llu ms (start_timeout_ms)",
                 (unsigned long long)(now - s->idle_since_ms));
        ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
    }
}

/* A local worker past timeout_ms on its current task: under restart
 * (process workers) it is killed, and its death requeues the task;
 * otherwise the loader fails with a timeout naming the worker and the
 * task. A remote one cannot be killed from here: it is given up. */
static void on_timeout(ferry__scheduler *s, sched_worker *w, const ferry__window_entry *cur,
                       uint64_t busy_ms)
{
    char who[96], why[256], msg[FERRY__ERRMSG_MAX];
    ferry__window_count(s->win, FERRY__STAT_TIMEOUTS);
    if (w->p.remote) {
        snprintf(why, sizeof why, "it spent %llu ms on one batch, past timeout_ms %lld",
                 (unsigned long long)busy_ms, (long long)s->cfg.timeout_ms);
        lose_remote(s, w, why, 1);
        return;
    }
    snprintf(why, sizeof why,
             "it spent %llu ms on batch %llu (epoch %llu, batch %llu), past timeout_ms %lld",
             (unsigned long long)busy_ms, (unsigned long long)cur->t.seq,
             (unsigned long long)cur->t.epoch, (unsigned long long)cur->t.batch_in_epoch,
             (long long)s->cfg.timeout_ms);
    if (s->cfg.on_worker_failure == FERRY__ON_FAILURE_RESTART &&
        ferry__pool_kill(s->pool, w->p.index, why))
        return;
    describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "%s timed out: %s", who, why);
    ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
}

static void check_timeouts(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        uint64_t since;
        const ferry__window_entry *cur;
        if (w->p.state != FERRY__PEER_READY || w->death_pending ||
            (!w->p.remote && ferry__pool_killing(s->pool, i)) ||
            !(cur = ferry__window_current(s->win, i, &since)) ||
            now - since < (uint64_t)s->cfg.timeout_ms)
            continue;
        on_timeout(s, w, cur, now - since);
        if (ferry__window_phase(s->win) != FERRY__PHASE_RUNNING)
            return;
    }
}

/* A replacement that does not get ready (stopped, stuck opening the
 * dataset) is killed; its death counts as a failed start. */
static void check_replacements(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nlocal; i++) {
        ferry__peer_state st = s->w[i].p.state;
        if ((st == FERRY__PEER_SPAWNED || st == FERRY__PEER_CONFIGURED) &&
            ferry__pool_ready_overdue(s->pool, i, now)) {
            char why[128];
            snprintf(why, sizeof why, "it was not ready within start_timeout_ms %lld",
                     (long long)s->cfg.start_timeout_ms);
            ferry__pool_kill(s->pool, i, why);
        }
    }
}

/* Remote liveness, both ways: a HEARTBEAT to each remote worker that has
 * been sent nothing for heartbeat_ms, and the loss of any that has said
 * nothing for heartbeat_ms x liveness. */
static void check_remote(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (w->p.state != FERRY__PEER_CONFIGURED && w->p.state != FERRY__PEER_READY)
            continue;
        char why[160];
        switch (ferry__remote_liveness(s->remote, &w->p, now, why, sizeof why)) {
        case FERRY__LIVE_LOST:
            lose_remote(s, w, why, 1);
            break;
        case FERRY__LIVE_HEARTBEAT:
            if (send_simple(s, w, FERRY__MSG_HEARTBEAT) == FERRY_OK)
                w->p.sent_ms = now;
            else
                lose_remote(s, w, "its connection is gone", 1);
            break;
        case FERRY__LIVE_OK:
            break;
        }
    }
}

static void check_deadlines(ferry__scheduler *s)
{
    uint64_t now = ferry__now_ms();
    ferry__phase ph = ferry__window_phase(s->win);
    if (ph == FERRY__PHASE_STARTING)
        check_start_deadline(s, now);
    if (ph == FERRY__PHASE_RUNNING) {
        check_idle(s, now);
        check_replacements(s, now);
        if (s->cfg.timeout_ms > 0)
            check_timeouts(s, now);
    }
    if (s->remote && ferry__window_phase(s->win) != FERRY__PHASE_FAILED)
        check_remote(s, now);
}

/* ------------------------------------------------------------------------
 * Waiting
 */

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
    if (s->deaths_pending && timeout_ms > 2)
        timeout_ms = 2; /* a dead worker's last replies are being waited for */
    if (zmq_poll(items, n, timeout_ms) <= 0) {
        settle_deaths(s);
        return;
    }
    if (items[1].revents & ZMQ_POLLIN) {
        uint64_t v;
        while (read(s->wake_fd, &v, sizeof v) < 0 && errno == EINTR)
            ;
    }
    if (s->remote)
        ferry__remote_serve_zap(s->remote, remote_items, zap_refused, s);
    if (items[0].revents & ZMQ_POLLIN)
        drain_socket(s, s->router, 64);
    if (s->remote && ferry__remote_readable(s->remote, remote_items))
        drain_socket(s, ferry__remote_socket(s->remote), 64);
    int nev = ferry__pool_after_poll(s->pool, pool_items, s->events);
    for (int i = 0; i < nev; i++) {
        const ferry__pool_event *ev = &s->events[i];
        if (ev->kind == FERRY__POOL_DIED) {
            on_death(s, ev);
        } else {
            /* A thread cannot be replaced like a process: the loader fails
             * (and an open in progress returns at once). */
            char msg[FERRY__ERRMSG_MAX];
            snprintf(msg, sizeof msg, "worker %u (thread) stopped: %s", ev->index, ev->words);
            ferry__window_fail(s->win, ev->code, msg);
        }
    }
    settle_deaths(s);
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

static void shutdown_workers(ferry__scheduler *s)
{
    uint64_t grace = (uint64_t)s->cfg.close_grace_ms;
    s->closing = 1;
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (w->p.ident.len && w->p.state != FERRY__PEER_GONE && w->p.state != FERRY__PEER_EMPTY)
            send_simple(s, w, FERRY__MSG_STOP);
    }
    ferry__window_fail(s->win, FERRY_ECLOSED, "the loader is closing");
    wait_workers(s, grace);
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
    if (s->zctx && !s->ctx_leaked)
        zmq_ctx_term(s->zctx);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    ferry__endpoint_remove(s->ipc_dir);
    free(s->w);
    free(s->items);
    free(s->events);
    free(s);
}

static int alloc_tables(ferry__scheduler *s)
{
    s->w = ferry__calloc(s->nworkers, sizeof *s->w);
    s->items = ferry__calloc(4 + 2 * (size_t)s->nlocal, sizeof *s->items);
    s->events = ferry__calloc(s->nlocal ? s->nlocal : 1, sizeof *s->events);
    if (!s->w || !s->items || !s->events)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    for (uint32_t i = 0; i < s->nworkers; i++) {
        s->w[i].p.index = i;
        s->w[i].p.remote = i >= s->nlocal;
    }
    return FERRY_OK;
}

/* The context, the local socket, the wake fd, and the remote socket when
 * bound. */
static int setup_sockets(ferry__scheduler *s)
{
    /* libzmq aborts rather than fail when its threads' pollers cannot get an
     * fd; its context, socket, listener and our eventfd take about nine. */
    int rc = ferry__fd_headroom(12, "opening a loader");
    if (rc != FERRY_OK)
        return rc;
    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        return ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
    zmq_ctx_set(s->zctx, ZMQ_BLOCKY, 0);
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
                             .max_message = s->cfg.max_message,
                             .heartbeat_ms = s->cfg.heartbeat_ms,
                             .liveness = s->cfg.heartbeat_liveness};
    rc = ferry__remote_open(&s->remote, s->zctx, &ro);
    for (uint32_t i = s->nlocal; rc == FERRY_OK && i < s->nworkers; i++)
        s->w[i].p.sock = ferry__remote_socket(s->remote);
    return rc;
}

static int setup(ferry__scheduler *s)
{
    int threads = s->cfg.worker_mode == FERRY__PLACE_THREAD;
    int rc = alloc_tables(s);
    if (rc == FERRY_OK && !threads && s->nlocal)
        rc = ferry__find_worker(s->cfg.worker_path, s->worker_path, sizeof s->worker_path);
    if (rc == FERRY_OK)
        rc = ferry__endpoint_local(threads, s, s->ipc_dir, sizeof s->ipc_dir, s->endpoint,
                                   sizeof s->endpoint);
    if (rc == FERRY_OK)
        rc = setup_sockets(s);
    if (rc != FERRY_OK)
        return rc;
    ferry__pool_opts po = {.n = s->nlocal,
                           .threads = threads,
                           .worker_path = s->worker_path,
                           .endpoint = s->endpoint,
                           .zctx = s->zctx,
                           .start_timeout_ms = (int)s->cfg.start_timeout_ms,
                           .wake_fd = s->wake_fd};
    return ferry__pool_new(&s->pool, &po);
}

int ferry__scheduler_start(ferry__scheduler **out, const ferry_config *cfg, ferry__window *win)
{
    ferry__scheduler *s = ferry__calloc(1, sizeof *s);
    if (!s)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    s->cfg = *cfg;
    s->win = win;
    s->wake_fd = -1;
    s->nworkers = (uint32_t)ferry__config_slots(cfg);
    s->nlocal = (uint32_t)cfg->workers;
    s->min_workers = (uint32_t)ferry__config_min_workers(cfg);
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

pid_t ferry__scheduler_worker_pid(ferry__scheduler *s, uint32_t i)
{
    return i < s->nlocal ? ferry__pool_pid(s->pool, i) : 0;
}
