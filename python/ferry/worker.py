"""``python -m ferry.worker``: a ferry worker in this interpreter, and the
clean parent that forks a loader's workers.

A Python worker's life, top to bottom in this file:

0. **The template.** ``ferry.Loader`` forks the trainer as it is built
   (``ferry._template.fork_template``): that fork runs :func:`fork_server`
   without a dataset, and forks the loader's clean parent whenever the
   loader asks (option ``fork_from``; again if the clean parent dies). So
   the clean parent and the workers are the trainer as it was: its
   imports and data are their pages until written, and what only a fork
   can share (a ``multiprocessing`` Value, Lock, Queue) is shared. With
   ``FERRY_CLEAN_PARENT=spawn`` there is none, and the clean parent is
   spawned as ``python -m ferry.worker --fork-server``, which limits its
   thread pools to one thread (OMP/MKL/OpenBLAS, before numpy is
   imported).
1. **The clean parent.** One process per loader with Python workers
   (option ``fork_server``). It loads the dataset once (a named class
   built, or a pickled object read from the loader's memory), tells the
   loader it is ready, and then forks a worker each time the loader asks,
   replacements included. It starts no thread, so a fork of it is safe;
   its workers are made with clone(CLONE_PARENT)
   (``_ferry.fork_sibling``): they are the loader's children, watched and
   reaped by it, and they outlive a clean parent that dies.
2. **Fork.** The child takes the fds the request carried (its stderr, the
   task words, the batch slots, the dataset's bytes), sets torch's
   intra-op threads, and runs the worker program.
3. **Serve.** The C worker loop (``ferry_worker_main``): HELLO, CONFIG,
   the dataset opened (in a forked worker: the one the parent loaded),
   tasks until STOP.
4. **Die.** ``os._exit``: nothing of the interpreter's teardown runs, so a
   worker leaves the moment it is done, and with its loader (PDEATHSIG).

A remote worker (no ``--slot``) is one process per host::

    python -m ferry.worker --connect tcp://HOST:PORT --key worker.key \\
        --server-key loader.pub --allow-module mypkg [--processes N]

It serves Python datasets only from modules under the ``--allow-module``
prefixes (repeat it, or give a comma list): a loader cannot make it import
and call anything else, and it never unpickles anything. The other options
are ferry-worker's.
"""

import gc
import os
import socket
import sys

from ._startup import leave, limit_threads

_NAME = "python -m ferry.worker"


def _take_option(argv, name):
    """Removes ``name VALUE`` from argv; returns VALUE or None."""
    if name in argv:
        k = argv.index(name)
        if k + 1 < len(argv):
            value = argv[k + 1]
            del argv[k:k + 2]
            return value
    return None


def _threads_running():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _recv_request(sock, timeout=None, peek=False):
    """(args, fds, ask) of one request (ask: the id of a template's ask,
    "A", which its answer carries; None for "F"), ("I", modules, None) of
    an import hint, "idle" when none came within timeout seconds, or None
    when the loader is gone. peek: the request stays on the socket (its
    fds are this process's all the same); _drop_peeked takes it off."""
    sock.settimeout(timeout)
    try:
        msg, fds = _recv_fds(sock, socket.MSG_PEEK if peek else 0)
    except socket.timeout:
        return "idle"
    except (ConnectionError, OSError):
        return None
    if not msg:
        for fd in fds:
            os.close(fd)
        return None
    kind, body = msg[:1], msg[1:]
    if kind == b"I":
        return "I", body.decode().split(","), None
    args = [a.decode() for a in body.split(b"\0")[:-1]]
    ask = args.pop(0) if kind == b"A" and args else None
    return args, fds, ask


def _recv_fds(sock, flags):
    """(message, fds) of one message (socket.recv_fds, which ignores its
    flags argument before Python 3.12)."""
    import array
    fds = array.array("i")
    msg, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_LEN(16 * fds.itemsize), flags)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _drop_peeked(sock):
    """The request _recv_request peeked at taken off the socket (its fds,
    received again, closed)."""
    sock.settimeout(None)
    try:
        _msg, fds = _recv_fds(sock, 0)
    except OSError:
        return
    for fd in fds:
        os.close(fd)


def _answer(sock, ask, pid=None, error=None):
    """A request's answer: its child's pid, or why it failed; for an ask
    ("A"), with its id (forkserver.h)."""
    if ask is None:
        sock.send(b"P%d" % pid if error is None else ("E" + error).encode())
    else:
        sock.send(b"p%d %s" % (pid, ask.encode()) if error is None
                  else ("e%s %s" % (ask, error)).encode())


