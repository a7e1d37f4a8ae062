/*
 * loader.c - the trainer's side of _ferry: the Loader (its Batch and View: batch.c).
 *
 * A Loader wraps one ferry_loader. next() releases the GIL while it waits,
 * in slices of at most SLICE_MS, and checks for signals between slices, so
 * Ctrl-C raises KeyboardInterrupt within about SLICE_MS however long the
 * batch takes. A batch (or a per-batch failure) that arrives with a signal
 * pending is not dropped: signals are checked once more after the wait, and
 * when the handler raises, what arrived stays pending in the Loader, is
 * handed over first by the next call, and is not counted by state() until
 * then. What next() returns is a Batch (batch.c).
 *
 * Threads: the loader is ferry's one-thread-at-a-time object; `busy` turns
 * a second thread's next() or close() during a wait (the GIL is released
 * then) into a RuntimeError instead of undefined behaviour. Batches may die
 * on any thread.
 *
 * Log messages: ferry calls its log callback on the loader's own thread,
 * which must never wait for the GIL (close() joins that thread while this
 * one may hold it). So the callback only queues the line, and the
 * trainer's thread hands the queue to the Python sink (logging, by
 * default) whenever it is in here anyway: after open, between next()'s
 * slices, in stats() and after close.
 *
 * Worker exits: ferry tells the exit callback of each worker process it
 * reaps; the Loader's exit book (exits.c) keeps them, and worker_exit()
 * reads it, waiting with the GIL released, also after close().
 */
#include "loader.h"
#include "batch.h"
#include "clock.h"
#include "exits.h"
#include "pyprofile.h"

#include <pthread.h>
#include <structmember.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"
#include "ferry_dataset.h"

/* The longest next() waits without looking at signals. */
#define SLICE_MS 50

/* Messages from ferry's thread, waiting for the trainer's. */
#define LOG_QUEUE_MAX 1000
typedef struct log_entry {
    struct log_entry *next;
    int level;
    char message[];
} log_entry;

typedef struct log_queue {
    pthread_mutex_t mu;
    log_entry *head, **tail;
    int n;
    unsigned long dropped; /* past LOG_QUEUE_MAX */
} log_queue;

typedef struct {
    PyObject_HEAD ferry_loader *ld;
    ferry_py_exits *exits; /* NULL until the loader is opened */
    log_queue *log;   /* NULL: ferry writes to stderr itself */
    PyObject *log_sink; /* called as sink(level, message) */
    int busy;         /* a thread is in next() or close() with the GIL released */
    held_count *held; /* batches of this loader still alive */
    long max_held;    /* next() refuses while this many are alive; 0: no limit */
    pid_t owner;      /* the process that opened it */
    PyObject *wrap;   /* makes what next() returns from a Batch (ferry.Batch); NULL, None: none */
    PyObject *before_close; /* called first by close(), and by the loader's end; NULL, None: none */
    int in_order;     /* the loader has a stream position (state() works) */
    /* What next() took from ferry but could not hand over because a signal
     * handler raised first (Ctrl-C): a batch, or a per-batch failure's code
     * and message. The next call hands it over before waiting again. */
    PyObject *pending;
    int pending_rc;
    char *pending_msg;
    /* state() while something is pending: the position before it, taken
     * before each wait (ferry counts a result as delivered when it returns
     * it, but the trainer has not had this one). */
    char before[FERRY_STATE_MAX];
    size_t before_len;
} LoaderObject;

static PyTypeObject LoaderType;

/* -------------------------------------------------------------- Loader */

/* ferry's log callback: runs on ferry's thread without the GIL. */
static void queue_log(void *user, int level, const char *message)
{
    log_queue *q = user;
    size_t len = strlen(message);
    log_entry *e = len < 4096 ? malloc(sizeof *e + len + 1) : NULL;
    pthread_mutex_lock(&q->mu);
    if (!e || q->n >= LOG_QUEUE_MAX) {
        q->dropped++;
        free(e);
    } else {
        e->next = NULL;
        e->level = level;
        memcpy(e->message, message, len + 1);
        *q->tail = e;
        q->tail = &e->next;
        q->n++;
    }
    pthread_mutex_unlock(&q->mu);
}

