"""Collation in a worker: torch's default_collate, written into the
batch's slot.

A batch collated by default is made with torch's own functions
(torch.utils.data._utils.collate), so that what the trainer gets is what
torch's DataLoader gives, except that each numeric leaf that has a fixed
field (its dtype and item shape learnt from item 0, _worker) is stacked
straight into that field of the batch slot and stands in the structure as
a _Ref (_structure pickles it as a reference). Items of large leaves are
written into their rows as they are made (_to_rows, _Row), so that a
batch is never held whole before collation. Whatever does not fit its
field (another dtype or shape, a leaf of another kind) goes through
torch's own function, which raises as torch does where the items differ.

Runs in a worker (a process's main thread, or a thread worker), and in
the trainer for num_workers=0 (then without views: plain default_collate).
"""

import contextlib

import numpy as np
import torch
from torch.utils.data._utils import collate as _tcollate

from ._structure import _field_dtype, _np_dtype, _Ref


@contextlib.contextmanager
def _torch_worker_info(info):
    """torch's get_worker_info() answers `info` meanwhile."""
    from torch.utils.data._utils import worker as tworker
    saved = tworker._worker_info
    tworker._worker_info = info
    try:
        yield
    finally:
        tworker._worker_info = saved


def _collate(items, fixed, probe=None, views=None):
    """default_collate of items, with torch's own functions, except that
    each numeric leaf that matches its fixed field (fixed: leaf number ->
    (field, numpy dtype, item shape)) is stacked straight into the field
    (views: numpy arrays over the batch slot) and stands as a _Ref.
    probe: list to record each leaf's (numpy dtype, item shape) in."""
    cursor = [0]

    def leaf(default):
        def fn(batch, *, collate_fn_map=None):
            if views is not None:
                batch = _unrow(batch, views)
            n = cursor[0]
            cursor[0] += 1
            if probe is not None:
                t = default(batch, collate_fn_map=collate_fn_map)
                dt = _np_dtype(t.dtype) if isinstance(t, torch.Tensor) else None
                probe.append((dt, tuple(t.shape[1:]) if dt is not None else None))
                return t
            place = fixed.get(n)
            if place is not None and views is not None:
                f, dt, shape = place
                if _stack_into(batch, views[f], dt, shape):
                    return _Ref(f)
            return default(batch, collate_fn_map=collate_fn_map)
        return fn

    def rows(batch, *, collate_fn_map=None):
        # Items whose leaf went into its row as the item was made: when
        # all did, the field stands as it is (_to_rows wrote only items
        # of the first's outline, leaves of one kind numbered alike);
        # else the leaves as they were go through torch's functions.
        if all(type(v) is _Row for v in batch):
            cursor[0] += 1
            return _Ref(batch[0].field)
        return _tcollate.collate(_unrow(batch, views), collate_fn_map=collate_fn_map)

    def unrowed(default):
        def fn(batch, *, collate_fn_map=None):
            return default(_unrow(batch, views), collate_fn_map=collate_fn_map)
        return fn

    fmap = dict(_tcollate.default_collate_fn_map)
    for key, default in list(fmap.items()):
        # str/bytes are no leaves of a field; torch's numpy-array
        # function collates the arrays as tensors again (through this
        # map: the Tensor leaf counts them, once).
        if key != (str, bytes) and key is not np.ndarray:
            fmap[key] = leaf(default)
        elif key is np.ndarray and views is not None:
            fmap[key] = unrowed(default)
    if views is not None:
        fmap[_Row] = rows
    with _torch_worker_info(None):  # torch would put each tensor in shm of its own
        return _tcollate.collate(items, collate_fn_map=fmap)


