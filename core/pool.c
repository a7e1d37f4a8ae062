/*
 * pool.c - local workers: spawn, watch, kill, reap (see pool.h).
 *
 * Each worker's record is the scheduler thread's, except `pid` (read by
 * ferry_loader_worker_pid from the trainer's thread, hence atomic) and a
 * thread worker's result (written by that thread before it sets `done`).
 */
#include "pool.h"

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
    uint32_t *asked;
    uint32_t nasked;
};

#define WORD_STRIDE (FERRY__TASK_WORD_BYTES / sizeof(uint64_t))

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
    p->task_fd = memfd_create("ferry-task-words", MFD_CLOEXEC);
    if (p->task_fd < 0)
        return ferry__syserr(FERRY_ESYS, "memfd_create for the task words", errno);
    ferry__forkfds_add(p->task_fd);
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
    if (p->task_fd >= 0) {
        ferry__forkfds_remove(p->task_fd);
        close(p->task_fd);
    }
    if (p->ctl >= 0)
        close(p->ctl);
    free(p->w);
    free(p->owner);
    free(p->asked);
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
                             /* The same slots as a process worker's, through
                              * the loader's own mapping: a batch is written
                              * into its slot, the trainer's batch is a view
                              * of it, and the process maps each page once. */
                             .shm_fd = p->o.shm_fd > 0 ? p->o.shm_fd : 0,
                             .shm = p->o.shm,
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

static ferry__worker_launch launch_of(const ferry__pool *p, uint32_t i)
{
    return (ferry__worker_launch){.endpoint = p->o.endpoint,
                                  .slot = (int)i,
                                  .task_fd = p->task_fd,
                                  .shm_fd = p->o.shm_fd,
                                  .data_fd = p->o.data_fd};
}

/* Worker w as a fresh process image. */
static int spawn_process(ferry__pool *p, local_worker *w)
{
    ferry__worker_launch l = launch_of(p, w->index);
    pid_t pid;
    int rc = ferry__spawn_worker(p->o.worker_path, p->o.worker_args, &l, &pid, &w->pidfd,
                                 &w->errfd);
    if (rc == FERRY_OK)
        atomic_store(&w->pid, pid);
    return rc;
}

/* ------------------------------------------------------------------------
 * The clean parent (option fork_server; forkserver.h)
 */

/* Starts the clean parent: forked by the template at option fork_from (a
 * fork of the trainer the Python package makes per loader) when there is
 * one and it answers, else spawned. Its arguments: --fork-server, its
 * control socket (fd 3), the dataset to load, the data fd (4) if any. */
static int start_parent(ferry__pool *p)
{
    local_worker *w = &p->w[p->o.n];
    int theirs, rc = ferry__fork_socketpair(&p->ctl, &theirs);
    if (rc != FERRY_OK)
        return rc;
    char parent_s[24], data_s[16];
    snprintf(parent_s, sizeof parent_s, "%d", (int)getpid());
    snprintf(data_s, sizeof data_s, "%d", FERRY__PASSED_FD + 1);
    char *own[] = {"--fork-server", "--control-fd", "3", "--parent", parent_s,
                   "--dataset", (char *)(p->o.dataset ? p->o.dataset : ""),
                   p->o.data_fd >= 0 ? "--data-fd" : NULL, data_s, NULL};
    int pass[] = {theirs, p->o.data_fd};
    int npass = p->o.data_fd >= 0 ? 2 : 1;
    pid_t pid = 0;
    rc = FERRY_ESPAWN;
    if (p->o.fork_from >= 0) {
        int errpipe[2];
        if (ferry__stderr_pipe(errpipe) == FERRY_OK) {
            int fds[] = {errpipe[1], theirs, p->o.data_fd};
            rc = ferry__fork_ask(p->o.fork_from, own, fds, npass + 1, p->o.start_timeout_ms, &pid);
            close(errpipe[1]);
            if (rc == FERRY_OK && (w->pidfd = pidfd_open(pid, 0)) < 0)
                rc = ferry__syserr(FERRY_ESPAWN, "watching the clean parent: pidfd_open", errno);
            if (rc == FERRY_OK)
                w->errfd = errpipe[0];
            else
                close(errpipe[0]);
        }
        if (rc != FERRY_OK)
            ferry__logf(&p->o.log, FERRY_LOG_INFO,
                        "the clean parent's template could not fork it (%s); "
                        "spawning it",
                        ferry_last_error());
    }
    if (rc != FERRY_OK)
        rc = ferry__spawn_piped(p->o.worker_path, p->o.worker_args, own, pass, npass, &pid,
                                &w->pidfd, &w->errfd);
    close(theirs);
    if (rc != FERRY_OK) {
        close(p->ctl);
        p->ctl = -1;
        return rc;
    }
    w->tail_len = 0;
    w->killing = 0;
    w->kill_reason[0] = '\0';
    p->parent_ready = 0;
    atomic_store(&w->pid, pid);
    return FERRY_OK;
}

