/*
 * dataset.c - opening a dataset from its spec and building batches from it.
 *
 * Position in the data flow: inside the worker loop. The worker opens the
 * spec it was given in CONFIG once, then calls ferry__dataset_get_batch for
 * every TASK with buffers that live inside the reply message, so the dataset
 * writes each batch exactly once and nothing is copied afterwards.
 *
 * Every kind is a ferry_dataset_ops table, the same shape a plugin exports:
 *   synthetic  item i's bytes are a function of i (tests, benchmarks);
 *   npy        .npy files mapped read-only, one field per file;
 *   plugin     a shared object exporting ferry_dataset_plugin().
 * This file does not trust any of them: after open it validates the schema
 * (so a batch's sizes can be computed without overflow anywhere downstream),
 * and around get_batch it checks the indices and the error message.
 *
 * Invariants of an open ferry__dataset: ops != NULL, length >= 1, the schema
 * passed validate_schema(), item_bytes[f] is the size of one item of field f
 * (at most FERRY__ITEM_BYTES_MAX). A failed open leaves it all zero.
 *
 * Threads: a ferry__dataset belongs to one worker (one thread). The built-in
 * kinds keep no global state, so thread workers may each open their own.
 */
#include "dataset.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

/* Datasets hand ferry raw little-endian bytes (the synthetic fill stores
 * whole words, npy '<' data is used as is). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ferry assumes a little-endian host");

/* One item of one field may be at most this big: a batch buffer is
 * count * item_bytes, and a bound here keeps that product far from overflow. */
#define FERRY__ITEM_BYTES_MAX ((size_t)1 << 30)

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* --- Helpers shared by the kinds --- */

/* Formats a message into buf (always NUL-terminated when len > 0) and
 * returns `code`, so a failure reads `return set_msg(buf, len, code, ...)`. */
__attribute__((format(printf, 4, 5))) static int set_msg(char *buf, size_t len, int code,
                                                         const char *fmt, ...)
{
    va_list ap;
    if (len == 0)
        return code;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return code;
}

/* Parses exactly `len` decimal digits (no sign, no spaces, no empty string)
 * into *out. Returns 0, or -1 if the text is not a number or lies outside
 * lo..hi; *out is untouched then. */
static int parse_u64(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0)
        return -1;
    for (size_t k = 0; k < len; k++) {
        if (s[k] < '0' || s[k] > '9')
            return -1;
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, s[k] - '0', &v))
            return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Walks a comma-separated list: sets *tok and *len to the next element (which may
 * be empty) and moves *cur past it. Returns 0 once the list is exhausted;
 * start with *cur = NULL for an empty list. */
static int next_token(const char **cur, const char **tok, size_t *len)
{
    const char *comma;
    if (*cur == NULL)
        return 0;
    comma = strchr(*cur, ',');
    *tok = *cur;
    *len = comma ? (size_t)(comma - *cur) : strlen(*cur);
    *cur = comma ? comma + 1 : NULL;
    return 1;
}

/* Bytes of an array of `ndim` dims of `elsize`-byte elements. Returns 0, or
 * -1 when a dim is negative or the product overflows size_t. */
static int shape_bytes(size_t elsize, const int64_t *shape, int ndim, size_t *out)
{
    size_t n = elsize;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n))
            return -1;
    }
    *out = n;
    return 0;
}

/* --- synthetic --- */

/*
 * synthetic:KEY=VAL,...  Field "x" (u8, [dim]) and field "y" (i64 scalar,
 * the item's index). x is ferry__synthetic_byte(i, j), optionally XORed with
 * a stream seeded by ferry_sample_seed(seed, epoch, i): the augmentation then
 * depends on (seed, epoch, index) only, never on which worker builds it.
 */

#define SYNTHETIC_MAX_FAILS 8
#define SYNTHETIC_GOLDEN 0x9E3779B97F4A7C15ULL

typedef struct synthetic {
    uint64_t n;
    uint64_t dim;
    uint64_t cost_us;
    uint64_t augment;
    uint64_t fail_at[SYNTHETIC_MAX_FAILS];
    uint64_t nfail;
} synthetic;

