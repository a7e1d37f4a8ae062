/*
 * test_loader.c - the loader end to end: real workers (processes and
 * threads), real sockets, the synthetic dataset whose bytes are a function of
 * the index, so every batch can be checked for exactly-once, in-order and
 * intact delivery.
 *
 * Every case runs between ft_begin() and ft_end() (tests/harness.h): a hard
 * time limit, and afterwards no child process, no extra fd or thread, and
 * nothing left in the private TMPDIR where the loader puts its ipc directory.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <zmq.h>

#include "config.h"
#include "ferry.h"
#include "ferry_dataset.h"
#include "harness.h"
#include "protocol.h"
#include "sampler.h"

#define N_ITEMS 1000
#define DIM 40

/* ------------------------------------------------------------------------
 * Helpers
 */

static ferry_config *make_cfg(const char *mode, int workers, int prefetch, int batch,
                              const char *dataset)
{
    ferry_config *cfg = ft_config(dataset, workers, batch);
    assert_int_equal(ferry_config_set(cfg, "worker_mode", mode), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "prefetch", prefetch), FERRY_OK);
    return cfg;
}

static const char *synthetic_spec(void)
{
    static char spec[128];
    snprintf(spec, sizeof spec, "synthetic:n=%d,dim=%d", N_ITEMS, DIM);
    return spec;
}

/* The stream the loader should deliver, from a sampler built the same way. */
static void expected_stream(ft_stream *c, int batch, uint64_t seed, uint64_t epochs)
{
    ferry__sampler_opts o = {.batch_size = (uint64_t)batch,
                             .shuffle = 1,
                             .seed = seed,
                             .world_size = 1,
                             .epochs = epochs};
    assert_int_equal(ft_stream_init(c, N_ITEMS, &o, 0), 0);
}

/* ------------------------------------------------------------------------
 * Exactly once, in order, intact
 */

/* Takes every batch up to FERRY_EOF, each checked against the stream c and
 * the synthetic bytes. */
static void read_to_end(ferry_loader *ld, ft_stream *c)
{
    ferry_batch *b;
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ft_assert_in_stream(c, b);
        ft_assert_synthetic(b, DIM);
        ferry_batch_release(b);
    }
    if (rc != FERRY_EOF)
        fail_msg("next: %s: %s", ferry_err_name(rc), ferry_last_error());
}

/* One full run: `epochs` epochs, every batch compared with the expected
 * stream, every index seen exactly once per epoch. */
static void run_exactly_once(const char *mode, int workers, int prefetch)
{
    const int batch = 64;
    const uint64_t epochs = 10, seed = 7;
    ft_snapshot snap;
    ft_begin(&snap, 60);

    ferry_config *cfg = make_cfg(mode, workers, prefetch, batch, synthetic_spec());
    assert_int_equal(ferry_config_set_int(cfg, "seed", (int64_t)seed), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", (int64_t)epochs), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);

    /* Every batch in its place: seq, epoch, position, size, indices, the
     * worker one of ours, every index once per epoch. */
    ft_stream c;
    expected_stream(&c, batch, seed, epochs);
    c.workers = (uint32_t)workers;
    uint64_t items, bpe;
    assert_int_equal(ferry_loader_length(ld, &items, &bpe), FERRY_OK);
    assert_int_equal(items, N_ITEMS);
    assert_int_equal(bpe, c.s.batches_per_epoch);

    read_to_end(ld, &c);
    uint64_t seq = c.taken;
    assert_int_equal(seq, epochs * bpe);
    ft_stream_free(&c);
    /* After the end, next keeps saying so. */
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);

    ferry_stats st;
    assert_int_equal(ferry_loader_stats(ld, &st), FERRY_OK);
    assert_int_equal(st.delivered, seq);
    assert_int_equal(st.dispatched, seq);
    assert_int_equal(st.malformed, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

static void exactly_once_matrix(const char *mode)
{
    static const int prefetches[] = {1, 2, 4, 8, 16};
    for (int w = 1; w <= 4; w++) {
        for (size_t p = 0; p < sizeof prefetches / sizeof prefetches[0]; p++)
            run_exactly_once(mode, w, prefetches[p]);
    }
}

static void test_every_index_once_in_order_with_processes(void **state)
{
    (void)state;
    exactly_once_matrix("process");
}

static void test_every_index_once_in_order_with_threads(void **state)
{
    (void)state;
    exactly_once_matrix("thread");
}

/* Out of order: every batch once, and epochs never interleave (prefetch
 * runs ahead, but a later epoch's batches are held until the earlier one
 * is whole), the last of each epoch handed out marked last_in_epoch. */
#define OOO_EPOCHS 8
#define OOO_PER_EPOCH 20 /* 1000 items, batches of 50 */
static void test_out_of_order_delivers_each_batch_once(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    /* Items cost CPU so that workers finish in a varying order. */
    ferry_config *cfg = make_cfg("process", 3, 9, 50, "synthetic:n=1000,dim=40,cost_us=20");
    assert_int_equal(ferry_config_set_int(cfg, "in_order", 0), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", OOO_EPOCHS), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);

    unsigned char got[OOO_EPOCHS * OOO_PER_EPOCH] = {0};
    static unsigned seen[OOO_EPOCHS][N_ITEMS];
    memset(seen, 0, sizeof seen);
    ferry_batch *b;
    int rc, n = 0, out_of_seq = 0;
    uint64_t epoch = 0, in_epoch = 0;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_true(info.seq < OOO_EPOCHS * OOO_PER_EPOCH);
        assert_int_equal(got[info.seq], 0);
        got[info.seq] = 1;
        out_of_seq += info.seq != (uint64_t)n;
        assert_int_equal(info.epoch, epoch);
        assert_int_equal(info.last_in_epoch, ++in_epoch == OOO_PER_EPOCH);
        if (info.last_in_epoch) {
            epoch++;
            in_epoch = 0;
        }
        const uint64_t *idx = ferry_batch_indices(b);
        for (uint32_t i = 0; i < info.size; i++)
            seen[info.epoch][idx[i]]++;
        ft_assert_synthetic(b, DIM);
        ferry_batch_release(b);
        n++;
    }
    assert_int_equal(rc, FERRY_EOF);
    assert_int_equal(n, OOO_EPOCHS * OOO_PER_EPOCH);
    assert_int_equal(epoch, OOO_EPOCHS);
    printf("%d of %d batches came out of sequence\n", out_of_seq, n);
    for (int e = 0; e < OOO_EPOCHS; e++)
        for (int i = 0; i < N_ITEMS; i++)
            assert_int_equal(seen[e][i], 1);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* pin_tasks: batch seq s is made by worker s % workers, and only by it,
 * also when that worker is killed and replaced (its tasks wait for the
 * replacement); every batch once, in order. A bound loader or one without
 * local workers cannot pin. */
static void test_pinned_tasks_go_to_their_own_worker(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 3, 9, 10, "synthetic:n=900,dim=40,cost_us=20");
    assert_int_equal(ferry_config_set_int(cfg, "pin_tasks", 1), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 3), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b;
    int rc;
    uint64_t n = 0;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, n);
        assert_int_equal(info.worker, n % 3);
        ft_assert_synthetic(b, DIM);
        ferry_batch_release(b);
        if (++n == 40) {
            int pid = 0;
            assert_int_equal(ferry_loader_worker_pid(ld, 1, &pid), FERRY_OK);
            assert_int_equal(kill(pid, SIGKILL), 0);
        }
    }
    assert_int_equal(rc, FERRY_EOF);
    assert_int_equal(n, 3 * 90);
    assert_int_equal(ft_stats(ld).restarts, 1);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    cfg = ft_config("synthetic:n=100,dim=4", 0, 10);
    assert_int_equal(ferry_config_set_int(cfg, "pin_tasks", 1), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "bind", "tcp://127.0.0.1:*"), FERRY_OK);
    ld = NULL;
    FT_EXPECT_ERROR(ferry_loader_open(&ld, cfg), FERRY_EINVAL, "pin_tasks", NULL);
    assert_null(ld);
    ferry_config_free(cfg);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Prefetch across the epoch boundary
 */

