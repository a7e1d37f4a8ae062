/*
 * test_protocol.c - the wire protocol's encoder and strict decoder
 * (transport/protocol.c).
 *
 * What is proved: every message type survives encode -> decode unchanged,
 * including the largest legal values; every decoding rule rejects the one
 * thing it is about (the bad frames are built by re-packing a valid message
 * with one change, or by packing a map by hand); the encoder refuses what the
 * decoder would refuse and never writes past its buffer; payload checks
 * cannot be fooled by arithmetic that wraps; and the decoder survives random
 * and mutated input. Every decode reads from a heap buffer of exactly the
 * frame's size, so an overread shows up under ASan or valgrind.
 *
 * No processes, sockets or threads: pure functions over buffers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <msgpack.h>

#include "error.h"
#include "protocol.h"
#include "seal.h"
#include "zsock.h"

static const ferry__msg_type all_types[] = {
    FERRY__MSG_HELLO, FERRY__MSG_CONFIG,    FERRY__MSG_READY, FERRY__MSG_TASK, FERRY__MSG_BATCH,
    FERRY__MSG_FAIL,  FERRY__MSG_HEARTBEAT, FERRY__MSG_STOP,  FERRY__MSG_BYE,  FERRY__MSG_REFUSE,
};
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
#define NTYPES COUNT_OF(all_types)
/* A byte-string literal and its length, without the terminating NUL. */
#define BYTES(s) (s), sizeof(s) - 1

/* ---------------------------------------------------------------------------
 * Helpers
 */

/* Fails unless rc == code and ferry_last_error() contains `word`. */
#define expect_error(rc, code, word, ctx)                                                          \
    expect_error_at((rc), (code), (word), (ctx), __FILE__, __LINE__)

static void expect_error_at(int rc, int code, const char *word, const char *ctx, const char *file,
                            int line)
{
    if (rc == code && strstr(ferry_last_error(), word) != NULL)
        return;
    print_error("%s: got %s \"%s\", want %s mentioning \"%s\"\n", ctx, ferry_err_name(rc),
                ferry_last_error(), ferry_err_name(code), word);
    _fail(file, line);
}

/* Decodes from a heap copy of exactly `len` bytes so reading past the frame
 * is caught by the sanitizers. */
static int decode_exact(const void *bytes, size_t len, ferry__msg *out)
{
    char *copy = malloc(len > 0 ? len : 1);
    assert_non_null(copy);
    if (len > 0)
        memcpy(copy, bytes, len);
    /* Poisoned, so a byte the decoder promises to write but does not
     * shows in assert_msg_equal. */
    memset(out, 0xa5, sizeof *out);
    int rc = ferry__msg_decode(copy, len, out);
    free(copy);
    return rc;
}

/* The bytes of m's body the decoder defines: its whole struct, but for
 * an array of maps only the elements within its length. */
static size_t defined_bytes(const ferry__msg *m)
{
    switch (m->type) {
    case FERRY__MSG_HELLO:
        return sizeof m->u.hello;
    case FERRY__MSG_CONFIG:
        return sizeof m->u.config;
    case FERRY__MSG_READY:
        return offsetof(ferry__ready, schema.fields) +
               m->u.ready.schema.nfields * sizeof m->u.ready.schema.fields[0];
    case FERRY__MSG_TASK:
        return sizeof m->u.task;
    case FERRY__MSG_BATCH:
        return offsetof(ferry__batch_hdr, fields) +
               m->u.batch.nfields * sizeof m->u.batch.fields[0];
    case FERRY__MSG_FAIL:
        return sizeof m->u.fail;
    case FERRY__MSG_REFUSE:
        return sizeof m->u.refuse;
    case FERRY__MSG_BYE:
        return sizeof m->u.bye;
    default:
        return 0;
    }
}

/* got is want as decoded: same type, same defined bytes (string tails,
 * unused dims and padding included, all zero in want). */
static void assert_msg_equal(const ferry__msg *want, const ferry__msg *got)
{
    assert_int_equal(got->type, want->type);
    assert_memory_equal(&want->u, &got->u, defined_bytes(want));
}

static size_t encode_ok(const ferry__msg *m, char *buf, size_t cap)
{
    size_t len = 0;
    int rc = ferry__msg_encode(m, buf, cap, &len);
    if (rc != FERRY_OK)
        print_error("encode %s: %s\n", ferry__msg_name((int)m->type), ferry_last_error());
    assert_int_equal(rc, FERRY_OK);
    assert_true(len > 0 && len <= cap && len <= FERRY__HDR_MAX);
    return len;
}

static void set_str(char *dst, size_t len, char c)
{
    memset(dst, c, len);
    dst[len] = '\0';
}

/* What shape and dtype say a field's size is (the test's own arithmetic). */
static uint64_t field_size(const ferry__field_desc *f)
{
    uint64_t n = ferry_dtype_size((int)f->dtype);
    for (int d = 0; d < f->ndim; d++)
        n *= (uint64_t)f->shape[d];
    return n;
}

static void set_field(ferry__field_desc *f, const char *name, ferry_dtype dtype,
                      const int64_t *shape, int ndim, uint64_t offset)
{
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->ndim = ndim;
    memcpy(f->shape, shape, (size_t)ndim * sizeof shape[0]);
    f->offset = offset;
    f->nbytes = field_size(f);
}

/* ---------------------------------------------------------------------------
 * Sample messages: TYPICAL has ordinary non-trivial values (slot -1, a
 * two-field batch and schema); EXTREME has the largest legal ones (uint32
 * and uint64 max, INT32_MIN codes, strings one byte short of their buffers,
 * 16 fields of 8 dims, a schema of 16 fields of 7 dims).
 */

enum { TYPICAL, EXTREME };

static void sample_batch(ferry__batch_hdr *b, int variant)
{
    if (variant == TYPICAL) {
        static const int64_t xs[] = {4, 3, 2}, ys[] = {4};
        b->id = 9;
        b->make_ns = 1234567;
        b->count = 4;
        b->nfields = 2;
        set_field(&b->fields[0], "x", FERRY_DTYPE_F32, xs, 3, 0);   /* 96 bytes */
        set_field(&b->fields[1], "y", FERRY_DTYPE_I64, ys, 1, 128); /* 32 bytes */
        return;
    }
    b->id = UINT64_MAX;
    b->make_ns = UINT64_MAX;
    b->shm = 1;
    b->count = FERRY__MAX_BATCH;
    b->nfields = FERRY_MAX_FIELDS;
    for (int i = 0; i < FERRY_MAX_FIELDS; i++) {
        /* 2^20 * 64^6 * 1 * 8 bytes = 2^59: large but no overflow. */
        const int64_t shape[FERRY_MAX_DIMS] = {FERRY__MAX_BATCH, 64, 64, 64, 64, 64, 64, 1};
        char name[FERRY_NAME_MAX];
        set_str(name, FERRY_NAME_MAX - 1, 'n');
        name[0] = (char)('a' + i);
        set_field(&b->fields[i], name, (ferry_dtype)(1 + i % 12), shape, FERRY_MAX_DIMS,
                  UINT64_MAX - (uint64_t)(i + 1) * (UINT64_C(1) << 60));
    }
}

static void set_item_field(ferry__item_field *f, const char *name, ferry_dtype dtype,
                           const int64_t *shape, int ndim)
{
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->ndim = ndim;
    if (ndim > 0)
        memcpy(f->shape, shape, (size_t)ndim * sizeof shape[0]);
}

/* The typical schema: x, f4 items of [28, 28]; y, one i64 per item. The
 * extreme one: 16 fields with 63-byte names and 7 dims, the last as large
 * as an 8-byte dtype allows. */
static void sample_schema(ferry__schema *sc, int variant)
{
    if (variant == TYPICAL) {
        static const int64_t xs[] = {28, 28};
        sc->nfields = 2;
        set_item_field(&sc->fields[0], "x", FERRY_DTYPE_F32, xs, 2);
        set_item_field(&sc->fields[1], "y", FERRY_DTYPE_I64, NULL, 0);
        return;
    }
    /* The largest item a READY may announce is 1 GiB; dtypes here are at
     * most 8 bytes. */
    const int64_t shape[FERRY_MAX_DIMS - 1] = {1, 1, 1, 1, 1, 1,
                                               (int64_t)(FERRY__ITEM_BYTES_MAX / 8)};
    sc->nfields = FERRY_MAX_FIELDS;
    for (int i = 0; i < FERRY_MAX_FIELDS; i++) {
        char name[FERRY_NAME_MAX];
        set_str(name, FERRY_NAME_MAX - 1, 'n');
        name[0] = (char)('a' + i);
        set_item_field(&sc->fields[i], name, (ferry_dtype)(1 + i % 12), shape, FERRY_MAX_DIMS - 1);
    }
}

static void sample(ferry__msg *m, ferry__msg_type type, int variant)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    int ext = variant == EXTREME;
    switch (type) {
    case FERRY__MSG_HELLO:
        m->u.hello.version = ext ? UINT32_MAX : FERRY_PROTOCOL_VERSION;
        m->u.hello.pid = ext ? UINT32_MAX : 4242;
        m->u.hello.slot = ext ? INT32_MAX : -1;
        if (ext) {
            set_str(m->u.hello.host, FERRY__HOST_MAX - 1, 'h');
            set_str(m->u.hello.program, FERRY__PROGRAM_MAX - 1, 'p');
        } else {
            strcpy(m->u.hello.host, "node-17.cluster");
            strcpy(m->u.hello.program, "ferry-worker 0.1.0");
        }
        break;
    case FERRY__MSG_CONFIG:
        if (ext)
            set_str(m->u.config.dataset, FERRY__SPEC_MAX - 1, 'd');
        else
            strcpy(m->u.config.dataset, "npy:train_x.npy,train_y.npy");
        m->u.config.worker_index = ext ? UINT32_MAX - 1 : 2;
        m->u.config.num_workers = ext ? UINT32_MAX : 4;
        m->u.config.seed = ext ? UINT64_MAX : 1234;
        m->u.config.credits = ext ? FERRY__MAX_CREDITS : 2;
        m->u.config.heartbeat_ms = ext ? UINT32_MAX : 500;
        m->u.config.liveness = ext ? 1000 : 3;
        m->u.config.max_message = ext ? INT64_MAX : UINT64_C(1) << 31;
        break;
    case FERRY__MSG_READY:
        /* The error form of READY: test_ready_with_error_..._round_trip. */
        m->u.ready.length = UINT64_MAX;
        sample_schema(&m->u.ready.schema, variant);
        break;
    case FERRY__MSG_TASK:
        m->u.task.id = UINT64_MAX;
        m->u.task.epoch = ext ? UINT64_MAX : 3;
        m->u.task.batch_in_epoch = ext ? UINT64_MAX : 17;
        m->u.task.seq = ext ? UINT64_MAX : UINT64_MAX - 1;
        m->u.task.count = ext ? FERRY__MAX_BATCH : 256;
        m->u.task.shm_offset = ext ? INT64_MAX : 0;
        m->u.task.shm_bytes = ext ? INT64_MAX : 0;
        break;
    case FERRY__MSG_BATCH:
        sample_batch(&m->u.batch, variant);
        break;
    case FERRY__MSG_FAIL:
        m->u.fail.id = ext ? UINT64_MAX : 5;
        m->u.fail.code = ext ? INT32_MIN : FERRY_EBATCH;
        m->u.fail.index = UINT64_MAX;
        if (ext)
            set_str(m->u.fail.message, FERRY__TEXT_MAX - 1, 'm');
        else
            strcpy(m->u.fail.message, "cannot read item 7: Input/output error");
        break;
    case FERRY__MSG_REFUSE:
        m->u.refuse.version = ext ? UINT32_MAX : FERRY_PROTOCOL_VERSION;
        if (ext)
            set_str(m->u.refuse.reason, FERRY__TEXT_MAX - 1, 'r');
        else
            strcpy(m->u.refuse.reason, "protocol version 4 worker, version 3 loader");
        break;
    case FERRY__MSG_BYE: /* typical: the plain BYE; extreme: a retirement's */
        if (ext)
            m->u.bye = (ferry__bye){.retired = FERRY__RETIRE_BATCHES,
                                    .rss = UINT64_MAX,
                                    .batches = UINT64_MAX};
        break;
    case FERRY__MSG_HEARTBEAT:
    case FERRY__MSG_STOP:
        break;
    }
}

