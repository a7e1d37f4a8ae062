/*
 * install_app.c - a program built the way a user builds one, against an
 * installed ferry (tests/install_test.sh builds it twice: with pkg-config
 * and with find_package), to prove that the install works from where it
 * lies, with nothing set in the environment.
 *
 * It opens a loader with 2 local worker processes over
 * synthetic:n=512,dim=8, reads one epoch in order and checks the schema,
 * every return code, and that each index arrived exactly once as its own
 * y. It prints "worker N: PATH" (the program each worker runs, from /proc)
 * so the script can tell which ferry-worker the library found. The exit
 * status is 0 only if everything held; each failure says what it was.
 */
#define _POSIX_C_SOURCE 200809L /* readlink */

#include <ferry.h>
#include <ferry_dataset.h> /* ferry_dataset_schema: both installed headers build */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ITEMS 512
#define DIM 8
#define BATCH 64
#define WORKERS 2

#define STR2(x) #x
#define STR(x) STR2(x)

static int fail(const char *what, int rc)
{
    fprintf(stderr, "install_app: %s: %s: %s\n", what, ferry_err_name(rc), ferry_last_error());
    return 1;
}

static int wrong(const char *what)
{
    fprintf(stderr, "install_app: %s\n", what);
    return 1;
}

/* The schema the synthetic dataset promises: x u8[DIM], y i64 scalar. */
static int check_schema(ferry_loader *ld)
{
    ferry_dataset_schema sc;
    int rc = ferry_loader_schema(ld, &sc);
    if (rc != FERRY_OK)
        return fail("schema", rc);
    if (sc.nfields != 2 || strcmp(sc.fields[0].name, "x") != 0 ||
        sc.fields[0].dtype != FERRY_DTYPE_U8 || sc.fields[0].ndim != 1 ||
        sc.fields[0].shape[0] != DIM || strcmp(sc.fields[1].name, "y") != 0 ||
        sc.fields[1].dtype != FERRY_DTYPE_I64 || sc.fields[1].ndim != 0)
        return wrong("the schema is not x u8[8], y i64");
    return 0;
}

/* Prints the program each local worker runs. */
static int print_workers(ferry_loader *ld)
{
    for (uint32_t i = 0; i < WORKERS; i++) {
        int pid = 0, rc = ferry_loader_worker_pid(ld, i, &pid);
        if (rc != FERRY_OK)
            return fail("worker_pid", rc);
        char link[64], exe[4096];
        snprintf(link, sizeof link, "/proc/%d/exe", pid);
        ssize_t n = pid > 0 ? readlink(link, exe, sizeof exe - 1) : -1;
        if (n <= 0)
            return wrong("a worker is not a running process");
        exe[n] = '\0';
        printf("worker %" PRIu32 ": %s\n", i, exe);
    }
    return 0;
}

/* One batch: its fields' shapes, and y[k] == indices[k] each seen once. */
static int check_batch(ferry_batch *b, unsigned char seen[ITEMS])
{
    ferry_batch_info info;
    ferry_batch_get_info(b, &info);
    ferry_tensor x, y;
    int rc = ferry_batch_field(b, "x", &x);
    if (rc == FERRY_OK)
        rc = ferry_batch_field(b, "y", &y);
    if (rc != FERRY_OK)
        return fail("field", rc);
    if (x.shape[0] != info.size || y.shape[0] != info.size || x.shape[1] != DIM ||
        x.nbytes != (size_t)info.size * DIM)
        return wrong("a batch's fields do not have its shape");
    const int64_t *ys = y.data;
    const uint64_t *idx = ferry_batch_indices(b);
    for (uint32_t k = 0; k < info.size; k++) {
        if (idx[k] >= ITEMS || seen[idx[k]]++ || ys[k] != (int64_t)idx[k])
            return wrong("an item is out of range, repeated, or not its index");
    }
    return 0;
}

static int read_epoch(ferry_loader *ld)
{
    unsigned char seen[ITEMS] = {0};
    unsigned batches = 0;
    ferry_batch *b;
    int rc, status = 0;
    while (status == 0 && (rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        status = check_batch(b, seen);
        ferry_batch_release(b);
        batches++;
    }
    if (status != 0)
        return status;
    if (rc != FERRY_EOF)
        return fail("next", rc);
    if (batches != ITEMS / BATCH || memchr(seen, 0, sizeof seen))
        return wrong("the epoch did not deliver every item");
    return 0;
}

int main(void)
{
    /* The header this was compiled with and the library it runs with are
     * one release. */
    const char *header =
        STR(FERRY_VERSION_MAJOR) "." STR(FERRY_VERSION_MINOR) "." STR(FERRY_VERSION_PATCH);
    if (strcmp(ferry_version(), header) != 0)
        return wrong("ferry_version() is not the header's version");

    static const struct {
        const char *key;
        int64_t value;
    } ints[] = {{"workers", WORKERS}, {"batch_size", BATCH}, {"epochs", 1}, {"prefetch", 4}};
    ferry_config *cfg = ferry_config_new();
    if (!cfg)
        return wrong("out of memory");
    int rc = ferry_config_set(cfg, "dataset", "synthetic:n=" STR(ITEMS) ",dim=" STR(DIM));
    for (size_t i = 0; rc == FERRY_OK && i < sizeof ints / sizeof ints[0]; i++)
        rc = ferry_config_set_int(cfg, ints[i].key, ints[i].value);
    ferry_loader *ld = NULL;
    if (rc == FERRY_OK)
        rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    if (rc != FERRY_OK)
        return fail("open", rc);

    int status = check_schema(ld);
    if (status == 0)
        status = print_workers(ld);
    if (status == 0)
        status = read_epoch(ld);
    rc = ferry_loader_close(ld);
    if (rc != FERRY_OK)
        return fail("close", rc);
    if (status == 0)
        printf("install_app: %d items in %d batches from %d workers, ferry %s\n", ITEMS,
               ITEMS / BATCH, WORKERS, ferry_version());
    return status;
}