/* Consumes up to and including the last batch of epoch 0 and returns it
 * (held, not released). */
static ferry_batch *take_epoch0(ferry_loader *ld)
{
    for (;;) {
        ferry_batch *b;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.epoch, 0);
        if (info.last_in_epoch)
            return b;
        ferry_batch_release(b);
    }
}

/* For ft_wait_stats: the loader has received more than `count` batches. */
static int completed_above(const ferry_stats *st, uint64_t count)
{
    return st->completed > count;
}

/* The trainer asks again: epoch 1's first batch comes; then close. */
static void next_is_first_of_epoch1_then_close(ferry_loader *ld)
{
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    assert_int_equal(info.epoch, 1);
    assert_int_equal(info.batch_in_epoch, 0);
    ferry_batch_release(b);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
}

static void test_next_epoch_is_built_while_trainer_holds_last_batch(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("process", 2, 4, 100, synthetic_spec());
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t bpe;
    ferry_loader_length(ld, NULL, &bpe);

    ferry_batch *last = take_epoch0(ld);
    /* The trainer is "busy" with epoch 0's last batch and has not asked for
     * more; epoch 1's batches must arrive anyway. */
    assert_true(ft_wait_stats(ld, completed_above, bpe + 1, 10000) >= 0);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_int_equal(st.delivered, bpe);
    assert_true(st.dispatched >= bpe + 2);
    ferry_batch_release(last);
    next_is_first_of_epoch1_then_close(ld);
    ft_end(&snap);
}

/* The comparison mode really does hold the next epoch back: nothing of
 * epoch 1 is dispatched until the trainer asks for it. */
static void test_epoch_barrier_holds_next_epoch_until_asked(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("thread", 2, 4, 100, synthetic_spec());
    assert_int_equal(ferry_config_set_int(cfg, "epoch_barrier", 1), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    uint64_t bpe;
    ferry_loader_length(ld, NULL, &bpe);

    ferry_batch *last = take_epoch0(ld);
    /* Bounded wait for something that must not happen. */
    assert_true(ft_wait_stats(ld, completed_above, bpe, 300) < 0);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_int_equal(st.dispatched, bpe);
    ferry_batch_release(last);
    next_is_first_of_epoch1_then_close(ld);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Errors
 */

static void test_dataset_error_is_reported_and_run_continues(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("process", 2, 4, 16, "synthetic:n=160,dim=8,fail_at=37");
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);

    int ok = 0, failed = 0, rc;
    ferry_batch *b = NULL;
    while ((rc = ferry_loader_next(ld, &b)) != FERRY_EOF) {
        if (rc == FERRY_EBATCH) {
            FT_EXPECT_ERROR(rc, FERRY_EBATCH, "worker ", "(pid ", "index 37", "injected failure",
                            "batch 2" /* 37 / 16 */, NULL);
            failed++;
            continue;
        }
        assert_int_equal(rc, FERRY_OK);
        const uint64_t *idx = ferry_batch_indices(b);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        for (uint32_t i = 0; i < info.size; i++)
            assert_int_not_equal(idx[i], 37);
        ferry_batch_release(b);
        ok++;
    }
    assert_int_equal(failed, 2);
    assert_int_equal(ok, 2 * 10 - 2);
    ferry_stats st;
    ferry_loader_stats(ld, &st);
    assert_int_equal(st.failed, 2);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* A batch larger than max_message cannot travel: ZeroMQ would drop it, and
 * the worker's connection, without a word, and next() would wait forever.
 * The worker knows the limit from CONFIG and answers FAIL instead: next()
 * reports that batch at once as FERRY_EBATCH naming its size and the
 * limit, and the stream goes on (the short last batch fits). Processes and
 * threads alike, though ZeroMQ only enforces the limit on ipc and tcp. */
static void test_batch_over_max_message_fails_that_batch_only(void **state)
{
    (void)state;
    static const char *const modes[] = {"process", "thread"};
    for (int m = 0; m < 2; m++) {
        ft_snapshot snap;
        ft_begin(&snap, 30);
        /* Items of 100 + 8 bytes in batches of 40, 40, 20: the payload of a
         * full batch is 64 (lead) + 4032 + 320 = 4416 bytes, the last one's
         * 64 + 2048 + 192 = 2304; the limit is 4096. */
        ferry_config *cfg = make_cfg(modes[m], 2, 4, 40, "synthetic:n=100,dim=100");
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "max_message", 4096), FERRY_OK);
        /* The limit is on messages: a batch in shared memory is none
         * (test_shm.c). */
        assert_int_equal(ferry_config_set_int(cfg, "shm", 0), FERRY_OK);
        ferry_loader *ld = ft_open_ok(cfg);
        ferry_batch *b = NULL;
        for (int i = 0; i < 2; i++) {
            uint64_t t0 = ft_now_ms();
            int rc = ferry_loader_next(ld, &b);
            print_message("%s: next took %llu ms: %s\n", modes[m],
                          (unsigned long long)(ft_now_ms() - t0), ferry_last_error());
            FT_EXPECT_ERROR(rc, FERRY_EBATCH, "4416 bytes", "max_message 4096", "batch_size", NULL);
            assert_true(ft_now_ms() - t0 < 5000);
        }
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_synthetic(b, 100);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, 2);
        assert_int_equal(info.size, 20);
        assert_int_equal(ferry_batch_indices(b)[0], 80);
        ferry_batch_release(b);
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
        ferry_stats st = ft_stats(ld);
        assert_int_equal(st.failed, 2);
        assert_int_equal(st.delivered, 3);
        assert_int_equal(st.malformed, 0);
        assert_int_equal(ferry_loader_close(ld), FERRY_OK);
        ft_end(&snap);
    }
}

