/*
 * imagekind.c - the options, schema and batch loop the image kinds share
 * (see imagekind.h); the kinds themselves only list items and fetch their
 * bytes.
 */
#include "imagekind.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Draws to replace an item that does not decode (on_error=skip). */
#define SKIP_TRIES 16

/* Parses "A:B[:C...]" (exactly n numbers) into v. */
static int parse_doubles(const char *s, size_t len, double *v, int n)
{
    char buf[128], *end;
    if (len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    const char *p = buf;
    for (int i = 0; i < n; i++) {
        errno = 0;
        v[i] = strtod(p, &end);
        if (end == p || errno || !isfinite(v[i]))
            return -1;
        if (i < n - 1 && *end != ':')
            return -1;
        p = end + (i < n - 1);
    }
    return *end == '\0' ? 0 : -1;
}

int ferry__is_word(const char *tok, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(tok, word, len) == 0;
}

void ferry__image_kind_init(ferry__image_kind *k, const char *kind)
{
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->img = (ferry__image_opts){.size = 224, .random_crop = 1, .scale_lo = 0.08,
                                 .scale_hi = 1.0, .ratio_lo = 3.0 / 4.0, .ratio_hi = 4.0 / 3.0,
                                 .dct_scale = 1, .max_pixels = FERRY__IMAGE_MAX_PIXELS};
    k->std[0] = k->std[1] = k->std[2] = 1;
}

/* One KEY=VALUE of the common keys (size, crop, scale, ratio, resize,
 * flip, layout, dtype, mean, std, on_error, box, dct): FERRY_OK, a
 * FERRY_EDATASET with a message, or 1 when the key is not one of them. */
static int kind_option(ferry__image_kind *h, const char *tok, size_t klen, const char *v,
                       size_t vlen, char *errbuf, size_t errlen)
{
    uint64_t u;
    double d[3];
#define KEY(k) ferry__is_word(tok, klen, k)
#define BAD(what)                                                                                \
    ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "%s: %.*s=%.*s: expected %s", h->kind,    \
                       (int)klen, tok, (int)vlen, v, what)
    if (KEY("size")) {
        if (ferry__parse_u64(v, vlen, 1, FERRY__IMAGE_MAX_SIZE, &u))
            return BAD("an integer in 1..4096");
        h->img.size = (int)u;
    } else if (KEY("resize")) {
        if (ferry__parse_u64(v, vlen, 1, 65535, &u))
            return BAD("an integer in 1..65535");
        h->img.resize = (int)u;
    } else if (KEY("crop")) {
        if (ferry__is_word(v, vlen, "random"))
            h->img.random_crop = 1;
        else if (ferry__is_word(v, vlen, "center"))
            h->img.random_crop = 0;
        else
            return BAD("random or center");
    } else if (KEY("scale") || KEY("ratio")) {
        if (parse_doubles(v, vlen, d, 2) || !(d[0] > 0) || d[0] > d[1])
            return BAD("LO:HI with 0 < LO <= HI");
        if (KEY("scale")) {
            if (d[1] > 1)
                return BAD("LO:HI with 0 < LO <= HI <= 1");
            h->img.scale_lo = d[0], h->img.scale_hi = d[1];
        } else {
            h->img.ratio_lo = d[0], h->img.ratio_hi = d[1];
        }
    } else if (KEY("flip") || KEY("box") || KEY("dct")) {
        if (ferry__parse_u64(v, vlen, 0, 1, &u))
            return BAD("0 or 1");
        if (KEY("flip"))
            h->img.flip = (int)u, h->flip_set = 1;
        else if (KEY("box"))
            h->with_box = (int)u;
        else
            h->img.dct_scale = (int)u;
    } else if (KEY("layout")) {
        if (ferry__is_word(v, vlen, "chw") || ferry__is_word(v, vlen, "hwc"))
            h->img.hwc = v[0] == 'h';
        else
            return BAD("chw or hwc");
    } else if (KEY("dtype")) {
        if (ferry__is_word(v, vlen, "uint8") || ferry__is_word(v, vlen, "float32"))
            h->f32 = v[0] == 'f';
        else
            return BAD("uint8 or float32");
    } else if (KEY("mean") || KEY("std")) {
        if (parse_doubles(v, vlen, d, 3))
            return BAD("three numbers A:B:C");
        if (KEY("std") && !(d[0] != 0 && d[1] != 0 && d[2] != 0))
            return BAD("three non-zero numbers A:B:C");
        memcpy(KEY("mean") ? h->mean : h->std, d, sizeof d);
        h->seen_norm = 1;
    } else if (KEY("on_error")) {
        if (ferry__is_word(v, vlen, "fail") || ferry__is_word(v, vlen, "skip"))
            h->on_error_skip = v[0] == 's';
        else
            return BAD("fail or skip");
    } else {
        return 1;
    }
#undef KEY
#undef BAD
    return FERRY_OK;
}

