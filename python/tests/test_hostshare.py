"""Encoded collections shared between trainers on one host (_hostshare):
trainers over the same collection map one copy, found by content, taken
over when its server goes, refused from another user, released with the
last holder; nothing is left behind."""

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# A trainer: builds a loader over n dicts (seeded: same seed, same bytes),
# takes a batch, says which shared copies it maps and what it read, then
# waits for a line ("close": closes the loader and says so; EOF: exits).
TRAINER = r"""
import json, os, sys
import ferry
n, seed = int(sys.argv[1]), int(sys.argv[2])

class Rows:
    def __init__(self):
        self.items = [{"path": "/data/%d/%08d.jpg" % (seed, i), "label": i % 1000}
                      for i in range(n)]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        p = self.items[i]["path"]  # /data/SEED/NUMBER.jpg
        return {"label": self.items[i]["label"], "seed": int(p.split("/")[2]),
                "num": int(p[-12:-4])}

def shared(pid):  # the inodes of the shared copies pid maps
    out = set()
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            if "memfd:ferry-shared" in line:
                out.add(int(line.split()[4]))
    return sorted(out)

def held(pid):  # the inodes of the shared copies pid holds open (the one it serves)
    d = "/proc/%d/fd" % pid
    out = set()
    for fd in os.listdir(d):
        try:
            if os.readlink(os.path.join(d, fd)).startswith("/memfd:ferry-shared"):
                out.add(os.stat(os.path.join(d, fd)).st_ino)
        except OSError:
            pass
    return sorted(out)

ld = ferry.Loader(Rows(), batch_size=64, workers=2, seed=1)
b = next(iter(ld))
say = lambda **kw: print(json.dumps(kw), flush=True)
ok = all(int(b["num"][k]) % 1000 == int(b["label"][k]) for k in range(64))
say(pid=os.getpid(), inodes=shared(os.getpid()), seed=int(b["seed"][0]), ok=ok,
    workers=[ld.worker_pid(i) for i in range(2)])
while True:
    line = sys.stdin.readline()
    if not line:
        break
    if line.strip() == "close":
        ld.close()
        say(closed=True, inodes=shared(os.getpid()), held=held(os.getpid()))
    elif line.strip() == "report":
        say(inodes=shared(os.getpid()), held=held(os.getpid()))
"""


