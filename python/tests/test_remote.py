"""Remote Python workers (python -m ferry.worker --connect tcp://...) and
their allow-list: a loader can make a remote worker import and call only
modules under its --allow-module prefixes."""

import signal
import socket
import subprocess
import sys

import pytest

import ferry
from datasets import Items


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RemoteWorker:
    """A `python -m ferry.worker` subprocess that connects to port; stopped
    (SIGTERM: BYE, exit) and reaped on exit from the with block."""

    def __init__(self, port, allow):
        args = [sys.executable, "-m", "ferry.worker", "--connect",
                "tcp://127.0.0.1:%d" % port, "--insecure"]
        for a in allow:
            args += ["--allow-module", a]
        self.p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.stderr = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.p.send_signal(signal.SIGTERM)
        self.stderr = self.p.communicate(timeout=30)[1]


def open_remote(port, dataset, **kw):
    return ferry.Loader(dataset, workers=0, bind="tcp://127.0.0.1:%d" % port, insecure=True,
                        batch_size=5, **kw)


def test_remote_worker_serves_an_allowed_module():
    port = free_port()
    with RemoteWorker(port, ["datasets"]) as w:
        with open_remote(port, Items, dataset_kwargs={"n": 20}, epochs=1) as ld:
            got = [b.indices.tolist() for b in ld]
            assert sorted(sum(got, [])) == list(range(20))
            assert ld.stats()["joined"] == 1
    assert w.p.returncode == 0, w.stderr


def test_remote_worker_refuses_a_module_not_allowed_and_both_sides_say_so():
    port = free_port()
    with RemoteWorker(port, ["mypkg"]) as w:
        with pytest.raises(ferry.Timeout) as ei:
            open_remote(port, Items, start_timeout_ms=3000)
    msg = str(ei.value)
    assert "refused" in msg and "does not serve module 'datasets'" in msg
    assert "allowed: mypkg" in msg
    assert "does not serve module 'datasets'" in w.stderr


def test_remote_worker_refuses_what_an_allowed_module_merely_imports():
    port = free_port()
    with RemoteWorker(port, ["datasets"]) as w:
        # datasets imports os; os.system is not datasets' own.
        with pytest.raises(ferry.Timeout) as ei:
            open_remote(port, 'python:datasets:os.system {"kwargs": {"command": "true"}}',
                        start_timeout_ms=3000)
    assert "comes from module 'posix', which is not allowed" in str(ei.value)
    assert "not allowed" in w.stderr


def test_remote_worker_without_allow_list_serves_no_python_dataset():
    port = free_port()
    with RemoteWorker(port, []) as w:
        with pytest.raises(ferry.Timeout, match="allowed: none"):
            open_remote(port, Items, start_timeout_ms=3000)
        # C kinds are still served.
        with open_remote(port, "synthetic:n=10,dim=4", epochs=1) as ld:
            assert sum(b.size for b in ld) == 10


def test_a_fed_sampler_s_batches_are_served_by_a_remote_worker_as_fed():
    # The trainer's own sampler (option feed_batches): each task carries
    # its indices, so a remote worker holding the named dataset makes
    # exactly the batches fed, of any length up to batch_size, in order.
    epochs = [[[7, 1, 3], [0, 2, 4, 5], [9]], [[19, 18], [6], [8, 10, 11, 12]]]
    port = free_port()
    with RemoteWorker(port, ["datasets"]) as w:
        with ferry.Loader(Items, dataset_kwargs={"n": 20}, workers=0, insecure=True,
                          bind="tcp://127.0.0.1:%d" % port, batch_size=4, feed_batches=3,
                          epochs=2, shuffle=False) as ld:
            assert len(ld) == 3
            ld.feed(0, epochs[0] + epochs[1])
            got = [(b.epoch, b.indices.tolist(), b["y"].tolist()) for e in range(2) for b in ld]
    want = [(e, b, [i * i for i in b]) for e in range(2) for b in epochs[e]]
    assert got == want
    assert w.p.returncode == 0, w.stderr


def test_profile_names_a_remote_worker_by_its_host_and_pid():
    port = free_port()
    with RemoteWorker(port, []) as w:
        with open_remote(port, "synthetic:n=200,dim=4", min_workers=1) as ld:
            it = ld.stream()
            for _ in range(10):
                next(it)
            p = ld.profile()
            (slot,) = p["workers"]
            host, _, pid = p["workers"][slot]["host"].rpartition(":")
            pid = int(pid)
            # The worker itself, or the session child it forked.
            with open("/proc/%d/stat" % pid) as f:
                parent = int(f.read().rpartition(")")[2].split()[1])
            assert w.p.pid in (pid, parent)
            assert host and socket.gethostname().startswith(host)
            assert p["workers"][slot]["pid"] is None  # not a local process
