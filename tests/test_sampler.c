/*
 * test_sampler.c - unit tests of the index stream (sampler/sampler.c).
 *
 * The sampler is pure computation, so these tests start no process and need
 * no harness: each builds samplers from options and checks the stream's
 * promises directly. Permutations are checked exhaustively with a bitmap
 * (every index hit exactly once); shards and batches by collecting indices
 * over whole epochs; resume by comparing a restored stream with an
 * uninterrupted one, task by task.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ferry.h"
#include "ferry_dataset.h"
#include "sampler.h"

/* ------------------------------------------------------------------------
 * Helpers
 */

static ferry__sampler_opts opts(uint64_t batch_size, int shuffle, uint64_t seed)
{
    ferry__sampler_opts o;

    memset(&o, 0, sizeof o);
    o.batch_size = batch_size;
    o.shuffle = shuffle;
    o.seed = seed;
    o.rank = 0;
    o.world_size = 1;
    return o;
}

static ferry__sampler make(uint64_t n, const ferry__sampler_opts *o)
{
    ferry__sampler s;

    assert_int_equal(ferry__sampler_init(&s, n, o), FERRY_OK);
    return s;
}

/* A bitmap of n bits; mark() returns the bit's previous value. */
static uint8_t *bitmap_new(uint64_t n)
{
    uint8_t *m = calloc((size_t)(n / 8 + 1), 1);
    assert_non_null(m);
    return m;
}

static int mark(uint8_t *m, uint64_t i)
{
    int was = (m[i / 8] >> (i % 8)) & 1;
    m[i / 8] |= (uint8_t)(1u << (i % 8));
    return was;
}

static int marked(const uint8_t *m, uint64_t i)
{
    return (m[i / 8] >> (i % 8)) & 1;
}

/* The indices of the whole stream from `seq` for `count` tasks, flattened. */
static uint64_t collect(const ferry__sampler *s, uint64_t seq, uint64_t count, uint64_t *out)
{
    uint64_t total = 0, i;
    ferry__sampler_task t;

    for (i = 0; i < count; i++) {
        assert_int_equal(ferry__sampler_at(s, seq + i, &t), FERRY_OK);
        ferry__sampler_indices(s, &t, out + total);
        total += t.count;
    }
    return total;
}

/* ------------------------------------------------------------------------
 * The permutation
 */

static void test_permutation_is_bijection(void **state)
{
    static const uint64_t sizes[] = {1,    2,     3,     4,     5,     15,     16,
                                     17,   255,   256,   257,   1000,  4095,   4096,
                                     4097, 60000, 65535, 65536, 65537, 1000003};
    static const uint64_t seeds[] = {0, 1, 0xdeadbeefcafef00dULL};
    size_t a, b;
    uint64_t epoch, i;

    for (a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        uint64_t n = sizes[a];
        for (b = 0; b < sizeof seeds / sizeof seeds[0]; b++) {
            ferry__sampler_opts o = opts(1, 1, seeds[b]);
            ferry__sampler s = make(n, &o);
            for (epoch = 0; epoch < 3; epoch++) {
                uint8_t *m = bitmap_new(n);
                for (i = 0; i < n; i++) {
                    uint64_t v = ferry__sampler_permute(&s, epoch, i);
                    assert_true(v < n);
                    assert_false(mark(m, v)); /* hit only once */
                }
                /* n values < n, none twice: every value was hit */
                free(m);
            }
        }
    }
}

/* n so large that no bitmap fits: values stay in range and a sample of
 * positions still maps to distinct values (injective where we can look). */
static void test_permutation_stays_in_range_for_huge_n(void **state)
{
    static const uint64_t sizes[] = {(UINT64_C(1) << 32) + 1, (UINT64_C(1) << 62) + 7,
                                     (UINT64_C(1) << 63) + 1, UINT64_MAX};
    enum { SAMPLE = 4096 };
    uint64_t *v = malloc(SAMPLE * sizeof *v);
    size_t a, i, j;

    assert_non_null(v);
    for (a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        ferry__sampler_opts o = opts(1, 1, 42);
        ferry__sampler s = make(sizes[a], &o);
        assert_true(s.half_bits >= 17 && s.half_bits <= 32);
        for (i = 0; i < SAMPLE; i++) {
            /* first positions and the very last ones */
            uint64_t pos = i < SAMPLE / 2 ? i : sizes[a] - 1 - (i - SAMPLE / 2);
            v[i] = ferry__sampler_permute(&s, 3, pos);
            assert_true(v[i] < sizes[a]);
        }
        for (i = 0; i < SAMPLE; i++)
            for (j = i + 1; j < SAMPLE; j++)
                assert_true(v[i] != v[j]);
    }
    free(v);
}

static void test_half_bits_is_smallest_covering_domain(void **state)
{
    static const struct {
        uint64_t n;
        unsigned h;
    } cases[] = {
        {1, 1},
        {4, 1},
        {5, 2},
        {16, 2},
        {17, 3},
        {65536, 8},
        {65537, 9},
        {(UINT64_C(1) << 62), 31},
        {(UINT64_C(1) << 62) + 1, 32},
        {UINT64_MAX, 32},
    };
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ferry__sampler_opts o = opts(1, 1, 0);
        ferry__sampler s = make(cases[i].n, &o);
        assert_int_equal(s.half_bits, cases[i].h);
    }
}

static uint64_t agreements(const ferry__sampler *a, uint64_t ea, const ferry__sampler *b,
                           uint64_t eb)
{
    uint64_t i, same = 0;

    for (i = 0; i < a->n; i++)
        same += ferry__sampler_permute(a, ea, i) == ferry__sampler_permute(b, eb, i);
    return same;
}

static void test_permutation_differs_per_epoch_and_seed(void **state)
{
    const uint64_t n = 1000;
    ferry__sampler_opts o1 = opts(1, 1, 7), o2 = opts(1, 1, 8);
    ferry__sampler s1 = make(n, &o1), s1b = make(n, &o1), s2 = make(n, &o2);
    /* Another rank and batch size: the epoch's order must not depend on them,
     * or shards of different ranks would overlap. */
    ferry__sampler_opts o3 = opts(32, 1, 7);
    ferry__sampler s3;

    o3.world_size = 4;
    o3.rank = 3;
    s3 = make(n, &o3);

    /* same (seed, epoch): the same order, from a separately built sampler */
    assert_int_equal(agreements(&s1, 5, &s1b, 5), n);
    assert_int_equal(agreements(&s1, 5, &s3, 5), n);
    /* A random pair of permutations agrees at ~1 position; 5% is generous. */
    assert_true(agreements(&s1, 0, &s1, 1) < n / 20);
    assert_true(agreements(&s1, 1, &s1, 2) < n / 20);
    assert_true(agreements(&s1, 0, &s2, 0) < n / 20);
    assert_true(agreements(&s1, 3, &s2, 3) < n / 20);
}

