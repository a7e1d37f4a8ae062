/*
 * bench.h - what the parts of ferry-bench share: its settings, the record
 * of one measured run, and the figures made from it.
 *
 * The data flow: ferry-bench.c reads the command line into a bench_opts and
 * decides which runs to make (one run, or the sides of --compare and
 * --compare-remote alternating for some rounds); run.c makes one run, a
 * trainer loop that records each batch (bench_run); figures.c turns a run
 * into figures (bench_fig) and the figures of many rounds into medians and
 * ratios; report.c writes them out (the summary, JSON, CSV, the plot).
 * Everything runs on the main thread.
 */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"

/* ------------------------------------------------------------------------
 * Settings
 */

#define BENCH_MAX_SETS 32

typedef struct bench_opts {
    const char *dataset;
    const char *worker_mode; /* "process" or "thread" */
    const char *worker_path;
    const char *bind, *curve_key, *curve_allow;
    long workers, batch_size, epochs, batches, prefetch, seed, min_workers;
    long io_threads;      /* the loader's io_threads; 0: its default */
    long rounds;          /* runs of each side; 0 until the command line is read */
    long prefetch_factor; /* the baseline's window per worker (PyTorch's name) */
    double step_ms;       /* the simulated training step per batch */
    int step_sleep;       /* the step sleeps instead of spinning */
    int epoch_barrier, compare, compare_remote, limits, json, progress, in_order, insecure;
    int no_shm; /* local process workers' batches by message, not shared memory */
    /* --compare-mix SPEC: the dataset as one source against the same items
     * as the sources of SPEC (option mix), drawn by weight */
    const char *compare_mix;
    /* --compare-resume W: a fresh loader against one resumed from a state
     * saved by rank 0 of a W-rank job a third into its first epoch */
    long compare_resume;
    const char *csv, *plot;
    /* --set KEY=VALUE: loader options set after everything else, on every
     * side, in the order given ("KEY=VALUE" strings from argv). */
    const char *set[BENCH_MAX_SETS];
    int nset;
    /* --compare-remote: --rtt-ms puts a relay (relay.h) adding this round
     * trip between the loader and the daemons; --tuned KEY=VALUE adds a
     * side, plain TCP with these options on top (hand-tuned, say). */
    double rtt_ms;
    const char *tuned[BENCH_MAX_SETS];
    int ntuned;
} bench_opts;

/* One way of running the same work: ferry as configured, the PyTorch-like
 * baseline, or a remote placement. */
typedef enum bench_remote {
    BENCH_LOCAL = 0,
    BENCH_REMOTE_CURVE,
    BENCH_REMOTE_PLAIN,
    BENCH_REMOTE_TUNED, /* plain, with --tuned's options */
} bench_remote;

#define BENCH_MAX_SIDES 4

typedef struct bench_side {
    const char *name; /* in JSON, the CSV and the tables: "ferry", "baseline", ... */
    const char *what; /* one line for the summary */
    int epoch_barrier;
    long prefetch; /* 0: the loader's automatic window */
    bench_remote remote;
    const char *mix;   /* the loader's option mix, or NULL */
    const void *state; /* a resume state (ferry_config_set_state), or NULL */
    size_t state_len;
} bench_side;

/* ------------------------------------------------------------------------
 * One run
 */

/* One batch as the trainer saw it. */
typedef struct bench_rec {
    uint64_t seq, epoch, batch_in_epoch;
    uint64_t wait_ns; /* inside ferry_loader_next(): what the trainer waited */
    uint64_t make_ns, flight_ns, ready_ns;
    uint64_t step_ns; /* the step as it really ran: a spin preempted at its end, or a
                         sleep woken late, runs over */
    uint32_t worker, attempts;
    uint8_t kind; /* BENCH_STEADY, BENCH_BOUNDARY or BENCH_FIRST */
} bench_rec;

enum {
    BENCH_STEADY = 0, /* any batch but the two below */
    BENCH_BOUNDARY,   /* the first batch of a new epoch (epoch 1 and later) */
    BENCH_FIRST,      /* the run's first batch: part of the startup */
};

/* What one run left behind. Times are CLOCK_MONOTONIC nanoseconds; memory
 * is in KiB, -1 where it could not be read. */
