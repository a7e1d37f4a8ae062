"""The handoff: a dataset object from the trainer to its loader's clean
parent, and what travels how.

The trainer pickles the object once (protocol 5, cloudpickle when there
is one). Its big arrays and tensors go out of band: lent to the clean
parent, a fork of the trainer, as the trainer's own memory (no copy), or
written once after the pickle into the memory the loader hands a spawned
clean parent. A memmap travels as a reference to its file; a big list or
dict in compact form (_shared); what only a fork can share (a
multiprocessing Value, Lock, Queue, a tensor in shared memory) as a token
to the trainer's own object. fingerprint() digests the same walk, for a
loader that must see a dataset changed between epochs. _dataset.py makes
the loader's spec of a pickled object and opens it in the worker.
"""

import os
import sys

import numpy as np

from . import _hostshare, _shared
from ._template import clean_parent_spawned


def _pickler():
    """cloudpickle when installed (Debian's python3-cloudpickle: it pickles
    lambdas and classes of the main script or a notebook by value), else
    the standard pickle."""
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        import pickle
        return pickle


def _unpicklable_part(obj, dumps, path="dataset", depth=0, seen=None):
    """The attribute path of the first part of obj that does not pickle,
    with its type, or None: what to name in the error."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return None
    seen.add(id(obj))
    if isinstance(obj, dict):
        parts = [("%s[%r]" % (path, k), v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        parts = [("%s[%d]" % (path, i), v) for i, v in enumerate(obj[:1000])]
    else:
        state = getattr(obj, "__dict__", None)
        parts = [("%s.%s" % (path, k), v) for k, v in (state or {}).items()]
    for where, value in parts:
        try:
            dumps(value)
        except Exception:  # noqa: BLE001 - any failure: look deeper
            return _unpicklable_part(value, dumps, where, depth + 1, seen) or \
                "%s (a %s)" % (where, type(value).__name__)
    return None


# ------------------------------------------------------------ the handoff
#
# A dataset object reaches the local workers through one memfd the trainer
# writes and the loader hands to the clean parent (option dataset_fd):
#
#   "FERRYPK1", u64 stream bytes, u64 buffers, (u64 offset, u64 bytes) per
#   buffer, the pickle stream, then each buffer at a page boundary.
#
# The pickle stream holds the object's structure; the bytes of every large
# contiguous array or tensor in it go out of band (pickle protocol 5) into
# the buffers, written once. The clean parent maps them privately (copy on
# write): the arrays it unpickles are views of that mapping, so its
# workers, forked from it, share those pages as torch's forked workers
# share the trainer's, and a worker that writes into its array changes
# only its own copy of the page. On the machine: the trainer's bytes and
# the memfd's, whatever the worker count. A memory-mapped numpy array
# (np.memmap, np.load(mmap_mode=...)) travels as a reference to its file
# and is mapped again in the clean parent: no byte of the file is read.

_MAGIC = b"FERRYPK1"
_OUT_OF_BAND_MIN = 64 * 1024  # smaller buffers stay in the stream (a page each is waste)


def _tensor_from_array(array):
    import torch
    return torch.from_numpy(array)


def _memmap_again(path, dtype, shape, offset, order, mode, size, mtime_ns, inode):
    """A np.memmap of the trainer's, mapped again here from its file; the
    file must be the one the trainer mapped (same size, time and inode)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError("the dataset's memory-mapped file %s is gone: %s" % (path, e)) from None
    if (st.st_size, st.st_mtime_ns, st.st_ino) != (size, mtime_ns, inode):
        raise ValueError("the dataset's memory-mapped file %s changed after the loader was "
                         "built (size %d, was %d): it would not be the trainer's array"
                         % (path, st.st_size, size))
    return np.memmap(path, dtype=dtype, mode=mode, offset=offset, shape=shape, order=order)


class _Items(list):
    """An object array's items in the handoff: a list, but not exactly one,
    so never taken for a big list to share (_shared): numpy rebuilds such
    an array from an exact list it is given back."""


