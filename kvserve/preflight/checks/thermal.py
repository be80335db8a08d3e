"""Thermals and clocks: temperature vs the slowdown threshold, SM clocks, throttle reasons."""

from __future__ import annotations

from kvserve.preflight import throttle
from kvserve.preflight.checks.common import gpu_skips, join
from kvserve.preflight.facts import GpuDevice, GpuFacts
from kvserve.preflight.result import CheckResult, Status, worst

NAMES = ("gpu: temperature", "gpu: clocks", "gpu: throttle reasons")
DEFAULT_SLOWDOWN_C = 87  # Hopper SXM's usual slowdown threshold, when NVML does not say
WARN_MARGIN_C = 10


def _temp_status(d: GpuDevice) -> Status:
    limit = d.temp_slowdown_c or DEFAULT_SLOWDOWN_C
    if d.temperature_c is None:
        return Status.SKIP
    if d.temperature_c >= limit:
        return Status.FAIL
    return Status.WARN if d.temperature_c >= limit - WARN_MARGIN_C else Status.PASS


def check_temperature(gpu: GpuFacts) -> CheckResult:
    devices = [d for d in gpu.devices if d.temperature_c is not None]
    if not devices:
        return CheckResult(NAMES[0], Status.SKIP, "temperature not reported")
    hottest = max(devices, key=lambda d: d.temperature_c or 0)
    limit = hottest.temp_slowdown_c or DEFAULT_SLOWDOWN_C
    status = worst([_temp_status(d) for d in devices])
    observed = f"max {hottest.temperature_c} C (GPU{hottest.index})"
    expected = f"< {limit - WARN_MARGIN_C} C (slowdown at {limit} C)"
    fix = ""
    if status is not Status.PASS:
        fix = "check airflow/fan curves/inlet temperature; watch it under load: kvserve monitor"
    return CheckResult(NAMES[0], status, observed, expected, fix)


def _idle(d: GpuDevice) -> bool:
    return bool((d.clock_event_reasons or 0) & 0x1) or (d.utilization_pct == 0)


def check_clocks(gpu: GpuFacts) -> CheckResult:
    d0 = gpu.devices[0]
    if d0.sm_clock_mhz is None or d0.sm_clock_max_mhz is None:
        return CheckResult(NAMES[1], Status.SKIP, "clocks not reported")
    expected = "SM clock near max when busy (idle GPUs clock down)"
    slow = [
        f"GPU{d.index} {d.sm_clock_mhz}/{d.sm_clock_max_mhz} MHz busy"
        for d in gpu.devices
        if not _idle(d)
        and d.sm_clock_mhz
        and d.sm_clock_max_mhz
        and d.sm_clock_mhz < 0.8 * d.sm_clock_max_mhz
    ]
    if slow:
        fix = "see the throttle reasons; check application clocks (nvidia-smi -rac) and power caps"
        return CheckResult(NAMES[1], Status.WARN, join(slow), expected, fix)
    idle = sum(_idle(d) for d in gpu.devices)
    observed = f"SM {d0.sm_clock_mhz}/{d0.sm_clock_max_mhz} MHz, mem {d0.mem_clock_mhz} MHz"
    observed += f" ({idle} of {len(gpu.devices)} idle)" if idle else ""
    return CheckResult(NAMES[1], Status.PASS, observed, expected)


def _reason_status(names: list[str]) -> Status:
    if throttle.FAILING.intersection(names):
        return Status.FAIL
    return Status.WARN if throttle.WARNING.intersection(names) else Status.PASS


def check_throttle(gpu: GpuFacts) -> CheckResult:
    decoded = {d.index: throttle.decode(d.clock_event_reasons or 0) for d in gpu.devices}
    if all(d.clock_event_reasons is None for d in gpu.devices):
        return CheckResult(NAMES[2], Status.SKIP, "clock event reasons not reported")
    status = worst([_reason_status(names) for names in decoded.values()])
    seen = sorted({n for names in decoded.values() for n in names})
    expected = "none, GpuIdle, SyncBoost or ApplicationsClocksSetting"
    if status is Status.PASS:
        return CheckResult(NAMES[2], status, ", ".join(seen) or "none", expected)
    bad = [
        f"GPU{i}: {', '.join(n)}"
        for i, n in decoded.items()
        if _reason_status(n) is not Status.PASS
    ]
    fix = (
        "thermal/HW slowdown: fix cooling or the power brake signal (PSU/BMC); "
        "SwPowerCap: check the power limit (nvidia-smi -q -d POWER)"
    )
    return CheckResult(NAMES[2], status, join(bad), expected, fix)


def check_thermals(gpu: GpuFacts) -> list[CheckResult]:
    skips = gpu_skips(gpu, NAMES)
    if skips is not None:
        return skips
    return [check_temperature(gpu), check_clocks(gpu), check_throttle(gpu)]
