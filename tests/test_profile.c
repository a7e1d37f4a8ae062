/*
 * test_profile.c - the stage figures' arithmetic and the verdict, on
 * figures made up for each case (the verdict is a pure function of them);
 * python/tests/test_profile.py builds each case with real loaders.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ferry.h"
#include "profile.h"

#define MS 1000000ull

/* n batches of `ns` each into stage k. */
static void put(ferry_profile *p, int k, uint64_t n, uint64_t ns)
{
    p->stage[k].count += n;
    p->stage[k].sum_ns += n * ns;
    p->stage[k].buckets[ferry__profile_bucket(ns)] += n;
}

/* A worker's figures over a 10 s span: n batches of make, transit, order
 * and held, the trainer's wait for them and its step. */
static void batches(ferry_profile *w, uint64_t n, uint64_t make, uint64_t transit, uint64_t order,
                    uint64_t held, uint64_t wait, uint64_t step)
{
    w->version = FERRY_PROFILE_VERSION;
    w->in_order = 1;
    w->start_ns = 1000 * MS;
    w->end_ns = 11000 * MS;
    put(w, FERRY_STAGE_MAKE, n, make);
    put(w, FERRY_STAGE_TRANSIT, n, transit);
    put(w, FERRY_STAGE_ORDER, n, order);
    put(w, FERRY_STAGE_HELD, n, held);
    put(w, FERRY_STAGE_WAIT, n, wait);
    put(w, FERRY_STAGE_STEP, n, step);
}

/* The loader's figures: the sum of its workers'. */
static void total(ferry_profile *all, const ferry_profile *w, uint32_t n)
{
    memset(all, 0, sizeof *all);
    all->version = FERRY_PROFILE_VERSION;
    all->worker = -1;
    all->workers = n;
    all->workers_ready = n;
    all->in_order = 1;
    all->start_ns = w[0].start_ns;
    all->end_ns = w[0].end_ns;
    for (uint32_t i = 0; i < n; i++) {
        for (int k = 0; k < FERRY_PROFILE_STAGES; k++) {
            all->stage[k].count += w[i].stage[k].count;
            all->stage[k].sum_ns += w[i].stage[k].sum_ns;
            for (int b = 0; b < FERRY_PROFILE_BUCKETS; b++)
                all->stage[k].buckets[b] += w[i].stage[k].buckets[b];
        }
    }
}

static ferry_verdict judge(const ferry_profile *w, uint32_t n, void (*adjust)(ferry_profile *))
{
    static ferry_profile all;
    total(&all, w, n);
    if (adjust)
        adjust(&all);
    ferry_verdict v;
    assert_int_equal(ferry_profile_verdict(&all, w, n, &v), FERRY_OK);
    print_message("  %s: %s\n", ferry_verdict_name(v.kind), v.text);
    return v;
}

static void test_buckets_cover_every_time_in_order(void **state)
{
    (void)state;
    assert_int_equal(ferry__profile_bucket(0), 0);
    assert_int_equal(ferry__profile_bucket(1023), 0);
    assert_int_equal(ferry__profile_bucket(1024), 1);
    assert_int_equal(ferry__profile_bucket(UINT64_MAX), FERRY_PROFILE_BUCKETS - 1);
    uint64_t values[] = {1, 1000, 1024, 1279, 1280, 5000, 1000000, 123456789, 10000000000ull};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        int b = ferry__profile_bucket(values[i]);
        assert_true(values[i] < ferry_profile_bucket_le(b));
        assert_true(b == 0 || values[i] >= ferry_profile_bucket_le(b - 1));
    }
    for (int b = 1; b < FERRY_PROFILE_BUCKETS; b++)
        assert_true(ferry_profile_bucket_le(b) > ferry_profile_bucket_le(b - 1));
}

