/*
 * test_window.c - the prefetch window by itself, in one process, with no
 * sockets and no workers: the test plays the scheduler (take, sent,
 * complete, requeue) and the trainer (next), so ordering, requeue, give-up
 * and resume are checked exactly and fast.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch.h"
#include "error.h"
#include "window.h"

#define N_ITEMS 10
#define BATCH 2 /* 5 batches an epoch */

static ferry__window_opts opts(uint32_t prefetch, int in_order)
{
    ferry__window_opts o = {.prefetch = prefetch,
                            .nworkers = 2,
                            .in_order = in_order,
                            .max_attempts = 2,
                            .sampler = {.batch_size = BATCH, .world_size = 1, .epochs = 2}};
    return o;
}

static ferry__window *open_window(const ferry__window_opts *o)
{
    ferry__window *win = NULL;
    assert_int_equal(ferry__window_new(&win, o), FERRY_OK);
    assert_int_equal(ferry__window_phase(win), FERRY__PHASE_STARTING);
    assert_int_equal(ferry__window_start(win, N_ITEMS), FERRY_OK);
    /* Running, so tasks can go out, but not open until the scheduler says
     * every worker it waits for is ready. */
    assert_int_equal(ferry__window_phase(win), FERRY__PHASE_RUNNING);
    assert_false(ferry__window_is_open(win));
    ferry__window_open(win);
    assert_int_equal(ferry__window_wait_started(win), FERRY_OK);
    return win;
}

/* A batch whose one field holds its seq, backed by a heap block. */
static ferry_batch *make_batch(const ferry__window_entry *e)
{
    uint64_t *data = aligned_alloc(64, 64);
    assert_non_null(data);
    data[0] = e->t.seq;
    ferry_tensor f = {
        .name = "seq", .dtype = FERRY_DTYPE_U64, .ndim = 1, .data = data, .nbytes = 8};
    f.shape[0] = 1;
    ferry_batch_info info = {.seq = e->t.seq, .epoch = e->t.epoch, .size = e->t.count};
    ferry_batch *b = NULL;
    ferry__batch_backing backing = {.release = free, .ctx = data};
    assert_int_equal(ferry__batch_new(&b, &f, 1, &info, e->indices, backing), FERRY_OK);
    return b;
}

static ferry__window_entry *take_and_send(ferry__window *win, uint32_t worker)
{
    ferry__window_entry *e = ferry__window_take(win);
    assert_non_null(e);
    ferry__window_sent(win, e, worker, 1000);
    return e;
}

static void answer(ferry__window *win, ferry__window_entry *e)
{
    ferry__window_complete(win, e, make_batch(e), 0, NULL, 2000);
}

/* The seq of the next delivered batch (which must be a batch). */
static uint64_t next_seq(ferry__window *win)
{
    ferry_batch *b = NULL;
    int rc = ferry__window_next(win, &b, -1);
    if (rc != FERRY_OK)
        fail_msg("next: %s: %s", ferry_err_name(rc), ferry_last_error());
    ferry_tensor t;
    assert_int_equal(ferry_batch_field(b, "seq", &t), FERRY_OK);
    uint64_t seq = *(const uint64_t *)t.data;
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    assert_int_equal(info.seq, seq);
    ferry_batch_release(b);
    return seq;
}

static void test_window_fills_to_prefetch_and_no_further(void **state)
{
    (void)state;
    ferry__window_opts o = opts(3, 1);
    ferry__window *win = open_window(&o);
    for (uint64_t i = 0; i < 3; i++) {
        ferry__window_entry *e = take_and_send(win, (uint32_t)i % 2);
        assert_int_equal(e->t.seq, i);
        assert_int_equal(e->t.count, BATCH);
        assert_int_equal(e->indices[0], i * BATCH); /* no shuffle: positions in order */
    }
    assert_null(ferry__window_take(win));
    assert_int_equal(ferry__window_outstanding(win, 0), 2);
    assert_int_equal(ferry__window_outstanding(win, 1), 1);
    ferry_stats st;
    ferry__window_stats(win, &st);
    assert_int_equal(st.in_flight, 3);
    assert_int_equal(st.dispatched, 3);
    ferry__window_free(win); /* frees what is still in flight */
}

static void count_wake(void *arg)
{
    (*(int *)arg)++;
}

/* A full window of 8 drained by the trainer wakes the scheduler when 2
 * slots are free, once, not on every delivery; a window of 4 on the first
 * free slot. Either way a window that is not full never wakes it (replies
 * do). */
