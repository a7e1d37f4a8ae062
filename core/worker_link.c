/*
 * worker_link.c - the worker's connection to the loader (see
 * worker_internal.h): every send and wait, the heartbeat thread that keeps
 * a remote worker's session alive while a batch takes long, the parent
 * watch, and the plain-TCP data join.
 *
 * The socket is shared with the heartbeat thread: whoever uses it holds
 * sock_mu.
 */
#include "worker_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "zsock.h"

/* Every send goes through here: it holds the socket and notes the time. */
int ferry__worker_send(worker_session *w, zmq_msg_t *payload, int flags)
{
    pthread_mutex_lock(&w->sock_mu);
    int rc = ferry__zsock_send(w->sock, NULL, w->seal, &w->out, payload, flags);
    if (rc == FERRY_OK)
        w->sent_ms = ferry__now_ms();
    pthread_mutex_unlock(&w->sock_mu);
    return rc;
}

/* The heartbeat thread: while the main thread is busy in dataset code, it
 * keeps the loader from taking this worker for dead. Its own message
 * struct, so it never touches the main thread's. */
static void *heartbeat_main(void *arg)
{
    worker_session *w = arg;
    ferry__msg hb;
    memset(&hb, 0, sizeof hb);
    hb.type = FERRY__MSG_HEARTBEAT;
    pthread_mutex_lock(&w->sock_mu);
    while (!w->hb_stop) {
        uint64_t now = ferry__now_ms();
        if (now - w->sent_ms >= w->hb_ms) {
            if (ferry__zsock_send(w->sock, NULL, w->seal, &hb, NULL, ZMQ_DONTWAIT) == FERRY_OK)
                w->sent_ms = now;
        }
        uint64_t due = w->sent_ms + w->hb_ms;
        struct timespec ts = ferry__deadline_ts(CLOCK_MONOTONIC, due > now ? due - now : w->hb_ms);
        pthread_cond_timedwait(&w->hb_cv, &w->sock_mu, &ts);
    }
    pthread_mutex_unlock(&w->sock_mu);
    return NULL;
}

int ferry__worker_start_heartbeats(worker_session *w, uint32_t ms, uint32_t liveness)
{
    if (w->hb_live || ms == 0)
        return FERRY_OK;
    w->hb_ms = ms;
    w->dead_ms = (uint64_t)ms * (liveness ? liveness : 1);
    int e = pthread_create(&w->hb_thread, NULL, heartbeat_main, w);
    if (e)
        return ferry__syserr(FERRY_ESYS, "starting the heartbeat thread", e);
    w->hb_live = 1;
    return FERRY_OK;
}

void ferry__worker_stop_heartbeats(worker_session *w)
{
    if (!w->hb_live)
        return;
    pthread_mutex_lock(&w->sock_mu);
    w->hb_stop = 1;
    pthread_cond_signal(&w->hb_cv);
    pthread_mutex_unlock(&w->sock_mu);
    pthread_join(w->hb_thread, NULL);
    w->hb_live = 0;
}

/* Whether to end the session: told to, or the loader that started this
 * process is gone. getppid is a system call and this is asked after every
 * message, so the parent is looked at at most once per POLL_MS (an orphan
 * notices within two idle polls; PR_SET_PDEATHSIG usually ends it first). */
int ferry__worker_should_quit(worker_session *w)
{
    if (w->o->cancel && atomic_load(w->o->cancel))
        return 1;
    if (!w->o->parent)
        return 0;
    uint64_t now = ferry__now_ms();
    if (now - w->parent_ms < POLL_MS)
        return 0;
    w->parent_ms = now;
    return getppid() != w->o->parent;
}

int ferry__worker_send_simple(worker_session *w, ferry__msg_type type)
{
    w->out.type = type;
    return ferry__worker_send(w, NULL, 0);
}

int ferry__worker_send_fail(worker_session *w, uint64_t id, int code, uint64_t index, const char *msg)
{
    memset(&w->out.u.fail, 0, sizeof w->out.u.fail);
    w->out.type = FERRY__MSG_FAIL;
    w->out.u.fail.id = id;
    w->out.u.fail.code = code < 0 ? code : FERRY_EBATCH;
    w->out.u.fail.index = index;
    snprintf(w->out.u.fail.message, sizeof w->out.u.fail.message, "%s", msg);
    return ferry__worker_send(w, NULL, 0);
}

/* Waits up to `ms` for a message. FERRY_OK with *got set when one came,
 * FERRY_ETIMEDOUT when told to quit. Malformed messages are dropped. */
