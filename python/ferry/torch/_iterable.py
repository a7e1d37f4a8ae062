"""An IterableDataset's stream: the DataLoader that DataLoader() makes for
one, and what its workers are given.

Each worker iterates its own copy of the dataset (sharded by
get_worker_info(), as in torch), one epoch after another, and collates
its batches (_StreamBatches, in the worker). Task s of the loader's
endless stream is made by worker s % num_workers (pin_tasks), and the
trainer feeds each task a tag that says which batch of which epoch it
stands for (_StreamTable). The trainer (_IterableDataLoader) files what
comes back by worker and epoch and hands it out round-robin over the
workers not yet ended, as torch's DataLoader does, while the workers go
on into the next epoch (a few batches each).
"""

import collections
import io
import itertools
import os
import re
import warnings

import numpy as np
import torch

from .. import Loader, _dataset, _ferry
from .._errors import BatchError, NotReady
from ._args import _UNSET, translate_iterable
from ._dataloader import DataLoader, _EpochIterator
from ._once import _warn_once
from ._pin import _tcollate_pin
from ._structure import _SKELETON, _load_structure, _Pickler
from ._worker import _Batches


class _StreamTable:
    """For an IterableDataset: which batch of whose iterator each task
    stands for. Task seq s is made by worker w = s % W (the loader's
    pin_tasks), and the trainer feeds it (option feed_batches) one index
    that is its tag: (epoch << 32) | (batch in epoch + 1), 0 in the low
    half for an idle task. The trainer decides the epochs: a worker's
    tasks stand for its next batches until its iterator ends, then for
    its next epoch's (at most AHEAD of them while the trainer is still in
    the epoch before; then idle tasks, answered at once)."""

    AHEAD = 2

    def __init__(self, workers):
        self.workers = workers
        self.written = 0              # entries decided: seqs 0 .. written-1
        self.fed = 0                  # and fed to the loader: seqs 0 .. fed-1
        self.entries = {}             # seq -> (epoch, batch in epoch or -1), until read back
        self.epoch = [0] * workers    # the epoch each worker's next entries stand for
        self.next_k = [0] * workers   # and the batch in it
        self.trainer_epoch = 0        # the epoch the trainer hands out
        self.loader = None

    def write_to(self, end):
        """Entries for every seq below `end`, fed to the loader attached."""
        while self.written < end:
            s = self.written
            w = s % self.workers
            e = self.epoch[w]
            if e > self.trainer_epoch + 1 or \
                    (e == self.trainer_epoch + 1 and self.next_k[w] >= self.AHEAD):
                kin = -1
            else:
                kin = self.next_k[w]
                self.next_k[w] += 1
            self.entries[s] = (e, kin)
            self.written += 1
        self._feed()

    def attach(self, loader):
        """Feeds `loader`, a new one (its stream starts at seq 0): every
        entry decided so far, none delivered yet, from the first."""
        self.loader = loader
        self.fed = 0
        self._feed()

    def close(self):
        self.loader = None

    def _feed(self):
        if self.loader is None or self.fed == self.written:
            return
        tags = [_stream_tag(*self.entries[s]) for s in range(self.fed, self.written)]
        self.loader.feed(self.fed, [[t] for t in tags])
        self.fed = self.written

    def ended(self, w, epoch):
        """Worker w's iterator has no more batches in `epoch`: its next
        entries stand for the epoch after."""
        if self.epoch[w] == epoch:
            self.epoch[w] = epoch + 1
            self.next_k[w] = 0


def _stream_tag(epoch, kin):
    """The one index a stream's task is fed (see _StreamTable)."""
    return (int(epoch) << 32) | (int(kin) + 1)


