/*
 * test_dataset.c - the dataset module: spec parsing, the synthetic, npy and
 * plugin kinds, schema checks, and failures that leak nothing.
 *
 * The synthetic dataset is checked against ferry__synthetic_byte, the npy
 * kind against .npy files written here into a private temporary directory
 * (valid ones in several header styles and a corrupt one per failure mode),
 * the plugin kind against examples/example_plugin.c (FERRY_TEST_PLUGIN) and
 * its documented formula, and against tests/broken_plugin.c's wrong entry
 * points. Every failed open must leave the struct zeroed, no fd open and
 * nothing mapped (a refused plugin no longer loaded).
 */
#include <dlfcn.h>
#include <sys/stat.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* cmocka.h needs the headers above first. */
#include <cmocka.h>

#include "dataset.h"
#include "harness.h"

/* --- Helpers --- */

/* One buffer per field for a batch, 64-byte aligned as the worker's are. */
typedef struct bufs {
    int n;
    void *dst[FERRY_MAX_FIELDS];
} bufs;

static void bufs_free(bufs *b)
{
    for (int f = 0; f < b->n; f++)
        free(b->dst[f]);
    b->n = 0;
}

/* Allocates b for `count` items of ds and asks ds for them. */
static int get_batch(ferry__dataset *ds, uint64_t seed, uint64_t epoch, const uint64_t *idx,
                     size_t count, bufs *b, ferry_dataset_error *err)
{
    ferry_batch_request req = {.epoch = epoch, .seed = seed, .indices = idx, .count = count};
    b->n = ds->schema.nfields;
    for (int f = 0; f < b->n; f++) {
        size_t bytes = (count * ds->item_bytes[f] + 63) / 64 * 64;
        b->dst[f] = aligned_alloc(64, bytes ? bytes : 64);
        assert_non_null(b->dst[f]);
        memset(b->dst[f], 0xAA, bytes);
    }
    return ferry__dataset_get_batch(ds, &req, b->dst, err);
}

/* Like get_batch, but the call must succeed. */
static void get_ok(ferry__dataset *ds, uint64_t seed, uint64_t epoch, const uint64_t *idx,
                   size_t count, bufs *b)
{
    ferry_dataset_error err;
    int rc = get_batch(ds, seed, epoch, idx, count, b, &err);
    if (rc != FERRY_OK)
        print_error("get_batch: %s: %s\n", ferry_err_name(rc), err.message);
    assert_int_equal(rc, FERRY_OK);
}

static void open_ok(ferry__dataset *ds, const char *spec)
{
    char errbuf[1024];
    int rc = ferry__dataset_open(ds, spec, NULL, errbuf, sizeof errbuf);
    if (rc != FERRY_OK)
        print_error("open %s: %s: %s\n", spec, ferry_err_name(rc), errbuf);
    assert_int_equal(rc, FERRY_OK);
}

static int is_zero(const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t k = 0; k < len; k++) {
        if (b[k] != 0)
            return 0;
    }
    return 1;
}

/* Lines of /proc/self/maps that mention `needle`: a mapping left behind by
 * a failed or closed dataset (an npy file, a plugin) shows up here. */
static int count_maps(const char *needle)
{
    char line[4096];
    int n = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, needle) != NULL)
            n++;
    }
    fclose(f);
    return n;
}

/* Opening `spec` must fail with `code`, a message containing each of the
 * NULL-terminated needles (in errbuf and in ferry_last_error), a zeroed
 * struct, and no fd left open. */
static void expect_open_fails(const char *spec, int code, ...)
{
    ferry__dataset ds;
    char errbuf[1024];
    const char *needle;
    va_list ap;
    int fds = ft_count_fds(), rc;

    memset(&ds, 0x5A, sizeof ds);
    rc = ferry__dataset_open(&ds, spec, NULL, errbuf, sizeof errbuf);
    if (rc != code)
        print_error("open %s: got %s (%s), expected %s\n", spec, ferry_err_name(rc), errbuf,
                    ferry_err_name(code));
    assert_int_equal(rc, code);
    assert_true(is_zero(&ds, sizeof ds));
    assert_int_equal(ft_count_fds(), fds);
    assert_string_equal(ferry_last_error(), errbuf);
    va_start(ap, code);
    while ((needle = va_arg(ap, const char *)) != NULL) {
        if (strstr(errbuf, needle) == NULL)
            print_error("open %s: message '%s' lacks '%s'\n", spec, errbuf, needle);
        assert_non_null(strstr(errbuf, needle));
    }
    va_end(ap);
}

/* CPU seconds used by this thread: what cost_us promises, unlike wall time,
 * which a busy machine stretches. */
static double thread_cpu_seconds(void)
{
    struct timespec now;
    assert_int_equal(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now), 0);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* --- Spec and generic checks --- */

static void test_unknown_kind_lists_the_known_ones(void **state)
{
    expect_open_fails("foo:bar", FERRY_EDATASET,
                      "unknown dataset kind 'foo' (expected synthetic, npy, plugin, imagefolder, wds", NULL);
    expect_open_fails("", FERRY_EDATASET, "unknown dataset kind ''", NULL);
    expect_open_fails("Synthetic:n=3", FERRY_EDATASET, "'Synthetic'", NULL);
    expect_open_fails("python:m:C", FERRY_EDATASET, "served by Python workers", NULL);
}

/* A kind registered at run time: one u8 field whose item i is i + the
 * number in its args. */
static int counting_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                         ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    static int base;
    base = atoi(args);
    *handle = &base;
    memset(schema, 0, sizeof *schema);
    schema->nfields = 1;
    snprintf(schema->fields[0].name, sizeof schema->fields[0].name, "v");
    schema->fields[0].dtype = FERRY_DTYPE_U8;
    return FERRY_OK;
}
static uint64_t counting_length(void *handle)
{
    return 10;
}
static int counting_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                              ferry_dataset_error *err)
{
    for (size_t i = 0; i < req->count; i++)
        ((uint8_t *)dst[0])[i] = (uint8_t)(req->indices[i] + (uint64_t)*(int *)handle);
    return FERRY_OK;
}
static void counting_close(void *handle)
{
}