static void test_window_wakes_the_scheduler_once_per_quarter_drained(void **state)
{
    (void)state;
    ferry__window_opts o = opts(8, 1);
    ferry__window *win = open_window(&o);
    int wakes = 0;
    ferry__window_set_wake(win, count_wake, &wakes);
    for (int i = 0; i < 8; i++)
        answer(win, take_and_send(win, (uint32_t)i % 2));
    assert_int_equal(next_seq(win), 0);
    assert_int_equal(wakes, 0);
    assert_int_equal(next_seq(win), 1);
    assert_int_equal(wakes, 1);
    assert_int_equal(next_seq(win), 2);
    assert_int_equal(wakes, 1);
    for (int i = 0; i < 2; i++) /* the scheduler refills: seqs 8 and 9, the last */
        answer(win, take_and_send(win, (uint32_t)i));
    assert_null(ferry__window_take(win));
    for (uint64_t seq = 3; seq < 10; seq++)
        assert_int_equal(next_seq(win), seq);
    assert_int_equal(wakes, 2); /* 8 -> 6 in flight again */
    ferry__window_free(win);

    o = opts(4, 1);
    win = open_window(&o);
    wakes = 0;
    ferry__window_set_wake(win, count_wake, &wakes);
    for (int i = 0; i < 4; i++)
        answer(win, take_and_send(win, (uint32_t)i % 2));
    assert_int_equal(next_seq(win), 0);
    assert_int_equal(wakes, 1);
    assert_int_equal(next_seq(win), 1);
    assert_int_equal(wakes, 1);
    ferry__window_free(win);
}

static void test_window_delivers_in_order_whatever_the_completion_order(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *e[4];
    for (int i = 0; i < 4; i++)
        e[i] = take_and_send(win, (uint32_t)i % 2);
    for (int i = 3; i >= 0; i--)
        answer(win, e[i]);
    for (uint64_t i = 0; i < 4; i++) {
        assert_int_equal(next_seq(win), i);
        /* Each delivery frees a slot, and the window takes the next seq. */
        ferry__window_entry *n = take_and_send(win, 0);
        assert_int_equal(n->t.seq, 4 + i);
        answer(win, n);
    }
    for (uint64_t i = 4; i < 8; i++)
        assert_int_equal(next_seq(win), i);
    ferry__window_free(win);
}

static void test_window_out_of_order_delivers_as_completed(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 0);
    ferry__window *win = open_window(&o);
    ferry__window_entry *e[4];
    for (int i = 0; i < 4; i++)
        e[i] = take_and_send(win, (uint32_t)i % 2);
    answer(win, e[2]);
    answer(win, e[0]);
    assert_int_equal(next_seq(win), 2);
    assert_int_equal(next_seq(win), 0);
    /* A straggler (seq 1) does not hold the window: two new tasks go out. */
    assert_int_equal(take_and_send(win, 0)->t.seq, 4);
    assert_int_equal(take_and_send(win, 0)->t.seq, 5);
    assert_null(ferry__window_take(win));
    answer(win, e[1]);
    assert_int_equal(next_seq(win), 1);
    ferry__window_free(win);
}

static void test_window_find_names_exactly_one_task(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *a = take_and_send(win, 0);
    ferry__window_entry *b = take_and_send(win, 1);
    assert_ptr_equal(ferry__window_find(win, 0, a->id), a);
    assert_ptr_equal(ferry__window_find(win, 1, b->id), b);
    assert_null(ferry__window_find(win, 1, a->id));              /* another worker's task */
    assert_null(ferry__window_find(win, 0, a->id + (1u << 10))); /* same slot, other seq */
    assert_null(ferry__window_find(win, 0, 1023));               /* a slot past prefetch */
    uint64_t old = a->id;
    answer(win, a);
    assert_null(ferry__window_find(win, 0, old)); /* answered: a second reply is stale */
    ferry__window_free(win);
}

