/*
 * test_layout.c - where a batch's fields lie (core/layout.c), by itself: a
 * pure function of the schema, the item count and the bytes' start, so
 * every case is checked exactly, with no worker and no socket.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "layout.h"

/* "x": float32 (3,); "y": int64 (); "t": uint8 of variable shape; "m":
 * uint16 (2, 5). */
static ferry_dataset_schema schema(size_t item_bytes[])
{
    ferry_dataset_schema s = {.nfields = 4};
    strcpy(s.fields[0].name, "x");
    s.fields[0].dtype = FERRY_DTYPE_F32;
    s.fields[0].ndim = 1;
    s.fields[0].shape[0] = 3;
    strcpy(s.fields[1].name, "y");
    s.fields[1].dtype = FERRY_DTYPE_I64;
    s.fields[1].ndim = 0;
    strcpy(s.fields[2].name, "t");
    s.fields[2].dtype = FERRY_DTYPE_U8;
    s.fields[2].ndim = FERRY_NDIM_VAR;
    strcpy(s.fields[3].name, "m");
    s.fields[3].dtype = FERRY_DTYPE_U16;
    s.fields[3].ndim = 2;
    s.fields[3].shape[0] = 2;
    s.fields[3].shape[1] = 5;
    size_t bytes[4] = {12, 8, 0, 20};
    memcpy(item_bytes, bytes, sizeof bytes);
    return s;
}

/* Fixed fields one after another from the first 64-byte boundary, each
 * item_bytes * count long and 64-byte aligned; a variable field takes no
 * room yet; what a frame needs covers any lead. */
static void test_fixed_fields_lie_aligned_one_after_another(void **state)
{
    (void)state;
    size_t ib[4];
    ferry_dataset_schema s = schema(ib);
    _Alignas(64) unsigned char buf[1024];
    for (size_t shift = 0; shift < 64; shift += 13) {
        unsigned char *base = buf + shift;
        ferry__batch_hdr h;
        ferry__layout_fixed(&s, ib, 7, base, &h);
        size_t lead = ferry__layout_lead(base);
        assert_int_equal((uintptr_t)(base + lead) % 64, 0);
        assert_true(lead < 64);
        assert_int_equal(h.count, 7);
        assert_int_equal(h.nfields, 4);
        assert_int_equal(h.fields[0].offset, lead);
        assert_int_equal(h.fields[0].nbytes, 84);
        assert_int_equal(h.fields[0].ndim, 2);
        assert_int_equal(h.fields[0].shape[0], 7);
        assert_int_equal(h.fields[0].shape[1], 3);
        assert_int_equal(h.fields[1].offset, lead + 128); /* 84 rounded up */
        assert_int_equal(h.fields[1].nbytes, 56);
        assert_int_equal(h.fields[1].ndim, 1);
        assert_int_equal(h.fields[2].var, 1);
        assert_int_equal(h.fields[3].offset, lead + 192);
        assert_int_equal(h.fields[3].nbytes, 140);
        assert_int_equal(h.fields[3].shape[2], 5);
        assert_string_equal(h.fields[3].name, "m");
        assert_int_equal(h.fields[3].dtype, FERRY_DTYPE_U16);
        for (int f = 0; f < 4; f++)
            if (!h.fields[f].var)
                assert_int_equal((uintptr_t)(base + h.fields[f].offset) % 64, 0);
        assert_int_equal(ferry__layout_fixed_bytes(&s, ib, 7), 128 + 64 + 192);
        assert_int_equal(ferry__layout_frame_bytes(&s, ib, 7), 64 + 128 + 64 + 192);
        assert_true(ferry__layout_fits(&s, ib, 7, base, lead + 384));
        assert_false(ferry__layout_fits(&s, ib, 7, base, lead + 383));
    }
}

/* A batch of one item and a full one: the sizes scale with the count. */
static void test_sizes_follow_the_count(void **state)
{
    (void)state;
    size_t ib[4];
    ferry_dataset_schema s = schema(ib);
    assert_int_equal(ferry__layout_fixed_bytes(&s, ib, 1), 64 * 3);
    assert_int_equal(ferry__layout_fixed_bytes(&s, ib, 1024), 12288 + 8192 + 20480);
}

/* Variable fields: their shapes as filled, their bytes each from a 64-byte
 * boundary, placed after the fixed ones in schema order. */
static void test_variable_fields_follow_the_fixed_ones(void **state)
{
    (void)state;
    size_t ib[4];
    ferry_dataset_schema s = schema(ib);
    ferry_dataset_schema two = s;
    two.nfields = 4;
    two.fields[0].ndim = FERRY_NDIM_VAR; /* x variable too */
    _Alignas(64) unsigned char buf[64] = {0};
    ferry__batch_hdr h;
    ferry__layout_fixed(&two, ib, 2, buf, &h);
    unsigned char data[1];
    ferry_var_field var[4] = {0};
    var[0] = (ferry_var_field){.data = data, .ndim = 2, .shape = {2, 70}};
    var[2] = (ferry_var_field){.data = data, .ndim = 1, .shape = {5}};
    size_t total = 0;
    char why[256];
    assert_int_equal(ferry__layout_var_sizes(&h, var, &total, why, sizeof why), FERRY_OK);
    assert_int_equal(h.fields[0].nbytes, 2 * 70 * 4);
    assert_int_equal(h.fields[2].nbytes, 5);
    assert_int_equal(total, 576 + 64);
    size_t fixed_end = ferry__layout_fixed_bytes(&two, ib, 2);
    assert_int_equal(ferry__layout_place_var(&h, fixed_end), fixed_end + 640);
    assert_int_equal(h.fields[0].offset, fixed_end);
    assert_int_equal(h.fields[2].offset, fixed_end + 576);
    assert_int_equal(h.fields[0].shape[1], 70);
}

/* What no batch can hold is refused saying which field and why. */
static void test_a_variable_field_no_batch_holds_is_refused(void **state)
{
    (void)state;
    size_t ib[4];
    ferry_dataset_schema s = schema(ib);
    ferry__batch_hdr h;
    _Alignas(64) unsigned char buf[64] = {0};
    unsigned char data[1];
    char why[256];
    size_t total;
    ferry_var_field cases[3] = {
        {.data = NULL, .ndim = 1, .shape = {3}},
        {.data = data, .ndim = 1, .shape = {0}},
        {.data = data, .ndim = FERRY_MAX_DIMS + 1},
    };
    for (int c = 0; c < 3; c++) {
        ferry__layout_fixed(&s, ib, 1, buf, &h);
        ferry_var_field var[4] = {0};
        var[2] = cases[c];
        assert_int_equal(ferry__layout_var_sizes(&h, var, &total, why, sizeof why), FERRY_EBATCH);
        assert_non_null(strstr(why, "field 't' of variable shape"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_fields_lie_aligned_one_after_another),
        cmocka_unit_test(test_sizes_follow_the_count),
        cmocka_unit_test(test_variable_fields_follow_the_fixed_ones),
        cmocka_unit_test(test_a_variable_field_no_batch_holds_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
