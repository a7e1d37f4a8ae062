/*
 * pydataset.c - the worker's side of _ferry: the "python" dataset kind (the
 * worker program's main and the other process functions: pyprocess.c).
 *
 * A spec "python:MODULE:QUALNAME [JSON]" names a dataset class (or any
 * callable returning a dataset) and the keyword arguments to build it with.
 * ferry._dataset.open_dataset (Python) finds and builds it, applies the
 * remote allow-list, and reads the schema from item 0. This file is the
 * ferry_dataset_ops table around it: for each batch it calls the dataset
 * (get_batch(indices, epoch) when it has one, else __getitem__ per index)
 * and collates the items straight into the buffers the worker loop hands
 * it, one memcpy per field per item, checking each against the schema.
 * The item 0 the open built is kept until the first batch, which takes it
 * instead of building it again where ferry._dataset.reusable says it is
 * the same (a slow item 0 costs its time once, not twice).
 *
 * The worker loop runs with the GIL released; open takes it
 * (PyGILState_Ensure) and keeps the thread's Python state until close,
 * each batch takes the GIL back with that state, so the kind works in a
 * `python -m ferry.worker` process and in thread placement inside the
 * trainer alike, and thread-local data lives as long as the dataset.
 *
 * worker_info(): what a dataset may ask about the worker calling it (its
 * index, the seed, the epoch being built) is kept per thread, since thread
 * workers share the process.
 */
#include "pydataset.h"

#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ferry_dataset.h"

/* The collating functions return FERRY_OK, FERRY_EBATCH (a mismatch, with
 * the message written), or PYERR: a Python exception is set. */
#define PYERR (-1000)

typedef struct pyds {
    PyObject *obj;       /* the dataset */
    PyObject *get_batch; /* its bound get_batch, or NULL: __getitem__ per item */
    /* Its bound __ferry_fill__(indices, epoch, views), or NULL: the form
     * ferry.torch's datasets take (see fill_batch). */
    PyObject *fill;
    /* What fill gave the fields of variable shape, held until the next
     * batch: the worker copies it after get_batch returns. */
    Py_buffer held[FERRY_MAX_FIELDS];
    PyObject *held_obj[FERRY_MAX_FIELDS];
    uint64_t length;
    int layout;
    int nfields;
    ferry_field_spec fields[FERRY_MAX_FIELDS];
    PyObject *keys[FERRY_MAX_FIELDS]; /* LAYOUT_DICT: the item's keys */
    PyObject *keys_tuple;             /* the same, for messages */
    /* Item 0 as the open built it (a ferry._dataset.FirstItem), until the
     * first batch; NULL after, or when none was kept. */
    PyObject *first;
    /* The worker thread's Python state, kept from open to close so that
     * thread-local data (threading.local, contextvars) lives as long as
     * the dataset: a thread worker is a thread Python did not start. */
    PyGILState_STATE gil;
    PyThreadState *tstate;
    size_t item_bytes[FERRY_MAX_FIELDS];
    uint32_t worker, nworkers;
    uint64_t seed;
} pyds;

/* The calling worker, for worker_info(). */
static __thread struct {
    int active;
    uint32_t worker, nworkers;
    uint64_t seed, epoch;
} current;

/* The text of the exception being raised ("Type: message" and, with
 * traceback, the last frames), into buf; clears it. */
