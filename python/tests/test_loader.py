"""ferry.Loader from Python: iteration, epochs, resume, zero-copy views,
Python datasets, errors, worker deaths, Ctrl-C."""

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry
from conftest import children, wait_for
from datasets import (Augmented, CountsItemZero, HoldsArrays, Items, KillsItsWorkerAsItOpens,
                      Missing, Pairs, SlowInWorkers, WaitsForFirstTask, WrongShape)

SYN = "synthetic:n=1000,dim=8"


def synthetic_ok(b):
    """Synthetic item i: y == i (the batch's own indices)."""
    return np.array_equal(b["y"], b.indices.astype(np.int64))


def test_the_first_batch_is_under_way_before_every_worker_is_ready(tmp_path):
    # Worker 1 opens its dataset only once an item of a task has been made
    # (by worker 0, sent tasks from the first READY on); under a loader
    # that dispatched nothing before every worker was ready, it would wait
    # out its 20 s and write "0".
    marker = str(tmp_path / "made")
    with ferry.Loader(WaitsForFirstTask, dataset_kwargs={"n": 64, "marker": marker},
                      batch_size=4, workers=2, fork_server=False, epochs=1) as ld:
        assert sorted(int(x) for b in ld for x in b["x"]) == list(range(64))
    with open(marker + ".saw") as f:
        assert f.read() == "1"


def test_a_ready_worker_killed_while_others_start_is_replaced_and_loses_nothing(tmp_path):
    # Worker 0 kills itself on the first task's item 1, and worker 1 is
    # ready only once worker 0's replacement has started: the loader is
    # not open yet, but a worker that was ready is replaced as after open
    # (its task sent again), not a failed start.
    marker, die = str(tmp_path / "made"), str(tmp_path / "died")
    with ferry.Loader(WaitsForFirstTask, dataset_kwargs={"n": 64, "marker": marker, "die": die},
                      batch_size=4, workers=2, fork_server=False, epochs=1) as ld:
        assert sorted(int(x) for b in ld for x in b["x"]) == list(range(64))
        assert ld.stats()["restarts"] == 1
    with open(marker + ".saw") as f:
        assert f.read() == "1"


def test_a_worker_killed_from_outside_while_the_loader_opens_is_replaced(tmp_path, caplog):
    # The only worker is SIGKILLed as it opens the dataset, before the
    # loader is open: not a failed start (its dataset did not crash; the
    # OOM killer as the workers start, say), so it is replaced, and the open
    # goes on. A worker whose start fails by itself still fails the open
    # (test_failure.c: "exited with code 3 while starting").
    flag = tmp_path / "killed"
    caplog.set_level(logging.INFO, logger="ferry")
    with ferry.Loader(KillsItsWorkerAsItOpens, dataset_kwargs={"n": 40, "flag": str(flag)},
                      batch_size=4, workers=1, fork_server=False, epochs=1) as ld:
        assert sorted(int(v) for b in ld for v in b["y"]) == [i * i for i in range(40)]
        assert flag.exists() and ld.stats()["restarts"] == 1
    assert "while starting; starting a replacement" in caplog.text
    assert children() == []


def test_epochs_len_and_one_epoch_per_for():
    with ferry.Loader(SYN, batch_size=100, workers=2, shuffle=True, seed=3) as ld:
        assert len(ld) == 10 and ld.num_items == 1000
        for epoch in range(3):
            seen = []
            for b in ld:
                assert b.epoch == epoch and synthetic_ok(b)
                seen.append(b.index_in_epoch)
                assert b.last_in_epoch == (b.index_in_epoch == 9)
            assert seen == list(range(10))


def test_schema_before_the_first_batch():
    with ferry.Loader(Items, dataset_kwargs={"n": 10}, batch_size=5, workers=1) as ld:
        assert ld.schema == {"x": (np.dtype("float32"), (3,)), "y": (np.dtype("int64"), ())}
        b = ld.next()
        for name, (dtype, shape) in ld.schema.items():
            assert b[name].dtype == dtype and b[name].shape[1:] == shape


def test_batch_times_say_who_waited():
    # 8 items at 500 us each: at least 4 ms to make; a batch that arrives
    # while the trainer is busy for 30 ms waits at least that long for it.
    with ferry.Loader("synthetic:n=64,dim=8,cost_us=500", batch_size=8, workers=1) as ld:
        st = ld.stats()
        assert st["prefetch"] == 2 * 4 and st["credits"] == st["credits_min"] == 4
        # Nothing measured yet asks for more than the automatic rule.
        assert st["credits_why"] == st["prefetch_why"] == "default"
        b = ld.next()
        assert b.attempts == 1
        assert 0.004 <= b.make_time < 10 and b.flight_time >= b.make_time
        wait_for(lambda: ld.stats()["completed"] >= 2, 10, "batch 1 not in")
        busy_until = time.monotonic() + 0.03
        while time.monotonic() < busy_until:
            pass
        b = ld.next()
        assert b.seq == 1 and 0.03 <= b.ready_time < 10


def test_stream_runs_across_epochs_to_max_batches():
    with ferry.Loader(SYN, batch_size=300, workers=2, max_batches=9) as ld:
        got = [(b.epoch, b.index_in_epoch, b.size) for b in ld.stream()]
    assert len(got) == 9
    assert got[:4] == [(0, 0, 300), (0, 1, 300), (0, 2, 300), (0, 3, 100)]
    assert got[4] == (1, 0, 300)


def test_epochs_option_ends_iteration():
    with ferry.Loader(SYN, batch_size=250, workers=1, epochs=2) as ld:
        assert sum(1 for _ in ld) == 4
        assert sum(1 for _ in ld) == 4
        assert sum(1 for _ in ld) == 0
        with pytest.raises(StopIteration):
            ld.next()


def test_resume_is_exact_whatever_the_worker_count():
    opts = dict(batch_size=64, shuffle=True, seed=11)
    with ferry.Loader(SYN, workers=2, **opts) as ld:
        full = [b.indices.copy() for b, _ in zip(ld.stream(), range(30))]
    with ferry.Loader(SYN, workers=2, **opts) as ld:
        for _, b in zip(range(17), ld.stream()):
            pass
        state = ld.state_dict()
    with ferry.Loader(SYN, workers=1, state=state, **opts) as ld:
        rest = [b.indices.copy() for b, _ in zip(ld.stream(), range(13))]
    for a, b in zip(full[17:], rest):
        assert np.array_equal(a, b)
    with ferry.Loader(SYN, workers=3, **opts) as ld:
        ld.load_state_dict(state)
        assert np.array_equal(next(iter(ld.stream())).indices, full[17])


