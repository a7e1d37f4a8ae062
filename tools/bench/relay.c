/*
 * relay.c - a TCP relay with a delay each way (see relay.h).
 */
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define CHUNK (256 * 1024)
#define QUEUE_MAX (64u << 20)

typedef struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len, off;
    unsigned char data[];
} chunk;

/* One direction of a connection: from fd `in` to fd `out`. */
typedef struct pipe_dir {
    int in, out;
    chunk *head, *tail;
    size_t queued;
    int eof;  /* `in` said EOF: `out` is shut for writing once drained */
    int shut; /* done so */
} pipe_dir;

typedef struct conn {
    int live;
    int a, b; /* the client, the connection on to the target */
    pipe_dir d[2]; /* a -> b, b -> a */
} conn;

struct bench_relay {
    int listener, wake;
    struct sockaddr_in to;
    atomic_uint delay_us;
    atomic_int stop;
    void (*_Atomic tap)(void *arg, const void *data, size_t len);
    void *tap_arg;
    pthread_t thread;
    conn c[MAX_CONNS];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void drop_conn(conn *c)
{
    for (int k = 0; k < 2; k++) {
        while (c->d[k].head) {
            chunk *n = c->d[k].head->next;
            free(c->d[k].head);
            c->d[k].head = n;
        }
    }
    close(c->a);
    close(c->b);
    memset(c, 0, sizeof *c);
}

static void accept_one(bench_relay *r)
{
    int a = accept4(r->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (a < 0)
        return;
    int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* A blocking connect: the target is on this host. */
    if (b < 0 || connect(b, (struct sockaddr *)&r->to, sizeof r->to) != 0) {
        close(a);
        if (b >= 0)
            close(b);
        return;
    }
    fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < MAX_CONNS; i++) {
        if (!r->c[i].live) {
            r->c[i] = (conn){.live = 1, .a = a, .b = b};
            r->c[i].d[0] = (pipe_dir){.in = a, .out = b};
            r->c[i].d[1] = (pipe_dir){.in = b, .out = a};
            return;
        }
    }
    close(a);
    close(b);
}

/* Reads what `in` has into a chunk due after the delay. -1: the
 * connection failed. */
static int pull(bench_relay *r, pipe_dir *p)
{
    chunk *k = malloc(sizeof *k + CHUNK);
    if (!k)
        return -1;
    ssize_t n = read(p->in, k->data, CHUNK);
    if (n <= 0) {
        free(k);
        if (n == 0) {
            p->eof = 1;
            return 0;
        }
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    }
    *k = (chunk){.due_ns = now_ns() + (uint64_t)atomic_load(&r->delay_us) * 1000u,
                 .len = (size_t)n};
    void (*tap)(void *, const void *, size_t) = atomic_load(&r->tap);
    if (tap)
        tap(r->tap_arg, k->data, k->len);
    if (p->tail)
        p->tail->next = k;
    else
        p->head = k;
    p->tail = k;
    p->queued += (size_t)n;
    return 0;
}

/* Writes what is due to `out`. -1: the connection failed. */
static int push(pipe_dir *p, uint64_t now)
{
    while (p->head && p->head->due_ns <= now) {
        chunk *k = p->head;
        /* MSG_NOSIGNAL: a peer gone first is an error here, not SIGPIPE. */
        ssize_t n = send(p->out, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        k->off += (size_t)n;
        p->queued -= (size_t)n;
        if (k->off < k->len)
            return 0;
        p->head = k->next;
        if (!p->head)
            p->tail = NULL;
        free(k);
    }
    if (!p->head && p->eof && !p->shut) {
        shutdown(p->out, SHUT_WR);
        p->shut = 1;
    }
    return 0;
}

static void *relay_main(void *arg)
{
    bench_relay *r = arg;
    struct pollfd pf[2 + 2 * MAX_CONNS];
    int owner[2 + 2 * MAX_CONNS];
    while (!atomic_load(&r->stop)) {
        uint64_t now = now_ns();
        int n = 0, timeout = 100;
        pf[n++] = (struct pollfd){.fd = r->listener, .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = r->wake, .events = POLLIN};
        for (int i = 0; i < MAX_CONNS; i++) {
            conn *c = &r->c[i];
            if (!c->live)
                continue;
            for (int k = 0; k < 2; k++) {
                pipe_dir *p = &c->d[k];
                short ev = 0;
                if (!p->eof && p->queued < QUEUE_MAX)
                    ev |= POLLIN;
                if (p->head) {
                    uint64_t wait = p->head->due_ns > now ? p->head->due_ns - now : 0;
                    int ms = (int)((wait + 999999) / 1000000);
                    if (ms < timeout)
                        timeout = ms;
                }
                /* `in` of one direction is `out` of the other: one pollfd
                 * per fd, reading and (when due) writing. */
                pf[n] = (struct pollfd){.fd = p->in, .events = ev};
                if (c->d[1 - k].head && c->d[1 - k].head->due_ns <= now)
                    pf[n].events |= POLLOUT;
                owner[n++] = i * 2 + k;
            }
        }
        if (poll(pf, (nfds_t)n, timeout) < 0 && errno != EINTR)
            break;
        if (pf[0].revents & POLLIN)
            accept_one(r);
        now = now_ns();
        for (int j = 2; j < n; j++) {
            conn *c = &r->c[owner[j] / 2];
            pipe_dir *p = &c->d[owner[j] % 2];
            if (!c->live)
                continue;
            int bad = (pf[j].revents & (POLLIN | POLLHUP | POLLERR)) && pull(r, p) != 0;
            if (bad || push(&c->d[0], now) != 0 || push(&c->d[1], now) != 0 ||
                (c->d[0].shut && c->d[1].shut))
                drop_conn(c);
        }
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (r->c[i].live)
            drop_conn(&r->c[i]);
    return NULL;
}

int bench_relay_start(bench_relay **out, const char *listen_ip, int listen_port,
                      const char *to_ip, int to_port, unsigned delay_us)
{
    bench_relay *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    r->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port)};
    r->to = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)to_port)};
    int one = 1;
    int ok = r->wake >= 0 && r->listener >= 0 && inet_pton(AF_INET, listen_ip, &at.sin_addr) == 1 &&
             inet_pton(AF_INET, to_ip, &r->to.sin_addr) == 1 &&
             setsockopt(r->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
             bind(r->listener, (struct sockaddr *)&at, sizeof at) == 0 &&
             listen(r->listener, 64) == 0;
    atomic_init(&r->delay_us, delay_us);
    if (!ok || pthread_create(&r->thread, NULL, relay_main, r) != 0) {
        int e = errno;
        if (r->wake >= 0)
            close(r->wake);
        if (r->listener >= 0)
            close(r->listener);
        free(r);
        errno = e;
        return -1;
    }
    *out = r;
    return 0;
}

void bench_relay_set_delay(bench_relay *r, unsigned delay_us)
{
    atomic_store(&r->delay_us, delay_us);
}

void bench_relay_tap(bench_relay *r, void (*tap)(void *arg, const void *data, size_t len),
                     void *arg)
{
    r->tap_arg = arg;
    atomic_store(&r->tap, tap);
}

void bench_relay_stop(bench_relay *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, 1);
    uint64_t one = 1;
    ssize_t w = write(r->wake, &one, sizeof one);
    (void)w;
    pthread_join(r->thread, NULL);
    close(r->listener);
    close(r->wake);
    free(r);
}
