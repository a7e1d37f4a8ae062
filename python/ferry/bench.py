"""``python -m ferry.bench``: ferry.Loader against torch's DataLoader, on
the same Python dataset, with one of two pipelines (``--pipeline``):

- ``mnist`` (the default): the class :class:`MnistLike`
  (``ferry.bench:MnistLike``), MNIST-shaped and numpy-backed, 60,000 items
  in batches of 256; ferry's workers build it from its name, torch builds
  it in the trainer.
- ``imagefolder``: a torchvision ``ImageFolder`` of JPEG files (made once:
  ``--classes`` folders, ``--items`` images in all, RGB of varied sizes
  around ``--size`` px, seeded; in a temporary folder removed at exit, or
  under ``--data DIR``, reused when there), with ``RandomResizedCrop(224),
  RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet mean and std)``;
  2,000 items in batches of 64, a 15 ms training step. torch gets
  ``DataLoader(dataset, batch_size, shuffle=True, num_workers,
  persistent_workers=True, prefetch_factor=2)``; ferry gets the same
  call through ``ferry.torch.DataLoader`` (the one-import switch), with
  the same dataset object. Batches are ``x, y``. ferry.torch recognizes
  this transform and runs it in C (the jpeg pipeline's decoder, float
  output normalized in the worker); ``--no-native`` keeps it in ferry's
  Python workers, torchvision's code as it is.
- ``jpeg``: the same folder of JPEGs, decoded and cropped in C by ferry's
  built-in dataset (``ferry.Loader("imagefolder:root=DIR,size=224")``:
  RandomResizedCrop(224) and a horizontal flip, uint8 out) against
  torch's DataLoader over ``ImageFolder`` with ``RandomResizedCrop(224),
  RandomHorizontalFlip(), PILToTensor()``: the same work, to the same
  uint8 tensors. No training step by default: it measures the loaders'
  own rate, and images per second of the workers' CPU time ("per worker
  core", from the first batch to the last, as images/s: worker start-up
  left out for both), whose ratio is the one to read on a machine with
  few cores.

What it measures, per loader (the median over rounds, with min..max):

- batches/s (and, for imagefolder, images/s), from the arrival of the first
  batch to that of the last;
- the trainer's wait in ``next()`` per batch (mean, p50, p99, max) for steady
  batches (every batch but each epoch's first), and, apart, the wait for
  the first batch of each epoch after the first (the epoch boundary; for
  torch it includes ``iter(loader)``, which is where its workers restart);
- startup: constructor to first batch, worker start and imports included
  (for torch, the dataset is built in the trainer, so that counts too);
- mnist: cold start, a fresh interpreter to its first batch, the library's
  own import included (``python train.py`` as a user waits for it);
- peak RSS (VmHWM, reset before each run) of the trainer, and the sum
  over worker processes (with their PSS at the end, which counts pages
  shared between processes once: torch's workers are forked);
- imagefolder: the trainer's RSS growth without shared memory (RssAnon +
  RssFile just before the loader is built to the end of the last epoch,
  the loader still open: RSS counts a shared page in full in every process
  that maps it, and the batch slots stay mapped between batches, so they
  are counted by PSS instead), the summed PSS of every process below the
  trainer at that moment (the loader's workers), and memory in all, their
  sum, and apart, memory in all by PSS only (the
  trainer's PSS growth plus the workers' PSS: each page once); and memory
  while running, the median of one sample an epoch, at its middle batch
  (reading a process's PSS walks its page tables: tens of ms of the
  trainer's CPU that the loader's workers would have had), of the loader's
  processes' PSS and the trainer's RSS growth, both without shared memory,
  plus the machine's shared memory growth (/proc/meminfo Shmem): each page
  once, batches in flight included wherever they are (torch's sit in
  shared-memory files no process's PSS shows until the trainer reads them);
- with ``--step-ms``, the fraction of the step-bound rate (1000/step_ms).

For imagefolder it also prints, against the targets set for ferry, the
ratios ferry/torch of: startup (<= 1.25), memory in all (<= 1.1), trainer
RSS growth (<= 2), images/s (>= 1.15) and the epoch-boundary wait (< 1).

How: one process runs ferry, torch, ferry, torch, ... (``--rounds`` each),
closing each loader and waiting for its workers to exit before the next.
Both get the same workers and batch size, shuffle and persistent workers.
In mnist, ferry's ``prefetch`` is batches in flight in all, torch's
``prefetch_factor`` is per worker, so torch gets ``max(1, prefetch //
workers)``; in imagefolder each keeps its own default (torch 2 per worker,
ferry auto) unless ``--prefetch`` is given. torch (and, for imagefolder,
torchvision) is imported before any timing. The loop reads one element of
each batch and then runs the simulated training step (a busy spin by
default).
"""

