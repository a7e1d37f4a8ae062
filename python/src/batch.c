/*
 * batch.c - a batch as the trainer holds it (see batch.h). A Batch owns one
 * ferry_batch; each field is handed out as a View, an object with the
 * buffer protocol whose memory is the batch's (no copy). numpy arrays made
 * from a View keep it alive, and it keeps the Batch alive: the batch's
 * memory goes back when the last array made from it is gone. A batch that
 * lies in a slot may be handed, as it dies, to the loader's release hook
 * inside a SlotHold (pinned memory a device copy still reads). Batches may
 * die on any thread.
 */
#include "batch.h"

#include <structmember.h>

static PyTypeObject ViewType, SlotHoldType;

void ferry_py_held_drop(held_count *h)
{
    if (h && --h->owners == 0) {
        Py_XDECREF(h->on_release);
        PyMem_Free(h);
    }
}

/* A buffer over part of a batch's memory: one field, or the indices. */
typedef struct {
    PyObject_HEAD BatchObject *batch;
    void *data;
    const char *format;
    Py_ssize_t itemsize, len;
    int ndim;
    Py_ssize_t shape[FERRY_MAX_DIMS + 1];
    Py_ssize_t strides[FERRY_MAX_DIMS + 1];
} ViewObject;

/* ---------------------------------------------------------------- View */

/* The struct-module format of a ferry dtype (numpy reads these). */
static const char *dtype_format(int dtype)
{
    switch (dtype) {
    case FERRY_DTYPE_U8: return "B";
    case FERRY_DTYPE_I8: return "b";
    case FERRY_DTYPE_U16: return "H";
    case FERRY_DTYPE_I16: return "h";
    case FERRY_DTYPE_U32: return "I";
    case FERRY_DTYPE_I32: return "i";
    case FERRY_DTYPE_U64: return "Q";
    case FERRY_DTYPE_I64: return "q";
    case FERRY_DTYPE_F16: return "e";
    case FERRY_DTYPE_F32: return "f";
    case FERRY_DTYPE_F64: return "d";
    case FERRY_DTYPE_BOOL: return "?";
    default: return NULL;
    }
}

/* A View of ndim dims over data, C order. New reference, or NULL. */
static PyObject *view_new(BatchObject *batch, void *data, const char *format, size_t itemsize,
                          int ndim, const int64_t *shape)
{
    ViewObject *v = PyObject_New(ViewObject, &ViewType);
    if (!v)
        return NULL;
    Py_INCREF(batch);
    v->batch = batch;
    v->data = data;
    v->format = format;
    v->itemsize = (Py_ssize_t)itemsize;
    v->ndim = ndim;
    Py_ssize_t stride = (Py_ssize_t)itemsize;
    for (int d = ndim - 1; d >= 0; d--) {
        v->shape[d] = (Py_ssize_t)shape[d];
        v->strides[d] = stride;
        stride *= (Py_ssize_t)shape[d];
    }
    v->len = stride;
    return (PyObject *)v;
}

static void view_dealloc(ViewObject *v)
{
    Py_XDECREF(v->batch);
    PyObject_Free(v);
}

/* The batch's memory is the trainer's alone while it holds the batch (a
 * received message, or a slot that no worker writes into until the batch
 * is released; a forked child gets its own copy, see transport/shm.c), so
 * the buffer is writable: torch.from_numpy and in-place normalisation need
 * that. */
static int view_getbuffer(ViewObject *v, Py_buffer *view, int flags)
{
    view->buf = v->data;
    view->obj = (PyObject *)v;
    Py_INCREF(v);
    view->len = v->len;
    view->readonly = 0;
    view->itemsize = v->itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)v->format : NULL;
    view->ndim = v->ndim;
    view->shape = (flags & PyBUF_ND) ? v->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) ? v->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    if (!(flags & PyBUF_ND)) /* a plain run of bytes */
        view->ndim = 1;
    return 0;
}

static PyBufferProcs view_as_buffer = {.bf_getbuffer = (getbufferproc)view_getbuffer};

static PyTypeObject ViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.View",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)view_dealloc,
    .tp_as_buffer = &view_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The memory of one field of a batch, for numpy.asarray (no copy).",
};

/* --------------------------------------------------------------- Batch */

/* ------------------------------------------------------------ SlotHold */

/* A dead batch's slot, not yet given back: the trainer's release hook
 * keeps it until the device has finished copying from the slot. */
typedef struct {
    PyObject_HEAD ferry_batch *b;
} SlotHoldObject;

static void slot_hold_dealloc(SlotHoldObject *h)
{
    ferry_batch_release(h->b);
    PyObject_Free(h);
}

static PyTypeObject SlotHoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.SlotHold",
    .tp_basicsize = sizeof(SlotHoldObject),
    .tp_dealloc = (destructor)slot_hold_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A released batch's slot, given back to the loader when this object goes.",
};

/* Calls hook(arg) (hook() when arg is NULL) where no exception may
 * propagate (a destructor, close): a failure is reported as unraisable, as
 * from __del__. The caller has set aside any exception pending. */
void ferry_py_call_hook(PyObject *hook, PyObject *arg)
{
    Py_INCREF(hook); /* the call may replace the attribute that holds it */
    PyObject *r = arg ? PyObject_CallOneArg(hook, arg) : PyObject_CallNoArgs(hook);
    if (!r)
        PyErr_WriteUnraisable(hook);
    Py_XDECREF(r);
    Py_DECREF(hook);
}

