/*
 * run.c - one measured run of ferry-bench: a loader opened, every batch
 * taken as a trainer takes it, the loader closed (see bench.h).
 *
 * The loop is the trainer: t0, ferry_loader_next(), t1. t1 - t0 is the
 * figure everything else is built on, the trainer's wait for that batch.
 * Then it reads one byte of every 4 KiB page of every field (so a batch
 * that was never really delivered cannot look fast) and runs the simulated
 * training step, a busy spin or a sleep. Anything else the loop does
 * (memory samples every 100 ms, the progress bar at most 10 times a
 * second) happens after the step and before the next t0: it is never
 * counted as waiting, and it is cheap against a step.
 *
 * Memory: the trainer's peak RSS is the kernel's own high-water mark
 * (VmHWM), reset before the run; the workers' is the sum of theirs at the
 * end (each worker is a fresh process per loader). PSS has no high-water
 * mark, so it is sampled from smaps_rollup and the largest sum is kept.
 * Thread workers are the trainer process itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "ferry_dataset.h"

#define SAMPLE_NS 100000000ull   /* memory samples: every 100 ms of the loop */
#define PROGRESS_NS 100000000ull /* the progress bar: at most 10 redraws a second */

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The simulated training step. A spin keeps a core busy as a CPU-bound
 * step does (and ends on time); a sleep gives the core to the workers, as
 * a step that waits for a GPU does, and ends when the kernel wakes us. */
static void train_step(const bench_opts *o)
{
    if (o->step_ms <= 0)
        return;
    uint64_t end = bench_now_ns() + (uint64_t)(o->step_ms * 1e6);
    if (o->step_sleep) {
        struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull),
                              .tv_nsec = (long)(end % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        return;
    }
    while (bench_now_ns() < end)
        ;
}

/* Reads one byte per 4 KiB of every field, so the pages are really touched.
 * Adds the fields' sizes to *bytes. */
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

/* ------------------------------------------------------------------------
 * Memory
 */

/* The kB value on line `key:` of a /proc file (status, smaps_rollup), or
 * -1 when the file or the line is not there (a process that just exited). */
