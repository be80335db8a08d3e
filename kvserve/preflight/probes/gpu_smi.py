"""GPU facts from `nvidia-smi` when NVML's Python binding cannot be used.

Parses `--query-gpu` CSV into the same NVML-shaped dict ``gpu_nvml`` produces, plus the
`-q` report (CUDA version, fabric state) and `nvlink -s` (link states).
"""

from __future__ import annotations

import re
from typing import Any

from kvserve.preflight.throttle import parse_mask

# (nvidia-smi field, raw key); 535+ drivers renamed clocks_throttle_reasons to clocks_event_reasons
QUERY_FIELDS: tuple[tuple[str, str], ...] = (
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("pci.bus_id", "pci_bus_id"),
    ("driver_version", "driver_version"),
    ("persistence_mode", "persistence_mode"),
    ("memory.total", "memory_total_mib"),
    ("compute_cap", "compute_cap"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected_volatile"),
    ("pcie.link.gen.current", "pcie_gen"),
    ("pcie.link.gen.max", "pcie_gen_max"),
    ("pcie.link.width.current", "pcie_width"),
    ("pcie.link.width.max", "pcie_width_max"),
    ("temperature.gpu", "temperature"),
    ("clocks.sm", "clock_sm"),
    ("clocks.max.sm", "clock_sm_max"),
    ("clocks.mem", "clock_mem"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("utilization.gpu", "utilization_gpu"),
    ("clocks_event_reasons.active", "clock_event_reasons"),
)
OLD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}


def query_argv(old_names: bool = False) -> list[str]:
    names = [OLD_NAMES.get(f, f) if old_names else f for f, _ in QUERY_FIELDS]
    return ["nvidia-smi", f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits"]


def _value(text: str) -> str | None:
    text = text.strip()
    return None if not text or text.startswith("[") or text == "N/A" else text


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _row_to_raw(values: dict[str, str | None]) -> dict[str, Any]:
    cc = values["compute_cap"]
    power, limit = _float(values["power_w"]), _float(values["power_limit_w"])
    mem_mib = _int(values["memory_total_mib"])
    return {
        "index": _int(values["index"]),
        "name": values["name"],
        "uuid": values["uuid"],
        "pci_bus_id": values["pci_bus_id"],
        "memory_total_bytes": None if mem_mib is None else mem_mib * 2**20,
        "cuda_compute_capability": None if cc is None else [int(p) for p in cc.split(".")],
        "persistence_mode": None
        if values["persistence_mode"] is None
        else int(values["persistence_mode"] == "Enabled"),
        "ecc_uncorrected_volatile": _int(values["ecc_uncorrected_volatile"]),
        "ecc_corrected_volatile": _int(values["ecc_corrected_volatile"]),
        "pcie": {k: _int(values[f"pcie_{k}"]) for k in ("gen", "gen_max", "width", "width_max")},
        "temperature": _int(values["temperature"]),
        "clock_sm": _int(values["clock_sm"]),
        "clock_sm_max": _int(values["clock_sm_max"]),
        "clock_mem": _int(values["clock_mem"]),
        "power_mw": None if power is None else round(power * 1000),
        "power_limit_mw": None if limit is None else round(limit * 1000),
        "utilization_gpu": _int(values["utilization_gpu"]),
        "clock_event_reasons": None
        if values["clock_event_reasons"] is None
        else parse_mask(values["clock_event_reasons"]),
    }


def parse_query_csv(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """-> (driver version, NVML-shaped device dicts) from `--query-gpu` CSV without header."""
    keys = [key for _, key in QUERY_FIELDS]
    devices, driver = [], None
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(keys):
            continue
        values = {k: _value(c) for k, c in zip(keys, cells, strict=True)}
        driver = driver or values["driver_version"]
        devices.append(_row_to_raw(values))
    return driver, devices


_FABRIC_STATE = {"Completed": 3, "In Progress": 2, "Not Started": 1, "N/A": 0}


def parse_smi_q(text: str) -> dict[str, Any]:
    """CUDA version and each GPU's fabric state from `nvidia-smi -q`."""
    cuda = re.search(r"^CUDA Version\s*:\s*(\S+)", text, re.M)
    fabrics: list[dict[str, int] | None] = []
    for block in re.split(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f:.]+\s*$", text, flags=re.M)[1:]:
        match = re.search(
            r"^\s+Fabric\s*\n\s+State\s*:\s*(.+?)\s*\n\s+Status\s*:\s*(.+?)\s*$", block, re.M
        )
        if match is None:
            fabrics.append(None)
            continue
        state = _FABRIC_STATE.get(match.group(1), 0)
        status = match.group(2)
        fabrics.append({"state": state, "status": 0 if status in ("Success", "N/A") else status})
    major_minor = cuda.group(1) if cuda else None
    return {"cuda_version": major_minor, "fabric": fabrics}


def parse_nvlink_status(text: str) -> dict[int, list[int]]:
    """GPU index -> per-link state (1 active, 0 inactive) from `nvidia-smi nvlink -s`."""
    links: dict[int, list[int]] = {}
    current: int | None = None
    for line in text.splitlines():
        gpu = re.match(r"GPU (\d+):", line)
        if gpu:
            current = int(gpu.group(1))
            links[current] = []
            continue
        link = re.match(r"\s+Link \d+:\s*(.+)", line)
        if link and current is not None:
            links[current].append(0 if "inactive" in link.group(1).lower() else 1)
    return links
