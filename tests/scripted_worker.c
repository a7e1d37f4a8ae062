/*
 * scripted_worker.c - a stand-in for ferry-worker, for the tests: a loader
 * starts it as a local worker (option worker_path, the same command line:
 * --connect ENDPOINT --slot N --parent PID) and it does what the
 * environment variable FERRY_TEST_SCRIPT says:
 *
 *   version=V    says HELLO with protocol version V, then waits for the
 *                loader's answer: exits 0 if it is REFUSE or STOP (and
 *                prints it), 1 if anything else or nothing comes.
 *   wrong_at=S   a worker of this version that serves the dataset named in
 *                CONFIG as ferry-worker does (but simply: one task at a
 *                time, fields back to back from offset 0), except that its
 *                answer to the task of seq S says field 0 has another dtype
 *                of the same size (u1 <-> i1, ...): a batch every field of
 *                which is consistent, that does not match the schema.
 *   late=N,serve,PATH
 *   late=N,die,PATH
 *                the worker of slot N waits for file PATH to exist before
 *                it connects (exiting 4 if it does not within 10 s), then
 *                serves as ferry-worker does, or exits 3 ("die") without a
 *                word to the loader; the other slots serve at once.
 *
 * Only for tests. It exits when its loader stops it, when it hears nothing
 * for 10 s, or with its parent (PR_SET_PDEATHSIG).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "dataset.h"
#include "protocol.h"
#include "zsock.h"

typedef struct script {
    uint32_t version;
    int64_t wrong_at; /* -1: none */
    uint64_t seed;
    void *sock;
    ferry__dataset ds;
    int ds_open;
    ferry__msg in, out;
} script;

static int send_out(script *sc, zmq_msg_t *payload)
{
    return ferry__zsock_send(sc->sock, NULL, NULL, &sc->out, payload, 0);
}

/* The next message within 10 s: 0, or -1. A TASK's payload stays in *p. */
static int next_msg(script *sc, zmq_msg_t *p)
{
    for (;;) {
        zmq_pollitem_t it = {.socket = sc->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10000) <= 0)
            return -1;
        if (ferry__zsock_recv(sc->sock, NULL, NULL, &sc->in, p, ZMQ_DONTWAIT) == FERRY_OK)
            return 0;
    }
}

static void on_config(script *sc)
{
    const ferry__config_msg *c = &sc->in.u.config;
    ferry_dataset_ctx ctx = {
        .seed = c->seed, .worker_index = c->worker_index, .num_workers = c->num_workers};
    char err[FERRY__TEXT_MAX] = "";
    memset(&sc->out, 0, sizeof sc->out);
    sc->out.type = FERRY__MSG_READY;
    ferry__ready *r = &sc->out.u.ready;
    sc->seed = c->seed;
    int rc = ferry__dataset_open(&sc->ds, c->dataset, &ctx, err, sizeof err);
    if (rc != FERRY_OK) {
        r->code = rc;
        snprintf(r->error, sizeof r->error, "%s", err);
        send_out(sc, NULL);
        return;
    }
    sc->ds_open = 1;
    r->length = sc->ds.length;
    ferry__dataset_wire_schema(&sc->ds, &r->schema);
    send_out(sc, NULL);
}

/* Another dtype of the same size: what the wrong batch claims. */
static ferry_dtype sibling(ferry_dtype d)
{
    switch (d) {
    case FERRY_DTYPE_U8:
        return FERRY_DTYPE_I8;
    case FERRY_DTYPE_U16:
        return FERRY_DTYPE_I16;
    case FERRY_DTYPE_U32:
        return FERRY_DTYPE_I32;
    case FERRY_DTYPE_U64:
        return FERRY_DTYPE_I64;
    case FERRY_DTYPE_I8:
        return FERRY_DTYPE_U8;
    case FERRY_DTYPE_I16:
        return FERRY_DTYPE_U16;
    case FERRY_DTYPE_I32:
        return FERRY_DTYPE_U32;
    default:
        return FERRY_DTYPE_U64;
    }
}

