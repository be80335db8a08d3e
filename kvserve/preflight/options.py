"""What the user asked preflight to check against: the planned serving configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvserve.errors import ConfigError
from kvserve.kv_layout import KV_CACHE_DTYPES

__all__ = ["KV_CACHE_DTYPES", "PreflightOptions"]


@dataclass(frozen=True)
class PreflightOptions:
    model: Path | None = None
    tp: int | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float = 0.88
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    nccl: bool = False
    gpu_memory_gib: float | None = None  # plan against this GPU size when none is visible

    def __post_init__(self) -> None:
        for name in ("tp", "context_length", "max_running_requests"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if not 0.0 < self.mem_fraction_static <= 1.0:
            raise ConfigError(
                f"--mem-fraction-static must be in (0, 1], got {self.mem_fraction_static}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.gpu_memory_gib is not None and self.gpu_memory_gib <= 0:
            raise ConfigError(f"--gpu-memory-gib must be positive, got {self.gpu_memory_gib}")