/* ---------------------------------------------------------------------------
 * Crafting bad frames: re-pack a valid message with one change
 */

typedef enum { M_REPLACE, M_DROP, M_DUP, M_ADD } mut_op;

/* `path` names a value by keys and array indices ("fields.1.shape.0"). For
 * M_ADD it names the new key ("fields.0.bogus" adds "bogus" to field 0). */
typedef struct mutation {
    const char *path;
    mut_op op;
    msgpack_object val; /* M_REPLACE, M_ADD */
} mutation;

static void child_path(char *out, size_t cap, const char *parent, const char *name, size_t n)
{
    if (parent[0] == '\0')
        snprintf(out, cap, "%.*s", (int)n, name);
    else
        snprintf(out, cap, "%s.%.*s", parent, (int)n, name);
}

/* Whether `path` is the map that M_ADD's path adds to. */
static int is_add_target(const mutation *mu, const char *path)
{
    if (mu->op != M_ADD)
        return 0;
    const char *dot = strrchr(mu->path, '.');
    size_t plen = dot ? (size_t)(dot - mu->path) : 0;
    return strlen(path) == plen && strncmp(path, mu->path, plen) == 0;
}

static void repack(msgpack_packer *pk, const msgpack_object *o, const char *path,
                   const mutation *mu, int *applied)
{
    char sub[160];
    if (mu->op == M_REPLACE && strcmp(path, mu->path) == 0) {
        msgpack_pack_object(pk, mu->val);
        (*applied)++;
        return;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            char idx[16];
            snprintf(idx, sizeof idx, "%u", (unsigned)i);
            child_path(sub, sizeof sub, path, idx, strlen(idx));
            repack(pk, &o->via.array.ptr[i], sub, mu, applied);
        }
        return;
    }
    if (o->type != MSGPACK_OBJECT_MAP) {
        msgpack_pack_object(pk, *o);
        return;
    }
    const msgpack_object_map *map = &o->via.map;
    size_t n = map->size + (size_t)is_add_target(mu, path);
    for (uint32_t i = 0; i < map->size; i++) {
        child_path(sub, sizeof sub, path, map->ptr[i].key.via.str.ptr,
                   map->ptr[i].key.via.str.size);
        if (strcmp(sub, mu->path) == 0 && mu->op == M_DUP)
            n++;
        else if (strcmp(sub, mu->path) == 0 && mu->op == M_DROP)
            n--;
    }
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < map->size; i++) {
        child_path(sub, sizeof sub, path, map->ptr[i].key.via.str.ptr,
                   map->ptr[i].key.via.str.size);
        int match = strcmp(sub, mu->path) == 0;
        if (match && mu->op == M_DROP) {
            (*applied)++;
            continue;
        }
        int copies = match && mu->op == M_DUP ? 2 : 1;
        for (int c = 0; c < copies; c++) {
            msgpack_pack_object(pk, map->ptr[i].key);
            repack(pk, &map->ptr[i].val, sub, mu, applied);
        }
        if (copies == 2)
            (*applied)++;
    }
    if (is_add_target(mu, path)) {
        const char *dot = strrchr(mu->path, '.');
        const char *key = dot ? dot + 1 : mu->path;
        msgpack_pack_str(pk, strlen(key));
        msgpack_pack_str_body(pk, key, strlen(key));
        msgpack_pack_object(pk, mu->val);
        (*applied)++;
    }
}

/* Encodes `base`, applies `mu` exactly once and copies the frame to out. */
static size_t craft(const ferry__msg *base, const mutation *mu, char *out, size_t cap)
{
    char enc[FERRY__HDR_MAX];
    size_t len = encode_ok(base, enc, sizeof enc);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, enc, len, &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int applied = 0;
    repack(&pk, &u.data, "", mu, &applied);
    if (applied != 1)
        print_error("mutation of '%s' applied %d times\n", mu->path, applied);
    assert_int_equal(applied, 1);
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t n = sb.size;
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    return n;
}

/* Decodes the typical sample of `type` with `mu` applied. */
static int decode_mutated(ferry__msg_type type, mutation mu)
{
    ferry__msg base, out;
    sample(&base, type, TYPICAL);
    char frame[2 * FERRY__HDR_MAX];
    size_t n = craft(&base, &mu, frame, sizeof frame);
    return decode_exact(frame, n, &out);
}

/* One bad value and what the decoder must say about it. */
typedef struct bad_value {
    ferry__msg_type type;
    const char *path;
    msgpack_object val;
    const char *word;
} bad_value;

/* A raw frame and what the decoder must say about it. */
typedef struct bad_frame {
    const char *bytes;
    size_t len;
    const char *word;
} bad_frame;

/* Each case: the typical sample of its type with the value at its path
 * replaced must be refused with FERRY_EPROTO and a detail naming the word. */
#define expect_bad_values(cases) expect_bad_values_at((cases), COUNT_OF(cases), __FILE__, __LINE__)
#define expect_bad_frames(cases) expect_bad_frames_at((cases), COUNT_OF(cases), __FILE__, __LINE__)

/* msgpack_object values to put where they do not belong. */
static msgpack_object mp_of(msgpack_object_type t)
{
    msgpack_object o;
    memset(&o, 0, sizeof o);
    o.type = t;
    return o;
}

static msgpack_object mp_uint(uint64_t v)
{
    msgpack_object o = mp_of(MSGPACK_OBJECT_POSITIVE_INTEGER);
    o.via.u64 = v;
    return o;
}

static msgpack_object mp_int(int64_t v)
{
    if (v >= 0)
        return mp_uint((uint64_t)v);
    msgpack_object o = mp_of(MSGPACK_OBJECT_NEGATIVE_INTEGER);
    o.via.i64 = v;
    return o;
}

static msgpack_object mp_strn(const char *s, size_t n)
{
    msgpack_object o = mp_of(MSGPACK_OBJECT_STR);
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)n;
    return o;
}

static msgpack_object mp_str(const char *s)
{
    return mp_strn(s, strlen(s));
}

static msgpack_object mp_array(msgpack_object *items, uint32_t n)
{
    msgpack_object o = mp_of(MSGPACK_OBJECT_ARRAY);
    o.via.array.ptr = items;
    o.via.array.size = n;
    return o;
}

static void expect_bad_values_at(const bad_value *cases, size_t n, const char *file, int line)
{
    for (size_t i = 0; i < n; i++) {
        mutation mu = {cases[i].path, M_REPLACE, cases[i].val};
        expect_error_at(decode_mutated(cases[i].type, mu), FERRY_EPROTO, cases[i].word,
                        cases[i].path, file, line);
    }
}

static void expect_bad_frames_at(const bad_frame *cases, size_t n, const char *file, int line)
{
    ferry__msg out;
    for (size_t i = 0; i < n; i++)
        expect_error_at(decode_exact(cases[i].bytes, cases[i].len, &out), FERRY_EPROTO,
                        cases[i].word, cases[i].word, file, line);
}

/* ---------------------------------------------------------------------------
 * Round trips
 */

