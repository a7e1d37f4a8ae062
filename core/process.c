/*
 * process.c - worker processes: find, start, explain (see process.h).
 */
#include "process.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "error.h"

extern char **environ;

/* ---- Finding the worker program ---- */

/* The installed bin/ as seen from the installed lib/ ("../bin" for the
 * usual layout), set by CMake from CMAKE_INSTALL_LIBDIR and _BINDIR. Only
 * this relative step is compiled in, never the prefix, so a prefix moved
 * or copied elsewhere still finds its own worker. */
#ifndef FERRY_LIBDIR_TO_BINDIR
#define FERRY_LIBDIR_TO_BINDIR "../bin"
#endif

#define WORKER_PROGRAM "ferry-worker"

/* Every place a search tried and why it failed, for the one error that
 * names them all: "PLACE (what it is): why; PLACE ...". Cut at its size
 * on purpose: the error sentence is cut at the same size anyway. */
typedef struct worker_search {
    char tried[FERRY__ERRMSG_MAX];
    size_t len;
} worker_search;

static void search_note(worker_search *ws, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void search_note(worker_search *ws, const char *fmt, ...)
{
    size_t room = sizeof ws->tried - ws->len;
    if (room <= 1)
        return;
    if (ws->len > 0) {
        int n = snprintf(ws->tried + ws->len, room, "; ");
        ws->len += (size_t)n < room ? (size_t)n : room - 1;
        room = sizeof ws->tried - ws->len;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ws->tried + ws->len, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        ws->len += (size_t)n < room ? (size_t)n : room - 1;
}

/* 0 if `path` is a program we may run, else an errno saying why not. A
 * directory passes access(X_OK), so the file type is checked first. */
static int runnable(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return errno;
    if (!S_ISREG(st.st_mode))
        return S_ISDIR(st.st_mode) ? EISDIR : EACCES;
    return access(path, X_OK) == 0 ? 0 : errno;
}

/* Takes the program the caller named (option worker_path, or
 * FERRY_WORKER) as it is, or refuses it: falling back to a guess would run
 * a program nobody asked for. Not resolved: a Python in a virtual
 * environment is a symlink whose name is what makes it that environment's. */
static int take_named(const char *what, const char *path, char *out, size_t cap)
{
    int e = runnable(path);
    if (e != 0)
        return ferry__seterr(FERRY_ESPAWN, "worker program '%s' (%s) cannot be run: %s", path, what,
                             strerror(e));
    if (strlen(path) >= cap)
        return ferry__seterr(FERRY_ESPAWN, "worker program path (%s) is too long", what);
    strcpy(out, path);
    return FERRY_OK;
}

/* 1 with DIR/ferry-worker in `out` if that is runnable, else 0 with the
 * reason noted in `ws` (unless NULL); `what` says what DIR is. */
static int try_dir(worker_search *ws, const char *dir, const char *what, char *out, size_t cap)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/" WORKER_PROGRAM, dir);
    int e = n < 0 || (size_t)n >= sizeof path || (size_t)n >= cap ? ENAMETOOLONG : runnable(path);
    if (e == 0) {
        strcpy(out, path);
        return 1;
    }
    if (ws)
        search_note(ws, "%s/" WORKER_PROGRAM " (%s): %s", dir, what, strerror(e));
    return 0;
}

/* Relative to the object that holds this code, symlinks resolved: beside
 * it first (the build tree keeps everything in one folder, and a program
 * linked with ferry statically may carry its worker beside it), then the
 * install's bin/ (libferry.so in PREFIX/lib, the worker in PREFIX/bin). */
static int find_near_library(worker_search *ws, char *out, size_t cap)
{
    Dl_info info;
    char dir[PATH_MAX];
    if (!dladdr((void *)ferry__find_worker, &info) || !info.dli_fname || !info.dli_fname[0]) {
        search_note(ws, "the library's own folder: dladdr does not know it");
        return 0;
    }
    if (!realpath(info.dli_fname, dir)) {
        search_note(ws, "the library's own folder: %s: %s", info.dli_fname, strerror(errno));
        return 0;
    }
    char *slash = strrchr(dir, '/'); /* realpath's answer is absolute */
    char beside[64 + NAME_MAX];
    snprintf(beside, sizeof beside, "beside %s", slash + 1);
    *slash = '\0';
    if (try_dir(ws, dir, beside, out, cap))
        return 1;
    if (!FERRY_LIBDIR_TO_BINDIR[0])
        return 0; /* bin/ and lib/ are one folder: already tried */
    char bin[PATH_MAX + sizeof FERRY_LIBDIR_TO_BINDIR], resolved[PATH_MAX];
    snprintf(bin, sizeof bin, "%s/" FERRY_LIBDIR_TO_BINDIR, dir);
    /* Resolved so that the workers' command line and the messages that
     * name the program read PREFIX/bin rather than PREFIX/lib/../bin. */
    return try_dir(ws, realpath(bin, resolved) ? resolved : bin,
                   "the install's bin, relative to the library", out, cap);
}

/* The absolute directories of PATH, in order. Relative entries (and the
 * empty one, which means the current directory to a shell) are skipped:
 * a library should not start whatever program the trainer's current
 * directory holds, and a worker restarted later must be the same file. */
static int find_on_path(worker_search *ws, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !path[0]) {
        search_note(ws, "PATH: not set");
        return 0;
    }
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        if (p[0] == '/' && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = '\0';
            if (try_dir(NULL, dir, "in PATH", out, cap)) /* one note for all, below */
                return 1;
        }
        p += n + (p[n] == ':');
    }
    search_note(ws, WORKER_PROGRAM " in PATH=%s (absolute entries): not found", path);
    return 0;
}

