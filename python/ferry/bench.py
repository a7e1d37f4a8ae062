"""``python -m ferry.bench``: ferry.Loader against torch's DataLoader, on
the same Python dataset class.

What it measures, per loader (the median over rounds, with min..max):

- batches/s, from the arrival of the first batch to that of the last;
- the trainer's wait in ``next()`` per batch (mean, p50, p99, max) for steady
  batches (every batch but each epoch's first), and, apart, the wait for
  the first batch of each epoch after the first (the epoch boundary; for
  torch it includes ``iter(loader)``, which is where its workers restart);
- startup: constructor to first batch, worker start and imports included
  (for torch, the dataset is built in the trainer, so that counts too);
- cold start: a fresh interpreter to its first batch, the library's own
  import included (``python train.py`` as a user waits for it);
- peak RSS (VmHWM, reset before each run) of the trainer, and the sum
  over worker processes (with their PSS at the end, which counts pages
  shared between processes once: torch's workers are forked);
- with ``--step-ms``, the fraction of the step-bound rate (1000/step_ms).

How: one process runs ferry, torch, ferry, torch, ... (``--rounds`` each),
closing each loader and waiting for its workers to exit before the next.
Both get the class :class:`MnistLike` (``ferry.bench:MnistLike``), the
same workers and batch size, shuffle and persistent workers; ferry's
``prefetch`` is batches in flight in all, torch's ``prefetch_factor`` is
per worker, so torch gets ``max(1, prefetch // workers)``. torch is
imported before any timing. The loop reads one element of each batch and
then runs the simulated training step (a busy spin by default).
"""

import argparse
import gc
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time

import numpy as np

LOADERS = ("ferry", "torch")


class MnistLike:
    """MNIST-shaped and numpy-backed: ``n`` uint8 images (28, 28) and int64
    labels, random but fixed by ``seed``; items are
    ``{"x": uint8 (28, 28), "y": int64}``."""

    def __init__(self, n=60000, seed=0):
        rng = np.random.default_rng(seed)
        self.x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        self.y = rng.integers(0, 10, size=n, dtype=np.int64)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": np.int64(self.y[i])}


# ------------------------------------------------------------ processes

def _proc_kb(path, key):
    """The kB value of line ``key:`` in a /proc file, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _descendants(root=None):
    """Pids of the live processes below ``root`` (default: this one)."""
    root = os.getpid() if root is None else root
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _reset_peak_rss():
    """Resets this process's VmHWM to its current RSS (Linux clear_refs 5);
    False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _workers_memory():
    """(sum of VmHWM, sum of Pss) of the live child processes, in MiB."""
    pids = _descendants()
    hwm = [_proc_kb("/proc/%d/status" % p, "VmHWM") for p in pids]
    pss = [_proc_kb("/proc/%d/smaps_rollup" % p, "Pss") for p in pids]
    mib = lambda kbs: sum(kbs) / 1024 if kbs and None not in kbs else None  # noqa: E731
    return mib(hwm), mib(pss), len(pids)


def _wait_children_gone(seconds=15.0):
    """Waits until this process has no children; the pids left, if any."""
    deadline = time.monotonic() + seconds
    while True:
        left = _descendants()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


# --------------------------------------------------------------- loaders