int ferry__worker_wait(worker_session *w, int ms, zmq_msg_t *payload, int *got)
{
    *got = 0;
    pthread_mutex_lock(&w->sock_mu);
    /* A task already queued is taken without polling: zmq_poll costs
     * system calls even when a message is waiting, and with several
     * credits there usually is one. */
    int n = 1, e = 0;
    ferry__zsock_opener sealed = {.seal = w->seal};
    const ferry__zsock_opener *open = w->seal ? &sealed : NULL;
    int rc = ferry__zsock_recv(w->sock, NULL, open, &w->in, payload, ZMQ_DONTWAIT);
    if (rc == FERRY_EAGAIN) {
        zmq_pollitem_t it = {.socket = w->sock, .events = ZMQ_POLLIN};
        n = zmq_poll(&it, 1, ms);
        e = errno;
        rc = n > 0 ? ferry__zsock_recv(w->sock, NULL, open, &w->in, payload, ZMQ_DONTWAIT)
                   : FERRY_OK;
    }
    pthread_mutex_unlock(&w->sock_mu);
    if (n < 0) {
        if (e == EINTR)
            return FERRY_OK;
        return ferry__seterr(FERRY_ESYS, "zmq_poll: %s", zmq_strerror(e));
    }
    if (n == 0)
        return ferry__worker_should_quit(w) ? ferry__seterr(FERRY_ETIMEDOUT, "worker told to quit") : FERRY_OK;
    /* On a sealed connection, a message that does not open means the
     * stream can no longer be trusted (a task may have been lost): the
     * session ends, and the loader requeues what it had sent here. The
     * detail is copied out first: ferry_last_error() is the very buffer
     * the new message is written into, so formatting from it in place
     * wrote the prefix over the detail before reading it (issue 36.4). */
    if (rc == FERRY_EPROTO && open) {
        char why[FERRY__ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", ferry_last_error());
        return ferry__seterr(FERRY_EPROTO, "the loader's data connection %s: %s", w->data_ep, why);
    }
    if (rc == FERRY_EPROTO) {
        fprintf(stderr, "ferry-worker: dropped a malformed message: %s\n", ferry_last_error());
        return FERRY_OK;
    }
    if (rc == FERRY_EAGAIN)
        return FERRY_OK;
    if (rc != FERRY_OK)
        return rc;
    *got = 1;
    w->joining = 0;
    w->heard_ms = ferry__now_ms();
    return FERRY_OK;
}

/* A DEALER for endpoint: limits, then for tcp:// ZeroMQ's heartbeats (a
 * dead connection is closed and redialled) and a reconnect interval that
 * backs off to 2 s. */
static int setup_socket(void *sock, const char *endpoint)
{
    /* A TASK is at most a header and FERRY__MAX_BATCH indices. */
    int rc = ferry__socket_setup(sock, FERRY__HDR_MAX + (int64_t)FERRY__MAX_BATCH * 8);
    if (rc != FERRY_OK || strncmp(endpoint, "tcp://", 6) != 0)
        return rc;
    rc = ferry__sockopt_int(sock, ZMQ_HEARTBEAT_IVL, 1000, "ZMQ_HEARTBEAT_IVL");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_HEARTBEAT_TIMEOUT, 5000, "ZMQ_HEARTBEAT_TIMEOUT");
    if (rc == FERRY_OK) /* redial backs off to 2 s */
        rc = ferry__sockopt_int(sock, ZMQ_RECONNECT_IVL_MAX, 2000, "ZMQ_RECONNECT_IVL_MAX");
    return rc;
}

/* The loader's endpoint with another port: the host is the one this
 * worker reached, whatever address the loader bound. */
static int with_port(const char *endpoint, uint32_t port, char *out, size_t cap)
{
    const char *colon = strrchr(endpoint, ':');
    if (strncmp(endpoint, "tcp://", 6) != 0 || !colon || colon < endpoint + 6)
        return ferry__seterr(FERRY_EPROTO, "CONFIG names a data port, but %s is not tcp://HOST:PORT",
                             endpoint);
    int n = snprintf(out, cap, "%.*s:%u", (int)(colon - endpoint), endpoint, (unsigned)port);
    if (n < 0 || (size_t)n >= cap)
        return ferry__seterr(FERRY_ELIMIT, "the loader's endpoint %s is too long", endpoint);
    return FERRY_OK;
}

/* CONFIG admitted this worker and named the port and token of its data
 * connection. The session moves there (a new DEALER, PLAIN with the token
 * as password) and says so with a HEARTBEAT, so the loader binds it before
 * the dataset is even open; the HELLO connection, which takes nothing
 * larger than a header, is closed. Under CURVE, CONFIG also brought the
 * session's keys, and everything on the data connection is sealed with
 * them; a loader that would have a CURVE worker go on unsealed is refused. */
