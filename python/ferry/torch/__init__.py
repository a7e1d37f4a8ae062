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

The package's modules, one job each (torch's own split, DataLoader's API
over _utils/worker.py, collate.py and pin_memory.py, is the map):

  _dataloader  the map-style DataLoader: its arguments, its epochs, its
               ferry.Loader (the API)
  _iterable    an IterableDataset's DataLoader and its workers' stream
  _args        torch's arguments translated: ferry's options, where the
               indices come from, the mode (a pure function)
  _modes       the three ways batches are made: in the caller's thread
               (num_workers=0), in C, in Python workers
  _sampler     a sampler of the user's, fed to the loader
  _native      torchvision's ImageFolder recognized, to run in C
  _worker      what a map-style loader's workers are given: seeding,
               item 0's probe, each batch made
  _collate     default_collate, written into the batch's slot
  _structure   a batch's structure, pickled from worker to trainer
  _pin         pin_memory
  _once        what is said once per process
"""

import torch.utils.data as tud

from . import _iterable  # noqa: F401 - the class DataLoader() makes for an IterableDataset
from ._dataloader import DataLoader

__all__ = ["DataLoader", "get_worker_info"]


def get_worker_info():
    """torch's ``get_worker_info()``: in a ferry worker, an object with
    ``id``, ``num_workers``, ``seed`` and ``dataset`` (torch's own function
    answers the same); None in the trainer."""
    return tud.get_worker_info()
