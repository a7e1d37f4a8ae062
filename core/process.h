/*
 * process.h - starting and explaining worker processes (a loader's local
 * workers, and the children of ferry-worker's --processes supervisor).
 *
 * Workers are always a fresh process image (posix_spawn of ferry-worker,
 * never fork without exec): no inherited OpenMP/BLAS/CUDA thread pools that
 * deadlock after fork, and no copy-on-write share of the trainer's heap.
 * Each child is watched through a pidfd, which its parent polls (the
 * scheduler beside its socket, the supervisor beside its signalfd), so a
 * death is noticed at once.
 *
 * Thread safety: in a loader, call from the scheduler thread (it is the
 * children's parent thread, which matters for PR_SET_PDEATHSIG).
 */
#ifndef FERRY_CORE_PROCESS_H
#define FERRY_CORE_PROCESS_H

#include <stddef.h>
#include <sys/types.h>

#include "log.h"

/* Finds the worker program, as a path no longer than cap - 1 in `out`:
 * `configured` if non-empty, else $FERRY_WORKER if non-empty (either is
 * taken as it is or refused, never passed over), else ferry-worker beside
 * the object holding this code (libferry.so or a static program), else in
 * the install's bin/ relative to it, else in PATH's absolute directories.
 * FERRY_ESPAWN when none will run: for a named program, that one and why;
 * else every place looked and why each failed. `out` is untouched then. */
int ferry__find_worker(const char *configured, char *out, size_t cap);

/* The fd number a spawned child finds the first fd passed at (the next
 * at FERRY__PASSED_FD + 1), and how many may be passed. */
#define FERRY__PASSED_FD 3
#define FERRY__PASSED_MAX 4

/* Starts the program at `path` with `argv` (argv[0] is only its name) as a
 * fresh process image: posix_spawn, no blocked signals, default signal
 * dispositions, the caller's environment. If stderr_fd >= 0 it becomes the
 * child's stderr; the child has pass_fds[k] (npass of them, at most
 * FERRY__PASSED_MAX) as FERRY__PASSED_FD + k. The child gets no other fd
 * of ours: 0, 1, 2 and those passed are all it holds at exec, whatever the
 * caller opened without O_CLOEXEC. Returns
 * the pid and a pidfd (close-on-exec) to poll for its exit; the caller must
 * reap it. On failure nothing is left running or open and the outputs are
 * unchanged: FERRY_ESPAWN (exec failed: errno detail), FERRY_ELIMIT
 * (EMFILE/ENFILE/EAGAIN: the limit is named). */
int ferry__spawn(const char *path, char *const argv[], int stderr_fd, const int *pass_fds,
                 int npass, pid_t *pid, int *pidfd);

/* What a local worker is given: where to connect, its index, and the fds
 * passed to it (-1: none): the task words (--task-fd), the batch slots
 * (--shm-fd) and the dataset's bytes (--data-fd, option dataset_fd). */
typedef struct ferry__worker_launch {
    const char *endpoint;
    int slot;
    int task_fd, shm_fd, data_fd;
} ferry__worker_launch;

/* The most arguments ferry puts after worker_args. */
#define FERRY__OWN_ARGS_MAX 24

/* Ferry's own arguments for worker l, NULL-terminated into argv (room for
 * FERRY__OWN_ARGS_MAX + 1): `--connect EP --slot N --parent <our pid>`,
 * then `--task-fd 3`, `--shm-fd N`, `--data-fd N` for those it has, the
 * numbers being where it finds them (FERRY__PASSED_FD on). pass[] (room for
 * FERRY__PASSED_MAX) gets the fds in that order, *npass their count; nums
 * (FERRY__PASSED_MAX + 2 of them) holds the numbers' text. Returns argc. */
int ferry__worker_own_args(const ferry__worker_launch *l, char **argv, int *pass, int *npass,
                           char nums[][24]);

/* Starts `path ARGS OWN...` (ARGS: the lines of `args`, at most
 * FERRY__WORKER_ARGS_N; NULL for none; OWN: NULL-terminated) with pass[]
 * as fds 3, 4, ... (ferry__spawn), returns its pid and a pidfd
 * (close-on-exec). The child's stderr is the write end of a pipe whose read
 * end comes back in *errfd (non-blocking, close-on-exec), so the loader can
 * pass its output on and keep its last words. On failure nothing is left
 * running or open: FERRY_ESPAWN (exec failed: errno detail), FERRY_ELIMIT
 * (EMFILE/ENFILE/EAGAIN: the limit is named). */
int ferry__spawn_piped(const char *path, const char *args, char *const own[], const int *pass,
                       int npass, pid_t *pid, int *pidfd, int *errfd);

/* A pipe for a child's stderr: fds[0], the loader's end, non-blocking;
 * fds[1], the child's, blocking like any stderr; both close-on-exec.
 * FERRY_ESPAWN (errno detail) when it cannot be made. */
int ferry__stderr_pipe(int fds[2]);

/* ferry__spawn_piped of worker l: `path ARGS` and its own arguments. */
int ferry__spawn_worker(const char *path, const char *args, const ferry__worker_launch *l,
                        pid_t *pid, int *pidfd, int *errfd);

/* FERRY_OK if at least `need` more file descriptors can be opened under the
 * soft RLIMIT_NOFILE, else FERRY_ELIMIT saying what needed them. Checked
 * before each worker starts: libzmq aborts the whole process if its ipc
 * listener cannot accept a worker's connection for want of an fd, so ferry
 * refuses early instead. Counts /proc/self/fd (one readdir). */
int ferry__fd_headroom(int need, const char *what);

/* How many fds this process has open (/proc/self/fd), or -1. */
long long ferry__fd_count(void);

/* Raises the soft RLIMIT_NOFILE to the hard limit (logged at info when it
 * moves), for a loader that anyone on the network can connect to. Returns
 * the soft limit now (ULLONG_MAX: none; 0: unknown). */
unsigned long long ferry__fd_raise_limit(const ferry__log *log);

/* "SIGKILL" for 9, "signal 77" for unknown ones (buf used then). */
const char *ferry__signal_name(int sig, char *buf, size_t cap);

/* "exited with code 3" / "was killed by signal SIGSEGV (...hint...)". */
void ferry__describe_status(int status, char *buf, size_t cap);

/* Whether wait status `status` (-1: unknown) is a death by SIGKILL: the
 * OOM killer or a user, when ferry did not send it. */
int ferry__sigkilled(int status);

#endif
