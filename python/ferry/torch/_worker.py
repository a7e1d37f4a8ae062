"""The worker side of a map-style DataLoader: what ferry's Python workers
are given, and how each makes a batch.

_Batches holds the user's dataset with what makes its batches
(collate_fn, the seeding, worker_init_fn); it is pickled once, in the
trainer, and a worker's life with it reads top to bottom here:

  1. the clean parent unpickles it and asks for the batch's fields
     (__ferry_fields__): item 0 is built and collated once to learn each
     numeric leaf's dtype and shape, under the DataLoader's timeout
     (_probe_deadline), with torch's get_worker_info() answering as in
     worker 0 (_probing); the item may be kept for worker 0's first batch
     (_probe_item);
  2. the clean parent forks the workers and drops its kept item
     (__ferry_forget_first__);
  3. each worker, at its first batch, seeds torch's, numpy's and
     random's generators as torch does, sets torch's worker info and
     calls worker_init_fn (_start);
  4. each batch is filled (__ferry_fill__): reseeded as `reseed` says,
     its items built and written into their rows, collated into the
     slot (_collate), its structure pickled (_structure).

With num_workers=0 the trainer's own thread calls build() instead: the
batch made as torch's DataLoader makes it there. The stream of an
IterableDataset (_iterable._StreamBatches) is a _Batches too.
"""

import contextlib
import io
import os
import random
import threading

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as _tcollate

from .. import _dataset, _ferry, _handoff
from ._collate import _collate, _to_rows, _torch_worker_info, _walk_arrays
from ._sampler import key_from
from ._structure import _SKELETON, _Pickler

_MAX_DATA_FIELDS = 15    # ferry's 16 fields, less the structure's
_RESERVE_MAX = 1 << 30   # bytes per item a field of variable shape may reserve


class _Batches:
    """What the workers are given: the user's dataset with how to make its
    batches (collate_fn, seeding, worker_init_fn). ferry's Python worker
    asks it for its fields (``__ferry_fields__``) and has it fill each
    batch (``__ferry_fill__``)."""

    def __init__(self, dataset, indices, collate_fn, auto_batch, base_seed, reseed,
                 worker_init_fn, num_workers, trainer_pid, table=None):
        self.dataset = dataset
        self.indices = indices
        # A sampler of the user's (its table in this process): the loader
        # is fed its batches, whose first index is not position 0.
        self.table = table
        self.fed = table is not None
        # batch_size=None with a sampler whose keys are sequences of
        # indices (a bulk-loading sampler): the dataset is indexed with the
        # key itself, one call a batch (_sampler._Singles); None: int keys.
        self.key_kind = None
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
        for k in ("_started", "_fixed", "_var", "_kept"):
            state.pop(k, None)
        return state

    def __len__(self):
        return len(self.indices) if self.indices is not None else len(self.dataset)

    def build(self, positions, epoch):
        """num_workers=0: the batch at `positions`, made in the caller's
        thread as torch's DataLoader makes it there (nothing seeded, the
        dataset's exceptions raised as they are)."""
        if self.key_kind is not None:
            return self._user_batch([self._bulk(positions)])
        return self._user_batch([self._item(i) for i in positions])

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

    def __getitem__(self, i):
        return self._item(i)

    # -- worker side
    def _bulk(self, indices):
        """The item of a bulk-loading sampler's key (see key_kind)."""
        try:
            return self.dataset[key_from(self.key_kind, indices)]
        except BaseException as e:
            try:
                e._ferry_index = int(indices[0])
            except (AttributeError, TypeError):
                pass
            raise

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
        if _handoff.holds_inherited() and os.getpid() != self.trainer_pid:
            # A dataset sharing a Barrier, a Semaphore or a counter with the
            # trainer may count on items being built in workers only, as
            # torch builds them: no probe in the clean parent (a barrier of
            # num_workers would never open there); batches travel in the
            # structure.
            self._fields = [(_SKELETON, _dataset._DTYPES["|u1"], None, 256)]
            return self._fields
        # (in a clean parent, in a throwaway fork of it: _dataset.probed)
        self._fixed, self._var, fields, kept = _dataset.probed(
            self._probe_fields, lambda out: out[:3] + (None,))
        if kept is not None:
            self._kept = kept
        fields.append((_SKELETON, _dataset._DTYPES["|u1"], None, 256))
        self._fields = fields
        return fields

    def _probe_fields(self):
        """(fixed, var, fields, kept item or None) from item 0 (see
        __ferry_fields__)."""
        self._fixed = {}
        self._var = {}
        fields = []
        with _probing(self) as reads, _probe_deadline(self):
            try:
                if self.key_kind is not None:  # no item 0 to ask for: the structure only
                    raise LookupError
                item = self._probe_item(reads)
                if self.collate_fn is None and self.auto_batch:
                    leaves = []
                    _collate([item], self._fixed, probe=leaves)
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
                    for dt, nbytes in sizes[:_MAX_DATA_FIELDS]:
                        self._var[len(fields)] = dt
                        reserve = min(_RESERVE_MAX, max(64, nbytes + nbytes // 4))
                        fields.append(("%d" % len(fields), _dataset._DTYPES[dt.str], None,
                                       reserve))
            except Exception:  # noqa: BLE001 - each batch meets it and says so
                self._fixed, self._var, fields = {}, {}, []
        return self._fixed, self._var, fields, self.__dict__.pop("_kept", None)

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
                or not self.auto_batch or self.fed):
            return self._item(0)
        asked = _dataset._info_asked[0]
        saved = _rng_states()
        state = _dataset.shallow_state(self.dataset)
        try:
            if self.reseed in ("batch", "sample"):
                self._seed(_ferry.sample_seed(self.base_seed, 0, 0))
            before = _dataset._global_rngs()
            item = self._item(0)
            drew = _dataset._global_rngs() != before
            after = _rng_states()  # where the batch's next item goes on drawing from
        finally:
            _set_rng_states(saved)  # the process's generators as they were
        if _dataset.shallow_state(self.dataset) != state:
            return item  # building it changed the dataset: worker 0 builds its own
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


    def __ferry_fill__(self, indices, epoch, views):
        self._start()
        if self._fields is None:
            self.__ferry_fields__()
        if self.reseed == "batch":  # the batch's first index (or position) names it
            self._seed(_ferry.sample_seed(self.base_seed, int(epoch), int(indices[0])))
        first = self._reuse_first(indices, epoch) if "_kept" in self.__dict__ else None
        count = len(indices)
        nf = len(self._fields)
        out = [None] * nf
        arrays = {}
        for f, dt, shape in self._fixed.values():
            arrays[f] = np.frombuffer(views[f], dtype=dt).reshape((count,) + shape)
        items, outline = [], [None]  # the batch's first item's, for _to_rows
        if self.key_kind is not None:  # one key, the dataset indexed with it as it is
            items.append(self._bulk(indices))
            indices = ()
        for k, i in enumerate(indices):
            if self.reseed == "sample":
                self._seed(_ferry.sample_seed(self.base_seed, int(epoch), int(i)))
            item = first if k == 0 and first is not None else self._item(i)
            items.append(_to_rows(item, k, self._fixed, arrays, outline) if arrays else item)
        if arrays:
            result = _collate(items, self._fixed, views=arrays)
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
