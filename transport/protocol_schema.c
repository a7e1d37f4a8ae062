/*
 * protocol_schema.c - what a message's frames must agree on beyond its own
 * keys: whether a type has a payload frame and that a BATCH's fields lie
 * inside it, the schema a BATCH implies and how it differs from the one a
 * READY announced, and the TASK payload's little-endian indices.
 */
#include "protocol_tables.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

/* ---------------------------------------------------------------------------
 * Payload frames and names
 */

int ferry__msg_has_payload(ferry__msg_type type)
{
    const msg_spec *spec = ferry__msg_spec_of((uint64_t)type);
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
