/*
 * soak.c - the soak driver, built as ferry-soak: open, use, hurt and close
 * loaders over and over, to prove that ferry never hangs and never leaks.
 *
 * What it proves, over thousands of cycles, each with its own random plan
 * (worker mode and count, prefetch, batch size, dataset shape, order, shuffle,
 * epochs, how far to read) and faults injected on purpose:
 *   - every batch is intact (y is the index, x's bytes are
 *     ferry__synthetic_byte of it) and is the batch the sampler puts at its
 *     seq; no seq comes twice; in order, seqs run contiguously from 0 and every
 *     item comes exactly once per epoch, also while workers are SIGKILLed or
 *     SIGSTOPped and replaced under the default restart policy;
 *   - ferry_loader_close() returns, also early, with batches in flight and
 *     one batch still held, which must stay valid until it is released;
 *   - after close nothing is left: fds, threads, child processes, files in
 *     TMPDIR;
 *   - when the trainer dies without closing, its workers die on their own
 *     (PR_SET_PDEATHSIG) and nothing stays running;
 *   - nothing blocks past a deadline; with timeout_ms set, no next() blocks
 *     much longer than that (a stopped worker must be killed and replaced,
 *     also one caught while it was still starting).
 *
 * How. The parent never opens a loader. Each cycle runs in a forked child, the
 * "trainer", with a fresh TMPDIR (the loader's ipc directory lands there); up
 * to --parallel run at once. The trainer checks every batch and then its own
 * leaks, with the checks the cmocka tests use (tests/harness.h), and reports
 * a failure on stderr with an exit code per kind. Its stderr comes to the
 * parent through a pipe and is shown only when the cycle fails. The parent is
 * a child subreaper, so workers orphaned by a dead trainer are reparented to
 * it: it watches /proc for them and calls any still alive 2 s after its
 * trainer ended a leak. It waits on a signalfd (SIGCHLD) and the trainers'
 * pipes with poll(), never with sleep(), and kills a trainer that outlives
 * --deadline-ms as a hang, after printing its plan and what its threads and
 * workers were doing. A close that takes over a second although every worker
 * could answer STOP is reported as a warning (slow, bounded, not a hang).
 *
 * Replay: a plan depends only on (seed, cycle number), so `--seed S --cycle C`
 * runs a failing cycle alone. The timing of a fault relative to the workers'
 * progress can still differ from run to run.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"
#include "harness.h"
#include "sampler.h"

#define MAX_PARALLEL 64
#define LOG_TAIL 16384       /* bytes of a trainer's stderr kept for a failure report */
#define ORPHAN_GRACE_MS 2000 /* a worker may outlive its trainer by this much */
#define STOP_TIMEOUT_MS 500  /* timeout_ms of a plan that SIGSTOPs a worker */
/* start_timeout_ms of such a plan: a replacement stopped before it is ready is
 * killed after this (the loader's rule), well inside NEXT_BOUND_S. */
#define STOP_START_TIMEOUT_MS 2500
#define MAX_ATTEMPTS 3          /* the loader's default max_attempts */
#define TO_END_MAX_BATCHES 1500 /* longest stream a plan reads to its end */
#define MAX_STRAYS 256
#define SLOW_CLOSE_MS 1000   /* a close this slow, with no worker stopped, is reported */
#define SLOW_CLOSE_REPORTS 5 /* slow closes described in full; the rest only counted */
#define NEXT_BOUND_S 6       /* with timeout_ms set, the longest next() may block */
#define RESPAWN_WAIT_MS 5000 /* how long to look for a killed worker's replacement */
/* The longest close may take: close_grace_ms (default 2000) for STOP, half
 * of it for SIGTERM, then SIGKILL and reaping; plus a margin for a loaded
 * machine and sanitizers. Past this, close is not bounded as documented. */
#define CLOSE_BOUND_MS (2000 + 1000 + 2000)

/* How a trainer ends. The parent turns these into the summary's figures. */
enum trainer_exit {
    TR_OK = 0,
    TR_CONTENT = 10, /* a batch's bytes, shape or dtype were wrong */
    TR_ORDER = 11,   /* a batch out of sequence, twice, missing, or not the sampler's */
    TR_FERRY = 12,   /* a ferry call failed that should not have */
    TR_LEAK = 13,    /* fds, threads, children or files left after close */
    TR_SETUP = 14,   /* the soak could not set the cycle up (not ferry's fault) */
    TR_DIED = 15,    /* the planned _exit() without close: not a failure */
    TR_HANG = 16,    /* next() blocked past NEXT_BOUND_S although timeout_ms was set */
};

/* ------------------------------------------------------------------------
 * Random plans
 */

/* splitmix64: tiny, and good enough to pick plans. */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); 0 when n is 0. The modulo bias is irrelevant here. */
static uint64_t rng_below(rng *r, uint64_t n)
{
    return n ? rng_next(r) % n : 0;
}

static int rng_percent(rng *r, unsigned pct)
{
    return rng_below(r, 100) < pct;
}

typedef enum death_how { DIE_NONE = 0, DIE_EXIT, DIE_SIGKILL } death_how;

/* Whom a SIGSTOP hits: a worker at work (the loader must time it out and
 * replace it), or the replacement of the worker just killed, caught while it
 * is still starting (it has no task, so no batch timeout covers it). */
typedef enum stop_kind { STOP_NONE = 0, STOP_RUNNING, STOP_STARTING } stop_kind;

/* Everything a cycle does, drawn by the parent before the fork so that it
 * can print the plan of a cycle that hangs. Fault points are counted in
 * batches consumed: a fault "at k" happens after k batches were taken. */
typedef struct plan {
    uint64_t cycle;
    int thread_mode;
    int workers, prefetch, batch_size;
    int n, dim, cost_us; /* cost_us < 0: not in the spec */
    int in_order, shuffle;
    int64_t shuffle_seed;
    int epochs;       /* 0: endless */
    uint64_t total;   /* batches in the stream; UINT64_MAX when endless */
    uint64_t consume; /* batches to take; == total: read to EOF */
    int nkills;
    uint64_t kill_at[2];
    stop_kind stop; /* SIGSTOP one worker at stop_at; timeout_ms is set */
    uint64_t stop_at;
    death_how death; /* the trainer vanishes at death_at without closing */
    uint64_t death_at;
    int hold_prev;         /* keep the previous batch while asking for the next */
    int hold_over_close;   /* close early with the last batch still held */
    uint64_t trainer_seed; /* the trainer's own choices: which worker to hurt */
    char spec[96];
} plan;

/* The plan of `cycle` under `seed`: a pure function of the two. Faults
 * (kills, stops) are process-mode only and at most two per cycle, so that
 * no batch can reach the loader's max_attempts (3) and be given up: under
 * the restart policy every batch must then arrive exactly once. */
