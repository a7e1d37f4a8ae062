"""ferry.torch: PyTorch's DataLoader, on ferry's workers.

    from ferry.torch import DataLoader        # was: from torch.utils.data import DataLoader
    loader = DataLoader(ImageFolder(root, transform=tf), batch_size=64, shuffle=True,
                        num_workers=4)
    for epoch in range(10):
        for x, y in loader:                    # one epoch, as with torch
            ...

It takes torch's arguments, with torch's defaults, and yields what torch's
DataLoader yields (``default_collate``'s tensors, dicts, lists, namedtuples,
lists of strings, or what your ``collate_fn`` returns). Underneath it is a
``ferry.Loader``: workers that persist, a prefetch window that runs across
epoch boundaries, exact resume (:meth:`DataLoader.state_dict`), every batch
once when a worker dies. docs/python.md ("Coming from torch") lists, argument
by argument, what is the same and what differs.

How a batch travels. The dataset object (with ``collate_fn`` and
``worker_init_fn``) is pickled once, in the trainer, into memory the
workers' clean parent loads it from (see ferry.Loader). In a worker,
``default_collate`` runs as torch's does, except that each numeric field it
stacks is written straight into the batch's slot of shared memory (a fixed
field of the ferry batch), and the batch's structure, with any strings or
other objects in it, is pickled into a small field of its own. The trainer
unpickles that structure, putting in its place tensors that share the
fields' memory: no copy. A ``collate_fn`` of your own returns any
structure; its tensors and arrays travel as fields of variable shape (one
copy into shared memory, as torch makes).

An ``IterableDataset`` is iterated by each worker (sharded by
``get_worker_info()``, as in torch), its batches handed out round-robin
over the workers not yet ended, as torch's DataLoader does; see
docs/python.md for what ferry promises for such a stream.
"""

import collections
import contextlib
import functools
import hashlib
import inspect
import io
import itertools
import logging
import numbers
import os
import pickle
import random
import re
import sys
import threading
import time
import types
import warnings

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as _tcollate

from . import Loader, _Closes, _dataset, _Epoch, _ferry
from ._errors import BatchError, BatchLost, DatasetError, NotReady, WorkerError

__all__ = ["DataLoader", "get_worker_info"]

_SKELETON = "structure"  # the field holding a batch's pickled structure
_MAX_DATA_FIELDS = 15    # ferry's 16 fields, less the structure's
_RESERVE_MAX = 1 << 30   # bytes per item a field of variable shape may reserve

_warned = set()


def _notice_once(key, text):
    """Says text once per process at the ferry logger's warning level: a
    change of code path a user must see without configuring logging (with
    no handler set up, Python's logging prints warnings on stderr), though
    it is not a fault."""
    if key not in _warned:
        _warned.add(key)
        logging.getLogger("ferry").warning("ferry.torch.DataLoader: %s", text)


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        warnings.warn("ferry.torch.DataLoader: " + text, stacklevel=3)


@functools.lru_cache(maxsize=None)
def _np_dtype(tdtype):
    """The numpy dtype of a torch dtype that ferry fields can hold, or None
    (asked per tensor per batch: remembered)."""
    try:
        d = torch.empty(0, dtype=tdtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None
    return d if d.str in _dataset._DTYPES else None


class _Unset:
    """torch's default for an argument whose default ferry cannot honour:
    false, as torch's, and told apart from a value the user passed."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "False"


_UNSET = _Unset()
# torch's own default (2 in torch 1.x, None in 2.x): accepted with num_workers=0.
_TORCH_PREFETCH_DEFAULT = inspect.signature(tud.DataLoader).parameters["prefetch_factor"].default


def get_worker_info():
    """torch's ``get_worker_info()``: in a ferry worker, an object with
    ``id``, ``num_workers``, ``seed`` and ``dataset`` (torch's own function
    answers the same); None in the trainer."""
    return tud.get_worker_info()


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


class _Pickler(_dataset._pickler().Pickler):
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


class _SamplerTable:
    """The batches a sampler or batch_sampler of the user's gives, epoch by
    epoch, for the workers: ferry's loader then runs over batch positions
    (one position per batch, no shuffle of its own), and a worker reads
    which indices position p of epoch e stands for here.

    The trainer iterates the sampler ahead of the workers, `ahead` epochs
    past the one it is in (enough to cover the prefetch window), into a
    ring of memfds, one epoch each, that local workers read through
    /proc/TRAINER/fd/N. An epoch's file: [epoch or -1 while written]
    [batches n][indices m][offsets, n + 1][indices]. A sampler's
    set_epoch(e) is called before its epoch e is drawn, and its
    state_dict() (when it has one) kept, for an exact resume."""

    HEAD = 24

    def __init__(self, batch_sampler, sampler, nbatches, ahead, dataset_len):
        self.batch_sampler = batch_sampler
        self.sampler = sampler
        self.n = nbatches
        self.ahead = ahead
        self.ring = ahead + 2
        self.dataset_len = dataset_len
        self.fds = [os.memfd_create("ferry-sampler", os.MFD_CLOEXEC) for _ in range(self.ring)]
        self.written = -1   # the last epoch written
        self.states = {}    # epoch -> the sampler's state_dict() before drawing it
        self.max_len = 1    # the longest batch drawn
        # How the samplers were built, to draw the epochs again from (the
        # resume of a sampler without state_dict): a copy of them, or else
        # the state of the torch generators they draw from.
        self._fresh = self._gens = None
        try:
            import copy
            self._fresh = copy.deepcopy((batch_sampler, sampler))
        except Exception:  # noqa: BLE001 - torch's Generator cannot be copied
            self._gens = [(o, o.generator.get_state()) for o in {id(x): x for x in (
                batch_sampler, sampler, getattr(batch_sampler, "sampler", None))}.values()
                if isinstance(getattr(o, "generator", None), torch.Generator)]

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def batches_of(self, epoch):
        """Epoch `epoch`'s batches, drawn now (numpy int64 arrays)."""
        s = self.sampler
        if hasattr(s, "set_epoch"):
            s.set_epoch(epoch)
        if hasattr(s, "state_dict"):
            self.states[epoch] = s.state_dict()
        out = [np.asarray(b, dtype=np.int64).reshape(-1) for b in self.batch_sampler]
        if len(out) != self.n:
            raise RuntimeError("ferry.torch.DataLoader: the batch sampler gave %d batches in "
                               "epoch %d, but its len() is %d: ferry needs as many batches in "
                               "every epoch" % (len(out), epoch, self.n))
        for b in out:
            bad = b[(b < 0) | (b >= self.dataset_len)]
            if len(bad):
                raise IndexError("ferry.torch.DataLoader: the sampler gives index %d, but the "
                                 "dataset has %d items" % (int(bad[0]), self.dataset_len))
        return out

    def fill_to(self, epoch):
        """Draws and writes every epoch up to `epoch`."""
        while self.written < epoch:
            e = self.written + 1
            batches = self.batches_of(e)
            offsets = np.zeros(self.n + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(b) for b in batches])
            flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
            self.max_len = max([self.max_len] + [len(b) for b in batches])
            fd = self.fds[e % self.ring]
            os.pwrite(fd, np.int64(-1).tobytes(), 0)  # a reader sees no epoch meanwhile
            os.pwrite(fd, np.array([self.n, len(flat)], np.int64).tobytes() + offsets.tobytes() +
                      flat.tobytes(), 8)
            os.pwrite(fd, np.int64(e).tobytes(), 0)
            self.written = e
            self.states.pop(e - self.ring, None)

    def skip_to(self, epoch, state):
        """Goes on at `epoch` (a resume): from the sampler's saved state
        when there is one, else by drawing the epochs before it again (the
        same draws for a sampler seeded at construction)."""
        self.states.clear()
        if state is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state)
        else:
            if self._fresh is not None:  # from the samplers as built
                import copy
                self.batch_sampler, self.sampler = copy.deepcopy(self._fresh)
            elif self._gens:
                for o, st in self._gens:
                    o.generator.set_state(st)
            else:
                _warn_once("replay", "resuming a sampler (%s) that has no state_dict() and "
                                     "cannot be drawn again from its start: the batches after "
                                     "the resume may differ" % type(self.sampler).__name__)
            for e in range(epoch):
                self.batches_of(e)
        self.written = epoch - 1

    def ref(self):
        """What a worker needs to read the table: (trainer pid, fds)."""
        return (os.getpid(), list(self.fds))


def _read_table(ref, opened, epoch, pos, deadline_s=60.0):
    """In a worker: the indices of batch position `pos` of `epoch`, read
    from the trainer's table (see _SamplerTable); waits (polling, at most
    deadline_s) while the trainer has not written that epoch yet."""
    pid, fds = ref
    slot = epoch % len(fds)
    fd = opened.get(slot)
    if fd is None:
        fd = opened[slot] = os.open("/proc/%d/fd/%d" % (pid, fds[slot]), os.O_RDONLY | os.O_CLOEXEC)
    give_up = time.monotonic() + deadline_s
    head = _SamplerTable.HEAD
    while True:
        if np.frombuffer(os.pread(fd, 8, 0), np.int64)[0] == epoch:
            n, _ = np.frombuffer(os.pread(fd, 16, 8), np.int64)
            lo, hi = np.frombuffer(os.pread(fd, 16, head + 8 * pos), np.int64)
            raw = os.pread(fd, int(8 * (hi - lo)), int(head + 8 * (n + 1) + 8 * lo))
            if np.frombuffer(os.pread(fd, 8, 0), np.int64)[0] == epoch:  # not rewritten meanwhile
                return np.frombuffer(raw, np.int64)
        if time.monotonic() > give_up:
            raise RuntimeError("ferry.torch.DataLoader: the trainer did not give the sampler's "
                               "epoch %d within %.0f s" % (epoch, deadline_s))
        time.sleep(0.001)  # the trainer draws it at its next epoch's start


