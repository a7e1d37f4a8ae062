/*
 * remote.h - remote workers: the TCP socket they connect to, who may
 * connect (CURVE with an allow-list served as ZAP), admission into a free
 * remote slot, and liveness (heartbeats both ways).
 *
 * Position in the data flow: beside the local pool, under the scheduler.
 * Remote workers come in on a ROUTER of their own, so the local ipc or
 * inproc socket never authenticates anyone from the network. This module
 * decides what the rules say (admit or refuse, heartbeat due or peer lost);
 * the scheduler carries out what follows for the window. It never touches
 * the window or the loader.
 *
 * Thread safety: the scheduler thread only.
 */
#ifndef FERRY_CORE_REMOTE_H
#define FERRY_CORE_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "log.h"
#include "peer.h"
#include "protocol.h"

typedef struct ferry__remote ferry__remote;

typedef struct ferry__remote_opts {
    const char *bind;        /* tcp://HOST:PORT */
    const char *curve_key;   /* the loader's key pair file */
    const char *curve_allow; /* allowed worker keys: file or directory */
    int insecure;            /* plain TCP, asked for */
    int64_t max_message;
    int64_t heartbeat_ms;
    int64_t liveness; /* heartbeat intervals of silence before a peer is lost */
    ferry__log log;   /* where its messages go */
} ferry__remote_opts;

/* Makes the socket (and the ZAP handler, with CURVE) in zctx and binds it.
 * FERRY_EOPTION for a bad bind or missing keys, key errors as keys.h,
 * FERRY_ESYS/FERRY_ELIMIT from ZeroMQ. *out untouched on failure. */
int ferry__remote_open(ferry__remote **out, void *zctx, const ferry__remote_opts *o);
void ferry__remote_close(ferry__remote *rm);

void *ferry__remote_socket(const ferry__remote *rm);

/* The endpoint as bound, a `*` port resolved. */
const char *ferry__remote_endpoint(const ferry__remote *rm);

/* Appends poll items (the socket, and the ZAP handler) to items[]; returns
 * how many (at most 2). */
int ferry__remote_poll_items(ferry__remote *rm, zmq_pollitem_t *items);

/* Answers waiting ZAP requests (after a poll, if its items fired): each
 * refused key is passed to refused() with who and why. */
void ferry__remote_serve_zap(ferry__remote *rm, const zmq_pollitem_t *items,
                             void (*refused)(void *arg, const char *why), void *arg);

/* Whether the remote socket has messages waiting, after a poll. */
int ferry__remote_readable(const ferry__remote *rm, const zmq_pollitem_t *items);

/* Whether a HELLO on the remote socket may be admitted: this protocol
 * version, and no claim on a local slot. 0 with *why set otherwise (for
 * another version, starting with FERRY__VERSION_MISMATCH's sentence). */
int ferry__remote_hello_ok(const ferry__hello *h, char *why, size_t cap);

typedef enum ferry__liveness {
    FERRY__LIVE_OK = 0,
    FERRY__LIVE_HEARTBEAT, /* send it a HEARTBEAT now */
    FERRY__LIVE_LOST,      /* silent past heartbeat_ms x liveness; *why says so */
} ferry__liveness;

/* What remote peer p needs at `now`. */
ferry__liveness ferry__remote_liveness(const ferry__remote *rm, const ferry__peer *p, uint64_t now,
                                       char *why, size_t cap);

/* Logs a refusal: the first ten, then every hundredth (a misconfigured
 * host retries forever). n: refusals so far, this one included. */
void ferry__remote_log_refusal(const ferry__remote *rm, uint64_t n, const char *why);

#endif