static void draw_plan(plan *p, uint64_t seed, uint64_t cycle)
{
    rng r = {.s = seed ^ (cycle * 0xD1B54A32D192ED03ull)};
    rng_next(&r);
    memset(p, 0, sizeof *p);
    p->cycle = cycle;
    p->thread_mode = rng_percent(&r, 15);
    p->workers = 1 + (int)rng_below(&r, 3);
    p->prefetch = 1 + (int)rng_below(&r, 8);
    p->batch_size = 1 + (int)rng_below(&r, 64);
    p->n = 50 + (int)rng_below(&r, 1951);
    p->dim = 1 + (int)rng_below(&r, 64);
    p->cost_us = rng_percent(&r, 25) ? (int)rng_below(&r, 51) : -1;
    p->in_order = rng_percent(&r, 75);
    p->shuffle = rng_percent(&r, 70);
    p->shuffle_seed = (int64_t)rng_below(&r, (uint64_t)1 << 31);
    p->epochs = rng_percent(&r, 20) ? 0 : 1 + (int)rng_below(&r, 3);
    uint64_t bpe = ((uint64_t)p->n + (uint64_t)p->batch_size - 1) / (uint64_t)p->batch_size;
    p->total = p->epochs ? bpe * (uint64_t)p->epochs : UINT64_MAX;
    if (p->epochs && p->total <= TO_END_MAX_BATCHES && rng_percent(&r, 45))
        p->consume = p->total;
    else
        p->consume = rng_below(&r, 301);
    if (p->consume > p->total)
        p->consume = p->total;

    uint64_t span = p->consume ? p->consume : 1;
    if (!p->thread_mode) {
        if (rng_percent(&r, 30)) {
            p->nkills = 1 + rng_percent(&r, 40);
            for (int i = 0; i < p->nkills; i++)
                p->kill_at[i] = rng_below(&r, span);
        }
        if (rng_percent(&r, 12)) {
            p->stop = STOP_RUNNING;
            p->stop_at = rng_below(&r, span);
            if (p->nkills > 1)
                p->nkills = 1;
        } else if (rng_percent(&r, 7)) {
            p->stop = STOP_STARTING;
            p->nkills = 1;
            p->kill_at[0] = rng_below(&r, span);
            p->stop_at = p->kill_at[0];
        }
    }
    if (rng_percent(&r, 10)) {
        p->death = rng_percent(&r, 50) ? DIE_EXIT : DIE_SIGKILL;
        p->death_at = rng_below(&r, p->consume + 1);
    }
    p->hold_prev = rng_percent(&r, 50);
    p->hold_over_close = p->consume > 0 && p->consume < p->total && rng_percent(&r, 50);
    p->trainer_seed = rng_next(&r);
    if (p->cost_us >= 0)
        snprintf(p->spec, sizeof p->spec, "synthetic:n=%d,dim=%d,cost_us=%d", p->n, p->dim,
                 p->cost_us);
    else
        snprintf(p->spec, sizeof p->spec, "synthetic:n=%d,dim=%d", p->n, p->dim);
}

/* One line that says everything about a plan, for failure reports. */
static void describe_plan(const plan *p, char *buf, size_t cap)
{
    char consume[48], kills[64] = "", stop[48] = "", death[64] = "";
    if (p->consume == p->total)
        snprintf(consume, sizeof consume, "all %" PRIu64 " to EOF", p->total);
    else
        snprintf(consume, sizeof consume, "%" PRIu64 " then close", p->consume);
    if (p->nkills == 1)
        snprintf(kills, sizeof kills, " kill@%" PRIu64, p->kill_at[0]);
    else if (p->nkills == 2)
        snprintf(kills, sizeof kills, " kill@%" PRIu64 ",%" PRIu64, p->kill_at[0], p->kill_at[1]);
    if (p->stop)
        snprintf(stop, sizeof stop, " %s@%" PRIu64 " timeout_ms=%d",
                 p->stop == STOP_RUNNING ? "stop" : "stop-replacement", p->stop_at,
                 STOP_TIMEOUT_MS);
    if (p->death)
        snprintf(death, sizeof death, " die@%" PRIu64 "(%s)", p->death_at,
                 p->death == DIE_EXIT ? "_exit" : "SIGKILL");
    snprintf(buf, cap,
             "%s workers=%d prefetch=%d batch_size=%d dataset=%s in_order=%d shuffle=%d "
             "seed=%" PRId64 " epochs=%d consume=%s%s%s%s%s%s",
             p->thread_mode ? "thread" : "process", p->workers, p->prefetch, p->batch_size, p->spec,
             p->in_order, p->shuffle, p->shuffle_seed, p->epochs, consume, kills, stop, death,
             p->hold_prev ? " hold-prev" : "", p->hold_over_close ? " hold-over-close" : "");
}

/* ------------------------------------------------------------------------
 * Shared counters: what a trainer did, written as it goes into memory shared
 * with the parent, so the figures survive a trainer that dies on purpose.
 */

typedef struct cycle_result {
    uint64_t batches;
    uint32_t kills, stops, restarts, timeouts;
    uint32_t early_close, died, poison;
    uint32_t ready_at_close; /* stats.workers just before close */
    uint64_t close_ms;
} cycle_result;

/* ------------------------------------------------------------------------
 * Counting what a process holds
 */

/* Reads state and parent of `pid` from /proc/PID/stat; -1 if it is gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* The command name is in parentheses and may hold anything: parse after
     * the last ')'. */
    char *rp = strrchr(buf, ')');
    int pp;
    if (!rp || sscanf(rp + 1, " %c %d", state, &pp) != 2)
        return -1;
    *ppid = (pid_t)pp;
    return 0;
}

/* ------------------------------------------------------------------------
 * The trainer (the forked child of one cycle)
 */

typedef struct trainer {
    const plan *p;
    uint64_t seed; /* the soak's seed, for messages */
    const char *worker_path;
    cycle_result *res;
    rng r;
    ferry_loader *ld;
    ft_stream stream; /* the sampler's stream, and what came of it */
    uint64_t consumed;
} trainer;

static const char *const exit_names[] = {
    [TR_CONTENT] = "CONTENT", [TR_ORDER] = "ORDER", [TR_FERRY] = "FERRY ERROR",
    [TR_LEAK] = "LEAK",       [TR_SETUP] = "SETUP", [TR_HANG] = "HANG",
};

/* Reports a failure of this cycle and ends the trainer at once: _exit, so
 * nothing else runs (no leak report from a sanitizer about a loader that
 * was never closed), and the workers go by PR_SET_PDEATHSIG. */
__attribute__((format(printf, 3, 4), noreturn)) static void trainer_fail(const trainer *t, int code,
                                                                         const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "soak: cycle %" PRIu64 " (seed %" PRIu64 "): %s: %s\n", t->p->cycle, t->seed,
            exit_names[code], msg);
    _exit(code);
}

/* The watchdog of a next() that must not block forever: async-signal-safe
 * writes, then out. */
static void on_next_alarm(int sig)
{
    static const char msg[] = "soak: HANG: ferry_loader_next blocked longer than the bound "
                              "although timeout_ms is set\n";
    (void)sig;
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
        /* nothing more can be done */
    }
    _exit(TR_HANG);
}

/* Checks one batch's fields against the synthetic dataset (names, dtypes,
 * shapes, alignment, y == the index, x's bytes == the index's bytes). */
