/*
 * pyprofile.c - _ferry.Profile: a snapshot of a loader's stage figures
 * (ferry_loader_profile, for the loader and each worker), and what the
 * package reads from it: the figures and the verdict as a dict (report),
 * a window of time between two snapshots (since), a stage's histogram
 * for Prometheus (histogram).
 *
 * A snapshot is plain memory once taken: any thread may read it, the
 * loader may be closed meanwhile. The arithmetic (quantiles, windows,
 * the verdict) is the C library's; nothing of it is written again here.
 */
#include "pyprofile.h"

#include <stdlib.h>
#include <string.h>

#include "ferry.h"

typedef struct {
    PyObject_HEAD
    uint32_t n;        /* worker slots */
    ferry_profile all; /* every worker's */
    ferry_profile *w;  /* n of them */
} ProfileObject;

static void profile_dealloc(ProfileObject *self)
{
    free(self->w);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ProfileType;

static ProfileObject *profile_alloc(uint32_t n)
{
    ProfileObject *p = PyObject_New(ProfileObject, &ProfileType);
    if (!p)
        return NULL;
    p->n = n;
    p->w = calloc(n ? n : 1, sizeof *p->w);
    if (!p->w) {
        Py_DECREF(p);
        return (ProfileObject *)PyErr_NoMemory();
    }
    return p;
}

PyObject *ferry_py_profile_take(ferry_loader *ld)
{
    /* With the GIL held all along: a close on another thread detaches
     * the loader under the GIL before it frees it (loader.c). Microseconds. */
    ferry_profile all;
    int rc = ferry_loader_profile(ld, -1, &all);
    if (rc != FERRY_OK)
        return ferry_py_raise(rc, ferry_last_error());
    ProfileObject *p = profile_alloc(all.workers);
    if (!p)
        return NULL;
    p->all = all;
    for (uint32_t i = 0; i < p->n && rc == FERRY_OK; i++)
        rc = ferry_loader_profile(ld, (int32_t)i, &p->w[i]);
    if (rc != FERRY_OK) {
        Py_DECREF(p);
        return ferry_py_raise(rc, ferry_last_error());
    }
    /* The loader's figures as the sum of the workers' copies, so the two
     * agree even if batches came in between. */
    for (int k = 0; k < FERRY_PROFILE_STAGES; k++) {
        ferry_profile_stage *s = &p->all.stage[k];
        memset(s, 0, sizeof *s);
        for (uint32_t i = 0; i < p->n; i++) {
            s->count += p->w[i].stage[k].count;
            s->sum_ns += p->w[i].stage[k].sum_ns;
            for (int b = 0; b < FERRY_PROFILE_BUCKETS; b++)
                s->buckets[b] += p->w[i].stage[k].buckets[b];
        }
    }
    return (PyObject *)p;
}

/* since(before) -> Profile: the figures between `before` and this one. */
static PyObject *profile_since(ProfileObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &ProfileType) || ((ProfileObject *)arg)->n != self->n) {
        PyErr_SetString(PyExc_TypeError, "since: needs an earlier Profile of the same loader");
        return NULL;
    }
    ProfileObject *before = (ProfileObject *)arg;
    ProfileObject *p = profile_alloc(self->n);
    if (!p)
        return NULL;
    ferry_profile_since(&p->all, &self->all, &before->all);
    for (uint32_t i = 0; i < self->n; i++)
        ferry_profile_since(&p->w[i], &self->w[i], &before->w[i]);
    return (PyObject *)p;
}