static void test_no_shuffle_is_identity(void **state)
{
    ferry__sampler_opts o = opts(10, 0, 1234);
    ferry__sampler s = make(1003, &o);
    uint64_t i, epoch;

    for (epoch = 0; epoch < 3; epoch++)
        for (i = 0; i < 1003; i++)
            assert_int_equal(ferry__sampler_permute(&s, epoch, i), i);
}

static void test_shuffle_is_not_close_to_identity(void **state)
{
    const uint64_t n = 60000;
    ferry__sampler_opts o = opts(1, 1, 99);
    ferry__sampler s = make(n, &o);
    uint64_t i, fixed = 0, adjacent = 0, prev = ferry__sampler_permute(&s, 0, 0);

    for (i = 0; i < n; i++) {
        uint64_t v = ferry__sampler_permute(&s, 0, i);
        fixed += v == i;
        if (i > 0)
            adjacent += v == prev + 1 || prev == v + 1;
        prev = v;
    }
    /* a random permutation has ~1 fixed point and ~2 adjacent steps */
    assert_true(fixed < n / 20);
    assert_true(adjacent < n / 20);
}

/* Where position 0 lands, over many epochs, is close to uniform: the key
 * schedule spreads epochs, even on a tiny domain (n = 10, 2-bit halves). */
static void test_first_position_is_spread_over_epochs(void **state)
{
    enum { N = 10, EPOCHS = 20000 };
    ferry__sampler_opts o = opts(1, 1, 5);
    ferry__sampler s = make(N, &o);
    uint64_t hits[N] = {0}, e;
    int v;

    for (e = 0; e < EPOCHS; e++)
        hits[ferry__sampler_permute(&s, e, 0)]++;
    for (v = 0; v < N; v++) {
        /* expected 2000 each; +-15% is over 10 standard deviations */
        assert_true(hits[v] > 1700);
        assert_true(hits[v] < 2300);
    }
}

/* ------------------------------------------------------------------------
 * Sharding and batching
 */

static void expect_rejected(uint64_t n, const ferry__sampler_opts *o, const void *blob, size_t len,
                            const char *word);

/* Collects one epoch of rank r into m, asserting no index repeats across
 * every rank marked so far; returns the number of indices. */
static uint64_t mark_rank_epoch(uint64_t n, ferry__sampler_opts o, uint64_t epoch, uint8_t *m)
{
    ferry__sampler s = make(n, &o);
    uint64_t *idx = malloc(s.o.batch_size * sizeof *idx);
    uint64_t b, total = 0;
    uint32_t j;
    ferry__sampler_task t;

    assert_non_null(idx);
    for (b = 0; b < s.batches_per_epoch; b++) {
        assert_int_equal(ferry__sampler_at(&s, epoch * s.batches_per_epoch + b, &t), FERRY_OK);
        assert_int_equal(t.epoch, epoch);
        assert_int_equal(t.batch_in_epoch, b);
        ferry__sampler_indices(&s, &t, idx);
        for (j = 0; j < t.count; j++) {
            assert_true(idx[j] < n);
            assert_false(mark(m, idx[j]));
        }
        total += t.count;
    }
    free(idx);
    return total;
}

static void test_shards_are_disjoint_and_cover_epoch(void **state)
{
    static const struct {
        uint64_t n;
        uint32_t w;
        uint64_t bs;
    } cases[] = {
        {1000, 4, 32}, {1000, 8, 7}, {1003, 4, 32}, {1001, 7, 10}, {10, 3, 4}, {5, 5, 1},
    };
    size_t c;
    uint64_t epoch, i;

    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (epoch = 0; epoch < 2; epoch++) {
            for (int shuffle = 0; shuffle <= 1; shuffle++) {
                uint64_t n = cases[c].n;
                uint8_t *m = bitmap_new(n);
                uint64_t covered = 0, missing = 0;
                uint32_t r;
                for (r = 0; r < cases[c].w; r++) {
                    ferry__sampler_opts o = opts(cases[c].bs, shuffle, 77);
                    o.world_size = cases[c].w;
                    o.rank = r;
                    /* every rank sees exactly n / w items */
                    assert_int_equal(mark_rank_epoch(n, o, epoch, m), n / cases[c].w);
                    covered += n / cases[c].w;
                }
                for (i = 0; i < n; i++)
                    missing += !marked(m, i);
                /* union is everything but the n % w dropped items */
                assert_int_equal(missing, n % cases[c].w);
                assert_int_equal(covered + missing, n);
                if (!shuffle) {
                    /* without shuffle the dropped ones are the tail */
                    for (i = 0; i < n; i++)
                        assert_int_equal(marked(m, i), i < n - n % cases[c].w);
                }
                free(m);
            }
        }
    }
}

/* pad_shards (the loader's default unless drop_last): each rank serves
 * ceil(n / w) items, and the positions past n repeat the epoch's order from
 * its start, as torch's DistributedSampler pads: every item is served each
 * epoch, the repeats are the order's first (w - n % w) items, exactly once
 * more. A state remembers whether the shards were padded. */
