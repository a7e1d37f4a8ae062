/*
 * profile.c - the stage figures of delivered batches (see profile.h), and
 * the trace of the last ones.
 *
 * Per batch, on the trainer's thread inside next(): one clock read when a
 * wait begins (its end is the window's delivery time), six stages of three additions each into
 * the batch's worker's block, nothing allocated. Readers on other threads
 * copy a worker's block between two reads of a sequence counter and
 * retry if the writer went by; every shared word is read and written with
 * relaxed atomics, so a torn copy is only ever retried, never a race.
 *
 * Waiting for order: batch B arrived at A and was delivered by the call
 * that began at c. Between A and c, the trainer was inside next() for
 * earlier batches for some of the time: W(c) - W(A), where W(t) is its
 * summed wait up to t. That much of B's readiness was held back by order;
 * the rest waited for the trainer. W comes from a ring of the last calls
 * (when each began, ended, and the wait summed before it): a batch waits
 * behind at most the window's worth of deliveries, so the ring holds as
 * many calls as the window holds batches.
 */
#include "profile.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "batch.h"
#include "clock.h"
#include "error.h"

#define CALLS 1024 /* FERRY__WINDOW_MAX: the most batches a window holds */

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

typedef struct wblock {
    ferry_profile_stage stage[FERRY_STAGE_COUNT];
} wblock;

typedef struct call {
    uint64_t begin, end, waited_before;
} call;

typedef struct trace_rec {
    uint64_t seq, arrived, make, flight, ready, order, begin, end;
    uint32_t worker, broke_before; /* the wait before it began a new run */
} trace_rec;

struct ferry__profile {
    uint32_t workers;
    int in_order;
    uint64_t start_ns;
    uint64_t seq; /* odd while the trainer writes */
    wblock *w;    /* workers of them */

    /* --- the trainer's thread only --- */
    uint64_t waiting_since; /* 0: not inside a wait */
    uint64_t last_return;   /* 0: no batch out whose step is timed */
    int32_t last_worker;
    uint64_t waited;  /* summed wait of the calls that delivered */
    call calls[CALLS];
    uint32_t ncalls, calls_head; /* the oldest at calls_head */
    int broke;                   /* the next delivery starts a new run */
    trace_rec *trace;
    uint32_t trace_max, trace_n, trace_head;
};

int ferry__profile_new(ferry__profile **out, uint32_t workers, int in_order)
{
    ferry__profile *p = ferry__calloc(1, sizeof *p);
    wblock *w = workers ? ferry__calloc(workers, sizeof *w) : NULL;
    if (!p || (workers && !w)) {
        free(p);
        free(w);
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the profile of %u workers",
                             workers);
    }
    p->workers = workers;
    p->in_order = in_order;
    p->w = w;
    p->start_ns = ferry__now_ns();
    p->last_worker = -1;
    *out = p;
    return FERRY_OK;
}

void ferry__profile_free(ferry__profile *p)
{
    if (!p)
        return;
    free(p->w);
    free(p->trace);
    free(p);
}

/* ------------------------------------------------------------------------
 * The trainer's side
 */

static inline void add(ferry_profile_stage *s, uint64_t ns)
{
    int b = ferry__profile_bucket(ns);
    ST(s->count, LD(s->count) + 1);
    ST(s->sum_ns, LD(s->sum_ns) + ns);
    ST(s->buckets[b], LD(s->buckets[b]) + 1);
}

void ferry__profile_enter(ferry__profile *p)
{
    if (!p->waiting_since)
        p->waiting_since = ferry__now_ns();
}

void ferry__profile_broke(ferry__profile *p)
{
    p->waiting_since = 0;
    p->last_return = 0;
    p->broke = 1;
}

/* The trainer's summed wait inside next() up to time t, over the calls in
 * the ring; t before the oldest kept counts from there. */
static uint64_t waited_until(const ferry__profile *p, uint64_t t)
{
    uint32_t lo = 0, hi = p->ncalls; /* the last call beginning at or before t: lo - 1 */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->calls[(p->calls_head + mid) % CALLS].begin <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return p->ncalls ? p->calls[p->calls_head].waited_before : p->waited;
    const call *c = &p->calls[(p->calls_head + lo - 1) % CALLS];
    uint64_t in = t - c->begin, len = c->end - c->begin;
    return c->waited_before + (in < len ? in : len);
}