static void test_registered_kind_opens_and_bad_ones_are_refused(void **state)
{
    static ferry_dataset_ops ops = {.abi_version = FERRY_DATASET_ABI,
                                    .name = "counting",
                                    .open = counting_open,
                                    .length = counting_length,
                                    .get_batch = counting_get_batch,
                                    .close = counting_close};
    assert_int_equal(ferry_dataset_register(&ops), FERRY_OK);
    assert_int_equal(ferry_dataset_register(&ops), FERRY_OK); /* again: replaces */
    ferry__dataset ds;
    char errbuf[256];
    assert_int_equal(ferry__dataset_open(&ds, "counting:7", NULL, errbuf, sizeof errbuf), FERRY_OK);
    assert_int_equal(ds.length, 10);
    uint64_t idx[2] = {1, 9};
    uint8_t out[2] = {0};
    void *dst[1] = {out};
    ferry_batch_request req = {.indices = idx, .count = 2};
    ferry_dataset_error derr;
    assert_int_equal(ferry__dataset_get_batch(&ds, &req, dst, &derr), FERRY_OK);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 16);
    ferry__dataset_close(&ds);
    expect_open_fails("nothing:1", FERRY_EDATASET, "imagefolder, wds, concat, counting)", NULL);

    static ferry_dataset_ops builtin;
    builtin = ops;
    builtin.name = "npy";
    FT_EXPECT_ERROR(ferry_dataset_register(&builtin), FERRY_EINVAL, "built-in", NULL);
    builtin.name = "no spaces";
    FT_EXPECT_ERROR(ferry_dataset_register(&builtin), FERRY_EINVAL, "letters, digits", NULL);
    builtin.name = "nofuncs";
    builtin.get_batch = NULL;
    FT_EXPECT_ERROR(ferry_dataset_register(&builtin), FERRY_EINVAL, "all four functions", NULL);
}

static void test_close_is_safe_on_zeroed_and_twice(void **state)
{
    ferry__dataset ds;
    memset(&ds, 0, sizeof ds);
    ferry__dataset_close(&ds);
    ferry__dataset_close(NULL);
    open_ok(&ds, "synthetic:n=3,dim=2");
    ferry__dataset_close(&ds);
    assert_true(is_zero(&ds, sizeof ds));
    ferry__dataset_close(&ds);
}

static void test_get_batch_on_closed_dataset_is_einval(void **state)
{
    ferry__dataset ds;
    ferry_dataset_error err;
    uint64_t idx = 0;
    ferry_batch_request req = {.indices = &idx, .count = 1};
    void *dst[1] = {NULL};
    memset(&ds, 0, sizeof ds);
    assert_int_equal(ferry__dataset_get_batch(&ds, &req, dst, &err), FERRY_EINVAL);
}

static void test_index_out_of_range_names_the_index(void **state)
{
    ferry__dataset ds;
    ferry_dataset_error err;
    bufs b;
    const uint64_t idx[] = {1, 9, 10, 3};

    open_ok(&ds, "synthetic:n=10,dim=4");
    assert_int_equal(get_batch(&ds, 0, 0, idx, 4, &b, &err), FERRY_ERANGE);
    assert_int_equal(err.index, 10);
    assert_string_equal(err.message, "index 10 out of range (dataset has 10 items)");
    assert_string_equal(ferry_last_error(), err.message);
    bufs_free(&b);
    ferry__dataset_close(&ds);
}

/* A dataset that breaks the rules ferry__dataset_get_batch must repair:
 * it returns `rc` and writes `fill` over the whole message (0: leaves it
 * empty), without a terminating NUL. */
typedef struct rogue {
    int rc;
    char fill;
    int closes;
} rogue;

static int rogue_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                           ferry_dataset_error *err)
{
    const rogue *r = handle;
    if (r->fill)
        memset(err->message, r->fill, sizeof err->message);
    err->index = req->indices[0];
    return r->rc;
}

static void rogue_close(void *handle)
{
    ((rogue *)handle)->closes++;
}

static const ferry_dataset_ops rogue_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "rogue",
    .get_batch = rogue_get_batch,
    .close = rogue_close,
};

static void test_get_batch_repairs_a_misbehaving_dataset(void **state)
{
    ferry__dataset ds;
    ferry_dataset_error err;
    rogue r = {0};
    const uint64_t idx[] = {2};
    bufs b;

    memset(&ds, 0, sizeof ds);
    ds.ops = &rogue_ops;
    ds.handle = &r;
    ds.length = 5;
    ds.schema.nfields = 1;
    ds.item_bytes[0] = 1;

    /* A positive code must not read as success; the message gets its NUL. */
    r = (rogue){.rc = 7, .fill = 'z'};
    assert_int_equal(get_batch(&ds, 0, 0, idx, 1, &b, &err), FERRY_EBATCH);
    assert_int_equal(strlen(err.message), sizeof err.message - 1);
    assert_int_equal(err.index, 2);
    bufs_free(&b);

    /* An unknown code and no message: ferry's code, a message naming it. */
    r = (rogue){.rc = -999};
    assert_int_equal(get_batch(&ds, 0, 0, idx, 1, &b, &err), FERRY_EBATCH);
    assert_string_equal(err.message, "dataset rogue failed (code -999) without a message");
    bufs_free(&b);

    /* One of ferry's own codes passes through. */
    r = (rogue){.rc = FERRY_ENOMEM, .fill = 'q'};
    assert_int_equal(get_batch(&ds, 0, 0, idx, 1, &b, &err), FERRY_ENOMEM);
    bufs_free(&b);

    ferry__dataset_close(&ds);
    ferry__dataset_close(&ds);
    assert_int_equal(r.closes, 1);
}

/* --- synthetic --- */

static void test_synthetic_content_is_the_byte_function_and_y_is_the_index(void **state)
{
    ferry__dataset ds;
    bufs b;
    /* Scattered, repeated, first and last; dim 37 has a partial last word. */
    const uint64_t idx[] = {999, 0, 500, 3, 3, 998, 17, 1};
    const size_t count = sizeof idx / sizeof idx[0];

    open_ok(&ds, "synthetic:n=1000,dim=37");
    assert_int_equal(ds.length, 1000);
    assert_int_equal(ds.schema.nfields, 2);
    assert_string_equal(ds.schema.fields[0].name, "x");
    assert_int_equal(ds.schema.fields[0].dtype, FERRY_DTYPE_U8);
    assert_int_equal(ds.schema.fields[0].ndim, 1);
    assert_int_equal(ds.schema.fields[0].shape[0], 37);
    assert_string_equal(ds.schema.fields[1].name, "y");
    assert_int_equal(ds.schema.fields[1].dtype, FERRY_DTYPE_I64);
    assert_int_equal(ds.schema.fields[1].ndim, 0);
    assert_int_equal(ds.item_bytes[0], 37);
    assert_int_equal(ds.item_bytes[1], 8);

    get_ok(&ds, 1, 2, idx, count, &b);
    for (size_t k = 0; k < count; k++) {
        const uint8_t *x = (const uint8_t *)b.dst[0] + k * 37;
        int64_t y;
        for (uint64_t j = 0; j < 37; j++)
            assert_int_equal(x[j], ferry__synthetic_byte(idx[k], j));
        memcpy(&y, (const char *)b.dst[1] + k * 8, 8);
        assert_int_equal(y, (int64_t)idx[k]);
    }
    bufs_free(&b);
    ferry__dataset_close(&ds);
}

