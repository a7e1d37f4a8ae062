"""Datasets whose time is known, for test_profile.py: each sleeps (the
cost of an item, not a wait for anything) so that a worker's build takes
a set time whatever the machine's load."""

import time

import numpy as np

import ferry


class SlowInOneWorker:
    """Each item takes `fast_ms`, or `slow_ms` in worker `slow` (the clean
    parent, reading the schema outside any worker, is quick)."""

    def __init__(self, n, slow, fast_ms, slow_ms):
        self.n, self.slow, self.fast_ms, self.slow_ms = n, slow, fast_ms, slow_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = ferry.worker_info()
        if info is not None:
            time.sleep((self.slow_ms if info.id == self.slow else self.fast_ms) / 1000)
        return {"x": np.int64(i)}


class EveryKthBatchSlow:
    """Batches of `batch_size` items (in order, no shuffle): the first item
    of every `k`th batch takes `slow_ms`, every other item `fast_ms`."""

    def __init__(self, n, batch_size, k, fast_ms, slow_ms):
        self.n, self.bs, self.k = n, batch_size, k
        self.fast_ms, self.slow_ms = fast_ms, slow_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if ferry.worker_info() is not None:
            slow = i % self.bs == 0 and (i // self.bs) % self.k == 0
            time.sleep((self.slow_ms if slow else self.fast_ms) / 1000)
        return {"x": np.int64(i)}