static void trace_add(ferry__profile *p, const ferry_batch *b, uint64_t order, uint64_t begin,
                      uint64_t end)
{
    uint32_t at = (p->trace_head + p->trace_n) % p->trace_max;
    if (p->trace_n == p->trace_max)
        p->trace_head = (p->trace_head + 1) % p->trace_max;
    else
        p->trace_n++;
    p->trace[at] = (trace_rec){.seq = b->info.seq,
                               .arrived = b->arrived_ns,
                               .make = b->info.make_ns,
                               .flight = b->info.flight_ns,
                               .ready = b->info.ready_ns,
                               .order = order,
                               .begin = begin,
                               .end = end,
                               .worker = b->info.worker,
                               .broke_before = (uint32_t)p->broke};
}

void ferry__profile_delivered(ferry__profile *p, const ferry_batch *b)
{
    const ferry_batch_info *in = &b->info;
    /* The window read the clock as it handed the batch out: its ready_ns
     * ends then. */
    uint64_t now = b->arrived_ns + in->ready_ns;
    uint64_t begin = p->waiting_since && p->waiting_since <= now ? p->waiting_since : now;
    uint64_t order = 0;
    if (b->arrived_ns < begin) {
        order = p->waited - waited_until(p, b->arrived_ns);
        if (order > in->ready_ns)
            order = in->ready_ns;
    }
    uint32_t wi = in->worker < p->workers ? in->worker : 0;
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    if (p->workers) {
        ferry_profile_stage *s = p->w[wi].stage;
        add(&s[FERRY_STAGE_MAKE], in->make_ns);
        add(&s[FERRY_STAGE_TRANSIT], in->flight_ns > in->make_ns ? in->flight_ns - in->make_ns : 0);
        add(&s[FERRY_STAGE_ORDER], order);
        add(&s[FERRY_STAGE_HELD], in->ready_ns - order);
        add(&s[FERRY_STAGE_WAIT], now - begin);
        if (p->last_return && p->last_worker >= 0)
            add(&p->w[p->last_worker].stage[FERRY_STAGE_STEP], begin - p->last_return);
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);

    uint32_t at = (p->calls_head + p->ncalls) % CALLS;
    if (p->ncalls == CALLS)
        p->calls_head = (p->calls_head + 1) % CALLS;
    else
        p->ncalls++;
    p->calls[at] = (call){.begin = begin, .end = now, .waited_before = p->waited};
    p->waited += now - begin;
    if (p->trace)
        trace_add(p, b, order, begin, now);
    p->broke = 0;
    p->waiting_since = 0;
    p->last_return = now;
    p->last_worker = (int32_t)wi;
}

/* ------------------------------------------------------------------------
 * Readers
 */

/* Adds worker i's block to out, a consistent copy of it. */
static void add_block(ferry__profile *p, uint32_t i, ferry_profile *out)
{
    static __thread wblock copy; /* 6 KB: off the caller's stack */
    for (;;) {
        uint64_t s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        const ferry_profile_stage *src = p->w[i].stage;
        for (int k = 0; k < FERRY_STAGE_COUNT; k++) {
            copy.stage[k].count = LD(src[k].count);
            copy.stage[k].sum_ns = LD(src[k].sum_ns);
            for (int b = 0; b < FERRY_PROFILE_BUCKETS; b++)
                copy.stage[k].buckets[b] = LD(src[k].buckets[b]);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == s1)
            break;
    }
    for (int k = 0; k < FERRY_STAGE_COUNT; k++) {
        out->stage[k].count += copy.stage[k].count;
        out->stage[k].sum_ns += copy.stage[k].sum_ns;
        for (int b = 0; b < FERRY_PROFILE_BUCKETS; b++)
            out->stage[k].buckets[b] += copy.stage[k].buckets[b];
    }
}

