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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "feistel.h"
#include "ferry_dataset.h"


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
    if (o->mix) {
        if (n != ferry__mix_total(o->mix))
            return ferry__seterr(FERRY_EINVAL,
                                 "the mix's sources hold %llu items, the dataset has %llu: the "
                                 "dataset must be the sources end to end",
                                 (unsigned long long)ferry__mix_total(o->mix),
                                 (unsigned long long)n);
        n = ferry__mix_length(o->mix); /* from here on, the order's length */
    }
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

    h = ferry__feistel_half_bits(n);

    memset(&t, 0, sizeof t);
    t.n = n;
    t.o = *o;
    t.o.pad_shards = padded;
    t.per_rank = per_rank;
    t.batches_per_epoch = bpe;
    t.end_seq = end;
    t.half_bits = h;
    t.pad = o->pad_shards && !o->drop_last;
    t.head_per_rank = per_rank; /* the head of a fresh stream: all of epoch 0 */
    *s = t;
    return FERRY_OK;
}

/* Makes epoch `epoch` start at position pos (< n) of its order: the rest is
 * re-sharded over this shape (sampler.h). Never more batches than a whole
 * epoch: the rest per rank is at most per_rank. */
static void set_head(ferry__sampler *s, uint64_t epoch, uint64_t pos)
{
    const uint64_t w = s->o.world_size, bs = s->o.batch_size;
    uint64_t rest = s->n - pos, per, batches;

    per = rest / w + (uint64_t)(s->pad && rest % w != 0);
    batches = s->o.drop_last ? per / bs : per / bs + (per % bs != 0);
    assert(per <= s->per_rank && batches <= s->batches_per_epoch);
    s->head_epoch = epoch;
    s->head_pos = pos;
    s->head_first = s->batches_per_epoch - batches;
    s->head_per_rank = per;
}

uint64_t ferry__sampler_start(const ferry__sampler *s)
{
    return s->head_epoch * s->batches_per_epoch + s->head_first;
}

/* Whether (epoch, batch b) is one of the head's batches. */
static int in_head(const ferry__sampler *s, uint64_t epoch, uint64_t b)
{
    return epoch == s->head_epoch && b >= s->head_first;
}

/* One division per batch, never per index. FERRY_EOF is the normal end of
 * the stream, not a failure: no error detail is recorded and *t is untouched. */
int ferry__sampler_at(const ferry__sampler *s, uint64_t seq, ferry__sampler_task *t)
{
    uint64_t b, epoch, left;

    if (seq >= s->end_seq)
        return FERRY_EOF;
    b = seq % s->batches_per_epoch;
    epoch = seq / s->batches_per_epoch;
    /* > 0: b < bpe, and a head's batches cover its per-rank items */
    if (in_head(s, epoch, b))
        left = s->head_per_rank - (b - s->head_first) * s->o.batch_size;
    else
        left = s->per_rank - b * s->o.batch_size;
    t->seq = seq;
    t->epoch = epoch;
    t->batch_in_epoch = b;
    t->count = (uint32_t)(left < s->o.batch_size ? left : s->o.batch_size);
    t->last_in_epoch = b + 1 == s->batches_per_epoch;
    return FERRY_OK;
}

/* ------------------------------------------------------------------------
 * The shuffle: a keyed Feistel bijection with cycle-walking
 */

/* Round keys for one (seed, epoch). */
static void round_keys(const ferry__sampler *s, uint64_t epoch,
                       uint64_t k[FERRY__FEISTEL_ROUNDS])
{
    ferry__feistel_keys(ferry_mix64(ferry_mix64(s->o.seed) ^ epoch), k);
}

uint64_t ferry__sampler_permute(const ferry__sampler *s, uint64_t epoch, uint64_t i)
{
    uint64_t k[FERRY__FEISTEL_ROUNDS];

    assert(i < s->n);
    if (s->o.mix) {
        ferry__mix_cursor c;
        ferry__mix_cursor_init(&c);
        return ferry__mix_draw(s->o.mix, s->o.seed, s->o.shuffle, epoch * s->n + i, &c, NULL);
    }
    if (!s->o.shuffle)
        return i;
    round_keys(s, epoch, k);
    return ferry__feistel_walk(k, s->half_bits, s->n, i);
}

/* Position p of this rank's part of the epoch is position p*w + rank of the
 * epoch's order (after head_pos, in the head). The keys are made once per
 * batch, not once per index. */
