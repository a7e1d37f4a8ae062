/*
 * harness.c - leak, hang and content checks shared by the tests and the
 * soak (see harness.h). The probes come first and use no cmocka; the
 * assertions at the end wrap them for cmocka cases.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dataset.h"

/* How long a joined thread may still be listed in /proc/self/task. */
#define THREAD_SETTLE_MS 500

/* Writes a sentence into why; returns -1, so a check can end with
 * `return say(...)`. */
__attribute__((format(printf, 3, 4))) static int say(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* ------------------------------------------------------------------------
 * Time, counts, files
 */

uint64_t ft_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void ft_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
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

long ft_minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : -1;
}

long ft_status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    size_t len = strlen(key);
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, key, len) && line[len] == ':') {
            kib = strtol(line + len + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kib;
}

void ft_list_entries(FILE *f, const char *path, int links)
{
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char full[512], target[512] = "";
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (links) {
            ssize_t n = readlink(full, target, sizeof target - 1);
            target[n > 0 ? n : 0] = '\0';
        }
        fprintf(f, "    %s%s%s\n", e->d_name, links ? " -> " : "", target);
    }
    closedir(d);
}

void ft_dump_threads(FILE *out, int pid, const char *role)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    fprintf(out, "  %s %d:\n", role, pid);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        char f[128], comm[64] = "?", wchan[64] = "?", statbuf[512] = "";
        const struct {
            const char *name;
            char *buf;
            size_t cap;
        } files[] = {{"comm", comm, sizeof comm},
                     {"wchan", wchan, sizeof wchan},
                     {"stat", statbuf, sizeof statbuf}};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(f, sizeof f, "/proc/%d/task/%s/%s", pid, e->d_name, files[i].name);
            int fd = open(f, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, files[i].buf, files[i].cap - 1);
            close(fd);
            files[i].buf[n > 0 ? n : 0] = '\0';
            files[i].buf[strcspn(files[i].buf, "\n")] = '\0';
        }
        /* The command name in stat is in parentheses and may hold anything:
         * the state follows the last ')'. */
        char *rp = strrchr(statbuf, ')');
        fprintf(out, "    thread %s %-16s state %c wchan %s\n", e->d_name, comm,
                rp && rp[1] ? rp[2] : '?', wchan);
    }
    closedir(d);
}

int ft_make_tmpdir(char *buf, size_t cap, const char *name)
{
    if ((size_t)snprintf(buf, cap, "/tmp/%s-XXXXXX", name) >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(buf) ? 0 : -1;
}

int ft_empty_dir(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int removed = 0, failed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        struct stat sb;
        int rc = lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode) ? ft_remove_tree(sub) : unlink(sub);
        if (rc == 0)
            removed++;
        else
            failed = 1;
    }
    closedir(d);
    return failed ? -1 : removed;
}