class _StreamBatches(_Batches):
    """What the workers are given for an IterableDataset: each worker
    iterates its own copy (sharded by get_worker_info(), as in torch), one
    epoch after another, and a task is its next batch, collated in the
    worker. What a task stands for comes from the trainer (_StreamTable);
    a replacement worker starts that epoch's iteration again and skips the
    batches already made, so a stream that iterates the same way each time
    (the same items for the same seed, worker and epoch) loses and repeats
    nothing."""

    LENGTH = 2**62  # what a tag may be (_StreamTable); epochs are the iterators'
    TASKS = 2**40   # the loader's endless stream of tasks (feed_batches)

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
        tag = int(indices[0])
        e, kin = tag >> 32, (tag & 0xFFFFFFFF) - 1
        w = _ferry.worker_state()[0]  # this worker's id: s % W made it the one for seq s
        result = ("idle", e, kin) if kin < 0 else self._next_batch(w, e, kin)
        buf = io.BytesIO()
        out = [None, None]
        p = _Pickler(buf, {}, out, blob=1)
        p.dump(result)
        p.finish_blob()
        out[0] = np.frombuffer(buf.getbuffer(), dtype=np.uint8)
        return out


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
        pin_slots = ferry_options.pop("pin_slots", True)
        plan = translate_iterable(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, pin_memory_device=pin_memory_device,
            reseed=reseed, ferry_options=ferry_options)
        self._keep_args(dataset, num_workers, prefetch_factor, pin_memory, timeout,
                        worker_init_fn, multiprocessing_context, generator, persistent_workers,
                        in_order, collate_fn, pin_slots)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = self.batch_sampler = None
        base_seed = plan.base_seed
        if base_seed is None:
            base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self._base_seed = base_seed
        w = self.num_workers
        self._table = _StreamTable(w) if w else None
        self._batches = _StreamBatches(dataset, None, collate_fn, plan.auto_batch,
                                       base_seed, plan.reseed, worker_init_fn, w, os.getpid())
        self._batches.batch_size = batch_size
        self._batches.drop_last = bool(drop_last)
        self._opts = plan.opts
        self._opts.update(seed=base_seed, feed_batches=_StreamBatches.TASKS)
        self._window = self._opts["prefetch"] if w else 0  # tasks sent ahead
        self._loader = None
        self._pins = None  # pin_memory's registered slots (_SlotPins)
        self._seq = 0            # the next task's seq: delivered in order
        self._epoch = 0          # the epoch the next `for` hands out
        self._mid_epoch = False
        self._iters = 0  # epochs begun: the newest iterator reads the workers' streams
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
            self._table.attach(self._loader)
            self._watch_slots(True)
        return self._loader

    def _fresh_stream(self):
        """A new loader's stream (after close_workers() or close()): task 0
        again, the workers' iterators started afresh at the next epoch."""
        if self._mid_epoch:
            self._mid_epoch = False
            self._epoch += 1
        t = self._table = _StreamTable(self.num_workers)
        t.trainer_epoch = self._epoch
        t.epoch = [self._epoch] * self.num_workers
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
        """One epoch: every worker's stream to its end (a _StreamEpoch)."""
        return _StreamEpoch(self)

    def _begin_epoch(self):
        """The first next() of a `for`: a `for` left early leaves its epoch
        behind, at once; this one's starts."""
        if self._mid_epoch:
            self._leave_epoch()
        self._mid_epoch = True
        self._iters += 1

    def _end_epoch(self):
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


class _StreamEpoch(_EpochIterator):
    """The iterator of one epoch of an IterableDataset's DataLoader (what
    ``iter(loader)`` returns), a class as the map-style one is (_MapEpoch):
    it starts the workers when made, as torch's does, exposes them as
    torch's ``_workers``, and a failed batch raises its error and leaves it
    usable (the next call returns the batch after it). With each batch past
    what len(loader) said (when it was asked before this iterator was
    made), torch's warning."""

    __slots__ = ("_said", "_n", "_timeout", "_sync", "_state", "_nth")

    def __init__(self, dl):
        self._dl = dl
        self._said = getattr(dl, "_len_said", None)
        self._n = 0
        self._timeout = dl.timeout if dl.timeout and dl.timeout > 0 else None
        self._sync = None
        self._state = "new"  # then "running", "done"
        if dl.num_workers:
            dl._ferry()
        else:
            self._sync = dl._sync_epoch()  # the dataset iterated here, as torch does

    def __next__(self):
        if self._state == "done":
            raise StopIteration
        b = self._next_batch()
        self._n += 1
        if self._said is not None and self._n > self._said:
            warnings.warn(
                "ferry.torch.DataLoader: length of IterableDataset %s was reported to be "
                "%d (when accessing len(dataloader)), but %d samples have been fetched. "
                "For multiprocessing data-loading, this is most often each worker yielding "
                "the whole dataset: shard it by get_worker_info()"
                % (type(self._dl.dataset).__name__, self._said, self._n), UserWarning,
                stacklevel=2)
        return b

    def _next_batch(self):
        if self._sync is not None:
            try:
                return next(self._sync)
            except StopIteration:
                self._state = "done"
                raise
        dl = self._dl
        if self._state == "new":
            dl._begin_epoch()
            self._state = "running"
            self._nth = dl._iters
        elif self._nth != dl._iters:
            # A newer iterator of the loader began another epoch: the
            # workers' streams are its now (an IterableDataset's stream
            # cannot be taken up again where this one was).
            self._state = "done"
            _warn_once("superseded_stream", "an iterator was used after a newer iterator of "
                                            "the same DataLoader over an IterableDataset "
                                            "began another epoch; ferry's workers run one "
                                            "stream, so the older iterator ends there. For "
                                            "two epochs at once, use two DataLoaders")
            raise StopIteration
        try:
            item = dl._next_item(self._timeout)
        except NotReady:
            raise RuntimeError("DataLoader timed out after %s seconds" % dl.timeout) from None
        if item is None:
            self._state = "done"
            dl._end_epoch()
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item


DataLoader._ITERABLE = _IterableDataLoader
