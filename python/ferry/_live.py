"""The loader's side of the live view (``python -m ferry.top PID``): a
local socket the trainer opens only when asked, which shows every open
loader of this process to a client of the same user.

Asked for with ``ferry.Loader(..., live=True)`` or, for a script left as
it is, ``FERRY_LIVE=1`` in its environment. The first live loader of the
process opens a Linux abstract unix socket named ``ferry-live-<pid>``
(address() below; no file, nothing to clean up after a crash) and starts
one thread, ``ferry-live``, which serves it; the last one to close ends
both. Loaders opened meanwhile are listed together.

What a client gets is JSON lines (one object per line, "\\n"-terminated):

    {"hello": "ferry-live", "version": 1, ...}    once, after the check below
    {"time": ..., "loaders": [...]}                a snapshot: once a second,
                                                   and at once for any line the
                                                   client sends
    {"closed": "..."}                              the last live loader closed;
                                                   the socket closes after it
    {"refused": "..."}                             instead of hello: the peer is
                                                   another user; then closed

Who may attach: the socket's peer credentials (SO_PEERCRED, filled in by
the kernel at connect, not claimed by the client) must name this process's
own uid. An abstract socket has no file permissions, so this check is the
only gate; root is not let in to another user's trainer either.

Threads and cost: nothing here runs per batch. The thread sleeps in a
selector and wakes for a client, for the next second's tick while a client
is attached, or to stop. A tick reads each loader's profile snapshot and
counters from C (microseconds: no lock the trainer's next() takes) with
the registry's lock held, so a loader's close() waits at most for that
read before its C side goes away. Sends never block: a client that stops
reading is dropped once it owes more than OWED_MAX bytes. A forked child
(a clean parent, a user's fork) closes its copies of the sockets at once
and starts no thread: only the trainer serves.
"""

import collections
import errno
import json
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
import weakref

VERSION = 1          # of the lines above; a client says which it reads
TICK_S = 1.0         # a snapshot this often while a client is attached
WINDOW_S = 5.0       # the figures of a snapshot: the last this many seconds
OWED_MAX = 1 << 20   # bytes a client may fall behind before it is dropped
ENV = "FERRY_LIVE"   # "1": every loader of the process is live unless live=False

_logger = logging.getLogger("ferry")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def address(pid):
    """The abstract socket's name for process ``pid`` (leading NUL)."""
    return "\0ferry-live-%d" % pid


