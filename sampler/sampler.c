/*
 * sampler.c - the index stream: task `seq` -> (epoch, batch, sample indices).
 *
 * Position in the data flow: first. The scheduler calls ferry__sampler_at()
 * and ferry__sampler_indices() for each batch it dispatches; the loader saves
 * and restores the stream position with ferry__sampler_save/restore.
 *
 * Invariants:
 *  - Everything is a pure function of (n, options, seq). The struct is
 *    written once by ferry__sampler_init() and only read afterwards, so any
 *    thread may call the other functions at the same time.
 *  - An epoch's order depends on (n, seed, epoch) only, never on rank,
 *    world_size or batch_size: every rank walks the same order and takes its
 *    own positions (r, r+w, r+2w, ...), which is what keeps shards disjoint.
 *  - The shuffle is a balanced Feistel network on 2*half_bits bits with
 *    cycle-walking, so it is a bijection on [0, n) computed one position at
 *    a time in O(1) memory: no permutation array, and resuming at any batch
 *    costs nothing.
 *  - The state blob has a fixed little-endian layout, independent of the
 *    host, so a checkpoint moves between machines.
 */
#include "sampler.h"

#include <assert.h>
#include <string.h>

#include "error.h"
#include "ferry_dataset.h"

/* Feistel rounds. Luby-Rackoff needs 4 on wide halves, but small n means
 * halves of a few bits, where a round mixes little: for n = 5 over 240000
 * epochs, 6 rounds made some orders twice as likely as others, 8 keep every
 * order within about 20% of uniform. A round is one ferry_mix64; 8 rounds
 * cost about 170 ns per index at n = 1.28M (~3.3 cycle-walk passes). */
#define SAMPLER_ROUNDS 8

/* ------------------------------------------------------------------------
 * Options and the shape of the stream
 */

/* Checks every rule of sampler.h first and derives the shape into a local
 * copy, so *s is written only on success. */
int ferry__sampler_init(ferry__sampler *s, uint64_t n, const ferry__sampler_opts *o)
{
    ferry__sampler t;
    uint64_t per_rank, bpe, end;
    unsigned h;

    if (n == 0)
        return ferry__seterr(FERRY_EINVAL, "the dataset is empty (length 0): nothing to sample");
    if (o->batch_size == 0)
        return ferry__seterr(FERRY_EINVAL, "batch_size must be at least 1, got 0");
    if (o->batch_size > UINT32_MAX)
        return ferry__seterr(FERRY_EINVAL, "batch_size %llu is larger than the maximum %lu",
                             (unsigned long long)o->batch_size, (unsigned long)UINT32_MAX);
    if (o->world_size == 0)
        return ferry__seterr(FERRY_EINVAL, "world_size must be at least 1, got 0");
    if (o->rank >= o->world_size)
        return ferry__seterr(FERRY_EINVAL, "rank %lu must be less than world_size %lu",
                             (unsigned long)o->rank, (unsigned long)o->world_size);
    if (n < o->world_size)
        return ferry__seterr(FERRY_EINVAL,
                             "the dataset has %llu items, fewer than world_size %lu: "
                             "some rank would get no sample",
                             (unsigned long long)n, (unsigned long)o->world_size);

    /* Padded: ceil(n / w), without the overflow of n + w - 1. */
    int padded = o->pad_shards && !o->drop_last && n % o->world_size != 0;
    per_rank = n / o->world_size + (uint64_t)padded;
    if (o->drop_last) {
        if (per_rank < o->batch_size)
            return ferry__seterr(FERRY_EINVAL,
                                 "drop_last leaves no batch: each rank gets %llu items per "
                                 "epoch, fewer than batch_size %llu",
                                 (unsigned long long)per_rank, (unsigned long long)o->batch_size);
        bpe = per_rank / o->batch_size;
    } else {
        /* ceil without the overflow of per_rank + batch_size - 1 */
        bpe = per_rank / o->batch_size + (per_rank % o->batch_size != 0);
    }

    /* Both limits count from seq 0, so a resumed loader ends where the
     * uninterrupted one would have. epochs * bpe beyond 2^64 is endless in
     * practice. */
    end = UINT64_MAX;
    if (o->epochs != 0 && o->epochs <= UINT64_MAX / bpe)
        end = o->epochs * bpe;
    if (o->max_batches != 0 && o->max_batches < end)
        end = o->max_batches;

    /* Smallest h >= 1 with 4^h >= n; h == 32 covers every uint64_t. The
     * domain is then < 4n, so cycle-walking takes under 4 steps on average. */
    h = 1;
    while (h < 32 && (UINT64_C(1) << (2 * h)) < n)
        h++;

    memset(&t, 0, sizeof t);
    t.n = n;
    t.o = *o;
    t.o.pad_shards = padded;
    t.per_rank = per_rank;
    t.batches_per_epoch = bpe;
    t.end_seq = end;
    t.half_bits = h;
    *s = t;
    return FERRY_OK;
}

/* One division per batch, never per index. FERRY_EOF is the normal end of
 * the stream, not a failure: no error detail is recorded and *t is untouched. */
