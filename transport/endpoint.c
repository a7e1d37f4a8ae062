/*
 * endpoint.c - local endpoints, checked socket options, binding (see
 * endpoint.h).
 */
#include "endpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <zmq.h>

#include "error.h"

/* Unix socket paths are at most 107 bytes; leave room for "/loader". */
#define IPC_DIR_LIMIT 90
/* Entries of $TMPDIR a loader reads looking for dead loaders' directories:
 * a crowded /tmp costs each open a bounded few milliseconds at most. */
#define SWEEP_MAX_ENTRIES 4096

/* ------------------------------------------------------------------------
 * Directories of dead loaders
 *
 * A trainer killed with SIGKILL cannot remove its directory, so each one is
 * named ferry-<pid>-XXXXXX after the process that made it, and every loader
 * that makes one removes those of makers that are gone. What it removes is
 * only ever a socket file named "loader" and then the directory, and only
 * when all of this holds, so nothing else is ever touched:
 *  - the name has exactly that form;
 *  - no process has that pid (kill answers ESRCH; EPERM means alive). A
 *    reused pid keeps a dead loader's directory until that process is gone
 *    too: harmless;
 *  - it is a directory itself, not a symlink (O_NOFOLLOW), ours, mode 0700;
 *  - nobody listens on its socket. A loader in another pid namespace that
 *    shares this TMPDIR has a pid that means nothing here; its socket
 *    answers, so it is left alone. (Between its mkdtemp and its bind there
 *    is no socket yet: such a loader could lose its empty directory in that
 *    instant and fail to open, saying so.)
 * An empty directory goes too: its maker died before binding. Everything
 * here is best effort and never fails the open that does it.
 */

/* The pid in a name of the exact form ferry-<pid>-XXXXXX (pid in decimal,
 * no leading zero; six characters of mkdtemp's alphabet), else 0. */
static pid_t dead_dir_pid(const char *name)
{
    if (strncmp(name, "ferry-", 6) != 0)
        return 0;
    const char *p = name + 6;
    long long pid = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if ((pid == 0 && *p == '0') || (pid = pid * 10 + (*p - '0')) > INT_MAX)
            return 0;
    }
    if (pid == 0 || *p++ != '-')
        return 0;
    for (int i = 0; i < 6; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return 0;
    }
    return p[6] == '\0' ? (pid_t)pid : 0;
}

/* 1 if connecting to the socket at tmp/name/loader is refused (nobody
 * listens), else 0: a listener, or anything unexpected. */
static int socket_is_dead(const char *tmp, const char *name)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s/loader", tmp, name);
    if (n < 0 || (size_t)n >= sizeof sa.sun_path)
        return 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int refused = connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno == ECONNREFUSED;
    close(fd);
    return refused;
}

/* Removes entry `name` of `tmp` (open as dfd) if it is a dead loader's
 * directory (see above); leaves it otherwise. */
static void remove_if_dead(int dfd, const char *tmp, const char *name)
{
    pid_t pid = dead_dir_pid(name);
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
        return;
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0)
        return;
    struct stat st;
    int ours = fstat(sub, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 07777) == 0700;
    if (ours && fstatat(sub, "loader", &st, AT_SYMLINK_NOFOLLOW) == 0)
        ours = S_ISSOCK(st.st_mode) && socket_is_dead(tmp, name) && unlinkat(sub, "loader", 0) == 0;
    close(sub);
    if (ours)
        unlinkat(dfd, name, AT_REMOVEDIR); /* fails, harmlessly, if anything else is inside */
}

/* Looks at up to SWEEP_MAX_ENTRIES entries of `tmp` and removes the dead
 * loaders' directories among them. */
static void remove_dead_dirs(const char *tmp)
{
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    for (int seen = 0; seen < SWEEP_MAX_ENTRIES && (e = readdir(d)) != NULL; seen++) {
        if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
            remove_if_dead(dfd, tmp, e->d_name);
    }
    closedir(d);
}

/* ------------------------------------------------------------------------
 * The loader's endpoint
 */

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
    int n = snprintf(dir, dircap, "%s/ferry-%d-XXXXXX", tmp, (int)getpid());
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
    remove_dead_dirs(tmp);
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
