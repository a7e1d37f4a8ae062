/*
 * ferry-bench - run a loader over a dataset and measure what a trainer
 * feels: how long it waits in next() for each batch.
 *
 * This file reads the command line, decides which runs to make and in
 * which order, and hands their records to the figures and the reports
 * (tools/bench/: run.c makes one run, figures.c turns it into figures,
 * report.c prints them; bench.h says how they fit).
 *
 * Runs come in rounds. A plain invocation is one round of one side: ferry
 * as configured. --compare adds a second side, a baseline with PyTorch's
 * DataLoader schedule (persistent workers): the loader's epoch_barrier,
 * which requests nothing of the next epoch until the trainer asks for its
 * first batch, and a window of prefetch_factor x workers batches, which
 * is what that DataLoader then requests at once. The sides alternate,
 * A B A B ..., for --rounds rounds (5), so that a noisy machine hurts both
 * alike; the report has each side's medians and the ratio per round, its
 * median and its spread.
 *
 * --limits measures ferry against two ceilings in the same rounds, the
 * one-copy limit and a raw ZeroMQ round trip (tools/bench/limits.c).
 *
 * --compare-remote does the same with three sides: --workers local worker
 * processes over ipc://, then as many ferry-worker daemons that this
 * program starts on 127.0.0.1 over TCP with CURVE (keys made with
 * ferry-keygen in a private directory), then over plain TCP.
 *
 * Remote workers started separately: --bind tcp://HOST:PORT (with
 * --curve-key/--curve-allow, or --insecure) makes the loader wait for
 * --min-workers of them (docs/remote.md).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
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
#include <unistd.h>

#include "bench/bench.h"
#include "bench/relay.h"
#include "ferry.h"

extern char **environ;

/* ------------------------------------------------------------------------
 * Remote workers for --compare-remote
 */

typedef struct remote_ctx {
    char dir[64]; /* the private key directory; "" when none was made */
    char worker[PATH_MAX + 32], pub[PATH_MAX + 8], key[PATH_MAX + 8], allow[PATH_MAX + 8];
    long n;
} remote_ctx;

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

