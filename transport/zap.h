/*
 * zap.h - the loader's ZAP handler: who may connect over CURVE, and who
 * may open a plain TCP data connection.
 *
 * libzmq asks a ZAP handler (a REP socket bound to inproc://zeromq.zap.01 in
 * the same context, RFC 27) about every handshake on a socket with a ZAP
 * domain. ferry's loader owns its context, binds the handler before the
 * TCP endpoints, and serves it from its scheduler thread: under CURVE a
 * worker's key is checked against the allow-list; on plain TCP's data
 * socket (PLAIN mechanism) the password must be a live session token,
 * which it uses up. The answer is 200 or 400, and the user id of a
 * connection let in (the key, or the token) comes with each of its
 * messages. The sockets also set ZMQ_ZAP_ENFORCE_DOMAIN, so were the
 * handler ever missing the handshake would fail instead of letting
 * everyone in.
 */
#ifndef FERRY_ZAP_H
#define FERRY_ZAP_H

#include <stddef.h>

#include "keys.h"

#define FERRY__ZAP_DOMAIN "ferry"

/* Creates and binds the handler socket in ctx. FERRY_ESYS (with detail) if
 * another handler is already bound there. */
int ferry__zap_open(void *ctx, void **sock);

/* What the handler lets in. */
typedef struct ferry__zap_rules {
    const ferry__allow *allow; /* CURVE: these keys; NULL: no CURVE handshake passes */
    /* PLAIN: 1 when `token` (the password) is live, which it then never is
     * again; NULL: no PLAIN handshake passes. */
    int (*take_token)(void *arg, const char *token);
    void *arg;
} ferry__zap_rules;

/* Answers one waiting request (non-blocking; does nothing when none is
 * waiting). Returns 1 when it let a worker in, 0 when it refused one (with
 * *why saying who and why: peer address, and key or user name), -1 when
 * there was nothing to answer. */
int ferry__zap_serve(void *sock, const ferry__zap_rules *rules, char *why, size_t cap);

#endif
