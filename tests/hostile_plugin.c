/*
 * hostile_plugin.c - a dataset plugin that misbehaves on request, for the
 * failure tests.
 *
 * Content is the synthetic dataset's ("x": u8[dim] with byte j of item i =
 * ferry__synthetic_byte's formula, "y": i64 index), so tests can check that
 * what does arrive is intact. The misbehaviours, each chosen by an argument:
 *
 *   crash_at=I        segfault while reading item I (every time)
 *   abort_at=I        abort() while reading item I
 *   bus_at=I          raise SIGBUS while reading item I
 *   hang_at=I         block forever (pause) while reading item I
 *   spin_at=I         spin forever while reading item I
 *   exit_at_open=C    the worker exits with code C while opening
 *   fail_open_worker=K  opening fails in worker K only
 *   wait_open_worker=K  opening waits in worker K until the file wait_file
 *                       (a path) exists, 20 s at most
 *   length_by_worker=1  worker K reports n + K items
 *   dim_by_worker=1   worker K's items have dim + K bytes of x (another schema)
 *   ignore_term=1     the worker ignores SIGTERM from the moment it opens
 *   omp=1             items are built by an OpenMP parallel loop
 *   say=TEXT          print TEXT on stderr before crashing/exiting
 *
 * Only for tests: it deliberately kills, hangs and exits its host process.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry_dataset.h"

typedef struct hostile {
    uint64_t n, dim;
    int64_t crash_at, abort_at, bus_at, hang_at, spin_at;
    int omp;
    char say[128];
} hostile;

static uint8_t item_byte(uint64_t i, uint64_t j)
{
    /* The same formula as the built-in synthetic dataset (core/datasets/synthetic.c). */
    return (uint8_t)(ferry_mix64(i * 0x9E3779B97F4A7C15ULL + j / 8) >> (8 * (j % 8)));
}

static int hostile_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                        ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    hostile *h = calloc(1, sizeof *h);
    if (!h)
        return FERRY_ENOMEM;
    h->n = 1000;
    h->dim = 16;
    h->crash_at = h->abort_at = h->bus_at = h->hang_at = h->spin_at = -1;
    int64_t exit_at_open = -1, fail_open_worker = -1, length_by_worker = 0, ignore_term = 0;
    int64_t dim_by_worker = 0, wait_open_worker = -1;
    char wait_file[256] = "";

    char buf[512];
    snprintf(buf, sizeof buf, "%s", args ? args : "");
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(errbuf, errlen, "hostile: '%s' has no '='", kv);
            free(h);
            return FERRY_EDATASET;
        }
        *eq = '\0';
        const char *v = eq + 1;
        long long x = strtoll(v, NULL, 10);
        if (!strcmp(kv, "n"))
            h->n = (uint64_t)x;
        else if (!strcmp(kv, "dim"))
            h->dim = (uint64_t)x;
        else if (!strcmp(kv, "crash_at"))
            h->crash_at = x;
        else if (!strcmp(kv, "abort_at"))
            h->abort_at = x;
        else if (!strcmp(kv, "bus_at"))
            h->bus_at = x;
        else if (!strcmp(kv, "hang_at"))
            h->hang_at = x;
        else if (!strcmp(kv, "spin_at"))
            h->spin_at = x;
        else if (!strcmp(kv, "exit_at_open"))
            exit_at_open = x;
        else if (!strcmp(kv, "fail_open_worker"))
            fail_open_worker = x;
        else if (!strcmp(kv, "length_by_worker"))
            length_by_worker = x;
        else if (!strcmp(kv, "dim_by_worker"))
            dim_by_worker = x;
        else if (!strcmp(kv, "ignore_term"))
            ignore_term = x;
        else if (!strcmp(kv, "omp"))
            h->omp = (int)x;
        else if (!strcmp(kv, "wait_open_worker"))
            wait_open_worker = x;
        else if (!strcmp(kv, "wait_file"))
            snprintf(wait_file, sizeof wait_file, "%s", v);
        else if (!strcmp(kv, "say"))
            snprintf(h->say, sizeof h->say, "%s", v);
        else {
            snprintf(errbuf, errlen, "hostile: unknown key '%s'", kv);
            free(h);
            return FERRY_EDATASET;
        }
    }
    if (exit_at_open >= 0) {
        if (h->say[0])
            fprintf(stderr, "%s\n", h->say);
        _exit((int)exit_at_open);
    }
    if (fail_open_worker >= 0 && (uint32_t)fail_open_worker == ctx->worker_index) {
        snprintf(errbuf, errlen, "hostile: refusing to open in worker %u", ctx->worker_index);
        free(h);
        return FERRY_EDATASET;
    }
    if (wait_open_worker >= 0 && (uint32_t)wait_open_worker == ctx->worker_index) {
        struct timespec tick = {0, 5 * 1000 * 1000};
        for (int i = 0; i < 4000 && access(wait_file, F_OK) != 0; i++)
            nanosleep(&tick, NULL);
    }
    if (length_by_worker)
        h->n += ctx->worker_index;
    if (dim_by_worker)
        h->dim += ctx->worker_index;
    if (ignore_term)
        signal(SIGTERM, SIG_IGN);

    memset(schema, 0, sizeof *schema);
    schema->nfields = 2;
    snprintf(schema->fields[0].name, FERRY_NAME_MAX, "x");
    schema->fields[0].dtype = FERRY_DTYPE_U8;
    schema->fields[0].ndim = 1;
    schema->fields[0].shape[0] = (int64_t)h->dim;
    snprintf(schema->fields[1].name, FERRY_NAME_MAX, "y");
    schema->fields[1].dtype = FERRY_DTYPE_I64;
    schema->fields[1].ndim = 0;
    *handle = h;
    return FERRY_OK;
}

static uint64_t hostile_length(void *handle)
{
    return ((hostile *)handle)->n;
}

static void misbehave(const hostile *h, uint64_t i)
{
    int64_t v = (int64_t)i;
    if (h->say[0] && (v == h->crash_at || v == h->abort_at || v == h->bus_at))
        fprintf(stderr, "%s\n", h->say);
    if (v == h->crash_at) {
        volatile int *volatile nowhere = NULL;
        *nowhere = 1; /* a real segfault, not a raised signal */
    }
    if (v == h->abort_at)
        abort();
    if (v == h->bus_at)
        raise(SIGBUS);
    if (v == h->hang_at)
        for (;;)
            pause();
    if (v == h->spin_at)
        for (volatile int k = 0;; k++)
            ;
}

static int hostile_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                             ferry_dataset_error *err)
{
    const hostile *h = handle;
    uint8_t *x = dst[0];
    int64_t *y = dst[1];
    for (size_t k = 0; k < req->count; k++)
        misbehave(h, req->indices[k]);
    long count = (long)req->count;
#pragma omp parallel for if (h->omp)
    for (long k = 0; k < count; k++) {
        uint64_t i = req->indices[k];
        for (uint64_t j = 0; j < h->dim; j++)
            x[(size_t)k * h->dim + j] = item_byte(i, j);
        y[k] = (int64_t)i;
    }
    (void)err;
    return FERRY_OK;
}

static void hostile_close(void *handle)
{
    free(handle);
}

static const ferry_dataset_ops hostile_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "hostile",
    .open = hostile_open,
    .length = hostile_length,
    .get_batch = hostile_get_batch,
    .close = hostile_close,
};

__attribute__((visibility("default"))) const ferry_dataset_ops *ferry_dataset_plugin(void)
{
    return &hostile_ops;
}
