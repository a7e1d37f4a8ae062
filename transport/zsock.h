/*
 * zsock.h - ZeroMQ framing of protocol messages, shared by the loader's
 * ROUTER socket and the worker's DEALER socket.
 *
 * A message on the wire: [routing id, on the ROUTER side only] [header]
 * [payload, for TASK and BATCH]. Sending encodes the header into a stack
 * buffer (no allocation) and moves the payload message; receiving always
 * drains every frame of a message, even a malformed one, so one bad message
 * never desynchronises the stream of frames that follows.
 *
 * Thread safety: as ZeroMQ sockets: one thread at a time per socket.
 */
#ifndef FERRY_ZSOCK_H
#define FERRY_ZSOCK_H

#include <stddef.h>
#include <zmq.h>

#include "protocol.h"
#include "seal.h"

#define FERRY__IDENT_MAX 255
#define FERRY__USER_MAX 72 /* a ZAP user id: a Z85 key (40) or a session token (64) */

/* Who sent a message on a ROUTER: its routing id, and the user id the ZAP
 * handler gave its connection ("" when none did). */
typedef struct ferry__ident {
    unsigned char id[FERRY__IDENT_MAX];
    size_t len;
    char user[FERRY__USER_MAX + 1];
} ferry__ident;

/* Sends m (and *payload if m's type has one; the payload message is moved
 * out on success and left intact on failure). ident: the ROUTER routing id,
 * NULL on a DEALER. flags: ZMQ_DONTWAIT or 0. Returns FERRY_OK, FERRY_EINVAL
 * (m invalid), or FERRY_ESYS with errno from ZeroMQ (EHOSTUNREACH for a peer
 * that went away on a ROUTER_MANDATORY socket, EAGAIN). seal: the
 * session's seal when the connection is sealed (seal.h; the payload is then
 * encrypted in place, so on failure it is no longer the caller's plain
 * bytes), else NULL. */
int ferry__zsock_send(void *sock, const ferry__ident *ident, ferry__seal *seal, const ferry__msg *m,
                      zmq_msg_t *payload, int flags);

/* How received messages are opened on a socket whose connections are
 * sealed: `seal` opens every message (a worker's DEALER), or, when NULL,
 * seal_of(arg, sender) gives the seal of the sender's session (a loader's
 * ROUTER), NULL when it has none (the session has ended). */
typedef struct ferry__zsock_opener {
    ferry__seal *seal;
    ferry__seal *(*seal_of)(void *arg, const ferry__ident *sender);
    void *arg;
} ferry__zsock_opener;

/* Receives one whole message. ident: filled on a ROUTER, NULL on a DEALER.
 * *payload is initialised (empty if the message has none) only on FERRY_OK
 * and is then the caller's to close. Returns FERRY_OK; FERRY_EPROTO for a
 * malformed message (wrong frame count, bad header, payload not matching the
 * header; all frames consumed, ident still filled when there was one);
 * FERRY_EAGAIN, with no error text set, when ZMQ_DONTWAIT found nothing
 * waiting; FERRY_ESYS with errno otherwise. open: NULL on a socket whose
 * messages come unsealed; else every message must open (seal.h), or it is
 * FERRY_EPROTO, and one from a sender with no seal is dropped whole
 * (FERRY_ECLOSED, ident filled). */
int ferry__zsock_recv(void *sock, ferry__ident *ident, const ferry__zsock_opener *open,
                      ferry__msg *m, zmq_msg_t *payload, int flags);

/* A received payload frame kept alive past the receive, to back a batch's
 * views (batch.h): *payload is moved into a small holder, and released with
 * ferry__zsock_payload_release (which matches ferry__batch_backing's
 * release). *data is where its bytes are now: take views from it, not from
 * the frame before the move, since ZeroMQ keeps a very small message's
 * bytes inside the zmq_msg_t itself, and they move with it. FERRY_ENOMEM
 * with *payload left as it was. */
int ferry__zsock_payload_keep(zmq_msg_t *payload, void **holder, const void **data);
void ferry__zsock_payload_release(void *holder);

#endif
