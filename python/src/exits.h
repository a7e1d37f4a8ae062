/*
 * exits.h - a loader's book of the worker processes ferry reaped (exits.c):
 * what remains of the workers' lives once they are gone, for
 * ferry.WorkerProcess (exitcode, join) and torch's _workers.
 */
#ifndef FERRY_PY_EXITS_H
#define FERRY_PY_EXITS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ferry_py_exits ferry_py_exits;

/* An empty book, or NULL when out of memory. */
ferry_py_exits *ferry_py_exits_new(void);
/* Frees b (NULL is fine); nothing may record into it any more. */
void ferry_py_exits_free(ferry_py_exits *b);

/* ferry's exit callback (ferry_config_set_exit_fn, user = the book): runs
 * on ferry's thread without the GIL, and wakes whoever waits. */
void ferry_py_exits_record(void *user, uint32_t index, int pid, int status);

/* Entries so far: a position to wait from (a pid used again later is not
 * mistaken for an earlier process of that pid). */
size_t ferry_py_exits_seen(ferry_py_exits *b);

/* Waits at most wait_ms for an entry of `pid` at or after position
 * `since`: 1 with its wait status in *status (-1: unknown), or 0. Call it
 * without the GIL. */
int ferry_py_exits_wait(ferry_py_exits *b, size_t since, int pid, int64_t wait_ms, int *status);

#endif
