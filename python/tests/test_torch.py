"""PyTorch's DataLoader behaviours, against ferry.torch.DataLoader.

The cases of torch's own test/test_dataloader.py that apply (TestDataLoader,
TestDataLoaderPersistentWorkers, TestDictDataLoader, TestNamedTupleDataLoader,
TestStringDataLoader, worker seeds and worker_init_fn, error propagation),
written anew, each comparing with torch's DataLoader on the same data where
the semantics must match. What is skipped, and why, is at the end."""

import collections
import itertools
import logging
import os
import random
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (BatchSampler, DataLoader as TorchLoader, Dataset,  # noqa: E402
                              IterableDataset, RandomSampler, SequentialSampler, Subset,
                              SubsetRandomSampler, TensorDataset, ConcatDataset)

import ferry  # noqa: E402
from ferry.torch import DataLoader  # noqa: E402
from conftest import children  # noqa: E402
from datasets import CountsItsCalls, OpensLazily  # noqa: E402

Point = collections.namedtuple("Point", "x label")


def same(a, b):
    """a and b are the same batch: same types, structure and values."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            same(u, v)
    else:
        assert a == b, (a, b)


def same_batches(ours, theirs):
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        same(a, b)


def tensors(n=23):
    x = torch.arange(n * 6, dtype=torch.float32).reshape(n, 2, 3)
    return TensorDataset(x, torch.arange(n) * 10)


class Dicts(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"image": torch.full((2, 2), float(i)), "label": i, "weight": i / 2,
                "name": "item-%d" % i, "extra": {"flag": i % 2 == 0, "pos": np.int32(i)}}


class Points(Dataset):
    def __len__(self):
        return 9

    def __getitem__(self, i):
        return Point(np.arange(3, dtype=np.float64) + i, i)


class Strings(Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, i):
        return "s%d" % i, i


class Random(Dataset):
    """Items drawn from the three global generators a transform would use."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.rand(2), float(np.random.rand()), random.random()


class Failing(Dataset):
    def __init__(self, bad, exc):
        self.bad, self.exc = bad, exc

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc("item %d is broken" % i)
        return i


class Info(Dataset):
    """What a worker sees: torch's worker info and torch's thread count."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return (i, info.id, info.num_workers, info.seed % 2**62, torch.get_num_threads(),
                os.getpid())


def record_init(worker_id):
    np.random.seed(1000 + worker_id)
    Info.init_ids = getattr(Info, "init_ids", []) + [worker_id]


# --------------------------------------------------------------- what it yields

@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (5, False), (5, True), (23, False)])
def test_sequential_batches_are_torchs(workers, batch_size, drop_last):
    ds = tensors()
    with DataLoader(ds, batch_size=batch_size, drop_last=drop_last, num_workers=workers) as dl:
        ref = TorchLoader(ds, batch_size=batch_size, drop_last=drop_last)
        assert len(dl) == len(ref)
        same_batches(dl, ref)
        same_batches(dl, ref)  # the next epoch, again the same


@pytest.mark.parametrize("ds", [Dicts(), Points(), Strings()], ids=["dict", "namedtuple", "str"])
def test_structures_are_default_collates(ds):
    with DataLoader(ds, batch_size=4, num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=4))


class Mixed(Dataset):
    """Items that default_collate takes but whose parts are not all alike:
    a bool among int labels, a dict in another key order, a float among
    numpy floats. A worker writes each item's leaves into the batch as the
    item is made; the batches must still be torch's."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        item = {"x": torch.full((2, 3), float(i)), "v": torch.full((2, 3), -float(i)),
                "y": True if i % 5 == 3 else i,
                "z": np.full(4, i, dtype=np.float32), "w": np.float64(i) if i % 7 else 0.5}
        if i in (6, 12):  # x and v, alike, in the other order
            return {k: item[k] for k in ("v", "x", "y", "z", "w")}
        return dict(reversed(list(item.items()))) if i == 15 else item


def test_items_not_all_alike_are_collated_as_torch_does():
    ds = Mixed()
    for workers in (1, 2):
        with DataLoader(ds, batch_size=5, num_workers=workers) as dl:
            same_batches(dl, TorchLoader(ds, batch_size=5))