def wanted(live):
    """Whether a loader with option ``live`` (True, False, or None: the
    environment decides) serves the live view. A FERRY_LIVE value that
    is neither on nor off is said once in the log and taken as off: an
    unchanged script must not fail over it."""
    if live is not None:
        if not isinstance(live, bool):
            raise TypeError("ferry.Loader: live must be True, False or None, not %r" % (live,))
        return live
    value = os.environ.get(ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        _logger.warning("ferry: %s=%r is not 1 or 0; the live view stays off", ENV,
                        os.environ[ENV])
    return False


def check_peer(peer_uid, own_uid):
    """None when a client of uid ``peer_uid`` may attach to a trainer of
    ``own_uid``, else the one-line reason it is refused. Only the same
    user: root included, as the socket cannot tell an operator from
    anyone else who became root."""
    if peer_uid == own_uid:
        return None
    return ("uid %d is not the trainer's user (uid %d): the live view is for its own user only"
            % (peer_uid, own_uid))


def peer_uid(sock):
    """The uid of the process at the other end of unix socket ``sock``,
    as the kernel recorded it at connect (SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# ---------------------------------------------------------------------------
# What a snapshot says of one loader


def _stage_row(s):
    return {"mean": s["mean"], "p50": s["p50"], "p99": s["p99"]}


def _workers(c, rep, local, threads):
    """The rows of the loader's workers: each slot that delivered in the
    span, local (pid, or "thread") or remote (host and its pid there)."""
    rows = []
    span = rep["seconds"] or 1.0
    for index in sorted(rep["workers"]):
        w = rep["workers"][index]
        row = {"worker": index, "batches": w["batches"], "rate": w["batches"] / span,
               "busy": w["busy"], "make_p50": w["stages"]["make"]["p50"],
               "transit": w["stages"]["transit"]["mean"]}
        if index < local:
            row["where"] = "thread" if threads else "local"
            try:
                row["pid"] = c.worker_pid(index) or None
            except Exception:
                row["pid"] = None
        else:
            row["where"] = "remote"
            try:
                host = c.worker_host(index)
            except Exception:
                host = None
            row["host"], row["pid"] = host if host else (None, None)
        rows.append(row)
    return rows


class _Entry:
    """One live loader: a weak reference (the registry never keeps a loader
    alive) and the marks its sliding window is measured from."""

    def __init__(self, number, loader):
        self.number = number
        self.ref = weakref.ref(loader)
        self.opened = time.monotonic()
        self.marks = collections.deque()  # (monotonic, C loader, snapshot), oldest first
        opts = dict(loader._pairs)
        self.spec = opts.get("dataset", "")
        self.batch_size = int(opts.get("batch_size", 256))
        self.local = int(opts.get("workers", 2))
        self.threads = str(opts.get("worker_mode", "process")).lower() == "thread"
        self.remote = "bind" in opts

    def alive(self):
        loader = self.ref()
        return loader is not None and loader._c is not None

    def snapshot(self, now, mark):
        """The dict a client gets for this loader, or None when it has
        closed. With ``mark`` the snapshot is kept as the start of a later
        window (the ticks); a snapshot on request leaves the marks alone."""
        loader = self.ref()
        c = loader._c if loader is not None else None
        if c is None:
            return None
        try:
            snap = c.profile()
            st = c.stats(False)
        except ValueError:  # closed meanwhile (load_state_dict's old C loader)
            return None
        while self.marks and self.marks[0][1] is not c:  # load_state_dict: another C loader
            self.marks.popleft()
        while len(self.marks) > 1 and now - self.marks[1][0] >= WINDOW_S:
            self.marks.popleft()
        since = self.marks[0][2] if self.marks else None
        window = snap.since(since) if since is not None else snap
        rep = window.report()
        if mark:
            self.marks.append((now, c, snap))
        span = rep["seconds"]
        return {
            "loader": self.number,
            "dataset": self.spec if len(self.spec) <= 200 else self.spec[:197] + "...",
            "up": now - self.opened,
            "span": span,
            "since_open": since is None,
            "batches": rep["batches"],
            "rate": rep["batches"] / span if span > 0 else 0.0,
            "batch_size": self.batch_size,
            "delivered": st["delivered"],
            "workers_ready": st["workers"],
            "local": self.local,
            "remote": st["remote_connections"] if self.remote else None,
            "in_flight": st["in_flight"],
            "prefetch": st["prefetch"],
            "restarts": st["restarts"],
            "lost": st["lost"],
            "kind": rep["kind"],
            "verdict": rep["verdict"],
            "wait_share": rep["wait_share"],
            "stages": {name: _stage_row(s) for name, s in rep["stages"].items()},
            "workers": _workers(c, rep, self.local, self.threads),
        }


# ---------------------------------------------------------------------------
# The server


class _Client:
    def __init__(self, sock):
        self.sock = sock
        self.owed = bytearray()  # what it has not taken yet
        self.heard = bytearray()  # a partial line from it


class _Hub:
    """The process's live socket, its thread, its clients, and the loaders
    it shows. Made by the first live loader, ended with the last."""

    def __init__(self):
        self.lock = threading.Lock()  # the entries; held for a snapshot's read (see add)
        self.entries = []
        self.numbered = 0
        self.clients = {}  # socket -> _Client; the thread's alone
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.wake_r = self.wake_w = None
        try:
            self.listener.bind(address(os.getpid()))
            self.listener.listen(16)
            self.listener.setblocking(False)
            self.wake_r, self.wake_w = socket.socketpair()
            self.wake_r.setblocking(False)
        except BaseException:
            self._close_sockets()
            raise
        self.stopping = False
        self.why = ""
        self.thread = threading.Thread(target=self._run, name="ferry-live", daemon=True)
        self.thread.start()

    # -- the loaders (any thread). Nothing that makes objects runs under
    # self.lock: the garbage collector could run a loader's close() there.
    def add(self, entry):
        with self.lock:
            entry.number = self.numbered
            self.numbered += 1
            self.entries.append(entry)

    def remove(self, loader):
        """Forgets ``loader`` (and any loader gone); True when none is left."""
        with self.lock:
            self.entries = [e for e in self.entries if e.ref() is not loader and e.alive()]
            return not self.entries

    def stop(self, why):
        """Ends the thread (it tells each client ``why`` and closes every
        socket of its own); returns once the thread is gone. Not on it."""
        self.why = why
        self.stopping = True
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass  # its buffer is full (a wake is pending), or it ended by itself
        self.thread.join()
        self.wake_w.close()

    def _close_sockets(self):
        for s in (self.listener, self.wake_r, self.wake_w):
            if s is not None:
                s.close()

    def _retire_if_empty(self):
        """The thread's own end, when its last loader closed without
        detach (collected by the garbage collector on this very thread,
        which detach leaves alone): the name is freed here, under the
        module's lock, so that a new hub can take it."""
        global _hub
        if not _hub_lock.acquire(blocking=False):
            return  # another thread is attaching or detaching: the next tick
        try:
            with self.lock:
                if any(e.alive() for e in self.entries):
                    return
            if _hub is self:
                _hub = None
            self.listener.close()
            self.why = self.why or "the loaders of pid %d closed" % os.getpid()
            self.stopping = True
        finally:
            _hub_lock.release()

    def forget_in_child(self):
        """In a forked child: the parent's sockets closed, no thread (the
        child has none of the parent's threads anyway)."""
        for s in list(self.clients) + [self.listener, self.wake_r, self.wake_w]:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self.clients = {}

    # -- the thread
    def _run(self):
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        next_tick = None
        try:
            while not self.stopping:
                timeout = None if next_tick is None else max(0.0, next_tick - time.monotonic())
                for key, events in sel.select(timeout):
                    if key.fileobj is self.listener:
                        self._accept(sel)
                    elif key.fileobj is self.wake_r:
                        self._drain_wake()
                    elif events & selectors.EVENT_READ:
                        self._heard(sel, key.fileobj)
                    if key.fileobj in self.clients and events & selectors.EVENT_WRITE:
                        self._flush(sel, key.fileobj)
                if self.stopping:
                    break
                if not self.clients:
                    next_tick = None
                    with self.lock:
                        for e in self.entries:  # a later attach starts afresh
                            e.marks.clear()
                elif next_tick is None or time.monotonic() >= next_tick:
                    snap = self._snapshot(mark=True)
                    if not snap["loaders"]:
                        self._retire_if_empty()
                        if self.stopping:
                            break
                    self._send_all(sel, snap)
                    next_tick = time.monotonic() + TICK_S
        except Exception as e:  # never the trainer's problem: say it, stop serving
            _logger.warning("ferry: the live view stopped: %s: %s", type(e).__name__, e)
            self.why = "the live view stopped: %s" % e
        finally:
            for sock in list(self.clients):
                self._say(sock, {"closed": self.why})
                self._drop(sel, sock)
            sel.close()
            self.listener.close()
            self.wake_r.close()

    def _drain_wake(self):
        try:
            while self.wake_r.recv(64):
                pass
        except BlockingIOError:
            pass

    def _accept(self, sel):
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        sock.setblocking(False)
        why = check_peer(peer_uid(sock), os.getuid())
        self.clients[sock] = _Client(sock)
        if why is not None:
            self._say(sock, {"refused": why})
            self._drop(sel, sock)
            return
        sel.register(sock, selectors.EVENT_READ)
        self._say(sock, {"hello": "ferry-live", "version": VERSION, "pid": os.getpid(),
                         "uid": os.getuid(), "argv": sys.argv, "tick": TICK_S,
                         "window": WINDOW_S})
        # Its first screen at once (a window since the last tick, or since
        # each loader opened when nobody was attached).
        self._send(sel, sock, self._snapshot(mark=False))

    def _heard(self, sel, sock):
        """A client's bytes: each full line asks for a snapshot now; EOF
        (or an error) ends it."""
        client = self.clients[sock]
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, sock)
            return
        client.heard += data
        asked = b"\n" in client.heard
        if asked:
            del client.heard[:client.heard.rindex(b"\n") + 1]
        if len(client.heard) > 4096:  # a line this long: not a client of ours
            self._drop(sel, sock)
            return
        if asked:
            self._send(sel, sock, self._snapshot(mark=False))

    def _snapshot(self, mark):
        now = time.monotonic()
        with self.lock:
            loaders = [s for s in (e.snapshot(now, mark) for e in self.entries) if s is not None]
        return {"time": time.time(), "loaders": loaders}

    def _say(self, sock, obj):
        """Sends one line now if the socket takes it (for the last words
        before a close); never waits."""
        client = self.clients.get(sock)
        if client is None:
            return
        client.owed += json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        try:
            n = sock.send(client.owed)
            del client.owed[:n]
        except OSError:
            pass

    def _send_all(self, sel, obj):
        line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        for sock in list(self.clients):
            self._send(sel, sock, line)

    def _send(self, sel, sock, obj):
        client = self.clients.get(sock)
        if client is None:
            return
        if not isinstance(obj, bytes):
            obj = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        client.owed += obj
        if len(client.owed) > OWED_MAX:  # it stopped reading
            _logger.debug("ferry: the live view dropped a client %d bytes behind",
                          len(client.owed))
            self._drop(sel, sock)
            return
        self._flush(sel, sock)

    def _flush(self, sel, sock):
        client = self.clients[sock]
        try:
            while client.owed:
                n = sock.send(client.owed)
                del client.owed[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(sel, sock)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.owed else 0)
        sel.modify(sock, events)

    def _drop(self, sel, sock):
        self.clients.pop(sock, None)
        try:
            sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