static void test_padded_shards_cover_every_item(void **state)
{
    static const struct {
        uint64_t n;
        uint32_t w;
        uint64_t bs;
    } cases[] = {{100, 3, 8}, {1003, 4, 32}, {1001, 7, 10}, {10, 3, 4}, {1000, 4, 32}};
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            uint64_t n = cases[c].n, w = cases[c].w, per = n / w + (n % w != 0);
            uint32_t *seen = calloc((size_t)n, sizeof *seen);
            assert_non_null(seen);
            for (uint32_t r = 0; r < w; r++) {
                ferry__sampler_opts o = opts(cases[c].bs, shuffle, 77);
                o.world_size = (uint32_t)w;
                o.rank = r;
                o.pad_shards = 1;
                ferry__sampler s = make(n, &o);
                uint64_t *idx = malloc(cases[c].bs * sizeof *idx), total = 0;
                assert_non_null(idx);
                for (uint64_t b = 0; b < s.batches_per_epoch; b++) {
                    ferry__sampler_task t;
                    assert_int_equal(ferry__sampler_at(&s, s.batches_per_epoch + b, &t), FERRY_OK);
                    ferry__sampler_indices(&s, &t, idx);
                    for (uint32_t j = 0; j < t.count; j++) {
                        assert_true(idx[j] < n);
                        seen[idx[j]]++;
                    }
                    total += t.count;
                }
                assert_int_equal(total, per); /* every rank the same, rounded up */
                free(idx);
            }
            ferry__sampler_opts o = opts(cases[c].bs, shuffle, 77);
            o.world_size = (uint32_t)w;
            ferry__sampler s0 = make(n, &o);
            uint64_t pad = per * w - n;
            for (uint64_t p = 0; p < n; p++) { /* position p of epoch 1's order */
                uint64_t i = ferry__sampler_permute(&s0, 1, p);
                assert_int_equal(seen[i], 1 + (p < pad));
            }
            free(seen);
        }
    }
    /* Saved padded, restored unpadded (or the other way): the order is the
     * same, so the position carries over; only the rest's cut differs. */
    ferry__sampler_opts o = opts(8, 1, 3);
    o.world_size = 3;
    o.pad_shards = 1;
    ferry__sampler s = make(100, &o);
    unsigned char blob[FERRY_STATE_MAX];
    size_t len;
    uint64_t next;
    assert_int_equal(ferry__sampler_save(&s, 5, blob, sizeof blob, &len), FERRY_OK);
    o.pad_shards = 0;
    ferry__sampler u = make(100, &o); /* 33 per rank: 5 batches too */
    assert_int_equal(ferry__sampler_restore(&u, blob, len, &next), FERRY_OK);
    assert_int_equal(next, 5);
    assert_int_equal(u.head_pos, 0); /* epoch 1 from its start */
}

/* An epoch's start moved to a dataset of another length (it grew between
 * epochs) is that epoch's start over the new items: the same stream as a
 * sampler of the new length from that epoch. Mid-epoch, it is refused. */
static void test_an_epochs_start_moves_to_another_length(void **state)
{
    (void)state;
    ferry__sampler_opts o = opts(4, 1, 11);
    ferry__sampler s = make(40, &o), u = make(60, &o);
    unsigned char blob[FERRY_STATE_MAX], moved[FERRY_STATE_MAX];
    size_t len;
    uint64_t next, a[64], b[64];
    assert_int_equal(ferry__sampler_save(&s, 3 * s.batches_per_epoch, blob, sizeof blob, &len),
                     FERRY_OK);
    assert_int_equal(ferry__sampler_restore(&u, blob, len, &next), FERRY_ESTATE);
    assert_int_equal(ferry__sampler_state_resize(blob, len, 60, moved), FERRY_OK);
    assert_int_equal(ferry__sampler_restore(&u, moved, len, &next), FERRY_OK);
    assert_int_equal(next, 3 * u.batches_per_epoch);
    ferry__sampler fresh = make(60, &o);
    assert_int_equal(collect(&u, next, 15, a), 60);
    assert_int_equal(collect(&fresh, 3 * fresh.batches_per_epoch, 15, b), 60);
    assert_memory_equal(a, b, sizeof a[0] * 60);
    assert_int_equal(ferry__sampler_save(&s, 3 * s.batches_per_epoch + 2, blob, sizeof blob,
                                         &len), FERRY_OK);
    assert_int_equal(ferry__sampler_state_resize(blob, len, 60, moved), FERRY_ESTATE);
}

static void test_rank_takes_strided_positions(void **state)
{
    ferry__sampler_opts o = opts(4, 0, 0);
    ferry__sampler s;
    ferry__sampler_task t;
    uint64_t idx[4];

    o.world_size = 3;
    o.rank = 2;
    s = make(30, &o);
    assert_int_equal(s.per_rank, 10);
    assert_int_equal(ferry__sampler_at(&s, 1, &t), FERRY_OK);
    ferry__sampler_indices(&s, &t, idx);
    /* rank 2 positions 4..7 -> 4*3+2, ... */
    assert_int_equal(idx[0], 14);
    assert_int_equal(idx[1], 17);
    assert_int_equal(idx[2], 20);
    assert_int_equal(idx[3], 23);
}

static void test_batches_per_epoch_and_drop_last(void **state)
{
    static const struct {
        uint64_t n;
        uint32_t w;
        uint64_t bs;
        int drop_last;
        uint64_t per_rank, bpe;
    } cases[] = {
        {100, 1, 10, 0, 100, 10},
        {100, 1, 10, 1, 100, 10},
        {101, 1, 10, 0, 101, 11},
        {101, 1, 10, 1, 101, 10},
        {109, 1, 10, 1, 109, 10},
        {7, 1, 10, 0, 7, 1},
        {1, 1, 1, 0, 1, 1},
        {103, 4, 5, 0, 25, 5},
        {103, 4, 6, 0, 25, 5},
        {103, 4, 6, 1, 25, 4},
        {UINT64_MAX, 1, UINT32_MAX, 0, UINT64_MAX,
         UINT64_MAX / UINT32_MAX + (UINT64_MAX % UINT32_MAX != 0)},
    };
    size_t c;

    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ferry__sampler_opts o = opts(cases[c].bs, 1, 0);
        ferry__sampler s;
        o.world_size = cases[c].w;
        o.drop_last = cases[c].drop_last;
        s = make(cases[c].n, &o);
        assert_int_equal(s.per_rank, cases[c].per_rank);
        assert_int_equal(s.batches_per_epoch, cases[c].bpe);
    }
}

static void test_last_batch_short_without_drop_last(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 3);
    ferry__sampler s = make(95, &o);
    ferry__sampler_task t;
    uint64_t seq;

    assert_int_equal(s.batches_per_epoch, 10);
    for (seq = 0; seq < 30; seq++) {
        assert_int_equal(ferry__sampler_at(&s, seq, &t), FERRY_OK);
        assert_int_equal(t.seq, seq);
        assert_int_equal(t.epoch, seq / 10);
        assert_int_equal(t.batch_in_epoch, seq % 10);
        assert_int_equal(t.count, seq % 10 == 9 ? 5 : 10);
        assert_int_equal(t.last_in_epoch, seq % 10 == 9);
    }

    /* with drop_last the 5 left over are never served: full batches only */
    o.drop_last = 1;
    s = make(95, &o);
    assert_int_equal(s.batches_per_epoch, 9);
    for (seq = 0; seq < 27; seq++) {
        assert_int_equal(ferry__sampler_at(&s, seq, &t), FERRY_OK);
        assert_int_equal(t.count, 10);
        assert_int_equal(t.last_in_epoch, seq % 9 == 8);
    }
}

/* ------------------------------------------------------------------------
 * Where the stream ends
 */

