/*
 * pydataset.h - the worker's side of _ferry (pydataset.c): the "python"
 * dataset kind, and how a dataset's items are laid out (ferry._dataset
 * reads the codes from the module).
 */
#ifndef FERRY_PY_PYDATASET_H
#define FERRY_PY_PYDATASET_H

#include "pyhelp.h"

/* How items are laid out (LAYOUT_FILL: the dataset fills the batch itself,
 * its __ferry_fill__ is what open_dataset gives as get_batch). */
enum ferry_py_layout { LAYOUT_SINGLE = 0, LAYOUT_TUPLE = 1, LAYOUT_DICT = 2, LAYOUT_FILL = 3 };

/* Adds the kind's state (worker_state, ...) to the module. */
int ferry_py_worker_init(PyObject *m);
extern PyMethodDef ferry_py_worker_methods[];

#endif
