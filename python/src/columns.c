/*
 * columns.c - the hot loops of ferry._shared in C: a dataset's big list of
 * dicts taken apart into columns, a list of str packed into one UTF-8 blob
 * with its offsets, and the open-addressing table a SharedDict finds its
 * str keys with (built once in the trainer, read in every worker); and the
 * two common shapes (a list of dicts of str/int/float fields, a dict of
 * str keys) encoded in one pass each, with no list in between.
 *
 * Each is what _shared.py does in Python, 5-10x faster: encoding a list of
 * a million {"path", "label"} dicts took 0.3 s in Python, most of a
 * loader's start. Nothing here keeps state; every function is given the
 * objects or buffers it works on. The table's hash (key_hash) is of the
 * key's UTF-8 bytes: the same in every process, where str's own hash is
 * salted per interpreter. The one-pass encoders take no reference and
 * never ask a str for its UTF-8 (a copy it would keep): they write none
 * of the objects they read.
 */
#include "pyhelp.h"

#include <stdint.h>
#include <string.h>

/* The table's hash of a key's bytes: eight bytes at a time, each word
 * mixed in by a multiply, then a final avalanche so that the low bits
 * (the slot) depend on every byte. The same in every process (str's own
 * hash is salted per interpreter). */
static uint64_t key_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
    }
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* A table of int64 slots (position + 1; 0: empty), a power of two >= 2n
 * of them, linear probing, filled from the keys' hashes. The slots are
 * fetched a block ahead: a table past the caches costs a miss a key
 * otherwise (a million keys: 16 MiB). */
static void fill_table(int64_t *t, uint64_t size, const uint64_t *hashes, Py_ssize_t n)
{
    enum { AHEAD = 16 };
    memset(t, 0, size * sizeof *t);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            __builtin_prefetch(&t[hashes[i + AHEAD] & (size - 1)], 1);
        uint64_t slot = hashes[i] & (size - 1);
        while (t[slot])
            slot = (slot + 1) & (size - 1);
        t[slot] = i + 1;
    }
}

static uint64_t table_size(Py_ssize_t n)
{
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n)
        size *= 2;
    return size;
}

/* k lists of n items each, the items still to be set (NULL until then: a
 * list's dealloc skips them). */
static PyObject *new_columns(Py_ssize_t k, Py_ssize_t n)
{
    PyObject *cols = PyList_New(k);
    for (Py_ssize_t j = 0; cols && j < k; j++) {
        PyObject *c = PyList_New(n);
        if (!c) {
            Py_CLEAR(cols);
            break;
        }
        PyList_SET_ITEM(cols, j, c);
    }
    return cols;
}

/* dict_columns(items, keys) -> [column per key] (lists), or None when some
 * item is not a dict (exactly) with exactly these keys in this order. */
static PyObject *dict_columns(PyObject *self, PyObject *args)
{
    PyObject *items, *keys;
    if (!PyArg_ParseTuple(args, "O!O!:dict_columns", &PyList_Type, &items, &PyTuple_Type, &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), k = PyTuple_GET_SIZE(keys);
    PyObject *cols = new_columns(k, n);
    if (!cols)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(items, i);
        if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != k)
            goto other;
        Py_ssize_t pos = 0, j = 0;
        PyObject *key, *value;
        while (PyDict_Next(d, &pos, &key, &value)) {
            PyObject *want = PyTuple_GET_ITEM(keys, j);
            /* Keys compared here only when both are exact str (no __eq__ of
             * a user's runs, and 1, True and 1.0 stay apart): anything else
             * takes the Python path. */
            if (key != want && (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(want) ||
                                PyUnicode_Compare(key, want) != 0))
                goto other;
            Py_INCREF(value);
            PyList_SET_ITEM(PyList_GET_ITEM(cols, j), i, value);
            j++;
        }
    }
    return cols;
other:
    Py_DECREF(cols); /* a list's unset items are NULL: its dealloc skips them */
    Py_RETURN_NONE;
}

/* tuple_columns(items, width) -> [column per place] (lists), or None when
 * some item is not a tuple (exactly) of that width. */
