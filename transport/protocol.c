/*
 * protocol.c - the loader <-> worker header frames: their key tables and
 * the one statement of what a legal message is (the contract is
 * transport/protocol.h, the wire format is docs/protocol.md; encoding,
 * decoding and schemas are in the files protocol_tables.h names).
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
#include "protocol_tables.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

/* The dtype member is stored through a uint32_t like any other unsigned key. */
_Static_assert(sizeof(ferry_dtype) == sizeof(uint32_t), "ferry_dtype must be 32 bits wide");

/* ---------------------------------------------------------------------------
 * Key tables
 */

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
const msg_spec *ferry__msg_spec_of(uint64_t type)
{
    if (type >= COUNT_OF(msg_specs) || msg_specs[type].name == NULL)
        return NULL;
    return &msg_specs[type];
}

/* ---------------------------------------------------------------------------
 * Validation: the single statement of what a legal message is
 */

/* (protocol_tables.h) */
int ferry__msg_bad_count(const key_spec *k, uint64_t n, const char *where)
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
                rc = ferry__msg_bad_count(k, n, where);
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
int ferry__msg_validate(const msg_spec *spec, const void *body)
{
    int rc = check_keys(spec->keys, spec->nkeys, body, spec->name);
    if (rc == FERRY_OK && spec->check != NULL)
        rc = spec->check(body);
    return rc;
}

const char *ferry__msg_name(int type)
{
    const msg_spec *spec = type < 0 ? NULL : ferry__msg_spec_of((uint64_t)type);
    return spec != NULL ? spec->name : "?";
}