def _preload(modules):
    """Imports modules the trainer said its datasets will use; one that
    fails is left to fail where the dataset imports it (with its own
    traceback)."""
    import importlib
    for name in modules:
        if name and name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a hint, not a requirement
                pass


# What a fork says first on its stderr (the request's pipe to the loader):
# its pid. The clean parent answers each request with the pid too, but one
# killed between its fork and that answer would leave the fork unknown to
# the loader; the loader reads this instead (core/pool_start.c, MARK).
PID_MARK = b"\x01ferry-pid %d\n"


def _child(sock, args, fds):
    """In a fork: the request's fds put in place and the worker program (or
    a loader's clean parent) run; never returns."""
    rc = 1
    try:
        try:
            os.write(fds[0], PID_MARK % os.getpid())  # before anything else (see PID_MARK)
        except BrokenPipeError:
            # Nobody reads its stderr: forked for an ask the loader no
            # longer waits for (see fork_server), it leaves, saying nothing.
            rc = 0
            return
        from . import _template
        _template.set_name("ferry-worker")  # a clean parent renames itself (fork_server)
        os.close(sock.detach())  # the parent's control socket: not the child's
        _template.after_fork_in_child()
        os.dup2(fds[0], 2)
        os.close(fds[0])
        # The fds arrive at whatever numbers recvmsg gave; the request names
        # them as 3, 4, ... (where ferry__spawn puts them): renamed here, so
        # that no fd the dataset opened in the parent is overwritten.
        real = {str(3 + k): str(fd) for k, fd in enumerate(fds[1:])}
        for k, a in enumerate(args[:-1]):
            if a in ("--task-fd", "--shm-fd", "--data-fd", "--control-fd"):
                args[k + 1] = real.get(args[k + 1], args[k + 1])
        rc = main(args)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - said on stderr, then the exit code
        import traceback
        traceback.print_exc()
    finally:
        leave(rc)


def _trim_heap():
    """The heap's free memory back to the system (glibc's malloc_trim)
    before the clean parent forks: what loading the dataset allocated and
    freed (reading item 0 decodes an image, say) is then not part of every
    worker's memory. Elsewhere than glibc: nothing."""
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _release_file_pages():
    """The clean parent's mappings of shared libraries' code and constants
    given back (``release_file_pages``): a process that only forks never
    runs that code again, a fork maps such a page only when it touches it,
    and the parent's copies would be memory of its own (with torch and
    torchvision imported, 55 MiB less PSS in all for a 2-worker loader and
    a spawned process-wide parent, in earlier versions). Not with a thread
    running: one could be
    writing to a mapping meanwhile."""
    from . import _ferry
    if _threads_running() == 1:
        try:
            _ferry.release_file_pages()
        except OSError:  # no /proc
            pass


# A clean parent asked nothing for this long has forked what its loader
# wanted at the start: it gives its library pages back then, not before
# (reading /proc/self/smaps takes 25-40 ms with torch imported, which
# would delay the first workers).
SETTLE_AFTER_S = 0.2


