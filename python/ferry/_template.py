"""The clean parent's origin: a fork of the trainer (the "template") made as
a loader with Python process workers is built, from which the loader
forks its clean parent; and what a process of ferry's does first, forked
or spawned. No process starts at ``import ferry``."""

import os
import sys
import traceback

from . import _startup


# ------------------------------------------------------------ the clean parent's origin
#
# A loader with Python process workers gets, as it is built, a fork of the
# trainer (fork_template): the "template", which forks the loader's clean
# parent whenever the loader asks (option fork_from; at the start, and
# again if the clean parent dies). So the clean parent and its workers
# are the trainer as it was then: its imported modules (torch's ~160 MiB)
# are the trainer's pages until someone writes them, nothing is imported
# again, and the objects the trainer made before the loader (a
# multiprocessing Value, Lock, Queue; a tensor in shared memory) are
# theirs too, shared as torch's forked workers share them (_inherited).
# No process starts at `import ferry`.
#
# The fork is taken whatever threads the trainer runs, as torch's
# DataLoader forks its workers: what a fork can break (a lock another
# thread held, a thread pool the child believes it has) is what torch's
# users already live with, and ferry's processes limit torch's pool to one
# thread. FERRY_CLEAN_PARENT=spawn (or the loader option fork_from=-1)
# spawns a fresh ``python -m ferry.worker --fork-server`` instead: nothing
# of the trainer's is inherited then, and a dataset holding such objects
# is refused.

def clean_parent_spawned():
    """Whether this process's loaders spawn their clean parents
    (FERRY_CLEAN_PARENT=spawn) instead of forking them from the trainer."""
    how = os.environ.get("FERRY_CLEAN_PARENT", "fork").strip().lower()
    return how == "spawn"


