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
