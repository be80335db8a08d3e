"""Reusable host buffers for KV transfers: each side stages a request's pages in host memory
(the prefill side's capture, the decode side's receive). A fresh multi-GB ``torch.empty`` per
transfer costs a page fault per 4 KiB at first touch, in the middle of the transfer, and on
CUDA the copies to and from pageable memory are slow and block the engine thread; these
buffers are pinned on CUDA, touched once when made, and reused.

The pool is bounded (``--disaggregation-staging-gb``): past the bound a transfer gets a
one-off buffer (slower, never refused). A buffer given back with a CUDA event becomes
reusable once the copies recorded before the event are done."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger("kvserve.disagg")
MIN_GRANULE = 1 << 20


@dataclass(eq=False)
class Staged:
    """One buffer lent out: ``data`` is exactly the bytes asked for."""

    data: torch.Tensor  # flat uint8
    _block: torch.Tensor | None  # the pooled block it views; None for a one-off buffer
    _owner: HostStaging | None = field(default=None, repr=False)

    def give_back(self, event: Any = None) -> None:
        """Done with the bytes (``event``: a CUDA event after the last copy that reads them)."""
        if self._owner is not None and self._block is not None:
            self._owner.give_back(self._block, event)
        self._owner, self._block = None, None


def capacity_for(nbytes: int) -> int:
    """Rounded up so a block serves nearby sizes: at most ~25% over, in 1 MiB granules."""
    granule = max(MIN_GRANULE, (1 << max(nbytes - 1, 1).bit_length()) // 8)
    return -(-nbytes // granule) * granule


class HostStaging:
    def __init__(self, limit_bytes: int, pin: bool = False) -> None:
        self.limit_bytes = limit_bytes
        self.pin = pin
        self._free: list[tuple[torch.Tensor, Any]] = []  # (block, event or None)
        self._pooled_bytes = 0  # blocks made and kept, lent or free
        self._lock = threading.Lock()
        self.num_one_off = 0

    def take(self, nbytes: int) -> Staged:
        with self._lock:
            block = self._reuse(nbytes)
            reserved = self._reserve(capacity_for(nbytes)) if block is None else 0
        if block is None and reserved:
            block = self._make(reserved)  # outside the lock: GBs take a while to fault in
        if block is None:
            self.num_one_off += 1
            return Staged(torch.empty(nbytes, dtype=torch.uint8), None)
        return Staged(block[:nbytes], block, self)

    def reserve(self, nbytes: int, count: int) -> int:
        """Make up to ``count`` blocks of ``nbytes`` now, within the bound (at startup: page-locking
        GBs takes a while, better not on the engine thread during a request). How many made."""
        made, capacity = 0, capacity_for(nbytes)
        for _ in range(count):
            with self._lock:  # no idle block is dropped for these: the bound just stops them
                fits = self._pooled_bytes + capacity <= self.limit_bytes
                reserved = self._reserve(capacity) if fits else 0
            if not reserved:
                break
            self.give_back(self._make(reserved))
            made += 1
        return made

    def give_back(self, block: torch.Tensor, event: Any = None) -> None:
        with self._lock:
            self._free.append((block, event))

    @property
    def pooled_bytes(self) -> int:
        return self._pooled_bytes

    def _reuse(self, nbytes: int) -> torch.Tensor | None:
        """The smallest free block that fits and whose copies are done."""
        fits = [i for i, (b, ev) in enumerate(self._free)
                if b.numel() >= nbytes and (ev is None or ev.query())]  # fmt: skip
        if not fits:
            return None
        best = min(fits, key=lambda i: self._free[i][0].numel())
        return self._free.pop(best)[0]

    def _reserve(self, capacity: int) -> int:
        """Room for a new block of ``capacity`` under the bound (dropping idle blocks in the
        way), counted as pooled; 0 when lent blocks fill the bound."""
        while self._pooled_bytes + capacity > self.limit_bytes and self._drop_one():
            pass
        if self._pooled_bytes + capacity > self.limit_bytes:
            return 0
        self._pooled_bytes += capacity
        return capacity

    def _make(self, capacity: int) -> torch.Tensor:
        block = torch.empty(capacity, dtype=torch.uint8)
        if not (self.pin and _page_lock(block)):  # page-locking faults the pages in itself
            block.fill_(0)  # fault every page in now, not in the middle of a transfer
        return block

    def _drop_one(self) -> bool:
        idle = [i for i, (_, ev) in enumerate(self._free) if ev is None or ev.query()]
        if not idle:
            return False
        block, _ = self._free.pop(min(idle, key=lambda i: self._free[i][0].numel()))
        self._pooled_bytes -= block.numel()
        return True


def _page_lock(block: torch.Tensor) -> bool:
    """Pin ``block`` in place (cudaHostRegister: its exact size, where torch's pinned allocator
    would round a 4.3 GB buffer up to 8 GB); unpinned again when the block is freed."""
    from torch.cuda._pin_memory_utils import pin_memory

    try:
        pin_memory(block.data_ptr(), block.numel())
    except RuntimeError as exc:
        log.warning("a %d-byte KV staging buffer stays pageable: %s", block.numel(), exc)
        return False
    weakref.finalize(block, _unlock, block.data_ptr())
    return True


def _unlock(ptr: int) -> None:
    from torch.cuda._pin_memory_utils import unpin_memory

    # at exit CUDA may be torn down first: nothing is left to unpin then
    with contextlib.suppress(AssertionError, RuntimeError):
        unpin_memory(ptr)


def copies_done_event(device: torch.device) -> Any:
    """On CUDA, an event after the copies queued so far on the current stream (the staged
    pages' device<->host copies run without a wait); None elsewhere (copies are done)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def staging_for_pool(limit_gb: float, pool: Any, context_length: int) -> HostStaging:
    """A worker's staging buffers: pinned on CUDA, where two blocks that fit the longest prompt
    are made at startup (within the bound); on the host made on first use (the CPU tests'
    workers stay small)."""
    staging = HostStaging(int(limit_gb * 2**30), pin=pool.device.type == "cuda")
    if staging.pin:
        nbytes = pool.export_nbytes(pool.pages_for(context_length))
        made = staging.reserve(nbytes, 2)
        log.info("KV staging: %d pinned block(s) of %.2f GB made (bound %.1f GB)", made,
                 capacity_for(nbytes) / 1e9, staging.limit_bytes / 1e9)  # fmt: skip
    return staging