int ft_remove_tree(const char *path)
{
    return ft_empty_dir(path, "") < 0 || rmdir(path) != 0 ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * Leaks and processes
 */

void ft_snapshot_take(ft_snapshot *s, const char *tmpdir)
{
    snprintf(s->tmpdir, sizeof s->tmpdir, "%s", tmpdir ? tmpdir : "");
    s->nfds = ft_count_fds();
    s->nthreads = ft_count_threads();
    /* Only ferry's own shm objects: other programs on the machine may come
     * and go while a test runs. */
    s->nshm = count_prefixed("/dev/shm", "ferry");
}

/* Checked in a fixed order (children, fds, threads, files), the first
 * leak found named with what it is: a little over 60 lines, one per kind. */
ft_leak ft_leaks(const ft_snapshot *s, FILE *detail, char *why, size_t cap)
{
    int st;
    pid_t left = waitpid(-1, &st, WNOHANG);
    if (left == 0) {
        say(why, cap, "a child process is still running");
        return FT_LEAK_CHILD;
    }
    if (left > 0) {
        say(why, cap, "child %d was left unreaped", (int)left);
        return FT_LEAK_CHILD;
    }
    if (errno != ECHILD) {
        say(why, cap, "waitpid: %s", strerror(errno));
        return FT_LEAK_CHILD;
    }

    int fds = ft_count_fds();
    if (fds != s->nfds) {
        say(why, cap, "%d fds open at the snapshot, %d now", s->nfds, fds);
        if (detail) {
            fprintf(detail, "open fds:\n");
            ft_list_entries(detail, "/proc/self/fd", 1);
        }
        return FT_LEAK_FDS;
    }

    /* pthread_join() returns once the thread has exited, but the kernel may
     * list it in /proc/self/task a little longer (about 1 in 2000 joins in
     * the soak): a count off the snapshot gets time to come back. */
    int threads = ft_count_threads();
    uint64_t settle_by = ft_now_ms() + THREAD_SETTLE_MS;
    while (threads != s->nthreads && ft_now_ms() < settle_by) {
        ft_sleep_ms(1);
        threads = ft_count_threads();
    }
    if (threads != s->nthreads) {
        say(why, cap, "%d threads at the snapshot, %d now", s->nthreads, threads);
        if (detail)
            ft_dump_threads(detail, (int)getpid(), "this process");
        return FT_LEAK_THREADS;
    }

    if (s->tmpdir[0]) {
        int files = ft_count_entries(s->tmpdir);
        if (files != 0) {
            say(why, cap, "%s holds %d entries, not 0", s->tmpdir, files);
            if (detail) {
                fprintf(detail, "left in %s:\n", s->tmpdir);
                ft_list_entries(detail, s->tmpdir, 0);
            }
            return FT_LEAK_FILES;
        }
    }

    if (s->nshm >= 0) {
        int nshm = count_prefixed("/dev/shm", "ferry");
        if (nshm != s->nshm) {
            say(why, cap, "%d ferry entries in /dev/shm at the snapshot, %d now", s->nshm, nshm);
            return FT_LEAK_SHM;
        }
    }
    return FT_NO_LEAK;
}

int64_t ft_wait_gone(int pid, int ms)
{
    uint64_t t0 = ft_now_ms();
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return errno == ESRCH ? 0 : -1;
    /* A pidfd turns readable when the process exits, zombie or not. */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    for (;;) {
        uint64_t spent = ft_now_ms() - t0;
        r = poll(&p, 1, spent >= (uint64_t)ms ? 0 : (int)((uint64_t)ms - spent));
        if (r >= 0 || errno != EINTR)
            break;
    }
    close(fd);
    return r == 1 ? (int64_t)(ft_now_ms() - t0) : -1;
}

int ft_load_start(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(1);
        close(2);
        alarm(120);
        for (volatile uint64_t x = 0;; x++)
            ;
    }
    return (int)pid;
}

void ft_load_stop(int pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    ft_wait_gone(pid, 5000);
    waitpid(pid, NULL, WNOHANG); /* ours to reap unless SIGCHLD is ignored */
}

