/*
 * harness.c - leak and hang checks shared by the tests (see harness.h).
 */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

uint64_t ft_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int count_prefixed(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int ft_count_entries(const char *path)
{
    return count_prefixed(path, "");
}

int ft_count_fds(void)
{
    /* opendir holds one fd of its own while counting; it is the same in
     * every call, so comparisons are unaffected. */
    return ft_count_entries("/proc/self/fd");
}

int ft_count_threads(void)
{
    return ft_count_entries("/proc/self/task");
}

void ft_begin(ft_snapshot *s, unsigned limit_s)
{
    alarm(limit_s);
    snprintf(s->tmpdir, sizeof s->tmpdir, "/tmp/ferry-test-XXXXXX");
    assert_non_null(mkdtemp(s->tmpdir));
    setenv("TMPDIR", s->tmpdir, 1);
    s->nfds = ft_count_fds();
    s->nthreads = ft_count_threads();
    /* Only ferry's own shm objects: other programs on the machine may come
     * and go while a test runs. */
    s->nshm = count_prefixed("/dev/shm", "ferry");
}

void ft_end(ft_snapshot *s)
{
    int st;
    pid_t left = waitpid(-1, &st, WNOHANG);
    if (left != -1) {
        print_error("a child process was left behind (waitpid -> %d)\n", (int)left);
        fail();
    }
    assert_int_equal(errno, ECHILD);
    assert_int_equal(ft_count_fds(), s->nfds);
    /* pthread_join can return a moment before the kernel drops the thread
     * from /proc/self/task: re-count for a bounded time before failing. */
    uint64_t until = ft_now_ms() + 500;
    while (ft_count_threads() != s->nthreads && ft_now_ms() < until)
        sched_yield();
    assert_int_equal(ft_count_threads(), s->nthreads);
    assert_int_equal(ft_count_entries(s->tmpdir), 0);
    int nshm = count_prefixed("/dev/shm", "ferry");
    assert_int_equal(nshm, s->nshm);
    assert_int_equal(rmdir(s->tmpdir), 0);
    unsetenv("TMPDIR");
    alarm(0);
}

/* LeakSanitizer checks at exit, which _exit skips: under ASan the child
 * asks for the check itself (the symbol exists only in sanitized builds). */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

int ft_run_each(const struct CMUnitTest *tests, size_t n)
{
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return (int)n;
        }
        if (pid == 0) {
            /* The child's own alarm (ft_begin) bounds a hang; this one bounds
             * a case that never calls ft_begin. */
            alarm(120);
            int rc = _cmocka_run_group_tests(tests[i].name, &tests[i], 1, NULL, NULL);
            if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
                printf("[  FAILED  ] %s: memory leaked (LeakSanitizer's report above)\n",
                       tests[i].name);
                rc = 1;
            }
            fflush(stdout);
            fflush(stderr);
            _exit(rc == 0 ? 0 : 1);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (WIFSIGNALED(st))
                printf("[  FAILED  ] %s: killed by signal %d (a hang past its time limit?)\n",
                       tests[i].name, WTERMSIG(st));
            failed++;
        }
    }
    printf("%s: %zu passed, %d failed\n", "tests", n - (size_t)failed, failed);
    return failed;
}
