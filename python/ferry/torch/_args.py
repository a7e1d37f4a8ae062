"""torch's DataLoader arguments, translated: the rules torch applies to
them (with torch's messages, in torch's order), ferry's own checks, the
warnings for arguments that mean nothing here, and what the arguments
mean for ferry (translate, translate_iterable): a Plan, with ferry.Loader's
options, the source of each epoch's indices and the mode the batches are
made in.

Pure: nothing is started, drawn from a generator or iterated (a sampler's
len() is asked, and what means nothing here is warned about); the trainer
calls it as a DataLoader is made, and the tests call it alone
(test_torch_args.py).
"""

import collections
import inspect
import numbers
import os
import warnings

import numpy as np
import torch.utils.data as tud

from .._mix import Mix
from ._native import _native_imagefolder
from ._once import _warn_once
from ._sampler import _indices_of, _native_sampler, _Singles


class _Unset:
    """torch's default for an argument whose default ferry cannot honour:
    false, as torch's, and told apart from a value the user passed."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "False"


def _one_state(state):
    """One rank's state of ``state=``, which may be the list of every rank's
    (ferry.Loader checks that they agree, and any one then does)."""
    return state[0] if isinstance(state, (list, tuple)) and state else state


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
                      % (num_workers, cpus, cpus), UserWarning,
                      stacklevel=4)  # at the DataLoader(...) call, through translate()


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


# A sampler of the user's, for a _SamplerTable: its batches (the batch
# sampler, or the sampler in batches), the sampler set_epoch() and
# state_dict() are asked of, how many batches an epoch has, and how many
# epochs ahead of the trainer's they are drawn.
Feed = collections.namedtuple("Feed", "batch_sampler sampler nbatches ahead")


class Plan:
    """What torch's arguments mean for ferry (translate's answer):

    opts          ferry.Loader's options (a dict of its own)
    mode          how batches are made: "sync" (num_workers=0: in the
                  caller's thread, at next()), "native" (torchvision's
                  ImageFolder in C: the spec `native`) or "workers"
                  (Python workers, the default)
    native, native_why
                  the imagefolder spec, or why the dataset is not run in C
                  (None when it is no torchvision dataset at all)
    batch_size, drop_last, sampler, batch_sampler
                  torch's attributes of those names
    auto_batch    batches are collated from batch_size items
    reseed        how the workers' generators are seeded
    indices       the dataset indices an epoch runs over (int64), or None
                  for all of them, in ferry's own order
    feed          a Feed when the user's sampler gives the batches
    draw          what torch's sampler draws at each iter(), as
                  (generator, n, k): k randperm(n), or one int64 when n
                  is 0; None when nothing
    base_seed     the workers' base seed when the options fix it, else
                  None (drawn at the first iter(), as torch draws it)
    """

    __slots__ = ("opts", "mode", "native", "native_why", "batch_size", "drop_last", "sampler",
                 "batch_sampler", "auto_batch", "reseed", "indices", "feed", "draw", "base_seed")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.pop(k, None))
        assert not kw, kw

    def __repr__(self):
        return "Plan(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


def _over(sampler, dataset):
    """Whether a SequentialSampler or RandomSampler runs over the
    dataset's positions (its data_source has the dataset's length): only
    then is it ferry's own index stream. One over another data_source
    (range(5) for 20 items) is the user's, fed, as torch runs it."""
    try:
        return len(sampler.data_source) == len(dataset)
    except TypeError:
        return False


