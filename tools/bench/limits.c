/*
 * limits.c - ferry-bench --limits: ferry against the two ceilings it
 * cannot beat on this machine, measured in the same invocation so that
 * every figure is a same-run ratio.
 *
 * A round is three runs with the same batch bytes (the dataset's schema x
 * batch_size) and the same depth (the loader's prefetch window):
 *  - one-copy: one thread memcpy's batch-sized chunks, walking through a
 *    large pre-faulted source (at least 256 MiB and 4 x the last-level
 *    cache, up to 1 GiB, so the reads come from memory as a dataset's
 *    would), into `depth` reused buffers. A loader that hands the trainer
 *    bytes someone else wrote must at least move them once: this is that
 *    one move with nothing around it.
 *  - raw ZeroMQ: ferry's own transport with nothing of ferry in it. The
 *    trainer side binds a ROUTER, the replier (a forked process over
 *    ipc://, or a thread over inproc:// under --threads, as ferry places
 *    its workers) connects a DEALER; the trainer keeps `depth` small
 *    requests in flight, the replier answers each with a fresh message of
 *    the batch's size filled by memcpy from a prefilled buffer (as ferry's
 *    worker sizes a fresh frame and writes every byte), and the trainer
 *    reads one byte per 4 KiB page of each reply, as run.c does.
 *  - ferry: bench_run_once, the normal run (no step).
 * The runs of a round go in that order, for --rounds rounds (3), so a noisy
 * machine hurts all three alike. Rates count from the first batch in hand
 * to the last, as figures.c does. The two limits run at least as many
 * batches as ferry and at least LIMIT_MIN_NS, so that a tiny run still
 * measures something.
 *
 * Everything runs on the main thread, but for the thread replier.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "bench.h"

#define LIMIT_MIN_NS 200000000ull /* each limit runs at least 0.2 s */
#define SOURCE_MIN ((uint64_t)256 << 20)
#define SOURCE_MAX ((uint64_t)1 << 30)
#define REPLY_POLL_MS 1000               /* how often a stuck round trip checks its replier */
#define REPLY_DEADLINE_NS 30000000000ull /* a reply later than this: the replier is stuck */

/* Every figure of a round. X(name, what): name is the JSON key. */
#define LIMIT_FIGURES(X)                                                                           \
    X(copy_batches_per_s, "one-copy batches/s")                                                    \
    X(copy_gb_per_s, "one-copy GB/s")                                                              \
    X(copy_us_per_batch, "one-copy us per batch")                                                  \
    X(zmq_batches_per_s, "raw ZeroMQ batches/s")                                                   \
    X(zmq_gb_per_s, "raw ZeroMQ GB/s")                                                             \
    X(zmq_us_per_batch, "raw ZeroMQ us per batch")                                                 \
    X(ferry_batches_per_s, "ferry batches/s")                                                      \
    X(ferry_gb_per_s, "ferry GB/s")                                                                \
    X(ferry_us_per_batch, "ferry us per batch")                                                    \
    X(ferry_vs_copy, "ferry / one-copy (batches/s)")                                               \
    X(ferry_vs_zmq, "ferry / raw ZeroMQ (batches/s)")                                              \
    X(ferry_added_us_per_batch, "ferry's us per batch over raw ZeroMQ's")

enum {
#define LIMIT__INDEX(name, what) LIMIT_##name,
    LIMIT_FIGURES(LIMIT__INDEX)
#undef LIMIT__INDEX
        LIMIT_N
};

static const char *const limit_keys[LIMIT_N] = {
#define LIMIT__KEY(name, what) #name,
    LIMIT_FIGURES(LIMIT__KEY)
#undef LIMIT__KEY
};

typedef struct limit_round {
    double v[LIMIT_N];
} limit_round;

/* What every run of the invocation shares. */
typedef struct limit_plan {
    uint64_t batch_bytes, batches_per_epoch;
    uint64_t batches;      /* ferry's run; the limits run at least this many */
    uint64_t source_bytes; /* one-copy's source */
    long depth;
    int threads; /* the replier is a thread over inproc:// */
} limit_plan;

