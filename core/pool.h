/*
 * pool.h - the loader's local workers: processes or threads, started,
 * watched, killed and reaped.
 *
 * Position in the data flow: beside the scheduler, which decides; the pool
 * only carries out and reports. A process worker is a fresh image of the
 * ferry-worker program (posix_spawn, never fork without exec), watched
 * through its pidfd, its stderr passed on to ours with the end kept as its
 * last words. A thread worker runs the same worker loop in this process
 * over inproc://. What happened comes back as events (a worker died, with
 * its pid, wait status and last words; a worker thread stopped, with its
 * error); the pool never touches the prefetch window or the loader.
 *
 * Fork safety: a child the trainer forks itself inherits none of the
 * pool's memory or fds: the task words the workers write are mapped
 * MADV_DONTFORK, and their memfd is closed in the child (forkfds.h).
 *
 * Thread safety: the scheduler thread does everything, except that
 * ferry__pool_pid may be read from any thread. The pool's threads write
 * only their own result and the wake fd.
 */
#ifndef FERRY_CORE_POOL_H
#define FERRY_CORE_POOL_H

#include <stdint.h>
#include <sys/types.h>
#include <zmq.h>

#include "log.h"

typedef struct ferry__pool ferry__pool;

typedef struct ferry__pool_opts {
    uint32_t n;              /* workers, indices 0..n-1 */
    int threads;             /* thread workers, not processes */
    const char *worker_path; /* the ferry-worker program (processes) */
    const char *worker_args; /* its first arguments, one per line (option worker_args) */
    const char *endpoint;    /* the loader's local endpoint */
    void *zctx;              /* the loader's context (threads share it) */
    int shm_fd;              /* the batch slots' memfd (shm.h), -1: none */
    struct ferry__shm *shm;  /* the slots themselves: thread workers write through the
                              * loader's own mapping of them */
    int data_fd;             /* bytes each process worker is given (option dataset_fd), -1 */
    /* Option fork_server: process workers are forked by one clean parent
     * (forkserver.h), started with `dataset` (which it loads once),
     * spawned or forked from the clean parent at fork_from (-1: none). */
    int fork_server;
    int fork_from;
    const char *dataset;
    int start_timeout_ms;    /* a (re)started worker must be ready by then */
    int wake_fd;             /* written when a thread worker stops */
    ferry__log log;          /* where its messages go */
    ferry_exit_fn exit_fn;   /* told of each worker process reaped (NULL: nobody) */
    void *exit_user;
} ferry__pool_opts;

typedef enum ferry__pool_event_kind {
    FERRY__POOL_DIED = 1,      /* a process exited and was reaped */
    FERRY__POOL_THREAD_FAILED, /* a worker thread returned an error */
    FERRY__POOL_PARENT_DIED,   /* the clean parent exited and was reaped (index: n) */
} ferry__pool_event_kind;

typedef struct ferry__pool_event {
    ferry__pool_event_kind kind;
    uint32_t index;
    pid_t pid;             /* DIED */
    int status;            /* DIED: the wait status; -1 when someone else reaped it */
    int code;              /* THREAD_FAILED: its error code */
    uint64_t task;         /* DIED: the id + 1 of the task it was building, 0: none */
    char kill_reason[256]; /* DIED: why the pool killed it, or "" */
    char words[1024];      /* DIED: its last lines of stderr; THREAD_FAILED: its error */
} ferry__pool_event;

/* A pool of o->n workers, none started. FERRY_ENOMEM. */
int ferry__pool_new(ferry__pool **out, const ferry__pool_opts *o);
/* Frees the pool; every worker must have been reaped or joined. A pool
 * whose thread was left running (ferry__pool_join_threads returned 1) is
 * not freed: that thread still uses it. */
void ferry__pool_free(ferry__pool *p);

/* Starts worker i (again). FERRY_ELIMIT when the fd headroom a worker needs
 * is not there, FERRY_ESPAWN or FERRY_ENOMEM otherwise; nothing is left
 * running on failure. */
int ferry__pool_start(ferry__pool *p, uint32_t i);

