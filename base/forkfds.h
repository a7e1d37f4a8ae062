/*
 * forkfds.h - file descriptors a forked child closes at once.
 *
 * A child forked while a loader is open (multiprocessing's fork start, a
 * fork DataLoader in the training script, os.fork()) inherits every fd of
 * the trainer, close-on-exec or not. The loader's memfds (the pickled
 * dataset, the workers' task words) would then keep their memory alive
 * until the child exits, although the child can never use them: its copy
 * of the loader has no threads. The pool's control socket, stderr pipes
 * and pidfds would be held too: a loader's template forked while another
 * loader (or its own) opens would keep them for its whole life, and pass
 * them to every clean parent it forks. Each such fd is registered here
 * while the loader holds it, and a pthread_atfork child handler closes
 * them all.
 *
 * Thread safety: one (recursive) mutex; the prepare handler takes it, so
 * no registration is mid-change at the fork, and a thread holding it
 * (ferry__forkfds_hold) holds off every fork.
 */
#ifndef FERRY_BASE_FORKFDS_H
#define FERRY_BASE_FORKFDS_H

#include <pthread.h>

/* Registers fd (>= 0) to be closed in forked children; without memory for
 * it, the child keeps it (as it would without this). */
void ferry__forkfds_add(int fd);

/* Unregisters fd: call before closing it. */
void ferry__forkfds_remove(int fd);

/* Unregisters fd and closes it (fd < 0: nothing); for an fd that may or
 * may not be registered. */
void ferry__forkfds_close(int fd);

/* Holds off every fork of the process (another thread's waits in the
 * prepare handler) until ferry__forkfds_release: made and added between
 * the two, an fd is never in a fork. A fork between making an fd and
 * adding it would inherit it (a template forked while a loader opens,
 * on another thread). Not to be held across a fork of one's own. */
void ferry__forkfds_hold(void);
void ferry__forkfds_release(void);

/* Registers a static, plain (not recursive) mutex that forked children
 * re-initialise, unlocked: one of the parent's threads may hold it at the
 * fork (the loader's log lock while a Python log callback waits for the
 * GIL that the forking thread holds), and that thread does not exist in
 * the child, which would wait for it forever (a template, a clean parent
 * or a worker that logs, or opens a loader of its own). Only for locks
 * whose data stays consistent at any instant a holder could be forked
 * in. At most 8; call before the first lock (pthread_once). */
void ferry__forkfds_unlock_in_child(pthread_mutex_t *lock);

#endif /* FERRY_BASE_FORKFDS_H */