static void check_content(const trainer *t, const ferry_batch *b)
{
    char why[512];
    if (ft_check_synthetic(b, t->p->dim, why, sizeof why) != 0)
        trainer_fail(t, TR_CONTENT, "%s", why);
}

/* Checks a batch's place in the stream: the seq is the next one (in order)
 * or a new one inside the prefetch window (out of order), and epoch,
 * position, size and indices are what the sampler says for that seq. In
 * order, also that every item comes exactly once per epoch. */
static void check_sequence(trainer *t, const ferry_batch *b)
{
    char why[512];
    if (ft_stream_check(&t->stream, b, why, sizeof why) != 0)
        trainer_fail(t, TR_ORDER, "%s", why);
}

/* Worker `w`'s pid if it is alive: not 0 (being replaced) and not a zombie
 * (dead, not yet reaped by the loader); else 0. */
static int live_worker_pid(const trainer *t, uint32_t w)
{
    int pid = 0;
    if (ferry_loader_worker_pid(t->ld, w, &pid) != FERRY_OK)
        trainer_fail(t, TR_FERRY, "ferry_loader_worker_pid(%u): %s", w, ferry_last_error());
    char state;
    pid_t ppid;
    if (pid <= 0 || proc_stat(pid, &state, &ppid) != 0 || state == 'Z' || state == 'X')
        return 0;
    return pid;
}

/* SIGKILL or SIGSTOP one live worker process, starting the search at a
 * random index. Returns the worker's index and its pid in *pid, or -1 if
 * no worker was alive to take the signal. */
static int hurt_worker(trainer *t, int sig, int *pid)
{
    uint32_t first = (uint32_t)rng_below(&t->r, (uint64_t)t->p->workers);
    for (uint32_t k = 0; k < (uint32_t)t->p->workers; k++) {
        uint32_t w = (first + k) % (uint32_t)t->p->workers;
        *pid = live_worker_pid(t, w);
        if (*pid > 0 && kill(*pid, sig) == 0)
            return (int)w;
    }
    return -1;
}

/* SIGSTOPs the replacement of worker `w` (whose killed process was `old`)
 * as soon as it appears, so it is caught while starting. The loader offers
 * no event for a respawn, so this polls, every millisecond, up to
 * RESPAWN_WAIT_MS. Returns 1 if it stopped one. */
static int stop_replacement(const trainer *t, uint32_t w, int old)
{
    uint64_t deadline = ft_now_ms() + RESPAWN_WAIT_MS;
    while (ft_now_ms() < deadline) {
        int pid = live_worker_pid(t, w);
        if (pid > 0 && pid != old)
            return kill(pid, SIGSTOP) == 0;
        ft_sleep_ms(1);
    }
    return 0;
}

/* The faults planned at point `at` (batches consumed so far). A planned
 * death leaves the loader open and any held batch unreleased. */
static void inject_faults(trainer *t, uint64_t at)
{
    const plan *p = t->p;
    int killed = -1, killed_pid = 0, pid;
    for (int i = 0; i < p->nkills; i++) {
        if (p->kill_at[i] == at && (killed = hurt_worker(t, SIGKILL, &killed_pid)) >= 0)
            t->res->kills++;
    }
    if (p->stop == STOP_RUNNING && p->stop_at == at && hurt_worker(t, SIGSTOP, &pid) >= 0)
        t->res->stops++;
    if (p->stop == STOP_STARTING && p->stop_at == at && killed >= 0 &&
        stop_replacement(t, (uint32_t)killed, killed_pid))
        t->res->stops++;
    if (p->death && p->death_at == at) {
        t->res->died = 1;
        if (p->death == DIE_SIGKILL)
            raise(SIGKILL);
        _exit(TR_DIED);
    }
}

/* The config of plan p, set through one table of (option, value) pairs. */
static ferry_config *make_config(const trainer *t)
{
    const plan *p = t->p;
    const struct {
        const char *key;
        int64_t value;
    } ints[] = {
        {"workers", p->workers},
        {"prefetch", p->prefetch},
        {"batch_size", p->batch_size},
        {"in_order", p->in_order},
        {"shuffle", p->shuffle},
        {"seed", p->shuffle_seed},
        {"epochs", p->epochs},
        {"timeout_ms", p->stop ? STOP_TIMEOUT_MS : 0},
        {"start_timeout_ms", p->stop ? STOP_START_TIMEOUT_MS : 30000},
    };
    const struct {
        const char *key;
        const char *value;
    } strs[] = {
        {"dataset", p->spec},
        {"worker_mode", p->thread_mode ? "thread" : "process"},
        {"worker_path", t->worker_path},
    };
    ferry_config *cfg = ferry_config_new();
    if (!cfg)
        trainer_fail(t, TR_SETUP, "ferry_config_new: out of memory");
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ferry_config_set_int(cfg, ints[i].key, ints[i].value) != FERRY_OK)
            trainer_fail(t, TR_SETUP, "option %s: %s", ints[i].key, ferry_last_error());
    }
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        if (strs[i].value && ferry_config_set(cfg, strs[i].key, strs[i].value) != FERRY_OK)
            trainer_fail(t, TR_SETUP, "option %s: %s", strs[i].key, ferry_last_error());
    }
    return cfg;
}

/* After close: no child process (running or zombie), the same fds and
 * threads as before open, nothing in TMPDIR. What is left is listed on
 * stderr. (/dev/shm is the parent's to check, by name, across the soak.) */
static void check_no_leaks(const trainer *t, const ft_snapshot *before)
{
    char why[512];
    if (ft_leaks(before, stderr, why, sizeof why) != FT_NO_LEAK)
        trainer_fail(t, TR_LEAK, "after close: %s", why);
}

/* One cycle, in the child: open, consume with checks and faults, close,
 * check for leaks. Returns TR_OK; every failure ends the process through
 * trainer_fail(). Long because it is one trainer's life in order (plan,
 * open, the batches with their faults, close), each step checked against
 * what the plan says should happen at that point. */
