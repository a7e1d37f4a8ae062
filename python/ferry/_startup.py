"""What a process of ferry's own (a worker, a clean parent) does before
anything else, apart from ferry.worker: the package does it as it is
imported, and ``python -m ferry.worker`` imports the package before that
module runs (importing ferry.worker from the package would make runpy
warn that it runs a module already imported)."""

import os
import sys

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


# How the ``-c`` lines that run ferry's worker program end (a comment).
C_LINE_MARK = "  # ferry worker"


def is_ferry_process(argv=None):
    """Whether this interpreter runs ``python -m ferry.worker`` (a worker,
    a clean parent, a remote worker host) or one of the ``-c`` lines that
    run ferry's worker program (ferry._dataset.worker_command and
    c_worker_command), by its command line (``sys.orig_argv``)."""
    if argv is None:
        argv = getattr(sys, "orig_argv", None) or []  # the interpreter's own (3.10+)
    k = 1
    while k < len(argv) - 1:
        a = argv[k]
        if a == "-m":
            return argv[k + 1] == "ferry.worker"
        if a == "-c":
            return argv[k + 1].endswith(C_LINE_MARK)
        if not a.startswith("-"):
            return False  # a script
        k += 2 if a in ("-W", "-X", "--check-hash-based-pycs") else 1
    return False


def leave_ctrl_c_to_the_trainer(argv=None):
    """In a local process of ferry's (a worker, a clean parent), SIGINT is
    ignored from the start: Ctrl-C in a terminal goes to the whole process
    group, the trainer handles it (its loader's close stops these), and a
    KeyboardInterrupt here would only print a traceback of ferry's own
    code under the user's. The C worker loop ignores it too, but only once
    it runs: a clean parent, or a worker still importing, used to print
    one. A remote worker host (no --slot) keeps it: Ctrl-C stops it."""
    import signal
    argv = sys.argv if argv is None else argv
    local = "--slot" in argv or "--fork-server" in argv or \
        any(isinstance(a, str) and a.endswith(C_LINE_MARK) for a in
            (getattr(sys, "orig_argv", None) or []))
    if local:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def leave(rc):
    """Ends one of ferry's processes with exit code rc (1 for anything not
    an int) at once: what it wrote is flushed, and nothing else of the
    interpreter's teardown runs (seconds with torch imported, nothing to
    save; in a fork of the trainer, the trainer's atexit handlers)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc if isinstance(rc, int) else 1)


def limit_threads():
    """One thread for the numeric libraries' pools in this process and its
    children, as torch's own workers run (``FERRY_WORKER_THREADS`` says
    otherwise), unless the environment sets them. Before numpy or torch is
    imported: OpenBLAS reads its variable once, at load, and a pip wheel's
    starts one thread per core then. The package does this first thing in
    ferry's own processes (``import ferry`` runs before ferry.worker's
    ``run``)."""
    n = os.environ.get("FERRY_WORKER_THREADS", "1")
    for var in _THREAD_VARS:
        os.environ.setdefault(var, n)
