"""Device and dtype resolution from config ("auto" = CUDA when present, else CPU)."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.config import auto_dtype
from kvserve.errors import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but no CUDA GPU is visible")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    return _DTYPES[auto_dtype(device.type) if name == "auto" else name]


def to_device(
    values: np.ndarray | list[int] | list[float] | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Host values -> a device tensor without blocking the host. On CUDA the values go through
    pinned memory: a copy from pageable memory would first wait for all work queued on the
    stream, which defeats overlap scheduling. torch's caching host allocator keeps each pinned
    block until its copy has run, so a block is never overwritten while a copy reads it."""
    t = torch.as_tensor(np.asarray(values) if isinstance(values, list) else values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


_PACK_ALIGN = 16  # bytes: each packed array starts where Triton's pointer specialization wants


def to_device_packed(
    arrays: list[tuple[np.ndarray | list[int] | list[float], torch.dtype]],
    device: torch.device,
    staged: bool | None = None,
) -> list[torch.Tensor]:
    """``to_device`` of several host arrays (values, dtype) in one copy: on CUDA (``staged``)
    they are laid end to end in one pinned buffer, each at a 16-byte offset, copied once, and
    handed back as views of the device buffer (a step's inputs otherwise take a copy each, and
    every copy queued between two graph replays holds the GPU for its own latency)."""
    hosts = [torch.as_tensor(np.asarray(v), dtype=dtype) for v, dtype in arrays]
    if not (device.type == "cuda" if staged is None else staged):
        return [t.to(device) for t in hosts]
    offsets, size = [], 0
    for t in hosts:
        offsets.append(size)
        size += -(-t.nbytes // _PACK_ALIGN) * _PACK_ALIGN
    pinned = device.type == "cuda"
    staging = torch.empty(max(size, _PACK_ALIGN), dtype=torch.uint8, pin_memory=pinned)
    for t, at in zip(hosts, offsets):
        if t.numel():
            staging[at : at + t.nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))
    packed = staging.to(device, non_blocking=True)
    return [
        packed[at : at + t.nbytes].view(t.dtype).view(t.shape)
        if t.numel()
        else torch.empty(t.shape, dtype=t.dtype, device=device)
        for t, at in zip(hosts, offsets)
    ]
