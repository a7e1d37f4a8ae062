"""python -m ferry.bench runs end to end (a small dataset, one round) and
its --json output has every key; the torch half only where torch imports,
the imagefolder pipeline only where torchvision does too."""

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
    assert run["worker_processes"] in worker_processes(name, 2)
    return ld["median"]


def worker_processes(name, workers, python=True):
    """The processes below the trainer: the workers, and for ferry with
    Python workers, the loader's template (a fork of the trainer) and the
    clean parent it forked, which forks them. A loader running C forks
    neither."""
    if name != "ferry":
        return (workers,)
    return (workers + 2,) if python else (workers,)


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
    p = run("--kills", "3")  # the mnist pipeline has no Python worker to kill
    assert p.returncode == 2 and "--kills" in p.stderr


def test_bench_ferry_only():
    res = run_bench("--only", "ferry")
    assert set(res) >= {"config", "batches_per_epoch", "loaders", "ratios_ferry_over_torch"}
    assert list(res["loaders"]) == ["ferry"] and res["ratios_ferry_over_torch"] == {}
    assert check_loader(res, "ferry")["batches_per_s"] > 0



def test_bench_passes_ferry_options_to_ferry_s_loader():
    """--ferry-option KEY=VALUE (ferry against itself): the run says what it
    was given, and the option reaches the loader (a value it refuses fails
    the run naming it); a malformed one is refused at the command line."""
    res = run_bench("--only", "ferry", "--ferry-option", "prefetch=3")
    assert res["config"]["ferry_options"] == {"prefetch": 3}
    assert check_loader(res, "ferry")["batches_per_s"] > 0
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + ARGS +
                       ["--only", "ferry", "--ferry-option", "credits=100000"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "credits" in p.stderr
    p = subprocess.run([sys.executable, "-m", "ferry.bench", "--ferry-option", "credits"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "KEY=VALUE" in p.stderr

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


def test_bench_imagefolder_ferry_and_torch(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    data = tmp_path / "images"
    args = ["--pipeline", "imagefolder", "--items", "64", "--classes", "4", "--size", "32",
            "--batch-size", "16", "--epochs", "2", "--rounds", "1", "--workers", "1",
            "--step-ms", "0", "--data", str(data), "--json"]
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + args, capture_output=True,
                       text=True, timeout=80)
    assert p.returncode == 0, p.stderr
    assert "left processes behind" not in p.stderr, p.stderr
    res = json.loads(p.stdout)
    assert len(list(data.glob("class_*/*.jpg"))) == 64 and len(list(data.glob("class_*"))) == 4
    assert res["config"]["pipeline"] == "imagefolder" and res["batches_per_epoch"] == 4
    assert "its transform in C" in res["dataset_given_as"]["ferry"]
    assert list(res["loaders"]) == ["ferry", "torch"]
    for name in ("ferry", "torch"):
        run = res["loaders"][name]["rounds"][0]
        assert run["batches"] == 2 * 4 and run["items"] == 2 * 64
        assert run["leftover_pids"] == []
        # ferry.torch runs this transform in C: no Python workers
        assert run["worker_processes"] in worker_processes(name, 1, python=False)
        assert len(run["epoch_start_waits_ms"]) == 2
        med = res["loaders"][name]["median"]
        assert {"images_per_s", "wait_p50_ms", "wait_p99_ms", "epoch_wait_ms", "startup_ms",
                "trainer_growth_mib", "workers_pss_mib", "memory_all_mib"} <= set(med)
        assert med["images_per_s"] > 0 and med["workers_pss_mib"] > 0
        assert med["memory_run_mib"] > 0  # sampled while it ran
        assert med["memory_all_mib"] == pytest.approx(med["workers_pss_mib"]
                                                      + med["trainer_growth_mib"])
    ratios = res["ratios_ferry_over_torch"]
    assert {"images_per_s", "wait_p50_ms", "wait_p99_ms", "epoch_wait_ms", "startup_ms",
            "workers_pss_mib", "memory_all_mib"} <= set(ratios)
    assert set(res["targets"]) == {"startup_ms", "memory_all_mib", "trainer_growth_mib",
                                   "images_per_s", "epoch_wait_ms"}
    # A second run reuses the folder (here with torchvision's code in
    # ferry's Python workers); one made with other options is refused.
    # With --kills: workers SIGKILLed, each replacement timed to ready and
    # to its first item, every index once (else exit 1).
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + args[:-1] +
                       ["--only", "ferry", "--no-native", "--kills", "2"],
                       capture_output=True, text=True, timeout=80)
    assert p.returncode == 0 and "(reused)" in p.stderr, p.stderr
    assert p.stdout.startswith("ferry.bench: ImageFolder")
    assert "(Python workers)" in p.stdout
    assert "worker SIGKILLed 2 times" in p.stdout and "arrived once: yes" in p.stdout, p.stdout
    assert "ready to take a task" in p.stdout, p.stdout
    assert p.stderr.count("was killed by signal SIGKILL") == 2, p.stderr
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + args[:-1] + ["--seed", "1"],
                       capture_output=True, text=True, timeout=80)
    assert p.returncode != 0 and "was made with" in p.stderr, p.stderr


def test_bench_jpeg_compares_the_c_decoder_with_torchvision(tmp_path):
    """--pipeline jpeg: ferry's imagefolder spec against torchvision's uint8
    pipeline on the same files, with images per worker core, its ratio and
    its target."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    args = ["--pipeline", "jpeg", "--items", "48", "--classes", "3", "--size", "64",
            "--batch-size", "8", "--epochs", "2", "--rounds", "1", "--workers", "1",
            "--data", str(tmp_path / "images"), "--json"]
    p = subprocess.run([sys.executable, "-m", "ferry.bench"] + args, capture_output=True,
                       text=True, timeout=80)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["config"]["pipeline"] == "jpeg" and res["batches_per_epoch"] == 6
    assert "decoded in C" in res["dataset_given_as"]["ferry"]
    for name in ("ferry", "torch"):
        run = res["loaders"][name]["rounds"][0]
        assert run["items"] == 2 * 48 and run["leftover_pids"] == []
        assert run["worker_processes"] in worker_processes(name, 1, python=False)
        assert run["images_per_core_s"] > 0 and run["workers_cpu_s"] > 0
    assert "images_per_core_s" in res["ratios_ferry_over_torch"]
    assert set(res["targets"]) == {"images_per_core_s"}


def test_bench_dataset_memory_measures_every_dataset_for_both_loaders():
    """--pipeline dataset-memory --quick: a row per dataset with both
    loaders, memory added and the first batch above zero, targets for
    ferry, and no process of any run left behind."""
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "ferry.bench", "--pipeline", "dataset-memory",
                        "--quick", "--json"], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    assert "left processes behind" not in p.stderr, p.stderr
    res = json.loads(p.stdout)
    assert [(r["dataset"], r["workers"]) for r in res["rows"]] == [
        (d, 2) for d in ("array", "tensor", "memmap", "records", "vocab")]
    for row in res["rows"]:
        assert set(row["loaders"]) == {"torch", "ferry"}
        for name, ld in row["loaders"].items():
            (run,) = ld["rounds"]
            assert run["leftover_pids"] == []
            assert run["batches"] == 20 and run["samples"] >= 1
            assert run["added_peak_mib"] > 0 and run["added_peak_mib"] >= run["added_end_mib"]
            assert 0 < run["first_batch_s"] <= run["epoch_s"]
            assert run["processes_at_end"] >= 3  # the trainer and its 2 workers at least
        assert {"added_peak_mib", "first_batch_s"} <= set(row["ratios_ferry_over_torch"])
        assert row["targets"] and all(isinstance(t["met"], bool) for t in row["targets"].values())


def test_bench_mix_compares_a_mix_with_one_source_and_a_resume_with_a_fresh_start():
    """--pipeline mix, small: every side measured each round, ratios made
    from them, and no process left behind."""
    p = subprocess.run([sys.executable, "-m", "ferry.bench", "--pipeline", "mix", "--items",
                        "4096", "--batches", "20", "--rounds", "1", "--json"],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert set(res["rounds"]) == {"one", "mix", "fresh", "resumed"}
    for name in ("one", "mix"):
        (m,) = res["rounds"][name]
        assert m["items_per_s"] > 0 and 0 <= m["wait_p50_ms"] <= m["wait_p99_ms"]
    for name in ("fresh", "resumed"):
        assert res["rounds"][name][0]["first_batch_s"] > 0
    assert res["mix_vs_one_items_per_s"] > 0 and res["resumed_vs_fresh_first_batch"] > 0


def test_bench_early_break_measures_each_epoch_s_first_batch_for_both_loaders():
    """--pipeline early-break, small: both loaders run every round, each
    later epoch's first batch is measured (the epoch before left early),
    and the ratios are made from the medians."""
    p = subprocess.run([sys.executable, "-m", "ferry.bench", "--pipeline", "early-break",
                        "--items", "4096", "--batch-size", "64", "--epochs", "3", "--take", "5",
                        "--rounds", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    for kind in ("torch", "ferry"):
        (m,) = res["rounds"][kind]
        assert m["first_batch_s"] > 0 and len(m["later_first_ms"]) == 2
        assert all(x > 0 for x in m["later_first_ms"]) and m["total_s"] >= m["first_batch_s"]
    assert {"first_batch_s", "later_first_p50_ms", "total_s"} <= set(res["ratios_ferry_over_torch"])


def test_bench_plot_draws_the_waits_and_ferry_s_stages_over_the_run(tmp_path):
    """--plot: the PNG is written, and the JSON holds the stages it drew:
    windows of batches in order, each with the stages' mean ms, among them
    the simulated step (0.5 ms, spun: at least that)."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "waits.png"
    res = run_bench("--only", "ferry", "--step-ms", "0.5", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    series = res["loaders"]["ferry"]["rounds"][0]["stages_over_time"]
    assert len(series) >= 10
    assert [b for b, _ in series] == sorted(b for b, _ in series)
    for _, stages in series:
        assert "make" in stages and all(v >= 0 for v in stages.values())
        # the step between two next() calls: the 0.5 ms spin at least (a
        # window whose batches were all delivered before any step ended
        # has none)
        assert stages.get("step", 0.5) >= 0.5
    assert sum("step" in stages for _, stages in series) >= len(series) // 2