/* Asks the clean parent (started if none runs) for worker i. */
static int ask_parent(ferry__pool *p, uint32_t i)
{
    local_worker *w = &p->w[i];
    int rc = p->ctl >= 0 ? FERRY_OK : start_parent(p);
    if (rc != FERRY_OK)
        return rc;
    char *own[FERRY__OWN_ARGS_MAX + 1], nums[FERRY__PASSED_MAX + 2][24];
    int fds[FERRY__PASSED_MAX + 1], npass;
    ferry__worker_launch l = launch_of(p, i);
    ferry__worker_own_args(&l, own, fds + 1, &npass, nums);
    int errpipe[2];
    if (ferry__stderr_pipe(errpipe) != FERRY_OK)
        return FERRY_ESPAWN;
    fds[0] = errpipe[1];
    rc = ferry__fork_request(p->ctl, own, fds, npass + 1);
    close(errpipe[1]);
    if (rc != FERRY_OK) {
        close(errpipe[0]);
        return rc;
    }
    w->errfd = errpipe[0];
    p->asked[p->nasked++] = i;
    return FERRY_OK;
}

/* The oldest worker asked of the clean parent, taken off the list; -1. */
static int64_t take_asked(ferry__pool *p)
{
    if (!p->nasked)
        return -1;
    uint32_t i = p->asked[0];
    memmove(p->asked, p->asked + 1, --p->nasked * sizeof *p->asked);
    return i;
}

/* Worker w, asked of the clean parent and not forked, spawned instead:
 * the stderr pipe made for the fork goes. A failure is logged; the worker
 * stays unstarted and its start deadline catches it. */
static void spawn_instead(ferry__pool *p, local_worker *w)
{
    if (w->errfd >= 0)
        close(w->errfd);
    w->errfd = -1;
    if (spawn_process(p, w) != FERRY_OK)
        ferry__logf(&p->o.log, FERRY_LOG_ERROR, "could not start worker %u: %s", w->index,
                    ferry_last_error());
}

static void read_parent(ferry__pool *p);
static void forget_process(local_worker *w);

/* The clean parent, if one runs, killed and reaped, and its socket closed:
 * it forks nothing more. */
/* The clean parent, if one runs, killed and reaped: it forks nothing more. */
static void reap_parent(ferry__pool *p)
{
    local_worker *w = &p->w[p->o.n];
    pid_t pid = atomic_load(&w->pid);
    if (pid) {
        pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        forget_process(w);
    }
}

static void kill_parent(ferry__pool *p)
{
    reap_parent(p);
    if (p->ctl >= 0)
        close(p->ctl);
    p->ctl = -1;
}

/* Workers are spawned from now on; those asked and not forked are spawned
 * now. A clean parent still running is stopped first, having said which
 * it forked already: it must fork none of those spawned here. */