typedef struct bench_run {
    bench_rec *recs;
    size_t nrecs, cap;
    uint64_t t_open, t_opened; /* ferry_loader_open() called, returned */
    uint64_t t_first, t_last;  /* first and last batch in hand */
    uint64_t items, bytes, failed, batches_per_epoch;
    int64_t trainer_hwm_kb; /* VmHWM, reset before the run */
    int64_t trainer_pss_kb; /* the largest Pss sampled */
    int64_t workers_hwm_kb; /* sum of the local worker processes' VmHWM */
    int64_t workers_pss_kb; /* the largest sum of their Pss sampled */
    int worker_processes;   /* local worker processes measured */
    int hwm_reset;          /* the kernel let us reset the trainer's VmHWM */
    ferry_stats stats;      /* the loader's counters just before close */
    ferry_profile profile;  /* where the time went, since open (ferry_loader_profile) */
    ferry_verdict verdict;  /* and what it says */
} bench_run;

/* Where the progress bar is, across every run of the invocation. */
typedef struct bench_progress {
    int on;
    char label[40];       /* which run: "ferry 2/5" */
    unsigned runs;        /* runs in the invocation */
    uint64_t done_before; /* batches of the runs already made */
    uint64_t total;       /* batches of all the runs; 0 until the first run knows */
} bench_progress;

/* Opens a loader for side s, takes every batch as a trainer would (wait in
 * next(), touch the pages, the step), closes it, and fills *r (free it with
 * bench_run_free, also after a failure). 0, or 1 after saying on stderr
 * what failed. */
int bench_run_once(const bench_opts *o, const bench_side *s, bench_progress *p, bench_run *r);

/* One --set: "KEY=VALUE" set on cfg with ferry_config_set; FERRY_OK, or
 * its error, said on stderr. */
int bench_apply_set(ferry_config *cfg, const char *kv);
void bench_run_free(bench_run *r);

/* The state rank 0 of a `world`-rank job (o's dataset, batch size and
 * seed) saves a third into its first epoch, into buf: 0, or 1 after
 * saying on stderr what failed. */
int bench_saved_state(const bench_opts *o, long world, void *buf, size_t cap, size_t *len);

/* ------------------------------------------------------------------------
 * Figures
 */

/* Every figure, one double each (NAN where it does not apply): the table
 * below drives the medians, the ratios, the JSON and the comparison table.
 * X(name, label, better, format): better is 1 where higher is better, -1
 * where lower is, 0 where no ratio is made of it; format is 'c' a count,
 * 'v' a value, '%' a fraction shown as a percentage, 0 not in the table. */
#define BENCH_FIGURES(X)                                                                           \
    X(batches, "batches", 0, 'c')                                                                  \
    X(items, "items", 0, 0)                                                                        \
    X(epochs, "epochs", 0, 0)                                                                      \
    X(failed, "failed batches", 0, 0)                                                              \
    X(retried, "batches sent again", 0, 0)                                                         \
    X(wait_p50_ms, "wait p50, steady (ms)", -1, 'v')                                               \
    X(wait_p99_ms, "wait p99, steady (ms)", -1, 'v')                                               \
    X(wait_max_ms, "wait max, steady (ms)", -1, 'v')                                               \
    X(wait_mean_ms, "wait mean, steady (ms)", 0, 0)                                                \
    X(epoch_wait_p50_ms, "epoch-start wait p50 (ms)", -1, 'v')                                     \
    X(epoch_wait_p99_ms, "epoch-start wait p99 (ms)", -1, 'v')                                     \
    X(epoch_wait_max_ms, "epoch-start wait max (ms)", -1, 'v')                                     \
    X(wait_total_ms, "waited in all (ms)", -1, 'v')                                                \
    X(wait_share, "share of the run waiting", 0, '%')                                              \
    X(startup_ms, "startup (ms)", -1, 'v')                                                         \
    X(open_ms, "open (ms)", 0, 0)                                                                  \
    X(batches_per_s, "batches/s", 1, 'v')                                                          \
    X(items_per_s, "items/s", 0, 0)                                                                \
    X(mb_per_s, "MB/s", 0, 'v')                                                                    \
    X(step_bound_fraction, "of the step-bound rate", 1, '%')                                       \
    X(step_overrun_ms, "step overrun, mean (ms)", 0, 'v')                                          \
    X(make_p50_ms, "make p50 (ms)", 0, 'v')                                                        \
    X(flight_p50_ms, "flight p50 (ms)", 0, 'v')                                                    \
    X(ready_p50_ms, "ready p50 (ms)", 0, 'v')                                                      \
    X(trainer_peak_rss_mib, "trainer peak RSS (MiB)", 0, 'v')                                      \
    X(trainer_peak_pss_mib, "trainer peak PSS (MiB)", 0, 'v')                                      \
    X(workers_peak_rss_mib, "workers peak RSS (MiB)", 0, 'v')                                      \
    X(workers_peak_pss_mib, "workers peak PSS (MiB)", 0, 'v')

