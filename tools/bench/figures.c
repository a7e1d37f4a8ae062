/*
 * figures.c - what ferry-bench reports, made from the batch records of a
 * run, and the medians and ratios over rounds (see bench.h).
 *
 * The definitions, which docs/benchmarks.md and --help repeat:
 *  - wait: the time inside ferry_loader_next() for one batch;
 *  - steady waits: every batch but the run's first and each epoch's first;
 *    epoch-start waits: the first batch of epochs 1, 2, ... (the first of
 *    epoch 0 is the startup);
 *  - startup: ferry_loader_open() called -> the first batch in hand;
 *  - batches/s: (batches - 1) / (last batch in hand - first in hand), so
 *    startup is left out; items/s and MB/s follow from it;
 *  - step-bound fraction: batches/s x step, i.e. the step over the mean
 *    time from one batch in hand to the next: 1 when the trainer never
 *    waits, reading a batch costs nothing and the step takes no longer
 *    than asked (step overrun: by how much it did, on average);
 *  - p50/p99: linear between the closest ranks (numpy's default);
 *  - ratios: per round, > 1 when the first side did better; times under
 *    0.01 ms count as 0.01 ms in them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const bench_metric bench_metrics[] = {
#define BENCH__METRIC(name, label, better, format)                                                 \
    {#name, label, offsetof(bench_fig, name), better, format},
    BENCH_FIGURES(BENCH__METRIC)
#undef BENCH__METRIC
};
const size_t bench_nmetrics = sizeof bench_metrics / sizeof bench_metrics[0];

static double *field(bench_fig *f, const bench_metric *m)
{
    return (double *)((char *)f + m->off);
}

static void fill_nan(bench_fig *f)
{
    for (size_t i = 0; i < bench_nmetrics; i++)
        *field(f, &bench_metrics[i]) = NAN;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n), sorted; NAN when n is 0. */
static double quantile(const double *v, size_t n, double q)
{
    if (!n)
        return NAN;
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n)
        return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

typedef struct spread {
    double p50, p99, max, mean;
} spread;

/* Sorts v[0..n) and describes it; every figure NAN when n is 0. */
static spread describe(double *v, size_t n)
{
    spread s = {NAN, NAN, NAN, NAN};
    if (!n)
        return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.p50 = quantile(v, n, 0.50);
    s.p99 = quantile(v, n, 0.99);
    s.max = v[n - 1];
    s.mean = sum / (double)n;
    return s;
}

/* Which of a record's times to collect. */
enum { T_WAIT, T_MAKE, T_FLIGHT, T_READY };

/* Copies into v, in ms, time `which` of the records of kind `kind` (-1:
 * every kind). Returns how many. For the times the workers report, a run
 * where every one is 0 was made with a loader that does not fill them in:
 * nothing is collected then. */
static size_t collect(const bench_run *r, int which, int kind, double *v)
{
    size_t n = 0, nonzero = 0;
    for (size_t i = 0; i < r->nrecs; i++) {
        const bench_rec *x = &r->recs[i];
        if (kind >= 0 && x->kind != kind)
            continue;
        uint64_t ns = which == T_WAIT     ? x->wait_ns
                      : which == T_MAKE   ? x->make_ns
                      : which == T_FLIGHT ? x->flight_ns
                                          : x->ready_ns;
        nonzero += ns != 0;
        v[n++] = (double)ns / 1e6;
    }
    return which != T_WAIT && !nonzero ? 0 : n;
}

static double mib(int64_t kb)
{
    return kb < 0 ? NAN : (double)kb / 1024.0;
}

void bench_figures(const bench_opts *o, const bench_run *r, bench_fig *f)
{
    fill_nan(f);
    size_t n = r->nrecs;
    f->batches = (double)n;
    f->items = (double)r->items;
    f->failed = (double)r->failed;
    f->open_ms = (double)(r->t_opened - r->t_open) / 1e6;
    f->trainer_peak_rss_mib = mib(r->trainer_hwm_kb);
    f->trainer_peak_pss_mib = mib(r->trainer_pss_kb);
    f->workers_peak_rss_mib = mib(r->workers_hwm_kb);
    f->workers_peak_pss_mib = mib(r->workers_pss_kb);
    if (!n)
        return;

    uint64_t retried = 0, waited_ns = 0, stepped_ns = 0;
    for (size_t i = 0; i < n; i++) {
        retried += r->recs[i].attempts > 1;
        stepped_ns += r->recs[i].step_ns;
        if (r->recs[i].kind != BENCH_FIRST)
            waited_ns += r->recs[i].wait_ns;
    }
    f->retried = (double)retried;
    f->epochs = (double)(r->recs[n - 1].epoch - r->recs[0].epoch + 1);
    f->startup_ms = (double)(r->t_first - r->t_open) / 1e6;
    f->wait_total_ms = (double)waited_ns / 1e6;
    if (o->step_ms > 0)
        f->step_overrun_ms = (double)stepped_ns / 1e6 / (double)n - o->step_ms;
    uint64_t span = r->t_last - r->t_first;
    if (n > 1 && span > 0) {
        f->wait_share = (double)waited_ns / (double)span;
        f->batches_per_s = (double)(n - 1) * 1e9 / (double)span;
        f->items_per_s = f->batches_per_s * (double)r->items / (double)n;
        f->mb_per_s = f->batches_per_s * (double)r->bytes / (double)n / 1e6;
        if (o->step_ms > 0)
            f->step_bound_fraction = f->batches_per_s * o->step_ms / 1e3;
    }

    double *v = malloc(n * sizeof *v);
    if (!v)
        return;
    spread s = describe(v, collect(r, T_WAIT, BENCH_STEADY, v));
    f->wait_p50_ms = s.p50;
    f->wait_p99_ms = s.p99;
    f->wait_max_ms = s.max;
    f->wait_mean_ms = s.mean;
    s = describe(v, collect(r, T_WAIT, BENCH_BOUNDARY, v));
    f->epoch_wait_p50_ms = s.p50;
    f->epoch_wait_p99_ms = s.p99;
    f->epoch_wait_max_ms = s.max;
    f->make_p50_ms = describe(v, collect(r, T_MAKE, -1, v)).p50;
    f->flight_p50_ms = describe(v, collect(r, T_FLIGHT, -1, v)).p50;
    f->ready_p50_ms = describe(v, collect(r, T_READY, -1, v)).p50;
    free(v);
}

void bench_summarize(const bench_fig *rounds, size_t n, bench_summary *out)
{
    fill_nan(&out->median);
    fill_nan(&out->min);
    fill_nan(&out->max);
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return;
    for (size_t k = 0; k < bench_nmetrics; k++) {
        const bench_metric *m = &bench_metrics[k];
        size_t got = 0;
        for (size_t i = 0; i < n; i++) {
            double x = bench_get(&rounds[i], m);
            if (!isnan(x))
                v[got++] = x;
        }
        if (!got)
            continue;
        qsort(v, got, sizeof *v, cmp_double);
        *field(&out->median, m) = quantile(v, got, 0.5);
        *field(&out->min, m) = v[0];
        *field(&out->max, m) = v[got - 1];
    }
    free(v);
}

/* Times below this count as this in ratios. A next() that finds its batch
 * ready returns in microseconds or less, and the ratio of two such
 * non-waits (0.3 us against 0.0002 ms) is noise, not a result. */
#define RATIO_FLOOR_MS 0.01

void bench_ratio(const bench_fig *a, const bench_fig *b, bench_fig *ratio)
{
    fill_nan(ratio);
    for (size_t k = 0; k < bench_nmetrics; k++) {
        const bench_metric *m = &bench_metrics[k];
        double x = bench_get(a, m), y = bench_get(b, m);
        if (!m->better || isnan(x) || isnan(y))
            continue;
        if (m->better < 0) {
            /* lower is better: every such figure is a time in ms */
            x = fmax(x, RATIO_FLOOR_MS);
            y = fmax(y, RATIO_FLOOR_MS);
        }
        double num = m->better > 0 ? x : y, den = m->better > 0 ? y : x;
        if (den > 0)
            *field(ratio, m) = num / den;
    }
}