class TensorThenArray(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(3) if i % 2 == 0 else np.zeros(3, dtype=np.float32)


def test_a_tensor_then_an_array_fails_as_in_torch():
    with pytest.raises(TypeError, match="expected Tensor"):
        next(iter(TorchLoader(TensorThenArray(), batch_size=2)))
    with DataLoader(TensorThenArray(), batch_size=2, num_workers=1) as dl:
        with pytest.raises(TypeError, match="expected Tensor"):
            next(iter(dl))


def slot_ranges():
    """The address ranges of ferry's batch slots mapped in this process."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:ferry-slots" in line:
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def test_fixed_fields_are_tensors_on_the_batch_memory():
    with DataLoader(Dicts(), batch_size=4, num_workers=2) as dl:
        b = next(iter(dl))
        # The numeric fields are the batch slot's memory, where the worker
        # stacked them: no copy on the trainer's side.
        ranges = slot_ranges()
        for t in (b["image"], b["label"], b["extra"]["pos"]):
            p = t.data_ptr()
            assert any(lo <= p and p + t.numel() * t.element_size() <= hi
                       for lo, hi in ranges), (p, ranges)


def pad(items):
    """A collate_fn of the kind sequence models use: ragged, padded."""
    seqs = [torch.arange(len(it[1]) if isinstance(it[1], str) else it[1] + 1) for it in items]
    return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), [str(it[0]) for it in items]


def test_collate_fn_runs_in_the_worker_and_may_return_anything():
    ds = Strings()
    with DataLoader(ds, batch_size=3, num_workers=2, collate_fn=pad) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=3, collate_fn=pad))


def test_batch_size_none_gives_items_converted():
    ds = Dicts()
    with DataLoader(ds, batch_size=None, num_workers=2) as dl:
        assert len(dl) == len(ds)
        same_batches(dl, TorchLoader(ds, batch_size=None))


def test_composed_datasets():
    ds = ConcatDataset([Subset(tensors(), [3, 1, 4]), tensors(5)])
    with DataLoader(ds, batch_size=2, num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=2))


# --------------------------------------------------------------- samplers

def flat_labels(dl):
    return [int(v) for _, y in dl for v in y]


def test_shuffle_gives_every_item_once_per_epoch_and_repeats_under_manual_seed():
    ds = tensors(50)
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=7, shuffle=True, num_workers=2) as dl:
        a, b = flat_labels(dl), flat_labels(dl)
    assert sorted(a) == sorted(b) == list(range(0, 500, 10))
    assert a != b and a != sorted(a)  # each epoch its own permutation
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=7, shuffle=True, num_workers=3) as dl:
        assert flat_labels(dl) == a
    torch.manual_seed(1)
    with DataLoader(ds, batch_size=7, shuffle=True, num_workers=2) as dl:
        assert flat_labels(dl) != a
    g = torch.Generator().manual_seed(5)
    with DataLoader(ds, batch_size=7, shuffle=True, generator=g) as dl:
        first = flat_labels(dl)
    with DataLoader(ds, batch_size=7, shuffle=True,
                    generator=torch.Generator().manual_seed(5)) as dl:
        assert flat_labels(dl) == first


def test_samplers_drive_the_indices():
    ds = tensors(30)
    with DataLoader(ds, batch_size=4, sampler=SequentialSampler(ds), num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=4))
    with DataLoader(ds, batch_size=4, sampler=RandomSampler(ds), num_workers=2) as dl:
        assert sorted(flat_labels(dl)) == list(range(0, 300, 10))
    subset = [2, 3, 5, 7, 11, 13]
    with DataLoader(ds, batch_size=4, sampler=SubsetRandomSampler(subset), num_workers=2) as dl:
        assert sorted(flat_labels(dl)) == [10 * i for i in subset]
    order = [9, 0, 4, 4, 1]
    with DataLoader(ds, batch_size=2, sampler=order, num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=2, sampler=order))
    bs = BatchSampler(SequentialSampler(ds), batch_size=8, drop_last=True)
    with DataLoader(ds, batch_sampler=bs, num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_sampler=bs))


@pytest.mark.parametrize("n,world,drop", [(40, 2, False), (41, 3, False), (41, 3, True)])
def test_distributed_sampler_shards_as_torchs(n, world, drop):
    from torch.utils.data.distributed import DistributedSampler
    ds = tensors(n)
    seen = []
    for rank in range(world):
        s = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False, drop_last=drop)
        with DataLoader(ds, batch_size=5, sampler=s, num_workers=2) as dl:
            # torch's shard: padded to ceil(n / world) from the order's start,
            # or cut to n // world with the sampler's drop_last
            same_batches(dl, TorchLoader(ds, batch_size=5, sampler=s))
            seen += flat_labels(dl)
    if not drop:
        assert set(seen) == set(range(0, 10 * n, 10))  # every item, each epoch


def test_a_sampler_index_out_of_range_is_named():
    with pytest.raises(IndexError, match="index 99"):
        DataLoader(tensors(10), sampler=[1, 99])


def stream_epochs(loader_cls, ds, epochs=2, **kw):
    """Two epochs of a loader over an IterableDataset, as lists of batches."""
    torch.manual_seed(3)
    dl = loader_cls(ds, **kw)
    try:
        return [list(dl) for _ in range(epochs)]
    finally:
        if hasattr(dl, "close"):
            dl.close()


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("batching", [dict(batch_size=4), dict(batch_size=4, drop_last=True),
                                      dict(batch_size=None), dict(batch_size=1)])
def test_iterable_dataset_batches_as_torch_gives_them(workers, batching):
    import datasets
    kw = dict(batching, num_workers=workers)
    if workers:
        kw["persistent_workers"] = True
    for ds in (datasets.Shards(23), datasets.Shards(23, uneven=True)):
        ours = stream_epochs(DataLoader, ds, **kw)
        theirs = stream_epochs(TorchLoader, ds, **kw)
        # The same indices, in the same order: round-robin over the workers
        # whose iterators have not ended, each collated in its worker.
        def idx(b):
            return b[0].tolist() if isinstance(b[0], torch.Tensor) else b[0]
        assert [[idx(b) for b in e] for e in ours] == [[idx(b) for b in e] for e in theirs]
        for e in ours:
            for b in e:
                if kw.get("batch_size", 1) is not None:
                    assert isinstance(b, list) and b[0].dtype == torch.int64


def test_iterable_dataset_arguments_follow_torch():
    import datasets
    ds = datasets.Shards(10)
    for bad in (dict(shuffle=True), dict(sampler=[1, 2]), dict(batch_sampler=[[1]]),
                dict(batch_size=None, drop_last=True)):
        with pytest.raises(ValueError) as ours:
            DataLoader(ds, **bad)
        with pytest.raises(ValueError) as theirs:
            TorchLoader(ds, **bad)
        assert str(ours.value) == str(theirs.value)
    assert len(DataLoader(ds, batch_size=3)) == len(TorchLoader(ds, batch_size=3)) == 4
    assert len(DataLoader(ds, batch_size=3, drop_last=True)) == 3
    assert isinstance(DataLoader(ds), DataLoader)
    with pytest.raises(NotImplementedError, match="resumed"):
        DataLoader(ds, num_workers=1, state={})


def test_iterable_dataset_repeats_under_a_seed_and_tells_workers_apart():
    import datasets
    ds = datasets.Shards(24)
    a = stream_epochs(DataLoader, ds, batch_size=4, num_workers=2)
    b = stream_epochs(DataLoader, ds, batch_size=4, num_workers=2)
    same_batches(a[0] + a[1], b[0] + b[1])
    draws = [float(x) for e in a for batch in e for x in batch[1]]
    assert len(set(draws)) == len(draws)  # workers and epochs draw differently


def test_iterable_dataset_errors_arrive_as_their_type_and_the_stream_goes_on():
    import datasets
    with DataLoader(datasets.Shards(12, fail_at=5), batch_size=2, num_workers=2) as dl:
        got = []
        with pytest.raises(KeyError, match="stream item 5 is broken") as raised:
            for b in dl:
                got.append(b[0].tolist())
        assert isinstance(raised.value, ferry.BatchError)
        assert raised.value.epoch == 0 and raised.value.index is None
        assert "worker 1 (pid" in str(raised.value)
        assert "failed on batch 1 of its stream's epoch 0" in str(raised.value)
        # The next epoch starts afresh (the broken one's rest is dropped),
        # and the stream breaks at the same place again, as torch's would.
        again = []
        with pytest.raises(KeyError, match="stream item 5 is broken"):
            for b in dl:
                again.append(b[0].tolist())
        assert again == got and got


def test_iterable_dataset_for_left_early_moves_on_at_once_even_when_endless():
    # torch's iterator restarts the workers' iterators; an endless stream
    # (or one failing on every batch) must not keep the next for waiting.
    import datasets
    with DataLoader(datasets.Endless(), batch_size=2, num_workers=2, timeout=20) as dl:
        for _ in range(3):
            firsts = []
            for b in dl:
                firsts.append(b.tolist())
                if len(firsts) == 3:
                    break
            # every for starts fresh iterators: worker 0, worker 1, worker 0
            assert firsts == [[0, 1], [10**6, 10**6 + 1], [2, 3]]
    with DataLoader(datasets.BadShard(), batch_size=2, num_workers=2, timeout=20) as dl:
        for _ in range(2):
            with pytest.raises(OSError, match="cannot open shard"):
                list(dl)


def test_iterable_dataset_iterator_going_on_after_an_error_loses_nothing_after_it():
    import datasets
    with DataLoader(datasets.Flaky(), batch_size=2, num_workers=1) as dl:
        it = iter(dl)
        got = [next(it).tolist(), next(it).tolist()]
        with pytest.raises(KeyError, match="bad record 5"):
            next(it)
    # the next for: the same again, the batches after the error too
    with DataLoader(datasets.Flaky(), batch_size=2, num_workers=1) as dl:
        seen = []
        it = iter(dl)
        while True:
            try:
                seen.append(next(it).tolist())
            except KeyError:
                break
        assert seen == got == [[0, 1], [2, 3]]
    # and a replacement catching up past the error makes what the original did
    from ferry.torch._iterable import _StreamBatches
    def maker():
        sb = _StreamBatches(datasets.Flaky(), None, None, True, 7, "batch", None, 1, -1)
        sb.batch_size, sb.drop_last = 2, False
        return sb
    original = maker()
    made = []
    for k in range(6):
        try:
            made.append(original._next_batch(0, 0, k)[3].tolist())
        except KeyError:
            made.append("KeyError")
    assert made == [[0, 1], [2, 3], "KeyError", [6, 7], [8, 9], [10, 11]]
    late = maker()
    assert [late._next_batch(0, 0, k)[3].tolist() for k in (3, 4, 5)] == made[3:]


def test_iterable_dataset_iterates_again_after_its_workers_are_closed():
    import datasets
    dl = DataLoader(datasets.Shards(12), batch_size=2, num_workers=2)
    try:
        first = [b[0].tolist() for b in dl]
        dl.close_workers()
        assert [b[0].tolist() for b in dl] == first
        dl.close()
        assert [b[0].tolist() for b in dl] == first
    finally:
        dl.close()


@pytest.mark.parametrize("loader_cls", [TorchLoader, DataLoader], ids=["torch", "ferry"])
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_an_iterators_worker_processes_exit_cleanly_once_it_and_its_loader_are_gone(
        loader_cls, style):
    """iter(loader)._workers (a private attribute that torch's own tests
    read) are the worker processes; once the iterator and the loader are
    dropped they end, and joining them gives their real exit status: 0, a
    clean exit, not a kill."""
    import datasets
    ds = datasets.Shards(12) if style == "iterable" else tensors(12)
    dl = loader_cls(ds, batch_size=2, num_workers=2)
    it = iter(dl)
    assert next(it) is not None
    procs = it._workers
    assert len(procs) == 2 and len({p.pid for p in procs}) == 2
    for p in procs:  # running: real processes, this process's children
        assert p.is_alive() and p.exitcode is None
        with open("/proc/%d/stat" % p.pid) as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    assert len(list(it)) == 5
    del it, dl
    for p in procs:
        p.join(30)
        assert not p.is_alive() and p.exitcode == 0
    del procs


def test_a_killed_worker_process_shows_its_signal_and_its_replacement_is_another_process():
    """What _workers says is the processes' truth, not a default: a worker
    sent SIGTERM through it ends with -SIGTERM as its exitcode (as
    multiprocessing says a signal death), ferry replaces it, and the epoch
    loses no batch; the iterator's _workers then shows the replacement."""
    import signal
    first = now = None
    try:
        with DataLoader(tensors(40), batch_size=2, num_workers=2) as dl:
            it = iter(dl)
            got = [next(it)]
            first = it._workers[0]
            first.terminate()
            first.join(30)
            assert not first.is_alive() and first.exitcode == -signal.SIGTERM
            got += list(it)
            same_batches(got, TorchLoader(tensors(40), batch_size=2))
            now = it._workers[0]
            assert now.pid != first.pid and now.is_alive() and now.exitcode is None
            first.terminate()  # ended: never signalled again (its pid may be reused)
        assert first.exitcode == -signal.SIGTERM  # still known after the loader has gone
    finally:  # their pidfds, also if the test fails (the traceback keeps them)
        for p in (first, now):
            if p is not None:
                p.close()


def _rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def test_iterable_dataset_batches_are_views_of_shared_memory_and_forks_copy_only_them():
    # A stream's tensors travel in a byte field of the batch slot, whose
    # reserve (64 MiB) is far larger than the batch: the batch is a view of
    # the slot, and a fork while batches are held (torch's fork workers, a
    # multiprocessing pool) copies only the batches, not the reserves.
    import datasets
    with DataLoader(datasets.Shards(40), batch_size=2, num_workers=1) as dl:
        held = list(dl)
        st = dl.stats()
        assert st["shared"] >= 5 and st["slot_bytes"] >= 64 << 20
        assert st["slot_memory"] < 64 << 20  # allocated as written: a page or so a batch
        want = [b[0].tolist() for b in held]
        before = _rss_anon_kib()
        pid = os.fork()
        if pid == 0:  # the child never returns to pytest, whatever happens
            code = 1
            try:
                grew = _rss_anon_kib() - before
                ok = [b[0].tolist() for b in held] == want  # the child's copies
                code = 0 if ok and grew < 64 * 1024 else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_iterable_dataset_refuses_options_that_shard_by_index():
    import datasets
    for key, value in (("rank", 1), ("world", 2), ("max_batches", 3), ("epochs", 1)):
        with pytest.raises(TypeError, match=key):
            DataLoader(datasets.Shards(10), num_workers=2, **{key: value})


def test_iterable_dataset_worker_killed_loses_and_repeats_nothing(tmp_path, monkeypatch):
    import signal
    import datasets
    gate = tmp_path / "gate"
    monkeypatch.setenv("FERRY_TEST_GATE", str(gate))
    ds = datasets.Shards(40, slow_at=21)  # worker 1's 11th item waits for the gate
    want = stream_epochs(TorchLoader, datasets.Shards(40), batch_size=2, num_workers=2,
                         persistent_workers=True)
    torch.manual_seed(3)
    with DataLoader(ds, batch_size=2, num_workers=2) as dl:
        got, killed = [], False
        for b in dl:
            got.append(b)
            if len(got) == 6 and not killed:  # worker 1 is mid-epoch, held at the gate
                os.kill(dl._loader.worker_pid(1), signal.SIGKILL)
                killed = True
                gate.touch()
        second = list(dl)
        assert dl.stats()["restarts"] == 1
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in want[0]]
    assert [b[0].tolist() for b in second] == [b[0].tolist() for b in want[1]]