/* A bounded wait: a batch that is ready comes at once; one that is not
 * (its worker is stuck in the dataset) gives FERRY_EAGAIN after about the
 * timeout, with nothing lost, and the loader is as it was: stats unchanged,
 * and it still closes. 0 means do not wait at all. */
static void test_next_timeout_returns_eagain_and_changes_nothing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    char spec[512];
    snprintf(spec, sizeof spec, "plugin:%s?n=64,dim=8,hang_at=20", FERRY_TEST_HOSTILE);
    ferry_config *cfg = make_cfg("process", 1, 2, 8, spec);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b = NULL;
    for (int i = 0; i < 2; i++) { /* indices 0..15: ready, or soon */
        assert_int_equal(ferry_loader_next_timeout(ld, &b, 10000), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.seq, (uint64_t)i);
        ft_assert_synthetic(b, 8);
        ferry_batch_release(b);
    }
    ferry_stats before = ft_stats(ld);
    uint64_t t0 = ft_now_ms();
    b = NULL;
    FT_EXPECT_ERROR(ferry_loader_next_timeout(ld, &b, 200), FERRY_EAGAIN, "200 ms", NULL);
    uint64_t waited = ft_now_ms() - t0;
    print_message("a timed-out next() returned after %llu ms\n", (unsigned long long)waited);
    assert_null(b);
    assert_true(waited >= 200 && waited < 2000);
    t0 = ft_now_ms();
    assert_int_equal(ferry_loader_next_timeout(ld, &b, 0), FERRY_EAGAIN);
    assert_true(ft_now_ms() - t0 < 500);
    ferry_stats after = ft_stats(ld);
    assert_int_equal(after.delivered, before.delivered);
    assert_int_equal(after.failed, 0);
    assert_int_equal(ferry_loader_next_timeout(NULL, &b, 0), FERRY_EINVAL);
    ft_close_within(ld, 5000);
    ft_end(&snap);
}

static void test_open_fails_clearly_when_dataset_does_not_open(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("process", 2, 4, 16, "npy:/nonexistent/train_x.npy");
    ferry_loader *ld = NULL;
    int rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    FT_EXPECT_ERROR(rc, FERRY_EDATASET, "worker ", "/nonexistent/train_x.npy", NULL);
    assert_null(ld);
    ft_end(&snap);
}

static void test_open_fails_when_worker_program_is_missing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("process", 2, 4, 16, synthetic_spec());
    assert_int_equal(ferry_config_set(cfg, "worker_path", "/nonexistent/ferry-worker"), FERRY_OK);
    ferry_loader *ld = NULL;
    FT_EXPECT_ERROR(ferry_loader_open(&ld, cfg), FERRY_ESPAWN, "/nonexistent/ferry-worker", NULL);
    ferry_config_free(cfg);
    assert_null(ld);
    ft_end(&snap);
}