int ft_wait_child(int pid, int ms, int *status)
{
    if (ft_wait_gone(pid, ms) < 0)
        return -1;
    while (waitpid(pid, status, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    return 0;
}

int ft_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

int ft_spawn_tied(const char *const *argv, int stderr_fd)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (stderr_fd >= 0 && dup2(stderr_fd, 2) < 0)
            _exit(127);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int ft_parent_of(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *end = strrchr(buf, ')'); /* the name may hold spaces */
    char state;
    int ppid;
    return end && sscanf(end + 1, " %c %d", &state, &ppid) == 2 ? ppid : -1;
}

/* ------------------------------------------------------------------------
 * Batches
 */

int ft_check_synthetic(const ferry_batch *b, int dim, char *why, size_t cap)
{
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    const uint64_t *idx = ferry_batch_indices(b);
    ferry_tensor x, y;
    if (ferry_batch_nfields(b) != 2 || ferry_batch_field(b, "x", &x) != FERRY_OK ||
        ferry_batch_field(b, "y", &y) != FERRY_OK)
        return say(why, cap, "batch seq %" PRIu64 " has %d fields, not x and y", info.seq,
                   ferry_batch_nfields(b));
    if (dim <= 0 && x.ndim == 2)
        dim = (int)x.shape[1];
    if (x.dtype != FERRY_DTYPE_U8 || x.ndim != 2 || x.shape[0] != info.size || x.shape[1] != dim ||
        x.nbytes != (size_t)info.size * (size_t)dim)
        return say(why, cap,
                   "batch seq %" PRIu64 ": x is dtype %d ndim %d shape [%" PRId64 ", %" PRId64
                   "] %zu bytes; expected u8 [%u, %d]",
                   info.seq, (int)x.dtype, x.ndim, x.shape[0], x.shape[1], x.nbytes, info.size,
                   dim);
    if (y.dtype != FERRY_DTYPE_I64 || y.ndim != 1 || y.shape[0] != info.size ||
        y.nbytes != (size_t)info.size * 8)
        return say(why, cap,
                   "batch seq %" PRIu64 ": y is dtype %d ndim %d shape [%" PRId64
                   "]; expected i64 [%u]",
                   info.seq, (int)y.dtype, y.ndim, y.shape[0], info.size);
    if ((uintptr_t)x.data % 16 || (uintptr_t)y.data % 16)
        return say(why, cap, "batch seq %" PRIu64 ": tensor data not 16-byte aligned", info.seq);
    const unsigned char *xb = x.data;
    const int64_t *yv = y.data;
    for (uint32_t i = 0; i < info.size; i++) {
        if ((uint64_t)yv[i] != idx[i])
            return say(why, cap, "batch seq %" PRIu64 " item %u: y = %" PRId64 ", index %" PRIu64,
                       info.seq, i, yv[i], idx[i]);
        for (int j = 0; j < dim; j++) {
            uint8_t want = ferry__synthetic_byte(idx[i], (uint64_t)j);
            uint8_t got = xb[(size_t)i * (size_t)dim + (size_t)j];
            if (got != want)
                return say(why, cap,
                           "batch seq %" PRIu64 " item %u (index %" PRIu64
                           ") byte %d is %u, expected %u",
                           info.seq, i, idx[i], j, got, want);
        }
    }
    return 0;
}

int ft_stream_init(ft_stream *c, uint64_t n, const ferry__sampler_opts *o, uint64_t seq_cap)
{
    memset(c, 0, sizeof *c);
    if (ferry__sampler_init(&c->s, n, o) != FERRY_OK)
        return -1;
    c->in_order = 1;
    c->seq_cap = seq_cap;
    c->want = malloc((size_t)o->batch_size * sizeof *c->want);
    c->seen_item = calloc((size_t)n, 1);
    c->seen_seq = seq_cap ? calloc((size_t)seq_cap, 1) : NULL;
    if (!c->want || !c->seen_item || (seq_cap && !c->seen_seq)) {
        ft_stream_free(c);
        return -1;
    }
    return 0;
}

void ft_stream_free(ft_stream *c)
{
    free(c->want);
    free(c->seen_item);
    free(c->seen_seq);
    c->want = NULL;
    c->seen_item = c->seen_seq = NULL;
}

int ft_stream_check(ft_stream *c, const ferry_batch *b, char *why, size_t cap)
{
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    if (c->workers && info.worker >= c->workers)
        return say(why, cap, "batch seq %" PRIu64 " from worker %u of %u", info.seq, info.worker,
                   c->workers);
    if (c->in_order && info.seq != c->taken)
        return say(why, cap, "batch %" PRIu64 " in order has seq %" PRIu64, c->taken, info.seq);
    /* Out of order, a delivered seq is below next_seq, which is at most
     * delivered + prefetch: the window bounds how far ahead it can be. */
    if (!c->in_order && c->window && info.seq >= c->taken + c->window)
        return say(why, cap,
                   "batch seq %" PRIu64 " delivered after %" PRIu64
                   " batches is beyond the prefetch window (%" PRIu64 ")",
                   info.seq, c->taken, c->window);
    if (c->seen_seq) {
        if (info.seq >= c->seq_cap || c->seen_seq[info.seq])
            return say(why, cap, "batch seq %" PRIu64 " delivered twice (or past the end)",
                       info.seq);
        c->seen_seq[info.seq] = 1;
    }

    ferry__sampler_task st;
    if (ferry__sampler_at(&c->s, info.seq, &st) != FERRY_OK)
        return say(why, cap, "batch seq %" PRIu64 " is past the end of the stream", info.seq);
    /* Out of order, epochs come whole, one after another, and the last of
     * an epoch handed out is the one marked last. */
    uint64_t bpe = c->s.batches_per_epoch;
    if (!c->in_order && st.epoch != c->taken / bpe)
        return say(why, cap,
                   "batch seq %" PRIu64 " of epoch %" PRIu64 " came while epoch %" PRIu64
                   " was not whole",
                   info.seq, st.epoch, c->taken / bpe);
    if (!c->in_order)
        st.last_in_epoch = (c->taken + 1) % bpe == 0;
    if (info.epoch != st.epoch || info.batch_in_epoch != st.batch_in_epoch ||
        info.size != st.count || info.last_in_epoch != st.last_in_epoch)
        return say(why, cap,
                   "batch seq %" PRIu64 " says epoch %" PRIu64 " batch %" PRIu64
                   " size %u last %d; the sampler says epoch %" PRIu64 " batch %" PRIu64
                   " size %u last %d",
                   info.seq, info.epoch, info.batch_in_epoch, info.size, info.last_in_epoch,
                   st.epoch, st.batch_in_epoch, st.count, st.last_in_epoch);
    ferry__sampler_indices(&c->s, &st, c->want);
    if (memcmp(ferry_batch_indices(b), c->want, st.count * sizeof(uint64_t)) != 0)
        return say(why, cap, "batch seq %" PRIu64 " holds other indices than the sampler's",
                   info.seq);

    if (c->in_order) {
        if (st.batch_in_epoch == 0)
            memset(c->seen_item, 0, (size_t)c->s.n);
        for (uint32_t i = 0; i < st.count; i++) {
            if (c->seen_item[c->want[i]]++)
                return say(why, cap, "index %" PRIu64 " came twice in epoch %" PRIu64, c->want[i],
                           st.epoch);
        }
        if (st.last_in_epoch) {
            for (uint64_t i = 0; i < c->s.n; i++) {
                if (!c->seen_item[i])
                    return say(why, cap, "index %" PRIu64 " never came in epoch %" PRIu64, i,
                               st.epoch);
            }
        }
    }
    c->taken++;
    return 0;
}

/* ------------------------------------------------------------------------
 * Assertions (cmocka)
 */

void ft_begin(ft_snapshot *s, unsigned limit_s)
{
    alarm(limit_s);
    char dir[sizeof s->tmpdir];
    assert_int_equal(ft_make_tmpdir(dir, sizeof dir, "ferry-test"), 0);
    setenv("TMPDIR", dir, 1);
    ft_snapshot_take(s, dir);
}

void ft_end(ft_snapshot *s)
{
    char why[512];
    if (ft_leaks(s, stderr, why, sizeof why) != FT_NO_LEAK)
        fail_msg("left behind: %s", why);
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
    size_t run = 0;
    const char *only = getenv("FT_ONLY"); /* a part of the names to run, when debugging */
    for (size_t i = 0; i < n; i++) {
        if (only && !strstr(tests[i].name, only))
            continue;
        run++;
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
                printf("[  FAILED  ] %s: killed by signal %d%s\n", tests[i].name, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? " (a hang past its time limit)" : "");
            failed++;
        }
    }
    printf("%s: %zu passed, %d failed\n", "tests", run - (size_t)failed, failed);
    return failed;
}

void ft_stop_daemon(int pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    int status;
    if (ft_wait_child(pid, 10000, &status) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("ferry-worker %d did not exit within 10 s of SIGTERM", pid);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

ferry_config *ft_config(const char *dataset, int workers, int batch_size)
{
    ferry_config *cfg = ferry_config_new();
    assert_non_null(cfg);
    assert_int_equal(ferry_config_set(cfg, "worker_path", FERRY_TEST_WORKER), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "dataset", dataset), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "workers", workers), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "batch_size", batch_size), FERRY_OK);
    return cfg;
}