/* The order, and why (docs/install.md, "How a loader finds ferry-worker"):
 * what the caller named, in code, then in the environment, wins over
 * anything guessed, and a named
 * program that cannot run is an error, never a reason to guess (a stale
 * FERRY_WORKER of another version is caught at the handshake as
 * FERRY_EVERSION, loudly). Of the guesses, the worker that came with this
 * library comes first, because a worker must speak the library's protocol
 * version; PATH is the last resort, for a library and worker installed
 * apart. */
int ferry__find_worker(const char *configured, char *out, size_t cap)
{
    if (configured && configured[0])
        return take_named("option worker_path", configured, out, cap);
    const char *env = getenv("FERRY_WORKER");
    if (env && env[0])
        return take_named("FERRY_WORKER", env, out, cap);
    worker_search ws = {.len = 0};
    search_note(&ws, "option worker_path: not set; FERRY_WORKER: not set");
    if (find_near_library(&ws, out, cap) || find_on_path(&ws, out, cap))
        return FERRY_OK;
    return ferry__seterr(FERRY_ESPAWN,
                         "no " WORKER_PROGRAM " program found. Looked at: %s. Set option "
                         "worker_path or FERRY_WORKER to the program",
                         ws.tried);
}

long long ferry__fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long long used = 0;
    for (struct dirent *e; (e = readdir(d));)
        used += e->d_name[0] != '.';
    closedir(d);
    return used - 1; /* the directory's own fd */
}

unsigned long long ferry__fd_raise_limit(const ferry__log *log)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur == RLIM_INFINITY)
        return ULLONG_MAX;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            ferry__logf(log, FERRY_LOG_INFO,
                        "raised the open-file limit (RLIMIT_NOFILE) from %llu to its hard limit "
                        "%llu for remote connections",
                        (unsigned long long)was, (unsigned long long)rl.rlim_cur);
        } else {
            rl.rlim_cur = was;
        }
    }
    return rl.rlim_cur == RLIM_INFINITY ? ULLONG_MAX : (unsigned long long)rl.rlim_cur;
}

int ferry__fd_headroom(int need, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return FERRY_OK;
    long long n = ferry__fd_count();
    if (n < 0)
        return FERRY_OK; /* no /proc: the calls themselves will report */
    unsigned long long used = (unsigned long long)n;
    if (used + (unsigned long long)need <= (unsigned long long)rl.rlim_cur)
        return FERRY_OK;
    return ferry__seterr(FERRY_ELIMIT,
                         "%s needs %d more file descriptors; %llu of the open file "
                         "(RLIMIT_NOFILE) limit of %llu are in use (raise it with ulimit -n)",
                         what, need, used, (unsigned long long)rl.rlim_cur);
}

/* The child's fds: stdin and stdout as ours, stderr_fd (if any) as its
 * stderr, pass[k] (the first npass) as FERRY__PASSED_FD + k, and nothing
 * else. Whatever the trainer opened without O_CLOEXEC (its files, its
 * listening sockets, a library's pipes) stays in the trainer: a worker
 * holding a listening socket would keep the port busy, and one holding a
 * pipe's write end would keep its reader from seeing EOF, after the trainer
 * is gone. Closing is done in the child after the dup2s, so the fds passed
 * survive. All must be above the highest target (see lift_fd), so that no
 * dup2 overwrites another's source. 0, or an errno. */
