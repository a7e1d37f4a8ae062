"""ferry.Mix: several datasets drawn by weight, through the loaders.

Each loader's batches are checked item by item against the mix's own
arithmetic (``Mix.draws``: the C sampler's draw at each position of the
mixed order), and against the sources' items; tests/test_mix.c checks that
arithmetic itself (whole passes, quotas, resume on the sampler alone)."""

import json
import os

import numpy as np
import pytest

import ferry
from datasets import Items

SEED = 3


def sources(sizes=(1500, 150, 1500)):
    """Arrays whose item i of source k is k * 1_000_000 + i."""
    return [np.arange(n, dtype=np.int64) + k * 1_000_000 for k, n in enumerate(sizes)]


def value_of(mix, index):
    k, i = mix.locate(index)
    return k * 1_000_000 + i


def values(batch):
    return np.asarray(batch[0] if not hasattr(batch, "keys") else batch["0"])


def test_a_loader_serves_the_mix_s_draws_and_their_weights_over_1e5_samples():
    # 1.41 * 10^5 samples (45 epochs) across a change of weights at 40960 (ten blocks).
    mix = ferry.Mix(sources(), schedule={0: [0.5, 0.2, 0.3], 40960: [0.1, 0.6, 0.3]})
    with ferry.Loader(mix, batch_size=1000, workers=2, worker_mode="thread", seed=SEED,
                      shuffle=True) as ld:
        got, have = [], 0
        for b in ld.stream():  # epochs of 3150 positions, one after another
            got.append((b.indices.copy(), values(b).copy()))
            have += len(b.indices)
            if have >= 140960:
                break
    idx = np.concatenate([g[0] for g in got])
    want, src = mix.draws(0, len(idx), seed=SEED)
    assert np.array_equal(idx, want)
    assert np.array_equal(np.concatenate([g[1] for g in got]),
                          [value_of(mix, i) for i in idx])
    assert np.array_equal(mix.source_of(idx), src)
    # The first segment, whole blocks: every source's share to 1/4096.
    share = np.bincount(src[:40960], minlength=3) / 40960
    assert np.abs(share - [0.5, 0.2, 0.3]).max() <= 1 / 4096
    # 10^5 samples of the second: within 1% of each weight.
    share = np.bincount(src[40960:140960], minlength=3) / 1e5
    assert (np.abs(share / [0.1, 0.6, 0.3] - 1) < 0.01).all(), share
    # The small source has gone round hundreds of times, each pass whole:
    # up to a block's end (40960 + 24 blocks) each item p or p + 1 times.
    end = 40960 + 24 * 4096
    small = (idx[:end][src[:end] == 1] - 1500).astype(np.int64)
    passes, rest = divmod(len(small), 150)
    counts = np.bincount(small, minlength=150)
    assert passes > 400 and set(counts) <= {passes, passes + 1}
    assert (counts == passes + 1).sum() == rest


def test_a_worker_killed_in_a_mix_loses_and_repeats_nothing(tmp_path):
    flag = str(tmp_path / "died")
    mix = ferry.Mix([Items(n=200), Items(n=20, die=7, flag=flag), Items(n=200)],
                    [0.4, 0.2, 0.4])
    with ferry.Loader(mix, batch_size=16, workers=2, seed=SEED, shuffle=True) as ld:
        got = [b for _, b in zip(range(60), ld.stream())]
        idx = np.concatenate([b.indices for b in got])
        ys = np.concatenate([b["y"] for b in got])
        assert ld.stats()["restarts"] == 1
    assert os.path.exists(flag)
    want, _ = mix.draws(0, len(idx), seed=SEED)
    assert np.array_equal(idx, want)
    local = np.array([mix.locate(i)[1] for i in idx])
    assert np.array_equal(ys, local * local)


def _rank(mix, world, rank, batch, **kw):
    return ferry.Loader(mix, batch_size=batch, workers=1, worker_mode="thread", seed=SEED,
                        shuffle=True, rank=rank, world_size=world, **kw)