def _object_array(items, shape):
    """An object array of ``items`` (as they are: no sequence among them
    is turned into a dimension), in ``shape``."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


def _reduce_shared(obj):
    """How the handoff pickles obj where it differs from pickle's own way,
    or NotImplemented: a memmap by reference to its file; a plain CPU torch
    tensor as its numpy array (whose bytes go out of band)."""
    if type(obj) is np.ndarray and obj.dtype == object:  # (pandas' object columns too)
        return (_object_array, (_Items(obj.reshape(-1).tolist()), obj.shape))
    if isinstance(obj, np.memmap):
        import mmap
        path = getattr(obj, "filename", None)
        if path and isinstance(obj.base, mmap.mmap) and (obj.flags.c_contiguous or
                                                         obj.flags.f_contiguous):
            try:
                st = os.stat(path)
            except OSError:
                return NotImplemented
            mode = {"w+": "r+"}.get(obj.mode, obj.mode)
            order = "C" if obj.flags.c_contiguous else "F"
            return (_memmap_again, (path, obj.dtype, obj.shape, obj.offset, order, mode,
                                    st.st_size, st.st_mtime_ns, st.st_ino))
        return NotImplemented
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        try:
            storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else \
                obj.storage()  # torch 1.x
            nbytes = obj.numel() * obj.element_size()
            # The whole of its storage: no other tensor could share a part
            # of it that the copy would then not share.
            if (obj.device.type == "cpu" and not obj.requires_grad and obj.is_contiguous()
                    and obj.storage_offset() == 0 and obj.layout == torch.strided
                    and storage.nbytes() == nbytes and nbytes >= _OUT_OF_BAND_MIN):
                return (_tensor_from_array, (obj.numpy(),))
        except (RuntimeError, TypeError, AttributeError):  # a dtype numpy has not
            pass
    return NotImplemented


# ------------------------------------------------------------ shared by inheritance
#
# What only a fork can share: a multiprocessing Value, Array, Lock, RLock,
# Semaphore, Condition, Event, Barrier or Queue (their semaphores are
# unlinked as they are made, their memory is an mmap of an unlinked file),
# a RawValue or RawArray, a CPU tensor in shared memory. Pickling one
# raises ("should only be shared between processes through inheritance");
# torch's forked workers simply have it. The handoff pickles each as a
# token instead, and keeps the object under it (_inherited) in the
# trainer, before the loader's template is forked: the clean parent, a
# fork of the template, finds the very object under the token (the same
# mapping, the same semaphore), and so do the workers it forks.

_inherited = {}          # token -> the trainer's object, for its forks
_inherited_count = [0]   # tokens made so far in this process
_inherited_used = [False]  # a dataset unpickled here holds one (holds_inherited)


def _inherited_kind(obj):
    """What obj is, if only a fork can share it ("a multiprocessing
    Value", ...), else None. Looks only at modules already imported."""
    t = type(obj)
    mod = getattr(t, "__module__", None)
    if mod in ("multiprocessing.synchronize", "multiprocessing.sharedctypes",
               "multiprocessing.queues") or (mod == "_multiprocessing" and t.__name__ == "SemLock"):
        return "a multiprocessing %s" % t.__name__
    ctypes = sys.modules.get("ctypes")
    if ctypes is not None and "multiprocessing.heap" in sys.modules and \
            isinstance(obj, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure, ctypes.Union)):
        wrapper = getattr(obj, "_wrapper", None)  # sharedctypes' RawValue, RawArray
        if type(wrapper).__module__ == "multiprocessing.heap":
            return "a multiprocessing RawValue or RawArray"
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor and not clean_parent_spawned():
        try:  # (spawned, it travels as a copy, as any tensor does)
            if obj.device.type == "cpu" and obj.is_shared():
                return "a tensor in shared memory"
        except (RuntimeError, AttributeError):
            pass
    return None


def _reduce_inherited(obj):
    """The handoff's reduction of an object only a fork can share (see
    _inherited_kind): a token, the object kept under it; else
    NotImplemented."""
    kind = _inherited_kind(obj)
    if kind is None:
        return NotImplemented
    _inherited_count[0] += 1
    token = "%d-%d" % (os.getpid(), _inherited_count[0])
    _inherited[token] = obj
    return (_inherited_object, (token, kind))


def _inherited_object(token, kind):
    """In a clean parent: the trainer's object under token."""
    try:
        obj = _inherited[token]
        _inherited_used[0] = True
        return obj
    except KeyError:
        raise ValueError(
            "the dataset holds %s shared with the trainer, which only a fork of the trainer "
            "made after it can share, and this clean parent is none (it was spawned: "
            "FERRY_CLEAN_PARENT=spawn or option fork_from=-1, or the trainer's fork that "
            "starts clean parents was gone)" % kind) from None


def holds_inherited():
    """Whether the dataset unpickled in this process (a clean parent, or a
    fork of it) holds an object it shares with the trainer by inheritance:
    such a dataset may count on its items being built in workers only, as
    torch's are (a Barrier of num_workers, a counter of items built)."""
    return _inherited_used[0]


