/*
 * synthetic.c - the built-in dataset whose content is a function of the
 * index: item i's bytes are computed, not read, so a test or a benchmark can
 * check every batch (exactly once, in order, intact) and can make batches
 * cost CPU or fail on purpose.
 *
 * Spec: synthetic[:KEY=VAL,...], keys (each at most once unless noted):
 *   n=N          items, 1..2^40 (default 60000)
 *   dim=D        bytes of field "x" per item, 1..2^30 (default 784)
 *   cost_us=US   CPU microseconds burnt per item, 0..60000000
 *   sleep_us=US  microseconds slept per batch, 0..60000000: a batch that
 *                takes time without taking this host's CPU (a worker on a
 *                host of its own, simulated on one machine)
 *   fail_at=I    get_batch fails on index I (< n); up to 8 times
 *   augment=0|1  XOR x with a per-sample stream
 *   leak_kb=K    keeps K KiB of fresh, written heap per item built, until
 *                the dataset is closed: memory that only grows, as under a
 *                leaky decoder (for option worker_max_rss_bytes), 0..65536
 * Field "x" (u8, [dim]) is ferry__synthetic_byte(i, j), optionally XORed with
 * a stream seeded by ferry_sample_seed(seed, epoch, i): the augmentation then
 * depends on (seed, epoch, index) only, never on which worker builds it.
 * Field "y" (i64 scalar) is the item's index.
 *
 * Threads: there is no global state, and the handle is read-only after
 * open but for leak_kb's list, which only its worker's calls touch, so each
 * worker (thread or process) may open its own.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kinds.h"

#define SYNTHETIC_MAX_FAILS 8
#define SYNTHETIC_GOLDEN 0x9E3779B97F4A7C15ULL

typedef struct synthetic {
    uint64_t n;
    uint64_t dim;
    uint64_t cost_us;
    uint64_t sleep_us;
    uint64_t augment;
    uint64_t fail_at[SYNTHETIC_MAX_FAILS];
    uint64_t nfail;
    uint64_t leak_kb;
    void *leaked; /* leak_kb's blocks, each starting with a pointer to the one before */
} synthetic;

enum {
    SYN_N,
    SYN_DIM,
    SYN_COST_US,
    SYN_SLEEP_US,
    SYN_FAIL_AT,
    SYN_AUGMENT,
    SYN_LEAK_KB,
    SYN_NKEYS
};

static const struct synthetic_key {
    const char *name;
    size_t offset; /* of the uint64_t (first one, if repeatable) it sets */
    uint64_t lo, hi;
    unsigned max; /* how many times it may be given */
} synthetic_keys[SYN_NKEYS] = {
    [SYN_N] = {"n", offsetof(synthetic, n), 1, 1ULL << 40, 1},
    [SYN_DIM] = {"dim", offsetof(synthetic, dim), 1, 1ULL << 30, 1},
    /* A minute of CPU per item is already far past any real decoder. */
    [SYN_COST_US] = {"cost_us", offsetof(synthetic, cost_us), 0, 60000000, 1},
    [SYN_SLEEP_US] = {"sleep_us", offsetof(synthetic, sleep_us), 0, 60000000, 1},
    [SYN_FAIL_AT] = {"fail_at", offsetof(synthetic, fail_at), 0, UINT64_MAX, SYNTHETIC_MAX_FAILS},
    [SYN_AUGMENT] = {"augment", offsetof(synthetic, augment), 0, 1, 1},
    [SYN_LEAK_KB] = {"leak_kb", offsetof(synthetic, leak_kb), 0, 65536, 1},
};

/* Word w (bytes 8w..8w+7, little-endian) of item i's x. */
static inline uint64_t synthetic_word(uint64_t i, uint64_t w)
{
    return ferry_mix64(i * SYNTHETIC_GOLDEN + w);
}

uint8_t ferry__synthetic_byte(uint64_t i, uint64_t j)
{
    return (uint8_t)(synthetic_word(i, j / 8) >> (8 * (j % 8)));
}

/* Word w of item i's x as delivered: augmented when `aug` is set. */
static inline uint64_t synthetic_x_word(uint64_t i, uint64_t w, int aug, uint64_t aug_seed)
{
    uint64_t v = synthetic_word(i, w);
    return aug ? v ^ ferry_mix64(aug_seed + w) : v;
}

/* Fills x (dim bytes) of item i a word at a time: one mix per 8 bytes, so
 * an MNIST-sized epoch builds at memory speed, not byte-loop speed. */