static void test_synthetic_bytes_differ_between_neighbours(void **state)
{
    int same_item = 0, same_pos = 0;
    for (uint64_t i = 0; i < 64; i++) {
        for (uint64_t j = 0; j < 64; j++) {
            same_item += ferry__synthetic_byte(i, j) == ferry__synthetic_byte(i + 1, j);
            same_pos += ferry__synthetic_byte(i, j) == ferry__synthetic_byte(i, j + 1);
        }
    }
    /* About 4096 / 256 = 16 expected by chance; a pattern would show far more. */
    assert_true(same_item < 64);
    assert_true(same_pos < 64);
}

static void test_synthetic_defaults_and_bare_kind(void **state)
{
    ferry__dataset ds;
    open_ok(&ds, "synthetic");
    assert_int_equal(ds.length, 60000);
    assert_int_equal(ds.item_bytes[0], 784);
    ferry__dataset_close(&ds);
    open_ok(&ds, "synthetic:");
    assert_int_equal(ds.length, 60000);
    ferry__dataset_close(&ds);
}

/* Rows of x for `idx` built in one batch. */
static void augmented_rows(ferry__dataset *ds, uint64_t seed, uint64_t epoch, const uint64_t *idx,
                           size_t count, uint8_t *out)
{
    bufs b;
    get_ok(ds, seed, epoch, idx, count, &b);
    memcpy(out, b.dst[0], count * ds->item_bytes[0]);
    bufs_free(&b);
}

static void test_synthetic_augment_depends_on_seed_epoch_index_only(void **state)
{
    enum { DIM = 21 };
    ferry__dataset ds, other, plain;
    ferry_dataset_ctx ctx = {.seed = 5, .worker_index = 3, .num_workers = 4};
    char errbuf[256];
    const uint64_t idx[] = {4, 17, 99};
    const uint64_t rev[] = {99, 17, 4};
    uint8_t all[3 * DIM], one[DIM], twice[3 * DIM], epoch4[3 * DIM], seed8[3 * DIM], base[3 * DIM];

    open_ok(&ds, "synthetic:n=100,dim=21,augment=1");
    assert_int_equal(ferry__dataset_open(&other, "synthetic:n=100,dim=21,augment=1", &ctx, errbuf,
                                         sizeof errbuf),
                     FERRY_OK);
    open_ok(&plain, "synthetic:n=100,dim=21");

    augmented_rows(&ds, 7, 3, idx, 3, all);
    /* One at a time, in another order, by another worker: same bytes. */
    for (int k = 0; k < 3; k++) {
        augmented_rows(&ds, 7, 3, &idx[k], 1, one);
        assert_memory_equal(one, all + k * DIM, DIM);
    }
    augmented_rows(&other, 7, 3, rev, 3, twice);
    for (int k = 0; k < 3; k++)
        assert_memory_equal(twice + k * DIM, all + (2 - k) * DIM, DIM);

    augmented_rows(&ds, 7, 4, idx, 3, epoch4);
    augmented_rows(&ds, 8, 3, idx, 3, seed8);
    augmented_rows(&plain, 7, 3, idx, 3, base);
    for (int k = 0; k < 3; k++) {
        assert_memory_not_equal(epoch4 + k * DIM, all + k * DIM, DIM);
        assert_memory_not_equal(seed8 + k * DIM, all + k * DIM, DIM);
        assert_memory_not_equal(base + k * DIM, all + k * DIM, DIM);
    }
    ferry__dataset_close(&ds);
    ferry__dataset_close(&other);
    ferry__dataset_close(&plain);
}

static void test_synthetic_cost_us_consumes_cpu_time(void **state)
{
    enum { COUNT = 30, COST_US = 1000 };
    ferry__dataset ds;
    uint64_t idx[COUNT];
    double t0, used;
    bufs b;

    for (int k = 0; k < COUNT; k++)
        idx[k] = (uint64_t)k;
    open_ok(&ds, "synthetic:n=100,dim=8,cost_us=1000");
    t0 = thread_cpu_seconds();
    get_ok(&ds, 0, 0, idx, COUNT, &b);
    used = thread_cpu_seconds() - t0;
    assert_true(used >= COUNT * COST_US * 1e-6 * 0.8);
    bufs_free(&b);
    ferry__dataset_close(&ds);
}

static void test_synthetic_fail_at_reports_index_and_message(void **state)
{
    ferry__dataset ds;
    ferry_dataset_error err;
    bufs b;
    const uint64_t bad[] = {1, 2, 7, 3};
    const uint64_t good[] = {0, 1, 2, 4, 8};

    open_ok(&ds, "synthetic:n=10,dim=4,fail_at=3,fail_at=7");
    assert_int_equal(get_batch(&ds, 0, 0, bad, 4, &b, &err), FERRY_EBATCH);
    assert_int_equal(err.index, 7);
    assert_string_equal(err.message, "synthetic: injected failure at index 7");
    assert_string_equal(ferry_last_error(), err.message);
    bufs_free(&b);
    assert_int_equal(get_batch(&ds, 0, 0, good, 5, &b, &err), FERRY_OK);
    bufs_free(&b);
    ferry__dataset_close(&ds);
}

