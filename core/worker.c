/*
 * worker.c - the worker loop (see worker.h).
 *
 * The batch is built in place: the worker sizes the payload frame from the
 * dataset's schema, lets the dataset write every field into it, and hands
 * the frame to ZeroMQ, so no byte of a batch is copied on this side.
 *
 * Field placement: every field starts at a 64-byte boundary counted from a
 * lead offset. The lead is chosen so the field lands 64-byte aligned in this
 * process's frame buffer; ZeroMQ gives the receiver's buffer the same
 * alignment in practice (same allocator, same header in front of the data),
 * so the loader can use the bytes where they are. The loader checks and
 * copies when that guess is wrong; nothing breaks either way.
 */
#include "worker.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "dataset.h"
#include "alloc.h"
#include "error.h"
#include "zsock.h"

#define POLL_MS 200

typedef struct wstate {
    const ferry__worker_opts *o;
    void *sock;
    ferry__dataset ds;
    int ds_open;
    uint64_t seed;
    uint64_t *indices;
    size_t indices_cap;
    ferry__msg out; /* replies are built here: keeps the 4 KiB+ struct off the stack */
    ferry__msg in;
} wstate;

static int should_quit(const wstate *w)
{
    if (w->o->cancel && atomic_load(w->o->cancel))
        return 1;
    if (w->o->parent && getppid() != w->o->parent)
        return 1;
    return 0;
}

static int send_simple(wstate *w, ferry__msg_type type)
{
    w->out.type = type;
    return ferry__zsock_send(w->sock, NULL, &w->out, NULL, 0);
}

static int send_fail(wstate *w, uint64_t id, int code, uint64_t index, const char *msg)
{
    memset(&w->out.u.fail, 0, sizeof w->out.u.fail);
    w->out.type = FERRY__MSG_FAIL;
    w->out.u.fail.id = id;
    w->out.u.fail.code = code < 0 ? code : FERRY_EBATCH;
    w->out.u.fail.index = index;
    snprintf(w->out.u.fail.message, sizeof w->out.u.fail.message, "%s", msg);
    return ferry__zsock_send(w->sock, NULL, &w->out, NULL, 0);
}

/* Waits up to `ms` for a message. FERRY_OK with *got set when one came,
 * FERRY_ETIMEDOUT when told to quit. Malformed messages are dropped. */
static int wait_msg(wstate *w, int ms, zmq_msg_t *payload, int *got)
{
    *got = 0;
    zmq_pollitem_t it = {.socket = w->sock, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, ms);
    if (n < 0) {
        if (errno == EINTR)
            return FERRY_OK;
        return ferry__seterr(FERRY_ESYS, "zmq_poll: %s", zmq_strerror(errno));
    }
    if (n == 0)
        return should_quit(w) ? ferry__seterr(FERRY_ETIMEDOUT, "worker told to quit") : FERRY_OK;
    int rc = ferry__zsock_recv(w->sock, NULL, &w->in, payload, ZMQ_DONTWAIT);
    if (rc == FERRY_EPROTO) {
        fprintf(stderr, "ferry-worker: dropped a malformed message: %s\n", ferry_last_error());
        return FERRY_OK;
    }
    if (rc != FERRY_OK)
        return errno == EAGAIN ? FERRY_OK : rc;
    *got = 1;
    return FERRY_OK;
}

/* Handles CONFIG: opens the dataset and answers READY (with the error when
 * it does not open; the loader decides what happens next). */
