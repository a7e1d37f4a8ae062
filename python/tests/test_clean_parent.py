"""Python workers forked by one clean parent per loader: what it loads,
whose children the workers are, replacements, its own death, threads, and
datasets passed as objects."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ferry
from conftest import children, wait_for
from datasets import Items


def ppid_of(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def template_pid():
    proc = ferry._dataset._template.get("proc")
    return proc.pid if proc is not None else None


def parent_of_workers(ld, n=2):
    """The loader's clean parent: the trainer's child with --fork-server
    that is neither a worker (a fork of it: the same command line) nor the
    process-wide one."""
    workers = {ld.worker_pid(i) for i in range(n)} | {template_pid()}
    for pid in children():
        if pid not in workers:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if b"--fork-server" in f.read():
                        return pid
            except OSError:
                continue
    return None


def test_workers_are_the_loaders_children_and_share_one_loaded_dataset(tmp_path):
    with ferry.Loader(Items, dataset_kwargs={"n": 40}, batch_size=4, workers=2, epochs=1) as ld:
        ys = sorted(int(v) for b in ld for v in b["y"])
        assert ys == [i * i for i in range(40)]
        for i in range(2):
            assert ppid_of(ld.worker_pid(i)) == os.getpid()  # forked with CLONE_PARENT
        parent = parent_of_workers(ld)
        assert parent is not None and parent not in (ld.worker_pid(0), ld.worker_pid(1))
        # Clean parents: this loader's, and the process-wide one `import
        # ferry` started (which starts no other: a worker process imports
        # ferry too).
        workers = {ld.worker_pid(0), ld.worker_pid(1)}
        servers = [p for p in descendants()
                   if b"--fork-server" in cmdline(p) and p not in workers]
        assert parent in servers and len(servers) <= 2, servers
        assert template_pid() is None or template_pid() in servers


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def descendants():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(ppid_of(int(d)), []).append(int(d))
            except (OSError, IndexError):
                continue
    out, todo = [], [os.getpid()]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


RELEASE = r"""
import os, sys
import ferry
from datasets import Items
tmpl = ferry._dataset._template["proc"]
assert tmpl.poll() is None, "import ferry started no clean parent"
with ferry.Loader("synthetic:n=64,dim=8", batch_size=8, workers=2, epochs=1) as ld:
    assert sum(len(b["y"]) for b in ld) == 64
# A loader running C is the first: the clean parent's imports were for nothing.
assert tmpl.poll() is not None, "the process-wide clean parent is still running"
with ferry.Loader(Items, dataset_kwargs={"n": 40}, batch_size=4, workers=2, epochs=1) as ld:
    assert sorted(int(v) for b in ld for v in b["y"]) == [i * i for i in range(40)]
    assert ld.stats()["restarts"] == 0