/* One message to the sink; its own errors are reported as unraisable,
 * never raised into the trainer's call. */
static void call_sink(LoaderObject *self, int level, const char *message)
{
    PyObject *r = PyObject_CallFunction(self->log_sink, "is", level, message);
    if (!r)
        PyErr_WriteUnraisable(self->log_sink);
    Py_XDECREF(r);
}

/* Hands the queued messages to the sink, in order. */
static void drain_log(LoaderObject *self)
{
    log_queue *q = self->log;
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    log_entry *e = q->head;
    unsigned long dropped = q->dropped;
    q->head = NULL;
    q->tail = &q->head;
    q->n = 0;
    q->dropped = 0;
    pthread_mutex_unlock(&q->mu);
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb); /* a pending error stays pending */
    while (e) {
        log_entry *next = e->next;
        call_sink(self, e->level, e->message);
        free(e);
        e = next;
    }
    if (dropped)
        call_sink(self, FERRY_LOG_WARN,
                  "ferry: log messages were dropped (more than 1000 waiting for the trainer's "
                  "thread)");
    PyErr_Restore(exc_type, exc_value, exc_tb);
}

static void free_log(LoaderObject *self)
{
    log_queue *q = self->log;
    self->log = NULL;
    Py_CLEAR(self->log_sink);
    if (!q)
        return;
    for (log_entry *e = q->head, *next; e; e = next) {
        next = e->next;
        free(e);
    }
    pthread_mutex_destroy(&q->mu);
    free(q);
}

static int loader_init(LoaderObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *options, *sink = Py_None;
    Py_buffer state = {0};
    static char *kwlist[] = {"options", "state", "log", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|z*O:Loader", kwlist, &options, &state, &sink))
        return -1;
    if (self->ld) {
        PyErr_SetString(PyExc_RuntimeError, "Loader is already open");
        goto fail;
    }
    if (sink != Py_None && !PyCallable_Check(sink)) {
        PyErr_SetString(PyExc_TypeError, "log must be a callable(level, message) or None");
        goto fail;
    }
    if (sink != Py_None && !self->log) {
        self->log = calloc(1, sizeof *self->log);
        if (!self->log) {
            PyErr_NoMemory();
            goto fail;
        }
        pthread_mutex_init(&self->log->mu, NULL);
        self->log->tail = &self->log->head;
        Py_INCREF(sink);
        self->log_sink = sink;
    }
    if (!self->exits && !(self->exits = ferry_py_exits_new())) {
        PyErr_NoMemory();
        goto fail;
    }
    if (!self->held) {
        self->held = PyMem_Calloc(1, sizeof *self->held);
        if (!self->held) {
            PyErr_NoMemory();
            goto fail;
        }
        self->held->owners = 1;
    }
    PyObject *seq = PySequence_Fast(options, "options must be a sequence of (key, value) pairs");
    if (!seq)
        goto fail;
    ferry_config *cfg = ferry_config_new();
    if (!cfg) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        goto fail;
    }
    int rc = FERRY_OK;
    for (Py_ssize_t i = 0; rc == FERRY_OK && i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *key, *value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ss", &key, &value)) {
            rc = -1000;
            break;
        }
        rc = ferry_config_set(cfg, key, value);
    }
    Py_DECREF(seq);
    if (rc == FERRY_OK && state.buf)
        rc = ferry_config_set_state(cfg, state.buf, (size_t)state.len);
    if (rc == FERRY_OK && self->log)
        rc = ferry_config_set_log(cfg, queue_log, self->log);
    if (rc == FERRY_OK)
        rc = ferry_config_set_exit_fn(cfg, ferry_py_exits_record, self->exits);
    if (rc == FERRY_OK) {
        ferry_loader *ld = NULL;
        Py_BEGIN_ALLOW_THREADS rc = ferry_loader_open(&ld, cfg);
        Py_END_ALLOW_THREADS self->ld = ld;
        self->owner = getpid();
        drain_log(self);
    }
    if (rc == FERRY_OK) {
        /* ferry_loader_state() works exactly when the loader is in order
         * (ferry.h): the C library's reading of the option, asked once. */
        size_t len;
        self->in_order = ferry_loader_state(self->ld, self->before, sizeof self->before, &len) ==
                         FERRY_OK;
    }
    ferry_config_free(cfg);
    if (rc == -1000)
        goto fail;
    if (rc != FERRY_OK) {
        ferry_py_raise(rc, ferry_last_error());
        goto fail;
    }
    PyBuffer_Release(&state);
    return 0;
