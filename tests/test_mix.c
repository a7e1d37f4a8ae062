/*
 * test_mix.c - several sources drawn by weight (sampler/mix.h), on the
 * sampler alone: what a spec may say, that every source's draws are whole
 * passes, that the realized weights follow the schedule, and that a mixed
 * stream resumes, on another number of ranks and batch size, before, at
 * and after a change of weights with nothing lost or repeated. The loader
 * around it (workers, a worker killed, ferry.Mix) is tested in
 * python/tests/test_mix.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ferry.h"
#include "mix.h"
#include "sampler.h"

/* Three sources, the second 10x smaller, and a change of weights at
 * position 100000 (in the mixed order's second epoch: length 63000). */
#define SPEC "30000,3000,30000;0:0.5,0.2,0.3;100000:0.2,0.5,0.3"
static const uint64_t sizes[3] = {30000, 3000, 30000};
static const uint64_t offsets[3] = {0, 30000, 33000};
#define TOTAL 63000
#define CHANGE 100000
#define SEED 11

static ferry__mix *parse(const char *spec)
{
    ferry__mix *m = NULL;
    assert_int_equal(ferry__mix_parse(spec, &m), FERRY_OK);
    return m;
}

static uint32_t source_of(uint64_t index)
{
    return index >= offsets[2] ? 2 : index >= offsets[1] ? 1 : 0;
}

static void test_a_bad_spec_is_refused_with_what_is_wrong(void **unused)
{
    static const struct {
        const char *spec, *why;
    } bad[] = {
        {"", "no schedule"},
        {"100,200", "no schedule"},
        {"100,200;5:1,1", "first step must be 0"},
        {"100;0:1,1", "2 weights for 1 sources"},
        {"100,0;0:1,1", "source 1's size \"0\""},
        {"100,x;0:1,1", "source 1's size \"x\""},
        {"100,200;0:0,0", "every weight is 0"},
        {"100,200;0:1,1;0:1,2", "does not come after"},
        {"100,200;0:1,1;50:1,2;20:1,1", "does not come after"},
        {"100,200;0:1,-1", "weight \"-1\""},
        {"100,200;0:1,inf", "weight \"inf\""},
        {"100,200;0:1", "1 weights for 2 sources"},
        {"100,200;0:1,1;length=0", "length="},
        {"100,200;0:1,1;length=5;length=6", "length="},
        {"100,200;1,1", "not STEP:WEIGHTS"},
    };
    (void)unused;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry__mix *m = NULL;
        assert_int_equal(ferry__mix_parse(bad[i].spec, &m), FERRY_EINVAL);
        assert_null(m);
        if (!strstr(ferry_last_error(), bad[i].why))
            fail_msg("spec \"%s\": \"%s\" does not say \"%s\"", bad[i].spec, ferry_last_error(),
                     bad[i].why);
    }
}

/* Up to a block boundary every source has served whole passes and one
 * partial pass: each item p or p + 1 times, and exactly (draws % size) of
 * them p + 1 times. A gap or a repeat in a source's draws breaks that. */
static void test_each_source_serves_whole_passes_of_its_own_order(void **unused)
{
    (void)unused;
    ferry__mix *m = parse(SPEC);
    /* Segment 0 has 24 whole blocks and a short one; then 30 of segment 1. */
    const uint64_t end = CHANGE + 30 * FERRY__MIX_BLOCK;
    uint32_t *count = calloc(TOTAL, sizeof *count);
    uint64_t draws[3] = {0};
    ferry__mix_cursor c;
    ferry__mix_cursor_init(&c);
    for (uint64_t g = 0; g < end; g++) {
        uint32_t k;
        uint64_t i = ferry__mix_draw(m, SEED, 1, g, &c, &k);
        assert_true(i < TOTAL);
        assert_int_equal(k, source_of(i));
        count[i]++;
        draws[k]++;
    }
    for (int k = 0; k < 3; k++) {
        uint64_t passes = draws[k] / sizes[k], more = 0;
        for (uint64_t i = offsets[k]; i < offsets[k] + sizes[k]; i++) {
            assert_true(count[i] == passes || count[i] == passes + 1);
            more += count[i] == passes + 1;
        }
        assert_int_equal(more, draws[k] % sizes[k]);
    }
    /* The small source, drawn 5x as often per item, is well into later passes. */
    assert_true(draws[1] / sizes[1] >= 10 && draws[0] / sizes[0] <= 2);
    free(count);
    ferry__mix_free(m);
}