def weighted(n=30, seed=0):
    w = torch.arange(1, n + 1, dtype=torch.float64)
    return torch.utils.data.WeightedRandomSampler(w, 25, generator=torch.Generator().manual_seed(seed))


class Buckets:
    """A batch sampler of the user's: batches of varying size, a new
    order each epoch (set_epoch), with state_dict."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def set_epoch(self, e):
        self.epoch = e

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(self.n)
        cuts = [0, 3, 4, 9, 15, self.n]
        return iter([order[a:b].tolist() for a, b in zip(cuts, cuts[1:])])

    def __len__(self):
        return 5


@pytest.mark.parametrize("workers", [0, 2])
def test_samplers_of_any_kind_give_torchs_batches(workers):
    ds = tensors(30)
    ours = DataLoader(ds, batch_size=4, sampler=weighted(), num_workers=workers)
    theirs = TorchLoader(ds, batch_size=4, sampler=weighted())
    with ours:
        for _ in range(3):  # epochs: each a new draw, as torch's
            same_batches(ours, theirs)
    ours = DataLoader(ds, batch_sampler=Buckets(30), num_workers=workers)
    theirs_bs = Buckets(30)
    with ours:
        for e in range(3):
            theirs_bs.set_epoch(e)
            got = list(ours)
            want = list(TorchLoader(ds, batch_sampler=theirs_bs))
            assert [len(b[1]) for b in got] == [3, 1, 5, 6, 15]
            same_batches(got, want)


def test_a_user_sampler_resumes_exactly():
    ds = tensors(30)
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=4, sampler=weighted(), num_workers=2) as dl:
        whole = list(dl) + list(dl) + list(dl)
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=4, sampler=weighted(), num_workers=2) as dl:
        head = list(dl)
        it = iter(dl)
        head += [next(it) for _ in range(3)]
        state = dl.state_dict()
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=4, sampler=weighted(), num_workers=2, state=state) as dl:
        rest = list(dl) + list(dl)
    same_batches(head + rest, whole)


def test_a_sampler_without_len_is_refused():
    with pytest.raises(TypeError, match="len"):
        DataLoader(tensors(5), sampler=iter(range(5)))


# --------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs,words", [
    (dict(sampler=[0, 1], shuffle=True), "mutually exclusive with shuffle"),
    (dict(batch_sampler=BatchSampler(SequentialSampler(range(5)), 2, False), batch_size=3),
     "mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "mutually exclusive with drop_last"),
    (dict(num_workers=-1), "non-negative"),
    (dict(timeout=-1), "non-negative"),
    (dict(prefetch_factor=3), "prefetch_factor"),
    (dict(persistent_workers=True), "num_workers > 0"),
])
def test_bad_arguments_raise_torchs_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        TorchLoader(tensors(5), **kwargs)
    with pytest.raises(ValueError, match=words):
        DataLoader(tensors(5), **kwargs)


def test_the_class_is_generic_and_its_arguments_stay_set():
    """DataLoader[T] works in annotations (torch's is Generic[T_co]), and the
    attributes torch freezes after construction raise torch's ValueError
    when set (an assignment that seemed to work changed nothing)."""
    import typing

    def f(dl: DataLoader[typing.List[torch.Tensor]]) -> DataLoader[int]:
        return dl
    assert DataLoader[int] is not None and f.__annotations__["return"] == DataLoader[int]
    for cls in (DataLoader, TorchLoader):
        dl = cls(tensors(8), batch_size=2)
        for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
            with pytest.raises(ValueError, match="%s attribute should not be set" % attr):
                setattr(dl, attr, getattr(dl, attr))
        dl.num_workers = 0  # not frozen in torch either
        if cls is DataLoader:
            dl.close()


@pytest.mark.parametrize("ctx, workers, exc", [("bad", 2, ValueError), (object(), 2, TypeError),
                                                ("fork", 0, ValueError)])
def test_a_bad_multiprocessing_context_is_refused_as_torch_refuses_it(ctx, workers, exc):
    for cls in (DataLoader, TorchLoader):
        with pytest.raises(exc, match="multiprocessing_context"):
            cls(tensors(8), num_workers=workers, multiprocessing_context=ctx)


def test_more_workers_than_cpus_warns():
    n = len(os.sched_getaffinity(0)) + 1
    with pytest.warns(UserWarning, match="more workers than CPUs"):
        DataLoader(tensors(8), num_workers=n).close()


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="no_such_option"):
        DataLoader(tensors(5), no_such_option=1).__iter__().__next__()


def test_pin_memory_without_cuda_warns_once():
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: pin_memory pins")
    from ferry.torch import _once
    _once._warned.discard("pin")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with DataLoader(tensors(6), batch_size=3, pin_memory=True) as dl:
            same_batches(dl, TorchLoader(tensors(6), batch_size=3))
        DataLoader(tensors(6), pin_memory=True).close()
    assert sum("pin_memory" in str(x.message) for x in w) == 1


class FakeCuda:
    """torch.cuda as _SlotPins uses it, on a machine without a GPU: a
    cudart that records registrations, and events that complete when the
    test says so."""

    def __init__(self, monkeypatch, fail=False):
        from ferry.torch import _dataloader
        self.registered, self.unregistered, self.events, self.fail = {}, [], [], fail
        fake = self

        class Event:
            def __init__(self):
                self.done = False
                fake.events.append(self)

            def query(self):
                return self.done

            def synchronize(self):
                self.done = True

        class Stream:
            def record_event(self):
                return Event()

        class Cudart:
            def cudaHostRegister(self, addr, n, flags):
                if fake.fail:
                    return 3
                fake.registered[addr] = (n, flags)
                return 0

            def cudaHostUnregister(self, addr):
                fake.unregistered.append(addr)
                return 0

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(_dataloader, "_tcollate_pin", lambda obj: obj)  # no CUDA to copy with


def test_pinned_slots_are_registered_once_and_wait_for_their_copies(monkeypatch):
    """_SlotPins's bookkeeping, with CUDA faked (test_cuda_pin runs it on a
    GPU): each slot registered once, portable; a dead batch's slot not
    used again until the event recorded at its death completes; every slot
    unregistered, after the events, when the loader closes."""
    fake = FakeCuda(monkeypatch)
    data = TensorDataset(torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32))
    with DataLoader(data, batch_size=4, num_workers=2, pin_memory=True) as dl:
        it = iter(dl)
        (x,) = next(it)
        first = x.data_ptr()
        assert any(a <= first < a + n for a, (n, _) in fake.registered.items())
        assert {f for _, f in fake.registered.values()} == {1}  # cudaHostRegisterPortable
        del x  # the first batch dies: an event is recorded for its copy
        (y,) = next(it)
        assert len(fake.events) == 1 and dl.stats()["slots_awaiting_copy"] == 1
        for (x,) in itertools.islice(it, 8):  # its copy has not run: its slot stays out
            assert not (first <= x.data_ptr() < first + dl.stats()["slot_bytes"])
        del x, y
        assert dl.stats()["slots_awaiting_copy"] >= 8
        fake.events[0].done = True
        reused = False
        for (x,) in it:
            reused |= x.data_ptr() == first
        del x
        assert reused  # once the event completed, the slot came back into use
        registered = set(fake.registered)
        assert dl.stats()["pinned_slots"] == len(registered) >= 2
    assert set(fake.unregistered) == registered and len(fake.unregistered) == len(registered)
    assert all(e.done for e in fake.events)  # closing waited for every copy


def test_a_slot_that_cannot_be_registered_warns_and_copies(monkeypatch):
    from ferry.torch import _once
    _once._warned.discard("pin-slots")
    fake = FakeCuda(monkeypatch, fail=True)
    data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(16, 4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with DataLoader(data, batch_size=4, num_workers=2, pin_memory=True) as dl:
            same_batches(dl, TorchLoader(data, batch_size=4))
            assert dl.stats()["pinned_slots"] == 0
    assert sum("cudaHostRegister" in str(x.message) for x in w) == 1
    assert fake.events == []  # nothing registered: no slot waits


def test_timeout_raises_torchs_runtime_error():
    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                import time
                time.sleep(30)  # the workload being timed out, not a synchronisation
            return i
    with DataLoader(Slow(), batch_size=2, num_workers=1, timeout=0.3) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1]
        with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
            next(it)


# --------------------------------------------------------------- workers

def test_worker_info_threads_and_init_fn():
    with DataLoader(Info(), batch_size=2, num_workers=2, worker_init_fn=record_init) as dl:
        rows = [tuple(int(v) for v in row) for b in dl for row in zip(*b)]
    assert sorted(r[0] for r in rows) == list(range(8))
    by_pid = {}
    for _, wid, nw, seed, threads, pid in rows:
        assert nw == 2 and threads == 1
        by_pid.setdefault(pid, set()).add((wid, seed))
    # one worker id (and one torch seed: base seed + id) per process
    assert all(len(v) == 1 for v in by_pid.values())
    ids = {next(iter(v))[0] for v in by_pid.values()}
    assert ids <= {0, 1}
    seeds = {next(iter(v))[0]: next(iter(v))[1] for v in by_pid.values()}
    if len(seeds) == 2:
        assert seeds[1] - seeds[0] == 1


def test_worker_init_fn_runs_once_in_each_worker():
    class Inits(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return len(getattr(Inits, "calls", [])), os.getpid()

    def init(worker_id):
        Inits.calls = getattr(Inits, "calls", []) + [worker_id]

    with DataLoader(Inits(), batch_size=1, num_workers=2, worker_init_fn=init) as dl:
        for _ in range(2):
            for calls, _ in dl:
                assert int(calls) == 1  # called once in this worker, before its items


@pytest.mark.parametrize("reseed", ["batch", "sample"])
def test_augmentations_repeat_under_manual_seed_whatever_the_workers(reseed):
    def run(workers):
        torch.manual_seed(0)
        with DataLoader(Random(), batch_size=4, shuffle=True, num_workers=workers,
                        reseed=reseed) as dl:
            return [b for _ in range(2) for b in dl]
    a, b = run(2), run(3)
    for x, y in zip(a, b):
        same(x, y)
    assert not torch.equal(a[0][0], a[1][0])  # items differ from one another
    torch.manual_seed(1)
    with DataLoader(Random(), batch_size=4, shuffle=True, num_workers=2, reseed=reseed) as dl:
        assert not torch.equal(next(iter(dl))[0], a[0][0])


def test_num_workers_0_draws_from_the_trainers_generator_as_torch_does():
    # torch draws the base seed from the global generator, and seeds
    # nothing in the trainer: the training's own draws go on the same.
    torch.manual_seed(3)
    list(TorchLoader(tensors(6), batch_size=2))
    expect = torch.rand(1)
    torch.manual_seed(3)
    with DataLoader(tensors(6), batch_size=2) as dl:
        list(dl)
    assert torch.equal(torch.rand(1), expect)


class Draws(Dataset):
    """Each item: a draw from torch's generator and the seed it started from."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.rand(1), torch.initial_seed()