int ferry__sampler_at(const ferry__sampler *s, uint64_t seq, ferry__sampler_task *t)
{
    uint64_t b, left;

    if (seq >= s->end_seq)
        return FERRY_EOF;
    b = seq % s->batches_per_epoch;
    left = s->per_rank - b * s->o.batch_size; /* > 0: b < bpe */
    t->seq = seq;
    t->epoch = seq / s->batches_per_epoch;
    t->batch_in_epoch = b;
    t->count = (uint32_t)(left < s->o.batch_size ? left : s->o.batch_size);
    t->last_in_epoch = b + 1 == s->batches_per_epoch;
    return FERRY_OK;
}

/* ------------------------------------------------------------------------
 * The shuffle: a keyed Feistel bijection with cycle-walking
 */

/* Round keys for one (seed, epoch). Each step is a bijection of its input,
 * so for a fixed seed distinct epochs get distinct key schedules. */
static void round_keys(const ferry__sampler *s, uint64_t epoch, uint64_t k[SAMPLER_ROUNDS])
{
    uint64_t base = ferry_mix64(ferry_mix64(s->o.seed) ^ epoch);
    int r;

    for (r = 0; r < SAMPLER_ROUNDS; r++)
        k[r] = ferry_mix64(base + (uint64_t)r);
}

/* The Feistel permutation of [0, 4^h), applied until the value falls back in
 * [0, n). Requires i < n: the walk then ends because i's cycle contains i
 * itself. Only shifts, masks and multiplies: this runs for every index. */
static inline uint64_t feistel_walk(const uint64_t k[SAMPLER_ROUNDS], unsigned h, uint64_t n,
                                    uint64_t i)
{
    const uint64_t mask = (UINT64_C(1) << h) - 1;
    uint64_t x = i;
    int r;

    do {
        uint64_t left = x >> h;
        uint64_t right = x & mask;
        for (r = 0; r < SAMPLER_ROUNDS; r++) {
            uint64_t next = left ^ (ferry_mix64(k[r] ^ right) & mask);
            left = right;
            right = next;
        }
        x = (left << h) | right;
    } while (x >= n);
    return x;
}

uint64_t ferry__sampler_permute(const ferry__sampler *s, uint64_t epoch, uint64_t i)
{
    uint64_t k[SAMPLER_ROUNDS];

    assert(i < s->n);
    if (!s->o.shuffle)
        return i;
    round_keys(s, epoch, k);
    return feistel_walk(k, s->half_bits, s->n, i);
}

/* Position p of this rank's part of the epoch is position p*w + rank of the
 * epoch's order. The keys are made once per batch, not once per index. */
void ferry__sampler_indices(const ferry__sampler *s, const ferry__sampler_task *t, uint64_t *out)
{
    const uint64_t w = s->o.world_size;
    uint64_t pos = t->batch_in_epoch * s->o.batch_size * w + s->o.rank;
    uint64_t k[SAMPLER_ROUNDS];
    uint32_t j;

    assert(t->count >= 1 && t->count <= s->o.batch_size);
    if (s->o.shuffle)
        round_keys(s, t->epoch, k);
    for (j = 0; j < t->count; j++, pos += w) {
        /* A padded shard's last positions (< n + w <= 2n) repeat the order's start. */
        uint64_t p = pos < s->n ? pos : pos - s->n;
        out[j] = s->o.shuffle ? feistel_walk(k, s->half_bits, s->n, p) : p;
    }
}

/* ------------------------------------------------------------------------
 * Position blobs
 *
 * Version 1 layout, little-endian, 64 bytes:
 *    0  "FRYS"            4  u32 version
 *    8  u64 next_seq     16  u64 n
 *   24  u64 batch_size   32  u64 seed
 *   40  u32 rank         44  u32 world_size
 *   48  u32 flags (bit 0 drop_last, bit 1 shuffle)
 *   52  u32 reserved, 0  56  u64 checksum of bytes 0..55
 */

#define STATE_MAGIC "FRYS"
#define STATE_VERSION 1u
#define STATE_LEN 64
#define STATE_SUMMED 56
#define FLAG_DROP_LAST 1u
#define FLAG_SHUFFLE 2u
#define FLAG_PADDED 4u /* pad_shards in effect (world_size > 1, n % world_size != 0) */

