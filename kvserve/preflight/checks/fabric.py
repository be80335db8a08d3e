"""NVSwitch systems (HGX H100/H200/B200/B300): Fabric Manager and fabric state; NVLink links."""

from __future__ import annotations

from kvserve.preflight.checks.common import gpu_skips, join, per_gpu
from kvserve.preflight.facts import FabricManagerFacts, GpuDevice, GpuFacts
from kvserve.preflight.result import CheckResult, Status, skipped

FM_NAMES = ("fabric manager: service", "fabric manager: version", "fabric: state")
NVLINK = "nvlink: links active"


def is_nvswitch_system(gpu: GpuFacts) -> bool:
    fabric = any(d.fabric_state not in (None, "not_supported") for d in gpu.devices)
    return gpu.nvswitch_count > 0 or fabric


def check_service(fm: FabricManagerFacts) -> CheckResult:
    expected = "installed, active (running)"
    if not fm.installed:
        fix = "install nvidia-fabricmanager-<driver branch> at the driver's exact version"
        observed = "not installed" + (f" ({fm.reason})" if fm.reason else "")
        return CheckResult(FM_NAMES[0], Status.FAIL, observed, expected, fix)
    if fm.active_state is None:
        return skipped(FM_NAMES[0], fm.reason or "service state unknown")
    if not fm.active_state.startswith("active (running)"):
        fix = "sudo systemctl enable --now nvidia-fabricmanager; journalctl -u nvidia-fabricmanager"
        return CheckResult(FM_NAMES[0], Status.FAIL, fm.active_state, expected, fix)
    return CheckResult(FM_NAMES[0], Status.PASS, fm.active_state, expected)


def check_version(fm: FabricManagerFacts, driver: str | None) -> CheckResult:
    expected = f"== driver {driver}"
    if fm.version is None:
        detail = join(fm.log_errors, 1) if fm.log_errors else "nv-fabricmanager --version gave none"
        return CheckResult(FM_NAMES[1], Status.WARN, f"unknown ({detail})", expected)
    if fm.version != driver:
        fix = (
            f"install nvidia-fabricmanager {driver} to match the driver (or the driver "
            f"{fm.version}), then systemctl restart nvidia-fabricmanager"
        )
        return CheckResult(FM_NAMES[1], Status.FAIL, fm.version, expected, fix)
    return CheckResult(FM_NAMES[1], Status.PASS, fm.version, expected)


def _fabric_problem(d: GpuDevice) -> str | None:
    if d.fabric_state in (None, "completed") and d.fabric_status in (None, "success"):
        return None
    return f"{d.fabric_state}, {d.fabric_status}"


def check_fabric_state(gpu: GpuFacts) -> CheckResult:
    expected = "completed, success on every GPU"
    bad = per_gpu(gpu.devices, _fabric_problem)
    if bad:
        fix = "GPUs are not registered with the NVLink fabric: fix Fabric Manager, then reset GPUs"
        return CheckResult(FM_NAMES[2], Status.FAIL, join(bad), expected, fix)
    return CheckResult(FM_NAMES[2], Status.PASS, "completed on every GPU", expected)


def check_nvlink(gpu: GpuFacts) -> CheckResult:
    total = sum(len(d.nvlink_states) for d in gpu.devices)
    if total == 0:
        return skipped(NVLINK, "no NVLink links reported (PCIe-only GPUs or a single GPU)")
    down = per_gpu(
        gpu.devices,
        lambda d: (
            f"{d.nvlink_states.count(False)} of {len(d.nvlink_states)} inactive"
            if not all(d.nvlink_states)
            else None
        ),
    )
    expected = "every link active"
    if down:
        fix = "check `nvidia-smi nvlink -s` and -e; reset the GPUs; on NVSwitch systems check FM"
        return CheckResult(NVLINK, Status.FAIL, join(down), expected, fix)
    return CheckResult(NVLINK, Status.PASS, f"{total} links active", expected)


def check_fabric(gpu: GpuFacts, fm: FabricManagerFacts) -> list[CheckResult]:
    skips = gpu_skips(gpu, (*FM_NAMES, NVLINK))
    if skips is not None:
        return skips
    if not is_nvswitch_system(gpu):
        reason = "no NVSwitch (no /dev/nvidia-nvswitch*, fabric state not supported)"
        rows = [skipped(name, reason) for name in FM_NAMES]
    else:
        rows = [check_service(fm), check_version(fm, gpu.driver_version), check_fabric_state(gpu)]
    return [*rows, check_nvlink(gpu)]