static void test_stream_ends_after_epochs(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 0);
    ferry__sampler s;
    ferry__sampler_task t;

    o.epochs = 3;
    s = make(95, &o);
    assert_int_equal(s.end_seq, 30);
    assert_int_equal(ferry__sampler_at(&s, 29, &t), FERRY_OK);
    assert_int_equal(t.epoch, 2);
    assert_true(t.last_in_epoch);
    memset(&t, 0xab, sizeof t);
    assert_int_equal(ferry__sampler_at(&s, 30, &t), FERRY_EOF);
    assert_int_equal(t.seq, 0xababababababababULL); /* untouched at EOF */
    assert_int_equal(ferry__sampler_at(&s, UINT64_MAX, &t), FERRY_EOF);
}

static void test_stream_ends_after_max_batches(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 0);
    ferry__sampler s;
    ferry__sampler_task t;

    o.max_batches = 25; /* mid-epoch */
    s = make(95, &o);
    assert_int_equal(s.end_seq, 25);
    assert_int_equal(ferry__sampler_at(&s, 24, &t), FERRY_OK);
    assert_int_equal(ferry__sampler_at(&s, 25, &t), FERRY_EOF);

    /* both set: the smaller limit wins, whichever it is */
    o.epochs = 2;
    s = make(95, &o);
    assert_int_equal(s.end_seq, 20);
    o.epochs = 3;
    o.max_batches = 22;
    s = make(95, &o);
    assert_int_equal(s.end_seq, 22);
    assert_int_equal(ferry__sampler_at(&s, 22, &t), FERRY_EOF);
}

static void test_stream_is_endless_without_limits(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 0);
    ferry__sampler s = make(95, &o);
    ferry__sampler_task t;
    uint64_t idx[10];

    assert_int_equal(s.end_seq, UINT64_MAX);
    assert_int_equal(ferry__sampler_at(&s, UINT64_MAX - 1, &t), FERRY_OK);
    assert_int_equal(t.epoch, (UINT64_MAX - 1) / 10);
    assert_int_equal(t.batch_in_epoch, (UINT64_MAX - 1) % 10);
    ferry__sampler_indices(&s, &t, idx);
    assert_true(idx[0] < 95);

    /* epochs * batches_per_epoch past 2^64 is endless, not a wrapped small end */
    o.epochs = UINT64_MAX / 2;
    s = make(95, &o);
    assert_int_equal(s.end_seq, UINT64_MAX);
}

/* ------------------------------------------------------------------------
 * Save and restore
 */

static void test_resume_reproduces_stream(void **state)
{
    enum { K = 37, AFTER = 400, BS = 16 };
    ferry__sampler_opts o = opts(BS, 1, 0x5eed);
    ferry__sampler a, b;
    uint64_t *want = malloc(AFTER * BS * sizeof *want);
    uint64_t *got = malloc(AFTER * BS * sizeof *got);
    unsigned char blob[FERRY_STATE_MAX];
    size_t len = 0;
    uint64_t next = 0, nw, ng;

    assert_non_null(want);
    assert_non_null(got);
    o.world_size = 3;
    o.rank = 1;
    o.drop_last = 0;
    a = make(1000, &o); /* per_rank 333: 21 batches, last one short */

    /* tasks 0..K delivered; the blob says the next one is K+1 */
    assert_int_equal(ferry__sampler_save(&a, K + 1, blob, sizeof blob, &len), FERRY_OK);
    assert_true(len > 0 && len <= FERRY_STATE_MAX);

    b = make(1000, &o);
    assert_int_equal(ferry__sampler_restore(&b, blob, len, &next), FERRY_OK);
    assert_int_equal(next, K + 1);

    /* several hundred tasks, across many epoch boundaries */
    nw = collect(&a, K + 1, AFTER, want);
    ng = collect(&b, next, AFTER, got);
    assert_int_equal(nw, ng);
    assert_memory_equal(want, got, nw * sizeof *want);
    free(want);
    free(got);
}

/* epochs and max_batches are not part of the fingerprint: a run may be
 * extended; a position past the new end just means the stream is over. */
static void test_restore_ignores_limits_and_allows_past_end(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 1);
    ferry__sampler a, b;
    ferry__sampler_task t;
    unsigned char blob[FERRY_STATE_MAX];
    size_t len;
    uint64_t next = 0;

    o.epochs = 2;
    a = make(100, &o);
    assert_int_equal(ferry__sampler_save(&a, 50, blob, sizeof blob, &len), FERRY_OK);

    o.epochs = 0;
    o.max_batches = 1000;
    b = make(100, &o);
    assert_int_equal(ferry__sampler_restore(&b, blob, len, &next), FERRY_OK);
    assert_int_equal(next, 50);
    assert_int_equal(ferry__sampler_at(&b, next, &t), FERRY_OK);

    o.max_batches = 20;
    b = make(100, &o);
    next = 0;
    assert_int_equal(ferry__sampler_restore(&b, blob, len, &next), FERRY_OK);
    assert_int_equal(next, 50);
    assert_int_equal(ferry__sampler_at(&b, next, &t), FERRY_EOF);
}

static void test_save_reports_needed_size(void **state)
{
    ferry__sampler_opts o = opts(10, 1, 1);
    ferry__sampler s = make(100, &o);
    unsigned char blob[FERRY_STATE_MAX];
    size_t need = 0, len = 0;

    memset(blob, 0xee, sizeof blob);
    assert_int_equal(ferry__sampler_save(&s, 5, blob, 0, &need), FERRY_ELIMIT);
    assert_true(need > 0 && need <= FERRY_STATE_MAX);
    assert_non_null(strstr(ferry_last_error(), "bytes"));
    assert_int_equal(ferry__sampler_save(&s, 5, blob, need - 1, &len), FERRY_ELIMIT);
    assert_int_equal(blob[0], 0xee); /* nothing written on failure */
    assert_int_equal(ferry__sampler_save(&s, 5, blob, need, &len), FERRY_OK);
    assert_int_equal(len, need);
}

/* Restores blob into a sampler with options o and expects FERRY_ESTATE, a
 * detail containing `word`, and next_seq untouched. */
static void expect_rejected(uint64_t n, const ferry__sampler_opts *o, const void *blob, size_t len,
                            const char *word)
{
    ferry__sampler s = make(n, o);
    uint64_t next = 12345;

    assert_int_equal(ferry__sampler_restore(&s, blob, len, &next), FERRY_ESTATE);
    assert_int_equal(next, 12345);
    if (strstr(ferry_last_error(), word) == NULL)
        fail_msg("detail \"%s\" does not mention \"%s\"", ferry_last_error(), word);
}

