/*
 * loader.c - the loader: public API, the scheduler thread, and worker pool
 * supervision.
 *
 * Data flow: the scheduler thread pulls tasks from the sampler while the
 * prefetch window has room, sends each to a ready worker with a free credit,
 * and files the replies in the task table; ferry_loader_next() (the trainer's
 * thread) takes them out in sampler order (or completion order). The
 * scheduler never looks at epoch boundaries, which is why prefetch runs
 * straight across them (unless epoch_barrier asks it to wait, to measure
 * what that costs).
 *
 * Threads and ownership:
 *  - The scheduler thread owns the ROUTER socket, the worker table and every
 *    child process (it spawns them, so PR_SET_PDEATHSIG in the workers is tied
 *    to it, and it lives exactly as long as the loader). It sleeps in
 *    zmq_poll on the socket, an eventfd (the trainer's "a slot is free" and
 *    close's "stop"), and each worker's pidfd, so a worker's death is seen at
 *    once, whatever the trainer is doing.
 *  - The trainer thread calls next(); it only touches the shared part below,
 *    under `mu`.
 *  - Task table entries: free -> PENDING (scheduler, under mu) -> DONE
 *    (scheduler, under mu) -> free (trainer, under mu). Only the scheduler
 *    reads or writes a PENDING entry's fields; only DONE entries are read by
 *    the trainer.
 *
 * Invariant: in_flight (entries in use) <= prefetch; every used entry's seq is
 * in [start_seq, next_seq); delivered + in_flight == next_seq - start_seq.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "batch.h"
#include "clock.h"
#include "config.h"
#include "alloc.h"
#include "error.h"
#include "sampler.h"
#include "process.h"
#include "keys.h"
#include "worker.h"
#include "zap.h"
#include "zsock.h"

#define TICK_MS 100

/* ------------------------------------------------------------------------
 * State
 */

typedef enum wstate {
    W_EMPTY = 0,  /* slot not started */
    W_SPAWNED,    /* process or thread started, no HELLO yet */
    W_CONFIGURED, /* HELLO answered with CONFIG, waiting for READY */
    W_READY,      /* taking tasks */
    W_GONE,       /* said BYE or died; process reaped */
} wstate;

typedef struct wslot {
    int index;
    int remote; /* a slot for workers that connect over tcp:// on their own */
    void *sock; /* the ROUTER it talks through */
    wstate state;
    pid_t pid; /* 0 for a thread */
    int pidfd; /* -1 when none */
    pthread_t thread;
    int thread_live;
    ferry__ident ident;
    uint32_t outstanding;
    uint64_t busy_since_ms; /* when its oldest outstanding task became its current one */
    uint32_t failed_starts; /* deaths in a row without delivering anything */
    int delivered_any;
    int killing;           /* the loader has sent it SIGKILL */
    int unreachable;       /* a send failed: no more tasks until it is replaced */
    uint64_t ready_by_ms;  /* a (re)started worker must be READY by then */
    char kill_reason[256]; /* why the loader killed it, or "" */
    int errfd;             /* read end of its stderr, -1 when none */
    char tail[512];        /* the end of what it wrote to stderr */
    size_t tail_len;
    uint64_t heard_ms; /* remote: when it last said anything */
    uint64_t sent_ms;  /* remote: when it was last sent anything */
    uint32_t rpid;     /* remote: its pid on its host, for messages */
    int death_pending; /* reaped, but its last replies may still be on the way */
    int exit_status;   /* its wait status, while death_pending */
    pid_t dead_pid;
    uint64_t settle_by_ms; /* handle the death by then, replies or not */
    char host[64];         /* remote: its host name, for messages */
} wslot;

typedef enum tstate { T_FREE = 0, T_PENDING, T_DONE } tstate;

typedef struct task_ent {
    tstate state;
    ferry__sampler_task t;
    int worker;        /* -1: PENDING but waiting to be sent again */
    uint32_t attempts; /* workers that died while working on it */
    uint64_t sent_order;
    uint64_t sent_ms;
    uint64_t done_order;
    uint64_t *indices;  /* capacity batch_size, allocated at open */
    ferry_batch *batch; /* DONE and ok */
    int err;            /* DONE and failed: the code */
    char *errmsg;       /* DONE and failed: the sentence */
} task_ent;

typedef enum phase { P_STARTING, P_RUNNING, P_FAILED } phase;

struct ferry_loader {
    ferry_config cfg;
    uint32_t prefetch;
    uint32_t nworkers; /* slots: nlocal local ones, then the remote ones */
    uint32_t nlocal;
    uint32_t min_workers;
    void *zctx;
    void *router;        /* local workers (ipc:// or inproc://) */
    void *remote_router; /* remote workers (tcp://), NULL without bind */
    void *zap;           /* the ZAP handler's socket when CURVE is on */
    ferry__allow allow;
    char bound[FERRY__ENDPOINT_MAX];
    zmq_pollitem_t *items; /* poll_once's scratch, 4 + 2 * nworkers */
    struct wslot **owner;
    int wake_fd;
    char ipc_dir[PATH_MAX];
    char endpoint[PATH_MAX + 32];
    char worker_path[PATH_MAX];
    pthread_t sched;
    int sched_live;
    atomic_int cancel_threads;
    int ctx_leaked;

    /* --- scheduler thread only --- */
    wslot *w;
    uint32_t rr; /* round-robin start for picking workers */
    uint64_t send_counter;
    int closing; /* shutdown has begun: deaths are expected */
    uint64_t start_deadline_ms;
    uint64_t idle_since_ms;  /* running with no ready worker since then; 0 = has some */
    uint32_t deaths_pending; /* local workers reaped, death not yet handled */
    uint64_t rejected_logged;
    ferry__msg in, out; /* message scratch, too big for the stack */

    /* --- shared, under mu --- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    phase ph;
    int stop;
    int fatal_code;
    char fatal_msg[FERRY__ERRMSG_MAX];
    ferry__sampler sampler;
    uint64_t n;
    uint64_t start_seq;
    uint64_t next_seq;
    uint64_t done_counter;
    uint64_t asked; /* next() calls so far: the trainer wants batch asked-1 */
    uint32_t in_flight;
    task_ent *tasks;
    ferry_stats st;
};

static void wake(ferry_loader *ld)
{
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(ld->wake_fd, &one, sizeof one);
    while (r < 0 && errno == EINTR);
}

/* Marks the loader failed with `code` and the current thread's error detail
 * (or `msg`), unless it already failed: the first cause is the one reported.
 * Caller holds mu. */
static void fail_locked(ferry_loader *ld, int code, const char *msg)
{
    if (ld->ph == P_FAILED)
        return;
    ld->ph = P_FAILED;
    ld->fatal_code = code;
    snprintf(ld->fatal_msg, sizeof ld->fatal_msg, "%s", msg ? msg : ferry_last_error());
    pthread_cond_broadcast(&ld->cv);
}

static void fail(ferry_loader *ld, int code, const char *msg)
{
    pthread_mutex_lock(&ld->mu);
    fail_locked(ld, code, msg);
    pthread_mutex_unlock(&ld->mu);
}

static void describe_worker(const ferry_loader *ld, const wslot *w, char *buf, size_t cap)
{
    (void)ld;
    if (w->remote)
        snprintf(buf, cap, "remote worker %d (%s, pid %u)", w->index, w->host, w->rpid);
    else if (w->pid)
        snprintf(buf, cap, "worker %d (pid %d)", w->index, (int)w->pid);
    else
        snprintf(buf, cap, "worker %d (thread)", w->index);
}

/* ------------------------------------------------------------------------
 * Starting workers
 */

static void *thread_worker_main(void *arg);

typedef struct thread_arg {
    ferry_loader *ld;
    int slot;
} thread_arg;

static void set_pid(ferry_loader *ld, wslot *w, pid_t pid)
{
    pthread_mutex_lock(&ld->mu);
    w->pid = pid;
    pthread_mutex_unlock(&ld->mu);
}

static int start_worker(ferry_loader *ld, wslot *w)
{
    w->ident.len = 0;
    w->outstanding = 0;
    w->killing = 0;
    w->unreachable = 0;
    w->ready_by_ms = ferry__now_ms() + (uint64_t)ld->cfg.start_timeout_ms;
    w->kill_reason[0] = '\0';
    w->tail_len = 0;
    /* A process worker holds a pidfd and a stderr pipe, and its connection
     * an accepted socket; a thread worker a socket pair and a mailbox. Four
     * beyond that are left for the trainer. */
    char what[48];
    snprintf(what, sizeof what, "starting worker %d", w->index);
    int rc = ferry__fd_headroom(8, what);
    if (rc != FERRY_OK)
        return rc;
    if (ld->cfg.worker_mode == FERRY__PLACE_THREAD) {
        thread_arg *a = ferry__malloc(sizeof *a);
        if (!a)
            return ferry__seterr(FERRY_ENOMEM, "out of memory starting worker %d", w->index);
        a->ld = ld;
        a->slot = w->index;
        int e = pthread_create(&w->thread, NULL, thread_worker_main, a);
        if (e) {
            free(a);
            return ferry__syserr(FERRY_ESPAWN, "could not start a worker thread", e);
        }
        w->thread_live = 1;
    } else {
        pid_t pid;
        rc = ferry__spawn_worker(ld->worker_path, ld->endpoint, w->index, &pid, &w->pidfd,
                                 &w->errfd);
        if (rc != FERRY_OK)
            return rc;
        set_pid(ld, w, pid);
    }
    w->state = W_SPAWNED;
    return FERRY_OK;
}

