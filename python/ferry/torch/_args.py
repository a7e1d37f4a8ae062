"""torch's DataLoader arguments: the rules torch applies to them (with
torch's messages, in torch's order), ferry's own checks, and the
warnings for arguments that mean nothing here. Pure: nothing is started
or drawn; called in the trainer as a DataLoader is made.
"""

import inspect
import numbers
import os
import warnings

import torch.utils.data as tud

from ._once import _warn_once


class _Unset:
    """torch's default for an argument whose default ferry cannot honour:
    false, as torch's, and told apart from a value the user passed."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "False"


_UNSET = _Unset()
# torch's own default (2 in torch 1.x, None in 2.x): accepted with num_workers=0.
_TORCH_PREFETCH_DEFAULT = inspect.signature(tud.DataLoader).parameters["prefetch_factor"].default


def _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                  multiprocessing_context, pin_memory_device, ferry_options):
    """torch's checks of the arguments every DataLoader takes (with torch's
    messages), ferry's own, and the warnings for what means nothing here."""
    if not isinstance(num_workers, numbers.Integral) or num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor not in (None, _TORCH_PREFETCH_DEFAULT):
        raise ValueError("prefetch_factor option could only be specified in "
                         "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                         "otherwise set prefetch_factor to None.")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if reseed not in (None, "batch", "sample", "worker"):
        raise ValueError("ferry.torch.DataLoader: reseed must be 'batch', 'sample' or "
                         "'worker', not %r" % (reseed,))
    if "bind" in ferry_options or "remote" in ferry_options:
        raise TypeError("ferry.torch.DataLoader: remote workers serve a dataset by name "
                        "(ferry.Loader(MyDataset, dataset_kwargs=...)); a pickled dataset "
                        "object stays on this host")
    for key in ("worker_max_rss_bytes", "max_batches_per_worker"):
        if num_workers == 0 and ferry_options.get(key):
            raise ValueError("ferry.torch.DataLoader: %s replaces worker processes; with "
                             "num_workers=0 batches are made in this process, which nothing "
                             "can replace: set num_workers > 0" % key)
    if multiprocessing_context is not None:
        _check_mp_context(multiprocessing_context, num_workers)
        _warn_once("mp", "multiprocessing_context is ignored: ferry's workers are forked "
                         "from a clean parent process, never from the trainer")
    if pin_memory_device:
        _warn_once("pmd", "pin_memory_device is ignored: batches are pinned for CUDA")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    if cpus and num_workers > cpus:
        warnings.warn("ferry.torch.DataLoader: %d workers on a process allowed %d CPUs: more "
                      "workers than CPUs only contend for them and use more memory, and such "
                      "excessive worker creation might get DataLoader running slow or even "
                      "freeze; %d or fewer is the most this machine runs at once"
                      % (num_workers, cpus, cpus), UserWarning, stacklevel=3)


def _default_reseed(reseed, worker_init_fn):
    """reseed as given, else "batch", or torch's "worker" under a
    worker_init_fn: code written for torch seeds its generators there
    (torch.manual_seed(...) in it), and reseeding before each batch would
    silently overwrite that."""
    if reseed is not None:
        return reseed
    return "worker" if worker_init_fn is not None else "batch"


def _check_mp_context(ctx, num_workers):
    """torch's checks of multiprocessing_context (ferry does not use it, but
    a value torch refuses is refused here too, with torch's meaning)."""
    import multiprocessing
    import multiprocessing.context
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process "
                         "loading (num_workers > 0), but got num_workers=0")
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError("multiprocessing_context option should specify a valid start "
                             "method in %r, but got multiprocessing_context=%r" % (methods, ctx))
    elif not isinstance(ctx, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a "
                        "string specifying the start method, but got multiprocessing_context=%r"
                        % (ctx,))