fail:
    PyBuffer_Release(&state);
    return -1;
}

/* The loader, or NULL with an exception when it is closed or in use. */
static ferry_loader *usable(LoaderObject *self)
{
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    if (getpid() != self->owner) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this loader belongs to the process that opened it, not to a child "
                        "forked from it; open another loader in the child");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the loader is busy in next(): called from another thread, or from a "
                        "signal handler that ran during next() (a loader is used from one "
                        "thread at a time)");
        return NULL;
    }
    return self->ld;
}

/* Closes the loader. In a child forked from its owner (multiprocessing,
 * torch's DataLoader) the handle is only dropped: the scheduler thread and
 * the workers are the parent's, and closing them from here would stop the
 * parent's loader. */
static void close_loader(LoaderObject *self)
{
    /* Detached first: before_close may let another thread run (it waits
     * for the device), and that thread's next() must find it closed. */
    ferry_loader *ld = self->ld;
    self->ld = NULL;
    Py_CLEAR(self->pending);
    free(self->pending_msg);
    self->pending_msg = NULL;
    if (!ld || getpid() != self->owner)
        return;
    self->busy = 1;
    PyObject *hook = self->before_close;
    if (hook && hook != Py_None) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        ferry_py_call_hook(hook, NULL);
        PyErr_Restore(type, value, tb);
    }
    Py_BEGIN_ALLOW_THREADS ferry_loader_close(ld);
    Py_END_ALLOW_THREADS self->busy = 0;
    drain_log(self);
}