int ferry__worker_join_data(worker_session *w, const ferry__config_msg *c)
{
    if (w->o->server_key && !c->seal[0])
        return ferry__seterr(FERRY_EPROTO,
                             "the loader at %s would have this CURVE worker send its batches "
                             "unencrypted (CONFIG brought no session keys): refused",
                             w->o->endpoint);
    int rc = with_port(w->o->endpoint, c->data_port, w->data_ep, sizeof w->data_ep);
    if (rc != FERRY_OK)
        return rc;
    ferry__seal *seal = NULL;
    if (c->seal[0] && (rc = ferry__seal_new(&seal, c->seal, FERRY__SEAL_WORKER)) != FERRY_OK)
        return rc;
    void *s = zmq_socket(w->ctx, ZMQ_DEALER);
    if (!s) {
        ferry__seal_free(seal);
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    }
    rc = setup_socket(s, w->data_ep);
    if (rc == FERRY_OK)
        rc = ferry__sockopt(s, ZMQ_PLAIN_USERNAME, "ferry-worker", 12, "ZMQ_PLAIN_USERNAME");
    if (rc == FERRY_OK)
        rc = ferry__sockopt(s, ZMQ_PLAIN_PASSWORD, c->token, strlen(c->token),
                            "ZMQ_PLAIN_PASSWORD");
    if (rc == FERRY_OK && zmq_connect(s, w->data_ep) != 0)
        rc = ferry__seterr(FERRY_ESYS, "connecting to %s: %s", w->data_ep, zmq_strerror(errno));
    if (rc != FERRY_OK) {
        zmq_close(s);
        ferry__seal_free(seal);
        return rc;
    }
    pthread_mutex_lock(&w->sock_mu);
    ferry__sockopt_int(w->sock, ZMQ_LINGER, 0, "ZMQ_LINGER");
    zmq_close(w->sock);
    w->sock = s;
    w->seal = seal;
    pthread_mutex_unlock(&w->sock_mu);
    w->joining = 1;
    w->heard_ms = ferry__now_ms();
    return ferry__worker_send_simple(w, FERRY__MSG_HEARTBEAT);
}

/* The HELLO connection's DEALER: setup_socket, and CURVE when a server
 * key is given. */
int ferry__worker_setup_hello_socket(worker_session *w)
{
    const ferry__worker_opts *o = w->o;
    int rc = setup_socket(w->sock, o->endpoint);
    if (rc != FERRY_OK || !o->server_key || strncmp(o->endpoint, "tcp://", 6) != 0)
        return rc;
    if (zmq_setsockopt(w->sock, ZMQ_CURVE_SERVERKEY, o->server_key, 40) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_CURVE_PUBLICKEY, o->public_key, 40) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_CURVE_SECRETKEY, o->secret_key, 40) != 0)
        return ferry__seterr(FERRY_EOPTION, "setting the CURVE keys: %s", zmq_strerror(errno));
    return FERRY_OK;
}

/* BYE, with a short, bounded linger so it is not dropped at close (nor
 * the BATCH sent just before it). Should the linger not take, the BYE may
 * be lost at close: the loader then finds this worker gone by its pidfd
 * or heartbeats, as it would a crash, so the session ends either way. A
 * retiring worker's BYE says why (w->retiring) with its figures. */
void ferry__worker_say_bye(worker_session *w)
{
    pthread_mutex_lock(&w->sock_mu);
    if (ferry__sockopt_int(w->sock, ZMQ_LINGER, 200, "ZMQ_LINGER") != FERRY_OK)
        fprintf(stderr, "ferry-worker: %s; BYE may be lost\n", ferry_last_error());
    pthread_mutex_unlock(&w->sock_mu);
    w->out.u.bye = (ferry__bye){0};
    if (w->retiring)
        w->out.u.bye = (ferry__bye){.retired = (uint32_t)w->retiring,
                                    .rss = w->retire.rss,
                                    .batches = w->retire.batches};
    ferry__worker_send_simple(w, FERRY__MSG_BYE);
}

/* A HEARTBEAT if nothing has been sent for an interval. Checked after
 * every message as well as when idle: a worker that only ever receives (the
 * loader's own heartbeats) must still be heard. */
int ferry__worker_heartbeat_if_due(worker_session *w)
{
    if (!w->hb_ms)
        return FERRY_OK;
    pthread_mutex_lock(&w->sock_mu);
    uint64_t since = ferry__now_ms() - w->sent_ms;
    pthread_mutex_unlock(&w->sock_mu);
    return since >= w->hb_ms ? ferry__worker_send_simple(w, FERRY__MSG_HEARTBEAT) : FERRY_OK;
}
