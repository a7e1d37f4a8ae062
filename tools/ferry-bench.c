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
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

typedef struct bench_opts {
    const char *dataset;
    const char *worker_mode;
    const char *worker_path;
    long workers, batch_size, epochs, batches, prefetch, seed, step_us;
    int epoch_barrier, compare, json, progress, in_order;
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

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-bench [options]\n"
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
               "  --json              print one JSON object\n"
               "  --no-progress       no progress bar\n");
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

int main(int argc, char **argv)
{
    bench_opts o = {.dataset = "synthetic:n=60000,dim=784",
                    .worker_mode = "process",
                    .workers = 2,
                    .batch_size = 256,
                    .epochs = 10,
                    .seed = -1,
                    .progress = 1,
                    .in_order = 1};
    static const struct {
        const char *name;
        size_t off;
        long min;
    } nums[] = {
        {"--workers", offsetof(bench_opts, workers), 1},
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
                if (!v || parse_long(v, nums[k].min, (long *)((char *)&o + nums[k].off))) {
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
            o.dataset = argv[++i];
        } else if (!strcmp(a, "--worker-path") && v) {
            o.worker_path = argv[++i];
        } else if (!strcmp(a, "--threads")) {
            o.worker_mode = "thread";
        } else if (!strcmp(a, "--epoch-barrier")) {
            o.epoch_barrier = 1;
        } else if (!strcmp(a, "--compare")) {
            o.compare = 1;
        } else if (!strcmp(a, "--out-of-order")) {
            o.in_order = 0;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--no-progress")) {
            o.progress = 0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "ferry-bench: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }

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