def _seed_12345(worker_id):
    torch.manual_seed(12345)


def test_code_written_for_torchs_seeding_behaves_as_with_torch():
    """A worker_init_fn that seeds torch (torch.manual_seed(12345)) is not
    overwritten by ferry's per-batch seeding: one worker draws what torch's
    one worker draws. And every seed a worker sees is below 2^63, as
    torch's are, so a dataset that collates torch.initial_seed() into a
    tensor works (seeds past 2^63 made default_collate overflow)."""
    kw = dict(batch_size=3, num_workers=1, worker_init_fn=_seed_12345)
    want = [(x, s) for x, s in TorchLoader(Draws(), **kw)]
    with DataLoader(Draws(), **kw) as dl:
        got = [(x, s) for x, s in dl]
    assert len(got) == len(want) == 4
    for (gx, gs), (wx, ws) in zip(got, want):
        assert torch.equal(gx, wx)
        assert gs.tolist() == ws.tolist() == [12345] * 3
    for reseed in ("batch", "sample"):  # ferry's own seeds, chosen explicitly
        with DataLoader(Draws(), batch_size=3, num_workers=2, reseed=reseed) as dl:
            seeds = torch.cat([s for _, s in dl])
        assert seeds.dtype == torch.int64 and int(seeds.min()) >= 0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["shuffle", "shuffle_generator", "random_sampler_generator",
                                 "subset", "sequential"])
def test_the_loader_draws_from_torchs_generators_what_torchs_draws(workers, how):
    """Building the loader draws nothing, and each iter() draws what torch's
    DataLoader draws (its base seed, then its sampler's seed or randperm),
    from the same generators: a model built after the loader, and the
    training step's draws after each epoch, are the ones the same script
    gets under torch. ferry used to draw its base seed at construction."""
    def run(cls):
        torch.manual_seed(7)
        g = torch.Generator().manual_seed(3)
        kw = {"shuffle": dict(shuffle=True),
              "shuffle_generator": dict(shuffle=True, generator=g),
              "random_sampler_generator": dict(sampler=RandomSampler(range(20), generator=g)),
              "subset": dict(sampler=SubsetRandomSampler(list(range(0, 20, 2)))),
              "sequential": {}}[how]
        dl = cls(tensors(20), batch_size=4, num_workers=workers, **kw)
        seen = [torch.rand(2)]  # a model built after the loader
        for _ in range(2):
            for _b in dl:
                pass
            seen.append(torch.rand(2))  # the step after each epoch
        seen.append(g.get_state())
        if cls is DataLoader:
            dl.close()
        return seen
    for a, b in zip(run(DataLoader), run(TorchLoader)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_of_no_batch_draws_what_torchs_draws(workers):
    """RandomSampler's second randperm, drawn as its iterator runs out,
    falls with an epoch's last batch; an epoch with none (3 items,
    drop_last batches of 4) draws it all the same, as torch's does."""
    def run(cls):
        g = torch.Generator().manual_seed(11)
        dl = cls(tensors(3), batch_size=4, drop_last=True, shuffle=True, generator=g,
                 num_workers=workers)
        got = []
        for _ in range(2):
            got.append(len(list(dl)))
            got.append(g.get_state())
        if cls is DataLoader:
            dl.close()
        return got
    mine, theirs = run(DataLoader), run(TorchLoader)
    assert mine[0] == theirs[0] == 0
    for a, b in zip(mine[1::2], theirs[1::2]):
        assert torch.equal(a, b)


class Boxes(Dataset):
    """A detection dataset's items: an image and its boxes, item 0 with none
    (every item's boxes empty with `always_empty`)."""

    def __init__(self, always_empty):
        self.always_empty = always_empty

    def __len__(self):
        return 6

    def __getitem__(self, i):
        k = 0 if self.always_empty else i
        return torch.full((2,), float(i)), torch.arange(4 * k, dtype=torch.float32).reshape(k, 4)


@pytest.mark.parametrize("always_empty, batch_size", [(True, 2), (False, 1)])
def test_an_empty_tensor_in_item_0_collates_as_torchs(always_empty, batch_size):
    """An item whose tensor has a dimension of size 0 (no boxes, no tokens)
    collates as torch collates it: (B, 0, 4) for all-empty items, and item 0
    empty with later items not (batch size 1). Item 0's empty tensor used
    to fail the workers' start ("field '1' has dim 0 of size 0")."""
    ds = Boxes(always_empty)
    with DataLoader(ds, batch_size=batch_size, num_workers=2) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=batch_size))


def _epochs_with_set_epoch(epochs, workers=2):
    """[each epoch's indices] of a DataLoader over a shuffling
    DistributedSampler whose set_epoch(e) the script calls before each
    epoch, and whether the loader kept its workers throughout."""
    ds = TensorDataset(torch.arange(40))
    s = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=2, rank=1,
                                                        shuffle=True, seed=3)
    out = []
    with DataLoader(ds, batch_size=5, sampler=s, num_workers=workers) as dl:
        first = None
        for e in epochs:
            s.set_epoch(e)
            out.append(torch.cat([b[0] for b in dl]).tolist())
            first = first or dl._loader
        kept = dl._loader is first
    return out, kept


def test_a_samplers_set_epoch_decides_the_epoch_as_in_torch():
    """The script's own set_epoch(e) on a DistributedSampler decides the
    epoch its next `for` gets, as with torch: resuming at epoch 5 by
    set_epoch(5) gives epoch 5's batches (it gave epoch 0's), and the
    usual loop (set_epoch(0), (1), ...) keeps its workers and prefetch."""
    run, kept = _epochs_with_set_epoch(range(6))
    assert kept and len({tuple(e) for e in run}) == 6
    resumed, _ = _epochs_with_set_epoch([5])
    assert resumed == [run[5]]
    again, _ = _epochs_with_set_epoch([3, 3, 1])  # an epoch asked for twice, then back
    assert again == [run[3], run[3], run[1]]


class WhoMadeItAndWhat(Dataset):
    """Item i says which worker built it, and i."""

    def __len__(self):
        return 45

    def __getitem__(self, i):
        return torch.utils.data.get_worker_info().id, i


def _makers(loader, epochs=2):
    """Per epoch, the worker id that made each batch (all of a batch's
    items must agree), and the items seen."""
    out, items = [], []
    for _ in range(epochs):
        ids = []
        for who, idx in loader:
            assert len(set(who.tolist())) == 1, who
            ids.append(int(who[0]))
            items += idx.tolist()
        out.append(ids)
    return out, items


