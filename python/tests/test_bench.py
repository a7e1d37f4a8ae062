"""python -m ferry.bench runs end to end (a small dataset, one round) and
its --json output has every key; the torch half only where torch imports."""

import json
import subprocess
import sys

import pytest

ARGS = ["--items", "2000", "--epochs", "2", "--rounds", "1", "--batch-size", "64", "--json"]
KEYS = {"batches_per_s", "wait_p50_ms", "wait_p99_ms", "wait_max_ms", "epoch_wait_ms",
        "epoch_wait_max_ms", "startup_ms", "cold_start_ms", "trainer_peak_rss_mib",
        "workers_peak_rss_mib"}


def run_bench(*extra):
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + ARGS + list(extra),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "left processes behind" not in p.stderr, p.stderr
    return json.loads(p.stdout)


def check_loader(res, name):
    ld = res["loaders"][name]
    assert len(ld["rounds"]) == 1
    run = ld["rounds"][0]
    assert run["batches"] == 2 * res["batches_per_epoch"] == 2 * 32
    assert run["items"] == 2 * 2000
    assert KEYS <= set(ld["median"]), KEYS - set(ld["median"])
    assert run["leftover_pids"] == []
    assert run["worker_processes"] == 2
    return ld["median"]


def test_bench_answers_version_help_and_bad_options_like_every_tool():
    import ferry
    run = lambda *a: subprocess.run([sys.executable, "-m", "ferry.bench"] + list(a),
                                    capture_output=True, text=True, timeout=60)
    for mod in ("ferry.bench", "ferry.worker"):
        p = subprocess.run([sys.executable, "-m", mod, "--version"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and p.stdout == "python -m %s %s\n" % (mod, ferry.__version__)
    p = run("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m ferry.bench")
    p = run("--bogus")
    assert p.returncode == 2 and "--bogus" in p.stderr


def test_bench_ferry_only():
    res = run_bench("--only", "ferry")
    assert set(res) >= {"config", "batches_per_epoch", "loaders", "ratios_ferry_over_torch"}
    assert list(res["loaders"]) == ["ferry"] and res["ratios_ferry_over_torch"] == {}
    assert check_loader(res, "ferry")["batches_per_s"] > 0


def test_bench_ferry_and_torch():
    pytest.importorskip("torch")
    res = run_bench()
    assert list(res["loaders"]) == ["ferry", "torch"]
    assert res["torch_prefetch_factor"] == 4
    assert check_loader(res, "ferry")["batches_per_s"] > 0
    assert check_loader(res, "torch")["batches_per_s"] > 0
    assert set(res["ratios_ferry_over_torch"]) == {"batches_per_s", "wait_p99_ms",
                                                   "epoch_wait_ms", "startup_ms",
                                                   "cold_start_ms"}
