/*
 * zap.c - the ZAP handler (see zap.h). Request frames: version "1.0",
 * request id, domain, address, routing id, mechanism, then the mechanism's
 * credentials (CURVE: the client's 32-byte public key; PLAIN: user name and
 * password). Reply frames:
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
#include "protocol.h"

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

/* The verdict on one request's credentials: 1 to let it in, with *user
 * (the connection's user id from then on); 0 with *reason. who: how to
 * name the peer in a refusal. */
static int judge(const ferry__zap_rules *r, unsigned char f[][ZAP_FRAME_MAX], const size_t *len,
                 int nf, char *user, size_t ucap, char *who, size_t wcap, const char **reason)
{
    if (r->allow && frame_is(f[5], len[5], "CURVE") && nf == 7 && len[6] == 32) {
        zmq_z85_encode(user, f[6], 32);
        snprintf(who, wcap, "with key %s", user);
        *reason = "its key is not on the allow-list (curve_allow)";
        return ferry__allow_has(r->allow, f[6]);
    }
    if (r->take_token && frame_is(f[5], len[5], "PLAIN") && nf == 8 &&
        len[7] == FERRY__TOKEN_HEX && len[6] <= ZAP_FRAME_MAX) {
        snprintf(who, wcap, "named '%.*s'", len[6] < 64 ? (int)len[6] : 64, (const char *)f[6]);
        memcpy(user, f[7], len[7]);
        user[len[7]] = '\0';
        *reason = "its session token is not one this loader gave out, or was used already";
        if (strlen(user) == len[7] && r->take_token(r->arg, user))
            return 1;
        user[0] = '\0';
        return 0;
    }
    *reason = r->allow ? "not a CURVE handshake" : "not a PLAIN handshake with a session token";
    return 0;
}

int ferry__zap_serve(void *s, const ferry__zap_rules *rules, char *why, size_t cap)
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
    char addr[64] = "?", user[FERRY__TOKEN_HEX + 1] = "", who[96] = "";
    const char *reason = "malformed ZAP request";
    if (nf >= 6 && frame_is(f[0], len[0], "1.0") && len[1] <= ZAP_FRAME_MAX) {
        if (len[3] < sizeof addr) {
            memcpy(addr, f[3], len[3]);
            addr[len[3]] = '\0';
        }
        if (!frame_is(f[2], len[2], FERRY__ZAP_DOMAIN))
            reason = "wrong ZAP domain";
        else
            ok = judge(rules, f, len, nf, user, sizeof user, who, sizeof who, &reason);
    }
    /* The request id is echoed even for a malformed request, so the REP
     * socket's state stays right. */
    send_frame(s, "1.0", 3, 1);
    send_frame(s, nf > 1 ? f[1] : (const unsigned char *)"",
               nf > 1 && len[1] <= ZAP_FRAME_MAX ? len[1] : 0, 1);
    send_frame(s, ok ? "200" : "400", 3, 1);
    send_frame(s, ok ? "OK" : reason, strlen(ok ? "OK" : reason), 1);
    send_frame(s, ok ? user : "", ok ? strlen(user) : 0, 1);
    send_frame(s, "", 0, 0);
    if (!ok)
        snprintf(why, cap, "a worker at %s %s: %s", addr, who[0] ? who : "with key (none)", reason);
    return ok;
}