def threads_running():
    """Threads of this process (1 when /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


class Template:
    """The forks of the trainer that give a loader its clean parents (their
    control socket is the loader's option fork_from). Two: the first
    becomes the loader's first clean parent itself when asked for one (no
    fork of its own on the way to the first batch); the second, forked
    while the loader opens (settle), forks every clean parent after that,
    and starts serving only once the first has taken its request (or is
    gone): so the first clean parent is always the first fork's. Both live
    as long as the loader and die with the trainer (PR_SET_PDEATHSIG)."""

    __slots__ = ("procs", "sock", "owner", "threads", "_pending")

    def __init__(self, pid, pidfd, sock, threads, pending):
        self.procs = [(pid, pidfd)]  # (pid, pidfd or None): the first, then the second
        self.sock, self.owner, self.threads = sock, os.getpid(), threads
        # (the second fork's function, then its _Job once asked of ferry's
        # forking thread; fds the trainer closes once it is forked)
        self._pending = pending

    @property
    def pid(self):
        """The process that forks the loader's clean parents now: the
        second once forked (the first is the clean parent by then)."""
        return self.procs[-1][0] if self.procs else None

    def fileno(self):
        return self.sock.fileno()

    def fork_second(self, close=()):
        """The second fork asked of ferry's forking thread, to be made while
        the loader opens: call it just before the C open, which releases
        the GIL that os.fork holds while it copies the trainer (10-15 ms
        for a big heap), and not earlier: the trainer's last steps before
        the open (the pickled dataset into its memfd) waited for it then.
        The fork closes the fds in close (the loader's, made since the
        first fork) and the pidfd of the first, none of them its own; the
        C open's are closed in any fork already (base/forkfds.h). Twice is
        fine."""
        if self._pending is not None and not isinstance(self._pending[0], _Job):
            fn, fds = self._pending
            not_its_own = tuple(close) + tuple(pidfd for _, pidfd in self.procs
                                               if pidfd is not None)

            def second():
                try:
                    return fn(not_its_own)
                finally:
                    # The trainer's copies of the templates' ends, closed as
                    # soon as the second has its own (or could not be
                    # forked), not at settle, after the open: a template
                    # gone while the loader opens then leaves its socket
                    # with no other end, and an ask for a clean parent
                    # fails at once (workers are spawned) instead of
                    # waiting out start_timeout_ms.
                    while fds:
                        os.close(fds.pop())
            self._pending = (_on_the_forking_thread(second), fds)

    def settle(self):
        """The second fork (fork_second, asked now if it was not yet)
        waited for (the job closes the trainer's copies of the templates'
        ends). Twice is fine."""
        self.fork_second()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        job = pending[0]
        try:
            pid = job.result()
        except OSError:
            pid = None  # the first alone: clean parents after it are spawned
        except BaseException:
            # Interrupted (Ctrl-C) while waiting: the fork goes on on its
            # thread. Kept pending, so that close waits for it again, then
            # kills the fork.
            self._pending = pending
            raise
        if pid is not None:
            self.procs.append((pid, _pidfd(pid)))

    def forget(self):
        """In a child forked from the trainer: the sockets are not its own."""
        pending, self._pending = self._pending, None
        if pending is not None:  # (those the trainer's job had not closed at the fork)
            for fd in pending[1]:
                os.close(fd)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for _, pidfd in self.procs:
            if pidfd is not None:
                os.close(pidfd)
        self.procs = []

    def close(self):
        """Killed and reaped (in the process that forked them); twice is
        fine."""
        if self.owner != os.getpid():
            self.forget()
            return
        pending = self._pending
        if pending is not None and not isinstance(pending[0], _Job):
            self._pending = None  # never asked for: not forked only to be killed
            for fd in pending[1]:
                os.close(fd)
        self.settle()
        procs, self.procs = self.procs, []
        import signal
        for pid, pidfd in procs:
            try:
                if pidfd is not None:
                    # By pidfd: a trainer that reaps every child may have
                    # reaped it already, and its pid be another process's now.
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                if pidfd is not None:
                    os.close(pidfd)
            try:
                os.waitpid(pid, 0)  # (retried on EINTR by Python itself)
            except ChildProcessError:  # reaped by the trainer's own handler
                pass
        if self.sock is not None:
            _reap_unclaimed(self.sock)
            self.sock.close()
            self.sock = None


def _reap_unclaimed(sock):
    """The clean parents the templates forked for asks no loader read the
    answer of (a first template killed between its answer and taking the
    ask off the socket leaves it to the second): this process's children
    (CLONE_PARENT), killed and reaped. The templates are gone by now, so
    nothing more comes."""
    import signal
    sock.setblocking(False)
    while True:
        try:
            msg = sock.recv(512)
        except OSError:
            return
        if not msg:
            return
        if msg[:1] != b"p":
            continue
        try:
            pidfd = os.pidfd_open(int(msg[1:].split()[0]))
        except (ValueError, OSError):
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def fork_template():
    """A new Template: its first fork made now, its second to be made on
    ferry's forking thread (Template.fork_second asks for it, settle waits
    for it); or None when clean parents are spawned here
    (clean_parent_spawned) or the fork fails (the loader then spawns its
    clean parent)."""
    if clean_parent_spawned():
        return None
    import socket
    threads = threads_running()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs = theirs.detach()  # an fd: both forks take it, the trainer closes it at settle
    # the second serves once the gate's write end is closed: the first
    # holds the only one (the trainer's is closed once the first is
    # forked) and closes it when it takes its request, or dies. So a
    # clean parent killed as the loader opens is replaced at once, not
    # after the open (where the trainer's end used to be closed).
    gate_r, gate_w = os.pipe()
    trainer = os.getpid()

    def fork(first, close=()):
        # What the trainer printed and has not flushed yet would be in the
        # fork's buffers too, and said twice (as multiprocessing's fork
        # start, torch's workers', flushes first).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:  # on whichever thread forked: the child's only one
            ours.close()
            if first:
                os.close(gate_r)
            for fd in close:
                os.close(fd)
            _run_template(theirs, trainer, first, gate_w if first else gate_r)  # never returns
        return pid
    try:
        pid = _on_a_lasting_thread(lambda: fork(True))
    except OSError:
        ours.close()
        for fd in (theirs, gate_r, gate_w):
            os.close(fd)
        return None
    os.close(gate_w)
    return Template(pid, _pidfd(pid), ours, threads,
                    (lambda close: fork(False, close), [theirs, gate_r]))


_forker = {}  # {"pid": owner, "queue": ...}: the thread that forks off the main thread


class _Job:
    """fn's result, or its exception raised, once the forking thread ran it."""

    __slots__ = ("box", "done")

    def __init__(self):
        import threading
        self.box, self.done = [], threading.Event()

    def result(self):
        self.done.wait()
        ok, value = self.box[0]
        if ok:
            return value
        raise value


