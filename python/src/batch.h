/*
 * batch.h - a batch as the trainer holds it (batch.c): the Batch object the
 * Loader (loader.c) makes in next(), the View buffers numpy arrays are made
 * from, and the count of a loader's batches still alive that both share.
 */
#ifndef FERRY_PY_BATCH_H
#define FERRY_PY_BATCH_H

#include "pyhelp.h"

#include "ferry.h"

/* The batches of one loader still alive (their memory held by the trainer),
 * shared by the loader and its batches and freed by the last of them; only
 * touched with the GIL held. */
typedef struct held_count {
    long owners; /* the loader, while it lives, and each live batch */
    long live;   /* live batches */
    /* Called as on_release(SlotHold) when a batch in a slot dies: the slot
     * then goes back when that SlotHold does (Loader.release_hook). */
    PyObject *on_release;
} held_count;

typedef struct {
    PyObject_HEAD ferry_batch *b;
    ferry_batch_info info;
    held_count *held;
    void *slot;      /* the batch slot it lies in (ferry_batch_slot), or NULL */
    size_t slot_len;
} BatchObject;

extern PyTypeObject ferry_py_BatchType;

/* One owner of h less; the last frees it. */
void ferry_py_held_drop(held_count *h);

/* Calls hook(arg) (hook() when arg is NULL) where no exception may
 * propagate (a destructor, close): a failure is reported as unraisable, as
 * from __del__. The caller has set aside any exception pending. */
void ferry_py_call_hook(PyObject *hook, PyObject *arg);

/* Adds Batch, View and SlotHold to the module. */
int ferry_py_batch_init(PyObject *m);

#endif
