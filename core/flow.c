/*
 * flow.c - flow control from measurements (see flow.h).
 */
#include "flow.h"

#include <stdlib.h>

#include "alloc.h"
#include "error.h"
#include "ferry.h"

#define MS 1000000ull
#define S (1000 * MS)

#define PERIOD_REPLIES 8
#define PERIOD_NS (200 * MS)
#define PERIOD_MAX_NS (2 * S) /* a slow worker's period: 2 replies suffice */
#define BUSY_ENOUGH 0.9       /* a worker building this share of the time is fed */
#define GAIN 0.05             /* what a change must do to busy to count */
#define WINDOW_BOUND 4        /* 1/4 of the replies finding the window full */
#define HOLD_FIRST_NS (4 * S) /* after a raise that did not help */
#define HOLD_MAX_NS (64 * S)
#define PROBE_FIRST_NS (30 * S) /* saturated above the automatic credits */
#define PROBE_MAX_NS (480 * S)
/* A batch built in this long or more hides a local worker's round trip
 * (0.1-0.5 ms) many times over: such a worker, saturated, is tried with
 * one credit (below the automatic 2), since each task queued at it holds
 * a batch slot's memory while it waits. */
#define SLOW_MAKE_NS (20 * MS)
/* What a credit fewer may cost such a worker: its quickest round trip in
 * a period, as a share of its build time. A fall in how busy it is beyond
 * that is the host's (a busy machine runs the loader's thread late now and
 * then, and what the worker does not use meanwhile another process does),
 * not the credit's. */
#define LOWERED_COST 0.05

enum { CHANGE_NONE, CHANGE_RAISED, CHANGE_PROBED, CHANGE_LOWERED };

typedef struct fworker {
    int active, slots;
    uint32_t credits, why;
    /* The period being measured. */
    uint64_t start_ns, make_sum_ns, min_rt_ns;
    uint32_t replies, full;
    /* The last change, judged by the period after it. */
    int pending;
    uint32_t from;
    double busy_before;
    int gained; /* the last raise made it busier */
    uint64_t hold_until_ns, hold_ns, probe_at_ns, probe_ns;
    uint64_t rtt_ns;     /* the last round trip measured; 0: none */
    uint64_t idle_min_ns; /* the last period's minimum, if it idled; 0: it did not */
} fworker;

struct ferry__flow {
    ferry__flow_opts o;
    uint32_t mem_window; /* memory / a batch's bytes; UINT32_MAX before known */
    uint32_t window, window_why;
    fworker *w;
};

int ferry__flow_new(ferry__flow **out, const ferry__flow_opts *o)
{
    ferry__flow *f = ferry__calloc(1, sizeof *f);
    if (f)
        f->w = ferry__calloc(o->nworkers ? o->nworkers : 1, sizeof *f->w);
    if (!f || !f->w) {
        ferry__flow_free(f);
        return ferry__seterr(FERRY_ENOMEM, "out of memory creating the loader");
    }
    f->o = *o;
    f->mem_window = UINT32_MAX;
    for (uint32_t i = 0; i < o->nworkers; i++)
        f->w[i].credits = o->credits ? o->credits : o->auto_credits;
    f->window = o->prefetch ? o->prefetch : o->auto_window;
    f->window_why = o->prefetch ? FERRY_SIZED_USER : FERRY_SIZED_DEFAULT;
    *out = f;
    return FERRY_OK;
}

void ferry__flow_free(ferry__flow *f)
{
    if (!f)
        return;
    free(f->w);
    free(f);
}

/* The most the measured window may grow to, and what sets it. */
static uint32_t window_top(const ferry__flow *f, uint32_t *why)
{
    uint32_t top = f->o.max_window;
    *why = FERRY_SIZED_LIMIT;
    if (f->mem_window < top) {
        top = f->mem_window;
        *why = FERRY_SIZED_MEMORY;
    }
    return top < f->o.auto_window ? f->o.auto_window : top;
}

static uint64_t credit_sum(const ferry__flow *f)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < f->o.nworkers; i++)
        sum += f->w[i].active ? f->w[i].credits : 0;
    return sum;
}

/* Twice what the ready workers may hold: as many built and waiting for
 * the trainer as are being built. */
static void size_window(ferry__flow *f)
{
    if (f->o.prefetch)
        return;
    uint32_t why;
    uint32_t top = window_top(f, &why);
    uint64_t want = 2 * credit_sum(f);
    if (want <= f->o.auto_window) {
        f->window = f->o.auto_window;
        f->window_why = FERRY_SIZED_DEFAULT;
    } else if (want >= top) {
        /* Credits are held to what fits: at the top, it is what binds. */
        f->window = top;
        f->window_why = why;
    } else {
        f->window = (uint32_t)want;
        f->window_why = FERRY_SIZED_NEED;
    }
}

/* The most credits worker i may have: what the window leaves beside the
 * others' (a credit the window has no room for is never used), at most
 * max_credits; *why says which bound it is. */
