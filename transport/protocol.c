/*
 * protocol.c - encoding and strict decoding of the loader <-> worker header
 * frames (the contract is transport/protocol.h, the wire format is
 * docs/protocol.md).
 *
 * Position in the data flow: the scheduler encodes what the loader sends
 * (CONFIG, TASK, HEARTBEAT, STOP, REFUSE) and decodes what workers send;
 * the worker loop does the reverse. Nothing here knows about sockets,
 * epochs or datasets. It also says whether a BATCH matches the schema a
 * READY announced (ferry__schema_diff), since both are wire structs.
 *
 * One table per message type drives everything. A key_spec names a key, its
 * kind (unsigned, signed, string, an array of dims, or an array of maps with
 * a table of their own: BATCH's fields, READY's schema), where the value
 * lives in the message's struct and the range it may take (for an array,
 * how many elements). The encoder packs from the table, the decoder unpacks
 * into it, and validate() checks a struct against it plus the few rules
 * that tie keys together (READY, CONFIG, and each field's rule). Encoder and
 * decoder both call validate(), so the two sides of the wire cannot disagree
 * about what is legal.
 *
 * The decoder works in two steps on purpose. Unpacking only checks that each
 * value has the expected msgpack type and can be stored in its C member (5e9
 * cannot land in a uint32, a string must fit its buffer); every rule about
 * what a value means lives in validate(), written once.
 *
 * Invariants: the encoder never allocates and never writes past the caller's
 * capacity. The decoder's only allocation is msgpack-c's zone for one frame,
 * freed before it returns; that zone stays proportional to the frame because
 * scan_frame() first refuses any container that declares more elements than
 * the bytes left could hold (msgpack-c sizes its allocation by the declared
 * count, so a 5-byte frame could otherwise ask for about 100 GB).
 *
 * Threads: no state of its own; every function works on caller-owned memory,
 * so any thread may call any function at any time.
 */
#include "protocol.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "error.h"

/* The dtype member is stored through a uint32_t like any other unsigned key. */
_Static_assert(sizeof(ferry_dtype) == sizeof(uint32_t), "ferry_dtype must be 32 bits wide");

/* ---------------------------------------------------------------------------
 * Key tables
 */

typedef enum key_kind {
    K_UINT, /* msgpack positive int, stored as uint32_t or uint64_t */
    K_INT,  /* msgpack positive or negative int, stored as int32_t or int64_t */
    K_STR,  /* msgpack str, stored NUL-terminated in a char array */
    K_DIMS, /* array of ints: an int64_t array, and their number in a 32-bit member */
    K_MAPS, /* array of maps, each by `sub`: an array of structs, and their number */
} key_kind;

typedef struct key_spec key_spec;

/* The rules for one element of a K_MAPS array beyond its own keys' ranges;
 * `parent` is the struct holding the array. */
typedef int (*elem_rule)(const void *elem, const void *parent, const char *where);

struct key_spec {
    const char *name;
    key_kind kind;
    size_t off;  /* of the member within the message's struct */
    size_t size; /* of the member: 4 or 8 for integers, the buffer for strings, the array */
    union {
        struct {
            uint64_t lo, hi; /* K_UINT: values; K_STR: lengths; K_DIMS, K_MAPS: elements */
        } u;
        struct {
            int64_t lo, hi; /* K_INT: values allowed */
        } s;
    } range;
    /* K_DIMS and K_MAPS only */
    size_t count_off; /* of the 32-bit member holding the number of elements */
    size_t elem_size;
    const key_spec *sub; /* K_MAPS: the keys of each element */
    size_t nsub;
    elem_rule rule; /* K_MAPS: each element's own rules */
    int optional;   /* K_UINT only: may be absent (read as 0), and is not sent when 0 */
};

#define MEMBER_SIZE(T, m) sizeof(((T *)0)->m)
#define KEY(T, m, kind_) .name = #m, .kind = kind_, .off = offsetof(T, m), .size = MEMBER_SIZE(T, m)
/* Table entries: {KEY_UINT(struct, member, least, greatest)}. */
#define KEY_UINT(T, m, lo, hi) KEY(T, m, K_UINT), .range.u = {(lo), (hi)}
/* A key added to the protocol later: older peers neither send nor expect it. */
#define KEY_UINT_OPT(T, m, lo, hi) KEY_UINT(T, m, lo, hi), .optional = 1
#define KEY_INT(T, m, lo, hi) KEY(T, m, K_INT), .range.s = {(lo), (hi)}
#define KEY_STR(T, m, minlen) KEY(T, m, K_STR), .range.u = {(minlen), MEMBER_SIZE(T, m) - 1}
#define KEY_ARRAY(T, m, count, lo, hi)                                                             \
    .off = offsetof(T, m), .size = MEMBER_SIZE(T, m), .range.u = {(lo), (hi)},                     \
    .count_off = offsetof(T, count), .elem_size = MEMBER_SIZE(T, m[0])
/* {KEY_DIMS(struct, member, count member, fewest, most)} */
#define KEY_DIMS(T, m, count, lo, hi) .name = #m, .kind = K_DIMS, KEY_ARRAY(T, m, count, lo, hi)
/* {KEY_MAPS(struct, "key", member, count member, fewest, most, element keys, rule)} */
#define KEY_MAPS(T, name_, m, count, lo, hi, sub_, rule_)                                          \
    .name = name_, .kind = K_MAPS, KEY_ARRAY(T, m, count, lo, hi), .sub = (sub_),                  \
    .nsub = COUNT_OF(sub_), .rule = (rule_)
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Counts are reached as 32-bit unsigned, whether declared int or uint32_t. */
_Static_assert(sizeof(int) == sizeof(uint32_t), "counts must be 32 bits wide");

static const key_spec hello_keys[] = {
    {KEY_UINT(ferry__hello, version, 0, UINT32_MAX)},
    {KEY_UINT(ferry__hello, pid, 0, UINT32_MAX)},
    {KEY_INT(ferry__hello, slot, -1, INT32_MAX)},
    {KEY_STR(ferry__hello, host, 0)},
    {KEY_STR(ferry__hello, program, 0)},
};

static const key_spec config_keys[] = {
    {KEY_STR(ferry__config_msg, dataset, 1)},
    {KEY_UINT(ferry__config_msg, worker_index, 0, UINT32_MAX)},
    {KEY_UINT(ferry__config_msg, num_workers, 1, UINT32_MAX)},
    {KEY_UINT(ferry__config_msg, seed, 0, UINT64_MAX)},
    {KEY_UINT(ferry__config_msg, credits, 1, FERRY__MAX_CREDITS)},
    {KEY_UINT(ferry__config_msg, heartbeat_ms, 0, UINT32_MAX)},
    {KEY_UINT(ferry__config_msg, liveness, 1, 1000)},
    {KEY_UINT(ferry__config_msg, max_message, FERRY__MIN_MESSAGE, INT64_MAX)},
    {KEY_UINT(ferry__config_msg, data_port, 0, 65535)},
    {KEY_STR(ferry__config_msg, token, 0)},
    {KEY_STR(ferry__config_msg, seal, 0)},
    {KEY_UINT_OPT(ferry__config_msg, retire_rss, 0, UINT64_MAX)},
    {KEY_UINT_OPT(ferry__config_msg, retire_batches, 0, UINT64_MAX)},
};

