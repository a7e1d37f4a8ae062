"""What odd trainers and newcomers do: failures at awkward places, batches
handed to generic code, scripts run in unusual ways, misuse from threads."""

import copy
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ferry
from datasets import Crash, ExtraKey, Items, Pairs, PerThread, Unicode
from test_remote import RemoteWorker, free_port, open_remote

SYN = "synthetic:n=100,dim=4"


def test_non_ascii_multiline_error_text_stays_a_batch_error():
    with ferry.Loader(Unicode, batch_size=1, workers=1, epochs=1) as ld:
        got, errors = [], []
        it = iter(ld)
        while True:
            try:
                got.append(int(next(it)[0][0]))
            except StopIteration:
                break
            except ferry.BatchError as e:
                errors.append(e)
    assert got == [0, 1, 2, 4, 5, 6, 7]
    (e,) = errors
    assert e.exc_type == "ValueError" and e.exc_message.startswith("éé") and e.index == 3


def test_a_given_up_last_batch_still_ends_its_epoch():
    # Item 9 kills every worker that tries it: the last batch of each epoch
    # is given up after max_attempts deaths, and each `for` ends there.
    with ferry.Loader(Crash, dataset_kwargs={"n": 10, "at": 9}, batch_size=5, workers=1,
                      max_attempts=1, epochs=2) as ld:
        for epoch in range(2):
            seen, errors = [], []
            it = iter(ld)
            while True:
                try:
                    seen.append(next(it).index_in_epoch)
                except StopIteration:
                    break
                except ferry.BatchError as e:
                    errors.append((e.epoch, e.batch_in_epoch))
            assert seen == [0] and errors == [(epoch, 1)]


def test_out_of_order_each_for_is_one_whole_epoch():
    # 12 items, 3 workers, nothing slow: the window runs epochs ahead, but
    # each for hands out its own epoch's batches only, every item once.
    with ferry.Loader(Items, dataset_kwargs={"n": 12}, batch_size=1, workers=3,
                      in_order=False, prefetch=16) as ld:
        for epoch in range(5):
            got = [(b.epoch, int(b.indices[0])) for b in ld]
            assert sorted(got) == [(epoch, i) for i in range(12)], (epoch, got)


def test_out_of_order_for_yields_one_epochs_worth():
    with ferry.Loader(SYN, batch_size=10, workers=2, in_order=False, epochs=2) as ld:
        assert sum(1 for _ in ld) == 10
        assert sum(1 for _ in ld) == 10
        assert sum(1 for _ in ld) == 0


def test_extra_key_fails_that_batch():
    with ferry.Loader(ExtraKey, batch_size=4, workers=1, epochs=1) as ld:
        it = iter(ld)
        assert next(it)["a"].tolist() == [0, 1, 2, 3]
        with pytest.raises(ferry.BatchError, match="every item needs the same keys") as ei:
            next(it)
        assert ei.value.index == 5


def test_batches_work_with_generic_mapping_code():
    torch = pytest.importorskip("torch")
    with ferry.Loader(Pairs, batch_size=8, workers=1) as ld:
        b = ld.next()
        x, y = b  # a tuple dataset's batch unpacks like its items
        assert np.array_equal(x, b[0]) and np.array_equal(y, b[1])
        assert list(b.keys()) == ["0", "1"] and len(b) == 2
        rebuilt = type(b)({k: torch.as_tensor(v) for k, v in b.items()})
        assert isinstance(rebuilt["0"], torch.Tensor) and rebuilt.epoch is None
        for other in (pickle.loads(pickle.dumps(b)), copy.deepcopy(b)):
            assert np.array_equal(other[0], b[0]) and other[0].flags.owndata
        with pytest.raises(IndexError, match="2 fields"):
            b[5]
        assert np.array_equal(b[np.int64(1)], y)


