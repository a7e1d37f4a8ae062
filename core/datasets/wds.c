/*
 * wds.c - the built-in dataset over WebDataset tar shards, decoded and
 * cropped in C like imagefolder (imagekind.c, image.c).
 *
 * Spec: wds:shards=PATTERN[;PATTERN...][,KEY=VALUE...], the image keys of
 * imagefolder (size, crop, scale, ratio, resize, flip, layout, dtype, mean,
 * std, on_error, box, dct). A pattern is a path with any number of
 * {A..B} ranges, expanded in order, zero-padded to A's width as
 * WebDataset's brace patterns are ("train-{000000..000146}.tar"); lists
 * of alternatives ({a,b}) cannot be written in a comma-separated spec: use
 * ';' between patterns instead.
 *
 * A shard is a tar file (ustar, GNU long names, pax path records). Its
 * members are grouped into samples as WebDataset groups them: consecutive
 * members whose names agree up to the first '.' of the file name form one
 * sample, and the rest of the name is the member's extension. A sample's
 * image is its first member with extension jpg, jpeg, png or webp (any
 * case), its label the decimal integer in its cls, class, label or target
 * member (-1 when it has none). Item i is the i-th sample across the
 * shards in the order given.
 *
 * order=shards (with the loader's shuffle off) reads the shards in a
 * different order each epoch, each front to back, with the positions
 * shuffled within windows of window=W (default 1024) consecutive samples:
 * near-sequential reads, every sample once an epoch, exact on resume (see
 * sample_at). order=index (the default) is item i = sample i.
 *
 * Reading: open lists every shard once, reading each front to back (its
 * headers, seeking over the members, and the small label members), so it
 * suits network file systems; each item is then one pread of its image at
 * its offset. With shuffle, those reads land anywhere (as the files of a
 * folder do); without, each worker reads runs of consecutive samples of
 * one shard. A few shards are kept open at once (WDS_OPEN_FDS), so any
 * number of shards fits the fd limit. A sample is 32 bytes plus its key.
 *
 * Threads: a handle is one worker's; nothing is global.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imagekind.h"

#define WDS_MAX_SHARDS (1u << 20)
#define WDS_OPEN_FDS 8
#define WDS_MAX_MEMBER (1ull << 31)
#define WDS_NAME_MAX 4096

typedef struct wds_sample {
    uint64_t off;   /* the image member's data, in its shard */
    uint32_t len;   /* its bytes */
    uint32_t shard; /* index into paths */
    uint32_t key;   /* offset of the sample's key in the pool */
    int64_t label;
} wds_sample;

typedef struct wds {
    ferry__image_kind k;
    char **paths; /* the shards, expanded */
    uint32_t nshards;
    size_t shards_cap;
    wds_sample *s;
    size_t n, cap;
    char *pool; /* sample keys */
    size_t pool_len, pool_cap;
    int fd[WDS_OPEN_FDS];
    uint32_t fd_shard[WDS_OPEN_FDS];
    unsigned fd_next;
    uint8_t *buf; /* the image being decoded */
    size_t buf_cap;
    /* order=shards: each epoch's order (see sample_at) */
    int order_shards;
    uint32_t window;
    uint64_t *first;       /* [nshards + 1]: each shard's first sample */
    uint32_t *shard_perm;  /* this epoch's shards, in order */
    uint64_t *starts;      /* [nshards + 1]: their first positions */
    uint32_t *block_perm;  /* the current window's positions */
    uint64_t at_seed, at_epoch, at_block;
    int have_epoch, have_block;
    uint64_t *mapped; /* a request's samples */
    size_t mapped_cap;
    int have_shards; /* shards= was given */
} wds;

static const char *const image_exts[] = {"jpg", "jpeg", "png", "webp"};
static const char *const label_exts[] = {"cls", "class", "label", "target"};

/* --- Shard patterns --- */

