"""Encoded collections shared between trainers on a host: loaders of
different processes (the same user's) whose datasets hold the same big
list or dict map one shared copy of its encoded form, not one each.

A collection ferry encodes for its workers (_shared: a million dicts, a
vocabulary) costs each trainer its encoded bytes, tens of MB a million
items. When several experiments run on one machine over the same data,
each trainer encodes the same bytes. Here the first serves them (as a
sealed memfd, made when first asked for); the others find them by
content and map that copy instead of keeping their own:

- **Found by content.** The copy is named by a 128-bit hash of its bytes
  (columns.c: content_hash), served on an abstract Unix socket
  ``@ferry-share-UID-HASH``. A trainer that encoded the same bytes
  connects, receives the memfd (SCM_RIGHTS) and compares it with its own
  bytes in full (content_equal) before using it: a hash never decides.
- **Nothing left behind.** An abstract socket is no file, and a memfd is
  freed by the kernel when the last process mapping it is gone: a
  trainer, a clean parent or a worker killed by SIGKILL leaves nothing in
  /dev/shm or anywhere else. When the serving process closes its loaders
  (or dies), another holder of the copy takes the name over, so later
  trainers keep finding it.
- **Between users.** Abstract names are open to every user of the network
  namespace: the server answers only a peer of its own uid
  (SO_PEERCRED), the client takes a copy only from a server of its own
  uid, and the memfd is sealed against writes, growth and shrinking
  before it is shared (F_SEAL_*), so no holder can change what others
  map.
- **Off:** ``FERRY_SHARE_HOST=0`` (or ``share_collections=False``, which
  keeps collections as they are). Collections under 16 MiB encoded
  (FERRY_SHARE_HOST_MIN_BYTES) are not worth it and stay the trainer's
  own.

Cost: hashing the bytes on the way to the first batch (about 4 ms for
38 MB here). The first trainer keeps its own bytes and makes the shared
memfd only when another process first asks for it (about 15 ms, on its
serving thread), so a trainer alone on its host pays for no copy; a
later trainer compares the copy with its own bytes (about 6 ms) and maps
it. With N trainers the host holds two copies, the first trainer's own
and the shared one, whatever N.
"""

import errno
import logging
import os
import socket
import struct
import threading
import time
import weakref

import numpy as np

from . import _ferry

_logger = logging.getLogger("ferry")

MIN_BYTES = 16 << 20
_ALIGN = 64
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")

_lock = threading.RLock()  # (a finalizer may release a copy inside adopt)
_copies = {}  # hex hash -> _Copy, this process's (never a fork's: see _forget)


def min_bytes():
    """The least encoded size shared (FERRY_SHARE_HOST_MIN_BYTES, 16 MiB)."""
    try:
        return int(os.environ.get("FERRY_SHARE_HOST_MIN_BYTES", MIN_BYTES))
    except ValueError:
        return MIN_BYTES


def enabled():
    """Whether loaders here share encoded collections with other processes."""
    return os.environ.get("FERRY_SHARE_HOST", "1").strip().lower() not in ("0", "false", "no",
                                                                            "off")


def _name(key):
    return b"\0ferry-share-%d-%s" % (os.geteuid(), key.encode())


