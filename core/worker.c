/*
 * worker.c - the worker loop (see worker.h): a session's messages, one after
 * another, and what each means (CONFIG opens the dataset, TASK builds a
 * batch, STOP and REFUSE end the session), idle time (heartbeats, giving
 * the heap back), and the run that opens and ends sessions.
 *
 * The worker's other two files (worker_internal.h says what they share):
 * worker_link.c, its connection to the loader (sending and waiting,
 * heartbeats, the TCP data join); worker_batch.c, how a batch is built in
 * place (in a payload frame or in the loader's shared batch slots).
 */
#include "worker_internal.h"

#include <errno.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"

/* A remote worker loads plugins only from its own plugin_dir, and only by
 * file name: the network never names a path to dlopen. Writes the spec to
 * open into out. */
static int confine_plugin(const ferry__worker_opts *o, const char *spec, char *out, size_t cap,
                          char *err, size_t errcap)
{
    if (!o->confine_plugins || strncmp(spec, "plugin:", 7) != 0) {
        snprintf(out, cap, "%s", spec);
        return FERRY_OK;
    }
    const char *name = spec + 7;
    size_t len = strcspn(name, "?");
    if (!o->plugin_dir || !o->plugin_dir[0]) {
        snprintf(err, errcap, "this worker loads no plugins (start it with --plugin-dir DIR)");
        return FERRY_EDATASET;
    }
    if (len == 0 || memchr(name, '/', len) || (len == 1 && name[0] == '.') ||
        (len == 2 && name[0] == '.' && name[1] == '.')) {
        snprintf(err, errcap, "plugin '%.*s' must be a file name in this worker's plugin directory",
                 (int)len, name);
        return FERRY_EDATASET;
    }
    int n = snprintf(out, cap, "plugin:%s/%s", o->plugin_dir, name);
    if (n < 0 || (size_t)n >= cap) {
        snprintf(err, errcap, "plugin path is too long");
        return FERRY_EDATASET;
    }
    return FERRY_OK;
}

/* Handles CONFIG: opens the dataset and answers READY with its length and
 * schema (or with the error when it does not open; the loader decides what
 * happens next). */
static int on_config(worker_session *w)
{
    const ferry__config_msg *c = &w->in.u.config;
    ferry_dataset_ctx ctx = {
        .seed = c->seed, .worker_index = c->worker_index, .num_workers = c->num_workers};
    char err[FERRY__TEXT_MAX] = "";
    w->seed = c->seed;
    w->max_message = c->max_message;
    int rc = ferry__retire_set(&w->retire, c->retire_rss, c->retire_batches);
    if (rc != FERRY_OK)
        return rc;

    if (w->ds_open) {
        ferry__dataset_close(&w->ds);
        w->ds_open = 0;
    }
    rc = ferry__worker_start_heartbeats(w, c->heartbeat_ms, c->liveness);
    if (rc != FERRY_OK)
        return rc;
    char spec[FERRY__SPEC_MAX + PATH_MAX];
    rc = confine_plugin(w->o, c->dataset, spec, sizeof spec, err, sizeof err);
    memset(&w->out.u.ready, 0, sizeof w->out.u.ready);
    if (rc == FERRY_OK)
        rc = ferry__dataset_open_flags(&w->ds, spec, &ctx,
                                       w->o->keep_plugins ? FERRY__DATASET_KEEP_LOADED : 0, err,
                                       sizeof err);
    if (rc == FERRY_OK) {
        w->ds_open = 1;
        w->has_var = 0;
        for (int f = 0; f < w->ds.schema.nfields; f++)
            w->has_var |= w->ds.schema.fields[f].ndim == FERRY_NDIM_VAR;
        w->out.u.ready.length = w->ds.length;
        ferry__dataset_wire_schema(&w->ds, &w->out.u.ready.schema);
    } else {
        w->out.u.ready.code = rc;
        snprintf(w->out.u.ready.error, sizeof w->out.u.ready.error, "%s",
                 err[0] ? err : ferry_strerror(rc));
        snprintf(w->refusal, sizeof w->refusal, "could not open dataset '%s': %s", c->dataset,
                 w->out.u.ready.error);
    }
    w->out.type = FERRY__MSG_READY;
    return ferry__worker_send(w, NULL, 0);
}

/* A worker left without a task for this long gives its heap's free
 * memory back to the system: what building batches allocated and freed
 * (decoded images, a dataset's temporaries) stays in glibc's heap
 * otherwise, as part of this worker's memory, through an epoch's end, a
 * trainer that is the bottleneck, or a loader (a validation one) that
 * waits for its turn. Busy, it never trims: the next batch would fault
 * the same pages in again. */