int ferry__image_kind_parse(ferry__image_kind *k, const char *args, ferry__image_key_fn own,
                            void *kind, const char *own_keys, char *errbuf, size_t errlen)
{
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    while (ferry__next_comma_token(&cur, &tok, &len)) {
        const char *eq = memchr(tok, '=', len);
        if (eq == NULL)
            return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                      "%s: option '%.*s' is not KEY=VALUE", k->kind, (int)len,
                                      tok);
        size_t klen = (size_t)(eq - tok), vlen = len - klen - 1;
        int rc = own(kind, tok, klen, eq + 1, vlen, errbuf, errlen);
        if (rc == 1)
            rc = kind_option(k, tok, klen, eq + 1, vlen, errbuf, errlen);
        if (rc == 1)
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                    "%s: unknown key '%.*s' (expected %s, size, crop, scale, "
                                    "ratio, resize, flip, layout, dtype, mean, std, on_error, "
                                    "box, dct)",
                                    k->kind, (int)klen, tok, own_keys);
        if (rc != FERRY_OK)
            return rc;
    }
    return FERRY_OK;
}

int ferry__image_kind_ready(ferry__image_kind *h, char *errbuf, size_t errlen)
{
    if (!h->flip_set)
        h->img.flip = h->img.random_crop;
    if (h->img.resize == 0)
        h->img.resize = (int)lrint(h->img.size / 0.875);
    if (h->img.resize < h->img.size)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "%s: resize=%d is smaller than size=%d", h->kind,
                                  h->img.resize, h->img.size);
    if (h->seen_norm && !h->f32)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "%s: mean and std go with dtype=float32", h->kind);
    for (int c = 0; c < 3; c++)
        ferry__image_norm_table((float)h->mean[c], (float)h->std[c], h->table[c]);
    h->dec = ferry__image_dec_new();
    h->u8 = malloc((size_t)h->img.size * h->img.size * 3);
    if (h->dec == NULL || h->u8 == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "%s: out of memory", h->kind);
    return FERRY_OK;
}

void ferry__image_kind_schema(const ferry__image_kind *h, ferry_dataset_schema *schema)
{
    int64_t S = h->img.size;
    ferry_field_spec *f = &schema->fields[0];
    snprintf(f->name, sizeof f->name, "image");
    f->dtype = h->f32 ? FERRY_DTYPE_F32 : FERRY_DTYPE_U8;
    f->ndim = 3;
    f->shape[0] = h->img.hwc ? S : 3;
    f->shape[1] = S;
    f->shape[2] = h->img.hwc ? 3 : S;
    f = &schema->fields[1];
    snprintf(f->name, sizeof f->name, "label");
    f->dtype = FERRY_DTYPE_I64;
    f->ndim = 0;
    schema->nfields = 2;
    if (h->with_box) {
        f = &schema->fields[2];
        snprintf(f->name, sizeof f->name, "box");
        f->dtype = FERRY_DTYPE_I64;
        f->ndim = 1;
        f->shape[0] = 5;
        schema->nfields = 3;
    }
}

