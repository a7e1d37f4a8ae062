/*
 * harness.h - what every ferry test that starts workers checks, written
 * once for the cmocka tests and the soak (tests/soak.c).
 *
 * Two layers:
 *  - Probes look and report; they never call cmocka, so the soak's trainer
 *    processes use them as they are. They count a process's fds, threads
 *    and files, compare it with a snapshot (ft_leaks), wait for a process to
 *    be gone, remove what a dead loader left, and check a batch against the
 *    synthetic dataset (ft_check_synthetic) and against the sampler's stream
 *    (ft_stream_check). A failed check returns nonzero and writes one
 *    sentence saying what differs.
 *  - Assertions for cmocka cases, built on the probes: ft_begin() takes a
 *    snapshot (open fds, threads, /dev/shm entries), points TMPDIR at a
 *    fresh private directory (so the loader's ipc directory lands somewhere
 *    we can inspect) and arms a hard time limit; ft_end() asserts that
 *    everything is back: no child process (running or zombie), the same fds
 *    and threads, nothing left in the private TMPDIR or /dev/shm. Between
 *    the two, ft_open_ok(), ft_wait_stats(), ft_assert_synthetic() and the
 *    others say what the cases would otherwise each write again.
 *
 * Everything here runs on the calling thread; nothing is kept between calls
 * but what the caller passes in.
 */
#ifndef FERRY_TEST_HARNESS_H
#define FERRY_TEST_HARNESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"
#include "sampler.h"

/* ------------------------------------------------------------------------
 * Probes: time, counts, files
 */

uint64_t ft_now_ms(void);
/* For polling loops over state that sends no event (loader stats, /proc). */
void ft_sleep_ms(unsigned ms);

int ft_count_fds(void);
int ft_count_threads(void);
/* The value of `key` ("VmHWM", "RssShmem") in /proc/self/status, in KiB;
 * -1 when it is not there. */
long ft_status_kib(const char *key);

/* This process's minor page faults so far, all threads (getrusage). */
long ft_minor_faults(void);
/* Entries in a directory (not . and ..), -1 if it cannot be read. */
int ft_count_entries(const char *dir);
/* Writes the entries of `dir` to f, one a line; with `links`, where each
 * points (for /proc/self/fd). For leak reports. */
void ft_list_entries(FILE *f, const char *dir, int links);
/* Writes every thread of process `pid` to f with its name, state and where
 * it sleeps in the kernel: enough to tell a deadlock from a lost wakeup. */
void ft_dump_threads(FILE *f, int pid, const char *role);

/* Makes a fresh directory /tmp/NAME-XXXXXX, its path in buf. 0, or -1 with
 * errno set. */
int ft_make_tmpdir(char *buf, size_t cap, const char *name);
/* Removes every entry of `dir` whose name starts with `prefix` ("" for
 * all), directories with what they hold; `dir` itself stays. Returns how
 * many entries it removed, or -1 if one could not be removed. */
int ft_empty_dir(const char *dir, const char *prefix);
/* Removes `path` and everything under it: 0, or -1. */
int ft_remove_tree(const char *path);

/* ------------------------------------------------------------------------
 * Probes: leaks and processes
 */

typedef struct ft_snapshot {
    int nfds;
    int nthreads;
    int nshm;         /* ferry's entries in /dev/shm; -1: not checked */
    char tmpdir[256]; /* must be empty when checked; "": not checked */
} ft_snapshot;

/* Counts fds, threads and ferry's /dev/shm entries now, and remembers
 * `tmpdir` (NULL: none) as the directory that must end up empty. */
void ft_snapshot_take(ft_snapshot *s, const char *tmpdir);

typedef enum ft_leak {
    FT_NO_LEAK = 0,
    FT_LEAK_CHILD,   /* a child process, running or a zombie */
    FT_LEAK_FDS,     /* another number of open fds */
    FT_LEAK_THREADS, /* another number of threads */
    FT_LEAK_FILES,   /* something in the snapshot's tmpdir */
    FT_LEAK_SHM,     /* another number of ferry entries in /dev/shm */
} ft_leak;

/* Compares this process with snapshot s, in that order: no child left (a
 * zombie found is reaped), the same fds, the same threads (a joined thread
 * gets 500 ms to leave /proc), an empty tmpdir, the same /dev/shm count.
 * Returns the first difference (FT_NO_LEAK: none) with a sentence in why;
 * with `detail`, also writes there what is left (fds with their targets,
 * threads, files). */
ft_leak ft_leaks(const ft_snapshot *s, FILE *detail, char *why, size_t cap);

/* Waits until process `pid` (a child or not) has exited; returns the ms it
 * took (0 if it was already gone), or -1 if it is still alive after `ms`.
 * A child is left to reap. */
int64_t ft_wait_gone(int pid, int ms);
/* A child process that keeps one core busy (so races show up in the case
 * that runs meanwhile) until ft_load_stop. It dies with the calling process
 * even if the case fails first, and holds none of its output. */
int ft_load_start(void);
void ft_load_stop(int pid);

/* Waits up to `ms` for child `pid` to exit and reaps it: 0 with its wait
 * status in *status, or -1 if it is still running (and left so). */
int ft_wait_child(int pid, int ms, int *status);

/* A TCP port on 127.0.0.1 that nothing listens on right now (the
 * kernel's pick), or -1. */
int ft_free_port(void);
/* Starts argv[0] (looked up in PATH) as a child that dies with the calling
 * process (PR_SET_PDEATHSIG), so a failing case cannot leave a daemon
 * behind; stderr_fd >= 0 becomes its stderr. Its pid, or -1. */
int ft_spawn_tied(const char *const *argv, int stderr_fd);
/* The parent of process pid, from /proc; -1 when it is gone. */
int ft_parent_of(int pid);