static void remote_cleanup(remote_ctx *x)
{
    if (!x->dir[0])
        return;
    char p[PATH_MAX + 64];
    const char *names[] = {"loader.key", "loader.pub"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", x->dir, names[i]);
        unlink(p);
    }
    for (long i = 0; i < x->n; i++) {
        snprintf(p, sizeof p, "%s/allow/w%ld.key", x->dir, i);
        unlink(p);
        snprintf(p, sizeof p, "%s/allow/w%ld.pub", x->dir, i);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/allow", x->dir);
    rmdir(p);
    rmdir(x->dir);
    x->dir[0] = '\0';
}

/* Makes throw-away keys for the loader and n workers. 0, or 1 after
 * saying why (nothing is left behind then). */
static int remote_setup(const bench_opts *o, remote_ctx *x)
{
    char bin[PATH_MAX], keygen[PATH_MAX + 32], base[PATH_MAX + 32];
    memset(x, 0, sizeof *x);
    x->n = o->workers > 0 ? o->workers : 1;
    if (own_dir(bin, sizeof bin) != 0) {
        fprintf(stderr, "ferry-bench: cannot find my own directory\n");
        return 1;
    }
    if (o->worker_path)
        snprintf(x->worker, sizeof x->worker, "%s", o->worker_path);
    else
        snprintf(x->worker, sizeof x->worker, "%s/ferry-worker", bin);
    snprintf(keygen, sizeof keygen, "%s/ferry-keygen", bin);
    snprintf(x->dir, sizeof x->dir, "/tmp/ferry-bench-keys-XXXXXX");
    if (!mkdtemp(x->dir)) {
        fprintf(stderr, "ferry-bench: mkdtemp: %s\n", strerror(errno));
        x->dir[0] = '\0';
        return 1;
    }
    snprintf(x->allow, sizeof x->allow, "%s/allow", x->dir);
    snprintf(x->pub, sizeof x->pub, "%s/loader.pub", x->dir);
    snprintf(x->key, sizeof x->key, "%s/loader.key", x->dir);
    int ok = mkdir(x->allow, 0700) == 0;
    snprintf(base, sizeof base, "%s/loader", x->dir);
    char *kg[] = {keygen, base, NULL};
    ok = ok && run_and_wait(kg) == 0;
    for (long i = 0; ok && i < x->n; i++) {
        snprintf(base, sizeof base, "%s/allow/w%ld", x->dir, i);
        ok = run_and_wait(kg) == 0;
    }
    if (!ok) {
        fprintf(stderr, "ferry-bench: could not make keys with %s\n", keygen);
        remote_cleanup(x);
        return 1;
    }
    return 0;
}

/* One run of a remote side: x->n daemons started on a fresh port, the run,
 * the daemons stopped and reaped. */
/* With --rtt-ms: relays on 127.0.0.2 at the loader's ports (the bind
 * port, and the data port, which a worker reaches at the host it used for
 * the first), half the round trip each way. 0, or 1 after saying why (none
 * left running). */
static int start_relays(const bench_opts *o, int port, int data_port, bench_relay *relays[2])
{
    unsigned delay_us = (unsigned)(o->rtt_ms * 1000 / 2);
    relays[0] = relays[1] = NULL;
    if (bench_relay_start(&relays[0], "127.0.0.2", port, "127.0.0.1", port, delay_us) == 0 &&
        bench_relay_start(&relays[1], "127.0.0.2", data_port, "127.0.0.1", data_port, delay_us) ==
            0)
        return 0;
    fprintf(stderr, "ferry-bench: --rtt-ms: cannot start a relay on 127.0.0.2: %s\n",
            strerror(errno));
    bench_relay_stop(relays[0]);
    return 1;
}

static int run_remote(const bench_opts *o, const bench_side *s, remote_ctx *x, bench_progress *p,
                      bench_run *r)
{
    int plain = s->remote != BENCH_REMOTE_CURVE;
    int port = free_port(), data_port = free_port();
    char ep[64], worker_ep[64], wkey[PATH_MAX + 8], data_set[32];
    bench_relay *relays[2] = {NULL, NULL};
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    snprintf(worker_ep, sizeof worker_ep, "tcp://%s:%d", o->rtt_ms > 0 ? "127.0.0.2" : "127.0.0.1",
             port);
    memset(r, 0, sizeof *r);
    if (o->rtt_ms > 0 && start_relays(o, port, data_port, relays) != 0)
        return 1;
    pid_t *pids = calloc((size_t)x->n, sizeof *pids);
    if (!pids) {
        bench_relay_stop(relays[0]);
        bench_relay_stop(relays[1]);
        fprintf(stderr, "ferry-bench: out of memory\n");
        return 1;
    }
    for (long i = 0; i < x->n; i++) {
        snprintf(wkey, sizeof wkey, "%s/allow/w%ld.key", x->dir, i);
        char *curve[] = {x->worker, "--connect", worker_ep, "--key", wkey, "--server-key", x->pub,
                         NULL};
        char *insecure[] = {x->worker, "--connect", worker_ep, "--insecure", NULL};
        pids[i] = spawn(plain ? insecure : curve, plain);
    }
    bench_opts ro = *o;
    /* The relay stands at the data port's number too: fix it. */
    snprintf(data_set, sizeof data_set, "data_port=%d", data_port);
    if (o->rtt_ms > 0)
        ro.set[ro.nset++] = data_set;
    for (int i = 0; s->remote == BENCH_REMOTE_TUNED && i < o->ntuned; i++)
        ro.set[ro.nset++] = o->tuned[i];
    ro.bind = ep;
    ro.workers = 0;
    ro.min_workers = x->n;
    ro.curve_key = x->key;
    ro.curve_allow = x->allow;
    ro.insecure = plain;
    int rc = bench_run_once(&ro, s, p, r);
    for (long i = 0; i < x->n; i++) {
        if (pids[i] > 0) {
            kill(pids[i], SIGTERM);
            waitpid(pids[i], NULL, 0);
        }
    }
    free(pids);
    bench_relay_stop(relays[0]);
    bench_relay_stop(relays[1]);
    return rc;
}

/* ------------------------------------------------------------------------
 * Rounds
 */

/* Where the CSV goes: --csv, or a temporary file that only --plot reads. */
typedef struct csv_out {
    FILE *f;
    char path[4096];
    int temporary;
} csv_out;

static int csv_open(const bench_opts *o, csv_out *c)
{
    memset(c, 0, sizeof *c);
    if (o->csv) {
        snprintf(c->path, sizeof c->path, "%s", o->csv);
        c->f = fopen(o->csv, "w");
    } else if (o->plot) {
        const char *tmp = getenv("TMPDIR");
        snprintf(c->path, sizeof c->path, "%s/ferry-bench-csv-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        int fd = mkstemp(c->path);
        c->f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (fd >= 0 && !c->f)
            close(fd);
        c->temporary = 1;
    } else {
        return 0;
    }
    if (!c->f) {
        fprintf(stderr, "ferry-bench: cannot write %s: %s\n", c->path, strerror(errno));
        if (c->temporary)
            unlink(c->path);
        return 1;
    }
    return 0;
}

/* 0 if --plot's file can be written (its folder exists and lets us make
 * it, or it exists and is writable), checked before any run as the CSV is,
 * so that a bad path costs no run; else says why and returns 1. Leaves no
 * file behind: the PNG is only made when gnuplot draws it. */
static int plot_check(const bench_opts *o)
{
    if (!o->plot)
        return 0;
    int fd = open(o->plot, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(o->plot);
        return 0;
    }
    if (errno == EEXIST && (fd = open(o->plot, O_WRONLY | O_CLOEXEC)) >= 0) {
        close(fd);
        return 0;
    }
    fprintf(stderr, "ferry-bench: cannot write %s: %s\n", o->plot, strerror(errno));
    return 1;
}

/* Closes the CSV; 1 if a write failed. */
static int csv_close(csv_out *c)
{
    if (!c->f)
        return 0;
    int err = ferror(c->f) | (fclose(c->f) != 0);
    c->f = NULL;
    if (err)
        fprintf(stderr, "ferry-bench: writing %s failed\n", c->path);
    return err;
}

/* Runs the sides alternating for o->rounds rounds, then reports. The exit
 * code: 0, or 1 when a run, the CSV or the plot failed. Long because it is
 * one sequence: the runs in their order, the figures, the outputs. */
static int run_rounds(const bench_opts *o, const bench_side *sides, size_t nsides, remote_ctx *x)
{
    size_t rounds = (size_t)o->rounds;
    int labelled = nsides > 1 || rounds > 1;
    bench_fig *figs = calloc(rounds * nsides, sizeof *figs);
    bench_summary per_side[BENCH_MAX_SIDES], ratios[BENCH_MAX_SIDES];
    ferry_stats side_stats[BENCH_MAX_SIDES] = {0};
    bench_run last = {0};
    csv_out csv;
    if (!figs) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        return 1;
    }
    if (plot_check(o) != 0 || csv_open(o, &csv) != 0) {
        free(figs);
        return 1;
    }
    if (csv.f)
        bench_csv_header(csv.f, labelled);

    bench_progress prog = {.on = o->progress && !o->json && isatty(2),
                           .runs = (unsigned)(rounds * nsides)};
    int rc = 0;
    for (size_t r = 0; r < rounds && rc == 0; r++) {
        for (size_t k = 0; k < nsides && rc == 0; k++) {
            const bench_side *s = &sides[k];
            bench_run run;
            snprintf(prog.label, sizeof prog.label, "%s %zu/%zu", s->name, r + 1, rounds);
            rc = s->remote == BENCH_LOCAL ? bench_run_once(o, s, &prog, &run)
                                          : run_remote(o, s, x, &prog, &run);
            if (rc == 0) {
                bench_figures(o, &run, &figs[r * nsides + k]);
                if (csv.f)
                    bench_csv_rows(csv.f, &run, labelled, r + 1, s->name);
                side_stats[k] = run.stats;
            }
            bench_run_free(&run);
            if (k == 0)
                last = run;
        }
    }
    rc |= csv_close(&csv);
    if (rc == 0) {
        for (size_t k = 0; k < nsides; k++) {
            bench_fig *side = calloc(rounds, sizeof *side), *ratio = calloc(rounds, sizeof *ratio);
            for (size_t r = 0; side && ratio && r < rounds; r++) {
                side[r] = figs[r * nsides + k];
                bench_ratio(&figs[r * nsides], &figs[r * nsides + k], &ratio[r]);
            }
            if (!side || !ratio) {
                fprintf(stderr, "ferry-bench: out of memory\n");
                rc = 1;
            } else {
                bench_summarize(side, rounds, &per_side[k]);
                bench_summarize(ratio, rounds, &ratios[k]);
            }
            free(side);
            free(ratio);
        }
    }
    if (rc == 0) {
        bench_report rep = {.o = o,
                            .sides = sides,
                            .nsides = nsides,
                            .rounds = rounds,
                            .labelled = labelled,
                            .batches_per_epoch = last.batches_per_epoch,
                            .figs = figs,
                            .per_side = per_side,
                            .ratios = ratios,
                            .last = &last,
                            .side_stats = side_stats};
        if (o->json)
            bench_print_json(&rep, stdout);
        else
            bench_print_text(&rep, stdout);
        fflush(stdout);
        if (o->plot)
            rc = bench_plot(&rep, csv.path, o->plot);
    }
    if (csv.temporary)
        unlink(csv.path);
    free(figs);
    return rc;
}

/* ------------------------------------------------------------------------
 * The command line
 */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry-bench [options]\n"
            "Runs a loader as a trainer would: waits in next() for each batch, reads it, runs\n"
            "a simulated step; reports the waits (p50/p99/max, steady and at epoch starts),\n"
            "startup, throughput, the share of the step-bound rate and peak memory.\n"
            "\n"
            "  --dataset SPEC        dataset (default synthetic:n=60000,dim=784, MNIST-sized)\n"
            "  --workers N           workers (default 2)\n"
            "  --threads             workers are threads, not processes\n"
            "  --batch-size N        items per batch (default 256)\n"
            "  --epochs N            epochs to run (default 10)\n"
            "  --batches N           run N batches instead of whole epochs\n"
            "  --prefetch N          batches in flight (default: auto, 2 x credits x workers)\n"
            "  --seed N              shuffle with this seed\n"
            "  --out-of-order        deliver batches as they complete\n"
            "  --step-ms MS          a simulated training step after each batch (default 0;\n"
            "                        fractions allowed, e.g. 0.5)\n"
            "  --step spin|sleep     the step busy-spins a core (default) or sleeps\n"
            "  --epoch-barrier       the loader's epoch_barrier: nothing of epoch e+1 is\n"
            "                        requested until the trainer asks for its first batch\n"
            "  --compare [N]         A = ferry as configured, B = PyTorch's DataLoader schedule\n"
            "                        with persistent workers (epoch_barrier, and a window of\n"
            "                        prefetch_factor x workers batches, all requested at once\n"
            "                        when an epoch starts), alternating A B A B ... for N rounds\n"
            "                        (default 5); reports medians and the ratio per round\n"
            "  --compare-mix SPEC    A = the dataset as one source, B = the same items as the\n"
            "                        sources of a mix (the option mix: SIZES;0:WEIGHTS..., the\n"
            "                        sizes adding up to the dataset's length), drawn by weight;\n"
            "                        both shuffled (--seed, else seed 1), alternating\n"
            "  --compare-resume W    A = a fresh loader as configured, B = the same resumed from\n"
            "                        the state rank 0 of a W-rank job saved a third into its\n"
            "                        first epoch (another shape: its rest is re-dealt), alternating;\n"
            "                        startup is the time to the first batch\n"
            "  --rounds N            rounds of each side (default 1; 5 with a comparison)\n"
            "  --prefetch-factor N   the baseline's batches in flight per worker (default 2,\n"
            "                        as PyTorch's DataLoader)\n"
            "  --csv FILE            one row per batch: seq, epoch, batch_in_epoch, worker,\n"
            "                        wait_us, make_us, flight_us, ready_us, attempts (with\n"
            "                        round and side first when there are several runs)\n"
            "  --plot FILE.png       the wait per batch across epochs, drawn by gnuplot\n"
            "                        (Debian package gnuplot-nox) from the CSV\n"
            "  --worker-path PATH    the ferry-worker program\n"
            "  --no-shm              local process workers send batches as messages, not\n"
            "                        through shared memory (the loader's option shm=0)\n"
            "  --set KEY=VALUE       any loader option (docs/options.md), set after the\n"
            "                        others on every side: credits=4, heartbeat_ms=500,\n"
            "                        max_remote=32, data_port=5556, ... (repeatable)\n"
            "  --bind ENDPOINT       also take remote workers at tcp://HOST:PORT\n"
            "  --min-workers N       workers to wait for before the first batch\n"
            "  --curve-key FILE      the loader's key pair (ferry-keygen)\n"
            "  --curve-allow PATH    allowed worker keys (file, or directory of .pub files)\n"
            "  --insecure            plain TCP for --bind (trusted networks only)\n"
            "  --io-threads N        the loader's ZeroMQ I/O threads (its io_threads option;\n"
            "                        default 0: auto, min(CPUs, 4) with --bind, else 1)\n"
            "  --compare-remote [N]  --workers local processes, then as many remote ones over\n"
            "                        TCP+CURVE, then plain TCP, on 127.0.0.1, alternating for\n"
            "                        N rounds (default 5)\n"
            "  --rtt-ms MS           with --compare-remote: a relay on 127.0.0.2 between the\n"
            "                        loader and the daemons holds every byte MS/2 each way,\n"
            "                        so the remote sides see a round trip of MS\n"
            "  --tuned KEY=VALUE     with --compare-remote: one more side, plain TCP with this\n"
            "                        loader option on top (hand-tuned credits=4, prefetch=32,\n"
            "                        ...; repeatable), to set against the automatic choice\n"
            "  --limits              ferry against its ceilings, in rounds (--rounds, default 3)\n"
            "                        of three runs with the same batch bytes and depth: one\n"
            "                        thread memcpy'ing batch-sized chunks out of a large\n"
            "                        source (one-copy), a raw ZeroMQ round trip to a process\n"
            "                        (a thread with --threads) replying with a fresh message\n"
            "                        of the batch's size, then ferry; batches/s, GB/s, us per\n"
            "                        batch, ferry / each, and ferry's us per batch over raw\n"
            "                        ZeroMQ, each a median [min..max] over the rounds\n"
            "  --json                print one JSON object: every setting and every figure\n"
            "  --no-progress         no progress bar (there is one only on a terminal)\n"
            "  --help                this text\n"
            "  --version             the ferry version\n"
            "\n"
            "wait: time inside ferry_loader_next(). steady: every batch but the first of each\n"
            "epoch; epoch start: the first batch of epochs 1, 2, ... (epoch 0's is startup).\n"
            "startup: open called -> first batch in hand. batches/s: (batches - 1) / (last\n"
            "batch in hand - first in hand). step-bound fraction: batches/s x step, i.e. the\n"
            "step over the mean time from one batch in hand to the next (1 = never waited).\n"
            "Peak RSS: the kernel's high-water marks (trainer reset per run; workers summed);\n"
            "peak PSS: the largest sample, every 100 ms. Ratios: > 1 means A did better.\n");
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

