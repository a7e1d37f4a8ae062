"""python -m ferry.bench --pipeline early-break: what a training loop that
leaves each epoch early costs (a step or validation limit, a peek with
next(iter(loader))), ferry.torch.DataLoader side by side with torch's
DataLoader in one invocation, rounds alternating (the machine is shared
and noisy).

Each run builds a DataLoader over a dataset holding a list of small dicts
(a path and a label each, as a file list is), then runs --epochs epochs,
taking --take batches of each and leaving the rest: torch's next `for`
starts a new epoch and never makes the rest of the one left, and neither
must ferry. Measured: the first batch of the first epoch (the workers'
start), the first batch of each later epoch (median and max: what the
loop waits at each epoch's start), and the whole run.
"""

import argparse
import json
import sys
import time

import numpy as np


class Records:
    """n small dicts, as a dataset's file list holds them; an item is a
    16-float tensor of its label (the loader's work, not the item's)."""

    def __init__(self, n):
        self.rows = [{"path": "/data/img_%08d.jpg" % i, "label": i % 1000} for i in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        import torch
        return torch.full((16,), float(self.rows[i]["label"]))


def run(kind, dataset, a):
    """One loader's run: {first_batch_s, later_first_ms (each later
    epoch's), total_s}."""
    import torch.utils.data as tud
    if kind == "ferry":
        from ferry.torch import DataLoader
    else:
        DataLoader = tud.DataLoader
    t0 = time.perf_counter()
    dl = DataLoader(dataset, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                    persistent_workers=a.persistent)
    firsts = []
    try:
        for _ in range(a.epochs):
            e0 = time.perf_counter()
            for k, _b in enumerate(dl):
                if k == 0:
                    firsts.append(time.perf_counter() - (t0 if not firsts else e0))
                if k + 1 == a.take:
                    break
    finally:
        close = getattr(dl, "close", None)
        if close is not None:
            close()
        del dl
    total = time.perf_counter() - t0
    return {"first_batch_s": firsts[0], "later_first_ms": [f * 1000 for f in firsts[1:]],
            "total_s": total}


def bench(a):
    dataset = Records(a.items)
    sides = {"torch": [], "ferry": []}
    for r in range(a.rounds):
        order = ("torch", "ferry") if r % 2 == 0 else ("ferry", "torch")
        for kind in order:
            m = run(kind, dataset, a)
            sides[kind].append(m)
            print("ferry.bench: round %d/%d %-5s first batch %.3f s, later epochs' first "
                  "batch p50 %.1f ms, run %.2f s" % (
                      r + 1, a.rounds, kind, m["first_batch_s"],
                      float(np.median(m["later_first_ms"])), m["total_s"]),
                  file=sys.stderr, flush=True)
    med = {}
    for kind, runs in sides.items():
        later = [x for m in runs for x in m["later_first_ms"]]
        med[kind] = {"first_batch_s": float(np.median([m["first_batch_s"] for m in runs])),
                     "later_first_p50_ms": float(np.median(later)),
                     "later_first_max_ms": float(np.max(later)),
                     "total_s": float(np.median([m["total_s"] for m in runs]))}
    ratios = {k: med["ferry"][k] / med["torch"][k] for k in med["ferry"] if med["torch"][k] > 0}
    return {"config": {"items": a.items, "workers": a.workers, "batch_size": a.batch_size,
                       "epochs": a.epochs, "take": a.take, "persistent": a.persistent,
                       "rounds": a.rounds},
            "medians": med, "ratios_ferry_over_torch": ratios, "rounds": sides}


def table(res):
    c, m, q = res["config"], res["medians"], res["ratios_ferry_over_torch"]
    lines = [
        "python -m ferry.bench --pipeline early-break: %d dicts, %d workers (%s), batch %d, "
        "%d epochs of %d batches each, %d rounds alternating (medians)" % (
            c["items"], c["workers"], "persistent" if c["persistent"] else "not persistent",
            c["batch_size"], c["epochs"], c["take"], c["rounds"]),
        "",
        "%-38s %10s %10s %12s" % ("", "torch", "ferry", "ferry/torch"),
    ]
    for key, label, scale, fmt in (
            ("first_batch_s", "first batch, first epoch (ms)", 1000, "%10.1f"),
            ("later_first_p50_ms", "first batch, later epochs, p50 (ms)", 1, "%10.1f"),
            ("later_first_max_ms", "first batch, later epochs, max (ms)", 1, "%10.1f"),
            ("total_s", "the whole run (s)", 1, "%10.2f")):
        ratio = ("%11.3fx" % q[key]) if key in q else "%12s" % "-"
        lines.append("%-38s " % label + fmt % (m["torch"][key] * scale) + " " +
                     fmt % (m["ferry"][key] * scale) + " " + ratio)
    lines += ["",
              "A later epoch's first batch: from its `for` to its first batch, the epoch before",
              "left after --take batches (torch's workers start again unless persistent)."]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench --pipeline early-break",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", choices=("early-break",), default="early-break")
    p.add_argument("--items", type=int, default=200000, help="dicts in the dataset (200000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--batch-size", type=int, default=256, help="items per batch (256)")
    p.add_argument("--epochs", type=int, default=6, help="epochs per run (6)")
    p.add_argument("--take", type=int, default=20, help="batches taken of each epoch (20)")
    p.add_argument("--persistent", action="store_true",
                   help="persistent_workers=True for both (default: torch's default, False)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each loader (3)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    for k in ("items", "workers", "batch_size", "epochs", "take", "rounds"):
        if getattr(a, k) < 1:
            p.error("--%s must be >= 1" % k.replace("_", "-"))
    if a.epochs < 2:
        p.error("--epochs must be >= 2 (the later epochs are what it measures)")
    if a.items < (a.take + 1) * a.batch_size:
        p.error("--items must hold more than --take batches (an epoch is left early)")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("ferry.bench: torch is not importable (%s)" % e, file=sys.stderr)
        return 2
    res = bench(a)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0
