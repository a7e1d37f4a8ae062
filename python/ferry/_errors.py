"""ferry's exceptions: one class per kind of failure, built from the C code.

Every exception ferry raises is a ``ferry.Error``; those that mean a wrong
argument also subclass the built-in the user would expect (``TypeError`` for
an unknown option, ``ValueError`` for a bad value, ``TimeoutError``).
``ferry._ferry`` calls :func:`make` with the C code and ``ferry_last_error()``.
"""

import builtins
import re
import sys

from . import _ferry


class Error(Exception):
    """A ferry failure. ``code`` is the C code (``ferry._ferry.FERRY_E...``),
    ``name`` its name ("FERRY_EBATCH"), ``detail`` the C library's sentence."""

    def __init__(self, detail, code=None):
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.name = _ferry.strerror(code)[0] if code is not None else None


class OptionError(Error, TypeError):
    """An option ferry does not have (the name is in the message)."""


class InvalidValue(Error, ValueError):
    """An option or argument with a value ferry cannot take."""


class DatasetError(Error, RuntimeError):
    """The dataset could not be opened: missing or malformed file, a Python
    dataset that failed to import or build, a module a remote worker does
    not allow. A ``RuntimeError``, as torch's DataLoader raises for a
    worker that fails to start."""


class BatchError(Error):
    """One batch could not be had; the next call goes on with the next one.

    Attributes (None when the C message did not say): ``worker`` (its
    index), ``index`` (the first failing sample index), ``epoch``,
    ``batch_in_epoch``, ``exc_type`` and ``exc_message`` (the dataset's own
    exception, for a Python dataset), ``traceback`` (the worker's traceback
    text, its innermost frames).
    """

    _FORMAT = re.compile(
        r"^(?P<who>.*?) failed on index (?P<index>\d+) \(epoch (?P<epoch>\d+), "
        r"batch (?P<batch>\d+)\): (?P<rest>.*)$", re.S)
    # A batch as a whole: given up after worker deaths, or too large to send.
    _WHOLE = re.compile(r"batch (?P<seq>\d+) \(epoch (?P<epoch>\d+), batch (?P<batch>\d+)[;)]")
    _EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ?(?P<msg>.*)$", re.S)
    _TB = "\nTraceback (most recent call last):\n"

    def __init__(self, detail, code=None):
        super().__init__(detail, code)
        self.worker = self.index = self.epoch = self.batch_in_epoch = None
        self.exc_type = self.exc_message = self.traceback = None
        m = self._FORMAT.match(detail)
        if not m:
            w = self._WHOLE.search(detail)
            if w:
                self.epoch, self.batch_in_epoch = int(w["epoch"]), int(w["batch"])
            return
        w = re.search(r"worker (\d+)", m["who"])
        self.worker = int(w[1]) if w else None
        self.index, self.epoch = int(m["index"]), int(m["epoch"])
        self.batch_in_epoch = int(m["batch"])
        head, sep, tb = m["rest"].partition(self._TB)
        e = self._EXC.match(head)
        if e and sep:
            self.exc_type, self.exc_message = e["type"], e["msg"]
            self.traceback = sep.lstrip("\n") + tb


class IndexOutOfRange(BatchError, IndexError):
    """A batch with an index the dataset does not have (an ``IndexError``
    from a Python dataset, or a C dataset's FERRY_ERANGE)."""


