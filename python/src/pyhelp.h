/*
 * pyhelp.h - what every file of the _ferry extension module needs: Python's
 * header, and the two helpers they share (pyhelp.c).
 *
 * _ferry is the C half of the Python package (python/ferry/): the trainer's
 * side (loader.c: Loader, Batch and the buffer views numpy arrays are made
 * from), the worker's side (pydataset.c: the "python" dataset kind and the
 * worker program's main) and the module itself (module.c: its init, and
 * the tables C owns that the package reads instead of copying them).
 * Everything Python-facing that is easier to say in Python (the Mapping a
 * batch is, exception classes, option names, finding a dataset class)
 * lives in the package; this half touches bytes, the GIL and ferry's C API.
 *
 * Includes run one way: module.c -> loader.h, pydataset.h -> pyhelp.h.
 */
#ifndef FERRY_PY_PYHELP_H
#define FERRY_PY_PYHELP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Sets the Python exception for ferry code `code` with message `msg`
 * (ferry._errors.make builds the instance: the class follows the code).
 * Returns NULL, for `return ferry_py_raise(...)`. */
PyObject *ferry_py_raise(int code, const char *msg);

/* A new reference to attribute `name` of module `module`, imported on
 * first use; NULL with an exception set. */
PyObject *ferry_py_import_attr(const char *module, const char *name);

/* Readies type t and adds it to module m as `name`: 0, or -1 with an
 * exception set. */
int ferry_py_add_type(PyObject *m, const char *name, PyTypeObject *t);

/* pyprocess.c: worker_main, fork_sibling, tie_to_parent, ... */
extern PyMethodDef ferry_py_process_methods[];

/* columns.c: ferry._shared's hot loops (dict_columns, str_column, ...). */
extern PyMethodDef ferry_py_column_methods[];

#endif
