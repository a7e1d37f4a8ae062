/*
 * test_trainers.c - trainers that do what real programs do to their own
 * process, and a loader that must still work: SIGCHLD ignored (the kernel
 * reaps children at once), SIGCHLD handled by the program's own reaper
 * (servers, job runners, Python), a thread-placement loader whose dataset
 * plugin started an OpenMP pool, closed while the trainer goes on, and
 * files and sockets opened without O_CLOEXEC, which workers must not
 * inherit.
 *
 * Each case runs in its own child process (ft_run_each) under a hard time
 * limit: a loader that spins or hangs after a worker death fails the case
 * instead of blocking the suite.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

#define N_ITEMS 640
#define DIM 16
#define BATCH 32 /* 20 batches an epoch */

/* A trainer's own SIGCHLD handler that reaps every child it can: it races
 * ferry for its workers' exit statuses, and usually wins. */
static void reap_everything(int sig)
{
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

typedef enum sigchld_setup { CHLD_IGNORED, CHLD_OWN_REAPER } sigchld_setup;

static void set_sigchld(sigchld_setup how)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (how == CHLD_IGNORED) {
        sa.sa_handler = SIG_IGN;
    } else {
        sa.sa_handler = reap_everything;
        sa.sa_flags = SA_RESTART;
    }
    assert_int_equal(sigaction(SIGCHLD, &sa, NULL), 0);
}

static ferry_loader *open_loader(const char *policy)
{
    char spec[128];
    snprintf(spec, sizeof spec, "synthetic:n=%d,dim=%d", N_ITEMS, DIM);
    ferry_config *cfg = ft_config(spec, 2, BATCH);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "on_worker_failure", policy), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "close_grace_ms", 300), FERRY_OK);
    return ft_open_ok(cfg);
}

/* Kills local worker 0 with SIGKILL. */
static void kill_worker0(ferry_loader *ld)
{
    int pid = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &pid), FERRY_OK);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
}

static int restarted(const ferry_stats *st, uint64_t n)
{
    return st->restarts >= n;
}

/* Restart policy: the dead worker is replaced and every batch of both
 * epochs arrives once, in order, intact, however the trainer treats
 * SIGCHLD. Five loaders in a row, under load. */
static void death_is_survived(sigchld_setup how)
{
    ft_snapshot snap;
    ft_begin(&snap, 120);
    set_sigchld(how);
    int load = ft_load_start();
    for (int round = 0; round < 5; round++) {
        ferry_loader *ld = open_loader("restart");
        uint64_t seq = 0;
        ferry_batch *b = NULL;
        int rc;
        while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
            ferry_batch_info info;
            ferry_batch_get_info(b, &info);
            assert_int_equal(info.seq, seq);
            ft_assert_synthetic(b, DIM);
            ferry_batch_release(b);
            if (++seq == 5)
                kill_worker0(ld);
        }
        if (rc != FERRY_EOF)
            fail_msg("round %d: %s: %s", round, ferry_err_name(rc), ferry_last_error());
        assert_int_equal(seq, 2 * N_ITEMS / BATCH);
        /* The death may be handled just after the last batch: the other
         * worker can have built everything left by then. */
        assert_true(ft_wait_stats(ld, restarted, 1, 5000) >= 0);
        ft_close_within(ld, 5000);
    }
    ft_load_stop(load);
    ft_end(&snap);
}

/* Fail policy: the loader fails with FERRY_EWORKER naming the worker, even
 * though the exit status went to someone else. */
static void death_is_reported(sigchld_setup how)
{
    ft_snapshot snap;
    ft_begin(&snap, 60);
    set_sigchld(how);
    ferry_loader *ld = open_loader("fail");
    ferry_batch *b = NULL;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_release(b);
    kill_worker0(ld);
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK)
        ferry_batch_release(b);
    FT_EXPECT_ERROR(rc, FERRY_EWORKER, "worker 0", NULL);
    /* Once the status is lost the message says so; when ferry won the race
     * it names the signal. Either way it explains. */
    const char *e = ferry_last_error();
    assert_true(strstr(e, "SIGKILL") || strstr(e, "status is unknown"));
    if (how == CHLD_IGNORED)
        assert_non_null(strstr(e, "ignores SIGCHLD or reaps children itself"));
    ft_close_within(ld, 5000);
    ft_end(&snap);
}

static void test_worker_death_with_sigchld_ignored_is_survived(void **state)
{
    (void)state;
    death_is_survived(CHLD_IGNORED);
}

static void test_worker_death_with_sigchld_ignored_is_reported(void **state)
{
    (void)state;
    death_is_reported(CHLD_IGNORED);
}

static void test_worker_death_with_the_trainers_own_reaper_is_survived(void **state)
{
    (void)state;
    death_is_survived(CHLD_OWN_REAPER);
}

static void test_worker_death_with_the_trainers_own_reaper_is_reported(void **state)
{
    (void)state;
    death_is_reported(CHLD_OWN_REAPER);
}

/* ------------------------------------------------------------------------
 * A trainer's own open files and sockets
 */