static int check_item_field(const void *elem, const void *parent, const char *where);
static int check_field(const void *elem, const void *parent, const char *where);

/* dtype takes any uint32 in both field tables; shape_size() asks
 * ferry_dtype_size(), the one authority on which dtypes exist. */
static const key_spec item_field_keys[] = {
    {KEY_STR(ferry__item_field, name, 1)},
    {KEY_UINT(ferry__item_field, dtype, 0, UINT32_MAX)},
    {KEY_DIMS(ferry__item_field, shape, ndim, 0, FERRY_MAX_DIMS - 1)},
    {KEY_UINT_OPT(ferry__item_field, var, 0, 1)},
};

static const key_spec ready_keys[] = {
    {KEY_UINT(ferry__ready, length, 0, UINT64_MAX)},
    {KEY_INT(ferry__ready, code, INT32_MIN, 0)},
    {KEY_STR(ferry__ready, error, 0)},
    {KEY_MAPS(ferry__ready, "fields", schema.fields, schema.nfields, 0, FERRY_MAX_FIELDS,
              item_field_keys, check_item_field)},
};

static const key_spec task_keys[] = {
    {KEY_UINT(ferry__task, id, 0, UINT64_MAX)},
    {KEY_UINT(ferry__task, epoch, 0, UINT64_MAX)},
    {KEY_UINT(ferry__task, batch_in_epoch, 0, UINT64_MAX)},
    {KEY_UINT(ferry__task, seq, 0, UINT64_MAX)},
    {KEY_UINT(ferry__task, count, 1, FERRY__MAX_BATCH)},
    {KEY_UINT(ferry__task, shm_offset, 0, INT64_MAX)},
    {KEY_UINT(ferry__task, shm_bytes, 0, INT64_MAX)},
};

static const key_spec field_keys[] = {
    {KEY_STR(ferry__field_desc, name, 1)},
    {KEY_UINT(ferry__field_desc, dtype, 0, UINT32_MAX)},
    {KEY_DIMS(ferry__field_desc, shape, ndim, 1, FERRY_MAX_DIMS)},
    {KEY_UINT(ferry__field_desc, offset, 0, UINT64_MAX)},
    {KEY_UINT(ferry__field_desc, nbytes, 0, UINT64_MAX)},
    {KEY_UINT_OPT(ferry__field_desc, var, 0, 1)},
};

static const key_spec batch_keys[] = {
    {KEY_UINT(ferry__batch_hdr, id, 0, UINT64_MAX)},
    {KEY_UINT(ferry__batch_hdr, count, 1, FERRY__MAX_BATCH)},
    {KEY_UINT(ferry__batch_hdr, make_ns, 0, UINT64_MAX)},
    {KEY_UINT(ferry__batch_hdr, shm, 0, 1)},
    {KEY_MAPS(ferry__batch_hdr, "fields", fields, nfields, 1, FERRY_MAX_FIELDS, field_keys,
              check_field)},
};

static const key_spec fail_keys[] = {
    {KEY_UINT(ferry__fail, id, 0, UINT64_MAX)},
    {KEY_INT(ferry__fail, code, INT32_MIN, -1)},
    {KEY_UINT(ferry__fail, index, 0, UINT64_MAX)},
    {KEY_STR(ferry__fail, message, 0)},
};

/* All optional: a plain BYE is {"type": 9}, as it always was. */
static const key_spec bye_keys[] = {
    {KEY_UINT_OPT(ferry__bye, retired, 0, FERRY__RETIRE_BATCHES)},
    {KEY_UINT_OPT(ferry__bye, rss, 0, UINT64_MAX)},
    {KEY_UINT_OPT(ferry__bye, batches, 0, UINT64_MAX)},
};

/* Never to change, like HELLO: see docs/protocol.md section 7. */
static const key_spec refuse_keys[] = {
    {KEY_UINT(ferry__refuse, version, 0, UINT32_MAX)},
    {KEY_STR(ferry__refuse, reason, 0)},
};

static int check_config(const void *body);
static int check_ready(const void *body);
static int check_task(const void *body);
static int check_bye(const void *body);

typedef struct msg_spec {
    const char *name;
    const key_spec *keys; /* every key but "type", which all messages share */
    size_t nkeys;
    int (*check)(const void *body); /* rules across keys, NULL if none */
    int has_payload;
    size_t size; /* of the body's struct */
} msg_spec;

static const msg_spec msg_specs[] = {
    [FERRY__MSG_HELLO] = {"HELLO", hello_keys, COUNT_OF(hello_keys), NULL, 0,
                          sizeof(ferry__hello)},
    [FERRY__MSG_CONFIG] = {"CONFIG", config_keys, COUNT_OF(config_keys), check_config, 0,
                           sizeof(ferry__config_msg)},
    [FERRY__MSG_READY] = {"READY", ready_keys, COUNT_OF(ready_keys), check_ready, 0,
                          sizeof(ferry__ready)},
    [FERRY__MSG_TASK] = {"TASK", task_keys, COUNT_OF(task_keys), check_task, 1,
                         sizeof(ferry__task)},
    [FERRY__MSG_BATCH] = {"BATCH", batch_keys, COUNT_OF(batch_keys), NULL, 1,
                          sizeof(ferry__batch_hdr)},
    [FERRY__MSG_FAIL] = {"FAIL", fail_keys, COUNT_OF(fail_keys), NULL, 0, sizeof(ferry__fail)},
    [FERRY__MSG_HEARTBEAT] = {"HEARTBEAT", NULL, 0, NULL, 0, 0},
    [FERRY__MSG_STOP] = {"STOP", NULL, 0, NULL, 0, 0},
    [FERRY__MSG_BYE] = {"BYE", bye_keys, COUNT_OF(bye_keys), check_bye, 0, sizeof(ferry__bye)},
    [FERRY__MSG_REFUSE] = {"REFUSE", refuse_keys, COUNT_OF(refuse_keys), NULL, 0,
                           sizeof(ferry__refuse)},
};

/* The spec of message type `type`, NULL if there is no such type. */
static const msg_spec *spec_of(uint64_t type)
{
    if (type >= COUNT_OF(msg_specs) || msg_specs[type].name == NULL)
        return NULL;
    return &msg_specs[type];
}

/* Integer members are reached through memcpy so one table entry serves both
 * widths without aliasing games. */
