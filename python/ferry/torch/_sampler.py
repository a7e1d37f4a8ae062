"""The user's own sampler, fed to the loader: a sampler or batch_sampler
that ferry's index stream does not reproduce (_native_sampler says which
it does) is iterated in the trainer, epoch by epoch, and each batch's
indices travel in its task (option feed_batches, Loader.feed).

_SamplerTable draws the epochs ahead of the workers, keeps the sampler's
state for an exact resume, and feeds what the loader has room for.
Trainer only, on the thread that iterates the DataLoader.
"""

import copy

import numpy as np
import torch
import torch.utils.data as tud

from ._once import _warn_once


class _SamplerTable:
    """The batches a sampler or batch_sampler of the user's gives, epoch by
    epoch, fed to the loader (option feed_batches, Loader.feed): the loader
    runs over the epoch's batch positions, and each task carries the
    indices its position stands for, so a worker, local or remote, makes
    it as any other batch.

    The trainer iterates the sampler ahead of the workers, `ahead` epochs
    past the one it is in (enough to cover the prefetch window), and feeds
    each epoch as it is drawn. A sampler's set_epoch(e) is called before
    its epoch e is drawn, and its state_dict() (when it has one) kept, for
    an exact resume. The loader's batch_size is the longest batch drawn
    before it started; an epoch with a longer one waits, unfed, until the
    loader starts again with room for it (fits)."""

    def __init__(self, batch_sampler, sampler, nbatches, ahead, dataset_len):
        self.batch_sampler = batch_sampler
        self.sampler = sampler
        self.n = nbatches
        self.ahead = ahead
        self.dataset_len = dataset_len
        self.written = -1   # the last epoch drawn
        self.pending = {}   # epoch -> its batches, drawn, not fed yet
        self.states = {}    # epoch -> the sampler's state_dict() before drawing it
        self.max_len = 1    # the longest batch drawn
        self.loader = None  # the ferry.Loader fed, and the longest batch it takes
        self.room = 0
        self.live_from = None  # an internal restart's epoch: go on, not replay (redraw_from)
        self.print = None  # the samplers' fingerprint after the last draw (changed)
        # How the samplers were built, to draw the epochs again from (the
        # resume of a sampler without state_dict): a copy of them, or else
        # the state of the torch generators they draw from.
        self._fresh = self._gens = None
        try:
            self._fresh = copy.deepcopy((batch_sampler, sampler))
        except Exception:  # noqa: BLE001 - torch's Generator cannot be copied
            self._gens = [(o, o.generator.get_state()) for o in {id(x): x for x in (
                batch_sampler, sampler, getattr(batch_sampler, "sampler", None))}.values()
                if isinstance(getattr(o, "generator", None), torch.Generator)]

    def close(self):
        self.loader = None
        self.pending.clear()

    def batches_of(self, epoch):
        """Epoch `epoch`'s batches, drawn now (numpy int64 arrays)."""
        s = self.sampler
        if hasattr(s, "set_epoch"):
            s.set_epoch(epoch)
        if hasattr(s, "state_dict"):
            self.states[epoch] = s.state_dict()
        out = [_indices_of(b) for b in self.batch_sampler]
        if len(out) != self.n:
            raise RuntimeError("ferry.torch.DataLoader: the batch sampler gave %d batches in "
                               "epoch %d, but its len() is %d: ferry needs as many batches in "
                               "every epoch" % (len(out), epoch, self.n))
        for b in out:
            bad = b[(b < 0) | (b >= self.dataset_len)]
            if len(bad):
                raise IndexError("ferry.torch.DataLoader: the sampler gives index %d, but the "
                                 "dataset has %d items" % (int(bad[0]), self.dataset_len))
            if len(b) == 0:
                raise ValueError("ferry.torch.DataLoader: the batch sampler gave an empty batch "
                                 "in epoch %d" % epoch)
        return out

    def fill_to(self, epoch):
        """Draws every epoch up to `epoch`, and feeds what fits."""
        drew = self.written < epoch
        while self.written < epoch:
            e = self.written + 1
            batches = self.pending[e] = self.batches_of(e)
            self.max_len = max([self.max_len] + [len(b) for b in batches])
            self.written = e
            self.states.pop(e - self.ahead - 2, None)
        if drew:
            self.print = self._fingerprint()
        self._feed()

    def _fingerprint(self):
        """The samplers as they are now (_handoff.fingerprint), or None when
        they cannot be fingerprinted (a torch Generator in them)."""
        from .._handoff import fingerprint
        try:
            return fingerprint((self.batch_sampler, self.sampler))
        except Exception:  # noqa: BLE001 - not watched then
            return None

    def changed(self):
        """Whether the script changed the sampler since its last epochs were
        drawn (a WeightedRandomSampler's weights reassigned for hard-example
        mining, a curriculum sampler's length): those epochs, drawn ahead,
        are not what torch, which draws each at its iter(), would give."""
        if self.print is None:
            return False
        if hasattr(self.sampler, "set_epoch"):
            # The script's own set_epoch(e) before its `for` (as torch's
            # docs ask of a DistributedSampler) changes nothing ferry draws:
            # set as the last draw left it, it is not taken for a change.
            self.sampler.set_epoch(self.written)
        now = self._fingerprint()
        return now is not None and now != self.print

    def redraw_from(self, epoch):
        """Goes on at `epoch` with the samplers as they are now, for a
        restart of the workers within the run (the dataset or the sampler
        changed): the epochs drawn from there are drawn again from them, not
        replayed from the samplers as built (skip_to, for a resume)."""
        self.pending.clear()
        self.written = epoch - 1
        self.live_from = epoch
        self.max_len = 1
        self.n = len(self.batch_sampler)  # (a curriculum's sampler may have grown)

    def attach(self, loader, room):
        """Feeds `loader` (which takes batches of up to `room` indices) from
        now on: the epochs drawn and not fed yet first."""
        self.loader, self.room = loader, room
        self._feed()

    def fits(self, epoch):
        """Whether the loader fed now can take epoch `epoch`'s batches."""
        batches = self.pending.get(epoch)
        return batches is None or max(len(b) for b in batches) <= self.room

    def _feed(self):
        if self.loader is None:
            return
        for e in sorted(self.pending):
            if not self.fits(e):
                break  # it waits for a loader with room for it
            self.loader.feed(e * self.n, self.pending[e])
            del self.pending[e]  # once fed: a feed that raised keeps it

    def skip_to(self, epoch, state):
        """Goes on at `epoch` (a resume): from the sampler's saved state
        when there is one, else by drawing the epochs before it again (the
        same draws for a sampler seeded at construction)."""
        self.states.clear()
        self.pending.clear()
        if state is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state)
        else:
            if self._fresh is not None:  # from the samplers as built
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


