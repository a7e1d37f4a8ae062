/*
 * protocol_tables.h - what the protocol's files share, and nothing else
 * does: the key tables' types, the message specs, and the helpers that
 * reach a struct's members through a table entry.
 *   protocol.c         the tables, and validation: what a legal message is
 *   protocol_encode.c  packing a struct into a header frame
 *   protocol_decode.c  the framing scan and strict decoding into a struct
 *   protocol_schema.c  payload frames, batch schemas and their differences
 * Calls run one way: encode, decode and schema -> protocol.c -> here.
 */
#ifndef FERRY_TRANSPORT_PROTOCOL_TABLES_H
#define FERRY_TRANSPORT_PROTOCOL_TABLES_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol.h"

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

typedef struct msg_spec {
    const char *name;
    const key_spec *keys; /* every key but "type", which all messages share */
    size_t nkeys;
    int (*check)(const void *body); /* rules across keys, NULL if none */
    int has_payload;
    size_t size; /* of the body's struct */
} msg_spec;

/* Where element i of an array key is, for messages: "BATCH field 3". */
#define ELEMENT_WHERE(buf, where, i) snprintf(buf, sizeof buf, "%s field %" PRIu32, where, i)

/* FERRY_EPROTO: array key k has n elements, outside its range ("has 9 dims"). */
int ferry__msg_bad_count(const key_spec *k, uint64_t n, const char *where);

/* The spec of message type `type`, NULL if there is no such type. */
const msg_spec *ferry__msg_spec_of(uint64_t type);

/* Checks body against spec: every key's range, then the rules across
 * keys. FERRY_OK or FERRY_EPROTO with the reason (ferry__seterr). Encoder
 * and decoder both call it, so the two sides cannot disagree. */
int ferry__msg_validate(const msg_spec *spec, const void *body);

/* Integer members are reached through memcpy so one table entry serves both
 * widths without aliasing games. */
static inline uint64_t load_uint(const void *body, const key_spec *k)
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

static inline int64_t load_int(const void *body, const key_spec *k)
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
static inline uint32_t load_count(const void *body, const key_spec *k)
{
    uint32_t n;
    memcpy(&n, (const char *)body + k->count_off, sizeof n);
    return n;
}

static inline void store_count(void *body, const key_spec *k, uint32_t n)
{
    memcpy((char *)body + k->count_off, &n, sizeof n);
}

/* Element i of a K_DIMS key (a dim) or of a K_MAPS key (a struct). */
static inline int64_t load_dim(const void *body, const key_spec *k, uint32_t i)
{
    int64_t v;
    memcpy(&v, (const char *)body + k->off + i * sizeof v, sizeof v);
    return v;
}

static inline const void *elem_at(const void *body, const key_spec *k, uint32_t i)
{
    return (const char *)body + k->off + (size_t)i * k->elem_size;
}

#endif