class Trainer:
    def __init__(self, n=200_000, seed=0, env=None, deadline=60.0):
        e = dict(os.environ, FERRY_SHARE_HOST_MIN_BYTES=str(1 << 20), **(env or {}))
        self.deadline = time.monotonic() + deadline
        self.proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(n), str(seed)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e,
                                     text=True)
        self.first = self.read()

    def read(self):
        left = self.deadline - time.monotonic()
        assert left > 0 and select.select([self.proc.stdout], [], [], left)[0], \
            "the trainer said nothing in time"
        line = self.proc.stdout.readline()
        assert line, "the trainer exited: %s" % self.proc.wait()
        return json.loads(line)

    def ask(self, what):
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.read()

    def end(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        self.proc.stdout.close()

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def _key(n=200_000, seed=0):
    """The name's hash for a trainer's rows (encoded here as it encodes
    them)."""
    from ferry import _ferry, _hostshare, _shared
    rows = [{"path": "/data/%d/%08d.jpg" % (seed, i), "label": i % 1000} for i in range(n)]
    arrays = _hostshare._leaves(_shared.encode_list(rows), [])
    return _ferry.content_hash(_hostshare._bytes_of(arrays)).hex(), arrays


def _bound(key):
    """Whether the abstract name of that copy is bound now."""
    with open("/proc/net/unix") as f:
        return any(("ferry-share-%d-%s" % (os.geteuid(), key)) in line for line in f)


def _memfds_left():
    """Processes that hold or map a shared copy now (pids)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/maps" % pid) as f:
                if "memfd:ferry-shared" in f.read():
                    out.append(int(pid))
                    continue
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)).startswith("/memfd:ferry-shared"):
                    out.append(int(pid))
                    break
        except OSError:
            continue
    return out


def _gone(pids, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in pids if os.path.exists("/proc/%d" % p) and
                open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[0] != "Z"]:
            return True
        time.sleep(0.05)
    return False


def test_trainers_over_the_same_collection_map_one_copy_and_hand_it_on():
    started = []

    def trainer(**kw):
        started.append(Trainer(**kw))
        return started[-1]
    try:
        a = trainer()
        # Alone on the host: its own bytes, no copy made.
        assert a.first["inodes"] == [] and a.ask("report")["held"] == []
        b = trainer()
        # Found by content: a made the copy when b asked, b maps it.
        assert len(b.first["inodes"]) == 1
        assert a.ask("report")["held"] == b.first["inodes"]
        for t in (a, b):
            assert t.first["seed"] == 0 and t.first["ok"]  # the items read are the rows
        c = trainer()
        assert c.first["inodes"] == b.first["inodes"]  # a third: the same copy
        # Another collection: nothing of theirs.
        e = trainer(seed=1)
        assert e.first["inodes"] == [] and e.first["seed"] == 1 and e.first["ok"]
        # The server (a) lets go (its release runs on a thread of its own:
        # waited for, with a deadline): b serves the copy on, a newcomer
        # finds it.
        a.ask("close")
        deadline = time.monotonic() + 10
        while a.ask("report")["held"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.ask("report")["held"] == []
        d = trainer()
        assert d.first["inodes"] == b.first["inodes"]
    finally:
        for t in started:
            t.kill()
    assert _gone([t.proc.pid for t in started])


def test_off_and_nothing_left_after_sigkill():
    key, _ = _key()
    off = Trainer(env={"FERRY_SHARE_HOST": "0"})
    assert off.first["inodes"] == [] and not _bound(key)
    off.end()
    before_shm = set(os.listdir("/dev/shm"))
    a = b = None
    try:
        a, b = Trainer(), Trainer()
        assert a.ask("report")["held"] == b.first["inodes"] != []
        assert _bound(key) and _memfds_left()
        pids = [a.proc.pid, b.proc.pid] + a.first["workers"] + b.first["workers"]
    finally:
        for t in (a, b):  # SIGKILL: what is tested, and the cleanup if it failed before
            if t is not None:
                t.kill()
    assert _gone(pids), "a process of a killed trainer's loader is still alive"
    deadline = time.monotonic() + 20
    while (_bound(key) or _memfds_left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    # no name, no process holding or mapping a copy (so no memfd), no file
    assert not _bound(key) and _memfds_left() == []
    assert set(os.listdir("/dev/shm")) == before_shm


def _squat(key, arrays, uid, same_bytes):
    """A process of uid bound to the trainers' name first, serving a
    sealed copy (the same bytes, or others of the same size) with the
    right header; it writes on `heard` what each peer sent. Returns (pid,
    ready fd, heard fd)."""
    from ferry import _hostshare
    offsets, size = _hostshare._layout(arrays)
    if not same_bytes:
        arrays = [a.copy() for a in arrays]
        arrays[0].reshape(-1).view("u1")[:64] ^= 0xFF
    fd = _hostshare._make(arrays, offsets, size)
    name = b"\0ferry-share-%d-%s" % (os.geteuid(), key.encode())  # the trainers' (our uid's)
    ready_r, ready_w = os.pipe()
    heard_r, heard_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(heard_r)
            if uid != os.geteuid():
                os.setgid(uid)
                os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(name)
            s.listen(4)
            os.write(ready_w, b"x")
            while True:
                conn, _ = s.accept()
                got = conn.recv(16)
                os.write(heard_w, (got or b"EOF")[:5].ljust(5, b"."))
                if got == b"copy":
                    socket.send_fds(conn, [struct.pack("=Q", size)], [fd])
                conn.close()
        finally:
            os._exit(0)
    os.close(fd)
    os.close(ready_w)
    os.close(heard_w)
    return pid, ready_r, heard_r


def _read(fd, n, seconds=30.0):
    assert select.select([fd], [], [], seconds)[0], "nothing said in time"
    return os.read(fd, n)


@pytest.mark.parametrize("who", ["another user, the same bytes", "this user, other bytes"])
def test_a_copy_not_to_be_trusted_is_refused(who):
    """A process bound to the trainers' name first serves a sealed copy:
    of the same bytes but another user's (refused by its uid, before the
    trainer says anything), or this user's with other bytes (refused by
    the comparison). Either way the trainer keeps its own bytes."""
    other_user = who.startswith("another")
    if other_user and os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    key, arrays = _key()
    pid, ready, heard = _squat(key, arrays, 65534 if other_user else os.geteuid(),
                               same_bytes=other_user)
    try:
        assert _read(ready, 1) == b"x"
        t = Trainer()
        try:
            assert t.first["inodes"] == []  # nothing of the squatter's mapped
            assert t.first["seed"] == 0 and t.first["ok"]
            got = _read(heard, 5)
            # asked there (the same name): another user heard nothing from
            # it (the uid checked first), this user was asked for the copy
            assert got == (b"EOF.." if other_user else b"copy.")
        finally:
            t.end()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready)
        os.close(heard)
