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

/* A table of slots (position + 1; 0: empty), a power of two >= 2n of
 * them, linear probing, filled from the keys' hashes (fill_table, below
 * the threads it uses). A slot is 4 bytes (uint32) for a dict of fewer
 * than 2^31 - 1 keys, every real one: half the memory and the cache
 * misses of 8; 8 bytes (uint64) past that. A reader tells the two apart
 * by the table's length, table_size(n) slots of either (str_find); tables
 * from before were all of 8. */
static int fill_table(void *t, int w, uint64_t size, const uint64_t *hashes, Py_ssize_t n,
                      int wanted);

static uint64_t table_size(Py_ssize_t n)
{
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n)
        size *= 2;
    return size;
}

static int table_width(Py_ssize_t n)
{
    return (uint64_t)n < INT32_MAX ? 4 : 8;
}

static inline uint64_t slot_get(const void *t, int w, uint64_t i)
{
    return w == 4 ? ((const uint32_t *)t)[i] : ((const uint64_t *)t)[i];
}

static inline void slot_set(void *t, int w, uint64_t i, uint64_t v)
{
    if (w == 4)
        ((uint32_t *)t)[i] = (uint32_t)v;
    else
        ((uint64_t *)t)[i] = v;
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

/* str_index(blob, ends) -> table bytes: slots (position + 1; 0: empty)
 * of table_width(n) bytes, a power of two >= 2n of them, linear probing
 * from the key's hash (key_hash). */
static PyObject *str_index(PyObject *self, PyObject *args)
{
    PyObject *blob_o, *ends_o;
    strings s;
    if (!PyArg_ParseTuple(args, "OO:str_index", &blob_o, &ends_o) ||
        get_strings(blob_o, ends_o, &s) < 0)
        return NULL;
    uint64_t size = table_size(s.n);
    int w = table_width(s.n);
    uint64_t *hashes = PyMem_RawMalloc(((size_t)s.n + 1) * sizeof *hashes);
    PyObject *table = hashes ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size * (uint64_t)w))
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
    int filled = fill_table(PyBytes_AS_STRING(table), w, size, hashes, s.n, 0);
    PyMem_RawFree(hashes);
    put_strings(&s);
    if (filled < 0) {
        Py_DECREF(table);
        return PyErr_NoMemory();
    }
    return table;
}

/* str_find(table, blob, ends, key) -> the key's position, or -1; a
 * table whose length is not table_size(n) slots of 4 or 8 bytes is a
 * ValueError. */
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
    const void *t = tb.buf;
    Py_ssize_t tlen = tb.len;
    uint64_t size = table_size(s.n), found = 0;
    int w = (uint64_t)tlen == 4 * size ? 4 : (uint64_t)tlen == 8 * size ? 8 : 0;
    if (w) {
        uint64_t slot = key_hash((const unsigned char *)k, (size_t)klen) & (size - 1), v;
        for (uint64_t probes = 0; probes < size && (v = slot_get(t, w, slot)); probes++) {
            const unsigned char *p;
            size_t n;
            uint64_t at = v - 1;
            if (at < (uint64_t)s.n && key_at(&s, (Py_ssize_t)at, &p, &n) == 0 &&
                n == (size_t)klen && memcmp(p, k, n) == 0) {
                found = at + 1;
                break;
            }
            slot = (slot + 1) & (size - 1);
        }
    }
    put_strings(&s);
    PyBuffer_Release(&tb);
    if (!w) {
        PyErr_Format(PyExc_ValueError, "a table of %zd bytes is not that of %zd keys",
                     tlen, s.n);
        return NULL;
    }
    return PyLong_FromLongLong(found ? (long long)found - 1 : -1);
}

/* ------------------------------------------------------------------------
 * One pass each: a list of dicts, a dict of str keys
 *
 * A big collection is cut into parts of consecutive items, one a thread
 * (encode_threads: the CPUs this process may run on, at most 8, a part at
 * least PART_MIN items), so that a million dicts take half the time on two
 * cores: the walk is bound by the cache misses of reading scattered
 * objects, which threads overlap. The calling thread holds the GIL
 * throughout and encodes part 0; the helper threads read the other parts
 * without it. That is safe because no Python code runs meanwhile (the GIL
 * is never released) and what the helpers do runs none and changes
 * nothing: they read exact dicts (PyDict_Next), exact str (ready, ASCII),
 * exact int and float, compare keys byte for byte, take no reference, set
 * no error, and allocate with malloc only. Anything else is "does not fit",
 * as in one thread. Part 0 writes straight into the columns handed out;
 * part t > 0 writes the fixed-width values (ends, ints, floats, hashes) at
 * its own indices there too, and its str bytes into a buffer of its own,
 * appended after the parts before it once all are done (its ends shifted
 * by what those wrote). The result is byte for byte the one thread's.
 */

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