static int trainer_run(trainer *t)
{
    const plan *p = t->p;
    ferry__sampler_opts so = {.batch_size = (uint64_t)p->batch_size,
                              .shuffle = p->shuffle,
                              .seed = (uint64_t)p->shuffle_seed,
                              .world_size = 1,
                              .epochs = (uint64_t)p->epochs};
    /* Any seq below consume + prefetch may come (out of order), none twice. */
    if (ft_stream_init(&t->stream, (uint64_t)p->n, &so, p->consume + (uint64_t)p->prefetch + 1) !=
        0)
        trainer_fail(t, TR_SETUP, "sampler: %s", ferry_last_error());
    t->stream.in_order = p->in_order;
    t->stream.window = (uint64_t)p->prefetch;
    t->stream.workers = (uint32_t)p->workers;
    ferry_config *cfg = make_config(t);

    ft_snapshot before;
    ft_snapshot_take(&before, getenv("TMPDIR"));
    before.nshm = -1;
    int rc = ferry_loader_open(&t->ld, cfg);
    ferry_config_free(cfg);
    if (rc != FERRY_OK)
        trainer_fail(t, TR_FERRY, "ferry_loader_open: %s: %s", ferry_err_name(rc),
                     ferry_last_error());
    uint64_t items, bpe;
    if (ferry_loader_length(t->ld, &items, &bpe) != FERRY_OK || items != (uint64_t)p->n ||
        bpe != t->stream.s.batches_per_epoch)
        trainer_fail(t, TR_ORDER,
                     "ferry_loader_length says %" PRIu64 " items, %" PRIu64 " batches per epoch",
                     items, bpe);

    ferry_batch *held = NULL;
    int cut_short = 0;
    signal(SIGALRM, on_next_alarm);
    for (;;) {
        inject_faults(t, t->consumed);
        if (t->consumed == p->consume)
            break;
        ferry_batch *b;
        /* With timeout_ms set, a batch that does not come is an error, not a
         * wait: next() must return within that plus a worker's restart. The
         * bound is loose on purpose (sanitizers, a loaded machine). */
        if (p->stop)
            alarm(NEXT_BOUND_S);
        rc = ferry_loader_next(t->ld, &b);
        alarm(0);
        if (rc == FERRY_EBATCH) {
            /* Only a batch that took down max_attempts workers may be given
             * up, and only with faults beyond the plan's (a timeout under
             * load) can that happen: then the stream has a hole, so stop. */
            ferry_stats st;
            ferry_loader_stats(t->ld, &st);
            if (t->res->kills + st.timeouts < MAX_ATTEMPTS)
                trainer_fail(t, TR_FERRY,
                             "batch %" PRIu64 " failed after %u kills, %" PRIu64 " timeouts: %s",
                             t->consumed, t->res->kills, st.timeouts, ferry_last_error());
            t->res->poison = 1;
            cut_short = 1;
            break;
        }
        if (rc == FERRY_EOF)
            trainer_fail(t, TR_ORDER, "stream ended after %" PRIu64 " batches, expected %" PRIu64,
                         t->consumed, p->total);
        if (rc != FERRY_OK)
            trainer_fail(t, TR_FERRY, "ferry_loader_next after %" PRIu64 " batches: %s: %s",
                         t->consumed, ferry_err_name(rc), ferry_last_error());
        check_sequence(t, b);
        check_content(t, b);
        t->consumed++;
        t->res->batches = t->consumed;
        ferry_batch_release(held);
        held = NULL;
        if (p->hold_prev || (p->hold_over_close && t->consumed == p->consume))
            held = b;
        else
            ferry_batch_release(b);
    }
    if (!cut_short && p->consume == p->total) {
        /* Read to the end: the stream says so, and keeps saying so. */
        for (int i = 0; i < 2; i++) {
            ferry_batch *b = NULL;
            rc = ferry_loader_next(t->ld, &b);
            if (rc != FERRY_EOF)
                trainer_fail(t, TR_ORDER, "after all %" PRIu64 " batches next() gave %s, not EOF",
                             p->total, ferry_err_name(rc));
        }
    }

    ferry_stats st;
    if (ferry_loader_stats(t->ld, &st) != FERRY_OK)
        trainer_fail(t, TR_FERRY, "ferry_loader_stats: %s", ferry_last_error());
    if (st.delivered != t->consumed + (uint64_t)t->res->poison || st.malformed != 0)
        trainer_fail(t, TR_ORDER,
                     "stats say %" PRIu64 " delivered, %" PRIu64
                     " malformed; the trainer took %" PRIu64,
                     st.delivered, st.malformed, t->consumed);
    t->res->restarts = (uint32_t)st.restarts;
    t->res->timeouts = (uint32_t)st.timeouts;
    t->res->ready_at_close = st.workers;
    t->res->early_close = p->consume < p->total || cut_short;

    /* A held batch stays valid across close: checked again after it. */
    if (held && !p->hold_over_close) {
        ferry_batch_release(held);
        held = NULL;
    }
    uint64_t t0 = ft_now_ms();
    rc = ferry_loader_close(t->ld);
    t->res->close_ms = ft_now_ms() - t0;
    t->ld = NULL;
    if (rc != FERRY_OK)
        trainer_fail(t, TR_FERRY, "ferry_loader_close: %s: %s", ferry_err_name(rc),
                     ferry_last_error());
    if (t->res->close_ms > CLOSE_BOUND_MS)
        trainer_fail(t, TR_FERRY, "ferry_loader_close took %" PRIu64 " ms, past its bound (%d ms)",
                     t->res->close_ms, CLOSE_BOUND_MS);
    if (held) {
        check_content(t, held);
        ferry_batch_release(held);
    }
    check_no_leaks(t, &before);
    ft_stream_free(&t->stream);
    return TR_OK;
}

/* ------------------------------------------------------------------------
 * The parent: options
 */

typedef struct soak_opts {
    uint64_t cycles, parallel, seed, deadline_ms, only_cycle;
    const char *worker_path;
    uint64_t json, verbose, help;
} soak_opts;

typedef enum opt_type { OPT_U64, OPT_STR, OPT_FLAG } opt_type;

typedef struct opt_def {
    const char *name;
    opt_type type;
    size_t offset;
    uint64_t min, max;
    const char *arg, *help;
} opt_def;

#define OFF(f) offsetof(soak_opts, f)
static const opt_def options[] = {
    {"--cycles", OPT_U64, OFF(cycles), 1, UINT32_MAX, "N", "cycles to run (default 300)"},
    {"--parallel", OPT_U64, OFF(parallel), 1, MAX_PARALLEL, "P", "cycles at once (default 2)"},
    {"--seed", OPT_U64, OFF(seed), 0, UINT64_MAX, "S", "plan seed (default: from the clock)"},
    {"--cycle", OPT_U64, OFF(only_cycle), 0, UINT32_MAX, "C",
     "run only cycle C of the seed (to replay a failure)"},
    {"--deadline-ms", OPT_U64, OFF(deadline_ms), 100, 3600000, "MS",
     "a cycle running longer is a hang (default 30000)"},
    {"--worker-path", OPT_STR, OFF(worker_path), 0, 0, "PATH",
     "the ferry-worker program (the loader's worker_path)"},
    {"--json", OPT_FLAG, OFF(json), 0, 0, NULL, "print the summary as JSON"},
    {"--verbose", OPT_FLAG, OFF(verbose), 0, 0, NULL,
     "print every plan, and every trainer's stderr, not only a failing one's"},
    {"--help", OPT_FLAG, OFF(help), 0, 0, NULL, "this text"},
};
#undef OFF

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-soak [options]\n"
               "Runs many loader cycles, each in its own trainer process with random options\n"
               "and injected faults, and checks that nothing hangs, leaks or goes wrong.\n");
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        char left[40];
        snprintf(left, sizeof left, "%s%s%s", options[i].name, options[i].arg ? " " : "",
                 options[i].arg ? options[i].arg : "");
        fprintf(f, "  %-20s %s\n", left, options[i].help);
    }
    fprintf(f, "Exit status: 0 when no cycle hung, leaked or failed; 1 otherwise; 2 for bad "
               "usage; 3 when interrupted.\n");
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Fills *o from argv through the options table ("--name value" or
 * "--name=value"). Returns 0, or -1 after printing what was wrong. */
