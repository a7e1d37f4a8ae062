/*
 * zap.h - the loader's ZAP handler: who may connect over CURVE.
 *
 * libzmq asks a ZAP handler (a REP socket bound to inproc://zeromq.zap.01 in
 * the same context, RFC 27) about every CURVE handshake on a socket with a
 * ZAP domain. ferry's loader owns its context, binds the handler before the
 * TCP endpoint, and serves it from its scheduler thread: a worker's key is
 * checked against the allow-list and the answer is 200 or 400. The remote
 * socket also sets ZMQ_ZAP_ENFORCE_DOMAIN, so were the handler ever missing
 * the handshake would fail instead of letting everyone in.
 */
#ifndef FERRY_ZAP_H
#define FERRY_ZAP_H

#include <stddef.h>

#include "keys.h"

#define FERRY__ZAP_DOMAIN "ferry"

/* Creates and binds the handler socket in ctx. FERRY_ESYS (with detail) if
 * another handler is already bound there. */
int ferry__zap_open(void *ctx, void **sock);

/* Answers one waiting request (non-blocking; does nothing when none is
 * waiting). Returns 1 when it let a worker in, 0 when it refused one (with
 * *why saying who and why: peer address and key), -1 when there was
 * nothing to answer. */
int ferry__zap_serve(void *sock, const ferry__allow *allow, char *why, size_t cap);

#endif
