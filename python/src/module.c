/*
 * module.c - the _ferry extension module: its init, and the tables C owns
 * that the package reads from here instead of copying them (dtype codes
 * and names, the layout codes of a Python dataset's items, error codes).
 */
#include "loader.h"
#include "pydataset.h"
#include "pyprofile.h"

#include "dataset.h"
#include "ferry.h"
#include "sampler.h"

static PyObject *strerror_py(PyObject *self, PyObject *args)
{
    int code;
    if (!PyArg_ParseTuple(args, "i:strerror", &code))
        return NULL;
    return Py_BuildValue("(ss)", ferry_err_name(code), ferry_strerror(code));
}

static PyObject *version_py(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(ferry_version());
}

/* epoch_batches(n, batch_size, drop_last=False, rank=0, world_size=1,
 * pad_shards=True) -> the batches a rank gets per epoch, by the sampler's
 * own arithmetic (sampler.c): what len() of a loader is before it opens. */
static PyObject *epoch_batches_py(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"n", "batch_size", "drop_last", "rank", "world_size", "pad_shards", NULL};
    unsigned long long n, bs;
    int drop_last = 0, pad = 1;
    unsigned int rank = 0, world = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KK|pIIp:epoch_batches", kw, &n, &bs, &drop_last,
                                     &rank, &world, &pad))
        return NULL;
    ferry__sampler_opts o = {.batch_size = bs, .drop_last = drop_last, .rank = rank,
                             .world_size = world, .pad_shards = pad};
    ferry__sampler s;
    int rc = ferry__sampler_init(&s, n, &o);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    return PyLong_FromUnsignedLongLong(s.batches_per_epoch);
}

/* state_check([blob, ...]) -> None when the ranks' resume states can stand
 * for one job at one step (ferry_state_check); else ferry.StateError naming
 * the first that differs. */
static PyObject *state_check_py(PyObject *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "state_check: expected a list of states (bytes)");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const void **ptrs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *ptrs);
    size_t *lens = PyMem_Calloc(n ? (size_t)n : 1, sizeof *lens);
    PyObject *out = NULL;
    if (!ptrs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "state_check: state %zd is a %s, not bytes", i,
                         Py_TYPE(b)->tp_name);
            goto done;
        }
        ptrs[i] = PyBytes_AS_STRING(b);
        lens[i] = (size_t)PyBytes_GET_SIZE(b);
    }
    int rc = ferry_state_check(ptrs, lens, (size_t)n);
    if (rc != FERRY_OK)
        ferry_py_raise(rc, ferry_last_error());
    else {
        Py_INCREF(Py_None);
        out = Py_None;
    }
done:
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return out;
}

/* state_resized(blob, n) -> the blob of an epoch's start moved to a
 * dataset of n items (ferry__sampler_state_resize); ferry.StateError when
 * the blob is not an epoch's start. */
static PyObject *state_resized_py(PyObject *self, PyObject *args)
{
    const char *buf;
    Py_ssize_t len;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "y#K:state_resized", &buf, &len, &n))
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, len);
    if (!out)
        return NULL;
    int rc = ferry__sampler_state_resize(buf, (size_t)len, n, PyBytes_AS_STRING(out));
    if (rc != FERRY_OK) {
        Py_DECREF(out);
        return ferry_py_raise(rc, ferry_last_error());
    }
    return out;
}

/* dataset_length(spec) -> the items of a C dataset spec, opened here and
 * closed (what ferry.Mix of spec strings needs to know of each source). */
static PyObject *dataset_length_py(PyObject *self, PyObject *args)
{
    const char *spec;
    if (!PyArg_ParseTuple(args, "s:dataset_length", &spec))
        return NULL;
    ferry__dataset ds;
    char errbuf[FERRY_DATASET_MESSAGE_MAX];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry__dataset_open(&ds, spec, NULL, errbuf, sizeof errbuf);
    Py_END_ALLOW_THREADS
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, errbuf);
    uint64_t n = ds.length;
    ferry__dataset_close(&ds);
    return PyLong_FromUnsignedLongLong(n);
}

/* mix_info(spec) -> (sources, total, length) of a mix spec (sampler/mix.h),
 * or ferry's OptionError-kind exception naming what is wrong. */
static PyObject *mix_info_py(PyObject *self, PyObject *args)
{
    const char *spec;
    ferry__mix *m;
    if (!PyArg_ParseTuple(args, "s:mix_info", &spec))
        return NULL;
    int rc = ferry__mix_parse(spec, &m);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    PyObject *out = Py_BuildValue("(IKK)", ferry__mix_sources(m),
                                  (unsigned long long)ferry__mix_total(m),
                                  (unsigned long long)ferry__mix_length(m));
    ferry__mix_free(m);
    return out;
}