ferry_loader *ft_open_ok(ferry_config *cfg)
{
    ferry_loader *ld = NULL;
    int rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    if (rc != FERRY_OK)
        fail_msg("open: %s: %s", ferry_err_name(rc), ferry_last_error());
    return ld;
}

void ft_close_within(ferry_loader *ld, uint64_t ms)
{
    uint64_t t0 = ft_now_ms();
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    uint64_t took = ft_now_ms() - t0;
    print_message("close took %llu ms\n", (unsigned long long)took);
    assert_true(took < ms);
}

ferry_stats ft_stats(ferry_loader *ld)
{
    ferry_stats st;
    assert_int_equal(ferry_loader_stats(ld, &st), FERRY_OK);
    return st;
}

int ft_completed_at_least(const ferry_stats *st, uint64_t n)
{
    return st->completed >= n;
}

int64_t ft_wait_stats(ferry_loader *ld, ft_stats_pred pred, uint64_t arg, uint64_t ms)
{
    uint64_t t0 = ft_now_ms();
    for (;;) {
        ferry_stats st = ft_stats(ld);
        if (pred(&st, arg))
            return (int64_t)(ft_now_ms() - t0);
        if (ft_now_ms() - t0 >= ms)
            return -1;
        ft_sleep_ms(1);
    }
}

