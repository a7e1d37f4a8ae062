"""ferry: a data loader for machine-learning training, with persistent
worker processes, prefetch that runs across epoch boundaries, and batches
handed to you as numpy arrays without a copy.

    import ferry
    loader = ferry.Loader("npy:x=train_x.npy,y=train_y.npy", batch_size=256,
                          workers=4, prefetch=8, shuffle=True, seed=0)
    for epoch in range(10):
        for batch in loader:                  # one epoch
            x, y = batch["x"], batch["y"]     # numpy arrays, no copy

A dataset written in Python is named, not pickled: ``ferry.Loader(MyDataset,
dataset_kwargs={...})`` runs ``MyDataset(**dataset_kwargs)`` in each worker
(``python -m ferry.worker``) and calls ``__getitem__`` (or ``get_batch``).
A dataset object is pickled once for them. Importing ferry starts no
process: a loader with Python workers forks the trainer as it is built,
and its workers are forks of that fork (docs/python.md, "Workers: the
clean parent"). See docs/python.md for the whole guide.
"""

import atexit
import base64
import logging
import math
import numbers
import os
import sys
import time
import weakref
from collections.abc import Mapping

from . import _startup

# In a process of ferry's own (a worker, a clean parent), the numeric
# libraries' pools are limited before numpy loads: a pip wheel's OpenBLAS
# starts a thread per core at load, and a clean parent must have none
# when it forks.
if _startup.is_ferry_process():
    _startup.limit_threads()
    _startup.leave_ctrl_c_to_the_trainer()

import numpy as np  # noqa: E402 - after the limit above

try:
    from . import _ferry
except ImportError as e:
    # Python's own message ("partially initialized module ... circular
    # import", "undefined symbol") names neither the cause nor the fix.
    raise ImportError(
        "ferry: the C extension ferry._ferry cannot be imported by this interpreter (%s): %s. "
        "It is built for one interpreter, into build/python: run `tools/setup.sh build` and "
        "use PYTHONPATH=build/python (not the source tree's python/), or build it for this "
        "interpreter with `PYTHON=%s tools/setup.sh build`"
        % (sys.executable, e, sys.executable), name="ferry._ferry") from e
from . import _dataset, _handoff, _profile, _template
from ._dataset import WorkerInfo, spec_for, worker_command, worker_info
from ._shared import SharedDict, SharedList, shared
from ._mix import Mix
from ._batch import Batch, _FieldBatch, _positional, _TupleBatch
from ._iterate import _Epoch, _Stream
from ._process import WorkerProcess
from . import _errors
from ._errors import (BatchError, BatchLost, Closed, DatasetError, Error, IndexOutOfRange,
                      InvalidValue, LimitError, NotReady, OptionError, SpawnError, StateError,
                      Timeout, WorkerError)

__version__ = _ferry.version()

def __getattr__(name):
    """``ferry.BatchError[OSError]`` and the like, by the name they print:
    the classes that are both one of ferry's errors and a built-in
    exception (made as needed, _errors._both). pickle finds a class by
    that name, so such an exception and its class cross to another process
    (multiprocessing sends a child's exception to its parent; torch's
    ExceptionWrapper sends the class)."""
    cls, _, rest = name.partition("[")
    base = _errors._BUILTIN.get(rest[:-1]) if rest.endswith("]") else None
    ours = globals().get(cls)
    if base is not None and isinstance(ours, type) and issubclass(ours, Error):
        both = _errors._both(ours, base)
        if both is not None:
            return both
    raise AttributeError("module 'ferry' has no attribute %r" % (name,))


__all__ = [
    "Loader", "Batch", "WorkerInfo", "worker_info", "Error", "OptionError", "InvalidValue",
    "DatasetError", "BatchError", "BatchLost", "IndexOutOfRange", "WorkerError", "SpawnError", "Timeout",
    "StateError", "Closed", "LimitError", "NotReady", "SharedList", "SharedDict", "shared",
    "Mix", "WorkerProcess", "__version__",
]

# Old names of options, accepted until the next release with a warning
# that names the one name each option has now (the C library's).
_RENAMED = {
    "world": "world_size",
    "placement": "worker_mode",
    "on_worker_death": "on_worker_failure",
}


_open_loaders = weakref.WeakSet()

_logger = logging.getLogger("ferry")


