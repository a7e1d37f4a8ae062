/*
 * verdict.c - reading the stage figures (profile.h): quantiles, windows
 * of time, and the verdict, one sentence a user can act on.
 *
 * Everything here is a pure function of its arguments, so the verdict is
 * tested with figures made up for each case (tests/test_profile.c).
 *
 * The verdict, in the order it is decided:
 *  1. too few batches: say nothing yet;
 *  2. the trainer waits under a tenth of its time in next(): trainer-bound;
 *  3. one worker's build (make p50) over twice the others' median: name it;
 *     or one worker's batches queued and in transit (transit p50) over
 *     twice the others' median and a millisecond more, while over half
 *     the trainer's waiting is for its batches: name it too (a host
 *     behind a slow link, or a loaded one);
 *  4. in order, with a later batch or more ready on average while the
 *     trainer waits: order-bound (in_order=False);
 *  5. the workers busy most of the time: input-bound, and how many workers
 *     would make a batch per step (make / step);
 *  6. the window or credits held down by memory or the hard limit;
 *  7. the workers idle and the flight longer than the build: network-bound
 *     (for local workers the "network" is the hand-off between processes);
 *  8. otherwise input-bound, cause unknown.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "ferry.h"

#define MIN_BATCHES 8
#define TRAINER_BOUND 0.10 /* below this share of its time waiting */
#define SLOW_FACTOR 2.0
#define SLOW_LINK_NS 1000000ull /* and a slow link adds at least this much */
#define SLOW_LINK_WAIT 0.5      /* of the trainer's waiting, for its batches */
#define BUSY 0.70
#define ORDER_READY 1.0 /* later batches ready on average while the trainer waits */

const char *ferry_stage_name(int stage)
{
    static const char *const names[FERRY_STAGE_COUNT] = {"make", "transit", "order",
                                                          "held", "wait",    "step"};
    return stage >= 0 && stage < FERRY_STAGE_COUNT ? names[stage] : "?";
}

const char *ferry_verdict_name(int kind)
{
    static const char *const names[] = {"unknown",      "trainer-bound", "input-bound",
                                        "slow-worker",  "order-bound",   "network-bound",
                                        "memory-bound", "input-bound"};
    return kind >= 0 && kind < (int)(sizeof names / sizeof names[0]) ? names[kind] : "?";
}

static uint64_t bucket_lower(int i)
{
    if (i <= 0)
        return 0;
    int m = 10 + (i - 1) / 4;
    return (UINT64_C(1) << m) + (uint64_t)((i - 1) % 4) * (UINT64_C(1) << (m - 2));
}

uint64_t ferry_profile_bucket_le(int i)
{
    if (i < 0)
        return 0;
    return i >= FERRY_PROFILE_BUCKETS - 1 ? UINT64_MAX : bucket_lower(i + 1);
}

uint64_t ferry_profile_quantile(const ferry_profile_stage *s, double q)
{
    uint64_t total = 0;
    for (int i = 0; i < FERRY_PROFILE_BUCKETS; i++)
        total += s->buckets[i];
    if (!total)
        return 0;
    q = q < 0 ? 0 : q > 1 ? 1 : q;
    double target = q * (double)total, cum = 0;
    for (int i = 0; i < FERRY_PROFILE_BUCKETS; i++) {
        double n = (double)s->buckets[i];
        if (n > 0 && cum + n >= target) {
            double lo = (double)bucket_lower(i);
            double hi = i == FERRY_PROFILE_BUCKETS - 1 ? lo * 1.25 : (double)bucket_lower(i + 1);
            return (uint64_t)(lo + (hi - lo) * ((target - cum) / n));
        }
        cum += n;
    }
    return bucket_lower(FERRY_PROFILE_BUCKETS - 1);
}