static void test_restore_rejects_mismatch_and_corruption(void **state)
{
    ferry__sampler_opts o = opts(64, 1, 9), x;
    ferry__sampler s;
    unsigned char blob[FERRY_STATE_MAX], bad[FERRY_STATE_MAX];
    size_t len, i;
    uint64_t next = 0;

    o.world_size = 2;
    o.rank = 1;
    s = make(1000, &o);
    assert_int_equal(ferry__sampler_save(&s, 7, blob, sizeof blob, &len), FERRY_OK);
    /* the baseline is accepted, so each rejection below is the change's doing */
    assert_int_equal(ferry__sampler_restore(&s, blob, len, &next), FERRY_OK);
    assert_int_equal(next, 7);

    /* each field of the order */
    expect_rejected(999, &o, blob, len, "1000");
    x = o;
    x.shuffle = 0;
    expect_rejected(1000, &x, blob, len, "shuffle");
    x = o;
    x.seed = 10;
    expect_rejected(1000, &x, blob, len, "seed");
    /* the shape is not part of it: another rank, world_size, batch_size,
     * drop_last or padding resumes at the same place of the order */
    x = o;
    x.rank = 0;
    x.world_size = 4;
    x.batch_size = 128;
    x.drop_last = 1;
    {
        ferry__sampler y = make(1000, &x);
        next = 0;
        assert_int_equal(ferry__sampler_restore(&y, blob, len, &next), FERRY_OK);
        assert_int_equal(y.head_epoch, 7 / s.batches_per_epoch);
        assert_int_equal(y.head_pos, 7 % s.batches_per_epoch * 64 * 2);
    }

    /* every single flipped byte, magic and checksum included */
    for (i = 0; i < len; i++) {
        memcpy(bad, blob, len);
        bad[i] ^= 0x01;
        expect_rejected(1000, &o, bad, len, "state");
        bad[i] ^= 0xff;
        expect_rejected(1000, &o, bad, len, "state");
    }

    /* truncated at every length, and one byte too long */
    for (i = 0; i < len; i++)
        expect_rejected(1000, &o, blob, i, "bytes");
    memcpy(bad, blob, len);
    bad[len] = 0;
    expect_rejected(1000, &o, bad, len + 1, "bytes");
    expect_rejected(1000, &o, NULL, 0, "bytes");

    /* wrong magic, wrong version */
    memcpy(bad, blob, len);
    memcpy(bad, "FRYZ", 4);
    expect_rejected(1000, &o, bad, len, "FRYS");
    memcpy(bad, blob, len);
    bad[4] = 3;
    expect_rejected(1000, &o, bad, len, "version 3");
}

/* ------------------------------------------------------------------------
 * Resume into another shape (world_size, batch_size)
 *
 * Each case runs a job of W ranks for k batches of an epoch, checks that
 * what it consumed is exactly positions [0, k*B*W) of the epoch's order,
 * saves every rank's state, then resumes on W' ranks with batch_size B'
 * from one of those states. The rest of the interrupted epoch is checked
 * index by index against the epoch's order: rank r' serves positions P+r',
 * P+r'+W', ... (P = k*B*W), so across the new ranks every position of
 * P..n-1 is served exactly once (padded: the rest rounded up to a multiple
 * of W' by repeating the order's start; not padded: the last (n-P) % W'
 * dropped). The epoch after is checked against a fresh W'-rank run's.
 */

typedef struct shape {
    uint32_t w;
    uint64_t bs;
    int pad;
    int drop_last;
} shape;

static ferry__sampler rank_sampler(uint64_t n, shape sh, uint32_t r, int shuffle)
{
    ferry__sampler_opts o = opts(sh.bs, shuffle, 0xc0ffee);

    o.world_size = sh.w;
    o.rank = r;
    o.pad_shards = sh.pad;
    o.drop_last = sh.drop_last;
    return make(n, &o);
}

/* Runs ranks of shape `sh` over their first k batches of `epoch`, checks
 * they consumed exactly positions [0, k*B*W) of its order (item m of rank r
 * is position r + m*W), and saves each rank's state after them into
 * blobs[r] (FERRY_STATE_MAX bytes each). Returns the state's length. */
static size_t run_and_save(uint64_t n, shape sh, int shuffle, uint64_t epoch, uint64_t k,
                           unsigned char (*blobs)[FERRY_STATE_MAX])
{
    uint8_t *m = bitmap_new(n);
    uint64_t *idx = malloc(sh.bs * sizeof *idx), i;
    size_t len = 0;

    assert_non_null(idx);
    for (uint32_t r = 0; r < sh.w; r++) {
        ferry__sampler s = rank_sampler(n, sh, r, shuffle);
        uint64_t item = 0, first = epoch * s.batches_per_epoch;
        assert_true(k <= s.batches_per_epoch);
        for (uint64_t b = 0; b < k; b++) {
            ferry__sampler_task t;
            assert_int_equal(ferry__sampler_at(&s, first + b, &t), FERRY_OK);
            ferry__sampler_indices(&s, &t, idx);
            for (uint32_t j = 0; j < t.count; j++, item++) {
                uint64_t p = r + item * sh.w;
                if (p >= n) /* only a padded epoch's last batch gets here */
                    p -= n;
                assert_int_equal(idx[j], ferry__sampler_permute(&s, epoch, p));
                if (p == r + item * sh.w)
                    assert_false(mark(m, p));
            }
        }
        assert_int_equal(ferry__sampler_save(&s, first + k, blobs[r], FERRY_STATE_MAX, &len),
                         FERRY_OK);
    }
    /* the consumed prefix, exactly (mid-epoch every batch was full) */
    ferry__sampler s0 = rank_sampler(n, sh, 0, shuffle);
    if (k < s0.batches_per_epoch) {
        for (i = 0; i < n; i++)
            assert_int_equal(marked(m, i), i < k * sh.bs * sh.w);
    }
    free(idx);
    free(m);
    return len;
}

/* Restores `blob` into every rank of shape `to`, serves the rest of `epoch`
 * from position pos, and checks it as the section's comment says; then that
 * the next epoch is a fresh run's. */