static void test_window_requeue_resends_lowest_seq_first_and_charges_the_current_task(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *e[4];
    for (int i = 0; i < 4; i++)
        e[i] = take_and_send(win, (uint32_t)i % 2); /* worker 0: seqs 0, 2 */
    uint64_t since = 0;
    assert_ptr_equal(ferry__window_current(win, 0, &since), e[0]);
    assert_int_equal(since, 1000);
    uint64_t id0 = e[0]->id;
    ferry__window_requeue(win, 0, FERRY__CHARGE_OLDEST, 0, "worker 0 died");
    assert_int_equal(ferry__window_outstanding(win, 0), 0);
    assert_null(ferry__window_current(win, 0, NULL));
    assert_null(ferry__window_find(win, 0, id0)); /* its late reply is stale */
    /* Sent again, lowest seq first, to the surviving worker. */
    ferry__window_entry *r0 = take_and_send(win, 1);
    ferry__window_entry *r2 = take_and_send(win, 1);
    assert_int_equal(r0->t.seq, 0);
    assert_int_equal(r0->attempts, 1); /* the task it was on */
    assert_int_equal(r2->t.seq, 2);
    assert_int_equal(r2->attempts, 0);    /* only queued behind it: free */
    assert_null(ferry__window_take(win)); /* window still full */
    for (int i = 0; i < 4; i++)
        answer(win, e[i]);
    for (uint64_t i = 0; i < 4; i++)
        assert_int_equal(next_seq(win), i);
    ferry__window_free(win);
}

/* A worker's own word says which task killed it: that one is charged, even
 * though an older one (whose reply died with it) is still outstanding; a
 * word naming a task it no longer has charges nobody. */
static void test_window_charges_exactly_the_task_the_worker_named(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *e[4];
    for (int i = 0; i < 4; i++)
        e[i] = take_and_send(win, (uint32_t)i % 2); /* worker 0: seqs 0, 2 */
    ferry__window_requeue(win, 0, FERRY__CHARGE_TASK, e[2]->id, "crashed on seq 2");
    assert_int_equal(e[0]->attempts, 0);
    assert_int_equal(e[2]->attempts, 1);
    uint64_t gone = e[1]->id;
    answer(win, e[1]);
    ferry__window_requeue(win, 1, FERRY__CHARGE_TASK, gone, "a word from a finished task");
    assert_int_equal(e[3]->attempts, 0);
    for (int i = 0; i < 3; i++) /* seqs 0, 2, 3 go out again */
        answer(win, take_and_send(win, 0));
    for (uint64_t i = 0; i < 4; i++)
        assert_int_equal(next_seq(win), i);
    ferry__window_free(win);
}

static void test_window_unsent_task_goes_out_again_first(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *a = ferry__window_take(win);
    ferry__window_entry *b = ferry__window_take(win);
    ferry__window_unsent(win, b); /* the send failed */
    ferry__window_unsent(win, a);
    assert_ptr_equal(ferry__window_take(win), a);
    assert_ptr_equal(ferry__window_take(win), b);
    assert_int_equal(ferry__window_take(win)->t.seq, 2);
    ferry__window_free(win);
}

static void test_window_gives_a_batch_up_after_max_attempts(void **state)
{
    (void)state;
    ferry__window_opts o = opts(4, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *a = take_and_send(win, 0);
    ferry__window_entry *b = take_and_send(win, 1);
    ferry__window_requeue(win, 0, FERRY__CHARGE_OLDEST, 0, "first death");
    assert_ptr_equal(take_and_send(win, 0), a);
    ferry__window_requeue(win, 0, FERRY__CHARGE_TASK, a->id,
                          "worker 0 (pid 42) was killed by signal SIGSEGV");
    /* Given up: not sent again, delivered as a failure naming its indices. */
    assert_int_equal(ferry__window_take(win)->t.seq, 2);
    answer(win, b);
    ferry_batch *out = NULL;
    assert_int_equal(ferry__window_next(win, &out, -1), FERRY_EBATCH);
    assert_null(out);
    assert_non_null(strstr(ferry_last_error(), "indices 0, 1"));
    assert_non_null(strstr(ferry_last_error(), "after 2 workers died"));
    assert_non_null(strstr(ferry_last_error(), "SIGSEGV"));
    assert_int_equal(next_seq(win), 1); /* the run goes on */
    ferry_stats st;
    ferry__window_stats(win, &st);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.delivered, 2);
    ferry__window_free(win);
}

static void test_window_uncharged_requeue_never_gives_up(void **state)
{
    (void)state;
    ferry__window_opts o = opts(2, 1);
    ferry__window *win = open_window(&o);
    ferry__window_entry *a = take_and_send(win, 0);
    for (int i = 0; i < 5; i++) { /* a remote worker that said BYE, five times */
        ferry__window_requeue(win, 0, FERRY__CHARGE_NONE, 0, "it said BYE");
        assert_ptr_equal(take_and_send(win, 0), a);
    }
    assert_int_equal(a->attempts, 0);
    answer(win, a);
    assert_int_equal(next_seq(win), 0);
    ferry__window_free(win);
}