/* m encodes, and decodes to itself. */
static void roundtrip_msg(const ferry__msg *m)
{
    ferry__msg out;
    char buf[FERRY__HDR_MAX];
    size_t len = encode_ok(m, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_msg_equal(m, &out);
}

static void roundtrip(ferry__msg_type type, int variant)
{
    ferry__msg m, out, again;
    char buf[FERRY__HDR_MAX], buf2[FERRY__HDR_MAX];
    sample(&m, type, variant);
    size_t len = encode_ok(&m, buf, sizeof buf);
    int rc = decode_exact(buf, len, &out);
    if (rc != FERRY_OK)
        print_error("decode %s: %s\n", ferry__msg_name((int)type), ferry_last_error());
    assert_int_equal(rc, FERRY_OK);
    assert_int_equal(out.type, type);
    assert_msg_equal(&m, &out);
    /* Encoding is a function of the message: the same bytes come out again. */
    assert_int_equal(decode_exact(buf, len, &again), FERRY_OK);
    size_t len2 = encode_ok(&again, buf2, sizeof buf2);
    assert_int_equal(len2, len);
    assert_memory_equal(buf, buf2, len);
}

static void test_every_message_type_round_trips_typical_values(void **state)
{
    for (size_t i = 0; i < NTYPES; i++)
        roundtrip(all_types[i], TYPICAL);
}

static void test_every_message_type_round_trips_extreme_values_within_hdr_max(void **state)
{
    for (size_t i = 0; i < NTYPES; i++)
        roundtrip(all_types[i], EXTREME);
}

static void test_ready_with_error_and_slot_minus_one_round_trip(void **state)
{
    ferry__msg m, out;
    char buf[FERRY__HDR_MAX];
    sample(&m, FERRY__MSG_READY, TYPICAL);
    m.u.ready.length = 0;
    m.u.ready.code = FERRY_EDATASET;
    memset(&m.u.ready.schema, 0, sizeof m.u.ready.schema);
    strcpy(m.u.ready.error, "cannot open train_x.npy: No such file or directory");
    size_t len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_msg_equal(&m, &out);
    /* The longest error, the lowest code. */
    m.u.ready.code = INT32_MIN;
    set_str(m.u.ready.error, FERRY__TEXT_MAX - 1, 'e');
    len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_msg_equal(&m, &out);

    sample(&m, FERRY__MSG_HELLO, EXTREME);
    m.u.hello.slot = -1;
    memset(m.u.hello.host, 0, sizeof m.u.hello.host); /* an empty host is legal */
    len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_int_equal(out.u.hello.slot, -1);
    assert_msg_equal(&m, &out);
}

static void test_names_and_payload_flags(void **state)
{
    static const char *const names[] = {"HELLO", "CONFIG",    "READY", "TASK", "BATCH",
                                        "FAIL",  "HEARTBEAT", "STOP",  "BYE",  "REFUSE"};
    for (size_t i = 0; i < NTYPES; i++) {
        assert_string_equal(ferry__msg_name((int)all_types[i]), names[i]);
        int want = all_types[i] == FERRY__MSG_TASK || all_types[i] == FERRY__MSG_BATCH;
        assert_int_equal(ferry__msg_has_payload(all_types[i]), want);
    }
    assert_string_equal(ferry__msg_name(0), "?");
    assert_string_equal(ferry__msg_name(11), "?");
    assert_string_equal(ferry__msg_name(-1), "?");
    assert_int_equal(ferry__msg_has_payload((ferry__msg_type)0), 0);
    assert_int_equal(ferry__msg_has_payload((ferry__msg_type)99), 0);
}

/* HELLO and REFUSE never change (docs/protocol.md section 7): a peer of any
 * version must read them to tell a version mismatch from garbage. These
 * are their bytes; the HELLO is also exactly what version 1 encoded. */
static void test_hello_and_refuse_are_frozen(void **state)
{
    static const char hello[] =
        "\x86\xa4type\x01\xa7version\x01\xa3pid\xcd\x10\x92\xa4slot\xff\xa4host\xa7node-17"
        "\xa7program\xb2"
        "ferry-worker 0.1.0";
    static const char refuse[] = "\x83\xa4type\x0a\xa7version\x02\xa6reason\xd9\x2b"
                                 "protocol version 4 worker, version 3 loader";
    ferry__msg m, out;
    char buf[FERRY__HDR_MAX];
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_HELLO;
    m.u.hello = (ferry__hello){.version = 1, .pid = 4242, .slot = -1};
    strcpy(m.u.hello.host, "node-17");
    strcpy(m.u.hello.program, "ferry-worker 0.1.0");
    size_t len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(len, sizeof hello - 1);
    assert_memory_equal(buf, hello, len);
    assert_int_equal(decode_exact(hello, sizeof hello - 1, &out), FERRY_OK);
    assert_msg_equal(&m, &out);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_REFUSE;
    m.u.refuse.version = 2;
    strcpy(m.u.refuse.reason, "protocol version 4 worker, version 3 loader");
    len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(len, sizeof refuse - 1);
    assert_memory_equal(buf, refuse, len);
    assert_int_equal(decode_exact(refuse, sizeof refuse - 1, &out), FERRY_OK);
    assert_msg_equal(&m, &out);
}

/* ---------------------------------------------------------------------------
 * Decoder: keys
 */

/* Every key of every message, by class: U unsigned, I signed, S string,
 * A array, M a field map (array element), D a shape dim (array element). */
static const struct key_path {
    ferry__msg_type type;
    const char *path;
    char cls;
    const char *word; /* what the error must mention */
} key_paths[] = {
    {FERRY__MSG_HELLO, "type", 'U', "type"},
    {FERRY__MSG_HELLO, "version", 'U', "version"},
    {FERRY__MSG_HELLO, "pid", 'U', "pid"},
    {FERRY__MSG_HELLO, "slot", 'I', "slot"},
    {FERRY__MSG_HELLO, "host", 'S', "host"},
    {FERRY__MSG_HELLO, "program", 'S', "program"},
    {FERRY__MSG_CONFIG, "dataset", 'S', "dataset"},
    {FERRY__MSG_CONFIG, "worker_index", 'U', "worker_index"},
    {FERRY__MSG_CONFIG, "num_workers", 'U', "num_workers"},
    {FERRY__MSG_CONFIG, "seed", 'U', "seed"},
    {FERRY__MSG_CONFIG, "credits", 'U', "credits"},
    {FERRY__MSG_CONFIG, "heartbeat_ms", 'U', "heartbeat_ms"},
    {FERRY__MSG_CONFIG, "liveness", 'U', "liveness"},
    {FERRY__MSG_CONFIG, "max_message", 'U', "max_message"},
    {FERRY__MSG_READY, "length", 'U', "length"},
    {FERRY__MSG_READY, "code", 'I', "code"},
    {FERRY__MSG_READY, "error", 'S', "error"},
    {FERRY__MSG_READY, "fields", 'A', "fields"},
    {FERRY__MSG_READY, "fields.1", 'M', "READY field 1"},
    {FERRY__MSG_READY, "fields.0.name", 'S', "name"},
    {FERRY__MSG_READY, "fields.1.dtype", 'U', "dtype"},
    {FERRY__MSG_READY, "fields.0.shape", 'A', "shape"},
    {FERRY__MSG_READY, "fields.0.shape.1", 'D', "shape"},
    {FERRY__MSG_TASK, "id", 'U', "id"},
    {FERRY__MSG_TASK, "epoch", 'U', "epoch"},
    {FERRY__MSG_TASK, "batch_in_epoch", 'U', "batch_in_epoch"},
    {FERRY__MSG_TASK, "seq", 'U', "seq"},
    {FERRY__MSG_TASK, "count", 'U', "count"},
    {FERRY__MSG_TASK, "shm_offset", 'U', "shm_offset"},
    {FERRY__MSG_TASK, "shm_bytes", 'U', "shm_bytes"},
    {FERRY__MSG_BATCH, "id", 'U', "id"},
    {FERRY__MSG_BATCH, "count", 'U', "count"},
    {FERRY__MSG_BATCH, "make_ns", 'U', "make_ns"},
    {FERRY__MSG_BATCH, "shm", 'U', "shm"},
    {FERRY__MSG_BATCH, "fields", 'A', "fields"},
    {FERRY__MSG_BATCH, "fields.1", 'M', "BATCH field 1"},
    {FERRY__MSG_BATCH, "fields.1.name", 'S', "name"},
    {FERRY__MSG_BATCH, "fields.1.dtype", 'U', "dtype"},
    {FERRY__MSG_BATCH, "fields.1.shape", 'A', "shape"},
    {FERRY__MSG_BATCH, "fields.0.shape.1", 'D', "shape"},
    {FERRY__MSG_BATCH, "fields.0.offset", 'U', "offset"},
    {FERRY__MSG_BATCH, "fields.0.nbytes", 'U', "nbytes"},
    {FERRY__MSG_FAIL, "id", 'U', "id"},
    {FERRY__MSG_FAIL, "code", 'I', "code"},
    {FERRY__MSG_FAIL, "index", 'U', "index"},
    {FERRY__MSG_FAIL, "message", 'S', "message"},
    {FERRY__MSG_STOP, "type", 'U', "type"},
    {FERRY__MSG_REFUSE, "version", 'U', "version"},
    {FERRY__MSG_REFUSE, "reason", 'S', "reason"},
};

/* Whether a value of msgpack type t is of the right type for class cls. */
static int right_type(char cls, msgpack_object_type t)
{
    switch (cls) {
    case 'U':
    case 'D':
        return t == MSGPACK_OBJECT_POSITIVE_INTEGER;
    case 'I':
        return t == MSGPACK_OBJECT_POSITIVE_INTEGER || t == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    case 'S':
        return t == MSGPACK_OBJECT_STR;
    case 'A':
        return t == MSGPACK_OBJECT_ARRAY;
    case 'M':
        return t == MSGPACK_OBJECT_MAP;
    }
    return 0;
}

static void test_decode_rejects_wrong_msgpack_type_for_every_key(void **state)
{
    static const char three[] = "abc";
    msgpack_object probes[] = {
        mp_of(MSGPACK_OBJECT_NIL),
        mp_of(MSGPACK_OBJECT_BOOLEAN),
        mp_of(MSGPACK_OBJECT_FLOAT64),
        mp_of(MSGPACK_OBJECT_FLOAT32),
        mp_str("7"),
        mp_of(MSGPACK_OBJECT_BIN),
        mp_of(MSGPACK_OBJECT_EXT),
        mp_array(NULL, 0),
        mp_of(MSGPACK_OBJECT_MAP),
        mp_int(-1),
        mp_uint(7),
    };
    probes[1].via.boolean = true;
    probes[2].via.f64 = 1.5;
    probes[3].via.f64 = 2.5;
    probes[5].via.bin.ptr = three;
    probes[5].via.bin.size = 3;
    probes[6].via.ext.type = 1;
    probes[6].via.ext.ptr = three;
    probes[6].via.ext.size = 3;

    for (size_t k = 0; k < COUNT_OF(key_paths); k++) {
        for (size_t p = 0; p < COUNT_OF(probes); p++) {
            if (right_type(key_paths[k].cls, probes[p].type))
                continue;
            mutation mu = {key_paths[k].path, M_REPLACE, probes[p]};
            char ctx[96];
            snprintf(ctx, sizeof ctx, "%s.%s = msgpack type %d",
                     ferry__msg_name((int)key_paths[k].type), key_paths[k].path,
                     (int)probes[p].type);
            expect_error(decode_mutated(key_paths[k].type, mu), FERRY_EPROTO, key_paths[k].word,
                         ctx);
        }
    }
}

static void test_decode_rejects_missing_and_duplicate_keys(void **state)
{
    for (size_t k = 0; k < COUNT_OF(key_paths); k++) {
        if (key_paths[k].cls == 'M' || key_paths[k].cls == 'D')
            continue; /* array elements, not keys */
        const char *dot = strrchr(key_paths[k].path, '.');
        const char *key = dot ? dot + 1 : key_paths[k].path;
        char want[64], ctx[64];
        snprintf(ctx, sizeof ctx, "%s.%s", ferry__msg_name((int)key_paths[k].type),
                 key_paths[k].path);

        mutation drop = {key_paths[k].path, M_DROP, mp_of(MSGPACK_OBJECT_NIL)};
        snprintf(want, sizeof want, "'%s' is missing", key);
        expect_error(decode_mutated(key_paths[k].type, drop), FERRY_EPROTO, want, ctx);

        mutation dup = {key_paths[k].path, M_DUP, mp_of(MSGPACK_OBJECT_NIL)};
        snprintf(want, sizeof want, "'%s' appears twice", key);
        expect_error(decode_mutated(key_paths[k].type, dup), FERRY_EPROTO, want, ctx);
    }
}

static void test_decode_rejects_unknown_keys(void **state)
{
    static const char long_key[] =
        "an_unexpectedly_long_key_name_that_goes_on_and_on_and_on_past_sixty_four_bytes";
    for (size_t i = 0; i < NTYPES; i++) {
        mutation mu = {"bogus", M_ADD, mp_uint(1)};
        expect_error(decode_mutated(all_types[i], mu), FERRY_EPROTO, "unknown key 'bogus'",
                     ferry__msg_name((int)all_types[i]));
    }
    mutation in_field = {"fields.1.stride", M_ADD, mp_uint(8)};
    expect_error(decode_mutated(FERRY__MSG_BATCH, in_field), FERRY_EPROTO,
                 "field 1: unknown key 'stride'", "field key");
    /* Keys are matched exactly: no case folding. */
    mutation upper = {"Count", M_ADD, mp_uint(8)};
    expect_error(decode_mutated(FERRY__MSG_TASK, upper), FERRY_EPROTO, "unknown key 'Count'",
                 "Count");
    mutation longk = {long_key, M_ADD, mp_uint(8)};
    expect_error(decode_mutated(FERRY__MSG_TASK, longk), FERRY_EPROTO,
                 "unknown key 'an_unexpectedly", "long");
}

/* ---------------------------------------------------------------------------
 * Decoder: values
 */

static void test_decode_rejects_out_of_range_scalars(void **state)
{
    const bad_value cases[] = {
        {FERRY__MSG_HELLO, "version", mp_uint(UINT64_C(1) << 32), "'version' is 4294967296"},
        {FERRY__MSG_HELLO, "pid", mp_uint(UINT64_C(1) << 32), "'pid'"},
        {FERRY__MSG_HELLO, "slot", mp_int(-2), "'slot' is -2, must be -1.."},
        {FERRY__MSG_HELLO, "slot", mp_uint(UINT64_C(1) << 31), "'slot'"},
        {FERRY__MSG_HELLO, "slot", mp_int(INT64_MIN), "'slot'"},
        {FERRY__MSG_CONFIG, "credits", mp_uint(0), "'credits' is 0, must be 1..64"},
        {FERRY__MSG_CONFIG, "credits", mp_uint(FERRY__MAX_CREDITS + 1), "'credits' is 65"},
        {FERRY__MSG_CONFIG, "num_workers", mp_uint(0), "'num_workers'"},
        {FERRY__MSG_CONFIG, "worker_index", mp_uint(4), "'worker_index' is 4"},
        {FERRY__MSG_CONFIG, "heartbeat_ms", mp_uint(UINT64_C(1) << 32), "'heartbeat_ms'"},
        {FERRY__MSG_CONFIG, "liveness", mp_uint(0), "'liveness' is 0, must be 1..1000"},
        {FERRY__MSG_CONFIG, "liveness", mp_uint(1001), "'liveness' is 1001"},
        {FERRY__MSG_CONFIG, "max_message", mp_uint(FERRY__MIN_MESSAGE - 1),
         "'max_message' is 4095, must be 4096..9223372036854775807"},
        {FERRY__MSG_CONFIG, "max_message", mp_uint(UINT64_C(1) << 63), "'max_message'"},
        {FERRY__MSG_REFUSE, "version", mp_uint(UINT64_C(1) << 32), "'version' is 4294967296"},
        {FERRY__MSG_READY, "code", mp_int(1), "'code' is 1"},
        {FERRY__MSG_READY, "code", mp_int((int64_t)INT32_MIN - 1), "'code'"},
        {FERRY__MSG_READY, "code", mp_int(FERRY_EDATASET), "'length'"},
        {FERRY__MSG_READY, "error", mp_str("boom"), "'error'"},
        {FERRY__MSG_TASK, "count", mp_uint(FERRY__MAX_BATCH + 1), "'count' is 1048577"},
        {FERRY__MSG_TASK, "count", mp_uint(UINT64_MAX), "'count'"},
        {FERRY__MSG_BATCH, "count", mp_uint(0), "'count' is 0"},
        {FERRY__MSG_FAIL, "code", mp_int(0), "'code' is 0, must be"},
        {FERRY__MSG_FAIL, "code", mp_int(3), "'code' is 3"},
        {FERRY__MSG_FAIL, "code", mp_int((int64_t)INT32_MIN - 1), "'code'"},
        {FERRY__MSG_STOP, "type", mp_uint(0), "not a known message type"},
        {FERRY__MSG_STOP, "type", mp_uint(11), "not a known message type"},
        {FERRY__MSG_STOP, "type", mp_uint(UINT64_MAX), "not a known message type"},
    };
    expect_bad_values(cases);
}

static void test_decode_detail_names_message_key_value_and_range(void **state)
{
    mutation mu = {"count", M_REPLACE, mp_uint(0)};
    assert_int_equal(decode_mutated(FERRY__MSG_TASK, mu), FERRY_EPROTO);
    assert_string_equal(ferry_last_error(), "TASK: key 'count' is 0, must be 1..1048576");
}

static void test_decode_rejects_inconsistent_batch_fields(void **state)
{
    /* The typical batch has count 4; field 1 is "y", i64 of shape [4]. */
    msgpack_object empty[1],
        short0[1] = {mp_uint(3)}, zero[2] = {mp_uint(4), mp_uint(0)},
        neg[2] = {mp_uint(4), mp_int(-3)}, wide[2] = {mp_uint(4), mp_uint(UINT64_MAX)},
        huge[3] = {mp_uint(4), mp_uint(UINT64_C(1) << 62), mp_uint(UINT64_C(1) << 62)},
        nine[FERRY_MAX_DIMS + 1];
    for (int d = 0; d <= FERRY_MAX_DIMS; d++)
        nine[d] = mp_uint(d == 0 ? 4 : 1);
    const bad_value cases[] = {
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(empty, 0), "field 1: key 'shape' has 0 dims"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(nine, FERRY_MAX_DIMS + 1),
         "'shape' has 9 dims"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(short0, 1), "must equal count 4"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(zero, 2), "dim 1 is 0"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(neg, 2), "dim 1 is -3"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(wide, 2), "must be an int64"},
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(huge, 3), "overflows"},
        {FERRY__MSG_BATCH, "fields.1.nbytes", mp_uint(31),
         "BATCH field 1: key 'nbytes' is 31, shape and dtype give 32"},
        {FERRY__MSG_BATCH, "fields.1.nbytes", mp_uint(33), "'nbytes' is 33"},
        {FERRY__MSG_BATCH, "fields.1.dtype", mp_uint(0), "'dtype' is 0, not a known dtype"},
        {FERRY__MSG_BATCH, "fields.1.dtype", mp_uint(13), "'dtype' is 13"},
        {FERRY__MSG_BATCH, "fields.1.dtype", mp_uint(UINT64_C(1) << 32), "'dtype'"},
        {FERRY__MSG_BATCH, "fields.1.name", mp_str("x"),
         "BATCH field 1: key 'name' 'x' repeats field 0"},
        /* Details are only formatted once something fails; they still
         * name the message, the field and the key, from decoding ... */
        {FERRY__MSG_BATCH, "fields.1.dtype", mp_str("7"),
         "BATCH field 1: key 'dtype' must be a non-negative integer, got str"},
        {FERRY__MSG_BATCH, "fields.1", mp_uint(7), "BATCH field 1: must be a map, got positive int"},
        /* ... and from the rules. */
        {FERRY__MSG_BATCH, "fields.1.shape", mp_array(zero, 2), "BATCH field 1: key 'shape' dim 1 is 0"},
        {FERRY__MSG_BATCH, "fields.1.name", mp_str(""), "'name' is 0 bytes long"},
        {FERRY__MSG_BATCH, "fields", mp_array(empty, 0), "'fields' has 0 entries"},
        {FERRY__MSG_BATCH, "count", mp_uint(5), "must equal count 5"},
    };
    expect_bad_values(cases);
    /* For contrast: i64 -> f64 keeps the element size, so nbytes still holds. */
    mutation same_size = {"fields.1.dtype", M_REPLACE, mp_uint(FERRY_DTYPE_F64)};
    assert_int_equal(decode_mutated(FERRY__MSG_BATCH, same_size), FERRY_OK);
}

