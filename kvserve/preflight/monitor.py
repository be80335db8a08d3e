"""GPU temperature, clocks, power and throttle reasons over time, as a library and for the CLI.

``sample_gpus()`` takes one sample per GPU; ``GpuSampler`` samples in a background thread so a
benchmark can run beside it and embed the samples (a thermal cliff shows up next to the
throughput that fell).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from kvserve.errors import ConfigError
from kvserve.preflight import throttle
from kvserve.preflight.probes import gpu_smi
from kvserve.preflight.probes.commands import Runner, run_command
from kvserve.preflight.probes.gpu_nvml import NvmlUnavailable, init_nvml, read_dynamic


@dataclass(frozen=True)
class GpuSample:
    ts: float  # unix seconds
    gpu: int
    temp_c: int | None
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    power_w: float | None
    power_limit_w: float | None
    util_pct: int | None
    throttle: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.ts))
        power = "?" if self.power_w is None else f"{self.power_w:.0f}"
        limit = "?" if self.power_limit_w is None else f"{self.power_limit_w:.0f}"
        reasons = ",".join(self.throttle) or "none"
        return (
            f"{stamp} gpu{self.gpu} {self.temp_c}C sm {self.sm_clock_mhz}/{self.max_sm_clock_mhz}"
            f"MHz mem {self.mem_clock_mhz}MHz {power}/{limit}W util {self.util_pct}% "
            f"throttle {reasons}"
        )


def sample_from_raw(raw: dict[str, Any], index: int, ts: float) -> GpuSample:
    """One NVML-shaped dict (``gpu_nvml.read_dynamic`` or parsed nvidia-smi) -> a sample."""
    power, limit, mask = (
        raw.get("power_mw"),
        raw.get("power_limit_mw"),
        raw.get("clock_event_reasons"),
    )
    return GpuSample(
        ts=ts,
        gpu=index,
        temp_c=raw.get("temperature"),
        sm_clock_mhz=raw.get("clock_sm"),
        max_sm_clock_mhz=raw.get("clock_sm_max"),
        mem_clock_mhz=raw.get("clock_mem"),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        util_pct=raw.get("utilization_gpu"),
        throttle=[] if mask is None else throttle.decode(mask),
    )


class GpuSource(Protocol):
    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


class NvmlSource:
    def __init__(self) -> None:
        self._nv = init_nvml()
        count = self._nv.nvmlDeviceGetCount()
        if count == 0:
            self._nv.nvmlShutdown()
            raise NvmlUnavailable("NVML reports 0 GPUs")
        self._handles = [self._nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def sample(self) -> list[GpuSample]:
        now = time.time()
        return [sample_from_raw(read_dynamic(h), i, now) for i, h in enumerate(self._handles)]

    def close(self) -> None:
        self._nv.nvmlShutdown()


class SmiSource:
    def __init__(self, run: Runner = run_command) -> None:
        self._run = run
        if run(["nvidia-smi", "-L"]) is None:
            raise NvmlUnavailable("nvidia-smi not found")
        if not self.sample():
            raise NvmlUnavailable("nvidia-smi reported no GPU")

    def sample(self) -> list[GpuSample]:
        out = self._run(gpu_smi.query_argv())
        if out is None or out.returncode != 0:
            return []
        now = time.time()
        _, devices = gpu_smi.parse_query_csv(out.stdout)
        return [sample_from_raw(d, d["index"], now) for d in devices]

    def close(self) -> None:
        pass


def open_source(run: Runner = run_command) -> GpuSource:
    """NVML, else nvidia-smi; ``ConfigError`` with both reasons when there is no GPU."""
    reasons = []
    for name, make in (("nvml", NvmlSource), ("nvidia-smi", lambda: SmiSource(run))):
        try:
            return make()
        except NvmlUnavailable as exc:
            reasons.append(f"{name}: {exc}")
    raise ConfigError(f"no NVIDIA GPU to monitor ({'; '.join(reasons)})")


def sample_gpus(source: GpuSource | None = None) -> list[GpuSample]:
    """One sample of every GPU now."""
    if source is not None:
        return source.sample()
    own = open_source()
    try:
        return own.sample()
    finally:
        own.close()


def iter_samples(
    source: GpuSource, interval: float, count: int | None = None, duration: float | None = None
) -> Iterator[list[GpuSample]]:
    """Sample rounds every ``interval`` s until ``count`` rounds or ``duration`` s have passed."""
    start = time.monotonic()
    rounds = 0
    while (count is None or rounds < count) and (
        duration is None or time.monotonic() - start < duration
    ):
        yield source.sample()
        rounds += 1
        next_at = start + rounds * interval
        time.sleep(max(0.0, next_at - time.monotonic()))


class GpuSampler:
    """Samples in a daemon thread between ``start()`` and ``stop()``, which returns the samples."""

    def __init__(self, interval: float = 1.0, source: GpuSource | None = None) -> None:
        self.interval = interval
        self._source = source
        self._samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        self._source = self._source or open_source()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        assert self._source is not None
        while not self._stop.is_set():
            self._samples.extend(self._source.sample())
            self._stop.wait(self.interval)

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return list(self._samples)

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
