/*
 * ferry-bench - run a loader over a dataset and measure it.
 *
 * The trainer side is this program's main loop: it takes batches as fast as
 * ferry gives them (optionally spending --step-us of CPU per batch, like a
 * training step), touches every page of every tensor so nothing is measured
 * that was never read, and records when each batch arrived. From those times:
 *
 *   throughput       batches/s, items/s, MB/s from the first batch to the last
 *   startup          ferry_loader_open() called -> first batch in hand
 *   gap              time between consecutive batches inside an epoch (median)
 *   epoch stall      the gap at an epoch boundary: last batch of epoch e in
 *                    hand -> first batch of epoch e+1 in hand (median, max)
 *
 * --compare runs the same loader twice in this one invocation, first as ferry
 * works (prefetch straight across epochs), then with epoch_barrier (the next
 * epoch starts only once the trainer has consumed the previous one, which is
 * what PyTorch's persistent workers do), and prints both with their ratios.
 *
 * Remote workers: --bind tcp://HOST:PORT (with --curve-key/--curve-allow, or
 * --insecure) makes the loader wait for --min-workers ferry-worker daemons
 * started separately (docs/remote.md). --compare-remote runs the same work
 * twice in this invocation: --workers local worker processes over ipc://,
 * then as many ferry-worker daemons that this program starts itself on
 * 127.0.0.1 over TCP with CURVE (keys made with ferry-keygen in a private
 * directory), and prints both with their ratios.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

extern char **environ;

typedef struct bench_opts {
    const char *dataset;
    const char *worker_mode;
    const char *worker_path;
    const char *bind, *curve_key, *curve_allow;
    long workers, batch_size, epochs, batches, prefetch, seed, step_us, min_workers;
    int epoch_barrier, compare, json, progress, in_order, insecure, compare_remote;
} bench_opts;

typedef struct bench_result {
    double batches_per_s, items_per_s, mb_per_s;
    double startup_ms, gap_ms_median, stall_ms_median, stall_ms_max;
    double gap_ms_mean, stall_ms_mean;
    uint64_t batches, items, bytes, epochs_seen, failed, realigned;
    int epoch_barrier;
} bench_result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double mean(const double *v, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / (double)n : 0;
}

static double median(double *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void spin_us(long us)
{
    if (us <= 0)
        return;
    double end = now_s() + (double)us * 1e-6;
    while (now_s() < end)
        ;
}

/* Reads one byte per 4 KiB of every field, so the pages are really touched. */
static uint64_t touch(const ferry_batch *b, uint64_t *bytes)
{
    uint64_t sum = 0;
    int nf = ferry_batch_nfields(b);
    for (int f = 0; f < nf; f++) {
        ferry_tensor t;
        if (ferry_batch_field_at(b, f, &t) != FERRY_OK)
            continue;
        const unsigned char *p = t.data;
        for (size_t i = 0; i < t.nbytes; i += 4096)
            sum += p[i];
        *bytes += t.nbytes;
    }
    return sum;
}

static void progress(const bench_opts *o, uint64_t done, uint64_t total, double t0, int final)
{
    int width = 40;
    double frac = total ? (double)done / (double)total : 0;
    int fill = (int)(frac * width);
    double el = now_s() - t0;
    fprintf(stderr, "\r[%.*s%*s] %llu/%llu batches  %.0f batches/s%s", fill,
            "########################################", width - fill, "", (unsigned long long)done,
            (unsigned long long)total, el > 0 ? (double)done / el : 0, final ? "\n" : "");
    (void)o;
}

static int set_all(ferry_config *cfg, const bench_opts *o, int barrier)
{
    int rc = FERRY_OK;
#define SETI(k, v) rc = rc != FERRY_OK ? rc : ferry_config_set_int(cfg, k, v)
#define SETS(k, v) rc = rc != FERRY_OK ? rc : ferry_config_set(cfg, k, v)
    SETS("dataset", o->dataset);
    SETS("worker_mode", o->worker_mode);
    if (o->worker_path) {
        SETS("worker_path", o->worker_path);
    }
    SETI("workers", o->workers);
    if (o->bind) {
        SETS("bind", o->bind);
        SETI("insecure", o->insecure);
        if (o->min_workers >= 0) {
            SETI("min_workers", o->min_workers);
        }
        if (o->curve_key) {
            SETS("curve_key", o->curve_key);
        }
        if (o->curve_allow) {
            SETS("curve_allow", o->curve_allow);
        }
        SETI("start_timeout_ms", 120000);
    }
    SETI("batch_size", o->batch_size);
    SETI("prefetch", o->prefetch);
    SETI("in_order", o->in_order);
    SETI("epoch_barrier", barrier);
    if (o->batches > 0) {
        SETI("max_batches", o->batches);
    } else {
        SETI("epochs", o->epochs);
    }
    if (o->seed >= 0) {
        SETI("seed", o->seed);
    }
#undef SETI
#undef SETS
    return rc;
}

