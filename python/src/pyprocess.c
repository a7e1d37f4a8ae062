/*
 * pyprocess.c - what the _ferry module offers ferry's own processes: the
 * worker program's main (ferry_worker_main, the GIL released), a fork whose
 * parent is the caller's parent (a clean parent's workers are its loader's
 * children), a process tied to its parent's life, giving back the file
 * pages a fork inherited, and the per-sample seed.
 */
#include "pyhelp.h"

#include <errno.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ferry.h"
#include "ferry_dataset.h"

/* A NULL-terminated char* array of the strings in list `seq` (kept alive
 * by the caller); PyMem_Free it. */
static char **string_array(PyObject *seq, int *n_out)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **out = PyMem_Calloc((size_t)n + 1, sizeof *out);
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!s) {
            PyMem_Free(out);
            return NULL;
        }
        out[i] = (char *)s;
    }
    if (n_out)
        *n_out = (int)n;
    return out;
}

/* A Python worker makes and frees the same few buffers for every item
 * (decoded images, tensors of a transform: ~0.5-5 MB each). glibc's
 * defaults give such a buffer back to the kernel when it is freed (mmap
 * above a threshold that moves, the heap's top trimmed past twice it), so
 * each item faulted its pages in afresh: measured 15-20% of an ImageFolder
 * worker's time once items went into the batch one by one. Buffers under
 * 16 MiB come from the heap, which keeps up to 32 MiB free at its top. */
static void tune_malloc(void)
{
#ifdef M_MMAP_THRESHOLD
    mallopt(M_MMAP_THRESHOLD, 16 << 20);
    mallopt(M_TRIM_THRESHOLD, 32 << 20);
#endif
}

/* worker_main(argv, relaunch, name) -> exit code: ferry_worker_main with
 * the GIL released. */
static PyObject *worker_main(PyObject *self, PyObject *args)
{
    PyObject *argv_o, *relaunch_o;
    const char *name;
    if (!PyArg_ParseTuple(args, "OOs:worker_main", &argv_o, &relaunch_o, &name))
        return NULL;
    tune_malloc();
    PyObject *argv_seq = PySequence_Fast(argv_o, "argv must be a list of str");
    PyObject *rel_seq = argv_seq ? PySequence_Fast(relaunch_o, "relaunch must be a list of str")
                                 : NULL;
    int argc = 0, rc = -1;
    char **argv = rel_seq ? string_array(argv_seq, &argc) : NULL;
    char **relaunch = argv ? string_array(rel_seq, NULL) : NULL;
    if (relaunch) {
        Py_BEGIN_ALLOW_THREADS rc = ferry_worker_main(argc, argv, name, relaunch);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(argv);
    PyMem_Free(relaunch);
    Py_XDECREF(argv_seq);
    Py_XDECREF(rel_seq);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(rc);
}


static PyObject *sample_seed(PyObject *self, PyObject *args)
{
    unsigned long long seed, epoch, index;
    if (!PyArg_ParseTuple(args, "KKK:sample_seed", &seed, &epoch, &index))
        return NULL;
    return PyLong_FromUnsignedLongLong(ferry_sample_seed(seed, epoch, index));
}

/* A fork by clone(flags | SIGCHLD), with Python's own before/after-fork
 * work around it, as os.fork() does (its locks, threading's state,
 * os.register_at_fork), but not the C library's: its pthread_atfork
 * handlers (a library's lock, copied held from a thread of the trainer
 * this process is a fork of) could wait for ever. Only safe in a process
 * that has started no thread: the callers check. */
static PyObject *raw_fork(unsigned long flags)
{
    PyOS_BeforeFork();
    long pid = syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0);
    int e = errno;
    if (pid == 0) {
        PyOS_AfterFork_Child();
        return PyLong_FromLong(0);
    }
    PyOS_AfterFork_Parent();
    if (pid < 0) {
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(pid);
}

/* fork_sibling() -> pid in the parent, 0 in the child: a fork of this
 * process whose parent is this process's parent (CLONE_PARENT), so that a
 * clean parent's workers are its loader's children, reaped and watched by
 * pidfd there like spawned ones, and outlive a clean parent that dies. */
static PyObject *fork_sibling(PyObject *self, PyObject *unused)
{
    return raw_fork(CLONE_PARENT);
}

/* fork_child() -> pid in the parent, 0 in the child: a fork of this
 * process, its child (a clean parent's probe of item 0: _dataset.probed). */
static PyObject *fork_child(PyObject *self, PyObject *unused)
{
    return raw_fork(0);
}

/* tie_to_parent(pid): this process is killed when its parent goes
 * (PR_SET_PDEATHSIG), and exits now if the parent is not `pid` any more
 * (it went before the call). For a clean parent, as ferry-worker's
 * --parent does for a worker. */
static PyObject *tie_to_parent(PyObject *self, PyObject *arg)
{
    long pid = PyLong_AsLong(arg);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)pid)
        _exit(3);
    Py_RETURN_NONE;
}