/* mix_draw(spec, seed, shuffle, first, count) -> (indices, sources): the
 * draws at global positions first .. first+count-1 as bytes in the machine's order
 * (uint64 indices, uint32 source numbers): the arithmetic a loader with
 * option mix follows, for checking it and for tools. */
static PyObject *mix_draw_py(PyObject *self, PyObject *args)
{
    const char *spec;
    unsigned long long seed, first;
    Py_ssize_t count;
    int shuffle;
    ferry__mix *m;
    if (!PyArg_ParseTuple(args, "sKpKn:mix_draw", &spec, &seed, &shuffle, &first, &count))
        return NULL;
    if (count < 0 || count > ((Py_ssize_t)1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "mix_draw: count must be in 0..2^28");
        return NULL;
    }
    int rc = ferry__mix_parse(spec, &m);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    PyObject *idx = PyBytes_FromStringAndSize(NULL, count * 8);
    PyObject *src = PyBytes_FromStringAndSize(NULL, count * 4);
    if (idx && src) {
        uint64_t *pi = (uint64_t *)PyBytes_AS_STRING(idx);
        uint32_t *ps = (uint32_t *)PyBytes_AS_STRING(src);
        ferry__mix_cursor c;
        ferry__mix_cursor_init(&c);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++)
            pi[i] = ferry__mix_draw(m, seed, shuffle, first + (uint64_t)i, &c, &ps[i]);
        Py_END_ALLOW_THREADS
    }
    ferry__mix_free(m);
    if (!idx || !src) {
        Py_XDECREF(idx);
        Py_XDECREF(src);
        return NULL;
    }
    return Py_BuildValue("(NN)", idx, src);
}

static PyMethodDef module_methods[] = {
    {"mix_info", mix_info_py, METH_VARARGS, "mix_info(spec) -> (sources, total, length)"},
    {"dataset_length", dataset_length_py, METH_VARARGS,
     "dataset_length(spec) -> the items of a C dataset spec"},
    {"mix_draw", mix_draw_py, METH_VARARGS,
     "mix_draw(spec, seed, shuffle, first, count) -> (uint64 indices, uint32 sources) as bytes"},
    {"epoch_batches", (PyCFunction)(void (*)(void))epoch_batches_py, METH_VARARGS | METH_KEYWORDS,
     "epoch_batches(n, batch_size, drop_last=False, rank=0, world_size=1, pad_shards=True)"},
    {"state_resized", state_resized_py, METH_VARARGS,
     "state_resized(blob, n) -> the blob of an epoch's start, for a dataset of n items"},
    {"state_check", state_check_py, METH_O,
     "state_check([state, ...]): the ranks' resume states agree, or StateError"},
    {"strerror", strerror_py, METH_VARARGS, "strerror(code) -> (name, description)"},
    {"version", version_py, METH_NOARGS, "the C library's version"},
    {0},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ferry._ferry",
    .m_doc = "The C half of ferry's Python package; use the ferry package.",
    .m_size = -1,
    .m_methods = module_methods,
};

/* DTYPE_NAMES: {code: numpy's name} of every dtype a field may have;
 * LAYOUT_SINGLE/TUPLE/DICT/FILL: pydataset.h's codes. */
static int add_tables(PyObject *m)
{
    PyObject *names = PyDict_New();
    if (!names)
        return -1;
    for (int code = 1; ferry_dtype_name(code); code++) {
        PyObject *k = PyLong_FromLong(code), *v = PyUnicode_FromString(ferry_dtype_name(code));
        int rc = k && v ? PyDict_SetItem(names, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) {
            Py_DECREF(names);
            return -1;
        }
    }
    if (PyModule_AddObject(m, "DTYPE_NAMES", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "LAYOUT_SINGLE", LAYOUT_SINGLE) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_TUPLE", LAYOUT_TUPLE) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_DICT", LAYOUT_DICT) < 0 ||
        PyModule_AddIntConstant(m, "LAYOUT_FILL", LAYOUT_FILL) < 0)
        return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__ferry(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, ferry_py_worker_methods) < 0 ||
        PyModule_AddFunctions(m, ferry_py_column_methods) < 0 ||
        PyModule_AddFunctions(m, ferry_py_process_methods) < 0 || ferry_py_loader_init(m) < 0 ||
        ferry_py_profile_init(m) < 0 ||
        ferry_py_worker_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#define ADD_CODE(name, value, msg) PyModule_AddIntConstant(m, "FERRY_" #name, value);
    FERRY_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    if (add_tables(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