static PyObject *tuple_columns(PyObject *self, PyObject *args)
{
    PyObject *items;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "O!n:tuple_columns", &PyList_Type, &items, &k))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *cols = new_columns(k, n);
    if (!cols)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != k) {
            Py_DECREF(cols);
            Py_RETURN_NONE;
        }
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *v = PyTuple_GET_ITEM(t, j);
            Py_INCREF(v);
            PyList_SET_ITEM(PyList_GET_ITEM(cols, j), i, v);
        }
    }
    return cols;
}

/* int_column(values) -> bytes of n int64, or None when some value is not
 * an int (exactly: not a bool) or does not fit 64 bits. */
static PyObject *int_column(PyObject *self, PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "int_column takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!out)
        return NULL;
    int64_t *v = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(arg, i);
        int overflow = 0;
        long long y = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : 0;
        if (!PyLong_CheckExact(x) || overflow || (y == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        v[i] = (int64_t)y;
    }
    return out;
}

/* str_column(values) -> (blob bytes, ends bytes of n+1 int64), or None when
 * some value is not an ASCII str (exactly): the Python path takes those. */
static PyObject *str_column(PyObject *self, PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "str_column takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *ends = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t));
    if (!ends)
        return NULL;
    int64_t *e = (int64_t *)PyBytes_AS_STRING(ends);
    e[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* ASCII only, read where it lies: asking a str for its UTF-8 would
         * make it keep a copy for as long as it lives (the Python path
         * encodes the others into the blob alone). */
        PyObject *s = PyList_GET_ITEM(arg, i);
        if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) {
            Py_DECREF(ends);
            Py_RETURN_NONE;
        }
        e[i + 1] = e[i] + PyUnicode_GET_LENGTH(s);
    }
    PyObject *blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)e[n]);
    if (!blob) {
        Py_DECREF(ends);
        return NULL;
    }
    char *b = PyBytes_AS_STRING(blob);
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy(b + e[i], PyUnicode_DATA(PyList_GET_ITEM(arg, i)), (size_t)(e[i + 1] - e[i]));
    PyObject *out = PyTuple_Pack(2, blob, ends);
    Py_DECREF(blob);
    Py_DECREF(ends);
    return out;
}

typedef struct strings {
    Py_buffer blob, ends;
    Py_ssize_t n;
} strings;

static int get_strings(PyObject *blob, PyObject *ends, strings *s)
{
    if (PyObject_GetBuffer(blob, &s->blob, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(ends, &s->ends, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->blob);
        return -1;
    }
    s->n = s->ends.len / (Py_ssize_t)sizeof(int64_t) - 1;
    if (s->n < 0 || s->ends.len % (Py_ssize_t)sizeof(int64_t)) {
        PyBuffer_Release(&s->blob);
        PyBuffer_Release(&s->ends);
        PyErr_SetString(PyExc_ValueError, "a string column's ends are not int64 offsets");
        return -1;
    }
    return 0;
}

static void put_strings(strings *s)
{
    PyBuffer_Release(&s->blob);
    PyBuffer_Release(&s->ends);
}

/* The key at position i of a string column (bounds checked against the
 * blob: the column came through a pickle). */
static int key_at(const strings *s, Py_ssize_t i, const unsigned char **p, size_t *n)
{
    const int64_t *e = s->ends.buf;
    if (e[i] < 0 || e[i + 1] < e[i] || e[i + 1] > s->blob.len)
        return -1;
    *p = (const unsigned char *)s->blob.buf + e[i];
    *n = (size_t)(e[i + 1] - e[i]);
    return 0;
}

/* str_index(blob, ends) -> table bytes: int64 slots (position + 1; 0:
 * empty), a power of two >= 2n of them, linear probing from the key's
 * hash (key_hash). */
static PyObject *str_index(PyObject *self, PyObject *args)
{
    PyObject *blob_o, *ends_o;
    strings s;
    if (!PyArg_ParseTuple(args, "OO:str_index", &blob_o, &ends_o) ||
        get_strings(blob_o, ends_o, &s) < 0)
        return NULL;
    uint64_t size = table_size(s.n);
    uint64_t *hashes = PyMem_RawMalloc(((size_t)s.n + 1) * sizeof *hashes);
    PyObject *table = hashes ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size * sizeof(int64_t)))
                             : PyErr_NoMemory();
    if (!table) {
        PyMem_RawFree(hashes);
        put_strings(&s);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < s.n; i++) {
        const unsigned char *p;
        size_t n;
        if (key_at(&s, i, &p, &n) < 0) {
            PyMem_RawFree(hashes);
            put_strings(&s);
            Py_DECREF(table);
            PyErr_SetString(PyExc_ValueError, "a string column's ends lie outside its blob");
            return NULL;
        }
        hashes[i] = key_hash(p, n);
    }
    fill_table((int64_t *)PyBytes_AS_STRING(table), size, hashes, s.n);
    PyMem_RawFree(hashes);
    put_strings(&s);
    return table;
}