static void test_window_resume_starts_after_the_last_delivered_batch(void **state)
{
    (void)state;
    ferry__window_opts o = opts(3, 1);
    ferry__window *win = open_window(&o);
    for (uint64_t i = 0; i < 6; i++) { /* across the epoch boundary (5 a epoch) */
        ferry__window_entry *e = take_and_send(win, 0);
        answer(win, e);
        assert_int_equal(next_seq(win), i);
    }
    take_and_send(win, 0); /* in flight, not delivered: not part of the position */
    unsigned char blob[FERRY_STATE_MAX];
    size_t len = 0;
    assert_int_equal(ferry__window_save(win, blob, sizeof blob, &len), FERRY_OK);
    ferry__window_free(win);

    o.state = blob;
    o.state_len = len;
    win = open_window(&o);
    ferry__window_entry *e = take_and_send(win, 1);
    assert_int_equal(e->t.seq, 6);
    assert_int_equal(e->t.epoch, 1);
    assert_int_equal(e->t.batch_in_epoch, 1);
    answer(win, e);
    assert_int_equal(next_seq(win), 6);
    ferry__window_free(win);
}

/* A fed window: 3 batches an epoch of at most 4 indices each, 2 epochs. */
static ferry__window_opts fed_opts(void)
{
    ferry__window_opts o = opts(4, 1);
    o.sampler.batch_size = 1;
    o.feed_max = 4;
    o.feed_batches = 3;
    return o;
}

/* A batch is not started before the trainer fed it; then it carries
 * exactly the fed indices, in order, batch counts of any size up to
 * feed_max, across the epoch boundary; a resend carries them again. */
static void test_window_fed_batches_carry_the_fed_indices_and_wait_for_them(void **state)
{
    (void)state;
    ferry__window_opts o = fed_opts();
    ferry__window *win = open_window(&o);
    assert_null(ferry__window_take(win)); /* nothing fed yet */
    uint32_t counts[4] = {2, 4, 1, 3};
    uint64_t idx[10] = {9, 3, 0, 1, 2, 8, 7, 5, 5, 6};
    assert_int_equal(ferry__window_feed(win, 0, 2, counts, idx), FERRY_OK);
    ferry__window_entry *a = take_and_send(win, 0), *b = take_and_send(win, 1);
    assert_null(ferry__window_take(win)); /* batch 2 not fed */
    assert_int_equal(a->t.count, 2);
    assert_int_equal(a->indices[0], 9);
    assert_int_equal(a->indices[1], 3);
    assert_int_equal(b->t.count, 4);
    assert_int_equal(b->indices[0], 0);
    assert_int_equal(b->indices[3], 8);
    /* Fed again from the start (as after a resume), then on past the epoch. */
    assert_int_equal(ferry__window_feed(win, 0, 4, counts, idx), FERRY_OK);
    ferry__window_entry *c = take_and_send(win, 0), *d = take_and_send(win, 1);
    assert_int_equal(c->t.seq, 2);
    assert_int_equal(c->t.count, 1);
    assert_int_equal(c->indices[0], 7);
    assert_int_equal(d->t.epoch, 1);
    assert_int_equal(d->t.batch_in_epoch, 0);
    assert_int_equal(d->t.count, 3);
    assert_int_equal(d->indices[0], 5);
    assert_int_equal(d->indices[2], 6);
    /* Worker 1 dies: its batches go out again with their indices. */
    ferry__window_requeue(win, 1, FERRY__CHARGE_OLDEST, 0, "worker 1 died");
    ferry__window_entry *again = take_and_send(win, 0);
    assert_int_equal(again->t.seq, 1);
    assert_int_equal(again->indices[0], 0);
    assert_int_equal(again->t.count, 4);
    answer(win, a);
    answer(win, again);
    assert_int_equal(next_seq(win), 0);
    assert_int_equal(next_seq(win), 1);
    ferry__window_free(win);
}

/* A fed window skips the rest of an epoch as one that draws its own
 * indices: the batch in flight is dropped when it comes, the one fed and
 * never taken is never sent, and the next epoch's batches carry their fed
 * indices; the next epoch's first slot held by the dropped batch is
 * waited for; a skip past what was fed waits for the feed. */