static void loader_dealloc(LoaderObject *self)
{
    close_loader(self);
    /* In a forked child the queue is a copy nobody writes to. */
    free_log(self);
    /* The loader is closed (or a forked child's copy that nobody writes to):
     * nothing records into the book any more. */
    ferry_py_exits_free(self->exits);
    self->exits = NULL;
    Py_CLEAR(self->wrap);
    Py_CLEAR(self->before_close);
    ferry_py_held_drop(self->held);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* base/clock.h's milliseconds, signed for the deadlines' arithmetic. */
static int64_t now_ms(void)
{
    return (int64_t)ferry__now_ms();
}

/* Hands over what next() took from ferry: the batch, through `wrap`, or the
 * failure, raised. When a signal handler raises first (in `wrap`, or in the
 * check after it) the result stays pending and NULL is returned with the
 * handler's exception; otherwise pending is cleared. Called with busy set,
 * so a handler that calls next() gets the RuntimeError of usable(). */
static PyObject *hand_over(LoaderObject *self)
{
    if (self->pending) {
        PyObject *out = self->pending;
        if (self->wrap && self->wrap != Py_None)
            out = PyObject_CallOneArg(self->wrap, self->pending);
        else
            Py_INCREF(out);
        if (out && PyErr_CheckSignals() < 0)
            Py_CLEAR(out);
        if (out)
            Py_CLEAR(self->pending);
        return out;
    }
    PyObject *error = ferry_py_import_attr("ferry._errors", "Error");
    if (!error)
        return NULL;
    ferry_py_raise(self->pending_rc, self->pending_msg);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    /* Building the exception runs Python code, where a handler may raise
     * instead. */
    int made = type && PyErr_GivenExceptionMatches(type, error);
    Py_DECREF(error);
    if (made && PyErr_CheckSignals() < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    if (made) {
        free(self->pending_msg);
        self->pending_msg = NULL;
        self->pending_rc = 0;
    }
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* next(timeout_ms=-1) -> Batch (through wrap), or None at the end of the
 * stream. Raises the loader's error (ferry.BatchError and the like),
 * ferry.Timeout when timeout_ms passed with no batch, or what a signal
 * handler raised (KeyboardInterrupt); in that last case a batch or failure
 * that had arrived is handed over by the next call. */
static PyObject *loader_next(LoaderObject *self, PyObject *args)
{
    long long timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|L:next", &timeout_ms))
        return NULL;
    ferry_loader *ld = usable(self);
    if (!ld)
        return NULL;
    if (self->pending || self->pending_msg) {
        self->busy = 1;
        PyObject *out = hand_over(self);
        self->busy = 0;
        return out;
    }
    if (self->max_held > 0 && self->held->live >= self->max_held) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "%ld batches of this loader are still alive (arrays taken from them are "
                 "referenced), the limit max_held; each keeps its memory: drop them (del, or "
                 "copy what you keep) or raise max_held",
                 self->held->live);
        return ferry_py_raise(FERRY_ELIMIT, msg);
    }
    if (self->in_order &&
        ferry_loader_state(ld, self->before, sizeof self->before, &self->before_len) != FERRY_OK)
        return ferry_py_raise(FERRY_ESTATE, ferry_last_error());
    int64_t start = now_ms();
    ferry_batch *b = NULL;
    int rc;
    self->busy = 1;
    for (;;) {
        int64_t slice = SLICE_MS;
        if (timeout_ms >= 0) {
            int64_t left = timeout_ms - (now_ms() - start);
            slice = left < 0 ? 0 : left < SLICE_MS ? left : SLICE_MS;
        }
        Py_BEGIN_ALLOW_THREADS rc = ferry_loader_next_timeout(ld, &b, slice);
        Py_END_ALLOW_THREADS drain_log(self);
        if (rc != FERRY_EAGAIN)
            break;
        if (PyErr_CheckSignals() < 0) {
            self->busy = 0;
            return NULL;
        }
        if (timeout_ms >= 0 && slice < SLICE_MS)
            break; /* the caller's time is up */
    }
    if (rc == FERRY_OK) {
        BatchObject *bo = PyObject_New(BatchObject, &ferry_py_BatchType);
        if (!bo) {
            ferry_batch_release(b);
            self->busy = 0;
            return NULL;
        }
        bo->b = b;
        ferry_batch_get_info(b, &bo->info);
        /* Asked once, here: in batch_dealloc the question would overwrite
         * the thread's last error message (a batch not in a slot). */
        if (ferry_batch_slot(b, &bo->slot, &bo->slot_len) != FERRY_OK) {
            bo->slot = NULL;
            bo->slot_len = 0;
        }
        bo->held = self->held;
        self->held->owners++;
        self->held->live++;
        self->pending = (PyObject *)bo;
    } else if (rc == FERRY_EBATCH || rc == FERRY_ERANGE) {
        /* Per batch: ferry counts it, so it must reach the trainer. */
        const char *msg = ferry_last_error();
        self->pending_msg = strdup(msg ? msg : "");
        self->pending_rc = rc;
        if (!self->pending_msg) {
            self->busy = 0;
            return ferry_py_raise(rc, msg);
        }
    } else {
        /* The end of the stream and the loader's own failures come again
         * from the next call: nothing to keep. */
        self->busy = 0;
        if (rc == FERRY_EOF)
            Py_RETURN_NONE;
        return ferry_py_raise(rc, rc == FERRY_EAGAIN ? "no batch was ready in time"
                                                     : ferry_last_error());
    }
    PyObject *out = hand_over(self);
    self->busy = 0;
    return out;
}

static PyObject *loader_close(LoaderObject *self, PyObject *unused)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "close() while another thread is in next()");
        return NULL;
    }
    close_loader(self);
    Py_RETURN_NONE;
}

/* length() -> (items, batches_per_epoch) */
static PyObject *loader_length(LoaderObject *self, PyObject *unused)
{
    ferry_loader *ld = usable(self);
    uint64_t items, batches;
    if (!ld)
        return NULL;
    int rc = ferry_loader_length(ld, &items, &batches);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return Py_BuildValue("(KK)", (unsigned long long)items, (unsigned long long)batches);
}

