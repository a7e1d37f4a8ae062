/*
 * test_concat.c - the concat dataset kind (core/datasets/concat.c): C
 * datasets end to end, what option mix draws from when the sources are C
 * datasets. Items are checked byte for byte against their source's own
 * (synthetic: item i's y is i, its x a function of i); a batch of several
 * sources, of one, a source's failure, bad specs, relative paths.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dataset.h"
#include "harness.h"

#define SPEC "concat:synthetic:n=10,dim=4|synthetic:n=3,dim=4|synthetic:n=5,dim=4,fail_at=4"
static const uint64_t offset[] = {0, 10, 13, 18};

static void open_ok(ferry__dataset *ds, const char *spec)
{
    char errbuf[1024];
    int rc = ferry__dataset_open(ds, spec, NULL, errbuf, sizeof errbuf);
    if (rc != FERRY_OK)
        print_error("open %s: %s\n", spec, errbuf);
    assert_int_equal(rc, FERRY_OK);
}

/* Builds the batch idx[0..n) and checks each item against its source's. */
static int build(ferry__dataset *ds, const uint64_t *idx, size_t n, ferry_dataset_error *err)
{
    uint8_t *x = NULL;
    int64_t *y = NULL;
    assert_int_equal(posix_memalign((void **)&x, 64, n * 4 + 64), 0);
    assert_int_equal(posix_memalign((void **)&y, 64, n * 8 + 64), 0);
    void *dst[2] = {x, y};
    ferry_batch_request req = {.indices = idx, .count = n, .seed = 1};
    int rc = ferry__dataset_get_batch(ds, &req, dst, err);
    for (size_t j = 0; rc == FERRY_OK && j < n; j++) {
        int k = idx[j] >= offset[2] ? 2 : idx[j] >= offset[1] ? 1 : 0;
        uint64_t local = idx[j] - offset[k];
        assert_int_equal(y[j], (int64_t)local);
        for (uint64_t b = 0; b < 4; b++)
            assert_int_equal(x[j * 4 + b], ferry__synthetic_byte(local, b));
    }
    free(x);
    free(y);
    return rc;
}

static void test_a_batch_of_several_sources_holds_each_item_in_its_place(void **unused)
{
    (void)unused;
    ferry__dataset ds;
    ferry_dataset_error err;
    open_ok(&ds, SPEC);
    assert_int_equal(ds.length, 18);
    assert_int_equal(ds.schema.nfields, 2);
    const uint64_t mixed[] = {10, 0, 12, 14, 3, 11, 16, 9, 13, 10}; /* (17 fails) */
    assert_int_equal(build(&ds, mixed, 10, &err), FERRY_OK);
    const uint64_t one[] = {16, 13, 15}; /* one source's: built in place */
    assert_int_equal(build(&ds, one, 3, &err), FERRY_OK);
    const uint64_t first[] = {9, 0};
    assert_int_equal(build(&ds, first, 2, &err), FERRY_OK);
    ferry__dataset_close(&ds);
}

static void test_a_source_s_failure_names_the_batch_s_index_and_the_source(void **unused)
{
    (void)unused;
    ferry__dataset ds;
    ferry_dataset_error err;
    open_ok(&ds, SPEC);
    const uint64_t idx[] = {1, 17, 12};
    assert_int_equal(build(&ds, idx, 3, &err), FERRY_EBATCH);
    assert_int_equal(err.index, 17); /* source 2's item 4 */
    assert_non_null(strstr(err.message, "concat: source 2: synthetic: injected failure at index 4"));
    const uint64_t good[] = {1, 16};
    assert_int_equal(build(&ds, good, 2, &err), FERRY_OK); /* and the next batch is whole */
    ferry__dataset_close(&ds);
}

static void test_bad_concat_specs_are_refused_by_name_leaving_nothing_open(void **unused)
{
    (void)unused;
    static const struct {
        const char *spec, *why;
    } bad[] = {
        {"concat:", "2..1024 dataset specs"},
        {"concat:synthetic:n=3", "2..1024 dataset specs"},
        {"concat:synthetic:n=3,dim=4|synthetic:n=3,dim=5", "the sources must have the same"},
        {"concat:synthetic:n=3|concat:synthetic:n=3|synthetic:n=2", "a concat itself"},
        {"concat:synthetic:n=3|npy:/nonexistent/x.npy", "source 1 (npy:/nonexistent/x.npy)"},
        {"concat:synthetic:n=3|bogus:1", "source 1 (bogus:1): unknown dataset kind"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry__dataset ds;
        char errbuf[1024];
        int fds = ft_count_fds();
        int rc = ferry__dataset_open(&ds, bad[i].spec, NULL, errbuf, sizeof errbuf);
        assert_int_not_equal(rc, FERRY_OK);
        if (!strstr(errbuf, bad[i].why))
            fail_msg("%s: \"%s\" does not say \"%s\"", bad[i].spec, errbuf, bad[i].why);
        assert_int_equal(ft_count_fds(), fds);
    }
}

static void test_each_source_s_relative_paths_are_made_absolute(void **unused)
{
    (void)unused;
    char cwd[1024], want[4096], out[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "concat:npy:%s/a.npy|synthetic:n=3|npy:v=%s/d/b.npy,/abs/c.npy",
             cwd, cwd);
    assert_int_equal(ferry__dataset_absolute("concat:npy:a.npy|synthetic:n=3|npy:v=d/b.npy,"
                                             "/abs/c.npy",
                                             out, sizeof out),
                     FERRY_OK);
    assert_string_equal(out, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_batch_of_several_sources_holds_each_item_in_its_place),
        cmocka_unit_test(test_a_source_s_failure_names_the_batch_s_index_and_the_source),
        cmocka_unit_test(test_bad_concat_specs_are_refused_by_name_leaving_nothing_open),
        cmocka_unit_test(test_each_source_s_relative_paths_are_made_absolute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
