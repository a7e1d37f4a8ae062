"""ferry: a data loader for machine-learning training, with persistent
worker processes, prefetch that runs across epoch boundaries, and batches
handed to you as numpy arrays without a copy.

    import ferry
    loader = ferry.Loader("npy:train_x.npy,train_y.npy", batch_size=256,
                          workers=4, prefetch=8, shuffle=True, seed=0)
    for epoch in range(10):
        for batch in loader:                  # one epoch
            x, y = batch["x"], batch["y"]     # numpy arrays, no copy

A dataset written in Python is named, not pickled: ``ferry.Loader(MyDataset,
dataset_kwargs={...})`` runs ``MyDataset(**dataset_kwargs)`` in each worker
(``python -m ferry.worker``) and calls ``__getitem__`` (or ``get_batch``).
See README.md for the whole guide.
"""

import atexit
import sys
import weakref
from collections.abc import Mapping

import numpy as np

from . import _ferry
from ._dataset import WorkerInfo, spec_for, worker_command, worker_info
from ._errors import (BatchError, Closed, DatasetError, Error, IndexOutOfRange, InvalidValue,
                      LimitError, OptionError, SpawnError, StateError, Timeout, WorkerError)

__version__ = _ferry.version()

__all__ = [
    "Loader", "Batch", "WorkerInfo", "worker_info", "Error", "OptionError", "InvalidValue",
    "DatasetError", "BatchError", "IndexOutOfRange", "WorkerError", "SpawnError", "Timeout",
    "StateError", "Closed", "LimitError", "__version__",
]

# Python names for C options (the C names work too).
_ALIASES = {
    "world": "world_size",
    "placement": "worker_mode",
    "on_worker_death": "on_worker_failure",
}


class Batch(Mapping):
    """One batch: a mapping of field name to numpy array. The arrays are
    views of the received batch (no copy; writable, the memory is yours),
    and the memory goes back when the batch and every array taken from it
    are gone. A field can also be taken by position: ``batch[0]``.

    ``epoch``, ``index_in_epoch``, ``last_in_epoch``, ``seq`` (position in
    the whole stream), ``worker`` (the index of the worker that built it),
    ``size`` and ``indices`` (the sample indices, a uint64 array).
    """

    __slots__ = ("_b", "_arrays", "_names")

    def __init__(self, b):
        self._b = b
        fields = b.fields()
        self._names = tuple(name for name, _ in fields)
        self._arrays = {name: np.asarray(view) for name, view in fields}

    def __getitem__(self, key):
        if isinstance(key, int):
            return self._arrays[self._names[key]]
        return self._arrays[key]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __contains__(self, key):
        return key in self._arrays

    epoch = property(lambda self: self._b.epoch, doc="epoch of the batch, from 0")
    index_in_epoch = property(lambda self: self._b.batch_in_epoch,
                              doc="position of the batch in its epoch, from 0")
    last_in_epoch = property(lambda self: self._b.last_in_epoch,
                             doc="True for the last batch of its epoch")
    seq = property(lambda self: self._b.seq, doc="position in the whole stream")
    worker = property(lambda self: self._b.worker, doc="index of the worker that built it")
    size = property(lambda self: self._b.size, doc="items in the batch")

    @property
    def indices(self):
        """The sample indices the batch was built from (uint64 array)."""
        return np.asarray(self._b.indices())

    def torch(self):
        """The fields as torch tensors sharing this batch's memory (dict)."""
        import torch
        return {k: torch.from_numpy(v) for k, v in self._arrays.items()}

    def __repr__(self):
        fields = ", ".join("%s: %s%s" % (k, v.dtype, tuple(v.shape))
                           for k, v in self._arrays.items())
        return "<ferry.Batch epoch %d #%d, %s>" % (self.epoch, self.index_in_epoch, fields)


_open_loaders = weakref.WeakSet()


@atexit.register
def _close_all():
    # A loader still open at exit (an exception ended the script, Ctrl-C)
    # stops its workers now, not from a finaliser that may never run.
    for ld in list(_open_loaders):
        try:
            ld.close()
        except Exception:
            pass


