/*
 * mix.c - several sources in one stream, drawn by weight (see mix.h).
 *
 * Invariants:
 *  - A parsed mix is written once, by ferry__mix_parse, and only read after.
 *  - Every segment's whole-block quotas add up to FERRY__MIX_BLOCK and its
 *    short block's to that block's size; base[s][k] is source k's draws
 *    before segment s. So the draws of k are numbered 0, 1, 2, ... without
 *    a gap or a repeat, which is what makes each source's passes whole.
 *  - Only integers enter the fingerprint and the draw: the weights are
 *    turned into quotas once, here, and a float never decides an index later.
 */
#include "mix.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "ferry.h"

/* Salts that keep the mix's keys apart from the plain order's
 * (mix64(mix64(seed) ^ epoch)) and from each other. */
#define SALT_BLOCK UINT64_C(0x6d69782d626c6f63)  /* "mix-bloc" */
#define SALT_SOURCE UINT64_C(0x6d69782d73726365) /* "mix-srce" */

/* ------------------------------------------------------------------------
 * The mix's bijections
 *
 * Every draw runs two (the block's layout and the source's pass), so they
 * must cost about what the plain order's one does. Three differences from
 * feistel.h make that so: the domain is 2^b with b the bits of n - 1 (not
 * 4^h), so cycle-walking takes under 2 passes on average, not up to 4; a
 * round's function is multiply, xor the key, multiply (its top bits),
 * not a ferry_mix64; and there are 6 rounds for a source's pass, 4 for a
 * block's layout (which only spreads the quotas). tests/test_mix.c holds
 * them to it: every order of a 5-item source within 12% of uniform over
 * 240000 passes, each rank's stride within 1% of the weights. The halves
 * are b / 2 and b - b / 2 bits, and each round xors one half with a keyed
 * function of the other: every round is invertible, so the whole is a
 * bijection of [0, 2^b), and walking keeps it one of [0, n). (The plain
 * order keeps feistel.h's: its orders are what saved runs mean.)
 */

#define BLOCK_BITS 12 /* FERRY__MIX_BLOCK = 2^12 */
#define BLOCK_ROUNDS 4
#define SOURCE_ROUNDS 6
/* Below 6 bits the rounds' functions are too few to reach every order
 * evenly (Feistel rounds on a few bits make only some permutations): a
 * source of 5 items walks a domain of 64. */
#define MIN_BITS 6
#define ROUND_MUL UINT64_C(0x9e3779b97f4a7c15)
#define ROUND_MUL2 UINT64_C(0xbf58476d1ce4e5b9)

/* The width of the permutation of [0, n): the bits of n - 1, at least
 * MIN_BITS. */
static unsigned walk_bits(uint64_t n)
{
    unsigned b = MIN_BITS;

    while (b < 64 && (UINT64_C(1) << b) < n)
        b++;
    return b;
}

/* A round's keyed function: its top bits depend on every bit of x and k. */
static inline uint64_t round_f(uint64_t x, uint64_t k)
{
    return ((x * ROUND_MUL) ^ k) * ROUND_MUL2;
}

/* Requires i < n <= 2^bits: the walk ends because i's cycle holds i. */
static inline uint64_t walk(const uint64_t k[FERRY__FEISTEL_ROUNDS], int rounds, unsigned bits,
                            uint64_t n, uint64_t i)
{
    const unsigned lo = bits / 2, hi = bits - lo;
    const uint64_t lo_mask = (UINT64_C(1) << lo) - 1;
    uint64_t x = i;

    do {
        uint64_t l = x >> lo, r = x & lo_mask;
        for (int round = 0; round < rounds; round += 2) {
            l ^= round_f(r, k[round]) >> (64 - hi);
            r ^= round_f(l, k[round + 1]) >> (64 - lo);
        }
        x = l << lo | r;
    } while (x >= n);
    return x;
}

typedef struct segment {
    uint64_t start;     /* its first global position */
    uint64_t blocks;    /* whole blocks in it; UINT64_MAX for the last segment */
    uint32_t tail;      /* positions of its short last block, 0: none */
    uint32_t *cum;      /* K + 1 running sums of a whole block's quotas */
    uint32_t *tail_cum; /* ... of the short block's */
    uint64_t *base;     /* K: each source's draws before this segment */
} segment;

struct ferry__mix {
    uint32_t k, nseg;
    uint64_t total, length;
    uint64_t *size, *offset;
    unsigned *bits; /* each source's permutation's width (walk_bits) */
    segment *seg;
    /* one allocation for every array above */
    void *mem;
};