def test_tuple_and_single_value_batches_are_sequences_of_arrays_and_dict_ones_mappings():
    from collections.abc import Mapping, Sequence
    torch = pytest.importorskip("torch")
    from torch.utils.data._utils.collate import default_convert
    from datasets import Missing
    with ferry.Loader(Pairs, batch_size=4, workers=1) as ld:
        b = ld.next()
        assert isinstance(b, ferry.Batch) and isinstance(b, Sequence)
        assert not isinstance(b, Mapping)
        assert [a is b[i] for i, a in enumerate(b)] == [True, True]  # the arrays, not names
        converted = default_convert(b)
        assert [type(t) for t in converted] == [torch.Tensor, torch.Tensor]
        assert torch.equal(converted[0], torch.as_tensor(b[0]))
        assert b[:1] == (b[0],) and "1" in b
    with ferry.Loader(Missing, batch_size=4, workers=1) as ld:  # items: one int32 each
        b = ld.next()
        (x,) = b
        assert x.tolist() == [0, 1, 2, 3] and isinstance(b, Sequence)
        assert default_convert(b)[0].tolist() == [0, 1, 2, 3]
    with ferry.Loader(SYN, batch_size=4, workers=1) as ld:
        b = ld.next()
        assert isinstance(b, Mapping) and not isinstance(b, Sequence) and list(b) == ["x", "y"]
        assert sorted(default_convert(b)) == ["x", "y"]


def test_import_without_the_built_extension_says_what_to_build(tmp_path):
    # From the source tree (no _ferry there), and with an extension this
    # interpreter cannot load (here: not even a shared object).
    import shutil
    import sysconfig
    built = os.path.dirname(ferry.__file__)
    broken = tmp_path / "broken" / "ferry"
    broken.mkdir(parents=True)
    elsewhere = tmp_path / "cwd"  # python -c puts its cwd first on sys.path
    elsewhere.mkdir()
    for name in os.listdir(built):
        if name.endswith(".py"):
            shutil.copy(os.path.join(built, name), broken / name)
    (broken / ("_ferry" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(b"not ELF " * 512)
    src_tree = os.path.join(os.path.dirname(__file__), os.pardir)
    for path, cause in ((src_tree, "cannot import name '_ferry'"),
                        (str(broken.parent), "invalid ELF header")):
        p = subprocess.run([sys.executable, "-c", "import ferry"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=path), cwd=elsewhere, timeout=60)
        assert p.returncode != 0
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: ferry: the C extension ferry._ferry cannot be "
                               "imported by this interpreter (%s)" % sys.executable), last
        assert cause in last and "tools/setup.sh build" in last, last
        assert "PYTHONPATH=build/python" in last and "PYTHON=%s" % sys.executable in last, last


def test_thread_workers_keep_their_thread_local_data():
    with ferry.Loader(PerThread, batch_size=4, workers=2, worker_mode="thread", epochs=3) as ld:
        handles = {int(h) for b in ld.stream() for h in b[0]}
    assert len(handles) <= 2  # one per worker thread, not one per batch


def test_close_from_another_thread_during_next_changes_nothing():
    with ferry.Loader(Items, dataset_kwargs={"n": 4, "slow_ms": 3000, "slow_from": 1},
                      batch_size=1, workers=1, prefetch=1) as ld:
        ld.next()
        errors = []

        def closer():
            # Only once the trainer thread is inside next(), waiting.
            deadline = time.monotonic() + 10
            while not ld._c.busy and time.monotonic() < deadline:
                time.sleep(0.001)
            try:
                ld.close()
            except RuntimeError as e:
                errors.append(e)

        t = threading.Thread(target=closer)
        t.start()
        b = ld.next()  # waits about 3 s for item 1; the close comes meanwhile
        t.join(10)
        assert b.indices.tolist() == [1]
        assert errors and "next()" in str(errors[0]) and not ld.closed


def test_state_calls_after_close_and_a_bad_state_keep_the_loader():
    with ferry.Loader(SYN, batch_size=10, workers=1) as ld:
        ld.next()
        # another order (a batch_size alone would resume: another shape)
        other = ferry.Loader(SYN, batch_size=20, workers=1, seed=3)
        bad = other.state_dict()
        other.close()
        with pytest.raises(ferry.StateError):
            ld.load_state_dict(bad)
        assert not ld.closed and ld.next().seq == 1
    for call in (ld.state_dict, ld.stats, lambda: ld.worker_pid(0)):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_options_are_checked_before_anything_starts():
    with pytest.raises(TypeError, match="given twice"), pytest.warns(FutureWarning):
        ferry.Loader(SYN, world_size=2, world=2)
    with pytest.raises(ValueError, match="timeout"):
        ferry.Loader(SYN, timeout=float("nan"))
    with pytest.raises(TypeError, match="timeout"):
        ferry.Loader(SYN, timeout="5")
    with pytest.raises(TypeError, match="dataset_kwargs"):
        ferry.Loader(Items(3), dataset_kwargs={"n": 3})
    # A sub-millisecond deadline rounds up to 1 ms; it never turns into 0 (off).
    assert ferry._seconds("timeout", 0.0004) == 1 and ferry._seconds("timeout", 0) == 0
    assert ferry._seconds("timeout", float("inf")) is None
    with pytest.raises(ValueError, match="timeout"):
        ferry._seconds("timeout", -1)
    with ferry.Loader(SYN, batch_size=np.int64(25), workers=1) as ld:
        assert len(ld) == 4
        with pytest.raises(ValueError, match="timeout"):
            ld.next(timeout=-1)


def run(tmp_path, files, args, **kw):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable] + args, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=60, **kw)


