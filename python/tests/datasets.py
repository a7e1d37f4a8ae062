"""Datasets for the tests, importable by workers (conftest puts this folder
on PYTHONPATH). Item i's content is a function of i, so a test can check
every batch."""

import os
import signal
import time

import numpy as np

import ferry


class Items:
    """__getitem__: {"x": float32 (3,) all i, "y": int64 i*i}; raises on
    index `bad`, kills its own worker on index `die` (once per file flag)."""

    def __init__(self, n=100, bad=-1, die=-1, flag=None, slow_ms=0, slow_from=0):
        self.n, self.bad, self.die, self.flag = n, bad, die, flag
        self.slow_ms, self.slow_from = slow_ms, slow_from

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.slow_ms and i >= self.slow_from:
            time.sleep(self.slow_ms / 1000)
        if i == self.bad:
            raise ValueError("item %d is bad" % i)
        if i == self.die and (self.flag is None or not os.path.exists(self.flag)):
            if self.flag:
                open(self.flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"x": np.full(3, i, dtype=np.float32), "y": i * i}


class KillsItsCleanParentAfterAFork(Items):
    """Items whose clean parent (the process that unpickles it and forks
    the workers, named ferry-parent) SIGKILLs itself right after its fork
    number `fork`, on the parent's side, before it can answer with the
    fork's pid (fork 0: as it loads the dataset, before it is ready); once
    per file parent_flag. (Items' own die and flag kill a worker, so that a
    replacement is forked once the loader is open.)"""

    def __init__(self, n, parent_flag, fork, **kw):
        super().__init__(n, **kw)
        self.parent_flag, self.fork = parent_flag, fork

    def __setstate__(self, state):
        self.__dict__.update(state)
        with open("/proc/self/comm") as f:
            if f.read().strip() != "ferry-parent" or os.path.exists(self.parent_flag):
                return
        flag, forks = self.parent_flag, [0]
        if self.fork == 0:
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

        def after_a_fork():
            forks[0] += 1
            if forks[0] == self.fork and not os.path.exists(flag):
                open(flag, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        os.register_at_fork(after_in_parent=after_a_fork)


class Pairs:
    """get_batch: a tuple (int64 indices * 2, float64 (n, 2) of the epoch)."""

    def __len__(self):
        return 50

    def get_batch(self, indices, epoch):
        return indices.astype(np.int64) * 2, np.full((len(indices), 2), float(epoch))


class Augmented:
    """Per-sample randomness from ferry.worker_info().rng(i)."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        info = ferry.worker_info()
        return {"r": info.rng(i).random(), "worker": info.id}


class WrongShape:
    """Item 5 has another shape than item 0."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return np.zeros(4 if i == 5 else 3, dtype=np.int32)


class Missing:
    """Raises IndexError for items >= 8 while claiming 16."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i >= 8:
            raise IndexError("no item %d" % i)
        return np.int32(i)


class Unicode:
    """Raises on item 3 with a long non-ASCII, multi-line message."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("é" * 300 + "\nsecond line")
        return np.int64(i)


class ExtraKey:
    """Item 5 has a key item 0 lacks."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"a": i, "b": i} if i == 5 else {"a": i}


class Crash:
    """Kills its worker (SIGKILL) on item `at`, every time."""

    def __init__(self, n, at):
        self.n, self.at = n, at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.int64(i)


class PerThread:
    """How many times this thread's threading.local was set up."""

    _local = __import__("threading").local()
    _made = [0]

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if not hasattr(self._local, "handle"):
            self._made[0] += 1
            self._local.handle = self._made[0]
        return np.int64(self._local.handle)


DEFAULT = Items(n=10)  # a module-level instance: its methods are not datasets


GATE = __import__("threading").Event()  # set by a test; for thread workers only


class Gated:
    """Item `at` waits (at most 60 s) for GATE, set by the test in the same
    process (worker_mode="thread" only), then raises if `bad`."""

    def __init__(self, n=16, at=2, bad=False):
        self.n, self.at, self.bad = n, at, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            if not GATE.wait(60):
                raise TimeoutError("the test never opened the gate")
            if self.bad:
                raise ValueError("item %d is bad" % i)
        return np.int64(i)


class ArrayBacked:
    """A dataset object holding an array (pickled with it): item i is
    {"x": array[i]}."""

    def __init__(self, array):
        self.array = array

    def __len__(self):
        return len(self.array)

    def __getitem__(self, i):
        return {"x": self.array[i]}


try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # the torch tests skip themselves
    IterableDataset = object


class Shards(IterableDataset):
    """range(n) sharded over the workers as torch's docs shard it (worker w
    takes every W-th item from w); `uneven` gives worker 0 only the first
    item. Each item is (index, a draw from torch's generator)."""

    def __init__(self, n, uneven=False, fail_at=None, slow_at=None):
        self.n, self.uneven, self.fail_at, self.slow_at = n, uneven, fail_at, slow_at

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.uneven and nw > 1:
            mine = [0] if w == 0 else range(1 + w - 1, self.n, nw - 1)
        else:
            mine = range(w, self.n, nw)
        for i in mine:
            if i == self.fail_at:
                raise KeyError("stream item %d is broken" % i)
            if i == self.slow_at and os.environ.get("FERRY_TEST_GATE"):
                give_up = time.monotonic() + 30
                while not os.path.exists(os.environ["FERRY_TEST_GATE"]):
                    if time.monotonic() > give_up:
                        raise TimeoutError("the test's gate never opened")
                    time.sleep(0.005)  # a test's gate: until the file appears
            yield i, torch.rand(()).item()


class Endless(IterableDataset):
    """Worker w yields w * 10**6 + 0, 1, 2, ... without end."""

    def __iter__(self):
        info = get_worker_info()
        w = info.id if info is not None else 0
        i = 0
        while True:
            yield w * 10**6 + i
            i += 1


class BadShard(IterableDataset):
    """Its iteration cannot even start."""

    def __iter__(self):
        raise OSError("cannot open shard")


class Flaky(IterableDataset):
    """An iterator (not a generator) over worker w's share of range(24)
    that raises at item 5 and goes on after it, as a file reader skipping a
    bad record would."""

    def __iter__(self):
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return _FlakyIter(iter(range(w, 24, nw)))


class _FlakyIter:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return self

    def __next__(self):
        i = next(self.items)
        if i == 5:
            raise KeyError("bad record 5")
        return i


class Filled:
    """Item i: a float tensor of the given shape, every element i; label i."""

    def __init__(self, n, shape=(3, 32, 32)):
        self.n, self.shape = n, tuple(shape)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full(self.shape, float(i)), i


class FilledStream(IterableDataset):
    """Filled's items as a stream, sharded over the workers."""

    def __init__(self, n, shape=(3, 32, 32)):
        self.n, self.shape = n, tuple(shape)

    def __iter__(self):
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        for i in range(w, self.n, nw):
            yield torch.full(self.shape, float(i)), i


class SlowInWorkers:
    """Item `slow` takes `seconds` when a worker builds it for a batch; read
    for the schema outside a worker (the clean parent: worker_info() is
    None) it is quick, and, having asked, is not kept to serve a batch."""

    def __init__(self, n, slow, seconds):
        self.n, self.slow, self.seconds = n, slow, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.slow and ferry.worker_info() is not None:
            time.sleep(self.seconds)  # a slow item, not a wait for anything
        return {"x": np.int64(i)}


class CountsItemZero:
    """Item 0 appends a line to `log` each time it is built, and takes
    `seconds`. `draws`: it draws from numpy's global generator; `asks`: it
    asks ferry.worker_info() (None outside a worker, where ferry reads the
    schema); `rng`: its value comes from worker_info().rng(i)."""

    def __init__(self, n, log, seconds=0, draws=False, asks=False, rng=False):
        self.n, self.log, self.seconds = n, log, seconds
        self.draws, self.asks, self.rng = draws, asks, rng

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        r = float(i)
        if self.asks:
            ferry.worker_info()
        if self.rng:
            r = ferry.worker_info().rng(i).random()
        if i == 0:
            with open(self.log, "a") as f:
                f.write("%d\n" % os.getpid())
            if self.draws:
                r = np.random.random()
            time.sleep(self.seconds)  # a slow item, not a wait for anything
        return {"x": np.int64(i), "r": r}


class KillsItsWorkerAsItOpens(Items):
    """Items whose worker SIGKILLs itself as it opens the dataset (as the
    OOM killer would while the workers start), once: the file `flag` says
    it did."""

    def __init__(self, n, flag):
        super().__init__(n)
        if ferry.worker_info() is not None and not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class WaitsForFirstTask:
    """Worker 1 finishes opening only once some worker has made an item of
    a task (item 1 or later: a worker may read item 0 while it opens), or
    after 20 s; it writes whether it saw that ("1" or "0") to
    ``marker + ".saw"``. With ``die``, the worker that makes that item then
    kills itself (once: the file ``die`` says it did), and worker 1 waits
    instead for its replacement to start (``die + ".replaced"``)."""

    def __init__(self, n, marker, die=None):
        self.n, self.marker, self.die = n, marker, die
        info = ferry.worker_info()
        if info is not None and info.id == 0 and die and os.path.exists(die):
            open(die + ".replaced", "w").close()
        if info is not None and info.id == 1:
            event = die + ".replaced" if die else marker
            deadline = time.monotonic() + 20
            while not os.path.exists(event) and time.monotonic() < deadline:
                time.sleep(0.005)  # waiting for another process's file, with a deadline
            with open(marker + ".saw", "w") as f:
                f.write(str(int(os.path.exists(event))))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            if self.die and not os.path.exists(self.die):
                open(self.die, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return {"x": np.int64(i)}


def _mapping_of(address):
    """The /proc/self/maps line of the mapping holding address ('' if none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line.strip()
    return ""


class HoldsArrays:
    """A dataset holding a large numpy array, a torch tensor and a memmap:
    item i says where each lives in the worker, its type, and what the
    worker reads there after writing into its own array."""

    def __init__(self, npy_path=None):
        self.x = np.arange(8 << 20, dtype=np.uint8)  # 8 MiB
        import torch
        self.t = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
        self.m = np.load(npy_path, mmap_mode="r") if npy_path else None

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import torch
        self.x[i] = 200  # the worker's own page: never the trainer's
        out = {"x": _mapping_of(self.x.ctypes.data), "x_value": int(self.x[i]),
               "x_type": type(self.x).__name__, "x_at": self.x.ctypes.data,
               "t": _mapping_of(self.t.data_ptr()), "t_type": type(self.t).__name__,
               "t_at": self.t.data_ptr(),
               "t_sum": float(self.t[:4].sum())}
        if self.m is not None:
            out.update(m=_mapping_of(self.m.ctypes.data), m_type=type(self.m).__name__,
                       m_value=int(self.m[i, 0]))
        return out


class HoldsFrame:
    """A dataset holding a pandas DataFrame of 200,000 rows: two numeric
    columns and one of str (object). Item i: its row's values, and where
    each numeric column's values lie in the worker."""

    def __init__(self):
        import pandas as pd
        n = 200_000
        self.df = pd.DataFrame({"a": np.arange(n, dtype=np.float64) / 2,
                                "b": np.arange(n, dtype=np.int64) * 3,
                                "s": ["row%d" % k for k in range(n)]})

    def __len__(self):
        return 6

    def __getitem__(self, i):
        row = self.df.iloc[i * 1000]
        a, b = self.df["a"].to_numpy(), self.df["b"].to_numpy()
        return {"a": float(row["a"]), "b": int(row["b"]), "s": row["s"],
                "a_at": a.ctypes.data, "b_at": b.ctypes.data,
                "a_map": _mapping_of(a.ctypes.data), "type": type(self.df).__name__}


def _private_kb():
    """This process's private memory (kB): pages it wrote, or copied."""
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("Private_Dirty:", "Private_Clean:", "Anonymous:")) and
                   not line.startswith("Anonymous:"))