/* A measured run of a limit: batches from the first in hand to the last. */
typedef struct limit_run {
    uint64_t n, t_first, t_last;
} limit_run;

static double rate(const limit_run *r)
{
    return r->n > 1 && r->t_last > r->t_first
               ? (double)(r->n - 1) * 1e9 / (double)(r->t_last - r->t_first)
               : NAN;
}

static int keep_going(const limit_plan *p, uint64_t n, uint64_t t_first, uint64_t now)
{
    return n < p->batches || now - t_first < LIMIT_MIN_NS;
}

/* ------------------------------------------------------------------------
 * One-copy
 */

/* One-copy's memory, mapped once for every round: the source and the
 * reused destinations. MAP_POPULATE faults every page in now, not in the
 * timed loop (their bytes are zeros: memcpy does not care). */
typedef struct copy_mem {
    unsigned char *src, *dst;
    uint64_t dst_bytes;
} copy_mem;

static int copy_mem_map(const limit_plan *p, copy_mem *m)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
    m->dst_bytes = p->batch_bytes * (uint64_t)p->depth;
    m->src = mmap(NULL, p->source_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    m->dst = m->src == MAP_FAILED ? MAP_FAILED
                                  : mmap(NULL, m->dst_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (m->dst != MAP_FAILED)
        return 0;
    fprintf(stderr, "ferry-bench: --limits: cannot map %llu MiB for the one-copy run: %s\n",
            (unsigned long long)((p->source_bytes + m->dst_bytes) >> 20), strerror(errno));
    if (m->src != MAP_FAILED)
        munmap(m->src, p->source_bytes);
    m->src = m->dst = NULL;
    return 1;
}

static void copy_mem_unmap(const limit_plan *p, copy_mem *m)
{
    if (m->src) {
        munmap(m->dst, m->dst_bytes);
        munmap(m->src, p->source_bytes);
    }
}

/* The one-copy run. */
static void run_copy(const limit_plan *p, const copy_mem *m, limit_run *out, uint64_t *sink)
{
    size_t b = (size_t)p->batch_bytes, depth = (size_t)p->depth;
    unsigned char *src = m->src, *dst = m->dst;
    uint64_t chunks = p->source_bytes / b, n = 0, now = 0;
    /* The clock is read every `every` copies, about each 64 KiB: for tiny
     * batches, reading it would cost more than the copy. */
    uint64_t every = b >= 65536 ? 1 : 65536 / b;
    memset(out, 0, sizeof *out);
    out->t_first = bench_now_ns();
    do {
        memcpy(dst + (n % depth) * b, src + (n % chunks) * b, b);
        *sink += dst[(n % depth) * b + b - 1];
        n++;
        if (n % every == 0)
            now = bench_now_ns();
    } while (n % every != 0 || keep_going(p, n, out->t_first, now));
    /* n copies in now - t_first: the rate n / span, as (n + 1 - 1) / span. */
    out->n = n + 1;
    out->t_last = now;
}

/* ------------------------------------------------------------------------
 * Raw ZeroMQ
 */

typedef struct replier_args {
    void *ctx;
    const char *endpoint;
    size_t bytes;
    int rc;
} replier_args;

/* The replier: says hello, then answers every request with a fresh
 * message of `bytes`, until an empty request. Bounded: it gives up when
 * nothing comes for REPLY_DEADLINE_NS. 0, or -1. */
static int replier(replier_args *a)
{
    void *s = zmq_socket(a->ctx, ZMQ_DEALER);
    unsigned char *fill = malloc(a->bytes ? a->bytes : 1);
    int linger = 0, ok = s && fill;
    ok = ok && zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) == 0;
    ok = ok && zmq_connect(s, a->endpoint) == 0;
    ok = ok && zmq_send(s, "", 0, 0) == 0;
    if (fill)
        memset(fill, 0xa5, a->bytes);
    uint64_t heard = bench_now_ns();
    while (ok) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        int r = zmq_poll(&it, 1, REPLY_POLL_MS);
        if (r < 0 && zmq_errno() == EINTR)
            continue;
        if (r <= 0) {
            ok = r == 0 && bench_now_ns() - heard < REPLY_DEADLINE_NS;
            continue;
        }
        char req[16];
        int len = zmq_recv(s, req, sizeof req, 0);
        heard = bench_now_ns();
        if (len <= 0)
            break; /* the empty request: done (or an error) */
        zmq_msg_t m;
        ok = zmq_msg_init_size(&m, a->bytes) == 0;
        if (ok) {
            memcpy(zmq_msg_data(&m), fill, a->bytes);
            ok = zmq_msg_send(&m, s, 0) >= 0;
            if (!ok)
                zmq_msg_close(&m);
        }
    }
    free(fill);
    if (s)
        zmq_close(s);
    return ok ? 0 : -1;
}