static void *thread_worker_main(void *arg)
{
    thread_arg a = *(thread_arg *)arg;
    free(arg);
    ferry__worker_opts o = {.endpoint = a.ld->endpoint,
                            .slot = a.slot,
                            .zctx = a.ld->zctx,
                            .cancel = &a.ld->cancel_threads,
                            .handshake_ms = (int)a.ld->cfg.start_timeout_ms};
    int rc = ferry__worker_run(&o);
    if (rc != FERRY_OK && !atomic_load(&a.ld->cancel_threads)) {
        /* A thread cannot be replaced like a process: the loader fails (and
         * an open in progress returns at once instead of timing out). */
        char msg[FERRY__ERRMSG_MAX];
        snprintf(msg, sizeof msg, "worker %d (thread) stopped: %s", a.slot, ferry_last_error());
        fail(a.ld, rc, msg);
        wake(a.ld);
    }
    return NULL;
}

/* ------------------------------------------------------------------------
 * Dispatch
 */

static void lose_remote(ferry_loader *ld, wslot *w, const char *why, int charge);

static wslot *pick_worker(ferry_loader *ld)
{
    wslot *best = NULL;
    for (uint32_t k = 0; k < ld->nworkers; k++) {
        wslot *w = &ld->w[(ld->rr + k) % ld->nworkers];
        if (w->state == W_READY && !w->unreachable && w->outstanding < (uint32_t)ld->cfg.credits &&
            (!best || w->outstanding < best->outstanding))
            best = w;
    }
    if (best)
        ld->rr = (uint32_t)(best->index + 1) % ld->nworkers;
    return best;
}

/* The lowest-seq task waiting to be sent again after its worker died. */
static task_ent *requeued_entry(ferry_loader *ld)
{
    task_ent *best = NULL;
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        task_ent *e = &ld->tasks[i];
        if (e->state == T_PENDING && e->worker < 0 && (!best || e->t.seq < best->t.seq))
            best = e;
    }
    return best;
}

static task_ent *free_entry(ferry_loader *ld)
{
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        if (ld->tasks[i].state == T_FREE)
            return &ld->tasks[i];
    }
    return NULL;
}

/* Sends entry e's task to worker w. */
static int send_task(ferry_loader *ld, task_ent *e, wslot *w)
{
    zmq_msg_t p;
    size_t n = e->t.count;
    if (zmq_msg_init_size(&p, n * 8) != 0)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a task");
    ferry__indices_pack(e->indices, n, zmq_msg_data(&p));
    ld->out.type = FERRY__MSG_TASK;
    ld->out.u.task = (ferry__task){.id = e->t.seq,
                                   .epoch = e->t.epoch,
                                   .batch_in_epoch = e->t.batch_in_epoch,
                                   .seq = e->t.seq,
                                   .count = e->t.count};
    int rc = ferry__zsock_send(w->sock, &w->ident, &ld->out, &p, ZMQ_DONTWAIT);
    if (rc != FERRY_OK) {
        zmq_msg_close(&p);
        return rc;
    }
    e->worker = w->index;
    e->sent_ms = w->sent_ms = ferry__now_ms();
    e->sent_order = ld->send_counter++;
    if (w->outstanding++ == 0)
        w->busy_since_ms = e->sent_ms;
    return FERRY_OK;
}

/* A task could not be sent to w. For a local process that means it has just
 * gone away and its pidfd has not said so yet: the task stays queued, w
 * takes no more work, and the death (with its exit status, under either
 * policy) is handled when the pidfd fires. A remote worker whose connection
 * is gone is given up at once. Returns 1 to go on dispatching. Anything else
 * fails the loader. */
static int send_failed(ferry_loader *ld, wslot *w)
{
    if (w->pid) {
        w->unreachable = 1;
        return 1;
    }
    if (w->remote) {
        char why[128];
        snprintf(why, sizeof why, "its connection is gone (%s)", ferry_last_error());
        /* Charged: a remote process that crashed on a batch looks just like
         * this, and a poison batch must still be given up. */
        lose_remote(ld, w, why, 1);
        return 1;
    }
    char who[64], msg[FERRY__ERRMSG_MAX];
    describe_worker(ld, w, who, sizeof who);
    snprintf(msg, sizeof msg, "could not send a task to %s: %s", who, ferry_last_error());
    fail(ld, FERRY_EWORKER, msg);
    return 0;
}

/* Fills the window: tasks whose worker died go out again first; then,
 * while there is room, a task left and a worker with a free credit, take
 * the next task and send it. */
static void dispatch(ferry_loader *ld)
{
    for (;;) {
        pthread_mutex_lock(&ld->mu);
        if (ld->ph != P_RUNNING || ld->stop) {
            pthread_mutex_unlock(&ld->mu);
            return;
        }
        task_ent *again = requeued_entry(ld);
        if (again) {
            wslot *w = pick_worker(ld);
            pthread_mutex_unlock(&ld->mu);
            if (!w)
                return;
            if (send_task(ld, again, w) != FERRY_OK && !send_failed(ld, w))
                return;
            continue;
        }
        if (ld->in_flight >= ld->prefetch) {
            pthread_mutex_unlock(&ld->mu);
            return;
        }
        ferry__sampler_task t;
        if (ferry__sampler_at(&ld->sampler, ld->next_seq, &t) != FERRY_OK) {
            pthread_mutex_unlock(&ld->mu);
            return;
        }
        /* The barrier (PyTorch's behaviour, for comparison): an epoch's first
         * batch is not started until the trainer asks for it, i.e. until it
         * has finished with the whole previous epoch. */
        if (ld->cfg.epoch_barrier && t.batch_in_epoch == 0 &&
            ld->asked < t.seq - ld->start_seq + 1) {
            pthread_mutex_unlock(&ld->mu);
            return;
        }
        wslot *w = pick_worker(ld);
        task_ent *e = w ? free_entry(ld) : NULL;
        if (!e) {
            pthread_mutex_unlock(&ld->mu);
            return;
        }
        e->state = T_PENDING;
        e->t = t;
        e->worker = -1; /* until the send succeeds */
        e->attempts = 0;
        ld->in_flight++;
        ld->next_seq++;
        ld->st.dispatched++;
        pthread_mutex_unlock(&ld->mu);

        ferry__sampler_indices(&ld->sampler, &t, e->indices);
        if (send_task(ld, e, w) != FERRY_OK && !send_failed(ld, w))
            return;
    }
}

/* ------------------------------------------------------------------------
 * Messages from workers
 */

static wslot *find_by_ident(ferry_loader *ld, void *sock, const ferry__ident *id)
{
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        if (w->sock == sock && w->ident.len == id->len && w->state != W_GONE &&
            w->state != W_EMPTY && memcmp(w->ident.id, id->id, id->len) == 0)
            return w;
    }
    return NULL;
}

static void count_malformed(ferry_loader *ld)
{
    pthread_mutex_lock(&ld->mu);
    ld->st.malformed++;
    pthread_mutex_unlock(&ld->mu);
}

/* A well-formed reply nobody is waiting for: from a worker given up on, or
 * for a task already re-sent elsewhere. Dropped, so nothing is delivered
 * twice. */
static void count_stale(ferry_loader *ld)
{
    pthread_mutex_lock(&ld->mu);
    ld->st.stale++;
    pthread_mutex_unlock(&ld->mu);
}

/* A remote worker refused: counted, said so (the first few times, then
 * every hundredth: a misconfigured host retries forever), and sent STOP so
 * it backs off instead of waiting for a CONFIG that will not come. */
static void reject_remote(ferry_loader *ld, void *sock, const ferry__ident *id, const char *why)
{
    pthread_mutex_lock(&ld->mu);
    uint64_t n = ++ld->st.rejected;
    pthread_mutex_unlock(&ld->mu);
    if (n <= 10 || n % 100 == 0)
        fprintf(stderr, "ferry: refused a remote worker (%llu refused so far): %s\n",
                (unsigned long long)n, why);
    if (sock && id) {
        ld->out.type = FERRY__MSG_STOP;
        ferry__zsock_send(sock, id, &ld->out, NULL, ZMQ_DONTWAIT);
    }
}

