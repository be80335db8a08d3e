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


HostValues = np.ndarray | list[int] | list[float] | torch.Tensor
_PACK_ALIGN = 16  # bytes: each packed array starts where Triton's pointer specialization wants


def to_device(values: HostValues, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values -> a device tensor without blocking the host (``to_device_packed``)."""
    return to_device_packed([(values, dtype)], device)[0]


def to_device_packed(
    arrays: list[tuple[HostValues, torch.dtype]],
    device: torch.device,
    staged: bool | None = None,
) -> list[torch.Tensor]:
    """Host arrays (values, dtype) -> device tensors in one copy, without blocking the host.

    On CUDA (``staged``) they are laid end to end in one pinned buffer, each at a 16-byte
    offset, copied once, and handed back as views of the device buffer: a step's inputs would
    otherwise take a copy each, and every copy queued between two graph replays holds the GPU
    for its own latency. Pinned, because a copy from pageable memory would first wait for all
    work queued on the stream, which defeats overlap scheduling; torch's caching host
    allocator keeps the buffer until its copy has run, so it is never overwritten while a copy
    reads it."""
    hosts = [
        torch.as_tensor(np.asarray(v) if isinstance(v, list) else v, dtype=dtype)
        for v, dtype in arrays
    ]
    if not (device.type == "cuda" if staged is None else staged):
        return [t.to(device) for t in hosts]
    offsets, size = [], 0
    for t in hosts:
        offsets.append(size)
        size += -(-t.nbytes // _PACK_ALIGN) * _PACK_ALIGN
    # at least one block, so a list of empty arrays never asks for a zero-byte pinned buffer
    staging = torch.empty(
        max(size, _PACK_ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda"
    )

    def views(buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[at : at + t.nbytes].view(t.dtype).view(t.shape)
                for t, at in zip(hosts, offsets)]  # fmt: skip

    for view, t in zip(views(staging), hosts):
        view.copy_(t)
    return views(staging.to(device, non_blocking=True))