static void test_synthetic_bad_specs_name_the_key(void **state)
{
    static const struct {
        const char *spec;
        const char *needle;
    } cases[] = {
        {"synthetic:n=0", "n=0"},
        {"synthetic:n=abc", "n=abc"},
        {"synthetic:n=", "n="},
        {"synthetic:n", "'n'"},
        {"synthetic:n=-5", "n=-5"},
        {"synthetic:n=5x", "n=5x"},
        {"synthetic:n= 5", "n= 5"},
        {"synthetic:n=1099511627777", "n=1099511627777"},
        {"synthetic:n=18446744073709551616", "n=18446744073709551616"},
        {"synthetic:dim=0", "dim=0"},
        {"synthetic:dim=1073741825", "dim=1073741825"},
        {"synthetic:cost_us=1.5", "cost_us=1.5"},
        {"synthetic:augment=2", "augment=2"},
        {"synthetic:fail_at=x", "fail_at=x"},
        {"synthetic:n=10,fail_at=10", "fail_at=10"},
        {"synthetic:fail_at=1,fail_at=2,fail_at=3,fail_at=4,fail_at=5,fail_at=6,fail_at=7,"
         "fail_at=8,fail_at=9",
         "fail_at given more than 8"},
        {"synthetic:colour=3", "unknown key 'colour'"},
        {"synthetic: n=5", "unknown key ' n'"},
        {"synthetic:n=5,n=6", "n given more than 1 time"},
        {"synthetic:n=5,,dim=3", "empty option"},
        {"synthetic:n=5,", "empty option"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        expect_open_fails(cases[c].spec, FERRY_EDATASET, "synthetic: ", cases[c].needle, NULL);
}

static void test_synthetic_builds_mnist_sized_epoch_fast(void **state)
{
    enum { BATCH = 500 };
    ferry__dataset ds;
    uint64_t idx[BATCH];
    double t0, mbps;

    open_ok(&ds, "synthetic");
    t0 = thread_cpu_seconds();
    for (uint64_t start = 0; start < ds.length; start += BATCH) {
        bufs b;
        for (int k = 0; k < BATCH; k++)
            idx[k] = start + (uint64_t)k;
        get_ok(&ds, 0, 0, idx, BATCH, &b);
        bufs_free(&b);
    }
    mbps = (double)ds.length * (double)(ds.item_bytes[0] + ds.item_bytes[1]) /
           (thread_cpu_seconds() - t0) / 1e6;
    print_message("synthetic: 60000 x 784 built at %.0f MB/s of CPU time\n", mbps);
    /* Hundreds of MB/s in a plain build; the bound leaves room for sanitizers. */
    assert_true(mbps > 30.0);
    ferry__dataset_close(&ds);
}

/* --- npy --- */

static void write_raw(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(bytes, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_npy_gathers_rows_from_several_files(void **state)
{
    ft_snapshot s;
    ferry__dataset ds;
    char px[300], pf[300], pl[300], spec[1024];
    uint8_t x[6][3];
    float feat[6][2][2];
    int64_t label[6];
    const uint64_t idx[] = {5, 0, 3, 3};
    bufs b;

    ft_begin(&s, 30);
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < 3; k++)
            x[i][k] = (uint8_t)(i * 10 + k);
        for (int k = 0; k < 4; k++)
            feat[i][k / 2][k % 2] = (float)i * 4.0f + (float)k + 0.5f;
        label[i] = -(int64_t)i * 1000000000000LL;
    }
    snprintf(px, sizeof px, "%s/x.npy", s.tmpdir);
    snprintf(pf, sizeof pf, "%s/feat.npy", s.tmpdir);
    snprintf(pl, sizeof pl, "%s/label.npy", s.tmpdir);
    ft_write_npy(px, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (6, 3), }", x, sizeof x);
    ft_write_npy(pf, 2, "{ 'shape' :( 6 ,2, 2, ),\t'fortran_order' :False,\"descr\":'<f4' }", feat,
              sizeof feat);
    ft_write_npy(pl, 3, "{'fortran_order': False, 'descr': '=i8', 'shape': (6L,)}", label,
              sizeof label);
    snprintf(spec, sizeof spec, "npy:%s,%s,lbl=%s", px, pf, pl);

    open_ok(&ds, spec);
    assert_int_equal(ds.length, 6);
    assert_int_equal(ds.schema.nfields, 3);
    assert_string_equal(ds.schema.fields[0].name, "x");
    assert_int_equal(ds.schema.fields[0].dtype, FERRY_DTYPE_U8);
    assert_int_equal(ds.schema.fields[0].ndim, 1);
    assert_int_equal(ds.schema.fields[0].shape[0], 3);
    assert_string_equal(ds.schema.fields[1].name, "feat");
    assert_int_equal(ds.schema.fields[1].dtype, FERRY_DTYPE_F32);
    assert_int_equal(ds.schema.fields[1].ndim, 2);
    assert_int_equal(ds.schema.fields[1].shape[0], 2);
    assert_int_equal(ds.schema.fields[1].shape[1], 2);
    assert_string_equal(ds.schema.fields[2].name, "lbl");
    assert_int_equal(ds.schema.fields[2].dtype, FERRY_DTYPE_I64);
    assert_int_equal(ds.schema.fields[2].ndim, 0);
    assert_int_equal(ds.item_bytes[0], 3);
    assert_int_equal(ds.item_bytes[1], 16);
    assert_int_equal(ds.item_bytes[2], 8);

    get_ok(&ds, 0, 0, idx, 4, &b);
    for (int k = 0; k < 4; k++) {
        assert_memory_equal((char *)b.dst[0] + k * 3, x[idx[k]], 3);
        assert_memory_equal((char *)b.dst[1] + k * 16, feat[idx[k]], 16);
        assert_memory_equal((char *)b.dst[2] + k * 8, &label[idx[k]], 8);
    }
    bufs_free(&b);
    /* Mapped while open, and only then. */
    assert_int_equal(count_maps(s.tmpdir) > 0, 1);
    ferry__dataset_close(&ds);
    assert_int_equal(count_maps(s.tmpdir), 0);

    unlink(px);
    unlink(pf);
    unlink(pl);
    ft_end(&s);
}

/* Rows of 64 KiB or more are pread from the file, not copied out of a
 * mapping: the same bytes come back, the fd is held only while the dataset
 * is open, and a file cut short after open fails the batch that reaches
 * past its end with FERRY_EDATASET naming the item and the file (copying
 * out of a mapping there would kill the worker with SIGBUS). */
static void test_npy_large_rows_are_read_and_a_shrunk_file_is_an_error(void **state)
{
    enum { ROWS = 5, ROW = 70000 };
    ft_snapshot s;
    ferry__dataset ds;
    ferry_dataset_error err;
    char pimg[300], plbl[300], spec[700];
    static uint8_t img[ROWS][ROW];
    int32_t lbl[ROWS];
    const uint64_t idx[] = {4, 0, 2, 2, 1};
    bufs b;

    ft_begin(&s, 30);
    for (int i = 0; i < ROWS; i++) {
        for (int k = 0; k < ROW; k++)
            img[i][k] = (uint8_t)(i * 31 + k * 7 + k / 4096);
        lbl[i] = 100 + i;
    }
    snprintf(pimg, sizeof pimg, "%s/img.npy", s.tmpdir);
    snprintf(plbl, sizeof plbl, "%s/lbl.npy", s.tmpdir);
    ft_write_npy(pimg, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (5, 70000), }", img,
                 sizeof img);
    ft_write_npy(plbl, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }", lbl,
                 sizeof lbl);
    snprintf(spec, sizeof spec, "npy:%s,%s", pimg, plbl);

    int fds = ft_count_fds();
    open_ok(&ds, spec);
    assert_int_equal(ft_count_fds(), fds + 1); /* img's, for pread; lbl's is closed */
    get_ok(&ds, 0, 0, idx, 5, &b);
    for (int k = 0; k < 5; k++) {
        assert_memory_equal((char *)b.dst[0] + (size_t)k * ROW, img[idx[k]], ROW);
        assert_memory_equal((char *)b.dst[1] + k * 4, &lbl[idx[k]], 4);
    }
    bufs_free(&b);

    /* Cut inside item 3: items 0..2 still read, a batch with 3 fails. */
    struct stat st;
    assert_int_equal(stat(pimg, &st), 0);
    off_t data = st.st_size - (off_t)sizeof img;
    assert_int_equal(truncate(pimg, data + 3 * ROW + ROW / 2), 0);
    const uint64_t before[] = {2, 0};
    get_ok(&ds, 0, 0, before, 2, &b);
    assert_memory_equal(b.dst[0], img[2], ROW);
    bufs_free(&b);
    const uint64_t past[] = {1, 3};
    int rc = get_batch(&ds, 0, 0, past, 2, &b, &err);
    assert_int_equal(rc, FERRY_EDATASET);
    assert_int_equal(err.index, 3);
    assert_non_null(strstr(err.message, "item 3"));
    assert_non_null(strstr(err.message, pimg));
    assert_non_null(strstr(err.message, "truncated"));
    bufs_free(&b);

    ferry__dataset_close(&ds);
    assert_int_equal(ft_count_fds(), fds);
    assert_int_equal(count_maps(s.tmpdir), 0);
    unlink(pimg);
    unlink(plbl);
    ft_end(&s);
}