static void check_resumed(uint64_t n, shape to, int shuffle, uint64_t epoch, uint64_t pos,
                          const void *blob, size_t len)
{
    uint32_t *served = calloc((size_t)n, sizeof *served);
    uint64_t *idx = malloc(to.bs * sizeof *idx), *want = malloc(to.bs * sizeof *want);
    uint64_t rest = n - pos, per_rank = 0;
    int pad = to.pad && !to.drop_last;

    assert_non_null(served);
    assert_non_null(idx);
    assert_non_null(want);
    for (uint32_t r = 0; r < to.w; r++) {
        ferry__sampler s = rank_sampler(n, to, r, shuffle);
        ferry__sampler fresh = s;
        const uint64_t bpe = s.batches_per_epoch;
        uint64_t next = 0, item = 0, seq;
        ferry__sampler_task t, f;

        assert_int_equal(ferry__sampler_restore(&s, blob, len, &next), FERRY_OK);
        assert_true(next >= epoch * bpe && next <= (epoch + 1) * bpe);
        /* the head ends where the epoch does: its batches are the epoch's last */
        for (seq = next; seq < (epoch + 1) * bpe; seq++) {
            assert_int_equal(ferry__sampler_at(&s, seq, &t), FERRY_OK);
            assert_int_equal(t.epoch, epoch);
            assert_int_equal(t.batch_in_epoch, seq - epoch * bpe);
            assert_int_equal(t.last_in_epoch, seq + 1 == (epoch + 1) * bpe);
            ferry__sampler_indices(&s, &t, idx);
            for (uint32_t j = 0; j < t.count; j++, item++) {
                uint64_t p = pos + r + item * to.w;
                assert_true(p < 2 * n);
                if (p >= n) {
                    assert_true(pad); /* only padding reaches past the end */
                    p -= n;
                }
                assert_int_equal(idx[j], ferry__sampler_permute(&s, epoch, p));
                served[p]++;
            }
        }
        if (r == 0)
            per_rank = item;
        assert_int_equal(item, per_rank); /* every rank the same */
        /* the next epoch is a fresh run's, task by task and index by index */
        for (seq = (epoch + 1) * bpe; seq < (epoch + 2) * bpe; seq++) {
            assert_int_equal(ferry__sampler_at(&s, seq, &t), FERRY_OK);
            assert_int_equal(ferry__sampler_at(&fresh, seq, &f), FERRY_OK);
            assert_memory_equal(&t, &f, sizeof t);
            ferry__sampler_indices(&s, &t, idx);
            ferry__sampler_indices(&fresh, &f, want);
            assert_memory_equal(idx, want, t.count * sizeof *idx);
        }
    }
    /* What the shape's rule gives per rank, and so which positions. */
    uint64_t per = rest / to.w + (uint64_t)(pad && rest % to.w != 0);
    if (to.drop_last)
        per -= per % to.bs;
    assert_int_equal(per_rank, per);
    uint64_t cut = per * to.w, lost = 0, twice = 0;
    uint64_t repeats = pos + cut > n ? pos + cut - n : 0; /* padding: the order's first ones */
    for (uint64_t p = 0; p < n; p++) {
        uint32_t expect = (p >= pos && p < pos + cut) + (p < repeats);
        if (served[p] != expect)
            fail_msg("position %llu served %u times, expected %u (n %llu, from %llu, w' %lu, "
                     "b' %llu)",
                     (unsigned long long)p, served[p], expect, (unsigned long long)n,
                     (unsigned long long)pos, (unsigned long)to.w, (unsigned long long)to.bs);
        lost += p >= pos && served[p] == 0;
        twice += p >= pos && p >= repeats && served[p] > 1;
    }
    assert_int_equal(twice, 0); /* nothing of the rest served twice but padding's repeats */
    if (pad)
        assert_int_equal(lost, 0); /* padded: nothing of the rest lost */
    else if (!to.drop_last)
        assert_int_equal(lost, rest % to.w); /* not padded: the shape's rule, as a fresh run's */
    free(served);
    free(idx);
    free(want);
}

/* One case: W ranks of `from` run k batches of epoch 2, then W' of `to` resume. */
static void reshape_case(uint64_t n, shape from, shape to, int shuffle, uint64_t k)
{
    unsigned char(*blobs)[FERRY_STATE_MAX] = calloc(from.w, FERRY_STATE_MAX);
    const void **ptrs = calloc(from.w, sizeof *ptrs);
    size_t *lens = calloc(from.w, sizeof *lens), len;
    const uint64_t epoch = 2;

    assert_non_null(blobs);
    assert_non_null(ptrs);
    assert_non_null(lens);
    len = run_and_save(n, from, shuffle, epoch, k, blobs);
    for (uint32_t r = 0; r < from.w; r++) {
        ptrs[r] = blobs[r];
        lens[r] = len;
    }
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, from.w), FERRY_OK);

    ferry__sampler s0 = rank_sampler(n, from, 0, shuffle);
    uint64_t e = epoch, pos = k * from.bs * from.w;
    if (k == s0.batches_per_epoch) { /* saved at the boundary: the next epoch from its start */
        e++;
        pos = 0;
    }
    /* any rank's state says the same: take the last one's */
    check_resumed(n, to, shuffle, e, pos, blobs[from.w - 1], len);
    free(blobs);
    free(ptrs);
    free(lens);
}

static void test_resume_on_another_world_size_serves_the_rest_once(void **state)
{
    static const struct {
        uint32_t w, w2;
    } worlds[] = {{8, 1}, {8, 3}, {8, 4}, {8, 6}, {8, 16}, {4, 8}};
    const uint64_t n = 10007; /* prime: no world_size divides it */
    (void)state;
    for (size_t c = 0; c < sizeof worlds / sizeof worlds[0]; c++)
        for (int shuffle = 0; shuffle <= 1; shuffle++)
            for (int pad = 0; pad <= 1; pad++) {
                shape from = {worlds[c].w, 32, pad, 0}, to = {worlds[c].w2, 32, pad, 0};
                ferry__sampler s = rank_sampler(n, from, 0, shuffle);
                reshape_case(n, from, to, shuffle, 17);                  /* mid-epoch */
                reshape_case(n, from, to, shuffle, s.batches_per_epoch); /* at the boundary */
                reshape_case(n, from, to, shuffle, 0); /* before the epoch's first batch */
            }
}

static void test_resume_with_another_batch_size_loses_and_repeats_nothing(void **state)
{
    static const struct {
        uint64_t bs, bs2;
        uint32_t w, w2;
    } cases[] = {{32, 48, 8, 8}, {64, 16, 8, 8}, {32, 48, 8, 6}, {64, 16, 4, 8}, {7, 1000, 3, 5}};
    const uint64_t n = 10007;
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int shuffle = 0; shuffle <= 1; shuffle++)
            for (int pad = 0; pad <= 1; pad++) {
                shape from = {cases[c].w, cases[c].bs, pad, 0};
                shape to = {cases[c].w2, cases[c].bs2, pad, 0};
                reshape_case(n, from, to, shuffle, 11);
            }
}

