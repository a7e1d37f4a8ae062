/*
 * remote.c - the remote workers' socket, CURVE and ZAP, admission and
 * liveness (see remote.h).
 */
#include "remote.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "endpoint.h"
#include "error.h"
#include "keys.h"
#include "zap.h"

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a draft option in libzmq 4.3's header */
#endif

struct ferry__remote {
    ferry__remote_opts o;
    void *sock;
    void *zap; /* the ZAP handler's socket when CURVE is on */
    ferry__allow allow;
    char bound[FERRY__ENDPOINT_MAX];
    int item_sock, item_zap; /* where their poll items went, -1: none */
};

/* The CURVE server side: the loader's key pair, the allow-list, and the ZAP
 * handler that applies it, bound before the endpoint so no handshake can
 * come first. */
static int setup_curve(ferry__remote *rm, void *zctx)
{
    const ferry__remote_opts *o = &rm->o;
    if (!o->curve_key[0] || !o->curve_allow[0])
        return ferry__seterr(FERRY_EOPTION,
                             "bind %s needs curve_key (the loader's key pair, from ferry-keygen) "
                             "and curve_allow (the workers' public keys), or insecure=1 for "
                             "plain TCP",
                             o->bind);
    char pub[FERRY__Z85_KEY + 1], sec[FERRY__Z85_KEY + 1];
    int rc = ferry__key_pair_load(o->curve_key, pub, sec);
    if (rc != FERRY_OK)
        return rc;
    rc = ferry__allow_load(o->curve_allow, &rm->allow);
    if (rc == FERRY_OK)
        rc = ferry__zap_open(zctx, &rm->zap);
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(rm->sock, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
    if (rc == FERRY_OK)
        rc = ferry__sockopt(rm->sock, ZMQ_CURVE_SECRETKEY, sec, FERRY__Z85_KEY,
                            "ZMQ_CURVE_SECRETKEY");
    explicit_bzero(sec, sizeof sec);
    if (rc == FERRY_OK)
        rc = ferry__sockopt(rm->sock, ZMQ_ZAP_DOMAIN, FERRY__ZAP_DOMAIN, strlen(FERRY__ZAP_DOMAIN),
                            "ZMQ_ZAP_DOMAIN");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(rm->sock, ZMQ_ZAP_ENFORCE_DOMAIN, 1, "ZMQ_ZAP_ENFORCE_DOMAIN");
    return rc;
}

/* ZeroMQ's own heartbeats, so a dead TCP connection is closed, then CURVE
 * (or, asked for, plain TCP), then the bind. */
static int setup_socket(ferry__remote *rm, void *zctx)
{
    const ferry__remote_opts *o = &rm->o;
    int64_t dead = o->heartbeat_ms * o->liveness;
    int rc =
        ferry__sockopt_int(rm->sock, ZMQ_HEARTBEAT_IVL, (int)o->heartbeat_ms, "ZMQ_HEARTBEAT_IVL");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(rm->sock, ZMQ_HEARTBEAT_TIMEOUT,
                                dead > INT32_MAX ? INT32_MAX : (int)dead, "ZMQ_HEARTBEAT_TIMEOUT");
    if (rc == FERRY_OK && !o->insecure)
        rc = setup_curve(rm, zctx);
    if (rc == FERRY_OK)
        rc = ferry__socket_bind(rm->sock, o->bind, FERRY_EOPTION);
    if (rc != FERRY_OK)
        return rc;
    size_t len = sizeof rm->bound;
    if (zmq_getsockopt(rm->sock, ZMQ_LAST_ENDPOINT, rm->bound, &len) != 0)
        snprintf(rm->bound, sizeof rm->bound, "%s", o->bind);
    if (o->insecure)
        ferry__logf(&o->log, FERRY_LOG_WARN,
                    "remote workers on %s are neither authenticated nor encrypted (insecure=1): "
                    "anyone who can reach it can join and read every batch",
                    rm->bound);
    return FERRY_OK;
}

int ferry__remote_open(ferry__remote **out, void *zctx, const ferry__remote_opts *o)
{
    if (strncmp(o->bind, "tcp://", 6) != 0)
        return ferry__seterr(FERRY_EOPTION, "bind '%s' is not a tcp:// endpoint", o->bind);
    ferry__remote *rm = ferry__calloc(1, sizeof *rm);
    if (!rm)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the remote socket");
    rm->o = *o;
    int rc = ferry__socket_new(zctx, ZMQ_ROUTER, o->max_message, &rm->sock);
    if (rc == FERRY_OK)
        rc = setup_socket(rm, zctx);
    if (rc != FERRY_OK) {
        ferry__remote_close(rm);
        return rc;
    }
    *out = rm;
    return FERRY_OK;
}

void ferry__remote_close(ferry__remote *rm)
{
    if (!rm)
        return;
    if (rm->sock)
        zmq_close(rm->sock);
    if (rm->zap)
        zmq_close(rm->zap);
    ferry__allow_free(&rm->allow);
    free(rm);
}

void *ferry__remote_socket(const ferry__remote *rm)
{
    return rm->sock;
}

const char *ferry__remote_endpoint(const ferry__remote *rm)
{
    return rm->bound;
}

int ferry__remote_poll_items(ferry__remote *rm, zmq_pollitem_t *items)
{
    int n = 0;
    rm->item_sock = n;
    items[n++] = (zmq_pollitem_t){.socket = rm->sock, .events = ZMQ_POLLIN};
    rm->item_zap = -1;
    if (rm->zap) {
        rm->item_zap = n;
        items[n++] = (zmq_pollitem_t){.socket = rm->zap, .events = ZMQ_POLLIN};
    }
    return n;
}

int ferry__remote_readable(const ferry__remote *rm, const zmq_pollitem_t *items)
{
    return (items[rm->item_sock].revents & ZMQ_POLLIN) != 0;
}

void ferry__remote_serve_zap(ferry__remote *rm, const zmq_pollitem_t *items,
                             void (*refused)(void *arg, const char *why), void *arg)
{
    if (rm->item_zap < 0 || !(items[rm->item_zap].revents & ZMQ_POLLIN))
        return;
    char why[256];
    for (int k = 0; k < 16; k++) {
        int r = ferry__zap_serve(rm->zap, &rm->allow, why, sizeof why);
        if (r < 0)
            return;
        if (r == 0)
            refused(arg, why);
    }
}

int ferry__remote_hello_ok(const ferry__hello *h, char *why, size_t cap)
{
    if (h->version != FERRY_PROTOCOL_VERSION) {
        snprintf(why, cap, FERRY__VERSION_MISMATCH ": HELLO from %s (pid %u, '%s')", h->version,
                 FERRY_PROTOCOL_VERSION, h->host, h->pid, h->program);
        return 0;
    }
    if (h->slot == -1)
        return 1;
    snprintf(why, cap, "HELLO from %s (pid %u) claims local slot %d", h->host, h->pid, h->slot);
    return 0;
}

ferry__liveness ferry__remote_liveness(const ferry__remote *rm, const ferry__peer *p, uint64_t now,
                                       char *why, size_t cap)
{
    uint64_t hb = (uint64_t)rm->o.heartbeat_ms;
    uint64_t dead_after = hb * (uint64_t)rm->o.liveness;
    if (now - p->heard_ms >= dead_after) {
        snprintf(why, cap, "nothing heard from it for %llu ms (heartbeat_ms %lld x %lld)",
                 (unsigned long long)(now - p->heard_ms), (long long)hb, (long long)rm->o.liveness);
        return FERRY__LIVE_LOST;
    }
    return now - p->sent_ms >= hb ? FERRY__LIVE_HEARTBEAT : FERRY__LIVE_OK;
}

void ferry__remote_log_refusal(const ferry__remote *rm, uint64_t n, const char *why)
{
    if (n <= 10 || n % 100 == 0)
        ferry__logf(&rm->o.log, FERRY_LOG_WARN, "refused a remote worker (%llu refused so far): %s",
                    (unsigned long long)n, why);
}