/* schema() -> [(name, dtype code, item shape or None: variable), ...] */
static PyObject *loader_schema(LoaderObject *self, PyObject *unused)
{
    ferry_loader *ld = usable(self);
    ferry_dataset_schema sc;
    if (!ld)
        return NULL;
    int rc = ferry_loader_schema(ld, &sc);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    PyObject *out = PyList_New(sc.nfields);
    for (int f = 0; out && f < sc.nfields; f++) {
        if (sc.fields[f].ndim == FERRY_NDIM_VAR) { /* the shape is each batch's own */
            PyObject *item = Py_BuildValue("(siO)", sc.fields[f].name, (int)sc.fields[f].dtype,
                                           Py_None);
            if (!item) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, f, item);
            continue;
        }
        PyObject *shape = PyTuple_New(sc.fields[f].ndim);
        for (int d = 0; shape && d < sc.fields[f].ndim; d++) {
            PyObject *n = PyLong_FromLongLong(sc.fields[f].shape[d]);
            if (!n) {
                Py_CLEAR(shape);
                break;
            }
            PyTuple_SET_ITEM(shape, d, n);
        }
        PyObject *item =
            shape ? Py_BuildValue("(siN)", sc.fields[f].name, (int)sc.fields[f].dtype, shape) : NULL;
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, f, item);
    }
    return out;
}

/* state() -> bytes: the resume blob after the last batch delivered. */
static PyObject *loader_state(LoaderObject *self, PyObject *unused)
{
    ferry_loader *ld = usable(self);
    char buf[FERRY_STATE_MAX];
    size_t len = 0;
    if (!ld)
        return NULL;
    if (self->in_order && (self->pending || self->pending_msg))
        return PyBytes_FromStringAndSize(self->before, (Py_ssize_t)self->before_len);
    int rc = ferry_loader_state(ld, buf, sizeof buf, &len);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
}

/* state_at_epoch(epoch) -> the resume blob that starts at that epoch. */
static PyObject *loader_state_at_epoch(LoaderObject *self, PyObject *arg)
{
    ferry_loader *ld = usable(self);
    char buf[FERRY_STATE_MAX];
    size_t len = 0;
    if (!ld)
        return NULL;
    unsigned long long epoch = PyLong_AsUnsignedLongLong(arg);
    if (epoch == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int rc = ferry_loader_state_at_epoch(ld, (uint64_t)epoch, buf, sizeof buf, &len);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
}

/* skip_epoch() -> the batches passed over: the rest of the current epoch
 * never handed out (ferry_loader_skip_epoch). The GIL stays held: the call
 * only frees entries under the window's lock. */
static PyObject *loader_skip_epoch(LoaderObject *self, PyObject *unused)
{
    (void)unused;
    ferry_loader *ld = usable(self);
    if (!ld)
        return NULL;
    uint64_t n = 0;
    int rc = ferry_loader_skip_epoch(ld, &n);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyLong_FromUnsignedLongLong(n);
}

/* feed(first_seq, counts, indices): ferry_loader_feed, from two
 * C-contiguous buffers (uint32 counts, 64-bit indices), read without a copy.
 * The GIL stays held: the call only copies into the window under its lock,
 * and no close() on another thread may free the loader meanwhile. */
static PyObject *loader_feed(LoaderObject *self, PyObject *args)
{
    unsigned long long first = 0;
    Py_buffer counts = {0}, indices = {0};
    if (!PyArg_ParseTuple(args, "Ky*y*:feed", &first, &counts, &indices))
        return NULL;
    PyObject *out = NULL;
    ferry_loader *ld = usable(self); /* after the parse, which can run Python code */
    if (!ld)
        goto done;
    if (counts.itemsize != 4 || indices.itemsize != 8 || counts.len % 4 || indices.len % 8) {
        PyErr_SetString(PyExc_TypeError, "feed: counts must be uint32 and indices 64-bit "
                                         "integers");
        goto done;
    }
    uint64_t n = (uint64_t)counts.len / 4, total = 0;
    const uint32_t *c = counts.buf;
    for (uint64_t k = 0; k < n; k++)
        total += c[k];
    if (total != (uint64_t)indices.len / 8) {
        PyErr_Format(PyExc_ValueError, "feed: the counts add up to %llu indices, but %zd were "
                                       "given", (unsigned long long)total, indices.len / 8);
        goto done;
    }
    int rc = ferry_loader_feed(ld, (uint64_t)first, n, c, indices.buf);
    out = rc == FERRY_OK ? Py_NewRef(Py_None) : ferry_py_raise(rc, ferry_last_error());
done:
    PyBuffer_Release(&counts);
    PyBuffer_Release(&indices);
    return out;
}

/* stats(log=True) -> dict of the counters. Safe while another thread
 * waits. log=False leaves the loader's messages for the trainer's thread
 * (the live view's thread reads the counters so). */
static PyObject *loader_stats(LoaderObject *self, PyObject *args)
{
    int log = 1;
    if (!PyArg_ParseTuple(args, "|p:stats", &log))
        return NULL;
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    ferry_stats st;
    if (log && getpid() == self->owner && !self->busy)
        drain_log(self);
    int rc = ferry_loader_stats(self->ld, &st);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsIsIsIsIsKsKsIsIsKsIsIsIsssssIsK}", "dispatched",
        (unsigned long long)st.dispatched,
        "completed", (unsigned long long)st.completed, "delivered",
        (unsigned long long)st.delivered, "failed", (unsigned long long)st.failed, "realigned",
        (unsigned long long)st.realigned, "malformed", (unsigned long long)st.malformed, "stale",
        (unsigned long long)st.stale, "restarts", (unsigned long long)st.restarts, "timeouts",
        (unsigned long long)st.timeouts, "joined", (unsigned long long)st.joined, "lost",
        (unsigned long long)st.lost, "rejected", (unsigned long long)st.rejected, "workers",
        st.workers, "in_flight", st.in_flight, "prefetch", st.prefetch, "credits", st.credits,
        "shared", (unsigned long long)st.shared, "slot_bytes", (unsigned long long)st.slot_bytes,
        "slots", st.slots, "slots_held", st.slots_held, "slot_memory",
        (unsigned long long)st.slot_memory, "remote_connections", st.remote_connections,
        "connections_turned_away", st.connections_turned_away, "credits_min", st.credits_min,
        "credits_why", ferry_sized_name((int)st.credits_why), "prefetch_why",
        ferry_sized_name((int)st.prefetch_why), "round_trip_us", st.round_trip_us,
        "retirements", (unsigned long long)st.retirements);
}