/* str_find(table, blob, ends, key) -> the key's position, or -1. */
static PyObject *str_find(PyObject *self, PyObject *args)
{
    PyObject *table_o, *blob_o, *ends_o, *key;
    if (!PyArg_ParseTuple(args, "OOOU:str_find", &table_o, &blob_o, &ends_o, &key))
        return NULL;
    /* Only ASCII keys are packed here (str_column): any other is none of them. */
    if (!PyUnicode_IS_ASCII(key))
        return PyLong_FromLong(-1);
    Py_ssize_t klen = PyUnicode_GET_LENGTH(key);
    const char *k = PyUnicode_DATA(key);
    Py_buffer tb;
    strings s;
    if (PyObject_GetBuffer(table_o, &tb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (get_strings(blob_o, ends_o, &s) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    const int64_t *t = tb.buf;
    uint64_t size = (uint64_t)tb.len / sizeof *t, found = 0;
    if (size && !(size & (size - 1))) {
        uint64_t slot = key_hash((const unsigned char *)k, (size_t)klen) & (size - 1);
        for (uint64_t probes = 0; probes < size && t[slot]; probes++) {
            const unsigned char *p;
            size_t n;
            int64_t at = t[slot] - 1;
            if (at >= 0 && at < s.n && key_at(&s, at, &p, &n) == 0 && n == (size_t)klen &&
                memcmp(p, k, n) == 0) {
                found = (uint64_t)at + 1;
                break;
            }
            slot = (slot + 1) & (size - 1);
        }
    }
    put_strings(&s);
    PyBuffer_Release(&tb);
    return PyLong_FromLongLong(found ? (long long)found - 1 : -1);
}

/* ------------------------------------------------------------------------
 * One pass each: a list of dicts, a dict of str keys
 */

/* A column a one-pass encoder packs: ASCII str (exact), int (exact, 64
 * bits), float (exact). A value of any other kind sends the whole
 * collection down the Python path, which knows them all. */
enum { COL_STR, COL_INT, COL_FLOAT };

typedef struct col {
    int kind;
    /* bytes objects, written in place and handed out as they are */
    PyObject *blob; /* COL_STR: the bytes end to end (resized as it grows) */
    size_t len, cap;
    PyObject *ends; /* COL_STR: n + 1 int64 offsets */
    PyObject *vals; /* COL_INT: int64, COL_FLOAT: double; n */
} col;

static int col_kind(PyObject *v)
{
    if (PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v))
        return COL_STR;
    if (PyLong_CheckExact(v))
        return COL_INT;
    if (PyFloat_CheckExact(v))
        return COL_FLOAT;
    return -1;
}

static void col_close(col *c)
{
    Py_XDECREF(c->blob);
    Py_XDECREF(c->ends);
    Py_XDECREF(c->vals);
    memset(c, 0, sizeof *c);
}

/* A column of n values of the kind of v (kind -1: none fits); -1 with an
 * error set. */
static int col_open(col *c, PyObject *v, Py_ssize_t n)
{
    memset(c, 0, sizeof *c);
    c->kind = col_kind(v);
    if (c->kind == COL_STR) {
        /* room for n like the first, a quarter more (a copy to grow is
         * the blob's size again), but no more than 64 bytes an item: one
         * long first value must not ask for n of its size */
        size_t first = (size_t)PyUnicode_GET_LENGTH(v), each = first + first / 4 + 4;
        c->cap = (size_t)n * (each < 64 ? each : 64) + 64;
        c->blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)c->cap);
        c->ends = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t));
        if (!c->blob || !c->ends)
            goto fail;
        ((int64_t *)PyBytes_AS_STRING(c->ends))[0] = 0;
    } else if (c->kind >= 0) {
        c->vals = PyBytes_FromStringAndSize(NULL, n * 8);
        if (!c->vals)
            goto fail;
    }
    return 0;