class _Death:
    """The fields of a worker's death in a message: ``worker``, ``pid``,
    ``signal`` ("SIGKILL") or ``exit_code``, and ``last_words`` (what it
    wrote to stderr last), None where the message does not say them."""

    _DEATH = re.compile(r"worker (?P<worker>\d+) \(pid (?P<pid>\d+)\) (?P<how>[^;]*)")

    def _read_death(self, detail):
        self.worker = self.pid = self.signal = self.exit_code = self.last_words = None
        m = self._DEATH.search(detail)
        if m:
            self.worker, self.pid = int(m["worker"]), int(m["pid"])
            s = re.search(r"signal (SIG[A-Z0-9]+)", m["how"])
            c = re.search(r"exited with code (\d+)", m["how"])
            self.signal = s[1] if s else None
            self.exit_code = int(c[1]) if c else None
        words = detail.partition("; its last words: ")[2]
        self.last_words = words or None

    def torch_sentence(self):
        """What torch's DataLoader says of this death ("DataLoader worker
        (pid 42) is killed by signal: Segmentation fault."), for scripts
        and tests that match it; "" when the message names no pid."""
        if self.pid is None:
            return ""
        if self.signal:
            import signal as _signal
            try:
                what = _signal.strsignal(getattr(_signal, self.signal)) or self.signal
            except (AttributeError, ValueError):
                what = self.signal
            return "DataLoader worker (pid %d) is killed by signal: %s." % (self.pid, what)
        return "DataLoader worker (pid(s) %d) exited unexpectedly." % self.pid


class WorkerError(_Death, Error, RuntimeError):
    """A worker died and the loader cannot go on (``on_worker_failure="fail"``,
    or one that keeps dying). ``pid``, ``signal`` ("SIGKILL") or
    ``exit_code``, and ``last_words`` (what it wrote to stderr last) when the
    message says them. A ``RuntimeError``, as torch's DataLoader raises for
    a dead worker (``except RuntimeError`` catches both)."""

    def __init__(self, detail, code=None):
        super().__init__(detail, code)
        self._read_death(detail)


class BatchLost(_Death, BatchError, RuntimeError):
    """A batch given up after the workers that built it died on it, one
    after another (a dataset that crashes its process on some item): the
    loader goes on with the next batch. A ``RuntimeError``, as torch's
    DataLoader raises for a dead worker; ``worker``, ``pid``, ``signal``,
    ``exit_code`` and ``last_words`` are the last death's."""

    def __init__(self, detail, code=None):
        super().__init__(detail, code)
        index = self.index
        self._read_death(detail.partition("; the last: ")[2] or detail)
        self.index = index


class SpawnError(Error):
    """A worker process could not be started."""


class Timeout(Error, TimeoutError):
    """A deadline passed: a batch past ``timeout`` (under
    ``on_worker_failure="fail"``, or with thread workers, which cannot be
    killed: the loader cannot go on), or workers not ready by
    ``start_timeout_ms``."""


class NotReady(Timeout):
    """``next(timeout=...)`` found no batch ready in time. Nothing changed:
    call again."""


class StateError(Error, ValueError):
    """A resume state that is invalid or does not match the loader."""


class LimitError(Error):
    """A limit was reached: ``max_held`` batches alive, file descriptors,
    processes, a buffer too small."""


class Closed(Error):
    """The loader has failed before and can only be closed."""


_CLASSES = {
    "FERRY_EOPTION": OptionError,
    "FERRY_EINVAL": InvalidValue,
    "FERRY_EDATASET": DatasetError,
    "FERRY_EFORMAT": DatasetError,
    "FERRY_EMISMATCH": DatasetError,
    "FERRY_EBATCH": BatchError,
    "FERRY_ERANGE": IndexOutOfRange,
    "FERRY_EWORKER": WorkerError,
    "FERRY_ESPAWN": SpawnError,
    "FERRY_ETIMEDOUT": Timeout,
    "FERRY_EAGAIN": NotReady,
    "FERRY_ESTATE": StateError,
    "FERRY_ECLOSED": Closed,
    "FERRY_ELIMIT": LimitError,
}


# The built-in exception types a dataset's exception may be, by name.
_BUILTIN = {n: c for n, c in vars(builtins).items()
            if isinstance(c, type) and issubclass(c, Exception)}
_BOTH = {}  # (ferry class, built-in class) -> the class that is both


def _reduce_both(self):
    """Pickles an exception of a class _both made (which no module holds
    by name) as its two classes, its detail and its attributes: it crosses
    to another process as it is (multiprocessing sends a child's exception
    to its parent so; torch's test harness does)."""
    cls, base = type(self).__bases__
    return _rebuild_both, (cls, base, self.detail), dict(self.__dict__)