def _on_the_forking_thread(fn):
    """fn() put on ferry's forking thread (a daemon thread that lasts as
    long as the process): a _Job."""
    import threading
    if _forker.get("pid") != os.getpid():
        import queue

        def serve(jobs):
            while True:
                job, fn = jobs.get()
                try:
                    job.box.append((True, fn()))
                except BaseException as e:  # noqa: BLE001 - raised in the caller
                    job.box.append((False, e))
                job.done.set()
        jobs = queue.SimpleQueue()
        threading.Thread(target=serve, args=(jobs,), name="ferry-fork", daemon=True).start()
        _forker.update(pid=os.getpid(), queue=jobs)
    job = _Job()
    _forker["queue"].put((job, fn))
    return job


def _on_a_lasting_thread(fn):
    """fn() run on this process's main thread (when called there) or on a
    daemon thread of ferry's that lasts as long as the process: a fork's
    PR_SET_PDEATHSIG fires when the *thread* that forked it ends, and a
    loader built on a short-lived thread (a helper, a thread pool) must not
    lose its template, its clean parent and its workers with it."""
    import threading
    if threading.current_thread() is threading.main_thread():
        return fn()
    return _on_the_forking_thread(fn).result()


def _run_template(sock_fd, trainer, first, gate):
    """In the fork: made a process of ferry's, then the fork-server loop
    without a dataset (ferry.worker.fork_server), until the loader (or the
    trainer) goes; never returns, never runs the trainer's exit handlers.
    first: it becomes the first clean parent asked of it, holding the
    gate's write end until then; else it serves once the gate is closed."""
    rc = 1
    try:
        import gc
        # The trainer's objects, shared with it page for page, out of the
        # collector's reach: a collection here or in a clean parent would
        # write to every one of them (their pages copied).
        gc.freeze()
        become_ferry_process()
        set_name("ferry-template")
        from . import worker
        rc = worker.fork_server(["--control-fd", str(sock_fd), "--parent", str(trainer),
                                 "--first" if first else "--after", str(gate)])
    except BaseException:  # noqa: BLE001 - said on stderr, then the exit code
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        _startup.leave(rc)


def become_ferry_process():
    """A fork of the trainer made one of ferry's processes, as a spawned
    one starts: the trainer's signal handlers back to their defaults
    (Ctrl-C ignored: the trainer handles it, see
    _startup.leave_ctrl_c_to_the_trainer), no signal blocked, no wakeup
    fd, the thread limits in the environment for what it starts, and
    multiprocessing told it is in a child (its after-fork resets, as in
    a child it forks itself)."""
    import signal
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if callable(handler) or sig == signal.SIGCHLD:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (ValueError, OSError):
                pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    _startup.limit_threads()
    after_fork_in_child()


def after_fork_in_child():
    """multiprocessing told that this process is a fork, as a child it
    forks itself is (when the trainer imported it): its finalizers are
    the parent's, and its objects reset their per-process state (a
    Queue's feeder thread, which the fork did not copy, starts anew)."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        try:
            util._finalizer_registry.clear()
            util._run_after_forkers()
        except Exception:  # noqa: BLE001 - a multiprocessing without them
            pass


def set_name(name):
    """The process's name (``ps -o comm``, /proc/PID/comm): a fork keeps the
    trainer's command line, so this is what tells ferry's processes apart."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass
