"""python -m ferry.bench --pipeline exports: what ferry's exports cost a
trainer, everything on against everything off, rounds alternating in one
invocation (the machine is shared and noisy: only sides that ran side by
side are compared).

- off: ``ferry.Loader(spec, batch_size, workers=2, seed)``, nothing else
  (the stage figures are always kept: their own cost was measured against
  the tree before them with ferry-bench, see docs/profile.md);
- on: the same with ``metrics="127.0.0.1:0"`` (the Prometheus endpoint,
  its server thread in the trainer's process), a scraper in a process of
  its own (as Prometheus is) pulling ``/metrics`` once a second, and
  ``trace=FILE`` (the last 20,000 batches kept, written at close).

Each run takes ``--batches`` batches from a Python loop that reads one
byte of each batch's ``x`` and takes the next (no step: the loader is the
bottleneck, so any cost it adds shows); batches/s from the first batch in
hand to the last. Rounds go off-on, on-off, off-on, ... (ABBA), so that a
drift of the machine falls on both sides alike; the ratio on/off is taken
within each round. The shapes (``--shape``): ``mnist``, 256 x 784 B
(``synthetic:n=60000,dim=784``), and ``imagenet``, 32 x 150,528 B
uint8 from an npy file of 2,048 items (``--data DIR`` holding x.npy and
y.npy; made there when missing).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import ferry

SHAPES = {
    # name: (batch size, batches a run)
    "mnist": (256, 100000),
    "imagenet": (32, 12000),
}

# The scraper: its own interpreter, one GET at once (then it says "ready":
# its start, an interpreter's, is not the cost of being scraped and is kept
# out of the timed loop) and then one a second until its stdin closes;
# prints how many scrapes succeeded and their bytes.
_SCRAPER = r"""
import select, sys, time, urllib.request
url, ok, size = sys.argv[1], 0, 0
first = next_at = time.monotonic()
while True:
    next_at += 1.0
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            size += len(resp.read()); ok += 1
    except OSError:
        pass
    if next_at - first == 1.0:  # the first: the trainer starts its clock now
        print("ready", flush=True)
    r, _, _ = select.select([sys.stdin], [], [], max(0.0, next_at - time.monotonic()))
    if r:
        break
print(ok, size)
"""


def ensure_npy(data):
    """x.npy (2048 x 150528 uint8) and y.npy under data; made when missing."""
    x, y = os.path.join(data, "x.npy"), os.path.join(data, "y.npy")
    if not (os.path.exists(x) and os.path.exists(y)):
        os.makedirs(data, exist_ok=True)
        m = np.lib.format.open_memmap(x, mode="w+", dtype=np.uint8, shape=(2048, 150528))
        m[:] = (np.arange(150528, dtype=np.uint32) % 251).astype(np.uint8)
        m.flush()
        del m
        np.save(y, np.arange(2048, dtype=np.int64))
    return "npy:x=%s,y=%s" % (x, y)


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """{pid: CPU seconds (user + system, all threads; in clock ticks, so a
    run needs some seconds for the figure to mean much)} of root and every
    process under it, from /proc (the loader's workers and helpers are
    the trainer's descendants; the scraper, a child too, is left out by
    the caller)."""
    stats = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields after the name: state ppid ... utime (11) stime (12)
        stats[int(name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / _TICK)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats and pid not in out:
            out[pid] = stats[pid][1]
            todo.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return out


def cpu_between(before, after, leave_out=()):
    """CPU seconds the processes spent between two tree_cpu readings
    (a process born between them counts from zero)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items() if pid not in leave_out)


