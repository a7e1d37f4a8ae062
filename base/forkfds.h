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

#endif /* FERRY_BASE_FORKFDS_H */