void ferry__image_kind_free(ferry__image_kind *h)
{
    ferry__image_dec_free(h->dec);
    free(h->u8);
    h->dec = NULL;
    h->u8 = NULL;
}

/* Decodes item i with the crop seeded by `seed` into the k-th place of
 * dst[]. Returns 0, or -1 with the reason in err. */
static int make_item(ferry__image_kind *h, uint64_t i, uint64_t seed, size_t k,
                     void *const dst[], char *path, size_t path_cap, char *err, size_t errlen)
{
    size_t len, px = (size_t)h->img.size * h->img.size * 3;
    ferry__image_box box;
    uint8_t *out = h->f32 ? h->u8 : (uint8_t *)dst[0] + k * px;
    const uint8_t *data;
    int64_t label;

    path[0] = '\0';
    if (h->fetch(h->src, i, &data, &len, &label, path, path_cap, err, errlen) ||
        ferry__image_decode(h->dec, data, len, &h->img, seed, out, &box, err, errlen))
        return -1;
    if (h->f32) {
        float *o = (float *)dst[0] + k * px;
        if (h->img.hwc) {
            for (size_t p = 0; p < px; p += 3) {
                for (int c = 0; c < 3; c++)
                    o[p + c] = h->table[c][out[p + c]];
            }
        } else {
            size_t plane = px / 3;
            for (int c = 0; c < 3; c++)
                ferry__image_normalize(out + c * plane, plane, h->table[c], o + c * plane);
        }
    }
    memcpy((uint8_t *)dst[1] + k * sizeof label, &label, sizeof label);
    if (h->with_box) {
        int64_t b[5] = {box.top, box.left, box.height, box.width, box.flipped};
        memcpy((uint8_t *)dst[2] + k * sizeof b, b, sizeof b);
    }
    return 0;
}

int ferry__image_kind_batch(ferry__image_kind *h, const ferry_batch_request *req,
                            void *const dst[], ferry_dataset_error *err)
{
    char path[PATH_MAX + 64], why[512];

    for (size_t k = 0; k < req->count; k++) {
        uint64_t i = req->indices[k], seed = ferry_sample_seed(req->seed, req->epoch, i);
        if (make_item(h, i, seed, k, dst, path, sizeof path, why, sizeof why) == 0)
            continue;
        if (!h->on_error_skip) {
            err->index = i;
            snprintf(err->message, sizeof err->message, "%s: %s: %s", h->kind, path, why);
            return FERRY_EBATCH;
        }
        /* Replaced by other items drawn from the same seed, so the batch
         * is the same bytes every time it is made. */
        char bad[sizeof path];
        snprintf(bad, sizeof bad, "%s", path);
        ferry__rng r = {seed ^ 0x5bd1e9955bd1e995ULL};
        int done = 0;
        for (int t = 0; t < SKIP_TRIES && !done; t++) {
            uint64_t j = ferry__rng_below(&r, h->n);
            char why2[512];
            done = make_item(h, j, ferry_mix64(seed + (uint64_t)t + 1), k, dst, path,
                             sizeof path, why2, sizeof why2) == 0;
            if (done && ferry__log_nth(++h->skipped, 8))
                ferry__logf(NULL, FERRY_LOG_WARN,
                            "%s: %s does not decode (%s): item %" PRIu64
                            " replaced by item %" PRIu64 " (%" PRIu64
                            " replaced by this worker so far)",
                            h->kind, bad, why, i, j, h->skipped);
        }
        if (!done) {
            err->index = i;
            snprintf(err->message, sizeof err->message,
                     "%s: %s: %s; and %d items drawn to replace it failed too", h->kind, bad,
                     why, SKIP_TRIES);
            return FERRY_EBATCH;
        }
    }
    return FERRY_OK;
}

