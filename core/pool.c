/*
 * pool.c - local workers: watch, kill, reap (see pool.h); starting them is
 * pool_start.c's (pool_internal.h says what the two share).
 */
#include "pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "forkfds.h"
#include "forkserver.h"
#include "process.h"
#include "worker.h"

/* The shared task words of process workers (see struct ferry__pool).
 * FERRY_OK, or FERRY_ESYS/FERRY_ELIMIT with what is acquired left for
 * ferry__pool_free.
 *
 * A child the trainer forks (plain fork(), a DataLoader of its own, a
 * subprocess before exec) must keep no writable view of the loader's
 * memory: it could scribble over live bookkeeping, and it would pin the
 * pages once the loader has closed (issue 36.2). So the mapping is
 * MADV_DONTFORK (absent from any child), and the memfd is close-on-exec
 * and closed in a forked child at once (forkfds.h), so no child can map
 * it again either. Workers map the words from the fd they are passed;
 * posix_spawn's child shares this address space until it execs, so
 * MADV_DONTFORK takes nothing from it. */
static int map_task_words(ferry__pool *p)
{
    p->words_len = (size_t)p->o.n * FERRY__TASK_WORD_BYTES;
    ferry__forkfds_hold();
    p->task_fd = memfd_create("ferry-task-words", MFD_CLOEXEC);
    int e = errno;
    ferry__forkfds_add(p->task_fd);
    ferry__forkfds_release();
    if (p->task_fd < 0)
        return ferry__syserr(FERRY_ESYS, "memfd_create for the task words", e);
    if (ftruncate(p->task_fd, (off_t)p->words_len) != 0)
        return ferry__syserr(FERRY_ESYS, "sizing the task words", errno);
    void *m = mmap(NULL, p->words_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->task_fd, 0);
    if (m == MAP_FAILED)
        return ferry__syserr(FERRY_ESYS, "mapping the task words", errno);
    p->words = m;
    if (madvise(m, p->words_len, MADV_DONTFORK) != 0)
        return ferry__syserr(FERRY_ESYS, "keeping the task words from forked children", errno);
    return FERRY_OK;
}

int ferry__pool_new(ferry__pool **out, const ferry__pool_opts *o)
{
    ferry__pool *p = ferry__calloc(1, sizeof *p);
    if (!p)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the worker pool");
    p->o = *o;
    p->task_fd = -1;
    p->ctl = -1;
    p->fork = o->fork_server && !o->threads && o->n;
    p->w = ferry__calloc((size_t)o->n + 1, sizeof *p->w);
    p->owner = ferry__calloc(FERRY__POOL_POLL_ITEMS(o->n), sizeof *p->owner);
    p->asked = ferry__calloc((size_t)o->n + 1, sizeof *p->asked);
    if (!p->w || !p->owner || !p->asked) {
        ferry__pool_free(p);
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the worker pool");
    }
    for (uint32_t i = 0; i <= o->n; i++) { /* w[n]: the clean parent */
        p->w[i].pool = p;
        p->w[i].index = i;
        p->w[i].pidfd = -1;
        p->w[i].errfd = -1;
    }
    int rc = o->threads || !o->n ? FERRY_OK : map_task_words(p);
    if (rc != FERRY_OK) {
        ferry__pool_free(p);
        return rc;
    }
    *out = p;
    return FERRY_OK;
}

void ferry__pool_free(ferry__pool *p)
{
    if (!p || p->leaked)
        return;
    if (p->words)
        munmap((void *)p->words, p->words_len);
    ferry__forkfds_close(p->task_fd);
    ferry__forkfds_close(p->ctl);
    free(p->w);
    free(p->owner);
    free(p->asked);
    free(p);
}

pid_t ferry__pool_pid(ferry__pool *p, uint32_t i)
{
    return i < p->o.n ? atomic_load(&p->w[i].pid) : 0;
}

/* The clean parent, if one runs, killed and reaped, and its socket closed:
 * it forks nothing more. */

/* ------------------------------------------------------------------------
 * Watching
 */

/* The last few lines the worker wrote (at most 3, joined with " | "), or "":
 * typically the dataset's own message, then the crash handler's note. */
static void last_words(const local_worker *w, char *out, size_t cap)
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

/* Worker w's process `pid` has been reaped with wait status `status` (-1:
 * unknown): whoever asked is told (option exit_fn), and the process is let
 * go. The clean parent (index n) is nobody's business but the pool's. */
static void reaped(local_worker *w, pid_t pid, int status)
{
    const ferry__pool_opts *o = &w->pool->o;
    if (o->exit_fn && w->index < o->n)
        o->exit_fn(o->exit_user, w->index, (int)pid, status);
    ferry__pool_forget_process(w);
}

/* Reaps worker w's process if it has exited: returns 1 with its wait
 * status, or with *status -1 when someone else collected it. That happens
 * when the trainer sets SIGCHLD to SIG_IGN (the kernel reaps at once) or
 * reaps children in its own handler: waitpid then fails with ECHILD. The
 * pid is not signalled or waited for again, so a reused pid is never
 * touched; the pidfd, which said the process is gone, is closed. */
static int reap(local_worker *w, int *status)
{
    pid_t pid = atomic_load(&w->pid);
    if (!pid)
        return 0;
    pid_t r;
    do
        r = waitpid(pid, status, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r < 0 && errno == ECHILD)
        *status = -1;
    else if (r != pid)
        return 0;
    reaped(w, pid, *status);
    return 1;
}

int ferry__pool_poll_items(ferry__pool *p, zmq_pollitem_t *items)
{
    int n = 0;
    /* The clean parent's record is w[n]: its stderr and pidfd are polled as
     * a worker's, and its control socket last. */
    for (uint32_t i = 0; i <= p->o.n; i++) {
        if (p->w[i].errfd >= 0) {
            p->owner[n] = &p->w[i];
            items[n++] = (zmq_pollitem_t){.fd = p->w[i].errfd, .events = ZMQ_POLLIN};
        }
    }
    p->nerr = n;
    for (uint32_t i = 0; i <= p->o.n; i++) {
        if (p->w[i].pidfd >= 0) {
            p->owner[n] = &p->w[i];
            items[n++] = (zmq_pollitem_t){.fd = p->w[i].pidfd, .events = ZMQ_POLLIN};
        }
    }
    p->npid = n - p->nerr;
    if (p->ctl >= 0)
        items[n++] = (zmq_pollitem_t){.fd = p->ctl, .events = ZMQ_POLLIN};
    return n;
}

static void death_event(local_worker *w, pid_t pid, int status, ferry__pool_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = FERRY__POOL_DIED;
    ev->index = w->index;
    ev->pid = pid;
    ev->status = status;
    ev->task = w->index < w->pool->o.n ? atomic_load(&w->pool->words[w->index * WORD_STRIDE]) : 0;
    snprintf(ev->kill_reason, sizeof ev->kill_reason, "%s", w->kill_reason);
    last_words(w, ev->words, sizeof ev->words);
}

int ferry__pool_after_poll(ferry__pool *p, const zmq_pollitem_t *items, ferry__pool_event *ev)
{
    int nev = 0;
    for (int i = 0; i < p->nerr; i++) {
        if (items[i].revents)
            ferry__pool_pump_stderr(p->owner[i]);
    }
    int ctl_item = p->nerr + p->npid;
    if (p->ctl >= 0 && items[ctl_item].revents)
        ferry__pool_read_parent(p);
    for (int i = p->nerr; i < p->nerr + p->npid; i++) {
        local_worker *w = p->owner[i];
        pid_t pid = atomic_load(&w->pid);
        int status;
        if (!(items[i].revents & ZMQ_POLLIN) || !reap(w, &status))
            continue;
        death_event(w, pid, status, &ev[nev]);
        if (w->index < p->o.n || ferry__pool_parent_gone(p, &ev[nev]))
            nev++;
    }
    for (uint32_t i = 0; i < p->o.n; i++) {
        local_worker *w = &p->w[i];
        if (!w->thread_live || w->reported || !atomic_load(&w->done) || w->thread_rc == FERRY_OK)
            continue;
        w->reported = 1;
        memset(&ev[nev], 0, sizeof ev[nev]);
        ev[nev].kind = FERRY__POOL_THREAD_FAILED;
        ev[nev].index = i;
        ev[nev].code = w->thread_rc;
        snprintf(ev[nev].words, sizeof ev[nev].words, "%s", w->thread_msg);
        nev++;
    }
    return nev;
}