def _state_dict(blob):
    """state_dict()'s form of the C blob: text, so JSON keeps it too."""
    return {"ferry": base64.b64encode(blob).decode("ascii")}


def _state_blob(state):
    """The C blob of a resume state: a state_dict() (its "ferry" text, or
    the bytes older ferry put there), the blob itself, or a list of every
    rank's states, which must agree (any one of them then does)."""
    if isinstance(state, (list, tuple)):
        if not state:
            raise StateError("ferry.Loader: state is an empty list")
        blobs = [_state_blob(one) for one in state]
        _ferry.state_check(blobs)
        return blobs[0]
    blob = state.get("ferry") if isinstance(state, Mapping) else state
    if isinstance(blob, str):
        try:
            blob = base64.b64decode(blob.encode("ascii"), validate=True)
        except ValueError:  # binascii.Error, and UnicodeEncodeError
            raise StateError("ferry.Loader: the state's text is not what state_dict() "
                             "wrote") from None
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise StateError("ferry.Loader: state must be what state_dict() returned (or a "
                         "list of every rank's)")
    return bytes(blob)


def _to_logging(level, message):
    """The default log sink: the "ferry" logger (ferry's levels are logging's)."""
    _logger.log(level, "%s", message)


def _forget_in_child():
    """In a child forked while loaders are open (multiprocessing, a fork
    DataLoader): the pickled datasets' memfds are the trainer's, not its;
    closed here so that the child does not keep their memory (the C side
    does the same for the batch slots)."""
    for ld in list(_open_loaders):
        if ld._data_fd is not None:
            try:
                os.close(ld._data_fd)
            except OSError:
                pass
            ld._data_fd = None
        if ld._template is not None:  # the trainer's, not the child's
            ld._template.forget()
            ld._template = None


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _close_all():
    # A loader still open at exit (an exception ended the script, Ctrl-C)
    # stops its workers now, not from a finaliser that may never run.
    for ld in list(_open_loaders):
        try:
            ld.close()
        except Exception:
            pass