/* One measured run, start to close. Long because it is one straight
 * sequence of timed steps (open, first batch, the epochs, close) whose
 * timestamps are compared with each other. */
static int run_once(const bench_opts *o, int barrier, bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->epoch_barrier = barrier;
    ferry_config *cfg = ferry_config_new();
    if (!cfg)
        return FERRY_ENOMEM;
    int rc = set_all(cfg, o, barrier);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: %s\n", ferry_last_error());
        ferry_config_free(cfg);
        return rc;
    }

    double t_open = now_s();
    ferry_loader *ld;
    rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: open failed: %s: %s\n", ferry_err_name(rc),
                ferry_last_error());
        return rc;
    }
    uint64_t bpe = 0;
    ferry_loader_length(ld, NULL, &bpe);
    uint64_t total = o->batches > 0 ? (uint64_t)o->batches : bpe * (uint64_t)o->epochs;

    size_t cap = total ? total : 1;
    double *gaps = malloc(cap * sizeof *gaps);
    double *stalls = malloc(cap * sizeof *stalls);
    size_t ngaps = 0, nstalls = 0;
    double t_first = 0, t_prev = 0, t_last_progress = 0;
    uint64_t sink = 0, last_epoch = UINT64_MAX;
    int tty = o->progress && isatty(2);

    for (;;) {
        ferry_batch *b;
        rc = ferry_loader_next(ld, &b);
        double t = now_s();
        if (rc == FERRY_EOF) {
            rc = FERRY_OK;
            break;
        }
        if (rc == FERRY_EBATCH || rc == FERRY_ERANGE) {
            fprintf(stderr, "ferry-bench: batch failed: %s\n", ferry_last_error());
            r->failed++;
            continue;
        }
        if (rc != FERRY_OK) {
            fprintf(stderr, "ferry-bench: %s: %s\n", ferry_err_name(rc), ferry_last_error());
            break;
        }
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        if (r->batches == 0) {
            t_first = t;
            r->startup_ms = (t - t_open) * 1e3;
        } else if (gaps && stalls) {
            if (info.epoch != last_epoch)
                stalls[nstalls++] = (t - t_prev) * 1e3;
            else
                gaps[ngaps++] = (t - t_prev) * 1e3;
        }
        if (info.epoch != last_epoch)
            r->epochs_seen++;
        last_epoch = info.epoch;
        r->batches++;
        r->items += info.size;
        sink += touch(b, &r->bytes);
        ferry_batch_release(b);
        spin_us(o->step_us);
        t_prev = now_s();
        if (tty && t_prev - t_last_progress > 0.1) {
            progress(o, r->batches, total, t_first, 0);
            t_last_progress = t_prev;
        }
    }
    if (tty)
        progress(o, r->batches, total, t_first, 1);
    double span = t_prev - t_first;
    if (r->batches > 1 && span > 0) {
        r->batches_per_s = (double)(r->batches - 1) / span;
        r->items_per_s = r->batches_per_s * (double)r->items / (double)r->batches;
        r->mb_per_s = r->batches_per_s * (double)r->bytes / (double)r->batches / 1e6;
    }
    if (gaps && stalls) {
        r->gap_ms_mean = mean(gaps, ngaps);
        r->stall_ms_mean = mean(stalls, nstalls);
        r->gap_ms_median = median(gaps, ngaps);
        r->stall_ms_median = median(stalls, nstalls);
        for (size_t i = 0; i < nstalls; i++)
            if (stalls[i] > r->stall_ms_max)
                r->stall_ms_max = stalls[i];
    }
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    r->realigned = st.realigned;
    free(gaps);
    free(stalls);
    int crc = ferry_loader_close(ld);
    if (rc == FERRY_OK && crc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: close: %s\n", ferry_last_error());
        rc = crc;
    }
    if (sink == 42) /* keeps the reads from being optimised away */
        fputc(' ', stderr);
    return rc;
}