static void synthetic_fill(uint8_t *x, uint64_t dim, uint64_t i, int aug, uint64_t aug_seed)
{
    uint64_t words = dim / 8, w, v;
    for (w = 0; w < words; w++) {
        v = synthetic_x_word(i, w, aug, aug_seed);
        memcpy(x + 8 * w, &v, 8);
    }
    if (dim % 8) {
        v = synthetic_x_word(i, w, aug, aug_seed);
        memcpy(x + 8 * w, &v, dim % 8);
    }
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins until this thread has used `us` microseconds of CPU. CPU time, not
 * wall time: a stand-in for decoding must load a core the way decoding
 * does, and must not finish early because the thread was descheduled. */
static void burn_cpu(uint64_t us)
{
    volatile uint64_t sink = 0;
    uint64_t end;
    if (us == 0)
        return;
    end = thread_cpu_ns() + us * 1000u;
    do {
        for (int k = 0; k < 256; k++)
            sink = ferry_mix64(sink);
    } while (thread_cpu_ns() < end);
}

/* Sets one KEY=VALUE of `tok` in *s; seen[] counts the keys given so far. */
static int synthetic_option(synthetic *s, unsigned seen[], const char *tok, size_t len,
                            char *errbuf, size_t errlen)
{
    const char *eq = memchr(tok, '=', len);
    size_t klen = eq ? (size_t)(eq - tok) : len;
    const struct synthetic_key *k = NULL;
    unsigned ki;
    uint64_t *slot;

    if (len == 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "synthetic: empty option (expected KEY=VALUE,...)");
    for (ki = 0; ki < SYN_NKEYS; ki++) {
        if (strlen(synthetic_keys[ki].name) == klen &&
            memcmp(synthetic_keys[ki].name, tok, klen) == 0) {
            k = &synthetic_keys[ki];
            break;
        }
    }
    if (k == NULL)
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EDATASET,
            "synthetic: unknown key '%.*s' (expected n, dim, cost_us, sleep_us, fail_at, augment, "
            "leak_kb)",
            (int)klen, tok);
    if (eq == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "synthetic: option '%s' has no value (expected %s=VALUE)",
                                  k->name, k->name);
    if (seen[ki] == k->max)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "synthetic: %s given more than %u time%s", k->name, k->max,
                                  k->max == 1 ? "" : "s");
    slot = (uint64_t *)((char *)s + k->offset) + seen[ki];
    if (ferry__parse_u64(eq + 1, len - klen - 1, k->lo, k->hi, slot) != 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "synthetic: %s=%.*s is not an integer in %" PRIu64 "..%" PRIu64,
                                  k->name, (int)(len - klen - 1), eq + 1, k->lo, k->hi);
    seen[ki]++;
    return FERRY_OK;
}

static int synthetic_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                          ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    synthetic s = {.n = 60000, .dim = 784};
    unsigned seen[SYN_NKEYS] = {0};
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    synthetic *h;
    int rc;

    while (ferry__next_comma_token(&cur, &tok, &len)) {
        rc = synthetic_option(&s, seen, tok, len, errbuf, errlen);
        if (rc != FERRY_OK)
            return rc;
    }
    s.nfail = seen[SYN_FAIL_AT];
    for (uint64_t f = 0; f < s.nfail; f++) {
        if (s.fail_at[f] >= s.n)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "synthetic: fail_at=%" PRIu64 " is not below n=%" PRIu64,
                                      s.fail_at[f], s.n);
    }

    h = malloc(sizeof *h);
    if (h == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "synthetic: out of memory");
    *h = s;

    schema->nfields = 2;
    snprintf(schema->fields[0].name, sizeof schema->fields[0].name, "x");
    schema->fields[0].dtype = FERRY_DTYPE_U8;
    schema->fields[0].ndim = 1;
    schema->fields[0].shape[0] = (int64_t)s.dim;
    snprintf(schema->fields[1].name, sizeof schema->fields[1].name, "y");
    schema->fields[1].dtype = FERRY_DTYPE_I64;
    schema->fields[1].ndim = 0;
    *handle = h;
    return FERRY_OK;
}

static uint64_t synthetic_length(void *handle)
{
    return ((const synthetic *)handle)->n;
}

/* leak_kb: one more block, written through so it is resident, kept on
 * the handle's list. 0, or FERRY_ENOMEM with err filled. */
static int synthetic_leak(synthetic *s, uint64_t i, ferry_dataset_error *err)
{
    size_t bytes = (size_t)s->leak_kb * 1024;
    void **block = malloc(bytes < sizeof(void *) ? sizeof(void *) : bytes);
    if (block == NULL) {
        err->index = i;
        snprintf(err->message, sizeof err->message, "synthetic: out of memory for leak_kb");
        return FERRY_ENOMEM;
    }
    memset(block, 0xA5, bytes);
    *block = s->leaked;
    s->leaked = block;
    return FERRY_OK;
}

static int synthetic_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                               ferry_dataset_error *err)
{
    synthetic *s = handle;
    uint8_t *x = dst[0], *y = dst[1];

    if (s->sleep_us) {
        struct timespec ts = {.tv_sec = (time_t)(s->sleep_us / 1000000),
                              .tv_nsec = (long)(s->sleep_us % 1000000) * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    for (size_t k = 0; k < req->count; k++) {
        uint64_t i = req->indices[k];
        int64_t label = (int64_t)i;
        for (uint64_t f = 0; f < s->nfail; f++) {
            if (s->fail_at[f] == i) {
                err->index = i;
                snprintf(err->message, sizeof err->message,
                         "synthetic: injected failure at index %" PRIu64, i);
                return FERRY_EBATCH;
            }
        }
        burn_cpu(s->cost_us);
        if (s->leak_kb && synthetic_leak(s, i, err) != FERRY_OK)
            return FERRY_ENOMEM;
        synthetic_fill(x + k * s->dim, s->dim, i, s->augment != 0,
                       ferry_sample_seed(req->seed, req->epoch, i));
        memcpy(y + k * sizeof label, &label, sizeof label);
    }
    return FERRY_OK;
}

static void synthetic_close(void *handle)
{
    synthetic *s = handle;
    while (s->leaked) {
        void *before = *(void **)s->leaked;
        free(s->leaked);
        s->leaked = before;
    }
    free(s);
}

static const ferry_dataset_ops synthetic_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "synthetic",
    .open = synthetic_open,
    .length = synthetic_length,
    .get_batch = synthetic_get_batch,
    .close = synthetic_close,
};

const ferry__dataset_kind ferry__synthetic_kind = {
    .name = "synthetic",
    .ops = &synthetic_ops,
    .open = ferry__dataset_open_builtin,
};
