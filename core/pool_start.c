/*
 * pool_start.c - starting local workers (see pool_internal.h): a thread, a
 * spawned process, or a process the clean parent forks (option
 * fork_server; forkserver.h), and the clean parent itself: forked by the
 * template (option fork_from) when there is one, else spawned; replaced
 * when it dies, stopped at close.
 */
#include "pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "forkfds.h"
#include "forkserver.h"
#include "process.h"
#include "worker.h"

/* The most a clean parent told to stop gets to finish the forks it was
 * asked for and leave before it is killed. */
#define PARENT_STOP_MS 200

/* What a fork of the clean parent writes first on its stderr: its pid and
 * a newline (python/ferry/worker.py, PID_MARK), in one write (so one read
 * has it whole). The clean parent answers each request with the pid too;
 * one killed between its fork and that answer would leave the fork
 * running, unknown to the pool, until its handshake timed out (and then a
 * zombie of the trainer's): adopt_forked reads the pid here instead. */
#define MARK "\001ferry-pid "

/* The pid at the start of buf[0, *n) if it begins with the mark (which is
 * then cut from buf), else 0 (buf as it was). */
static pid_t take_mark(char *buf, ssize_t *n)
{
    size_t len = sizeof MARK - 1;
    if ((size_t)*n < len || memcmp(buf, MARK, len) != 0)
        return 0;
    char *end = memchr(buf + len, '\n', (size_t)*n - len);
    if (!end)
        return 0;
    long pid = strtol(buf + len, NULL, 10);
    ssize_t cut = end + 1 - buf;
    memmove(buf, end + 1, (size_t)(*n - cut));
    *n -= cut;
    return pid > 0 ? (pid_t)pid : 0;
}

/* buf[0, n), what worker w wrote to stderr, passed on to ours; the end of
 * it kept for the message if the worker dies. */
