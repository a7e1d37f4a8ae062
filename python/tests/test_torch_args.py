"""torch's DataLoader arguments translated into ferry's (ferry.torch._args):
the pure function alone, with no loader made. Each torch sampler that
ferry's own index stream reproduces becomes ferry's options; any other
becomes a fed table; num_workers=0 is the synchronous mode; and arguments
torch refuses are refused with torch's own errors, in torch's order
(checked against torch's DataLoader itself)."""

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
import torch.utils.data as tud  # noqa: E402

from ferry.torch._args import translate, translate_iterable  # noqa: E402


def ds(n=10):
    return tud.TensorDataset(torch.arange(n))


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(4))


class Mine:
    """A sampler of the user's: ferry cannot know its order."""

    def __init__(self, order):
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


def test_a_batch_sampler_over_a_random_sampler_is_ferrys_own_shuffle():
    rs = tud.RandomSampler(ds())
    plan = translate(ds(), batch_sampler=tud.BatchSampler(rs, 4, drop_last=True),
                     num_workers=2)
    assert plan.feed is None and plan.indices is None and plan.mode == "workers"
    assert (plan.batch_size, plan.drop_last, plan.sampler) == (4, True, rs)
    assert {k: plan.opts[k] for k in ("shuffle", "batch_size", "drop_last", "workers")} == \
        {"shuffle": True, "batch_size": 4, "drop_last": True, "workers": 2}
    assert plan.draw == (None, 0, 2)  # torch's RandomSampler draws one seed at iter()


def test_shuffle_draws_from_the_loaders_generator_as_torchs_does():
    g = torch.Generator()
    assert translate(ds(10), shuffle=True, generator=g).draw == (g, 10, 2)
    assert translate(ds(10), shuffle=True).draw == (None, 0, 2)
    assert translate(ds(10)).draw is None


def test_a_distributed_sampler_is_rank_world_seed_and_padding():
    s = tud.distributed.DistributedSampler(ds(), num_replicas=4, rank=1, shuffle=False, seed=7,
                                           drop_last=True)
    plan = translate(ds(), sampler=s, batch_size=2)
    assert {k: plan.opts[k] for k in ("rank", "world_size", "seed", "pad_shards", "shuffle")} == \
        {"rank": 1, "world_size": 4, "seed": 7, "pad_shards": False, "shuffle": False}
    assert plan.base_seed == 7 and plan.feed is None
    # ferry's own options win over the sampler's
    plan = translate(ds(), sampler=s, ferry_options={"seed": 3, "rank": 0})
    assert (plan.opts["seed"], plan.opts["rank"], plan.base_seed) == (3, 0, 3)
    # under either of the option's names
    plan = translate(ds(), sampler=s, ferry_options={"world": 2})
    assert plan.opts["world"] == 2 and "world_size" not in plan.opts


def test_a_list_sampler_is_the_indices_an_epoch_runs_over():
    plan = translate(ds(), sampler=[3, 1, 2], batch_size=2)
    assert plan.indices.dtype == np.int64 and plan.indices.tolist() == [3, 1, 2]
    assert plan.opts["shuffle"] is False and plan.feed is None
    sub = tud.SubsetRandomSampler([5, 6, 7])
    plan = translate(ds(), sampler=sub)
    assert plan.indices.tolist() == [5, 6, 7] and plan.opts["shuffle"] is True
    assert plan.draw == (None, 3, 1)
    with pytest.raises(IndexError, match="index 10, but the dataset has 10 items"):
        translate(ds(), sampler=range(11))
    with pytest.raises(ValueError, match="gives no indices"):
        translate(ds(), sampler=[])


