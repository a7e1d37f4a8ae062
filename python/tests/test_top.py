"""The live view, ``python -m ferry.top PID``, and the loader's side of it
(option ``live``, ferry/_live.py).

The trainer is this test process: a loader with live=True fed on a thread
of its own (a Trainer below, taking batches with a 0.5 ms step). The
client runs where a user runs it, in a terminal: a tmux pane of 80x24,
whose screen the tests read back with capture-pane and whose keys they
type with send-keys. The tmux server is started with -D, so it is this
process's child, and is reaped at the end of each test.

Every wait is on something observable (the screen, a count, a process's
state) with a deadline; conftest gives each test a hard limit and checks
that no process or fd is left; `live_leaves_nothing` below checks that
the live socket and its thread are gone too.

The refused attach is tested both ways: for real, with the client run as
uid 65534 (setpriv) when the tests run as root, and through the server's
own path with the peer's credentials faked, which runs as any user.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import ferry
from ferry import _live, top
from conftest import wait_for

SPEC = "synthetic:n=4096,dim=16,sleep_us=2000"  # 2 ms a batch at the worker
TMUX = shutil.which("tmux")
BUILD_PY = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))


def live_sockets():
    """Names of this process's live sockets the kernel lists."""
    name = _live.address(os.getpid())[1:]
    with open("/proc/net/unix") as f:
        return [line.split()[-1] for line in f if line.rstrip().endswith("@" + name)]


@pytest.fixture(autouse=True)
def live_leaves_nothing():
    yield
    wait_for(lambda: not live_sockets(), 10, "the live socket is still bound")
    assert not [t for t in threading.enumerate() if t.name == "ferry-live"]


