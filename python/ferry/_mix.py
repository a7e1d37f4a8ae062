"""ferry.Mix: several datasets as one stream, drawn by weight.

The order is the C sampler's (sampler/mix.h): a pure function of (seed,
position), so a loader over a Mix keeps its O(1) resume state, resumes on
another number of ranks or batch size, and prefetches across a change of
weights or the end of one source's pass like anywhere else. This module is
the dataset side: the sources end to end, and the spec the loader's option
``mix`` takes.
"""

import bisect
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from . import _ferry


def _weights(what, ws, k):
    if isinstance(ws, (str, bytes)) or not isinstance(ws, Sequence) and \
            not isinstance(ws, np.ndarray):
        raise TypeError("ferry.Mix: %s must be a sequence of %d weights, not %s"
                        % (what, k, type(ws).__name__))
    ws = [float(w) for w in ws]
    if len(ws) != k:
        raise ValueError("ferry.Mix: %s has %d weights for %d sources" % (what, len(ws), k))
    return ws


class Mix:
    """Several map-style datasets as one, their items drawn by weight.

    ``ferry.Mix([a, b, c], [0.7, 0.2, 0.1])`` is a dataset of
    ``len(a) + len(b) + len(c)`` items (source k's items are indices
    ``offsets[k] ..``) that a ``ferry.Loader`` or ``ferry.torch.DataLoader``
    serves in the mix's own order: each position of the stream draws from
    a source by weight, and each source is served in passes of its own, a
    shuffled pass each (with ``shuffle``), so a small source repeats while
    a large one is still in its first pass.

    ``weights``: one per source (normalized; 0 leaves a source out). Or
    ``schedule``: weights that change as the run goes, ``{0: [0.7, 0.3],
    100000: [0.5, 0.5]}``, keyed by position in the mixed stream (samples
    of all ranks together, counted from the run's start; a step in
    optimizer steps is ``step * batch_size * world_size``).

    ``length``: the samples of one epoch of the mixed stream (what
    ``len(loader)``, ``epochs`` and ``set_epoch`` count; default: all the
    sources' items). The sources' own passes do not follow it.

    The sources are dataset objects (map-style: ``__getitem__`` and
    ``__len__``), or all C dataset specs (``"npy:x=a.npy"``,
    ``"imagefolder:root=..."``, of one schema), which ferry.Loader's C
    workers open as one ``concat:`` dataset.

    ``source_key``: also say, item by item, which source it came from:
    dict items gain this key with the source's number; other items
    become ``(item, source)``. With ferry.Loader, ``mix.source_of(batch.indices)``
    says the same without changing the items.

    Guarantees (docs/python.md, "Mixing sources"): the stream is a function
    of (seed, position): the same on every run, rank layout and worker
    count; each block of 4096 positions holds every source's share to
    1/4096; every source's draws are whole passes, each item once per pass;
    a resume state is the loader's 80 bytes, whatever the number of sources
    or the length of the run, and one saved under another mix is refused;
    a schedule changed only after the saved position is taken (the weights
    may change after a checkpoint).
    """

    def __init__(self, sources, weights=None, *, schedule=None, length=None, source_key=None):
        if isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Sequence):
            raise TypeError("ferry.Mix: sources must be a list of datasets, not %s"
                            % type(sources).__name__)
        sources = list(sources)
        if not sources:
            raise ValueError("ferry.Mix: no sources")
        specs = [isinstance(s, str) for s in sources]
        if any(specs) and not all(specs):
            raise TypeError("ferry.Mix: the sources are all dataset objects (served by Python "
                            "workers) or all C dataset specs (served by C workers), not some "
                            "of each")
        for i, s in enumerate(sources):
            if isinstance(s, str):
                if "|" in s or s.startswith("concat:"):
                    raise ValueError("ferry.Mix: source %d (%r): a spec of a mix's source "
                                     "holds no '|' and is no concat" % (i, s))
            elif not (hasattr(s, "__getitem__") and hasattr(s, "__len__")):
                raise TypeError("ferry.Mix: source %d must be a map-style dataset (with "
                                "__getitem__ and __len__) or a C dataset spec, not %s"
                                % (i, type(s).__name__))
        # A C dataset's length: opened here once (as a worker will).
        sizes = [_ferry.dataset_length(s) if isinstance(s, str) else len(s) for s in sources]
        for i, n in enumerate(sizes):
            if n <= 0:
                raise ValueError("ferry.Mix: source %d is empty" % i)
        k = len(sources)
        if (weights is None) == (schedule is None):
            raise TypeError("ferry.Mix: give weights or schedule (one of them)")
        if schedule is None:
            steps = [(0, _weights("weights", weights, k))]
        else:
            if not isinstance(schedule, Mapping) or not schedule:
                raise TypeError("ferry.Mix: schedule must be a dict {position: weights}, not %r"
                                % (schedule,))
            steps = []
            for step, ws in sorted(schedule.items()):
                if not isinstance(step, numbers.Integral) or step < 0:
                    raise ValueError("ferry.Mix: schedule position %r is not an int >= 0"
                                     % (step,))
                steps.append((int(step), _weights("schedule[%d]" % step, ws, k)))
            if steps[0][0] != 0:
                raise ValueError("ferry.Mix: the schedule must start at position 0, not %d"
                                 % steps[0][0])
        if length is not None and (not isinstance(length, numbers.Integral) or length < 1):
            raise ValueError("ferry.Mix: length must be an int >= 1, not %r" % (length,))
        if source_key is not None and not isinstance(source_key, str):
            raise TypeError("ferry.Mix: source_key must be a str or None")
        parts = [",".join(str(n) for n in sizes)]
        parts += ["%d:%s" % (step, ",".join(repr(w) for w in ws)) for step, ws in steps]
        if length is not None:
            parts.append("length=%d" % length)
        self.spec = ";".join(parts)
        # The C parser's checks (and messages), here, before any loader.
        _ferry.mix_info(self.spec)
        self.sources = sources
        self.sizes = tuple(sizes)
        self.offsets = tuple(int(o) for o in np.cumsum([0] + sizes[:-1]))
        self._total = sum(sizes)
        self._offsets = list(self.offsets)  # what __getitem__ bisects: a list is fastest
        self.schedule = {step: tuple(ws) for step, ws in steps}
        self.length = int(length) if length is not None else sum(sizes)
        self.source_key = source_key
        # C sources: the loader opens them as one concat dataset.
        self.dataset_spec = "concat:" + "|".join(sources) if all(specs) else None
        if self.dataset_spec and source_key is not None:
            raise ValueError("ferry.Mix: source_key changes Python items; a mix of C datasets "
                             "says each item's source by mix.source_of(batch.indices)")

    def __len__(self):
        return self._total

    def locate(self, index):
        """(source, index in that source) of a Mix index."""
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("ferry.Mix: index %d is out of range for %d items"
                             % (index, len(self)))
        k = bisect.bisect_right(self.offsets, index) - 1
        return k, index - self.offsets[k]

    def __getitem__(self, index):
        if self.dataset_spec is not None:
            raise TypeError("ferry.Mix: a mix of C datasets (spec strings) is built by C "
                            "workers; read it through ferry.Loader")
        # Every item of every batch comes through here: the common case
        # (an int in range) takes one bisect and no call of ours.
        if type(index) is int and 0 <= index < self._total:
            k = bisect.bisect_right(self._offsets, index) - 1
            item = self.sources[k][index - self._offsets[k]]
        else:
            k, i = self.locate(index)
            item = self.sources[k][i]
        if self.source_key is None:
            return item
        if isinstance(item, Mapping):
            item = dict(item)
            item[self.source_key] = k
            return item
        return item, k

    def source_of(self, indices):
        """The source number of each index (an int array, as indices)."""
        idx = np.asarray(indices, dtype=np.int64)
        return np.searchsorted(np.asarray(self.offsets[1:], dtype=np.int64), idx, side="right")

    def draws(self, first, count, *, seed=0, shuffle=True):
        """The stream itself: the indices at positions ``first ..
        first + count - 1`` of the mixed order (positions of all ranks
        together; epoch e's position p is ``e * length + p``) and their
        sources, as the loader's sampler computes them (two arrays)."""
        idx, src = _ferry.mix_draw(self.spec, int(seed) % 2**64, bool(shuffle), int(first),
                                   int(count))
        return np.frombuffer(idx, dtype=np.uint64), np.frombuffer(src, dtype=np.uint32)

    def __repr__(self):
        return "ferry.Mix(%d sources of %s items, schedule %r)" % (
            len(self.sources), list(self.sizes), self.schedule)
