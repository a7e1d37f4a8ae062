/*
 * module.c - the _ferry extension module: its init, and the two helpers
 * its files share (raising ferry errors, importing on first use).
 */
#include "module.h"

#include <string.h>

#include "ferry.h"

PyObject *ferry_py_import_attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (!m)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return a;
}

PyObject *ferry_py_raise(int code, const char *msg)
{
    /* The C text may be cut inside a UTF-8 character: never let that turn
     * the error into a UnicodeDecodeError. */
    msg = msg ? msg : "";
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    PyObject *make = text ? ferry_py_import_attr("ferry._errors", "make") : NULL;
    PyObject *exc = make ? PyObject_CallFunction(make, "iO", code, text) : NULL;
    Py_XDECREF(make);
    Py_XDECREF(text);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

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

static PyMethodDef module_methods[] = {
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

PyMODINIT_FUNC PyInit__ferry(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, ferry_py_worker_methods) < 0 || ferry_py_loader_init(m) < 0 ||
        ferry_py_worker_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#define ADD_CODE(name, value, msg) PyModule_AddIntConstant(m, "FERRY_" #name, value);
    FERRY_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    return m;
}