print("ok", flush=True)
"""


def test_a_first_loader_running_c_releases_the_process_wide_clean_parent():
    # In a process of its own: this one's clean parent serves the others.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr


def test_a_killed_worker_is_replaced_by_a_fork_and_every_item_arrives_once():
    with ferry.Loader(Items(200, slow_ms=2), batch_size=5, workers=2, epochs=2) as ld:
        parent = parent_of_workers(ld)
        assert parent is not None
        it = ld.stream()
        got = [int(v) for v in next(it)["y"]]
        victim = ld.worker_pid(1)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: ld.worker_pid(1) not in (0, victim), 10, "worker 1 replaced")
        got += [int(v) for b in it for v in b["y"]]
        assert sorted(got) == sorted([i * i for i in range(200)] * 2)
        new = ld.worker_pid(1)
        # A fork of the same clean parent: its child made with CLONE_PARENT,
        # so the trainer's; the parent did not change.
        assert ppid_of(new) == os.getpid() and parent_of_workers(ld) == parent
        assert ld.stats()["restarts"] == 1


def test_the_clean_parent_killed_is_replaced_and_nothing_is_lost():
    with ferry.Loader(Items(300, slow_ms=1), batch_size=5, workers=2, epochs=1) as ld:
        it = iter(ld)
        got = [int(v) for v in next(it)["y"]]
        parent = parent_of_workers(ld)
        os.kill(parent, signal.SIGKILL)
        wait_for(lambda: parent_of_workers(ld) not in (None, parent), 10, "a new clean parent")
        # A worker killed now is forked by the new parent.
        victim = ld.worker_pid(0)
        os.kill(victim, signal.SIGKILL)
        got += [int(v) for b in it for v in b["y"]]
        assert sorted(got) == [i * i for i in range(300)]
        assert ld.worker_pid(0) not in (0, victim)


def test_the_clean_parent_killed_under_fail_policy_raises():
    ld = ferry.Loader(Items(100, slow_ms=5), batch_size=5, workers=1, on_worker_failure="fail")
    try:
        it = ld.stream()
        next(it)
        os.kill(parent_of_workers(ld, 1), signal.SIGKILL)
        with pytest.raises(ferry.WorkerError, match="clean parent .* killed by signal SIGKILL"):
            for _ in range(1000):
                next(it)
    finally:
        ld.close()


def rss_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


def test_clean_parents_map_no_library_page_they_touched_while_importing():
    with ferry.Loader(Items, dataset_kwargs={"n": 40}, batch_size=4, workers=2, epochs=1) as ld:
        assert len(list(ld)) == 10
        # Each clean parent gives those pages back once nothing was asked
        # of it for a moment (worker.SETTLE_AFTER_S): the process-wide one
        # after its imports, this loader's after forking its workers. They
        # imported what this process imported, yet map a few pages of it
        # (those their fork loops touched since).
        mine = rss_kb(os.getpid(), "RssFile")
        for pid in (template_pid(), parent_of_workers(ld)):
            if pid is not None:
                wait_for(lambda: rss_kb(pid, "RssFile") * 3 < mine, 10,
                         "clean parent %d maps %d kB of files (this process %d kB)"
                         % (pid, rss_kb(pid, "RssFile"), mine))


RELEASED = r"""
import os, numpy as np
from ferry import _ferry
def file_kb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssFile:"))
table = np.arange(100000, dtype=np.float64)  # a written (anonymous) mapping
before = file_kb()
released = _ferry.release_file_pages()
after = file_kb()
assert released > 0 and after < before - released // 2, (before, released, after)
assert float(table.sum()) == 4999950000.0  # written pages kept
assert np.linalg.norm(np.ones(4)) == 2.0 and _ferry.release_file_pages() >= 0  # code refaults
print("ok")
"""


def test_releasing_file_pages_keeps_written_pages_and_code_runs_on():
    p = subprocess.run([sys.executable, "-c", RELEASED], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr


class Threads:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import torch
        return np.int64(torch.get_num_threads())


def test_one_thread_per_worker_by_default():
    pytest.importorskip("torch")
    with ferry.Loader(Threads(), batch_size=2, workers=2, epochs=1) as ld:
        assert {int(v) for b in ld for v in b[0]} == {1}


# A sitecustomize that logs "pid OPENBLAS_NUM_THREADS" when numpy is first
# imported: what a pip wheel's OpenBLAS reads, once, as it loads (and
# starts a thread per core unless told one).
NUMPY_SPY = """
import os, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            with open(os.environ["FERRY_TEST_SPY"], "a") as f:
                f.write("%d %s\\n" % (os.getpid(), os.environ.get("OPENBLAS_NUM_THREADS", "-")))
        return None