def fork_server(argv):
    """``--fork-server --control-fd FD [--dataset SPEC --data-fd FD]
    --parent PID``: loads the dataset once, then forks a child for each
    request until the loader closes the connection. Without --dataset: a
    template (``ferry._template.fork_template``), whose children are
    clean parents; ``--first GATE``: the template that becomes the first
    clean parent asked of it itself (no fork), closing GATE then;
    ``--after GATE``: the one that serves once GATE reads its end."""
    from . import _dataset, _ferry, _handoff, _template
    ctl = int(_take_option(argv, "--control-fd"))
    first = _take_option(argv, "--first")
    after = _take_option(argv, "--after")
    spec = _take_option(argv, "--dataset")
    data_fd = _take_option(argv, "--data-fd")
    parent = _take_option(argv, "--parent")
    if parent is not None:
        _ferry.tie_to_parent(int(parent))
    if spec is not None:  # a loader's (a template names itself)
        _template.set_name("ferry-parent")
    sock = socket.socket(fileno=ctl)
    if data_fd is not None:
        _dataset.set_payload(_handoff.read_payload(int(data_fd)))
    if spec and spec.startswith("python:"):
        _dataset.preload(spec[len("python:"):])
    _trim_heap()
    try:
        # glibc's name-service state (nsswitch.conf read, its modules
        # looked for: 2 ms), which every worker's ZeroMQ asks for at
        # start, made once here for all of them.
        socket.getprotobyname("tcp")
    except OSError:
        pass
    if after is not None:  # until the first template took its request, or is gone
        while os.read(int(after), 1):
            pass
        os.close(int(after))
    try:
        sock.send(b"R")
    except OSError:  # the loader (or trainer) is gone already: nothing to serve
        return 0
    warned, settled = False, False
    while True:
        # The first template only peeks at a request before answering it:
        # killed in between, it leaves the request to the second (which
        # serves once the gate is closed, here by its death), not lost.
        req = _recv_request(sock, None if settled else SETTLE_AFTER_S, peek=first is not None)
        if req is None:
            return 0
        if req == "idle":
            _dataset.forget_first_items()
            _release_file_pages()
            settled = True
            continue
        args, fds, ask = req
        if first is not None and args != "I" and fds and "--fork-server" in args:
            # The first template: this process becomes the loader's first
            # clean parent itself, a fork sooner than forking one; the
            # second template serves the requests from now on. Killed
            # after answering and before the request is off the socket,
            # the second forks a clean parent for it too: the loader
            # (ferry__fork_ask) knows the answer is not its ask's, and
            # kills that one.
            _answer(sock, ask, pid=os.getpid())
            _drop_peeked(sock)
            os.close(int(first))
            _child(sock, args, fds)  # never returns
        if first is not None:
            _drop_peeked(sock)
        if args == "I":
            _preload(fds)
            _trim_heap()
            settled = False  # what these imports touched goes too, once idle
            continue
        if not fds:
            _answer(sock, ask, error="the request carried no stderr")
            continue
        if _threads_running() > 1 and not warned:
            warned = True
            print("ferry: warning: the clean parent (pid %d) runs %d threads; a fork copies "
                  "only one, so a lock another holds stays locked in the workers. Something "
                  "the dataset imports started them" % (os.getpid(), _threads_running()),
                  file=sys.stderr)
        # Every object so far to the collector's permanent generation: a
        # collection in the child then never walks (and so never writes)
        # the pages the fork shares with this process, as CPython's docs
        # advise for pre-fork servers.
        gc.freeze()
        try:
            pid = _ferry.fork_sibling()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            _answer(sock, ask, error=str(e))
            continue
        if pid == 0:
            _child(sock, args, fds)
        for fd in fds:
            os.close(fd)
        _answer(sock, ask, pid=pid)


# ---------------------------------------------------------------- a worker

def _worker_threads():
    """torch's intra-op pool to the same width as the others, when the
    dataset has imported torch (torch's own workers call
    torch.set_num_threads(1))."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            n = int(os.environ.get("FERRY_WORKER_THREADS", "1"))
            if torch.get_num_threads() != n:  # torch read OMP_NUM_THREADS at import
                torch.set_num_threads(n)  # 0.5-3 ms: skipped when it would change nothing
        except (ValueError, RuntimeError):
            pass


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--fork-server" in argv:
        argv.remove("--fork-server")
        return fork_server(argv)
    from . import _dataset, _ferry, _handoff
    allow, rest = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--allow-module" or a.startswith("--allow-module="):
            if "=" in a:
                value = a.split("=", 1)[1]
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                print("%s: --allow-module needs a module prefix" % _NAME, file=sys.stderr)
                return 2
            allow += [p.strip() for p in value.split(",") if p.strip()]
        else:
            rest.append(a)
        i += 1
    if "--help" in rest or "-h" in rest:
        _ferry.worker_main([_NAME, "--help"], [], _NAME)
        print("python workers:\n"
              "  --allow-module PFX  (remote) serve python: datasets from modules under PFX\n"
              "                      only; repeat or use commas. Without it, none at all\n"
              "  --fork-server       (local) the clean parent a loader forks its workers from")
        return 0
    remote = "--slot" not in rest
    data_fd = _take_option(rest, "--data-fd")
    if data_fd is not None and _dataset.has_preloaded():
        os.close(int(data_fd))  # a fork of the clean parent: the dataset is loaded already
    elif data_fd is not None and not remote:
        _dataset.set_payload(_handoff.read_payload(int(data_fd)))
    _dataset.configure(remote=remote, allow=allow)
    if not remote:
        _worker_threads()
    relaunch = [sys.executable, "-m", "ferry.worker"]
    for p in allow:
        relaunch += ["--allow-module", p]
    sys.stdout.flush()
    return _ferry.worker_main([_NAME] + rest, relaunch, _NAME)


def run():
    """The program: ``python -m ferry.worker ARGS``. A local worker or a
    clean parent leaves with os._exit, skipping the interpreter's teardown
    (seconds with torch imported), which has nothing to save."""
    limit_threads()
    rc = main()
    if "--slot" in sys.argv or "--fork-server" in sys.argv:
        leave(rc)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(rc)


if __name__ == "__main__":
    run()
