"""What every Python test of ferry gets: a hard time limit, and a check
afterwards that it left nothing behind (child processes, file descriptors,
ferry's socket directories), waited for with a deadline, never a sleep."""

import glob
import os
import signal
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the test datasets (datasets.py), importable by workers too
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [HERE, os.environ.get("PYTHONPATH", "")] if p)

import ferry  # noqa: E402,F401 - imported before any test's snapshot (it starts no process)


def _warm_mp_heap():
    """multiprocessing's heap keeps its first arena (an fd on an unlinked
    file) for the process's life: made here, before any test counts fds
    (tests share mp.Value and mp.Array with their workers)."""
    import multiprocessing as mp
    mp.Array("d", 4096)


_warm_mp_heap()

TEST_LIMIT_S = 90


def children():
    """Pids of this process's live children (zombies included)."""
    me = str(os.getpid())
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            out.append(int(stat.split("/")[2]))
    return out


def fds():
    return sorted(os.listdir("/proc/self/fd"))


def socket_dirs():
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return glob.glob(os.path.join(tmp, "ferry-%d-*" % os.getpid()))


def wait_for(pred, seconds, what):
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail("after %.0f s still %s" % (seconds, what))
        time.sleep(0.01)  # polling an observable condition, with a deadline


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    def on_alarm(signum, frame):
        raise TimeoutError("test ran past its %d s limit" % TEST_LIMIT_S)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_LIMIT_S)
    before_fds = fds()
    before_kids = set(children())
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    import gc
    gc.collect()
    wait_for(lambda: set(children()) <= before_kids, 10,
             "child processes left: %s" % (set(children()) - before_kids))
    wait_for(lambda: fds() == before_fds, 10, "fds differ: %s -> %s" % (before_fds, fds()))
    assert socket_dirs() == [], "socket directories left: %s" % socket_dirs()
