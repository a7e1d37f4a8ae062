"""The map-style DataLoader: torch's arguments and attributes, the epochs
a `for` sees, and the ferry.Loader underneath.

DataLoader is the API (as torch's dataloader.py is torch's): torch's
arguments are translated once (_args.translate: ferry's options, where
each epoch's indices come from, the mode), the mode chosen there makes
the batches (_modes), a ferry.Loader starts at the first iter(), and each
`for` gets one epoch (_MapEpoch), with torch's errors (_as_torch_says).
What torch's DataLoader draws from the generators at each iter() is
drawn here too, so that a training step's draws are those it gets under
torch. The IterableDataset subclass is _iterable's.

Trainer only: one DataLoader is iterated from one thread at a time.
"""

import contextlib
import hashlib
import inspect
import logging
import os
import types
import weakref

import torch
import torch.utils.data as tud

from .. import _Closes, _Epoch, _ferry
from .._errors import (BatchError, BatchLost, DatasetError, InvalidValue, NotReady,
                       WorkerError)
from ._args import _UNSET, _one_state, translate
from ._modes import _InC, _InProcess, _InWorkers
from ._once import _notice_once, _warn_once
from ._pin import _SlotPins, _tcollate_pin
from ._sampler import _SamplerTable
from ._worker import _Batches, _ProbeTimedOut