static int add_shard(wds *h, const char *path, char *errbuf, size_t errlen)
{
    if (h->nshards >= WDS_MAX_SHARDS)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "wds: more than %u shards", WDS_MAX_SHARDS);
    if (ferry__grow(&h->paths, &h->shards_cap, (size_t)h->nshards + 1, sizeof *h->paths))
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    if ((h->paths[h->nshards] = strdup(path)) == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    h->nshards++;
    return FERRY_OK;
}

/* Expands the first {A..B} of `pat` (NUL-terminated) and recurses on each
 * result; a pattern without one is a shard. */
static int expand(wds *h, const char *pat, char *errbuf, size_t errlen)
{
    const char *open = strchr(pat, '{'), *dots, *close;
    if (open == NULL)
        return add_shard(h, pat, errbuf, errlen);
    close = strchr(open, '}');
    dots = close ? strstr(open, "..") : NULL;
    uint64_t a, b;
    if (!dots || dots > close ||
        ferry__parse_u64(open + 1, (size_t)(dots - open - 1), 0, UINT32_MAX, &a) ||
        ferry__parse_u64(dots + 2, (size_t)(close - dots - 2), 0, UINT32_MAX, &b) || a > b)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "wds: '%s': a brace must be {A..B} with integers A <= B "
                                  "(separate alternatives with ';')",
                                  pat);
    int width = (int)(dots - open - 1);
    if (b - a >= WDS_MAX_SHARDS)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "wds: '%s' names more than %u shards", pat, WDS_MAX_SHARDS);
    size_t cap = strlen(pat) + 32;
    char *out = malloc(cap);
    if (out == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    int rc = FERRY_OK;
    for (uint64_t v = a; v <= b && rc == FERRY_OK; v++) {
        snprintf(out, cap, "%.*s%0*" PRIu64 "%s", (int)(open - pat), pat, width, v, close + 1);
        rc = expand(h, out, errbuf, errlen);
    }
    free(out);
    return rc;
}

/* --- Reading a shard's members --- */

/* An octal (or GNU base-256) number field of a tar header; -1 if bad. */
static int64_t tar_number(const uint8_t *f, size_t len)
{
    uint64_t v = 0;
    if (f[0] & 0x80) { /* base-256, big-endian, the top bit a flag */
        if (f[0] != 0x80)
            return -1; /* negative, or too big */
        for (size_t i = 1; i < len; i++) {
            if (v >> 55)
                return -1;
            v = v << 8 | f[i];
        }
        return (int64_t)v;
    }
    size_t i = 0;
    while (i < len && f[i] == ' ')
        i++;
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v >> 60)
            return -1;
        v = v << 3 | (uint64_t)(f[i] - '0');
    }
    for (; i < len; i++) {
        if (f[i] != ' ' && f[i] != '\0')
            return -1;
    }
    return (int64_t)v;
}

/* Whether the header's checksum (its bytes summed, the checksum field as
 * spaces) matches. */
static int tar_checksum_ok(const uint8_t h[512])
{
    int64_t want = tar_number(h + 148, 8);
    uint64_t sum = 0;
    for (int i = 0; i < 512; i++)
        sum += (i >= 148 && i < 156) ? ' ' : h[i];
    return want >= 0 && (uint64_t)want == sum;
}

/* The label in a member's text: a decimal integer, spaces around. */
static int parse_label(const char *t, size_t len, int64_t *out)
{
    while (len && (t[len - 1] == '\n' || t[len - 1] == ' ' || t[len - 1] == '\r'))
        len--;
    while (len && *t == ' ')
        t++, len--;
    int neg = len && *t == '-';
    uint64_t v;
    if (ferry__parse_u64(t + neg, len - (size_t)neg, 0, INT64_MAX, &v))
        return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int ext_in(const char *ext, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(ext, list[i]) == 0)
            return 1;
    }
    return 0;
}

/* The sample being gathered from consecutive members. */
typedef struct gathering {
    char key[WDS_NAME_MAX];
    int open, has_image;
    wds_sample s;
} gathering;

