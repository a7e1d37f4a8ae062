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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "error.h"

extern char **environ;

#ifndef FERRY_INSTALL_BINDIR
#define FERRY_INSTALL_BINDIR "/usr/local/bin"
#endif

static int executable(const char *path)
{
    return access(path, X_OK) == 0;
}

int ferry__find_worker(const char *configured, char *out, size_t cap)
{
    const char *env = getenv("FERRY_WORKER");
    const char *chosen = NULL;
    char here[PATH_MAX];

    if (configured && configured[0]) {
        chosen = configured;
    } else if (env && env[0]) {
        chosen = env;
    } else {
        /* Beside the object that holds this function: libferry.so in the
         * build tree or a program linked statically against ferry. */
        Dl_info info;
        if (dladdr((void *)ferry__find_worker, &info) && info.dli_fname &&
            realpath(info.dli_fname, here)) {
            char *slash = strrchr(here, '/');
            if (slash && (size_t)(slash - here) + sizeof "/ferry-worker" <= sizeof here) {
                strcpy(slash, "/ferry-worker");
                if (executable(here))
                    chosen = here;
            }
        }
        if (!chosen)
            chosen = FERRY_INSTALL_BINDIR "/ferry-worker";
    }
    if (!executable(chosen))
        return ferry__seterr(FERRY_ESPAWN,
                             "worker program '%s' is not executable: %s "
                             "(set option worker_path or FERRY_WORKER)",
                             chosen, strerror(errno));
    if (strlen(chosen) >= cap)
        return ferry__seterr(FERRY_ESPAWN, "worker program path is too long");
    strcpy(out, chosen);
    return FERRY_OK;
}

int ferry__fd_headroom(int need, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return FERRY_OK;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return FERRY_OK; /* no /proc: the calls themselves will report */
    unsigned long long used = 0;
    for (struct dirent *e; (e = readdir(d));)
        used += e->d_name[0] != '.';
    closedir(d);
    used--; /* the directory's own fd */
    if (used + (unsigned long long)need <= (unsigned long long)rl.rlim_cur)
        return FERRY_OK;
    return ferry__seterr(FERRY_ELIMIT,
                         "%s needs %d more file descriptors; %llu of the open file "
                         "(RLIMIT_NOFILE) limit of %llu are in use (raise it with ulimit -n)",
                         what, need, used, (unsigned long long)rl.rlim_cur);
}

/* The child's fds: stdin and stdout as ours, stderr_fd (if any) as its
 * stderr, pass_fd (if any) as FERRY__PASSED_FD, and nothing else. Whatever
 * the trainer opened without O_CLOEXEC (its files, its listening sockets, a
 * library's pipes) stays in the trainer: a worker holding a listening
 * socket would keep the port busy, and one holding a pipe's write end would
 * keep its reader from seeing EOF, after the trainer is gone. Closing is
 * done in the child after the dup2s, so the fds passed survive. Both must
 * be above FERRY__PASSED_FD (see lift_fd), so that neither dup2 overwrites
 * the other's source. 0, or an errno. */
static int spawn_fd_actions(posix_spawn_file_actions_t *fa, int stderr_fd, int pass_fd)
{
    int e = posix_spawn_file_actions_init(fa);
    if (e != 0)
        return e;
    if (stderr_fd >= 0)
        e = posix_spawn_file_actions_adddup2(fa, stderr_fd, 2);
    if (e == 0 && pass_fd >= 0)
        e = posix_spawn_file_actions_adddup2(fa, pass_fd, FERRY__PASSED_FD);
    if (e == 0)
        e = posix_spawn_file_actions_addclosefrom_np(fa, pass_fd >= 0 ? FERRY__PASSED_FD + 1 : 3);
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

/* Moves *fd above FERRY__PASSED_FD when it is not (a close-on-exec copy,
 * kept in *tmp for the caller to close; -1 when none was made): a trainer
 * that closed its stdio can have our pipe or memfd at 2 or 3, where one of
 * the child's dup2s would overwrite the other's source. 0 or an errno. */
static int lift_fd(int *fd, int *tmp)
{
    *tmp = -1;
    if (*fd < 0 || *fd > FERRY__PASSED_FD)
        return 0;
    *tmp = fcntl(*fd, F_DUPFD_CLOEXEC, FERRY__PASSED_FD + 1);
    if (*tmp < 0)
        return errno;
    *fd = *tmp;
    return 0;
}

int ferry__spawn(const char *path, char *const argv[], int stderr_fd, int pass_fd,
                 pid_t *pid_out, int *pidfd_out)
{
    int tmp_err, tmp_pass = -1;
    posix_spawn_file_actions_t fa;
    int e = lift_fd(&stderr_fd, &tmp_err);
    if (e == 0)
        e = lift_fd(&pass_fd, &tmp_pass);
    if (e == 0)
        e = spawn_fd_actions(&fa, stderr_fd, pass_fd);
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
    if (tmp_pass >= 0)
        close(tmp_pass);
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

int ferry__spawn_worker(const char *path, const char *args, const char *endpoint, int slot,
                        int task_fd, pid_t *pid_out, int *pidfd_out, int *errfd_out)
{
    /* argv: the program, args (one per line, in a copy cut at the
     * newlines), then ferry's own. */
    char *lines = strdup(args ? args : "");
    if (!lines)
        return ferry__seterr(FERRY_ENOMEM, "out of memory starting a worker");
    char slot_s[16], parent_s[24], task_s[16];
    snprintf(slot_s, sizeof slot_s, "%d", slot);
    snprintf(parent_s, sizeof parent_s, "%d", (int)getpid());
    snprintf(task_s, sizeof task_s, "%d", FERRY__PASSED_FD);
    char *argv[FERRY__WORKER_ARGS_N + 12];
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
    char *own[] = {"--connect", (char *)endpoint, "--slot", slot_s, "--parent", parent_s,
                   "--task-fd", task_s};
    int nown = task_fd < 0 ? 6 : 8;
    for (int i = 0; i < nown; i++)
        argv[n++] = own[i];
    argv[n] = NULL;

    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        free(lines);
        return ferry__syserr(FERRY_ESPAWN, "starting a worker: pipe2", errno);
    }
    /* The child's end must block like any stderr. */
    fcntl(errpipe[1], F_SETFL, 0);
    int rc = ferry__spawn(path, argv, errpipe[1], task_fd, pid_out, pidfd_out);
    close(errpipe[1]);
    free(lines);
    if (rc != FERRY_OK) {
        close(errpipe[0]);
        return rc;
    }
    *errfd_out = errpipe[0];
    return FERRY_OK;
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
