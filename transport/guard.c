/*
 * guard.c - the bound on connections to the remote sockets (see guard.h).
 */
#include "guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "alloc.h"
#include "clock.h"
#include "endpoint.h"
#include "error.h"

#define RECOUNT_EVERY_MS 250
#define ENDPOINT_MAX 256

typedef struct watched {
    void *sock;
    void *mon;     /* a PAIR on the socket's monitor: the guard thread's */
    int listen_fd; /* the listening socket libzmq accepts on; -1: not found */
    struct sockaddr_storage addr; /* where it listens */
    atomic_uint open;             /* its connections: accepted, not yet disconnected */
} watched;

struct ferry__guard {
    ferry__guard_opts o;
    char why_cap[160];
    void *zctx;
    watched w[FERRY__GUARD_MAX_SOCKETS];
    int n;
    int stop_fd; /* an eventfd: the thread ends when it is written */
    pthread_t thread;
    int thread_live;
    atomic_int closed;
    atomic_uint closings; /* how many times the door was closed */
    /* --- the guard thread's --- */
    uint64_t recount_ms; /* the last recount while closed */
};

int ferry__guard_new(ferry__guard **out, void *zctx, const ferry__guard_opts *o)
{
    ferry__guard *g = ferry__calloc(1, sizeof *g);
    if (!g)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the connection guard");
    g->o = *o;
    snprintf(g->why_cap, sizeof g->why_cap, "%s", o->why_cap ? o->why_cap : "");
    g->o.why_cap = g->why_cap;
    g->zctx = zctx;
    g->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->stop_fd < 0) {
        int e = errno;
        free(g);
        return ferry__syserr(FERRY_ESYS, "eventfd (the connection guard)", e);
    }
    *out = g;
    return FERRY_OK;
}

void ferry__guard_free(ferry__guard *g)
{
    if (!g)
        return;
    if (g->thread_live) {
        uint64_t one = 1;
        while (write(g->stop_fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
        pthread_join(g->thread, NULL);
    }
    /* The listening fds are libzmq's, and closed with their sockets. */
    for (int i = 0; i < g->n; i++) {
        zmq_socket_monitor(g->w[i].sock, NULL, 0);
        if (g->w[i].mon)
            zmq_close(g->w[i].mon);
    }
    close(g->stop_fd);
    free(g);
}

int ferry__guard_prepare(const ferry__guard *g, void *sock)
{
    int rc = ferry__sockopt_int(sock, ZMQ_HANDSHAKE_IVL, g->o.handshake_ms, "ZMQ_HANDSHAKE_IVL");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_BACKLOG, g->o.backlog, "ZMQ_BACKLOG");
    return rc;
}

/* The address of a bound tcp:// endpoint as libzmq reports it
 * ("tcp://127.0.0.1:5555", "tcp://[::]:5555"). 0, or -1. */
static int endpoint_addr(const char *ep, struct sockaddr_storage *ss)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return -1;
    const char *host = ep + 6, *colon = strrchr(host, ':');
    if (!colon)
        return -1;
    char h[ENDPOINT_MAX];
    size_t len = (size_t)(colon - host);
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        host++;
        len -= 2;
    }
    if (len >= sizeof h)
        return -1;
    memcpy(h, host, len);
    h[len] = '\0';
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return -1;
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, h, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, h, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
    } else {
        return -1;
    }
    return 0;
}

static uint16_t port_of(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                     : ((const struct sockaddr_in *)ss)->sin_port;
}

/* Whether fd is a TCP socket, listening or not as `listening` says, whose
 * own address is `want` (the port alone when match_port_only). */
static int is_tcp_at(int fd, int listening, const struct sockaddr_storage *want,
                     int match_port_only)
{
    int v = 0;
    socklen_t l = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) != 0 || !v != !listening)
        return 0;
    l = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) != 0 || v != IPPROTO_TCP)
        return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 || ss.ss_family != want->ss_family ||
        port_of(&ss) != port_of(want))
        return 0;
    if (match_port_only)
        return 1;
    if (ss.ss_family == AF_INET)
        return ((struct sockaddr_in *)&ss)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)want)->sin_addr.s_addr;
    return memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr,
                  &((const struct sockaddr_in6 *)want)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