static void test_window_fed_skips_the_rest_of_an_epoch(void **state)
{
    (void)state;
    ferry__window_opts o = fed_opts();
    ferry__window *win = open_window(&o);
    uint32_t counts[6] = {1, 1, 1, 2, 3, 4};
    uint64_t idx[12] = {0, 1, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5};
    assert_int_equal(ferry__window_feed(win, 0, 6, counts, idx), FERRY_OK);
    ferry__window_entry *a = take_and_send(win, 0), *b = take_and_send(win, 1);
    answer(win, a);
    assert_int_equal(next_seq(win), 0);
    uint64_t skipped = 0;
    assert_int_equal(ferry__window_skip_epoch(win, &skipped), FERRY_OK);
    assert_int_equal(skipped, 2); /* seq 1 in flight, seq 2 never taken */
    ferry__window_entry *c = take_and_send(win, 0), *d = take_and_send(win, 0);
    assert_int_equal(c->t.seq, 3);
    assert_int_equal(c->t.count, 2);
    assert_int_equal(c->indices[1], 3);
    assert_int_equal(d->t.seq, 4);
    assert_int_equal(d->indices[2], 4);
    assert_null(ferry__window_take(win)); /* seq 5's slot is seq 1's, in flight */
    answer(win, b); /* dropped */
    ferry__window_entry *e = take_and_send(win, 1);
    assert_int_equal(e->t.seq, 5);
    assert_int_equal(e->t.count, 4);
    answer(win, d);
    answer(win, c);
    answer(win, e);
    assert_int_equal(next_seq(win), 3);
    assert_int_equal(next_seq(win), 4);
    assert_int_equal(next_seq(win), 5);
    ferry_batch *end = NULL;
    assert_int_equal(ferry__window_next(win, &end, 0), FERRY_EOF);
    ferry__window_free(win);

    /* Fed only up to the skip's end: the next epoch waits for its feed. */
    win = open_window(&o);
    assert_int_equal(ferry__window_feed(win, 0, 2, counts, idx), FERRY_OK);
    answer(win, take_and_send(win, 0));
    assert_int_equal(next_seq(win), 0);
    assert_int_equal(ferry__window_skip_epoch(win, &skipped), FERRY_OK);
    assert_int_equal(skipped, 2);
    assert_null(ferry__window_take(win));
    assert_int_equal(ferry__window_feed(win, 2, 4, counts + 2, idx + 2), FERRY_OK);
    e = take_and_send(win, 0);
    assert_int_equal(e->t.seq, 3);
    assert_int_equal(e->indices[0], 3);
    ferry__window_entry *f = take_and_send(win, 0); /* slot 0, seq 0's: delivered */
    assert_int_equal(f->t.seq, 4);
    answer(win, e);
    answer(win, f);
    assert_int_equal(next_seq(win), 3);
    assert_int_equal(next_seq(win), 4);
    ferry__window_free(win);
}

/* A feed with a gap, a count out of range or an index past the dataset
 * is refused whole, saying why, and changes nothing. */
static void test_window_a_bad_feed_is_refused_whole(void **state)
{
    (void)state;
    ferry__window_opts o = fed_opts();
    ferry__window *win = open_window(&o);
    uint32_t ok[2] = {1, 1}, zero[2] = {1, 0}, big[1] = {5};
    uint64_t idx[2] = {1, 2}, past[2] = {1, N_ITEMS};
    assert_int_equal(ferry__window_feed(win, 1, 1, ok, idx), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "batch 0 is the next to feed"));
    assert_int_equal(ferry__window_feed(win, 0, 2, zero, idx), FERRY_EINVAL);
    assert_int_equal(ferry__window_feed(win, 0, 1, big, idx), FERRY_EINVAL);
    assert_int_equal(ferry__window_feed(win, 0, 2, ok, past), FERRY_ERANGE);
    assert_non_null(strstr(ferry_last_error(), "index 10, but the dataset has 10 items"));
    assert_null(ferry__window_take(win));
    assert_int_equal(ferry__window_feed(win, 0, 2, ok, idx), FERRY_OK);
    assert_int_equal(take_and_send(win, 0)->indices[0], 1);
    ferry__window_free(win);

    ferry__window_opts plain = opts(2, 1);
    win = open_window(&plain);
    assert_int_equal(ferry__window_feed(win, 0, 2, ok, idx), FERRY_EINVAL);
    ferry__window_free(win);
}