static void test_decode_rejects_inconsistent_ready_schema(void **state)
{
    /* The typical schema: field 0 "x", f4 items of [28, 28]; field 1 "y", i64. */
    msgpack_object none[1], eight[FERRY_MAX_DIMS], maps[FERRY_MAX_FIELDS + 1],
        zero[2] = {mp_uint(28), mp_uint(0)}, neg[2] = {mp_uint(28), mp_int(-3)},
        huge[2] = {mp_uint(UINT64_C(1) << 62), mp_uint(UINT64_C(1) << 62)},
        /* 4 * 2^28 = 1 GiB of f4 is the most an item may be; one more row is over. */
        gib[2] = {mp_uint(1), mp_uint(UINT64_C(1) << 28)},
        over[2] = {mp_uint(2), mp_uint(UINT64_C(1) << 28)};
    for (int d = 0; d < FERRY_MAX_DIMS; d++)
        eight[d] = mp_uint(1);
    for (int i = 0; i <= FERRY_MAX_FIELDS; i++)
        maps[i] = mp_of(MSGPACK_OBJECT_MAP);
    const bad_value cases[] = {
        {FERRY__MSG_READY, "fields.0.shape", mp_array(over, 2),
         "READY field 0: one item is 2147483648 bytes, more than 1 GiB"},
        {FERRY__MSG_READY, "fields", mp_array(none, 0), "code is 0 but key 'fields' is empty"},
        {FERRY__MSG_READY, "fields", mp_array(maps, FERRY_MAX_FIELDS + 1),
         "READY: key 'fields' has 17 entries, must be 0..16"},
        {FERRY__MSG_READY, "fields.0.shape", mp_array(eight, FERRY_MAX_DIMS),
         "READY field 0: key 'shape' has 8 dims, must be 0..7"},
        {FERRY__MSG_READY, "fields.0.shape", mp_array(zero, 2), "field 0: key 'shape' dim 1 is 0"},
        {FERRY__MSG_READY, "fields.0.shape", mp_array(neg, 2), "dim 1 is -3"},
        {FERRY__MSG_READY, "fields.0.shape", mp_array(huge, 2), "overflows"},
        {FERRY__MSG_READY, "fields.1.dtype", mp_uint(13), "field 1: key 'dtype' is 13"},
        {FERRY__MSG_READY, "fields.1.dtype", mp_uint(0), "not a known dtype"},
        {FERRY__MSG_READY, "fields.1.name", mp_str("x"), "'name' 'x' repeats field 0"},
        {FERRY__MSG_READY, "fields.1.name", mp_str(""), "'name' is 0 bytes long"},
        {FERRY__MSG_READY, "code", mp_int(FERRY_EDATASET), "'length'"},
    };
    expect_bad_values(cases);
    /* For contrast: a scalar item has no dims, and y already is one. */
    mutation scalar = {"fields.0.shape", M_REPLACE, mp_array(none, 0)};
    assert_int_equal(decode_mutated(FERRY__MSG_READY, scalar), FERRY_OK);
    mutation at_limit = {"fields.0.shape", M_REPLACE, mp_array(gib, 2)};
    assert_int_equal(decode_mutated(FERRY__MSG_READY, at_limit), FERRY_OK);
}

/* {type: BATCH, id: 1, make_ns: 1000, count: 4, shm: 0, fields: [nfields x {name,
 * u8 [4], 4 bytes}]}, packed by hand since the encoder refuses more than
 * FERRY_MAX_FIELDS. */
static size_t pack_batch_of(unsigned nfields, char *out, size_t cap)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 6);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_uint32(&pk, FERRY__MSG_BATCH);
    msgpack_pack_str_with_body(&pk, "shm", 3);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_uint32(&pk, 1);
    msgpack_pack_str_with_body(&pk, "make_ns", 7);
    msgpack_pack_uint32(&pk, 1000);
    msgpack_pack_str_with_body(&pk, "count", 5);
    msgpack_pack_uint32(&pk, 4);
    msgpack_pack_str_with_body(&pk, "fields", 6);
    msgpack_pack_array(&pk, nfields);
    for (unsigned i = 0; i < nfields; i++) {
        char name[16];
        int n = snprintf(name, sizeof name, "f%u", i);
        msgpack_pack_map(&pk, 5);
        msgpack_pack_str_with_body(&pk, "name", 4);
        msgpack_pack_str_with_body(&pk, name, (size_t)n);
        msgpack_pack_str_with_body(&pk, "dtype", 5);
        msgpack_pack_uint32(&pk, FERRY_DTYPE_U8);
        msgpack_pack_str_with_body(&pk, "shape", 5);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint32(&pk, 4);
        msgpack_pack_str_with_body(&pk, "offset", 6);
        msgpack_pack_uint32(&pk, 4 * i);
        msgpack_pack_str_with_body(&pk, "nbytes", 6);
        msgpack_pack_uint32(&pk, 4);
    }
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t len = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return len;
}

