/*
 * test_retire.c - workers replaced on purpose (options worker_max_rss_bytes
 * and max_batches_per_worker, core/retire.h): between batches, through the
 * path that replaces a dead worker, losing nothing and delivering nothing
 * twice, never counted as a failure, and memory held within the budget
 * plus one batch's growth.
 *
 * The leaking worker is the synthetic dataset's leak_kb: every item built
 * keeps that much written heap until the dataset closes. Each case runs
 * between ft_begin() and ft_end(): a hard time limit, then no child, fd,
 * thread or file left behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

/* Takes batches until the stream ends: each the next seq (from `first`),
 * intact, so every index comes exactly once and in order. After each,
 * looks at every worker's private memory (statm's resident less shared)
 * and keeps the most seen in *peak (NULL: not looked at). Returns how
 * many batches came. */
static uint64_t consume(ferry_loader *ld, uint64_t first, uint32_t workers, uint64_t *peak)
{
    uint64_t k = first;
    ferry_batch *b;
    int rc;
    long page = sysconf(_SC_PAGESIZE);
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ft_assert_synthetic(b, 0);
        ferry_batch_release(b);
        k++;
        for (uint32_t i = 0; peak && i < workers; i++) {
            int pid = 0;
            assert_int_equal(ferry_loader_worker_pid(ld, i, &pid), FERRY_OK);
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/statm", pid);
            FILE *f = pid ? fopen(path, "r") : NULL;
            unsigned long long size, resident, shared;
            /* Gone between the two calls (retired just now): nothing to see. */
            if (f && fscanf(f, "%llu %llu %llu", &size, &resident, &shared) == 3 &&
                (resident - shared) * (uint64_t)page > *peak)
                *peak = (resident - shared) * (uint64_t)page;
            if (f)
                fclose(f);
        }
    }
    if (rc != FERRY_EOF)
        print_error("next: %s: %s\n", ferry_err_name(rc), ferry_last_error());
    assert_int_equal(rc, FERRY_EOF);
    return k - first;
}

static ferry_config *make_cfg(int workers, int batch, const char *dataset)
{
    ferry_config *cfg = ft_config(dataset, workers, batch);
    assert_int_equal(ferry_config_set_int(cfg, "close_grace_ms", 300), FERRY_OK);
    return cfg;
}

/* max_batches_per_worker 10: every worker process answers 10 tasks and
 * retires; its replacement goes on. Under the fail policy with one
 * attempt per batch, so that anything charged as a failure would end the
 * run: none is. Every retirement is one info line, nothing is a
 * warning. */
static void test_max_batches_per_worker_replaces_workers_losing_nothing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    ferry_config *cfg = make_cfg(2, 8, "synthetic:n=400,dim=24,cost_us=20");
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 3), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "max_batches_per_worker", 10), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "on_worker_failure", "fail"), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "max_attempts", 1), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    int first_pid = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &first_pid), FERRY_OK);
    assert_int_equal(consume(ld, 0, 2, NULL), 3 * 50);
    ferry_stats st = ft_stats(ld);
    /* 150 tasks (and any sent twice) at 10 a process: all but the last
     * two processes retired. */
    assert_true(st.retirements >= 13);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.delivered, 150);
    /* The first process retired and is gone, unless it is still one of
     * the two now: which process gets how many tasks is the scheduler's,
     * and a process starved on a loaded machine may never reach 10. A
     * retired one has said BYE and exits within its 200 ms linger. This
     * check once failed on CI after 2 s (two tests at once beside a run of
     * PyTorch's suite; not reproduced in 27 runs beside CPU hogs): which
     * of the two it was is not known, so both are allowed for, the exit
     * with 10 s. */
    int now0 = 0, now1 = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &now0), FERRY_OK);
    assert_int_equal(ferry_loader_worker_pid(ld, 1, &now1), FERRY_OK);
    if (first_pid != now0 && first_pid != now1)
        assert_true(ft_wait_gone(first_pid, 10000) >= 0);
    ft_close_within(ld, 5000);

    for (int i = 0; i < cap.n; i++)
        print_message("[%s] %s\n", ferry_log_level_name(cap.level[i]), cap.line[i]);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, ""), 0);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_ERROR, ""), 0);
    /* Every retirement counted was said; one more may be said between
     * the stats and the close (a worker's tenth batch was in flight). */
    int said = ft_count_log(&cap, FERRY_LOG_INFO,
                            "batches (max_batches_per_worker); starting a replacement");
    assert_true(said >= (int)st.retirements && said <= (int)st.retirements + 2);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_INFO, "retired after 10 batches"), said);
    ft_end(&snap);
}

/* A worker that leaks 1 MiB a batch (4 items of 256 KiB) under a budget of
 * 24 MiB of private memory: each process retires after the batch that
 * takes it past the budget, so none is ever seen holding more than the
 * budget and one batch's growth, and the stream is whole. */