fail:
    col_close(c);
    return -1;
}

/* Value i of the column: 0, 1 when v does not fit it (another kind, a
 * non-ASCII str, an int past 64 bits), -1 with an error set. */
static int col_put(col *c, Py_ssize_t i, PyObject *v)
{
    switch (c->kind) {
    case COL_STR: {
        if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v))
            return 1;
        size_t n = (size_t)PyUnicode_GET_LENGTH(v);
        if (c->len + n > c->cap) {
            size_t cap = c->cap * 2 > c->len + n ? c->cap * 2 : c->len + n;
            if (_PyBytes_Resize(&c->blob, (Py_ssize_t)cap) < 0)
                return -1; /* c->blob is NULL now */
            c->cap = cap;
        }
        memcpy(PyBytes_AS_STRING(c->blob) + c->len, PyUnicode_DATA(v), n);
        c->len += n;
        ((int64_t *)PyBytes_AS_STRING(c->ends))[i + 1] = (int64_t)c->len;
        return 0;
    }
    case COL_INT: {
        if (!PyLong_CheckExact(v))
            return 1;
        int overflow = 0;
        long long y = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (y == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 1;
        }
        ((int64_t *)PyBytes_AS_STRING(c->vals))[i] = (int64_t)y;
        return 0;
    }
    case COL_FLOAT:
        if (!PyFloat_CheckExact(v))
            return 1;
        ((double *)PyBytes_AS_STRING(c->vals))[i] = PyFloat_AS_DOUBLE(v);
        return 0;
    }
    return 1;
}

/* The column as ("str", blob, ends), ("int", int64s) or ("float",
 * float64s), bytes each (the column's own, no copy); NULL with an error
 * set. */
static PyObject *col_result(col *c)
{
    if (c->kind == COL_STR) {
        if (_PyBytes_Resize(&c->blob, (Py_ssize_t)c->len) < 0)
            return NULL;
        c->cap = c->len;
        return Py_BuildValue("(sOO)", "str", c->blob, c->ends);
    }
    return Py_BuildValue("(sO)", c->kind == COL_INT ? "int" : "float", c->vals);
}

/* out, or None in its place when it failed for want of memory (the
 * general path, which needs less at once, takes the collection then). */
static PyObject *none_if_out_of_memory(PyObject *out)
{
    if (!out && (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_MemoryError))) {
        PyErr_Clear();
        out = Py_NewRef(Py_None);
    }
    return out;
}

/* records_encode(items, keys) -> [column per key] (see col_result), or
 * None when some item is not a dict (exactly) with exactly these keys in
 * this order, or some value does not fit its key's column (the kind of
 * items[0]'s). One pass over the items; nothing is referenced. */
static PyObject *records_encode(PyObject *self, PyObject *args)
{
    PyObject *items, *keys, *out = NULL;
    if (!PyArg_ParseTuple(args, "O!O!:records_encode", &PyList_Type, &items, &PyTuple_Type,
                          &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), k = PyTuple_GET_SIZE(keys);
    if (n == 0 || k == 0 || k > 64)
        Py_RETURN_NONE;
    PyObject *first = PyList_GET_ITEM(items, 0);
    if (!PyDict_CheckExact(first) || PyDict_GET_SIZE(first) != k)
        Py_RETURN_NONE;
    col cols[64];
    Py_ssize_t opened = 0, pos = 0;
    PyObject *key, *value;
    int fits = 1;
    while (PyDict_Next(first, &pos, &key, &value)) {
        if (col_open(&cols[opened], value, n) < 0)
            goto done;
        opened++;
        if (cols[opened - 1].kind < 0) {
            fits = 0;
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n && fits; i++) {
        PyObject *d = PyList_GET_ITEM(items, i);
        if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != k) {
            fits = 0;
            break;
        }
        Py_ssize_t j = 0;
        pos = 0;
        while (PyDict_Next(d, &pos, &key, &value)) {
            PyObject *want = PyTuple_GET_ITEM(keys, j);
            /* as dict_columns: exact str keys compared, nothing else run */
            if (key != want && (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(want) ||
                                PyUnicode_Compare(key, want) != 0)) {
                fits = 0;
                break;
            }
            int r = col_put(&cols[j], i, value);
            if (r < 0)
                goto done;
            if (r > 0) {
                fits = 0;
                break;
            }
            j++;
        }
    }
    if (!fits) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyList_New(k);
    for (Py_ssize_t j = 0; out && j < k; j++) {
        PyObject *c = col_result(&cols[j]);
        if (!c)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j, c);
    }
done:
    for (Py_ssize_t j = 0; j < opened; j++)
        col_close(&cols[j]);
    return none_if_out_of_memory(out);
}