static void on_task(script *sc, zmq_msg_t *task_payload)
{
    const ferry__task t = sc->in.u.task;
    uint64_t idx[4096];
    if (!sc->ds_open || t.count > 4096)
        exit(1);
    ferry__indices_unpack(zmq_msg_data(task_payload), t.count, idx);
    memset(&sc->out, 0, sizeof sc->out);
    sc->out.type = FERRY__MSG_BATCH;
    ferry__batch_hdr *h = &sc->out.u.batch;
    h->id = t.id;
    h->count = t.count;
    h->nfields = (uint32_t)sc->ds.schema.nfields;
    size_t total = 0;
    for (uint32_t f = 0; f < h->nfields; f++) {
        const ferry_field_spec *s = &sc->ds.schema.fields[f];
        ferry__field_desc *d = &h->fields[f];
        memcpy(d->name, s->name, sizeof d->name);
        d->dtype = s->dtype;
        d->ndim = s->ndim + 1;
        d->shape[0] = t.count;
        memcpy(&d->shape[1], s->shape, sizeof(int64_t) * (size_t)s->ndim);
        d->offset = total;
        d->nbytes = sc->ds.item_bytes[f] * t.count;
        total += d->nbytes;
    }
    zmq_msg_t payload;
    if (zmq_msg_init_size(&payload, total) != 0)
        exit(1);
    void *dst[FERRY_MAX_FIELDS];
    for (uint32_t f = 0; f < h->nfields; f++)
        dst[f] = (char *)zmq_msg_data(&payload) + h->fields[f].offset;
    ferry_batch_request req = {.epoch = t.epoch,
                               .batch_in_epoch = t.batch_in_epoch,
                               .seq = t.seq,
                               .seed = sc->seed,
                               .indices = idx,
                               .count = t.count};
    ferry_dataset_error derr;
    if (ferry__dataset_get_batch(&sc->ds, &req, dst, &derr) != FERRY_OK)
        exit(1);
    if ((int64_t)t.seq == sc->wrong_at)
        h->fields[0].dtype = sibling(h->fields[0].dtype);
    if (send_out(sc, &payload) != FERRY_OK)
        exit(1);
}

/* Serves until STOP (0), or anything unexpected (1). */
static int serve(script *sc)
{
    for (;;) {
        zmq_msg_t p;
        if (next_msg(sc, &p) != 0)
            return 1;
        int type = sc->in.type;
        if (type == FERRY__MSG_CONFIG)
            on_config(sc);
        else if (type == FERRY__MSG_TASK)
            on_task(sc, &p);
        zmq_msg_close(&p);
        if (type == FERRY__MSG_STOP) {
            sc->out.type = FERRY__MSG_BYE;
            sc->out.u.bye = (ferry__bye){0}; /* a plain BYE */
            send_out(sc, NULL);
            return 0;
        }
        if (type == FERRY__MSG_REFUSE)
            return 1;
    }
}

/* After a HELLO of another version: the answer must be REFUSE or STOP. */
static int expect_refusal(script *sc)
{
    zmq_msg_t p;
    if (next_msg(sc, &p) != 0) {
        fprintf(stderr, "scripted worker: no answer to HELLO version %u\n", sc->version);
        return 1;
    }
    zmq_msg_close(&p);
    if (sc->in.type == FERRY__MSG_REFUSE)
        fprintf(stderr, "scripted worker: REFUSE from a version %u loader: %s\n",
                sc->in.u.refuse.version, sc->in.u.refuse.reason);
    else
        fprintf(stderr, "scripted worker: %s\n", ferry__msg_name(sc->in.type));
    return sc->in.type == FERRY__MSG_REFUSE || sc->in.type == FERRY__MSG_STOP ? 0 : 1;
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    static script sc = {.version = FERRY_PROTOCOL_VERSION, .wrong_at = -1};
    const char *ep = NULL;
    int slot = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--connect"))
            ep = argv[i + 1];
        else if (!strcmp(argv[i], "--slot"))
            slot = atoi(argv[i + 1]);
    }
    const char *what = getenv("FERRY_TEST_SCRIPT");
    if (!ep || !what)
        return 2;
    if (!strncmp(what, "version=", 8))
        sc.version = (uint32_t)strtoul(what + 8, NULL, 10);
    else if (!strncmp(what, "wrong_at=", 9))
        sc.wrong_at = strtoll(what + 9, NULL, 10);
    else if (!strncmp(what, "late=", 5) && atoi(what + 5) == slot) {
        const char *how = strchr(what, ','), *path = how ? strchr(how + 1, ',') : NULL;
        if (!path)
            return 2;
        struct timespec tick = {0, 5 * 1000 * 1000};
        for (int i = 0; access(path + 1, F_OK) != 0; i++) {
            if (i == 2000)
                return 4;
            nanosleep(&tick, NULL);
        }
        if (!strncmp(how + 1, "die,", 4)) {
            fprintf(stderr, "scripted worker: slot %d gives up before its HELLO\n", slot);
            return 3;
        }
    }
    void *ctx = zmq_ctx_new();
    sc.sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 1000;
    zmq_setsockopt(sc.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(sc.sock, ep) != 0)
        return 1;
    sc.out.type = FERRY__MSG_HELLO;
    sc.out.u.hello = (ferry__hello){.version = sc.version, .pid = (uint32_t)getpid(), .slot = slot};
    snprintf(sc.out.u.hello.program, sizeof sc.out.u.hello.program, "scripted worker");
    int rc = send_out(&sc, NULL) != FERRY_OK        ? 1
             : sc.version != FERRY_PROTOCOL_VERSION ? expect_refusal(&sc)
                                                    : serve(&sc);
    if (sc.ds_open)
        ferry__dataset_close(&sc.ds);
    zmq_close(sc.sock);
    zmq_ctx_term(ctx);
    return rc;
}
