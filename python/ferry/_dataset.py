"""Python datasets: naming them for workers, and opening them in a worker.

A Python dataset reaches a worker by name, never pickled. The trainer's
``ferry.Loader`` turns a class into the spec::

    python:MODULE:QUALNAME {"kwargs": {...}, "path": [...], "main": "..."}

(``path``: directories to put on the worker's ``sys.path``; ``main``: the
trainer's main script, for a class defined there). The worker (the C loop
of ``python -m ferry.worker``, or a thread worker in the trainer) calls
:func:`open_dataset` with the text after ``python:``; this module imports
the class, builds the dataset, and reads the schema from item 0. That
item is kept (:class:`FirstItem`) and serves the task that asks for it
first, where it is provably what the task would build: a slow item 0 is
then built once, not once to learn the schema and again for the batch.

A dataset object is pickled once in the trainer instead (the handoff,
below) and unpickled once by the loader's clean parent, which is a fork of
the trainer made as the loader is built (fork_template, "the clean
parent's origin"): what only a fork can share, such as a multiprocessing
Value or Lock, travels as a token to the object the fork inherited
("shared by inheritance").

A remote worker (no ``--slot``) takes neither ``path`` nor ``main`` from
the loader and serves only modules under its ``--allow-module`` prefixes:
a loader cannot make it import and call anything else.
"""

import json
import os
import re
import sys
import traceback
import types

import numpy as np

from . import _ferry, _shared
from ._startup import C_LINE_MARK

# ferry's dtype codes (include/ferry.h, as the extension gives them), by
# numpy dtype string, and their names.
DTYPE_NAMES = dict(_ferry.DTYPE_NAMES)
_DTYPES = {np.dtype(name).str: code for code, name in DTYPE_NAMES.items()}

_SPEC = re.compile(r"^\s*([A-Za-z_][\w.]*):([A-Za-z_][\w.]*)\s*(.*)$", re.S)

# Set by ferry.worker for a remote worker (configure()).
_policy = {"remote": False, "allow": ()}

SPEC_MAX = 4095  # the C library's dataset spec limit, less the NUL


def configure(remote, allow):
    """How this worker process treats specs: ``remote`` ignores the
    loader's path and main and requires ``allow`` (module prefixes)."""
    _policy["remote"] = bool(remote)
    _policy["allow"] = tuple(allow)


# ---------------------------------------------------------------- trainer

def _system_dirs():
    """The interpreter's own module folders (stdlib, site-packages): every
    child finds those by itself."""
    import site
    import sysconfig
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:
        pass
    dirs.update(p for p in sys.path if p.endswith(".zip") or "dist-packages" in p.split(os.sep)
                or "site-packages" in p.split(os.sep) or "lib-dynload" in p.split(os.sep))
    return {os.path.abspath(d) for d in dirs if d}