static void test_schema_is_known_before_the_first_batch(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_loader *ld = ft_open_ok(make_cfg("process", 2, 4, 16, synthetic_spec()));
    ferry_dataset_schema sc;
    memset(&sc, 0x5A, sizeof sc);
    assert_int_equal(ferry_loader_schema(ld, &sc), FERRY_OK);
    assert_int_equal(sc.nfields, 2);
    assert_string_equal(sc.fields[0].name, "x");
    assert_int_equal(sc.fields[0].dtype, FERRY_DTYPE_U8);
    assert_int_equal(sc.fields[0].ndim, 1);
    assert_int_equal(sc.fields[0].shape[0], DIM);
    assert_string_equal(sc.fields[1].name, "y");
    assert_int_equal(sc.fields[1].dtype, FERRY_DTYPE_I64);
    assert_int_equal(sc.fields[1].ndim, 0);
    assert_int_equal(ferry_loader_schema(ld, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* Each batch says how long its worker took to make it (here at least the
 * dataset's cost_us per item), how long it was on its way, and how long it
 * then waited in the window for the trainer: a batch that arrived while the
 * trainer was busy for 30 ms reports at least those 30 ms. */
static void test_batch_says_how_long_it_took_and_waited(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_loader *ld =
        ft_open_ok(make_cfg("process", 1, 4, 8, "synthetic:n=64,dim=8,cost_us=500"));
    /* The window as set, and the credits chosen for batches of 8. */
    assert_int_equal(ft_stats(ld).prefetch, 4);
    assert_int_equal(ft_stats(ld).credits, 4);
    ferry_batch *b;
    ferry_batch_info info;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    memset(&info, 0x5A, sizeof info);
    ferry_batch_get_info(b, &info);
    assert_int_equal(info.attempts, 1);
    assert_true(info.make_ns >= 8 * 500 * 1000ull);
    assert_true(info.make_ns < 10ull * 1000 * 1000 * 1000);
    assert_true(info.flight_ns >= info.make_ns);
    for (size_t i = 0; i < sizeof info.reserved / sizeof info.reserved[0]; i++)
        assert_true(info.reserved[i] == 0);
    ferry_batch_release(b);
    /* Batch 1 is in the window once completed reaches 2. */
    assert_true(ft_wait_stats(ld, ft_completed_at_least, 2, 10000) >= 0);
    /* The trainer's step: 31 ms on a millisecond clock is at least 30. */
    uint64_t busy_from = ft_now_ms();
    while (ft_now_ms() < busy_from + 31)
        ;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_get_info(b, &info);
    printf("batch 1: make %.2f ms, flight %.2f ms, ready %.2f ms\n", info.make_ns / 1e6,
           info.flight_ns / 1e6, info.ready_ns / 1e6);
    assert_int_equal(info.seq, 1);
    assert_true(info.ready_ns >= 30ull * 1000 * 1000);
    assert_true(info.ready_ns < 10ull * 1000 * 1000 * 1000);
    ferry_batch_release(b);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

/* A relative dataset path is the trainer's: here the workers run in "/"
 * (env -C / ferry-worker), yet "npy:x.npy" opened in the trainer's
 * directory reads that directory's x.npy, and errors name the full path. */
static void test_relative_dataset_paths_are_the_trainers(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    char cwd[1024], path[1200];
    assert_non_null(getcwd(cwd, sizeof cwd));
    int16_t rows[8];
    for (int i = 0; i < 8; i++)
        rows[i] = (int16_t)(100 + i);
    snprintf(path, sizeof path, "%s/x.npy", snap.tmpdir);
    ft_write_npy(path, 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (8,), }", rows,
                 sizeof rows);
    assert_int_equal(chdir(snap.tmpdir), 0);
    ferry_config *cfg = make_cfg("process", 2, 4, 4, "npy:x.npy");
    assert_int_equal(ferry_config_set(cfg, "worker_path", "/usr/bin/env"), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "worker_args", "-C\n/\n" FERRY_TEST_WORKER), FERRY_OK);
    ferry_config *bad = make_cfg("process", 1, 4, 4, "npy:x.npy,missing.npy");
    assert_int_equal(ferry_config_set(bad, "worker_path", "/usr/bin/env"), FERRY_OK);
    assert_int_equal(ferry_config_set(bad, "worker_args", "-C\n/\n" FERRY_TEST_WORKER), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_loader *none = NULL;
    int rc = ferry_loader_open(&none, bad);
    ferry_config_free(bad);
    assert_int_equal(chdir(cwd), 0);
    snprintf(path, sizeof path, "%s/missing.npy", snap.tmpdir);
    FT_EXPECT_ERROR(rc, FERRY_EDATASET, path, NULL);
    ferry_dataset_schema sc;
    assert_int_equal(ferry_loader_schema(ld, &sc), FERRY_OK);
    assert_int_equal(sc.fields[0].dtype, FERRY_DTYPE_I16);
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_tensor t;
    assert_int_equal(ferry_batch_field(b, "x", &t), FERRY_OK);
    const uint64_t *idx = ferry_batch_indices(b);
    for (int i = 0; i < 4; i++)
        assert_int_equal(((const int16_t *)t.data)[i], 100 + (int)idx[i]);
    ferry_batch_release(b);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    snprintf(path, sizeof path, "%s/x.npy", snap.tmpdir);
    assert_int_equal(unlink(path), 0);
    ft_end(&snap);
}

/* credits left at auto queue 32 items per worker, 2 to 16 tasks; the
 * automatic window follows them; a set value is kept. */
static void test_auto_credits_follow_the_batch_size(void **state)
{
    (void)state;
    static const struct {
        int batch, credits;
    } cases[] = {{1, 16}, {2, 16}, {3, 11}, {4, 8}, {16, 2}, {17, 2}, {256, 2}};
    ferry_config *cfg = ferry_config_new();
    assert_int_equal(ferry_config_set_int(cfg, "workers", 2), FERRY_OK);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(ferry_config_set_int(cfg, "batch_size", cases[c].batch), FERRY_OK);
        assert_int_equal(ferry__config_credits(cfg), cases[c].credits);
        assert_int_equal(ferry__config_prefetch(cfg), 2 * 2 * cases[c].credits);
    }
    assert_int_equal(ferry_config_set_int(cfg, "credits", 3), FERRY_OK);
    assert_int_equal(ferry__config_credits(cfg), 3);
    ferry_config_free(cfg);
}

/* worker_args go between the program and ferry's own arguments: here the
 * program is env(1), which sets a variable and runs ferry-worker. */
static void test_worker_args_come_before_ferrys_own(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 30);
    ferry_config *cfg = make_cfg("process", 2, 4, 16, synthetic_spec());
    assert_int_equal(ferry_config_set(cfg, "worker_path", "/usr/bin/env"), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "worker_args", "FERRY_UNUSED=1\n" FERRY_TEST_WORKER),
                     FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg); /* frees cfg */
    for (int i = 0; i < 8; i++) {
        ferry_batch *b = NULL;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_synthetic(b, DIM);
        ferry_batch_release(b);
    }
    int pid = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &pid), FERRY_OK);
    char path[64], cmd[4096] = {0};
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(cmd, 1, sizeof cmd - 1, f);
    fclose(f);
    /* argv: the worker program (env exec'd it), then --connect. */
    assert_true(n > 0);
    assert_string_equal(cmd, FERRY_TEST_WORKER);
    assert_string_equal(cmd + strlen(cmd) + 1, "--connect");
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    cfg = ferry_config_new();
    char many[200] = "";
    for (int i = 0; i < 40; i++)
        strcat(many, "a\n");
    FT_EXPECT_ERROR(ferry_config_set(cfg, "worker_args", many), FERRY_EINVAL, "worker_args",
                    "32", NULL);
    ferry_config_free(cfg);
    ft_end(&snap);
}