static PyObject *loader_worker_pid(LoaderObject *self, PyObject *args)
{
    unsigned int index;
    int pid = 0;
    if (!PyArg_ParseTuple(args, "I:worker_pid", &index))
        return NULL;
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    int rc = ferry_loader_worker_pid(self->ld, index, &pid);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyLong_FromLong(pid);
}

static PyObject *loader_exits_seen(LoaderObject *self, PyObject *unused)
{
    return PyLong_FromSize_t(self->exits ? ferry_py_exits_seen(self->exits) : 0);
}

/* worker_exit(pid, since=0, timeout=0): the wait status ferry reaped worker
 * process `pid` with (-1: unknown), looking at the entries from position
 * `since` on (exits_seen() before the pid was read: a pid used again by a
 * later worker is not mistaken for it); None when it has not been reaped
 * within `timeout` seconds (0: no wait; None: no limit). Waits on the
 * book's condition with the GIL released, in slices of SLICE_MS, checking
 * for signals between them (Ctrl-C interrupts a join). */
static PyObject *loader_worker_exit(LoaderObject *self, PyObject *args)
{
    int pid;
    Py_ssize_t since = 0;
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTuple(args, "i|nO:worker_exit", &pid, &since, &timeout))
        return NULL;
    int64_t deadline = INT64_MAX; /* timeout None: none */
    if (timeout != Py_None) {
        double secs = PyFloat_AsDouble(timeout);
        if (secs == -1 && PyErr_Occurred())
            return NULL;
        deadline = now_ms() + (secs > 0 ? (int64_t)(secs * 1000.0 + 0.5) : 0);
    }
    ferry_py_exits *b = self->exits;
    if (!b || since < 0)
        Py_RETURN_NONE; /* never opened: no worker of this loader ever ran */
    for (;;) {
        int64_t left = deadline == INT64_MAX ? SLICE_MS : deadline - now_ms();
        int64_t slice = left < 0 ? 0 : left < SLICE_MS ? left : SLICE_MS;
        int found, status = 0;
        Py_BEGIN_ALLOW_THREADS
        found = ferry_py_exits_wait(b, (size_t)since, pid, slice, &status);
        Py_END_ALLOW_THREADS
        if (found)
            return PyLong_FromLong(status);
        if (slice == 0 || (deadline != INT64_MAX && now_ms() >= deadline))
            Py_RETURN_NONE;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

/* worker_host(index) -> (host, pid) of the remote worker in that slot
 * (or the last one there), or None for a local slot or one never taken.
 * Any thread. */
static PyObject *loader_worker_host(LoaderObject *self, PyObject *args)
{
    unsigned int index;
    char host[256];
    int pid = 0;
    if (!PyArg_ParseTuple(args, "I:worker_host", &index))
        return NULL;
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    int rc = ferry_loader_worker_host(self->ld, index, host, sizeof host, &pid);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    if (!host[0])
        Py_RETURN_NONE;
    return Py_BuildValue("(si)", host, pid);
}

static PyObject *loader_endpoint(LoaderObject *self, PyObject *unused)
{
    char buf[512];
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    int rc = ferry_loader_endpoint(self->ld, buf, sizeof buf);
    if (rc == FERRY_ESTATE)
        Py_RETURN_NONE;
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyUnicode_FromString(buf);
}

/* profile() -> Profile: a snapshot of the stage figures. Any thread. */
static PyObject *loader_profile(LoaderObject *self, PyObject *unused)
{
    if (!self->ld) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    return ferry_py_profile_take(self->ld);
}

/* trace(max_batches) keeps the last batches; trace_write(path) writes
 * them (ferry_loader_trace). */
static PyObject *loader_trace(LoaderObject *self, PyObject *args)
{
    unsigned int max;
    if (!PyArg_ParseTuple(args, "I:trace", &max))
        return NULL;
    ferry_loader *ld = usable(self);
    if (!ld)
        return NULL;
    int rc = ferry_loader_trace(ld, max);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    Py_RETURN_NONE;
}

static PyObject *loader_trace_write(LoaderObject *self, PyObject *args)
{
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:trace_write", PyUnicode_FSConverter, &path))
        return NULL;
    ferry_loader *ld = usable(self);
    int rc = ld ? ferry_loader_trace_write(ld, PyBytes_AS_STRING(path)) : FERRY_OK;
    Py_DECREF(path);
    if (!ld)
        return NULL;
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    Py_RETURN_NONE;
}

/* keep_slots(): see ferry_loader_keep_slots. */
static PyObject *loader_keep_slots(LoaderObject *self, PyObject *unused)
{
    ferry_loader *ld = usable(self);
    if (!ld)
        return NULL;
    int rc = ferry_loader_keep_slots(ld);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    Py_RETURN_NONE;
}

static PyObject *loader_get_release_hook(LoaderObject *self, void *unused)
{
    PyObject *hook = self->held && self->held->on_release ? self->held->on_release : Py_None;
    Py_INCREF(hook);
    return hook;
}

static int loader_set_release_hook(LoaderObject *self, PyObject *hook, void *unused)
{
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "the loader is not open");
        return -1;
    }
    if (hook && hook != Py_None && !PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "release_hook must be callable or None");
        return -1;
    }
    PyObject *old = self->held->on_release;
    self->held->on_release = hook && hook != Py_None ? Py_NewRef(hook) : NULL;
    Py_XDECREF(old);
    return 0;
}