/* Calls fn(fd, arg) for each open fd of ours; fn returns nonzero to stop.
 * -1 when the fds cannot be listed (no fd left to list them with, say). */
static int each_fd(int (*fn)(int fd, void *arg), void *arg)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == dirfd(d))
            continue;
        if (fn((int)fd, arg))
            break;
    }
    closedir(d);
    return 0;
}

typedef struct find_arg {
    const struct sockaddr_storage *addr;
    int found, matches;
} find_arg;

static int find_one(int fd, void *arg)
{
    find_arg *a = arg;
    if (is_tcp_at(fd, 1, a->addr, 0)) {
        a->found = fd;
        a->matches++;
    }
    return 0;
}

typedef struct count_arg {
    const struct sockaddr_storage *addr;
    uint32_t n;
} count_arg;

static int count_one(int fd, void *arg)
{
    count_arg *a = arg;
    a->n += (uint32_t)is_tcp_at(fd, 0, a->addr, 1);
    return 0;
}

int ferry__guard_watch(ferry__guard *g, void *sock)
{
    if (g->n >= FERRY__GUARD_MAX_SOCKETS)
        return ferry__seterr(FERRY_EINVAL, "the guard watches %d sockets at most",
                             FERRY__GUARD_MAX_SOCKETS);
    watched *w = &g->w[g->n];
    char ep[ENDPOINT_MAX], mon[64];
    size_t len = sizeof ep;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len) != 0)
        ep[0] = '\0';
    w->listen_fd = -1;
    if (endpoint_addr(ep, &w->addr) == 0) {
        find_arg a = {.addr = &w->addr, .found = -1};
        each_fd(find_one, &a);
        if (a.matches == 1)
            w->listen_fd = a.found;
    }
    if (w->listen_fd < 0)
        ferry__logf(&g->o.log, FERRY_LOG_WARN,
                    "could not find the listening socket of %s: connections to it are counted "
                    "but cannot be turned away",
                    ep);
    snprintf(mon, sizeof mon, "inproc://ferry-guard-%p-%d", (void *)g, g->n);
    if (zmq_socket_monitor(sock, mon,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_ACCEPT_FAILED) != 0)
        return ferry__seterr(FERRY_ESYS, "monitoring %s: %s", ep, zmq_strerror(errno));
    w->sock = sock;
    g->n++; /* from here on, free stops the monitor */
    w->mon = zmq_socket(g->zctx, ZMQ_PAIR);
    if (!w->mon)
        return ferry__seterr(FERRY_ESYS, "a monitor socket: %s", zmq_strerror(errno));
    /* No high-water mark on our end: the monitor sends from libzmq's I/O
     * thread, which must never wait on us. */
    int rc = ferry__sockopt_int(w->mon, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM");
    if (rc == FERRY_OK && zmq_connect(w->mon, mon) != 0)
        rc = ferry__seterr(FERRY_ESYS, "connecting to %s: %s", mon, zmq_strerror(errno));
    return rc;
}

uint32_t ferry__guard_open_count(const ferry__guard *g)
{
    uint32_t n = 0;
    for (int i = 0; i < g->n; i++)
        n += atomic_load(&g->w[i].open);
    return n;
}

uint32_t ferry__guard_closings(const ferry__guard *g)
{
    return atomic_load(&g->closings);
}

/* Every watched listening socket drops new connection requests (one BPF
 * instruction: return 0, keep nothing of the packet), or takes them again. */
static void set_door(ferry__guard *g, int close_it)
{
    struct sock_filter drop = BPF_STMT(BPF_RET | BPF_K, 0);
    struct sock_fprog prog = {.len = 1, .filter = &drop};
    int zero = 0;
    for (int i = 0; i < g->n; i++) {
        int fd = g->w[i].listen_fd;
        if (fd < 0)
            continue;
        int r = close_it ? setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog)
                         : setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &zero, sizeof zero);
        if (r != 0 && (close_it || errno != ENOENT))
            ferry__logf(&g->o.log, FERRY_LOG_WARN, "%s new remote connections: %s",
                        close_it ? "could not turn away" : "could not let in again",
                        strerror(errno));
    }
    atomic_store(&g->closed, close_it);
}