static int finish_sample(wds *h, gathering *g, uint32_t shard, char *errbuf, size_t errlen)
{
    if (!g->open)
        return FERRY_OK;
    g->open = 0;
    if (!g->has_image)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "wds: %s: sample '%s' has no image (.jpg, .jpeg, .png, .webp)",
                                  h->paths[shard], g->key);
    size_t klen = strlen(g->key);
    if (h->pool_len + klen + 1 > UINT32_MAX ||
        ferry__grow(&h->pool, &h->pool_cap, h->pool_len + klen + 1, 1) ||
        ferry__grow(&h->s, &h->cap, h->n + 1, sizeof *h->s))
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    memcpy(h->pool + h->pool_len, g->key, klen + 1);
    g->s.key = (uint32_t)h->pool_len;
    h->pool_len += klen + 1;
    h->s[h->n++] = g->s;
    return FERRY_OK;
}

/* Adds the samples of shard `si`, reading it front to back. */
static int index_shard(wds *h, uint32_t si, char *errbuf, size_t errlen)
{
    const char *path = h->paths[si];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "wds: %s: %s", path,
                                  strerror(errno));
    uint8_t hd[512];
    char name[WDS_NAME_MAX], longname[WDS_NAME_MAX] = "";
    gathering *g = calloc(1, sizeof *g);
    struct stat st;
    uint64_t off = 0, end;
    int rc = FERRY_OK;
    if (g == NULL || fstat(fd, &st) != 0) {
        rc = g ? ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "wds: %s: %s", path,
                                    strerror(errno))
               : ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
        free(g);
        close(fd);
        return rc;
    }
    end = (uint64_t)st.st_size;
#define BAD(...) (rc = ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT, __VA_ARGS__))
    for (;;) {
        if (off == end)
            break; /* no end-of-archive blocks: accepted, as tar accepts it */
        int r = off + 512 > end ? -2 : ferry__pread_full(fd, hd, 512, off);
        if (r != 0) {
            if (r == -1)
                rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "wds: %s: %s", path,
                                        strerror(errno));
            else
                BAD("wds: %s: ends inside a tar header at byte %" PRIu64, path, off);
            break;
        }
        int zero = 1;
        for (int i = 0; i < 512 && zero; i++)
            zero = hd[i] == 0;
        if (zero)
            break; /* the end-of-archive blocks */
        if (!tar_checksum_ok(hd)) {
            BAD("wds: %s: not a tar file, or corrupt: bad header checksum at byte %" PRIu64, path,
                off);
            break;
        }
        int64_t size = tar_number(hd + 124, 12);
        if (size < 0 || (uint64_t)size > WDS_MAX_MEMBER) {
            BAD("wds: %s: member at byte %" PRIu64 " has a bad or too large size", path, off);
            break;
        }
        uint64_t data = off + 512, next = data + (((uint64_t)size + 511) & ~511ull);
        char type = (char)hd[156];
        if (data + (uint64_t)size > end) {
            BAD("wds: %s: truncated: the member at byte %" PRIu64 " ends past the file's end",
                path, off);
            break;
        }
        if (type == 'L' || type == 'x') { /* a long name for the next member */
            char text[WDS_NAME_MAX];
            size_t n = (size_t)size < sizeof text - 1 ? (size_t)size : sizeof text - 1;
            if (ferry__pread_full(fd, text, n, data) != 0) {
                BAD("wds: %s: ends inside the member at byte %" PRIu64, path, off);
                break;
            }
            text[n] = '\0';
            if (type == 'L') {
                snprintf(longname, sizeof longname, "%s", text);
            } else { /* pax records "LEN path=VALUE\n" */
                for (char *p = text; p && *p;) {
                    char *sp = strchr(p, ' '), *nl = sp ? strchr(sp, '\n') : NULL;
                    if (!nl)
                        break;
                    if (strncmp(sp + 1, "path=", 5) == 0)
                        snprintf(longname, sizeof longname, "%.*s", (int)(nl - sp - 6), sp + 6);
                    p = nl + 1;
                }
            }
            off = next;
            continue;
        }
        if (type != '0' && type != '\0') { /* directories, links, ...: not members */
            longname[0] = '\0';
            off = next;
            continue;
        }
        if (longname[0]) {
            snprintf(name, sizeof name, "%s", longname);
            longname[0] = '\0';
        } else if (hd[345] && memcmp(hd + 257, "ustar", 5) == 0) {
            snprintf(name, sizeof name, "%.155s/%.100s", (const char *)hd + 345,
                     (const char *)hd);
        } else {
            snprintf(name, sizeof name, "%.100s", (const char *)hd);
        }
        /* key: the name up to the first '.' of its last component */
        char *base = strrchr(name, '/'), *dot;
        base = base ? base + 1 : name;
        dot = strchr(base, '.');
        const char *ext = dot ? dot + 1 : "";
        if (dot)
            *dot = '\0';
        if (!g->open || strcmp(g->key, name) != 0) {
            rc = finish_sample(h, g, si, errbuf, errlen);
            if (rc != FERRY_OK)
                break;
            memset(g, 0, sizeof *g);
            g->open = 1;
            snprintf(g->key, sizeof g->key, "%s", name);
            g->s.shard = si;
            g->s.label = -1;
        }
        if (!g->has_image && ext_in(ext, image_exts, FERRY__ARRAY_LEN(image_exts))) {
            if ((uint64_t)size > UINT32_MAX) {
                BAD("wds: %s: image %s.%s is over 4 GiB", path, name, ext);
                break;
            }
            g->has_image = 1;
            g->s.off = data;
            g->s.len = (uint32_t)size;
        } else if (ext_in(ext, label_exts, FERRY__ARRAY_LEN(label_exts))) {
            char text[32];
            if (size >= (int64_t)sizeof text ||
                ferry__pread_full(fd, text, (size_t)size, data) != 0 ||
                parse_label(text, (size_t)size, &g->s.label) != 0) {
                BAD("wds: %s: the label %s.%s is not a decimal integer", path, name, ext);
                break;
            }
        }
        off = next;
    }