enum { SYN_N, SYN_DIM, SYN_COST_US, SYN_FAIL_AT, SYN_AUGMENT, SYN_NKEYS };

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
    [SYN_FAIL_AT] = {"fail_at", offsetof(synthetic, fail_at), 0, UINT64_MAX, SYNTHETIC_MAX_FAILS},
    [SYN_AUGMENT] = {"augment", offsetof(synthetic, augment), 0, 1, 1},
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
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "synthetic: empty option (expected KEY=VALUE,...)");
    for (ki = 0; ki < SYN_NKEYS; ki++) {
        if (strlen(synthetic_keys[ki].name) == klen &&
            memcmp(synthetic_keys[ki].name, tok, klen) == 0) {
            k = &synthetic_keys[ki];
            break;
        }
    }
    if (k == NULL)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "synthetic: unknown key '%.*s' (expected n, dim, cost_us, fail_at, augment)",
                       (int)klen, tok);
    if (eq == NULL)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "synthetic: option '%s' has no value (expected %s=VALUE)", k->name, k->name);
    if (seen[ki] == k->max)
        return set_msg(errbuf, errlen, FERRY_EDATASET, "synthetic: %s given more than %u time%s",
                       k->name, k->max, k->max == 1 ? "" : "s");
    slot = (uint64_t *)((char *)s + k->offset) + seen[ki];
    if (parse_u64(eq + 1, len - klen - 1, k->lo, k->hi, slot) != 0)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "synthetic: %s=%.*s is not an integer in %" PRIu64 "..%" PRIu64, k->name,
                       (int)(len - klen - 1), eq + 1, k->lo, k->hi);
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

    while (next_token(&cur, &tok, &len)) {
        rc = synthetic_option(&s, seen, tok, len, errbuf, errlen);
        if (rc != FERRY_OK)
            return rc;
    }
    s.nfail = seen[SYN_FAIL_AT];
    for (uint64_t f = 0; f < s.nfail; f++) {
        if (s.fail_at[f] >= s.n)
            return set_msg(errbuf, errlen, FERRY_EDATASET,
                           "synthetic: fail_at=%" PRIu64 " is not below n=%" PRIu64, s.fail_at[f],
                           s.n);
    }

    h = malloc(sizeof *h);
    if (h == NULL)
        return set_msg(errbuf, errlen, FERRY_ENOMEM, "synthetic: out of memory");
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

static int synthetic_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                               ferry_dataset_error *err)
{
    const synthetic *s = handle;
    uint8_t *x = dst[0], *y = dst[1];

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
        synthetic_fill(x + k * s->dim, s->dim, i, s->augment != 0,
                       ferry_sample_seed(req->seed, req->epoch, i));
        memcpy(y + k * sizeof label, &label, sizeof label);
    }
    return FERRY_OK;
}

static void synthetic_close(void *handle)
{
    free(handle);
}

static const ferry_dataset_ops synthetic_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "synthetic",
    .open = synthetic_open,
    .length = synthetic_length,
    .get_batch = synthetic_get_batch,
    .close = synthetic_close,
};

/* --- npy --- */

/*
 * npy:[NAME=]PATH[,[NAME=]PATH...]  One field per file, named after the
 * file's basename without ".npy" unless NAME= is given (a prefix before '='
 * counts as a name only if it has no '/'; paths cannot contain ','). Each file
 * is mapped read-only and private, so every worker on a host shares one copy
 * in the page cache; the fd is closed right after mapping.
 *
 * The header is parsed here, strictly: numpy's format is small, and
 * anything we do not understand is refused rather than misread. Whatever is
 * wrong with a file's own bytes is FERRY_EFORMAT; a missing file or files
 * that disagree with each other are FERRY_EDATASET. Every message names the
 * file.
 */

typedef struct npy_file {
    void *map; /* the whole file, or NULL */
    size_t map_len;
    const uint8_t *data; /* the first item, inside map */
    size_t row_bytes;    /* one item */
    uint64_t items;      /* shape[0] */
} npy_file;

typedef struct npy {
    int nfiles;
    npy_file files[FERRY_MAX_FIELDS];
} npy;

/* The element types we accept, by numpy's two-letter code. */
static const struct npy_type {
    char code[3];
    ferry_dtype dtype;
} npy_types[] = {
    {"u1", FERRY_DTYPE_U8},  {"i1", FERRY_DTYPE_I8},  {"b1", FERRY_DTYPE_BOOL},
    {"u2", FERRY_DTYPE_U16}, {"i2", FERRY_DTYPE_I16}, {"u4", FERRY_DTYPE_U32},
    {"i4", FERRY_DTYPE_I32}, {"u8", FERRY_DTYPE_U64}, {"i8", FERRY_DTYPE_I64},
    {"f2", FERRY_DTYPE_F16}, {"f4", FERRY_DTYPE_F32}, {"f8", FERRY_DTYPE_F64},
};