static void take_exception(char *buf, size_t len)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    PyObject *fn = ferry_py_import_attr("ferry._dataset", "describe_exception");
    PyObject *text = fn && value ? PyObject_CallFunction(fn, "On", value, (Py_ssize_t)len - 1)
                                 : NULL;
    const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
    if (!s) {
        PyErr_Clear();
        s = "the dataset raised an exception that could not be described";
    }
    snprintf(buf, len, "%s", s);
    Py_XDECREF(text);
    Py_XDECREF(fn);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* Whether the exception being raised is an IndexError (the dataset has no
 * such item: FERRY_ERANGE, like a plugin's answer). */
static int raising_index_error(void)
{
    return PyErr_ExceptionMatches(PyExc_IndexError);
}

/* Fills d's schema from the fields list open_dataset returned:
 * [(name, dtype, shape), ...]. */
static int read_schema(pyds *d, PyObject *fields, ferry_dataset_schema *schema, char *errbuf,
                       size_t errlen)
{
    memset(schema, 0, sizeof *schema);
    Py_ssize_t n = PyList_Size(fields);
    if (n < 1 || n > FERRY_MAX_FIELDS) {
        snprintf(errbuf, errlen, "python dataset: items have %zd fields (1-%d allowed)", n,
                 FERRY_MAX_FIELDS);
        return FERRY_EDATASET;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name;
        int dtype;
        PyObject *shape;
        Py_ssize_t reserve = 0;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, i), "siO|n", &name, &dtype, &shape,
                              &reserve))
            return -1;
        ferry_field_spec *f = &schema->fields[i];
        snprintf(f->name, sizeof f->name, "%s", name);
        f->dtype = (ferry_dtype)dtype;
        if (shape == Py_None) { /* of variable shape, reserving `reserve` bytes per item */
            f->ndim = FERRY_NDIM_VAR;
            f->shape[0] = reserve;
            d->item_bytes[i] = 0;
            d->fields[i] = *f;
            continue;
        }
        if (!PyTuple_Check(shape)) {
            PyErr_Format(PyExc_TypeError, "field '%s': shape must be a tuple or None", name);
            return -1;
        }
        f->ndim = (int)PyTuple_GET_SIZE(shape);
        if (f->ndim >= FERRY_MAX_DIMS) {
            snprintf(errbuf, errlen, "python dataset: field '%s' has %d dims (at most %d)", name,
                     f->ndim, FERRY_MAX_DIMS - 1);
            return FERRY_EDATASET;
        }
        size_t bytes = ferry_dtype_size(dtype);
        for (int k = 0; k < f->ndim; k++) {
            f->shape[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k));
            bytes *= (size_t)(f->shape[k] > 0 ? f->shape[k] : 0);
        }
        if (PyErr_Occurred())
            return -1;
        d->item_bytes[i] = bytes;
        d->fields[i] = *f;
        if (d->layout == LAYOUT_DICT && !(d->keys[i] = PyUnicode_FromString(name)))
            return -1;
    }
    schema->nfields = d->nfields = (int)n;
    if (d->layout == LAYOUT_DICT) {
        d->keys_tuple = PyTuple_New(n);
        if (!d->keys_tuple)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(d->keys[i]);
            PyTuple_SET_ITEM(d->keys_tuple, i, d->keys[i]);
        }
    }
    return FERRY_OK;
}

/* Says, for worker_info(), that this thread is d's worker, building a
 * batch of `epoch` with `seed`. */
static void set_current(const pyds *d, uint64_t seed, uint64_t epoch)
{
    current.active = 1;
    current.worker = d->worker;
    current.nworkers = d->nworkers;
    current.seed = seed;
    current.epoch = epoch;
}

/* Lets go of what fill gave for the last batch. */
static void release_held(pyds *d)
{
    for (int f = 0; f < FERRY_MAX_FIELDS; f++) {
        if (d->held_obj[f]) {
            PyBuffer_Release(&d->held[f]);
            Py_CLEAR(d->held_obj[f]);
        }
    }
}

static void pyds_free(pyds *d)
{
    release_held(d);
    Py_XDECREF(d->obj);
    Py_XDECREF(d->get_batch);
    Py_XDECREF(d->fill);
    Py_XDECREF(d->keys_tuple);
    Py_XDECREF(d->first);
    for (int i = 0; i < FERRY_MAX_FIELDS; i++)
        Py_XDECREF(d->keys[i]);
    PyMem_RawFree(d);
}