int ferry__pool_killable(ferry__pool *p, uint32_t i)
{
    return p->w[i].pidfd >= 0 && !p->w[i].killing;
}

int ferry__pool_killing(ferry__pool *p, uint32_t i)
{
    return p->w[i].killing;
}

int ferry__pool_kill(ferry__pool *p, uint32_t i, const char *reason)
{
    local_worker *w = &p->w[i];
    if (!ferry__pool_killable(p, i))
        return 0;
    snprintf(w->kill_reason, sizeof w->kill_reason, "%s", reason);
    w->killing = 1;
    pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
    return 1;
}

int ferry__pool_ready_overdue(ferry__pool *p, uint32_t i, uint64_t now_ms)
{
    return ferry__pool_killable(p, i) && now_ms >= p->w[i].ready_by_ms;
}

int ferry__pool_start_overdue(ferry__pool *p, uint32_t i, uint64_t now_ms)
{
    return p->w[i].pidfd < 0 && !p->w[i].killing && p->w[i].ready_by_ms &&
           now_ms >= p->w[i].ready_by_ms;
}

/* ------------------------------------------------------------------------
 * Shutdown
 */

void ferry__pool_reap_exited(ferry__pool *p)
{
    for (uint32_t i = 0; i < p->o.n; i++) {
        int status;
        reap(&p->w[i], &status);
    }
}

uint32_t ferry__pool_left(ferry__pool *p)
{
    uint32_t left = 0;
    for (uint32_t i = 0; i < p->o.n; i++) {
        local_worker *w = &p->w[i];
        if (atomic_load(&w->pid) || (w->thread_live && !atomic_load(&w->done)))
            left++;
    }
    return left;
}

void ferry__pool_signal(ferry__pool *p, int sig)
{
    for (uint32_t i = 0; i < p->o.n; i++) {
        if (p->w[i].pidfd >= 0)
            pidfd_send_signal(p->w[i].pidfd, sig, NULL, 0);
    }
}

void ferry__pool_kill_all(ferry__pool *p)
{
    ferry__pool_parent_stop(p);
    ferry__pool_signal(p, SIGKILL);
    for (uint32_t i = 0; i < p->o.n; i++) {
        local_worker *w = &p->w[i];
        pid_t pid = atomic_load(&w->pid);
        if (!pid)
            continue;
        int status;
        pid_t r;
        do
            r = waitpid(pid, &status, 0);
        while (r < 0 && errno == EINTR);
        reaped(w, pid, r == pid ? status : -1);
    }
}

void ferry__pool_cancel_threads(ferry__pool *p)
{
    atomic_store(&p->cancel, 1);
}

int ferry__pool_join_threads(ferry__pool *p, uint64_t grace_ms)
{
    int leaked = 0;
    ferry__pool_cancel_threads(p);
    uint64_t deadline = ferry__now_ms() + grace_ms;
    for (uint32_t i = 0; i < p->o.n; i++) {
        local_worker *w = &p->w[i];
        if (!w->thread_live)
            continue;
        uint64_t now = ferry__now_ms();
        struct timespec ts =
            ferry__deadline_ts(CLOCK_REALTIME, deadline > now ? deadline - now : 0);
        if (pthread_timedjoin_np(w->thread, NULL, &ts) != 0) {
            /* A thread stuck inside dataset code cannot be stopped safely; it
             * keeps the ZeroMQ context, which is then left alive. */
            ferry__logf(&p->o.log, FERRY_LOG_ERROR,
                        "worker thread %u did not stop within %llu ms of being told to; it is left "
                        "running, with the loader's ZeroMQ context",
                        i, (unsigned long long)grace_ms);
            pthread_detach(w->thread);
            leaked = 1;
        }
        w->thread_live = 0;
    }
    p->leaked |= leaked;
    return leaked;
}
