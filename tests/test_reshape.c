/*
 * test_reshape.c - resume into another shape, end to end: a job of W
 * loaders (one per rank, opened one after another in this process) is
 * interrupted mid-epoch, every rank saves its state, and a job of W'
 * loaders, maybe with another batch_size, resumes from one of them.
 *
 * Each batch the new ranks deliver is checked item by item against the
 * arithmetic of the uninterrupted run's global order (ferry__sampler_permute:
 * rank r' serves positions P+r', P+r'+W', ... of the interrupted epoch's
 * order) and against the synthetic dataset's bytes; across the new ranks
 * every position from P on is served exactly once; the epoch after is a
 * fresh W'-rank run's, batch by batch. tests/test_sampler.c covers the whole
 * matrix of shapes on the sampler alone; this file proves the loader around
 * it (workers, prefetch across the epoch's end, out of order delivery, a
 * worker killed in the middle) keeps to it.
 *
 * Every case runs between ft_begin() and ft_end() (tests/harness.h).
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

#include "ferry.h"
#include "harness.h"
#include "sampler.h"

#define N_ITEMS 1003 /* prime to every world_size below: padding is exercised */
#define DIM 8
#define SEED 5

typedef struct shape {
    uint32_t w;
    int batch;
} shape;

static ferry_config *rank_cfg(shape sh, uint32_t rank, int workers, const char *mode)
{
    char spec[64];
    snprintf(spec, sizeof spec, "synthetic:n=%d,dim=%d", N_ITEMS, DIM);
    ferry_config *cfg = ft_config(spec, workers, sh.batch);
    assert_int_equal(ferry_config_set(cfg, "worker_mode", mode), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "seed", SEED), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "world_size", sh.w), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "rank", rank), FERRY_OK);
    return cfg;
}

/* The sampler of rank r in shape sh: the arithmetic the loader must follow. */
static ferry__sampler rank_sampler(shape sh, uint32_t r)
{
    ferry__sampler_opts o = {.batch_size = (uint64_t)sh.batch,
                             .shuffle = 1,
                             .seed = SEED,
                             .rank = r,
                             .world_size = sh.w,
                             .pad_shards = 1};
    ferry__sampler s;
    assert_int_equal(ferry__sampler_init(&s, N_ITEMS, &o), FERRY_OK);
    return s;
}

/* Every rank of `sh` takes `batches` batches from the start and saves its
 * state into blobs[r]; returns the states' length. */
static size_t run_old_job(shape sh, uint64_t batches, unsigned char (*blobs)[FERRY_STATE_MAX])
{
    size_t len = 0;
    for (uint32_t r = 0; r < sh.w; r++) {
        ferry_loader *ld = ft_open_ok(rank_cfg(sh, r, 1, r % 2 ? "thread" : "process"));
        ferry_batch *b;
        for (uint64_t i = 0; i < batches; i++) {
            assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
            ferry_batch_release(b);
        }
        assert_int_equal(ferry_loader_state(ld, blobs[r], FERRY_STATE_MAX, &len), FERRY_OK);
        ft_close_within(ld, 10000);
    }
    const void *ptrs[16];
    size_t lens[16];
    for (uint32_t r = 0; r < sh.w; r++) {
        ptrs[r] = blobs[r];
        lens[r] = len;
    }
    assert_int_equal(ferry_state_check(ptrs, lens, sh.w), FERRY_OK);
    return len;
}

/* What the new ranks delivered of the interrupted epoch. */
typedef struct served {
    uint32_t *count; /* per position of the epoch's order */
    uint64_t per_rank;
} served;

/* Checks one batch of the head (the rest of epoch `epoch` from position
 * pos) on rank r of shape sh: item m of the head (m counted from *item on)
 * is position pos + r + m*W' of the order, wrapped to the order's start
 * past n (padding). Counts the positions in sv. */
static void check_head_batch(const ferry_batch *b, const ferry__sampler *s, shape sh, uint32_t r,
                             uint64_t pos, uint64_t epoch, uint64_t *item, served *sv)
{
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    const uint64_t *idx = ferry_batch_indices(b);
    assert_int_equal(info.epoch, epoch);
    ft_assert_synthetic(b, DIM);
    for (uint32_t j = 0; j < info.size; j++, (*item)++) {
        uint64_t p = pos + r + *item * sh.w;
        if (p >= N_ITEMS)
            p -= N_ITEMS;
        assert_int_equal(idx[j], ferry__sampler_permute(s, epoch, p));
        sv->count[p]++;
    }
}