static uint64_t load_uint(const void *body, const key_spec *k)
{
    const char *p = (const char *)body + k->off;
    if (k->size == sizeof(uint32_t)) {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int64_t load_int(const void *body, const key_spec *k)
{
    const char *p = (const char *)body + k->off;
    if (k->size == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The number of elements of a K_DIMS or K_MAPS key. */
static uint32_t load_count(const void *body, const key_spec *k)
{
    uint32_t n;
    memcpy(&n, (const char *)body + k->count_off, sizeof n);
    return n;
}

static void store_count(void *body, const key_spec *k, uint32_t n)
{
    memcpy((char *)body + k->count_off, &n, sizeof n);
}

/* Element i of a K_DIMS key (a dim) or of a K_MAPS key (a struct). */
static int64_t load_dim(const void *body, const key_spec *k, uint32_t i)
{
    int64_t v;
    memcpy(&v, (const char *)body + k->off + i * sizeof v, sizeof v);
    return v;
}

static const void *elem_at(const void *body, const key_spec *k, uint32_t i)
{
    return (const char *)body + k->off + (size_t)i * k->elem_size;
}

/* ---------------------------------------------------------------------------
 * Validation: the single statement of what a legal message is
 */

/* The number of elements of array key k, outside its range: "has 9 dims". */
static int bad_count(const key_spec *k, uint64_t n, const char *where)
{
    return ferry__seterr(
        FERRY_EPROTO, "%s: key '%s' has %" PRIu64 " %s, must be %" PRIu64 "..%" PRIu64, where,
        k->name, n, k->kind == K_DIMS ? "dims" : "entries", k->range.u.lo, k->range.u.hi);
}

static int check_keys(const key_spec *keys, size_t nkeys, const void *body, const char *where);

/* Element i of K_MAPS key k: its keys, its rule, and a name no earlier
 * element has (every element struct starts with its name). */
static int check_element(const key_spec *k, const void *body, uint32_t i, const char *ewhere)
{
    const char *e = elem_at(body, k, i);
    int rc = check_keys(k->sub, k->nsub, e, ewhere);
    if (rc == FERRY_OK)
        rc = k->rule(e, body, ewhere);
    if (rc != FERRY_OK)
        return rc;
    /* Names before i are already known to be terminated. */
    for (uint32_t j = 0; j < i; j++) {
        if (strcmp(elem_at(body, k, j), e) == 0)
            return ferry__seterr(FERRY_EPROTO, "%s: key 'name' '%s' repeats field %" PRIu32,
                                 ewhere, e, j);
    }
    return FERRY_OK;
}

/* "BATCH field 3", the place an element's error detail names. Only made
 * once an element has failed: a message that checks out formats nothing.
 * The failing element is then checked again under this name, which, the
 * checks being pure, fails again the same way with the detail it needs. */
#define ELEMENT_WHERE(buf, where, i) snprintf(buf, sizeof buf, "%s field %" PRIu32, where, i)

/* The elements of K_MAPS key k, each by check_element. */
static int check_elements(const key_spec *k, const void *body, const char *where)
{
    uint32_t n = load_count(body, k);
    for (uint32_t i = 0; i < n; i++) {
        if (check_element(k, body, i, where) == FERRY_OK)
            continue;
        char ewhere[32];
        ELEMENT_WHERE(ewhere, where, i);
        return check_element(k, body, i, ewhere);
    }
    return FERRY_OK;
}

static int check_str(const key_spec *k, const void *body, const char *where)
{
    size_t n = strnlen((const char *)body + k->off, k->size);
    if (n == k->size)
        return ferry__seterr(FERRY_EPROTO, "%s: key '%s' is not NUL-terminated within %zu bytes",
                             where, k->name, k->size);
    if (n < k->range.u.lo)
        return ferry__seterr(FERRY_EPROTO,
                             "%s: key '%s' is %zu bytes long, must be at least %" PRIu64, where,
                             k->name, n, k->range.u.lo);
    return FERRY_OK;
}

/* Checks every member named in `keys` against its range: integers' values,
 * strings' lengths (they must end within their buffer: an encoder could be
 * handed one that does not), arrays' lengths, and each element of an array
 * of maps. Returns FERRY_OK or FERRY_EPROTO with a detail. */
static int check_keys(const key_spec *keys, size_t nkeys, const void *body, const char *where)
{
    for (size_t i = 0; i < nkeys; i++) {
        const key_spec *k = &keys[i];
        int rc = FERRY_OK;
        if (k->kind == K_UINT) {
            uint64_t v = load_uint(body, k);
            if (v < k->range.u.lo || v > k->range.u.hi)
                rc = ferry__seterr(FERRY_EPROTO,
                                   "%s: key '%s' is %" PRIu64 ", must be %" PRIu64 "..%" PRIu64,
                                   where, k->name, v, k->range.u.lo, k->range.u.hi);
        } else if (k->kind == K_INT) {
            int64_t v = load_int(body, k);
            if (v < k->range.s.lo || v > k->range.s.hi)
                rc = ferry__seterr(FERRY_EPROTO,
                                   "%s: key '%s' is %" PRId64 ", must be %" PRId64 "..%" PRId64,
                                   where, k->name, v, k->range.s.lo, k->range.s.hi);
        } else if (k->kind == K_STR) {
            rc = check_str(k, body, where);
        } else {
            uint32_t n = load_count(body, k);
            if (n < k->range.u.lo || n > k->range.u.hi)
                rc = bad_count(k, n, where);
            else if (k->kind == K_MAPS)
                rc = check_elements(k, body, where);
            /* K_DIMS' values are judged with their dtype, by the element's rule. */
        }
        if (rc != FERRY_OK)
            return rc;
    }
    return FERRY_OK;
}

/* A TASK without shared memory says so with both numbers 0: one way to
 * say nothing. */
static int check_task(const void *body)
{
    const ferry__task *t = body;
    if (t->shm_bytes == 0 && t->shm_offset != 0)
        return ferry__seterr(FERRY_EPROTO,
                             "TASK: key 'shm_offset' is %" PRIu64 " with 'shm_bytes' 0",
                             t->shm_offset);
    return FERRY_OK;
}

/* A retirement's figures come with its reason, and only with one. */
static int check_bye(const void *body)
{
    const ferry__bye *b = body;
    if (!b->retired && (b->rss || b->batches))
        return ferry__seterr(FERRY_EPROTO, "BYE: keys 'rss' and 'batches' without 'retired'");
    return FERRY_OK;
}

static int check_config(const void *body)
{
    const ferry__config_msg *c = body;
    if (c->worker_index >= c->num_workers)
        return ferry__seterr(FERRY_EPROTO,
                             "CONFIG: key 'worker_index' is %" PRIu32
                             ", must be below num_workers %" PRIu32,
                             c->worker_index, c->num_workers);
    /* A port comes with the token that opens it, and a token is exactly
     * what the loader's generator makes, so nothing else reaches a ZAP
     * request as a password. */
    size_t tlen = strlen(c->token);
    if ((c->data_port == 0) != (tlen == 0))
        return ferry__seterr(FERRY_EPROTO,
                             "CONFIG: key 'data_port' is %" PRIu32 " with a token of %zu bytes",
                             c->data_port, tlen);
    if (tlen && (tlen != FERRY__TOKEN_HEX || strspn(c->token, "0123456789abcdef") != tlen))
        return ferry__seterr(FERRY_EPROTO, "CONFIG: key 'token' is not %d lowercase hex digits",
                             FERRY__TOKEN_HEX);
    /* Keys seal a data connection, so they come with one. */
    size_t slen = strlen(c->seal);
    if (slen && (!tlen || slen != FERRY__SEAL_KEYS_HEX ||
                 strspn(c->seal, "0123456789abcdef") != slen))
        return ferry__seterr(FERRY_EPROTO,
                             "CONFIG: key 'seal' is not %d lowercase hex digits with a data port",
                             FERRY__SEAL_KEYS_HEX);
    return FERRY_OK;
}

/* A READY either reports a dataset (code 0, its schema, no error text) or
 * an error (code < 0, no length, no schema): never a mix the loader would
 * have to interpret. */
static int check_ready(const void *body)
{
    const ferry__ready *r = body;
    if (r->code == 0 && r->error[0] != '\0')
        return ferry__seterr(FERRY_EPROTO, "READY: code is 0 but key 'error' is not empty");
    if (r->code == 0 && r->schema.nfields == 0)
        return ferry__seterr(FERRY_EPROTO, "READY: code is 0 but key 'fields' is empty");
    if (r->code < 0 && r->length != 0)
        return ferry__seterr(
            FERRY_EPROTO, "READY: code is %" PRId32 " but key 'length' is %" PRIu64 ", must be 0",
            r->code, r->length);
    if (r->code < 0 && r->schema.nfields != 0)
        return ferry__seterr(FERRY_EPROTO,
                             "READY: code is %" PRId32 " but key 'fields' has %" PRIu32
                             " entries, must be 0",
                             r->code, r->schema.nfields);
    return FERRY_OK;
}

/* The bytes of a dtype and shape: a known dtype, every dim at least 1, and
 * a size computed so that an overflowing shape is an error, not a wrap. */
static int shape_size(uint32_t dtype, const int64_t *shape, int ndim, const char *where,
                      uint64_t *total)
{
    uint64_t n = ferry_dtype_size((int)dtype);
    if (n == 0)
        return ferry__seterr(FERRY_EPROTO, "%s: key 'dtype' is %u, not a known dtype", where,
                             (unsigned)dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1)
            return ferry__seterr(FERRY_EPROTO,
                                 "%s: key 'shape' dim %d is %" PRId64 ", must be >= 1", where, d,
                                 shape[d]);
        if (n > UINT64_MAX / (uint64_t)shape[d])
            return ferry__seterr(FERRY_EPROTO,
                                 "%s: key 'shape' gives a size that overflows 64 bits", where);
        n *= (uint64_t)shape[d];
    }
    *total = n;
    return FERRY_OK;
}

uint64_t ferry__item_field_bytes(const ferry__item_field *f)
{
    if (f->var) /* shape: [] or [bytes per item it reserves] */
        return f->ndim ? (uint64_t)f->shape[0] : 0;
    uint64_t n = ferry_dtype_size(f->dtype);
    for (int d = 0; d < f->ndim; d++)
        n *= (uint64_t)f->shape[d];
    return n;
}

/* One field of a READY's schema: a dtype and item shape that make a size
 * of at most FERRY__ITEM_BYTES_MAX, as every dataset's items are (the
 * loader sizes batch slots from it). */
static int check_item_field(const void *elem, const void *parent, const char *where)
{
    const ferry__item_field *f = elem;
    uint64_t total = 0; /* set by shape_size; 0 keeps -O3's flow analysis quiet */
    (void)parent;
    if (f->var && f->ndim > 1)
        return ferry__seterr(FERRY_EPROTO,
                             "%s: a field of variable shape has key 'shape' [] or [bytes to "
                             "reserve per item], not %d dims",
                             where, f->ndim);
    int rc = shape_size((uint32_t)f->dtype, f->shape, f->ndim, where, &total);
    if (rc == FERRY_OK) /* no overflow: the bytes of one item in a slot */
        total = ferry__item_field_bytes(f);
    if (rc == FERRY_OK && total > FERRY__ITEM_BYTES_MAX)
        return ferry__seterr(FERRY_EPROTO, "%s: one item %s %" PRIu64 " bytes, more than 1 GiB",
                             where, f->var ? "reserves" : "is", total);
    return rc;
}

/* One field of a BATCH of `count` items: shape[0] == count (unless the
 * field's shape is variable), and nbytes exactly what shape and dtype
 * give. */
static int check_field(const void *elem, const void *parent, const char *where)
{
    const ferry__field_desc *f = elem;
    uint32_t count = ((const ferry__batch_hdr *)parent)->count;
    uint64_t total = 0; /* set by shape_size; 0 keeps -O3's flow analysis quiet */
    int rc = shape_size((uint32_t)f->dtype, f->shape, f->ndim, where, &total);
    if (rc != FERRY_OK)
        return rc;
    if (!f->var && (uint64_t)f->shape[0] != count)
        return ferry__seterr(FERRY_EPROTO,
                             "%s: key 'shape' starts with %" PRId64 ", must equal count %" PRIu32,
                             where, f->shape[0], count);
    if (f->nbytes != total)
        return ferry__seterr(FERRY_EPROTO,
                             "%s: key 'nbytes' is %" PRIu64 ", shape and dtype give %" PRIu64,
                             where, f->nbytes, total);
    return FERRY_OK;
}

/* The rules for one message body. FERRY_OK or FERRY_EPROTO with a detail. */
static int validate(const msg_spec *spec, const void *body)
{
    int rc = check_keys(spec->keys, spec->nkeys, body, spec->name);
    if (rc == FERRY_OK && spec->check != NULL)
        rc = spec->check(body);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Encoding
 */

/* A packer sink over the caller's buffer. The first write that does not fit
 * marks it full: the frame is lost (the encoder reports FERRY_ELIMIT), so
 * every later write is refused without copying. Nothing is ever written at
 * or past `cap`. */
typedef struct sink {
    char *buf;
    size_t cap;
    size_t len;
    int full;
} sink;

static int sink_write(void *data, const char *bytes, size_t n)
{
    sink *s = data;
    if (s->full || n > s->cap - s->len) {
        s->full = 1;
        return -1;
    }
    memcpy(s->buf + s->len, bytes, n);
    s->len += n;
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *str)
{
    size_t n = strlen(str);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, str, n);
}

/* Whether key k is not sent: optional, and 0 in body. */
static int left_out(const key_spec *k, const void *body)
{
    return k->optional && load_uint(body, k) == 0;
}

/* The keys of `keys` that body sends. */
static uint32_t sent_keys(const key_spec *keys, size_t nkeys, const void *body)
{
    uint32_t n = 0;
    for (size_t i = 0; i < nkeys; i++)
        n += !left_out(&keys[i], body);
    return n;
}

/* Packs the key/value pairs of `keys` (no map header: the caller adds it,
 * since the top level also carries "type"). The body is already validated. */
static void pack_entries(msgpack_packer *pk, const key_spec *keys, size_t nkeys, const void *body)
{
    for (size_t i = 0; i < nkeys; i++) {
        const key_spec *k = &keys[i];
        if (left_out(k, body))
            continue;
        pack_cstr(pk, k->name);
        switch (k->kind) {
        case K_UINT:
            msgpack_pack_uint64(pk, load_uint(body, k));
            break;
        case K_INT:
            msgpack_pack_int64(pk, load_int(body, k));
            break;
        case K_STR:
            pack_cstr(pk, (const char *)body + k->off);
            break;
        case K_DIMS: {
            uint32_t n = load_count(body, k);
            msgpack_pack_array(pk, n);
            for (uint32_t d = 0; d < n; d++)
                msgpack_pack_int64(pk, load_dim(body, k, d));
            break;
        }
        case K_MAPS: {
            uint32_t n = load_count(body, k);
            msgpack_pack_array(pk, n);
            for (uint32_t j = 0; j < n; j++) {
                const void *elem = elem_at(body, k, j);
                msgpack_pack_map(pk, sent_keys(k->sub, k->nsub, elem));
                pack_entries(pk, k->sub, k->nsub, elem);
            }
            break;
        }
        }
    }
}

int ferry__msg_encode(const ferry__msg *m, void *buf, size_t cap, size_t *len)
{
    if (m == NULL || buf == NULL || len == NULL)
        return ferry__seterr(FERRY_EINVAL, "ferry__msg_encode: NULL argument");
    const msg_spec *spec = spec_of((uint64_t)m->type);
    if (spec == NULL)
        return ferry__seterr(FERRY_EINVAL, "cannot encode unknown message type %d", (int)m->type);
    /* The decoder's rules, reported as the caller's bug; the detail stays. */
    if (validate(spec, &m->u) != FERRY_OK)
        return FERRY_EINVAL;

    /* Never produce a frame the peer would refuse for its size. */
    sink s = {.buf = buf, .cap = cap < FERRY__HDR_MAX ? cap : FERRY__HDR_MAX, .len = 0, .full = 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &s, sink_write);
    msgpack_pack_map(&pk, sent_keys(spec->keys, spec->nkeys, &m->u) + 1);
    pack_cstr(&pk, "type");
    msgpack_pack_uint32(&pk, (uint32_t)m->type);
    pack_entries(&pk, spec->keys, spec->nkeys, &m->u);
    if (s.full)
        return ferry__seterr(FERRY_ELIMIT, "%s header does not fit in %zu bytes", spec->name,
                             s.cap);
    *len = s.len;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------
 * Framing scan: bound what msgpack-c will allocate
 */

enum { F_SCALAR, F_BYTES, F_ARRAY, F_MAP, F_BAD };

/* How a lead byte 0xc0..0xdf is followed: a big-endian length or count of
 * `lenbytes` bytes, then `fixed` bytes (an ext's type byte, a number), then,
 * for F_BYTES, as many bytes of data as the length says. */
typedef struct lead_form {
    unsigned char lenbytes;
    unsigned char fixed;
    unsigned char what;
} lead_form;

/* One row per msgpack format family. */
/* clang-format off */
static const lead_form lead_forms[32] = {
    [0x00] = {0, 0, F_SCALAR},  /* nil */
    [0x01] = {0, 0, F_BAD},     /* never used by msgpack */
    [0x02] = {0, 0, F_SCALAR},  [0x03] = {0, 0, F_SCALAR},  /* false, true */
    [0x04] = {1, 0, F_BYTES},   [0x05] = {2, 0, F_BYTES},   [0x06] = {4, 0, F_BYTES}, /* bin */
    [0x07] = {1, 1, F_BYTES},   [0x08] = {2, 1, F_BYTES},   [0x09] = {4, 1, F_BYTES}, /* ext */
    [0x0a] = {0, 4, F_SCALAR},  [0x0b] = {0, 8, F_SCALAR},  /* float 32, 64 */
    [0x0c] = {0, 1, F_SCALAR},  [0x0d] = {0, 2, F_SCALAR},  /* uint 8..64 */
    [0x0e] = {0, 4, F_SCALAR},  [0x0f] = {0, 8, F_SCALAR},
    [0x10] = {0, 1, F_SCALAR},  [0x11] = {0, 2, F_SCALAR},  /* int 8..64 */
    [0x12] = {0, 4, F_SCALAR},  [0x13] = {0, 8, F_SCALAR},
    [0x14] = {0, 2, F_SCALAR},  [0x15] = {0, 3, F_SCALAR},  /* fixext: type byte + 1..16 */
    [0x16] = {0, 5, F_SCALAR},  [0x17] = {0, 9, F_SCALAR},  [0x18] = {0, 17, F_SCALAR},
    [0x19] = {1, 0, F_BYTES},   [0x1a] = {2, 0, F_BYTES},   [0x1b] = {4, 0, F_BYTES}, /* str */
    [0x1c] = {2, 0, F_ARRAY},   [0x1d] = {4, 0, F_ARRAY},   /* array 16, 32 */
    [0x1e] = {2, 0, F_MAP},     [0x1f] = {4, 0, F_MAP},     /* map 16, 32 */
};
/* clang-format on */

/* The deepest legal header nests four containers (the map, "fields", a field
 * map, "shape"); anything far deeper is refused before msgpack-c sees it,
 * which would otherwise report its own depth limit as out of memory. */
#define SCAN_MAX_DEPTH 8

/* Walks the framing of the first msgpack object in p[0..len) without building
 * it, and sets *end to where it stops. Fails (FERRY_EPROTO) if the data ends
 * early, uses the reserved byte 0xc1, nests deeper than SCAN_MAX_DEPTH, or
 * any array or map declares more elements than the remaining bytes could
 * hold: every element takes at least one byte, so the objects still expected
 * can never outnumber the bytes left. One loop over every msgpack type
 * byte, kept whole so the bound above can be read in one place. */
static int scan_frame(const unsigned char *p, size_t len, size_t *end)
{
    uint64_t left[SCAN_MAX_DEPTH]; /* per open level: elements still to read */
    int depth = 1;
    left[0] = 1;          /* the root object */
    uint64_t pending = 1; /* sum of left[]: objects announced, not read */
    size_t pos = 0;
    while (pending > 0) {
        while (left[depth - 1] == 0)
            depth--; /* that container is complete: back to its parent */
        if (pos >= len)
            return ferry__seterr(FERRY_EPROTO,
                                 "header frame is truncated: %zu bytes end inside the map", len);
        unsigned lead = p[pos++];
        left[depth - 1]--;
        pending--;
        lead_form f = {0, 0, F_SCALAR};
        uint64_t n = 0;
        if (lead >= 0x80 && lead <= 0x8f) {
            f.what = F_MAP;
            n = lead & 0x0f;
        } else if (lead >= 0x90 && lead <= 0x9f) {
            f.what = F_ARRAY;
            n = lead & 0x0f;
        } else if (lead >= 0xa0 && lead <= 0xbf) {
            f.what = F_BYTES;
            n = lead & 0x1f;
        } else if (lead >= 0xc0 && lead <= 0xdf) {
            f = lead_forms[lead - 0xc0];
        }
        if (f.what == F_BAD)
            return ferry__seterr(FERRY_EPROTO,
                                 "header frame: byte 0x%02x at offset %zu is not msgpack", lead,
                                 pos - 1);
        if (len - pos < f.lenbytes)
            return ferry__seterr(FERRY_EPROTO,
                                 "header frame is truncated: %zu bytes end inside a length", len);
        for (unsigned i = 0; i < f.lenbytes; i++)
            n = (n << 8) | p[pos++];
        uint64_t skip = f.fixed + (f.what == F_BYTES ? n : 0);
        if (skip > len - pos)
            return ferry__seterr(FERRY_EPROTO,
                                 "header frame is truncated: %zu bytes end inside a value", len);
        pos += (size_t)skip;
        uint64_t children = f.what == F_MAP ? 2 * n : f.what == F_ARRAY ? n : 0;
        if (children > 0 && depth == SCAN_MAX_DEPTH)
            return ferry__seterr(FERRY_EPROTO, "header frame nests deeper than %d levels",
                                 SCAN_MAX_DEPTH - 1);
        if (pending + children > len - pos) {
            if (children > 0)
                return ferry__seterr(FERRY_EPROTO,
                                     "header frame: a container declares %" PRIu64
                                     " elements, more than the %zu bytes left can hold",
                                     children, len - pos);
            return ferry__seterr(FERRY_EPROTO,
                                 "header frame is truncated: %zu bytes end inside the map", len);
        }
        if (children > 0) {
            left[depth++] = children;
            pending += children;
        }
    }
    *end = pos;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------
 * Decoding: msgpack objects into the fixed structs
 */

static const char *mp_type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return "positive int";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "negative int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "str";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_BIN:
        return "bin";
    case MSGPACK_OBJECT_EXT:
        return "ext";
    }
    return "unknown";
}

static int wrong_type(const char *where, const char *key, const char *want, const msgpack_object *v)
{
    return ferry__seterr(FERRY_EPROTO, "%s: key '%s' must be %s, got %s", where, key, want,
                         mp_type_name(v->type));
}

static int key_is(const msgpack_object *key, const char *name)
{
    size_t n = strlen(name);
    return key->type == MSGPACK_OBJECT_STR && key->via.str.size == n &&
           memcmp(key->via.str.ptr, name, n) == 0;
}

static int decode_map(const msgpack_object *obj, const key_spec *keys, size_t nkeys, void *body,
                      const char *where, const char *skip);

/* The capacity of array key k's member, in elements. */
static uint32_t capacity(const key_spec *k)
{
    return (uint32_t)(k->size / k->elem_size);
}

/* K_DIMS: an array of integers. Only what storage demands is checked here
 * (no more entries than the member holds, each an int64); the element's
 * rule judges the values. */
static int decode_dims(const key_spec *k, const msgpack_object *v, void *body, const char *where)
{
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return wrong_type(where, k->name, "an array", v);
    const msgpack_object_array *a = &v->via.array;
    if (a->size > capacity(k))
        return bad_count(k, a->size, where);
    for (uint32_t d = 0; d < a->size; d++) {
        const msgpack_object *e = &a->ptr[d];
        int64_t dim;
        if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            dim = e->via.i64;
        else if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER && e->via.u64 <= INT64_MAX)
            dim = (int64_t)e->via.u64;
        else
            return ferry__seterr(FERRY_EPROTO,
                                 "%s: key '%s' dim %" PRIu32 " must be an int64, got %s", where,
                                 k->name, d, mp_type_name(e->type));
        memcpy((char *)body + k->off + d * sizeof dim, &dim, sizeof dim);
    }
    store_count(body, k, a->size);
    return FERRY_OK;
}

/* Element i of K_MAPS key k, a map decoded with k->sub into a struct
 * cleared first, so that its string tails, unused dims and padding are
 * zero whatever the struct held before. */
static int decode_element(const key_spec *k, const msgpack_object *v, void *body, uint32_t i,
                          const char *ewhere)
{
    if (v->type != MSGPACK_OBJECT_MAP)
        return ferry__seterr(FERRY_EPROTO, "%s: must be a map, got %s", ewhere,
                             mp_type_name(v->type));
    void *elem = (char *)body + k->off + (size_t)i * k->elem_size;
    memset(elem, 0, k->elem_size);
    return decode_map(v, k->sub, k->nsub, elem, ewhere, NULL);
}

/* K_MAPS: an array of maps, each decoded by decode_element. Elements past
 * the array's length are left as they were. */
static int decode_maps(const key_spec *k, const msgpack_object *v, void *body, const char *where)
{
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return wrong_type(where, k->name, "an array", v);
    const msgpack_object_array *a = &v->via.array;
    if (a->size > capacity(k))
        return bad_count(k, a->size, where);
    for (uint32_t i = 0; i < a->size; i++) {
        if (decode_element(k, &a->ptr[i], body, i, where) == FERRY_OK)
            continue;
        char ewhere[32];
        ELEMENT_WHERE(ewhere, where, i);
        return decode_element(k, &a->ptr[i], body, i, ewhere);
    }
    store_count(body, k, a->size);
    return FERRY_OK;
}

/* Stores one value into its member after checking its msgpack type and that
 * it fits the member. */
static int decode_value(const key_spec *k, const msgpack_object *v, void *body, const char *where)
{
    char *dst = (char *)body + k->off;
    switch (k->kind) {
    case K_UINT: {
        if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return wrong_type(where, k->name, "a non-negative integer", v);
        uint64_t u = v->via.u64;
        if (k->size == sizeof(uint32_t)) {
            if (u > UINT32_MAX)
                return ferry__seterr(FERRY_EPROTO,
                                     "%s: key '%s' is %" PRIu64 ", does not fit 32 bits", where,
                                     k->name, u);
            uint32_t u32 = (uint32_t)u;
            memcpy(dst, &u32, sizeof u32);
        } else {
            memcpy(dst, &u, sizeof u);
        }
        return FERRY_OK;
    }
    case K_INT: {
        int64_t s;
        if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            s = v->via.i64;
        else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)
            s = (int64_t)v->via.u64;
        else
            return wrong_type(where, k->name, "an int64", v);
        if (k->size == sizeof(int32_t)) {
            if (s < INT32_MIN || s > INT32_MAX)
                return ferry__seterr(FERRY_EPROTO,
                                     "%s: key '%s' is %" PRId64 ", does not fit 32 bits", where,
                                     k->name, s);
            int32_t s32 = (int32_t)s;
            memcpy(dst, &s32, sizeof s32);
        } else {
            memcpy(dst, &s, sizeof s);
        }
        return FERRY_OK;
    }
    case K_STR:
        if (v->type != MSGPACK_OBJECT_STR)
            return wrong_type(where, k->name, "a string", v);
        if (v->via.str.size >= k->size)
            return ferry__seterr(FERRY_EPROTO,
                                 "%s: key '%s' is %" PRIu32 " bytes long, at most %zu allowed",
                                 where, k->name, v->via.str.size, k->size - 1);
        if (memchr(v->via.str.ptr, '\0', v->via.str.size) != NULL)
            return ferry__seterr(FERRY_EPROTO, "%s: key '%s' contains a NUL byte", where, k->name);
        memcpy(dst, v->via.str.ptr, v->via.str.size);
        dst[v->via.str.size] = '\0';
        return FERRY_OK;
    case K_DIMS:
        return decode_dims(k, v, body, where);
    case K_MAPS:
        return decode_maps(k, v, body, where);
    }
    return ferry__seterr(FERRY_EPROTO, "%s: key '%s' has no decoder", where, k->name);
}

/* Decodes a map whose keys must be exactly `keys`, each once. A key equal to
 * `skip` (the top level's "type", already read) is passed over. */
static int decode_map(const msgpack_object *obj, const key_spec *keys, size_t nkeys, void *body,
                      const char *where, const char *skip)
{
    uint32_t seen = 0; /* bit i: keys[i] was present; no table has 32 keys */
    const msgpack_object_map *map = &obj->via.map;
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object *key = &map->ptr[i].key;
        if (key->type != MSGPACK_OBJECT_STR)
            return ferry__seterr(FERRY_EPROTO, "%s: a key is a %s, keys must be strings", where,
                                 mp_type_name(key->type));
        if (skip != NULL && key_is(key, skip))
            continue;
        size_t k = 0;
        while (k < nkeys && !key_is(key, keys[k].name))
            k++;
        if (k == nkeys) {
            int shown = key->via.str.size > 64 ? 64 : (int)key->via.str.size;
            return ferry__seterr(FERRY_EPROTO, "%s: unknown key '%.*s'", where, shown,
                                 key->via.str.ptr);
        }
        if (seen & (UINT32_C(1) << k))
            return ferry__seterr(FERRY_EPROTO, "%s: key '%s' appears twice", where, keys[k].name);
        seen |= UINT32_C(1) << k;
        int rc = decode_value(&keys[k], &map->ptr[i].val, body, where);
        if (rc != FERRY_OK)
            return rc;
    }
    for (size_t k = 0; k < nkeys; k++) {
        if (!(seen & (UINT32_C(1) << k)) && !keys[k].optional)
            return ferry__seterr(FERRY_EPROTO, "%s: key '%s' is missing", where, keys[k].name);
    }
    return FERRY_OK;
}

