/*
 * pool.c - local workers: spawn, watch, kill, reap (see pool.h).
 *
 * Each worker's record is the scheduler thread's, except `pid` (read by
 * ferry_loader_worker_pid from the trainer's thread, hence atomic) and a
 * thread worker's result (written by that thread before it sets `done`).
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "process.h"
#include "worker.h"

typedef struct local_worker {
    ferry__pool *pool;
    uint32_t index;
    _Atomic pid_t pid; /* 0 for a thread or when not running */
    int pidfd;         /* -1 when none */
    int errfd;         /* read end of its stderr, -1 when none */
    char tail[512];    /* the end of what it wrote to stderr */
    size_t tail_len;
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
     * worker and says which task killed it. */
    int task_fd;
    _Atomic uint64_t *words;
    size_t words_len;
};

#define WORD_STRIDE (FERRY__TASK_WORD_BYTES / sizeof(uint64_t))

/* The shared task words of process workers (see struct ferry__pool). */
static int map_task_words(ferry__pool *p)
{
    p->words_len = (size_t)p->o.n * FERRY__TASK_WORD_BYTES;
    p->task_fd = memfd_create("ferry-task-words", MFD_CLOEXEC);
    if (p->task_fd < 0)
        return ferry__syserr(FERRY_ESYS, "memfd_create for the task words", errno);
    if (ftruncate(p->task_fd, (off_t)p->words_len) != 0)
        return ferry__syserr(FERRY_ESYS, "sizing the task words", errno);
    void *m = mmap(NULL, p->words_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->task_fd, 0);
    if (m == MAP_FAILED)
        return ferry__syserr(FERRY_ESYS, "mapping the task words", errno);
    p->words = m;
    return FERRY_OK;
}