@pytest.mark.parametrize("clean_parent", ["fork", "spawn"])
def test_main_script_gets_the_trainers_argv_and_thread_placement_runs_it_once(tmp_path,
                                                                              clean_parent):
    p = run(tmp_path, {"train.py": """
        import argparse, numpy as np, ferry
        print("TOP", flush=True)
        ap = argparse.ArgumentParser(); ap.add_argument("--k", type=int)
        ARGS = ap.parse_args()
        class Scaled:
            def __len__(self): return 8
            def __getitem__(self, i): return np.int64(i * ARGS.k)
        if __name__ == "__main__":
            for placement in ("process", "thread"):
                with ferry.Loader(Scaled, batch_size=4, workers=2, epochs=1,
                                  worker_mode=placement) as ld:
                    print(sorted(int(v) for b in ld for v in b[0]))
        """}, ["train.py", "--k", "3"], env=dict(os.environ, FERRY_CLEAN_PARENT=clean_parent))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    # The trainer's run; a clean parent forked from the trainer has its
    # __main__ already (as torch's forked workers do), a spawned one runs
    # the script once for all the workers forked from it (they inherit its
    # stdout); thread workers use the trainer's own __main__, not another
    # run.
    assert p.stdout.count("TOP") == (1 if clean_parent == "fork" else 2)
    assert lines.count(str([0, 3, 6, 9, 12, 15, 18, 21])) == 2


def test_dataset_in_a_module_run_with_dash_m(tmp_path):
    p = run(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": "K = 5\n", "pkg/train.py": """
        import numpy as np, ferry
        from .helpers import K
        class Mod:
            def __len__(self): return 4
            def __getitem__(self, i): return np.int64(i * K)
        if __name__ == "__main__":
            with ferry.Loader(Mod, batch_size=4, workers=1, epochs=1) as ld:
                print([int(v) for b in ld for v in b[0]])
        """}, ["-m", "pkg.train"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[0, 5, 10, 15]"


def test_a_script_without_the_main_guard_is_told_so(tmp_path):
    # Only where the clean parent is spawned and runs the script again
    # (forked from the trainer, it has the script's module as it is, and
    # the loader works, as torch's forked workers do).
    files = {"noguard.py": """
        import numpy as np, ferry
        class D:
            def __len__(self): return 4
            def __getitem__(self, i): return np.int64(i)
        with ferry.Loader(D, batch_size=2, workers=1, start_timeout_ms=20000) as ld:
            print(len(list(ld)))
        """}
    p = run(tmp_path, files, ["noguard.py"])
    assert p.returncode == 0 and p.stdout == "2\n", p.stderr
    p = run(tmp_path, files, ["noguard.py"], env=dict(os.environ, FERRY_CLEAN_PARENT="spawn"))
    assert p.returncode != 0
    assert "ferry.DatasetError" in p.stderr or "DatasetError" in p.stderr
    assert 'if __name__ == "__main__":' in p.stderr


def test_remote_worker_refuses_methods_of_module_level_objects():
    port = free_port()
    with RemoteWorker(port, ["datasets"]):
        with pytest.raises(ferry.Timeout, match="not a class or function defined by that name"):
            open_remote(port, "python:datasets:DEFAULT", start_timeout_ms=3000)
        with pytest.raises(ferry.Timeout, match="private parts"):
            open_remote(port, "python:datasets:Items.__init__", start_timeout_ms=3000)


def test_an_option_s_old_name_works_and_names_the_new_one():
    for old, new, value in (("placement", "worker_mode", "thread"), ("world", "world_size", 1),
                            ("on_worker_death", "on_worker_failure", "fail")):
        with pytest.warns(FutureWarning, match="option %s is now called %s" % (old, new)):
            with ferry.Loader(SYN, batch_size=10, workers=1, epochs=1, **{old: value}) as ld:
                assert sum(1 for _ in ld) == 10
