/*
 * protocol_encode.c - a message struct packed into its header frame by its
 * key table (see protocol_tables.h); the encoder validates first and never
 * writes past the caller's capacity.
 */
#include "protocol_tables.h"

#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "error.h"

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
    const msg_spec *spec = ferry__msg_spec_of((uint64_t)m->type);
    if (spec == NULL)
        return ferry__seterr(FERRY_EINVAL, "cannot encode unknown message type %d", (int)m->type);
    /* The decoder's rules, reported as the caller's bug; the detail stays. */
    if (ferry__msg_validate(spec, &m->u) != FERRY_OK)
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