void ferry__sampler_indices(const ferry__sampler *s, const ferry__sampler_task *t, uint64_t *out)
{
    const uint64_t w = s->o.world_size, step = s->o.batch_size * w;
    uint64_t pos = in_head(s, t->epoch, t->batch_in_epoch)
                       ? s->head_pos + (t->batch_in_epoch - s->head_first) * step + s->o.rank
                       : t->batch_in_epoch * step + s->o.rank;
    uint64_t k[FERRY__FEISTEL_ROUNDS];
    uint32_t j;

    assert(t->count >= 1 && t->count <= s->o.batch_size);
    if (s->o.mix) {
        ferry__mix_cursor c;
        ferry__mix_cursor_init(&c);
        for (j = 0; j < t->count; j++, pos += w) {
            uint64_t p = pos < s->n ? pos : pos - s->n;
            out[j] = ferry__mix_draw(s->o.mix, s->o.seed, s->o.shuffle, t->epoch * s->n + p, &c,
                                     NULL);
        }
        return;
    }
    if (s->o.shuffle)
        round_keys(s, t->epoch, k);
    for (j = 0; j < t->count; j++, pos += w) {
        /* A padded shard's last positions (< n + w <= 2n) repeat the order's
         * start: a head's too, so its repeats were served earlier that epoch. */
        uint64_t p = pos < s->n ? pos : pos - s->n;
        out[j] = s->o.shuffle ? ferry__feistel_walk(k, s->half_bits, s->n, p) : p;
    }
}

/* ------------------------------------------------------------------------
 * Position blobs
 *
 * Version 2 layout, little-endian, 80 bytes:
 *    0  "FRYS"            4  u32 version (2)
 *    8  u64 epoch        16  u64 position: of epoch's global order, how many
 *                            positions the whole job has consumed (P)
 *   24  u64 n            32  u64 seed
 *   40  u64 batch_size   48  u64 batch: the saver's next batch_in_epoch
 *   56  u32 rank         60  u32 world_size
 *   64  u32 flags (bit 0 drop_last, bit 1 shuffle, bit 2 padded, bit 3 mix)
 *   68  u32 the mix's fingerprint with bit 3, else 0
 *   72  u64 checksum of bytes 0..71
 * The order is (n, seed, shuffle, mix); epoch and position say where in it
 * the job stands. The rest is the saver's shape, kept to check that the ranks
 * of one job agree and to explain a refusal; a restore does not need it.
 *
 * Version 1 (64 bytes, read still): "FRYS", 1, next_seq, n, batch_size,
 * seed, rank, world_size, flags, reserved, checksum of bytes 0..55. Its
 * next_seq is the saver's own seq; with its shape it gives the same
 * (epoch, position) a version 2 blob holds.
 */

#define STATE_MAGIC "FRYS"
#define STATE_VERSION 2u
#define STATE_LEN 80
#define STATE_V1_LEN 64
#define FLAG_DROP_LAST 1u
#define FLAG_SHUFFLE 2u
#define FLAG_PADDED 4u /* pad_shards in effect (world_size > 1, n % world_size != 0) */
#define FLAG_MIX 8u    /* the order is a mix's draw; its fingerprint follows the flags */
#define FLAGS_KNOWN (FLAG_DROP_LAST | FLAG_SHUFFLE | FLAG_PADDED | FLAG_MIX)

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

/* A chain of ferry_mix64 over the 8-byte words of p[0..summed). mix64 is a
 * bijection, so any change confined to one word always changes the sum; it
 * guards against truncation and bit rot, not against forgery. */
static uint64_t state_checksum(const unsigned char *p, size_t summed)
{
    uint64_t h = 0x46525953u; /* "FRYS" */
    size_t i;

    for (i = 0; i < summed; i += 8)
        h = ferry_mix64(h ^ get_u64(p + i));
    return h;
}

static uint32_t sampler_flags(const ferry__sampler *s)
{
    return (s->o.drop_last ? FLAG_DROP_LAST : 0) | (s->o.shuffle ? FLAG_SHUFFLE : 0) |
           (s->o.pad_shards ? FLAG_PADDED : 0) | (s->o.mix ? FLAG_MIX : 0);
}

/* A blob, read: what the job had consumed, of which order, saved in what shape. */
typedef struct saved_state {
    uint64_t epoch, pos; /* the job's position */
    uint64_t n, seed;    /* the order (and shuffle in flags) */
    uint64_t batch_size, batch;
    uint32_t rank, world_size, flags;
    uint32_t mix; /* the mix's fingerprint (with FLAG_MIX) */
} saved_state;

