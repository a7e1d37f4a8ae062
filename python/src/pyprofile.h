/*
 * pyprofile.h - _ferry.Profile (pyprofile.c): snapshots of a loader's stage
 * figures, read by the package (Loader.profile, ferry._metrics).
 */
#ifndef FERRY_PY_PYPROFILE_H
#define FERRY_PY_PYPROFILE_H

#include "pyhelp.h"

#include "ferry.h"

/* A new Profile of loader ld (the loader's and each worker's figures),
 * or NULL with an exception set. */
PyObject *ferry_py_profile_take(ferry_loader *ld);

int ferry_py_profile_init(PyObject *m);

#endif