/* After FERRY__POOL_PARENT_DIED, under the restart policy (before the
 * loader opened too): a new clean parent, asked again for the workers the
 * dead one had not forked yet (after a death before it was ready other
 * than a first SIGKILL, those workers are spawned instead, and so are all
 * later ones; a spawn that fails is logged, and the worker's start
 * deadline catches it). */
void ferry__pool_parent_restart(ferry__pool *p);

/* Worker i was asked of the clean parent and its pid is not known yet:
 * reads the parent's answers until it is, for at most timeout_ms. A forked
 * worker can say HELLO before the scheduler has read the "P" answer that
 * names it (the parent sends it just after the fork). */
void ferry__pool_await_fork(ferry__pool *p, uint32_t i, int timeout_ms);

/* The pid worker i's fork said first on its stderr (the mark), 0 if none
 * yet: the fork's own word, for a HELLO that comes before its clean
 * parent's answer, which may never come (a clean parent killed between
 * the fork and the answer). Scheduler thread. */
pid_t ferry__pool_said(ferry__pool *p, uint32_t i);

/* Stops the clean parent (SIGKILL: it holds no work) and reaps it. */
void ferry__pool_parent_stop(ferry__pool *p);

/* Worker i's pid; 0 for a thread or a worker not running. Any thread. */
pid_t ferry__pool_pid(ferry__pool *p, uint32_t i);

/* Appends a poll item for each live worker's stderr and pidfd, and the
 * clean parent's three, to items[] (room for FERRY__POOL_POLL_ITEMS(n));
 * returns how many. */
#define FERRY__POOL_POLL_ITEMS(n) (2 * (size_t)(n) + 3)
int ferry__pool_poll_items(ferry__pool *p, zmq_pollitem_t *items);

/* After zmq_poll on items from ferry__pool_poll_items: passes stderr on,
 * reaps the workers that exited (after their stderr, so their last words
 * are in), collects stopped threads, and reads the clean parent's
 * answers. Fills ev[] (room for n + 1) and returns how many events. */
int ferry__pool_after_poll(ferry__pool *p, const zmq_pollitem_t *items, ferry__pool_event *ev);

/* Kills process worker i (SIGKILL through its pidfd) and remembers why, for
 * its death event. Returns 0 when there is no process to kill or it is being
 * killed already. */
int ferry__pool_kill(ferry__pool *p, uint32_t i, const char *reason);

/* Process worker i is running, not being killed, and past its ready
 * deadline (set when it was started). */
int ferry__pool_ready_overdue(ferry__pool *p, uint32_t i, uint64_t now_ms);

/* Worker i was started start_timeout_ms ago or more and has no process to
 * kill: one asked of the clean parent and never forked, or a thread. */
int ferry__pool_start_overdue(ferry__pool *p, uint32_t i, uint64_t now_ms);

/* Whether worker i can be killed (a process, not being killed already),
 * and whether it is being killed. */
int ferry__pool_killable(ferry__pool *p, uint32_t i);
int ferry__pool_killing(ferry__pool *p, uint32_t i);

/* ---- shutdown: the scheduler escalates with these ---- */

/* Reaps without waiting every process worker that has exited. */
void ferry__pool_reap_exited(ferry__pool *p);

/* Workers still running: processes not reaped, threads not returned. */
uint32_t ferry__pool_left(ferry__pool *p);

/* Sends `sig` to every running process worker. */
void ferry__pool_signal(ferry__pool *p, int sig);

/* SIGKILL to every process worker, each reaped (bounded: SIGKILL cannot be
 * refused). */
void ferry__pool_kill_all(ferry__pool *p);

/* Tells thread workers to stop and joins them until `grace_ms` has passed.
 * A thread stuck inside dataset code is left running (detached): returns 1
 * then, and the ZeroMQ context must be left alive. */
int ferry__pool_join_threads(ferry__pool *p, uint64_t grace_ms);

/* Tells thread workers to stop (they notice within one poll period). */
void ferry__pool_cancel_threads(ferry__pool *p);

#endif