/* Worker 1 starts 0.2 s after worker 0 (a shell in front of it: a slow
 * import, say), and each batch takes 0.5 s. The window (4) runs from
 * worker 0's READY, but worker 0 takes only its share of it (2) while
 * worker 1 starts: the first ready once took all 4, queued behind its
 * first batch, and worker 1 had nothing to do until they were through
 * (a slow first item held every batch back; issue 36, item 6). Whichever
 * worker is ready first, the first four batches are two each. */
static void test_a_worker_ready_first_takes_only_its_share_of_the_window(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 2, 4, 1, "synthetic:n=8,dim=40,sleep_us=500000");
    char args[1024];
    snprintf(args, sizeof args,
             "-c\ncase \" $* \" in *\" --slot 1 \"*) sleep 0.2;; esac; exec %s \"$@\"\nsh",
             FERRY_TEST_WORKER);
    assert_int_equal(ferry_config_set(cfg, "worker_path", "/bin/sh"), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "worker_args", args), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg); /* frees cfg */
    uint32_t built[2] = {0, 0};
    for (int i = 0; i < 8; i++) {
        ferry_batch *b = NULL;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_synthetic(b, DIM);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        assert_true(info.worker < 2);
        if (i < 4)
            built[info.worker]++;
        ferry_batch_release(b);
    }
    assert_int_equal(built[0], 2);
    assert_int_equal(built[1], 2);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

static void test_bad_options_are_rejected_by_name(void **state)
{
    (void)state;
    ferry_config *cfg = ferry_config_new();
    assert_int_equal(ferry_config_set_int(cfg, "bach_size", 3), FERRY_EOPTION);
    assert_non_null(strstr(ferry_last_error(), "bach_size"));
    assert_int_equal(ferry_config_set_int(cfg, "batch_size", 0), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "batch_size"));
    assert_int_equal(ferry_config_set(cfg, "workers", "two"), FERRY_EINVAL);
    assert_int_equal(ferry_config_set(cfg, "worker_mode", "fiber"), FERRY_EINVAL);
    assert_int_equal(ferry_config_set(cfg, "in_order", "maybe"), FERRY_EINVAL);
    assert_int_equal(ferry_config_set_int(cfg, "io_threads", -1), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "io_threads"));
    assert_int_equal(ferry_config_set_int(cfg, "io_threads", 65), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "io_threads"));
    assert_int_equal(ferry_config_set_int(cfg, "io_threads", 4), FERRY_OK);
    assert_int_equal(ferry_config_set(cfg, "in_order", "false"), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "rank", 2), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "world_size", 2), FERRY_OK);
    ferry_loader *ld = NULL;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "rank"));
    assert_null(ld);
    ferry_config_free(cfg);
}

/* ------------------------------------------------------------------------
 * Shutdown
 */

static void test_close_mid_epoch_leaves_nothing_behind(void **state)
{
    (void)state;
    static const char *const modes[] = {"process", "thread"};
    for (int m = 0; m < 2; m++) {
        for (int consumed = 0; consumed <= 5; consumed += 5) {
            ft_snapshot snap;
            ft_begin(&snap, 30);
            ferry_config *cfg = make_cfg(modes[m], 3, 8, 32, synthetic_spec());
            ferry_loader *ld = ft_open_ok(cfg);
            ferry_batch *held = NULL;
            for (int i = 0; i < consumed; i++) {
                ferry_batch *b;
                assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
                ferry_batch_release(held);
                held = b;
            }
            /* Batches in flight, one still held by the trainer. */
            ft_close_within(ld, 5000);
            if (held) {
                ft_assert_synthetic(held, DIM); /* still valid after close */
                ferry_batch_release(held);
            }
            ft_end(&snap);
        }
    }
}

/* ------------------------------------------------------------------------
 * Resume
 */

static void test_resume_after_batch_k_reproduces_the_stream(void **state)
{
    (void)state;
    const int k = 23, total = 60;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    const char *spec = "synthetic:n=1000,dim=40,augment=1";
    uint64_t ref[60][3]; /* seq, first index, a content byte */

    ferry_config *cfg = make_cfg("process", 2, 6, 50, spec);
    ferry_config_set_int(cfg, "seed", 99);
    ferry_config_set_int(cfg, "max_batches", total);
    ferry_loader *ld;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    ferry_batch *b;
    for (int i = 0; i < total; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        ferry_tensor x;
        ferry_batch_field(b, "x", &x);
        ref[i][0] = info.seq;
        ref[i][1] = ferry_batch_indices(b)[0];
        ref[i][2] = ((const unsigned char *)x.data)[x.nbytes - 1];
        ferry_batch_release(b);
    }
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    /* Interrupted run: stop after batch k-1 (k batches), save. */
    unsigned char blob[FERRY_STATE_MAX];
    size_t len = 0;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    for (int i = 0; i < k; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_release(b);
    }
    assert_int_equal(ferry_loader_state(ld, blob, sizeof blob, &len), FERRY_OK);
    assert_true(len > 0 && len <= FERRY_STATE_MAX);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    /* Resumed run: identical from batch k on, and it ends in the same place. */
    assert_int_equal(ferry_config_set_state(cfg, blob, len), FERRY_OK);
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    for (int i = k; i < total; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        ferry_tensor x;
        ferry_batch_field(b, "x", &x);
        assert_int_equal(info.seq, ref[i][0]);
        assert_int_equal(ferry_batch_indices(b)[0], ref[i][1]);
        assert_int_equal(((const unsigned char *)x.data)[x.nbytes - 1], ref[i][2]);
        ferry_batch_release(b);
    }
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    /* A state of another order (here another seed) is refused at open, by
     * name; another batch_size is not (tests/test_reshape.c). */
    ferry_config_set_int(cfg, "seed", 98);
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "seed 99, loader has 98"));
    ferry_config_free(cfg);
    ft_end(&snap);
}