/* A cursor over the header's dict literal. */
typedef struct scan {
    const char *p, *end;
} scan;

static void scan_ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* Consumes `c` after optional whitespace; returns whether it was there. */
static int scan_char(scan *s, char c)
{
    scan_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* Consumes the bare word `w` (True, False) if it is next. */
static int scan_word(scan *s, const char *w)
{
    size_t n = strlen(w);
    scan_ws(s);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
        return 0;
    if ((size_t)(s->end - s->p) > n && (isalnum((unsigned char)s->p[n]) || s->p[n] == '_'))
        return 0;
    s->p += n;
    return 1;
}

/* A quoted Python string without escapes (numpy writes none in these
 * fields; one with a backslash is refused rather than half-understood). */
static int scan_string(scan *s, const char **str, size_t *len)
{
    char quote;
    scan_ws(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return 0;
    quote = *s->p++;
    *str = s->p;
    while (s->p < s->end && *s->p != quote) {
        if (*s->p == '\\')
            return 0;
        s->p++;
    }
    if (s->p >= s->end)
        return 0;
    *len = (size_t)(s->p - *str);
    s->p++;
    return 1;
}

/* A tuple of non-negative ints: "(5,)", "(5, 3)", "( 5 ,3, )", Python 2's
 * "(5L, 3L)". Stores at most FERRY_MAX_DIMS of them but counts them all in
 * *ndim, so the caller can say how many there were. */
static int scan_shape(scan *s, int64_t shape[FERRY_MAX_DIMS], int *ndim)
{
    *ndim = 0;
    if (!scan_char(s, '('))
        return 0;
    for (;;) {
        const char *digits;
        uint64_t v;
        if (scan_char(s, ')'))
            return 1;
        scan_ws(s);
        digits = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
        if (parse_u64(digits, (size_t)(s->p - digits), 0, INT64_MAX, &v) != 0)
            return 0;
        if (s->p < s->end && *s->p == 'L')
            s->p++;
        if (*ndim < FERRY_MAX_DIMS)
            shape[*ndim] = (int64_t)v;
        (*ndim)++;
        if (!scan_char(s, ','))
            return scan_char(s, ')');
    }
}

/* The 'descr' value: a byte-order char and a two-letter code. Byte order is
 * meaningless for 1-byte types; wider ones must be little-endian ('<', or
 * '=' which is native here). */
static int npy_descr(scan *s, const char *path, ferry_field_spec *f, char *errbuf, size_t errlen)
{
    const struct npy_type *type = NULL;
    const char *d;
    size_t len;

    scan_ws(s);
    if (s->p < s->end && *s->p == '[')
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: structured dtypes are not supported", path);
    if (!scan_string(s, &d, &len))
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: malformed header ('descr' is not a string)", path);
    for (size_t t = 0; len == 3 && t < ARRAY_LEN(npy_types); t++) {
        if (memchr("<=|>", d[0], 4) != NULL && memcmp(d + 1, npy_types[t].code, 2) == 0)
            type = &npy_types[t];
    }
    if (type != NULL && ferry_dtype_size(type->dtype) > 1 && d[0] == '>')
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: big-endian dtype '%.*s' is not supported", path, (int)len, d);
    if (type == NULL || (ferry_dtype_size(type->dtype) > 1 && d[0] == '|'))
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: unsupported dtype '%.*s' (expected a little-endian bool, int, "
                       "uint or float)",
                       path, (int)len, d);
    f->dtype = type->dtype;
    return FERRY_OK;
}

enum { NPY_DESCR = 1, NPY_FORTRAN = 2, NPY_SHAPE = 4, NPY_ALL = 7 };

/* Parses the header dict in [hdr, hdr + len) into f's dtype and the full
 * shape (shape[0] = items). */
static int npy_dict(const char *hdr, size_t len, const char *path, ferry_field_spec *f,
                    int64_t shape[FERRY_MAX_DIMS], int *ndim, char *errbuf, size_t errlen)
{
    scan s = {hdr, hdr + len};
    unsigned seen = 0;
    int rc;

    if (!scan_char(&s, '{'))
        return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s: malformed header (no dict)", path);
    while (!scan_char(&s, '}')) {
        const char *key;
        size_t klen;
        unsigned bit;
        if (!scan_string(&s, &key, &klen) || !scan_char(&s, ':'))
            return set_msg(errbuf, errlen, FERRY_EFORMAT,
                           "npy: %s: malformed header (expected 'key': value)", path);
        if (klen == 5 && memcmp(key, "descr", 5) == 0) {
            bit = NPY_DESCR;
            rc = npy_descr(&s, path, f, errbuf, errlen);
            if (rc != FERRY_OK)
                return rc;
        } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
            bit = NPY_FORTRAN;
            if (scan_word(&s, "True"))
                return set_msg(errbuf, errlen, FERRY_EFORMAT,
                               "npy: %s: fortran_order is True (only C order is supported)", path);
            if (!scan_word(&s, "False"))
                return set_msg(errbuf, errlen, FERRY_EFORMAT,
                               "npy: %s: malformed header (fortran_order is not True or False)",
                               path);
        } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
            bit = NPY_SHAPE;
            if (!scan_shape(&s, shape, ndim))
                return set_msg(errbuf, errlen, FERRY_EFORMAT,
                               "npy: %s: malformed shape (expected a tuple of integers)", path);
        } else {
            return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s: unexpected header key '%.*s'",
                           path, (int)klen, key);
        }
        if (seen & bit)
            return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s: header key '%.*s' given twice",
                           path, (int)klen, key);
        seen |= bit;
        if (!scan_char(&s, ',')) {
            if (!scan_char(&s, '}'))
                return set_msg(errbuf, errlen, FERRY_EFORMAT,
                               "npy: %s: malformed header (expected ',' or '}')", path);
            break;
        }
    }
    scan_ws(&s);
    if (s.p != s.end)
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: malformed header (text after the dict)", path);
    if (seen != NPY_ALL)
        return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s: header lacks '%s'", path,
                       !(seen & NPY_DESCR)   ? "descr"
                       : !(seen & NPY_SHAPE) ? "shape"
                                             : "fortran_order");
    if (*ndim < 1 || *ndim > FERRY_MAX_DIMS)
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: shape has %d dims (expected 1..%d; the first counts the items)",
                       path, *ndim, FERRY_MAX_DIMS);
    return FERRY_OK;
}