/* Over every window of 10^5 positions each source's share is within 1% of
 * its weight; a whole block holds the weights to 1/4096. Draws at random
 * with these weights would miss the block test; a wrong quota or a wrong
 * segment misses both. One rank's stride sees the weights too. */
static void test_the_realized_weights_follow_the_schedule(void **unused)
{
    (void)unused;
    static const double w[2][3] = {{0.5, 0.2, 0.3}, {0.2, 0.5, 0.3}};
    ferry__mix *m = parse(SPEC);
    ferry__mix_cursor c;
    ferry__mix_cursor_init(&c);
    for (int seg = 0; seg < 2; seg++) {
        uint64_t first = seg ? CHANGE : 0;
        /* a whole block, exactly (segment 0's first; segment 1's third) */
        uint64_t n[3] = {0};
        for (uint64_t g = first + 2 * seg * FERRY__MIX_BLOCK;
             g < first + (2 * seg + 1) * FERRY__MIX_BLOCK; g++) {
            uint32_t k;
            ferry__mix_draw(m, SEED, 1, g, &c, &k);
            n[k]++;
        }
        for (int k = 0; k < 3; k++) {
            double share = (double)n[k] / FERRY__MIX_BLOCK;
            assert_true(share > w[seg][k] - 1.0 / FERRY__MIX_BLOCK &&
                        share < w[seg][k] + 1.0 / FERRY__MIX_BLOCK);
        }
        /* 10^5 positions from an odd place, and rank 3 of 8's share of 10^6 */
        uint64_t a[3] = {0}, r[3] = {0}, span = seg ? 1000000 : CHANGE - 777;
        for (uint64_t g = first + 777; g < first + 777 + 100000 && g < first + span + 777; g++) {
            uint32_t k;
            ferry__mix_draw(m, SEED, 1, g, &c, &k);
            a[k]++;
        }
        for (uint64_t g = first + 3; seg && g < first + span; g += 8) {
            uint32_t k;
            ferry__mix_draw(m, SEED, 1, g, &c, &k);
            r[k]++;
        }
        uint64_t na = a[0] + a[1] + a[2], nr = r[0] + r[1] + r[2];
        for (int k = 0; k < 3; k++) {
            double share = (double)a[k] / (double)na;
            if (share < w[seg][k] * 0.99 || share > w[seg][k] * 1.01)
                fail_msg("segment %d source %d: share %.4f of %llu, weight %.2f", seg, k, share,
                         (unsigned long long)na, w[seg][k]);
            if (nr) {
                share = (double)r[k] / (double)nr;
                if (share < w[seg][k] * 0.99 || share > w[seg][k] * 1.01)
                    fail_msg("rank 3 of 8, source %d: share %.4f, weight %.2f", k, share,
                             w[seg][k]);
            }
        }
    }
    ferry__mix_free(m);
}