int ferry__pool_new(ferry__pool **out, const ferry__pool_opts *o)
{
    ferry__pool *p = ferry__calloc(1, sizeof *p);
    if (!p)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the worker pool");
    p->o = *o;
    p->task_fd = -1;
    p->w = ferry__calloc(o->n ? o->n : 1, sizeof *p->w);
    p->owner = ferry__calloc(2 * (size_t)(o->n ? o->n : 1), sizeof *p->owner);
    if (!p->w || !p->owner) {
        ferry__pool_free(p);
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the worker pool");
    }
    for (uint32_t i = 0; i < o->n; i++) {
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
    if (p->task_fd >= 0)
        close(p->task_fd);
    free(p->w);
    free(p->owner);
    free(p);
}

pid_t ferry__pool_pid(ferry__pool *p, uint32_t i)
{
    return i < p->o.n ? atomic_load(&p->w[i].pid) : 0;
}

/* ------------------------------------------------------------------------
 * Starting
 */

static void *thread_main(void *arg)
{
    local_worker *w = arg;
    ferry__pool *p = w->pool;
    ferry__worker_opts wo = {.endpoint = p->o.endpoint,
                             .slot = (int)w->index,
                             .zctx = p->o.zctx,
                             .cancel = &p->cancel,
                             .handshake_ms = p->o.start_timeout_ms,
                             /* The same slots as a process worker's, mapped
                              * again here: a batch is written into its slot
                              * and the trainer's batch is a view of it. */
                             .shm_fd = p->o.shm_fd > 0 ? p->o.shm_fd : 0,
                             /* A plugin may have started threads (an OpenMP pool)
                              * that outlive its loader: unloading it would leave
                              * them running unmapped code. */
                             .keep_plugins = 1};
    int rc = ferry__worker_run(&wo);
    w->thread_rc = rc;
    if (rc != FERRY_OK)
        snprintf(w->thread_msg, sizeof w->thread_msg, "%s", ferry_last_error());
    atomic_store(&w->done, 1);
    if (rc != FERRY_OK && !atomic_load(&p->cancel)) {
        uint64_t one = 1;
        while (write(p->o.wake_fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
    }
    return NULL;
}

static int start_thread(local_worker *w)
{
    atomic_store(&w->done, 0);
    w->reported = 0;
    int e = pthread_create(&w->thread, NULL, thread_main, w);
    if (e)
        return ferry__syserr(FERRY_ESPAWN, "could not start a worker thread", e);
    w->thread_live = 1;
    return FERRY_OK;
}

int ferry__pool_start(ferry__pool *p, uint32_t i)
{
    local_worker *w = &p->w[i];
    w->killing = 0;
    w->kill_reason[0] = '\0';
    w->tail_len = 0;
    w->ready_by_ms = ferry__now_ms() + (uint64_t)p->o.start_timeout_ms;
    /* A process worker holds a pidfd and a stderr pipe, and its connection
     * an accepted socket; a thread worker a socket pair and a mailbox. Four
     * beyond that are left for the trainer. */
    char what[48];
    snprintf(what, sizeof what, "starting worker %u", i);
    int rc = ferry__fd_headroom(8, what);
    if (rc != FERRY_OK)
        return rc;
    if (p->o.threads)
        return start_thread(w);
    pid_t pid;
    atomic_store(&p->words[i * WORD_STRIDE], 0);
    rc = ferry__spawn_worker(p->o.worker_path, p->o.worker_args, p->o.endpoint, (int)i, p->task_fd,
                             p->o.shm_fd, &pid, &w->pidfd, &w->errfd);
    if (rc == FERRY_OK)
        atomic_store(&w->pid, pid);
    return rc;
}

/* ------------------------------------------------------------------------
 * Watching
 */

/* Passes whatever worker w wrote to stderr on to ours, keeping the end of it
 * for the message if the worker dies. */
static void pump_stderr(local_worker *w)
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

/* Closes what the pool held for a process that is gone. */
static void forget_process(local_worker *w)
{
    close(w->pidfd);
    w->pidfd = -1;
    if (w->errfd >= 0) {
        pump_stderr(w);
        close(w->errfd);
        w->errfd = -1;
    }
    atomic_store(&w->pid, 0);
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
    forget_process(w);
    return 1;
}

int ferry__pool_poll_items(ferry__pool *p, zmq_pollitem_t *items)
{
    int n = 0;
    for (uint32_t i = 0; i < p->o.n; i++) {
        if (p->w[i].errfd >= 0) {
            p->owner[n] = &p->w[i];
            items[n++] = (zmq_pollitem_t){.fd = p->w[i].errfd, .events = ZMQ_POLLIN};
        }
    }
    p->nerr = n;
    for (uint32_t i = 0; i < p->o.n; i++) {
        if (p->w[i].pidfd >= 0) {
            p->owner[n] = &p->w[i];
            items[n++] = (zmq_pollitem_t){.fd = p->w[i].pidfd, .events = ZMQ_POLLIN};
        }
    }
    p->npid = n - p->nerr;
    return n;
}

static void death_event(local_worker *w, pid_t pid, int status, ferry__pool_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = FERRY__POOL_DIED;
    ev->index = w->index;
    ev->pid = pid;
    ev->status = status;
    ev->task = atomic_load(&w->pool->words[w->index * WORD_STRIDE]);
    snprintf(ev->kill_reason, sizeof ev->kill_reason, "%s", w->kill_reason);
    last_words(w, ev->words, sizeof ev->words);
}

int ferry__pool_after_poll(ferry__pool *p, const zmq_pollitem_t *items, ferry__pool_event *ev)
{
    int nev = 0;
    for (int i = 0; i < p->nerr; i++) {
        if (items[i].revents)
            pump_stderr(p->owner[i]);
    }
    for (int i = p->nerr; i < p->nerr + p->npid; i++) {
        local_worker *w = p->owner[i];
        pid_t pid = atomic_load(&w->pid);
        int status;
        if ((items[i].revents & ZMQ_POLLIN) && reap(w, &status))
            death_event(w, pid, status, &ev[nev++]);
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
    ferry__pool_signal(p, SIGKILL);
    for (uint32_t i = 0; i < p->o.n; i++) {
        local_worker *w = &p->w[i];
        pid_t pid = atomic_load(&w->pid);
        if (!pid)
            continue;
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        forget_process(w);
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