static int parse_args(int argc, char **argv, soak_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const opt_def *d = NULL;
        for (size_t k = 0; k < sizeof options / sizeof options[0]; k++) {
            if (strlen(options[k].name) == len && strncmp(options[k].name, a, len) == 0)
                d = &options[k];
        }
        if (!d && strcmp(a, "-h") == 0)
            d = &options[sizeof options / sizeof options[0] - 1];
        if (!d) {
            fprintf(stderr, "ferry-soak: unknown argument '%s'\n", a);
            return -1;
        }
        char *field = (char *)o + d->offset;
        if (d->type == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "ferry-soak: %s takes no value\n", d->name);
                return -1;
            }
            *(uint64_t *)field = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (d->type == OPT_STR) {
            if (!v || !v[0]) {
                fprintf(stderr, "ferry-soak: %s needs a value\n", d->name);
                return -1;
            }
            *(const char **)field = v;
        } else if (parse_u64(v, d->min, d->max, (uint64_t *)field) != 0) {
            fprintf(stderr, "ferry-soak: %s needs a number from %" PRIu64 " to %" PRIu64 "\n",
                    d->name, d->min, d->max);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The parent: cycles in flight
 */

typedef struct slot {
    int used;
    plan p;
    pid_t pid;
    uint64_t start_ms, deadline_ms;
    int hung;
    int errfd; /* read end of the trainer's stderr, -1 when closed */
    char tmpdir[64];
    char log[LOG_TAIL]; /* the end of what the trainer wrote */
    size_t log_len;
} slot;

/* A trainer that has ended: workers it leaves behind must be gone by
 * died_ms + ORPHAN_GRACE_MS. */
typedef struct watch {
    pid_t trainer;
    uint64_t died_ms;
    uint64_t cycle;
    int had_orphans; /* some were seen alive: time how long they took */
} watch;

/* A process reparented to us that names no trainer we know (it may have
 * been caught between fork and exec): it gets the grace from first sight. */
typedef struct stray {
    pid_t pid;
    uint64_t seen_ms;
} stray;

typedef struct totals {
    uint64_t done, hangs, leaks, errors;
    uint64_t batches, kills, stops, early_closes, deaths, restarts, timeouts, poison;
    uint64_t orphans_reaped, max_close_ms, slow_closes;
    uint64_t max_orphan_ms; /* longest a worker outlived its trainer */
} totals;

typedef struct soak {
    soak_opts o;
    uint64_t first_cycle, end_cycle, next_cycle;
    slot slots[MAX_PARALLEL];
    cycle_result *shared; /* one per slot, MAP_SHARED with the trainers */
    int active;
    watch watches[MAX_PARALLEL * 4];
    int nwatches;
    stray strays[MAX_STRAYS];
    int nstrays;
    int sigfd;
    sigset_t oldmask;
    int interrupted;
    int progress; /* stderr is a terminal */
    uint64_t t0_ms, last_progress_ms;
    char **shm_before;
    size_t nshm_before;
    totals tot;
} soak;

static void clear_progress(const soak *s)
{
    if (s->progress)
        fprintf(stderr, "\r\033[K");
}

static void show_progress(soak *s, int force)
{
    uint64_t now = ft_now_ms();
    if (!s->progress || (!force && now - s->last_progress_ms < 200))
        return;
    s->last_progress_ms = now;
    fprintf(stderr,
            "\r\033[Ksoak: %" PRIu64 "/%" PRIu64 " cycles, %" PRIu64 " hangs, %" PRIu64
            " leaks, %" PRIu64 " errors; %" PRIu64 " batches; %.1f s",
            s->tot.done, s->end_cycle - s->first_cycle, s->tot.hangs, s->tot.leaks, s->tot.errors,
            s->tot.batches, (double)(now - s->t0_ms) / 1000.0);
}

/* Appends what the trainer wrote to its log tail (and, with --verbose, to
 * our stderr). Reads until the pipe is empty; closes it at EOF. */
static void drain_log(soak *s, slot *sl)
{
    char buf[4096];
    while (sl->errfd >= 0) {
        ssize_t n = read(sl->errfd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return; /* EAGAIN */
        if (n == 0) {
            close(sl->errfd);
            sl->errfd = -1;
            return;
        }
        if (s->o.verbose) {
            clear_progress(s);
            fwrite(buf, 1, (size_t)n, stderr);
        }
        size_t add = (size_t)n;
        if (sl->log_len + add > sizeof sl->log) {
            size_t drop = sl->log_len + add - sizeof sl->log;
            if (drop > sl->log_len)
                drop = sl->log_len;
            memmove(sl->log, sl->log + drop, sl->log_len - drop);
            sl->log_len -= drop;
        }
        if (add > sizeof sl->log)
            add = sizeof sl->log;
        memcpy(sl->log + sl->log_len, buf + (size_t)n - add, add);
        sl->log_len += add;
    }
}

/* The trainer a worker belongs to, from its "--parent PID" argument;
 * 0 if it has none (not a worker, or caught before exec). */
static pid_t worker_parent(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
        if (strcmp(a, "--parent") == 0 && a + strlen(a) + 1 < buf + n)
            return (pid_t)atoi(a + strlen(a) + 1);
    }
    return 0;
}

/* Calls fn(ctx, pid, state) for every process whose parent is `parent`. */
static void for_each_child(pid_t parent, void (*fn)(void *, pid_t, char), void *ctx)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        char state;
        pid_t ppid;
        if (proc_stat(pid, &state, &ppid) == 0 && ppid == parent)
            fn(ctx, pid, state);
    }
    closedir(d);
}

static void dump_worker(void *ctx, pid_t pid, char state)
{
    (void)ctx;
    (void)state;
    ft_dump_threads(stderr, pid, "worker");
}

static void print_log(const slot *sl)
{
    if (!sl->log_len)
        return;
    fprintf(stderr, "  trainer's stderr (last %zu bytes):\n", sl->log_len);
    const char *p = sl->log, *end = sl->log + sl->log_len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        fprintf(stderr, "    | %.*s\n", (int)len, p);
        p += len + (nl ? 1 : 0);
    }
}

/* The header of every failure report: what failed, the plan, and how to
 * replay it. */
__attribute__((format(printf, 4, 5))) static void report(const soak *s, const slot *sl,
                                                         const char *what, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    char desc[512];
    describe_plan(&sl->p, desc, sizeof desc);
    clear_progress(s);
    fprintf(stderr,
            "soak: cycle %" PRIu64 ": %s: %s\n  plan: %s\n  replay: ferry-soak --seed %" PRIu64
            " --cycle %" PRIu64 "%s%s\n",
            sl->p.cycle, what, detail, desc, s->o.seed, sl->p.cycle,
            s->o.worker_path ? " --worker-path " : "", s->o.worker_path ? s->o.worker_path : "");
}