static void give_up_forking(ferry__pool *p, const char *why)
{
    if (p->fork)
        ferry__logf(&p->o.log, FERRY_LOG_WARN,
                    "worker processes are spawned, not forked by a clean parent: %s", why);
    if (p->ctl >= 0)
        read_parent(p);
    kill_parent(p);
    p->fork = 0;
    for (int64_t i; (i = take_asked(p)) >= 0;)
        spawn_instead(p, &p->w[i]);
}

/* The clean parent's answers: "R", and a pid (or an error) per request. */
static void read_parent(ferry__pool *p)
{
    for (;;) {
        ferry__fork_answer a;
        ferry__fork_read(p->ctl, &a);
        if (a.kind == FERRY__FORK_NONE || a.kind == FERRY__FORK_CLOSED)
            return; /* gone: its pidfd says so, with the status */
        if (a.kind == FERRY__FORK_READY) {
            p->parent_ready = 1;
            continue;
        }
        int64_t i = take_asked(p);
        if (i < 0)
            continue; /* an answer to nothing: ignored */
        local_worker *w = &p->w[i];
        if (a.kind == FERRY__FORK_PID) {
            /* Our child (CLONE_PARENT), so its pid cannot be reused before
             * we reap it: pidfd_open is race-free. ESRCH: a trainer that
             * reaps every child has done so already; its death is then seen
             * as an exit of unknown status when the worker fails to connect. */
            w->pidfd = pidfd_open(a.pid, 0);
            if (w->pidfd >= 0)
                atomic_store(&w->pid, a.pid);
            continue;
        }
        ferry__logf(&p->o.log, FERRY_LOG_WARN,
                    "the clean parent could not fork worker %u (%s); spawning it",
                    (unsigned)i, a.text);
        spawn_instead(p, w);
    }
}

void ferry__pool_parent_restart(ferry__pool *p)
{
    if (!p->fork)
        return;
    uint32_t n = p->nasked, again[n ? n : 1];
    for (uint32_t k = 0; k < n; k++) {
        again[k] = p->asked[k];
        local_worker *w = &p->w[again[k]];
        if (w->errfd >= 0)
            close(w->errfd);
        w->errfd = -1;
    }
    p->nasked = 0;
    /* Started now, not at the next worker's start: a death later is then
     * answered by a fork at once. */
    int rc = start_parent(p);
    if (rc != FERRY_OK) {
        for (uint32_t k = 0; k < n; k++)
            p->asked[p->nasked++] = again[k];
        give_up_forking(p, ferry_last_error());
        return;
    }
    for (uint32_t k = 0; k < n; k++) {
        rc = ask_parent(p, again[k]);
        if (rc != FERRY_OK) {
            /* Those not asked yet go back on the list, to be spawned. */
            for (uint32_t j = k; j < n; j++)
                p->asked[p->nasked++] = again[j];
            give_up_forking(p, ferry_last_error());
            return;
        }
    }
}

void ferry__pool_await_fork(ferry__pool *p, uint32_t i, int timeout_ms)
{
    uint64_t deadline = ferry__now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int asked = 0;
        for (uint32_t k = 0; k < p->nasked; k++)
            asked |= p->asked[k] == i;
        uint64_t now = ferry__now_ms();
        if (!asked || p->ctl < 0 || now >= deadline)
            return;
        struct pollfd pf = {.fd = p->ctl, .events = POLLIN};
        if (poll(&pf, 1, (int)(deadline - now)) > 0)
            read_parent(p);
    }
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
    atomic_store(&p->words[i * WORD_STRIDE], 0);
    if (p->fork) {
        rc = ask_parent(p, i);
        if (rc == FERRY_OK)
            return rc;
        give_up_forking(p, ferry_last_error());
    }
    return spawn_process(p, w);
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