static int py_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                   ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = FERRY_EDATASET;
    pyds *d = PyMem_RawCalloc(1, sizeof *d);
    PyObject *res = NULL, *fields = NULL, *gb = NULL, *first = NULL;
    if (!d) {
        snprintf(errbuf, errlen, "python dataset: out of memory");
        rc = FERRY_ENOMEM;
        goto out;
    }
    d->worker = ctx->worker_index;
    d->nworkers = ctx->num_workers;
    d->seed = ctx->seed;
    set_current(d, d->seed, 0);
    PyObject *fn = ferry_py_import_attr("ferry._dataset", "open_dataset");
    res = fn ? PyObject_CallFunction(fn, "s", args) : NULL;
    Py_XDECREF(fn);
    unsigned long long length;
    if (!res || !PyArg_ParseTuple(res, "OKiO!OO", &d->obj, &length, &d->layout, &PyList_Type,
                                  &fields, &gb, &first)) {
        d->obj = NULL;
        take_exception(errbuf, errlen);
        goto out;
    }
    Py_INCREF(d->obj);
    if (first != Py_None) {
        Py_INCREF(first);
        d->first = first;
    }
    d->length = length;
    if (gb != Py_None) {
        Py_INCREF(gb);
        if (d->layout == LAYOUT_FILL)
            d->fill = gb;
        else
            d->get_batch = gb;
    }
    rc = read_schema(d, fields, schema, errbuf, errlen);
    if (rc < 0 && PyErr_Occurred()) {
        take_exception(errbuf, errlen);
        rc = FERRY_EDATASET;
    }
out:
    Py_XDECREF(res);
    if (rc == FERRY_OK) {
        /* Keep this thread's state (the Ensure stays open until close) and
         * let the GIL go. */
        d->gil = g;
        d->tstate = PyEval_SaveThread();
        *handle = d;
        return rc;
    }
    if (d)
        pyds_free(d);
    PyGILState_Release(g);
    return rc;
}

static uint64_t py_length(void *handle)
{
    return ((pyds *)handle)->length;
}

/* Attribute `name` of module `module`, looked up once and kept for the
 * process (a borrowed reference), or NULL with an exception. For the
 * functions called on every batch. */
static PyObject *cached_attr(PyObject **slot, const char *module, const char *name)
{
    if (!*slot)
        *slot = ferry_py_import_attr(module, name);
    return *slot;
}

/* numpy.asarray(x) (numpy.ascontiguousarray when `contiguous`); new ref. */
static PyObject *as_array(PyObject *x, int contiguous)
{
    static PyObject *fns[2];
    PyObject *fn = cached_attr(&fns[contiguous], "numpy",
                               contiguous ? "ascontiguousarray" : "asarray");
    return fn ? PyObject_CallOneArg(fn, x) : NULL;
}

/* A Python int, float or bool item in a scalar field of the matching dtype
 * (int64, float64, bool: what numpy would make of it), written without a
 * trip through numpy. 1 if written, 0 if x is not such a scalar, PYERR
 * (an int too large, say). */
static int copy_scalar(const ferry_field_spec *spec, PyObject *x, void *dst)
{
    if (spec->ndim != 0)
        return 0;
    if (PyBool_Check(x)) {
        if (spec->dtype != FERRY_DTYPE_BOOL)
            return 0;
        *(uint8_t *)dst = x == Py_True;
        return 1;
    }
    if (PyLong_CheckExact(x) && spec->dtype == FERRY_DTYPE_I64) {
        long long v = PyLong_AsLongLong(x);
        if (v == -1 && PyErr_Occurred())
            return PYERR;
        memcpy(dst, &v, sizeof v);
        return 1;
    }
    if (PyFloat_CheckExact(x) && spec->dtype == FERRY_DTYPE_F64) {
        double v = PyFloat_AS_DOUBLE(x);
        memcpy(dst, &v, sizeof v);
        return 1;
    }
    return 0;
}

/* The ferry dtype of a struct-module format ("<f", "l", "?"), or 0. */
static int format_dtype(const char *fmt, Py_ssize_t itemsize)
{
    if (!fmt)
        fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    if (!fmt[0] || fmt[1])
        return 0;
    switch (fmt[0]) {
    case 'B': return FERRY_DTYPE_U8;
    case 'b': return FERRY_DTYPE_I8;
    case 'H': return FERRY_DTYPE_U16;
    case 'h': return FERRY_DTYPE_I16;
    case 'I': return FERRY_DTYPE_U32;
    case 'i': return FERRY_DTYPE_I32;
    case 'L': return itemsize == 8 ? FERRY_DTYPE_U64 : FERRY_DTYPE_U32;
    case 'l': return itemsize == 8 ? FERRY_DTYPE_I64 : FERRY_DTYPE_I32;
    case 'Q': return FERRY_DTYPE_U64;
    case 'q': return FERRY_DTYPE_I64;
    case 'e': return FERRY_DTYPE_F16;
    case 'f': return FERRY_DTYPE_F32;
    case 'd': return FERRY_DTYPE_F64;
    case '?': return FERRY_DTYPE_BOOL;
    default: return 0;
    }
}

