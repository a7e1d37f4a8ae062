/*
 * sched_internal.h - the scheduler's own state, shared by the three files
 * of the scheduler's room and nothing else:
 *   scheduler.c  the thread: its loop, waiting, dispatch, start and shutdown
 *   replies.c    what each message from a worker means (HELLO ... BYE)
 *   supervise.c  what a worker's death, silence or timeout means for the run
 * Calls run one way: scheduler.c -> replies.c -> supervise.c -> this header.
 *
 * Everything here is the scheduler thread's, except where a field says
 * otherwise.
 */
#ifndef FERRY_CORE_SCHED_INTERNAL_H
#define FERRY_CORE_SCHED_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include <zmq.h>

#include "config.h"
#include "endpoint.h"
#include "flow.h"
#include "peer.h"
#include "pool.h"
#include "remote.h"
#include "scheduler.h"
#include "shm.h"
#include "window.h"
#include "zsock.h"

/* A worker as the scheduler sees it: the peer record, and its death or
 * disconnection while it settles. */
typedef struct sched_worker {
    ferry__peer p;
    int settling; /* dead or disconnected; its last replies are being read */
    uint64_t settle_by_ms;
    char gone_why[128]; /* remote: why its connection is taken for gone */
    ferry__pool_event death;
    /* Remote: its READY, kept until a local worker's fixes the dataset's
     * length and schema (NULL: none waiting). */
    ferry__ready *held_ready;
    uint32_t fails_retried; /* remote: its FAILs whose batch went elsewhere */
    /* Local: a replacement that could not be started (no fd, no memory, no
     * process left under the user's limits) is tried again at
     * restart_at_ms (0: none pending), the delay doubling each time. */
    uint64_t restart_at_ms;
    uint64_t down_since_ms; /* when its replacement first failed to start */
    uint32_t restart_delay_ms;
    uint32_t restart_tries;
    int restart_rc;        /* the last try's error code */
    char restart_err[256]; /* and why it failed */
    /* Local: it retired (its BYE said why, with its figures; retired 0:
     * not retiring). Its death is then replaced as planned, not charged
     * to anything; one not gone by retire_by_ms is killed. */
    ferry__bye retired;
    uint64_t retire_by_ms;
} sched_worker;

typedef struct sched_name {
    char host[FERRY__PEER_HOST_MAX];
    uint32_t pid;
} sched_name;

struct ferry__scheduler {
    ferry_config cfg;
    ferry__log log; /* the config's: where messages go */
    ferry__window *win;
    ferry__pool *pool;
    ferry__remote *remote; /* NULL without bind */
    ferry__shm *shm;       /* local process workers' batch slots; NULL: none (option shm) */
    ferry__flow *flow;     /* each worker's credits and the window, from measurements */
    void *zctx;
    void *router; /* local workers (ipc:// or inproc://) */
    int wake_fd;
    int data_fd; /* option dataset_fd, our copy; -1: none */
    char ipc_dir[FERRY__IPC_DIR_MAX];
    char endpoint[FERRY__LOCAL_ENDPOINT_MAX];
    char worker_path[PATH_MAX];
    char last_refusal[400]; /* why the last remote worker was refused, for open's timeout */
    sched_worker *w;
    uint32_t nworkers; /* slots: nlocal local ones, then the remote ones */
    uint32_t nlocal;
    uint32_t min_workers;
    uint32_t open_local; /* local workers ready before open (open_local_ready) */
    int opened; /* every worker open waits for was ready once (maybe_start) */
    zmq_pollitem_t *items;     /* poll_once's scratch: 4 + 2 * nlocal */
    ferry__pool_event *events; /* nlocal */
    pthread_t thread;
    int thread_live;
    atomic_int stop;
    atomic_int drain; /* the stream ended, or a slot came free since: give slot memory back */
    int ctx_leaked;
    /* Connections to the remote sockets that closed (the guard's thread
     * counts them); the scheduler probes its remote workers when it moves. */
    atomic_uint closed_conns;
    unsigned closed_seen;
    uint64_t probe_at_ms;    /* the next probe (ferry__sched_probe_remote); 0: none due */
    uint64_t probe_ladder_ms; /* when the current run of probes began */
    uint32_t probe_delay_ms;
    /* Who holds each remote slot, for ferry_loader_worker_host on any
     * thread: the scheduler thread copies a remote worker's host name and
     * pid here as it admits it; readers take the lock for the copy. A slot
     * keeps its last holder's name after a loss (the figures of the slot
     * are still that worker's). */
    pthread_mutex_t names_lock;
    sched_name *names; /* nworkers; local slots stay empty */

    /* --- scheduler thread only --- */
    int closing;          /* shutdown has begun: deaths are expected */
    uint32_t rr;          /* round-robin start for picking workers */
    uint64_t n;           /* the dataset's length, from the first READY */
    ferry__schema schema; /* the dataset's, from the first READY; no fields before */
    uint64_t start_deadline_ms;
    uint64_t idle_since_ms; /* running with no ready worker since then; 0 = has some */
    uint32_t settling;      /* workers dead or disconnected whose last replies are awaited */
    uint64_t checked_ms;    /* the last look at the deadlines */
    uint64_t trimmed_ms;    /* the last trim of the batch slots */
    int slots_out;          /* the last task found no free batch slot */
    int send_errno;         /* why the last task could not be sent */
    uint64_t slots_warned_ms; /* when that was last logged */
    uint64_t early_retirements; /* workers that retired over memory after one batch */
    ferry__msg in, out;     /* message scratch, too big for the stack */
};