class _Batches:
    """What the workers are given: the user's dataset with how to make its
    batches (collate_fn, seeding, worker_init_fn). ferry's Python worker
    asks it for its fields (``__ferry_fields__``) and has it fill each
    batch (``__ferry_fill__``)."""

    def __init__(self, dataset, indices, collate_fn, auto_batch, base_seed, reseed,
                 worker_init_fn, num_workers, trainer_pid, table=None):
        self.dataset = dataset
        self.indices = indices
        # A sampler of the user's: the positions' indices are in its table
        # (the table itself in this process, its ref in workers).
        self.table = table
        self.table_ref = table.ref() if table is not None else None
        self.nbatches = table.n if table is not None else None
        self.collate_fn = collate_fn
        self.auto_batch = auto_batch
        self.base_seed = base_seed
        self.reseed = reseed
        self.worker_init_fn = worker_init_fn
        self.num_workers = num_workers
        self.trainer_pid = trainer_pid
        self._fields = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fields"] = None
        state["table"] = None
        for k in ("_started", "_fixed", "_var", "_opened", "_kept"):
            state.pop(k, None)
        return state

    def __len__(self):
        if self.nbatches is not None:
            return self.nbatches
        return len(self.indices) if self.indices is not None else len(self.dataset)

    def build(self, positions, epoch):
        """num_workers=0: the batch at `positions`, made in the caller's
        thread as torch's DataLoader makes it there (nothing seeded, the
        dataset's exceptions raised as they are)."""
        return self._user_batch([self._item(i) for i in self._sampled(positions, epoch)])

    def _user_batch(self, items):
        """What the user's loader makes of `items`: their collate_fn's
        result, or torch's default_collate (default_convert of the one item
        without auto-batching), out of torch's own shared memory."""
        one = items if self.auto_batch else items[0]
        if self.collate_fn is not None:
            return self.collate_fn(one)
        fn = _tcollate.default_collate if self.auto_batch else _tcollate.default_convert
        with _torch_worker_info(None):  # torch would put each tensor in shm of its own
            return fn(one)

    def close(self):
        """Called by ferry when the dataset closes: the table's files this
        worker opened."""
        for fd in self.__dict__.pop("_opened", {}).values():
            os.close(fd)

    def _sampled(self, positions, epoch):
        """The dataset indices of batch positions (a user's sampler), or
        the positions themselves."""
        if self.table_ref is None:
            return positions
        opened = self.__dict__.setdefault("_opened", {})
        return np.concatenate([_read_table(self.table_ref, opened, int(epoch), int(p))
                               for p in positions])

    def __getitem__(self, i):
        return self._item(i)

    # -- worker side
    def _item(self, i):
        try:
            return self.dataset[int(self.indices[i]) if self.indices is not None else int(i)]
        except BaseException as e:
            try:  # the index the batch failed on, for the error (pydataset.c)
                e._ferry_index = int(i)
            except (AttributeError, TypeError):
                pass
            raise

    def _seed(self, s):
        # Below 2^63, as torch's own seeds are (its base seed is a random
        # int64): code that collates torch.initial_seed() into a tensor,
        # or hands it to an int64 API, must not overflow.
        s %= 2**63
        torch.manual_seed(s)
        random.seed(s)
        np.random.seed(s % 2**32)

    def _start(self):
        """Once per worker process (and thread): torch's seeding, torch's
        worker info, then worker_init_fn."""
        if getattr(self, "_started", None) == (os.getpid(), threading.get_ident()):
            return
        self._started = (os.getpid(), threading.get_ident())
        if os.getpid() == self.trainer_pid:
            # num_workers=0: the trainer's own process, whose generators
            # are the training's; torch neither seeds them nor calls
            # worker_init_fn here.
            self.reseed = None
            return
        # A worker process, as torch's are (ferry.worker has limited its
        # threads already).
        info = _dataset.worker_info()
        wid = info.id if info is not None else 0
        seed = (self.base_seed + wid) % 2**63
        self._seed(seed)
        from torch.utils.data._utils import worker as tworker
        tworker._worker_info = tworker.WorkerInfo(
            id=wid, num_workers=self.num_workers, seed=seed, dataset=self.dataset)
        if self.worker_init_fn is not None:
            self.worker_init_fn(wid)

    def __ferry_fields__(self):
        """The batch's fields, from a batch of item 0: default collation
        gives one fixed field per numeric leaf (its item shape);
        a collate_fn of the user's, one field of variable shape per tensor
        or array it returned; then the structure. Asked once, in the clean
        parent (whose workers are forks of it) or a thread worker; a probe
        that fails (item 0 raises, collate_fn raises) leaves every batch to
        travel in the structure, failing or not on its own."""
        self._fixed = {}   # leaf number -> (field, numpy dtype, item shape)
        self._var = {}     # field -> numpy dtype
        fields = []
        if _dataset.holds_inherited() and os.getpid() != self.trainer_pid:
            # A dataset sharing a Barrier, a Semaphore or a counter with the
            # trainer may count on items being built in workers only, as
            # torch builds them: no probe in the clean parent (a barrier of
            # num_workers would never open there); batches travel in the
            # structure.
            self._fields = [(_SKELETON, _dataset._DTYPES["|u1"], None, 256)]
            return self._fields
        with _probing(self) as reads, _probe_deadline(self):
            try:
                item = self._probe_item(reads)
                if self.collate_fn is None and self.auto_batch and self.table_ref is None:
                    leaves = []
                    self._collate([item], probe=leaves)
                    for n, (dt, shape) in enumerate(leaves):
                        # An empty leaf (a detection item with no boxes, an
                        # empty token list) has no bytes to lay out, and
                        # later items may not be empty: it travels in the
                        # structure, collated by torch's own functions.
                        if dt is not None and 0 not in shape and \
                                len(fields) < _MAX_DATA_FIELDS:
                            self._fixed[n] = (len(fields), dt, shape)
                            fields.append(("%d" % len(fields), _dataset._DTYPES[dt.str], shape))
                else:
                    sizes = []
                    _walk_arrays(self._user_batch([item]), sizes)
                    # Bytes per ferry item: a batch sampler's position is a
                    # whole batch (item_scale items).
                    scale = getattr(self, "item_scale", 1)
                    for dt, nbytes in sizes[:_MAX_DATA_FIELDS]:
                        self._var[len(fields)] = dt
                        reserve = min(_RESERVE_MAX, max(64, (nbytes + nbytes // 4) * scale))
                        fields.append(("%d" % len(fields), _dataset._DTYPES[dt.str], None,
                                       reserve))
            except Exception:  # noqa: BLE001 - each batch meets it and says so
                self._fixed, self._var, fields = {}, {}, []
        fields.append((_SKELETON, _dataset._DTYPES["|u1"], None, 256))
        self._fields = fields
        return fields

    def _probe_item(self, reads):
        """Item 0, built to probe the fields, and kept (``_kept``) to be
        the first item of a worker's first batch when that is position 0
        of epoch 0 and the worker would build the very same item: a slow
        item 0 then costs its time once (issue 36, item 6). It is kept
        when nothing the worker does first can change it: no
        worker_init_fn; torch's, numpy's and random's generators seeded
        as that batch seeds them (reseed "batch" or "sample": the seed of
        (seed, epoch 0, index 0)), or not drawn from at all (reseed
        "worker": each worker's own seed); torch's get_worker_info()
        (worker 0's here: `reads` lists what the dataset read of it) read
        only if worker 0 is the one; ferry.worker_info() not asked (None
        here); default collation (a collate_fn of the user's could change
        the items it is given); no sampler of the user's. reads is None
        where the probe made no worker info (the trainer, a worker's own):
        nothing is kept there."""
        self._kept = None
        if (reads is None or self.worker_init_fn is not None or self.collate_fn is not None
                or not self.auto_batch or self.table_ref is not None):
            return self._item(0)
        asked = _dataset._info_asked[0]
        saved = _rng_states()
        try:
            if self.reseed in ("batch", "sample"):
                self._seed(_ferry.sample_seed(self.base_seed, 0, 0))
            before = _dataset._global_rngs()
            item = self._item(0)
            drew = _dataset._global_rngs() != before
            after = _rng_states()  # where the batch's next item goes on drawing from
        finally:
            _set_rng_states(saved)  # the process's generators as they were
        if _dataset._info_asked[0] == asked and (not drew or self.reseed != "worker"):
            self._kept = (item, bool(reads), after if drew else None)
        return item

    def __ferry_forget_first__(self):
        """Called in the clean parent once it has forked the workers: its
        copy of the kept item goes (a replacement builds item 0 anew)."""
        self.__dict__.pop("_kept", None)

    def _reuse_first(self, positions, epoch):
        """The item kept from the probe (see _probe_item) to be the first
        of this batch, or None; asked at every batch, it answers at most
        once per process."""
        kept = self.__dict__.pop("_kept", None)
        if kept is None or int(epoch) != 0 or len(positions) == 0 or int(positions[0]) != 0:
            return None
        item, read_info, after = kept
        if read_info:
            info = tud.get_worker_info()
            if info is None or info.id != 0:
                return None
        if after is not None:  # the generators as building it would have left them
            _set_rng_states(after)
        return item

    def _collate(self, items, probe=None, views=None):
        """default_collate of items, with torch's own functions, except that
        each numeric leaf that matches its fixed field is stacked straight
        into the field (views: numpy arrays over the batch slot) and
        stands as a _Ref. probe: list to record each leaf's (numpy dtype,
        item shape) in."""
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
                fixed = self._fixed.get(n)
                if fixed is not None and views is not None:
                    f, dt, shape = fixed
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

    def _to_rows(self, item, k, arrays, first):
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
                fixed = self._fixed.get(n)
                if fixed is None or not _fits(x, kind, fixed[1], fixed[2]):
                    return x
                row = arrays[fixed[0]][k, ...]
                if kind is torch.Tensor:
                    torch.from_numpy(row).copy_(x)
                else:
                    row[...] = x
                return _Row(fixed[0], k, kind)
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

    def __ferry_fill__(self, indices, epoch, views):
        self._start()
        if self._fields is None:
            self.__ferry_fields__()
        if self.reseed == "batch":  # the batch's first index (or position) names it
            self._seed(_ferry.sample_seed(self.base_seed, int(epoch), int(indices[0])))
        first = self._reuse_first(indices, epoch) if "_kept" in self.__dict__ else None
        indices = self._sampled(indices, epoch)
        count = len(indices)
        nf = len(self._fields)
        out = [None] * nf
        arrays = {}
        for f, dt, shape in self._fixed.values():
            arrays[f] = np.frombuffer(views[f], dtype=dt).reshape((count,) + shape)
        items, outline = [], [None]  # the batch's first item's, for _to_rows
        for k, i in enumerate(indices):
            if self.reseed == "sample":
                self._seed(_ferry.sample_seed(self.base_seed, int(epoch), int(i)))
            item = first if k == 0 and first is not None else self._item(i)
            items.append(self._to_rows(item, k, arrays, outline) if arrays else item)
        if arrays:
            result = self._collate(items, views=arrays)
        else:
            result = self._user_batch(items)
        buf = io.BytesIO()
        _Pickler(buf, self._var, out).dump(result)
        out[nf - 1] = np.frombuffer(buf.getbuffer(), dtype=np.uint8)
        for f in self._var:  # unused this batch: one byte, to keep the shape rules
            if out[f] is None:
                out[f] = np.zeros(1, dtype=self._var[f])
        return out


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


@contextlib.contextmanager
def _probing(b):
    """While the fields are probed with item 0 outside a worker (the clean
    parent, or the trainer for num_workers=0): torch's get_worker_info()
    answers as in worker 0 when there are workers, and no worker_init_fn
    is called (each worker does that itself). Yields the list of what the
    dataset reads of that worker info meanwhile, or None where the probe
    made none."""
    from torch.utils.data._utils import worker as tworker
    info, reads = tworker._worker_info, None
    if os.getpid() != b.trainer_pid and info is None:
        reads = []

        class Watched(tworker.WorkerInfo):
            def __getattribute__(self, name):
                if name in ("id", "num_workers", "seed", "dataset"):
                    reads.append(name)
                return super().__getattribute__(name)

        info = Watched(id=0, num_workers=b.num_workers, seed=b.base_seed, dataset=b.dataset)
    with _torch_worker_info(info):
        yield reads


class _ProbeTimedOut(BaseException):
    """Item 0, built at the workers' start to learn the batch's fields, took
    longer than the DataLoader's timeout. A BaseException, so that the
    probe's own `except Exception` (a failing item 0 is left to its batch)
    lets it through: the workers' start fails with it, and the trainer
    raises torch's timeout error (_as_torch_says)."""

    MARK = "ferry.torch: timed out building item 0"
    _ferry_replay = True  # each worker raises it again at once (_dataset.preload)


@contextlib.contextmanager
def _probe_deadline(b):
    """torch's `timeout` covers the first batch too: with one set, building
    item 0 at the workers' start is cut short by SIGALRM once it passes it
    (in the clean parent or a worker process, whose main thread this is;
    nowhere else: a thread or the trainer has no alarm to spare)."""
    timeout = getattr(b, "timeout", 0) or 0
    if timeout <= 0 or os.getpid() == b.trainer_pid or \
            threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal

    def expired(signum, frame):
        raise _ProbeTimedOut("%s (%s s)" % (_ProbeTimedOut.MARK, timeout))

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, float(timeout))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _rng_states():
    """The generators _Batches._seed seeds, as they are now."""
    return random.getstate(), np.random.get_state(), torch.random.get_rng_state()


def _set_rng_states(states):
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])


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