def _indices_of(batch):
    """A batch sampler's batch as int64 indices; a batch of other keys
    (tuples, strings: a dataset indexed by them) is refused, not read as
    ints (a batch of (index, scale) pairs was flattened into twice as many
    indices)."""
    if isinstance(batch, torch.Tensor):
        batch = batch.tolist()
    keys = batch if isinstance(batch, np.ndarray) else list(batch)
    try:
        arr = np.asarray(keys)
    except (ValueError, TypeError):  # keys of uneven shapes
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iub":
        return arr.astype(np.int64, copy=False)
    for key in keys:
        if isinstance(key, torch.Tensor) and key.dim() == 0 and \
                not key.dtype.is_floating_point and not key.dtype.is_complex:
            continue
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise TypeError("ferry.torch.DataLoader: the sampler gave the key %r in a batch: "
                            "ferry carries int indices only: read a dataset indexed by other "
                            "keys (a tuple, a str) with torch.utils.data.DataLoader" % (key,))
    return np.asarray([int(k) for k in keys], dtype=np.int64)


class _Singles:
    """A sampler's keys as batches of one (batch_size=None): each key is
    what the dataset is indexed with, an int or (a bulk-loading sampler's)
    a sequence of ints. key_kind says which, the same for every key:
    "int", or the sequence's type ("list", "tuple", "tensor", "ndarray"),
    so that the worker indexes the dataset with the very key the sampler
    gave (torch passes it as it is)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.key_kind = None

    def __iter__(self):
        for key in self.sampler:
            kind, indices = _key_of(key)
            if self.key_kind is None:
                self.key_kind = kind
            elif kind != self.key_kind:
                raise TypeError("ferry.torch.DataLoader: the sampler gave a %s key after %s keys: "
                                "with batch_size=None ferry carries one kind of key, int "
                                "indices or sequences of them" % (kind, self.key_kind))
            yield indices

    def __len__(self):
        return len(self.sampler)


def _key_of(key):
    """(kind, indices) of a batch_size=None sampler's key (see _Singles)."""
    if isinstance(key, torch.Tensor) and key.dim() == 0:
        key = key.item()
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return "int", [int(key)]
    kind = {list: "list", tuple: "tuple", np.ndarray: "ndarray"}.get(type(key))
    if isinstance(key, torch.Tensor):
        kind = "tensor"
    if kind is not None:
        indices = np.asarray(key.tolist() if kind == "tensor" else key)
        if indices.ndim == 1 and indices.size and indices.dtype.kind in "iu":
            return kind, indices
    raise TypeError("ferry.torch.DataLoader: with batch_size=None the sampler gave the key %r: "
                    "ferry carries int indices, or non-empty 1-D sequences of them (a list, "
                    "tuple, tensor or array), which the dataset is indexed with as they are"
                    % (key,))


def key_from(kind, indices):
    """The key a worker indexes the dataset with (see _Singles)."""
    if kind == "list":
        return [int(i) for i in indices]
    if kind == "tuple":
        return tuple(int(i) for i in indices)
    if kind == "tensor":
        return torch.as_tensor(np.asarray(indices, dtype=np.int64))
    return np.array(indices, dtype=np.int64)


def _native_sampler(sampler, dataset):
    """Whether ferry's own index stream does what `sampler` does."""
    from ._args import _over
    return sampler is None or isinstance(sampler, (
        tud.SubsetRandomSampler, tud.distributed.DistributedSampler,
        list, tuple, range, np.ndarray)) or (
        isinstance(sampler, tud.SequentialSampler) and _over(sampler, dataset)) or (
        isinstance(sampler, tud.RandomSampler) and not sampler.replacement and
        sampler._num_samples is None and _over(sampler, dataset))