def test_arrays_are_views_of_the_batch_and_outlive_it():
    with ferry.Loader(SYN, batch_size=50, workers=1) as ld:
        b = ld.next()
        x = b["x"]
        assert not x.flags.owndata and x.flags.writeable
        assert x.base is not None
        assert b["x"] is x and b[0] is x
        # The same memory, not a copy: a write shows through the batch.
        x[0, 0] = 123
        assert b["x"][0, 0] == 123
        assert np.shares_memory(b["x"], x)
        y = b["y"]
        expected = y.copy()
        addr = y.__array_interface__["data"][0]
        del b, x
        gc.collect()
        # y keeps the batch's memory alive after the Batch object is gone.
        assert y.__array_interface__["data"][0] == addr
        assert np.array_equal(y, expected)


def _in_batch_slots(arr):
    """Whether arr's bytes lie in a mapping of the loader's batch slots."""
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:ferry-slots" in line:
                lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                if lo <= addr and addr + arr.nbytes <= hi:
                    return True
    return False


def test_process_workers_batches_are_views_of_shared_memory_unless_shm_is_off():
    got = {}
    for shm in (True, False):
        with ferry.Loader(SYN, batch_size=50, workers=2, seed=5, shm=shm) as ld:
            got[shm] = []
            for b in ld:
                assert synthetic_ok(b) and _in_batch_slots(b["x"]) == shm
                got[shm].append(b["y"].copy())
            st = ld.stats()
            assert st["shared"] == (st["completed"] if shm else 0)
    assert len(got[True]) == 20
    assert all(np.array_equal(a, b) for a, b in zip(got[True], got[False]))


def _rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_memory_counts_the_shared_batch_slots_once():
    """Loader.memory() sums PSS over the trainer and every process below it:
    the batch slots, mapped by the trainer and by each worker, count once
    there, where the RSS of each process counts them in full (the figure
    that misleads). Held batches of 1 MiB make the slots large enough to
    see it."""
    with ferry.Loader("synthetic:n=400,dim=32768", batch_size=32, workers=2, seed=1) as ld:
        held = [next(iter(ld)) for _ in range(4)]
        for b in held:
            assert _in_batch_slots(b["x"]) and int(b["x"].sum()) >= 0  # read: mapped here
        m = ld.memory()
        assert m["processes"] >= 2 and m["total"] == m["trainer"] + m["children"]
        assert m["trainer"] > 0 and m["children"] > 0
        # The same processes as memory()'s: this one and every one below it
        # (the workers, and the clean parent that `import ferry` started).
        pids = [os.getpid()] + ferry._descendants(os.getpid())
        assert all(ld.worker_pid(i) in pids for i in range(2))
        rss = sum(_rss_kb(p) for p in pids) * 1024
        # The four held batches (1 MiB each) are in the trainer's RSS and in
        # their writers': the sum of RSS counts them twice, the sum of PSS
        # once. (Slots still being written, or written and not yet
        # arrived, are in one process only: no bound on the rest.)
        held_bytes = sum(b["x"].nbytes for b in held)
        assert held_bytes == 4 << 20
        assert rss - m["total"] >= 0.9 * held_bytes, (rss, m, held_bytes)
        del held


def test_a_release_hook_keeps_a_dead_batchs_slot_until_it_lets_go():
    """What pin_memory's slots rest on (ferry.torch): a batch that dies hands
    its slot to Loader.release_hook, and no later batch lands in that slot
    until the hook's SlotHold goes; then the slot is used again."""
    kept, failing = [], [False]

    def hook(hold):
        if failing[0]:
            raise RuntimeError("the hook failed")
        if not kept:
            kept.append(hold)  # the first slot is kept; the others go back at once

    with pytest.raises(TypeError, match="callable"):
        ferry.Loader(SYN, batch_size=50, workers=1)._c.release_hook = 5
    with ferry.Loader("synthetic:n=4000,dim=64", batch_size=50, workers=2, seed=5,
                      epochs=1) as ld:
        ld._c.release_hook = hook
        assert ld._c.release_hook is hook
        b = ld.next()
        addr, n = b._b.slot()
        assert n == ld.stats()["slot_bytes"]
        assert addr <= b["x"].__array_interface__["data"][0] < addr + n
        del b
        assert len(kept) == 1 and type(kept[0]).__name__ == "SlotHold"
        for _ in range(30):
            assert ld.next()._b.slot()[0] != addr
        kept.clear()  # the slot goes back: the next batches are given it again
        # A hook that raises: reported as unraisable, the slot goes back at once.
        failing[0] = True
        seen = []
        old, sys.unraisablehook = sys.unraisablehook, seen.append
        try:
            back = [ld.next()._b.slot()[0] for _ in range(20)]
        finally:
            sys.unraisablehook = old
        assert addr in back
        assert seen and "the hook failed" in str(seen[0].exc_value)
    with ferry.Loader(SYN, batch_size=50, workers=2, shm=False) as ld:
        assert ld.next()._b.slot() is None  # by message: in no slot


def test_before_close_runs_first_once_also_when_the_loader_is_dropped():
    calls = []
    ld = ferry.Loader(SYN, batch_size=50, workers=1)
    pid = ld.worker_pid(0)

    def alive():
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    ld._c.before_close = lambda: calls.append((alive(), ld._c.closed))
    ld.close()
    ld.close()
    # Once, while the workers still ran, with the loader already refusing
    # next() (another thread may run while the hook waits).
    assert calls == [(True, True)]
    ld = ferry.Loader(SYN, batch_size=50, workers=1)
    c = ld._c
    c.before_close = lambda: calls.append("dropped")
    del ld, c
    gc.collect()
    assert calls == [(True, True), "dropped"]


def test_a_c_kinds_workers_start_without_the_ferry_package_or_numpy():
    """A C dataset kind's workers run no Python: each starts the extension's
    worker program directly (python -s -S), without importing the ferry
    package and numpy, which cost a worker some 150 ms before its first
    batch here (more beside a large site-packages)."""
    with ferry.Loader(SYN, batch_size=50, workers=2) as ld:
        assert synthetic_ok(next(iter(ld)))
        for i in range(2):
            pid = ld.worker_pid(i)
            with open("/proc/%d/maps" % pid) as f:
                maps = f.read()
            with open("/proc/%d/cmdline" % pid) as f:
                argv = f.read().split("\0")
            assert "_ferry" in maps and "numpy" not in maps
            assert argv[1:3] == ["-s", "-S"]