/* In the child right after fork: stdout and stderr into the pipe, the
 * parent's fds and signal mask gone, then the cycle. Never returns. */
static void trainer_child(soak *s, int idx, int wfd)
{
    slot *sl = &s->slots[idx];
    dup2(wfd, STDOUT_FILENO);
    dup2(wfd, STDERR_FILENO);
    close(wfd);
    close(s->sigfd);
    for (int i = 0; i < MAX_PARALLEL; i++) {
        if (s->slots[i].used && i != idx && s->slots[i].errfd >= 0)
            close(s->slots[i].errfd);
    }
    close(sl->errfd);
    sigprocmask(SIG_SETMASK, &s->oldmask, NULL);
    /* A trainer must not outlive the soak either. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(TR_SETUP);
    setenv("TMPDIR", sl->tmpdir, 1);
    trainer t = {.p = &sl->p,
                 .seed = s->o.seed,
                 .worker_path = s->o.worker_path,
                 .res = &s->shared[idx],
                 .r = {.s = sl->p.trainer_seed}};
    int code = trainer_run(&t);
    /* exit, not _exit: a sanitizer build checks the trainer for leaks here. */
    exit(code);
}

/* Starts the next cycle in a free slot. Returns 0, or -1 when the soak
 * itself cannot go on (no fork, no temp dir). */
static int start_cycle(soak *s)
{
    int idx = 0;
    while (s->slots[idx].used)
        idx++;
    slot *sl = &s->slots[idx];
    memset(sl, 0, sizeof *sl);
    draw_plan(&sl->p, s->o.seed, s->next_cycle);
    if (ft_make_tmpdir(sl->tmpdir, sizeof sl->tmpdir, "ferry-soak") != 0) {
        fprintf(stderr, "ferry-soak: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        fprintf(stderr, "ferry-soak: pipe2: %s\n", strerror(errno));
        rmdir(sl->tmpdir);
        return -1;
    }
    sl->errfd = pfd[0];
    memset(&s->shared[idx], 0, sizeof s->shared[idx]);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ferry-soak: fork: %s\n", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        rmdir(sl->tmpdir);
        return -1;
    }
    if (pid == 0)
        trainer_child(s, idx, pfd[1]);
    close(pfd[1]);
    fcntl(sl->errfd, F_SETFL, O_NONBLOCK);
    sl->used = 1;
    sl->pid = pid;
    sl->start_ms = ft_now_ms();
    sl->deadline_ms = sl->start_ms + s->o.deadline_ms;
    if (s->o.verbose) {
        char desc[512];
        describe_plan(&sl->p, desc, sizeof desc);
        clear_progress(s);
        fprintf(stderr, "soak: cycle %" PRIu64 " (pid %d): %s\n", sl->p.cycle, (int)pid, desc);
    }
    s->active++;
    s->next_cycle++;
    return 0;
}

/* Frees the slot of a trainer that has ended: its pipe closed, its place
 * open for the next cycle. */
static void release_slot(soak *s, slot *sl)
{
    if (sl->errfd >= 0)
        close(sl->errfd);
    sl->errfd = -1;
    sl->used = 0;
    s->active--;
}

/* Judges a trainer that has ended with wait status `status`: its exit code
 * against its plan, its TMPDIR; then adds its figures and starts watching
 * for workers it left behind. Long because each way a cycle can end (by
 * plan or not) is judged here, in one place, against one table of
 * outcomes. */
static void finish_cycle(soak *s, slot *sl, int status)
{
    cycle_result *res = &s->shared[sl - s->slots];
    const plan *p = &sl->p;
    drain_log(s, sl);
    int died_as_planned =
        res->died &&
        ((p->death == DIE_EXIT && WIFEXITED(status) && WEXITSTATUS(status) == TR_DIED) ||
         (p->death == DIE_SIGKILL && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    int clean = WIFEXITED(status) && WEXITSTATUS(status) == TR_OK;
    if (sl->hung < 0) {
        /* Stopped by us on SIGINT: neither judged nor counted. */
        ft_remove_tree(sl->tmpdir); /* best effort */
        release_slot(s, sl);
        return;
    }
    if (sl->hung) {
        s->tot.hangs++;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == TR_HANG) {
        s->tot.hangs++;
        report(s, sl, "HANG",
               "ferry_loader_next blocked over %d s with timeout_ms %d set "
               "(%" PRIu64 " batches in)",
               NEXT_BOUND_S, STOP_TIMEOUT_MS, res->batches);
        print_log(sl);
    } else if (died_as_planned) {
        s->tot.deaths++;
    } else if (!clean) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == TR_LEAK)
            s->tot.leaks++;
        else
            s->tot.errors++;
        const char *what = code >= TR_CONTENT && code <= TR_SETUP ? exit_names[code] : "CRASH";
        if (WIFSIGNALED(status))
            report(s, sl, what, "trainer killed by signal %d (%s)", WTERMSIG(status),
                   strsignal(WTERMSIG(status)));
        else
            report(s, sl, what, "trainer exited with code %d%s", code,
                   code == 1 || code == 23 ? " (a sanitizer report?)" : "");
        print_log(sl);
    }

    /* The loader's private directory lives in TMPDIR: after a clean close it
     * must be gone. A trainer that never closed cannot have removed it. */
    int left = ft_count_entries(sl->tmpdir);
    if (clean && left > 0) {
        s->tot.leaks++;
        report(s, sl, "LEAK", "%d entries left in the cycle's TMPDIR %s", left, sl->tmpdir);
        ft_list_entries(stderr, sl->tmpdir, 0);
    }
    ft_remove_tree(sl->tmpdir); /* best effort */

    s->tot.done++;
    s->tot.batches += res->batches;
    s->tot.kills += res->kills;
    s->tot.stops += res->stops;
    s->tot.restarts += res->restarts;
    s->tot.timeouts += res->timeouts;
    s->tot.poison += res->poison;
    if (clean) {
        s->tot.early_closes += res->early_close;
        if (res->close_ms > s->tot.max_close_ms)
            s->tot.max_close_ms = res->close_ms;
        /* Close is bounded by design (grace, SIGTERM, SIGKILL), so a slow one
         * is no hang; but with every worker able to answer STOP it should be
         * quick, and a slow one points at a worker that was never told to
         * stop. Reported, not failed. */
        if (!p->stop && res->close_ms >= SLOW_CLOSE_MS &&
            ++s->tot.slow_closes <= SLOW_CLOSE_REPORTS) {
            report(s, sl, "SLOW CLOSE (warning)",
                   "ferry_loader_close took %" PRIu64
                   " ms with no worker stopped (%u restarts; %u of %d workers ready just "
                   "before close)",
                   res->close_ms, res->restarts, res->ready_at_close, p->workers);
        }
    }
    if (s->nwatches < (int)(sizeof s->watches / sizeof s->watches[0]))
        s->watches[s->nwatches++] =
            (watch){.trainer = sl->pid, .died_ms = ft_now_ms(), .cycle = p->cycle};
    release_slot(s, sl);
}

