/*
 * scheduler.h - the loader's one background thread: it owns the sockets,
 * the workers and every child process, moves tasks from the window to the
 * workers and replies back into the window, and decides what a worker's
 * death, silence or timeout means for the run.
 *
 * Position in the data flow: between the window (tasks in flight) and the
 * workers (pool.c for local ones, remote.c for the others), over the
 * transport (protocol.h, zsock.h). The loader's public functions start and
 * stop it; the trainer's thread never calls into it except to wake it.
 */
#ifndef FERRY_CORE_SCHEDULER_H
#define FERRY_CORE_SCHEDULER_H

#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "protocol.h"
#include "window.h"

typedef struct ferry__scheduler ferry__scheduler;

/* Sets up the endpoint and sockets and starts the thread, which starts the
 * local workers and runs until ferry__scheduler_stop. The window must
 * outlive the scheduler; the thread fails it (ferry__window_fail) when the
 * run cannot go on. On failure nothing is left running or open. */
int ferry__scheduler_start(ferry__scheduler **out, const ferry_config *cfg, ferry__window *win);

/* Stops the thread, which shuts every worker down (STOP, grace period,
 * SIGTERM, SIGKILL, each child reaped), and frees everything. Returns 1
 * when a worker thread stuck in dataset code had to be left running (its
 * ZeroMQ context is then left alive), else 0. */
int ferry__scheduler_stop(ferry__scheduler *s);

/* The window's wake callback: the scheduler looks again. Any thread. */
void ferry__scheduler_wake(void *s);

/* The remote endpoint as bound, or NULL without `bind`. */
const char *ferry__scheduler_endpoint(const ferry__scheduler *s);

/* The dataset's schema, fixed by the first READY before the run starts
 * (and never written after): safe to read once open has returned. */
const ferry__schema *ferry__scheduler_schema(const ferry__scheduler *s);

/* Local worker i's pid (0 for a thread or while it is being replaced).
 * Any thread. */
pid_t ferry__scheduler_worker_pid(ferry__scheduler *s, uint32_t i);

/* The host name and pid of the remote worker that holds slot i, or last
 * held it ("" and 0: a local slot, or one never taken). Any thread. */
void ferry__scheduler_worker_host(ferry__scheduler *s, uint32_t i, char *buf, size_t cap,
                                  uint32_t *pid);

/* The stats of what the scheduler owns: the batch slots' memory and the
 * remote connections; from any thread. */
void ferry__scheduler_usage(ferry__scheduler *s, ferry_stats *st);
/* The trainer has had the stream's last batch: the batch slots' memory
 * goes back as they come free (ferry__shm_drain). From any thread. */
void ferry__scheduler_stream_ended(ferry__scheduler *s);
/* ferry_loader_keep_slots: the batch slots keep their pages from now on.
 * From any thread. */
void ferry__scheduler_keep_slots(ferry__scheduler *s);

#endif