@pytest.mark.parametrize("workers,batch_size", [(1, 4), (2, 4), (3, 8), (4, 2), (5, 16)])
def test_by_default_batch_b_is_made_by_worker_b_mod_workers_as_with_torch(workers, batch_size):
    """torch gives batch b of each epoch to worker b % num_workers (code
    keeping a file, cache or connection per worker relies on it); ferry's
    DataLoader does the same by default, shuffled or not, in every epoch."""
    for shuffle in (False, True):
        kw = dict(batch_size=batch_size, num_workers=workers, shuffle=shuffle)
        theirs, _ = _makers(TorchLoader(WhoMadeItAndWhat(), **kw))
        with DataLoader(WhoMadeItAndWhat(), **kw) as dl:
            ours, items = _makers(dl)
        assert ours == theirs
        assert sorted(items) == sorted(list(range(45)) * 2)


def test_a_replacement_worker_makes_the_batches_of_the_one_it_replaces():
    """Worker 1 killed mid-epoch: its replacement (the same worker id)
    makes its batches, so batch b is still made by worker b % num_workers,
    and no batch is lost or repeated."""
    import signal
    want, _ = _makers(TorchLoader(WhoMadeItAndWhat(), batch_size=3, num_workers=3), epochs=1)
    with DataLoader(WhoMadeItAndWhat(), batch_size=3, num_workers=3) as dl:
        it = iter(dl)
        got = [next(it), next(it)]
        victim = it._workers[1]
        try:
            victim.kill()
            victim.join(30)
            assert victim.exitcode == -signal.SIGKILL
        finally:
            victim.close()  # its pidfd, also if the test fails (the traceback keeps it)
        got += list(it)
        assert [int(w[0]) for w, _ in got] == want[0]
        assert sorted(i for _, idx in got for i in idx.tolist()) == list(range(45))
        assert dl.stats()["restarts"] == 1


def test_pin_tasks_0_or_in_order_false_let_any_free_worker_make_a_batch():
    """Opting out (pin_tasks=0), or in_order=False (where torch too gives a
    batch to a worker with room), every batch arrives once, whoever makes
    it."""
    for kw in (dict(pin_tasks=0), dict(in_order=False)):
        with DataLoader(WhoMadeItAndWhat(), batch_size=4, num_workers=3, **kw) as dl:
            _, items = _makers(dl)
        assert sorted(items) == sorted(list(range(45)) * 2)


def test_the_signature_is_torchs():
    """inspect.signature and help() show torch's DataLoader's parameters and
    defaults; torch's default prefetch_factor is accepted without workers."""
    import inspect
    assert inspect.signature(DataLoader) == inspect.signature(TorchLoader)
    default = inspect.signature(TorchLoader).parameters["prefetch_factor"].default
    DataLoader(tensors(4), num_workers=0, prefetch_factor=default).close()


class Unsharded(IterableDataset):
    """Every worker yields the whole range: twice len() with two workers."""

    def __len__(self):
        return 6

    def __iter__(self):
        return iter(range(6))


def test_an_iterable_yielding_more_than_its_len_warns_as_torch_does():
    with DataLoader(Unsharded(), batch_size=2, num_workers=2) as dl:
        assert len(dl) == 3
        with pytest.warns(UserWarning, match="was reported to be 3") as said:
            assert len(list(dl)) == 6
        assert sum("samples have been fetched" in str(w.message) for w in said) == 3
    with DataLoader(Unsharded(), batch_size=2, num_workers=2) as dl:  # len() never asked
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sum(1 for _ in dl) == 6  # (list() would ask len() for a size hint)


class SlowFirst(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            import time
            time.sleep(6)
        return i


def test_timeout_covers_a_slow_first_batch():
    """timeout= bounds the wait for the first batch too, as torch's does:
    item 0 taking 6 s with timeout=1 raises torch's RuntimeError long
    before the item is done (ferry built item 0 at the workers' start,
    outside any timeout, and returned the batch after 7 s)."""
    import time
    t0 = time.monotonic()
    with DataLoader(SlowFirst(), batch_size=1, num_workers=2, timeout=1) as dl:
        with pytest.raises(RuntimeError, match="DataLoader timed out after 1 seconds"):
            next(iter(dl))
    took = time.monotonic() - t0
    assert took < 5, took


# --------------------------------------------------------------- errors

@pytest.mark.parametrize("exc", [OSError, KeyError, ValueError, ZeroDivisionError])
def test_a_datasets_exception_is_caught_as_its_own_type(exc):
    with DataLoader(Failing(3, exc), batch_size=2, num_workers=2) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1]
        with pytest.raises(exc) as raised:
            next(it)
        e = raised.value
        assert isinstance(e, ferry.BatchError)
        assert e.exc_type == exc.__name__ and e.index == 3
        assert "item 3 is broken" in str(e)
        assert "test_torch.py" in e.traceback and "__getitem__" in e.traceback


def _skipping_bad_batches(loader):
    """A loop that skips a batch its dataset failed on and goes on, as
    training scripts do: [batch or the error's type name, ...]."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            return out
        except ValueError as e:
            out.append(type(e).__name__)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad", [0, 3, 7])
def test_the_iterator_goes_on_after_a_failed_batch_as_torchs(workers, bad):
    """next() raises a failed batch's error and the next call returns the
    batch after it, as torch's iterator does, for a failure first, in the
    middle and last; the next epoch starts where it should. iter(loader)
    used to be a generator, which ends at its first exception: a loop
    that skipped a bad batch lost the rest of its epoch silently."""
    ds = Failing(bad, ValueError)
    want = _skipping_bad_batches(TorchLoader(ds, batch_size=2, num_workers=workers))
    with DataLoader(ds, batch_size=2, num_workers=workers) as dl:
        assert _skipping_bad_batches(dl) == want
        assert _skipping_bad_batches(dl) == want  # the next epoch, whole
        it = iter(dl)
        assert len(it) == len(dl) == 4


class Crashing(Dataset):
    """Item 3 kills its worker with SIGSEGV, as a crashing C extension does."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            import signal
            os.kill(os.getpid(), signal.SIGSEGV)
        return i


@pytest.mark.parametrize("policy", ["restart", "fail"])
def test_a_crashed_worker_is_torchs_runtime_error(policy):
    """A worker killed by a signal is a RuntimeError saying what torch's
    says ("DataLoader worker (pid N) is killed by signal: Segmentation
    fault"), whether ferry gives up the batch after replacements (its
    default) or the whole loader (on_worker_failure="fail"); and a dataset
    that cannot open is one too. `except RuntimeError` used to miss both."""
    with DataLoader(Crashing(), batch_size=2, num_workers=2, on_worker_failure=policy) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1]
        with pytest.raises(RuntimeError,
                           match=r"DataLoader worker \(pid \d+\) is killed by signal: "
                                 r"Segmentation fault") as raised:
            next(it)
        assert isinstance(raised.value, (ferry.WorkerError, ferry.BatchLost))
        assert raised.value.signal == "SIGSEGV"
        if policy == "restart":  # the loader goes on with the next batch
            assert isinstance(raised.value, ferry.BatchError) and raised.value.batch_in_epoch == 1
            assert [b.tolist() for b in it] == [[4, 5], [6, 7]]
    assert issubclass(ferry.DatasetError, RuntimeError)


def test_a_collate_fn_that_raises_names_its_traceback():
    def bad(items):
        raise RuntimeError("collate says no")
    with DataLoader(tensors(4), batch_size=2, num_workers=1, collate_fn=bad) as dl:
        with pytest.raises(RuntimeError, match="collate says no") as raised:
            next(iter(dl))
        assert "in bad" in raised.value.traceback


def test_a_dataset_that_cannot_be_pickled_names_the_attribute():
    ds = Failing(0, ValueError)
    ds.handle = (x for x in range(3))
    with pytest.raises(TypeError, match=r"handle.*generator"):
        list(DataLoader(ds, num_workers=2))


def test_ragged_items_fail_their_batch_as_torch_does():
    class Ragged(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(i + 1)
    with pytest.raises(RuntimeError, match="equal size"):
        list(TorchLoader(Ragged(), batch_size=2))
    with DataLoader(Ragged(), batch_size=2, num_workers=1) as dl:
        with pytest.raises(RuntimeError, match="equal size"):
            next(iter(dl))


# --------------------------------------------------------------- ferry's own

def test_resume_gives_the_uninterrupted_runs_batches():
    ds = tensors(40)
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=3, shuffle=True, num_workers=2) as dl:
        it = iter(dl)
        head = [next(it) for _ in range(4)]
        state = dl.state_dict()
        rest = list(it) + list(dl)
    torch.manual_seed(0)
    with DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, state=state) as dl:
        resumed = list(dl) + list(dl)
    assert len(head) == 4 and len(resumed) == len(rest) == 2 * len(dl) - 4
    same_batches(resumed, rest)


def test_remote_options_are_refused_for_objects():
    with pytest.raises(TypeError, match="by name"):
        DataLoader(tensors(4), bind="tcp://127.0.0.1:0")


# --------------------------------------------------------------- skipped
#
# From torch's test_dataloader.py, not run here, and why:
# - IterableDataset's resume (state=): a user's iterator has no position
#   ferry could save; the loader says so (see above).
# - multiprocessing_context / fork / spawn / forkserver: ferry's workers are
#   forked from a clean parent, never from the trainer; the argument warns.
# - CUDA pin_memory: test_cuda_pin.py, which runs where CUDA is (CI has none)
#   and skips itself elsewhere; pin_memory_device is ignored, with a warning.
# - Worker segfault and SIGKILL cases: covered by test_clean_parent.py and
#   the C suite (a worker killed is replaced; every batch arrives once).
# - persistent_workers=False re-creating workers each epoch: ferry's start
#   again only when the dataset changed (test_each_epoch_sees_the_dataset_...).