def test_stats_say_where_the_memory_is():
    # The batch slots: their size, how many hold a batch, how much memory
    # they have now; none of it without shared memory.
    for shm in (True, False):
        with ferry.Loader("synthetic:n=1000,dim=4096", batch_size=50, workers=2, seed=5,
                          shm=shm, epochs=1) as ld:
            kept = [b for b in ld][:3]
            st = ld.stats()
            if shm:
                assert st["slot_bytes"] >= 50 * 4096 and st["slots"] >= 3
                assert st["slots_held"] == 3
                assert st["slot_memory"] >= 3 * 50 * 4096
            else:
                assert st["slot_bytes"] == st["slots"] == st["slots_held"] == 0
                assert st["slot_memory"] == 0
            assert st["remote_connections"] == st["connections_turned_away"] == 0
            del kept


def test_torch_tensors_share_the_batch_memory():
    torch = pytest.importorskip("torch")
    with ferry.Loader(SYN, batch_size=50, workers=1) as ld:
        b = ld.next()
        t = b.torch()
        assert isinstance(t["x"], torch.Tensor) and t["x"].dtype == torch.uint8
        assert t["x"].data_ptr() == b["x"].__array_interface__["data"][0]
        assert t["y"].dtype == torch.int64 and t["y"].tolist() == b.indices.tolist()
        assert torch.equal(torch.from_dlpack(b["y"]), t["y"])


def test_python_dataset_getitem_collated_in_c():
    with ferry.Loader(Items, dataset_kwargs={"n": 100}, batch_size=10, workers=2) as ld:
        assert len(ld) == 10
        seen = set()
        for b in ld:
            idx = b.indices.astype(np.int64)
            assert b["x"].dtype == np.float32 and b["x"].shape == (10, 3)
            assert np.array_equal(b["x"][:, 1], idx.astype(np.float32))
            assert b["y"].dtype == np.int64 and np.array_equal(b["y"], idx * idx)
            seen.update(idx.tolist())
        assert seen == set(range(100))


def test_python_dataset_get_batch():
    with ferry.Loader(Pairs, batch_size=16, workers=2, epochs=2) as ld:
        got = list(ld.stream())
    assert len(got) == 8
    for b in got:
        assert np.array_equal(b[0], b.indices.astype(np.int64) * 2)
        assert b[1].shape == (b.size, 2) and np.all(b[1] == b.epoch)
        assert list(b.keys()) == ["0", "1"]


def test_worker_info_rng_is_the_same_whatever_the_worker_count():
    def draws(workers):
        with ferry.Loader(Augmented, batch_size=8, workers=workers, seed=5, epochs=1) as ld:
            out = {}
            for b in ld:
                out.update(zip(b.indices.tolist(), b["r"].tolist()))
                workers_seen = set(b["worker"].tolist())
                assert workers_seen <= set(range(workers))
            return out
    one, three = draws(1), draws(3)
    assert one == three and len(set(one.values())) == 40


def test_dataset_exception_carries_type_traceback_and_iteration_goes_on():
    with ferry.Loader(Items, dataset_kwargs={"n": 60, "bad": 23}, batch_size=10,
                      workers=2) as ld:
        it = iter(ld)
        got, errors = [], []
        while True:
            try:
                b = next(it)
            except StopIteration:
                break
            except ferry.BatchError as e:
                errors.append(e)
                continue
            got.append(b.index_in_epoch)
    assert got == [0, 1, 3, 4, 5]
    (e,) = errors
    assert e.index == 23 and e.epoch == 0 and e.batch_in_epoch == 2
    assert e.worker in (0, 1)
    assert e.exc_type == "ValueError" and e.exc_message == "item 23 is bad"
    assert "datasets.py" in e.traceback and "__getitem__" in e.traceback
    assert "item 23 is bad" in str(e)


def test_index_error_is_index_out_of_range():
    with ferry.Loader(Missing, batch_size=8, workers=1, epochs=1) as ld:
        it = iter(ld)
        assert next(it)[0].tolist() == list(range(8))
        with pytest.raises(ferry.IndexOutOfRange) as ei:
            next(it)
        assert isinstance(ei.value, IndexError) and ei.value.index == 8
        with pytest.raises(StopIteration):
            next(it)


def test_item_with_another_shape_fails_that_batch_only():
    with ferry.Loader(WrongShape, batch_size=4, workers=1, epochs=1) as ld:
        it = iter(ld)
        next(it)
        with pytest.raises(ferry.BatchError) as ei:
            next(it)
        assert "int32 (4,)" in str(ei.value) and "int32 (3,)" in str(ei.value)
        assert [b.index_in_epoch for b in it] == [2, 3, 4]


def test_worker_killed_mid_epoch_restart_delivers_every_batch(tmp_path):
    flag = str(tmp_path / "died")
    # prefetch 4, under the 10 batches of an epoch: item 42 is first read
    # (and the worker dies) in epoch 0, not in an epoch-1 batch prefetched
    # ahead, whose death epoch 0's loop need not see.
    with ferry.Loader(Items, dataset_kwargs={"n": 80, "die": 42, "flag": flag},
                      batch_size=8, workers=2, prefetch=4, on_worker_failure="restart") as ld:
        seen, attempts = [], {}
        for b in ld:
            seen += b.indices.tolist()
            attempts[b.index_in_epoch] = b.attempts
        assert sorted(seen) == list(range(80))
        assert os.path.exists(flag) and ld.stats()["restarts"] == 1
        # The batch holding item 42 went to a second worker, and so did any
        # other the dead worker held; the rest to one.
        assert attempts[42 // 8] == 2 and set(attempts.values()) == {1, 2}
        assert list(attempts.values()).count(1) >= 5


def test_a_worker_death_is_one_log_message(caplog):
    # By default to the "ferry" logger; or to a callable; debug level adds
    # a line per worker that becomes ready.
    got = []
    with ferry.Loader(SYN, batch_size=100, workers=2, log_level="debug",
                      log=lambda level, msg: got.append((level, msg))) as ld:
        assert [m for lv, m in got if lv == 10 and "is ready" in m] and all(
            lv == 10 for lv, _ in got)
        ld.next()
        pid = ld.worker_pid(1)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: ld.stats()["restarts"] >= 1, 10, "no restart")
        for _ in range(12):
            ld.next()
    warnings = [m for lv, m in got if lv == 30]
    assert len(warnings) == 1, got
    assert "worker 1 (pid %d) was killed by signal SIGKILL" % pid in warnings[0]
    assert "starting a replacement" in warnings[0]

    with caplog.at_level("INFO", logger="ferry"):
        with ferry.Loader(SYN, batch_size=100, workers=1) as ld:
            ld.next()
            os.kill(ld.worker_pid(0), signal.SIGKILL)
            wait_for(lambda: ld.stats()["restarts"] >= 1, 10, "no restart")
    recs = [r for r in caplog.records if r.name == "ferry"]
    assert len(recs) == 1 and recs[0].levelname == "WARNING"
    assert "starting a replacement" in recs[0].getMessage()
    with pytest.raises(TypeError, match="log must be"):
        ferry.Loader(SYN, log="stderr")