static void test_decode_accepts_16_fields_and_rejects_17(void **state)
{
    char buf[FERRY__HDR_MAX];
    ferry__msg out;
    size_t len = pack_batch_of(FERRY_MAX_FIELDS, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_int_equal(out.u.batch.nfields, FERRY_MAX_FIELDS);
    assert_string_equal(out.u.batch.fields[15].name, "f15");
    assert_int_equal(ferry__msg_check_payload(&out, 4 * FERRY_MAX_FIELDS), FERRY_OK);

    len = pack_batch_of(FERRY_MAX_FIELDS + 1, buf, sizeof buf);
    expect_error(decode_exact(buf, len, &out), FERRY_EPROTO, "'fields' has 17 entries",
                 "17 fields");
}

static void test_decode_rejects_strings_too_long_or_with_nul(void **state)
{
    static char big[FERRY__SPEC_MAX + 1];
    memset(big, 'a', sizeof big);
    const bad_value cases[] = {
        {FERRY__MSG_HELLO, "host", mp_strn(big, FERRY__HOST_MAX),
         "'host' is 256 bytes long, at most 255"},
        {FERRY__MSG_HELLO, "program", mp_strn(big, FERRY__PROGRAM_MAX), "'program' is 64 bytes"},
        {FERRY__MSG_CONFIG, "dataset", mp_strn(big, FERRY__SPEC_MAX), "'dataset' is 4096 bytes"},
        {FERRY__MSG_CONFIG, "dataset", mp_str(""), "'dataset' is 0 bytes long, must be at least 1"},
        {FERRY__MSG_READY, "error", mp_strn(big, FERRY__TEXT_MAX), "'error' is 4096 bytes"},
        {FERRY__MSG_FAIL, "message", mp_strn(big, FERRY__TEXT_MAX), "'message' is 4096 bytes"},
        {FERRY__MSG_BATCH, "fields.0.name", mp_strn(big, FERRY_NAME_MAX), "'name' is 64 bytes"},
        {FERRY__MSG_HELLO, "host", mp_strn("node\0evil", 9), "'host' contains a NUL byte"},
        {FERRY__MSG_FAIL, "message", mp_strn("\0", 1), "'message' contains a NUL byte"},
        {FERRY__MSG_BATCH, "fields.0.name", mp_strn("x\0", 2), "'name' contains a NUL byte"},
        {FERRY__MSG_READY, "fields.1.name", mp_strn(big, FERRY_NAME_MAX),
         "READY field 1: key 'name' is 64 bytes"},
        {FERRY__MSG_REFUSE, "reason", mp_strn(big, FERRY__TEXT_MAX), "'reason' is 4096 bytes"},
        {FERRY__MSG_REFUSE, "reason", mp_strn("a\0b", 3), "'reason' contains a NUL byte"},
    };
    expect_bad_values(cases);
}

/* ---------------------------------------------------------------------------
 * Decoder: framing
 */

static void test_decode_rejects_what_is_not_a_header_map(void **state)
{
    static const bad_frame cases[] = {
        {BYTES("\x92\x04\x01"), "is a msgpack array, must be a map"},
        {BYTES("\x05"), "is a msgpack positive int, must be a map"},
        {BYTES("\xa4TASK"), "must be a map"},
        {BYTES("\xc0"), "must be a map"},
        {BYTES("\x80"), "'type' is missing"},
        {BYTES("\x81\xa2id\x01"), "'type' is missing"},
        {BYTES("\x81\xa4type\xff"), "'type' must be a non-negative integer, got negative int"},
        {BYTES("\x81\xa4type\xa4TASK"), "'type' must be a non-negative integer, got str"},
        {BYTES("\x82\xa4type\x07\xa4type\x07"), "'type' appears twice"},
        {BYTES("\x82\xa4type\x07\x01\x02"), "a key is a positive int, keys must be strings"},
        {BYTES("\x82\xa4type\x07\xc4\x01x\x02"), "a key is a bin"},
        {BYTES("\x81\xa4type\xc1"), "byte 0xc1 at offset 6 is not msgpack"},
    };
    expect_bad_frames(cases);
    /* The smallest legal frame, for contrast. */
    ferry__msg out;
    assert_int_equal(decode_exact(BYTES("\x81\xa4type\x07"), &out), FERRY_OK);
    assert_int_equal(out.type, FERRY__MSG_HEARTBEAT);
}

/* A peer in another language may pick any msgpack format that holds a
 * value; only the value counts. */
static void test_decode_accepts_any_integer_or_string_format(void **state)
{
    static const struct {
        const char *bytes;
        size_t len;
    } stops[] = {
        {BYTES("\x81\xa4type\x08")},                   /* positive fixint */
        {BYTES("\x81\xa4type\xcc\x08")},               /* uint8 */
        {BYTES("\x81\xa4type\xcf\0\0\0\0\0\0\0\x08")}, /* uint64 */
        {BYTES("\x81\xa4type\xd0\x08")},               /* int8 */
        {BYTES("\x81\xa4type\xd3\0\0\0\0\0\0\0\x08")}, /* int64 */
        {BYTES("\x81\xd9\x04type\x08")},               /* str8 key */
        {BYTES("\x81\xda\0\x04type\x08")},             /* str16 key */
    };
    ferry__msg out;
    for (size_t i = 0; i < COUNT_OF(stops); i++) {
        assert_int_equal(decode_exact(stops[i].bytes, stops[i].len, &out), FERRY_OK);
        assert_int_equal(out.type, FERRY__MSG_STOP);
    }
    /* version and pid as int32, slot -1 as int64, program as str8. */
    static const char hello[] = "\x86\xa4type\x01\xa7version\xd2\0\0\0\x01\xa3pid\xd2\0\0\x10\x92"
                                "\xa4slot\xd3\xff\xff\xff\xff\xff\xff\xff\xff\xa4host\xa0"
                                "\xa7program\xd9\x01w";
    assert_int_equal(decode_exact(hello, sizeof hello - 1, &out), FERRY_OK);
    assert_int_equal(out.u.hello.version, 1);
    assert_int_equal(out.u.hello.pid, 4242);
    assert_int_equal(out.u.hello.slot, -1);
    assert_string_equal(out.u.hello.program, "w");
}

static void test_decode_rejects_trailing_bytes(void **state)
{
    ferry__msg m, out;
    char buf[2 * FERRY__HDR_MAX];
    for (size_t i = 0; i < NTYPES; i++) {
        sample(&m, all_types[i], TYPICAL);
        size_t len = encode_ok(&m, buf, FERRY__HDR_MAX);
        buf[len] = '\0'; /* one positive fixint */
        expect_error(decode_exact(buf, len + 1, &out), FERRY_EPROTO, "trailing bytes: 1 after",
                     ferry__msg_name((int)all_types[i]));
        /* Two whole messages in one frame are not one message either. */
        memcpy(buf + len, buf, len);
        expect_error(decode_exact(buf, 2 * len, &out), FERRY_EPROTO, "trailing", "doubled");
    }
}

static void test_decode_rejects_every_truncation_of_valid_messages(void **state)
{
    ferry__msg m, out;
    char buf[FERRY__HDR_MAX];
    for (int variant = TYPICAL; variant <= EXTREME; variant++) {
        for (size_t i = 0; i < NTYPES; i++) {
            sample(&m, all_types[i], variant);
            size_t len = encode_ok(&m, buf, sizeof buf);
            for (size_t n = 0; n < len; n++) {
                int rc = decode_exact(buf, n, &out);
                if (rc != FERRY_EPROTO)
                    print_error("%s cut at %zu of %zu: %s\n", ferry__msg_name((int)all_types[i]), n,
                                len, ferry_err_name(rc));
                assert_int_equal(rc, FERRY_EPROTO);
            }
        }
    }
    sample(&m, FERRY__MSG_TASK, TYPICAL);
    size_t len = encode_ok(&m, buf, sizeof buf);
    expect_error(decode_exact(buf, 0, &out), FERRY_EPROTO, "empty", "empty");
    expect_error(decode_exact(buf, len - 1, &out), FERRY_EPROTO, "truncated", "last byte cut");
}

static void test_decode_rejects_frames_over_hdr_max(void **state)
{
    ferry__msg m, out;
    static char buf[FERRY__HDR_MAX + 1];
    sample(&m, FERRY__MSG_CONFIG, EXTREME);
    size_t len = encode_ok(&m, buf, FERRY__HDR_MAX);
    memset(buf + len, 0xc0, sizeof buf - len);
    expect_error(decode_exact(buf, sizeof buf, &out), FERRY_EPROTO,
                 "8193 bytes, larger than the 8192", "oversized");
    /* A dataset string long enough to push the frame past the limit. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_uint32(&pk, FERRY__MSG_HELLO);
    msgpack_pack_str_with_body(&pk, "host", 4);
    static char host[FERRY__HDR_MAX];
    memset(host, 'h', sizeof host);
    msgpack_pack_str_with_body(&pk, host, sizeof host);
    expect_error(decode_exact(sb.data, sb.size, &out), FERRY_EPROTO, "larger than", "big host");
    msgpack_sbuffer_destroy(&sb);
}

/* msgpack-c allocates a container's storage from its declared size before
 * reading any element; these frames declare billions in a few bytes. */
static void test_decode_refuses_containers_bigger_than_the_frame(void **state)
{
    static const bad_frame cases[] = {
        {BYTES("\xdf\xff\xff\xff\xff"), "declares 8589934590 elements"},
        {BYTES("\xdd\xff\xff\xff\xff"), "declares 4294967295 elements"},
        {BYTES("\x81\xa4type\xdd\xff\xff\xff\xff"), "declares 4294967295"},
        {BYTES("\x82\xa4type\x07\xa1x\xdc\xff\xff"), "declares 65535"},
        {BYTES("\x82\xa4type\x07\xa1x\x9f\x01"), "declares 15"},
        {BYTES("\x81\xa4type\xdb\xff\xff\xff\xff"), "truncated"},
        {BYTES("\x81\xa4type\xc6\xff\xff\xff\xff"), "truncated"},
        {BYTES("\x81\xa4type\xc9\x00\x00\x00\x01\x01"), "truncated"},
    };
    expect_bad_frames(cases);
}

static void test_decode_rejects_deep_nesting(void **state)
{
    char buf[256];
    size_t n;
    memcpy(buf, "\x82\xa4type\x07\xa1x", 9);
    n = 9;
    for (int d = 0; d < 100; d++)
        buf[n++] = (char)0x91; /* [ [ [ ... */
    buf[n++] = 0x00;
    ferry__msg out;
    expect_error(decode_exact(buf, n, &out), FERRY_EPROTO, "nests deeper than 7 levels",
                 "100 deep");
    /* Eight levels are already too many; the legal maximum is four. */
    expect_error(decode_exact(buf, 9 + 7, &out), FERRY_EPROTO, "nests deeper", "8 deep");
}

/* ---------------------------------------------------------------------------
 * Encoder
 */

static void expect_encode_refused(const ferry__msg *m, const char *word)
{
    char buf[FERRY__HDR_MAX];
    size_t len = 777;
    expect_error(ferry__msg_encode(m, buf, sizeof buf, &len), FERRY_EINVAL, word, word);
    assert_int_equal(len, 777);
}

static void test_encode_refuses_what_the_decoder_would_refuse(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_CONFIG, TYPICAL);
    m.u.config.credits = 0;
    expect_encode_refused(&m, "CONFIG: key 'credits' is 0, must be 1..64");
    sample(&m, FERRY__MSG_CONFIG, TYPICAL);
    m.u.config.worker_index = m.u.config.num_workers;
    expect_encode_refused(&m, "worker_index");
    sample(&m, FERRY__MSG_HELLO, TYPICAL);
    memset(m.u.hello.host, 'h', sizeof m.u.hello.host); /* no NUL */
    expect_encode_refused(&m, "'host' is not NUL-terminated");
    sample(&m, FERRY__MSG_HELLO, TYPICAL);
    m.u.hello.slot = -2;
    expect_encode_refused(&m, "'slot' is -2");
    sample(&m, FERRY__MSG_READY, TYPICAL);
    strcpy(m.u.ready.error, "stale");
    expect_encode_refused(&m, "'error' is not empty");
    sample(&m, FERRY__MSG_FAIL, TYPICAL);
    m.u.fail.code = 0;
    expect_encode_refused(&m, "FAIL: key 'code' is 0");
    sample(&m, FERRY__MSG_TASK, TYPICAL);
    m.u.task.count = FERRY__MAX_BATCH + 1;
    expect_encode_refused(&m, "'count' is 1048577");
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.fields[1].nbytes++;
    expect_encode_refused(&m, "'nbytes' is 33");
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    strcpy(m.u.batch.fields[1].name, "x");
    expect_encode_refused(&m, "repeats field 0");
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.fields[0].ndim = FERRY_MAX_DIMS + 1;
    expect_encode_refused(&m, "'shape' has 9 dims");
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.nfields = FERRY_MAX_FIELDS + 1;
    expect_encode_refused(&m, "'fields' has 17 entries");
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.fields[0].dtype = (ferry_dtype)99;
    expect_encode_refused(&m, "'dtype' is 99");
    sample(&m, FERRY__MSG_STOP, TYPICAL);
    m.type = (ferry__msg_type)0;
    expect_encode_refused(&m, "unknown message type 0");
    m.type = (ferry__msg_type)42;
    expect_encode_refused(&m, "unknown message type 42");

    char buf[16];
    size_t len;
    sample(&m, FERRY__MSG_STOP, TYPICAL);
    expect_error(ferry__msg_encode(NULL, buf, sizeof buf, &len), FERRY_EINVAL, "NULL", "NULL m");
    expect_error(ferry__msg_encode(&m, NULL, sizeof buf, &len), FERRY_EINVAL, "NULL", "NULL buf");
    expect_error(ferry__msg_encode(&m, buf, sizeof buf, NULL), FERRY_EINVAL, "NULL", "NULL len");
    ferry__msg out;
    expect_error(ferry__msg_decode(NULL, 4, &out), FERRY_EINVAL, "NULL", "decode NULL buf");
    expect_error(ferry__msg_decode(buf, 4, NULL), FERRY_EINVAL, "NULL", "decode NULL out");
}

/* The same for what version 2 added: READY's schema, CONFIG's max_message,
 * REFUSE. */
static void test_encode_refuses_bad_schemas_and_version_2_keys(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_READY, TYPICAL);
    m.u.ready.schema.nfields = 0;
    expect_encode_refused(&m, "READY: code is 0 but key 'fields' is empty");
    sample(&m, FERRY__MSG_READY, TYPICAL);
    m.u.ready.code = FERRY_EDATASET;
    m.u.ready.length = 0;
    strcpy(m.u.ready.error, "gone");
    expect_encode_refused(&m, "READY: code is -4 but key 'fields' has 2 entries, must be 0");
    sample(&m, FERRY__MSG_READY, TYPICAL);
    m.u.ready.schema.fields[1].ndim = FERRY_MAX_DIMS;
    expect_encode_refused(&m, "READY field 1: key 'shape' has 8 dims, must be 0..7");
    sample(&m, FERRY__MSG_READY, TYPICAL);
    m.u.ready.schema.nfields = FERRY_MAX_FIELDS + 1;
    expect_encode_refused(&m, "'fields' has 17 entries");
    sample(&m, FERRY__MSG_CONFIG, TYPICAL);
    m.u.config.max_message = 0;
    expect_encode_refused(&m, "CONFIG: key 'max_message' is 0");
    sample(&m, FERRY__MSG_REFUSE, TYPICAL);
    memset(m.u.refuse.reason, 'r', sizeof m.u.refuse.reason);
    expect_encode_refused(&m, "'reason' is not NUL-terminated");
}