class HoldsCollections:
    """A dataset holding a list of n dicts, a str -> int dict of n words
    and a list of n (path, label) tuples. Item i reads every one of their
    items (what an epoch of reads does to a worker's pages) and says what
    it read and how much private memory reading it cost this process."""

    def __init__(self, n=200_000, items=4):
        self.samples = [{"path": "/data/img/%08d.jpg" % k, "label": k % 1000} for k in range(n)]
        self.vocab = {"w%d" % k: k for k in range(n)}
        self.pairs = [("/x/%d.jpg" % k, k % 7) for k in range(n)]
        self.same = self.pairs  # one list, twice
        self.items = items

    def __len__(self):
        return self.items

    def __getitem__(self, i):
        before = _private_kb()
        labels = sum(s["label"] for s in self.samples)
        paths = sum(len(s["path"]) for s in self.samples)
        words = sum(self.vocab["w%d" % k] for k in range(0, len(self.vocab), 3))
        pairs = sum(p[1] for p in self.pairs)
        grew = _private_kb() - before
        return {"i": i, "labels": labels, "paths": paths, "words": words, "pairs": pairs,
                "grew_kb": grew, "types": "%s %s %s" % (type(self.samples).__name__,
                                                      type(self.vocab).__name__,
                                                      type(self.pairs).__name__),
                "same": self.same is self.pairs, "row": repr(self.samples[i]),
                "missing": self.vocab.get("nope", -1)}