/* Checks the preamble and header of the `size`-byte file at `map`, and that
 * the data that follows is exactly as long as the shape says. Fills f (dtype,
 * item shape) and file's data, row_bytes and items. */
static int npy_parse(npy_file *file, const uint8_t *map, size_t size, const char *path,
                     ferry_field_spec *f, char *errbuf, size_t errlen)
{
    int64_t shape[FERRY_MAX_DIMS];
    size_t hdr_at, hdr_len, data_bytes, expected;
    int ndim = 0, rc;

    if (size < 10 || memcmp(map, "\x93NUMPY", 6) != 0)
        return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s is not a .npy file (bad magic)",
                       path);
    if (map[6] == 1 && map[7] == 0) {
        hdr_at = 10;
        hdr_len = (size_t)map[8] | (size_t)map[9] << 8;
    } else if ((map[6] == 2 || map[6] == 3) && map[7] == 0 && size >= 12) {
        hdr_at = 12;
        hdr_len =
            (size_t)map[8] | (size_t)map[9] << 8 | (size_t)map[10] << 16 | (size_t)map[11] << 24;
    } else {
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: unsupported format version %u.%u (expected 1.0, 2.0 or 3.0)", path,
                       map[6], map[7]);
    }
    if (hdr_len > size - hdr_at)
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: header length %zu runs past the end of the file (%zu bytes)", path,
                       hdr_len, size);

    rc = npy_dict((const char *)map + hdr_at, hdr_len, path, f, shape, &ndim, errbuf, errlen);
    if (rc != FERRY_OK)
        return rc;
    if (shape_bytes(ferry_dtype_size(f->dtype), shape, ndim, &data_bytes) != 0 ||
        __builtin_add_overflow(hdr_at + hdr_len, data_bytes, &expected))
        return set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s: shape is too large", path);
    if (size != expected)
        return set_msg(errbuf, errlen, FERRY_EFORMAT,
                       "npy: %s: %s: file has %zu bytes, expected %zu (%zu header + %zu data)",
                       path, size < expected ? "truncated" : "trailing bytes after the data", size,
                       expected, hdr_at + hdr_len, data_bytes);

    f->ndim = ndim - 1;
    memcpy(f->shape, shape + 1, sizeof shape[0] * (size_t)f->ndim);
    file->data = map + hdr_at + hdr_len;
    file->items = (uint64_t)shape[0];
    /* Cannot overflow: it divides data_bytes, or shape[0] is 0. */
    shape_bytes(ferry_dtype_size(f->dtype), shape + 1, f->ndim, &file->row_bytes);
    return FERRY_OK;
}