static void test_npy_accepts_every_supported_dtype(void **state)
{
    static const char *const descrs[] = {"|u1", "|i1", "|b1", "<u2", "<i2", "<u4", "<i4",
                                         "<u8", "<i8", "<f2", "<f4", "<f8", "=f8", "<u1"};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8, 8, 1};
    ft_snapshot s;
    char path[300], dict[128], spec[320];
    uint8_t data[3 * 8] = {0};

    ft_begin(&s, 30);
    snprintf(path, sizeof path, "%s/v.npy", s.tmpdir);
    snprintf(spec, sizeof spec, "npy:%s", path);
    for (size_t d = 0; d < sizeof descrs / sizeof descrs[0]; d++) {
        ferry__dataset ds;
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3,), }",
                 descrs[d]);
        ft_write_npy(path, 1, dict, data, 3 * sizes[d]);
        open_ok(&ds, spec);
        assert_int_equal(ds.item_bytes[0], sizes[d]);
        assert_int_equal(ds.schema.fields[0].ndim, 0);
        ferry__dataset_close(&ds);
    }
    unlink(path);
    ft_end(&s);
}

/* One corrupt file per case: how it is written, and what open must say. */
typedef struct bad_npy {
    const char *dict; /* header dict, or NULL: write `raw` as the whole file */
    size_t data_len;  /* bytes of data after the header */
    const char *raw;
    size_t raw_len;
    int code;
    const char *needle;
} bad_npy;

static void test_npy_corrupt_files_fail_with_code_and_path(void **state)
{
#define GOOD_HEAD "'descr': '<f4', 'fortran_order': False"
    static const bad_npy cases[] = {
        {NULL, 0, "\x93NUMPX\x01\x00\x10\x00{}", 12, FERRY_EFORMAT, "bad magic"},
        {NULL, 0, "\x93NU", 3, FERRY_EFORMAT, "bad magic"},
        {NULL, 0, "", 0, FERRY_EFORMAT, "is empty"},
        {NULL, 0, "\x93NUMPY\x01\x00\xff\xff{'descr'", 17, FERRY_EFORMAT,
         "header length 65535 runs past the end"},
        {NULL, 0, "\x93NUMPY\x02\x00\x00\x00\x01\x00{}", 14, FERRY_EFORMAT, "runs past the end"},
        {NULL, 0, "\x93NUMPY\x04\x00\x02\x00{}", 12, FERRY_EFORMAT, "version 4.0"},
        {"{" GOOD_HEAD ", 'shape': (4, 3), }", 47, NULL, 0, FERRY_EFORMAT, "truncated: file has"},
        {"{" GOOD_HEAD ", 'shape': (4, 3), }", 49, NULL, 0, FERRY_EFORMAT,
         "trailing bytes after the data"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 16, NULL, 0, FERRY_EFORMAT,
         "big-endian dtype '>f4'"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }", 16, NULL, 0, FERRY_EFORMAT,
         "fortran_order is True"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (4,), }", 32, NULL, 0, FERRY_EFORMAT,
         "unsupported dtype '<c8'"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (4,), }", 32, NULL, 0, FERRY_EFORMAT,
         "unsupported dtype '|O'"},
        {"{'descr': '<U10', 'fortran_order': False, 'shape': (4,), }", 160, NULL, 0, FERRY_EFORMAT,
         "unsupported dtype '<U10'"},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (4,), }", 16, NULL, 0, FERRY_EFORMAT,
         "unsupported dtype '|f4'"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", 16, NULL, 0,
         FERRY_EFORMAT, "structured"},
        {"{" GOOD_HEAD ", 'shape': (4, x), }", 16, NULL, 0, FERRY_EFORMAT, "malformed shape"},
        {"{" GOOD_HEAD ", 'shape': 4, }", 16, NULL, 0, FERRY_EFORMAT, "malformed shape"},
        {"{" GOOD_HEAD ", 'shape': (-1,), }", 0, NULL, 0, FERRY_EFORMAT, "malformed shape"},
        {"{" GOOD_HEAD ", 'shape': (4,,), }", 16, NULL, 0, FERRY_EFORMAT, "malformed shape"},
        {"{" GOOD_HEAD ", 'shape': (4, 3", 0, NULL, 0, FERRY_EFORMAT, "malformed shape"},
        {"{" GOOD_HEAD ", 'shape': (), }", 4, NULL, 0, FERRY_EFORMAT, "shape has 0 dims"},
        {"{" GOOD_HEAD ", 'shape': (1,1,1,1,1,1,1,1,1), }", 4, NULL, 0, FERRY_EFORMAT,
         "shape has 9 dims"},
        {"{" GOOD_HEAD ", 'shape': (99999999999, 99999999999, 9999999999), }", 0, NULL, 0,
         FERRY_EFORMAT, "too large"},
        {"{" GOOD_HEAD ", }", 0, NULL, 0, FERRY_EFORMAT, "lacks 'shape'"},
        {"{" GOOD_HEAD ", 'shape': (4,), 'extra': 1}", 16, NULL, 0, FERRY_EFORMAT,
         "unexpected header key 'extra'"},
        {"{" GOOD_HEAD ", 'shape': (4,), 'shape': (4,)}", 16, NULL, 0, FERRY_EFORMAT,
         "'shape' given twice"},
        {"{" GOOD_HEAD ", 'shape': (4,)} junk", 16, NULL, 0, FERRY_EFORMAT, "text after"},
        {"[" GOOD_HEAD "]", 16, NULL, 0, FERRY_EFORMAT, "no dict"},
        {"{" GOOD_HEAD ", 'shape': (0,), }", 0, NULL, 0, FERRY_EDATASET, "has no items"},
    };