_LEAKED = []  # Leaky's: what its worker keeps, for good


class Leaky:
    """Item i: {"x": int64 i}; building it keeps `leak_kb` KiB more of
    written memory in its worker's module-level list, never given back (a
    leaky third-party decoder)."""

    def __init__(self, n=100, leak_kb=1024):
        self.n, self.leak_kb = n, leak_kb

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.leak_kb:
            _LEAKED.append(bytearray(b"\x5a") * (self.leak_kb * 1024))
        return {"x": np.int64(i)}


class BigMemmap:
    """Rows of `width` bytes of a file mapped with np.memmap (it may be far
    larger than memory, a sparse file): item i is {"i": i, "row": row i}."""

    def __init__(self, path, rows, width):
        self.m = np.memmap(path, dtype=np.uint8, mode="r", shape=(rows, width))
        self.advised = False

    def __len__(self):
        return len(self.m)

    def __getitem__(self, i):
        if not self.advised:  # random rows: no read-around (what a user would do here)
            import mmap
            self.m._mmap.madvise(mmap.MADV_RANDOM)
            self.advised = True
        return {"i": np.int64(i), "row": np.array(self.m[i])}


class OpensLazily:
    """Opens a file at its first item, as the h5py / LMDB advice goes
    (``if self.f is None: self.f = open(...)``), and reads item i at offset
    i: {"y": the byte read, "own": whether this process opened the file}.
    Item 0 built before the workers exist (to learn the batch's fields)
    must not leave them the one file, with its one offset."""

    K = 512

    def __init__(self, path, n=48):
        self.path, self.n, self.f, self.opener = path, n, None, None
        with open(path, "wb") as f:
            for i in range(n):
                f.write(bytes([i]) * self.K)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.f is None:
            self.f, self.opener = open(self.path, "rb", buffering=0), os.getpid()
        self.f.seek(i * self.K)
        time.sleep(0.001)  # (item work, so that workers' reads interleave)
        return {"y": np.int64(self.f.read(self.K)[0]), "own": self.opener == os.getpid()}


class CountsItsCalls:
    """{"calls": how many items its process built, this one included,
    "i": the index}: what building an item did to the dataset shows."""

    def __init__(self, n=8):
        self.n, self.calls = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return {"calls": self.calls, "i": i}