/* The (device, inode) pairs behind a process's fds above `above`, read from
 * /proc/<pid>/fd, leaving out anonymous inodes (every eventfd and epoll
 * shares one, so they say nothing about where an fd came from). With
 * `list`, prints each fd and its target. Returns how many (at most cap). */
static int fd_inodes(int pid, int above, struct stat *out, int cap, int list)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < cap;) {
        if (e->d_name[0] == '.' || atoi(e->d_name) <= above)
            continue;
        char path[128], target[256] = "";
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        target[len > 0 ? len : 0] = '\0';
        if (list)
            print_message("  worker %d fd %s -> %s\n", pid, e->d_name, target);
        /* The loader's batch slots are shared with its workers on purpose
         * (transport/shm.h); a trainer's fd is never this one. */
        if (strncmp(target, "anon_inode:", 11) != 0 &&
            strncmp(target, "/memfd:ferry-slots", 18) != 0 && stat(path, &out[n]) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* A trainer that holds a file and a listening socket opened without
 * O_CLOEXEC (as most programs and libraries open them) opens a
 * process-worker loader: no worker holds either, or any other fd of the
 * trainer's. Below 3 a worker has stdin and stdout as the trainer's and its
 * own stderr pipe; above 2, only what it opened itself after exec (ZeroMQ's
 * epolls and eventfds, anonymous inodes, and its connection to the loader's
 * ipc socket, a socket the trainer does not hold) and the loader's batch
 * slots. */
static void test_workers_inherit_none_of_the_trainers_fds(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char path[300];
    snprintf(path, sizeof path, "%s/trainer-data", snap.tmpdir);
    int file = open(path, O_RDWR | O_CREAT, 0600); /* no O_CLOEXEC, on purpose */
    assert_true(file >= 0);
    int sock = socket(AF_INET, SOCK_STREAM, 0); /* no SOCK_CLOEXEC */
    assert_true(sock >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(sock, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(sock, 1), 0);

    ferry_config *cfg = ft_config("synthetic:n=640,dim=16", 2, BATCH);
    ferry_loader *ld = ft_open_ok(cfg);
    struct stat mine[256], theirs[64];
    int nmine = fd_inodes(getpid(), -1, mine, 256, 0);
    for (uint32_t w = 0; w < 2; w++) {
        int pid = 0;
        assert_int_equal(ferry_loader_worker_pid(ld, w, &pid), FERRY_OK);
        int ntheirs = fd_inodes(pid, 2, theirs, 64, 1);
        for (int i = 0; i < ntheirs; i++) {
            if (!S_ISSOCK(theirs[i].st_mode))
                fail_msg("worker %u (pid %d) holds a file (inode %llu) above fd 2", w, pid,
                         (unsigned long long)theirs[i].st_ino);
            for (int j = 0; j < nmine; j++) {
                if (theirs[i].st_dev == mine[j].st_dev && theirs[i].st_ino == mine[j].st_ino)
                    fail_msg("worker %u (pid %d) holds the trainer's inode %llu", w, pid,
                             (unsigned long long)mine[j].st_ino);
            }
        }
    }
    ft_close_within(ld, 5000);
    close(sock);
    close(file);
    assert_int_equal(unlink(path), 0);
    ft_end(&snap);
}

/* Thread workers whose plugin ran an OpenMP loop: the pool's threads
 * outlive the loader, so the plugin (and the OpenMP runtime it brought)
 * must stay loaded after close, or the trainer crashes when they next run.
 * This binary does not link OpenMP itself: only the plugin holds it. */
static void test_thread_workers_with_an_openmp_plugin_close_cleanly(void **state)
{
    (void)state;
    char spec[512];
    snprintf(spec, sizeof spec, "plugin:%s?n=%d,dim=%d,omp=1", FERRY_TEST_HOSTILE, N_ITEMS, DIM);
    for (int round = 0; round < 3; round++) {
        ferry_config *cfg = ft_config(spec, 2, BATCH);
        assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
        ferry_loader *ld = ft_open_ok(cfg);
        ferry_batch *b = NULL;
        int n = 0, rc;
        while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
            ft_assert_synthetic(b, DIM);
            ferry_batch_release(b);
            n++;
        }
        assert_int_equal(rc, FERRY_EOF);
        assert_int_equal(n, N_ITEMS / BATCH);
        ft_close_within(ld, 5000);
    }
    /* The OpenMP pool's threads wake from their spin-wait within this; a
     * crash in them kills this case's process and fails it. */
    uint64_t until = ft_now_ms() + 300;
    while (ft_now_ms() < until)
        ft_sleep_ms(20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_death_with_sigchld_ignored_is_survived),
        cmocka_unit_test(test_worker_death_with_sigchld_ignored_is_reported),
        cmocka_unit_test(test_worker_death_with_the_trainers_own_reaper_is_survived),
        cmocka_unit_test(test_worker_death_with_the_trainers_own_reaper_is_reported),
        cmocka_unit_test(test_thread_workers_with_an_openmp_plugin_close_cleanly),
        cmocka_unit_test(test_workers_inherit_none_of_the_trainers_fds),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
