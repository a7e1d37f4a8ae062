"""The processes a bench run starts, as /proc sees them: their memory (PSS,
peak RSS, shared memory) sampled while the run goes, their CPU time, and
waiting for them to be gone. Used by ``python -m ferry.bench``."""

import os
import time

import numpy as np

def _proc_kbs(path, *keys):
    """The kB values of lines ``key:`` in a /proc file, read once (None for
    each when the file cannot be read or lacks any of them)."""
    found = {}
    try:
        with open(path) as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in keys:
                    found[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return [None] * len(keys)
    return [found.get(k) for k in keys] if len(found) == len(keys) else [None] * len(keys)


def _proc_kb(path, key):
    """The kB value of line ``key:`` in a /proc file, or None."""
    return _proc_kbs(path, key)[0]


def _template_pid():
    """A process of ferry's that outlives each loader, left out of the
    other loader's figures: none now (``import ferry`` starts nothing;
    a loader's clean parent and the fork of the trainer it comes from
    are the loader's own, counted with it, and gone when it closes)."""
    return None


def _descendants(root=None, template=False):
    """Pids of the live processes below ``root`` (default: this one), a
    process of ferry's that outlives each loader (_template_pid: none now)
    included only with ``template``."""
    import ferry
    skip = None if template else _template_pid()
    out = ferry._descendants(os.getpid() if root is None else root)
    if skip is None:
        return out
    below = set(ferry._descendants(skip))
    return [p for p in out if p != skip and p not in below]


def _reset_peak_rss():
    """Resets this process's VmHWM to its current RSS (Linux clear_refs 5);
    False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _workers_memory(template=False):
    """(sum of VmHWM, sum of Pss) of the live child processes, in MiB."""
    pids = _descendants(template=template)
    hwm = [_proc_kb("/proc/%d/status" % p, "VmHWM") for p in pids]
    pss = [_proc_kb("/proc/%d/smaps_rollup" % p, "Pss") for p in pids]
    mib = lambda kbs: sum(kbs) / 1024 if kbs and None not in kbs else None  # noqa: E731
    return mib(hwm), mib(pss), len(pids)


def _system_shmem_kb():
    """The machine's shared memory in use (/proc/meminfo Shmem), kB: every
    page of shm, memfd and tmpfs once, mapped by any process or by none."""
    return _proc_kb("/proc/meminfo", "Shmem")


class _MemorySampler:
    """Memory the loader uses while it runs, sampled once an epoch:
    the loader's processes' PSS without their shared memory, plus the
    trainer's RSS growth without its shared memory, plus the growth of the
    machine's shared memory. Each page once, and the batches in flight
    counted wherever they are: torch's live in shared-memory files that a
    worker made and only the trainer maps (or nobody, while queued), which
    no process's PSS shows until the trainer touches them; ferry's in its
    slots. Another program making shared memory meanwhile would count too."""

    def __init__(self, template):
        self.template = template
        self.rss0 = self._trainer_kb()
        self.shm0 = _system_shmem_kb()
        self.samples = []

    @staticmethod
    def _trainer_kb():
        a, f = _proc_kbs("/proc/self/status", "RssAnon", "RssFile")
        return a + f if a is not None else None

    def sample(self):
        kb = 0
        for pid in _descendants(template=self.template):
            pss, shm = _proc_kbs("/proc/%d/smaps_rollup" % pid, "Pss", "Pss_Shmem")
            if pss is not None:  # else gone meanwhile
                kb += pss - shm
        rss, shm = self._trainer_kb(), _system_shmem_kb()
        if None in (rss, shm, self.rss0, self.shm0):
            return
        self.samples.append((kb + rss - self.rss0 + shm - self.shm0) / 1024)

    def median(self):
        return float(np.median(self.samples)) if self.samples else None


def _cpu_seconds(pid):
    """CPU seconds pid's live threads have run: the scheduler's nanosecond
    count (schedstat), else user + system time in clock ticks (10 ms: too
    coarse for a short run)."""
    try:
        total = 0
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _workers_cpu(template=False):
    """CPU seconds used so far by the live processes below this one."""
    return sum(_cpu_seconds(p) for p in _descendants(template=template))


def _wait_children_gone(seconds=15.0):
    """Waits until this process has no children; the pids left, if any."""
    deadline = time.monotonic() + seconds
    while True:
        left = _descendants()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)