def _child_finds_ferry():
    """Whether ``python -m ferry.worker`` started from this process (same
    environment, same cwd) imports this same ferry package."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    places = [os.getcwd()] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    places = {os.path.abspath(p) for p in places if p} | _system_dirs()
    return parent in places


def worker_command():
    """(worker_path, worker_args) for local Python workers: this interpreter
    running ``-m ferry.worker``, or, when a child could not import this
    ferry by itself, a ``-c`` line that puts it on the path first."""
    if _child_finds_ferry():
        return sys.executable, "-m\nferry.worker"
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.path.insert(0, %r); import ferry.worker as w; w.run()" % parent)
    return sys.executable, "-c\n" + code + C_LINE_MARK


def c_worker_command():
    """(worker_path, worker_args) for local workers of a C dataset kind
    (no Python runs in them): this interpreter without its site packages
    (-S, -s; its environment, PYTHONHOME included, as it is),
    running ferry's worker program straight from the extension module. Such
    a worker starts in some 20 ms, where ``python -m ferry.worker`` imports
    the ferry package and numpy first (150 ms here, more with a large
    site-packages), and a loader's first batch waits for its slowest
    worker. The package's folder goes on the path only after the start,
    for what the extension imports on first use (ferry._errors)."""
    name = "python -m ferry.worker"  # as its messages name it (worker.py)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "; ".join([  # one line: worker_args is one argument per line
        "import importlib.util as u, os, sys",
        "s = u.spec_from_file_location('ferry._ferry', %r)" % os.path.abspath(_ferry.__file__),
        "m = u.module_from_spec(s)",
        "s.loader.exec_module(m)",
        "sys.modules['ferry._ferry'] = m",
        "sys.path.insert(0, %r)" % parent,
        "rc = m.worker_main([%r] + sys.argv[1:], [sys.executable, '-m', 'ferry.worker'], %r)"
        % (name, name),
        "sys.stdout.flush()",
        "sys.stderr.flush()",
        "os._exit(rc if isinstance(rc, int) else 1)"])
    return sys.executable, "-s\n-S\n-c\n" + code + C_LINE_MARK


def _import_path():
    """The trainer's import path, for workers to find the dataset's modules:
    without the interpreter's own directories and PYTHONPATH's (a worker
    has those already: it is this interpreter, with this environment) and
    without repeats, so a long PYTHONPATH does not fill the spec."""
    system = _system_dirs()
    inherited = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p}
    path = []
    for p in (os.path.abspath(p or os.getcwd()) for p in sys.path):
        if p not in system and p not in inherited and p not in path:
            path.append(p)
    return path


def _extend_path(path):
    for p in reversed(path or []):
        if p not in sys.path:
            sys.path.insert(0, p)


def spec_for(target, kwargs):
    """The ``python:`` spec naming ``target`` (a class or function defined
    at the top level of a module, or of the main script) built with
    ``kwargs`` (JSON-able)."""
    module = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None)
    if not module or not qual or "<locals>" in qual or "<lambda>" in qual:
        raise TypeError(
            "ferry.Loader: the dataset must be a class (or function) defined at the top level "
            "of a module or of the main script, so workers can import it by name; got %r"
            % (target,))
    opts = {"kwargs": dict(kwargs or {})}
    if module == "__main__":
        main_mod = sys.modules["__main__"]
        spec = getattr(main_mod, "__spec__", None)
        main = getattr(main_mod, "__file__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            module = spec.name  # python -m pkg.train: workers import pkg.train
        elif main and os.path.isfile(main):
            opts["main"] = os.path.abspath(main)
            opts["argv"] = list(sys.argv)
        else:
            raise TypeError(
                "ferry.Loader: %s is defined in an interactive session or a script read from "
                "stdin; workers import the dataset by name, so define it in a .py file (a "
                "module, or the main script)" % qual)
    opts["path"] = _import_path()

    def plain(o):  # numpy scalars and arrays in kwargs, as JSON numbers and lists
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError("%s is not JSON-able" % type(o).__name__)

    try:
        text = json.dumps(opts, separators=(",", ":"), default=plain)
    except (TypeError, ValueError) as e:
        raise TypeError("ferry.Loader: dataset_kwargs must be JSON-able (%s)" % e) from None
    spec = "python:%s:%s %s" % (module, qual, text)
    if len(spec.encode()) > SPEC_MAX:
        from ._errors import InvalidValue
        sizes = {k: len(json.dumps(opts.get(k), separators=(",", ":"), default=plain).encode())
                 for k in ("kwargs", "path", "argv")}
        raise InvalidValue(
            "ferry.Loader: the dataset spec is %d bytes (limit %d): dataset_kwargs take %d, "
            "the import path (sys.path entries not in PYTHONPATH) %d, the main script's "
            "arguments %d; pass large arguments as a file name, or put the directories in "
            "PYTHONPATH instead of sys.path" % (len(spec.encode()), SPEC_MAX, sizes["kwargs"],
                                                sizes["path"], sizes["argv"]))
    return spec


# ----------------------------------------------------------------- worker

def describe_exception(exc, limit=3839):
    """'Type: message' on the first line, then the traceback's innermost
    frames that fit in ``limit`` characters."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else "%s.%s" % (t.__module__,
                                                                         t.__qualname__)
    head = "%s: %s" % (name, exc)
    if len(head.encode("utf-8", "replace")) > limit // 2:
        head = _fit(head, limit // 2 - 3) + "..."
    # The dataset's frames, not ferry's own (a refusal has none).
    own = os.path.dirname(os.path.abspath(__file__))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.dirname(os.path.abspath(f.filename)) != own]
    if not frames:
        return _fit(head, limit)
    frames = traceback.format_list(frames)
    title = "Traceback (most recent call last):\n"
    kept = []
    room = limit - len(head.encode("utf-8", "replace")) - len(title) - 1
    for f in reversed(frames):
        size = len(f.encode("utf-8", "replace"))
        if size > room:
            break
        kept.insert(0, f)
        room -= size
    return _fit(head + "\n" + title + "".join(kept).rstrip("\n"), limit)


def _fit(text, limit):
    """text cut to at most `limit` bytes of UTF-8, on a character boundary."""
    raw = text.encode("utf-8", "replace")
    return raw[:limit].decode("utf-8", "ignore") if len(raw) > limit else text


def indices_array(raw):
    """The indices of a batch (little-endian uint64 bytes) as a read-only
    numpy array."""
    return np.frombuffer(raw, dtype=np.uint64)


def _allowed(module):
    return any(module == p or module.startswith(p + ".") for p in _policy["allow"])


_importing_main = []  # non-empty while a worker runs the trainer's main script


def refuse_loader_in_worker():
    """Raises when a worker, importing the trainer's main script, is asked
    to open a loader: the script's training code is not under
    ``if __name__ == "__main__":``, and each worker would start its own."""
    if _importing_main:
        raise RuntimeError(
            "ferry.Loader was created while a ferry worker imported the main script %s: put "
            "the training code under `if __name__ == \"__main__\":` (workers import the "
            "script to find the dataset class, as multiprocessing's spawn does)"
            % _importing_main[0])


def _import_main(main, argv):
    """The trainer's main script as a module. In the trainer itself (thread
    workers) that is __main__ as it is; in a worker process it is run as
    __mp_main__ (its ``if __name__ == "__main__":`` part does not run),
    with the trainer's sys.argv, as multiprocessing's spawn does."""
    here = sys.modules.get("__main__")
    if here is not None and os.path.abspath(getattr(here, "__file__", "") or "") == main:
        return here
    mod = sys.modules.get("__mp_main__")
    if mod is not None:
        return mod
    import runpy
    if argv:
        sys.argv[:] = argv
    mod = types.ModuleType("__mp_main__")
    _importing_main.append(main)
    try:
        mod.__dict__.update(runpy.run_path(main, run_name="__mp_main__"))
    finally:
        _importing_main.pop()
    sys.modules["__mp_main__"] = sys.modules["__main__"] = mod
    return mod


def _resolve(module, qual, opts):
    remote = _policy["remote"]
    if remote:
        hidden = [p for p in module.split(".") + qual.split(".") if p.startswith("_")]
        if hidden:
            raise PermissionError(
                "this remote worker does not serve '%s:%s': it names private parts (%s)"
                % (module, qual, ", ".join(hidden)))
        if not _allowed(module):
            raise PermissionError(
                "this remote worker does not serve module '%s' (allowed: %s; start it with "
                "--allow-module PREFIX)" % (module, ", ".join(_policy["allow"]) or "none"))
    else:
        _extend_path(opts.get("path"))
    if module == "__main__":
        if not opts.get("main"):
            raise ImportError("a dataset in __main__ needs the main script's path")
        mod = _import_main(opts["main"], opts.get("argv"))
    else:
        import importlib
        mod = importlib.import_module(module)
    obj = mod
    for part in qual.split("."):
        obj = getattr(obj, part)
    if remote:
        # Only a class or function defined where the spec says: nothing
        # reached through the module's imports (mypkg:os.system) or through
        # attributes of its objects (mypkg:instance.method).
        owner = getattr(obj, "__module__", None) or ""
        if not _allowed(owner):
            raise PermissionError(
                "this remote worker does not serve '%s:%s': it comes from module '%s', which "
                "is not allowed" % (module, qual, owner))
        if owner != module or getattr(obj, "__qualname__", None) != qual:
            raise PermissionError(
                "this remote worker does not serve '%s:%s': that is not a class or function "
                "defined by that name in that module" % (module, qual))
    return obj