#undef BAD
    if (rc == FERRY_OK)
        rc = finish_sample(h, g, si, errbuf, errlen);
    free(g);
    close(fd);
    return rc;
}

/* --- Open, fetch --- */

static void wds_close(void *handle)
{
    wds *h = handle;
    if (h == NULL)
        return;
    ferry__image_kind_free(&h->k);
    for (int i = 0; i < WDS_OPEN_FDS; i++) {
        if (h->fd[i] >= 0)
            close(h->fd[i]);
    }
    for (uint32_t i = 0; i < h->nshards; i++)
        free(h->paths[i]);
    free(h->paths);
    free(h->s);
    free(h->pool);
    free(h->buf);
    free(h->first);
    free(h->shard_perm);
    free(h->starts);
    free(h->block_perm);
    free(h->mapped);
    free(h);
}

/* An open fd on shard `si`: kept from before, or opened in place of the
 * one opened longest ago. -1 with errno. */
static int shard_fd(wds *h, uint32_t si)
{
    for (int i = 0; i < WDS_OPEN_FDS; i++) {
        if (h->fd[i] >= 0 && h->fd_shard[i] == si)
            return h->fd[i];
    }
    unsigned slot = h->fd_next++ % WDS_OPEN_FDS;
    if (h->fd[slot] >= 0)
        close(h->fd[slot]);
    h->fd[slot] = open(h->paths[si], O_RDONLY | O_CLOEXEC);
    h->fd_shard[slot] = si;
    return h->fd[slot];
}

static int wds_fetch(void *src, uint64_t i, const uint8_t **data, size_t *len, int64_t *label,
                     char *name, size_t namecap, char *err, size_t errlen)
{
    wds *h = src;
    const wds_sample *s = &h->s[i];
    snprintf(name, namecap, "%s:%s", h->paths[s->shard], h->pool + s->key);
    *label = s->label;
    if (ferry__grow(&h->buf, &h->buf_cap, s->len ? s->len : 1, 1)) {
        snprintf(err, errlen, "out of memory for %u bytes", s->len);
        return -1;
    }
    int fd = shard_fd(h, s->shard);
    int r = fd < 0 ? -1 : ferry__pread_full(fd, h->buf, s->len, s->off);
    if (r != 0) {
        snprintf(err, errlen, "%s", r == -2 ? "the shard ends inside the image (it shrank?)"
                                            : strerror(errno));
        return -1;
    }
    *data = h->buf;
    *len = s->len;
    return 0;
}