#undef GOOD_HEAD
    static const uint8_t zeros[256];
    ft_snapshot s;
    char path[300], spec[320];

    ft_begin(&s, 30);
    snprintf(path, sizeof path, "%s/bad.npy", s.tmpdir);
    snprintf(spec, sizeof spec, "npy:%s", path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].dict != NULL)
            ft_write_npy(path, 1, cases[c].dict, zeros, cases[c].data_len);
        else
            write_raw(path, cases[c].raw, cases[c].raw_len);
        expect_open_fails(spec, cases[c].code, path, cases[c].needle, NULL);
        assert_int_equal(count_maps(s.tmpdir), 0);
    }
    unlink(path);
    ft_end(&s);
}

/* A FIFO (or a device) named as an npy file is refused at once: opening
 * it for reading would otherwise block until a writer came. The case's
 * time limit turns a blocking open into a failure. */
static void test_npy_fifo_is_refused_without_blocking(void **state)
{
    (void)state;
    ft_snapshot s;
    char fifo[300], spec[400];
    ft_begin(&s, 10);
    snprintf(fifo, sizeof fifo, "%s/x.npy", s.tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(spec, sizeof spec, "npy:%s", fifo);
    uint64_t t0 = ft_now_ms();
    expect_open_fails(spec, FERRY_EDATASET, fifo, "not a regular file", NULL);
    assert_true(ft_now_ms() - t0 < 1000);
    expect_open_fails("npy:/dev/zero", FERRY_EDATASET, "/dev/zero", "not a regular file", NULL);
    unlink(fifo);
    ft_end(&s);
}

static void test_npy_files_must_agree_and_exist(void **state)
{
    ft_snapshot s;
    char pa[300], pb[300], pmissing[300], spec[1024];
    static const uint8_t zeros[64];

    ft_begin(&s, 30);
    snprintf(pa, sizeof pa, "%s/a.npy", s.tmpdir);
    snprintf(pb, sizeof pb, "%s/b.npy", s.tmpdir);
    snprintf(pmissing, sizeof pmissing, "%s/missing.npy", s.tmpdir);
    ft_write_npy(pa, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (6, 2), }", zeros, 12);
    ft_write_npy(pb, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }", zeros, 5);

    snprintf(spec, sizeof spec, "npy:%s,%s", pa, pb);
    expect_open_fails(spec, FERRY_EDATASET, pa, pb, "has 5 items", "has 6", NULL);
    snprintf(spec, sizeof spec, "npy:%s,%s", pa, pmissing);
    expect_open_fails(spec, FERRY_EDATASET, pmissing, strerror(ENOENT), NULL);
    snprintf(spec, sizeof spec, "npy:%s,%s", pa, pa);
    expect_open_fails(spec, FERRY_EDATASET, "field name 'a' appears twice", NULL);
    snprintf(spec, sizeof spec, "npy:%s,,%s", pa, pa);
    expect_open_fails(spec, FERRY_EDATASET, "empty path", NULL);
    snprintf(spec, sizeof spec, "npy:%s", s.tmpdir);
    expect_open_fails(spec, FERRY_EDATASET, s.tmpdir, "not a regular file", NULL);
    expect_open_fails("npy:", FERRY_EDATASET, "no files given", NULL);

    /* One field per file, at most FERRY_MAX_FIELDS of them. */
    snprintf(spec, sizeof spec, "npy:");
    for (int k = 0; k <= FERRY_MAX_FIELDS; k++)
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%sf%d=%s", k ? "," : "", k, pa);
    expect_open_fails(spec, FERRY_EDATASET, "more than 16 files", NULL);
    assert_int_equal(count_maps(s.tmpdir), 0);

    unlink(pa);
    unlink(pb);
    ft_end(&s);
}

static void test_npy_item_shape_is_validated(void **state)
{
    ft_snapshot s;
    char path[300], spec[320];
    FILE *f;

    ft_begin(&s, 30);
    snprintf(path, sizeof path, "%s/wide.npy", s.tmpdir);
    snprintf(spec, sizeof spec, "npy:%s", path);

    /* Consistent as a file, but an item with a zero dim has no bytes. */
    ft_write_npy(path, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", NULL, 0);
    expect_open_fails(spec, FERRY_EDATASET, "field 'wide' has dim 0 of size 0", NULL);

    /* 2 items of 1 GiB + 4 bytes: a sparse file, so nothing is really written. */
    ft_write_npy(path, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 268435457), }", NULL,
              0);
    f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    assert_int_equal(ftruncate(fileno(f), ftell(f) + 2 * 4 * 268435457L), 0);
    fclose(f);
    expect_open_fails(spec, FERRY_EDATASET, "one item of field 'wide' is larger than 1 GiB", NULL);
    assert_int_equal(count_maps(s.tmpdir), 0);

    unlink(path);
    ft_end(&s);
}

