"""A batch as ferry.Loader hands it over: numpy arrays over the batch's own
memory (no copy), one per field, in the form the dataset's items have (a
Mapping of fields, a Sequence, or one array), with where it came from
(seq, epoch, indices, the worker and its times)."""

import operator
from collections.abc import Mapping, Sequence

import numpy as np

from . import _ferry


def _positional(names):
    """Fields "0", "1", ...: a dataset whose items are tuples or single values."""
    return tuple(names) == tuple(str(i) for i in range(len(names)))


class Batch:
    """One batch: numpy arrays, one per field. The arrays are views of the
    received batch (no copy; writable, the memory is yours), and the memory
    goes back when the batch and every array taken from it are gone.

    Its shape follows the dataset's items. Items that are dicts give a
    batch that is a ``collections.abc.Mapping`` of field name to array
    (iteration gives the names, like a dict). Items that are tuples or
    single values (fields "0", "1", ...) give a batch that is a
    ``collections.abc.Sequence`` of the arrays, like the items: ``x, y =
    batch``, ``batch[0]``. Both take a field by name (``batch["x"]``,
    ``batch["0"]``) and by position, and have ``keys()``, ``values()`` and
    ``items()``. ``ferry.Batch(mapping or sequence of arrays)`` builds one
    (what generic code such as torch's ``default_convert`` does).

    ``epoch``, ``index_in_epoch``, ``last_in_epoch``, ``seq`` (position in
    the whole stream), ``worker`` (the index of the worker that built it),
    ``size`` and ``indices`` (the sample indices, a uint64 array); the times,
    in seconds: ``make_time`` (the worker's time to build it), ``flight_time``
    (dispatch to arrival: make_time, the worker's queue and both transfers),
    ``ready_time`` (how long it then waited for the trainer), and
    ``attempts`` (workers it was sent to: 1 unless one died on it). None on
    a Batch built from plain arrays (``type(batch)({...})``, unpickling).
    """

    __slots__ = ("_b", "_arrays", "_names")

    def __new__(cls, b):
        if cls is Batch:  # the kind the fields call for
            if isinstance(b, _ferry.Batch):
                names = [name for name, _ in b.fields()]
            elif isinstance(b, Mapping):
                names = list(b)
            else:
                names = [str(i) for i in range(len(b))]
            cls = _TupleBatch if _positional(names) else _FieldBatch
        return object.__new__(cls)

    def __init__(self, b):
        if isinstance(b, _ferry.Batch):
            fields = b.fields()
            self._b = b
            self._names = tuple(name for name, _ in fields)
            self._arrays = {name: np.asarray(view) for name, view in fields}
        else:  # arrays (or tensors): what generic code rebuilds a batch from
            self._b = None
            self._arrays = dict(b) if isinstance(b, Mapping) else {
                str(i): v for i, v in enumerate(b)}
            self._names = tuple(self._arrays)

    def _field(self, key):
        """The array of field `key` (a name or a position)."""
        if isinstance(key, str):
            try:
                return self._arrays[key]
            except KeyError:
                raise self._no_field(key) from None
        try:
            i = operator.index(key)
        except TypeError:
            raise self._no_field(key) from None
        if not -len(self._names) <= i < len(self._names):
            raise IndexError("batch has %d fields (%s); no field %d"
                             % (len(self._names), ", ".join(self._names), i))
        return self._arrays[self._names[i]]

    def _no_field(self, key):
        return KeyError("no field %r; the batch has %s" % (key, ", ".join(
            repr(n) for n in self._names) or "no fields"))

    def __len__(self):
        return len(self._names)

    def __contains__(self, key):
        """Whether `key` names a field (a tuple batch too: Sequence's search
        by value cannot compare numpy arrays)."""
        return key in self._arrays

    def keys(self):
        return self._arrays.keys()

    def values(self):
        return self._arrays.values()

    def items(self):
        return self._arrays.items()

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__

    def __reduce__(self):
        # Pickled (and deep-copied) as a Batch over copies of the arrays.
        return (Batch, ({k: np.array(v) for k, v in self._arrays.items()},))

    def _info(name):
        return property(lambda self: getattr(self._b, name) if self._b is not None else None)

    epoch = _info("epoch")
    index_in_epoch = _info("batch_in_epoch")
    last_in_epoch = _info("last_in_epoch")
    seq = _info("seq")
    worker = _info("worker")
    attempts = _info("attempts")
    make_time = _info("make_time")
    flight_time = _info("flight_time")
    ready_time = _info("ready_time")
    del _info

    @property
    def size(self):
        """Items in the batch."""
        if self._b is not None:
            return self._b.size
        return len(next(iter(self._arrays.values()))) if self._arrays else 0

    @property
    def indices(self):
        """The sample indices the batch was built from (uint64 array)."""
        return np.asarray(self._b.indices()) if self._b is not None else None

    def torch(self):
        """The fields as torch tensors sharing this batch's memory: a dict
        of field name to tensor, or, for a batch of tuples or single values
        (a sequence batch), a tuple of tensors (``x, y = batch.torch()``)."""
        import torch
        out = {}
        for k, v in self._arrays.items():
            try:
                out[k] = torch.from_numpy(v)
            except TypeError as e:
                raise TypeError("field '%s' (%s): %s" % (k, v.dtype, e)) from None
        return tuple(out.values()) if isinstance(self, Sequence) else out

    def __repr__(self):
        fields = ", ".join("%s: %s%s" % (k, v.dtype, tuple(v.shape))
                           for k, v in self._arrays.items())
        if self._b is None:
            return "<ferry.Batch %s>" % fields
        return "<ferry.Batch epoch %d #%d, %s>" % (self.epoch, self.index_in_epoch, fields)


class _FieldBatch(Batch, Mapping):
    """A batch of a dataset whose items are dicts: a mapping of field name
    to array, iterating over the names."""

    __slots__ = ()

    __getitem__ = Batch._field

    def __iter__(self):
        return iter(self._names)


class _TupleBatch(Batch, Sequence):
    """A batch of a dataset whose items are tuples or single values: a
    sequence of the arrays, unpacking like the items."""

    __slots__ = ()

    def __getitem__(self, key):
        if isinstance(key, slice):
            return tuple(self._arrays[n] for n in self._names[key])
        return self._field(key)

    def __iter__(self):
        return iter([self._arrays[n] for n in self._names])