static int bad(const char *why, const char *what)
{
    fprintf(stderr, "ferry-bench: %s%s\n", why, what ? what : "");
    return 2;
}

/* --set or --tuned's KEY=VALUE, added to list (*n so far). Checked now,
 * on a scratch config, so a typo fails before any run: 0, or 2 after
 * saying why. */
static int take_set(const char *flag, const char *kv, const char **list, int *n)
{
    if (*n == BENCH_MAX_SETS) {
        fprintf(stderr, "ferry-bench: %s is taken at most %d times\n", flag, BENCH_MAX_SETS);
        return 2;
    }
    ferry_config *scratch = ferry_config_new();
    int rc = scratch ? bench_apply_set(scratch, kv) : FERRY_ENOMEM;
    ferry_config_free(scratch);
    if (rc != FERRY_OK)
        return 2;
    list[(*n)++] = kv;
    return 0;
}

/* Takes the optional N after --compare or --compare-remote: when argv[i +
 * 1] is a number, i moves past it. -1 to go on, or 2 for a number below 1. */
static int optional_rounds(int argc, char **argv, int *i, long *rounds)
{
    long n;
    if (*i + 1 >= argc || parse_long(argv[*i + 1], LONG_MIN, &n) != 0)
        return -1;
    if (n < 1)
        return bad("the rounds after --compare or --compare-remote must be >= 1, not ",
                   argv[*i + 1]);
    *rounds = n;
    (*i)++;
    return -1;
}