/* Hands a dying batch in a slot to on_release inside a SlotHold; the slot
 * goes back when that does (at once if the hook keeps nothing, or fails:
 * the failure is reported as unraisable, as from __del__). Returns 0 when
 * no SlotHold could be made: the caller releases the batch itself. */
static int hold_slot(PyObject *on_release, ferry_batch *b)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    SlotHoldObject *h = PyObject_New(SlotHoldObject, &SlotHoldType);
    if (!h) {
        PyErr_Restore(type, value, tb);
        return 0;
    }
    h->b = b;
    ferry_py_call_hook(on_release, (PyObject *)h);
    Py_DECREF(h);
    PyErr_Restore(type, value, tb);
    return 1;
}

static void batch_dealloc(BatchObject *b)
{
    held_count *held = b->held;
    if (held)
        held->live--;
    if (!(held && held->on_release && b->slot && hold_slot(held->on_release, b->b)))
        ferry_batch_release(b->b);
    ferry_py_held_drop(held);
    PyObject_Free(b);
}

/* Batch.slot() -> (address, bytes) of the shared-memory slot the batch
 * lies in, or None (see ferry_batch_slot). */
static PyObject *batch_slot(BatchObject *b, PyObject *unused)
{
    if (!b->slot)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)b->slot,
                         (unsigned long long)b->slot_len);
}

/* Batch.fields() -> ((name, View), ...) in the schema's order. */
static PyObject *batch_fields(BatchObject *b, PyObject *unused)
{
    int n = ferry_batch_nfields(b->b);
    PyObject *out = PyTuple_New(n);
    for (int i = 0; out && i < n; i++) {
        ferry_tensor t;
        if (ferry_batch_field_at(b->b, i, &t) != FERRY_OK) {
            Py_DECREF(out);
            return ferry_py_raise(FERRY_EINVAL, ferry_last_error());
        }
        PyObject *view = view_new(b, (void *)t.data, dtype_format(t.dtype),
                                  ferry_dtype_size(t.dtype), t.ndim, t.shape);
        PyObject *pair = view ? Py_BuildValue("(sN)", t.name, view) : NULL;
        if (!pair) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, pair);
    }
    return out;
}

/* Batch.indices() -> View of the sample indices (uint64). */
static PyObject *batch_indices(BatchObject *b, PyObject *unused)
{
    int64_t n = b->info.size;
    return view_new(b, (void *)ferry_batch_indices(b->b), "Q", sizeof(uint64_t), 1, &n);
}

static PyMethodDef batch_methods[] = {
    {"fields", (PyCFunction)batch_fields, METH_NOARGS, "((name, View), ...)"},
    {"indices", (PyCFunction)batch_indices, METH_NOARGS, "View of the sample indices"},
    {"slot", (PyCFunction)batch_slot, METH_NOARGS, "(address, bytes) of its slot, or None"},
    {0},
};

#define INFO_GETTER(field, conv)                                                                   \
    static PyObject *batch_get_##field(BatchObject *b, void *unused)                               \
    {                                                                                              \
        return conv(b->info.field);                                                                \
    }
INFO_GETTER(epoch, PyLong_FromUnsignedLongLong)
INFO_GETTER(batch_in_epoch, PyLong_FromUnsignedLongLong)
INFO_GETTER(seq, PyLong_FromUnsignedLongLong)
INFO_GETTER(size, PyLong_FromUnsignedLong)
INFO_GETTER(last_in_epoch, PyBool_FromLong)
INFO_GETTER(worker, PyLong_FromUnsignedLong)
INFO_GETTER(attempts, PyLong_FromUnsignedLong)

/* Durations in seconds, as Python's time functions give them. */
static PyObject *seconds_from_ns(uint64_t ns)
{
    return PyFloat_FromDouble((double)ns * 1e-9);
}
INFO_GETTER(make_ns, seconds_from_ns)
INFO_GETTER(flight_ns, seconds_from_ns)
INFO_GETTER(ready_ns, seconds_from_ns)

static PyGetSetDef batch_getset[] = {
    {"epoch", (getter)batch_get_epoch, NULL, "epoch of the batch, from 0", NULL},
    {"batch_in_epoch", (getter)batch_get_batch_in_epoch, NULL, "position in its epoch", NULL},
    {"seq", (getter)batch_get_seq, NULL, "position in the whole stream", NULL},
    {"size", (getter)batch_get_size, NULL, "items in the batch", NULL},
    {"last_in_epoch", (getter)batch_get_last_in_epoch, NULL, "the last batch of its epoch", NULL},
    {"worker", (getter)batch_get_worker, NULL, "index of the worker that built it", NULL},
    {"attempts", (getter)batch_get_attempts, NULL, "workers it was sent to", NULL},
    {"make_time", (getter)batch_get_make_ns, NULL, "seconds its worker took to make it", NULL},
    {"flight_time", (getter)batch_get_flight_ns, NULL, "seconds from dispatch to arrival", NULL},
    {"ready_time", (getter)batch_get_ready_ns, NULL, "seconds it waited for the trainer", NULL},
    {0},
};

PyTypeObject ferry_py_BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
    .tp_doc = "One batch as ferry delivered it; ferry.Batch is the mapping over it.",
};

int ferry_py_batch_init(PyObject *m)
{
    if (ferry_py_add_type(m, "Batch", &ferry_py_BatchType) < 0 ||
        ferry_py_add_type(m, "View", &ViewType) < 0 ||
        ferry_py_add_type(m, "SlotHold", &SlotHoldType) < 0)
        return -1;
    return 0;
}