static uint32_t credit_room(const ferry__flow *f, uint32_t i, uint32_t *why)
{
    uint64_t others = credit_sum(f) - (f->w[i].active ? f->w[i].credits : 0);
    uint64_t budget;
    if (f->o.prefetch) {
        budget = f->o.prefetch;
        *why = FERRY_SIZED_USER;
    } else {
        budget = window_top(f, why) / 2;
    }
    uint64_t room = budget > others ? budget - others : 0;
    if (room >= f->o.max_credits) {
        room = f->o.max_credits;
        *why = FERRY_SIZED_LIMIT;
    }
    return room < f->o.auto_credits ? f->o.auto_credits : (uint32_t)room;
}

void ferry__flow_batch_bytes(ferry__flow *f, uint64_t bytes)
{
    uint64_t n = bytes ? f->o.memory / bytes : UINT32_MAX;
    f->mem_window = n < UINT32_MAX ? (uint32_t)n : UINT32_MAX;
    size_window(f);
}

static void new_period(fworker *w, uint64_t now_ns)
{
    w->start_ns = now_ns;
    w->make_sum_ns = 0;
    w->min_rt_ns = UINT64_MAX;
    w->replies = 0;
    w->full = 0;
}

void ferry__flow_join(ferry__flow *f, uint32_t i, uint64_t now_ns, int slots)
{
    fworker *w = &f->w[i];
    *w = (fworker){.active = 1,
                   .slots = slots != 0,
                   .credits = f->o.credits ? f->o.credits : f->o.auto_credits,
                   .why = f->o.credits ? FERRY_SIZED_USER : FERRY_SIZED_DEFAULT,
                   .hold_ns = HOLD_FIRST_NS,
                   .probe_ns = PROBE_FIRST_NS};
    new_period(w, now_ns);
    size_window(f);
}

void ferry__flow_leave(ferry__flow *f, uint32_t i)
{
    f->w[i].active = 0;
    size_window(f);
}

static void set_credits(ferry__flow *f, fworker *w, uint32_t c, uint32_t why)
{
    w->credits = c;
    w->why = c != f->o.auto_credits ? why : FERRY_SIZED_DEFAULT;
    size_window(f);
}

/* The period after a change says whether it stays; m: its mean build. */
static void judge(ferry__flow *f, fworker *w, uint64_t now_ns, double busy, int bound, uint64_t m)
{
    int change = w->pending;
    w->pending = CHANGE_NONE;
    if (change == CHANGE_RAISED) {
        w->gained = !bound && busy >= w->busy_before + GAIN;
        if (!bound && !w->gained && busy < BUSY_ENOUGH) {
            /* It did not help: the link or the host is what limits. */
            set_credits(f, w, w->from, FERRY_SIZED_NEED);
            w->hold_until_ns = now_ns + w->hold_ns;
            w->hold_ns = w->hold_ns * 2 < HOLD_MAX_NS ? w->hold_ns * 2 : HOLD_MAX_NS;
            return;
        }
        w->hold_ns = HOLD_FIRST_NS;
        w->probe_at_ns = now_ns + w->probe_ns;
    } else if (change == CHANGE_PROBED || change == CHANGE_LOWERED) {
        /* Below the automatic credits, a trainer that set the pace meanwhile
         * does not excuse a fall, but a quick round trip does: the link
         * costs what its quickest trip takes, and the rest of a fall is
         * the host's. */
        int fell = busy < w->busy_before - GAIN;
        if (change == CHANGE_LOWERED)
            fell = fell && (double)w->min_rt_ns >= LOWERED_COST * (double)m;
        else
            fell = fell && !bound;
        if (fell) {
            /* One fewer starves it: back, and the next probe later. */
            set_credits(f, w, w->from, FERRY_SIZED_NEED);
            w->probe_ns = w->probe_ns * 2 < PROBE_MAX_NS ? w->probe_ns * 2 : PROBE_MAX_NS;
            w->probe_at_ns = now_ns + w->probe_ns;
        } else {
            w->probe_at_ns = now_ns; /* it did as well: one fewer again */
        }
    }
}