static int64_t proc_kb(int pid, const char *file, const char *key)
{
    char path[64], buf[8192];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    else
        snprintf(path, sizeof path, "/proc/self/%s", file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    /* A newline in front, so that every key is found as "\nKey:". */
    size_t n = 1;
    buf[0] = '\n';
    ssize_t got;
    while (n < sizeof buf - 1 && (got = read(fd, buf + n, sizeof buf - 1 - n)) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    char want[32];
    snprintf(want, sizeof want, "\n%s:", key);
    const char *at = strstr(buf, want);
    if (!at)
        return -1;
    return strtoll(at + strlen(want), NULL, 10);
}

/* Sums `key` of `file` over the loader's live local worker processes;
 * -1 when none could be read. *count gets how many were. */
static int64_t workers_kb(ferry_loader *ld, const bench_opts *o, const char *file, const char *key,
                          int *count)
{
    int64_t sum = 0;
    int seen = 0;
    for (long i = 0; i < o->workers; i++) {
        int pid = 0;
        if (ferry_loader_worker_pid(ld, (uint32_t)i, &pid) != FERRY_OK || pid <= 0)
            continue;
        int64_t kb = proc_kb(pid, file, key);
        if (kb >= 0) {
            sum += kb;
            seen++;
        }
    }
    if (count)
        *count = seen;
    return seen ? sum : -1;
}

static void max_into(int64_t *keep, int64_t v)
{
    if (v > *keep)
        *keep = v;
}

static void sample_pss(ferry_loader *ld, const bench_opts *o, bench_run *r)
{
    max_into(&r->trainer_pss_kb, proc_kb(0, "smaps_rollup", "Pss"));
    max_into(&r->workers_pss_kb, workers_kb(ld, o, "smaps_rollup", "Pss", NULL));
}

/* Sets this process's VmHWM back to its RSS now, so that the peak is this
 * run's (Linux: clear_refs 5). 0, or -1 when the kernel refuses. */
static int reset_hwm(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------
 * Progress
 */

static void progress_draw(const bench_progress *p, uint64_t done, uint64_t t_first, uint64_t now)
{
    enum { WIDTH = 30 };
    uint64_t all = p->done_before + done;
    double frac = p->total ? (double)all / (double)p->total : 0;
    if (frac > 1)
        frac = 1;
    int fill = (int)(frac * WIDTH);
    double rate =
        done > 1 && now > t_first ? (double)(done - 1) * 1e9 / (double)(now - t_first) : 0;
    char eta[32] = "--:--";
    if (rate > 0 && p->total > all) {
        long s = (long)((double)(p->total - all) / rate + 0.5);
        if (s >= 3600)
            snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
        else
            snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
    }
    fprintf(stderr, "\r%-14s [%.*s%*s] %3.0f%%  %8.0f batches/s  ETA %s ", p->label, fill,
            "##############################", WIDTH - fill, "", frac * 100, rate, eta);
}

static void progress_clear(void)
{
    fputs("\r\033[K", stderr);
}

/* ------------------------------------------------------------------------
 * The run
 */

static int configure(ferry_config *cfg, const bench_opts *o, const bench_side *s)
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
    if (o->no_shm) {
        SETI("shm", 0);
    }
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
    if (o->io_threads > 0) {
        SETI("io_threads", o->io_threads);
    }
    SETI("batch_size", o->batch_size);
    SETI("prefetch", s->prefetch);
    SETI("in_order", o->in_order);
    SETI("epoch_barrier", s->epoch_barrier);
    if (s->mix)
        SETS("mix", s->mix);
    if (s->state && rc == FERRY_OK)
        rc = ferry_config_set_state(cfg, s->state, s->state_len);
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
    for (int i = 0; rc == FERRY_OK && i < o->nset; i++)
        rc = bench_apply_set(cfg, o->set[i]);
    return rc;
}

int bench_apply_set(ferry_config *cfg, const char *kv)
{
    const char *eq = strchr(kv, '=');
    char key[64];
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key) {
        fprintf(stderr, "ferry-bench: --set takes KEY=VALUE (a loader option), not '%s'\n", kv);
        return FERRY_EINVAL;
    }
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = '\0';
    int rc = ferry_config_set(cfg, key, eq + 1);
    if (rc != FERRY_OK)
        fprintf(stderr, "ferry-bench: --set %s: %s\n", kv, ferry_last_error());
    return rc;
}

/* Appends rec to r's records, growing them when a run has more batches
 * than planned. 0, or -1 out of memory. */
static int record(bench_run *r, const bench_rec *rec)
{
    if (r->nrecs == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 1024;
        bench_rec *p = realloc(r->recs, cap * sizeof *p);
        if (!p)
            return -1;
        r->recs = p;
        r->cap = cap;
    }
    r->recs[r->nrecs++] = *rec;
    return 0;
}

void bench_run_free(bench_run *r)
{
    free(r->recs);
    r->recs = NULL;
    r->nrecs = r->cap = 0;
}

/* Takes batches until the end of the stream: the trainer loop. FERRY_OK
 * at the end of the stream, else the code that stopped it. */
static int trainer_loop(ferry_loader *ld, const bench_opts *o, bench_progress *p, bench_run *r,
                        uint64_t *sink)
{
    uint64_t max_epoch = 0, t_sample = 0, t_drawn = 0;
    for (;;) {
        ferry_batch *b;
        uint64_t t0 = bench_now_ns();
        int rc = ferry_loader_next(ld, &b);
        uint64_t t1 = bench_now_ns();
        if (rc == FERRY_EOF)
            return FERRY_OK;
        if (rc == FERRY_EBATCH || rc == FERRY_ERANGE) {
            fprintf(stderr, "ferry-bench: batch failed: %s\n", ferry_last_error());
            r->failed++;
            continue;
        }
        if (rc != FERRY_OK) {
            fprintf(stderr, "ferry-bench: %s: %s\n", ferry_err_name(rc), ferry_last_error());
            return rc;
        }
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        bench_rec rec = {.seq = info.seq,
                         .epoch = info.epoch,
                         .batch_in_epoch = info.batch_in_epoch,
                         .wait_ns = t1 - t0,
                         .make_ns = info.make_ns,
                         .flight_ns = info.flight_ns,
                         .ready_ns = info.ready_ns,
                         .worker = info.worker,
                         .attempts = info.attempts,
                         .kind = BENCH_STEADY};
        /* Out of order, epochs may interleave at a boundary: the first
         * batch of an epoch is the first one seen of a higher epoch. */
        if (r->nrecs == 0) {
            rec.kind = BENCH_FIRST;
            r->t_first = t1;
            max_epoch = info.epoch;
        } else if (info.epoch > max_epoch) {
            rec.kind = BENCH_BOUNDARY;
            max_epoch = info.epoch;
        }
        r->t_last = t1;
        r->items += info.size;
        *sink += touch(b, &r->bytes);
        ferry_batch_release(b);
        uint64_t t2 = bench_now_ns();
        train_step(o);
        uint64_t now = bench_now_ns();
        rec.step_ns = now - t2;
        if (record(r, &rec) != 0) {
            fprintf(stderr, "ferry-bench: out of memory for the batch records\n");
            return FERRY_ENOMEM;
        }
        if (now - t_sample >= SAMPLE_NS) {
            sample_pss(ld, o, r);
            t_sample = now;
        }
        if (p->on && now - t_drawn >= PROGRESS_NS) {
            progress_draw(p, r->nrecs, r->t_first, now);
            t_drawn = now;
        }
    }
}

/* One measured run. Long because it is one straight sequence of timed
 * steps (open, the batches, the last memory readings, close). */
/* The loader's stage figures and their verdict, into r (a kind of
 * FERRY_VERDICT_UNKNOWN when there is no memory to judge with). */
static void take_profile(ferry_loader *ld, bench_run *r)
{
    ferry_loader_profile(ld, -1, &r->profile);
    uint32_t n = r->profile.workers;
    ferry_profile *w = calloc(n ? n : 1, sizeof *w);
    r->verdict.kind = FERRY_VERDICT_UNKNOWN;
    snprintf(r->verdict.text, sizeof r->verdict.text, "no memory to judge the figures with");
    if (!w)
        return;
    for (uint32_t i = 0; i < n; i++)
        ferry_loader_profile(ld, (int32_t)i, &w[i]);
    ferry_profile_verdict(&r->profile, w, n, &r->verdict);
    free(w);
}

int bench_run_once(const bench_opts *o, const bench_side *s, bench_progress *p, bench_run *r)
{
    memset(r, 0, sizeof *r);
    r->trainer_hwm_kb = r->trainer_pss_kb = r->workers_hwm_kb = r->workers_pss_kb = -1;
    ferry_config *cfg = ferry_config_new();
    if (!cfg) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        return 1;
    }
    if (configure(cfg, o, s) != FERRY_OK) {
        fprintf(stderr, "ferry-bench: %s\n", ferry_last_error());
        ferry_config_free(cfg);
        return 1;
    }
    /* The records are allocated before the clock starts, for the run as
     * planned; a longer one grows them. */
    uint64_t planned = o->batches > 0 ? (uint64_t)o->batches : 0;
    if (planned && !(r->recs = malloc(planned * sizeof *r->recs))) {
        fprintf(stderr, "ferry-bench: out of memory for %llu batch records\n",
                (unsigned long long)planned);
        ferry_config_free(cfg);
        return 1;
    }
    r->cap = r->recs ? planned : 0;
    r->hwm_reset = reset_hwm() == 0;

    ferry_loader *ld;
    r->t_open = bench_now_ns();
    int rc = ferry_loader_open(&ld, cfg);
    r->t_opened = bench_now_ns();
    ferry_config_free(cfg);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: open failed: %s: %s\n", ferry_err_name(rc),
                ferry_last_error());
        return 1;
    }
    ferry_loader_length(ld, NULL, &r->batches_per_epoch);
    if (!planned) {
        planned = r->batches_per_epoch * (uint64_t)o->epochs;
        bench_rec *recs = planned ? malloc(planned * sizeof *recs) : NULL;
        if (recs) {
            r->recs = recs;
            r->cap = planned;
        }
    }
    if (!p->total)
        p->total = planned * p->runs;

    uint64_t sink = 0;
    rc = trainer_loop(ld, o, p, r, &sink);
    if (p->on)
        progress_clear();

    /* The peaks, before close lets the workers go. */
    sample_pss(ld, o, r);
    r->trainer_hwm_kb = proc_kb(0, "status", "VmHWM");
    r->workers_hwm_kb = workers_kb(ld, o, "status", "VmHWM", &r->worker_processes);
    ferry_loader_stats(ld, &r->stats);
    take_profile(ld, r);
    int crc = ferry_loader_close(ld);
    if (rc == FERRY_OK && crc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: close: %s\n", ferry_last_error());
        rc = crc;
    }
    if (sink == 42) /* keeps the reads from being optimised away */
        fputc(' ', stderr);
    p->done_before += r->nrecs;
    return rc == FERRY_OK ? 0 : 1;
}

