"""The three ways a map-style DataLoader makes its batches, one object
each, chosen once as the DataLoader is made (from translate's plan.mode):

  _InProcess  num_workers=0: a ferry loader over a stand-in dataset of the
              same length gives each batch's indices (the same order,
              epochs and resume state as with workers); the batch is made
              from them in the caller's thread, at next(), as torch's is
  _InC        torchvision's ImageFolder with a transform ferry has in C:
              C workers decode and crop, no Python at all
  _InWorkers  ferry's Python workers, given the dataset (_worker._Batches)

Each opens the ferry.Loader (open) and turns a ferry batch into the user's
(structure); the DataLoader asks no further which one it has. _InC opens
_InWorkers in its place when the folder on disk is not the dataset's
samples, and says so: open returns the mode that serves the loader.

Trainer only, on the thread that iterates the DataLoader.
"""

import logging

import numpy as np
import torch

from .. import _handoff, Loader
from ._structure import _load_structure


class _InProcess:
    """num_workers=0: each batch made here, when asked for."""

    native = None  # the imagefolder spec run in C: none
    workers = False  # the batches are made here, not in the loader's slots

    def __init__(self, batches):
        self._batches = batches

    def open(self, opts):
        """(the loader of the indices, this mode)."""
        opts = dict(opts)
        opts["prefetch"] = 1
        return Loader("synthetic:n=%d,dim=1" % len(self._batches), **opts), self

    def structure(self, b):
        """The batch at b's indices, made now (b holds indices only)."""
        return self._batches.build(b.indices.astype(np.int64), b.epoch)

    def changed(self):
        """Whether what the workers were given changed since: no workers."""
        return False


class _InC:
    """torchvision's ImageFolder and its transform, run by C workers."""

    workers = True

    def __init__(self, spec, dataset, fallback):
        self.native = spec
        self._dataset = dataset
        self._fallback = fallback  # the mode for a folder that is not the dataset's

    def open(self, opts):
        """(the loader, this mode); (the fallback's loader, the fallback)
        when the folder holds another number of images than the dataset
        (its samples were changed after it listed them)."""
        ld = Loader(self.native, **opts)
        if ld.num_items == len(self._dataset):
            return ld, self
        ld.close()
        logging.getLogger("ferry").info(
            "ferry.torch.DataLoader: the folder holds %d images, the dataset %d: "
            "it runs in Python", ld.num_items, len(self._dataset))
        return self._fallback.open(opts)

    def structure(self, b):
        """default_collate's [images, labels], on the slot."""
        return [torch.from_numpy(b["image"]), torch.from_numpy(b["label"])]

    def changed(self):
        return False  # the C workers read the folder, not the dataset object


class _InWorkers:
    """ferry's Python workers, each batch's structure pickled back."""

    native = None
    workers = True

    def __init__(self, batches, follow):
        self._batches = batches
        # Without persistent_workers, each epoch sees the dataset as it is
        # at its iter(): what the workers were given is remembered to be
        # compared (changed).
        self._follow = follow
        self._given = None

    def open(self, opts):
        """(the loader, this mode)."""
        ld = Loader(self._batches, **opts)
        if self._follow:  # what it was given: no change since
            self._given = self._fingerprint()
            if self._given is None or self._fingerprint() != self._given:
                # It does not pickle the same twice (a __getstate__ that makes
                # new big lists, a time in it): every epoch would seem a
                # change and start the workers again. It is not followed.
                self._follow = False
                logging.getLogger("ferry").info(
                    "ferry.torch.DataLoader: the dataset does not pickle the same way twice, "
                    "so its changes between epochs cannot be told: each epoch gets it as it "
                    "was when the workers started (persistent_workers=True says so)")
        return ld, self

    def structure(self, b):
        """The batch's structure, its tensors sharing the fields' memory."""
        fields = [b._arrays[n] for n in b._names]
        return _load_structure(fields[-1], fields)

    def changed(self):
        """Whether the dataset (or collate_fn, worker_init_fn) differs now
        from what the workers were given, when the DataLoader follows it;
        a dataset that cannot be pickled now counts as changed (a new
        loader then says why)."""
        if not self._follow:
            return False
        now = self._fingerprint()
        return now is None or now != self._given

    def _fingerprint(self):
        """What the workers are given of the trainer's objects, as a digest
        (None when it cannot be pickled now)."""
        b = self._batches
        try:
            return _handoff.fingerprint((b.dataset, b.collate_fn, b.worker_init_fn))
        except Exception:  # noqa: BLE001 - pickling fails in many ways
            return None