static PyObject *loader_closed(LoaderObject *self, void *unused)
{
    return PyBool_FromLong(self->ld == NULL);
}

static PyMethodDef loader_methods[] = {
    {"next", (PyCFunction)loader_next, METH_VARARGS, "next(timeout_ms=-1) -> Batch or None"},
    {"close", (PyCFunction)loader_close, METH_NOARGS, "stop the workers and free everything"},
    {"length", (PyCFunction)loader_length, METH_NOARGS, "(items, batches_per_epoch)"},
    {"state", (PyCFunction)loader_state, METH_NOARGS, "resume blob (bytes)"},
    {"feed", (PyCFunction)loader_feed, METH_VARARGS,
     "feed(first_seq, counts, indices): the indices of the batches from first_seq on "
     "(option feed_batches)"},
    {"state_at_epoch", (PyCFunction)loader_state_at_epoch, METH_O,
     "resume blob (bytes) that starts at the first batch of an epoch"},
    {"skip_epoch", (PyCFunction)loader_skip_epoch, METH_NOARGS,
     "the rest of the current epoch never handed out; returns how many batches"},
    {"schema", (PyCFunction)loader_schema, METH_NOARGS, "[(name, dtype code, item shape)]"},
    {"stats", (PyCFunction)loader_stats, METH_VARARGS, "counters (dict); stats(False): "
                                                        "without handing over messages"},
    {"profile", (PyCFunction)loader_profile, METH_NOARGS, "a snapshot of the stage figures"},
    {"trace", (PyCFunction)loader_trace, METH_VARARGS, "trace(max_batches): keep the last"},
    {"trace_write", (PyCFunction)loader_trace_write, METH_VARARGS,
     "trace_write(path): write them as trace-event JSON"},
    {"worker_pid", (PyCFunction)loader_worker_pid, METH_VARARGS, "pid of local worker i"},
    {"exits_seen", (PyCFunction)loader_exits_seen, METH_NOARGS,
     "how many worker processes ferry has reaped so far (a position for worker_exit)"},
    {"worker_exit", (PyCFunction)loader_worker_exit, METH_VARARGS,
     "worker_exit(pid, since=0, timeout=0): the wait status worker process pid was reaped "
     "with (-1: unknown), or None if not reaped within timeout seconds (None: no limit); "
     "works after close()"},
    {"worker_host", (PyCFunction)loader_worker_host, METH_VARARGS,
     "(host, pid) of the remote worker in slot i, or None"},
    {"endpoint", (PyCFunction)loader_endpoint, METH_NOARGS, "bound tcp:// endpoint or None"},
    {"keep_slots", (PyCFunction)loader_keep_slots, METH_NOARGS,
     "slots keep their pages from now on (to register them with a device)"},
    {0},
};

