/*
 * protocol_decode.c - strict decoding of a header frame into its message
 * struct (see protocol_tables.h): first a scan that bounds what msgpack-c
 * may allocate, then unpacking by the key table (each value's msgpack type,
 * and that it fits its member), then the one validation protocol.c states.
 */
#include "protocol_tables.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "error.h"

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
        return ferry__msg_bad_count(k, a->size, where);
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
        return ferry__msg_bad_count(k, a->size, where);
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
    const msg_spec *spec = ferry__msg_spec_of(type->via.u64);
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
    return ferry__msg_validate(spec, &out->u);
}

/* ------------------------------------------------------------------------
 * The zone of each thread
 *
 * msgpack_unpack_next allocates a zone for each call's objects (two
 * allocations a header, even when handed a msgpack_unpacked that has one).
 * A header's objects never outlive its decode (decode_header copies what
 * it keeps; strings point into the frame), so each thread keeps one zone
 * and clears it after each decode, unpacking into it with msgpack_unpack:
 * no allocation a message once the zone has the chunk a header needs (the
 * scan above bounds that). Freed when the thread ends.
 */

#define ZONE_CHUNK 8192

static pthread_key_t zone_key;
static pthread_once_t zone_once = PTHREAD_ONCE_INIT;
static int zone_key_ok;

static void free_zone(void *z)
{
    msgpack_zone_destroy(z);
    free(z);
}

static void make_zone_key(void)
{
    zone_key_ok = pthread_key_create(&zone_key, free_zone) == 0;
}

/* This thread's zone, or NULL when it cannot be had (out of memory, no
 * key): the caller then makes one for this decode. */
static msgpack_zone *thread_zone(void)
{
    pthread_once(&zone_once, make_zone_key);
    if (!zone_key_ok)
        return NULL;
    msgpack_zone *z = pthread_getspecific(zone_key);
    if (!z && (z = malloc(sizeof *z)) != NULL) {
        if (!msgpack_zone_init(z, ZONE_CHUNK) || pthread_setspecific(zone_key, z) != 0) {
            free(z); /* (a zone whose init failed holds nothing) */
            z = NULL;
        }
    }
    return z;
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

    msgpack_zone own, *z = thread_zone();
    if (!z) {
        if (!msgpack_zone_init(&own, ZONE_CHUNK))
            return ferry__seterr(FERRY_ENOMEM, "out of memory unpacking a %zu-byte header frame",
                                 len);
        z = &own;
    }
    size_t off = 0;
    msgpack_object root;
    msgpack_unpack_return ur = msgpack_unpack(buf, len, &off, z, &root);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        rc = ferry__seterr(FERRY_ENOMEM, "out of memory unpacking a %zu-byte header frame", len);
    else if (ur != MSGPACK_UNPACK_SUCCESS || off != len)
        rc = ferry__seterr(FERRY_EPROTO, "header frame is not valid msgpack");
    else
        rc = decode_header(&root, out);
    if (z == &own)
        msgpack_zone_destroy(z);
    else
        msgpack_zone_clear(z);
    return rc;
}