sys.meta_path.insert(0, Spy())
"""


def test_ferrys_own_processes_limit_thread_pools_before_numpy_loads(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(NUMPY_SPY)
    log = tmp_path / "numpy.log"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(FERRY_TEST_SPY=str(log), FERRY_PRESTART="0",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(ferry._dataset, "_child_finds_ferry", lambda: False)
    path, args = ferry.worker_command()  # the -c line, for a ferry not on the path
    assert args.startswith("-c\n")
    for cmd in ([sys.executable, "-m", "ferry.worker", "--help"],
                [path] + args.split("\n") + ["--help"],
                [sys.executable, "-c", "import ferry"]):  # a trainer: its own settings kept
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["1", "1", "-"]


def test_close_of_idle_workers_is_quick():
    ld = ferry.Loader(Items(50), batch_size=5, workers=2)
    next(iter(ld))
    t0 = time.monotonic()
    ld.close()
    # The grace period is for work in hand: idle forked workers leave at once.
    assert time.monotonic() - t0 < 1.5


# ---------------------------------------------------------------- objects

def test_objects_of_every_kind_are_datasets():
    a = np.arange(30, dtype=np.float32).reshape(10, 3)
    # (dataset, the field holding a function of the index, its values)
    cases = ((list(range(10)), 0, list(range(10))), (Items(10), "y", [i * i for i in range(10)]),
             ([(a[i], np.int64(i)) for i in range(10)], 1, list(range(10))))
    for ds, field, want in cases:
        for placement in ("process", "thread"):
            with ferry.Loader(ds, batch_size=5, workers=2, epochs=1, worker_mode=placement) as ld:
                assert sorted(int(v) for b in ld for v in b[field]) == want
    lam = [(lambda i: i * 3)]  # a lambda inside: pickled by value (cloudpickle)
    pytest.importorskip("cloudpickle")

    class Local:  # a class defined in a function: pickled by value too
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return np.int64(lam[0](i))
    with ferry.Loader(Local(), batch_size=3, workers=2, epochs=1) as ld:
        assert sorted(int(v) for b in ld for v in b[0]) == [0, 3, 6, 9, 12, 15]


def test_an_object_that_cannot_be_pickled_names_the_attribute():
    class Holder:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i
    h = Holder()
    h.inner = {"ok": 1, "gen": (i for i in range(3))}
    with pytest.raises(TypeError, match=r"dataset\.inner\['gen'\] \(a generator\)"):
        ferry.Loader(h, batch_size=1, workers=1)


def test_a_dataset_object_is_loaded_once_not_per_worker(tmp_path):
    """The clean parent unpickles; the workers inherit the object."""
    log = tmp_path / "loads"

    class Logged:
        def __init__(self):
            self.n = 8

        def __setstate__(self, state):
            self.__dict__.update(state)
            with open(str(log), "a") as f:
                f.write("%d\n" % os.getpid())

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return np.int64(i)
    pytest.importorskip("cloudpickle")
    with ferry.Loader(Logged(), batch_size=4, workers=3, epochs=1) as ld:
        assert sorted(int(v) for b in ld for v in b[0]) == list(range(8))
    assert len(log.read_text().split()) == 1


def dataset_memfds():
    """This process's fds on a pickled dataset's memfd."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "ferry-dataset" in os.readlink("/proc/self/fd/" + fd):
                out.append(fd)
        except OSError:
            pass
    return out


def test_an_object_loader_that_cannot_open_closes_the_datasets_memfd():
    # Closed when the opening fails, though the exception (and its
    # traceback) keeps the half-made loader alive, as a notebook keeps the
    # last exception.
    kept = []
    try:
        ferry.Loader(list(range(10)), workers=2, state={"ferry": b"not a state"})
    except ferry.StateError as e:
        kept.append(e)
    assert len(kept) == 1 and dataset_memfds() == []


def test_a_forked_child_keeps_no_dataset_memfd():
    with ferry.Loader(list(range(10)), workers=1) as ld:
        assert len(next(iter(ld))) >= 1
        assert dataset_memfds()  # the trainer's, while the loader is open
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # what multiprocessing's fork start does
            try:
                os.write(w, b"0" if dataset_memfds() else b"1")
            finally:
                os._exit(0)  # never back into pytest
        os.close(w)
        said = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        assert said == b"1"


def private_mib(pid):
    with open("/proc/%d/smaps_rollup" % pid) as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("Private_Dirty:", "Private_Clean:"))) / 1024


def test_forked_workers_share_the_dataset_their_parent_loaded():
    # 64 MiB pickled: a worker forked from the clean parent neither reads
    # those bytes again nor holds a copy of the array (the parent's pages).
    from datasets import ArrayBacked
    array = np.arange(8 << 20, dtype=np.float64)
    with ferry.Loader(ArrayBacked(array), batch_size=64, workers=2) as ld:
        assert next(iter(ld))["x"].tolist() == list(range(64))
        for i in range(2):
            assert private_mib(ld.worker_pid(i)) < 40, private_mib(ld.worker_pid(i))


@pytest.mark.parametrize("placement", ["process", "thread"])
def test_an_object_loader_resumes_again_and_again_and_lets_the_object_go(placement):
    import gc
    import weakref
    from datasets import ArrayBacked
    ds = ArrayBacked(np.arange(100, dtype=np.int64))
    gone = weakref.ref(ds)
    with ferry.Loader(ds, batch_size=10, workers=2, worker_mode=placement) as ld:
        del ds
        first = next(iter(ld))["x"].tolist()
        state = ld.state_dict()
        for _ in range(3):  # each time the workers start anew from the same object
            ld.load_state_dict(state)
            assert next(iter(ld))["x"].tolist() == [v + 10 for v in first]
    gc.collect()
    assert gone() is None  # nothing in ferry keeps the dataset once the loader is closed