/* Sends CONFIG (or, while closing, STOP) to a worker that said HELLO. */
static void configure(ferry_loader *ld, wslot *w)
{
    if (ld->closing) {
        /* It started just before close: no dataset to open, just go. */
        ld->out.type = FERRY__MSG_STOP;
        ferry__zsock_send(w->sock, &w->ident, &ld->out, NULL, ZMQ_DONTWAIT);
        w->state = W_CONFIGURED;
        return;
    }
    ferry__config_msg *c = &ld->out.u.config;
    memset(c, 0, sizeof *c);
    ld->out.type = FERRY__MSG_CONFIG;
    snprintf(c->dataset, sizeof c->dataset, "%s", ld->cfg.dataset);
    c->worker_index = (uint32_t)w->index;
    c->num_workers = ld->nworkers;
    c->seed = (uint64_t)ld->cfg.seed;
    c->credits = (uint32_t)ld->cfg.credits;
    /* Local workers are watched through their pidfds (or are threads). */
    c->heartbeat_ms = w->remote ? (uint32_t)ld->cfg.heartbeat_ms : 0;
    c->liveness = (uint32_t)ld->cfg.heartbeat_liveness;
    if (ferry__zsock_send(w->sock, &w->ident, &ld->out, NULL, ZMQ_DONTWAIT) == FERRY_OK) {
        w->state = W_CONFIGURED;
        w->sent_ms = ferry__now_ms();
    }
}

static void on_hello_remote(ferry_loader *ld, const ferry__ident *id)
{
    const ferry__hello *h = &ld->in.u.hello;
    char why[FERRY__ERRMSG_MAX];
    if (h->version != FERRY_PROTOCOL_VERSION || h->slot != -1) {
        snprintf(why, sizeof why, "HELLO from %s (pid %u) with protocol version %u, slot %d",
                 h->host, h->pid, h->version, h->slot);
        reject_remote(ld, ld->remote_router, id, why);
        return;
    }
    wslot *w = find_by_ident(ld, ld->remote_router, id);
    if (w) {
        /* A second HELLO on one connection: a new session; the old one ends. */
        lose_remote(ld, w, "it started a new session", 0);
    }
    for (uint32_t i = ld->nlocal; i < ld->nworkers && !w; i++) {
        if (ld->w[i].state == W_EMPTY || ld->w[i].state == W_GONE)
            w = &ld->w[i];
    }
    if (!w) {
        snprintf(why, sizeof why, "%s (pid %u): all %lld remote slots are taken (max_remote)",
                 h->host, h->pid, (long long)ld->cfg.max_remote);
        reject_remote(ld, ld->remote_router, id, why);
        return;
    }
    w->ident = *id;
    w->outstanding = 0;
    w->unreachable = 0;
    w->delivered_any = 0;
    w->rpid = h->pid;
    snprintf(w->host, sizeof w->host, "%s", h->host);
    w->heard_ms = ferry__now_ms();
    configure(ld, w);
}

static void on_hello(ferry_loader *ld, void *sock, const ferry__ident *id)
{
    if (sock == ld->remote_router) {
        on_hello_remote(ld, id);
        return;
    }
    const ferry__hello *h = &ld->in.u.hello;
    if (h->version != FERRY_PROTOCOL_VERSION || h->slot < 0 || (uint32_t)h->slot >= ld->nlocal) {
        fprintf(stderr, "ferry: refused HELLO (protocol version %u, slot %d) from %s\n", h->version,
                h->slot, h->host);
        count_malformed(ld);
        return;
    }
    wslot *w = &ld->w[h->slot];
    pid_t expect = w->pid ? w->pid : getpid();
    if (w->state != W_SPAWNED || (pid_t)h->pid != expect) {
        count_malformed(ld);
        return;
    }
    w->ident = *id;
    configure(ld, w);
}

/* Once every worker is ready: the dataset length is known, so the sampler
 * can be built (and the resume state checked against it). */
static void all_ready_locked(ferry_loader *ld)
{
    ferry__sampler_opts so = {
        .batch_size = (uint64_t)ld->cfg.batch_size,
        .drop_last = (int)ld->cfg.drop_last,
        .shuffle = ld->cfg.shuffle < 0 ? (int)ld->cfg.seed_set : (int)ld->cfg.shuffle,
        .seed = (uint64_t)ld->cfg.seed,
        .rank = (uint32_t)ld->cfg.rank,
        .world_size = (uint32_t)ld->cfg.world_size,
        .epochs = (uint64_t)ld->cfg.epochs,
        .max_batches = (uint64_t)ld->cfg.max_batches,
    };
    int rc = ferry__sampler_init(&ld->sampler, ld->n, &so);
    if (rc == FERRY_OK && ld->cfg.state_len)
        rc = ferry__sampler_restore(&ld->sampler, ld->cfg.state, ld->cfg.state_len, &ld->start_seq);
    if (rc != FERRY_OK) {
        fail_locked(ld, rc, NULL);
        return;
    }
    ld->next_seq = ld->start_seq;
    ld->ph = P_RUNNING;
    pthread_cond_broadcast(&ld->cv);
}

/* Open returns once every local worker and at least min_workers in all
 * are ready. Caller holds mu. */
static void maybe_start_locked(ferry_loader *ld)
{
    if (ld->ph != P_STARTING || ld->st.workers < ld->min_workers)
        return;
    for (uint32_t i = 0; i < ld->nlocal; i++) {
        if (ld->w[i].state != W_READY)
            return;
    }
    all_ready_locked(ld);
}

static void on_ready(ferry_loader *ld, wslot *w)
{
    const ferry__ready *r = &ld->in.u.ready;
    char who[96], msg[FERRY__ERRMSG_MAX];
    describe_worker(ld, w, who, sizeof who);
    if (w->state != W_CONFIGURED) {
        count_malformed(ld);
        return;
    }
    pthread_mutex_lock(&ld->mu);
    if (r->code != 0) {
        snprintf(msg, sizeof msg, "%s could not open dataset '%s': %s", who, ld->cfg.dataset,
                 r->error);
    } else if (ld->n && r->length != ld->n) {
        snprintf(msg, sizeof msg, "%s sees %llu items in dataset '%s', others see %llu", who,
                 (unsigned long long)r->length, ld->cfg.dataset, (unsigned long long)ld->n);
    } else {
        msg[0] = '\0';
        ld->n = r->length;
        w->state = W_READY;
        ld->st.workers++;
        ld->idle_since_ms = 0;
        if (w->remote) {
            ld->st.joined++;
            if (ld->ph == P_RUNNING)
                fprintf(stderr, "ferry: %s joined\n", who);
        }
        maybe_start_locked(ld);
    }
    pthread_mutex_unlock(&ld->mu);
    if (!msg[0])
        return;
    if (!w->remote) {
        fail(ld, r->code != 0 ? r->code : FERRY_EMISMATCH, msg);
        return;
    }
    /* A remote host with the wrong data must not take the run down. */
    reject_remote(ld, w->sock, &w->ident, msg);
    w->state = W_EMPTY;
}

/* The PENDING entry for task `id` if worker w owns it: a reply for anything
 * else (a task given up on, or one that was never sent) is dropped. */
static task_ent *owned_task(ferry_loader *ld, wslot *w, uint64_t id)
{
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        task_ent *e = &ld->tasks[i];
        if (e->state == T_PENDING && e->t.seq == id && e->worker == w->index)
            return e;
    }
    return NULL;
}

/* Files entry e as done. w: the worker that answered, NULL when the loader
 * gave the batch up itself. */
static void complete_locked(ferry_loader *ld, task_ent *e, wslot *w)
{
    e->state = T_DONE;
    e->done_order = ld->done_counter++;
    ld->st.completed++;
    if (w) {
        w->delivered_any = 1;
        w->failed_starts = 0;
        if (w->outstanding && --w->outstanding)
            w->busy_since_ms = ferry__now_ms();
    }
    pthread_cond_broadcast(&ld->cv);
}

static void on_batch(ferry_loader *ld, wslot *w, zmq_msg_t *payload)
{
    const ferry__batch_hdr *h = &ld->in.u.batch;
    task_ent *e = owned_task(ld, w, h->id);
    if (!e || h->count != e->t.count) {
        count_stale(ld);
        return;
    }
    ferry_batch_info info = {.epoch = e->t.epoch,
                             .batch_in_epoch = e->t.batch_in_epoch,
                             .seq = e->t.seq,
                             .size = e->t.count,
                             .last_in_epoch = e->t.last_in_epoch,
                             .worker = (uint32_t)w->index};
    ferry_batch *b = NULL;
    int rc = ferry__batch_new(&b, h, payload, &info, e->indices);
    pthread_mutex_lock(&ld->mu);
    if (rc != FERRY_OK) {
        fail_locked(ld, FERRY_ENOMEM, "out of memory receiving a batch");
    } else {
        e->batch = b;
        ld->st.realigned += (uint64_t)b->realigned;
        complete_locked(ld, e, w);
    }
    pthread_mutex_unlock(&ld->mu);
}