def _option_text(key, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    raise TypeError("ferry.Loader: option %s must be a bool, int or str, not %s"
                    % (key, type(value).__name__))


class _Epoch:
    """The iterator one ``for batch in loader`` gets: batches until the
    last of the current epoch."""

    __slots__ = ("_loader", "_done")

    def __init__(self, loader):
        self._loader = loader
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            b = self._loader._next(None)
        except BatchError as e:
            if e.batch_in_epoch is not None and e.batch_in_epoch + 1 >= len(self._loader):
                self._done = True
            raise
        if b is None:
            self._done = True
            raise StopIteration
        if b.last_in_epoch:
            self._done = True
        return b


class Loader:
    """A ferry loader: persistent workers, a prefetch window that runs across
    epoch boundaries, batches as numpy arrays without a copy.

    ``dataset``: a spec string (``"npy:x.npy,y.npy"``, ``"synthetic:n=1000,dim=8"``,
    ``"plugin:/path/lib.so"``, ``"python:mypkg.data:MyDataset"``), or a
    dataset class (or function) defined at the top level of a module or of
    the main script, built in each worker as ``dataset(**dataset_kwargs)``.

    Keyword options are the C library's (README.md lists them, with their
    defaults): batch_size, workers, prefetch, shuffle, seed, drop_last,
    in_order, epochs, max_batches, rank, world (world_size), timeout
    (seconds; or timeout_ms), on_worker_death ("restart" or "fail"),
    placement ("process" or "thread"), bind, curve_key, ... An unknown name
    raises TypeError, a bad value ValueError.

    ``state``: a :meth:`state_dict` to resume from: the first batch is the
    one after the last delivered when it was saved.

    ``max_held`` (default 1024; 0: no limit): a batch you keep (or any array
    taken from it) keeps its memory, outside the prefetch window, which goes
    on filling. ``next()`` raises ferry.LimitError while this many batches
    are alive, instead of letting memory grow without bound.

    Iterating yields one epoch; the next ``for`` goes on with the next
    epoch (its first batches are already prefetched). :meth:`stream` is the
    endless form. ``len(loader)`` is the number of batches per epoch.
    """

    def __init__(self, dataset, *, state=None, dataset_kwargs=None, max_held=1024, **options):
        self._c = None
        if not isinstance(max_held, int) or max_held < 0:
            raise InvalidValue("ferry.Loader: max_held must be an int >= 0, got %r" % (max_held,))
        self._max_held = max_held
        opts = {}
        for key, value in options.items():
            if key == "timeout":
                key, value = "timeout_ms", 0 if value is None else int(round(value * 1000))
            opts[_ALIASES.get(key, key)] = value
        if isinstance(dataset, str):
            if dataset_kwargs:
                raise TypeError("ferry.Loader: dataset_kwargs goes with a dataset class, not a "
                                "spec string")
            spec = dataset
        elif callable(dataset):
            spec = spec_for(dataset, dataset_kwargs)
        else:
            raise TypeError("ferry.Loader: dataset must be a spec string or a dataset class "
                            "defined in a module, not %s (datasets are named, not pickled)"
                            % type(dataset).__name__)
        pairs = [("dataset", spec)]
        pairs += [(k, _option_text(k, v)) for k, v in opts.items()]
        if "worker_path" not in opts:
            path, args = worker_command()
            pairs += [("worker_path", path), ("worker_args", args)]
        self._pairs = pairs
        self._open(state)

    def _open(self, state):
        blob = None
        if state is not None:
            blob = state.get("ferry") if isinstance(state, dict) else state
            if not isinstance(blob, (bytes, bytearray)):
                raise StateError("ferry.Loader: state must be what state_dict() returned")
        self._c = _ferry.Loader(self._pairs, bytes(blob) if blob is not None else None)
        self._c.max_held = self._max_held
        self._len = self._c.length()
        _open_loaders.add(self)

    # -- iteration
    def _next(self, timeout):
        c = self._c
        if c is None:
            raise ValueError("the loader is closed")
        b = c.next(-1 if timeout is None else max(0, int(timeout * 1000)))
        return None if b is None else Batch(b)

    def __iter__(self):
        return _Epoch(self)

    def __len__(self):
        return self._len[1]

    def stream(self):
        """Every batch to the end of the stream (``epochs`` or
        ``max_batches``; endless without them), across epochs."""
        while True:
            b = self._next(None)
            if b is None:
                return
            yield b

    def next(self, timeout=None):
        """The next batch; waits at most ``timeout`` seconds (None: as long
        as it takes) and raises ferry.Timeout when none was ready, leaving
        the loader as it was. StopIteration at the end of the stream."""
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
    def num_items(self):
        """Items in the dataset."""
        return self._len[0]

    # -- state
    def state_dict(self):
        """The position after the last batch delivered (needs in_order)."""
        return {"ferry": self._c.state()}

    def load_state_dict(self, state):
        """Goes on from ``state``: the workers are restarted, and the next
        batch is the one after the last delivered when it was saved."""
        self.close()
        self._open(state)

    # -- facts
    def stats(self):
        """The loader's counters (dict: delivered, failed, restarts, ...)."""
        return self._c.stats()

    def worker_pid(self, index):
        """The pid of local worker ``index`` (0 while it is being replaced or
        for a thread)."""
        return self._c.worker_pid(index)

    @property
    def endpoint(self):
        """The tcp:// endpoint remote workers connect to, or None."""
        return self._c.endpoint()

    # -- lifetime
    def close(self):
        """Stops the workers and frees everything (batches you hold stay
        valid). Safe to call twice."""
        c, self._c = self._c, None
        _open_loaders.discard(self)
        if c is not None:
            c.close()

    @property
    def closed(self):
        return self._c is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._c is None:
            return "<ferry.Loader closed>"
        return "<ferry.Loader %d items, %d batches per epoch>" % self._len
