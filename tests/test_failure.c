/*
 * test_failure.c - never hang, never lose a batch: every fault injected on
 * purpose, every outcome asserted.
 *
 * Faults come from outside (signals sent to worker pids) or from the hostile
 * plugin (tests/hostile_plugin.c: crashes, hangs, exits, bad lengths). Each
 * case runs between ft_begin() and ft_end(): a hard time limit, then no child,
 * fd, thread or file left behind.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "ferry.h"
#include "harness.h"
#include "protocol.h"

/* ------------------------------------------------------------------------
 * Helpers
 */

static ferry_config *make_cfg(int workers, int batch, const char *dataset)
{
    ferry_config *cfg = ft_config(dataset, workers, batch);
    assert_int_equal(ferry_config_set_int(cfg, "close_grace_ms", 300), FERRY_OK);
    return cfg;
}

static const char *hostile(const char *args)
{
    static char spec[512];
    snprintf(spec, sizeof spec, "plugin:%s?%s", FERRY_TEST_HOSTILE, args);
    return spec;
}

/* Consumes to the end: every batch in order (seq 0, 1, 2, ...) and intact;
 * returns how many. Runs `hook(ld, k)` before taking batch k. */
static uint64_t consume_in_order(ferry_loader *ld, void (*hook)(ferry_loader *, uint64_t))
{
    uint64_t k = 0;
    ferry_batch *b;
    int rc;
    for (;;) {
        if (hook)
            hook(ld, k);
        rc = ferry_loader_next(ld, &b);
        if (rc != FERRY_OK)
            break;
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ft_assert_synthetic(b, 0);
        ferry_batch_release(b);
        k++;
    }
    if (rc != FERRY_EOF)
        print_error("next: %s: %s\n", ferry_err_name(rc), ferry_last_error());
    assert_int_equal(rc, FERRY_EOF);
    return k;
}

/* Consumes to the end, counting good batches and FERRY_EBATCH results;
 * every failure's message must hold each of `words`. */
static void count_to_end(ferry_loader *ld, const char *const *words, int *ok, int *failed)
{
    ferry_batch *b;
    int rc;
    *ok = *failed = 0;
    while ((rc = ferry_loader_next(ld, &b)) != FERRY_EOF) {
        if (rc == FERRY_EBATCH) {
            ft_expect_error(rc, FERRY_EBATCH, words);
            (*failed)++;
            continue;
        }
        assert_int_equal(rc, FERRY_OK);
        ft_assert_synthetic(b, 0);
        ferry_batch_release(b);
        (*ok)++;
    }
}

static int worker_pid(ferry_loader *ld, uint32_t i)
{
    int pid = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, i, &pid), FERRY_OK);
    return pid;
}

/* For ft_wait_stats: at least `n` workers alive and ready. */
static int workers_at_least(const ferry_stats *st, uint64_t n)
{
    return st->workers >= n;
}

/* For ft_wait_stats: fewer than `n` workers alive and ready. */
static int workers_below(const ferry_stats *st, uint64_t n)
{
    return st->workers < n;
}

/* ------------------------------------------------------------------------
 * Worker death under the fail policy: noticed at once, explained
 */

static void test_dead_worker_is_noticed_within_100ms_and_named(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg(2, 32, "synthetic:n=1000,dim=16");
    ferry_config_set(cfg, "on_worker_failure", "fail");
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_release(b);

    /* The trainer is not inside next() while the worker dies. */
    int pid = worker_pid(ld, 1);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int64_t took = ft_wait_stats(ld, workers_below, 2, 5000);
    print_message("death noticed after %lld ms\n", (long long)took);
    assert_true(took >= 0 && took < 100);

    char want[96];
    snprintf(want, sizeof want, "worker 1 (pid %d) was killed by signal SIGKILL", pid);
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK)
        ferry_batch_release(b);
    FT_EXPECT_ERROR(rc, FERRY_EWORKER, want, NULL);
    /* It stays failed, and still closes cleanly. */
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EWORKER);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