typedef struct bench_fig {
#define BENCH__FIELD(name, label, better, format) double name;
    BENCH_FIGURES(BENCH__FIELD)
#undef BENCH__FIELD
} bench_fig;

/* A figure's name, label, place in bench_fig, and better and format as in
 * BENCH_FIGURES. */
typedef struct bench_metric {
    const char *key;
    const char *label;
    size_t off;
    int better;
    char format;
} bench_metric;

extern const bench_metric bench_metrics[];
extern const size_t bench_nmetrics;

static inline double bench_get(const bench_fig *f, const bench_metric *m)
{
    return *(const double *)((const char *)f + m->off);
}

/* The figures of run r (made under o). */
void bench_figures(const bench_opts *o, const bench_run *r, bench_fig *f);

/* The median, min and max over n rounds of each figure, and the same of
 * the ratios between two sides' rounds (see bench_ratio). */
typedef struct bench_summary {
    bench_fig median, min, max;
} bench_summary;

void bench_summarize(const bench_fig *rounds, size_t n, bench_summary *out);
/* ratio = a / b for figures where higher is better, b / a where lower is
 * better: > 1 means `a` did better. Times under 0.01 ms count as 0.01 ms
 * (a ready batch's next() takes about that or less: no wait). NAN for
 * figures without a ratio, and where either is NAN or the divisor is 0. */
void bench_ratio(const bench_fig *a, const bench_fig *b, bench_fig *ratio);

/* ------------------------------------------------------------------------
 * Output
 */

/* Everything the reports need beyond the figures. */
typedef struct bench_report {
    const bench_opts *o;
    const bench_side *sides;
    size_t nsides;
    size_t rounds;
    int labelled; /* the CSV's rows start with the round and the side */
    uint64_t batches_per_epoch;
    const bench_fig *figs;         /* figs[round * nsides + side] */
    const bench_summary *per_side; /* nsides */
    const bench_summary *ratios;   /* nsides: side k against side 0; [0] unused */
    const bench_run *last;         /* the last run of side 0, for the single-run summary */
    const ferry_stats *side_stats; /* nsides: each side's last run's, just before close */
} bench_report;

void bench_print_text(const bench_report *rep, FILE *f);
void bench_print_json(const bench_report *rep, FILE *f);

/* The pieces the reports are made of, for --limits' own report: the
 * settings' two lines, and JSON's strings (NULL: null), numbers (NAN and
 * infinities: null), settings and host objects. */
void bench_print_settings(const bench_opts *o, long prefetch, uint64_t batches_per_epoch, FILE *f);
void bench_json_str(FILE *f, const char *s);
void bench_json_num(FILE *f, double v);
void bench_json_settings(const bench_opts *o, size_t rounds, FILE *f);
void bench_json_host(FILE *f);

/* The CSV: one row per batch. With `labelled`, each row starts with the
 * round and the side. */
void bench_csv_header(FILE *f, int labelled);
void bench_csv_rows(FILE *f, const bench_run *r, int labelled, size_t round, const char *side);

/* Plots the wait per batch of the CSV at csv_path (the last round of each
 * side) into png_path with gnuplot. 0, or 1 after saying why on stderr (no
 * gnuplot names the Debian package). */
int bench_plot(const bench_report *rep, const char *csv_path, const char *png_path);

/* Opens a loader as bench_run_once would (side s) just long enough to read
 * the dataset's schema and length: the bytes of a full batch (each field's
 * item bytes x batch_size) and the batches of an epoch. 0, or 1 after
 * saying why on stderr. */
int bench_probe(const bench_opts *o, const bench_side *s, uint64_t *batch_bytes,
                uint64_t *batches_per_epoch, uint32_t *prefetch);

/* ------------------------------------------------------------------------
 * --limits
 */

/* Runs o->rounds rounds of the one-copy limit, a raw ZeroMQ round trip
 * and ferry (see limits.c) and prints their report. The exit code: 0, or
 * 1 after saying on stderr what failed. */
int bench_limits(const bench_opts *o);

/* Monotonic nanoseconds. */
uint64_t bench_now_ns(void);

#endif