/* The kind's own keys (see ferry__image_key_fn): shards, order, window. */
static int wds_key(void *kind, const char *key, size_t klen, const char *v, size_t vlen,
                   char *errbuf, size_t errlen)
{
    wds *h = kind;
    int rc = FERRY_OK;
    if (ferry__is_word(key, klen, "shards")) {
        char *list = strndup(v, vlen), *save = NULL;
        if (list == NULL)
            return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
        for (char *p = strtok_r(list, ";", &save); p && rc == FERRY_OK;
             p = strtok_r(NULL, ";", &save))
            rc = expand(h, p, errbuf, errlen);
        free(list);
        h->have_shards = 1;
        return rc;
    }
    if (ferry__is_word(key, klen, "order")) {
        if (!ferry__is_word(v, vlen, "shards") && !ferry__is_word(v, vlen, "index"))
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "wds: order=%.*s: expected index or shards", (int)vlen, v);
        h->order_shards = v[0] == 's';
        return FERRY_OK;
    }
    if (ferry__is_word(key, klen, "window")) {
        uint64_t w;
        if (ferry__parse_u64(v, vlen, 1, 1u << 20, &w))
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "wds: window=%.*s: expected an integer in 1..1048576",
                                      (int)vlen, v);
        h->window = (uint32_t)w;
        return FERRY_OK;
    }
    return 1;
}

static int wds_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                    ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    wds *h = calloc(1, sizeof *h);
    int rc;

    (void)ctx;
    if (h == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    for (int i = 0; i < WDS_OPEN_FDS; i++)
        h->fd[i] = -1;
    ferry__image_kind_init(&h->k, "wds");
    rc = ferry__image_kind_parse(&h->k, args, wds_key, h, "shards, order, window", errbuf,
                                 errlen);
    if (rc != FERRY_OK)
        goto fail;
    if (!h->have_shards || h->nshards == 0) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "wds: shards=PATTERN is required (wds:shards=/data/"
                                "train-{000000..000146}.tar,size=224)");
        goto fail;
    }
    if (h->window == 0)
        h->window = 1024;
    rc = ferry__image_kind_ready(&h->k, errbuf, errlen);
    h->first = calloc((size_t)h->nshards + 1, sizeof *h->first);
    if (rc == FERRY_OK && h->first == NULL)
        rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
    for (uint32_t si = 0; si < h->nshards && rc == FERRY_OK; si++) {
        h->first[si] = h->n;
        rc = index_shard(h, si, errbuf, errlen);
    }
    if (rc != FERRY_OK)
        goto fail;
    h->first[h->nshards] = h->n;
    if (h->order_shards) {
        h->shard_perm = malloc((size_t)h->nshards * sizeof *h->shard_perm);
        h->starts = malloc(((size_t)h->nshards + 1) * sizeof *h->starts);
        h->block_perm = malloc((size_t)h->window * sizeof *h->block_perm);
        if (!h->shard_perm || !h->starts || !h->block_perm) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "wds: out of memory");
            goto fail;
        }
    }
    if (h->n == 0) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "wds: the %u shard%s hold no samples", h->nshards,
                                h->nshards == 1 ? "" : "s");
        goto fail;
    }
    h->k.n = h->n;
    h->k.fetch = wds_fetch;
    h->k.src = h;
    ferry__image_kind_schema(&h->k, schema);
    *handle = h;
    return FERRY_OK;
fail:
    wds_close(h);
    return rc;
}

static uint64_t wds_length(void *handle)
{
    return ((const wds *)handle)->n;
}

/* --- order=shards --- */

/* A Fisher-Yates permutation of 0..n-1 drawn from `seed`. */
static void permute(uint32_t *p, uint32_t n, uint64_t seed)
{
    ferry__rng r = {seed};
    for (uint32_t i = 0; i < n; i++)
        p[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)ferry__rng_below(&r, i), t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
}