static void test_quantiles_are_within_a_quarter_octave(void **state)
{
    (void)state;
    static ferry_profile p;
    memset(&p, 0, sizeof p);
    put(&p, FERRY_STAGE_MAKE, 90, 2 * MS);
    put(&p, FERRY_STAGE_MAKE, 10, 50 * MS);
    uint64_t p50 = ferry_profile_quantile(&p.stage[FERRY_STAGE_MAKE], 0.5);
    uint64_t p99 = ferry_profile_quantile(&p.stage[FERRY_STAGE_MAKE], 0.99);
    assert_true(p50 >= 2 * MS * 8 / 10 && p50 <= 2 * MS * 5 / 4);
    assert_true(p99 >= 50 * MS * 8 / 10 && p99 <= 50 * MS * 5 / 4);
    assert_int_equal(ferry_profile_quantile(&p.stage[FERRY_STAGE_STEP], 0.5), 0);
}

static void test_since_keeps_only_the_window(void **state)
{
    (void)state;
    static ferry_profile before, now, win;
    memset(&before, 0, sizeof before);
    put(&before, FERRY_STAGE_MAKE, 100, 1 * MS);
    before.end_ns = 5 * MS;
    now = before;
    put(&now, FERRY_STAGE_MAKE, 10, 40 * MS);
    now.end_ns = 9 * MS;
    ferry_profile_since(&win, &now, &before);
    assert_int_equal(win.stage[FERRY_STAGE_MAKE].count, 10);
    assert_int_equal(win.stage[FERRY_STAGE_MAKE].sum_ns, 400 * MS);
    assert_int_equal(win.start_ns, 5 * MS);
    assert_int_equal(win.end_ns, 9 * MS);
    uint64_t p50 = ferry_profile_quantile(&win.stage[FERRY_STAGE_MAKE], 0.5);
    assert_true(p50 >= 32 * MS && p50 <= 50 * MS);
    ferry_profile_since(&now, &now, &before); /* in place */
    assert_int_equal(now.stage[FERRY_STAGE_MAKE].count, 10);
}

static void test_verdict_waits_for_enough_batches(void **state)
{
    (void)state;
    static ferry_profile w[1];
    memset(w, 0, sizeof w);
    batches(&w[0], 3, 1 * MS, MS / 10, 0, 0, 1 * MS, 1 * MS);
    assert_int_equal(judge(w, 1, NULL).kind, FERRY_VERDICT_UNKNOWN);
}

static void test_verdict_trainer_bound_when_the_trainer_rarely_waits(void **state)
{
    (void)state;
    static ferry_profile w[2];
    memset(w, 0, sizeof w);
    /* 5 ms builds on 2 workers for a 20 ms step: the batches wait. */
    for (int i = 0; i < 2; i++)
        batches(&w[i], 250, 5 * MS, MS / 10, 0, 30 * MS, MS / 20, 20 * MS);
    ferry_verdict v = judge(w, 2, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_TRAINER);
    assert_true(v.wait_share < 0.1);
    assert_non_null(strstr(v.text, "not the problem"));
}

static void test_verdict_input_bound_says_how_many_workers_would_keep_up(void **state)
{
    (void)state;
    static ferry_profile w[2];
    memset(w, 0, sizeof w);
    /* 2 workers, 10 ms per batch, busy 9 s of the 10 s span; the trainer
     * steps in 2 ms: 5 workers make a batch per step. */
    for (int i = 0; i < 2; i++)
        batches(&w[i], 900, 10 * MS, MS / 2, 0, 0, 3 * MS, 2 * MS);
    ferry_verdict v = judge(w, 2, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_WORKERS);
    assert_int_equal(v.workers_needed, 5);
    assert_non_null(strstr(v.text, "about 5 workers"));
}

static void test_verdict_names_the_one_slow_worker(void **state)
{
    (void)state;
    static ferry_profile w[4];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 4; i++)
        batches(&w[i], 200, i == 2 ? 30 * MS : 5 * MS, MS / 10, 0, 0, i == 2 ? 20 * MS : MS,
                2 * MS);
    ferry_verdict v = judge(w, 4, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_SLOW_WORKER);
    assert_int_equal(v.worker, 2);
    assert_non_null(strstr(v.text, "worker 2"));
}