static void pass_on(local_worker *w, const char *buf, ssize_t n)
{
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

/* Passes whatever worker w wrote to stderr on to ours, keeping the end of it
 * for the message if the worker dies (its pid mark, if any, dropped). */
void ferry__pool_pump_stderr(local_worker *w)
{
    char buf[4096];
    for (;;) {
        ssize_t n = read(w->errfd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        if (w->marked) {
            w->marked = 0;
            w->said = take_mark(buf, &n);
        }
        pass_on(w, buf, n);
    }
}

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

/* The fds the pool holds for its processes (the clean parent's control
 * socket, each process's stderr pipe and pidfd) are closed in any fork of
 * the trainer (forkfds.h), and so closed with ferry__forkfds_close. Each
 * is made with forks held off, so that none lands between. */
static int stderr_pipe(int fds[2])
{
    ferry__forkfds_hold();
    int rc = ferry__stderr_pipe(fds);
    if (rc == FERRY_OK) {
        ferry__forkfds_add(fds[0]);
        ferry__forkfds_add(fds[1]);
    }
    ferry__forkfds_release();
    return rc;
}

static int watch(pid_t pid)
{
    ferry__forkfds_hold();
    int fd = pidfd_open(pid, 0), e = errno;
    ferry__forkfds_add(fd);
    ferry__forkfds_release();
    errno = e;
    return fd;
}

/* w's process just spawned, forks held off: its pidfd and stderr pipe
 * registered, and no pid mark to look for on its stderr (spawned, not
 * forked by the clean parent). */
static void took_spawned(local_worker *w)
{
    ferry__forkfds_add(w->pidfd);
    ferry__forkfds_add(w->errfd);
    w->marked = 0;
    w->said = 0;
}

/* Worker w as a fresh process image. */
static int spawn_process(ferry__pool *p, local_worker *w)
{
    ferry__worker_launch l = launch_of(p, w->index);
    pid_t pid;
    ferry__forkfds_hold();
    int rc = ferry__spawn_worker(p->o.worker_path, p->o.worker_args, &l, &pid, &w->pidfd,
                                 &w->errfd);
    if (rc == FERRY_OK)
        took_spawned(w);
    ferry__forkfds_release();
    if (rc == FERRY_OK)
        atomic_store(&w->pid, pid);
    return rc;
}

/* A new control socket pair for the clean parent: ours in p->ctl, *theirs
 * to pass to it; both closed in any fork (forkfds). */
static int control_pair(ferry__pool *p, int *theirs)
{
    ferry__forkfds_hold();
    int rc = ferry__fork_socketpair(&p->ctl, theirs);
    if (rc == FERRY_OK) {
        ferry__forkfds_add(p->ctl);
        ferry__forkfds_add(*theirs);
    }
    ferry__forkfds_release();
    return rc;
}

/* Starts the clean parent: forked by the template at option fork_from (a
 * fork of the trainer the Python package makes per loader) when there is
 * one and it answers, else spawned. Its arguments: --fork-server, its
 * control socket (fd 3), the dataset to load, the data fd (4) if any. */
static int start_parent(ferry__pool *p)
{
    local_worker *w = &p->w[p->o.n];
    int theirs, rc = control_pair(p, &theirs);
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
        if (stderr_pipe(errpipe) == FERRY_OK) {
            int fds[] = {errpipe[1], theirs, p->o.data_fd};
            rc = ferry__fork_ask(p->o.fork_from, own, fds, npass + 1, p->o.start_timeout_ms, &pid);
            ferry__forkfds_close(errpipe[1]);
            if (rc == FERRY_OK && (w->pidfd = watch(pid)) < 0)
                rc = ferry__syserr(FERRY_ESPAWN, "watching the clean parent: pidfd_open", errno);
            if (rc == FERRY_OK) {
                w->errfd = errpipe[0];
                w->marked = 1;
                w->said = 0;
            } else {
                ferry__forkfds_close(errpipe[0]);
            }
        }
        if (rc != FERRY_OK) {
            ferry__logf(&p->o.log, FERRY_LOG_INFO,
                        "the clean parent's template could not fork it (%s); "
                        "spawning it",
                        ferry_last_error());
            /* A control socket of its own for the spawned one: a template
             * that answers late forks a clean parent with the one it was
             * sent, which must not serve this loader too (it finds its
             * peer closed and exits; the next ask reaps it). */
            ferry__forkfds_close(p->ctl);
            ferry__forkfds_close(theirs);
            p->ctl = -1;
            int again = control_pair(p, &theirs);
            if (again != FERRY_OK)
                return again;
            pass[0] = theirs;
        }
    }
    if (rc != FERRY_OK) {
        ferry__forkfds_hold();
        rc = ferry__spawn_piped(p->o.worker_path, p->o.worker_args, own, pass, npass, &pid,
                                &w->pidfd, &w->errfd);
        if (rc == FERRY_OK)
            took_spawned(w);
        ferry__forkfds_release();
    }
    ferry__forkfds_close(theirs);
    if (rc != FERRY_OK) {
        ferry__forkfds_close(p->ctl);
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

/* Whether the clean parent's end of its control socket is closed (it
 * died). */
static int parent_hung_up(const ferry__pool *p)
{
    struct pollfd pf = {.fd = p->ctl, .events = 0};
    return poll(&pf, 1, 0) == 1 && (pf.revents & (POLLHUP | POLLERR));
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
    if (stderr_pipe(errpipe) != FERRY_OK)
        return FERRY_ESPAWN;
    fds[0] = errpipe[1];
    rc = ferry__fork_request(p->ctl, own, fds, npass + 1);
    ferry__forkfds_close(errpipe[1]);
    if (rc != FERRY_OK && !parent_hung_up(p)) {
        ferry__forkfds_close(errpipe[0]);
        return rc;
    }
    /* Asked, or asked of a clean parent that has just died (killed as the
     * loader opens): its death, on its pidfd, asks the next one for every
     * worker on the list, and this pipe, with no writer, says that this
     * one was never forked. */
    w->errfd = errpipe[0];
    w->marked = 1;
    w->said = 0;
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
    ferry__forkfds_close(w->errfd);
    w->errfd = -1;
    if (spawn_process(p, w) != FERRY_OK)
        ferry__logf(&p->o.log, FERRY_LOG_ERROR, "could not start worker %u: %s", w->index,
                    ferry_last_error());
}

/* The most the pool waits, the clean parent gone, for the forks of the
 * requests it had not answered to say their pids (adopt_forked). */
#define ADOPT_MS 1000

/* The pid worker w's stderr starts with (MARK), read by deadline; 0 when
 * its pipe has no writer left (the clean parent never forked it) or
 * nothing came. What it wrote after the mark goes on as its stderr. */
static pid_t read_mark(local_worker *w, uint64_t deadline)
{
    char buf[4096];
    for (uint64_t now; (now = ferry__now_ms()) < deadline;) {
        struct pollfd pf = {.fd = w->errfd, .events = POLLIN};
        int r = poll(&pf, 1, (int)(deadline - now));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        ssize_t n = read(w->errfd, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return 0; /* EOF: no fork holds the pipe */
        w->marked = 0;
        w->said = take_mark(buf, &n);
        pass_on(w, buf, n);
        return w->said;
    }
    return 0;
}

/* Whether pid is a child of this process (the clean parent's forks are:
 * CLONE_PARENT), read from /proc/PID/stat: a pid said on a pipe is taken
 * only then. */
static int is_our_child(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *after = strrchr(buf, ')'); /* the name may hold spaces and parens */
    int ppid;
    char state;
    return after && sscanf(after + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)getpid();
}

/* The clean parent gone (dead or stopped), the workers asked of it and not
 * answered for: one it forked says its pid first on its stderr (MARK) and
 * is taken as answered, where it would have been left running, unknown,
 * until its handshake timed out (a clean parent SIGKILLed between a fork
 * and its answer); one it never forked leaves its pipe with no writer
 * (EOF at once) and stays asked, to be asked again or spawned. */
static void adopt_forked(ferry__pool *p)
{
    uint64_t deadline = ferry__now_ms() + ADOPT_MS;
    for (uint32_t k = 0; k < p->nasked;) {
        local_worker *w = &p->w[p->asked[k]];
        pid_t pid = w->said ? w->said : w->errfd >= 0 && w->marked ? read_mark(w, deadline) : 0;
        if (pid > 0 && is_our_child(pid) && (w->pidfd = watch(pid)) >= 0) {
            ferry__logf(&p->o.log, FERRY_LOG_INFO,
                        "worker %u (pid %d) was forked as its clean parent went: kept",
                        w->index, (int)pid);
            atomic_store(&w->pid, pid);
            p->nasked--;
            memmove(p->asked + k, p->asked + k + 1, (p->nasked - k) * sizeof *p->asked);
            continue;
        }
        k++;
    }
}

/* The clean parent, if one runs, killed and reaped: it forks nothing more. */
static void reap_parent(ferry__pool *p)
{
    local_worker *w = &p->w[p->o.n];
    pid_t pid = atomic_load(&w->pid);
    if (pid) {
        pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        ferry__pool_forget_process(w);
    }
}

static void kill_parent(ferry__pool *p)
{
    reap_parent(p);
    ferry__forkfds_close(p->ctl);
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
        ferry__pool_read_parent(p);
    kill_parent(p);
    adopt_forked(p);
    p->fork = 0;
    for (int64_t i; (i = take_asked(p)) >= 0;)
        spawn_instead(p, &p->w[i]);
}

/* The clean parent's answers: "R", and a pid (or an error) per request. */
void ferry__pool_read_parent(ferry__pool *p)
{
    for (;;) {
        ferry__fork_answer a;
        ferry__fork_read(p->ctl, &a);
        if (a.kind == FERRY__FORK_NONE || a.kind == FERRY__FORK_CLOSED)
            return; /* gone: its pidfd says so, with the status */
        if (a.kind == FERRY__FORK_READY) {
            p->parent_ready = 1;
            p->parent_early_deaths = 0;
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
            w->pidfd = watch(a.pid);
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
        ferry__forkfds_close(w->errfd);
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
            ferry__pool_read_parent(p);
    }
}

pid_t ferry__pool_said(ferry__pool *p, uint32_t i)
{
    if (i >= p->o.n)
        return 0;
    local_worker *w = &p->w[i];
    if (w->errfd >= 0 && w->marked)
        ferry__pool_pump_stderr(w); /* the mark may be in the pipe, unread */
    return w->said;
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

/* Closes what the pool held for a process that is gone. */
void ferry__pool_forget_process(local_worker *w)
{
    ferry__forkfds_close(w->pidfd);
    w->pidfd = -1;
    if (w->errfd >= 0) {
        ferry__pool_pump_stderr(w);
        ferry__forkfds_close(w->errfd);
        w->errfd = -1;
    }
    atomic_store(&w->pid, 0);
}

/* The clean parent was reaped (ev says how): its control socket is
 * closed. One that had been ready goes out as FERRY__POOL_PARENT_DIED
 * (returns 1): the workers it forked are the loader's children and go on,
 * and those it had not forked yet are asked of the next one
 * (ferry__pool_parent_restart). So does one SIGKILLed before it was ready
 * (the first since one was ready): killed from outside as the loader
 * opened (the OOM killer, a user), it is no sign the next will die too,
 * and spawned workers cannot have what only a fork of the trainer has (a
 * dataset lent by fork, a multiprocessing Value). One that dies otherwise
 * before it was ready (a worker program without --fork-server, a dataset
 * module that crashes the interpreter on import), or is SIGKILLed again,
 * is no reason to fail: workers are spawned from then on, and their own
 * start says what is wrong (returns 0). */
int ferry__pool_parent_gone(ferry__pool *p, ferry__pool_event *ev)
{
    ev->kind = FERRY__POOL_PARENT_DIED;
    if (p->ctl >= 0)
        ferry__pool_read_parent(p); /* answers it gave before dying */
    ferry__forkfds_close(p->ctl);
    p->ctl = -1;
    adopt_forked(p); /* forks it made and had not answered for */
    int was_ready = p->parent_ready;
    p->parent_ready = 0;
    /* (ferry kills a clean parent only when it stops it, and does not
     * restart it then) */
    if (was_ready || (ferry__sigkilled(ev->status) && p->parent_early_deaths++ == 0))
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
        ferry__pool_read_parent(p);
    kill_parent(p);
    adopt_forked(p); /* so that they are stopped with the others */
    p->fork = 0; /* closing: nothing is forked any more */
    for (int64_t i; (i = take_asked(p)) >= 0;) {
        ferry__forkfds_close(p->w[i].errfd);
        p->w[i].errfd = -1;
    }
}
