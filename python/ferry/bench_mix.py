"""python -m ferry.bench --pipeline mix: what mixing sources and resuming
on another shape cost a trainer, each side by side with its baseline in
one invocation, rounds alternating (the machine is shared and noisy).

- throughput: ferry.Loader over an MNIST-shaped dataset (one source)
  against the same items as ferry.Mix of three sources (weights 0.5, 0.3,
  0.2), both shuffled, process workers, a simulated step per batch: items/s
  and the trainer's wait per batch (p50, p99).
- first batch: a fresh loader (rank 0 of 6) against one resumed (rank 0
  of 6) from a state saved by a job of 8 ranks mid-epoch: seconds from
  ferry.Loader(...) to the first batch in hand.
"""

import argparse
import json
import sys
import time

import numpy as np

import ferry

from .bench import MnistLike


def _spin(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def run_throughput(dataset, a):
    waits, items = [], 0
    with ferry.Loader(dataset, batch_size=a.batch_size, workers=a.workers, seed=a.seed,
                      shuffle=True) as ld:
        it = ld.stream()
        next(it)  # startup is not throughput
        t0 = time.perf_counter()
        for _ in range(a.batches):
            w = time.perf_counter()
            b = next(it)
            waits.append(time.perf_counter() - w)
            items += len(b.indices)
            if a.step_ms:
                _spin(a.step_ms)
        dt = time.perf_counter() - t0
    w = np.array(waits) * 1000
    return {"items_per_s": items / dt, "wait_p50_ms": float(np.percentile(w, 50)),
            "wait_p99_ms": float(np.percentile(w, 99))}


def saved_state(dataset, a):
    """Rank 0 of an 8-rank job, a third into its epoch."""
    with ferry.Loader(dataset, batch_size=a.batch_size, workers=1, worker_mode="thread",
                      seed=a.seed, shuffle=True, rank=0, world_size=8) as ld:
        for _, _b in zip(range(max(1, len(ld) // 3)), ld):
            pass
        return ld.state_dict()


def run_first_batch(dataset, a, state):
    t0 = time.perf_counter()
    with ferry.Loader(dataset, batch_size=a.batch_size, workers=a.workers, seed=a.seed,
                      shuffle=True, rank=0, world_size=6, state=state) as ld:
        b = ld.next()
        dt = time.perf_counter() - t0
        assert len(b.indices)
    return {"first_batch_s": dt}


def bench(a):
    data = MnistLike(a.items, seed=a.seed)
    n = len(data)
    # Three datasets of the same kind and, together, as many items.
    sizes = [n // 2, n * 3 // 10, n - n // 2 - n * 3 // 10]
    mix = ferry.Mix([MnistLike(m, seed=a.seed + 1 + k) for k, m in enumerate(sizes)],
                    [0.5, 0.3, 0.2])
    state = saved_state(data, a)
    sides = {"one": [], "mix": [], "fresh": [], "resumed": []}
    for r in range(a.rounds):
        for name, fn in (("one", lambda: run_throughput(data, a)),
                         ("mix", lambda: run_throughput(mix, a)),
                         ("fresh", lambda: run_first_batch(data, a, None)),
                         ("resumed", lambda: run_first_batch(data, a, state))):
            m = fn()
            sides[name].append(m)
            print("ferry.bench: round %d/%d %-8s %s" % (
                r + 1, a.rounds, name, ", ".join("%s %.4g" % kv for kv in m.items())),
                file=sys.stderr, flush=True)
    med = {name: {k: float(np.median([m[k] for m in runs])) for k in runs[0]}
           for name, runs in sides.items()}
    per_round = lambda a_, b_, k: [x[k] / y[k] for x, y in zip(sides[a_], sides[b_])]  # noqa
    return {
        "config": {"items": a.items, "workers": a.workers, "batch_size": a.batch_size,
                   "batches": a.batches, "step_ms": a.step_ms, "rounds": a.rounds},
        "medians": med,
        "mix_vs_one_items_per_s": float(np.median(per_round("mix", "one", "items_per_s"))),
        "resumed_vs_fresh_first_batch": float(np.median(
            per_round("resumed", "fresh", "first_batch_s"))),
        "rounds": sides,
    }


def table(res):
    m = res["medians"]
    c = res["config"]
    lines = [
        "python -m ferry.bench --pipeline mix: %d items, %d process workers, batch %d, "
        "%d batches, step %.3g ms, %d rounds alternating (medians)" % (
            c["items"], c["workers"], c["batch_size"], c["batches"], c["step_ms"], c["rounds"]),
        "",
        "%-34s %12s %12s %10s" % ("", "one source", "mix of 3", "mix/one"),
        "%-34s %12.0f %12.0f %9.3fx" % ("items/s", m["one"]["items_per_s"],
                                         m["mix"]["items_per_s"],
                                         res["mix_vs_one_items_per_s"]),
        "%-34s %12.3f %12.3f" % ("wait p50 (ms)", m["one"]["wait_p50_ms"],
                                 m["mix"]["wait_p50_ms"]),
        "%-34s %12.3f %12.3f" % ("wait p99 (ms)", m["one"]["wait_p99_ms"],
                                 m["mix"]["wait_p99_ms"]),
        "",
        "%-34s %12s %12s %10s" % ("", "fresh", "resumed", "res/fresh"),
        "%-34s %12.3f %12.3f %9.3fx" % ("first batch, rank 0 of 6 (s)",
                                         m["fresh"]["first_batch_s"],
                                         m["resumed"]["first_batch_s"],
                                         res["resumed_vs_fresh_first_batch"]),
        "",
        "mix/one is the median of each round's ratio (> 1: the mix is faster); resumed: from a",
        "state saved by rank 0 of an 8-rank job a third into its epoch (res/fresh < 1: sooner).",
    ]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench --pipeline mix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", choices=("mix",), default="mix")
    p.add_argument("--items", type=int, default=60000, help="dataset items (60000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--batch-size", type=int, default=256, help="items per batch (256)")
    p.add_argument("--batches", type=int, default=300, help="batches per throughput run (300)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step per batch, ms, busy-spinning (0: none)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each side (5)")
    p.add_argument("--seed", type=int, default=0, help="dataset and shuffle seed (0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    for k in ("items", "workers", "batch_size", "batches", "rounds"):
        if getattr(a, k) < 1:
            p.error("--%s must be >= 1" % k.replace("_", "-"))
    if a.items < 8 * a.batch_size:
        p.error("--items must be at least 8 x --batch-size (an 8-rank job's state)")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    res = bench(a)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0
