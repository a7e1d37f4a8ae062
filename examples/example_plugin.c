/*
 * example_plugin.c - a "sine regression" dataset, and the template to copy
 * when writing a ferry dataset plugin.
 *
 * Use it as   plugin:/path/to/libferry_example.so?n=1000,dim=4
 *
 * Item i has two fields:
 *   "x"  f32 [dim]   x[k] = sinf(i * 0.01f + k) + noise(i, k)
 *   "y"  f32 scalar  y = sum over k of sinf(i * 0.01f + k), without noise
 * noise(i, k) lies in [-EXAMPLE_NOISE, EXAMPLE_NOISE) and is drawn from
 * ferry_sample_seed(req->seed, req->epoch, i): fresh every epoch, the same
 * whichever worker builds the item, so a run is reproducible from its seed.
 *
 * What a plugin must do (include/ferry_dataset.h is the whole contract):
 *  - include only "ferry_dataset.h" and link nothing of ferry; export one
 *    function, ferry_dataset_plugin(), returning a static ops table whose
 *    abi_version is FERRY_DATASET_ABI;
 *  - open(): parse args strictly and say what is wrong in errbuf, fill the
 *    schema (fixed dtype and shape per field), allocate the handle;
 *  - get_batch(): write item req->indices[k] at row k of every dst[f];
 *    indices are already checked against length(); on failure set
 *    err->index and err->message and return a negative FERRY_E* code;
 *  - keep all state in the handle: thread workers may hold several handles
 *    in one process at once.
 */
#include "ferry_dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXAMPLE_NOISE 0.05f
#define EXAMPLE_MAX_N (1ULL << 32)
#define EXAMPLE_MAX_DIM 4096

typedef struct example {
    uint64_t n;
    uint64_t dim;
} example;

/* Reads "VALUE" for key `key` from the text at `val` up to `stop`: decimal,
 * within 1..max. */
static int example_number(const char *key, const char *val, const char *stop, uint64_t max,
                          uint64_t *out, char *errbuf, size_t errlen)
{
    char *end = NULL;
    unsigned long long v;

    errno = 0;
    v = (val < stop && *val >= '0' && *val <= '9') ? strtoull(val, &end, 10) : 0;
    if (v == 0 || errno != 0 || end != stop || v > max) {
        snprintf(errbuf, errlen, "example: %s must be an integer in 1..%llu, not '%.*s'", key,
                 (unsigned long long)max, (int)(stop - val), val);
        return FERRY_EDATASET;
    }
    *out = v;
    return FERRY_OK;
}

static int example_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                        ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    example cfg = {.n = 1000, .dim = 4}, *h;
    const char *p = args;

    while (*p != '\0') {
        const char *stop = p + strcspn(p, ","), *eq = memchr(p, '=', (size_t)(stop - p));
        int rc;

        if (eq == NULL) {
            snprintf(errbuf, errlen, "example: expected n=N or dim=D, got '%.*s'", (int)(stop - p),
                     p);
            return FERRY_EDATASET;
        }
        if (eq - p == 1 && p[0] == 'n') {
            rc = example_number("n", eq + 1, stop, EXAMPLE_MAX_N, &cfg.n, errbuf, errlen);
        } else if (eq - p == 3 && memcmp(p, "dim", 3) == 0) {
            rc = example_number("dim", eq + 1, stop, EXAMPLE_MAX_DIM, &cfg.dim, errbuf, errlen);
        } else {
            snprintf(errbuf, errlen, "example: unknown key '%.*s' (expected n, dim)", (int)(eq - p),
                     p);
            return FERRY_EDATASET;
        }
        if (rc != FERRY_OK)
            return rc;
        p = *stop == ',' ? stop + 1 : stop;
    }

    h = malloc(sizeof *h);
    if (h == NULL) {
        snprintf(errbuf, errlen, "example: out of memory");
        return FERRY_ENOMEM;
    }
    *h = cfg;
    schema->nfields = 2;
    strcpy(schema->fields[0].name, "x");
    schema->fields[0].dtype = FERRY_DTYPE_F32;
    schema->fields[0].ndim = 1;
    schema->fields[0].shape[0] = (int64_t)cfg.dim;
    strcpy(schema->fields[1].name, "y");
    schema->fields[1].dtype = FERRY_DTYPE_F32;
    schema->fields[1].ndim = 0;
    *handle = h;
    return FERRY_OK;
}

static uint64_t example_length(void *handle)
{
    return ((const example *)handle)->n;
}

static int example_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                             ferry_dataset_error *err)
{
    const example *h = handle;
    float *x = dst[0], *y = dst[1];

    for (size_t row = 0; row < req->count; row++) {
        uint64_t i = req->indices[row];
        uint64_t rng = ferry_sample_seed(req->seed, req->epoch, i);
        float sum = 0.0f;

        for (uint64_t k = 0; k < h->dim; k++) {
            float clean = sinf((float)i * 0.01f + (float)k);
            /* 24 random bits -> [0, 1) -> [-NOISE, NOISE). */
            float u = (float)(ferry_mix64(rng + k) >> 40) * (1.0f / 16777216.0f);
            x[row * h->dim + k] = clean + (2.0f * u - 1.0f) * EXAMPLE_NOISE;
            sum += clean;
        }
        y[row] = sum;
    }
    return FERRY_OK;
}

static void example_close(void *handle)
{
    free(handle);
}

static const ferry_dataset_ops example_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "example-sine",
    .open = example_open,
    .length = example_length,
    .get_batch = example_get_batch,
    .close = example_close,
};

__attribute__((visibility("default"))) const ferry_dataset_ops *ferry_dataset_plugin(void)
{
    return &example_ops;
}
