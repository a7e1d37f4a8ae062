"""Python workers forked by one clean parent per loader: where it comes
from (a fork of the trainer), what it loads, whose children the workers
are, replacements, its own death, threads, datasets passed as objects, and
the trainer's multiprocessing objects shared with the workers."""

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ferry
from conftest import children, wait_for
from datasets import CountsItsCalls, Items, KillsItsCleanParentAfterAFork, OpensLazily


def ppid_of(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def template_pid(ld):
    """The loader's template: the fork of the trainer its clean parent is
    forked from (None: spawned)."""
    return ld._template.pid if ld._template is not None else None


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def parent_of_workers(ld, n=2):
    """The loader's clean parent: the trainer's child named ferry-parent
    that is not a worker (a fork of it, renamed as it starts)."""
    workers = {ld.worker_pid(i) for i in range(n)}
    for pid in children():
        if pid not in workers and comm(pid) == "ferry-parent":
            return pid
    return None


def test_workers_are_the_loaders_children_and_share_one_loaded_dataset(tmp_path):
    with ferry.Loader(Items, dataset_kwargs={"n": 40}, batch_size=4, workers=2, epochs=1) as ld:
        ys = sorted(int(v) for b in ld for v in b["y"])
        assert ys == [i * i for i in range(40)]
        for i in range(2):
            assert ppid_of(ld.worker_pid(i)) == os.getpid()  # forked with CLONE_PARENT
        parent = parent_of_workers(ld)
        assert parent is not None and parent not in (ld.worker_pid(0), ld.worker_pid(1))
        # Besides the workers: the clean parent and the template it was
        # forked from, all the trainer's children, and nothing else.
        workers = {ld.worker_pid(0), ld.worker_pid(1)}
        others = sorted(p for p in descendants() if p not in workers)
        assert others == sorted([parent, template_pid(ld)]), others
        assert comm(template_pid(ld)) == "ferry-template"
        assert all(ppid_of(p) == os.getpid() for p in others)


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


NOTHING_AT_IMPORT = r"""
import os, ferry
def kids():
    return ferry._descendants(os.getpid())
assert kids() == [], "import ferry started %s" % kids()
with ferry.Loader("synthetic:n=64,dim=8", batch_size=8, workers=2, epochs=1) as ld:
    assert sum(len(b["y"]) for b in ld) == 64
    assert ld._template is None  # C workers: no clean parent, no template
print("ok", flush=True)
"""


def test_import_ferry_starts_no_process_and_a_c_loader_forks_no_template():
    p = subprocess.run([sys.executable, "-c", NOTHING_AT_IMPORT], capture_output=True,
                       text=True, timeout=60)
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



@pytest.mark.parametrize("victim", ["ferry-parent", "ferry-worker"])
def test_a_loader_opened_on_its_first_worker_survives_a_kill_before_the_others_exist(victim):
    """A Python dataset's loader opens on its first ready worker while the
    clean parent forks the others (open_local_ready=1). The clean parent,
    or that first worker, SIGKILLed at once (the second worker may not be
    forked yet): every item of both epochs arrives once, and both workers
    are there at the end (a new clean parent forks what the old one had
    not)."""
    with ferry.Loader(Items(300, slow_ms=1), batch_size=5, workers=2, epochs=2, shuffle=True,
                      seed=3) as ld:
        # (ld._c: the pids as they are, without waiting for worker 1's; the
        # clean parent: the template's first fork, become it)
        forked = [ld._c.worker_pid(i) for i in range(2)]
        first = [p for p in forked if p] if victim == "ferry-worker" else \
            [ld._template.procs[0][0]]
        assert first and all(comm(p) == victim for p in first[:1]), (victim, first)
        os.kill(first[0], signal.SIGKILL)
        got = sorted(int(v) for b in ld.stream() for v in b["y"])
        assert got == sorted([i * i for i in range(300)] * 2)
        wait_for(lambda: ld.stats()["workers"] == 2, 10, "both workers ready")
        assert ld.stats()["restarts"] >= 1
        assert first[0] not in (ld.worker_pid(0), ld.worker_pid(1))



def test_the_first_clean_parent_is_the_template_s_first_fork_itself():
    """A loader's template is two forks of the trainer. The first becomes
    the first clean parent itself (a fork less on the way to the first
    batch); the second, forked while the loader opened, serves after it:
    a clean parent killed is forked again by it, and nothing is lost."""
    with ferry.Loader(Items(300, slow_ms=1), batch_size=5, workers=2, epochs=1) as ld:
        (first, _), (second, _) = ld._template.procs
        it = iter(ld)
        got = [int(v) for v in next(it)["y"]]
        assert parent_of_workers(ld) == first
        assert ld._template.pid == second and comm(second) == "ferry-template"
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: parent_of_workers(ld) not in (None, first), 10, "a new clean parent")
        assert comm(second) == "ferry-template"  # it forked the new one and serves on
        got += [int(v) for b in it for v in b["y"]]
        assert sorted(got) == [i * i for i in range(300)]

