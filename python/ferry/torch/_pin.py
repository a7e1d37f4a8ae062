"""pin_memory=True: the batches handed to the trainer in page-locked
memory, for `x.cuda(non_blocking=True)`.

ferry's way (_SlotPins) registers each shared-memory batch slot with
CUDA once, so a batch is pinned where the worker wrote it; torch's way
(_tcollate_pin), a copy into pinned memory per batch, is what is left
for a batch that did not come in a slot. Trainer only.
"""

import collections

import torch

from ._once import _warn_once


def _tcollate_pin(obj):
    """torch's pin_memory: a copy into pinned memory for each tensor, but
    a tensor already in page-locked memory (a registered slot) is itself."""
    from torch.utils.data._utils.pin_memory import pin_memory
    return pin_memory(obj)


class _SlotPins:
    """pin_memory=True without a copy per batch: each batch slot that a
    batch arrives in is page-locked once (cudaHostRegister, through torch),
    and every later batch in that slot is pinned memory as it arrives, so
    `x.cuda(non_blocking=True)` copies by DMA straight from where the worker
    wrote it. torch's pin thread instead copies every batch into its pinned
    allocator's memory.

    A slot is reused once its batch is released. With a non_blocking copy
    still running, that would let a worker overwrite bytes the copy has not
    read yet: so a batch in a slot does not give its slot back when it dies
    but hands it here, with an event recorded on the current CUDA stream
    (where `x.cuda(non_blocking=True)` or `x.to(device, non_blocking=True)`
    has just queued the copy), and the slot goes back once that event has
    completed (looked at before each batch, and at close). A copy queued on
    another stream must be on the current stream, or that stream, when the
    batch's last tensor goes: the same rule as torch's
    `Tensor.record_stream` for the memory of its caching allocator.

    Batches that did not come in a slot (remote workers', or every slot
    taken) are copied into pinned memory as torch does. Slots keep their
    memory once used (ferry_loader_keep_slots): page-locked pages cannot be
    given back while registered. Everything is unregistered, after the
    device has finished, before the loader closes."""

    def __init__(self, loader):
        self._cudart = torch.cuda.cudart()
        self._slots = {}  # address -> bytes, registered
        self._pending = collections.deque()  # (event, SlotHold)
        self._off = None  # why slots are not registered (copies then)
        c = loader._c
        c.keep_slots()
        c.release_hook = self._hold
        c.before_close = self.close

    def pin(self, batch):
        """Registers the slot `batch` (a ferry.Batch) lies in, if it is the
        first batch there."""
        self._poll()
        slot = batch._b.slot() if batch._b is not None else None
        if slot is None or self._off or slot[0] in self._slots:
            return
        rc = int(self._cudart.cudaHostRegister(slot[0], slot[1], 1))  # 1: Portable
        if rc:
            self._off = "cudaHostRegister of a %d-byte batch slot failed (cudaError %d)" % (
                slot[1], rc)
            _warn_once("pin-slots", "pin_memory=True: %s; batches are copied into pinned "
                       "memory instead, as torch's DataLoader does" % self._off)
            return
        self._slots[slot[0]] = slot[1]

    def _hold(self, hold):
        if not self._slots:  # nothing registered: nothing to wait for
            return
        try:
            event = torch.cuda.current_stream().record_event()
        except Exception:  # CUDA gone (interpreter exit): the slot goes back now
            return
        self._pending.append((event, hold))

    def _poll(self):
        p = self._pending
        while p and p[0][0].query():
            p.popleft()

    def stats(self):
        return {"pinned_slots": len(self._slots), "pinned_bytes": sum(self._slots.values()),
                "slots_awaiting_copy": len(self._pending)}

    def close(self):
        """Before the loader closes: the device's copies end, every slot
        goes back and is unregistered (a batch still held after this is
        plain memory). A batch dying meanwhile (the waits let other
        threads run) joins the queue and is waited for too."""
        try:
            while self._pending:  # copies to any device
                self._pending[0][0].synchronize()
                self._pending.popleft()
            if self._slots:
                torch.cuda.synchronize()  # and those from batches still held
        except Exception:  # CUDA failed or is gone (interpreter exit): no copy can run
            pass
        finally:
            slots, self._slots = self._slots, {}
            self._pending.clear()
            for addr in slots:
                try:
                    self._cudart.cudaHostUnregister(addr)
                except Exception:
                    pass
            self._off = self._off or "the loader is closed"