class Trainer:
    """Takes batches from ``loader`` on a thread of its own, a 0.5 ms step
    each, until stop(); ``count`` is how many it has had."""

    def __init__(self, loader):
        self.loader = loader
        self.count = 0
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer")
        self._thread.start()

    def _run(self):
        try:
            for _ in self.loader.stream():
                self.count += 1
                if self._stop.wait(0.0005):  # the step (and the way out)
                    return
        except Exception as e:  # pragma: no cover - reported by stop()
            self.error = e

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()
        assert self.error is None, self.error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Pane:
    """A tmux server (this process's child, -D) with one 80x24 pane running
    ``command``. When the command ends the pane's shell writes its exit
    status and stays (tmux's own remain-on-exit can lose a command's last
    output), so the last screen and the status can be read. Every process
    of the pane carries a mark in its environment: close() waits until no
    process has it."""

    def __init__(self, command, width=80, height=24):
        self.name = "ferry-top-test-%d-%d" % (os.getpid(), time.monotonic_ns())
        self.dir = tempfile.mkdtemp(prefix="ferry-top-test-")
        conf = os.path.join(self.dir, "tmux.conf")
        with open(conf, "w") as f:
            f.write("set -g remain-on-exit on\nset -g status off\n")
        env = dict(os.environ, TMUX_TMPDIR=self.dir, TERM="xterm-256color")
        env.pop("TMUX", None)
        self.env = env
        self.server = subprocess.Popen([TMUX, "-L", self.name, "-f", conf, "-D"],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, env=env)
        sock = os.path.join(self.dir, "tmux-%d" % os.getuid(), self.name)
        wait_for(lambda: os.path.exists(sock), 10, "tmux's server has no socket")
        self.mark = "FERRY_TOP_TEST=" + self.name
        # The shell lives through a Ctrl-C meant for the client (a trap,
        # not an ignore, which the client would inherit).
        shell = "trap : INT; %s; echo \"[ferry top exited $?]\"; exec cat >/dev/null" \
            % " ".join(command)
        self.tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                  "env %s sh -c '%s'" % (self.mark, shell))

    def tmux(self, *args):
        return subprocess.run([TMUX, "-L", self.name] + list(args), env=self.env, check=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=10).stdout

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "t")

    def text(self):
        """The screen with wrapped lines joined: for sentences."""
        return self.tmux("capture-pane", "-p", "-J", "-t", "t")

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_screen(self, pred, seconds, what):
        """The first screen that satisfies pred, within seconds."""
        deadline = time.monotonic() + seconds
        while True:
            s = self.screen()
            if pred(s):
                return s
            if time.monotonic() > deadline:
                pytest.fail("after %.0f s the screen is still not %s:\n%s" % (seconds, what, s))
            time.sleep(0.05)  # polling the screen, with a deadline

    def wait_exit(self, seconds):
        """The command's exit status, once it has ended."""
        screen = self.wait_screen(lambda s: "[ferry top exited " in s, seconds, "exited")
        return int(screen.split("[ferry top exited ", 1)[1].split("]", 1)[0])

    def marked(self):
        """Pids of the processes that carry this pane's mark."""
        out = []
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if self.mark.encode() + b"\0" in f.read():
                        out.append(pid)
            except (OSError, ValueError):
                continue
        return out

    def close(self):
        try:
            self.tmux("kill-server")
        except subprocess.CalledProcessError:
            pass  # it has ended already
        self.server.wait(10)
        wait_for(lambda: not self.marked(), 10, "the pane's processes are still there")
        shutil.rmtree(self.dir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def client(pid, *args, user=None):
    """The command line of a client for pid (as uid ``user``, if given)."""
    cmd = ["env", "PYTHONPATH=%s" % BUILD_PY, sys.executable, "-m", "ferry.top", str(pid)]
    if user is not None:
        cmd = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups"] + cmd
    return cmd + list(args)


def worker_rows(screen):
    """{worker index: pid} of the worker rows on a screen."""
    rows = {}
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == ["worker", "pid"]:
            for row in lines[i + 1:]:
                parts = row.split()
                if len(parts) < 6 or not parts[0].isdigit():
                    break
                rows[int(parts[0])] = parts[1]
    return rows


def delivered(screen):
    """The batches the screen's clock line says were delivered, or None."""
    for line in screen.splitlines():
        if line.startswith("loader 0") and " batches, up " in line:
            return int(line.rsplit(" batches, up ", 1)[0].split()[-1].replace(",", ""))
    return None


needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")


# ---------------------------------------------------------------------------
# Through a terminal


@needs_tmux
def test_attach_shows_the_verdict_and_workers_updating_then_q_detaches_and_training_goes_on():
    with ferry.Loader(SPEC, batch_size=8, workers=2, live=True) as ld, Trainer(ld) as tr, \
            Pane(client(os.getpid())) as pane:
        pids = {i: str(ld.worker_pid(i)) for i in range(2)}
        first = pane.wait_screen(lambda s: worker_rows(s) == pids and "Input-bound" in s, 20,
                                 "showing both workers and the verdict")
        assert "ferry top  pid %d" % os.getpid() in first
        assert all(len(line) <= 80 for line in first.splitlines())
        for stage in ("make", "transit", "order", "held", "wait", "step"):
            assert stage in first
        # The next second's screen: more batches delivered than the first said.
        n = delivered(first)
        pane.wait_screen(lambda s: (delivered(s) or 0) > n, 10, "updated")

        pane.keys("q")
        assert pane.wait_exit(10) == 0
        assert "detached from process %d" % os.getpid() in pane.text()
        at_detach = tr.count
        wait_for(lambda: tr.count >= at_detach + 100, 20, "the trainer's batches stopped")
        assert live_sockets()  # still served: the loader is open
        assert ld.stats()["restarts"] == 0


@needs_tmux
def test_attach_and_detach_repeatedly_while_batches_flow_ctrl_c_detaches_too():
    with ferry.Loader(SPEC, batch_size=8, workers=2, live=True) as ld, Trainer(ld) as tr:
        for key in ("q", "C-c", "q"):
            before = tr.count
            with Pane(client(os.getpid())) as pane:
                pane.wait_screen(lambda s: len(worker_rows(s)) == 2, 20, "showing the workers")
                pane.keys(key)
                assert pane.wait_exit(10) == 0
                assert "detached" in pane.text()
            wait_for(lambda: tr.count > before + 50, 20, "the trainer's batches stopped")


@needs_tmux
def test_the_loader_closing_under_an_attached_client_ends_it_cleanly():
    ld = ferry.Loader(SPEC, batch_size=8, workers=2, live=True)
    try:
        with Pane(client(os.getpid())) as pane:
            with Trainer(ld):
                pane.wait_screen(lambda s: len(worker_rows(s)) == 2, 20, "showing the workers")
            t0 = time.monotonic()
            ld.close()
            assert time.monotonic() - t0 < 5  # an attached client does not hold close() up
            assert not live_sockets()
            assert pane.wait_exit(10) == 0
            last = pane.text()
            assert "ferry top: the loaders of pid %d closed" % os.getpid() in last
            assert "loader 0 delivered" in last
    finally:
        ld.close()


@needs_tmux
def test_a_client_for_a_process_without_a_live_loader_says_how_to_turn_it_on():
    with ferry.Loader(SPEC, batch_size=8, workers=1) as ld:  # live off
        assert not ld.live and not live_sockets()
        with Pane(client(os.getpid())) as pane:
            assert pane.wait_exit(10) == top.EXIT_NOT_LIVE
            text = pane.text()
            assert "has no live ferry loader" in text and "FERRY_LIVE=1" in text


@needs_tmux
def test_a_client_for_no_such_process_says_so():
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now (and not reused within this test)
    with Pane(client(gone.pid)) as pane:
        assert pane.wait_exit(10) == top.EXIT_NO_PROCESS
        assert "ferry top: no process %d" % gone.pid in pane.text()


@needs_tmux
@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="running the client as another user needs root and setpriv; "
                           "test_the_server_refuses_a_peer_of_another_uid covers the check")
