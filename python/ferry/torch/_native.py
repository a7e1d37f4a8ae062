"""torchvision in C: the imagefolder spec that runs a torchvision
ImageFolder (or DatasetFolder) and its transform in ferry's C workers,
with no Python at all, when ferry's C reproduces what torchvision's code
would do; and, when it does not, the reason, for the notice that says the
dataset runs in Python. A pure inspection of the dataset object, in the
trainer.
"""

import os
import sys

import torch


def _native_imagefolder(dataset):
    """(the imagefolder spec that runs ``dataset`` and its transform in C,
    None), for torchvision's ImageFolder or a DatasetFolder with its default
    loader and image extensions; (None, why not) for one whose pipeline is
    not one ferry has in C; (None, None) for any other dataset.
    The transform must be a Compose (or one transform) of, in this order:
    RandomResizedCrop(S) or Resize(R) + CenterCrop(S) (square, bilinear);
    optionally RandomHorizontalFlip(0.5); ToTensor, or PILToTensor with
    optionally ConvertImageDtype(float32); optionally Normalize."""
    if "torchvision" not in sys.modules:  # then dataset cannot be one of its classes
        return None, None  # (and importing it would cost ~0.3 s for nothing)
    try:
        from torchvision import datasets as tvd
        from torchvision import transforms as T
        from torchvision.transforms import InterpolationMode
    except ImportError:
        return None, None
    if not isinstance(dataset, tvd.DatasetFolder):
        return None, None
    # C stands in only for code whose result it is known to reproduce:
    # torchvision's own classes, not a subclass (its __getitem__, loader or
    # anything else may differ, and would silently not run).
    if type(dataset) not in (tvd.ImageFolder, tvd.DatasetFolder):
        return None, "it is %s, a subclass of torchvision's %s: its own code runs" % (
            type(dataset).__qualname__,
            "ImageFolder" if isinstance(dataset, tvd.ImageFolder) else "DatasetFolder")
    if getattr(dataset, "loader", None) is not tvd.folder.default_loader:
        return None, "its loader is not torchvision's default_loader"
    if tuple(getattr(dataset, "extensions", None) or ()) != tuple(tvd.folder.IMG_EXTENSIONS):
        return None, "its extensions are not torchvision's IMG_EXTENSIONS"
    if getattr(dataset, "target_transform", None) is not None:
        return None, "it has a target_transform"
    classes = getattr(dataset, "classes", None)
    if classes != sorted(classes or []) or \
            dataset.class_to_idx != {c: i for i, c in enumerate(classes)}:
        return None, "its classes are not the sorted folder names"
    import torchvision
    if torchvision.get_image_backend() != "PIL":
        return None, "torchvision's image backend is not PIL"
    tf = dataset.transform
    steps = list(tf.transforms) if type(tf) is T.Compose else [tf]
    kw = {}

    def square(size):
        size = [size] if isinstance(size, int) else list(size)
        return size[0] if len(size) == 1 or size[0] == size[1] else None

    def bilinear(t):
        return t.interpolation in (InterpolationMode.BILINEAR, 2)

    def short_side(size):  # Resize(int) or Resize([int]): the shorter side
        if isinstance(size, int):
            return size
        return size[0] if isinstance(size, (list, tuple)) and len(size) == 1 else None

    i = 0
    if i < len(steps) and type(steps[i]) is T.RandomResizedCrop and bilinear(steps[i]) and \
            square(steps[i].size):
        t = steps[i]
        kw.update(size=square(t.size), crop="random", scale="%r:%r" % tuple(t.scale),
                  ratio="%r:%r" % tuple(t.ratio), flip=0)
        i += 1
    elif i + 1 < len(steps) and type(steps[i]) is T.Resize and \
            type(steps[i + 1]) is T.CenterCrop and bilinear(steps[i]) and \
            short_side(steps[i].size) is not None:
        r, c = short_side(steps[i].size), square(steps[i + 1].size)
        if c is None or steps[i].max_size is not None or r < c:
            return None, "its Resize/CenterCrop is not Resize(int) + a square crop no larger"
        kw.update(size=c, crop="center", resize=r, flip=0)
        i += 2
    else:
        return None, "it does not start with RandomResizedCrop or Resize + CenterCrop"
    if i < len(steps) and type(steps[i]) is T.RandomHorizontalFlip and steps[i].p == 0.5:
        kw["flip"] = 1
        i += 1
    if i < len(steps) and type(steps[i]) is T.ToTensor:
        kw["dtype"] = "float32"
        i += 1
    elif i < len(steps) and type(steps[i]) is T.PILToTensor:
        i += 1
        if i < len(steps) and type(steps[i]) is T.ConvertImageDtype and \
                steps[i].dtype == torch.float32:
            kw["dtype"] = "float32"
            i += 1
    else:
        return None, "it has %r where ferry expects ToTensor or PILToTensor" % (
            steps[i] if i < len(steps) else "nothing",)
    if i < len(steps) and type(steps[i]) is T.Normalize and kw.get("dtype") == "float32":
        mean, std = list(steps[i].mean), list(steps[i].std)
        if len(mean) != 3 or len(std) != 3:
            return None, "its Normalize is not per RGB channel"
        kw.update(mean="%r:%r:%r" % tuple(map(float, mean)),
                  std="%r:%r:%r" % tuple(map(float, std)))
        i += 1
    if i != len(steps):
        return None, "it has a transform ferry does not run in C: %r" % (steps[i],)
    if not _listing_order(dataset.samples, dataset.root, classes):
        return None, "its samples are not the folder's images, labels and order"
    root = os.path.abspath(dataset.root)
    if "," in root:
        return None, "its root has a ',' (a spec cannot name it)"
    return "imagefolder:root=%s,%s" % (root, ",".join("%s=%s" % kv for kv in kw.items())), None


def _listing_order(samples, root, classes):
    """Whether ``samples`` ((path, label), ...) are what make_dataset gives
    for ``root``: each label the index of the class folder its path lies
    in, in make_dataset's order (by label, then folder, then file name).
    With the count checked against ferry's own listing of the folder, that
    makes them the same list: an edited ``samples`` (labels remapped, files
    dropped or reordered) runs in Python."""
    prefixes = [os.path.join(root, c) + os.sep for c in classes]
    prev = None
    try:
        for path, label in samples:
            if type(label) is not int or not 0 <= label < len(prefixes) or \
                    not path.startswith(prefixes[label]):
                return False
            key = (label,) + os.path.split(path)
            if prev is not None and key < prev:
                return False
            prev = key
    except (TypeError, ValueError, AttributeError):
        return False
    return True