void ferry__profile_snapshot(ferry__profile *p, int32_t worker, ferry_profile *out)
{
    memset(out, 0, sizeof *out);
    out->version = FERRY_PROFILE_VERSION;
    out->workers = p->workers;
    out->worker = worker;
    out->in_order = (uint32_t)p->in_order;
    out->start_ns = p->start_ns;
    out->end_ns = ferry__now_ns();
    for (uint32_t i = 0; i < p->workers; i++) {
        if (worker < 0 || (uint32_t)worker == i)
            add_block(p, i, out);
    }
}

/* ------------------------------------------------------------------------
 * The trace
 */

int ferry__profile_trace(ferry__profile *p, uint32_t max)
{
    trace_rec *t = NULL;
    if (max && !(t = ferry__calloc(max, sizeof *t)))
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a trace of %u batches", max);
    free(p->trace);
    p->trace = t;
    p->trace_max = max;
    p->trace_n = p->trace_head = 0;
    return FERRY_OK;
}

static double us(uint64_t ns, uint64_t t0)
{
    return ((double)ns - (double)t0) / 1000.0;
}

/* One track per worker (tid 2 + its index: its builds) and one for the
 * trainer (tid 1: its waits and steps); times in microseconds from the
 * first dispatch kept. */
int ferry__profile_trace_write(ferry__profile *p, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return ferry__seterr(FERRY_ESYS, "cannot write the trace to %s: %s", path,
                             strerror(errno));
    uint64_t t0 = UINT64_MAX;
    for (uint32_t k = 0; k < p->trace_n; k++) {
        const trace_rec *r = &p->trace[(p->trace_head + k) % p->trace_max];
        uint64_t sent = r->arrived - (r->flight < r->arrived ? r->flight : r->arrived);
        if (sent < t0)
            t0 = sent;
        if (r->begin < t0)
            t0 = r->begin;
    }
    int pid = (int)getpid();
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":1,"
               "\"args\":{\"name\":\"ferry loader\"}},\n",
            pid);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,"
               "\"args\":{\"name\":\"trainer\"}}",
            pid);
    for (uint32_t w = 0; w < p->workers && p->trace_n; w++) {
        int seen = 0;
        for (uint32_t k = 0; k < p->trace_n && !seen; k++)
            seen = p->trace[(p->trace_head + k) % p->trace_max].worker == w;
        if (seen)
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%u,"
                       "\"args\":{\"name\":\"worker %u\"}}",
                    pid, w + 2, w);
    }
    for (uint32_t k = 0; k < p->trace_n; k++) {
        const trace_rec *r = &p->trace[(p->trace_head + k) % p->trace_max];
        fprintf(f,
                ",\n{\"ph\":\"X\",\"name\":\"make %" PRIu64 "\",\"cat\":\"worker\",\"pid\":%d,"
                "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%" PRIu64
                ",\"transit_us\":%.3f,\"order_us\":%.3f,\"held_us\":%.3f}}",
                r->seq, pid, r->worker + 2, us(r->arrived - r->make, t0), (double)r->make / 1000.0, r->seq,
                (double)(r->flight > r->make ? r->flight - r->make : 0) / 1000.0,
                (double)r->order / 1000.0, (double)(r->ready - r->order) / 1000.0);
        fprintf(f,
                ",\n{\"ph\":\"X\",\"name\":\"wait\",\"cat\":\"trainer\",\"pid\":%d,\"tid\":1,"
                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%" PRIu64 ",\"worker\":%u}}",
                pid, us(r->begin, t0), (double)(r->end - r->begin) / 1000.0, r->seq, r->worker);
        if (k + 1 < p->trace_n) {
            const trace_rec *n = &p->trace[(p->trace_head + k + 1) % p->trace_max];
            if (!n->broke_before && n->begin > r->end)
                fprintf(f,
                        ",\n{\"ph\":\"X\",\"name\":\"step\",\"cat\":\"trainer\",\"pid\":%d,"
                        "\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%" PRIu64 "}}",
                        pid, us(r->end, t0), (double)(n->begin - r->end) / 1000.0, r->seq);
        }
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return ferry__seterr(FERRY_ESYS, "cannot write the trace to %s: %s", path,
                             strerror(errno ? errno : EIO));
    return FERRY_OK;
}