/* "float32 (3, 4)" for the message of a mismatch. */
static void describe(char *buf, size_t len, int dtype, int ndim, const Py_ssize_t *shape)
{
    const char *name = ferry_dtype_name(dtype);
    int n = snprintf(buf, len, "%s (", name ? name : "unsupported");
    for (int k = 0; k < ndim && n > 0 && (size_t)n < len; k++)
        n += snprintf(buf + n, len - (size_t)n, k ? ", %zd" : "%zd", shape[k]);
    if (n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ndim == 1 ? ",)" : ")");
}

/* Copies x, one item of field f (count < 0) or the whole field of `count`
 * items, into dst after checking its dtype and shape against the schema.
 * FERRY_OK; FERRY_EBATCH with err->message on a mismatch; PYERR. */
static int copy_field(const pyds *d, int f, PyObject *x, long long count, void *dst,
                      ferry_dataset_error *err)
{
    const ferry_field_spec *spec = &d->fields[f];
    if (count < 0) {
        int done = copy_scalar(spec, x, dst);
        if (done != 0)
            return done == 1 ? FERRY_OK : PYERR;
    }
    PyObject *arr = x;
    Py_INCREF(arr);
    Py_buffer v;
    /* x itself if it exports a C-contiguous buffer; else numpy.asarray(x)
     * (scalars, lists); a strided array is made contiguous. */
    for (int step = 0;; step++) {
        PyObject *next = NULL;
        if (PyObject_CheckBuffer(arr) && PyObject_GetBuffer(arr, &v, PyBUF_RECORDS_RO) == 0) {
            if (PyBuffer_IsContiguous(&v, 'C'))
                break;
            PyBuffer_Release(&v);
            next = step < 2 ? as_array(arr, 1) : NULL;
        } else {
            PyErr_Clear();
            next = step < 2 ? as_array(arr, 0) : NULL;
        }
        Py_DECREF(arr);
        if (!next) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "field '%s': %.100s is not an array", spec->name,
                             Py_TYPE(x)->tp_name);
            return PYERR;
        }
        arr = next;
    }
    int lead = count >= 0;
    int dtype = format_dtype(v.format, v.itemsize);
    int ok = dtype == (int)spec->dtype && v.ndim == spec->ndim + lead &&
             (!lead || v.shape[0] == count);
    for (int k = 0; ok && k < spec->ndim; k++)
        ok = v.shape[k + lead] == spec->shape[k];
    size_t want = d->item_bytes[f] * (size_t)(lead ? count : 1);
    if (ok && (size_t)v.len == want) {
        memcpy(dst, v.buf, want);
        PyBuffer_Release(&v);
        Py_DECREF(arr);
        return FERRY_OK;
    }
    char got[160], expect[160];
    Py_ssize_t eshape[FERRY_MAX_DIMS + 1];
    eshape[0] = (Py_ssize_t)count;
    for (int k = 0; k < spec->ndim; k++)
        eshape[k + lead] = (Py_ssize_t)spec->shape[k];
    describe(got, sizeof got, dtype, v.ndim, v.shape);
    describe(expect, sizeof expect, spec->dtype, spec->ndim + lead, eshape);
    if (dtype == 0)
        snprintf(got, sizeof got, "format '%s'", v.format ? v.format : "B");
    snprintf(err->message, sizeof err->message,
             "field '%s' %s is %s, but the dataset's schema (from item 0) says %s", spec->name,
             lead ? "of get_batch's result" : "of the item", got, expect);
    PyBuffer_Release(&v);
    Py_DECREF(arr);
    return FERRY_EBATCH;
}

/* Field f of x (an item, or get_batch's result): new reference or NULL
 * with an exception. */