void ft_expect_error(int rc, int want, const char *const *words)
{
    if (rc != want)
        print_error("expected %s, got %s: %s\n", ferry_err_name(want), ferry_err_name(rc),
                    ferry_last_error());
    assert_int_equal(rc, want);
    for (int i = 0; words[i]; i++) {
        if (!strstr(ferry_last_error(), words[i]))
            print_error("'%s' not in: %s\n", words[i], ferry_last_error());
        assert_non_null(strstr(ferry_last_error(), words[i]));
    }
}

void ft_assert_synthetic(const ferry_batch *b, int dim)
{
    char why[512];
    if (ft_check_synthetic(b, dim, why, sizeof why) != 0)
        fail_msg("%s", why);
}

void ft_assert_in_stream(ft_stream *c, const ferry_batch *b)
{
    char why[512];
    if (ft_stream_check(c, b, why, sizeof why) != 0)
        fail_msg("%s", why);
}

/* Writes a .npy file as numpy does: preamble of `version` (1, 2 or 3), the
 * header dict padded with spaces and a '\n' so the data starts at a multiple
 * of 64, then the data. */
void ft_write_npy(const char *path, int version, const char *dict, const void *data, size_t len)
{
    unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)version, 0};
    size_t pre_len = version == 1 ? 10 : 12;
    size_t total = (pre_len + strlen(dict) + 1 + 63) / 64 * 64, hlen = total - pre_len;
    FILE *f = fopen(path, "wb");

    assert_non_null(f);
    for (size_t k = 0; k < pre_len - 8; k++)
        pre[8 + k] = (unsigned char)(hlen >> (8 * k));
    assert_int_equal(fwrite(pre, 1, pre_len, f), pre_len);
    fputs(dict, f);
    for (size_t k = strlen(dict); k < hlen - 1; k++)
        fputc(' ', f);
    fputc('\n', f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

void ft_capture_log(void *user, int level, const char *message)
{
    ft_log_capture *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->n < 64) {
        c->level[c->n] = level;
        snprintf(c->line[c->n], sizeof c->line[0], "%s", message);
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
}

int ft_count_log(ft_log_capture *c, int level, const char *words)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        n += c->level[i] == level && strstr(c->line[i], words) != NULL;
    pthread_mutex_unlock(&c->mu);
    return n;
}