_Static_assert(offsetof(ferry__batch_hdr, fields) + MEMBER_SIZE(ferry__batch_hdr, fields) ==
                   sizeof(ferry__batch_hdr),
               "BATCH's fields must be its struct's last member");
_Static_assert(offsetof(ferry__ready, schema.fields) + MEMBER_SIZE(ferry__ready, schema.fields) ==
                   sizeof(ferry__ready),
               "READY's fields must be its struct's last member");

/* The bytes of a message body before its array of maps, if it has one:
 * the array is the struct's last member (ferry__ready's schema ends with
 * it), so these are all the bytes that are not array elements. */
static size_t body_extent(const msg_spec *spec)
{
    for (size_t i = 0; i < spec->nkeys; i++) {
        if (spec->keys[i].kind == K_MAPS)
            return spec->keys[i].off;
    }
    return spec->size;
}

/* The top level: a map with one "type" naming a known message, then that
 * message's keys, then its rules. */
static int decode_header(const msgpack_object *root, ferry__msg *out)
{
    if (root->type != MSGPACK_OBJECT_MAP)
        return ferry__seterr(FERRY_EPROTO, "header frame is a msgpack %s, must be a map",
                             mp_type_name(root->type));
    const msgpack_object *type = NULL;
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        if (!key_is(&root->via.map.ptr[i].key, "type"))
            continue;
        if (type != NULL)
            return ferry__seterr(FERRY_EPROTO, "header: key 'type' appears twice");
        type = &root->via.map.ptr[i].val;
    }
    if (type == NULL)
        return ferry__seterr(FERRY_EPROTO, "header: key 'type' is missing");
    if (type->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return wrong_type("header", "type", "a non-negative integer", type);
    const msg_spec *spec = spec_of(type->via.u64);
    if (spec == NULL)
        return ferry__seterr(FERRY_EPROTO,
                             "header: key 'type' is %" PRIu64 ", not a known message type",
                             type->via.u64);

    /* The body is cleared so that its string tails and padding are zero,
     * but only up to an array of maps: each element is cleared as it is
     * decoded (decode_element), and the rest of the array, most of a
     * BATCH's or READY's struct, is never touched. */
    memset(&out->u, 0, body_extent(spec));
    out->type = (ferry__msg_type)type->via.u64;
    int rc = decode_map(root, spec->keys, spec->nkeys, &out->u, spec->name, "type");
    if (rc != FERRY_OK)
        return rc;
    return validate(spec, &out->u);
}

