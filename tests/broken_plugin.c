/*
 * broken_plugin.c - a dataset plugin whose entry point is wrong in one way,
 * chosen when it is built (tests/CMakeLists.txt builds one module per way),
 * for the tests that ferry refuses such a plugin before calling any of its
 * functions and unloads it again:
 *
 *   BROKEN_ABI=1           the table says abi_version FERRY_DATASET_ABI + 1
 *   BROKEN_NO_TABLE=1      ferry_dataset_plugin() returns NULL
 *   BROKEN_NO_GET_BATCH=1  the table has no get_batch
 *
 * Its functions abort: ferry must never call them.
 */
#include <stdlib.h>

#include "ferry_dataset.h"

#ifndef BROKEN_ABI
#define BROKEN_ABI 0
#endif
#ifndef BROKEN_NO_TABLE
#define BROKEN_NO_TABLE 0
#endif
#ifndef BROKEN_NO_GET_BATCH
#define BROKEN_NO_GET_BATCH 0
#endif

static int broken_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                       ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    abort();
}

static uint64_t broken_length(void *handle)
{
    abort();
}

static int broken_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                            ferry_dataset_error *err)
{
    abort();
}

static void broken_close(void *handle)
{
    abort();
}

static const ferry_dataset_ops broken_ops = {
    .abi_version = FERRY_DATASET_ABI + BROKEN_ABI,
    .name = "broken",
    .open = broken_open,
    .length = broken_length,
    .get_batch = BROKEN_NO_GET_BATCH ? NULL : broken_get_batch,
    .close = broken_close,
};

__attribute__((visibility("default"))) const ferry_dataset_ops *ferry_dataset_plugin(void)
{
    return BROKEN_NO_TABLE ? NULL : &broken_ops;
}