static void close_door(ferry__guard *g, const char *because)
{
    if (atomic_load(&g->closed))
        return;
    set_door(g, 1);
    g->recount_ms = 0;
    unsigned n = atomic_fetch_add(&g->closings, 1) + 1;
    if (ferry__log_nth(n, 1))
        ferry__logf(&g->o.log, FERRY_LOG_WARN,
                    "%s: new remote connections are turned away until some close (a connection "
                    "that says nothing is closed after %d ms; the cap is %u: %s; %llu times so "
                    "far)",
                    because, g->o.handshake_ms, g->o.cap, g->o.why_cap, (unsigned long long)n);
}

/* Reads every event waiting on w's monitor. */
static void read_events(ferry__guard *g, watched *w)
{
    int closed = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        uint16_t ev = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&m) >= 6) {
            memcpy(&ev, zmq_msg_data(&m), 2);
            memcpy(&value, (const char *)zmq_msg_data(&m) + 2, 4);
        }
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the endpoint */
            zmq_msg_init(&m);
            more = zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (ev == ZMQ_EVENT_ACCEPTED)
            atomic_fetch_add(&w->open, 1);
        else if (ev == ZMQ_EVENT_DISCONNECTED) {
            closed = 1;
            if (atomic_load(&w->open))
                atomic_fetch_sub(&w->open, 1);
        } else if (ev == ZMQ_EVENT_ACCEPT_FAILED && (value == EMFILE || value == ENFILE))
            close_door(g, "the open-file limit stopped an accept");
    }
    if (closed && g->o.closed) /* once for all the events read */
        g->o.closed(g->o.closed_arg);
}

/* The count against the cap, after every event read: the door closes at
 * once. */
static void check_cap(ferry__guard *g)
{
    uint32_t open = ferry__guard_open_count(g);
    if (!atomic_load(&g->closed) && open >= g->o.cap) {
        char because[96];
        snprintf(because, sizeof because, "%u remote connections are open", open);
        close_door(g, because);
    }
}

/* While the door is closed, every RECOUNT_EVERY_MS: the connections
 * counted from /proc/self/fd (a lost monitor event cannot keep the door
 * closed), and the door opened again once few enough are left. */
static void recount(ferry__guard *g, uint64_t now_ms)
{
    if (!atomic_load(&g->closed) || now_ms - g->recount_ms < RECOUNT_EVERY_MS)
        return;
    g->recount_ms = now_ms;
    for (int i = 0; i < g->n; i++) {
        count_arg a = {.addr = &g->w[i].addr};
        if (g->w[i].listen_fd >= 0 && each_fd(count_one, &a) != 0)
            return; /* not even an fd to look with: certainly not now */
        if (g->w[i].listen_fd >= 0)
            atomic_store(&g->w[i].open, a.n);
    }
    uint32_t open = ferry__guard_open_count(g);
    if (open > g->o.cap / 4 * 3)
        return;
    set_door(g, 0);
    if (ferry__log_nth(atomic_load(&g->closings), 1))
        ferry__logf(&g->o.log, FERRY_LOG_INFO, "remote connections are let in again (%u open)",
                    open);
}

static void *guard_main(void *arg)
{
    ferry__guard *g = arg;
    zmq_pollitem_t items[FERRY__GUARD_MAX_SOCKETS + 1];
    for (int i = 0; i < g->n; i++)
        items[i] = (zmq_pollitem_t){.socket = g->w[i].mon, .events = ZMQ_POLLIN};
    items[g->n] = (zmq_pollitem_t){.fd = g->stop_fd, .events = ZMQ_POLLIN};
    for (;;) {
        int r = zmq_poll(items, g->n + 1, RECOUNT_EVERY_MS);
        if (r < 0 && errno != EINTR)
            break; /* the context is going */
        if (items[g->n].revents & ZMQ_POLLIN)
            break;
        for (int i = 0; r > 0 && i < g->n; i++) {
            if (items[i].revents & ZMQ_POLLIN)
                read_events(g, &g->w[i]);
        }
        check_cap(g);
        recount(g, ferry__now_ms());
    }
    return NULL;
}

int ferry__guard_start(ferry__guard *g)
{
    /* Signals stay the trainer's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&g->thread, NULL, guard_main, g);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e)
        return ferry__syserr(FERRY_ESYS, "could not start the connection guard's thread", e);
    g->thread_live = 1;
    return FERRY_OK;
}
