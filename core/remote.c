/*
 * remote.c - the remote workers' sockets, CURVE and ZAP, admission and
 * liveness (see remote.h).
 *
 * Session tokens: one per remote slot, k = the slot's index among the
 * remote ones. A token is ISSUED when the slot's worker is sent
 * CONFIG, TAKEN when the ZAP handler lets one data connection in with it
 * (never again: a second connection, or a redial, is refused), and wiped
 * when the slot's session ends or a new one begins. Under CURVE the
 * session's seal (seal.h) lives and dies with its token.
 */
#include "remote.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "endpoint.h"
#include "error.h"
#include "guard.h"
#include "keys.h"
#include "process.h"
#include "zap.h"

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a draft option in libzmq 4.3's header */
#endif

enum { TOKEN_NONE = 0, TOKEN_ISSUED, TOKEN_TAKEN };

typedef struct session_token {
    char hex[FERRY__TOKEN_HEX + 1];
    int state;
    ferry__seal *seal; /* under CURVE, from ISSUED on */
} session_token;

struct ferry__remote {
    ferry__remote_opts o;
    void *sock; /* where workers say HELLO: the bind endpoint */
    void *data; /* where admitted workers go on */
    void *zap;  /* the ZAP handler's socket */
    ferry__allow allow;
    char bound[FERRY__ENDPOINT_MAX];
    uint32_t data_port;
    session_token *tokens; /* max_remote of them */
    ferry__guard *guard;   /* bounds the connections to sock and data */
    int item_sock, item_data, item_zap; /* where their poll items went, -1: none */
};

/* sock asks the ZAP handler about every handshake, and fails it should
 * the handler be missing. */
static int set_zap_domain(void *sock)
{
    int rc = ferry__sockopt(sock, ZMQ_ZAP_DOMAIN, FERRY__ZAP_DOMAIN, strlen(FERRY__ZAP_DOMAIN),
                            "ZMQ_ZAP_DOMAIN");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_ZAP_ENFORCE_DOMAIN, 1, "ZMQ_ZAP_ENFORCE_DOMAIN");
    return rc;
}

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
        rc = set_zap_domain(rm->sock);
    return rc;
}

/* ZeroMQ's own heartbeats on sock, so a dead TCP connection is closed. */
static int set_heartbeats(const ferry__remote *rm, void *sock)
{
    int64_t dead = rm->o.heartbeat_ms * rm->o.liveness;
    int rc =
        ferry__sockopt_int(sock, ZMQ_HEARTBEAT_IVL, (int)rm->o.heartbeat_ms, "ZMQ_HEARTBEAT_IVL");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_HEARTBEAT_TIMEOUT,
                                dead > INT32_MAX ? INT32_MAX : (int)dead, "ZMQ_HEARTBEAT_TIMEOUT");
    return rc;
}

/* The data socket's endpoint: the bind endpoint's host with data_port
 * (or `*`, any free port). FERRY_EOPTION when bind has no port to
 * replace. */
static int data_endpoint(const ferry__remote *rm, char *out, size_t cap)
{
    const char *colon = strrchr(rm->o.bind, ':');
    if (!colon || colon < rm->o.bind + 6)
        return ferry__seterr(FERRY_EOPTION, "bind '%s' names no port", rm->o.bind);
    char port[8] = "*";
    if (rm->o.data_port)
        snprintf(port, sizeof port, "%lld", (long long)rm->o.data_port);
    snprintf(out, cap, "%.*s:%s", (int)(colon - rm->o.bind), rm->o.bind, port);
    return FERRY_OK;
}

/* The data socket: max_message frames, but only for connections that
 * bring a live session token (PLAIN, checked by the ZAP handler). The port
 * it got goes into every CONFIG. */
/* How many messages may wait in each direction on one connection of a
 * socket that anyone on the network can reach. ferry's local sockets are
 * unbounded (credits bound them), but here a peer that sends HELLO after
 * HELLO and never reads would make the loader queue a reply to each, without
 * end. A session carries at most credits (<= FERRY__MAX_CREDITS) tasks and
 * their answers plus heartbeats, far below SESSION_HWM; a HELLO socket of
 * its own (plain TCP) carries one HELLO and its answer per session. Past
 * the mark, a reply is dropped (the scheduler sends without waiting) and
 * the peer's further messages wait in its own kernel buffers. */
#define SESSION_HWM 1024
#define HELLO_HWM 16
static int bound_queues(void *sock, int hwm)
{
    int rc = ferry__sockopt_int(sock, ZMQ_SNDHWM, hwm, "ZMQ_SNDHWM");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_RCVHWM, hwm, "ZMQ_RCVHWM");
    return rc;
}

