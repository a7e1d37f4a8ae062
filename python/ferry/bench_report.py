"""What a bench run's figures mean and how they are shown: the metrics
each pipeline reports, the ratios and the targets set for ferry, the
summary of the rounds, the table, and ``--plot``'s figure. Used by
``python -m ferry.bench``."""

import statistics

import numpy as np

LOADERS = ("ferry", "torch")

_WAITS = (  # what both pipelines report first: key, label, unit
    ("batches_per_s", "batches/s", ""),
    ("wait_mean_ms", "wait mean, steady", "ms"),
    ("wait_p50_ms", "wait p50, steady", "ms"),
    ("wait_p99_ms", "wait p99, steady", "ms"),
    ("wait_max_ms", "wait max, steady", "ms"),
    ("epoch_wait_ms", "epoch-boundary wait, mean", "ms"),
    ("epoch_wait_max_ms", "epoch-boundary wait, max", "ms"),
    ("startup_ms", "startup (ctor + 1st batch)", "ms"),
)

METRICS = _WAITS + (  # key, label, unit
    ("cold_start_ms", "cold start (python to 1st batch)", "ms"),
    ("trainer_peak_rss_mib", "trainer peak RSS", "MiB"),
    ("workers_peak_rss_mib", "workers peak RSS, sum", "MiB"),
    ("workers_pss_mib", "workers PSS at end, sum", "MiB"),
    ("step_bound_fraction", "of step-bound rate", "%"),
)

RATIOS = ("batches_per_s", "wait_p99_ms", "epoch_wait_ms", "startup_ms", "cold_start_ms")

IMAGEFOLDER_METRICS = (("images_per_s", "images/s", ""),
                       ("images_per_core_s", "images/s per worker core", "")) + _WAITS + (
    ("trainer_growth_mib", "trainer RSS growth", "MiB"),
    ("workers_pss_mib", "loader processes' PSS, sum", "MiB"),
    ("memory_all_mib", "memory in all (PSS + growth)", "MiB"),
    ("memory_all_pss_mib", "memory in all, by PSS only", "MiB"),
    ("memory_run_mib", "memory while running, shm counted", "MiB"),
    ("trainer_peak_rss_mib", "trainer peak RSS", "MiB"),
    ("workers_peak_rss_mib", "workers peak RSS, sum", "MiB"),
    ("step_bound_fraction", "of step-bound rate", "%"),
)

IMAGEFOLDER_RATIOS = ("images_per_s", "images_per_core_s", "wait_p50_ms", "wait_p99_ms", "epoch_wait_ms",
                      "startup_ms", "trainer_growth_mib", "workers_pss_mib", "memory_all_mib",
                      "memory_all_pss_mib", "memory_run_mib")

JPEG_METRICS = (("images_per_s", "images/s", ""),
                ("images_per_core_s", "images/s per worker core", ""),
                ("workers_cpu_s", "workers' CPU, 1st to last batch", "s")) + _WAITS + (
    ("trainer_growth_mib", "trainer RSS growth", "MiB"),
    ("workers_pss_mib", "loader processes' PSS, sum", "MiB"),
)

JPEG_RATIOS = ("images_per_s", "images_per_core_s", "workers_cpu_s", "wait_p50_ms",
               "startup_ms", "workers_pss_mib")

# The targets set for ferry in the jpeg pipeline (ratio ferry/torch).
JPEG_TARGETS = {"images_per_core_s": (">=", 3.0)}

# The targets set for ferry in the imagefolder pipeline: ratio ferry/torch.
TARGETS = {
    "startup_ms": ("<=", 1.25),
    "memory_all_mib": ("<=", 1.1),
    "trainer_growth_mib": ("<=", 2.0),
    "images_per_s": (">=", 1.15),
    "epoch_wait_ms": ("<", 1.0),
}
_OPS = {"<=": lambda r, x: r <= x, "<": lambda r, x: r < x, ">=": lambda r, x: r >= x}