def _torch_prefetch(a):
    return max(1, a.prefetch // a.workers)


def _dataset_class():
    """MnistLike by its importable name, ferry.bench:MnistLike, also when
    this file runs as __main__ (workers import the class by name)."""
    from ferry import bench
    return bench.MnistLike


def _open_ferry(a, kwargs):
    """(new epoch iterator, batches per epoch, close) for ferry."""
    import ferry
    ld = ferry.Loader(_dataset_class(), dataset_kwargs=kwargs, batch_size=a.batch_size,
                      workers=a.workers, prefetch=a.prefetch, shuffle=True, seed=a.seed,
                      epochs=a.epochs)
    return ld.__iter__, len(ld), ld.close


def _open_torch(a, kwargs):
    """(new epoch iterator, batches per epoch, close) for torch; close drops
    the DataLoader and its iterator, whose finaliser stops the workers."""
    import torch
    from torch.utils.data import DataLoader
    held = {"dl": DataLoader(_dataset_class()(**kwargs), batch_size=a.batch_size, shuffle=True,
                             num_workers=a.workers, persistent_workers=True,
                             prefetch_factor=_torch_prefetch(a),
                             generator=torch.Generator().manual_seed(a.seed))}

    def close():
        held.clear()
        gc.collect()

    return lambda: iter(held["dl"]), len(held["dl"]), close


OPENERS = {"ferry": _open_ferry, "torch": _open_torch}

# A fresh interpreter's way to its first batch, for the cold start.
_COLD = {
    "ferry": """
import ferry
from ferry.bench import MnistLike
ld = ferry.Loader(MnistLike, dataset_kwargs=K, batch_size=B, workers=W, prefetch=P,
                  shuffle=True, seed=S)
next(iter(ld))
print("first", flush=True)
ld.close()
""",
    "torch": """
import torch
from torch.utils.data import DataLoader
from ferry.bench import MnistLike
dl = DataLoader(MnistLike(**K), batch_size=B, shuffle=True, num_workers=W,
                persistent_workers=True, prefetch_factor=PF)
next(iter(dl))
print("first", flush=True)
""",
}


def cold_start(name, a, kwargs):
    """Seconds from starting a fresh interpreter to its first batch of
    loader ``name``: the interpreter, the library's import, the loader and
    its workers, what a user waits for at `python train.py`."""
    import subprocess
    code = ("K, B, W, P, S, PF = %r, %d, %d, %d, %d, %d\n" % (
        kwargs, a.batch_size, a.workers, a.prefetch, a.seed, _torch_prefetch(a))) + _COLD[name]
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    took = time.perf_counter() - t0
    p.communicate(timeout=120)
    if line.strip() != "first" or p.returncode != 0:
        raise RuntimeError("ferry.bench: the cold start of %s failed (exit %s)"
                           % (name, p.returncode))
    return took


# ------------------------------------------------------------------ a run

def _step(seconds, mode):
    """The simulated training step: a busy spin, or a sleep."""
    if seconds <= 0:
        return
    if mode == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _epochs(new_iter, a, t0):
    """Runs the epochs: (waits per epoch in s, arrival times of the first
    and the last batch, items seen, checksum)."""
    step = a.step_ms / 1000.0
    waits, items, check, t_first, t_last = [], 0, 0, None, t0
    for _ in range(a.epochs):
        ew = []
        t = time.perf_counter()
        it = new_iter()
        for b in it:
            now = time.perf_counter()
            ew.append(now - t)
            t_last = now
            if t_first is None:
                t_first = now
            x, y = b["x"], b["y"]
            check += int(x[-1, 14, 14]) + int(y[-1])
            items += int(y.shape[0])
            _step(step, a.step_mode)
            del b, x, y
            t = time.perf_counter()
        del it
        waits.append(ew)
    return waits, t_first if t_first is not None else t0, t_last, items, check


def run_once(name, a):
    """One run of loader ``name``: its raw measurements (dict)."""
    kwargs = {"n": a.items, "seed": a.seed}
    cold = cold_start(name, a, kwargs)
    gc.collect()
    reset = _reset_peak_rss()
    t0 = time.perf_counter()
    new_iter, per_epoch, close = OPENERS[name](a, kwargs)
    try:
        waits, t_first, t_last, items, check = _epochs(new_iter, a, t0)
        trainer = _proc_kb("/proc/self/status", "VmHWM")
        workers_hwm, workers_pss, nworkers = _workers_memory()
    finally:
        close()
        del new_iter, close
        gc.collect()
    left = _wait_children_gone()
    if left:
        print("ferry.bench: %s left processes behind: %s" % (name, left), file=sys.stderr)
    return {"waits": waits, "startup": t_first - t0, "cold_start": cold, "t_first": t_first, "t_last": t_last,
            "items": items, "check": check, "per_epoch": per_epoch,
            "trainer_hwm_mib": trainer / 1024 if trainer else None, "hwm_reset": reset,
            "workers_hwm_mib": workers_hwm, "workers_pss_mib": workers_pss,
            "worker_processes": nworkers, "leftover_pids": left}


# ------------------------------------------------------------ the numbers

METRICS = (  # key, label, unit
    ("batches_per_s", "batches/s", ""),
    ("wait_mean_ms", "wait mean, steady", "ms"),
    ("wait_p50_ms", "wait p50, steady", "ms"),
    ("wait_p99_ms", "wait p99, steady", "ms"),
    ("wait_max_ms", "wait max, steady", "ms"),
    ("epoch_wait_ms", "epoch-boundary wait, mean", "ms"),
    ("epoch_wait_max_ms", "epoch-boundary wait, max", "ms"),
    ("startup_ms", "startup (ctor + 1st batch)", "ms"),
    ("cold_start_ms", "cold start (python to 1st batch)", "ms"),
    ("trainer_peak_rss_mib", "trainer peak RSS", "MiB"),
    ("workers_peak_rss_mib", "workers peak RSS, sum", "MiB"),
    ("workers_pss_mib", "workers PSS at end, sum", "MiB"),
    ("step_bound_fraction", "of step-bound rate", "%"),
)

RATIOS = ("batches_per_s", "wait_p99_ms", "epoch_wait_ms", "startup_ms", "cold_start_ms")


def summarize(raw, a):
    """The metrics of one run (dict, plain numbers; None where not
    applicable)."""
    waits = raw["waits"]
    steady = np.array([w for ep in waits for w in ep[1:]]) * 1000
    bounds = np.array([ep[0] for ep in waits[1:] if ep]) * 1000
    n = sum(len(ep) for ep in waits)
    span = raw["t_last"] - raw["t_first"]
    rate = (n - 1) / span if n > 1 and span > 0 else 0.0
    pct = lambda q: float(np.percentile(steady, q)) if steady.size else None  # noqa: E731
    return {
        "batches": n, "items": raw["items"], "batches_per_s": rate,
        "wait_mean_ms": float(steady.mean()) if steady.size else None,
        "wait_p50_ms": pct(50), "wait_p99_ms": pct(99),
        "wait_max_ms": float(steady.max()) if steady.size else None,
        "epoch_wait_ms": float(bounds.mean()) if bounds.size else None,
        "epoch_wait_max_ms": float(bounds.max()) if bounds.size else None,
        "startup_ms": raw["startup"] * 1000,
        "cold_start_ms": raw["cold_start"] * 1000,
        "trainer_peak_rss_mib": raw["trainer_hwm_mib"],
        "workers_peak_rss_mib": raw["workers_hwm_mib"],
        "workers_pss_mib": raw["workers_pss_mib"],
        "step_bound_fraction": rate * a.step_ms / 1000 if a.step_ms > 0 else None,
        "worker_processes": raw["worker_processes"],
        "trainer_peak_rss_reset": raw["hwm_reset"],
        "leftover_pids": raw["leftover_pids"],
    }


def _aggregate(rounds):
    """median, min and max over rounds of each numeric metric."""
    out = {"median": {}, "min": {}, "max": {}}
    for key, _, _ in METRICS:
        vals = [r[key] for r in rounds if r.get(key) is not None]
        if vals:
            out["median"][key] = statistics.median(vals)
            out["min"][key], out["max"][key] = min(vals), max(vals)
    return out


def _ratios(loaders):
    if not all(n in loaders for n in LOADERS):
        return {}
    f, t = loaders["ferry"]["median"], loaders["torch"]["median"]
    return {k: f[k] / t[k] for k in RATIOS if f.get(k) is not None and t.get(k)}


def bench(a, on_run=None):
    """Runs the rounds: (result for --json, raw runs of the last round)."""
    names = [a.only] if a.only else list(LOADERS)
    rounds = {n: [] for n in names}
    last = {}
    for r in range(a.rounds):
        for name in names:
            raw = run_once(name, a)
            if raw["items"] != a.epochs * a.items:
                raise RuntimeError("%s delivered %d items, expected %d"
                                   % (name, raw["items"], a.epochs * a.items))
            m = summarize(raw, a)
            m["checksum"] = raw["check"]
            rounds[name].append(m)
            last[name] = raw
            if on_run:
                on_run(r, name, m)
    per_epoch = {n: last[n]["per_epoch"] for n in names}
    if len(set(per_epoch.values())) != 1:
        raise RuntimeError("the loaders disagree on batches per epoch: %s" % per_epoch)
    loaders = {n: dict(rounds=rounds[n], **_aggregate(rounds[n])) for n in names}
    result = {
        "config": {k: getattr(a, k) for k in ("items", "batch_size", "workers", "prefetch",
                                              "epochs", "rounds", "step_ms", "step_mode",
                                              "seed", "only")},
        "torch_prefetch_factor": _torch_prefetch(a),
        "batches_per_epoch": per_epoch[names[0]],
        "step_bound_batches_per_s": 1000.0 / a.step_ms if a.step_ms > 0 else None,
        "loaders": loaders,
        "ratios_ferry_over_torch": _ratios(loaders),
    }
    return result, last


# ------------------------------------------------------------- the output

def _fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "%":
        return "%.0f%%" % (v * 100)
    for limit, form in ((100, "%.0f"), (10, "%.1f"), (1, "%.2f")):
        if abs(v) >= limit:
            return form % v
    return "%.3f" % v


def _header(res):
    c = res["config"]
    pf = res["torch_prefetch_factor"]
    step = "none"
    if c["step_ms"] > 0:
        step = "%g ms %s per batch (step-bound rate %s batches/s)" % (
            c["step_ms"], "busy spin" if c["step_mode"] == "spin" else "sleep",
            _fmt(res["step_bound_batches_per_s"]))
    lines = [
        "ferry.bench: MnistLike (x uint8 28x28, y int64), %d items, batch %d = %d batches/epoch,"
        " %d epochs" % (c["items"], c["batch_size"], res["batches_per_epoch"], c["epochs"]),
        "  %d persistent workers each, shuffled; prefetch: %d batches in flight"
        % (c["workers"], c["prefetch"]),
    ]
    if c["only"] != "ferry":
        lines[-1] += " for ferry;"
        lines.append("  torch prefetch_factor = max(1, prefetch // workers) = %d per worker, %d "
                     "in all" % (pf, pf * c["workers"]))
    runs = "%d round(s) of %s" % (c["rounds"], c["only"] or "ferry, torch, alternating")
    return lines + ["  training step: %s" % step, "  %s" % runs]


def table(res):
    """The one-screen report."""
    names = list(res["loaders"])
    ratios = res["ratios_ferry_over_torch"]
    multi = res["config"]["rounds"] > 1
    head = "%-36s" % ("median [min..max]" if multi else "one round")
    head += "".join("%22s" % n for n in names) + ("%13s" % "ferry/torch" if ratios else "")
    lines = _header(res) + ["", head]
    for key, label, unit in METRICS:
        cells = []
        for n in names:
            agg = res["loaders"][n]
            v = agg["median"].get(key)
            cell = _fmt(v, unit)
            if multi and v is not None:
                cell += " [%s..%s]" % (_fmt(agg["min"][key], unit), _fmt(agg["max"][key], unit))
            cells.append(cell)
        if all(c == "-" for c in cells):
            continue
        name = label + (" (%s)" % unit if unit and unit != "%" else "")
        row = "%-36s" % name + "".join("%22s" % c for c in cells)
        if key in ratios:
            row += "%12sx" % ("%.3g" % ratios[key])
        lines.append(row)
    lines += [
        "",
        "wait = time in next(); steady = every batch but each epoch's first; epoch boundary =",
        "first batch of epochs 2..N (torch: iter() + next()); batches/s: first to last batch.",
        "startup: constructor to first batch, worker start and imports included, in a trainer",
        "that has imported its library already; cold start: a fresh `python` process to its",
        "first batch (interpreter, `import ferry` or `import torch`, loader, workers).",
    ]
    if not all(r["trainer_peak_rss_reset"] for ld in res["loaders"].values()
               for r in ld["rounds"]):
        lines.append("The kernel refused to reset VmHWM: trainer peaks include earlier runs.")
    if "torch" in names:
        lines += [
            "torch: the dataset is built in the trainer (in its startup and RSS); its workers",
            "are forked, so their RSS counts pages shared with the trainer (PSS splits them).",
            "torch is imported in the trainer for every run, ferry's included.",
        ]
    return "\n".join(lines)


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or exit with what to install."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("ferry.bench: --plot needs matplotlib (%s); install it: Debian "
                         "'apt install python3-matplotlib', or 'pip install matplotlib'" % e)
    return plt


def plot(path, res, last):
    """A PNG of the wait per batch (ms, log) across the epochs of the last
    round, epoch boundaries marked; batch 0 is the startup."""
    plt = _pyplot()
    per_epoch, epochs = res["batches_per_epoch"], res["config"]["epochs"]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for name, raw in last.items():
        w = [x * 1000 for ep in raw["waits"] for x in ep]
        w[0] = raw["startup"] * 1000
        ax.plot(range(len(w)), np.maximum(w, 1e-3), lw=0.7, marker=".", ms=2.5, label=name)
    for e in range(1, epochs):
        ax.axvline(e * per_epoch, color="grey", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("batch (across epochs; dashed: epoch boundaries)")
    ax.set_ylabel("trainer wait in next() (ms)")
    c = res["config"]
    ax.set_title("ferry.bench, last round: %d workers, batch %d, prefetch %d, step %g ms; "
                 "batch 0 = startup" % (c["workers"], c["batch_size"], c["prefetch"],
                                        c["step_ms"]), fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m ferry.bench",
        description="ferry.Loader against torch.utils.data.DataLoader on one Python "
                    "dataset class (MNIST-shaped, numpy-backed), runs alternating.")
    from ferry import __version__  # loaded already: this module is inside the package
    p.add_argument("--version", action="version",
                   version="python -m ferry.bench %s" % __version__)
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--batch-size", type=int, default=256, help="items per batch (256)")
    p.add_argument("--prefetch", type=int, default=8,
                   help="batches in flight in all (8); torch gets prefetch_factor = "
                        "max(1, prefetch // workers) per worker")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (3)")
    p.add_argument("--items", type=int, default=60000, help="dataset items (60000)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step per batch, ms (0: none)")
    p.add_argument("--step-mode", choices=("spin", "sleep"), default="spin",
                   help="the step busy-spins (default) or sleeps")
    p.add_argument("--rounds", type=int, default=3, help="runs of each loader (3)")
    p.add_argument("--seed", type=int, default=0, help="dataset and shuffle seed (0)")
    p.add_argument("--only", choices=LOADERS, help="run one loader only")
    p.add_argument("--plot", metavar="FILE.png", help="plot the waits of the last round")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    for name in ("workers", "batch_size", "prefetch", "epochs", "items", "rounds"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.step_ms < 0:
        p.error("--step-ms must be >= 0")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.only != "ferry":
        try:
            importlib.import_module("torch")  # now, outside every timing
        except ImportError as e:
            print("ferry.bench: torch is not importable (%s); run with --only ferry" % e,
                  file=sys.stderr)
            return 2
    if a.plot and importlib.util.find_spec("matplotlib") is None:
        _pyplot()  # fails now, saying what to install, not after the runs

    def progress(r, name, m):
        print("ferry.bench: round %d/%d %-5s %8.1f batches/s, startup %.0f ms"
              % (r + 1, a.rounds, name, m["batches_per_s"], m["startup_ms"]), file=sys.stderr)

    res, last = bench(a, on_run=progress)
    if a.plot:
        plot(a.plot, res, last)
        print("ferry.bench: wrote %s" % a.plot, file=sys.stderr)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
