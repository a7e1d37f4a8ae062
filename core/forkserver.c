/*
 * forkserver.c - requests to a clean parent and its answers (see
 * forkserver.h).
 */
#include "forkserver.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "forkfds.h"

/* The longest request: the arguments of one worker (an endpoint and a few
 * numbers) or of a clean parent (the dataset spec, at most 4 KiB). */
#define REQUEST_MAX 16384

int ferry__fork_socketpair(int *ours, int *theirs)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return ferry__syserr(FERRY_ESYS, "socketpair for a clean parent", errno);
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    *ours = sv[0];
    *theirs = sv[1];
    return FERRY_OK;
}

/* Sends kind, then head (when not NULL) and args, each NUL-terminated. */
static int send_request(int ctl, char kind, const char *head, char *const args[],
                        const int *fds, int nfds)
{
    if (nfds < 1 || nfds > FERRY__FORK_FDS_MAX)
        return ferry__seterr(FERRY_EINVAL, "a fork request carries 1 to %d fds, not %d",
                             FERRY__FORK_FDS_MAX, nfds);
    char *buf = malloc(REQUEST_MAX);
    if (!buf)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a fork request");
    size_t len = 0;
    buf[len++] = kind;
    for (int i = head ? -1 : 0; i < 0 || args[i]; i++) {
        const char *a = i < 0 ? head : args[i];
        size_t n = strlen(a) + 1;
        if (len + n > REQUEST_MAX) {
            free(buf);
            return ferry__seterr(FERRY_EINVAL, "a fork request is longer than %d bytes",
                                 REQUEST_MAX);
        }
        memcpy(buf + len, a, n);
        len += n;
    }
    union {
        char raw[CMSG_SPACE(sizeof(int) * FERRY__FORK_FDS_MAX)];
        struct cmsghdr align;
    } ctrl;
    memset(&ctrl, 0, sizeof ctrl);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctrl.raw,
                       .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    ssize_t r;
    do
        r = sendmsg(ctl, &m, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    int e = errno;
    free(buf);
    if (r < 0)
        return ferry__syserr(FERRY_ESYS, "asking the clean parent for a worker", e);
    return FERRY_OK;
}

int ferry__fork_request(int ctl, char *const args[], const int *fds, int nfds)
{
    return send_request(ctl, 'F', NULL, args, fds, nfds);
}

int ferry__fork_read(int ctl, ferry__fork_answer *a)
{
    char buf[sizeof a->text + 1];
    memset(a, 0, sizeof *a);
    ssize_t n;
    do
        n = recv(ctl, buf, sizeof buf - 1, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return FERRY_OK;
    if (n <= 0) {
        a->kind = FERRY__FORK_CLOSED;
        return n < 0 ? ferry__syserr(FERRY_ESYS, "reading the clean parent's answer", errno)
                     : FERRY_OK;
    }
    buf[n] = '\0';
    char *end;
    switch (buf[0]) {
    case 'R':
        a->kind = FERRY__FORK_READY;
        return FERRY_OK;
    case 'P':
    case 'p': {
        long pid = strtol(buf + 1, &end, 10);
        if (buf[0] == 'p' && pid > 0 && *end == ' ')
            a->id = strtoull(end + 1, &end, 10);
        if (pid > 0 && *end == '\0') {
            a->kind = FERRY__FORK_PID;
            a->pid = (pid_t)pid;
            return FERRY_OK;
        }
        break;
    }
    case 'e':
        a->id = strtoull(buf + 1, &end, 10);
        if (*end != ' ')
            break;
        a->kind = FERRY__FORK_ERROR;
        snprintf(a->text, sizeof a->text, "%s", end + 1);
        return FERRY_OK;
    case 'E':
        a->kind = FERRY__FORK_ERROR;
        snprintf(a->text, sizeof a->text, "%s", buf + 1);
        return FERRY_OK;
    default:
        break;
    }
    /* Our own child speaks this protocol; anything else means it is not a
     * clean parent at all (another program given as the worker). */
    a->kind = FERRY__FORK_ERROR;
    snprintf(a->text, sizeof a->text, "the clean parent answered something unreadable");
    return FERRY_OK;
}

static pthread_mutex_t ask_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ask_once = PTHREAD_ONCE_INIT;
/* The last ask's id (under ask_lock). */
static unsigned long long ask_id;
/* The template that did not answer in time, by its socket's inode (each
 * loader has a template of its own, and a later one's socket may get the
 * fd number): stuck, most likely, and not asked again, so that each later
 * ask does not wait start_timeout_ms too. */
static ino_t ask_stuck;

/* The inode of socket fd (0 when fstat fails). */
static ino_t socket_inode(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* A trainer's fork (a loader's next template) taken while another loader
 * waits for its template's answer would hold ask_lock for ever. */
static void ask_lock_forks(void)
{
    ferry__forkfds_unlock_in_child(&ask_lock);
}

/* The clean parent a template forked for an ask nobody waits for any more
 * (one that timed out, or one a dying template answered and left on the
 * socket for the other): killed and reaped. It is this process's child
 * (CLONE_PARENT; or the template itself), so its pid is not anyone
 * else's until reaped here; pidfd_open fails when the trainer reaped it. */
static void reap_stale(pid_t pid)
{
    int fd = pidfd_open(pid, 0);
    if (fd < 0)
        return;
    siginfo_t si;
    if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG | WNOWAIT) == 0) {
        pidfd_send_signal(fd, SIGKILL, NULL, 0);
        while (waitid(P_PIDFD, (id_t)fd, &si, WEXITED) < 0 && errno == EINTR)
            ;
    }
    close(fd);  /* (ECHILD: not this process's child; left alone) */
}

