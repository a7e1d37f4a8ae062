/*
 * test_profile_remote.c - the stage figures and the verdict (profile.h,
 * verdict.c) against times known from outside ferry: remote workers
 * (ferry-worker daemons on this host, plain TCP) reached through relays
 * that hold every byte a set time each way (tools/bench/relay.c), a
 * dataset that sleeps a known time per batch (synthetic sleep_us), and a
 * trainer that times its own waits and steps on its own clock.
 *
 * What the design guarantees, and so what is asserted:
 *  - with one batch in flight, the next is dispatched as the trainer takes
 *    the last one, so the time between two deliveries, on the trainer's
 *    clock, is the later batch's dispatch-to-delivery: the four stages
 *    (make, transit, order, held) add up to it;
 *  - make is at least the dataset's sleep, transit at least the relay's
 *    round trip (it holds the task one way and the batch the other);
 *  - the trainer's wait and step stages are the times it measured itself.
 * Margins are 5% for sums (the acceptance of issue #40) and generous
 * upper bounds for single stages: a loaded 2-core machine runs sleeps and
 * threads late, never early.
 *
 * Each case: ft_begin/ft_end (a hard time limit; afterwards no child, fd,
 * thread or file left behind), daemons stopped with SIGTERM and reaped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <time.h>

#include "ferry.h"
#include "harness.h"
#include "relay.h"

#define MS 1000000ull
#define N_ITEMS 4096
#define DIM 16
#define BATCH 8

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The trainer's step: a sleep of ns (the stage it shows up as is timed by
 * the trainer around it, not assumed). */
static void step(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0)
        ;
}

/* ------------------------------------------------------------------------
 * A loader bound on 127.0.0.1 and daemons, some behind a slow link
 */

typedef struct link {
    bench_relay *hello, *data; /* on 127.0.0.2 at the loader's two ports */
} link;

typedef struct rig {
    ft_snapshot snap;
    int port, data_port;
    char near_ep[64], far_ep[64]; /* 127.0.0.1 itself; 127.0.0.2, the relays */
    link far;
    int daemons[4], ndaemons;
} rig;

/* The loader's ports, and relays in front of them holding every byte
 * delay_us each way (a round trip of twice that). */
static void rig_begin(rig *r, unsigned limit_s, unsigned delay_us)
{
    memset(r, 0, sizeof *r);
    ft_begin(&r->snap, limit_s);
    r->port = ft_free_port();
    r->data_port = ft_free_port();
    assert_true(r->port > 0 && r->data_port > 0 && r->port != r->data_port);
    snprintf(r->near_ep, sizeof r->near_ep, "tcp://127.0.0.1:%d", r->port);
    snprintf(r->far_ep, sizeof r->far_ep, "tcp://127.0.0.2:%d", r->port);
    assert_int_equal(
        bench_relay_start(&r->far.hello, "127.0.0.2", r->port, "127.0.0.1", r->port, delay_us), 0);
    assert_int_equal(bench_relay_start(&r->far.data, "127.0.0.2", r->data_port, "127.0.0.1",
                                       r->data_port, delay_us),
                     0);
}

/* A ferry-worker daemon connecting to ep; its pid. */
static int rig_daemon(rig *r, const char *ep)
{
    const char *argv[] = {FERRY_TEST_WORKER, "--connect", ep, "--insecure", NULL};
    int pid = ft_spawn_tied(argv, -1);
    assert_true(pid > 0);
    r->daemons[r->ndaemons++] = pid;
    return pid;
}

/* A loader of `sleep_us` a batch waiting for `workers` remote workers. */
static ferry_loader *rig_open(rig *r, unsigned sleep_us, int workers, int prefetch, int credits)
{
    char spec[96], ep[64];
    snprintf(spec, sizeof spec, "synthetic:n=%d,dim=%d,sleep_us=%u", N_ITEMS, DIM, sleep_us);
    ferry_config *cfg = ft_config(spec, 0, BATCH);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", r->port);
    assert_int_equal(ferry_config_set(cfg, "bind", ep), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "insecure", 1), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "data_port", r->data_port), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "min_workers", workers), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "prefetch", prefetch), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "credits", credits), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "start_timeout_ms", 20000), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "close_grace_ms", 1000), FERRY_OK);
    return ft_open_ok(cfg);
}

static void rig_end(rig *r)
{
    for (int i = 0; i < r->ndaemons; i++)
        ft_stop_daemon(r->daemons[i]);
    bench_relay_stop(r->far.hello);
    bench_relay_stop(r->far.data);
    ft_end(&r->snap);
}

/* ------------------------------------------------------------------------
 * The trainer
 */