def test_a_sampler_of_the_users_is_fed_in_batches():
    s = Mine([9, 8, 7, 6, 5])
    plan = translate(ds(), sampler=s, batch_size=2, num_workers=1)
    assert plan.feed.sampler is s and plan.feed.nbatches == 3
    assert isinstance(plan.feed.batch_sampler, tud.BatchSampler)
    assert [list(b) for b in plan.feed.batch_sampler] == [[9, 8], [7, 6], [5]]
    assert plan.opts["feed_batches"] == 3 and plan.opts["shuffle"] is False
    # the sampler is drawn far enough ahead for the window
    assert plan.feed.ahead == -(-plan.opts["prefetch"] // 3) + 1
    # a batch sampler of the user's: its own batches, its batch_size
    bs = tud.BatchSampler(Mine([1, 2, 3]), 2, drop_last=False)
    plan = translate(ds(), batch_sampler=bs)
    assert plan.feed.batch_sampler is bs and plan.batch_size == 2
    # RandomSampler with replacement: not ferry's shuffle
    assert translate(ds(), sampler=tud.RandomSampler(ds(), replacement=True)).feed is not None
    # batch_size=None: batches of one
    plan = translate(ds(), sampler=Mine([4, 2]), batch_size=None)
    assert [list(b) for b in plan.feed.batch_sampler] == [[4], [2]] and not plan.auto_batch
    with pytest.raises(TypeError, match="must be iterable and have len"):
        translate(ds(), sampler=object())


def test_num_workers_0_is_the_synchronous_mode():
    plan = translate(ds(), num_workers=0)
    assert plan.mode == "sync"
    assert (plan.opts["worker_mode"], plan.opts["workers"]) == ("thread", 1)
    # ferry's thread worker asked for by name (either name): ferry makes the batches
    for name in ("worker_mode", "placement"):
        plan = translate(ds(), ferry_options={name: "thread"})
        assert plan.mode == "workers" and plan.opts == dict(plan.opts, **{name: "thread"})
        assert len({"worker_mode", "placement"} & set(plan.opts)) == 1
    plan = translate(ds(), num_workers=2, prefetch_factor=3)
    assert plan.mode == "workers" and plan.opts["prefetch"] == 6


def test_a_seed_or_a_resume_state_fixes_the_base_seed():
    assert translate(ds()).base_seed is None  # drawn at the first iter(), as torch's
    assert translate(ds(), ferry_options={"seed": 2**64 + 5}).base_seed == 5
    plan = translate(ds(), ferry_options={"state": {"base_seed": 11, "epoch": 2}})
    assert plan.base_seed == 11 and plan.opts["seed"] == 11


def test_translating_starts_draws_and_iterates_nothing():
    class Untouchable(Mine):
        def __iter__(self):
            raise AssertionError("iterated")

    before = torch.random.get_rng_state()
    options = {"seed": 1}
    translate(ds(), sampler=Untouchable([1, 2]), shuffle=False, ferry_options=options)
    translate(ds(), shuffle=True, num_workers=1, ferry_options={"dct": 1})
    assert torch.equal(torch.random.get_rng_state(), before)
    assert options == {"seed": 1}  # the caller's options as they were


def test_a_dataset_torchvision_does_not_make_runs_in_python_silently():
    plan = translate(ds(), num_workers=1)
    assert (plan.mode, plan.native, plan.native_why) == ("workers", None, None)
    with pytest.raises(ValueError, match="dct must be 0"):
        translate(ds(), ferry_options={"dct": 2})


B = tud.BatchSampler(tud.SequentialSampler(range(10)), 2, False)


@pytest.mark.parametrize("args", [
    dict(sampler=[1, 2], shuffle=True),
    dict(batch_sampler=B, batch_size=2),
    dict(batch_sampler=B, shuffle=True),
    dict(batch_sampler=B, sampler=[1]),
    dict(batch_sampler=B, drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(persistent_workers=True),
    dict(multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context="nope"),
    dict(num_workers=1, multiprocessing_context=3),
    # two rules broken: torch's first is the one said
    dict(sampler=[1], shuffle=True, batch_sampler=B),
    dict(batch_sampler=B, batch_size=None, drop_last=True),
    dict(num_workers=-1, sampler=[1], shuffle=True),
    dict(timeout=-1, batch_size=None, drop_last=True),
], ids=lambda a: ",".join(sorted(a)))
def test_arguments_torch_refuses_raise_torchs_error_in_torchs_order(args):
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(ds(), **args)
    with pytest.raises(Exception) as ours:
        translate(ds(), **args)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


@pytest.mark.parametrize("args", [
    dict(shuffle=True), dict(sampler=[1]), dict(batch_sampler=B),
    dict(batch_size=None, drop_last=True),
], ids=lambda a: ",".join(sorted(a)))
def test_an_iterable_dataset_refuses_what_torch_refuses(args):
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(Stream(), **args)
    with pytest.raises(Exception) as ours:
        translate_iterable(Stream(), **args)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_an_iterable_dataset_is_a_stream_of_tasks():
    plan = translate_iterable(Stream(), batch_size=2, num_workers=2, prefetch_factor=3,
                              ferry_options={"seed": 9})
    assert plan.mode == "stream" and plan.base_seed == 9 and "seed" not in plan.opts
    assert {k: plan.opts[k] for k in ("workers", "pin_tasks", "batch_size", "epochs",
                                      "prefetch")} == \
        {"workers": 2, "pin_tasks": True, "batch_size": 1, "epochs": 0, "prefetch": 6}
    assert translate_iterable(Stream()).mode == "sync"
    with pytest.raises(TypeError, match="'world' does not apply"):
        translate_iterable(Stream(), ferry_options={"world": 2})
    with pytest.raises(NotImplementedError, match="cannot be resumed"):
        translate_iterable(Stream(), ferry_options={"state": {}})