/* The state at the start of an epoch (ferry_loader_state_at_epoch), taken
 * from a loader that has delivered one batch, opens a loader whose first
 * batch is that epoch's first, the same batch the uninterrupted stream
 * gives there; an epoch past the stream's end is FERRY_ERANGE. */
static void test_a_state_at_an_epoch_starts_there(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 2, 6, 50, "synthetic:n=1000,dim=40,augment=1");
    ferry_config_set_int(cfg, "seed", 99);
    ferry_config_set_int(cfg, "epochs", 4);
    ferry_loader *ld;
    ferry_batch *b;
    ferry_batch_info info;
    uint64_t want_index = 0;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    for (int i = 0; i < 3 * 20 + 1; i++) { /* 20 batches an epoch */
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_get_info(b, &info);
        if (i == 2 * 20) {
            assert_int_equal(info.epoch, 2);
            assert_int_equal(info.batch_in_epoch, 0);
            want_index = ferry_batch_indices(b)[0];
        }
        ferry_batch_release(b);
    }
    unsigned char blob[FERRY_STATE_MAX];
    size_t len = 0;
    assert_int_equal(ferry_loader_state_at_epoch(ld, 2, blob, sizeof blob, &len), FERRY_OK);
    assert_int_equal(ferry_loader_state_at_epoch(ld, 4, blob, sizeof blob, &len), FERRY_ERANGE);
    assert_int_equal(ferry_loader_state_at_epoch(ld, UINT64_MAX, blob, sizeof blob, &len),
                     FERRY_ERANGE);
    assert_int_equal(ferry_loader_state_at_epoch(ld, 2, blob, sizeof blob, &len), FERRY_OK);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    assert_int_equal(ferry_config_set_state(cfg, blob, len), FERRY_OK);
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_get_info(b, &info);
    assert_int_equal(info.epoch, 2);
    assert_int_equal(info.batch_in_epoch, 0);
    assert_int_equal(ferry_batch_indices(b)[0], want_index);
    ferry_batch_release(b);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ferry_config_free(cfg);
    ft_end(&snap);
}

/* The first index and epoch position of each batch of a loader's whole
 * stream (4 epochs of 20 batches), uninterrupted. */
static void whole_stream(ferry_config *cfg, uint64_t first[80])
{
    ferry_loader *ld;
    ferry_batch *b;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    for (int i = 0; i < 80; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        first[i] = ferry_batch_indices(b)[0];
        ferry_batch_release(b);
    }
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
}

/* Takes n batches and checks each is the uninterrupted stream's batch at
 * epoch `epoch`, from `from` on. */
static void take_of_epoch(ferry_loader *ld, const uint64_t first[80], uint64_t epoch,
                          uint64_t from, int n)
{
    for (int i = 0; i < n; i++) {
        ferry_batch *b;
        ferry_batch_info info;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ferry_batch_get_info(b, &info);
        assert_int_equal(info.epoch, epoch);
        assert_int_equal(info.batch_in_epoch, from + (uint64_t)i);
        assert_int_equal(ferry_batch_indices(b)[0], first[epoch * 20 + from + (uint64_t)i]);
        ferry_batch_release(b);
    }
}

/* Skipping the rest of an epoch (ferry_loader_skip_epoch) passes over
 * exactly what is left of it: the next batch is the next epoch's first,
 * the same the uninterrupted stream gives there, and every later batch is
 * too, whether the skipped batches were made already, in flight (a window
 * of 8 with one batch taken: most of it is the skipped epoch's), or never
 * sent; at an epoch's start it skips nothing; the state after it is the
 * next epoch's start; in the last epoch the stream ends. */
static void test_skipping_an_epoch_passes_over_its_rest_exactly(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 2, 8, 50, "synthetic:n=1000,dim=40,augment=1");
    ferry_config_set_int(cfg, "seed", 7);
    ferry_config_set_int(cfg, "epochs", 4);
    uint64_t first[80];
    whole_stream(cfg, first);

    ferry_loader *ld;
    ferry_batch *b;
    uint64_t skipped = 99;
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    take_of_epoch(ld, first, 0, 0, 1);
    assert_int_equal(ferry_loader_skip_epoch(ld, &skipped), FERRY_OK);
    assert_int_equal(skipped, 19);
    take_of_epoch(ld, first, 1, 0, 20);
    assert_int_equal(ferry_loader_skip_epoch(ld, &skipped), FERRY_OK); /* at epoch 2's start */
    assert_int_equal(skipped, 0);
    take_of_epoch(ld, first, 2, 0, 5);
    assert_int_equal(ferry_loader_skip_epoch(ld, NULL), FERRY_OK);
    unsigned char now[FERRY_STATE_MAX], at3[FERRY_STATE_MAX];
    size_t now_len = 0, at3_len = 0;
    assert_int_equal(ferry_loader_state(ld, now, sizeof now, &now_len), FERRY_OK);
    assert_int_equal(ferry_loader_state_at_epoch(ld, 3, at3, sizeof at3, &at3_len), FERRY_OK);
    assert_int_equal(now_len, at3_len);
    assert_memory_equal(now, at3, now_len);
    take_of_epoch(ld, first, 3, 0, 2);
    assert_int_equal(ferry_loader_skip_epoch(ld, &skipped), FERRY_OK);
    assert_int_equal(skipped, 18);
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_EOF);
    ferry_stats st;
    assert_int_equal(ferry_loader_stats(ld, &st), FERRY_OK);
    assert_int_equal(st.delivered, 1 + 20 + 5 + 2);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);

    /* Out of order, the position is not one: refused, nothing changed. */
    ferry_config_set_int(cfg, "in_order", 0);
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_OK);
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_release(b);
    ft_expect_error(ferry_loader_skip_epoch(ld, &skipped), FERRY_EINVAL,
                    (const char *const[]){"in_order", NULL});
    assert_int_equal(skipped, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ferry_config_free(cfg);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * A hostile peer on the loader's socket
 */

/* The loader's ipc endpoint, found in the test's private TMPDIR. */
static void find_endpoint(const char *tmpdir, char *out, size_t cap)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    struct dirent *e;
    out[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ferry-", 6) == 0)
            snprintf(out, cap, "ipc://%s/%s/loader", tmpdir, e->d_name);
    }
    closedir(d);
    assert_true(out[0] != '\0');
}