/* ------------------------------------------------------------------------
 * Probes: batches
 */

/* Checks a batch of the synthetic dataset (or the hostile plugin, which
 * makes the same bytes): exactly the fields x (u8 [size, dim]) and y (i64
 * [size]), 16-byte aligned data, y == the index, x's bytes ==
 * ferry__synthetic_byte of it. dim <= 0 takes x's own width. 0, or -1
 * with the first difference in why. */
int ft_check_synthetic(const ferry_batch *b, int dim, char *why, size_t cap);

/* The stream a loader should deliver, rebuilt from a sampler with the same
 * options, and what has been seen of it. */
typedef struct ft_stream {
    ferry__sampler s;
    int in_order;             /* seqs come 0, 1, 2, ... and every item once an epoch;
                                 otherwise epochs come whole, one after another */
    uint64_t window;          /* out of order: a seq is below taken + window; 0: unchecked */
    uint32_t workers;         /* info.worker is below this; 0: unchecked */
    uint64_t taken;           /* batches that passed ft_stream_check */
    uint64_t *want;           /* batch_size indices from the sampler */
    unsigned char *seen_item; /* in order: items of the current epoch seen */
    unsigned char *seen_seq;  /* seqs seen, seq_cap of them; NULL: unchecked */
    uint64_t seq_cap;
} ft_stream;

/* A stream over n items with sampler options o, in order, window and
 * workers unchecked (set them after). seq_cap > 0 also checks that no seq
 * below it comes twice, and none at or above it comes at all. 0, or -1 when
 * the sampler refuses o or memory runs out (nothing to free then). */
int ft_stream_init(ft_stream *c, uint64_t n, const ferry__sampler_opts *o, uint64_t seq_cap);
/* Checks batch b's place in the stream: its seq (the next one in order, or
 * a new one inside the window), its worker, and the epoch, position, size,
 * last flag and indices the sampler gives that seq; in order, also that no
 * item comes twice in an epoch and none is missing at its end. 0 (and
 * taken + 1), or -1 with the first difference in why. */
int ft_stream_check(ft_stream *c, const ferry_batch *b, char *why, size_t cap);
void ft_stream_free(ft_stream *c);

/* ------------------------------------------------------------------------
 * Assertions (cmocka)
 */

/* Snapshot, private TMPDIR, and an alarm that kills the test process after
 * `limit_s` seconds (a hang fails the test instead of blocking CI). */
void ft_begin(ft_snapshot *s, unsigned limit_s);
/* Asserts (cmocka) that nothing leaked since ft_begin, removes the TMPDIR,
 * disarms the alarm. */
void ft_end(ft_snapshot *s);

/* Runs each test in its own child process (so a failing case, and whatever
 * it left running, cannot spill into the next), each under cmocka, and
 * prints "N passed, M failed". Returns the number failed. A child that dies
 * or runs past its alarm counts as failed. */
struct CMUnitTest;
int ft_run_each(const struct CMUnitTest *tests, size_t n);

/* A config with the test build's ferry-worker, `dataset`, `workers` and
 * `batch_size` set (each set asserted). */
ferry_config *ft_config(const char *dataset, int workers, int batch_size);
/* Opens a loader that must open, and frees cfg either way; a failure
 * fails the case with ferry's sentence. */
ferry_loader *ft_open_ok(ferry_config *cfg);
/* ferry_loader_close must return FERRY_OK within `ms`. */
void ft_close_within(ferry_loader *ld, uint64_t ms);

/* What a log callback (ferry_config_set_log) is handed: the first 64
 * messages, in order. Pass ft_capture_log with a pointer to one. */
typedef struct ft_log_capture {
    pthread_mutex_t mu;
    int n;
    int level[64];
    char line[64][1024];
} ft_log_capture;
void ft_capture_log(void *user, int level, const char *message);
/* Messages at `level` holding `words`. */
int ft_count_log(ft_log_capture *c, int level, const char *words);

ferry_stats ft_stats(ferry_loader *ld);
typedef int (*ft_stats_pred)(const ferry_stats *st, uint64_t arg);
/* Polls the loader's stats until pred(stats, arg) holds; returns the ms it
 * took, or -1 if it did not within `ms`. */
int64_t ft_wait_stats(ferry_loader *ld, ft_stats_pred pred, uint64_t arg, uint64_t ms);
/* Writes a .npy file as numpy does: the preamble of `version` (1, 2 or 3),
 * the header dict padded to a multiple of 64 bytes, then len bytes of data. */
void ft_write_npy(const char *path, int version, const char *dict, const void *data,
                  size_t len);

/* A predicate for ft_wait_stats: at least `n` batches (or failures) came
 * back from workers. */
int ft_completed_at_least(const ferry_stats *st, uint64_t n);

/* Asserts rc == want and that ferry_last_error() holds every string of the
 * NULL-terminated list `words`. */
void ft_expect_error(int rc, int want, const char *const *words);
/* The same with the strings as arguments, the NULL last:
 * FT_EXPECT_ERROR(rc, FERRY_EFORMAT, path, "line 2", NULL). */
#define FT_EXPECT_ERROR(rc, want, ...)                                                             \
    ft_expect_error((rc), (want), (const char *const[]){__VA_ARGS__})

/* Stops a ferry-worker daemon: SIGCONT and SIGTERM (it finishes its
 * batch, says BYE, exits), then asserts that it exited with 0 within 10 s
 * (one that did not is killed and reaped, and fails the case). */
void ft_stop_daemon(int pid);

/* ft_check_synthetic and ft_stream_check as assertions. */
void ft_assert_synthetic(const ferry_batch *b, int dim);
void ft_assert_in_stream(ft_stream *c, const ferry_batch *b);

#endif