import argparse
import gc
import importlib
import importlib.util
import json
import os
import sys
import time

import numpy as np

from .bench_procs import (_MemorySampler, _proc_kb, _reset_peak_rss, _wait_children_gone,
                          _workers_cpu, _workers_memory)
from .bench_report import (JPEG_TARGETS, LOADERS, TARGETS, _aggregate, _pyplot, _ratios,
                           _targets, metrics_of, plot, summarize, table)



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


# ---------------------------------------------------- imagefolder pipeline

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_MARK = ".ferry-bench.json"  # what a folder made by make_imagefolder was made with


def imagefolder(root, uint8=False):
    """The benchmark's dataset: torchvision's ImageFolder over ``root``
    with the usual ImageNet training transform; items ``(float32 tensor
    (3, 224, 224), int label)``; with ``uint8``, the transform stops at
    PILToTensor (uint8 items, what the jpeg pipeline compares)."""
    from torchvision import datasets, transforms
    crop = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    if uint8:
        tf = transforms.Compose(crop + [transforms.PILToTensor()])
    else:
        tf = transforms.Compose(crop + [transforms.ToTensor(),
                                        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    return datasets.ImageFolder(root, transform=tf)


def make_imagefolder(root, items, classes, size, seed):
    """Writes an ImageFolder layout at ``root`` (missing, or an empty folder):
    ``classes`` folders ``class_NNN`` holding ``items`` JPEG files in all
    (quality 90), RGB images from (3/4) size to (5/4) size px a side, smooth
    colour fields with grain, fixed by ``seed``. It is written beside
    ``root`` and renamed into place, so a folder there is always whole."""
    import shutil
    from PIL import Image
    rng = np.random.default_rng(seed)
    lo, hi = max(8, size * 3 // 4), max(8, size * 5 // 4)
    # A few smooth fields (a small random image blown up), cut at random
    # places and shifted in colour, plus grain: cheaper than resizing per
    # image, and JPEG files of a realistic size. 200 + 24 + 31 <= 255.
    bases = [np.asarray(Image.fromarray(rng.integers(0, 201, size=(6, 6, 3), dtype=np.uint8))
                        .resize((2 * hi, 2 * hi), Image.BICUBIC)) for _ in range(8)]
    grain = rng.integers(0, 25, size=(2 * hi, 2 * hi, 3), dtype=np.uint8)
    tmp = "%s.partial-%d" % (root.rstrip(os.sep), os.getpid())
    try:
        for c in range(classes):
            os.makedirs(os.path.join(tmp, "class_%03d" % c))
        for i in range(items):
            w, h = (int(v) for v in rng.integers(lo, hi + 1, size=2))
            bx, by, gx, gy = (int(v) for v in rng.integers(0, hi, size=4))
            img = bases[int(rng.integers(len(bases)))][by:by + h, bx:bx + w]
            img = img + grain[gy:gy + h, gx:gx + w] + rng.integers(0, 32, size=3, dtype=np.uint8)
            Image.fromarray(img).save(
                os.path.join(tmp, "class_%03d" % (i % classes), "img_%06d.jpg" % i), quality=90)
        with open(os.path.join(tmp, _MARK), "w") as f:
            json.dump({"items": items, "classes": classes, "size": size, "seed": seed}, f)
        if os.path.isdir(root):
            os.rmdir(root)  # empty: an existing one with files is reused, not made
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_imagefolder(a):
    """The folder for ``a``: --data DIR (made when missing or empty, reused
    when there) or a new temporary one. (root, temporary or None, what was
    done)."""
    import tempfile
    want = {"items": a.items, "classes": a.classes, "size": a.size, "seed": a.seed}
    if a.data is None:
        tmp = tempfile.mkdtemp(prefix="ferry-bench-")
        root = os.path.join(tmp, "imagefolder")
    else:
        tmp, root = None, os.path.abspath(a.data)
        if os.path.isdir(root) and os.listdir(root):
            try:
                with open(os.path.join(root, _MARK)) as f:
                    made = json.load(f)
            except (OSError, ValueError):
                return root, None, "reused (a folder not made by ferry.bench: used as it is)"
            if made != want:
                raise SystemExit("ferry.bench: %s was made with %s, not %s; remove it or pass "
                                 "those options" % (root, made, want))
            return root, None, "reused"
    t = time.perf_counter()
    try:
        make_imagefolder(root, a.items, a.classes, a.size, a.seed)
    except BaseException:
        if tmp is not None:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root, tmp, "made in %.1f s" % (time.perf_counter() - t)


# --------------------------------------------------------------- loaders

def _torch_prefetch(a):
    if a.prefetch is None:  # imagefolder, no --prefetch: torch's own default
        return 2
    return max(1, a.prefetch // a.workers)


def _bench_module():
    """This module by its importable name, ferry.bench, also when this file
    runs as __main__ (workers import the dataset classes by name)."""
    from ferry import bench
    return bench


def _open_ferry(a):
    """(new epoch iterator, batches per epoch, close, how the dataset got
    there) for ferry."""
    import ferry
    if a.pipeline == "jpeg":
        spec = "imagefolder:root=%s,size=224" % a.root
        ld = ferry.Loader(spec, batch_size=a.batch_size, workers=a.workers, shuffle=True,
                          seed=a.seed, epochs=a.epochs,
                          **({} if a.prefetch is None else {"prefetch": a.prefetch}))
        return ld.__iter__, len(ld), _profiled_close(ld), "the spec '%s' (decoded in C)" % spec
    if a.pipeline == "mnist":
        opts = dict(batch_size=a.batch_size, workers=a.workers, shuffle=True, seed=a.seed,
                    epochs=a.epochs)
        if a.prefetch is not None:
            opts["prefetch"] = a.prefetch
        opts.update(a.ferry_options)
        ld = ferry.Loader(_bench_module().MnistLike, dataset_kwargs={"n": a.items, "seed": a.seed},
                          **opts)
        how = "the class ferry.bench:MnistLike"
    else:  # what a torch user switching one import runs
        from ferry.torch import DataLoader
        native = {"native": False} if a.native_off else {}
        ld = DataLoader(imagefolder(a.root), epochs=a.epochs, **native, **_imagefolder_args(a),
                        **a.ferry_options)
        how = "ferry.torch.DataLoader, the ImageFolder object (%s)" % (
            "its transform in C" if ld._native else "Python workers")
    return ld.__iter__, len(ld), _profiled_close(ld), how


_last_profile = {}  # the last ferry run's Loader.profile(since="open"), for main


STAGES = ("make", "transit", "order", "held", "wait", "step")


def _profiled_close(ld):
    """ld.close, taking the loader's profile first (ferry._profile); its
    attribute ``sample()`` gives the mean of each stage (ms) since the
    previous sample, for --plot's stages over time."""
    def loader():
        inner = getattr(ld, "_loader", ld)  # ferry.torch's, once iterated
        return inner if hasattr(inner, "profile") and not inner.closed else None

    def close():
        if loader() is not None:
            _last_profile["report"] = loader().profile(since="open")
        ld.close()

    def sample():
        inner = loader()
        if inner is None:
            return None
        p = inner.profile(since="last")
        return {s: p["stages"][s]["mean"] * 1000 for s in STAGES
                if s in p["stages"] and p["stages"][s]["count"]}
    close.sample = sample
    return close


def _imagefolder_args(a):
    """The imagefolder pipeline's DataLoader arguments, the same for both."""
    return dict(batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                persistent_workers=True, prefetch_factor=_torch_prefetch(a))


def _open_torch(a):
    """(new epoch iterator, batches per epoch, close, how the dataset got
    there) for torch; close drops the DataLoader and its iterator, whose
    finaliser stops the workers."""
    import torch
    from torch.utils.data import DataLoader
    if a.pipeline == "mnist":
        dl = DataLoader(_bench_module().MnistLike(n=a.items, seed=a.seed),
                        batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        persistent_workers=True, prefetch_factor=_torch_prefetch(a),
                        generator=torch.Generator().manual_seed(a.seed))
        how = "a MnistLike object"
    elif a.pipeline == "jpeg":
        dl = DataLoader(imagefolder(a.root, uint8=True), **_imagefolder_args(a))
        how = "ImageFolder + RandomResizedCrop(224), RandomHorizontalFlip, PILToTensor"
    else:
        dl = DataLoader(imagefolder(a.root), **_imagefolder_args(a))
        how = "the ImageFolder object"
    held = {"dl": dl}
    del dl

    def close():
        held.clear()
        gc.collect()

    return lambda: iter(held["dl"]), len(held["dl"]), close, how


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


def _epochs(new_iter, a, t0, name, cpu_first, memory=None, at=0, stages=None):
    """Runs the epochs: (waits per epoch in s, arrival times of the first
    and the last batch, items seen, items in the first batch, checksum).
    cpu_first["s"] gets the workers' CPU seconds at the first batch (jpeg),
    so that their rate per core, as images/s, counts from there. memory:
    a _MemorySampler sampled after the step of batch `at` of each epoch
    (outside the waits). stages: (sample, every, out): out gets
    [batches so far, sample()] after every `every` batches (--plot)."""
    step = a.step_ms / 1000.0
    waits, items, check, t_first, t_last, first_items = [], 0, 0, None, t0, 0
    for _ in range(a.epochs):
        ew = []
        t = time.perf_counter()
        it = new_iter()
        for k, b in enumerate(it):
            now = time.perf_counter()
            ew.append(now - t)
            t_last = now
            if a.pipeline == "mnist":
                x, y = b["x"], b["y"]
                check += int(x[-1, 14, 14]) + int(y[-1])
            elif a.pipeline == "jpeg":  # ferry: fields image, label; torch: [tensor, tensor]
                x, y = (b["image"], b["label"]) if name == "ferry" else b
                check += int(x[-1, 0, 112, 112] > 0) + int(y[-1])
            else:  # ferry: a tuple batch of numpy arrays; torch: [tensor, tensor]
                x, y = b
                check += int(x[-1, 0, 112, 112] > 0) + int(y[-1])
            items += int(y.shape[0])
            if t_first is None:
                t_first, first_items = now, items
                if a.pipeline != "mnist":
                    cpu_first["s"] = _workers_cpu(template=False)
            _step(step, a.step_mode)
            del b, x, y
            if memory is not None and k == at:
                memory.sample()
            if stages is not None and (len(stages[2]) + 1) * stages[1] <= items // a.batch_size:
                got = stages[0]()
                if got:
                    stages[2].append([items // a.batch_size, got])
            t = time.perf_counter()
        del it
        waits.append(ew)
        # Progress on long runs (a big image folder, many epochs): a line
        # an epoch once the run has taken 5 s; short runs stay quiet.
        took = time.perf_counter() - t0
        if took > 5 and len(waits) < a.epochs:
            print("ferry.bench:   %s: epoch %d/%d done after %.1f s (%.0f items/s)"
                  % (name, len(waits), a.epochs, took, items / took), file=sys.stderr,
                  flush=True)
    return waits, t_first if t_first is not None else t0, t_last, items, first_items, check


def run_once(name, a):
    """One run of loader ``name``: its raw measurements (dict)."""
    cold = None
    if a.pipeline == "mnist":
        cold = cold_start(name, a, {"n": a.items, "seed": a.seed})
    gc.collect()
    reset = _reset_peak_rss()
    pss0 = _proc_kb("/proc/self/smaps_rollup", "Pss")
    rss0 = _MemorySampler._trainer_kb()  # RSS without shared memory (the slots: PSS)
    memory = _MemorySampler(template=name == "ferry") if a.pipeline != "mnist" else None
    t0 = time.perf_counter()
    new_iter, per_epoch, close, how = OPENERS[name](a)
    # --plot: ferry's stages over the run, about 40 windows of batches
    series = []
    stages = (close.sample, max(1, per_epoch * a.epochs // 40), series) \
        if a.plot and hasattr(close, "sample") else None
    try:
        cpu_first = {}
        waits, t_first, t_last, items, first_items, check = _epochs(
            new_iter, a, t0, name, cpu_first, memory, -(-a.items // a.batch_size) // 2, stages)
        rss1 = _MemorySampler._trainer_kb()  # the loader still open
        trainer = _proc_kb("/proc/self/status", "VmHWM")
        pss1 = _proc_kb("/proc/self/smaps_rollup", "Pss")
        # ferry's template and clean parent (the loader's own children)
        # count as its memory, and as its workers' CPU.
        workers_hwm, workers_pss, nworkers = _workers_memory(template=name == "ferry")
        workers_cpu = _workers_cpu(template=False) - cpu_first.get("s", 0)
    finally:
        close()
        del new_iter, close
        gc.collect()
    left = _wait_children_gone()
    if left:
        print("ferry.bench: %s left processes behind: %s" % (name, left), file=sys.stderr)
    return {"waits": waits, "startup": t_first - t0, "cold_start": cold, "t_first": t_first,
            "t_last": t_last, "items": items, "first_items": first_items, "check": check,
            "per_epoch": per_epoch, "dataset": how,
            "trainer_hwm_mib": trainer / 1024 if trainer else None, "hwm_reset": reset,
            "trainer_growth_mib": (rss1 - rss0) / 1024 if rss0 and rss1 else None,
            "trainer_pss_growth_mib": (pss1 - pss0) / 1024 if pss0 and pss1 else None,
            "workers_hwm_mib": workers_hwm, "workers_pss_mib": workers_pss,
            "worker_processes": nworkers, "leftover_pids": left, "workers_cpu_s": workers_cpu,
            "memory_run_mib": memory.median() if memory is not None else None,
            "stages_over_time": series or None}


# ------------------------------------------------------- replacements

class Stamped:
    """``ds``'s items with their index, ``(x, y, index)``; the first item
    each process makes is logged to the file ``log`` as ``pid
    CLOCK_MONOTONIC`` (one clock for every process): when a replacement
    worker made its first item."""

    def __init__(self, ds, log):
        self.ds, self.log, self.pid = ds, log, None

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        if self.pid != os.getpid():
            self.pid = os.getpid()
            with open(self.log, "a") as f:
                f.write("%d %.6f\n" % (self.pid, time.clock_gettime(time.CLOCK_MONOTONIC)))
        x, y = self.ds[i]
        return x, y, i


def _first_items(log):
    """{pid: CLOCK_MONOTONIC of its first item} from a Stamped log."""
    out = {}
    with open(log) as f:
        for line in f:
            pid, t = line.split()
            out.setdefault(int(pid), float(t))
    return out


def _watch_ready(loader, restarts, workers, out):
    """Thread: polls loader.stats() until a restart beyond `restarts` has
    been counted and `workers` are ready again (the replacement took its
    HELLO, CONFIG and READY: it can take a task); out[0] gets that
    CLOCK_MONOTONIC. Late by at most the interpreter's switch interval
    (5 ms) while the trainer's step spins."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            st = loader.stats()
        except ValueError:  # the loader closed (the run failed): nothing to see
            return
        if st["restarts"] > restarts and st["workers"] >= workers:
            out[0] = time.clock_gettime(time.CLOCK_MONOTONIC)
            return
        time.sleep(0.0005)


def kill_workers(a):
    """``--kills N``: ferry's Python workers SIGKILLed N times, one at a
    time, while the trainer takes batches; for each kill, the time to the
    replacement being ready (a fork of the clean parent that has said
    READY: it can take a task) and to its first item, and whether every
    index of every epoch still arrived exactly once. A dict."""
    import signal
    import tempfile
    import threading
    from ferry.torch import DataLoader
    fd, log = tempfile.mkstemp(prefix="ferry-bench-", suffix=".log")
    os.close(fd)
    per_epoch = -(-a.items // a.batch_size)
    epochs = -(-(8 * a.kills + 2) // per_epoch) + 1
    ld = DataLoader(Stamped(imagefolder(a.root), log), epochs=epochs, native=False,
                    **_imagefolder_args(a))
    ready, first, seen, left = [], [], [[] for _ in range(epochs)], a.kills
    pending = None  # the last kill: (when, pids that had made an item, deadline, watcher, out)
    try:
        for e in range(epochs):
            for k, (_x, _y, idx) in enumerate(ld):
                seen[e] += [int(i) for i in idx]
                _step(a.step_ms / 1000.0, a.step_mode)
                # The trainer goes on taking batches meanwhile, as a trainer
                # would. Its first item can wait longer than the replacement
                # took to be ready: the window may hold no task to give it
                # (in order, batches done behind the one the dead worker
                # lost fill it until that one is made again).
                if pending is not None:
                    t0, known, deadline, watcher, out = pending
                    new = [t for p, t in _first_items(log).items() if p not in known]
                    if new:
                        watcher.join()
                        if out[0] is None:
                            raise RuntimeError("a replacement was not seen ready")
                        ready.append((out[0] - t0) * 1000)
                        first.append((min(new) - t0) * 1000)
                        pending, left = None, left - 1
                    elif time.monotonic() > deadline:
                        raise RuntimeError("no replacement made an item 30 s after a kill")
                if pending is None and left and k % 4 == 1:
                    victim = ld._loader.worker_pid(left % a.workers)
                    known = set(_first_items(log))
                    out = [None]
                    watcher = threading.Thread(target=_watch_ready, daemon=True, args=(
                        ld._loader, ld._loader.stats()["restarts"], a.workers, out))
                    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
                    os.kill(victim, signal.SIGKILL)
                    watcher.start()
                    pending = (t0, known, time.monotonic() + 30, watcher, out)
        if left:
            raise RuntimeError("%d kill(s) left when the run ended" % left)
    finally:
        ld.close()
        os.unlink(log)
    once = all(sorted(s) == list(range(a.items)) for s in seen)
    return {"kills": a.kills, "replacement_ready_ms": ready, "replacement_first_item_ms": first,
            "every_index_once": once, "ready_median_ms": float(np.median(ready)),
            "ready_max_ms": float(max(ready)), "median_ms": float(np.median(first)),
            "max_ms": float(max(first))}


def bench(a, on_run=None):
    """Runs the rounds: (result for --json, raw runs of the last round)."""
    names = [a.only] if a.only else list(LOADERS)
    metrics, ratio_keys = metrics_of(a.pipeline)
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
    loaders = {n: dict(rounds=rounds[n], **_aggregate(rounds[n], metrics)) for n in names}
    keys = ["pipeline", "items", "batch_size", "workers", "prefetch", "epochs", "rounds",
            "step_ms", "step_mode", "seed", "only", "ferry_options"]
    if a.pipeline != "mnist":
        keys += ["classes", "size", "data", "native_off"]
    ratios = _ratios(loaders, ratio_keys)
    result = {
        "config": {k: getattr(a, k) for k in keys},
        "torch_prefetch_factor": _torch_prefetch(a),
        "batches_per_epoch": per_epoch[names[0]],
        "step_bound_batches_per_s": 1000.0 / a.step_ms if a.step_ms > 0 else None,
        "dataset_given_as": {n: last[n]["dataset"] for n in names},
        "loaders": loaders,
        "ratios_ferry_over_torch": ratios,
    }
    if a.pipeline != "mnist":
        result["imagefolder"] = {"root": a.root, "folder": a.root_how}
        result["targets"] = _targets(ratios, JPEG_TARGETS if a.pipeline == "jpeg" else TARGETS,
                                     loaders.get("ferry", {}).get("median"))
    return result, last


# ------------------------------------------------------------------- main

DEFAULTS = {  # per pipeline: the options left out
    "mnist": {"workers": 2, "batch_size": 256, "prefetch": 8, "epochs": 3, "items": 60000,
              "step_ms": 0.0, "rounds": 3},
    "imagefolder": {"workers": 2, "batch_size": 64, "prefetch": None, "epochs": 3,
                    "items": 2000, "step_ms": 15.0, "rounds": 3, "classes": 10, "size": 400},
    # jpeg: a core for each worker and one for the trainer (at most 8 workers),
    # so that images per worker core measures the code, not oversubscription
    "jpeg": {"workers": max(1, min(8, (os.cpu_count() or 2) - 1)), "batch_size": 64,
             "prefetch": None, "epochs": 2, "items": 2000, "step_ms": 0.0, "rounds": 3,
             "classes": 10, "size": 400},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m ferry.bench",
        description="ferry.Loader against torch.utils.data.DataLoader on one Python "
                    "dataset, runs alternating: an MNIST-shaped numpy-backed class "
                    "(--pipeline mnist, the default), or a torchvision ImageFolder of JPEG "
                    "files with the usual training transform (--pipeline imagefolder), or "
                    "the same JPEGs decoded and cropped in C by ferry's built-in imagefolder "
                    "dataset against torchvision's uint8 pipeline (--pipeline jpeg). "
                    "Defaults are given as mnist/imagefolder. --pipeline dataset-memory "
                    "measures the memory each adds for datasets that hold their data: its "
                    "own options, see --pipeline dataset-memory --help. --pipeline mix: "
                    "ferry.Mix of three sources against one, and a resume on another shape "
                    "against a fresh loader (see --pipeline mix --help).")
    from ferry import __version__  # loaded already: this module is inside the package
    p.add_argument("--version", action="version",
                   version="python -m ferry.bench %s" % __version__)
    p.add_argument("--pipeline", choices=tuple(DEFAULTS) + ("dataset-memory", "mix", "exports",
                                                            "early-break"),
                   default="mnist",
                   help="the dataset and its loading (mnist)")
    p.add_argument("--workers", type=int,
                   help="worker processes (2; jpeg: the cores but one, at most 8)")
    p.add_argument("--batch-size", type=int, help="items per batch (256/64)")
    p.add_argument("--prefetch", type=int,
                   help="batches in flight in all (8/ferry's default); torch gets "
                        "prefetch_factor = max(1, prefetch // workers) per worker (imagefolder "
                        "without it: 2)")
    p.add_argument("--epochs", type=int, help="epochs per run (3)")
    p.add_argument("--items", type=int, help="dataset items (60000/2000)")
    p.add_argument("--step-ms", type=float,
                   help="simulated training step per batch, ms (0/15; 0: none)")
    p.add_argument("--step-mode", choices=("spin", "sleep"), default="spin",
                   help="the step busy-spins (default) or sleeps")
    p.add_argument("--rounds", type=int, help="runs of each loader (3)")
    p.add_argument("--seed", type=int, default=0, help="dataset and shuffle seed (0)")
    p.add_argument("--classes", type=int,
                   help="imagefolder: class folders (10)")
    p.add_argument("--size", type=int,
                   help="imagefolder: images are 3/4 to 5/4 of this a side, px (400)")
    p.add_argument("--data", metavar="DIR",
                   help="imagefolder: the folder, made there when missing or empty, reused "
                        "when there (default: a temporary one, removed at exit)")
    p.add_argument("--only", choices=LOADERS, help="run one loader only")
    p.add_argument("--model", default="resnet18",
                   help="imagefolder, jpeg: a torchvision model (random weights) the trainer "
                        "builds before the loaders, as a training script does; none: no model "
                        "(resnet18)")
    p.add_argument("--no-native", dest="native_off", action="store_true",
                   help="imagefolder: ferry.torch.DataLoader(native=False), torchvision's "
                        "transform in ferry's Python workers (by default it runs in C, as a "
                        "user's unchanged script gets)")
    p.add_argument("--kills", type=int, default=0, metavar="N",
                   help="imagefolder, after the rounds: SIGKILL one of ferry's Python workers "
                        "N times and report the time from each kill to its replacement's first "
                        "item, and whether every index arrived once (0: none)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot the waits of the last round, and below them ferry's stages "
                        "over the run (mean ms per batch in each, about 40 windows; needs "
                        "matplotlib)")
    p.add_argument("--ferry-option", dest="ferry_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="mnist, imagefolder: a loader option for ferry's loader (an int when it "
                        "reads as one), to compare ferry with itself: --only ferry, alternating "
                        "runs with and without it; repeatable")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    opts = {}
    for kv in a.ferry_options:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            p.error("--ferry-option: KEY=VALUE, not %r" % kv)
        opts[key] = int(value) if value.lstrip("-").isdigit() else value
    a.ferry_options = opts
    if a.ferry_options and a.pipeline not in ("mnist", "imagefolder"):
        p.error("--ferry-option goes with --pipeline mnist or imagefolder")
    if a.pipeline == "mnist" and (a.classes, a.size, a.data) != (None, None, None):
        p.error("--classes, --size and --data go with --pipeline imagefolder or jpeg")
    for name, value in DEFAULTS[a.pipeline].items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    for name in ("workers", "batch_size", "prefetch", "epochs", "items", "rounds", "classes",
                 "size"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.step_ms < 0:
        p.error("--step-ms must be >= 0")
    if a.kills < 0 or (a.kills and a.pipeline != "imagefolder"):
        p.error("--kills N (N >= 0) goes with --pipeline imagefolder")
    return a


def _model(name):
    """torchvision's model ``name`` (random weights), or None for "none"."""
    if name == "none":
        return None
    import torchvision
    return getattr(torchvision.models, name)()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pipeline")
    if pre.parse_known_args(argv)[0].pipeline == "dataset-memory":  # a module of its own
        from . import bench_memory
        return bench_memory.main(argv)
    if pre.parse_known_args(argv)[0].pipeline == "mix":  # so is this one
        from . import bench_mix
        return bench_mix.main(argv)
    if pre.parse_known_args(argv)[0].pipeline == "exports":  # and this
        from . import bench_exports
        return bench_exports.main(argv)
    if pre.parse_known_args(argv)[0].pipeline == "early-break":  # and this
        from . import bench_epochs
        return bench_epochs.main(argv)
    a = parse_args(argv)
    # Now, outside every timing: what the trainer (and torch's forked workers) use.
    need = ["torch"] if a.only != "ferry" else []
    if a.pipeline != "mnist":
        need = ["torch", "torchvision", "torchvision.datasets", "torchvision.transforms", "PIL"]
    for mod in need:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            print("ferry.bench: %s is not importable (%s)%s" % (
                mod, e, "; run with --only ferry" if a.pipeline == "mnist" else ""),
                file=sys.stderr)
            return 2
    # As a training script has it: ferry.torch imported at the top, and a
    # model built before the loader (what the trainer holds, and what
    # forked workers then share with it).
    model = None
    if a.pipeline != "mnist":
        import ferry.torch  # noqa: F401
        model = _model(a.model)
    if a.plot and importlib.util.find_spec("matplotlib") is None:
        _pyplot()  # fails now, saying what to install, not after the runs

    def progress(r, name, m):
        print("ferry.bench: round %d/%d %-5s %8.1f batches/s, startup %.0f ms"
              % (r + 1, a.rounds, name, m["batches_per_s"], m["startup_ms"]), file=sys.stderr)

    tmp = None
    try:
        if a.pipeline != "mnist":
            a.root, tmp, a.root_how = prepare_imagefolder(a)
            a.items = len(imagefolder(a.root))  # a folder of one's own may hold any number
            print("ferry.bench: imagefolder %s (%s), %d images"
                  % (a.root, a.root_how, a.items), file=sys.stderr)
        res, last = bench(a, on_run=progress)
        del model
        if a.kills:
            res["replacements"] = kill_workers(a)
    finally:
        if tmp is not None:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    if a.plot:
        plot(a.plot, res, last)
        print("ferry.bench: wrote %s" % a.plot, file=sys.stderr)
    if "report" in _last_profile:
        res["profile"] = _last_profile["report"]
    print(json.dumps(res, indent=1) if a.json else table(res))
    if "report" in _last_profile and not a.json:
        from ._profile import format_report
        print("\nWhere ferry's time went (its last run):\n" + format_report(_last_profile["report"]))
    rep = res.get("replacements")
    if rep and not a.json:
        print("\nworker SIGKILLed %d times (Python workers): its replacement ready to take a "
              "task %.1f ms after the kill (median; at most %.1f; target <= 50), its first "
              "item after %.1f ms (median; at most %.1f); every index arrived once: %s"
              % (rep["kills"], rep["ready_median_ms"], rep["ready_max_ms"], rep["median_ms"],
                 rep["max_ms"], "yes" if rep["every_index_once"] else "NO"))
    return 0 if not rep or rep["every_index_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
