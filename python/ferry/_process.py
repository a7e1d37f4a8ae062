"""A local worker process as the trainer may look at one: what
``Loader.worker_process(i)`` returns, and what ferry.torch's iterators
expose as torch's ``_workers`` (multiprocessing.Process's API, in part).

Every answer is the process's own, never a guess:
- alive or not from a pidfd (os.pidfd_open) taken while the process was
  ferry's worker, so a pid used again by another process after this one
  has gone is never looked at, and never signalled;
- the exit status is the one the loader reaped it with: ferry's workers
  are the trainer's children, and the C loader reaps them (a worker that
  died and was replaced, and every worker at close()), telling the
  extension's exit book (python/src/loader.c), which outlives the loader;
- join() waits on that book's condition, with its deadline: no polling.
"""

import os
import select
import signal


class WorkerProcess:
    """One local worker process of a ferry.Loader: ``pid``, ``is_alive()``,
    ``join(timeout)``, ``exitcode`` (None until the loader has reaped it;
    then the exit code, or minus the signal that killed it, as
    multiprocessing says it), ``terminate()``, ``kill()``. Stays usable after
    the loader has closed (its exit is known then)."""

    __slots__ = ("pid", "index", "_c", "_since", "_fd")

    def __init__(self, c, index):
        """Worker ``index`` of the extension's loader ``c`` as it is now; a
        ValueError when no process runs in that place (a thread, or being
        replaced)."""
        self._c, self.index, self._fd = c, index, None
        # Where in the exit book this process's exit can only come after:
        # read before the pid, so that its entry, whenever it is made, is
        # at or after it.
        self._since = c.exits_seen()
        self.pid = c.worker_pid(index)
        if not self.pid:
            raise ValueError("no worker process in place %d at the moment" % index)
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return  # gone and reaped already: the book has its exit
        if c.closed or c.worker_pid(index) != self.pid:
            # Reaped between the two reads: the pid may be someone else's now.
            os.close(fd)
            return
        self._fd = fd  # the loader still had it: this pidfd is our worker's

    @property
    def name(self):
        return "ferry worker %d" % self.index

    def _status(self, timeout=0):
        """The wait status the loader reaped it with (-1: unknown), or None
        if not within timeout seconds (None: no limit)."""
        return self._c.worker_exit(self.pid, self._since, timeout)

    def _exited(self):
        """The process has ended (it may not be reaped yet)."""
        if self._fd is None:
            return True
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        return bool(p.poll(0))  # a pidfd is readable once its process has ended

    def is_alive(self):
        return self._status() is None and not self._exited()

    def join(self, timeout=None):
        """Waits until the loader has reaped the process (its exit status is
        then known), at most ``timeout`` seconds (None: no limit)."""
        self._status(timeout)

    @property
    def exitcode(self):
        st = self._status()
        if st is None or st < 0:
            return None  # running, or someone else reaped it (status unknown)
        return os.waitstatus_to_exitcode(st)

    def _signal(self, sig):
        if self._fd is not None and self._status() is None:
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                pass  # it ended meanwhile

    def terminate(self):
        """SIGTERM, if it still runs (the loader restarts it or reports its
        death, as with any worker that dies)."""
        self._signal(signal.SIGTERM)

    def kill(self):
        self._signal(signal.SIGKILL)

    def close(self):
        """Lets go of the pidfd (also done when collected)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        self.close()

    def __repr__(self):
        st = "alive" if self.is_alive() else "exitcode=%s" % self.exitcode
        return "<ferry.WorkerProcess %d pid %d %s>" % (self.index, self.pid, st)