def inherited_mark():
    """A mark of the tokens made so far (inherited_since)."""
    return _inherited_count[0]


def inherited_since(mark):
    """The tokens made since inherited_mark() gave mark (this process's)."""
    prefix = "%d-" % os.getpid()
    return [t for t in _inherited if t.startswith(prefix) and int(t[len(prefix):]) > mark]


def forget_inherited(tokens):
    """The trainer lets go of the objects under tokens (its loader closed)."""
    for t in tokens:
        _inherited.pop(t, None)


def _dumps(obj, buffer_callback, share_collections=True, persistent_id=None, inherit=True):
    """obj pickled (protocol 5) with the handoff's reductions; with
    share_collections, its big lists and dicts in compact form (_shared).
    persistent_id, when given, decides for those instead. inherit=False
    (a digest, not a handoff) names what only a fork shares by identity
    instead of keeping it under a new token."""
    import io
    mod = _pickler()
    base = getattr(mod, "CloudPickler", None) or mod.Pickler
    big = _shared.AUTO_MIN
    names = []  # id -> attribute path, found once, for the log
    done = {}  # id -> persistent id of the lists and dicts met

    def share(o):
        if id(o) in done:  # one more reference to it: the same id (and object)
            return done[id(o)][1]
        pid = _shared.auto_encode(o)
        if pid is not None and inherit:
            # one copy of these bytes on the host, whatever the trainers
            pid = pid[:2] + (_hostshare.adopt(pid[2]),)
        done[id(o)] = (o, pid)  # o kept: a temporary freed meanwhile would lend its id
        if not names:
            names.append(_shared.find_names(obj))
        what = "%s (a %s of %d items)" % (names[0].get(id(o), "a part of the dataset"),
                                           type(o).__name__, len(o))
        if pid is None:
            _note("%s is copied into each worker as its items are read: its items are not "
                  "plain values (ferry.shared(...) shares it anyway)" % what)
        else:
            _note("%s is shared with the workers in compact form (share_collections=False "
                  "turns this off)" % what)
        return pid

    decide = persistent_id or (share if share_collections else None)

    class HandoffPickler(base):
        def reducer_override(self, o):
            if inherit:
                out = _reduce_inherited(o)
            else:
                out = NotImplemented if _inherited_kind(o) is None else (_identity, (id(o),))
                if out is NotImplemented and _is_torch_generator(o):
                    # (no pickle of its own): what it draws next, its state
                    out = (_identity, (bytes(o.get_state().numpy()),))
            if out is not NotImplemented:
                return out
            out = _reduce_shared(o)
            if out is not NotImplemented:
                return out
            up = getattr(super(), "reducer_override", None)
            return up(o) if up is not None else NotImplemented

        def persistent_id(self, o):
            # Asked of every object (reducer_override never is of a list or
            # a dict): a type test and len() for the others.
            t = type(o)
            if (t is not list and t is not dict) or len(o) < big:
                return None
            return decide(o)

    if decide is None:
        del HandoffPickler.persistent_id
    f = io.BytesIO()
    try:
        HandoffPickler(f, protocol=5, buffer_callback=buffer_callback).dump(obj)
    finally:
        # The class made here is in a cycle (as every class is), and with
        # it `done`: the encoded collections would live until the next
        # collection, past the loader's close (a host's shared copy too).
        done.clear()
    return f.getvalue()


def _is_torch_generator(o):
    t = type(o)
    return t.__name__ == "Generator" and t.__module__ == "torch._C"


def _identity(object_id):
    """What a digest (fingerprint) pickles an object only a fork shares as:
    which object it is; never unpickled."""
    raise TypeError("a fingerprint is not unpickled")


# Arrays up to this many bytes in all are compared by content each epoch;
# larger ones by identity (fingerprint).
PRINT_CONTENT_MAX = 64 << 20