def _as_field_array(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return np.frombuffer(v, dtype=np.uint8)
    return np.asarray(v)


def _fields(sample, layout, lead):
    """[(name, dtype code, item shape)] of one item (lead=False) or of a
    get_batch result of one item (lead=True)."""
    if layout == _ferry.LAYOUT_DICT:
        named = [(k, sample[k]) for k in sample]
        for k, _ in named:
            if not isinstance(k, str):
                raise TypeError("item keys must be str, got %r" % (k,))
    elif layout == _ferry.LAYOUT_TUPLE:
        named = [(str(i), v) for i, v in enumerate(sample)]
    else:
        named = [("0", sample)]
    out = []
    for name, v in named:
        if len(name.encode()) > 63:
            raise ValueError("field name '%s' is longer than 63 bytes" % name)
        a = _as_field_array(v)
        code = _DTYPES.get(a.dtype.str)
        if code is None:
            what = ("a %s" % type(v).__name__) if a.dtype == object else "dtype %s" % a.dtype
            raise TypeError("field '%s' of item 0 is %s; a field is a number, a bool, bytes or "
                            "an array of bool, int8-64, uint8-64 or float16/32/64 (native byte "
                            "order), all items alike" % (name, what))
        if lead and (a.ndim == 0 or a.shape[0] != 1):
            raise ValueError("get_batch([0], 0) returned field '%s' with shape %s: each field "
                             "needs the batch as its first dimension (here 1)"
                             % (name, a.shape))
        shape = a.shape[1:] if lead else a.shape
        out.append((name, code, tuple(int(d) for d in shape)))
    return out


def _layout(sample):
    from collections.abc import Mapping
    if isinstance(sample, Mapping):
        return _ferry.LAYOUT_DICT
    if isinstance(sample, (tuple, list)):
        return _ferry.LAYOUT_TUPLE
    return _ferry.LAYOUT_SINGLE


# ------------------------------------------------------------ datasets as objects

PICKLED = "@pickle"  # python:@pickle {"bytes": N, "sha256": HEX}: the object in the loader's memory
_payload = [None]    # the bytes of a pickled dataset, in a worker (--data-fd)
_own_objects = {}    # token -> a dataset object thread workers use as it is (own_object_spec)
_own_count = [0]
_preloaded = {}      # spec args -> what open_dataset returned, in a clean parent


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


def _reduce_shared(obj):
    """How the handoff pickles obj where it differs from pickle's own way,
    or NotImplemented: a memmap by reference to its file; a plain CPU torch
    tensor as its numpy array (whose bytes go out of band)."""
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
            return done[id(o)]
        pid = done[id(o)] = _shared.auto_encode(o)
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
    HandoffPickler(f, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return f.getvalue()


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


def pickle_dataset(obj, share_collections=True):
    """(spec, stream, buffers): a dataset object serialized once, in the
    trainer, for local workers to load (write_payload puts it in their
    memory). TypeError naming the part that cannot be pickled."""
    import hashlib
    mod = _pickler()
    buffers = []

    def out_of_band(buf):
        raw = buf.raw()
        if raw.nbytes < _OUT_OF_BAND_MIN:
            return True  # in the stream
        buffers.append(raw)
        return False

    try:
        data = _dumps(obj, out_of_band, share_collections)
    except Exception as e:  # noqa: BLE001 - pickle raises many kinds
        part = _unpicklable_part(obj, mod.dumps)
        hint = "" if mod.__name__ == "cloudpickle" else (
            "; cloudpickle (Debian: python3-cloudpickle) pickles lambdas and classes of the "
            "main script")
        raise TypeError("ferry.Loader: the dataset (a %s) cannot be pickled for the workers: "
                        "%s%s: %s%s" % (type(obj).__name__, "" if part is None else "its part ",
                                        part or "", e, hint)) from None
    digest = hashlib.sha256(data).hexdigest()
    opts = {"bytes": len(data), "sha256": digest, "path": _import_path()}
    return "python:%s %s" % (PICKLED, json.dumps(opts, separators=(",", ":"))), data, buffers


def own_object_spec(obj):
    """(spec, token) of a dataset object used as it is by thread workers in
    this process (nothing is pickled); forget_own_object(token) when the
    loader is done with it."""
    _own_count[0] += 1  # one per loader: each forgets its own
    token = "object-%x-%d" % (id(obj), _own_count[0])
    _own_objects[token] = obj
    return "python:%s %s" % (PICKLED, json.dumps({"bytes": 0, "sha256": token})), token


def forget_own_object(token):
    _own_objects.pop(token, None)


# ------------------------------------------------------------ the clean parent's origin
#
# A loader with Python process workers gets, as it is built, a fork of the
# trainer (fork_template): the "template", which forks the loader's clean
# parent whenever the loader asks (option fork_from; at the start, and
# again if the clean parent dies). So the clean parent and its workers
# are the trainer as it was then: its imported modules (torch's ~160 MiB)
# are the trainer's pages until someone writes them, nothing is imported
# again, and the objects the trainer made before the loader (a
# multiprocessing Value, Lock, Queue; a tensor in shared memory) are
# theirs too, shared as torch's forked workers share them (_inherited).
# No process starts at `import ferry`.
#
# The fork is taken whatever threads the trainer runs, as torch's
# DataLoader forks its workers: what a fork can break (a lock another
# thread held, a thread pool the child believes it has) is what torch's
# users already live with, and ferry's processes limit torch's pool to one
# thread. FERRY_CLEAN_PARENT=spawn (or the loader option fork_from=-1)
# spawns a fresh ``python -m ferry.worker --fork-server`` instead: nothing
# of the trainer's is inherited then, and a dataset holding such objects
# is refused.

def clean_parent_spawned():
    """Whether this process's loaders spawn their clean parents
    (FERRY_CLEAN_PARENT=spawn) instead of forking them from the trainer."""
    how = os.environ.get("FERRY_CLEAN_PARENT", "fork").strip().lower()
    return how == "spawn"


def threads_running():
    """Threads of this process (1 when /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


class Template:
    """A fork of the trainer that forks a loader's clean parent on request
    (its control socket is the loader's option fork_from). It lives as
    long as the loader and dies with the trainer (PR_SET_PDEATHSIG)."""

    __slots__ = ("pid", "pidfd", "sock", "owner", "threads")

    def __init__(self, pid, pidfd, sock, threads):
        self.pid, self.pidfd, self.sock, self.owner, self.threads = \
            pid, pidfd, sock, os.getpid(), threads

    def fileno(self):
        return self.sock.fileno()

    def forget(self):
        """In a child forked from the trainer: the socket is not its own."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def close(self):
        """Killed and reaped (in the process that forked it); twice is fine."""
        if self.owner != os.getpid():
            self.forget()
            return
        pidfd, self.pidfd = self.pidfd, None
        self.forget()
        if pidfd is None and self.pid is None:
            return
        import signal
        pid, self.pid = self.pid, None
        try:
            if pidfd is not None:
                # By pidfd: a trainer that reaps every child may have
                # reaped it already, and its pid be another process's now.
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            if pidfd is not None:
                os.close(pidfd)
        try:
            while True:
                try:
                    os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
        except ChildProcessError:  # reaped by the trainer's own handler
            pass


def fork_template():
    """A new Template, forked from this process now, or None when clean
    parents are spawned here (clean_parent_spawned) or the fork fails (the
    loader then spawns its clean parent)."""
    if clean_parent_spawned():
        return None
    import socket
    threads = threads_running()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    trainer = os.getpid()

    def fork():
        # What the trainer printed and has not flushed yet would be in the
        # fork's buffers too, and said twice (as multiprocessing's fork
        # start, torch's workers', flushes first).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:  # on whichever thread forked: the child's only one
            ours.close()
            _run_template(theirs, trainer)  # never returns
        return pid
    try:
        pid = _on_a_lasting_thread(fork)
    except OSError:
        ours.close()
        theirs.close()
        return None
    theirs.close()
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    return Template(pid, pidfd, ours, threads)


_forker = {}  # {"pid": owner, "queue": ...}: the thread that forks off the main thread


def _on_a_lasting_thread(fn):
    """fn() run on this process's main thread (when called there) or on a
    daemon thread of ferry's that lasts as long as the process: a fork's
    PR_SET_PDEATHSIG fires when the *thread* that forked it ends, and a
    loader built on a short-lived thread (a helper, a thread pool) must not
    lose its template, its clean parent and its workers with it."""
    import threading
    if threading.current_thread() is threading.main_thread():
        return fn()
    if _forker.get("pid") != os.getpid():
        import queue

        def serve(jobs):
            while True:
                job, box, done = jobs.get()
                try:
                    box.append((True, job()))
                except BaseException as e:  # noqa: BLE001 - raised in the caller
                    box.append((False, e))
                done.set()
        jobs = queue.SimpleQueue()
        threading.Thread(target=serve, args=(jobs,), name="ferry-fork", daemon=True).start()
        _forker.update(pid=os.getpid(), queue=jobs)
    box, done = [], threading.Event()
    _forker["queue"].put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if ok:
        return value
    raise value


def _run_template(sock, trainer):
    """In the fork: made a process of ferry's, then the fork-server loop
    without a dataset (ferry.worker.fork_server), until the loader (or the
    trainer) goes; never returns, never runs the trainer's exit handlers."""
    rc = 1
    try:
        import gc
        # The trainer's objects, shared with it page for page, out of the
        # collector's reach: a collection here or in a clean parent would
        # write to every one of them (their pages copied).
        gc.freeze()
        become_ferry_process()
        set_name("ferry-template")
        from . import worker
        rc = worker.fork_server(["--control-fd", str(sock.detach()), "--parent", str(trainer)])
    except BaseException:  # noqa: BLE001 - said on stderr, then the exit code
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 1)


def become_ferry_process():
    """A fork of the trainer made one of ferry's processes, as a spawned
    one starts: the trainer's signal handlers back to their defaults
    (Ctrl-C ignored: the trainer handles it, see
    _startup.leave_ctrl_c_to_the_trainer), no signal blocked, no wakeup
    fd, the thread limits in the environment for what it starts, and
    multiprocessing told it is in a child (its after-fork resets, as in
    a child it forks itself)."""
    import signal
    from . import _startup
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if callable(handler) or sig == signal.SIGCHLD:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (ValueError, OSError):
                pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    _startup.limit_threads()
    after_fork_in_child()


def after_fork_in_child():
    """multiprocessing told that this process is a fork, as a child it
    forks itself is (when the trainer imported it): its finalizers are
    the parent's, and its objects reset their per-process state (a
    Queue's feeder thread, which the fork did not copy, starts anew)."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        try:
            util._finalizer_registry.clear()
            util._run_after_forkers()
        except Exception:  # noqa: BLE001 - a multiprocessing without them
            pass


def set_name(name):
    """The process's name (``ps -o comm``, /proc/PID/comm): a fork keeps the
    trainer's command line, so this is what tells ferry's processes apart."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def set_payload(payload):
    """The pickled dataset as this worker was given it (read_payload)."""
    _payload[0] = payload


def _load_pickled(opts):
    want, digest = opts.get("bytes"), opts.get("sha256")
    obj = _own_objects.get(digest)
    if obj is not None:  # the trainer's own (thread workers): the object itself
        return obj
    if _policy["remote"]:
        raise PermissionError("a remote worker never unpickles what the network sent: pass the "
                              "dataset by name, ferry.Loader(MyDataset, dataset_kwargs={...})")
    payload, _payload[0] = _payload[0], None  # the bytes go once unpickled
    if payload is None:
        raise ValueError("the dataset was pickled by the trainer, but this worker was given no "
                         "bytes (--data-fd)")
    data, buffers = payload
    import hashlib
    if len(data) != want or hashlib.sha256(data).hexdigest() != digest:
        raise ValueError("the pickled dataset this worker was given (%d bytes) is not the one "
                         "its loader names (%s bytes)" % (len(data), want))
    import io
    import pickle
    _extend_path(opts.get("path"))  # where the classes it names are imported from
    u = pickle.Unpickler(io.BytesIO(data), buffers=buffers)
    u.persistent_load = _shared.Decoder()  # the big lists and dicts (_dumps)
    return u.load()


def forget_first_items():
    """In a clean parent that has forked the loader's workers: the item 0
    each kept from the open goes (they have their copies); a worker forked
    later, a replacement, builds it again if it is asked for it."""
    for args, opened in list(_preloaded.items()):
        if isinstance(opened, BaseException):  # a failure kept for the workers
            continue
        _preloaded[args] = opened[:-1] + (None,)
        fills = opened[2] == _ferry.LAYOUT_FILL
        forget = getattr(opened[0], "__ferry_forget_first__", None) if fills else None
        if callable(forget):  # ferry.torch's form keeps its own (_Batches._probe_item)
            forget()


def has_preloaded():
    """Whether this process is (a fork of) a clean parent that opened its
    dataset already."""
    return bool(_preloaded)


def preload(args):
    """In a clean parent: opens the dataset once, for the workers forked
    from it. A failure is left for each worker to meet and report as its
    own open error, except one that says it is the same for every worker
    (``_ferry_replay``: ferry.torch's item 0 past the DataLoader's timeout),
    which each worker raises again at once instead of meeting it anew."""
    try:
        _preloaded[args] = open_dataset(args)
    except BaseException as e:  # noqa: BLE001 - reported by the workers
        if getattr(e, "_ferry_replay", False):
            _preloaded[args] = e


# ------------------------------------------------------------ item 0, built once

_info_asked = [0]  # worker_info() calls so far in this process


def _global_rngs():
    """The state of the generators an item could draw from without saying
    so: random's, numpy's legacy one, torch's (when imported)."""
    import random
    legacy = np.random.get_state()
    states = [random.getstate(), legacy[0], legacy[1].tobytes()] + list(legacy[2:])
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            states.append(bytes(torch.random.get_rng_state().numpy()))
        except Exception:  # noqa: BLE001 - a torch without it: nothing to compare
            pass
    return states


class FirstItem:
    """Item 0 (or ``get_batch([0], 0)``'s result) as the open built it to
    learn the schema, kept to serve the worker's first batch when that
    batch starts with index 0 (and is that very call, for get_batch).

    Kept only where the task would build the same thing (see
    :func:`reusable`): the build drew nothing from the global generators
    (random, numpy's legacy one, torch's), and either asked nothing of
    worker_info(), or asked it inside a worker, whose (worker, workers,
    seed, epoch) the task must then match; nothing else has been built
    before it in the worker (it serves the first item of the first batch
    only). Per-sample randomness from ``worker_info().rng(i)`` is a
    function of (seed, epoch, index), so such an item is the task's.
    An item that draws fresh entropy (an unseeded Generator, the clock)
    differs between any two builds; the kept one is one such build.

    ferry.torch's datasets (which fill the batch themselves) keep none:
    each worker seeds torch's, numpy's and random's generators (seed +
    worker id) and runs worker_init_fn before its first item, while the
    fields were probed before any of that, in the clean parent."""

    __slots__ = ("item", "context", "batch")

    def __init__(self, item, context, batch):
        self.item, self.context, self.batch = item, context, batch


def _probe(ds, gb, asked_before):
    """(sample, FirstItem or None): item 0 built for the schema."""
    rngs = _global_rngs()
    sample = gb(indices_array(b"\0" * 8), 0) if gb else ds[0]
    context = "any"
    if _info_asked[0] != asked_before:  # the dataset asked who builds it, opening or building
        context = _ferry.worker_state()  # None outside a worker: a task's differs
    if context is None or _global_rngs() != rngs:
        return sample, None
    return sample, FirstItem(sample, context, gb is not None)


def reusable(first, indices, epoch):
    """The item to serve the worker's first batch (``indices``, ``epoch``)
    from, or None: first.item when the batch starts with index 0 and
    nothing it could depend on differs from when it was built. Called by
    the python dataset kind (pydataset.c) once, at the first batch."""
    if first is None or len(indices) == 0 or int(indices[0]) != 0:
        return None
    if first.batch and (len(indices) != 1 or epoch != 0):
        return None  # get_batch([0], 0) is what was called
    if first.context != "any":
        now = _ferry.worker_state()  # this batch's (worker, workers, seed, epoch)
        if now is None or tuple(now[:3]) != tuple(first.context[:3]) or \
                epoch != first.context[3]:
            return None
    return first.item


def _describe(ds, asked_before):
    """(length, layout, fields, get_batch or None, FirstItem or None) of an
    opened dataset; asked_before: _info_asked before it was opened."""
    n = len(ds)
    if n <= 0:
        raise ValueError("the dataset (a %s) has no items (len %d)" % (type(ds).__name__, n))
    fields = getattr(ds, "__ferry_fields__", None)
    if callable(fields):  # ferry.torch's form: it fills the batch itself (layout 3)
        return n, _ferry.LAYOUT_FILL, list(fields()), ds.__ferry_fill__, None
    gb = getattr(ds, "get_batch", None)
    gb = gb if callable(gb) else None
    sample, first = _probe(ds, gb, asked_before)
    layout = _layout(sample)
    return n, layout, _fields(sample, layout, gb is not None), gb, first


def open_dataset(args):
    """Opens ``MODULE:QUALNAME [JSON]`` (or a pickled object): (dataset,
    length, layout, fields, get_batch or None, FirstItem or None). Raises
    with a message naming what is wrong."""
    if args in _preloaded:
        opened = _preloaded[args]
        if isinstance(opened, BaseException):  # preload's, the same for every worker
            raise opened
        return opened
    asked = _info_asked[0]
    if args.startswith(PICKLED):
        ds = _load_pickled(json.loads(args[len(PICKLED):]))
        return (ds,) + _describe(ds, asked)
    m = _SPEC.match(args)
    if not m:
        raise ValueError("a python dataset spec reads 'python:MODULE:NAME [JSON]', got %r"
                         % args[:200])
    module, qual, rest = m.groups()
    opts = json.loads(rest) if rest.strip() else {}
    if not isinstance(opts, dict) or set(opts) - {"kwargs", "path", "main", "argv"}:
        raise ValueError("the JSON after a python dataset's name is an object with keys "
                         "kwargs, path, main and argv")
    kwargs = opts.get("kwargs") or {}
    target = _resolve(module, qual, opts)
    ds = target(**kwargs) if callable(target) and (isinstance(target, type) or kwargs or
                                                   not hasattr(target, "__getitem__")) \
        else target
    return (ds,) + _describe(ds, asked)


# ------------------------------------------------------------ worker_info

class WorkerInfo:
    """What a dataset running in a ferry worker may ask: ``id`` (the
    worker's index), ``num_workers``, ``seed`` (the loader's), ``epoch``
    (of the batch being built), and :meth:`rng`."""

    __slots__ = ("id", "num_workers", "seed", "epoch")

    def __init__(self, wid, num_workers, seed, epoch):
        self.id, self.num_workers, self.seed, self.epoch = wid, num_workers, seed, epoch

    def sample_seed(self, index):
        """The seed of sample ``index`` in this epoch: a function of (seed,
        epoch, index) only, whatever the worker count."""
        return _ferry.sample_seed(self.seed, self.epoch, int(index))

    def rng(self, index):
        """A numpy Generator for sample ``index`` in this epoch, the same
        whichever worker builds it: augmentations are reproducible."""
        return np.random.default_rng(self.sample_seed(index))

    def __repr__(self):
        return "WorkerInfo(id=%d, num_workers=%d, seed=%d, epoch=%d)" % (
            self.id, self.num_workers, self.seed, self.epoch)


def worker_info():
    """The :class:`WorkerInfo` of the worker running this code, or None in
    the trainer."""
    _info_asked[0] += 1  # an item built meanwhile may depend on the answer (FirstItem)
    st = _ferry.worker_state()
    return WorkerInfo(*st) if st else None
