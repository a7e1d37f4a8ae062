/*
 * worker_main.c - the worker program, local or remote: ferry_worker_main(),
 * which tools/ferry-worker.c runs and any program can embed (the Python
 * package's `python -m ferry.worker` does, after registering its dataset
 * kind with ferry_dataset_register()).
 *
 * Local: started by a loader (posix_spawn, with --slot and --parent); the
 * loader names the dataset in the handshake, so the command line only says
 * where to connect. Runs one session of the worker loop (core/worker.c) and
 * exits. It must never outlive its loader: PR_SET_PDEATHSIG kills it when
 * the parent goes, the getppid() check right after closes the race where
 * the parent died before prctl ran, and the worker loop checks again each
 * time it is idle. SIGINT is ignored: Ctrl-C in a terminal goes to the whole
 * process group, and it is the trainer's to handle.
 *
 * Remote (`--connect tcp://HOST:PORT`, no --slot): a daemon started by
 * whatever runs the host (docs/remote.md). It serves one loader after
 * another: after a session ends (the loader closed, refused it, or went
 * silent) it connects again, backing off while nothing answers. CURVE keys
 * (--key, --server-key) are required unless --insecure. `--processes N` runs
 * N such workers under one supervisor: each is a fresh ferry-worker (spawned
 * from our own program with --parent, never forked), watched by pidfd,
 * restarted a second after it dies; SIGTERM is passed on. SIGTERM or SIGINT:
 * the current batch is finished, the loader gets BYE (it requeues what this
 * worker held), and the process exits. With --parent (the supervisor's
 * children) PR_SET_PDEATHSIG sends that SIGTERM when the parent goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ferry.h"
#include "ferry_dataset.h"
#include "keys.h"
#include "process.h"
#include "worker.h"

/* What the worker is doing, kept up to date by the worker loop so that a
 * crash inside dataset code can say which batch it was on. */
static ferry__worker_note note;
static char head[96]; /* "ferry-worker N (pid P): crashed while ", made at start */
static atomic_int stop_flag;

/* Last words on a fatal signal: async-signal-safe writes only, then the
 * default action, so the loader still sees the real signal. Before dying,
 * a short pause: ZeroMQ's I/O thread is still running and writes out the
 * replies this worker had already queued for the batches it finished.
 * Without it they die with the process, and the loader, finding those
 * tasks unanswered, charges the oldest of them instead of the batch that
 * crashed (seen as healthy batches given up in place of a poison one). */
