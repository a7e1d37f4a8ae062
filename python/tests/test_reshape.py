"""Resume into another shape from Python: a state saved by a job of W ranks
(one ferry.Loader per rank, in this process) resumes a job of W' ranks, or
of another batch_size, at the next sample of the epoch's global order.

The global order of an epoch comes from a one-rank loader whose batch is
the whole dataset (its batch e is epoch e's order), so every batch the new
ranks deliver is checked item by item against it: rank r' of W' serves
positions P+r', P+r'+W', ... (wrapped to the order's start past n, the
padding), and across the new ranks each position from P on comes once."""

import json
import pickle

import numpy as np
import pytest

import ferry

N = 1003  # prime to every world_size here: padding is exercised
SPEC = "synthetic:n=%d,dim=4" % N
SEED = 5


def orders(epochs):
    """The global order of each epoch, from a one-rank loader."""
    with ferry.Loader(SPEC, batch_size=N, workers=1, seed=SEED) as ld:
        return [b.indices.copy() for _, b in zip(range(epochs), ld.stream())]


def rank_loader(world, rank, batch, workers, **kw):
    return ferry.Loader(SPEC, batch_size=batch, workers=workers, seed=SEED, rank=rank,
                        world_size=world, **kw)


def run_old_job(world, batch, batches):
    """Every rank takes `batches` batches and saves its state."""
    states = []
    for r in range(world):
        with rank_loader(world, r, batch, 1, worker_mode="thread") as ld:
            for _, b in zip(range(batches), ld.stream()):
                pass
            states.append(ld.state_dict())
    return states


def resume_job(world, batch, states, order, epoch, pos, workers=(1, 3)):
    """Opens the W' ranks (all at once, as a job's would be) from `states`
    (rank r' gets states[r'] % len), reads the rest of `epoch`, checks each
    batch against `order`, and each rank's next epoch against a fresh
    rank's. Returns how often each position of the order was served."""
    served = np.zeros(N, np.int64)
    loaders = [rank_loader(world, r, batch, workers[r % len(workers)],
                           state=states[r % len(states)]) for r in range(world)]
    try:
        per_rank = set()
        for r, ld in enumerate(loaders):
            item = 0
            while True:
                b = ld.next()
                assert b.epoch == epoch
                assert ferry_synthetic_ok(b)
                want = pos + r + world * np.arange(item, item + len(b.indices))
                want = np.where(want >= N, want - N, want)
                assert np.array_equal(b.indices, order[want])
                np.add.at(served, want, 1)
                item += len(b.indices)
                if b.last_in_epoch:
                    assert b.index_in_epoch == len(ld) - 1
                    break
            per_rank.add(item)
            with rank_loader(world, r, batch, 1, worker_mode="thread") as fresh:
                fresh.load_state_dict(fresh.state_at_epoch(epoch + 1))
                for x in fresh:
                    y = ld.next()
                    assert (y.epoch, y.index_in_epoch) == (x.epoch, x.index_in_epoch)
                    assert np.array_equal(y.indices, x.indices)
        assert len(per_rank) == 1  # every rank the same count
    finally:
        for ld in loaders:
            ld.close()
    return served


def ferry_synthetic_ok(b):
    """Synthetic item i: y == i (the batch's own indices)."""
    return np.array_equal(b["y"], b.indices.astype(np.int64))


def check_served(served, pos):
    """Each position from pos on once; before it only padding's repeats."""
    assert (served[pos:] >= 1).all(), "lost: %s" % np.nonzero(served[pos:] == 0)[0][:10]
    extra = np.nonzero(served > (np.arange(N) >= pos))[0]
    # padding repeats the order's first positions, once each
    assert np.array_equal(extra, np.arange(len(extra)))
    assert (served[extra] == (extra >= pos) + 1).all()


def test_a_state_saved_on_8_ranks_resumes_on_6_each_sample_once():
    # 8 ranks of 16 ran epoch 0 (8 batches) and 3 batches of epoch 1:
    # P = 3 * 16 * 8 = 384 of epoch 1's order done. 6 ranks, 1 or 3
    # workers each, serve the other 619.
    order = orders(3)
    states = run_old_job(8, 16, 8 + 3)
    states = [json.loads(json.dumps(s)) for s in states]  # as a JSON checkpoint keeps them
    served = resume_job(6, 16, states, order[1], 1, 384)
    check_served(served, 384)