int ferry__msg_decode(const void *buf, size_t len, ferry__msg *out)
{
    if (buf == NULL || out == NULL)
        return ferry__seterr(FERRY_EINVAL, "ferry__msg_decode: NULL argument");
    if (len == 0)
        return ferry__seterr(FERRY_EPROTO, "header frame is empty");
    if (len > FERRY__HDR_MAX)
        return ferry__seterr(FERRY_EPROTO, "header frame is %zu bytes, larger than the %d allowed",
                             len, FERRY__HDR_MAX);
    size_t end = 0;
    int rc = scan_frame(buf, len, &end);
    if (rc != FERRY_OK)
        return rc;
    if (end != len)
        return ferry__seterr(FERRY_EPROTO, "header frame has trailing bytes: %zu after the map",
                             len - end);

    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&u, buf, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        rc = ferry__seterr(FERRY_ENOMEM, "out of memory unpacking a %zu-byte header frame", len);
    else if (ur != MSGPACK_UNPACK_SUCCESS || off != len)
        rc = ferry__seterr(FERRY_EPROTO, "header frame is not valid msgpack");
    else
        rc = decode_header(&u.data, out);
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Payload frames and names
 */

int ferry__msg_has_payload(ferry__msg_type type)
{
    const msg_spec *spec = spec_of((uint64_t)type);
    return spec != NULL && spec->has_payload;
}

/* Every field must lie inside the frame and no two may share a byte. The
 * bound is taken as `nbytes <= len - offset` after `offset <= len`, so no sum
 * can wrap however close to UINT64_MAX the header's numbers are. */
int ferry__batch_check_layout(const ferry__batch_hdr *b, uint64_t len)
{
    if (b->nfields > FERRY_MAX_FIELDS)
        return ferry__seterr(FERRY_EINVAL, "BATCH: %" PRIu32 " fields, not a decoded message",
                             b->nfields);
    for (uint32_t i = 0; i < b->nfields; i++) {
        const ferry__field_desc *f = &b->fields[i];
        if (f->offset > len || f->nbytes > len - f->offset)
            return ferry__seterr(FERRY_EPROTO,
                                 "BATCH field %" PRIu32 ": bytes at offset %" PRIu64
                                 " size %" PRIu64 " lie outside the %" PRIu64 " bytes %s",
                                 i, f->offset, f->nbytes, len,
                                 b->shm ? "of its shared memory" : "of the payload");
        /* Both ends are now <= len, so the sums below cannot wrap. */
        for (uint32_t j = 0; j < i; j++) {
            const ferry__field_desc *g = &b->fields[j];
            if (f->offset < g->offset + g->nbytes && g->offset < f->offset + f->nbytes)
                return ferry__seterr(FERRY_EPROTO,
                                     "BATCH field %" PRIu32 ": bytes overlap field %" PRIu32, i, j);
        }
    }
    return FERRY_OK;
}

int ferry__msg_check_payload(const ferry__msg *m, size_t payload_len)
{
    if (m == NULL)
        return ferry__seterr(FERRY_EINVAL, "ferry__msg_check_payload: NULL message");
    if (m->type == FERRY__MSG_TASK) {
        uint64_t want = (uint64_t)m->u.task.count * sizeof(uint64_t);
        if ((uint64_t)payload_len != want)
            return ferry__seterr(FERRY_EPROTO,
                                 "TASK: payload is %zu bytes, count %" PRIu32 " needs %" PRIu64,
                                 payload_len, m->u.task.count, want);
        return FERRY_OK;
    }
    if (m->type == FERRY__MSG_BATCH && m->u.batch.shm && payload_len)
        return ferry__seterr(FERRY_EPROTO, "BATCH in shared memory with a %zu-byte payload",
                             payload_len);
    if (m->type == FERRY__MSG_BATCH && !m->u.batch.shm)
        return ferry__batch_check_layout(&m->u.batch, payload_len);
    if (m->type == FERRY__MSG_BATCH)
        return FERRY_OK;
    return ferry__seterr(FERRY_EINVAL, "%s messages have no payload frame",
                         ferry__msg_name((int)m->type));
}

/* ---------------------------------------------------------------------------
 * Schemas
 */

/* Field i of BATCH b as an item field: its shape without the batch dim. */
static void batch_item_field(const ferry__batch_hdr *b, uint32_t i, ferry__item_field *o)
{
    const ferry__field_desc *f = &b->fields[i];
    memcpy(o->name, f->name, sizeof o->name);
    o->name[sizeof o->name - 1] = '\0';
    o->dtype = f->dtype;
    o->var = f->var;
    if (f->var) { /* no item shape: the batch's own */
        o->ndim = 0;
        return;
    }
    o->ndim = f->ndim < 1 ? 0 : f->ndim > FERRY_MAX_DIMS ? FERRY_MAX_DIMS - 1 : f->ndim - 1;
    memcpy(o->shape, f->shape + 1, sizeof o->shape[0] * (size_t)o->ndim);
}

/* Bounded again, so a struct no decoder produced cannot overrun a schema. */
static uint32_t batch_nfields(const ferry__batch_hdr *b)
{
    return b->nfields < FERRY_MAX_FIELDS ? b->nfields : FERRY_MAX_FIELDS;
}

void ferry__batch_schema(const ferry__batch_hdr *b, ferry__schema *out)
{
    memset(out, 0, sizeof *out);
    out->nfields = batch_nfields(b);
    for (uint32_t i = 0; i < out->nfields; i++)
        batch_item_field(b, i, &out->fields[i]);
}

/* "[28, 28]", "[]" for a scalar item. */
static void describe_item_shape(const ferry__item_field *f, char *buf, size_t cap)
{
    size_t off = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < f->ndim && off < cap; d++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%" PRId64, d ? ", " : "", f->shape[d]);
    if (off < cap)
        snprintf(buf + off, cap - off, "]");
}

static const char *dtype_text(ferry_dtype dtype)
{
    const char *name = ferry_dtype_name((int)dtype);
    return name ? name : "an unknown dtype";
}

/* Field i of want and got, both present: 0 when the same, else 1 with why. */
static int field_diff(const ferry__item_field *w, const ferry__item_field *g, uint32_t i, char *why,
                      size_t cap)
{
    if (strcmp(w->name, g->name) != 0) {
        snprintf(why, cap, "field %" PRIu32 " is '%s', not '%s'", i, g->name, w->name);
        return 1;
    }
    if (w->dtype != g->dtype) {
        snprintf(why, cap, "field %" PRIu32 " '%s' is %s, not %s", i, g->name, dtype_text(g->dtype),
                 dtype_text(w->dtype));
        return 1;
    }
    if (!w->var != !g->var) {
        snprintf(why, cap, "field %" PRIu32 " '%s' has a %s shape, not a %s one", i, g->name,
                 g->var ? "variable" : "fixed", w->var ? "variable" : "fixed");
        return 1;
    }
    if (w->var) /* each batch has its own shape; what slots reserve may differ */
        return 0;
    if (w->ndim != g->ndim ||
        memcmp(w->shape, g->shape, sizeof w->shape[0] * (size_t)(w->ndim > 0 ? w->ndim : 0))) {
        char ws[160], gs[160];
        describe_item_shape(w, ws, sizeof ws);
        describe_item_shape(g, gs, sizeof gs);
        snprintf(why, cap, "field %" PRIu32 " '%s' has items of shape %s, not %s", i, g->name, gs,
                 ws);
        return 1;
    }
    return 0;
}

/* The comparison of ferry__schema_diff, with got given either as a schema
 * or as a BATCH's fields (read one at a time: this runs for every batch,
 * and a whole schema is 2 KB to clear and fill). */
static int diff_fields(const ferry__schema *want, const ferry__schema *got,
                       const ferry__batch_hdr *b, char *why, size_t cap)
{
    uint32_t nw = want->nfields < FERRY_MAX_FIELDS ? want->nfields : FERRY_MAX_FIELDS;
    uint32_t ng = got ? (got->nfields < FERRY_MAX_FIELDS ? got->nfields : FERRY_MAX_FIELDS)
                      : batch_nfields(b);
    for (uint32_t i = 0; i < nw || i < ng; i++) {
        if (i >= ng) {
            snprintf(why, cap, "field %" PRIu32 " '%s' is missing", i, want->fields[i].name);
            return 1;
        }
        ferry__item_field one;
        const ferry__item_field *g = got ? &got->fields[i] : &one;
        if (!got)
            batch_item_field(b, i, &one);
        if (i >= nw) {
            snprintf(why, cap, "field %" PRIu32 " '%s' is extra: %" PRIu32 " fields expected", i,
                     g->name, nw);
            return 1;
        }
        if (field_diff(&want->fields[i], g, i, why, cap))
            return 1;
    }
    return 0;
}

int ferry__schema_diff(const ferry__schema *want, const ferry__schema *got, char *why, size_t cap)
{
    return diff_fields(want, got, NULL, why, cap);
}

int ferry__batch_schema_diff(const ferry__schema *want, const ferry__batch_hdr *b, char *why,
                             size_t cap)
{
    return diff_fields(want, NULL, b, why, cap);
}

const char *ferry__msg_name(int type)
{
    const msg_spec *spec = type < 0 ? NULL : spec_of((uint64_t)type);
    return spec != NULL ? spec->name : "?";
}

/* --- TASK payload --- */

void ferry__indices_pack(const uint64_t *idx, size_t n, void *out)
{
    unsigned char *raw = out;
    for (size_t i = 0; i < n; i++) {
        for (int b = 0; b < 8; b++)
            raw[i * 8 + (size_t)b] = (unsigned char)(idx[i] >> (8 * b));
    }
}

void ferry__indices_unpack(const void *in, size_t n, uint64_t *idx)
{
    const unsigned char *raw = in;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int b = 7; b >= 0; b--)
            v = (v << 8) | raw[i * 8 + (size_t)b];
        idx[i] = v;
    }
}