static void on_fatal(int sig)
{
    char doing[160];
    size_t n = ferry__worker_note_format(&note, doing, sizeof doing);
    if (write(2, head, strnlen(head, sizeof head)) < 0 || write(2, doing, n) < 0 ||
        write(2, "\n", 1) < 0) {
        /* nothing more can be done */
    }
    struct timespec flush = {0, 100 * 1000000L};
    while (nanosleep(&flush, &flush) < 0 && errno == EINTR)
        ;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_stop(int sig)
{
    (void)sig;
    atomic_store(&stop_flag, 1);
}

/* How the program was started, for its usage line ("ferry-worker"). */
static const char *program_name = "ferry-worker";

static void usage(FILE *f)
{
    fprintf(f, "usage: %s --connect ENDPOINT [options]\n", program_name);
    fprintf(f,
               "  --connect ENDPOINT  the loader's endpoint (tcp://HOST:PORT for a remote worker)\n"
               "remote workers:\n"
               "  --key FILE          this worker's key pair (from ferry-keygen)\n"
               "  --server-key KEY    the loader's public key: a .pub file or 40 Z85 characters\n"
               "  --insecure          plain TCP without CURVE (trusted networks only)\n"
               "  --processes N       run N workers on this host under one supervisor\n"
               "                      that restarts any that dies (default 1)\n"
               "  --plugin-dir DIR    load dataset plugins from DIR only (default: none)\n"
               "  --once              serve one loader, then exit\n"
               "local workers (set by the loader that starts them):\n"
               "  --slot N            index the loader gave this worker\n"
               "  --task-fd FD        shared memory where it says which task it is building\n"
               "  --shm-fd FD         shared memory it writes batches into, where a task says\n"
               "  --data-fd FD        the dataset's bytes (option dataset_fd): closed here\n"
               "set by whatever starts this worker (a loader, or --processes):\n"
               "  --parent PID        exit when PID is no longer this process's parent\n"
               "  --help              this text\n"
               "  --version           the ferry version\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Sleeps up to ms, waking early when told to stop. */
static void nap(unsigned ms)
{
    while (ms > 0 && !atomic_load(&stop_flag)) {
        unsigned step = ms < 50 ? ms : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
}

/* Told to stop, or (with --parent) the parent is gone. */
static int should_stop(const ferry__worker_opts *o)
{
    return atomic_load(&stop_flag) || (o->parent && getppid() != o->parent);
}

/* A remote worker's life: sessions, one loader after another. A session
 * that ran (the dataset opened) is followed by a quick reconnect; one that did not
 * (nobody there, refused, key not allowed) by a backoff that doubles up to
 * 8 s, with jitter so a rack of workers does not knock in step. A worker
 * refused after its dataset opened (REFUSE: it sees another number of
 * items or another schema than the others) backs off too: its data will
 * not change by asking again at once. */
static int serve(ferry__worker_opts *o, int once)
{
    unsigned backoff = 250;
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    while (!should_stop(o)) {
        int configured = 0;
        o->configured = &configured;
        int rc = ferry__worker_run(o);
        if (should_stop(o))
            break;
        if (rc == FERRY_OK && once)
            return 0;
        if (configured && rc != FERRY_ECLOSED) {
            if (rc != FERRY_OK)
                fprintf(stderr, "ferry-worker (pid %d): session ended: %s; reconnecting\n",
                        (int)getpid(), ferry_last_error());
            backoff = 250;
            nap(100);
            continue;
        }
        fprintf(stderr, "ferry-worker (pid %d): %s; trying again in %u ms\n", (int)getpid(),
                ferry_last_error(), backoff);
        nap(backoff + (unsigned)rand() % (backoff / 4 + 1));
        if (backoff < 8000)
            backoff *= 2;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * --processes N: the supervisor
 *
 * The children are fresh ferry-worker processes (posix_spawn of our own
 * program with our options, minus --processes, plus --parent <our pid>),
 * never forks of this one. One poll() waits on every child's pidfd and on a
 * signalfd for SIGTERM and SIGINT, so a death or a stop is seen the moment
 * it happens; the only timeout is the next restart that is due.
 */

#define RESTART_DELAY_MS 1000 /* a dead child's replacement waits this long: no crash loop spin */
#define STOP_GRACE_MS 10000   /* children still running this long after SIGTERM get SIGKILL */

typedef struct supervised_child {
    pid_t pid;         /* 0: not running */
    int pidfd;         /* -1: not running */
    uint64_t start_at; /* when not running and not done: when to start it */
    int done;          /* --once: it served its loader and exited 0; not restarted */
} supervised_child;

/* Our own program, for the children: the file /proc/self/exe points to
 * (not the link itself, which would make every child's name "exe" in ps and
 * pgrep); without /proc, argv[0] if it is a path. NULL if neither. */
static const char *own_program(const char *argv0, char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n > 0 && (size_t)n < cap - 1) {
        buf[n] = '\0';
        if (access(buf, X_OK) == 0)
            return buf;
    }
    if (argv0 && strchr(argv0, '/') && access(argv0, X_OK) == 0)
        return argv0;
    return NULL;
}

/* Starts c; when that fails, says so and schedules another try. */
static void child_start(supervised_child *c, const char *self, char **argv)
{
    if (ferry__spawn(self, argv, -1, NULL, 0, &c->pid, &c->pidfd) == FERRY_OK)
        return;
    fprintf(stderr, "ferry-worker: could not start a worker process: %s; trying again in %d ms\n",
            ferry_last_error(), RESTART_DELAY_MS);
    c->start_at = ferry__now_ms() + RESTART_DELAY_MS;
}

/* Reaps c, whose pidfd said it exited; 0 with its status, -1 if it has not
 * exited after all (it stays watched). */
static int child_reap(supervised_child *c, int *status)
{
    pid_t r;
    while ((r = waitpid(c->pid, status, WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == 0)
        return -1;
    close(c->pidfd);
    c->pid = 0;
    c->pidfd = -1;
    return 0;
}

/* SIGTERM to every running child, up to STOP_GRACE_MS for them to leave
 * (a busy one finishes its batch and says BYE), then SIGKILL; every child
 * is reaped. fds has room for n. */
static void children_stop(supervised_child *kids, long n, struct pollfd *fds)
{
    for (long i = 0; i < n; i++) {
        if (kids[i].pid)
            pidfd_send_signal(kids[i].pidfd, SIGTERM, NULL, 0);
    }
    uint64_t deadline = ferry__now_ms() + STOP_GRACE_MS;
    for (;;) {
        int live = 0;
        for (long i = 0; i < n; i++) {
            fds[i] = (struct pollfd){.fd = kids[i].pidfd, .events = POLLIN};
            live += kids[i].pid != 0;
        }
        uint64_t now = ferry__now_ms();
        if (!live || now >= deadline)
            break;
        int r = poll(fds, (nfds_t)n, (int)(deadline - now));
        if (r < 0 && errno != EINTR)
            break;
        for (long i = 0; r > 0 && i < n; i++) {
            int status;
            if (fds[i].revents && kids[i].pid)
                child_reap(&kids[i], &status);
        }
    }
    for (long i = 0; i < n; i++) {
        if (!kids[i].pid)
            continue;
        fprintf(stderr,
                "ferry-worker: worker process %d still running %d ms after SIGTERM; killing it\n",
                (int)kids[i].pid, STOP_GRACE_MS);
        pidfd_send_signal(kids[i].pidfd, SIGKILL, NULL, 0);
        while (waitpid(kids[i].pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(kids[i].pidfd);
        kids[i].pid = 0;
        kids[i].pidfd = -1;
    }
}

/* Starts the children whose (re)start is due, fills their poll items
 * (fds[1..n]) and sets *timeout to the next start due (-1: none). Returns
 * how many children are still to be served. */
static int children_start_due(supervised_child *kids, long n, const char *self, char **argv,
                              struct pollfd *fds, int *timeout)
{
    uint64_t now = ferry__now_ms();
    int waiting = 0;
    *timeout = -1;
    for (long i = 0; i < n; i++) {
        supervised_child *c = &kids[i];
        if (!c->pid && !c->done && c->start_at <= now)
            child_start(c, self, argv);
        if (!c->pid && !c->done) {
            uint64_t due = c->start_at > now ? c->start_at - now : 0;
            if (*timeout < 0 || due < (uint64_t)*timeout)
                *timeout = (int)due;
        }
        waiting += !c->done;
        fds[i + 1] = (struct pollfd){.fd = c->pidfd, .events = POLLIN}; /* -1: ignored */
    }
    return waiting;
}

/* Reaps the children whose pidfd fired: under --once one that exited 0 is
 * done; any other is said and restarted after RESTART_DELAY_MS. */
static void children_reap_exited(supervised_child *kids, long n, const struct pollfd *fds, int once)
{
    for (long i = 0; i < n; i++) {
        supervised_child *c = &kids[i];
        int status;
        pid_t pid = c->pid;
        if (!fds[i + 1].revents || !pid || child_reap(c, &status) != 0)
            continue;
        if (once && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            c->done = 1;
            continue;
        }
        char how[256];
        ferry__describe_status(status, how, sizeof how);
        fprintf(stderr, "ferry-worker: worker process %d %s; starting another in %d ms\n", (int)pid,
                how, RESTART_DELAY_MS);
        c->start_at = ferry__now_ms() + RESTART_DELAY_MS;
    }
}

/* Runs n children of `self argv...` until SIGTERM or SIGINT (or, with
 * --once, until each has served its loader and exited 0). A child that dies
 * otherwise is restarted after RESTART_DELAY_MS. Returns the exit status:
 * 0, or 1 if the supervisor itself could not be set up. */
static int supervise(long n, const char *self, char **argv, int once)
{
    sigset_t stops, old;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    /* From here on a stop arrives through the signalfd; one that came
     * before has set stop_flag (on_stop). */
    sigprocmask(SIG_BLOCK, &stops, &old);
    int sfd = signalfd(-1, &stops, SFD_CLOEXEC | SFD_NONBLOCK);
    supervised_child *kids = calloc((size_t)n, sizeof *kids);
    struct pollfd *fds = calloc((size_t)n + 1, sizeof *fds);
    if (sfd < 0 || !kids || !fds) {
        fprintf(stderr, "ferry-worker: cannot supervise: %s\n",
                sfd < 0 ? strerror(errno) : "out of memory");
        if (sfd >= 0)
            close(sfd);
        free(kids);
        free(fds);
        sigprocmask(SIG_SETMASK, &old, NULL);
        return 1;
    }
    for (long i = 0; i < n; i++)
        kids[i].pidfd = -1;

    while (!atomic_load(&stop_flag)) {
        int timeout;
        if (!children_start_due(kids, n, self, argv, fds, &timeout))
            break; /* --once: all served */
        fds[0] = (struct pollfd){.fd = sfd, .events = POLLIN};
        int r = poll(fds, (nfds_t)n + 1, timeout);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "ferry-worker: poll: %s; stopping\n", strerror(errno));
            break;
        }
        if (fds[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
                ;
            atomic_store(&stop_flag, 1);
            break;
        }
        children_reap_exited(kids, n, fds, once);
    }
    children_stop(kids, n, fds);
    close(sfd);
    free(kids);
    free(fds);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return 0;
}

/* The children's command line: ours without --processes and --parent (the
 * tokens marked in drop), plus --parent <our pid>; with a prefix (the
 * program's relaunch command), the prefix in place of our argv[0]. NULL if out of memory;
 * free() it. parent_s holds the number. */
static char **child_argv(int argc, char **argv, char *const *prefix,
                         const unsigned char *drop, char *parent_s, size_t cap)
{
    size_t nprefix = 0;
    while (prefix && prefix[nprefix])
        nprefix++;
    char **out = calloc((size_t)argc + nprefix + 3, sizeof *out);
    if (!out)
        return NULL;
    int n = 0;
    for (size_t i = 0; i < nprefix; i++)
        out[n++] = prefix[i];
    for (int i = nprefix ? 1 : 0; i < argc; i++) {
        if (!drop[i])
            out[n++] = argv[i];
    }
    snprintf(parent_s, cap, "%d", (int)getpid());
    out[n++] = "--parent";
    out[n++] = parent_s;
    out[n] = NULL;
    return out;
}

/* A local worker's task word: the loader's shared memory at fd `fd`
 * (--task-fd), word `slot`. NULL without one, or when it does not map (the
 * loader then charges a death to the oldest task, as it does for remote
 * workers). The mapping lives as long as the process. */
static _Atomic uint64_t *task_word(long fd, long slot)
{
    struct stat st;
    if (fd < 0 || slot < 0 || fstat((int)fd, &st) != 0 ||
        (uint64_t)st.st_size < (uint64_t)(slot + 1) * FERRY__TASK_WORD_BYTES)
        return NULL;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    close((int)fd);
    if (m == MAP_FAILED)
        return NULL;
    return (_Atomic uint64_t *)((char *)m + slot * FERRY__TASK_WORD_BYTES);
}

/* A local worker's batch slots (--shm-fd): kept open, mapped when the
 * first task names a slot (the loader sizes the memory after this worker
 * started). -1 without one, or for a worker the loader did not start. */
static int shm_fd(long fd, long slot)
{
    if (fd < 0)
        return -1;
    if (slot < 0) {
        close((int)fd);
        return -1;
    }
    /* Not for whatever the dataset may start. */
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    return (int)fd;
}

/* The command line. */
typedef struct cli {
    const char *endpoint, *key, *server_key, *plugin_dir;
    long slot, parent, processes, task_fd, shm_fd;
    int insecure, once;
} cli;

/* Whether ep is tcp://HOST:PORT with a port in 1..65535 (HOST may be a
 * bracketed IPv6 address: the port is after the last colon). */
static int is_tcp_endpoint(const char *ep)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return 0;
    const char *host = ep + 6, *colon = strrchr(host, ':');
    long port;
    return colon && colon > host && parse_int(colon + 1, 1, 65535, &port) == 0;
}

/* 0 if --connect's endpoint can be connected to: tcp://HOST:PORT for a
 * remote worker; for a local one (--slot), the ipc:// (or tcp://) endpoint
 * its loader gave it. Else says why on stderr and returns 2: a mistyped
 * endpoint would otherwise have the daemon retry it forever. */
static int check_endpoint(const cli *c)
{
    const char *ep = c->endpoint;
    if (is_tcp_endpoint(ep) || (c->slot >= 0 && strncmp(ep, "ipc://", 6) == 0))
        return 0;
    if (c->slot >= 0)
        fprintf(stderr, "%s: --connect '%s' is not an ipc:// or tcp:// endpoint\n", program_name,
                ep);
    else if (strncmp(ep, "tcp://", 6) == 0)
        fprintf(stderr, "%s: --connect '%s' is not a tcp://HOST:PORT endpoint\n", program_name, ep);
    else if (!strstr(ep, "://"))
        fprintf(stderr,
                "%s: --connect '%s' is not a tcp:// endpoint: a remote worker connects to "
                "tcp://HOST:PORT (tcp://%s?)\n",
                program_name, ep, ep);
    else
        fprintf(stderr,
                "%s: --connect '%s' is not a tcp:// endpoint: a remote worker connects to "
                "tcp://HOST:PORT\n",
                program_name, ep);
    return 2;
}

/* Fills *c from argv, marking in drop the tokens a supervisor's children
 * must not inherit. -1 to go on, else the exit code: 0 after --help or
 * --version, 2 for a bad command line (an unusable endpoint included). */
static int parse_args(int argc, char **argv, unsigned char *drop, cli *c)
{
    *c = (cli){.slot = -1, .processes = 1, .task_fd = -1, .shm_fd = -1};
    long data_fd;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int taken = 1; /* tokens this option used */
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("%s %s\n", program_name, ferry_version());
            return 0;
        } else if (!strcmp(a, "--connect") && v) {
            c->endpoint = v;
        } else if (!strcmp(a, "--slot") && v && parse_int(v, 0, 65535, &c->slot) == 0) {
        } else if (!strcmp(a, "--parent") && v && parse_int(v, 1, 1L << 30, &c->parent) == 0) {
            drop[i] = drop[i + 1] = 1;
        } else if (!strcmp(a, "--task-fd") && v && parse_int(v, 3, 1L << 20, &c->task_fd) == 0) {
            drop[i] = drop[i + 1] = 1;
        } else if (!strcmp(a, "--shm-fd") && v && parse_int(v, 3, 1L << 20, &c->shm_fd) == 0) {
            drop[i] = drop[i + 1] = 1;
        } else if (!strcmp(a, "--data-fd") && v && parse_int(v, 3, 1L << 20, &data_fd) == 0) {
            /* The dataset's bytes (option dataset_fd) are for kinds that
             * read them (the Python package's); a C worker has none. */
            close((int)data_fd);
            drop[i] = drop[i + 1] = 1;
        } else if (!strcmp(a, "--processes") && v && parse_int(v, 1, 1024, &c->processes) == 0) {
            drop[i] = drop[i + 1] = 1;
        } else if (!strcmp(a, "--key") && v) {
            c->key = v;
        } else if (!strcmp(a, "--server-key") && v) {
            c->server_key = v;
        } else if (!strcmp(a, "--plugin-dir") && v) {
            c->plugin_dir = v;
        } else if (!strcmp(a, "--insecure")) {
            c->insecure = 1;
            taken = 0;
        } else if (!strcmp(a, "--once")) {
            c->once = 1;
            taken = 0;
        } else {
            fprintf(stderr, "%s: bad argument '%s'\n", program_name, a);
            usage(stderr);
            return 2;
        }
        i += taken;
    }
    if (!c->endpoint) {
        fprintf(stderr, "%s: --connect is required\n", program_name);
        usage(stderr);
        return 2;
    }
    return check_endpoint(c) != 0 ? 2 : -1;
}

/* CURVE keys for a tcp:// worker into o (pub, sec, srv are o's buffers),
 * or the warning for --insecure. 0, or the exit code. */
static int load_keys(const cli *c, ferry__worker_opts *o, char *pub, char *sec, char *srv)
{
    if (strncmp(c->endpoint, "tcp://", 6) != 0)
        return 0;
    if (c->insecure) {
        fprintf(stderr,
                "ferry-worker: WARNING: --insecure: this worker's connection to %s is "
                "neither authenticated nor encrypted\n",
                c->endpoint);
        return 0;
    }
    if (!c->key || !c->server_key) {
        fprintf(stderr, "ferry-worker: tcp:// needs --key (this worker's key pair) and "
                        "--server-key (the loader's public key), or --insecure\n");
        return 2;
    }
    if (ferry__key_pair_load(c->key, pub, sec) != FERRY_OK ||
        ferry__key_public_load(c->server_key, srv) != FERRY_OK) {
        fprintf(stderr, "ferry-worker: %s\n", ferry_last_error());
        return 2;
    }
    o->public_key = pub;
    o->secret_key = sec;
    o->server_key = srv;
    return 0;
}

/* Signals: last words on a crash; a remote worker stops on SIGTERM/SIGINT
 * (BYE to its loader), a local one ignores SIGINT (Ctrl-C is the
 * trainer's). */
static void install_handlers(const cli *c, int remote)
{
    signal(SIGPIPE, SIG_IGN);
    if (remote)
        snprintf(head, sizeof head, "ferry-worker (pid %d): crashed while ", (int)getpid());
    else
        snprintf(head, sizeof head, "ferry-worker %ld (pid %d): crashed while ", c->slot,
                 (int)getpid());
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &sa, NULL);
    if (!remote) {
        signal(SIGINT, SIG_IGN);
        return;
    }
    struct sigaction st;
    memset(&st, 0, sizeof st);
    st.sa_handler = on_stop;
    sigaction(SIGTERM, &st, NULL);
    sigaction(SIGINT, &st, NULL);
}

/* A --processes supervisor: its children are this program again. */
static int run_supervisor(const cli *c, int argc, char **argv, char *const *relaunch,
                          unsigned char *drop)
{
    char self_buf[PATH_MAX];
    const char *self =
        relaunch && relaunch[0] ? relaunch[0] : own_program(argv[0], self_buf, sizeof self_buf);
    char parent_s[24];
    char **args = child_argv(argc, argv, relaunch, drop, parent_s, sizeof parent_s);
    if (!self || !args) {
        fprintf(stderr, "ferry-worker: %s\n",
                !self ? "cannot find its own program to start workers from "
                        "(/proc/self/exe unreadable, and argv[0] is not a path)"
                      : "out of memory");
        free(args);
        return 1;
    }
    int rc = supervise(c->processes, self, args, c->once);
    free(args);
    return rc;
}

/* The program. drop has argc zeroed entries; the parser marks in it the
 * tokens a supervisor's children must not inherit (child_argv). */
static int run(int argc, char **argv, char *const *relaunch, unsigned char *drop)
{
    cli c;
    int rc = parse_args(argc, argv, drop, &c);
    if (rc >= 0)
        return rc;
    /* Without --slot, a remote worker: a daemon, or (with --parent) one of
     * a --processes supervisor's children. */
    int remote = c.slot < 0;
    char pub[FERRY__Z85_KEY + 1], sec[FERRY__Z85_KEY + 1], srv[FERRY__Z85_KEY + 1];
    ferry__worker_opts o = {.endpoint = c.endpoint,
                            .slot = (int)c.slot,
                            .parent = (pid_t)c.parent,
                            .handshake_ms = remote ? 30000 : 60000,
                            .keep_plugins = 1,
                            .task_word = task_word(c.task_fd, c.slot),
                            .shm_fd = shm_fd(c.shm_fd, c.slot),
                            .note = &note,
                            .cancel = &stop_flag,
                            .plugin_dir = c.plugin_dir,
                            .confine_plugins = remote};
    rc = load_keys(&c, &o, pub, sec, srv);
    if (rc != 0)
        return rc;
    install_handlers(&c, remote);
    /* Tied to the parent: a local worker is killed with its loader; a
     * remote one is stopped (SIGTERM: BYE to its loader) with its
     * supervisor. getppid() closes the race with a parent that died first. */
    if (c.parent) {
        prctl(PR_SET_PDEATHSIG, remote ? SIGTERM : SIGKILL);
        if (getppid() != (pid_t)c.parent)
            rc = 3; /* the parent is already gone */
    }
    if (rc == 0 && remote && c.processes > 1)
        rc = run_supervisor(&c, argc, argv, relaunch, drop); /* the children load their own keys */
    else if (rc == 0 && remote)
        rc = serve(&o, c.once);
    explicit_bzero(sec, sizeof sec);
    if (rc != 0 || remote)
        return rc;
    o.cancel = NULL;
    int run = ferry__worker_run(&o);
    if (run == FERRY_OK)
        return 0;
    /* Turned away (the dataset did not open, the loader is closing, another
     * protocol): the loader says why itself, once, in its own error or
     * log; a line from every worker too would only repeat it, or guess. */
    if (run != FERRY_ECLOSED && run != FERRY_EVERSION)
        fprintf(stderr, "ferry-worker %d (pid %d): %s\n", (int)c.slot, (int)getpid(),
                ferry_last_error());
    return 1;
}

int ferry_worker_main(int argc, char **argv, const char *name, char *const relaunch[])
{
    if (name)
        program_name = name;
    unsigned char *drop = calloc((size_t)argc + 1, 1);
    if (!drop) {
        fprintf(stderr, "%s: out of memory\n", program_name);
        return 1;
    }
    int rc = run(argc, argv, relaunch, drop);
    free(drop);
    return rc;
}