static void on_fail(ferry_loader *ld, wslot *w)
{
    const ferry__fail *f = &ld->in.u.fail;
    task_ent *e = owned_task(ld, w, f->id);
    if (!e) {
        count_stale(ld);
        return;
    }
    char who[64];
    describe_worker(ld, w, who, sizeof who);
    char *msg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (msg)
        snprintf(msg, FERRY__ERRMSG_MAX, "%s failed on index %llu (epoch %llu, batch %llu): %s",
                 who, (unsigned long long)f->index, (unsigned long long)e->t.epoch,
                 (unsigned long long)e->t.batch_in_epoch, f->message);
    pthread_mutex_lock(&ld->mu);
    e->err = f->code == FERRY_ERANGE ? FERRY_ERANGE : FERRY_EBATCH;
    e->errmsg = msg;
    complete_locked(ld, e, w);
    pthread_mutex_unlock(&ld->mu);
}

static void on_message(ferry_loader *ld, void *sock, const ferry__ident *id, zmq_msg_t *payload)
{
    if (ld->in.type == FERRY__MSG_HELLO) {
        on_hello(ld, sock, id);
        return;
    }
    wslot *w = find_by_ident(ld, sock, id);
    if (!w) {
        count_stale(ld);
        return;
    }
    w->heard_ms = ferry__now_ms();
    switch (ld->in.type) {
    case FERRY__MSG_READY:
        on_ready(ld, w);
        break;
    case FERRY__MSG_BATCH:
        if (w->state == W_READY)
            on_batch(ld, w, payload);
        else
            count_malformed(ld);
        break;
    case FERRY__MSG_FAIL:
        if (w->state == W_READY)
            on_fail(ld, w);
        else
            count_malformed(ld);
        break;
    case FERRY__MSG_BYE:
        if (w->remote && !ld->closing)
            lose_remote(ld, w, "it said BYE", 0);
        else
            w->state = W_GONE;
        break;
    case FERRY__MSG_HEARTBEAT:
        break;
    default:
        count_malformed(ld);
        break;
    }
}

/* Reads what is waiting on the socket, at most `budget` messages so the
 * loop also gets round to dispatching and to the pidfds. */
static void drain_socket(ferry_loader *ld, void *sock, int budget)
{
    while (budget-- > 0) {
        ferry__ident id;
        zmq_msg_t payload;
        int rc = ferry__zsock_recv(sock, &id, &ld->in, &payload, ZMQ_DONTWAIT);
        if (rc == FERRY_EPROTO) {
            count_malformed(ld);
            continue;
        }
        if (rc != FERRY_OK)
            return; /* EAGAIN: nothing more */
        on_message(ld, sock, &id, &payload);
        zmq_msg_close(&payload);
    }
}

/* ------------------------------------------------------------------------
 * Supervision
 */

/* Passes whatever worker w wrote to stderr on to ours, keeping the end of it
 * for the message if the worker dies. */
static void pump_stderr(wslot *w)
{
    char buf[4096];
    for (;;) {
        ssize_t n = read(w->errfd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        ssize_t off = 0;
        while (off < n) {
            ssize_t m = write(STDERR_FILENO, buf + off, (size_t)(n - off));
            if (m <= 0)
                break;
            off += m;
        }
        size_t keep = sizeof w->tail - 1;
        size_t add = (size_t)n > keep ? keep : (size_t)n;
        if (w->tail_len + add > keep) {
            size_t drop = w->tail_len + add - keep;
            memmove(w->tail, w->tail + drop, w->tail_len - drop);
            w->tail_len -= drop;
        }
        memcpy(w->tail + w->tail_len, buf + n - add, add);
        w->tail_len += add;
    }
}

/* The last few lines the worker wrote (at most 3, joined with " | "), or "":
 * typically the dataset's own message, then the crash handler's note. */
static void last_words(const wslot *w, char *out, size_t cap)
{
    size_t end = w->tail_len, start = end;
    int lines = 0;
    while (start > 0 && lines < 3) {
        while (end > 0 && (w->tail[end - 1] == '\n' || w->tail[end - 1] == '\r'))
            end--;
        start = end;
        while (start > 0 && w->tail[start - 1] != '\n')
            start--;
        if (end > start)
            lines++;
        if (lines < 3 && start > 0)
            end = start;
    }
    size_t o = 0;
    for (size_t i = start; i < w->tail_len && o + 4 < cap; i++) {
        char c = w->tail[i];
        if (c == '\r')
            continue;
        if (c == '\n') {
            if (o > 0 && i + 1 < w->tail_len) {
                memcpy(out + o, " | ", 3);
                o += 3;
            }
            continue;
        }
        out[o++] = c;
    }
    while (o >= 3 && memcmp(out + o - 3, " | ", 3) == 0)
        o -= 3;
    out[o] = '\0';
}

/* Reaps worker w's process if it has exited; returns 1 if it did, with the
 * wait status in *status. */
static int reap(ferry_loader *ld, wslot *w, int *status)
{
    if (!w->pid)
        return 0;
    pid_t r;
    do
        r = waitpid(w->pid, status, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r != w->pid)
        return 0;
    close(w->pidfd);
    w->pidfd = -1;
    if (w->errfd >= 0) {
        pump_stderr(w);
        close(w->errfd);
        w->errfd = -1;
    }
    set_pid(ld, w, 0);
    return 1;
}

static void describe_indices(const task_ent *e, char *buf, size_t cap)
{
    size_t off = 0;
    uint32_t shown = e->t.count < 8 ? e->t.count : 8;
    for (uint32_t i = 0; i < shown && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%llu", i ? ", " : "",
                                (unsigned long long)e->indices[i]);
    if (shown < e->t.count && off < cap)
        snprintf(buf + off, cap - off, ", ... (%u in all)", e->t.count);
}

/* A worker died or was given up on: its tasks go back to the queue. The one
 * it was working on (its oldest) is charged an attempt, and once a batch has
 * taken down max_attempts workers it is given up as poison and reported, so
 * the run goes on without it. The others were only queued behind it and go
 * out again free of charge; so do all of them when `charge` is 0 (a remote
 * worker that said BYE). Caller holds mu. */
static void requeue_locked(ferry_loader *ld, wslot *w, const char *death, int charge)
{
    task_ent *oldest = NULL;
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        task_ent *e = &ld->tasks[i];
        if (e->state != T_PENDING || e->worker != w->index)
            continue;
        e->worker = -1;
        if (!oldest || e->sent_order < oldest->sent_order)
            oldest = e;
    }
    w->outstanding = 0;
    if (!charge || !oldest || ++oldest->attempts < (uint32_t)ld->cfg.max_attempts)
        return;
    char idx[256];
    describe_indices(oldest, idx, sizeof idx);
    oldest->errmsg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (oldest->errmsg)
        snprintf(oldest->errmsg, FERRY__ERRMSG_MAX,
                 "batch %llu (epoch %llu, batch %llu; indices %s) was given up after %u "
                 "workers died on it; the last: %s",
                 (unsigned long long)oldest->t.seq, (unsigned long long)oldest->t.epoch,
                 (unsigned long long)oldest->t.batch_in_epoch, idx, oldest->attempts, death);
    oldest->err = FERRY_EBATCH;
    complete_locked(ld, oldest, NULL);
}

/* A worker process has died: its death is handled (tasks requeued, the one
 * it was on charged an attempt) only once every reply it sent before dying
 * has been read, or the charge would fall on a batch it had already
 * answered. The reaped process's connection is probed: while ZeroMQ still
 * routes to it, its pipe (and maybe a reply) is still draining; once the
 * send fails with EHOSTUNREACH, the pipe has ended after its last message.
 * Bounded at 500 ms. */
static void handle_death(ferry_loader *ld, wslot *w);

static void on_worker_exit(ferry_loader *ld, wslot *w)
{
    int status;
    pid_t pid = w->pid;
    if (!reap(ld, w, &status))
        return;
    w->exit_status = status;
    w->dead_pid = pid;
    w->unreachable = 1; /* no task goes to it meanwhile */
    w->death_pending = 1;
    w->settle_by_ms = ferry__now_ms() + 500;
    ld->deaths_pending++;
}

static void settle_death(ferry_loader *ld, wslot *w)
{
    if (!w->death_pending)
        return;
    if (!ld->closing && w->ident.len && ferry__now_ms() < w->settle_by_ms) {
        ld->out.type = FERRY__MSG_HEARTBEAT;
        if (ferry__zsock_send(w->sock, &w->ident, &ld->out, NULL, ZMQ_DONTWAIT) == FERRY_OK ||
            errno != EHOSTUNREACH)
            return;
    }
    w->death_pending = 0;
    ld->deaths_pending--;
    handle_death(ld, w);
}