#define IDLE_TRIM_MS 100

static void trim_when_idle(worker_session *w, uint64_t now)
{
#ifdef __GLIBC__
    /* A thread worker's heap is the trainer's: never trimmed from here. */
    if (!w->o->zctx && !w->trimmed && now - w->task_ms >= IDLE_TRIM_MS) {
        w->trimmed = 1;
        malloc_trim(0);
    }
#else
    (void)w;
    (void)now;
#endif
}

/* What the main loop does when no message came: heartbeats while idle,
 * and the end of the session when the loader has gone silent. */
static int on_idle(worker_session *w, int configured, uint64_t waited)
{
    if (!configured) {
        if (w->o->handshake_ms > 0 && waited >= (uint64_t)w->o->handshake_ms)
            return ferry__seterr(FERRY_ETIMEDOUT,
                                 "no CONFIG from %s within %d ms (no loader there yet, or it "
                                 "refused this worker's key or protocol)",
                                 w->o->endpoint, w->o->handshake_ms);
        return FERRY_OK;
    }
    uint64_t now = ferry__now_ms();
    trim_when_idle(w, now);
    uint64_t join_ms = w->hb_ms ? w->dead_ms : (uint64_t)w->o->handshake_ms;
    if (w->joining && join_ms && now - w->heard_ms >= join_ms)
        return ferry__seterr(FERRY_ETIMEDOUT,
                             "the loader at %s admitted this worker, but its data port %s did not "
                             "take the connection within %llu ms (is that port reachable through "
                             "the firewall? or the loader refused the session token)",
                             w->o->endpoint, w->data_ep, (unsigned long long)join_ms);
    if (!w->hb_ms)
        return FERRY_OK;
    if (now - w->heard_ms >= w->dead_ms)
        return ferry__seterr(
            FERRY_ETIMEDOUT, "the loader at %s has been silent for %llu ms (heartbeat %llu ms)",
            w->o->endpoint, (unsigned long long)(now - w->heard_ms), (unsigned long long)w->hb_ms);
    return ferry__worker_heartbeat_if_due(w);
}

/* STOP: the session ends with BYE. FERRY_OK after a normal session, else
 * FERRY_ECLOSED saying why the loader turned this worker away. */
static int on_stop(worker_session *w, int configured)
{
    ferry__worker_say_bye(w);
    if (w->ds_open)
        return FERRY_OK;
    if (configured)
        return ferry__seterr(FERRY_ECLOSED, "the loader at %s turned this worker away: %s",
                             w->o->endpoint, w->refusal);
    return ferry__seterr(FERRY_ECLOSED,
                         "the loader at %s refused this worker (it is full, closing, or speaks "
                         "another protocol)",
                         w->o->endpoint);
}

/* REFUSE: the loader will not have this worker, which speaks another
 * protocol version. The session ends at once and without BYE (the loader
 * has already forgotten this connection): FERRY_EVERSION naming both
 * versions, or FERRY_ECLOSED with the loader's reason should the versions
 * agree after all. */
static int on_refuse(worker_session *w)
{
    const ferry__refuse *r = &w->in.u.refuse;
    if (r->version != FERRY_PROTOCOL_VERSION)
        return ferry__seterr(FERRY_EVERSION,
                             "the loader at %s refused this worker: " FERRY__VERSION_MISMATCH,
                             w->o->endpoint, FERRY_PROTOCOL_VERSION, r->version);
    return ferry__seterr(FERRY_ECLOSED, "the loader at %s refused this worker: %s", w->o->endpoint,
                         r->reason);
}

/* Acts on one message from the loader; *stopped is set when it ended the
 * session (STOP, REFUSE). */
static int on_message(worker_session *w, zmq_msg_t *payload, int *configured, int *stopped)
{
    switch (w->in.type) {
    case FERRY__MSG_CONFIG: {
        *configured = 1;
        int rc = w->in.u.config.data_port && !w->data_ep[0] ? ferry__worker_join_data(w, &w->in.u.config)
                                                             : FERRY_OK;
        explicit_bzero(w->in.u.config.seal, sizeof w->in.u.config.seal);
        if (rc == FERRY_OK)
            rc = on_config(w);
        if (rc == FERRY_OK && w->ds_open && w->o->configured)
            *w->o->configured = 1;
        return rc;
    }
    case FERRY__MSG_TASK: {
        int rc = ferry__worker_on_task(w, payload);
        w->task_ms = ferry__now_ms();
        w->trimmed = 0;
        if (rc == FERRY_OK)
            w->retiring = ferry__retire_after_task(&w->retire);
        return rc;
    }
    case FERRY__MSG_HEARTBEAT:
        return FERRY_OK;
    case FERRY__MSG_STOP:
        *stopped = 1;
        return on_stop(w, *configured);
    case FERRY__MSG_REFUSE:
        *stopped = 1;
        return on_refuse(w);
    default:
        fprintf(stderr, "ferry-worker: unexpected %s from the loader, dropped\n",
                ferry__msg_name(w->in.type));
        return FERRY_OK;
    }
}