class Deep(Dataset):
    """Fails 16 calls deep: a traceback of some 2 KB."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.descend(i, 15)

    def descend(self, i, depth):
        if depth == 0:
            raise OSError("no such file: /data/item-%d.jpg" % i)
        if depth % 2:  # two lines in turn: Python does not fold the frames
            return self.descend(i, depth - 1)
        return self.descend(i, depth - 1)


def test_the_whole_traceback_arrives():
    with DataLoader(Deep(), batch_size=2, num_workers=1) as dl:
        with pytest.raises(OSError) as raised:
            next(iter(dl))
    tb = raised.value.traceback
    assert len(tb) > 1500  # the old limit was 511 bytes
    assert tb.count("in descend") == 16 and "in __getitem__" in tb
    assert "no such file: /data/item-0.jpg" in str(raised.value)


def test_arguments_that_mean_nothing_here_warn_once():
    from ferry.torch import _once
    for key in ("persist", "mp"):
        _once._warned.discard(key)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            DataLoader(tensors(4), num_workers=1, persistent_workers=False).close()
            DataLoader(tensors(4), num_workers=1, multiprocessing_context="spawn").close()
        DataLoader(tensors(4), num_workers=1).close()  # torch's defaults: nothing to say
    said = [str(x.message) for x in w]
    assert sum("multiprocessing_context" in m for m in said) == 1
    assert len(said) == 1  # persistent_workers=False means what it means with torch


class Curriculum(Dataset):
    """Item i: (i, max_len, table[0]): what the worker's copy holds."""

    def __init__(self):
        self.max_len = 8
        self.table = np.zeros(16, dtype=np.int64)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor([i, self.max_len, int(self.table[0])])


def _epoch(dl):
    it = iter(dl)
    rows = torch.cat(list(it)).tolist()
    return sorted(rows), sorted(w.pid for w in it._workers)


@pytest.mark.parametrize("persistent", [False, True])
def test_each_epoch_sees_the_dataset_as_it_is_at_iter_unless_workers_persist(persistent, caplog):
    ds = Curriculum()
    with caplog.at_level(logging.INFO, logger="ferry"), \
            DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=persistent) as dl:
        rows, pids = _epoch(dl)
        assert rows == [[i, 8, 0] for i in range(6)]
        assert _epoch(dl) == (rows, pids)  # nothing changed: the same workers
        ds.max_len = 12  # the curriculum's next step
        rows, pids2 = _epoch(dl)
        assert rows == [[i, 8 if persistent else 12, 0] for i in range(6)]
        ds.table[0] = 5  # in place, in a small array
        rows, pids3 = _epoch(dl)
        assert rows == [[i, 8 if persistent else 12, 0 if persistent else 5] for i in range(6)]
        assert (pids2 == pids) == persistent and (pids3 == pids2) == persistent
        assert _epoch(dl)[1] == pids3
        assert dl.state_dict()["epoch"] == 5
    said = [r.getMessage() for r in caplog.records if "dataset changed" in r.getMessage()]
    assert len(said) == (0 if persistent else 2)
    assert ds.max_len == 12 and ds.table[0] == 5  # the trainer's object: as the trainer left it


def boxes(items):
    """A detection-style collate_fn: per image its boxes, some with none."""
    return [torch.zeros((int(y) % 3, 4)) for _, y in items], torch.stack([x for x, _ in items])


def test_empty_tensors_from_a_collate_fn():
    ds = tensors(9)
    with DataLoader(ds, batch_size=3, num_workers=1, collate_fn=boxes) as dl:
        same_batches(dl, TorchLoader(ds, batch_size=3, collate_fn=boxes))