static void handle_death(ferry_loader *ld, wslot *w)
{
    int status = w->exit_status;
    pid_t pid = w->dead_pid;
    wstate was = w->state;
    w->state = W_GONE;
    if (ld->closing)
        return;

    char how[256], words[512], msg[FERRY__ERRMSG_MAX];
    ferry__describe_status(status, how, sizeof how);
    last_words(w, words, sizeof words);
    snprintf(msg, sizeof msg, "worker %d (pid %d) %s%s%s%s%s%s", w->index, (int)pid, how,
             was == W_SPAWNED || was == W_CONFIGURED ? " while starting" : "",
             w->kill_reason[0] ? ", killed by ferry because " : "", w->kill_reason,
             words[0] ? "; its last words: " : "", words);

    pthread_mutex_lock(&ld->mu);
    if (was == W_READY && ld->st.workers)
        ld->st.workers--;
    if (ld->ph != P_RUNNING || ld->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL) {
        fail_locked(ld, FERRY_EWORKER, msg);
        pthread_mutex_unlock(&ld->mu);
        return;
    }
    requeue_locked(ld, w, msg, 1);
    if (!w->delivered_any && ++w->failed_starts > (uint32_t)ld->cfg.max_attempts + 2) {
        char m2[FERRY__ERRMSG_MAX];
        snprintf(m2, sizeof m2,
                 "worker %d died %u times in a row without delivering a batch; "
                 "the last: %s",
                 w->index, w->failed_starts, msg);
        fail_locked(ld, FERRY_EWORKER, m2);
        pthread_mutex_unlock(&ld->mu);
        return;
    }
    ld->st.restarts++;
    pthread_mutex_unlock(&ld->mu);

    fprintf(stderr, "ferry: %s; starting a replacement\n", msg);
    w->delivered_any = 0;
    int rc = start_worker(ld, w);
    if (rc != FERRY_OK)
        fail(ld, rc, NULL);
}

/* A remote worker is given up: gone silent past heartbeat_ms x liveness (a
 * cut link, a frozen host, a stopped process), unreachable, or it said BYE.
 * Its tasks go to the others, exactly like a dead local worker's (the batch
 * it was on is charged an attempt unless it said BYE: silence or a dropped
 * connection may be a crash on that batch); its
 * slot is free for the next remote worker, and anything it sends later is
 * dropped as stale (its routing id is no longer known). */
static void lose_remote(ferry_loader *ld, wslot *w, const char *why, int charge)
{
    char who[96], msg[FERRY__ERRMSG_MAX];
    describe_worker(ld, w, who, sizeof who);
    snprintf(msg, sizeof msg, "%s left: %s", who, why);
    wstate was = w->state;
    w->state = W_EMPTY;
    w->ident.len = 0;
    pthread_mutex_lock(&ld->mu);
    if (was == W_READY && ld->st.workers)
        ld->st.workers--;
    if (was == W_READY)
        ld->st.lost++;
    requeue_locked(ld, w, msg, charge);
    if (charge && was == W_READY && ld->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL)
        fail_locked(ld, FERRY_EWORKER, msg);
    pthread_mutex_unlock(&ld->mu);
    if (was == W_READY && !ld->closing)
        fprintf(stderr, "ferry: %s\n", msg);
}

/* Remote liveness, both ways: a HEARTBEAT to each remote worker that has
 * been sent nothing for heartbeat_ms, and the loss of any that has said
 * nothing for heartbeat_ms x liveness. */
static void check_remote(ferry_loader *ld, uint64_t now)
{
    uint64_t hb = (uint64_t)ld->cfg.heartbeat_ms;
    uint64_t dead_after = hb * (uint64_t)ld->cfg.heartbeat_liveness;
    for (uint32_t i = ld->nlocal; i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        if (w->state != W_CONFIGURED && w->state != W_READY)
            continue;
        if (now - w->heard_ms >= dead_after) {
            char why[128];
            snprintf(why, sizeof why,
                     "nothing heard from it for %llu ms (heartbeat_ms %lld x %lld)",
                     (unsigned long long)(now - w->heard_ms), (long long)hb,
                     (long long)ld->cfg.heartbeat_liveness);
            lose_remote(ld, w, why, 1);
            continue;
        }
        if (now - w->sent_ms >= hb) {
            ld->out.type = FERRY__MSG_HEARTBEAT;
            if (ferry__zsock_send(w->sock, &w->ident, &ld->out, NULL, ZMQ_DONTWAIT) == FERRY_OK)
                w->sent_ms = now;
            else
                lose_remote(ld, w, "its connection is gone", 1);
        }
    }
}

/* A worker past timeout_ms on its current task: under restart (process
 * workers) it is killed, and its death requeues the task; otherwise the
 * loader fails with a timeout naming the worker and the task. */
static void on_timeout_locked(ferry_loader *ld, wslot *w, uint64_t now)
{
    task_ent *cur = NULL;
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        task_ent *e = &ld->tasks[i];
        if (e->state == T_PENDING && e->worker == w->index &&
            (!cur || e->sent_order < cur->sent_order))
            cur = e;
    }
    if (!cur)
        return;
    char who[64];
    describe_worker(ld, w, who, sizeof who);
    ld->st.timeouts++;
    snprintf(w->kill_reason, sizeof w->kill_reason,
             "it spent %llu ms on batch %llu (epoch %llu, batch %llu), past timeout_ms %lld",
             (unsigned long long)(now - w->busy_since_ms), (unsigned long long)cur->t.seq,
             (unsigned long long)cur->t.epoch, (unsigned long long)cur->t.batch_in_epoch,
             (long long)ld->cfg.timeout_ms);
    if (ld->cfg.on_worker_failure == FERRY__ON_FAILURE_RESTART && w->pidfd >= 0) {
        w->killing = 1;
        pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
        return;
    }
    char msg[FERRY__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s timed out: %s", who, w->kill_reason);
    fail_locked(ld, FERRY_ETIMEDOUT, msg);
}

static void check_deadlines(ferry_loader *ld)
{
    uint64_t now = ferry__now_ms();
    pthread_mutex_lock(&ld->mu);
    if (ld->ph == P_STARTING && now >= ld->start_deadline_ms) {
        char msg[512];
        uint32_t local_ready = 0;
        for (uint32_t i = 0; i < ld->nlocal; i++)
            local_ready += ld->w[i].state == W_READY;
        if (ld->remote_router)
            snprintf(msg, sizeof msg,
                     "only %u workers were ready after %lld ms (%u of %u local, %u remote on %s); "
                     "open waits for every local worker and min_workers %u in all",
                     ld->st.workers, (long long)ld->cfg.start_timeout_ms, local_ready, ld->nlocal,
                     ld->st.workers - local_ready, ld->bound, ld->min_workers);
        else
            snprintf(msg, sizeof msg, "only %u of %u workers were ready after %lld ms",
                     ld->st.workers, ld->nworkers, (long long)ld->cfg.start_timeout_ms);
        fail_locked(ld, FERRY_ETIMEDOUT, msg);
    }
    /* With no worker at all (every remote host gone, and no local ones,
     * which are replaced under their own limits), next() would wait forever:
     * after start_timeout_ms of that the loader fails. */
    if (ld->ph == P_RUNNING && ld->nlocal == 0 && ld->st.workers == 0) {
        if (!ld->idle_since_ms)
            ld->idle_since_ms = now;
        else if (now - ld->idle_since_ms >= (uint64_t)ld->cfg.start_timeout_ms) {
            char msg[256];
            snprintf(msg, sizeof msg, "no worker has been ready for %llu ms (start_timeout_ms)",
                     (unsigned long long)(now - ld->idle_since_ms));
            fail_locked(ld, FERRY_ETIMEDOUT, msg);
        }
    }
    if (ld->ph == P_RUNNING) {
        /* A replacement that does not get ready (stopped, stuck opening the
         * dataset) is killed; its death counts as a failed start. */
        for (uint32_t i = 0; i < ld->nworkers; i++) {
            wslot *w = &ld->w[i];
            if ((w->state == W_SPAWNED || w->state == W_CONFIGURED) && !w->killing &&
                w->pidfd >= 0 && now >= w->ready_by_ms) {
                snprintf(w->kill_reason, sizeof w->kill_reason,
                         "it was not ready within start_timeout_ms %lld",
                         (long long)ld->cfg.start_timeout_ms);
                w->killing = 1;
                pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
            }
        }
    }
    if (ld->ph == P_RUNNING && ld->cfg.timeout_ms > 0) {
        for (uint32_t i = 0; i < ld->nworkers; i++) {
            wslot *w = &ld->w[i];
            if (w->state == W_READY && w->outstanding && !w->killing && !w->remote &&
                !w->death_pending && now - w->busy_since_ms >= (uint64_t)ld->cfg.timeout_ms)
                on_timeout_locked(ld, w, now);
        }
    }
    int running = ld->ph == P_RUNNING || ld->ph == P_STARTING;
    pthread_mutex_unlock(&ld->mu);
    if (!ld->remote_router || !running)
        return;
    check_remote(ld, now);
    /* A remote worker past timeout_ms cannot be killed from here: it is
     * given up (its tasks requeued, a late answer dropped as stale). */
    for (uint32_t i = ld->nlocal; ld->cfg.timeout_ms > 0 && i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        if (w->state == W_READY && w->outstanding &&
            now - w->busy_since_ms >= (uint64_t)ld->cfg.timeout_ms) {
            char why[160];
            snprintf(why, sizeof why, "it spent %llu ms on one batch, past timeout_ms %lld",
                     (unsigned long long)(now - w->busy_since_ms), (long long)ld->cfg.timeout_ms);
            pthread_mutex_lock(&ld->mu);
            ld->st.timeouts++;
            pthread_mutex_unlock(&ld->mu);
            lose_remote(ld, w, why, 1);
        }
    }
}