static void test_crash_is_explained_with_signal_and_last_words(void **state)
{
    (void)state;
    static const struct {
        const char *args;
        const char *words[4];
    } cases[] = {
        {"n=200,abort_at=70,say=reading-item-70", {"SIGABRT", "reading-item-70", NULL}},
        {"n=200,bus_at=70", {"SIGBUS", "memory-mapped", NULL}},
        {"n=200,crash_at=70", {"SIGSEGV", "crashed while building batch", "index 64", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        ferry_config *cfg = make_cfg(1, 32, hostile(cases[c].args));
        ferry_config_set(cfg, "on_worker_failure", "fail");
        ferry_loader *ld = ft_open_ok(cfg);
        ferry_batch *b;
        int rc;
        while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK)
            ferry_batch_release(b);
        ft_expect_error(rc, FERRY_EWORKER, cases[c].words);
        assert_non_null(strstr(ferry_last_error(), "worker 0 (pid "));
        assert_int_equal(ferry_loader_close(ld), FERRY_OK);
        ft_end(&snap);
    }
}

/* ------------------------------------------------------------------------
 * Restart: nothing lost, nothing twice
 */

static void kill_two_workers(ferry_loader *ld, uint64_t k)
{
    if (k == 5 || k == 40) {
        int pid = worker_pid(ld, k == 5 ? 0 : 1);
        assert_true(pid > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
    }
}

static void test_restart_replaces_killed_workers_and_loses_nothing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    /* Slow items keep tasks in flight when the kills land. */
    ferry_config *cfg = make_cfg(2, 20, "synthetic:n=400,dim=24,cost_us=50");
    ferry_config_set_int(cfg, "epochs", 3);
    ferry_config_set_int(cfg, "prefetch", 6);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t n = consume_in_order(ld, kill_two_workers);
    assert_int_equal(n, 3 * 20);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_int_equal(st.restarts, 2);
    assert_int_equal(st.delivered, 60);
    assert_int_equal(st.failed, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* Takes the next `n` batches, each the next seq in order (*k) and intact. */
static void take_in_order(ferry_loader *ld, uint64_t *k, uint64_t n)
{
    for (uint64_t j = 0; j < n; j++) {
        ferry_batch *b;
        int rc = ferry_loader_next(ld, &b);
        if (rc != FERRY_OK)
            print_error("next: %s: %s\n", ferry_err_name(rc), ferry_last_error());
        assert_int_equal(rc, FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, *k);
        ft_assert_synthetic(b, 0);
        ferry_batch_release(b);
        (*k)++;
    }
}

/* The soft open-file limit just above what is open now: a worker started
 * after a death (a few fds closed) finds too few. Returns the old limit. */
static struct rlimit starve_fds(void)
{
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)ft_count_fds() + 1;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    return old;
}

/* A replacement that cannot be started for want of file descriptors (a
 * connection flood, the trainer's own files) is tried again with a back-off
 * while the other worker serves, and starts once fds are free: the stream
 * never stops and loses nothing. (It used to fail the loader at once.) */
static void test_a_replacement_that_cannot_start_is_tried_again(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    ferry_config *cfg = make_cfg(2, 16, "synthetic:n=16000,dim=8");
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1000), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t k = 0;
    take_in_order(ld, &k, 10);

    struct rlimit old = starve_fds();
    assert_int_equal(kill(worker_pid(ld, 0), SIGKILL), 0);
    uint64_t deadline = ft_now_ms() + 10000;
    while (!ft_count_log(&cap, FERRY_LOG_WARN, "could not start worker 0 again")) {
        assert_true(ft_now_ms() < deadline);
        take_in_order(ld, &k, 1);
    }
    /* Several back-offs' worth of batches from worker 1 alone. */
    uint64_t until = ft_now_ms() + 500;
    while (ft_now_ms() < until)
        take_in_order(ld, &k, 1);
    assert_int_equal(ft_stats(ld).workers, 1);
    assert_true(ft_count_log(&cap, FERRY_LOG_WARN, "needs 8 more file descriptors") >= 1);

    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_true(ft_wait_stats(ld, workers_at_least, 2, 10000) >= 0);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_INFO, "worker 0 started again after"), 1);
    take_in_order(ld, &k, 200);
    ferry_stats st = ft_stats(ld);
    assert_int_equal(st.restarts, 1);
    assert_int_equal(st.failed, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* Worker 0 of `workers` killed while no fd is left to start its
 * replacement: the loader fails after start_timeout_ms (1 s), after every
 * batch made before, saying why (`why`). */
static void starved_replacement_fails(int workers, int pin_tasks, const char *why)
{
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(workers, 16, "synthetic:n=16000,dim=8");
    assert_int_equal(ferry_config_set_int(cfg, "start_timeout_ms", 1000), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "pin_tasks", pin_tasks), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t k = 0;
    take_in_order(ld, &k, 10);
    struct rlimit old = starve_fds();
    uint64_t t0 = ft_now_ms();
    assert_int_equal(kill(worker_pid(ld, 0), SIGKILL), 0);
    ferry_batch *b;
    int rc;
    while ((rc = ferry_loader_next_timeout(ld, &b, 10000)) == FERRY_OK) {
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k++);
        ferry_batch_release(b);
    }
    uint64_t took = ft_now_ms() - t0;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    FT_EXPECT_ERROR(rc, FERRY_ELIMIT, why, "worker 0", "start_timeout_ms 1000", "RLIMIT_NOFILE",
                    NULL);
    assert_true(took >= 1000 && took < 5000);
    ft_close_within(ld, 3000);
    ft_end(&snap);
}

/* With no worker left and none that can be started, the loader fails. */
static void test_no_worker_left_to_start_fails_after_the_start_timeout(void **state)
{
    (void)state;
    starved_replacement_fails(1, 0, "no worker is left to serve");
}

/* With pin_tasks the other workers cannot make a dead worker's tasks: it
 * fails although another worker is alive (it used to wait forever). */
static void test_pinned_tasks_fail_when_their_worker_cannot_start(void **state)
{
    (void)state;
    starved_replacement_fails(2, 1, "pinned to it (pin_tasks)");
}

/* stderr into a temporary file until stderr_end, which restores it and
 * returns what was written (up to cap - 1 bytes, NUL-terminated). */
typedef struct stderr_capture {
    int saved;
    FILE *file;
} stderr_capture;

static void stderr_begin(stderr_capture *c)
{
    fflush(stderr);
    c->saved = dup(STDERR_FILENO);
    c->file = tmpfile();
    assert_true(c->saved >= 0 && c->file);
    assert_int_equal(dup2(fileno(c->file), STDERR_FILENO), STDERR_FILENO);
}

static void stderr_end(stderr_capture *c, char *out, size_t cap)
{
    fflush(stderr);
    assert_int_equal(dup2(c->saved, STDERR_FILENO), STDERR_FILENO);
    close(c->saved);
    rewind(c->file);
    size_t got = fread(out, 1, cap - 1, c->file);
    out[got] = '\0';
    fclose(c->file);
}

/* A dataset that does not open is said once, by open's error, naming the
 * worker and the dataset's own words: the workers, which the loader turns
 * away, write nothing (each used to print the refusal too, and a second
 * one a guess that the loader was full or spoke another protocol). */
