"""``python -m ferry.bench --pipeline dataset-memory``: the memory a loader
adds to a trainer whose dataset object holds its data, and how long its
first batch takes, ferry.torch.DataLoader against torch's DataLoader.

The datasets (each item is small, so that memory is what is measured):

- ``array``: a float32 numpy array of ``--array-mb`` MB, rows of 4 KiB
  (a page each); item i: the first 8 floats of row i as a tensor, and i.
- ``tensor``: the same as a torch CPU tensor.
- ``memmap``: ``np.load(path, mmap_mode="r")`` of a .npy file of
  ``--mmap-mb`` MB written in a temporary folder, sparse (only the pages
  an epoch touches become memory), rows of 4 KiB; item i as for array.
  The file's pages are dropped from the page cache before each run. A
  fault on a file mapping reads ahead around it and maps the cached
  neighbours too, so a worker maps far more than the rows it reads:
  with either loader.
- ``records``: a list of ``--records`` dicts ``{"path":
  "/data/img/%08d.jpg", "label": int}``; item i: the label and the
  length of the path.
- ``vocab``: a dict of ``--vocab`` words to ints; item i looks word i up:
  its id and its length.

How: each run is one trainer, a fresh ``python -m ferry.bench_memory``
process, which builds its dataset, says so on its stdout and waits. This
process (the coordinator) reads the trainer's PSS then (the baseline),
tells it to go, and samples in a background thread, every ~50 ms, the
memory of the trainer's tree: the PSS (/proc/PID/smaps_rollup) of the
trainer and of every process below it, found by walking /proc (the
workers, and ferry's template and clean parent, forks of the trainer:
ferry's memory too). PSS splits each
shared page between the processes that map it, so the sum counts it
once; but it shows of a shared-memory file (memfd, /dev/shm, a shared
anonymous mapping) only the pages some process has touched through a
mapping, so those files count apart instead, whole (their allocated
bytes) and once, wherever they are held open or mapped in the tree. The
baseline is the trainer's memory by the same sum. The trainer builds
``DataLoader(dataset, batch_size, shuffle=True, num_workers,
persistent_workers=True, generator)`` (torch's, or ferry.torch's with the
same arguments) and runs one epoch of at most ``--batches`` batches.
Sampling from outside the trainer keeps the sampler's memory and CPU out
of the trainer's figures; both loaders are measured the same way. ferry
is imported in torch's trainers too (this module is in its package); it
starts no process until a loader of its own is built.

Per (dataset, workers, loader), medians over ``--rounds`` rounds (the two
loaders alternate within each round):

- memory added, peak: the largest sample, from the constructor call to
  the end of the epoch, less the baseline; at end: a reading after the
  last batch, the loader still open; growth: the reading at the end less
  the first sample after the first batch with every process of the end
  there (what the epoch added: ferry's loader opens on its first ready
  worker, and forks the others while it makes the first batches);
- first batch: the constructor call to the first batch in hand, in the
  trainer; epoch: the constructor call to the last batch in hand.

``--trainers N``: N trainers at once over the array dataset (or
``--trainers-over DATASET``), each with its own loader, sampled together;
their memory added in all against what one trainer adds (that dataset's
row at the same workers).
"""

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROW = 1024  # float32 per row: 4 KiB, so an item touches one page
ITEM = 8  # floats of a row an item returns
MIB = 1024 * 1024
LOADERS = ("torch", "ferry")
DATASETS = ("array", "tensor", "memmap", "records", "vocab")
KIND = {"array": "array", "tensor": "array", "memmap": "memmap", "records": "collection",
        "vocab": "collection"}


# ------------------------------------------------------------- datasets