static inline void sched_describe(const ferry__scheduler *s, const sched_worker *w, char *buf,
                                  size_t cap)
{
    pid_t pid = w->p.remote ? 0 : ferry__pool_pid(s->pool, w->p.index);
    if (w->p.remote)
        snprintf(buf, cap, "remote worker %u (%s, pid %u)", w->p.index, w->p.host, w->p.rpid);
    else if (pid)
        snprintf(buf, cap, "worker %u (pid %d)", w->p.index, (int)pid);
    else
        snprintf(buf, cap, "worker %u (thread)", w->p.index);
}

/* What seals w's messages: under CURVE, a remote worker's session seal
 * once it is on its data connection (remote.h); else NULL. */
static inline ferry__seal *sched_seal(const ferry__scheduler *s, const sched_worker *w)
{
    if (!w->p.remote || w->p.sock != ferry__remote_data_socket(s->remote))
        return NULL;
    return ferry__remote_seal(s->remote, w->p.index - s->nlocal);
}

static inline int sched_send(ferry__scheduler *s, sched_worker *w, zmq_msg_t *payload)
{
    return ferry__zsock_send(w->p.sock, &w->p.ident, sched_seal(s, w), &s->out, payload,
                             ZMQ_DONTWAIT);
}

static inline int sched_send_simple(ferry__scheduler *s, sched_worker *w, ferry__msg_type type)
{
    s->out.type = type;
    return sched_send(s, w, NULL);
}

/* Flow control's current choice goes to the window (its prefetch, and
 * what stats say). */
static inline void sched_flow_publish(ferry__scheduler *s)
{
    ferry__flow_summary fs;
    ferry__flow_summary_get(s->flow, &fs);
    ferry__window_set_flow(s->win, &fs);
}

/* Ready worker w is ready no more (it died, left or was given up). */
static inline void sched_unready(ferry__scheduler *s, const sched_worker *w)
{
    ferry__window_add_workers(s->win, -1);
    ferry__flow_leave(s->flow, w->p.index);
    sched_flow_publish(s);
}

/* ---- scheduler.c ---- */

/* Publishes remote worker w's host name and pid for its slot
 * (ferry_loader_worker_host); w was just admitted. */
void ferry__sched_name_remote(ferry__scheduler *s, const sched_worker *w);

/* ---- replies.c ---- */

/* Reads what is waiting on `sock`, at most `budget` messages, and acts on
 * each. */
void ferry__sched_drain(ferry__scheduler *s, void *sock, int budget);

/* The ZAP handler refused a key (remote.h's refused callback). */
void ferry__sched_zap_refused(void *s, const char *why);

/* ---- supervise.c ---- */

/* Remote slot w's session is over: the slot is free again and its session
 * token no longer opens anything. */
void ferry__sched_end_remote(ferry__scheduler *s, sched_worker *w);

/* A local process worker died (a pool event); handled once it settles. */
void ferry__sched_on_death(ferry__scheduler *s, const ferry__pool_event *ev);

/* The workers' clean parent died (a pool event): under restart another is
 * started (the workers it forked go on: they are the loader's children);
 * under fail, the loader fails saying so. */
void ferry__sched_on_parent_death(ferry__scheduler *s, const ferry__pool_event *ev);

/* Local worker w said BYE retiring (s->in.u.bye): no task goes to it any
 * more, and its exit is replaced as planned (supervise.c). */
void ferry__sched_on_retire(ferry__scheduler *s, sched_worker *w);

/* Remote worker w's connection is gone (a send to it failed): it is given
 * up, charged, once its last replies are in. */
void ferry__sched_on_disconnect(ferry__scheduler *s, sched_worker *w, const char *why);

/* A send to remote worker w failed with err (errno): its connection closed
 * (EHOSTUNREACH) or failed; it is given up as by on_disconnect, saying
 * which. */
void ferry__sched_on_send_failure(ferry__scheduler *s, sched_worker *w, int err);

/* Handles the deaths and disconnections whose last replies are in (or that
 * waited long enough). */
void ferry__sched_settle(ferry__scheduler *s);

/* Gives remote worker w up (see supervise.c). */
void ferry__sched_lose_remote(ferry__scheduler *s, sched_worker *w, const char *why,
                              ferry__charge charge, uint64_t id);

/* A connection to the remote sockets closed: each remote worker is sent a
 * HEARTBEAT (again over the next few hundred ms, see supervise.c), and the
 * one whose connection it was fails the send and is given up at once (its
 * process died, say), not a heartbeat later. */
void ferry__sched_probe_remote(ferry__scheduler *s);

/* Start deadline, idle loader, replacements, timeouts, remote liveness. */
void ferry__sched_check_deadlines(ferry__scheduler *s);

#endif