static PyObject *pick(const pyds *d, PyObject *x, int f)
{
    switch (d->layout) {
    case LAYOUT_DICT:
        if (f == 0 && PyMapping_Check(x) && PyObject_Size(x) != d->nfields) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError,
                             "item has %zd fields, item 0 had %d (%R): every item needs the "
                             "same keys",
                             PyObject_Size(x), d->nfields, d->keys_tuple);
            return NULL;
        }
        return PyObject_GetItem(x, d->keys[f]);
    case LAYOUT_TUPLE:
        if (!PyTuple_Check(x) && !PyList_Check(x)) {
            PyErr_Format(PyExc_TypeError, "expected a tuple of %d fields, got %.100s",
                         d->nfields, Py_TYPE(x)->tp_name);
            return NULL;
        }
        if (PySequence_Size(x) != d->nfields) {
            PyErr_Format(PyExc_ValueError, "expected a tuple of %d fields, got %zd", d->nfields,
                         PySequence_Size(x));
            return NULL;
        }
        return PySequence_GetItem(x, f);
    default:
        Py_INCREF(x);
        return x;
    }
}

/* Copies every field of x into dst[f] + offset * item_bytes[f]. */
static int copy_fields(const pyds *d, PyObject *x, long long count, size_t offset,
                       void *const dst[], ferry_dataset_error *err)
{
    for (int f = 0; f < d->nfields; f++) {
        PyObject *v = pick(d, x, f);
        if (!v)
            return PYERR;
        int rc = copy_field(d, f, v, count, (char *)dst[f] + offset * d->item_bytes[f], err);
        Py_DECREF(v);
        if (rc != FERRY_OK)
            return rc;
    }
    return FERRY_OK;
}

/* The batch's indices as a read-only numpy uint64 array (new reference),
 * or NULL with an exception. */
static PyObject *indices_obj(const ferry_batch_request *req)
{
    PyObject *raw = PyBytes_FromStringAndSize((const char *)req->indices,
                                              (Py_ssize_t)(req->count * sizeof(uint64_t)));
    static PyObject *indices_array;
    PyObject *fn = raw ? cached_attr(&indices_array, "ferry._dataset", "indices_array") : NULL;
    PyObject *idx = fn ? PyObject_CallOneArg(fn, raw) : NULL;
    Py_XDECREF(raw);
    return idx;
}

/* get_batch(indices, epoch) with indices a read-only numpy uint64 array;
 * kept: that call's result kept from the open (borrowed), or NULL. */
static int whole_batch(pyds *d, const ferry_batch_request *req, void *const dst[],
                       ferry_dataset_error *err, PyObject *kept)
{
    err->index = req->count ? req->indices[0] : 0;
    PyObject *idx = kept ? NULL : indices_obj(req);
    PyObject *res = kept  ? (Py_INCREF(kept), kept)
                    : idx ? PyObject_CallFunction(d->get_batch, "OK", idx,
                                                  (unsigned long long)req->epoch)
                          : NULL;
    int rc = res ? copy_fields(d, res, (long long)req->count, 0, dst, err) : PYERR;
    Py_XDECREF(res);
    Py_XDECREF(idx);
    return rc;
}

/* __getitem__ for each index, each item collated into its place; kept:
 * the first item kept from the open (borrowed), or NULL. */
static int item_by_item(pyds *d, const ferry_batch_request *req, void *const dst[],
                        ferry_dataset_error *err, PyObject *kept)
{
    for (size_t k = 0; k < req->count; k++) {
        err->index = req->indices[k];
        PyObject *i = k == 0 && kept ? NULL : PyLong_FromUnsignedLongLong(req->indices[k]);
        PyObject *item = k == 0 && kept ? (Py_INCREF(kept), kept)
                         : i            ? PyObject_GetItem(d->obj, i)
                                        : NULL;
        Py_XDECREF(i);
        if (!item)
            return PYERR;
        int rc = copy_fields(d, item, -1, k, dst, err);
        Py_DECREF(item);
        if (rc != FERRY_OK)
            return rc;
    }
    return FERRY_OK;
}

