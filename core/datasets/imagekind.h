/*
 * imagekind.h - what the image dataset kinds share (imagefolder.c, wds.c):
 * their common options, the schema, and the batch loop that decodes each
 * item (image.c), converts it, and fails or replaces an item that does not
 * decode. A kind only says where item i's bytes and label are (fetch).
 *
 * Threads: a ferry__image_kind is one worker's (decoder scratch, buffers).
 */
#ifndef FERRY_CORE_DATASETS_IMAGEKIND_H
#define FERRY_CORE_DATASETS_IMAGEKIND_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "kinds.h"

typedef struct ferry__image_kind ferry__image_kind;

/* Item i's encoded bytes (*data, valid until the next fetch), its label,
 * and its name for messages (a path, "shard.tar:key"). Returns 0, or -1
 * with the reason in err (name filled either way when it can be). */
typedef int (*ferry__image_fetch)(void *src, uint64_t i, const uint8_t **data, size_t *len,
                                  int64_t *label, char *name, size_t namecap, char *err,
                                  size_t errlen);

struct ferry__image_kind {
    const char *kind; /* in messages: "imagefolder", "wds" */
    ferry__image_opts img;
    int f32, on_error_skip, with_box;
    int flip_set, seen_norm;
    double mean[3], std[3];
    float table[3][256]; /* float32: (v / 255 - mean) / std per channel */
    ferry__image_dec *dec;
    uint8_t *u8; /* one item before float conversion */
    uint64_t skipped, n;
    ferry__image_fetch fetch;
    void *src;
};

/* The defaults (224 px, RandomResizedCrop with torchvision's scale and
 * ratio, uint8 CHW, DCT scaling on). */
void ferry__image_kind_init(ferry__image_kind *k, const char *kind);

/* A kind's own keys: FERRY_OK, a code with a message, or 1 when `key` is
 * not one of them. */
typedef int (*ferry__image_key_fn)(void *kind, const char *key, size_t klen, const char *v,
                                   size_t vlen, char *errbuf, size_t errlen);

/* Parses the spec's KEY=VALUE,... list: the kind's keys through `own`
 * (called first), the common ones here. An unknown key's message lists
 * `own_keys` (the kind's, e.g. "root") and the common ones. */
int ferry__image_kind_parse(ferry__image_kind *k, const char *args, ferry__image_key_fn own,
                            void *kind, const char *own_keys, char *errbuf, size_t errlen);

/* After the options: the defaults that depend on others, the checks
 * across options, the decoder. FERRY_OK or a code with a message. */
int ferry__image_kind_ready(ferry__image_kind *k, char *errbuf, size_t errlen);

/* Fields image, label (and box). */
void ferry__image_kind_schema(const ferry__image_kind *k, ferry_dataset_schema *schema);

/* get_batch: every item fetched, decoded and written, or the batch failed
 * (FERRY_EBATCH naming the item) or its bad items replaced (on_error=skip). */
int ferry__image_kind_batch(ferry__image_kind *k, const ferry_batch_request *req,
                            void *const dst[], ferry_dataset_error *err);

/* Frees what init and ready allocated; safe twice. */
void ferry__image_kind_free(ferry__image_kind *k);

/* Whether `len` bytes of tok are exactly `word`. */
int ferry__is_word(const char *tok, size_t len, const char *word);

#endif