static uint64_t minus(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

void ferry_profile_since(ferry_profile *out, const ferry_profile *now, const ferry_profile *before)
{
    if (out != now)
        *out = *now;
    out->start_ns = before->end_ns;
    for (int k = 0; k < FERRY_PROFILE_STAGES; k++) {
        ferry_profile_stage *o = &out->stage[k];
        const ferry_profile_stage *b = &before->stage[k];
        o->count = minus(o->count, b->count);
        o->sum_ns = minus(o->sum_ns, b->sum_ns);
        for (int i = 0; i < FERRY_PROFILE_BUCKETS; i++)
            o->buckets[i] = minus(o->buckets[i], b->buckets[i]);
    }
}

/* ------------------------------------------------------------------------
 * The verdict
 */

static double mean_ms(const ferry_profile_stage *s)
{
    return s->count ? (double)s->sum_ns / (double)s->count / 1e6 : 0;
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The worker whose p50 of `stage` is over SLOW_FACTOR times the median
 * of the others' (of workers with MIN_BATCHES / 2 batches) and at least
 * `floor` ns above it, or -1; its p50 and the others' median in *slow,
 * *others. */
static int32_t slow_worker(const ferry_profile *w, uint32_t n, int stage, uint64_t floor,
                           uint64_t *slow, uint64_t *others)
{
    uint64_t *p50 = malloc((n ? n : 1) * sizeof *p50);
    if (!p50)
        return -1;
    uint32_t m = 0;
    int32_t worst = -1;
    uint64_t worst_p50 = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (w[i].stage[FERRY_STAGE_MAKE].count < MIN_BATCHES / 2)
            continue;
        uint64_t q = ferry_profile_quantile(&w[i].stage[stage], 0.5);
        if (worst < 0 || q > worst_p50) {
            if (worst >= 0)
                p50[m++] = worst_p50;
            worst = (int32_t)i;
            worst_p50 = q;
        } else {
            p50[m++] = q;
        }
    }
    int32_t found = -1;
    if (worst >= 0 && m >= 1) {
        qsort(p50, m, sizeof *p50, cmp_u64);
        uint64_t med = m % 2 ? p50[m / 2] : (p50[m / 2 - 1] + p50[m / 2]) / 2;
        if ((double)worst_p50 > SLOW_FACTOR * (double)med && worst_p50 >= med + floor) {
            found = worst;
            *slow = worst_p50;
            *others = med;
        }
    }
    free(p50);
    return found;
}

int ferry_profile_verdict(const ferry_profile *all, const ferry_profile *per_worker, uint32_t n,
                          ferry_verdict *out)
{
    if (!all || !out || (n && !per_worker))
        return ferry__seterr(FERRY_EINVAL, "all and out must not be NULL, nor per_worker "
                                           "when n > 0");
    memset(out, 0, sizeof *out);
    out->worker = -1;
    const ferry_profile_stage *st = all->stage;
    uint64_t batches = st[FERRY_STAGE_WAIT].count;
    uint64_t wait = st[FERRY_STAGE_WAIT].sum_ns, step = st[FERRY_STAGE_STEP].sum_ns;
    if (batches < MIN_BATCHES || st[FERRY_STAGE_STEP].count < MIN_BATCHES / 2 ||
        wait + step == 0) {
        out->kind = FERRY_VERDICT_UNKNOWN;
        snprintf(out->text, sizeof out->text,
                 "Too few batches (%llu) to say where the time goes yet.",
                 (unsigned long long)batches);
        return FERRY_OK;
    }
    double share = (double)wait / (double)(wait + step);
    out->wait_share = share;
    double wait_ms = mean_ms(&st[FERRY_STAGE_WAIT]), step_ms = mean_ms(&st[FERRY_STAGE_STEP]);
    double make_ms = mean_ms(&st[FERRY_STAGE_MAKE]);
    double transit_ms = mean_ms(&st[FERRY_STAGE_TRANSIT]);
    if (share < TRAINER_BOUND) {
        out->kind = FERRY_VERDICT_TRAINER;
        snprintf(out->text, sizeof out->text,
                 "Trainer-bound: the trainer waits %.1f%% of its time in next() (%.3f ms per "
                 "batch against a %.3f ms step); the loader is not the problem.",
                 share * 100, wait_ms, step_ms);
        return FERRY_OK;
    }

    uint64_t slow = 0, others = 0;
    int32_t sw = slow_worker(per_worker, n, FERRY_STAGE_MAKE, 0, &slow, &others);
    if (sw >= 0) {
        out->kind = FERRY_VERDICT_SLOW_WORKER;
        out->worker = sw;
        double waited = wait ? (double)per_worker[sw].stage[FERRY_STAGE_WAIT].sum_ns / (double)wait
                             : 0;
        snprintf(out->text, sizeof out->text,
                 "One slow worker: worker %d takes %.3f ms to make a batch (p50), %.1fx the "
                 "others' %.3f ms, and %.0f%% of the trainer's waiting is for its batches; look "
                 "at what differs there (its host, its disk, its items).",
                 sw, ms(slow), (double)slow / (double)(others ? others : 1), ms(others),
                 waited * 100);
        return FERRY_OK;
    }
    sw = slow_worker(per_worker, n, FERRY_STAGE_TRANSIT, SLOW_LINK_NS, &slow, &others);
    double waited = sw >= 0 && wait
                        ? (double)per_worker[sw].stage[FERRY_STAGE_WAIT].sum_ns / (double)wait
                        : 0;
    if (sw >= 0 && waited > SLOW_LINK_WAIT) {
        out->kind = FERRY_VERDICT_SLOW_WORKER;
        out->worker = sw;
        snprintf(out->text, sizeof out->text,
                 "One slow link: worker %d's batches spend %.3f ms queued and in transit (p50), "
                 "%.1fx the others' %.3f ms, for %.3f ms of building, and %.0f%% of the "
                 "trainer's waiting is for them; look at the network to its host (or at its "
                 "load).",
                 sw, ms(slow), (double)slow / (double)(others ? others : 1), ms(others),
                 mean_ms(&per_worker[sw].stage[FERRY_STAGE_MAKE]), waited * 100);
        return FERRY_OK;
    }

    double ready_during_wait = wait ? (double)st[FERRY_STAGE_ORDER].sum_ns / (double)wait : 0;
    if (all->in_order && ready_during_wait >= ORDER_READY) {
        out->kind = FERRY_VERDICT_ORDER;
        snprintf(out->text, sizeof out->text,
                 "Order-bound: the trainer waits %.0f%% of its time in next() for late "
                 "batches while %.1f later ones are ready on average; in_order=False would hand "
                 "them out as they come.",
                 share * 100, ready_during_wait);
        return FERRY_OK;
    }

    uint32_t active = 0;
    for (uint32_t i = 0; i < n; i++)
        active += per_worker[i].stage[FERRY_STAGE_MAKE].count > 0;
    if (!active)
        active = all->workers_ready ? all->workers_ready : 1;
    double span = all->end_ns > all->start_ns ? (double)(all->end_ns - all->start_ns) : 1;
    double busy = (double)st[FERRY_STAGE_MAKE].sum_ns / (span * active);
    if (busy >= BUSY) {
        double need = step_ms > 0 ? ceil(make_ms / step_ms) : active + 1;
        if (need <= active)
            need = active + 1;
        out->kind = FERRY_VERDICT_WORKERS;
        out->workers_needed = (uint32_t)need;
        snprintf(out->text, sizeof out->text,
                 "Input-bound, the workers busy: the trainer waits %.0f%% of its time; %u "
                 "workers are busy %.0f%% of theirs, making a batch in %.3f ms against a "
                 "%.3f ms step; about %u workers (or hosts' worth) would keep up.",
                 share * 100, active, busy * 100, make_ms, step_ms, out->workers_needed);
        return FERRY_OK;
    }

    if (all->prefetch_why == FERRY_SIZED_MEMORY || all->credits_why == FERRY_SIZED_MEMORY ||
        all->prefetch_why == FERRY_SIZED_LIMIT || all->credits_why == FERRY_SIZED_LIMIT) {
        int mem = all->prefetch_why == FERRY_SIZED_MEMORY ||
                  all->credits_why == FERRY_SIZED_MEMORY;
        out->kind = FERRY_VERDICT_MEMORY;
        snprintf(out->text, sizeof out->text,
                 "%s: the trainer waits %.0f%% of its time and the workers are idle %.0f%% of "
                 "theirs, because the window (or the workers' credits) cannot grow %s.",
                 mem ? "Memory-bound" : "Slot-bound", share * 100, (1 - busy) * 100,
                 mem ? "past shm_max_bytes' worth of batches: raise shm_max_bytes"
                     : "past the hard limit (1024 batches, 64 credits)");
        return FERRY_OK;
    }

    if (transit_ms > make_ms) {
        out->kind = FERRY_VERDICT_NETWORK;
        snprintf(out->text, sizeof out->text,
                 "Network-bound: a batch spends %.3f ms queued and in transit (the network, or "
                 "the hand-off between processes) for %.3f ms of building, the workers are idle "
                 "%.0f%% of the time and the trainer waits %.0f%% of its; bigger batches spread "
                 "the hand-off, nearer hosts shorten the network.",
                 transit_ms, make_ms, (1 - busy) * 100, share * 100);
        return FERRY_OK;
    }
    out->kind = FERRY_VERDICT_INPUT;
    snprintf(out->text, sizeof out->text,
             "Input-bound: the trainer waits %.0f%% of its time but the workers are busy only "
             "%.0f%% of theirs (%.3f ms to make a batch, %.3f ms in transit); a deeper window "
             "(prefetch, credits) may help.",
             share * 100, busy * 100, make_ms, transit_ms);
    return FERRY_OK;
}