/* --- plugin --- */

#define PLUGIN_SPEC(args) "plugin:" FERRY_TEST_PLUGIN "?" args

/* The test program does not link libm; the plugin does. Taking sinf from the
 * same libm at run time also guarantees both sides compute the same floats. */
typedef float (*sinf_fn)(float);

static sinf_fn libm_sinf(void **dl)
{
    void *sym;
    sinf_fn fn;
    *dl = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(*dl);
    sym = dlsym(*dl, "sinf");
    assert_non_null(sym);
    fn = (sinf_fn)sym;
    return fn;
}

static void test_plugin_values_follow_the_formula(void **state)
{
    ferry__dataset ds;
    const uint64_t idx[] = {0, 7, 49, 7};
    int noisy = 0;
    void *libm;
    sinf_fn sin_f = libm_sinf(&libm);
    bufs b;

    open_ok(&ds, PLUGIN_SPEC("n=50,dim=3"));
    assert_non_null(ds.dl);
    assert_int_equal(ds.length, 50);
    assert_int_equal(ds.schema.nfields, 2);
    assert_string_equal(ds.schema.fields[0].name, "x");
    assert_int_equal(ds.schema.fields[0].dtype, FERRY_DTYPE_F32);
    assert_int_equal(ds.schema.fields[0].shape[0], 3);
    assert_string_equal(ds.schema.fields[1].name, "y");
    assert_int_equal(ds.schema.fields[1].ndim, 0);

    get_ok(&ds, 11, 0, idx, 4, &b);
    for (int r = 0; r < 4; r++) {
        const float *x = (const float *)b.dst[0] + r * 3;
        float y = ((const float *)b.dst[1])[r], sum = 0.0f;
        for (int k = 0; k < 3; k++) {
            float clean = sin_f((float)idx[r] * 0.01f + (float)k);
            assert_true(fabsf(x[k] - clean) <= 0.05f + 1e-6f);
            noisy += x[k] != clean;
            sum += clean;
        }
        assert_true(fabsf(y - sum) <= 1e-5f);
    }
    assert_true(noisy > 6);
    /* Same (seed, epoch, index), same item, whichever row it lands in. */
    assert_memory_equal((const float *)b.dst[0] + 3, (const float *)b.dst[0] + 9, 12);
    bufs_free(&b);
    ferry__dataset_close(&ds);
    dlclose(libm);
}

static void test_plugin_noise_changes_per_epoch_but_not_per_batch(void **state)
{
    ferry__dataset ds;
    const uint64_t idx[] = {3, 8};
    bufs both, alone, next;

    open_ok(&ds, PLUGIN_SPEC("n=10,dim=4"));
    get_ok(&ds, 1, 5, idx, 2, &both);
    get_ok(&ds, 1, 5, &idx[1], 1, &alone);
    get_ok(&ds, 1, 6, idx, 2, &next);
    assert_memory_equal(alone.dst[0], (const float *)both.dst[0] + 4, 16);
    assert_memory_not_equal(next.dst[0], both.dst[0], 16);
    assert_memory_not_equal((const float *)next.dst[0] + 4, (const float *)both.dst[0] + 4, 16);
    /* The target has no noise. */
    assert_memory_equal(next.dst[1], both.dst[1], 8);
    bufs_free(&both);
    bufs_free(&alone);
    bufs_free(&next);
    ferry__dataset_close(&ds);
}

static void test_plugin_defaults_without_args(void **state)
{
    ferry__dataset ds;
    open_ok(&ds, "plugin:" FERRY_TEST_PLUGIN);
    assert_int_equal(ds.length, 1000);
    assert_int_equal(ds.item_bytes[0], 16);
    ferry__dataset_close(&ds);
}

static void test_plugin_load_failures_are_explained(void **state)
{
    ft_snapshot s;

    ft_begin(&s, 30);
    expect_open_fails(PLUGIN_SPEC("n=abc"), FERRY_EDATASET, "plugin " FERRY_TEST_PLUGIN ": ",
                      "n must be", "'abc'", NULL);
    expect_open_fails(PLUGIN_SPEC("dim=0"), FERRY_EDATASET, "dim must be", NULL);
    expect_open_fails(PLUGIN_SPEC("n=5,colour=red"), FERRY_EDATASET, "unknown key 'colour'", NULL);
    expect_open_fails(PLUGIN_SPEC("n"), FERRY_EDATASET, "'n'", NULL);
    expect_open_fails("plugin:/nonexistent/libnope.so", FERRY_EDATASET, "/nonexistent/libnope.so",
                      "cannot open shared object file", NULL);
    expect_open_fails("plugin:libm.so.6", FERRY_EDATASET, "libm.so.6", FERRY_DATASET_PLUGIN_SYMBOL,
                      "undefined symbol", NULL);
    /* glibc's stub libanl is loaded by nothing else here, so the map count
     * shows whether the failed load was undone. */
    expect_open_fails("plugin:libanl.so.1", FERRY_EDATASET, "undefined symbol", NULL);
    assert_int_equal(count_maps("libanl"), 0);
    expect_open_fails("plugin:", FERRY_EDATASET, "no path given", NULL);
    expect_open_fails("plugin:?n=3", FERRY_EDATASET, "no path given", NULL);
    /* Every failure unloaded the plugin again. */
    assert_int_equal(count_maps("libferry_example"), 0);
    ft_end(&s);
}

static void test_plugin_is_unloaded_on_close(void **state)
{
    ft_snapshot s;
    ferry__dataset ds;

    ft_begin(&s, 30);
    for (int k = 0; k < 3; k++) {
        open_ok(&ds, PLUGIN_SPEC("n=5,dim=1"));
        assert_true(count_maps("libferry_example") > 0);
        ferry__dataset_close(&ds);
        assert_int_equal(count_maps("libferry_example"), 0);
    }
    ft_end(&s);
}

/* Whether the shared object at `path` is loaded in this process (RTLD_NOLOAD
 * loads nothing; the reference it takes is given back). */
static int is_loaded(const char *path)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (dl != NULL)
        dlclose(dl);
    return dl != NULL;
}