/* The clean parent was reaped (ev says how): its control socket is
 * closed. One that had been ready goes out as FERRY__POOL_PARENT_DIED
 * (returns 1): the workers it forked are the loader's children and go on,
 * and those it had not forked yet are asked of the next one
 * (ferry__pool_parent_restart). One that died before it was ready (a
 * worker program without --fork-server, a dataset module that crashes the
 * interpreter on import) is no reason to fail: workers are spawned from
 * then on, and their own start says what is wrong (returns 0). */
static int parent_gone(ferry__pool *p, ferry__pool_event *ev)
{
    ev->kind = FERRY__POOL_PARENT_DIED;
    if (p->ctl >= 0)
        read_parent(p); /* answers it gave before dying */
    if (p->ctl >= 0)
        close(p->ctl);
    p->ctl = -1;
    int was_ready = p->parent_ready;
    p->parent_ready = 0;
    if (was_ready)
        return 1;
    char how[256], why[FERRY__ERRMSG_MAX];
    if (ev->status == -1)
        snprintf(how, sizeof how, "exited");
    else
        ferry__describe_status(ev->status, how, sizeof how);
    snprintf(why, sizeof why, "the clean parent (pid %d) %s before it was ready%s%s", (int)ev->pid,
             how, ev->words[0] ? "; its last words: " : "", ev->words);
    give_up_forking(p, why);
    return 0;
}

/* The most a clean parent told to stop gets to finish the forks it was
 * asked for and leave before it is killed. */
#define PARENT_STOP_MS 200

void ferry__pool_parent_stop(ferry__pool *p)
{
    /* Told first, killed only if it does not go: with our side of the
     * socket shut for writing it reads the end of its requests, so it
     * answers the forks it was asked for and exits. A SIGKILL at once
     * could land between a fork and its "P" answer, and leave a worker
     * that no one knows of running after close until its handshake timed
     * out (seen at the close that follows a retirement, whose replacement
     * is asked for as the last batches come). */
    local_worker *pw = &p->w[p->o.n];
    if (atomic_load(&pw->pid) && p->ctl >= 0 && shutdown(p->ctl, SHUT_WR) == 0) {
        struct pollfd pf = {.fd = pw->pidfd, .events = POLLIN};
        uint64_t deadline = ferry__now_ms() + PARENT_STOP_MS;
        for (uint64_t now; (now = ferry__now_ms()) < deadline;) {
            if (poll(&pf, 1, (int)(deadline - now)) >= 0 || errno != EINTR)
                break;
        }
    }
    /* Reaped, so it forks nothing more; then the answers it sent before
     * going are read: a worker it forked for a request (a replacement,
     * say) whose pid was still in the socket would be known to no one,
     * not stopped with the others, and left running after close until its
     * handshake timed out. */
    reap_parent(p);
    if (p->ctl >= 0)
        read_parent(p);
    kill_parent(p);
    p->fork = 0; /* closing: nothing is forked any more */
    for (int64_t i; (i = take_asked(p)) >= 0;) {
        close(p->w[i].errfd);
        p->w[i].errfd = -1;
    }
}

int ferry__pool_after_poll(ferry__pool *p, const zmq_pollitem_t *items, ferry__pool_event *ev)
{
    int nev = 0;
    for (int i = 0; i < p->nerr; i++) {
        if (items[i].revents)
            pump_stderr(p->owner[i]);
    }
    int ctl_item = p->nerr + p->npid;
    if (p->ctl >= 0 && items[ctl_item].revents)
        read_parent(p);
    for (int i = p->nerr; i < p->nerr + p->npid; i++) {
        local_worker *w = p->owner[i];
        pid_t pid = atomic_load(&w->pid);
        int status;
        if (!(items[i].revents & ZMQ_POLLIN) || !reap(w, &status))
            continue;
        death_event(w, pid, status, &ev[nev]);
        if (w->index < p->o.n || parent_gone(p, &ev[nev]))
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