/* Opens and maps `path`, then parses it into file and f. On failure nothing
 * stays open or mapped. */
static int npy_map(npy_file *file, const char *path, ferry_field_spec *f, char *errbuf,
                   size_t errlen)
{
    struct stat st;
    void *map = MAP_FAILED;
    int fd, rc;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return set_msg(errbuf, errlen, FERRY_EDATASET, "npy: cannot open %s: %s", path,
                       strerror(errno));
    if (fstat(fd, &st) != 0) {
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "npy: cannot stat %s: %s", path,
                     strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "npy: %s is not a regular file", path);
        goto fail;
    }
    if (st.st_size == 0) {
        rc = set_msg(errbuf, errlen, FERRY_EFORMAT, "npy: %s is empty", path);
        goto fail;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "npy: cannot map %s: %s", path,
                     strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    rc = npy_parse(file, map, (size_t)st.st_size, path, f, errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;
    file->map = map;
    file->map_len = (size_t)st.st_size;
    return FERRY_OK;

fail:
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Splits one list element into the path (NUL-terminated, in path[PATH_MAX])
 * and the field name. */
static int npy_name_path(const char *tok, size_t len, char *path, char name[FERRY_NAME_MAX],
                         char *errbuf, size_t errlen)
{
    const char *eq = memchr(tok, '=', len), *base, *p = tok;
    size_t plen = len, nlen;

    if (eq != NULL && eq > tok && memchr(tok, '/', (size_t)(eq - tok)) == NULL) {
        p = eq + 1;
        plen = len - (size_t)(p - tok);
    } else {
        eq = NULL;
    }
    if (plen == 0)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "npy: empty path in file list (expected npy:PATH[,PATH...])");
    if (plen >= PATH_MAX)
        return set_msg(errbuf, errlen, FERRY_EDATASET, "npy: path '%.*s...' is too long", 64, p);
    memcpy(path, p, plen);
    path[plen] = '\0';

    if (eq != NULL) {
        base = tok;
        nlen = (size_t)(eq - tok);
    } else {
        base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        nlen = strlen(base);
        if (nlen > 4 && strcmp(base + nlen - 4, ".npy") == 0)
            nlen -= 4;
    }
    if (nlen == 0 || nlen >= FERRY_NAME_MAX)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "npy: %s: field name '%.*s' must be 1..%d bytes (use NAME=PATH)", path,
                       (int)nlen, base, FERRY_NAME_MAX - 1);
    memcpy(name, base, nlen);
    name[nlen] = '\0';
    return FERRY_OK;
}

static void npy_close(void *handle)
{
    npy *h = handle;
    if (h == NULL)
        return;
    for (int f = 0; f < h->nfiles; f++)
        munmap(h->files[f].map, h->files[f].map_len);
    free(h);
}