def metrics_of(pipeline):
    """(metrics, ratio keys) reported for ``pipeline``."""
    if pipeline == "mnist":
        return METRICS, RATIOS
    if pipeline == "jpeg":
        return JPEG_METRICS, JPEG_RATIOS
    return IMAGEFOLDER_METRICS, IMAGEFOLDER_RATIOS


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
    growth, pss = raw["trainer_growth_mib"], raw["workers_pss_mib"]
    pss_growth = raw["trainer_pss_growth_mib"]
    return {
        "batches": n, "items": raw["items"], "batches_per_s": rate,
        "images_per_s": (raw["items"] - raw["first_items"]) / span if n > 1 and span > 0
        else 0.0,
        "wait_mean_ms": float(steady.mean()) if steady.size else None,
        "wait_p50_ms": pct(50), "wait_p99_ms": pct(99),
        "wait_max_ms": float(steady.max()) if steady.size else None,
        "epoch_wait_ms": float(bounds.mean()) if bounds.size else None,
        "epoch_wait_max_ms": float(bounds.max()) if bounds.size else None,
        "epoch_start_waits_ms": [ep[0] * 1000 for ep in waits if ep],
        "startup_ms": raw["startup"] * 1000,
        "cold_start_ms": raw["cold_start"] * 1000 if raw["cold_start"] is not None else None,
        "trainer_peak_rss_mib": raw["trainer_hwm_mib"],
        "workers_peak_rss_mib": raw["workers_hwm_mib"],
        "workers_pss_mib": pss,
        "trainer_growth_mib": growth,
        "memory_all_mib": pss + growth if pss is not None and growth is not None else None,
        "memory_all_pss_mib": pss + pss_growth if pss is not None and pss_growth is not None
        else None,
        "step_bound_fraction": rate * a.step_ms / 1000 if a.step_ms > 0 else None,
        "workers_cpu_s": raw["workers_cpu_s"],
        "images_per_core_s": (raw["items"] - raw["first_items"]) / raw["workers_cpu_s"]
        if raw["workers_cpu_s"] else None,
        "memory_run_mib": raw["memory_run_mib"],
        "worker_processes": raw["worker_processes"],
        "trainer_peak_rss_reset": raw["hwm_reset"],
        "leftover_pids": raw["leftover_pids"],
        # --plot: [batches so far, {stage: mean ms per batch}] per window (ferry)
        "stages_over_time": raw.get("stages_over_time"),
    }


def _aggregate(rounds, metrics=METRICS):
    """median, min and max over rounds of each numeric metric."""
    out = {"median": {}, "min": {}, "max": {}}
    for key, _, _ in metrics:
        vals = [r[key] for r in rounds if r.get(key) is not None]
        if vals:
            out["median"][key] = statistics.median(vals)
            out["min"][key], out["max"][key] = min(vals), max(vals)
    return out


def _ratios(loaders, keys=RATIOS):
    """ferry/torch of the medians (where torch's is above 0)."""
    if not all(n in loaders for n in LOADERS):
        return {}
    f, t = loaders["ferry"]["median"], loaders["torch"]["median"]
    return {k: f[k] / t[k] for k in keys
            if f.get(k) is not None and t.get(k) is not None and t[k] > 0}


# Growths this small are a few pages either way, below what VmRSS can
# tell apart: a ratio of two of them says nothing.
GROWTH_FLOOR_MIB = 1.0


def _targets(ratios, targets=TARGETS, ferry=None):
    """Each target: its ratio (None when not measured), the bound, met.
    ferry: ferry's medians, for the trainer's growth, met also when under
    GROWTH_FLOOR_MIB whatever torch's."""
    out = {}
    for key, (op, bound) in targets.items():
        r = ratios.get(key)
        met = None if r is None else bool(_OPS[op](r, bound))
        if key == "trainer_growth_mib" and ferry and ferry.get(key) is not None and \
                ferry[key] < GROWTH_FLOOR_MIB:
            met = True
        out[key] = {"ratio": r, "target": "%s %g" % (op, bound), "met": met}
    return out

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
    shape = "%d items, batch %d = %d batches/epoch, %d epochs" % (
        c["items"], c["batch_size"], res["batches_per_epoch"], c["epochs"])
    if c["pipeline"] == "mnist":
        lines = [
            "ferry.bench: MnistLike (x uint8 28x28, y int64), " + shape,
            "  %d persistent workers each, shuffled; prefetch: %d batches in flight"
            % (c["workers"], c["prefetch"]),
        ]
        if c["only"] != "ferry":
            lines[-1] += " for ferry;"
            lines.append("  torch prefetch_factor = max(1, prefetch // workers) = %d per worker, "
                         "%d in all" % (pf, pf * c["workers"]))
    else:
        f = res["imagefolder"]
        work = ("RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize; x float32 "
                "3x224x224, y int64")
        if c["pipeline"] == "jpeg":
            work = ("RandomResizedCrop(224), RandomHorizontalFlip to uint8 3x224x224 (ferry: in "
                    "C; torch: PIL, PILToTensor)")
        lines = [
            "ferry.bench: ImageFolder, JPEG, %d classes, ~%d px (%s: %s)"
            % (c["classes"], c["size"], f["root"], f["folder"]),
            "  " + work,
            "  " + shape,
            "  %d persistent workers each, shuffled; prefetch: %s" % (
                c["workers"], "ferry's default (auto), torch prefetch_factor 2 per worker"
                if c["prefetch"] is None else "%d batches in flight for ferry, torch "
                "prefetch_factor %d per worker" % (c["prefetch"], pf)),
        ]
        if "ferry" in res["dataset_given_as"]:
            lines.append("  ferry got %s" % res["dataset_given_as"]["ferry"])
    runs = "%d round(s) of %s" % (c["rounds"], c["only"] or "ferry, torch, alternating")
    return lines + ["  training step: %s" % step, "  %s" % runs]