static void *replier_thread(void *arg)
{
    replier_args *a = arg;
    a->rc = replier(a);
    return NULL;
}

/* The trainer side's loop: hello, then `depth` requests in flight until
 * enough replies came, then the rest drained. 0, or 1 after saying why. */
static int requester(const limit_plan *p, void *router, pid_t child, limit_run *out, uint64_t *sink)
{
    unsigned char id[256];
    int idlen = -1;
    uint64_t sent = 0, t_heard = bench_now_ns();
    memset(out, 0, sizeof *out);
    for (;;) {
        if (idlen >= 0 && out->n == sent &&
            !(sent == 0 || keep_going(p, out->n, out->t_first, bench_now_ns())))
            break;
        while (idlen >= 0 && sent - out->n < (uint64_t)p->depth &&
               (sent == 0 || keep_going(p, out->n, out->t_first, bench_now_ns()))) {
            if (zmq_send(router, id, (size_t)idlen, ZMQ_SNDMORE) < 0 ||
                zmq_send(router, &sent, sizeof sent, 0) < 0) {
                fprintf(stderr, "ferry-bench: --limits: send: %s\n", zmq_strerror(zmq_errno()));
                return 1;
            }
            sent++;
        }
        zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
        int r = zmq_poll(&it, 1, REPLY_POLL_MS);
        if (r < 0 && zmq_errno() == EINTR)
            continue;
        if (r == 0) {
            int dead = child > 0 && waitpid(child, NULL, WNOHANG) == child;
            if (dead || bench_now_ns() - t_heard > REPLY_DEADLINE_NS) {
                fprintf(stderr, "ferry-bench: --limits: the raw ZeroMQ replier %s\n",
                        dead ? "died" : "stopped answering");
                return 1;
            }
            continue;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        int len = r > 0 ? zmq_recv(router, id, sizeof id, 0) : -1;
        int more = 0;
        size_t sz = sizeof more;
        if (len >= 0 && zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz) == 0 && more &&
            zmq_msg_recv(&m, router, 0) >= 0) {
            t_heard = bench_now_ns();
            if (idlen < 0) {
                idlen = len; /* the hello: now the replier can be addressed */
            } else {
                const unsigned char *d = zmq_msg_data(&m);
                for (size_t i = 0; i < zmq_msg_size(&m); i += 4096)
                    *sink += d[i];
                out->n++;
                out->t_last = bench_now_ns();
                if (out->n == 1)
                    out->t_first = out->t_last;
            }
            zmq_msg_close(&m);
            continue;
        }
        zmq_msg_close(&m);
        fprintf(stderr, "ferry-bench: --limits: receive: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    /* The empty request ends the replier. */
    if (zmq_send(router, id, (size_t)idlen, ZMQ_SNDMORE) < 0 || zmq_send(router, "", 0, 0) < 0)
        return 1;
    return 0;
}

/* Waits for the forked replier at most 10 s, then kills it; 0 when it
 * ended well. */
static int reap_replier(pid_t pid)
{
    int st = 0;
    for (int i = 0; i < 1000; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
        if (r < 0 && errno != EINTR)
            return 1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return 1;
}

/* The raw ZeroMQ run. 0, or 1 after saying why. */
static int run_zmq(const limit_plan *p, unsigned round, limit_run *out, uint64_t *sink)
{
    char ep[96];
    /* ipc:// in Linux's abstract namespace: no file to leave behind. */
    if (p->threads)
        snprintf(ep, sizeof ep, "inproc://ferry-bench-limits-%u", round);
    else
        snprintf(ep, sizeof ep, "ipc://@ferry-bench-limits-%ld-%u", (long)getpid(), round);
    void *ctx = zmq_ctx_new();
    void *router = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    int linger = 1000; /* long enough for the last, empty request to go out */
    if (!router || zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(router, ep) != 0) {
        fprintf(stderr, "ferry-bench: --limits: binding %s: %s\n", ep, zmq_strerror(zmq_errno()));
        if (router)
            zmq_close(router);
        if (ctx)
            zmq_ctx_term(ctx);
        return 1;
    }
    replier_args a = {.endpoint = ep, .bytes = (size_t)p->batch_bytes};
    pthread_t th;
    pid_t pid = -1;
    int started;
    if (p->threads) {
        a.ctx = ctx;
        started = pthread_create(&th, NULL, replier_thread, &a) == 0;
    } else {
        /* The child makes its own context: nothing of ours is used there. */
        fflush(NULL);
        pid = fork();
        if (pid == 0) {
            a.ctx = zmq_ctx_new();
            _exit(a.ctx && replier(&a) == 0 ? 0 : 1);
        }
        started = pid > 0;
    }
    int rc = 1;
    if (!started)
        fprintf(stderr, "ferry-bench: --limits: cannot start the replier: %s\n", strerror(errno));
    else
        rc = requester(p, router, pid, out, sink);
    /* A failed run stops its replier now rather than at its deadline. */
    if (rc != 0 && pid > 0)
        kill(pid, SIGTERM);
    if (rc != 0 && started && p->threads)
        zmq_ctx_shutdown(ctx);
    zmq_close(router);
    if (started && p->threads) {
        pthread_join(th, NULL);
        rc |= a.rc != 0;
    } else if (started) {
        rc |= reap_replier(pid);
    }
    zmq_ctx_term(ctx);
    return rc;
}

/* ------------------------------------------------------------------------
 * Rounds and the report
 */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median, min and max over the rounds of figure k (NAN when none). */
static void summarize(const limit_round *rounds, size_t n, int k, double out[3])
{
    double *v = malloc((n ? n : 1) * sizeof *v);
    size_t got = 0;
    for (size_t i = 0; v && i < n; i++)
        if (!isnan(rounds[i].v[k]))
            v[got++] = rounds[i].v[k];
    out[0] = out[1] = out[2] = NAN;
    if (!got) {
        free(v);
        return;
    }
    qsort(v, got, sizeof *v, cmp_double);
    out[0] = got % 2 ? v[got / 2] : (v[got / 2 - 1] + v[got / 2]) / 2;
    out[1] = v[0];
    out[2] = v[got - 1];
    free(v);
}

static void fill(limit_round *x, const limit_plan *p, const limit_run *copy, const limit_run *zq,
                 const bench_fig *ferry)
{
    double bytes = (double)p->batch_bytes;
    x->v[LIMIT_copy_batches_per_s] = rate(copy);
    x->v[LIMIT_zmq_batches_per_s] = rate(zq);
    x->v[LIMIT_ferry_batches_per_s] = ferry->batches_per_s;
    x->v[LIMIT_copy_gb_per_s] = rate(copy) * bytes / 1e9;
    x->v[LIMIT_zmq_gb_per_s] = rate(zq) * bytes / 1e9;
    x->v[LIMIT_ferry_gb_per_s] = ferry->mb_per_s / 1e3; /* the bytes it really delivered */
    x->v[LIMIT_copy_us_per_batch] = 1e6 / rate(copy);
    x->v[LIMIT_zmq_us_per_batch] = 1e6 / rate(zq);
    x->v[LIMIT_ferry_us_per_batch] = 1e6 / ferry->batches_per_s;
    x->v[LIMIT_ferry_vs_copy] = ferry->batches_per_s / rate(copy);
    x->v[LIMIT_ferry_vs_zmq] = ferry->batches_per_s / rate(zq);
    x->v[LIMIT_ferry_added_us_per_batch] =
        x->v[LIMIT_ferry_us_per_batch] - x->v[LIMIT_zmq_us_per_batch];
}

static const char *copy_what(const limit_plan *p, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "one thread memcpy's %llu-byte chunks from a %llu MiB pre-faulted source into %ld "
             "reused buffers",
             (unsigned long long)p->batch_bytes, (unsigned long long)(p->source_bytes >> 20),
             p->depth);
    return buf;
}

static const char *zmq_what(const limit_plan *p, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "ROUTER here, DEALER in a %s over %s; %ld requests in flight; each reply a fresh "
             "%llu-byte message filled by memcpy; one byte per 4 KiB page read",
             p->threads ? "thread" : "forked process", p->threads ? "inproc://" : "ipc://",
             p->depth, (unsigned long long)p->batch_bytes);
    return buf;
}

/* "median [min..max]" of figure k, with printf format fmt for each. */
static void cell(char *buf, size_t cap, const limit_round *rounds, size_t n, int k, const char *fmt)
{
    double s[3];
    char a[32], b[32], c[32];
    summarize(rounds, n, k, s);
    snprintf(a, sizeof a, fmt, s[0]);
    snprintf(b, sizeof b, fmt, s[1]);
    snprintf(c, sizeof c, fmt, s[2]);
    if (n > 1)
        snprintf(buf, cap, "%s [%s..%s]", a, b, c);
    else
        snprintf(buf, cap, "%s", a);
}

static void print_text(const bench_opts *o, const limit_plan *p, const limit_round *rounds,
                       size_t n, FILE *f)
{
    char what[512], c1[96], c2[96], c3[96];
    bench_print_settings(o, o->prefetch, p->batches_per_epoch, f);
    fprintf(f,
            "  --limits: %zu rounds of one-copy, raw ZeroMQ, ferry, in this order; each batch "
            "%llu bytes, depth %ld\n",
            n, (unsigned long long)p->batch_bytes, p->depth);
    fprintf(f, "  one-copy:   %s\n", copy_what(p, what, sizeof what));
    fprintf(f, "  raw ZeroMQ: %s\n", zmq_what(p, what, sizeof what));
    fprintf(f, "  ferry:      %ld %s workers, the normal run\n\n", o->workers, o->worker_mode);
    fprintf(f, "%-16s%28s%28s%28s\n", n > 1 ? "median [min..max]" : "one round", "batches/s",
            "GB/s", "us per batch");
    static const struct {
        const char *name;
        int k;
    } rows[] = {{"one-copy", LIMIT_copy_batches_per_s},
                {"raw ZeroMQ", LIMIT_zmq_batches_per_s},
                {"ferry", LIMIT_ferry_batches_per_s}};
    for (size_t i = 0; i < 3; i++) {
        cell(c1, sizeof c1, rounds, n, rows[i].k, "%.0f");
        cell(c2, sizeof c2, rounds, n, rows[i].k + 1, "%.3f");
        cell(c3, sizeof c3, rounds, n, rows[i].k + 2, "%.2f");
        fprintf(f, "%-16s%28s%28s%28s\n", rows[i].name, c1, c2, c3);
    }
    cell(c1, sizeof c1, rounds, n, LIMIT_ferry_vs_copy, "%.3fx");
    cell(c2, sizeof c2, rounds, n, LIMIT_ferry_vs_zmq, "%.3fx");
    cell(c3, sizeof c3, rounds, n, LIMIT_ferry_added_us_per_batch, "%.2f");
    fprintf(f, "\nferry / one-copy     %s   (batches/s, per round)\n", c1);
    fprintf(f, "ferry / raw ZeroMQ   %s\n", c2);
    fprintf(f,
            "ferry's added cost   %s us per batch over raw ZeroMQ (aim: <= 5 us at batch size 1; "
            "negative: ferry is faster)\n",
            c3);
}

static void json_figs(FILE *f, const double *v)
{
    fputc('{', f);
    for (int k = 0; k < LIMIT_N; k++) {
        fprintf(f, "%s\"%s\": ", k ? ", " : "", limit_keys[k]);
        bench_json_num(f, v[k]);
    }
    fputc('}', f);
}

static void print_json(const bench_opts *o, const limit_plan *p, const limit_round *rounds,
                       size_t n, FILE *f)
{
    char what[512];
    double med[LIMIT_N], lo[LIMIT_N], hi[LIMIT_N];
    for (int k = 0; k < LIMIT_N; k++) {
        double s[3];
        summarize(rounds, n, k, s);
        med[k] = s[0];
        lo[k] = s[1];
        hi[k] = s[2];
    }
    fputs("{\"tool\": \"ferry-bench\", \"version\": ", f);
    bench_json_str(f, ferry_version());
    fputs(", \"settings\": ", f);
    bench_json_settings(o, n, f);
    fputs(", \"host\": ", f);
    bench_json_host(f);
    fprintf(f,
            ", \"batches_per_epoch\": %llu, \"limits\": {\"batch_bytes\": %llu, \"depth\": %ld, "
            "\"batches\": %llu, \"source_bytes\": %llu, \"one_copy\": ",
            (unsigned long long)p->batches_per_epoch, (unsigned long long)p->batch_bytes, p->depth,
            (unsigned long long)p->batches, (unsigned long long)p->source_bytes);
    bench_json_str(f, copy_what(p, what, sizeof what));
    fputs(", \"raw_zmq\": ", f);
    bench_json_str(f, zmq_what(p, what, sizeof what));
    fputs(", \"median\": ", f);
    json_figs(f, med);
    fputs(", \"min\": ", f);
    json_figs(f, lo);
    fputs(", \"max\": ", f);
    json_figs(f, hi);
    fputs(", \"rounds\": [", f);
    for (size_t r = 0; r < n; r++) {
        fputs(r ? ", " : "", f);
        json_figs(f, rounds[r].v);
    }
    fputs("]}}\n", f);
}

int bench_limits(const bench_opts *o)
{
    bench_side side = {"ferry", "as configured", 0, o->prefetch, BENCH_LOCAL, NULL, NULL, 0};
    limit_plan p = {.threads = !strcmp(o->worker_mode, "thread")};
    uint32_t window = 0;
    if (bench_probe(o, &side, &p.batch_bytes, &p.batches_per_epoch, &window) != 0)
        return 1;
    if (!p.batch_bytes) {
        fprintf(stderr, "ferry-bench: --limits: the dataset's batches have no bytes\n");
        return 1;
    }
    p.batches = o->batches > 0 ? (uint64_t)o->batches : p.batches_per_epoch * (uint64_t)o->epochs;
    p.depth = (long)window; /* the loader's own window, as it sized it */
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    p.source_bytes = SOURCE_MIN;
    if (llc > 0 && 4 * (uint64_t)llc > p.source_bytes)
        p.source_bytes = 4 * (uint64_t)llc < SOURCE_MAX ? 4 * (uint64_t)llc : SOURCE_MAX;
    if (p.source_bytes < 2 * p.batch_bytes)
        p.source_bytes = 2 * p.batch_bytes;

    size_t n = (size_t)o->rounds;
    limit_round *rounds = calloc(n, sizeof *rounds);
    if (!rounds) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        return 1;
    }
    bench_progress prog = {.on = o->progress && !o->json && isatty(2), .runs = (unsigned)n};
    uint64_t sink = 0;
    copy_mem mem;
    int rc = copy_mem_map(&p, &mem);
    for (size_t r = 0; r < n && rc == 0; r++) {
        limit_run copy, zq;
        bench_run run;
        bench_fig fig;
        run_copy(&p, &mem, &copy, &sink);
        rc = run_zmq(&p, (unsigned)r, &zq, &sink);
        if (rc == 0) {
            snprintf(prog.label, sizeof prog.label, "ferry %zu/%zu", r + 1, n);
            rc = bench_run_once(o, &side, &prog, &run);
            if (rc == 0) {
                bench_figures(o, &run, &fig);
                fill(&rounds[r], &p, &copy, &zq, &fig);
            }
            bench_run_free(&run);
        }
    }
    copy_mem_unmap(&p, &mem);
    if (rc == 0) {
        if (o->json)
            print_json(o, &p, rounds, n, stdout);
        else
            print_text(o, &p, rounds, n, stdout);
        fflush(stdout);
    }
    if (sink == 42) /* keeps the reads from being optimised away */
        fputc(' ', stderr);
    free(rounds);
    return rc;
}
