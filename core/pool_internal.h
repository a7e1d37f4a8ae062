/*
 * pool_internal.h - the pool's state, shared by its two files and nothing
 * else:
 *   pool.c        the pool itself: its memory, watching the workers
 *                 (stderr, pidfds, deaths), killing, shutdown
 *   pool_start.c  starting them: threads, spawned processes, and the
 *                 clean parent that forks them (option fork_server)
 * Calls run one way: pool.c -> pool_start.c -> here.
 *
 * Each worker's record is the scheduler thread's, except `pid` (read by
 * ferry_loader_worker_pid from the trainer's thread, hence atomic) and a
 * thread worker's result (written by that thread before it sets `done`).
 */
#ifndef FERRY_CORE_POOL_INTERNAL_H
#define FERRY_CORE_POOL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"
#include "pool.h"
#include "worker.h"

/* A process worker's task word, in words of 64 bits (see struct ferry__pool). */
#define WORD_STRIDE (FERRY__TASK_WORD_BYTES / sizeof(uint64_t))

typedef struct local_worker {
    ferry__pool *pool;
    uint32_t index;
    _Atomic pid_t pid; /* 0 for a thread or when not running */
    int pidfd;         /* -1 when none */
    int errfd;         /* read end of its stderr, -1 when none */
    char tail[512];    /* the end of what it wrote to stderr */
    size_t tail_len;
    int marked;        /* forked by the clean parent: its stderr starts with its pid (MARK) */
    pid_t said;        /* the pid its stderr started with (0: none yet) */
    int killing;           /* the pool has sent it SIGKILL */
    char kill_reason[256]; /* why, or "" */
    uint64_t ready_by_ms;
    /* thread workers */
    pthread_t thread;
    int thread_live; /* started and not joined */
    atomic_int done; /* the thread function has returned */
    int reported;    /* its failure went out as an event */
    int thread_rc;   /* valid once done */
    char thread_msg[FERRY__ERRMSG_MAX];
} local_worker;

struct ferry__pool {
    ferry__pool_opts o;
    local_worker *w;
    atomic_int cancel;    /* thread workers: stop */
    local_worker **owner; /* the worker behind each poll item, 2 * n */
    int nerr, npid;       /* poll items last handed out: stderr ones, then pidfds */
    int leaked;           /* a thread worker was left running */
    /* Process workers' task words: worker i writes the id (+1) of the task
     * it is building at words[i * WORD_STRIDE], 0 between tasks. Shared
     * memory (a memfd passed to each worker), so the word outlives a dead
     * worker and says which task killed it. Never inherited by a child the
     * trainer forks: the mapping is MADV_DONTFORK and the memfd is closed
     * in the child (forkfds.h) and on exec (see map_task_words). */
    int task_fd;
    _Atomic uint64_t *words;
    size_t words_len;
    /* The clean parent (option fork_server): its record is w[n] (pid,
     * pidfd, stderr, as a worker's), `ctl` its control socket (-1: none
     * running). `asked` lists, oldest first, the workers asked of it and
     * not yet forked (their stderr pipes are open already). */
    int fork;                   /* workers are forked by the clean parent */
    int ctl;
    int parent_ready;           /* it said "R" */
    int parent_early_deaths;    /* SIGKILLed before "R" since one said it */
    uint32_t *asked;
    uint32_t nasked;
};

/* ---- pool_start.c ---- */

/* Passes whatever worker w wrote to stderr on to ours, keeping the end of
 * it for the message if the worker dies. */
void ferry__pool_pump_stderr(local_worker *w);

/* Worker w's process is gone: its pid, pidfd and stderr are let go. */
void ferry__pool_forget_process(local_worker *w);

/* Reads the clean parent's answers (the pids of the workers it forked). */
void ferry__pool_read_parent(ferry__pool *p);

/* The clean parent's death, as event ev: 1 when it had been ready (the
 * event goes out), 0 when workers are spawned from now on instead. */
int ferry__pool_parent_gone(ferry__pool *p, ferry__pool_event *ev);

#endif