/* str_dict_encode(d) -> (key blob, key ends, table, values), values a
 * column (col_result) or None when they do not fit one (the Python path
 * encodes them); or None when some key is not an ASCII str (exactly).
 * One pass over the dict, then the table (see str_index). */
static PyObject *str_dict_encode(PyObject *self, PyObject *arg)
{
    if (!PyDict_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "str_dict_encode takes a dict");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(arg), pos = 0, i = 0;
    PyObject *key, *value, *out = NULL, *table = NULL, *values = NULL;
    if (n == 0 || !PyDict_Next(arg, &pos, &key, &value) || col_kind(key) != COL_STR)
        Py_RETURN_NONE;
    pos = 0;
    col keys, vals;
    memset(&keys, 0, sizeof keys);
    memset(&vals, 0, sizeof vals);
    uint64_t *hashes = PyMem_RawMalloc((size_t)n * sizeof *hashes);
    if (!hashes || col_open(&keys, key, n) < 0) {
        PyMem_RawFree(hashes);
        if (!hashes)
            PyErr_NoMemory();
        return none_if_out_of_memory(NULL);
    }
    int values_fit = 1;
    while (PyDict_Next(arg, &pos, &key, &value)) {
        if (i == 0) {
            if (col_open(&vals, value, n) < 0)
                goto done;
            values_fit = vals.kind >= 0;
        }
        int r = col_put(&keys, i, key);
        if (r < 0)
            goto done;
        if (r > 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        const int64_t *e = (const int64_t *)PyBytes_AS_STRING(keys.ends);
        hashes[i] = key_hash((const unsigned char *)PyBytes_AS_STRING(keys.blob) + e[i],
                             (size_t)(e[i + 1] - e[i]));
        if (values_fit) {
            r = col_put(&vals, i, value);
            if (r < 0)
                goto done;
            values_fit = r == 0;
        }
        i++;
    }
    uint64_t size = table_size(n);
    table = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size * sizeof(int64_t)));
    if (!table)
        goto done;
    fill_table((int64_t *)PyBytes_AS_STRING(table), size, hashes, n);
    values = values_fit ? col_result(&vals) : Py_NewRef(Py_None);
    if (!values || _PyBytes_Resize(&keys.blob, (Py_ssize_t)keys.len) < 0)
        goto done;
    out = Py_BuildValue("(OOOO)", keys.blob, keys.ends, table, values);
done:
    Py_XDECREF(table);
    Py_XDECREF(values);
    col_close(&keys);
    col_close(&vals);
    PyMem_RawFree(hashes);
    return none_if_out_of_memory(out);
}

/* ------------------------------------------------------------------------
 * Content of encoded columns: a hash to name them by, and a comparison
 */

/* The buffers of a sequence of objects, each seen as bytes; -1 with an
 * error set (the views taken so far released). */
static Py_ssize_t get_views(PyObject *seq, Py_buffer **out)
{
    PyObject *fast = PySequence_Fast(seq, "a sequence of buffers");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), i;
    Py_buffer *v = PyMem_Calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &v[i], PyBUF_SIMPLE) < 0)
            break;
    }
    Py_DECREF(fast);
    if (i < n) {
        while (i--)
            PyBuffer_Release(&v[i]);
        PyMem_Free(v);
        return -1;
    }
    *out = v;
    return n;
}