static int setup_data(ferry__remote *rm, void *zctx)
{
    char ep[FERRY__ENDPOINT_MAX + 8], got[FERRY__ENDPOINT_MAX];
    rm->tokens = ferry__calloc((size_t)rm->o.max_remote, sizeof *rm->tokens);
    if (!rm->tokens)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for session tokens");
    int rc = data_endpoint(rm, ep, sizeof ep);
    if (rc == FERRY_OK)
        rc = ferry__socket_new(zctx, ZMQ_ROUTER, rm->o.max_message, &rm->data);
    if (rc == FERRY_OK)
        rc = bound_queues(rm->data, SESSION_HWM);
    if (rc == FERRY_OK)
        rc = set_heartbeats(rm, rm->data);
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(rm->data, ZMQ_PLAIN_SERVER, 1, "ZMQ_PLAIN_SERVER");
    if (rc == FERRY_OK)
        rc = set_zap_domain(rm->data);
    if (rc == FERRY_OK)
        rc = ferry__guard_prepare(rm->guard, rm->data);
    if (rc == FERRY_OK)
        rc = ferry__socket_bind(rm->data, ep, FERRY_EOPTION);
    if (rc == FERRY_OK)
        rc = ferry__guard_watch(rm->guard, rm->data);
    if (rc != FERRY_OK)
        return rc;
    size_t len = sizeof got;
    const char *colon;
    long port = 0;
    if (zmq_getsockopt(rm->data, ZMQ_LAST_ENDPOINT, got, &len) == 0 &&
        (colon = strrchr(got, ':')) != NULL)
        port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return ferry__seterr(FERRY_ESYS, "the data socket bound at %s has no port", ep);
    rm->data_port = (uint32_t)port;
    return FERRY_OK;
}

/* The connection guard (guard.h). Its cap: room for every remote slot's
 * connections (two each: HELLO and data) and GUARD_SPARE more still shaking
 * hands, within half of what the open-file limit (raised to the hard one)
 * leaves after the fds open now, the reserve asked for, and the listen
 * backlogs: the other half is for what libzmq accepts before the guard's
 * thread reacts (measured: up to ~230 connections on a busy 2-core
 * machine flooded with 1,000 at once). A connection that says nothing is
 * closed after heartbeat_ms x liveness, and never before
 * GUARD_HANDSHAKE_MIN_MS (a CURVE handshake takes a few round trips). */
#define GUARD_SPARE 256
#define GUARD_BACKLOG 32
#define GUARD_CAP_MIN 8
#define GUARD_HANDSHAKE_MIN_MS 2000
static int setup_guard(ferry__remote *rm, void *zctx)
{
    const ferry__remote_opts *o = &rm->o;
    unsigned long long limit = ferry__fd_raise_limit(&o->log);
    long long used = ferry__fd_count();
    long long per = 2;
    long long want = per * o->max_remote + GUARD_SPARE, cap = want;
    char why[160];
    snprintf(why, sizeof why, "%lld per remote slot (max_remote %lld) and %d more", per,
             (long long)o->max_remote, GUARD_SPARE);
    if (limit && limit != ULLONG_MAX && used >= 0) {
        long long room = ((long long)(limit > LLONG_MAX / 2 ? LLONG_MAX / 2 : limit) - used -
                          o->fd_reserve - 2 * GUARD_BACKLOG) /
                         2;
        if (room < cap) {
            cap = room < GUARD_CAP_MIN ? GUARD_CAP_MIN : room;
            snprintf(why, sizeof why,
                     "half what the open-file limit of %llu leaves beside %lld fds open and %lld "
                     "kept for workers",
                     limit, used, (long long)o->fd_reserve);
        }
        if (cap < per * o->max_remote + GUARD_CAP_MIN)
            ferry__logf(&o->log, FERRY_LOG_WARN,
                        "the open-file limit (RLIMIT_NOFILE %llu, %lld in use) leaves room for "
                        "%lld remote connections where max_remote %lld needs %lld: raise it "
                        "(ulimit -n) or lower max_remote",
                        limit, used, cap, (long long)o->max_remote, per * o->max_remote);
    }
    int64_t dead = o->heartbeat_ms * o->liveness;
    ferry__guard_opts go = {
        .cap = (uint32_t)(cap > UINT32_MAX ? UINT32_MAX : cap),
        .handshake_ms = dead < GUARD_HANDSHAKE_MIN_MS ? GUARD_HANDSHAKE_MIN_MS
                        : dead > INT32_MAX            ? INT32_MAX
                                                      : (int)dead,
        .backlog = GUARD_BACKLOG,
        .why_cap = why,
        .closed = o->closed,
        .closed_arg = o->closed_arg,
        .log = o->log,
    };
    return ferry__guard_new(&rm->guard, zctx, &go);
}