/* Reaps every child that has ended: trainers (judged) and workers of dead
 * trainers reparented to us (just counted: they died, as they should). */
static void reap_children(soak *s)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        slot *sl = NULL;
        for (int i = 0; i < MAX_PARALLEL; i++) {
            if (s->slots[i].used && s->slots[i].pid == pid)
                sl = &s->slots[i];
        }
        if (sl)
            finish_cycle(s, sl, status);
        else
            s->tot.orphans_reaped++;
    }
}

/* A trainer past its deadline is a hang: report it with what its threads
 * and workers are doing, then kill it (its workers follow by
 * PR_SET_PDEATHSIG, and the orphan watch checks that they do). */
static void check_deadlines(soak *s)
{
    uint64_t now = ft_now_ms();
    for (int i = 0; i < MAX_PARALLEL; i++) {
        slot *sl = &s->slots[i];
        if (!sl->used || sl->hung || now < sl->deadline_ms)
            continue;
        sl->hung = 1;
        drain_log(s, sl);
        report(s, sl, "HANG",
               "trainer %d still running after %" PRIu64 " ms, %" PRIu64 " batches in",
               (int)sl->pid, now - sl->start_ms, s->shared[i].batches);
        ft_dump_threads(stderr, sl->pid, "trainer");
        for_each_child(sl->pid, dump_worker, NULL);
        print_log(sl);
        kill(sl->pid, SIGKILL);
    }
}

typedef struct orphan_scan {
    soak *s;
    uint64_t now;
    int live[MAX_PARALLEL * 4]; /* per watch: orphans still alive */
} orphan_scan;

/* Reports, kills and waits for a leaked process (it is our child now, so
 * its pidfd says when it is dead), so that the next scan does not count
 * it again. */
static void leak_orphan(soak *s, pid_t pid, const char *whose)
{
    s->tot.leaks++;
    clear_progress(s);
    fprintf(stderr,
            "soak: LEAK: process %d (%s) still alive %d ms after its trainer ended; "
            "killing it\n",
            (int)pid, whose, ORPHAN_GRACE_MS);
    ft_dump_threads(stderr, pid, "orphan");
    kill(pid, SIGKILL);
    ft_wait_gone((int)pid, 1000);
}

/* One process reparented to us. A zombie is dead (reap_children takes it);
 * a running trainer is ours; anything else is a worker (or a process caught
 * between fork and exec) whose trainer ended. */
static void check_orphan(void *ctx, pid_t pid, char state)
{
    orphan_scan *sc = ctx;
    soak *s = sc->s;
    if (state == 'Z' || state == 'X')
        return;
    for (int i = 0; i < MAX_PARALLEL; i++) {
        if (s->slots[i].used && s->slots[i].pid == pid)
            return;
    }
    /* Only the soak stops processes. One stopped before it ran
     * PR_SET_PDEATHSIG (a replacement caught while starting) can act on
     * nothing, not even its trainer's death: let it go, and from then on it
     * must notice on its own (its getppid() check) within the grace. */
    if (state == 'T' || state == 't')
        kill(pid, SIGCONT);
    pid_t owner = worker_parent(pid);
    for (int w = 0; w < s->nwatches; w++) {
        if (s->watches[w].trainer != owner)
            continue;
        sc->live[w]++;
        if (sc->now >= s->watches[w].died_ms + ORPHAN_GRACE_MS) {
            char whose[96];
            snprintf(whose, sizeof whose, "worker of cycle %" PRIu64 "'s trainer %d",
                     s->watches[w].cycle, (int)owner);
            leak_orphan(s, pid, whose);
        }
        return;
    }
    for (int k = 0; k < s->nstrays; k++) {
        if (s->strays[k].pid != pid)
            continue;
        if (sc->now >= s->strays[k].seen_ms + ORPHAN_GRACE_MS)
            leak_orphan(s, pid, "no known trainer");
        else
            s->strays[k].pid = -pid; /* seen alive in this scan: keep it */
        return;
    }
    if (s->nstrays < MAX_STRAYS)
        s->strays[s->nstrays++] = (stray){.pid = -pid, .seen_ms = sc->now};
}

/* Looks for workers left behind by ended trainers. A watch ends once no
 * process of its trainer is alive; strays not seen in this scan are gone. */
static void scan_orphans(soak *s)
{
    if (!s->nwatches && !s->nstrays)
        return;
    orphan_scan sc = {.s = s, .now = ft_now_ms()};
    for_each_child(getpid(), check_orphan, &sc);
    int keep = 0;
    for (int w = 0; w < s->nwatches; w++) {
        watch *wa = &s->watches[w];
        if (sc.live[w]) {
            wa->had_orphans = 1;
            s->watches[keep++] = *wa;
        } else if (wa->had_orphans && sc.now - wa->died_ms > s->tot.max_orphan_ms) {
            s->tot.max_orphan_ms = sc.now - wa->died_ms;
        }
    }
    s->nwatches = keep;
    keep = 0;
    for (int k = 0; k < s->nstrays; k++) {
        if (s->strays[k].pid < 0) {
            s->strays[keep] = s->strays[k];
            s->strays[keep++].pid = -s->strays[k].pid;
        }
    }
    s->nstrays = keep;
}

/* Waits for the next thing to do: a child ended (SIGCHLD), output from a
 * trainer, SIGINT/SIGTERM, or the next deadline, orphan scan or progress
 * tick. */
static void wait_events(soak *s)
{
    uint64_t now = ft_now_ms();
    uint64_t wake = now + 1000;
    if (s->progress && wake > now + 200)
        wake = now + 200;
    if ((s->nwatches || s->nstrays) && wake > now + 20)
        wake = now + 20; /* orphans are polled: /proc sends no events */
    struct pollfd pfds[1 + MAX_PARALLEL];
    slot *owner[1 + MAX_PARALLEL];
    int n = 0;
    pfds[n++] = (struct pollfd){.fd = s->sigfd, .events = POLLIN};
    for (int i = 0; i < MAX_PARALLEL; i++) {
        slot *sl = &s->slots[i];
        if (!sl->used)
            continue;
        if (sl->deadline_ms < wake)
            wake = sl->deadline_ms;
        if (sl->errfd >= 0) {
            owner[n] = sl;
            pfds[n++] = (struct pollfd){.fd = sl->errfd, .events = POLLIN};
        }
    }
    int timeout = wake > now ? (int)(wake - now) : 0;
    if (poll(pfds, (nfds_t)n, timeout) <= 0)
        return;
    if (pfds[0].revents & POLLIN) {
        struct signalfd_siginfo si;
        while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
            if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM)
                s->interrupted = 1;
        }
    }
    for (int i = 1; i < n; i++) {
        if (pfds[i].revents)
            drain_log(s, owner[i]);
    }
}

/* ------------------------------------------------------------------------
 * The parent: /dev/shm and the summary
 */

/* The names in /dev/shm that start with "ferry", in a NULL-terminated
 * array the caller frees with free_names(). */
