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

A dataset object is pickled once in the trainer instead (pickle_dataset,
with _handoff.py's reductions) and unpickled once by the loader's clean
parent, which is a fork of the trainer made as the loader is built
(_template.py): its arrays are lent, not copied, and what only a fork can
share, such as a multiprocessing Value or Lock, travels as a token to the
object the fork inherited.

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
from ._handoff import _OUT_OF_BAND_MIN, _dumps, _pickler, _unpicklable_part
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
    _probe_apart[0] = True
    try:
        _preloaded[args] = open_dataset(args)
    except BaseException as e:  # noqa: BLE001 - reported by the workers
        if getattr(e, "_ferry_replay", False):
            _preloaded[args] = e
    finally:
        _probe_apart[0] = False


# Item 0 is built to learn a batch's fields before the workers exist. Built
# in the clean parent itself, whatever building it did to the dataset would
# be every worker's: a file opened lazily in __getitem__ (the h5py, LMDB,
# open-on-first-read pattern) shared by all of them, one file offset for
# all, each reading another's bytes; a counter already counting. torch's
# workers never see an item built in the trainer. So in a clean parent the
# probe runs in a fork of it that is thrown away, and only what it learnt
# comes back.
_probe_apart = [False]


def probed(fn, lighter=None):
    """fn() (a probe of item 0): in a clean parent opening its dataset, run
    in a throwaway fork of it and its result returned here (pickled; when
    it cannot be, lighter(result) is tried: the result without the item
    kept for the first batch); its exception raised here. Elsewhere (a
    worker, the trainer with thread workers, whose dataset is what the
    items are built from anyway) run here."""
    if not _probe_apart[0]:
        return fn()
    import pickle
    r, w = os.pipe()
    me = os.getpid()
    try:
        pid = _ferry.fork_child()  # (a clean parent runs no thread)
    except OSError:
        os.close(r)
        os.close(w)
        return fn()
    if pid == 0:
        try:
            _ferry.tie_to_parent(me)  # killed with the clean parent
            os.close(r)
            try:
                out = (True, fn())
            except BaseException as e:  # noqa: BLE001 - raised in the clean parent
                out = (False, e)
            try:
                data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as e:  # noqa: BLE001 - what cannot travel, said
                try:
                    if not out[0] or lighter is None:
                        raise
                    data = pickle.dumps((True, lighter(out[1])),
                                        protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException:  # noqa: BLE001
                    data = pickle.dumps((False, RuntimeError(
                        "ferry: item 0, built to learn the batch's fields, could not be "
                        "sent back from the probe: %s: %s" % (type(e).__name__, e))))
            for stream in (sys.stdout, sys.stderr):  # what item 0 printed
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001
                    pass
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    try:
        while True:
            b = os.read(r, 1 << 20)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(r)
        try:
            os.waitpid(pid, 0)  # (retried on EINTR by Python itself)
        except ChildProcessError:  # reaped by the trainer's own handler
            pass
    if not chunks:
        raise RuntimeError("ferry: the fork that built item 0 to learn the batch's fields "
                           "died before it answered")
    ok, value = pickle.loads(b"".join(chunks))
    if ok:
        return value
    raise value


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
    state = shallow_state(ds)
    sample = gb(indices_array(b"\0" * 8), 0) if gb else ds[0]
    context = "any"
    if _info_asked[0] != asked_before:  # the dataset asked who builds it, opening or building
        context = _ferry.worker_state()  # None outside a worker: a task's differs
    if context is None or _global_rngs() != rngs or shallow_state(ds) != state:
        return sample, None
    return sample, FirstItem(sample, context, gb is not None)


def shallow_state(obj, depth=2):
    """What building an item may change in a dataset, cheaply: each
    attribute's identity and length, and the same of the attributes'
    own, ``depth`` levels down. An item that changed it (a counter, a file
    opened at the first item, a cache that grew) is not kept for the first
    batch: the worker builds it itself, from the dataset as it got it, as
    torch's worker would. (A change in place that keeps lengths is not
    seen.)"""
    out = []
    todo = [(obj, depth)]
    seen = set()
    while todo:
        o, d = todo.pop()
        attrs = getattr(o, "__dict__", None)
        if not isinstance(attrs, dict) or id(o) in seen:
            continue
        seen.add(id(o))
        for k, v in list(attrs.items()):
            try:
                n = len(v) if isinstance(v, (list, dict, set, bytearray)) else None
            except Exception:  # noqa: BLE001
                n = None
            out.append((id(o), k, id(v), n))
            if d > 1:
                todo.append((v, d - 1))
    return out


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

    def probe():
        sample, first = _probe(ds, gb, asked_before)
        layout = _layout(sample)
        return layout, _fields(sample, layout, gb is not None), first
    layout, fields, first = probed(probe, lambda out: out[:2] + (None,))
    return n, layout, fields, gb, first


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
