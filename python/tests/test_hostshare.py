"""Encoded collections shared between trainers on one host (_hostshare):
trainers over the same collection map one copy, found by content, taken
over when its server goes, refused from another user, released with the
last holder; nothing is left behind."""

import json
import os
import select
import signal
import socket
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


def _bound(key_prefix="ferry-share-"):
    """The abstract names of ferry's shared copies bound now."""
    with open("/proc/net/unix") as f:
        return [line.split()[-1] for line in f if key_prefix in line]


def _gone(pids, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in pids if os.path.exists("/proc/%d" % p) and
                open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[0] != "Z"]:
            return True
        time.sleep(0.05)
    return False


def test_trainers_over_the_same_collection_map_one_copy_and_hand_it_on():
    a = Trainer()
    b = c = d = None
    try:
        # Alone on the host: its own bytes, no copy made.
        assert a.first["inodes"] == [] and a.ask("report")["held"] == []
        b = Trainer()
        # Found by content: a made the copy when b asked, b maps it.
        assert len(b.first["inodes"]) == 1
        assert a.ask("report")["held"] == b.first["inodes"]
        for t in (a, b):
            assert t.first["seed"] == 0 and t.first["ok"]  # the items read are the rows
        c = Trainer()
        assert c.first["inodes"] == b.first["inodes"]  # a third: the same copy
        c.end()
        # Another collection: nothing of theirs.
        e = Trainer(seed=1)
        assert e.first["inodes"] == [] and e.first["seed"] == 1 and e.first["ok"]
        e.end()
        # The server (a) lets go: b serves the copy on, a newcomer finds it.
        assert a.ask("close")["held"] == []
        d = Trainer()
        assert d.first["inodes"] == b.first["inodes"]
        d.end()
    finally:
        for t in (a, b):
            if t is not None:
                t.kill()
    assert _gone([a.proc.pid, b.proc.pid])


def test_off_and_nothing_left_after_sigkill():
    off = Trainer(env={"FERRY_SHARE_HOST": "0"})
    assert off.first["inodes"] == []
    off.end()
    before_shm = set(os.listdir("/dev/shm"))
    a, b = Trainer(), Trainer()
    assert a.ask("report")["held"] == b.first["inodes"] != []
    assert _bound()
    pids = [a.proc.pid, b.proc.pid] + a.first["workers"] + b.first["workers"]
    for t in (a, b):
        os.kill(t.proc.pid, signal.SIGKILL)
        t.proc.wait(timeout=30)
    assert _gone(pids), "a process of a killed trainer's loader is still alive"
    deadline = time.monotonic() + 20
    while _bound() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _bound() == []  # no name left, and a memfd lives no longer than its holders
    assert set(os.listdir("/dev/shm")) == before_shm


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a server as another user")
def test_a_copy_served_by_another_user_is_refused():
    """Another user binds the name first and serves a sealed memfd of the
    same bytes: the trainer takes nothing from it and keeps its own."""
    # The name the trainer will look for: its collection's hash, found by
    # encoding the same rows here.
    sys.path.insert(0, HERE)
    from ferry import _ferry, _hostshare, _shared
    rows = [{"path": "/data/0/%08d.jpg" % i, "label": i % 1000} for i in range(200_000)]
    state = _shared.encode_list(rows)
    arrays = _hostshare._leaves(state, [])
    key = _ferry.content_hash(_hostshare._bytes_of(arrays)).hex()
    r, w = os.pipe()
    asked_r, asked_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: binds the name, answers whoever asks
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(b"\0ferry-share-0-" + key.encode())  # root's name
            s.listen(4)
            os.write(w, b"x")
            fd = os.memfd_create("evil")
            os.ftruncate(fd, 1 << 20)
            while True:
                conn, _ = s.accept()
                os.write(asked_w, b"a")
                try:
                    conn.recv(16)
                    socket.send_fds(conn, [b"\0" * 8], [fd])
                finally:
                    conn.close()
        finally:
            os._exit(0)
    try:
        os.close(w)
        os.close(asked_w)
        assert os.read(r, 1) == b"x"
        t = Trainer()
        try:
            assert t.first["inodes"] == []  # its own bytes: nothing of the other user's mapped
            assert t.first["seed"] == 0 and t.first["ok"]
            assert os.read(asked_r, 1) == b"a"  # it did ask there (the same name), and refused
        finally:
            t.end()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(asked_r)