enum { PART_MIN = 1 << 15, PARTS_MAX = 8 };

/* The CPUs a cgroup v2 quota gives this process (cpu.max "QUOTA PERIOD",
 * rounded up), or 0 without one: a container limited to 2 CPUs on a
 * 64-core host sees all 64 in its affinity mask. */
static long cgroup_cpus(void)
{
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "re");
    if (!f)
        return 0;
    char quota[32] = "";
    long period = 0;
    int got = fscanf(f, "%31s %ld", quota, &period);
    fclose(f);
    char *end;
    long q = got == 2 ? strtol(quota, &end, 10) : 0;
    if (got != 2 || *end != '\0' || q <= 0 || period <= 0)
        return 0; /* "max": no quota */
    return (q + period - 1) / period;
}

/* The threads to encode n items with: 1 below 2 * PART_MIN, at most the
 * CPUs the affinity mask and a cgroup quota allow; wanted > 0 (the
 * encoders' optional argument, for tests) decides alone. */
static int encode_threads(Py_ssize_t n, int wanted)
{
    cpu_set_t cpus;
    Py_ssize_t t = wanted;
    if (t <= 0) {
        t = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
        long quota = cgroup_cpus();
        if (quota > 0 && quota < t)
            t = quota;
        if (t > n / PART_MIN)
            t = n / PART_MIN;
    }
    if (t > n) /* no empty part */
        t = n;
    return t < 1 ? 1 : t > PARTS_MAX ? PARTS_MAX : (int)t;
}

/* A column a one-pass encoder packs: ASCII str (exact), int (exact, 64
 * bits), float (exact). A value of any other kind sends the whole
 * collection down the Python path, which knows them all. */
enum { COL_STR, COL_INT, COL_FLOAT };

typedef struct col {
    int kind;
    /* bytes objects, written in place and handed out as they are */
    PyObject *blob; /* COL_STR: part 0's bytes end to end (resized as it grows) */
    size_t len, cap;
    PyObject *ends; /* COL_STR: n + 1 int64 offsets */
    PyObject *vals; /* COL_INT: int64, COL_FLOAT: double; n */
    size_t each;    /* COL_STR: bytes of room an item, to start with */
} col;

/* A helper thread's str bytes for one column (malloc'd). */
typedef struct strbuf {
    char *p;
    size_t len, cap;
} strbuf;

static int col_kind(PyObject *v)
{
    if (PyUnicode_CheckExact(v) && PyUnicode_IS_READY(v) && PyUnicode_IS_ASCII(v))
        return COL_STR;
    if (PyLong_CheckExact(v))
        return COL_INT;
    if (PyFloat_CheckExact(v))
        return COL_FLOAT;
    return -1;
}

/* Whether str a and b (exact, ready) hold the same text; compared here,
 * not by PyUnicode_Compare, which a helper thread may not call. */
static int same_str(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b) || !PyUnicode_IS_READY(a) ||
        !PyUnicode_IS_READY(b))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

static void col_close(col *c)
{
    Py_XDECREF(c->blob);
    Py_XDECREF(c->ends);
    Py_XDECREF(c->vals);
    memset(c, 0, sizeof *c);
}

/* A column of n values of the kind of v (kind -1: none fits), its str
 * bytes room for all n: part 0 writes there, and the other parts' bytes
 * are appended there. Pages no byte is written to are never memory (the
 * blob is cut to its length at the end), and growing it is a copy of
 * what part 0 wrote into fresh pages: a million words' 5 ms of 48. -1
 * with an error set. */