static void serve_zap(ferry_loader *ld)
{
    char why[256];
    for (int k = 0; k < 16; k++) {
        int r = ferry__zap_serve(ld->zap, &ld->allow, why, sizeof why);
        if (r < 0)
            return;
        if (r == 0)
            reject_remote(ld, NULL, NULL, why);
    }
}

/* One round of waiting: the sockets, the wake fd, the ZAP handler, and
 * every live worker's pidfd and stderr. */
static void poll_once(ferry_loader *ld, int timeout_ms)
{
    zmq_pollitem_t *items = ld->items;
    wslot **owner = ld->owner;
    int n = 0;
    items[n++] = (zmq_pollitem_t){.socket = ld->router, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = ld->wake_fd, .events = ZMQ_POLLIN};
    int i_remote = -1, i_zap = -1;
    if (ld->remote_router) {
        i_remote = n;
        items[n++] = (zmq_pollitem_t){.socket = ld->remote_router, .events = ZMQ_POLLIN};
    }
    if (ld->zap) {
        i_zap = n;
        items[n++] = (zmq_pollitem_t){.socket = ld->zap, .events = ZMQ_POLLIN};
    }
    if (ld->deaths_pending && timeout_ms > 2)
        timeout_ms = 2; /* a dead worker's last replies are being waited for */
    int first_errfd = n;
    for (uint32_t i = 0; i < ld->nlocal; i++) {
        if (ld->w[i].errfd >= 0) {
            owner[n] = &ld->w[i];
            items[n++] = (zmq_pollitem_t){.fd = ld->w[i].errfd, .events = ZMQ_POLLIN};
        }
    }
    int first_pidfd = n;
    for (uint32_t i = 0; i < ld->nlocal; i++) {
        if (ld->w[i].pidfd >= 0) {
            owner[n] = &ld->w[i];
            items[n++] = (zmq_pollitem_t){.fd = ld->w[i].pidfd, .events = ZMQ_POLLIN};
        }
    }
    if (zmq_poll(items, n, timeout_ms) <= 0) {
        for (uint32_t i = 0; ld->deaths_pending && i < ld->nlocal; i++)
            settle_death(ld, &ld->w[i]);
        return;
    }
    if (items[1].revents & ZMQ_POLLIN) {
        uint64_t v;
        while (read(ld->wake_fd, &v, sizeof v) < 0 && errno == EINTR)
            ;
    }
    if (i_zap >= 0 && (items[i_zap].revents & ZMQ_POLLIN))
        serve_zap(ld);
    if (items[0].revents & ZMQ_POLLIN)
        drain_socket(ld, ld->router, 64);
    if (i_remote >= 0 && (items[i_remote].revents & ZMQ_POLLIN))
        drain_socket(ld, ld->remote_router, 64);
    for (int i = first_errfd; i < first_pidfd; i++) {
        if (items[i].revents)
            pump_stderr(owner[i]);
    }
    /* After stderr, so a dying worker's last words are in before its death
     * is reported. */
    for (int i = first_pidfd; i < n; i++) {
        if (items[i].revents & ZMQ_POLLIN)
            on_worker_exit(ld, owner[i]);
    }
    for (uint32_t i = 0; ld->deaths_pending && i < ld->nlocal; i++)
        settle_death(ld, &ld->w[i]);
}

/* ------------------------------------------------------------------------
 * Shutdown: STOP, grace period, SIGTERM, SIGKILL; every child reaped.
 */

static int workers_left(ferry_loader *ld)
{
    int left = 0;
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        /* A remote worker counts until its BYE: its STOP is then known to
         * have got out before the socket closes. */
        if (w->pid || (w->thread_live && w->state != W_GONE) ||
            (w->remote && (w->state == W_CONFIGURED || w->state == W_READY)))
            left++;
    }
    return left;
}

/* Waits until every process has exited and been reaped (threads: said BYE),
 * or the deadline passes. */
static void wait_workers(ferry_loader *ld, uint64_t deadline)
{
    for (;;) {
        for (uint32_t i = 0; i < ld->nworkers; i++) {
            int status;
            reap(ld, &ld->w[i], &status);
        }
        if (!workers_left(ld))
            return;
        uint64_t now = ferry__now_ms();
        if (now >= deadline)
            return;
        uint64_t left = deadline - now;
        poll_once(ld, (int)(left < TICK_MS ? left : TICK_MS));
    }
}

static void signal_workers(ferry_loader *ld, int sig)
{
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        if (ld->w[i].pidfd >= 0)
            pidfd_send_signal(ld->w[i].pidfd, sig, NULL, 0);
    }
}

static void shutdown_workers(ferry_loader *ld)
{
    uint64_t grace = (uint64_t)ld->cfg.close_grace_ms;
    ld->closing = 1;
    ld->out.type = FERRY__MSG_STOP;
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        if (w->ident.len && w->state != W_GONE && w->state != W_EMPTY)
            ferry__zsock_send(w->sock, &w->ident, &ld->out, NULL, ZMQ_DONTWAIT);
    }
    /* While waiting, poll_once still files replies: they are dropped with the
     * loader, but reading them lets the workers finish their sends. */
    pthread_mutex_lock(&ld->mu);
    fail_locked(ld, FERRY_ECLOSED, "the loader is closing");
    pthread_mutex_unlock(&ld->mu);
    wait_workers(ld, ferry__now_ms() + grace);
    /* A remote worker that has not said BYE by now cannot be made to: it
     * finds the loader gone by its heartbeats and reconnects. */
    for (uint32_t i = ld->nlocal; i < ld->nworkers; i++) {
        if (ld->w[i].state == W_CONFIGURED || ld->w[i].state == W_READY)
            ld->w[i].state = W_GONE;
    }
    atomic_store(&ld->cancel_threads, 1);
    if (workers_left(ld)) {
        signal_workers(ld, SIGTERM);
        /* A stopped worker only acts on SIGTERM once continued. */
        signal_workers(ld, SIGCONT);
        wait_workers(ld, ferry__now_ms() + (grace / 2 > 200 ? grace / 2 : 200));
    }
    if (workers_left(ld)) {
        signal_workers(ld, SIGKILL);
        for (uint32_t i = 0; i < ld->nworkers; i++) {
            wslot *w = &ld->w[i];
            if (w->pid) {
                while (waitpid(w->pid, NULL, 0) < 0 && errno == EINTR)
                    ;
                close(w->pidfd);
                w->pidfd = -1;
                if (w->errfd >= 0) {
                    close(w->errfd);
                    w->errfd = -1;
                }
                set_pid(ld, w, 0);
            }
        }
    }
    /* Thread workers see cancel_threads within one poll period. */
    uint64_t deadline = ferry__now_ms() + (grace > 1000 ? grace : 1000);
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        wslot *w = &ld->w[i];
        if (!w->thread_live)
            continue;
        uint64_t left = deadline > ferry__now_ms() ? deadline - ferry__now_ms() : 0;
        struct timespec ts = ferry__deadline_ts(CLOCK_REALTIME, left);
        if (pthread_timedjoin_np(w->thread, NULL, &ts) != 0) {
            /* A thread stuck inside dataset code cannot be stopped safely; it
             * keeps the ZeroMQ context, which is then left alive. */
            fprintf(stderr, "ferry: worker thread %d did not stop; leaving it\n", w->index);
            pthread_detach(w->thread);
            ld->ctx_leaked = 1;
        }
        w->thread_live = 0;
    }
}

/* ------------------------------------------------------------------------
 * The scheduler thread
 */

static void *scheduler_main(void *arg)
{
    ferry_loader *ld = arg;
    for (uint32_t i = 0; i < ld->nlocal; i++) {
        int rc = start_worker(ld, &ld->w[i]);
        if (rc != FERRY_OK) {
            fail(ld, rc, NULL);
            break;
        }
    }
    for (;;) {
        pthread_mutex_lock(&ld->mu);
        int stop = ld->stop;
        pthread_mutex_unlock(&ld->mu);
        if (stop)
            break;
        dispatch(ld);
        poll_once(ld, TICK_MS);
        check_deadlines(ld);
    }
    shutdown_workers(ld);
    zmq_close(ld->router);
    ld->router = NULL;
    return NULL;
}

/* ------------------------------------------------------------------------
 * Public API
 */

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
    if (ferry__config_prefetch(cfg) > 1024)
        return ferry__seterr(FERRY_EINVAL, "prefetch %lld is more than 1024",
                             (long long)ferry__config_prefetch(cfg));
    return FERRY_OK;
}