def test_worker_killed_under_fail_policy_raises_worker_error():
    with ferry.Loader(Items, dataset_kwargs={"n": 80, "die": 42}, batch_size=8, workers=2,
                      on_worker_failure="fail") as ld:
        with pytest.raises(ferry.WorkerError) as ei:
            for _ in ld:
                pass
        e = ei.value
        assert e.signal == "SIGKILL" and e.pid > 0 and e.worker in (0, 1)
        # The stream is over: the same failure again, not a hang.
        with pytest.raises(ferry.WorkerError):
            ld.next()


def test_bad_options_raise_type_and_value_errors_naming_them():
    with pytest.raises(TypeError, match="bach_size"):
        ferry.Loader(SYN, bach_size=3)
    with pytest.raises(ValueError, match="batch_size"):
        ferry.Loader(SYN, batch_size=0)
    with pytest.raises(ValueError, match="worker_mode"):
        ferry.Loader(SYN, worker_mode="fiber")
    with pytest.raises(TypeError, match="workers"):
        ferry.Loader(SYN, workers=2.5)
    with pytest.raises(TypeError, match="top level"):
        class Local:
            def __len__(self):
                return 1
        ferry.Loader(Local)
    with pytest.raises(TypeError, match="JSON"):
        ferry.Loader(Items, dataset_kwargs={"n": object()})


def test_missing_dataset_file_is_a_dataset_error(tmp_path):
    with pytest.raises(ferry.DatasetError, match="nothere.npy"):
        ferry.Loader("npy:%s" % (tmp_path / "nothere.npy"), workers=1)


def test_npy_fields_and_thread_placement(tmp_path):
    np.save(tmp_path / "train_x.npy", np.arange(200 * 4, dtype=np.float32).reshape(200, 4))
    np.save(tmp_path / "train_y.npy", np.arange(200, dtype=np.int64))
    spec = "npy:x=%s,y=%s" % (tmp_path / "train_x.npy", tmp_path / "train_y.npy")
    for placement in ("process", "thread"):
        with ferry.Loader(spec, batch_size=32, workers=2, worker_mode=placement) as ld:
            b = ld.next()
            assert set(b) == {"x", "y"}
            assert np.array_equal(b["x"][:, 0], b["y"].astype(np.float32) * 4)


def test_python_dataset_in_thread_placement():
    with ferry.Loader(Items, dataset_kwargs={"n": 40}, batch_size=10, workers=2,
                      worker_mode="thread", epochs=1) as ld:
        assert sorted(i for b in ld for i in b.indices.tolist()) == list(range(40))


def test_dropped_loader_shuts_down():
    ld = ferry.Loader(SYN, workers=2)
    ld.next()
    pids = [ld.worker_pid(i) for i in range(2)]
    assert all(p > 0 for p in pids)
    del ld
    gc.collect()
    # the autouse fixture checks the workers are gone and reaped


def run_script(tmp_path, body, timeout=60, **popen):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), **popen)


def test_dataset_defined_in_the_main_script(tmp_path):
    p = run_script(tmp_path, """
        import numpy as np, ferry
        class Local:
            def __init__(self, k): self.k = k
            def __len__(self): return 12
            def __getitem__(self, i): return (np.int64(i * self.k), b"ab")
        if __name__ == "__main__":
            with ferry.Loader(Local, dataset_kwargs={"k": 3}, batch_size=4, workers=2,
                              epochs=1) as ld:
                for b in ld:
                    print(b[0].tolist(), bytes(b[1][0]).decode())
        """)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.split("\n")[:3] == ["[0, 3, 6, 9] ab", "[12, 15, 18, 21] ab",
                                   "[24, 27, 30, 33] ab"]