/* One field of variable shape from what fill returned: its buffer, held
 * in d until the next batch, described in *out. */
static int take_var(pyds *d, int f, PyObject *x, ferry_var_field *out, ferry_dataset_error *err)
{
    const ferry_field_spec *spec = &d->fields[f];
    Py_buffer *v = &d->held[f];
    if (PyObject_GetBuffer(x, v, PyBUF_RECORDS_RO) != 0)
        return PYERR;
    int dtype = format_dtype(v->format, v->itemsize);
    if (!PyBuffer_IsContiguous(v, 'C') || dtype != (int)spec->dtype || v->ndim < 1 ||
        v->ndim > FERRY_MAX_DIMS) {
        char got[160];
        describe(got, sizeof got, dtype, v->ndim, v->shape);
        snprintf(err->message, sizeof err->message,
                 "field '%s' (of variable shape) is %s%s; the schema says %s, 1..%d dims, "
                 "C-contiguous",
                 spec->name, got, PyBuffer_IsContiguous(v, 'C') ? "" : ", not C-contiguous",
                 ferry_dtype_name(spec->dtype), FERRY_MAX_DIMS);
        PyBuffer_Release(v);
        return FERRY_EBATCH;
    }
    Py_INCREF(x);
    d->held_obj[f] = x;
    out->data = v->buf;
    out->ndim = v->ndim;
    for (int k = 0; k < v->ndim; k++)
        out->shape[k] = (int64_t)v->shape[k];
    return FERRY_OK;
}

/* __ferry_fill__(indices, epoch, views): views[f] is a writable
 * memoryview of the batch's room for fixed field f (count items, in the
 * batch slot itself: what fill writes there needs no copy), None for a
 * field of variable shape; fill returns a sequence giving an array for each
 * field of variable shape (anything for the others). */
static int fill_batch(pyds *d, const ferry_batch_request *req, void *const dst[],
                      ferry_dataset_error *err)
{
    err->index = req->count ? req->indices[0] : 0;
    PyObject *views = PyList_New(d->nfields), *res = NULL, *idx = NULL, *seq = NULL;
    PyObject *et, *ev, *etb; /* the exception being raised, kept across the views' release */
    int rc = PYERR;
    for (int f = 0; views && f < d->nfields; f++) {
        PyObject *mv = d->fields[f].ndim == FERRY_NDIM_VAR
                           ? (Py_INCREF(Py_None), Py_None)
                           : PyMemoryView_FromMemory(dst[f],
                                                     (Py_ssize_t)(d->item_bytes[f] * req->count),
                                                     PyBUF_WRITE);
        if (!mv)
            goto out;
        PyList_SET_ITEM(views, f, mv);
    }
    idx = views ? indices_obj(req) : NULL;
    res = idx ? PyObject_CallFunction(d->fill, "OKO", idx, (unsigned long long)req->epoch, views)
              : NULL;
    seq = res ? PySequence_Fast(res, "__ferry_fill__ must return a sequence") : NULL;
    if (!seq)
        goto out;
    if (PySequence_Fast_GET_SIZE(seq) != d->nfields) {
        PyErr_Format(PyExc_ValueError, "__ferry_fill__ returned %zd fields, the schema has %d",
                     PySequence_Fast_GET_SIZE(seq), d->nfields);
        goto out;
    }
    rc = FERRY_OK;
    for (int f = 0; rc == FERRY_OK && f < d->nfields; f++)
        if (d->fields[f].ndim == FERRY_NDIM_VAR)
            rc = take_var(d, f, PySequence_Fast_GET_ITEM(seq, f), dst[f], err);
out:
    /* The views of the batch slot end with the call: a dataset keeping one
     * keeps a released view, not the memory of a batch in the trainer's
     * hands. The exception being raised, if any, is kept across. */
    PyErr_Fetch(&et, &ev, &etb);
    for (Py_ssize_t f = 0; views && f < PyList_GET_SIZE(views); f++) {
        PyObject *mv = PyList_GET_ITEM(views, f);
        if (mv && mv != Py_None) {
            PyObject *r = PyObject_CallMethod(mv, "release", NULL);
            if (!r)
                PyErr_Clear(); /* still exported (an array kept by the dataset) */
            Py_XDECREF(r);
        }
    }
    PyErr_Restore(et, ev, etb);
    Py_XDECREF(views);
    Py_XDECREF(seq);
    Py_XDECREF(res);
    Py_XDECREF(idx);
    return rc;
}