/* The seed decides the draw; the same (seed, position) always the same. */
static void test_the_draw_is_a_function_of_seed_and_position(void **unused)
{
    (void)unused;
    ferry__mix *m = parse(SPEC);
    ferry__mix_cursor c1, c2, c3; /* a cursor is one seed's */
    ferry__mix_cursor_init(&c1);
    ferry__mix_cursor_init(&c2);
    ferry__mix_cursor_init(&c3);
    uint64_t same = 0;
    for (uint64_t g = 0; g < 20000; g++) {
        /* c2 sees the positions backwards: no cache carries anything over */
        uint64_t a = ferry__mix_draw(m, SEED, 1, g, &c1, NULL);
        ferry__mix_draw(m, SEED, 1, 19999 - g, &c2, NULL);
        assert_int_equal(a, ferry__mix_draw(m, SEED, 1, g, &c2, NULL));
        same += a == ferry__mix_draw(m, SEED + 1, 1, g, &c3, NULL);
    }
    assert_true(same < 1000); /* another seed, another draw */
    /* Without shuffle each source is served in its own order: block 0
     * holds the first items of each, a run from its first. */
    uint64_t lo[3] = {UINT64_MAX, UINT64_MAX, UINT64_MAX}, hi[3] = {0}, n[3] = {0};
    ferry__mix_cursor_init(&c1);
    for (uint64_t g = 0; g < FERRY__MIX_BLOCK; g++) {
        uint32_t k;
        uint64_t i = ferry__mix_draw(m, SEED, 0, g, &c1, &k);
        lo[k] = i < lo[k] ? i : lo[k];
        hi[k] = i > hi[k] ? i : hi[k];
        n[k]++;
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(lo[k], offsets[k]);
        assert_int_equal(hi[k] - lo[k] + 1, n[k]);
    }
    ferry__mix_free(m);
}

/* A source's passes are fair shuffles: for a source of 5 items, over
 * 240000 passes every one of the 120 orders comes within 12% of 2000
 * times (a binomial's spread is 2.2%: this is 5 of them), and each pass is
 * an order. Rounds too few or too weak miss it (one multiply a round
 * made the identity 4x as likely). */
static void test_each_pass_of_a_small_source_is_a_fair_shuffle(void **unused)
{
    (void)unused;
    ferry__mix *m = parse("7,5;0:1,1");
    ferry__mix_cursor c;
    ferry__mix_cursor_init(&c);
    static uint32_t seen[5 * 5 * 5 * 5 * 5];
    memset(seen, 0, sizeof seen);
    for (uint64_t pass = 0; pass < 240000; pass++) {
        uint32_t code = 0, used = 0;
        for (uint64_t j = 0; j < 5; j++) {
            uint64_t i = ferry__mix_item(m, SEED, 1, 1, pass * 5 + j, &c) - 7;
            assert_true(i < 5 && !(used & 1u << i));
            used |= 1u << i;
            code = code * 5 + (uint32_t)i;
        }
        seen[code]++;
    }
    uint32_t orders = 0;
    for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++) {
        if (!seen[i])
            continue;
        orders++;
        if (seen[i] < 1760 || seen[i] > 2240)
            fail_msg("order %zu came %lu times of 240000, not 2000 +- 12%%", i,
                     (unsigned long)seen[i]);
    }
    assert_int_equal(orders, 120);
    ferry__mix_free(m);
}

/* ------------------------------------------------------------------------
 * Resume, on the sampler (the loader's arithmetic)
 */

static ferry__sampler mixed(const ferry__mix *m, uint32_t w, uint32_t rank, uint64_t batch)
{
    ferry__sampler_opts o = {.batch_size = batch,
                             .shuffle = 1,
                             .seed = SEED,
                             .rank = rank,
                             .world_size = w,
                             .pad_shards = 1,
                             .mix = m};
    ferry__sampler s;
    assert_int_equal(ferry__sampler_init(&s, TOTAL, &o), FERRY_OK);
    return s;
}

/* A job of w ranks of batch b stops after k batches of `epoch`; a job of
 * w2 ranks of batch b2 resumes from rank 0's state. Across the new ranks
 * the rest of the epoch is the uninterrupted order's positions P..L-1,
 * each once (padding: the order's start again), and the next epoch is a
 * fresh w2-rank job's. */