/* ------------------------------------------------------------------------
 * Parsing
 */

/* "  x " -> "x": in place, within [*b, *e). */
static void trim(const char **b, const char **e)
{
    while (*b < *e && (**b == ' ' || **b == '\t'))
        (*b)++;
    while (*e > *b && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
        (*e)--;
}

/* A decimal count filling [b, e) exactly. */
static int parse_count(const char *b, const char *e, uint64_t *v)
{
    char buf[32], *end;

    trim(&b, &e);
    if (e - b <= 0 || e - b >= (long)sizeof buf || *b < '0' || *b > '9')
        return -1;
    memcpy(buf, b, (size_t)(e - b));
    buf[e - b] = '\0';
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (errno || *end)
        return -1;
    *v = (uint64_t)x;
    return 0;
}

static int parse_weight(const char *b, const char *e, double *v)
{
    char buf[64], *end;

    trim(&b, &e);
    if (e - b <= 0 || e - b >= (long)sizeof buf)
        return -1;
    memcpy(buf, b, (size_t)(e - b));
    buf[e - b] = '\0';
    errno = 0;
    *v = strtod(buf, &end);
    return errno || *end || !isfinite(*v) || *v < 0 ? -1 : 0;
}

/* The comma-separated fields of [b, e): how many. */
static uint32_t count_fields(const char *b, const char *e)
{
    uint32_t n = 1;

    for (; b < e; b++)
        n += *b == ',';
    return n;
}

/* Field i (of count_fields) of [b, e) as [*fb, *fe). */
static void field(const char *b, const char *e, uint32_t i, const char **fb, const char **fe)
{
    while (i--) {
        b = memchr(b, ',', (size_t)(e - b));
        b++;
    }
    const char *c = memchr(b, ',', (size_t)(e - b));
    *fb = b;
    *fe = c ? c : e;
}

/* Largest-remainder quotas of `size` slots for weights w (sum > 0), as
 * running sums cum[0..k]. A source of weight 0 gets none. */
static void quotas(const double *w, uint32_t k, uint32_t size, uint32_t *cum, uint32_t *q,
                   double *frac)
{
    double sum = 0;
    uint64_t given = 0;
    uint32_t i;

    for (i = 0; i < k; i++)
        sum += w[i];
    for (i = 0; i < k; i++) {
        double exact = w[i] / sum * size;
        double whole = floor(exact);
        q[i] = whole > size ? size : (uint32_t)whole;
        frac[i] = exact - whole;
        given += q[i];
    }
    /* The slots left (fewer than the sources with a fraction, but for
     * rounding) go to the largest fractions, the lower source on a tie. */
    while (given < size) {
        uint32_t best = k;
        for (i = 0; i < k; i++)
            if (w[i] > 0 && (best == k || frac[i] > frac[best]))
                best = i;
        q[best]++;
        frac[best] = -1;
        given++;
    }
    while (given > size) { /* rounding the other way: take from the largest */
        uint32_t big = 0;
        for (i = 1; i < k; i++)
            if (q[i] > q[big])
                big = i;
        q[big]--;
        given--;
    }
    cum[0] = 0;
    for (i = 0; i < k; i++)
        cum[i + 1] = cum[i] + q[i];
}

/* Counts what the spec holds, to size the one allocation. */
static int measure(const char *spec, uint32_t *k, uint32_t *nseg)
{
    const char *semi = strchr(spec, ';');
    uint32_t parts = 0;
    const char *p;

    if (!semi)
        return ferry__seterr(FERRY_EINVAL,
                             "mix \"%.200s\": no schedule; write SIZES;0:WEIGHTS, e.g. "
                             "\"1000,500;0:0.7,0.3\"",
                             spec);
    *k = count_fields(spec, semi);
    for (p = semi; p; p = strchr(p + 1, ';'))
        parts++;
    *nseg = parts; /* an upper bound: one part may be length= */
    if (*k > FERRY__MIX_SOURCES_MAX)
        return ferry__seterr(FERRY_EINVAL, "mix: %lu sources, at most %d", (unsigned long)*k,
                             FERRY__MIX_SOURCES_MAX);
    if (*nseg > FERRY__MIX_STEPS_MAX)
        return ferry__seterr(FERRY_EINVAL, "mix: %lu steps, at most %d", (unsigned long)*nseg,
                             FERRY__MIX_STEPS_MAX);
    return FERRY_OK;
}

static int parse_sizes(ferry__mix *m, const char *b, const char *e)
{
    uint32_t i;

    m->total = 0;
    for (i = 0; i < m->k; i++) {
        const char *fb, *fe;
        field(b, e, i, &fb, &fe);
        if (parse_count(fb, fe, &m->size[i]) != 0 || m->size[i] == 0)
            return ferry__seterr(FERRY_EINVAL,
                                 "mix: source %lu's size \"%.*s\" is not a count of at least 1",
                                 (unsigned long)i, (int)(fe - fb), fb);
        if (m->size[i] > (UINT64_C(1) << 62) - m->total)
            return ferry__seterr(FERRY_EINVAL, "mix: the sources hold more than 2^62 items");
        m->offset[i] = m->total;
        m->total += m->size[i];
        m->bits[i] = walk_bits(m->size[i]);
    }
    return FERRY_OK;
}

/* One "STEP:WEIGHTS" part into segment s (quotas only; blocks and bases
 * are set once every step is known). */
static int parse_segment(ferry__mix *m, uint32_t s, const char *b, const char *e, double *w,
                         uint32_t *q, double *frac)
{
    const char *colon = memchr(b, ':', (size_t)(e - b));
    segment *g = &m->seg[s];
    double sum = 0;
    uint32_t i;

    if (!colon || parse_count(b, colon, &g->start) != 0)
        return ferry__seterr(FERRY_EINVAL,
                             "mix: \"%.*s\" is not STEP:WEIGHTS (a position of the mixed "
                             "order, a colon, one weight per source)",
                             (int)(e - b), b);
    if (s == 0 && g->start != 0)
        return ferry__seterr(FERRY_EINVAL, "mix: the schedule's first step must be 0, not %llu",
                             (unsigned long long)g->start);
    if (s > 0 && g->start <= m->seg[s - 1].start)
        return ferry__seterr(FERRY_EINVAL, "mix: step %llu does not come after step %llu",
                             (unsigned long long)g->start,
                             (unsigned long long)m->seg[s - 1].start);
    if (count_fields(colon + 1, e) != m->k)
        return ferry__seterr(FERRY_EINVAL, "mix: step %llu has %lu weights for %lu sources",
                             (unsigned long long)g->start,
                             (unsigned long)count_fields(colon + 1, e), (unsigned long)m->k);
    for (i = 0; i < m->k; i++) {
        const char *fb, *fe;
        field(colon + 1, e, i, &fb, &fe);
        if (parse_weight(fb, fe, &w[i]) != 0)
            return ferry__seterr(FERRY_EINVAL,
                                 "mix: step %llu: weight \"%.*s\" is not a finite number >= 0",
                                 (unsigned long long)g->start, (int)(fe - fb), fb);
        sum += w[i];
    }
    if (!(sum > 0))
        return ferry__seterr(FERRY_EINVAL, "mix: step %llu: every weight is 0",
                             (unsigned long long)g->start);
    /* The short block's quotas need the next step: finish() makes them. */
    quotas(w, m->k, FERRY__MIX_BLOCK, g->cum, q, frac);
    return FERRY_OK;
}

/* Blocks, short blocks and bases, now that every step is known. `weights`
 * holds each segment's weights (nseg * k). */
static void finish(ferry__mix *m, const double *weights, uint32_t *q, double *frac)
{
    uint32_t s, i;

    for (s = 0; s < m->nseg; s++) {
        segment *g = &m->seg[s];
        if (s + 1 < m->nseg) {
            uint64_t len = m->seg[s + 1].start - g->start;
            g->blocks = len / FERRY__MIX_BLOCK;
            g->tail = (uint32_t)(len % FERRY__MIX_BLOCK);
        } else {
            g->blocks = UINT64_MAX;
            g->tail = 0;
        }
        quotas(weights + (size_t)s * m->k, m->k, g->tail, g->tail_cum, q, frac);
        for (i = 0; i < m->k; i++) {
            if (s == 0) {
                g->base[i] = 0;
            } else {
                const segment *p = &m->seg[s - 1];
                g->base[i] = p->base[i] + p->blocks * (p->cum[i + 1] - p->cum[i]) +
                             (p->tail_cum[i + 1] - p->tail_cum[i]);
            }
        }
    }
}

/* Lays out every array of a mix of k sources and nseg segments in one block. */
static ferry__mix *alloc_mix(uint32_t k, uint32_t nseg)
{
    size_t u64s = 2 * (size_t)k + (size_t)nseg * k;        /* size, offset, bases */
    size_t u32s = 2 * (size_t)nseg * (k + 1) + (size_t)k; /* cums, bits */
    ferry__mix *m = ferry__calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->mem = ferry__calloc(1, nseg * sizeof(segment) + u64s * 8 + u32s * 4);
    if (!m->mem) {
        free(m);
        return NULL;
    }
    m->k = k;
    m->seg = m->mem;
    uint64_t *p64 = (uint64_t *)(m->seg + nseg);
    m->size = p64;
    m->offset = p64 + k;
    p64 += 2 * (size_t)k;
    uint32_t *p32 = (uint32_t *)(p64 + (size_t)nseg * k);
    m->bits = p32;
    p32 += k;
    for (uint32_t s = 0; s < nseg; s++) {
        m->seg[s].base = p64 + (size_t)s * k;
        m->seg[s].cum = p32 + (size_t)2 * s * (k + 1);
        m->seg[s].tail_cum = m->seg[s].cum + k + 1;
    }
    return m;
}

void ferry__mix_free(ferry__mix *m)
{
    if (m) {
        free(m->mem);
        free(m);
    }
}

/* Parses the parts after SIZES: the steps, and length=. */
static int parse_parts(ferry__mix *m, const char *p, double *weights, uint32_t *q, double *frac)
{
    int have_length = 0;

    m->nseg = 0;
    while (p) {
        const char *b = p + 1, *next = strchr(b, ';');
        const char *e = next ? next : b + strlen(b);
        trim(&b, &e);
        if (e - b > 7 && strncmp(b, "length=", 7) == 0) {
            if (have_length || parse_count(b + 7, e, &m->length) != 0 || m->length == 0)
                return ferry__seterr(FERRY_EINVAL,
                                     "mix: \"%.*s\": length= is given once, a count of at "
                                     "least 1",
                                     (int)(e - b), b);
            have_length = 1;
        } else {
            int rc = parse_segment(m, m->nseg, b, e, weights + (size_t)m->nseg * m->k, q, frac);
            if (rc != FERRY_OK)
                return rc;
            m->nseg++;
        }
        p = next;
    }
    if (m->nseg == 0)
        return ferry__seterr(FERRY_EINVAL, "mix: no step; the schedule starts with 0:WEIGHTS");
    if (!have_length)
        m->length = m->total;
    return FERRY_OK;
}

int ferry__mix_parse(const char *spec, ferry__mix **out)
{
    uint32_t k = 0, nseg = 0;
    int rc;

    if (!spec || !out)
        return ferry__seterr(FERRY_EINVAL, "mix: spec and out must not be NULL");
    rc = measure(spec, &k, &nseg);
    if (rc != FERRY_OK)
        return rc;
    ferry__mix *m = alloc_mix(k, nseg);
    double *weights = ferry__calloc((size_t)nseg * k + k, sizeof *weights);
    uint32_t *q = ferry__calloc(k, sizeof *q);
    if (!m || !weights || !q) {
        ferry__mix_free(m);
        free(weights);
        free(q);
        return ferry__seterr(FERRY_ENOMEM, "out of memory parsing a mix of %lu sources",
                             (unsigned long)k);
    }
    double *frac = weights + (size_t)nseg * k;
    const char *semi = strchr(spec, ';');
    rc = parse_sizes(m, spec, semi);
    if (rc == FERRY_OK)
        rc = parse_parts(m, semi, weights, q, frac);
    if (rc == FERRY_OK) {
        finish(m, weights, q, frac);
        *out = m;
    } else {
        ferry__mix_free(m);
    }
    free(weights);
    free(q);
    return rc;
}

uint32_t ferry__mix_sources(const ferry__mix *m)
{
    return m->k;
}

uint64_t ferry__mix_total(const ferry__mix *m)
{
    return m->total;
}

uint64_t ferry__mix_length(const ferry__mix *m)
{
    return m->length;
}

/* What the draws at positions below g depend on: the sizes, the length,
 * every segment that starts at or before g (its start and whole-block
 * quotas), and the short block of each one that ends within the block
 * holding g (its end and quotas). A schedule changed only after that
 * block gives the same: what was drawn before g is drawn alike, and every
 * source's count of draws at g is the same. */
uint32_t ferry__mix_fingerprint_at(const ferry__mix *m, uint64_t g)
{
    uint64_t h = ferry_mix64(SALT_BLOCK ^ m->k);
    uint32_t s, i;

    h = ferry_mix64(h ^ m->length);
    for (i = 0; i < m->k; i++)
        h = ferry_mix64(h ^ m->size[i]);
    for (s = 0; s < m->nseg && m->seg[s].start <= g; s++) {
        const segment *seg = &m->seg[s];
        h = ferry_mix64(h ^ seg->start);
        for (i = 0; i <= m->k; i++)
            h = ferry_mix64(h ^ seg->cum[i]);
        if (s + 1 < m->nseg) {
            uint64_t end = m->seg[s + 1].start;
            uint64_t b = (g - seg->start) / FERRY__MIX_BLOCK; /* g's block in the segment */
            uint64_t block_end = seg->start + (b + 1) * FERRY__MIX_BLOCK;
            if (end < block_end || end <= g) {
                h = ferry_mix64(h ^ end);
                for (i = 0; i <= m->k; i++)
                    h = ferry_mix64(h ^ seg->tail_cum[i]);
            }
        }
    }
    return (uint32_t)(h ^ (h >> 32));
}

/* ------------------------------------------------------------------------
 * The draw
 */

void ferry__mix_cursor_init(ferry__mix_cursor *c)
{
    memset(c, 0, sizeof *c);
}

/* The segment holding position g: the last whose start is <= g. */
static uint32_t find_segment(const ferry__mix *m, uint64_t g)
{
    uint32_t lo = 0, hi = m->nseg; /* seg[lo].start <= g < seg[hi].start */

    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (m->seg[mid].start <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The source whose slots [cum[k], cum[k+1]) hold slot d. */
static uint32_t find_source(const uint32_t *cum, uint32_t k, uint32_t d)
{
    uint32_t lo = 0, hi = k; /* cum[lo] <= d < cum[hi] */

    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cum[mid] <= d)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Draw j is item j % n of pass j / n: the cursor's pass of k when j is
 * in it (no division), else that pass's keys are made. */
uint64_t ferry__mix_item(const ferry__mix *m, uint64_t seed, int shuffle, uint32_t k, uint64_t j,
                         ferry__mix_cursor *c)
{
    uint64_t n = m->size[k];
    ferry__mix_pass *p = &c->pass[k % FERRY__MIX_CACHED];
    if (!p->valid || p->source != k || j < p->first || j - p->first >= n) {
        uint64_t epoch = j / n;
        p->valid = 1;
        p->source = k;
        p->first = epoch * n;
        if (shuffle)
            ferry__feistel_keys(
                ferry_mix64(ferry_mix64(ferry_mix64(seed ^ SALT_SOURCE) ^ k) ^ epoch), p->keys);
    }
    uint64_t pos = j - p->first;
    return m->offset[k] +
           (shuffle ? walk(p->keys, SOURCE_ROUNDS, m->bits[k], n, pos) : pos);
}

uint64_t ferry__mix_draw(const ferry__mix *m, uint64_t seed, int shuffle, uint64_t g,
                         ferry__mix_cursor *c, uint32_t *source)
{
    uint32_t s = find_segment(m, g);
    const segment *seg = &m->seg[s];
    uint64_t r = g - seg->start, b = r / FERRY__MIX_BLOCK;
    uint32_t o = (uint32_t)(r % FERRY__MIX_BLOCK);
    int whole = b < seg->blocks;
    const uint32_t *cum = whole ? seg->cum : seg->tail_cum;
    uint32_t size = whole ? FERRY__MIX_BLOCK : seg->tail;

    /* Where in the block the slot is: a keyed bijection of the block. */
    uint64_t tag = ((uint64_t)s << 52 ^ b) + 1;
    if (c->block_tag != tag) {
        uint64_t base = ferry_mix64(ferry_mix64(ferry_mix64(seed ^ SALT_BLOCK) ^ s) ^ b);
        ferry__feistel_keys(base, c->block_keys);
        c->block_tag = tag;
    }
    uint32_t d = (uint32_t)walk(c->block_keys, BLOCK_ROUNDS, whole ? BLOCK_BITS : walk_bits(size), size, o);
    uint32_t k = find_source(cum, m->k, d);

    /* Which draw of source k that is, and so which of its items. */
    uint64_t j = seg->base[k] + b * (seg->cum[k + 1] - seg->cum[k]) + (d - cum[k]);
    if (source)
        *source = k;
    return ferry__mix_item(m, seed, shuffle, k, j, c);
}
