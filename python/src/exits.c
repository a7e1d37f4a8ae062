/*
 * exits.c - a loader's book of the worker processes ferry reaped (exits.h).
 *
 * ferry calls the exit callback for each worker process it reaps, on its
 * own thread; the callback writes (pid, wait status) under the book's mutex
 * and wakes whoever waits on its condition (a clock of CLOCK_MONOTONIC, so
 * a deadline does not move with the wall clock). The book outlives the
 * loader's close: torch's tests join a worker after the DataLoader is gone.
 * It grows by one entry per process reaped: the workers at close, and each
 * one replaced.
 */
#include "exits.h"

#include "clock.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Worker processes reaped, in the order ferry reaped them. */
typedef struct exit_entry {
    int pid;
    int status; /* the wait status; -1: unknown (ferry_exit_fn) */
} exit_entry;

struct ferry_py_exits {
    pid_t owner; /* the process that made it */
    pthread_mutex_t mu;
    pthread_cond_t changed; /* an entry was added */
    exit_entry *e;
    size_t n, cap;
};

void ferry_py_exits_record(void *user, uint32_t index, int pid, int status)
{
    ferry_py_exits *b = user;
    (void)index;
    pthread_mutex_lock(&b->mu);
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        exit_entry *e = realloc(b->e, cap * sizeof *e);
        if (e) {
            b->e = e;
            b->cap = cap;
        }
    }
    if (b->n < b->cap) /* else out of memory: that worker's exit stays unknown */
        b->e[b->n++] = (exit_entry){.pid = pid, .status = status};
    pthread_cond_broadcast(&b->changed);
    pthread_mutex_unlock(&b->mu);
}

ferry_py_exits *ferry_py_exits_new(void)
{
    ferry_py_exits *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->owner = getpid();
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->changed, &ca);
    pthread_condattr_destroy(&ca);
    return b;
}

void ferry_py_exits_free(ferry_py_exits *b)
{
    if (!b)
        return;
    free(b->e);
    /* In a child forked from its owner (a loader object collected there),
     * a thread of the parent may have been waiting on the condition at the
     * fork: glibc's pthread_cond_destroy would wait for it for ever. The
     * copy is only freed. */
    if (getpid() == b->owner) {
        pthread_cond_destroy(&b->changed);
        pthread_mutex_destroy(&b->mu);
    }
    free(b);
}

/* The entry for `pid` at or after position `since`, or -1; b->mu held. */
static ssize_t find(const ferry_py_exits *b, size_t since, int pid)
{
    for (size_t i = since; i < b->n; i++) {
        if (b->e[i].pid == pid)
            return (ssize_t)i;
    }
    return -1;
}

/* Waits at most wait_ms for an entry of `pid` at or after `since`: its
 * index, or -1; b->mu held. */
static ssize_t wait_for(ferry_py_exits *b, size_t since, int pid, int64_t wait_ms)
{
    struct timespec ts = ferry__deadline_ts(CLOCK_MONOTONIC, wait_ms > 0 ? (uint64_t)wait_ms : 0);
    ssize_t at = find(b, since, pid);
    while (at < 0 && pthread_cond_timedwait(&b->changed, &b->mu, &ts) == 0)
        at = find(b, since, pid);
    return at;
}

size_t ferry_py_exits_seen(ferry_py_exits *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->n;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int ferry_py_exits_wait(ferry_py_exits *b, size_t since, int pid, int64_t wait_ms, int *status)
{
    pthread_mutex_lock(&b->mu);
    ssize_t at = wait_for(b, since, pid, wait_ms);
    if (at >= 0)
        *status = b->e[at].status;
    pthread_mutex_unlock(&b->mu);
    return at >= 0;
}