/* Writes the blob for `next_seq` (the first task not yet delivered) into buf.
 * FERRY_ELIMIT when cap is too small; *len is set to the size needed either
 * way, so a caller may ask with cap 0 first. buf is untouched on failure. */
int ferry__sampler_save(const ferry__sampler *s, uint64_t next_seq, void *buf, size_t cap,
                        size_t *len)
{
    const uint64_t bpe = s->batches_per_epoch, step = s->o.batch_size * s->o.world_size;
    uint64_t epoch = next_seq / bpe, b = next_seq % bpe, pos;
    unsigned char p[STATE_LEN];

    *len = STATE_LEN;
    if (cap < STATE_LEN)
        return ferry__seterr(FERRY_ELIMIT, "the sampler state needs %d bytes, the buffer has %zu",
                             STATE_LEN, cap);
    /* Every rank has taken the same batches (of full size: a short one is
     * an epoch's last), so the job's prefix is b whole strides. */
    pos = in_head(s, epoch, b) ? s->head_pos + (b - s->head_first) * step : b * step;
    memcpy(p, STATE_MAGIC, 4);
    put_u32(p + 4, STATE_VERSION);
    put_u64(p + 8, epoch);
    put_u64(p + 16, pos);
    put_u64(p + 24, s->n);
    put_u64(p + 32, s->o.seed);
    put_u64(p + 40, s->o.batch_size);
    put_u64(p + 48, b);
    put_u32(p + 56, s->o.rank);
    put_u32(p + 60, s->o.world_size);
    put_u32(p + 64, sampler_flags(s));
    put_u32(p + 68, s->o.mix ? ferry__mix_fingerprint_at(s->o.mix, epoch * s->n + pos) : 0);
    put_u64(p + 72, state_checksum(p, 72));
    memcpy(buf, p, STATE_LEN);
    return FERRY_OK;
}

/* Version 1's next_seq as (epoch, position), by the saver's own shape. */
static int read_v1(const unsigned char *p, saved_state *st)
{
    uint64_t per, bpe, next = get_u64(p + 8);

    st->n = get_u64(p + 16);
    st->batch_size = get_u64(p + 24);
    st->seed = get_u64(p + 32);
    st->rank = get_u32(p + 40);
    st->world_size = get_u32(p + 44);
    st->flags = get_u32(p + 48);
    if (st->batch_size == 0 || st->world_size == 0 || st->n < st->world_size)
        return ferry__seterr(FERRY_ESTATE,
                             "the version 1 sampler state has an impossible shape "
                             "(n %llu, batch_size %llu, world_size %lu)",
                             (unsigned long long)st->n, (unsigned long long)st->batch_size,
                             (unsigned long)st->world_size);
    per = st->n / st->world_size + (uint64_t)((st->flags & FLAG_PADDED) != 0);
    bpe = (st->flags & FLAG_DROP_LAST) ? per / st->batch_size
                                       : per / st->batch_size + (per % st->batch_size != 0);
    if (bpe == 0)
        return ferry__seterr(FERRY_ESTATE, "the version 1 sampler state has no batch per epoch");
    st->epoch = next / bpe;
    st->batch = next % bpe;
    st->pos = st->batch * st->batch_size * st->world_size;
    return FERRY_OK;
}

/* Checks the blob's form (magic, version, length, checksum, reserved bits),
 * so a field is only read once the bytes are known to be intact, and reads
 * it into *st. FERRY_ESTATE with a detail. */