# ---------------------------------------------------------------------------
# The process's hub: made by the first live loader, ended with the last

_hub = None
# Around making and ending the hub. Re-entrant: a loader's close() may run
# from the garbage collector inside attach, on the same thread.
_hub_lock = threading.RLock()


def attach(loader):
    """Shows ``loader`` in this process's live view, opening the socket if
    it is the first. Returns True, or False (said in the log) when the
    socket cannot be had: the loader then runs without a live view."""
    global _hub
    entry = _Entry(0, loader)  # (numbered by the hub)
    with _hub_lock:
        if _hub is None:
            try:
                hub = _Hub()
            except OSError as e:
                why = "another process of this pid (another PID namespace) holds it" \
                    if e.errno == errno.EADDRINUSE else e.strerror
                _logger.warning("ferry: no live view for pid %d: %s", os.getpid(), why)
                return False
            _hub = hub
        _hub.add(entry)
        return True


def detach(loader):
    """Takes ``loader`` out of the live view; the last one closes the
    socket, its clients told so. Returns once the hub's thread is gone
    (then nothing of the live view is left in the process)."""
    global _hub
    with _hub_lock:
        hub = _hub
        if hub is None or threading.current_thread() is hub.thread:
            return  # collected on the hub's own thread: its tick retires it
        if not hub.remove(loader):
            return
        _hub = None
        hub.listener.close()  # the name is free for the next hub at once
    hub.stop("the loaders of pid %d closed" % os.getpid())


def _forget_in_child():
    global _hub, _hub_lock
    if _hub is not None:
        _hub.forget_in_child()
        _hub = None
    _hub_lock = threading.RLock()  # the parent's may have been held by another thread


os.register_at_fork(after_in_child=_forget_in_child)
