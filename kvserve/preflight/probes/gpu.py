"""The GPU probe: NVML first, `nvidia-smi` when NVML can't be used, a reason when neither works."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvserve.preflight.facts import GpuFacts
from kvserve.preflight.probes import gpu_smi
from kvserve.preflight.probes.commands import Runner, run_command
from kvserve.preflight.probes.gpu_nvml import NvmlUnavailable, facts_from_nvml, read_nvml


def read_smi(run: Runner) -> dict[str, Any]:
    """The NVML-shaped raw dict, from nvidia-smi. Raises ``NvmlUnavailable`` when it can't."""
    out = run(gpu_smi.query_argv())
    if out is not None and out.returncode != 0 and "not a valid field" in out.stdout + out.stderr:
        out = run(gpu_smi.query_argv(old_names=True))
    if out is None:
        raise NvmlUnavailable("nvidia-smi not found")
    if out.returncode != 0:
        message = (out.stdout + out.stderr).strip().splitlines() or ["no output"]
        raise NvmlUnavailable(f"nvidia-smi failed: {message[0]}")
    driver, devices = gpu_smi.parse_query_csv(out.stdout)
    q = run(["nvidia-smi", "-q"])
    report = gpu_smi.parse_smi_q(q.stdout) if q and q.returncode == 0 else {}
    links = run(["nvidia-smi", "nvlink", "-s"])
    nvlinks = gpu_smi.parse_nvlink_status(links.stdout) if links and links.returncode == 0 else {}
    fabrics = report.get("fabric", [])
    for pos, device in enumerate(devices):
        device["nvlink_state"] = nvlinks.get(device["index"], [])
        device["fabric"] = fabrics[pos] if pos < len(fabrics) else None
    cuda = report.get("cuda_version")
    major, _, minor = (cuda or "").partition(".")
    return {
        "driver_version": driver,
        "cuda_driver_version": int(major) * 1000 + int(minor or 0) * 10
        if major.isdigit()
        else None,
        "devices": devices,
    }


def count_nvswitches(root: Path) -> int:
    return len(list((root / "dev").glob("nvidia-nvswitch[0-9]*")))


def probe_gpus(
    run: Runner = run_command, root: Path = Path("/"), env: Mapping[str, str] = os.environ
) -> GpuFacts:
    reasons = []
    facts: GpuFacts | None = None
    for source, reader in (("nvml", read_nvml), ("nvidia-smi", lambda: read_smi(run))):
        try:
            facts = facts_from_nvml(reader())
            facts.source = source
            break
        except NvmlUnavailable as exc:
            reasons.append(f"{source}: {exc}")
    if facts is None or not facts.devices:
        why = "; ".join(reasons) or "NVML reports 0 GPUs"
        return GpuFacts(source=None, unavailable_reason=f"no NVIDIA GPU found ({why})")
    facts.visible_devices = env.get("CUDA_VISIBLE_DEVICES")
    facts.nvswitch_count = count_nvswitches(root)
    return facts