@pytest.mark.parametrize("steps", [15, 20, 25])  # before, at and after the change
@pytest.mark.parametrize("world2,batch2", [(3, 40), (6, 25), (1, 100)])
def test_a_mix_resumes_on_other_ranks_and_batch_sizes_around_a_change(steps, world2, batch2):
    # 4 ranks of 25 take 100 positions a step; the weights change at 2000.
    mix = ferry.Mix(sources(), schedule={0: [0.5, 0.2, 0.3], 2000: [0.2, 0.5, 0.3]})
    n = len(mix)
    states = []
    for r in range(4):
        with _rank(mix, 4, r, 25) as ld:
            for _, b in zip(range(steps), ld.stream()):
                pass
            states.append(ld.state_dict())
    P = steps * 100
    order, _ = mix.draws(0, n, seed=SEED)
    served = np.zeros(n, np.int64)
    for r in range(world2):
        with _rank(mix, world2, r, batch2, state=states) as ld:
            item = 0
            while True:
                b = ld.next()
                assert b.epoch == 0
                pos = P + r + world2 * np.arange(item, item + len(b.indices))
                pos = np.where(pos >= n, pos - n, pos)
                assert np.array_equal(b.indices, order[pos])
                assert np.array_equal(values(b), [value_of(mix, i) for i in b.indices])
                np.add.at(served, pos, 1)
                item += len(b.indices)
                if b.last_in_epoch:
                    break
            # the next epoch: the mix's draws from position n on
            nxt = ld.next()
            assert nxt.epoch == 1
            pos = n + r + world2 * np.arange(len(nxt.indices))
            assert np.array_equal(nxt.indices, mix.draws(0, n * 2, seed=SEED)[0][pos])
    assert (served[P:] >= 1).all()  # nothing lost
    extra = np.nonzero(served > (np.arange(n) >= P))[0]
    assert np.array_equal(extra, np.arange(len(extra)))  # only padding repeats


def test_a_mix_state_is_small_goes_through_json_and_refuses_another_mix():
    mix = ferry.Mix(sources(), [0.5, 0.2, 0.3])
    with _rank(mix, 1, 0, 10) as ld:
        next(iter(ld))
        state = ld.state_dict()
    assert len(json.dumps(state)) < 400
    state = json.loads(json.dumps(state))
    with _rank(mix, 1, 0, 10, state=state) as ld:
        assert ld.next().index_in_epoch == 1
    other = ferry.Mix(sources(), [0.5, 0.3, 0.2])
    with pytest.raises(ferry.StateError, match="another mix"):
        _rank(other, 1, 0, 10, state=state)
    with pytest.raises(ferry.StateError, match="with a mix"):
        ferry.Loader(other, batch_size=10, workers=1, worker_mode="thread", seed=SEED,
                     shuffle=True, state=state, mix="")


