/*
 * zap.c - the ZAP handler (see zap.h). Request frames: version "1.0",
 * request id, domain, address, routing id, mechanism, then the mechanism's
 * credentials (CURVE: the client's 32-byte public key). Reply frames:
 * version, the same request id, status code, status text, user id,
 * metadata.
 */
#include "zap.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "endpoint.h"
#include "error.h"

#define ZAP_FRAMES 8
#define ZAP_FRAME_MAX 256

int ferry__zap_open(void *ctx, void **out)
{
    void *s = zmq_socket(ctx, ZMQ_REP);
    if (!s)
        return ferry__syserr(FERRY_ESYS, "zmq_socket (ZAP handler)", errno);
    int rc = ferry__sockopt_int(s, ZMQ_LINGER, 0, "ZMQ_LINGER (ZAP handler)");
    if (rc == FERRY_OK)
        rc = ferry__socket_bind(s, "inproc://zeromq.zap.01", FERRY_ESYS);
    if (rc != FERRY_OK) {
        zmq_close(s);
        return rc;
    }
    *out = s;
    return FERRY_OK;
}

static void send_frame(void *s, const void *data, size_t len, int more)
{
    zmq_send(s, data, len, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
}

static int frame_is(const unsigned char *f, size_t len, const char *text)
{
    return len == strlen(text) && memcmp(f, text, len) == 0;
}

int ferry__zap_serve(void *s, const ferry__allow *allow, char *why, size_t cap)
{
    unsigned char f[ZAP_FRAMES][ZAP_FRAME_MAX];
    size_t len[ZAP_FRAMES];
    int nf = 0, more = 1;
    while (more) {
        int n = zmq_recv(s, nf < ZAP_FRAMES ? f[nf] : f[ZAP_FRAMES - 1], ZAP_FRAME_MAX,
                         nf == 0 ? ZMQ_DONTWAIT : 0);
        if (n < 0)
            return -1; /* nothing waiting (a REP only ever holds whole requests) */
        if (nf < ZAP_FRAMES)
            len[nf++] = (size_t)n > ZAP_FRAME_MAX ? ZAP_FRAME_MAX + 1 : (size_t)n;
        int m = 0;
        size_t ml = sizeof m;
        if (zmq_getsockopt(s, ZMQ_RCVMORE, &m, &ml) != 0)
            m = 0;
        more = m;
    }

    int ok = 0;
    char addr[64] = "?", key[41] = "";
    const char *reason = "malformed ZAP request";
    if (nf >= 6 && frame_is(f[0], len[0], "1.0") && len[1] <= ZAP_FRAME_MAX) {
        if (len[3] < sizeof addr) {
            memcpy(addr, f[3], len[3]);
            addr[len[3]] = '\0';
        }
        if (!frame_is(f[2], len[2], FERRY__ZAP_DOMAIN)) {
            reason = "wrong ZAP domain";
        } else if (!frame_is(f[5], len[5], "CURVE") || nf != 7 || len[6] != 32) {
            reason = "not a CURVE handshake";
        } else {
            zmq_z85_encode(key, f[6], 32);
            ok = ferry__allow_has(allow, f[6]);
            reason = "its key is not on the allow-list (curve_allow)";
        }
    }
    /* The request id is echoed even for a malformed request, so the REP
     * socket's state stays right. */
    send_frame(s, "1.0", 3, 1);
    send_frame(s, nf > 1 ? f[1] : (const unsigned char *)"",
               nf > 1 && len[1] <= ZAP_FRAME_MAX ? len[1] : 0, 1);
    send_frame(s, ok ? "200" : "400", 3, 1);
    send_frame(s, ok ? "OK" : reason, strlen(ok ? "OK" : reason), 1);
    send_frame(s, ok ? key : "", ok ? strlen(key) : 0, 1);
    send_frame(s, "", 0, 0);
    if (!ok)
        snprintf(why, cap, "a worker at %s with key %s: %s", addr, key[0] ? key : "(none)", reason);
    return ok;
}