def translate(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
              num_workers=0, collate_fn=None, drop_last=False, timeout=0, worker_init_fn=None,
              multiprocessing_context=None, generator=None, prefetch_factor=None,
              persistent_workers=_UNSET, pin_memory_device="", in_order=True, reseed=None,
              native=True, ferry_options=None):
    """The Plan for a map-style dataset's DataLoader(...) with these
    arguments (torch's, and ferry's: ferry_options, not changed). Raises
    torch's errors, with torch's messages, in torch's order, where torch's
    DataLoader refuses the arguments, and ferry's own where ferry does.

    torch's samplers become ferry's own index stream where it does the
    same: RandomSampler (also inside a BatchSampler) is ferry's shuffle,
    SubsetRandomSampler shuffled indices, a DistributedSampler ferry's
    rank, world_size, seed and pad_shards, a list (or range, array) of indices
    the indices. Any other sampler or batch sampler is the user's, fed
    (a Feed)."""
    if isinstance(dataset, Mix) and dataset.dataset_spec is not None:
        raise TypeError("ferry.torch.DataLoader: this ferry.Mix is of C dataset specs, which "
                        "C workers build without Python; read it with ferry.Loader")
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError("ferry.torch.DataLoader: the dataset must be map-style (have "
                        "__getitem__ and __len__), not a %s" % type(dataset).__name__)
    opts = dict(ferry_options or {})
    dct = opts.pop("dct", 0)
    if dct not in (0, 1, False, True):
        raise ValueError("ferry.torch.DataLoader: dct must be 0 (JPEGs decoded at full "
                         "scale, the default) or 1 (reduced DCT scales), not %r" % (dct,))
    _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                  multiprocessing_context, pin_memory_device, opts)
    num_workers = int(num_workers)
    plan = Plan(reseed=_default_reseed(reseed, worker_init_fn))

    # torch's argument rules, with torch's messages, in torch's order.
    fed = None  # a user's (batch) sampler: (batches, sampler)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        if isinstance(batch_sampler, tud.BatchSampler) and \
                _native_sampler(batch_sampler.sampler, dataset):
            batch_size, drop_last = batch_sampler.batch_size, batch_sampler.drop_last
            sampler = batch_sampler.sampler
        else:
            fed = (batch_sampler, getattr(batch_sampler, "sampler", batch_sampler))
            batch_size = getattr(batch_sampler, "batch_size", None) or 1
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is None and batch_size is not None:  # torch's BatchSampler's checks
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError("batch_size should be a positive integer value, but got "
                             "batch_size={}".format(batch_size))
        if not isinstance(drop_last, bool):
            raise ValueError("drop_last should be a boolean value, but got "
                             "drop_last={}".format(drop_last))
    plan.batch_size, plan.drop_last = batch_size, drop_last
    plan.auto_batch = auto_batch = batch_size is not None
    shuffle = bool(shuffle)
    seeded = "seed" in opts
    indices = None
    # What torch's sampler draws at each iter(): from the global generator
    # when its generator is None (torch's RandomSampler makes a second
    # randperm as its iterator ends).
    if fed is not None:
        pass
    elif sampler is None:
        if shuffle:  # torch makes RandomSampler(dataset, generator=generator)
            plan.draw = (generator, 0 if generator is None else len(dataset), 2)
    elif isinstance(sampler, tud.SequentialSampler) and _over(sampler, dataset):
        pass
    elif isinstance(sampler, tud.RandomSampler) and not sampler.replacement and \
            sampler._num_samples is None and _over(sampler, dataset):
        shuffle = True
        g = sampler.generator
        plan.draw = (g, 0 if g is None else len(sampler.data_source), 2)
    elif isinstance(sampler, tud.SubsetRandomSampler):
        indices = np.asarray(list(sampler.indices), dtype=np.int64)
        shuffle = True
        plan.draw = (sampler.generator, len(indices), 1)
    elif isinstance(sampler, tud.distributed.DistributedSampler):
        opts.setdefault("rank", sampler.rank)
        if "world" not in opts:  # (its old name)
            opts.setdefault("world_size", sampler.num_replicas)
        shuffle = sampler.shuffle
        if not seeded:
            opts["seed"] = sampler.seed
            seeded = True
        # Its drop_last trims the shards to n // world (ferry's shards
        # without padding); padded, as by default, like ferry's.
        opts.setdefault("pad_shards", not sampler.drop_last)
    elif isinstance(sampler, (list, tuple, range, np.ndarray)):
        indices = _indices_of(sampler)
    else:
        if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
            raise TypeError("ferry.torch.DataLoader: a sampler must be iterable and have "
                            "len(), not a %s" % type(sampler).__name__)
        fed = (tud.BatchSampler(sampler, batch_size, drop_last) if auto_batch
               else _Singles(sampler), sampler)
    plan.sampler, plan.batch_sampler = sampler, batch_sampler
    if indices is not None:
        n = len(dataset)
        bad = indices[(indices < 0) | (indices >= n)]
        if len(bad):
            raise IndexError("ferry.torch.DataLoader: the sampler gives index %d, but the "
                             "dataset has %d items" % (int(bad[0]), n))
        if len(indices) == 0:
            raise ValueError("ferry.torch.DataLoader: the sampler gives no indices")
    plan.indices = indices
    # A ferry.Mix is served in its own order (its weights, each source's
    # passes) when ferry chooses the order: no sampler, or a
    # DistributedSampler (its rank, world_size, seed and shuffle). A
    # sampler of the user's own runs over its items as over any dataset's.
    if isinstance(dataset, Mix) and fed is None and indices is None and \
            batch_sampler is None and (sampler is None or
                                       isinstance(sampler, tud.distributed.DistributedSampler)):
        opts.setdefault("mix", dataset.spec)

    # The base seed when the options fix it: a resume state carries the
    # one it was saved with; else seed= is it. Otherwise it is drawn at
    # the first iter(), as torch draws it.
    saved = _one_state(opts.get("state"))
    if isinstance(saved, dict) and "base_seed" in saved:
        plan.base_seed = int(saved["base_seed"])
    elif seeded:
        plan.base_seed = int(opts["seed"]) % 2**63
    if plan.base_seed is not None and not seeded:
        opts["seed"] = plan.base_seed

    if fed is not None:
        # ferry runs over the sampler's batches, fed their indices.
        nb = len(fed[0])
        if nb == 0:
            raise ValueError("ferry.torch.DataLoader: the sampler gives no batches")
        # The window, set here: the sampler is drawn far enough ahead for it.
        window = int(opts.get("prefetch") or
                     max(2, 2 * max(1, num_workers) * (prefetch_factor or 1)))
        opts["prefetch"] = window
        plan.feed = Feed(fed[0], fed[1], nb, -(-window // nb) + 1)
        opts["shuffle"], opts["drop_last"], opts["feed_batches"] = False, False, nb
    opts.setdefault("shuffle", shuffle)
    opts.setdefault("drop_last", bool(drop_last) if auto_batch else False)
    opts.setdefault("batch_size", batch_size if auto_batch else 1)
    # num_workers=0: the batches are made in the caller's thread when asked
    # for, as torch's are (a ferry loader over a stand-in dataset of the
    # same length gives the indices: the same order, epochs and resume
    # state as with workers). worker_mode="thread" asks for ferry's thread
    # worker instead (it prefetches).
    sync = num_workers == 0 and "placement" not in opts and "worker_mode" not in opts
    if num_workers == 0:
        if sync:
            opts["worker_mode"] = "thread"
        opts.setdefault("workers", 1)
    else:
        opts.setdefault("workers", num_workers)
        if prefetch_factor is not None:
            opts.setdefault("prefetch", max(1, int(prefetch_factor) * num_workers))
    opts.setdefault("in_order", bool(in_order))
    plan.opts = opts
    plan.mode = "sync" if sync else "workers"
    # torchvision's ImageFolder with a transform ferry has in C: the
    # workers decode and crop in C, no Python at all.
    if native and not sync and fed is None and indices is None and auto_batch and \
            collate_fn is None and worker_init_fn is None:
        plan.native, plan.native_why = _native_imagefolder(dataset)
        if plan.native is not None:
            # Full-scale JPEG decoding: torchvision's pixels within 1 of
            # 255. The reduced DCT scales (dct=1, ferry's own imagefolder
            # default) differ by up to ~60 on sharp edges: asked for only.
            plan.native += ",dct=%d" % int(dct)
            plan.mode = "native"
    # Which worker makes which batch: torch's assignment, batch b of each
    # epoch by worker b % num_workers, wherever the user's code runs in the
    # workers and can see it (get_worker_info().id in the dataset or
    # collate_fn; per-worker files, caches or connections). A replacement
    # takes its slot's batches, and the batches behind a slow one wait for
    # it, as in torch. Not with in_order=False: there torch too gives a
    # batch to a worker with room, and so does ferry (any free worker).
    # pin_tasks=0 opts out.
    if plan.mode == "workers" and opts["in_order"]:
        opts.setdefault("pin_tasks", 2)
    return plan


def translate_iterable(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                       num_workers=0, drop_last=False, timeout=0, worker_init_fn=None,
                       multiprocessing_context=None, prefetch_factor=None,
                       persistent_workers=_UNSET, pin_memory_device="", reseed=None,
                       ferry_options=None):
    """The Plan for an IterableDataset's DataLoader(...), checked as
    translate() checks a map-style one's. Its mode is "sync" (num_workers=0:
    the dataset iterated in the caller's thread) or "stream"; its opts are
    the loader's over the endless stream of tasks (prefetch: the window of
    tasks), less the seed and feed_batches, which are the stream's own
    (_iterable); base_seed is seed='s, or None (drawn by the caller)."""
    if shuffle not in {False, None}:
        raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                         "option, but got shuffle=%s" % (shuffle,))
    if sampler is not None:
        raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                         "option, but got sampler=%s" % (sampler,))
    if batch_sampler is not None:
        raise ValueError("DataLoader with IterableDataset: expected unspecified "
                         "batch_sampler option, but got batch_sampler=%s" % (batch_sampler,))
    if batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
    opts = dict(ferry_options or {})
    _check_common(num_workers, timeout, prefetch_factor, persistent_workers, reseed,
                  multiprocessing_context, pin_memory_device, opts)
    for key in ("rank", "world", "world_size", "pad_shards", "max_batches", "epochs"):
        if key in opts:
            raise TypeError("ferry.torch.DataLoader: option %r does not apply to an "
                            "IterableDataset, which shards itself (get_worker_info()) "
                            "and ends its epochs itself" % key)
    if "state" in opts:
        raise NotImplementedError("ferry.torch.DataLoader: an IterableDataset's stream "
                                  "cannot be resumed (ferry does not know where a user's "
                                  "iterator stands); resume needs a map-style dataset")
    w = int(num_workers)
    plan = Plan(reseed=_default_reseed(reseed, worker_init_fn), batch_size=batch_size,
                drop_last=drop_last, auto_batch=batch_size is not None,
                mode="stream" if w else "sync")
    if "seed" in opts:
        plan.base_seed = int(opts.pop("seed")) % 2**63
    window = max(w, int(prefetch_factor if prefetch_factor is not None else 2) * w)
    opts.update(workers=w, pin_tasks=True, batch_size=1, shuffle=False, drop_last=False,
                epochs=0, in_order=True, prefetch=max(1, window))
    plan.opts = opts
    return plan