def _layout(arrays):
    """(offsets, total size): the arrays end to end, each at a 64-byte
    boundary (numpy's preferred alignment)."""
    offsets, at = [], 0
    for a in arrays:
        offsets.append(at)
        at += -(-a.nbytes // _ALIGN) * _ALIGN
    return offsets, max(at, _ALIGN)


def _views(mm, arrays, offsets):
    return [np.frombuffer(mm, dtype=a.dtype, count=a.size, offset=o).reshape(a.shape)
            for a, o in zip(arrays, offsets)]


def _bytes_of(arrays):
    return [memoryview(np.ascontiguousarray(a)).cast("B") for a in arrays]


def _map(fd, size):
    """A read-only shared mapping of a copy (each loader's own: it goes
    when the last array over it does), made through a read-only open of
    the memfd: a shared mapping of a writable fd could be made writable
    later, so the kernel would refuse the write seal while it stands."""
    import mmap
    ro = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(ro, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(ro)


class _Copy:
    """This process's hold on one shared copy, and the thread that serves
    it (or waits to take over). Either the memfd of a copy received from
    another process (fd; the mappings are the loaders', adopt), or, in
    the first process to encode these bytes, its own arrays (weakly held),
    of which a memfd is made only when another process first asks for
    it: a trainer alone on its host pays for no copy."""

    def __init__(self, key, fd, size, arrays=None, offsets=None):
        self.key, self.fd, self.size, self.pid = key, fd, size, os.getpid()
        self.own = None if arrays is None else [weakref.ref(a) for a in arrays]
        self.offsets = offsets
        self.users = 0
        # fd, own and the sockets change under it: the serving thread, a
        # loader's release (stop) and a fork's child all touch them
        self.lock = threading.Lock()
        self.sock = None  # listening (serving) or connected (watching)
        self.watchers = []  # the holders watching this server
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve_or_watch, daemon=True,
                                       name="ferry-share")

    def start(self):
        self.thread.start()
        return self

    def _socket(self):
        """A new socket, kept as self.sock (so stop() can wake it); None
        once stopping. The thread alone closes its sockets."""
        with self.lock:
            if self.stopping.is_set():
                return None
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            return self.sock

    def _drop(self, s):
        with self.lock:
            if self.sock is s:
                self.sock = None
        s.close()

    # -- the name: serve it, or watch who does and take over when it goes
    def _serve_or_watch(self):
        pause = 0.05
        while True:
            s = self._socket()
            if s is None:
                return
            try:
                s.bind(_name(self.key))
                s.listen(16)
            except OSError as e:
                self._drop(s)
                # Taken: watch its server, to take over when it goes. A
                # name held by another user, or by a socket that does not
                # listen, is given up on (never spun on): this loader keeps
                # its copy, unshared. A server that lets its watchers go at
                # once is retried less and less often.
                began = time.monotonic()
                if e.errno != errno.EADDRINUSE or not self._watch():
                    return
                pause = 0.05 if time.monotonic() - began > 1.0 else min(5.0, pause * 2)
                if self.stopping.wait(pause):
                    return
                continue
            try:
                self._serve(s)
            finally:
                self._drop(s)
            return

    def _watch(self):
        """Waits, connected to the server, until it goes: True then (to
        take over); False when stopping, or the server is not one of this
        user's listening ones."""
        s = self._socket()
        if s is None:
            return False
        try:
            s.settimeout(2.0)
            s.connect(_name(self.key))
            if _peer_uid(s) != os.geteuid():
                return False
            s.sendall(b"watch")
            s.settimeout(None)
            while s.recv(16):
                pass  # the server sends nothing: EOF when it goes
            return not self.stopping.is_set()
        except OSError:
            return False
        finally:
            self._drop(s)

    def _serve(self, s):
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = s.accept()
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        self.stopping.wait(0.1)  # out of fds for a moment: not the end
                        continue
                    if e.errno == errno.ECONNABORTED:
                        continue
                    return
                try:
                    if _peer_uid(conn) != os.geteuid():
                        conn.close()  # another user's process: nothing for it
                        continue
                    conn.settimeout(2.0)
                    what = conn.recv(16)
                    if what == b"watch":
                        with self.lock:
                            self.watchers.append(conn)  # closed as this stops: they take over
                        continue
                    fd = self._dup_fd() if what == b"copy" else -1
                    if fd >= 0:
                        try:
                            socket.send_fds(conn, [struct.pack("=Q", self.size)], [fd])
                        finally:
                            os.close(fd)
                    conn.close()
                except OSError:
                    conn.close()
        finally:
            with self.lock:
                watchers, self.watchers = self.watchers, []
            for w in watchers:
                w.close()

    def _dup_fd(self):
        """A duplicate of the copy's memfd for a peer (-1: none), made at
        the first request from this process's own arrays."""
        with self.lock:
            if self.stopping.is_set():
                return -1
            if self.fd is None and self.own is not None:
                arrays = [r() for r in self.own]
                if any(a is None for a in arrays):
                    return -1
                try:
                    self.fd = _make(arrays, self.offsets, self.size)
                except OSError as e:
                    _logger.debug("ferry: could not share a collection with other processes: "
                                  "%s", e)
                    self.own = None
                    return -1
            return -1 if self.fd is None else os.dup(self.fd)

    def map(self, arrays, offsets):
        """A mapping of the copy this process received, its bytes checked
        against arrays (another loader here with the same hash); None when
        there is none or they differ."""
        with self.lock:
            if self.fd is None or self.stopping.is_set():
                return None
            mm = _map(self.fd, self.size)
        if not _ferry.content_equal(_bytes_of(_views(mm, arrays, offsets)), _bytes_of(arrays)):
            mm.close()
            return None
        return mm

    def stop(self):
        """This process lets the copy go: the thread wakes and ends (its
        sockets closed by it), the watchers are let go, the fd closed."""
        with self.lock:
            self.stopping.set()
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept, connect, recv
                except OSError:
                    pass
            fd, self.fd, self.own = self.fd, None, None
        if fd is not None:
            os.close(fd)
        # the kernel frees the memfd when no process holds or maps it

    def forget_in_child(self):
        """In a fork: nothing of this is the child's (no thread runs it)."""
        for sock in [self.sock] + self.watchers:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.sock, self.watchers, self.fd, self.own = None, [], None, None


def _peer_uid(s):
    creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _fetch(key, arrays, offsets, size):
    """(copy, mapping) of the copy another process serves under key,
    checked byte for byte against arrays; None when there is none (or it
    is not the same)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    fd = None
    try:
        s.settimeout(1.0)
        s.connect(_name(key))
        if _peer_uid(s) != os.geteuid():
            return None  # a name squatted by another user
        s.sendall(b"copy")
        msg, fds, _, _ = socket.recv_fds(s, 64, 1)
        if len(fds) != 1 or len(msg) != 8:
            for f in fds:
                os.close(f)
            return None
        fd = fds[0]
        import fcntl
        want = 0
        for name in _SEALS:
            want |= getattr(fcntl, name)
        if struct.unpack("=Q", msg)[0] != size or os.fstat(fd).st_size != size or \
                (fcntl.fcntl(fd, fcntl.F_GET_SEALS) & want) != want:
            return None
        mm = _map(fd, size)
        if not _ferry.content_equal(_bytes_of(_views(mm, arrays, offsets)), _bytes_of(arrays)):
            mm.close()
            _logger.warning("ferry: a shared copy named like this dataset's collection holds "
                            "other bytes; the loader keeps its own")
            return None
        copy = _Copy(key, fd, size).start()
        fd = None
        return copy, mm
    except OSError:
        return None
    finally:
        if fd is not None:
            os.close(fd)
        s.close()


def _make(arrays, offsets, size):
    """A new memfd holding arrays at offsets, sealed against writes,
    growth and shrinking."""
    import fcntl
    fd = os.memfd_create("ferry-shared", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        for view, off in zip(_bytes_of(arrays), offsets):
            while view:  # pwrite: no mapping (a writable one would stop the seal)
                n = os.pwrite(fd, view, off)
                view, off = view[n:], off + n
        seals = 0
        for name in _SEALS:
            seals |= getattr(fcntl, name)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _leaves(state, out):
    """The numpy arrays in a nested tuple/list state, in order."""
    if isinstance(state, np.ndarray):
        out.append(state)
    elif isinstance(state, (tuple, list)):
        for x in state:
            _leaves(x, out)
    return out


def _rebuild(state, arrays):
    if isinstance(state, np.ndarray):
        return next(arrays)
    if isinstance(state, (tuple, list)):
        return type(state)(_rebuild(x, arrays) for x in state)
    return state


def _release(key):
    with _lock:
        copy = _copies.get(key)
        if copy is None or copy.pid != os.getpid():
            return
        copy.users -= 1
        if copy.users > 0:
            return
        del _copies[key]
    copy.stop()  # (outside _lock: stop takes the copy's own)


def _released(key):
    """A finalizer's call (it runs wherever the collector does, maybe on a
    thread holding a copy's lock): the release on a thread of its own."""
    try:
        threading.Thread(target=_release, args=(key,), daemon=True,
                         name="ferry-share-release").start()
    except RuntimeError:  # the interpreter is shutting down: no thread is waited for
        _release(key)


def adopt(state):
    """An encoded collection's state, its arrays moved onto the host's
    shared copy of the same bytes (found, or made and served); state as
    it is when the arrays are small, sharing is off, or anything fails."""
    arrays = _leaves(state, [])
    total = sum(a.nbytes for a in arrays)
    if not arrays or total < min_bytes() or not enabled():
        return state
    try:
        key = _ferry.content_hash(_bytes_of(arrays)).hex()
        offsets, size = _layout(arrays)
        with _lock:
            _forget_if_forked()
            copy = _copies.get(key)
            if copy is not None:
                # Another loader of this process had these bytes: its own
                # arrays (this loader keeps its own too), or a copy received,
                # mapped again once its bytes are checked.
                mm = copy.map(arrays, offsets) if copy.own is None else None
                if mm is None:
                    return state
            else:
                got = _fetch(key, arrays, offsets, size)
                if got is None:
                    # The first on the host: its own arrays, served on request.
                    copy = _Copy(key, None, size, arrays, offsets).start()
                    _copies[key] = copy
                    copy.users += 1
                    weakref.finalize(arrays[0], _released, key)
                    return state
                copy, mm = got
                _copies[key] = copy
            copy.users += 1
        views = _views(mm, arrays, offsets)
    except Exception as e:  # noqa: BLE001 - sharing is an economy: never a failure
        _logger.debug("ferry: the collection is not shared with other processes: %s", e)
        return state
    # This loader holds the copy as long as an array over its mapping lives.
    weakref.finalize(mm, _released, key)
    return _rebuild(state, iter(views))


def _forget_if_forked():
    """In a fork: the parent's copies are not this process's to serve."""
    for key in [k for k, c in _copies.items() if c.pid != os.getpid()]:
        del _copies[key]


def _after_fork_in_child():
    # The parent's sockets would keep its name bound (answering nothing),
    # and its watchers connected, for as long as a child lived; its fds
    # and threads are not the child's. A lock another thread held at the
    # fork would never be released here.
    global _lock
    _lock = threading.RLock()
    for c in _copies.values():
        c.forget_in_child()
    _copies.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