static void resume_case(const ferry__mix *m, uint32_t w, uint64_t b, uint64_t epoch, uint64_t k,
                        uint32_t w2, uint64_t b2)
{
    ferry__sampler s = mixed(m, w, 0, b);
    unsigned char blob[FERRY_STATE_MAX];
    size_t len;
    uint64_t seq = epoch * s.batches_per_epoch + k, P = k * b * w;
    assert_int_equal(ferry__sampler_save(&s, seq, blob, sizeof blob, &len), FERRY_OK);
    assert_true(len <= 128);

    uint8_t *seen = calloc(TOTAL, 1); /* positions of the epoch served */
    uint64_t *idx = malloc(b2 * sizeof *idx), served = 0;
    for (uint32_t r = 0; r < w2; r++) {
        ferry__sampler t = mixed(m, w2, r, b2), fresh = t;
        uint64_t next;
        assert_int_equal(ferry__sampler_restore(&t, blob, len, &next), FERRY_OK);
        ferry__sampler_task task;
        uint64_t pos = P + r;
        for (uint64_t q = next; q < (epoch + 1) * t.batches_per_epoch; q++) {
            assert_int_equal(ferry__sampler_at(&t, q, &task), FERRY_OK);
            ferry__sampler_indices(&t, &task, idx);
            for (uint32_t j = 0; j < task.count; j++, pos += w2) {
                uint64_t p = pos < TOTAL ? pos : pos - TOTAL;
                assert_int_equal(idx[j], ferry__sampler_permute(&s, epoch, p));
                if (pos < TOTAL) {
                    assert_int_equal(seen[p], 0);
                    seen[p] = 1;
                    served++;
                }
            }
        }
        /* the epoch after: batch for batch a fresh job's */
        uint64_t *want = malloc(b2 * sizeof *want);
        for (uint64_t q = (epoch + 1) * t.batches_per_epoch;
             q < (epoch + 1) * t.batches_per_epoch + 5; q++) {
            ferry__sampler_task t1, t2;
            assert_int_equal(ferry__sampler_at(&t, q, &t1), FERRY_OK);
            assert_int_equal(ferry__sampler_at(&fresh, q, &t2), FERRY_OK);
            ferry__sampler_indices(&t, &t1, idx);
            ferry__sampler_indices(&fresh, &t2, want);
            assert_memory_equal(idx, want, t1.count * sizeof *idx);
        }
        free(want);
    }
    assert_int_equal(served, TOTAL - P);
    free(seen);
    free(idx);
}

static void test_a_mixed_stream_resumes_on_another_shape_around_a_change(void **unused)
{
    (void)unused;
    ferry__mix *m = parse(SPEC);
    /* The change is at position 37000 of epoch 1. 8 ranks of 32 take 256
     * positions a step: step 140 is before it (35840), 144 the step that
     * holds it (36864..37119), 150 after it (38400). */
    static const uint64_t steps[] = {140, 144, 150};
    static const uint32_t to[] = {1, 3, 4, 6, 16};
    for (size_t i = 0; i < 3; i++) {
        for (size_t j = 0; j < sizeof to / sizeof to[0]; j++)
            resume_case(m, 8, 32, 1, steps[i], to[j], 32);
        resume_case(m, 8, 32, 1, steps[i], 6, 48); /* and a batch-size ramp */
        resume_case(m, 4, 64, 1, steps[i], 8, 16);
    }
    resume_case(m, 8, 32, 2, 0, 6, 32); /* at an epoch's start */
    ferry__mix_free(m);
}

/* A state of another mix, or of none, is refused by name; the state of a
 * mixed stream is as small as any. (A schedule changed only ahead of the
 * saved position is another matter: the next case.) */
static void test_a_state_of_another_mix_is_refused(void **unused)
{
    (void)unused;
    ferry__mix *m = parse(SPEC);
    /* Another first segment: the past differs, whatever the position. */
    ferry__mix *other = parse("30000,3000,30000;0:0.5,0.25,0.25;100000:0.2,0.5,0.3");
    ferry__sampler s = mixed(m, 2, 0, 32), t = mixed(other, 2, 0, 32), plain;
    ferry__sampler_opts po = {.batch_size = 32, .shuffle = 1, .seed = SEED, .world_size = 1};
    assert_int_equal(ferry__sampler_init(&plain, TOTAL, &po), FERRY_OK);
    unsigned char blob[FERRY_STATE_MAX], pblob[FERRY_STATE_MAX];
    size_t len, plen;
    uint64_t next;
    assert_int_equal(ferry__sampler_save(&s, 1000, blob, sizeof blob, &len), FERRY_OK);
    assert_int_equal(len, 80);
    assert_int_equal(ferry__sampler_restore(&t, blob, len, &next), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "another mix"));
    assert_int_equal(ferry__sampler_restore(&plain, blob, len, &next), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "with a mix"));
    assert_int_equal(ferry__sampler_save(&plain, 10, pblob, sizeof pblob, &plen), FERRY_OK);
    assert_int_equal(ferry__sampler_restore(&s, pblob, plen, &next), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "without a mix"));
    /* The dataset must be the sources end to end. */
    ferry__sampler_opts o = {.batch_size = 8, .world_size = 1, .mix = m};
    ferry__sampler u;
    assert_int_equal(ferry__sampler_init(&u, TOTAL + 1, &o), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "end to end"));
    ferry__mix_free(m);
    ferry__mix_free(other);
}