/* Every capacity short of the frame fails with FERRY_ELIMIT, leaves *len
 * alone and writes nothing past the capacity. */
static void test_encode_reports_elimit_for_every_short_buffer_without_overrun(void **state)
{
    ferry__msg m;
    char want[FERRY__HDR_MAX];
    static char buf[FERRY__HDR_MAX + 64];
    for (int variant = TYPICAL; variant <= EXTREME; variant++) {
        for (size_t i = 0; i < NTYPES; i++) {
            sample(&m, all_types[i], variant);
            size_t full = encode_ok(&m, want, sizeof want);
            for (size_t cap = 0; cap < full; cap++) {
                memset(buf, 0xAA, full + 64);
                size_t len = 777;
                int rc = ferry__msg_encode(&m, buf, cap, &len);
                assert_int_equal(rc, FERRY_ELIMIT);
                assert_int_equal(len, 777);
                for (size_t b = cap; b < full + 64; b++)
                    assert_int_equal((unsigned char)buf[b], 0xAA);
            }
            size_t len = 0;
            assert_int_equal(ferry__msg_encode(&m, buf, full, &len), FERRY_OK);
            assert_int_equal(len, full);
        }
    }
    sample(&m, FERRY__MSG_TASK, TYPICAL);
    size_t len;
    expect_error(ferry__msg_encode(&m, buf, 3, &len), FERRY_ELIMIT,
                 "TASK header does not fit in 3 bytes", "short");
}

/* ---------------------------------------------------------------------------
 * Payload frames
 */

static void test_check_payload_task_needs_exactly_count_indices(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_TASK, TYPICAL); /* count 256 */
    assert_int_equal(ferry__msg_check_payload(&m, 256 * 8), FERRY_OK);
    expect_error(ferry__msg_check_payload(&m, 256 * 8 - 1), FERRY_EPROTO,
                 "payload is 2047 bytes, count 256 needs 2048", "short");
    expect_error(ferry__msg_check_payload(&m, 256 * 8 + 1), FERRY_EPROTO, "2049", "long");
    expect_error(ferry__msg_check_payload(&m, 0), FERRY_EPROTO, "payload", "empty");
    m.u.task.count = FERRY__MAX_BATCH;
    assert_int_equal(ferry__msg_check_payload(&m, (size_t)FERRY__MAX_BATCH * 8), FERRY_OK);
}

static void test_check_payload_batch_fields_inside_and_disjoint(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_BATCH, TYPICAL); /* x: [0, 96), y: [128, 160) */
    assert_int_equal(ferry__msg_check_payload(&m, 160), FERRY_OK);
    assert_int_equal(ferry__msg_check_payload(&m, 4096), FERRY_OK);
    expect_error(ferry__msg_check_payload(&m, 159), FERRY_EPROTO,
                 "field 1: bytes at offset 128 size 32 lie outside", "one short");
    expect_error(ferry__msg_check_payload(&m, 0), FERRY_EPROTO, "field 0", "empty");

    m.u.batch.fields[1].offset = 96; /* touching is fine */
    assert_int_equal(ferry__msg_check_payload(&m, 128), FERRY_OK);
    m.u.batch.fields[1].offset = 95; /* one shared byte is not */
    expect_error(ferry__msg_check_payload(&m, 128), FERRY_EPROTO, "field 1: bytes overlap field 0",
                 "overlap");
    m.u.batch.fields[1].offset = 0;
    expect_error(ferry__msg_check_payload(&m, 128), FERRY_EPROTO, "overlap", "same offset");
    m.u.batch.fields[0].offset = 100; /* x: [100, 196) */
    m.u.batch.fields[1].offset = 96;  /* y: [96, 128) starts before x and runs into it */
    expect_error(ferry__msg_check_payload(&m, 196), FERRY_EPROTO, "overlap", "x after y");
    m.u.batch.fields[1].offset = 200;
    assert_int_equal(ferry__msg_check_payload(&m, 232), FERRY_OK);
}

/* A TASK's room in the batch slots is both numbers or neither; a BATCH in
 * shared memory has an empty frame, and its fields are checked against
 * the room (the loader's slot size) instead. */
static void test_shared_memory_keys_follow_their_rules(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_TASK, TYPICAL);
    m.u.task.shm_offset = 4096;
    expect_encode_refused(&m, "TASK: key 'shm_offset' is 4096 with 'shm_bytes' 0");
    m.u.task.shm_bytes = 8192;
    roundtrip_msg(&m);
    m.u.task.shm_bytes = (uint64_t)INT64_MAX + 1;
    expect_encode_refused(&m, "'shm_bytes'");

    sample(&m, FERRY__MSG_BATCH, TYPICAL); /* x: [0, 96), y: [128, 160) */
    m.u.batch.shm = 2;
    expect_encode_refused(&m, "'shm' is 2");
    m.u.batch.shm = 1;
    roundtrip_msg(&m);
    assert_int_equal(ferry__msg_check_payload(&m, 0), FERRY_OK);
    expect_error(ferry__msg_check_payload(&m, 160), FERRY_EPROTO,
                 "in shared memory with a 160-byte payload", "frame with shm");
    assert_int_equal(ferry__batch_check_layout(&m.u.batch, 160), FERRY_OK);
    expect_error(ferry__batch_check_layout(&m.u.batch, 159), FERRY_EPROTO,
                 "lie outside the 159 bytes of its shared memory", "outside the room");
    m.u.batch.fields[1].offset = 95;
    expect_error(ferry__batch_check_layout(&m.u.batch, 4096), FERRY_EPROTO, "overlap",
                 "overlap in the room");
}

/* offset + nbytes computed naively would wrap to a small number and pass. */
static void test_check_payload_survives_offsets_near_uint64_max(void **state)
{
    ferry__msg m;
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.fields[1].offset = UINT64_MAX - 10; /* + 32 wraps to 21 */
    expect_error(ferry__msg_check_payload(&m, 160), FERRY_EPROTO, "outside", "wrap");
    m.u.batch.fields[1].offset = 128;
    m.u.batch.fields[1].nbytes = UINT64_MAX;
    expect_error(ferry__msg_check_payload(&m, 160), FERRY_EPROTO, "outside", "huge nbytes");
    m.u.batch.fields[1].offset = UINT64_MAX;
    m.u.batch.fields[1].nbytes = UINT64_MAX;
    expect_error(ferry__msg_check_payload(&m, SIZE_MAX), FERRY_EPROTO, "outside", "both max");

    /* With a frame as large as size_t allows, fields at the very top are
     * inside, and the overlap test must not wrap either. */
    m.u.batch.fields[1].offset = (uint64_t)SIZE_MAX - 32;
    m.u.batch.fields[1].nbytes = 32;
    assert_int_equal(ferry__msg_check_payload(&m, SIZE_MAX), FERRY_OK);
    m.u.batch.fields[0].offset = (uint64_t)SIZE_MAX - 96 - 16;
    expect_error(ferry__msg_check_payload(&m, SIZE_MAX), FERRY_EPROTO, "overlap", "overlap at top");
}

static void test_check_payload_refuses_messages_without_payload(void **state)
{
    ferry__msg m;
    for (size_t i = 0; i < NTYPES; i++) {
        if (ferry__msg_has_payload(all_types[i]))
            continue;
        sample(&m, all_types[i], TYPICAL);
        expect_error(ferry__msg_check_payload(&m, 0), FERRY_EINVAL, "have no payload",
                     ferry__msg_name((int)all_types[i]));
    }
    expect_error(ferry__msg_check_payload(NULL, 0), FERRY_EINVAL, "NULL", "NULL");
    /* A BATCH struct no decoder could have produced is the caller's bug. */
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    m.u.batch.nfields = FERRY_MAX_FIELDS + 1;
    expect_error(ferry__msg_check_payload(&m, 4096), FERRY_EINVAL, "17 fields", "17 fields");
}

/* ---------------------------------------------------------------------------
 * Schemas
 */

/* The typical batch's fields without their batch dim: x f4 [3, 2], y i64. */
static void typical_batch_schema(ferry__schema *sc)
{
    static const int64_t xs[] = {3, 2};
    memset(sc, 0, sizeof *sc);
    sc->nfields = 2;
    set_item_field(&sc->fields[0], "x", FERRY_DTYPE_F32, xs, 2);
    set_item_field(&sc->fields[1], "y", FERRY_DTYPE_I64, NULL, 0);
}

static void expect_diff(const ferry__schema *want, const ferry__schema *got, const char *words)
{
    char why[256] = "";
    assert_int_equal(ferry__schema_diff(want, got, why, sizeof why), 1);
    if (!strstr(why, words))
        print_error("'%s' not in: %s\n", words, why);
    assert_non_null(strstr(why, words));
}

static void test_batch_schema_drops_the_batch_dim(void **state)
{
    ferry__msg m;
    ferry__schema got, want;
    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    ferry__batch_schema(&m.u.batch, &got);
    typical_batch_schema(&want);
    assert_memory_equal(&got, &want, sizeof got);
    char why[64] = "";
    assert_int_equal(ferry__schema_diff(&want, &got, why, sizeof why), 0);
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why, sizeof why), 0);
    assert_string_equal(why, "");
    /* Read straight from the batch, a difference is named the same way. */
    char why2[256] = "";
    want.fields[1].dtype = FERRY_DTYPE_I32;
    assert_int_equal(ferry__schema_diff(&want, &got, why, sizeof why), 1);
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why2, sizeof why2), 1);
    assert_string_equal(why, why2);
    want.nfields = 1;
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why2, sizeof why2), 1);
    assert_non_null(strstr(why2, "is extra"));
}

static void test_schema_diff_names_the_first_difference(void **state)
{
    ferry__schema want, got;
    typical_batch_schema(&want);
    static const int64_t other[] = {2, 3}, longer[] = {3, 2, 1};

    got = want;
    got.fields[1].dtype = FERRY_DTYPE_I8;
    expect_diff(&want, &got, "field 1 'y' is int8, not int64");
    got = want;
    set_item_field(&got.fields[0], "x", FERRY_DTYPE_F32, other, 2);
    expect_diff(&want, &got, "field 0 'x' has items of shape [2, 3], not [3, 2]");
    got = want;
    set_item_field(&got.fields[0], "x", FERRY_DTYPE_F32, longer, 3);
    expect_diff(&want, &got, "shape [3, 2, 1], not [3, 2]");
    got = want;
    got.fields[1].ndim = 1;
    got.fields[1].shape[0] = 1;
    expect_diff(&want, &got, "field 1 'y' has items of shape [1], not []");
    got = want;
    strcpy(got.fields[1].name, "label");
    expect_diff(&want, &got, "field 1 is 'label', not 'y'");
    got = want; /* the same fields in another order */
    got.fields[0] = want.fields[1];
    got.fields[1] = want.fields[0];
    expect_diff(&want, &got, "field 0 is 'y', not 'x'");
    got = want;
    got.nfields = 3;
    set_item_field(&got.fields[2], "z", FERRY_DTYPE_U8, NULL, 0);
    expect_diff(&want, &got, "field 2 'z' is extra: 2 fields expected");
    got = want;
    got.nfields = 1;
    expect_diff(&want, &got, "field 1 'y' is missing");
}