static int read_state(const void *buf, size_t len, saved_state *st)
{
    const unsigned char *p = buf;
    uint32_t version;
    size_t want;

    if (p == NULL || len < 8)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state is %zu bytes, too short to be a ferry state", len);
    if (memcmp(p, STATE_MAGIC, 4) != 0)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state does not start with \"FRYS\": not a ferry state");
    version = get_u32(p + 4);
    if (version != 1 && version != STATE_VERSION)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state has version %lu, this ferry reads versions 1 "
                             "and %u",
                             (unsigned long)version, STATE_VERSION);
    want = version == 1 ? STATE_V1_LEN : STATE_LEN;
    if (len != want)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state is %zu bytes, a version %lu state is %zu bytes",
                             len, (unsigned long)version, want);
    if (get_u64(p + want - 8) != state_checksum(p, want - 8))
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state's checksum does not match: the blob is corrupted");
    uint32_t flags = get_u32(p + want - 16);
    if ((get_u32(p + want - 12) != 0 && !(version > 1 && (flags & FLAG_MIX))) ||
        (flags & ~FLAGS_KNOWN) != 0 || (version == 1 && (flags & FLAG_MIX)))
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state has unknown flags 0x%lx or reserved bits set",
                             (unsigned long)get_u32(p + want - 16));
    memset(st, 0, sizeof *st);
    if (version == 1)
        return read_v1(p, st);
    st->epoch = get_u64(p + 8);
    st->pos = get_u64(p + 16);
    st->n = get_u64(p + 24);
    st->seed = get_u64(p + 32);
    st->batch_size = get_u64(p + 40);
    st->batch = get_u64(p + 48);
    st->rank = get_u32(p + 56);
    st->world_size = get_u32(p + 60);
    st->flags = get_u32(p + 64);
    st->mix = get_u32(p + 68);
    if (st->pos >= st->n && st->pos != 0)
        return ferry__seterr(FERRY_ESTATE,
                             "the sampler state's position %llu is past the dataset's %llu items",
                             (unsigned long long)st->pos, (unsigned long long)st->n);
    return FERRY_OK;
}

static const char *on_off(uint32_t flags, uint32_t bit)
{
    return (flags & bit) ? "on" : "off";
}

int ferry__sampler_state_resize(const void *buf, size_t len, uint64_t n, void *out)
{
    saved_state st;
    int rc = read_state(buf, len, &st);
    if (rc != FERRY_OK)
        return rc;
    if (len != STATE_LEN || st.pos != 0 || (st.flags & FLAG_MIX))
        return ferry__seterr(FERRY_ESTATE, "only a state at an epoch's start (not of a mix) "
                                           "can be moved to a dataset of another length");
    if (n == 0)
        return ferry__seterr(FERRY_ESTATE, "a dataset of no items has no epoch to start");
    unsigned char p[STATE_LEN];
    memcpy(p, buf, STATE_LEN);
    put_u64(p + 24, n);
    put_u64(p + 72, state_checksum(p, 72));
    memcpy(out, p, STATE_LEN);
    return FERRY_OK;
}

/* Compares the order only: n, shuffle, seed. The seed is compared even with
 * shuffle off: it also seeds per-sample augmentation, so a different seed
 * gives different batches. The shape (world_size, rank, batch_size,
 * drop_last, pad_shards) may differ: the rest of the epoch is re-cut. */
int ferry__sampler_restore(ferry__sampler *s, const void *buf, size_t len, uint64_t *next_seq)
{
    const uint64_t bpe = s->batches_per_epoch;
    saved_state st;
    ferry__sampler t;
    int rc = read_state(buf, len, &st);

    if (rc != FERRY_OK)
        return rc;
    if (st.n != s->n)
        return ferry__seterr(FERRY_ESTATE,
                             "state was saved for a dataset of %llu items, this one has %llu",
                             (unsigned long long)st.n, (unsigned long long)s->n);
    if ((st.flags & FLAG_SHUFFLE) != (s->o.shuffle ? FLAG_SHUFFLE : 0))
        return ferry__seterr(FERRY_ESTATE, "state was saved with shuffle %s, loader has it %s",
                             on_off(st.flags, FLAG_SHUFFLE), s->o.shuffle ? "on" : "off");
    if (st.seed != s->o.seed)
        return ferry__seterr(FERRY_ESTATE, "state was saved with seed %llu, loader has %llu",
                             (unsigned long long)st.seed, (unsigned long long)s->o.seed);
    if ((st.flags & FLAG_MIX) != (s->o.mix ? FLAG_MIX : 0))
        return ferry__seterr(FERRY_ESTATE, "state was saved %s a mix of sources, loader has %s",
                             (st.flags & FLAG_MIX) ? "with" : "without", s->o.mix ? "one" : "none");
    uint64_t g = st.epoch * s->n + st.pos; /* the job's place in the mixed stream */
    if (s->o.mix && st.mix != ferry__mix_fingerprint_at(s->o.mix, g))
        return ferry__seterr(FERRY_ESTATE,
                             "state was saved with another mix (fingerprint %08lx, the loader's "
                             "is %08lx): other sources' sizes or length, or a schedule of "
                             "weights that differs before position %llu, where the job stands "
                             "(a schedule may change only after it)",
                             (unsigned long)st.mix,
                             (unsigned long)ferry__mix_fingerprint_at(s->o.mix, g),
                             (unsigned long long)g);
    if (st.epoch > (UINT64_MAX - bpe) / bpe)
        return ferry__seterr(FERRY_ESTATE, "state's epoch %llu is past the end of any stream",
                             (unsigned long long)st.epoch);
    t = *s;
    set_head(&t, st.epoch, st.pos);
    *s = t;
    *next_seq = ferry__sampler_start(s);
    return FERRY_OK;
}