static void test_verdict_two_even_workers_are_not_slow(void **state)
{
    (void)state;
    static ferry_profile w[4];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 4; i++) /* 1.6x apart: within the factor */
        batches(&w[i], 200, i == 1 ? 8 * MS : 5 * MS, MS / 10, 0, 0, MS, 2 * MS);
    assert_int_not_equal(judge(w, 4, NULL).kind, FERRY_VERDICT_SLOW_WORKER);
}

static void test_verdict_names_the_one_worker_behind_a_slow_link(void **state)
{
    (void)state;
    static ferry_profile w[3];
    memset(w, 0, sizeof w);
    /* Equal 2 ms builds; worker 1's batches take 30 ms to come back
     * against 2 ms, and the trainer's waits are all for them. */
    for (int i = 0; i < 3; i++)
        batches(&w[i], 200, 2 * MS, i == 1 ? 30 * MS : 2 * MS, i == 1 ? 0 : 8 * MS, MS,
                i == 1 ? 10 * MS : 0, MS / 2);
    ferry_verdict v = judge(w, 3, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_SLOW_WORKER);
    assert_int_equal(v.worker, 1);
    assert_non_null(strstr(v.text, "worker 1's batches"));
    assert_non_null(strstr(v.text, "network"));
}

static void test_verdict_a_slow_link_the_trainer_does_not_wait_for_is_not_named(void **state)
{
    (void)state;
    static ferry_profile w[3];
    memset(w, 0, sizeof w);
    /* Worker 1's link is slow, but its batches are ready in time: the
     * trainer's waits (it waits: 4 ms a batch against a 2 ms step) are
     * spread evenly. */
    for (int i = 0; i < 3; i++)
        batches(&w[i], 200, 2 * MS, i == 1 ? 30 * MS : 2 * MS, 0, MS, 4 * MS, 2 * MS);
    assert_int_not_equal(judge(w, 3, NULL).kind, FERRY_VERDICT_SLOW_WORKER);
    /* Nor are sub-millisecond hand-offs 2x apart (local workers). */
    memset(w, 0, sizeof w);
    for (int i = 0; i < 3; i++)
        batches(&w[i], 200, 2 * MS, i == 1 ? MS / 2 : MS / 10, 0, MS, i == 1 ? 4 * MS : 0, 2 * MS);
    assert_int_not_equal(judge(w, 3, NULL).kind, FERRY_VERDICT_SLOW_WORKER);
}

static void test_verdict_order_bound_when_later_batches_wait_behind_a_late_one(void **state)
{
    (void)state;
    static ferry_profile w[4];
    memset(w, 0, sizeof w);
    /* Builds of 4 ms, a trainer waiting 6 ms per batch while 2.5 later
     * batches are ready on average (order 15 ms per batch). */
    for (int i = 0; i < 4; i++)
        batches(&w[i], 200, 4 * MS, MS / 10, 15 * MS, MS, 6 * MS, 2 * MS);
    ferry_verdict v = judge(w, 4, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_ORDER);
    assert_non_null(strstr(v.text, "in_order=False"));
}

static void out_of_order(ferry_profile *all)
{
    all->in_order = 0;
}

static void test_verdict_never_suggests_in_order_off_when_it_is_off(void **state)
{
    (void)state;
    static ferry_profile w[4];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 4; i++)
        batches(&w[i], 200, 4 * MS, MS / 10, 15 * MS, MS, 6 * MS, 2 * MS);
    assert_int_not_equal(judge(w, 4, out_of_order).kind, FERRY_VERDICT_ORDER);
}

static void test_verdict_network_bound_when_the_flight_dominates_idle_workers(void **state)
{
    (void)state;
    static ferry_profile w[2];
    memset(w, 0, sizeof w);
    /* 1 ms builds, 9 ms in transit, 500 batches each in 10 s: idle. */
    for (int i = 0; i < 2; i++)
        batches(&w[i], 500, 1 * MS, 9 * MS, 0, 0, 8 * MS, 2 * MS);
    ferry_verdict v = judge(w, 2, NULL);
    assert_int_equal(v.kind, FERRY_VERDICT_NETWORK);
}