/* The end of worker w's period: at most one change. Returns 1 on one. */
static int decide(ferry__flow *f, uint32_t i, uint64_t now_ns)
{
    fworker *w = &f->w[i];
    uint64_t span = now_ns - w->start_ns;
    double busy = span ? (double)w->make_sum_ns / (double)span : 1.0;
    uint64_t m = w->make_sum_ns / w->replies;
    if (m < 1000)
        m = 1000;
    int bound = w->full * WINDOW_BOUND >= w->replies;
    uint32_t before = w->credits;
    /* It idled at some point: some task found it waiting, and that task's
     * flight less its build is the round trip. Two such periods in a row
     * are asked for, and the larger minimum taken: a period in which the
     * link changed mixes tasks of both, and its minimum is neither. */
    uint64_t idle_min = busy < BUSY_ENOUGH && w->min_rt_ns != UINT64_MAX ? w->min_rt_ns + 1 : 0;
    int measured = idle_min && w->idle_min_ns;
    if (measured)
        w->rtt_ns = idle_min > w->idle_min_ns ? idle_min : w->idle_min_ns;
    w->idle_min_ns = idle_min;
    if (f->o.credits)
        return 0;
    if (w->pending) {
        judge(f, w, now_ns, busy, bound, m);
    } else if (w->slots && busy >= BUSY_ENOUGH && w->credits == f->o.auto_credits && w->credits > 1 &&
               m >= SLOW_MAKE_NS && now_ns >= w->probe_at_ns) {
        /* Slow batches: the task being built may be all it needs. Judged
         * like any probe: back if busy falls (a remote worker's round
         * trip), the next try later each time. Whether the window is full
         * does not matter here: with prefetch at the workers' credits
         * (Python workers: torch's 2 per worker) it is always full while
         * they build, and a task fewer at each frees it. */
        w->pending = CHANGE_LOWERED;
        w->from = w->credits;
        w->busy_before = busy;
        set_credits(f, w, w->credits - 1, FERRY_SIZED_NEED);
    } else if (bound) {
        /* The trainer sets the pace: more credits would not be used. */
    } else if (measured && now_ns >= w->hold_until_ns) {
        uint64_t need = 1 + (w->rtt_ns + m / 4 + m - 1) / m;
        if (w->gained && need <= w->credits)
            need = w->credits + 1; /* the last raise helped: one more */
        uint32_t why = FERRY_SIZED_NEED, room = credit_room(f, i, &why);
        uint32_t c = need < room ? (uint32_t)need : room;
        if (need > room)
            w->why = why; /* wanted more than the bounds allow */
        if (c > w->credits) {
            w->pending = CHANGE_RAISED;
            w->from = w->credits;
            w->busy_before = busy;
            set_credits(f, w, c, need > room ? why : FERRY_SIZED_NEED);
        }
    } else if (busy >= BUSY_ENOUGH && w->credits > f->o.auto_credits && w->probe_at_ns &&
               now_ns >= w->probe_at_ns) {
        w->pending = CHANGE_PROBED;
        w->from = w->credits;
        w->busy_before = busy;
        set_credits(f, w, w->credits - 1, w->why);
    }
    return w->credits != before;
}

int ferry__flow_reply(ferry__flow *f, uint32_t i, uint64_t now_ns, uint64_t make_ns,
                      uint64_t flight_ns, int window_full)
{
    fworker *w = &f->w[i];
    if (!w->active)
        return 0;
    uint64_t rt = flight_ns > make_ns ? flight_ns - make_ns : 0;
    w->make_sum_ns += make_ns;
    if (rt < w->min_rt_ns)
        w->min_rt_ns = rt;
    w->replies++;
    w->full += window_full != 0;
    uint64_t span = now_ns - w->start_ns;
    if (!(w->replies >= PERIOD_REPLIES && span >= PERIOD_NS) &&
        !(w->replies >= 2 && span >= PERIOD_MAX_NS))
        return 0;
    int changed = decide(f, i, now_ns);
    new_period(w, now_ns);
    return changed;
}

uint32_t ferry__flow_credits(const ferry__flow *f, uint32_t i)
{
    return f->w[i].credits;
}

uint32_t ferry__flow_window(const ferry__flow *f)
{
    return f->window;
}

uint32_t ferry__flow_round_trip_ms(const ferry__flow *f, uint32_t i)
{
    uint64_t ms = (f->w[i].rtt_ns + MS - 1) / MS;
    return ms < UINT32_MAX ? (uint32_t)ms : UINT32_MAX;
}

void ferry__flow_summary_get(const ferry__flow *f, ferry__flow_summary *out)
{
    *out = (ferry__flow_summary){.window = f->window, .window_why = f->window_why};
    uint32_t lo = UINT32_MAX, hi = 0, why = f->o.credits ? FERRY_SIZED_USER : FERRY_SIZED_DEFAULT;
    uint64_t rtt = 0;
    for (uint32_t i = 0; i < f->o.nworkers; i++) {
        const fworker *w = &f->w[i];
        if (!w->active)
            continue;
        lo = w->credits < lo ? w->credits : lo;
        hi = w->credits > hi ? w->credits : hi;
        rtt = w->rtt_ns > rtt ? w->rtt_ns : rtt;
        /* The bound that held a worker back says more than a raise. */
        if (w->why == FERRY_SIZED_MEMORY || w->why == FERRY_SIZED_LIMIT ||
            (w->why == FERRY_SIZED_NEED && why == FERRY_SIZED_DEFAULT))
            why = w->why;
    }
    if (hi == 0) /* no worker ready: what one would start with */
        lo = hi = f->o.credits ? f->o.credits : f->o.auto_credits;
    out->credits_min = lo;
    out->credits_max = hi;
    out->credits_why = why;
    out->round_trip_us = (uint32_t)(rtt / 1000 < UINT32_MAX ? rtt / 1000 : UINT32_MAX);
}

const char *ferry_sized_name(int why)
{
    static const char *const names[] = {"default", "user", "need", "memory", "limit"};
    return why >= 0 && why < (int)(sizeof names / sizeof names[0]) ? names[why] : "?";
}