/* A field of variable shape: key "var" goes only with such a field (an
 * older peer's messages, without it, mean what they meant), its batch
 * shape need not start with the count, and a schema tells it from a fixed
 * field. */
static void test_fields_of_variable_shape(void **state)
{
    (void)state;
    ferry__msg m;
    char buf[FERRY__HDR_MAX];
    sample(&m, FERRY__MSG_READY, TYPICAL);
    size_t len = encode_ok(&m, buf, sizeof buf);
    assert_null(memmem(buf, len, "var", 3)); /* fixed fields: as before */

    typical_batch_schema(&m.u.ready.schema);
    m.u.ready.schema.fields[1].var = 1;
    m.u.ready.schema.fields[1].ndim = 1;
    m.u.ready.schema.fields[1].shape[0] = 4096; /* bytes reserved per item */
    roundtrip_msg(&m);
    len = encode_ok(&m, buf, sizeof buf);
    assert_non_null(memmem(buf, len, "var", 3));
    m.u.ready.schema.fields[1].ndim = 2; /* [] or [bytes per item] only */
    m.u.ready.schema.fields[1].shape[1] = 2;
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);

    sample(&m, FERRY__MSG_BATCH, TYPICAL);
    ferry__field_desc *y = &m.u.batch.fields[1];
    y->ndim = 2; /* not [count]: refused for a fixed field */
    y->shape[0] = 7;
    y->shape[1] = 3;
    y->nbytes = 7 * 3 * 8;
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);
    y->var = 1;
    roundtrip_msg(&m); /* the whole message back, var and shape [7, 3] included */

    ferry__schema want;
    typical_batch_schema(&want);
    char why[256] = "";
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why, sizeof why), 1);
    assert_non_null(strstr(why, "field 1 'y' has a variable shape, not a fixed one"));
    want.fields[1].var = 1; /* whatever the shape and the bytes reserved */
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why, sizeof why), 0);
    y->var = 0;
    y->ndim = 1;
    y->shape[0] = m.u.batch.count;
    y->nbytes = (uint64_t)m.u.batch.count * 8;
    assert_int_equal(ferry__batch_schema_diff(&want, &m.u.batch, why, sizeof why), 1);
    assert_non_null(strstr(why, "has a fixed shape, not a variable one"));
}

/* ---------------------------------------------------------------------------
 * The fuzz target's seeds
 */

/* Every seed in tests/fuzz/corpus, split as fuzz_protocol.c splits its
 * input, still decodes (with its payload) after a change to the protocol,
 * and every message type has one: a stale seed would only start the fuzzer
 * off on what the decoder now refuses. Regenerate them with
 * ferry_fuzz_seeds (tests/fuzz/make_seeds.c). */
static void test_fuzz_seeds_decode_and_cover_every_type(void **state)
{
    DIR *d = opendir(FERRY_FUZZ_CORPUS);
    assert_non_null(d);
    int seen[FERRY__MSG_REFUSE + 1] = {0};
    static unsigned char data[2 * FERRY__HDR_MAX];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", FERRY_FUZZ_CORPUS, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        size_t size = fread(data, 1, sizeof data, f);
        fclose(f);
        assert_true(size >= 1 && size < sizeof data);
        size_t hlen = (size - 1) * data[0] / 255;
        ferry__msg m;
        int rc = decode_exact(data + 1, hlen, &m);
        if (rc == FERRY_OK && ferry__msg_has_payload(m.type))
            rc = ferry__msg_check_payload(&m, size - 1 - hlen);
        if (rc != FERRY_OK)
            print_error("seed %s: %s\n", e->d_name, ferry_last_error());
        assert_int_equal(rc, FERRY_OK);
        seen[m.type]++;
    }
    closedir(d);
    for (size_t i = 0; i < NTYPES; i++) {
        if (!seen[all_types[i]])
            print_error("no seed for %s\n", ferry__msg_name((int)all_types[i]));
        assert_true(seen[all_types[i]] > 0);
    }
}

/* ---------------------------------------------------------------------------
 * Robustness
 */

static uint64_t rng_state = UINT64_C(0x9e3779b97f4a7c15);

static uint64_t rng(void)
{
    /* xorshift64*: deterministic, so a failure replays. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * UINT64_C(2685821657736338717);
}

/* Whatever the decoder accepts, the encoder accepts too and reproduces. */
static void check_outcome(int rc, const ferry__msg *out)
{
    if (rc != FERRY_OK && rc != FERRY_EPROTO) {
        print_error("decoder returned %s: %s\n", ferry_err_name(rc), ferry_last_error());
        fail();
    }
    if (rc != FERRY_OK)
        return;
    char buf[FERRY__HDR_MAX];
    ferry__msg again;
    size_t len = encode_ok(out, buf, sizeof buf);
    assert_int_equal(decode_exact(buf, len, &again), FERRY_OK);
    assert_memory_equal(out, &again, sizeof again);
}

static void test_decoder_survives_random_bytes(void **state)
{
    unsigned char buf[1024];
    ferry__msg out;
    for (int iter = 0; iter < 60000; iter++) {
        size_t len = (size_t)(rng() % (iter % 10 == 0 ? sizeof buf : 48));
        for (size_t i = 0; i < len; i++)
            buf[i] = (unsigned char)rng();
        /* Half of them start like a small map, to get past the first check. */
        if (len > 0 && iter % 2 == 0)
            buf[0] = (unsigned char)(0x80 | (rng() % 8));
        check_outcome(decode_exact(buf, len, &out), &out);
    }
}

static void test_decoder_survives_mutations_of_valid_messages(void **state)
{
    ferry__msg m, out;
    char valid[FERRY__HDR_MAX], buf[FERRY__HDR_MAX];
    int accepted = 0;
    for (int variant = TYPICAL; variant <= EXTREME; variant++) {
        for (size_t i = 0; i < NTYPES; i++) {
            sample(&m, all_types[i], variant);
            size_t len = encode_ok(&m, valid, sizeof valid);
            for (int iter = 0; iter < 3000; iter++) {
                memcpy(buf, valid, len);
                size_t pos = (size_t)(rng() % len);
                buf[pos] = (char)rng();
                int rc = decode_exact(buf, len, &out);
                accepted += rc == FERRY_OK;
                check_outcome(rc, &out);
                /* And the same mutation on a frame cut short. */
                size_t cut = pos + 1 + (size_t)(rng() % (len - pos));
                if (cut < len)
                    check_outcome(decode_exact(buf, cut, &out), &out);
            }
        }
    }
    /* Some mutations only change a value (a digit of an id): those decode. */
    assert_true(accepted > 0);
}

/* One spelling of a dtype everywhere: numpy's names, both ways, and the
 * sizes that go with them. */
static void test_dtype_names_are_numpys(void **state)
{
    (void)state;
    static const struct {
        ferry_dtype d;
        const char *name;
        size_t size;
    } table[] = {
        {FERRY_DTYPE_U8, "uint8", 1},     {FERRY_DTYPE_I8, "int8", 1},
        {FERRY_DTYPE_U16, "uint16", 2},   {FERRY_DTYPE_I16, "int16", 2},
        {FERRY_DTYPE_U32, "uint32", 4},   {FERRY_DTYPE_I32, "int32", 4},
        {FERRY_DTYPE_U64, "uint64", 8},   {FERRY_DTYPE_I64, "int64", 8},
        {FERRY_DTYPE_F16, "float16", 2},  {FERRY_DTYPE_F32, "float32", 4},
        {FERRY_DTYPE_F64, "float64", 8},  {FERRY_DTYPE_BOOL, "bool", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        assert_string_equal(ferry_dtype_name(table[i].d), table[i].name);
        assert_int_equal(ferry_dtype_from_name(table[i].name), table[i].d);
        assert_int_equal(ferry_dtype_size(table[i].d), table[i].size);
    }
    assert_null(ferry_dtype_name(0));
    assert_null(ferry_dtype_name(13));
    assert_null(ferry_dtype_name(-1));
    /* numpy's type strings are not dtype names. */
    assert_int_equal(ferry_dtype_from_name("i8"), 0);
    assert_int_equal(ferry_dtype_from_name("<f4"), 0);
    assert_int_equal(ferry_dtype_from_name("float"), 0);
    assert_int_equal(ferry_dtype_from_name(""), 0);
    assert_int_equal(ferry_dtype_from_name(NULL), 0);
}

/* ------------------------------------------------------------------------
 * Sealed messages (seal.h): what a CURVE session's data connection carries
 */

/* One message sealed as a sender would: header text and payload bytes
 * copied in and sealed in place. */
typedef struct sealed {
    unsigned char hdr[64 + FERRY__SEAL_TRAILER];
    size_t hlen;
    unsigned char payload[256];
    size_t plen;
} sealed;

static void seal_one(ferry__seal *s, const char *text, unsigned char fill, sealed *out)
{
    memset(out, 0, sizeof *out);
    out->hlen = strlen(text);
    memcpy(out->hdr, text, out->hlen);
    out->plen = sizeof out->payload;
    memset(out->payload, fill, out->plen);
    assert_int_equal(ferry__seal_message(s, out->hdr, &out->hlen, sizeof out->hdr, 1, out->payload,
                                         out->plen),
                     FERRY_OK);
}

/* Opens m (a copy: opening works in place) with s; FERRY_OK only when the
 * header and payload both authenticate, and then they are plain again. */
static int open_one(ferry__seal *s, const sealed *m, int has_payload, sealed *plain)
{
    *plain = *m;
    ferry__seal_opened op;
    int rc = ferry__seal_open_header(s, plain->hdr, &plain->hlen, has_payload, &op);
    if (rc == FERRY_OK && has_payload)
        rc = ferry__seal_open_payload(s, &op, plain->payload, plain->plen);
    return rc;
}

static void test_sealed_messages_open_only_as_sent(void **state)
{
    (void)state;
    char keys[FERRY__SEAL_KEYS_HEX + 1], other[FERRY__SEAL_KEYS_HEX + 1];
    assert_int_equal(ferry__random_hex(keys, FERRY__SEAL_KEYS_HEX / 2), FERRY_OK);
    assert_int_equal(ferry__random_hex(other, FERRY__SEAL_KEYS_HEX / 2), FERRY_OK);
    assert_int_equal(strlen(keys), FERRY__SEAL_KEYS_HEX);
    assert_string_not_equal(keys, other);
    ferry__seal *loader, *worker, *stranger;
    assert_int_equal(ferry__seal_new(&loader, keys, FERRY__SEAL_LOADER), FERRY_OK);
    assert_int_equal(ferry__seal_new(&worker, keys, FERRY__SEAL_WORKER), FERRY_OK);
    assert_int_equal(ferry__seal_new(&stranger, other, FERRY__SEAL_WORKER), FERRY_OK);

    /* As sent: ciphertext on the way, the same bytes once opened. */
    sealed a, b, got;
    seal_one(loader, "a TASK header", 0xab, &a);
    assert_int_equal(a.hlen, strlen("a TASK header") + FERRY__SEAL_TRAILER);
    assert_memory_not_equal(a.hdr, "a TASK header", strlen("a TASK header"));
    unsigned char plain[256];
    memset(plain, 0xab, sizeof plain);
    assert_memory_not_equal(a.payload, plain, sizeof plain);
    assert_int_equal(open_one(worker, &a, 1, &got), FERRY_OK);
    assert_int_equal(got.hlen, strlen("a TASK header"));
    assert_memory_equal(got.hdr, "a TASK header", got.hlen);
    assert_memory_equal(got.payload, plain, sizeof plain);

    /* Replayed: refused, by its counter. */
    assert_int_equal(open_one(worker, &a, 1, &got), FERRY_EPROTO);
    assert_non_null(strstr(ferry_last_error(), "replayed"));

    /* Any byte changed, in the header, its trailer or the payload. */
    size_t spots[] = {0, strlen("a TASK header") - 1, a.hlen - FERRY__SEAL_TRAILER + 8,
                      a.hlen - FERRY__SEAL_TAG - 1, a.hlen - 1};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0] + 1; i++) {
        seal_one(loader, "a TASK header", 0xab, &a);
        if (i < sizeof spots / sizeof spots[0])
            a.hdr[spots[i]] ^= 0x01;
        else
            a.payload[100] ^= 0x80;
        assert_int_equal(open_one(worker, &a, 1, &got), FERRY_EPROTO);
    }

    /* A payload from another message, a payload dropped or added. */
    seal_one(loader, "first", 0x11, &a);
    seal_one(loader, "second", 0x22, &b);
    memcpy(b.payload, a.payload, sizeof b.payload);
    assert_int_equal(open_one(worker, &b, 1, &got), FERRY_EPROTO);
    seal_one(loader, "third", 0x33, &a);
    assert_int_equal(open_one(worker, &a, 0, &got), FERRY_EPROTO);

    /* The other direction's message sent back (a reflection), or another
     * session's: neither opens. */
    seal_one(worker, "a BATCH header", 0x44, &a);
    assert_int_equal(open_one(worker, &a, 1, &got), FERRY_EPROTO);
    seal_one(loader, "fourth", 0x55, &a);
    assert_int_equal(open_one(stranger, &a, 1, &got), FERRY_EPROTO);
    /* and the session goes on after all those refusals */
    seal_one(worker, "a BATCH header", 0x66, &a);
    assert_int_equal(open_one(loader, &a, 1, &got), FERRY_OK);
    seal_one(loader, "fifth", 0x77, &a);
    assert_int_equal(open_one(worker, &a, 1, &got), FERRY_OK);
    assert_memory_equal(got.hdr, "fifth", 5);

    /* Too short to carry a trailer. */
    unsigned char tiny[8] = {0};
    size_t tlen = sizeof tiny;
    ferry__seal_opened op;
    assert_int_equal(ferry__seal_open_header(worker, tiny, &tlen, 0, &op), FERRY_EPROTO);

    /* Keys that are not two keys in lowercase hex. */
    ferry__seal *bad = NULL;
    char upper[FERRY__SEAL_KEYS_HEX + 1];
    memcpy(upper, keys, sizeof upper);
    for (char *c = upper; *c; c++)
        if (*c >= 'a' && *c <= 'f')
            *c = (char)(*c - 'a' + 'A');
    const char *wrong[] = {"", "00", upper, "zz"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        if (i == 2 && strcmp(upper, keys) == 0)
            continue; /* drawn without a letter, once in 2^84 */
        assert_int_equal(ferry__seal_new(&bad, wrong[i], FERRY__SEAL_LOADER), FERRY_EPROTO);
        assert_null(bad);
    }
    ferry__seal_free(loader);
    ferry__seal_free(worker);
    ferry__seal_free(stranger);
}