class ArrayAndLabel(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((3, 4), i, dtype=np.uint8), i


def test_numpy_items_take_one_field_each():
    with DataLoader(ArrayAndLabel(), batch_size=4, num_workers=1) as dl:
        same_batches(dl, TorchLoader(ArrayAndLabel(), batch_size=4))
        names = list(dl._ferry().schema)
        assert len(names) == 3  # the array, the label, the structure
        assert dl._ferry().schema["0"][1] == (3, 4) and dl._ferry().schema["1"][1] == ()


def test_a_new_for_starts_a_new_epoch_as_torchs_does():
    ds = tensors(20)
    with DataLoader(ds, batch_size=5, num_workers=2) as dl:
        next(iter(dl))  # a peek
        for _ in dl:  # left early
            break
        same_batches(dl, TorchLoader(ds, batch_size=5))
        same_batches(dl, TorchLoader(ds, batch_size=5))


class CountsItemsMade(Dataset):
    """Items 0..n-1 (each `slow_ms` to make), counting every item made in
    any process (a multiprocessing Value, shared as with torch's workers)."""

    def __init__(self, n, slow_ms):
        import multiprocessing
        self.n, self.slow_ms = n, slow_ms
        self.made = multiprocessing.Value("l", 0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.slow_ms / 1000)  # the item's cost, not a wait on anything
        with self.made.get_lock():
            self.made.value += 1
        return i


class InOrder(torch.utils.data.Sampler):
    """0..n-1, a sampler of the user's (its batches are fed to ferry)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("fed", [False, True], ids=["ferrys-sampler", "users-sampler"])
def test_a_for_left_early_leaves_the_rest_of_its_epoch_unmade(caplog, persistent, fed):
    # torch's next `for` starts a new epoch and never makes the rest of the
    # one left. ferry's workers run on into it: a peek at the first batch
    # used to cost a whole epoch's work (drained at the next `for`). The C
    # loader skips the rest, fed by a user's sampler or not.
    caplog.set_level(logging.INFO, logger="ferry")
    ds = CountsItemsMade(2000, 1)
    kw = {"sampler": InOrder(2000)} if fed else {}
    with DataLoader(ds, batch_size=10, num_workers=2, persistent_workers=persistent, **kw) as dl:
        next(iter(dl))  # a peek
        assert [int(v) for b in dl for v in b] == list(range(2000))
        assert ds.made.value < 2000 + 600  # the peeked epoch: what was in flight
        assert "not taken" not in caplog.text  # skipped, not started again
        # One batch left, already in flight: skipped, or taken when fed.
        caplog.clear()
        it = iter(dl)
        head = [int(v) for _ in range(199) for v in next(it)]
        assert [int(v) for b in dl for v in b] == list(range(2000))
        assert head == list(range(1990)) and "not taken" not in caplog.text


def test_a_for_left_early_out_of_order_starts_the_workers_again(caplog):
    # Out of order the C loader cannot skip: with many batches left, the
    # workers start again at the next epoch rather than make them.
    caplog.set_level(logging.INFO, logger="ferry")
    ds = CountsItemsMade(2000, 1)
    with DataLoader(ds, batch_size=10, num_workers=2, in_order=False) as dl:
        next(iter(dl))  # a peek
        assert sorted(int(v) for b in dl for v in b) == list(range(2000))
        assert ds.made.value < 2000 + 600
        assert "left epoch 0 with 199 of its 200 batches not taken" in caplog.text


class FailsOnItem19(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 19:
            raise ValueError("bad item 19")
        return i


def test_a_for_left_early_out_of_order_gets_the_next_epoch_whole():
    # Out of order the C loader cannot skip (refused): the one batch left,
    # in flight, is taken and dropped, and the epoch's count must survive
    # the refusal (its last batch a failure, which carries no end-of-epoch
    # mark): the next `for` is the next epoch, whole, ending at its failure.
    with DataLoader(FailsOnItem19(), batch_size=4, num_workers=1, in_order=False,
                    persistent_workers=True) as dl:
        it = iter(dl)
        for _ in range(4):  # left early, the failing batch not taken
            next(it)
        got = []
        it = iter(dl)
        while True:
            try:
                got.append(sorted(next(it).tolist()))
            except StopIteration:
                break
            except ValueError:
                got.append("bad")
        # (one worker makes its tasks in order: the failure is the last)
        assert got[-1] == "bad" and len(got) == 5
        assert sorted(v for b in got[:-1] for v in b) == list(range(16))


def test_a_used_loader_resumes_a_user_sampler_exactly():
    ds = tensors(30)
    with DataLoader(ds, batch_size=4, sampler=weighted(), num_workers=2) as dl:
        first = list(dl)
        it = iter(dl)
        head = [next(it) for _ in range(2)]
        state = dl.state_dict()
        rest = list(it)
        later = list(dl) + list(dl)  # the table runs on past the state
        dl.load_state_dict(state)
        again = list(dl)
    assert len(first) == 7 and len(head) + len(rest) == 7 and len(later) == 14
    same_batches(again, rest)


def test_seed_fixes_the_augmentations_whatever_the_global_generator():
    def run(global_seed):
        torch.manual_seed(global_seed)
        with DataLoader(Random(), batch_size=4, num_workers=2, seed=5) as dl:
            return list(dl)
    same_batches(run(0), run(1))


class SlowItemZero(Dataset):
    """Item 0 appends a line to `log` as it is built, and takes `seconds`;
    every item draws from the three global generators, as a random
    transform does."""

    def __init__(self, log, seconds=0.0):
        self.log, self.seconds = log, seconds

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 0:
            with open(self.log, "a") as f:
                f.write("%d\n" % os.getpid())
            time.sleep(self.seconds)  # a slow item, not a wait for anything
        return torch.rand(2), float(np.random.rand()), random.random()


def no_init(worker_id):
    pass


def builds_logged(log):
    with open(log) as f:
        return len(f.read().split())


@pytest.mark.parametrize("reseed", ["batch", "sample"])
def test_item_0_probed_for_the_fields_is_the_first_batchs_not_built_again(tmp_path, reseed):
    # ferry.torch builds item 0 once (in the workers' clean parent) to learn
    # the batch's fields; the first batch takes that item, which was drawn
    # as the batch draws it: the same batch, one build of a slow item 0
    # instead of two (issue 36, item 6). With a worker_init_fn (which could
    # change what the item is) the worker builds it again.
    def first_batch(init):
        log = str(tmp_path / ("item0-%s" % (init is not None)))
        torch.manual_seed(0)
        with DataLoader(SlowItemZero(log), batch_size=2, num_workers=2, reseed=reseed,
                        worker_init_fn=init) as dl:
            return next(iter(dl)), builds_logged(log)
    kept, builds = first_batch(None)
    assert builds == 1
    built, builds = first_batch(no_init)
    assert builds == 2
    same(kept, built)
    assert not torch.equal(kept[0][0], kept[0][1])  # the items drew, and differ


def test_out_of_order_a_slow_item_0_costs_its_time_once_in_the_first_epoch(tmp_path):
    # Item 0 takes 1.5 s: built once, for the fields, and not again for its
    # batch; the other workers' batches do not wait for it (issue 36, item 6).
    log, slow = str(tmp_path / "item0"), 1.5
    with DataLoader(SlowItemZero(log), num_workers=2) as dl:  # torch imported where forks start
        next(iter(dl))
    os.unlink(log)
    with DataLoader(SlowItemZero(log, slow), batch_size=1, num_workers=2,
                    in_order=False) as dl:
        start = time.monotonic()
        it = iter(dl)
        got = [next(it) for _ in range(len(dl))]
        took = time.monotonic() - start
        assert builds_logged(log) <= 2  # the fields' build, and maybe epoch 1's prefetched
    assert len(got) == 40 and took < 2 * slow * 0.8, took


def test_a_batch_samplers_batches_travel_in_shared_memory():
    ds = tensors(30)
    with DataLoader(ds, batch_sampler=Buckets(30), num_workers=1) as dl:
        list(dl)
        list(dl)
        st = dl.stats()
        assert st["shared"] >= st["delivered"] - 2, st


def test_num_workers_0_makes_batches_in_the_callers_thread_as_torch():
    def run():
        torch.manual_seed(0)  # and numpy's and random's: torch seeds neither here
        np.random.seed(0)
        random.seed(0)
        with DataLoader(Random(), batch_size=4, shuffle=True) as dl:
            # a training step draws too (dropout, say), between batches
            return [(b, torch.rand(1), np.random.rand()) for _ in range(2) for b in dl]
    a, b = run(), run()  # the dataset draws from the global generators, in turn with us
    for x, y in zip(a, b):
        same(x, y)
    # The same order as with workers: the index stream is ferry's either way.
    torch.manual_seed(0)
    with DataLoader(tensors(30), batch_size=4, shuffle=True) as dl:
        sync = flat_labels(dl)
    torch.manual_seed(0)
    with DataLoader(tensors(30), batch_size=4, shuffle=True, num_workers=2) as dl:
        assert flat_labels(dl) == sync
    # A dataset's exception is its own, raised here, as torch's.
    with DataLoader(Failing(1, KeyError), batch_size=2) as dl:
        with pytest.raises(KeyError, match="item 1 is broken") as raised:
            next(iter(dl))
        assert not isinstance(raised.value, ferry.BatchError)
    with DataLoader(tensors(30), batch_size=4, sampler=weighted()) as dl:
        same_batches(dl, TorchLoader(tensors(30), batch_size=4, sampler=weighted()))


class Bulk(Dataset):
    """Indexed with a whole key (a list of indices): one tensor of them."""

    def __len__(self):
        return 35

    def __getitem__(self, key):
        assert isinstance(key, list), type(key)
        return torch.as_tensor(key)


class BulkSampler(torch.utils.data.Sampler):
    """Keys that are lists of 4 indices (the last shorter), shuffled."""

    def __iter__(self):
        for x in torch.randperm(35).split(4):
            yield x.tolist()

    def __len__(self):
        return 9


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_indexes_the_dataset_with_each_key_as_the_sampler_gave_it(workers):
    # torch passes a bulk-loading sampler's key (a list) to __getitem__ as
    # it is; ferry used to take it for 4 keys and give the first item only.
    with DataLoader(Bulk(), batch_size=None, sampler=BulkSampler(None),
                    num_workers=workers) as dl:
        assert not dl._auto_collation
        got = list(dl)
    assert len(got) == 9 and sorted(len(x) for x in got) == [3] + [4] * 8
    assert sorted(torch.cat(got).tolist()) == list(range(35))


def test_a_batch_size_none_sampler_of_mixed_or_odd_keys_is_refused_clearly():
    class Odd(torch.utils.data.Sampler):
        def __init__(self, keys):
            super().__init__(None)
            self.keys = keys

        def __iter__(self):
            return iter(self.keys)

        def __len__(self):
            return len(self.keys)
    for keys, said in (([1, [2, 3]], "a list key after int keys"),
                       ((["a"]), "the key 'a'")):
        with pytest.raises(TypeError, match=said):
            list(DataLoader(Bulk(), batch_size=None, sampler=Odd(keys), num_workers=1))


# ------------------------------------------- objects shared with the trainer

class MeetOnce(Dataset):
    """Each worker's first item waits until every worker has reached its
    own (a count under an mp.Value's lock, a Semaphore as the gate), then
    gives the worker's id; every item is counted. Only workers that share
    the trainer's Value and Semaphore get past the gate, and only if no
    item is built outside them (the count would open it early, or a
    process alone at the gate would wait for ever)."""

    def __init__(self, n, workers):
        import multiprocessing as mp
        self.n, self.workers = n, workers
        self.arrived = mp.Value("i", 0)
        self.built = mp.Value("i", 0)
        self.gate = mp.Semaphore(0)
        self.met = False

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not self.met:
            with self.arrived.get_lock():
                self.arrived.value += 1
                if self.arrived.value == self.workers:
                    self.gate.release()
            assert self.gate.acquire(timeout=30), "the workers never all met"
            self.gate.release()
            self.met = True
        with self.built.get_lock():
            self.built.value += 1
        return torch.utils.data.get_worker_info().id


@pytest.mark.parametrize("loader_cls", [TorchLoader, DataLoader], ids=["torch", "ferry"])
def test_workers_share_the_trainers_mp_value_and_semaphore_as_torchs_do(loader_cls):
    ds = MeetOnce(24, 2)
    dl = loader_cls(ds, batch_size=3, num_workers=2, timeout=60)
    ids = [int(v) for b in dl for v in b]
    del dl
    assert sorted(set(ids)) == [0, 1] and len(ids) == 24
    # Items built in workers only (ferry builds none to learn the fields
    # for such a dataset): each worker met the other once. Every item of
    # the epoch counted, and for ferry the batches of the next epoch its
    # prefetch had made by then.
    assert ds.arrived.value == 2
    assert ds.built.value == 24 if loader_cls is TorchLoader else ds.built.value % 3 == 0 and \
        24 <= ds.built.value <= 24 + 3 * 2 * 2


def test_a_changed_dataset_starts_the_workers_again_out_of_order_too():
    ds = Curriculum()
    with DataLoader(ds, batch_size=2, num_workers=2, in_order=False) as dl:
        assert sorted(torch.cat(list(dl)).tolist()) == [[i, 8, 0] for i in range(6)]
        ds.max_len = 9
        assert sorted(torch.cat(list(dl)).tolist()) == [[i, 9, 0] for i in range(6)]


def test_a_file_the_dataset_opens_at_its_first_item_is_each_workers_own(tmp_path):
    """Item 0, built before the workers to learn the batch's fields, is
    built in a fork that is thrown away: the file the dataset opens
    lazily is each worker's, as in torch, not one file with one offset
    shared by all (reads then got another item's bytes)."""
    ds = OpensLazily(str(tmp_path / "records"))
    for persistent in (False, True):
        loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
        for _ in range(2):
            got = [b for b in loader]
            assert [int(v) for b in got for v in b["y"]] == list(range(48))
            assert all(bool(v) for b in got for v in b["own"])
        del loader
    assert ds.f is None  # the trainer's own object untouched


class Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)


@pytest.mark.parametrize("make", [lambda g: SequentialSampler(range(5)),
                                  lambda g: RandomSampler(range(6), generator=g)])
def test_a_sampler_over_another_data_source_is_run_as_torch_runs_it(make):
    """A SequentialSampler or RandomSampler over a data_source shorter than
    the dataset gives that many indices, as in torch (ferry's own index
    stream, over the whole dataset, gave all 20 items)."""
    want = [b.tolist() for b in TorchLoader(Numbers(20), batch_size=4,
                                            sampler=make(torch.Generator().manual_seed(3)))]
    loader = DataLoader(Numbers(20), batch_size=4, num_workers=2,
                        sampler=make(torch.Generator().manual_seed(3)))
    assert len(loader) == len(want)
    assert [b.tolist() for b in loader] == want


def test_a_sampler_of_keys_that_are_not_ints_is_refused_not_flattened():
    """A sampler yielding (index, scale) pairs: ferry's tasks carry int
    indices, so it is a clear error as the sampler is drawn, never the
    pairs read as twice as many indices (as it was); nor a float index
    read as an int."""
    class Pairs:
        def __iter__(self):
            return iter([(i, 50 + i) for i in range(8)])

        def __len__(self):
            return 8
    for workers in (0, 2):
        with pytest.raises(TypeError, match=r"the key \(0, 50\)"):
            next(iter(DataLoader(Numbers(60), batch_size=2, sampler=Pairs(),
                                 num_workers=workers)))
    with pytest.raises(TypeError, match="the key 2.5"):
        next(iter(DataLoader(Numbers(60), batch_size=2, sampler=[0, 1, 2.5], num_workers=0)))


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_a_batch_size_torch_refuses_is_refused_with_its_error(batch_size):
    with pytest.raises(ValueError) as theirs:
        TorchLoader(Numbers(8), batch_size=batch_size)
    with pytest.raises(ValueError) as ours:
        DataLoader(Numbers(8), batch_size=batch_size, num_workers=2)
    assert str(ours.value) == str(theirs.value)


def test_a_shuffle_seeded_by_a_generator_reaches_every_order_of_a_small_dataset():
    """shuffle=True with generator=: the order is seeded from the
    generator's state, not from its permutation of the dataset (3 items
    had 6 permutations, so 6 seeds, which gave 3 orders; 2 items always
    came as [1, 0])."""
    orders = collections.Counter()
    for s in range(60):
        loader = DataLoader(Numbers(3), batch_size=3, shuffle=True,
                            generator=torch.Generator().manual_seed(s))
        orders[tuple(next(iter(loader)).tolist())] += 1
    assert len(orders) == 6
    twos = {tuple(next(iter(DataLoader(Numbers(2), batch_size=2, shuffle=True,
                                       generator=torch.Generator().manual_seed(s)))).tolist())
            for s in range(20)}
    assert twos == {(0, 1), (1, 0)}


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_dataset_that_grows_between_epochs_is_read_whole_each_epoch(shuffle):
    """Without persistent_workers, each epoch reads the dataset as it is
    at its iter(), as torch's does: one that grew has its new items in the
    next epoch, and len() follows (it failed with a StateError about a
    state the user never saved)."""
    ds = Numbers(4)  # a replay buffer: more items each epoch
    loader = DataLoader(ds, batch_size=2, num_workers=2, shuffle=shuffle)
    for n in (4, 6, 9):
        ds.n = n
        got = sorted(int(v) for b in loader for v in b)
        assert got == list(range(n))
        assert len(loader) == (n + 1) // 2


class _Missing(KeyError):
    pass


class RaisesSubclasses(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import PIL
        if i == 1:
            raise PIL.UnidentifiedImageError("cannot identify image file 'x.jpg'")
        if i == 2:
            raise _Missing(i)
        return torch.tensor(i)


def test_a_subclass_of_a_built_in_exception_is_caught_as_that_class_and_its_base():
    """PIL's UnidentifiedImageError (an OSError) raised by a worker is
    caught by ``except OSError`` (the usual skip-a-bad-image handler) and
    by ``except PIL.UnidentifiedImageError``, as with torch, where it was a
    plain ferry.BatchError; so is a dataset's own KeyError subclass."""
    import PIL
    loader = DataLoader(RaisesSubclasses(), batch_size=1, num_workers=2)
    it = iter(loader)
    assert int(next(it)) == 0
    with pytest.raises(OSError) as e:
        next(it)
    assert isinstance(e.value, PIL.UnidentifiedImageError)
    assert isinstance(e.value, ferry.BatchError)
    with pytest.raises(_Missing):
        next(it)
    assert int(next(it)) == 3


def test_iterators_of_one_loader_go_on_apart_as_torchs_do():
    """A loop over the loader inside a loop over it (evaluating on it
    every few steps), or two iterators at once: without
    persistent_workers each gets its own epoch, as torch gives each
    iterator workers of its own (the older one reads the rest of its
    epoch from a loader of its own). It read the newer one's stream
    before, and the nested loop never ended."""
    def nested(make):
        loader, out = make(), []
        for step, x in enumerate(loader):
            out.append((x.tolist(), [y.tolist() for y in loader]))
            assert step < 4
        return out

    def two(make):
        loader = make()
        a, b = iter(loader), iter(loader)
        out = [next(a).tolist(), next(b).tolist(), next(a).tolist()]
        return out + [[x.tolist() for x in b], [x.tolist() for x in a]]
    for run in (nested, two):
        want = run(lambda: TorchLoader(Numbers(8), batch_size=2, num_workers=2))
        assert run(lambda: DataLoader(Numbers(8), batch_size=2, num_workers=2)) == want

    def shuffled(cls):  # the outer's epoch, and what the script draws after
        g = torch.Generator().manual_seed(1)
        loader, outer = cls(Numbers(12), batch_size=3, num_workers=2, shuffle=True,
                            generator=g), []
        for x in loader:
            outer += x.tolist()
            assert sorted(int(y) for b in loader for y in b) == list(range(12))
        return sorted(outer), int(torch.randint(0, 2**30, (1,), generator=g))
    assert shuffled(DataLoader) == shuffled(TorchLoader)
    assert children() == []


def test_with_persistent_workers_an_iterator_a_newer_iter_superseded_ends_with_a_warning():
    """persistent_workers=True: one stream, as torch's one reset iterator;
    the outer loop ends after the inner, with a warning."""
    from ferry.torch import _once
    _once._warned.discard("superseded")  # (said once a process)
    loader = DataLoader(Numbers(8), batch_size=2, num_workers=2, persistent_workers=True)
    outer = []
    with pytest.warns(UserWarning, match="ends there"):
        for step, x in enumerate(loader):
            outer.append(x.tolist())
            assert [y.tolist() for y in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
            assert step < 4
    assert outer == [[0, 1]]


def test_a_sampler_changed_between_epochs_is_drawn_again_as_it_is(caplog):
    """A WeightedRandomSampler's weights reassigned after an epoch (hard
    example mining) give the next epoch from the new weights, as torch,
    which draws each epoch at its iter(), gives it; ferry had drawn it
    ahead from the old ones (the change showed 1 to 5 epochs late). A
    script's set_epoch(e) alone is not a change: nothing starts again. A
    curriculum's sampler that grows gives its new length (it failed with
    a StateError)."""
    sampler = torch.utils.data.WeightedRandomSampler(
        torch.ones(16), 16, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(Numbers(16), batch_size=4, sampler=sampler, num_workers=2)
    caplog.set_level(logging.INFO, logger="ferry")
    assert len([int(v) for b in loader for v in b]) == 16
    sampler.weights = torch.zeros(16, dtype=torch.double)
    sampler.weights[5] = 1
    assert [int(v) for b in loader for v in b] == [5] * 16
    assert [int(v) for b in loader for v in b] == [5] * 16

    class Epochs(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, e):
            self.epoch = e

        def __iter__(self):
            return iter(torch.randperm(16, generator=torch.Generator().manual_seed(self.epoch)
                                       ).tolist())

        def __len__(self):
            return 16
    caplog.clear()
    sampler = Epochs()
    loader = DataLoader(Numbers(16), batch_size=4, sampler=sampler, num_workers=2)
    for e in range(4):
        sampler.set_epoch(e)
        want = torch.randperm(16, generator=torch.Generator().manual_seed(e)).tolist()
        assert [int(v) for b in loader for v in b] == want
    # nor the loader's own draws from a generator the sampler shares
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(Numbers(16), batch_size=4, num_workers=2, generator=g,
                        sampler=torch.utils.data.WeightedRandomSampler(torch.ones(16), 16,
                                                                       generator=g))
    for _ in range(3):
        assert len([int(v) for b in loader for v in b]) == 16
    assert "start again" not in caplog.text

    class Curriculum:  # the first `limit` items; the loop lets in more each epoch
        limit = 2

        def __iter__(self):
            return iter(range(self.limit))

        def __len__(self):
            return self.limit
    sampler = Curriculum()
    loader = DataLoader(Numbers(16), batch_size=2, sampler=sampler, num_workers=2)
    for limit in (2, 4, 6):
        sampler.limit = limit
        assert [int(v) for b in loader for v in b] == list(range(limit))
        assert len(loader) == limit // 2


def test_a_dataset_that_counts_its_items_counts_as_in_torchs_first_epoch():
    """Item 0, built before the workers to learn the fields, is not handed
    to worker 0's first batch when building it changed the dataset (here a
    counter): worker 0 builds its own, from the dataset as it got it, as
    torch's does (its first batch read [1, 1])."""
    def batches(cls):
        return [b["calls"].tolist() for b in cls(CountsItsCalls(), batch_size=2, num_workers=2)]
    assert batches(DataLoader) == batches(TorchLoader)


class _Shards(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(w, 8, n))


def test_an_iterable_datasets_iterator_a_newer_one_superseded_ends_with_a_warning():
    """Over an IterableDataset the workers run one stream: an older
    iterator ends once a newer one began an epoch (a nested loop over the
    loader ran for ever, the outer getting [0, 2] at every step)."""
    from ferry.torch import _once
    _once._warned.discard("superseded_stream")
    loader = DataLoader(_Shards(), batch_size=2, num_workers=2)
    outer = []
    with pytest.warns(UserWarning, match="ends there"):
        for step, x in enumerate(loader):
            outer.append(x.tolist())
            assert sorted(v for b in loader for v in b.tolist()) == list(range(8))
            assert step < 4
    assert outer == [[0, 2]]