static void test_a_dataset_that_does_not_open_is_said_once(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    stderr_capture cap;
    stderr_begin(&cap);
    ferry_config *cfg = make_cfg(2, 20, "synthetc:n=100");
    ferry_loader *ld = NULL;
    int rc = ferry_loader_open(&ld, cfg);
    char why[512];
    snprintf(why, sizeof why, "%s", ferry_last_error());
    ferry_config_free(cfg);
    char out[4096];
    stderr_end(&cap, out, sizeof out);
    print_message("open: %s\nstderr: '%s'\n", why, out);
    assert_int_equal(rc, FERRY_EDATASET);
    assert_null(ld);
    assert_non_null(strstr(why, "could not open dataset 'synthetc:n=100': unknown dataset kind"));
    assert_null(strstr(out, "ferry-worker"));
    ft_end(&snap);
}

/* With a log callback, a worker's death and its replacement are one
 * message at warning level, naming the worker, its pid and the signal;
 * debug level adds one line per worker that becomes ready; and the loader
 * writes nothing to stderr. */
static void test_log_callback_gets_one_message_per_death(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    stderr_capture err;
    stderr_begin(&err);

    ferry_config *cfg = make_cfg(2, 20, "synthetic:n=400,dim=24,cost_us=50");
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "log_level", "debug"), FERRY_OK);
    ferry_config_set_int(cfg, "epochs", 2);
    ferry_loader *ld = ft_open_ok(cfg);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_DEBUG, "is ready"), 2);
    int pid = worker_pid(ld, 1);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(consume_in_order(ld, NULL), 2 * 20);
    assert_int_equal(ft_stats(ld).restarts, 1);
    /* The replacement may still be starting when the last batch is in. */
    assert_true(ft_wait_stats(ld, workers_at_least, 2, 10000) >= 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    char out[4096];
    stderr_end(&err, out, sizeof out);
    for (int i = 0; i < cap.n; i++)
        print_message("[%s] %s\n", ferry_log_level_name(cap.level[i]), cap.line[i]);
    assert_null(strstr(out, "ferry: "));

    char want[96];
    snprintf(want, sizeof want, "worker 1 (pid %d) was killed by signal SIGKILL", pid);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, want), 1);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, "starting a replacement"), 1);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, ""), 1);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_DEBUG, "is ready"), 3);
    ft_end(&snap);
}

/* log_level takes the four names; the names come back from
 * ferry_log_level_name. */
static void test_log_levels_are_named(void **state)
{
    (void)state;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    ferry_config *cfg = ferry_config_new();
    for (int i = 0; i < 4; i++) {
        assert_string_equal(ferry_log_level_name((i + 1) * 10), names[i]);
        assert_int_equal(ferry_config_set(cfg, "log_level", names[i]), FERRY_OK);
    }
    assert_null(ferry_log_level_name(25));
    FT_EXPECT_ERROR(ferry_config_set(cfg, "log_level", "verbose"), FERRY_EINVAL, "log_level",
                    "warning", NULL);
    assert_int_equal(ferry_config_set_log(NULL, ft_capture_log, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_config_set_log(cfg, NULL, NULL), FERRY_OK);
    ferry_config_free(cfg);
}

static void test_poison_batch_is_given_up_and_run_continues(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(2, 16, hostile("n=160,crash_at=37"));
    ferry_config_set_int(cfg, "epochs", 1);
    ferry_config_set_int(cfg, "max_attempts", 3);
    ferry_loader *ld = ft_open_ok(cfg);
    int ok, failed;
    count_to_end(ld,
                 (const char *const[]){"batch 2", "indices 32, 33", "(16 in all)",
                                       "after 3 workers died", "SIGSEGV", NULL},
                 &ok, &failed);
    assert_int_equal(failed, 1);
    assert_int_equal(ok, 9);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_true(st.restarts >= 3);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Timeouts
 */

/* The charge falls on the batch that crashed and on no other, whatever the
 * timing: 2 workers with several tasks each, tiny batches (replies queued
 * when the crash comes), another process keeping a core busy, many loaders
 * in a row, max_attempts 2. Each worker says in shared memory which task
 * it is building, so a death is charged to exactly that one. */
static void test_only_the_poison_batch_is_ever_given_up_under_load(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 120);
    int load = ft_load_start();
    for (int round = 0; round < 40; round++) {
        ferry_config *cfg = make_cfg(2, 4, hostile("n=64,crash_at=37"));
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "max_attempts", 2), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "credits", 8), FERRY_OK);
        ferry_loader *ld = ft_open_ok(cfg);
        int ok, failed;
        count_to_end(ld,
                     (const char *const[]){"batch 9", "indices 36, 37, 38, 39",
                                           "after 2 workers died", "SIGSEGV", NULL},
                     &ok, &failed);
        assert_int_equal(failed, 1);
        assert_int_equal(ok, 15);
        assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    }
    ft_load_stop(load);
    ft_end(&snap);
}

static int stopped_pid;

static void stop_a_worker(ferry_loader *ld, uint64_t k)
{
    if (k == 10) {
        stopped_pid = worker_pid(ld, 1);
        assert_true(stopped_pid > 0);
        assert_int_equal(kill(stopped_pid, SIGSTOP), 0);
    }
}