/* drop_last in the new shape: its rule cuts the rest too (whole batches
 * only), and what it serves is still once each, from P on. */
static void test_resume_with_drop_last_cuts_the_rest_by_its_rule(void **state)
{
    shape from = {8, 32, 1, 0}, to = {6, 48, 1, 1};
    (void)state;
    reshape_case(10007, from, to, 1, 17);
    from.drop_last = 1;
    to.drop_last = 0;
    reshape_case(10007, from, to, 1, 17);
    /* so little left that the new shape gets no batch of it: the stream
     * starts at the next epoch (check_resumed sees an empty head) */
    shape four = {4, 50, 1, 0}, five = {5, 100, 0, 0};
    reshape_case(1003, four, five, 1, 5); /* 1000 done, 3 left: 0 per rank */
    five.pad = 1;
    reshape_case(1003, four, five, 1, 5); /* padded: 1 each, 2 of them repeats */
}

/* The same shape is the plain stream: a state from any rank resumes this
 * rank exactly where the uninterrupted run goes on, seq for seq. */
static void test_resume_from_another_rank_state_in_same_shape_is_exact(void **state)
{
    shape sh = {8, 32, 1, 0};
    unsigned char(*blobs)[FERRY_STATE_MAX] = calloc(8, FERRY_STATE_MAX);
    uint64_t idx[32], want[32];
    (void)state;
    assert_non_null(blobs);
    size_t len = run_and_save(10007, sh, 1, 3, 9, blobs);
    for (uint32_t r = 0; r < 8; r++) {
        ferry__sampler a = rank_sampler(10007, sh, r, 1), b = a;
        uint64_t next = 0;
        assert_int_equal(ferry__sampler_restore(&b, blobs[(r + 3) % 8], len, &next), FERRY_OK);
        assert_int_equal(next, 3 * a.batches_per_epoch + 9);
        for (uint64_t seq = next; seq < next + 3 * a.batches_per_epoch; seq++) {
            ferry__sampler_task t, u;
            assert_int_equal(ferry__sampler_at(&a, seq, &t), FERRY_OK);
            assert_int_equal(ferry__sampler_at(&b, seq, &u), FERRY_OK);
            assert_memory_equal(&t, &u, sizeof t);
            ferry__sampler_indices(&a, &t, want);
            ferry__sampler_indices(&b, &u, idx);
            assert_memory_equal(idx, want, t.count * sizeof *idx);
        }
    }
    free(blobs);
}

/* Resumed twice, in two shapes (8 -> 6 -> 16 ranks), within one epoch: the
 * second state, saved in the middle of the first's head, still names the
 * job's place in the order. And state_at_epoch of the head's epoch is that
 * whole epoch. */
static void test_resume_again_from_a_resumed_stream(void **state)
{
    const uint64_t n = 10007;
    shape a = {8, 32, 1, 0}, b = {6, 20, 1, 0}, c = {16, 8, 1, 0};
    unsigned char(*blobs)[FERRY_STATE_MAX] = calloc(8, FERRY_STATE_MAX);
    unsigned char mid[FERRY_STATE_MAX], whole[FERRY_STATE_MAX];
    size_t len, len2;
    uint64_t next = 0;
    (void)state;
    assert_non_null(blobs);
    len = run_and_save(n, a, 1, 2, 5, blobs); /* P = 5*32*8 = 1280 */
    ferry__sampler s = rank_sampler(n, b, 4, 1);
    assert_int_equal(ferry__sampler_restore(&s, blobs[0], len, &next), FERRY_OK);
    /* 7 batches of the head on every rank of b: P = 1280 + 7*20*6 = 2120 */
    assert_int_equal(ferry__sampler_save(&s, next + 7, mid, sizeof mid, &len2), FERRY_OK);
    check_resumed(n, c, 1, 2, 2120, mid, len2);
    /* the first epoch's start, from the resumed sampler */
    assert_int_equal(ferry__sampler_save(&s, 2 * s.batches_per_epoch, whole, sizeof whole, &len2),
                     FERRY_OK);
    check_resumed(n, c, 1, 2, 0, whole, len2);
    free(blobs);
}

/* Writes a version 1 blob (the layout ferry wrote before reshaping). */
static size_t v1_blob(unsigned char *p, uint64_t next_seq, uint64_t n, uint64_t bs, uint64_t seed,
                      uint32_t rank, uint32_t w, uint32_t flags)
{
    uint64_t words[7] = {0}, h = 0x46525953u;
    memset(p, 0, 64);
    memcpy(p, "FRYS", 4);
    p[4] = 1;
    for (int i = 0; i < 8; i++) {
        p[8 + i] = (unsigned char)(next_seq >> (8 * i));
        p[16 + i] = (unsigned char)(n >> (8 * i));
        p[24 + i] = (unsigned char)(bs >> (8 * i));
        p[32 + i] = (unsigned char)(seed >> (8 * i));
    }
    for (int i = 0; i < 4; i++) {
        p[40 + i] = (unsigned char)(rank >> (8 * i));
        p[44 + i] = (unsigned char)(w >> (8 * i));
        p[48 + i] = (unsigned char)(flags >> (8 * i));
    }
    for (int wd = 0; wd < 7; wd++) {
        for (int i = 7; i >= 0; i--)
            words[wd] = (words[wd] << 8) | p[wd * 8 + i];
        h = ferry_mix64(h ^ words[wd]);
    }
    for (int i = 0; i < 8; i++)
        p[56 + i] = (unsigned char)(h >> (8 * i));
    return 64;
}

/* A checkpoint written by the ferry before this one resumes too, in its own
 * shape exactly, or in another one at the same place of the order. */
static void test_version_1_state_is_read_and_reshaped(void **state)
{
    const uint64_t n = 10007;
    shape a = {8, 32, 1, 0}, b = {6, 32, 1, 0};
    unsigned char blob[64];
    (void)state;
    ferry__sampler s = rank_sampler(n, a, 3, 1); /* padded: flags shuffle|padded */
    size_t len = v1_blob(blob, 2 * s.batches_per_epoch + 17, n, 32, 0xc0ffee, 3, 8, 2u | 4u);
    uint64_t next = 0;
    assert_int_equal(ferry__sampler_restore(&s, blob, len, &next), FERRY_OK);
    assert_int_equal(next, 2 * s.batches_per_epoch + 17);
    check_resumed(n, b, 1, 2, 17 * 32 * 8, blob, len);
    /* and version 1's fingerprint is still checked: another seed */
    ferry__sampler_opts o = opts(32, 1, 5);
    o.world_size = 8;
    expect_rejected(n, &o, blob, len, "seed");
}