static int col_open(col *c, PyObject *v, Py_ssize_t n)
{
    memset(c, 0, sizeof *c);
    c->kind = col_kind(v);
    if (c->kind == COL_STR) {
        /* room for the items like the first, a quarter more (a copy to
         * grow is the blob's size again), but no more than 64 bytes an
         * item: one long first value must not ask for n of its size */
        size_t first = (size_t)PyUnicode_GET_LENGTH(v);
        c->each = first + first / 4 + 4 < 64 ? first + first / 4 + 4 : 64;
        c->cap = (size_t)n * c->each + 64;
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
 * non-ASCII str, an int past 64 bits), -1 when out of memory (an error set
 * only when own is NULL). Its str bytes go to the column's blob (own NULL:
 * the thread holding the GIL) or to own (a helper thread; its ends then
 * count from own's start). Nothing here runs Python code or sets an error
 * but the blob's growth: exact ints and floats cannot fail to convert. */
static int col_put(col *c, strbuf *own, Py_ssize_t i, PyObject *v)
{
    switch (c->kind) {
    case COL_STR: {
        if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_READY(v) || !PyUnicode_IS_ASCII(v))
            return 1;
        size_t n = (size_t)PyUnicode_GET_LENGTH(v), len;
        if (own) {
            if (own->len + n > own->cap) {
                size_t cap = own->cap * 2 > own->len + n ? own->cap * 2 : own->len + n;
                char *p = realloc(own->p, cap);
                if (!p)
                    return -1;
                own->p = p;
                own->cap = cap;
            }
            memcpy(own->p + own->len, PyUnicode_DATA(v), n);
            len = own->len += n;
        } else {
            if (c->len + n > c->cap) {
                size_t cap = c->cap * 2 > c->len + n ? c->cap * 2 : c->len + n;
                if (_PyBytes_Resize(&c->blob, (Py_ssize_t)cap) < 0)
                    return -1; /* c->blob is NULL now */
                c->cap = cap;
            }
            memcpy(PyBytes_AS_STRING(c->blob) + c->len, PyUnicode_DATA(v), n);
            len = c->len += n;
        }
        ((int64_t *)PyBytes_AS_STRING(c->ends))[i + 1] = (int64_t)len;
        return 0;
    }
    case COL_INT: {
        if (!PyLong_CheckExact(v))
            return 1;
        int overflow = 0;
        long long y = PyLong_AsLongLongAndOverflow(v, &overflow); /* exact: no error */
        if (overflow)
            return 1;
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

/* Part own's str bytes after the column's (the parts before it), its
 * items' ends [a + 1, b] shifted to match; -1 with an error set. */
static int col_append(col *c, const strbuf *own, Py_ssize_t a, Py_ssize_t b)
{
    if (c->kind != COL_STR)
        return 0;
    if (c->len + own->len > c->cap) {
        if (_PyBytes_Resize(&c->blob, (Py_ssize_t)(c->len + own->len)) < 0)
            return -1;
        c->cap = c->len + own->len;
    }
    if (own->len)
        memcpy(PyBytes_AS_STRING(c->blob) + c->len, own->p, own->len);
    int64_t *e = (int64_t *)PyBytes_AS_STRING(c->ends), base = (int64_t)c->len;
    for (Py_ssize_t i = a + 1; i <= b; i++)
        e[i] += base;
    c->len += own->len;
    return 0;
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

/* One part of an encoding: items [a, b). Its outcome: 0 done, 1 some item
 * does not fit, -1 out of memory (an error set only for part 0). */
typedef struct part {
    void *job;
    int index;
    Py_ssize_t a, b, pos; /* pos: a dict's entry position of item a */
    strbuf own[2];        /* part > 0: str bytes of (up to) two columns */
    int outcome;
} part;

/* Runs fn on parts 1..t-1 in threads of their own and on part 0 here;
 * returns once all are done. A part whose thread cannot start runs here
 * too, after part 0. */
static void run_parts(part *parts, int t, void *(*fn)(void *))
{
    pthread_t th[PARTS_MAX];
    int started[PARTS_MAX] = {0};
    for (int i = 1; i < t; i++)
        started[i] = pthread_create(&th[i], NULL, fn, &parts[i]) == 0;
    fn(&parts[0]);
    for (int i = 1; i < t; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn(&parts[i]);
    }
}

/* Whether some part failed: an item that does not fit, or out of memory
 * (either sends the collection down the general path); any error part 0
 * set is cleared. */
static int parts_failed(const part *parts, int t)
{
    for (int i = 0; i < t; i++) {
        if (parts[i].outcome) {
            PyErr_Clear();
            return 1;
        }
    }
    return 0;
}

static void free_parts(part *parts, int t)
{
    for (int i = 0; i < t; i++)
        for (int j = 0; j < 2; j++)
            free(parts[i].own[j].p);
}

/* Cuts n items into t parts of consecutive items. */
static void cut_parts(part *parts, int t, Py_ssize_t n, void *job)
{
    memset(parts, 0, (size_t)t * sizeof *parts);
    for (int i = 0; i < t; i++) {
        parts[i].job = job;
        parts[i].index = i;
        parts[i].a = n * i / t;
        parts[i].b = n * (i + 1) / t;
    }
}

/* ---- the lookup table of a dict's keys
 *
 * Filled in regions, a fixed number of them whatever the threads (so the
 * table's bytes, which name a host's shared copy, are the same on every
 * machine): each region's keys, in key order, probe within the region;
 * one that runs off its end is put aside, and those are placed last, in
 * key order, probing on past the region (wrapping at the table's end).
 * Any order of insertion gives a table linear probing reads correctly
 * (no key is ever removed); this one lets the regions be filled at once.
 *
 * How: the keys are first sorted by region, each with its slot (a
 * counting sort over parts of the keys, in threads, stable: key order
 * within a region), then each region is filled from its own keys alone.
 * A region's slots stay in the cache then (a million keys' region is 512
 * KiB), where placing the keys straight from their hashes cost a cache
 * miss a key over the whole table: 19 of a million-word vocabulary's 55
 * ms. The sorted keys are packed in 8 bytes (position, slot in its
 * region), so a table of 8-byte slots (2^31 keys or more) is one region,
 * filled in one thread. */

enum { TABLE_REGIONS = 16, TABLE_REGION_MIN = 1 << 14 };

typedef struct table_job {
    void *t;
    int w;                /* bytes a slot */
    uint64_t size, rsize; /* slots, and slots a region */
    int shift;            /* log2(rsize) */
    const uint64_t *hashes;
    Py_ssize_t n;
    uint64_t *sorted; /* by region: position << 32 | slot in the region; NULL: one region */
    size_t at[PARTS_MAX][TABLE_REGIONS]; /* a key part's count in each region, then where
                                            its next key of the region goes in sorted */
    size_t start[TABLE_REGIONS + 1];     /* region r's keys: sorted[start[r], start[r + 1]) */
    Py_ssize_t *aside[TABLE_REGIONS]; /* a region's keys put aside (malloc'd) */
    size_t naside[TABLE_REGIONS], cap[TABLE_REGIONS];
} table_job;

/* Keys [a, b): how many fall in each region. */
static void *count_part(void *arg)
{
    part *pt = arg;
    table_job *job = pt->job;
    uint64_t mask = job->size - 1;
    size_t *at = job->at[pt->index];
    for (Py_ssize_t i = pt->a; i < pt->b; i++)
        at[(job->hashes[i] & mask) >> job->shift]++;
    return NULL;
}

/* Keys [a, b) into their regions' places in sorted. */
static void *sort_part(void *arg)
{
    part *pt = arg;
    table_job *job = pt->job;
    uint64_t mask = job->size - 1, in = job->rsize - 1;
    size_t *at = job->at[pt->index];
    for (Py_ssize_t i = pt->a; i < pt->b; i++) {
        uint64_t slot = job->hashes[i] & mask;
        job->sorted[at[slot >> job->shift]++] = (uint64_t)i << 32 | (slot & in);
    }
    return NULL;
}

/* Key i (hash slot `slot`) placed in region r, or put aside; -1 when
 * memory ran out. */
static int place(table_job *job, uint64_t r, uint64_t slot, Py_ssize_t i)
{
    uint64_t end = (r + 1) * job->rsize;
    while (slot < end && slot_get(job->t, job->w, slot))
        slot++;
    if (slot < end) {
        slot_set(job->t, job->w, slot, (uint64_t)i + 1);
        return 0;
    }
    if (job->naside[r] == job->cap[r]) {
        size_t cap = job->cap[r] ? 2 * job->cap[r] : 64;
        Py_ssize_t *p = realloc(job->aside[r], cap * sizeof *p);
        if (!p)
            return -1;
        job->aside[r] = p;
        job->cap[r] = cap;
    }
    job->aside[r][job->naside[r]++] = i;
    return 0;
}

/* Regions [a, b) of the table: cleared, then their keys placed. */
static void *region_part(void *arg)
{
    part *pt = arg;
    table_job *job = pt->job;
    size_t bytes = job->rsize * (uint64_t)job->w; /* a region's */
    if (!job->sorted) { /* the one region */
        memset(job->t, 0, bytes);
        for (Py_ssize_t i = 0; i < job->n; i++)
            if (place(job, 0, job->hashes[i] & (job->size - 1), i) < 0)
                goto out_of_memory;
        return NULL;
    }
    for (Py_ssize_t r = pt->a; r < pt->b; r++) {
        uint64_t base = (uint64_t)r * job->rsize;
        /* cleared just before it is filled, so that it is in the cache then */
        memset((char *)job->t + base * (uint64_t)job->w, 0, bytes);
        for (size_t k = job->start[r]; k < job->start[r + 1]; k++) {
            uint64_t e = job->sorted[k];
            if (place(job, (uint64_t)r, base + (e & 0xFFFFFFFFu), (Py_ssize_t)(e >> 32)) < 0)
                goto out_of_memory;
        }
    }
    return NULL;
out_of_memory:
    pt->outcome = -1;
    return NULL;
}

static int by_position(const void *a, const void *b)
{
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* The table of n keys from their hashes, in threads when there are many
 * keys (encode_threads; wanted as there); 0, or -1 when memory ran out
 * (the table is then unfinished: no error is set). */
static int fill_table(void *t, int w, uint64_t size, const uint64_t *hashes, Py_ssize_t n,
                      int wanted)
{
    int regions = w == 4 && size >= (uint64_t)TABLE_REGIONS * TABLE_REGION_MIN ? TABLE_REGIONS
                                                                               : 1;
    int threads = regions > 1 ? encode_threads(n, wanted) : 1, failed = 0;
    table_job *job = calloc(1, sizeof *job);
    part parts[PARTS_MAX];
    if (!job)
        return -1;
    *job = (table_job){.t = t, .w = w, .size = size, .rsize = size / (uint64_t)regions,
                       .hashes = hashes, .n = n};
    while ((1ULL << job->shift) < job->rsize)
        job->shift++;
    if (regions > 1) {
        job->sorted = malloc((size_t)n * sizeof *job->sorted);
        if (!job->sorted) {
            free(job);
            return -1;
        }
        cut_parts(parts, threads, n, job);
        run_parts(parts, threads, count_part);
        size_t at = 0; /* region by region, the parts in key order within each */
        for (int r = 0; r < regions; r++) {
            job->start[r] = at;
            for (int p = 0; p < threads; p++) {
                size_t c = job->at[p][r];
                job->at[p][r] = at;
                at += c;
            }
        }
        job->start[regions] = at;
        run_parts(parts, threads, sort_part);
    }
    int fillers = threads < regions ? threads : regions;
    cut_parts(parts, fillers, regions, job);
    run_parts(parts, fillers, region_part);
    for (int i = 0; i < fillers; i++)
        failed |= parts[i].outcome != 0;
    size_t total = 0;
    for (int r = 0; r < regions; r++)
        total += job->naside[r];
    Py_ssize_t *all = failed ? NULL : malloc((total ? total : 1) * sizeof *all);
    if (all) {
        for (int r = 0, k = 0; r < regions; k += (int)job->naside[r], r++)
            if (job->naside[r])
                memcpy(all + k, job->aside[r], job->naside[r] * sizeof *all);
        qsort(all, total, sizeof *all, by_position); /* key order */
        for (size_t k = 0; k < total; k++) {
            uint64_t slot = hashes[all[k]] & (size - 1);
            while (slot_get(t, w, slot))
                slot = (slot + 1) & (size - 1);
            slot_set(t, w, slot, (uint64_t)all[k] + 1);
        }
    }
    free(all);
    for (int r = 0; r < regions; r++)
        free(job->aside[r]);
    free(job->sorted);
    free(job);
    return all ? 0 : -1;
}

/* ---- a list of dicts */

/* What a list's items are: dicts of the same keys, tuples of the same
 * width, or values (one column of the items themselves). */
enum { ROWS_DICT, ROWS_TUPLE, ROWS_VALUE };

typedef struct records_job {
    int shape;
    PyObject *items, *keys; /* keys: ROWS_DICT's */
    Py_ssize_t k;
    col *cols;
    atomic_int stop; /* some part found an item that does not fit */
} records_job;

/* Field j of item i into its column: 0, 1 it does not fit, -1 out of
 * memory (col_put). */
static int put_field(records_job *job, strbuf **own, Py_ssize_t j, Py_ssize_t i, PyObject *v)
{
    int r = col_put(&job->cols[j], own[j], i, v);
    if (r)
        atomic_store(&job->stop, 1);
    return r;
}

static void *records_part(void *arg)
{
    part *pt = arg;
    records_job *job = pt->job;
    PyObject *key, *value;
    strbuf *own[64] = {NULL};
    int r = 0;
    for (Py_ssize_t j = 0, s = 0; pt->index > 0 && j < job->k; j++) {
        if (job->cols[j].kind == COL_STR) { /* at most two str columns go in threads */
            own[j] = &pt->own[s++];
            own[j]->cap = (size_t)(pt->b - pt->a) * job->cols[j].each + 64;
            own[j]->p = malloc(own[j]->cap);
            if (!own[j]->p) {
                pt->outcome = -1;
                return NULL;
            }
        }
    }
    for (Py_ssize_t i = pt->a; i < pt->b; i++) {
        if ((i & 4095) == 0 && atomic_load_explicit(&job->stop, memory_order_relaxed)) {
            pt->outcome = 1;
            return NULL;
        }
        PyObject *d = PyList_GET_ITEM(job->items, i);
        if (job->shape == ROWS_VALUE) {
            if ((r = put_field(job, own, 0, i, d)))
                goto failed;
            continue;
        }
        if (job->shape == ROWS_TUPLE) {
            if (!PyTuple_CheckExact(d) || PyTuple_GET_SIZE(d) != job->k)
                goto misfit;
            for (Py_ssize_t j = 0; j < job->k; j++)
                if ((r = put_field(job, own, j, i, PyTuple_GET_ITEM(d, j))))
                    goto failed;
            continue;
        }
        if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != job->k)
            goto misfit;
        Py_ssize_t j = 0, pos = 0;
        while (PyDict_Next(d, &pos, &key, &value)) {
            /* as dict_columns: exact str keys compared, nothing else run */
            if (!same_str(key, PyTuple_GET_ITEM(job->keys, j)))
                goto misfit;
            if ((r = put_field(job, own, j, i, value)))
                goto failed;
            j++;
        }
    }
    return NULL;
failed:
    pt->outcome = r > 0 ? 1 : -1;
    return NULL;
misfit:
    pt->outcome = 1;
    atomic_store(&job->stop, 1);
    return NULL;
}

/* The columns of a list of items of the shape (ROWS_*): dicts of keys
 * `keys` in this order, tuples of k items, or values (k 1); see
 * records_encode. */
static PyObject *rows_encode(int shape, PyObject *items, PyObject *keys, Py_ssize_t k,
                             int wanted)
{
    PyObject *out = NULL, *first_values[64];
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n == 0 || k <= 0 || k > 64)
        Py_RETURN_NONE;
    PyObject *first = PyList_GET_ITEM(items, 0);
    if (shape == ROWS_VALUE) {
        first_values[0] = first;
    } else if (shape == ROWS_DICT) {
        if (!PyDict_CheckExact(first) || PyDict_GET_SIZE(first) != k)
            Py_RETURN_NONE;
        Py_ssize_t pos = 0, j = 0;
        PyObject *key, *value;
        while (PyDict_Next(first, &pos, &key, &value))
            first_values[j++] = value;
    } else {
        if (!PyTuple_CheckExact(first) || PyTuple_GET_SIZE(first) != k)
            Py_RETURN_NONE;
        for (Py_ssize_t j = 0; j < k; j++)
            first_values[j] = PyTuple_GET_ITEM(first, j);
    }
    int t = encode_threads(n, wanted), strs = 0, nparts = 0;
    col cols[64];
    part parts[PARTS_MAX];
    Py_ssize_t opened = 0;
    for (Py_ssize_t j = 0; j < k; j++)
        strs += col_kind(first_values[j]) == COL_STR;
    if (strs > 2)
        t = 1; /* a part holds the bytes of two str columns at most */
    for (Py_ssize_t j = 0; j < k; j++) {
        if (col_open(&cols[opened], first_values[j], n) < 0)
            goto done;
        opened++;
        if (cols[opened - 1].kind < 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    records_job job = {shape, items, keys, k, cols, 0};
    cut_parts(parts, t, n, &job);
    nparts = t;
    run_parts(parts, t, records_part);
    if (parts_failed(parts, t)) { /* a misfit, or out of memory: the general path */
        out = Py_NewRef(Py_None);
        goto done;
    }
    for (int i = 1; i < t; i++) {
        for (Py_ssize_t j = 0, s = 0; j < k; j++) {
            if (cols[j].kind == COL_STR &&
                col_append(&cols[j], &parts[i].own[s++], parts[i].a, parts[i].b) < 0)
                goto done;
        }
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
    free_parts(parts, nparts);
    for (Py_ssize_t j = 0; j < opened; j++)
        col_close(&cols[j]);
    return none_if_out_of_memory(out);
}

/* records_encode(items, keys[, threads]) -> [column per key] (see
 * col_result), or None when some item is not a dict (exactly) with exactly
 * these keys in this order, or some value does not fit its key's column
 * (the kind of items[0]'s). One pass over the items, in parts (see above);
 * nothing is referenced. */
static PyObject *records_encode(PyObject *self, PyObject *args)
{
    PyObject *items, *keys;
    int wanted = 0;
    if (!PyArg_ParseTuple(args, "O!O!|i:records_encode", &PyList_Type, &items, &PyTuple_Type,
                          &keys, &wanted))
        return NULL;
    return rows_encode(ROWS_DICT, items, keys, PyTuple_GET_SIZE(keys), wanted);
}

/* tuples_encode(items, width[, threads]) -> [column per place], or None:
 * records_encode for a list of tuples (exactly) of `width` items, such as
 * an ImageFolder's samples, (path, class index). */
static PyObject *tuples_encode(PyObject *self, PyObject *args)
{
    PyObject *items;
    Py_ssize_t width;
    int wanted = 0;
    if (!PyArg_ParseTuple(args, "O!n|i:tuples_encode", &PyList_Type, &items, &width, &wanted))
        return NULL;
    return rows_encode(ROWS_TUPLE, items, NULL, width, wanted);
}

/* values_encode(items[, threads]) -> [the column of the items], or None
 * when they do not all fit the kind of items[0]'s (ASCII str, int of 64
 * bits, float: see col_put): records_encode for a list of the values
 * themselves, such as a list of paths or of labels. */
static PyObject *values_encode(PyObject *self, PyObject *args)
{
    PyObject *items;
    int wanted = 0;
    if (!PyArg_ParseTuple(args, "O!|i:values_encode", &PyList_Type, &items, &wanted))
        return NULL;
    return rows_encode(ROWS_VALUE, items, NULL, 1, wanted);
}

/* ---- a dict of str keys */

typedef struct dict_job {
    PyObject *d;
    col *keys, *vals;
    uint64_t *hashes;
    atomic_int stop;       /* some key is not an ASCII str */
    atomic_int values_out; /* some value does not fit the values' column */
} dict_job;

static void *dict_part(void *arg)
{
    part *pt = arg;
    dict_job *job = pt->job;
    strbuf *own = pt->index > 0 ? &pt->own[0] : NULL, *vown = NULL;
    if (own) {
        own->cap = (size_t)(pt->b - pt->a) * job->keys->each + 64;
        own->p = malloc(own->cap);
        if (job->vals->kind == COL_STR) {
            vown = &pt->own[1];
            vown->cap = (size_t)(pt->b - pt->a) * job->vals->each + 64;
            vown->p = malloc(vown->cap);
        }
        if (!own->p || (vown && !vown->p)) {
            pt->outcome = -1;
            return NULL;
        }
    }
    Py_ssize_t pos = pt->pos;
    PyObject *key, *value;
    for (Py_ssize_t i = pt->a; i < pt->b && PyDict_Next(job->d, &pos, &key, &value); i++) {
        if ((i & 4095) == 0 && atomic_load_explicit(&job->stop, memory_order_relaxed)) {
            pt->outcome = 1;
            return NULL;
        }
        size_t at = own ? own->len : job->keys->len;
        int r = col_put(job->keys, own, i, key);
        if (r) {
            pt->outcome = r > 0 ? 1 : -1;
            atomic_store(&job->stop, 1);
            return NULL;
        }
        const char *bytes = own ? own->p : PyBytes_AS_STRING(job->keys->blob);
        size_t end = own ? own->len : job->keys->len;
        job->hashes[i] = key_hash((const unsigned char *)bytes + at, end - at);
        if (job->vals->kind < 0 || atomic_load_explicit(&job->values_out, memory_order_relaxed))
            continue;
        r = col_put(job->vals, vown, i, value);
        if (r < 0) {
            pt->outcome = -1;
            atomic_store(&job->stop, 1);
            return NULL;
        }
        if (r > 0)
            atomic_store(&job->values_out, 1);
    }
    return NULL;
}

/* str_dict_encode(d[, threads]) -> (key blob, key ends, table, values),
 * values a column (col_result) or None when they do not fit one (the
 * Python path encodes them); or None when some key is not an ASCII str
 * (exactly). One pass over the dict, in parts (see above), then the table
 * (see str_index). */
static PyObject *str_dict_encode(PyObject *self, PyObject *args)
{
    PyObject *d;
    int wanted = 0;
    if (!PyArg_ParseTuple(args, "O|i:str_dict_encode", &d, &wanted))
        return NULL;
    if (!PyDict_CheckExact(d)) {
        PyErr_SetString(PyExc_TypeError, "str_dict_encode takes a dict");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(d), pos = 0;
    PyObject *key, *value, *out = NULL, *table = NULL, *values = NULL;
    if (n == 0 || !PyDict_Next(d, &pos, &key, &value) || col_kind(key) != COL_STR)
        Py_RETURN_NONE;
    int t = encode_threads(n, wanted), nparts = 0;
    col keys, vals;
    memset(&keys, 0, sizeof keys);
    memset(&vals, 0, sizeof vals);
    part parts[PARTS_MAX];
    uint64_t *hashes = PyMem_RawMalloc((size_t)n * sizeof *hashes);
    if (!hashes || col_open(&keys, key, n) < 0 || col_open(&vals, value, n) < 0) {
        if (!hashes)
            PyErr_NoMemory();
        goto done;
    }
    dict_job job = {d, &keys, &vals, hashes, 0, 0};
    cut_parts(parts, t, n, &job);
    nparts = t;
    /* where each part starts: a walk over the entries alone, no key read */
    pos = 0;
    for (Py_ssize_t i = 0, p = 1; p < t && PyDict_Next(d, &pos, &key, &value); i++) {
        if (i + 1 == parts[p].a)
            parts[p++].pos = pos;
    }
    run_parts(parts, t, dict_part);
    if (parts_failed(parts, t)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    for (int i = 1; i < t; i++) {
        if (col_append(&keys, &parts[i].own[0], parts[i].a, parts[i].b) < 0 ||
            (!job.values_out && col_append(&vals, &parts[i].own[1], parts[i].a, parts[i].b) < 0))
            goto done;
    }
    uint64_t size = table_size(n);
    int w = table_width(n);
    table = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size * (uint64_t)w));
    if (!table)
        goto done;
    if (fill_table(PyBytes_AS_STRING(table), w, size, hashes, n, wanted) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    values = vals.kind >= 0 && !job.values_out ? col_result(&vals) : Py_NewRef(Py_None);
    if (!values || _PyBytes_Resize(&keys.blob, (Py_ssize_t)keys.len) < 0)
        goto done;
    out = Py_BuildValue("(OOOO)", keys.blob, keys.ends, table, values);
done:
    Py_XDECREF(table);
    Py_XDECREF(values);
    free_parts(parts, nparts);
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
     "records_encode(items, keys[, threads]) -> a packed column per key, or None"},
    {"tuples_encode", tuples_encode, METH_VARARGS,
     "tuples_encode(items, width[, threads]) -> a packed column per place, or None"},
    {"values_encode", values_encode, METH_VARARGS,
     "values_encode(items[, threads]) -> [the packed column of the items], or None"},
    {"str_dict_encode", str_dict_encode, METH_VARARGS,
     "str_dict_encode(d[, threads]) -> (key blob, key ends, table, values column or None), "
     "or None"},
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
