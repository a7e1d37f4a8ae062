/*
 * test_tools.c - every installed program answers the command line the same
 * way: `--version` prints "NAME VERSION" and exits 0, `--help` prints
 * "usage: NAME ..." on stdout (listing --help and --version) and exits 0,
 * and an unknown option says "NAME: bad argument '...'" on stderr, prints
 * the usage there, and exits 2.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

extern char **environ;

typedef struct ran {
    int status;
    char out[8192], err[8192];
} ran;

/* Reads what fd holds into buf (a NUL-terminated prefix). */
static void slurp(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    ssize_t r;
    lseek(fd, 0, SEEK_SET);
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
}

/* Runs `path arg` with stdout and stderr in files, waits (bounded) and
 * fills *r. */
static void run_tool(const char *path, const char *arg, ran *r)
{
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(out), 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(err), 2);
    char *argv[] = {(char *)path, (char *)arg, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, path, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(ft_wait_child(pid, 10000, &r->status), 0);
    slurp(fileno(out), r->out, sizeof r->out);
    slurp(fileno(err), r->err, sizeof r->err);
    fclose(out);
    fclose(err);
}

static void check_tool(const char *path, const char *name)
{
    ran r;
    char want[128];

    run_tool(path, "--version", &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    snprintf(want, sizeof want, "%s %s\n", name, ferry_version());
    assert_string_equal(r.out, want);

    run_tool(path, "--help", &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    snprintf(want, sizeof want, "usage: %s ", name);
    assert_true(strncmp(r.out, want, strlen(want)) == 0);
    assert_non_null(strstr(r.out, "--help"));
    assert_non_null(strstr(r.out, "--version"));
    assert_string_equal(r.err, "");

    run_tool(path, "--no-such-option", &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2);
    snprintf(want, sizeof want, "%s: bad argument '--no-such-option'\n", name);
    assert_true(strncmp(r.err, want, strlen(want)) == 0);
    snprintf(want, sizeof want, "usage: %s ", name);
    assert_non_null(strstr(r.err, want));
    assert_string_equal(r.out, "");
}

static void test_ferry_worker_answers_like_every_tool(void **state)
{
    (void)state;
    check_tool(FERRY_TEST_WORKER, "ferry-worker");
}

static void test_ferry_keygen_answers_like_every_tool(void **state)
{
    (void)state;
    check_tool(FERRY_TEST_KEYGEN, "ferry-keygen");
}

static void test_ferry_bench_answers_like_every_tool(void **state)
{
    (void)state;
    check_tool(FERRY_TEST_BENCH, "ferry-bench");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ferry_worker_answers_like_every_tool),
        cmocka_unit_test(test_ferry_keygen_answers_like_every_tool),
        cmocka_unit_test(test_ferry_bench_answers_like_every_tool),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
