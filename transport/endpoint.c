/*
 * endpoint.c - local endpoints, checked socket options, binding (see
 * endpoint.h).
 */
#include "endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "error.h"

/* Unix socket paths are at most 107 bytes; leave room for "/loader". */
#define IPC_DIR_LIMIT 90

int ferry__endpoint_local(int threads, const void *tag, char *dir, size_t dircap, char *endpoint,
                          size_t cap)
{
    dir[0] = '\0';
    if (threads) {
        snprintf(endpoint, cap, "inproc://ferry-%p", tag);
        return FERRY_OK;
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    int n = snprintf(dir, dircap, "%s/ferry-XXXXXX", tmp);
    if (n < 0 || (size_t)n >= dircap || n > IPC_DIR_LIMIT) {
        dir[0] = '\0';
        return ferry__seterr(FERRY_EINVAL, "TMPDIR '%s' is too long for a socket path", tmp);
    }
    if (!mkdtemp(dir)) {
        int e = errno;
        dir[0] = '\0';
        return ferry__seterr(FERRY_ESYS, "could not create a private directory in %s: %s", tmp,
                             strerror(e));
    }
    snprintf(endpoint, cap, "ipc://%s/loader", dir);
    return FERRY_OK;
}

void ferry__endpoint_remove(const char *dir)
{
    if (!dir[0])
        return;
    char path[FERRY__IPC_DIR_MAX + 16];
    snprintf(path, sizeof path, "%s/loader", dir);
    unlink(path);
    rmdir(dir);
}

int ferry__sockopt(void *sock, int opt, const void *val, size_t len, const char *name)
{
    if (zmq_setsockopt(sock, opt, val, len) != 0)
        return ferry__seterr(FERRY_ESYS, "setting %s: %s", name, zmq_strerror(errno));
    return FERRY_OK;
}

int ferry__sockopt_int(void *sock, int opt, int val, const char *name)
{
    return ferry__sockopt(sock, opt, &val, sizeof val, name);
}

int ferry__socket_setup(void *sock, int64_t max_message)
{
    int rc = ferry__sockopt_int(sock, ZMQ_LINGER, 0, "ZMQ_LINGER");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM");
    if (rc == FERRY_OK)
        rc = ferry__sockopt(sock, ZMQ_MAXMSGSIZE, &max_message, sizeof max_message,
                            "ZMQ_MAXMSGSIZE");
    return rc;
}

int ferry__socket_new(void *ctx, int type, int64_t max_message, void **out)
{
    void *s = zmq_socket(ctx, type);
    if (!s)
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    int rc = ferry__socket_setup(s, max_message);
    if (rc == FERRY_OK && type == ZMQ_ROUTER)
        rc = ferry__sockopt_int(s, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY");
    if (rc != FERRY_OK) {
        zmq_close(s);
        return rc;
    }
    *out = s;
    return FERRY_OK;
}

int ferry__socket_bind(void *sock, const char *endpoint, int code)
{
    if (zmq_bind(sock, endpoint) == 0)
        return FERRY_OK;
    int e = errno;
    if (e == EMFILE || e == ENFILE)
        return ferry__syserr(code, "binding a socket", e);
    return ferry__seterr(code, "binding %s: %s", endpoint, zmq_strerror(e));
}