def test_a_client_of_another_user_is_refused_with_a_reason_and_the_trainer_goes_on():
    # The client really runs as uid 65534 (nobody): the kernel's SO_PEERCRED
    # says so to the trainer, which refuses it.
    with ferry.Loader(SPEC, batch_size=8, workers=2, live=True) as ld, Trainer(ld) as tr, \
            Pane(client(os.getpid(), user=65534)) as pane:
        assert pane.wait_exit(20) == top.EXIT_REFUSED
        assert "ferry top: process %d refused to be watched: uid 65534 is not the trainer's " \
               "user (uid 0): the live view is for its own user only" % os.getpid() in pane.text()
        before = tr.count
        wait_for(lambda: tr.count > before + 50, 20, "the trainer's batches stopped")
        # The same user, right after, is let in.
        with Pane(client(os.getpid())) as pane2:
            pane2.wait_screen(lambda s: len(worker_rows(s)) == 2, 20, "showing the workers")
            pane2.keys("q")
            assert pane2.wait_exit(10) == 0


# ---------------------------------------------------------------------------
# The server's side, through its socket


def connect(pid=None):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(_live.address(pid or os.getpid()))
    return sock, top.Lines(sock)


def test_the_server_refuses_a_peer_of_another_uid(monkeypatch):
    # The credential is faked: the server's own SO_PEERCRED read answers
    # another uid. The refusal's path is the real one.
    monkeypatch.setattr(_live, "peer_uid", lambda sock: os.getuid() + 1)
    with ferry.Loader(SPEC, batch_size=8, workers=1, live=True):
        sock, lines = connect()
        with sock:
            said = lines.next(10)
            assert said == {"refused": "uid %d is not the trainer's user (uid %d): the live "
                                       "view is for its own user only"
                            % (os.getuid() + 1, os.getuid())}
            assert lines.next(10) is None and lines.eof  # and closed


def test_a_client_that_stops_reading_is_dropped_and_the_others_are_served(monkeypatch, caplog):
    caplog.set_level("DEBUG", logger="ferry")
    monkeypatch.setattr(_live, "OWED_MAX", 16 << 10)  # 16 KiB behind, past the socket's buffer
    with ferry.Loader(SPEC, batch_size=8, workers=1, live=True) as ld, Trainer(ld) as tr:
        sock, lines = connect()
        with sock:
            assert lines.next(10)["hello"] == "ferry-live"
            # Asks for a snapshot again and again, reading none: the server
            # drops it once it owes it more than OWED_MAX.
            deadline = time.monotonic() + 30
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                while time.monotonic() < deadline:
                    sock.sendall(b"x\n")
        assert "the live view dropped a client" in caplog.text
        before = tr.count
        sock, lines = connect()  # another client is served as ever
        with sock:
            assert lines.next(10)["hello"] == "ferry-live"
            assert lines.next(10)["loaders"][0]["dataset"] == SPEC
        wait_for(lambda: tr.count > before + 50, 20, "the trainer's batches stopped")