def test_a_state_saved_on_4_ranks_resumes_on_8_at_an_epoch_boundary():
    order = orders(3)
    states = run_old_job(4, 16, 16)  # 251 per rank: 16 batches, all of epoch 0
    served = resume_job(8, 16, states, order[1], 1, 0)
    check_served(served, 0)


def test_batch_size_32_resumes_as_48_from_the_list_of_every_ranks_state():
    order = orders(2)
    states = run_old_job(2, 32, 5)  # P = 5 * 32 * 2 = 320 of epoch 0
    served = resume_job(2, 48, [states], order[0], 0, 320)
    check_served(served, 320)
    # and 64 -> 16, one rank
    states = run_old_job(1, 64, 4)
    check_served(resume_job(1, 16, states, order[0], 0, 256, workers=(3,)), 256)


def test_states_of_ranks_that_stopped_at_different_batches_are_refused_naming_it():
    early, late = run_old_job(2, 16, 4), run_old_job(2, 16, 5)
    with pytest.raises(ferry.StateError, match="did not stop at the same batch"):
        rank_loader(3, 0, 16, 1, state=[early[0], late[1]])
    with pytest.raises(ferry.StateError, match="rank 0's"):
        rank_loader(3, 0, 16, 1, state=[early[0], early[0]])
    with pytest.raises(ferry.StateError, match="empty"):
        rank_loader(3, 0, 16, 1, state=[])
    # another order: another dataset length, another seed
    with pytest.raises(ferry.StateError, match="1003 items, this one has 1002"):
        ferry.Loader("synthetic:n=1002,dim=4", batch_size=16, workers=1, seed=SEED,
                     state=early[0])
    with pytest.raises(ferry.StateError, match="seed"):
        ferry.Loader(SPEC, batch_size=16, workers=1, seed=SEED + 1, state=early[0])
    with pytest.raises(ferry.StateError, match="state_dict"):
        ferry.Loader(SPEC, batch_size=16, workers=1, seed=SEED, state={"ferry": "not*base64"})


def test_a_state_goes_through_json_pickle_and_torch_save(tmp_path):
    opts = dict(batch_size=10, workers=1, seed=SEED)
    with ferry.Loader(SPEC, **opts) as ld:
        for _, b in zip(range(7), ld.stream()):
            pass
        state = ld.state_dict()
        want = ld.next().indices.copy()
    assert isinstance(state, dict) and isinstance(state["ferry"], str)
    forms = [json.loads(json.dumps(state)), pickle.loads(pickle.dumps(state)),
             {"ferry": __import__("base64").b64decode(state["ferry"])}]  # older ferry's bytes
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.save(state, tmp_path / "s.pt")
        forms.append(torch.load(tmp_path / "s.pt"))
    for form in forms:
        with ferry.Loader(SPEC, state=form, **opts) as ld:
            assert np.array_equal(ld.next().indices, want)


def test_torch_dataloader_with_distributed_sampler_resumes_on_6_ranks_from_8():
    torch = pytest.importorskip("torch")
    import ferry.torch as ft
    from torch.utils.data import Dataset, DistributedSampler

    class Items(Dataset):
        def __len__(self):
            return N

        def __getitem__(self, i):
            return i

    ds = Items()

    def loader(world, rank, **kw):
        s = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        return s, ft.DataLoader(ds, batch_size=16, sampler=s, num_workers=1, **kw)

    consumed, states = [], []
    for r in range(8):  # 3 batches of epoch 0 on each of 8 ranks
        _, dl = loader(8, r)
        it = iter(dl)
        consumed += [int(x) for _ in range(3) for x in next(it)]
        states.append(dl.state_dict())
        dl.close()
    states = torch.load(_saved(torch, states))  # a checkpoint's round trip
    rest, fresh_next, next_epochs = [], [], []
    for r in range(6):
        s, dl = loader(6, r, state=states)  # the list of every rank's
        s.set_epoch(0)
        rest += [int(x) for b in dl for x in b]
        s.set_epoch(1)
        next_epochs.append([b.tolist() for b in dl])
        dl.close()
        s, fresh = loader(6, r)
        s.set_epoch(1)
        fresh_next.append([b.tolist() for b in fresh])
        fresh.close()
    assert len(consumed) == len(set(consumed)) == 3 * 16 * 8
    left = set(range(N)) - set(consumed)
    assert set(rest) >= left and len(rest) == 6 * -(-len(left) // 6)  # padded: 104 each
    assert len(rest) - len(set(rest)) == 0 and len(set(rest) - left) == len(rest) - len(left)
    assert next_epochs == fresh_next  # then a fresh 6-rank run's epochs


def _saved(torch, obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf
