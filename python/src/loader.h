/*
 * loader.h - the trainer's side of _ferry (loader.c): adds Loader, Batch
 * and View to the module.
 */
#ifndef FERRY_PY_LOADER_H
#define FERRY_PY_LOADER_H

#include "pyhelp.h"

int ferry_py_loader_init(PyObject *m);

#endif