def test_check_peer_lets_in_the_same_uid_only():
    assert _live.check_peer(1000, 1000) is None
    assert "uid 1001 is not the trainer's user (uid 1000)" in _live.check_peer(1001, 1000)
    assert _live.check_peer(0, 1000) is not None  # root too: the socket cannot tell who


def test_peer_uid_is_the_kernels_record_of_the_connecting_process():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert _live.peer_uid(a) == os.getuid()


def test_two_loaders_are_listed_and_the_socket_closes_with_the_last():
    one = ferry.Loader(SPEC, batch_size=8, workers=1, live=True)
    two = ferry.Loader("synthetic:n=512,dim=4", batch_size=4, workers=1, live=True)
    try:
        sock, lines = connect()
        with sock:
            assert lines.next(10)["hello"] == "ferry-live"
            snap = lines.next(10)
            assert [ld["dataset"] for ld in snap["loaders"]] == [SPEC, "synthetic:n=512,dim=4"]
            one.close()
            sock.sendall(b"snapshot\n")  # one now, not at the next tick
            snap = lines.next(10)
            while "loaders" in snap and len(snap["loaders"]) == 2:  # a tick sent before
                snap = lines.next(10)
            assert [ld["loader"] for ld in snap["loaders"]] == [1]
            assert live_sockets()
            two.close()
            assert not live_sockets()
            last = None
            while True:
                said = lines.next(10)
                if said is None:
                    break
                last = said
            assert last == {"closed": "the loaders of pid %d closed" % os.getpid()}
    finally:
        one.close()
        two.close()


def test_a_snapshot_has_each_workers_pid_rate_busy_share_and_stages():
    with ferry.Loader(SPEC, batch_size=8, workers=2, live=True) as ld, Trainer(ld):
        sock, lines = connect()
        with sock:
            lines.next(10)  # hello
            while True:
                snap = lines.next(10)
                ldr = snap["loaders"][0]
                if not ldr["since_open"] and ldr["batches"] >= 50 and len(ldr["workers"]) == 2:
                    break
        assert sorted(w["pid"] for w in ldr["workers"]) == sorted(
            ld.worker_pid(i) for i in range(2))
        assert all(w["where"] == "local" and w["rate"] > 0 and 0 < w["busy"] <= 1.05
                   for w in ldr["workers"])
        assert ldr["rate"] == pytest.approx(ldr["batches"] / ldr["span"])
        assert ldr["stages"]["make"]["p50"] == pytest.approx(0.002, rel=0.5)
        assert ldr["kind"] in ("input-bound", "trainer-bound") and ldr["verdict"]


def test_a_remote_workers_row_names_its_host_and_pid():
    from test_remote import RemoteWorker, free_port
    port = free_port()
    with RemoteWorker(port, ["datasets"]) as w:
        from datasets import Items
        with ferry.Loader(Items, dataset_kwargs={"n": 4000}, workers=0, batch_size=5,
                          bind="tcp://127.0.0.1:%d" % port, insecure=True, live=True) as ld, \
                Trainer(ld):
            sock, lines = connect()
            with sock:
                lines.next(10)
                while True:
                    rows = lines.next(10)["loaders"][0]["workers"]
                    if rows:
                        break
            assert rows[0]["where"] == "remote"
            assert rows[0]["host"] == socket.gethostname()
            assert rows[0]["pid"] == w.p.pid
            assert ld._c.worker_host(0) == (socket.gethostname(), w.p.pid)


def test_ferry_live_in_the_environment_turns_an_unchanged_script_live(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, ferry\n"
        "ld = ferry.Loader(%r, batch_size=8, workers=1)\n"
        "print(ld.live, flush=True)\n"
        "for b in ld.stream():\n"
        "    if sys.stdin.readline() == '':\n"  # runs until its stdin closes
        "        break\n"
        "ld.close()\n" % SPEC)
    env = dict(os.environ, FERRY_LIVE="1")
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert p.stdout.readline() == "True\n"
        p.stdin.write("\n" * 40)
        p.stdin.flush()
        out = subprocess.run([sys.executable, "-m", "ferry.top", "--once", str(p.pid)],
                             stdout=subprocess.PIPE, text=True, timeout=30)
        assert out.returncode == 0
        assert out.stdout.startswith("ferry top  pid %d" % p.pid)
        assert "worker pid / host" in out.stdout
    finally:
        p.stdin.close()
        assert p.wait(30) == 0
        p.stdout.close()