static double sec(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* {stage: {count, total, mean, p50, p90, p99}} in seconds. */
static PyObject *stages_dict(const ferry_profile *pr)
{
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < FERRY_STAGE_COUNT; k++) {
        const ferry_profile_stage *s = &pr->stage[k];
        PyObject *v = Py_BuildValue(
            "{sKsdsdsdsdsd}", "count", (unsigned long long)s->count, "total", sec(s->sum_ns),
            "mean", s->count ? sec(s->sum_ns) / (double)s->count : 0.0, "p50",
            sec(ferry_profile_quantile(s, 0.5)), "p90", sec(ferry_profile_quantile(s, 0.9)), "p99",
            sec(ferry_profile_quantile(s, 0.99)));
        if (!v || PyDict_SetItemString(d, ferry_stage_name(k), v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* report() -> dict: the span, the stages of all batches and of each
 * worker that delivered any, and the verdict. */
static PyObject *profile_report(ProfileObject *self, PyObject *unused)
{
    ferry_verdict v;
    ferry_profile_verdict(&self->all, self->w, self->n, &v);
    double span = self->all.end_ns > self->all.start_ns
                      ? sec(self->all.end_ns - self->all.start_ns)
                      : 0.0;
    PyObject *workers = PyDict_New(), *out = NULL, *stages = NULL;
    if (!workers)
        return NULL;
    for (uint32_t i = 0; i < self->n; i++) {
        const ferry_profile *w = &self->w[i];
        uint64_t n = w->stage[FERRY_STAGE_MAKE].count;
        if (!n)
            continue;
        PyObject *st = stages_dict(w);
        PyObject *one = st ? Py_BuildValue("{sKsdsN}", "batches", (unsigned long long)n, "busy",
                                           span > 0 ? sec(w->stage[FERRY_STAGE_MAKE].sum_ns) / span
                                                    : 0.0,
                                           "stages", st)
                           : NULL;
        PyObject *key = one ? PyLong_FromUnsignedLong(i) : NULL;
        int bad = !key || PyDict_SetItem(workers, key, one) < 0;
        Py_XDECREF(key);
        Py_XDECREF(one);
        if (bad)
            goto done;
    }
    stages = stages_dict(&self->all);
    if (!stages)
        goto done;
    out = Py_BuildValue(
        "{sdsKsOsOsssssdsNsN}", "seconds", span, "batches",
        (unsigned long long)self->all.stage[FERRY_STAGE_WAIT].count, "stages", stages, "workers",
        workers, "verdict", v.text, "kind", ferry_verdict_name(v.kind), "wait_share", v.wait_share,
        "slow_worker", v.worker >= 0 ? PyLong_FromLong(v.worker) : Py_NewRef(Py_None),
        "workers_needed",
        v.workers_needed ? PyLong_FromUnsignedLong(v.workers_needed) : Py_NewRef(Py_None));
done:
    Py_DECREF(workers);
    Py_XDECREF(stages);
    return out;
}

/* histogram(stage, worker=-1) -> (count, sum_seconds, [(le_seconds,
 * cumulative count)]) at each power of two from 1 us to about 69 s, as
 * Prometheus' buckets are; +Inf is the count. */
static PyObject *profile_histogram(ProfileObject *self, PyObject *args)
{
    int stage, worker = -1;
    if (!PyArg_ParseTuple(args, "i|i:histogram", &stage, &worker))
        return NULL;
    if (stage < 0 || stage >= FERRY_STAGE_COUNT || worker < -1 || worker >= (int)self->n) {
        PyErr_Format(PyExc_ValueError, "histogram: no stage %d or worker %d", stage, worker);
        return NULL;
    }
    const ferry_profile_stage *s = worker < 0 ? &self->all.stage[stage] : &self->w[worker].stage[stage];
    PyObject *bounds = PyList_New(0);
    uint64_t cum = 0;
    int b = 0;
    /* Bucket 0 ends at 2^10 ns, and every fourth after it at the next
     * power of two. */
    for (int m = 10; bounds && m <= 36; m++) {
        uint64_t le = UINT64_C(1) << m;
        while (b < FERRY_PROFILE_BUCKETS && ferry_profile_bucket_le(b) <= le)
            cum += s->buckets[b++];
        PyObject *pair = Py_BuildValue("(dK)", sec(le), (unsigned long long)cum);
        if (!pair || PyList_Append(bounds, pair) < 0)
            Py_CLEAR(bounds);
        Py_XDECREF(pair);
    }
    if (!bounds)
        return NULL;
    return Py_BuildValue("(KdN)", (unsigned long long)s->count, sec(s->sum_ns), bounds);
}

static PyObject *profile_workers(ProfileObject *self, void *unused)
{
    return PyLong_FromUnsignedLong(self->n);
}

static PyMethodDef profile_methods[] = {
    {"since", (PyCFunction)profile_since, METH_O,
     "since(before) -> Profile: the figures between an earlier snapshot and this one"},
    {"report", (PyCFunction)profile_report, METH_NOARGS,
     "report() -> dict: the stages (seconds), per worker, and the verdict"},
    {"histogram", (PyCFunction)profile_histogram, METH_VARARGS,
     "histogram(stage, worker=-1) -> (count, sum, [(le, cumulative count)])"},
    {0},
};

static PyGetSetDef profile_getset[] = {
    {"workers", (getter)profile_workers, NULL, "worker slots", NULL},
    {0},
};

static PyTypeObject ProfileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Profile",
    .tp_basicsize = sizeof(ProfileObject),
    .tp_dealloc = (destructor)profile_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A snapshot of a loader's stage figures (Loader.profile_snapshot()).",
    .tp_methods = profile_methods,
    .tp_getset = profile_getset,
};

int ferry_py_profile_init(PyObject *m)
{
    if (ferry_py_add_type(m, "Profile", &ProfileType) < 0)
        return -1;
    PyObject *names = PyTuple_New(FERRY_STAGE_COUNT);
    for (int k = 0; names && k < FERRY_STAGE_COUNT; k++)
        PyTuple_SET_ITEM(names, k, PyUnicode_FromString(ferry_stage_name(k)));
    if (!names || PyModule_AddObject(m, "STAGES", names) < 0) {
        Py_XDECREF(names);
        return -1;
    }
    return 0;
}
