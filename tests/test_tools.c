/*
 * test_tools.c - every installed program answers the command line the same
 * way: `--version` prints "NAME VERSION" and exits 0, `--help` prints
 * "usage: NAME ..." on stdout (listing --help and --version) and exits 0,
 * and an unknown option says "NAME: bad argument '...'" on stderr, prints
 * the usage there, and exits 2.
 *
 * And ferry-bench measures: short real runs over a tiny synthetic dataset
 * whose JSON, CSV and plot are checked for what they must hold (counts
 * that match the epochs, p50 <= p99 <= max, a step-bound fraction in
 * (0, 1.05], A and B alternating under --compare).
 *
 * And tools/setup.sh, run against stand-ins for dpkg-query, apt-get, sudo
 * and cmake, so that no case installs or builds anything: a wrong job or
 * --help is answered before any of them runs.
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

extern char **environ;

typedef struct ran {
    int status;
    char out[65536], err[16384];
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

/* Runs argv (argv[0] the program's path) in environment envp, with stdout
 * and stderr in files, waits at most ms and fills *r. */
static void run_argv(char *const argv[], char *const envp[], int ms, ran *r)
{
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(out), 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(err), 2);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(ft_wait_child(pid, ms, &r->status), 0);
    slurp(fileno(out), r->out, sizeof r->out);
    slurp(fileno(err), r->err, sizeof r->err);
    fclose(out);
    fclose(err);
}

/* Runs `path arg`: what every tool must answer. */
static void run_tool(const char *path, const char *arg, ran *r)
{
    char *argv[] = {(char *)path, (char *)arg, NULL};
    run_argv(argv, environ, 10000, r);
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

/* An endpoint ferry-worker could never connect to is a bad command line
 * (exit 2, saying what is wrong), not a daemon that retries it forever. */
static void test_ferry_worker_refuses_an_endpoint_it_cannot_connect_to(void **state)
{
    (void)state;
    static const char *const cases[][3] = {
        {"127.0.0.1:5555", NULL,
         "is not a tcp:// endpoint: a remote worker connects to "
         "tcp://HOST:PORT (tcp://127.0.0.1:5555?)"},
        {"ipc:///tmp/loader", NULL, "is not a tcp:// endpoint"},
        {"tcp://trainer01", NULL, "is not a tcp://HOST:PORT endpoint"},
        {"tcp://trainer01:0", NULL, "is not a tcp://HOST:PORT endpoint"},
        {"tcp://:5555", NULL, "is not a tcp://HOST:PORT endpoint"},
        {"loader", "0", "is not an ipc:// or tcp:// endpoint"},
    };
    static ran r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {FERRY_TEST_WORKER,   "--connect", (char *)cases[i][0],
                        "--insecure",        "--once",    cases[i][1] ? "--slot" : NULL,
                        (char *)cases[i][1], NULL};
        run_argv(argv, environ, 10000, &r);
        if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 2)
            fail_msg("--connect %s: status %d, not exit 2: %s", cases[i][0], r.status, r.err);
        char want[160];
        snprintf(want, sizeof want, "ferry-worker: --connect '%s' ", cases[i][0]);
        assert_true(strncmp(r.err, want, strlen(want)) == 0);
        if (!strstr(r.err, cases[i][2]))
            fail_msg("--connect %s: no '%s' in: %s", cases[i][0], cases[i][2], r.err);
        assert_null(strstr(r.err, "trying again"));
        assert_string_equal(r.out, "");
    }
}

/* Key files swapped: the worker's .pub as --key is named a public key
 * (not told to be chmod-ed), and the loader's key pair as --server-key is
 * refused: its secret key belongs on the trainer host. Both exit 2 at once. */