def _flag(value):
    """A bool option's value as the C library reads it."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _option_text(key, value):
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, str):
        return value
    raise TypeError("ferry.Loader: option %s must be a bool, int or str, not %s"
                    % (key, type(value).__name__))


_MAX_MS = 2**63 - 1  # what the C side takes (int64 milliseconds)


def _seconds(what, value):
    """A finite number of seconds >= 0 as whole ms (at least 1 when
    positive; None for infinity), or raise naming `what`: InvalidValue
    for one out of range, not OverflowError from the C call."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number of seconds, not %s" % (what, type(value).__name__))
    if math.isnan(value) or value < 0:
        raise InvalidValue("%s must be >= 0 seconds, got %r" % (what, value))
    if math.isinf(value):
        return None
    ms = max(1, int(round(value * 1000))) if value > 0 else 0
    if ms > _MAX_MS:
        raise InvalidValue("%s must be at most %d seconds (or None), got %r"
                           % (what, _MAX_MS // 1000, value))
    return ms


def _pss_kb(pid):
    """Process pid's PSS in kB (/proc/PID/smaps_rollup), None if gone."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _descendants(root):
    """Pids of the live processes below root."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        kids = [c for c, pp in parent.items() if pp == todo[-1]]
        todo.pop()
        out += kids
        todo += kids
    return out


class _Closes:
    """close() at the end of a ``with`` and when collected."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Loader(_Closes):
    """A ferry loader: persistent workers, a prefetch window that runs across
    epoch boundaries, batches as numpy arrays without a copy.

    ``dataset``: a spec string (``"npy:x.npy,y.npy"``, ``"synthetic:n=1000,dim=8"``,
    ``"plugin:/path/lib.so"``, ``"python:mypkg.data:MyDataset"``), or a
    dataset class (or function) defined at the top level of a module or of
    the main script, built in each worker as ``dataset(**dataset_kwargs)``,
    or a dataset object. A ``ferry.Mix`` of datasets is served in its own
    order, drawn by weight (option ``mix``).

    Keyword options are the C library's (docs/options.md lists them, with
    their defaults): batch_size, workers, prefetch, shuffle, seed, drop_last,
    in_order, epochs, max_batches, rank, world_size, timeout (seconds; or
    timeout_ms), on_worker_failure ("restart" or "fail"), worker_mode
    ("process" or "thread"), bind, curve_key, ... An unknown name
    raises TypeError, a bad value ValueError. For datasets whose memory
    only grows (a leaky decoder): worker_max_rss_bytes (a worker process
    past this much private memory is replaced after its batch) and
    max_batches_per_worker; nothing is lost or served twice.

    ``state``: a :meth:`state_dict` to resume from: the first batch is the
    one after the last delivered when it was saved. In another shape (other
    world_size, rank, batch_size, drop_last or pad_shards: a job resumed on
    fewer or more GPUs) the loader starts at the next sample of the epoch's
    global order: the rest of that epoch is dealt out over the new ranks,
    each sample once, then epochs go on as a fresh run's (docs/python.md,
    "Resuming on another number of ranks"). In synchronous training every
    rank's state says the same; pass the list of all ranks' states to have
    them checked (ferry.StateError names a rank that stopped at another
    batch). A state of another dataset length, seed or shuffle raises
    ferry.StateError.

    ``log``: where the loader's messages go (a worker died and was replaced,
    a remote worker joined or was refused, ...): by default the ``"ferry"``
    logger of the logging module, at logging's levels; or any
    ``callable(level, message)``; or None to let ferry write them to stderr
    itself. They are handed over on the trainer's thread, during next(),
    stats() and close(). Option ``log_level`` ("debug", "info" (default),
    "warning", "error") drops the ones below it at the source.

    ``share_collections`` (default True): a dataset object's lists and
    dicts of 100,000 items or more reach process workers in a compact form
    they share (``ferry.SharedList``, ``ferry.SharedDict``; docs/python.md
    says which, and what differs) instead of a copy each; False keeps them
    plain.

    ``max_held`` (default 1024; 0: no limit): a batch you keep (or any array
    taken from it) keeps its memory, outside the prefetch window, which goes
    on filling. ``next()`` raises ferry.LimitError while this many batches
    are alive, instead of letting memory grow without bound.

    ``live`` (default None: on when the environment has ``FERRY_LIVE=1``):
    True lets ``python -m ferry.top PID`` show this loader from another
    shell, refreshed each second (workers and hosts, rate, stages, the
    verdict), through a local socket of this process that only its own
    user may attach to (docs/profile.md, "The live view"). False keeps it
    off whatever the environment says.

    Iterating yields one epoch; the next ``for`` goes on with the next
    epoch (its first batches are already prefetched). :meth:`stream` is the
    endless form. ``len(loader)`` is the number of batches per epoch.
    """

    def __init__(self, dataset, *, state=None, dataset_kwargs=None, max_held=1024,
                 log=_to_logging, share_collections=True, **options):
        self._c = None
        self._data_fd = None  # the pickled dataset's memfd (process workers)
        self._own_token = None  # the dataset object thread workers use as it is
        self._exports = None  # metrics=, trace= (_profile.Exports)
        self._template = None  # the fork of the trainer that forks the clean parent
        self._payload = None  # the pickled dataset until _hand_over
        self._forked = set()  # workers whose pid was seen (worker_pid)
        self._opens_early = False  # before every local worker is ready (open_local_ready)
        self._local = 0  # local workers
        self._start_timeout = 30.0
        self._inherited = []  # tokens of objects the clean parent inherits (_dataset)
        if log is not None and not callable(log):
            raise TypeError("ferry.Loader: log must be a callable(level, message) or None, "
                            "not %s" % type(log).__name__)
        self._log = log
        _dataset.refuse_loader_in_worker()
        if not isinstance(max_held, numbers.Integral) or max_held < 0:
            raise InvalidValue("ferry.Loader: max_held must be an int >= 0, got %r" % (max_held,))
        self._max_held = int(max_held)
        if not isinstance(share_collections, bool):
            raise InvalidValue("ferry.Loader: share_collections must be True or False, got %r"
                               % (share_collections,))
        self._share_collections = share_collections
        exports = _profile.take_options(options)
        opts = {}
        for key, value in options.items():
            if key == "timeout":
                ms = None if value is None else _seconds("ferry.Loader: timeout", value)
                key, value = "timeout_ms", 0 if ms is None else ms
            name = _RENAMED.get(key, key)
            if name != key:
                import warnings
                warnings.warn("ferry.Loader: option %s is now called %s; the old name goes in "
                              "the next release" % (key, name), FutureWarning, stacklevel=2)
            if name in opts:
                raise TypeError("ferry.Loader: option %s is given twice (as %s)" % (name, key))
            opts[name] = value
        threads = str(opts.get("worker_mode", "process")).lower() == "thread"
        try:  # what fails from here on is undone by close() (see the except)
            if isinstance(dataset, Mix) and dataset.dataset_spec is not None:
                spec = dataset.dataset_spec  # C sources: one concat dataset, C workers
            elif isinstance(dataset, str):
                if dataset_kwargs:
                    raise TypeError("ferry.Loader: dataset_kwargs goes with a dataset class, "
                                    "not a spec string")
                spec = dataset
            elif isinstance(dataset, type) or (callable(dataset) and
                                               not hasattr(dataset, "__getitem__")):
                spec = spec_for(dataset, dataset_kwargs)
            elif hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
                if dataset_kwargs:
                    raise TypeError("ferry.Loader: dataset_kwargs goes with a dataset class; this "
                                    "dataset is an object already")
                spec = self._dataset_object(dataset, threads)
            else:
                raise TypeError("ferry.Loader: dataset must be a spec string, a dataset class or "
                                "function, or a dataset object (with __getitem__ and __len__), "
                                "not a %s" % type(dataset).__name__)
            if spec.startswith("python:") and not threads:
                # One clean parent loads the dataset and forks the workers
                # (python -m ferry.worker --fork-server).
                opts.setdefault("fork_server", True)
                # torch's depth: 2 batches per worker in flight (its
                # prefetch_factor): a Python batch is built slowly and often big
                # (images), so a deeper window costs memory and gains little.
                workers = opts.get("workers", 2)
                if "prefetch" not in opts and isinstance(workers, numbers.Integral) and \
                        workers > 0:
                    opts["prefetch"] = min(1024, 2 * int(workers))
                # (no local worker, only remote ones: no clean parent to fork)
                if _flag(opts["fork_server"]) and \
                        not (isinstance(workers, numbers.Integral) and workers <= 0):
                    # open returns once the first worker is ready: it makes
                    # the first batches while the clean parent forks the
                    # others (each a fork of a process as big as the trainer)
                    opts.setdefault("open_local_ready", 1)
                    if "fork_from" not in opts:
                        self._fork_template()
                        if self._template is not None:
                            opts["fork_from"] = self._template.fileno()
            if isinstance(dataset, Mix):
                # The mix's own order over its sources (sampler/mix.h).
                opts.setdefault("mix", dataset.spec)
            if self._payload is not None:
                self._hand_over()
            pairs = [("dataset", spec)]
            pairs += [(k, _option_text(k, v)) for k, v in opts.items()]
            if "worker_path" not in opts:
                path, args = worker_command() if spec.startswith("python:") else \
                    _dataset.c_worker_command()
                pairs += [("worker_path", path), ("worker_args", args)]
            if self._data_fd is not None:
                pairs.append(("dataset_fd", str(self._data_fd)))
            self._pairs = pairs
            # a worker of the first start may have no pid yet after open
            self._opens_early = str(opts.get("open_local_ready", -1)) != "-1" and \
                not threads and _flag(opts.get("fork_server", False))
            workers = opts.get("workers", 2)
            self._local = int(workers) if isinstance(workers, numbers.Integral) else 0
            try:
                self._start_timeout = int(opts.get("start_timeout_ms", 30000)) / 1000.0
            except (TypeError, ValueError):
                pass  # refused by the C side's check of its options, next
            if self._template is not None:
                # while the C open runs, GIL released
                self._template.fork_second(() if self._data_fd is None else (self._data_fd,))
            self._adopt(self._open(state))
            if self._template is not None:
                # its second fork, made on ferry's forking thread while the
                # first became the clean parent and forked the first worker
                self._template.settle()
            self._exports = _profile.Exports(self, **exports)
        except BaseException:
            # Not left to __del__: the exception's traceback keeps this
            # object, and with it the template forked, the buffers lent and
            # the pickled dataset's memfd, alive.
            self.close()
            raise

    def _fork_template(self):
        """The clean parent's origin: a fork of the trainer made now, after
        the dataset was pickled (_template.fork_template; the objects it
        shares by inheritance exist by then). With threads running, forked
        all the same, as torch's DataLoader forks its workers: said at
        debug level."""
        self._template = _template.fork_template()
        if self._template is not None and self._template.threads > 1:
            _logger.debug("ferry.Loader: the clean parent is forked from the trainer, which "
                          "runs %d threads (as torch's DataLoader forks its workers); "
                          "FERRY_CLEAN_PARENT=spawn spawns it instead", self._template.threads)

    def _dataset_object(self, dataset, threads):
        """The spec of a dataset passed as an object: thread workers use the
        object itself; process workers get it pickled once, here, in memory
        they are handed (option dataset_fd), loaded once by their clean
        parent."""
        if threads:
            spec, self._own_token = _dataset.own_object_spec(dataset)
            return spec
        mark = _handoff.inherited_mark()
        try:
            spec, stream, buffers = _dataset.pickle_dataset(dataset, self._share_collections)
        finally:
            self._inherited = _handoff.inherited_since(mark)
        if self._inherited and _template.clean_parent_spawned():
            self.close()
            raise TypeError("ferry.Loader: the dataset holds objects shared with the trainer "
                            "(multiprocessing Value, Lock, Queue, ..., or tensors in shared "
                            "memory), which only a fork of the trainer can share, and clean "
                            "parents are spawned here (FERRY_CLEAN_PARENT=spawn)")
        # The arrays' bytes: lent to the clean parent's fork (no copy) when
        # there is one; else written out with the pickle (_hand_over).
        token = _handoff.lend_buffers(buffers) if buffers and \
            not _template.clean_parent_spawned() else None
        if token is not None:
            self._inherited.append(token)
        self._payload = (stream, buffers, token)
        return spec

    def _hand_over(self):
        """The pickled dataset into the memory its clean parent is handed
        (option dataset_fd): the stream, and its arrays' bytes by reference
        to the trainer's own memory, which the clean parent has as a fork of
        the template (no copy, the pages shared copy-on-write as with torch's
        forked workers), or else (no template: a spawned clean parent) a
        copy of them after the stream."""
        stream, buffers, token = self._payload
        self._payload = None
        if token is not None and self._template is None:
            _handoff.forget_inherited([token])
            self._inherited.remove(token)
            token = None
        fd = os.memfd_create("ferry-dataset", os.MFD_CLOEXEC)
        try:
            if token is not None:
                _handoff.write_lent_payload(fd, stream, token)
            else:
                _handoff.write_payload(fd, stream, buffers)
        except BaseException:
            os.close(fd)
            raise
        self._data_fd = fd

    def _open(self, state):
        """A new C loader for self's options, resuming at ``state``."""
        blob = None if state is None else _state_blob(state)
        c = _ferry.Loader(self._pairs, blob, self._log)
        c.max_held = self._max_held
        # The kind of Batch the fields call for, made by the C side inside
        # next() (see _next).
        c.wrap = _TupleBatch if _positional([f[0] for f in c.schema()]) else _FieldBatch
        return c

    def _adopt(self, c):
        self._c = c
        self._seen = 0
        self._len = c.length()
        self._in_order = c.in_order  # the C library's reading of the option ("OFF", "00", ...)
        _open_loaders.add(self)

    def _live(self):
        c = self._c
        if c is None:
            raise ValueError("the loader is closed")
        return c

    # -- iteration
    def _next(self, timeout):
        """The next ferry.Batch (the C side makes it), or None at the end.
        Nothing but returns may follow the C call (see _Epoch.__next__)."""
        c = self._live()
        ms = None if timeout is None else _seconds("next(): timeout", timeout)
        return c.next(-1 if ms is None else ms)

    def __iter__(self):
        return _Epoch(self)

    def __len__(self):
        return self._len[1]

    def stream(self):
        """An iterator over every batch to the end of the stream (``epochs``
        or ``max_batches``; endless without them), across epochs. A
        ferry.BatchError raised out of it is for one batch: iterating again
        goes on with the next."""
        return _Stream(self)

    def next(self, timeout=None):
        """The next batch; waits at most ``timeout`` seconds (None: as long
        as it takes) and raises ferry.NotReady (a ferry.Timeout) when none
        was ready, leaving the loader as it was. StopIteration at the end
        of the stream."""
        b = self._next(timeout)
        if b is None:
            raise StopIteration
        return b

    @property
    def held(self):
        """Batches delivered and still alive (the Batch, or an array taken
        from it, is referenced)."""
        return self._c.held if self._c is not None else 0

    @property
    def schema(self):
        """Each field's numpy dtype and the shape of one item (the batch
        dimension left out), known before the first batch:
        ``{"x": (dtype('uint8'), (28, 28)), "y": (dtype('int64'), ())}``;
        None for a field whose shape each batch gives."""
        return {name: (np.dtype(_dataset.DTYPE_NAMES[code]), shape)
                for name, code, shape in self._live().schema()}

    @property
    def num_items(self):
        """Items in the dataset."""
        return self._len[0]

    # -- state
    def state_dict(self):
        """The position after the last batch delivered (needs in_order), as
        a dict that JSON, pickle and torch.save keep as it is. It names the
        place the whole job has reached in the epoch's order, so it resumes
        a loader of another world_size, rank or batch_size too (see the
        class's ``state``)."""
        return _state_dict(self._live().state())

    def feed(self, first_seq, batches):
        """With option ``feed_batches=B``: the indices of the batches from
        stream position ``first_seq`` on (batch b of epoch e is position
        e * B + b), one sequence of indices per batch, at most batch_size
        each. Feed in order, ahead of the prefetch window (the next epoch's
        too, for prefetch across epochs); a batch not fed yet waits, and a
        position fed already (or before a resume's start) is skipped. The
        indices travel in the tasks, so remote workers serve them as any."""
        counts = np.fromiter((len(b) for b in batches), dtype=np.uint32)
        flat = np.concatenate([np.asarray(b, dtype=np.int64).reshape(-1) for b in batches]) \
            if len(counts) else np.zeros(0, np.int64)
        if (flat < 0).any():
            raise IndexOutOfRange("feed: index %d is negative" % int(flat[flat < 0][0]))
        self._live().feed(int(first_seq), counts, flat)

    def skip_epoch(self):
        """The rest of the current epoch is never handed out: the next
        batch is the next epoch's first (what torch's DataLoader does with
        an epoch a `for` left early). Its batches that are made already are
        dropped, those being made are dropped when they come, the others
        are never made; the next epoch's, prefetched already, stay.
        Returns how many batches were passed over (0 at an epoch's start).
        Only with in_order (ferry.InvalidValue otherwise)."""
        n = self._live().skip_epoch()
        self._seen = 0  # (only once skipped: out of order it counts the epoch's batches)
        return n

    def state_at_epoch(self, epoch):
        """The state that starts the stream at the first batch of ``epoch``
        (what :meth:`state_dict` would say just before it), whatever has
        been delivered: for scripts that set the epoch themselves."""
        if not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise InvalidValue("state_at_epoch: epoch must be an int >= 0, not %r" % (epoch,))
        return _state_dict(self._live().state_at_epoch(int(epoch)))

    def load_state_dict(self, state):
        """Goes on from ``state``: the workers are restarted, and the next
        batch is the one after the last delivered when it was saved. A state
        that does not fit raises and leaves this loader as it was."""
        self._live()
        c = self._open(state)
        self._stop()
        self._adopt(c)

    # -- facts
    def stats(self):
        """The loader's counters (dict: delivered, failed, restarts,
        retirements, ...). ``restarts`` counts workers replaced after they
        died or timed out; ``retirements`` those replaced on purpose,
        between batches (options ``worker_max_rss_bytes``,
        ``max_batches_per_worker``).
        ``slot_memory`` is the bytes the shared batch slots hold: memory
        the trainer and the workers map, counted once here. For what the
        processes use, see :meth:`memory` (RSS counts those slots in full
        in every process that maps them)."""
        return self._live().stats()

    def profile(self, since="last"):
        """Where the time goes: each delivered batch's stages in seconds,
        for all batches and per worker, and a verdict in one sentence.
        ``since="last"``: over the time since the previous call (since open
        on the first); ``"open"``: since the loader opened. A dict:
        ``verdict`` (the sentence), ``kind`` ("trainer-bound",
        "input-bound", "slow-worker", "order-bound", "network-bound",
        "memory-bound", "unknown"), ``slow_worker``, ``workers_needed``,
        ``wait_share`` (the trainer's time in next() over wait and step),
        ``seconds``, ``batches``, ``stages`` ({stage: {count, total, mean,
        p50, p90, p99}} for make, transit, order, held, wait, step) and
        ``workers`` ({index: {batches, busy, pid, host, stages}}: pid a
        local process worker's, host "HOST:PID" a remote one's). See
        docs/profile.md, "Is it the data?"."""
        return _profile.report(self, since)

    @property
    def metrics_address(self):
        """"HOST:PORT" of the Prometheus endpoint (option ``metrics``), or
        None."""
        return self._exports.metrics_address if self._exports else None

    @property
    def live(self):
        """True while ``python -m ferry.top`` can show this loader (option
        ``live``)."""
        return bool(self._exports and self._exports.live)

    def memory(self):
        """The memory of this process and of every process below it (the
        loader's workers and clean parents), by PSS: each shared page
        (batch slots, a dataset mapped by all, libraries) shared out
        between the processes that map it, so the sum counts it once.
        RSS would count it in full in each. A dict of bytes: ``trainer``,
        ``children`` (their sum) and ``total``, plus ``processes`` (how
        many children). Reading PSS walks each process's page tables:
        milliseconds per process, not for every batch."""
        self._live()
        trainer = _pss_kb(os.getpid()) or 0
        kids = [_pss_kb(p) for p in _descendants(os.getpid())]
        kids = [k for k in kids if k is not None]  # a process gone meanwhile
        return {"trainer": trainer * 1024, "children": sum(kids) * 1024,
                "total": (trainer + sum(kids)) * 1024, "processes": len(kids)}

    def worker_pid(self, index):
        """The pid of local worker ``index`` (0 while it is being replaced or
        for a thread). A Python dataset's loader opens once its first
        worker is ready (option open_local_ready) while its clean parent
        forks the others: a worker of that first start not forked yet is
        waited for (tens of ms; at most start_timeout_ms, after which the
        loader fails if it is still not forked)."""
        if not isinstance(index, numbers.Integral) or not 0 <= index < 2**32:
            raise InvalidValue("worker_pid: no worker %r" % (index,))
        c = self._live()
        pid = c.worker_pid(int(index))
        if pid or index in self._forked or not self._opens_early or index >= self._local:
            if pid:
                self._forked.add(index)
            return pid
        deadline = time.monotonic() + self._start_timeout
        # polled: the C side says a pid, not when one comes (a few ms)
        while not pid and time.monotonic() < deadline and c.stats()["restarts"] == 0:
            time.sleep(0.001)
            pid = c.worker_pid(int(index))
        if pid:
            self._forked.add(index)
        return pid

    def worker_process(self, index):
        """Local worker ``index``'s process as it is now: a
        :class:`WorkerProcess` (pid, is_alive(), join(timeout), exitcode,
        terminate()), which stays truthful after the worker or the loader
        is gone; None for a thread worker or one being replaced."""
        self.worker_pid(index)  # checks index
        try:
            return WorkerProcess(self._live(), int(index))
        except ValueError:
            return None

    @property
    def endpoint(self):
        """The tcp:// endpoint remote workers connect to, or None."""
        return self._live().endpoint()

    # -- lifetime
    def close(self):
        """Stops the workers and frees everything (batches you hold stay
        valid). Safe to call twice."""
        if self._exports is not None:
            exports, self._exports = self._exports, None
            exports.close(self._c)
        self._stop()
        if self._data_fd is not None:
            os.close(self._data_fd)  # the loader kept its own copy while it ran
            self._data_fd = None
        if self._own_token is not None:
            _dataset.forget_own_object(self._own_token)
            self._own_token = None
        if self._template is not None:
            self._template.close()
            self._template = None
        _handoff.forget_inherited(self._inherited)
        self._inherited = []

    def _stop(self):
        """Stops the C loader (the dataset stays, for another)."""
        c = self._c
        if c is not None and _ferry.worker_state() is not None:
            # Called from one of this process's thread workers (a loader
            # collected by the garbage collector there): a loader cannot
            # stop the thread it runs on, so another thread closes it.
            import threading
            threading.Thread(target=c.close, name="ferry-close", daemon=True).start()
        elif c is not None:
            c.close()  # raises, changing nothing, while another thread is in next()
        self._c = None
        _open_loaders.discard(self)

    @property
    def closed(self):
        return self._c is None

    def __repr__(self):
        if self._c is None:
            return "<ferry.Loader closed>"
        return "<ferry.Loader %d items, %d batches per epoch>" % self._len
