/*
 * test_forked.c - a fork of the trainer taken while one of ferry's threads
 * holds one of its locks.
 *
 * The trainer forks at any moment: a loader's template (os.fork on ferry's
 * forking thread), multiprocessing's fork start, a user's os.fork(). Only
 * the forking thread exists in the child, so a lock another thread held at
 * that instant would stay locked there for ever, and the child's first log
 * line or loader open would hang. Each case holds a lock on a thread,
 * waits (on an event, with a deadline) until it is held, forks, and has the
 * child take the same lock under an alarm: a hang fails the case.
 */
#include <errno.h>
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "error.h"
#include "ferry.h"
#include "forkserver.h"
#include "harness.h"
#include "log.h"

/* How long the child may take to do what must not hang. */
#define CHILD_LIMIT_S 10

/* Waits up to ms for fd to be readable; asserts it is. */
static void wait_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do
        r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    assert_int_equal(r, 1);
}

/* Forks a child that runs fn under an alarm and exits with its result;
 * asserts it exited 0 within the limit (a child stuck on a lock is killed
 * by its alarm and fails the case). */
static void in_a_fork(int (*fn)(void))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(CHILD_LIMIT_S);
        _exit(fn());
    }
    int status = 0;
    assert_int_equal(ft_wait_child(pid, (CHILD_LIMIT_S + 5) * 1000, &status), 0);
    if (WIFSIGNALED(status))
        fail_msg("the child was killed by signal %d (SIGALRM: it hung on a lock)",
                 WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ------------------------------------------------------------------------
 * The log lock: held while a callback runs (a Python callback waits there
 * for the GIL, which the forking thread holds).
 */

typedef struct {
    int held[2];    /* the callback writes a byte: the lock is held */
    int release[2]; /* the test writes a byte: the callback returns */
    int ok;         /* the callback's own checks held (no cmocka off the main thread) */
} log_gate;

static void blocking_log(void *user, int level, const char *message)
{
    (void)level;
    (void)message;
    log_gate *g = user;
    char c = 1;
    struct pollfd p = {.fd = g->release[0], .events = POLLIN};
    g->ok = write(g->held[1], &c, 1) == 1 && poll(&p, 1, 20000) == 1 &&
            read(g->release[0], &c, 1) == 1;
}

static void *log_through_gate(void *arg)
{
    ferry__log lg = {blocking_log, arg, FERRY_LOG_INFO};
    ferry__logf(&lg, FERRY_LOG_WARN, "held across a fork");
    return NULL;
}

static void quiet_log(void *user, int level, const char *message)
{
    (void)level;
    (void)message;
    ++*(int *)user;
}

static int child_logs(void)
{
    int said = 0;
    ferry__log lg = {quiet_log, &said, FERRY_LOG_INFO};
    ferry__logf(&lg, FERRY_LOG_WARN, "from the child");
    return said == 1 ? 0 : 1;
}

static void test_a_fork_while_a_log_callback_runs_can_log(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    log_gate g = {.ok = 0};
    assert_int_equal(pipe(g.held), 0);
    assert_int_equal(pipe(g.release), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, log_through_gate, &g), 0);
    wait_readable(g.held[0], 10000);

    in_a_fork(child_logs);

    char c = 1;
    assert_int_equal(write(g.release[1], &c, 1), 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(g.ok);
    for (int i = 0; i < 2; i++) {
        close(g.held[i]);
        close(g.release[i]);
    }
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * The lock that serialises asks to a template: held while the template's
 * answer is awaited (a template forking a clean parent for another loader).
 */

/* A child that waits to be killed (and dies with this process, should a
 * failing test leave it). */
static pid_t paused_child(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    return pid;
}

/* One answer, as the template would send it. */
static void answer(int sock, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    assert_int_equal(send(sock, buf, (size_t)n, 0), n);
}

typedef struct {
    int ctl;
    int rc;
    pid_t pid;
} ask;

static void *ask_template(void *arg)
{
    ask *a = arg;
    char *args[] = {"--fork-server", NULL};
    int fds[] = {a->ctl};
    a->rc = ferry__fork_ask(a->ctl, args, fds, 1, 20000, &a->pid);
    return NULL;
}

/* The child asks a template of its own that never answers: the ask must
 * time out (ESPAWN), not wait for the parent's thread. */
static int child_asks(void)
{
    int ours, theirs;
    if (ferry__fork_socketpair(&ours, &theirs) != FERRY_OK)
        return 2;
    char *args[] = {"--fork-server", NULL};
    int fds[] = {theirs};
    pid_t pid = 0;
    int rc = ferry__fork_ask(ours, args, fds, 1, 100, &pid);
    return rc == FERRY_ESPAWN && strstr(ferry_last_error(), "did not answer") ? 0 : 1;
}

static void test_a_fork_while_a_template_is_asked_can_ask_its_own(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    int ours, theirs;
    assert_int_equal(ferry__fork_socketpair(&ours, &theirs), FERRY_OK);
    ask a = {.ctl = ours};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ask_template, &a), 0);
    /* The request has come: the asking thread holds the lock until the
     * answer below. */
    wait_readable(theirs, 10000);
    char buf[256];
    assert_true(recv(theirs, buf, sizeof buf, 0) > 0);
    assert_int_equal(buf[0], 'A');

    in_a_fork(child_asks);

    answer(theirs, "p4242 %s", buf + 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.rc, FERRY_OK);
    assert_int_equal(a.pid, 4242);
    close(ours);
    close(theirs);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Asks carry ids: an answer to an earlier ask (a clean parent forked for
 * an ask nobody waits for any more) is not taken for this one's; the
 * process it names, this one's child, is killed and reaped. An answer
 * without an id is skipped, its pid left alone.
 */

static void test_an_answer_to_another_ask_is_not_taken_and_its_child_is_reaped(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    int ours, theirs;
    assert_int_equal(ferry__fork_socketpair(&ours, &theirs), FERRY_OK);
    pid_t stale = paused_child(), bystander = paused_child();
    ask a = {.ctl = ours};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ask_template, &a), 0);
    wait_readable(theirs, 10000);
    char buf[256];
    assert_true(recv(theirs, buf, sizeof buf, 0) > 0);
    assert_int_equal(buf[0], 'A');
    unsigned long long id = strtoull(buf + 1, NULL, 10);
    assert_true(id > 0);
    answer(theirs, "p%d %llu", (int)stale, id + 1000);
    answer(theirs, "e%llu not this ask's error", id + 1000);
    answer(theirs, "P%d", (int)bystander);
    answer(theirs, "p4343 %llu", id);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.rc, FERRY_OK);
    assert_int_equal(a.pid, 4343);
    /* the stale one is reaped already; the bystander lives */
    assert_int_equal(waitpid(stale, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
    assert_int_equal(waitpid(bystander, NULL, WNOHANG), 0);
    kill(bystander, SIGKILL);
    assert_int_equal(waitpid(bystander, NULL, 0), bystander);
    close(ours);
    close(theirs);
    ft_end(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_fork_while_a_log_callback_runs_can_log),
        cmocka_unit_test(test_a_fork_while_a_template_is_asked_can_ask_its_own),
        cmocka_unit_test(test_an_answer_to_another_ask_is_not_taken_and_its_child_is_reaped),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