class DataLoader(_Closes):
    """torch.utils.data.DataLoader's arguments and defaults, on ferry's
    workers. ferry's own options (``seed``, ``state``, ``worker_mode``,
    ``max_held``, ``on_worker_failure``, ...) go by keyword; ``reseed``
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

    # The class DataLoader() makes for an IterableDataset: _iterable's
    # subclass, which names itself here as it is defined (the package
    # imports both), so that this module does not import its subclass.
    _ITERABLE = None

    def __new__(cls, dataset=None, *args, **kwargs):
        if cls is DataLoader and isinstance(dataset, tud.IterableDataset):
            return super().__new__(DataLoader._ITERABLE)
        return super().__new__(cls)

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=_UNSET, pin_memory_device="",
                 in_order=True, reseed=None, native=True, **ferry_options):
        # The arguments as given (for an iterator a newer iter() superseded: _apart)
        made_with = dict(locals())
        self._made_with = {k: v for k, v in made_with.items()
                           if k not in ("self", "ferry_options", "__class__")}
        self._made_with.update(ferry_options)
        pin_slots = ferry_options.pop("pin_slots", True)
        plan = translate(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
            drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, generator=generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order, reseed=reseed,
            native=native, ferry_options=ferry_options)
        self._keep_args(dataset, num_workers, prefetch_factor, pin_memory, timeout,
                        worker_init_fn, multiprocessing_context, generator, persistent_workers,
                        in_order, collate_fn, pin_slots)
        self.batch_size, self.drop_last = plan.batch_size, plan.drop_last
        self.sampler, self.batch_sampler = plan.sampler, plan.batch_sampler
        self._opts = plan.opts
        # What torch's sampler draws at each iter() (_torch_draws), and
        # what it draws as its iterator ends, still to draw (_draws_due).
        self._sampler_draw = plan.draw
        self._draws_due = None
        self._sampler_epoch0 = int(getattr(self.sampler, "epoch", 0) or 0)
        self._follows_set_epoch = False
        # The base seed, drawn as torch draws it (_torch_draws): from
        # `generator`, else from torch's global generator, at iter(), not
        # here (so torch.manual_seed(s) before the loader makes runs
        # repeat, and a model built after the loader gets the weights it
        # gets under torch), unless seed= or a resume state fixed it.
        self._base_seed = plan.base_seed
        self._table = None  # a sampler of the user's: its batches, fed
        if plan.feed is not None:
            self._table = _SamplerTable(plan.feed.batch_sampler, plan.feed.sampler,
                                        plan.feed.nbatches, plan.feed.ahead, len(dataset))
        self._next_epoch = 0
        self._mid_epoch = False  # a `for` stopped inside an epoch
        self._epoch_got = 0  # batches of the epoch handed out (_leave_epoch)
        self._iters = 0  # epoch iterators made: the newest one reads the stream
        self._current = None  # (a weak reference to) the newest
        self._quiet = False  # draws nothing from the script's generators (_apart)
        self._due_before = None  # the older iterator's end draws, at an iter() (_begin_epoch)
        self._sampler_changed = False  # asked at each iter(), before its draws
        self._batches = _Batches(dataset, plan.indices, collate_fn, plan.auto_batch,
                                 plan.base_seed, plan.reseed, worker_init_fn, self.num_workers,
                                 os.getpid(), self._table)
        self._batches.timeout = timeout  # item 0's build at the workers' start too
        self._loader = None
        self._pins = None  # pin_memory's registered slots (_SlotPins)
        # How the batches are made, chosen once (_modes).
        in_workers = _InWorkers(self._batches, follow=not self.persistent_workers)
        if plan.mode == "sync":
            self._mode = _InProcess(self._batches)
        elif plan.mode == "native":
            self._mode = _InC(plan.native, dataset, in_workers)
            _notice_once("native " + plan.native,
                         "%s with its transform runs in C (%s); native=False runs "
                         "torchvision's code in Python" % (type(dataset).__name__, plan.native))
        else:
            self._mode = in_workers
            if plan.native_why:
                _notice_once("python " + plan.native_why, "%s runs in Python: %s" % (
                    type(dataset).__name__, plan.native_why))
        self._initialized = True

    @property
    def _native(self):
        """The imagefolder spec the batches are made from in C, or None."""
        return self._mode.native

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
            state = _one_state(self._opts.get("state"))
            if isinstance(state, dict):
                self._next_epoch = int(state.get("epoch", 0))
            if self._table is not None:
                if self._table.live_from == self._next_epoch:
                    pass  # a restart within the run: the samplers go on as they are
                elif state is not None or self._table.written >= 0:
                    self._table.skip_to(self._next_epoch, (state or {}).get("sampler"))
                self._table.live_from = None
                self._table.fill_to(self._next_epoch + self._table.ahead)
                self._opts["batch_size"] = self._table.max_len  # the longest drawn
                kind = getattr(self._table.batch_sampler, "key_kind", None)
                self._batches.key_kind = None if kind in (None, "int") else kind
            self._mid_epoch = False
            self._loader, self._mode = self._mode.open(self._opts)
            if self._table is not None:
                self._table.attach(self._loader, self._opts["batch_size"])
            self._watch_slots(self._mode.workers)
        return self._loader

    def _restart_at(self, epoch, why):
        """The workers start again at the first batch of `epoch`, over the
        dataset's items as many as there are now (a dataset that grows
        between epochs, a replay buffer, is read whole, as torch reads it)."""
        state = self._loader.state_at_epoch(epoch)
        if self._table is not None:
            # The samplers go on as they are now, drawing the epochs from
            # `epoch` again (not replayed from their construction, which
            # would drop what the script changed in them since).
            self._table.redraw_from(epoch)
            self._opts["feed_batches"] = n = self._table.n  # (the positions fed)
        else:
            n = len(self._batches)
        if n > 0 and n != self._loader._len[0]:
            from .. import _state_blob, _state_dict
            state.update(_state_dict(_ferry.state_resized(_state_blob(state), n)))
        state.update(epoch=epoch, base_seed=self._base_seed)
        logging.getLogger("ferry").info("ferry.torch.DataLoader: %s: the workers start again at "
                                        "epoch %d", why, epoch)
        self.load_state_dict(state)
        self._next_epoch = epoch
        self._mid_epoch = False

    def _follow_dataset(self):
        """Without persistent_workers, as with torch's workers, each epoch
        sees the dataset (and collate_fn, worker_init_fn) as it is at its
        iter(): a change the trainer made since the workers started (a
        curriculum's ``dataset.max_len = ...``) starts them again with it,
        at that epoch's first batch. Nothing changed (the usual case): the
        workers and the batches prefetched across the epoch's start stay."""
        if self._loader is None or not self._mode.changed():
            return
        self._restart_at(self._next_epoch + (1 if self._mid_epoch else 0),
                         "the dataset changed since the workers started (persistent_workers="
                         "True keeps it as it was when they first started, as with torch)")

    def _watch_slots(self, in_slots):
        """pin_memory's slot registrations (_SlotPins) for the loader just
        made, whose batches come in its slots (in_slots) or not."""
        pin = self.pin_memory and self._pin_slots and in_slots
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
        if self._table is not None:  # the sampler's batches
            return self._table.n
        # The sampler's own arithmetic (sharding, padding, drop_last), from C.
        o = self._opts
        # A ferry.Mix's epoch is its length in positions, not its items.
        n = _ferry.mix_info(o["mix"])[2] if o.get("mix") else len(self._batches)
        try:
            return _ferry.epoch_batches(
                n, o["batch_size"] if self.batch_size is not None else 1,
                drop_last=bool(o["drop_last"]), rank=int(o.get("rank", 0) or 0),
                world_size=int(o.get("world_size", o.get("world", 1)) or 1),
                pad_shards=bool(o.get("pad_shards", True)))
        except InvalidValue:  # no batch at all (an empty dataset, drop_last): torch says 0
            return 0

    def __iter__(self):
        """One epoch of batches. A `for` left early (a break, a peek with
        next(iter(loader))) leaves the rest of its epoch behind, as torch's
        does: the next `for` starts a new epoch. A batch the dataset failed
        on raises its error from next(), and the next call goes on with the
        batches after it, as torch's iterator does."""
        self._due_before = self._draws_due  # (the older iterator's, if it goes on apart)
        # Whether the script changed its sampler since ferry drew ahead, asked
        # before this iter()'s own draws (from a generator the sampler may
        # share): those are not the script's changes.
        self._sampler_changed = self._table is not None and self._loader is not None and \
            self._table.changed()
        self._torch_draws()
        if len(self) == 0:  # (drop_last and fewer items than a batch): torch's epoch is empty
            self._end_draws()  # and its sampler ran out at once
            return _EmptyEpoch(self)
        self._follow_set_epoch()
        self._follow_dataset()
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
        iter() are the ones it gets under torch. RandomSampler's second
        randperm, which torch draws as the sampler's iterator runs out, is
        drawn when the epoch's last batch is handed out (_end_draws), not
        here: it is not on the way to the first batch (27 ms for a million
        items). An epoch left early does not draw it (torch's does when
        the `for` stops within its last prefetch_factor x num_workers
        batches, which its workers had asked the sampler for); an epoch of
        no batch draws it at once (__iter__). (A sampler of the user's is iterated
        ahead, when ferry needs its batches: its draws do not fall where
        torch's do.)"""
        self._draws_due = None  # the last `for` stopped early: not drawn
        if self._quiet:
            return
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        perm = state = None
        if self._sampler_draw is not None:
            g, n, k = self._sampler_draw
            if n:
                if g is not None and self._base_seed is None:
                    state = g.get_state()  # (what the draw below is a function of)
                perm = torch.randperm(n, generator=g)
                if k > 1:
                    self._draws_due = (g, n, k - 1)
            else:
                torch.empty((), dtype=torch.int64).random_()
        if self._base_seed is None:
            if perm is not None and self._sampler_draw[0] is not None and \
                    "seed" not in self._opts:
                # A sampler with a generator of its own: the order follows
                # that generator, as torch's does: one seed from its state
                # before the draw. (From the draw itself, a permutation of
                # 2 items had 2 seeds, and 2 seeds gave one order.)
                digest = hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest()
                self._opts["seed"] = int.from_bytes(digest, "little") % 2**63
            self._set_base_seed(drawn)

    def _end_draws(self):
        """The draws torch's sampler makes as its iterator runs out (see
        _torch_draws), at the end of an epoch of batches."""
        due, self._draws_due = self._draws_due, None
        if due is not None:
            g, n, k = due
            for _ in range(k):
                torch.randperm(n, generator=g)

    def _set_base_seed(self, seed):
        self._base_seed = seed
        self._batches.base_seed = seed
        self._opts.setdefault("seed", seed)

    def _leave_epoch(self):
        """A `for` left its epoch early (a break, a peek with
        next(iter(loader))): torch's next `for` starts a new epoch, and the
        rest of this one is never made. The C loader skips it (what is
        made of it is dropped, the rest never made; the next epoch's
        batches, prefetched, stay). Where it cannot (in_order=False),
        the workers start again at the next epoch's first batch, unless
        what is left is no more than what is in flight: that is drained
        (_begin_epoch). Draining it all made a peek at the first batch
        cost the script a whole epoch's work."""
        left = len(self) - self._epoch_got
        if left <= 0 or self._loader is None:
            return
        try:
            self._loader.skip_epoch()
        except InvalidValue:
            pass
        else:
            self._next_epoch += 1
            self._mid_epoch = False
            return
        if left <= max(1, self.num_workers) * (self.prefetch_factor or 2):
            return
        self._restart_at(self._next_epoch + 1,
                         "a `for` left epoch %d with %d of its %d batches not taken (torch "
                         "makes none of them)" % (self._next_epoch, left, len(self)))

    def _begin_epoch(self):
        """The ferry epoch iterator of a new `for`: what a `for` left early
        left of its epoch is left behind (_leave_epoch) or drained first.
        Returns (iterator, epoch)."""
        old = self._current() if self._current is not None else None
        if old is not None and not old._over and self._loader is not None and \
                self._table is None and not self.persistent_workers and self.in_order:
            # The iterator whose epoch is not over goes on apart, as torch's
            # would with workers of its own (_MapEpoch.__next__), from the
            # batch after its last (a position only in order).
            old._resume = self.state_dict()
            old._due = self._due_before  # its sampler's end draws
        if self._mid_epoch:
            self._leave_epoch()
        if self._table is not None and self._loader is not None:
            want = self._next_epoch + (1 if self._mid_epoch else 0)
            if self._table.written >= want and self._sampler_changed:
                self._restart_at(want, "the sampler changed since its epoch %d was drawn "
                                       "(ahead of the workers); it is drawn again as it is "
                                       "now, as torch draws it at iter()" % want)
            self._table.fill_to(want + self._table.ahead)
            if not self._table.fits(want):
                self._restart_at(want, "the sampler gave a batch of %d indices, longer than "
                                       "any before" % self._table.max_len)
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
        self._epoch_got = 0
        self._iters += 1
        return _Epoch(ld, timeout), self._next_epoch

    def _apart(self, state):
        """An iterator over the rest of the epoch `state` stands in, from a
        loader of its own made with this one's arguments (workers of its
        own): for an iterator a newer iter() of this loader superseded
        mid-epoch, as torch gives each iterator of a loader without
        persistent_workers its own workers. It draws nothing from the
        script's generators (this one drew them); it goes at its epoch's
        end or with the iterator."""
        sibling = DataLoader(**dict(self._made_with, state=state, seed=self._opts["seed"]))
        sibling._quiet = True
        return iter(sibling)

    def _structure(self, b):
        """The user's batch of ferry batch b."""
        out = self._mode.structure(b)
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
            if getattr(self, "_table", None) is not None:
                self._table.loader = None  # what it drew for this one is drawn again

    def close(self):
        """Stops the workers (also done at exit and when collected)."""
        self.close_workers()
        if getattr(self, "_table", None) is not None:
            self._table.close()
            self._table = None


# What inspect.signature() and help() show: torch's own DataLoader's, as
# the installed torch has it (ferry's extras, in_order, reseed, native, dct
# and the ferry options, go by keyword: see the class's docstring).
DataLoader.__signature__ = inspect.signature(tud.DataLoader)


class _EpochIterator:
    """What both epoch iterators (map-style: _MapEpoch; IterableDataset:
    _iterable._StreamEpoch) share: they are their own iterator, len() is
    the loader's, and torch's ``_workers`` are the loader's processes."""

    __slots__ = ("_dl",)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._dl)

    @property
    def _workers(self):
        """torch's private attribute (read by torch's own tests)."""
        return _worker_processes(self._dl)


class _EmptyEpoch(_EpochIterator):
    """An epoch of no batch (torch's for drop_last and fewer items than a
    batch), where ferry's loader would refuse to open."""

    __slots__ = ()

    def __init__(self, dl):
        self._dl = dl

    def __next__(self):
        raise StopIteration


class _MapEpoch(_EpochIterator):
    """The iterator of one epoch of a map-style DataLoader (what
    ``iter(loader)`` returns). As torch's, it starts the workers when made
    (the loader's first iter()). A failed batch raises its error and leaves
    the iterator usable: the next call returns the batch after it, as
    torch's does (a generator would end at the first error, and a loop that
    skips a bad batch would lose the rest of its epoch silently)."""

    __slots__ = ("_it", "_epoch", "_nth", "_over", "_resume", "_own", "_due", "__weakref__")

    def __init__(self, dl):
        self._dl = dl
        self._over = False
        self._resume = self._own = self._due = None
        with _as_torch_says(dl):
            self._it, self._epoch = dl._begin_epoch()
        self._nth = dl._iters
        dl._current = weakref.ref(self)

    def __next__(self):
        dl = self._dl
        if self._nth != dl._iters:
            # A newer iter() of the loader started another epoch (a loop
            # over the loader inside a loop over it; two iterators at
            # once): the loader's one stream is the newer one's now.
            if self._resume is not None:  # the rest of this epoch, apart
                if self._own is None:
                    self._own = dl._apart(self._resume)
                try:
                    return next(self._own)
                except StopIteration:
                    own, self._own, self._resume, self._over = self._own, None, None, True
                    own._dl.close()
                    # what torch's sampler draws as this epoch's iterator runs out
                    dl._draws_due, due = self._due, dl._draws_due
                    dl._end_draws()
                    dl._draws_due = due
                    raise
            if not self._over:
                self._over = True
                _warn_once("superseded", "an iterator was used after "
                                         "a newer iter() of the same DataLoader started "
                                         "another epoch; with persistent_workers=True (or a "
                                         "sampler of your own, or in_order=False) ferry runs "
                                         "one stream per "
                                         "DataLoader, so the older iterator ends there (as "
                                         "torch's does with persistent_workers=True). For "
                                         "two epochs at once, use two DataLoaders")
            raise StopIteration
        try:
            with _as_torch_says(dl):
                b = next(self._it)
        except BatchError:
            dl._epoch_got += 1
            # The failure took a batch's place: the epoch ends there if it
            # was the last one.
            done = self._it._done
            dl._mid_epoch = not done
            if done:
                dl._next_epoch = self._epoch + 1
                dl._end_draws()
            raise
        dl._epoch_got += 1
        dl._next_epoch = b.epoch + 1 if b.last_in_epoch else b.epoch
        dl._mid_epoch = not b.last_in_epoch
        if b.last_in_epoch:
            self._over = True
            dl._end_draws()
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


def _worker_processes(dl):
    """torch's iterators' ``_workers``: DataLoader dl's worker processes as
    they are now, ferry.WorkerProcess objects (pid, is_alive(),
    join(timeout), exitcode, terminate()), which stay truthful after the
    workers, the iterator and the loader are gone. [] before the workers
    start and for thread workers."""
    ld = dl._loader
    if ld is None:
        return []
    procs = (ld.worker_process(i) for i in range(dl.num_workers))
    return [p for p in procs if p is not None]