static int on_config(wstate *w)
{
    const ferry__config_msg *c = &w->in.u.config;
    ferry_dataset_ctx ctx = {
        .seed = c->seed, .worker_index = c->worker_index, .num_workers = c->num_workers};
    char err[FERRY__TEXT_MAX] = "";
    w->seed = c->seed;

    if (w->ds_open) {
        ferry__dataset_close(&w->ds);
        w->ds_open = 0;
    }
    memset(&w->out.u.ready, 0, sizeof w->out.u.ready);
    int rc = ferry__dataset_open_flags(&w->ds, c->dataset, &ctx,
                                       w->o->keep_plugins ? FERRY__DATASET_KEEP_LOADED : 0, err,
                                       sizeof err);
    if (rc == FERRY_OK) {
        w->ds_open = 1;
        w->out.u.ready.length = w->ds.length;
    } else {
        w->out.u.ready.code = rc;
        snprintf(w->out.u.ready.error, sizeof w->out.u.ready.error, "%s",
                 err[0] ? err : ferry_strerror(rc));
    }
    w->out.type = FERRY__MSG_READY;
    return ferry__zsock_send(w->sock, NULL, &w->out, NULL, 0);
}

/* Handles TASK: builds the batch in a new payload frame and sends it. */
static int on_task(wstate *w, zmq_msg_t *task_payload)
{
    const ferry__task t = w->in.u.task;
    if (!w->ds_open)
        return send_fail(w, t.id, FERRY_EDATASET, 0, "worker has no open dataset");

    if (t.count > w->indices_cap) {
        uint64_t *p = ferry__realloc(w->indices, t.count * sizeof *p);
        if (!p)
            return send_fail(w, t.id, FERRY_ENOMEM, 0, "worker out of memory for indices");
        w->indices = p;
        w->indices_cap = t.count;
    }
    ferry__indices_unpack(zmq_msg_data(task_payload), t.count, w->indices);

    const ferry_dataset_schema *s = &w->ds.schema;
    size_t total = FERRY__FIELD_ALIGN; /* room for the lead */
    for (int f = 0; f < s->nfields; f++)
        total += FERRY__ROUND_UP(w->ds.item_bytes[f] * t.count, FERRY__FIELD_ALIGN);

    zmq_msg_t payload;
    if (zmq_msg_init_size(&payload, total) != 0)
        return send_fail(w, t.id, FERRY_ENOMEM, w->indices[0], "worker out of memory for batch");
    unsigned char *base = zmq_msg_data(&payload);
    size_t off = (FERRY__FIELD_ALIGN - (uintptr_t)base % FERRY__FIELD_ALIGN) % FERRY__FIELD_ALIGN;

    ferry__batch_hdr *h = &w->out.u.batch;
    void *dst[FERRY_MAX_FIELDS];
    memset(h, 0, sizeof *h);
    h->id = t.id;
    h->count = t.count;
    h->nfields = (uint32_t)s->nfields;
    for (int f = 0; f < s->nfields; f++) {
        ferry__field_desc *d = &h->fields[f];
        memcpy(d->name, s->fields[f].name, FERRY_NAME_MAX);
        d->dtype = s->fields[f].dtype;
        d->ndim = s->fields[f].ndim + 1;
        d->shape[0] = t.count;
        memcpy(&d->shape[1], s->fields[f].shape, sizeof(int64_t) * (size_t)s->fields[f].ndim);
        d->offset = off;
        d->nbytes = w->ds.item_bytes[f] * t.count;
        dst[f] = base + off;
        off += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
    }

    ferry_batch_request req = {.epoch = t.epoch,
                               .batch_in_epoch = t.batch_in_epoch,
                               .seq = t.seq,
                               .seed = w->seed,
                               .indices = w->indices,
                               .count = t.count};
    if (w->o->note)
        snprintf(w->o->note, w->o->note_len,
                 "building batch %llu (epoch %llu, batch %llu, %u items from index %llu)",
                 (unsigned long long)t.seq, (unsigned long long)t.epoch,
                 (unsigned long long)t.batch_in_epoch, t.count, (unsigned long long)w->indices[0]);
    ferry_dataset_error derr;
    memset(&derr, 0, sizeof derr);
    int rc = ferry__dataset_get_batch(&w->ds, &req, dst, &derr);
    if (w->o->note)
        snprintf(w->o->note, w->o->note_len, "idle");
    if (rc != FERRY_OK) {
        zmq_msg_close(&payload);
        return send_fail(w, t.id, rc, derr.index, derr.message);
    }
    w->out.type = FERRY__MSG_BATCH;
    rc = ferry__zsock_send(w->sock, NULL, &w->out, &payload, 0);
    if (rc != FERRY_OK)
        zmq_msg_close(&payload);
    return rc;
}