def table(res):
    """The one-screen report."""
    names = list(res["loaders"])
    ratios = res["ratios_ferry_over_torch"]
    targets = res.get("targets", {}) if ratios else {}
    multi = res["config"]["rounds"] > 1
    head = "%-36s" % ("median [min..max]" if multi else "one round")
    head += "".join("%22s" % n for n in names) + ("%13s" % "ferry/torch" if ratios else "")
    head += "  target" if targets else ""
    lines = _header(res) + ["", head]
    for key, label, unit in metrics_of(res["config"]["pipeline"])[0]:
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
        if key in targets:
            t = targets[key]
            row += "  %s: %s" % (t["target"], "met" if t["met"] else "MISSED")
        lines.append(row)
    lines += [
        "",
        "wait = time in next(); steady = every batch but each epoch's first; epoch boundary =",
        "first batch of epochs 2..N (torch: iter() + next()); batches/s: first to last batch.",
        "startup: constructor to first batch, worker start and imports included, in a trainer",
    ]
    if res["config"]["pipeline"] == "mnist":
        lines += [
            "that has imported its library already; cold start: a fresh `python` process to its",
            "first batch (interpreter, `import ferry` or `import torch`, loader, workers).",
        ]
    else:
        lines += [
            "that has imported its libraries already.",
            "trainer RSS growth: RSS without shared memory (RssAnon + RssFile) just before the",
            "loader is built to the end of the last epoch (loader open): the batch slots (and",
            "torch's shm batches), which RSS counts in full in every process that maps them,",
            "are in the PSS figures; PSS: every process below the trainer then; memory in all:",
            "their sum; by PSS only: the trainer's PSS",
            "growth plus the workers' PSS, each page once. A trainer growth under %g MiB"
            % GROWTH_FLOOR_MIB,
            "meets its target whatever torch's (a few pages). Memory while running: median of",
            "samples once an epoch (mid-epoch) of the same without shared memory, plus the growth",
            "of the machine's shared memory (/proc/meminfo Shmem): each page once, batches in",
            "flight included (torch's are shm files that no PSS shows until the trainer reads",
            "them). Ratios are of the medians.",
        ]
    if not all(r["trainer_peak_rss_reset"] for ld in res["loaders"].values()
               for r in ld["rounds"]):
        lines.append("The kernel refused to reset VmHWM: trainer peaks include earlier runs.")
    if "torch" in names and res["config"]["pipeline"] == "mnist":
        lines += [
            "torch: the dataset is built in the trainer (in its startup and RSS); its workers",
            "are forked, so their RSS counts pages shared with the trainer (PSS splits them).",
            "torch is imported in the trainer for every run, ferry's included.",
        ]
    elif "torch" in names:
        lines += [
            "The ImageFolder is built in the trainer (in startup) for both. torch's workers are",
            "forked from the trainer, so their RSS counts pages shared with it (PSS splits",
            "them). torch and torchvision are imported in the trainer for every run.",
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


def _plot_stages(ax, series, per_epoch, epochs):
    """ferry's stages, stacked: the mean ms per batch of each stage in each
    window of batches (the window ends at the x of its point)."""
    from ferry.bench import STAGES
    x = [b for b, _ in series]
    names = [s for s in STAGES if any(s in m for _, m in series)]
    ax.stackplot(x, [[m.get(s, 0.0) for _, m in series] for s in names], labels=names,
                 step="pre", alpha=0.85)
    for e in range(1, epochs):
        ax.axvline(e * per_epoch, color="grey", ls="--", lw=0.8)
    ax.set_ylabel("ferry: mean ms per batch, by stage")
    ax.legend(loc="upper right", fontsize=8, ncol=len(names))


def plot(path, res, last):
    """A PNG of the wait per batch (ms, log) across the epochs of the last
    round, epoch boundaries marked; batch 0 is the startup. Below it,
    ferry's stages over the same batches: each window's mean time per batch
    in each stage, stacked (Loader.profile, docs/profile.md)."""
    plt = _pyplot()
    per_epoch, epochs = res["batches_per_epoch"], res["config"]["epochs"]
    series = next((raw["stages_over_time"] for raw in last.values()
                   if raw.get("stages_over_time")), None)
    if series:
        fig, (ax, sx) = plt.subplots(2, 1, figsize=(11, 8.4), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(11, 4.8))
    for name, raw in last.items():
        w = [x * 1000 for ep in raw["waits"] for x in ep]
        w[0] = raw["startup"] * 1000
        ax.plot(range(len(w)), np.maximum(w, 1e-3), lw=0.7, marker=".", ms=2.5, label=name)
    for e in range(1, epochs):
        ax.axvline(e * per_epoch, color="grey", ls="--", lw=0.8)
    ax.set_yscale("log")
    if series:
        _plot_stages(sx, series, per_epoch, epochs)
    (sx if series else ax).set_xlabel("batch (across epochs; dashed: epoch boundaries)")
    ax.set_ylabel("trainer wait in next() (ms)")
    c = res["config"]
    ax.set_title("ferry.bench, %s, last round: %d workers, batch %d, prefetch %s, step %g ms; "
                 "batch 0 = startup" % (c["pipeline"], c["workers"], c["batch_size"],
                                        "auto" if c["prefetch"] is None else c["prefetch"],
                                        c["step_ms"]), fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