int bench_probe(const bench_opts *o, const bench_side *s, uint64_t *batch_bytes,
                uint64_t *batches_per_epoch, uint32_t *prefetch)
{
    ferry_config *cfg = ferry_config_new();
    if (!cfg) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        return 1;
    }
    bench_opts one = *o;
    one.batches = 1; /* open needs the workers' READY, not a run */
    ferry_loader *ld = NULL;
    int rc = configure(cfg, &one, s);
    if (rc == FERRY_OK)
        rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    ferry_dataset_schema schema;
    if (rc == FERRY_OK)
        rc = ferry_loader_schema(ld, &schema);
    if (rc == FERRY_OK)
        rc = ferry_loader_length(ld, NULL, batches_per_epoch);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-bench: reading the dataset's schema: %s: %s\n", ferry_err_name(rc),
                ferry_last_error());
        if (ld)
            ferry_loader_close(ld);
        return 1;
    }
    uint64_t bytes = 0;
    for (int f = 0; f < schema.nfields; f++) {
        uint64_t item = ferry_dtype_size(schema.fields[f].dtype);
        for (int d = 0; d < schema.fields[f].ndim; d++)
            item *= (uint64_t)schema.fields[f].shape[d];
        bytes += item * (uint64_t)o->batch_size;
    }
    *batch_bytes = bytes;
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    *prefetch = st.prefetch;
    return ferry_loader_close(ld) == FERRY_OK ? 0 : 1;
}