static void test_stopped_worker_is_replaced_after_timeout(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(2, 20, "synthetic:n=400,dim=24,cost_us=20");
    ferry_config_set_int(cfg, "epochs", 2);
    ferry_config_set_int(cfg, "timeout_ms", 300);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t n = consume_in_order(ld, stop_a_worker);
    assert_int_equal(n, 40);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_true(st.timeouts >= 1);
    assert_true(st.restarts >= 1);
    assert_int_not_equal(worker_pid(ld, 1), stopped_pid);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

static void test_hanging_batch_times_out_then_is_given_up(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(2, 16, hostile("n=64,hang_at=20"));
    ferry_config_set_int(cfg, "epochs", 1);
    ferry_config_set_int(cfg, "timeout_ms", 200);
    ferry_config_set_int(cfg, "max_attempts", 2);
    ferry_loader *ld = ft_open_ok(cfg);
    int ok, failed;
    count_to_end(ld, (const char *const[]){"batch 1", "past timeout_ms 200", NULL}, &ok, &failed);
    assert_int_equal(failed, 1);
    assert_int_equal(ok, 3);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

static void test_timeout_under_fail_policy_names_worker_and_task(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg(1, 16, hostile("n=64,spin_at=40"));
    ferry_config_set(cfg, "on_worker_failure", "fail");
    ferry_config_set_int(cfg, "timeout_ms", 200);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b;
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK)
        ferry_batch_release(b);
    FT_EXPECT_ERROR(rc, FERRY_ETIMEDOUT, "worker 0 (pid ", "batch 2", "timeout_ms 200", NULL);
    ft_close_within(ld, 3000); /* the spinning worker is killed */
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Signals and the trainer's death
 */

static void test_workers_ignore_sigint(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg(2, 32, "synthetic:n=640,dim=8");
    ferry_config_set_int(cfg, "epochs", 2);
    ferry_loader *ld = ft_open_ok(cfg);
    int p0 = worker_pid(ld, 0), p1 = worker_pid(ld, 1);
    assert_int_equal(kill(p0, SIGINT), 0);
    assert_int_equal(kill(p1, SIGINT), 0);
    assert_int_equal(consume_in_order(ld, NULL), 40);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(worker_pid(ld, 0), p0);
    assert_int_equal(worker_pid(ld, 1), p1);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* Forks a trainer that opens a loader with three process workers and waits
 * to be killed; kills it with SIGKILL once the loader is open, and reaps
 * it. Returns its pid, with its workers' pids in pids. */
static pid_t kill_a_trainer(int pids[3])
{
    int to_parent[2], to_child[2];
    assert_int_equal(pipe(to_parent), 0);
    assert_int_equal(pipe(to_child), 0);
    pid_t trainer = fork();
    assert_true(trainer >= 0);
    if (trainer == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        ferry_config *cfg = make_cfg(3, 32, "synthetic:n=1000,dim=16");
        ferry_loader *ld;
        if (ferry_loader_open(&ld, cfg) != FERRY_OK)
            _exit(1);
        for (uint32_t i = 0; i < 3; i++)
            ferry_loader_worker_pid(ld, i, &pids[i]);
        if (write(to_parent[1], pids, 3 * sizeof *pids) != 3 * sizeof *pids)
            _exit(2);
        char c;
        while (read(to_child[0], &c, 1) < 0) /* until killed */
            ;
        _exit(3);
    }
    close(to_parent[1]);
    close(to_child[0]);
    assert_int_equal(read(to_parent[0], pids, 3 * sizeof *pids), 3 * sizeof *pids);
    assert_int_equal(kill(trainer, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(trainer, &st, 0), trainer);
    close(to_parent[0]);
    close(to_child[1]);
    return trainer;
}

static void test_trainer_killed_takes_its_workers_down_within_1s(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    int pids[3];
    kill_a_trainer(pids);
    for (int i = 0; i < 3; i++) {
        int64_t took = ft_wait_gone(pids[i], 1000);
        print_message("worker %d gone %lld ms after the trainer\n", i, (long long)took);
        assert_true(took >= 0);
    }
    /* The killed trainer could not remove its ipc directory (the next
     * loader does: the case below); clear it so ft_end checks the rest. */
    assert_true(ft_empty_dir(snap.tmpdir, "ferry-") >= 0);
    ft_end(&snap);
}

/* The name of the one entry in dir, into name. */
static void only_entry(const char *dir, char *name, size_t cap)
{
    assert_int_equal(ft_count_entries(dir), 1);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL && e->d_name[0] == '.')
        ;
    assert_non_null(e);
    snprintf(name, cap, "%s", e->d_name);
    closedir(d);
}

/* Makes directory dir/<pattern, its XXXXXX filled> with `mode` and returns
 * its path in a static slot (one of eight). */
static const char *make_dir(const char *dir, const char *pattern, mode_t mode)
{
    static char paths[8][320];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", dir, pattern);
    assert_non_null(mkdtemp(p));
    assert_int_equal(chmod(p, mode), 0);
    return p;
}

/* A unix socket bound at dir/loader, listening; the fd. Closed, it leaves
 * the file of a dead loader's socket behind. */
static int bind_loader_socket(const char *dir)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/loader", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

static int exists(const char *dir, const char *name)
{
    char path[640];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A killed trainer's ipc directory is removed by the next loader opened
 * under the same TMPDIR; everything that is not a dead loader's directory
 * of ours stays: a name of another form, a live process's directory, one
 * with another mode, one whose socket someone still listens on (a loader in
 * another pid namespace), one holding more than the socket (it may lose
 * the dead socket, never the rest), and a symlink to a directory. */
static void test_next_loader_removes_a_killed_trainers_ipc_directory(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    const char *tmp = snap.tmpdir;
    int pids[3];
    pid_t trainer = kill_a_trainer(pids);
    for (int i = 0; i < 3; i++)
        assert_true(ft_wait_gone(pids[i], 5000) >= 0);
    char stale[64];
    only_entry(tmp, stale, sizeof stale);
    print_message("left by the killed trainer: %s\n", stale);

    char dead[64], link[320];
    snprintf(dead, sizeof dead, "ferry-%d-XXXXXX", (int)trainer);
    make_dir(tmp, "ferry-notapid-XXXXXX", 0700);
    char live[64];
    snprintf(live, sizeof live, "ferry-%d-XXXXXX", (int)getpid());
    make_dir(tmp, live, 0700);
    make_dir(tmp, dead, 0755);
    int listening = bind_loader_socket(make_dir(tmp, dead, 0700));
    const char *crowded = make_dir(tmp, dead, 0700);
    close(bind_loader_socket(crowded));
    char keep[400];
    snprintf(keep, sizeof keep, "%s/notes", crowded);
    int fd = open(keep, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    const char *victim = make_dir(tmp, "victim-XXXXXX", 0700);
    close(bind_loader_socket(victim));
    snprintf(link, sizeof link, "%s/ferry-%d-Linked", tmp, (int)trainer);
    assert_int_equal(symlink(victim, link), 0);
    int before = ft_count_entries(tmp);

    ferry_loader *ld = ft_open_ok(make_cfg(1, 32, "synthetic:n=64,dim=4"));
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    assert_false(exists(tmp, stale));
    assert_int_equal(ft_count_entries(tmp), before - 1);
    assert_true(exists(crowded, "notes"));
    assert_true(exists(victim, "loader"));
    close(listening);
    assert_true(ft_empty_dir(tmp, "") >= 0);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Shutdown is bounded in every state
 */

/* For ft_wait_stats: at least `n` batches (or failures) received. */
static void test_close_is_bounded_with_hung_stopped_or_deaf_workers(void **state)
{
    (void)state;
    static const char *const specs[] = {
        "n=64,hang_at=20",               /* blocked in the dataset: STOP unread */
        "n=64,hang_at=20,ignore_term=1", /* and deaf to SIGTERM */
    };
    for (size_t c = 0; c < 2; c++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        ferry_config *cfg = make_cfg(2, 16, hostile(specs[c]));
        ferry_loader *ld = ft_open_ok(cfg);
        ferry_batch *b;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_release(b);
        /* Let the hang happen: batch 1 holds index 20. */
        ft_wait_stats(ld, ft_completed_at_least, 1, 5000);
        ft_close_within(ld, 300 + 300 + 2000);
        ft_end(&snap);
    }

    /* A stopped worker: SIGTERM stays pending on it, only SIGKILL works. */
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_loader *ld = ft_open_ok(make_cfg(2, 16, "synthetic:n=640,dim=8"));
    assert_int_equal(kill(worker_pid(ld, 0), SIGSTOP), 0);
    ft_close_within(ld, 300 + 300 + 2000);
    ft_end(&snap);

    /* Before any next(), and after an error. */
    ft_begin(&snap, 30);
    ld = ft_open_ok(make_cfg(2, 16, "synthetic:n=640,dim=8"));
    ft_close_within(ld, 2000);
    ft_end(&snap);

    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg(2, 16, "synthetic:n=640,dim=8");
    ferry_config_set(cfg, "on_worker_failure", "fail");
    ld = ft_open_ok(cfg);
    assert_int_equal(kill(worker_pid(ld, 1), SIGKILL), 0);
    ferry_batch *b;
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK)
        ferry_batch_release(b);
    assert_int_equal(rc, FERRY_EWORKER);
    ft_close_within(ld, 2000);
    ft_end(&snap);
}

static void *close_in_thread(void *arg)
{
    return (void *)(intptr_t)ferry_loader_close(arg);
}

static void test_close_from_another_thread_is_supported(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_loader *ld = ft_open_ok(make_cfg(2, 16, "synthetic:n=640,dim=8"));
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, close_in_thread, ld), 0);
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_int_equal((int)(intptr_t)ret, FERRY_OK);
    ft_assert_synthetic(b, 0);
    ferry_batch_release(b);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * A fork-unsafe parent
 */

static void test_openmp_trainer_with_openmp_workers(void **state)
{
    (void)state;
    /* Start libgomp's thread pool in the trainer before opening the loader:
     * a fork without exec would inherit its locks held by threads that do
     * not exist in the child. */
    long sum = 0;
#pragma omp parallel for reduction(+ : sum) num_threads(4)
    for (long i = 0; i < 100000; i++)
        sum += i % 7;
    assert_true(sum > 0);
    assert_true(omp_get_max_threads() >= 1);

    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(2, 32, hostile("n=500,dim=32,omp=1"));
    ferry_config_set_int(cfg, "epochs", 2);
    ferry_loader *ld = ft_open_ok(cfg);
    assert_int_equal(consume_in_order(ld, NULL), 2 * 16);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    /* libgomp's pool stays alive in this process: count it in the baseline. */
    snap.nthreads = ft_count_threads();
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * ferry_loader_open fails cleanly at every step
 */

static void test_open_failures_are_clean_and_specific(void **state)
{
    (void)state;
    static const struct {
        const char *args;
        int code;
        const char *words[4];
    } cases[] = {
        {"exit_at_open=3,say=cannot-find-data",
         FERRY_EWORKER,
         {"exited with code 3 while starting", "cannot-find-data", NULL}},
        {"fail_open_worker=1", FERRY_EDATASET, {"worker 1 (pid ", "refusing to open", NULL}},
        {"length_by_worker=1", FERRY_EMISMATCH, {"items in dataset", NULL}},
        /* Whichever READY comes first sets the schema the other is held to. */
        {"dim_by_worker=1",
         FERRY_EMISMATCH,
         {"(pid ", "another schema", "field 0 'x' has items of shape [1", NULL}},
        {"bogus=1", FERRY_EDATASET, {"unknown key 'bogus'", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        ferry_config *cfg = make_cfg(2, 16, hostile(cases[c].args));
        ferry_loader *ld = NULL;
        int rc = ferry_loader_open(&ld, cfg);
        ferry_config_free(cfg);
        ft_expect_error(rc, cases[c].code, cases[c].words);
        assert_null(ld);
        ft_end(&snap);
    }
}

/* A local worker of another protocol version (worker_path names another
 * ferry's ferry-worker, older or newer): open fails at once with
 * FERRY_EVERSION naming both versions and the program, not after
 * start_timeout_ms; the worker is told to stop (REFUSE, or STOP for a
 * version 1 worker, which knows no REFUSE) and exits. */
static void test_open_fails_at_once_for_a_worker_of_another_version(void **state)
{
    (void)state;
    struct {
        char script[32], words[96];
    } cases[2];
    const unsigned versions[2] = {1, FERRY_PROTOCOL_VERSION + 1};
    for (size_t c = 0; c < 2; c++) {
        snprintf(cases[c].script, sizeof cases[c].script, "version=%u", versions[c]);
        snprintf(cases[c].words, sizeof cases[c].words,
                 "protocol version %u worker, version %u loader", versions[c],
                 FERRY_PROTOCOL_VERSION);
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        assert_int_equal(setenv("FERRY_TEST_SCRIPT", cases[c].script, 1), 0);
        ferry_config *cfg = make_cfg(1, 16, "synthetic:n=160,dim=8");
        assert_int_equal(ferry_config_set(cfg, "worker_path", FERRY_TEST_SCRIPTED), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "start_timeout_ms", 20000), FERRY_OK);
        ferry_loader *ld = NULL;
        uint64_t t0 = ft_now_ms();
        int rc = ferry_loader_open(&ld, cfg);
        uint64_t took = ft_now_ms() - t0;
        ferry_config_free(cfg);
        print_message("open failed after %llu ms: %s\n", (unsigned long long)took,
                      ferry_last_error());
        FT_EXPECT_ERROR(rc, FERRY_EVERSION, cases[c].words, "worker 0 (pid ", "scripted worker",
                        FERRY_TEST_SCRIPTED, NULL);
        assert_null(ld);
        assert_true(took < 5000);
        unsetenv("FERRY_TEST_SCRIPT");
        ft_end(&snap);
    }
}

/* A local worker whose batch does not match the schema it announced (a bug
 * in the worker program: ferry-worker builds every batch from that schema)
 * has that batch failed with FERRY_EBATCH saying what differed, counted as
 * malformed; the worker stays, and the rest of the stream arrives intact. */
static void test_local_wrong_batch_fails_that_batch_only(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    assert_int_equal(setenv("FERRY_TEST_SCRIPT", "wrong_at=2", 1), 0);
    ferry_config *cfg = make_cfg(1, 16, "synthetic:n=160,dim=8");
    assert_int_equal(ferry_config_set(cfg, "worker_path", FERRY_TEST_SCRIPTED), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    for (uint64_t k = 0; k < 10; k++) {
        ferry_batch *b = NULL;
        int rc = ferry_loader_next(ld, &b);
        if (k == 2) {
            print_message("%s\n", ferry_last_error());
            FT_EXPECT_ERROR(rc, FERRY_EBATCH, "worker 0 (pid ", "batch 2 (epoch 0, batch 2)",
                            "field 0 'x' is int8, not uint8", NULL);
            continue;
        }
        if (rc != FERRY_OK)
            fail_msg("batch %llu: %s: %s", (unsigned long long)k, ferry_err_name(rc),
                     ferry_last_error());
        ft_assert_synthetic(b, 8);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ferry_batch_release(b);
    }
    ferry_batch *b = NULL;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
    ferry_stats st;
    assert_int_equal(ferry_loader_stats(ld, &st), FERRY_OK);
    assert_int_equal(st.malformed, 1);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.delivered, 10);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    unsetenv("FERRY_TEST_SCRIPT");
    ft_end(&snap);
}

/* The worker of slot 1 of a two-worker loader, held back by the script
 * until the test creates the file `go`; then it serves (die 0) or exits
 * without a word (die 1). */
/* A fresh folder dir and the path of the file `go` in it (not made yet). */
static void make_go_path(char *dir, char *go, size_t cap)
{
    assert_non_null(mkdtemp(dir));
    snprintf(go, cap, "%s/go", dir);
}

static ferry_loader *open_with_a_late_worker(char *dir, char *go, size_t cap, int die)
{
    make_go_path(dir, go, cap);
    char script[600];
    snprintf(script, sizeof script, "late=1,%s,%s", die ? "die" : "serve", go);
    assert_int_equal(setenv("FERRY_TEST_SCRIPT", script, 1), 0);
    ferry_config *cfg = make_cfg(2, 16, "synthetic:n=160,dim=8");
    assert_int_equal(ferry_config_set(cfg, "worker_path", FERRY_TEST_SCRIPTED), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "open_local_ready", 1), FERRY_OK);
    return ft_open_ok(cfg);
}

static void let_go(const char *go)
{
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
}

/* next() until it fails: its error code; *got counts the batches before. */
static int next_until_error(ferry_loader *ld, uint64_t *got)
{
    for (*got = 0;; ++*got) {
        ferry_batch *b = NULL;
        int rc = ferry_loader_next(ld, &b);
        if (rc != FERRY_OK)
            return rc;
        ferry_batch_release(b);
    }
}

/* After the loader closed: the script (if any) and its file gone. */
static void forget_the_late_worker(const char *dir, const char *go)
{
    unsetenv("FERRY_TEST_SCRIPT");
    assert_int_equal(unlink(go), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* open_local_ready=1: open returns once worker 0 is ready, while worker 1
 * is still starting (its script holds it back until the test lets it go);
 * worker 0 serves the batches meanwhile, in order; worker 1 then joins,
 * and nothing is lost or repeated. */
static void test_open_local_ready_opens_before_every_worker_is(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char dir[] = "/tmp/ferry-test-late-XXXXXX", go[64];
    ferry_loader *ld = open_with_a_late_worker(dir, go, sizeof go, 0);
    uint64_t k = 0;
    for (; k < 20; k++) { /* more than the window: worker 0 alone made them */
        ferry_batch *b = NULL;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ferry_batch_release(b);
    }
    assert_int_equal(ft_stats(ld).workers, 1);
    let_go(go);
    for (int joined = 0; !joined || k < 200; k++) {
        ferry_batch *b = NULL;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ferry_batch_release(b);
        joined = joined || ft_stats(ld).workers == 2;
    }
    ferry_stats st = ft_stats(ld);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(st.failed, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    forget_the_late_worker(dir, go);
    ft_end(&snap);
}

/* A worker still starting when open returned (open_local_ready) that
 * dies is replaced as any worker is; one that keeps dying without a batch
 * fails the loader with its last words: never a hang, never a loop. */
static void test_a_worker_that_keeps_dying_as_it_starts_after_open_fails_the_loader(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char dir[] = "/tmp/ferry-test-late-XXXXXX", go[64];
    ferry_loader *ld = open_with_a_late_worker(dir, go, sizeof go, 1);
    ferry_batch *b = NULL;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK); /* worker 0's */
    ferry_batch_release(b);
    let_go(go);
    uint64_t got;
    int rc = next_until_error(ld, &got);
    FT_EXPECT_ERROR(rc, FERRY_EWORKER, "worker 1 died 6 times in a row without delivering",
                    "exited with code 3", "gives up before its HELLO", NULL);
    assert_int_equal(ft_stats(ld).restarts, 5);
    ferry_loader_close(ld);
    forget_the_late_worker(dir, go);
    ft_end(&snap);
}

/* A worker still opening its dataset when open returned (open_local_ready)
 * that has no process to kill and start again (a thread here; or one its
 * clean parent never forked) fails the loader once it is not ready within
 * start_timeout_ms, with a timeout naming it, as open did when it waited
 * for every worker: its batches (torch's assignment: every other one) are
 * never waited for forever. */
static void test_a_worker_not_ready_by_the_start_timeout_after_open_fails_the_loader(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char dir[] = "/tmp/ferry-test-late-XXXXXX", go[64], args[200];
    make_go_path(dir, go, sizeof go);
    snprintf(args, sizeof args, "n=100000,wait_open_worker=1,wait_file=%s", go);
    ferry_config *cfg = make_cfg(2, 16, hostile(args));
    assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "open_local_ready", 1), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "start_timeout_ms", 1000), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "pin_tasks", 2), FERRY_OK);
    uint64_t t0 = ft_now_ms();
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t got;
    int rc = next_until_error(ld, &got);
    FT_EXPECT_ERROR(rc, FERRY_ETIMEDOUT, "worker 1 was not ready within start_timeout_ms 1000",
                    "its thread is still opening the dataset", NULL);
    assert_true(ft_now_ms() - t0 >= 1000);
    assert_true(got >= 1); /* worker 0's first batch, before batch 1 waited for worker 1 */
    let_go(go);
    ferry_loader_close(ld);
    forget_the_late_worker(dir, go);
    ft_end(&snap);
}

/* Every open-file limit from "no fd to spare" to "one fd short of an
 * eight-worker loader" gives FERRY_ELIMIT naming the limit: never an abort
 * (libzmq aborts when its own threads cannot get an fd, so ferry must refuse
 * before that), never a hang. */
static void test_open_fails_clearly_at_the_fd_limit(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    /* In a child, so the lowered limits do not outlive the case. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int used = ft_count_fds();
        ferry_config *cfg = make_cfg(1, 16, "synthetic:n=640,dim=8");
        ferry_loader *ld = NULL;
        if (ferry_loader_open(&ld, cfg) != FERRY_OK)
            _exit(2);
        int one_worker = ft_count_fds() - used;
        ferry_loader_close(ld);
        ferry_config_free(cfg);

        cfg = make_cfg(8, 16, "synthetic:n=640,dim=8");
        for (int extra = 0; extra <= one_worker + 1; extra++) {
            struct rlimit rl = {.rlim_cur = (rlim_t)(used + extra),
                                .rlim_max = (rlim_t)(used + one_worker + 1)};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                _exit(3);
            ld = NULL;
            int rc = ferry_loader_open(&ld, cfg);
            if (rc != FERRY_ELIMIT || ld || !strstr(ferry_last_error(), "RLIMIT_NOFILE")) {
                fprintf(stderr, "%d spare fds: got %s: %s\n", extra, ferry_err_name(rc),
                        ferry_last_error());
                _exit(1);
            }
            if (ft_count_fds() != used) {
                fprintf(stderr, "%d spare fds: %d fds left open\n", extra, ft_count_fds() - used);
                _exit(1);
            }
        }
        ferry_config_free(cfg);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    ft_end(&snap);
}

/* Every allocation ferry makes while opening is made to fail in turn; each
 * failure must give FERRY_ENOMEM and leave nothing behind (ASan's leak check
 * covers memory, ft_end the rest). */
static void test_open_fails_cleanly_when_any_allocation_fails(void **state)
{
    (void)state;
    static const char *const modes[] = {"process", "thread"};
    for (int m = 0; m < 2; m++) {
        int reached_end = 0;
        for (uint64_t k = 1; k < 500 && !reached_end; k++) {
            ft_snapshot snap;
            ft_begin(&snap, 30);
            ferry_config *cfg = make_cfg(2, 16, "synthetic:n=640,dim=8");
            ferry_config_set(cfg, "worker_mode", modes[m]);
            ferry_loader *ld = NULL;
            ferry__alloc_fail_at(k);
            int rc = ferry_loader_open(&ld, cfg);
            int fired = ferry__alloc_failed();
            ferry__alloc_fail_at(0);
            ferry_config_free(cfg);
            if (rc == FERRY_OK) {
                /* The failure came after open, or not at all. */
                reached_end = !fired;
                ferry_batch *b;
                rc = ferry_loader_next(ld, &b);
                if (rc == FERRY_OK) {
                    ferry_batch_release(b);
                } else if (rc == FERRY_EBATCH) {
                    /* A thread worker ran out building this batch: reported,
                     * and the run could go on. */
                    assert_non_null(strstr(ferry_last_error(), "out of memory"));
                } else {
                    assert_int_equal(rc, FERRY_ENOMEM);
                }
                assert_int_equal(ferry_loader_close(ld), FERRY_OK);
            } else {
                if (rc != FERRY_ENOMEM)
                    print_error("k=%llu: %s: %s\n", (unsigned long long)k, ferry_err_name(rc),
                                ferry_last_error());
                assert_true(fired);
                assert_int_equal(rc, FERRY_ENOMEM);
                assert_null(ld);
            }
            ft_end(&snap);
        }
        assert_true(reached_end);
    }
}

/* ------------------------------------------------------------------------
 * A child the trainer forks
 */

/* What `fd` says until EOF, within ms: into buf (NUL-terminated, at most
 * cap - 1 bytes); the bytes read, or -1 when the time ran out first. */
static ssize_t read_within(int fd, char *buf, size_t cap, int ms)
{
    uint64_t deadline = ft_now_ms() + (uint64_t)ms;
    size_t n = 0;
    buf[0] = '\0';
    for (;;) {
        uint64_t now = ft_now_ms();
        if (now >= deadline)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) <= 0)
            continue;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) == cap - 1) {
            buf[n] = '\0';
            return (ssize_t)n;
        }
    }
}

/* The first line of /proc/self/maps that is ferry's memory (a name holding
 * "ferry": memfd:ferry-task-words, memfd:ferry-slots) mapped writable and
 * shared, into out; "none" when there is none. */
static void first_shared_ferry_map(char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512], perms[8];
    snprintf(out, cap, "%s", f ? "none" : "cannot read /proc/self/maps");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%*s %7s", perms) == 1 && strstr(line, "ferry") && perms[0] == 'r' &&
            perms[1] == 'w' && perms[3] == 's') {
            snprintf(out, cap, "%s", line);
            break;
        }
    }
    if (f)
        fclose(f);
}

/* A child forked (plain fork(), as a trainer's own DataLoader or a
 * subprocess does) while a loader with process workers is open, and holds
 * a batch, keeps no writable mapping of the loader's memory: not the task
 * words the workers write (which it could scribble over, and whose page it
 * pinned after the loader closed), not the batch slots (the held batch
 * becomes its own private copy). Issue 36.2. */
static void test_a_forked_child_keeps_no_writable_view_of_the_loader(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_loader *ld = ft_open_ok(make_cfg(2, 16, "synthetic:n=640,dim=8"));
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    /* The probe sees the loader's shared memory where it is mapped. */
    char here[512];
    first_shared_ferry_map(here, sizeof here);
    assert_string_not_equal(here, "none");
    int to_parent[2];
    assert_int_equal(pipe2(to_parent, O_CLOEXEC), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char line[512];
        first_shared_ferry_map(line, sizeof line);
        ssize_t ignored = write(to_parent[1], line, strlen(line));
        (void)ignored;
        _exit(0);
    }
    close(to_parent[1]);
    char said[512];
    ssize_t got = read_within(to_parent[0], said, sizeof said, 10000);
    close(to_parent[0]);
    int status = -1;
    if (got < 0)
        kill(pid, SIGKILL);
    int reaped = ft_wait_child(pid, 10000, &status);
    ferry_batch_release(b);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    if (got < 0)
        fail_msg("the forked child said nothing within 10 s");
    print_message("the forked child: %s\n", said);
    assert_int_equal(reaped, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_string_equal(said, "none");
    ft_end(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dead_worker_is_noticed_within_100ms_and_named),
        cmocka_unit_test(test_crash_is_explained_with_signal_and_last_words),
        cmocka_unit_test(test_restart_replaces_killed_workers_and_loses_nothing),
        cmocka_unit_test(test_log_callback_gets_one_message_per_death),
        cmocka_unit_test(test_a_dataset_that_does_not_open_is_said_once),
        cmocka_unit_test(test_log_levels_are_named),
        cmocka_unit_test(test_poison_batch_is_given_up_and_run_continues),
        cmocka_unit_test(test_only_the_poison_batch_is_ever_given_up_under_load),
        cmocka_unit_test(test_stopped_worker_is_replaced_after_timeout),
        cmocka_unit_test(test_hanging_batch_times_out_then_is_given_up),
        cmocka_unit_test(test_timeout_under_fail_policy_names_worker_and_task),
        cmocka_unit_test(test_workers_ignore_sigint),
        cmocka_unit_test(test_trainer_killed_takes_its_workers_down_within_1s),
        cmocka_unit_test(test_next_loader_removes_a_killed_trainers_ipc_directory),
        cmocka_unit_test(test_close_is_bounded_with_hung_stopped_or_deaf_workers),
        cmocka_unit_test(test_close_from_another_thread_is_supported),
        cmocka_unit_test(test_openmp_trainer_with_openmp_workers),
        cmocka_unit_test(test_open_failures_are_clean_and_specific),
        cmocka_unit_test(test_open_fails_at_once_for_a_worker_of_another_version),
        cmocka_unit_test(test_local_wrong_batch_fails_that_batch_only),
        cmocka_unit_test(test_open_local_ready_opens_before_every_worker_is),
        cmocka_unit_test(test_a_worker_that_keeps_dying_as_it_starts_after_open_fails_the_loader),
        cmocka_unit_test(test_a_worker_not_ready_by_the_start_timeout_after_open_fails_the_loader),
        cmocka_unit_test(test_open_fails_clearly_at_the_fd_limit),
        cmocka_unit_test(test_a_replacement_that_cannot_start_is_tried_again),
        cmocka_unit_test(test_no_worker_left_to_start_fails_after_the_start_timeout),
        cmocka_unit_test(test_pinned_tasks_fail_when_their_worker_cannot_start),
        cmocka_unit_test(test_open_fails_cleanly_when_any_allocation_fails),
        cmocka_unit_test(test_a_forked_child_keeps_no_writable_view_of_the_loader),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