/* Frees everything of a loader whose scheduler thread has ended (or never
 * started). */
static void destroy(ferry_loader *ld)
{
    if (ld->tasks) {
        for (uint32_t i = 0; i < ld->prefetch; i++) {
            ferry_batch_release(ld->tasks[i].batch);
            free(ld->tasks[i].errmsg);
            free(ld->tasks[i].indices);
        }
    }
    if (ld->router)
        zmq_close(ld->router);
    if (ld->remote_router)
        zmq_close(ld->remote_router);
    if (ld->zap)
        zmq_close(ld->zap);
    ferry__allow_free(&ld->allow);
    if (ld->zctx && !ld->ctx_leaked)
        zmq_ctx_term(ld->zctx);
    if (ld->wake_fd >= 0)
        close(ld->wake_fd);
    if (ld->ipc_dir[0]) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/loader", ld->ipc_dir);
        unlink(path);
        rmdir(ld->ipc_dir);
    }
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
    free(ld->tasks);
    free(ld->w);
    free(ld->items);
    free(ld->owner);
    free(ld);
}

/* Stops the scheduler thread, which shuts the workers down, and waits for it. */
static void stop_scheduler(ferry_loader *ld)
{
    if (!ld->sched_live)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    pthread_mutex_unlock(&ld->mu);
    wake(ld);
    pthread_join(ld->sched, NULL);
    ld->sched_live = 0;
}

static int make_endpoint(ferry_loader *ld)
{
    if (ld->cfg.worker_mode == FERRY__PLACE_THREAD) {
        snprintf(ld->endpoint, sizeof ld->endpoint, "inproc://ferry-%p", (void *)ld);
        return FERRY_OK;
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    int n = snprintf(ld->ipc_dir, sizeof ld->ipc_dir, "%s/ferry-XXXXXX", tmp);
    if (n < 0 || (size_t)n >= sizeof ld->ipc_dir || n > 90) {
        ld->ipc_dir[0] = '\0';
        return ferry__seterr(FERRY_EINVAL, "TMPDIR '%s' is too long for a socket path", tmp);
    }
    /* mkdtemp creates the directory 0700: only this user reaches the socket. */
    if (!mkdtemp(ld->ipc_dir)) {
        int e = errno;
        ld->ipc_dir[0] = '\0';
        return ferry__seterr(FERRY_ESYS, "could not create a private directory in %s: %s", tmp,
                             strerror(e));
    }
    snprintf(ld->endpoint, sizeof ld->endpoint, "ipc://%s/loader", ld->ipc_dir);
    return FERRY_OK;
}

static int sockopt(void *sock, int opt, const void *v, size_t len, const char *name)
{
    if (zmq_setsockopt(sock, opt, v, len) != 0)
        return ferry__seterr(FERRY_ESYS, "setting %s on the remote socket: %s", name,
                             zmq_strerror(errno));
    return FERRY_OK;
}

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a draft option in libzmq 4.3's header */
#endif

/* The CURVE server side: the loader's key pair, the allow-list, and the ZAP
 * handler that applies it, bound before the endpoint so no handshake can
 * come first. */
static int setup_curve(ferry_loader *ld)
{
    if (!ld->cfg.curve_key[0] || !ld->cfg.curve_allow[0])
        return ferry__seterr(FERRY_EOPTION,
                             "bind %s needs curve_key (the loader's key pair, from ferry-keygen) "
                             "and curve_allow (the workers' public keys), or insecure=1 for "
                             "plain TCP",
                             ld->cfg.bind);
    char pub[FERRY__Z85_KEY + 1], sec[FERRY__Z85_KEY + 1];
    int rc = ferry__key_pair_load(ld->cfg.curve_key, pub, sec);
    if (rc != FERRY_OK)
        return rc;
    rc = ferry__allow_load(ld->cfg.curve_allow, &ld->allow);
    if (rc == FERRY_OK)
        rc = ferry__zap_open(ld->zctx, &ld->zap);
    int one = 1;
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_CURVE_SERVER, &one, sizeof one, "ZMQ_CURVE_SERVER");
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_CURVE_SECRETKEY, sec, FERRY__Z85_KEY,
                     "ZMQ_CURVE_SECRETKEY");
    explicit_bzero(sec, sizeof sec);
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_ZAP_DOMAIN, FERRY__ZAP_DOMAIN,
                     strlen(FERRY__ZAP_DOMAIN), "ZMQ_ZAP_DOMAIN");
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one,
                     "ZMQ_ZAP_ENFORCE_DOMAIN");
    return rc;
}

/* The ROUTER remote workers connect to: CURVE (or, asked for, plain TCP),
 * ZeroMQ's own heartbeats so a dead TCP connection is closed, the same
 * message size limit as the local socket. */
static int setup_remote(ferry_loader *ld)
{
    if (strncmp(ld->cfg.bind, "tcp://", 6) != 0)
        return ferry__seterr(FERRY_EOPTION, "bind '%s' is not a tcp:// endpoint", ld->cfg.bind);
    ld->remote_router = zmq_socket(ld->zctx, ZMQ_ROUTER);
    if (!ld->remote_router)
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    int rc = ferry__zsock_setup(ld->remote_router, ld->cfg.max_message);
    if (rc != FERRY_OK)
        return rc;
    int one = 1;
    int ivl = (int)ld->cfg.heartbeat_ms;
    int64_t dead = ld->cfg.heartbeat_ms * ld->cfg.heartbeat_liveness;
    int timeout = dead > INT32_MAX ? INT32_MAX : (int)dead;
    rc = sockopt(ld->remote_router, ZMQ_ROUTER_MANDATORY, &one, sizeof one, "ZMQ_ROUTER_MANDATORY");
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl, "ZMQ_HEARTBEAT_IVL");
    if (rc == FERRY_OK)
        rc = sockopt(ld->remote_router, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout,
                     "ZMQ_HEARTBEAT_TIMEOUT");
    if (rc == FERRY_OK)
        rc = ld->cfg.insecure ? FERRY_OK : setup_curve(ld);
    if (rc != FERRY_OK)
        return rc;
    if (zmq_bind(ld->remote_router, ld->cfg.bind) != 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE)
            return ferry__syserr(FERRY_ESYS, "binding the remote socket", e);
        return ferry__seterr(FERRY_EOPTION, "binding %s: %s", ld->cfg.bind, zmq_strerror(e));
    }
    size_t len = sizeof ld->bound;
    if (zmq_getsockopt(ld->remote_router, ZMQ_LAST_ENDPOINT, ld->bound, &len) != 0)
        snprintf(ld->bound, sizeof ld->bound, "%s", ld->cfg.bind);
    if (ld->cfg.insecure)
        fprintf(stderr,
                "ferry: WARNING: remote workers on %s are neither authenticated nor encrypted "
                "(insecure=1): anyone who can reach it can join and read every batch\n",
                ld->bound);
    for (uint32_t i = ld->nlocal; i < ld->nworkers; i++)
        ld->w[i].sock = ld->remote_router;
    return FERRY_OK;
}

static int setup_sockets(ferry_loader *ld)
{
    /* libzmq aborts rather than fail when its threads' pollers cannot get an
     * fd; its context, socket, listener and our eventfd take about nine. */
    int rc = ferry__fd_headroom(12, "opening a loader");
    if (rc != FERRY_OK)
        return rc;
    ld->zctx = zmq_ctx_new();
    if (!ld->zctx)
        return ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
    int zero = 0, one = 1;
    zmq_ctx_set(ld->zctx, ZMQ_BLOCKY, zero);
    ld->router = zmq_socket(ld->zctx, ZMQ_ROUTER);
    if (!ld->router)
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    rc = ferry__zsock_setup(ld->router, ld->cfg.max_message);
    if (rc != FERRY_OK)
        return rc;
    if (zmq_setsockopt(ld->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0)
        return ferry__seterr(FERRY_ESYS, "ZMQ_ROUTER_MANDATORY: %s", zmq_strerror(errno));
    if (zmq_bind(ld->router, ld->endpoint) != 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE)
            return ferry__syserr(FERRY_ESYS, "binding the loader's socket", e);
        return ferry__seterr(FERRY_ESYS, "binding %s: %s", ld->endpoint, zmq_strerror(e));
    }
    for (uint32_t i = 0; i < ld->nlocal; i++)
        ld->w[i].sock = ld->router;
    ld->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ld->wake_fd < 0)
        return ferry__syserr(FERRY_ESYS, "eventfd", errno);
    return ld->cfg.bind[0] ? setup_remote(ld) : FERRY_OK;
}