/* The HELLO socket, with CURVE or (asked for) plain TCP, bound, and the
 * data socket. Anyone can reach the HELLO socket, so it takes no frame
 * larger than a header: a peer that has not been admitted cannot make the
 * loader hold more. */
static int setup_socket(ferry__remote *rm, void *zctx)
{
    const ferry__remote_opts *o = &rm->o;
    int rc = setup_guard(rm, zctx);
    if (rc == FERRY_OK)
        rc = ferry__socket_new(zctx, ZMQ_ROUTER, FERRY__HDR_MAX, &rm->sock);
    if (rc == FERRY_OK)
        rc = bound_queues(rm->sock, HELLO_HWM);
    if (rc == FERRY_OK)
        rc = set_heartbeats(rm, rm->sock);
    if (rc == FERRY_OK && !o->insecure)
        rc = setup_curve(rm, zctx);
    if (rc == FERRY_OK && o->insecure)
        rc = ferry__zap_open(zctx, &rm->zap);
    if (rc == FERRY_OK)
        rc = ferry__guard_prepare(rm->guard, rm->sock);
    if (rc == FERRY_OK)
        rc = ferry__socket_bind(rm->sock, o->bind, FERRY_EOPTION);
    if (rc == FERRY_OK)
        rc = ferry__guard_watch(rm->guard, rm->sock);
    if (rc == FERRY_OK)
        rc = setup_data(rm, zctx);
    if (rc == FERRY_OK)
        rc = ferry__guard_start(rm->guard);
    if (rc != FERRY_OK)
        return rc;
    size_t len = sizeof rm->bound;
    if (zmq_getsockopt(rm->sock, ZMQ_LAST_ENDPOINT, rm->bound, &len) != 0)
        snprintf(rm->bound, sizeof rm->bound, "%s", o->bind);
    if (o->insecure)
        ferry__logf(&o->log, FERRY_LOG_WARN,
                    "remote workers on %s (data port %u) are neither authenticated nor encrypted "
                    "(insecure=1): anyone who can reach it can join and read every batch",
                    rm->bound, rm->data_port);
    else
        ferry__logf(&o->log, FERRY_LOG_INFO,
                    "remote workers on %s with CURVE; their sessions go on, sealed, at data port "
                    "%u (both ports must be reachable from the worker hosts)",
                    rm->bound, rm->data_port);
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
    int rc = setup_socket(rm, zctx);
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
    ferry__guard_free(rm->guard); /* before the sockets it monitors */
    if (rm->sock)
        zmq_close(rm->sock);
    if (rm->data)
        zmq_close(rm->data);
    if (rm->zap)
        zmq_close(rm->zap);
    ferry__allow_free(&rm->allow);
    for (int64_t k = 0; rm->tokens && k < rm->o.max_remote; k++)
        ferry__remote_token_revoke(rm, (uint32_t)k);
    free(rm->tokens);
    free(rm);
}

void *ferry__remote_socket(const ferry__remote *rm)
{
    return rm->sock;
}

void *ferry__remote_data_socket(const ferry__remote *rm)
{
    return rm->data;
}

void ferry__remote_connections(const ferry__remote *rm, uint32_t *open, uint32_t *turned_away)
{
    *open = ferry__guard_open_count(rm->guard);
    *turned_away = ferry__guard_closings(rm->guard);
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
    rm->item_data = -1;
    if (rm->data) {
        rm->item_data = n;
        items[n++] = (zmq_pollitem_t){.socket = rm->data, .events = ZMQ_POLLIN};
    }
    rm->item_zap = -1;
    if (rm->zap) {
        rm->item_zap = n;
        items[n++] = (zmq_pollitem_t){.socket = rm->zap, .events = ZMQ_POLLIN};
    }
    return n;
}

int ferry__remote_readable(const ferry__remote *rm, const zmq_pollitem_t *items, void **socks)
{
    int n = 0;
    if (items[rm->item_sock].revents & ZMQ_POLLIN)
        socks[n++] = rm->sock;
    if (rm->item_data >= 0 && (items[rm->item_data].revents & ZMQ_POLLIN))
        socks[n++] = rm->data;
    return n;
}

