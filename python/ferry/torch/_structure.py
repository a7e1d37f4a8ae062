"""A batch's structure, pickled: how a batch made in a worker crosses to
the trainer.

A worker's batch is whatever default_collate or the user's collate_fn
made (dicts, lists, namedtuples, strings, tensors). Its tensors and
numeric arrays travel in the batch's fields, in shared memory: a fixed
field already written by collation (_collate) stands in the structure as
a _Ref; any other array is written into a field of variable shape of its
dtype, or into the stream's one byte field, by _Pickler as it meets it.
Everything else is pickled into the structure field (_SKELETON). The
trainer's _load_structure puts back tensors and arrays that share the
fields' memory: no copy on that side.

_Pickler runs in a worker (any thread that fills a batch); _Unpickler in
the trainer, on the thread that iterates.
"""

import functools
import io
import pickle

import numpy as np
import torch

from .. import _dataset, _handoff

_SKELETON = "structure"  # the field holding a batch's pickled structure


@functools.lru_cache(maxsize=None)
def _np_dtype(tdtype):
    """The numpy dtype of a torch dtype that ferry fields can hold, or None
    (asked per tensor per batch: remembered)."""
    try:
        d = torch.empty(0, dtype=tdtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None
    return d if d.str in _dataset._DTYPES else None



def _field_dtype(obj):
    """The numpy dtype under which obj, a tensor or a numpy array, can
    travel as a field (numeric, on the CPU, not empty, no autograd), or
    None for anything else."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.device.type != "cpu" or obj.requires_grad or \
                obj.numel() == 0:
            return None
        return _np_dtype(obj.dtype)
    if isinstance(obj, np.ndarray) and obj.size and obj.dtype.str in _dataset._DTYPES:
        return obj.dtype
    return None


class _Ref:
    """Where a tensor or array of a batch's structure is: in a field."""

    __slots__ = ("field",)

    def __init__(self, field):
        self.field = field


class _Pickler(_handoff._pickler().Pickler):
    """Pickles a batch's structure, putting tensors and numeric arrays in
    fields of variable shape (``var``: field index -> dtype) as long as one
    of their dtype is free, and _Refs (fixed fields already written) as
    references. cloudpickle's when there is one: a namedtuple or class of
    the trainer's main script, which came to the worker by value with the
    dataset, goes back as the trainer's own class."""

    def __init__(self, buf, var, out, blob=None):
        super().__init__(buf, protocol=5)
        self._free = {}
        for f, dt in var.items():
            self._free.setdefault(dt, []).append(f)
        self._out = out
        # blob: a byte field that takes every other array that travels, one
        # after another (64-byte aligned); its parts until finish_blob().
        self._blob, self._parts, self._blob_len = blob, [], 0

    def persistent_id(self, obj):
        if isinstance(obj, _Ref):
            return ("f", obj.field, None)
        dt = _field_dtype(obj)
        free = self._free.get(dt)
        if not free and self._blob is not None and dt is not None:
            arr = np.ascontiguousarray(obj.numpy() if isinstance(obj, torch.Tensor) else obj)
            at = -(-self._blob_len // 64) * 64
            self._parts.append((at, arr))
            self._blob_len = at + arr.nbytes
            return ("b", self._blob, ("t" if isinstance(obj, torch.Tensor) else "n",
                                      arr.dtype.str, arr.shape, at))
        if not free:  # not an array that travels, or no field of its dtype left
            return None
        f = free.pop(0)
        kind = "t" if isinstance(obj, torch.Tensor) else "n"
        arr = obj.numpy() if kind == "t" else obj
        # a field has at least one dim: a 0-d array travels as one element
        self._out[f] = np.ascontiguousarray(arr).reshape(arr.shape or (1,))
        return ("v", f, (kind, tuple(arr.shape)))

    def finish_blob(self):
        """The byte field's contents: the arrays put in it (one copy each)."""
        blob = np.zeros(max(1, self._blob_len), dtype=np.uint8)
        for at, arr in self._parts:
            blob[at:at + arr.nbytes] = arr.reshape(-1).view(np.uint8)
        self._out[self._blob] = blob
        self._parts = []


class _Unpickler(pickle.Unpickler):
    """Unpickles a batch's structure, its tensors sharing the fields'
    memory. One class for all batches: a class made per batch would sit in
    a reference cycle holding the batch's memory until the garbage
    collector ran."""

    def __init__(self, raw, fields):
        super().__init__(io.BytesIO(memoryview(raw)))
        self._fields = fields

    def persistent_load(self, pid):
        tag, f, how = pid
        arr = self._fields[f]
        if tag == "f":
            return torch.from_numpy(arr)
        if tag == "b":  # a part of the byte field
            kind, dt, shape, at = how
            dt = np.dtype(dt)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            arr = arr[at:at + n].view(dt).reshape(shape)
            return torch.from_numpy(arr) if kind == "t" else arr
        kind, shape = how
        arr = arr.reshape(shape)
        return torch.from_numpy(arr) if kind == "t" else arr


def _load_structure(raw, fields):
    """A batch's structure, its tensors sharing the fields' memory."""
    u = _Unpickler(raw, fields)
    try:
        return u.load()
    finally:
        u._fields = None