/* Checks a batch of a later epoch against a fresh rank's sampler. */
static void check_fresh_batch(const ferry_batch *b, const ferry__sampler *fresh)
{
    ferry_batch_info info;
    ferry__sampler_task t;
    uint64_t want[64];
    ferry_batch_get_info(b, &info);
    assert_int_equal(ferry__sampler_at(fresh, info.seq, &t), FERRY_OK);
    assert_int_equal(info.epoch, t.epoch);
    assert_int_equal(info.batch_in_epoch, t.batch_in_epoch);
    assert_int_equal(info.size, t.count);
    ferry__sampler_indices(fresh, &t, want);
    assert_memory_equal(ferry_batch_indices(b), want, t.count * sizeof want[0]);
    ft_assert_synthetic(b, DIM);
}

/* After the new ranks: every position from pos on served exactly once,
 * and before it only padding's repeats of the order's start. */
static void check_served(const served *sv, shape sh, uint64_t pos)
{
    uint64_t rest = N_ITEMS - pos, per = rest / sh.w + (rest % sh.w != 0);
    assert_int_equal(sv->per_rank, per);
    uint64_t repeats = pos + per * sh.w - N_ITEMS;
    for (uint64_t p = 0; p < N_ITEMS; p++) {
        uint32_t want = (p >= pos) + (p < repeats);
        if (sv->count[p] != want)
            fail_msg("position %llu of the order served %u times, want %u", (unsigned long long)p,
                     sv->count[p], want);
    }
}

/* ------------------------------------------------------------------------
 * Another world_size
 */

/* The docs' example: a job preempted on 8 ranks resumes on 6. The old job
 * ran epoch 0 and 3 batches of epoch 1 (P = 3*16*8 = 384 of 1003); the 6
 * new ranks serve the other 619 once (104 each, 5 repeats of padding), in
 * batches that end epoch 1 where a 6-rank run's would, then epoch 2 as a
 * fresh 6-rank run. Ranks use 1 and 3 workers, processes and threads. */
static void test_preempted_on_8_ranks_resumes_on_6(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 120);
    const shape old = {8, 16}, now = {6, 16};
    unsigned char blobs[8][FERRY_STATE_MAX];
    ferry__sampler s8 = rank_sampler(old, 0);
    size_t len = run_old_job(old, s8.batches_per_epoch + 3, blobs);
    const uint64_t pos = 3 * 16 * 8;

    served sv = {calloc(N_ITEMS, sizeof(uint32_t)), 0};
    assert_non_null(sv.count);
    for (uint32_t r = 0; r < now.w; r++) {
        ferry_config *cfg = rank_cfg(now, r, r % 2 ? 3 : 1, r % 3 ? "process" : "thread");
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 3), FERRY_OK);
        /* any rank's state: each new rank takes another one */
        assert_int_equal(ferry_config_set_state(cfg, blobs[(r * 3) % 8], len), FERRY_OK);
        ferry_loader *ld = ft_open_ok(cfg);
        ferry__sampler fresh = rank_sampler(now, r);
        const uint64_t bpe = fresh.batches_per_epoch;
        uint64_t item = 0, seq = 0, heads = 0;
        ferry_batch *b;
        ferry_batch_info info;
        int rc;
        while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
            ferry_batch_get_info(b, &info);
            if (heads == 0) /* the head's first batch: the last ones of epoch 1 */
                seq = info.seq;
            assert_int_equal(info.seq, seq++);
            if (info.epoch == 1) {
                check_head_batch(b, &fresh, now, r, pos, 1, &item, &sv);
                assert_int_equal(info.last_in_epoch, info.seq + 1 == 2 * bpe);
                heads++;
            } else {
                assert_int_equal(info.epoch, 2);
                check_fresh_batch(b, &fresh);
            }
            ferry_batch_release(b);
        }
        assert_int_equal(rc, FERRY_EOF);
        assert_int_equal(seq, 3 * bpe); /* epoch 2 whole, then the end */
        if (r == 0)
            sv.per_rank = item;
        assert_int_equal(item, sv.per_rank);
        assert_int_equal(heads, (item + 15) / 16);
        ft_close_within(ld, 10000);
    }
    check_served(&sv, now, pos);
    free(sv.count);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Another batch_size, out of order, a worker killed
 */

static int restarted(const ferry_stats *st, uint64_t n)
{
    return st->restarts >= n;
}