/* A DEALER of our own on the loader's local socket, with no linger. */
static void *raw_peer(void *ctx, const char *ep)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(s);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

static void send_frames(void *s, const void *const *frames, const size_t *lens, int n)
{
    for (int i = 0; i < n; i++)
        assert_true(zmq_send(s, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void send_msg(void *s, const ferry__msg *m, const void *payload, size_t plen)
{
    unsigned char hdr[FERRY__HDR_MAX];
    size_t len;
    assert_int_equal(ferry__msg_encode(m, hdr, sizeof hdr, &len), FERRY_OK);
    const void *frames[] = {hdr, payload};
    size_t lens[] = {len, plen};
    send_frames(s, frames, lens, payload ? 2 : 1);
}

/* For ft_wait_stats: every message the raw peer sends below was read. */
static int garbage_counted(const ferry_stats *st, uint64_t unused)
{
    (void)unused;
    return st->malformed >= 7 && st->stale >= 2;
}

static int restarted_once(const ferry_stats *st, uint64_t unused)
{
    (void)unused;
    return st->restarts >= 1;
}

static int workers_ready(const ferry_stats *st, uint64_t n)
{
    return st->workers >= n;
}

static int stale_above(const ferry_stats *st, uint64_t n)
{
    return st->stale > n;
}

/* A HELLO that a slot's previous process sent just before it was killed
 * arrives after its replacement started: it is late, not forged, and is
 * counted as stale (the soak had reported it as malformed, an error). */
static void test_late_hello_of_a_replaced_worker_is_stale(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 2, 4, 50, synthetic_spec());
    ferry_loader *ld = ft_open_ok(cfg);
    int old = 0, now = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &old), FERRY_OK);
    assert_int_equal(kill(old, SIGKILL), 0);
    assert_true(ft_wait_stats(ld, restarted_once, 0, 10000) >= 0);
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &now), FERRY_OK);
    assert_true(now != old);

    char ep[512];
    find_endpoint(snap.tmpdir, ep, sizeof ep);
    void *ctx = zmq_ctx_new();
    void *s = raw_peer(ctx, ep);
    ferry_stats before = ft_stats(ld);
    ferry__msg m;
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_HELLO;
    m.u.hello = (ferry__hello){.version = FERRY_PROTOCOL_VERSION, .pid = (uint32_t)old, .slot = 0};
    send_msg(s, &m, NULL, 0);
    assert_true(ft_wait_stats(ld, stale_above, before.stale, 5000) >= 0);
    ferry_stats after = ft_stats(ld);
    assert_int_equal(after.malformed, before.malformed);
    assert_int_equal(after.stale, before.stale + 1);

    ferry_batch *b = NULL; /* and the run is untouched */
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_release(b);
    zmq_close(s);
    zmq_ctx_term(ctx);
    ft_close_within(ld, 5000);
    ft_end(&snap);
}

/* What an exit callback heard (written on the loader's thread, read by the
 * test after ferry_loader_close() has joined it). */
typedef struct exits_heard {
    int n;
    uint32_t index[8];
    int pid[8];
    int status[8];
} exits_heard;

static void hear_exit(void *user, uint32_t index, int pid, int status)
{
    exits_heard *h = user;
    if (h->n < 8) {
        h->index[h->n] = index;
        h->pid[h->n] = pid;
        h->status[h->n] = status;
    }
    h->n++;
}

/* The status heard for `pid`, or -2 when it was not heard once exactly. */
static int heard_status(const exits_heard *h, uint32_t index, int pid)
{
    int found = 0, status = -2;
    for (int i = 0; i < h->n && i < 8; i++) {
        if (h->pid[i] == pid && h->index[i] == index) {
            found++;
            status = h->status[i];
        }
    }
    return found == 1 ? status : -2;
}

/* Option exit_fn hears every worker process the loader reaps, once, with
 * the status the kernel gave: a worker killed mid-run (then replaced) with
 * its signal, and every worker at close with its clean exit. */
static void test_exit_callback_hears_each_reaped_worker_with_its_status(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    exits_heard heard = {0};
    ferry_config *cfg = make_cfg("process", 2, 4, 50, synthetic_spec());
    assert_int_equal(ferry_config_set_exit_fn(cfg, hear_exit, &heard), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    int old = 0, now = 0, other = 0;
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &old), FERRY_OK);
    assert_int_equal(ferry_loader_worker_pid(ld, 1, &other), FERRY_OK);
    assert_int_equal(kill(old, SIGKILL), 0);
    assert_true(ft_wait_stats(ld, restarted_once, 0, 10000) >= 0);
    /* Its replacement ready (its dataset open) before the close: a worker
     * told to stop while still starting says it was turned away, exiting 1. */
    assert_true(ft_wait_stats(ld, workers_ready, 2, 10000) >= 0);
    assert_int_equal(ferry_loader_worker_pid(ld, 0, &now), FERRY_OK);
    assert_true(now != old && now > 0);
    ferry_batch *b = NULL;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    ferry_batch_release(b);
    ft_close_within(ld, 5000);

    assert_int_equal(heard.n, 3);
    int st = heard_status(&heard, 0, old);
    assert_true(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    st = heard_status(&heard, 0, now);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    st = heard_status(&heard, 1, other);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ft_end(&snap);
}

