"""Small helpers the check modules share."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvserve.preflight.facts import GpuDevice, GpuFacts
from kvserve.preflight.result import CheckResult, skipped

GIB = 2**30
FIRST_GPU_ROW = "gpu: count and model"


def per_gpu(devices: Iterable[GpuDevice], problem: Callable[[GpuDevice], str | None]) -> list[str]:
    """ "GPU3: <problem>" for each GPU where ``problem`` returns text."""
    return [f"GPU{d.index}: {text}" for d in devices if (text := problem(d))]


def join(items: list[str], limit: int = 4) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; +{len(items) - limit} more" if len(items) > limit else "")


def gpu_skips(gpu: GpuFacts, names: Iterable[str]) -> list[CheckResult] | None:
    """Skip rows for ``names`` when there is no GPU to check, else None."""
    if gpu.available:
        return None
    # the full reason once (on "gpu: count and model"), a pointer to it elsewhere
    short = "no NVIDIA GPU (see gpu: count and model)"
    return [skipped(n, gpu.unavailable_reason if n == FIRST_GPU_ROW else short) for n in names]


def gib(n_bytes: float) -> str:
    if n_bytes < GIB:
        return f"{n_bytes / 2**20:.1f} MiB"
    return f"{n_bytes / GIB:.1f} GiB"