/* 4 ranks of batch 32 stop 5 batches into epoch 0 (P = 640); 4 ranks of
 * batch 48 resume, out of order, and rank 0 loses a worker in the middle
 * of the head: still every position from 640 on once, the epoch's last
 * batch marked once, and epoch 1 a fresh batch-48 run's. */
static void test_resume_with_batch_48_out_of_order_through_a_worker_death(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 120);
    const shape old = {4, 32}, now = {4, 48};
    unsigned char blobs[4][FERRY_STATE_MAX];
    size_t len = run_old_job(old, 5, blobs);
    const uint64_t pos = 5 * 32 * 4;

    served sv = {calloc(N_ITEMS, sizeof(uint32_t)), 0};
    assert_non_null(sv.count);
    for (uint32_t r = 0; r < now.w; r++) {
        ferry_config *cfg = rank_cfg(now, r, 3, "process");
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
        assert_int_equal(ferry_config_set(cfg, "in_order", "false"), FERRY_OK);
        assert_int_equal(ferry_config_set_int(cfg, "prefetch", 4), FERRY_OK);
        assert_int_equal(ferry_config_set_state(cfg, blobs[r], len), FERRY_OK);
        ferry_loader *ld = ft_open_ok(cfg);
        ferry__sampler fresh = rank_sampler(now, r);
        const uint64_t bpe = fresh.batches_per_epoch;
        ferry__sampler head = fresh;
        uint64_t next = 0, item = 0, got = 0, lasts = 0;
        assert_int_equal(ferry__sampler_restore(&head, blobs[r], len, &next), FERRY_OK);
        uint8_t seen[64] = {0};
        ferry_batch *b;
        ferry_batch_info info;
        int rc;
        while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
            ferry_batch_get_info(b, &info);
            assert_true(info.seq >= next && info.seq < 2 * bpe);
            assert_false(seen[info.seq]++);
            if (info.epoch == 0) {
                /* out of order: item numbers come from the batch's place in
                 * the head, not from the delivery order */
                uint64_t at = (info.seq - next) * 48;
                check_head_batch(b, &fresh, now, r, pos, 0, &at, &sv);
                item += info.size;
                lasts += info.last_in_epoch;
                if (r == 0 && got == 1) {
                    int pid = 0;
                    assert_int_equal(ferry_loader_worker_pid(ld, 0, &pid), FERRY_OK);
                    assert_int_equal(kill(pid, SIGKILL), 0);
                }
            } else {
                check_fresh_batch(b, &fresh);
            }
            got++;
            ferry_batch_release(b);
        }
        assert_int_equal(rc, FERRY_EOF);
        assert_int_equal(got, 2 * bpe - next); /* the head, then epoch 1 whole */
        assert_int_equal(lasts, 1);
        if (r == 0) {
            sv.per_rank = item;
            /* the death may be noticed after the last batch was in */
            assert_true(ft_wait_stats(ld, restarted, 1, 10000) >= 0);
        }
        assert_int_equal(item, sv.per_rank);
        ft_close_within(ld, 10000);
    }
    check_served(&sv, now, pos);
    free(sv.count);
    ft_end(&snap);
}

/* ------------------------------------------------------------------------
 * Refusals
 */

/* A state of another order is refused at open, naming what differs; the
 * ranks' states, compared, must be of one step. */
static void test_foreign_or_disagreeing_states_are_refused_by_name(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    const shape old = {2, 16};
    unsigned char blobs[2][FERRY_STATE_MAX], late[2][FERRY_STATE_MAX];
    size_t len = run_old_job(old, 4, blobs);
    run_old_job(old, 5, late);

    ferry_loader *ld = NULL;
    ferry_config *cfg = ft_config("synthetic:n=1002,dim=8", 1, 16);
    assert_int_equal(ferry_config_set_int(cfg, "seed", SEED), FERRY_OK);
    assert_int_equal(ferry_config_set_state(cfg, blobs[0], len), FERRY_OK);
    assert_int_equal(ferry_loader_open(&ld, cfg), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "1003 items, this one has 1002"));
    ferry_config_free(cfg);

    const void *ptrs[2] = {blobs[0], late[1]};
    size_t lens[2] = {len, len};
    assert_int_equal(ferry_state_check(ptrs, lens, 2), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "did not stop at the same batch"));

    ft_end(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preempted_on_8_ranks_resumes_on_6),
        cmocka_unit_test(test_resume_with_batch_48_out_of_order_through_a_worker_death),
        cmocka_unit_test(test_foreign_or_disagreeing_states_are_refused_by_name),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