/* A long run fed an epoch at a time keeps only what is not taken yet. */
static void test_window_feed_forgets_what_was_taken(void **state)
{
    (void)state;
    ferry__window_opts o = fed_opts();
    o.sampler.epochs = 0;
    ferry__window *win = open_window(&o);
    uint32_t counts[3] = {4, 4, 4};
    uint64_t idx[12];
    for (uint64_t epoch = 0; epoch < 200; epoch++) {
        for (uint64_t i = 0; i < 12; i++)
            idx[i] = (epoch + i) % N_ITEMS;
        assert_int_equal(ferry__window_feed(win, epoch * 3, 3, counts, idx), FERRY_OK);
        for (int k = 0; k < 3; k++) {
            ferry__window_entry *e = take_and_send(win, 0);
            assert_int_equal(e->indices[3], (epoch + (uint64_t)k * 4 + 3) % N_ITEMS);
            answer(win, e);
            assert_int_equal(next_seq(win), epoch * 3 + (uint64_t)k);
        }
    }
    ferry__window_free(win);
}

static void test_window_end_of_stream_and_failure_are_reported(void **state)
{
    (void)state;
    ferry__window_opts o = opts(8, 1);
    ferry__window *win = open_window(&o);
    for (uint64_t i = 0; i < 10; i++) { /* 2 epochs of 5 */
        answer(win, take_and_send(win, 0));
        if (i >= 2)
            assert_int_equal(next_seq(win), i - 2);
    }
    assert_null(ferry__window_take(win)); /* the sampler has ended */
    assert_int_equal(next_seq(win), 8);
    assert_int_equal(next_seq(win), 9);
    ferry_batch *b = NULL;
    assert_int_equal(ferry__window_next(win, &b, -1), FERRY_EOF);

    ferry__window_fail(win, FERRY_EWORKER, "worker 1 (pid 7) exited with code 3");
    ferry__window_fail(win, FERRY_ECLOSED, "a later cause"); /* the first one stays */
    assert_int_equal(ferry__window_next(win, &b, -1), FERRY_EWORKER);
    assert_string_equal(ferry_last_error(), "worker 1 (pid 7) exited with code 3");
    assert_int_equal(ferry__window_phase(win), FERRY__PHASE_FAILED);
    assert_null(ferry__window_take(win));
    ferry__window_free(win);
}

static void test_window_bad_resume_state_fails_the_start(void **state)
{
    (void)state;
    unsigned char junk[16] = {1, 2, 3};
    ferry__window_opts o = opts(2, 1);
    o.state = junk;
    o.state_len = sizeof junk;
    ferry__window *win = NULL;
    assert_int_equal(ferry__window_new(&win, &o), FERRY_OK);
    assert_int_equal(ferry__window_start(win, N_ITEMS), FERRY_ESTATE);
    assert_int_equal(ferry__window_wait_started(win), FERRY_ESTATE);
    ferry__window_free(win);
    o.prefetch = FERRY__WINDOW_MAX + 1;
    assert_int_equal(ferry__window_new(&win, &o), FERRY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_fills_to_prefetch_and_no_further),
        cmocka_unit_test(test_window_fed_batches_carry_the_fed_indices_and_wait_for_them),
        cmocka_unit_test(test_window_a_bad_feed_is_refused_whole),
        cmocka_unit_test(test_window_fed_skips_the_rest_of_an_epoch),
        cmocka_unit_test(test_window_feed_forgets_what_was_taken),
        cmocka_unit_test(test_window_wakes_the_scheduler_once_per_quarter_drained),
        cmocka_unit_test(test_window_delivers_in_order_whatever_the_completion_order),
        cmocka_unit_test(test_window_out_of_order_delivers_as_completed),
        cmocka_unit_test(test_window_find_names_exactly_one_task),
        cmocka_unit_test(test_window_requeue_resends_lowest_seq_first_and_charges_the_current_task),
        cmocka_unit_test(test_window_charges_exactly_the_task_the_worker_named),
        cmocka_unit_test(test_window_unsent_task_goes_out_again_first),
        cmocka_unit_test(test_window_gives_a_batch_up_after_max_attempts),
        cmocka_unit_test(test_window_uncharged_requeue_never_gives_up),
        cmocka_unit_test(test_window_resume_starts_after_the_last_delivered_batch),
        cmocka_unit_test(test_window_end_of_stream_and_failure_are_reported),
        cmocka_unit_test(test_window_bad_resume_state_fails_the_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