static void test_plugin_with_a_bad_table_is_refused_and_unloaded(void **state)
{
    static const struct {
        const char *path;
        int code;
        const char *says;
    } cases[] = {
        {FERRY_TEST_BROKEN_ABI, FERRY_EVERSION, "has ABI version 3, this ferry supports 1..2"},
        {FERRY_TEST_BROKEN_NO_TABLE, FERRY_EDATASET,
         "ferry_dataset_plugin() returned no ops table"},
        {FERRY_TEST_BROKEN_NO_GET_BATCH, FERRY_EDATASET, "ops table lacks get_batch()"},
    };
    ft_snapshot s;
    char spec[4096];

    ft_begin(&s, 30);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(spec, sizeof spec, "plugin:%s?n=3", cases[k].path);
        expect_open_fails(spec, cases[k].code, cases[k].path, cases[k].says, NULL);
        assert_false(is_loaded(cases[k].path));
    }
    ft_end(&s);
}

/* FERRY__DATASET_KEEP_LOADED keeps a plugin whose own open failed loaded (a
 * worker's plugin may have started threads by then). This leaves the hostile
 * plugin in this process for good; no other case here uses it. */
static void test_keep_loaded_plugin_stays_after_its_open_fails(void **state)
{
    ferry__dataset ds;
    char errbuf[1024];
    int rc;

    assert_false(is_loaded(FERRY_TEST_HOSTILE));
    rc = ferry__dataset_open_flags(&ds, "plugin:" FERRY_TEST_HOSTILE "?bogus", NULL,
                                   FERRY__DATASET_KEEP_LOADED, errbuf, sizeof errbuf);
    assert_int_equal(rc, FERRY_EDATASET);
    assert_non_null(strstr(errbuf, "plugin " FERRY_TEST_HOSTILE ": hostile: 'bogus' has no '='"));
    assert_true(is_zero(&ds, sizeof ds));
    assert_true(is_loaded(FERRY_TEST_HOSTILE));
}

/* Relative file paths in a spec are made absolute against the working
 * directory; absolute ones, a plugin's bare file name (dlopen searches for
 * it) and specs of kinds without files are left as they are. */
static void test_relative_paths_are_made_absolute(void **state)
{
    (void)state;
    char cwd[1024], want[4096], out[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    static const struct {
        const char *spec, *want; /* %1$s: the working directory */
    } cases[] = {
        {"npy:x.npy", "npy:%1$s/x.npy"},
        {"npy:img=data/x.npy,/abs/y.npy,lbl=./z.npy", "npy:img=%1$s/data/x.npy,/abs/y.npy,lbl=%1$s/./z.npy"},
        {"npy:sub/x=1.npy", "npy:%1$s/sub/x=1.npy"},
        {"plugin:libmine.so?a=b/c", "plugin:libmine.so?a=b/c"},
        {"plugin:build/libmine.so?a=b", "plugin:%1$s/build/libmine.so?a=b"},
        {"plugin:/opt/libmine.so", "plugin:/opt/libmine.so"},
        {"synthetic:n=10,dim=3", "synthetic:n=10,dim=3"},
        {"python:pkg.mod:Cls {\"path\": \"rel\"}", "python:pkg.mod:Cls {\"path\": \"rel\"}"},
        {"npy:", "npy:"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(want, sizeof want, cases[c].want, cwd);
#pragma GCC diagnostic pop
        assert_int_equal(ferry__dataset_absolute(cases[c].spec, out, sizeof out), 0);
        assert_string_equal(out, want);
    }
    /* "npy:" + cwd + "/a.npy" needs strlen(cwd) + 11 bytes with its NUL. */
    FT_EXPECT_ERROR(ferry__dataset_absolute("npy:a.npy", out, strlen(cwd) + 10), FERRY_EINVAL,
                    "option 'dataset'", "relative paths", NULL);
    assert_int_equal(ferry__dataset_absolute("npy:a.npy", out, strlen(cwd) + 11), 0);
    char small[11];
    assert_int_equal(ferry__dataset_absolute("npy:/a.npy", small, sizeof small), 0);
    assert_string_equal(small, "npy:/a.npy");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_kind_lists_the_known_ones),
        cmocka_unit_test(test_registered_kind_opens_and_bad_ones_are_refused),
        cmocka_unit_test(test_close_is_safe_on_zeroed_and_twice),
        cmocka_unit_test(test_get_batch_on_closed_dataset_is_einval),
        cmocka_unit_test(test_index_out_of_range_names_the_index),
        cmocka_unit_test(test_get_batch_repairs_a_misbehaving_dataset),
        cmocka_unit_test(test_synthetic_content_is_the_byte_function_and_y_is_the_index),
        cmocka_unit_test(test_synthetic_bytes_differ_between_neighbours),
        cmocka_unit_test(test_synthetic_defaults_and_bare_kind),
        cmocka_unit_test(test_synthetic_augment_depends_on_seed_epoch_index_only),
        cmocka_unit_test(test_synthetic_cost_us_consumes_cpu_time),
        cmocka_unit_test(test_synthetic_fail_at_reports_index_and_message),
        cmocka_unit_test(test_synthetic_bad_specs_name_the_key),
        cmocka_unit_test(test_synthetic_builds_mnist_sized_epoch_fast),
        cmocka_unit_test(test_npy_gathers_rows_from_several_files),
        cmocka_unit_test(test_npy_large_rows_are_read_and_a_shrunk_file_is_an_error),
        cmocka_unit_test(test_npy_accepts_every_supported_dtype),
        cmocka_unit_test(test_npy_corrupt_files_fail_with_code_and_path),
        cmocka_unit_test(test_npy_files_must_agree_and_exist),
        cmocka_unit_test(test_relative_paths_are_made_absolute),
        cmocka_unit_test(test_npy_fifo_is_refused_without_blocking),
        cmocka_unit_test(test_npy_item_shape_is_validated),
        cmocka_unit_test(test_plugin_values_follow_the_formula),
        cmocka_unit_test(test_plugin_noise_changes_per_epoch_but_not_per_batch),
        cmocka_unit_test(test_plugin_defaults_without_args),
        cmocka_unit_test(test_plugin_load_failures_are_explained),
        cmocka_unit_test(test_plugin_is_unloaded_on_close),
        cmocka_unit_test(test_plugin_with_a_bad_table_is_refused_and_unloaded),
        cmocka_unit_test(test_keep_loaded_plugin_stays_after_its_open_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