# Every fork this (the trainer's) process makes, on any thread.
_forks = []
os.register_at_fork(after_in_parent=lambda: _forks.append(1))


def test_the_trainer_forks_twice_for_a_loader_and_a_refused_one_leaves_nothing():
    """The trainer forks twice for a loader, the template's two forks (the
    second as the C open runs); the workers are the clean parent's forks.
    A loader the C open refuses (an unknown option) leaves no process."""
    before = len(_forks)
    with ferry.Loader(Items(10), batch_size=5, workers=2, epochs=1) as ld:
        assert sorted(int(v) for b in ld for v in b["y"]) == [i * i for i in range(10)]
        assert len(ld._template.procs) == 2
    assert len(_forks) - before == 2
    with pytest.raises(ferry.OptionError, match="no_such_option"):
        ferry.Loader(Items(10), batch_size=5, workers=2, no_such_option=3)
    assert children() == []


def _fd_links(pid="self"):
    out = set()
    for fd in os.listdir("/proc/%s/fd" % pid):
        try:
            out.add(os.readlink("/proc/%s/fd/%s" % (pid, fd)))
        except OSError:
            pass
    return out


def test_a_fork_of_the_trainer_holds_none_of_an_open_loader_s_process_fds():
    """The pool's fds for its processes (each stderr pipe and pidfd, the
    clean parent's control socket) are closed in any fork of the trainer
    (forkfds.h): a template forked while a loader opens, or a fork of the
    training script's own, holds none of them."""
    with ferry.Loader(Items(100), batch_size=5, workers=2) as ld:
        it = iter(ld)
        next(it)
        wait_for(lambda: all(ld.worker_pid(i) for i in range(2)), 10, "both workers")
        pipes = {os.readlink("/proc/%d/fd/2" % ld.worker_pid(i)) for i in range(2)}
        assert all(p.startswith("pipe:") for p in pipes) and pipes <= _fd_links()
        assert any("pidfd" in link for link in _fd_links())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(w, "\n".join(sorted(_fd_links())).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            held = set(f.read().decode().split("\n"))
        os.waitpid(pid, 0)
        assert held and not held & pipes
        assert not [link for link in held if "pidfd" in link]
        # The second template, forked as the loader opened: neither the C
        # open's fds nor the loader's (its dataset's memfd, the first
        # template's pidfd)
        second = _fd_links(ld._template.procs[1][0])
        assert not second & pipes
        assert not [link for link in second if "pidfd" in link or "ferry-dataset" in link]


def test_a_worker_forked_as_its_clean_parent_is_killed_is_kept_not_left_running(
        tmp_path, caplog):
    """A clean parent SIGKILLed between a fork and its answer (the dataset
    has it kill itself right after forking the replacement of a worker that
    died on item 40) never says the fork's pid; the fork says it first on
    its stderr, and the loader keeps it as that worker: every item arrives
    once, and close leaves nothing (the fork was left running, unknown,
    until its handshake timed out)."""
    flag = tmp_path / "parent-killed"
    data = KillsItsCleanParentAfterAFork(100, str(flag), 3, die=40, flag=str(tmp_path / "died"),
                                         slow_ms=1)
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Loader(data, batch_size=5, workers=2, epochs=2) as ld:
        got = sorted(int(v) for b in ld.stream() for v in b["y"])
        assert flag.exists()
        assert got == sorted([i * i for i in range(100)] * 2)
    assert "was forked as its clean parent went: kept" in caplog.text
    assert children() == []


@pytest.mark.parametrize("fork", [0, 1], ids=["before-ready", "after-first-fork"])
def test_a_clean_parent_killed_as_the_loader_opens_is_replaced_by_a_fork(tmp_path, caplog, fork):
    """The clean parent SIGKILLed as the loader opens (as it loads the
    dataset, or right after forking worker 0): the template forks another,
    and the open goes on. The dataset holds a multiprocessing Value, which
    only a fork of the trainer can have: spawned workers (what a clean
    parent dead before it was ready used to leave) would refuse it, and a
    death after it was ready used to fail the open."""
    flag = tmp_path / "parent-killed"
    data = KillsItsCleanParentAfterAFork(60, str(flag), fork, slow_ms=1)
    data.shared = multiprocessing.Value("i", 7)
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Loader(data, batch_size=5, workers=2, epochs=1, shuffle=True, seed=1) as ld:
        got = sorted(int(v) for b in ld.stream() for v in b["y"])
        assert flag.exists()
        assert got == [i * i for i in range(60)]
        assert ld.stats()["workers"] == 2
    assert "starting another" in caplog.text
    assert "spawned, not forked" not in caplog.text
    assert children() == []


@pytest.mark.parametrize("dies", ["before answering", "after answering"])
def test_a_template_killed_with_the_ask_in_hand_loses_nothing(tmp_path, caplog, capfd,
                                                              monkeypatch, dies):
    """The first template dies with the loader's ask for a clean parent in
    hand. Before answering: the ask, only peeked at, is still on the
    socket it shares with the second, which forks the clean parent (taken
    off the socket instead, it was lost, and the open waited out
    start_timeout_ms). After answering and before taking the ask off the
    socket: the loader has the first's pid (dead: replaced as any clean
    parent killed), and the second forks a clean parent for the old ask
    too, whose answer the loader's next ask knows is not its own: that
    one is killed and reaped, not taken for the new clean parent. The
    templates are forks of this process, so they run the patched
    functions; the flag lets only the first die. Spawning cannot stand
    in: the dataset holds what only a fork can have."""
    from ferry import worker
    flag = str(tmp_path / "template-died")

    def die_once():
        if not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    if dies == "before answering":
        real = worker._recv_request

        def dies_with_the_ask(sock, timeout=None, peek=False):
            req = real(sock, timeout, peek)
            if isinstance(req, tuple) and "--fork-server" in req[0]:
                die_once()
            return req
        monkeypatch.setattr(worker, "_recv_request", dies_with_the_ask)
    else:
        real = worker._drop_peeked

        def dies_before_dropping(sock):
            die_once()
            real(sock)
        monkeypatch.setattr(worker, "_drop_peeked", dies_before_dropping)
    caplog.set_level(logging.INFO, logger="ferry")
    data = Items(40)
    data.shared = multiprocessing.Value("i", 1)  # only forks of the trainer can have it
    with ferry.Loader(data, batch_size=5, workers=2, epochs=1, start_timeout_ms=60000) as ld:
        got = sorted(int(v) for b in ld for v in b["y"])
    assert os.path.exists(flag)
    assert got == [i * i for i in range(40)]
    assert "did not answer" not in caplog.text
    assert children() == []
    assert "Traceback" not in capfd.readouterr().err  # (a fork nobody waits for, leaving)


def test_a_template_that_answers_too_late_gives_the_loader_no_second_clean_parent(
        tmp_path, monkeypatch):
    """The clean parent killed, the template asked for another answers
    only after start_timeout_ms (patched to take longer), so the loader
    spawns one instead, on a control socket of its own. The template's
    late one, forked with the socket the ask carried, finds its other end
    closed and exits (before, it served the loader's socket beside the
    spawned one, and answers to the loader's requests came from two
    processes); its answer, read by no ask, is reaped at close."""
    from ferry import worker
    flag = str(tmp_path / "answered-late")
    real = worker._answer

    def late(sock, ask, pid=None, error=None):
        if ask is not None and pid is not None and pid != os.getpid():
            time.sleep(5)  # a template too slow to answer, not a synchronisation
            real(sock, ask, pid, error)
            open(flag, "w").close()
            return
        real(sock, ask, pid, error)
    monkeypatch.setattr(worker, "_answer", late)

    def live_parents():
        return [p for p in children()
                if comm(p) == "ferry-parent" and _state(p) not in ("Z", "X", "")]
    with ferry.Loader(Items(300, slow_ms=1), batch_size=5, workers=2, epochs=1,
                      start_timeout_ms=3000) as ld:
        it = iter(ld)
        got = [int(v) for v in next(it)["y"]]
        parent = parent_of_workers(ld)
        os.kill(parent, signal.SIGKILL)
        wait_for(lambda: os.path.exists(flag), 30, "the template's late answer")
        wait_for(lambda: len(live_parents()) == 1, 10, "one clean parent")
        victim = ld.worker_pid(0)
        os.kill(victim, signal.SIGKILL)  # its replacement is the spawned parent's fork
        got += [int(v) for b in it for v in b["y"]]
        assert sorted(got) == [i * i for i in range(300)]
    assert children() == []


def _state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_template_interrupted_while_it_settles_is_closed_whole(monkeypatch):
    """Ctrl-C while the trainer waits for the template's second fork: the
    fork goes on on its thread, and close still waits for it, kills both
    and closes every fd the template held."""
    from ferry import _template

    def open_fds():  # (listdir's own fd is closed by the time exists() looks)
        return {fd for fd in os.listdir("/proc/self/fd") if os.path.exists("/proc/self/fd/" + fd)}
    fds_before = open_fds()
    t = _template.fork_template()
    t.fork_second()
    real, calls = _template._Job.result, []

    def interrupted(job):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(job)
    monkeypatch.setattr(_template._Job, "result", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.settle()
    finally:
        t.close()  # (also when settle did not raise: nothing left behind)
    assert len(calls) == 2 and children() == []
    assert open_fds() == fds_before


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
        # The template and the clean parent give those pages back once
        # nothing was asked of them for a moment (worker.SETTLE_AFTER_S).
        # Forks of this process, they map what it mapped, yet keep a few
        # pages of it (those their fork loops touched since).
        mine = rss_kb(os.getpid(), "RssFile")
        for pid in (template_pid(ld), parent_of_workers(ld)):
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
    env.update(FERRY_TEST_SPY=str(log),
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


# ------------------------------------------------- shared by inheritance

class Counted:
    """Counts the items built in an mp.Value (under its lock) and writes
    each index's square into an mp.Array: the trainer's own, if the
    workers share them."""

    def __init__(self, n):
        import multiprocessing as mp
        self.n = n
        self.count = mp.Value("i", 0)
        self.squares = mp.Array("d", n)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.count.get_lock():
            v = self.count.value
            time.sleep(0.0005)  # a race on the count, unless the lock is shared
            self.count.value = v + 1
        self.squares[i] = float(i * i)
        return np.int64(i)


def test_the_trainers_mp_value_and_array_are_the_workers():
    ds = Counted(60)
    with ferry.Loader(ds, batch_size=3, workers=2, epochs=1) as ld:
        assert sorted(int(v) for b in ld for v in b[0]) == list(range(60))
        assert {ld.worker_pid(0), ld.worker_pid(1)} and ld.stats()["restarts"] == 0
    # Each item counted once (item 0, built by the clean parent to learn the
    # fields, served the first batch), under one lock shared by both workers.
    assert ds.count.value == 60
    assert list(ds.squares) == [float(i * i) for i in range(60)]


class Gatekept:
    """Item i says whether a worker could take the trainer's semaphore (the
    trainer holds it: 0 when shared), and puts i on the trainer's queue;
    the workers meet once at a barrier of 2 (both must share it, or
    neither passes)."""

    def __init__(self, n):
        import multiprocessing as mp
        self.n = n
        self.sem = mp.Semaphore(1)
        self.queue = mp.Queue()
        self.barrier = mp.Barrier(2)
        self.met = False

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not self.met and ferry.worker_info() is not None:  # not the clean parent's probe
            self.barrier.wait(timeout=30)
            self.met = True
        took = self.sem.acquire(block=False)
        if took:
            self.sem.release()
        self.queue.put(i)
        return np.int64(took)


def test_the_trainers_semaphore_queue_and_barrier_are_the_workers():
    ds = Gatekept(20)
    assert ds.sem.acquire(block=False)  # held by the trainer from now on
    with ferry.Loader(ds, batch_size=2, workers=2, epochs=1) as ld:
        took = [int(v) for b in ld for v in b[0]]
    assert took == [0] * 20
    got = []
    import queue
    try:
        while True:
            got.append(ds.queue.get(timeout=2))
    except queue.Empty:
        pass
    # Every index put once by a worker, item 0 perhaps also by the clean
    # parent (its probe, when not kept for the first batch).
    assert sorted(set(got)) == list(range(20)) and len(got) - 20 in (0, 1), got
    ds.queue.close()
    ds.queue.join_thread()


def test_a_shared_tensor_is_the_trainers():
    torch = pytest.importorskip("torch")

    class Marks:
        def __init__(self, n):
            self.seen = torch.zeros(n, dtype=torch.int32).share_memory_()

        def __len__(self):
            return len(self.seen)

        def __getitem__(self, i):
            self.seen[i] += 1
            return np.int64(i)
    ds = Marks(30)
    with ferry.Loader(ds, batch_size=5, workers=2, epochs=1) as ld:
        assert len([b for b in ld]) == 6
    assert ds.seen.tolist() == [1] * 30


SPAWNED = r"""
import multiprocessing as mp, numpy as np, ferry
class D:
    def __init__(self):
        self.v = mp.Value("i", 0)
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return np.int64(i)
try:
    ferry.Loader(D(), workers=1)
except TypeError as e:
    print("refused:", e)
with ferry.Loader(list(range(8)), batch_size=4, workers=2, epochs=1) as ld:
    assert ld._template is None
    assert sorted(int(v) for b in ld for v in b[0]) == list(range(8))
print("ok", flush=True)
"""


def test_spawned_clean_parents_refuse_what_only_a_fork_can_share():
    env = dict(os.environ, FERRY_CLEAN_PARENT="spawn")
    p = subprocess.run([sys.executable, "-c", SPAWNED], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("refused: ferry.Loader: the dataset holds objects shared with "
                               "the trainer") and "FERRY_CLEAN_PARENT=spawn" in lines[0]
    assert lines[1] == "ok"


KILLED = r"""
import os, sys, threading, time, numpy as np, ferry
class Slow:
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        time.sleep(0.01)
        return np.int64(i)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # forked all the same
ld = ferry.Loader(Slow(), batch_size=2, workers=2)
next(iter(ld))
print(*ferry._descendants(os.getpid()), flush=True)
time.sleep(60)
"""


def test_a_killed_trainer_leaves_no_template_clean_parent_or_worker():
    p = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 4, pids  # template, clean parent, two workers
        assert sorted(comm(q) for q in pids) == ["ferry-parent", "ferry-template",
                                                 "ferry-worker", "ferry-worker"]
    finally:
        p.kill()
        p.communicate()

    def gone(pid):
        try:
            with open("/proc/%d/status" % pid) as f:
                return "State:\tZ" in f.read()
        except OSError:
            return True
    wait_for(lambda: all(gone(q) for q in pids), 10, "processes left: %s" % pids)


def test_a_loader_built_on_a_thread_that_ends_keeps_its_processes():
    # PR_SET_PDEATHSIG fires when the thread that forked a process ends:
    # the template is forked on a thread that lasts, not on this one.
    import threading
    made = []
    t = threading.Thread(target=lambda: made.append(
        ferry.Loader(Items(40), batch_size=4, workers=2, epochs=2)))
    t.start()
    t.join()
    with made[0] as ld:
        ys = sorted(int(v) for b in ld.stream() for v in b["y"])
        assert ys == sorted([i * i for i in range(40)] * 2)
        assert ld.stats()["restarts"] == 0
        assert comm(template_pid(ld)) == "ferry-template"


UNFLUSHED = r"""
import sys, numpy as np, ferry
class Flushing:
    def __len__(self):
        return 8
    def __getitem__(self, i):
        sys.stdout.flush()  # a worker's: what its buffer holds goes out
        return np.int64(i)
if __name__ == "__main__":
    print("said once")  # to a pipe: in the buffer until flushed
    with ferry.Loader(Flushing(), batch_size=4, workers=2, epochs=1) as ld:
        n = sum(len(b[0]) for b in ld)
    print(n)
"""


def test_what_the_trainer_has_not_flushed_is_said_once(tmp_path):
    (tmp_path / "unflushed.py").write_text(UNFLUSHED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.run([sys.executable, "unflushed.py"], capture_output=True, text=True,
                       timeout=60, env=env, cwd=str(tmp_path))
    assert p.returncode == 0 and p.stdout == "said once\n8\n", (p.stdout, p.stderr)


def test_item_0_built_before_the_workers_leaves_them_nothing_of_its_own(tmp_path):
    """The clean parent learns the batch's fields from item 0 in a fork it
    throws away: a file the dataset opens at its first item is each
    worker's own, not one shared file (one offset for all, each worker
    reading another's bytes)."""
    with ferry.Loader(OpensLazily(str(tmp_path / "records")), batch_size=4, workers=2,
                      epochs=2) as ld:
        batches = list(ld.stream())
    assert sorted(int(v) for b in batches for v in b["y"]) == sorted(list(range(48)) * 2)
    assert all(bool(v) for b in batches for v in b["own"])
    assert children() == []


def test_item_0_is_not_kept_for_the_first_batch_when_building_it_changed_the_dataset():
    """The probe's item 0 serves worker 0's first batch only when building
    it left the dataset as it was: a counter's item 0 is built again in
    the worker, which counts from its own start (1, 2 in its first batch,
    not the probe's 1 and then 1 again)."""
    with ferry.Loader(CountsItsCalls(), batch_size=2, workers=1, epochs=1) as ld:
        got = [(int(i), int(c)) for b in ld for i, c in zip(b["i"], b["calls"])]
    assert got == [(i, i + 1) for i in range(8)]
