/*
 * endpoint.h - where sockets live and how they are set up: the loader's
 * private endpoint (an ipc:// socket in a 0700 directory, or inproc:// for
 * thread workers), checked socket options, and binding with an error that
 * says what ran out.
 *
 * Position in the data flow: below the scheduler and the worker loop, beside
 * zsock.c (which frames messages on the sockets made here). Knows nothing of
 * tasks, epochs or workers.
 *
 * Thread safety: plain functions; a socket is used by one thread at a time.
 */
#ifndef FERRY_ENDPOINT_H
#define FERRY_ENDPOINT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define FERRY__IPC_DIR_MAX PATH_MAX
#define FERRY__LOCAL_ENDPOINT_MAX (PATH_MAX + 32)

/* A private local endpoint. For threads: "inproc://ferry-<tag>" and no
 * directory (dir[0] == '\0'). For processes: a fresh directory
 * $TMPDIR/ferry-<our pid>-XXXXXX (0700, so only this user reaches the
 * socket) and "ipc://<dir>/loader"; having made it, removes the directories
 * that loaders killed before they could close left in $TMPDIR (their maker
 * is gone and nobody listens on their socket; best effort, bounded, never a
 * failure). FERRY_EINVAL when $TMPDIR is too long for a socket path,
 * FERRY_ESYS when the directory cannot be made; dir is "" then. */
int ferry__endpoint_local(int threads, const void *tag, char *dir, size_t dircap, char *endpoint,
                          size_t cap);

/* Removes what ferry__endpoint_local made (the socket file and the
 * directory); does nothing for dir "". */
void ferry__endpoint_remove(const char *dir);

/* zmq_setsockopt, checked: FERRY_ESYS naming the option on failure. */
int ferry__sockopt(void *sock, int opt, const void *val, size_t len, const char *name);
int ferry__sockopt_int(void *sock, int opt, int val, const char *name);

/* Options every ferry socket gets: LINGER 0 (close never waits on a dead
 * peer), the largest message accepted, no HWM drops (credits bound the
 * queues instead). FERRY_ESYS naming the option that failed. */
int ferry__socket_setup(void *sock, int64_t max_message);

/* A new socket of `type` in ctx with ferry's standard options (ferry__socket_setup) and
 * ROUTER_MANDATORY for a ROUTER, not yet bound. *out untouched on failure. */
int ferry__socket_new(void *ctx, int type, int64_t max_message, void **out);

/* zmq_bind, with the failure said: FERRY_ELIMIT when file descriptors ran
 * out, else `code` with the endpoint and ZeroMQ's reason. */
int ferry__socket_bind(void *sock, const char *endpoint, int code);

#endif