/* The same through zsock over a socket pair: a sealed TASK arrives whole
 * with the opener, and without one its header does not even decode. */
static void test_sealed_task_through_zsock(void **state)
{
    (void)state;
    char keys[FERRY__SEAL_KEYS_HEX + 1];
    assert_int_equal(ferry__random_hex(keys, FERRY__SEAL_KEYS_HEX / 2), FERRY_OK);
    ferry__seal *loader, *worker;
    assert_int_equal(ferry__seal_new(&loader, keys, FERRY__SEAL_LOADER), FERRY_OK);
    assert_int_equal(ferry__seal_new(&worker, keys, FERRY__SEAL_WORKER), FERRY_OK);
    void *ctx = zmq_ctx_new();
    void *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    assert_int_equal(zmq_bind(a, "inproc://sealed"), 0);
    assert_int_equal(zmq_connect(b, "inproc://sealed"), 0);
    ferry__zsock_opener opener = {.seal = worker};
    for (int round = 0; round < 2; round++) {
        ferry__msg m, in;
        memset(&m, 0, sizeof m);
        m.type = FERRY__MSG_TASK;
        m.u.task = (ferry__task){.id = 9, .epoch = 1, .batch_in_epoch = 2, .seq = 3, .count = 4};
        uint64_t idx[4] = {10, 11, 12, 13}, back[4];
        zmq_msg_t p, got;
        zmq_msg_init_size(&p, sizeof idx);
        ferry__indices_pack(idx, 4, zmq_msg_data(&p));
        assert_int_equal(ferry__zsock_send(a, NULL, loader, &m, &p, 0), FERRY_OK);
        int rc = ferry__zsock_recv(b, NULL, round == 0 ? &opener : NULL, &in, &got, 0);
        if (round == 1) {
            assert_int_equal(rc, FERRY_EPROTO);
            continue;
        }
        assert_int_equal(rc, FERRY_OK);
        assert_int_equal(in.type, FERRY__MSG_TASK);
        assert_int_equal(in.u.task.id, 9);
        assert_int_equal(in.u.task.batch_in_epoch, 2);
        assert_int_equal(zmq_msg_size(&got), sizeof idx);
        ferry__indices_unpack(zmq_msg_data(&got), 4, back);
        assert_memory_equal(back, idx, sizeof idx);
        zmq_msg_close(&got);
    }
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    ferry__seal_free(loader);
    ferry__seal_free(worker);
}

/* CONFIG's keys come with a data port and are two keys in lowercase hex
 * (the encoder applies the decoder's checks). */
static void test_config_keys_need_a_data_connection(void **state)
{
    (void)state;
    ferry__msg m, out;
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_CONFIG;
    m.u.config = (ferry__config_msg){.worker_index = 0, .num_workers = 1, .credits = 2,
                                     .liveness = 3, .max_message = FERRY__MIN_MESSAGE};
    strcpy(m.u.config.dataset, "synthetic:n=10,dim=4");
    unsigned char buf[FERRY__HDR_MAX];
    size_t len;
    memset(m.u.config.seal, 'a', FERRY__SEAL_KEYS_HEX);
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL); /* no port */
    assert_non_null(strstr(ferry_last_error(), "'seal'"));
    m.u.config.data_port = 4000;
    memset(m.u.config.token, 'b', FERRY__TOKEN_HEX);
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_OK);
    assert_int_equal(ferry__msg_decode(buf, len, &out), FERRY_OK);
    assert_string_equal(out.u.config.seal, m.u.config.seal);
    m.u.config.seal[5] = 'G';
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);
    m.u.config.seal[5] = '\0';
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);
}

/* The retirement keys (CONFIG's retire_rss and retire_batches, BYE's
 * retired, rss and batches) are optional: sent only when set, so a CONFIG
 * or BYE without them is byte for byte what it was before them; a BYE
 * carries figures only with a reason, and a reason is 1 or 2. */
static void test_retirement_keys_are_optional_and_sent_only_when_set(void **state)
{
    (void)state;
    ferry__msg m, out;
    char buf[FERRY__HDR_MAX];
    sample(&m, FERRY__MSG_CONFIG, TYPICAL);
    size_t len = encode_ok(&m, buf, sizeof buf);
    assert_null(memmem(buf, len, "retire", 6));
    m.u.config.retire_rss = (uint64_t)2 << 30;
    roundtrip_msg(&m);
    len = encode_ok(&m, buf, sizeof buf);
    assert_non_null(memmem(buf, len, "retire_rss", 10));
    assert_null(memmem(buf, len, "retire_batches", 14));
    m.u.config.retire_batches = 1000;
    roundtrip_msg(&m);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_BYE;
    len = encode_ok(&m, buf, sizeof buf);
    assert_int_equal(len, 7); /* {"type": 9}: fixmap 1, fixstr 4, "type", 9 */
    assert_int_equal(decode_exact(buf, len, &out), FERRY_OK);
    assert_int_equal(out.u.bye.retired, 0);
    m.u.bye = (ferry__bye){.retired = FERRY__RETIRE_MEMORY, .rss = 3 << 20, .batches = 7};
    roundtrip_msg(&m);
    m.u.bye.retired = 3;
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);
    m.u.bye.retired = FERRY__RETIRE_NONE; /* figures without a reason */
    assert_int_equal(ferry__msg_encode(&m, buf, sizeof buf, &len), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "without 'retired'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_names_are_numpys),
        cmocka_unit_test(test_fields_of_variable_shape),
        cmocka_unit_test(test_retirement_keys_are_optional_and_sent_only_when_set),
        cmocka_unit_test(test_every_message_type_round_trips_typical_values),
        cmocka_unit_test(test_every_message_type_round_trips_extreme_values_within_hdr_max),
        cmocka_unit_test(test_ready_with_error_and_slot_minus_one_round_trip),
        cmocka_unit_test(test_names_and_payload_flags),
        cmocka_unit_test(test_hello_and_refuse_are_frozen),
        cmocka_unit_test(test_decode_rejects_wrong_msgpack_type_for_every_key),
        cmocka_unit_test(test_decode_rejects_missing_and_duplicate_keys),
        cmocka_unit_test(test_decode_rejects_unknown_keys),
        cmocka_unit_test(test_decode_rejects_out_of_range_scalars),
        cmocka_unit_test(test_decode_detail_names_message_key_value_and_range),
        cmocka_unit_test(test_decode_rejects_inconsistent_batch_fields),
        cmocka_unit_test(test_decode_rejects_inconsistent_ready_schema),
        cmocka_unit_test(test_decode_accepts_16_fields_and_rejects_17),
        cmocka_unit_test(test_shared_memory_keys_follow_their_rules),
        cmocka_unit_test(test_decode_rejects_strings_too_long_or_with_nul),
        cmocka_unit_test(test_decode_rejects_what_is_not_a_header_map),
        cmocka_unit_test(test_decode_accepts_any_integer_or_string_format),
        cmocka_unit_test(test_decode_rejects_trailing_bytes),
        cmocka_unit_test(test_decode_rejects_every_truncation_of_valid_messages),
        cmocka_unit_test(test_decode_rejects_frames_over_hdr_max),
        cmocka_unit_test(test_decode_refuses_containers_bigger_than_the_frame),
        cmocka_unit_test(test_decode_rejects_deep_nesting),
        cmocka_unit_test(test_encode_refuses_what_the_decoder_would_refuse),
        cmocka_unit_test(test_encode_refuses_bad_schemas_and_version_2_keys),
        cmocka_unit_test(test_encode_reports_elimit_for_every_short_buffer_without_overrun),
        cmocka_unit_test(test_check_payload_task_needs_exactly_count_indices),
        cmocka_unit_test(test_check_payload_batch_fields_inside_and_disjoint),
        cmocka_unit_test(test_check_payload_survives_offsets_near_uint64_max),
        cmocka_unit_test(test_check_payload_refuses_messages_without_payload),
        cmocka_unit_test(test_batch_schema_drops_the_batch_dim),
        cmocka_unit_test(test_schema_diff_names_the_first_difference),
        cmocka_unit_test(test_fuzz_seeds_decode_and_cover_every_type),
        cmocka_unit_test(test_decoder_survives_random_bytes),
        cmocka_unit_test(test_decoder_survives_mutations_of_valid_messages),
        cmocka_unit_test(test_sealed_messages_open_only_as_sent),
        cmocka_unit_test(test_sealed_task_through_zsock),
        cmocka_unit_test(test_config_keys_need_a_data_connection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