static void test_malformed_messages_from_a_raw_peer_change_nothing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = make_cfg("process", 2, 4, 50, synthetic_spec());
    assert_int_equal(ferry_config_set_int(cfg, "seed", 3), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 3), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "max_message", 1 << 20), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);

    char ep[512];
    find_endpoint(snap.tmpdir, ep, sizeof ep);
    void *ctx = zmq_ctx_new();
    void *s = raw_peer(ctx, ep);

    /* Garbage, an empty frame, too many frames, a header past the limit. */
    static const unsigned char junk[] = {0xc1, 0xff, 0x00, 0x93, 0x01};
    static unsigned char big[FERRY__HDR_MAX + 10];
    const void *f1[] = {junk};
    size_t l1[] = {sizeof junk};
    send_frames(s, f1, l1, 1);
    const void *f2[] = {""};
    size_t l2[] = {0};
    send_frames(s, f2, l2, 1);
    const void *f3[] = {junk, junk, junk, junk};
    size_t l3[] = {sizeof junk, sizeof junk, sizeof junk, sizeof junk};
    send_frames(s, f3, l3, 4);
    const void *f4[] = {big};
    size_t l4[] = {sizeof big};
    send_frames(s, f4, l4, 1);
    /* An oversized message: over max_message, ZeroMQ drops the peer. Sent
     * on a second peer so the first can go on misbehaving. */
    void *s2 = raw_peer(ctx, ep);
    size_t huge_len = 2u << 20;
    unsigned char *huge = calloc(1, huge_len);
    const void *f5[] = {huge};
    size_t l5[] = {huge_len};
    send_frames(s2, f5, l5, 1);

    /* Well-formed but wrong: an impostor HELLO for a taken slot, one for a
     * slot that does not exist, a BATCH and a FAIL for tasks it never got. */
    ferry__msg m;
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_HELLO;
    m.u.hello = (ferry__hello){.version = FERRY_PROTOCOL_VERSION, .pid = 1, .slot = 0};
    send_msg(s, &m, NULL, 0);
    m.u.hello.slot = 77;
    send_msg(s, &m, NULL, 0);
    m.u.hello.slot = 0;
    m.u.hello.version = 99;
    send_msg(s, &m, NULL, 0);
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_FAIL;
    m.u.fail = (ferry__fail){.id = 0, .code = FERRY_EBATCH, .index = 1};
    snprintf(m.u.fail.message, sizeof m.u.fail.message, "forged");
    send_msg(s, &m, NULL, 0);
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_BATCH;
    m.u.batch.id = 1;
    m.u.batch.count = 1;
    m.u.batch.nfields = 1;
    snprintf(m.u.batch.fields[0].name, FERRY_NAME_MAX, "x");
    m.u.batch.fields[0].dtype = FERRY_DTYPE_U8;
    m.u.batch.fields[0].ndim = 1;
    m.u.batch.fields[0].shape[0] = 1;
    m.u.batch.fields[0].nbytes = 1;
    send_msg(s, &m, "z", 1);

    /* The run is untouched: every batch exactly once, in order, intact. */
    ft_stream c;
    expected_stream(&c, 50, 3, 3);
    read_to_end(ld, &c);
    assert_int_equal(c.taken, 3 * 20);
    ft_stream_free(&c);

    /* And it noticed: wait (bounded) until every message above was read. */
    ft_wait_stats(ld, garbage_counted, 0, 5000);
    ferry_stats st = ft_stats(ld);
    print_message("malformed %llu, stale %llu\n", (unsigned long long)st.malformed,
                  (unsigned long long)st.stale);
    assert_int_equal(st.malformed, 7);
    assert_int_equal(st.stale, 2);
    assert_int_equal(st.failed, 0);
    zmq_close(s);
    zmq_close(s2);
    zmq_ctx_term(ctx);
    free(huge);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    ft_end(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_args_come_before_ferrys_own),
        cmocka_unit_test(test_a_worker_ready_first_takes_only_its_share_of_the_window),
        cmocka_unit_test(test_schema_is_known_before_the_first_batch),
        cmocka_unit_test(test_batch_says_how_long_it_took_and_waited),
        cmocka_unit_test(test_relative_dataset_paths_are_the_trainers),
        cmocka_unit_test(test_auto_credits_follow_the_batch_size),
        cmocka_unit_test(test_bad_options_are_rejected_by_name),
        cmocka_unit_test(test_every_index_once_in_order_with_processes),
        cmocka_unit_test(test_every_index_once_in_order_with_threads),
        cmocka_unit_test(test_out_of_order_delivers_each_batch_once),
        cmocka_unit_test(test_pinned_tasks_go_to_their_own_worker),
        cmocka_unit_test(test_next_epoch_is_built_while_trainer_holds_last_batch),
        cmocka_unit_test(test_epoch_barrier_holds_next_epoch_until_asked),
        cmocka_unit_test(test_dataset_error_is_reported_and_run_continues),
        cmocka_unit_test(test_batch_over_max_message_fails_that_batch_only),
        cmocka_unit_test(test_next_timeout_returns_eagain_and_changes_nothing),
        cmocka_unit_test(test_open_fails_clearly_when_dataset_does_not_open),
        cmocka_unit_test(test_open_fails_when_worker_program_is_missing),
        cmocka_unit_test(test_close_mid_epoch_leaves_nothing_behind),
        cmocka_unit_test(test_resume_after_batch_k_reproduces_the_stream),
        cmocka_unit_test(test_a_state_at_an_epoch_starts_there),
        cmocka_unit_test(test_skipping_an_epoch_passes_over_its_rest_exactly),
        cmocka_unit_test(test_malformed_messages_from_a_raw_peer_change_nothing),
        cmocka_unit_test(test_late_hello_of_a_replaced_worker_is_stale),
        cmocka_unit_test(test_exit_callback_hears_each_reaped_worker_with_its_status),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