def test_torch_dataloader_serves_a_mix_and_says_each_item_s_source():
    torch = pytest.importorskip("torch")
    import ferry.torch as ft
    from torch.utils.data.distributed import DistributedSampler

    class Dicts:
        def __init__(self, k, n):
            self.k, self.n = k, n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"v": self.k * 1000 + i}

    mix = ferry.Mix([Dicts(0, 300), Dicts(1, 30), Dicts(2, 300)], [0.3, 0.4, 0.3],
                    source_key="source")

    def v_of(indices):
        return [k * 1000 + i for k, i in map(mix.locate, indices)]

    dl = ft.DataLoader(mix, batch_size=32, shuffle=True, num_workers=2, seed=SEED)
    assert len(dl) == 20  # 630 positions an epoch
    batches = list(dl)
    assert len(batches) == 20
    v = torch.cat([b["v"] for b in batches]).numpy()
    assert np.array_equal(torch.cat([b["source"] for b in batches]).numpy(), v // 1000)
    want, _ = mix.draws(0, len(mix), seed=SEED)
    assert np.array_equal(v, v_of(want))
    # An epoch of the mix's own length: len() says it before the first iter().
    short = ferry.Mix(mix.sources, [0.3, 0.4, 0.3], length=100)
    dl = ft.DataLoader(short, batch_size=32, num_workers=1, seed=SEED)
    assert len(dl) == 4 and [len(b["v"]) for b in dl] == [32, 32, 32, 4]
    # A DistributedSampler shards the mix's order: rank 1 of 2 takes 1, 3, 5, ...
    ds = DistributedSampler(mix, num_replicas=2, rank=1, seed=SEED)
    dl = ft.DataLoader(mix, batch_size=16, sampler=ds, num_workers=0)
    v = torch.cat([b["v"] for b in dl]).numpy()
    want = want[1::2][:len(v)]
    assert np.array_equal(v, v_of(want))


def test_a_mix_of_c_datasets_is_served_by_c_workers_item_by_item(tmp_path):
    # Three npy files of one field "v": source k's item i is k * 1000 + i.
    specs = []
    for k, n in enumerate((40, 6, 25)):
        np.save(tmp_path / ("s%d.npy" % k), np.arange(n, dtype=np.int64) + k * 1000)
        specs.append("npy:v=%s" % (tmp_path / ("s%d.npy" % k)))
    mix = ferry.Mix(specs, schedule={0: [0.3, 0.4, 0.3], 100: [0.1, 0.1, 0.8]})
    assert mix.sizes == (40, 6, 25) and mix.dataset_spec.startswith("concat:")
    with ferry.Loader(mix, batch_size=8, workers=2, seed=SEED, shuffle=True) as ld:
        got = [(b.indices.copy(), np.asarray(b["v"]).copy()) for _, b in zip(range(40), ld.stream())]
    idx = np.concatenate([g[0] for g in got])
    assert np.array_equal(idx, mix.draws(0, len(idx), seed=SEED)[0])
    k = mix.source_of(idx)
    local = idx - np.asarray(mix.offsets)[k]
    assert np.array_equal(np.concatenate([g[1] for g in got]), k * 1000 + local)
    with pytest.raises(TypeError, match="built by C workers"):
        mix[0]
    torch = pytest.importorskip("torch")  # noqa: F841
    import ferry.torch as ft
    with pytest.raises(TypeError, match="C dataset specs"):
        ft.DataLoader(mix, batch_size=4)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ([[np.zeros(3), "npy:x.npy"]], {"weights": [1, 1]}, TypeError, "not some of each"),
    ([["synthetic:n=3", "synthetic:n=2|synthetic:n=4"]], {"weights": [1, 1]}, ValueError,
     "no '|'"),
    ([["synthetic:n=3", "bogus:1"]], {"weights": [1, 1]}, ferry.DatasetError,
     "unknown dataset kind 'bogus'"),
    ([[]], {"weights": [1]}, ValueError, "no sources"),
    (["x"], {"weights": [1]}, TypeError, "list of datasets"),
    ([[np.zeros(3), 5]], {"weights": [1, 1]}, TypeError, "source 1 must be a map-style"),
    ([[np.zeros(3)]], {}, TypeError, "weights or schedule"),
    ([[np.zeros(3)]], {"weights": [1], "schedule": {0: [1]}}, TypeError, "weights or schedule"),
    ([[np.zeros(3), np.zeros(2)]], {"weights": [1]}, ValueError, "1 weights for 2 sources"),
    ([[np.zeros(3)]], {"schedule": {5: [1]}}, ValueError, "start at position 0"),
    ([[np.zeros(3), np.zeros(0)]], {"weights": [1, 1]}, ValueError, "source 1 is empty"),
    ([[np.zeros(3), np.zeros(2)]], {"weights": [0, 0]}, ferry.InvalidValue, "every weight is 0"),
    ([[np.zeros(3), np.zeros(2)]], {"weights": [1, -1]}, ferry.InvalidValue, "weight \"-1.0\""),
    ([[np.zeros(3)]], {"weights": [1], "length": 0}, ValueError, "length"),
])
def test_bad_mix_arguments_are_refused_by_name(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        ferry.Mix(*args, **kwargs)


def test_the_weights_may_change_after_a_checkpoint_but_not_before_it():
    """A state saved at position P resumes under a schedule that differs
    only after P: the positions before P were drawn alike, the rest of the
    stream is the new mix's; a schedule that differs before P is refused."""
    old = ferry.Mix(sources(), schedule={0: [0.5, 0.2, 0.3], 20000: [0.2, 0.5, 0.3]})
    new = ferry.Mix(sources(), schedule={0: [0.5, 0.2, 0.3], 9000: [0.1, 0.1, 0.8]})
    with _rank(old, 1, 0, 100) as ld:
        for _, b in zip(range(20), ld.stream()):  # position 2000 of epoch 0
            pass
        state = ld.state_dict()
    with _rank(new, 1, 0, 100, state=state) as ld:
        got = np.concatenate([b.indices for _, b in zip(range(10), ld.stream())])
    assert np.array_equal(got, new.draws(2000, 1000, seed=SEED)[0])
    assert np.array_equal(old.draws(0, 2000, seed=SEED)[0], new.draws(0, 2000, seed=SEED)[0])
    past = ferry.Mix(sources(), schedule={0: [0.5, 0.2, 0.3], 1000: [0.1, 0.1, 0.8]})
    with pytest.raises(ferry.StateError, match="differs before position 2000"):
        _rank(past, 1, 0, 100, state=state)