static void test_ferry_worker_names_swapped_key_files(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char worker[512], loader[512], key[512], pub[512], loader_key[512], loader_pub[512];
    snprintf(worker, sizeof worker, "%s/gpu-node-07", snap.tmpdir);
    snprintf(loader, sizeof loader, "%s/loader", snap.tmpdir);
    snprintf(key, sizeof key, "%s.key", worker);
    snprintf(pub, sizeof pub, "%s.pub", worker);
    snprintf(loader_key, sizeof loader_key, "%s.key", loader);
    snprintf(loader_pub, sizeof loader_pub, "%s.pub", loader);
    static ran r;
    const char *bases[] = {worker, loader};
    for (int i = 0; i < 2; i++) {
        char *argv[] = {FERRY_TEST_KEYGEN, (char *)bases[i], NULL};
        run_argv(argv, environ, 10000, &r);
        assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    }

    char *pub_as_key[] = {FERRY_TEST_WORKER, "--connect", "tcp://127.0.0.1:5555",
                          "--key",           pub,         "--server-key",
                          loader_pub,        NULL};
    run_argv(pub_as_key, environ, 10000, &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2);
    if (!strstr(r.err, "no secret-key line") || !strstr(r.err, "public key only") ||
        strstr(r.err, "chmod"))
        fail_msg("--key %s: %s", pub, r.err);

    char *pair_as_server[] = {FERRY_TEST_WORKER, "--connect", "tcp://127.0.0.1:5555",
                              "--key",           key,         "--server-key",
                              loader_key,        NULL};
    run_argv(pair_as_server, environ, 10000, &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2);
    if (!strstr(r.err, loader_key) || !strstr(r.err, "holds a secret key") ||
        !strstr(r.err, "trainer host") || !strstr(r.err, ".pub"))
        fail_msg("--server-key %s: %s", loader_key, r.err);

    const char *files[] = {key, pub, loader_key, loader_pub};
    for (int i = 0; i < 4; i++)
        assert_int_equal(unlink(files[i]), 0);
    ft_end(&snap);
}

/* ferry-keygen BASE.key (or BASE.pub) writes BASE.key and BASE.pub, not
 * BASE.key.key; a name that is only the suffix is kept whole. */