/* The session's loop: messages until STOP, a failure, silence, or being
 * told to quit (then BYE, so the loader requeues at once). */
static int serve(worker_session *w)
{
    int configured = 0, stopped = 0;
    uint64_t start = ferry__now_ms();
    for (;;) {
        zmq_msg_t payload;
        int got;
        /* Short enough polls that heartbeats go out on time. */
        int poll_ms = w->hb_ms && w->hb_ms / 2 < POLL_MS ? (int)(w->hb_ms / 2) : POLL_MS;
        int rc = ferry__worker_wait(w, poll_ms > 0 ? poll_ms : 1, &payload, &got);
        if (rc == FERRY_OK && !got) {
            rc = on_idle(w, configured, ferry__now_ms() - start);
            if (rc == FERRY_OK)
                continue;
            return rc;
        }
        if (rc == FERRY_OK) {
            rc = on_message(w, &payload, &configured, &stopped);
            zmq_msg_close(&payload);
            if (stopped)
                return rc;
        }
        if (rc == FERRY_OK && w->retiring) {
            /* Its last batch is sent; the tasks queued behind it were
             * never started, and go to the others (retire.h). */
            ferry__worker_say_bye(w);
            return FERRY_OK;
        }
        if (rc == FERRY_OK)
            rc = ferry__worker_heartbeat_if_due(w);
        if (rc == FERRY_OK && ferry__worker_should_quit(w))
            rc = ferry__seterr(FERRY_ETIMEDOUT, "worker told to quit");
        if (rc != FERRY_OK) {
            if (ferry__worker_should_quit(w) && configured)
                ferry__worker_say_bye(w);
            return rc;
        }
    }
}

/* The DEALER, connected, and HELLO sent. */
static int open_session(worker_session *w, void *ctx)
{
    const ferry__worker_opts *o = w->o;
    w->sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!w->sock)
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    int rc = ferry__worker_setup_hello_socket(w);
    if (rc != FERRY_OK)
        return rc;
    if (zmq_connect(w->sock, o->endpoint) != 0)
        return ferry__seterr(FERRY_ESYS, "connecting to %s: %s", o->endpoint, zmq_strerror(errno));
    memset(&w->out.u.hello, 0, sizeof w->out.u.hello);
    w->out.type = FERRY__MSG_HELLO;
    w->out.u.hello.version = FERRY_PROTOCOL_VERSION;
    w->out.u.hello.pid = (uint32_t)getpid();
    w->out.u.hello.slot = o->slot;
    gethostname(w->out.u.hello.host, sizeof w->out.u.hello.host - 1);
    snprintf(w->out.u.hello.program, sizeof w->out.u.hello.program, "ferry-worker %s",
             ferry_version());
    return ferry__worker_send(w, NULL, 0);
}

int ferry__worker_run(const ferry__worker_opts *o)
{
    worker_session *w = ferry__calloc(1, sizeof *w);
    if (!w)
        return ferry__seterr(FERRY_ENOMEM, "worker state");
    w->o = o;
    ferry__retire_init(&w->retire);
    pthread_mutex_init(&w->sock_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->hb_cv, &ca);
    pthread_condattr_destroy(&ca);

    int rc = FERRY_OK;
    void *ctx = o->zctx, *own_ctx = NULL;
    if (!ctx) {
        ctx = own_ctx = zmq_ctx_new();
        if (!ctx)
            rc = ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
    }
    w->ctx = ctx;
    if (rc == FERRY_OK)
        rc = open_session(w, ctx);
    if (rc == FERRY_OK)
        rc = serve(w);

    ferry__worker_stop_heartbeats(w);
    ferry__retire_close(&w->retire);
    if (w->ds_open)
        ferry__dataset_close(&w->ds);
    if (w->sock)
        zmq_close(w->sock);
    ferry__seal_free(w->seal);
    if (own_ctx)
        zmq_ctx_term(own_ctx);
    pthread_cond_destroy(&w->hb_cv);
    pthread_mutex_destroy(&w->sock_mu);
    if (w->shm_base && !w->o->shm)
        munmap(w->shm_base, w->shm_len);
    free(w->shm_seen);
    free(w->indices);
    free(w);
    return rc;
}
