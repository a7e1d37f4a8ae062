/*
 * peer.h - what the loader knows of each worker it talks to, local or
 * remote: where it is on the socket, how far its session has got, and the
 * few facts the scheduler's decisions need.
 *
 * Slots 0..nlocal-1 are the local workers (the pool's indices), the rest
 * are taken by remote workers as they are admitted. The scheduler thread
 * owns every record; remote.c reads and updates the remote ones' liveness
 * on its behalf. A plain record: no functions of its own.
 */
#ifndef FERRY_CORE_PEER_H
#define FERRY_CORE_PEER_H

#include <stdint.h>

#include "zsock.h"

typedef enum ferry__peer_state {
    FERRY__PEER_EMPTY = 0,  /* slot not started or free for a remote worker */
    FERRY__PEER_SPAWNED,    /* process or thread started, no HELLO yet */
    FERRY__PEER_CONFIGURED, /* HELLO answered with CONFIG, waiting for READY */
    FERRY__PEER_READY,      /* taking tasks */
    FERRY__PEER_GONE,       /* said BYE or died */
} ferry__peer_state;

#define FERRY__PEER_HOST_MAX 64

typedef struct ferry__peer {
    uint32_t index;
    int remote;
    void *sock; /* the ROUTER it talks through */
    ferry__peer_state state;
    ferry__ident ident;              /* its routing id; len 0 before HELLO */
    int unreachable;                 /* a send failed: no more tasks until it is replaced */
    int delivered_any;               /* since it was (re)started */
    uint32_t failed_starts;          /* deaths in a row without delivering anything */
    uint64_t heard_ms;               /* remote: when it last said anything */
    uint64_t sent_ms;                /* remote: when it was last sent anything */
    uint32_t rtt_ms;                 /* remote: its round trip, as flow control measured it */
    uint32_t rpid;                   /* remote: its pid on its host, for messages */
    char host[FERRY__PEER_HOST_MAX]; /* remote: its host name, for messages */
} ferry__peer;

#endif