/* The ZAP handler's question on plain TCP: is this a token given out and
 * not yet used? Compared in full, whatever the first difference. */
static int take_token(void *arg, const char *hex)
{
    ferry__remote *rm = arg;
    for (int64_t k = 0; k < rm->o.max_remote; k++) {
        session_token *t = &rm->tokens[k];
        unsigned char diff = 0;
        for (int i = 0; i < FERRY__TOKEN_HEX; i++)
            diff |= (unsigned char)(t->hex[i] ^ hex[i]);
        if (t->state == TOKEN_ISSUED && diff == 0) {
            t->state = TOKEN_TAKEN;
            return 1;
        }
    }
    return 0;
}

int ferry__remote_token_issue(ferry__remote *rm, uint32_t k, char *hex, char *keys)
{
    ferry__remote_token_revoke(rm, k);
    session_token *t = &rm->tokens[k];
    int rc = ferry__random_hex(t->hex, FERRY__TOKEN_HEX / 2);
    keys[0] = '\0';
    if (rc == FERRY_OK && !rm->o.insecure)
        rc = ferry__random_hex(keys, FERRY__SEAL_KEYS_HEX / 2);
    if (rc == FERRY_OK && !rm->o.insecure)
        rc = ferry__seal_new(&t->seal, keys, FERRY__SEAL_LOADER);
    if (rc != FERRY_OK) {
        explicit_bzero(keys, FERRY__SEAL_KEYS_HEX);
        ferry__remote_token_revoke(rm, k);
        return rc;
    }
    t->state = TOKEN_ISSUED;
    memcpy(hex, t->hex, sizeof t->hex);
    return FERRY_OK;
}

void ferry__remote_token_revoke(ferry__remote *rm, uint32_t k)
{
    session_token *t = &rm->tokens[k];
    ferry__seal_free(t->seal);
    explicit_bzero(t, sizeof *t); /* TOKEN_NONE, no seal */
}

ferry__seal *ferry__remote_seal(const ferry__remote *rm, uint32_t k)
{
    return k < rm->o.max_remote ? rm->tokens[k].seal : NULL;
}

int ferry__remote_token_owner(const ferry__remote *rm, const char *user)
{
    if (strlen(user) != FERRY__TOKEN_HEX)
        return -1;
    for (int64_t k = 0; k < rm->o.max_remote; k++) {
        if (rm->tokens[k].state == TOKEN_TAKEN && strcmp(rm->tokens[k].hex, user) == 0)
            return (int)k;
    }
    return -1;
}

uint32_t ferry__remote_data_port(const ferry__remote *rm)
{
    return rm->data_port;
}

void ferry__remote_serve_zap(ferry__remote *rm, const zmq_pollitem_t *items,
                             void (*refused)(void *arg, const char *why), void *arg)
{
    if (rm->item_zap < 0 || !(items[rm->item_zap].revents & ZMQ_POLLIN))
        return;
    char why[256];
    /* CURVE handshakes reach ZAP only from the HELLO socket and PLAIN ones
     * only from the data socket: libzmq refuses a peer of the other
     * mechanism before asking. */
    ferry__zap_rules rules = {
        .allow = rm->o.insecure ? NULL : &rm->allow, .take_token = take_token, .arg = rm};
    for (int k = 0; k < 16; k++) {
        int r = ferry__zap_serve(rm->zap, &rules, why, sizeof why);
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
    /* A far host's words take its round trip longer to arrive: it gets
     * that much longer before it counts as silent. */
    uint64_t dead_after = hb * (uint64_t)rm->o.liveness + p->rtt_ms;
    if (now - p->heard_ms >= dead_after) {
        snprintf(why, cap,
                 "nothing heard from it for %llu ms (heartbeat_ms %lld x %lld, plus its %u ms "
                 "round trip)",
                 (unsigned long long)(now - p->heard_ms), (long long)hb, (long long)rm->o.liveness,
                 p->rtt_ms);
        return FERRY__LIVE_LOST;
    }
    return now - p->sent_ms >= hb ? FERRY__LIVE_HEARTBEAT : FERRY__LIVE_OK;
}

void ferry__remote_log_refusal(const ferry__remote *rm, uint64_t n, const char *why)
{
    /* A peer refused again and again (a flood of HELLOs) writes a few
     * dozen lines, not one per try. */
    if (ferry__log_nth(n, 10))
        ferry__logf(&rm->o.log, FERRY_LOG_WARN, "refused a remote worker (%llu refused so far): %s",
                    (unsigned long long)n, why);
}