class _StreamTable:
    """For an IterableDataset: which batch of whose iterator each task
    stands for. Task seq s is made by worker w = s % W (the loader's
    pin_tasks), as its k = s // W-th task; the trainer writes, per worker, a
    ring of entries [k + 1, epoch, batch in epoch (-1: idle)] in a memfd
    that the worker reads through /proc/TRAINER/fd/N. The trainer decides
    the epochs: a worker's tasks stand for its next batches until its
    iterator ends, then for its next epoch's (at most AHEAD of them while
    the trainer is still in the epoch before; then idle tasks, answered at
    once)."""

    ENTRY = 24
    RING = 4096
    AHEAD = 2

    def __init__(self, workers):
        self.workers = workers
        self.fds = [os.memfd_create("ferry-stream", os.MFD_CLOEXEC) for _ in range(workers)]
        for fd in self.fds:
            os.ftruncate(fd, self.ENTRY * self.RING)
        self.written = 0              # entries written: seqs 0 .. written-1
        self.entries = {}             # seq -> (epoch, batch in epoch or -1), until read back
        self.epoch = [0] * workers    # the epoch each worker's next entries stand for
        self.next_k = [0] * workers   # and the batch in it
        self.trainer_epoch = 0        # the epoch the trainer hands out

    def ref(self):
        return (os.getpid(), list(self.fds))

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def write_to(self, end):
        """Entries for every seq below `end`."""
        while self.written < end:
            s = self.written
            w, k = s % self.workers, s // self.workers
            # Entries are read back in seq order: the oldest unread is
            # written - len(entries); its ring place must not come round.
            if s - self.workers * self.RING >= self.written - len(self.entries):
                raise RuntimeError("ferry.torch.DataLoader: the stream table is full")
            e = self.epoch[w]
            if e > self.trainer_epoch + 1 or \
                    (e == self.trainer_epoch + 1 and self.next_k[w] >= self.AHEAD):
                kin = -1
            else:
                kin = self.next_k[w]
                self.next_k[w] += 1
            self.entries[s] = (e, kin)
            os.pwrite(self.fds[w], np.array([k + 1, e, kin], np.int64).tobytes(),
                      (k % self.RING) * self.ENTRY)
            self.written += 1

    def ended(self, w, epoch):
        """Worker w's iterator has no more batches in `epoch`: its next
        entries stand for the epoch after."""
        if self.epoch[w] == epoch:
            self.epoch[w] = epoch + 1
            self.next_k[w] = 0


def _read_stream(ref, opened, w, k, deadline_s=60.0):
    """In worker w: (epoch, batch in epoch or -1) of its k-th task, from the
    trainer's _StreamTable; waits (polling) while it is not written."""
    pid, fds = ref
    fd = opened.get(w)
    if fd is None:
        fd = opened[w] = os.open("/proc/%d/fd/%d" % (pid, fds[w]), os.O_RDONLY | os.O_CLOEXEC)
    give_up = time.monotonic() + deadline_s
    at = (k % _StreamTable.RING) * _StreamTable.ENTRY
    while True:
        tag, e, kin = np.frombuffer(os.pread(fd, _StreamTable.ENTRY, at), np.int64)
        if tag == k + 1:
            return int(e), int(kin)
        if time.monotonic() > give_up:
            raise RuntimeError("ferry.torch.DataLoader: the trainer did not say what task %d of "
                               "worker %d stands for within %.0f s" % (k, w, deadline_s))
        time.sleep(0.001)  # written ahead of the window: only at the very start