def test_a_long_pythonpath_does_not_fill_the_dataset_spec(tmp_path):
    # 80 directories on PYTHONPATH (each a 70-character path) used to go
    # into the spec and overflow its 4 KiB; a worker inherits them anyway.
    dirs = []
    for i in range(80):
        d = tmp_path / ("lib-%02d-" % i + "x" * 60)
        d.mkdir()
        dirs.append(str(d))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", "")] + dirs)
    p = run_script(tmp_path, """
        import numpy as np, ferry
        class Local:
            def __len__(self): return 8
            def __getitem__(self, i): return np.int64(i)
        if __name__ == "__main__":
            with ferry.Loader(Local, batch_size=4, workers=1, epochs=1, shuffle=False) as ld:
                print(sum(len(b[0]) for b in ld))
            try:
                ferry.Loader(Local, dataset_kwargs={"blob": "y" * 5000}, workers=1)
            except ferry.InvalidValue as e:
                print("InvalidValue:", e)
        """, env=env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = out.split("\n")
    assert lines[0] == "8"
    assert lines[1].startswith("InvalidValue: ferry.Loader: the dataset spec is")
    assert "dataset_kwargs take 50" in lines[1]  # 5000+ bytes, named as the cause


def test_ctrl_c_in_next_raises_keyboard_interrupt_fast_and_leaves_no_worker(tmp_path):
    p = run_script(tmp_path, """
        import sys, time, ferry
        from datasets import Items
        ld = ferry.Loader(Items, dataset_kwargs={"n": 10, "slow_ms": 60000, "slow_from": 1},
                          batch_size=1, shuffle=False,
                          workers=2, start_timeout_ms=60000)
        ld.next()  # item 0 is quick; item 1 takes 60 s
        try:  # before the print: the signal may land as it returns
            print(ld.worker_pid(0), ld.worker_pid(1), flush=True)
            ld.next()
        except KeyboardInterrupt:
            print(time.monotonic(), flush=True)
            raise
        """)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2
    # The trainer is now in (or about to enter) next(), waiting on a 60 s item.
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    line = p.stdout.readline()
    out, err = p.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    raised = float(line)
    # Within the 50 ms slice next() waits in, plus a loaded machine's slack.
    assert raised - sent < 0.25, raised - sent
    for pid in pids:
        assert not os.path.exists("/proc/%d" % pid) or "State:\tZ" in open(
            "/proc/%d/status" % pid).read()


def test_ctrl_c_at_a_terminal_prints_nothing_of_ferrys_own_processes(tmp_path):
    """Ctrl-C in a terminal signals the whole process group: the trainer,
    the clean parents and the workers. Only the trainer's code reacts (here
    it catches the KeyboardInterrupt and closes); ferry's own processes
    print no traceback of theirs under it (a clean parent used to)."""
    p = run_script(tmp_path, """
        import sys, time, ferry
        class Slow:
            def __len__(self): return 1000
            def __getitem__(self, i):
                time.sleep(0.02)
                return i
        if __name__ == "__main__":
            ld = ferry.Loader(Slow(), batch_size=2, workers=2)
            it = iter(ld)
            next(it)
            try:  # from before "ready": the signal may land as the print returns
                print("ready", flush=True)
                while True:
                    next(it)
            except KeyboardInterrupt:
                ld.close()
                print("interrupted", flush=True)
        """, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert out.strip() == "interrupted", (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


@pytest.mark.parametrize("bad", [False, True], ids=["batch", "batch_error"])
def test_ctrl_c_as_a_batch_arrives_keeps_it_for_the_next_call_and_out_of_the_state(bad):
    # Batch 2 is made only once the trainer waits for it and SIGINT is
    # pending, so it arrives with the handler still to run: what the
    # KeyboardInterrupt interrupts is the hand-over, and neither the next
    # call nor a checkpoint taken in the except clause may skip the batch.
    import datasets
    import threading
    datasets.GATE.clear()
    armed = []

    def on_sigint(signum, frame):
        if armed:
            raise KeyboardInterrupt

    def interrupt_then_open_gate():
        wait_for(lambda: ld._c.busy, 30, "the trainer not in next()")
        os.kill(os.getpid(), signal.SIGINT)
        datasets.GATE.set()

    opts = dict(dataset_kwargs={"n": 16, "at": 2, "bad": bad}, batch_size=1, shuffle=False,
                workers=1, worker_mode="thread")
    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        with ferry.Loader(datasets.Gated, **opts) as ld:
            assert [ld.next().seq for _ in range(2)] == [0, 1]
            sender = threading.Thread(target=interrupt_then_open_gate)
            sender.start()
            armed.append(1)
            with pytest.raises(KeyboardInterrupt):
                ld.next()
            armed.clear()
            sender.join()
            state = ld.state_dict()
            with ferry.Loader(datasets.Gated, state=state, **opts) as resumed:
                if bad:
                    with pytest.raises(ferry.BatchError, match="item 2 is bad"):
                        resumed.next()
                else:
                    assert resumed.next().seq == 2
            if bad:
                with pytest.raises(ferry.BatchError, match="item 2 is bad") as e:
                    ld.next()
                assert e.value.batch_in_epoch == 2
            else:
                assert ld.next().seq == 2
            assert ld.next().seq == 3
    finally:
        signal.signal(signal.SIGINT, old)
        datasets.GATE.set()


def test_stream_goes_on_after_a_batch_error():
    with ferry.Loader(Items, dataset_kwargs={"n": 10, "bad": 3}, batch_size=2, workers=2,
                      shuffle=False, epochs=1) as ld:
        stream = ld.stream()
        got, failed = [], []
        while True:
            try:
                got.append(next(stream).index_in_epoch)
            except ferry.BatchError as e:
                failed.append(e.batch_in_epoch)
            except StopIteration:
                break
        assert got == [0, 2, 3, 4] and failed == [1]
        assert list(stream) == []  # ended for good at the end of the stream


def test_out_of_order_after_a_resume_mid_epoch_ends_each_for_with_its_epoch():
    with ferry.Loader("synthetic:n=40,dim=1", batch_size=4, workers=1) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    with ferry.Loader("synthetic:n=40,dim=1", batch_size=4, workers=2, in_order=False,
                      state=state) as ld:
        first = [(b.epoch, b.index_in_epoch) for b in ld]
        assert sorted(first) == [(0, i) for i in range(3, 10)]  # the rest of epoch 0 only
        second = [(b.epoch, b.index_in_epoch) for b in ld]
        assert sorted(second) == [(1, i) for i in range(10)]


@pytest.mark.parametrize("off", ["OFF", "False", "No", "00"])
def test_in_order_off_in_any_spelling_the_c_options_take_gives_one_epoch_per_for(off):
    # The last batch of epoch 0 is held back while epoch 1's come (prefetch
    # runs on): out of order, the for hands out epoch 0's batches as they
    # come and waits for its last; those of epoch 1 are kept (in the C
    # loader's window) for the next for, as torch's in_order=False does.
    # One task queued per worker (credits=1): a task queued behind the
    # gated one at its worker would wait with it, and which tasks the
    # gated worker had queued would decide whether epoch 1's first three
    # could all be made (the test failed 1 run in 8 under load so).
    import threading
    import datasets
    datasets.GATE.clear()
    try:
        with ferry.Loader(datasets.Gated, dataset_kwargs={"n": 4, "at": 3}, batch_size=1,
                          shuffle=False, workers=2, prefetch=8, credits=1,
                          worker_mode="thread", in_order=off) as ld:
            got, kept = [], []

            def open_once_kept():
                try:  # the gate opens whatever happens; what was kept is asserted below
                    # epoch 0's three, then epoch 1's first three (its index 3 waits too)
                    deadline = time.monotonic() + 20
                    while ld.stats()["completed"] < 6 and time.monotonic() < deadline:
                        time.sleep(0.01)  # polling the loader's state, with a deadline
                    kept.append(ld.stats()["completed"] >= 6 and len(got) == 3)
                finally:
                    datasets.GATE.set()

            opener = threading.Thread(target=open_once_kept)
            for b in ld:
                got.append((b.epoch, b.index_in_epoch))
                if len(got) == 3:  # all but the gated one: open it once epoch 1's are kept
                    opener.start()
            opener.join(30)
            assert kept == [True], "epoch 1's batches were not kept while epoch 0's last waited"
            assert sorted(got) == [(0, i) for i in range(4)], got
            second = [(b.epoch, b.index_in_epoch) for b in ld]
            assert sorted(second) == [(1, i) for i in range(4)], second
            with pytest.raises(ferry.InvalidValue):
                ld.state_dict()  # the C side has it out of order too
    finally:
        datasets.GATE.set()


def test_out_of_order_the_first_epoch_comes_as_made_while_a_worker_builds_a_slow_first_item():
    # Item 0 takes 1.5 s in a worker (quick when read for the schema).
    # The first worker ready once took the whole window (4 tasks): the
    # other worker was given nothing and no batch came until item 0 was
    # made (issue 36, item 6). Now each holds its share while the others
    # start, so only the batch queued behind item 0 at its worker waits
    # with it, and the epoch takes one slow item's time.
    slow = 1.5
    with ferry.Loader(SlowInWorkers, dataset_kwargs={"n": 10, "slow": 0, "seconds": slow},
                      batch_size=1, workers=2, in_order=False) as ld:
        opened = time.monotonic()
        came = [(int(b["x"][0]), time.monotonic() - opened) for b in ld]
    assert sorted(i for i, _ in came) == list(range(10))
    early = [i for i, t in came if t < slow * 2 / 3]
    assert 0 not in early and len(early) >= 8, came
    assert [i for i, _ in came[:len(early)]] == early, came  # before item 0's batch
    assert came[-1][1] < 2 * slow * 0.8, came


def item_zero_builds(log):
    with open(log) as f:
        return len(f.read().split())


def test_a_slow_item_0_read_for_the_schema_serves_its_batch_not_built_again(tmp_path):
    # The clean parent reads item 0 to learn the schema (1.5 s); the batch
    # of index 0 in epoch 0 is that item, not a second 1.5 s (issue 36,
    # item 6). Epoch 1 builds it afresh: 2 builds in all, not 3.
    log, slow = str(tmp_path / "item0"), 1.5
    start = time.monotonic()
    with ferry.Loader(CountsItemZero, dataset_kwargs={"n": 10, "log": log, "seconds": slow},
                      batch_size=1, workers=2, in_order=False, epochs=2) as ld:
        opened = time.monotonic()
        first = {int(b["x"][0]): float(b["r"][0]) for b in ld}
        ended = time.monotonic()
        assert first == {i: float(i) for i in range(10)}
        assert ended - opened < slow * 2 / 3, "epoch 0 took %.2f s after open" % (ended - opened)
        assert ended - start < 2 * slow * 0.8
        assert sorted(int(b["x"][0]) for b in ld) == list(range(10))
    assert item_zero_builds(log) == 2


@pytest.mark.parametrize("how", ["draws", "asks"])
def test_item_0_is_built_again_for_its_batch_when_the_schemas_may_differ(tmp_path, how):
    # Drawn from numpy's global generator, or made after asking
    # worker_info() (None where the schema is read): the task's item 0
    # may differ from the one read at open, so the batch builds its own.
    log = str(tmp_path / "item0")
    with ferry.Loader(CountsItemZero, dataset_kwargs={"n": 4, "log": log, how: True},
                      batch_size=2, workers=1, epochs=1) as ld:
        assert [b["x"].tolist() for b in ld] == [[0, 1], [2, 3]]
    assert item_zero_builds(log) == 2


def test_item_0_with_per_sample_randomness_read_in_a_worker_serves_its_first_batch(tmp_path):
    # worker_info().rng(0) fails outside a worker, so worker 0 reads item 0
    # itself as it opens, with the seed and epoch 0 its first batch has:
    # that item is the batch's, the same draw as any build of it.
    log = str(tmp_path / "item0")
    with ferry.Loader(CountsItemZero, dataset_kwargs={"n": 4, "log": log, "rng": True},
                      batch_size=2, workers=1, seed=9, shuffle=False, epochs=1) as ld:
        b = ld.next()
    assert b["x"].tolist() == [0, 1]
    assert b["r"][0] == ferry.WorkerInfo(0, 1, 9, 0).rng(0).random()
    assert item_zero_builds(log) == 1


def test_the_example_in_help_ferry_runs(tmp_path, monkeypatch):
    code = "\n".join(line[4:] for line in ferry.__doc__.split("\n\n")[1].splitlines())
    assert "ferry.Loader(" in code and 'batch["x"]' in code, code
    monkeypatch.chdir(tmp_path)
    np.save("train_x.npy", np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8))
    np.save("train_y.npy", np.arange(1000, dtype=np.int64))
    scope = {}
    try:
        exec(code, scope)
        assert scope["x"].shape[1:] == (8,) and len(scope["x"]) == len(scope["y"])
    finally:
        if "loader" in scope:
            scope["loader"].close()


def test_a_missing_field_is_a_key_error_naming_the_fields():
    with ferry.Loader(SYN, batch_size=10, workers=1) as ld:
        b = ld.next()
        with pytest.raises(KeyError, match="no field 'image'; the batch has 'x', 'y'"):
            b["image"]
        with pytest.raises(KeyError, match="no field 1.5; the batch has 'x', 'y'"):
            b[1.5]
        assert b.get("image") is None and "image" not in b


def test_next_timeout_raises_timeout_and_changes_nothing():
    with ferry.Loader(Items, dataset_kwargs={"n": 4, "slow_ms": 2000, "slow_from": 1},
                      batch_size=1, workers=1, prefetch=1) as ld:
        assert ld.next().indices.tolist() == [0]
        t0 = time.monotonic()
        with pytest.raises(ferry.NotReady):
            ld.next(timeout=0.05)
        assert time.monotonic() - t0 < 1.5  # the 50 ms asked, not the 2 s item
        assert ld.next().indices.tolist() == [1]


def test_a_timeout_too_large_is_an_invalid_value_in_next_and_open():
    with ferry.Loader(SYN, batch_size=10, workers=1) as ld:
        with pytest.raises(ferry.InvalidValue, match="next\\(\\): timeout must be at most"):
            ld.next(timeout=1e30)
        assert ld.next().seq == 0  # nothing changed
    for huge in (1e12, 1e30):
        with pytest.raises(ferry.InvalidValue, match="timeout"):
            ferry.Loader(SYN, batch_size=10, workers=1, timeout=huge)


def test_held_batches_are_counted_and_bounded():
    with ferry.Loader(SYN, batch_size=10, workers=1, max_held=3) as ld:
        kept = [ld.next()["x"] for _ in range(3)]  # arrays keep their batches alive
        assert ld.held == 3
        with pytest.raises(ferry.LimitError, match="3 batches"):
            ld.next()
        del kept[0]
        gc.collect()
        assert ld.held == 2
        b = ld.next()
        assert ld.held == 3 and b.seq == 3
    with pytest.raises(ValueError, match="max_held"):
        ferry.Loader(SYN, max_held=-1)


def test_a_forked_child_cannot_use_or_close_its_parents_loader():
    with ferry.Loader(SYN, batch_size=10, workers=2) as ld:
        ld.next()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: using it fails cleanly, dropping it stops nothing
            os.close(r)
            try:
                ld.next()
                code = b"used"
            except RuntimeError as e:
                code = b"refused" if "forked" in str(e) else b"other"
            ld.close()
            os.write(w, code)
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read()
        assert os.waitpid(pid, 0)[1] == 0
        assert said == b"refused"
        # The parent's workers and stream are untouched.
        assert all(ld.worker_pid(i) > 0 for i in range(2))
        assert ld.next().seq == 1


def test_torch_of_a_tuple_batch_unpacks_into_tensors():
    torch = pytest.importorskip("torch")
    from collections.abc import Sequence
    with ferry.Loader(Pairs, batch_size=10, workers=1) as ld:
        b = ld.next()
        assert isinstance(b, Sequence)
        x, y = b.torch()
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert x.data_ptr() == b[0].__array_interface__["data"][0]


def _builtin_exception(cls, msg):
    """An instance of the built-in exception class `cls` carrying `msg`:
    made with the message alone where the constructor takes it, otherwise
    with arguments of the shape it requires, `msg` among them."""
    if issubclass(cls, UnicodeDecodeError):
        return cls("utf-8", b"\xff", 0, 1, msg)
    if issubclass(cls, UnicodeEncodeError):
        return cls("ascii", "\xe9", 0, 1, msg)
    if issubclass(cls, UnicodeTranslateError):
        return cls("\xe9", 0, 1, msg)
    if issubclass(cls, BaseExceptionGroup):
        # A group needs its exceptions; one that is not an Exception keeps
        # BaseExceptionGroup from turning itself into an ExceptionGroup.
        inner = ValueError("inner") if issubclass(cls, Exception) else GeneratorExit("inner")
        return cls(msg, [inner])
    return cls(msg)


def _builtin_exception_classes():
    """Every exception class in builtins, aliases (IOError, EnvironmentError)
    once, by name. None is left out: whatever a dataset's __getitem__
    raises, SystemExit, KeyboardInterrupt and GeneratorExit included, is
    caught by the worker's C code and sent as the batch's failure like any
    other (a worker that is interrupted or exits for real is a signal or an
    exit, not an exception raised by the dataset)."""
    import builtins
    seen = {}
    for c in vars(builtins).values():
        if isinstance(c, type) and issubclass(c, BaseException):
            seen.setdefault(c, c.__name__)
    return sorted(seen.values())


class RaisesEachBuiltin:
    """Batches of 2 items; item 4*j + 3 (the second item of odd batch
    2*j + 1) raises the built-in exception names[j], made by
    _builtin_exception; even batches are whole."""

    def __init__(self, names):
        self.names = names

    def __len__(self):
        return 4 * len(self.names)

    def __getitem__(self, i):
        if i % 4 == 3:
            import builtins
            name = self.names[i // 4]
            raise _builtin_exception(getattr(builtins, name), "%s raised on item %d" % (name, i))
        return np.int64(i)


def test_every_builtin_exception_a_dataset_raises_is_a_batch_error_and_the_epoch_goes_on():
    # A batch whose dataset raised a built-in exception is re-raised as a
    # class that is both a ferry.BatchError and that built-in; for one that
    # class cannot be made or instantiated (MemoryError: its __new__ is not
    # safe to call on a subclass; ExceptionGroup: __new__ needs the
    # exceptions), a plain ferry.BatchError naming the type instead, never
    # a TypeError from making the exception. Only Exception subclasses are
    # combined: a failed batch must not be caught as SystemExit or
    # KeyboardInterrupt.
    import builtins
    import pickle
    import traceback
    cannot_combine = {"MemoryError", "ExceptionGroup"}
    names = _builtin_exception_classes()
    assert {"MemoryError", "OSError", "SystemExit", "ExceptionGroup"} <= set(names)
    with ferry.Loader(RaisesEachBuiltin, dataset_kwargs={"names": names}, batch_size=2,
                      workers=2, shuffle=False, epochs=1) as ld:
        it = iter(ld)
        for j, name in enumerate(names):
            cls = getattr(builtins, name)
            b = next(it)
            assert b.index_in_epoch == 2 * j and b[0].tolist() == [4 * j, 4 * j + 1], name
            with pytest.raises(ferry.BatchError) as ei:
                next(it)
            e = ei.value
            original = str(_builtin_exception(cls, "%s raised on item %d" % (name, 4 * j + 3)))
            assert "%s: %s" % (name, original) in str(e), (name, str(e))
            assert e.exc_type == name and e.exc_message == original, name
            assert e.index == 4 * j + 3 and e.batch_in_epoch == 2 * j + 1, name
            assert e.worker in (0, 1) and "__getitem__" in e.traceback, name
            # What a trainer dying on it prints names the dataset's error too.
            assert original in "".join(traceback.format_exception_only(type(e), e)), name
            # It crosses to another process (multiprocessing pickles a child's
            # exception for its parent) as the same class, detail and fields.
            again = pickle.loads(pickle.dumps(e))
            assert type(again) is type(e) and str(again) == str(e), name
            assert pickle.loads(pickle.dumps(type(e))) is type(e), name  # the class by name
            assert (again.index, again.worker, again.exc_type, again.traceback) == \
                (e.index, e.worker, e.exc_type, e.traceback), name
            if issubclass(ferry.BatchError, cls):
                pass  # BaseException, Exception: every BatchError is one
            elif issubclass(cls, Exception) and name not in cannot_combine:
                assert isinstance(e, cls), name
            elif not issubclass(cls, Exception):
                assert not isinstance(e, cls), name
        with pytest.raises(StopIteration):
            next(it)


# ---------------------------------------------- the dataset's bytes, shared

@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_arrays_and_tensors_reach_the_workers_in_shared_memory_not_copied(tmp_path, monkeypatch,
                                                                          how):
    """A dataset object's large numpy array and torch tensor are not copied
    into the pickle. With the clean parent a fork of the trainer (the
    default), the workers' array and tensor are the trainer's very memory
    (the same addresses, pages shared copy-on-write, as torch's forked
    workers have them); spawned, their bytes go once into the memory the
    loader hands the workers (memfd:ferry-dataset), mapped privately. Either
    way they are of their own types, and a worker's write lands in its own
    copy of the page, never the trainer's. A memmap travels as a reference
    to its file, mapped again in the workers: its rows are the file's, and
    nothing of it is in the pickle."""
    torch = pytest.importorskip("torch")
    from ferry.torch import DataLoader
    monkeypatch.setenv("FERRY_CLEAN_PARENT", how)
    rows = np.arange(8 * 4096, dtype=np.uint8).reshape(8, 4096)
    np.save(tmp_path / "m.npy", rows)
    ds = HoldsArrays(str(tmp_path / "m.npy"))
    with DataLoader(ds, batch_size=None, num_workers=2) as dl:
        items = list(dl)
        spec = dict(dl._loader._pairs)["dataset"]
    assert len(items) == 8
    for i, it in enumerate(items):
        if how == "fork":
            assert it["x_at"] == ds.x.ctypes.data and it["t_at"] == ds.t.data_ptr()
        else:
            assert "memfd:ferry-dataset" in it["x"], it["x"]
            assert "memfd:ferry-dataset" in it["t"], it["t"]
        assert it["x_type"] == "ndarray" and it["t_type"] == "Tensor"
        assert it["x_value"] == 200 and it["t_sum"] == 6.0
        assert str(tmp_path / "m.npy") in it["m"] and it["m_type"] == "memmap"
        assert it["m_value"] == rows[i, 0]
    assert (ds.x[:8] == np.arange(8)).all()  # the trainer's array as it was
    # The pickle is the structure only: 12 MiB of arrays, and the file, out of it.
    assert json.loads(spec.split(" ", 1)[1])["bytes"] < 64 * 1024


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_pandas_frame_s_numeric_columns_reach_the_workers_without_a_copy(monkeypatch, how):
    """A DataFrame in the dataset comes out right by the arrays' rule: its
    numeric columns (numpy blocks) are pickle protocol 5 buffers, lent to
    the clean parent's fork (the trainer's own memory, at its addresses)
    or, spawned, written once into the loader's memfd; its str column
    travels in the pickle. The worker's frame is a DataFrame with the
    trainer's values."""
    pytest.importorskip("pandas")
    from ferry.torch import DataLoader
    from datasets import HoldsFrame
    monkeypatch.setenv("FERRY_CLEAN_PARENT", how)
    ds = HoldsFrame()
    with DataLoader(ds, batch_size=None, num_workers=2) as dl:
        items = list(dl)
    assert len(items) == 6
    for i, it in enumerate(items):
        k = i * 1000
        assert (it["a"], it["b"], it["s"], it["type"]) == (k / 2, k * 3, "row%d" % k, "DataFrame")
        if how == "fork":
            assert it["a_at"] == ds.df["a"].to_numpy().ctypes.data
            assert it["b_at"] == ds.df["b"].to_numpy().ctypes.data
        else:
            assert "memfd:ferry-dataset" in it["a_map"], it["a_map"]


def test_a_memmap_twice_the_machine_s_memory_serves_random_batches(tmp_path):
    """A np.memmap of a file twice this machine's memory (sparse: it costs
    no disk) in a dataset object: the workers map the file again, the
    loader serves shuffled batches of it, each row the file's own (read
    back with pread), and the memory of every process stays far below the
    file (nothing copies it, nothing reads it whole)."""
    from datasets import BigMemmap
    width = 4096
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    rows = 2 * ram // width + 1
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        try:
            f.truncate(rows * width)
        except OSError as e:  # a filesystem without files this big
            pytest.skip("cannot make a sparse file of %d GiB here: %s" % (rows * width >> 30, e))
        # Rows with content: every 997th of the first million, row r all (r % 251).
        for r in range(0, 10**6, 997):
            f.seek(r * width)
            f.write(bytes([r % 251]) * width)
    ds = BigMemmap(str(path), rows, width)
    fd = os.open(path, os.O_RDONLY)
    try:
        with ferry.Loader(ds, batch_size=64, workers=2, shuffle=True, seed=1) as ld:
            assert len(ld) == -(-rows // 64)
            seen = 0
            for _, b in zip(range(40), ld):
                for i, row in zip(b["i"], b["row"]):
                    assert bytes(row) == os.pread(fd, width, int(i) * width)
                seen += len(b["i"])
            mem = ld.memory()
        assert seen == 40 * 64
        assert mem["total"] < 1 << 30, mem  # the file is %d GiB % (rows * width >> 30)
    finally:
        os.close(fd)


def test_a_memmap_whose_file_changed_is_a_clear_error(tmp_path):
    """A memmap travels as (file, offset, dtype, shape): a file changed
    after the loader was built is refused naming it, never read as if it
    were the trainer's array."""
    from ferry import _handoff
    path = tmp_path / "m.npy"
    np.save(path, np.zeros((4, 8), dtype=np.float32))
    m = np.load(path, mmap_mode="r")
    fn, args = _handoff._reduce_shared(m)
    assert np.array_equal(fn(*args), m)
    np.save(path, np.ones((5, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="m.npy changed after the loader was built"):
        fn(*args)
    os.unlink(path)
    with pytest.raises(ValueError, match="m.npy is gone"):
        fn(*args)


def test_a_fed_sampler_loses_and_repeats_nothing_when_a_worker_is_killed(tmp_path):
    # Index 13 kills its worker once, mid-epoch: its batch goes out again
    # with the same fed indices, and every batch arrives once, in order.
    rng = np.random.default_rng(5)
    epochs = [[list(b) for b in np.array_split(rng.permutation(40), 12)] for _ in range(2)]
    flag = str(tmp_path / "died")
    with ferry.Loader(Items, dataset_kwargs={"n": 40, "die": 13, "flag": flag}, workers=2,
                      batch_size=4, feed_batches=12, epochs=2) as ld:
        ld.feed(0, epochs[0])
        first = [b.indices.tolist() for b in ld]
        ld.feed(12, epochs[1])
        second = [b.indices.tolist() for b in ld]
        assert ld.stats()["restarts"] == 1
    assert os.path.exists(flag)
    assert first == [[int(i) for i in b] for b in epochs[0]]
    assert second == [[int(i) for i in b] for b in epochs[1]]


def test_a_bad_feed_is_refused_and_loses_nothing():
    with ferry.Loader(Items, dataset_kwargs={"n": 10}, workers=1, batch_size=3,
                      feed_batches=2, epochs=1) as ld:
        with pytest.raises(ferry.InvalidValue, match="batch 0 is the next to feed"):
            ld.feed(1, [[1]])
        with pytest.raises(ferry.InvalidValue, match="has 4 indices, not 1..3"):
            ld.feed(0, [[1, 2, 3, 4]])
        with pytest.raises(ferry.IndexOutOfRange, match="index 10, but the dataset has 10"):
            ld.feed(0, [[1], [10]])
        ld.feed(0, [[3, 1], [2]])
        assert [b.indices.tolist() for b in ld] == [[3, 1], [2]]
    with pytest.raises(ferry.InvalidValue, match="shuffle, world_size and drop_last"):
        ferry.Loader(SYN, batch_size=2, feed_batches=3, shuffle=True)