static void test_memory_budget_retires_leaking_workers_within_one_batch(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    const uint64_t budget = (uint64_t)24 << 20, batch_growth = (uint64_t)1 << 20;
    ferry_config *cfg = make_cfg(2, 4, "synthetic:n=400,dim=24,leak_kb=256");
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "worker_max_rss_bytes", (int64_t)budget), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t peak = 0;
    assert_int_equal(consume(ld, 0, 2, &peak), 2 * 100);
    ferry_stats st = ft_stats(ld);
    print_message("retirements %llu, the most private memory seen in a worker %.1f MiB "
                  "(budget %.1f MiB)\n",
                  (unsigned long long)st.retirements, (double)peak / (1 << 20),
                  (double)budget / (1 << 20));
    /* 200 MiB leaked in all, at about 24 a process. */
    assert_true(st.retirements >= 5);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(st.failed, 0);
    assert_true(peak > budget / 2); /* the probe does see the leak */
    /* Malloc's own bookkeeping rides along with the batch (each 256 KiB
     * item is an mmap of its own, with its header page): half a batch of
     * slack. A budget not kept would overshoot by many batches. */
    assert_true(peak <= budget + batch_growth + (512 << 10));
    ft_close_within(ld, 5000);
    for (int i = 0; i < cap.n; i++)
        print_message("[%s] %s\n", ferry_log_level_name(cap.level[i]), cap.line[i]);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, ""), 0);
    assert_true(ft_count_log(&cap, FERRY_LOG_INFO,
                             "MiB of private memory (worker_max_rss_bytes "
                             "24.00 MiB); starting a replacement") >= 5);
    ft_end(&snap);
}

/* A state saved while workers retire resumes exactly: the second loader
 * starts at the batch after the last one delivered and the two together
 * are the whole stream, once. */
static void test_state_saved_between_retirements_resumes_exactly(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg(2, 8, "synthetic:n=400,dim=24");
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "max_batches_per_worker", 3), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    for (uint64_t k = 0; k < 37; k++) {
        ferry_batch *b;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, k);
        ferry_batch_release(b);
    }
    unsigned char blob[FERRY_STATE_MAX];
    size_t len = 0;
    assert_int_equal(ferry_loader_state(ld, blob, sizeof blob, &len), FERRY_OK);
    assert_true(ft_stats(ld).retirements >= 8);
    ft_close_within(ld, 5000);

    cfg = make_cfg(2, 8, "synthetic:n=400,dim=24");
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "max_batches_per_worker", 3), FERRY_OK);
    assert_int_equal(ferry_config_set_state(cfg, blob, len), FERRY_OK);
    ld = ft_open_ok(cfg);
    assert_int_equal(consume(ld, 37, 2, NULL), 100 - 37);
    assert_true(ft_stats(ld).retirements >= 10);
    ft_close_within(ld, 5000);
    ft_end(&snap);
}

/* A budget below what a fresh worker holds retires each worker after its
 * first batch: the stream is still whole and in order, and a warning
 * (the first such retirement, then at powers of two) says to raise it. */
static void test_a_budget_below_a_fresh_worker_says_to_raise_it(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    ferry_config *cfg = make_cfg(2, 8, "synthetic:n=64,dim=24");
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "worker_max_rss_bytes", 4096), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    assert_int_equal(consume(ld, 0, 2, NULL), 8);
    ferry_stats st = ft_stats(ld);
    assert_true(st.retirements >= 6);
    assert_int_equal(st.restarts, 0);
    ft_close_within(ld, 5000);
    for (int i = 0; i < cap.n && i < 4; i++)
        print_message("[%s] %s\n", ferry_log_level_name(cap.level[i]), cap.line[i]);
    int warned = ft_count_log(&cap, FERRY_LOG_WARN, "raise worker_max_rss_bytes");
    assert_true(warned >= 1 && warned <= 5);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, "after 1 batch at "), warned);
    ft_end(&snap);
}

/* Thread workers are the trainer's own threads: nothing can replace them,
 * and open says so, naming the option. */
static void test_thread_workers_refuse_the_retirement_options(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    static const char *const opts[] = {"worker_max_rss_bytes", "max_batches_per_worker"};
    for (size_t i = 0; i < 2; i++) {
        ferry_config *cfg = make_cfg(2, 8, "synthetic:n=64,dim=8");
        assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, opts[i], 1000), FERRY_OK);
        ferry_loader *ld = NULL;
        FT_EXPECT_ERROR(ferry_loader_open(&ld, cfg), FERRY_EINVAL, opts[i], "thread",
                        "worker_mode process", NULL);
        assert_null(ld);
        ferry_config_free(cfg);
    }
    ft_end(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_batches_per_worker_replaces_workers_losing_nothing),
        cmocka_unit_test(test_memory_budget_retires_leaking_workers_within_one_batch),
        cmocka_unit_test(test_state_saved_between_retirements_resumes_exactly),
        cmocka_unit_test(test_a_budget_below_a_fresh_worker_says_to_raise_it),
        cmocka_unit_test(test_thread_workers_refuse_the_retirement_options),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