int ferry__fork_ask(int ctl, char *const args[], const int *fds, int nfds, int timeout_ms,
                    pid_t *pid)
{
    pthread_once(&ask_once, ask_lock_forks);
    pthread_mutex_lock(&ask_lock);
    int rc;
    ino_t ino = socket_inode(ctl);
    if (ino != 0 && ino == ask_stuck) {
        rc = ferry__seterr(FERRY_ESPAWN, "the clean parent's template did not answer in time "
                                         "before; it is not asked again");
        goto out;
    }
    unsigned long long id = ++ask_id;
    char head[24];
    snprintf(head, sizeof head, "%llu", id);
    rc = send_request(ctl, 'A', head, args, fds, nfds);
    if (rc != FERRY_OK)
        goto out;
    uint64_t deadline = ferry__now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        ferry__fork_answer a;
        rc = ferry__fork_read(ctl, &a);
        if (a.kind == FERRY__FORK_PID && a.id != id) {
            if (a.id != 0)
                reap_stale(a.pid);
            continue;
        }
        if (a.kind == FERRY__FORK_PID) {
            *pid = a.pid;
            rc = FERRY_OK;
            goto out;
        }
        /* Another ask's error, or "R" (said only by a loader's own
         * parent): skipped. */
        if ((a.kind == FERRY__FORK_ERROR && a.id != id) || a.kind == FERRY__FORK_READY)
            continue;
        if (a.kind == FERRY__FORK_ERROR) {
            rc = ferry__seterr(FERRY_ESPAWN, "the clean parent's template: %s", a.text);
            goto out;
        }
        if (a.kind == FERRY__FORK_CLOSED) {
            rc = ferry__seterr(FERRY_ESPAWN, "the clean parent's template is gone");
            goto out;
        }
        uint64_t now = ferry__now_ms();
        if (now >= deadline) {
            ask_stuck = ino;
            rc = ferry__seterr(FERRY_ESPAWN,
                               "the clean parent's template did not answer within %d ms",
                               timeout_ms);
            goto out;
        }
        struct pollfd p = {.fd = ctl, .events = POLLIN};
        poll(&p, 1, (int)(deadline - now));
    }
out:
    pthread_mutex_unlock(&ask_lock);
    return rc;
}