/* The index a fill failed on, when its exception says (_ferry_index, set
 * by ferry.torch as an item fails), into err; the exception stays. */
static void failed_index(ferry_dataset_error *err)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *i = value ? PyObject_GetAttrString(value, "_ferry_index") : NULL;
    if (i && PyLong_Check(i)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(i);
        if (!(v == (unsigned long long)-1 && PyErr_Occurred()))
            err->index = v;
    }
    Py_XDECREF(i);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

/* What the first batch takes from the item 0 the open built: a new
 * reference, or NULL (build it) when ferry._dataset.reusable says no or
 * cannot say. d->first goes either way. */
static PyObject *take_first(pyds *d, const ferry_batch_request *req)
{
    PyObject *first = d->first;
    d->first = NULL;
    static PyObject *reusable;
    PyObject *fn = cached_attr(&reusable, "ferry._dataset", "reusable");
    PyObject *idx = fn ? indices_obj(req) : NULL;
    PyObject *item = idx ? PyObject_CallFunction(fn, "OOK", first, idx,
                                                 (unsigned long long)req->epoch)
                         : NULL;
    Py_XDECREF(idx);
    Py_DECREF(first);
    if (!item || item == Py_None) {
        PyErr_Clear(); /* built again, as without it */
        Py_XDECREF(item);
        return NULL;
    }
    return item;
}

static int py_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                        ferry_dataset_error *err)
{
    pyds *d = handle;
    PyEval_RestoreThread(d->tstate);
    set_current(d, req->seed, req->epoch);
    err->message[0] = '\0';
    release_held(d);
    PyObject *kept = d->first ? take_first(d, req) : NULL;
    int rc = d->fill        ? fill_batch(d, req, dst, err)
             : d->get_batch ? whole_batch(d, req, dst, err, kept)
                            : item_by_item(d, req, dst, err, kept);
    Py_XDECREF(kept);
    if (rc == PYERR) {
        rc = raising_index_error() ? FERRY_ERANGE : FERRY_EBATCH;
        if (d->fill)
            failed_index(err);
        /* Room left for what the loader puts before it (the worker, the index). */
        take_exception(err->message, sizeof err->message - 256);
    }
    d->tstate = PyEval_SaveThread();
    return rc;
}

static void py_close(void *handle)
{
    pyds *d = handle;
    PyEval_RestoreThread(d->tstate);
    PyGILState_STATE g = d->gil;
    PyObject *close = PyObject_GetAttrString(d->obj, "close");
    if (close && PyCallable_Check(close)) {
        PyObject *r = PyObject_CallNoArgs(close);
        Py_XDECREF(r);
    }
    Py_XDECREF(close);
    PyErr_Clear();
    pyds_free(d);
    current.active = 0;
    PyGILState_Release(g);
}

static const ferry_dataset_ops python_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "python",
    .open = py_open,
    .length = py_length,
    .get_batch = py_get_batch,
    .close = py_close,
};

/* ------------------------------------------------------ worker_info */

/* worker_state() -> (worker, num_workers, seed, epoch) in a worker that is
 * building a batch (or opening its dataset), else None. */
static PyObject *worker_state(PyObject *self, PyObject *unused)
{
    if (!current.active)
        Py_RETURN_NONE;
    return Py_BuildValue("(IIKK)", current.worker, current.nworkers,
                         (unsigned long long)current.seed, (unsigned long long)current.epoch);
}


PyMethodDef ferry_py_worker_methods[] = {
    {"worker_state", worker_state, METH_NOARGS,
     "(worker, num_workers, seed, epoch) inside a worker, else None"},
    {0},
};

int ferry_py_worker_init(PyObject *m)
{
    if (ferry_dataset_register(&python_ops) != FERRY_OK) {
        PyErr_SetString(PyExc_RuntimeError, ferry_last_error());
        return -1;
    }
    return 0;
}