/* Names what differs between blob i and blob 0 (a and b), or FERRY_OK. */
static int compare_states(size_t i, const saved_state *a, const saved_state *b)
{
    if (a->n != b->n || a->seed != b->seed || a->mix != b->mix ||
        ((a->flags ^ b->flags) & (FLAG_SHUFFLE | FLAG_MIX)) != 0)
        return ferry__seterr(FERRY_ESTATE,
                             "state %zu (rank %lu) is of another order than state 0 (rank %lu): "
                             "dataset of %llu items, seed %llu, shuffle %s against %llu, %llu, %s",
                             i, (unsigned long)a->rank, (unsigned long)b->rank,
                             (unsigned long long)a->n, (unsigned long long)a->seed,
                             on_off(a->flags, FLAG_SHUFFLE), (unsigned long long)b->n,
                             (unsigned long long)b->seed, on_off(b->flags, FLAG_SHUFFLE));
    if (a->world_size != b->world_size || a->batch_size != b->batch_size)
        return ferry__seterr(FERRY_ESTATE,
                             "state %zu (rank %lu) was saved with world_size %lu, batch_size %llu; "
                             "state 0 (rank %lu) with world_size %lu, batch_size %llu: not one job",
                             i, (unsigned long)a->rank, (unsigned long)a->world_size,
                             (unsigned long long)a->batch_size, (unsigned long)b->rank,
                             (unsigned long)b->world_size, (unsigned long long)b->batch_size);
    if (a->epoch != b->epoch || a->pos != b->pos)
        return ferry__seterr(FERRY_ESTATE,
                             "the ranks did not stop at the same batch: state %zu (rank %lu) is "
                             "before batch %llu of epoch %llu, state 0 (rank %lu) before batch "
                             "%llu of epoch %llu; save every rank's state after the same step",
                             i, (unsigned long)a->rank, (unsigned long long)a->batch,
                             (unsigned long long)a->epoch, (unsigned long)b->rank,
                             (unsigned long long)b->batch, (unsigned long long)b->epoch);
    return FERRY_OK;
}

static int by_rank(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return (x > y) - (x < y);
}

int ferry__sampler_states_agree(const void *const *bufs, const size_t *lens, size_t count)
{
    char why[FERRY__ERRMSG_MAX];
    saved_state first, st;
    uint32_t *ranks;
    size_t i;
    int rc = FERRY_OK;

    if (count == 0 || bufs == NULL || lens == NULL)
        return ferry__seterr(FERRY_EINVAL, "no states to compare");
    ranks = ferry__malloc(count * sizeof *ranks);
    if (ranks == NULL)
        return ferry__seterr(FERRY_ENOMEM, "out of memory comparing %zu states", count);
    for (i = 0; i < count && rc == FERRY_OK; i++) {
        rc = read_state(bufs[i], lens[i], i ? &st : &first);
        if (rc != FERRY_OK) {
            snprintf(why, sizeof why, "%s", ferry_last_error());
            rc = ferry__seterr(rc, "state %zu: %s", i, why);
        } else if (i) {
            rc = compare_states(i, &st, &first);
        }
        if (rc == FERRY_OK)
            ranks[i] = i ? st.rank : first.rank;
    }
    /* Distinct ranks: the same rank twice is a copy, or two jobs mixed. */
    if (rc == FERRY_OK) {
        qsort(ranks, count, sizeof *ranks, by_rank);
        for (i = 1; i < count && rc == FERRY_OK; i++)
            if (ranks[i] == ranks[i - 1])
                rc = ferry__seterr(FERRY_ESTATE,
                                   "two of the states are rank %lu's: the same "
                                   "state twice, or states of two jobs",
                                   (unsigned long)ranks[i]);
    }
    free(ranks);
    return rc;
}