/* Whether the smaps mapping with header line `head`, VmFlags `flags`, and
 * `anon_kb`, `swap_kb`, `rss_kb` from its lines holds only pages of its
 * file that nothing wrote: named by an absolute path, not writable, no
 * anonymous (copied on write) page resident or swapped out (relocated
 * constants are written, then made read-only), not locked, not hugetlb.
 * Dropping such a mapping's pages loses nothing: the next touch maps the
 * same page of the page cache. */
static int file_pages_only(const char *head, const char *flags, long anon_kb, long swap_kb,
                           long rss_kb)
{
    char perms[8];
    unsigned long long inode;
    char path[2];
    if (anon_kb != 0 || swap_kb != 0 || rss_kb <= 0)
        return 0;
    if (sscanf(head, "%*x-%*x %7s %*x %*s %llu %1s", perms, &inode, path) != 3)
        return 0;
    if (perms[1] != '-' || path[0] != '/' || inode == 0)
        return 0;
    return strstr(flags, " lo") == NULL && strstr(flags, " ht") == NULL;
}

/* release_file_pages() -> KiB: this process stops mapping the pages of its
 * read-only file mappings (shared libraries' code and constants) that it
 * touched while importing (madvise MADV_DONTNEED). For a clean parent,
 * which only forks: it runs none of that code again, a fork maps a file
 * page lazily, when the child touches it, and so the parent's copy of the
 * mapping is its own memory only (PSS) and page cache the kernel could
 * otherwise reclaim. A mapping with a page written (relocations, .data) is
 * left alone: MADV_DONTNEED would throw that write away. Single-threaded
 * callers only: a thread that wrote to a mapping meanwhile (after an
 * mprotect) would lose that page. */
static PyObject *release_file_pages(PyObject *self, PyObject *unused)
{
    FILE *f = fopen("/proc/self/smaps", "re");
    if (f == NULL)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "/proc/self/smaps");
    char head[512] = "", *line = NULL;
    size_t cap = 0;
    unsigned long lo = 0, hi = 0;
    long anon = -1, swap = -1, rss = 0, released = 0;
    while (getline(&line, &cap, f) >= 0) {
        long kb;
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) { /* a mapping's first line */
            lo = a;
            hi = b;
            snprintf(head, sizeof head, "%s", line);
            anon = swap = -1;
            rss = 0;
        } else if (sscanf(line, "Rss: %ld kB", &kb) == 1) {
            rss = kb;
        } else if (sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
            anon = kb;
        } else if (sscanf(line, "Swap: %ld kB", &kb) == 1) {
            swap = kb;
        } else if (strncmp(line, "VmFlags:", 8) == 0) {
            /* a mapping's last line: decide on what it said */
            if (file_pages_only(head, line + 8, anon, swap, rss) &&
                madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0)
                released += rss;
        }
    }
    free(line);
    fclose(f);
    return PyLong_FromLong(released);
}

PyMethodDef ferry_py_process_methods[] = {
    {"release_file_pages", release_file_pages, METH_NOARGS,
     "release_file_pages() -> KiB: unmaps this process's unwritten read-only file pages"},
    {"tie_to_parent", tie_to_parent, METH_O,
     "tie_to_parent(pid): killed when the parent goes; exits now if it is not pid"},
    {"fork_sibling", fork_sibling, METH_NOARGS,
     "fork_sibling() -> pid, 0 in the child: a fork whose parent is this process's parent"},
    {"fork_child", fork_child, METH_NOARGS,
     "fork_child() -> pid, 0 in the child: a fork of this process without the C library's "
     "fork handlers"},
    {"worker_main", worker_main, METH_VARARGS,
     "worker_main(argv, relaunch, name) -> exit code: the ferry-worker program"},
    {"sample_seed", sample_seed, METH_VARARGS,
     "sample_seed(seed, epoch, index): the per-sample seed (ferry_sample_seed)"},
    {0},
};
