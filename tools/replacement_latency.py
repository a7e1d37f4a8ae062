"""How long a SIGKILLed Python worker takes to be replaced: from the kill to
the first item its replacement (a fork of the loader's clean parent) builds,
with torch imported by the dataset, as in an image pipeline.

    PYTHONPATH=build/python /usr/bin/python3 tools/replacement_latency.py [--kills 10]

Each item records (pid, CLOCK_MONOTONIC in us) as it is built; the clock is
the same in every process, so the replacement's first item says when it
began work. Prints the median and the largest over the kills.
"""

import argparse
import os
import signal
import statistics
import time

import torch

from ferry.torch import DataLoader


class Timed(torch.utils.data.Dataset):
    """Items that say which process built them, and when."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        time.sleep(0.002)  # the item's work: decoding, say
        return torch.tensor([os.getpid(), time.monotonic_ns() // 1000], dtype=torch.int64)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    a = p.parse_args()
    took = []
    quiet = lambda level, message: None  # noqa: E731 - the deaths are this script's doing
    with DataLoader(Timed(), batch_size=4, num_workers=2, log=quiet) as dl:
        it = iter(dl)
        for _ in range(10):  # running, both workers busy
            next(it)
        for _ in range(a.kills):
            victim = dl._ferry().worker_pid(0)
            t0 = time.monotonic_ns() // 1000
            os.kill(victim, signal.SIGKILL)
            first = None
            while first is None:
                for pid, t in next(it).tolist():
                    if pid not in (victim, dl._ferry().worker_pid(1)) and t > t0:
                        first = (t - t0) / 1000
            took.append(first)
    print("kill -> the replacement's first item, ms: median %.1f, max %.1f over %d kills"
          % (statistics.median(took), max(took), len(took)))


if __name__ == "__main__":
    main()
