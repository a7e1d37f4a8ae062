/*
 * remote.h - remote workers: the TCP sockets they connect to, who may
 * connect (CURVE with an allow-list served as ZAP), admission into a free
 * remote slot, and liveness (heartbeats both ways).
 *
 * Position in the data flow: beside the local pool, under the scheduler.
 * Remote workers come in on a ROUTER of their own, so the local ipc or
 * inproc socket never authenticates anyone from the network.
 *
 * Anyone on the network can connect, so what an unadmitted peer may send
 * is bounded apart from what a worker may: the bind endpoint takes only
 * frames up to FERRY__HDR_MAX (enough for HELLO), and an admitted worker
 * is sent, in CONFIG, the port of a second socket (max_message frames) and
 * a one-use session token that the ZAP handler asks of every connection
 * to it (PLAIN mechanism). Everything after CONFIG runs there. Under CURVE
 * the bind endpoint lets nobody off the allow-list say HELLO, CONFIG is
 * encrypted, and it also brings the session's keys: every message on the
 * data connection is sealed with them (seal.h), which costs a third of
 * what libzmq's CURVE does per batch. So a stranger can make the loader
 * hold at most a header per connection, and only max_remote admitted
 * workers can send batches. How many connections may be open at once,
 * admitted or not, is bounded too (guard.h): a flood of them cannot take
 * the fds the local workers need. This module
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
    int64_t data_port;       /* plain TCP: the data socket's port, 0: any free one */
    int64_t max_remote;      /* remote slots: as many session tokens */
    int64_t max_message;
    int64_t heartbeat_ms;
    int64_t liveness;   /* heartbeat intervals of silence before a peer is lost */
    int64_t fd_reserve; /* fds to leave for the local workers and the trainer */
    /* Called from another thread when a connection to the remote sockets
     * closes (guard.h): the scheduler then looks for the worker that left. */
    void (*closed)(void *arg);
    void *closed_arg;
    ferry__log log; /* where its messages go */
} ferry__remote_opts;

/* Makes the sockets and the ZAP handler in zctx and binds them.
 * FERRY_EOPTION for a bad bind or missing keys, key errors as keys.h,
 * FERRY_ESYS/FERRY_ELIMIT from ZeroMQ. *out untouched on failure. */
int ferry__remote_open(ferry__remote **out, void *zctx, const ferry__remote_opts *o);
void ferry__remote_close(ferry__remote *rm);

/* Where workers say HELLO. */
void *ferry__remote_socket(const ferry__remote *rm);

/* Where admitted workers go on after CONFIG. */
void *ferry__remote_data_socket(const ferry__remote *rm);

/* The data socket's port, for CONFIG. */
uint32_t ferry__remote_data_port(const ferry__remote *rm);

/* A fresh session for remote slot k (0..max_remote-1), replacing the
 * slot's last one: its token into hex (FERRY__TOKEN_HEX + 1 bytes) and,
 * under CURVE, its keys into keys (FERRY__SEAL_KEYS_HEX + 1 bytes; "" on
 * plain TCP). FERRY_ESYS when no randomness could be had, FERRY_ENOMEM. */
int ferry__remote_token_issue(ferry__remote *rm, uint32_t k, char *hex, char *keys);

/* Slot k's token and keys are no longer any good (its session ended). */
void ferry__remote_token_revoke(ferry__remote *rm, uint32_t k);

/* Under CURVE, the seal of remote slot k's session (seal.h); NULL on
 * plain TCP or with no session. */
ferry__seal *ferry__remote_seal(const ferry__remote *rm, uint32_t k);

/* The remote slot whose token let in the data connection whose ZAP user
 * id is `user`, or -1. */
int ferry__remote_token_owner(const ferry__remote *rm, const char *user);

/* Connections to the remote sockets open now, and how many times new ones
 * were turned away (guard.h); from any thread. */
void ferry__remote_connections(const ferry__remote *rm, uint32_t *open, uint32_t *turned_away);

/* The endpoint as bound, a `*` port resolved. */
const char *ferry__remote_endpoint(const ferry__remote *rm);

/* Appends poll items (the sockets, and the ZAP handler) to items[];
 * returns how many (at most FERRY__REMOTE_POLL_ITEMS). */
#define FERRY__REMOTE_POLL_ITEMS 3
int ferry__remote_poll_items(ferry__remote *rm, zmq_pollitem_t *items);

/* Answers waiting ZAP requests (after a poll, if its items fired): each
 * refused key is passed to refused() with who and why. */
void ferry__remote_serve_zap(ferry__remote *rm, const zmq_pollitem_t *items,
                             void (*refused)(void *arg, const char *why), void *arg);

/* The remote sockets with messages waiting, after a poll, into socks[]
 * (room for 2); returns how many. */
int ferry__remote_readable(const ferry__remote *rm, const zmq_pollitem_t *items, void **socks);

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