static void print_json(const bench_result *r, FILE *f)
{
    fprintf(f,
            "{\"batches_per_s\": %.1f, \"items_per_s\": %.0f, \"mb_per_s\": %.1f, "
            "\"startup_ms\": %.2f, \"gap_ms_median\": %.4f, \"epoch_stall_ms_median\": %.4f, "
            "\"epoch_stall_ms_max\": %.4f, \"stall_to_gap\": %.2f, \"gap_ms_mean\": %.4f, "
            "\"epoch_stall_ms_mean\": %.4f, \"batches\": %llu, "
            "\"items\": %llu, \"epochs\": %llu, \"failed\": %llu, \"realigned\": %llu, "
            "\"epoch_barrier\": %s}",
            r->batches_per_s, r->items_per_s, r->mb_per_s, r->startup_ms, r->gap_ms_median,
            r->stall_ms_median, r->stall_ms_max,
            r->gap_ms_median > 0 ? r->stall_ms_median / r->gap_ms_median : 0, r->gap_ms_mean,
            r->stall_ms_mean, (unsigned long long)r->batches, (unsigned long long)r->items,
            (unsigned long long)r->epochs_seen, (unsigned long long)r->failed,
            (unsigned long long)r->realigned, r->epoch_barrier ? "true" : "false");
}

static void print_text(const bench_opts *o, const bench_result *r)
{
    printf("%s\n", r->epoch_barrier ? "epoch barrier (the next epoch starts after the last "
                                      "batch is consumed)"
                                    : "prefetch across epochs (ferry's default)");
    if (o->bind)
        printf("  batches       %llu over %llu epochs (%ld local %s + remote workers on %s, "
               "batch %ld)\n",
               (unsigned long long)r->batches, (unsigned long long)r->epochs_seen, o->workers,
               o->worker_mode, o->bind, o->batch_size);
    else
        printf("  batches       %llu over %llu epochs (%ld %s workers, batch %ld)\n",
               (unsigned long long)r->batches, (unsigned long long)r->epochs_seen, o->workers,
               o->worker_mode, o->batch_size);
    printf("  throughput    %.0f batches/s  %.0f items/s  %.1f MB/s\n", r->batches_per_s,
           r->items_per_s, r->mb_per_s);
    printf("  startup       %.2f ms (open -> first batch)\n", r->startup_ms);
    printf("  gap           %.4f ms median, %.4f ms mean between batches\n", r->gap_ms_median,
           r->gap_ms_mean);
    printf("  epoch stall   %.4f ms median, %.4f ms mean, %.4f ms max (median %.2fx the gap)\n",
           r->stall_ms_median, r->stall_ms_mean, r->stall_ms_max,
           r->gap_ms_median > 0 ? r->stall_ms_median / r->gap_ms_median : 0);
    if (r->failed)
        printf("  failed        %llu batches\n", (unsigned long long)r->failed);
}

/* ------------------------------------------------------------------------
 * --compare-remote
 */

/* The directory holding this program (where ferry-worker and ferry-keygen
 * are, in the build tree and in an install's bin). */
static int own_dir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0)
        return -1;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