class _StreamBatches(_Batches):
    """What the workers are given for an IterableDataset: each worker
    iterates its own copy (sharded by get_worker_info(), as in torch), one
    epoch after another, and a task is its next batch, collated in the
    worker. What a task stands for comes from the trainer (_StreamTable);
    a replacement worker starts that epoch's iteration again and skips the
    batches already made, so a stream that iterates the same way each time
    (the same items for the same seed, worker and epoch) loses and repeats
    nothing."""

    LENGTH = 2**40  # the index stream is endless: epochs are the iterators'

    def __len__(self):
        return self.LENGTH

    # Bytes a batch's tensors may take in its shared-memory slot; a larger
    # batch goes by message. Only what is written is allocated.
    BLOB_RESERVE = 64 << 20

    def __ferry_fields__(self):
        # No probe (there is no item 0 to ask for): every tensor or numeric
        # array of a batch goes in one byte field, the rest in the structure.
        self._fixed, self._var = {}, {}
        u1 = _dataset._DTYPES["|u1"]
        # The structure first: a slot holds the fields one after another at
        # their reserves, so the batch's extent is the structure's reserve
        # and what the byte field really holds, not its whole reserve.
        self._fields = [(_SKELETON, u1, None, 4096), ("data", u1, None, self.BLOB_RESERVE)]
        return self._fields

    def _pull(self, it, w, e, kin):
        """Batch kin of epoch e from iterator it, seeded as ferry seeds it:
        its items, or None at the end."""
        if self.reseed == "batch":
            self._seed(_ferry.sample_seed(self.base_seed, e, kin * self.num_workers + w))
        n = self.batch_size if self.auto_batch else 1
        items = []
        for x in it:
            items.append(x)
            if len(items) == n:
                break
        if not items or (self.drop_last and len(items) < n):
            return None
        return items

    def _next_batch(self, w, e, kin):
        ended = self.__dict__.setdefault("_ended", {})
        if kin >= ended.get(e, 1 << 62):
            return ("end", e, kin)
        st = self.__dict__.get("_iter")
        if st is None or st[0] != e or st[1] > kin:
            if self.reseed == "batch":  # the epoch's iteration repeats, whoever runs it
                self._seed(_ferry.sample_seed(self.base_seed, e, w))
            st = self._iter = [e, 0, iter(self.dataset)]
        while st[1] < kin:  # a replacement catches up, with the same seeding
            try:
                items = self._pull(st[2], w, e, st[1])
            except Exception:  # noqa: BLE001 - reported when that batch was made
                items = ()
            if items is None:
                ended[e] = st[1]
                return ("end", e, kin)
            st[1] += 1
        try:
            items = self._pull(st[2], w, e, kin)
        finally:  # a batch that raised was made too: the next is the one after
            st[1] += 1
        if items is None:
            ended[e] = kin
            return ("end", e, kin)
        return ("b", e, kin, self._user_batch(items))

    def __ferry_fill__(self, indices, epoch, views):
        self._start()
        if self._fields is None:
            self.__ferry_fields__()
        p = int(indices[0])
        w, k = p % self.num_workers, p // self.num_workers
        e, kin = _read_stream(self.table_ref, self.__dict__.setdefault("_opened", {}), w, k)
        result = ("idle", e, kin) if kin < 0 else self._next_batch(w, e, kin)
        buf = io.BytesIO()
        out = [None, None]
        p = _Pickler(buf, {}, out, blob=1)
        p.dump(result)
        p.finish_blob()
        out[0] = np.frombuffer(buf.getbuffer(), dtype=np.uint8)
        return out


def _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                  multiprocessing_context, pin_memory_device, ferry_options):
    """torch's checks of the arguments every DataLoader takes (with torch's
    messages), ferry's own, and the warnings for what means nothing here."""
    if not isinstance(num_workers, numbers.Integral) or num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor not in (None, _TORCH_PREFETCH_DEFAULT):
        raise ValueError("prefetch_factor option could only be specified in "
                         "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                         "otherwise set prefetch_factor to None.")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if reseed not in (None, "batch", "sample", "worker"):
        raise ValueError("ferry.torch.DataLoader: reseed must be 'batch', 'sample' or "
                         "'worker', not %r" % (reseed,))
    if "bind" in ferry_options or "remote" in ferry_options:
        raise TypeError("ferry.torch.DataLoader: remote workers serve a dataset by name "
                        "(ferry.Loader(MyDataset, dataset_kwargs=...)); a pickled dataset "
                        "object stays on this host")
    if persistent_workers is False and num_workers > 0:
        _warn_once("persist", "persistent_workers=False: ferry's workers always persist "
                              "(they are not restarted each epoch)")
    if multiprocessing_context is not None:
        _check_mp_context(multiprocessing_context, num_workers)
        _warn_once("mp", "multiprocessing_context is ignored: ferry's workers are forked "
                         "from a clean parent process, never from the trainer")
    if pin_memory_device:
        _warn_once("pmd", "pin_memory_device is ignored: batches are pinned for CUDA")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    if cpus and num_workers > cpus:
        warnings.warn("ferry.torch.DataLoader: %d workers on a process allowed %d CPUs: more "
                      "workers than CPUs only contend for them and use more memory, and such "
                      "excessive worker creation might get DataLoader running slow or even "
                      "freeze; %d or fewer is the most this machine runs at once"
                      % (num_workers, cpus, cpus), UserWarning, stacklevel=3)


def _default_reseed(reseed, worker_init_fn):
    """reseed as given, else "batch", or torch's "worker" under a
    worker_init_fn: code written for torch seeds its generators there
    (torch.manual_seed(...) in it), and reseeding before each batch would
    silently overwrite that."""
    if reseed is not None:
        return reseed
    return "worker" if worker_init_fn is not None else "batch"


def _check_mp_context(ctx, num_workers):
    """torch's checks of multiprocessing_context (ferry does not use it, but
    a value torch refuses is refused here too, with torch's meaning)."""
    import multiprocessing
    import multiprocessing.context
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process "
                         "loading (num_workers > 0), but got num_workers=0")
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError("multiprocessing_context option should specify a valid start "
                             "method in %r, but got multiprocessing_context=%r" % (methods, ctx))
    elif not isinstance(ctx, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a "
                        "string specifying the start method, but got multiprocessing_context=%r"
                        % (ctx,))


# ------------------------------------------------ torchvision in C (native)

def _native_imagefolder(dataset):
    """(the imagefolder spec that runs ``dataset`` and its transform in C,
    None), for torchvision's ImageFolder or a DatasetFolder with its default
    loader and image extensions; (None, why not) for one whose pipeline is
    not one ferry has in C; (None, None) for any other dataset.
    The transform must be a Compose (or one transform) of, in this order:
    RandomResizedCrop(S) or Resize(R) + CenterCrop(S) (square, bilinear);
    optionally RandomHorizontalFlip(0.5); ToTensor, or PILToTensor with
    optionally ConvertImageDtype(float32); optionally Normalize."""
    if "torchvision" not in sys.modules:  # then dataset cannot be one of its classes
        return None, None  # (and importing it would cost ~0.3 s for nothing)
    try:
        from torchvision import datasets as tvd
        from torchvision import transforms as T
        from torchvision.transforms import InterpolationMode
    except ImportError:
        return None, None
    if not isinstance(dataset, tvd.DatasetFolder):
        return None, None
    # C stands in only for code whose result it is known to reproduce:
    # torchvision's own classes, not a subclass (its __getitem__, loader or
    # anything else may differ, and would silently not run).
    if type(dataset) not in (tvd.ImageFolder, tvd.DatasetFolder):
        return None, "it is %s, a subclass of torchvision's %s: its own code runs" % (
            type(dataset).__qualname__,
            "ImageFolder" if isinstance(dataset, tvd.ImageFolder) else "DatasetFolder")
    if getattr(dataset, "loader", None) is not tvd.folder.default_loader:
        return None, "its loader is not torchvision's default_loader"
    if tuple(getattr(dataset, "extensions", None) or ()) != tuple(tvd.folder.IMG_EXTENSIONS):
        return None, "its extensions are not torchvision's IMG_EXTENSIONS"
    if getattr(dataset, "target_transform", None) is not None:
        return None, "it has a target_transform"
    classes = getattr(dataset, "classes", None)
    if classes != sorted(classes or []) or \
            dataset.class_to_idx != {c: i for i, c in enumerate(classes)}:
        return None, "its classes are not the sorted folder names"
    import torchvision
    if torchvision.get_image_backend() != "PIL":
        return None, "torchvision's image backend is not PIL"
    tf = dataset.transform
    steps = list(tf.transforms) if type(tf) is T.Compose else [tf]
    kw = {}

    def square(size):
        size = [size] if isinstance(size, int) else list(size)
        return size[0] if len(size) == 1 or size[0] == size[1] else None

    def bilinear(t):
        return t.interpolation in (InterpolationMode.BILINEAR, 2)

    def short_side(size):  # Resize(int) or Resize([int]): the shorter side
        if isinstance(size, int):
            return size
        return size[0] if isinstance(size, (list, tuple)) and len(size) == 1 else None

    i = 0
    if i < len(steps) and type(steps[i]) is T.RandomResizedCrop and bilinear(steps[i]) and \
            square(steps[i].size):
        t = steps[i]
        kw.update(size=square(t.size), crop="random", scale="%r:%r" % tuple(t.scale),
                  ratio="%r:%r" % tuple(t.ratio), flip=0)
        i += 1
    elif i + 1 < len(steps) and type(steps[i]) is T.Resize and \
            type(steps[i + 1]) is T.CenterCrop and bilinear(steps[i]) and \
            short_side(steps[i].size) is not None:
        r, c = short_side(steps[i].size), square(steps[i + 1].size)
        if c is None or steps[i].max_size is not None or r < c:
            return None, "its Resize/CenterCrop is not Resize(int) + a square crop no larger"
        kw.update(size=c, crop="center", resize=r, flip=0)
        i += 2
    else:
        return None, "it does not start with RandomResizedCrop or Resize + CenterCrop"
    if i < len(steps) and type(steps[i]) is T.RandomHorizontalFlip and steps[i].p == 0.5:
        kw["flip"] = 1
        i += 1
    if i < len(steps) and type(steps[i]) is T.ToTensor:
        kw["dtype"] = "float32"
        i += 1
    elif i < len(steps) and type(steps[i]) is T.PILToTensor:
        i += 1
        if i < len(steps) and type(steps[i]) is T.ConvertImageDtype and \
                steps[i].dtype == torch.float32:
            kw["dtype"] = "float32"
            i += 1
    else:
        return None, "it has %r where ferry expects ToTensor or PILToTensor" % (
            steps[i] if i < len(steps) else "nothing",)
    if i < len(steps) and type(steps[i]) is T.Normalize and kw.get("dtype") == "float32":
        mean, std = list(steps[i].mean), list(steps[i].std)
        if len(mean) != 3 or len(std) != 3:
            return None, "its Normalize is not per RGB channel"
        kw.update(mean="%r:%r:%r" % tuple(map(float, mean)),
                  std="%r:%r:%r" % tuple(map(float, std)))
        i += 1
    if i != len(steps):
        return None, "it has a transform ferry does not run in C: %r" % (steps[i],)
    if not _listing_order(dataset.samples, dataset.root, classes):
        return None, "its samples are not the folder's images, labels and order"
    root = os.path.abspath(dataset.root)
    if "," in root:
        return None, "its root has a ',' (a spec cannot name it)"
    return "imagefolder:root=%s,%s" % (root, ",".join("%s=%s" % kv for kv in kw.items())), None