static int spawn_fd_actions(posix_spawn_file_actions_t *fa, int stderr_fd, const int *pass,
                            int npass)
{
    int e = posix_spawn_file_actions_init(fa);
    if (e != 0)
        return e;
    if (stderr_fd >= 0)
        e = posix_spawn_file_actions_adddup2(fa, stderr_fd, 2);
    for (int k = 0; e == 0 && k < npass; k++)
        e = posix_spawn_file_actions_adddup2(fa, pass[k], FERRY__PASSED_FD + k);
    if (e == 0)
        e = posix_spawn_file_actions_addclosefrom_np(fa, FERRY__PASSED_FD + npass);
    if (e != 0)
        posix_spawn_file_actions_destroy(fa);
    return e;
}

/* The child starts with no blocked signals and default dispositions, so
 * whatever the caller did to its own signals (a supervisor blocks SIGTERM
 * for its signalfd) does not leak in. */
static void spawn_signal_attrs(posix_spawnattr_t *attr)
{
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawnattr_init(attr);
    posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setsigmask(attr, &none);
    posix_spawnattr_setsigdefault(attr, &all);
}

/* The highest fd a child is given (FERRY__PASSED_FD + FERRY__PASSED_MAX - 1). */
#define PASSED_TOP (FERRY__PASSED_FD + FERRY__PASSED_MAX - 1)

/* Moves *fd above PASSED_TOP when it is not (a close-on-exec copy, kept in
 * *tmp for the caller to close; -1 when none was made): a trainer that
 * closed its stdio can have our pipe or memfds at 2..PASSED_TOP, where one
 * of the child's dup2s would overwrite another's source. 0 or an errno. */
static int lift_fd(int *fd, int *tmp)
{
    *tmp = -1;
    if (*fd < 0 || *fd > PASSED_TOP)
        return 0;
    *tmp = fcntl(*fd, F_DUPFD_CLOEXEC, PASSED_TOP + 1);
    if (*tmp < 0)
        return errno;
    *fd = *tmp;
    return 0;
}

int ferry__spawn(const char *path, char *const argv[], int stderr_fd, const int *pass_fds,
                 int npass, pid_t *pid_out, int *pidfd_out)
{
    int tmp_err, tmp_pass[FERRY__PASSED_MAX], pass[FERRY__PASSED_MAX];
    posix_spawn_file_actions_t fa;
    if (npass < 0 || npass > FERRY__PASSED_MAX)
        return ferry__seterr(FERRY_EINVAL, "%d fds to pass to a child, at most %d", npass,
                             FERRY__PASSED_MAX);
    for (int k = 0; k < FERRY__PASSED_MAX; k++)
        tmp_pass[k] = -1;
    int e = lift_fd(&stderr_fd, &tmp_err);
    for (int k = 0; e == 0 && k < npass; k++) {
        pass[k] = pass_fds[k];
        e = lift_fd(&pass[k], &tmp_pass[k]);
    }
    if (e == 0)
        e = spawn_fd_actions(&fa, stderr_fd, pass, npass);
    pid_t pid;
    if (e == 0) {
        posix_spawnattr_t attr;
        spawn_signal_attrs(&attr);
        /* glibc's posix_spawn (CLONE_VFORK, with its own close-on-exec
         * error pipe) reports an exec failure as its return value. */
        e = posix_spawn(&pid, path, &fa, &attr, argv, environ);
        posix_spawnattr_destroy(&attr);
        posix_spawn_file_actions_destroy(&fa);
    }
    if (tmp_err >= 0)
        close(tmp_err);
    for (int k = 0; k < FERRY__PASSED_MAX; k++) {
        if (tmp_pass[k] >= 0)
            close(tmp_pass[k]);
    }
    if (e != 0) {
        if (e == EAGAIN || e == EMFILE || e == ENFILE)
            return ferry__syserr(FERRY_ESPAWN, "starting a process", e);
        return ferry__seterr(FERRY_ESPAWN, "could not start program '%s': %s", path, strerror(e));
    }

    int fd = pidfd_open(pid, 0);
    if (fd < 0) {
        e = errno;
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        return ferry__syserr(FERRY_ESPAWN, "watching a child: pidfd_open", e);
    }
    *pid_out = pid;
    *pidfd_out = fd;
    return FERRY_OK;
}

