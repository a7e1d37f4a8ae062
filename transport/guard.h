/*
 * guard.h - a bound on the TCP connections that anyone on the network can
 * open to a loader's remote sockets.
 *
 * libzmq accepts every connection its listening socket gets and keeps it
 * until the peer's handshake fails or times out; nothing caps how many. A
 * flood of connections that send nothing (no key needed, CURVE or not)
 * therefore fills the trainer's fd table, and then the next worker cannot
 * be started, and libzmq's I/O thread spins on accept()'s EMFILE. The
 * guard counts each bound socket's connections (a socket monitor:
 * ACCEPTED and DISCONNECTED) and, while they reach `cap`, has the kernel
 * drop new connection requests at the listening socket (a socket filter
 * that drops every SYN; the peer's TCP retries). Connections that never
 * finish their handshake are closed by libzmq after ZMQ_HANDSHAKE_IVL,
 * which the guard sets; once the count is back below three quarters of the
 * cap (recounted from /proc/self/fd, so a lost event cannot keep it
 * closed), new connections are let in again. Each closing and reopening is
 * logged (a few lines per flood, not one per connection).
 *
 * It also says when any watched connection closes (opts.closed), which is
 * how the loader notices a remote worker whose process died within
 * milliseconds.
 *
 * The guard runs on a thread of its own, blocked on the monitors, so that
 * it closes the door within microseconds of the cap, however busy the
 * scheduler is: libzmq accepts tens of connections a millisecond. What
 * gets in past the cap is at most what the kernel had already queued (the
 * listen backlog, which the guard sets) and the few accepted meanwhile.
 *
 * Position in the data flow: under remote.c, which sizes the cap from the
 * fd limit (ferry__fd_raise_limit) and hands the guard its sockets.
 *
 * Linux only (SO_ATTACH_FILTER, /proc). Where the listening socket cannot
 * be found the guard only counts, and says so once.
 *
 * Thread safety: new, prepare, watch, start and free from the thread that
 * owns the watched sockets (before it hands them on, or after); the counts
 * from any thread.
 */
#ifndef FERRY_GUARD_H
#define FERRY_GUARD_H

#include <stdint.h>

#include "log.h"

#define FERRY__GUARD_MAX_SOCKETS 2

typedef struct ferry__guard ferry__guard;

typedef struct ferry__guard_opts {
    uint32_t cap;        /* connections at once, over all its sockets */
    int handshake_ms;    /* ZMQ_HANDSHAKE_IVL for each socket */
    int backlog;         /* ZMQ_BACKLOG for each socket */
    const char *why_cap; /* how the cap was chosen, for the log */
    /* Called on the guard's thread when a watched socket's connection
     * closes (NULL: nothing), so that a peer whose connection closed is
     * noticed at once, not a heartbeat later. */
    void (*closed)(void *arg);
    void *closed_arg;
    ferry__log log;
} ferry__guard_opts;

/* A guard in zctx. FERRY_ENOMEM, FERRY_ESYS. */
int ferry__guard_new(ferry__guard **out, void *zctx, const ferry__guard_opts *o);
/* Stops its thread and its monitors. Before the watched sockets close. */
void ferry__guard_free(ferry__guard *g);

/* Sets sock's handshake deadline and backlog; call before binding it. */
int ferry__guard_prepare(const ferry__guard *g, void *sock);

/* Watches sock, bound (at most FERRY__GUARD_MAX_SOCKETS of them).
 * FERRY_ESYS when its monitor cannot be set up. */
int ferry__guard_watch(ferry__guard *g, void *sock);

/* Starts the thread, once every socket is watched. FERRY_ESYS. */
int ferry__guard_start(ferry__guard *g);

/* Connections open now (as counted), and how many times new ones were
 * turned away. */
uint32_t ferry__guard_open_count(const ferry__guard *g);
uint32_t ferry__guard_closings(const ferry__guard *g);

#endif