def run(spec, a, on, tmp):
    """One run; returns batches/s, the CPU seconds the trainer and every
    process under it spent a batch, and with `on` the scrapes made and the
    trace's bytes."""
    kw = {}
    trace = os.path.join(tmp, "trace.json")
    if on:
        kw = dict(metrics="127.0.0.1:0", trace=trace)
    scraper, scrapes, trace_bytes, serving = None, None, None, None
    with ferry.Loader(spec, batch_size=a.batch_size, workers=a.workers, seed=a.seed,
                      **kw) as ld:
        if on:
            scraper = subprocess.Popen(
                [sys.executable, "-c", _SCRAPER, "http://%s/metrics" % ld.metrics_address],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if scraper.stdout.readline().strip() != "ready":
                raise RuntimeError("ferry.bench: the scraper did not start")
        it = ld.stream()
        b = next(it)  # startup is not throughput
        sink = int(b["x"].reshape(-1)[0])
        del b
        cpu0 = tree_cpu(os.getpid())
        server = ld._exports._server if on else None
        served0 = (server.scrapes, server.cpu_seconds) if server else None
        t0 = time.perf_counter()
        for _ in range(a.batches - 1):
            b = next(it)
            sink += int(b["x"].reshape(-1)[0])
            del b
        dt = time.perf_counter() - t0
        cpu = cpu_between(cpu0, tree_cpu(os.getpid()),
                          leave_out=(scraper.pid,) if scraper else ())
        if scraper:
            out, _ = scraper.communicate(input="", timeout=30)
            scrapes = int(out.split()[0])
            # what the endpoint rendered while the batches were timed
            spent = server.cpu_seconds - served0[1]
            serving = {"scrapes": server.scrapes - served0[0], "cpu_seconds": spent,
                       "share": spent / dt}
    if on:
        trace_bytes = os.path.getsize(trace)
        os.unlink(trace)
    return {"batches_per_s": (a.batches - 1) / dt, "seconds": dt,
            "cpu_us_per_batch": cpu / (a.batches - 1) * 1e6, "scrapes": scrapes,
            "serving": serving,
            "trace_bytes": trace_bytes, "sink": sink}


def exchange_cost(a, scrapes=200, repeats=3):
    """The whole cost of a scrape to one process: a loader with the
    endpoint, scraped from the same process (client and server, HTTP and
    the request's thread: more than the server's part alone), CPU ms an
    exchange, each of `repeats` runs of `scrapes` (after 2,000 batches,
    so that the figures have workers and stages to render)."""
    import resource
    import urllib.request
    out = []
    with ferry.Loader(a.dataset, batch_size=a.batch_size, workers=a.workers, seed=a.seed,
                      metrics="127.0.0.1:0") as ld:
        it = ld.stream()
        for _ in range(2000):
            next(it)
        url = "http://%s/metrics" % ld.metrics_address
        for _ in range(repeats):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(scrapes):
                with urllib.request.urlopen(url, timeout=10) as resp:
                    resp.read()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            out.append(cpu / scrapes * 1e3)
    return out


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench(a, on_run=None):
    spec = a.dataset
    rounds = []
    with tempfile.TemporaryDirectory(prefix="ferry-bench-exports-") as tmp:
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {}
            for on in order:
                got[on] = run(spec, a, on, tmp)
                if on_run:
                    on_run(r, "on" if on else "off", got[on])
            rounds.append({"off": got[False], "on": got[True],
                           "ratio": got[True]["batches_per_s"] / got[False]["batches_per_s"],
                           # (None when the off run spent under a clock tick)
                           "cpu_ratio": (got[True]["cpu_us_per_batch"]
                                         / got[False]["cpu_us_per_batch"]
                                         if got[False]["cpu_us_per_batch"] else None)})
    return {
        "shape": a.shape, "dataset": spec, "batch_size": a.batch_size, "workers": a.workers,
        "batches": a.batches, "rounds": rounds,
        "off": summary([r["off"]["batches_per_s"] for r in rounds]),
        "on": summary([r["on"]["batches_per_s"] for r in rounds]),
        "ratio": summary([r["ratio"] for r in rounds]),
        "cpu_off": summary([r["off"]["cpu_us_per_batch"] for r in rounds]),
        "cpu_on": summary([r["on"]["cpu_us_per_batch"] for r in rounds]),
        "cpu_ratio": summary([r["cpu_ratio"] for r in rounds if r["cpu_ratio"] is not None]
                             or [float("nan")]),
        "scrapes_per_s": summary([r["on"]["scrapes"] / r["on"]["seconds"] for r in rounds]),
        "serving_ms": summary([r["on"]["serving"]["cpu_seconds"] * 1e3
                               / max(1, r["on"]["serving"]["scrapes"]) for r in rounds]),
        "serving_share": summary([r["on"]["serving"]["share"] for r in rounds]),
    }


def table(res):
    lines = ["%s (%s, batch %d, %d workers, %d batches a run, %d rounds ABBA)" % (
        res["shape"], res["dataset"], res["batch_size"], res["workers"], res["batches"],
        len(res["rounds"]))]
    for side in ("off", "on"):
        s = res[side]
        lines.append("  %-4s %10.0f batches/s  (median; %.0f..%.0f)" % (
            side, s["median"], s["min"], s["max"]))
    r = res["ratio"]
    lines.append("  on/off %8.3f  (median of the rounds' ratios; %.3f..%.3f)" % (
        r["median"], r["min"], r["max"]))
    lines.append("  rounds' ratios: " + ", ".join("%.3f" % x["ratio"] for x in res["rounds"]))
    for side in ("off", "on"):
        s = res["cpu_" + side]
        lines.append("  %-4s %10.2f us of CPU a batch, all processes  (median; %.2f..%.2f)" % (
            side, s["median"], s["min"], s["max"]))
    r = res["cpu_ratio"]
    lines.append("  CPU on/off %4.3f  (median of the rounds' ratios; %.3f..%.3f)" % (
        r["median"], r["min"], r["max"]))
    lines.append("  scraped %.2f times a second (median), trace %d bytes at close (last run)" % (
        res["scrapes_per_s"]["median"], res["rounds"][-1]["on"]["trace_bytes"]))
    lines.append("  serving a scrape: %.2f ms of the trainer's CPU (median; %.2f..%.2f), %.3f%% "
                 "of the run's time (median; the GIL held about as long)" % (
                     res["serving_ms"]["median"], res["serving_ms"]["min"],
                     res["serving_ms"]["max"], 100 * res["serving_share"]["median"]))
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m ferry.bench --pipeline exports",
        description="ferry's exports (the Prometheus endpoint scraped each second, the "
                    "trace) on against off, rounds alternating.")
    p.add_argument("--pipeline", default="exports", choices=("exports",))
    p.add_argument("--shape", choices=tuple(SHAPES), default="mnist")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, help="items per batch (mnist 256, imagenet 32)")
    p.add_argument("--batches", type=int, help="batches a run (mnist 100000, imagenet 12000)")
    p.add_argument("--rounds", type=int, default=6, help="rounds (6)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", metavar="DIR", default="/tmp/ferry-ab/data",
                   help="imagenet: the folder of x.npy and y.npy (made when missing)")
    p.add_argument("--exchange-cost", action="store_true",
                   help="instead: CPU ms a whole scrape costs one process (client and "
                        "server in it), 3 runs of 200")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    size, batches = SHAPES[a.shape]
    a.batch_size = a.batch_size or size
    a.batches = a.batches or batches
    if a.batches < 2 or a.rounds < 1:
        p.error("--batches must be at least 2 and --rounds at least 1")
    a.dataset = ("synthetic:n=60000,dim=784" if a.shape == "mnist" else ensure_npy(a.data))
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)

    def progress(r, side, m):
        print("ferry.bench: round %d/%d %-3s %9.0f batches/s, %.2f us CPU a batch%s" % (
            r + 1, a.rounds, side, m["batches_per_s"], m["cpu_us_per_batch"],
            "" if m["scrapes"] is None else ", %d scrapes" % m["scrapes"]), file=sys.stderr)

    if a.exchange_cost:
        ms = exchange_cost(a)
        print("a scrape, client and server in one process: %s ms of CPU (3 runs of 200)"
              % ", ".join("%.2f" % m for m in ms))
        return 0
    res = bench(a, on_run=progress)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0