def _listing_order(samples, root, classes):
    """Whether ``samples`` ((path, label), ...) are what make_dataset gives
    for ``root``: each label the index of the class folder its path lies
    in, in make_dataset's order (by label, then folder, then file name).
    With the count checked against ferry's own listing of the folder, that
    makes them the same list: an edited ``samples`` (labels remapped, files
    dropped or reordered) runs in Python."""
    prefixes = [os.path.join(root, c) + os.sep for c in classes]
    prev = None
    try:
        for path, label in samples:
            if type(label) is not int or not 0 <= label < len(prefixes) or \
                    not path.startswith(prefixes[label]):
                return False
            key = (label,) + os.path.split(path)
            if prev is not None and key < prev:
                return False
            prev = key
    except (TypeError, ValueError, AttributeError):
        return False
    return True


class DataLoader(_Closes):
    """torch.utils.data.DataLoader's arguments and defaults, on ferry's
    workers. ferry's own options (``seed``, ``state``, ``placement``,
    ``max_held``, ``on_worker_death``, ...) go by keyword; ``reseed``
    chooses how the workers' random generators are seeded: "batch" (the
    default without a worker_init_fn: before each batch, from the base
    seed, the epoch and the batch, so runs repeat whichever worker builds
    which batch), "sample" (before each item: the same augmentation for
    item i of epoch e whatever the batch size and worker count) or "worker"
    (once per worker, torch's way: base seed + worker id; the default with
    a worker_init_fn, whose own seeding ferry then never overwrites).
    """

    # DataLoader[T] in annotations, as torch's Generic[T_co] class allows.
    __class_getitem__ = classmethod(types.GenericAlias)

    # Set at construction for good, as torch's: an assignment that seemed to
    # work but changed nothing would be a trap.
    _FROZEN = frozenset(("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                         "persistent_workers"))

    def __setattr__(self, name, value):
        if name in DataLoader._FROZEN and self.__dict__.get("_initialized"):
            raise ValueError("%s attribute should not be set after %s is initialized"
                             % (name, type(self).__name__))
        super().__setattr__(name, value)

    @property
    def _auto_collation(self):
        """torch's private attribute (read by torch's own tests): batches
        are collated from batch_size items (batch_size not None)."""
        return self.batch_size is not None

    def __new__(cls, dataset=None, *args, **kwargs):
        if cls is DataLoader and isinstance(dataset, tud.IterableDataset):
            return super().__new__(_IterableDataLoader)
        return super().__new__(cls)

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=_UNSET, pin_memory_device="",
                 in_order=True, reseed=None, native=True, **ferry_options):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError("ferry.torch.DataLoader: the dataset must be map-style (have "
                            "__getitem__ and __len__), not a %s" % type(dataset).__name__)
        dct = ferry_options.pop("dct", 0)
        if dct not in (0, 1, False, True):
            raise ValueError("ferry.torch.DataLoader: dct must be 0 (JPEGs decoded at full "
                             "scale, the default) or 1 (reduced DCT scales), not %r" % (dct,))
        dct = int(dct)
        _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                      multiprocessing_context, pin_memory_device, ferry_options)
        reseed = _default_reseed(reseed, worker_init_fn)

        self._keep_args(dataset, num_workers, prefetch_factor, pin_memory, timeout,
                        worker_init_fn, multiprocessing_context, generator, persistent_workers,
                        in_order, collate_fn, ferry_options.pop("pin_slots", True))

        opts = dict(ferry_options)
        indices = None
        table_over = None  # a user's (batch) sampler: (batches, sampler) for a _SamplerTable
        # torch's argument rules, with torch's messages, in torch's order.
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            if isinstance(batch_sampler, tud.BatchSampler) and _native(batch_sampler.sampler):
                batch_size, drop_last = batch_sampler.batch_size, batch_sampler.drop_last
                sampler = batch_sampler.sampler
            else:
                table_over = (batch_sampler, getattr(batch_sampler, "sampler", batch_sampler))
                batch_size = getattr(batch_sampler, "batch_size", None) or 1
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        self.batch_size = batch_size
        self.drop_last = drop_last
        auto_batch = batch_size is not None
        if shuffle is None:
            shuffle = False
        seeded = "seed" in opts
        # What torch's sampler draws at each iter(), as (generator, n, k):
        # from the global generator when generator is None; n = 0 for one
        # int64 (RandomSampler without a generator), n > 0 for k randperm(n)
        # (torch's RandomSampler makes a second one as its iterator ends).
        self._sampler_draw = None
        if table_over is not None:
            pass
        elif sampler is None or isinstance(sampler, tud.SequentialSampler):
            if shuffle:  # torch makes RandomSampler(dataset, generator=generator)
                self._sampler_draw = (generator, 0 if generator is None else len(dataset), 2)
        elif isinstance(sampler, tud.RandomSampler) and not sampler.replacement and \
                sampler._num_samples is None:
            shuffle = True
            g = sampler.generator
            self._sampler_draw = (g, 0 if g is None else len(sampler.data_source), 2)
        elif isinstance(sampler, tud.SubsetRandomSampler):
            indices = np.asarray(list(sampler.indices), dtype=np.int64)
            shuffle = True
            self._sampler_draw = (sampler.generator, len(indices), 1)
        elif isinstance(sampler, tud.distributed.DistributedSampler):
            opts.setdefault("rank", sampler.rank)
            opts.setdefault("world", sampler.num_replicas)
            shuffle = sampler.shuffle
            if not seeded:
                opts["seed"] = sampler.seed
                seeded = True
            # Its drop_last trims the shards to n // world (ferry's shards
            # without padding); padded, as by default, like ferry's.
            opts.setdefault("pad_shards", not sampler.drop_last)
        elif isinstance(sampler, (list, tuple, range, np.ndarray)):
            indices = np.asarray(sampler, dtype=np.int64).reshape(-1)
        elif table_over is None:
            if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
                raise TypeError("ferry.torch.DataLoader: a sampler must be iterable and have "
                                "len(), not a %s" % type(sampler).__name__)
            batches = (tud.BatchSampler(sampler, batch_size, drop_last) if auto_batch
                       else _Singles(sampler))
            table_over = (batches, sampler)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._sampler_epoch0 = int(getattr(sampler, "epoch", 0) or 0)
        self._follows_set_epoch = False
        if indices is not None:
            n = len(dataset)
            bad = indices[(indices < 0) | (indices >= n)]
            if len(bad):
                raise IndexError("ferry.torch.DataLoader: the sampler gives index %d, but the "
                                 "dataset has %d items" % (int(bad[0]), n))
            if len(indices) == 0:
                raise ValueError("ferry.torch.DataLoader: the sampler gives no indices")

        # The base seed, drawn as torch draws it (_torch_draws): from
        # `generator`, else from torch's global generator, at iter(), not
        # here (so torch.manual_seed(s) before the loader makes runs
        # repeat, and a model built after the loader gets the weights it
        # gets under torch). With seed= given, that is the base seed. A
        # resume state carries the base seed it was saved with.
        base_seed = None
        saved = opts.get("state")
        if isinstance(saved, dict) and "base_seed" in saved:
            base_seed = int(saved["base_seed"])
        elif seeded:
            base_seed = int(opts["seed"]) % 2**63
        if base_seed is not None and not seeded:
            opts["seed"] = base_seed
        self._base_seed = base_seed

        self._table = None
        if table_over is not None:
            # ferry runs over the sampler's batches, one position each.
            nb = len(table_over[0])
            if nb == 0:
                raise ValueError("ferry.torch.DataLoader: the sampler gives no batches")
            # The window, set here: the table is drawn far enough ahead for it.
            window = int(opts.get("prefetch") or
                         max(2, 2 * max(1, self.num_workers) * (prefetch_factor or 1)))
            opts["prefetch"] = window
            self._table = _SamplerTable(table_over[0], table_over[1], nb,
                                        -(-window // nb) + 1, len(dataset))
            opts["shuffle"], opts["drop_last"], opts["batch_size"] = False, False, 1
        self._next_epoch = 0
        self._mid_epoch = False  # a `for` stopped inside an epoch
        self._batches = _Batches(dataset, indices, collate_fn, auto_batch, base_seed, reseed,
                                 worker_init_fn, self.num_workers, os.getpid(), self._table)
        self._batches.timeout = timeout  # item 0's build at the workers' start too
        opts.setdefault("shuffle", bool(shuffle))
        opts.setdefault("drop_last", bool(drop_last) if auto_batch else False)
        opts.setdefault("batch_size", batch_size if auto_batch else 1)
        # num_workers=0: the batches are made in the caller's thread when
        # asked for, as torch's are; a ferry loader over a stand-in dataset
        # of the same length gives the indices (the same order, epochs and
        # resume state as with workers). placement="thread" asks for ferry's
        # thread worker instead (it prefetches).
        self._sync = self.num_workers == 0 and "placement" not in opts and \
            "worker_mode" not in opts
        if self.num_workers == 0:
            opts.setdefault("placement", "thread")
            opts.setdefault("workers", 1)
        else:
            opts.setdefault("workers", self.num_workers)
            if prefetch_factor is not None:
                opts.setdefault("prefetch", max(1, int(prefetch_factor) * self.num_workers))
        opts.setdefault("in_order", bool(in_order))
        self._opts = opts
        self._loader = None
        self._pins = None  # pin_memory's registered slots (_SlotPins)
        # torchvision's ImageFolder with a transform ferry has in C: the
        # workers decode and crop in C, no Python at all.
        self._native = None
        if native and not self._sync and self._table is None and indices is None and \
                auto_batch and collate_fn is None and worker_init_fn is None:
            self._native, why = _native_imagefolder(dataset)
            if self._native is not None:
                # Full-scale JPEG decoding: torchvision's pixels within 1 of
                # 255. The reduced DCT scales (dct=1, ferry's own imagefolder
                # default) differ by up to ~60 on sharp edges: asked for only.
                self._native += ",dct=%d" % dct
            if self._native is not None:
                _notice_once("native " + self._native,
                             "%s with its transform runs in C (%s); native=False runs "
                             "torchvision's code in Python" % (type(dataset).__name__,
                                                               self._native))
            elif why:
                _notice_once("python " + why, "%s runs in Python: %s" % (
                    type(dataset).__name__, why))
        self._initialized = True

    def _keep_args(self, dataset, num_workers, prefetch_factor, pin_memory, timeout,
                   worker_init_fn, multiprocessing_context, generator, persistent_workers,
                   in_order, collate_fn, pin_slots):
        """torch's DataLoader attributes of the same names (and ferry's
        pin_slots: False copies each batch into pinned memory, as torch does,
        instead of page-locking the batch slots once)."""
        self.dataset = dataset
        self.num_workers = int(num_workers)
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory)
        if self.pin_memory and not torch.cuda.is_available():
            _warn_once("pin", "pin_memory=True, but CUDA is not available: nothing is pinned")
            self.pin_memory = False
        self._pin_slots = bool(pin_slots)
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.persistent_workers = bool(persistent_workers)
        self.in_order = in_order
        self.collate_fn = collate_fn

    # -- the ferry loader, made at the first iteration (torch starts its
    # workers there too)
    def _ferry(self):
        if self._loader is None:
            if self._base_seed is None:  # asked for before any iter()
                self._set_base_seed(int(torch.empty((), dtype=torch.int64).random_(
                    generator=self.generator).item()))
            state = self._opts.get("state")
            if isinstance(state, dict):
                self._next_epoch = int(state.get("epoch", 0))
            if self._table is not None:
                if state is not None or self._table.written >= 0:
                    self._table.skip_to(self._next_epoch, (state or {}).get("sampler"))
                self._table.fill_to(self._next_epoch + self._table.ahead)
                # A position is a whole batch: what fields reserve scales.
                self._batches.item_scale = self._table.max_len
            self._mid_epoch = False
            if self._sync:
                opts = dict(self._opts)
                opts["prefetch"] = 1
                self._loader = Loader("synthetic:n=%d,dim=1" % len(self._batches), **opts)
            elif self._native is not None:
                ld = Loader(self._native, **self._opts)
                if ld.num_items != len(self.dataset):  # its samples were changed
                    ld.close()
                    logging.getLogger("ferry").info(
                        "ferry.torch.DataLoader: the folder holds %d images, the dataset %d: "
                        "it runs in Python", ld.num_items, len(self.dataset))
                    self._native = None
                    return self._ferry()
                self._loader = ld
            else:
                self._loader = Loader(self._batches, **self._opts)
            self._watch_slots()
        return self._loader

    def _watch_slots(self):
        """pin_memory's slot registrations (_SlotPins) for the loader just made."""
        pin = self.pin_memory and self._pin_slots and not getattr(self, "_sync", False)
        self._pins = _SlotPins(self._loader) if pin else None

    def _pinned(self, b, out):
        """Batch b's structure `out` in pinned memory: as it is where b's slot
        is registered, copied (as torch does) where not."""
        if self._pins is not None:
            self._pins.pin(b)
        return _tcollate_pin(out)

    def __len__(self):
        if self._loader is not None:
            return len(self._loader)
        n = len(self._batches)
        world = int(self._opts.get("world", self._opts.get("world_size", 1)) or 1)
        if world > 1:  # each rank's share: padded up (pad_shards) or cut down
            pad = self._opts.get("pad_shards", True) and not self._opts.get("drop_last")
            n = -(-n // world) if pad else n // world
        if self.batch_size is None:
            return n
        bs = self._opts["batch_size"]
        return n // bs if self._opts["drop_last"] else -(-n // bs)

    def __iter__(self):
        """One epoch of batches. A `for` left early (a break, a peek with
        next(iter(loader))) leaves the rest of its epoch behind, as torch's
        does: the next `for` starts a new epoch. A batch the dataset failed
        on raises its error from next(), and the next call goes on with the
        batches after it, as torch's iterator does."""
        self._torch_draws()
        self._follow_set_epoch()
        return _MapEpoch(self)

    def _follow_set_epoch(self):
        """A DistributedSampler's set_epoch(e), called by the script before
        its `for` (as torch's docs ask), decides the epoch that `for` gets,
        as it does with torch: a script that resumes at epoch 5 gets epoch
        5's order, not ferry's next. When e is the epoch ferry would give
        anyway (the usual loop), nothing happens; else the loader starts
        again at e's first batch (its workers restarted). Until the script
        first changes the sampler's epoch, ferry's epochs follow on from
        each other (a script that never calls set_epoch gets a new order
        each epoch, where torch's repeats the first)."""
        s = self.sampler
        if not isinstance(s, tud.distributed.DistributedSampler):
            return
        want = int(getattr(s, "epoch", 0))
        if not self._follows_set_epoch:
            if want == self._sampler_epoch0:
                return
            self._follows_set_epoch = True
        if want == self._next_epoch and not self._mid_epoch:
            return
        ld = self._ferry()
        state = ld.state_at_epoch(want)
        state.update(epoch=want, base_seed=self._base_seed)
        self.load_state_dict(state)
        self._next_epoch = want
        self._mid_epoch = False

    def _torch_draws(self):
        """What torch's DataLoader draws from the generators at each iter():
        its base seed from `generator` (the global one when None), then its
        sampler's draw (RandomSampler's seed, or a randperm). The first base
        seed is ferry's, unless seed= or a state fixed it; the others are
        drawn and dropped, so that the training step's draws after each
        iter() are the ones it gets under torch. (A sampler of the user's
        is iterated ahead, when ferry needs its batches: its draws do not
        fall where torch's do.)"""
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        perm = None
        if self._sampler_draw is not None:
            g, n, k = self._sampler_draw
            if n:
                perm = torch.randperm(n, generator=g)
                for _ in range(k - 1):
                    torch.randperm(n, generator=g)
            else:
                torch.empty((), dtype=torch.int64).random_()
        if self._base_seed is None:
            if perm is not None and self._sampler_draw[0] is not None and \
                    "seed" not in self._opts:
                # A sampler with a generator of its own: the order follows
                # that generator, as torch's does (one seed from its draw).
                digest = hashlib.blake2b(perm.numpy().tobytes(), digest_size=8).digest()
                self._opts["seed"] = int.from_bytes(digest, "little") % 2**63
            self._set_base_seed(drawn)

    def _set_base_seed(self, seed):
        self._base_seed = seed
        self._batches.base_seed = seed
        self._opts.setdefault("seed", seed)

    def _begin_epoch(self):
        """The ferry epoch iterator of a new `for`: what a `for` left early
        left of its epoch is drained first. Returns (iterator, epoch)."""
        ld = self._ferry()
        timeout = self.timeout if self.timeout and self.timeout > 0 else None
        if self._table is not None:  # the sampler's epochs the window may reach
            self._table.fill_to(self._next_epoch + self._table.ahead)
        if self._mid_epoch:  # the epoch in progress is _next_epoch
            drain = _Epoch(ld, timeout)
            while True:
                try:
                    next(drain)
                except StopIteration:
                    break
                except BatchError:  # a failed batch of the epoch left behind
                    continue
                except NotReady:
                    raise RuntimeError("DataLoader timed out after %s seconds"
                                       % self.timeout) from None
            self._next_epoch += 1
            self._mid_epoch = False
            if self._table is not None:
                self._table.fill_to(self._next_epoch + self._table.ahead)
        return _Epoch(ld, timeout), self._next_epoch

    def _structure(self, b):
        if self._native is not None:  # default_collate's [images, labels], on the slot
            out = [torch.from_numpy(b["image"]), torch.from_numpy(b["label"])]
        elif self._sync:  # b holds indices only: the batch is made here, now
            out = self._batches.build(b.indices.astype(np.int64), b.epoch)
        else:
            fields = [b._arrays[n] for n in b._names]
            out = _load_structure(fields[-1], fields)
        return self._pinned(b, out) if self.pin_memory else out

    # -- ferry's extras
    def state_dict(self):
        """The position after the last batch delivered: pass it as
        ``state=`` to a new DataLoader (or to :meth:`load_state_dict`) to go
        on from there, exactly."""
        out = self._ferry().state_dict()
        out["epoch"] = self._next_epoch
        out["base_seed"] = self._base_seed
        if self._table is not None:
            out["sampler"] = self._table.states.get(self._next_epoch)
        return out

    def load_state_dict(self, state):
        self.close_workers()
        self._opts["state"] = state

    def stats(self):
        out = self._ferry().stats()
        if self._pins is not None:
            out.update(self._pins.stats())
        return out

    def close_workers(self):
        if self._loader is not None:
            self._loader.close()
            self._loader = None
            self._pins = None

    def close(self):
        """Stops the workers (also done at exit and when collected)."""
        self.close_workers()
        if getattr(self, "_batches", None) is not None:
            self._batches.close()  # the table files num_workers=0 opened here
        if getattr(self, "_table", None) is not None:
            self._table.close()
            self._table = None


# What inspect.signature() and help() show: torch's own DataLoader's, as
# the installed torch has it (ferry's extras, in_order, reseed, native, dct
# and the ferry options, go by keyword: see the class's docstring).
DataLoader.__signature__ = inspect.signature(tud.DataLoader)


class _IterableDataLoader(DataLoader):
    """DataLoader over an IterableDataset (DataLoader() makes one): each
    worker iterates its own copy, sharded by get_worker_info() as in torch,
    and collates its batches; a `for` hands them out round-robin over the
    workers whose iterators have not ended, as torch's does, until every
    one has ended. The workers go on into the next epoch meanwhile (a few
    batches each). Task s is made by worker s % num_workers (the loader's
    pin_tasks); _StreamTable says which batch of which epoch it is."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=_UNSET, pin_memory_device="",
                 in_order=True, reseed=None, **ferry_options):
        # torch's rules for an IterableDataset, with torch's messages.
        if shuffle not in {False, None}:
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                             "option, but got shuffle=%s" % (shuffle,))
        if sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                             "option, but got sampler=%s" % (sampler,))
        if batch_sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified "
                             "batch_sampler option, but got batch_sampler=%s" % (batch_sampler,))
        if batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                      multiprocessing_context, pin_memory_device, ferry_options)
        reseed = _default_reseed(reseed, worker_init_fn)
        for key in ("rank", "world", "world_size", "pad_shards", "max_batches", "epochs"):
            if key in ferry_options:
                raise TypeError("ferry.torch.DataLoader: option %r does not apply to an "
                                "IterableDataset, which shards itself (get_worker_info()) "
                                "and ends its epochs itself" % key)
        if "state" in ferry_options:
            raise NotImplementedError("ferry.torch.DataLoader: an IterableDataset's stream "
                                      "cannot be resumed (ferry does not know where a user's "
                                      "iterator stands); resume needs a map-style dataset")
        self._keep_args(dataset, num_workers, prefetch_factor, pin_memory, timeout,
                        worker_init_fn, multiprocessing_context, generator, persistent_workers,
                        in_order, collate_fn, ferry_options.pop("pin_slots", True))
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = self.batch_sampler = None
        opts = dict(ferry_options)
        if "seed" in opts:
            base_seed = int(opts["seed"]) % 2**63
        else:
            base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self._base_seed = base_seed
        w = self.num_workers
        self._table = _StreamTable(w) if w else None
        self._batches = _StreamBatches(dataset, None, collate_fn, batch_size is not None,
                                       base_seed, reseed, worker_init_fn, w, os.getpid())
        self._batches.batch_size = batch_size
        self._batches.drop_last = bool(drop_last)
        self._batches.table_ref = self._table.ref() if self._table else None
        self._window = max(w, int(prefetch_factor if prefetch_factor is not None else 2) * w)
        opts.update(workers=w, pin_tasks=True, batch_size=1, shuffle=False, drop_last=False,
                    epochs=0, in_order=True, seed=base_seed, prefetch=max(1, self._window))
        self._opts = opts
        self._loader = None
        self._pins = None  # pin_memory's registered slots (_SlotPins)
        self._seq = 0            # the next task's seq: delivered in order
        self._epoch = 0          # the epoch the next `for` hands out
        self._mid_epoch = False
        self._queues = [collections.deque() for _ in range(w)]  # this epoch's, per worker
        self._ended = set()      # workers whose iterator ended this epoch
        self._future = {}        # epoch -> ([deque per worker], set of ended workers)
        self._turn = 0           # whose batch comes next (round-robin)
        self._initialized = True

    def __len__(self):
        self._len_said = self._len_value()
        return self._len_said

    def _len_value(self):
        # torch's: the dataset's len() (a TypeError without one) in batches.
        n = len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _ferry(self):
        if self._loader is None:
            if self._table is None or self._seq:
                self._fresh_stream()
            # Every task the window can send has its entry before any is sent.
            self._table.write_to(self._window + self.num_workers)
            self._loader = Loader(self._batches, **self._opts)
            self._watch_slots()
        return self._loader

    def _fresh_stream(self):
        """A new loader's stream (after close_workers() or close()): task 0
        again, the workers' iterators started afresh at the next epoch."""
        if self._table is not None:
            self._table.close()
        if self._mid_epoch:
            self._mid_epoch = False
            self._epoch += 1
        t = self._table = _StreamTable(self.num_workers)
        t.trainer_epoch = self._epoch
        t.epoch = [self._epoch] * self.num_workers
        self._batches.table_ref = t.ref()
        self._seq = 0
        self._queues = [collections.deque() for _ in range(self.num_workers)]
        self._ended, self._future, self._turn = set(), {}, 0

    def _later(self, epoch):
        return self._future.setdefault(
            epoch, ([collections.deque() for _ in range(self.num_workers)], set()))

    def _pull(self, timeout):
        """Reads the next task's result and files it under its worker and
        epoch."""
        ld = self._ferry()
        s = self._seq
        self._table.write_to(s + self._window + self.num_workers)
        try:
            b, err = ld._next(timeout), None
        except BatchError as e:
            b, err = None, e
        if b is None and err is None:
            raise RuntimeError("ferry.torch.DataLoader: the stream ended")
        self._seq += 1
        w = s % self.num_workers
        epoch, kin = self._table.entries.pop(s)
        if kin < 0 or epoch < self._epoch:
            return  # an idle task, or one of an epoch left behind
        if err is not None:  # ferry's index and position mean nothing to a stream
            err.index, err.epoch, err.batch_in_epoch = None, epoch, kin
            err.detail = re.sub(r"failed on index \d+ \(epoch \d+, batch \d+\)",
                                "failed on batch %d of its stream's epoch %d" % (kin, epoch),
                                err.detail, count=1)
            err.args = (err.detail,) + err.args[1:]
        if err is None:
            res = self._structure(b)
            if res[0] == "end":
                self._table.ended(w, epoch)
                (self._ended if epoch == self._epoch else self._later(epoch)[1]).add(w)
                return
            item = res[3]
        else:
            item = err
        if epoch == self._epoch:
            self._queues[w].append(item)
        elif epoch > self._epoch:
            self._later(epoch)[0][w].append(item)

    def _structure(self, b):
        fields = [b._arrays[n] for n in b._names]
        res = _load_structure(fields[0], fields)  # _StreamBatches: the structure first
        if res[0] == "b" and self.pin_memory:
            res = res[:3] + (self._pinned(b, res[3]),)
        return res

    def _next_item(self, timeout):
        """The epoch's next batch (or failure), round-robin over the workers
        not yet ended; None once every one has."""
        nw = self.num_workers
        while True:
            live = [w for w in range(nw) if self._queues[w] or w not in self._ended]
            if not live:
                return None
            w = min(live, key=lambda x: (x - self._turn) % nw)
            while not self._queues[w] and w not in self._ended:
                self._pull(timeout)
            if self._queues[w]:
                self._turn = (w + 1) % nw
                return self._queues[w].popleft()

    def _leave_epoch(self):
        """The rest of the current epoch is dropped (a `for` left early, as
        torch's iterator is): workers still in it start the next one with
        their next task, and what the epoch still brings is dropped when it
        comes. An endless stream or one that keeps failing can thus move on."""
        for w in range(self.num_workers):
            if self._table.epoch[w] <= self._epoch:
                self._table.epoch[w] = self._epoch + 1
                self._table.next_k[w] = 0
        self._next_epoch()

    def _next_epoch(self):
        self._epoch += 1
        self._table.trainer_epoch = self._epoch
        queues, ended = self._future.pop(self._epoch, (None, set()))
        self._queues = queues or [collections.deque() for _ in range(self.num_workers)]
        self._ended = ended
        self._turn = 0

    def _sync_epoch(self):
        """num_workers=0: the dataset iterated here, as torch does."""
        n = self.batch_size if self.batch_size is not None else 1
        it = iter(self.dataset)
        while True:
            items = list(itertools.islice(it, n))
            if not items or (self.drop_last and len(items) < n):
                return
            out = self._batches._user_batch(items)
            yield _tcollate_pin(out) if self.pin_memory else out

    def __iter__(self):
        """One epoch: every worker's stream to its end. torch's warning, with
        each batch past what len(loader) said (once it was asked before this
        epoch began)."""
        said, n = getattr(self, "_len_said", None), 0
        for b in self._epoch_batches():
            n += 1
            if said is not None and n > said:
                warnings.warn(
                    "ferry.torch.DataLoader: length of IterableDataset %s was reported to be "
                    "%d (when accessing len(dataloader)), but %d samples have been fetched. "
                    "For multiprocessing data-loading, this is most often each worker yielding "
                    "the whole dataset: shard it by get_worker_info()"
                    % (type(self.dataset).__name__, said, n), UserWarning, stacklevel=2)
            yield b

    def _epoch_batches(self):
        if not self.num_workers:
            yield from self._sync_epoch()
            return
        timeout = self.timeout if self.timeout and self.timeout > 0 else None
        self._ferry()
        if self._mid_epoch:  # a `for` left early: its epoch is left behind, at once
            self._leave_epoch()
        try:
            self._mid_epoch = True
            while True:
                item = self._next_item(timeout)
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        except NotReady:
            raise RuntimeError("DataLoader timed out after %s seconds" % self.timeout) from None
        self._mid_epoch = False
        self._next_epoch()

    def state_dict(self):
        raise NotImplementedError("ferry.torch.DataLoader: an IterableDataset's stream cannot "
                                  "be saved for a resume")

    def load_state_dict(self, state):
        self.state_dict()

    def stats(self):
        return self._ferry().stats() if self.num_workers else {}

    def close(self):
        self.close_workers()
        if getattr(self, "_table", None) is not None:
            self._table.close()
            self._table = None


class _MapEpoch:
    """The iterator of one epoch of a map-style DataLoader (what
    ``iter(loader)`` returns). As torch's, it starts the workers when made
    (the loader's first iter()). A failed batch raises its error and leaves
    the iterator usable: the next call returns the batch after it, as
    torch's does (a generator would end at the first error, and a loop that
    skips a bad batch would lose the rest of its epoch silently)."""

    __slots__ = ("_dl", "_it", "_epoch")

    def __init__(self, dl):
        self._dl = dl
        with _as_torch_says(dl):
            self._it, self._epoch = dl._begin_epoch()

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._dl)

    @property
    def _workers(self):
        """torch's private attribute (read by torch's own tests): the worker
        processes, each with pid, is_alive() and join(timeout)."""
        ld = self._dl._loader
        if ld is None or self._dl._sync:
            return []
        pids = [ld.worker_pid(i) for i in range(self._dl.num_workers)]
        return [_WorkerProcess(p) for p in pids if p]

    def __next__(self):
        dl = self._dl
        try:
            with _as_torch_says(dl):
                b = next(self._it)
        except BatchError:
            # The failure took a batch's place: the epoch ends there if it
            # was the last one.
            done = self._it._done
            dl._mid_epoch = not done
            if done:
                dl._next_epoch = self._epoch + 1
            raise
        dl._next_epoch = b.epoch + 1 if b.last_in_epoch else b.epoch
        dl._mid_epoch = not b.last_in_epoch
        return dl._structure(b)


@contextlib.contextmanager
def _as_torch_says(dl):
    """ferry's errors as torch's DataLoader raises them: a timeout as its
    RuntimeError, a worker's death with its sentence first."""
    try:
        yield
    except NotReady:
        raise RuntimeError("DataLoader timed out after %s seconds" % dl.timeout) from None
    except DatasetError as e:
        if _ProbeTimedOut.MARK in str(e):  # item 0, at the workers' start (_probe_deadline)
            raise RuntimeError("DataLoader timed out after %s seconds" % dl.timeout) from None
        raise
    except (WorkerError, BatchLost) as e:
        said = e.torch_sentence()
        if said and not str(e).startswith(said):
            e.args = ("%s %s" % (said, e.args[0] if e.args else ""),)
        raise


class _WorkerProcess:
    """A worker process as torch's tests look at one (multiprocessing's
    Process API, in part): pid, is_alive(), join(timeout)."""

    def __init__(self, pid):
        self.pid = pid

    def is_alive(self):
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False

    def join(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)  # another process's exit: nothing to wait on but /proc


class _Singles:
    """A sampler's indices as batches of one (batch_size=None)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        return ([i] for i in self.sampler)

    def __len__(self):
        return len(self.sampler)


def _native(sampler):
    """Whether ferry's own index stream does what `sampler` does."""
    return sampler is None or isinstance(sampler, (
        tud.SequentialSampler, tud.SubsetRandomSampler, tud.distributed.DistributedSampler,
        list, tuple, range, np.ndarray)) or (
        isinstance(sampler, tud.RandomSampler) and not sampler.replacement and
        sampler._num_samples is None)


def _tcollate_pin(obj):
    """torch's pin_memory: a copy into pinned memory for each tensor, but
    a tensor already in page-locked memory (a registered slot) is itself."""
    from torch.utils.data._utils.pin_memory import pin_memory
    return pin_memory(obj)


class _SlotPins:
    """pin_memory=True without a copy per batch: each batch slot that a
    batch arrives in is page-locked once (cudaHostRegister, through torch),
    and every later batch in that slot is pinned memory as it arrives, so
    `x.cuda(non_blocking=True)` copies by DMA straight from where the worker
    wrote it. torch's pin thread instead copies every batch into its pinned
    allocator's memory.

    A slot is reused once its batch is released. With a non_blocking copy
    still running, that would let a worker overwrite bytes the copy has not
    read yet: so a batch in a slot does not give its slot back when it dies
    but hands it here, with an event recorded on the current CUDA stream
    (where `x.cuda(non_blocking=True)` or `x.to(device, non_blocking=True)`
    has just queued the copy), and the slot goes back once that event has
    completed (looked at before each batch, and at close). A copy queued on
    another stream must be on the current stream, or that stream, when the
    batch's last tensor goes: the same rule as torch's
    `Tensor.record_stream` for the memory of its caching allocator.

    Batches that did not come in a slot (remote workers', or every slot
    taken) are copied into pinned memory as torch does. Slots keep their
    memory once used (ferry_loader_keep_slots): page-locked pages cannot be
    given back while registered. Everything is unregistered, after the
    device has finished, before the loader closes."""

    def __init__(self, loader):
        self._cudart = torch.cuda.cudart()
        self._slots = {}  # address -> bytes, registered
        self._pending = collections.deque()  # (event, SlotHold)
        self._off = None  # why slots are not registered (copies then)
        c = loader._c
        c.keep_slots()
        c.release_hook = self._hold
        c.before_close = self.close

    def pin(self, batch):
        """Registers the slot `batch` (a ferry.Batch) lies in, if it is the
        first batch there."""
        self._poll()
        slot = batch._b.slot() if batch._b is not None else None
        if slot is None or self._off or slot[0] in self._slots:
            return
        rc = int(self._cudart.cudaHostRegister(slot[0], slot[1], 1))  # 1: Portable
        if rc:
            self._off = "cudaHostRegister of a %d-byte batch slot failed (cudaError %d)" % (
                slot[1], rc)
            _warn_once("pin-slots", "pin_memory=True: %s; batches are copied into pinned "
                       "memory instead, as torch's DataLoader does" % self._off)
            return
        self._slots[slot[0]] = slot[1]

    def _hold(self, hold):
        if not self._slots:  # nothing registered: nothing to wait for
            return
        try:
            event = torch.cuda.current_stream().record_event()
        except Exception:  # CUDA gone (interpreter exit): the slot goes back now
            return
        self._pending.append((event, hold))

    def _poll(self):
        p = self._pending
        while p and p[0][0].query():
            p.popleft()

    def stats(self):
        return {"pinned_slots": len(self._slots), "pinned_bytes": sum(self._slots.values()),
                "slots_awaiting_copy": len(self._pending)}

    def close(self):
        """Before the loader closes: the device's copies end, every slot
        goes back and is unregistered (a batch still held after this is
        plain memory). A batch dying meanwhile (the waits let other
        threads run) joins the queue and is waited for too."""
        try:
            while self._pending:  # copies to any device
                self._pending[0][0].synchronize()
                self._pending.popleft()
            if self._slots:
                torch.cuda.synchronize()  # and those from batches still held
        except Exception:  # CUDA failed or is gone (interpreter exit): no copy can run
            pass
        finally:
            slots, self._slots = self._slots, {}
            self._pending.clear()
            for addr in slots:
                try:
                    self._cudart.cudaHostUnregister(addr)
                except Exception:
                    pass
            self._off = self._off or "the loader is closed"