static PyObject *loader_busy(LoaderObject *self, void *unused)
{
    return PyBool_FromLong(self->busy);
}

static PyObject *loader_in_order(LoaderObject *self, void *unused)
{
    return PyBool_FromLong(self->in_order);
}

static PyObject *loader_held(LoaderObject *self, void *unused)
{
    return PyLong_FromLong(self->held ? self->held->live : 0);
}

static PyMemberDef loader_members[] = {
    {"max_held", T_LONG, offsetof(LoaderObject, max_held), 0,
     "next() raises while this many batches are alive (0: no limit)"},
    {"wrap", T_OBJECT, offsetof(LoaderObject, wrap), 0,
     "callable(Batch) making what next() returns (None: the Batch itself); called inside "
     "next(), so that a signal handler raising there cannot drop a batch"},
    {"before_close", T_OBJECT, offsetof(LoaderObject, before_close), 0,
     "callable() run first by close(), and when the loader goes without one; None: none"},
    {0},
};

static PyGetSetDef loader_getset[] = {
    {"closed", (getter)loader_closed, NULL, "whether close() ran", NULL},
    {"held", (getter)loader_held, NULL, "batches delivered and still alive", NULL},
    {"busy", (getter)loader_busy, NULL, "a thread is waiting in next() or close()", NULL},
    {"in_order", (getter)loader_in_order, NULL, "batches come in sampler order", NULL},
    {"release_hook", (getter)loader_get_release_hook, (setter)loader_set_release_hook,
     "callable(SlotHold) given each dying batch that lies in a slot; the slot goes back when "
     "the SlotHold does. None: at once",
     NULL},
    {0},
};

static PyTypeObject LoaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Loader",
    .tp_basicsize = sizeof(LoaderObject),
    .tp_dealloc = (destructor)loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = loader_methods,
    .tp_members = loader_members,
    .tp_getset = loader_getset,
    .tp_init = (initproc)loader_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "Loader(options, state=None): a ferry_loader; ferry.Loader is the Python API.",
};

int ferry_py_loader_init(PyObject *m)
{
    if (ferry_py_batch_init(m) < 0 || ferry_py_add_type(m, "Loader", &LoaderType) < 0)
        return -1;
    return 0;
}