int ferry__worker_own_args(const ferry__worker_launch *l, char **argv, int *pass, int *npass,
                           char nums[][24])
{
    int n = 0, k = 0;
    snprintf(nums[0], 24, "%d", l->slot);
    snprintf(nums[1], 24, "%d", (int)getpid());
    argv[n++] = "--connect";
    argv[n++] = (char *)l->endpoint;
    argv[n++] = "--slot";
    argv[n++] = nums[0];
    argv[n++] = "--parent";
    argv[n++] = nums[1];
    /* The fds passed, in order, from FERRY__PASSED_FD on. */
    const struct {
        const char *flag;
        int fd;
    } fds[] = {{"--task-fd", l->task_fd}, {"--shm-fd", l->shm_fd}, {"--data-fd", l->data_fd}};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
        if (fds[i].fd < 0)
            continue;
        snprintf(nums[2 + k], 24, "%d", FERRY__PASSED_FD + k);
        argv[n++] = (char *)fds[i].flag;
        argv[n++] = nums[2 + k];
        pass[k++] = fds[i].fd;
    }
    argv[n] = NULL;
    *npass = k;
    return n;
}

int ferry__stderr_pipe(int fds[2])
{
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        return ferry__syserr(FERRY_ESPAWN, "starting a worker: pipe2", errno);
    fcntl(fds[1], F_SETFL, 0); /* the child's end blocks like any stderr */
    return FERRY_OK;
}

int ferry__spawn_piped(const char *path, const char *args, char *const own[], const int *pass,
                       int npass, pid_t *pid_out, int *pidfd_out, int *errfd_out)
{
    /* argv: the program, args (one per line, in a copy cut at the
     * newlines), then `own`. */
    char *lines = strdup(args ? args : "");
    if (!lines)
        return ferry__seterr(FERRY_ENOMEM, "out of memory starting a worker");
    char *argv[FERRY__WORKER_ARGS_N + FERRY__OWN_ARGS_MAX + 2];
    int n = 0;
    argv[n++] = (char *)path;
    for (char *p = lines; *p && n < FERRY__WORKER_ARGS_N + 1;) {
        argv[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = '\0';
        p = nl + 1;
    }
    for (int i = 0; own[i] && i < FERRY__OWN_ARGS_MAX; i++)
        argv[n++] = own[i];
    argv[n] = NULL;

    int errpipe[2];
    if (ferry__stderr_pipe(errpipe) != FERRY_OK) {
        free(lines);
        return FERRY_ESPAWN;
    }
    int rc = ferry__spawn(path, argv, errpipe[1], pass, npass, pid_out, pidfd_out);
    close(errpipe[1]);
    free(lines);
    if (rc != FERRY_OK) {
        close(errpipe[0]);
        return rc;
    }
    *errfd_out = errpipe[0];
    return FERRY_OK;
}

int ferry__spawn_worker(const char *path, const char *args, const ferry__worker_launch *l,
                        pid_t *pid_out, int *pidfd_out, int *errfd_out)
{
    char *own[FERRY__OWN_ARGS_MAX + 1], nums[FERRY__PASSED_MAX + 2][24];
    int pass[FERRY__PASSED_MAX], npass;
    ferry__worker_own_args(l, own, pass, &npass, nums);
    return ferry__spawn_piped(path, args, own, pass, npass, pid_out, pidfd_out, errfd_out);
}

const char *ferry__signal_name(int sig, char *buf, size_t cap)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev) {
        snprintf(buf, cap, "SIG%s", abbrev);
        return buf;
    }
    snprintf(buf, cap, "signal %d", sig);
    return buf;
}

int ferry__sigkilled(int status)
{
    return status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

void ferry__describe_status(int status, char *buf, size_t cap)
{
    char name[32];
    if (WIFEXITED(status)) {
        snprintf(buf, cap, "exited with code %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *hint = "";
        if (sig == SIGBUS)
            hint = " (a bus error usually means a memory-mapped file shrank or /dev/shm "
                   "is full)";
        else if (sig == SIGSEGV)
            hint = " (the dataset code crashed)";
        else if (sig == SIGKILL)
            hint = " (killed from outside: the OOM killer, or a user)";
        snprintf(buf, cap, "was killed by signal %s%s%s",
                 ferry__signal_name(sig, name, sizeof name),
                 WCOREDUMP(status) ? ", core dumped" : "", hint);
    } else {
        snprintf(buf, cap, "ended with status 0x%x", status);
    }
}