static char **ferry_shm_names(size_t *count)
{
    size_t n = 0, cap = 8;
    char **names = calloc(cap + 1, sizeof *names);
    DIR *d = opendir("/dev/shm");
    if (d && names) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, "ferry", 5) != 0)
                continue;
            if (n == cap) {
                char **more = realloc(names, (cap * 2 + 1) * sizeof *names);
                if (!more)
                    break;
                names = more;
                cap *= 2;
            }
            names[n] = strdup(e->d_name);
            if (names[n])
                names[++n] = NULL;
        }
    }
    if (d)
        closedir(d);
    *count = n;
    return names;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

/* Counts as leaks the ferry entries in /dev/shm that were not there when
 * the soak started. Other ferry processes on the machine could make one
 * too; the names are printed so that can be told apart. */
static void check_shm(soak *s)
{
    size_t n;
    char **now = ferry_shm_names(&n);
    for (size_t i = 0; now && i < n; i++) {
        int old = 0;
        for (size_t k = 0; k < s->nshm_before; k++)
            old |= strcmp(now[i], s->shm_before[k]) == 0;
        if (!old) {
            s->tot.leaks++;
            fprintf(stderr, "soak: LEAK: /dev/shm/%s appeared during the soak\n", now[i]);
        }
    }
    free_names(now, n);
}

static void print_summary(const soak *s, double secs)
{
    const totals *t = &s->tot;
    if (s->o.json) {
        printf(
            "{\"seed\": %" PRIu64 ", \"cycles\": %" PRIu64 ", \"planned\": %" PRIu64
            ", \"interrupted\": %s, \"hangs\": %" PRIu64 ", \"leaks\": %" PRIu64
            ", \"errors\": %" PRIu64 ", \"batches\": %" PRIu64 ", \"worker_kills\": %" PRIu64
            ", \"stops\": %" PRIu64 ", \"early_closes\": %" PRIu64 ", \"trainer_deaths\": %" PRIu64
            ", \"restarts\": %" PRIu64 ", \"timeouts\": %" PRIu64 ", \"poisoned\": %" PRIu64
            ", \"orphans_reaped\": %" PRIu64 ", \"max_close_ms\": %" PRIu64
            ", \"slow_closes\": %" PRIu64 ", \"max_orphan_ms\": %" PRIu64 ", \"seconds\": %.1f}\n",
            s->o.seed, t->done, s->end_cycle - s->first_cycle, s->interrupted ? "true" : "false",
            t->hangs, t->leaks, t->errors, t->batches, t->kills, t->stops, t->early_closes,
            t->deaths, t->restarts, t->timeouts, t->poison, t->orphans_reaped, t->max_close_ms,
            t->slow_closes, t->max_orphan_ms, secs);
        return;
    }
    printf("soak: %" PRIu64 " cycles, %" PRIu64 " hangs, %" PRIu64 " leaks, %" PRIu64
           " errors; %" PRIu64 " batches, %" PRIu64 " worker kills, %" PRIu64 " stops, %" PRIu64
           " early closes, %" PRIu64 " trainer deaths; %.1f s%s\n",
           t->done, t->hangs, t->leaks, t->errors, t->batches, t->kills, t->stops, t->early_closes,
           t->deaths, secs, s->interrupted ? " (interrupted)" : "");
    printf("soak: seed %" PRIu64 "; %" PRIu64 " restarts, %" PRIu64 " timeouts, %" PRIu64
           " poisoned batches; %" PRIu64 " orphaned workers reaped, the slowest gone %" PRIu64
           " ms after its trainer; slowest close %" PRIu64 " ms, %" PRIu64
           " slow closes (warnings)\n",
           s->o.seed, t->restarts, t->timeouts, t->poison, t->orphans_reaped, t->max_orphan_ms,
           t->max_close_ms, t->slow_closes);
}

/* ------------------------------------------------------------------------
 * main
 */

/* Subreaper, signals on a signalfd, shared counters, /dev/shm snapshot.
 * Returns 0, or -1 with a message printed. */
static int setup(soak *s)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        fprintf(stderr, "ferry-soak: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
        return -1;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigprocmask(SIG_BLOCK, &mask, &s->oldmask);
    s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (s->sigfd < 0) {
        fprintf(stderr, "ferry-soak: signalfd: %s\n", strerror(errno));
        return -1;
    }
    s->shared = mmap(NULL, MAX_PARALLEL * sizeof *s->shared, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s->shared == MAP_FAILED) {
        fprintf(stderr, "ferry-soak: mmap: %s\n", strerror(errno));
        return -1;
    }
    for (int i = 0; i < MAX_PARALLEL; i++)
        s->slots[i].errfd = -1;
    s->shm_before = ferry_shm_names(&s->nshm_before);
    return 0;
}

int main(int argc, char **argv)
{
    static soak s; /* big (log tails): not on the stack */
    s.o = (soak_opts){.cycles = 300,
                      .parallel = 2,
                      .deadline_ms = 30000,
                      .only_cycle = UINT64_MAX,
                      .seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)};
    if (parse_args(argc, argv, &s.o) != 0) {
        usage(stderr);
        return 2;
    }
    if (s.o.help) {
        usage(stdout);
        return 0;
    }
    s.first_cycle = s.o.only_cycle != UINT64_MAX ? s.o.only_cycle : 0;
    s.end_cycle = s.o.only_cycle != UINT64_MAX ? s.o.only_cycle + 1 : s.o.cycles;
    s.next_cycle = s.first_cycle;
    s.progress = isatty(STDERR_FILENO);
    if (setup(&s) != 0)
        return 1;
    if (!s.o.json)
        printf("soak: seed %" PRIu64 ", cycles %" PRIu64 "..%" PRIu64 ", %" PRIu64
               " at a time, deadline %" PRIu64 " ms\n",
               s.o.seed, s.first_cycle, s.end_cycle - 1, s.o.parallel, s.o.deadline_ms);
    fflush(stdout);
    s.t0_ms = ft_now_ms();

    int broken = 0;
    while (s.active || s.nwatches || s.nstrays ||
           (!s.interrupted && !broken && s.next_cycle < s.end_cycle)) {
        while (!s.interrupted && !broken && (uint64_t)s.active < s.o.parallel &&
               s.next_cycle < s.end_cycle) {
            if (start_cycle(&s) != 0)
                broken = 1;
        }
        wait_events(&s);
        if (s.interrupted) {
            for (int i = 0; i < MAX_PARALLEL; i++) {
                if (s.slots[i].used && !s.slots[i].hung) {
                    s.slots[i].hung = -1; /* not a hang: we stop it */
                    kill(s.slots[i].pid, SIGKILL);
                }
            }
        }
        reap_children(&s);
        check_deadlines(&s);
        scan_orphans(&s);
        show_progress(&s, 0);
    }
    /* Cycles we stopped on SIGINT are not hangs. */
    check_shm(&s);
    clear_progress(&s);
    print_summary(&s, (double)(ft_now_ms() - s.t0_ms) / 1000.0);
    free_names(s.shm_before, s.nshm_before);
    if (s.interrupted || broken)
        return 3;
    return s.tot.hangs || s.tot.leaks || s.tot.errors ? 1 : 0;
}
