/*
 * forkfds.c - file descriptors a forked child closes at once (forkfds.h).
 */
#include "forkfds.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Recursive: a thread that holds off forks (ferry__forkfds_hold) adds its
 * fds with the lock held. */
static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int *fds;
static size_t nfds, cap;
/* Mutexes a child re-initialises (ferry__forkfds_unlock_in_child). */
#define RELOCK_MAX 8
static pthread_mutex_t *relock[RELOCK_MAX];
static size_t nrelock;

static void prepare(void)
{
    pthread_mutex_lock(&mu);
}

static void parent(void)
{
    pthread_mutex_unlock(&mu);
}

static void child(void)
{
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    nfds = 0;
    /* The thread that held one at the fork is not in the child: nothing
     * would ever unlock it. */
    for (size_t i = 0; i < nrelock; i++)
        *relock[i] = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_unlock(&mu);
}

static void install(void)
{
    (void)pthread_atfork(prepare, parent, child);
}

void ferry__forkfds_add(int fd)
{
    if (fd < 0)
        return;
    pthread_once(&once, install);
    pthread_mutex_lock(&mu);
    if (nfds == cap) {
        size_t n = cap ? 2 * cap : 16;
        int *p = realloc(fds, n * sizeof *p);
        if (p) {
            fds = p;
            cap = n;
        }
    }
    if (nfds < cap)
        fds[nfds++] = fd;
    pthread_mutex_unlock(&mu);
}

void ferry__forkfds_unlock_in_child(pthread_mutex_t *lock)
{
    pthread_once(&once, install);
    pthread_mutex_lock(&mu);
    size_t i = 0;
    while (i < nrelock && relock[i] != lock)
        i++;
    if (i == nrelock && nrelock < RELOCK_MAX)
        relock[nrelock++] = lock;
    pthread_mutex_unlock(&mu);
}

void ferry__forkfds_hold(void)
{
    pthread_once(&once, install);
    pthread_mutex_lock(&mu);
}

void ferry__forkfds_release(void)
{
    pthread_mutex_unlock(&mu);
}

void ferry__forkfds_close(int fd)
{
    if (fd < 0)
        return;
    ferry__forkfds_remove(fd);
    close(fd);
}

void ferry__forkfds_remove(int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nfds; i++) {
        if (fds[i] == fd) {
            fds[i] = fds[--nfds];
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}