/* What the trainer measured on its own clock over its batches. */
typedef struct trainer {
    uint64_t batches;
    uint64_t between_ns; /* summed: one delivery to the next */
    uint64_t wait_ns;    /* summed: inside next() */
    uint64_t step_ns;    /* summed: from next() returning to the next call */
    uint64_t last_return;
} trainer;

/* Takes one batch (releasing it at once) and steps step_ns. */
static ferry_batch_info take(ferry_loader *ld, trainer *t, uint64_t step_ns)
{
    ferry_batch *b = NULL;
    uint64_t t0 = now_ns();
    int rc = ferry_loader_next(ld, &b);
    uint64_t t1 = now_ns();
    if (rc != FERRY_OK)
        fail_msg("next: %s: %s", ferry_err_name(rc), ferry_last_error());
    ft_assert_synthetic(b, DIM);
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    ferry_batch_release(b);
    if (t->last_return) {
        t->batches++;
        t->between_ns += t1 - t->last_return;
        t->wait_ns += t1 - t0;
        t->step_ns += t0 - t->last_return;
    }
    t->last_return = t1;
    step(step_ns);
    return info;
}

/* A span of the loader's figures: its start, all workers' and each
 * worker slot's (remote slots: max_remote of them). */
typedef struct span {
    ferry_profile all;
    ferry_profile *w;
    uint32_t n;
} span;

static void span_take(ferry_loader *ld, span *s)
{
    assert_int_equal(ferry_loader_profile(ld, -1, &s->all), FERRY_OK);
    s->n = s->all.workers;
    s->w = calloc(s->n, sizeof *s->w);
    assert_non_null(s->w);
    for (uint32_t i = 0; i < s->n; i++)
        assert_int_equal(ferry_loader_profile(ld, (int32_t)i, &s->w[i]), FERRY_OK);
}

/* The figures since `before` (freed) into *out, and their verdict. */
static ferry_verdict judge(ferry_loader *ld, span *before, span *out)
{
    span_take(ld, out);
    assert_int_equal(out->n, before->n);
    ferry_profile_since(&out->all, &out->all, &before->all);
    for (uint32_t i = 0; i < out->n; i++)
        ferry_profile_since(&out->w[i], &out->w[i], &before->w[i]);
    free(before->w);
    ferry_verdict v;
    assert_int_equal(ferry_profile_verdict(&out->all, out->w, out->n, &v), FERRY_OK);
    return v;
}

static double mean_ms(const ferry_profile *p, int stage)
{
    const ferry_profile_stage *s = &p->stage[stage];
    return s->count ? (double)s->sum_ns / (double)s->count / 1e6 : 0;
}

static double sum_ms(const ferry_profile *p, int stage)
{
    return (double)p->stage[stage].sum_ns / 1e6;
}

/* The mean of each stage, and the verdict unless v is NULL. */
static void print_stages(const char *what, const ferry_profile *p, const ferry_verdict *v)
{
    printf("%s: make %.3f, transit %.3f, order %.3f, held %.3f, wait %.3f, step %.3f ms a "
           "batch\n%s%s%s",
           what, mean_ms(p, FERRY_STAGE_MAKE), mean_ms(p, FERRY_STAGE_TRANSIT),
           mean_ms(p, FERRY_STAGE_ORDER), mean_ms(p, FERRY_STAGE_HELD),
           mean_ms(p, FERRY_STAGE_WAIT), mean_ms(p, FERRY_STAGE_STEP), v ? "  " : "",
           v ? v->text : "", v ? "\n" : "");
}

/* |a - b| within `rel` of b. */
static int within(double a, double b, double rel)
{
    return a >= b * (1 - rel) && a <= b * (1 + rel);
}

/* ------------------------------------------------------------------------
 * Cases
 */

/* One batch in flight to one host behind a 20 ms round trip, 4 ms to
 * make a batch, a 2 ms step: the next batch goes out as the trainer takes
 * the last, so the trainer's own clock sees each batch's dispatch to
 * delivery as the time between two deliveries. The stages add up to that
 * within 5%; make carries the dataset's sleep, transit the link's round
 * trip, wait and step what the trainer timed; the verdict: network-bound. */