def _to_rows(item, k, fixed, arrays, first):
    """item with each numeric leaf that fits its fixed field written into
    row k of it and left as a _Row, so that a batch of large items is
    not held whole until collation (torch's workers hold it: 38 MB for
    64 ImageNet crops in float). Leaves are numbered as collation
    numbers them, from the batch's first item; an item of another
    structure than the first's (first[0]: its outline) is kept as it
    is, as is one with a part this does not know."""
    outline, cursor = [], [0]

    def walk(x, depth):
        kind = _leaf_kind(x)
        if kind is not None:
            outline.append(kind)
            n = cursor[0]
            cursor[0] += 1
            place = fixed.get(n)
            if place is None or not _fits(x, kind, place[1], place[2]):
                return x
            row = arrays[place[0]][k, ...]
            if kind is torch.Tensor:
                torch.from_numpy(row).copy_(x)
            else:
                row[...] = x
            return _Row(place[0], k, kind)
        t = type(x)
        if t in (str, bytes):
            outline.append(t)
            return x
        if depth > 20:
            raise TypeError
        if t is dict:
            outline.append((t, tuple(x)))
            return {key: walk(v, depth + 1) for key, v in x.items()}
        if t in (list, tuple):
            outline.append((t, len(x)))
            return t(walk(v, depth + 1) for v in x)
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
            outline.append((t, len(x)))
            return t(*(walk(v, depth + 1) for v in x))
        raise TypeError  # a container or leaf torch collates its own way

    if first[0] is False:
        return item
    try:
        light = walk(item, 0)
    except TypeError:
        light = item  # what was written is written again by collation
    if first[0] is None:
        first[0] = outline if light is not item else False
    return light if outline == first[0] else item


def _walk_arrays(obj, sizes, depth=0):
    """(numpy dtype, bytes) of each tensor and numeric array in obj, as a
    pickler would meet them (containers in order)."""
    if depth > 20:
        return
    dt = _field_dtype(obj)
    if dt is not None:
        sizes.append((dt, obj.numel() * obj.element_size() if isinstance(obj, torch.Tensor)
                      else obj.nbytes))
    elif isinstance(obj, dict):
        for v in obj.values():
            _walk_arrays(v, sizes, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _walk_arrays(v, sizes, depth + 1)


def _leaf_kind(v):
    """The kind of a numeric leaf as torch's collation treats it (Tensor,
    np.ndarray, or the number's own type), or None for anything else."""
    if isinstance(v, torch.Tensor):
        return torch.Tensor
    if isinstance(v, np.ndarray):  # not of strings or objects: torch refuses those
        return np.ndarray if v.dtype.kind not in "OSUaV" else None
    if isinstance(v, (np.bool_, np.number)) or type(v) in (int, float, bool):
        return type(v)
    return None


def _fits(v, kind, dt, shape):
    """Whether leaf v (of kind _leaf_kind(v)) is what a fixed field of
    dtype dt and item shape `shape` holds, as default_collate makes it:
    int -> int64, float -> float64, bool -> bool, numpy scalars and
    arrays and tensors their own dtype."""
    if kind is torch.Tensor:
        return v.layout == torch.strided and tuple(v.shape) == tuple(shape) and \
            _np_dtype(v.dtype) == dt
    if kind is np.ndarray:
        return v.shape == shape and v.dtype == dt
    if shape != ():
        return False
    if issubclass(kind, np.generic):
        return v.dtype == dt
    return (kind is float and dt == np.float64) or (kind is bool and dt == np.bool_) or \
        (kind is int and dt == np.int64)


def _stack_into(batch, dst, dt, shape):
    """Writes the leaves of one field (tensors, arrays or numbers, one per
    item) into dst (count x shape) when each is what the field holds; False
    (nothing promised about dst) when not: torch's own function then
    stacks them (and raises as torch does when they differ)."""
    kind = _leaf_kind(batch[0])
    if kind is None or any(_leaf_kind(v) is not kind or not _fits(v, kind, dt, shape)
                           for v in batch):
        return False
    if kind is torch.Tensor:
        torch.stack(batch, 0, out=torch.from_numpy(dst))
    elif kind is np.ndarray:
        np.stack(batch, out=dst)
    else:
        dst[...] = batch
    return True


class _Row:
    """A leaf of item `row` already written into row `row` of fixed field
    `field` as the item was made (so the batch's items are not all held
    until collation): `kind` is what it was (_leaf_kind)."""

    __slots__ = ("field", "row", "kind")

    def __init__(self, field, row, kind):
        self.field, self.row, self.kind = field, row, kind

    def value(self, views):
        """The leaf as it was (a copy, from its row)."""
        a = views[self.field][self.row, ...]  # an array, also of a 0-d item
        if self.kind is torch.Tensor:
            return torch.from_numpy(a.copy())
        if self.kind is np.ndarray:
            return a.copy()
        if issubclass(self.kind, np.generic):
            return a[()]
        return self.kind(a)


def _unrow(batch, views):
    """batch with each _Row turned back into its leaf: a field whose items
    are not all alike goes through torch's own functions, which see what
    the items held."""
    if not any(type(v) is _Row for v in batch):
        return batch
    return [v.value(views) if type(v) is _Row else v for v in batch]