static int npy_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                    ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    char path[PATH_MAX], first[PATH_MAX];
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    npy *h;
    int rc;

    if (cur == NULL)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "npy: no files given (expected npy:PATH[,PATH...])");
    h = calloc(1, sizeof *h);
    if (h == NULL)
        return set_msg(errbuf, errlen, FERRY_ENOMEM, "npy: out of memory");
    while (next_token(&cur, &tok, &len)) {
        ferry_field_spec *f;
        npy_file *file;
        if (h->nfiles == FERRY_MAX_FIELDS) {
            rc = set_msg(errbuf, errlen, FERRY_EDATASET, "npy: more than %d files",
                         FERRY_MAX_FIELDS);
            goto fail;
        }
        f = &schema->fields[h->nfiles];
        file = &h->files[h->nfiles];
        rc = npy_name_path(tok, len, path, f->name, errbuf, errlen);
        if (rc != FERRY_OK)
            goto fail;
        rc = npy_map(file, path, f, errbuf, errlen);
        if (rc != FERRY_OK)
            goto fail;
        h->nfiles++;
        if (file->items == 0) {
            rc = set_msg(errbuf, errlen, FERRY_EDATASET, "npy: %s has no items (shape[0] is 0)",
                         path);
            goto fail;
        }
        if (h->nfiles == 1) {
            memcpy(first, path, strlen(path) + 1);
        } else if (file->items != h->files[0].items) {
            rc = set_msg(errbuf, errlen, FERRY_EDATASET,
                         "npy: %s has %" PRIu64 " items but %s has %" PRIu64
                         " (every file needs the same first dimension)",
                         path, file->items, first, h->files[0].items);
            goto fail;
        }
    }
    schema->nfields = h->nfiles;
    *handle = h;
    return FERRY_OK;

fail:
    npy_close(h);
    return rc;
}

static uint64_t npy_length(void *handle)
{
    return ((const npy *)handle)->files[0].items;
}

static int npy_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                         ferry_dataset_error *err)
{
    const npy *h = handle;
    for (int f = 0; f < h->nfiles; f++) {
        const npy_file *file = &h->files[f];
        uint8_t *out = dst[f];
        for (size_t k = 0; k < req->count; k++)
            memcpy(out + k * file->row_bytes, file->data + req->indices[k] * file->row_bytes,
                   file->row_bytes);
    }
    return FERRY_OK;
}

static const ferry_dataset_ops npy_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "npy",
    .open = npy_open,
    .length = npy_length,
    .get_batch = npy_get_batch,
    .close = npy_close,
};

/* --- plugin --- */

/* Loads the shared object named by `spec_args` (PATH[?ARGS]) and checks its
 * ops table. On success d->ops and d->dl are set, *path is the allocated
 * path (for messages) and *args points at ARGS. On failure nothing stays
 * loaded. */
static int plugin_load(ferry__dataset *d, const char *spec_args, char **path, const char **args,
                       char *errbuf, size_t errlen)
{
    const char *q = strchr(spec_args, '?');
    const ferry_dataset_ops *ops;
    ferry_dataset_plugin_fn entry;
    void *dl = NULL, *sym;
    int rc;

    *path = strndup(spec_args, q ? (size_t)(q - spec_args) : strlen(spec_args));
    if (*path == NULL)
        return set_msg(errbuf, errlen, FERRY_ENOMEM, "plugin: out of memory");
    *args = q ? q + 1 : "";
    if ((*path)[0] == '\0')
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "plugin: no path given (expected plugin:PATH[?ARGS])");

    dl = dlopen(*path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
        return set_msg(errbuf, errlen, FERRY_EDATASET, "plugin: cannot load %s: %s", *path,
                       dlerror());
    dlerror();
    sym = dlsym(dl, FERRY_DATASET_PLUGIN_SYMBOL);
    if (sym == NULL) {
        const char *why = dlerror();
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "plugin %s does not export %s(): %s", *path,
                     FERRY_DATASET_PLUGIN_SYMBOL, why ? why : "symbol is NULL");
        goto fail;
    }
    entry = (ferry_dataset_plugin_fn)sym;
    ops = entry();
    if (ops == NULL) {
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "plugin %s: %s() returned no ops table", *path,
                     FERRY_DATASET_PLUGIN_SYMBOL);
        goto fail;
    }
    if (ops->abi_version != FERRY_DATASET_ABI) {
        rc = set_msg(errbuf, errlen, FERRY_EVERSION,
                     "plugin %s has ABI version %" PRIu32 ", this ferry supports %d", *path,
                     ops->abi_version, FERRY_DATASET_ABI);
        goto fail;
    }
    if (!ops->open || !ops->length || !ops->get_batch || !ops->close) {
        rc = set_msg(errbuf, errlen, FERRY_EDATASET, "plugin %s: ops table lacks %s()", *path,
                     !ops->open        ? "open"
                     : !ops->length    ? "length"
                     : !ops->get_batch ? "get_batch"
                                       : "close");
        goto fail;
    }
    d->ops = ops;
    d->dl = dl;
    return FERRY_OK;

fail:
    dlclose(dl);
    return rc;
}

/* --- Opening, validating, building batches --- */