int ferry__worker_run(const ferry__worker_opts *o)
{
    wstate *w = ferry__calloc(1, sizeof *w);
    void *own_ctx = NULL;
    int rc;
    if (!w)
        return ferry__seterr(FERRY_ENOMEM, "worker state");
    w->o = o;

    void *ctx = o->zctx;
    if (!ctx) {
        ctx = own_ctx = zmq_ctx_new();
        if (!ctx) {
            rc = ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
            goto done;
        }
    }
    w->sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!w->sock) {
        rc = ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
        goto done;
    }
    /* A TASK is at most a header and FERRY__MAX_BATCH indices. */
    rc = ferry__zsock_setup(w->sock, FERRY__HDR_MAX + (int64_t)FERRY__MAX_BATCH * 8);
    if (rc != FERRY_OK)
        goto done;
    if (zmq_connect(w->sock, o->endpoint) != 0) {
        rc = ferry__seterr(FERRY_ESYS, "connecting to %s: %s", o->endpoint, zmq_strerror(errno));
        goto done;
    }

    memset(&w->out.u.hello, 0, sizeof w->out.u.hello);
    w->out.type = FERRY__MSG_HELLO;
    w->out.u.hello.version = FERRY_PROTOCOL_VERSION;
    w->out.u.hello.pid = (uint32_t)getpid();
    w->out.u.hello.slot = o->slot;
    gethostname(w->out.u.hello.host, sizeof w->out.u.hello.host - 1);
    snprintf(w->out.u.hello.program, sizeof w->out.u.hello.program, "ferry-worker %s",
             ferry_version());
    rc = ferry__zsock_send(w->sock, NULL, &w->out, NULL, 0);
    if (rc != FERRY_OK)
        goto done;

    int configured = 0;
    int waited = 0;
    for (;;) {
        zmq_msg_t payload;
        int got;
        rc = wait_msg(w, POLL_MS, &payload, &got);
        if (rc != FERRY_OK)
            goto done;
        if (!got) {
            waited += POLL_MS;
            if (!configured && o->handshake_ms > 0 && waited >= o->handshake_ms) {
                rc = ferry__seterr(FERRY_ETIMEDOUT, "no CONFIG from %s within %d ms", o->endpoint,
                                   o->handshake_ms);
                goto done;
            }
            continue;
        }
        switch (w->in.type) {
        case FERRY__MSG_CONFIG:
            configured = 1;
            rc = on_config(w);
            break;
        case FERRY__MSG_TASK:
            rc = on_task(w, &payload);
            break;
        case FERRY__MSG_HEARTBEAT:
            rc = FERRY_OK;
            break;
        case FERRY__MSG_STOP: {
            zmq_msg_close(&payload);
            /* A short, bounded linger so the BYE is not dropped at close. */
            int linger = 200;
            zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger);
            send_simple(w, FERRY__MSG_BYE);
            rc = FERRY_OK;
            goto done;
        }
        default:
            fprintf(stderr, "ferry-worker: unexpected %s from the loader, dropped\n",
                    ferry__msg_name(w->in.type));
            rc = FERRY_OK;
            break;
        }
        zmq_msg_close(&payload);
        if (rc != FERRY_OK)
            goto done;
    }

done:
    if (w->ds_open)
        ferry__dataset_close(&w->ds);
    if (w->sock)
        zmq_close(w->sock);
    if (own_ctx)
        zmq_ctx_term(own_ctx);
    free(w->indices);
    free(w);
    return rc;
}