/* A resumed run may change the schedule ahead of where the job stands:
 * every position before it draws alike under both (so nothing drawn is
 * drawn again, nor skipped, per source), and from it on the new weights
 * hold. A change that reaches back into the block of the saved position,
 * or before it, is refused. */
static void test_a_schedule_changed_ahead_of_the_saved_position_is_taken(void **unused)
{
    (void)unused;
    ferry__mix *m = parse(SPEC);
    /* saved at epoch 1, position 960 of its order: g = 63960 */
    ferry__sampler s = mixed(m, 2, 0, 32);
    unsigned char blob[FERRY_STATE_MAX];
    size_t len;
    uint64_t next, g = TOTAL + 960;
    assert_int_equal(ferry__sampler_save(&s, 1000, blob, sizeof blob, &len), FERRY_OK);
    static const char *const ahead[] = {
        "30000,3000,30000;0:0.5,0.2,0.3;100000:0.2,0.4,0.4", /* later weights changed */
        "30000,3000,30000;0:0.5,0.2,0.3;70000:0.1,0.1,0.8",  /* the change moved earlier */
        "30000,3000,30000;0:0.5,0.2,0.3",                     /* and dropped */
    };
    for (size_t i = 0; i < sizeof ahead / sizeof ahead[0]; i++) {
        ferry__mix *n = parse(ahead[i]);
        ferry__sampler t = mixed(n, 3, 1, 16);
        if (ferry__sampler_restore(&t, blob, len, &next) != FERRY_OK)
            fail_msg("%s: %s", ahead[i], ferry_last_error());
        ferry__mix_cursor a, b;
        ferry__mix_cursor_init(&a);
        ferry__mix_cursor_init(&b);
        for (uint64_t p = 0; p < g; p++) /* the past, drawn alike */
            assert_int_equal(ferry__mix_draw(m, SEED, 1, p, &a, NULL),
                             ferry__mix_draw(n, SEED, 1, p, &b, NULL));
        ferry__mix_free(n);
    }
    static const char *const behind[] = {
        "30000,3000,30000;0:0.5,0.2,0.3;60000:0.2,0.5,0.3;100000:0.2,0.5,0.3", /* before g */
        "30000,3000,30000;0:0.5,0.2,0.3;64000:0.2,0.5,0.3", /* inside g's block */
    };
    for (size_t i = 0; i < sizeof behind / sizeof behind[0]; i++) {
        ferry__mix *n = parse(behind[i]);
        ferry__sampler t = mixed(n, 2, 0, 32);
        assert_int_equal(ferry__sampler_restore(&t, blob, len, &next), FERRY_ESTATE);
        assert_non_null(strstr(ferry_last_error(), "differs before position 63960"));
        ferry__mix_free(n);
    }
    ferry__mix_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_bad_spec_is_refused_with_what_is_wrong),
        cmocka_unit_test(test_each_source_serves_whole_passes_of_its_own_order),
        cmocka_unit_test(test_the_realized_weights_follow_the_schedule),
        cmocka_unit_test(test_the_draw_is_a_function_of_seed_and_position),
        cmocka_unit_test(test_each_pass_of_a_small_source_is_a_fair_shuffle),
        cmocka_unit_test(test_a_mixed_stream_resumes_on_another_shape_around_a_change),
        cmocka_unit_test(test_a_state_of_another_mix_is_refused),
        cmocka_unit_test(test_a_schedule_changed_ahead_of_the_saved_position_is_taken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