def test_live_false_wins_over_the_environment_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv("FERRY_LIVE", "1")
    with ferry.Loader(SPEC, batch_size=8, workers=1, live=False) as ld:
        assert not ld.live and not live_sockets()
    with pytest.raises(TypeError, match="live must be True, False or None"):
        ferry.Loader(SPEC, live="yes")
    monkeypatch.setenv("FERRY_LIVE", "maybe")  # said in the log, taken as off
    with ferry.Loader(SPEC, batch_size=8, workers=1) as ld:
        assert not ld.live


def test_a_forked_child_closes_the_live_socket_it_inherited():
    with ferry.Loader(SPEC, batch_size=8, workers=1, live=True):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: how many of its fds are the parent's listening socket?
            try:
                inode = [line.split()[6] for line in open("/proc/net/unix")
                         if line.rstrip().endswith("@" + _live.address(os.getppid())[1:])]
                mine = []
                for fd in os.listdir("/proc/self/fd"):
                    try:
                        mine.append(os.readlink("/proc/self/fd/" + fd))
                    except OSError:
                        pass  # the listing's own fd, closed by now
                os.write(w, ("%d of %d" % (sum("socket:[%s]" % i in mine for i in inode),
                                           len(inode))).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            said = f.read()
        assert os.waitpid(pid, 0)[1] == 0
        assert said == "0 of 1"  # the listener is there, the child holds none of it


def test_the_torch_dataloader_passes_live_through():
    torch = pytest.importorskip("torch")
    from ferry.torch import DataLoader
    from datasets import Items
    dl = DataLoader(Items(64), batch_size=8, num_workers=1, live=True)
    try:
        batch = next(iter(dl))
        assert torch.is_tensor(batch) or isinstance(batch, (list, tuple, dict))
        assert dl._loader.live and live_sockets()
    finally:
        dl.close()


# ---------------------------------------------------------------------------
# The screen, as a function of what the server said


def fake_snapshot(workers, verdict="Input-bound, the workers busy: " + "and so on " * 20):
    stage = {"mean": 0.002, "p50": 0.0019, "p99": 0.0031}
    return {"time": 0, "loaders": [{
        "loader": 0, "dataset": "synthetic:n=1", "up": 75, "span": 5.0, "since_open": False,
        "batches": 500, "rate": 100.0, "batch_size": 8, "delivered": 1234, "workers_ready": 2,
        "local": workers, "remote": None, "in_flight": 4, "prefetch": 8, "restarts": 0,
        "lost": 0, "kind": "input-bound", "verdict": verdict, "wait_share": 0.4,
        "stages": {s: dict(stage) for s in top.STAGES},
        "workers": [{"worker": i, "where": "local", "pid": 1000 + i, "batches": 50, "rate": 10.0,
                     "busy": 0.9, "make_p50": 0.002, "transit": 0.004} for i in range(workers)],
    }]}


HELLO = {"pid": 42, "argv": ["train.py"]}


def test_an_80x24_screen_shows_ten_workers_in_full():
    lines = top.render(HELLO, fake_snapshot(10), 80, 24)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert [line.split()[0] for line in lines if line.startswith("  mean")] == ["mean"]
    assert len(worker_rows("\n".join(lines))) == 10
    assert not any("more lines" in line for line in lines)
    assert any(line.endswith("in flight 4/8") for line in lines)  # whole, not cut at 80


@pytest.mark.parametrize("size", [(60, 14), (40, 10), (20, 5), (80, 8)])
def test_a_smaller_terminal_gets_less_detail_and_never_a_wrapped_line(size):
    width, height = size
    lines = top.render(HELLO, fake_snapshot(10), width, height)
    assert len(lines) <= height and all(len(line) <= width for line in lines)
    assert lines[0].startswith("ferry top"[:width])


def test_workers_past_the_screen_are_counted_not_dropped_silently():
    lines = top.render(HELLO, fake_snapshot(40), 80, 24)
    assert len(lines) == 24
    assert "more lines: a taller terminal shows them" in lines[-1]
