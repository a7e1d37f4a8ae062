/*
 * forkserver.h - talking to a clean parent: the process that loads a
 * dataset once and forks a loader's local workers from itself.
 *
 * Position in the data flow: under the pool (pool.c), which decides when a
 * worker is started; this file only carries the requests and answers. A
 * clean parent is a worker program started in its --fork-server mode
 * (`python -m ferry.worker`: the Python package's is the one that exists;
 * see docs/protocol.md, "The clean parent"). It is started like any worker
 * (posix_spawn) or forked by a template (option fork_from: the Python
 * package forks the trainer per loader, and that fork serves this protocol
 * without a dataset), and it never starts a thread, so a fork of it is
 * safe. Its children are made with clone(CLONE_PARENT): they
 * are the loader's children, reaped and watched by pidfd exactly as spawned
 * workers are, and they outlive a clean parent that dies.
 *
 * The control connection is an AF_UNIX SOCK_SEQPACKET socket, one message
 * a datagram:
 *   loader -> parent  "F" ARG \0 ARG \0 ...   fork a child that runs the
 *                     worker program with these arguments; SCM_RIGHTS
 *                     carries its fds: the first becomes its stderr, the
 *                     others fds 3, 4, ... (as ferry__spawn passes them)
 *   loader -> template "A" ID \0 ARG \0 ...  the same, from ferry__fork_ask:
 *                     ID (decimal) comes back in the answer
 *   parent -> loader  "R"                     ready: the dataset is loaded
 *                     "P" PID                 the child of the oldest request
 *                     "E" TEXT                that request failed, and why
 *                     "p" PID " " ID          the child of ask ID
 *                     "e" ID " " TEXT         ask ID failed, and why
 * Answers come in the order of the requests. An ask carries its id because
 * two templates serve one socket (the Python package's, _template.py): an
 * answer may belong to an ask no longer waited for.
 *
 * Thread safety: a control fd is used by one thread at a time; the
 * synchronous ferry__fork_ask serialises its callers itself, since the
 * C loaders one ferry.Loader makes over its life (load_state_dict) share
 * its template.
 */
#ifndef FERRY_CORE_FORKSERVER_H
#define FERRY_CORE_FORKSERVER_H

#include <stddef.h>
#include <sys/types.h>

/* The most fds one request carries. */
#define FERRY__FORK_FDS_MAX 8

typedef enum ferry__fork_answer_kind {
    FERRY__FORK_NONE = 0,  /* nothing to read now */
    FERRY__FORK_READY,     /* "R" */
    FERRY__FORK_PID,       /* "P": pid */
    FERRY__FORK_ERROR,     /* "E": text */
    FERRY__FORK_CLOSED,    /* the parent closed its end (it is gone) */
} ferry__fork_answer_kind;

typedef struct ferry__fork_answer {
    ferry__fork_answer_kind kind;
    pid_t pid;
    unsigned long long id; /* the ask answered ("p", "e"; 0 for "P", "E") */
    char text[512];
} ferry__fork_answer;

/* A socket pair for a new clean parent: *ours (close-on-exec, non-blocking)
 * and *theirs (to pass to it). FERRY_ESYS. */
int ferry__fork_socketpair(int *ours, int *theirs);

/* Sends "fork `args` (NULL-terminated) with fds[0..nfds-1]". The fds stay
 * the caller's (the kernel holds its own references while the message is
 * queued). FERRY_ESYS when the parent is gone or the request does not fit. */
int ferry__fork_request(int ctl, char *const args[], const int *fds, int nfds);

/* Reads one answer without waiting: kind FERRY__FORK_NONE when none is
 * there. FERRY_OK, or FERRY_ESYS on a read error (taken as CLOSED). */
int ferry__fork_read(int ctl, ferry__fork_answer *a);

/* One ask ("A") of a template and its answer, waited for at most
 * timeout_ms (callers of the same fd are serialised): the child's pid, or
 * FERRY_ESPAWN saying why not (the template's own error, gone, no answer
 * in time; a template that once did not is not asked again). A child
 * forked for an earlier ask (answered by a template that died before it
 * took the ask off the socket, so that the other took it too) is killed
 * and reaped; the Python package reaps those left unread at close. */
int ferry__fork_ask(int ctl, char *const args[], const int *fds, int nfds, int timeout_ms,
                    pid_t *pid);

#endif
