/*
 * zsock.c - protocol messages on ZeroMQ sockets (see zsock.h).
 */
#include "zsock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"

int ferry__zsock_send(void *sock, const ferry__ident *ident, ferry__seal *seal, const ferry__msg *m,
                      zmq_msg_t *payload, int flags)
{
    unsigned char hdr[FERRY__HDR_MAX + FERRY__SEAL_TRAILER];
    size_t len;
    int rc = ferry__msg_encode(m, hdr, FERRY__HDR_MAX, &len);
    if (rc != FERRY_OK)
        return rc;
    int more = ferry__msg_has_payload(m->type) ? ZMQ_SNDMORE : 0;
    if (seal) {
        rc = ferry__seal_message(seal, hdr, &len, sizeof hdr, more != 0,
                                 more ? zmq_msg_data(payload) : NULL, more ? zmq_msg_size(payload) : 0);
        if (rc != FERRY_OK)
            return rc;
    }

    /* Routing id and header are copied by zmq_send; if a later frame fails,
     * ZeroMQ discards the partial message, so nothing half-sent remains. */
    if (ident && zmq_send(sock, ident->id, ident->len, flags | ZMQ_SNDMORE) < 0)
        goto fail;
    if (zmq_send(sock, hdr, len, flags | more) < 0)
        goto fail;
    if (more && zmq_msg_send(payload, sock, flags) < 0)
        goto fail;
    return FERRY_OK;
fail:;
    int e = errno;
    rc = ferry__seterr(FERRY_ESYS, "sending %s: %s", ferry__msg_name(m->type), zmq_strerror(e));
    errno = e;
    return rc;
}

static int has_more(void *sock)
{
    int more = 0;
    size_t sz = sizeof more;
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
    return more;
}

/* Reads and drops the rest of a message. */
static void drain(void *sock)
{
    while (has_more(sock)) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        zmq_msg_recv(&f, sock, 0);
        zmq_msg_close(&f);
    }
}

/* Receives one frame into a fresh *f; on failure *f is closed and errno kept. */
static int recv_frame(void *sock, zmq_msg_t *f, int flags)
{
    zmq_msg_init(f);
    if (zmq_msg_recv(f, sock, flags) >= 0)
        return 0;
    int e = errno;
    zmq_msg_close(f);
    errno = e;
    return -1;
}

/* The seal that opens a message from ident, per open (zsock.h). */
static ferry__seal *seal_for(const ferry__zsock_opener *open, const ferry__ident *ident)
{
    return open->seal ? open->seal : open->seal_of(open->arg, ident);
}

int ferry__zsock_recv(void *sock, ferry__ident *ident, const ferry__zsock_opener *open,
                      ferry__msg *m, zmq_msg_t *payload, int flags)
{
    zmq_msg_t f;
    int rc;
    ferry__seal *seal = NULL;
    ferry__seal_opened opened;

    if (recv_frame(sock, &f, flags) != 0) {
        /* Nothing queued is the common answer of a drain: no text for it. */
        if (errno == EAGAIN)
            return FERRY_EAGAIN;
        return ferry__seterr(FERRY_ESYS, "receiving: %s", zmq_strerror(errno));
    }
    if (ident) {
        ident->len = zmq_msg_size(&f) < FERRY__IDENT_MAX ? zmq_msg_size(&f) : FERRY__IDENT_MAX;
        memcpy(ident->id, zmq_msg_data(&f), ident->len);
        zmq_msg_close(&f);
        /* Once the first frame is in, the rest of the message is too. */
        flags = 0;
        if (!has_more(sock))
            return ferry__seterr(FERRY_EPROTO, "message has no header frame");
        if (recv_frame(sock, &f, flags) != 0)
            return ferry__seterr(FERRY_ESYS, "receiving: %s", zmq_strerror(errno));

        /* Set by libzmq on every frame that came off an authenticated
         * connection (the routing id frame is the ROUTER's own). */
        const char *user = zmq_msg_gets(&f, "User-Id");
        /* Copied, not formatted: this runs for every message received. */
        size_t n = user ? strnlen(user, sizeof ident->user - 1) : 0;
        memcpy(ident->user, user ? user : "", n);
        ident->user[n] = '\0';
    }
    size_t hlen = zmq_msg_size(&f);
    if (open) {
        seal = seal_for(open, ident);
        if (!seal) {
            zmq_msg_close(&f);
            drain(sock);
            return ferry__seterr(FERRY_ECLOSED, "a message from a session that has ended");
        }
    }
    size_t hmax = FERRY__HDR_MAX + (seal ? FERRY__SEAL_TRAILER : 0);
    if (hlen > hmax) {
        zmq_msg_close(&f);
        drain(sock);
        return ferry__seterr(FERRY_EPROTO, "header frame of %zu bytes exceeds %zu", hlen, hmax);
    }
    rc = seal ? ferry__seal_open_header(seal, zmq_msg_data(&f), &hlen, has_more(sock), &opened)
              : FERRY_OK;
    if (rc == FERRY_OK)
        rc = ferry__msg_decode(zmq_msg_data(&f), hlen, m);
    zmq_msg_close(&f);
    if (rc != FERRY_OK) {
        drain(sock);
        return rc;
    }

    int want = ferry__msg_has_payload(m->type);
    zmq_msg_init(payload);
    if (want) {
        if (!has_more(sock) || zmq_msg_recv(payload, sock, 0) < 0) {
            zmq_msg_close(payload);
            return ferry__seterr(FERRY_EPROTO, "%s without its payload frame",
                                 ferry__msg_name(m->type));
        }
        rc = seal ? ferry__seal_open_payload(seal, &opened, zmq_msg_data(payload),
                                             zmq_msg_size(payload))
                  : FERRY_OK;
        if (rc == FERRY_OK)
            rc = ferry__msg_check_payload(m, zmq_msg_size(payload));
        if (rc != FERRY_OK) {
            zmq_msg_close(payload);
            drain(sock);
            return rc;
        }
    }
    if (has_more(sock)) {
        zmq_msg_close(payload);
        drain(sock);
        return ferry__seterr(FERRY_EPROTO, "%s has more frames than it should",
                             ferry__msg_name(m->type));
    }
    return FERRY_OK;
}

int ferry__zsock_payload_keep(zmq_msg_t *payload, void **holder, const void **data)
{
    zmq_msg_t *m = ferry__malloc(sizeof *m);
    if (!m)
        return FERRY_ENOMEM;
    zmq_msg_init(m);
    zmq_msg_move(m, payload);
    *holder = m;
    *data = zmq_msg_data(m);
    return FERRY_OK;
}

void ferry__zsock_payload_release(void *holder)
{
    zmq_msg_t *m = holder;
    zmq_msg_close(m);
    free(m);
}
