"""GPU inventory and health: count vs --tp, driver, persistence, ECC, remapping, Xid, PCIe."""

from __future__ import annotations

from collections import Counter

from kvserve.preflight.checks.common import gpu_skips, join, per_gpu
from kvserve.preflight.facts import GpuDevice, GpuFacts, KernelLogFacts, XidEvent
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.result import CheckResult, Status, skipped

NAMES = (
    "gpu: count and model",
    "gpu: driver",
    "gpu: persistence mode",
    "gpu: ECC errors",
    "gpu: retired/remapped memory",
    "gpu: Xid errors",
    "gpu: PCIe link",
)
# Xids that mean broken hardware or a wedged GPU rather than a crashing application.
CRITICAL_XIDS = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def visible_count(gpu: GpuFacts) -> int:
    if gpu.visible_devices is None:
        return len(gpu.devices)
    entries = [v for v in gpu.visible_devices.split(",") if v.strip()]
    return min(len(entries), len(gpu.devices))


def check_count(gpu: GpuFacts, tp: int | None) -> CheckResult:
    models = Counter(d.name for d in gpu.devices)
    mem = gpu.devices[0].memory_total_mib
    observed = ", ".join(f"{n} x {name}" for name, n in models.items())
    observed += f" ({mem} MiB)" if mem else ""
    visible = visible_count(gpu)
    if visible != len(gpu.devices):
        observed += f"; {visible} visible via CUDA_VISIBLE_DEVICES={gpu.visible_devices}"
    expected = f">= --tp ({tp}) GPUs of one model" if tp else ">= 1 GPU of one model"
    if tp and visible < tp:
        fix = f"run with --tp {visible} or on a node with {tp} GPUs; check CUDA_VISIBLE_DEVICES"
        return CheckResult(NAMES[0], Status.FAIL, observed, expected, fix)
    if len(models) > 1:
        fix = "TP ranks run at the slowest GPU's speed: pin one model with CUDA_VISIBLE_DEVICES"
        return CheckResult(NAMES[0], Status.WARN, observed, expected, fix)
    return CheckResult(NAMES[0], Status.PASS, observed, expected)


def check_driver(gpu: GpuFacts) -> CheckResult:
    observed = f"{gpu.driver_version} (CUDA {gpu.cuda_driver_version}, via {gpu.source})"
    if gpu.source != "nvml":
        fix = "pip install nvidia-ml-py so preflight can read NVML directly"
        return CheckResult(NAMES[1], Status.WARN, observed, "NVML answers", fix)
    return CheckResult(NAMES[1], Status.PASS, observed, "NVML answers")


def check_persistence(gpu: GpuFacts) -> CheckResult:
    off = [f"GPU{d.index}" for d in gpu.devices if d.persistence_mode is False]
    if not off:
        return CheckResult(NAMES[2], Status.PASS, "enabled", "enabled")
    fix = "sudo systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)"
    observed = f"disabled on {join(off, 8)}"
    return CheckResult(NAMES[2], Status.WARN, observed, "enabled", fix)


def check_ecc(gpu: GpuFacts) -> CheckResult:
    bad = per_gpu(
        gpu.devices, lambda d: f"{d.ecc_uncorrected} uncorrected" if d.ecc_uncorrected else None
    )
    corrected = sum(d.ecc_corrected or 0 for d in gpu.devices)
    if bad:
        fix = "drain the node, reset the GPU (nvidia-smi -r -i N); RMA it if errors return"
        return CheckResult(NAMES[3], Status.FAIL, join(bad), "0 uncorrected", fix)
    return CheckResult(
        NAMES[3], Status.PASS, f"0 uncorrected, {corrected} corrected", "0 uncorrected"
    )


def _remap_problem(d: GpuDevice) -> tuple[Status, str] | None:
    if d.remap_failure:
        return Status.FAIL, "row remapping failed"
    if d.remap_pending or d.retired_pages_pending:
        return Status.WARN, "remap/retirement pending a GPU reset"
    if d.remapped_rows_uncorrectable:
        return (
            Status.WARN,
            f"{d.remapped_rows_uncorrectable} rows remapped for uncorrectable errors",
        )
    return None


def check_remapping(gpu: GpuFacts) -> CheckResult:
    problems = [(d.index, p) for d in gpu.devices if (p := _remap_problem(d))]
    expected = "no failure, nothing pending"
    if not problems:
        return CheckResult(NAMES[4], Status.PASS, "no remapping failure or pending", expected)
    status = Status.FAIL if any(s is Status.FAIL for _, (s, _) in problems) else Status.WARN
    observed = join([f"GPU{i}: {text}" for i, (_, text) in problems])
    fix = "reset the GPU (nvidia-smi -r) or reboot to apply pending remaps; RMA on remap failure"
    return CheckResult(NAMES[4], status, observed, expected, fix)


def check_xids(log: KernelLogFacts) -> CheckResult:
    if not log.readable:
        return skipped(NAMES[5], log.reason)
    if not log.xids:
        return CheckResult(NAMES[5], Status.PASS, "none in the kernel log", "none")
    codes = Counter(x.code for x in log.xids)
    critical = [x for x in log.xids if x.code in CRITICAL_XIDS]
    observed = ", ".join(f"Xid {c} x{n}" for c, n in sorted(codes.items()))
    if critical:
        first: XidEvent = critical[0]
        observed += f" (PCI {first.pci}: {CRITICAL_XIDS[first.code]})"
        fix = "drain the node; reset or reboot; check `nvidia-smi -q -d ECC,ROW_REMAPPER`"
        return CheckResult(NAMES[5], Status.FAIL, observed, "none", fix)
    fix = "application-level Xids (13/31/43...): look at the crashing job; clear with a reboot"
    return CheckResult(NAMES[5], Status.WARN, observed, "none", fix)


def _pcie_problem(d: GpuDevice) -> str | None:
    if d.pcie_width and d.pcie_width_max and d.pcie_width < d.pcie_width_max:
        return f"x{d.pcie_width} of x{d.pcie_width_max}"
    busy = (d.utilization_pct or 0) > 0
    # idle GPUs drop to a low PCIe generation to save power; only a busy one must be at max
    if busy and d.pcie_gen and d.pcie_gen_max and d.pcie_gen < d.pcie_gen_max:
        return f"Gen{d.pcie_gen} of Gen{d.pcie_gen_max} while busy"
    return None


def check_pcie(gpu: GpuFacts) -> CheckResult:
    d0 = gpu.devices[0]
    expected = "max width (and max gen under load)"
    if d0.pcie_width is None:
        return skipped(NAMES[6], "PCIe link not reported")
    bad = per_gpu(gpu.devices, _pcie_problem)
    if bad:
        fix = "reseat the GPU/riser, check BIOS PCIe settings and the slot's lanes"
        return CheckResult(NAMES[6], Status.WARN, join(bad), expected, fix)
    observed = f"Gen{d0.pcie_gen} x{d0.pcie_width} (max Gen{d0.pcie_gen_max} x{d0.pcie_width_max})"
    return CheckResult(NAMES[6], Status.PASS, observed, expected)


def check_gpus(gpu: GpuFacts, log: KernelLogFacts, opts: PreflightOptions) -> list[CheckResult]:
    skips = gpu_skips(gpu, NAMES)
    if skips is not None:
        return skips
    return [
        check_count(gpu, opts.tp),
        check_driver(gpu),
        check_persistence(gpu),
        check_ecc(gpu),
        check_remapping(gpu),
        check_xids(log),
        check_pcie(gpu),
    ]