/* The sample at position `pos` of epoch `epoch` under order=shards: the
 * shards in an order drawn from (seed, epoch), each shard's samples in
 * their order, then the positions shuffled within windows of `window`
 * consecutive ones. A window spans one or two shards' consecutive
 * samples, so the reads of a batch stay within a few MB of a shard (near
 * sequential), and the order is a function of (seed, epoch) alone: every
 * sample once an epoch, the same whatever the workers, exact on resume. */
static uint64_t sample_at(wds *h, uint64_t seed, uint64_t epoch, uint64_t pos)
{
    if (!h->have_epoch || h->at_seed != seed || h->at_epoch != epoch) {
        permute(h->shard_perm, h->nshards, ferry_mix64(ferry_sample_seed(seed, epoch, 0) ^ 1));
        h->starts[0] = 0;
        for (uint32_t k = 0; k < h->nshards; k++) {
            uint32_t si = h->shard_perm[k];
            h->starts[k + 1] = h->starts[k] + (h->first[si + 1] - h->first[si]);
        }
        h->at_seed = seed, h->at_epoch = epoch, h->have_epoch = 1, h->have_block = 0;
    }
    uint64_t block = pos / h->window, base = block * h->window;
    uint32_t size = (uint32_t)(h->n - base < h->window ? h->n - base : h->window);
    if (!h->have_block || h->at_block != block) {
        permute(h->block_perm, size, ferry_mix64(ferry_sample_seed(seed, epoch, block) ^ 2));
        h->at_block = block, h->have_block = 1;
    }
    uint64_t p = base + h->block_perm[pos - base];
    /* the last shard (in this epoch's order) that starts at or before p */
    uint32_t lo = 0, hi = h->nshards;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (h->starts[mid] <= p)
            lo = mid;
        else
            hi = mid;
    }
    return h->first[h->shard_perm[lo]] + (p - h->starts[lo]);
}

static int wds_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                         ferry_dataset_error *err)
{
    wds *h = handle;
    if (!h->order_shards)
        return ferry__image_kind_batch(&h->k, req, dst, err);
    if (ferry__grow(&h->mapped, &h->mapped_cap, req->count ? req->count : 1, sizeof *h->mapped)) {
        err->index = req->count ? req->indices[0] : 0;
        snprintf(err->message, sizeof err->message, "wds: out of memory");
        return FERRY_ENOMEM;
    }
    for (size_t k = 0; k < req->count; k++)
        h->mapped[k] = sample_at(h, req->seed, req->epoch, req->indices[k]);
    ferry_batch_request r = *req;
    r.indices = h->mapped;
    int rc = ferry__image_kind_batch(&h->k, &r, dst, err);
    for (size_t k = 0; rc != FERRY_OK && k < req->count; k++) {
        if (h->mapped[k] == err->index) { /* the position it had in the request */
            err->index = req->indices[k];
            break;
        }
    }
    return rc;
}

static const ferry_dataset_ops wds_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "wds",
    .open = wds_open,
    .length = wds_length,
    .get_batch = wds_get_batch,
    .close = wds_close,
};

/* The kind's paths (see ferry__dataset_kind): each pattern of shards=. */
static int wds_paths(const char *args, ferry__span *path, int max)
{
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    int n = 0;
    while (ferry__next_comma_token(&cur, &tok, &len)) {
        if (len <= 7 || memcmp(tok, "shards=", 7) != 0)
            continue;
        for (size_t at = 7; at < len && n < max;) {
            const char *semi = memchr(tok + at, ';', len - at);
            size_t end = semi ? (size_t)(semi - tok) : len;
            path[n].off = (size_t)(tok + at - args);
            path[n].len = end - at;
            n++;
            at = end + 1;
        }
    }
    return n;
}

const ferry__dataset_kind ferry__wds_kind = {
    .name = "wds",
    .ops = &wds_ops,
    .open = ferry__dataset_open_builtin,
    .paths = wds_paths,
};