static void test_stages_add_up_to_the_latency_the_trainer_measures(void **state)
{
    (void)state;
    enum { DELAY_US = 10000, SLEEP_US = 4000, STEP_NS = 2 * MS, BATCHES = 60 };
    rig r;
    rig_begin(&r, 120, DELAY_US);
    rig_daemon(&r, r.far_ep);
    ferry_loader *ld = rig_open(&r, SLEEP_US, 1, 1, 1);
    trainer t = {0};
    for (int i = 0; i < 4; i++) /* the link's first round trips, the daemon's start */
        take(ld, &t, STEP_NS);
    static span before, now;
    span_take(ld, &before);
    t = (trainer){.last_return = t.last_return};
    for (int i = 0; i < BATCHES; i++)
        take(ld, &t, STEP_NS);
    ferry_verdict v = judge(ld, &before, &now);
    const ferry_profile *p = &now.all;
    print_stages("one in flight over a 20 ms round trip", p, &v);
    double four = sum_ms(p, FERRY_STAGE_MAKE) + sum_ms(p, FERRY_STAGE_TRANSIT) +
                  sum_ms(p, FERRY_STAGE_ORDER) + sum_ms(p, FERRY_STAGE_HELD);
    double between = (double)t.between_ns / 1e6;
    printf("  the four stages add up to %.1f ms; the trainer saw %.1f ms between deliveries "
           "(%+.2f%%)\n",
           four, between, (four / between - 1) * 100);
    assert_int_equal(p->stage[FERRY_STAGE_MAKE].count, BATCHES);
    assert_true(within(four, between, 0.05));
    /* Known parts: the dataset's sleep, the link's round trip. */
    assert_true(mean_ms(p, FERRY_STAGE_MAKE) >= SLEEP_US / 1000.0);
    assert_true(mean_ms(p, FERRY_STAGE_MAKE) < 2 * SLEEP_US / 1000.0);
    assert_true(mean_ms(p, FERRY_STAGE_TRANSIT) >= 2 * DELAY_US / 1000.0);
    assert_true(mean_ms(p, FERRY_STAGE_TRANSIT) < 1.5 * 2 * DELAY_US / 1000.0);
    /* The trainer waited for each batch: none was ready before it asked. */
    assert_true(sum_ms(p, FERRY_STAGE_ORDER) + sum_ms(p, FERRY_STAGE_HELD) < 0.05 * four);
    /* The trainer's own timings. */
    assert_true(within(sum_ms(p, FERRY_STAGE_WAIT), (double)t.wait_ns / 1e6, 0.05));
    assert_true(within(sum_ms(p, FERRY_STAGE_STEP), (double)t.step_ns / 1e6, 0.05));
    assert_true(mean_ms(p, FERRY_STAGE_STEP) >= STEP_NS / 1e6);
    assert_int_equal(v.kind, FERRY_VERDICT_NETWORK);
    assert_non_null(strstr(v.text, "Network-bound"));
    free(now.w);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    rig_end(&r);
}

/* Two hosts, one next door and one behind a 30 ms round trip, each
 * building a batch in 2 ms with 2 credits, the trainer stepping 0.5 ms:
 * the far host's batches come late and the trainer waits for them. The
 * verdict names the far host's slot, whose host and pid are the far
 * daemon's. */
static void test_verdict_names_the_one_host_behind_a_slow_link(void **state)
{
    (void)state;
    enum { DELAY_US = 15000, SLEEP_US = 2000, STEP_NS = MS / 2, BATCHES = 200 };
    rig r;
    rig_begin(&r, 120, DELAY_US);
    int far = rig_daemon(&r, r.far_ep);
    int near = rig_daemon(&r, r.near_ep);
    ferry_loader *ld = rig_open(&r, SLEEP_US, 2, 0, 2);
    trainer t = {0};
    for (int i = 0; i < 8; i++)
        take(ld, &t, STEP_NS);
    static span before, now;
    span_take(ld, &before);
    for (int i = 0; i < BATCHES; i++)
        take(ld, &t, STEP_NS);
    ferry_verdict v = judge(ld, &before, &now);
    print_stages("two hosts, one behind a 30 ms round trip", &now.all, &v);
    for (uint32_t i = 0; i < now.n; i++) {
        if (now.w[i].stage[FERRY_STAGE_MAKE].count)
            print_stages("  a worker", &now.w[i], NULL);
    }
    free(now.w);
    assert_int_equal(v.kind, FERRY_VERDICT_SLOW_WORKER);
    char host[64] = "";
    int pid = 0;
    assert_int_equal(ferry_loader_worker_host(ld, (uint32_t)v.worker, host, sizeof host, &pid),
                     FERRY_OK);
    printf("  the verdict's worker %d: host %s, pid %d (far daemon %d, near %d)\n", v.worker, host,
           pid, far, near);
    assert_true(pid == far || ft_parent_of(pid) == far);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    rig_end(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_add_up_to_the_latency_the_trainer_measures),
        cmocka_unit_test(test_verdict_names_the_one_host_behind_a_slow_link),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
