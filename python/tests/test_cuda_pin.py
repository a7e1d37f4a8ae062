"""pin_memory=True where CUDA is: ferry.torch.DataLoader page-locks each
batch slot once (cudaHostRegister) instead of copying every batch into
pinned memory as torch's pin thread does. These run on a GPU machine only
(CI has none; docs/python.md says how they were run): the batches must be
pinned where the workers wrote them, equal torch's, and no slot may be
written again while a non_blocking copy from it is still queued."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA: pinned batch slots are checked on a GPU machine; without CUDA, "
                "test_torch checks that pin_memory warns once", allow_module_level=True)

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

from datasets import Filled, FilledStream  # noqa: E402 - a module without CUDA in it
from ferry.torch import DataLoader  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cuda_up():
    """CUDA's own fds and threads, opened once before any test's snapshot
    of what it must leave behind."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()


def in_a_registered_slot(dl, t):
    return any(a <= t.data_ptr() < a + n for a, n in dl._pins._slots.items())


def test_batches_arrive_pinned_in_their_slots_and_equal_torchs():
    data = Filled(300)
    theirs = list(TorchLoader(data, batch_size=32, pin_memory=True))
    with DataLoader(data, batch_size=32, num_workers=2, pin_memory=True) as dl:
        for epoch in range(2):
            n = 0
            for (x, y), (tx, ty) in zip(dl, theirs):
                assert x.is_pinned() and y.is_pinned()
                assert in_a_registered_slot(dl, x) and in_a_registered_slot(dl, y)
                assert torch.equal(x, tx) and torch.equal(y, ty)
                n += 1
            assert n == len(theirs)
        st = dl.stats()
        # Registered once each: the slots the window cycles through, not a
        # copy per batch.
        assert 1 <= st["pinned_slots"] <= st["slots"]
        assert st["pinned_bytes"] == st["pinned_slots"] * st["slot_bytes"]


def test_no_slot_is_written_again_while_its_copy_is_queued():
    """Every copy is queued behind about a second of GPU work and each batch
    dropped at once, while the workers race ahead to refill every slot
    given back: a slot given back before its copy ran would show another
    batch's values on the GPU (without the wait, on an H100, all 640 items
    were another's)."""
    shape = (3, 128, 128)
    on_gpu, waited = [], 0
    with DataLoader(Filled(640, shape), batch_size=16, num_workers=2, pin_memory=True,
                    prefetch_factor=4) as dl:
        for k, (x, y) in enumerate(dl):
            assert x.is_pinned()
            if k == 0:
                torch.cuda._sleep(2_000_000_000)
            on_gpu.append((x.cuda(non_blocking=True), y.tolist()))
            del x, y
            waited = max(waited, dl.stats()["slots_awaiting_copy"])
        torch.cuda.synchronize()
    assert waited >= 2  # slots did wait for their copies
    seen = []
    for xg, labels in on_gpu:  # labels: read when the batch came
        per_item = xg.flatten(1)
        assert torch.equal(per_item.amin(1), per_item.amax(1))  # each item whole
        assert per_item[:, 0].long().tolist() == labels  # and the one that came
        seen += labels
    assert sorted(seen) == list(range(640))


def test_a_batch_held_past_close_stays_readable():
    data = Filled(64)
    with DataLoader(data, batch_size=16, num_workers=2, pin_memory=True) as dl:
        it = iter(dl)
        x, y = next(it)
        assert x.is_pinned()
        del it
    # Unregistered before the loader closed: plain memory now, still the batch.
    assert not x.is_pinned()
    xg = x.cuda().flatten(1)
    assert torch.equal(xg.amin(1), xg.amax(1))
    assert xg[:, 0].tolist() == [float(i) for i in range(16)]
    assert y.tolist() == list(range(16))


def test_a_forked_child_reads_a_pinned_batch():
    with DataLoader(Filled(64), batch_size=16, num_workers=2, pin_memory=True) as dl:
        x, y = next(iter(dl))
        assert x.is_pinned()
        pid = os.fork()
        if pid == 0:  # the child: its own copy of what is held (or none: no crash)
            code = 0
            try:
                code = 0 if float(x[3].sum()) == 3.0 * x[3].numel() else 3
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status), "the child died: status %d" % status
        assert os.WEXITSTATUS(status) == 0
        assert float(x[3].sum()) == 3.0 * x[3].numel()


def test_an_iterable_dataset_is_pinned_in_its_slots_too():
    with DataLoader(FilledStream(96), batch_size=16, num_workers=2, pin_memory=True) as dl:
        got = []
        for x, y in dl:
            assert x.is_pinned() and in_a_registered_slot(dl, x)
            got += y.tolist()
    assert sorted(got) == list(range(96))


def test_batches_that_come_by_message_are_copied_into_pinned_memory():
    with DataLoader(Filled(64), batch_size=16, num_workers=2, pin_memory=True,
                    shm=False) as dl:
        for x, y in dl:
            assert x.is_pinned() and not in_a_registered_slot(dl, x)
        assert dl.stats()["pinned_slots"] == 0


def test_numpy_fields_of_the_c_path_are_pinned(tmp_path):
    """An ImageFolder whose transform runs in C: its image and label
    fields are registered slots too."""
    from PIL import Image
    from torchvision import datasets, transforms as T
    rng = np.random.default_rng(0)
    for c in range(2):
        os.makedirs(tmp_path / str(c))
        for i in range(20):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                tmp_path / str(c) / ("%d.jpg" % i))
    tf = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])
    folder = datasets.ImageFolder(str(tmp_path), transform=tf)
    with DataLoader(folder, batch_size=8, num_workers=2, pin_memory=True) as dl:
        assert dl._native is not None
        n = 0
        for x, y in dl:
            assert x.is_pinned() and y.is_pinned() and in_a_registered_slot(dl, x)
            n += len(y)
    assert n == 40
