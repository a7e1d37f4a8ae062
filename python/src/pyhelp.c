/*
 * pyhelp.c - the helpers the extension's files share: raising ferry's
 * errors as the package's exception classes, and importing on first use.
 */
#include "pyhelp.h"

#include <string.h>

PyObject *ferry_py_import_attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (!m)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return a;
}

int ferry_py_add_type(PyObject *m, const char *name, PyTypeObject *t)
{
    if (PyType_Ready(t) < 0)
        return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
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