static void test_states_agree_only_from_one_step_of_one_job(void **state)
{
    const uint64_t n = 10007;
    shape a = {4, 32, 1, 0};
    unsigned char(*blobs)[FERRY_STATE_MAX] = calloc(4, FERRY_STATE_MAX);
    unsigned char(*late)[FERRY_STATE_MAX] = calloc(4, FERRY_STATE_MAX);
    const void *ptrs[4];
    size_t lens[4], len;
    (void)state;
    assert_non_null(blobs);
    assert_non_null(late);
    len = run_and_save(n, a, 1, 1, 10, blobs);
    run_and_save(n, a, 1, 1, 11, late);
    for (int r = 0; r < 4; r++) {
        ptrs[r] = blobs[r];
        lens[r] = len;
    }
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_OK);
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 1), FERRY_OK);
    /* rank 2 one batch ahead */
    ptrs[2] = late[2];
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "did not stop at the same batch"));
    assert_non_null(strstr(ferry_last_error(), "rank 2) is before batch 11 of epoch 1"));
    /* the same rank twice */
    ptrs[2] = blobs[1];
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "rank 1's"));
    /* another job's world_size, another order, a corrupted blob */
    unsigned char other[FERRY_STATE_MAX], bad[FERRY_STATE_MAX];
    shape b = {2, 32, 1, 0};
    unsigned char(*two)[FERRY_STATE_MAX] = calloc(2, FERRY_STATE_MAX);
    assert_non_null(two);
    run_and_save(n, b, 1, 1, 20, two); /* same position: 20*32*2 = 10*32*4 */
    ptrs[2] = two[0];
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "world_size 2"));
    ferry__sampler s = rank_sampler(n - 1, a, 2, 1);
    assert_int_equal(ferry__sampler_save(&s, 10, other, sizeof other, &len), FERRY_OK);
    ptrs[2] = other;
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "another order"));
    memcpy(bad, blobs[2], len);
    bad[20] ^= 1;
    ptrs[2] = bad;
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 4), FERRY_ESTATE);
    assert_non_null(strstr(ferry_last_error(), "state 2: "));
    assert_int_equal(ferry__sampler_states_agree(ptrs, lens, 0), FERRY_EINVAL);
    free(two);
    free(blobs);
    free(late);
}

/* ------------------------------------------------------------------------
 * Option validation
 */

/* Init must fail with FERRY_EINVAL, a detail naming `word`, and *s untouched. */
static void expect_bad(uint64_t n, const ferry__sampler_opts *o, const char *word)
{
    ferry__sampler s, before;

    memset(&s, 0x5a, sizeof s);
    memcpy(&before, &s, sizeof s);
    assert_int_equal(ferry__sampler_init(&s, n, o), FERRY_EINVAL);
    assert_memory_equal(&s, &before, sizeof s);
    if (strstr(ferry_last_error(), word) == NULL)
        fail_msg("detail \"%s\" does not mention \"%s\"", ferry_last_error(), word);
}

static void test_init_rejects_bad_options(void **state)
{
    ferry__sampler_opts good = opts(32, 1, 1), o;
    ferry__sampler s;

    expect_bad(0, &good, "empty");
    o = good;
    o.batch_size = 0;
    expect_bad(100, &o, "batch_size");
    o.batch_size = (uint64_t)UINT32_MAX + 1;
    expect_bad(100, &o, "batch_size 4294967296");
    o = good;
    o.world_size = 0;
    o.rank = 0;
    expect_bad(100, &o, "world_size");
    o = good;
    o.world_size = 4;
    o.rank = 4;
    expect_bad(100, &o, "rank 4");
    o = good;
    o.world_size = 8;
    o.rank = 0;
    expect_bad(7, &o, "world_size 8");
    o = good;
    o.drop_last = 1;
    o.world_size = 4;
    expect_bad(127, &o, "drop_last"); /* 31 per rank < 32 */

    /* the edges of each rule are accepted */
    o.batch_size = UINT32_MAX;
    o.drop_last = 0;
    o.world_size = 1;
    assert_int_equal(ferry__sampler_init(&s, 100, &o), FERRY_OK);
    o = good;
    o.world_size = 4;
    o.rank = 3;
    o.drop_last = 1;
    assert_int_equal(ferry__sampler_init(&s, 128, &o), FERRY_OK);
    assert_int_equal(s.batches_per_epoch, 1);
    o.world_size = 128;
    o.rank = 127;
    o.batch_size = 1;
    assert_int_equal(ferry__sampler_init(&s, 128, &o), FERRY_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permutation_is_bijection),
        cmocka_unit_test(test_permutation_stays_in_range_for_huge_n),
        cmocka_unit_test(test_half_bits_is_smallest_covering_domain),
        cmocka_unit_test(test_permutation_differs_per_epoch_and_seed),
        cmocka_unit_test(test_no_shuffle_is_identity),
        cmocka_unit_test(test_shuffle_is_not_close_to_identity),
        cmocka_unit_test(test_first_position_is_spread_over_epochs),
        cmocka_unit_test(test_an_epochs_start_moves_to_another_length),
        cmocka_unit_test(test_shards_are_disjoint_and_cover_epoch),
        cmocka_unit_test(test_padded_shards_cover_every_item),
        cmocka_unit_test(test_rank_takes_strided_positions),
        cmocka_unit_test(test_batches_per_epoch_and_drop_last),
        cmocka_unit_test(test_last_batch_short_without_drop_last),
        cmocka_unit_test(test_stream_ends_after_epochs),
        cmocka_unit_test(test_stream_ends_after_max_batches),
        cmocka_unit_test(test_stream_is_endless_without_limits),
        cmocka_unit_test(test_resume_reproduces_stream),
        cmocka_unit_test(test_restore_ignores_limits_and_allows_past_end),
        cmocka_unit_test(test_save_reports_needed_size),
        cmocka_unit_test(test_restore_rejects_mismatch_and_corruption),
        cmocka_unit_test(test_resume_on_another_world_size_serves_the_rest_once),
        cmocka_unit_test(test_resume_with_another_batch_size_loses_and_repeats_nothing),
        cmocka_unit_test(test_resume_with_drop_last_cuts_the_rest_by_its_rule),
        cmocka_unit_test(test_resume_from_another_rank_state_in_same_shape_is_exact),
        cmocka_unit_test(test_resume_again_from_a_resumed_stream),
        cmocka_unit_test(test_version_1_state_is_read_and_reshaped),
        cmocka_unit_test(test_states_agree_only_from_one_step_of_one_job),
        cmocka_unit_test(test_init_rejects_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