/* The kinds a spec may name. NULL ops: the table comes from a plugin. */
static const struct dataset_kind {
    const char *name;
    const ferry_dataset_ops *ops;
} dataset_kinds[] = {
    {"synthetic", &synthetic_ops},
    {"npy", &npy_ops},
    {"plugin", NULL},
};

static const char *ops_name(const ferry_dataset_ops *ops)
{
    return ops->name ? ops->name : "plugin";
}

/* A dataset's failure code as ferry passes it on: its own when it is one of
 * ferry's codes, `fallback` otherwise, so that a plugin returning 1 or -999
 * can neither look like success nor confuse the caller. */
static int known_failure(int rc, int fallback)
{
    if (rc < 0 && strcmp(ferry_err_name(rc), "FERRY_UNKNOWN") != 0)
        return rc;
    return fallback;
}

/* Finds the kind in "KIND:ARGS" (or a bare "KIND") and sets d->ops (loading
 * a plugin if asked) and *args. */
static int resolve_kind(ferry__dataset *d, const char *spec, const char **args, char **plugin_path,
                        char *errbuf, size_t errlen)
{
    const char *colon = strchr(spec, ':');
    size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);

    *args = colon ? colon + 1 : spec + klen;
    for (size_t k = 0; k < ARRAY_LEN(dataset_kinds); k++) {
        if (strlen(dataset_kinds[k].name) != klen || memcmp(dataset_kinds[k].name, spec, klen) != 0)
            continue;
        if (dataset_kinds[k].ops == NULL)
            return plugin_load(d, *args, plugin_path, args, errbuf, errlen);
        d->ops = dataset_kinds[k].ops;
        return FERRY_OK;
    }
    return set_msg(errbuf, errlen, FERRY_EDATASET,
                   "unknown dataset kind '%.*s' (expected synthetic, npy or plugin)", (int)klen,
                   spec);
}

/* Checks the schema and length a dataset reported and computes item_bytes,
 * so nothing downstream has to trust a plugin's arithmetic. */
static int validate_schema(ferry__dataset *d, char *errbuf, size_t errlen)
{
    const ferry_dataset_schema *sc = &d->schema;
    const char *who = ops_name(d->ops);

    if (sc->nfields < 1 || sc->nfields > FERRY_MAX_FIELDS)
        return set_msg(errbuf, errlen, FERRY_EDATASET,
                       "dataset %s reports %d fields (expected 1..%d)", who, sc->nfields,
                       FERRY_MAX_FIELDS);
    if (d->length == 0)
        return set_msg(errbuf, errlen, FERRY_EDATASET, "dataset %s has no items", who);
    for (int f = 0; f < sc->nfields; f++) {
        const ferry_field_spec *fs = &sc->fields[f];
        size_t elsize = ferry_dtype_size(fs->dtype), bytes;

        if (memchr(fs->name, '\0', sizeof fs->name) == NULL)
            return set_msg(errbuf, errlen, FERRY_EDATASET,
                           "dataset %s: the name of field %d is not NUL-terminated", who, f);
        if (fs->name[0] == '\0')
            return set_msg(errbuf, errlen, FERRY_EDATASET, "dataset %s: field %d has an empty name",
                           who, f);
        for (int g = 0; g < f; g++) {
            if (strcmp(sc->fields[g].name, fs->name) == 0)
                return set_msg(errbuf, errlen, FERRY_EDATASET,
                               "dataset %s: field name '%s' appears twice", who, fs->name);
        }
        if (elsize == 0)
            return set_msg(errbuf, errlen, FERRY_EDATASET,
                           "dataset %s: field '%s' has unknown dtype %d", who, fs->name,
                           (int)fs->dtype);
        if (fs->ndim < 0 || fs->ndim > FERRY_MAX_DIMS - 1)
            return set_msg(errbuf, errlen, FERRY_EDATASET,
                           "dataset %s: field '%s' has %d dims per item (expected 0..%d)", who,
                           fs->name, fs->ndim, FERRY_MAX_DIMS - 1);
        for (int k = 0; k < fs->ndim; k++) {
            if (fs->shape[k] < 1)
                return set_msg(errbuf, errlen, FERRY_EDATASET,
                               "dataset %s: field '%s' has dim %d of size %" PRId64
                               " (expected >= 1)",
                               who, fs->name, k, fs->shape[k]);
        }
        if (shape_bytes(elsize, fs->shape, fs->ndim, &bytes) != 0 || bytes > FERRY__ITEM_BYTES_MAX)
            return set_msg(errbuf, errlen, FERRY_EDATASET,
                           "dataset %s: one item of field '%s' is larger than 1 GiB", who,
                           fs->name);
        d->item_bytes[f] = bytes;
    }
    return FERRY_OK;
}

