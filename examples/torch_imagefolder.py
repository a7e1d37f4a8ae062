"""A PyTorch training loop on ferry, with one import changed.

torchvision's ImageFolder with its usual training transforms, passed as an
object, trains a small CNN. The script then checks what ferry promises:
two runs under torch.manual_seed(0) see identical batches, and a run
stopped mid-epoch and resumed from its state_dict() sees the batches the
uninterrupted run saw.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_imagefolder.py [--data DIR]

Without --data it writes a small folder of JPEGs to a temporary directory.
"""

import argparse
import hashlib
import shutil
import tempfile

import torch
from torch import nn
from torchvision import datasets, transforms

from ferry.torch import DataLoader  # was: from torch.utils.data import DataLoader


def make_loader(root, state=None):
    tf = transforms.Compose([
        transforms.RandomResizedCrop(32),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    return DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=16, shuffle=True,
                      num_workers=2, state=state)


def digest(x, y):
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]


def train(root, epochs, stop_after=None, state=None):
    """Trains for `epochs`; returns each batch's digest, and the loader's
    state after `stop_after` batches (the run then stops there)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen, losses = [], []
    with make_loader(root, state) as loader:
        for epoch in range(epochs):
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(digest(x, y))
                losses.append(loss.item())
                if stop_after is not None and len(seen) == stop_after:
                    return seen, losses, loader.state_dict()
    return seen, losses, None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="an ImageFolder root (default: a small one, made here)")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    tmp = None
    root = a.data
    if root is None:
        from ferry.bench import make_imagefolder
        tmp = tempfile.mkdtemp(prefix="ferry-example-")
        root = tmp + "/train"
        make_imagefolder(root, items=96, classes=4, size=40, seed=0)
    try:
        first, losses, _ = train(root, a.epochs)
        print("trained %d batches, loss %.3f -> %.3f" % (len(first), losses[0], losses[-1]))
        again, _, _ = train(root, a.epochs)
        print("second run under torch.manual_seed(0): %s"
              % ("identical batches" if again == first else "DIFFERENT batches"))
        cut = len(first) // 2 + 1
        head, _, state = train(root, a.epochs, stop_after=cut)
        # The resumed loader goes on in the epoch it stopped in; the loop
        # runs the epochs left (the interrupted one included).
        tail, _, _ = train(root, a.epochs - (cut - 1) // (len(first) // a.epochs), state=state)
        resumed = head + tail
        print("stopped after %d batches and resumed: %s" % (
            cut, "the uninterrupted run's batches" if resumed == first else "DIFFERENT batches"))
        return 0 if again == first and resumed == first else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
