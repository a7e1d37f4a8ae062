"""Workers replaced on purpose: a Python dataset whose memory only grows,
under worker_max_rss_bytes or max_batches_per_worker. Each worker is
replaced between batches, through the path that replaces a dead one:
every index comes exactly once, nothing counts as a failure, and no
worker is ever seen holding more than the budget and one batch's growth."""

import os

import pytest

try:  # before any test's snapshot: ferry.torch's first use starts what outlives a test
    import ferry.torch as ferry_torch
except ImportError:
    ferry_torch = None

import ferry
from datasets import Leaky

PAGE = os.sysconf("SC_PAGESIZE")
MiB = 1 << 20


def private_bytes(pid):
    """pid's private resident memory (statm's resident less shared pages),
    as the worker measures itself; None when it is gone."""
    try:
        with open("/proc/%d/statm" % pid) as f:
            _, resident, shared = (int(v) for v in f.read().split()[:3])
    except (OSError, ValueError):
        return None
    return (resident - shared) * PAGE


def serve_epochs(ld, epochs, n, workers):
    """Takes `epochs` epochs; asserts each holds every index exactly once.
    Returns (the most private memory seen in a worker after a batch, the
    worker pids seen)."""
    peak, pids = 0, set()
    for _ in range(epochs):
        seen = []
        for b in ld:
            seen += b["x"].tolist()
            assert b.indices.tolist() == b["x"].tolist()
            for i in range(workers):
                pid = ld.worker_pid(i)
                got = private_bytes(pid) if pid else None
                if got is not None:
                    pids.add(pid)
                    peak = max(peak, got)
        assert sorted(seen) == list(range(n))
    return peak, pids


def baseline_private_bytes():
    """A Python worker's private memory before its dataset leaks anything:
    the interpreter and the clean parent's pages, counted in each fork."""
    with ferry.Loader(Leaky, dataset_kwargs={"n": 8, "leak_kb": 0}, batch_size=4,
                      workers=1) as ld:
        next(iter(ld))
        return private_bytes(ld.worker_pid(0))


def test_a_leaking_python_dataset_stays_within_its_budget_and_loses_nothing():
    # 1 MiB kept per item, 4 items a batch: a worker grows 4 MiB a batch,
    # and retires after the batch that takes it past the budget.
    budget = baseline_private_bytes() + 40 * MiB
    batch_growth = 4 * MiB
    got = []
    with ferry.Loader(Leaky, dataset_kwargs={"n": 120, "leak_kb": 1024}, batch_size=4,
                      workers=2, worker_max_rss_bytes=budget,
                      log=lambda level, msg: got.append((level, msg))) as ld:
        peak, pids = serve_epochs(ld, 2, 120, 2)
        st = ld.stats()
    print("budget %.1f MiB, the most private memory seen in a worker %.1f MiB, "
          "retirements %d, worker pids %d" % (budget / MiB, peak / MiB, st["retirements"],
                                              len(pids)))
    for level, msg in got:
        if "retired" in msg:
            print(level, msg)
    # 240 MiB leaked in all, about 40 a process.
    assert st["retirements"] >= 3 and len(pids) >= 5
    assert st["restarts"] == 0 and st["failed"] == 0
    assert peak > budget - 12 * MiB  # the probe does see the growth
    # The allocator's and the interpreter's own bookkeeping ride along.
    assert peak <= budget + batch_growth + 1 * MiB
    retired = [(lv, m) for lv, m in got if "retired after" in m]
    assert len(retired) == st["retirements"]
    assert all(lv == 20 and "of private memory (worker_max_rss_bytes" in m for lv, m in retired)
    assert not [m for lv, m in got if lv >= 30]


def test_max_batches_per_worker_replaces_python_workers_between_batches():
    with ferry.Loader(Leaky, dataset_kwargs={"n": 96, "leak_kb": 0}, batch_size=4,
                      workers=2, max_batches_per_worker=5, on_worker_failure="fail",
                      max_attempts=1) as ld:
        _, pids = serve_epochs(ld, 2, 96, 2)
        st = ld.stats()
    # 48 batches at 5 a process: all but the last two processes retired.
    assert st["retirements"] >= 8 and len(pids) >= 9
    assert st["restarts"] == 0 and st["failed"] == 0


def test_state_dict_saved_between_retirements_resumes_exactly():
    opts = dict(dataset_kwargs={"n": 64, "leak_kb": 0}, batch_size=4, workers=2,
                shuffle=True, seed=5, max_batches_per_worker=3)
    with ferry.Loader(Leaky, **opts) as ld:
        it = ld.stream()
        first = [next(it)["x"].tolist() for _ in range(21)]
        state = ld.state_dict()
        rest_here = [next(it)["x"].tolist() for _ in range(19)]
        assert ld.stats()["retirements"] >= 10
    with ferry.Loader(Leaky, state=state, **opts) as ld:
        it = ld.stream()
        rest = [next(it)["x"].tolist() for _ in range(19)]
        assert ld.stats()["retirements"] >= 4
    assert rest == rest_here
    # Epoch 0 is batches 0..15, epoch 1 batches 16..31: each whole once.
    both = first + rest
    assert sorted(x for b in both[:16] for x in b) == list(range(64))
    assert sorted(x for b in both[16:32] for x in b) == list(range(64))


def test_thread_workers_refuse_the_retirement_options():
    with pytest.raises(ferry.InvalidValue, match="worker_max_rss_bytes.*thread"):
        ferry.Loader(Leaky, worker_mode="thread", worker_max_rss_bytes=1 << 30)
    with pytest.raises(ferry.InvalidValue, match="max_batches_per_worker.*thread"):
        ferry.Loader("synthetic:n=64,dim=8", worker_mode="thread", max_batches_per_worker=10)


@pytest.mark.skipif(ferry_torch is None, reason="torch is not installed")
def test_ferry_torch_dataloader_passes_the_options_through():
    DataLoader = ferry_torch.DataLoader
    ds = Leaky(n=48, leak_kb=0)
    with DataLoader(ds, batch_size=4, num_workers=2, max_batches_per_worker=4) as dl:
        for _ in range(2):
            assert sorted(x for b in dl for x in b["x"].tolist()) == list(range(48))
        assert dl.stats()["retirements"] >= 3 and dl.stats()["restarts"] == 0
    with pytest.raises(ValueError, match="num_workers=0"):
        DataLoader(ds, batch_size=4, num_workers=0, worker_max_rss_bytes=1 << 30)
