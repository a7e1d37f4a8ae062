/*
 * ferry-profile-cost - what the trainer's thread pays a delivered batch
 * for the profile's figures, with the trace off and on.
 *
 * The loader's own bookkeeping (core/profile.c) is called as next() calls
 * it, on batches timed by the clock as next() times them (half arrived
 * before the call, half during it), 2 x 10^7 times a run; the best of
 * five runs is taken for each side, the sides alternating. The figures
 * include two clock reads a batch, as next() has. It answers the
 * one part of the exports' cost that a throughput A/B on a small, shared
 * machine cannot resolve (a few ns against a batch of 70 us); the other
 * part, serving the metrics endpoint, `python -m ferry.bench --pipeline
 * exports` measures as the server's own CPU time. Not installed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "clock.h"
#include "profile.h"

enum { CALLS = 20 * 1000 * 1000, RUNS = 5, TRACE_BATCHES = 20000 };

static double ns_a_batch(int trace)
{
    static union {
        ferry_batch b;
        char room[sizeof(ferry_batch) + 64];
    } mem;
    ferry_batch *b = &mem.b;
    ferry__profile *p;
    if (ferry__profile_new(&p, 2, 1) != FERRY_OK ||
        (trace && ferry__profile_trace(p, TRACE_BATCHES) != FERRY_OK)) {
        fprintf(stderr, "ferry-profile-cost: %s\n", ferry_last_error());
        exit(1);
    }
    double best = 1e30;
    for (int run = 0; run < RUNS; run++) {
        uint64_t t0 = ferry__now_ns();
        for (uint32_t i = 0; i < CALLS; i++) {
            /* As next() sees batches: every other one had arrived before
             * the call began (its wait split by the calls kept: the order
             * stage's search), the others arrive during it; the window
             * reads the clock as it hands one out (ready_ns ends then). */
            ferry__profile_enter(p);
            uint64_t now = ferry__now_ns();
            b->info.seq = i;
            b->info.worker = i & 1;
            b->arrived_ns = (i & 1) ? now - 5000 : now;
            b->info.make_ns = 50000 + (i & 1023);
            b->info.flight_ns = 60000 + (i & 511);
            b->info.ready_ns = ferry__now_ns() - b->arrived_ns;
            ferry__profile_delivered(p, b);
        }
        double ns = (double)(ferry__now_ns() - t0) / CALLS;
        if (ns < best)
            best = ns;
    }
    ferry__profile_free(p);
    return best;
}

int main(void)
{
    for (int round = 0; round < 3; round++) {
        double off = ns_a_batch(0), on = ns_a_batch(1);
        printf("round %d: trace off %.1f ns a batch, on (last %d batches kept) %.1f ns: "
               "the trace adds %.1f ns\n",
               round + 1, off, TRACE_BATCHES, on, on - off);
    }
    return 0;
}