int bench_saved_state(const bench_opts *o, long world, void *buf, size_t cap, size_t *len)
{
    bench_side job = {"job", "the saving job", 0, o->prefetch, BENCH_LOCAL, NULL, NULL, 0};
    ferry_config *cfg = ferry_config_new();
    ferry_loader *ld = NULL;
    uint64_t items, bpe;
    int rc = cfg ? configure(cfg, o, &job) : FERRY_ENOMEM;
    if (rc == FERRY_OK)
        rc = ferry_config_set_int(cfg, "world_size", world);
    if (rc == FERRY_OK)
        rc = ferry_config_set_int(cfg, "rank", 0);
    if (rc == FERRY_OK)
        rc = ferry_loader_open(&ld, cfg);
    if (rc == FERRY_OK)
        rc = ferry_loader_length(ld, &items, &bpe);
    for (uint64_t i = 0; rc == FERRY_OK && i < (bpe + 2) / 3; i++) {
        ferry_batch *b;
        rc = ferry_loader_next(ld, &b);
        if (rc == FERRY_OK)
            ferry_batch_release(b);
    }
    if (rc == FERRY_OK)
        rc = ferry_loader_state(ld, buf, cap, len);
    if (rc != FERRY_OK)
        fprintf(stderr, "ferry-bench: saving a %ld-rank job's state: %s\n", world,
                ferry_last_error());
    if (ld)
        ferry_loader_close(ld);
    ferry_config_free(cfg);
    return rc == FERRY_OK ? 0 : 1;
}