def _rebuild_both(cls, base, detail):
    """The unpickling side of _reduce_both (pickle then sets __dict__)."""
    both = _both(cls, base)
    if both is None:  # cannot happen where it was made; a plain one then
        return cls(detail)
    out = both.__new__(both, detail)
    out.args = (detail,)
    return out


def _both(cls, base):
    """A class that is both ferry's `cls` and the built-in `base`, or None
    when Python cannot make one."""
    key = (cls, base)
    if key not in _BOTH:
        try:
            _BOTH[key] = type(base.__name__, (cls, base), {
                "__module__": "ferry", "__qualname__": "%s[%s]" % (cls.__name__, base.__name__),
                "__str__": lambda self: self.detail,
                "__reduce__": _reduce_both,
                "__doc__": "A ferry.%s raised by a dataset's %s." % (cls.__name__,
                                                                      base.__name__)})
        except Exception:  # noqa: BLE001 - a layout conflict, a base that refuses
            _BOTH[key] = None
    return _BOTH[key]


def _as_both(e, cls, base, detail):
    """`e` (a ferry `cls` made from `detail`) as an instance of the class
    that is both `cls` and `base`, or None when that class cannot be made or
    instantiated: MemoryError's __new__ refuses a subclass ("not safe"),
    ExceptionGroup's needs its exceptions. Never raises."""
    both = _both(cls, base)
    if both is None:
        return None
    try:
        out = both.__new__(both, detail)
        out.__dict__.update(e.__dict__)
        out.args = (detail,)
        if isinstance(out, SyntaxError):
            # The traceback module prints a SyntaxError's msg (never made:
            # __init__ is not called), not its str(): without it a trainer
            # dying on the batch would print "<no detail available>".
            out.msg = detail
        return out
    except Exception:  # noqa: BLE001 - the plain ferry error says it all
        _BOTH[(cls, base)] = None
        return None


def make(code, detail):
    """The exception for C code ``code`` with ``detail``. A batch a Python
    dataset failed with a built-in exception (OSError, KeyError, ...) is
    both a ferry.BatchError and that exception: ``except OSError`` catches
    it as it would in torch's DataLoader; so is a subclass of one whose
    class is imported in this process (PIL.UnidentifiedImageError, an
    OSError). Where no class can be both (MemoryError, ExceptionGroup), a
    plain ferry.BatchError."""
    name = _ferry.strerror(code)[0]
    if code == _ferry.FERRY_ENOMEM:
        return MemoryError(detail)
    cls = _CLASSES.get(name, Error)
    detail = detail or _ferry.strerror(code)[1]
    if cls is BatchError and re.search(r"was given up after \d+ workers? died", detail):
        cls = BatchLost
    e = cls(detail, code)
    if not isinstance(e, BatchError) or not e.exc_type:
        return e
    base = _BUILTIN.get(e.exc_type) or _imported_class(e.exc_type)
    if base is None or isinstance(e, base):
        return e
    # Where no class can be both, the plain ferry error: its message starts
    # with the dataset's "Type: message", and it keeps worker, index,
    # exc_type, exc_message and traceback.
    out = _as_both(e, cls, base, detail)
    if out is None and base not in _BUILTIN.values():
        # a class of the dataset's that refuses: its nearest built-in base
        builtin = next((c for c in base.__mro__ if c in _BUILTIN.values()), None)
        if builtin is not None and not isinstance(e, builtin):
            out = _as_both(e, cls, builtin, detail)
    return e if out is None else out


def _imported_class(name):
    """The exception class a dataset's exception type name (``module.
    Qualname``, as describe_exception writes it) names in this process, if
    its module is imported here already (nothing is imported for it): a
    PIL.UnidentifiedImageError is then caught by ``except OSError`` and by
    ``except PIL.UnidentifiedImageError``, as with torch's DataLoader."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:k]))
        if mod is None:
            continue
        obj = mod
        for attr in parts[k:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type) and issubclass(obj, Exception):
            return obj
        return None
    return None