int ferry__dataset_open(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                        char *errbuf, size_t errlen)
{
    return ferry__dataset_open_flags(ds, spec, ctx, 0, errbuf, errlen);
}

int ferry__dataset_open_flags(ferry__dataset *ds, const char *spec, const ferry_dataset_ctx *ctx,
                              int flags, char *errbuf, size_t errlen)
{
    static const ferry_dataset_ctx no_ctx;
    /* Everything is written here first and copied to errbuf once, so the
     * dataset's own message can be prefixed and is surely NUL-terminated. */
    char msg[FERRY__ERRMSG_MAX] = "";
    char *plugin_path = NULL;
    const char *args;
    ferry__dataset d;
    int opened = 0, rc;

    memset(&d, 0, sizeof d);
    d.keep_loaded = (flags & FERRY__DATASET_KEEP_LOADED) != 0;
    if (ds != NULL)
        memset(ds, 0, sizeof *ds);
    if (ds == NULL || spec == NULL) {
        rc = set_msg(msg, sizeof msg, FERRY_EINVAL, "no dataset spec given");
        goto fail;
    }
    rc = resolve_kind(&d, spec, &args, &plugin_path, msg, sizeof msg);
    if (rc != FERRY_OK)
        goto fail;

    rc = d.ops->open(&d.handle, args, ctx ? ctx : &no_ctx, &d.schema, msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    if (rc != FERRY_OK) {
        rc = known_failure(rc, FERRY_EDATASET);
        if (d.dl != NULL) {
            char inner[sizeof msg];
            memcpy(inner, msg, sizeof msg);
            set_msg(msg, sizeof msg, rc, "plugin %s: %s", plugin_path,
                    inner[0] ? inner : "open failed without a message");
        }
        goto fail;
    }
    opened = 1;
    d.length = d.ops->length(d.handle);
    rc = validate_schema(&d, msg, sizeof msg);
    if (rc != FERRY_OK)
        goto fail;

    free(plugin_path);
    *ds = d;
    return FERRY_OK;

fail:
    if (opened)
        d.ops->close(d.handle);
    if (d.dl != NULL && !d.keep_loaded)
        dlclose(d.dl);
    free(plugin_path);
    if (errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen, "%s", msg);
    return ferry__seterr_str(rc, msg);
}

int ferry__dataset_get_batch(ferry__dataset *ds, const ferry_batch_request *req, void *const dst[],
                             ferry_dataset_error *err)
{
    int rc;

    err->index = 0;
    err->message[0] = '\0';
    if (ds->ops == NULL) {
        snprintf(err->message, sizeof err->message, "dataset is not open");
        return ferry__seterr(FERRY_EINVAL, "dataset is not open");
    }
    /* Checked here, once, so no dataset ever reads out of bounds. */
    for (size_t k = 0; k < req->count; k++) {
        if (req->indices[k] >= ds->length) {
            err->index = req->indices[k];
            snprintf(err->message, sizeof err->message,
                     "index %" PRIu64 " out of range (dataset has %" PRIu64 " items)",
                     req->indices[k], ds->length);
            return ferry__seterr_str(FERRY_ERANGE, err->message);
        }
    }
    rc = ds->ops->get_batch(ds->handle, req, dst, err);
    if (rc == FERRY_OK)
        return FERRY_OK;
    err->message[sizeof err->message - 1] = '\0';
    if (err->message[0] == '\0')
        snprintf(err->message, sizeof err->message, "dataset %s failed (code %d) without a message",
                 ops_name(ds->ops), rc);
    return ferry__seterr_str(known_failure(rc, FERRY_EBATCH), err->message);
}

void ferry__dataset_close(ferry__dataset *ds)
{
    if (ds == NULL)
        return;
    if (ds->ops != NULL)
        ds->ops->close(ds->handle);
    if (ds->dl != NULL && !ds->keep_loaded)
        dlclose(ds->dl);
    memset(ds, 0, sizeof *ds);
}