class ArrayRows:
    """Rows of a float32 array (rows, ROW), every page written (a zeroed
    array would be the shared zero page, no memory); row i starts with i.
    Item i: (its first ITEM floats as a tensor, i)."""

    def __init__(self, mb):
        rows = max(1, int(mb * 1e6) // (ROW * 4))
        self.data = np.empty((rows, ROW), np.float32)
        self.data[:] = 1.0
        self.data[:, 0] = np.arange(rows)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        import torch
        return torch.from_numpy(np.array(self.data[i, :ITEM])), i


class TensorRows(ArrayRows):
    """ArrayRows held as a torch CPU tensor."""

    def __init__(self, mb):
        import torch
        super().__init__(mb)
        self.data = torch.from_numpy(self.data)

    def __getitem__(self, i):
        return self.data[i, :ITEM].clone(), i


class MemmapRows(ArrayRows):
    """ArrayRows of a .npy file, mapped read-only (np.load(mmap_mode="r"))."""

    def __init__(self, path):
        self.data = np.load(path, mmap_mode="r")


class Records:
    """n small dicts, as a file list with labels. Item i: (label, length of
    its path)."""

    def __init__(self, n):
        self.items = [{"path": "/data/img/%08d.jpg" % i, "label": i % 1000} for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        rec = self.items[i]
        return rec["label"], len(rec["path"])


class Vocab:
    """A dict of n words to their ids (ints past the small-int cache, so
    each is an object of its own). Item i: (id of word i, its length)."""

    def __init__(self, n):
        self.ids = {"word%07d" % i: 1000 + i for i in range(n)}
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        word = "word%07d" % i
        return self.ids[word], len(word)


def make_memmap(folder, mb):
    """A sparse .npy file of float32 rows (rows, ROW), about mb MB, in
    folder; its path. Nothing but its header is written."""
    path = os.path.join(folder, "rows.npy")
    rows = max(1, int(mb * 1e6) // (ROW * 4))
    m = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, ROW))
    del m
    return path


def evict(path):
    """Drops the file's pages from the page cache (none maps it now), so
    that every memmap run starts cold: else the first run would read
    what every later one finds cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def build(dataset, cfg):
    """The dataset object ``dataset`` with the sizes in cfg."""
    if dataset == "array":
        return ArrayRows(cfg["array_mb"])
    if dataset == "tensor":
        return TensorRows(cfg["array_mb"])
    if dataset == "memmap":
        return MemmapRows(cfg["mmap_path"])
    if dataset == "records":
        return Records(cfg["records"])
    return Vocab(cfg["vocab"])


def data_bytes(dataset, cfg):
    """The bytes of the array a dataset holds (0 for the others)."""
    if KIND[dataset] != "array":
        return 0
    return max(1, int(cfg["array_mb"] * 1e6) // (ROW * 4)) * ROW * 4


# -------------------------------------------------------------- trainer

def trainer(cfg):
    """One trainer (its own process): builds the dataset, reports ready on
    fd ``out`` and waits for a line on stdin; then builds the loader, runs
    one epoch of at most cfg["batches"] batches, reports the first batch
    ("first") and the times ("done"), and waits for a line on stdin before
    it closes the loader and returns."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the protocol

    def say(**kw):
        out.write(json.dumps(kw) + "\n")
        out.flush()

    import gc
    import warnings
    import torch
    # Both loaders warn that more workers than CPUs is slow: it is asked for.
    warnings.filterwarnings("ignore", message=".*worker", category=UserWarning)
    import ferry.torch  # noqa: F401 - at the top, as a training script has it
    data = build(cfg["dataset"], cfg)
    gc.collect()
    say(ready=True, items=len(data))
    sys.stdin.readline()
    make = ferry.torch.DataLoader if cfg["loader"] == "ferry" else torch.utils.data.DataLoader
    t0 = time.perf_counter()
    dl = make(data, batch_size=cfg["batch_size"], shuffle=True, num_workers=cfg["workers"],
              persistent_workers=True, generator=torch.Generator().manual_seed(cfg["seed"]))
    batches = items = 0
    first = None
    for batch in dl:
        if first is None:
            first = time.perf_counter() - t0
            say(first=first)
        batches += 1
        items += len(batch[1])
        if batches == cfg["batches"]:
            break
    epoch = time.perf_counter() - t0
    say(done=True, first_s=first, epoch_s=epoch, batches=batches, items=items)
    sys.stdin.readline()
    if cfg["loader"] == "ferry":
        dl.close()
    elif dl._iterator is not None:
        dl._iterator._shutdown_workers()
    del dl
    gc.collect()


# ------------------------------------------------------------ processes

def _parents():
    """{pid: parent pid} of every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def tree(roots):
    """The roots and every live process below them."""
    kids = {}
    for pid, pp in _parents().items():
        kids.setdefault(pp, []).append(pid)
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _rollup_kb(pid):
    """(Pss, Pss_Shmem) of pid in kB, or (None, None) once it is gone."""
    found = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("Pss", "Pss_Shmem"):
                    found[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None, None
    return found.get("Pss"), found.get("Pss_Shmem", 0)


# The names shared memory goes by in /proc/PID/fd and /proc/PID/maps:
# memfds, POSIX shm, shared anonymous mappings, System V segments.
_SHM_NAMES = ("/memfd:", "/dev/shm/", "/dev/zero", "/SYSV")


def _shm_files(pid, found):
    """Adds to found, {(device, inode): kB allocated}, every shared-memory
    file pid holds open or maps."""
    def add(path):
        try:
            st = os.stat(path)
        except OSError:
            return  # closed or unmapped meanwhile
        found[(st.st_dev, st.st_ino)] = st.st_blocks * 512 // 1024

    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return
    for fd in fds:
        path = "/proc/%d/fd/%s" % (pid, fd)
        try:
            if os.readlink(path).startswith(_SHM_NAMES):
                add(path)
        except OSError:
            continue
    try:
        with open("/proc/%d/maps" % pid) as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(_SHM_NAMES):
                    add("/proc/%d/map_files/%s" % (pid, fields[0]))
    except OSError:
        pass


def memory_kb(roots, below=True):
    """(kB of the processes roots, with every process below them unless
    not below; the pids counted): their PSS without shared memory, plus
    each shared-memory file one of them holds open or maps, whole and
    once. PSS would count only the pages of such a file some process
    has touched through a mapping (a memfd written by write() and
    mapped lazily shows nothing until read), and none of one only held
    open; what it has allocated is in memory, once."""
    pids = tree(roots) if below else list(roots)
    kb, shm = 0, {}
    for pid in pids:
        pss, pss_shm = _rollup_kb(pid)
        if pss is None:
            continue  # gone meanwhile
        kb += pss - pss_shm
        _shm_files(pid, shm)
    return kb + sum(shm.values()), pids


class Sampler(threading.Thread):
    """Samples memory_kb(roots) until stopped, every ``every`` seconds or
    twice the time the last sample took, whichever is longer (reading PSS
    walks page tables: on 2 cores the sampler must not take one)."""

    def __init__(self, roots, every=0.05):
        super().__init__(daemon=True)
        self.roots, self.every = roots, every
        self.samples = []  # (time, kB, processes)
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            t = time.monotonic()
            kb, pids = memory_kb(self.roots)
            self.samples.append((t, kb, len(pids)))
            self.stopping.wait(max(self.every, 2 * (time.monotonic() - t)))

    def stop(self):
        self.stopping.set()
        self.join()

    def after(self, t, processes):
        """The first sample taken at or after monotonic time t with this
        many processes (or more) in the tree, kB."""
        later = [kb for ts, kb, n in self.samples if ts >= t and n >= processes]
        return later[0] if later else None


class Trainer:
    """A trainer process and its line protocol (JSON lines on its stdout,
    a line on its stdin to go on), every read bounded by a deadline."""

    def __init__(self, cfg, deadline):
        env = dict(os.environ)
        self.deadline = deadline
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ferry.bench_memory", "--trainer", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.buf = b""

    def read(self):
        """The trainer's next message (a dict)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("a trainer (pid %d) ran past --run-timeout" % self.proc.pid)
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError("a trainer (pid %d) exited early, status %s"
                                       % (self.proc.pid, self.proc.wait()))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def tell(self):
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill(self):
        """Kills the trainer's tree (after a failure)."""
        for pid in reversed(tree([self.proc.pid])):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        self.proc.wait()


def _gone(pids, seconds=15.0):
    """Waits until none of pids is a live process; those left."""
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for pid in pids:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        left.append(pid)
            except (OSError, IndexError):
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def run_group(cfgs, timeout, sample=True):
    """Runs trainers with the configurations cfgs at once, sampled
    together (unless not ``sample``: no sampler runs beside them, for the
    times; the memory figures are then the end's only); one dict of
    figures for the group (memory in MiB, times in seconds, each
    trainer's times median over the group)."""
    deadline = time.monotonic() + timeout
    trainers = []
    try:
        for cfg in cfgs:
            trainers.append(Trainer(cfg, deadline))
        ready = [t.read() for t in trainers]
        roots = [t.proc.pid for t in trainers]
        base, _ = memory_kb(roots, below=False)
        at_start, pids_start = memory_kb(roots)
        sampler = Sampler(roots)
        if sample:
            sampler.start()
        for t in trainers:
            t.tell()
        firsts = []
        for t in trainers:
            msg = t.read()
            firsts.append(time.monotonic())
            if "first" not in msg:
                raise RuntimeError("a trainer said %r before its first batch" % (msg,))
        done = [t.read() for t in trainers]
        if sample:
            sampler.stop()
        end, pids = memory_kb(roots)
        # (ferry's loader opens on its first ready worker: those forked
        # after the first batch are the loader's start, not the epoch's growth)
        at_first = sampler.after(max(firsts), len(pids))
        for t in trainers:
            t.tell()
        for t in trainers:
            t.proc.wait(max(1.0, deadline - time.monotonic()))
            if t.proc.returncode != 0:
                raise RuntimeError("a trainer exited with status %d" % t.proc.returncode)
    except BaseException:
        for t in trainers:
            t.kill()
        raise
    left = _gone([p for p in pids if p not in roots])
    peak = max([kb for _, kb, _ in sampler.samples] + [end])
    if at_first is None:
        at_first = end
    for r, d in zip(ready, done):
        want = min(cfgs[0]["batches"], -(-r["items"] // cfgs[0]["batch_size"]))
        if d["batches"] != want:
            raise RuntimeError("a trainer got %d batches, not %d" % (d["batches"], want))
    return {
        "added_peak_mib": (peak - base) / 1024,
        "added_end_mib": (end - base) / 1024,
        "growth_mib": (end - at_first) / 1024,
        "first_batch_s": statistics.median(d["first_s"] for d in done),
        "epoch_s": statistics.median(d["epoch_s"] for d in done),
        "baseline_mib": base / 1024,
        "children_at_baseline_mib": (at_start - base) / 1024,
        "processes_at_baseline": len(pids_start),
        "processes_at_end": len(pids),
        "samples": len(sampler.samples),
        "batches": sum(d["batches"] for d in done),
        "leftover_pids": left,
    }


# ------------------------------------------------------------- the bench

# key, label, unit: the figures of a row, in the table and the medians
FIGURES = (("added_peak_mib", "peak", "MiB"), ("added_end_mib", "end", "MiB"),
           ("growth_mib", "growth", "MiB"), ("first_batch_s", "1st batch", "s"),
           ("epoch_s", "epoch", "s"))


def _medians(runs):
    return {k: statistics.median(r[k] for r in runs) for k, _, _ in FIGURES}


def targets(dataset, workers, ferry, torch, array_bytes):
    """The targets set for ferry on one row: {name: (bound, met)}, the
    bound as text."""
    out = {}
    kind = KIND[dataset]
    mem, first = ferry["added_peak_mib"], ferry["first_batch_s"]
    if kind == "array":
        bound = 1.1 * (torch["added_peak_mib"] + array_bytes / MIB)
        out["memory"] = ("<= %.0f MiB" % bound, mem <= bound)
        bound = 1.5 * torch["first_batch_s"] + 0.3 * array_bytes / 1e9
        out["first"] = ("<= %.2f s" % bound, first <= bound)
    elif kind == "memmap":
        bound = 1.1 * torch["added_peak_mib"]
        out["memory"] = ("<= %.0f MiB" % bound, mem <= bound)
        bound = 1.5 * torch["first_batch_s"]
        out["first"] = ("<= %.2f s" % bound, first <= bound)
    else:
        if workers == 4:
            bound = 0.5 * torch["added_peak_mib"]
            out["memory"] = ("<= %.0f MiB" % bound, mem <= bound)
        bound = 1.5 * torch["first_batch_s"]
        out["first"] = ("<= %.2f s" % bound, first <= bound)
        # "not growing through the epoch": within a tenth of what it added
        # by the first batch, or 16 MiB (a few arenas either way)
        bound = max(16.0, 0.1 * (ferry["added_end_mib"] - ferry["growth_mib"]))
        out["growth"] = ("<= %.0f MiB" % bound, ferry["growth_mib"] <= bound)
    return {k: {"target": b, "met": bool(m)} for k, (b, m) in out.items()}


def bench(a, cfg, progress):
    """The rounds of every row, then the trainers' variant: the result."""
    rows = []
    for dataset in a.datasets:
        for workers in a.workers:
            runs = {n: [] for n in LOADERS}
            for r in range(a.rounds):
                order = LOADERS if r % 2 == 0 else LOADERS[::-1]
                got = {}
                # the memory, sampled; then the times, in runs of their own
                # in the other order (ABBA): reading every process's PSS
                # each 50 ms walks its page tables under its memory map's
                # lock, which a fork waits for, and takes CPU of its own
                # (it slowed ferry's start, four processes, more than
                # torch's two)
                for name in order + order[::-1]:
                    c = dict(cfg, dataset=dataset, workers=workers, loader=name)
                    if dataset == "memmap":
                        evict(cfg["mmap_path"])
                    timed = name in got
                    m = run_group([c], a.run_timeout, sample=not timed)
                    if not timed:
                        got[name] = m
                        continue
                    got[name].update(sampled_first_batch_s=got[name]["first_batch_s"],
                                     sampled_epoch_s=got[name]["epoch_s"],
                                     first_batch_s=m["first_batch_s"], epoch_s=m["epoch_s"],
                                     leftover_pids=got[name]["leftover_pids"]
                                     + m["leftover_pids"])
                    runs[name].append(got[name])
                    progress(r, dataset, workers, name, got[name])
            med = {n: _medians(runs[n]) for n in LOADERS}
            rows.append({
                "dataset": dataset, "workers": workers,
                "loaders": {n: {"median": med[n], "rounds": runs[n]} for n in LOADERS},
                "ratios_ferry_over_torch": {k: med["ferry"][k] / med["torch"][k]
                                            for k in ("added_peak_mib", "added_end_mib",
                                                      "first_batch_s", "epoch_s")
                                            if med["torch"][k] > 0},
                "targets": targets(dataset, workers, med["ferry"], med["torch"],
                                   data_bytes(dataset, cfg)),
            })
    out = {"config": dict(vars(a), **{k: cfg[k] for k in ("array_bytes", "mmap_bytes")}),
           "rows": rows}
    if a.trainers > 1:
        out["trainers"] = bench_trainers(a, cfg, rows, progress)
    return out


def bench_trainers(a, cfg, rows, progress):
    """a.trainers trainers at once over a.trainers_over (array by
    default), at the first worker count; against that row's one trainer."""
    workers, dataset = a.workers[0], a.trainers_over
    one = next((r for r in rows if r["dataset"] == dataset and r["workers"] == workers), None)
    runs = {n: [] for n in LOADERS}
    for r in range(a.rounds):
        for name in LOADERS if r % 2 == 0 else LOADERS[::-1]:
            c = dict(cfg, dataset=dataset, workers=workers, loader=name)
            m = run_group([c] * a.trainers, a.run_timeout)
            runs[name].append(m)
            progress(r, "%s x%d" % (dataset, a.trainers), workers, name, m)
    out = {"trainers": a.trainers, "workers": workers, "dataset": dataset, "loaders": {}}
    for n in LOADERS:
        med = _medians(runs[n])
        single = one["loaders"][n]["median"]["added_peak_mib"] if one else None
        ratio = med["added_peak_mib"] / single if single and single > 0 else None
        out["loaders"][n] = {"median": med, "rounds": runs[n], "one_added_peak_mib": single,
                             "ratio_over_one": ratio}
    ratio = out["loaders"]["ferry"]["ratio_over_one"]
    out["target"] = {"target": "<= 1.3x one", "met": None if ratio is None else ratio <= 1.3}
    return out


# ------------------------------------------------------------ the output

def _fmt(v, unit):
    if v is None:
        return "-"
    if unit == "s":
        return "%.3f" % v
    return "%.0f" % v if abs(v) >= 10 else "%.1f" % v


def table(res):
    """The one-screen report."""
    c = res["config"]
    lines = [
        "ferry.bench: dataset-memory, memory a loader adds to its trainer (PSS of the trainer "
        "and every process below it, less the trainer's before the loader)",
        "  array/tensor %.0f MB, memmap %s MB sparse file, records %d dicts, vocab %d words"
        % (c["array_bytes"] / 1e6, "%.0f" % (c["mmap_bytes"] / 1e6) if c["mmap_bytes"] else "-",
           c["records"], c["vocab"]),
        "  batch %d, shuffle, persistent workers, one epoch of at most %d batches; median of %d "
        "round(s), loaders alternating, each run a fresh trainer process"
        % (c["batch_size"], c["batches"], c["rounds"]),
        "",
    ]
    lines.append("%-8s %2s %-6s" % ("", "", "") + "%36s" % "memory added, MiB " +
                 "%24s" % "time, s " + "  %9s" % "ferry/torch")
    lines.append("%-8s %2s %-6s" % ("dataset", "w", "loader") + "".join(
        "%12s" % label for _, label, _ in FIGURES) +
        "  %9s %9s  %s" % ("memory", "1st batch", "targets (ferry)"))
    for row in res["rows"]:
        for n in LOADERS:
            med = row["loaders"][n]["median"]
            line = "%-8s %2d %-6s" % (row["dataset"], row["workers"], n) + "".join(
                "%12s" % _fmt(med[k], u) for k, _, u in FIGURES)
            if n == "ferry":
                r = row["ratios_ferry_over_torch"]
                line += "  %9s %9s  " % (
                    "%.2fx" % r["added_peak_mib"] if "added_peak_mib" in r else "-",
                    "%.2fx" % r["first_batch_s"] if "first_batch_s" in r else "-")
                line += "; ".join("%s %s %s" % (k, t["target"], "met" if t["met"] else "MISSED")
                                  for k, t in row["targets"].items())
            lines.append(line)
    tr = res.get("trainers")
    if tr:
        lines += ["", "%d trainers at once, each its own loader over its own %s (%d workers):"
                  % (tr["trainers"], tr.get("dataset", "array"), tr["workers"])]
        for n in LOADERS:
            ld = tr["loaders"][n]
            med = ld["median"]
            line = "  %-6s added in all, peak %s MiB, at end %s MiB; one trainer adds %s MiB: " \
                   "%s; 1st batch %.3f s" % (
                       n, _fmt(med["added_peak_mib"], "MiB"), _fmt(med["added_end_mib"], "MiB"),
                       _fmt(ld["one_added_peak_mib"], "MiB"),
                       "-" if ld["ratio_over_one"] is None else "%.2fx" % ld["ratio_over_one"],
                       med["first_batch_s"])
            if n == "ferry":
                t = tr["target"]
                line += "  target %s: %s" % (t["target"], "-" if t["met"] is None else
                                             "met" if t["met"] else "MISSED")
            lines.append(line)
    lines += [
        "",
        "added, peak: the largest sample (every ~50 ms, from the constructor call to the end of",
        "the epoch) of the summed PSS of the trainer and every process below it (workers, clean",
        "parents and the template they are forked from), shared-memory files (memfd, /dev/shm) counted",
        "whole and once in place of their PSS, less the trainer's just before the loader was",
        "built; at end: after the last batch, the loader open; growth: at end less the first",
        "sample after the first batch with every process of the end there.",
        "1st batch: constructor call to the first batch in hand; epoch: to the last batch;",
        "both from runs of their own with no sampler beside them (ABBA after the sampled ones).",
        "Ratios f/t: ferry's median over torch's (peak memory added, first batch).",
    ]
    left = [p for row in res["rows"] for n in LOADERS for r in row["loaders"][n]["rounds"]
            for p in r["leftover_pids"]]
    if left:
        lines.append("left processes behind: %s" % left)
    return "\n".join(lines)


# ------------------------------------------------------------------ main

QUICK = {"array_mb": 24, "mmap_mb": 256, "records": 20000, "vocab": 20000, "batches": 20,
         "rounds": 1, "workers": "2"}
DEFAULT = {"array_mb": 800, "mmap_mb": 8000, "records": 1000000, "vocab": 1000000,
           "batches": 400, "rounds": 3, "workers": "2,4"}


def _ints(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a list of integers, as 2,4: %r" % text) from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("a list of integers of at least 1: %r" % text)
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m ferry.bench --pipeline dataset-memory",
        description="The memory ferry.torch.DataLoader and torch's DataLoader add to a "
                    "trainer whose dataset holds its data (an array, a tensor, a memmap, a "
                    "list of dicts, a dict), and the time to the first batch.")
    from ferry import __version__
    p.add_argument("--version", action="version",
                   version="python -m ferry.bench %s" % __version__)
    p.add_argument("--pipeline", choices=("dataset-memory",), default="dataset-memory",
                   help=argparse.SUPPRESS)
    p.add_argument("--datasets", default=",".join(DATASETS),
                   help="which, comma-separated (%s)" % ",".join(DATASETS))
    p.add_argument("--workers", help="worker counts, comma-separated (2,4; --quick: 2)")
    p.add_argument("--batch-size", type=int, default=256, help="items per batch (256)")
    p.add_argument("--batches", type=int,
                   help="at most this many batches in the epoch (400; --quick: 20)")
    p.add_argument("--rounds", type=int, help="runs of each loader per row (3; --quick: 1)")
    p.add_argument("--array-mb", type=float, help="the array's size, MB (800; --quick: 24)")
    p.add_argument("--mmap-mb", type=float,
                   help="the memmap's file size, MB, sparse (8000; --quick: 256)")
    p.add_argument("--records", type=int, help="dicts in the list (1000000; --quick: 20000)")
    p.add_argument("--vocab", type=int, help="words in the dict (1000000; --quick: 20000)")
    p.add_argument("--trainers", type=int, default=0, metavar="N",
                   help="also N trainers at once over the array, each its own loader (0: not)")
    p.add_argument("--trainers-over", choices=DATASETS, default="array", metavar="DATASET",
                   help="the dataset the N trainers hold (array; it must be measured too)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (0)")
    p.add_argument("--run-timeout", type=float, default=300.0,
                   help="seconds a run (or a group of trainers) may take (300)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and one round, well under a minute (for tests)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    for k, v in (QUICK if a.quick else DEFAULT).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    try:
        a.workers = _ints(a.workers)
    except argparse.ArgumentTypeError as e:
        p.error("--workers: %s" % e)
    a.datasets = [d for d in a.datasets.split(",") if d]
    bad = [d for d in a.datasets if d not in DATASETS]
    if bad or not a.datasets:
        p.error("--datasets: unknown %s (known: %s)" % (",".join(bad), ",".join(DATASETS)))
    for k in ("batch_size", "batches", "rounds", "records", "vocab"):
        if getattr(a, k) < 1:
            p.error("--%s must be at least 1" % k.replace("_", "-"))
    if a.array_mb <= 0 or a.mmap_mb <= 0:
        p.error("--array-mb and --mmap-mb must be above 0")
    if a.trainers < 0:
        p.error("--trainers must be >= 0")
    if a.trainers > 1 and a.trainers_over not in a.datasets:
        p.error("--trainers-over %s: measure it too (--datasets)" % a.trainers_over)
    return a


def main(argv=None):
    a = parse_args(argv)
    folder = tempfile.mkdtemp(prefix="ferry-bench-memory-")
    try:
        cfg = {k: getattr(a, k) for k in ("array_mb", "records", "vocab", "batch_size",
                                          "batches", "seed")}
        cfg["mmap_path"] = make_memmap(folder, a.mmap_mb) if "memmap" in a.datasets else None
        cfg["mmap_bytes"] = os.path.getsize(cfg["mmap_path"]) if cfg["mmap_path"] else 0
        cfg["array_bytes"] = data_bytes("array", cfg)

        def progress(r, dataset, workers, name, m):
            print("ferry.bench: round %d/%d %-10s %d workers %-5s added %6.0f MiB peak, "
                  "%6.0f at end; 1st batch %.3f s, epoch %.3f s" % (
                      r + 1, a.rounds, dataset, workers, name, m["added_peak_mib"],
                      m["added_end_mib"], m["first_batch_s"], m["epoch_s"]),
                  file=sys.stderr, flush=True)
            if m["leftover_pids"]:
                print("ferry.bench: %s left processes behind: %s" % (name, m["leftover_pids"]),
                      file=sys.stderr, flush=True)

        res = bench(a, cfg, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--trainer":
        from ferry import bench_memory  # by its importable name: the datasets pickle by it
        bench_memory.trainer(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