/* Starts argv; quiet: its stdout and stderr go to /dev/null. */
static pid_t spawn(char *const argv[], int quiet)
{
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (quiet) {
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return e ? -1 : pid;
}

static int run_and_wait(char *const argv[])
{
    pid_t pid = spawn(argv, 1);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
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

static void remove_tree(const char *dir, long n)
{
    char p[PATH_MAX + 64];
    const char *names[] = {"loader.key", "loader.pub"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    for (long i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/allow/w%ld.key", dir, i);
        unlink(p);
        snprintf(p, sizeof p, "%s/allow/w%ld.pub", dir, i);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/allow", dir);
    rmdir(p);
    rmdir(dir);
}

/* The three placements in one invocation. Long because it is one straight
 * sequence: keys, daemons, three runs, teardown, the table. */
static int compare_remote(bench_opts *o)
{
    long n = o->workers > 0 ? o->workers : 1;
    char bin[PATH_MAX], worker[PATH_MAX + 32], keygen[PATH_MAX + 32];
    if (own_dir(bin, sizeof bin) != 0) {
        fprintf(stderr, "ferry-bench: cannot find my own directory\n");
        return 1;
    }
    snprintf(worker, sizeof worker, "%s", o->worker_path ? o->worker_path : "");
    if (!o->worker_path)
        snprintf(worker, sizeof worker, "%s/ferry-worker", bin);
    snprintf(keygen, sizeof keygen, "%s/ferry-keygen", bin);

    char dir[] = "/tmp/ferry-bench-keys-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ferry-bench: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char base[PATH_MAX], pub[PATH_MAX + 8], key[PATH_MAX + 8], allow[PATH_MAX + 8];
    snprintf(allow, sizeof allow, "%s/allow", dir);
    int ok = mkdir(allow, 0700) == 0;
    snprintf(base, sizeof base, "%s/loader", dir);
    char *kg[] = {keygen, base, NULL};
    ok = ok && run_and_wait(kg) == 0;
    for (long i = 0; ok && i < n; i++) {
        snprintf(base, sizeof base, "%s/allow/w%ld", dir, i);
        ok = run_and_wait(kg) == 0;
    }
    if (!ok) {
        fprintf(stderr, "ferry-bench: could not make keys with %s\n", keygen);
        remove_tree(dir, n);
        return 1;
    }

    /* Local, then remote with CURVE, then remote over plain TCP (what the
     * encryption costs). */
    bench_result r[3];
    bench_opts ro[3];
    int rc = run_once(o, o->epoch_barrier, &r[0]);
    ro[0] = *o;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    snprintf(pub, sizeof pub, "%s/loader.pub", dir);
    snprintf(key, sizeof key, "%s/loader.key", dir);
    char ep[2][64], wkey[PATH_MAX + 8];
    for (int k = 1; k < 3 && rc == FERRY_OK && pids; k++) {
        int plain = k == 2;
        snprintf(ep[k - 1], sizeof ep[k - 1], "tcp://127.0.0.1:%d", free_port());
        for (long i = 0; i < n; i++) {
            snprintf(wkey, sizeof wkey, "%s/allow/w%ld.key", dir, i);
            char *curve[] = {worker, "--connect",    ep[k - 1], "--key",
                             wkey,   "--server-key", pub,       NULL};
            char *insecure[] = {worker, "--connect", ep[k - 1], "--insecure", NULL};
            pids[i] = spawn(plain ? insecure : curve, plain);
        }
        ro[k] = *o;
        ro[k].bind = ep[k - 1];
        ro[k].workers = 0;
        ro[k].min_workers = n;
        ro[k].curve_key = key;
        ro[k].curve_allow = allow;
        ro[k].insecure = plain;
        rc = run_once(&ro[k], o->epoch_barrier, &r[k]);
        for (long i = 0; i < n; i++) {
            if (pids[i] > 0) {
                kill(pids[i], SIGTERM);
                waitpid(pids[i], NULL, 0);
            }
        }
    }
    free(pids);
    remove_tree(dir, n);
    if (rc != FERRY_OK)
        return 1;
    static const char *const names[] = {"local", "remote_curve", "remote_plain"};
    if (o->json) {
        for (int k = 0; k < 3; k++) {
            printf("%s\"%s\": ", k ? ", " : "{", names[k]);
            print_json(&r[k], stdout);
        }
        printf("}\n");
        return 0;
    }
    static const char *const what[] = {"worker processes over ipc://",
                                       "ferry-worker daemons over tcp://127.0.0.1 with CURVE",
                                       "ferry-worker daemons over tcp://127.0.0.1, plain"};
    for (int k = 0; k < 3; k++) {
        printf("%s: %ld %s\n", names[k], n, what[k]);
        print_text(&ro[k], &r[k]);
    }
    for (int k = 1; k < 3; k++)
        printf("%s / local: throughput %.2fx, startup %.2fx, median gap %.2fx\n", names[k],
               r[0].batches_per_s > 0 ? r[k].batches_per_s / r[0].batches_per_s : 0,
               r[0].startup_ms > 0 ? r[k].startup_ms / r[0].startup_ms : 0,
               r[0].gap_ms_median > 0 ? r[k].gap_ms_median / r[0].gap_ms_median : 0);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry-bench [options]\n"
            "  --dataset SPEC      dataset (default synthetic:n=60000,dim=784, MNIST-sized)\n"
            "  --workers N         workers (default 2)\n"
            "  --threads           workers are threads, not processes\n"
            "  --batch-size N      items per batch (default 256)\n"
            "  --epochs N          epochs to run (default 10)\n"
            "  --batches N         run N batches instead of whole epochs\n"
            "  --prefetch N        batches in flight (default: auto)\n"
            "  --seed N            shuffle with this seed\n"
            "  --out-of-order      deliver batches as they complete\n"
            "  --step-us N         CPU time the 'trainer' spends per batch (default 0)\n"
            "  --epoch-barrier     wait at each epoch boundary (PyTorch persistent workers)\n"
            "  --compare           run without and with the barrier, print both\n"
            "  --worker-path PATH  the ferry-worker program\n"
            "  --bind ENDPOINT     also take remote workers at tcp://HOST:PORT\n"
            "  --min-workers N     workers to wait for before the first batch\n"
            "  --curve-key FILE    the loader's key pair (ferry-keygen)\n"
            "  --curve-allow PATH  allowed worker keys (file, or directory of .pub files)\n"
            "  --insecure          plain TCP for --bind (trusted networks only)\n"
            "  --compare-remote    --workers local processes, then as many remote ones\n"
            "                      over TCP+CURVE, then plain TCP, on 127.0.0.1; print all three\n"
            "  --json              print one JSON object\n"
            "  --no-progress       no progress bar\n"
            "  --help              this text\n"
            "  --version           the ferry version\n");
}

static int parse_long(const char *s, long lo, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!s[0] || errno || *end || v < lo)
        return -1;
    *out = v;
    return 0;
}

/* Fills *o from the command line. Returns -1 to go on, else the exit code
 * (0 after --help, 2 for a bad argument). */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct {
        const char *name;
        size_t off;
        long min;
    } nums[] = {
        {"--workers", offsetof(bench_opts, workers), 0},
        {"--min-workers", offsetof(bench_opts, min_workers), 0},
        {"--batch-size", offsetof(bench_opts, batch_size), 1},
        {"--epochs", offsetof(bench_opts, epochs), 1},
        {"--batches", offsetof(bench_opts, batches), 1},
        {"--prefetch", offsetof(bench_opts, prefetch), 0},
        {"--seed", offsetof(bench_opts, seed), 0},
        {"--step-us", offsetof(bench_opts, step_us), 0},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int matched = 0;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            if (strcmp(a, nums[k].name) == 0) {
                if (!v || parse_long(v, nums[k].min, (long *)((char *)o + nums[k].off))) {
                    fprintf(stderr, "ferry-bench: %s needs a number >= %ld\n", a, nums[k].min);
                    return 2;
                }
                i++;
                matched = 1;
            }
        }
        if (matched)
            continue;
        if (!strcmp(a, "--dataset") && v) {
            o->dataset = argv[++i];
        } else if (!strcmp(a, "--worker-path") && v) {
            o->worker_path = argv[++i];
        } else if (!strcmp(a, "--bind") && v) {
            o->bind = argv[++i];
        } else if (!strcmp(a, "--curve-key") && v) {
            o->curve_key = argv[++i];
        } else if (!strcmp(a, "--curve-allow") && v) {
            o->curve_allow = argv[++i];
        } else if (!strcmp(a, "--insecure")) {
            o->insecure = 1;
        } else if (!strcmp(a, "--compare-remote")) {
            o->compare_remote = 1;
        } else if (!strcmp(a, "--threads")) {
            o->worker_mode = "thread";
        } else if (!strcmp(a, "--epoch-barrier")) {
            o->epoch_barrier = 1;
        } else if (!strcmp(a, "--compare")) {
            o->compare = 1;
        } else if (!strcmp(a, "--out-of-order")) {
            o->in_order = 0;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--no-progress")) {
            o->progress = 0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("ferry-bench %s\n", ferry_version());
            return 0;
        } else {
            fprintf(stderr, "ferry-bench: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    bench_opts o = {.dataset = "synthetic:n=60000,dim=784",
                    .worker_mode = "process",
                    .workers = 2,
                    .batch_size = 256,
                    .epochs = 10,
                    .seed = -1,
                    .progress = 1,
                    .in_order = 1,
                    .min_workers = -1};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.compare_remote)
        return compare_remote(&o);
    bench_result r[2];
    int runs = o.compare ? 2 : 1;
    for (int k = 0; k < runs; k++) {
        int barrier = o.compare ? k : o.epoch_barrier;
        if (run_once(&o, barrier, &r[k]) != FERRY_OK)
            return 1;
    }
    if (o.json) {
        if (runs == 1) {
            print_json(&r[0], stdout);
        } else {
            printf("{\"prefetch\": ");
            print_json(&r[0], stdout);
            printf(", \"barrier\": ");
            print_json(&r[1], stdout);
            printf("}");
        }
        printf("\n");
        return 0;
    }
    for (int k = 0; k < runs; k++)
        print_text(&o, &r[k]);
    if (runs == 2 && r[0].stall_ms_median > 0)
        printf("cross-epoch prefetch: median epoch stall %.1fx shorter, throughput %.2fx\n",
               r[1].stall_ms_median / r[0].stall_ms_median,
               r[1].batches_per_s > 0 ? r[0].batches_per_s / r[1].batches_per_s : 0);
    return 0;
}