/* Fills *o from the command line. Returns -1 to go on, else the exit code
 * (0 after --help or --version, 2 for a bad argument). */
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
        {"--rounds", offsetof(bench_opts, rounds), 1},
        {"--prefetch-factor", offsetof(bench_opts, prefetch_factor), 1},
        {"--io-threads", offsetof(bench_opts, io_threads), 0},
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
        if (!strcmp(a, "--step-ms") && v) {
            char *end;
            o->step_ms = strtod(v, &end);
            if (!v[0] || *end || !isfinite(o->step_ms) || o->step_ms < 0 || o->step_ms > 60000)
                return bad("--step-ms needs milliseconds from 0 to 60000, not ", v);
            i++;
        } else if (!strcmp(a, "--step") && v) {
            if (strcmp(v, "spin") != 0 && strcmp(v, "sleep") != 0)
                return bad("--step is spin or sleep, not ", v);
            o->step_sleep = !strcmp(v, "sleep");
            i++;
        } else if (!strcmp(a, "--dataset") && v) {
            o->dataset = argv[++i];
        } else if (!strcmp(a, "--csv") && v) {
            o->csv = argv[++i];
        } else if (!strcmp(a, "--plot") && v) {
            o->plot = argv[++i];
        } else if (!strcmp(a, "--no-shm")) {
            o->no_shm = 1;
        } else if (!strcmp(a, "--set") && v) {
            if (take_set(a, v, o->set, &o->nset) != 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--rtt-ms") && v) {
            char *end;
            o->rtt_ms = strtod(v, &end);
            if (!v[0] || *end || !isfinite(o->rtt_ms) || o->rtt_ms < 0 || o->rtt_ms > 10000)
                return bad("--rtt-ms needs milliseconds from 0 to 10000, not ", v);
            i++;
        } else if (!strcmp(a, "--tuned") && v) {
            if (take_set(a, v, o->tuned, &o->ntuned) != 0)
                return 2;
            i++;
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
            if (optional_rounds(argc, argv, &i, &o->rounds) >= 0)
                return 2;
        } else if (!strcmp(a, "--limits")) {
            o->limits = 1;
        } else if (!strcmp(a, "--threads")) {
            o->worker_mode = "thread";
        } else if (!strcmp(a, "--epoch-barrier")) {
            o->epoch_barrier = 1;
        } else if (!strcmp(a, "--compare")) {
            o->compare = 1;
            if (optional_rounds(argc, argv, &i, &o->rounds) >= 0)
                return 2;
        } else if (!strcmp(a, "--compare-resume") && v) {
            char *end;
            o->compare_resume = strtol(v, &end, 10);
            if (!v[0] || *end || o->compare_resume < 1 || o->compare_resume > 65536)
                return bad("--compare-resume needs a world size from 1 to 65536, not ", v);
            i++;
        } else if (!strcmp(a, "--compare-mix") && v) {
            o->compare_mix = argv[++i];
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
    if ((o->rtt_ms > 0 || o->ntuned) && !o->compare_remote)
        return bad("--rtt-ms and --tuned go with --compare-remote", NULL);
    if (o->nset + o->ntuned + 1 > BENCH_MAX_SETS)
        return bad("--set and --tuned together are taken at most 31 times", NULL);
    if (o->compare_resume && (o->compare_mix || o->compare || o->compare_remote || o->limits))
        return bad("--compare-resume is a comparison of its own: leave out --compare, "
                   "--compare-mix, --compare-remote and --limits",
                   NULL);
    if (o->compare_mix && (o->compare || o->compare_remote || o->limits))
        return bad("--compare-mix is a comparison of its own: leave out --compare, "
                   "--compare-remote and --limits",
                   NULL);
    if (o->compare && o->compare_remote)
        return bad("--compare and --compare-remote are two different comparisons: pick one", NULL);
    if (o->compare && o->epoch_barrier)
        return bad("--compare already runs the epoch barrier (side B); leave out "
                   "--epoch-barrier",
                   NULL);
    if (o->limits && (o->compare || o->compare_remote || o->bind))
        return bad("--limits compares ferry with its own baselines: leave out --compare, "
                   "--compare-remote and --bind",
                   NULL);
    if (o->limits && (o->step_ms > 0 || o->csv || o->plot || o->epoch_barrier))
        return bad("--limits measures throughput with no step: leave out --step-ms, --csv, "
                   "--plot and --epoch-barrier",
                   NULL);
    if (o->limits && o->workers < 1)
        return bad("--limits needs --workers 1 or more", NULL);
    if (!o->rounds)
        o->rounds = o->compare || o->compare_remote || o->compare_mix || o->compare_resume ? 5
                    : o->limits                                                       ? 3
                                                                                      : 1;
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
                    .prefetch_factor = 2,
                    .progress = 1,
                    .in_order = 1,
                    .min_workers = -1};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;

    if (o.limits)
        return bench_limits(&o);
    if (o.compare_remote) {
        static const bench_side remote[] = {
            {"local", "worker processes over ipc://", 0, 0, BENCH_LOCAL, NULL, NULL, 0},
            {"remote_curve", "ferry-worker daemons over tcp://127.0.0.1 with CURVE", 0, 0,
             BENCH_REMOTE_CURVE, NULL, NULL, 0},
            {"remote_plain", "ferry-worker daemons over tcp://127.0.0.1, plain", 0, 0,
             BENCH_REMOTE_PLAIN, NULL, NULL, 0},
            {"remote_tuned", "as remote_plain, with the options of --tuned", 0, 0,
             BENCH_REMOTE_TUNED, NULL, NULL, 0},
        };
        bench_side sides[BENCH_MAX_SIDES];
        size_t nsides = o.ntuned ? 4 : 3;
        for (size_t k = 0; k < nsides; k++) {
            sides[k] = remote[k];
            sides[k].epoch_barrier = o.epoch_barrier;
            sides[k].prefetch = o.prefetch;
        }
        remote_ctx x;
        if (remote_setup(&o, &x) != 0)
            return 1;
        rc = run_rounds(&o, sides, nsides, &x);
        remote_cleanup(&x);
        return rc;
    }

    bench_side sides[2] = {
        {"ferry", "as configured; prefetch runs on across epoch boundaries", 0, o.prefetch,
         BENCH_LOCAL, NULL, NULL, 0},
    };
    if (o.epoch_barrier)
        sides[0] = (bench_side){"barrier",
                                "epoch_barrier: nothing of an epoch is requested before its "
                                "first batch is asked for",
                                1, o.prefetch, BENCH_LOCAL, NULL, NULL, 0};
    if (o.compare_mix) {
        if (o.seed < 0)
            o.seed = 1; /* both sides shuffle: the mix's per-source passes are shuffled */
        bench_side mixed[2] = {
            {"one", "the dataset as one source, shuffled", o.epoch_barrier, o.prefetch,
             BENCH_LOCAL, NULL, NULL, 0},
            {"mix", "the same items as the sources of a mix, drawn by weight", o.epoch_barrier,
             o.prefetch, BENCH_LOCAL, o.compare_mix, NULL, 0},
        };
        return run_rounds(&o, mixed, 2, NULL);
    }
    if (o.compare_resume) {
        unsigned char state[FERRY_STATE_MAX];
        size_t len;
        if (bench_saved_state(&o, o.compare_resume, state, sizeof state, &len) != 0)
            return 1;
        char what[160];
        snprintf(what, sizeof what,
                 "resumed from the state rank 0 of a %ld-rank job saved a third into epoch 0",
                 o.compare_resume);
        bench_side resumed[2] = {
            {"fresh", "a fresh loader as configured", o.epoch_barrier, o.prefetch, BENCH_LOCAL,
             NULL, NULL, 0},
            {"resumed", what, o.epoch_barrier, o.prefetch, BENCH_LOCAL, NULL, state, len},
        };
        return run_rounds(&o, resumed, 2, NULL);
    }
    char what[200];
    if (o.compare) {
        /* PyTorch's window counts every worker it feeds; with --bind, the
         * remote ones the loader waits for too. */
        long feeders = o.workers + (o.bind ? (o.min_workers > 0 ? o.min_workers : 1) : 0);
        long window = o.prefetch_factor * (feeders > 0 ? feeders : 1);
        if (window > 1024) /* the loader's largest prefetch */
            window = 1024;
        snprintf(what, sizeof what,
                 "PyTorch's schedule (persistent workers): epoch_barrier, %ld x %ld "
                 "workers = %ld in flight",
                 o.prefetch_factor, feeders, window);
        sides[1] = (bench_side){"baseline", what, 1, window, BENCH_LOCAL, NULL, NULL, 0};
    }
    return run_rounds(&o, sides, o.compare ? 2 : 1, NULL);
}