static ferry_loader *alloc_loader(const ferry_config *cfg)
{
    ferry_loader *ld = ferry__calloc(1, sizeof *ld);
    if (!ld)
        return NULL;
    ld->wake_fd = -1;
    ld->cfg = *cfg;
    ld->prefetch = (uint32_t)ferry__config_prefetch(cfg);
    ld->nworkers = (uint32_t)ferry__config_slots(cfg);
    ld->nlocal = (uint32_t)cfg->workers;
    ld->min_workers = (uint32_t)ferry__config_min_workers(cfg);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ld->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&ld->mu, NULL);
    ld->tasks = ferry__calloc(ld->prefetch, sizeof *ld->tasks);
    ld->w = ferry__calloc(ld->nworkers, sizeof *ld->w);
    ld->items = ferry__calloc(4 + 2 * (size_t)ld->nworkers, sizeof *ld->items);
    ld->owner = ferry__calloc(4 + 2 * (size_t)ld->nworkers, sizeof *ld->owner);
    if (!ld->tasks || !ld->w || !ld->items || !ld->owner)
        goto fail;
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        ld->tasks[i].indices = ferry__malloc((size_t)cfg->batch_size * sizeof(uint64_t));
        if (!ld->tasks[i].indices)
            goto fail;
    }
    for (uint32_t i = 0; i < ld->nworkers; i++) {
        ld->w[i].index = (int)i;
        ld->w[i].remote = i >= ld->nlocal;
        ld->w[i].pidfd = -1;
        ld->w[i].errfd = -1;
    }
    return ld;
fail:
    destroy(ld);
    return NULL;
}

/* Waits on the condition variable for at most `ms`. Caller holds mu. */
static void wait_cv(ferry_loader *ld, int ms)
{
    struct timespec ts = ferry__deadline_ts(CLOCK_MONOTONIC, (uint64_t)ms);
    pthread_cond_timedwait(&ld->cv, &ld->mu, &ts);
}

int ferry_loader_open(ferry_loader **out, const ferry_config *cfg)
{
    if (!out || !cfg)
        return ferry__seterr(FERRY_EINVAL, "out and cfg must not be NULL");
    int rc = check_config(cfg);
    if (rc != FERRY_OK)
        return rc;
    ferry_loader *ld = alloc_loader(cfg);
    if (!ld)
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");

    if (cfg->worker_mode == FERRY__PLACE_PROCESS) {
        rc = ferry__find_worker(cfg->worker_path, ld->worker_path, sizeof ld->worker_path);
        if (rc != FERRY_OK)
            goto fail;
    }
    rc = make_endpoint(ld);
    if (rc != FERRY_OK)
        goto fail;
    rc = setup_sockets(ld);
    if (rc != FERRY_OK)
        goto fail;

    ld->start_deadline_ms = ferry__now_ms() + (uint64_t)cfg->start_timeout_ms;
    /* The scheduler thread takes no signals: they stay the trainer's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&ld->sched, NULL, scheduler_main, ld);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        rc = ferry__syserr(FERRY_ESYS, "could not start the scheduler thread", e);
        goto fail;
    }
    ld->sched_live = 1;

    pthread_mutex_lock(&ld->mu);
    while (ld->ph == P_STARTING)
        wait_cv(ld, TICK_MS);
    rc = ld->ph == P_RUNNING ? FERRY_OK : ld->fatal_code;
    char msg[FERRY__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", ld->fatal_msg);
    pthread_mutex_unlock(&ld->mu);
    if (rc != FERRY_OK) {
        stop_scheduler(ld);
        destroy(ld);
        return ferry__seterr_str(rc, msg);
    }
    *out = ld;
    return FERRY_OK;

fail:
    destroy(ld);
    return rc;
}

/* The entry to deliver next, or NULL: in order, the one with the next seq
 * once it is done; otherwise the earliest completed. Caller holds mu. */
static task_ent *deliverable(ferry_loader *ld)
{
    task_ent *best = NULL;
    uint64_t want = ld->start_seq + ld->st.delivered;
    for (uint32_t i = 0; i < ld->prefetch; i++) {
        task_ent *e = &ld->tasks[i];
        if (e->state != T_DONE)
            continue;
        if (ld->cfg.in_order) {
            if (e->t.seq == want)
                return e;
        } else if (!best || e->done_order < best->done_order) {
            best = e;
        }
    }
    return best;
}

int ferry_loader_next(ferry_loader *ld, ferry_batch **out)
{
    if (!ld || !out)
        return ferry__seterr(FERRY_EINVAL, "loader and out must not be NULL");
    pthread_mutex_lock(&ld->mu);
    ld->asked = ld->st.delivered + 1;
    int woke = 0;
    for (;;) {
        if (ld->ph == P_FAILED) {
            int rc = ld->fatal_code;
            char msg[FERRY__ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", ld->fatal_msg);
            pthread_mutex_unlock(&ld->mu);
            return ferry__seterr_str(rc, msg);
        }
        task_ent *e = deliverable(ld);
        if (e) {
            ferry_batch *b = e->batch;
            int err = e->err;
            char *msg = e->errmsg;
            e->batch = NULL;
            e->errmsg = NULL;
            e->err = 0;
            e->state = T_FREE;
            /* Only a full window waits on the trainer (the barrier has its
             * own wake-up below); otherwise the scheduler is woken by the
             * replies and deaths it polls for, and this saves a syscall per
             * batch. */
            int was_full = ld->in_flight-- >= ld->prefetch;
            ld->st.delivered++;
            if (err)
                ld->st.failed++;
            pthread_mutex_unlock(&ld->mu);
            if (was_full)
                wake(ld);
            if (err) {
                ferry__seterr_str(err, msg ? msg
                                           : "a worker failed on a batch (no memory "
                                             "for the detail)");
                free(msg);
                return err;
            }
            *out = b;
            return FERRY_OK;
        }
        if (ld->start_seq + ld->st.delivered >= ld->sampler.end_seq) {
            pthread_mutex_unlock(&ld->mu);
            return ferry__seterr(FERRY_EOF, "the stream has ended");
        }
        if (ld->cfg.epoch_barrier && !woke) {
            /* The scheduler may be holding an epoch's first batch for this
             * very request. */
            woke = 1;
            wake(ld);
        }
        wait_cv(ld, TICK_MS * 10);
    }
}

int ferry_loader_length(ferry_loader *ld, uint64_t *items, uint64_t *batches_per_epoch)
{
    if (!ld)
        return ferry__seterr(FERRY_EINVAL, "loader must not be NULL");
    pthread_mutex_lock(&ld->mu);
    if (items)
        *items = ld->n;
    if (batches_per_epoch)
        *batches_per_epoch = ld->sampler.batches_per_epoch;
    pthread_mutex_unlock(&ld->mu);
    return FERRY_OK;
}

int ferry_loader_state(ferry_loader *ld, void *buf, size_t cap, size_t *len)
{
    if (!ld || !len)
        return ferry__seterr(FERRY_EINVAL, "loader and len must not be NULL");
    if (!ld->cfg.in_order)
        return ferry__seterr(FERRY_EINVAL, "the stream position is only defined with in_order on");
    pthread_mutex_lock(&ld->mu);
    uint64_t next = ld->start_seq + ld->st.delivered;
    int rc = ferry__sampler_save(&ld->sampler, next, buf, cap, len);
    pthread_mutex_unlock(&ld->mu);
    return rc;
}

int ferry_loader_stats(ferry_loader *ld, ferry_stats *st)
{
    if (!ld || !st)
        return ferry__seterr(FERRY_EINVAL, "loader and stats must not be NULL");
    pthread_mutex_lock(&ld->mu);
    *st = ld->st;
    st->in_flight = ld->in_flight;
    pthread_mutex_unlock(&ld->mu);
    return FERRY_OK;
}

int ferry_loader_endpoint(ferry_loader *ld, char *buf, size_t cap)
{
    if (!ld || !buf)
        return ferry__seterr(FERRY_EINVAL, "loader and buf must not be NULL");
    if (!ld->bound[0])
        return ferry__seterr(FERRY_ESTATE, "the loader was opened without 'bind'");
    size_t len = strlen(ld->bound);
    if (len >= cap)
        return ferry__seterr(FERRY_ELIMIT, "the endpoint needs %zu bytes", len + 1);
    memcpy(buf, ld->bound, len + 1);
    return FERRY_OK;
}

int ferry_loader_worker_pid(ferry_loader *ld, uint32_t index, int *pid)
{
    if (!ld || !pid || index >= ld->nworkers)
        return ferry__seterr(FERRY_EINVAL, "no worker %u (the loader has %u)", index,
                             ld ? ld->nworkers : 0);
    pthread_mutex_lock(&ld->mu);
    *pid = (int)ld->w[index].pid;
    pthread_mutex_unlock(&ld->mu);
    return FERRY_OK;
}

int ferry_loader_close(ferry_loader *ld)
{
    if (!ld)
        return FERRY_OK;
    stop_scheduler(ld);
    int leaked = ld->ctx_leaked;
    destroy(ld);
    if (leaked)
        return ferry__seterr(FERRY_ETIMEDOUT, "a worker thread did not stop; its resources "
                                              "were left behind");
    return FERRY_OK;
}