static void put_u32(unsigned char *p, uint32_t v)
{
    int i;

    for (i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    int i;

    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    int i;

    for (i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    int i;

    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A chain of ferry_mix64 over the 8-byte words. mix64 is a bijection, so any
 * change confined to one word always changes the sum; it guards against
 * truncation and bit rot, not against forgery. */
static uint64_t state_checksum(const unsigned char *p)
{
    uint64_t h = 0x46525953u; /* "FRYS" */
    int i;

    for (i = 0; i < STATE_SUMMED; i += 8)
        h = ferry_mix64(h ^ get_u64(p + i));
    return h;
}

static uint32_t sampler_flags(const ferry__sampler *s)
{
    return (s->o.drop_last ? FLAG_DROP_LAST : 0) | (s->o.shuffle ? FLAG_SHUFFLE : 0) |
           (s->o.pad_shards ? FLAG_PADDED : 0);
}

/* Writes the blob for `next_seq` (the first task not yet delivered) into buf.
 * FERRY_ELIMIT when cap is too small; *len is set to the size needed either
 * way, so a caller may ask with cap 0 first. buf is untouched on failure. */
int ferry__sampler_save(const ferry__sampler *s, uint64_t next_seq, void *buf, size_t cap,
                        size_t *len)
{
    unsigned char b[STATE_LEN];

    *len = STATE_LEN;
    if (cap < STATE_LEN)
        return ferry__seterr(FERRY_ELIMIT, "the sampler state needs %d bytes, the buffer has %zu",
                             STATE_LEN, cap);
    memcpy(b, STATE_MAGIC, 4);
    put_u32(b + 4, STATE_VERSION);
    put_u64(b + 8, next_seq);
    put_u64(b + 16, s->n);
    put_u64(b + 24, s->o.batch_size);
    put_u64(b + 32, s->o.seed);
    put_u32(b + 40, s->o.rank);
    put_u32(b + 44, s->o.world_size);
    put_u32(b + 48, sampler_flags(s));
    put_u32(b + 52, 0);
    put_u64(b + 56, state_checksum(b));
    memcpy(buf, b, STATE_LEN);
    return FERRY_OK;
}

static const char *on_off(uint32_t flags, uint32_t bit)
{
    return (flags & bit) ? "on" : "off";
}

/* Checks the blob's form first (magic, version, length, checksum), so a
 * fingerprint field is only compared once the bytes are known to be intact;
 * then compares every field that shapes the stream. The seed is compared even
 * with shuffle off: it also seeds per-sample augmentation, so a different
 * seed gives different batches. */
int ferry__sampler_restore(const ferry__sampler *s, const void *buf, size_t len, uint64_t *next_seq)
{
    const unsigned char *b = buf;
    uint32_t version, flags, mine;
    uint64_t v;

    if (b == NULL || len < 8)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state is %zu bytes, too short to be a ferry state", len);
    if (memcmp(b, STATE_MAGIC, 4) != 0)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state does not start with \"FRYS\": not a ferry state");
    version = get_u32(b + 4);
    if (version != STATE_VERSION)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state has version %lu, this ferry reads version %u",
                             (unsigned long)version, STATE_VERSION);
    if (len != STATE_LEN)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state is %zu bytes, a version %u state is %d bytes", len,
                             STATE_VERSION, STATE_LEN);
    if (get_u64(b + 56) != state_checksum(b))
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state's checksum does not match: the blob is corrupted");
    flags = get_u32(b + 48);
    if ((flags & ~(FLAG_DROP_LAST | FLAG_SHUFFLE | FLAG_PADDED)) != 0 || get_u32(b + 52) != 0)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state has unknown flags 0x%lx or reserved bits set",
                             (unsigned long)flags);

    if ((v = get_u64(b + 16)) != s->n)
        return ferry__seterr(FERRY_ESTATE,
                             "state was saved for a dataset of %llu items, this one has %llu",
                             (unsigned long long)v, (unsigned long long)s->n);
    if ((v = get_u64(b + 24)) != s->o.batch_size)
        return ferry__seterr(FERRY_ESTATE, "state was saved with batch_size %llu, loader has %llu",
                             (unsigned long long)v, (unsigned long long)s->o.batch_size);
    mine = sampler_flags(s);
    if ((flags ^ mine) & FLAG_DROP_LAST)
        return ferry__seterr(FERRY_ESTATE, "state was saved with drop_last %s, loader has it %s",
                             on_off(flags, FLAG_DROP_LAST), on_off(mine, FLAG_DROP_LAST));
    if ((flags ^ mine) & FLAG_SHUFFLE)
        return ferry__seterr(FERRY_ESTATE, "state was saved with shuffle %s, loader has it %s",
                             on_off(flags, FLAG_SHUFFLE), on_off(mine, FLAG_SHUFFLE));
    if ((flags ^ mine) & FLAG_PADDED)
        return ferry__seterr(FERRY_ESTATE,
                             "state was saved with the shards %s, this loader has them %s "
                             "(option pad_shards)",
                             flags & FLAG_PADDED ? "padded" : "not padded",
                             mine & FLAG_PADDED ? "padded" : "not padded");
    if ((v = get_u64(b + 32)) != s->o.seed)
        return ferry__seterr(FERRY_ESTATE, "state was saved with seed %llu, loader has %llu",
                             (unsigned long long)v, (unsigned long long)s->o.seed);
    if ((v = get_u32(b + 40)) != s->o.rank)
        return ferry__seterr(FERRY_ESTATE, "state was saved with rank %llu, loader has %lu",
                             (unsigned long long)v, (unsigned long)s->o.rank);
    if ((v = get_u32(b + 44)) != s->o.world_size)
        return ferry__seterr(FERRY_ESTATE, "state was saved with world_size %llu, loader has %lu",
                             (unsigned long long)v, (unsigned long)s->o.world_size);

    *next_seq = get_u64(b + 8);
    return FERRY_OK;
}