static void put_views(Py_buffer *v, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
}

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* content_hash(buffers) -> 16 bytes: a hash of the buffers' bytes and
 * lengths, four independent lanes of 8-byte words (several GB/s), for
 * naming a copy; never trusted alone (content_equal checks a copy found
 * by it). The GIL is released while it reads. */
static PyObject *content_hash(PyObject *self, PyObject *arg)
{
    Py_buffer *v;
    Py_ssize_t n = get_views(arg, &v);
    if (n < 0)
        return NULL;
    uint64_t lane[4] = {0x243F6A8885A308D3ULL, 0x13198A2E03707344ULL, 0xA4093822299F31D0ULL,
                        0x082EFA98EC4E6C89ULL};
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < n; b++) {
        const unsigned char *p = v[b].buf;
        size_t len = (size_t)v[b].len, i = 0;
        for (int k = 0; k < 4; k++)
            lane[k] = (lane[k] ^ (uint64_t)len) * 0x9E3779B97F4A7C15ULL;
        for (; i + 32 <= len; i += 32) {
            for (int k = 0; k < 4; k++) {
                uint64_t w;
                memcpy(&w, p + i + 8 * k, 8);
                lane[k] = (lane[k] ^ w) * 0xFF51AFD7ED558CCDULL;
                lane[k] ^= lane[k] >> 31;
            }
        }
        uint64_t tail[4] = {0, 0, 0, 0};
        memcpy(tail, p + i, len - i);
        for (int k = 0; k < 4; k++)
            lane[k] = mix64(lane[k] ^ tail[k]);
    }
    Py_END_ALLOW_THREADS
    put_views(v, n);
    uint64_t out[2] = {mix64(lane[0] ^ (lane[1] * 0x9E3779B97F4A7C15ULL)),
                       mix64(lane[2] ^ (lane[3] * 0x9E3779B97F4A7C15ULL))};
    return PyBytes_FromStringAndSize((const char *)out, sizeof out);
}

/* content_equal(a, b) -> whether two sequences of buffers hold the same
 * bytes, buffer by buffer (the GIL released while comparing). */
static PyObject *content_equal(PyObject *self, PyObject *args)
{
    PyObject *a_o, *b_o;
    if (!PyArg_ParseTuple(args, "OO:content_equal", &a_o, &b_o))
        return NULL;
    Py_buffer *a, *b;
    Py_ssize_t na = get_views(a_o, &a);
    if (na < 0)
        return NULL;
    Py_ssize_t nb = get_views(b_o, &b);
    if (nb < 0) {
        put_views(a, na);
        return NULL;
    }
    int same = na == nb;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; same && i < na; i++)
        same = a[i].len == b[i].len && memcmp(a[i].buf, b[i].buf, (size_t)a[i].len) == 0;
    Py_END_ALLOW_THREADS
    put_views(a, na);
    put_views(b, nb);
    return PyBool_FromLong(same);
}

PyMethodDef ferry_py_column_methods[] = {
    {"content_hash", content_hash, METH_O,
     "content_hash(buffers) -> 16 bytes naming their content"},
    {"content_equal", content_equal, METH_VARARGS,
     "content_equal(a, b) -> whether two sequences of buffers hold the same bytes"},

    {"records_encode", records_encode, METH_VARARGS,
     "records_encode(items, keys) -> a packed column per key, or None"},
    {"str_dict_encode", str_dict_encode, METH_O,
     "str_dict_encode(d) -> (key blob, key ends, table, values column or None), or None"},
    {"dict_columns", dict_columns, METH_VARARGS,
     "dict_columns(items, keys) -> a list per key, or None (not all dicts of those keys)"},
    {"tuple_columns", tuple_columns, METH_VARARGS,
     "tuple_columns(items, width) -> a list per place, or None (not all tuples of width)"},
    {"int_column", int_column, METH_O,
     "int_column(values) -> int64 bytes, or None (not all 64-bit ints)"},
    {"str_column", str_column, METH_O,
     "str_column(values) -> (utf-8 blob, int64 ends), or None (not all str)"},
    {"str_index", str_index, METH_VARARGS,
     "str_index(blob, ends) -> the open-addressing table of a string column"},
    {"str_find", str_find, METH_VARARGS,
     "str_find(table, blob, ends, key) -> the key's position, or -1"},
    {0},
};