def fingerprint(obj):
    """A digest of obj as the workers would get it now: for a loader whose
    workers must see the dataset as it is at each epoch's start (torch's
    non-persistent workers), compared at each iter(), so the workers start
    again only when it changed. Its structure and small values by content;
    its arrays by content up to PRINT_CONTENT_MAX bytes in all, larger ones
    by identity (which array, where, what shape); its lists and dicts of
    AUTO_MIN items or more by identity and length; a memory-mapped file by
    its size, time and inode. Hashing a large array each epoch would cost
    the trainer ~1 s per GB here: an assignment (``dataset.x = new``) is
    seen, a write into it in place is not (docs/python.md)."""
    import hashlib
    buffers = []

    def keep(buf):
        buffers.append(buf.raw())
        return False

    stream = _dumps(obj, keep, persistent_id=lambda o: ("id", id(o), len(o)), inherit=False)
    h = hashlib.blake2b(stream, digest_size=16)
    whole = sum(b.nbytes for b in buffers) <= PRINT_CONTENT_MAX
    for b in buffers:
        where = np.frombuffer(b, dtype=np.uint8).__array_interface__["data"][0] if b.nbytes else 0
        h.update(b"%d:%d;" % (where, b.nbytes))
        if whole:
            h.update(b)
    return h.digest()


def _note(message):
    import logging
    logging.getLogger("ferry").info("ferry: %s", message)


def write_payload(fd, stream, buffers):
    """Writes the handoff (header, stream, buffers page-aligned) into fd."""
    import struct
    page = os.sysconf("SC_PAGE_SIZE")
    head = len(_MAGIC) + 16 + 16 * len(buffers)
    at = -(-(head + len(stream)) // page) * page
    table = []
    for b in buffers:
        table.append((at, b.nbytes))
        at += -(-b.nbytes // page) * page
    header = _MAGIC + struct.pack("<QQ", len(stream), len(buffers)) + b"".join(
        struct.pack("<QQ", off, n) for off, n in table)

    def put(view, off):
        view = memoryview(view).cast("B")
        while view:
            n = os.pwrite(fd, view, off)
            view, off = view[n:], off + n

    put(header + stream, 0)
    for (off, _), b in zip(table, buffers):
        put(b, off)
    if table:  # the last buffer's page, whole
        os.ftruncate(fd, max(os.fstat(fd).st_size, at))


# A handoff whose arrays stay the trainer's: "FERRYIN1", u64 stream bytes,
# u64 token bytes, the token, the stream. The buffers are those the
# trainer lent under the token (lend_buffers) before the template was
# forked: the clean parent, a fork of the template, has them as they were.
_LENT = b"FERRYIN1"


def lend_buffers(buffers):
    """A token under which this process keeps `buffers` (a handoff's
    out-of-band buffers: views of the dataset's own arrays) for the forks
    it makes from now on; forget_inherited([token]) lets them go."""
    _inherited_count[0] += 1
    token = "%d-%d" % (os.getpid(), _inherited_count[0])
    _inherited[token] = list(buffers)
    return token


def write_lent_payload(fd, stream, token):
    """Writes a handoff whose buffers were lent under token into fd."""
    import struct
    tok = token.encode()
    data = _LENT + struct.pack("<QQ", len(stream), len(tok)) + tok + stream
    view, off = memoryview(data), 0
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def read_payload(fd):
    """(stream, buffers) of the handoff in fd, which is closed: the stream
    read, the buffers memoryviews of a private (copy-on-write) mapping of
    fd. No Python object keeps the fd itself: a worker forked later must
    not find one that closes a number reused by then (the mapping holds
    the memory, not the fd)."""
    import struct
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, len(_MAGIC) + 16, 0)
        if head[:len(_LENT)] == _LENT:
            nstream, ntok = struct.unpack("<QQ", head[len(_LENT):])
            token = _pread_all(fd, ntok, len(head)).decode()
            buffers = _inherited.get(token)
            if buffers is None:
                raise ValueError("the dataset's arrays are the trainer's memory, lent to the "
                                 "fork of the trainer its clean parent comes from, and this "
                                 "clean parent is not one (it was spawned)")
            return _pread_all(fd, nstream, len(head) + ntok), buffers
        if head[:len(_MAGIC)] != _MAGIC:
            raise ValueError("the dataset's memory does not start as ferry's handoff does")
        nstream, nbuf = struct.unpack("<QQ", head[len(_MAGIC):])
        tlen = 16 * nbuf
        raw = _pread_all(fd, tlen, len(head))
        table = [struct.unpack_from("<QQ", raw, 16 * i) for i in range(nbuf)]
        stream = _pread_all(fd, nstream, len(head) + tlen)
        buffers = []
        if table:
            import mmap
            m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
            whole = memoryview(m)
            buffers = [whole[off:off + n] for off, n in table]
        return stream, buffers
    finally:
        os.close(fd)


def _pread_all(fd, n, off):
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 24), off)
        if not chunk:
            raise ValueError("the dataset's memory ends before its pickle does")
        parts.append(chunk)
        n -= len(chunk)
        off += len(chunk)
    return b"".join(parts)