static void test_ferry_keygen_takes_a_name_ending_in_key_or_pub_as_its_base(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    static const char *const given[] = {"loader.key", "gpu-node-07.pub", ".key"};
    static const char *const made[][2] = {
        {"loader.key", "loader.pub"},
        {"gpu-node-07.key", "gpu-node-07.pub"},
        {".key.key", ".key.pub"},
    };
    static ran r;
    for (size_t i = 0; i < sizeof given / sizeof given[0]; i++) {
        char arg[512], path[512];
        snprintf(arg, sizeof arg, "%s/%s", snap.tmpdir, given[i]);
        char *argv[] = {FERRY_TEST_KEYGEN, arg, NULL};
        run_argv(argv, environ, 10000, &r);
        if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
            fail_msg("ferry-keygen %s: %s", given[i], r.err);
        assert_true(strncmp(r.out, "public-key = ", 13) == 0);
        assert_int_equal(ft_count_entries(snap.tmpdir), 2);
        for (int f = 0; f < 2; f++) {
            snprintf(path, sizeof path, "%s/%s", snap.tmpdir, made[i][f]);
            if (!strstr(r.err, path))
                fail_msg("ferry-keygen %s does not name %s: %s", given[i], path, r.err);
            assert_int_equal(unlink(path), 0);
        }
    }
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * ferry-bench's figures
 */

/* The tiny run every case below makes: 512 items in batches of 32 is 16
 * batches an epoch, 48 in 3 epochs; a 0.2 ms step keeps it well under a
 * second a run. */
#define BENCH_RUN                                                                                  \
    FERRY_TEST_BENCH, "--dataset", "synthetic:n=512,dim=8", "--batch-size", "32", "--epochs", "3", \
        "--workers", "2", "--step-ms", "0.2"
#define BENCH_BATCHES 48

/* The number after the first `"key": ` at or after `from` in json; fails
 * the case when the key is not there or holds no number (null). */
static double json_number(const char *from, const char *key)
{
    char want[96];
    snprintf(want, sizeof want, "\"%s\": ", key);
    const char *at = strstr(from, want);
    if (!at)
        fail_msg("no %s in %.400s", want, from);
    char *end;
    double v = strtod(at + strlen(want), &end);
    if (end == at + strlen(want))
        fail_msg("%s holds no number: %.40s", want, at);
    return v;
}

/* Where `"key": ` starts in json (failing the case when it is not there). */
static const char *json_at(const char *json, const char *key)
{
    char want[96];
    snprintf(want, sizeof want, "\"%s\": ", key);
    const char *at = strstr(json, want);
    if (!at)
        fail_msg("no %s in the JSON", want);
    return at;
}

/* p50 <= p99 <= max for figures PREFIX_p50_ms, _p99_ms and _max_ms. */
static void assert_ordered(const char *json, const char *prefix)
{
    char k[64];
    snprintf(k, sizeof k, "%s_p50_ms", prefix);
    double p50 = json_number(json, k);
    snprintf(k, sizeof k, "%s_p99_ms", prefix);
    double p99 = json_number(json, k);
    snprintf(k, sizeof k, "%s_max_ms", prefix);
    double max = json_number(json, k);
    assert_true(p50 >= 0 && p50 <= p99 && p99 <= max);
}

/* Reads a small text file whole into buf; its length. */
static size_t read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    slurp(fd, buf, cap);
    close(fd);
    return strlen(buf);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Whether a program is on PATH. */
static int on_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[4096], full[4200];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s", (int)n, path);
        snprintf(full, sizeof full, "%s/%s", dir[0] ? dir : ".", name);
        if (access(full, X_OK) == 0)
            return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

static void test_ferry_bench_reports_the_trainers_waits_and_a_row_per_batch(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char csv[512];
    snprintf(csv, sizeof csv, "%s/batches.csv", snap.tmpdir);
    char *argv[] = {BENCH_RUN, "--csv", csv, "--json", NULL};
    static ran r;
    run_argv(argv, environ, 20000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench failed: %s", r.err);
    assert_null(strstr(r.err, "ferry-bench:"));

    /* Every setting that made the figures, then the figures. */
    assert_true(r.out[0] == '{' && strstr(r.out, "}\n") != NULL);
    const char *settings = json_at(r.out, "settings");
    assert_true(json_number(settings, "workers") == 2);
    assert_true(json_number(settings, "batch_size") == 32);
    assert_true(json_number(settings, "epochs") == 3);
    assert_true(json_number(settings, "step_ms") == 0.2);
    assert_non_null(strstr(settings, "\"step_mode\": \"spin\""));
    assert_true(json_number(json_at(r.out, "host"), "cores") >= 1);
    assert_true(json_number(r.out, "batches_per_epoch") == 16);

    const char *fig = json_at(r.out, "median");
    assert_true(json_number(fig, "batches") == BENCH_BATCHES);
    assert_true(json_number(fig, "items") == 512 * 3);
    assert_true(json_number(fig, "epochs") == 3);
    assert_true(json_number(fig, "failed") == 0);
    assert_ordered(fig, "wait");
    assert_ordered(fig, "epoch_wait");
    assert_true(json_number(fig, "startup_ms") > 0);
    assert_true(json_number(fig, "startup_ms") >= json_number(fig, "open_ms"));
    assert_true(json_number(fig, "batches_per_s") > 0);
    double frac = json_number(fig, "step_bound_fraction");
    assert_true(frac > 0 && frac <= 1.05);
    double share = json_number(fig, "wait_share");
    assert_true(share >= 0 && share < 1);
    assert_true(json_number(fig, "trainer_peak_rss_mib") > 0);
    assert_true(json_number(fig, "trainer_peak_pss_mib") > 0);
    assert_true(json_number(fig, "workers_peak_rss_mib") > 0);
    assert_true(json_number(fig, "workers_peak_pss_mib") > 0);

    /* The CSV: the header, then the batches in order. */
    static char text[65536];
    read_file(csv, text, sizeof text);
    const char *header =
        "seq,epoch,batch_in_epoch,worker,wait_us,make_us,flight_us,ready_us,attempts\n";
    assert_true(strncmp(text, header, strlen(header)) == 0);
    assert_int_equal(count_lines(text), 1 + BENCH_BATCHES);
    const char *row = text + strlen(header);
    for (int seq = 0; seq < BENCH_BATCHES; seq++) {
        unsigned long long s, e, b;
        unsigned w, attempts;
        double wait, make, flight, ready;
        assert_int_equal(sscanf(row, "%llu,%llu,%llu,%u,%lf,%lf,%lf,%lf,%u", &s, &e, &b, &w, &wait,
                                &make, &flight, &ready, &attempts),
                         9);
        assert_true(s == (unsigned long long)seq && e == (unsigned)seq / 16 &&
                    b == (unsigned)seq % 16);
        assert_true(w < 2 && wait >= 0);
        row = strchr(row, '\n') + 1;
    }
    assert_int_equal(unlink(csv), 0);
    ft_end(&snap);
}

/* The file at png starts as a PNG does; it is removed. */
static void assert_png_and_remove(const char *png)
{
    unsigned char magic[8] = {0};
    int fd = open(png, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(read(fd, magic, sizeof magic), (ssize_t)sizeof magic);
    close(fd);
    assert_memory_equal(magic, "\x89PNG\r\n\x1a\n", 8);
    assert_int_equal(unlink(png), 0);
}

static void test_ferry_bench_compare_alternates_a_and_b_and_reports_ratios(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 40);
    char csv[512], png[512];
    snprintf(csv, sizeof csv, "%s/batches.csv", snap.tmpdir);
    snprintf(png, sizeof png, "%s/waits.png", snap.tmpdir);
    int plot = on_path("gnuplot");
    if (!plot)
        printf("note: gnuplot is not installed (Debian: gnuplot-nox); --plot is not checked\n");
    /* Without gnuplot, the list ends before --plot. */
    char *argv[] = {BENCH_RUN, "--compare", "2", "--csv", csv, "--json", plot ? "--plot" : NULL,
                    png,       NULL};
    static ran r;
    run_argv(argv, environ, 30000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --compare failed: %s", r.err);

    assert_true(json_number(json_at(r.out, "settings"), "rounds") == 2);
    assert_non_null(strstr(r.out, "\"compare\": true"));
    /* Both sides, each with both rounds, and B is the barrier. */
    const char *baseline = json_at(json_at(r.out, "results"), "baseline");
    assert_non_null(json_at(r.out, "ferry"));
    assert_true(json_number(baseline, "batches") == BENCH_BATCHES);
    assert_non_null(strstr(r.out, "\"name\": \"baseline\", \"what\": "));
    assert_non_null(strstr(r.out, "\"epoch_barrier\": true, \"prefetch\": 4, \"flow\": {"));
    /* The baseline fixed its window: its last run says so. */
    assert_non_null(strstr(r.out, "\"window\": 4, \"window_why\": \"user\""));
    /* The ratios of B against A: median, min and max of each. */
    const char *ratios = json_at(json_at(r.out, "ratios"), "baseline");
    assert_non_null(json_at(r.out, "ratio_meaning"));
    const char *med = json_at(ratios, "median"), *min = json_at(ratios, "min"),
               *max = json_at(ratios, "max");
    double lo = json_number(min, "batches_per_s"), mid = json_number(med, "batches_per_s"),
           hi = json_number(max, "batches_per_s");
    assert_true(lo > 0 && lo <= mid && mid <= hi);
    assert_true(json_number(med, "startup_ms") > 0);
    assert_true(json_number(med, "step_bound_fraction") > 0);

    /* The CSV: round and side first, and the runs in the order A B A B. */
    static char text[262144];
    read_file(csv, text, sizeof text);
    const char *header = "round,side,seq,epoch,batch_in_epoch,worker,wait_us,";
    assert_true(strncmp(text, header, strlen(header)) == 0);
    assert_int_equal(count_lines(text), 1 + 4 * BENCH_BATCHES);
    const char *order[] = {"1,ferry,0,", "1,baseline,0,", "2,ferry,0,", "2,baseline,0,"};
    const char *row = strchr(text, '\n') + 1;
    for (int run = 0; run < 4; run++) {
        assert_true(strncmp(row, order[run], strlen(order[run])) == 0);
        for (int i = 0; i < BENCH_BATCHES; i++)
            row = strchr(row, '\n') + 1;
    }
    assert_int_equal(unlink(csv), 0);

    if (plot) {
        assert_png_and_remove(png);
    }
    ft_end(&snap);
}

/* --compare-mix: the dataset as one source against the same items as a
 * mix, both shuffled; --compare-resume: a fresh loader against one resumed
 * from another shape's state. Each side runs each round, with its name. */
static void test_ferry_bench_compares_a_mix_and_a_resume(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ran r;
    char *mix[] = {BENCH_RUN, "--compare-mix", "256,128,128;0:0.5,0.3,0.2", "--rounds", "1",
                   "--json", NULL};
    run_argv(mix, environ, 30000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --compare-mix failed: %s", r.err);
    const char *results = json_at(r.out, "results");
    assert_true(json_number(json_at(results, "one"), "batches") == BENCH_BATCHES);
    assert_true(json_number(json_at(results, "mix"), "batches") == BENCH_BATCHES);
    char *resume[] = {BENCH_RUN, "--compare-resume", "4", "--rounds", "1", "--json", NULL};
    run_argv(resume, environ, 30000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --compare-resume failed: %s", r.err);
    results = json_at(r.out, "results");
    assert_true(json_number(json_at(results, "fresh"), "batches") == BENCH_BATCHES);
    /* a third of a 4-rank job's epoch gone: 512 - 4 * 32 * 2 = 256 items in 8
     * batches of epoch 0, then 2 whole epochs of 16 */
    assert_true(json_number(json_at(results, "resumed"), "batches") == 8 + 2 * 16);
    /* a mix whose sizes are not the dataset's is refused by name */
    char *bad[] = {BENCH_RUN, "--compare-mix", "100,100;0:1,1", "--rounds", "1", NULL};
    run_argv(bad, environ, 30000, &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0);
    assert_non_null(strstr(r.err, "end to end"));
    ft_end(&snap);
}

/* One run, no --csv: the plot reads the unlabelled rows of a temporary CSV
 * (and its epoch starts are circled as with --compare). */
static void test_ferry_bench_plots_a_single_run(void **state)
{
    (void)state;
    if (!on_path("gnuplot")) {
        printf("note: gnuplot is not installed (Debian: gnuplot-nox); --plot is not checked\n");
        return;
    }
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char png[512];
    snprintf(png, sizeof png, "%s/waits.png", snap.tmpdir);
    char *argv[] = {BENCH_RUN, "--plot", png, NULL};
    static ran r;
    run_argv(argv, environ, 20000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --plot failed: %s", r.err);
    assert_png_and_remove(png);
    ft_end(&snap);
}

static void test_ferry_bench_without_gnuplot_writes_the_csv_and_names_the_package(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char csv[512], png[512], tmpdir[600];
    snprintf(csv, sizeof csv, "%s/batches.csv", snap.tmpdir);
    snprintf(png, sizeof png, "%s/waits.png", snap.tmpdir);
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%s", snap.tmpdir);
    /* A PATH with nothing on it: no gnuplot to be found. */
    char *envp[] = {"PATH=/nonexistent", tmpdir, NULL};
    char *argv[] = {BENCH_RUN, "--csv", csv, "--plot", png, NULL};
    static ran r;
    run_argv(argv, envp, 20000, &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    assert_non_null(strstr(r.err, "gnuplot-nox"));
    assert_non_null(strstr(r.out, "wait in next()")); /* the summary came first */
    static char text[65536];
    read_file(csv, text, sizeof text);
    assert_int_equal(count_lines(text), 1 + BENCH_BATCHES);
    assert_int_equal(access(png, F_OK), -1);
    assert_int_equal(unlink(csv), 0);
    ft_end(&snap);
}

/* --limits: the one-copy limit, the raw ZeroMQ round trip and ferry, in
 * rounds, each with its rates and the ratios of ferry to each. */
static void test_ferry_bench_limits_reports_ferry_against_one_copy_and_raw_zmq(void **state)
{
    (void)state;
    static const char *const modes[] = {"process", "thread"};
    for (int m = 0; m < 2; m++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        char *argv[] = {FERRY_TEST_BENCH,
                        "--dataset",
                        "synthetic:n=512,dim=8",
                        "--batch-size",
                        "32",
                        "--epochs",
                        "3",
                        "--workers",
                        "2",
                        "--limits",
                        "--rounds",
                        "2",
                        "--json",
                        m ? "--threads" : NULL,
                        NULL};
        static ran r;
        run_argv(argv, environ, 30000, &r);
        if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
            fail_msg("ferry-bench --limits (%s) failed: %s", modes[m], r.err);
        assert_true(r.out[0] == '{' && strstr(r.out, "}\n") != NULL);
        assert_non_null(strstr(r.out, "\"limits\": true"));
        assert_true(json_number(json_at(r.out, "settings"), "rounds") == 2);
        const char *lim = json_at(json_at(r.out, "batches_per_epoch"), "limits");
        /* x: 8 uint8, y: one int64, per item: 16 bytes, 32 of them. */
        assert_true(json_number(lim, "batch_bytes") == 512);
        assert_true(json_number(lim, "depth") == 8); /* the automatic window: 2 x 2 x 2 */
        assert_true(json_number(lim, "batches") == BENCH_BATCHES);
        assert_true(json_number(lim, "source_bytes") >= 256 << 20);
        assert_non_null(strstr(json_at(lim, "raw_zmq"), m ? "inproc://" : "ipc://"));
        const char *med = json_at(lim, "median"), *min = json_at(lim, "min"),
                   *max = json_at(lim, "max");
        static const char *const rates[] = {"copy", "zmq", "ferry"};
        char k[64];
        for (int i = 0; i < 3; i++) {
            snprintf(k, sizeof k, "%s_batches_per_s", rates[i]);
            double lo = json_number(min, k), mid = json_number(med, k), hi = json_number(max, k);
            assert_true(lo > 0 && lo <= mid && mid <= hi);
            snprintf(k, sizeof k, "%s_gb_per_s", rates[i]);
            assert_true(json_number(med, k) > 0);
            snprintf(k, sizeof k, "%s_us_per_batch", rates[i]);
            assert_true(json_number(med, k) > 0);
        }
        /* Nothing delivers batches faster than one thread copies them. */
        double vs_copy = json_number(med, "ferry_vs_copy");
        assert_true(vs_copy > 0 && vs_copy < 1);
        assert_true(json_number(med, "ferry_vs_zmq") > 0);
        (void)json_number(med, "ferry_added_us_per_batch"); /* present; may be negative */
        /* Each round has every figure. */
        const char *rounds = json_at(lim, "rounds");
        assert_true(json_number(rounds, "ferry_vs_zmq") > 0);
        assert_true(json_number(strstr(rounds, "}, {"), "ferry_vs_copy") > 0);
        ft_end(&snap);
    }
}

/* Wrong values are refused before anything runs, with exit status 2. */
static void test_ferry_bench_refuses_bad_values(void **state)
{
    (void)state;
    static const char *const cases[][3] = {
        {"--step-ms", "-1", "--step-ms"},
        {"--step-ms", "fast", "--step-ms"},
        {"--step", "wobble", "spin or sleep"},
        {"--rounds", "0", "--rounds"},
        {"--compare", "0", "must be >= 1"},
        {"--compare", "--epoch-barrier", "leave out --epoch-barrier"},
        {"--compare", "--compare-remote", "pick one"},
        {"--limits", "--compare", "leave out --compare"},
        {"--limits", "--epoch-barrier", "no step"},
        {"--io-threads", "-1", "--io-threads"},
        {"--compare-resume", "0", "world size from 1"},
        {"--compare-resume", "many", "world size from 1"},
        {"--set", "credits", "KEY=VALUE"},
        {"--set", "no_such_option=1", "unknown option 'no_such_option'"},
        {"--set", "credits=-3", "--set credits=-3"},
    };
    static ran r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {FERRY_TEST_BENCH, (char *)cases[i][0], (char *)cases[i][1], NULL};
        run_argv(argv, environ, 10000, &r);
        assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2);
        if (!strstr(r.err, cases[i][2]))
            fail_msg("%s %s: no '%s' in: %s", cases[i][0], cases[i][1], cases[i][2], r.err);
        assert_string_equal(r.out, "");
    }
}

/* --set gives any loader option, after ferry-bench's own (max_batches=7
 * ends the run at 7 batches whatever --epochs says), and the settings say
 * so. */
static void test_ferry_bench_sets_any_loader_option(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char *argv[] = {BENCH_RUN, "--set", "max_batches=7", "--set", "credits=3", "--json", NULL};
    static ran r;
    run_argv(argv, environ, 20000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --set failed: %s", r.err);
    const char *settings = json_at(r.out, "settings");
    assert_non_null(strstr(settings, "\"set\": [\"max_batches=7\", \"credits=3\"]"));
    assert_true(json_number(json_at(r.out, "median"), "batches") == 7);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * tools/setup.sh
 */

/* Writes an executable file. */
static void write_program(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

/* A scratch tree for setup.sh in dir (made here): bin/ holds stand-ins
 * that append their name and arguments to dir/ran.log: dpkg-query (every
 * package installed), cmake (succeeds), apt-get and sudo (fail). */
static void make_setup_stand_ins(char *dir, size_t cap)
{
    assert_int_equal(ft_make_tmpdir(dir, cap, "ferry-setup"), 0);
    char path[512], text[1024];
    snprintf(path, sizeof path, "%s/bin", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    static const char *const stand_ins[][2] = {
        {"dpkg-query", "printf 'install ok installed'"},
        {"cmake", "exit 0"},
        {"apt-get", "exit 1"},
        {"sudo", "exit 1"},
    };
    for (size_t i = 0; i < sizeof stand_ins / sizeof stand_ins[0]; i++) {
        snprintf(path, sizeof path, "%s/bin/%s", dir, stand_ins[i][0]);
        snprintf(text, sizeof text, "#!/bin/sh\necho \"%s $*\" >> '%s/ran.log'\n%s\n",
                 stand_ins[i][0], dir, stand_ins[i][1]);
        write_program(path, text);
    }
}

/* Runs `cd dir/cwd && tools/setup.sh args` (args a shell word list) with
 * the stand-ins first on PATH and BUILD_DIR as given (NULL: unset). */
static void run_setup(const char *dir, const char *cwd, const char *build_dir, const char *args,
                      ran *r)
{
    char cmd[2048], path_env[600], build_env[600];
    snprintf(cmd, sizeof cmd, "cd '%s/%s' && exec '%s/tools/setup.sh' %s", dir, cwd,
             FERRY_SOURCE_DIR, args);
    snprintf(path_env, sizeof path_env, "PATH=%s/bin:/usr/bin:/bin", dir);
    snprintf(build_env, sizeof build_env, "BUILD_DIR=%s", build_dir ? build_dir : "");
    char *envp[] = {path_env, build_dir ? build_env : NULL, NULL};
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    run_argv(argv, envp, 20000, r);
}

static void test_setup_sh_answers_help_and_a_wrong_job_before_installing_or_building(void **state)
{
    (void)state;
    char dir[256], log[512];
    make_setup_stand_ins(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/ran.log", dir);
    static ran r;

    static const char *const helps[] = {"--help", "-h", "help"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        run_setup(dir, ".", NULL, helps[i], &r);
        assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
        assert_true(strncmp(r.out, "usage: tools/setup.sh ", 22) == 0);
        assert_non_null(strstr(r.out, "bench"));
        assert_string_equal(r.err, "");
    }

    run_setup(dir, ".", NULL, "tests", &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2);
    assert_true(strncmp(r.err, "setup: unknown job 'tests'\n", 27) == 0);
    assert_non_null(strstr(r.err, "usage: tools/setup.sh "));
    assert_string_equal(r.out, "");

    /* Not one package looked up, nothing configured. */
    assert_int_equal(access(log, F_OK), -1);
    assert_int_equal(ft_remove_tree(dir), 0);
}

/* bench runs ferry-bench where setup.sh was run from, so that relative
 * paths in its arguments are the caller's; a relative BUILD_DIR is the
 * caller's too. */
static void test_setup_sh_bench_runs_in_the_callers_directory(void **state)
{
    (void)state;
    char dir[256], path[512];
    make_setup_stand_ins(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/work", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/mybuild", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/mybuild/ferry-bench", dir);
    write_program(path, "#!/bin/sh\necho \"in $(pwd): $*\"\n");
    static ran r;
    run_setup(dir, "work", "../mybuild", "bench --csv waits.csv", &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("setup.sh bench failed: %s", r.err);
    char want[600];
    snprintf(want, sizeof want, "in %s/work: --csv waits.csv\n", dir);
    assert_string_equal(r.out, want);

    /* cmake was given that build folder, from the caller's directory. */
    static char text[4096];
    snprintf(path, sizeof path, "%s/ran.log", dir);
    read_file(path, text, sizeof text);
    snprintf(want, sizeof want, "-B %s/work/../mybuild ", dir);
    if (!strstr(text, want))
        fail_msg("no '%s' in: %s", want, text);
    assert_int_equal(ft_remove_tree(dir), 0);
}

/* A --plot or --csv file that cannot be written fails at once, before any
 * run (nothing on stdout), naming the file; and a PNG that can be is not
 * left behind by that check when the run then fails. */
static void test_ferry_bench_refuses_an_unwritable_plot_or_csv_before_running(void **state)
{
    (void)state;
    static const char *const flags[] = {"--plot", "--csv"};
    static ran r;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        char *argv[] = {BENCH_RUN, (char *)flags[i], "/nonexistent/x.png", NULL};
        run_argv(argv, environ, 10000, &r);
        assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
        if (!strstr(r.err, "ferry-bench: cannot write /nonexistent/x.png: "))
            fail_msg("%s /nonexistent/x.png: %s", flags[i], r.err);
        assert_string_equal(r.out, "");
    }
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char png[512];
    snprintf(png, sizeof png, "%s/waits.png", snap.tmpdir);
    char *argv[] = {BENCH_RUN, "--plot", png, "--csv", "/nonexistent/x.csv", NULL};
    run_argv(argv, environ, 10000, &r);
    assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    assert_non_null(strstr(r.err, "/nonexistent/x.csv"));
    assert_int_equal(access(png, F_OK), -1);
    ft_end(&snap);
}

/* The settings line counts in words that agree with the number. */
static void test_ferry_bench_settings_line_says_1_epoch_and_1_worker(void **state)
{
    (void)state;
    char *argv[] = {FERRY_TEST_BENCH,
                    "--dataset",
                    "synthetic:n=64,dim=8",
                    "--batch-size",
                    "32",
                    "--epochs",
                    "1",
                    "--workers",
                    "1",
                    NULL};
    static ran r;
    run_argv(argv, environ, 20000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench failed: %s", r.err);
    if (!strstr(r.out, "  1 process worker, batch 32, 2 batches/epoch, 1 epoch, "))
        fail_msg("no '1 process worker ... 1 epoch' in: %.300s", r.out);
    char *batches[] = {FERRY_TEST_BENCH,
                       "--dataset",
                       "synthetic:n=64,dim=8",
                       "--batch-size",
                       "32",
                       "--batches",
                       "1",
                       NULL};
    run_argv(batches, environ, 20000, &r);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
        fail_msg("ferry-bench --batches 1 failed: %s", r.err);
    if (!strstr(r.out, " 2 batches/epoch, 1 batch, "))
        fail_msg("no '1 batch' in: %.300s", r.out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ferry_worker_answers_like_every_tool),
        cmocka_unit_test(test_ferry_keygen_answers_like_every_tool),
        cmocka_unit_test(test_ferry_bench_answers_like_every_tool),
        cmocka_unit_test(test_ferry_worker_refuses_an_endpoint_it_cannot_connect_to),
        cmocka_unit_test(test_ferry_worker_names_swapped_key_files),
        cmocka_unit_test(test_ferry_keygen_takes_a_name_ending_in_key_or_pub_as_its_base),
        cmocka_unit_test(test_ferry_bench_reports_the_trainers_waits_and_a_row_per_batch),
        cmocka_unit_test(test_ferry_bench_sets_any_loader_option),
        cmocka_unit_test(test_ferry_bench_compare_alternates_a_and_b_and_reports_ratios),
        cmocka_unit_test(test_ferry_bench_compares_a_mix_and_a_resume),
        cmocka_unit_test(test_ferry_bench_plots_a_single_run),
        cmocka_unit_test(test_ferry_bench_without_gnuplot_writes_the_csv_and_names_the_package),
        cmocka_unit_test(test_ferry_bench_limits_reports_ferry_against_one_copy_and_raw_zmq),
        cmocka_unit_test(test_ferry_bench_refuses_bad_values),
        cmocka_unit_test(test_ferry_bench_refuses_an_unwritable_plot_or_csv_before_running),
        cmocka_unit_test(test_ferry_bench_settings_line_says_1_epoch_and_1_worker),
        cmocka_unit_test(test_setup_sh_answers_help_and_a_wrong_job_before_installing_or_building),
        cmocka_unit_test(test_setup_sh_bench_runs_in_the_callers_directory),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