static void memory_held(ferry_profile *all)
{
    all->prefetch_why = FERRY_SIZED_MEMORY;
}

static void test_verdict_memory_bound_when_the_window_cannot_grow(void **state)
{
    (void)state;
    static ferry_profile w[2];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 2; i++)
        batches(&w[i], 500, 1 * MS, 9 * MS, 0, 0, 8 * MS, 2 * MS);
    ferry_verdict v = judge(w, 2, memory_held);
    assert_int_equal(v.kind, FERRY_VERDICT_MEMORY);
    assert_non_null(strstr(v.text, "shm_max_bytes"));
}

static void test_profile_of_a_running_loader_adds_up(void **state)
{
    (void)state;
    ferry_config *cfg = ferry_config_new();
    assert_non_null(cfg);
    assert_int_equal(ferry_config_set(cfg, "dataset", "synthetic:n=64,dim=4,sleep_us=1000"),
                     FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "batch_size", 4), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "workers", 2), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
    ferry_loader *ld;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    ferry_config_free(cfg);
    uint64_t latency = 0;
    ferry_batch *b;
    int n = 0;
    while (ferry_loader_next(ld, &b) == FERRY_OK) {
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        latency += info.flight_ns + info.ready_ns;
        ferry_batch_release(b);
        n++;
    }
    assert_int_equal(n, 16);
    static ferry_profile all, w0, w1;
    assert_int_equal(ferry_loader_profile(ld, -1, &all), FERRY_OK);
    assert_int_equal(ferry_loader_profile(ld, 0, &w0), FERRY_OK);
    assert_int_equal(ferry_loader_profile(ld, 1, &w1), FERRY_OK);
    assert_int_equal(ferry_loader_profile(ld, 2, &w1), FERRY_EINVAL);
    assert_int_equal(ferry_loader_profile(ld, 1, &w1), FERRY_OK);
    assert_int_equal(all.version, FERRY_PROFILE_VERSION);
    assert_int_equal(all.stage[FERRY_STAGE_MAKE].count, 16);
    assert_int_equal(w0.stage[FERRY_STAGE_MAKE].count + w1.stage[FERRY_STAGE_MAKE].count, 16);
    assert_int_equal(all.stage[FERRY_STAGE_STEP].count, 15);
    uint64_t stages = 0;
    for (int k = FERRY_STAGE_MAKE; k <= FERRY_STAGE_HELD; k++)
        stages += all.stage[k].sum_ns;
    /* The four stages are the batch's dispatch-to-delivery, split. */
    assert_true(stages <= latency + latency / 100 && stages + latency / 100 >= latency);
    assert_true(all.stage[FERRY_STAGE_MAKE].sum_ns >= 16 * MS);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_cover_every_time_in_order),
        cmocka_unit_test(test_quantiles_are_within_a_quarter_octave),
        cmocka_unit_test(test_since_keeps_only_the_window),
        cmocka_unit_test(test_verdict_waits_for_enough_batches),
        cmocka_unit_test(test_verdict_trainer_bound_when_the_trainer_rarely_waits),
        cmocka_unit_test(test_verdict_input_bound_says_how_many_workers_would_keep_up),
        cmocka_unit_test(test_verdict_names_the_one_slow_worker),
        cmocka_unit_test(test_verdict_two_even_workers_are_not_slow),
        cmocka_unit_test(test_verdict_names_the_one_worker_behind_a_slow_link),
        cmocka_unit_test(test_verdict_a_slow_link_the_trainer_does_not_wait_for_is_not_named),
        cmocka_unit_test(test_verdict_order_bound_when_later_batches_wait_behind_a_late_one),
        cmocka_unit_test(test_verdict_never_suggests_in_order_off_when_it_is_off),
        cmocka_unit_test(test_verdict_network_bound_when_the_flight_dominates_idle_workers),
        cmocka_unit_test(test_verdict_memory_bound_when_the_window_cannot_grow),
        cmocka_unit_test(test_profile_of_a_running_loader_adds_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
