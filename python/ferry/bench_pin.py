"""python -m ferry.bench_pin: what pin_memory=True costs a trainer on a CUDA
machine.

Three loaders over one dataset of ready float images, run in alternating
rounds in this one invocation:

- ``ferry``: ferry.torch.DataLoader(pin_memory=True). Each batch slot is
  page-locked once; a batch is pinned where its worker wrote it.
- ``ferry-copy``: the same loader with pin_slots=False. Every batch is
  copied into pinned memory in the trainer (torch's way), so this run
  isolates what pinning the slots changes.
- ``torch``: torch's DataLoader(pin_memory=True). Its pin thread, in the
  trainer's process, copies every batch into pinned memory.

Each step copies the batch to the GPU with ``non_blocking=True``, queues
--step-ms of GPU work (torch.cuda._sleep), and waits for the GPU every
--sync steps (as ``loss.item()`` would). The figures are the trainer's:

- batches/s;
- its wait in next(), p50 and p99;
- its process's CPU time per batch, the pin thread and ferry's own thread
  included;
- the first batch of each epoch after the first;
- the ratios ferry/torch and ferry-copy/torch.

The first epoch is left out of the steady figures, since it registers the
slots and starts the workers.
"""

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader as TorchLoader, Dataset

NAMES = ("ferry", "ferry-copy", "torch")


class Ready(Dataset):
    """Item i: a float32 image (C, S, S) whose first element is i, label i.
    Its pixels come from a small block made once per process, so the
    loaders' work is collation and transport rather than making data."""

    def __init__(self, n, size=224, channels=3):
        self.n, self.shape = n, (channels, size, size)
        self._block = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._block is None:
            g = torch.Generator().manual_seed(0)
            self._block = torch.rand((8,) + self.shape, generator=g)
        t = self._block[i % 8].clone()
        t.view(-1)[0] = float(i)
        return t, i

    def __getstate__(self):
        return {"n": self.n, "shape": self.shape, "_block": None}


def _cycles_per_ms():
    """GPU clock cycles in a millisecond, by timing torch.cuda._sleep."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / start.elapsed_time(end)


def _loader(name, a, data):
    kw = dict(batch_size=a.batch_size, shuffle=True, num_workers=a.workers, pin_memory=True,
              persistent_workers=True, prefetch_factor=a.prefetch_factor,
              generator=torch.Generator().manual_seed(0))
    if name == "torch":
        return TorchLoader(data, **kw), lambda: None
    from ferry.torch import DataLoader
    dl = DataLoader(data, pin_slots=name == "ferry", **kw)
    return dl, dl.close


def run_once(name, a, cycles):
    from ferry import bench_pin  # by its importable name, also when run as __main__
    data = bench_pin.Ready(a.items, a.size)
    dl, close = _loader(name, a, data)
    waits, firsts, seen, checksum = [], [], 0, 0
    cpu0 = wall0 = None
    steady = 0
    try:
        for epoch in range(a.epochs):
            t = time.perf_counter()
            for k, (x, y) in enumerate(dl):
                now = time.perf_counter()
                if epoch >= 1:
                    if k == 0:
                        firsts.append(now - t)
                    else:
                        waits.append(now - t)
                    if cpu0 is None:
                        cpu0, wall0 = time.process_time(), now
                    steady += 1
                if not x.is_pinned():
                    raise RuntimeError("%s: a batch is not in pinned memory" % name)
                xg, yg = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                del x, y
                torch.cuda._sleep(int(cycles * a.step_ms))
                if (k + 1) % a.sync == 0:
                    checksum += int(yg.sum())  # a sync, as loss.item() is
                seen += len(yg)
                del xg, yg
                t = time.perf_counter()
        torch.cuda.synchronize()
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
    finally:
        close()
        del dl
    if seen != a.items * a.epochs:
        raise RuntimeError("%s delivered %d items, not %d" % (name, seen, a.items * a.epochs))
    q = statistics.quantiles(waits, n=100)
    return {"batches_per_s": steady / wall, "wait_p50_ms": q[49] * 1e3,
            "wait_p99_ms": q[98] * 1e3, "cpu_ms_per_batch": cpu / steady * 1e3,
            "epoch_first_ms": statistics.mean(firsts) * 1e3}


KEYS = (("batches_per_s", "batches/s"), ("wait_p50_ms", "wait p50, ms"),
        ("wait_p99_ms", "wait p99, ms"), ("cpu_ms_per_batch", "trainer CPU per batch, ms"),
        ("epoch_first_ms", "epoch's first batch, ms"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.bench_pin", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="image side (224)")
    p.add_argument("--items", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=20.0, help="GPU time per step (20)")
    p.add_argument("--sync", type=int, default=1, help="wait for the GPU every N steps (1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs CUDA")
    torch.zeros(1, device="cuda")
    cycles = _cycles_per_ms()
    runs = {n: [] for n in NAMES}
    for r in range(a.rounds):
        for n in NAMES:
            runs[n].append(run_once(n, a, cycles))
            print("round %d %-10s %s" % (r + 1, n, "  ".join(
                "%s %.2f" % (k, v) for k, v in runs[n][-1].items())), file=sys.stderr, flush=True)
    med = {n: {k: statistics.median(m[k] for m in runs[n]) for k, _ in KEYS} for n in NAMES}
    out = {"config": vars(a), "median": med,
           "ratio_over_torch": {n: {k: med[n][k] / med["torch"][k] for k, _ in KEYS}
                                for n in NAMES if n != "torch"},
           "runs": runs}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print("pin_memory=True, %dx%dx%dx%d float32 batches (%.1f MB), %d workers, %.0f ms GPU "
          "step, median of %d rounds" % (a.batch_size, 3, a.size, a.size,
                                         a.batch_size * 3 * a.size * a.size * 4 / 1e6,
                                         a.workers, a.step_ms, a.rounds))
    print("%-28s" % "" + "".join("%14s" % n for n in NAMES) + "%14s%14s" % (
        "ferry/torch", "copy/torch"))
    for k, label in KEYS:
        print("%-28s" % label + "".join("%14.2f" % med[n][k] for n in NAMES) + "%14.2fx%13.2fx" % (
            out["ratio_over_torch"]["ferry"][k], out["ratio_over_torch"]["ferry-copy"][k]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
